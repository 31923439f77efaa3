//! The CPU KV cache: per layer, each KV head's positions contiguous, `(kv_heads, slots,
//! head_dim)`, as f32 or packed (f16, Q8_0); a sliding-window cache's slots hold the
//! positions [`WindowSlots`] says.

use super::ops::kv_packed::PackedKv;
use crate::window::WindowSlots;
use crate::AttnShape;

pub struct CpuKvCache {
    /// Slots per layer and head.
    pub(super) n_ctx: usize,
    pub(super) kv_dim: usize,
    pub(super) head_dim: usize,
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
    /// Keys and values stored as f16 or Q8_0 instead (then `k`, `v` are empty).
    pub(super) packed: Option<PackedKv>,
    /// A sliding-window cache's slots (else None: slot = position).
    pub(super) window: Option<WindowSlots>,
}

impl CpuKvCache {
    /// The slot of `layer` position `pos0` is written at, for a step writing `n` positions
    /// from `pos0`, after moving what the window keeps to the front where it must.
    pub(super) fn place(&mut self, layer: usize, pos0: usize, n: usize) -> usize {
        let slots = self.n_ctx;
        let Some(w) = &mut self.window else {
            assert!(
                pos0 + n <= slots,
                "kv_store past the cache (caller checks the context)"
            );
            return pos0;
        };
        let (slot, moved) = w.place(layer, pos0, n);
        if let Some((from, len)) = moved {
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
        }
        slot
    }

    /// `s` as `layer`'s slots see it.
    pub(super) fn local(&self, layer: usize, s: AttnShape) -> AttnShape {
        match &self.window {
            Some(w) => w.local(layer, s),
            None => s,
        }
    }

    /// The first position every layer still holds.
    pub(super) fn kept_from(&self) -> usize {
        self.window.as_ref().map_or(0, WindowSlots::kept_from)
    }

    /// Slots to copy for a sequence's first `n` positions.
    pub(super) fn copy_slots(&self, n: usize) -> usize {
        match &self.window {
            None => n.min(self.n_ctx),
            Some(w) => w.copy_slots(n),
        }
    }
}
