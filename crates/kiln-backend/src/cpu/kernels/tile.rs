//! Weight tiles decoded for prefill: when many tokens share one weight row, unpacking its
//! quants once per tile instead of once per token halves the work of the inner loop.
//!
//! Every 32-value block of the packed 32-value formats becomes 32 quants `q` (unsigned, or
//! signed for Q8_0), a scale `s` and an offset field `o` with value_j = s * q_j + c * o for
//! the format's constant c, so a row . activation product is
//! sum_blocks d_x s (q . x) + c * sum_blocks d_x o (sum x).
//!
//! The SIMD tile kernels reproduce the four-row kernels' arithmetic exactly (same products,
//! same summation order), so a token's logits do not depend on how many tokens share the
//! batch: speculative decoding and plain decoding agree bit for bit.

use kiln_quant::GgmlType;

use super::scalar::f16;
use super::ActRow;

#[derive(Default)]
pub struct DecodedTile {
    /// rows x nb x 32 unsigned quants.
    pub q: Vec<u8>,
    /// rows x nb scales and offsets.
    pub s: Vec<f32>,
    pub o: Vec<f32>,
    /// The format's offset constant (-8 for Q4_0, 1 for Q4_1, -16 for Q5_0, 1 for Q5_1, 0).
    pub c: f32,
    /// Quants are signed bytes (Q8_0).
    pub signed: bool,
    pub nb: usize,
}

/// Whether `decode_rows` handles the format.
pub fn can_decode(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

impl DecodedTile {
    /// Decodes `rows` consecutive packed rows of `row_bytes` each from `w`.
    pub fn decode_rows(&mut self, ty: GgmlType, w: &[u8], row_bytes: usize, rows: usize) {
        let bs = ty.type_size();
        let nb = row_bytes / bs;
        self.nb = nb;
        (self.c, self.signed) = match ty {
            GgmlType::Q4_0 => (-8.0, false),
            GgmlType::Q5_0 => (-16.0, false),
            GgmlType::Q8_0 => (0.0, true),
            _ => (1.0, false),
        };
        self.q.resize(rows * nb * 32, 0);
        self.s.resize(rows * nb, 0.0);
        self.o.resize(rows * nb, 0.0);
        for r in 0..rows {
            let row = &w[r * row_bytes..(r + 1) * row_bytes];
            for i in 0..nb {
                let q = &mut self.q[(r * nb + i) * 32..(r * nb + i + 1) * 32];
                let (s, o) = decode_block(ty, row, nb, i, q);
                self.s[r * nb + i] = s;
                self.o[r * nb + i] = o;
            }
        }
    }
}

/// Block i of a packed row (nb blocks) -> 32 unsigned quants, scale, offset.
fn decode_block(ty: GgmlType, row: &[u8], nb: usize, i: usize, q: &mut [u8]) -> (f32, f32) {
    let nibbles = |qs: &[u8], q: &mut [u8]| {
        for j in 0..16 {
            q[j] = qs[j] & 15;
            q[j + 16] = qs[j] >> 4;
        }
    };
    let high = |qh: u32, q: &mut [u8]| {
        for (j, v) in q.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) << 4) as u8;
        }
    };
    match ty {
        GgmlType::Q4_0 => {
            let d = f16(row, 2 * i);
            nibbles(&row[2 * nb + 16 * i..2 * nb + 16 * i + 16], q);
            (d, d)
        }
        GgmlType::Q4_1 => {
            nibbles(&row[4 * nb + 16 * i..4 * nb + 16 * i + 16], q);
            (f16(row, 2 * i), f16(row, 2 * (nb + i)))
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (fields, body) = if ty == GgmlType::Q5_0 {
                (1, 2 * nb)
            } else {
                (2, 4 * nb)
            };
            let b = &row[body + 20 * i..body + 20 * i + 20];
            nibbles(&b[4..], q);
            high(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), q);
            let d = f16(row, 2 * i);
            (
                d,
                if fields == 1 {
                    d
                } else {
                    f16(row, 2 * (nb + i))
                },
            )
        }
        GgmlType::Q8_0 => {
            q.copy_from_slice(&row[2 * nb + 32 * i..2 * nb + 32 * i + 32]);
            (f16(row, 2 * i), 0.0)
        }
        _ => unreachable!("can_decode is checked by callers"),
    }
}

/// Rows r..r+4 of a decoded tile against one activation row.
pub type TileDotFn = unsafe fn(tile: &DecodedTile, r: usize, a: ActRow, out: &mut [f32; 4]);
