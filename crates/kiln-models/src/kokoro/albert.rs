//! PL-BERT: an ALBERT encoder (one transformer layer whose weights all 12 repeats share) over
//! the phoneme ids, then `bert_encoder`, the projection to the prosody predictor's width.

use kiln_backend::{Backend, WeightData};
use kiln_quant::GgmlType;

use super::blocks::{tensor, Ctx, Linear};
use super::params::Params;
use super::Config;
use crate::ModelError;

/// An embedding table (rows, dim) gathered by id.
pub struct Embedding<B: Backend> {
    table: B::Weight,
    pub rows: usize,
    pub dim: usize,
}

impl<B: Backend> Embedding<B> {
    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        rows: usize,
        dim: usize,
    ) -> Result<Self, ModelError> {
        let t = p.get(name, &[rows, dim])?;
        let bytes = super::blocks::f32_bytes(&t.data);
        let table = b
            .load_weight(WeightData {
                name,
                ty: GgmlType::F32,
                rows,
                cols: dim,
                bytes: &bytes,
            })
            .map_err(|source| ModelError::Backend {
                file: name.into(),
                source,
            })?;
        Ok(Embedding { table, rows, dim })
    }

    /// ids (n) -> (n, dim)
    pub fn forward(&self, b: &B, ids: &[u32]) -> Result<B::Tensor, ModelError> {
        let mut out = b.tensor(ids.len(), self.dim);
        b.embed(&self.table, ids, &mut out)
            .map_err(|source| ModelError::Backend {
                file: "embedding".into(),
                source,
            })?;
        Ok(out)
    }
}

struct Norm<B: Backend> {
    w: B::Tensor,
    b: B::Tensor,
}

impl<B: Backend> Norm<B> {
    fn load(b: &B, p: &Params, name: &str, c: usize) -> Result<Self, ModelError> {
        Ok(Norm {
            w: tensor(b, p, &format!("{name}.weight"), &[c])?,
            b: tensor(b, p, &format!("{name}.bias"), &[c])?,
        })
    }
}

pub struct Albert<B: Backend> {
    word: Embedding<B>,
    position: Embedding<B>,
    token_type: Embedding<B>,
    emb_norm: Norm<B>,
    mapping_in: Linear<B>,
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    dense: Linear<B>,
    attn_norm: Norm<B>,
    ffn: Linear<B>,
    ffn_output: Linear<B>,
    full_norm: Norm<B>,
    /// `bert_encoder`: hidden -> the predictor's width.
    proj: Linear<B>,
    layers: usize,
    heads: usize,
    hidden: usize,
}

const EPS: f32 = 1e-12;

impl<B: Backend> Albert<B> {
    pub fn load(b: &B, p: &Params, c: &Config) -> Result<Self, ModelError> {
        let e = 128; // ALBERT's embedding width
        let (h, ff) = (c.bert_hidden, c.bert_intermediate);
        let l = "bert.encoder.albert_layer_groups.0.albert_layers.0";
        let lin = |name: &str, i, o| Linear::load(b, p, name, i, o);
        Ok(Albert {
            word: Embedding::load(b, p, "bert.embeddings.word_embeddings.weight", c.n_token, e)?,
            position: Embedding::load(
                b,
                p,
                "bert.embeddings.position_embeddings.weight",
                c.bert_max_positions,
                e,
            )?,
            token_type: Embedding::load(
                b,
                p,
                "bert.embeddings.token_type_embeddings.weight",
                2,
                e,
            )?,
            emb_norm: Norm::load(b, p, "bert.embeddings.LayerNorm", e)?,
            mapping_in: lin("bert.encoder.embedding_hidden_mapping_in", e, h)?,
            query: lin(&format!("{l}.attention.query"), h, h)?,
            key: lin(&format!("{l}.attention.key"), h, h)?,
            value: lin(&format!("{l}.attention.value"), h, h)?,
            dense: lin(&format!("{l}.attention.dense"), h, h)?,
            attn_norm: Norm::load(b, p, &format!("{l}.attention.LayerNorm"), h)?,
            ffn: lin(&format!("{l}.ffn"), h, ff)?,
            ffn_output: lin(&format!("{l}.ffn_output"), ff, h)?,
            full_norm: Norm::load(b, p, &format!("{l}.full_layer_layer_norm"), h)?,
            proj: lin("bert_encoder", h, c.hidden_dim)?,
            layers: c.bert_layers,
            heads: c.bert_heads,
            hidden: h,
        })
    }

    /// ids (n) -> d_en (n, hidden_dim)
    pub fn forward(&self, cx: &Ctx<B>, ids: &[u32]) -> Result<B::Tensor, ModelError> {
        let (b, n, h) = (cx.b, ids.len(), self.hidden);
        if n > self.position.rows {
            return Err(ModelError::Config {
                file: "kokoro".into(),
                what: format!(
                    "{n} tokens exceed the {} positions of PL-BERT",
                    self.position.rows
                ),
            });
        }
        let mut x = self.word.forward(b, ids)?;
        let pos: Vec<u32> = (0..n as u32).collect();
        b.add(&mut x, &self.position.forward(b, &pos)?, n);
        b.add(&mut x, &self.token_type.forward(b, &vec![0; n])?, n);
        b.layer_norm_rows(
            &mut x,
            Some(&self.emb_norm.w),
            Some(&self.emb_norm.b),
            EPS,
            n,
            self.word.dim,
        );
        cx.put("bert.embeddings", &x, n, self.word.dim);
        let mut x = self.mapping_in.forward(cx, &x, n);
        for l in 0..self.layers {
            let (q, k, v) = (
                self.query.forward(cx, &x, n),
                self.key.forward(cx, &x, n),
                self.value.forward(cx, &x, n),
            );
            let mut ctx = b.tensor(n, h);
            b.self_attention(&q, &k, &v, self.heads, h / self.heads, n, &mut ctx);
            let mut a = self.dense.forward(cx, &ctx, n);
            b.add(&mut a, &x, n);
            b.layer_norm_rows(
                &mut a,
                Some(&self.attn_norm.w),
                Some(&self.attn_norm.b),
                EPS,
                n,
                h,
            );
            cx.put(&format!("bert.{l}.attention"), &a, n, h);
            let mut f = self.ffn.forward(cx, &a, n);
            b.gelu_tanh(&mut f, n * self.ffn.n_out);
            cx.put(&format!("bert.{l}.gelu"), &f, n, self.ffn.n_out);
            let mut y = self.ffn_output.forward(cx, &f, n);
            b.add(&mut y, &a, n);
            b.layer_norm_rows(
                &mut y,
                Some(&self.full_norm.w),
                Some(&self.full_norm.b),
                EPS,
                n,
                h,
            );
            cx.put(&format!("bert.{l}"), &y, n, h);
            x = y;
        }
        Ok(self.proj.forward(cx, &x, n))
    }
}
