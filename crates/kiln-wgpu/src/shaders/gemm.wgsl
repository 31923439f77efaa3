// Prefill: out (n, rows) = X (n, cols) W^T, tiled: a workgroup computes 64 rows x 64 tokens,
// each invocation 4 x 4, over K steps of one 32-block staged in workgroup memory (weights
// dequantized there 8 values per invocation, activations as their int8 values times the
// block scale, or f32 for F32/F16). Same modes as matvec (but not MODE_GATE_UP).
// grid (row tiles, token tiles).
// params: 0 rows, 1 cols, 2 fmt, 3 rw, 4 mode, 5 has_bias, 6 n, 7 -,
//         8 d_off, 9 s_off, 10 f_off, 11 out_ld

@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read_write> BIAS: array<f32>;

// The pipeline is specialised on W's format (param 2 holds it too).
override FMT1: u32 = 0u;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 32u;

var<workgroup> ws: array<f32, 2048>; // [TK][TM]
var<workgroup> xs: array<f32, 2048>; // [TK][TN]

@compute @workgroup_size(256)
fn gemm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let rows = P(0u);
    let cols = P(1u);
    let fmt = FMT1;
    let rw = P(3u);
    let n = P(6u);
    let float = fmt == FMT_F32 || fmt == FMT_F16;
    let r0 = wg.x * TM;
    let t0 = wg.y * TN;
    let tx = li & 15u; // rows tx, tx + 16, ...
    let ty = li >> 4u; // tokens ty, ty + 16, ...
    // Staging: invocation li loads values 8p..8p+7 of row (token) m of the K step.
    let m = li >> 2u;
    let p = li & 3u;
    let r = r0 + m;
    let t = t0 + m;
    let nb = cols >> 5u;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) { acc[i] = 0.0; }
    for (var k0 = 0u; k0 < cols; k0 += TK) {
        if (float) {
            for (var i = 0u; i < 8u; i++) {
                let c = k0 + 8u * p + i;
                var w = 0.0;
                var x = 0.0;
                if (r < rows && c < cols) { w = wval(fmt, r, c, cols, rw); }
                if (t < n && c < cols) { x = bitcast<f32>(X[P(10u) + t * cols + c]); }
                ws[(8u * p + i) * TM + m] = w;
                xs[(8u * p + i) * TN + m] = x;
            }
        } else {
            let b = k0 >> 5u;
            var wv: array<f32, 8>;
            if (r < rows) { wv = wdeq8(fmt, r, b, p, rw); }
            var xv: array<f32, 8>;
            if (t < n) {
                let d = bitcast<f32>(X[P(8u) + t * nb + b]);
                let q0 = X[t * (cols >> 2u) + b * 8u + 2u * p];
                let q1 = X[t * (cols >> 2u) + b * 8u + 2u * p + 1u];
                for (var i = 0u; i < 4u; i++) {
                    xv[i] = i8at(q0, i) * d;
                    xv[i + 4u] = i8at(q1, i) * d;
                }
            }
            for (var i = 0u; i < 8u; i++) {
                ws[(8u * p + i) * TM + m] = wv[i];
                xs[(8u * p + i) * TN + m] = xv[i];
            }
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
                let o = t * P(11u) + r;
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
