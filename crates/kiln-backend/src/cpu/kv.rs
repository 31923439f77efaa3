//! The CPU KV cache: per layer, each KV head's positions contiguous, `(kv_heads, slots,
//! head_dim)`, as f32 or packed (f16, Q8_0).
//!
//! A cache of every position has one slot per position. A sliding-window cache
//! ([`crate::LlmOps::kv_cache_window`]) has `2 * span` slots, `span` covering what one step
//! reads (the window, the step's new positions, alignment) and a step's worth more:
//! layer `l`'s slot `s` holds position `base[l] + s`. When a step's positions would run
//! past the last slot, the positions its window reads and a step's worth before them move
//! to the front first (one copy of about a window every `span` positions, and a sequence
//! may still go back one step) and `base` follows; attention then runs on positions
//! relative to `base`, which is a multiple of 64, so its sums are the ones the full cache
//! gives.

use super::ops::kv_packed::PackedKv;
use crate::{AttnShape, KvWindow};

pub struct CpuKvCache {
    /// Slots per layer and head.
    pub(super) n_ctx: usize,
    pub(super) kv_dim: usize,
    pub(super) head_dim: usize,
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
    /// Keys and values stored as f16 or Q8_0 instead (then `k`, `v` are empty).
    pub(super) packed: Option<PackedKv>,
    /// A sliding-window cache: its window and positions (else None: slot = position).
    pub(super) window: Option<Window>,
}

#[derive(Clone)]
pub(super) struct Window {
    pub(super) window: usize,
    /// The most positions a step writes.
    pub(super) chunk: usize,
    /// Positions the sequence may reach (the cache's `n_ctx`).
    pub(super) positions: usize,
    /// Per layer: the position slot 0 holds.
    pub(super) base: Vec<usize>,
}

/// Positions of a compacted window start at a multiple of this.
const ALIGN: usize = 64;

/// Slots of a window cache for `win`, or None where they would not be fewer than `n_ctx`.
pub(super) fn window_slots(win: KvWindow, n_ctx: usize) -> Option<usize> {
    let span = (win.window + 2 * win.chunk + ALIGN).next_multiple_of(ALIGN);
    (win.window > 0 && 2 * span < n_ctx).then_some(2 * span)
}

impl CpuKvCache {
    /// The slot of `layer` position `pos0` is written at, for a step writing `n` positions
    /// from `pos0`: moves the positions the step's window reads to the front first where
    /// the step would run past the last slot (a step from position 0 starts afresh).
    pub(super) fn place(&mut self, layer: usize, pos0: usize, n: usize) -> usize {
        let slots = self.n_ctx;
        let Some(w) = &mut self.window else {
            assert!(
                pos0 + n <= slots,
                "kv_store past the cache (caller checks the context)"
            );
            return pos0;
        };
        assert!(
            pos0 + n <= w.positions,
            "kv_store past the cache (caller checks the context)"
        );
        let base = &mut w.base[layer];
        if pos0 == 0 {
            *base = 0;
        }
        let first = (pos0 + 1).saturating_sub(w.window);
        assert!(
            first >= *base && pos0 >= *base,
            "position {pos0}'s window starts at {first}, before the first held ({}): the caller \
             checks kv_kept_from",
            *base
        );
        if pos0 + n > *base + slots {
            let new = first.saturating_sub(w.chunk).max(*base) / ALIGN * ALIGN;
            let (from, len) = (new - *base, pos0 - new);
            assert!(
                len + n <= slots,
                "a step of {n} positions past the window cache's span"
            );
            let (hd, heads) = (self.head_dim, self.kv_dim / self.head_dim);
            match &mut self.packed {
                Some(p) => p.move_front(layer, from, len),
                None => {
                    for plane in [&mut self.k[layer], &mut self.v[layer]] {
                        for h in 0..heads {
                            let at = h * slots * hd;
                            plane.copy_within(at + from * hd..at + (from + len) * hd, at);
                        }
                    }
                }
            }
            *base = new;
        }
        pos0 - *base
    }

    /// `s` as `layer`'s slots see it: positions relative to the first slot's.
    pub(super) fn local(&self, layer: usize, mut s: AttnShape) -> AttnShape {
        if let Some(w) = &self.window {
            assert!(
                s.window > 0 && s.window <= w.window,
                "attention of window {} over a cache of window {}",
                s.window,
                w.window
            );
            s.pos0 -= w.base[layer];
        }
        s
    }

    /// The first position every layer still holds.
    pub(super) fn kept_from(&self) -> usize {
        self.window
            .as_ref()
            .map_or(0, |w| w.base.iter().copied().max().unwrap_or(0))
    }

    /// Slots to copy for a sequence's first `n` positions, and `self`'s bases for `dst`.
    pub(super) fn copy_slots(&self, n: usize) -> usize {
        match &self.window {
            None => n.min(self.n_ctx),
            Some(w) => {
                let lo = w.base.iter().copied().min().unwrap_or(0);
                n.saturating_sub(lo).min(self.n_ctx)
            }
        }
    }
}
