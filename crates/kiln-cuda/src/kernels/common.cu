// kiln's CUDA kernels, compiled at run time with NVRTC as one source: device.rs joins
// src/kernels/*.cu in order (this file's definitions first; then products, rows,
// attention, flash, gemm, elementwise, speech, signal). No headers: f16 conversions and the
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
// out = gelu_tanh(W0 x) * (W1 x) (GeGLU): MODE_GATE_UP's products, the other activation.
#define MODE_GATE_UP_GELU 3

#define MAX_TOK 4
#define DEC_TILE 8
// Warps a row of a one-token decode product at most (products.rs DEC_KW_MAX).
#define DEC_KW_MAX 2
#define WARPS 8
#define QV 12
#define Q6K_REC 20
#define KINF __int_as_float(0x7f800000)

// ---- the paged KV cache ------------------------------------------------------------------
// A sequence's keys and values live in blocks of KV_BLOCK positions that the host hands out
// as the sequence grows (lib.rs CudaKvCache); its block table holds each block's address, the
// block of position p at entry p / KV_BLOCK. A block is laid out (layer, K then V, kv head,
// KV_BLOCK positions, head_dim) in f16; `off` is the element offset of one layer's K or V
// planes within a block, so row (h, p) of them is at
//   tbl[p / KV_BLOCK] + off + (h * KV_BLOCK + p % KV_BLOCK) * head_dim.
#define KV_BLOCK_LOG2 6
#define KV_BLOCK (1 << KV_BLOCK_LOG2)

typedef unsigned long long u64;

// Row (h, p) within its block, whose address is blk.
__device__ __forceinline__ u16* kv_blk_row(u64 blk, long long off, int h, int p, int hd) {
    return (u16*)blk + off + ((size_t)h * KV_BLOCK + (p & (KV_BLOCK - 1))) * hd;
}
__device__ __forceinline__ u16* kv_row(const u64* tbl, long long off, int h, int p, int hd) {
    return kv_blk_row(tbl[p >> KV_BLOCK_LOG2], off, h, p, hd);
}

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

// ---- the q8_0 KV cache -------------------------------------------------------------------
// A q8_0 cache's block holds, for each (layer, K or V, kv head), its KV_BLOCK rows of head_dim
// int8 values and then their scales (head_dim / 32 f16 a row, the 32-value blocks of
// GGML's Q8_0): KVQ_HEAD(hd) bytes a head, `off` the byte offset of a layer's K or V planes.
// A row quantized as the CPU's Q8_0 KV cache does it: d = max|x| / 127 (stored f16),
// q = round(x / d), halves away from zero.
#define KVQ_HEAD(hd) ((long long)KV_BLOCK * (hd) * 17 / 16)

__device__ __forceinline__ i8* kvq_row(const u64* tbl, long long off, int h, int p, int hd) {
    i8* blk = (i8*)tbl[p >> KV_BLOCK_LOG2];
    return blk + off + h * KVQ_HEAD(hd) + (long long)(p & (KV_BLOCK - 1)) * hd;
}
// The scale of the 32-value block holding dimension d of row (h, p).
__device__ __forceinline__ u16* kvq_scale(const u64* tbl, long long off, int h, int p, int hd,
                                          int d) {
    i8* blk = (i8*)tbl[p >> KV_BLOCK_LOG2];
    return (u16*)(blk + off + h * KVQ_HEAD(hd) + (long long)KV_BLOCK * hd) +
           (p & (KV_BLOCK - 1)) * (hd / 32) + d / 32;
}
// Dimension d of row (h, p), the warp's 32 lanes one 32-value block (d = 32 b + lane; every
// lane of the warp calls it): its lane's value quantized, the block's scale by lane 0.
// The value and (lane 0) the scale also into *qo and *so where not null.
__device__ __forceinline__ void kvq_store(const u64* tbl, long long off, int h, int p, int hd,
                                          int d, float x, i8* qo, u16* so) {
    const float amax = warp_max(fabsf(x));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    const i8 q = (i8)(int)roundf(x * id);
    kvq_row(tbl, off, h, p, hd)[d] = q;
    const u16 dh = f2h(dd);
    if (qo) *qo = q;
    if ((threadIdx.x & 31) == 0) {
        *kvq_scale(tbl, off, h, p, hd, d) = dh;
        if (so) *so = dh;
    }
}
// Eight f32 values to f16 (one 16-byte store).
__device__ __forceinline__ uint4 f8_h8(const float* f) {
    u32 w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = (u32)f2h(f[2 * j]) | ((u32)f2h(f[2 * j + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}
// Eight int8 values (w.x, w.y, low byte first) times their scale s to f32.
__device__ __forceinline__ void q8x8(uint2 w, float s, float* f) {
    const u32 x[2] = {w.x, w.y};
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = (float)(i8)((x[j / 4] >> (8 * (j % 4))) & 0xff) * s;
}
// Eight values of row (h, p) from dimension d (a multiple of 8) of a cache of either type.
__device__ __forceinline__ void kv_load8(const u64* tbl, long long off, int h, int p, int hd,
                                         int d, int q8, float* f) {
    if (q8)
        return q8x8(__ldg((const uint2*)(kvq_row(tbl, off, h, p, hd) + d)),
                    h2f(__ldg(kvq_scale(tbl, off, h, p, hd, d))), f);
    const uint4 v = __ldg((const uint4*)(kv_row(tbl, off, h, p, hd) + d));
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = h2f((u16)(w[j] & 0xffff));
        f[2 * j + 1] = h2f((u16)(w[j] >> 16));
    }
}

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

// The max of v over the block (every thread gets it); red holds 32 floats.
__device__ float block_max(float v, float* red) {
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : -KINF;
        s = warp_max(s);
        if (threadIdx.x == 0) red[0] = s;
    }
    __syncthreads();
    return red[0];
}

// The mean of row r (cols values) and 1 / sqrt(var + eps) (biased variance: the mean, then
// the centred sum of squares, two passes as the CPU backend), by the whole block; red holds
// 32 floats.
__device__ __forceinline__ void row_moments(const float* r, int cols, float eps, float* red,
                                            float* mean, float* inv) {
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += r[c];
    const float m = block_sum(s, red) / (float)cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = r[c] - m;
        ss += d * d;
    }
    *mean = m;
    *inv = 1.0f / sqrtf(block_sum(ss, red) / (float)cols + eps);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// The gated product's activation of a gate/up mode.
__device__ __forceinline__ bool is_gate_up(int mode) { return mode >= MODE_GATE_UP; }
__device__ __forceinline__ float gate_act(int mode, float x) {
    return mode == MODE_GATE_UP_GELU
               ? 0.5f * x * (1.0f + tanhf(0.7978846f * (x + 0.044715f * x * x * x)))
               : silu(x);
}

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


