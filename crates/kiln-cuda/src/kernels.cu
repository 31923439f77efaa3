// kiln's CUDA kernels, compiled at run time with NVRTC. No headers: f16 conversions and the
// integer dot products are PTX.
//
// Weights arrive repacked by pack.rs: every quantized format is cut into blocks of 32
// values whose 4-bit parts sit in one 16-byte vector (byte j holds values j and j + 16, low
// nibble first) and whose 8-bit parts sit in two; scales live in arrays of their own. A
// matrix-vector product first quantizes the activations (after the RMSNorm it may fuse) to
// int8 blocks once (quant_act, into global memory), then warps take rows, each lane one
// block at a time, and products are dp4a.
//
// Positions and token ids are read from `params` (device memory: params[0] = first
// position, params[2 + t] = token t), so that a recorded graph stays valid from step to step.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define FMT_F32 0
#define FMT_F16 1
#define FMT_Q4_0 2
#define FMT_Q4_1 3
#define FMT_Q8_0 4
#define FMT_Q4_K 5
#define FMT_Q6_K 6

#define MODE_STORE 0
#define MODE_ADD 1
#define MODE_GATE_UP 2

#define MAX_TOK 4
#define WARPS 8
#define QV 12
#define Q6K_REC 20
#define KINF __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// Unsigned bytes of a times signed bytes of b, summed into c.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp4a_ss(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// Programmatic dependent launch (sm_90+): a kernel lets the next one in the stream start as
// soon as all its blocks run (pdl_trigger), and waits for the previous one to finish and
// its writes to be visible (pdl_wait) before it touches anything that one wrote. Only
// immutable data (weights) is read before the wait. No-ops when launched without the
// attribute or on older GPUs.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
    pdl_trigger();
    pdl_wait();
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Spreads 4 two-bit fields (bits 0..7 of t) into bits 4..5 of 4 bytes.
__device__ __forceinline__ u32 spread2(u32 t) {
    u32 b = (t & 0x03) | ((t & 0x0c) << 6) | ((t & 0x30) << 12) | ((t & 0xc0) << 18);
    return b << 4;
}

// The scale and minimum of sub-block j (0..7) from a Q4_K super-block's 12 packed bytes.
__device__ __forceinline__ void q4k_scale_min(const u8* sc, int j, int* d, int* m) {
    if (j < 4) {
        *d = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *d = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// ---- matrices as the kernels see them ---------------------------------------------------

struct Mat {
    const u8* q;   // packed values (F32/F16: the values themselves)
    const u8* s;   // per-block data: Q4_0/Q8_0 f16 scale; Q4_1 f16 (d, m); Q6_K high bits
    const u8* s2;  // per-super-block data: Q4_K 16-byte header; Q6_K 20-byte record
    const float* bias;
    float* out;
    int rows;
    int fmt;
    int ld_out;  // values between output rows (tokens)
};

struct Mats {
    Mat m[3];
    int n_mats;
    int row0[4];  // mat i owns output rows row0[i]..row0[i + 1] of the launch
};

// Block-quantized activations of up to MAX_TOK tokens, written once per product by
// quant_act into a global buffer (L2-resident) that every block of the product reads.
// Layout (pack.rs's xq_bytes computes the same size): q ntok*cols bytes, d ntok*nb floats,
// sums ntok*cols/16 shorts, inv ntok floats.
struct XQ {
    const int* q;      // [tok][cols / 4]: 4 int8 values per int
    const float* d;    // [tok][cols / 32]
    const short* sum;  // [tok][cols / 16]: sums of each half block's values
    const float* inv;  // [tok]: the fused RMSNorm's 1 / rms (1 when not fused)
};

__device__ __forceinline__ XQ xq_layout(const u8* base, int cols, int ntok) {
    const int nb = cols / 32;
    XQ x;
    x.q = (const int*)base;
    x.d = (const float*)(base + (size_t)ntok * cols);
    x.sum = (const short*)(x.d + ntok * nb);
    x.inv = (const float*)(x.sum + ntok * (cols / 16));
    return x;
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
            int a = dp4a_ss((int)wa.x, (int)xa.x, 0);
            a = dp4a_ss((int)wa.y, (int)xa.y, a);
            a = dp4a_ss((int)wa.z, (int)xa.z, a);
            a = dp4a_ss((int)wa.w, (int)xa.w, a);
            a = dp4a_ss((int)wb.x, (int)xb.x, a);
            a = dp4a_ss((int)wb.y, (int)xb.y, a);
            a = dp4a_ss((int)wb.z, (int)xb.z, a);
            a = dp4a_ss((int)wb.w, (int)xb.w, a);
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
        const u8* hdr = m.s2 + ((size_t)r * (nb / 8) + b / 8) * 16;
        const float d = h2f(*(const u16*)hdr), dmin = h2f(*(const u16*)(hdr + 2));
        int sc, mn;
        q4k_scale_min(hdr + 4, b % 8, &sc, &mn);
        s_lo = s_hi = d * (float)sc;
        m_lo = m_hi = -dmin * (float)mn;
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
        int a = dp4a_us(lo4[0], (int)xa.x, 0);
        a = dp4a_us(lo4[1], (int)xa.y, a);
        a = dp4a_us(lo4[2], (int)xa.z, a);
        a = dp4a_us(lo4[3], (int)xa.w, a);
        int c = dp4a_us(hi4[0], (int)xb.x, 0);
        c = dp4a_us(hi4[1], (int)xb.y, c);
        c = dp4a_us(hi4[2], (int)xb.z, c);
        c = dp4a_us(hi4[3], (int)xb.w, c);
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
extern "C" __global__ void quant_act(const float* x, int cols, int ntok, const float* norm_w,
                                     float eps, u8* xq) {
    pdl_begin();
    __shared__ float red[QA_WARPS];
    const int t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = cols / 32;
    const bool quant = cols % 32 == 0;
    const float* xt = x + (size_t)t * cols;
    float* inv = (float*)(xq + (size_t)ntok * cols + (size_t)ntok * nb * 4 +
                          (size_t)ntok * (cols / 16) * 2);
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

// Bytes of a packed matrix's row in m.q (pack.rs's layout).
__device__ __forceinline__ size_t row_bytes(int fmt, int cols) {
    switch (fmt) {
    case FMT_F32: return (size_t)cols * 4;
    case FMT_F16: return (size_t)cols * 2;
    case FMT_Q8_0: return (size_t)cols;
    default: return (size_t)cols / 2;
    }
}

// out = W x (+ bias), out += W x, or out = silu(W0 x) * (W1 x), for the matrices of `ms`
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
    const int total = mode == MODE_GATE_UP ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int row = (blockIdx.x * (WARPS / kw) + slot) * NR;
    const bool live = row < total;
    float acc[2 * NR][NT];
    Mat m = ms.m[0];
    int rr = row;
    if (live) {
        if (mode == MODE_GATE_UP) {
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
    const int nacc = mode == MODE_GATE_UP ? 2 * NR : NR;
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
            if (mode == MODE_GATE_UP) {
                ms.m[0].out[(size_t)t * ms.m[0].ld_out + row + i] = silu(acc[i][t]) * acc[NR + i][t];
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
        const int total = mode == MODE_GATE_UP ? ms.m[0].rows : ms.row0[ms.n_mats];
        const int row = (blockIdx.x * (WARPS / kw) + warp / kw) * NR;
        if (row < total) {
            const int nm = mode == MODE_GATE_UP ? 2 : 1;
            for (int j = 0; j < nm; j++) {
                int mi = j, rr = row;
                if (mode != MODE_GATE_UP) {
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
    uint4 r;  // Q8_0: the last 16 bytes; Q4_K: the super-block header; Q6_K: x, y high bits
    u32 s;    // Q4_0/Q8_0: f16 scale; Q4_1: f16 (d, m); Q6_K: the u32 holding the two scales
    u32 s2;   // Q6_K: the u32 holding the super-block's f16 d
};

template <int F>
__device__ __forceinline__ WBlk wblk_load(const Mat& m, int r, int b, int nb) {
    const int fmt = F >= 0 ? F : m.fmt;
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
    case FMT_Q4_K: w.r = __ldg((const uint4*)(m.s2 + ((size_t)r * (nb / 8) + b / 8) * 16)); break;
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

// Byte i (0..11) of a Q4_K header's packed scales (the uint4's y, z, w words).
__device__ __forceinline__ int q4k_byte(const uint4& h, int i) {
    const u32 word = i < 4 ? h.y : (i < 8 ? h.z : h.w);
    return (int)((word >> (8 * (i % 4))) & 0xff);
}

// A loaded block's 4-bit formats: its values' low parts (lo4: values 0..15, hi4: 16..31, a
// byte each; Q6_K's high bits added) and value = s * q + m over each half.
struct WVals {
    u32 lo4[4], hi4[4];
    float s_lo, s_hi, m_lo, m_hi;
};

template <int F>
__device__ __forceinline__ WVals wblk_vals(const WBlk& w, int fmt_rt, int b) {
    const int fmt = F >= 0 ? F : fmt_rt;
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
        const float d = h2f((u16)(w.r.x & 0xffff)), dmin = h2f((u16)(w.r.x >> 16));
        const int j = b % 8;
        int sc, mn;
        if (j < 4) {
            sc = q4k_byte(w.r, j) & 63;
            mn = q4k_byte(w.r, j + 4) & 63;
        } else {
            sc = (q4k_byte(w.r, j + 4) & 0x0f) | ((q4k_byte(w.r, j - 4) >> 6) << 4);
            mn = (q4k_byte(w.r, j + 4) >> 4) | ((q4k_byte(w.r, j) >> 6) << 4);
        }
        o.s_lo = o.s_hi = d * (float)sc;
        o.m_lo = o.m_hi = -dmin * (float)mn;
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

// Block b of a row (loaded as w) dotted with the block-quantized activations (q: 8 ints a
// block; d: a scale a block; sum: two half sums a block).
template <int F>
__device__ __forceinline__ float wblk_dot(const WBlk& w, int fmt_rt, int b, const int* xq,
                                          const float* xd, const short* xs) {
    const int fmt = F >= 0 ? F : fmt_rt;
    const uint4 xa = *(const uint4*)(xq + b * 8), xb = *(const uint4*)(xq + b * 8 + 4);
    if (fmt == FMT_Q8_0) {
        int a = dp4a_ss((int)w.q.x, (int)xa.x, 0);
        a = dp4a_ss((int)w.q.y, (int)xa.y, a);
        a = dp4a_ss((int)w.q.z, (int)xa.z, a);
        a = dp4a_ss((int)w.q.w, (int)xa.w, a);
        a = dp4a_ss((int)w.r.x, (int)xb.x, a);
        a = dp4a_ss((int)w.r.y, (int)xb.y, a);
        a = dp4a_ss((int)w.r.z, (int)xb.z, a);
        a = dp4a_ss((int)w.r.w, (int)xb.w, a);
        return h2f((u16)w.s) * xd[b] * (float)a;
    }
    const WVals o = wblk_vals<F>(w, fmt, b);
    const u32* lo4 = o.lo4;
    const u32* hi4 = o.hi4;
    const float s_lo = o.s_lo, s_hi = o.s_hi, m_lo = o.m_lo, m_hi = o.m_hi;
    int a = dp4a_us(lo4[0], (int)xa.x, 0);
    a = dp4a_us(lo4[1], (int)xa.y, a);
    a = dp4a_us(lo4[2], (int)xa.z, a);
    a = dp4a_us(lo4[3], (int)xa.w, a);
    int c = dp4a_us(hi4[0], (int)xb.x, 0);
    c = dp4a_us(hi4[1], (int)xb.y, c);
    c = dp4a_us(hi4[2], (int)xb.z, c);
    c = dp4a_us(hi4[3], (int)xb.w, c);
    const float s0 = (float)xs[2 * b], s1 = (float)xs[2 * b + 1];
    return xd[b] * (s_lo * (float)a + m_lo * s0 + s_hi * (float)c + m_hi * s1);
}

// Where a decode product's epilogue writes its output rows quantized, for the next product
// (only with ROWS = 4: a block's 8 warps x 4 rows are one 32-value block of the output):
// q, d and sums for one token of `total` values (xq_layout), each block's 32 values times
// norm_w (the next RMSNorm's weights, or none), and their sum of squares added into *ss
// (zeroed at the step's start) so that the next product applies the 1 / rms itself.
struct QOut {
    u8* xq;
    const float* norm_w;
    float* ss;
};

// The decode product: out = W x (+ bias), out += W x, or out = silu(W0 x) * (W1 x) for one
// token of quantized activations xqb (cols values), times 1 / rms(x) when ss_in holds x's
// sum of squares (an RMSNorm whose weights are already in xqb's values). Each warp takes
// ROWS consecutive rows, WARPS / kw warp groups a block, a row's blocks split over kw warps;
// a lane's first MVD_PRE blocks of each of its rows are loaded before anything else.
template <int F, int ROWS>
__device__ void matvec_dec_impl(const Mats& ms, const u8* xqb, int cols, const float* ss_in,
                                float eps, int mode, int kw, const QOut& qo) {
    __shared__ float red[WARPS][2 * ROWS];
    __shared__ float outv[WARPS * ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int nb = cols / 32;
    const bool gu = mode == MODE_GATE_UP;
    const int total = gu ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int row = (blockIdx.x * (WARPS / kw) + slot) * ROWS;
    const bool live = row < total;
    // The rows' matrix, by value (see matvec_impl); a warp's rows never straddle two.
    int mi = 0, rr = row;
    if (!gu) {
        mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
        rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
    }
    const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
    const Mat m1 = ms.m[1];
    WBlk w0[ROWS][MVD_PRE], w1[ROWS][MVD_PRE];
    pdl_trigger();
    if (live) {
#pragma unroll
        for (int i = 0; i < MVD_PRE; i++) {
            const int b = part * 32 + lane + i * 32 * kw;
            if (b < nb) {
#pragma unroll
                for (int j = 0; j < ROWS; j++) {
                    w0[j][i] = wblk_load<F>(m, rr + j, b, nb);
                    if (gu) w1[j][i] = wblk_load<F>(m1, rr + j, b, nb);
                }
            }
        }
    }
    pdl_wait();
    const XQ g = xq_layout(xqb, cols, 1);
    float a0[ROWS], a1[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; j++) a0[j] = a1[j] = 0.0f;
    if (live) {
#pragma unroll
        for (int i = 0; i < MVD_PRE; i++) {
            const int b = part * 32 + lane + i * 32 * kw;
            if (b < nb) {
#pragma unroll
                for (int j = 0; j < ROWS; j++) {
                    a0[j] += wblk_dot<F>(w0[j][i], m.fmt, b, g.q, g.d, g.sum);
                    if (gu) a1[j] += wblk_dot<F>(w1[j][i], m1.fmt, b, g.q, g.d, g.sum);
                }
            }
        }
        for (int b = part * 32 + lane + MVD_PRE * 32 * kw; b < nb; b += 32 * kw) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                a0[j] += wblk_dot<F>(wblk_load<F>(m, rr + j, b, nb), m.fmt, b, g.q, g.d, g.sum);
                if (gu)
                    a1[j] += wblk_dot<F>(wblk_load<F>(m1, rr + j, b, nb), m1.fmt, b, g.q, g.d,
                                         g.sum);
            }
        }
    }
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
                a0[j] += red[warp + p][j];
                a1[j] += red[warp + p][ROWS + j];
            }
        }
    }
    const float r = ss_in ? rsqrtf(*ss_in / (float)cols + eps) : 1.0f;
    if (live && lane == 0) {
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            float v;
            if (gu) {
                v = silu(a0[j] * r) * (a1[j] * r);
                ms.m[0].out[row + j] = v;
            } else {
                float* o = m.out + rr + j;
                v = a0[j] * r + (m.bias ? m.bias[rr + j] : 0.0f);
                if (mode == MODE_ADD) v += *o;
                *o = v;
            }
            outv[warp * ROWS + j] = v;
        }
    }
    if (ROWS != 4 || !qo.xq) return;
    __syncthreads();
    if (warp != 0) return;
    // The block's 32 output values as quant_act would quantize them (times the next norm's
    // weights; the 1 / rms is the next product's).
    const int b = blockIdx.x;
    const int c = b * 32 + lane;
    const float v = outv[lane];
    i8* q = (i8*)qo.xq;
    float* d = (float*)(qo.xq + total);
    short* sum = (short*)(d + total / 32);
    quant_block(v * (qo.norm_w ? qo.norm_w[c] : 1.0f), b, lane, q, d, sum);
    if (qo.ss) {
        const float s2 = warp_sum(v * v);
        if (lane == 0) atomicAdd(qo.ss, s2);
    }
}

#define MATVEC_DEC1(NAME, F, ROWS)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                                 \
        matvec_dec_##NAME##_##ROWS(Mats ms, const u8* xqb, int cols, const float* ss_in,      \
                                   float eps, int mode, int kw, QOut qo) {                    \
        matvec_dec_impl<F, ROWS>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                    \
    }
#define MATVEC_DEC(NAME, F) MATVEC_DEC1(NAME, F, 1) MATVEC_DEC1(NAME, F, 4)
MATVEC_DEC(any, -1)
MATVEC_DEC(q4_0, FMT_Q4_0)
MATVEC_DEC(q4_1, FMT_Q4_1)
MATVEC_DEC(q8_0, FMT_Q8_0)
MATVEC_DEC(q4_k, FMT_Q4_K)
MATVEC_DEC(q6_k, FMT_Q6_K)

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
        const u8* hdr = m.s2 + ((size_t)r * (nb / 8) + b / 8) * 16;
        int sc, mn;
        q4k_scale_min(hdr + 4, b % 8, &sc, &mn);
        return h2f(*(const u16*)hdr) * (float)sc * (float)q -
               h2f(*(const u16*)(hdr + 2)) * (float)mn;
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

// ---- per-head work: q/k RMSNorm, RoPE, KV-cache store ----------------------------------

struct HeadGroup {
    float* x;             // (ntok, heads * head_dim), rewritten in place
    const float* norm_w;  // per-head RMSNorm weights (head_dim) or null
    u16* cache;           // this layer's (heads, n_ctx, head_dim) f16 plane, or null
    int heads;
    int rope;             // 1: rotate
};

struct HeadGroups {
    HeadGroup g[3];
    int n;
    int row0[4];
};

// One warp per (token, head): grid.x covers the head rows of all groups in WARPS-row blocks,
// grid.y the tokens. inv_freq has rope_dims / 2 values; neox selects (i, i + dims/2) pairs
// over (2i, 2i + 1).
extern "C" __global__ void heads(HeadGroups hg, int head_dim, float eps, const float* inv_freq,
                                 int rope_dims, int neox, int n_ctx, const u32* params) {
    pdl_begin();
    __shared__ float row[WARPS][256];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hr = blockIdx.x * WARPS + warp;
    const int t = blockIdx.y;
    if (hr >= hg.row0[hg.n]) return;
    const int gi = (hg.n > 1 && hr >= hg.row0[1]) + (hg.n > 2 && hr >= hg.row0[2]);
    const HeadGroup g = gi == 0 ? hg.g[0] : (gi == 1 ? hg.g[1] : hg.g[2]);
    const int h = hr - (gi == 0 ? hg.row0[0] : (gi == 1 ? hg.row0[1] : hg.row0[2]));
    const int pos = (int)params[0] + t;
    float* xr = g.x + ((size_t)t * g.heads + h) * head_dim;
    float* sr = row[warp];
    float ss = 0.0f;
    for (int e = lane; e < head_dim; e += 32) {
        const float v = xr[e];
        sr[e] = v;
        ss += v * v;
    }
    if (g.norm_w) {
        const float r = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
        for (int e = lane; e < head_dim; e += 32) sr[e] = sr[e] * r * g.norm_w[e];
    }
    __syncwarp();
    float out[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        if (e >= head_dim) break;
        float v = sr[e];
        if (g.rope && e < rope_dims) {
            const int half = rope_dims / 2;
            int fi, partner;
            float sign;
            if (neox) {
                fi = e < half ? e : e - half;
                partner = e < half ? e + half : e - half;
                sign = e < half ? -1.0f : 1.0f;
            } else {
                fi = e / 2;
                partner = e ^ 1;
                sign = (e & 1) ? 1.0f : -1.0f;
            }
            // The f32 angle, as the CPU backend rounds it.
            float sn, cs;
            sincosf((float)pos * inv_freq[fi], &sn, &cs);
            v = v * cs + sign * sr[partner] * sn;
        }
        out[i] = v;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        if (e >= head_dim) break;
        xr[e] = out[i];
        if (g.cache) g.cache[((size_t)h * n_ctx + pos) * head_dim + e] = f2h(out[i]);
    }
}

// ---- attention over the f16 cache: split over keys, then combined ----------------------

#define ATT_WARPS 4
#define ATT_WCHUNK 32
#define ATT_TILE 64
#define ATT_KU 4
#define MAX_GROUP 8

// EPL consecutive f16 values of row r from dimension lane * EPL (zeros past hd), by the
// widest loads their alignment allows.
template <typename T, bool NC>
__device__ __forceinline__ T ld(const T* p) {
    return NC ? __ldg(p) : *p;
}

// (NC: through the read-only path, for data no thread of the kernel writes.)
template <int EPL, bool NC>
__device__ __forceinline__ void load_row_h(const u16* r, int lane, int hd, float* out) {
    const int d0 = lane * EPL;
    if (EPL % 4 == 0 && d0 + EPL <= hd) {
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            const uint2 v = ld<uint2, NC>((const uint2*)(r + d0 + e));
            out[e] = h2f((u16)(v.x & 0xffff));
            out[e + 1] = h2f((u16)(v.x >> 16));
            out[e + 2] = h2f((u16)(v.y & 0xffff));
            out[e + 3] = h2f((u16)(v.y >> 16));
        }
    } else if (EPL % 2 == 0 && d0 + EPL <= hd) {
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            const u32 v = ld<u32, NC>((const u32*)(r + d0 + e));
            out[e] = h2f((u16)(v & 0xffff));
            out[e + 1] = h2f((u16)(v >> 16));
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) out[e] = d0 + e < hd ? h2f(ld<u16, NC>(r + d0 + e)) : 0.0f;
    }
}

// grid (kv_heads, splits, ntok); each warp of a block owns ATT_WCHUNK consecutive keys and
// every query head of its kv head. A lane scores one key against the query heads (q from
// shared memory, the key row by 16-byte loads), the warp takes one softmax step per 32 keys,
// then accumulates V rows (lanes split head_dim) weighted by the broadcast probabilities;
// each warp writes its softmax partial (max, sum, weighted V) for attn_combine.
template <int EPL>
__device__ void attn_split_impl(const float* q, const u16* kc, const u16* vc, int n_ctx,
                                int heads, int kv_heads, int hd, float scale,
                                const u32* params, float* part_acc, float* part_ml) {
    __shared__ float qs[MAX_GROUP * EPL * 32];
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x, t = blockIdx.z;
    const int ws = blockIdx.y * ATT_WARPS + warp, n_ws = gridDim.y * ATT_WARPS;
    const int g = heads / kv_heads;
    const int len = (int)params[0] + t + 1;
    const int k0 = ws * ATT_WCHUNK, k1 = min(len, k0 + ATT_WCHUNK);
    for (int i = threadIdx.x; i < g * hd; i += blockDim.x)
        qs[i] = q[((size_t)t * heads + kvh * g) * hd + i] * scale;
    __syncthreads();
    float acc[MAX_GROUP][EPL], mx[MAX_GROUP], l[MAX_GROUP];
#pragma unroll
    for (int i = 0; i < MAX_GROUP; i++) {
        mx[i] = -KINF;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[i][e] = 0.0f;
    }
    const u16* kp = kc + (size_t)kvh * n_ctx * hd;
    const u16* vp = vc + (size_t)kvh * n_ctx * hd;
    for (int base = k0; base < k1; base += 32) {
        const int p = base + lane;
        const bool valid = p < k1;
        float sc[MAX_GROUP];
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) sc[i] = 0.0f;
        if (valid) {
            const uint4* kr = (const uint4*)(kp + (size_t)p * hd);
            // Unrolled (bounded by EPL) so that the row's loads are in flight together.
#pragma unroll 8
            for (int d8 = 0; d8 < EPL * 4; d8++) {
                if (d8 >= hd / 8) break;
                const uint4 k4 = __ldg(kr + d8);
                const u32 kw[4] = {k4.x, k4.y, k4.z, k4.w};
                float kf[8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kf[2 * j] = h2f((u16)(kw[j] & 0xffff));
                    kf[2 * j + 1] = h2f((u16)(kw[j] >> 16));
                }
#pragma unroll
                for (int i = 0; i < MAX_GROUP; i++) {
                    if (i >= g) break;
                    const float* qi = qs + i * hd + d8 * 8;
#pragma unroll
                    for (int j = 0; j < 8; j++) sc[i] += qi[j] * kf[j];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) {
            if (i >= g) break;
            const float si = valid ? sc[i] : -KINF;
            const float mn = fmaxf(mx[i], warp_max(si));
            const float pe = valid ? expf(si - mn) : 0.0f;
            const float corr = expf(mx[i] - mn);
            l[i] = l[i] * corr + warp_sum(pe);
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[i][e] *= corr;
            mx[i] = mn;
            sc[i] = pe;
        }
        const int nk = min(32, k1 - base);
#pragma unroll 8
        for (int j = 0; j < nk; j++) {
            const u16* vr = vp + (size_t)(base + j) * hd;
            float vv[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const int d = lane * EPL + e;
                vv[e] = d < hd ? h2f(vr[d]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < MAX_GROUP; i++) {
                if (i >= g) break;
                const float pj = __shfl_sync(0xffffffffu, sc[i], j);
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[i][e] += pj * vv[e];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MAX_GROUP; i++) {
        if (i >= g) break;
        const size_t slot = ((size_t)t * heads + kvh * g + i) * n_ws + ws;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int d = lane * EPL + e;
            if (d < hd) part_acc[slot * hd + d] = acc[i][e];
        }
        if (lane == 0) {
            part_ml[2 * slot] = mx[i];
            part_ml[2 * slot + 1] = l[i];
        }
    }
}

// What the decode attention (attn_dec_<EPL>) does first, for its one token: the per-head
// RMSNorm (norm weights or null) and RoPE of q and of the new key, and the new key and
// value stored into the cache (q and k themselves are left as they are).
struct DecHeads {
    const float* k;        // the new key rows (kv_heads * hd)
    const float* v;        // the new value rows
    const float* q_norm;   // per-head RMSNorm weights (hd) or null
    const float* k_norm;
    float eps;
    const float* inv_freq;  // rope_dims / 2 values
    int rope_dims;
    int neox;
};

// Row x (hd values) normalised (norm_w, or not when null) and rotated for position pos
// into out (shared memory; tmp: hd more), by one warp: `heads`' arithmetic, value for value.
__device__ void head_norm_rope(const float* x, float* out, int hd, const float* norm_w,
                               float eps, const DecHeads& dh, int pos, float* tmp) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int e = lane; e < hd; e += 32) ss += x[e] * x[e];
    const float r = norm_w ? rsqrtf(warp_sum(ss) / (float)hd + eps) : 1.0f;
    for (int e = lane; e < hd; e += 32) tmp[e] = norm_w ? x[e] * r * norm_w[e] : x[e];
    __syncwarp();
    for (int e = lane; e < hd; e += 32) {
        float v = tmp[e];
        if (e < dh.rope_dims) {
            const int half = dh.rope_dims / 2;
            int fi, partner;
            float sign;
            if (dh.neox) {
                fi = e < half ? e : e - half;
                partner = e < half ? e + half : e - half;
                sign = e < half ? -1.0f : 1.0f;
            } else {
                fi = e / 2;
                partner = e ^ 1;
                sign = (e & 1) ? 1.0f : -1.0f;
            }
            float sn, cs;
            sincosf((float)pos * dh.inv_freq[fi], &sn, &cs);
            v = v * cs + sign * tmp[partner] * sn;
        }
        out[e] = v;
    }
    __syncwarp();
}

// The decode attention of one token: grid (kv_heads, splits), ATT_WARPS warps a block,
// the heads' work (DecHeads) first. Split s of S takes keys [s * c, (s + 1) * c) of the
// len = pos0 + 1 visible ones (c = len / S rounded up), so a
// recorded grid spreads whatever length the step has over all its blocks. Keys go in tiles
// of ATT_TILE: the warps score them (lanes split the head dimension, ATT_KU keys' rows in
// flight at once, one warp sum per key and query head), one warp per query head takes the
// softmax step over the tile, then the warps accumulate p * V rows (lanes split the head
// dimension again). The warps' sums meet in shared memory; the block writes its softmax
// partial (max, sum, weighted V) per query head for attn_combine.
template <int EPL>
__device__ void attn_dec_impl(const float* q, u16* kc, u16* vc, int n_ctx, int heads,
                              int kv_heads, int hd, float scale, const u32* params,
                              float* part_acc, float* part_ml, const DecHeads& dh) {
    __shared__ float sc[MAX_GROUP][ATT_TILE];
    __shared__ float mls[MAX_GROUP][3];  // running max, running sum, this tile's correction
    __shared__ float red[ATT_WARPS - 1][MAX_GROUP * EPL * 32];
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x, split = blockIdx.y, n_split = gridDim.y, t = blockIdx.z;
    const int g = heads / kv_heads;
    const int len = (int)params[0] + t + 1;
    const int c = (len + n_split - 1) / n_split;
    const int k0 = split * c, k1 = min(len, k0 + c);
    float qr[MAX_GROUP][EPL], acc[MAX_GROUP][EPL];
    {
        // q's rows and the new key, normalised and rotated, in the reduction buffer (free
        // until the end; it holds (MAX_GROUP + 5) rows of 32 * EPL >= hd values), the split
        // whose keys end at len storing the new key and value. q and k stay as they were:
        // the other splits read q.
        float* rows = &red[0][0];
        float* tmp = rows + (MAX_GROUP + 1 + warp) * 32 * EPL;
        const int pos = len - 1;
        const bool owner = k1 > k0 && k1 == len;
        for (int i = warp; i < g + (int)owner; i += ATT_WARPS) {
            if (i < g)
                head_norm_rope(q + ((size_t)kvh * g + i) * hd, rows + i * hd, hd, dh.q_norm,
                               dh.eps, dh, pos, tmp);
            else
                head_norm_rope(dh.k + (size_t)kvh * hd, rows + g * hd, hd, dh.k_norm, dh.eps,
                               dh, pos, tmp);
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) {
            if (i >= g) break;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const int d = lane * EPL + e;
                qr[i][e] = d < hd ? rows[i * hd + d] * scale : 0.0f;
                acc[i][e] = 0.0f;
            }
        }
        if (owner) {
            const size_t at = ((size_t)kvh * n_ctx + pos) * hd;
            for (int d = threadIdx.x; d < hd; d += blockDim.x) {
                kc[at + d] = f2h(rows[g * hd + d]);
                vc[at + d] = f2h(dh.v[(size_t)kvh * hd + d]);
            }
        }
        // The rows are read and the new cache row is visible to the whole block.
        __syncthreads();
    }
    if (threadIdx.x < MAX_GROUP) {
        mls[threadIdx.x][0] = -KINF;
        mls[threadIdx.x][1] = 0.0f;
    }
    const u16* kp = kc + (size_t)kvh * n_ctx * hd;
    const u16* vp = vc + (size_t)kvh * n_ctx * hd;
    for (int base = k0; base < k1; base += ATT_TILE) {
        const int nk = min(ATT_TILE, k1 - base);
        for (int j0 = warp; j0 < nk; j0 += ATT_KU * ATT_WARPS) {
            float kf[ATT_KU][EPL];
#pragma unroll
            for (int u = 0; u < ATT_KU; u++) {
                const int j = j0 + u * ATT_WARPS;
                if (j < nk) load_row_h<EPL, false>(kp + (size_t)(base + j) * hd, lane, hd, kf[u]);
            }
#pragma unroll
            for (int u = 0; u < ATT_KU; u++) {
                const int j = j0 + u * ATT_WARPS;
                if (j >= nk) break;
#pragma unroll
                for (int i = 0; i < MAX_GROUP; i++) {
                    if (i >= g) break;
                    float p = 0.0f;
#pragma unroll
                    for (int e = 0; e < EPL; e++) p += qr[i][e] * kf[u][e];
                    p = warp_sum(p);
                    if (lane == 0) sc[i][j] = p;
                }
            }
        }
        __syncthreads();
        for (int i = warp; i < g; i += ATT_WARPS) {
            const bool va = lane < nk, vb = lane + 32 < nk;
            const float a = va ? sc[i][lane] : -KINF, b = vb ? sc[i][lane + 32] : -KINF;
            const float mo = mls[i][0], lo = mls[i][1];
            const float mn = fmaxf(mo, warp_max(fmaxf(a, b)));
            const float pa = va ? expf(a - mn) : 0.0f, pb = vb ? expf(b - mn) : 0.0f;
            if (va) sc[i][lane] = pa;
            if (vb) sc[i][lane + 32] = pb;
            const float sum = warp_sum(pa + pb);
            if (lane == 0) {
                const float cr = expf(mo - mn);
                mls[i][0] = mn;
                mls[i][1] = lo * cr + sum;
                mls[i][2] = cr;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) {
            if (i >= g) break;
            const float cr = mls[i][2];
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[i][e] *= cr;
        }
        for (int j0 = warp; j0 < nk; j0 += ATT_KU * ATT_WARPS) {
            float vf[ATT_KU][EPL];
#pragma unroll
            for (int u = 0; u < ATT_KU; u++) {
                const int j = j0 + u * ATT_WARPS;
                if (j < nk) load_row_h<EPL, false>(vp + (size_t)(base + j) * hd, lane, hd, vf[u]);
            }
#pragma unroll
            for (int u = 0; u < ATT_KU; u++) {
                const int j = j0 + u * ATT_WARPS;
                if (j >= nk) break;
#pragma unroll
                for (int i = 0; i < MAX_GROUP; i++) {
                    if (i >= g) break;
                    const float p = sc[i][j];
#pragma unroll
                    for (int e = 0; e < EPL; e++) acc[i][e] += p * vf[u][e];
                }
            }
        }
        // The next tile rewrites the scores.
        __syncthreads();
    }
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) {
            if (i >= g) break;
#pragma unroll
            for (int e = 0; e < EPL; e++) red[warp - 1][(i * EPL + e) * 32 + lane] = acc[i][e];
        }
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < MAX_GROUP; i++) {
        if (i >= g) break;
        const size_t slot = ((size_t)t * heads + kvh * g + i) * n_split + split;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            float v = acc[i][e];
#pragma unroll
            for (int w = 0; w < ATT_WARPS - 1; w++) v += red[w][(i * EPL + e) * 32 + lane];
            const int d = lane * EPL + e;
            if (d < hd) part_acc[slot * hd + d] = v;
        }
        if (lane == 0) {
            part_ml[2 * slot] = mls[i][0];
            part_ml[2 * slot + 1] = mls[i][1];
        }
    }
}

// One entry point per EPL (head_dim / 32, rounded up): lib.rs picks attn_split_<EPL>, or
// for one token with its heads' work fused, attn_dec_<EPL> (grid (kv_heads, splits)).
#define ATTN_SPLIT(E)                                                                        \
    extern "C" __global__ void attn_split_##E(const float* q, const u16* kc, const u16* vc,  \
                                              int n_ctx, int heads, int kv_heads, int hd,    \
                                              float scale, const u32* params, float* pa,     \
                                              float* pml) {                                  \
        attn_split_impl<E>(q, kc, vc, n_ctx, heads, kv_heads, hd, scale, params, pa, pml);   \
    }                                                                                        \
    extern "C" __global__ void attn_dec_##E(const float* q, u16* kc, u16* vc, int n_ctx,     \
                                            int heads, int kv_heads, int hd, float scale,    \
                                            const u32* params, float* pa, float* pml,        \
                                            DecHeads dh) {                                   \
        attn_dec_impl<E>(q, kc, vc, n_ctx, heads, kv_heads, hd, scale, params, pa, pml, dh); \
    }
ATTN_SPLIT(1)
ATTN_SPLIT(2)
ATTN_SPLIT(3)
ATTN_SPLIT(4)
ATTN_SPLIT(5)
ATTN_SPLIT(6)
ATTN_SPLIT(7)
ATTN_SPLIT(8)

// grid (ntok * heads), block head_dim threads: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// With xq (head_dim a multiple of 32, ntok <= MAX_TOK), the rows are also written quantized
// as quant_act would write them (no norm), for the output projection that follows.
extern "C" __global__ void attn_combine(const float* part_acc, const float* part_ml, int n_ws,
                                        int head_dim, float* out, u8* xq, int ntok, int heads) {
    pdl_begin();
    const size_t th = blockIdx.x;
    const float* ml = part_ml + th * n_ws * 2;
    float m = -KINF;
    for (int s = 0; s < n_ws; s++) m = fmaxf(m, ml[2 * s]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < n_ws; s++) {
        const float ms = ml[2 * s];
        if (ms == -KINF) continue;
        const float w = expf(ms - m);
        den += w * ml[2 * s + 1];
        num += w * part_acc[(th * n_ws + s) * head_dim + threadIdx.x];
    }
    const float v = num / den;
    out[th * head_dim + threadIdx.x] = v;
    if (!xq) return;
    const int cols = heads * head_dim, nb = cols / 32;
    const int t = (int)th / heads, h = (int)th % heads;
    const int b = (h * head_dim + (int)threadIdx.x) / 32;
    i8* q = (i8*)xq + (size_t)t * cols;
    float* d = (float*)(xq + (size_t)ntok * cols) + (size_t)t * nb;
    short* sum = (short*)((float*)(xq + (size_t)ntok * cols) + (size_t)ntok * nb) +
                 (size_t)t * (cols / 16);
    // quant_block indexes by block within the token: shift the bases so b is that index.
    quant_block(v, b, threadIdx.x & 31, q, d, sum);
    if (h == 0 && threadIdx.x == 0) {
        float* inv = (float*)(sum + (size_t)(ntok - t) * (cols / 16));
        inv[t] = 1.0f;
    }
}

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

extern "C" __global__ void scale(float* x, float s, size_t n) {
    pdl_begin();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

// Rows t of (n, cols) f32 to f16 cache positions pos0 + t of each head plane:
// x row t is (heads, head_dim); cache (heads, n_ctx, head_dim).
extern "C" __global__ void kv_store(const float* x, u16* cache, int heads, int head_dim,
                                    int n_ctx, const u32* params) {
    pdl_begin();
    const int t = blockIdx.y, pos = (int)params[0] + t;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < heads * head_dim;
         i += gridDim.x * blockDim.x) {
        const int h = i / head_dim, e = i % head_dim;
        cache[((size_t)h * n_ctx + pos) * head_dim + e] = f2h(x[(size_t)t * heads * head_dim + i]);
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

// out[r] = the first index of the largest value of row r: blocks (grid.x) split a row
// (grid.y), each folds its part into one 64-bit key, max'ed atomically into best[r]
// (zeroed first): the value's order-preserving bits above ~index, so ties go to the first.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)b << 32) | (u32)(~(u32)i);
}

extern "C" __global__ void argmax(const float* x, int cols, unsigned long long* best) {
    pdl_begin();
    const float* xr = x + (size_t)blockIdx.y * cols;
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

// ---- Whisper: layer norm, GELU, attention without a cache ------------------------------

// The sum of v over the block (every thread gets it); red holds 32 floats.
__device__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        s = warp_sum(s);
        if (threadIdx.x == 0) red[0] = s;
    }
    __syncthreads();
    return red[0];
}

// out[r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta, one block per row: the mean, then
// the centred sum of squares (two passes, as the CPU backend).
extern "C" __global__ void layer_norm(const float* x, const float* gamma, const float* beta,
                                      float eps, int cols, float* out) {
    pdl_begin();
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    const float mean = block_sum(s, red) / (float)cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = xr[c] - mean;
        ss += d * d;
    }
    const float r = 1.0f / sqrtf(block_sum(ss, red) / (float)cols + eps);
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
    // The block's max (a max through block_sum's layout).
    mx = warp_max(mx);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : -KINF;
        s = warp_max(s);
        if (threadIdx.x == 0) red[0] = s;
    }
    __syncthreads();
    mx = red[0];
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
