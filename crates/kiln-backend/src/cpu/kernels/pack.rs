//! kiln's packed row layouts, made once at load.
//!
//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows are split into their scales and their quants so
//! kernels load 8 block scales in one go: `[d: f16 x nb][m: f16 x nb, Q4_1/Q5_1][quants: nb x
//! (qs[16] | qh u32 + qs[16] | qs[32])]`.
//! Same bytes per row as GGML's interleaved blocks. Other formats keep GGML's layout.

use kiln_quant::{dequantize_row, GgmlType, QuantError};

/// Bytes of scales per block, and of quants per block, of the split formats.
fn split_parts(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q4_0 => Some((2, 16)),
        GgmlType::Q4_1 => Some((4, 16)),
        GgmlType::Q8_0 => Some((2, 32)),
        GgmlType::Q5_0 => Some((2, 20)),
        GgmlType::Q5_1 => Some((4, 20)),
        _ => None,
    }
}

/// Whether rows of `ty` are stored split (otherwise as GGML blocks).
pub fn is_split(ty: GgmlType) -> bool {
    split_parts(ty).is_some()
}

/// GGML row -> packed row (same length).
pub fn pack_row(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let Some((head, qs)) = split_parts(ty) else {
        dst.copy_from_slice(src);
        return;
    };
    let bs = head + qs;
    let nb = src.len() / bs;
    let fields = head / 2; // f16 fields per block: d, or d and m
    for (i, b) in src.chunks_exact(bs).enumerate() {
        for f in 0..fields {
            let at = 2 * (f * nb + i);
            dst[at..at + 2].copy_from_slice(&b[2 * f..2 * f + 2]);
        }
        let at = head * nb + qs * i;
        dst[at..at + qs].copy_from_slice(&b[head..]);
    }
}

/// Packed row -> GGML row.
pub fn unpack_row(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let Some((head, qs)) = split_parts(ty) else {
        dst.copy_from_slice(src);
        return;
    };
    let bs = head + qs;
    let nb = src.len() / bs;
    let fields = head / 2;
    for (i, b) in dst.chunks_exact_mut(bs).enumerate() {
        for f in 0..fields {
            let at = 2 * (f * nb + i);
            b[2 * f..2 * f + 2].copy_from_slice(&src[at..at + 2]);
        }
        let at = head * nb + qs * i;
        b[head..].copy_from_slice(&src[at..at + qs]);
    }
}

/// Dequantizes a packed row into `out`, a block at a time (no allocation).
pub fn dequant_packed_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let Some((head, qs)) = split_parts(ty) else {
        return dequantize_row(ty, src, out);
    };
    let bs = head + qs;
    let nb = src.len() / bs;
    let fields = head / 2;
    let mut block = [0u8; 36];
    for i in 0..nb {
        for f in 0..fields {
            let at = 2 * (f * nb + i);
            block[2 * f..2 * f + 2].copy_from_slice(&src[at..at + 2]);
        }
        let at = head * nb + qs * i;
        block[head..bs].copy_from_slice(&src[at..at + qs]);
        dequantize_row(ty, &block[..bs], &mut out[32 * i..32 * i + 32])?;
    }
    Ok(())
}
