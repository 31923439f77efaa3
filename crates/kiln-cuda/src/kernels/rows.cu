// ---- embedding rows, RMSNorm ---------------------------------------------------------

// Value c of row r of a packed matrix.
__device__ float packed_value(const Mat& m, int r, int cols, int c) {
    const int nb = cols / 32, b = c / 32, j = c % 32;
    const size_t blk = (size_t)r * nb + b;
    switch (m.fmt) {
    case FMT_F32: return ((const float*)m.q)[(size_t)r * cols + c];
    case FMT_F16: return h2f(((const u16*)m.q)[(size_t)r * cols + c]);
    case FMT_Q8_0: return h2f(((const u16*)m.s)[blk]) * (float)((const i8*)m.q)[blk * 32 + j];
    default: break;
    }
    const u8 byte = m.q[blk * 16 + (j % 16)];
    int q = j < 16 ? (byte & 15) : (byte >> 4);
    switch (m.fmt) {
    case FMT_Q4_0: return h2f(((const u16*)m.s)[blk]) * (float)(q - 8);
    case FMT_Q4_1: {
        const u32 dm = ((const u32*)m.s)[blk];
        return h2f(dm & 0xffff) * (float)q + h2f(dm >> 16);
    }
    case FMT_Q4_K: {
        const u32 dd = ((const u32*)m.s2)[(size_t)r * (nb / 8) + b / 8];
        const u32 sm = ((const u16*)m.s)[blk];
        return h2f(dd & 0xffff) * (float)(sm & 0xff) * (float)q - h2f(dd >> 16) * (float)(sm >> 8);
    }
    default: {  // FMT_Q6_K
        const uint2 h = ((const uint2*)m.s)[blk];
        const u32 hb = j < 16 ? (h.x >> (2 * j)) & 3 : (h.y >> (2 * (j - 16))) & 3;
        q |= (int)(hb << 4);
        const u8* rec = m.s2 + ((size_t)r * (nb / 8) + b / 8) * Q6K_REC;
        return h2f(*(const u16*)(rec + 16)) * (float)(i8)rec[2 * (b % 8) + j / 16] *
               (float)(q - 32);
    }
    }
}

// out[t] = row params[2 + t] of the table (ntok tokens).
extern "C" __global__ void embed(Mat m, int cols, const u32* params, float* out) {
    pdl_begin();
    const int t = blockIdx.y;
    const u32 id = params[2 + t];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        out[(size_t)t * cols + c] = packed_value(m, (int)id, cols, c);
}

// out[t] = row params[0] + t of m (rows by position; params[0] is the step's pos0).
extern "C" __global__ void embed_pos(Mat m, int cols, const u32* params, float* out) {
    pdl_begin();
    const int t = blockIdx.y;
    const int row = (int)params[0] + t;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
        out[(size_t)t * cols + c] = packed_value(m, row, cols, c);
}

// 1 / rms of the row xr (cols values) plus eps, computed by the whole block.
__device__ float block_inv_rms(const float* xr, int cols, float eps) {
    __shared__ float red[32];
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = rsqrtf(v / (float)cols + eps);
    }
    __syncthreads();
    return red[0];
}

// out[r] = x[r] / rms(x[r]) * w, one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* w, float eps, int cols,
                                    float* out) {
    pdl_begin();
    const float* xr = x + (size_t)blockIdx.x * cols;
    const float r = block_inv_rms(xr, cols, eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[(size_t)blockIdx.x * cols + c] = xr[c] * r * w[c];
}


// x[r] += y[r] / rms(y[r]) * w (Gemma's post-norms, the residual add in the same pass), by
// the block's first ADD_NORM_THREADS threads (any more wait): add_rms_norm and
// add_rms_norm_quant give the same bits.
#define ADD_NORM_THREADS 256
__device__ void add_rms_norm_row(float* x, const float* y, const float* w, float eps, int cols) {
    const float* yr = y + (size_t)blockIdx.x * cols;
    __shared__ float red[32];
    float ss = 0.0f;
    if (threadIdx.x < ADD_NORM_THREADS)
        for (int c = threadIdx.x; c < cols; c += ADD_NORM_THREADS) ss += yr[c] * yr[c];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0 && threadIdx.x < ADD_NORM_THREADS) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < ADD_NORM_THREADS / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = rsqrtf(v / (float)cols + eps);
    }
    __syncthreads();
    const float r = red[0];
    if (threadIdx.x < ADD_NORM_THREADS)
        for (int c = threadIdx.x; c < cols; c += ADD_NORM_THREADS)
            x[(size_t)blockIdx.x * cols + c] += yr[c] * r * w[c];
}

// One block (ADD_NORM_THREADS threads) a row.
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float eps,
                                        int cols) {
    pdl_begin();
    add_rms_norm_row(x, y, w, eps, cols);
}

// add_rms_norm, then the new row RMS-normed with next_w and quantized for the product that
// follows, as quant_act writes it (one block of QA_WARPS warps a token, ntok tokens).
extern "C" __global__ void add_rms_norm_quant(float* x, const float* y, const float* w,
                                              float eps, int cols, const float* next_w,
                                              float next_eps, int ntok, u8* xq) {
    pdl_begin();
    add_rms_norm_row(x, y, w, eps, cols);
    __syncthreads();
    quant_row(x, blockIdx.x, cols, ntok, next_w, next_eps, xq);
}

// LFM2's gated short convolution of one sequence (Backend::short_conv): rows row0..row0 + n of
// bcx (3 * dim wide: B, C, x), taps (dim x k), the state's rows srow..srow + k - 1 (the k - 1
// B * x before row0, oldest first; zeros when fresh: 1, or 2 with position 0 in the step's
// parameters, as a recorded decode step reads it at every replay), out's rows row0..; one
// thread a channel, its tokens in order, sums over the taps in order as the CPU takes them.
extern "C" __global__ void short_conv(const float* bcx, const float* taps, float* state,
                                      int srow, int dim, int k, int row0, int n, int fresh,
                                      const u32* params, float* out) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    const int s = k - 1;
    const bool zero = fresh == 2 ? params[0] == 0 : fresh != 0;
    float prev[63];
    for (int i = 0; i < s; i++) prev[i] = zero ? 0.0f : state[(size_t)(srow + i) * dim + c];
    const float* w = taps + (size_t)c * k;
    for (int t = 0; t < n; t++) {
        const float* r = bcx + (size_t)(row0 + t) * 3 * dim;
        const float bx = r[c] * r[2 * dim + c];
        float acc = 0.0f;
        for (int j = 0; j < s; j++) acc = __fadd_rn(acc, __fmul_rn(w[j], prev[j]));
        acc = __fadd_rn(acc, __fmul_rn(w[s], bx));
        out[(size_t)(row0 + t) * dim + c] = r[dim + c] * acc;
        for (int j = 0; j + 1 < s; j++) prev[j] = prev[j + 1];
        if (s > 0) prev[s - 1] = bx;
    }
    for (int i = 0; i < s; i++) state[(size_t)(srow + i) * dim + c] = prev[i];
}
