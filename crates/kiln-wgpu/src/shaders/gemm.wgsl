// Prefill: out (n, rows) = X (n, cols) W^T, tiled: a workgroup of 64 invocations computes 64
// rows x 64 tokens, each invocation an 8 x 8 block of them held in registers, over K steps of
// one 32-value block staged in workgroup memory. Staging: invocation m dequantizes row m's
// block (4 x wdeq8) and reads token m's activations (int8 values times the block scale, or
// f32 for F32/F16 weights) into registers a step ahead, and stores them K-major, so that a
// step reads two vec4 of rows and two of tokens per 64 multiply-adds. Same modes as matvec
// (but not MODE_GATE_UP).
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

// [TK][TM / 4] and [TK][TN / 4]: value k of rows (tokens) 4i..4i+3 at [k * 16 + i].
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

@compute @workgroup_size(64)
fn gemm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let rows = P(0u);
    let cols = P(1u);
    let fmt = FMT1;
    let rw = P(3u);
    let n = P(6u);
    let float = fmt == FMT_F32 || fmt == FMT_F16;
    let r0 = wg.x * TM;
    let t0 = wg.y * TN;
    let tx = li & 7u; // rows 8tx..8tx+7
    let ty = li >> 3u; // tokens 8ty..8ty+7
    // Staging: invocation li holds row r0 + li and token t0 + li of the step.
    let r = r0 + li;
    let t = t0 + li;
    let nb = cols >> 5u;
    let sv = li >> 2u; // the vec4 of the staged row (token)
    let sc = li & 3u;
    var acc: array<vec4<f32>, 16>; // [token j][rows 0-3, 4-7]
    for (var i = 0u; i < 16u; i++) { acc[i] = vec4<f32>(0.0); }
    // The next step's values, loaded before this step's products so that their reads are
    // in flight while it computes.
    var wv: array<f32, 32>;
    var xv: array<f32, 32>;
    stage(fmt, float, r, t, rows, n, cols, nb, rw, 0u, &wv, &xv);
    for (var k0 = 0u; k0 < cols; k0 += TK) {
        for (var k = 0u; k < TK; k++) {
            ws[k * 16u + sv][sc] = wv[k];
            xs[k * 16u + sv][sc] = xv[k];
        }
        workgroupBarrier();
        if (k0 + TK < cols) {
            stage(fmt, float, r, t, rows, n, cols, nb, rw, k0 + TK, &wv, &xv);
        }
        for (var kk = 0u; kk < TK; kk++) {
            let w0 = ws[kk * 16u + 2u * tx];
            let w1 = ws[kk * 16u + 2u * tx + 1u];
            let x0 = xs[kk * 16u + 2u * ty];
            let x1 = xs[kk * 16u + 2u * ty + 1u];
            for (var j = 0u; j < 4u; j++) {
                acc[2u * j] = fma(vec4<f32>(x0[j]), w0, acc[2u * j]);
                acc[2u * j + 1u] = fma(vec4<f32>(x0[j]), w1, acc[2u * j + 1u]);
                acc[2u * j + 8u] = fma(vec4<f32>(x1[j]), w0, acc[2u * j + 8u]);
                acc[2u * j + 9u] = fma(vec4<f32>(x1[j]), w1, acc[2u * j + 9u]);
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < 8u; j++) {
        let t = t0 + 8u * ty + j;
        if (t >= n) { break; }
        for (var i = 0u; i < 8u; i++) {
            let r = r0 + 8u * tx + i;
            if (r < rows) {
                let o = t * P(11u) + r;
                var v = acc[2u * j + (i >> 2u)][i & 3u];
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

// Values k0..k0+31 of row r of W (zeros past the rows) and of token t's activations (zeros
// past the tokens).
fn stage(
    fmt: u32,
    float: bool,
    r: u32,
    t: u32,
    rows: u32,
    n: u32,
    cols: u32,
    nb: u32,
    rw: u32,
    k0: u32,
    wv: ptr<function, array<f32, 32>>,
    xv: ptr<function, array<f32, 32>>,
) {
    if (float) {
        for (var k = 0u; k < TK; k++) {
            let c = k0 + k;
            var w = 0.0;
            var x = 0.0;
            if (r < rows && c < cols) { w = wval(fmt, r, c, cols, rw); }
            if (t < n && c < cols) { x = bitcast<f32>(X[P(10u) + t * cols + c]); }
            (*wv)[k] = w;
            (*xv)[k] = x;
        }
        return;
    }
    let b = k0 >> 5u;
    let d = select(0.0, bitcast<f32>(X[P(8u) + min(t, n - 1u) * nb + b]), t < n);
    for (var p = 0u; p < 4u; p++) {
        var w8: array<f32, 8>;
        if (r < rows) { w8 = wdeq8(fmt, r, b, p, rw); }
        let q = min(t, n - 1u) * (cols >> 2u) + b * 8u + 2u * p;
        let q0 = X[q];
        let q1 = X[q + 1u];
        for (var i = 0u; i < 4u; i++) {
            (*wv)[8u * p + i] = w8[i];
            (*wv)[8u * p + i + 4u] = w8[i + 4u];
            (*xv)[8u * p + i] = i8at(q0, i) * d;
            (*xv)[8u * p + i + 4u] = i8at(q1, i) * d;
        }
    }
}
