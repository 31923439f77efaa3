// out[t] = W x[t] (+ bias), out[t] += W x[t], out[t] = silu(out[t]) * (W x[t]),
// out[t] = silu(W x[t]) * (W2 x[t]) (SwiGLU's gate and up in one pass), or three products
// of one input (q, k, v: W, W2, W3 into OUT, OUT2, OUT3, rows one after the other): one row
// group per output row, its lanes splitting the row's blocks; grid (row tiles, tokens).
//
// Two variants (shaders.rs): `matvec` fuses the RMSNorm and the int8 quantization of x[t]
// into a prologue every workgroup runs into workgroup memory (rows up to MAXC values);
// `matvec_g` reads activations prep.wgsl wrote (longer rows).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 flags (1 bias, 2 norm, 4 quantized x),
//         6 rows per group, 7 groups G (the host's count; groups past it, where subgroups
//         are smaller, stay idle), 8 d_off, 9 s_off, 10 f_off (matvec_g), 11 out_ld,
//         12 fmt2, 13 rw2, 14 x_ld (matvec), 15 eps, 16 fmt3, 17 rw3, 18 out_ld2,
//         19 out_ld3, 20 first row of W2, 21 first row of W3 (MODE_THREE), 22 bias bits

ROW_DOTS

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> W2: array<u32>;
@group(0) @binding(3) var<storage, read_write> X: array<u32>;
@group(0) @binding(4) var<storage, read_write> NW: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(6) var<storage, read_write> BIAS: array<f32>;
@group(0) @binding(7) var<storage, read_write> W3: array<u32>;
@group(0) @binding(8) var<storage, read_write> OUT2: array<f32>;
@group(0) @binding(9) var<storage, read_write> OUT3: array<f32>;
@group(0) @binding(10) var<storage, read_write> BIAS2: array<f32>;
@group(0) @binding(11) var<storage, read_write> BIAS3: array<f32>;

const MODE_STORE: u32 = 0u;
const MODE_ADD: u32 = 1u;
const MODE_SILU_MUL: u32 = 2u;
const MODE_GATE_UP: u32 = 3u;
const MODE_THREE: u32 = 4u;

VARIANT

// The pipeline is specialised on the formats of W, W2, W3 (params 2, 12, 16 hold them
// too): a format's branches fold away.
override FMT1: u32 = 0u;
override FMT2: u32 = 0u;
override FMT3: u32 = 0u;

// Row r of matrix m (0: W, 1: W2, 2: W3) dotted with token t's activations, this lane's
// part (the choice of matrix made once per row, outside the loops).
fn row_dot(m: u32, r: u32, t: u32, lane: u32, width: u32) -> f32 {
    switch m {
        case 1u: { return row_dot2(FMT2, P(13u), r, t, lane, width); }
        case 2u: { return row_dot3(FMT3, P(17u), r, t, lane, width); }
        default: { return row_dot1(FMT1, P(3u), r, t, lane, width); }
    }
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
        // The matrix of this row and the row within it.
        var m = 0u;
        var rr = r;
        if (mode == MODE_THREE) {
            if (r >= P(21u)) { m = 2u; rr = r - P(21u); } else if (r >= P(20u)) { m = 1u; rr = r - P(20u); }
        }
        var acc = 0.0;
        var acc2 = 0.0;
        if (live) {
            acc = row_dot(m, rr, t, L.lane, L.width);
            if (mode == MODE_GATE_UP) { acc2 = row_dot(1u, rr, t, L.lane, L.width); }
        }
        let s = gsum(acc, li);
        var s2 = 0.0;
        if (mode == MODE_GATE_UP) { s2 = gsum(acc2, li); }
        if (L.lane == 0u && live) {
            var v = s;
            if (((P(22u) >> m) & 1u) != 0u) {
                switch m {
                    case 1u: { v += BIAS2[rr]; }
                    case 2u: { v += BIAS3[rr]; }
                    default: { v += BIAS[rr]; }
                }
            }
            if (m == 1u) {
                OUT2[t * P(18u) + rr] = v;
            } else if (m == 2u) {
                OUT3[t * P(19u) + rr] = v;
            } else {
                let o = t * P(11u) + rr;
                switch mode {
                    case 1u: { OUT[o] = OUT[o] + v; }
                    case 2u: { OUT[o] = silu(OUT[o]) * v; }
                    case 3u: { OUT[o] = silu(s) * s2; }
                    default: { OUT[o] = v; }
                }
            }
        }
    }
}
