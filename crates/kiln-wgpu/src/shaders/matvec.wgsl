// out[t] = W x[t] (+ bias), out[t] += W x[t], out[t] = silu(out[t]) * (W x[t]), or
// out[t] = silu(W x[t]) * (W2 x[t]) (SwiGLU's gate and up in one pass): one row group per
// output row, its lanes splitting the row's blocks; grid (row tiles, tokens).
//
// Two variants (shaders.rs): `matvec` fuses the RMSNorm and the int8 quantization of x[t]
// into a prologue every workgroup runs into workgroup memory (rows up to MAXC values);
// `matvec_g` reads activations prep.wgsl wrote (longer rows).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 flags (1 bias, 2 norm, 4 quantized x),
//         6 rows per group, 7 groups G (the host's count; groups past it, where subgroups
//         are smaller, stay idle), 8 d_off, 9 s_off, 10 f_off (matvec_g), 11 out_ld,
//         12 fmt2, 13 rw2, 14 x_ld (matvec), 15 eps

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> W2: array<u32>;
@group(0) @binding(3) var<storage, read_write> X: array<u32>;
@group(0) @binding(4) var<storage, read_write> NW: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(6) var<storage, read_write> BIAS: array<f32>;

const MODE_STORE: u32 = 0u;
const MODE_ADD: u32 = 1u;
const MODE_SILU_MUL: u32 = 2u;
const MODE_GATE_UP: u32 = 3u;

VARIANT

fn row_dot(second: bool, r: u32, t: u32, lane: u32, width: u32) -> f32 {
    let cols = P(1u);
    let fmt = select(P(2u), P(12u), second);
    let rw = select(P(3u), P(13u), second);
    var acc = 0.0;
    if (fmt == FMT_F32 || fmt == FMT_F16) {
        for (var c = lane; c < cols; c += width) {
            var w: f32;
            if (second) { w = wval2(fmt, r, c, cols, rw); } else { w = wval(fmt, r, c, cols, rw); }
            acc += w * xf(t, c);
        }
        return acc;
    }
    let nb = cols >> 5u;
    for (var b = lane; b < nb; b += width) {
        if (second) {
            acc += block_dot2(fmt, r, b, rw, xqo(t, b), xd(t, b), xs(t, b));
        } else {
            acc += block_dot(fmt, r, b, rw, xqo(t, b), xd(t, b), xs(t, b));
        }
    }
    return acc;
}

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32> SG_ARGS) {
    let t = wg.y;
    prologue(li, t);
    let L = LANES_CALL;
    let rows = P(0u);
    let per = P(6u);
    let mode = P(4u);
    for (var it = 0u; it < per; it++) {
        let r = (wg.x * per + it) * P(7u) + L.group;
        let live = r < rows && L.group < P(7u);
        var acc = 0.0;
        var acc2 = 0.0;
        if (live) {
            acc = row_dot(false, r, t, L.lane, L.width);
            if (mode == MODE_GATE_UP) { acc2 = row_dot(true, r, t, L.lane, L.width); }
        }
        let s = gsum(acc, li);
        var s2 = 0.0;
        if (mode == MODE_GATE_UP) { s2 = gsum(acc2, li); }
        if (L.lane == 0u && live) {
            let o = t * P(11u) + r;
            var v = s;
            if ((P(5u) & 1u) != 0u) { v += BIAS[r]; }
            switch mode {
                case 1u: { OUT[o] = OUT[o] + v; }
                case 2u: { OUT[o] = silu(OUT[o]) * v; }
                case 3u: { OUT[o] = silu(s) * s2; }
                default: { OUT[o] = v; }
            }
        }
    }
}
