//! Where a sliding-window KV cache keeps its positions, for backends that hold them in
//! fixed slots (the CPU's and wgpu's caches; CUDA's pages them instead).
//!
//! A window cache ([`crate::LlmOps::kv_cache_window`]) has `span + max(window, step)` slots
//! per layer, `span` covering what one step reads (the window, the step's new positions,
//! alignment) and a step's worth more: layer `l`'s slot `s` holds position `base[l] + s`.
//! When a step's positions would run past the last slot, the positions its window reads and
//! a step's worth before them move to the front first (one copy of about a window every
//! window or step's worth of positions, whichever is more, and a sequence may still go back
//! one step) and `base` follows. Attention then runs on
//! positions relative to `base`, a multiple of 64, so its sums are the ones the cache of
//! every position gives.

use crate::{AttnShape, KvWindow};

/// Positions of a moved window start at a multiple of this.
const ALIGN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSlots {
    pub win: KvWindow,
    /// Positions the sequence may reach (the cache's `n_ctx`).
    pub positions: usize,
    /// Slots per layer.
    pub slots: usize,
    /// Per layer: the position slot 0 holds.
    pub base: Vec<usize>,
}

impl WindowSlots {
    /// Slots for `n_layers` layers of `win` over `n_ctx` positions, or None where they would
    /// not be fewer than `n_ctx` (then the cache holds every position).
    pub fn new(win: KvWindow, n_ctx: usize, n_layers: usize) -> Option<Self> {
        let span = (win.window + 2 * win.chunk + ALIGN).next_multiple_of(ALIGN);
        let slots = span + win.window.max(win.chunk).next_multiple_of(ALIGN);
        (win.window > 0 && slots < n_ctx).then(|| WindowSlots {
            win,
            positions: n_ctx,
            slots,
            base: vec![0; n_layers],
        })
    }

    /// For a step writing `n` positions of `layer` from `pos0`: the slot `pos0` goes to, and
    /// the slots `(from, len)` to move to slots `0..len` first (then `base` has moved). A
    /// step from position 0 starts afresh.
    pub fn place(
        &mut self,
        layer: usize,
        pos0: usize,
        n: usize,
    ) -> (usize, Option<(usize, usize)>) {
        assert!(
            pos0 + n <= self.positions,
            "kv_store past the cache (caller checks the context)"
        );
        let base = &mut self.base[layer];
        if pos0 == 0 {
            *base = 0;
        }
        let first = (pos0 + 1).saturating_sub(self.win.window);
        assert!(
            first >= *base && pos0 >= *base,
            "position {pos0}'s window starts at {first}, before the first held ({}): the caller \
             checks kv_kept_from",
            *base
        );
        let mut moved = None;
        if pos0 + n > *base + self.slots {
            let new = first.saturating_sub(self.win.chunk).max(*base) / ALIGN * ALIGN;
            let (from, len) = (new - *base, pos0 - new);
            assert!(
                len + n <= self.slots,
                "a step of {n} positions past the window cache's span"
            );
            moved = Some((from, len));
            *base = new;
        }
        (pos0 - *base, moved)
    }

    /// `s` as `layer`'s slots see it: positions relative to the first slot's.
    pub fn local(&self, layer: usize, mut s: AttnShape) -> AttnShape {
        assert!(
            s.window > 0 && s.window <= self.win.window,
            "attention of window {} over a cache of window {}",
            s.window,
            self.win.window
        );
        s.pos0 -= self.base[layer];
        s
    }

    /// The first position every layer still holds.
    pub fn kept_from(&self) -> usize {
        self.base.iter().copied().max().unwrap_or(0)
    }

    /// Slots that hold a sequence's first `n` positions, from slot 0 (what a copy takes,
    /// with the bases).
    pub fn copy_slots(&self, n: usize) -> usize {
        let lo = self.base.iter().copied().min().unwrap_or(0);
        n.saturating_sub(lo).min(self.slots)
    }
}
