//! The KV cache: keys and values laid out (layer, kv head, slot, head_dim), f16 or f32.
//!
//! A cache of `n_ctx` positions holds no slots when made and grows as its sequence does
//! ([`LlmOps::kv_reserve`](kiln_backend::LlmOps::kv_reserve), or the store that writes past
//! what it holds): to the positions asked for, at least double what it held, in steps of
//! [`GROW_STEP`], never past `n_ctx`. Growing takes new buffers and copies what the old
//! ones held (each layer's and head's rows move to the wider stride); [`kv_release`] gives the
//! memory back. So `kiln serve --device gpu --parallel 64 -c 8192` holds what its sequences
//! have filled (at most about twice that), not 64 full contexts. The backend counts the
//! bytes its caches hold; past an optional limit ([`WgpuBackend::set_kv_byte_limit`]), or
//! where the device has no memory left, a reservation fails with
//! [`BackendError::KvMemory`] (the scheduler then evicts idle caches and retries).
//!
//! A sliding-window cache holds its window's slots from the start ([`WindowSlots`]: a few
//! hundred positions) and does not grow. Caches do not share memory: a prefix another
//! sequence holds is copied ([`kv_copy`]).
//!
//! [`kv_release`]: WgpuBackend::kv_release_memory
//! [`kv_copy`]: WgpuBackend::kv_copy_slots

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kiln_backend::window::WindowSlots;
use kiln_backend::{AttnShape, BackendError};

use crate::device::{block_on, Buf};
use crate::WgpuBackend;

/// Slots a growing cache adds at least, and rounds its size up to.
pub(crate) const GROW_STEP: usize = 64;

/// "12.5 MiB".
fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Bytes held by a backend's caches, and the most they may hold.
#[derive(Default)]
pub(crate) struct KvBudget {
    pub(crate) held: Arc<AtomicUsize>,
    pub(crate) limit: std::cell::Cell<Option<usize>>,
}

pub struct WgpuKvCache {
    pub(crate) k: Buf,
    pub(crate) v: Buf,
    pub(crate) n_layers: usize,
    /// Positions the sequence may reach (a window cache: its slots, which positions map to).
    pub(crate) n_ctx: usize,
    /// Slots per layer and head the buffers hold now (the stride between heads' rows).
    pub(crate) slots: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) f16: bool,
    pub(crate) window: Option<WindowSlots>,
    /// The backend's count of cache bytes, which this cache's buffers are in.
    held: Arc<AtomicUsize>,
}

impl WgpuKvCache {
    /// First element of `layer`.
    pub(crate) fn plane(&self, layer: usize) -> usize {
        layer * self.kv_heads * self.slots * self.head_dim
    }

    /// `s` as `layer`'s slots see it.
    pub(crate) fn local(&self, layer: usize, s: AttnShape) -> AttnShape {
        match &self.window {
            Some(w) => w.local(layer, s),
            None => s,
        }
    }

    /// Values a word holds (two f16, or one f32).
    fn per_word(&self) -> usize {
        if self.f16 {
            2
        } else {
            1
        }
    }

    /// Bytes of `slots` slots of every layer and head, for K or for V.
    fn bytes_for(&self, slots: usize) -> usize {
        self.n_layers * self.kv_heads * slots * self.head_dim * 4 / self.per_word()
    }

    pub(crate) fn bytes(&self) -> usize {
        (self.k.bytes + self.v.bytes) as usize
    }
}

impl Drop for WgpuKvCache {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes(), Ordering::Relaxed);
    }
}

impl WgpuBackend {
    /// Caps the bytes all of this backend's KV caches hold together (None: no cap but the
    /// device's memory); a reservation past it fails with [`BackendError::KvMemory`].
    pub fn set_kv_byte_limit(&self, bytes: Option<usize>) {
        self.kv.limit.set(bytes);
    }

    /// Bytes this backend's KV caches hold now.
    pub fn kv_bytes_held(&self) -> usize {
        self.kv.held.load(Ordering::Relaxed)
    }

    pub(crate) fn kv_typed(
        &self,
        n_layers: usize,
        n_ctx: usize,
        kv_heads: usize,
        head_dim: usize,
        f16: bool,
        window: Option<WindowSlots>,
    ) -> WgpuKvCache {
        // A window cache's slots from the start (its n_ctx is its slots); others none yet.
        let slots = window.as_ref().map_or(0, |_| n_ctx);
        let elems = n_layers * kv_heads * slots * head_dim;
        let bytes = if f16 { elems * 2 } else { elems * 4 };
        let c = WgpuKvCache {
            k: self.gpu.buffer(bytes),
            v: self.gpu.buffer(bytes),
            n_layers,
            n_ctx,
            slots,
            kv_heads,
            head_dim,
            f16,
            window,
            held: self.kv.held.clone(),
        };
        self.kv.held.fetch_add(c.bytes(), Ordering::Relaxed);
        c
    }

    /// Makes `cache` hold slots for positions `..pos0 + n`, keeping what it holds.
    pub(crate) fn kv_grow(
        &self,
        cache: &mut WgpuKvCache,
        pos0: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let need = pos0 + n;
        // A window cache holds its slots from the start (positions map to them: `kv_place`).
        if need <= cache.slots || cache.window.is_some() {
            return Ok(());
        }
        assert!(
            need <= cache.n_ctx,
            "KV cache positions {pos0}..{need} past its {} (the caller checks the context)",
            cache.n_ctx
        );
        let slots = need
            .max(2 * cache.slots)
            .next_multiple_of(GROW_STEP)
            .min(cache.n_ctx);
        let bytes = cache.bytes_for(slots);
        let held = self.kv_bytes_held();
        let after = held - cache.bytes() + 2 * bytes;
        if let Some(limit) = self.kv.limit.get().filter(|&l| after > l) {
            return Err(BackendError::KvMemory {
                what: format!(
                    "{slots} positions of this cache need {}, past the limit of {} for caches ({} held)",
                    mib(2 * bytes),
                    mib(limit),
                    mib(held)
                ),
            });
        }
        let scope = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let (k, v) = (self.gpu.buffer(bytes), self.gpu.buffer(bytes));
        if let Some(e) = block_on(scope.pop()) {
            return Err(BackendError::KvMemory {
                what: format!(
                    "no device memory for {slots} positions of a cache ({}; {} held by caches): {e}",
                    mib(2 * bytes),
                    mib(held)
                ),
            });
        }
        // Every slot held moves (a store may have written past `pos0` for some layers of
        // this step already), each layer's and head's rows at the new stride.
        let row = cache.head_dim / cache.per_word();
        let keep = cache.slots * row;
        for (old, new) in [(&cache.k, &k), (&cache.v, &v)] {
            for l in 0..cache.n_layers {
                for h in 0..cache.kv_heads {
                    let at = |s: usize| (l * cache.kv_heads + h) * s * row;
                    self.copy_words(old, at(cache.slots), new, at(slots), keep);
                }
            }
        }
        let was = cache.bytes();
        let (old_k, old_v) = (
            std::mem::replace(&mut cache.k, k),
            std::mem::replace(&mut cache.v, v),
        );
        self.gpu.drop_buffers([old_k, old_v]);
        cache.slots = slots;
        self.kv.held.fetch_add(cache.bytes(), Ordering::Relaxed);
        self.kv.held.fetch_sub(was, Ordering::Relaxed);
        Ok(())
    }

    /// [`Self::kv_grow`] for a store or a fused step about to write positions `pos0..pos0 + n`
    /// (a sequence whose step was not reserved: tests, Whisper's decoder): out of memory
    /// there is a panic, as the trait's ops have no error to return.
    pub(crate) fn kv_ready(&self, cache: &mut WgpuKvCache, pos0: usize, n: usize) {
        if let Err(e) = self.kv_grow(cache, pos0, n) {
            panic!("{e}");
        }
    }

    /// Gives back what a cache without windows holds (its positions are written again
    /// before they are read).
    pub(crate) fn kv_release_memory(&self, cache: &mut WgpuKvCache) {
        if cache.window.is_some() || cache.slots == 0 {
            return;
        }
        let was = cache.bytes();
        let old = [
            std::mem::replace(&mut cache.k, self.gpu.buffer(4)),
            std::mem::replace(&mut cache.v, self.gpu.buffer(4)),
        ];
        self.gpu.drop_buffers(old);
        cache.slots = 0;
        self.kv.held.fetch_add(cache.bytes(), Ordering::Relaxed);
        self.kv.held.fetch_sub(was, Ordering::Relaxed);
    }

    /// Positions `0..n` of every layer from `src` to `dst` (same shapes; `dst` grows to
    /// hold them).
    pub(crate) fn kv_copy_slots(&self, src: &WgpuKvCache, dst: &mut WgpuKvCache, n: usize) {
        assert!(
            (src.n_layers, src.n_ctx, src.kv_heads, src.head_dim, src.f16)
                == (dst.n_layers, dst.n_ctx, dst.kv_heads, dst.head_dim, dst.f16)
                && src.window.as_ref().map(|w| (w.win, w.positions))
                    == dst.window.as_ref().map(|w| (w.win, w.positions)),
            "kv_copy between caches of different shapes"
        );
        // Slots, which are positions but in a window cache (its bases go with them).
        let n = match &src.window {
            Some(w) => w.copy_slots(n),
            None => n.min(src.slots),
        };
        dst.window.clone_from(&src.window);
        self.kv_ready(dst, 0, n);
        let row = src.head_dim / src.per_word();
        for l in 0..src.n_layers {
            for h in 0..src.kv_heads {
                let at = |s: usize| (l * src.kv_heads + h) * s * row;
                self.copy_words(&src.k, at(src.slots), &dst.k, at(dst.slots), n * row);
                self.copy_words(&src.v, at(src.slots), &dst.v, at(dst.slots), n * row);
            }
        }
    }

    /// The slot `layer` position `pos0` goes to, for a step of `n` positions (a window
    /// cache moves the positions its window keeps to the front first, through a scratch
    /// copy: a dispatch may not read and write one buffer).
    pub(crate) fn kv_place(
        &self,
        cache: &mut WgpuKvCache,
        layer: usize,
        pos0: usize,
        n: usize,
    ) -> usize {
        let Some(w) = &mut cache.window else {
            self.kv_ready(cache, pos0, n);
            return pos0;
        };
        let (slot, moved) = w.place(layer, pos0, n);
        if let Some((from, len)) = moved {
            let row = cache.head_dim / cache.per_word();
            let words = len * row;
            let tmp = self.gpu.buffer(4 * words.max(1));
            for buf in [&cache.k, &cache.v] {
                for h in 0..cache.kv_heads {
                    let at = cache.plane(layer) / cache.per_word() + h * cache.slots * row;
                    self.copy_words(buf, at + from * row, &tmp, 0, words);
                    self.copy_words(&tmp, 0, buf, at, words);
                }
            }
            self.gpu.drop_buffers([tmp]);
        }
        slot
    }
}
