//! `dequantize_row`: a row of any supported type back to f32.

use crate::bits::{bf16_bits_to_f32, read_f16, read_f32};
use crate::types::{check_row, GgmlType, QuantError};
use crate::{k_quants, legacy};

/// Decodes one block (`type_size` bytes) into its `block_size` values.
type DequantBlock = fn(&[u8], &mut [f32]);

fn block_fn(ty: GgmlType) -> Option<DequantBlock> {
    use GgmlType::*;
    Some(match ty {
        // The float types are blocks of one value.
        F32 => |b, y| y[0] = read_f32(b, 0),
        F16 => |b, y| y[0] = read_f16(b, 0),
        BF16 => |b, y| y[0] = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
        Q4_0 => legacy::dequant_q4_0,
        Q4_1 => legacy::dequant_q4_1,
        Q5_0 => legacy::dequant_q5_0,
        Q5_1 => legacy::dequant_q5_1,
        Q8_0 => legacy::dequant_q8_0,
        Q8_1 => legacy::dequant_q8_1,
        Q2_K => k_quants::dequant_q2_k,
        Q3_K => k_quants::dequant_q3_k,
        Q4_K => k_quants::dequant_q4_k,
        Q5_K => k_quants::dequant_q5_k,
        Q6_K => k_quants::dequant_q6_k,
        Q8_K => k_quants::dequant_q8_k,
    })
}

/// Whether `dequantize_row` handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Decodes `src`, a whole number of `ty` blocks, into `dst.len()` values.
///
/// `dst.len()` must be a multiple of the block size (else `RaggedRow`) and `src` exactly
/// `ty.row_bytes(dst.len())` bytes (else `WrongByteLength`). Several rows back to back
/// are fine: blocks never straddle rows.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let f = block_fn(ty).ok_or(QuantError::Unsupported {
        ty: ty.name(),
        what: "dequantization",
    })?;
    check_row(ty, dst.len(), src.len())?;
    // The float types a loop each (which vectorizes), not a block call a value.
    match ty {
        GgmlType::F16 => {
            f16_row(src, dst);
            return Ok(());
        }
        GgmlType::F32 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return Ok(());
        }
        GgmlType::BF16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
            return Ok(());
        }
        _ => {}
    }
    for (b, y) in src
        .chunks_exact(ty.type_size())
        .zip(dst.chunks_exact_mut(ty.block_size()))
    {
        f(b, y);
    }
    Ok(())
}

/// Half-precision values widened a run at a time through `half`'s slice conversion (F16C's
/// `vcvtph2ps` where the CPU has it), not a call a value: the same values.
fn f16_row(src: &[u8], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    const RUN: usize = 256;
    let mut h = [half::f16::ZERO; RUN];
    for (s, d) in src.chunks(2 * RUN).zip(dst.chunks_mut(RUN)) {
        let h = &mut h[..d.len()];
        for (v, b) in h.iter_mut().zip(s.chunks_exact(2)) {
            *v = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
        }
        h.convert_to_f32_slice(d);
    }
}

/// `dequantize_row` into a new vector of `n` values.
pub fn dequantize(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported {
            ty: ty.name(),
            what: "dequantization",
        });
    }
    // Check before allocating: `n` may come from a file.
    check_row(ty, n, src.len())?;
    let mut out = vec![0.0; n];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every half-precision bit pattern widens to the value `read_f16` gives it (NaNs to a
    /// NaN), in a row whose length is not a multiple of the run.
    #[test]
    fn float_rows_widen_every_value() {
        let bits: Vec<u16> = (0..=u16::MAX).chain(0..300).collect();
        let src: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut dst = vec![0f32; bits.len()];
        dequantize_row(GgmlType::F16, &src, &mut dst).unwrap();
        for (i, (&got, b)) in dst.iter().zip(src.chunks_exact(2)).enumerate() {
            let want = read_f16(b, 0);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{i}: {got} vs {want}"
            );
        }
        // BF16 and F32 as their one-value blocks give them, bit for bit.
        for ty in [GgmlType::BF16, GgmlType::F32] {
            let n = src.len() / ty.type_size();
            let mut dst = vec![0f32; n];
            dequantize_row(ty, &src[..n * ty.type_size()], &mut dst).unwrap();
            let f = block_fn(ty).unwrap();
            for (i, (&got, b)) in dst.iter().zip(src.chunks_exact(ty.type_size())).enumerate() {
                let mut want = [0f32];
                f(b, &mut want);
                assert_eq!(got.to_bits(), want[0].to_bits(), "{ty:?} {i}");
            }
        }
    }
}
