//! The prosody predictor: a style-conditioned duration encoder (bidirectional LSTMs with
//! AdaLayerNorm), durations from an LSTM and a projection, then F0 and energy (N) curves from
//! a shared LSTM and AdaIN residual blocks over the aligned frames.

use kiln_backend::Backend;

use super::blocks::{AdainResBlk1d, BiLstm, Conv, ConvSpec, Ctx, Linear};
use super::params::Params;
use super::Config;
use crate::ModelError;

pub struct Prosody<B: Backend> {
    /// `predictor.text_encoder.lstms.{0,2,4}` and the AdaLayerNorm `fc` of `lstms.{1,3,5}`.
    enc_lstms: Vec<(BiLstm<B>, Linear<B>)>,
    lstm: BiLstm<B>,
    duration_proj: Linear<B>,
    shared: BiLstm<B>,
    f0: Vec<AdainResBlk1d<B>>,
    n: Vec<AdainResBlk1d<B>>,
    f0_proj: Conv<B>,
    n_proj: Conv<B>,
    d: usize,
    style: usize,
}

impl<B: Backend> Prosody<B> {
    pub fn load(b: &B, p: &Params, c: &Config) -> Result<Self, ModelError> {
        let (d, sty) = (c.hidden_dim, c.style_dim);
        let mut enc_lstms = Vec::new();
        for l in 0..c.n_layer {
            let pre = "predictor.text_encoder.lstms";
            enc_lstms.push((
                BiLstm::load(b, p, &format!("{pre}.{}", 2 * l), d + sty, d / 2)?,
                Linear::load(b, p, &format!("{pre}.{}.fc", 2 * l + 1), sty, 2 * d)?,
            ));
        }
        let blocks = |name: &str| -> Result<Vec<AdainResBlk1d<B>>, ModelError> {
            Ok(vec![
                AdainResBlk1d::load(b, p, &format!("predictor.{name}.0"), d, d, sty, false)?,
                AdainResBlk1d::load(b, p, &format!("predictor.{name}.1"), d, d / 2, sty, true)?,
                AdainResBlk1d::load(
                    b,
                    p,
                    &format!("predictor.{name}.2"),
                    d / 2,
                    d / 2,
                    sty,
                    false,
                )?,
            ])
        };
        Ok(Prosody {
            enc_lstms,
            lstm: BiLstm::load(b, p, "predictor.lstm", d + sty, d / 2)?,
            duration_proj: Linear::load(
                b,
                p,
                "predictor.duration_proj.linear_layer",
                d,
                c.max_dur,
            )?,
            shared: BiLstm::load(b, p, "predictor.shared", d + sty, d / 2)?,
            f0: blocks("F0")?,
            n: blocks("N")?,
            f0_proj: Conv::load(b, p, "predictor.F0_proj", d / 2, 1, ConvSpec::same(1, 1))?,
            n_proj: Conv::load(b, p, "predictor.N_proj", d / 2, 1, ConvSpec::same(1, 1))?,
            d,
            style: sty,
        })
    }

    /// The duration encoder: d_en (n, d), style rows `s_rows` (style, n) -> d (n, d + style).
    pub fn encode(
        &self,
        cx: &Ctx<B>,
        d_en: &B::Tensor,
        s: &B::Tensor,
        s_rows: &B::Tensor,
        n: usize,
    ) -> B::Tensor {
        let b = cx.b;
        let (d, sty) = (self.d, self.style);
        // xt (d + style, n) = [d_en^T; style]
        let mut xt = b.tensor(d + sty, n);
        let mut tmp = b.tensor(d, n);
        b.transpose(d_en, n, d, &mut tmp);
        b.copy_rows(&tmp, 0, d, &mut xt, 0);
        b.copy_rows(s_rows, 0, sty, &mut xt, d);
        let mut x = b.tensor(n, d + sty);
        for (lstm, fc) in &self.enc_lstms {
            b.transpose(&xt, d + sty, n, &mut x);
            let mut h = lstm.forward(cx, &x, n);
            let gb = fc.forward(cx, s, 1);
            b.ada_layer_norm(&mut h, &gb, n, d, 1e-5);
            b.transpose(&h, n, d, &mut tmp);
            b.copy_rows(&tmp, 0, d, &mut xt, 0);
        }
        b.transpose(&xt, d + sty, n, &mut x);
        x
    }

    /// Duration logits (n, max_dur) of the encoded text d (n, d + style).
    pub fn duration_logits(&self, cx: &Ctx<B>, d: &B::Tensor, n: usize) -> B::Tensor {
        let h = self.lstm.forward(cx, d, n);
        self.duration_proj.forward(cx, &h, n)
    }

    pub fn max_dur(&self) -> usize {
        self.duration_proj.n_out
    }

    /// F0 and N curves (1, 2 frames) each from the aligned features en (frames, d + style).
    pub fn f0_n(
        &self,
        cx: &Ctx<B>,
        en: &B::Tensor,
        s: &B::Tensor,
        frames: usize,
    ) -> (B::Tensor, B::Tensor) {
        let b = cx.b;
        let h = self.shared.forward(cx, en, frames);
        let mut x = b.tensor(self.d, frames);
        b.transpose(&h, frames, self.d, &mut x);
        let run = |blocks: &[AdainResBlk1d<B>], proj: &Conv<B>| {
            let mut y = blocks[0].forward(cx, &x, s, frames);
            let mut len = blocks[0].len_out(frames);
            for blk in &blocks[1..] {
                y = blk.forward(cx, &y, s, len);
                len = blk.len_out(len);
            }
            proj.forward(cx, &y, len)
        };
        (run(&self.f0, &self.f0_proj), run(&self.n, &self.n_proj))
    }
}
