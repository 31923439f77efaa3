//! The audio encoder: two convolutions with GELU (the second halves the frame rate), fixed
//! sinusoidal positions, pre-norm transformer layers, a final LayerNorm.

use kiln_backend::{Backend, DenseAttnShape};

use super::{sinusoids, Weights, WhisperConfig, LN_EPS};
use crate::ModelError;

/// LayerNorm parameters.
pub struct Norm<B: Backend> {
    pub gamma: B::Tensor, // {prefix}.weight (d)
    pub beta: B::Tensor,  // {prefix}.bias   (d)
}

impl<B: Backend> Norm<B> {
    pub fn load(b: &B, w: &Weights, prefix: &str, d: usize) -> Result<Self, ModelError> {
        Ok(Norm {
            gamma: w.vector(b, &format!("{prefix}.weight"), d)?,
            beta: w.vector(b, &format!("{prefix}.bias"), d)?,
        })
    }

    pub fn apply(&self, b: &B, x: &B::Tensor, n: usize, out: &mut B::Tensor) {
        b.layer_norm(x, &self.gamma, &self.beta, LN_EPS, n, out)
    }
}

/// A linear layer with bias.
pub struct Linear<B: Backend> {
    pub w: B::Weight,
    pub b: B::Tensor,
}

impl<B: Backend> Linear<B> {
    /// `{prefix}.weight` (rows, cols) and `{prefix}.bias` (rows).
    pub fn load(
        b: &B,
        w: &Weights,
        prefix: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        Ok(Linear {
            w: w.matrix(
                b,
                &format!("{prefix}.weight"),
                &[rows as u64, cols as u64],
                true,
            )?,
            b: w.vector(b, &format!("{prefix}.bias"), rows)?,
        })
    }

    /// Attention keys: OpenAI's Whisper has no bias there (zeros where a format stores one).
    pub fn load_key(b: &B, w: &Weights, prefix: &str, d: usize) -> Result<Self, ModelError> {
        Ok(Linear {
            w: w.matrix(b, &format!("{prefix}.weight"), &[d as u64, d as u64], true)?,
            b: w.vector_or_zeros(b, &format!("{prefix}.bias"), d)?,
        })
    }

    /// out = W x + b
    pub fn forward(&self, b: &B, x: &B::Tensor, n: usize, out: &mut B::Tensor) {
        b.matmul(&self.w, x, Some(&self.b), n, out)
    }
}

/// Self-attention (query, key, value, out).
pub struct SelfAttention<B: Backend> {
    pub q: Linear<B>,
    pub k: Linear<B>,
    pub v: Linear<B>,
    pub out: Linear<B>,
}

impl<B: Backend> SelfAttention<B> {
    /// `{p}.query`, `{p}.key`, `{p}.value`, `{p}.out`, each (d, d).
    pub fn load(b: &B, w: &Weights, p: &str, d: usize) -> Result<Self, ModelError> {
        Ok(SelfAttention {
            q: Linear::load(b, w, &format!("{p}.query"), d, d)?,
            k: Linear::load_key(b, w, &format!("{p}.key"), d)?,
            v: Linear::load(b, w, &format!("{p}.value"), d, d)?,
            out: Linear::load(b, w, &format!("{p}.out"), d, d)?,
        })
    }
}

pub struct Mlp<B: Backend> {
    pub fc1: Linear<B>, // mlp.0 (ffn, d)
    pub fc2: Linear<B>, // mlp.2 (d, ffn)
}

impl<B: Backend> Mlp<B> {
    pub fn load(b: &B, w: &Weights, p: &str, d: usize, ffn: usize) -> Result<Self, ModelError> {
        Ok(Mlp {
            fc1: Linear::load(b, w, &format!("{p}.mlp.0"), ffn, d)?,
            fc2: Linear::load(b, w, &format!("{p}.mlp.2"), d, ffn)?,
        })
    }

    /// out = fc2(gelu(fc1(x)))
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        n: usize,
        hidden: &mut B::Tensor,
        out: &mut B::Tensor,
    ) {
        self.fc1.forward(b, x, n, hidden);
        b.gelu(hidden, n);
        self.fc2.forward(b, hidden, n, out);
    }
}

pub struct EncoderLayer<B: Backend> {
    pub attn_ln: Norm<B>, // encoder.blocks.i.attn_ln
    pub attn: SelfAttention<B>,
    pub mlp_ln: Norm<B>, // encoder.blocks.i.mlp_ln
    pub mlp: Mlp<B>,
}

pub struct Encoder<B: Backend> {
    pub conv1: B::Weight, // encoder.conv1.weight (d, n_mels, 3) as (d, n_mels*3)
    pub conv1_b: B::Tensor,
    pub conv2: B::Weight, // encoder.conv2.weight (d, d, 3) as (d, d*3), stride 2
    pub conv2_b: B::Tensor,
    pub pos: B::Tensor, // encoder.positional_embedding (n_audio_ctx, d)
    pub layers: Vec<EncoderLayer<B>>,
    pub ln_post: Norm<B>, // encoder.ln_post
}

/// Scratch of one window's encoding, allocated once.
pub struct EncoderState<B: Backend> {
    mel_t: Vec<f32>,
    input: B::Tensor, // (n_frames, n_mels)
    conv: B::Tensor,  // (n_frames, d)
    x: B::Tensor,     // (n_ctx, d)
    h: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: B::Tensor,
    hidden: B::Tensor, // (n_ctx, ffn)
    out: B::Tensor,    // (n_ctx, d): the encoder's output
}

impl<B: Backend> EncoderState<B> {
    pub fn new(b: &B, c: &WhisperConfig) -> Self {
        let (n, d) = (c.n_audio_ctx, c.d_model);
        EncoderState {
            mel_t: vec![0.0; c.n_frames() * c.n_mels],
            input: b.tensor(c.n_frames(), c.n_mels),
            conv: b.tensor(c.n_frames(), d),
            x: b.tensor(n, d),
            h: b.tensor(n, d),
            q: b.tensor(n, d),
            k: b.tensor(n, d),
            v: b.tensor(n, d),
            attn: b.tensor(n, d),
            hidden: b.tensor(n, c.ffn_dim),
            out: b.tensor(n, d),
        }
    }

    /// The last window's encoding (n_audio_ctx, d).
    pub fn output(&self) -> &B::Tensor {
        &self.out
    }
}

impl<B: Backend> Encoder<B> {
    pub fn load(b: &B, w: &Weights, c: &WhisperConfig) -> Result<Self, ModelError> {
        let (d, m) = (c.d_model, c.n_mels);
        let dd = d as u64;
        let conv = |name: &str, cin: usize| {
            w.matrix(
                b,
                &format!("encoder.{name}.weight"),
                &[dd, cin as u64, 3],
                true,
            )
        };
        let pos_name = "encoder.positional_embedding";
        let pos = if w.has(pos_name) {
            w.floats(pos_name, &[c.n_audio_ctx as u64, dd])?
        } else {
            sinusoids(c.n_audio_ctx, d)
        };
        let mut layers = Vec::with_capacity(c.n_audio_layers);
        for i in 0..c.n_audio_layers {
            let p = format!("encoder.blocks.{i}");
            layers.push(EncoderLayer {
                attn_ln: Norm::load(b, w, &format!("{p}.attn_ln"), d)?,
                attn: SelfAttention::load(b, w, &format!("{p}.attn"), d)?,
                mlp_ln: Norm::load(b, w, &format!("{p}.mlp_ln"), d)?,
                mlp: Mlp::load(b, w, &p, d, c.ffn_dim)?,
            });
        }
        Ok(Encoder {
            conv1: conv("conv1", m)?,
            conv1_b: w.vector(b, "encoder.conv1.bias", d)?,
            conv2: conv("conv2", d)?,
            conv2_b: w.vector(b, "encoder.conv2.bias", d)?,
            pos: b.tensor_from(c.n_audio_ctx, d, &pos),
            layers,
            ln_post: Norm::load(b, w, "encoder.ln_post", d)?,
        })
    }

    /// mel (n_mels x n_frames, row-major) -> st.output() (n_audio_ctx, d).
    pub fn forward(
        &self,
        b: &B,
        c: &WhisperConfig,
        mel: &[f32],
        st: &mut EncoderState<B>,
    ) -> Result<(), ModelError> {
        let (frames, m, n) = (c.n_frames(), c.n_mels, c.n_audio_ctx);
        if mel.len() != m * frames {
            return Err(ModelError::Input(format!(
                "encoder input has {} values, expected {m} mel bins x {frames} frames",
                mel.len()
            )));
        }
        // Time-major for the convolutions: (frames, n_mels).
        for (bin, row) in mel.chunks_exact(frames).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                st.mel_t[t * m + bin] = v;
            }
        }
        st.input = b.tensor_from(frames, m, &st.mel_t);
        b.conv1d(
            &self.conv1,
            Some(&self.conv1_b),
            &st.input,
            frames,
            3,
            1,
            1,
            &mut st.conv,
        );
        b.gelu(&mut st.conv, frames);
        let t2 = b.conv1d(
            &self.conv2,
            Some(&self.conv2_b),
            &st.conv,
            frames,
            3,
            2,
            1,
            &mut st.x,
        );
        debug_assert_eq!(t2, n);
        b.gelu(&mut st.x, n);
        b.add(&mut st.x, &self.pos, n);

        let heads = c.n_audio_heads;
        let shape = DenseAttnShape {
            heads,
            head_dim: c.d_model / heads,
            n_q: n,
            n_kv: n,
            causal: false,
        };
        for l in &self.layers {
            // x += Wo · attn(ln(x))
            l.attn_ln.apply(b, &st.x, n, &mut st.h);
            let a = &l.attn;
            b.matmul3(
                [&a.q.w, &a.k.w, &a.v.w],
                [Some(&a.q.b), Some(&a.k.b), Some(&a.v.b)],
                &st.h,
                n,
                [&mut st.q, &mut st.k, &mut st.v],
            );
            b.attention_dense(&st.q, &st.k, &st.v, shape, &mut st.attn);
            a.out.forward(b, &st.attn, n, &mut st.h);
            b.add(&mut st.x, &st.h, n);
            // x += mlp(ln(x))
            l.mlp_ln.apply(b, &st.x, n, &mut st.h);
            l.mlp.forward(b, &st.h, n, &mut st.hidden, &mut st.q);
            b.add(&mut st.x, &st.q, n);
        }
        self.ln_post.apply(b, &st.x, n, &mut st.out);
        Ok(())
    }

    pub fn weight_bytes(&self, b: &B) -> usize {
        let mut s = b.weight_bytes(&self.conv1) + b.weight_bytes(&self.conv2);
        for l in &self.layers {
            for w in [
                &l.attn.q.w,
                &l.attn.k.w,
                &l.attn.v.w,
                &l.attn.out.w,
                &l.mlp.fc1.w,
                &l.mlp.fc2.w,
            ] {
                s += b.weight_bytes(w);
            }
        }
        s
    }
}
