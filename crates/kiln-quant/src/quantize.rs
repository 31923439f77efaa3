//! `quantize_row`: f32 values into a row of a supported type.

use half::slice::HalfFloatSliceExt;

use crate::bits::{f32_to_bf16_bits, write_f16, write_f32};
use crate::types::{check_row, GgmlType, QuantError};
use crate::{k_quants, legacy};

/// Encodes one block of `block_size` values into `type_size` bytes.
type QuantBlock = fn(&[f32], &mut [u8]);

fn block_fn(ty: GgmlType) -> Option<QuantBlock> {
    use GgmlType::*;
    Some(match ty {
        // The float types are blocks of one value.
        F32 => |x, b| write_f32(b, 0, x[0]),
        F16 => |x, b| write_f16(b, 0, x[0]),
        BF16 => |x, b| b.copy_from_slice(&f32_to_bf16_bits(x[0]).to_le_bytes()),
        Q4_0 => legacy::quant_q4_0,
        Q4_1 => legacy::quant_q4_1,
        Q5_0 => legacy::quant_q5_0,
        Q5_1 => legacy::quant_q5_1,
        Q8_0 => legacy::quant_q8_0,
        Q8_1 => legacy::quant_q8_1,
        Q4_K => k_quants::quant_q4_k,
        Q5_K => k_quants::quant_q5_k,
        Q6_K => k_quants::quant_q6_k,
        Q8_K => k_quants::quant_q8_k,
        Q2_K | Q3_K => return None,
    })
}

/// Whether `quantize_row` handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Encodes `src` into `dst`, which must be exactly `ty.row_bytes(src.len())` bytes.
///
/// `src.len()` must be a multiple of the block size (else `RaggedRow`). Deterministic,
/// single-threaded and bit-identical to GGML's reference quantizers; finite input is
/// expected (NaN or infinity gives unspecified bytes, never a panic).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f = block_fn(ty).ok_or(QuantError::Unsupported {
        ty: ty.name(),
        what: "quantization",
    })?;
    check_row(ty, src.len(), dst.len())?;
    if ty == GgmlType::F16 {
        if cfg!(target_endian = "little") {
            // SAFETY: every bit pattern is an f16; only the aligned middle is reinterpreted.
            let (head, mid, tail) = unsafe { dst.align_to_mut::<half::f16>() };
            if head.is_empty() && tail.is_empty() {
                // Straight into the row (a KV cache's store at every step): F16C / FP16
                // conversion in place, no per-value byte copies.
                mid.convert_from_f32_slice(src);
                return Ok(());
            }
        }
        // A run of values at a time through `half`'s slice conversion (F16C / FP16 where the
        // CPU has it): the bits `f16::from_f32` gives each value, without a call a value.
        let mut run = [half::f16::ZERO; 64];
        for (x, b) in src.chunks(run.len()).zip(dst.chunks_mut(2 * run.len())) {
            let h = &mut run[..x.len()];
            h.convert_from_f32_slice(x);
            for (o, v) in b.as_chunks_mut::<2>().0.iter_mut().zip(h.iter()) {
                *o = v.to_bits().to_le_bytes();
            }
        }
        return Ok(());
    }
    for (x, b) in src
        .chunks_exact(ty.block_size())
        .zip(dst.chunks_exact_mut(ty.type_size()))
    {
        f(x, b);
    }
    Ok(())
}

/// `quantize_row` into a new byte vector.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    if !can_quantize(ty) {
        return Err(QuantError::Unsupported {
            ty: ty.name(),
            what: "quantization",
        });
    }
    let mut out = vec![0u8; ty.row_bytes(src.len())?];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F16 rows (converted a run at a time) hold the bits `f16::from_f32` gives each value:
    /// ties at both parities, values that round to subnormals, to zero, past the largest
    /// f16 and to infinity, signs, and a row length that is not a multiple of the run.
    #[test]
    fn f16_rows_round_as_each_value_alone() {
        let mut src = vec![
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            65520.0,
            -70000.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            6.1e-5,
            5.96e-8,
            2.9e-8,
            1e-10,
            f32::MIN_POSITIVE,
        ];
        // Halfway between neighbouring f16 values (an even and an odd mantissa each).
        for m in [0x3c00u16, 0x3c01, 0x0001, 0x03ff, 0x7bfe] {
            let (a, b) = (half::f16::from_bits(m), half::f16::from_bits(m + 1));
            src.push((a.to_f32() + b.to_f32()) / 2.0);
            src.push(-(a.to_f32() + b.to_f32()) / 2.0);
        }
        let mut x = 0x1234_5678u32;
        while src.len() < 203 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            src.push(f32::from_bits(x & 0xbfff_ffff) * 1e-3);
        }
        let mut dst = vec![0u8; 2 * src.len()];
        quantize_row(GgmlType::F16, &src, &mut dst).unwrap();
        for (i, v) in src.iter().enumerate() {
            let got = u16::from_le_bytes([dst[2 * i], dst[2 * i + 1]]);
            let want = half::f16::from_f32(*v).to_bits();
            assert_eq!(got, want, "value {i} ({v:e})");
        }
        let err = quantize_row(GgmlType::F16, &src, &mut dst[1..]);
        assert!(err.is_err(), "a destination of the wrong length is refused");
    }
}
