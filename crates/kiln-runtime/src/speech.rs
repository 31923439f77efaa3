//! Whisper and Kokoro on any backend, each behind one type: [`SpeechToText`] and
//! [`TextToSpeech`], what the server and the voice pipeline hold whatever the device.
//!
//! Each model lives on a thread of its own ([`Resident`]): loaded there, every call run
//! there, one at a time. Arguments are copied in and results sent back; speech comes back
//! sentence by sentence as it is synthesized.

use std::sync::mpsc;

use kiln_backend::Backend;

use crate::resident::Resident;
use crate::tts::{Tts, TtsError, TtsStats};
use crate::whisper::{Stt, TranscribeOptions, Transcript, WhisperError};

/// What a speech-to-text model does, whatever its backend.
trait Transcribe {
    fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Transcript, WhisperError>;
}

impl<B: Backend> Transcribe for Stt<B> {
    fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Transcript, WhisperError> {
        Stt::transcribe_each(self, samples, o, on_text)
    }
}

/// Whisper on the backend it was loaded with, on a thread of its own.
pub struct SpeechToText {
    model: Resident<dyn Transcribe>,
    backend: String,
    load_ms: f64,
}

impl SpeechToText {
    /// Loads with `load` on the model's thread (a GPU backend is made inside `load`, so it
    /// stays on that thread).
    pub fn spawn<B, E>(load: impl FnOnce() -> Result<Stt<B>, E> + Send + 'static) -> Result<Self, E>
    where
        B: Backend + 'static,
        E: Send + 'static,
    {
        let (info_tx, info_rx) = mpsc::channel();
        let model = Resident::spawn("kiln-stt", move || {
            let stt = load()?;
            let _ = info_tx.send((stt.backend.name(), stt.load_ms));
            Ok(Box::new(stt) as Box<dyn Transcribe>)
        })?;
        let (backend, load_ms) = info_rx.recv().unwrap_or_default();
        Ok(SpeechToText {
            model,
            backend,
            load_ms,
        })
    }

    /// How long the load took, in ms.
    pub fn load_ms(&self) -> f64 {
        self.load_ms
    }

    /// The backend's name (`cpu`, `cuda`, ...).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The transcript of 16 kHz mono `samples`.
    pub fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
    ) -> Result<Transcript, WhisperError> {
        let (samples, o) = (samples.to_vec(), o.clone());
        self.model
            .call(move |m| m.transcribe(&samples, &o, &mut |_| {}))
    }

    /// As `transcribe`, each segment's text handed to `on_text` (on the model's thread) as
    /// soon as it is decoded.
    pub fn transcribe_each(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
        mut on_text: impl FnMut(&str) + Send + 'static,
    ) -> Result<Transcript, WhisperError> {
        let (samples, o) = (samples.to_vec(), o.clone());
        self.model
            .call(move |m| m.transcribe(&samples, &o, &mut on_text))
    }
}

/// What a text-to-speech model does, whatever its backend.
trait Speak {
    fn speak(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
        speed: f32,
        sink: &mut dyn FnMut(&[f32]) -> std::io::Result<()>,
    ) -> Result<TtsStats, TtsError>;
    fn phonemes(&self, text: &str, voice: &str) -> Result<Vec<String>, TtsError>;
}

impl<B: Backend> Speak for Tts<B> {
    fn speak(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
        speed: f32,
        sink: &mut dyn FnMut(&[f32]) -> std::io::Result<()>,
    ) -> Result<TtsStats, TtsError> {
        Tts::speak(self, text, is_phonemes, voice, speed, sink)
    }
    fn phonemes(&self, text: &str, voice: &str) -> Result<Vec<String>, TtsError> {
        Tts::phonemes(self, text, false, voice)
    }
}

/// Kokoro on the backend it was loaded with, on a thread of its own.
pub struct TextToSpeech {
    model: Resident<dyn Speak>,
    voices: Vec<String>,
    backend: String,
}

impl TextToSpeech {
    /// Loads with `load` on the model's thread (see [`SpeechToText::spawn`]).
    pub fn spawn<B, E>(load: impl FnOnce() -> Result<Tts<B>, E> + Send + 'static) -> Result<Self, E>
    where
        B: Backend + 'static,
        E: Send + 'static,
    {
        let (info_tx, info_rx) = mpsc::channel();
        let model = Resident::spawn("kiln-tts", move || {
            let tts = load()?;
            let voices: Vec<String> = tts.voices().map(str::to_string).collect();
            let _ = info_tx.send((voices, tts.backend_name()));
            Ok(Box::new(tts) as Box<dyn Speak>)
        })?;
        let (voices, backend) = info_rx.recv().unwrap_or_default();
        Ok(TextToSpeech {
            model,
            voices,
            backend,
        })
    }

    /// The voices, in the model's order.
    pub fn voices(&self) -> impl Iterator<Item = &str> {
        self.voices.iter().map(String::as_str)
    }

    /// The backend's name (`cpu`, `cuda`, ...).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// [`Tts::phonemes`] of `text` for `voice`'s language: its phoneme chunks, each one
    /// utterance the model speaks (speak them with `is_phonemes`). A text that cannot be
    /// pronounced fails here, before any audio is made.
    pub fn phonemes(&self, text: &str, voice: &str) -> Result<Vec<String>, TtsError> {
        let (text, voice) = (text.to_string(), voice.to_string());
        self.model.call(move |m| m.phonemes(&text, &voice))
    }

    /// [`Tts::speak`]: `sink` gets each chunk's samples (24 kHz mono) on this thread as soon
    /// as it is synthesized; an error from `sink` stops the synthesis and is returned as
    /// [`TtsError::Sink`].
    pub fn speak(
        &self,
        text: &str,
        is_phonemes: bool,
        voice: &str,
        speed: f32,
        sink: &mut dyn FnMut(&[f32]) -> std::io::Result<()>,
    ) -> Result<TtsStats, TtsError> {
        let (text, voice) = (text.to_string(), voice.to_string());
        let mut failed = None;
        let res = self.model.stream(
            move |m, emit: &mut dyn FnMut(Vec<f32>) -> bool| {
                m.speak(&text, is_phonemes, &voice, speed, &mut |s| {
                    if emit(s.to_vec()) {
                        Ok(())
                    } else {
                        Err(std::io::Error::other("the listener left"))
                    }
                })
            },
            &mut |s: Vec<f32>| match sink(&s) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            },
        );
        match (res, failed) {
            // The sink's own error, not the stop it caused over there.
            (Err(TtsError::Sink(_)), Some(e)) => Err(TtsError::Sink(e.to_string())),
            (res, _) => res,
        }
    }
}
