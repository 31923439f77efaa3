//! Little-endian field access and the scalar conversions every format shares.

use half::{bf16, f16};

/// f16 at `b[at..at + 2]`, widened exactly to f32.
///
/// Signalling NaNs come out quieted (payload otherwise kept); no GGML quantizer writes NaN.
#[inline]
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Stores `v` rounded to nearest-even f16 (overflow gives ±inf).
#[inline]
pub(crate) fn write_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// `v` as it reads back after a round trip through f16.
#[cfg(test)]
pub(crate) fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// bf16 bits widened to f32: the bf16 is the top half of the f32, so this is a shift.
///
/// Done by hand rather than through `half` so NaN payloads pass through unchanged.
#[inline]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bf16 bits: NaN forced quiet, everything else rounded to nearest-even.
#[inline]
pub(crate) fn f32_to_bf16_bits(v: f32) -> u16 {
    bf16::from_f32(v).to_bits()
}

#[inline]
pub(crate) fn read_f32(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn write_f32(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Round to nearest, ties to even, as an integer (the K-quant `nearest_int`).
///
/// GGML gets this by adding 1.5 * 2^23 to the float; within its valid range
/// (|v| <= 4194303) that is exactly round-half-to-even. Outside it, and for NaN, this
/// saturates (NaN gives 0) instead of returning garbage.
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// The value of largest magnitude in `x`, sign kept; the first one wins ties.
/// An all-zero block gives its first element (so `-0.0` when that is how it starts).
#[inline]
pub(crate) fn first_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// (min, max) of `x`, first occurrence on ties.
#[inline]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    for &v in &x[1..] {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (2.49, 2),
        ];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn nearest_int_matches_magic_add() {
        // The GGML formulation: add 1.5 * 2^23 and read the low mantissa bits.
        fn magic(v: f32) -> i32 {
            let t = v + 12582912.0;
            (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = (x as f32 / u32::MAX as f32 - 0.5) * 200.0;
            assert_eq!(nearest_int(v), magic(v), "{v}");
            let h = (x % 400) as f32 * 0.5 - 100.0; // exact halves
            assert_eq!(nearest_int(h), magic(h), "{h}");
        }
    }

    #[test]
    fn first_absmax_keeps_sign_and_first() {
        assert_eq!(first_absmax(&[1.0, -3.0, 3.0]), -3.0);
        assert_eq!(first_absmax(&[2.0, -2.0]), 2.0);
        assert_eq!(first_absmax(&[-0.0, 0.0]).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn bf16_bits() {
        assert_eq!(bf16_bits_to_f32(0x3f80), 1.0);
        // Payload of a signalling NaN survives.
        assert_eq!(bf16_bits_to_f32(0x7f81).to_bits(), 0x7f81_0000);
        // Halfway cases round to even.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::NAN) & 0x7fc0, 0x7fc0);
    }
}
