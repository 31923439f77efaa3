//! out (n, rows) = x (n, cols) @ W^T (+ bias), W in any stored format.

use super::dot;
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::{CpuTensor, CpuWeight};

pub fn matmul(
    pool: &Pool,
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
                bytemuck_f32(&w.bytes[r * w.row_bytes..(r + 1) * w.row_bytes])
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
fn bytemuck_f32(bytes: &[u8]) -> &[f32] {
    let (head, body, tail) = unsafe { bytes.align_to::<f32>() };
    assert!(head.is_empty() && tail.is_empty() && cfg!(target_endian = "little"));
    body
}
