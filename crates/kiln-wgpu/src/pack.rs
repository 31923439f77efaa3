//! Host-side repacking of GGML blocks into the u32-word layouts the WGSL kernels read
//! (shaders/weights.wgsl): each block's scale words beside its values, so one row is one
//! contiguous run of words and a block starts on a word.
//!
//! | format | words                                                                 |
//! |--------|-----------------------------------------------------------------------|
//! | F32    | one per value                                                          |
//! | F16    | two values per word, over the whole matrix                             |
//! | Q4_0   | per 32: [d], 4 words of nibbles (GGML's own order)                     |
//! | Q4_1   | per 32: [d, m], 4 words of nibbles                                     |
//! | Q8_0   | per 32: [d], 8 words of int8                                           |
//! | Q4_K   | per 256: [d, dmin], 3 words of scales, 8 x 4 words of nibbles           |
//! | Q6_K   | per 256: 8 x 4 words low nibbles, 8 x 2 words high bits, 4 words scales, [d] |
//!
//! Nibble words of a block: byte j holds value j (low nibble) and value j + 16. BF16 and the
//! formats without a kernel of their own (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, ...) are widened to
//! F32 (exact).

use kiln_quant::{high2_16, nibbles32, q4k_values, q6k_values, GgmlType, QuantError, QK_K};

pub const FMT_F32: u32 = 0;
pub const FMT_F16: u32 = 1;
pub const FMT_Q4_0: u32 = 2;
pub const FMT_Q4_1: u32 = 3;
pub const FMT_Q8_0: u32 = 4;
pub const FMT_Q4_K: u32 = 5;
pub const FMT_Q6_K: u32 = 6;

/// A matrix in kernel layout: `words` (padded to a whole word), `rw` words per row.
#[derive(Debug, Default)]
pub struct Packed {
    pub fmt: u32,
    pub rw: usize,
    pub bytes: Vec<u8>,
}

/// Repacks `rows` rows of `cols` values stored as `ty` (`bytes` holds them contiguously).
pub fn pack(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Packed, QuantError> {
    let row_bytes = ty.row_bytes(cols)?;
    if Some(bytes.len()) != row_bytes.checked_mul(rows) {
        return Err(QuantError::WrongByteLength {
            ty: ty.name(),
            n: rows * cols,
            expected: row_bytes * rows,
            got: bytes.len(),
        });
    }
    let mut p = Packed::default();
    match ty {
        GgmlType::F32 => {
            p.fmt = FMT_F32;
            p.rw = cols;
            p.bytes = bytes.to_vec();
        }
        GgmlType::F16 => {
            p.fmt = FMT_F16;
            p.rw = cols.div_ceil(2);
            p.bytes = bytes.to_vec();
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let (fmt, hdr, qlen) = match ty {
                GgmlType::Q4_0 => (FMT_Q4_0, 2, 16),
                GgmlType::Q4_1 => (FMT_Q4_1, 4, 16),
                _ => (FMT_Q8_0, 2, 32),
            };
            p.fmt = fmt;
            p.rw = (cols / 32) * (1 + qlen / 4);
            p.bytes.reserve(rows * p.rw * 4);
            for b in bytes.chunks_exact(hdr + qlen) {
                p.bytes.extend_from_slice(&b[..hdr]);
                p.bytes.extend(std::iter::repeat_n(0, 4 - hdr));
                p.bytes.extend_from_slice(&b[hdr..]);
            }
        }
        GgmlType::Q4_K => {
            p.fmt = FMT_Q4_K;
            p.rw = (cols / QK_K) * 36;
            p.bytes.reserve(rows * p.rw * 4);
            for b in bytes.chunks_exact(144) {
                p.bytes.extend_from_slice(&b[..16]);
                for v in q4k_values(b).chunks_exact(32) {
                    p.bytes.extend_from_slice(&nibbles32(v));
                }
            }
        }
        GgmlType::Q6_K => {
            p.fmt = FMT_Q6_K;
            p.rw = (cols / QK_K) * 53;
            p.bytes.reserve(rows * p.rw * 4);
            for b in bytes.chunks_exact(210) {
                let q = q6k_values(b);
                for v in q.chunks_exact(32) {
                    p.bytes.extend_from_slice(&nibbles32(v));
                }
                for half in q.chunks_exact(16) {
                    p.bytes.extend_from_slice(&high2_16(half).to_le_bytes());
                }
                p.bytes.extend_from_slice(&b[192..208]);
                p.bytes.extend_from_slice(&[b[208], b[209], 0, 0]);
            }
        }
        other => {
            let v = kiln_quant::dequantize(other, bytes, rows * cols)?;
            p.fmt = FMT_F32;
            p.rw = cols;
            p.bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        }
    }
    while p.bytes.len() % 4 != 0 || p.bytes.is_empty() {
        p.bytes.push(0);
    }
    Ok(p)
}
