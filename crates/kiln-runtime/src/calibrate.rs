//! Per-tensor quantization sensitivity, measured on a calibration text.
//!
//! The reference is the model as loaded (its stored weights). For each weight matrix and
//! each candidate type, that matrix alone is re-encoded in the type (dequantized from the
//! source, quantized, loaded through `TensorOps::load_weight`) and swapped into the one loaded
//! model; the calibration tokens are run again and the change of the output is the mean,
//! over every evaluated position, of KL(p_ref || p_quant) between the next-token
//! distributions (nats per token). The original matrix is put back before the next one.
//!
//! The tokens are cut into chunks of `ctx` (the last may be shorter), each evaluated from
//! an empty context with its first token replaced by BOS where the vocabulary adds one, as
//! `perplexity` does. Cost: one forward pass over the tokens per (tensor, candidate).

use std::path::Path;

use kiln_backend::Backend;
use kiln_formats::GgufFile;
use kiln_models::llm::{is_hf_dir, HfCheckpoint, Param};
use kiln_models::{Source, WeightMap};
use kiln_quant::{can_quantize, fallback_type, GgmlType};
use serde_json::{json, Value};

use crate::{Llm, RuntimeError};

/// How sensitivities are measured.
#[derive(Debug, Clone)]
pub struct CalibOptions {
    /// Tokens of the calibration text evaluated (its first `tokens`).
    pub tokens: usize,
    /// Positions per chunk, each chunk from an empty context.
    pub ctx: usize,
    /// Types to try; each tensor gets the ones its rows allow (`fallback_type`), deduplicated.
    pub candidates: Vec<GgmlType>,
}

/// One candidate type of one tensor and what it costs the output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub ty: GgmlType,
    /// Mean KL divergence from the reference's next-token distribution, nats per token,
    /// with only this tensor in `ty`.
    pub kl: f64,
}

/// A weight matrix and its candidates, cheapest first.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSensitivity {
    /// GGUF name (`blk.3.attn_v.weight`).
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub choices: Vec<Choice>,
}

impl TensorSensitivity {
    pub fn n_elements(&self) -> u64 {
        (self.rows * self.cols) as u64
    }

    /// Bits the matrix takes in `ty` (rows of whole blocks).
    pub fn bits(&self, ty: GgmlType) -> u64 {
        let row = ty.row_bytes(self.cols).unwrap_or(usize::MAX / 64) as u64;
        row * self.rows as u64 * 8
    }
}

/// Every weight matrix's sensitivities, in GGUF order.
#[derive(Debug, Clone, PartialEq)]
pub struct SensitivityTable {
    /// Tokens the measurement evaluated.
    pub tokens: usize,
    pub tensors: Vec<TensorSensitivity>,
}

/// The types tried for a matrix with rows of `cols` values: each candidate after llama.cpp's
/// fallback, deduplicated, ordered by size.
pub fn candidates_for(candidates: &[GgmlType], cols: usize) -> Vec<GgmlType> {
    let mut v: Vec<GgmlType> = Vec::new();
    for &t in candidates {
        let t = fallback_type(t, cols);
        if !v.contains(&t) {
            v.push(t);
        }
    }
    v.sort_by_key(|t| (t.row_bytes(cols).unwrap_or(usize::MAX), t.id()));
    v
}

/// Log-softmax of `row` into `out` (f64 arithmetic, f32 storage).
fn log_softmax(row: &[f32], out: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &v) in out.iter_mut().zip(row) {
        *o = (v as f64 - lse) as f32;
    }
}

/// KL(p || q) in nats, `ref_lp` the reference's log-probabilities, `logits` q's logits:
/// sum_i p_i (log p_i - q_i) + logsumexp(q).
pub fn kl_from_logits(ref_lp: &[f32], logits: &[f32]) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let (mut sum, mut cross) = (0f64, 0f64);
    for (&lp, &q) in ref_lp.iter().zip(logits) {
        sum += (q as f64 - max).exp();
        let lp = lp as f64;
        cross += lp.exp() * (lp - q as f64);
    }
    (cross + max + sum.ln()).max(0.0)
}

impl<B: Backend> Llm<B> {
    /// Chunks of the calibration tokens as the model sees them (BOS first where it adds one).
    fn calib_chunks(&self, tokens: &[u32], ctx: usize, add_bos: bool) -> Vec<Vec<u32>> {
        tokens
            .chunks(ctx)
            .map(|c| {
                let mut c = c.to_vec();
                if let (true, Some(bos)) = (add_bos, self.tokenizer.bos_id()) {
                    c[0] = bos;
                }
                c
            })
            .collect()
    }

    /// The next-token logits at every position of `chunks`, concatenated, as `f(row)` calls.
    fn run_chunks(
        &self,
        st: &mut kiln_models::llm::LlamaState<B>,
        chunks: &[Vec<u32>],
        f: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), RuntimeError> {
        let vocab = self.model.cfg.vocab_size;
        let mut pos = 0;
        for c in chunks {
            let logits = self.model.forward(&self.backend, st, c, 0, true)?;
            for (j, row) in logits.chunks_exact(vocab).enumerate() {
                f(pos + j, row);
            }
            pos += c.len();
        }
        Ok(())
    }

    /// Checks the options, cuts the calibration chunks and runs the reference over them:
    /// (chunks, reference log-probabilities per position, a state sized for one chunk).
    #[allow(clippy::type_complexity)]
    fn reference(
        &self,
        tokens: &[u32],
        add_bos: bool,
        opts: &CalibOptions,
    ) -> Result<(Vec<Vec<u32>>, Vec<f32>, kiln_models::llm::LlamaState<B>), RuntimeError> {
        let err = |what: String| RuntimeError::Path {
            path: self.path.clone(),
            what,
        };
        if opts.tokens < 2 || opts.ctx < 2 {
            return Err(err(format!(
                "calibration needs at least 2 tokens and a context of 2 (got {} tokens, context {})",
                opts.tokens, opts.ctx
            )));
        }
        if tokens.len() < opts.tokens {
            return Err(err(format!(
                "the calibration text is {} tokens; calibrating on {} needs a longer text (or fewer --calib-tokens)",
                tokens.len(),
                opts.tokens
            )));
        }
        if opts.candidates.is_empty() {
            return Err(err("no candidate types to calibrate".into()));
        }
        if let Some(t) = opts.candidates.iter().find(|t| !can_quantize(**t)) {
            return Err(err(format!("{} has no quantizer", t.name())));
        }
        let ctx = opts.ctx.min(opts.tokens);
        let chunks = self.calib_chunks(&tokens[..opts.tokens], ctx, add_bos);
        let vocab = self.model.cfg.vocab_size;
        let mut st = self.model.new_state(&self.backend, ctx, ctx);

        // The reference distributions.
        let mut ref_lp = vec![0f32; opts.tokens * vocab];
        self.run_chunks(&mut st, &chunks, &mut |i, row| {
            log_softmax(row, &mut ref_lp[i * vocab..(i + 1) * vocab])
        })?;

        Ok((chunks, ref_lp, st))
    }

    /// The measured KL of a whole mix on the calibration tokens: every matrix in its type of
    /// `types` (in `Llama::matrix_params` order) at once, against the model as loaded. What
    /// the sum of single-tensor KLs estimates.
    pub fn mix_kl(
        &mut self,
        tokens: &[u32],
        add_bos: bool,
        opts: &CalibOptions,
        types: &[GgmlType],
    ) -> Result<f64, RuntimeError> {
        let params = self.model.matrix_params();
        if types.len() != params.len() {
            return Err(RuntimeError::Path {
                path: self.path.clone(),
                what: format!(
                    "a mix of {} types for {} matrices",
                    types.len(),
                    params.len()
                ),
            });
        }
        let (chunks, ref_lp, mut st) = self.reference(tokens, add_bos, opts)?;
        let path = self.path.clone();
        let opened = Opened::open(&path)?;
        let src = opened.source();
        let swaps: Vec<(Param, usize, usize, GgmlType)> = params
            .iter()
            .zip(types)
            .map(|(&(p, r, c), &t)| (p, r, c, fallback_type(t, c)))
            .collect();
        self.kl_with(src, &mut st, &chunks, &ref_lp, &swaps)
    }

    /// Measures every weight matrix's sensitivity to each candidate type on `tokens` (the
    /// tokenized calibration text). `on_step(done, total, tensor)` reports progress. The
    /// model is left as it was loaded.
    pub fn sensitivities(
        &mut self,
        tokens: &[u32],
        add_bos: bool,
        opts: &CalibOptions,
        on_step: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<SensitivityTable, RuntimeError> {
        let (chunks, ref_lp, mut st) = self.reference(tokens, add_bos, opts)?;
        let path = self.path.clone();
        let opened = Opened::open(&path)?;
        let src = opened.source();

        let params = self.model.matrix_params();
        let plan: Vec<Vec<GgmlType>> = params
            .iter()
            .map(|&(_, _, cols)| candidates_for(&opts.candidates, cols))
            .collect();
        let total: usize = plan.iter().map(|c| c.len()).sum();
        let mut done = 0;
        let mut tensors = Vec::with_capacity(params.len());
        for (&(p, rows, cols), types) in params.iter().zip(&plan) {
            let name = p.gguf();
            let mut choices = Vec::with_capacity(types.len());
            for &ty in types {
                on_step(done, total, &name);
                let kl = self.kl_with(src, &mut st, &chunks, &ref_lp, &[(p, rows, cols, ty)])?;
                choices.push(Choice { ty, kl });
                done += 1;
            }
            tensors.push(TensorSensitivity {
                name,
                rows,
                cols,
                choices,
            });
        }
        on_step(done, total, "");
        Ok(SensitivityTable {
            tokens: opts.tokens,
            tensors,
        })
    }

    /// Mean KL over the calibration positions with each (p, rows, cols, ty) of `swaps`
    /// re-encoded as its type; the originals are put back.
    fn kl_with(
        &mut self,
        src: Source,
        st: &mut kiln_models::llm::LlamaState<B>,
        chunks: &[Vec<u32>],
        ref_lp: &[f32],
        swaps: &[(Param, usize, usize, GgmlType)],
    ) -> Result<f64, RuntimeError> {
        let mut originals = Vec::with_capacity(swaps.len());
        let mut res = Ok(());
        for &(p, rows, cols, ty) in swaps {
            let w = match WeightMap::from_source(src, Some(ty)).matrix(&self.backend, p, rows, cols)
            {
                Ok(w) => w,
                Err(e) => {
                    res = Err(e.into());
                    break;
                }
            };
            match self.model.weight_mut(p) {
                Some(slot) => originals.push((p, std::mem::replace(slot, w))),
                None => {
                    res = Err(RuntimeError::Path {
                        path: self.path.clone(),
                        what: format!("{} is not a weight matrix of the model", p.gguf()),
                    });
                    break;
                }
            }
        }
        let vocab = self.model.cfg.vocab_size;
        let mut sum = 0f64;
        let mut n = 0usize;
        if res.is_ok() {
            res = self.run_chunks(st, chunks, &mut |i, row| {
                sum += kl_from_logits(&ref_lp[i * vocab..(i + 1) * vocab], row);
                n += 1;
            });
        }
        // Put the originals back whatever happened.
        for (p, w) in originals {
            if let Some(slot) = self.model.weight_mut(p) {
                *slot = w;
            }
        }
        res?;
        Ok(sum / n.max(1) as f64)
    }
}

/// The model's source opened again (a GGUF file or a Hugging Face directory).
enum Opened {
    Gguf(GgufFile),
    Hf(HfCheckpoint),
}

impl Opened {
    fn open(path: &Path) -> Result<Self, RuntimeError> {
        Ok(if is_hf_dir(path) {
            Opened::Hf(HfCheckpoint::open(path)?)
        } else {
            Opened::Gguf(GgufFile::open(path)?)
        })
    }

    fn source(&self) -> Source<'_> {
        match self {
            Opened::Gguf(g) => Source::Gguf(g),
            Opened::Hf(ck) => Source::SafeTensors {
                set: &ck.tensors,
                dir: &ck.dir,
                mlx: ck.mlx.as_ref(),
            },
        }
    }
}

impl SensitivityTable {
    /// The table as JSON (`--table` files).
    pub fn to_json(&self) -> Value {
        let tensors: Vec<Value> = self
            .tensors
            .iter()
            .map(|t| {
                let choices: Vec<Value> = t
                    .choices
                    .iter()
                    .map(|c| json!({"type": c.ty.name(), "kl": c.kl}))
                    .collect();
                json!({"name": t.name, "rows": t.rows, "cols": t.cols, "choices": choices})
            })
            .collect();
        json!({"tokens": self.tokens, "tensors": tensors})
    }

    /// Reads `to_json`'s form back; `file` is named in errors.
    pub fn from_json(v: &Value, file: &Path) -> Result<Self, RuntimeError> {
        let err = |what: String| RuntimeError::Path {
            path: file.into(),
            what,
        };
        let usize_of = |v: &Value, k: &str| -> Result<usize, RuntimeError> {
            v[k].as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| err(format!("'{k}' is missing or not a count")))
        };
        let mut tensors = Vec::new();
        for t in v["tensors"]
            .as_array()
            .ok_or_else(|| err("no 'tensors' list".into()))?
        {
            let name = t["name"]
                .as_str()
                .ok_or_else(|| err("a tensor without a name".into()))?
                .to_string();
            let mut choices = Vec::new();
            for c in t["choices"].as_array().into_iter().flatten() {
                let ty_name = c["type"].as_str().unwrap_or("");
                let ty = ALL_TYPES
                    .into_iter()
                    .find(|t| t.name() == ty_name)
                    .ok_or_else(|| err(format!("{name}: unknown type '{ty_name}'")))?;
                let kl = c["kl"]
                    .as_f64()
                    .filter(|k| k.is_finite() && *k >= 0.0)
                    .ok_or_else(|| err(format!("{name}: a KL that is not a number >= 0")))?;
                choices.push(Choice { ty, kl });
            }
            if choices.is_empty() {
                return Err(err(format!("{name}: no choices")));
            }
            tensors.push(TensorSensitivity {
                rows: usize_of(t, "rows")?,
                cols: usize_of(t, "cols")?,
                name,
                choices,
            });
        }
        Ok(SensitivityTable {
            tokens: usize_of(v, "tokens")?,
            tensors,
        })
    }
}

const ALL_TYPES: [GgmlType; 15] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_and_positive_otherwise() {
        let logits = [1.0f32, 2.0, -0.5, 0.25];
        let mut lp = [0f32; 4];
        log_softmax(&logits, &mut lp);
        assert!(kl_from_logits(&lp, &logits) < 1e-7);
        // Shifting every logit changes nothing.
        let shifted: Vec<f32> = logits.iter().map(|v| v + 3.0).collect();
        assert!(kl_from_logits(&lp, &shifted) < 1e-6);
        let other = [2.0f32, 1.0, -0.5, 0.25];
        // p = softmax(logits), q = softmax(other), computed directly.
        let sm = |x: &[f32]| -> Vec<f64> {
            let s: f64 = x.iter().map(|&v| (v as f64).exp()).sum();
            x.iter().map(|&v| (v as f64).exp() / s).collect()
        };
        let (p, q) = (sm(&logits), sm(&other));
        let want: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        let got = kl_from_logits(&lp, &other);
        assert!(want > 0.01 && (got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn candidates_fall_back_and_dedup() {
        use GgmlType::*;
        let c = [Q4_0, Q4_K, Q5_0, Q6_K, Q8_0];
        assert_eq!(candidates_for(&c, 576), vec![Q4_0, Q5_0, Q8_0]);
        assert_eq!(candidates_for(&c, 1536), vec![Q4_0, Q4_K, Q5_0, Q6_K, Q8_0]);
    }
}
