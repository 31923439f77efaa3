//! The audio routes: `POST /v1/audio/transcriptions` (Whisper), `POST /v1/audio/speech`
//! (Kokoro, streamed sentence by sentence) and `POST /v1/audio/chat` (speech in, speech out:
//! [`kiln_runtime::voice`]'s pipeline, streamed).
//!
//! Whisper and Kokoro each live on a thread of their own, on the device the server was
//! given ([`kiln_runtime::speech`]: one request at a time per model), called from tokio's
//! blocking threads; audio leaves through a bounded channel as each sentence is ready, so
//! the async workers only move bytes.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_audio::encode::{Compressed, StreamEncoder};
use kiln_runtime::speech::{SpeechToText, TextToSpeech};
use kiln_runtime::tts::{pcm16, wav_header, TtsError, SAMPLE_RATE as TTS_RATE};
use kiln_runtime::voice::{Voice, VoiceError, VoiceEvent, VoiceOptions};
use kiln_runtime::whisper::{output, TranscribeOptions, WhisperError};
use kiln_runtime::{GenerateOptions, SamplerConfig};
use kiln_text::speech::sentences;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::{json_response, parse, read_body, ApiError, AppState};

/// Speech models beside the LLM; either may be absent (its routes then answer 404).
pub struct AudioModels {
    /// Whisper: the id clients name, the model.
    pub stt: Option<(String, Arc<SpeechToText>)>,
    /// Kokoro: the id, the model, its voices (the first is the default).
    pub tts: Option<(String, Arc<TextToSpeech>, Vec<String>)>,
    /// Largest upload (multipart body) in bytes for the audio-in routes.
    pub max_upload: usize,
    /// Longest audio, in seconds, the audio-in routes take (after decoding).
    pub max_audio_secs: f64,
    /// Silero VAD for live transcription (`/v1/audio/live`): where utterances end.
    pub vad: Option<Arc<kiln_models::vad::SileroVad>>,
}

impl Default for AudioModels {
    fn default() -> Self {
        AudioModels {
            stt: None,
            tts: None,
            max_upload: 25 << 20,
            max_audio_secs: 3600.0,
            vad: None,
        }
    }
}

/// OpenAI's names for its own models, accepted in `model` as the loaded one.
const STT_ALIASES: &[&str] = &["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"];
const TTS_ALIASES: &[&str] = &["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];
/// OpenAI's voices: they name the server's default voice.
const OPENAI_VOICES: &[&str] = &[
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
];
/// Longest `input` of a speech request, in characters (OpenAI's limit).
const MAX_INPUT: usize = 4096;

fn no_model(what: &str, flag: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("this server has no {what} model (start kiln serve with {flag} MODEL)"),
    )
    .param("model")
    .code("model_not_found")
}

fn check_model(given: Option<&str>, id: &str, aliases: &[&str]) -> Result<(), ApiError> {
    match given {
        None => Ok(()),
        Some(m) if m == id || aliases.contains(&m) => Ok(()),
        Some(m) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model '{m}' does not exist (this route serves '{id}')"),
        )
        .param("model")
        .code("model_not_found")),
    }
}

impl AppState {
    fn stt(&self) -> Result<(&str, Arc<SpeechToText>), ApiError> {
        let (id, m) = self
            .audio
            .stt
            .as_ref()
            .ok_or_else(|| no_model("speech-to-text", "--stt"))?;
        Ok((id, m.clone()))
    }

    fn tts(&self) -> Result<(&str, Arc<TextToSpeech>), ApiError> {
        let (id, m, _) = self
            .audio
            .tts
            .as_ref()
            .ok_or_else(|| no_model("text-to-speech", "--tts"))?;
        Ok((id, m.clone()))
    }

    /// A voice the TTS model has: one of its own, an OpenAI name (the default), or none given
    /// (the default).
    fn voice(&self, name: Option<&str>) -> Result<String, ApiError> {
        let voices = self.audio.tts.as_ref().map_or(&[][..], |t| &t.2[..]);
        let default = voices.first().cloned().unwrap_or_default();
        match name {
            None => Ok(default),
            Some(v) if voices.iter().any(|k| k == v) => Ok(v.to_string()),
            Some(v) if OPENAI_VOICES.contains(&v) => Ok(default),
            Some(v) => Err(ApiError::invalid(format!(
                "unknown voice '{v}' (voices: {})",
                voices.join(", ")
            ))
            .param("voice")),
        }
    }
}

/// A multipart form: its text fields and its `file`.
struct Form {
    fields: Vec<(String, String)>,
    file: Option<(String, Bytes)>,
}

impl Form {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// A field this route does not take is a 400 that names it (OpenAI's fields it has no
    /// use for are refused too: nothing is silently ignored).
    fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        match self
            .fields
            .iter()
            .find(|(k, _)| !known.contains(&k.strip_suffix("[]").unwrap_or(k)))
        {
            None => Ok(()),
            Some((k, _)) => Err(ApiError::invalid(format!(
                "unknown or unsupported field '{k}' (this route takes {})",
                known.join(", ")
            ))
            .param(k)),
        }
    }

    /// Every value of a repeated field (`timestamp_granularities[]`).
    fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(k, _)| k == name || k.strip_suffix("[]") == Some(name))
            .map(|(_, v)| v.trim())
            .collect()
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::invalid(format!("{name} must be a number, got '{v}'")).param(name)
                })
            })
            .transpose()
    }

    fn file(&self) -> Result<(&str, &Bytes), ApiError> {
        match &self.file {
            Some((n, b)) => Ok((n, b)),
            None => {
                Err(ApiError::invalid("the form has no 'file' field (the audio)").param("file"))
            }
        }
    }
}

/// Reads a multipart/form-data body of at most `limit` bytes.
async fn read_form(req: axum::extract::Request, limit: usize) -> Result<Form, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, limit).await?;
    let req = axum::extract::Request::from_parts(parts, Body::from(bytes));
    let mut mp = Multipart::from_request(req, &()).await.map_err(|e| {
        ApiError::invalid(format!(
            "expected a multipart/form-data body (as OpenAI's audio routes take): {e}"
        ))
    })?;
    let bad = |e: axum::extract::multipart::MultipartError| {
        ApiError::invalid(format!("reading the form: {}", e.body_text()))
    };
    let mut form = Form {
        fields: Vec::new(),
        file: None,
    };
    while let Some(f) = mp.next_field().await.map_err(bad)? {
        let name = f.name().unwrap_or("").to_string();
        if name == "file" {
            let fname = f.file_name().unwrap_or("upload").to_string();
            form.file = Some((fname, f.bytes().await.map_err(bad)?));
        } else {
            let v = f.text().await.map_err(bad)?;
            form.fields.push((name, v));
        }
    }
    Ok(form)
}

/// 16 kHz mono samples of an uploaded file, refused (400) past `max_secs` of audio.
fn decode_limited(name: &str, bytes: &[u8], max_secs: f64) -> Result<Vec<f32>, ApiError> {
    let samples =
        decode_upload(name, bytes).map_err(|e| ApiError::invalid(e.to_string()).param("file"))?;
    let secs = samples.len() as f64 / 16_000.0;
    if secs > max_secs {
        return Err(ApiError::invalid(format!(
            "{name}: {secs:.1} s of audio; this server takes at most {max_secs:.0} s (--max-audio)"
        ))
        .param("file"));
    }
    Ok(samples)
}

/// 16 kHz mono samples of an uploaded file (`name` hints the format and names errors).
fn decode_upload(name: &str, bytes: &[u8]) -> Result<Vec<f32>, kiln_audio::AudioError> {
    let ext = Path::new(name).extension().and_then(|e| e.to_str());
    let d = kiln_audio::decode_bytes(bytes.to_vec(), ext, Path::new(name))?;
    Ok(kiln_audio::to_16k_mono(d)?.samples)
}

fn internal(msg: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        msg.to_string(),
    )
}

impl From<WhisperError> for ApiError {
    fn from(e: WhisperError) -> Self {
        match e {
            WhisperError::Audio(a) => ApiError::invalid(a.to_string()).param("file"),
            WhisperError::Input(m) => ApiError::invalid(m),
            e => internal(e),
        }
    }
}

impl From<TtsError> for ApiError {
    fn from(e: TtsError) -> Self {
        match e {
            TtsError::UnknownVoice { .. } => ApiError::invalid(e.to_string()).param("voice"),
            TtsError::Input(_) | TtsError::Empty | TtsError::G2p(_) => {
                ApiError::invalid(e.to_string()).param("input")
            }
            e => internal(e),
        }
    }
}

impl From<VoiceError> for ApiError {
    fn from(e: VoiceError) -> Self {
        match e {
            VoiceError::Stt(e) => e.into(),
            VoiceError::NoSpeech => ApiError::invalid(e.to_string()).param("file"),
            VoiceError::Llm(e) => e.into(),
            VoiceError::Tts(e) => e.into(),
            VoiceError::QueueFull => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                e.to_string(),
            )
            .code("queue_full"),
            VoiceError::EngineStopped => crate::engine_gone(),
        }
    }
}

/// Runs `f` on a blocking thread; a panic there is a 500, not a dead server.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(internal(format!("internal error: {e}"))))
}

pub async fn transcriptions(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
) -> Response {
    audio_to_text(st, req, false).await
}

/// OpenAI's translations: the speech of the file, in whatever language, written in English
/// (Whisper's translate task; a multilingual model). `language` may name the spoken one.
pub async fn translations(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
) -> Response {
    audio_to_text(st, req, true).await
}

async fn audio_to_text(
    st: Arc<AppState>,
    req: axum::extract::Request,
    translate: bool,
) -> Response {
    let res = async {
        let (id, stt) = st.stt()?;
        let form = read_form(req, st.audio.max_upload).await?;
        check_model(form.get("model"), id, STT_ALIASES)?;
        form.only(&[
            "model",
            "response_format",
            "language",
            "prompt",
            "temperature",
            "timestamp_granularities",
            "stream",
        ])?;
        let format = form.get("response_format").unwrap_or("json").to_string();
        if !["json", "text", "srt", "vtt", "verbose_json"].contains(&format.as_str()) {
            return Err(ApiError::invalid(format!(
                "response_format '{format}' is not supported (json, text, srt, vtt, verbose_json)"
            ))
            .param("response_format"));
        }
        let mut o = TranscribeOptions {
            language: form.get("language").map(str::to_string),
            initial_prompt: form.get("prompt").map(str::to_string),
            translate,
            ..Default::default()
        };
        // OpenAI's granularities: words need verbose_json (segments are always there).
        for g in form.all("timestamp_granularities") {
            match g {
                "word" if format == "verbose_json" => o.word_timestamps = true,
                "word" => {
                    return Err(ApiError::invalid(
                        "timestamp_granularities word needs response_format verbose_json",
                    )
                    .param("timestamp_granularities"))
                }
                "segment" => {}
                g => {
                    return Err(ApiError::invalid(format!(
                        "timestamp_granularities '{g}' is not one of word, segment"
                    ))
                    .param("timestamp_granularities"))
                }
            }
        }
        match form.number::<f32>("temperature")? {
            Some(t) if !(0.0..=1.0).contains(&t) => {
                return Err(ApiError::invalid(format!(
                    "temperature must be between 0 and 1, got {t}"
                ))
                .param("temperature"))
            }
            // 0: greedy with fallback to higher temperatures (OpenAI's meaning).
            Some(t) if t > 0.0 => o.temperatures = vec![t],
            _ => {}
        }
        let stream = match form.get("stream") {
            None | Some("false") => false,
            Some("true") => true,
            Some(v) => {
                return Err(
                    ApiError::invalid(format!("stream must be true or false, got '{v}'"))
                        .param("stream"),
                )
            }
        };
        let (name, bytes) = form.file()?;
        let (name, bytes) = (name.to_string(), bytes.clone());
        let max_secs = st.audio.max_audio_secs;
        if stream {
            if !["json", "text"].contains(&format.as_str()) {
                return Err(ApiError::invalid(format!(
                    "stream: response_format '{format}' cannot be streamed (json or text)"
                ))
                .param("stream"));
            }
            // Decoded before the stream starts: a bad file is still a 400.
            let samples = blocking(move || decode_limited(&name, &bytes, max_secs)).await?;
            return Ok(transcript_stream(stt, samples, o));
        }
        let t = blocking(move || {
            let samples = decode_limited(&name, &bytes, max_secs)?;
            Ok(stt.transcribe(&samples, &o)?)
        })
        .await?;
        let text = |body: String, ty: &'static str| {
            (StatusCode::OK, [(header::CONTENT_TYPE, ty)], body).into_response()
        };
        Ok(match format.as_str() {
            "text" => text(format!("{}\n", t.text.trim()), "text/plain; charset=utf-8"),
            "srt" => text(output::srt(&t), "text/plain; charset=utf-8"),
            "vtt" => text(output::vtt(&t), "text/vtt; charset=utf-8"),
            "verbose_json" => {
                let task = if translate { "translate" } else { "transcribe" };
                json_response(StatusCode::OK, &output::openai_verbose(&t, task))
            }
            _ => json_response(StatusCode::OK, &json!({"text": t.text.trim()})),
        })
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

/// A transcription as server-sent events, as OpenAI streams them: one
/// `transcript.text.delta` per segment as its window is decoded, then
/// `transcript.text.done` with the whole text (or an `error` event).
fn transcript_stream(stt: Arc<SpeechToText>, samples: Vec<f32>, o: TranscribeOptions) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let seg_tx = tx.clone();
    std::thread::spawn(move || {
        let mut first = true;
        let r = stt.transcribe_each(&samples, &o, move |t| {
            // Segments carry their leading space; the stream's text starts without it.
            let t = if first { t.trim_start() } else { t };
            first = false;
            let ev = json!({"type": "transcript.text.delta", "delta": t});
            let _ = seg_tx.send(format!("data: {ev}\n\n"));
        });
        let ev = match r {
            Ok(t) => json!({"type": "transcript.text.done", "text": t.text.trim()}),
            Err(e) => ApiError::from(e).body(),
        };
        let _ = tx.send(format!("data: {ev}\n\n"));
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let e = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(e)), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct SpeechRequest {
    model: Option<String>,
    input: String,
    voice: Option<String>,
    speed: Option<f32>,
    response_format: Option<String>,
    /// "audio" (the audio's bytes as they are made, as every response here is); "sse" is
    /// refused.
    stream_format: Option<String>,
    /// Anything else (OpenAI's `instructions`, a misspelt field) is refused by name.
    #[serde(flatten)]
    extra: serde_json::Map<String, serde_json::Value>,
}

/// Audio out: WAV (24 kHz mono 16-bit, the length unknown while streaming), FLAC (the
/// same samples, lossless) or Ogg Opus, both encoded as the samples come, or raw PCM.
#[derive(Clone, Copy)]
enum AudioFormat {
    Wav,
    Encoded(Compressed),
    Pcm,
}

fn audio_format(f: Option<&str>) -> Result<AudioFormat, ApiError> {
    match f {
        None | Some("wav") => Ok(AudioFormat::Wav),
        Some("flac") => Ok(AudioFormat::Encoded(Compressed::Flac)),
        Some("opus") => Ok(AudioFormat::Encoded(Compressed::Opus)),
        Some("pcm") => Ok(AudioFormat::Pcm),
        Some(f) => Err(ApiError::invalid(format!(
            "response_format '{f}' is not supported (wav, flac, opus, pcm: 24 kHz mono 16-bit)"
        ))
        .param("response_format")),
    }
}

/// Encoded bytes of PCM bytes (s16le), as they arrive.
fn encoded(e: &mut StreamEncoder, pcm: &[u8]) -> std::io::Result<Vec<u8>> {
    e.push_s16le(pcm).map_err(std::io::Error::other)
}

fn speed(s: Option<f32>) -> Result<f32, ApiError> {
    match s {
        None => Ok(1.0),
        Some(s) if (0.25..=4.0).contains(&s) => Ok(s),
        Some(s) => Err(
            ApiError::invalid(format!("speed must be between 0.25 and 4, got {s}")).param("speed"),
        ),
    }
}

/// What a synthesis thread sends the response: audio bytes as each sentence is ready.
enum Msg {
    Transcript(String),
    Text,
    Audio(Vec<u8>),
    Done(Box<kiln_runtime::voice::VoiceStats>),
    Error(ApiError),
}

/// A streamed audio body: the WAV header (for WAV), `first`, then what `rx` brings. An
/// error after the first bytes ends the body early (the client sees a cut stream).
fn audio_body(
    format: AudioFormat,
    first: Vec<u8>,
    rx: mpsc::Receiver<Msg>,
    t0: Instant,
    route: &'static str,
) -> Body {
    let mut enc = match format {
        AudioFormat::Encoded(c) => match StreamEncoder::new(c, TTS_RATE) {
            Ok(e) => Some(e),
            Err(e) => {
                let e = std::io::Error::other(format!("{c:?}: {e}"));
                return Body::from_stream(futures_util::stream::iter([Err::<Bytes, _>(e)]));
            }
        },
        _ => None,
    };
    let mut head = match (format, &mut enc) {
        (AudioFormat::Wav, _) => wav_header(u32::MAX - 36).to_vec(),
        (_, Some(e)) => e.header(),
        _ => Vec::new(),
    };
    match &mut enc {
        Some(e) => match encoded(e, &first) {
            Ok(b) => head.extend(b),
            Err(e) => eprintln!("kiln serve: {route}: encoding: {e}"),
        },
        None => head.extend_from_slice(&first),
    }
    let state = (Some(head), rx, enc);
    let stream = futures_util::stream::unfold(state, move |(head, mut rx, mut enc)| async move {
        if let Some(h) = head {
            return Some((Ok(Bytes::from(h)), (None, rx, enc)));
        }
        loop {
            let Some(msg) = rx.recv().await else {
                // The end: FLAC's last, shorter frame; Opus's last pages.
                let e = enc.take()?;
                let last = e.finish().map(|(b, _)| b).map_err(std::io::Error::other);
                return Some((last.map(Bytes::from), (None, rx, None)));
            };
            match msg {
                Msg::Audio(b) => {
                    let b = match &mut enc {
                        Some(e) => match encoded(e, &b) {
                            Ok(b) if b.is_empty() => continue,
                            Ok(b) => b,
                            Err(e) => return Some((Err(e), (None, rx, None))),
                        },
                        None => b,
                    };
                    return Some((Ok(Bytes::from(b)), (None, rx, enc)));
                }
                Msg::Done(s) => {
                    eprintln!(
                        "kiln serve: {route}: STT {:.0} ms | TTFT {:.0} ms | first audio {:.0} ms | total {:.0} ms ({:.0} ms in all) | {:.2} s of speech, {} sentence(s) | heard {:?} | said {:?}",
                        s.stt_ms, s.ttft_ms, s.first_audio_ms, s.total_ms,
                        t0.elapsed().as_secs_f64() * 1e3, s.audio_s, s.sentences,
                        s.transcript, s.reply
                    );
                }
                Msg::Error(e) => {
                    eprintln!("kiln serve: {route}: failed mid-stream: {}", e.message);
                    return Some((Err(std::io::Error::other(e.message)), (None, rx, None)));
                }
                Msg::Transcript(_) | Msg::Text => {}
            }
        }
    });
    Body::from_stream(stream)
}

fn content_type(f: AudioFormat) -> &'static str {
    match f {
        AudioFormat::Wav => "audio/wav",
        AudioFormat::Encoded(c) => c.content_type(),
        AudioFormat::Pcm => "audio/pcm",
    }
}

pub async fn speech(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let (id, tts) = st.tts()?;
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: SpeechRequest = parse(&bytes)?;
        crate::api::check_unknown(&req.extra, "")?;
        if let Some(f) = req.stream_format.as_deref().filter(|&f| f != "audio") {
            return Err(ApiError::invalid(format!(
                "stream_format '{f}' is not supported (audio: the bytes as they are made)"
            ))
            .param("stream_format"));
        }
        check_model(req.model.as_deref(), id, TTS_ALIASES)?;
        let format = audio_format(req.response_format.as_deref())?;
        let speed = speed(req.speed)?;
        let voice = st.voice(req.voice.as_deref())?;
        let n = req.input.chars().count();
        if req.input.trim().is_empty() {
            return Err(ApiError::invalid("input must not be empty").param("input"));
        }
        if n > MAX_INPUT {
            return Err(ApiError::invalid(format!(
                "input is {n} characters; at most {MAX_INPUT} are allowed"
            ))
            .param("input"));
        }
        let t0 = Instant::now();
        // The whole input is phonemized before any audio is made: an input that cannot be
        // spoken is a 400 here, never a stream cut off after its first sentences.
        let input = req.input;
        let phonemes = {
            let (tts, voice) = (tts.clone(), voice.clone());
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                for sentence in sentences(&input) {
                    match tts.phonemes(&sentence, &voice) {
                        Ok(p) => out.push(p),
                        // Nothing to pronounce in this sentence (symbols only).
                        Err(TtsError::Empty) => continue,
                        Err(e) => return Err(ApiError::from(e)),
                    }
                }
                if out.is_empty() {
                    let e = TtsError::Input("nothing to say: the input has no words".into());
                    return Err(e.into());
                }
                Ok(out)
            })
            .await
            .map_err(|e| internal(format!("phonemizing: {e}")))??
        };
        let (tx, mut rx) = mpsc::channel::<Msg>(8);
        // Sentence by sentence, one sentence a call to the model (other requests
        // interleave) and never while waiting on a slow client.
        tokio::task::spawn_blocking(move || {
            for sentence in phonemes {
                let mut pcm = Vec::new();
                let res = tts.speak(&sentence.join("\n"), true, &voice, speed, &mut |s| {
                    pcm.extend(pcm16(s));
                    Ok(())
                });
                if let Err(e) = res {
                    let _ = tx.blocking_send(Msg::Error(e.into()));
                    return;
                }
                if tx.blocking_send(Msg::Audio(pcm)).is_err() {
                    return; // the client left
                }
            }
        });
        let first = match rx.recv().await {
            Some(Msg::Audio(b)) => b,
            Some(Msg::Error(e)) => return Err(e),
            _ => return Err(internal("speech synthesis stopped before any audio")),
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut resp = Response::new(audio_body(format, first, rx, t0, "/v1/audio/speech"));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(format)),
        );
        put(h, "x-kiln-first-audio-ms", &format!("{ms:.0}"));
        Ok(resp)
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

fn put(h: &mut HeaderMap, name: &'static str, v: &str) {
    if let Ok(v) = HeaderValue::from_str(v) {
        h.insert(HeaderName::from_static(name), v);
    }
}

/// Percent-encodes what a header value cannot hold (non-ASCII, controls, `%`).
fn header_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `POST /v1/audio/chat`: a multipart form with `file` (the user's speech) and optional
/// `system`, `voice`, `speed`, `response_format` (wav, pcm), `max_tokens`, `temperature`,
/// `first_words` (see [`VoiceOptions::first_words`]), `model` (the LLM). Answers with streamed speech; headers carry the transcript
/// (`x-kiln-transcript`, percent-encoded) and the STT, time-to-first-token and
/// first-audio latencies; the server logs the whole turn when it ends.
pub async fn chat(State(st): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    let res = async {
        let (_, stt) = st.stt()?;
        let (_, tts) = st.tts()?;
        let form = read_form(req, st.audio.max_upload).await?;
        st.check_model(form.get("model"))?;
        form.only(&[
            "model",
            "response_format",
            "voice",
            "speed",
            "max_tokens",
            "temperature",
            "system",
            "first_words",
        ])?;
        let format = audio_format(form.get("response_format"))?;
        let voice = st.voice(form.get("voice"))?;
        let speed = speed(form.number("speed")?)?;
        let max_tokens = match form.number::<i64>("max_tokens")? {
            None => 128,
            Some(n) if n >= 1 => n as usize,
            Some(n) => {
                return Err(
                    ApiError::invalid(format!("max_tokens must be at least 1, got {n}"))
                        .param("max_tokens"),
                )
            }
        };
        let temperature = match form.number::<f32>("temperature")? {
            None => 0.0,
            Some(t) if (0.0..=2.0).contains(&t) => t,
            Some(t) => {
                return Err(ApiError::invalid(format!(
                    "temperature must be between 0 and 2, got {t}"
                ))
                .param("temperature"))
            }
        };
        let opts = VoiceOptions {
            system: form.get("system").map(str::to_string),
            voice,
            speed,
            generate: GenerateOptions {
                max_tokens,
                stop: Vec::new(),
                sampler: SamplerConfig {
                    temperature,
                    seed: st.seed(),
                    ..Default::default()
                },
                ..Default::default()
            },
            transcribe: TranscribeOptions::default(),
            first_clause: true,
            first_words: form.number("first_words")?.unwrap_or(0),
        };
        let (name, bytes) = form.file()?;
        let (name, bytes) = (name.to_string(), bytes.clone());
        let t0 = Instant::now();
        let (tx, mut rx) = mpsc::channel::<Msg>(8);
        let state = st.clone();
        tokio::task::spawn_blocking(move || {
            let samples = match decode_limited(&name, &bytes, state.audio.max_audio_secs) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.blocking_send(Msg::Error(e));
                    return;
                }
            };
            let pipeline = Voice {
                stt: &stt,
                llm: &state.sched,
                tts: &tts,
            };
            let mut first_text = true;
            let res = pipeline.converse(&samples, &opts, &mut |ev| {
                let m = match ev {
                    VoiceEvent::Transcript(t) => Msg::Transcript(t.to_string()),
                    VoiceEvent::Text(_) if first_text => {
                        first_text = false;
                        Msg::Text
                    }
                    VoiceEvent::Audio(s) => Msg::Audio(pcm16(s)),
                    VoiceEvent::Text(_) | VoiceEvent::Sentence(_) => return true,
                };
                tx.blocking_send(m).is_ok()
            });
            let _ = tx.blocking_send(match res {
                Ok(s) => Msg::Done(Box::new(s)),
                Err(e) => Msg::Error(e.into()),
            });
        });
        // The head waits for the first audio: errors before it are still status codes.
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let (mut transcript, mut stt_ms, mut ttft_ms) = (String::new(), 0.0, 0.0);
        let mut done = None;
        let first = loop {
            match rx.recv().await {
                Some(Msg::Transcript(t)) => {
                    stt_ms = ms(t0);
                    transcript = t;
                }
                Some(Msg::Text) => ttft_ms = ms(t0),
                Some(Msg::Audio(b)) => break b,
                Some(Msg::Done(s)) => {
                    done = Some(s);
                    break Vec::new();
                }
                Some(Msg::Error(e)) => return Err(e),
                None => return Err(internal("the voice pipeline stopped before any audio")),
            }
        };
        let first_audio_ms = ms(t0);
        let mut resp = if let Some(s) = done {
            // A reply with nothing to say: an empty stream.
            eprintln!(
                "kiln serve: /v1/audio/chat: no speech in the reply {:?}",
                s.reply
            );
            let mut b = match format {
                AudioFormat::Wav => wav_header(0).to_vec(),
                AudioFormat::Encoded(c) => {
                    let mut e = StreamEncoder::new(c, TTS_RATE).map_err(internal)?;
                    let mut b = e.header();
                    b.extend(e.finish().map_err(internal)?.0);
                    b
                }
                AudioFormat::Pcm => Vec::new(),
            };
            b.extend_from_slice(&first);
            Response::new(Body::from(b))
        } else {
            Response::new(audio_body(format, first, rx, t0, "/v1/audio/chat"))
        };
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(format)),
        );
        put(h, "x-kiln-transcript", &header_text(&transcript));
        put(h, "x-kiln-stt-ms", &format!("{stt_ms:.0}"));
        put(h, "x-kiln-ttft-ms", &format!("{ttft_ms:.0}"));
        put(h, "x-kiln-first-audio-ms", &format!("{first_audio_ms:.0}"));
        Ok(resp)
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_escapes() {
        assert_eq!(header_text("ask not, 100%"), "ask not, 100%25");
        assert_eq!(header_text("café\n"), "caf%C3%A9%0A");
    }

    #[test]
    fn formats_and_speed() {
        assert!(matches!(audio_format(None), Ok(AudioFormat::Wav)));
        assert!(matches!(audio_format(Some("pcm")), Ok(AudioFormat::Pcm)));
        let e = audio_format(Some("mp3")).err().unwrap();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("'mp3'"), "{}", e.message);
        assert_eq!(speed(Some(4.0)).unwrap(), 4.0);
        assert!(speed(Some(0.1)).is_err() && speed(Some(f32::NAN)).is_err());
    }
}

/// Query of `/v1/audio/live`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveQuery {
    /// The silence that ends an utterance (default 700).
    end_silence_ms: Option<u32>,
    /// Spoken language (multilingual models; default: detected per utterance).
    language: Option<String>,
}

/// Live transcription over a WebSocket: the client sends binary messages of raw s16le
/// 16 kHz mono PCM as it records, and a text message `{"type": "end"}` (or closes) when it
/// stops; the server sends `{"type": "partial", "start", "text"}` as an utterance grows,
/// `{"type": "final", "start", "end", "text"}` when its speaker goes quiet, `{"type":
/// "error", "message"}` for a message it cannot take, and `{"type": "done"}` last.
pub async fn live(
    State(st): State<Arc<AppState>>,
    query: Result<axum::extract::Query<LiveQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Response {
    let res = (|| {
        let (_, stt) = st.stt()?;
        let vad = st
            .audio
            .vad
            .clone()
            .ok_or_else(|| no_model("voice activity detection", "silero-vad"))?;
        let q = query.map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))?;
        let ws = ws.map_err(|e| {
            ApiError::invalid(format!(
                "/v1/audio/live is a WebSocket (connect with ws://, an Upgrade request): {}",
                e.body_text()
            ))
        })?;
        let o = kiln_runtime::live::LiveOptions {
            end_silence_ms: q.end_silence_ms.unwrap_or(700).clamp(100, 10_000),
            ..Default::default()
        };
        let topts = TranscribeOptions {
            language: q.language.clone(),
            vad: kiln_runtime::whisper::Vad::Off,
            condition_on_previous_text: false,
            ..Default::default()
        };
        Ok::<_, ApiError>(ws.on_upgrade(move |socket| live_session(socket, stt, vad, o, topts)))
    })();
    res.unwrap_or_else(IntoResponse::into_response)
}

async fn live_session(
    mut socket: axum::extract::ws::WebSocket,
    stt: Arc<SpeechToText>,
    vad: Arc<kiln_models::vad::SileroVad>,
    o: kiln_runtime::live::LiveOptions,
    topts: TranscribeOptions,
) {
    use axum::extract::ws::Message;
    use kiln_runtime::live::{Live, LiveEvent};
    let (audio_tx, audio_rx) = std::sync::mpsc::channel::<Vec<f32>>();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<serde_json::Value>();
    // The VAD and Whisper on a thread of their own: the socket keeps reading meanwhile.
    std::thread::spawn(move || {
        let mut live = Live::new(vad, o);
        let mut transcribe = |s: &[f32]| stt.transcribe(s, &topts).map(|t| t.text);
        let tx = ev_tx.clone();
        let mut on = |e: LiveEvent| {
            let v = match e {
                LiveEvent::Partial { start, text } => {
                    json!({"type": "partial", "start": start, "text": text})
                }
                LiveEvent::Final { start, end, text } => {
                    json!({"type": "final", "start": start, "end": end, "text": text})
                }
            };
            let _ = tx.send(v);
        };
        let mut failed = None;
        for samples in audio_rx {
            if let Err(e) = live.push(&samples, &mut transcribe, &mut on) {
                failed = Some(e);
                break;
            }
        }
        if failed.is_none() {
            failed = live.finish(&mut transcribe, &mut on).err();
        }
        if let Some(e) = failed {
            let _ = ev_tx.send(json!({"type": "error", "message": e.to_string()}));
        }
        let _ = ev_tx.send(json!({"type": "done"}));
    });
    let mut audio_tx = Some(audio_tx);
    let mut carry: Option<u8> = None;
    loop {
        tokio::select! {
            msg = socket.recv(), if audio_tx.is_some() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let mut bytes: Vec<u8> = carry.take().into_iter().collect();
                    bytes.extend_from_slice(&b);
                    if bytes.len() % 2 == 1 {
                        carry = bytes.pop();
                    }
                    let samples: Vec<f32> = bytes
                        .chunks_exact(2)
                        .map(|p| i16::from_le_bytes([p[0], p[1]]) as f32 / 32768.0)
                        .collect();
                    if let Some(tx) = &audio_tx {
                        let _ = tx.send(samples);
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let end = serde_json::from_str::<serde_json::Value>(t.as_str())
                        .ok()
                        .is_some_and(|v| v["type"] == "end");
                    if end {
                        audio_tx = None;
                    } else {
                        let e = json!({"type": "error", "message": "text messages are {\"type\": \"end\"}; audio goes in binary messages (s16le 16 kHz mono)"});
                        if socket.send(Message::Text(e.to_string().into())).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => audio_tx = None,
                Some(Ok(_)) => {}
            },
            ev = ev_rx.recv() => match ev {
                Some(v) => {
                    let done = v["type"] == "done";
                    if socket.send(Message::Text(v.to_string().into())).await.is_err() {
                        return;
                    }
                    if done {
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                }
                None => return,
            },
        }
    }
}
