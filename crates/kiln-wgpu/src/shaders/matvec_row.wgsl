// One matrix's row dots (matvec.wgsl), instantiated per weight buffer (shaders.rs: `_S` ->
// 1, 2, 3 over wval/block_dot of W, W2, W3): rows r0..r0 + ROWS - 1 (indices past `last`
// read row `last`; the caller drops them) dotted with token t's activations, this lane's
// part. The rows are written out, not looped over, so that their loads are in flight
// together (a loop over them compiles to one row after another); each activation block is
// read once for all of them.
fn rows_dot_S(fmt: u32, rw: u32, r0: u32, last: u32, t: u32, lane: u32,
              width: u32) -> array<f32, 4> {
    let cols = P(1u);
    let r1 = min(r0 + 1u, last);
    let r2 = min(r0 + 2u, last);
    let r3 = min(r0 + 3u, last);
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    if (fmt == FMT_F32 || fmt == FMT_F16) {
        for (var c = lane; c < cols; c += width) {
            let x = xf(t, c);
            a0 += wval_W(fmt, r0, c, cols, rw) * x;
            if (ROWS >= 2u) { a1 += wval_W(fmt, r1, c, cols, rw) * x; }
            if (ROWS >= 4u) {
                a2 += wval_W(fmt, r2, c, cols, rw) * x;
                a3 += wval_W(fmt, r3, c, cols, rw) * x;
            }
        }
    } else if (q4_quarters(fmt, width)) {
        // Four lanes a block, a word of nibbles each: a subgroup's loads of a row are
        // consecutive words (a lane a block spaced them a block apart).
        let w = lane & 3u;
        let nb = cols >> 5u;
        for (var b = lane >> 2u; b < nb; b += width >> 2u) {
            let xw = xpair(t, b, w);
            let dx = xd(t, b);
            let xsum = udot(0x01010101u, xw.x) + udot(0x01010101u, xw.y);
            a0 += dx * q4_quarter_W(r0, b, rw, w, xw, xsum);
            if (ROWS >= 2u) { a1 += dx * q4_quarter_W(r1, b, rw, w, xw, xsum); }
            if (ROWS >= 4u) {
                a2 += dx * q4_quarter_W(r2, b, rw, w, xw, xsum);
                a3 += dx * q4_quarter_W(r3, b, rw, w, xw, xsum);
            }
        }
    } else {
        let nb = cols >> 5u;
        for (var b = lane; b < nb; b += width) {
            let xa = xblock(t, b);
            let dx = xd(t, b);
            let hs = xs(t, b);
            a0 += block_dot_W(fmt, r0, b, rw, xa, dx, hs);
            if (ROWS >= 2u) { a1 += block_dot_W(fmt, r1, b, rw, xa, dx, hs); }
            if (ROWS >= 4u) {
                a2 += block_dot_W(fmt, r2, b, rw, xa, dx, hs);
                a3 += block_dot_W(fmt, r3, b, rw, xa, dx, hs);
            }
        }
    }
    return array<f32, 4>(a0, a1, a2, a3);
}
