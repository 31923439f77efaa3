// Causal grouped-query attention over the KV cache, split over keys: `attn_split` takes one
// (query head, chunk of 256 keys, token) per workgroup and writes the chunk's softmax
// partial (max m, sum l, the p-weighted sum of V rows); `attn_combine` merges a head's
// chunks. Token t sees positions 0..pos0 + t. Cache planes are (kv_heads, n_ctx, head_dim),
// f16 two per word or f32.
// split params: 0 heads, 1 kv_heads, 2 hd, 3 n_ctx, 4 pos0, 5 plane, 6 kv_f16, 7 scale,
//               8 splits, 9 q_off, 10 ml_off, 11 q_ld, 12 out_off, 13 out_ld
// With one split, attn_split writes the output itself (acc / l) and no combine runs.

@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<storage, read_write> KC: array<u32>;
@group(0) @binding(3) var<storage, read_write> VC: array<u32>;
@group(0) @binding(4) var<storage, read_write> PART: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;

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
    let n_ctx = P(3u);
    let g = heads / P(1u);
    let kvh = h / g;
    let len = P(4u) + t + 1u;
    let k0 = s * CH;
    let k1 = min(len, k0 + CH);
    if (li < hd) { qs[li] = Q[P(9u) + t * P(11u) + h * hd + li] * PF(7u); }
    workgroupBarrier();
    let plane = P(5u) + kvh * n_ctx * hd;
    let key = k0 + li;
    var sc = NEG_INF;
    if (key < k1) {
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
    if (key < k1) { p = exp(sc - m); }
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
