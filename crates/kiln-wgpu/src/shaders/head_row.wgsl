// A head row's RMSNorm and RoPE with one value per invocation e (those below hd live), for
// the modules that prepend this file (heads, attention); they declare the workgroup array
// `row` (256) and the cos/sin table CS (positions x pairs of (cos, sin), computed on the
// host as the CPU backend computes them). v is invocation e's value, w its norm weight; the
// rotation is at position pos over the first `dims` values (NeoX halves or interleaved
// pairs). Every invocation calls it (barriers; norm and rope the same for all); it returns
// e's new value and leaves the whole row in `row`.
fn norm_rope(e: u32, v_in: f32, w: f32, hd: u32, norm: bool, eps: f32, rope: bool, dims: u32,
             neox: bool, pos: u32) -> f32 {
    let on = e < hd;
    var v = select(0.0, v_in, on);
    workgroupBarrier();
    if (norm) {
        let ss = wsum(v * v, e);
        let inv = 1.0 / sqrt(ss / f32(hd) + eps);
        if (on) { v = v * inv * w; }
    }
    row[e] = v;
    workgroupBarrier();
    if (on && rope && e < dims) {
        let half = dims / 2u;
        var i: u32;
        var partner: u32;
        var first: bool;
        if (neox) {
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
    workgroupBarrier();
    return v;
}
