//! Speculative decoding. Decoding one token reads every weight once, so on a CPU it is bound
//! by memory bandwidth; checking k guessed tokens in one forward pass reads the weights once
//! for all of them. A cheap [`Drafter`] guesses the next tokens, the model scores
//! [last token, guesses...] in one pass, keeps the guesses while they agree with what it
//! samples itself, and adds its own token at the first disagreement (or after the last
//! guess), so every pass yields at least one token.
//!
//! At temperature 0 the tokens are exactly those of plain greedy decoding. Above it each
//! guess is kept with its probability under the sampler ([`Sampler::sample_draft`]), which
//! keeps the sampler's distribution (the drafters here are deterministic), though not the
//! tokens a given seed gives without speculation.

use std::time::Instant;

use kiln_backend::Backend;

use crate::llm::{
    FinishReason, GenerateOptions, GenerationStats, Llm, LlmSession, RuntimeError, TextOut,
};
use crate::sampler::Sampler;

/// Guesses the tokens that follow a context.
pub trait Drafter {
    /// Called with the prompt while the model reads it (counted as prefill), so a drafter
    /// can do the same.
    fn begin(&mut self, _prompt: &[u32]) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Appends to `out` up to `max` tokens guessed to follow `context` (every token so far,
    /// prompt and generated). Fewer, or none, is fine.
    fn draft(
        &mut self,
        context: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), RuntimeError>;
}

/// Prompt-lookup drafting: finds the most recent earlier occurrence of the context's last
/// n tokens (n = `ngram` down to 1, the longest that occurs) and proposes the tokens that
/// followed it. Costs nothing and pays when the answer repeats its input (edits, code,
/// quotes, summaries).
pub struct PromptLookup {
    pub ngram: usize,
    pub draft_max: usize,
}

impl PromptLookup {
    pub fn new(ngram: usize, draft_max: usize) -> Self {
        PromptLookup {
            ngram: ngram.max(1),
            draft_max,
        }
    }
}

impl Drafter for PromptLookup {
    fn draft(
        &mut self,
        context: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), RuntimeError> {
        let max = max.min(self.draft_max);
        let len = context.len();
        if max == 0 || len < 2 {
            return Ok(());
        }
        for n in (1..=self.ngram.min(len - 1)).rev() {
            let tail = &context[len - n..];
            if let Some(at) = (0..len - n).rev().find(|&j| &context[j..j + n] == tail) {
                let from = at + n;
                out.extend_from_slice(&context[from..(from + max).min(len)]);
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A smaller model of the same vocabulary drafting greedily in its own session. Its cache
/// follows the context: before each draft the session keeps the prefix it shares with the
/// context (guesses the model refused are dropped; their positions get overwritten) and
/// feeds the rest.
pub struct DraftModel<'a, B: Backend> {
    session: LlmSession<'a, B>,
    pub draft_max: usize,
    /// The target's vocabulary: ids past it are never proposed.
    vocab: usize,
}

impl<'a, B: Backend> DraftModel<'a, B> {
    /// `draft` guesses for `target`; they must share a tokenizer. `n_ctx` as for
    /// [`Llm::session`] (use the target session's).
    pub fn new<T: Backend>(
        target: &Llm<T>,
        draft: &'a Llm<B>,
        n_ctx: usize,
        draft_max: usize,
    ) -> Result<Self, RuntimeError> {
        let (t, d) = (&target.tokenizer, &draft.tokenizer);
        let mismatch = |what: String| RuntimeError::DraftMismatch {
            path: draft.path.clone(),
            what,
        };
        if t.vocab_size() != d.vocab_size() {
            return Err(mismatch(format!(
                "its vocabulary has {} tokens, the model's {}",
                d.vocab_size(),
                t.vocab_size()
            )));
        }
        if t.eos_id() != d.eos_id() || t.bos_id() != d.bos_id() {
            return Err(mismatch(format!(
                "its BOS/EOS ids are {:?}/{:?}, the model's {:?}/{:?}",
                d.bos_id(),
                d.eos_id(),
                t.bos_id(),
                t.eos_id()
            )));
        }
        Ok(DraftModel {
            session: draft.session(n_ctx, 64),
            draft_max,
            vocab: target.model.cfg.vocab_size,
        })
    }

    /// Tokens in the draft model's cache.
    pub fn tokens(&self) -> &[u32] {
        self.session.tokens()
    }
}

impl<B: Backend> Drafter for DraftModel<'_, B> {
    fn begin(&mut self, prompt: &[u32]) -> Result<(), RuntimeError> {
        if !prompt.is_empty() && prompt.len() <= self.session.n_ctx() {
            self.session.prefill(prompt)?;
        }
        Ok(())
    }

    fn draft(
        &mut self,
        context: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), RuntimeError> {
        let s = &mut self.session;
        let n_ctx = s.n_ctx();
        if context.is_empty() || context.len() > n_ctx {
            return Ok(());
        }
        // The context fills context.len() positions and every guess but the last one more.
        let max = max.min(self.draft_max).min(n_ctx + 1 - context.len());
        if max == 0 {
            return Ok(());
        }
        let (mut logits, _) = s.prefill(context)?;
        let llm = s.llm;
        for i in 0..max {
            let t = argmax(&logits);
            if t as usize >= self.vocab {
                break;
            }
            out.push(t);
            if i + 1 == max || llm.tokenizer.is_eog(t) {
                break;
            }
            let pos = s.tokens.len();
            let l = llm
                .model
                .forward(&llm.backend, &mut s.state, &[t], pos, false)?;
            logits.copy_from_slice(l);
            s.tokens.push(t);
        }
        Ok(())
    }
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

impl<B: Backend> LlmSession<'_, B> {
    /// [`generate`](LlmSession::generate) with guesses from `drafter`, verified a batch at a
    /// time (up to the session's `max_batch` - 1 guesses per pass). EOS, stop strings,
    /// `max_tokens` and a full context end generation where plain decoding would. The cache
    /// then holds the prompt and the generated tokens as after `generate`, except that at
    /// `max_tokens` the last token may be missing (it would cost a pass to add).
    pub fn generate_speculative(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        drafter: &mut dyn Drafter,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats, RuntimeError> {
        let t0 = Instant::now();
        let (mut logits, reuse) = self.prefill(prompt)?;
        drafter.begin(prompt)?;
        let prefill_secs = t0.elapsed().as_secs_f64();

        let llm = self.llm;
        let vocab = llm.model.cfg.vocab_size;
        let (n_ctx, max_batch) = (self.state.n_ctx, self.state.max_batch);
        let mut sampler = Sampler::new(opts.sampler.clone());
        let mut out = TextOut::new(&llm.tokenizer, &opts.stop, on_text);
        // Row i of `logits` follows tokens[..base + i] and is checked against draft[i].
        let mut draft: Vec<u32> = Vec::new();
        let mut base = self.tokens.len();
        let (mut context, mut batch) = (Vec::new(), Vec::new());
        let (mut drafted, mut accepted, mut forwards) = (0, 0, 0);
        let finish = 'gen: loop {
            let mut next = 0;
            for i in 0..=draft.len() {
                if out.generated.len() >= opts.max_tokens {
                    self.tokens.truncate(base + i);
                    break 'gen FinishReason::MaxTokens;
                }
                let row = &logits[i * vocab..(i + 1) * vocab][..self.llm.sample_vocab()];
                let history = &self.tokens[..base + i];
                let t = match draft.get(i) {
                    Some(&d) => sampler.sample_draft(row, history, d),
                    None => sampler.sample(row, history),
                };
                let hit = draft.get(i) == Some(&t);
                accepted += hit as usize;
                if let Some(finish) = out.push(t)? {
                    self.tokens.truncate(base + i);
                    break 'gen finish;
                }
                if !hit {
                    // The model's own token: not in the cache yet.
                    self.tokens.truncate(base + i);
                    next = t;
                    break;
                }
            }
            if self.tokens.len() >= n_ctx {
                break FinishReason::ContextFull;
            }
            let left = opts.max_tokens - out.generated.len();
            if left == 0 {
                break FinishReason::MaxTokens;
            }
            // Guess only what could be kept: within the context, the batch and max_tokens.
            let room = (n_ctx - self.tokens.len() - 1)
                .min(max_batch - 1)
                .min(left - 1);
            draft.clear();
            if room > 0 {
                context.clear();
                context.extend_from_slice(&self.tokens);
                context.push(next);
                drafter.draft(&context, room, &mut draft)?;
                draft.truncate(room);
            }
            drafted += draft.len();
            batch.clear();
            batch.push(next);
            batch.extend_from_slice(&draft);
            let pos = self.tokens.len();
            let l = llm
                .model
                .forward(&llm.backend, &mut self.state, &batch, pos, true)?;
            logits.clear();
            logits.extend_from_slice(l);
            self.tokens.extend_from_slice(&batch);
            base = pos + 1;
            forwards += 1;
        };
        let mut stats = out.finish(finish, t0)?;
        stats.prompt_tokens = prompt.len() - reuse;
        stats.cached_tokens = reuse;
        stats.prefill_secs = prefill_secs;
        stats.decode_forwards = forwards;
        stats.speculative = true;
        stats.drafted = drafted;
        stats.accepted = accepted;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(ngram: usize, max: usize, ctx: &[u32], room: usize) -> Vec<u32> {
        let mut out = Vec::new();
        PromptLookup::new(ngram, max)
            .draft(ctx, room, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn prompt_lookup_takes_the_latest_longest_match() {
        // "1 2 3" occurred at 0 (then 4 5) and 2 3 at 6 (then 9): n=3 wins over the later n=2.
        let ctx = [1, 2, 3, 4, 5, 6, 2, 3, 9, 1, 2, 3];
        assert_eq!(lookup(3, 8, &ctx, 8), [4, 5, 6, 2, 3, 9, 1, 2]);
        assert_eq!(lookup(3, 2, &ctx, 8), [4, 5]);
        assert_eq!(lookup(3, 8, &ctx, 1), [4]);
        // n=2: the most recent "2 3" is at 6.
        assert_eq!(lookup(2, 8, &ctx, 8), [9, 1, 2, 3]);
        // Falls back to shorter n-grams, and finds nothing in new text.
        assert_eq!(lookup(3, 8, &[7, 8, 5, 7, 9, 8], 8), [5, 7, 9, 8]);
        assert_eq!(lookup(3, 8, &[1, 2, 3, 4], 8), Vec::<u32>::new());
        assert_eq!(lookup(3, 8, &[1], 8), Vec::<u32>::new());
    }
}
