// ---- Kokoro's signal ops over (channels, len) feature maps ------------------------------
// The CPU backend's arithmetic (crates/kiln-backend/src/cpu/ops): convolutions as im2col and
// a cuBLAS product (groups of one) or directly (grouped), the norms a block per row.

// col (c_in * k, lo): row ci * k + j holds x[ci][t * stride + j * dil - pad] (zero outside).
extern "C" __global__ void im2col_nc(const float* x, int c_in, int len_in, int k, int stride,
                                     int pad, int dil, int lo, float* col) {
    pdl_begin();
    const size_t n = (size_t)c_in * k * lo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i % lo), r = (int)(i / lo), ci = r / k, j = r % k;
        const int src = t * stride + j * dil - pad;
        col[i] = (src >= 0 && src < len_in) ? x[(size_t)ci * len_in + src] : 0.0f;
    }
}

// out (rows, cols) = bias[row], or 0 without a bias: a product's accumulator to start from.
extern "C" __global__ void fill_rows(float* out, const float* bias, int rows, int cols) {
    pdl_begin();
    const size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias ? bias[i / cols] : 0.0f;
}

// The grouped convolution, a thread per output: out[o][t] = bias[o] + sum over the group's
// input channels i and taps j of w[(o * cig + i) * k + j] * x[g * cig + i][t * stride + j *
// dil - pad].
extern "C" __global__ void conv1d_direct(const float* x, const float* w, const float* bias,
                                         int c_in, int c_out, int len_in, int k, int stride,
                                         int pad, int dil, int groups, int lo, float* out) {
    pdl_begin();
    const int cig = c_in / groups, cog = c_out / groups;
    const size_t n = (size_t)c_out * lo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i % lo), o = (int)(i / lo), g = o / cog;
        float acc = bias ? bias[o] : 0.0f;
        for (int ii = 0; ii < cig; ii++) {
            const float* xr = x + (size_t)(g * cig + ii) * len_in;
            const float* wr = w + ((size_t)o * cig + ii) * k;
            for (int j = 0; j < k; j++) {
                const int src = t * stride + j * dil - pad;
                if (src >= 0 && src < len_in) acc += wr[j] * xr[src];
            }
        }
        out[i] = acc;
    }
}

// A transposed convolution's output from the product cols (c_out * k, len_in) = W^T x:
// out[o][p] = bias[o] + sum over taps j and inputs i with i * stride + j * dil - pad = p of
// cols[o * k + j][i].
extern "C" __global__ void col2im_t(const float* cols, const float* bias, int c_out, int k,
                                    int len_in, int stride, int pad, int dil, int lo,
                                    float* out) {
    pdl_begin();
    const size_t n = (size_t)c_out * lo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(i % lo), o = (int)(i / lo);
        float acc = bias ? bias[o] : 0.0f;
        for (int j = 0; j < k; j++) {
            const int num = p + pad - j * dil;
            if (num < 0 || num % stride != 0) continue;
            const int t = num / stride;
            if (t < len_in) acc += cols[((size_t)o * k + j) * len_in + t];
        }
        out[i] = acc;
    }
}

// The grouped transposed convolution, a thread per output: w (c_in, c_out / groups, k).
extern "C" __global__ void conv_t_direct(const float* x, const float* w, const float* bias,
                                         int c_in, int c_out, int len_in, int k, int stride,
                                         int pad, int dil, int groups, int lo, float* out) {
    pdl_begin();
    const int cig = c_in / groups, cog = c_out / groups;
    const size_t n = (size_t)c_out * lo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(i % lo), o = (int)(i / lo), g = o / cog, oo = o % cog;
        float acc = bias ? bias[o] : 0.0f;
        for (int ii = 0; ii < cig; ii++) {
            const int ci = g * cig + ii;
            const float* xr = x + (size_t)ci * len_in;
            const float* wr = w + ((size_t)ci * cog + oo) * k;
            for (int j = 0; j < k; j++) {
                const int num = p + pad - j * dil;
                if (num < 0 || num % stride != 0) continue;
                const int t = num / stride;
                if (t < len_in) acc += wr[j] * xr[t];
            }
        }
        out[i] = acc;
    }
}

// A block per row of x (rows, cols), in place: v = (v - mean) / sqrt(var + eps) (biased
// variance, two passes), then
//   mode 0 (AdaIN over a channel's time):       (1 + a[row]) v + a[rows + row]
//   mode 1 (AdaLayerNorm over a step's channels): (1 + a[col]) v + a[cols + col]
//   mode 2 (layer norm):                          v * a[col] + b[col] (either may be null)
extern "C" __global__ void norm_rows(float* x, const float* a, const float* b, int rows,
                                     int cols, float eps, int mode) {
    pdl_begin();
    __shared__ float red[32];
    float* r = x + (size_t)blockIdx.x * cols;
    float mean, inv;
    row_moments(r, cols, eps, red, &mean, &inv);
    const int row = blockIdx.x;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = (r[c] - mean) * inv;
        float y;
        if (mode == 0) {
            y = (1.0f + a[row]) * v + a[rows + row];
        } else if (mode == 1) {
            y = (1.0f + a[c]) * v + a[cols + c];
        } else {
            y = a ? v * a[c] : v;
            if (b) y += b[c];
        }
        r[c] = y;
    }
}

// x (c, len) in place: x + sin(alpha[ch] x)^2 / alpha[ch].
extern "C" __global__ void snake_rows(float* x, const float* alpha, int c, int len) {
    pdl_begin();
    const size_t n = (size_t)c * len;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float a = alpha[i / len], inv = 1.0f / a;
        const float s = sinf(a * x[i]);
        x[i] += inv * s * s;
    }
}

extern "C" __global__ void leaky_relu(float* x, float slope, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (x[i] < 0.0f) x[i] *= slope;
}

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
extern "C" __global__ void gelu_tanh(float* x, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float u = x[i];
        x[i] = 0.5f * u * (1.0f + tanhf(0.7978846f * (u + 0.044715f * u * u * u)));
    }
}

// out (cols, rows) = x (rows, cols) transposed, through 32 x 32 tiles in shared memory.
extern "C" __global__ void transpose_rows(const float* x, int rows, int cols, float* out) {
    pdl_begin();
    __shared__ float tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = x[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][j];
    }
}

// out (c, len * factor): every sample of x (c, len) repeated factor times.
extern "C" __global__ void upsample_nearest(const float* x, int len, int factor, size_t n,
                                           float* out) {
    pdl_begin();
    const size_t lf = (size_t)len * factor;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = x[(i / lf) * len + (i % lf) / factor];
}

// Order-preserving keys of floats (as argmax_key): min and max through integer atomics.
__device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// range[0] = key of min(0, x...), range[1] = key of max(0, x...) (both start as 0's key).
extern "C" __global__ void range_keys(const float* x, size_t n, u32* range) {
    pdl_begin();
    __shared__ float red[32];
    float lo = 0.0f, hi = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    lo = -block_max(-lo, red);
    hi = block_max(hi, red);
    if (threadIdx.x == 0) {
        atomicMin(range, order_key(lo));
        atomicMax(range + 1, order_key(hi));
    }
}

// x rounded to its uint8 grid (ONNX DynamicQuantizeLinear over the range range_keys found):
// scale (hi - lo) / 255, zero point and values rounded half to even.
extern "C" __global__ void fake_quant_u8(float* x, size_t n, const u32* range) {
    pdl_begin();
    const float lo = key_value(range[0]), hi = key_value(range[1]);
    const float scale = (hi - lo) / 255.0f;
    if (scale == 0.0f) return;
    const float zp = fminf(fmaxf(rintf(-lo / scale), 0.0f), 255.0f);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float q = fminf(fmaxf(rintf(x[i] / scale) + zp, 0.0f), 255.0f);
        x[i] = (q - zp) * scale;
    }
}
