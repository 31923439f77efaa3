//! LayerNorm: y = (x − mean(x)) / sqrt(var(x) + eps) · gamma + beta, per row.

use crate::cpu::CpuTensor;

pub fn layer_norm(
    x: &CpuTensor,
    gamma: &CpuTensor,
    beta: &CpuTensor,
    eps: f32,
    n: usize,
    out: &mut CpuTensor,
) {
    let c = x.cols;
    let (g, b) = (&gamma.data[..c], &beta.data[..c]);
    for t in 0..n {
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
        let o = &mut out.data[t * c..(t + 1) * c];
        for i in 0..c {
            o[i] = (row[i] - mean) * inv * g[i] + b[i];
        }
    }
}
