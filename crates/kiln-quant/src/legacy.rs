//! The 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Each function takes one block: `b` is exactly `type_size` bytes, `y`/`x` exactly 32
//! values. The 4- and 5-bit formats split a block in halves: byte `j` of `qs` holds value
//! `j` in its low nibble and value `j + 16` in its high nibble.
//!
//! The quantizers follow the GGML reference (`quantize_row_*_ref`) step for step in f32:
//! scale from the block's extremes, reciprocal, then truncation after adding the offset
//! plus one half (Q4/Q5) or round-half-away-from-zero (Q8). That is also exactly what the
//! `gguf` Python package computes, so the bytes are identical.

use crate::bits::{first_absmax, min_max, read_f16, read_u32, write_f16};

/// Values per block.
pub(crate) const QK: usize = 32;
const HALF: usize = QK / 2;

/// `1 / d`, or 0 for a zero scale (an all-zero block quantizes to the zero point).
#[inline]
fn recip_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `v` truncated toward zero into `0..=max` (the C `(uint8_t)(v)` plus clamp).
#[inline]
fn trunc_q(v: f32, max: u8) -> u8 {
    // `as u8` truncates and saturates; v is never negative for finite input.
    (v as u8).min(max)
}

// ---------------------------------------------------------------- dequantization

/// Q4_0, 18 bytes: d (f16), qs[16] nibbles -> 32 values `(q - 8) * d`.
pub(crate) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
        y[j + HALF] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1, 20 bytes: d (f16), m (f16), qs[16] nibbles -> 32 values `q * d + m`.
pub(crate) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = (q & 0x0f) as f32 * d + m;
        y[j + HALF] = (q >> 4) as f32 * d + m;
    }
}

/// Bit 4 of the 5-bit quant `j`: bit `j` of the little-endian `qh` word.
#[inline]
fn q5_high(qh: u32, j: usize) -> u8 {
    (((qh >> j) & 1) as u8) << 4
}

/// Q5_0, 22 bytes: d (f16), qh (u32, bit 4 of each quant), qs[16] low nibbles
/// -> 32 values `(q - 16) * d`.
pub(crate) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qh = read_u32(b, 2);
    for (j, &q) in b[6..22].iter().enumerate() {
        let lo = (q & 0x0f) | q5_high(qh, j);
        let hi = (q >> 4) | q5_high(qh, j + HALF);
        y[j] = (lo as i32 - 16) as f32 * d;
        y[j + HALF] = (hi as i32 - 16) as f32 * d;
    }
}

/// Q5_1, 24 bytes: d (f16), m (f16), qh (u32), qs[16] -> 32 values `q * d + m`.
pub(crate) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qh = read_u32(b, 4);
    for (j, &q) in b[8..24].iter().enumerate() {
        let lo = (q & 0x0f) | q5_high(qh, j);
        let hi = (q >> 4) | q5_high(qh, j + HALF);
        y[j] = lo as f32 * d + m;
        y[j + HALF] = hi as f32 * d + m;
    }
}

/// Q8_0, 34 bytes: d (f16), qs[32] (i8) -> 32 values `q * d`.
pub(crate) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = q as i8 as f32 * d;
    }
}

/// Q8_1, 36 bytes: d (f16), s (f16, = d * sum(q), unused here), qs[32] (i8) -> `q * d`.
pub(crate) fn dequant_q8_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..36]) {
        *v = q as i8 as f32 * d;
    }
}

// ---------------------------------------------------------------- quantization

/// Q4_0: d = (value of largest magnitude) / -8, so that value maps to q = 0 exactly;
/// q = trunc(x / d + 8.5) capped at 15.
///
/// The extreme is the first value of largest magnitude, so a block of zeros that starts
/// with -0.0 stores d = +0.0 (as the Python reference does; GGML's C stores -0.0 there).
/// Both decode to zeros.
pub(crate) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let d = first_absmax(x) / -8.0;
    let id = recip_or_zero(d);
    write_f16(b, 0, d);
    for j in 0..HALF {
        let lo = trunc_q(x[j] * id + 8.5, 15);
        let hi = trunc_q(x[j + HALF] * id + 8.5, 15);
        b[2 + j] = lo | (hi << 4);
    }
}

/// Q4_1: m = min, d = (max - min) / 15; q = trunc((x - min) / d + 0.5) capped at 15.
pub(crate) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = recip_or_zero(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    for j in 0..HALF {
        let lo = trunc_q((x[j] - min) * id + 0.5, 15);
        let hi = trunc_q((x[j + HALF] - min) * id + 0.5, 15);
        b[4 + j] = lo | (hi << 4);
    }
}

/// Splits 32 five-bit quants into the `qh` word (bit 4 of each) and `qs` nibbles.
fn pack_q5(q: &[u8; QK], qh_qs: &mut [u8]) {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v >> 4) as u32 & 1) << j;
    }
    qh_qs[..4].copy_from_slice(&qh.to_le_bytes());
    for j in 0..HALF {
        qh_qs[4 + j] = (q[j] & 0x0f) | ((q[j + HALF] & 0x0f) << 4);
    }
}

/// Q5_0: d = (value of largest magnitude) / -16; q = trunc(x / d + 16.5) capped at 31.
pub(crate) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let d = first_absmax(x) / -16.0;
    let id = recip_or_zero(d);
    write_f16(b, 0, d);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_q(x[j] * id + 16.5, 31));
    pack_q5(&q, &mut b[2..22]);
}

/// Q5_1: m = min, d = (max - min) / 31; q = trunc((x - min) / d + 0.5) capped at 31.
pub(crate) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = recip_or_zero(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_q((x[j] - min) * id + 0.5, 31));
    pack_q5(&q, &mut b[4..24]);
}

/// max |x| over the block.
#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// `v.round() as i8` (halves away from zero, saturating; NaN 0) without a call to libm's
/// `roundf` a value, so a block's loop vectorizes: the truncation, then one step away from
/// zero where the part dropped (exact) is at least a half.
#[inline(always)]
fn round_i8(v: f32) -> i8 {
    let v = if v.is_nan() {
        0.0
    } else {
        v.clamp(-128.0, 127.0)
    };
    // SAFETY: v is finite and within i32 (a plain truncating conversion, which vectorizes;
    // `as` adds saturation and NaN checks, which did not).
    let t = unsafe { v.to_int_unchecked::<i32>() };
    let r = v - t as f32;
    (t + (r >= 0.5) as i32 - (r <= -0.5) as i32) as i8
}

/// Q8_0: d = max|x| / 127; q = round(x / d), halves away from zero.
pub(crate) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = recip_or_zero(d);
    write_f16(b, 0, d);
    for (o, &v) in b[2..34].iter_mut().zip(x) {
        *o = round_i8(v * id) as u8;
    }
}

/// Q8_1: as Q8_0, plus s = d * sum(q) (f16) for dot products against Q4_1/Q5_1.
pub(crate) fn quant_q8_1(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = recip_or_zero(d);
    let mut sum = 0i32;
    for (o, &v) in b[4..36].iter_mut().zip(x) {
        let q = round_i8(v * id);
        sum += q as i32;
        *o = q as u8;
    }
    write_f16(b, 0, d);
    write_f16(b, 2, sum as f32 * d);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorizable rounding is `round() as i8` for every value: halves, the ends of
    /// the range and past them, NaN and infinities, and a sweep of ordinary values.
    #[test]
    fn round_i8_is_round_as_i8() {
        let mut vs = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.49999997,
            -0.49999997,
            126.5,
            127.0,
            127.4,
            127.5,
            128.0,
            -127.5,
            -128.0,
            -128.4,
            -128.5,
            -129.0,
            1e9,
            -1e9,
            3e38,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-40,
        ];
        vs.extend((-140_000..140_000).map(|i| i as f32 / 1000.0));
        vs.extend((-600..600).map(|i| i as f32 * 0.25));
        for v in vs {
            assert_eq!(round_i8(v), v.round() as i8, "{v}");
        }
    }
    use crate::bits::round_f16;

    fn f16_bytes(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_0_nibble_order() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0xf1; // value 0: q = 1, value 16: q = 15
        b[17] = 0x08; // value 15: q = 8, value 31: q = 0
        let mut y = [0f32; 32];
        dequant_q4_0(&b, &mut y);
        assert_eq!(y[0], -3.5);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[15], 0.0);
        assert_eq!(y[31], -4.0);
    }

    #[test]
    fn q5_high_bits_from_qh() {
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        // Set the high bit of values 0 and 31 only.
        b[2..6].copy_from_slice(&(1u32 | 1 << 31).to_le_bytes());
        let mut y = [0f32; 32];
        dequant_q5_0(&b, &mut y);
        assert_eq!(y[0], 0.0); // 16 - 16
        assert_eq!(y[1], -16.0);
        assert_eq!(y[16], -16.0);
        assert_eq!(y[31], 0.0);
    }

    #[test]
    fn q4_0_extreme_maps_to_zero_quant() {
        let mut x = [0.25f32; 32];
        x[5] = -2.0;
        x[6] = 2.0; // same magnitude, opposite sign: clipped to 15
        let mut b = [0u8; 18];
        quant_q4_0(&x, &mut b);
        let mut y = [0f32; 32];
        dequant_q4_0(&b, &mut y);
        assert_eq!(y[5], -2.0);
        assert_eq!(y[6], 1.75);
        assert_eq!(y[0], 0.25);
    }

    #[test]
    fn q4_1_constant_block_is_exact_in_f16() {
        let x = [0.7f32; 32];
        let mut b = [0u8; 20];
        quant_q4_1(&x, &mut b);
        let mut y = [0f32; 32];
        dequant_q4_1(&b, &mut y);
        assert!(y.iter().all(|&v| v == round_f16(0.7)));
    }

    #[test]
    fn q8_0_rounds_halves_away_from_zero() {
        let mut x = [0f32; 32];
        x[0] = 127.0; // d = 1 exactly
        x[1] = 62.5;
        x[2] = -62.5;
        x[3] = 0.5;
        let mut b = [0u8; 34];
        quant_q8_0(&x, &mut b);
        assert_eq!(b[2 + 1] as i8, 63);
        assert_eq!(b[2 + 2] as i8, -63);
        assert_eq!(b[2 + 3] as i8, 1);
    }

    #[test]
    fn q8_1_sum_field() {
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 - 10.0);
        let mut b = [0u8; 36];
        quant_q8_1(&x, &mut b);
        let d = read_f16(&b, 0);
        let s = read_f16(&b, 2);
        let sum: i32 = b[4..].iter().map(|&q| q as i8 as i32).sum();
        assert_eq!(s, round_f16(sum as f32 * (21.0 / 127.0)));
        assert_eq!(d, round_f16(21.0 / 127.0));
    }
}
