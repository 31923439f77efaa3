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
// Keys a decode split takes at least (attention.rs ATT_SPLIT_KEYS): a sequence uses
// ceil(len / ATT_SPLIT_KEYS) of its splits, at most all of them.
#define ATT_SPLIT_KEYS 16
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
// each warp writes its softmax partial (max, sum, weighted V) for attn_combine. With a
// sliding window (window > 0) a token sees its last `window` positions only.
template <int EPL>
__device__ void attn_split_impl(const float* q, const u16* kc, const u16* vc, int n_ctx,
                                int heads, int kv_heads, int hd, float scale,
                                const u32* params, float* part_acc, float* part_ml,
                                int window) {
    __shared__ float qs[MAX_GROUP * EPL * 32];
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x, t = blockIdx.z;
    const int ws = blockIdx.y * ATT_WARPS + warp, n_ws = gridDim.y * ATT_WARPS;
    const int g = heads / kv_heads;
    const int len = (int)params[0] + t + 1;
    const int lo = window > 0 ? max(0, len - window) : 0;
    const int k0 = max(lo, ws * ATT_WCHUNK), k1 = min(len, ws * ATT_WCHUNK + ATT_WCHUNK);
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

// Rows base + j of the f16 cache at p for j = j0, j0 + ATT_WARPS, ... (ATT_KU of them, those
// below nk), as load_row_h reads them: all their loads in flight at once.
template <int EPL>
__device__ __forceinline__ void load_tile_rows(const u16* p, int base, int j0, int nk, int hd,
                                               int lane, float (*out)[EPL]) {
#pragma unroll
    for (int u = 0; u < ATT_KU; u++) {
        const int j = j0 + u * ATT_WARPS;
        if (j < nk) load_row_h<EPL, false>(p + (size_t)(base + j) * hd, lane, hd, out[u]);
    }
}

// load_tile_rows, except that on a split's first pass (first) the rows below n_pre come from
// pre, which holds them already (loaded before the kernel's dependency wait).
template <int EPL>
__device__ __forceinline__ void tile_rows_or_pre(const u16* p, int base, int j0, int nk, int hd,
                                                 int lane, float (*out)[EPL], bool first,
                                                 int n_pre, const float (*pre)[EPL]) {
#pragma unroll
    for (int u = 0; u < ATT_KU; u++) {
        const int j = j0 + u * ATT_WARPS;
        if (j >= nk) continue;
        if (first && j < n_pre) {
#pragma unroll
            for (int e = 0; e < EPL; e++) out[u][e] = pre[u][e];
        } else {
            load_row_h<EPL, false>(p + (size_t)(base + j) * hd, lane, hd, out[u]);
        }
    }
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
                              int kv_heads, int hd, float scale, int len, int window, int t,
                              int n_split, float* part_acc, float* part_ml,
                              const DecHeads& dh) {
    __shared__ float sc[MAX_GROUP][ATT_TILE];
    __shared__ float mls[MAX_GROUP][3];  // running max, running sum, this tile's correction
    __shared__ float red[ATT_WARPS - 1][MAX_GROUP * EPL * 32];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // This sequence's keys go to its first n_split splits (the grid may hold more for
    // other sequences: those write an empty partial, which attn_combine skips); partials
    // are laid out by the grid's splits.
    const int kvh = blockIdx.x, split = blockIdx.y, ld_split = gridDim.y;
    const int g = heads / kv_heads;
    // Splits of ATT_SPLIT_KEYS keys or more while the cache is short (a grid made for a
    // full cache, replayed at every position): the same count for a length and cache
    // size whatever else the launch holds.
    // A sliding window (window > 0): the keys lo..len only.
    const int lo = window > 0 ? max(0, len - window) : 0;
    n_split = min(n_split, max(1, (len - lo + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS));
    if (split >= n_split) {
        pdl_wait();
        if (threadIdx.x < g)
            part_ml[2 * (((size_t)t * heads + kvh * g + threadIdx.x) * ld_split + split)] = -KINF;
        return;
    }
    // Read before the wait (under PDL a kernel's start may overlap several kernels before
    // it, not only the last): `len`, which the caller read from what a copy put on the
    // device before the step's attention (a copy waits for every kernel before it and every
    // later kernel waits for the copy), and a warp's first keys and values of this split
    // (ATT_KU rows each) older than the new one, which earlier steps or prompt chunks wrote:
    // a copy precedes them, and the host reads each step's tokens before launching the next.
    const int c = (len - lo + n_split - 1) / n_split;
    const int k0 = lo + split * c, k1 = min(len, k0 + c);
    const u16* kp = kc + (size_t)kvh * n_ctx * hd;
    const u16* vp = vc + (size_t)kvh * n_ctx * hd;
    float kpre[ATT_KU][EPL], vpre[ATT_KU][EPL];
    const int n_pre = min(min(ATT_TILE, k1 - k0), len - 1 - k0);
    load_tile_rows<EPL>(kp, k0, warp, n_pre, hd, lane, kpre);
    load_tile_rows<EPL>(vp, k0, warp, n_pre, hd, lane, vpre);
    pdl_wait();
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
    for (int base = k0; base < k1; base += ATT_TILE) {
        const int nk = min(ATT_TILE, k1 - base);
        for (int j0 = warp; j0 < nk; j0 += ATT_KU * ATT_WARPS) {
            float kf[ATT_KU][EPL];
            tile_rows_or_pre<EPL>(kp, base, j0, nk, hd, lane, kf, base == k0 && j0 == warp,
                                  n_pre, kpre);
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
            tile_rows_or_pre<EPL>(vp, base, j0, nk, hd, lane, vf, base == k0 && j0 == warp,
                                  n_pre, vpre);
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
        const size_t slot = ((size_t)t * heads + kvh * g + i) * ld_split + split;
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

// One sequence of a batched decode step (attn_dec_seqs_<EPL>): its cache (the f16 planes
// of layer 0; a layer's start is layer * kv_heads * n_ctx * hd further), the keys its
// token sees (its position + 1, the last `window` of them where window > 0) and its splits.
struct SeqDesc {
    u16* k;
    u16* v;
    int len;
    int n_ctx;
    int splits;  // as attn_dec_<EPL>'s grid for this sequence alone, so the same sums
    int window;
};

// One entry point per EPL (head_dim / 32, rounded up): lib.rs picks attn_split_<EPL>, or
// for one token with its heads' work fused, attn_dec_<EPL> (grid (kv_heads, splits)), or for
// one token of each of several sequences attn_dec_seqs_<EPL> (grid (kv_heads, splits,
// sequences); sequence z's rows of q, k, v and out are row z).
#define ATTN_SPLIT(E)                                                                        \
    extern "C" __global__ void attn_split_##E(const float* q, const u16* kc, const u16* vc,  \
                                              int n_ctx, int heads, int kv_heads, int hd,    \
                                              float scale, const u32* params, float* pa,     \
                                              float* pml, int window) {                      \
        attn_split_impl<E>(q, kc, vc, n_ctx, heads, kv_heads, hd, scale, params, pa, pml,    \
                           window);                                                          \
    }                                                                                        \
    extern "C" __global__ void attn_dec_##E(const float* q, u16* kc, u16* vc, int n_ctx,     \
                                            int heads, int kv_heads, int hd, float scale,    \
                                            const u32* params, float* pa, float* pml,        \
                                            int window, DecHeads dh) {                       \
        attn_dec_impl<E>(q, kc, vc, n_ctx, heads, kv_heads, hd, scale,                      \
                         (int)params[0] + (int)blockIdx.z + 1, window, blockIdx.z,           \
                         gridDim.y, pa, pml, dh);                                            \
    }                                                                                        \
    extern "C" __global__ void attn_dec_seqs_##E(const float* q, const SeqDesc* seqs,        \
                                                 int layer, int heads, int kv_heads, int hd, \
                                                 float scale, float* pa, float* pml,         \
                                                 DecHeads dh) {                              \
        const int z = blockIdx.z;                                                            \
        const SeqDesc sd = seqs[z];                                                          \
        const size_t plane = (size_t)layer * kv_heads * sd.n_ctx * hd;                       \
        DecHeads d = dh;                                                                     \
        d.k += (size_t)z * kv_heads * hd;                                                    \
        d.v += (size_t)z * kv_heads * hd;                                                    \
        attn_dec_impl<E>(q + (size_t)z * heads * hd, sd.k + plane, sd.v + plane, sd.n_ctx,   \
                         heads, kv_heads, hd, scale, sd.len, sd.window, z, sd.splits, pa,    \
                         pml, d);                                                            \
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
        float* inv = (float*)(xq + xq_inv_offset(cols, ntok));
        inv[t] = 1.0f;
    }
}


// ---- prompt attention as two tensor-core products (cuBLAS) --------------------------------
// Scores = q k^T per KV head (its query heads' rows together), causal softmax into f16
// probabilities, out = p v per query head: the products are cuBLAS's, these two kernels the
// steps between.

// Queries of nc tokens, (nc, heads, hd) f32, to (heads, nc, hd) f16 times scale: a KV head's
// query heads are then consecutive rows of one score product's left operand.
extern "C" __global__ void attn_q16(const float* q, int heads, int hd, int nc, float scale,
                                    u16* out) {
    pdl_begin();
    const size_t n = (size_t)nc * heads * hd;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % hd), h = (int)(i / hd % heads), t = (int)(i / hd / heads);
        out[((size_t)h * nc + t) * hd + d] = f2h(q[i] * scale);
    }
}

// grid (nc, heads): row (h, t) of the scores (heads, nc, ld) f32 over len keys, softmax over
// the keys 0..=pos0 + t the query at position pos0 + t sees (the last `window` of them
// where window > 0), into the probabilities (heads, nc, ld) f16, zero for the other keys.
extern "C" __global__ void attn_softmax_causal(const float* s, int len, int ld, int pos0, int nc,
                                               u16* p, int window) {
    pdl_begin();
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t row = ((size_t)h * nc + t) * ld;
    const float* sr = s + row;
    u16* pr = p + row;
    const int seen = min(len, pos0 + t + 1);
    const int lo = window > 0 ? max(0, pos0 + t + 1 - window) : 0;
    float mx = -KINF;
    for (int j = lo + threadIdx.x; j < seen; j += blockDim.x) mx = fmaxf(mx, sr[j]);
    mx = block_max(mx, red);
    float l = 0.0f;
    for (int j = lo + threadIdx.x; j < seen; j += blockDim.x) l += expf(sr[j] - mx);
    const float inv = 1.0f / block_sum(l, red);
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        pr[j] = f2h(j >= lo && j < seen ? expf(sr[j] - mx) * inv : 0.0f);
}
