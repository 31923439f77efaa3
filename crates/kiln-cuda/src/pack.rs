//! Host-side repacking of GGML blocks into the layouts the kernels read (kernels/*.cu).
//!
//! Every quantized format becomes blocks of 32 values; per block, 4-bit parts sit in one
//! 16-byte vector (byte j holds values j and j + 16, low nibble first) so one 128-bit load
//! brings a block, and scales move to arrays of their own so those loads stay aligned:
//!
//! | format | `q` per block            | `s` per block             | `s2` per 256-value super-block |
//! |--------|--------------------------|---------------------------|--------------------------------|
//! | Q4_0   | 16 B nibbles             | f16 d                     | -                              |
//! | Q4_1   | 16 B nibbles             | f16 d, f16 m              | -                              |
//! | Q8_0   | 32 B int8                | f16 d                     | -                              |
//! | Q4_K   | 16 B nibbles             | 2 B: scale, min (6 bits)  | 4 B: f16 d, f16 dmin           |
//! | Q6_K   | 16 B low nibbles         | 8 B: 2 high bits x 32     | 20 B: 16 int8 scales, f16 d, pad |
//!
//! Q4_K's packed scales are unpacked to a byte each (a block's scale and min, one 16-bit load;
//! 20 bytes a super-block against 16), so a decode lane holds 6 registers of a block, not 10.
//! Q6_K's high bits: word 0 holds values 0..15, word 1 values 16..31, value e at bits 2e.
//! Q5_0 is repacked as Q8_0 (its values minus 16 are int8s under the same scale). F32 and
//! F16 stay as they are; BF16 and every other format (Q5_1, Q2_K, Q3_K, Q5_K, ...) are
//! dequantized to F32 (exact: no value changes). MLX affine 4-bit matrices arrive as
//! Q4_1 blocks ([`mlx_as_q4_1`]).

use kiln_quant::{
    high2_16, nibbles32, q4k_scale_mins, q4k_values, q6k_values, GgmlType, QuantError,
};

pub const FMT_F32: i32 = 0;
pub const FMT_F16: i32 = 1;
pub const FMT_Q4_0: i32 = 2;
pub const FMT_Q4_1: i32 = 3;
pub const FMT_Q8_0: i32 = 4;
pub const FMT_Q4_K: i32 = 5;
pub const FMT_Q6_K: i32 = 6;

/// Bytes of one Q6_K super-block record in `s2`.
pub const Q6K_REC: usize = 20;

/// A matrix in kernel layout, on the host.
#[derive(Debug, Default)]
pub struct Packed {
    pub fmt: i32,
    pub q: Vec<u8>,
    pub s: Vec<u8>,
    pub s2: Vec<u8>,
}

fn f16_at(b: &[u8], i: usize) -> [u8; 2] {
    [b[i], b[i + 1]]
}

/// Repacks `rows` rows of `cols` values stored as `ty` (`bytes` holds them contiguously).
pub fn pack(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Packed, QuantError> {
    let row_bytes = ty.row_bytes(cols)?;
    if bytes.len() != row_bytes * rows {
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
            p.q = bytes.to_vec();
        }
        GgmlType::F16 => {
            p.fmt = FMT_F16;
            p.q = bytes.to_vec();
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let (fmt, hdr, qlen) = match ty {
                GgmlType::Q4_0 => (FMT_Q4_0, 2, 16),
                GgmlType::Q4_1 => (FMT_Q4_1, 4, 16),
                _ => (FMT_Q8_0, 2, 32),
            };
            p.fmt = fmt;
            let blocks = bytes.len() / (hdr + qlen);
            p.s.reserve_exact(blocks * hdr);
            p.q.reserve_exact(blocks * qlen);
            for b in bytes.chunks_exact(hdr + qlen) {
                p.s.extend_from_slice(&b[..hdr]);
                p.q.extend_from_slice(&b[hdr..]);
            }
        }
        GgmlType::Q5_0 => {
            // Exactly as Q8_0: a value is d * (q - 16) with q of five bits, so q - 16 is an
            // int8 under the same f16 scale (34 bytes a block instead of 22, against 128 as
            // f32; llama.cpp's Q4_K_M files hold Q5_0 where rows are no multiple of 256).
            p.fmt = FMT_Q8_0;
            p.s.reserve_exact(bytes.len() / 22 * 2);
            p.q.reserve_exact(bytes.len() / 22 * 32);
            for b in bytes.chunks_exact(22) {
                p.s.extend_from_slice(&b[..2]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..32 {
                    let nib = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                    let q = nib | (((qh >> j) & 1) as u8) << 4;
                    p.q.push((q as i8 - 16) as u8);
                }
            }
        }
        GgmlType::Q4_K => {
            p.fmt = FMT_Q4_K;
            for b in bytes.chunks_exact(144) {
                p.s2.extend_from_slice(&b[..4]);
                for (sc, mn) in q4k_scale_mins(b) {
                    p.s.extend_from_slice(&[sc, mn]);
                }
                for v in q4k_values(b).chunks_exact(32) {
                    p.q.extend_from_slice(&nibbles32(v));
                }
            }
        }
        GgmlType::Q6_K => {
            p.fmt = FMT_Q6_K;
            for b in bytes.chunks_exact(210) {
                for v in q6k_values(b).chunks_exact(32) {
                    p.q.extend_from_slice(&nibbles32(v));
                    for half in v.chunks_exact(16) {
                        p.s.extend_from_slice(&high2_16(half).to_le_bytes());
                    }
                }
                p.s2.extend_from_slice(&b[192..208]);
                p.s2.extend_from_slice(&f16_at(b, 208));
                p.s2.extend_from_slice(&[0, 0]);
            }
        }
        other => {
            // Exact as f32: BF16 and the formats without a kernel of their own.
            let v = kiln_quant::dequantize(other, bytes, rows * cols)?;
            p.fmt = FMT_F32;
            p.q = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        }
    }
    Ok(p)
}

/// MLX affine 4-bit rows (w = scale * q + bias per group of 32, 64 or 128) as GGML Q4_1
/// blocks (w = d * q + m per 32 values): each group's scale and bias become the d and m of
/// its 32-value blocks, the nibbles are reordered to Q4_1's (byte j holds values j and
/// j + 16). Exact when every scale and bias is an f16 (checkpoints store f16 or bf16; a bf16
/// is an f16 unless it is tiny or huge): `None` otherwise, and for 8-bit rows (Q4_1 has no
/// 8-bit sibling with a bias), which then take the f32 path.
pub fn mlx_as_q4_1(
    bits: u32,
    group: usize,
    rows: usize,
    cols: usize,
    q: &[u8],
    scales: &[f32],
    biases: &[f32],
) -> Option<Vec<u8>> {
    use half::f16;
    if bits != 4 || group % 32 != 0 || cols % group != 0 {
        return None;
    }
    let (groups, qb) = (cols / group, cols / 2);
    if q.len() != rows * qb || scales.len() != rows * groups || biases.len() != scales.len() {
        return None;
    }
    let exact = |v: f32| {
        let h = f16::from_f32(v);
        (h.to_f32() == v).then_some(h.to_le_bytes())
    };
    let mut out = Vec::with_capacity(rows * cols / 32 * 20);
    for r in 0..rows {
        let row = &q[r * qb..][..qb];
        for b in 0..cols / 32 {
            let g = r * groups + b * 32 / group;
            out.extend_from_slice(&exact(scales[g])?);
            out.extend_from_slice(&exact(biases[g])?);
            let nib = |j: usize| {
                let v = 32 * b + j;
                (row[v / 2] >> (4 * (v % 2))) & 0x0f
            };
            out.extend((0..16).map(|j| nib(j) | (nib(j + 16) << 4)));
        }
    }
    Some(out)
}

/// Bytes of the quantized activations (kernels/*.cu quant_act) of `ntok` tokens of `cols`.
pub fn xq_bytes(cols: usize, ntok: usize) -> usize {
    let nb = cols / 32;
    // inv from the next multiple of 4 bytes (kernels/products.cu, xq_inv_offset).
    let inv = (ntok * cols + ntok * nb * 4 + ntok * (cols / 16) * 2).div_ceil(4) * 4;
    (inv + ntok * 4).div_ceil(16) * 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn h(b: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
    }

    /// Value c of row r of a packed matrix: the kernels' `packed_value`, on the host.
    fn value(p: &Packed, cols: usize, r: usize, c: usize) -> f32 {
        let (nb, b, j) = (cols / 32, c / 32, c % 32);
        let blk = r * nb + b;
        match p.fmt {
            FMT_F32 => {
                let i = 4 * (r * cols + c);
                f32::from_le_bytes(p.q[i..i + 4].try_into().unwrap())
            }
            FMT_F16 => h(&p.q, 2 * (r * cols + c)),
            FMT_Q8_0 => h(&p.s, 2 * blk) * p.q[blk * 32 + j] as i8 as f32,
            _ => {
                let byte = p.q[blk * 16 + j % 16];
                let mut q = if j < 16 { byte & 15 } else { byte >> 4 } as i32;
                match p.fmt {
                    FMT_Q4_0 => h(&p.s, 2 * blk) * (q - 8) as f32,
                    FMT_Q4_1 => h(&p.s, 4 * blk) * q as f32 + h(&p.s, 4 * blk + 2),
                    FMT_Q4_K => {
                        let hdr = &p.s2[(r * (nb / 8) + b / 8) * 4..][..4];
                        let (sc, mn) = (p.s[2 * blk], p.s[2 * blk + 1]);
                        h(hdr, 0) * sc as f32 * q as f32 - h(hdr, 2) * mn as f32
                    }
                    FMT_Q6_K => {
                        let w = |k: usize| {
                            u32::from_le_bytes(p.s[8 * blk + 4 * k..][..4].try_into().unwrap())
                        };
                        let hb = if j < 16 {
                            (w(0) >> (2 * j)) & 3
                        } else {
                            (w(1) >> (2 * (j - 16))) & 3
                        };
                        q |= (hb << 4) as i32;
                        let rec = &p.s2[(r * (nb / 8) + b / 8) * Q6K_REC..][..Q6K_REC];
                        h(rec, 16) * rec[2 * (b % 8) + j / 16] as i8 as f32 * (q - 32) as f32
                    }
                    _ => unreachable!(),
                }
            }
        }
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    /// Every packed value equals the format's own dequantization, for each format the
    /// kernels read, Q5_0 (repacked as Q8_0) and one that is widened to f32.
    #[test]
    fn packed_values_equal_dequantization() {
        let (rows, cols) = (3, 512);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::F16,
        ] {
            let x = random(rows * cols, 7 + ty.id() as u64);
            let bytes = kiln_quant::quantize(ty, &x).unwrap();
            let want = kiln_quant::dequantize(ty, &bytes, rows * cols).unwrap();
            let p = pack(ty, rows, cols, &bytes).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    let got = value(&p, cols, r, c);
                    assert_eq!(got, want[r * cols + c], "{ty:?} row {r} col {c}");
                }
            }
        }
    }

    /// MLX 4-bit rows repacked as Q4_1 give MLX's own dequantization, value for value, for
    /// every group size; a scale that is no f16 declines (the f32 path takes it).
    #[test]
    fn mlx_4bit_repacks_exactly() {
        use kiln_quant::{mlx_dequantize_row, mlx_quantize_row, MlxLayout};
        let (rows, cols) = (3, 256);
        for group in [32, 64, 128] {
            let l = MlxLayout::new(4, group, cols).unwrap();
            let x = random(rows * cols, 11 + group as u64);
            let (qb, g) = (l.q_bytes(cols), l.groups(cols));
            let (mut q, mut sc, mut bi) = (
                vec![0u8; rows * qb],
                vec![0f32; rows * g],
                vec![0f32; rows * g],
            );
            for r in 0..rows {
                mlx_quantize_row(
                    l,
                    &x[r * cols..][..cols],
                    &mut q[r * qb..][..qb],
                    &mut sc[r * g..][..g],
                    &mut bi[r * g..][..g],
                );
            }
            // Checkpoints hold f16 scales and biases.
            for v in sc.iter_mut().chain(bi.iter_mut()) {
                *v = f16::from_f32(*v).to_f32();
            }
            let bytes = mlx_as_q4_1(4, group, rows, cols, &q, &sc, &bi).unwrap();
            let p = pack(GgmlType::Q4_1, rows, cols, &bytes).unwrap();
            let mut want = vec![0f32; cols];
            for r in 0..rows {
                mlx_dequantize_row(
                    l,
                    &q[r * qb..][..qb],
                    &sc[r * g..][..g],
                    &bi[r * g..][..g],
                    &mut want,
                )
                .unwrap();
                for c in 0..cols {
                    assert_eq!(
                        value(&p, cols, r, c),
                        want[c],
                        "group {group} row {r} col {c}"
                    );
                }
            }
            sc[1] = 1e-9; // below f16's range
            assert!(mlx_as_q4_1(4, group, rows, cols, &q, &sc, &bi).is_none());
        }
        assert!(mlx_as_q4_1(8, 64, 1, 64, &[0; 64], &[1.0], &[0.0]).is_none());
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(pack(GgmlType::Q4_0, 2, 64, &[0u8; 71]).is_err());
    }
}
