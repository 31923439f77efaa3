//! LayerNorm: y = (x − mean(x)) / sqrt(var(x) + eps) · gamma + beta, per row.

use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

/// Rows split over the pool's threads (each row's arithmetic is the same on any split).
pub fn layer_norm(
    pool: &Pool,
    x: &CpuTensor,
    gamma: &CpuTensor,
    beta: &CpuTensor,
    eps: f32,
    n: usize,
    out: &mut CpuTensor,
) {
    let c = x.cols;
    assert!(out.cols == c && out.data.len() >= n * c && x.data.len() >= n * c);
    let dst = SharedMut(out.data.as_mut_ptr());
    let min_rows = (16384 / c.max(1)).max(1);
    if n < 2 * min_rows {
        return rows(x, gamma, beta, eps, 0, n, dst);
    }
    pool.run_aligned(n, min_rows, |t0, t1| rows(x, gamma, beta, eps, t0, t1, dst));
}

fn rows(
    x: &CpuTensor,
    gamma: &CpuTensor,
    beta: &CpuTensor,
    eps: f32,
    t0: usize,
    t1: usize,
    dst: SharedMut,
) {
    let c = x.cols;
    let (g, b) = (&gamma.data[..c], &beta.data[..c]);
    for t in t0..t1 {
        let row = &x.data[t * c..(t + 1) * c];
        // Two passes in f64: the mean first, then the variance around it.
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
        let var = row
            .iter()
            .map(|&v| {
                let d = v as f64 - mean;
                d * d
            })
            .sum::<f64>()
            / c as f64;
        let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
        let mean = mean as f32;
        // SAFETY: row t of out belongs to this caller alone; bounds asserted above.
        let o = unsafe { std::slice::from_raw_parts_mut(dst.0.add(t * c), c) };
        for i in 0..c {
            o[i] = (row[i] - mean) * inv * g[i] + b[i];
        }
    }
}
