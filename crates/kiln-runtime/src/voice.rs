//! The voice pipeline: speech in -> Whisper transcript -> the LLM's reply streamed through
//! the [`Scheduler`] -> Kokoro speech out, sentence by sentence as the reply's text arrives.
//!
//! The LLM runs on the engine thread while this thread synthesizes: sentence `n` is spoken
//! while sentence `n + 1` is generated. Whisper and Kokoro sit behind mutexes (one request
//! at a time per model), held only for one transcription or one sentence. `kiln voice` and
//! the server's `/v1/audio/chat` both call [`Voice::converse`].

use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Instant;

use kiln_backend::cpu::CpuBackend;
use kiln_text::speech::sentences;
use kiln_text::Message;
use thiserror::Error;

use crate::llm::{GenerateOptions, RuntimeError};
use crate::scheduler::{Event, Prompt, Request, Scheduler, SubmitError};
use crate::tts::{Tts, TtsError, SAMPLE_RATE};
use crate::whisper::{Stt, TranscribeOptions, WhisperError};

/// Whisper on the CPU backend.
pub type SttModel = Stt<CpuBackend>;

/// The system prompt a voice reply gets when the caller gives none: short spoken sentences.
pub const DEFAULT_SYSTEM: &str = "You are a helpful voice assistant. Answer in one to three \
short sentences of plain spoken English: no lists, no markdown, no emoji.";

#[derive(Debug, Error)]
pub enum VoiceError {
    #[error("speech to text: {0}")]
    Stt(#[from] WhisperError),
    #[error("no speech was recognised in the audio")]
    NoSpeech,
    #[error(transparent)]
    Llm(#[from] RuntimeError),
    #[error("text to speech: {0}")]
    Tts(#[from] TtsError),
    #[error("the generation queue is full; retry later")]
    QueueFull,
    #[error("the generation engine has stopped")]
    EngineStopped,
}

#[derive(Debug, Clone)]
pub struct VoiceOptions {
    /// System prompt (None: [`DEFAULT_SYSTEM`]).
    pub system: Option<String>,
    pub voice: String,
    pub speed: f32,
    pub generate: GenerateOptions,
    pub transcribe: TranscribeOptions,
    /// Speak the reply's first clause (up to a comma after a few words) on its own, so the
    /// first audio comes sooner.
    pub first_clause: bool,
    /// When > 0, the first piece also ends after this many words (at a word boundary) if no
    /// sentence or clause has ended by then: earlier first audio, at the cost of a pause
    /// inside the first sentence.
    pub first_words: usize,
}

/// What the pipeline hands its caller, in order: the transcript, then reply text pieces
/// interleaved with the sentences about to be spoken and their audio (24 kHz mono).
#[derive(Debug)]
pub enum VoiceEvent<'a> {
    Transcript(&'a str),
    Text(&'a str),
    Sentence(&'a str),
    Audio(&'a [f32]),
}

/// Stage latencies, each in ms from the moment the audio was handed over.
#[derive(Debug, Clone, Default)]
pub struct VoiceStats {
    pub transcript: String,
    pub reply: String,
    /// Transcript ready.
    pub stt_ms: f64,
    /// First text of the reply.
    pub ttft_ms: f64,
    /// First sentence (or clause) of the reply complete.
    pub first_sentence_ms: f64,
    /// First audio samples ready.
    pub first_audio_ms: f64,
    pub total_ms: f64,
    /// Seconds of speech produced.
    pub audio_s: f64,
    pub sentences: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The caller stopped listening (a sink returned false).
    pub cancelled: bool,
}

/// The three models of a voice conversation.
pub struct Voice<'a> {
    pub stt: &'a Mutex<SttModel>,
    pub llm: &'a Scheduler,
    pub tts: &'a Mutex<Tts>,
}

/// A mutex whose holder panicked still guards a usable model (every call starts afresh).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

impl Voice<'_> {
    /// Answers 16 kHz mono `audio` with speech. `sink` returning false stops the pipeline
    /// (generation is cancelled); the stats so far are returned with `cancelled` set.
    pub fn converse(
        &self,
        audio: &[f32],
        o: &VoiceOptions,
        sink: &mut dyn FnMut(VoiceEvent<'_>) -> bool,
    ) -> Result<VoiceStats, VoiceError> {
        let t0 = Instant::now();
        let mut st = VoiceStats::default();
        let transcript = lock(self.stt).transcribe(audio, &o.transcribe)?;
        st.transcript = transcript.text.trim().to_string();
        st.stt_ms = ms_since(t0);
        if st.transcript.is_empty() {
            return Err(VoiceError::NoSpeech);
        }
        if !sink(VoiceEvent::Transcript(&st.transcript)) {
            st.cancelled = true;
            return Ok(st);
        }

        let system = o.system.as_deref().unwrap_or(DEFAULT_SYSTEM);
        let mut messages = Vec::new();
        if !system.trim().is_empty() {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", st.transcript.clone()));
        let (tx, rx) = mpsc::channel();
        self.llm
            .submit(Request {
                prompt: Prompt::Chat(messages),
                opts: o.generate.clone(),
                sink: Box::new(tx),
            })
            .map_err(|e| match e {
                SubmitError::QueueFull => VoiceError::QueueFull,
                SubmitError::Stopped => VoiceError::EngineStopped,
            })?;

        let mut split = SentenceStream::new(o.first_clause).first_words(o.first_words);
        loop {
            let ev = rx.recv().map_err(|_| VoiceError::EngineStopped)?;
            let done = match ev {
                Event::Text(t) => {
                    if st.reply.is_empty() {
                        st.ttft_ms = ms_since(t0);
                    }
                    st.reply.push_str(&t);
                    if !sink(VoiceEvent::Text(&t)) {
                        st.cancelled = true;
                        break;
                    }
                    split.push(&t)
                }
                Event::Done(c) => {
                    st.prompt_tokens = c.prompt_tokens;
                    st.completion_tokens = c.completion_tokens;
                    let rest = split.finish();
                    for s in &rest {
                        if !self.say(s, o, t0, &mut st, sink)? {
                            break;
                        }
                    }
                    break;
                }
                Event::Error(e) => return Err(e.into()),
            };
            let mut go_on = true;
            for s in &done {
                go_on = self.say(s, o, t0, &mut st, sink)?;
                if !go_on {
                    break;
                }
            }
            if !go_on {
                break;
            }
        }
        // Dropping `rx` cancels a generation still running (a sink that left).
        drop(rx);
        st.reply = st.reply.trim().to_string();
        st.total_ms = ms_since(t0);
        Ok(st)
    }

    /// Speaks one sentence into `sink`; false when the caller stopped listening.
    fn say(
        &self,
        sentence: &str,
        o: &VoiceOptions,
        t0: Instant,
        st: &mut VoiceStats,
        sink: &mut dyn FnMut(VoiceEvent<'_>) -> bool,
    ) -> Result<bool, VoiceError> {
        let text = speakable(sentence);
        if !text.chars().any(char::is_alphanumeric) {
            return Ok(true);
        }
        if st.sentences == 0 {
            st.first_sentence_ms = ms_since(t0);
        }
        st.sentences += 1;
        if !sink(VoiceEvent::Sentence(&text)) {
            st.cancelled = true;
            return Ok(false);
        }
        let mut listening = true;
        let res = lock(self.tts).speak(&text, false, &o.voice, o.speed, &mut |samples| {
            if st.audio_s == 0.0 {
                st.first_audio_ms = ms_since(t0);
            }
            st.audio_s += samples.len() as f64 / SAMPLE_RATE as f64;
            listening = sink(VoiceEvent::Audio(samples));
            if listening {
                Ok(())
            } else {
                Err(std::io::Error::other("the listener left"))
            }
        });
        match res {
            Ok(_) => Ok(true),
            Err(_) if !listening => {
                st.cancelled = true;
                Ok(false)
            }
            // A sentence with nothing to pronounce (symbols only) is skipped.
            Err(TtsError::Input(_)) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

/// `s` without markdown emphasis, headings and code marks, and symbols the speech front end
/// would spell out (emoji and the like).
pub fn speakable(s: &str) -> String {
    let kept: String = s
        .chars()
        .filter(|&c| {
            c.is_alphanumeric() || c.is_whitespace() || ".,!?;:'\"-()$%&/…’‘“”+=@".contains(c)
        })
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Sentences out of streamed text: [`push`](Self::push) returns the sentences a piece
/// completes (a sentence ends once the next one has begun, so abbreviations and decimals
/// stay whole: the splitting is `kiln_text::speech::sentences`), [`finish`](Self::finish)
/// the rest.
pub struct SentenceStream {
    buf: String,
    first_clause: bool,
    first_words: usize,
    emitted: usize,
}

/// Words the first clause needs before a comma may end it.
const CLAUSE_MIN_WORDS: usize = 4;

impl SentenceStream {
    /// `first_clause`: the first piece may end at a comma, semicolon or colon (followed by a
    /// space) after at least four words.
    pub fn new(first_clause: bool) -> Self {
        SentenceStream {
            buf: String::new(),
            first_clause,
            first_words: 0,
            emitted: 0,
        }
    }

    /// The first piece ends after `n` words at most (0: no limit); a word counts once the
    /// space after it has arrived.
    pub fn first_words(mut self, n: usize) -> Self {
        self.first_words = n;
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        // Line breaks end sentences outright.
        if let Some(nl) = self.buf.rfind('\n') {
            let done: String = self.buf.drain(..=nl).collect();
            out.extend(sentences(&done));
        }
        let mut s = sentences(&self.buf);
        if s.len() >= 2 {
            let trailing_space = self.buf.ends_with(char::is_whitespace);
            let last = s.pop().expect("two or more");
            out.extend(s);
            self.buf = last;
            if trailing_space {
                self.buf.push(' ');
            }
        }
        if self.emitted == 0 && out.is_empty() {
            let clause = self.first_clause.then(|| clause_end(&self.buf)).flatten();
            let end = clause.or_else(|| words_end(&self.buf, self.first_words));
            if let Some(end) = end {
                let piece: String = self.buf.drain(..end).collect();
                out.push(piece.trim().to_string());
            }
        }
        self.emitted += out.len();
        out
    }

    pub fn finish(&mut self) -> Vec<String> {
        let s = sentences(&std::mem::take(&mut self.buf));
        self.emitted += s.len();
        s
    }
}

/// Byte offset just past the first `,` `;` or `:` that is followed by whitespace and has at
/// least [`CLAUSE_MIN_WORDS`] words before it.
fn clause_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(1)).find_map(|i| {
        let ends = matches!(b[i], b',' | b';' | b':') && b[i + 1].is_ascii_whitespace();
        (ends && s[..i].split_whitespace().count() >= CLAUSE_MIN_WORDS).then_some(i + 1)
    })
}

/// Byte offset of the whitespace after the `n`-th word, when a word follows it (n > 0).
fn words_end(s: &str, n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in s.char_indices() {
        if c.is_whitespace() {
            if in_word {
                words += 1;
                if words == n {
                    return s[i..].trim_start().chars().next().map(|_| i);
                }
            }
            in_word = false;
        } else {
            in_word = true;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` bytes (on char boundaries), collecting what each push
    /// returns, then the finish.
    fn stream(text: &str, n: usize, first_clause: bool) -> (Vec<String>, Vec<String>) {
        let mut ss = SentenceStream::new(first_clause);
        let mut pushed = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            pushed.extend(ss.push(&piece.iter().collect::<String>()));
        }
        (pushed, ss.finish())
    }

    #[test]
    fn sentences_as_they_complete() {
        let text = "Hello there. Mr. Smith paid $3.50 today! Is that all? Yes.";
        for n in [1, 3, 7, 100] {
            let (pushed, rest) = stream(text, n, false);
            assert_eq!(
                pushed,
                [
                    "Hello there.",
                    "Mr. Smith paid $3.50 today!",
                    "Is that all?"
                ],
                "pieces of {n}"
            );
            assert_eq!(rest, ["Yes."], "pieces of {n}");
        }
    }

    #[test]
    fn line_breaks_and_spaces_between_pieces() {
        let mut ss = SentenceStream::new(false);
        assert!(ss.push("One line").is_empty());
        assert_eq!(ss.push("\nTwo "), ["One line"]);
        assert!(ss.push("words.").is_empty());
        assert_eq!(ss.push(" Three"), ["Two words."]);
        assert_eq!(ss.finish(), ["Three"]);
    }

    #[test]
    fn first_clause_only_once() {
        let text =
            "Well, the capital of France, as you know, is Paris. It is big, old, and lovely.";
        let (pushed, rest) = stream(text, 2, true);
        assert_eq!(
            pushed,
            ["Well, the capital of France,", "as you know, is Paris."]
        );
        assert_eq!(rest, ["It is big, old, and lovely."]);
        // Numbers with commas are not clauses.
        let (pushed, _) = stream("It costs 1,000 dollars and more. Yes.", 1, true);
        assert_eq!(pushed, ["It costs 1,000 dollars and more."]);
    }

    #[test]
    fn first_words_cap() {
        let mut ss = SentenceStream::new(true).first_words(3);
        let mut got = Vec::new();
        for piece in [
            "I'm",
            " glad",
            " you",
            "'re",
            " happy",
            " with it.",
            " Yes",
            ".",
        ] {
            got.extend(ss.push(piece));
        }
        got.extend(ss.finish());
        assert_eq!(got, ["I'm glad you're", "happy with it.", "Yes."]);
        // A sentence that ends first wins.
        let (pushed, rest) = {
            let mut ss = SentenceStream::new(false).first_words(5);
            (ss.push("Hi there. How are you doing today? "), ss.finish())
        };
        assert_eq!(pushed, ["Hi there."]);
        assert_eq!(rest, ["How are you doing today?"]);
    }

    #[test]
    fn speakable_drops_markdown_and_emoji() {
        assert_eq!(
            speakable("**Paris** is the `capital` 🇫🇷 of #France!"),
            "Paris is the capital of France!"
        );
    }
}
