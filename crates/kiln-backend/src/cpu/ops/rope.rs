//! Rotary embedding in place over x (n, heads * head_dim).

use crate::cpu::CpuTensor;
use crate::{RopeConfig, RopeStyle};

pub fn rope(x: &mut CpuTensor, cfg: &RopeConfig, heads: usize, pos0: usize, n: usize) {
    let hd = cfg.head_dim;
    let half = cfg.dims / 2;
    // Frequencies are cheap next to the matmuls; computing them here keeps the op stateless.
    let inv = cfg.inv_freqs();
    for t in 0..n {
        let pos = (pos0 + t) as f32;
        for h in 0..heads {
            let base = t * x.cols + h * hd;
            let v = &mut x.data[base..base + hd];
            for (i, &f) in inv.iter().enumerate() {
                let (sin, cos) = (pos * f).sin_cos();
                let (a, b) = match cfg.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (v[a], v[b]);
                v[a] = x0 * cos - x1 * sin;
                v[b] = x0 * sin + x1 * cos;
            }
        }
    }
}
