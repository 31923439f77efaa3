// Activations for the products: x (optionally RMS-normalised with
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

// grid (column tiles of 1024, tokens): workgroup x takes values 1024x.. of token t's row, 4
// a invocation (8 invocations a block of 32); each workgroup sums the row's squares itself
// (the norm), four loads at a time.
@compute @workgroup_size(256)
fn prep(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let cols = P(0u);
    let t = wg.y;
    let base = P(4u) + t * P(5u);
    var inv = 1.0;
    if (P(2u) == 1u) {
        var s0 = 0.0;
        var s1 = 0.0;
        var s2 = 0.0;
        var s3 = 0.0;
        var c = li;
        for (; c + 3u * WG < cols; c += 4u * WG) {
            let a = IN[base + c];
            let b = IN[base + c + WG];
            let d = IN[base + c + 2u * WG];
            let e = IN[base + c + 3u * WG];
            s0 += a * a;
            s1 += b * b;
            s2 += d * d;
            s3 += e * e;
        }
        for (; c < cols; c += WG) { let a = IN[base + c]; s0 += a * a; }
        let ss = wsum((s0 + s1) + (s2 + s3), li);
        inv = 1.0 / sqrt(ss / f32(cols) + PF(1u));
    }
    let c0 = wg.x * 4u * WG;
    if (P(10u) == 1u) {
        for (var k = 0u; k < 4u; k++) {
            let c = c0 + k * WG + li;
            if (c < cols) { OUTF[P(6u) + t * P(7u) + c] = bitcast<u32>(normed(base, c, inv)); }
        }
    }
    if (P(3u) == 1u) {
        let words = cols >> 2u;
        let w = (c0 >> 2u) + li;
        var v: vec4<f32>;
        if (w < words) {
            for (var k = 0u; k < 4u; k++) { v[k] = normed(base, w * 4u + k, inv); }
        }
        let q = quant_word(li, v, w < words);
        if (w < words) {
            ACT[t * words + w] = q.word;
            if ((li & 7u) == 0u) {
                let nb = cols >> 5u;
                ACT[P(8u) + t * nb + (w >> 3u)] = bitcast<u32>(q.d);
                ACT[P(9u) + t * nb + (w >> 3u)] = q.sums;
            }
        }
    }
}
