//! Rotary embedding in place over x (n, heads * head_dim).

use crate::cpu::CpuTensor;
use crate::{RopeConfig, RopeStyle};

/// Rotated pairs per head kiln supports on the CPU (head sizes up to 512).
const MAX_PAIRS: usize = 256;

/// `inv`: the config's per-pair frequencies (`RopeConfig::inv_freqs`, cached by the caller).
pub fn rope(x: &mut CpuTensor, cfg: &RopeConfig, inv: &[f32], heads: usize, pos0: usize, n: usize) {
    let hd = cfg.head_dim;
    let half = cfg.dims / 2;
    assert!(half <= MAX_PAIRS && inv.len() == half);
    let (mut cos, mut sin) = ([0f32; MAX_PAIRS], [0f32; MAX_PAIRS]);
    for t in 0..n {
        // One sin/cos per pair and token, shared by every head.
        let pos = (pos0 + t) as f32;
        for (i, &f) in inv.iter().enumerate() {
            (sin[i], cos[i]) = (pos * f).sin_cos();
        }
        for h in 0..heads {
            let base = t * x.cols + h * hd;
            let v = &mut x.data[base..base + hd];
            for i in 0..half {
                let (a, b) = match cfg.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (v[a], v[b]);
                v[a] = x0 * cos[i] - x1 * sin[i];
                v[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}
