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
        let (cos, sin) = (&cos[..half], &sin[..half]);
        for h in 0..heads {
            let base = t * x.cols + h * hd;
            let v = &mut x.data[base..base + 2 * half];
            // The style chosen outside the pair loop, which then runs as vector code.
            match cfg.style {
                RopeStyle::Interleaved => {
                    let pairs = v.as_chunks_mut::<2>().0;
                    for ((p, &c), &s) in pairs.iter_mut().zip(cos).zip(sin) {
                        let (x0, x1) = (p[0], p[1]);
                        p[0] = x0 * c - x1 * s;
                        p[1] = x0 * s + x1 * c;
                    }
                }
                RopeStyle::Neox => {
                    let (lo, hi) = v.split_at_mut(half);
                    for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
                        let (x0, x1) = (*a, *b);
                        *a = x0 * c - x1 * s;
                        *b = x0 * s + x1 * c;
                    }
                }
            }
        }
    }
}
