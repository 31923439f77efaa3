//! Layer norm, adaptive instance norm (AdaIN) and adaptive layer norm over feature maps.

use crate::cpu::CpuTensor;

/// Mean and 1 / sqrt(var + eps) of `v` (biased variance, f64 sums).
fn moments(v: &[f32], eps: f32) -> (f32, f32) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
}

pub fn layer_norm(
    x: &mut CpuTensor,
    w: Option<&CpuTensor>,
    b: Option<&CpuTensor>,
    eps: f32,
    rows: usize,
    cols: usize,
) {
    for r in x.data[..rows * cols].chunks_exact_mut(cols) {
        let (m, inv) = moments(r, eps);
        for (j, v) in r.iter_mut().enumerate() {
            let mut y = (*v - m) * inv;
            if let Some(w) = w {
                y *= w.data[j];
            }
            if let Some(b) = b {
                y += b.data[j];
            }
            *v = y;
        }
    }
}

pub fn ada_in(x: &mut CpuTensor, gb: &CpuTensor, c: usize, len: usize, eps: f32) {
    for (ch, r) in x.data[..c * len].chunks_exact_mut(len).enumerate() {
        let (m, inv) = moments(r, eps);
        let (g, b) = (1.0 + gb.data[ch], gb.data[c + ch]);
        for v in r.iter_mut() {
            *v = g * ((*v - m) * inv) + b;
        }
    }
}

pub fn ada_layer_norm(x: &mut CpuTensor, gb: &CpuTensor, len: usize, c: usize, eps: f32) {
    for r in x.data[..len * c].chunks_exact_mut(c) {
        let (m, inv) = moments(r, eps);
        for (j, v) in r.iter_mut().enumerate() {
            *v = (1.0 + gb.data[j]) * ((*v - m) * inv) + gb.data[c + j];
        }
    }
}
