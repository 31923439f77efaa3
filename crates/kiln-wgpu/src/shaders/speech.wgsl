// Whisper's own ops: layer norm, GELU (erf), attention without a cache (encoder
// self-attention, decoder cross-attention). Rows are row-major f32.

@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> BT: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

// O[r] = (X[r] - mean) / sqrt(var + eps) * G + BT, one workgroup per row (x + y * 65535):
// the mean, then the centred sum of squares, as the CPU backend.
// params: 0 cols, 1 eps, 2 rows
@compute @workgroup_size(256)
fn layer_norm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let cols = P(0u);
    let row = wg.y * nwg.x + wg.x;
    if (row >= P(2u)) { return; }
    let base = row * cols;
    let mr = row_moments(base, cols, PF(1u), li);
    for (var c = li; c < cols; c += WG) { O[base + c] = (X[base + c] - mr.x) * mr.y * G[c] + BT[c]; }
}

// (mean, 1 / sqrt(variance + eps)) of X[base..base + cols], the workgroup's invocations
// together: the mean, then the centred sum of squares, as the CPU backend.
fn row_moments(base: u32, cols: u32, eps: f32, li: u32) -> vec2<f32> {
    var s = 0.0;
    for (var c = li; c < cols; c += WG) { s += X[base + c]; }
    let mean = wsum(s, li) / f32(cols);
    var ss = 0.0;
    for (var c = li; c < cols; c += WG) {
        let d = X[base + c] - mean;
        ss += d * d;
    }
    return vec2<f32>(mean, 1.0 / sqrt(wsum(ss, li) / f32(cols) + eps));
}

// erf(x), |error| < 1.2e-7 (a Chebyshev-fitted form of erfc: Numerical Recipes' erfcc).
fn erf(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let r = 1.0 - t * exp(p);
    return select(-r, r, x >= 0.0);
}

// X[i] = X[i] / 2 * (1 + erf(X[i] / sqrt(2))) for i < P(0), in place.
@compute @workgroup_size(256)
fn gelu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let v = X[i];
    X[i] = 0.5 * v * (1.0 + erf(v * 0.70710678118654752));
}

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 3072>;
var<workgroup> part: array<f32, 256>;

// O (n_q, heads * hd) = softmax(q k^T * scale) v over keys 0..n_kv (causal: 0..=t + n_kv -
// n_q), X = q, G = k, BT = v. Workgroup (query, head) of 256: every key's score in workgroup
// memory (n_kv <= 3072, within the 16 KiB every adapter has), the max and sum over the workgroup, then p.V by 256 / hd key groups x
// hd lanes (hd <= 256), summed over the groups.
// params: 0 heads, 1 hd, 2 n_q, 3 n_kv, 4 causal, 5 scale
@compute @workgroup_size(256)
fn attn_dense(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = wg.x;
    let h = wg.y;
    let hd = P(1u);
    let ld = P(0u) * hd;
    let n_kv = P(3u);
    var nk = n_kv;
    if (P(4u) == 1u) { nk = t + n_kv - P(2u) + 1u; }
    if (li < hd) { qs[li] = X[t * ld + h * hd + li] * PF(5u); }
    workgroupBarrier();
    var mx = NEG_INF;
    for (var j = li; j < nk; j += WG) {
        let kb = j * ld + h * hd;
        var a0 = 0.0;
        var a1 = 0.0;
        var e = 0u;
        for (; e + 1u < hd; e += 2u) {
            a0 += qs[e] * G[kb + e];
            a1 += qs[e + 1u] * G[kb + e + 1u];
        }
        if (e < hd) { a0 += qs[e] * G[kb + e]; }
        sc[j] = a0 + a1;
        mx = max(mx, a0 + a1);
    }
    let m = wmax(mx, li);
    var ls = 0.0;
    for (var j = li; j < nk; j += WG) {
        let p = exp(sc[j] - m);
        sc[j] = p;
        ls += p;
    }
    let l = wsum(ls, li);
    let groups = WG / hd;
    let g = li / hd;
    let d = li % hd;
    var a = 0.0;
    if (g < groups) {
        for (var j = g; j < nk; j += groups) { a += sc[j] * BT[j * ld + h * hd + d]; }
    }
    part[li] = a;
    workgroupBarrier();
    if (li < hd) {
        var s = 0.0;
        for (var k = 0u; k < groups; k++) { s += part[k * hd + li]; }
        O[t * ld + h * hd + li] = s / l;
    }
}

// ---- Kokoro's feature maps: (channels, len) row-major, an invocation a value ----

// X[i] += sin(a X[i])^2 / a, a = G[i / len] (snake): as the CPU, (1 / a) s s.
// params: 0 n (channels * len), 1 len
@compute @workgroup_size(256)
fn snake(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let a = G[i / P(1u)];
    let v = X[i];
    let s = sin(a * v);
    X[i] = v + (1.0 / a) * s * s;
}

// X[i] *= slope where X[i] < 0 (leaky ReLU: one IEEE product, the CPU's bits).
// params: 0 n, 1 slope (f32 bits)
@compute @workgroup_size(256)
fn leaky_relu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let v = X[i];
    X[i] = select(v, v * PF(1u), v < 0.0);
}

// X[i] = 0.5 X[i] (1 + tanh(sqrt(2 / pi) (X[i] + 0.044715 X[i]^3))) (GELU, tanh form).
// params: 0 n
@compute @workgroup_size(256)
fn gelu_tanh(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let x = X[i];
    let z = clamp(0.7978846 * (x + 0.044715 * x * x * x), -15.0, 15.0);
    X[i] = 0.5 * x * (1.0 + tanh(z));
}

// O (cols, rows) = X (rows, cols) transposed. params: 0 n (rows * cols), 1 rows, 2 cols
@compute @workgroup_size(256)
fn transpose(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let r = i / P(2u);
    let c = i % P(2u);
    O[c * P(1u) + r] = X[i];
}

// O (c, len * factor): every value of X (c, len) repeated `factor` times along its row.
// params: 0 n (c * len * factor), 1 len, 2 factor
@compute @workgroup_size(256)
fn upsample_nearest(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wg.y * nwg.x + wg.x) * WG + li;
    if (i >= P(0u)) { return; }
    let wide = P(1u) * P(2u);
    let ch = i / wide;
    O[i] = X[ch * P(1u) + (i % wide) / P(2u)];
}

// Each of `rows` rows of X (rows, cols) normalised to zero mean and unit variance (the mean,
// then the centred sum of squares), in place, then by mode: 0 (layer_norm_rows) times G[c]
// where P(4) and plus BT[c] where P(5); 1 (ada_in, a row a channel) (1 + G[row]) y +
// G[rows + row]; 2 (ada_layer_norm, a row a time step) (1 + G[c]) y + G[cols + c]. One
// workgroup a row (x + y * 65535).
// params: 0 rows, 1 cols, 2 eps (f32 bits), 3 mode, 4 has w, 5 has b
@compute @workgroup_size(256)
fn norm_rows(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = P(0u);
    let cols = P(1u);
    let row = wg.y * nwg.x + wg.x;
    if (row >= rows) { return; }
    let base = row * cols;
    let mr = row_moments(base, cols, PF(2u), li);
    let mode = P(3u);
    for (var c = li; c < cols; c += WG) {
        let y = (X[base + c] - mr.x) * mr.y;
        var v = y;
        if (mode == 1u) {
            v = (1.0 + G[row]) * y + G[rows + row];
        } else if (mode == 2u) {
            v = (1.0 + G[c]) * y + G[cols + c];
        } else {
            if (P(4u) == 1u) { v = v * G[c]; }
            if (P(5u) == 1u) { v = v + BT[c]; }
        }
        X[base + c] = v;
    }
}
