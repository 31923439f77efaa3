//! The Llama family: pre-norm decoder blocks of grouped-query attention with RoPE and a SwiGLU
//! MLP. SmolLM is Llama; Qwen2 adds q/k/v biases; Qwen3 adds per-head q/k RMSNorm.
//!
//! x = embed(tokens)
//! for each layer:  x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//!                  x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//! logits = Wout · norm(x)

use kiln_backend::{AttnShape, Backend, KvType};
use kiln_formats::GgufFile;
use kiln_quant::GgmlType;

use super::{HfCheckpoint, LayerParam, LlmConfig, Param};
use crate::{ModelError, Source, WeightMap};

mod batch;
pub use batch::{LlamaBatch, SeqChunk};

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

pub struct Layer<B: Backend> {
    pub attn_norm: B::Tensor, // attn_norm (dim)
    pub attn: Attention<B>,
    pub ffn_norm: B::Tensor, // ffn_norm (dim)
    pub mlp: Mlp<B>,
}

pub struct Llama<B: Backend> {
    pub cfg: LlmConfig,
    pub embed: B::Weight, // token_embd (vocab, dim)
    pub layers: Vec<Layer<B>>,
    pub norm: B::Tensor,           // output_norm (dim)
    pub output: Option<B::Weight>, // output (vocab, dim); None when tied to `embed`
}

/// Everything one sequence needs while decoding, allocated once: the KV cache and scratch
/// activations for up to `max_batch` tokens per forward call.
pub struct LlamaState<B: Backend> {
    pub n_ctx: usize,
    pub max_batch: usize,
    kv: B::KvCache,
    x: B::Tensor,
    h: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: B::Tensor,
    gate: B::Tensor,
    last: B::Tensor,
    logits: B::Tensor,
    logits_host: Vec<f32>,
    trace: bool,
    /// Unique per state: the key under which a backend may record this state's decode step.
    step_key: u64,
}

impl<B: Backend> Llama<B> {
    /// A GGUF model, weights in their stored formats.
    pub fn load(b: &B, g: &GgufFile) -> Result<Self, ModelError> {
        Self::load_gguf(b, g, None)
    }

    /// A GGUF model; `quant` requantizes every matrix at load.
    pub fn load_gguf(b: &B, g: &GgufFile, quant: Option<GgmlType>) -> Result<Self, ModelError> {
        let cfg = LlmConfig::from_gguf(g)?;
        Self::from_weights(b, cfg, WeightMap::from_source(Source::Gguf(g), quant))
    }

    /// A Hugging Face (or MLX) checkpoint; `quant` requantizes every matrix at load.
    pub fn load_hf(b: &B, ck: &HfCheckpoint, quant: Option<GgmlType>) -> Result<Self, ModelError> {
        let src = Source::SafeTensors {
            set: &ck.tensors,
            dir: &ck.dir,
            mlx: ck.mlx.as_ref(),
        };
        Self::from_weights(b, ck.cfg.clone(), WeightMap::from_source(src, quant))
    }

    /// Reads every parameter the config calls for, by canonical name.
    pub fn from_weights(b: &B, cfg: LlmConfig, w: WeightMap) -> Result<Self, ModelError> {
        use LayerParam as L;
        let (dim, q_dim, kv_dim, ffn) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.ffn_dim);
        b.check_attention(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
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
            let head_norm = |l| -> Result<_, ModelError> {
                cfg.qk_norm
                    .then(|| w.vector(b, p(l), cfg.head_dim))
                    .transpose()
            };
            layers.push(Layer {
                attn_norm: w.vector(b, p(L::AttnNorm), dim)?,
                attn: Attention {
                    q: w.matrix(b, p(L::AttnQ), q_dim, dim)?,
                    k: w.matrix(b, p(L::AttnK), kv_dim, dim)?,
                    v: w.matrix(b, p(L::AttnV), kv_dim, dim)?,
                    o: w.matrix(b, p(L::AttnOutput), dim, q_dim)?,
                    q_bias: bias(L::AttnQBias, q_dim)?,
                    k_bias: bias(L::AttnKBias, kv_dim)?,
                    v_bias: bias(L::AttnVBias, kv_dim)?,
                    q_norm: head_norm(L::AttnQNorm)?,
                    k_norm: head_norm(L::AttnKNorm)?,
                },
                ffn_norm: w.vector(b, p(L::FfnNorm), dim)?,
                mlp: Mlp {
                    gate: w.matrix(b, p(L::FfnGate), ffn, dim)?,
                    up: w.matrix(b, p(L::FfnUp), ffn, dim)?,
                    down: w.matrix(b, p(L::FfnDown), dim, ffn)?,
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
        Ok(Llama {
            cfg,
            embed,
            layers,
            norm,
            output,
        })
    }

    /// Every weight matrix once (a tied output projection is the embedding table).
    fn matrices(&self) -> impl Iterator<Item = &B::Weight> {
        let layers = self.layers.iter().flat_map(|l| {
            let (a, m) = (&l.attn, &l.mlp);
            [&a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]
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
            v.extend([
                (Param::Layer(i, L::AttnQ), q, dim),
                (Param::Layer(i, L::AttnK), kv, dim),
                (Param::Layer(i, L::AttnV), kv, dim),
                (Param::Layer(i, L::AttnOutput), dim, q),
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
                let (a, m) = (&mut layer.attn, &mut layer.mlp);
                match l {
                    L::AttnQ => Some(&mut a.q),
                    L::AttnK => Some(&mut a.k),
                    L::AttnV => Some(&mut a.v),
                    L::AttnOutput => Some(&mut a.o),
                    L::FfnGate => Some(&mut m.gate),
                    L::FfnUp => Some(&mut m.up),
                    L::FfnDown => Some(&mut m.down),
                    L::AttnNorm
                    | L::FfnNorm
                    | L::AttnQBias
                    | L::AttnKBias
                    | L::AttnVBias
                    | L::AttnQNorm
                    | L::AttnKNorm => None,
                }
            }
        }
    }

    /// Values held as f32 vectors: norms and biases.
    fn vector_params(&self) -> usize {
        let c = &self.cfg;
        let bias = usize::from(c.qkv_bias) * (c.q_dim() + 2 * c.kv_dim());
        let head_norm = usize::from(c.qk_norm) * 2 * c.head_dim;
        c.n_layers * (2 * c.dim + bias + head_norm) + c.dim
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
        let mlp = 3 * c.ffn_dim * c.dim;
        let tables = if self.output.is_some() { 2 } else { 1 };
        tables * c.vocab_size * c.dim + c.n_layers * (attn + mlp) + self.vector_params()
    }

    pub fn new_state(&self, b: &B, n_ctx: usize, max_batch: usize) -> LlamaState<B> {
        let kv = b.kv_cache(
            self.cfg.n_layers,
            n_ctx,
            self.cfg.n_kv_heads,
            self.cfg.head_dim,
        );
        self.state_with(b, n_ctx, max_batch, kv)
    }

    /// A state whose KV cache stores keys and values as `kv`.
    pub fn new_state_kv(
        &self,
        b: &B,
        n_ctx: usize,
        max_batch: usize,
        kv: KvType,
    ) -> Result<LlamaState<B>, ModelError> {
        let c = &self.cfg;
        let cache = b
            .kv_cache_typed(c.n_layers, n_ctx, c.n_kv_heads, c.head_dim, kv)
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })?;
        Ok(self.state_with(b, n_ctx, max_batch, cache))
    }

    fn state_with(&self, b: &B, n_ctx: usize, max_batch: usize, kv: B::KvCache) -> LlamaState<B> {
        let c = &self.cfg;
        let max_batch = max_batch.max(1);
        LlamaState {
            n_ctx,
            max_batch,
            kv,
            x: b.tensor(max_batch, c.dim),
            h: b.tensor(max_batch, c.dim),
            q: b.tensor(max_batch, c.q_dim()),
            k: b.tensor(max_batch, c.kv_dim()),
            v: b.tensor(max_batch, c.kv_dim()),
            attn: b.tensor(max_batch, c.q_dim()),
            gate: b.tensor(max_batch, c.ffn_dim),
            last: b.tensor(max_batch, c.dim),
            logits: b.tensor(max_batch, c.vocab_size),
            logits_host: vec![0.0; max_batch * c.vocab_size],
            trace: std::env::var_os("KILN_TRACE").is_some(),
            step_key: kiln_backend::next_step_key(),
        }
    }

    /// Bytes of the state's KV cache.
    pub fn kv_bytes(&self, b: &B, st: &LlamaState<B>) -> usize {
        b.kv_cache_bytes(&st.kv)
    }

    /// Runs `tokens` at positions `pos0..`, filling the KV cache. Returns the logits of the
    /// last token (`vocab`), or of every token of the last chunk when `all_logits` (then at
    /// most `max_batch` tokens may be passed).
    pub fn forward<'s>(
        &self,
        b: &B,
        st: &'s mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> Result<&'s [f32], ModelError> {
        let n_out = self.forward_device(b, st, tokens, pos0, all_logits)?;
        let vocab = self.cfg.vocab_size;
        b.read(&st.logits, n_out, &mut st.logits_host[..n_out * vocab]);
        Ok(&st.logits_host[..n_out * vocab])
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
        self.forward_device(b, st, tokens, pos0, false)?;
        let vocab = self.cfg.vocab_size;
        if b.top_candidates(&st.logits, cols.min(vocab), k, out) {
            return Ok(None);
        }
        b.read(&st.logits, 1, &mut st.logits_host[..vocab]);
        Ok(Some(&st.logits_host[..vocab]))
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
        self.forward_device(b, st, tokens, pos0, false)?;
        Ok(b.argmax_rows(&st.logits, 1, cols.min(self.cfg.vocab_size))[0])
    }

    /// Runs the forward pass leaving the logits on the device; returns their row count.
    fn forward_device(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> Result<usize, ModelError> {
        assert!(
            pos0 + tokens.len() <= st.n_ctx,
            "caller checks the context length"
        );
        assert!(!all_logits || tokens.len() <= st.max_batch);
        let vocab = self.cfg.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Backend {
                file: Default::default(),
                source: kiln_backend::BackendError::TokenOutOfRange { id, vocab },
            });
        }
        if tokens.len() == 1 && !all_logits && !st.trace {
            // One decode step: the same ops on the same buffers every time, so a backend may
            // record it once and replay it.
            let key = st.step_key;
            let mut res = Ok(0);
            b.step(key, tokens, pos0, &mut || {
                res = self.forward_chunk(b, st, tokens, pos0, false);
                Ok(())
            })
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })?;
            res?;
            return Ok(1);
        }
        let mut pos = pos0;
        let mut n_out = 0;
        for chunk in tokens.chunks(st.max_batch) {
            n_out = self.forward_chunk(b, st, chunk, pos, all_logits)?;
            pos += chunk.len();
        }
        Ok(n_out)
    }

    fn forward_chunk(
        &self,
        b: &B,
        st: &mut LlamaState<B>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> Result<usize, ModelError> {
        let c = &self.cfg;
        let n = tokens.len();
        b.embed(&self.embed, tokens, &mut st.x)
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })?;
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            pos0,
            n_tokens: n,
        };
        for (il, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            b.rms_norm_matmul3(
                &st.x,
                &layer.attn_norm,
                c.norm_eps,
                [&a.q, &a.k, &a.v],
                [a.q_bias.as_ref(), a.k_bias.as_ref(), a.v_bias.as_ref()],
                n,
                &mut st.h,
                [&mut st.q, &mut st.k, &mut st.v],
            );
            let qk_norm = match (&a.q_norm, &a.k_norm) {
                (Some(qn), Some(kn)) => Some((qn, kn, c.norm_eps)),
                _ => None,
            };
            b.qk_norm_rope_attention(
                &mut st.q,
                &mut st.k,
                &st.v,
                qk_norm,
                &c.rope,
                &mut st.kv,
                il,
                shape,
                &mut st.attn,
            );
            self.trace(b, st.trace, "attn", il, &st.attn, n, c.q_dim());
            // x += Wo attn, then the FFN's norm of x.
            b.matmul_add_before_norm(&a.o, &st.attn, n, &mut st.x, (&layer.ffn_norm, c.norm_eps));

            b.rms_norm_gate_up_silu(
                &st.x,
                &layer.ffn_norm,
                c.norm_eps,
                &layer.mlp.gate,
                &layer.mlp.up,
                n,
                &mut st.h,
                &mut st.gate,
            );
            // x += Wdown mlp, then the next layer's attention norm of x.
            match self.layers.get(il + 1) {
                Some(next) => b.matmul_add_before_norm(
                    &layer.mlp.down,
                    &st.gate,
                    n,
                    &mut st.x,
                    (&next.attn_norm, c.norm_eps),
                ),
                None => b.matmul_add(&layer.mlp.down, &st.gate, n, &mut st.x),
            }
            self.trace(b, st.trace, "residual", il, &st.x, n, c.dim);
        }
        let output = self.output.as_ref().unwrap_or(&self.embed);
        if all_logits {
            b.rms_norm(&st.x, &self.norm, c.norm_eps, n, &mut st.h);
            b.matmul(output, &st.h, None, n, &mut st.logits);
            Ok(n)
        } else {
            // Only the last token's logits are needed.
            b.copy_row(&st.x, n - 1, &mut st.last);
            b.rms_norm(&st.last, &self.norm, c.norm_eps, 1, &mut st.h);
            b.matmul(output, &st.h, None, 1, &mut st.logits);
            Ok(1)
        }
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
