// Small kernels: embedding rows, elementwise ops, copies, im2col, argmax.

@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<u32>;

fn fa(i: u32) -> f32 { return bitcast<f32>(A[i]); }
fn fb(i: u32) -> f32 { return bitcast<f32>(B[i]); }

// Grid-stride index over a (x, y) grid of 256-wide workgroups.
fn gidx(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 { return (wg.y * nwg.x + wg.x) * WG + li; }

// A[i] = op(A[i], B[i]) for i < n: params 0 n, 1 op (0 add, 1 silu_mul, 2 scale by PF(2),
// 3 gelu_tanh_mul), 3 a_off, 4 b_off.
@compute @workgroup_size(256)
fn elementwise(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gidx(wg, nwg, li);
    if (i >= P(0u)) { return; }
    let ia = P(3u) + i;
    let ib = P(4u) + i;
    var v: f32;
    switch P(1u) {
        case 0u: { v = fa(ia) + fb(ib); }
        case 1u: { v = silu(fa(ia)) * fb(ib); }
        case 3u: {
            let x = fa(ia);
            let z = clamp(0.7978846 * (x + 0.044715 * x * x * x), -15.0, 15.0);
            v = 0.5 * x * (1.0 + tanh(z)) * fb(ib);
        }
        default: { v = fa(ia) * PF(2u); }
    }
    A[ia] = bitcast<u32>(v);
}

// B[b_off + i] = A[a_off + i] for i < n: params 0 n, 3 a_off, 4 b_off.
@compute @workgroup_size(256)
fn copy(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gidx(wg, nwg, li);
    if (i >= P(0u)) { return; }
    B[P(4u) + i] = A[P(3u) + i];
}

// Rows of width P(1): B[P(4) + r * P(5) + c] = A[P(3) + r * P(2) + c] for r * P(1) + c < P(0).
@compute @workgroup_size(256)
fn copy2d(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gidx(wg, nwg, li);
    if (i >= P(0u)) { return; }
    let r = i / P(1u);
    let c = i % P(1u);
    B[P(4u) + r * P(5u) + c] = A[P(3u) + r * P(2u) + c];
}

// B (t_out, c_in * k) = im2col of A (t_in, c_in): column c * k + j of row t is
// A[t * stride + j - pad][c], zero outside. params 0 n, 1 t_in, 2 c_in, 3 k, 4 stride, 5 pad.
@compute @workgroup_size(256)
fn im2col(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gidx(wg, nwg, li);
    if (i >= P(0u)) { return; }
    let ck = P(2u) * P(3u);
    let t = i / ck;
    let col = i % ck;
    let c = col / P(3u);
    let j = col % P(3u);
    let src = i32(t * P(4u) + j) - i32(P(5u));
    var v = 0u;
    if (src >= 0 && src < i32(P(1u))) { v = A[u32(src) * P(2u) + c]; }
    B[i] = v;
}

var<workgroup> best_i: array<u32, 256>;
var<workgroup> best_v: array<f32, 256>;

// Whether (ov, oi) beats (v, i): larger, or as large at a smaller index; index 0xffffffff
// holds nothing (a NaN or an empty range).
fn beats(ov: f32, oi: u32, v: f32, i: u32) -> bool {
    return oi != 0xffffffffu && (i == 0xffffffffu || ov > v || (ov == v && oi < i));
}

// The best of the workgroup's (bv, bi) in best_v[0], best_i[0].
fn best_of_workgroup(bv: f32, bi: u32, li: u32) {
    best_v[li] = bv;
    best_i[li] = bi;
    for (var s = 128u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (li < s && beats(best_v[li + s], best_i[li + s], best_v[li], best_i[li])) {
            best_v[li] = best_v[li + s];
            best_i[li] = best_i[li + s];
        }
    }
    workgroupBarrier();
}

// Greedy sampling in two passes, so a long row is read by many workgroups at once.
// argmax: workgroup (part, row) takes columns part * chunk .. + chunk of row (cols = P(0),
// chunk = P(1), parts = P(2)) and writes its best (value bits, index) to B[2 * (row * parts
// + part)]; NaN never wins.
@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let cols = P(0u);
    let c0 = wg.x * P(1u);
    let c1 = min(cols, c0 + P(1u));
    let base = wg.y * cols;
    var bv = NEG_INF;
    var bi = 0xffffffffu;
    for (var c = c0 + li; c < c1; c += WG) {
        let v = fa(base + c);
        if (v == v && (bi == 0xffffffffu || v > bv)) { bv = v; bi = c; }
    }
    best_of_workgroup(bv, bi, li);
    if (li == 0u) {
        let o = 2u * (wg.y * P(2u) + wg.x);
        B[o] = bitcast<u32>(best_v[0]);
        B[o + 1u] = best_i[0];
    }
}

// argmax_final: workgroup `row` merges its P(2) parts into B[P(3) + row] (index 0 for a row
// of NaNs).
@compute @workgroup_size(256)
fn argmax_final(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let parts = P(2u);
    var bv = NEG_INF;
    var bi = 0xffffffffu;
    for (var k = li; k < parts; k += WG) {
        let o = 2u * (wg.x * parts + k);
        let ov = bitcast<f32>(B[o]);
        let oi = B[o + 1u];
        if (beats(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    best_of_workgroup(bv, bi, li);
    if (li == 0u) { B[P(3u) + wg.x] = select(best_i[0], 0u, best_i[0] == 0xffffffffu); }
}
