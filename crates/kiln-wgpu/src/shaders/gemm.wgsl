// Prefill: out (n, rows) = X (n, cols) W^T, tiled: a workgroup computes 64 rows x 64 tokens,
// each invocation 4 x 4, over K steps of 16 staged in workgroup memory (weights dequantized
// there, activations as their int8 values times the block scale, or f32 for F32/F16).
// Same modes as matvec. grid (row tiles, token tiles).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 has_bias, 6 n, 7 -,
//         8 d_off, 9 s_off, 10 f_off, 11 out_ld, 12 out_off

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read_write> BIAS: array<f32>;

fn xq(i: u32) -> u32 { return X[i]; }

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> ws: array<f32, 1024>; // [TK][TM]
var<workgroup> xs: array<f32, 1024>; // [TK][TN]

fn xval(fmt: u32, t: u32, c: u32, cols: u32) -> f32 {
    if (fmt == FMT_F32 || fmt == FMT_F16) { return bitcast<f32>(X[P(10u) + t * cols + c]); }
    let nb = cols >> 5u;
    let q = X[t * (cols >> 2u) + (c >> 2u)];
    return i8at(q, c & 3u) * bitcast<f32>(X[P(8u) + t * nb + (c >> 5u)]);
}

@compute @workgroup_size(256)
fn gemm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let rows = P(0u);
    let cols = P(1u);
    let fmt = P(2u);
    let rw = P(3u);
    let n = P(6u);
    let r0 = wg.x * TM;
    let t0 = wg.y * TN;
    let tx = li & 15u; // rows tx, tx + 16, ...
    let ty = li >> 4u; // tokens ty, ty + 16, ...
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) { acc[i] = 0.0; }
    for (var k0 = 0u; k0 < cols; k0 += TK) {
        for (var e = li; e < TK * TM; e += WG) {
            let kk = e / TM;
            let m = e % TM;
            let r = r0 + m;
            let c = k0 + kk;
            var w = 0.0;
            if (r < rows && c < cols) { w = wval(fmt, r, c, cols, rw); }
            ws[kk * TM + m] = w;
            let t = t0 + m;
            var x = 0.0;
            if (t < n && c < cols) { x = xval(fmt, t, c, cols); }
            xs[kk * TN + m] = x;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var wr: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) { wr[i] = ws[kk * TM + tx + 16u * i]; }
            for (var j = 0u; j < 4u; j++) {
                let xv = xs[kk * TN + ty + 16u * j];
                for (var i = 0u; i < 4u; i++) { acc[j * 4u + i] += wr[i] * xv; }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + ty + 16u * j;
        for (var i = 0u; i < 4u; i++) {
            let r = r0 + tx + 16u * i;
            if (t < n && r < rows) {
                let o = P(12u) + t * P(11u) + r;
                var v = acc[j * 4u + i];
                if (P(5u) == 1u) { v += BIAS[r]; }
                switch P(4u) {
                    case 1u: { OUT[o] = OUT[o] + v; }
                    case 2u: { OUT[o] = silu(OUT[o]) * v; }
                    default: { OUT[o] = v; }
                }
            }
        }
    }
}
