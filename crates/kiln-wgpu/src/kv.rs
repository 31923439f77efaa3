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
//! A buffer holds as many layers as the adapter binds at once at `n_ctx` positions (all of
//! them on most GPUs; 128 MiB adapters such as lavapipe split Qwen3-0.6B's 8192 positions
//! over four), so a long context does not exceed the binding limit; where even one layer's
//! rows do not fit, the positions past what binds fail with `KvMemory`.
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
    /// Keys and values, a buffer per `group` layers.
    k: Vec<Buf>,
    v: Vec<Buf>,
    /// Layers a buffer holds (the last may hold fewer): as many as fit in the adapter's
    /// binding limit at `n_ctx` positions.
    group: usize,
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
    /// First element of `layer` in its buffers.
    pub(crate) fn plane(&self, layer: usize) -> usize {
        (layer % self.group) * self.kv_heads * self.slots * self.head_dim
    }

    /// The key and value buffers holding `layer`.
    pub(crate) fn bufs(&self, layer: usize) -> (&Buf, &Buf) {
        (&self.k[layer / self.group], &self.v[layer / self.group])
    }

    /// First word of `layer`'s head `h` in its buffer at `slots` slots a head.
    fn head_word(&self, layer: usize, h: usize, slots: usize) -> usize {
        ((layer % self.group) * self.kv_heads + h) * slots * self.head_dim / self.per_word()
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

    /// Bytes of buffer `g` (K or V) at `slots` slots a head.
    fn buf_bytes(&self, g: usize, slots: usize) -> usize {
        let layers = self.group.min(self.n_layers - g * self.group);
        layers * self.kv_heads * slots * self.head_dim * 4 / self.per_word()
    }

    /// K's and V's buffers at `slots` slots a head.
    fn new_bufs(&self, b: &WgpuBackend, slots: usize) -> (Vec<Buf>, Vec<Buf>) {
        let make = || {
            (0..self.n_layers.div_ceil(self.group).max(1))
                .map(|g| b.gpu.buffer(self.buf_bytes(g, slots)))
                .collect()
        };
        (make(), make())
    }

    pub(crate) fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.bytes as usize).sum()
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
        // Layers a buffer: as many as the adapter binds at once at n_ctx positions.
        let layer_bytes = kv_heads * n_ctx * head_dim * if f16 { 2 } else { 4 };
        let group = (self.gpu.max_binding as usize / layer_bytes.max(1)).clamp(1, n_layers.max(1));
        let mut c = WgpuKvCache {
            k: Vec::new(),
            v: Vec::new(),
            group,
            n_layers,
            n_ctx,
            slots,
            kv_heads,
            head_dim,
            f16,
            window,
            held: self.kv.held.clone(),
        };
        (c.k, c.v) = c.new_bufs(self, slots);
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
        // Slots a head at most: n_ctx, or what one layer's rows in a buffer can bind.
        let bound = cache.n_ctx.min(
            self.gpu.max_binding as usize * cache.per_word()
                / (4 * cache.kv_heads * cache.head_dim * cache.group),
        );
        if need > bound {
            return Err(BackendError::KvMemory {
                what: format!(
                    "{need} positions are past the {bound} this adapter binds in one buffer ({} a buffer)",
                    mib(self.gpu.max_binding as usize)
                ),
            });
        }
        let slots = need
            .max(2 * cache.slots)
            .next_multiple_of(GROW_STEP)
            .min(bound);
        let bytes: usize = (0..cache.k.len())
            .map(|g| 2 * cache.buf_bytes(g, slots))
            .sum();
        let held = self.kv_bytes_held();
        let after = held - cache.bytes() + bytes;
        if let Some(limit) = self.kv.limit.get().filter(|&l| after > l) {
            return Err(BackendError::KvMemory {
                what: format!(
                    "{slots} positions of this cache need {}, past the limit of {} for caches ({} held)",
                    mib(bytes),
                    mib(limit),
                    mib(held)
                ),
            });
        }
        let scope = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let (k, v) = cache.new_bufs(self, slots);
        if let Some(e) = block_on(scope.pop()) {
            return Err(BackendError::KvMemory {
                what: format!(
                    "no device memory for {slots} positions of a cache ({}; {} held by caches): {e}",
                    mib(bytes),
                    mib(held)
                ),
            });
        }
        // Every slot held moves (a store may have written past `pos0` for some layers of
        // this step already), each layer's and head's rows at the new stride.
        let keep = cache.slots * cache.head_dim / cache.per_word();
        for (old, new) in [(&cache.k, &k), (&cache.v, &v)] {
            for l in 0..cache.n_layers {
                let (o, n) = (&old[l / cache.group], &new[l / cache.group]);
                for h in 0..cache.kv_heads {
                    let (from, to) = (
                        cache.head_word(l, h, cache.slots),
                        cache.head_word(l, h, slots),
                    );
                    self.copy_words(o, from, n, to, keep);
                }
            }
        }
        let was = cache.bytes();
        let old_k = std::mem::replace(&mut cache.k, k);
        let old_v = std::mem::replace(&mut cache.v, v);
        self.gpu.drop_buffers(old_k.into_iter().chain(old_v));
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
        let (k, v) = cache.new_bufs(self, 0);
        let old_k = std::mem::replace(&mut cache.k, k);
        let old_v = std::mem::replace(&mut cache.v, v);
        self.gpu.drop_buffers(old_k.into_iter().chain(old_v));
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
        let words = n * src.head_dim / src.per_word();
        for l in 0..src.n_layers {
            let ((sk, sv), (dk, dv)) = (src.bufs(l), dst.bufs(l));
            for h in 0..src.kv_heads {
                let (from, to) = (
                    src.head_word(l, h, src.slots),
                    dst.head_word(l, h, dst.slots),
                );
                self.copy_words(sk, from, dk, to, words);
                self.copy_words(sv, from, dv, to, words);
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
            let (kb, vb) = cache.bufs(layer);
            for buf in [kb, vb] {
                for h in 0..cache.kv_heads {
                    let at = cache.head_word(layer, h, cache.slots);
                    self.copy_words(buf, at + from * row, &tmp, 0, words);
                    self.copy_words(&tmp, 0, buf, at, words);
                }
            }
            self.gpu.drop_buffers([tmp]);
        }
        slot
    }
}
