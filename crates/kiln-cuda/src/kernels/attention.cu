// ---- per-head work: q/k RMSNorm, RoPE, KV-cache store ----------------------------------

struct HeadGroup {
    float* x;             // (ntok, heads * head_dim), rewritten in place
    const float* norm_w;  // per-head RMSNorm weights (head_dim) or null
    const u64* tbl;       // the cache's block table (common.cu kv_row), or null
    long long off;        // this layer's K or V planes in a block
    int heads;
    int rope;             // 1: rotate
    int q8;               // 1: a q8_0 cache (common.cu kvq_row), else f16
    int pad;
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
                                 int rope_dims, int neox, const u32* params) {
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
    u16* cr = g.tbl && !g.q8 ? kv_row(g.tbl, g.off, h, pos, head_dim) : nullptr;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        if (e >= head_dim) break;
        xr[e] = out[i];
        if (cr) cr[e] = f2h(out[i]);
    }
    // (A q8_0 cache's head size is a multiple of 32: every lane takes each block.)
    if (g.tbl && g.q8)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (32 * i >= head_dim) break;
            kvq_store(g.tbl, g.off, h, pos, head_dim, lane + 32 * i, out[i], nullptr, nullptr);
        }
}

// ---- attention over the f16 cache: split over keys, then combined ----------------------

#define ATT_WARPS 4
#define ATT_WCHUNK 32
#define MAX_GROUP 8

// grid (kv_heads, splits, ntok); each warp of a block owns ATT_WCHUNK consecutive keys and
// every query head of its kv head. A lane scores one key against the query heads (q from
// shared memory, the key row by 16-byte loads), the warp takes one softmax step per 32 keys,
// then accumulates V rows (lanes split head_dim) weighted by the broadcast probabilities;
// each warp writes its softmax partial (max, sum, weighted V) for attn_combine. With a
// sliding window (window > 0) a token sees its last `window` positions only.
template <int EPL>
__device__ void attn_split_impl(const float* q, const u64* tbl, long long k_off,
                                long long v_off, int heads, int kv_heads, int hd, float scale,
                                const u32* params, float* part_acc, float* part_ml,
                                int window, int q8) {
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
    for (int base = k0; base < k1; base += 32) {
        const int p = base + lane;
        const bool valid = p < k1;
        float sc[MAX_GROUP];
#pragma unroll
        for (int i = 0; i < MAX_GROUP; i++) sc[i] = 0.0f;
        if (valid) {
            // Unrolled (bounded by EPL) so that the row's loads are in flight together.
#pragma unroll 8
            for (int d8 = 0; d8 < EPL * 4; d8++) {
                if (d8 >= hd / 8) break;
                float kf[8];
                kv_load8(tbl, k_off, kvh, p, hd, d8 * 8, q8, kf);
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
            const u16* vr = kv_row(tbl, v_off, kvh, base + j, hd);
            const i8* vq = kvq_row(tbl, v_off, kvh, base + j, hd);
            float vv[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const int d = lane * EPL + e;
                vv[e] = d >= hd ? 0.0f
                        : q8    ? (float)vq[d] * h2f(*kvq_scale(tbl, v_off, kvh, base + j, hd, d))
                                : h2f(vr[d]);
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

// What the decode attention (attn_dec_<LPR>_<G>) does first, for its one token: the per-head
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
    // A token that sees at most one_split keys takes them in one split (0: never). With out,
    // the grid has that one split and the block writes the attention's rows itself (and,
    // with xq, quantized for the output projection, as attn_combine would): no partials, no
    // combine. The sums are attn_combine's bit for bit (its weight of a lone split is 1).
    int one_split;
    float* out;
    u8* xq;
};

// A lane's rotation of the dimensions e = lane + 32 i (i < NE) of every head, for
// heads_norm_rope_block: taken before a decode kernel waits on the kernels before it (the
// position came from a copy before the step, the frequencies are weights), so the sines and
// cosines are off the chain that starts when the new rows are written.
template <int NE>
__device__ __forceinline__ void heads_rot(const DecHeads& dh, int pos, int hd, float* sn,
                                          float* cs) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < NE; i++) {
        const int e = lane + 32 * i;
        sn[i] = 0.0f;
        cs[i] = 1.0f;
        if (e < hd && e < dh.rope_dims) {
            const int half = dh.rope_dims / 2;
            const int fi = dh.neox ? (e < half ? e : e - half) : e / 2;
            sincosf((float)pos * dh.inv_freq[fi], &sn[i], &cs[i]);
        }
    }
}

// The heads of one decode block normalised and rotated, value for value as `heads` computes
// them, a warp a head: g query heads at q (hd <= 32 NE values each) and, with key, the new
// key's head at k, into rows (query head i at i * ld, the key at key_row); sn and cs from
// heads_rot. Warp w takes heads w, w + warps, ... (H at most: g + 1 <= H * warps), all their
// values and norm weights loaded at once, sums each head's squares in `heads`' order (a lane
// over e = lane + 32 i, then the shuffle tree), and takes a rotation's partner from its own
// normalised row in raw ((g + 1) * ld floats of scratch), so only the end needs the block:
// it ends with a barrier.
template <int NE, int H>
__device__ void heads_norm_rope_block(const float* q, const float* k, int g, bool key, int hd,
                                      const DecHeads& dh, const float* sn, const float* cs,
                                      float* raw, float* rows, int key_row, int ld) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int nh = g + (int)key;
    float v[H][NE], w[H][NE];
#pragma unroll
    for (int h = 0; h < H; h++) {
        const int i = warp + h * nw;
        const float* x = i < g ? q + (size_t)i * hd : k;
        const float* norm_w = i < g ? dh.q_norm : dh.k_norm;
#pragma unroll
        for (int j = 0; j < NE; j++) {
            const int e = lane + 32 * j;
            const bool in = i < nh && e < hd;
            v[h][j] = in ? x[e] : 0.0f;
            w[h][j] = in && norm_w ? norm_w[e] : 1.0f;
        }
    }
#pragma unroll
    for (int h = 0; h < H; h++) {
        const int i = warp + h * nw;
        if (i >= nh) break;
        const bool norm = (i < g ? dh.q_norm : dh.k_norm) != nullptr;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NE; j++)
            if (lane + 32 * j < hd) ss += v[h][j] * v[h][j];
        const float r = norm ? rsqrtf(warp_sum(ss) / (float)hd + dh.eps) : 1.0f;
        float* xr = raw + i * ld;
#pragma unroll
        for (int j = 0; j < NE; j++) {
            const int e = lane + 32 * j;
            if (norm) v[h][j] = v[h][j] * r * w[h][j];
            if (e < hd) xr[e] = v[h][j];
        }
    }
    __syncwarp();
#pragma unroll
    for (int h = 0; h < H; h++) {
        const int i = warp + h * nw;
        if (i >= nh) break;
        const float* xr = raw + i * ld;
        float* out = rows + (i < g ? i * ld : key_row);
#pragma unroll
        for (int j = 0; j < NE; j++) {
            const int e = lane + 32 * j;
            if (e >= hd) continue;
            float o = v[h][j];
            if (e < dh.rope_dims) {
                const int half = dh.rope_dims / 2;
                int partner;
                float sign;
                if (dh.neox) {
                    partner = e < half ? e + half : e - half;
                    sign = e < half ? -1.0f : 1.0f;
                } else {
                    partner = e ^ 1;
                    sign = (e & 1) ? 1.0f : -1.0f;
                }
                o = o * cs[j] + sign * xr[partner] * sn[j];
            }
            out[e] = o;
        }
    }
    __syncthreads();
}

// ---- decode attention: one token a sequence, split over keys --------------------------

// Warps of a decode attention block where G > 2 (DEC_W), and row loads a lane has in flight for
// each of K and V.
#define DEC_WARPS 4
// Warps of a decode attention block by G: eight where G <= 2 (half the splits of four-warp
// blocks at the same warps a multiprocessor, so the combine walks half the partials).
#define DEC_W(G) ((G) <= 2 ? 8 : DEC_WARPS)
#define DEC_U 4
// Keys a decode split takes at least (attention.rs DEC_SPLIT_KEYS): a sequence uses
// ceil(len / DEC_SPLIT_KEYS) of its splits, at most all of them.
#define DEC_SPLIT_KEYS 64

// Eight f16 values (one 16-byte load) to f32.
__device__ __forceinline__ void h8(uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = h2f((u16)(w[j] & 0xffff));
        f[2 * j + 1] = h2f((u16)(w[j] >> 16));
    }
}

// Eight values of a key or value row as the decode attention holds them, into f, and the
// factor they take: f16 (one 16-byte load; 1) or, Q, a q8_0 cache's eight int8 values in x
// and y and their block's f16 scale in z (the factor: a row's dot product and a value row's
// weight take it once, not each value).
template <bool Q>
__device__ __forceinline__ float row8(uint4 v, float* f) {
    if (!Q) {
        h8(v, f);
        return 1.0f;
    }
    q8x8(make_uint2(v.x, v.y), 1.0f, f);
    return h2f((u16)v.z);
}

// Row (h, p)'s eight values from dimension d0 as row8<Q> takes them.
template <bool Q>
__device__ __forceinline__ uint4 dec_load(const u64* tbl, long long off, int h, int p, int hd,
                                          int d0) {
    if (Q) {
        const uint2 w = __ldg((const uint2*)(kvq_row(tbl, off, h, p, hd) + d0));
        return make_uint4(w.x, w.y, __ldg(kvq_scale(tbl, off, h, p, hd, d0)), 0);
    }
    return __ldg((const uint4*)(kv_row(tbl, off, h, p, hd) + d0));
}

// One online-softmax step of a warp over the rows it holds: row u * RPL + lane / LPR of the
// step (u < DEC_U) is in k[u], v[u], the lane's eight dimensions of it (row8<Q>), and counts
// where ok[u]. Scores are summed over a row's LPR lanes; the running max m is the warp's
// (every lane holds it); l and acc are the lane's own rows' sums, added over the warp at the
// end.
template <int LPR, int G, bool Q>
__device__ __forceinline__ void dec_step(const uint4* k, const uint4* v, const bool* ok, int g,
                                         const float (*qf)[8], float* m, float* l,
                                         float (*acc)[8]) {
    float s[DEC_U][G];
#pragma unroll
    for (int u = 0; u < DEC_U; u++) {
        float kf[8];
        const float fk = row8<Q>(k[u], kf);
#pragma unroll
        for (int i = 0; i < G; i++) {
            float p = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) p += qf[i][e] * kf[e];
            s[u][i] = Q ? p * fk : p;
        }
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < DEC_U; u++)
#pragma unroll
            for (int i = 0; i < G; i++) s[u][i] += __shfl_xor_sync(0xffffffffu, s[u][i], o);
    }
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= g) break;
        float mx = -KINF;
#pragma unroll
        for (int u = 0; u < DEC_U; u++) mx = fmaxf(mx, ok[u] ? s[u][i] : -KINF);
#pragma unroll
        for (int o = 16; o >= LPR; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float mn = fmaxf(m[i], mx);
        const float corr = expf(m[i] - mn);
        m[i] = mn;
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            s[u][i] = ok[u] ? expf(s[u][i] - mn) : 0.0f;
            sum += s[u][i];
        }
        l[i] = l[i] * corr + sum;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i][e] *= corr;
    }
#pragma unroll
    for (int u = 0; u < DEC_U; u++) {
        float vf[8];
        const float fv = row8<Q>(v[u], vf);
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (i >= g) break;
            const float w = Q ? s[u][i] * fv : s[u][i];
#pragma unroll
            for (int e = 0; e < 8; e++) acc[i][e] += w * vf[e];
        }
    }
}

// Value v of dimension d of head h of token t into out and, with xq (head_dim a multiple of
// 32, ntok <= MAX_TOK), quantized as quant_act would write it (no norm) for the output
// projection that follows: a warp's lanes hold 32 consecutive dimensions of one head.
__device__ __forceinline__ void combine_out(float v, int t, int h, int d, int head_dim,
                                            int heads, int ntok, float* out, u8* xq) {
    out[((size_t)t * heads + h) * head_dim + d] = v;
    if (!xq) return;
    const int cols = heads * head_dim, nb = cols / 32;
    i8* q = (i8*)xq + (size_t)t * cols;
    float* dq = (float*)(xq + (size_t)ntok * cols) + (size_t)t * nb;
    short* sum = (short*)((float*)(xq + (size_t)ntok * cols) + (size_t)ntok * nb) +
                 (size_t)t * (cols / 16);
    // quant_block indexes by block within the token: shift the bases so b is that index.
    quant_block(v, (h * head_dim + d) / 32, d & 31, q, dq, sum);
    if (h == 0 && d == 0) ((float*)(xq + xq_inv_offset(cols, ntok)))[t] = 1.0f;
}

// The NW partials of a decode block (each its max and sum in wml, its weighted values at
// acc + (w * G + i) * ld for query head i) merged into the split's partial for attn_combine.
// A thread a head takes the max over the partials, the denominator, and each partial's
// weight e^(m_w - max), which replaces m_w in wml (so each value needs no exponential).
template <int NW, int G>
__device__ __forceinline__ void dec_merge(const float* acc, float (*wml)[G][2], int ld, int g,
                                          int hd, int t, int heads, int kvh, int split,
                                          int ld_split, float* part_acc, float* part_ml,
                                          const DecHeads& dh) {
    __shared__ float dden[G];
    if (threadIdx.x < g) {
        const int i = threadIdx.x;
        float mx = -KINF;
#pragma unroll
        for (int w = 0; w < NW; w++) mx = fmaxf(mx, wml[w][i][0]);
        float den = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float mw = wml[w][i][0];
            float f = 0.0f;
            if (mw != -KINF) {
                f = expf(mw - mx);
                den += f * wml[w][i][1];
            }
            wml[w][i][0] = f;
        }
        const size_t slot = ((size_t)t * heads + kvh * g + i) * ld_split + split;
        if (dh.out) {
            dden[i] = den;
        } else {
            part_ml[2 * slot] = mx;
            part_ml[2 * slot + 1] = den;
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < g * hd; x += blockDim.x) {
        const int i = x / hd, d = x % hd;
        float num = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            // A partial of no key has weight 0 and values never written: skipped (a weight
            // that underflowed to 0 adds nothing either).
            const float f = wml[w][i][0];
            if (f != 0.0f) num += f * acc[(w * G + i) * ld + d];
        }
        const size_t slot = ((size_t)t * heads + kvh * g + i) * ld_split + split;
        if (dh.out)
            combine_out(num / dden[i], t, kvh * g + i, d, hd, heads, gridDim.z, dh.out, dh.xq);
        else
            part_acc[slot * hd + d] = num;
    }
}

// A decode block's new key and value of KV head kvh for row pos of an f16 cache, in three
// steps so that no load waits behind another: the rows' places (the block table, which a
// copy before the step wrote: before the wait on the kernels before), a thread's values of
// the new value row (dec_new_v, right after the wait), then both rows stored (dec_store_f16,
// the key from the block's normalised and rotated row k). hd <= 2 * blockDim.x.
struct NewRow {
    u16 *kr, *vr;
    float v[2];
};
__device__ __forceinline__ NewRow dec_new_row(const u64* tbl, long long k_off, long long v_off,
                                              int kvh, int pos, int hd) {
    NewRow n;
    n.kr = kv_row(tbl, k_off, kvh, pos, hd);
    n.vr = kv_row(tbl, v_off, kvh, pos, hd);
    return n;
}
__device__ __forceinline__ void dec_new_v(NewRow& n, const float* v, int hd) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = threadIdx.x + i * blockDim.x;
        n.v[i] = d < hd ? v[d] : 0.0f;
    }
}
__device__ __forceinline__ void dec_store_f16(const NewRow& n, int hd, const float* k) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = threadIdx.x + i * blockDim.x;
        if (d < hd) {
            n.kr[d] = f2h(k[d]);
            n.vr[d] = f2h(n.v[i]);
        }
    }
}

// Split `split` of a decode block's keys [k0, k1) of the len a sequence sees (the last
// `window` where window > 0), false where it has none. A sequence's keys go to its first
// n_split splits (the grid may hold more for other sequences: those write an empty partial,
// which the combine skips); partials are laid out by the grid's ld_split splits.
__device__ __forceinline__ bool dec_split_keys(int len, int window, int n_split, int one,
                                               int split, int ld_split, int t, int heads,
                                               int kvh, int g, float* part_ml, int& k0,
                                               int& k1) {
    const int lo = window > 0 ? max(0, len - window) : 0;
    n_split = len - lo <= one
                  ? 1
                  : min(n_split, max(1, (len - lo + DEC_SPLIT_KEYS - 1) / DEC_SPLIT_KEYS));
    if (split >= n_split) {
        pdl_wait();
        if (threadIdx.x < g)
            part_ml[2 * (((size_t)t * heads + kvh * g + threadIdx.x) * ld_split + split)] = -KINF;
        return false;
    }
    const int c = (len - lo + n_split - 1) / n_split;
    k0 = lo + split * c;
    k1 = min(len, k0 + c);
    return true;
}

// The decode attention of one token: grid (kv_heads, splits), DEC_W(G) warps a block, the
// heads' work (DecHeads) first. Split s of S takes keys [s * c, (s + 1) * c) of the
// len = pos0 + 1 visible ones (c = len / S rounded up), so a recorded grid spreads whatever
// length the step has over all its blocks. A key row is LPR lanes' 16-byte loads (LPR: the
// head size / 8 rounded up to a power of two), so a warp-wide load covers 32 / LPR rows;
// each warp takes DEC_U such loads of K and of V at once, its own rows of the split in turn
// with the others, and keeps its own online softmax (no block barrier in the key loop). The
// new key and value the split whose keys end at len stores are taken from registers, not
// read back. The warps' partials meet in shared memory at the end; the block writes its
// softmax partial (max, sum, weighted V) per query head, for attn_combine. G: query heads a
// KV head, rounded up to a power of two (g the real count). Q: a q8_0 cache (common.cu
// kvq_row; k_off and v_off in bytes), else f16.
template <int LPR, int G, bool Q, int W>
__device__ void attn_dec_part(const float* q, const u64* tbl, long long k_off, long long v_off,
                              int heads, int kv_heads, int hd, float scale, int len, int window,
                              int t,
                              int n_split, float* part_acc, float* part_ml,
                              const DecHeads& dh) {
    constexpr int RPL = 32 / LPR, KPI = DEC_U * RPL, HDM = LPR * 8;
    // The q rows and the new key (normalised and rotated) with their raw values after them
    // first, the warps' partial sums at the end.
    constexpr int SM_ROWS = 2 * (G + 1) * HDM, SM_ACC = W * G * HDM;
    __shared__ float sm[SM_ROWS > SM_ACC ? SM_ROWS : SM_ACC];
    __shared__ float wml[W][G][2];
    // A q8_0 cache's new key and value as stored: their int8 values and scales.
    __shared__ __align__(16) i8 nq[2][Q ? 256 : 16];
    __shared__ u16 nsc[2][8];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x, split = blockIdx.y, ld_split = gridDim.y;
    const int g = heads / kv_heads;
    int k0, k1;
    if (!dec_split_keys(len, window, n_split, dh.one_split, split, ld_split, t, heads, kvh, g,
                        part_ml, k0, k1))
        return;
    // The rows older than the new one, which earlier steps or prompt chunks wrote (a copy
    // precedes them, and the host reads each step's tokens before launching the next), so
    // a warp's first loads go out before the wait for the kernels before this one (under
    // PDL its start may overlap several of them). `len` came from what a copy put on the
    // device before the step.
    const int kend = min(k1, len - 1);
    const int sub = lane / LPR, d0 = (lane % LPR) * 8;
    const bool dok = d0 < hd;
    uint4 kb[DEC_U], vb[DEC_U];
    bool ok[DEC_U];
    auto load = [&](int base, uint4* kx, uint4* vx, bool* okx) {
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            const int p = base + u * RPL + sub;
            okx[u] = p < kend;
            kx[u] = vx[u] = make_uint4(0, 0, 0, 0);
            if (okx[u] && dok) {
                kx[u] = dec_load<Q>(tbl, k_off, kvh, p, hd, d0);
                vx[u] = dec_load<Q>(tbl, v_off, kvh, p, hd, d0);
            }
        }
    };
    int base = k0 + warp * KPI;
    if (base < kend) load(base, kb, vb, ok);
    const int pos = len - 1;
    constexpr int NE = (HDM + 31) / 32;
    float sn[NE], cs[NE];
    heads_rot<NE>(dh, pos, hd, sn, cs);
    const bool owner = k1 > k0 && k1 == len;
    NewRow nr;
    if (owner && !Q) nr = dec_new_row(tbl, k_off, v_off, kvh, pos, hd);
    pdl_wait();
    if (owner && !Q) dec_new_v(nr, dh.v + (size_t)kvh * hd, hd);
    float qf[G][8], acc[G][8], m[G], l[G];
    {
        float* rows = sm;
        float* raw = sm + (G + 1) * HDM;
        heads_norm_rope_block<NE, (G + W) / W>(q + (size_t)kvh * g * hd,
                                               dh.k + (size_t)kvh * hd, g, owner, hd, dh, sn,
                                               cs, raw, rows, G * HDM, HDM);
#pragma unroll
        for (int i = 0; i < G; i++) {
            m[i] = -KINF;
            l[i] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                qf[i][e] = i < g && dok ? rows[i * HDM + d0 + e] * scale : 0.0f;
                acc[i][e] = 0.0f;
            }
        }
        if (owner && Q) {
            // The new row quantized into the cache (a warp a 32-value block: the head size is
            // a multiple of 32, so whole warps take part or none) and, as stored, into nq and
            // nsc for warp wnew.
            for (int d = threadIdx.x; d < hd; d += blockDim.x) {
                kvq_store(tbl, k_off, kvh, pos, hd, d, rows[G * HDM + d], &nq[0][d],
                          &nsc[0][d >> 5]);
                kvq_store(tbl, v_off, kvh, pos, hd, d, dh.v[(size_t)kvh * hd + d], &nq[1][d],
                          &nsc[1][d >> 5]);
            }
            __syncthreads();
        } else if (owner) {
            // The new row into the cache, and into warp wnew's registers as its f16 values.
            dec_store_f16(nr, hd, rows + G * HDM);
        }
    }
    // The next pass's rows are loaded before this pass's arithmetic: a warp always has
    // rows in flight.
    for (; base < kend; base += W * KPI) {
        uint4 kn[DEC_U], vn[DEC_U];
        bool okn[DEC_U];
        if (base + W * KPI < kend) load(base + W * KPI, kn, vn, okn);
        dec_step<LPR, G, Q>(kb, vb, ok, g, qf, m, l, acc);
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            kb[u] = kn[u];
            vb[u] = vn[u];
            ok[u] = okn[u];
        }
    }
    // The new key goes to the warp that would take the split's next chunk of rows (chunks go
    // to the warps in turn), which has one pass fewer than the first warps where they are
    // uneven, rather than to warp 0, which always has the most.
    const int wnew = ((kend - k0 + KPI - 1) / KPI) % W;
    if (owner && warp == wnew) {
        uint4 k[DEC_U], v[DEC_U];
        bool nok[DEC_U];
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            nok[u] = u == 0 && sub == 0;
            k[u] = v[u] = make_uint4(0, 0, 0, 0);
        }
        if (dok && Q) {
            const uint2 kq = *(const uint2*)&nq[0][d0], vq = *(const uint2*)&nq[1][d0];
            k[0] = make_uint4(kq.x, kq.y, nsc[0][d0 >> 5], 0);
            v[0] = make_uint4(vq.x, vq.y, nsc[1][d0 >> 5], 0);
        } else if (dok) {
            k[0] = f8_h8(sm + G * HDM + d0);
            v[0] = f8_h8(dh.v + (size_t)kvh * hd + d0);
        }
        dec_step<LPR, G, Q>(k, v, nok, g, qf, m, l, acc);
    }
    // The warp's rows summed (lanes of one row group hold the same sums of l).
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= g) break;
#pragma unroll
        for (int o = 16; o >= LPR; o >>= 1) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], o);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], o);
        }
    }
    // sm's rows were read before the key loop (the barrier after the heads' work); the new
    // key by warp wnew only, before it writes here.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (i >= g) break;
        if (lane < LPR && dok)
#pragma unroll
            for (int e = 0; e < 8; e++) sm[(warp * G + i) * HDM + d0 + e] = acc[i][e];
        if (lane == 0) {
            wml[warp][i][0] = m[i];
            wml[warp][i][1] = l[i];
        }
    }
    __syncthreads();
    dec_merge<W, G>(sm, wml, HDM, g, hd, t, heads, kvh, split, ld_split, part_acc, part_ml, dh);
}

// Splits whose weights attn_combine keeps in shared memory (more: computed as it goes).
#define COMBINE_W 1024
// Splits whose values attn_combine loads ahead.
#define COMBINE_PRE 4

// The maximum m and denominator of one head's n_ws split partials (ml: (max, sum) pairs) into
// md, and the weights e^(m_s - m) of the first cw splits into wsh: one warp, its lanes a
// split each in turn (a decode step at depth has hundreds of splits, which one thread
// walking them all was slow at). Read through L2: other blocks of the grid may have written
// them.
__device__ void combine_weights(const float* ml, int n_ws, float* wsh, int cw, float* md,
                                int lane) {
    const float2* ml2 = (const float2*)ml;
    const float2 first = lane < n_ws ? __ldcg(ml2 + lane) : make_float2(-KINF, 0.0f);
    float m = first.x;
    for (int s = lane + 32; s < n_ws; s += 32) m = fmaxf(m, __ldcg(ml2 + s).x);
    m = warp_max(m);
    float den = 0.0f;
    for (int s = lane; s < n_ws; s += 32) {
        const float2 e = s == lane ? first : __ldcg(ml2 + s);
        const float w = e.x == -KINF ? 0.0f : expf(e.x - m);
        if (s < cw) wsh[s] = w;
        den += w * e.y;
    }
    den = warp_sum(den);
    if (lane == 0) {
        md[0] = m;
        md[1] = den;
    }
}

// One sequence of a batched decode step (attn_dec_seqs_<LPR>_<G>): its cache's block table
// (common.cu kv_row), the keys its token sees (its position + 1, the last `window` of them
// where window > 0) and its splits.
struct SeqDesc {
    const u64* tbl;
    int len;
    int splits;  // as attn_dec_<LPR>_<G>'s grid for this sequence alone, so the same sums
    int window;
    int pad;
};

// Decode entry points by LPR (lanes a key row) and G (query heads a KV head, rounded up to
// a power of two): attn_dec_<LPR>_<G> for one token with its heads' work fused (grid
// (kv_heads, splits)), attn_dec_seqs_<LPR>_<G> for one token of each of several sequences
// (grid (kv_heads, splits, sequences); sequence z's rows of q, k and v are row z). Their
// splits' partials are combined by attn_combine (where a lone token's grid has one split
// and DecHeads::out is set, its block writes the rows instead).
// Blocks a multiprocessor the decode kernels are compiled for (attention.rs dec_min_blocks):
// registers for two blocks of eight warps where G <= 2 (128 fit), three of four at G = 4 (its
// 175 registers held two: 168 hold three, spilling 4 bytes), two at G = 8.
#define DEC_MIN_BLOCKS(G) ((G) <= 2 ? 2 : (G) == 4 ? 3 : 2)
// N: the name's infix ("" or "q8_"), Q as attn_dec_part's, PL: a layer's K (or V) planes in a
// block (elements of the cache's type: f16 values, or bytes of a q8_0 cache).
#define ATTN_DEC(N, Q, L, G)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * DEC_W(G), DEC_MIN_BLOCKS(G))          \
        attn_dec_##N##L##_##G(                                                               \
        const float* q, const u64* tbl, long long k_off, long long v_off, int heads,         \
        int kv_heads, int hd, float scale, const u32* params, float* pa, float* pml,         \
        int window, DecHeads dh) {                                                           \
        attn_dec_part<L, G, Q, DEC_W(G)>(q, tbl, k_off, v_off, heads, kv_heads, hd, scale,   \
                                         (int)params[0] + (int)blockIdx.z + 1, window,      \
                                         blockIdx.z, gridDim.y, pa, pml, dh);               \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * DEC_W(G), DEC_MIN_BLOCKS(G))          \
        attn_dec_seqs_##N##L##_##G(                                                          \
        const float* q, const SeqDesc* seqs, int layer, int heads, int kv_heads, int hd,     \
        float scale, float* pa, float* pml, DecHeads dh) {                                   \
        const int z = blockIdx.z;                                                            \
        const SeqDesc sd = seqs[z];                                                          \
        const long long pl =                                                                 \
            Q ? kv_heads * KVQ_HEAD(hd) : (long long)kv_heads * KV_BLOCK * hd;               \
        const long long k_off = (long long)layer * 2 * pl;                                   \
        DecHeads d = dh;                                                                     \
        d.k += (size_t)z * kv_heads * hd;                                                    \
        d.v += (size_t)z * kv_heads * hd;                                                    \
        attn_dec_part<L, G, Q, DEC_W(G)>(q + (size_t)z * heads * hd, sd.tbl, k_off,         \
                                         k_off + pl, heads, kv_heads, hd, scale, sd.len,    \
                                         sd.window, z, sd.splits, pa, pml, d);              \
    }
#define ATTN_DEC_G(L)                                                                        \
    ATTN_DEC(, false, L, 1) ATTN_DEC(, false, L, 2) ATTN_DEC(, false, L, 4)                  \
    ATTN_DEC(, false, L, 8) ATTN_DEC(q8_, true, L, 1) ATTN_DEC(q8_, true, L, 2)              \
    ATTN_DEC(q8_, true, L, 4) ATTN_DEC(q8_, true, L, 8)
ATTN_DEC_G(4)
ATTN_DEC_G(8)
ATTN_DEC_G(16)
ATTN_DEC_G(32)

// One entry point per EPL (head_dim / 32, rounded up) for prompts: attn_split_<EPL>.
#define ATTN_SPLIT(E)                                                                        \
    extern "C" __global__ void attn_split_##E(                                               \
        const float* q, const u64* tbl, long long k_off, long long v_off, int heads,         \
        int kv_heads, int hd, float scale, const u32* params, float* pa, float* pml,         \
        int window, int q8) {                                                                \
        attn_split_impl<E>(q, tbl, k_off, v_off, heads, kv_heads, hd, scale, params, pa,     \
                           pml, window, q8);                                                 \
    }
ATTN_SPLIT(1)
ATTN_SPLIT(2)
ATTN_SPLIT(3)
ATTN_SPLIT(4)
ATTN_SPLIT(5)
ATTN_SPLIT(6)
ATTN_SPLIT(7)
ATTN_SPLIT(8)

// Head size attn_combine takes at most.
#define COMBINE_HD 256

// grid (ntok * heads), block P groups of head_dim threads (rounded up to a warp): out =
// sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, for the prompt attention's splits and the
// decode ones. The first warp takes the splits' maxima and weights (combine_weights); each
// thread of group p then sums its dimension over the splits p, p + P, ... in order, and the
// first group adds the groups' sums in order: a chain of n_ws / P dependent loads a thread
// rather than n_ws (a decode step at depth has dozens of splits, each load an L2 round
// trip). Empty splits (m_s = -inf) weigh nothing exactly, so a sequence's sums do not depend
// on how many splits the grid has (attention.rs combine_kernel says how P is chosen so
// they do not depend on P either). With xq, the rows are also written quantized
// (combine_out).
template <int P>
__device__ void attn_combine_impl(const float* part_acc, const float* part_ml, int n_ws,
                                  int head_dim, float* out, u8* xq, int ntok, int heads) {
    __shared__ float wsh[COMBINE_W];
    __shared__ float md[2];
    __shared__ float red[P > 1 ? P - 1 : 1][P > 1 ? COMBINE_HD : 1];
    pdl_begin();
    const int hdr = (head_dim + 31) & ~31;
    const int d = threadIdx.x % hdr, grp = threadIdx.x / hdr;
    const size_t th = blockIdx.x;
    const float* ml = part_ml + th * n_ws * 2;
    const float* acc = part_acc + th * n_ws * head_dim + d;
    const bool dim = d < head_dim;
    const int nw = min(n_ws, COMBINE_W);
    // The group's first splits' values are loaded before the weights are known (most steps
    // have few splits): their latency overlaps the first warp's.
    float pre[COMBINE_PRE];
#pragma unroll
    for (int i = 0; i < COMBINE_PRE; i++) {
        const int s = grp + i * P;
        pre[i] = dim && s < nw ? acc[(size_t)s * head_dim] : 0.0f;
    }
    if (threadIdx.x < 32) combine_weights(ml, n_ws, wsh, COMBINE_W, md, threadIdx.x);
    __syncthreads();
    const float m = md[0], den = md[1];
    float num = 0.0f;
    if (dim) {
#pragma unroll
        for (int i = 0; i < COMBINE_PRE; i++) {
            const int s = grp + i * P;
            if (s < nw && wsh[s] != 0.0f) num += wsh[s] * pre[i];
        }
#pragma unroll 4
        for (int s = grp + COMBINE_PRE * P; s < nw; s += P) {
            const float w = wsh[s];
            if (w != 0.0f) num += w * acc[(size_t)s * head_dim];
        }
        for (int s = COMBINE_W + grp; s < n_ws; s += P) {
            const float ms = ml[2 * s];
            if (ms == -KINF) continue;
            num += expf(ms - m) * acc[(size_t)s * head_dim];
        }
        if (P > 1 && grp > 0) red[grp - 1][d] = num;
    }
    if (P > 1) __syncthreads();
    // (The first group is head_dim threads rounded up to a warp.)
    if (grp > 0 || !dim) return;
#pragma unroll
    for (int p = 1; p < P; p++) num += red[p - 1][d];
    combine_out(num / den, (int)th / heads, (int)th % heads, d, head_dim, heads, ntok, out,
                xq);
}

// attn_combine_<P>: P groups of threads (attention.rs combine_kernel).
#define ATTN_COMBINE(P)                                                                      \
    extern "C" __global__ void attn_combine_##P(const float* part_acc, const float* part_ml,  \
                                                int n_ws, int head_dim, float* out, u8* xq,   \
                                                int ntok, int heads) {                        \
        attn_combine_impl<P>(part_acc, part_ml, n_ws, head_dim, out, xq, ntok, heads);        \
    }
ATTN_COMBINE(1)
ATTN_COMBINE(2)
ATTN_COMBINE(4)
ATTN_COMBINE(8)


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
