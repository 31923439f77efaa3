// Weights as pack.rs lays them out (u32 words in the buffer `WB`); `rw` is a row's words.
// shaders.rs instantiates this file once per weight buffer of a module (`WB` -> W, W2;
// `_S` -> "", "2").
//
//   F32   one word per value            F16   two values per word (matrix-wide index)
//   Q4_0  per block of 32: [d f16], 4 words of nibbles
//   Q4_1  per block: [d f16 | m f16], 4 words of nibbles
//   Q8_0  per block: [d f16], 8 words of int8
//   Q4_K  per 256: [d | dmin], 3 words of 6-bit scales/mins, then 8 blocks x 4 words
//   Q6_K  per 256: 8 x 4 words low nibbles, 8 x 2 words high bits, 4 words int8 scales, [d]
// Nibble words of a block: byte j holds value j (low nibble) and value j + 16 (high).
// Q6_K high bits: word 0 values 0..15, word 1 values 16..31, value e at bits 2e.

fn wbyte_S(o: u32, k: u32) -> u32 { return (WB[o + (k >> 2u)] >> (8u * (k & 3u))) & 0xffu; }

// Scale and minimum of sub-block j (0..7) from the 12 bytes at word o.
fn q4k_sm_S(o: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(wbyte_S(o, j) & 63u), f32(wbyte_S(o, j + 4u) & 63u));
    }
    let d = (wbyte_S(o, j + 4u) & 0x0fu) | ((wbyte_S(o, j - 4u) >> 6u) << 4u);
    let m = (wbyte_S(o, j + 4u) >> 4u) | ((wbyte_S(o, j) >> 6u) << 4u);
    return vec2<f32>(f32(d), f32(m));
}

// Value c of row r.
fn wval_S(fmt: u32, r: u32, c: u32, cols: u32, rw: u32) -> f32 {
    let row = r * rw;
    let b = c >> 5u;
    let j = c & 31u;
    switch fmt {
        case 0u: { return bitcast<f32>(WB[row + c]); }
        case 1u: {
            let i = r * cols + c;
            let w = WB[i >> 1u];
            return select(f16lo(w), f16hi(w), (i & 1u) == 1u);
        }
        case 4u: {
            let o = row + b * 9u;
            return f16lo(WB[o]) * i8at(WB[o + 1u + (j >> 2u)], j & 3u);
        }
        default: {}
    }
    var qo: u32;
    var s: f32;
    var m: f32;
    var q: u32;
    let jj = j & 15u;
    if (fmt == FMT_Q4_0 || fmt == FMT_Q4_1) {
        let o = row + b * 5u;
        qo = o + 1u;
        if (fmt == FMT_Q4_0) {
            s = f16lo(WB[o]);
            m = -8.0 * s;
        } else {
            s = f16lo(WB[o]);
            m = f16hi(WB[o]);
        }
    } else if (fmt == FMT_Q4_K) {
        let sb = row + (b >> 3u) * 36u;
        let sm = q4k_sm_S(sb + 1u, b & 7u);
        s = f16lo(WB[sb]) * sm.x;
        m = -f16hi(WB[sb]) * sm.y;
        qo = sb + 4u + (b & 7u) * 4u;
    } else {
        let sb = row + (b >> 3u) * 53u;
        let k = b & 7u;
        qo = sb + k * 4u;
        let h = (WB[sb + 32u + k * 2u + (j >> 4u)] >> (2u * jj)) & 3u;
        let byte = wbyte_S(qo, jj);
        q = select(byte & 15u, byte >> 4u, j >= 16u) | (h << 4u);
        let d = f16lo(WB[sb + 52u]);
        let sc = i8at(WB[sb + 48u + ((2u * k + (j >> 4u)) >> 2u)], (2u * k + (j >> 4u)) & 3u);
        return d * sc * (f32(q) - 32.0);
    }
    let byte = wbyte_S(qo, jj);
    q = select(byte & 15u, byte >> 4u, j >= 16u);
    return s * f32(q) + m;
}

// Block b of row r (rw words) dotted with an int8 activation block: its 8 words xa, scale
// dx, half sums hs (low/high 16 bits). For every quantized format.
fn block_dot_S(fmt: u32, r: u32, b: u32, rw: u32, xa: array<u32, 8>, dx: f32, hs: u32) -> f32 {
    let row = r * rw;
    if (fmt == FMT_Q8_0) {
        let o = row + b * 9u;
        var a = 0;
        for (var i = 0u; i < 8u; i++) { a += sdot(WB[o + 1u + i], xa[i]); }
        return f16lo(WB[o]) * dx * f32(a);
    }
    var qo: u32;
    var s_lo: f32;
    var s_hi: f32;
    var m_lo: f32;
    var m_hi: f32;
    var hw = 0u;
    if (fmt == FMT_Q4_0 || fmt == FMT_Q4_1) {
        let o = row + b * 5u;
        qo = o + 1u;
        s_lo = f16lo(WB[o]);
        m_lo = select(f16hi(WB[o]), -8.0 * s_lo, fmt == FMT_Q4_0);
        s_hi = s_lo;
        m_hi = m_lo;
    } else if (fmt == FMT_Q4_K) {
        let sb = row + (b >> 3u) * 36u;
        let sm = q4k_sm_S(sb + 1u, b & 7u);
        s_lo = f16lo(WB[sb]) * sm.x;
        m_lo = -f16hi(WB[sb]) * sm.y;
        s_hi = s_lo;
        m_hi = m_lo;
        qo = sb + 4u + (b & 7u) * 4u;
    } else {
        let sb = row + (b >> 3u) * 53u;
        let k = b & 7u;
        qo = sb + k * 4u;
        hw = sb + 32u + k * 2u;
        let d = f16lo(WB[sb + 52u]);
        let sw = WB[sb + 48u + (k >> 1u)];
        s_lo = d * i8at(sw, (2u * k) & 3u);
        s_hi = d * i8at(sw, (2u * k + 1u) & 3u);
        m_lo = -32.0 * s_lo;
        m_hi = -32.0 * s_hi;
    }
    var a = 0;
    var c = 0;
    for (var i = 0u; i < 4u; i++) {
        let w = WB[qo + i];
        var lo = w & 0x0f0f0f0fu;
        var hi = (w >> 4u) & 0x0f0f0f0fu;
        if (fmt == FMT_Q6_K) {
            lo = lo | spread2(WB[hw] >> (8u * i));
            hi = hi | spread2(WB[hw + 1u] >> (8u * i));
        }
        a += udot(lo, xa[i]);
        c += udot(hi, xa[4u + i]);
    }
    return dx * (s_lo * f32(a) + m_lo * i16lo(hs) + s_hi * f32(c) + m_hi * i16hi(hs));
}

// Quarter w (0..3) of Q4_0 block b of row r: its nibble word w (values 4w..4w+3 in the low
// nibbles, 16+4w.. in the high ones) dotted with the activation words w and 4 + w of the
// block (xw), whose values sum to xsum: d * sum (q - 8) x, in integers until the scale.
fn q4_quarter_S(r: u32, b: u32, rw: u32, w: u32, xw: vec2<u32>, xsum: i32) -> f32 {
    let o = r * rw + b * 5u;
    let q = WB[o + 1u + w];
    let a = udot(q & 0x0f0f0f0fu, xw.x) + udot((q >> 4u) & 0x0f0f0f0fu, xw.y);
    return f16lo(WB[o]) * f32(a - 8 * xsum);
}

// Values 8p..8p+7 (p in 0..4) of block b of row r, dequantized: the tiled GEMM's loads (a
// block's scales decoded once per 8 values). Quantized formats only.
fn wdeq8_S(fmt: u32, r: u32, b: u32, p: u32, rw: u32) -> array<f32, 8> {
    let row = r * rw;
    var out: array<f32, 8>;
    if (fmt == FMT_Q8_0) {
        let o = row + b * 9u;
        let d = f16lo(WB[o]);
        let w0 = WB[o + 1u + 2u * p];
        let w1 = WB[o + 2u + 2u * p];
        for (var i = 0u; i < 4u; i++) {
            out[i] = d * i8at(w0, i);
            out[i + 4u] = d * i8at(w1, i);
        }
        return out;
    }
    var qo: u32;
    var s = 0.0;
    var m = 0.0;
    var hi = 0u;
    var s6 = false;
    if (fmt == FMT_Q4_0 || fmt == FMT_Q4_1) {
        let o = row + b * 5u;
        qo = o + 1u;
        s = f16lo(WB[o]);
        m = select(f16hi(WB[o]), -8.0 * s, fmt == FMT_Q4_0);
    } else if (fmt == FMT_Q4_K) {
        let sb = row + (b >> 3u) * 36u;
        let sm = q4k_sm_S(sb + 1u, b & 7u);
        s = f16lo(WB[sb]) * sm.x;
        m = -f16hi(WB[sb]) * sm.y;
        qo = sb + 4u + (b & 7u) * 4u;
    } else {
        let sb = row + (b >> 3u) * 53u;
        let k = b & 7u;
        qo = sb + k * 4u;
        hi = WB[sb + 32u + k * 2u + (p >> 1u)] >> (16u * (p & 1u));
        let sw = WB[sb + 48u + (k >> 1u)];
        s = f16lo(WB[sb + 52u]) * i8at(sw, (2u * k + (p >> 1u)) & 3u);
        m = -32.0 * s;
        s6 = true;
    }
    // Values 8p.. are the low (p < 2) or high nibbles of bytes 8(p & 1)...
    let shift = 4u * (p >> 1u);
    let w0 = WB[qo + 2u * (p & 1u)] >> shift;
    let w1 = WB[qo + 2u * (p & 1u) + 1u] >> shift;
    for (var i = 0u; i < 4u; i++) {
        var q0 = (w0 >> (8u * i)) & 15u;
        var q1 = (w1 >> (8u * i)) & 15u;
        if (s6) {
            q0 = q0 | (((hi >> (2u * i)) & 3u) << 4u);
            q1 = q1 | (((hi >> (2u * (i + 4u))) & 3u) << 4u);
        }
        out[i] = s * f32(q0) + m;
        out[i + 4u] = s * f32(q1) + m;
    }
    return out;
}
