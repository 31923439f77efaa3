// Kokoro's signal ops over (channels, len) feature maps, the CPU backend's arithmetic
// (crates/kiln-backend/src/cpu/ops) in f32: a convolution as a tiled product over its taps
// (the im2col read in place), grouped ones a thread per output, a transposed one as a
// product then a gather of its taps; the uint8 rounding of the int8 export; the STFT and its
// inverse from a host-made table of cos, sin and the window.

@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> W: array<f32>;
@group(0) @binding(3) var<storage, read_write> B: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

// The 1-D index of a grid_1d dispatch.
fn flat(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * WG + li;
}

// a / b rounded as IEEE division (WGSL allows 2.5 ULP, and a compiler may multiply by the
// reciprocal and fold a correction away): of the quotient and its four nearest floats, the
// one whose exact remainder (fma) is least. The uint8 grid must match the CPU's value for
// value. (No ties: a quotient halfway between floats needs 25 bits of a times b.)
fn div_rn(a: f32, b: f32) -> f32 {
    let q = a / b;
    var best = q;
    var err = abs(fma(q, b, -a));
    for (var d = -2; d <= 2; d++) {
        let c = bitcast<f32>(bitcast<i32>(q) + d);
        let e = abs(fma(c, b, -a));
        if (e < err) {
            best = c;
            err = e;
        }
    }
    return best;
}

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

// [TK][TM / 4] and [TK][TN / 4]: value k of rows (columns) 4i..4i+3 at [k * 16 + i].
var<workgroup> as4: array<vec4<f32>, 256>;
var<workgroup> bs4: array<vec4<f32>, 256>;

// O (M, N) = A (M, K) Bc (K, N) (+ B[m] with a bias), 64 x 64 outputs a workgroup of 64
// invocations, 8 x 8 an invocation (in registers), over K steps of 16 staged in workgroup
// memory. A is W: row-major (W[m * K + r]) or, with a_km, K-major (W[r * M + m]). Bc is the
// im2col of X (c_in, len_in) read in place: row r = ci * taps + j, column t holds
// X[ci][t * stride + j * dil - pad] (zero outside); a plain matrix is one tap of stride 1.
// grid (column tiles from tile P(10), row tiles).
// params: 0 M, 1 N, 2 K, 3 a_km, 4 has_bias, 5 len_in, 6 taps, 7 stride, 8 pad, 9 dil,
//         10 first column tile
@compute @workgroup_size(64)
fn conv_gemm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let m_all = P(0u);
    let n_all = P(1u);
    let k_all = P(2u);
    let a_km = P(3u) != 0u;
    let len_in = i32(P(5u));
    let taps = P(6u);
    let stride = i32(P(7u));
    let pad = i32(P(8u));
    let dil = i32(P(9u));
    let n0 = (P(10u) + wg.x) * TN;
    let m0 = wg.y * TM;
    let tx = li & 7u; // columns 8tx..8tx+7
    let ty = li >> 3u; // rows 8ty..8ty+7
    let t = n0 + li;
    var acc: array<vec4<f32>, 16>; // [row i][columns 0-3, 4-7]
    for (var i = 0u; i < 16u; i++) { acc[i] = vec4<f32>(0.0); }
    for (var k0 = 0u; k0 < k_all; k0 += TK) {
        // A: invocation li stages 16 values, consecutive invocations at consecutive
        // addresses in either layout (row-major: rows li / 16 + 4j, value li % 16).
        for (var j = 0u; j < TK; j++) {
            var m: u32;
            var kk: u32;
            if (a_km) {
                m = li;
                kk = j;
            } else {
                m = (li >> 4u) + 4u * j;
                kk = li & 15u;
            }
            let gm = m0 + m;
            let r = k0 + kk;
            var v = 0.0;
            if (gm < m_all && r < k_all) {
                if (a_km) { v = W[r * m_all + gm]; } else { v = W[gm * k_all + r]; }
            }
            as4[kk * 16u + (m >> 2u)][m & 3u] = v;
        }
        // Bc: invocation li stages column n0 + li's rows k0..k0 + 16, the channel and tap
        // stepped along.
        var ci = k0 / taps;
        var tap = k0 % taps;
        for (var j = 0u; j < TK; j++) {
            var v = 0.0;
            if (t < n_all && k0 + j < k_all) {
                let src = i32(t) * stride + i32(tap) * dil - pad;
                if (src >= 0 && src < len_in) { v = X[ci * u32(len_in) + u32(src)]; }
            }
            bs4[j * 16u + (li >> 2u)][li & 3u] = v;
            tap += 1u;
            if (tap == taps) {
                tap = 0u;
                ci += 1u;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let a0 = as4[kk * 16u + 2u * ty];
            let a1 = as4[kk * 16u + 2u * ty + 1u];
            let b0 = bs4[kk * 16u + 2u * tx];
            let b1 = bs4[kk * 16u + 2u * tx + 1u];
            for (var i = 0u; i < 4u; i++) {
                acc[2u * i] += a0[i] * b0;
                acc[2u * i + 1u] += a0[i] * b1;
                acc[8u + 2u * i] += a1[i] * b0;
                acc[8u + 2u * i + 1u] += a1[i] * b1;
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 8u; i++) {
        let m = m0 + 8u * ty + i;
        if (m >= m_all) { break; }
        var bias = 0.0;
        if (P(4u) != 0u) { bias = B[m]; }
        for (var c = 0u; c < 8u; c++) {
            let t = n0 + 8u * tx + c;
            if (t < n_all) { O[m * n_all + t] = acc[2u * i + c / 4u][c % 4u] + bias; }
        }
    }
}

// A grouped convolution (or, with `transposed`, a grouped transposed one), an invocation per
// output. Plain: O[o][t] = bias[o] + sum over the group's input channels i and taps j of
// W[(o * cig + i) * k + j] X[g * cig + i][t * stride + j * dil - pad]. Transposed (W (c_in,
// c_out / groups, k)): O[o][p] = bias[o] + sum over i, j with s * stride + j * dil - pad = p
// of W[((g * cig + i) * cog + o % cog) * k + j] X[g * cig + i][s].
// params: 0 c_in, 1 c_out, 2 len_in, 3 k, 4 stride, 5 pad, 6 dil, 7 groups, 8 lo,
//         9 has_bias, 10 transposed
@compute @workgroup_size(256)
fn conv_direct(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let c_in = P(0u);
    let c_out = P(1u);
    let len_in = i32(P(2u));
    let k = P(3u);
    let stride = i32(P(4u));
    let pad = i32(P(5u));
    let dil = i32(P(6u));
    let groups = P(7u);
    let lo = P(8u);
    let i = flat(wg, nwg, li);
    if (i >= c_out * lo) { return; }
    let t = i32(i % lo);
    let o = i / lo;
    let cig = c_in / groups;
    let cog = c_out / groups;
    let g = o / cog;
    var acc = 0.0;
    if (P(9u) != 0u) { acc = B[o]; }
    for (var ii = 0u; ii < cig; ii++) {
        let ci = g * cig + ii;
        let xr = ci * u32(len_in);
        if (P(10u) == 0u) {
            let wr = (o * cig + ii) * k;
            for (var j = 0u; j < k; j++) {
                let src = t * stride + i32(j) * dil - pad;
                if (src >= 0 && src < len_in) { acc += W[wr + j] * X[xr + u32(src)]; }
            }
        } else {
            let wr = (ci * cog + o % cog) * k;
            for (var j = 0u; j < k; j++) {
                let num = t + pad - i32(j) * dil;
                if (num < 0 || num % stride != 0) { continue; }
                let s = num / stride;
                if (s < len_in) { acc += W[wr + j] * X[xr + u32(s)]; }
            }
        }
    }
    O[i] = acc;
}

// A transposed convolution's output from the product X = cols (c_out * k, n) = W^T x over
// inputs s0..s0 + n: O[o][p] (+)= bias[o] + sum over taps j and those inputs s with s * stride
// + j * dil - pad = p of cols[o * k + j][s - s0]. The first run of inputs writes (with the
// bias), the next ones add.
// params: 0 c_out, 1 k, 2 s0, 3 stride, 4 pad, 5 dil, 6 lo, 7 has_bias, 8 n, 9 add
@compute @workgroup_size(256)
fn col2im_t(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = P(1u);
    let s0 = i32(P(2u));
    let stride = i32(P(3u));
    let pad = i32(P(4u));
    let dil = i32(P(5u));
    let lo = P(6u);
    let n = i32(P(8u));
    let i = flat(wg, nwg, li);
    if (i >= P(0u) * lo) { return; }
    let p = i32(i % lo);
    let o = i / lo;
    var acc = 0.0;
    if (P(9u) != 0u) {
        acc = O[i];
    } else if (P(7u) != 0u) {
        acc = B[o];
    }
    for (var j = 0u; j < k; j++) {
        let num = p + pad - i32(j) * dil;
        if (num < 0 || num % stride != 0) { continue; }
        let s = num / stride - s0;
        if (s >= 0 && s < n) { acc += X[(o * k + j) * u32(n) + u32(s)]; }
    }
    O[i] = acc;
}

// The range of X[..n] in two passes (the range always holds 0). u8_range_parts: workgroup w
// (of a grid_1d grid) writes min and max of X[w * RANGE_CHUNK ..][.. RANGE_CHUNK] to O[2w],
// O[2w + 1]. u8_range: one workgroup reduces the parts X[..2 parts] to O[0] = scale
// (max - min) / 255, O[1] = zero point (rounded half to even) of ONNX DynamicQuantizeLinear.
// params: 0 n (parts for u8_range)
const RANGE_CHUNK: u32 = 4096u;

@compute @workgroup_size(256)
fn u8_range_parts(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wg.y * nwg.x + wg.x;
    let end = min(P(0u), (w + 1u) * RANGE_CHUNK);
    var lo = 0.0;
    var hi = 0.0;
    for (var i = w * RANGE_CHUNK + li; i < end; i += WG) {
        lo = min(lo, X[i]);
        hi = max(hi, X[i]);
    }
    lo = -wmax(-lo, li);
    hi = wmax(hi, li);
    if (li == 0u) {
        O[2u * w] = lo;
        O[2u * w + 1u] = hi;
    }
}

@compute @workgroup_size(256)
fn u8_range(@builtin(local_invocation_index) li: u32) {
    let parts = P(0u);
    var lo = 0.0;
    var hi = 0.0;
    for (var i = li; i < parts; i += WG) {
        lo = min(lo, X[2u * i]);
        hi = max(hi, X[2u * i + 1u]);
    }
    lo = -wmax(-lo, li);
    hi = wmax(hi, li);
    if (li == 0u) {
        let scale = div_rn(hi - lo, 255.0);
        O[0] = scale;
        O[1] = select(clamp(round(div_rn(-lo, scale)), 0.0, 255.0), 0.0, scale == 0.0);
    }
}

// X[i] for i < n rounded to the uint8 grid u8_range left in B: (clamp(round(x / scale) + zp,
// 0, 255) - zp) * scale, rounded half to even; left as it is where the scale is 0.
// params: 0 n
@compute @workgroup_size(256)
fn fake_quant_u8(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(wg, nwg, li);
    let scale = B[0];
    if (i >= P(0u) || scale == 0.0) { return; }
    let zp = B[1];
    let q = clamp(round(div_rn(X[i], scale)) + zp, 0.0, 255.0);
    X[i] = (q - zp) * scale;
}

// The table W: cos(2 pi m / n_fft) at [m], sin at [n_fft + m], the periodic Hann window at
// [2 n_fft + m].

// Centred STFT of X (len) with reflect padding, an invocation per (bin, frame): O (2 bins,
// frames) = [magnitude; phase].
// params: 0 len, 1 n_fft, 2 hop, 3 frames, 4 bins
@compute @workgroup_size(256)
fn stft(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let len = i32(P(0u));
    let n_fft = P(1u);
    let frames = P(3u);
    let bins = P(4u);
    let i = flat(wg, nwg, li);
    if (i >= bins * frames) { return; }
    let k = i / frames;
    let f = i % frames;
    let start = i32(f * P(2u)) - i32(n_fft / 2u);
    var re = 0.0;
    var im = 0.0;
    for (var j = 0u; j < n_fft; j++) {
        // Reflect padding: -s -> s, len - 1 + s -> len - 1 - s.
        var s = start + i32(j);
        if (s < 0) { s = -s; } else if (s >= len) { s = 2 * (len - 1) - s; }
        let v = X[u32(clamp(s, 0, len - 1))] * W[2u * n_fft + j];
        let m = (k * j) % n_fft;
        re += v * W[m];
        im -= v * W[n_fft + m];
    }
    O[k * frames + f] = sqrt(re * re + im * im);
    O[(bins + k) * frames + f] = atan2(im, re);
}

// Inverse of stft from X = [magnitude; phase] (2 bins, frames), an invocation per output
// sample: the windowed frames that cover it overlap-added, over their squared windows' sum
// (where above 1e-11), the centre trimmed: O holds (frames - 1) hop samples.
// params: 0 frames, 1 n_fft, 2 hop, 3 n_out, 4 bins
@compute @workgroup_size(256)
fn istft(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let frames = P(0u);
    let n_fft = P(1u);
    let hop = P(2u);
    let bins = P(4u);
    let i = flat(wg, nwg, li);
    if (i >= P(3u)) { return; }
    let p = i + n_fft / 2u;
    // Frames f with f hop <= p < f hop + n_fft.
    var f0 = 0u;
    if (p + 1u > n_fft) { f0 = (p + 1u - n_fft + hop - 1u) / hop; }
    let f1 = min(frames - 1u, p / hop);
    let half = n_fft / 2u;
    var acc = 0.0;
    var env = 0.0;
    for (var f = f0; f <= f1; f++) {
        let j = p - f * hop;
        var v = 0.0;
        for (var k = 0u; k < bins; k++) {
            // Each bin's weight in the one-sided sum: 1 for DC and an even size's Nyquist.
            var wk = 2.0;
            if (k == 0u || (n_fft % 2u == 0u && k == half)) { wk = 1.0; }
            let mag = wk * X[k * frames + f];
            let ph = X[(bins + k) * frames + f];
            let m = (k * j) % n_fft;
            v += mag * (cos(ph) * W[m] - sin(ph) * W[n_fft + m]);
        }
        let w = W[2u * n_fft + j];
        acc += v / f32(n_fft) * w;
        env += w * w;
    }
    O[i] = select(acc, acc / env, env > 1e-11);
}

// X[start + i] for i < n through op (0 exp, 1 sin, 2 tanh), in place. (tanh's argument is
// clamped where tanh is 1 in f32: a driver's exp-based form would give inf / inf there.)
// params: 0 n, 1 start, 2 op
@compute @workgroup_size(256)
fn unary(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(wg, nwg, li);
    if (i >= P(0u)) { return; }
    let at = P(1u) + i;
    let v = X[at];
    switch P(2u) {
        case 0u: { X[at] = exp(v); }
        case 1u: { X[at] = sin(v); }
        default: { X[at] = tanh(clamp(v, -15.0, 15.0)); }
    }
}

// O (c, len + 1) = X (c, len) with sample 1 of each row put before it (ReflectionPad1d((1,
// 0))).
// params: 0 c, 1 len
@compute @workgroup_size(256)
fn reflect_pad_left(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let len = P(1u);
    let i = flat(wg, nwg, li);
    if (i >= P(0u) * (len + 1u)) { return; }
    let r = i / (len + 1u);
    let p = i % (len + 1u);
    O[i] = X[r * len + select(p - 1u, 1u, p == 0u)];
}

// O row r = X row W[r] (a u32 index), rows of `cols` values.
// params: 0 rows, 1 cols
@compute @workgroup_size(256)
fn gather_rows(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let cols = P(1u);
    let i = flat(wg, nwg, li);
    if (i >= P(0u) * cols) { return; }
    O[i] = X[bitcast<u32>(W[i / cols]) * cols + i % cols];
}

// The two recurrences of a bidirectional LSTM from zero state, a workgroup per direction
// (wg.x: 0 forward, 1 backward) stepping through steps s0..s1 of len itself: X = gx (len,
// 8h), the input gates [fwd i f g o | bwd i f g o]; W = w_hh (2h, 4h) = [W_hh_fwd^T;
// W_hh_bwd^T]; O (len, 2h) = [h_fwd | h_bwd]; B = the state between dispatches (c then h,
// 2h each: direction d's at d h). Invocation li keeps units li, li + 256, .. (their c) and
// computes their four gates; h goes through workgroup memory, double-buffered by step
// parity. (A dispatch takes a bounded number of steps: lavapipe ends a shader's loop past
// 65535 iterations in all.)
// params: 0 len, 1 h (at most LSTM_MAX_H), 2 s0, 3 s1, 4 from zero state
const LSTM_MAX_H: u32 = 1024u;
var<workgroup> lstm_h: array<f32, 2048>;

fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
// 1 - 2 / (e^{2x} + 1): saturates to +-1 (no inf / inf).
fn tanh_sat(x: f32) -> f32 { return 1.0 - 2.0 / (exp(2.0 * x) + 1.0); }

@compute @workgroup_size(256)
fn bilstm_steps(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let len = P(0u);
    let h = P(1u);
    let s0 = P(2u);
    let s1 = P(3u);
    let zero = P(4u) != 0u;
    let dir = wg.x;
    let w0 = dir * h * 4u * h;
    var c: array<f32, 4>;
    for (var m = 0u; m < 4u; m++) {
        let u = li + 256u * m;
        c[m] = 0.0;
        lstm_h[u] = 0.0;
        if (!zero && u < h) {
            c[m] = B[dir * h + u];
            lstm_h[u] = B[2u * h + dir * h + u];
        }
    }
    workgroupBarrier();
    for (var step = s0; step < s1; step++) {
        var t = step;
        if (dir == 1u) { t = len - 1u - step; }
        let cur = ((step - s0) & 1u) * LSTM_MAX_H;
        let nxt = LSTM_MAX_H - cur;
        for (var m = 0u; m < 4u; m++) {
            let u = li + 256u * m;
            if (u >= h) { break; }
            let g0 = t * 8u * h + dir * 4u * h;
            var gi = X[g0 + u];
            var gf = X[g0 + h + u];
            var gg = X[g0 + 2u * h + u];
            var go = X[g0 + 3u * h + u];
            for (var k = 0u; k < h; k++) {
                let hv = lstm_h[cur + k];
                let row = w0 + k * 4u * h;
                gi += hv * W[row + u];
                gf += hv * W[row + h + u];
                gg += hv * W[row + 2u * h + u];
                go += hv * W[row + 3u * h + u];
            }
            c[m] = sigmoid(gf) * c[m] + sigmoid(gi) * tanh_sat(gg);
            let hn = sigmoid(go) * tanh_sat(c[m]);
            lstm_h[nxt + u] = hn;
            O[t * 2u * h + dir * h + u] = hn;
        }
        workgroupBarrier();
    }
    let last = ((s1 - s0) & 1u) * LSTM_MAX_H;
    for (var m = 0u; m < 4u; m++) {
        let u = li + 256u * m;
        if (u < h) {
            B[dir * h + u] = c[m];
            B[2u * h + dir * h + u] = lstm_h[last + u];
        }
    }
}
