//! Several sequences in one forward pass (continuous batching).
//!
//! The rows of every sequence are stacked, so each weight matrix is read once per step for
//! all of them; only RoPE and the KV store run per sequence, on that sequence's rows at its
//! own positions; attention is one op over every sequence, each against its own cache. Every op is row-wise, so a sequence's logits
//! are the ones [`Llama::forward`] gives it alone.

use kiln_backend::{AttnShape, Backend};

use super::{Llama, LlamaState};
use crate::ModelError;

/// Scratch for a batched step, sized once: up to `max_rows` stacked tokens from up to
/// `max_seqs` sequences.
pub struct LlamaBatch<B: Backend> {
    pub max_rows: usize,
    pub max_seqs: usize,
    x: B::Tensor,
    h: B::Tensor,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    attn: B::Tensor,
    gate: B::Tensor,
    // One sequence's rows, gathered for RoPE and the KV store.
    sq: B::Tensor,
    sk: B::Tensor,
    sv: B::Tensor,
    // The last row of each sequence.
    last: B::Tensor,
    last_h: B::Tensor,
    logits: B::Tensor,
    logits_host: Vec<f32>,
    ids: Vec<u32>,
}

/// One sequence's part of a batched step: `tokens` at positions `pos0..` of its own cache.
pub struct SeqChunk<'a, B: Backend> {
    pub state: &'a mut LlamaState<B>,
    pub tokens: &'a [u32],
    pub pos0: usize,
}

impl<B: Backend> Llama<B> {
    pub fn new_batch(&self, b: &B, max_rows: usize, max_seqs: usize) -> LlamaBatch<B> {
        let c = &self.cfg;
        let (r, s) = (max_rows.max(1), max_seqs.max(1));
        LlamaBatch {
            max_rows: r,
            max_seqs: s,
            x: b.tensor(r, c.dim),
            h: b.tensor(r, c.dim),
            q: b.tensor(r, c.q_dim()),
            k: b.tensor(r, c.kv_dim()),
            v: b.tensor(r, c.kv_dim()),
            attn: b.tensor(r, c.q_dim()),
            gate: b.tensor(r, c.ffn_dim),
            sq: b.tensor(r, c.q_dim()),
            sk: b.tensor(r, c.kv_dim()),
            sv: b.tensor(r, c.kv_dim()),
            last: b.tensor(s, c.dim),
            last_h: b.tensor(s, c.dim),
            logits: b.tensor(s, c.vocab_size),
            logits_host: vec![0.0; s * c.vocab_size],
            ids: Vec::with_capacity(r),
        }
    }

    /// One forward over the stacked tokens of `seqs` (each filling its own KV cache).
    /// Returns the logits of each sequence's last token, `seqs.len() x vocab`, in order.
    /// The caller keeps `Σ tokens <= max_rows`, `seqs.len() <= max_seqs`, every chunk
    /// non-empty and inside its context.
    pub fn forward_batch<'s>(
        &self,
        b: &B,
        bt: &'s mut LlamaBatch<B>,
        seqs: &mut [SeqChunk<'_, B>],
    ) -> Result<&'s [f32], ModelError> {
        let c = &self.cfg;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        assert!(
            n <= bt.max_rows && seqs.len() <= bt.max_seqs,
            "batch too big"
        );
        assert!(
            seqs.iter()
                .all(|s| !s.tokens.is_empty() && s.pos0 + s.tokens.len() <= s.state.n_ctx),
            "caller checks every chunk"
        );
        if seqs.is_empty() {
            return Ok(&bt.logits_host[..0]);
        }
        bt.ids.clear();
        bt.ids
            .extend(seqs.iter().flat_map(|s| s.tokens.iter().copied()));
        b.embed(&self.embed, &bt.ids, &mut bt.x)
            .map_err(|source| ModelError::Backend {
                file: Default::default(),
                source,
            })?;
        for (il, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            b.rms_norm(&bt.x, &layer.attn_norm, c.norm_eps, n, &mut bt.h);
            b.matmul3(
                [&a.q, &a.k, &a.v],
                [a.q_bias.as_ref(), a.k_bias.as_ref(), a.v_bias.as_ref()],
                &bt.h,
                n,
                [&mut bt.q, &mut bt.k, &mut bt.v],
            );
            if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
                b.rms_norm_heads(&mut bt.q, qn, c.norm_eps, n);
                b.rms_norm_heads(&mut bt.k, kn, c.norm_eps, n);
            }
            // RoPE and the KV store per sequence (its own positions and cache), on its rows
            // gathered and put back; then one attention over every sequence.
            let mut r0 = 0;
            for s in seqs.iter_mut() {
                let (ns, pos0) = (s.tokens.len(), s.pos0);
                b.copy_rows(&bt.q, r0, ns, &mut bt.sq, 0);
                b.copy_rows(&bt.k, r0, ns, &mut bt.sk, 0);
                b.copy_rows(&bt.v, r0, ns, &mut bt.sv, 0);
                b.rope(&mut bt.sq, &c.rope, c.n_heads, pos0, ns);
                b.rope(&mut bt.sk, &c.rope, c.n_kv_heads, pos0, ns);
                b.kv_store(&mut s.state.kv, il, &bt.sk, &bt.sv, pos0, ns);
                b.copy_rows(&bt.sq, 0, ns, &mut bt.q, r0);
                r0 += ns;
            }
            let shapes = seqs.iter().map(|s| {
                let shape = AttnShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    pos0: s.pos0,
                    n_tokens: s.tokens.len(),
                };
                (&s.state.kv, shape)
            });
            b.attention_batch(&bt.q, shapes, il, &mut bt.attn);
            b.matmul_add(&a.o, &bt.attn, n, &mut bt.x); // x += Wo attn

            b.rms_norm(&bt.x, &layer.ffn_norm, c.norm_eps, n, &mut bt.h);
            b.gate_up_silu(&layer.mlp.gate, &layer.mlp.up, &bt.h, n, &mut bt.gate);
            b.matmul_add(&layer.mlp.down, &bt.gate, n, &mut bt.x); // x += Wdown mlp
        }
        // Only each sequence's last token needs logits.
        let mut r = 0;
        for (j, s) in seqs.iter().enumerate() {
            r += s.tokens.len();
            b.copy_rows(&bt.x, r - 1, 1, &mut bt.last, j);
        }
        let m = seqs.len();
        let output = self.output.as_ref().unwrap_or(&self.embed);
        b.rms_norm(&bt.last, &self.norm, c.norm_eps, m, &mut bt.last_h);
        b.matmul(output, &bt.last_h, None, m, &mut bt.logits);
        let vocab = c.vocab_size;
        b.read(&bt.logits, m, &mut bt.logits_host[..m * vocab]);
        Ok(&bt.logits_host[..m * vocab])
    }
}
