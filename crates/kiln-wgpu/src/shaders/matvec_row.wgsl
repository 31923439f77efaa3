// One matrix's row dot (matvec.wgsl), instantiated per weight buffer (shaders.rs: `_S` ->
// 1, 2, 3 over wval/block_dot of W, W2, W3).
fn row_dot_S(fmt: u32, rw: u32, r: u32, t: u32, lane: u32, width: u32) -> f32 {
    let cols = P(1u);
    var acc = 0.0;
    if (fmt == FMT_F32 || fmt == FMT_F16) {
        for (var c = lane; c < cols; c += width) { acc += wval_W(fmt, r, c, cols, rw) * xf(t, c); }
        return acc;
    }
    let nb = cols >> 5u;
    for (var b = lane; b < nb; b += width) {
        acc += block_dot_W(fmt, r, b, rw, xqo(t, b), xd(t, b), xs(t, b));
    }
    return acc;
}
