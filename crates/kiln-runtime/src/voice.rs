//! The voice pipeline: speech in -> Whisper transcript -> the LLM's reply streamed through
//! the [`Scheduler`] -> Kokoro speech out, sentence by sentence as the reply's text arrives.
//!
//! The LLM runs on the engine thread while this thread synthesizes: sentence `n` is spoken
//! while sentence `n + 1` is generated, except for the first piece: the listener waits for
//! it, so the LLM (far ahead of speech) is on hold while it is synthesized. Whisper and
//! Kokoro each live on a thread of their own ([`crate::speech`]: one request at a time per
//! model, on the device they were loaded on), called for one transcription or one sentence. `kiln voice` and the server's `/v1/audio/chat` both call
//! [`Voice::converse`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kiln_text::speech::sentences;
use kiln_text::Message;
use thiserror::Error;

use crate::llm::{GenerateOptions, RuntimeError};
use crate::scheduler::{Event, EventSink, Prompt, Request, Scheduler, SubmitError};
use crate::speech::{SpeechToText, TextToSpeech};
use crate::tts::{TtsError, SAMPLE_RATE};
use crate::whisper::{TranscribeOptions, WhisperError};

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
    /// Speak the reply's first clause or phrase on its own, so the first audio comes sooner:
    /// the first piece ends at a comma after a few words, or before a word that starts a
    /// phrase ("with", "and", "because", ...; see [`SentenceStream::new`]).
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
    /// When a listener playing the first samples at once hears the first sound: first audio
    /// plus the silence the reply starts with.
    pub first_sound_ms: f64,
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
    pub stt: &'a SpeechToText,
    pub llm: &'a Scheduler,
    pub tts: &'a TextToSpeech,
}

/// The reply's events, and a hold the pipeline sets while the LLM should yield the cores.
/// The pipeline gone (its end of `hold` dropped) closes the request.
struct ReplySink {
    tx: mpsc::Sender<Event>,
    hold: Arc<AtomicBool>,
}

impl EventSink for ReplySink {
    fn send(&mut self, e: Event) -> bool {
        self.tx.send(e).is_ok()
    }
    fn closed(&self) -> bool {
        Arc::strong_count(&self.hold) == 1
    }
    fn held(&self) -> bool {
        self.hold.load(Ordering::Acquire)
    }
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

impl Voice<'_> {
    /// Prefills the system prompt of `o` (one token generated and dropped), so that turns
    /// find it in the scheduler's prefix cache and the first is timed like the later ones.
    pub fn warm_llm(&self, o: &VoiceOptions) -> Result<(), VoiceError> {
        let (tx, rx) = mpsc::channel();
        self.llm
            .submit(Request {
                prompt: Prompt::Chat(conversation(o, "Hello.")),
                opts: GenerateOptions {
                    max_tokens: 1,
                    ..o.generate.clone()
                },
                sink: Box::new(tx),
            })
            .map_err(|e| match e {
                SubmitError::QueueFull => VoiceError::QueueFull,
                SubmitError::Stopped => VoiceError::EngineStopped,
            })?;
        loop {
            match rx.recv().map_err(|_| VoiceError::EngineStopped)? {
                Event::Text(_) | Event::Logprobs(_) => {}
                Event::Done(_) => return Ok(()),
                Event::Error(e) => return Err(e.into()),
            }
        }
    }

    /// Answers 16 kHz mono `audio` with speech. `sink` returning false stops the pipeline
    /// (generation is cancelled); the stats so far are returned with `cancelled` set.
    pub fn converse(
        &self,
        audio: &[f32],
        o: &VoiceOptions,
        sink: &mut dyn FnMut(VoiceEvent<'_>) -> bool,
    ) -> Result<VoiceStats, VoiceError> {
        let t0 = Instant::now();
        let transcript = self.stt.transcribe(audio, &o.transcribe)?;
        let stt_ms = ms_since(t0);
        self.reply(transcript.text.trim(), t0, stt_ms, o, sink)
    }

    /// Answers what the user said (`transcript`, already transcribed: a live stream's final
    /// transcript) with speech; latencies from `t0`, the transcript having taken `stt_ms`.
    pub fn reply(
        &self,
        transcript: &str,
        t0: Instant,
        stt_ms: f64,
        o: &VoiceOptions,
        sink: &mut dyn FnMut(VoiceEvent<'_>) -> bool,
    ) -> Result<VoiceStats, VoiceError> {
        let mut st = VoiceStats {
            transcript: transcript.trim().to_string(),
            stt_ms,
            ..Default::default()
        };
        if st.transcript.is_empty() {
            return Err(VoiceError::NoSpeech);
        }
        if !sink(VoiceEvent::Transcript(&st.transcript)) {
            st.cancelled = true;
            return Ok(st);
        }

        let messages = conversation(o, &st.transcript);
        let (tx, rx) = mpsc::channel();
        let hold = Arc::new(AtomicBool::new(false));
        self.llm
            .submit(Request {
                prompt: Prompt::Chat(messages),
                opts: o.generate.clone(),
                sink: Box::new(ReplySink {
                    tx,
                    hold: hold.clone(),
                }),
            })
            .map_err(|e| match e {
                SubmitError::QueueFull => VoiceError::QueueFull,
                SubmitError::Stopped => VoiceError::EngineStopped,
            })?;

        let mut split = SentenceStream::new(o.first_clause).first_words(o.first_words);
        let mut turn = Turn {
            t0,
            hold: &hold,
            pieces: 0,
            first_cut: false,
        };
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
                    let done = split.push(&t);
                    turn.first_cut = split.first_cut();
                    done
                }
                Event::Done(c) => {
                    st.prompt_tokens = c.prompt_tokens;
                    st.completion_tokens = c.completion_tokens;
                    let rest = split.finish();
                    for s in &rest {
                        if !self.say(s, o, &mut turn, &mut st, sink)? {
                            break;
                        }
                    }
                    break;
                }
                Event::Logprobs(_) => continue,
                Event::Error(e) => return Err(e.into()),
            };
            let mut go_on = true;
            for s in &done {
                go_on = self.say(s, o, &mut turn, &mut st, sink)?;
                if !go_on {
                    break;
                }
            }
            if !go_on {
                break;
            }
        }
        // Dropping `hold` cancels a generation still running (a sink that left).
        drop(hold);
        drop(rx);
        st.reply = st.reply.trim().to_string();
        st.total_ms = ms_since(t0);
        Ok(st)
    }

    /// Speaks one piece (a sentence, or the first clause or phrase of one) into `sink`, the
    /// LLM on hold while the first one is synthesized; false when the caller stopped
    /// listening. The reply starts [`LEAD_KEEP_MS`] before its first sound, and a sentence cut
    /// into pieces pauses [`JOIN_PAUSE_MS`] between them (Kokoro frames every utterance with
    /// ~0.27 s of silence before and ~0.6-0.75 s after: a sentence's pause, not a phrase's).
    fn say(
        &self,
        piece: &str,
        o: &VoiceOptions,
        turn: &mut Turn<'_>,
        st: &mut VoiceStats,
        sink: &mut dyn FnMut(VoiceEvent<'_>) -> bool,
    ) -> Result<bool, VoiceError> {
        // The first piece cut inside its sentence: the pause after it is a comma's, and the
        // second piece goes on after that pause.
        let (cut, after_cut) = (
            turn.pieces == 0 && turn.first_cut,
            turn.pieces == 1 && turn.first_cut,
        );
        turn.pieces += 1;
        let text = speakable(piece);
        if !text.chars().any(char::is_alphanumeric) {
            return Ok(true);
        }
        if st.sentences == 0 {
            st.first_sentence_ms = ms_since(turn.t0);
        }
        st.sentences += 1;
        if !sink(VoiceEvent::Sentence(&text)) {
            st.cancelled = true;
            return Ok(false);
        }
        let ms = |v: f64| (v * SAMPLE_RATE as f64 / 1e3) as usize;
        let mut lead = if st.sentences == 1 {
            Some(ms(LEAD_KEEP_MS))
        } else if after_cut {
            Some(ms(JOIN_PAUSE_MS / 3.0))
        } else {
            None
        };
        let trail = cut.then(|| ms(JOIN_PAUSE_MS * 2.0 / 3.0));
        let mut listening = true;
        turn.hold.store(st.sentences == 1, Ordering::Release);
        let res = self
            .tts
            .speak(&text, false, &o.voice, o.speed, &mut |samples| {
                let samples = trim_silence(samples, lead.take(), trail);
                if st.audio_s == 0.0 {
                    st.first_audio_ms = ms_since(turn.t0);
                    let lead = samples.iter().position(|v| v.abs() >= SILENCE);
                    let lead = lead.unwrap_or(samples.len()) as f64 / SAMPLE_RATE as f64;
                    st.first_sound_ms = st.first_audio_ms + lead * 1e3;
                }
                st.audio_s += samples.len() as f64 / SAMPLE_RATE as f64;
                listening = sink(VoiceEvent::Audio(samples));
                if listening {
                    Ok(())
                } else {
                    Err(std::io::Error::other("the listener left"))
                }
            });
        turn.hold.store(false, Ordering::Release);
        match res {
            Ok(_) => Ok(true),
            Err(_) if !listening => {
                st.cancelled = true;
                Ok(false)
            }
            // A sentence with nothing to pronounce (symbols only) is skipped.
            Err(TtsError::Empty) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

/// The system prompt of `o` (or [`DEFAULT_SYSTEM`]) and the user's words.
fn conversation(o: &VoiceOptions, user: &str) -> Vec<Message> {
    let system = o.system.as_deref().unwrap_or(DEFAULT_SYSTEM);
    let mut messages = Vec::new();
    if !system.trim().is_empty() {
        messages.push(Message::new("system", system));
    }
    messages.push(Message::new("user", user));
    messages
}

/// Silence kept before the reply's first sound, in ms.
const LEAD_KEEP_MS: f64 = 50.0;

/// The pause between the pieces of one sentence, in ms (two thirds after the first piece,
/// one third before the next): a comma's.
const JOIN_PAUSE_MS: f64 = 150.0;

/// Below this amplitude (-50 dBFS) a sample is silence.
const SILENCE: f32 = 0.003;

/// `x` with the silence before its first sound cut to `lead` samples and after its last
/// sound to `trail` (None: kept as is). All silence: `x` unchanged.
fn trim_silence(x: &[f32], lead: Option<usize>, trail: Option<usize>) -> &[f32] {
    let loud = |v: &f32| v.abs() >= SILENCE;
    let (Some(first), Some(last)) = (x.iter().position(loud), x.iter().rposition(loud)) else {
        return x;
    };
    let a = lead.map_or(0, |k| first.saturating_sub(k));
    let b = trail.map_or(x.len(), |k| (last + 1 + k).min(x.len()));
    &x[a..b]
}

/// One turn's state while its pieces are spoken.
struct Turn<'a> {
    /// When the audio was handed over.
    t0: Instant,
    /// Set while the LLM should yield the cores.
    hold: &'a AtomicBool,
    /// Pieces handed to [`Voice::say`] so far.
    pieces: usize,
    /// The first piece ends inside its sentence ([`SentenceStream::first_cut`]).
    first_cut: bool,
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
    first_cut: bool,
}

/// Words the first clause needs before a comma may end it.
const CLAUSE_MIN_WORDS: usize = 4;

/// Words the first phrase needs before the word that starts the next one (as many as a
/// clause: a shorter piece sounds clipped, and costs Kokoro about as much today: "I'm glad"
/// takes longer than "I'm glad you're happy", PL-BERT being slower on short inputs).
const PHRASE_MIN_WORDS: usize = 4;

/// Words a phrase starts with (conjunctions, relatives, prepositions): a place where a
/// speaker may pause inside a sentence. "of" is not one ("a cup | of tea").
const PHRASE_STARTS: &[&str] = &[
    "about", "after", "although", "and", "as", "at", "because", "before", "but", "by", "for",
    "from", "if", "in", "on", "or", "since", "so", "than", "that", "though", "to", "unless",
    "until", "when", "where", "which", "while", "who", "with",
];

impl SentenceStream {
    /// `first_clause`: the first piece may end at a comma, semicolon or colon (followed by a
    /// space) after at least four words, or before a word of [`PHRASE_STARTS`] after at
    /// least four ("I'm glad you're happy | with the way I've responded.").
    pub fn new(first_clause: bool) -> Self {
        SentenceStream {
            buf: String::new(),
            first_clause,
            first_words: 0,
            emitted: 0,
            first_cut: false,
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
            let clause = match (clause_end(&self.buf), phrase_end(&self.buf)) {
                _ if !self.first_clause => None,
                (Some(c), Some(p)) => Some(c.min(p)),
                (c, p) => c.or(p),
            };
            let end = clause.or_else(|| words_end(&self.buf, self.first_words));
            if let Some(end) = end {
                let piece: String = self.buf.drain(..end).collect();
                out.push(piece.trim().to_string());
                self.first_cut = true;
            }
        }
        self.emitted += out.len();
        out
    }

    /// Whether the first piece ended inside its sentence (at a clause, a phrase or the word
    /// cap).
    pub fn first_cut(&self) -> bool {
        self.first_cut
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

/// Byte offset of the first word of [`PHRASE_STARTS`] that has at least
/// [`PHRASE_MIN_WORDS`] words before it, once that word is complete (the space after it has
/// arrived; a word with punctuation attached starts no phrase).
fn phrase_end(s: &str) -> Option<usize> {
    let mut words = 0;
    let mut at = 0;
    for w in s.split_inclusive(char::is_whitespace) {
        let word = w.trim_end();
        let start = at;
        at += w.len();
        if word.is_empty() {
            continue;
        }
        let bare = word.trim_end_matches(|c: char| c.is_ascii_punctuation());
        let complete = w.len() > word.len() && bare.len() == word.len();
        if words >= PHRASE_MIN_WORDS
            && complete
            && PHRASE_STARTS.contains(&bare.to_lowercase().as_str())
        {
            return Some(start);
        }
        words += 1;
    }
    None
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
        let (pushed, _) = stream("It costs 1,000 dollars today. Yes.", 1, true);
        assert_eq!(pushed, ["It costs 1,000 dollars today."]);
    }

    #[test]
    fn first_phrase_before_a_phrase_word() {
        let text = "I'm glad you're happy with the way I've responded. I'm happy to help.";
        for n in [1, 4, 9] {
            let (pushed, rest) = stream(text, n, true);
            assert_eq!(
                pushed,
                ["I'm glad you're happy", "with the way I've responded."],
                "pieces of {n}"
            );
            assert_eq!(rest, ["I'm happy to help."], "pieces of {n}");
            let (pushed, _) = stream(text, n, false);
            assert_eq!(
                pushed,
                ["I'm glad you're happy with the way I've responded."]
            );
        }
        // Fewer than four words before it, a longer word that starts like one, a phrase
        // word with punctuation attached: no break.
        for text in [
            "I'm happy to help you today. Yes.",
            "I'm so glad that it worked. Yes.",
            "It happened within the hour. Yes.",
            "I really think so. Yes.",
        ] {
            let (pushed, _) = stream(text, 1, true);
            assert_eq!(pushed, [text.trim_end_matches(" Yes.")], "{text}");
        }
        // Whichever boundary comes first ends the piece.
        let (pushed, _) = stream("Yes, that is right, and I agree with you", 100, true);
        assert_eq!(pushed, ["Yes, that is right,"]);
        let (pushed, _) = stream("We can go there with you, and then home", 100, true);
        assert_eq!(pushed, ["We can go there"]);
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
        assert!(ss.first_cut());
        // A sentence that ends first wins.
        let (pushed, rest) = {
            let mut ss = SentenceStream::new(false).first_words(5);
            (ss.push("Hi there. How are you doing today? "), ss.finish())
        };
        assert_eq!(pushed, ["Hi there."]);
        assert_eq!(rest, ["How are you doing today?"]);
        let mut ss = SentenceStream::new(false).first_words(5);
        ss.push("Hi there. How are you doing today? ");
        assert!(!ss.first_cut());
    }

    #[test]
    fn silence_trimmed_to_the_margins() {
        let mut x = vec![0.0f32; 100];
        x[40] = 0.5;
        x[45] = -0.2;
        x[50] = 0.001; // below the threshold
        assert_eq!(trim_silence(&x, Some(10), Some(5)), &x[30..51]);
        assert_eq!(trim_silence(&x, None, Some(0)), &x[..46]);
        assert_eq!(trim_silence(&x, Some(100), None), &x[..]);
        assert_eq!(trim_silence(&x[..40], Some(0), Some(0)), &x[..40]);
    }

    #[test]
    fn speakable_drops_markdown_and_emoji() {
        assert_eq!(
            speakable("**Paris** is the `capital` 🇫🇷 of #France!"),
            "Paris is the capital of France!"
        );
    }
}
