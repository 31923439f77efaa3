//! The text decoder: token embeddings plus learned positions, pre-norm layers of causal
//! self-attention (KV cache), cross-attention over the encoder output, and a GELU MLP; the
//! output projection is the embedding table (tied).

use kiln_backend::{AttnShape, Backend, DenseAttnShape};

use super::encoder::{Linear, Mlp, Norm};
use super::{Ct2Weights, WhisperConfig};
use crate::ModelError;

pub struct DecoderLayer<B: Backend> {
    pub self_ln: Norm<B>,     // self_attention/layer_norm
    pub q: Linear<B>,         // self_attention/linear_0 rows 0..d (fused qkv)
    pub k: Linear<B>,         //   rows d..2d
    pub v: Linear<B>,         //   rows 2d..3d
    pub self_out: Linear<B>,  // self_attention/linear_1
    pub cross_ln: Norm<B>,    // attention/layer_norm
    pub cross_q: Linear<B>,   // attention/linear_0
    pub cross_k: Linear<B>,   // attention/linear_1 rows 0..d (fused kv)
    pub cross_v: Linear<B>,   //   rows d..2d
    pub cross_out: Linear<B>, // attention/linear_2
    pub mlp_ln: Norm<B>,      // ffn/layer_norm
    pub mlp: Mlp<B>,
}

pub struct Decoder<B: Backend> {
    pub embed: B::Weight, // embeddings/weight (n_vocab, d); also the output projection
    pub pos: B::Weight,   // position_encodings/encodings (n_text_ctx, d)
    pub layers: Vec<DecoderLayer<B>>,
    pub ln: Norm<B>, // decoder/layer_norm
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
    ids: Vec<u32>,
    x: B::Tensor,
    h: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: B::Tensor,
    hidden: B::Tensor,
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
            ids: Vec::with_capacity(n),
            x: b.tensor(n, d),
            h: b.tensor(n, d),
            q: b.tensor(n, d),
            k: b.tensor(n, d),
            v: b.tensor(n, d),
            attn: b.tensor(n, d),
            hidden: b.tensor(n, c.ffn_dim),
            last: b.tensor(1, d),
            logits: b.tensor(1, c.n_vocab),
            logits_host: vec![0.0; c.n_vocab],
        }
    }
}

impl<B: Backend> Decoder<B> {
    pub fn load(b: &B, w: &Ct2Weights, c: &WhisperConfig) -> Result<Self, ModelError> {
        let (d, ffn) = (c.d_model, c.ffn_dim);
        let mut layers = Vec::with_capacity(c.n_text_layers);
        for i in 0..c.n_text_layers {
            let p = format!("decoder/layer_{i}");
            let sa = format!("{p}/self_attention");
            let ca = format!("{p}/attention");
            let qkv = format!("{sa}/linear_0");
            let kv = format!("{ca}/linear_1");
            // Cross-attention keys/values are products over all audio positions, once per
            // window (arithmetic-bound, like the encoder): they keep the file's format.
            w.set_quantize(false);
            let cross_k = Linear::load_part(b, w, &kv, 2 * d, d, (0, d))?;
            let cross_v = Linear::load_part(b, w, &kv, 2 * d, d, (d, 2 * d))?;
            w.set_quantize(true);
            layers.push(DecoderLayer {
                self_ln: Norm::load(b, w, &format!("{sa}/layer_norm"), d)?,
                q: Linear::load_part(b, w, &qkv, 3 * d, d, (0, d))?,
                k: Linear::load_part(b, w, &qkv, 3 * d, d, (d, 2 * d))?,
                v: Linear::load_part(b, w, &qkv, 3 * d, d, (2 * d, 3 * d))?,
                self_out: Linear::load(b, w, &format!("{sa}/linear_1"), d, d)?,
                cross_ln: Norm::load(b, w, &format!("{ca}/layer_norm"), d)?,
                cross_q: Linear::load(b, w, &format!("{ca}/linear_0"), d, d)?,
                cross_k,
                cross_v,
                cross_out: Linear::load(b, w, &format!("{ca}/linear_2"), d, d)?,
                mlp_ln: Norm::load(b, w, &format!("{p}/ffn/layer_norm"), d)?,
                mlp: Mlp::load(b, w, &p, d, ffn)?,
            });
        }
        // The projection is tied: `decoder/projection/weight` is an alias of the embeddings.
        let embed = w.matrix(b, "decoder/embeddings/weight", c.n_vocab, d, true)?;
        if let Some(p) = w.file.var("decoder/projection/weight") {
            if p.name != "decoder/embeddings/weight" {
                return Err(ModelError::Config {
                    file: w.file.path().into(),
                    what: "decoder/projection/weight is not tied to the embeddings".into(),
                });
            }
        }
        Ok(Decoder {
            embed,
            pos: w.matrix(
                b,
                "decoder/position_encodings/encodings",
                c.n_text_ctx,
                d,
                false,
            )?,
            layers,
            ln: Norm::load(b, w, "decoder/layer_norm", d)?,
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
        let (d, heads) = (c.d_model, c.n_text_heads);
        let hd = d / heads;
        let emb_err = |source| ModelError::Input(format!("decoder input: {source}"));
        // x = embed(tokens) + pos[pos0..pos0+n]
        b.embed(&self.embed, tokens, &mut st.x).map_err(emb_err)?;
        st.ids.clear();
        st.ids.extend((pos0..pos0 + n).map(|p| p as u32));
        b.embed(&self.pos, &st.ids, &mut st.h).map_err(emb_err)?;
        b.add(&mut st.x, &st.h, n);
        let self_shape = AttnShape {
            n_heads: heads,
            n_kv_heads: heads,
            head_dim: hd,
            pos0,
            n_tokens: n,
        };
        let cross_shape = DenseAttnShape {
            heads,
            head_dim: hd,
            n_q: n,
            n_kv: c.n_audio_ctx,
            causal: false,
        };
        for (i, l) in self.layers.iter().enumerate() {
            // x += Wo · self_attn(ln(x))
            l.self_ln.apply(b, &st.x, n, &mut st.h);
            b.matmul3(
                [&l.q.w, &l.k.w, &l.v.w],
                [Some(&l.q.b), Some(&l.k.b), Some(&l.v.b)],
                &st.h,
                n,
                [&mut st.q, &mut st.k, &mut st.v],
            );
            b.kv_store(&mut st.kv, i, &st.k, &st.v, pos0, n);
            b.attention(&st.q, &st.kv, i, self_shape, &mut st.attn);
            l.self_out.forward(b, &st.attn, n, &mut st.h);
            b.add(&mut st.x, &st.h, n);
            // x += Wo · cross_attn(ln(x), audio)
            l.cross_ln.apply(b, &st.x, n, &mut st.h);
            l.cross_q.forward(b, &st.h, n, &mut st.q);
            b.attention_dense(&st.q, &cross.k[i], &cross.v[i], cross_shape, &mut st.attn);
            l.cross_out.forward(b, &st.attn, n, &mut st.h);
            b.add(&mut st.x, &st.h, n);
            // x += mlp(ln(x))
            l.mlp_ln.apply(b, &st.x, n, &mut st.h);
            l.mlp.forward(b, &st.h, n, &mut st.hidden, &mut st.q);
            b.add(&mut st.x, &st.q, n);
        }
        // logits = embed · ln(x_last)
        b.copy_row(&st.x, n - 1, &mut st.h);
        self.ln.apply(b, &st.h, 1, &mut st.last);
        b.matmul(&self.embed, &st.last, None, 1, &mut st.logits);
        b.read(&st.logits, 1, &mut st.logits_host);
        Ok(&st.logits_host)
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
