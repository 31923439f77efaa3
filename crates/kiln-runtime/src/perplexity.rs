//! Perplexity over a text, computed as llama.cpp's `llama-perplexity` does: the tokens are cut
//! into chunks of `n_ctx` (the tail that does not fill one is dropped), each chunk is evaluated
//! from an empty context (its first token replaced by BOS when the vocabulary adds one), and
//! only the second half of each chunk is scored: the logits at positions n_ctx/2 .. n_ctx-2
//! predict the next token. PPL = exp(mean negative log-likelihood).

use kiln_backend::Backend;

use crate::{Llm, RuntimeError};

#[derive(Debug, Clone, PartialEq)]
pub struct Perplexity {
    /// Running PPL after each chunk (what llama-perplexity prints as `[i]x.xxxx`).
    pub per_chunk: Vec<f64>,
    pub ppl: f64,
    /// llama-perplexity's "+/-": the standard error of the mean NLL, times PPL.
    pub ppl_err: f64,
    /// Tokens scored.
    pub scored: usize,
}

/// `-log softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

impl<B: Backend> Llm<B> {
    /// Perplexity of `tokens` (already tokenized, BOS included where the vocabulary adds
    /// one: `add_bos` then replaces each chunk's first token), at most `max_chunks` chunks
    /// (0: all). `on_chunk(i, running_ppl)` is called after each chunk.
    pub fn perplexity(
        &self,
        tokens: &[u32],
        n_ctx: usize,
        add_bos: bool,
        max_chunks: usize,
        on_chunk: &mut dyn FnMut(usize, f64),
    ) -> Result<Perplexity, RuntimeError> {
        if n_ctx < 4 {
            return Err(RuntimeError::Path {
                path: self.path.clone(),
                what: format!("a context of {n_ctx} tokens is too small to score (at least 4)"),
            });
        }
        if tokens.len() < 2 * n_ctx {
            return Err(RuntimeError::Path {
                path: self.path.clone(),
                what: format!(
                    "the text is {} tokens; perplexity with a context of {n_ctx} needs at least {}",
                    tokens.len(),
                    2 * n_ctx
                ),
            });
        }
        let mut n_chunks = tokens.len() / n_ctx;
        if max_chunks > 0 {
            n_chunks = n_chunks.min(max_chunks);
        }
        let vocab = self.model.cfg.vocab_size;
        let first = n_ctx / 2;
        // Scored positions run in batches of up to 256 with every position's logits.
        let batch = (n_ctx - first).min(256);
        let mut session = self.session(n_ctx, batch);
        let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
        let mut per_chunk = Vec::with_capacity(n_chunks);
        let mut chunk = vec![0u32; n_ctx];
        for c in 0..n_chunks {
            let start = c * n_ctx;
            chunk.copy_from_slice(&tokens[start..start + n_ctx]);
            if add_bos {
                if let Some(bos) = self.tokenizer.bos_id() {
                    chunk[0] = bos;
                }
            }
            session.reset();
            // Only the scored half needs logits.
            session.eval(&chunk[..first], false)?;
            let mut j0 = first;
            while j0 < n_ctx {
                let j1 = (j0 + batch).min(n_ctx);
                let logits = session.eval(&chunk[j0..j1], true)?;
                for j in j0..j1.min(n_ctx - 1) {
                    let row = &logits[(j - j0) * vocab..(j - j0 + 1) * vocab];
                    let v = nll(row, tokens[start + j + 1]);
                    sum += v;
                    sum2 += v * v;
                    count += 1;
                }
                j0 = j1;
            }
            let running = (sum / count as f64).exp();
            per_chunk.push(running);
            on_chunk(c, running);
        }
        let mean = sum / count as f64;
        let var = sum2 / count as f64 - mean * mean;
        let ppl = mean.exp();
        let ppl_err = if var > 0.0 && count > 1 {
            (var / (count - 1) as f64).sqrt() * ppl
        } else {
            0.0
        };
        Ok(Perplexity {
            per_chunk,
            ppl,
            ppl_err,
            scored: count,
        })
    }
}
