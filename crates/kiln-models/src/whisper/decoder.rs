//! The text decoder: token embeddings plus learned positions, pre-norm layers of causal
//! self-attention (KV cache), cross-attention over the encoder output, and a GELU MLP; the
//! output projection is the embedding table (tied).

use kiln_backend::{AttnShape, Backend, DenseAttnShape};

use super::encoder::{Linear, Mlp, Norm, SelfAttention};
use super::{Weights, WhisperConfig};
use crate::ModelError;

pub struct DecoderLayer<B: Backend> {
    pub self_ln: Norm<B>,     // decoder.blocks.i.attn_ln
    pub q: Linear<B>,         // .attn.query
    pub k: Linear<B>,         // .attn.key (no bias)
    pub v: Linear<B>,         // .attn.value
    pub self_out: Linear<B>,  // .attn.out
    pub cross_ln: Norm<B>,    // .cross_attn_ln
    pub cross_q: Linear<B>,   // .cross_attn.query
    pub cross_k: Linear<B>,   // .cross_attn.key (no bias)
    pub cross_v: Linear<B>,   // .cross_attn.value
    pub cross_out: Linear<B>, // .cross_attn.out
    pub mlp_ln: Norm<B>,      // .mlp_ln
    pub mlp: Mlp<B>,          // .mlp.0, .mlp.2
}

pub struct Decoder<B: Backend> {
    pub embed: B::Weight, // decoder.token_embedding.weight (n_vocab, d); also the output projection
    pub pos: B::Weight,   // decoder.positional_embedding (n_text_ctx, d)
    pub layers: Vec<DecoderLayer<B>>,
    pub ln: Norm<B>, // decoder.ln
}

/// Cross-attention keys and values of every decoder layer over one window's encoding.
pub struct CrossKv<B: Backend> {
    pub k: Vec<B::Tensor>, // per layer (n_audio_ctx, d)
    pub v: Vec<B::Tensor>,
}

impl<B: Backend> CrossKv<B> {
    pub fn new(b: &B, c: &WhisperConfig) -> Self {
        let t = || b.tensor(c.n_audio_ctx, c.d_model);
        CrossKv {
            k: (0..c.n_text_layers).map(|_| t()).collect(),
            v: (0..c.n_text_layers).map(|_| t()).collect(),
        }
    }
}

/// One sequence's decoding state: self-attention KV cache and scratch for up to
/// `n_text_ctx` tokens per call, allocated once.
pub struct DecoderState<B: Backend> {
    kv: B::KvCache,
    acts: Acts<B>,
    last: B::Tensor,
    logits: B::Tensor,
    logits_host: Vec<f32>,
}

impl<B: Backend> DecoderState<B> {
    /// Takes over `other`'s first `n` positions (a beam forked from another).
    pub fn copy_from(&mut self, b: &B, other: &Self, n: usize) {
        b.kv_copy(&other.kv, &mut self.kv, n);
    }

    pub fn new(b: &B, c: &WhisperConfig) -> Self {
        let (n, d) = (c.n_text_ctx, c.d_model);
        DecoderState {
            kv: b.kv_cache(c.n_text_layers, n, c.n_text_heads, d / c.n_text_heads),
            acts: Acts::new(b, c, n),
            last: b.tensor(1, d),
            logits: b.tensor(1, c.n_vocab),
            logits_host: vec![0.0; c.n_vocab],
        }
    }
}

/// Scratch of one step of several sequences (a beam search's hypotheses): a row each.
pub struct BeamScratch<B: Backend> {
    rows: usize,
    acts: Acts<B>,
    /// The step's position, a row each.
    pos_ids: Vec<u32>,
    row_k: B::Tensor,
    row_v: B::Tensor,
    logits: B::Tensor,
    logits_host: Vec<f32>,
}

impl<B: Backend> BeamScratch<B> {
    /// Room for `rows` sequences a step.
    pub fn new(b: &B, c: &WhisperConfig, rows: usize) -> Self {
        let (n, d) = (rows.max(1), c.d_model);
        BeamScratch {
            rows: n,
            acts: Acts::new(b, c, n),
            pos_ids: Vec::with_capacity(n),
            row_k: b.tensor(1, d),
            row_v: b.tensor(1, d),
            logits: b.tensor(n, c.n_vocab),
            logits_host: vec![0.0; n * c.n_vocab],
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// The activations a pass of the layers works in (a sequence's or a beam step's), `rows`
/// of each.
struct Acts<B: Backend> {
    x: B::Tensor,
    h: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: B::Tensor,
    hidden: B::Tensor,
}

impl<B: Backend> Acts<B> {
    fn new(b: &B, c: &WhisperConfig, rows: usize) -> Self {
        let t = |cols| b.tensor(rows, cols);
        Acts {
            x: t(c.d_model),
            h: t(c.d_model),
            q: t(c.d_model),
            k: t(c.d_model),
            v: t(c.d_model),
            attn: t(c.d_model),
            hidden: t(c.ffn_dim),
        }
    }
}

/// Self-attention of `n` tokens from position `pos0` (every head its own keys).
fn self_shape(c: &WhisperConfig, pos0: usize, n: usize) -> AttnShape {
    AttnShape {
        n_heads: c.n_text_heads,
        n_kv_heads: c.n_text_heads,
        head_dim: c.d_model / c.n_text_heads,
        pos0,
        n_tokens: n,
        window: 0,
    }
}

impl<B: Backend> Decoder<B> {
    pub fn load(b: &B, w: &Weights, c: &WhisperConfig) -> Result<Self, ModelError> {
        let (d, ffn) = (c.d_model, c.ffn_dim);
        let mut layers = Vec::with_capacity(c.n_text_layers);
        for i in 0..c.n_text_layers {
            let p = format!("decoder.blocks.{i}");
            let (sa, ca) = (format!("{p}.attn"), format!("{p}.cross_attn"));
            // Cross-attention keys/values are products over all audio positions, once per
            // window (arithmetic-bound, like the encoder).
            w.set_batched(true);
            let cross_k = Linear::load_key(b, w, &format!("{ca}.key"), d)?;
            let cross_v = Linear::load(b, w, &format!("{ca}.value"), d, d)?;
            w.set_batched(false);
            let sa_w = SelfAttention::load(b, w, &sa, d)?;
            layers.push(DecoderLayer {
                self_ln: Norm::load(b, w, &format!("{p}.attn_ln"), d)?,
                q: sa_w.q,
                k: sa_w.k,
                v: sa_w.v,
                self_out: sa_w.out,
                cross_ln: Norm::load(b, w, &format!("{p}.cross_attn_ln"), d)?,
                cross_q: Linear::load(b, w, &format!("{ca}.query"), d, d)?,
                cross_k,
                cross_v,
                cross_out: Linear::load(b, w, &format!("{ca}.out"), d, d)?,
                mlp_ln: Norm::load(b, w, &format!("{p}.mlp_ln"), d)?,
                mlp: Mlp::load(b, w, &p, d, ffn)?,
            });
        }
        let (vocab, ctx) = (c.n_vocab as u64, c.n_text_ctx as u64);
        Ok(Decoder {
            embed: w.matrix(
                b,
                "decoder.token_embedding.weight",
                &[vocab, d as u64],
                true,
            )?,
            pos: w.matrix(b, "decoder.positional_embedding", &[ctx, d as u64], false)?,
            layers,
            ln: Norm::load(b, w, "decoder.ln", d)?,
        })
    }

    /// Keys and values of every layer's cross-attention over `audio` (n_audio_ctx, d).
    pub fn cross_kv(&self, b: &B, c: &WhisperConfig, audio: &B::Tensor, out: &mut CrossKv<B>) {
        let n = c.n_audio_ctx;
        for (l, (k, v)) in self
            .layers
            .iter()
            .zip(out.k.iter_mut().zip(out.v.iter_mut()))
        {
            l.cross_k.forward(b, audio, n, k);
            l.cross_v.forward(b, audio, n, v);
        }
    }

    /// tokens at positions pos0.. -> logits after the last token (n_vocab).
    pub fn forward<'s>(
        &self,
        b: &B,
        c: &WhisperConfig,
        st: &'s mut DecoderState<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<&'s [f32], ModelError> {
        let n = tokens.len();
        if n == 0 || pos0 + n > c.n_text_ctx {
            return Err(ModelError::Input(format!(
                "{n} tokens at position {pos0} do not fit the text context of {}",
                c.n_text_ctx
            )));
        }
        // (Recording this step for replay was measured on an H200 and did not pay: a
        // token's time is the host's work on the logits, and each transcription would record
        // its states anew.)
        self.layers_forward(b, c, st, cross, tokens, pos0, &mut |_, _| {})?;
        b.read(&st.logits, 1, &mut st.logits_host);
        Ok(&st.logits_host)
    }

    /// Cross-attention logits of `heads` ((layer, head) pairs) for `tokens` from position 0:
    /// for each head, `tokens.len()` rows of `n_frames` values q·k / sqrt(head_dim) over the
    /// first `n_frames` audio positions (what word alignment reads; the attention itself
    /// stays fused in the backend).
    pub fn cross_attention_logits(
        &self,
        b: &B,
        c: &WhisperConfig,
        st: &mut DecoderState<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        heads: &[(usize, usize)],
        n_frames: usize,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let n = tokens.len();
        if n == 0 || n > c.n_text_ctx {
            return Err(ModelError::Input(format!(
                "{n} tokens do not fit the text context of {}",
                c.n_text_ctx
            )));
        }
        let (d, hd) = (c.d_model, c.d_model / c.n_text_heads);
        let n_frames = n_frames.min(c.n_audio_ctx);
        if let Some(&(l, h)) = heads
            .iter()
            .find(|&&(l, h)| l >= c.n_text_layers || h >= c.n_text_heads)
        {
            return Err(ModelError::Input(format!(
                "alignment head ({l}, {h}) is not in a decoder of {} layers x {} heads",
                c.n_text_layers, c.n_text_heads
            )));
        }
        let mut queries: Vec<Option<Vec<f32>>> = vec![None; c.n_text_layers];
        self.layers_forward(b, c, st, cross, tokens, 0, &mut |layer, q| {
            if heads.iter().any(|&(l, _)| l == layer) {
                let mut v = vec![0.0; n * d];
                b.read(q, n, &mut v);
                queries[layer] = Some(v);
            }
        })?;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut keys: Vec<Option<Vec<f32>>> = vec![None; c.n_text_layers];
        let mut out = Vec::with_capacity(heads.len());
        for &(l, h) in heads {
            let k = keys[l].get_or_insert_with(|| {
                let mut v = vec![0.0; c.n_audio_ctx * d];
                b.read(&cross.k[l], c.n_audio_ctx, &mut v);
                v
            });
            let q = queries[l].as_ref().expect("captured above");
            let mut m = vec![0.0f32; n * n_frames];
            for t in 0..n {
                let qt = &q[t * d + h * hd..t * d + (h + 1) * hd];
                for f in 0..n_frames {
                    let kf = &k[f * d + h * hd..f * d + (h + 1) * hd];
                    m[t * n_frames + f] =
                        qt.iter().zip(kf).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
            }
            out.push(m);
        }
        Ok(out)
    }

    /// One token for each of `sts.len()` sequences, all at position `pos` (a beam search's
    /// hypotheses after their forks): `tokens[j]` continues `sts[j]`. One pass for all of
    /// them: each product reads its weights once for every row, each row's self-attention
    /// runs over its own cache, the cross-attention takes their queries together. Returns the
    /// logits, a row of `n_vocab` each, in the order of `sts`. Each row gets exactly what
    /// [`forward`](Self::forward) of its one token gives it, where the backend's products of a
    /// row do not depend on the others (the CPU's do).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_beams<'s>(
        &self,
        b: &B,
        c: &WhisperConfig,
        sts: &mut [DecoderState<B>],
        s: &'s mut BeamScratch<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        pos: usize,
    ) -> Result<&'s [f32], ModelError> {
        let n = tokens.len();
        if n == 0 || n != sts.len() || n > s.rows || pos >= c.n_text_ctx {
            return Err(ModelError::Input(format!(
                "{n} tokens for {} sequences ({} rows of scratch) at position {pos} (text \
                 context {})",
                sts.len(),
                s.rows,
                c.n_text_ctx
            )));
        }
        let BeamScratch {
            acts: t,
            pos_ids,
            row_k,
            row_v,
            logits,
            logits_host,
            ..
        } = s;
        let emb_err = |source| ModelError::Input(format!("decoder input: {source}"));
        // x = embed(tokens) + pos[pos] on every row
        b.embed(&self.embed, tokens, &mut t.x).map_err(emb_err)?;
        pos_ids.clear();
        pos_ids.resize(n, pos as u32);
        b.embed(&self.pos, pos_ids, &mut t.h).map_err(emb_err)?;
        b.add(&mut t.x, &t.h, n);
        let self_shape = self_shape(c, pos, 1);
        // Each row's key and value into its own cache, its attention over it.
        let mut attend =
            |i: usize, q: &B::Tensor, k: &B::Tensor, v: &B::Tensor, out: &mut B::Tensor| {
                for (j, st) in sts.iter_mut().enumerate() {
                    b.copy_rows(k, j, 1, row_k, 0);
                    b.copy_rows(v, j, 1, row_v, 0);
                    b.kv_store(&mut st.kv, i, row_k, row_v, pos, 1);
                }
                b.attention_batch(q, sts.iter().map(|st| (&st.kv, self_shape)), i, out);
            };
        self.layers(b, c, t, n, cross, &mut attend, &mut |_, _| {});
        self.ln.apply(b, &t.x, n, &mut t.h);
        b.matmul(&self.embed, &t.h, None, n, logits);
        let m = n * c.n_vocab;
        b.read(logits, n, &mut logits_host[..m]);
        let host: &'s Vec<f32> = logits_host;
        Ok(&host[..m])
    }

    /// The decoder's ops for `tokens` at pos0.., up to the logits in `st.logits`.
    #[allow(clippy::too_many_arguments)]
    fn layers_forward(
        &self,
        b: &B,
        c: &WhisperConfig,
        st: &mut DecoderState<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        pos0: usize,
        on_cross_query: &mut dyn FnMut(usize, &B::Tensor),
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        let DecoderState {
            kv,
            acts: t,
            last,
            logits,
            ..
        } = st;
        let emb_err = |source| ModelError::Input(format!("decoder input: {source}"));
        // x = embed(tokens) + pos[pos0..pos0+n]
        b.embed(&self.embed, tokens, &mut t.x).map_err(emb_err)?;
        b.embed_positions(&self.pos, pos0, n, &mut t.h)
            .map_err(emb_err)?;
        b.add(&mut t.x, &t.h, n);
        let self_shape = self_shape(c, pos0, n);
        let mut attend =
            |i: usize, q: &B::Tensor, k: &B::Tensor, v: &B::Tensor, out: &mut B::Tensor| {
                b.kv_store(kv, i, k, v, pos0, n);
                b.attention(q, kv, i, self_shape, out);
            };
        self.layers(b, c, t, n, cross, &mut attend, on_cross_query);
        // logits = embed · ln(x_last)
        b.copy_row(&t.x, n - 1, &mut t.h);
        self.ln.apply(b, &t.h, 1, last);
        b.matmul(&self.embed, last, None, 1, logits);
        Ok(())
    }

    /// Every layer over the `n` rows of `t`: self-attention through `attend(layer, q, k, v,
    /// out)` (which stores the rows' keys and values where they belong and writes their
    /// attention), cross-attention over `cross` (its queries shown to `on_cross_query`), MLP.
    #[allow(clippy::too_many_arguments)]
    fn layers(
        &self,
        b: &B,
        c: &WhisperConfig,
        t: &mut Acts<B>,
        n: usize,
        cross: &CrossKv<B>,
        attend: &mut dyn FnMut(usize, &B::Tensor, &B::Tensor, &B::Tensor, &mut B::Tensor),
        on_cross_query: &mut dyn FnMut(usize, &B::Tensor),
    ) {
        let cross_shape = DenseAttnShape {
            heads: c.n_text_heads,
            head_dim: c.d_model / c.n_text_heads,
            n_q: n,
            n_kv: c.n_audio_ctx,
            causal: false,
        };
        for (i, l) in self.layers.iter().enumerate() {
            // x += Wo · self_attn(ln(x))
            l.self_ln.apply(b, &t.x, n, &mut t.h);
            b.matmul3(
                [&l.q.w, &l.k.w, &l.v.w],
                [Some(&l.q.b), Some(&l.k.b), Some(&l.v.b)],
                &t.h,
                n,
                [&mut t.q, &mut t.k, &mut t.v],
            );
            attend(i, &t.q, &t.k, &t.v, &mut t.attn);
            l.self_out.forward(b, &t.attn, n, &mut t.h);
            b.add(&mut t.x, &t.h, n);
            // x += Wo · cross_attn(ln(x), audio)
            l.cross_ln.apply(b, &t.x, n, &mut t.h);
            l.cross_q.forward(b, &t.h, n, &mut t.q);
            on_cross_query(i, &t.q);
            b.attention_dense(&t.q, &cross.k[i], &cross.v[i], cross_shape, &mut t.attn);
            l.cross_out.forward(b, &t.attn, n, &mut t.h);
            b.add(&mut t.x, &t.h, n);
            // x += mlp(ln(x))
            l.mlp_ln.apply(b, &t.x, n, &mut t.h);
            l.mlp.forward(b, &t.h, n, &mut t.hidden, &mut t.q);
            b.add(&mut t.x, &t.q, n);
        }
    }

    pub fn weight_bytes(&self, b: &B) -> usize {
        let mut s = b.weight_bytes(&self.embed) + b.weight_bytes(&self.pos);
        for l in &self.layers {
            for lin in [
                &l.q,
                &l.k,
                &l.v,
                &l.self_out,
                &l.cross_q,
                &l.cross_k,
                &l.cross_v,
                &l.cross_out,
                &l.mlp.fc1,
                &l.mlp.fc2,
            ] {
                s += b.weight_bytes(&lin.w);
            }
        }
        s
    }
}
