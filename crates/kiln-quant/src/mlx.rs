//! MLX's affine group-wise format: each row of `cols` values is split into groups of `group`
//! values, each with its own `scale` and `bias`; value j of group g is
//! `w = scale[g] * q[j] + bias[g]`, q an unsigned `bits`-bit integer. The q of a row are packed
//! little-endian into u32 words, value j of a word at bits `bits*j..bits*(j+1)`.
//!
//! Scales and biases are stored as bf16/f16/f32 in the checkpoint; here they are f32 (a
//! lossless widening).

use crate::QuantError;

/// Bits and group sizes MLX checkpoints use.
pub const MLX_BITS: [u32; 2] = [4, 8];
pub const MLX_GROUPS: [usize; 3] = [32, 64, 128];

/// Shape facts of one MLX matrix row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlxLayout {
    pub bits: u32,
    pub group: usize,
}

impl MlxLayout {
    /// Checks bits, group size and that `cols` is a whole number of groups.
    pub fn new(bits: u32, group: usize, cols: usize) -> Result<Self, QuantError> {
        if !MLX_BITS.contains(&bits) {
            return Err(QuantError::Unsupported {
                ty: "MLX affine",
                what: if bits == 2 || bits == 3 || bits == 5 || bits == 6 {
                    "this bit width (4 and 8 are)"
                } else {
                    "a bit width other than 4 or 8"
                },
            });
        }
        if !MLX_GROUPS.contains(&group) {
            return Err(QuantError::Unsupported {
                ty: "MLX affine",
                what: "a group size other than 32, 64 or 128",
            });
        }
        if cols % group != 0 {
            return Err(QuantError::RaggedRow {
                ty: "MLX affine",
                n: cols,
                block: group,
            });
        }
        Ok(MlxLayout { bits, group })
    }

    /// Bytes of packed q per row of `cols` values.
    pub fn q_bytes(&self, cols: usize) -> usize {
        cols * self.bits as usize / 8
    }

    /// Groups per row.
    pub fn groups(&self, cols: usize) -> usize {
        cols / self.group
    }
}

/// The q value at index `j` of a packed row.
#[inline(always)]
pub fn mlx_q(bits: u32, q: &[u8], j: usize) -> u32 {
    match bits {
        4 => ((q[j / 2] >> ((j % 2) * 4)) & 0xf) as u32,
        _ => q[j] as u32,
    }
}

/// Dequantizes one row: `q` packed bytes (`l.q_bytes(out.len())`), `scales` and `biases` one
/// per group.
pub fn mlx_dequantize_row(
    l: MlxLayout,
    q: &[u8],
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let cols = out.len();
    let expected = l.q_bytes(cols);
    if q.len() != expected || scales.len() != l.groups(cols) || biases.len() != l.groups(cols) {
        return Err(QuantError::WrongByteLength {
            ty: "MLX affine",
            n: cols,
            expected,
            got: q.len(),
        });
    }
    for (g, chunk) in out.chunks_exact_mut(l.group).enumerate() {
        let (s, b) = (scales[g], biases[g]);
        for (i, o) in chunk.iter_mut().enumerate() {
            *o = s * mlx_q(l.bits, q, g * l.group + i) as f32 + b;
        }
    }
    Ok(())
}

/// Quantizes one row with MLX's rule: per group, scale = (max - min) / (2^bits - 1), its sign
/// and the edge chosen so the larger-magnitude extreme is represented exactly; then
/// q = round((w - bias) / scale) clipped to the range. Writes packed q, scales and biases.
pub fn mlx_quantize_row(
    l: MlxLayout,
    w: &[f32],
    q: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    let n_bins = ((1u32 << l.bits) - 1) as f32;
    q.fill(0);
    for (g, chunk) in w.chunks_exact(l.group).enumerate() {
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for &v in chunk {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        let mask = lo.abs() > hi.abs();
        let mut scale = ((hi - lo) / n_bins).max(1e-7);
        if !mask {
            scale = -scale;
        }
        let edge = if mask { lo } else { hi };
        let q0 = (edge / scale).round_ties_even();
        let mut bias = 0.0;
        if q0 != 0.0 {
            scale = edge / q0;
            bias = edge;
        }
        scales[g] = scale;
        biases[g] = bias;
        for (i, &v) in chunk.iter().enumerate() {
            let qi = ((v - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u32;
            let j = g * l.group + i;
            match l.bits {
                4 => q[j / 2] |= (qi as u8) << ((j % 2) * 4),
                _ => q[j] = qi as u8,
            }
        }
    }
}
