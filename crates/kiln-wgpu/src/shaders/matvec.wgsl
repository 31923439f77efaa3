// out[t] = W x[t] (+ bias), out[t] += W x[t], or out[t] = silu(out[t]) * (W x[t]) (the up
// half of SwiGLU after the gate's product was stored): one row group per output row, its
// lanes splitting the row's blocks; grid (row tiles, tokens).
//
// The activations X are prep.wgsl's: int8 blocks (quantized formats) or f32 (F32/F16).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 has_bias, 6 rows per group, 7 groups G
//         (the host's count; groups past it, where subgroups are smaller, stay idle),
//         8 d_off, 9 s_off, 10 f_off, 11 out_ld, 12 out_off

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read_write> BIAS: array<f32>;

fn row_dot(fmt: u32, r: u32, t: u32, cols: u32, rw: u32, lane: u32, width: u32) -> f32 {
    var acc = 0.0;
    if (fmt == FMT_F32 || fmt == FMT_F16) {
        let xf = P(10u) + t * cols;
        for (var c = lane; c < cols; c += width) {
            acc += wval(fmt, r, c, cols, rw) * bitcast<f32>(X[xf + c]);
        }
        return acc;
    }
    let nb = cols >> 5u;
    for (var b = lane; b < nb; b += width) {
        let blk = t * nb + b;
        acc += block_dot(fmt, r, b, rw, t * (cols >> 2u) + b * 8u, bitcast<f32>(X[P(8u) + blk]),
                         X[P(9u) + blk]);
    }
    return acc;
}

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32> SG_ARGS) {
    let L = LANES_CALL;
    let rows = P(0u);
    let per = P(6u);
    let t = wg.y;
    for (var it = 0u; it < per; it++) {
        let r = (wg.x * per + it) * P(7u) + L.group;
        let live = r < rows && L.group < P(7u);
        var acc = 0.0;
        if (live) { acc = row_dot(P(2u), r, t, P(1u), P(3u), L.lane, L.width); }
        let s = gsum(acc, li);
        if (L.lane == 0u && live) {
            let o = P(12u) + t * P(11u) + r;
            var v = s;
            if (P(5u) == 1u) { v += BIAS[r]; }
            switch P(4u) {
                case 1u: { OUT[o] = OUT[o] + v; }
                case 2u: { OUT[o] = silu(OUT[o]) * v; }
                default: { OUT[o] = v; }
            }
        }
    }
}
