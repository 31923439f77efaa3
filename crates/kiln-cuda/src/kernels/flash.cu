// ---- prompt attention on the tensor cores, one pass over the cache ------------------------
//
// A prompt's attention as FlashAttention computes it: a block takes FA_ROWS query rows (the
// g query heads of one KV head for FA_ROWS / g consecutive tokens), walks the keys the last
// of them sees a cache block (KV_BLOCK positions) at a time, and keeps each row's running
// maximum, denominator and weighted sum of values in registers; neither the scores nor the
// probabilities go to memory, and the keys and values are read where the paged cache holds
// them (no gather). Scores and weighted sums are mma.sync m16n8k16 products of f16 values
// with f32 sums (queries times 1 / sqrt(head_dim) in f16, probabilities in f16: the
// roundings of the cuBLAS path, attention_gemm). A warp owns 16 rows.

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)
// Row padding (f16 values) of the shared key and transposed value tiles: rows 16 bytes
// apart modulo 128, so a warp's fragment loads fall in distinct banks.
#define FA_PAD 8

// The tensor-core kernels (this file's and gemm.cu's) need sm_80: below it the instructions
// they use (mma.sync m16n8k16, cp.async) do not assemble, so there the helpers below trap,
// and the host never launches those kernels (attention.rs, products.rs check the
// architecture); the rest of the module still builds for sm_70 and sm_75.
#if __CUDA_ARCH__ >= 800
#define TC_ASM(...) asm volatile(__VA_ARGS__)
#else
#define TC_ASM(...) __trap()
#endif

// d = a b + d: a 16x16 f16 fragment (row-major), b 16x8 (column-major), d 16x8 f32.
__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
    TC_ASM("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
           "{%8,%9}, {%0,%1,%2,%3};"
           : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

__device__ __forceinline__ void cp_async16(u16* smem, const u16* g, bool ok) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    // src-size 0: the 16 bytes are zeros (nothing is read).
    TC_ASM("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(g), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { TC_ASM("cp.async.commit_group;"); }

// Waits until at most N of this thread's copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    TC_ASM("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32* r, const u16* smem) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    TC_ASM("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
           : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
           : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, const u16* smem) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    TC_ASM("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
           : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
           : "r"(s));
}

// grid (ceil(ntok / (FA_ROWS / g)), kv_heads, splits), FA_WARPS warps. Row r of a block is
// token t0 + r / g, query head kvh * g + r % g; a token at position pos0 + t sees the keys
// [lo, pos0 + t] (lo = pos0 + t + 1 - window, at least 0, with a window; else 0). out is
// (ntok, heads, HD) f32, q the same (normalised and rotated already).
//
// V2 (attn_flash2_<HD>, KILN_CUDA_FLASH_PROMPT=2 while it is measured): the values stay rows
// in shared memory (ldmatrix .trans gives the products their columns; the first form writes
// them transposed, value by value), and the block's cache blocks are split over the grid's z
// (splits): with more than one, each row's unnormalised sum and its (max, denominator) go to
// part_acc / part_ml at [t * heads + h][split] for attn_combine, so that a prompt of few
// query blocks over a long cache still fills the multiprocessors.
template <int HD, bool V2>
__device__ void attn_flash_impl(const float* q, const u64* tbl, long long k_off,
                                long long v_off, int heads, int kv_heads, float scale,
                                int pos0, int ntok, int window, float* out, float* part_acc,
                                float* part_ml, int q8) {
    __shared__ __align__(16) u16 ks[KV_BLOCK][HD + FA_PAD];
    // V2: rows of values (key, dim); else transposed (dim, key).
    __shared__ __align__(16) u16 vt[V2 ? KV_BLOCK : HD][(V2 ? HD : KV_BLOCK) + FA_PAD];
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int g = heads / kv_heads, kvh = blockIdx.y;
    const int bt = FA_ROWS / g;  // tokens a block
    const int t0 = blockIdx.x * bt;
    // This thread's two rows (gid and gid + 8 of its warp's 16): token, head, position,
    // first visible key; a row past the block's tokens takes no key.
    int tok[2], head[2], pos[2], lo[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + gid + 8 * i;
        tok[i] = t0 + r / g;
        head[i] = kvh * g + r % g;
        const bool ok = r < bt * g && tok[i] < ntok;
        pos[i] = ok ? pos0 + tok[i] : -1;
        lo[i] = window > 0 ? max(0, pos0 + tok[i] + 1 - window) : 0;
        if (!ok) tok[i] = -1;
    }
    // The block's keys: from the first token's first visible one to its last token's
    // position, whole cache blocks.
    const int last = pos0 + min(ntok, t0 + bt) - 1;
    const int first = window > 0 ? max(0, pos0 + t0 + 1 - window) : 0;
    // Queries as A fragments, one per 16 dimensions: {row gid, dims 2 tig..}, {row gid + 8,
    // ..}, {row gid, dims 2 tig + 8..}, {row gid + 8, ..}, scaled and rounded to f16.
    u32 qa[HD / 16][4];
#pragma unroll
    for (int ks16 = 0; ks16 < HD / 16; ks16++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = j & 1, d = ks16 * 16 + 2 * tig + 8 * (j >> 1);
            float a = 0.0f, b = 0.0f;
            if (tok[i] >= 0) {
                const float* qr = q + ((size_t)tok[i] * heads + head[i]) * HD + d;
                a = qr[0] * scale;
                b = qr[1] * scale;
            }
            qa[ks16][j] = pack_h2(a, b);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) o[n][j] = 0.0f;
    float m[2] = {-KINF, -KINF}, l[2] = {0.0f, 0.0f};
    // The cache blocks from first's to last's; V2: this split's share of them.
    const int blk0 = first >> KV_BLOCK_LOG2, nblk = (last >> KV_BLOCK_LOG2) - blk0 + 1;
    const int per = (nblk + gridDim.z - 1) / gridDim.z;
    const int kb_lo = V2 ? (blk0 + (int)blockIdx.z * per) << KV_BLOCK_LOG2
                         : first & ~(KV_BLOCK - 1);
    const int kb_hi = V2 ? min(blk0 + ((int)blockIdx.z + 1) * per, blk0 + nblk) << KV_BLOCK_LOG2
                         : last + 1;
    for (int kb = kb_lo; kb < kb_hi; kb += KV_BLOCK) {
        // The cache block's keys (rows of ks) and values (columns of vt), 16 bytes a load.
        __syncthreads();
        const u16* kblk = kv_row(tbl, k_off, kvh, kb, HD);
        const u16* vblk = kv_row(tbl, v_off, kvh, kb, HD);
        for (int x = threadIdx.x; x < KV_BLOCK * HD / 8; x += 32 * FA_WARPS) {
            const int key = x / (HD / 8), d = (x % (HD / 8)) * 8;
            uint4 v;
            if (q8) {
                // A q8_0 cache's values as f16 (the tensor cores' type).
                float f[8];
                kv_load8(tbl, k_off, kvh, kb + key, HD, d, 1, f);
                *(uint4*)&ks[key][d] = f8_h8(f);
                kv_load8(tbl, v_off, kvh, kb + key, HD, d, 1, f);
                v = f8_h8(f);
            } else {
                *(uint4*)&ks[key][d] = __ldg((const uint4*)(kblk + (size_t)key * HD + d));
                v = __ldg((const uint4*)(vblk + (size_t)key * HD + d));
            }
            if (V2) {
                *(uint4*)&vt[key][d] = v;
                continue;
            }
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                vt[d + 2 * e][key] = (u16)(w[e] & 0xffff);
                vt[d + 2 * e + 1][key] = (u16)(w[e] >> 16);
            }
        }
        __syncthreads();
        // Scores of the warp's 16 rows against the block's 64 keys: s[n] holds keys
        // kb + 8 n + 2 tig (+1) of rows gid ([0], [1]) and gid + 8 ([2], [3]).
        float s[KV_BLOCK / 8][4];
#pragma unroll
        for (int n = 0; n < KV_BLOCK / 8; n++) {
#pragma unroll
            for (int j = 0; j < 4; j++) s[n][j] = 0.0f;
            const u16* kr = &ks[n * 8 + gid][2 * tig];
#pragma unroll
            for (int ks16 = 0; ks16 < HD / 16; ks16++)
                mma16816(s[n], qa[ks16], *(const u32*)(kr + ks16 * 16),
                         *(const u32*)(kr + ks16 * 16 + 8));
        }
        // The online softmax over the block, per row (a row's values are spread over the
        // four lanes of its group).
        float p_corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = -KINF;
#pragma unroll
            for (int n = 0; n < KV_BLOCK / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + n * 8 + 2 * tig + e;
                    const bool vis = key >= lo[i] && key <= pos[i];
                    float& v = s[n][2 * i + e];
                    v = vis ? v : -KINF;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[i], mx);
            // No key seen yet (mn = -inf): nothing to scale, every weight 0.
            const float corr = mn == -KINF ? 1.0f : expf(m[i] - mn);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < KV_BLOCK / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float& v = s[n][2 * i + e];
                    v = v == -KINF ? 0.0f : expf(v - mn);
                    sum += v;
                }
            m[i] = mn;
            l[i] = l[i] * corr + sum;
            p_corr[i] = corr;
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= p_corr[0];
            o[n][1] *= p_corr[0];
            o[n][2] *= p_corr[1];
            o[n][3] *= p_corr[1];
        }
        // The probabilities as A fragments (keys 16 kk..): the score tiles 2 kk and 2 kk + 1.
#pragma unroll
        for (int kk = 0; kk < KV_BLOCK / 16; kk++) {
            const u32 pa[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]),
                               pack_h2(s[2 * kk][2], s[2 * kk][3]),
                               pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            if (V2) {
                // Two dimension tiles a load: lane l gives key kk 16 + 8 ((l / 8) % 2) + l % 8,
                // dimensions 8 (n + l / 16).. (registers: tile n keys-low, keys-high, n + 1 ..).
#pragma unroll
                for (int n = 0; n < HD / 8; n += 2) {
                    u32 b[4];
                    ldmatrix_x4_trans(b, &vt[kk * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)]
                                            [8 * (n + (lane >> 4))]);
                    mma16816(o[n], pa, b[0], b[1]);
                    mma16816(o[n + 1], pa, b[2], b[3]);
                }
                continue;
            }
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                const u16* vr = &vt[n * 8 + gid][kk * 16 + 2 * tig];
                mma16816(o[n], pa, *(const u32*)vr, *(const u32*)(vr + 8));
            }
        }
    }
    // Each row's denominator over its group's four lanes, then the rows out.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        if (tok[i] < 0) continue;
        if (V2 && gridDim.z > 1) {
            const size_t slot = ((size_t)tok[i] * heads + head[i]) * gridDim.z + blockIdx.z;
            float* prow = part_acc + slot * HD + 2 * tig;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                *(float2*)(prow + n * 8) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
            if (tig == 0) {
                part_ml[2 * slot] = m[i];
                part_ml[2 * slot + 1] = l[i];
            }
            continue;
        }
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float* orow = out + ((size_t)tok[i] * heads + head[i]) * HD + 2 * tig;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2*)(orow + n * 8) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}

// attn_flash_<HD>: head sizes 64 and 128 (attention.rs falls back to attention_gemm for the
// others); attn_flash2_<HD>: the V2 form.
#define ATTN_FLASH(HD)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * FA_WARPS)                              \
        attn_flash_##HD(const float* q, const u64* tbl, long long k_off, long long v_off,    \
                        int heads, int kv_heads, float scale, const u32* params, int ntok,   \
                        int window, float* out, int q8) {                                    \
        attn_flash_impl<HD, false>(q, tbl, k_off, v_off, heads, kv_heads, scale,             \
                                   (int)params[0], ntok, window, out, nullptr, nullptr, q8); \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * FA_WARPS)                              \
        attn_flash2_##HD(const float* q, const u64* tbl, long long k_off, long long v_off,   \
                         int heads, int kv_heads, float scale, const u32* params, int ntok,  \
                         int window, float* out, float* part_acc, float* part_ml, int q8) {  \
        attn_flash_impl<HD, true>(q, tbl, k_off, v_off, heads, kv_heads, scale,              \
                                  (int)params[0], ntok, window, out, part_acc, part_ml, q8); \
    }
ATTN_FLASH(64)
ATTN_FLASH(128)
