// Per-head work on rows of (n, heads * head_dim), one workgroup per (head row, token):
// RMSNorm over the head (Qwen3 q/k norm), RoPE (head_row.wgsl), the row rewritten in place, then
// stored at position pos0 + t of a KV-cache plane (heads, slots, head_dim) as f16 (two per
// word) or f32. Up to three groups in one dispatch: q (n_q heads: X, norm QN), k (n_kv: K,
// KN, cache KC) and v (n_kv: V, cache VC); group g is normalised / rotated / stored when
// bit g of the norm / rope / cache flags is set. A single group is group 0 with its cache
// at KC (bindings 1-4).
// params: 0 n_q, 1 n_kv, 2 head_dim, 3 eps, 4 norm flags, 5 rope flags, 6 cache flags,
//         7 rope_dims, 8 neox, 9 pos0, 10 slots, 11 plane (elements), 12 kv_f16,
//         13 q_ld, 14 kv_ld, 15 shift (position pos0 + t goes to cache slot pos0 + t - shift)

@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> QN: array<f32>;
@group(0) @binding(3) var<storage, read_write> KC: array<u32>;
@group(0) @binding(4) var<storage, read_write> CS: array<f32>;
@group(0) @binding(5) var<storage, read_write> K: array<f32>;
@group(0) @binding(6) var<storage, read_write> V: array<f32>;
@group(0) @binding(7) var<storage, read_write> KN: array<f32>;
@group(0) @binding(8) var<storage, read_write> VC: array<u32>;

var<workgroup> row: array<f32, 256>;

fn xload(g: u32, i: u32) -> f32 {
    switch g {
        case 0u: { return X[i]; }
        case 1u: { return K[i]; }
        default: { return V[i]; }
    }
}
fn xstore(g: u32, i: u32, v: f32) {
    switch g {
        case 0u: { X[i] = v; }
        case 1u: { K[i] = v; }
        default: { V[i] = v; }
    }
}
fn normw(g: u32, e: u32) -> f32 {
    if (g == 1u) { return KN[e]; }
    return QN[e];
}
fn cstore(g: u32, i: u32, w: u32) {
    if (g == 2u) { VC[i] = w; } else { KC[i] = w; }
}

@compute @workgroup_size(256)
fn heads(@builtin(local_invocation_index) e: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let nq = P(0u);
    let nkv = P(1u);
    var g = 0u;
    var h = wg.x;
    if (h >= nq + nkv) { g = 2u; h -= nq + nkv; } else if (h >= nq) { g = 1u; h -= nq; }
    let t = wg.y;
    let hd = P(2u);
    let base = t * select(P(14u), P(13u), g == 0u) + h * hd;
    let on = e < hd;
    let bit = 1u << g;
    let norm = (P(4u) & bit) != 0u;
    var v = 0.0;
    var w = 0.0;
    if (on) {
        v = xload(g, base + e);
        if (norm) { w = normw(g, e); }
    }
    let pos = P(9u) + t;
    v = norm_rope(e, v, w, hd, norm, PF(3u), (P(5u) & bit) != 0u, P(7u), P(8u) == 1u, pos);
    if (on) { xstore(g, base + e, v); }
    if (on && (P(6u) & bit) != 0u) {
        let idx = P(11u) + (h * P(10u) + pos - P(15u)) * hd + e;
        if (P(12u) == 1u) {
            if ((e & 1u) == 0u) { cstore(g, idx >> 1u, pack2x16float(vec2<f32>(v, row[e + 1u]))); }
        } else {
            cstore(g, idx, bitcast<u32>(v));
        }
    }
}
