//! Decoding one 30 s window: the initial tokens, then greedy / sampled / beam-search tokens
//! under Whisper's logit rules (blank and non-speech suppression, timestamp rules).

use kiln_backend::Backend;
use kiln_models::whisper::{BeamScratch, CrossKv, DecoderState, Whisper};

use super::tokens::SpecialTokens;
use super::WhisperError;

#[derive(Debug, Clone)]
pub struct DecodeOptions {
    /// 1: greedy (or sampling at temperature > 0); more: beam search at temperature 0.
    pub beam_size: usize,
    /// Candidates sampled at temperature > 0, the most likely kept.
    pub best_of: usize,
    /// Beam search stops after `round(beam_size * patience)` finished candidates.
    pub patience: f32,
    pub timestamps: bool,
    /// The first timestamp may not exceed this many seconds.
    pub max_initial_timestamp: f64,
    /// Tokens sampled per window at most.
    pub sample_len: usize,
    pub suppress_blank: bool,
    pub seed: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            beam_size: 1,
            best_of: 5,
            patience: 1.0,
            timestamps: true,
            max_initial_timestamp: 1.0,
            sample_len: 224,
            suppress_blank: true,
            seed: 0,
        }
    }
}

/// What one window decoded to.
#[derive(Debug, Clone)]
pub struct WindowResult {
    /// Sampled tokens (text and timestamps), end-of-text excluded.
    pub tokens: Vec<u32>,
    pub sum_logprob: f64,
    /// sum_logprob / (tokens + 1): the end-of-text token counts.
    pub avg_logprob: f64,
    /// Probability of `<|nospeech|>` right after `<|startoftranscript|>`.
    pub no_speech_prob: f64,
    pub temperature: f32,
}

/// The model, its vocabulary facts and per-window scratch.
pub struct WindowDecoder<'m, B: Backend> {
    pub b: &'m B,
    pub model: &'m Whisper<B>,
    pub sp: &'m SpecialTokens,
    /// Never sampled.
    pub suppress: &'m [u32],
    /// Not sampled first: a space, end-of-text.
    pub blank: Vec<u32>,
    states: Vec<DecoderState<B>>,
    spare: Vec<DecoderState<B>>,
    /// A beam step's rows (made for the first beam search).
    beam: Option<BeamScratch<B>>,
    rng: u64,
    /// Decoder forward calls of one token so far (every beam, candidate and fallback).
    pub steps: usize,
}

impl<'m, B: Backend> WindowDecoder<'m, B> {
    pub fn new(
        b: &'m B,
        model: &'m Whisper<B>,
        sp: &'m SpecialTokens,
        suppress: &'m [u32],
        blank: Vec<u32>,
        seed: u64,
    ) -> Self {
        WindowDecoder {
            b,
            model,
            sp,
            suppress,
            blank,
            states: vec![model.decoder_state(b)],
            spare: Vec::new(),
            beam: None,
            rng: seed ^ 0x9E37_79B9_7F4A_7C15,
            steps: 0,
        }
    }

    fn ensure_states(&mut self, n: usize) {
        while self.states.len() < n {
            self.states.push(self.model.decoder_state(self.b));
        }
        while self.spare.len() < n {
            self.spare.push(self.model.decoder_state(self.b));
        }
    }

    /// Decodes a window whose cross-attention is `cross`, after `initial` tokens
    /// (`[<|startofprev|> prompt..] <|startoftranscript|> [lang task] [<|notimestamps|>]`).
    pub fn decode(
        &mut self,
        cross: &CrossKv<B>,
        initial: &[u32],
        temperature: f32,
        o: &DecodeOptions,
    ) -> Result<WindowResult, WhisperError> {
        let sot_index = initial
            .iter()
            .position(|&t| t == self.sp.sot)
            .ok_or_else(|| {
                WhisperError::Input("initial tokens lack <|startoftranscript|>".into())
            })?;
        let n_ctx = self.model.cfg.n_text_ctx;
        if initial.len() >= n_ctx {
            return Err(WhisperError::Input(format!(
                "{} initial tokens fill the text context of {n_ctx}",
                initial.len()
            )));
        }
        // Prefill up to <|startoftranscript|> (its logits give the no-speech probability),
        // then the rest of the initial tokens.
        let (b, m) = (self.b, self.model);
        let st = &mut self.states[0];
        let at_sot = m.decode(b, st, cross, &initial[..=sot_index], 0)?;
        let no_speech_prob = softmax_at(at_sot, self.sp.no_speech as usize);
        let first = if sot_index + 1 < initial.len() {
            m.decode(b, st, cross, &initial[sot_index + 1..], sot_index + 1)?
                .to_vec()
        } else {
            at_sot.to_vec()
        };
        let mut best = if o.beam_size > 1 && temperature == 0.0 {
            self.beam(cross, initial, first, o)?
        } else {
            let n = if temperature > 0.0 {
                o.best_of.max(1)
            } else {
                1
            };
            let mut best: Option<(Vec<u32>, f64)> = None;
            for i in 0..n {
                if i > 0 {
                    // Each candidate starts from the same prefilled state.
                    self.ensure_states(1);
                    let (s0, spare) = (&self.states[0], &mut self.spare[0]);
                    spare.copy_from(b, s0, initial.len());
                }
                let cand = self.sample(cross, initial, first.clone(), temperature, o, i > 0)?;
                let score = cand.1 / cand.0.len().max(1) as f64;
                if best
                    .as_ref()
                    .is_none_or(|(t, s)| score > s / t.len().max(1) as f64)
                {
                    best = Some(cand);
                }
            }
            best.expect("at least one candidate")
        };
        best.0.truncate(o.sample_len);
        let n = best.0.len();
        Ok(WindowResult {
            avg_logprob: best.1 / (n + 1) as f64,
            sum_logprob: best.1,
            tokens: best.0,
            no_speech_prob,
            temperature,
        })
    }

    /// One sequence, greedy (temperature 0) or sampled; `use_spare` decodes in the spare
    /// state (a copy of the prefilled one). Returns (tokens, sum of logprobs).
    fn sample(
        &mut self,
        cross: &CrossKv<B>,
        initial: &[u32],
        mut logits: Vec<f32>,
        temperature: f32,
        o: &DecodeOptions,
        use_spare: bool,
    ) -> Result<(Vec<u32>, f64), WhisperError> {
        let (b, m) = (self.b, self.model);
        let n_ctx = m.cfg.n_text_ctx;
        let mut tokens = Vec::new();
        let mut sum = 0f64;
        let mut pos = initial.len();
        for _ in 0..o.sample_len {
            let lse = self.apply_rules(&mut logits, &tokens, o);
            let next = if temperature == 0.0 {
                argmax(&logits)
            } else {
                self.categorical(&logits, temperature)
            };
            // log_softmax(logits)[next], from the one log-sum-exp pass.
            sum += (logits[next as usize] - lse) as f64;
            if next == self.sp.eot || pos >= n_ctx {
                break;
            }
            tokens.push(next);
            let st = if use_spare {
                &mut self.spare[0]
            } else {
                &mut self.states[0]
            };
            logits.copy_from_slice(m.decode(b, st, cross, &[next], pos)?);
            self.steps += 1;
            pos += 1;
        }
        Ok((tokens, sum))
    }

    /// Beam search (temperature 0): every step expands each beam by its best tokens, keeps
    /// the `beam_size` most likely unfinished sequences and collects the finished ones ranked
    /// above the last of them until `round(beam_size * patience)` are done; the best by mean
    /// logprob wins.
    fn beam(
        &mut self,
        cross: &CrossKv<B>,
        initial: &[u32],
        first: Vec<f32>,
        o: &DecodeOptions,
    ) -> Result<(Vec<u32>, f64), WhisperError> {
        let (b, m) = (self.b, self.model);
        let n_ctx = m.cfg.n_text_ctx;
        let k = o.beam_size;
        let max_finished = ((k as f32 * o.patience).round() as usize).max(1);
        self.ensure_states(k);
        for i in 1..k {
            let (s0, rest) = self.states.split_at_mut(1);
            rest[i - 1].copy_from(b, &s0[0], initial.len());
        }
        // (tokens, sum_logprob, logits after the last token)
        let mut beams: Vec<(Vec<u32>, f64, Vec<f32>)> = vec![(Vec::new(), 0.0, first)];
        let mut finished: Vec<(Vec<u32>, f64)> = Vec::new();
        let mut pos = initial.len();
        for _ in 0..o.sample_len {
            // Candidates (score, source beam, token), deduplicated by sequence.
            let mut cands: Vec<(f64, usize, u32)> = Vec::new();
            for (bi, (toks, sum, logits)) in beams.iter_mut().enumerate() {
                let lse = self.apply_rules(logits, toks, o);
                let lp: Vec<f32> = logits.iter().map(|&v| v - lse).collect();
                for t in top_k(&lp, k + 1) {
                    cands.push((*sum + lp[t as usize] as f64, bi, t));
                }
            }
            cands.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut next: Vec<(usize, u32, f64)> = Vec::new();
            let mut seen: Vec<Vec<u32>> = Vec::new();
            for &(score, src, t) in &cands {
                let mut seq = beams[src].0.clone();
                seq.push(t);
                if seen.contains(&seq) {
                    continue;
                }
                seen.push(seq.clone());
                if t == self.sp.eot || pos >= n_ctx {
                    if finished.len() < max_finished {
                        if seq.last() == Some(&self.sp.eot) {
                            seq.pop();
                        }
                        finished.push((seq, score));
                    }
                } else {
                    next.push((src, t, score));
                    // As openai-whisper: candidates ranked below the k-th continuing one are
                    // dropped, finished ones among them too (a short, unlikely ending kept
                    // from down there could win on its mean logprob).
                    if next.len() == k {
                        break;
                    }
                }
            }
            if finished.len() >= max_finished || next.is_empty() {
                break;
            }
            // Fork states: new beam j continues source beam src.
            for (j, &(src, _, _)) in next.iter().enumerate() {
                let (states, spare) = (&self.states, &mut self.spare);
                spare[j].copy_from(b, &states[src], pos);
            }
            std::mem::swap(&mut self.states, &mut self.spare);
            // Every hypothesis's next token in one pass (each weight read once for all).
            if self.beam.as_ref().is_none_or(|s| s.rows() < next.len()) {
                self.beam = Some(m.beam_scratch(b, k));
            }
            let scratch = self.beam.as_mut().expect("made above");
            let toks: Vec<u32> = next.iter().map(|&(_, t, _)| t).collect();
            let rows = m.decode_beams(
                b,
                &mut self.states[..next.len()],
                scratch,
                cross,
                &toks,
                pos,
            )?;
            let vocab = rows.len() / next.len();
            let mut new_beams = Vec::with_capacity(next.len());
            for (j, &(src, t, score)) in next.iter().enumerate() {
                let mut toks = beams[src].0.clone();
                toks.push(t);
                self.steps += 1;
                new_beams.push((toks, score, rows[j * vocab..(j + 1) * vocab].to_vec()));
            }
            beams = new_beams;
            pos += 1;
        }
        if finished.is_empty() {
            finished = beams.into_iter().map(|(t, s, _)| (t, s)).collect();
        }
        let best = finished
            .into_iter()
            .max_by(|a, b| {
                let sa = a.1 / a.0.len().max(1) as f64;
                let sb = b.1 / b.0.len().max(1) as f64;
                sa.total_cmp(&sb)
            })
            .expect("at least one sequence");
        Ok(best)
    }

    /// Whisper's logit rules for the next token after `sampled` (tokens of this window).
    /// Returns the log-sum-exp of the logits as the rules leave them (what log_softmax of
    /// them would compute), so that the caller needs no second pass over the vocabulary.
    pub fn apply_rules(&self, logits: &mut [f32], sampled: &[u32], o: &DecodeOptions) -> f32 {
        let sp = self.sp;
        let ninf = f32::NEG_INFINITY;
        if o.suppress_blank && sampled.is_empty() {
            for &t in &self.blank {
                logits[t as usize] = ninf;
            }
        }
        for &t in self.suppress {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = ninf;
            }
        }
        if !o.timestamps {
            return log_sum_exp(logits);
        }
        let tb = sp.timestamp_begin as usize;
        let eot = sp.eot as usize;
        logits[sp.no_timestamps as usize] = ninf;
        // Timestamps come in pairs (end of one segment, start of the next), except that a
        // lone timestamp may precede end-of-text.
        let last_ts = sampled.last().is_some_and(|&t| sp.is_timestamp(t));
        let penult_ts = sampled.len() < 2 || sp.is_timestamp(sampled[sampled.len() - 2]);
        if last_ts {
            if penult_ts {
                logits[tb..].fill(ninf);
            } else {
                logits[..eot].fill(ninf);
            }
        }
        // Timestamps never decrease, and a segment is never empty.
        if let Some(&last) = sampled.iter().rev().find(|&&t| sp.is_timestamp(t)) {
            let lim = if last_ts && !penult_ts {
                last
            } else {
                last + 1
            } as usize;
            let lim = lim.min(logits.len());
            logits[tb..lim].fill(ninf);
        }
        if sampled.is_empty() {
            // The window starts with a timestamp, no later than max_initial_timestamp.
            logits[..tb].fill(ninf);
            let last_allowed =
                tb + (o.max_initial_timestamp / super::tokens::TIME_PRECISION).round() as usize;
            if last_allowed + 1 < logits.len() {
                logits[last_allowed + 1..].fill(ninf);
            }
        }
        // When timestamps are together more likely than any text token, take a timestamp.
        // (log_softmax's values, computed only where they are read.)
        let lse = log_sum_exp(logits);
        let ts_lp = log_sum_exp_shifted(&logits[tb..], lse);
        let max_text = logits[..tb]
            .iter()
            .map(|&v| v - lse)
            .fold(f32::NEG_INFINITY, f32::max);
        if ts_lp > max_text {
            logits[..tb].fill(ninf);
            // With every text logit at -inf their terms add exact zeros (and the maximum is
            // a timestamp's): the timestamps' log-sum-exp is the whole vector's, bit for bit.
            return log_sum_exp(&logits[tb..]);
        }
        lse
    }

    /// Samples from softmax(logits / temperature).
    fn categorical(&mut self, logits: &[f32], temperature: f32) -> u32 {
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| (((l - max) / temperature) as f64).exp())
            .collect();
        let total: f64 = w.iter().sum();
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let mut u = (r >> 11) as f64 / (1u64 << 53) as f64 * total;
        for (i, &x) in w.iter().enumerate() {
            u -= x;
            if u <= 0.0 && x > 0.0 {
                return i as u32;
            }
        }
        argmax(logits)
    }
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

fn top_k(l: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = Vec::with_capacity(k + 1);
    for (i, &v) in l.iter().enumerate() {
        if v == f32::NEG_INFINITY {
            continue;
        }
        if idx.len() < k || v > l[*idx.last().expect("non-empty") as usize] {
            let at = idx
                .iter()
                .position(|&j| l[j as usize] < v)
                .unwrap_or(idx.len());
            idx.insert(at, i as u32);
            idx.truncate(k);
        }
    }
    idx
}

pub fn log_sum_exp(x: &[f32]) -> f32 {
    log_sum_exp_shifted(x, 0.0)
}

/// log_sum_exp of the values `v - shift` (computed as the caller would store them, so the
/// result is bit for bit that of the shifted vector), without making that vector.
fn log_sum_exp_shifted(x: &[f32], shift: f32) -> f32 {
    let max = x
        .iter()
        .map(|&v| v - shift)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let s: f64 = x.iter().map(|&v| ((v - shift - max) as f64).exp()).sum();
    max + s.ln() as f32
}

fn softmax_at(x: &[f32], i: usize) -> f64 {
    let lse = log_sum_exp(x);
    x.get(i).map_or(0.0, |&v| ((v - lse) as f64).exp())
}

/// Bytes of `text` over bytes of its zlib compression: high for repetitive loops.
pub fn compression_ratio(text: &str) -> f64 {
    let b = text.as_bytes();
    if b.is_empty() {
        return 0.0;
    }
    let z = miniz_oxide::deflate::compress_to_vec_zlib(b, 6);
    b.len() as f64 / z.len() as f64
}
