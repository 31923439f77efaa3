// Per-head work on rows of x (n, heads * head_dim), one workgroup per (head, token):
// RMSNorm over the head (Qwen3 q/k norm) when has_norm, RoPE from a cos/sin table
// (positions x pairs, computed on the host as the CPU backend computes them) when do_rope,
// x rewritten in place; then the row stored at position pos0 + t of a KV-cache plane
// (heads, n_ctx, head_dim) as f16 (two per word) or f32 when has_cache.
// params: 0 heads, 1 head_dim, 2 eps, 3 has_norm, 4 do_rope, 5 rope_dims, 6 neox, 7 pos0,
//         8 n_ctx, 9 plane (elements), 10 has_cache, 11 kv_f16, 12 x_ld

@group(0) @binding(1) var<storage, read_write> XH: array<f32>;
@group(0) @binding(2) var<storage, read_write> NW: array<f32>;
@group(0) @binding(3) var<storage, read_write> CACHE: array<u32>;
@group(0) @binding(4) var<storage, read_write> CS: array<f32>;

var<workgroup> row: array<f32, 256>;

@compute @workgroup_size(256)
fn heads(@builtin(local_invocation_index) e: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let hd = P(1u);
    let base = t * P(12u) + h * hd;
    let on = e < hd;
    var v = 0.0;
    if (on) { v = XH[base + e]; }
    if (P(3u) == 1u) {
        let ss = wsum(v * v, e);
        let inv = 1.0 / sqrt(ss / f32(hd) + PF(2u));
        if (on) { v = v * inv * NW[e]; }
    }
    row[e] = v;
    workgroupBarrier();
    let pos = P(7u) + t;
    let dims = P(5u);
    if (on && P(4u) == 1u && e < dims) {
        let half = dims / 2u;
        var i: u32;
        var partner: u32;
        var first: bool;
        if (P(6u) == 1u) {
            first = e < half;
            i = select(e - half, e, first);
            partner = select(e - half, e + half, first);
        } else {
            first = (e & 1u) == 0u;
            i = e / 2u;
            partner = e ^ 1u;
        }
        let c = CS[(pos * half + i) * 2u];
        let s = CS[(pos * half + i) * 2u + 1u];
        let x0 = select(row[partner], v, first);
        let x1 = select(v, row[partner], first);
        v = select(x0 * s + x1 * c, x0 * c - x1 * s, first);
    }
    workgroupBarrier();
    row[e] = v;
    if (on) { XH[base + e] = v; }
    workgroupBarrier();
    if (on && P(10u) == 1u) {
        let idx = P(9u) + (h * P(8u) + pos) * hd + e;
        if (P(11u) == 1u) {
            if ((e & 1u) == 0u) { CACHE[idx >> 1u] = pack2x16float(vec2<f32>(v, row[e + 1u])); }
        } else {
            CACHE[idx] = bitcast<u32>(v);
        }
    }
}
