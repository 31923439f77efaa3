//! RMSNorm: y = x / sqrt(mean(x^2) + eps) * w

use crate::cpu::CpuTensor;

/// 1 / sqrt(mean(x^2) + eps). The squares are exact in f64 and summed in eight chains (lane
/// i takes x[i], x[i + 8], ...; the chains then added in order, then the tail): one serial
/// chain of f64 adds cost ~4 cycles a value, which made the norms a few percent of a decode
/// step, run on the main thread while the workers wait.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let (chunks, tail) = x.as_chunks::<8>();
    let mut acc = [0f64; 8];
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += (v as f64) * (v as f64);
        }
    }
    let mut ss = acc.iter().sum::<f64>();
    for &v in tail {
        ss += (v as f64) * (v as f64);
    }
    (1.0 / ((ss / x.len() as f64) + eps as f64).sqrt()) as f32
}

fn norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = inv_rms(x, eps);
    for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = xv * scale * wv;
    }
}

pub fn rms_norm(x: &CpuTensor, w: &CpuTensor, eps: f32, n: usize, out: &mut CpuTensor) {
    let c = x.cols;
    for t in 0..n {
        norm_into(
            &x.data[t * c..(t + 1) * c],
            &w.data[..c],
            eps,
            &mut out.data[t * c..(t + 1) * c],
        );
    }
}

/// x viewed as (n * heads, head_dim) with head_dim = w.len(), normalised per head, in place.
pub fn rms_norm_heads(x: &mut CpuTensor, w: &CpuTensor, eps: f32, n: usize) {
    let hd = w.cols;
    for head in x.data[..n * x.cols].chunks_exact_mut(hd) {
        let scale = inv_rms(head, eps);
        for (v, &wv) in head.iter_mut().zip(&w.data[..hd]) {
            *v = *v * scale * wv;
        }
    }
}
