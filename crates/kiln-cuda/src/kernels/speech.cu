// ---- Whisper: layer norm, GELU, attention without a cache ------------------------------

// out[r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta, one block per row.
extern "C" __global__ void layer_norm(const float* x, const float* gamma, const float* beta,
                                      float eps, int cols, float* out) {
    pdl_begin();
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float mean, r;
    row_moments(xr, cols, eps, red, &mean, &r);
    float* o = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = (xr[c] - mean) * r * gamma[c] + beta[c];
}

// x = x/2 * (1 + erf(x / sqrt(2))) in place.
extern "C" __global__ void gelu(float* x, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

// Dense attention, many queries (encoders): block (query tile of 32, head), a thread per
// query holding its scaled q and output row; keys and values staged 32 at a time in shared
// memory, the tile's scores first, then one softmax correction per tile. Rows are
// (n, heads * 64); causal: query t sees keys 0..=t + n_kv - n_q.
#define DQ 32
extern "C" __global__ void __launch_bounds__(DQ)
attn_dense_rows(const float* q, const float* k, const float* v, int heads, int n_q, int n_kv,
                int causal, float scale, float* out) {
    pdl_begin();
    constexpr int HD = 64;
    __shared__ float ks[DQ][HD + 1];
    __shared__ float vs[DQ][HD];
    const int h = blockIdx.y;
    const int t = blockIdx.x * DQ + threadIdx.x;
    const size_t ld = (size_t)heads * HD;
    const bool live = t < n_q;
    float qr[HD], acc[HD];
#pragma unroll
    for (int i = 0; i < HD; i++) {
        qr[i] = live ? q[t * ld + h * HD + i] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    const int last = causal ? t + n_kv - n_q : n_kv - 1;
    const int t_end = min(n_q, (int)(blockIdx.x + 1) * DQ) - 1;
    const int block_last = causal ? min(n_kv - 1, t_end + n_kv - n_q) : n_kv - 1;
    float m = -KINF, l = 0.0f;
    for (int j0 = 0; j0 <= block_last; j0 += DQ) {
        __syncthreads();
        for (int e = threadIdx.x; e < DQ * HD; e += DQ) {
            const int j = j0 + e / HD, d = e % HD;
            ks[e / HD][d] = j < n_kv ? k[j * ld + h * HD + d] : 0.0f;
            vs[e / HD][d] = j < n_kv ? v[j * ld + h * HD + d] : 0.0f;
        }
        __syncthreads();
        const int jn = live ? min(DQ, last - j0 + 1) : 0;
        if (jn <= 0) continue;
        float sc[DQ];
        float mt = m;
#pragma unroll
        for (int jj = 0; jj < DQ; jj++) {
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
            for (int i = 0; i < HD; i += 2) {
                a0 = fmaf(qr[i], ks[jj][i], a0);
                a1 = fmaf(qr[i + 1], ks[jj][i + 1], a1);
            }
            sc[jj] = jj < jn ? a0 + a1 : -KINF;
            mt = fmaxf(mt, sc[jj]);
        }
        const float corr = expf(m - mt);
        l *= corr;
#pragma unroll
        for (int i = 0; i < HD; i++) acc[i] *= corr;
#pragma unroll
        for (int jj = 0; jj < DQ; jj++) {
            const float p = jj < jn ? expf(sc[jj] - mt) : 0.0f;
            l += p;
#pragma unroll
            for (int i = 0; i < HD; i++) acc[i] = fmaf(p, vs[jj][i], acc[i]);
        }
        m = mt;
    }
    if (live) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < HD; i++) out[t * ld + h * HD + i] = acc[i] * inv;
    }
}

// Dense attention, a few queries (decoder cross-attention): block (query, head) of 1024
// threads; every key's score into shared memory (n_kv floats, dynamic), the block's max and
// sum, then p.V by 16 key groups x 64 dimensions (a short chain of loads each), summed over
// the groups.
#define FEW_THREADS 1024
extern "C" __global__ void __launch_bounds__(FEW_THREADS)
attn_dense_few(const float* q, const float* k, const float* v, int heads, int n_q, int n_kv,
               int causal, float scale, float* out) {
    pdl_begin();
    constexpr int HD = 64;
    extern __shared__ float sc[];
    __shared__ float qs[HD];
    __shared__ float red[32];
    __shared__ float part[FEW_THREADS / HD][HD];
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t ld = (size_t)heads * HD;
    if (threadIdx.x < HD) qs[threadIdx.x] = q[t * ld + h * HD + threadIdx.x] * scale;
    __syncthreads();
    const int nk = causal ? t + n_kv - n_q + 1 : n_kv;
    float mx = -KINF;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        const float4* kr = (const float4*)(k + j * ld + h * HD);
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < HD / 4; i++) {
            const float4 w = kr[i];
            a += qs[4 * i] * w.x + qs[4 * i + 1] * w.y + qs[4 * i + 2] * w.z + qs[4 * i + 3] * w.w;
        }
        sc[j] = a;
        mx = fmaxf(mx, a);
    }
    mx = block_max(mx, red);
    float ls = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        const float p = expf(sc[j] - mx);
        sc[j] = p;
        ls += p;
    }
    const float l = block_sum(ls, red);
    const int d = threadIdx.x % HD, g = threadIdx.x / HD;
    constexpr int GROUPS = FEW_THREADS / HD;
    float a = 0.0f;
    for (int j = g; j < nk; j += GROUPS) a = fmaf(sc[j], v[j * ld + h * HD + d], a);
    part[g][d] = a;
    __syncthreads();
    if (threadIdx.x < HD) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < GROUPS; k++) sum += part[k][threadIdx.x];
        out[t * ld + h * HD + threadIdx.x] = sum / l;
    }
}
