//! StyleTTS2's text encoder: phoneme embedding, three (conv k5, layer norm, LeakyReLU 0.2)
//! blocks, a bidirectional LSTM. Output t_en (channels, n).

use kiln_backend::Backend;

use super::albert::Embedding;
use super::blocks::{tensor, BiLstm, Conv, ConvSpec, Ctx};
use super::params::Params;
use super::Config;
use crate::ModelError;

pub struct TextEncoder<B: Backend> {
    embedding: Embedding<B>,
    cnn: Vec<(Conv<B>, B::Tensor, B::Tensor)>,
    lstm: BiLstm<B>,
    c: usize,
}

impl<B: Backend> TextEncoder<B> {
    pub fn load(b: &B, p: &Params, cfg: &Config) -> Result<Self, ModelError> {
        let c = cfg.hidden_dim;
        let k = cfg.text_encoder_kernel_size;
        let mut cnn = Vec::new();
        for i in 0..cfg.n_layer {
            cnn.push((
                Conv::load(
                    b,
                    p,
                    &format!("text_encoder.cnn.{i}.0"),
                    c,
                    c,
                    ConvSpec::same(k, 1),
                )?,
                tensor(b, p, &format!("text_encoder.cnn.{i}.1.gamma"), &[c])?,
                tensor(b, p, &format!("text_encoder.cnn.{i}.1.beta"), &[c])?,
            ));
        }
        Ok(TextEncoder {
            embedding: Embedding::load(b, p, "text_encoder.embedding.weight", cfg.n_token, c)?,
            cnn,
            lstm: BiLstm::load(b, p, "text_encoder.lstm", c, c / 2)?,
            c,
        })
    }

    /// ids (n) -> (c, n)
    pub fn forward(&self, cx: &Ctx<B>, ids: &[u32]) -> Result<B::Tensor, ModelError> {
        let (b, n, c) = (cx.b, ids.len(), self.c);
        let e = self.embedding.forward(b, ids)?;
        let mut x = b.tensor(c, n);
        b.transpose(&e, n, c, &mut x);
        let mut t = b.tensor(n, c);
        for (conv, gamma, beta) in &self.cnn {
            let y = conv.forward(cx, &x, n);
            // Layer norm over channels: per time step in (n, c).
            b.transpose(&y, c, n, &mut t);
            b.layer_norm_rows(&mut t, Some(gamma), Some(beta), 1e-5, n, c);
            b.leaky_relu(&mut t, 0.2, n * c);
            b.transpose(&t, n, c, &mut x);
        }
        b.transpose(&x, c, n, &mut t);
        let h = self.lstm.forward(cx, &t, n);
        let mut out = b.tensor(c, n);
        b.transpose(&h, n, c, &mut out);
        Ok(out)
    }
}
