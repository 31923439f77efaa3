// ---- decode attention on the tensor cores ---------------------------------------------
//
// attn_decm_<HD>_<G> and attn_decm_seqs_<HD>_<G>: attn_dec_<LPR>_<G>'s work (the same grid,
// each split's share of the keys, the heads' work, the partials for attn_combine) over an
// f16 cache of head size HD (64 or 128), with the scores and the weighted sums of values as
// mma.sync m16n8k16 products. A warp takes DECM_KEYS keys a step, its steps in turn with the
// block's other warps: their keys and values copied into the warp's own stages of shared
// memory by cp.async (DECM_ST stages, DECM_ST - 1 steps ahead), then the scores of the
// group's query heads against them, the online softmax and the weighted values. Rows 0..7 of
// the A fragments are the query heads' values rounded to f16 and rows 8..15 what that
// rounding left (likewise the probabilities), so a head's row plus its row + 8 is its f32
// product to about 22 bits, at no extra product: the tensor cores' 16 rows hold both. The
// new key and value, which the block stores after its first copies are under way, join as
// one more partial of the block, scored as attn_dec scores them.

// Warps of a block, stages of a warp, keys a step; blocks a multiprocessor (their shared
// memory: every warp's stages).
#define DECM_WARPS 8
#define DECM_BLOCKS 1
#define DECM_ST 3
#define DECM_KEYS 16

// Where 16-byte chunk `chunk` of key row `row` lies in a stage (f16 values): the chunks of a
// row swizzled by its low three bits, so the eight rows of a fragment load fall in distinct
// banks.
template <int HD>
__device__ __forceinline__ int decm_at(int row, int chunk) {
    return row * HD + ((chunk ^ (row & 7)) << 3);
}

// a and b rounded to f16 into hi, and what the rounding left into lo.
__device__ __forceinline__ void split_h2(float a, float b, u32& hi, u32& lo) {
    const u16 ha = f2h(a), hb = f2h(b);
    hi = (u32)ha | ((u32)hb << 16);
    lo = pack_h2(a - h2f(ha), b - h2f(hb));
}

template <int HD, int G, int W>
__device__ void attn_decm_part(const float* q, const u64* tbl, long long k_off,
                               long long v_off, int heads, int kv_heads, float scale, int len,
                               int window, int t, int n_split, float* part_acc, float* part_ml,
                               const DecHeads& dh) {
    constexpr int STAGE = DECM_KEYS * HD;  // f16 values of a stage's keys (and its values)
    extern __shared__ __align__(16) u16 dsm[];
    // The query heads' rows (normalised and rotated) and the new key after them, then the
    // heads' work's scratch.
    __shared__ float hsm[2 * (G + 1) * HD];
    __shared__ float wml[W + 1][G][2];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int kvh = blockIdx.x, split = blockIdx.y, ld_split = gridDim.y;
    const int g = heads / kv_heads;
    int k0, k1;
    if (!dec_split_keys(len, window, n_split, dh.one_split, split, ld_split, t, heads, kvh, g,
                        part_ml, k0, k1))
        return;
    // The rows older than the new one (earlier steps wrote them: attn_dec_part says why they
    // may be read before the wait), in steps of DECM_KEYS aligned to DECM_KEYS, so a step lies
    // in one cache block; keys of a step outside [k0, kend) are copied as zeros and masked.
    const int kend = min(k1, len - 1);
    const int kb0 = k0 & ~(DECM_KEYS - 1);
    const int steps = kend > k0 ? (kend - kb0 + DECM_KEYS - 1) / DECM_KEYS : 0;
    const int mine = steps > warp ? (steps - warp + W - 1) / W : 0;
    u16* stages = dsm + warp * DECM_ST * 2 * STAGE;
    // The cache blocks of the warp's steps, lane i holding step 32 c + i's while the warp
    // copies steps 32 c.. (read ahead of the copies, which then wait on no table read).
    auto blk_of = [&](int j0) {
        const int j = j0 + lane;
        return j < mine ? tbl[(kb0 + (warp + j * W) * DECM_KEYS) >> KV_BLOCK_LOG2] : 0ull;
    };
    u64 blks = blk_of(0);
    // The warp's step j into stage j % DECM_ST (a copy group, empty past its last step).
    auto issue = [&](int j) {
        if (j < mine) {
            if (j > 0 && (j & 31) == 0) blks = blk_of(j);
            const u64 blk = __shfl_sync(0xffffffffu, blks, j & 31);
            const int base = kb0 + (warp + j * W) * DECM_KEYS;
            u16* ks = stages + (j % DECM_ST) * 2 * STAGE;
            const u16* kr = kv_blk_row(blk, k_off, kvh, base, HD);
            const u16* vr = kv_blk_row(blk, v_off, kvh, base, HD);
#pragma unroll
            for (int x = lane; x < STAGE / 8; x += 32) {
                const int r = x / (HD / 8), ch = x % (HD / 8);
                const bool ok = base + r >= k0 && base + r < kend;
                const int o = ok ? r * HD + ch * 8 : 0;
                cp_async16(ks + decm_at<HD>(r, ch), kr + o, ok);
                cp_async16(ks + STAGE + decm_at<HD>(r, ch), vr + o, ok);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int j = 0; j < DECM_ST - 1; j++) issue(j);
    const int pos = len - 1;
    float sn[HD / 32], cs[HD / 32];
    heads_rot<HD / 32>(dh, pos, HD, sn, cs);
    const bool owner = k1 > k0 && k1 == len;
    NewRow nr;
    if (owner) nr = dec_new_row(tbl, k_off, v_off, kvh, pos, HD);
    pdl_wait();
    if (owner) dec_new_v(nr, dh.v + (size_t)kvh * HD, HD);
    heads_norm_rope_block<HD / 32, (G + W) / W>(q + (size_t)kvh * g * HD,
                                                dh.k + (size_t)kvh * HD, g, owner, HD, dh, sn,
                                                cs, hsm + (G + 1) * HD, hsm, G * HD, HD);
    if (owner) dec_store_f16(nr, HD, hsm + G * HD);
    // The queries as A fragments, one per 16 dimensions ({row gid, dims 2 tig..}, {row
    // gid + 8, ..}, {row gid, dims 2 tig + 8..}, {row gid + 8, ..}): row gid query head gid
    // scaled and rounded to f16, row gid + 8 the rest of it; rows of no head are zeros.
    u32 qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int d = kk * 16 + 2 * tig + 8 * h;
            const float a = gid < g ? hsm[gid * HD + d] * scale : 0.0f;
            const float b = gid < g ? hsm[gid * HD + d + 1] * scale : 0.0f;
            split_h2(a, b, qa[kk][2 * h], qa[kk][2 * h + 1]);
        }
    }
    // o[n]: dimensions 8 n + 2 tig (+1) of head gid's weighted values, its rounded
    // probabilities' ([0], [1]) and the rest's ([2], [3]); m and l: head gid's running max
    // and this lane's share of its sum.
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    float m = -KINF, l = 0.0f;
    for (int j = 0; j < mine; j++) {
        cp_async_wait<DECM_ST - 2>();
        __syncwarp();
        const u16* ks = stages + (j % DECM_ST) * 2 * STAGE;
        const u16* vs = ks + STAGE;
        const int base = kb0 + (warp + j * W) * DECM_KEYS;
        // Scores: s[n] keys base + 8 n + 2 tig (+1), row gid ([0], [1]) and gid + 8 ([2],
        // [3]). A fragment load takes two steps of 16 dimensions of 8 keys; the even and odd
        // steps go to sums of their own (two chains of products half as long), added last.
        float s[2][4], s2[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = s2[n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk += 2) {
                u32 b[4];
                ldmatrix_x4(b, ks + decm_at<HD>(n * 8 + (lane & 7), 2 * kk + (lane >> 3)));
                mma16816(s[n], qa[kk], b[0], b[1]);
                mma16816(s2[n], qa[kk + 1], b[2], b[3]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] += s2[n][e];
        }
        // The online softmax over the step (a head's keys are spread over the four lanes
        // of its group).
        float p[2][2], mx = -KINF;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = base + 8 * n + 2 * tig + e;
                const bool vis = gid < g && key >= k0 && key < kend;
                p[n][e] = vis ? s[n][e] + s[n][2 + e] : -KINF;
                mx = fmaxf(mx, p[n][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx);
        const float corr = mn == -KINF ? 1.0f : expf(m - mn);
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                p[n][e] = p[n][e] == -KINF ? 0.0f : expf(p[n][e] - mn);
                sum += p[n][e];
            }
        m = mn;
        l = l * corr + sum;
        if (corr != 1.0f) {
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[n][e] *= corr;
        }
        // The probabilities as an A fragment (keys 0..7 then 8..15 of the step), then the
        // values two dimension tiles a load (lane l gives key 8 ((l / 8) % 2) + l % 8,
        // dimensions 8 (n + l / 16)..).
        u32 pa[4];
        split_h2(p[0][0], p[0][1], pa[0], pa[1]);
        split_h2(p[1][0], p[1][1], pa[2], pa[3]);
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
            u32 b[4];
            ldmatrix_x4_trans(b, vs + decm_at<HD>(8 * ((lane >> 3) & 1) + (lane & 7),
                                                  n + (lane >> 4)));
            mma16816(o[n], pa, b[0], b[1]);
            mma16816(o[n + 1], pa, b[2], b[3]);
        }
        __syncwarp();
        issue(j + DECM_ST - 1);
    }
    cp_async_wait<0>();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // Every warp is past its stages: they hold the partials now, the warps' and, at W, the
    // new row's.
    __syncthreads();
    float* pacc = (float*)dsm;
    if (gid < g) {
        float* row = pacc + (warp * G + gid) * HD + 2 * tig;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2*)(row + 8 * n) = make_float2(o[n][0] + o[n][2], o[n][1] + o[n][3]);
        if (tig == 0) {
            wml[warp][gid][0] = m;
            wml[warp][gid][1] = l;
        }
    }
    for (int i = warp; i < g; i += W) {
        float sc = 0.0f;
        if (owner)
            for (int d = lane; d < HD; d += 32)
                sc += hsm[i * HD + d] * scale * h2f(f2h(hsm[G * HD + d]));
        sc = warp_sum(sc);
        if (lane == 0) {
            wml[W][i][0] = owner ? sc : -KINF;
            wml[W][i][1] = 1.0f;
        }
        if (owner)
            for (int d = lane; d < HD; d += 32)
                pacc[(W * G + i) * HD + d] = h2f(f2h(dh.v[(size_t)kvh * HD + d]));
    }
    __syncthreads();
    dec_merge<W + 1, G>(pacc, wml, HD, g, HD, t, heads, kvh, split, ld_split, part_acc,
                        part_ml, dh);
}

// Dynamic shared memory of a block (attention.rs decm_smem): every warp's stages.
#define DECM_SMEM(HD) (DECM_WARPS * DECM_ST * 2 * DECM_KEYS * (HD) * 2)
// Entry points as attn_dec_<LPR>_<G> and attn_dec_seqs_<LPR>_<G> (the same arguments), by
// head size and G; DECM_BLOCKS blocks a multiprocessor.
#define ATTN_DECM(HD, G)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DECM_WARPS, DECM_BLOCKS)               \
        attn_decm_##HD##_##G(const float* q, const u64* tbl, long long k_off, long long v_off, \
                             int heads, int kv_heads, int hd, float scale, const u32* params,  \
                             float* pa, float* pml, int window, DecHeads dh) {                 \
        attn_decm_part<HD, G, DECM_WARPS>(q, tbl, k_off, v_off, heads, kv_heads, scale,      \
                                          (int)params[0] + (int)blockIdx.z + 1, window,     \
                                          blockIdx.z, gridDim.y, pa, pml, dh);              \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * DECM_WARPS, DECM_BLOCKS)               \
        attn_decm_seqs_##HD##_##G(const float* q, const SeqDesc* seqs, int layer, int heads, \
                                  int kv_heads, int hd, float scale, float* pa, float* pml,  \
                                  DecHeads dh) {                                             \
        const int z = blockIdx.z;                                                            \
        const SeqDesc sd = seqs[z];                                                          \
        const long long pl = (long long)kv_heads * KV_BLOCK * HD;                            \
        const long long k_off = (long long)layer * 2 * pl;                                   \
        DecHeads d = dh;                                                                     \
        d.k += (size_t)z * kv_heads * HD;                                                    \
        d.v += (size_t)z * kv_heads * HD;                                                    \
        attn_decm_part<HD, G, DECM_WARPS>(q + (size_t)z * heads * HD, sd.tbl, k_off,        \
                                          k_off + pl, heads, kv_heads, scale, sd.len,       \
                                          sd.window, z, sd.splits, pa, pml, d);             \
    }
#define ATTN_DECM_G(HD) ATTN_DECM(HD, 1) ATTN_DECM(HD, 2) ATTN_DECM(HD, 4) ATTN_DECM(HD, 8)
ATTN_DECM_G(64)
ATTN_DECM_G(128)
