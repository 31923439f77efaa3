//! What a forward runs on: a KV cache per sequence ([`LlamaCache`]) and the activations of
//! one forward over the stacked tokens of its sequences ([`LlamaScratch`]), both allocated
//! once; [`LlamaState`] is one of each, for a single sequence (`run`, `bench`, `chat`).

use kiln_backend::{Backend, BackendError, KvType, KvWindow};

use super::Llama;
use crate::ModelError;

/// One sequence's keys and values for `n_ctx` positions (a KV cache slot): a backend cache
/// per distinct layer window, sliding-window layers' holding only what their window reads
/// ([`LlmOps::kv_cache_window`]).
pub struct LlamaCache<B: Backend> {
    pub n_ctx: usize,
    /// The most positions one step of this sequence writes.
    pub chunk: usize,
    /// By window (the model's `kv_windows`).
    pub(super) kv: Vec<B::KvCache>,
    pub(super) windows: Vec<usize>,
    /// LFM2: the last k - 1 inputs of each convolution layer (k - 1 rows a layer, dim wide),
    /// the state a sequence's next tokens continue from; None without convolution layers.
    pub(super) conv: Option<B::Tensor>,
    /// Unique per cache: with the scratch's, the key under which a backend may record a
    /// decode step of this sequence.
    pub(super) key: u64,
}

impl<B: Backend> LlamaCache<B> {
    /// Gives back the memory the KV cache holds where the backend hands it out as sequences
    /// grow ([`LlmOps::kv_release`]); its positions are to be written again before read.
    pub fn release(&mut self, b: &B) {
        self.kv.iter_mut().for_each(|c| b.kv_release(c));
    }

    /// This cache's first `n` positions become `src`'s ([`LlmOps::kv_copy`]: a copy, or the
    /// same blocks shared where the backend pages its caches). Only where `src` may go on
    /// from `n` ([`Self::resumes`]).
    pub fn copy_prefix(&mut self, b: &B, src: &LlamaCache<B>, n: usize) {
        for (d, s) in self.kv.iter_mut().zip(&src.kv) {
            b.kv_copy(s, d, n);
        }
    }

    /// Whether a sequence whose cache holds its first `held` positions may go on from
    /// position `at <= held` (positions `at..` written again): always from 0 and from
    /// `held`; not from elsewhere where a recurrent state (LFM2's convolutions) holds every
    /// token fed, nor where a sliding-window layer's cache no longer holds what position
    /// `at`'s window reads ([`LlmOps::kv_kept_from`]).
    pub fn resumes(&self, b: &B, held: usize, at: usize) -> bool {
        if at == 0 || at == held {
            return true;
        }
        self.conv.is_none()
            && self
                .kv
                .iter()
                .zip(&self.windows)
                .all(|(c, &w)| w == 0 || KvWindow::resumes(w, b.kv_kept_from(c), at))
    }

    /// Bytes the KV cache holds ([`LlmOps::kv_cache_bytes`]).
    pub fn held_bytes(&self, b: &B) -> usize {
        self.kv.iter().map(|c| b.kv_cache_bytes(c)).sum()
    }
}

/// Activations of one forward over up to `max_rows` stacked tokens of up to `max_seqs`
/// sequences, and the logits of up to `logit_rows` rows.
pub struct LlamaScratch<B: Backend> {
    pub max_rows: usize,
    pub max_seqs: usize,
    pub logit_rows: usize,
    pub(super) x: B::Tensor,
    pub(super) h: B::Tensor,
    pub(super) q: B::Tensor,
    pub(super) k: B::Tensor,
    pub(super) v: B::Tensor,
    pub(super) attn: B::Tensor,
    pub(super) gate: B::Tensor,
    /// Gemma: the up projection (GeGLU's second half) and a block's output before its norm
    /// (LFM2: a convolution's output); a row elsewhere.
    pub(super) up: B::Tensor,
    pub(super) y: B::Tensor,
    /// LFM2: the convolution input projection's B, C, x (a row elsewhere).
    pub(super) bcx: B::Tensor,
    /// One sequence's rows of q, k, v (the attention side's scratch when a step holds
    /// several sequences; a row when it never does).
    pub(super) seq_rows: [B::Tensor; 3],
    /// The last row of each sequence, and its norm.
    pub(super) last: B::Tensor,
    pub(super) last_h: B::Tensor,
    pub(super) logits: B::Tensor,
    /// One row of logits picked out of `logits` (several sequences' steps).
    pub(super) pick: B::Tensor,
    pub(super) logits_host: Vec<f32>,
    /// Sampling candidates (`Llama::best_allowed_last`), kept between steps.
    pub(super) cand: Vec<(f32, u32)>,
    pub(super) ids: Vec<u32>,
    pub(super) trace: bool,
    pub(super) key: u64,
}

/// A sequence's cache and a scratch for it: everything one sequence needs while decoding,
/// allocated once.
pub struct LlamaState<B: Backend> {
    pub n_ctx: usize,
    pub max_batch: usize,
    pub(super) cache: LlamaCache<B>,
    pub(super) scratch: LlamaScratch<B>,
    /// Every token's logits of a forward whose chunk has more rows than the scratch holds
    /// logits for (read to the host a scratch's worth at a time).
    pub(super) logits_all: Vec<f32>,
}

impl<B: Backend> LlamaState<B> {
    /// [`LlamaCache::resumes`] for the state's cache.
    pub fn resumes(&self, b: &B, held: usize, at: usize) -> bool {
        self.cache.resumes(b, held, at)
    }
}

/// Bytes of logits a single sequence's scratch holds at most: 64 rows of a 262144-token
/// vocabulary (max_batch rows of it would be 512 MiB on the device, more than some adapters
/// bind at once, for the few callers that want every row's logits).
const LOGITS_BYTES: usize = 64 << 20;

/// One sequence's part of a forward: `tokens` at positions `pos0..` of its own cache.
pub struct SeqChunk<'a, B: Backend> {
    pub cache: &'a mut LlamaCache<B>,
    pub tokens: &'a [u32],
    pub pos0: usize,
}

/// Which rows' logits a forward computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Each sequence's last token (row j: sequence j).
    Last,
    /// Every token, in the order they were stacked.
    All,
    /// None: every token's final-normed hidden state is left in the scratch instead (what
    /// embedding models pool; [`Llama::hidden_states`]).
    Hidden,
}

impl<B: Backend> Llama<B> {
    /// A KV cache of `n_ctx` positions in the backend's default type, for steps of at most
    /// `chunk` positions.
    pub fn new_cache(&self, b: &B, n_ctx: usize, chunk: usize) -> LlamaCache<B> {
        self.cache_with(b, n_ctx, chunk, None)
            .expect("the default KV type is the backend's own")
    }

    /// Caches of `ty` (None: the backend's default), one per window.
    fn cache_with(
        &self,
        b: &B,
        n_ctx: usize,
        chunk: usize,
        ty: Option<KvType>,
    ) -> Result<LlamaCache<B>, BackendError> {
        let c = &self.cfg;
        let chunk = chunk.clamp(1, n_ctx.max(1));
        let kv = self
            .kv_windows
            .iter()
            .enumerate()
            .map(|(g, &window)| {
                let layers = self.kv_map.iter().filter(|m| m.0 == g).count();
                let (heads, hd) = (c.n_kv_heads, c.head_dim);
                match (window, ty) {
                    (0, None) => Ok(b.kv_cache(layers, n_ctx, heads, hd)),
                    (0, Some(ty)) => b.kv_cache_typed(layers, n_ctx, heads, hd, ty),
                    (window, ty) => {
                        let win = KvWindow { window, chunk };
                        b.kv_cache_window(layers, n_ctx, heads, hd, ty, win)
                    }
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(LlamaCache {
            n_ctx,
            chunk,
            kv,
            windows: self.kv_windows.clone(),
            conv: self.conv_state(b),
            key: kiln_backend::next_step_key(),
        })
    }

    /// A sequence's convolution state (zeros), where the model has convolution layers.
    fn conv_state(&self, b: &B) -> Option<B::Tensor> {
        let c = &self.cfg;
        let rows = c.n_conv_layers() * c.conv_k.saturating_sub(1);
        (c.n_conv_layers() > 0).then(|| b.tensor(rows.max(1), c.dim))
    }

    /// Whether a sequence's state is more than its KV cache (LFM2's convolution state):
    /// then it cannot be rewound to an earlier position, nor a cached prefix reused, nor
    /// drafted tokens rejected.
    pub fn has_recurrent_state(&self) -> bool {
        self.cfg.n_conv_layers() > 0
    }

    /// A KV cache of `n_ctx` positions storing keys and values as `kv`, for steps of at
    /// most `chunk` positions.
    pub fn new_cache_kv(
        &self,
        b: &B,
        n_ctx: usize,
        chunk: usize,
        kv: KvType,
    ) -> Result<LlamaCache<B>, ModelError> {
        self.cache_with(b, n_ctx, chunk, Some(kv))
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })
    }

    /// Scratch for forwards of up to `max_rows` tokens from up to `max_seqs` sequences, with
    /// logits for up to `logit_rows` rows (`max_seqs` for [`Logits::Last`] alone).
    pub fn new_scratch(
        &self,
        b: &B,
        max_rows: usize,
        max_seqs: usize,
        logit_rows: usize,
    ) -> LlamaScratch<B> {
        let c = &self.cfg;
        let conv = c.n_conv_layers() > 0;
        let (r, s) = (max_rows.max(1), max_seqs.max(1));
        let l = logit_rows.max(s);
        // Only a step of several sequences gathers one's rows.
        let sr = if s > 1 { r } else { 1 };
        LlamaScratch {
            max_rows: r,
            max_seqs: s,
            logit_rows: l,
            x: b.tensor(r, c.dim),
            h: b.tensor(r, c.dim),
            q: b.tensor(r, c.q_dim()),
            k: b.tensor(r, c.kv_dim()),
            v: b.tensor(r, c.kv_dim()),
            attn: b.tensor(r, c.q_dim()),
            gate: b.tensor(r, c.ffn_dim),
            up: b.tensor(if c.post_norms { r } else { 1 }, c.ffn_dim),
            y: b.tensor(if c.post_norms || conv { r } else { 1 }, c.dim),
            bcx: b.tensor(if conv { r } else { 1 }, if conv { 3 * c.dim } else { 1 }),
            seq_rows: [
                b.tensor(sr, c.q_dim()),
                b.tensor(sr, c.kv_dim()),
                b.tensor(sr, c.kv_dim()),
            ],
            last: b.tensor(s, c.dim),
            last_h: b.tensor(s, c.dim),
            logits: b.tensor(l, c.vocab_size),
            pick: b.tensor(1, if s > 1 { c.vocab_size } else { 1 }),
            logits_host: vec![0.0; l * c.vocab_size],
            cand: Vec::new(),
            ids: Vec::with_capacity(r),
            trace: kiln_backend::options::get().trace,
            key: kiln_backend::next_step_key(),
        }
    }

    pub fn new_state(&self, b: &B, n_ctx: usize, max_batch: usize) -> LlamaState<B> {
        let cache = self.new_cache(b, n_ctx, max_batch);
        self.state_with(b, max_batch, cache)
    }

    /// A state whose KV cache stores keys and values as `kv`.
    pub fn new_state_kv(
        &self,
        b: &B,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<LlamaState<B>, ModelError> {
        let cache = self.new_cache_kv(b, n_ctx, max_batch, kv)?;
        Ok(self.state_with(b, max_batch, cache))
    }

    /// A state of `cache` (which takes steps of at least `max_batch` positions) and a scratch
    /// for chunks of up to `max_batch` tokens, with logits for as many of a chunk's rows as
    /// LOGITS_BYTES hold (a forward that wants every row's runs in pieces of that many).
    pub fn state_with(&self, b: &B, max_batch: usize, cache: LlamaCache<B>) -> LlamaState<B> {
        let max_batch = max_batch.max(1);
        let logit_rows = max_batch
            .min(LOGITS_BYTES / (4 * self.cfg.vocab_size.max(1)))
            .max(1);
        LlamaState {
            n_ctx: cache.n_ctx,
            max_batch,
            cache,
            scratch: self.new_scratch(b, max_batch, 1, logit_rows),
            logits_all: Vec::new(),
        }
    }

    /// Bytes of the state's KV cache.
    pub fn kv_bytes(&self, b: &B, st: &LlamaState<B>) -> usize {
        st.cache.held_bytes(b)
    }
}
