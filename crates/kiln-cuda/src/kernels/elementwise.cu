// ---- elementwise ------------------------------------------------------------------------

extern "C" __global__ void add(float* x, const float* y, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" __global__ void silu_mul(float* g, const float* u, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        g[i] = silu(g[i]) * u[i];
}

// GeGLU: g = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * u
extern "C" __global__ void gelu_tanh_mul(float* g, const float* u, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * x * x * x))) * u[i];
    }
}

// The device memory's read bandwidth (membw.rs): the n 16-byte words of p read once over the
// grid, four a thread in flight, folded by xor; the fold is stored only where it equals
// `never`, which the zeroed buffer the host measures does not give, so no read is dropped.
extern "C" __global__ void read_probe(const uint4* p, size_t n, u32 never, u32* out) {
    pdl_wait();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    u32 acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = __ldcs(p + i + j * stride);
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == never) *out = acc;
}

extern "C" __global__ void scale(float* x, float s, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

// Rows t of (n, cols) f32 to cache positions pos0 + t of each head (common.cu kv_row: the
// block table `tbl`, the layer's K or V planes at `off`; q8: a q8_0 cache, kvq_row, whose
// head size is a multiple of 32 so that each warp takes whole 32-value blocks): x row t is
// (heads, head_dim).
extern "C" __global__ void kv_store(const float* x, const u64* tbl, long long off, int heads,
                                    int head_dim, const u32* params, int q8) {
    pdl_begin();
    const int t = blockIdx.y, pos = (int)params[0] + t;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < heads * head_dim;
         i += gridDim.x * blockDim.x) {
        const int h = i / head_dim, e = i % head_dim;
        const float v = x[(size_t)t * heads * head_dim + i];
        if (q8)
            kvq_store(tbl, off, h, pos, head_dim, e, v, nullptr, nullptr);
        else
            kv_row(tbl, off, h, pos, head_dim)[e] = f2h(v);
    }
}

// A sequence's positions p0..p0 + len of one layer's keys and values (common.cu kv_row) into
// contiguous (kv_heads, len, head_dim) f16 planes, for the prompt attention's cuBLAS
// products; 16 bytes a thread (q8: from a q8_0 cache, its values as f16).
extern "C" __global__ void kv_gather(const u64* tbl, long long k_off, long long v_off,
                                     int kv_heads, int head_dim, int p0, int len, u16* out_k,
                                     u16* out_v, int q8) {
    pdl_begin();
    const int c8 = head_dim / 8;
    const size_t n = (size_t)kv_heads * len * c8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < 2 * n;
         i += (size_t)gridDim.x * blockDim.x) {
        const bool is_v = i >= n;
        const size_t j = is_v ? i - n : i;
        const int c = (int)(j % c8), p = (int)(j / c8 % len), h = (int)(j / c8 / len);
        uint4 w;
        if (q8) {
            float f[8];
            kv_load8(tbl, is_v ? v_off : k_off, h, p0 + p, head_dim, 8 * c, 1, f);
            w = f8_h8(f);
        } else {
            w = *((const uint4*)kv_row(tbl, is_v ? v_off : k_off, h, p0 + p, head_dim) + c);
        }
        ((uint4*)(is_v ? out_v : out_k))[j] = w;
    }
}

// out (t_out, c_in * k): column c * k + j of row t is x[t * stride + j - pad][c].
extern "C" __global__ void im2col(const float* x, int t_in, int c_in, int k, int stride, int pad,
                                  int t_out, float* out) {
    pdl_begin();
    const size_t n = (size_t)t_out * c_in * k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int col = (int)(i % ((size_t)c_in * k));
        const int t = (int)(i / ((size_t)c_in * k));
        const int c = col / k, j = col % k;
        const int src = t * stride + j - pad;
        out[i] = (src >= 0 && src < t_in) ? x[(size_t)src * c_in + c] : 0.0f;
    }
}

// out[r] = the first index of the largest of the first `cols` values of row r (grid.y; rows
// `ld` apart): blocks (grid.x) split a row, each folds its part into one 64-bit key, max'ed
// atomically into best[r] (zeroed first): the value's order-preserving bits above ~index,
// so ties go to the first.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)b << 32) | (u32)(~(u32)i);
}

extern "C" __global__ void argmax(const float* x, int cols, int ld, unsigned long long* best) {
    pdl_begin();
    const float* xr = x + (size_t)blockIdx.y * ld;
    unsigned long long k = 0;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
        const float y = xr[c];
        if (y == y) {  // NaN never wins
            const unsigned long long ky = argmax_key(y, c);
            k = ky > k ? ky : k;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long ok = __shfl_xor_sync(0xffffffffu, k, o);
        k = ok > k ? ok : k;
    }
    if ((threadIdx.x & 31) == 0 && k != 0) atomicMax(best + blockIdx.y, k);
}

// A greedy pick fed to the next step: the step parameters' token (params = [pos0, n, ids...])
// becomes argmax's winner, decoded as the host decodes it (a row of NaNs leaves 0: id 0).
extern "C" __global__ void feed_pick(const unsigned long long* best, u32* params) {
    pdl_begin();
    if (threadIdx.x == 0) {
        const unsigned long long k = best[0];
        params[1] = 1u;
        params[2] = k == 0 ? 0u : ~(u32)k;
    }
}

// A grammar's mask: x[c] = -inf for every c < cols whose bit c of `allow` (32 per word, lowest
// bit first) is clear.
extern "C" __global__ void mask_row(float* x, int cols, const u32* allow) {
    pdl_begin();
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
        if (!((allow[c >> 5] >> (c & 31)) & 1u)) x[c] = __int_as_float(0xff800000);
    }
}

// Sampling candidates: block b sorts values [b * TOPK_CHUNK, (b + 1) * TOPK_CHUNK) of x (of
// cols) as argmax keys (descending, a bitonic sort in shared memory; NaNs keep their place
// in f32::total_cmp's order, past the chunk's end pads 0) and writes its first k keys to
// out[b * k ..]: the chunks' tops together hold the row's top k.
#define TOPK_CHUNK 2048
extern "C" __global__ void __launch_bounds__(256)
    topk_chunks(const float* x, int cols, int k, unsigned long long* out) {
    pdl_begin();
    __shared__ unsigned long long s[TOPK_CHUNK];
    const int base = blockIdx.x * TOPK_CHUNK;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) {
        const int c = base + i;
        s[i] = c < cols ? argmax_key(x[c], c) : 0ull;
    }
    __syncthreads();
    for (int size = 2; size <= TOPK_CHUNK; size <<= 1) {
        for (int j = size >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) {
                const int p = i ^ j;
                if (p > i) {
                    const unsigned long long a = s[i], b = s[p];
                    // Runs with (i & size) == 0 descending, the others ascending: the last
                    // merge (size = TOPK_CHUNK) leaves all of it descending.
                    if ((i & size) == 0 ? a < b : a > b) {
                        s[i] = b;
                        s[p] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[(size_t)blockIdx.x * k + i] = s[i];
}

// ---- prefill: f16 operands for cuBLAS's tensor-core GEMM --------------------------------

__device__ __forceinline__ u32 h2pack(float a, float b) {
    return (u32)f2h(a) | ((u32)f2h(b) << 16);
}

// out (rows, cols) f16 = the packed matrix's values: a thread per 32-value block (its
// 16 or 32 bytes read at once, 64 bytes written), or per value for the float formats.
extern "C" __global__ void dequant_f16(Mat m, int rows, int cols, u16* out) {
    pdl_begin();
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if (m.fmt == FMT_F32 || m.fmt == FMT_F16 || cols % 32 != 0) {
        const size_t n = (size_t)rows * cols;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = f2h(packed_value(m, (int)(i / cols), cols, (int)(i % cols)));
        return;
    }
    const int nb = cols / 32;
    const size_t nblk = (size_t)rows * nb;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblk; i += step) {
        const int r = (int)(i / nb), b = (int)(i % nb);
        const WBlk w = wblk_load<-1>(m, r, b, nb);
        uint4* o = (uint4*)(out + i * 32);
        if (m.fmt == FMT_Q8_0) {
            const float d = h2f((u16)w.s);
            const u32 q[8] = {w.q.x, w.q.y, w.q.z, w.q.w, w.r.x, w.r.y, w.r.z, w.r.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 h[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const u32 word = q[(8 * k + 2 * j) / 4];
                    const int sh = 8 * ((8 * k + 2 * j) % 4);
                    h[j] = h2pack(d * (float)(i8)((word >> sh) & 0xff),
                                  d * (float)(i8)((word >> (sh + 8)) & 0xff));
                }
                o[k] = make_uint4(h[0], h[1], h[2], h[3]);
            }
            continue;
        }
        const WVals v = wblk_vals<-1>(w, m.fmt, b);
        // Values 0..15 from lo4's bytes, 16..31 from hi4's, eight a store.
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32* src = k < 2 ? v.lo4 : v.hi4;
            const float sc = k < 2 ? v.s_lo : v.s_hi, mn = k < 2 ? v.m_lo : v.m_hi;
            u32 h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int e = 8 * (k % 2) + 2 * j;  // value index within the half
                const u32 word = src[e / 4];
                const int sh = 8 * (e % 4);
                h[j] = h2pack(sc * (float)((word >> sh) & 0xff) + mn,
                              sc * (float)((word >> (sh + 8)) & 0xff) + mn);
            }
            o[k] = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}

// out row r (f16) = x row r, RMS-normalised with norm_w first when given; a block per row.
extern "C" __global__ void rows_f16(const float* x, int cols, const float* norm_w, float eps,
                                    u16* out) {
    pdl_begin();
    const float* xr = x + (size_t)blockIdx.x * cols;
    const float r = norm_w ? block_inv_rms(xr, cols, eps) : 1.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[(size_t)blockIdx.x * cols + c] = f2h(xr[c] * r * (norm_w ? norm_w[c] : 1.0f));
}

// out[t * ld + r] += bias[r] for t < n, r < rows.
extern "C" __global__ void add_bias(float* out, const float* bias, int rows, int ld, int n) {
    pdl_begin();
    const size_t total = (size_t)rows * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[(i / rows) * ld + i % rows] += bias[i % rows];
}

