// ---- matrices as the kernels see them ---------------------------------------------------

struct Mat {
    const u8* q;   // packed values (F32/F16: the values themselves)
    const u8* s;   // per-block data: Q4_0/Q8_0 f16 scale; Q4_1 f16 (d, m); Q4_K scale, min
                   // bytes; Q6_K high bits
    const u8* s2;  // per-super-block data: Q4_K f16 (d, dmin); Q6_K 20-byte record
    const float* bias;
    float* out;
    int rows;
    int fmt;
    int ld_out;  // values between output rows (tokens)
    int widened;  // (host side only: where the struct's padding was)
};

struct Mats {
    Mat m[3];
    int n_mats;
    int row0[4];  // mat i owns output rows row0[i]..row0[i + 1] of the launch
};

// Block-quantized activations of up to MAX_TOK tokens, written once per product by
// quant_act into a global buffer (L2-resident) that every block of the product reads.
// Layout (pack.rs's xq_bytes computes the same size): q ntok*cols bytes, d ntok*nb floats,
// sums ntok*cols/16 shorts, inv ntok floats from the next multiple of 4 bytes (rows whose
// width is not a multiple of 32, products of f32 and f16 weights, use inv only; their
// ntok*cols bytes need not end on a float).
struct XQ {
    const int* q;      // [tok][cols / 4]: 4 int8 values per int
    const float* d;    // [tok][cols / 32]
    const short* sum;  // [tok][cols / 16]: sums of each half block's values
    const float* inv;  // [tok]: the fused RMSNorm's 1 / rms (1 when not fused)
};

// Byte offset of inv in the layout above.
__device__ __forceinline__ size_t xq_inv_offset(int cols, int ntok) {
    const size_t o = (size_t)ntok * cols + (size_t)ntok * (cols / 32) * 4 +
                     (size_t)ntok * (cols / 16) * 2;
    return (o + 3) & ~(size_t)3;
}

__device__ __forceinline__ XQ xq_layout(const u8* base, int cols, int ntok) {
    const int nb = cols / 32;
    XQ x;
    x.q = (const int*)base;
    x.d = (const float*)(base + (size_t)ntok * cols);
    x.sum = (const short*)(x.d + ntok * nb);
    x.inv = (const float*)(base + xq_inv_offset(cols, ntok));
    return x;
}

// 16 values of a byte each (unsigned: 4-bit parts, Q6_K's with their high bits) in w[0..4]
// dotted with 16 int8 activations.
__device__ __forceinline__ int dot16_us(const u32* w, const uint4& x, int acc = 0) {
    int a = dp4a_us(w[0], (int)x.x, acc);
    a = dp4a_us(w[1], (int)x.y, a);
    a = dp4a_us(w[2], (int)x.z, a);
    return dp4a_us(w[3], (int)x.w, a);
}

// 32 int8 weights (wa: the first 16, wb: the last) dotted with 32 int8 activations.
__device__ __forceinline__ int dot32_ss(const uint4& wa, const uint4& wb, const uint4& xa,
                                        const uint4& xb) {
    int a = dp4a_ss((int)wa.x, (int)xa.x, 0);
    a = dp4a_ss((int)wa.y, (int)xa.y, a);
    a = dp4a_ss((int)wa.z, (int)xa.z, a);
    a = dp4a_ss((int)wa.w, (int)xa.w, a);
    a = dp4a_ss((int)wb.x, (int)xb.x, a);
    a = dp4a_ss((int)wb.y, (int)xb.y, a);
    a = dp4a_ss((int)wb.z, (int)xb.z, a);
    return dp4a_ss((int)wb.w, (int)xb.w, a);
}

// Adds block b of row r of m, dotted with the activations of ntok tokens, to acc. F is the
// matrix's format when the launch fixes it (the other formats' code then drops out), or -1:
// m.fmt's.
template <int F, int NT>
__device__ __forceinline__ void block_dot(const Mat& m, int r, int b, int cols, const XQ& x,
                                          int ntok, float* acc) {
    const int fmt = F >= 0 ? F : m.fmt;
    const int nb = cols / 32;
    const size_t blk = (size_t)r * nb + b;
    if (fmt == FMT_Q8_0) {
        const uint4 wa = __ldg((const uint4*)m.q + 2 * blk);
        const uint4 wb = __ldg((const uint4*)m.q + 2 * blk + 1);
        const float ws = h2f(__ldg((const u16*)m.s + blk));
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntok) break;
            const uint4* xq = (const uint4*)(x.q + (size_t)t * (cols / 4) + b * 8);
            const uint4 xa = xq[0], xb = xq[1];
            const int a = dot32_ss(wa, wb, xa, xb);
            acc[t] += ws * x.d[t * nb + b] * (float)a;
        }
        return;
    }
    // Formats with 4-bit low parts: q = lo (+ hi bits for Q6_K), value =
    // s_lo * q + m_lo over the first 16 values, s_hi * q + m_hi over the last 16.
    const uint4 w4 = __ldg((const uint4*)m.q + blk);
    u32 lo4[4] = {w4.x & 0x0f0f0f0fu, w4.y & 0x0f0f0f0fu, w4.z & 0x0f0f0f0fu,
                  w4.w & 0x0f0f0f0fu};
    u32 hi4[4] = {(w4.x >> 4) & 0x0f0f0f0fu, (w4.y >> 4) & 0x0f0f0f0fu,
                  (w4.z >> 4) & 0x0f0f0f0fu, (w4.w >> 4) & 0x0f0f0f0fu};
    float s_lo, s_hi, m_lo, m_hi;
    switch (fmt) {
    case FMT_Q4_0: {
        const float d = h2f(__ldg((const u16*)m.s + blk));
        s_lo = s_hi = d;
        m_lo = m_hi = -8.0f * d;
        break;
    }
    case FMT_Q4_1: {
        const u32 dm = __ldg((const u32*)m.s + blk);
        s_lo = s_hi = h2f(dm & 0xffff);
        m_lo = m_hi = h2f(dm >> 16);
        break;
    }
    case FMT_Q4_K: {
        const u32 dd = __ldg((const u32*)m.s2 + (size_t)r * (nb / 8) + b / 8);
        const u32 sm = __ldg((const u16*)m.s + blk);
        s_lo = s_hi = h2f(dd & 0xffff) * (float)(sm & 0xff);
        m_lo = m_hi = -h2f(dd >> 16) * (float)(sm >> 8);
        break;
    }
    default: {  // FMT_Q6_K
        const uint2 h = __ldg((const uint2*)m.s + blk);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo4[i] |= spread2(h.x >> (8 * i));
            hi4[i] |= spread2(h.y >> (8 * i));
        }
        const u8* rec = m.s2 + ((size_t)r * (nb / 8) + b / 8) * Q6K_REC;
        const float d = h2f(*(const u16*)(rec + 16));
        s_lo = d * (float)(i8)rec[2 * (b % 8)];
        s_hi = d * (float)(i8)rec[2 * (b % 8) + 1];
        m_lo = -32.0f * s_lo;
        m_hi = -32.0f * s_hi;
        break;
    }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= ntok) break;
        const uint4* xq = (const uint4*)(x.q + (size_t)t * (cols / 4) + b * 8);
        const uint4 xa = xq[0], xb = xq[1];
        const int a = dot16_us(lo4, xa), c = dot16_us(hi4, xb);
        const u32 sm = *(const u32*)(x.sum + (size_t)t * (cols / 16) + 2 * b);
        const float s0 = (float)(short)(sm & 0xffff), s1 = (float)(short)(sm >> 16);
        acc[t] += x.d[t * nb + b] * (s_lo * (float)a + m_lo * s0 + s_hi * (float)c + m_hi * s1);
    }
}

// Partial dots of NR consecutive rows r.. of m with the activations of ntok tokens: lane
// `lane` of k-part `part` (of kw) takes blocks part * 32 + lane, stepping 32 * kw. The NR
// rows' loads are independent, so a lane has NR of them in flight.
template <int NR, int F, int NT>
__device__ __forceinline__ void rows_dot(const Mat& m, int r, int cols, const XQ& x, int ntok,
                                         const float* xf, const float* norm_w, int part, int kw,
                                         float (*acc)[NT]) {
    const int lane = threadIdx.x & 31;
    const int nb = cols / 32;
#pragma unroll
    for (int i = 0; i < NR; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.0f;
    const int fmt = F >= 0 ? F : m.fmt;
    if (fmt == FMT_F32 || fmt == FMT_F16) {
        for (int c = part * 32 + lane; c < cols; c += 32 * kw) {
            const float nw = norm_w ? norm_w[c] : 1.0f;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const size_t o = (size_t)(r + i) * cols + c;
                const float w = fmt == FMT_F32 ? ((const float*)m.q)[o] : h2f(((const u16*)m.q)[o]);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < ntok) acc[i][t] += w * (xf[(size_t)t * cols + c] * x.inv[t] * nw);
            }
        }
        return;
    }
    for (int b = part * 32 + lane; b < nb; b += 32 * kw) {
#pragma unroll
        for (int i = 0; i < NR; i++) block_dot<F, NT>(m, r + i, b, cols, x, ntok, acc[i]);
    }
}

// Lane `lane`'s value of 32-value block b to int8 (scale amax / 127), with the block's scale
// and its two half sums.
__device__ __forceinline__ void quant_block(float val, int b, int lane, i8* q, float* d,
                                            short* sum) {
    const float amax = warp_max(fabsf(val));
    const float dd = amax / 127.0f;
    const int qi = dd == 0.0f ? 0 : (int)rintf(val / dd);
    q[b * 32 + lane] = (i8)qi;
    float hs = (float)qi;
    for (int o = 8; o > 0; o >>= 1) hs += __shfl_xor_sync(0xffffffffu, hs, o);
    if (lane == 0) d[b] = dd;
    if (lane == 0 || lane == 16) sum[2 * b + lane / 16] = (short)hs;
}

// Quantizes token blockIdx.x of x (cols values; normalised by an RMSNorm with weights norm_w
// first, when given) into the global activation buffer xq laid out for ntok tokens. A block
// of QA_WARPS warps; warp w owns 32-value blocks w, w + QA_WARPS, ...: with at most QV of
// them every load of the row is in registers at once.
#define QA_WARPS 32
__device__ void quant_row(const float* x, int t, int cols, int ntok, const float* norm_w,
                          float eps, u8* xq) {
    __shared__ float red[QA_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = cols / 32;
    const bool quant = cols % 32 == 0;
    const float* xt = x + (size_t)t * cols;
    float* inv = (float*)(xq + xq_inv_offset(cols, ntok));
    float v[QV];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < QV; i++) {
        const int b = warp + i * QA_WARPS;
        v[i] = (quant && b < nb) ? xt[b * 32 + lane] : 0.0f;
        ss += v[i] * v[i];
    }
    if (quant) {
        for (int b = warp + QV * QA_WARPS; b < nb; b += QA_WARPS) {
            const float u = xt[b * 32 + lane];
            ss += u * u;
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xt[c] * xt[c];
    }
    float r = 1.0f;
    if (norm_w) {
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        float u = lane < QA_WARPS ? red[lane] : 0.0f;
        u = warp_sum(u);
        r = rsqrtf(u / (float)cols + eps);
    }
    if (threadIdx.x == 0) inv[t] = r;
    if (!quant) return;
    i8* q = (i8*)xq + (size_t)t * cols;
    float* d = (float*)(xq + (size_t)ntok * cols) + (size_t)t * nb;
    short* sum = (short*)((float*)(xq + (size_t)ntok * cols) + (size_t)ntok * nb) +
                 (size_t)t * (cols / 16);
#pragma unroll
    for (int i = 0; i < QV; i++) {
        const int b = warp + i * QA_WARPS;
        if (b >= nb) break;
        quant_block(v[i] * r * (norm_w ? norm_w[b * 32 + lane] : 1.0f), b, lane, q, d, sum);
    }
    for (int b = warp + QV * QA_WARPS; b < nb; b += QA_WARPS)
        quant_block(xt[b * 32 + lane] * r * (norm_w ? norm_w[b * 32 + lane] : 1.0f), b, lane, q,
                    d, sum);
}

extern "C" __global__ void quant_act(const float* x, int cols, int ntok, const float* norm_w,
                                     float eps, u8* xq) {
    pdl_begin();
    quant_row(x, blockIdx.x, cols, ntok, norm_w, eps, xq);
}

// Bytes of a packed matrix's row in m.q (pack.rs's layout).
__device__ __forceinline__ size_t row_bytes(int fmt, int cols) {
    switch (fmt) {
    case FMT_F32: return (size_t)cols * 4;
    case FMT_F16: return (size_t)cols * 2;
    case FMT_Q8_0: return (size_t)cols;
    default: return (size_t)cols / 2;
    }
}

// out = W x (+ bias), out += W x, or out = act(W0 x) * (W1 x) (act: SiLU, or GELU in
// MODE_GATE_UP_GELU), for the matrices of `ms`
// over ntok tokens of x (cols values each, quantized by quant_act into xqb; the float
// formats read x itself, RMS-normalised with norm_w and quant_act's 1 / rms).
// A block has WARPS warps: WARPS / kw row groups of nr consecutive rows, each group's k
// range split over kw warps (partial sums meet in shared memory). Every matrix's rows are
// a multiple of nr (the host picks nr so), so no group straddles two matrices.
template <int NR, int F, int NT>
__device__ void matvec_impl(const Mats& ms, const float* x, const u8* xqb, int cols, int ntok,
                            const float* norm_w, int mode, int kw) {
    __shared__ float red[WARPS][2 * NR][NT];
    const XQ xq = xq_layout(xqb, cols, ntok);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int total = is_gate_up(mode) ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int row = (blockIdx.x * (WARPS / kw) + slot) * NR;
    const bool live = row < total;
    float acc[2 * NR][NT];
    Mat m = ms.m[0];
    int rr = row;
    if (live) {
        if (is_gate_up(mode)) {
            rows_dot<NR, F, NT>(ms.m[0], row, cols, xq, ntok, x, norm_w, part, kw, acc);
            rows_dot<NR, F, NT>(ms.m[1], row, cols, xq, ntok, x, norm_w, part, kw, acc + NR);
        } else {
            const int mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
            // A copy by value: a run-time index into the parameter array would move it
            // (and everything indexed with it) to local memory.
            m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
            rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
            rows_dot<NR, F, NT>(m, rr, cols, xq, ntok, x, norm_w, part, kw, acc);
        }
    }
    const int nacc = is_gate_up(mode) ? 2 * NR : NR;
#pragma unroll
    for (int i = 0; i < 2 * NR; i++) {
        if (i >= nacc) break;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntok) break;
            float v = live ? warp_sum(acc[i][t]) : 0.0f;
            if (kw > 1 && lane == 0) red[warp][i][t] = v;
            acc[i][t] = v;
        }
    }
    if (kw > 1) {
        __syncthreads();
        if (part != 0 || !live) return;
#pragma unroll
        for (int i = 0; i < 2 * NR; i++) {
            if (i >= nacc) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= ntok) break;
                float v = 0.0f;
                for (int p = 0; p < kw; p++) v += red[warp + p][i][t];
                acc[i][t] = v;
            }
        }
    }
    if (!live || lane != 0) return;
#pragma unroll
    for (int i = 0; i < NR; i++) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntok) break;
            if (is_gate_up(mode)) {
                ms.m[0].out[(size_t)t * ms.m[0].ld_out + row + i] =
                    gate_act(mode, acc[i][t]) * acc[NR + i][t];
            } else {
                float* o = m.out + (size_t)t * m.ld_out + rr + i;
                const float bv = m.bias ? m.bias[rr + i] : 0.0f;
                if (mode == MODE_ADD) *o += acc[i][t] + bv;
                else *o = acc[i][t] + bv;
            }
        }
    }
}

// The matvec launch, NR rows a warp group and room for NT tokens (1: decode; MAX_TOK):
// `prefetch` (with programmatic dependent launch) fetches the warp's weights into L2 while
// the previous kernel finishes.
template <int F, int NR, int NT>
__device__ __forceinline__ void matvec_entry(const Mats& ms, const float* x, const u8* xqb,
                                             int cols, int ntok, const float* norm_w, int mode,
                                             int kw, int prefetch) {
    pdl_trigger();
    if (prefetch) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int total = is_gate_up(mode) ? ms.m[0].rows : ms.row0[ms.n_mats];
        const int row = (blockIdx.x * (WARPS / kw) + warp / kw) * NR;
        if (row < total) {
            const int nm = is_gate_up(mode) ? 2 : 1;
            for (int j = 0; j < nm; j++) {
                int mi = j, rr = row;
                if (!is_gate_up(mode)) {
                    mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
                    rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
                }
                const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
                const size_t rb = row_bytes(m.fmt, cols);
                const u8* base = m.q + (size_t)rr * rb;
                for (size_t o = (size_t)((warp % kw) * 32 + lane) * 128; o < rb * NR;
                     o += (size_t)kw * 32 * 128)
                    prefetch_l2(base + o);
            }
        }
    }
    pdl_wait();
    matvec_impl<NR, F, NT>(ms, x, xqb, cols, ntok, norm_w, mode, kw);
}

// matvec_<format>_<NR>_<NT>: `any` reads each matrix's format at run time (any mix); a
// format's own kernels serve launches whose matrices all have it, with only its code
// (fewer registers, more warps a multiprocessor). lib.rs's matvec_kernel names them.
#define MATVEC1(NAME, F, NR, NT)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                                 \
        matvec_##NAME##_##NR##_##NT(Mats ms, const float* x, const u8* xqb, int cols,         \
                                    int ntok, const float* norm_w, int mode, int kw,         \
                                    int prefetch) {                                           \
        matvec_entry<F, NR, NT>(ms, x, xqb, cols, ntok, norm_w, mode, kw, prefetch);         \
    }
#define MATVEC(NAME, F)         \
    MATVEC1(NAME, F, 1, 1)      \
    MATVEC1(NAME, F, 2, 1)      \
    MATVEC1(NAME, F, 1, 4)      \
    MATVEC1(NAME, F, 2, 4)
static_assert(MAX_TOK == 4, "the matvec kernels' names say 4 tokens");
MATVEC(any, -1)
MATVEC(q4_0, FMT_Q4_0)
MATVEC(q4_1, FMT_Q4_1)
MATVEC(q8_0, FMT_Q8_0)
MATVEC(q4_k, FMT_Q4_K)
MATVEC(q6_k, FMT_Q6_K)

// ---- decode products: one token -------------------------------------------------------
//
// A block's weights are loaded first, before the wait on the previous kernel (programmatic
// dependent launch), so their trip from DRAM overlaps that kernel's end; the activations
// come quantized (quant_act, attn_combine, or the producing product's epilogue below).

#define MVD_PRE 2

// One 32-value block of a packed row, as loaded (the format decides which fields hold what).
struct WBlk {
    uint4 q;  // 4-bit values (Q8_0: the first 16 bytes)
    uint4 r;  // Q8_0: the last 16 bytes; Q6_K: x, y high bits
    u32 s;    // Q4_0/Q8_0: f16 scale; Q4_1: f16 (d, m); Q4_K: scale, min bytes; Q6_K: the u32
              // holding the two scales
    u32 s2;   // Q4_K: the super-block's f16 (d, dmin); Q6_K: its f16 d
};

// A decode kernel's format for a matrix of run-time format rt: F where the launch fixes it;
// for F_KMIX (a launch of Q4_K and Q6_K matrices, llama.cpp's K-quant mixes) one of those two,
// so that only their code and registers are in the kernel; else (F = -1, `any`) rt.
#define F_KMIX 100
template <int F>
__device__ __forceinline__ int dec_fmt(int rt) {
    if (F == F_KMIX) return rt == FMT_Q4_K ? FMT_Q4_K : FMT_Q6_K;
    return F >= 0 ? F : rt;
}

template <int F>
__device__ __forceinline__ WBlk wblk_load(const Mat& m, int r, int b, int nb) {
    const int fmt = dec_fmt<F>(m.fmt);
    const size_t blk = (size_t)r * nb + b;
    WBlk w;
    w.r = make_uint4(0, 0, 0, 0);
    w.s = w.s2 = 0;
    if (fmt == FMT_Q8_0) {
        w.q = __ldg((const uint4*)m.q + 2 * blk);
        w.r = __ldg((const uint4*)m.q + 2 * blk + 1);
        w.s = __ldg((const u16*)m.s + blk);
        return w;
    }
    w.q = __ldg((const uint4*)m.q + blk);
    switch (fmt) {
    case FMT_Q4_0: w.s = __ldg((const u16*)m.s + blk); break;
    case FMT_Q4_1: w.s = __ldg((const u32*)m.s + blk); break;
    case FMT_Q4_K:
        w.s = __ldg((const u16*)m.s + blk);
        w.s2 = __ldg((const u32*)m.s2 + (size_t)r * (nb / 8) + b / 8);
        break;
    default: {  // FMT_Q6_K
        const uint2 h = __ldg((const uint2*)m.s + blk);
        w.r.x = h.x;
        w.r.y = h.y;
        const u8* rec = m.s2 + ((size_t)r * (nb / 8) + b / 8) * Q6K_REC;
        w.s = __ldg((const u32*)(rec + 4 * ((b % 8) / 2)));
        w.s2 = __ldg((const u32*)(rec + 16));
        break;
    }
    }
    return w;
}

// A loaded block's 4-bit formats: its values' low parts (lo4: values 0..15, hi4: 16..31, a
// byte each; Q6_K's high bits added) and value = s * q + m over each half.
struct WVals {
    u32 lo4[4], hi4[4];
    float s_lo, s_hi, m_lo, m_hi;
};

template <int F>
__device__ __forceinline__ WVals wblk_vals(const WBlk& w, int fmt_rt, int b) {
    const int fmt = dec_fmt<F>(fmt_rt);
    WVals o;
    const u32 q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o.lo4[i] = q[i] & 0x0f0f0f0fu;
        o.hi4[i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    switch (fmt) {
    case FMT_Q4_0: {
        const float d = h2f((u16)w.s);
        o.s_lo = o.s_hi = d;
        o.m_lo = o.m_hi = -8.0f * d;
        break;
    }
    case FMT_Q4_1:
        o.s_lo = o.s_hi = h2f((u16)(w.s & 0xffff));
        o.m_lo = o.m_hi = h2f((u16)(w.s >> 16));
        break;
    case FMT_Q4_K: {
        const float d = h2f((u16)(w.s2 & 0xffff)), dmin = h2f((u16)(w.s2 >> 16));
        o.s_lo = o.s_hi = d * (float)(w.s & 0xff);
        o.m_lo = o.m_hi = -dmin * (float)(w.s >> 8);
        break;
    }
    default: {  // FMT_Q6_K
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o.lo4[i] |= spread2(w.r.x >> (8 * i));
            o.hi4[i] |= spread2(w.r.y >> (8 * i));
        }
        const float d = h2f((u16)(w.s2 & 0xffff));
        const int sh = 16 * ((b % 8) % 2);
        o.s_lo = d * (float)(i8)((w.s >> sh) & 0xff);
        o.s_hi = d * (float)(i8)((w.s >> (sh + 8)) & 0xff);
        o.m_lo = -32.0f * o.s_lo;
        o.m_hi = -32.0f * o.s_hi;
        break;
    }
    }
    return o;
}

// One token's block-quantized activations: q (8 ints a block), d (a scale a block), sum (two
// half sums a block).
struct XTok {
    const int* q;
    const float* d;
    const short* sum;
};

__device__ __forceinline__ XTok xtok(const XQ& g, int t, int cols) {
    XTok x;
    x.q = g.q + (size_t)t * (cols / 4);
    x.d = g.d + (size_t)t * (cols / 32);
    x.sum = g.sum + (size_t)t * (cols / 16);
    return x;
}

// acc + block b of a row (loaded as w; its 4-bit formats' values unpacked as v) dotted with
// one token's activations. Every rounding is spelled out (no contraction left to the
// compiler), so a token's sums are the same in every kernel that takes it, whatever the
// number of tokens beside it: the decode products are batch-invariant.
template <int F>
__device__ __forceinline__ float wblk_acc(float acc, const WBlk& w, const WVals& v, int fmt_rt,
                                          int b, const XTok& x) {
    const int fmt = dec_fmt<F>(fmt_rt);
    const uint4 xa = *(const uint4*)(x.q + b * 8), xb = *(const uint4*)(x.q + b * 8 + 4);
    if (fmt == FMT_Q8_0) {
        const int a = dot32_ss(w.q, w.r, xa, xb);
        return __fmaf_rn(__fmul_rn(h2f((u16)w.s), x.d[b]), (float)a, acc);
    }
    const u32 sm = *(const u32*)(x.sum + 2 * b);
    const int s0 = (short)(sm & 0xffff), s1 = (short)(sm >> 16);
    float u;
    if (fmt == FMT_Q6_K) {
        // Two halves with scales of their own.
        const int a = dot16_us(v.lo4, xa), c = dot16_us(v.hi4, xb);
        u = __fmul_rn(v.s_lo, (float)a);
        u = __fmaf_rn(v.m_lo, (float)s0, u);
        u = __fmaf_rn(v.s_hi, (float)c, u);
        u = __fmaf_rn(v.m_hi, (float)s1, u);
    } else {
        // One scale and offset for the block: the halves' integer sums added first (exact).
        const int a = dot16_us(v.hi4, xb, dot16_us(v.lo4, xa));
        u = __fmaf_rn(v.m_lo, (float)(s0 + s1), __fmul_rn(v.s_lo, (float)a));
    }
    return __fmaf_rn(x.d[b], u, acc);
}

// A loaded block's values, unpacked once for all the tokens it meets (Q8_0: none).
template <int F>
__device__ __forceinline__ WVals wblk_unpack(const WBlk& w, int fmt_rt, int b) {
    const int fmt = dec_fmt<F>(fmt_rt);
    if (fmt == FMT_Q8_0) {
        WVals v;
        return v;
    }
    return wblk_vals<F>(w, fmt, b);
}

// Where a decode product's epilogue writes its output rows quantized, for the next product
// (only with ROWS = 4: a block's 8 warps x 4 rows are one 32-value block of the output):
// q, d and sums for each token of `total` values (xq_layout for the launch's tokens), each
// block's 32 values times norm_w (the next RMSNorm's weights, or none), and their sum of
// squares into ss[token][block] so that the next product applies the 1 / rms itself
// (summing the partials in order).
struct QOut {
    u8* xq;
    const float* norm_w;
    float* ss;
};

// A decode product's output value from its row's sums (a0; a1: the up half of a gate/up
// pair), x's 1 / rms r, the bias and the residual: the one expression every decode kernel
// uses, so that the value is the same whichever ran it.
__device__ __forceinline__ float dec_out(float a0, float a1, float r, float bias, float res,
                                         int mode) {
    if (is_gate_up(mode))
        return __fmul_rn(gate_act(mode, __fmul_rn(a0, r)), __fmul_rn(a1, r));
    const float v = __fmaf_rn(a0, r, bias);
    return mode == MODE_ADD ? __fadd_rn(v, res) : v;
}

// x's 1 / rms from the producer's per-block sums of squares (one token's nb partials; a
// warp's lanes over them in order, then the shuffle tree), or 1 without them, in two steps
// so that the partials' latency hides behind a product's: a lane's first DEC_SS_PRE partials
// loaded right after the wait (dec_ss_load), their sum and the rest once the products are
// done (dec_ss_inv).
#define DEC_SS_PRE 4
struct SsPre {
    float v[DEC_SS_PRE];
};
__device__ __forceinline__ SsPre dec_ss_load(const float* ss_in, int nb, int lane) {
    SsPre s;
#pragma unroll
    for (int k = 0; k < DEC_SS_PRE; k++) {
        const int i = lane + 32 * k;
        s.v[k] = ss_in && i < nb ? ss_in[i] : 0.0f;
    }
    return s;
}
__device__ __forceinline__ float dec_ss_inv(const SsPre& s, const float* ss_in, int nb, int cols,
                                            float eps, int lane) {
    if (!ss_in) return 1.0f;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < DEC_SS_PRE; k++)
        if (lane + 32 * k < nb) ss += s.v[k];
    for (int i = lane + 32 * DEC_SS_PRE; i < nb; i += 32) ss += ss_in[i];
    return rsqrtf(warp_sum(ss) / (float)cols + eps);
}

// The epilogue's quantized copy: a warp writes token tg's 32 output values v (one 32-value
// block b of the output's `total`, laid out for ntok tokens) as quant_act would quantize
// them (times the next norm's weights; the 1 / rms is the next product's), and their sum
// of squares.
__device__ __forceinline__ void dec_quant_out(const QOut& qo, float v, int b, int tg, int ntok,
                                              int total, int lane) {
    const int c = b * 32 + lane;
    i8* q = (i8*)qo.xq + (size_t)tg * total;
    float* d = (float*)(qo.xq + (size_t)ntok * total) + (size_t)tg * (total / 32);
    short* sum = (short*)((float*)(qo.xq + (size_t)ntok * total) + (size_t)ntok * (total / 32)) +
                 (size_t)tg * (total / 16);
    quant_block(qo.norm_w ? __fmul_rn(v, qo.norm_w[c]) : v, b, lane, q, d, sum);
    if (qo.ss) {
        const float s2 = warp_sum(__fmul_rn(v, v));
        if (lane == 0) qo.ss[(size_t)tg * (total / 32) + b] = s2;
    }
}

// A lane's first PRE blocks (b0, b0 + step, ...) of each of its ROWS rows from rr, and of the
// gate/up pair's second matrix, loaded before a decode kernel's wait on the previous one.
template <int F, int ROWS, int PRE>
__device__ __forceinline__ void dec_preload(const Mat& m, const Mat& m1, bool gu, int rr, int b0,
                                            int step, int nb, WBlk (&w0)[ROWS][PRE],
                                            WBlk (&w1)[ROWS][PRE]) {
#pragma unroll
    for (int i = 0; i < PRE; i++) {
        const int b = b0 + i * step;
        if (b < nb) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                w0[j][i] = wblk_load<F>(m, rr + j, b, nb);
                if (gu) w1[j][i] = wblk_load<F>(m1, rr + j, b, nb);
            }
        }
    }
}

// The decode product for one token: out = W x (+ bias), out += W x, or
// out = silu(W0 x) * (W1 x) for quantized activations xqb (cols values), times 1 / rms(x)
// when ss_in holds x's sums of squares (an RMSNorm whose weights are already in xqb's
// values). A block has WARPS groups of kw warps (kw <= DEC_KW_MAX, from the matrix's shape
// only): a group takes ROWS consecutive rows, each row's blocks split over its kw warps (part
// p: blocks p * 32 + lane, stepping 32 * kw), so that a matrix of few rows still keeps
// enough loads in flight; a lane's first MVD_PRE blocks of each of its rows are loaded
// before anything else. A row's sums: each part's blocks in order, the warp's shuffle tree,
// then the parts in order; matvec_dec_tokens takes the same steps for each of its tokens,
// so a token's result is the same alone or among 63 others.
// GU: 1 for a gate/up pair, 0 for the other modes, -1 read from mode (a kernel fixed to
// one holds only its own registers); PRE: MVD_PRE, or fewer where registers are short.
template <int F, int ROWS, int GU = -1, int PRE = MVD_PRE>
__device__ void matvec_dec_impl(const Mats& ms, const u8* xqb, int cols, const float* ss_in,
                                float eps, int mode, int kw, const QOut& qo) {
    __shared__ float red[WARPS * DEC_KW_MAX][2 * ROWS];
    __shared__ float outv[WARPS * ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int nb = cols / 32;
    const bool gu = GU < 0 ? is_gate_up(mode) : GU == 1;
    const int total = gu ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int row = (blockIdx.x * WARPS + slot) * ROWS;
    const bool live = row < total;
    // The rows' matrix, by value (see matvec_impl); a warp's rows never straddle two.
    int mi = 0, rr = row;
    if (!gu) {
        mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
        rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
    }
    const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
    const Mat m1 = ms.m[1];
    WBlk w0[ROWS][PRE], w1[ROWS][PRE];
    pdl_trigger();
    if (live) dec_preload<F, ROWS, PRE>(m, m1, gu, rr, part * 32 + lane, 32 * kw, nb, w0, w1);
    // The epilogue's other inputs are loaded before the products so that their latency hides
    // behind them: the bias (a weight: before the wait), then the residual rows.
    const bool adds = live && lane == 0 && !gu;
    float bias[ROWS], res[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; j++) bias[j] = adds && m.bias ? m.bias[rr + j] : 0.0f;
    pdl_wait();
#pragma unroll
    for (int j = 0; j < ROWS; j++) res[j] = adds && mode == MODE_ADD ? m.out[rr + j] : 0.0f;
    const SsPre ssp = dec_ss_load(ss_in, nb, lane);
    const XQ g = xq_layout(xqb, cols, 1);
    const XTok x = xtok(g, 0, cols);
    float a0[ROWS], a1[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; j++) a0[j] = a1[j] = 0.0f;
    if (live) {
#pragma unroll
        for (int i = 0; i < PRE; i++) {
            const int b = part * 32 + lane + i * 32 * kw;
            if (b < nb) {
#pragma unroll
                for (int j = 0; j < ROWS; j++) {
                    a0[j] = wblk_acc<F>(a0[j], w0[j][i], wblk_unpack<F>(w0[j][i], m.fmt, b),
                                        m.fmt, b, x);
                    if (gu)
                        a1[j] = wblk_acc<F>(a1[j], w1[j][i], wblk_unpack<F>(w1[j][i], m1.fmt, b),
                                            m1.fmt, b, x);
                }
            }
        }
        for (int b = part * 32 + lane + PRE * 32 * kw; b < nb; b += 32 * kw) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                const WBlk wa = wblk_load<F>(m, rr + j, b, nb);
                a0[j] = wblk_acc<F>(a0[j], wa, wblk_unpack<F>(wa, m.fmt, b), m.fmt, b, x);
                if (gu) {
                    const WBlk wb = wblk_load<F>(m1, rr + j, b, nb);
                    a1[j] = wblk_acc<F>(a1[j], wb, wblk_unpack<F>(wb, m1.fmt, b), m1.fmt, b, x);
                }
            }
        }
    }
    const float r = dec_ss_inv(ssp, ss_in, nb, cols, eps, lane);
#pragma unroll
    for (int j = 0; j < ROWS; j++) {
        a0[j] = warp_sum(a0[j]);
        if (gu) a1[j] = warp_sum(a1[j]);
    }
    if (kw > 1) {
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                red[warp][j] = a0[j];
                red[warp][ROWS + j] = a1[j];
            }
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            a0[j] = a1[j] = 0.0f;
            for (int p = 0; p < kw; p++) {
                a0[j] = __fadd_rn(a0[j], red[warp + p][j]);
                a1[j] = __fadd_rn(a1[j], red[warp + p][ROWS + j]);
            }
        }
    }
    if (live && lane == 0) {
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            const float v = dec_out(a0[j], a1[j], r, bias[j], res[j], mode);
            (gu ? ms.m[0].out[row + j] : m.out[rr + j]) = v;
            outv[slot * ROWS + j] = v;
        }
    }
    if (ROWS != 4 || !qo.xq) return;
    __syncthreads();
    if (warp != 0) return;
    dec_quant_out(qo, outv[lane], blockIdx.x, 0, 1, total, lane);
}

// a[t] of a per-token array held in registers, for a run-time t (< NT) that differs between
// lanes: selected, not indexed (an indexed array would go to local memory).
template <int NT>
__device__ __forceinline__ float dec_pick(const float (&a)[NT], int t) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < NT; i++)
        if (i == t) v = a[i];
    return v;
}

// The decode product for several tokens (products.rs runs it with one token a block, for two
// tokens: NT > 1 unrolls a tile of tokens, which makes the kernel several times one token's
// size; matvec_dec_tloop loops instead), laid out as matvec_dec_impl: block i takes
// row group i / tiles and tokens (i % tiles) * NT.. (a row group's tiles run side by side,
// so its weights come from DRAM once and from L2 after); a group of kw warps takes ROWS
// consecutive rows, part p of each row's blocks on the same lanes in the same steps, a
// lane's first PRE blocks of each row loaded before the wait on the previous kernel; each
// block is loaded once and dotted with the tile's tokens. A token's sums are taken in
// matvec_dec_impl's order (a lane's blocks in order, the warp's shuffle tree, the parts in
// order from 0) and its output by the same expressions, so that a token's result is the
// same alone or among 63 others, whatever ROWS, NT and PRE are.
template <int F, int ROWS, int NT, int PRE>
__device__ void matvec_dec_tokens(const Mats& ms, const u8* xqb, int cols, int ntok,
                                  const float* ss_in, float eps, int mode, int kw,
                                  const QOut& qo) {
    __shared__ float red[WARPS * DEC_KW_MAX][2 * ROWS * NT];
    __shared__ float outv[NT][WARPS * ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int nb = cols / 32;
    const bool gu = is_gate_up(mode);
    const int total = gu ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int tiles = (ntok + NT - 1) / NT;
    const int rb = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * NT;
    const int nt = min(NT, ntok - t0);
    const int row = (rb * WARPS + slot) * ROWS;
    const bool live = row < total;
    // The rows' matrix, by value (see matvec_impl); a warp's rows never straddle two.
    int mi = 0, rr = row;
    if (!gu) {
        mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
        rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
    }
    const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
    const Mat m1 = ms.m[1];
    WBlk w0[ROWS][PRE], w1[ROWS][PRE];
    pdl_trigger();
    if (live) dec_preload<F, ROWS, PRE>(m, m1, gu, rr, part * 32 + lane, 32 * kw, nb, w0, w1);
    pdl_wait();
    auto ss_t = [&](int t) { return ss_in ? ss_in + (size_t)(t0 + t) * nb : nullptr; };
    SsPre ssp[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ssp[t] = dec_ss_load(t < nt ? ss_t(t) : nullptr, nb, lane);
    const XQ g = xq_layout(xqb, cols, ntok);
    float a0[ROWS][NT], a1[ROWS][NT];
#pragma unroll
    for (int j = 0; j < ROWS; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) a0[j][t] = a1[j][t] = 0.0f;
    if (live) {
#pragma unroll
        for (int i = 0; i < PRE; i++) {
            const int b = part * 32 + lane + i * 32 * kw;
            if (b < nb) {
#pragma unroll
                for (int j = 0; j < ROWS; j++) {
                    const WVals va = wblk_unpack<F>(w0[j][i], m.fmt, b);
                    WVals vb;
                    if (gu) vb = wblk_unpack<F>(w1[j][i], m1.fmt, b);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        if (t >= nt) break;
                        const XTok x = xtok(g, t0 + t, cols);
                        a0[j][t] = wblk_acc<F>(a0[j][t], w0[j][i], va, m.fmt, b, x);
                        if (gu) a1[j][t] = wblk_acc<F>(a1[j][t], w1[j][i], vb, m1.fmt, b, x);
                    }
                }
            }
        }
        for (int b = part * 32 + lane + PRE * 32 * kw; b < nb; b += 32 * kw) {
            WBlk wa[ROWS], wb[ROWS];
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                wa[j] = wblk_load<F>(m, rr + j, b, nb);
                if (gu) wb[j] = wblk_load<F>(m1, rr + j, b, nb);
            }
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                const WVals va = wblk_unpack<F>(wa[j], m.fmt, b);
                WVals vb;
                if (gu) vb = wblk_unpack<F>(wb[j], m1.fmt, b);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    const XTok x = xtok(g, t0 + t, cols);
                    a0[j][t] = wblk_acc<F>(a0[j][t], wa[j], va, m.fmt, b, x);
                    if (gu) a1[j][t] = wblk_acc<F>(a1[j][t], wb[j], vb, m1.fmt, b, x);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < ROWS; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            a0[j][t] = warp_sum(a0[j][t]);
            if (gu) a1[j][t] = warp_sum(a1[j][t]);
        }
    if (kw > 1) {
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < ROWS; j++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    red[warp][2 * (j * NT + t)] = a0[j][t];
                    red[warp][2 * (j * NT + t) + 1] = a1[j][t];
                }
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int j = 0; j < ROWS; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                a0[j][t] = a1[j][t] = 0.0f;
                for (int p = 0; p < kw; p++) {
                    a0[j][t] = __fadd_rn(a0[j][t], red[warp + p][2 * (j * NT + t)]);
                    a1[j][t] = __fadd_rn(a1[j][t], red[warp + p][2 * (j * NT + t) + 1]);
                }
            }
    }
    // Each token's 1 / rms (the whole warp's lanes over its partials, asked for after the
    // wait), once the sums are done.
    float r[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        r[t] = t < nt ? dec_ss_inv(ssp[t], ss_t(t), nb, cols, eps, lane) : 1.0f;
    // Lane j * NT + t writes row j's output for token t: the residual and bias loads side by
    // side, not one after another in one lane.
    static_assert(ROWS * NT <= 32, "a lane an output");
    const int oj = lane / NT, ot = lane % NT;
    if (live && oj < ROWS && ot < nt) {
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < ROWS; j++)
            if (j == oj) {
                s0 = dec_pick(a0[j], ot);
                s1 = dec_pick(a1[j], ot);
            }
        const float bias = !gu && m.bias ? m.bias[rr + oj] : 0.0f;
        float* o = gu ? ms.m[0].out + (size_t)(t0 + ot) * ms.m[0].ld_out + row + oj
                      : m.out + (size_t)(t0 + ot) * m.ld_out + rr + oj;
        const float v =
            dec_out(s0, s1, dec_pick(r, ot), bias, mode == MODE_ADD ? *o : 0.0f, mode);
        *o = v;
        outv[ot][slot * ROWS + oj] = v;
    }
    if (ROWS != 4 || !qo.xq) return;
    __syncthreads();
    // Group t's first warp (its others are gone) quantizes token t's 32 values of the block.
    if (slot < nt) dec_quant_out(qo, outv[slot][lane], rb, t0 + slot, ntok, total, lane);
}

// The decode product for several tokens with the tokens in a loop (not unrolled): a
// lane's preloaded blocks dotted with one token after another, each token's sums (in
// matvec_dec_impl's order) left in shared memory, then a lane an output. The code and the
// registers are one token's whatever NT is (an unrolled tile of tokens makes the kernel
// several times the size of matvec_dec_impl's, fetched once per block).
template <int F, int ROWS, int NT, int PRE>
__device__ void matvec_dec_tloop(const Mats& ms, const u8* xqb, int cols, int ntok,
                                 const float* ss_in, float eps, int mode, int kw,
                                 const QOut& qo) {
    __shared__ float red[WARPS * DEC_KW_MAX][NT][2 * ROWS];
    __shared__ float rms[NT];
    __shared__ float outv[NT][WARPS * ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int nb = cols / 32;
    const bool gu = is_gate_up(mode);
    const int total = gu ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int tiles = (ntok + NT - 1) / NT;
    const int rb = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * NT;
    const int nt = min(NT, ntok - t0);
    const int row = (rb * WARPS + slot) * ROWS;
    const bool live = row < total;
    int mi = 0, rr = row;
    if (!gu) {
        mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
        rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
    }
    const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
    const Mat m1 = ms.m[1];
    WBlk w0[ROWS][PRE], w1[ROWS][PRE];
    pdl_trigger();
    if (live) dec_preload<F, ROWS, PRE>(m, m1, gu, rr, part * 32 + lane, 32 * kw, nb, w0, w1);
    pdl_wait();
    // Token w's 1 / rms by warp w (WARPS >= NT): its partials asked for now, summed after the
    // products.
    const float* ss_t = ss_in && warp < nt ? ss_in + (size_t)(t0 + warp) * nb : nullptr;
    const SsPre ssp = dec_ss_load(ss_t, nb, lane);
    const XQ g = xq_layout(xqb, cols, ntok);
#pragma unroll 1
    for (int t = 0; t < nt; t++) {
        const XTok x = xtok(g, t0 + t, cols);
        float a0[ROWS], a1[ROWS];
#pragma unroll
        for (int j = 0; j < ROWS; j++) a0[j] = a1[j] = 0.0f;
        if (live) {
#pragma unroll
            for (int i = 0; i < PRE; i++) {
                const int b = part * 32 + lane + i * 32 * kw;
                if (b < nb) {
#pragma unroll
                    for (int j = 0; j < ROWS; j++) {
                        a0[j] = wblk_acc<F>(a0[j], w0[j][i], wblk_unpack<F>(w0[j][i], m.fmt, b),
                                            m.fmt, b, x);
                        if (gu)
                            a1[j] = wblk_acc<F>(a1[j], w1[j][i],
                                                wblk_unpack<F>(w1[j][i], m1.fmt, b), m1.fmt, b, x);
                    }
                }
            }
            for (int b = part * 32 + lane + PRE * 32 * kw; b < nb; b += 32 * kw) {
#pragma unroll
                for (int j = 0; j < ROWS; j++) {
                    const WBlk wa = wblk_load<F>(m, rr + j, b, nb);
                    a0[j] = wblk_acc<F>(a0[j], wa, wblk_unpack<F>(wa, m.fmt, b), m.fmt, b, x);
                    if (gu) {
                        const WBlk wb = wblk_load<F>(m1, rr + j, b, nb);
                        a1[j] =
                            wblk_acc<F>(a1[j], wb, wblk_unpack<F>(wb, m1.fmt, b), m1.fmt, b, x);
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            a0[j] = warp_sum(a0[j]);
            if (gu) a1[j] = warp_sum(a1[j]);
        }
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                red[warp][t][j] = a0[j];
                red[warp][t][ROWS + j] = a1[j];
            }
        }
    }
    if (warp < nt) {
        const float r = dec_ss_inv(ssp, ss_t, nb, cols, eps, lane);
        if (lane == 0) rms[warp] = r;
    }
    __syncthreads();
    if (part != 0) return;
    // Lane j * NT + t writes row j's output for token t, its parts' sums added in order.
    static_assert(ROWS * NT <= 32, "a lane an output");
    const int oj = lane / NT, ot = lane % NT;
    if (live && oj < ROWS && ot < nt) {
        float s0 = red[warp][ot][oj], s1 = red[warp][ot][ROWS + oj];
        if (kw > 1) {
            s0 = s1 = 0.0f;
            for (int p = 0; p < kw; p++) {
                s0 = __fadd_rn(s0, red[warp + p][ot][oj]);
                s1 = __fadd_rn(s1, red[warp + p][ot][ROWS + oj]);
            }
        }
        const float bias = !gu && m.bias ? m.bias[rr + oj] : 0.0f;
        float* o = gu ? ms.m[0].out + (size_t)(t0 + ot) * ms.m[0].ld_out + row + oj
                      : m.out + (size_t)(t0 + ot) * m.ld_out + rr + oj;
        const float v = dec_out(s0, s1, rms[ot], bias, mode == MODE_ADD ? *o : 0.0f, mode);
        *o = v;
        outv[ot][slot * ROWS + oj] = v;
    }
    if (ROWS != 4 || !qo.xq) return;
    __syncthreads();
    if (slot < nt) dec_quant_out(qo, outv[slot][lane], rb, t0 + slot, ntok, total, lane);
}

// Blocks of each row a lane of matvec_dec_tloop loads before the wait (MVD_PRE with one row
// a warp, one with four, for the registers).
template <int ROWS>
__host__ __device__ constexpr int tok_pre() {
    return ROWS == 1 ? MVD_PRE : 1;
}

// matvec_dec_<format>_<ROWS>_1 for one token (matvec_dec_impl), _t1 for two (matvec_dec_tokens,
// one token a block), _l2 / _l for more (matvec_dec_tloop, two / DEC_TILE tokens a block);
// products.rs chooses.
#define MATVEC_DEC1(NAME, F, ROWS)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_##ROWS##_1(Mats ms, const u8* xqb, int cols, int ntok,            \
                                       const float* ss_in, float eps, int mode, int kw,       \
                                       QOut qo) {                                             \
        matvec_dec_impl<F, ROWS>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                    \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_##ROWS##_t1(Mats ms, const u8* xqb, int cols, int ntok,           \
                                        const float* ss_in, float eps, int mode, int kw,      \
                                        QOut qo) {                                            \
        matvec_dec_tokens<F, ROWS, 1, MVD_PRE>(ms, xqb, cols, ntok, ss_in, eps, mode, kw, qo); \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_##ROWS##_l(Mats ms, const u8* xqb, int cols, int ntok,            \
                                       const float* ss_in, float eps, int mode, int kw,       \
                                       QOut qo) {                                             \
        matvec_dec_tloop<F, ROWS, DEC_TILE, tok_pre<ROWS>()>(ms, xqb, cols, ntok, ss_in, eps, \
                                                             mode, kw, qo);                   \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_##ROWS##_l2(Mats ms, const u8* xqb, int cols, int ntok,           \
                                        const float* ss_in, float eps, int mode, int kw,      \
                                        QOut qo) {                                            \
        matvec_dec_tloop<F, ROWS, 2, tok_pre<ROWS>()>(ms, xqb, cols, ntok, ss_in, eps, mode,  \
                                                      kw, qo);                                \
    }
// matvec_dec_<format>_4_1g: one token of a gate/up pair, four rows a warp, kw = 1, one block
// of each row preloaded: registers for three blocks a multiprocessor (a pair whose blocks
// are more than two a multiprocessor then runs in one wave).
#define MATVEC_DEC_GU(NAME, F)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * WARPS, 3)                              \
        matvec_dec_##NAME##_4_1g(Mats ms, const u8* xqb, int cols, int ntok,                 \
                                 const float* ss_in, float eps, int mode, int kw, QOut qo) { \
        matvec_dec_impl<F, 4, 1, 1>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                \
    }
// One token, four rows a warp, the mode fixed: matvec_dec_<format>_4_1n for every mode but
// a gate/up pair, without the pair's second matrix; matvec_dec_<format>_4_1p for a pair, with
// as many preloaded blocks as fit in registers (the run-time-mode kernel, _4_1, holds room
// for both; Q8_0's, Q4_K's and Q6_K's blocks spilled to local memory there).
template <int F>
__host__ __device__ constexpr int pair_pre() {
    return F == FMT_Q4_0 || F == FMT_Q4_1 || F == FMT_Q4_K ? MVD_PRE : 1;
}
#define MATVEC_DEC_FIXED(NAME, F)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_4_1n(Mats ms, const u8* xqb, int cols, int ntok,                 \
                                 const float* ss_in, float eps, int mode, int kw, QOut qo) { \
        matvec_dec_impl<F, 4, 0>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                   \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS * DEC_KW_MAX)                    \
        matvec_dec_##NAME##_4_1p(Mats ms, const u8* xqb, int cols, int ntok,                 \
                                 const float* ss_in, float eps, int mode, int kw, QOut qo) { \
        matvec_dec_impl<F, 4, 1, pair_pre<F>()>(ms, xqb, cols, ss_in, eps, mode, kw, qo);    \
    }
#define MATVEC_DEC(NAME, F)                                                                  \
    MATVEC_DEC1(NAME, F, 1)                                                                  \
    MATVEC_DEC1(NAME, F, 4) MATVEC_DEC_GU(NAME, F) MATVEC_DEC_FIXED(NAME, F)
static_assert(WARPS >= DEC_TILE, "a tokens kernel's quantized output takes a warp a token");
MATVEC_DEC(any, -1)
MATVEC_DEC(q4_0, FMT_Q4_0)
MATVEC_DEC(q4_1, FMT_Q4_1)
MATVEC_DEC(q8_0, FMT_Q8_0)
MATVEC_DEC(q4_k, FMT_Q4_K)
MATVEC_DEC(q6_k, FMT_Q6_K)
MATVEC_DEC(kmix, F_KMIX)
