// Causal grouped-query attention over the KV cache, split over keys: `attn_split` takes one
// (query head, chunk of 256 keys, token) per workgroup and writes the chunk's softmax
// partial (max m, sum l, the p-weighted sum of V rows); `attn_combine` merges a head's
// chunks. Token t sees positions 0..pos0 + t (the last `window` of them where window > 0).
// Cache planes are (kv_heads, slots, head_dim) (slots: what the cache holds now), f16 two per word or f32.
// split params: 0 heads, 1 kv_heads, 2 hd, 3 slots, 4 pos0, 5 plane, 6 kv_f16, 7 scale,
//               8 splits, 9 q_off, 10 ml_off, 11 q_ld, 12 out_off, 13 out_ld,
//               14 keys per split (attn_dec), 15 window (0: none),
//               attn_dec of one token with the heads' work fused in: 16 flags (1 fused,
//               2 q/k norm, 4 rope, 8 neox), 17 eps, 18 rope dims, 19 offset of the
//               token's k and v rows (row0 x the rows' width)
// With one split, attn_split writes the output itself (acc / l) and no combine runs.

@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<storage, read_write> KC: array<u32>;
@group(0) @binding(3) var<storage, read_write> VC: array<u32>;
@group(0) @binding(4) var<storage, read_write> PART: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;
// attn_dec's fused heads: the new token's k and v rows (not yet normalised or rotated), the
// q and k norm weights, the cos/sin table.
@group(0) @binding(6) var<storage, read_write> KROW: array<f32>;
@group(0) @binding(7) var<storage, read_write> VROW: array<f32>;
@group(0) @binding(8) var<storage, read_write> QNW: array<f32>;
@group(0) @binding(9) var<storage, read_write> KNW: array<f32>;
@group(0) @binding(10) var<storage, read_write> CS: array<f32>;

const CH: u32 = 256u;

var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 256>;

fn kv(buf: u32, i: u32) -> f32 {
    if (P(6u) == 1u) {
        var w: u32;
        if (buf == 0u) { w = KC[i >> 1u]; } else { w = VC[i >> 1u]; }
        return select(f16lo(w), f16hi(w), (i & 1u) == 1u);
    }
    if (buf == 0u) { return bitcast<f32>(KC[i]); }
    return bitcast<f32>(VC[i]);
}

@compute @workgroup_size(256)
fn attn_split(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let s = wg.y;
    let t = wg.z;
    let heads = P(0u);
    let hd = P(2u);
    let slots = P(3u);
    let g = heads / P(1u);
    let kvh = h / g;
    let len = P(4u) + t + 1u;
    let lo = select(0u, len - min(len, P(15u)), P(15u) > 0u);
    let k0 = s * CH;
    let k1 = min(len, k0 + CH);
    if (li < hd) { qs[li] = Q[P(9u) + t * P(11u) + h * hd + li] * PF(7u); }
    workgroupBarrier();
    let plane = P(5u) + kvh * slots * hd;
    let key = k0 + li;
    let valid = key < k1 && key >= lo;
    var sc = NEG_INF;
    if (valid) {
        var a = 0.0;
        let kb = plane + key * hd;
        if (P(6u) == 1u) {
            for (var e = 0u; e < hd; e += 2u) {
                let kk = unpack2x16float(KC[(kb + e) >> 1u]);
                a += qs[e] * kk.x + qs[e + 1u] * kk.y;
            }
        } else {
            for (var e = 0u; e < hd; e++) { a += qs[e] * bitcast<f32>(KC[kb + e]); }
        }
        sc = a;
    }
    let m = wmax(sc, li);
    var p = 0.0;
    if (valid) { p = exp(sc - m); }
    ps[li] = p;
    let l = wsum(p, li);
    let slot = (t * heads + h) * P(8u) + s;
    if (li < hd) {
        var acc = 0.0;
        let nk = select(0u, k1 - k0, k1 > k0);
        for (var j = 0u; j < nk; j++) { acc += ps[j] * kv(1u, plane + (k0 + j) * hd + li); }
        if (P(8u) == 1u) {
            OUT[P(12u) + t * P(13u) + h * hd + li] = acc / l;
        } else {
            PART[slot * hd + li] = acc;
        }
    }
    if (li == 0u) {
        PART[P(10u) + 2u * slot] = select(NEG_INF, m, k1 > k0);
        PART[P(10u) + 2u * slot + 1u] = l;
    }
}

// Two elements (pair p) of the head row starting at element b of the K (buf 0) or V cache.
fn kv2(buf: u32, b: u32, p: u32) -> vec2<f32> {
    if (P(6u) == 1u) {
        let i = (b >> 1u) + p;
        if (buf == 0u) { return unpack2x16float(KC[i]); }
        return unpack2x16float(VC[i]);
    }
    let i = b + 2u * p;
    if (buf == 0u) { return vec2<f32>(bitcast<f32>(KC[i]), bitcast<f32>(KC[i + 1u])); }
    return vec2<f32>(bitcast<f32>(VC[i]), bitcast<f32>(VC[i + 1u]));
}

var<workgroup> q2: array<vec2<f32>, 128>;
var<workgroup> row: array<f32, 256>;
var<workgroup> knew: array<f32, 256>;
var<workgroup> vnew: array<f32, 256>;

// x as the cache keeps it (f16 caches: rounded to f16).
fn kvround(x: f32) -> f32 {
    if (P(6u) == 1u) { return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x; }
    return x;
}

// Pair p of key `key`'s K (V) row at element b of the cache, or of the new key's row where
// `key` is the new one (attn_dec's fused heads; `newkey` is past every key otherwise).
fn key2(key: u32, newkey: u32, b: u32, p: u32) -> vec2<f32> {
    if (key == newkey) { return vec2<f32>(knew[2u * p], knew[2u * p + 1u]); }
    return kv2(0u, b, p);
}
fn val2(key: u32, newkey: u32, b: u32, p: u32) -> vec2<f32> {
    if (key == newkey) { return vec2<f32>(vnew[2u * p], vnew[2u * p + 1u]); }
    return kv2(1u, b, p);
}
var<workgroup> sp: array<f32, 256>;
var<workgroup> pk: array<f32, 32>;
var<workgroup> accs: array<vec2<f32>, 512>;

// Decode attention (a few tokens): workgroup (query head, split, token) over the split's
// keys P(14) * s .. + P(14), 32 keys per step so that every load has many in flight: q.k by
// 8 invocations per key (each a strided eighth of the head), p.V by 4 key groups x 64 pair
// lanes, the softmax online across steps. Partials and params as attn_split.
//
// Fused heads (one token, flag 1): the workgroup normalises and rotates its q head from the
// raw q row, and the new key (position pos0) from KROW; the split that holds it reads the
// new key and value from workgroup memory, and its workgroup of the kv head's first q head
// stores them in the cache (no other workgroup of the dispatch reads that slot).
@compute @workgroup_size(256)
fn attn_dec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let s = wg.y;
    let t = wg.z;
    let heads = P(0u);
    let hd = P(2u);
    let np = hd / 2u;
    let g = heads / P(1u);
    let kvh = h / g;
    let len = P(4u) + t + 1u;
    let lo = select(0u, len - min(len, P(15u)), P(15u) > 0u);
    let k0 = max(s * P(14u), lo);
    let k1 = min(len, s * P(14u) + P(14u));
    let qb = P(9u) + t * P(11u) + h * hd;
    let plane = P(5u) + kvh * P(3u) * hd;
    let fl = P(16u);
    var newkey = 0xffffffffu;
    if ((fl & 1u) != 0u) {
        newkey = P(4u);
        let norm = (fl & 2u) != 0u;
        let rope = (fl & 4u) != 0u;
        var qv = 0.0;
        var qw = 0.0;
        var kv = 0.0;
        var kw = 0.0;
        var vv = 0.0;
        if (li < hd) {
            qv = Q[qb + li];
            kv = KROW[P(19u) + kvh * hd + li];
            vv = VROW[P(19u) + kvh * hd + li];
            if (norm) {
                qw = QNW[li];
                kw = KNW[li];
            }
        }
        norm_rope(li, qv, qw, hd, norm, PF(17u), rope, P(18u), (fl & 8u) != 0u, newkey);
        if (li < np) { q2[li] = vec2<f32>(row[2u * li], row[2u * li + 1u]) * PF(7u); }
        let kr = norm_rope(li, kv, kw, hd, norm, PF(17u), rope, P(18u), (fl & 8u) != 0u, newkey);
        // As the cache holds them (the other keys come from there rounded to f16).
        knew[li] = kvround(kr);
        vnew[li] = kvround(vv);
        workgroupBarrier();
        // The split holding the new key, for the kv head's first q head, stores it.
        if (h % g == 0u && newkey >= k0 && newkey < k1 && li < hd) {
            let idx = plane + newkey * hd + li;
            if (P(6u) == 1u) {
                if ((li & 1u) == 0u) {
                    KC[idx >> 1u] = pack2x16float(vec2<f32>(knew[li], knew[li + 1u]));
                    VC[idx >> 1u] = pack2x16float(vec2<f32>(vnew[li], vnew[li + 1u]));
                }
            } else {
                KC[idx] = bitcast<u32>(knew[li]);
                VC[idx] = bitcast<u32>(vnew[li]);
            }
        }
    } else {
        if (li < np) { q2[li] = vec2<f32>(Q[qb + 2u * li], Q[qb + 2u * li + 1u]) * PF(7u); }
        workgroupBarrier();
    }
    let r = li & 7u;
    let kk = li >> 3u;
    let kg = li >> 6u;
    let pt = li & 63u;
    var m = NEG_INF;
    var l = 0.0;
    var acc0 = vec2<f32>(0.0);
    var acc1 = vec2<f32>(0.0);
    for (var j0 = k0; j0 < k1; j0 += 32u) {
        let key = j0 + kk;
        var a = 0.0;
        if (key < k1) {
            let kb = plane + key * hd;
            var p = r;
            for (; p + 24u < np; p += 32u) {
                let x0 = key2(key, newkey, kb, p);
                let x1 = key2(key, newkey, kb, p + 8u);
                let x2 = key2(key, newkey, kb, p + 16u);
                let x3 = key2(key, newkey, kb, p + 24u);
                a += dot(q2[p], x0) + dot(q2[p + 8u], x1) + dot(q2[p + 16u], x2)
                    + dot(q2[p + 24u], x3);
            }
            for (; p < np; p += 8u) { a += dot(q2[p], key2(key, newkey, kb, p)); }
        }
        sp[li] = a;
        workgroupBarrier();
        if (li < 32u) {
            var sc = NEG_INF;
            if (j0 + li < k1) {
                let o = 8u * li;
                sc = sp[o] + sp[o + 1u] + sp[o + 2u] + sp[o + 3u] + sp[o + 4u] + sp[o + 5u]
                    + sp[o + 6u] + sp[o + 7u];
            }
            pk[li] = sc;
        }
        workgroupBarrier();
        var ms = NEG_INF;
        for (var j = 0u; j < 32u; j++) { ms = max(ms, pk[j]); }
        let mn = max(m, ms);
        let corr = exp(m - mn);
        workgroupBarrier();
        if (li < 32u) { pk[li] = select(0.0, exp(pk[li] - mn), j0 + li < k1); }
        workgroupBarrier();
        var ls = 0.0;
        for (var j = 0u; j < 32u; j++) { ls += pk[j]; }
        l = l * corr + ls;
        m = mn;
        acc0 *= corr;
        acc1 *= corr;
        let nk = min(32u, k1 - j0);
        var j = kg;
        for (; j + 4u < nk; j += 8u) {
            let va = plane + (j0 + j) * hd;
            let vb = va + 4u * hd;
            let ka = j0 + j;
            let kb2 = ka + 4u;
            if (pt < np) {
                acc0 += pk[j] * val2(ka, newkey, va, pt) + pk[j + 4u] * val2(kb2, newkey, vb, pt);
            }
            if (pt + 64u < np) {
                acc1 += pk[j] * val2(ka, newkey, va, pt + 64u)
                    + pk[j + 4u] * val2(kb2, newkey, vb, pt + 64u);
            }
        }
        for (; j < nk; j += 4u) {
            let va = plane + (j0 + j) * hd;
            if (pt < np) { acc0 += pk[j] * val2(j0 + j, newkey, va, pt); }
            if (pt + 64u < np) { acc1 += pk[j] * val2(j0 + j, newkey, va, pt + 64u); }
        }
        workgroupBarrier();
    }
    accs[kg * 128u + pt] = acc0;
    accs[kg * 128u + pt + 64u] = acc1;
    workgroupBarrier();
    let slot = (t * heads + h) * P(8u) + s;
    if (li < np) {
        let v = accs[li] + accs[128u + li] + accs[256u + li] + accs[384u + li];
        if (P(8u) == 1u) {
            let o = P(12u) + t * P(13u) + h * hd + 2u * li;
            OUT[o] = v.x / l;
            OUT[o + 1u] = v.y / l;
        } else {
            PART[slot * hd + 2u * li] = v.x;
            PART[slot * hd + 2u * li + 1u] = v.y;
        }
    }
    if (li == 0u) {
        PART[P(10u) + 2u * slot] = select(NEG_INF, m, k1 > k0);
        PART[P(10u) + 2u * slot + 1u] = l;
    }
}

// grid (heads, tokens): out row = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// params: 0 heads, 2 hd, 8 splits, 10 ml_off, 12 out_off, 13 out_ld
@compute @workgroup_size(256)
fn attn_combine(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let hd = P(2u);
    let splits = P(8u);
    let th = t * P(0u) + h;
    if (li >= hd) { return; }
    var m = NEG_INF;
    for (var s = 0u; s < splits; s++) { m = max(m, PART[P(10u) + 2u * (th * splits + s)]); }
    var num = 0.0;
    var den = 0.0;
    for (var s = 0u; s < splits; s++) {
        let ms = PART[P(10u) + 2u * (th * splits + s)];
        if (ms == NEG_INF) { continue; }
        let w = exp(ms - m);
        den += w * PART[P(10u) + 2u * (th * splits + s) + 1u];
        num += w * PART[(th * splits + s) * hd + li];
    }
    OUT[P(12u) + t * P(13u) + h * hd + li] = num / den;
}

// Prompt attention by tiles (flash attention): workgroup (query head, block of TQ tokens);
// the keys the block sees pass through workgroup memory TK2 at a time (keys, then values,
// in one f32 tile whose rows are padded by one so that the 8 lanes of a token read 8
// different banks), each read once for the TQ tokens. Invocation li: token qi = li / 8 of
// the block, lane kl = li % 8: the scores of keys kl + 8c (c < 4) of a tile, then head
// elements kl + 8d (d < hd / 8) of the output, held in registers; the softmax online
// across tiles. Heads of at most 128 elements, a multiple of 8. Params as attn_split
// (splits unused; out written directly) but 16: the call's tokens, 17: elements between
// key rows, 18: 1 where every token sees every key up to the last token's (dense
// non-causal), 19: elements between KV heads' first rows. The cache (kv_heads, slots, hd):
// 17 = hd, 19 = slots hd; dense K and V (n_kv, heads hd): 17 = heads hd, 19 = hd, pos0 =
// n_kv - tokens.
const TQ: u32 = 16u;
const TK2: u32 = 32u;
const TROW: u32 = 129u;

var<workgroup> qt: array<f32, 2048>; // [TQ][hd], scaled
var<workgroup> kvt: array<f32, 4128>; // [TK2][TROW]
var<workgroup> pt: array<f32, 512>; // [TQ][TK2]

// Rows k0.. of the K (buf 0) or V cache into kvt (zeros from k_end on), by the 128 lanes.
fn tile_rows(buf: u32, li: u32, plane: u32, ks: u32, hd: u32, k0: u32, k_end: u32) {
    for (var i = li; i < TK2 * hd; i += 128u) {
        let r = i / hd;
        var v = 0.0;
        if (k0 + r < k_end) { v = kv(buf, plane + (k0 + r) * ks + i % hd); }
        kvt[r * TROW + i % hd] = v;
    }
}

@compute @workgroup_size(128)
fn attn_tile(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t0 = wg.y * TQ;
    let heads = P(0u);
    let hd = P(2u);
    let pos0 = P(4u);
    let win = P(15u);
    let n = P(16u); // tokens of the call
    let g = heads / P(1u);
    let plane = P(5u) + (h / g) * P(19u);
    let ks = P(17u);
    let dense = P(18u) == 1u;
    let qi = li >> 3u;
    let kl = li & 7u;
    let t = t0 + qi;
    let live = t < n;
    // Token t sees keys lo_t ..= pos0 + t (every token up to the last one's, dense).
    let last = select(pos0 + t, pos0 + n - 1u, dense);
    var lo_t = 0u;
    if (win > 0u) { lo_t = last + 1u - min(last + 1u, win); }
    for (var i = li; i < TQ * hd; i += 128u) {
        let r = i / hd;
        var v = 0.0;
        if (t0 + r < n) { v = Q[P(9u) + (t0 + r) * P(11u) + h * hd + i % hd] * PF(7u); }
        qt[i] = v;
    }
    // The block's keys: from the first token's window start to its last token.
    let t_end = select(min(n, t0 + TQ), n, dense);
    let k_end = pos0 + t_end;
    var k_lo = 0u;
    if (win > 0u) { k_lo = pos0 + t0 + 1u - min(pos0 + t0 + 1u, win); }
    k_lo = k_lo - k_lo % TK2;
    var m = NEG_INF;
    var l = 0.0;
    var acc: array<f32, 16>;
    let nd = hd / 8u;
    for (var k0 = k_lo; k0 < k_end; k0 += TK2) {
        workgroupBarrier();
        tile_rows(0u, li, plane, ks, hd, k0, k_end);
        workgroupBarrier();
        var s: array<f32, 4>;
        for (var c = 0u; c < 4u; c++) {
            let key = k0 + kl + 8u * c;
            var a = 0.0;
            for (var e = 0u; e < hd; e++) { a += qt[qi * hd + e] * kvt[(kl + 8u * c) * TROW + e]; }
            let ok = live && key <= last && key >= lo_t;
            s[c] = select(NEG_INF, a, ok);
            pt[qi * TK2 + kl + 8u * c] = s[c];
        }
        // The token's tile maximum across its 8 lanes, through pt.
        workgroupBarrier();
        var mt = NEG_INF;
        for (var j = 0u; j < TK2; j++) { mt = max(mt, pt[qi * TK2 + j]); }
        let m_new = max(m, mt);
        // Keys past the token's view score NEG_INF: weight 0.
        var corr = 1.0;
        if (m > NEG_INF) { corr = exp(m - m_new); }
        workgroupBarrier();
        for (var c = 0u; c < 4u; c++) {
            var p = 0.0;
            if (s[c] > NEG_INF) { p = exp(s[c] - m_new); }
            pt[qi * TK2 + kl + 8u * c] = p;
        }
        // Values into the tile (the keys are no longer read).
        tile_rows(1u, li, plane, ks, hd, k0, k_end);
        workgroupBarrier();
        var ls = 0.0;
        for (var j = 0u; j < TK2; j++) { ls += pt[qi * TK2 + j]; }
        l = l * corr + ls;
        m = m_new;
        for (var d = 0u; d < nd; d++) {
            var a = acc[d] * corr;
            for (var j = 0u; j < TK2; j++) { a += pt[qi * TK2 + j] * kvt[j * TROW + kl + 8u * d]; }
            acc[d] = a;
        }
    }
    if (live) {
        for (var d = 0u; d < nd; d++) {
            OUT[P(12u) + t * P(13u) + h * hd + kl + 8u * d] = acc[d] / l;
        }
    }
}
