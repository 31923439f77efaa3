// Small kernels: embedding rows, elementwise ops, copies, im2col, argmax.

@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<u32>;

fn fa(i: u32) -> f32 { return bitcast<f32>(A[i]); }
fn fb(i: u32) -> f32 { return bitcast<f32>(B[i]); }

// Grid-stride index over a (x, y) grid of 256-wide workgroups.
fn gidx(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 { return (wg.y * nwg.x + wg.x) * WG + li; }

// A[i] = op(A[i], B[i]) for i < n: params 0 n, 1 op (0 add, 1 silu_mul, 2 scale by PF(2)),
// 3 a_off, 4 b_off.
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

// B[row] = the first index of the largest value of A's row (cols = P(0)); NaN never wins.
@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let cols = P(0u);
    let base = wg.x * cols;
    var bv = NEG_INF;
    var bi = 0xffffffffu;
    for (var c = li; c < cols; c += WG) {
        let v = fa(base + c);
        if (v == v && (bi == 0xffffffffu || v > bv)) { bv = v; bi = c; }
    }
    best_v[li] = bv;
    best_i[li] = bi;
    for (var s = 128u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (li < s) {
            let ov = best_v[li + s];
            let oi = best_i[li + s];
            let mine = best_i[li];
            if (oi != 0xffffffffu && (mine == 0xffffffffu || ov > best_v[li] || (ov == best_v[li] && oi < mine))) {
                best_v[li] = ov;
                best_i[li] = oi;
            }
        }
    }
    workgroupBarrier();
    if (li == 0u) { B[wg.x] = select(best_i[0], 0u, best_i[0] == 0xffffffffu); }
}
