// out[t] = W x[t] (+ bias), out[t] += W x[t], out[t] = silu(out[t]) * (W x[t]),
// out[t] = silu(W x[t]) * (W2 x[t]) (SwiGLU's gate and up in one pass), or three products
// of one input (q, k, v: W, W2, W3 into OUT, OUT2, OUT3, rows one after the other): one row
// group per ROWS consecutive output rows, its lanes splitting the rows' blocks; grid (row
// tiles, tokens).
//
// Two variants (shaders.rs): `matvec` fuses the RMSNorm and the int8 quantization of x[t]
// into a prologue every workgroup runs into workgroup memory (rows up to MAXC values);
// `matvec_g` reads activations prep.wgsl wrote (longer rows).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 flags (1 bias, 2 norm, 4 quantized x),
//         6 row-group steps a workgroup, 7 groups G (the host's count; groups past it,
//         where subgroups are smaller, stay idle), 8 d_off, 9 s_off, 10 f_off (matvec_g), 11 out_ld,
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
// too): a format's branches fold away. ROWS (1, 2 or 4) rows a row group computes together.
override FMT1: u32 = 0u;
override FMT2: u32 = 0u;
override FMT3: u32 = 0u;
override ROWS: u32 = 1u;
// Lanes a Q4_0 block (1 or 4; device.rs Gpu::q4_lanes).
override QL: u32 = 1u;

// Whether a product of format fmt over row groups of `width` lanes takes a Q4_0 block by
// four lanes (q4_quarter).
fn q4_quarters(fmt: u32, width: u32) -> bool {
    return fmt == FMT_Q4_0 && QL == 4u && width >= 4u && (width & 3u) == 0u;
}

// Rows r0.. of matrix m (0: W, 1: W2, 2: W3; the choice made once, outside the loops).
fn rows_dot(m: u32, r0: u32, last: u32, t: u32, lane: u32, width: u32) -> array<f32, 4> {
    switch m {
        case 1u: { return rows_dot2(FMT2, P(13u), r0, last, t, lane, width); }
        case 2u: { return rows_dot3(FMT3, P(17u), r0, last, t, lane, width); }
        default: { return rows_dot1(FMT1, P(3u), r0, last, t, lane, width); }
    }
}

// Quantized gate and up rows r0.. of W and W2 in one pass over the blocks (two calls of
// rows_dot would load the up rows only after the gate rows): [gate rows, up rows].
fn pair_dot(r0: u32, last: u32, t: u32, lane: u32, width: u32) -> array<f32, 8> {
    let rw = P(3u);
    let rw2 = P(13u);
    let r1 = min(r0 + 1u, last);
    let r2 = min(r0 + 2u, last);
    let r3 = min(r0 + 3u, last);
    var a: array<f32, 8>;
    let nb = P(1u) >> 5u;
    if (q4_quarters(FMT1, width) && FMT2 == FMT_Q4_0) {
        // Four lanes a block (rows_dot's Q4_0 path), gate and up rows together.
        let w = lane & 3u;
        for (var b = lane >> 2u; b < nb; b += width >> 2u) {
            let xw = xpair(t, b, w);
            let dx = xd(t, b);
            let xsum = udot(0x01010101u, xw.x) + udot(0x01010101u, xw.y);
            a[0] += dx * q4_quarter(r0, b, rw, w, xw, xsum);
            a[4] += dx * q4_quarter2(r0, b, rw2, w, xw, xsum);
            if (ROWS >= 2u) {
                a[1] += dx * q4_quarter(r1, b, rw, w, xw, xsum);
                a[5] += dx * q4_quarter2(r1, b, rw2, w, xw, xsum);
            }
            if (ROWS >= 4u) {
                a[2] += dx * q4_quarter(r2, b, rw, w, xw, xsum);
                a[6] += dx * q4_quarter2(r2, b, rw2, w, xw, xsum);
                a[3] += dx * q4_quarter(r3, b, rw, w, xw, xsum);
                a[7] += dx * q4_quarter2(r3, b, rw2, w, xw, xsum);
            }
        }
        return a;
    }
    for (var b = lane; b < nb; b += width) {
        let xa = xblock(t, b);
        let dx = xd(t, b);
        let hs = xs(t, b);
        a[0] += block_dot(FMT1, r0, b, rw, xa, dx, hs);
        a[4] += block_dot2(FMT2, r0, b, rw2, xa, dx, hs);
        if (ROWS >= 2u) {
            a[1] += block_dot(FMT1, r1, b, rw, xa, dx, hs);
            a[5] += block_dot2(FMT2, r1, b, rw2, xa, dx, hs);
        }
        if (ROWS >= 4u) {
            a[2] += block_dot(FMT1, r2, b, rw, xa, dx, hs);
            a[6] += block_dot2(FMT2, r2, b, rw2, xa, dx, hs);
            a[3] += block_dot(FMT1, r3, b, rw, xa, dx, hs);
            a[7] += block_dot2(FMT2, r3, b, rw2, xa, dx, hs);
        }
    }
    return a;
}

fn quantized(fmt: u32) -> bool { return fmt != FMT_F32 && fmt != FMT_F16; }

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32> SG_ARGS) {
    let t = wg.y;
    prologue(li, t);
    let L = LANES_CALL;
    let rows = P(0u);
    let per = P(6u);
    let mode = P(4u);
    for (var it = 0u; it < per; it++) {
        // ROWS consecutive rows of one matrix (MODE_THREE's boundaries are multiples of ROWS).
        let r = ((wg.x * per + it) * P(7u) + L.group) * ROWS;
        let live = r < rows && L.group < P(7u);
        // The matrix of these rows, their first row within it and its rows.
        var m = 0u;
        var rr = r;
        var mrows = rows;
        if (mode == MODE_THREE) {
            if (r >= P(21u)) {
                m = 2u;
                rr = r - P(21u);
                mrows = rows - P(21u);
            } else if (r >= P(20u)) {
                m = 1u;
                rr = r - P(20u);
                mrows = P(21u) - P(20u);
            } else {
                mrows = P(20u);
            }
        }
        var acc: array<f32, 4>;
        var acc2: array<f32, 4>;
        if (live) {
            if (mode == MODE_GATE_UP && quantized(FMT1) && quantized(FMT2)) {
                let a = pair_dot(rr, mrows - 1u, t, L.lane, L.width);
                acc = array<f32, 4>(a[0], a[1], a[2], a[3]);
                acc2 = array<f32, 4>(a[4], a[5], a[6], a[7]);
            } else {
                acc = rows_dot(m, rr, mrows - 1u, t, L.lane, L.width);
                if (mode == MODE_GATE_UP) {
                    acc2 = rows_dot(1u, rr, mrows - 1u, t, L.lane, L.width);
                }
            }
        }
        for (var k = 0u; k < ROWS; k++) {
            let s = gsum(acc[k], li);
            var s2 = 0.0;
            if (mode == MODE_GATE_UP) { s2 = gsum(acc2[k], li); }
            let row = rr + k;
            if (L.lane == 0u && live && row < mrows) {
                var v = s;
                if (((P(22u) >> m) & 1u) != 0u) {
                    switch m {
                        case 1u: { v += BIAS2[row]; }
                        case 2u: { v += BIAS3[row]; }
                        default: { v += BIAS[row]; }
                    }
                }
                if (m == 1u) {
                    OUT2[t * P(18u) + row] = v;
                } else if (m == 2u) {
                    OUT3[t * P(19u) + row] = v;
                } else {
                    let o = t * P(11u) + row;
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
}
