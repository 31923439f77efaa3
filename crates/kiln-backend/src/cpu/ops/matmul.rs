//! out (n, rows) = x (n, cols) @ W^T (+ bias), W in any stored format.
//!
//! Formats with an integer kernel quantize x to 8-bit blocks once per call and run integer
//! dot products; the rest dequantize each weight row once and reuse it for all n tokens.

use super::dot;
use crate::cpu::kernels::{Kernels, QuantAct};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::{CpuTensor, CpuWeight};

/// Rows per work unit: a tile of weight rows reused across tokens while it sits in L1.
const ROW_TILE: usize = 16;

#[allow(clippy::too_many_arguments)]
pub fn matmul(
    pool: &Pool,
    kernels: &Kernels,
    act: &mut QuantAct,
    w: &CpuWeight,
    x: &CpuTensor,
    bias: Option<&CpuTensor>,
    n: usize,
    out: &mut CpuTensor,
) {
    let (rows, cols) = (w.rows, w.cols);
    assert_eq!(x.cols, cols, "matmul: x has {} cols, W has {cols}", x.cols);
    assert_eq!(
        out.cols, rows,
        "matmul: out has {} cols, W has {rows} rows",
        out.cols
    );
    let dst = SharedMut(out.data.as_mut_ptr());
    // Rows are whole blocks (checked at load), so cols is a multiple of 32 here.
    if let Some(dot_q) = kernels.dot_for(w.ty) {
        act.quantize(&x.data, n, cols);
        let act = &*act;
        pool.run_aligned(rows, ROW_TILE, |r0, r1| {
            for tile in (r0..r1).step_by(ROW_TILE) {
                let tile_end = (tile + ROW_TILE).min(r1);
                for t in 0..n {
                    let a = act.row(t);
                    for r in tile..tile_end {
                        let row = &w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes];
                        // SAFETY: the kernel set was detected on this CPU; row and a cover
                        // the same cols.
                        let v = unsafe { dot_q(row, a) } + bias.map_or(0.0, |b| b.data[r]);
                        // SAFETY: row r is this worker's alone; t*rows + r < n*rows.
                        unsafe { dst.write(t * rows + r, v) };
                    }
                }
            }
        });
        return;
    }
    let f32_weights = w.ty == kiln_quant::GgmlType::F32;
    pool.run(rows, |r0, r1| {
        // Each weight row is dequantized once and used for all n tokens.
        let mut buf = if f32_weights {
            Vec::new()
        } else {
            vec![0f32; cols]
        };
        for r in r0..r1 {
            let row: &[f32] = if f32_weights {
                f32_row(&w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes])
            } else {
                w.dequant_row(r, &mut buf);
                &buf
            };
            let b = bias.map_or(0.0, |b| b.data[r]);
            for t in 0..n {
                let v = dot(row, &x.data[t * cols..(t + 1) * cols]) + b;
                // SAFETY: index t*rows + r is in bounds (out holds n*rows) and row r
                // belongs to this worker alone.
                unsafe { dst.write(t * rows + r, v) };
            }
        }
    });
}

/// Views little-endian f32 bytes as f32 (the allocation holds f32s written by load_weight).
fn f32_row(bytes: &[u8]) -> &[f32] {
    // SAFETY: any bit pattern is a valid f32; alignment is checked below.
    let (head, body, tail) = unsafe { bytes.align_to::<f32>() };
    assert!(head.is_empty() && tail.is_empty() && cfg!(target_endian = "little"));
    body
}
