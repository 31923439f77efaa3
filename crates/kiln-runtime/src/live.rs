//! Live transcription: audio arrives in pieces (a microphone, a pipe), Silero VAD follows it
//! step by step (32 ms), and each stretch of speech becomes an utterance: transcribed again
//! as it grows (partial transcripts, every `partial_every_ms` of speech) and once more when
//! it ends (the final transcript), when the speaker has been silent for `end_silence_ms`.
//! Everything is measured in audio time, not wall time, so a stream replayed from a file
//! gives the same events as it did live.

use kiln_models::vad::{SileroVad, VadState, STEP};

/// 16 kHz.
const RATE: usize = 16_000;

#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Speech starts at a VAD step at least this likely.
    pub threshold: f32,
    /// ... and is silence again below this.
    pub neg_threshold: f32,
    /// The utterance (the user's turn) ends after this much silence.
    pub end_silence_ms: u32,
    /// Audio kept from before speech starts (VAD reacts a step or two late).
    pub pre_roll_ms: u32,
    /// A partial transcript after each this much more speech (0: none).
    pub partial_every_ms: u32,
    /// An utterance this long is cut and finished (Whisper's window is 30 s).
    pub max_utterance_ms: u32,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            threshold: 0.5,
            neg_threshold: 0.35,
            end_silence_ms: 700,
            pre_roll_ms: 300,
            partial_every_ms: 1000,
            max_utterance_ms: 28_000,
        }
    }
}

/// What live transcription reports; times in seconds from the start of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveEvent {
    /// The utterance so far, transcribed again as it grows.
    Partial { start: f64, text: String },
    /// The whole utterance, after its speaker went quiet (or at the end of the stream);
    /// `end`: where the VAD last heard speech.
    Final { start: f64, end: f64, text: String },
}

/// The speech-to-text a live stream runs on each utterance.
pub type Transcribe<'a, E> = dyn FnMut(&[f32]) -> Result<String, E> + 'a;

pub struct Live {
    vad: std::sync::Arc<SileroVad>,
    state: VadState,
    o: LiveOptions,
    /// Samples not yet a whole VAD step.
    pending: Vec<f32>,
    /// The last `pre_roll` samples while no one speaks.
    recent: std::collections::VecDeque<f32>,
    /// The utterance: its samples and where it began (samples from the stream's start).
    speech: Vec<f32>,
    start: usize,
    in_speech: bool,
    /// Samples of silence at the utterance's end, and of speech since the last partial.
    silence: usize,
    since_partial: usize,
    /// Samples of the stream seen by the VAD.
    seen: usize,
}

fn samples(ms: u32) -> usize {
    ms as usize * RATE / 1000
}

impl Live {
    pub fn new(vad: std::sync::Arc<SileroVad>, o: LiveOptions) -> Self {
        Live {
            vad,
            state: VadState::default(),
            o,
            pending: Vec::new(),
            recent: std::collections::VecDeque::new(),
            speech: Vec::new(),
            start: 0,
            in_speech: false,
            silence: 0,
            since_partial: 0,
            seen: 0,
        }
    }

    /// Feeds 16 kHz mono samples; `on` gets the events they cause.
    pub fn push<E>(
        &mut self,
        audio: &[f32],
        transcribe: &mut Transcribe<'_, E>,
        on: &mut dyn FnMut(LiveEvent),
    ) -> Result<(), E> {
        self.pending.extend_from_slice(audio);
        let whole = self.pending.len() / STEP * STEP;
        if whole == 0 {
            return Ok(());
        }
        let steps: Vec<f32> = self.pending.drain(..whole).collect();
        let probs = self.vad.run(&mut self.state, &steps);
        for (step, &p) in steps.chunks_exact(STEP).zip(&probs) {
            self.step(step, p, transcribe, on)?;
        }
        Ok(())
    }

    /// The end of the stream: an utterance still open is finished.
    pub fn finish<E>(
        &mut self,
        transcribe: &mut Transcribe<'_, E>,
        on: &mut dyn FnMut(LiveEvent),
    ) -> Result<(), E> {
        if !self.pending.is_empty() {
            let mut last = vec![0f32; STEP];
            last[..self.pending.len()].copy_from_slice(&self.pending);
            self.pending.clear();
            let p = self.vad.run(&mut self.state, &last)[0];
            self.step(&last, p, transcribe, on)?;
        }
        if self.in_speech {
            self.end_utterance(transcribe, on)?;
        }
        Ok(())
    }

    fn step<E>(
        &mut self,
        step: &[f32],
        p: f32,
        transcribe: &mut Transcribe<'_, E>,
        on: &mut dyn FnMut(LiveEvent),
    ) -> Result<(), E> {
        let at = self.seen;
        self.seen += step.len();
        if !self.in_speech {
            if p >= self.o.threshold {
                self.in_speech = true;
                self.start = at - self.recent.len();
                self.speech = self.recent.drain(..).collect();
                self.speech.extend_from_slice(step);
                self.silence = 0;
                self.since_partial = step.len();
            } else {
                self.recent.extend(step);
                let over = self
                    .recent
                    .len()
                    .saturating_sub(samples(self.o.pre_roll_ms));
                self.recent.drain(..over);
            }
            return Ok(());
        }
        self.speech.extend_from_slice(step);
        if p < self.o.neg_threshold {
            self.silence += step.len();
        } else {
            self.silence = 0;
            self.since_partial += step.len();
        }
        if self.silence >= samples(self.o.end_silence_ms)
            || self.speech.len() >= samples(self.o.max_utterance_ms)
        {
            return self.end_utterance(transcribe, on);
        }
        let every = samples(self.o.partial_every_ms);
        if every > 0 && self.since_partial >= every && self.silence == 0 {
            self.since_partial = 0;
            let text = transcribe(&self.speech)?;
            on(LiveEvent::Partial {
                start: self.start as f64 / RATE as f64,
                text: text.trim().to_string(),
            });
        }
        Ok(())
    }

    fn end_utterance<E>(
        &mut self,
        transcribe: &mut Transcribe<'_, E>,
        on: &mut dyn FnMut(LiveEvent),
    ) -> Result<(), E> {
        // Where the VAD last heard speech: the utterance's end.
        let end = self.start + self.speech.len() - self.silence.min(self.speech.len());
        // Whisper hears the trailing silence but for the pre-roll's worth of it (word
        // endings the VAD called silence).
        let trailing = self.silence.saturating_sub(samples(self.o.pre_roll_ms));
        let keep = self.speech.len() - trailing.min(self.speech.len());
        self.speech.truncate(keep);
        let text = transcribe(&self.speech)?;
        let start = self.start;
        self.in_speech = false;
        self.speech.clear();
        self.silence = 0;
        self.since_partial = 0;
        let text = text.trim().to_string();
        if !text.is_empty() {
            on(LiveEvent::Final {
                start: start as f64 / RATE as f64,
                end: end as f64 / RATE as f64,
                text,
            });
        }
        Ok(())
    }
}
