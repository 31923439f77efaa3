//! Word-level timestamps, computed as openai-whisper computes them: the window's text is
//! run once more through the decoder, the cross-attention of the model's alignment heads
//! (softmax over the audio frames, standardised over the tokens, median-filtered over the
//! frames, averaged over the heads) is aligned to the audio by dynamic time warping, and the
//! tokens' first frames become the words' start and end times; punctuation joins its word
//! and words that the alignment stretched over a pause are clipped.

use kiln_backend::Backend;

use super::{Stt, WhisperError};

/// One word of a segment and when it is spoken (seconds from the start of the audio).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Word {
    /// As written in the transcript, with its leading space and its punctuation.
    pub word: String,
    pub start: f64,
    pub end: f64,
}

/// Audio positions per second of the encoder's output (20 ms each).
const POSITIONS_PER_S: f64 = 50.0;
const MEDIAN_WIDTH: usize = 7;
/// Punctuation that joins the next word, and punctuation that joins the previous one.
const PREPEND: &str = "\"'“¿([{-";
const APPEND: &str = "\"'.。,，!！?？:：”)]}、";

/// A word with the tokens it was made of, times relative to its window.
#[derive(Debug, Clone)]
struct Timing {
    word: String,
    tokens: usize,
    start: f64,
    end: f64,
}

/// Softmax of each row of `m` (rows x cols), in place.
fn softmax_rows(m: &mut [f32], cols: usize) {
    for row in m.chunks_mut(cols) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for x in row.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        for x in row.iter_mut() {
            *x /= sum;
        }
    }
}

/// Each column of `m` (rows x cols) standardised over the rows (population deviation).
fn standardise_columns(m: &mut [f32], rows: usize, cols: usize) {
    for c in 0..cols {
        let mean = (0..rows).map(|r| m[r * cols + c] as f64).sum::<f64>() / rows as f64;
        let var = (0..rows)
            .map(|r| (m[r * cols + c] as f64 - mean).powi(2))
            .sum::<f64>()
            / rows as f64;
        let sd = var.sqrt();
        for r in 0..rows {
            m[r * cols + c] = ((m[r * cols + c] as f64 - mean) / sd) as f32;
        }
    }
}

/// A median filter of `MEDIAN_WIDTH` along each row, the row's ends mirrored (not
/// repeating the edge value); rows no longer than half the width are left as they are.
fn median_filter_rows(m: &mut [f32], cols: usize) {
    let pad = MEDIAN_WIDTH / 2;
    if cols <= pad {
        return;
    }
    let mut padded = vec![0.0f32; cols + 2 * pad];
    let mut window = [0.0f32; MEDIAN_WIDTH];
    for row in m.chunks_mut(cols) {
        for (i, p) in padded.iter_mut().enumerate() {
            let j = i as isize - pad as isize;
            let j = if j < 0 {
                -j
            } else if j >= cols as isize {
                2 * (cols as isize - 1) - j
            } else {
                j
            };
            *p = row[j as usize];
        }
        for (c, out) in row.iter_mut().enumerate() {
            window.copy_from_slice(&padded[c..c + MEDIAN_WIDTH]);
            window.sort_by(f32::total_cmp);
            *out = window[pad];
        }
    }
}

/// The cheapest monotonic path through `cost` (rows x cols) from its first cell to its last,
/// moving down, right or diagonally; as (row, col) pairs from the start. Ties go as
/// openai-whisper's: diagonal only when strictly cheaper than both, then down only when
/// strictly cheaper than both, else right.
fn dtw(cost: &[f32], rows: usize, cols: usize) -> Vec<(usize, usize)> {
    let w = cols + 1;
    let mut acc = vec![f32::INFINITY; (rows + 1) * w];
    let mut trace = vec![0u8; (rows + 1) * w];
    acc[0] = 0.0;
    for j in 1..=cols {
        for i in 1..=rows {
            let (c0, c1, c2) = (
                acc[(i - 1) * w + j - 1],
                acc[(i - 1) * w + j],
                acc[i * w + j - 1],
            );
            let (c, t) = if c0 < c1 && c0 < c2 {
                (c0, 0)
            } else if c1 < c0 && c1 < c2 {
                (c1, 1)
            } else {
                (c2, 2)
            };
            acc[i * w + j] = cost[(i - 1) * cols + j - 1] + c;
            trace[i * w + j] = t;
        }
    }
    for j in 0..=cols {
        trace[j] = 2;
    }
    for i in 0..=rows {
        trace[i * w] = 1;
    }
    let (mut i, mut j) = (rows, cols);
    let mut path = Vec::with_capacity(rows + cols);
    while i > 0 || j > 0 {
        path.push((i - 1, j - 1));
        match trace[i * w + j] {
            0 => {
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    path.reverse();
    path
}

impl<B: Backend> Stt<B> {
    /// The words of `text_tokens` (a window's text, no timestamps) over the window whose
    /// encoding is in `cross`, `n_frames` mel frames of it audio; times from the window's
    /// start. `sot_sequence`: the start, language and task tokens the window was decoded
    /// after.
    fn align(
        &self,
        cross: &kiln_models::whisper::CrossKv<B>,
        sot_sequence: &[u32],
        text_tokens: &[u32],
        n_frames: usize,
        language: &str,
    ) -> Result<Vec<Timing>, WhisperError> {
        let sp = &self.special;
        if text_tokens.is_empty() || self.alignment_heads.is_empty() {
            return Ok(Vec::new());
        }
        let mut tokens = sot_sequence.to_vec();
        tokens.push(sp.no_timestamps);
        tokens.extend_from_slice(text_tokens);
        tokens.push(sp.eot);
        let rows = tokens.len();
        let cols = (n_frames / 2).max(1);
        let mut st = self.model.decoder_state(&self.backend);
        let heads = self.model.cross_attention_logits(
            &self.backend,
            &mut st,
            cross,
            &tokens,
            &self.alignment_heads,
            cols,
        )?;
        let cols = heads[0].len() / rows;
        let mut matrix = vec![0.0f32; rows * cols];
        for mut h in heads {
            softmax_rows(&mut h, cols);
            standardise_columns(&mut h, rows, cols);
            median_filter_rows(&mut h, cols);
            for (m, x) in matrix.iter_mut().zip(&h) {
                *m += x;
            }
        }
        let n_heads = self.alignment_heads.len() as f32;
        // The rows of <|notimestamps|> and the text (not the start sequence, not the end).
        let first = sot_sequence.len();
        let text_rows = rows - first - 1;
        let cost: Vec<f32> = matrix[first * cols..(first + text_rows) * cols]
            .iter()
            .map(|&x| -x / n_heads)
            .collect();
        let path = dtw(&cost, text_rows, cols);
        // When the path enters each row: row r + 1 is text token r.
        let mut jump_times = Vec::with_capacity(text_rows);
        let mut last_row = usize::MAX;
        for &(r, c) in &path {
            if r != last_row {
                jump_times.push(c as f64 / POSITIONS_PER_S);
                last_row = r;
            }
        }
        let mut with_end = text_tokens.to_vec();
        with_end.push(sp.eot);
        let (words, word_tokens) = self.split_words(&with_end, language)?;
        if word_tokens.len() <= 1 {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(words.len() - 1);
        let mut at = 0;
        for (w, toks) in words.iter().zip(&word_tokens).take(words.len() - 1) {
            let end_at = at + toks.len();
            out.push(Timing {
                word: w.clone(),
                tokens: toks.len(),
                start: jump_times[at.min(jump_times.len() - 1)],
                end: jump_times[end_at.min(jump_times.len() - 1)],
            });
            at = end_at;
        }
        Ok(out)
    }

    /// Tokens grouped into whole characters (a character's bytes may span tokens).
    fn split_unicode(&self, tokens: &[u32]) -> Result<(Vec<String>, Vec<Vec<u32>>), WhisperError> {
        let full = self.tokenizer.decode(tokens, false)?;
        let full: Vec<char> = full.chars().collect();
        let (mut words, mut groups) = (Vec::new(), Vec::new());
        let mut current = Vec::new();
        let mut offset = 0;
        for &t in tokens {
            current.push(t);
            let decoded = self.tokenizer.decode(&current, false)?;
            let chars: Vec<char> = decoded.chars().collect();
            let bad = chars.iter().position(|&c| c == '\u{FFFD}');
            let whole = match bad {
                None => true,
                // A replacement character the full text has too is the text's own.
                Some(i) => full.get(offset + i) == Some(&'\u{FFFD}'),
            };
            if whole {
                offset += chars.len();
                words.push(decoded);
                groups.push(std::mem::take(&mut current));
            }
        }
        Ok((words, groups))
    }

    /// Words and their tokens: split at spaces and punctuation, or at every character for
    /// the languages written without spaces.
    fn split_words(
        &self,
        tokens: &[u32],
        language: &str,
    ) -> Result<(Vec<String>, Vec<Vec<u32>>), WhisperError> {
        let (subwords, groups) = self.split_unicode(tokens)?;
        if ["zh", "ja", "th", "lo", "my", "yue"].contains(&language) {
            return Ok((subwords, groups));
        }
        let (mut words, mut word_tokens): (Vec<String>, Vec<Vec<u32>>) = (Vec::new(), Vec::new());
        for (s, g) in subwords.into_iter().zip(groups) {
            let special = g[0] >= self.special.eot;
            let with_space = s.starts_with(' ');
            let trimmed = s.trim();
            let punctuation = !trimmed.is_empty()
                && trimmed.chars().count() == 1
                && trimmed.chars().all(|c| c.is_ascii_punctuation());
            if special || with_space || punctuation || words.is_empty() {
                words.push(s);
                word_tokens.push(g);
            } else {
                words.last_mut().expect("not empty").push_str(&s);
                word_tokens.last_mut().expect("not empty").extend(g);
            }
        }
        Ok((words, word_tokens))
    }

    /// Words for a window's segments (`(start, end, tokens)`, times from the audio's start),
    /// as openai-whisper's `add_word_timestamps` places them; the segments' bounds move to
    /// their first and last words where those are the better estimate. `last_speech`: the
    /// end of the previous window's speech, updated.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_words(
        &self,
        cross: &kiln_models::whisper::CrossKv<B>,
        sot_sequence: &[u32],
        segments: &mut [(f64, f64, Vec<u32>)],
        n_frames: usize,
        time_offset: f64,
        language: &str,
        last_speech: &mut f64,
    ) -> Result<Vec<Vec<Word>>, WhisperError> {
        let eot = self.special.eot;
        let per_segment: Vec<Vec<u32>> = segments
            .iter()
            .map(|s| s.2.iter().copied().filter(|&t| t < eot).collect())
            .collect();
        let text: Vec<u32> = per_segment.iter().flatten().copied().collect();
        let mut alignment = self.align(cross, sot_sequence, &text, n_frames, language)?;
        let mut durations: Vec<f64> = alignment
            .iter()
            .map(|t| t.end - t.start)
            .filter(|&d| d != 0.0)
            .collect();
        durations.sort_by(f64::total_cmp);
        let median = match durations.len() {
            0 => 0.0,
            n if n % 2 == 1 => durations[n / 2],
            n => (durations[n / 2 - 1] + durations[n / 2]) / 2.0,
        }
        .min(0.7);
        let max_duration = median * 2.0;
        // Long words at sentence ends: a mark takes no time, the word after one starts late.
        if !durations.is_empty() {
            let ends = [".", "。", "!", "！", "?", "？"];
            for i in 1..alignment.len() {
                if alignment[i].end - alignment[i].start > max_duration {
                    if ends.contains(&alignment[i].word.as_str()) {
                        alignment[i].end = alignment[i].start + max_duration;
                    } else if ends.contains(&alignment[i - 1].word.as_str()) {
                        alignment[i].start = alignment[i].end - max_duration;
                    }
                }
            }
        }
        merge_punctuation(&mut alignment);
        let round = |t: f64| (t * 100.0).round() / 100.0;
        let mut out = Vec::with_capacity(segments.len());
        let mut wi = 0;
        for (seg, toks) in segments.iter_mut().zip(&per_segment) {
            let mut saved = 0;
            let mut words: Vec<Word> = Vec::new();
            while wi < alignment.len() && saved < toks.len() {
                let t = &alignment[wi];
                if !t.word.is_empty() {
                    words.push(Word {
                        word: t.word.clone(),
                        start: round(time_offset + t.start),
                        end: round(time_offset + t.end),
                    });
                }
                saved += t.tokens;
                wi += 1;
            }
            if !words.is_empty() {
                // The first and second word after a pause are not longer than twice the
                // median word.
                let w1_long = words.len() > 1 && words[1].end - words[0].start > max_duration * 2.0;
                if words[0].end - *last_speech > median * 4.0
                    && (words[0].end - words[0].start > max_duration || w1_long)
                {
                    if words.len() > 1 && words[1].end - words[1].start > max_duration {
                        let boundary = (words[1].end / 2.0).max(words[1].end - max_duration);
                        words[0].end = boundary;
                        words[1].start = boundary;
                    }
                    words[0].start = (words[0].end - max_duration).max(0.0);
                }
                // The segment's own start when the first word is too long, else the word's.
                if seg.0 < words[0].end && seg.0 - 0.5 > words[0].start {
                    words[0].start = (words[0].end - median).min(seg.0).max(0.0);
                } else {
                    seg.0 = words[0].start;
                }
                let last = words.len() - 1;
                if seg.1 > words[last].start && seg.1 + 0.5 < words[last].end {
                    words[last].end = (words[last].start + median).max(seg.1);
                } else {
                    seg.1 = words[last].end;
                }
                *last_speech = seg.1;
            }
            out.push(words);
        }
        Ok(out)
    }
}

/// Opening punctuation joins the word after it, closing punctuation the word before.
fn merge_punctuation(a: &mut [Timing]) {
    if a.len() < 2 {
        return;
    }
    let (mut i, mut j) = (a.len() as isize - 2, a.len() - 1);
    while i >= 0 {
        let iu = i as usize;
        let prev = &a[iu];
        if prev.word.starts_with(' ') && PREPEND.contains(prev.word.trim()) {
            let (w, n) = (prev.word.clone(), prev.tokens);
            a[j].word = w + &a[j].word;
            a[j].tokens += n;
            a[iu].word.clear();
            a[iu].tokens = 0;
        } else {
            j = iu;
        }
        i -= 1;
    }
    let (mut i, mut j) = (0, 1);
    while j < a.len() {
        if !a[i].word.ends_with(' ') && APPEND.contains(a[j].word.as_str()) {
            let (w, n) = (a[j].word.clone(), a[j].tokens);
            a[i].word.push_str(&w);
            a[i].tokens += n;
            a[j].word.clear();
            a[j].tokens = 0;
        } else {
            i = j;
        }
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtw_follows_the_cheap_diagonal() {
        // 3 rows x 5 columns: cheap cells (0,0), (1,2), (2,4).
        let mut cost = vec![1.0f32; 15];
        for (r, c) in [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)] {
            cost[r * 5 + c] = 0.0;
        }
        let path = dtw(&cost, 3, 5);
        assert_eq!(path, vec![(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]);
    }

    #[test]
    fn median_filter_mirrors_the_ends() {
        let mut m = vec![9.0, 0.0, 0.0, 0.0, 9.0, 9.0, 9.0, 0.0];
        median_filter_rows(&mut m, 8);
        // Position 0 sees (mirrored) 0 0 0 9 0 0 0: median 0.
        assert_eq!(m, vec![0.0, 0.0, 0.0, 9.0, 0.0, 9.0, 9.0, 9.0]);
        let mut short = vec![3.0, 1.0, 2.0];
        median_filter_rows(&mut short, 3);
        assert_eq!(short, vec![3.0, 1.0, 2.0]);
    }

    #[test]
    fn punctuation_joins_its_word() {
        let t = |w: &str| Timing {
            word: w.into(),
            tokens: 1,
            start: 0.0,
            end: 0.0,
        };
        let mut a = vec![t(" \""), t("Hi"), t(","), t(" there"), t(".")];
        merge_punctuation(&mut a);
        let words: Vec<&str> = a.iter().map(|t| t.word.as_str()).collect();
        assert_eq!(words, ["", " \"Hi,", "", " there.", ""]);
        assert_eq!(a[1].tokens, 3);
    }
}
