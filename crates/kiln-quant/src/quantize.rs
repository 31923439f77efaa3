//! `quantize_row`: f32 values into a row of a supported type.

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
