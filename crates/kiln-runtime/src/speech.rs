//! Whisper and Kokoro on any backend, each behind one type: [`SpeechToText`] and
//! [`TextToSpeech`], what the server and the voice pipeline hold whatever the device.
//!
//! Each model lives on a thread of its own ([`Resident`]): it is loaded there and every
//! call runs there, one at a time, so a backend bound to the thread that made it (a CUDA
//! context, a GPU queue) serves callers on any thread. Arguments are copied in and results
//! sent back; speech comes back sentence by sentence as it is synthesized.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use kiln_backend::Backend;

use crate::tts::{Tts, TtsError, TtsStats};
use crate::whisper::{Stt, TranscribeOptions, Transcript, WhisperError};

type Job<M> = Box<dyn FnOnce(&mut M) + Send>;

/// A value that lives on a thread of its own: made there by [`Resident::spawn`], used through
/// [`Resident::call`] from any thread. `M` need not be `Send`.
pub struct Resident<M> {
    tx: Mutex<Option<mpsc::Sender<Job<M>>>>,
    thread: Option<JoinHandle<()>>,
}

impl<M: 'static> Resident<M> {
    /// Starts thread `name` and makes the value there with `load`; its error is returned
    /// here (and the thread ends).
    pub fn spawn<E>(
        name: &str,
        load: impl FnOnce() -> Result<M, E> + Send + 'static,
    ) -> Result<Self, E>
    where
        E: Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job<M>>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), E>>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut m = match catch_unwind(AssertUnwindSafe(load)) {
                    Ok(Ok(m)) => m,
                    Ok(Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    Err(p) => {
                        drop(ready_tx);
                        resume_unwind(p)
                    }
                };
                let _ = ready_tx.send(Ok(()));
                // Until the handle goes (its sender dropped).
                while let Ok(job) = rx.recv() {
                    job(&mut m);
                }
            })
            // As std::thread::spawn: a machine that cannot start a thread cannot go on.
            .expect("starting a model thread");
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Resident {
                tx: Mutex::new(Some(tx)),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            // The load panicked: the same panic here.
            Err(_) => match thread.join() {
                Err(p) => resume_unwind(p),
                Ok(()) => unreachable!("the loading thread ended without a word"),
            },
        }
    }

    /// Runs `f` on the value's thread (calls queue there, one at a time) and returns its
    /// result. A panic in `f` is resumed here; the value stays for the next call.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut M) -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Box::new(move |m: &mut M| {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(|| f(m))));
        }));
        match rx.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(p)) => resume_unwind(p),
            Err(_) => unreachable!("a resident thread ends only with its handle"),
        }
    }

    /// Like [`Resident::call`], `f` also given `emit`, whose items reach `each` on this
    /// thread as they are made. Once `each` returns false, `emit` returns false (so `f` can
    /// stop early) and later items are dropped.
    pub fn stream<T, R>(
        &self,
        f: impl FnOnce(&mut M, &mut dyn FnMut(T) -> bool) -> R + Send + 'static,
        each: &mut dyn FnMut(T) -> bool,
    ) -> R
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        enum Msg<T, R> {
            Item(T),
            Done(std::thread::Result<R>),
        }
        // Two items in flight at most: the value's thread waits for a slow reader.
        let (tx, rx) = mpsc::sync_channel::<Msg<T, R>>(2);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        self.send(Box::new(move |m: &mut M| {
            let mut emit = |t: T| !stopped.load(Ordering::Acquire) && tx.send(Msg::Item(t)).is_ok();
            let r = catch_unwind(AssertUnwindSafe(|| f(m, &mut emit)));
            let _ = tx.send(Msg::Done(r));
        }));
        loop {
            match rx.recv() {
                Ok(Msg::Item(t)) => {
                    if !stop.load(Ordering::Acquire) && !each(t) {
                        stop.store(true, Ordering::Release);
                    }
                }
                Ok(Msg::Done(Ok(r))) => return r,
                Ok(Msg::Done(Err(p))) => resume_unwind(p),
                Err(_) => unreachable!("a resident thread ends only with its handle"),
            }
        }
    }

    fn send(&self, job: Job<M>) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        // The thread ends only when the sender is dropped (below), and jobs catch panics.
        let sent = tx.as_ref().map(|tx| tx.send(job));
        assert!(
            matches!(sent, Some(Ok(()))),
            "a resident thread ends only with its handle"
        );
    }
}

impl<M> Drop for Resident<M> {
    fn drop(&mut self) {
        self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a speech-to-text model does, whatever its backend.
trait Transcribe {
    fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
    ) -> Result<Transcript, WhisperError>;
}

impl<B: Backend> Transcribe for Stt<B> {
    fn transcribe(
        &self,
        samples: &[f32],
        o: &TranscribeOptions,
    ) -> Result<Transcript, WhisperError> {
        Stt::transcribe(self, samples, o)
    }
}

/// Whisper on the backend it was loaded with, on a thread of its own.
pub struct SpeechToText {
    model: Resident<Box<dyn Transcribe>>,
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
        self.model.call(move |m| m.transcribe(&samples, &o))
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
}

/// Kokoro on the backend it was loaded with, on a thread of its own.
pub struct TextToSpeech {
    model: Resident<Box<dyn Speak>>,
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

#[cfg(test)]
mod tests {
    use super::Resident;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A value that is not `Send` (an `Rc`) lives on its thread and serves calls from
    /// others, in order; a panic in a call reaches the caller and the value stays usable;
    /// a load error comes back from `spawn`.
    #[test]
    fn a_resident_value_serves_calls_from_any_thread() {
        let r =
            Resident::spawn("test", || Ok::<_, std::io::Error>(Rc::new(Cell::new(0u32)))).unwrap();
        let here = std::thread::current().id();
        let there = r.call(|_| std::thread::current().id());
        assert_ne!(here, there);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..25 {
                        r.call(|c| c.set(c.get() + 1));
                    }
                });
            }
        });
        assert_eq!(r.call(|c| c.get()), 100);
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.call(|_| -> u32 { panic!("inside") })
        }));
        assert!(p.is_err());
        assert_eq!(r.call(|c| c.get()), 100);
        let e = Resident::<u8>::spawn("test", || Err(std::io::Error::other("no model")));
        assert_eq!(e.err().unwrap().to_string(), "no model");
    }

    /// Streamed items arrive in order on the caller's thread; once the reader says stop,
    /// the producer is told (emit returns false) and the call still returns.
    #[test]
    fn a_stream_stops_when_its_reader_does() {
        let r = Resident::spawn("test", || Ok::<_, std::io::Error>(())).unwrap();
        let mut got = Vec::new();
        let made = r.stream(
            |_, emit: &mut dyn FnMut(u32) -> bool| {
                let mut made = 0;
                for i in 0..1000 {
                    made += 1;
                    if !emit(i) {
                        break;
                    }
                }
                made
            },
            &mut |i| {
                got.push(i);
                got.len() < 5
            },
        );
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        // The producer may run up to the channel's depth past the stop, not to the end.
        assert!((5..=8).contains(&made), "{made}");
    }
}
