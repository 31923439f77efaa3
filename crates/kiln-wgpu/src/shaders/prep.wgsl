// Activations for the products, one workgroup per token: x (optionally RMS-normalised with
// weights NW: x / sqrt(mean(x^2) + eps) * w) written as f32 to OUTF and/or quantized into
// int8 blocks of 32 in ACT: d = max|v| / 127, q = round(v / d) (ties to even, as the CPU
// backend's activations), 4 per word; each block's two half sums as i16 in one word.
// params: 0 cols, 1 eps, 2 has_norm, 3 write_q, 4 in_off, 5 in_ld, 6 f_off, 7 f_ld,
//         8 d_off, 9 s_off, 10 write_f

@group(0) @binding(1) var<storage, read_write> IN: array<f32>;
@group(0) @binding(2) var<storage, read_write> NW: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUTF: array<u32>;
@group(0) @binding(4) var<storage, read_write> ACT: array<u32>;

fn normed(base: u32, c: u32, inv: f32) -> f32 {
    let x = IN[base + c];
    if (P(2u) == 1u) { return x * inv * NW[c]; }
    return x;
}

@compute @workgroup_size(256)
fn prep(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let cols = P(0u);
    let t = wg.x;
    let base = P(4u) + t * P(5u);
    var inv = 1.0;
    if (P(2u) == 1u) {
        var ss = 0.0;
        for (var c = li; c < cols; c += WG) { let x = IN[base + c]; ss += x * x; }
        ss = wsum(ss, li);
        inv = 1.0 / sqrt(ss / f32(cols) + PF(1u));
    }
    if (P(10u) == 1u) {
        for (var c = li; c < cols; c += WG) {
            OUTF[P(6u) + t * P(7u) + c] = bitcast<u32>(normed(base, c, inv));
        }
    }
    if (P(3u) == 1u) {
        let nb = cols >> 5u;
        for (var b = li; b < nb; b += WG) {
            var amax = 0.0;
            for (var j = 0u; j < 32u; j++) { amax = max(amax, abs(normed(base, b * 32u + j, inv))); }
            let d = amax / 127.0;
            var id = 0.0;
            if (d > 0.0) { id = 1.0 / d; }
            var s0 = 0;
            var s1 = 0;
            for (var w = 0u; w < 8u; w++) {
                var word = 0u;
                for (var k = 0u; k < 4u; k++) {
                    let j = w * 4u + k;
                    let q = i32(clamp(round(normed(base, b * 32u + j, inv) * id), -127.0, 127.0));
                    word = word | ((bitcast<u32>(q) & 0xffu) << (8u * k));
                    if (j < 16u) { s0 += q; } else { s1 += q; }
                }
                ACT[t * (cols >> 2u) + b * 8u + w] = word;
            }
            ACT[P(8u) + t * nb + b] = bitcast<u32>(d);
            ACT[P(9u) + t * nb + b] = (bitcast<u32>(s0) & 0xffffu) | (bitcast<u32>(s1) << 16u);
        }
    }
}
