//! The Llama family: pre-norm decoder blocks of grouped-query attention with RoPE and a SwiGLU
//! MLP. SmolLM is Llama; Qwen2 adds q/k/v biases; Qwen3 adds per-head q/k RMSNorm.
//!
//! x = embed(tokens)
//! for each layer:  x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//!                  x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//! logits = Wout · norm(x)
//!
//! Gemma 3 is the same skeleton with its own parts: embeddings times sqrt(dim), Qwen3's q/k
//! norms, a norm of each block's output before its residual add (x += norm(Wo · attn(..)),
//! x += norm(Wdown · ..)), GeGLU (tanh GELU) for SiLU, and sliding-window attention with
//! its own RoPE base on five layers of six.
//!
//! LFM2 swaps attention for a gated short convolution on most layers:
//! x += Wout · (C * conv(B * x')) with B, C, x' = Win · norm(x), a causal depthwise
//! convolution over the last k positions whose k - 1 previous inputs each sequence keeps
//! (its cache's `conv` rows); its attention layers are Qwen3's.

use kiln_backend::{AttnShape, Backend, SeqKv};
use kiln_formats::GgufFile;
use kiln_quant::GgmlType;

use super::config::Activation;
use super::{HfCheckpoint, LayerParam, LlmConfig, Param};
use crate::{ModelError, Source, WeightMap};

mod state;
pub use state::{LlamaCache, LlamaScratch, LlamaState, Logits, SeqChunk};

pub struct Attention<B: Backend> {
    pub q: B::Weight, // attn_q   (q_dim, dim)
    pub k: B::Weight, // attn_k   (kv_dim, dim)
    pub v: B::Weight, // attn_v   (kv_dim, dim)
    pub o: B::Weight, // attn_output (dim, q_dim)
    pub q_bias: Option<B::Tensor>,
    pub k_bias: Option<B::Tensor>,
    pub v_bias: Option<B::Tensor>,
    pub q_norm: Option<B::Tensor>, // attn_q_norm (head_dim)
    pub k_norm: Option<B::Tensor>, // attn_k_norm (head_dim)
}

pub struct Mlp<B: Backend> {
    pub gate: B::Weight, // ffn_gate (ffn_dim, dim)
    pub up: B::Weight,   // ffn_up   (ffn_dim, dim)
    pub down: B::Weight, // ffn_down (dim, ffn_dim)
}

/// LFM2's gated short convolution.
pub struct ShortConv<B: Backend> {
    pub in_proj: B::Weight,  // shortconv.in_proj (3·dim, dim): B, C, x
    pub out_proj: B::Weight, // shortconv.out_proj (dim, dim)
    pub taps: B::Tensor,     // shortconv.conv (dim, k)
}

/// What mixes positions in a layer.
pub enum Mixer<B: Backend> {
    Attention(Attention<B>),
    ShortConv(ShortConv<B>),
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Tensor, // attn_norm (dim); LFM2's operator_norm
    pub mixer: Mixer<B>,
    pub ffn_norm: B::Tensor, // ffn_norm (dim)
    pub mlp: Mlp<B>,
    /// Gemma: norms of the attention's and the MLP's outputs (post_attention_norm,
    /// post_ffw_norm).
    pub post_norms: Option<(B::Tensor, B::Tensor)>,
}

pub struct Llama<B: Backend> {
    pub cfg: LlmConfig,
    pub embed: B::Weight, // token_embd (vocab, dim)
    pub layers: Vec<Layer<B>>,
    pub norm: B::Tensor,           // output_norm (dim)
    pub output: Option<B::Weight>, // output (vocab, dim); None when tied to `embed`
    /// A sequence's KV caches, one per distinct window (`LlmConfig::kv_groups`), and each
    /// layer's (cache, index within it).
    kv_windows: Vec<usize>,
    kv_map: Vec<(usize, usize)>,
}

impl<B: Backend> Llama<B> {
    /// A GGUF model, weights in their stored formats.
    pub fn load(b: &B, g: &GgufFile) -> Result<Self, ModelError> {
        Self::load_gguf(b, g, None)
    }

    /// A GGUF model; `quant` requantizes every matrix at load.
    pub fn load_gguf(b: &B, g: &GgufFile, quant: Option<GgmlType>) -> Result<Self, ModelError> {
        let cfg = LlmConfig::from_gguf(g)?;
        let w = WeightMap::from_source(Source::Gguf(g), quant).for_arch(&cfg.arch);
        Self::from_weights(b, cfg, w)
    }

    /// A Hugging Face (or MLX) checkpoint; `quant` requantizes every matrix at load.
    pub fn load_hf(b: &B, ck: &HfCheckpoint, quant: Option<GgmlType>) -> Result<Self, ModelError> {
        let src = Source::SafeTensors {
            set: &ck.tensors,
            dir: &ck.dir,
            mlx: ck.mlx.as_ref(),
        };
        let w = WeightMap::from_source(src, quant).for_arch(&ck.cfg.arch);
        Self::from_weights(b, ck.cfg.clone(), w)
    }

    /// Reads every parameter the config calls for, by canonical name.
    pub fn from_weights(b: &B, cfg: LlmConfig, w: WeightMap) -> Result<Self, ModelError> {
        use LayerParam as L;
        let (dim, q_dim, kv_dim, ffn) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.ffn_dim);
        b.check_attention(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
            .and_then(|()| match cfg.layer_window.iter().any(|&w| w > 0) {
                true => b.check_window(),
                false => Ok(()),
            })
            .and_then(|()| match cfg.n_conv_layers() > 0 {
                true => b.check_short_conv(),
                false => Ok(()),
            })
            .map_err(|source| ModelError::Backend {
                file: w.origin(),
                source,
            })?;
        let embed = w.matrix(b, Param::TokenEmbd, cfg.vocab_size, dim)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = |l| Param::Layer(i, l);
            let bias = |l, len| -> Result<_, ModelError> {
                cfg.qkv_bias.then(|| w.vector(b, p(l), len)).transpose()
            };
            // The queries' norm carries the attention scale's difference (Gemma's
            // query_pre_attn_scalar), since every backend scales scores by 1/sqrt(head_dim).
            let head_norm = |l, scale: f32| -> Result<_, ModelError> {
                if !cfg.qk_norm {
                    return Ok(None);
                }
                let mut v = w.vector_host(p(l), cfg.head_dim)?;
                if scale != 1.0 {
                    v.iter_mut().for_each(|x| *x *= scale);
                }
                Ok(Some(b.tensor_from(1, cfg.head_dim, &v)))
            };
            let mixer = match cfg.is_conv(i) {
                false => Mixer::Attention(Attention {
                    q: w.matrix(b, p(L::AttnQ), q_dim, dim)?,
                    k: w.matrix(b, p(L::AttnK), kv_dim, dim)?,
                    v: w.matrix(b, p(L::AttnV), kv_dim, dim)?,
                    o: w.matrix(b, p(L::AttnOutput), dim, q_dim)?,
                    q_bias: bias(L::AttnQBias, q_dim)?,
                    k_bias: bias(L::AttnKBias, kv_dim)?,
                    v_bias: bias(L::AttnVBias, kv_dim)?,
                    q_norm: head_norm(L::AttnQNorm, cfg.q_scale)?,
                    k_norm: head_norm(L::AttnKNorm, 1.0)?,
                }),
                true => {
                    let k = cfg.conv_k as u64;
                    let taps =
                        w.floats_host(p(L::ConvTaps), &[k, dim as u64], &[dim as u64, 1, k])?;
                    Mixer::ShortConv(ShortConv {
                        in_proj: w.matrix(b, p(L::ConvInProj), 3 * dim, dim)?,
                        out_proj: w.matrix(b, p(L::ConvOutProj), dim, dim)?,
                        taps: b.tensor_from(dim, cfg.conv_k, &taps),
                    })
                }
            };
            layers.push(Layer {
                attn_norm: w.vector(b, p(L::AttnNorm), dim)?,
                mixer,
                ffn_norm: w.vector(b, p(L::FfnNorm), dim)?,
                mlp: Mlp {
                    gate: w.matrix(b, p(L::FfnGate), ffn, dim)?,
                    up: w.matrix(b, p(L::FfnUp), ffn, dim)?,
                    down: w.matrix(b, p(L::FfnDown), dim, ffn)?,
                },
                post_norms: match cfg.post_norms {
                    true => Some((
                        w.vector(b, p(L::PostAttnNorm), dim)?,
                        w.vector(b, p(L::PostFfnNorm), dim)?,
                    )),
                    false => None,
                },
            });
        }
        let norm = w.vector(b, Param::OutputNorm, dim)?;
        let output = match cfg.tied_embeddings {
            true => {
                // Some exporters save the tied copy too; it is the embedding table.
                w.skip(Param::Output);
                None
            }
            false => Some(w.matrix(b, Param::Output, cfg.vocab_size, dim)?),
        };
        let mut cfg = cfg;
        if w.has(Param::RopeFreqs) {
            let f = w.vector_host(Param::RopeFreqs, cfg.rope.dims / 2)?;
            cfg.rope.scaling = kiln_backend::RopeScaling::Factors(f);
        }
        w.finish(&cfg.arch)?;
        let (kv_windows, kv_map) = cfg.kv_groups();
        Ok(Llama {
            cfg,
            embed,
            layers,
            norm,
            output,
            kv_windows,
            kv_map,
        })
    }

    /// Every weight matrix once (a tied output projection is the embedding table).
    fn matrices(&self) -> impl Iterator<Item = &B::Weight> {
        let layers = self.layers.iter().flat_map(|l| {
            let m = &l.mlp;
            let mix: Vec<&B::Weight> = match &l.mixer {
                Mixer::Attention(a) => vec![&a.q, &a.k, &a.v, &a.o],
                Mixer::ShortConv(c) => vec![&c.in_proj, &c.out_proj],
            };
            mix.into_iter().chain([&m.gate, &m.up, &m.down])
        });
        std::iter::once(&self.embed)
            .chain(layers)
            .chain(self.output.as_ref())
    }

    /// Every weight matrix once, as (parameter, rows, cols), in GGUF file order (a tied output
    /// projection is the embedding table).
    pub fn matrix_params(&self) -> Vec<(Param, usize, usize)> {
        use LayerParam as L;
        let c = &self.cfg;
        let (dim, q, kv, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let mut v = vec![(Param::TokenEmbd, c.vocab_size, dim)];
        for i in 0..self.layers.len() {
            match c.is_conv(i) {
                false => v.extend([
                    (Param::Layer(i, L::AttnQ), q, dim),
                    (Param::Layer(i, L::AttnK), kv, dim),
                    (Param::Layer(i, L::AttnV), kv, dim),
                    (Param::Layer(i, L::AttnOutput), dim, q),
                ]),
                true => v.extend([
                    (Param::Layer(i, L::ConvInProj), 3 * dim, dim),
                    (Param::Layer(i, L::ConvOutProj), dim, dim),
                ]),
            }
            v.extend([
                (Param::Layer(i, L::FfnGate), ffn, dim),
                (Param::Layer(i, L::FfnUp), ffn, dim),
                (Param::Layer(i, L::FfnDown), dim, ffn),
            ]);
        }
        if self.output.is_some() {
            v.push((Param::Output, c.vocab_size, dim));
        }
        v
    }

    /// The weight matrix of `p`, to swap in another copy (`None` for vectors, an absent
    /// output projection or a layer past the last).
    pub fn weight_mut(&mut self, p: Param) -> Option<&mut B::Weight> {
        use LayerParam as L;
        match p {
            Param::TokenEmbd => Some(&mut self.embed),
            Param::Output => self.output.as_mut(),
            Param::OutputNorm | Param::RopeFreqs => None,
            Param::Layer(i, l) => {
                let layer = self.layers.get_mut(i)?;
                let m = &mut layer.mlp;
                match (l, &mut layer.mixer) {
                    (L::AttnQ, Mixer::Attention(a)) => Some(&mut a.q),
                    (L::AttnK, Mixer::Attention(a)) => Some(&mut a.k),
                    (L::AttnV, Mixer::Attention(a)) => Some(&mut a.v),
                    (L::AttnOutput, Mixer::Attention(a)) => Some(&mut a.o),
                    (L::ConvInProj, Mixer::ShortConv(c)) => Some(&mut c.in_proj),
                    (L::ConvOutProj, Mixer::ShortConv(c)) => Some(&mut c.out_proj),
                    (L::FfnGate, _) => Some(&mut m.gate),
                    (L::FfnUp, _) => Some(&mut m.up),
                    (L::FfnDown, _) => Some(&mut m.down),
                    // Vectors, and a mixer's matrices asked of the other kind of layer.
                    _ => None,
                }
            }
        }
    }

    /// Values held as f32 vectors: norms and biases.
    fn vector_params(&self) -> usize {
        let c = &self.cfg;
        let bias = usize::from(c.qkv_bias) * (c.q_dim() + 2 * c.kv_dim());
        let head_norm = usize::from(c.qk_norm) * 2 * c.head_dim;
        let norms = if c.post_norms { 4 } else { 2 };
        let n_conv = c.n_conv_layers();
        let n_attn = c.n_layers - n_conv;
        c.n_layers * norms * c.dim + n_attn * (bias + head_norm) + n_conv * c.dim * c.conv_k + c.dim
    }

    /// Bytes of all weights: matrices in their stored format, norms and biases as f32.
    pub fn weight_bytes(&self, b: &B) -> usize {
        let matrices: usize = self.matrices().map(|w| b.weight_bytes(w)).sum();
        matrices + 4 * self.vector_params()
    }

    /// Number of parameters (every matrix and vector element; a tied output counted once).
    pub fn n_params(&self) -> usize {
        let c = &self.cfg;
        let attn = 2 * c.q_dim() * c.dim + 2 * c.kv_dim() * c.dim;
        let conv = 4 * c.dim * c.dim;
        let mlp = 3 * c.ffn_dim * c.dim;
        let tables = if self.output.is_some() { 2 } else { 1 };
        let n_conv = c.n_conv_layers();
        tables * c.vocab_size * c.dim
            + (c.n_layers - n_conv) * attn
            + n_conv * conv
            + c.n_layers * mlp
            + self.vector_params()
    }

    /// Runs `tokens` at positions `pos0..`, filling the KV cache. Returns the logits of the
    /// last token (`vocab`), or of every token of the last chunk when `all_logits` (then at
    /// most `max_batch` tokens may be passed; more than the scratch holds logits for run as
    /// pieces of that many, each piece's logits read before the next).
    pub fn forward<'s>(
        &self,
        b: &B,
        st: &'s mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> Result<&'s [f32], ModelError> {
        if !all_logits {
            let n_out = self.forward_one(b, st, tokens, pos0, Logits::Last)?;
            return Ok(self.logits(b, &mut st.scratch, n_out));
        }
        let rows = st.scratch.logit_rows;
        if tokens.len() <= rows {
            let n_out = self.forward_one(b, st, tokens, pos0, Logits::All)?;
            return Ok(self.logits(b, &mut st.scratch, n_out));
        }
        assert!(
            tokens.len() <= st.max_batch,
            "caller keeps chunks to max_batch"
        );
        st.logits_all.clear();
        for (i, piece) in tokens.chunks(rows).enumerate() {
            let n_out = self.forward_one(b, st, piece, pos0 + i * rows, Logits::All)?;
            let l = self.logits(b, &mut st.scratch, n_out);
            st.logits_all.extend_from_slice(l);
        }
        Ok(&st.logits_all)
    }

    /// Feeds `tokens` from `pos0`, leaving the last token's logits where the backend keeps
    /// them (for [`Self::mask_last`], [`Self::argmax_last`], [`Self::logits_last`]).
    pub fn forward_last(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<(), ModelError> {
        self.forward_one(b, st, tokens, pos0, Logits::Last)
            .map(|_| ())
    }

    /// Masks the last forward's first logits row where it lies ([`LlmOps::mask_row`]);
    /// false when the backend leaves that to the host.
    pub fn mask_last(&self, b: &B, st: &mut LlamaState<B>, cols: usize, allow: &[u32]) -> bool {
        self.mask_logits(b, &mut st.scratch, 0, cols, allow)
    }

    /// Masks row `row` of the last forward's logits where they lie ([`LlmOps::mask_row`]).
    pub fn mask_logits(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        row: usize,
        cols: usize,
        allow: &[u32],
    ) -> bool {
        b.mask_row(&mut sc.logits, row, cols.min(self.cfg.vocab_size), allow)
    }

    /// The greedy pick of the last forward's first `cols` logits.
    pub fn argmax_last(&self, b: &B, st: &LlamaState<B>, cols: usize) -> u32 {
        self.argmax(b, &st.scratch, 1, cols)[0]
    }

    /// The greedy pick of the last forward's first `cols` logits among the tokens `allowed`
    /// takes, if one of the few largest is (the raw pick, then the backend's top 16 in
    /// order): the pick of the row masked to the allowed tokens, found without the mask. None
    /// when none of those is allowed (or the backend selects no candidates).
    pub fn best_allowed_last(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        cols: usize,
        allowed: &mut dyn FnMut(u32) -> bool,
    ) -> Option<u32> {
        const K: usize = 16;
        let raw = self.argmax_last(b, st, cols);
        if allowed(raw) {
            return Some(raw);
        }
        let mut cand = std::mem::take(&mut st.scratch.cand);
        let mut best = None;
        if self
            .candidates(b, &mut st.scratch, 0, cols, K, &mut cand)
            .is_none()
        {
            // Largest first, the lower id first among equals (the argmax's order; a NaN
            // never wins it).
            cand.retain(|c| !c.0.is_nan());
            cand.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
            best = cand.iter().take(K).map(|c| c.1).find(|&t| allowed(t));
        }
        st.scratch.cand = cand;
        best
    }

    /// Queues the greedy pick of the last forward's first `cols` logits as the token of the
    /// next forward given [`kiln_backend::FED_TOKEN`] ([`LlmOps::argmax_feed`]; read it with
    /// [`LlmOps::fed_token`]); false where the backend does not feed picks.
    pub fn argmax_feed_last(&self, b: &B, st: &LlamaState<B>, cols: usize) -> bool {
        self.argmax_feed(b, &st.scratch, cols)
    }

    /// [`Self::argmax_feed_last`] for a batched forward of one sequence in `sc`.
    pub fn argmax_feed(&self, b: &B, sc: &LlamaScratch<B>, cols: usize) -> bool {
        b.argmax_feed(&sc.logits, cols.min(self.cfg.vocab_size))
    }

    /// Whether greedy decoding may queue a step before its token is on the host: the backend
    /// feeds picks and no layer keeps a recurrent state (a step queued and then not wanted
    /// would leave it one token too far).
    pub fn feeds_picks(&self, b: &B) -> bool {
        b.feeds_picks() && self.cfg.n_conv_layers() == 0
    }

    /// The last forward's logits row, on the host.
    pub fn logits_last<'s>(&self, b: &B, st: &'s mut LlamaState<B>) -> &'s [f32] {
        self.logits(b, &mut st.scratch, 1)
    }

    /// Like [`Self::forward`] for the last token only, returning its greedy (argmax) token
    /// without copying the logits to the host.
    pub fn forward_argmax(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<u32, ModelError> {
        self.forward_argmax_within(b, st, tokens, pos0, self.cfg.vocab_size)
    }

    /// Like [`Self::forward`] for the last token only, for a pick that needs only the `k`
    /// largest of the first `cols` logits: the backend's candidates ([`Backend::
    /// top_candidates`]) in `out` and None, or, where it gives none, the logits.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_candidates<'s>(
        &self,
        b: &B,
        st: &'s mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        cols: usize,
        k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        self.forward_one(b, st, tokens, pos0, Logits::Last)?;
        Ok(self.candidates(b, &mut st.scratch, 0, cols, k, out))
    }

    /// [`Self::forward_argmax`] over the first `cols` logits only (the ids a tokenizer can
    /// decode, where the embedding table is padded past them).
    pub fn forward_argmax_within(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        cols: usize,
    ) -> Result<u32, ModelError> {
        self.forward_one(b, st, tokens, pos0, Logits::Last)?;
        Ok(self.argmax(b, &st.scratch, 1, cols)[0])
    }

    /// One sequence's tokens, in chunks of the state's `max_batch`; returns the logit rows of
    /// the last chunk left on the device.
    fn forward_one(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        out: Logits,
    ) -> Result<usize, ModelError> {
        assert!(
            pos0 + tokens.len() <= st.n_ctx,
            "caller checks the context length"
        );
        assert!(out == Logits::Last || tokens.len() <= st.max_batch);
        let mut pos = pos0;
        let mut n_out = 0;
        for chunk in tokens.chunks(st.max_batch) {
            let mut seq = [SeqChunk {
                cache: &mut st.cache,
                tokens: chunk,
                pos0: pos,
            }];
            n_out = self.forward_seqs(b, &mut st.scratch, &mut seq, out)?;
            pos += chunk.len();
        }
        Ok(n_out)
    }

    /// The forward: every sequence of `seqs` runs its tokens at its positions, each filling
    /// its own cache, in one pass over the weights (their rows stacked, so each matrix is
    /// read once for all of them; only RoPE, the KV store and attention see sequences, and
    /// every op is row-wise, so a sequence gets the logits it would get alone). Leaves the
    /// logits on the device (read them with [`Self::logits`], [`Self::argmax`],
    /// [`Self::candidates`]) and returns their row count: one per sequence for
    /// [`Logits::Last`], one per token for [`Logits::All`]. The caller keeps every chunk
    /// non-empty and inside its cache, `Σ tokens <= max_rows` and `seqs.len() <= max_seqs`.
    pub fn forward_seqs(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        seqs: &mut [SeqChunk<'_, B>],
        out: Logits,
    ) -> Result<usize, ModelError> {
        let c = &self.cfg;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let rows_out = match out {
            Logits::Last => seqs.len(),
            Logits::All => n,
            Logits::Hidden => 0,
        };
        assert!(
            n <= sc.max_rows && seqs.len() <= sc.max_seqs && rows_out <= sc.logit_rows,
            "batch too big"
        );
        assert!(
            seqs.iter()
                .all(|s| !s.tokens.is_empty() && s.pos0 + s.tokens.len() <= s.cache.n_ctx),
            "caller checks every chunk"
        );
        if seqs.is_empty() {
            return Ok(0);
        }
        let vocab = c.vocab_size;
        sc.ids.clear();
        sc.ids
            .extend(seqs.iter().flat_map(|s| s.tokens.iter().copied()));
        // FED_TOKEN: a step's one token that the backend fed from its last pick.
        let fed = n == 1 && sc.ids[0] == kiln_backend::FED_TOKEN && b.feeds_picks();
        if let Some(&id) = sc.ids.iter().find(|&&t| t as usize >= vocab && !fed) {
            return Err(ModelError::Backend {
                file: Default::default(),
                source: kiln_backend::BackendError::TokenOutOfRange { id, vocab },
            });
        }
        let shape = |s: &SeqChunk<'_, B>| AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            pos0: s.pos0,
            n_tokens: s.tokens.len(),
            // Set per layer (forward_rows).
            window: 0,
        };
        assert!(
            seqs.iter().all(|s| s.tokens.len() <= s.cache.chunk),
            "a chunk longer than its cache's steps"
        );
        // Each sequence's caches by window; its convolution state.
        let mut kv: Vec<Vec<SeqKv<'_, B::KvCache>>> = (0..self.kv_windows.len())
            .map(|_| Vec::with_capacity(seqs.len()))
            .collect();
        let mut convs: Vec<&mut B::Tensor> = Vec::new();
        // One decode step: the same ops on the same buffers every time, so a backend may
        // record it once and replay it (a key per scratch and cache).
        let record = match &*seqs {
            [one] if n == 1 && out == Logits::Last && !sc.trace => {
                Some(((sc.key << 32) ^ one.cache.key, one.tokens, one.pos0))
            }
            _ => None,
        };
        for s in seqs.iter_mut() {
            let sh = shape(s);
            let cache = &mut *s.cache;
            for (g, c) in kv.iter_mut().zip(cache.kv.iter_mut()) {
                g.push(SeqKv {
                    cache: c,
                    shape: sh,
                });
            }
            convs.extend(cache.conv.as_mut());
        }
        self.step(b, sc, &mut kv, &mut convs, out, record)
    }

    /// `forward_rows` as one backend step: recorded for replay under `record`'s key (with the
    /// step's tokens and first position), or not recorded, the ops fusing as in a recorded
    /// one, so a sequence's sums are the same whichever of the two ran it.
    fn step(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        kv: &mut [Vec<SeqKv<'_, B::KvCache>>],
        convs: &mut [&mut B::Tensor],
        out: Logits,
        record: Option<(u64, &[u32], usize)>,
    ) -> Result<usize, ModelError> {
        // Cache memory for the positions the step writes, taken before it (a replay runs
        // no host code).
        for s in kv.iter_mut().flatten() {
            b.kv_reserve(s.cache, s.shape.pos0, s.shape.n_tokens)
                .map_err(|source| ModelError::Backend {
                    file: Default::default(),
                    source,
                })?;
        }
        // (A replay runs no closure: its row count is the recorded step's, one.)
        let mut res = Ok(1);
        let (key, tokens, pos0) = match record {
            Some((k, t, p)) => (Some(k), t, p),
            None => (None, &[][..], 0),
        };
        b.step(key, tokens, pos0, &mut || {
            res = self.forward_rows(b, sc, kv, convs, out);
            Ok(())
        })
        .map_err(|source| ModelError::Backend {
            file: Default::default(),
            source,
        })?;
        res
    }

    /// The layers over the stacked token rows of `sc.ids` (sequences `kv`, with their
    /// convolution states `convs` where the model has convolution layers), then the logits.
    fn forward_rows(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        kv: &mut [Vec<SeqKv<'_, B::KvCache>>],
        convs: &mut [&mut B::Tensor],
        out: Logits,
    ) -> Result<usize, ModelError> {
        let c = &self.cfg;
        let n = sc.ids.len();
        b.embed(&self.embed, &sc.ids, &mut sc.x)
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })?;
        if c.embed_scale != 1.0 {
            b.scale(&mut sc.x, c.embed_scale, n * c.dim);
        }
        // Every row's logits (or every sequence has one token: its row is its last): the
        // head takes x through the output norm as it stands after the last layer.
        let every_row = out == Logits::All || (out == Logits::Last && kv[0].len() == n);
        for (il, layer) in self.layers.iter().enumerate() {
            if let Some(post) = &layer.post_norms {
                self.gemma_layer(b, sc, kv, il, layer, post);
                continue;
            }
            let a = match &layer.mixer {
                Mixer::Attention(a) => a,
                Mixer::ShortConv(cv) => {
                    self.conv_layer(b, sc, &kv[0], convs, il, layer, cv);
                    continue;
                }
            };
            self.attend(b, sc, kv, il, layer, a);
            // x += Wo attn, then the FFN's norm of x.
            b.matmul_add_before_norm(&a.o, &sc.attn, n, &mut sc.x, (&layer.ffn_norm, c.norm_eps));

            b.rms_norm_gate_up_silu(
                &sc.x,
                &layer.ffn_norm,
                c.norm_eps,
                &layer.mlp.gate,
                &layer.mlp.up,
                n,
                &mut sc.h,
                &mut sc.gate,
            );
            // x += Wdown mlp, then the next layer's attention norm of x (the output norm's
            // after the last layer, where the head takes every row).
            let next_norm = match self.layers.get(il + 1) {
                Some(next) => Some(&next.attn_norm),
                None => every_row.then_some(&self.norm),
            };
            match next_norm {
                Some(norm) => b.matmul_add_before_norm(
                    &layer.mlp.down,
                    &sc.gate,
                    n,
                    &mut sc.x,
                    (norm, c.norm_eps),
                ),
                None => b.matmul_add(&layer.mlp.down, &sc.gate, n, &mut sc.x),
            }
            self.trace(b, sc.trace, "residual", il, &sc.x, n, c.dim);
        }
        if out == Logits::Hidden {
            b.rms_norm(&sc.x, &self.norm, c.norm_eps, n, &mut sc.h);
            return Ok(0);
        }
        let output = self.output.as_ref().unwrap_or(&self.embed);
        let kv = &kv[0];
        if every_row {
            let (h, logits) = (&mut sc.h, &mut sc.logits);
            b.rms_norm_matmul(&sc.x, &self.norm, c.norm_eps, output, n, h, logits);
            return Ok(n);
        }
        // Only each sequence's last token needs logits.
        let mut r = 0;
        for (j, s) in kv.iter().enumerate() {
            r += s.shape.n_tokens;
            b.copy_rows(&sc.x, r - 1, 1, &mut sc.last, j);
        }
        let m = kv.len();
        let (h, logits) = (&mut sc.last_h, &mut sc.logits);
        b.rms_norm_matmul(&sc.last, &self.norm, c.norm_eps, output, m, h, logits);
        Ok(m)
    }

    /// A layer's attention over the stacked rows of `sc.ids` into `sc.attn`: q, k, v of the
    /// normed x, their head norms and the layer's RoPE, its window, each sequence over its
    /// own cache.
    fn attend(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        kv: &mut [Vec<SeqKv<'_, B::KvCache>>],
        il: usize,
        layer: &Layer<B>,
        a: &Attention<B>,
    ) {
        let c = &self.cfg;
        let n = sc.ids.len();
        b.rms_norm_matmul3(
            &sc.x,
            &layer.attn_norm,
            c.norm_eps,
            [&a.q, &a.k, &a.v],
            [a.q_bias.as_ref(), a.k_bias.as_ref(), a.v_bias.as_ref()],
            n,
            &mut sc.h,
            [&mut sc.q, &mut sc.k, &mut sc.v],
        );
        let qk_norm = match (&a.q_norm, &a.k_norm) {
            (Some(qn), Some(kn)) => Some((qn, kn, c.norm_eps)),
            _ => None,
        };
        // This layer's caches (those of its window) and its index in them.
        let (g, li) = self.kv_map[il];
        let kv = &mut kv[g];
        if !c.layer_window.is_empty() {
            let window = c.window(il);
            kv.iter_mut().for_each(|s| s.shape.window = window);
        }
        let [sq, sk, sv] = &mut sc.seq_rows;
        b.qk_norm_rope_attention(
            &mut sc.q,
            &mut sc.k,
            &sc.v,
            qk_norm,
            c.rope_of(il),
            kv,
            li,
            &mut sc.attn,
            [sq, sk, sv],
        );
        self.trace(b, sc.trace, "attn", il, &sc.attn, n, c.q_dim());
    }

    /// A Gemma block over the stacked rows of `sc.ids`: each half's output normed before
    /// its residual add (`add_rms_norm`), GeGLU, the layer's own window and RoPE.
    fn gemma_layer(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        kv: &mut [Vec<SeqKv<'_, B::KvCache>>],
        il: usize,
        layer: &Layer<B>,
        (post_attn, post_ffn): &(B::Tensor, B::Tensor),
    ) {
        let c = &self.cfg;
        let n = sc.ids.len();
        let Mixer::Attention(a) = &layer.mixer else {
            unreachable!("Gemma's layers are attention layers");
        };
        self.attend(b, sc, kv, il, layer, a);
        // x += norm(Wo attn)
        b.matmul(&a.o, &sc.attn, None, n, &mut sc.y);
        let ffn_norm = Some((&layer.ffn_norm, c.norm_eps));
        b.add_rms_norm(
            &mut sc.x, &sc.y, post_attn, c.norm_eps, n, &mut sc.h, ffn_norm,
        );
        // x += norm(Wdown (act(Wgate norm(x)) * Wup norm(x)))
        let (m, eps) = (&layer.mlp, c.norm_eps);
        match c.act {
            Activation::GeluTanh => b.rms_norm_gate_up_gelu(
                &sc.x,
                &layer.ffn_norm,
                eps,
                &m.gate,
                &m.up,
                n,
                &mut sc.h,
                &mut sc.gate,
                &mut sc.up,
            ),
            Activation::Silu => b.rms_norm_gate_up_silu(
                &sc.x,
                &layer.ffn_norm,
                eps,
                &m.gate,
                &m.up,
                n,
                &mut sc.h,
                &mut sc.gate,
            ),
        }
        b.matmul(&m.down, &sc.gate, None, n, &mut sc.y);
        // (The next layer's attention norm; after the last layer, the final norm's product
        // is not a fused one.)
        let next = self.layers.get(il + 1).map(|l| (&l.attn_norm, c.norm_eps));
        b.add_rms_norm(&mut sc.x, &sc.y, post_ffn, c.norm_eps, n, &mut sc.h, next);
        self.trace(b, sc.trace, "residual", il, &sc.x, n, c.dim);
    }

    /// An LFM2 convolution layer over the stacked rows of `sc.ids`: x += Wout (C * conv(B *
    /// x')) with B, C, x' = Win norm(x), each sequence's rows convolved from its own state;
    /// then the SwiGLU MLP as in the Llama block.
    #[allow(clippy::too_many_arguments)]
    fn conv_layer(
        &self,
        b: &B,
        sc: &mut LlamaScratch<B>,
        kv: &[SeqKv<'_, B::KvCache>],
        convs: &mut [&mut B::Tensor],
        il: usize,
        layer: &Layer<B>,
        cv: &ShortConv<B>,
    ) {
        let c = &self.cfg;
        let n = sc.ids.len();
        let (dim, k) = (c.dim, c.conv_k);
        // This layer's state rows: k - 1 for each convolution layer before it.
        let srow = (0..il).filter(|&i| c.is_conv(i)).count() * (k - 1);
        b.rms_norm(&sc.x, &layer.attn_norm, c.norm_eps, n, &mut sc.h);
        b.matmul(&cv.in_proj, &sc.h, None, n, &mut sc.bcx);
        let mut r0 = 0;
        for (s, state) in kv.iter().zip(convs.iter_mut()) {
            let ns = s.shape.n_tokens;
            let fresh = s.shape.pos0 == 0;
            b.short_conv(
                &sc.bcx,
                &cv.taps,
                state,
                srow,
                (dim, k),
                (r0, ns),
                fresh,
                &mut sc.y,
            );
            r0 += ns;
        }
        b.matmul_add(&cv.out_proj, &sc.y, n, &mut sc.x);
        self.trace(b, sc.trace, "conv", il, &sc.y, n, dim);
        b.rms_norm_gate_up_silu(
            &sc.x,
            &layer.ffn_norm,
            c.norm_eps,
            &layer.mlp.gate,
            &layer.mlp.up,
            n,
            &mut sc.h,
            &mut sc.gate,
        );
        b.matmul_add(&layer.mlp.down, &sc.gate, n, &mut sc.x);
        self.trace(b, sc.trace, "residual", il, &sc.x, n, dim);
    }

    /// Every token's final-normed hidden state (`tokens.len() x dim`, the model's last
    /// hidden states as transformers returns them), `tokens` fed from position 0 of `st`'s
    /// cache in chunks of its batch: what embedding models pool.
    pub fn hidden_states(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        assert!(tokens.len() <= st.n_ctx, "caller checks the context length");
        let dim = self.cfg.dim;
        let mut out = vec![0f32; tokens.len() * dim];
        let step = st.max_batch.max(1);
        for (i, chunk) in tokens.chunks(step).enumerate() {
            let mut seq = [SeqChunk {
                cache: &mut st.cache,
                tokens: chunk,
                pos0: i * step,
            }];
            self.forward_seqs(b, &mut st.scratch, &mut seq, Logits::Hidden)?;
            let at = i * step * dim;
            b.read(
                &st.scratch.h,
                chunk.len(),
                &mut out[at..at + chunk.len() * dim],
            );
        }
        Ok(out)
    }

    /// The first `rows` rows of the last forward's logits, on the host (`rows x vocab`).
    pub fn logits<'s>(&self, b: &B, sc: &'s mut LlamaScratch<B>, rows: usize) -> &'s [f32] {
        let vocab = self.cfg.vocab_size;
        b.read(&sc.logits, rows, &mut sc.logits_host[..rows * vocab]);
        &sc.logits_host[..rows * vocab]
    }

    /// Row `row` of the last forward's logits, on the host (`vocab`).
    pub fn logits_row<'s>(&self, b: &B, sc: &'s mut LlamaScratch<B>, row: usize) -> &'s [f32] {
        if row == 0 {
            return self.logits(b, sc, 1);
        }
        let vocab = self.cfg.vocab_size;
        b.copy_rows(&sc.logits, row, 1, &mut sc.pick, 0);
        b.read(&sc.pick, 1, &mut sc.logits_host[..vocab]);
        &sc.logits_host[..vocab]
    }

    /// The greedy token of each of the first `rows` rows of the last forward's logits, over
    /// their first `cols` columns, picked where the logits are.
    pub fn argmax(&self, b: &B, sc: &LlamaScratch<B>, rows: usize, cols: usize) -> Vec<u32> {
        b.argmax_rows(&sc.logits, rows, cols.min(self.cfg.vocab_size))
    }

    /// Candidates for a pick that needs only the `k` largest of the first `cols` logits of
    /// row `row`: the backend's ([`LlmOps::top_candidates`]) in `out` and None, or, where it
    /// gives none, the row's logits.
    pub fn candidates<'s>(
        &self,
        b: &B,
        sc: &'s mut LlamaScratch<B>,
        row: usize,
        cols: usize,
        k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> Option<&'s [f32]> {
        let vocab = self.cfg.vocab_size;
        if row != 0 {
            b.copy_rows(&sc.logits, row, 1, &mut sc.pick, 0);
        }
        // The row, as row 0 of a tensor (picked out once, for the candidates or the read).
        let t = if row == 0 { &sc.logits } else { &sc.pick };
        if b.top_candidates(t, cols.min(vocab), k, out) {
            return None;
        }
        b.read(t, 1, &mut sc.logits_host[..vocab]);
        Some(&sc.logits_host[..vocab])
    }

    /// With `KILN_TRACE` set, prints a named activation's summary per layer (stderr), so a
    /// numerical difference between backends becomes a diff of two traces.
    #[allow(clippy::too_many_arguments)]
    fn trace(&self, b: &B, on: bool, name: &str, il: usize, t: &B::Tensor, n: usize, cols: usize) {
        if !on {
            return;
        }
        let mut v = vec![0f32; n * cols];
        b.read(t, n, &mut v);
        let last = &v[(n - 1) * cols..];
        let rms = (last.iter().map(|x| x * x).sum::<f32>() / cols as f32).sqrt();
        eprintln!(
            "trace {name:>10} layer {il:>3}: rms {rms:.6} first {:?}",
            &last[..4.min(cols)]
        );
    }
}
