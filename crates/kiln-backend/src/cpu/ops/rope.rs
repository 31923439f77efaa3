//! Rotary embedding in place over x (n, heads * head_dim).

use crate::cpu::CpuTensor;
use crate::{RopeConfig, RopeStyle};

/// Rotated pairs per head kiln supports on the CPU (head sizes up to 512).
const MAX_PAIRS: usize = 256;

/// Positions whose angles [`Angles`] keeps (a decode step's sequences or a prompt chunk, in
/// every layer).
const KEPT_POSITIONS: usize = 1024;

/// A config's per-pair frequencies (`RopeConfig::inv_freqs`) and, for the positions last
/// rotated, each pair's sine and cosine (sines then cosines, a row a position).
pub struct Angles {
    inv: Vec<f32>,
    rows: std::collections::HashMap<usize, Box<[f32]>>,
}

impl Angles {
    pub fn new(inv: Vec<f32>) -> Angles {
        Angles {
            inv,
            rows: Default::default(),
        }
    }

    /// Position `pos`'s row: one sin/cos per pair, shared by every head, computed once.
    fn row(&mut self, pos: usize) -> &[f32] {
        if !self.rows.contains_key(&pos) && self.rows.len() == KEPT_POSITIONS {
            self.rows.clear();
        }
        let inv = &self.inv;
        self.rows.entry(pos).or_insert_with(|| {
            let half = inv.len();
            let mut r = vec![0f32; 2 * half].into_boxed_slice();
            let (sin, cos) = r.split_at_mut(half);
            for ((s, c), &f) in sin.iter_mut().zip(cos.iter_mut()).zip(inv) {
                (*s, *c) = (pos as f32 * f).sin_cos();
            }
            r
        })
    }
}

pub fn rope(
    x: &mut CpuTensor,
    cfg: &RopeConfig,
    angles: &mut Angles,
    heads: usize,
    pos0: usize,
    n: usize,
) {
    let hd = cfg.head_dim;
    let half = cfg.dims / 2;
    assert!(half <= MAX_PAIRS && angles.inv.len() == half);
    for t in 0..n {
        let (sin, cos) = angles.row(pos0 + t).split_at(half);
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
