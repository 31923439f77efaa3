//! Long-form transcription: 30 s windows moved along the audio by where the last complete
//! segment ended (its timestamp), each decoded with temperature fallback; the previous
//! windows' text conditions the next (switchable); windows judged silent are skipped.
//! Before Whisper, voice activity detection ([`Vad`]): audio without speech transcribes as
//! nothing, and a long file is transcribed as its speech alone, the times mapped back.

use std::time::Instant;

use kiln_audio::mel::HOP;
use kiln_audio::{log_mel_spectrogram, SAMPLE_RATE};
use kiln_backend::Backend;

use kiln_models::vad::{speech_regions, VadOptions};

use super::decode::{compression_ratio, DecodeOptions, WindowDecoder, WindowResult};
use super::{Stt, WhisperError};

#[derive(Debug, Clone)]
pub struct TranscribeOptions {
    pub decode: DecodeOptions,
    /// Tried in order until a window's result passes the thresholds.
    pub temperatures: Vec<f32>,
    /// A result whose text compresses better than this (zlib) is a loop: retry hotter.
    pub compression_ratio_threshold: Option<f64>,
    /// A result whose mean logprob is below this is unsure: retry hotter.
    pub logprob_threshold: Option<f64>,
    /// A window whose no-speech probability exceeds this (and whose mean logprob is below
    /// `logprob_threshold`) is silence: skipped.
    pub no_speech_threshold: Option<f64>,
    pub condition_on_previous_text: bool,
    pub initial_prompt: Option<String>,
    /// Language code (`en`, `de`, ...) for multilingual models; None detects it.
    pub language: Option<String>,
    pub translate: bool,
    /// Voice activity detection before Whisper (with a VAD model loaded: [`Stt::vad`]).
    pub vad: Vad,
    /// Each segment's words with their times ([`Segment::words`]).
    pub word_timestamps: bool,
}

/// When [`Stt::transcribe`] runs the VAD and what it does with its regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Vad {
    /// No VAD.
    Off,
    /// Audio without speech is an empty transcript, and a 30 s window without speech is
    /// skipped (not encoded, nothing hallucinated in it); audio with speech is otherwise
    /// transcribed as without a VAD. Without a VAD model loaded, as `Off`.
    #[default]
    Auto,
    /// The speech regions alone, end to end (pauses of 2 s or more cut out), the times
    /// mapped back to the audio's; an error without a VAD model.
    On,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        TranscribeOptions {
            decode: DecodeOptions::default(),
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: true,
            initial_prompt: None,
            language: None,
            translate: false,
            vad: Vad::Auto,
            word_timestamps: false,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Segment {
    pub id: usize,
    /// Mel frame where this segment's window began.
    pub seek: usize,
    pub start: f64,
    pub end: f64,
    pub text: String,
    pub tokens: Vec<u32>,
    pub temperature: f32,
    pub avg_logprob: f64,
    pub compression_ratio: f64,
    pub no_speech_prob: f64,
    /// With [`TranscribeOptions::word_timestamps`]: the words and when each is spoken.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub words: Vec<super::words::Word>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TranscribeStats {
    pub audio_s: f64,
    pub mel_ms: f64,
    pub encode_ms: f64,
    pub windows: usize,
    pub decode_ms: f64,
    /// Decoder forward calls of one token (every beam, candidate and fallback; prompt
    /// prefill excluded).
    pub decode_tokens: usize,
    pub total_ms: f64,
    /// Time in the VAD (0 when it did not run).
    pub vad_ms: f64,
    /// Seconds of speech: the VAD's regions (padded) when it ran, else all of the audio.
    pub speech_s: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Transcript {
    pub text: String,
    pub language: String,
    pub segments: Vec<Segment>,
    pub stats: TranscribeStats,
}

impl<B: Backend> Stt<B> {
    /// The initial tokens of a window: `[<|startofprev|> prompt] <|startoftranscript|>
    /// [<|lang|> <|task|>] [<|notimestamps|>]`.
    fn initial_tokens(&self, prompt: &[u32], lang: Option<u32>, o: &TranscribeOptions) -> Vec<u32> {
        let sp = &self.special;
        let mut t = Vec::new();
        if !prompt.is_empty() {
            t.push(sp.sot_prev);
            let keep = self.model.cfg.n_text_ctx / 2 - 1;
            t.extend_from_slice(&prompt[prompt.len().saturating_sub(keep)..]);
        }
        t.push(sp.sot);
        if sp.multilingual {
            if let Some(l) = lang {
                t.push(l);
            }
            t.push(if o.translate {
                sp.translate
            } else {
                sp.transcribe
            });
        }
        if !o.decode.timestamps {
            t.push(sp.no_timestamps);
        }
        t
    }

    /// The most likely language token after `<|startoftranscript|>` (multilingual models).
    fn detect_language(
        &self,
        dec: &mut WindowDecoder<B>,
        cross: &kiln_models::whisper::CrossKv<B>,
    ) -> Result<u32, WhisperError> {
        let mut st = self.model.decoder_state(&self.backend);
        let logits = self
            .model
            .decode(&self.backend, &mut st, cross, &[self.special.sot], 0)?;
        let _ = dec;
        let best = self
            .special
            .languages
            .iter()
            .max_by(|a, b| logits[a.1 as usize].total_cmp(&logits[b.1 as usize]))
            .map(|&(_, id)| id)
            .ok_or_else(|| WhisperError::Vocabulary("no language tokens".into()))?;
        Ok(best)
    }

    /// Transcribes 16 kHz mono samples, through the VAD as `o.vad` says.
    pub fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
    ) -> Result<Transcript, WhisperError> {
        self.transcribe_each(samples, o, &mut |_| {})
    }

    /// As `transcribe`, handing each segment's text to `on_text` as soon as its window is
    /// decoded (streamed transcriptions).
    pub fn transcribe_each(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Transcript, WhisperError> {
        let t_start = Instant::now();
        let vad = match (&self.vad, o.vad) {
            (_, Vad::Off) | (None, Vad::Auto) => {
                return self.transcribe_all(samples, o, None, on_text)
            }
            (None, Vad::On) => {
                return Err(WhisperError::Input(
                    "VAD requested but no VAD model is loaded (silero-vad)".into(),
                ))
            }
            (Some(v), _) => v,
        };
        let probs = vad.probs(samples);
        let regions = speech_regions(&probs, samples.len(), &VadOptions::transcription());
        let vad_ms = t_start.elapsed().as_secs_f64() * 1e3;
        let speech_s =
            regions.iter().map(|(s, e)| e - s).sum::<usize>() as f64 / SAMPLE_RATE as f64;
        let finish = |mut t: Transcript| {
            t.stats.audio_s = samples.len() as f64 / SAMPLE_RATE as f64;
            t.stats.vad_ms = vad_ms;
            t.stats.speech_s = speech_s;
            t.stats.total_ms = t_start.elapsed().as_secs_f64() * 1e3;
            Ok(t)
        };
        if regions.is_empty() {
            return finish(Transcript {
                text: String::new(),
                language: o.language.clone().unwrap_or_else(|| "en".into()),
                segments: Vec::new(),
                stats: TranscribeStats::default(),
            });
        }
        if o.vad == Vad::Auto {
            return finish(self.transcribe_all(samples, o, Some(&regions), on_text)?);
        }
        // The regions end to end; `starts` maps each one's start in the speech to the audio.
        let mut speech = Vec::new();
        let mut starts = Vec::new();
        for &(s, e) in &regions {
            starts.push((speech.len(), s));
            speech.extend_from_slice(&samples[s..e]);
        }
        let mut t = self.transcribe_all(&speech, o, None, on_text)?;
        let rate = SAMPLE_RATE as f64;
        // A time in the speech -> the same moment of the audio. An end exactly at a joint
        // belongs to the region before it.
        let restore = |sec: f64, is_end: bool| -> f64 {
            let x = (sec * rate).round().max(0.0) as usize;
            let i = starts.partition_point(|&(at, _)| if is_end { at < x } else { at <= x });
            let (at, orig) = starts[i.max(1) - 1];
            (orig + x.saturating_sub(at)).min(samples.len()) as f64 / rate
        };
        for seg in &mut t.segments {
            seg.start = restore(seg.start, false);
            seg.end = restore(seg.end, true).max(seg.start);
            for w in &mut seg.words {
                w.start = restore(w.start, false);
                w.end = restore(w.end, true).max(w.start);
            }
            seg.seek = (restore(seg.seek as f64 * HOP as f64 / rate, false) * rate) as usize / HOP;
        }
        finish(t)
    }

    /// Transcribes `samples`; with `speech` (sample ranges), windows that overlap none of
    /// them are skipped.
    fn transcribe_all(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
        speech: Option<&[(usize, usize)]>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Transcript, WhisperError> {
        let t_start = Instant::now();
        let (b, m, sp) = (&self.backend, &self.model, &self.special);
        let n_frames = m.cfg.n_frames();
        let n_samples = n_frames * HOP;
        let mut stats = TranscribeStats {
            audio_s: samples.len() as f64 / SAMPLE_RATE as f64,
            speech_s: samples.len() as f64 / SAMPLE_RATE as f64,
            ..Default::default()
        };
        let t0 = Instant::now();
        let mel = log_mel_spectrogram(samples, m.cfg.n_mels, n_samples)?;
        stats.mel_ms = t0.elapsed().as_secs_f64() * 1e3;
        let content_frames = mel.n_frames.saturating_sub(n_frames);
        let floor = mel.data.iter().cloned().fold(f32::INFINITY, f32::min);

        let mut language_tok = match (&o.language, sp.multilingual) {
            (Some(code), true) => Some(
                sp.language(code)
                    .ok_or_else(|| WhisperError::Input(format!("unknown language '{code}'")))?,
            ),
            (Some(code), false) if code != "en" => {
                return Err(WhisperError::Input(format!(
                    "this model is English-only; --language {code} needs a multilingual model"
                )))
            }
            _ => None,
        };
        if o.translate && !sp.multilingual {
            return Err(WhisperError::Input(
                "this model is English-only: translating needs a multilingual model (whisper-base)"
                    .into(),
            ));
        }
        let blank = {
            let mut v = self.encode(" ")?;
            v.push(sp.eot);
            v
        };
        let mut dec = WindowDecoder::new(b, m, sp, &self.suppress, blank, o.decode.seed);
        let mut enc = m.encoder_state(b);
        let mut cross = m.cross_kv(b);

        let mut all_tokens: Vec<u32> = match &o.initial_prompt {
            Some(p) if !p.trim().is_empty() => self.encode(&format!(" {}", p.trim()))?,
            _ => Vec::new(),
        };
        let mut prompt_reset_since = 0;
        let mut segments: Vec<Segment> = Vec::new();
        let mut seek = 0usize;
        let mut last_speech = 0.0;
        let input_stride = 2; // mel frames per encoder position
        let frames_per_s = SAMPLE_RATE as f64 / HOP as f64;
        while seek < content_frames {
            let time_offset = seek as f64 / frames_per_s;
            let segment_size = n_frames.min(content_frames - seek);
            let segment_duration = segment_size as f64 / frames_per_s;
            let (from, to) = (seek * HOP, (seek + segment_size) * HOP);
            if speech.is_some_and(|r| !r.iter().any(|&(s, e)| s < to && e > from)) {
                seek += segment_size;
                continue;
            }
            let window = mel.window(seek, n_frames, floor);
            let te = Instant::now();
            m.encode(b, &window, &mut enc, &mut cross)?;
            stats.encode_ms += te.elapsed().as_secs_f64() * 1e3;
            stats.windows += 1;
            if sp.multilingual && language_tok.is_none() {
                language_tok = Some(self.detect_language(&mut dec, &cross)?);
            }
            let prompt = if o.condition_on_previous_text || o.initial_prompt.is_some() {
                &all_tokens[prompt_reset_since..]
            } else {
                &[][..]
            };
            let initial = self.initial_tokens(prompt, language_tok, o);
            let td = Instant::now();
            let r = self.decode_with_fallback(&mut dec, &cross, &initial, o)?;
            stats.decode_ms += td.elapsed().as_secs_f64() * 1e3;
            let (r, ratio) = r;

            if let Some(th) = o.no_speech_threshold {
                let mut skip = r.no_speech_prob > th;
                if o.logprob_threshold.is_some_and(|lt| r.avg_logprob > lt) {
                    skip = false;
                }
                if skip {
                    seek += segment_size;
                    continue;
                }
            }
            let tokens = &r.tokens;
            let is_ts: Vec<bool> = tokens.iter().map(|&t| sp.is_timestamp(t)).collect();
            let single_ending =
                is_ts.len() >= 2 && !is_ts[is_ts.len() - 2] && is_ts[is_ts.len() - 1];
            let mut consecutive: Vec<usize> = (1..is_ts.len())
                .filter(|&i| is_ts[i - 1] && is_ts[i])
                .collect();
            let mut current: Vec<(f64, f64, Vec<u32>)> = Vec::new();
            if !consecutive.is_empty() {
                if single_ending {
                    consecutive.push(tokens.len());
                }
                let mut last = 0;
                for &cut in &consecutive {
                    let s = &tokens[last..cut];
                    let (a, z) = (s[0], s[s.len() - 1]);
                    let start = time_offset
                        + if sp.is_timestamp(a) {
                            sp.time_of(a)
                        } else {
                            0.0
                        };
                    let end = time_offset
                        + if sp.is_timestamp(z) {
                            sp.time_of(z)
                        } else {
                            segment_duration
                        };
                    current.push((start, end, s.to_vec()));
                    last = cut;
                }
                if single_ending {
                    seek += segment_size;
                } else {
                    let last_ts = tokens[last - 1];
                    let pos = (last_ts - sp.timestamp_begin) as usize;
                    seek += (pos * input_stride).max(1);
                }
            } else {
                let mut duration = segment_duration;
                if let Some(&t) = tokens.iter().rev().find(|&&t| sp.is_timestamp(t)) {
                    if t != sp.timestamp_begin {
                        duration = sp.time_of(t);
                    }
                }
                current.push((time_offset, time_offset + duration, tokens.clone()));
                seek += segment_size;
            }
            let mut words = Vec::new();
            if o.word_timestamps {
                // The start sequence the window was decoded after, without a prompt.
                let mut sot = vec![sp.sot];
                let mut code = "en".to_string();
                if sp.multilingual {
                    let lang = language_tok.unwrap_or(sp.language("en").unwrap_or(sp.sot + 1));
                    sot.push(lang);
                    sot.push(if o.translate {
                        sp.translate
                    } else {
                        sp.transcribe
                    });
                    if let Some(l) = sp.languages.iter().find(|l| l.1 == lang) {
                        code = l.0.clone();
                    }
                }
                words = self.add_words(
                    &cross,
                    &sot,
                    &mut current,
                    segment_size,
                    time_offset,
                    &code,
                    &mut last_speech,
                )?;
            }
            let mut words = words.into_iter();
            for (start, end, toks) in current {
                let seg_words = words.next().unwrap_or_default();
                let text = self.text(&toks)?;
                if start == end || text.trim().is_empty() {
                    continue;
                }
                all_tokens.extend(toks.iter().copied());
                on_text(&text);
                segments.push(Segment {
                    id: segments.len(),
                    seek: seek.min(content_frames),
                    start,
                    end,
                    text,
                    tokens: toks,
                    temperature: r.temperature,
                    avg_logprob: r.avg_logprob,
                    compression_ratio: ratio,
                    no_speech_prob: r.no_speech_prob,
                    words: seg_words,
                });
            }
            if !o.condition_on_previous_text || r.temperature > 0.5 {
                prompt_reset_since = all_tokens.len();
            }
        }
        let text = segments.iter().map(|s| s.text.as_str()).collect::<String>();
        let language = match language_tok {
            Some(t) => sp
                .languages
                .iter()
                .find(|l| l.1 == t)
                .map_or("?".into(), |l| l.0.clone()),
            None => "en".into(),
        };
        stats.decode_tokens = dec.steps;
        stats.total_ms = t_start.elapsed().as_secs_f64() * 1e3;
        Ok(Transcript {
            text,
            language,
            segments,
            stats,
        })
    }

    /// Decodes a window at each temperature in turn until the result is neither a loop
    /// (compression ratio) nor unsure (mean logprob), unless the window is silence.
    fn decode_with_fallback(
        &self,
        dec: &mut WindowDecoder<B>,
        cross: &kiln_models::whisper::CrossKv<B>,
        initial: &[u32],
        o: &TranscribeOptions,
    ) -> Result<(WindowResult, f64), WhisperError> {
        let temps = if o.temperatures.is_empty() {
            &[0.0][..]
        } else {
            &o.temperatures[..]
        };
        let mut last = None;
        for &t in temps {
            let r = dec.decode(cross, initial, t, &o.decode)?;
            let ratio = compression_ratio(&self.text(&r.tokens)?);
            let mut fallback = false;
            if o.compression_ratio_threshold.is_some_and(|th| ratio > th) {
                fallback = true;
            }
            if o.logprob_threshold.is_some_and(|th| r.avg_logprob < th) {
                fallback = true;
            }
            if o.no_speech_threshold
                .is_some_and(|th| r.no_speech_prob > th)
            {
                fallback = false;
            }
            last = Some((r, ratio));
            if !fallback {
                break;
            }
        }
        Ok(last.expect("at least one temperature"))
    }
}
