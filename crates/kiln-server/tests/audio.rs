//! The audio routes over real HTTP, with SmolLM2-135M-Instruct, whisper-tiny.en and
//! Kokoro-82M: transcriptions of jfk.wav; a non-audio upload is a 400 and the server keeps
//! serving; speech validates its input (empty input: 400) and streams one chunk per
//! sentence; audio/chat turns jfk.wav into a spoken reply.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::speech::{SpeechToText, TextToSpeech};
use kiln_runtime::tts::Tts;
use kiln_runtime::whisper::Stt;
use kiln_runtime::{Llm, Scheduler, SchedulerConfig};
use kiln_server::{AppState, AudioModels, ServerConfig};
use serde_json::{json, Value};

const JFK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/assets/audio/jfk.wav"
);
const PHRASE: &str = "ask not what your country can do for you";

fn resolve(name: &str) -> std::path::PathBuf {
    kiln_assets::resolve(name, &mut |_| {}).unwrap()
}

/// One server for every test: 2 slots, the three models.
fn server() -> SocketAddr {
    static S: OnceLock<SocketAddr> = OnceLock::new();
    *S.get_or_init(|| {
        let t = default_threads();
        let llm = resolve("smollm2-135m-instruct");
        let sched = Scheduler::spawn(
            SchedulerConfig {
                slots: 2,
                n_ctx: 1024,
                ..Default::default()
            },
            move || Llm::load(CpuBackend::new(t), &llm),
        )
        .unwrap();
        // Each on a thread of its own, as `kiln serve` runs them.
        let stt = SpeechToText::spawn(move || {
            Stt::load(
                CpuBackend::new(t),
                &resolve("whisper-tiny.en"),
                Default::default(),
            )
        })
        .unwrap();
        let tts = TextToSpeech::spawn(move || {
            // Without espeak-ng whatever this machine has: the inputs below are checked
            // against the front end machines without it run.
            Tts::load(&resolve("kokoro-82m"), Some(&resolve("misaki-en-us")), t).map(|t| {
                t.with_british_lexicons(&resolve("misaki-en-gb"))
                    .without_espeak()
            })
        })
        .unwrap();
        let voices: Vec<String> = tts.voices().map(str::to_string).collect();
        let audio = AudioModels {
            stt: Some(("whisper-tiny.en".into(), Arc::new(stt))),
            tts: Some(("kokoro-82m".into(), Arc::new(tts), voices)),
            max_upload: 4 << 20,
            max_audio_secs: 60.0,
            vad: Some(Arc::new(
                kiln_models::vad::SileroVad::load(&resolve("silero-vad")).unwrap(),
            )),
        };
        let cfg = ServerConfig {
            model_id: "smollm2-135m-instruct".into(),
            api_key: None,
            max_body: 64 << 10,
        };
        let state = AppState::with_audio(sched, cfg, audio);
        common::serve_state(state)
    })
}

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
    /// Sizes of the chunks of a chunked body.
    chunks: Vec<usize>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    /// An OpenAI-style error with this status; returns its `error` object.
    fn assert_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string() && e.get("code").is_some(), "{v}");
        e
    }
}

fn http(path: &str, content_type: &str, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(server()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let headers = String::from_utf8_lossy(&raw[..at]).into_owned();
    let status = headers.split(' ').nth(1).unwrap().parse().unwrap();
    let mut rest = &raw[at + 4..];
    let (mut body, mut chunks) = (Vec::new(), Vec::new());
    if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap().trim(), 16)
                .expect("hex chunk size");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            chunks.push(n);
            rest = &rest[nl + 4 + n..];
        }
    } else {
        body = rest.to_vec();
    }
    Reply {
        status,
        headers,
        body,
        chunks,
    }
}

const BOUNDARY: &str = "kiln-test-boundary-8d1f";

/// A multipart/form-data body: text fields, then the file (if any) as field `file`.
fn form(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, v) in fields {
        b.extend(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    if let Some((name, data)) = file {
        b.extend(format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        b.extend_from_slice(data);
        b.extend(b"\r\n");
    }
    b.extend(format!("--{BOUNDARY}--\r\n").as_bytes());
    b
}

fn post_form(path: &str, fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> Reply {
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    http(path, &ct, &form(fields, file))
}

fn post_json(path: &str, v: &Value) -> Reply {
    http(path, "application/json", v.to_string().as_bytes())
}

/// Checks a streamed 24 kHz mono 16-bit WAV; returns its seconds of audio.
fn wav_seconds(b: &[u8]) -> f64 {
    assert!(b.len() > 44, "{} bytes", b.len());
    assert_eq!(&b[..4], b"RIFF");
    assert_eq!(&b[8..16], b"WAVEfmt ");
    assert_eq!(u16::from_le_bytes([b[22], b[23]]), 1, "mono");
    assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 24_000);
    assert_eq!(u16::from_le_bytes([b[34], b[35]]), 16, "16-bit");
    assert_eq!(&b[36..40], b"data");
    let loud = b[44..]
        .chunks_exact(2)
        .filter(|c| i16::from_le_bytes([c[0], c[1]]).unsigned_abs() > 1000)
        .count();
    assert!(loud > 1000, "near-silent audio ({loud} loud samples)");
    (b.len() - 44) as f64 / 48_000.0
}

fn words(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .collect()
}

#[test]
fn non_audio_upload_is_400_and_the_server_keeps_serving() {
    let path = "/v1/audio/transcriptions";
    let e = post_form(
        path,
        &[("model", "whisper-1")],
        Some(("notes.txt", b"hello")),
    )
    .assert_error(400);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("not a supported audio file"),
        "{e}"
    );
    assert_eq!(e["param"], "file");
    // Empty and truncated uploads, no file at all, JSON instead of a form.
    post_form(path, &[], Some(("a.wav", b""))).assert_error(400);
    let jfk = std::fs::read(JFK).unwrap();
    post_form(path, &[], Some(("cut.wav", &jfk[..30]))).assert_error(400);
    let e = post_form(path, &[("model", "whisper-1")], None).assert_error(400);
    assert_eq!(e["param"], "file");
    post_json(path, &json!({"file": "jfk.wav"})).assert_error(400);
    let e =
        post_form(path, &[("response_format", "mp3")], Some(("jfk.wav", &jfk))).assert_error(400);
    assert_eq!(e["param"], "response_format");
    // A field the route does not take: refused by name, not ignored.
    let e = post_form(
        path,
        &[("chunking_strategy", "auto")],
        Some(("jfk.wav", &jfk)),
    )
    .assert_error(400);
    assert_eq!(e["param"], "chunking_strategy");
    let e = post_form(path, &[("model", "nope")], Some(("jfk.wav", &jfk))).assert_error(404);
    assert_eq!(e["code"], "model_not_found");
    // Larger than --max-upload: 413.
    let big = vec![0u8; 5 << 20];
    post_form(path, &[], Some(("big.wav", &big))).assert_error(413);

    // Still serving: the real file, as JSON and as SubRip.
    let r = post_form(path, &[("model", "whisper-1")], Some(("jfk.wav", &jfk)));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.json()["text"].as_str().unwrap().to_string();
    assert!(words(&text).contains(PHRASE), "{text}");
    let r = post_form(path, &[("response_format", "srt")], Some(("jfk.wav", &jfk)));
    assert_eq!(r.status, 200, "{}", r.text());
    let srt = r.text();
    assert!(srt.starts_with("1\n00:00:00,000 --> "), "{srt}");
    assert!(words(&srt).contains("ask not what your country"), "{srt}");

    // Word timestamps, as OpenAI's clients ask for them: verbose_json only.
    let r = post_form(
        path,
        &[
            ("response_format", "verbose_json"),
            ("timestamp_granularities[]", "word"),
            ("timestamp_granularities[]", "segment"),
        ],
        Some(("jfk.wav", &jfk)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ws = v["words"]
        .as_array()
        .unwrap_or_else(|| panic!("no words: {v}"));
    assert_eq!(ws.len(), 22, "{v}");
    assert_eq!(ws[4]["word"], "Americans");
    let (s4, e4) = (
        ws[4]["start"].as_f64().unwrap(),
        ws[4]["end"].as_f64().unwrap(),
    );
    assert!(
        (1.66..=1.86).contains(&s4) && (2.16..=2.36).contains(&e4),
        "{}",
        ws[4]
    );
    assert!(!v["segments"].as_array().unwrap().is_empty());
    let e = post_form(
        path,
        &[("timestamp_granularities[]", "word")],
        Some(("jfk.wav", &jfk)),
    )
    .assert_error(400);
    assert_eq!(e["param"], "timestamp_granularities");
    let e = post_form(
        path,
        &[
            ("response_format", "verbose_json"),
            ("timestamp_granularities[]", "letter"),
        ],
        Some(("jfk.wav", &jfk)),
    )
    .assert_error(400);
    assert_eq!(e["param"], "timestamp_granularities");
}

#[test]
fn speech_checks_input_and_streams_by_sentence() {
    let path = "/v1/audio/speech";
    let e = post_json(
        path,
        &json!({"model": "tts-1", "input": "", "voice": "alloy"}),
    )
    .assert_error(400);
    assert_eq!(e["param"], "input");
    post_json(path, &json!({"input": "   \n "})).assert_error(400);
    // Symbols only: nothing to pronounce.
    let e = post_json(path, &json!({"input": "*** ### ***"})).assert_error(400);
    assert!(
        e["message"].as_str().unwrap().contains("nothing to say"),
        "{e}"
    );
    let e = post_json(path, &json!({"input": "Hi.", "voice": "nobody"})).assert_error(400);
    assert!(e["message"].as_str().unwrap().contains("jf_alpha"), "{e}");
    // A voice whose language kiln has no G2P for: a 400 that says so, before any audio.
    let e = post_json(path, &json!({"input": "Hi.", "voice": "jf_alpha"})).assert_error(400);
    assert!(
        e["message"].as_str().unwrap().contains("speaks Japanese"),
        "{e}"
    );
    let e = post_json(path, &json!({"input": "Hi.", "response_format": "mp3"})).assert_error(400);
    assert_eq!(e["param"], "response_format");
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("wav, flac, opus, pcm"), "{m}");
    let e = post_json(path, &json!({"input": "Hi.", "speed": 9})).assert_error(400);
    assert_eq!(e["param"], "speed");
    // Fields the route does not take are refused by name (`instructions` was ignored).
    let e = post_json(path, &json!({"input": "Hi.", "instructions": "whisper"})).assert_error(400);
    assert_eq!(e["param"], "instructions");
    let e = post_json(path, &json!({"input": "Hi.", "stream_format": "sse"})).assert_error(400);
    assert_eq!(e["param"], "stream_format");
    post_json(path, &json!({"input": "Hi.", "model": "nope"})).assert_error(404);
    post_json(path, &json!({"input": "x".repeat(4097)})).assert_error(400);
    http(path, "application/json", b"{\"input\": ").assert_error(400);
    // A later sentence that cannot be spoken is a 400 before any audio (the connection was
    // dropped after the first sentence's audio): the whole input is phonemized first. ('中'
    // is in no English lexicon, and the neural letter-to-sound model reads Latin letters
    // only; the harness keeps espeak-ng out, which would read it as Mandarin.)
    let e = post_json(path, &json!({"input": "Good morning. Say 中 now."})).assert_error(400);
    assert_eq!(e["param"], "input");

    // Two sentences: the first leaves (with the header) before the second is synthesized.
    let r = post_json(
        path,
        &json!({"model": "kokoro-82m", "input": "Good morning. The weather is fine today.", "voice": "alloy"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("audio/wav"));
    assert!(r.header("x-kiln-first-audio-ms").is_some(), "{}", r.headers);
    let secs = wav_seconds(&r.body);
    assert!(secs > 1.5 && secs < 8.0, "{secs} s");
    assert_eq!(r.chunks.len(), 2, "one chunk per sentence: {:?}", r.chunks);
    assert!(r.chunks[0] > 44 && r.chunks[1] > 0, "{:?}", r.chunks);

    // FLAC: the same samples, lossless, streamed frame by frame.
    let pcm = post_json(
        path,
        &json!({"input": "Good morning.", "response_format": "pcm", "stream_format": "audio"}),
    );
    let r = post_json(
        path,
        &json!({"input": "Good morning.", "response_format": "flac"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("audio/flac"));
    let d =
        kiln_audio::decode_bytes(r.body.to_vec(), None, std::path::Path::new("r.flac")).unwrap();
    let want: Vec<i16> = pcm
        .body
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    let got: Vec<i16> = d
        .samples
        .iter()
        .map(|&v| (v * 32768.0).round() as i16)
        .collect();
    assert_eq!((d.rate, got.len()), (24000, want.len()));
    assert_eq!(got, want);
    assert!(
        r.body.len() < pcm.body.len(),
        "{} vs {} bytes",
        r.body.len(),
        pcm.body.len()
    );

    // Ogg Opus: the same length (48 kHz when decoded: twice the samples), streamed in pages.
    let r = post_json(
        path,
        &json!({"input": "Good morning. How are you?", "response_format": "opus"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("audio/ogg"));
    assert_eq!(&r.body[..4], b"OggS");
    let two = post_json(
        path,
        &json!({"input": "Good morning. How are you?", "response_format": "pcm"}),
    );
    let d =
        kiln_audio::decode_bytes(r.body.to_vec(), None, std::path::Path::new("r.opus")).unwrap();
    assert_eq!((d.rate, d.samples.len()), (48000, two.body.len()));
    assert!(r.chunks.len() >= 3, "header, pages, end: {:?}", r.chunks);
    assert!(r.body.len() * 5 < two.body.len());

    // Raw PCM: the same samples without the header.
    let r = post_json(
        path,
        &json!({"input": "Good morning.", "response_format": "pcm"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("audio/pcm"));
    assert_eq!(
        &r.body[..],
        &{
            let w = post_json(path, &json!({"input": "Good morning."}));
            w.body[44..].to_vec()
        }[..]
    );
}

#[test]
fn audio_chat_answers_jfk_with_speech() {
    let path = "/v1/audio/chat";
    let jfk = std::fs::read(JFK).unwrap();
    let e = post_form(path, &[], Some(("notes.txt", b"hello"))).assert_error(400);
    assert_eq!(e["param"], "file");
    post_form(path, &[("voice", "nobody")], Some(("jfk.wav", &jfk))).assert_error(400);
    let e = post_form(path, &[("frobnicate", "1")], Some(("jfk.wav", &jfk))).assert_error(400);
    assert_eq!(e["param"], "frobnicate");
    post_form(path, &[("max_tokens", "0")], Some(("jfk.wav", &jfk))).assert_error(400);

    let r = post_form(
        path,
        &[
            ("max_tokens", "40"),
            ("temperature", "0"),
            ("voice", "bm_george"),
        ],
        Some(("jfk.wav", &jfk)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let heard = r.header("x-kiln-transcript").unwrap_or_default();
    assert!(words(&heard).contains(PHRASE), "{}", r.headers);
    let ms = |h: &str| -> f64 {
        r.header(h)
            .unwrap_or_else(|| panic!("no {h}: {}", r.headers))
            .parse()
            .unwrap()
    };
    let (stt, ttft, first) = (
        ms("x-kiln-stt-ms"),
        ms("x-kiln-ttft-ms"),
        ms("x-kiln-first-audio-ms"),
    );
    assert!(0.0 < stt && stt <= ttft && ttft <= first, "{}", r.headers);
    let secs = wav_seconds(&r.body);
    assert!(secs > 0.5, "{secs} s");
    assert!(!r.chunks.is_empty());
}

/// Audio past the server's duration limit is a 400 that says how long it was; the server
/// goes on serving.
#[test]
fn audio_past_the_duration_limit_is_refused() {
    // 70 s of a quiet 16 kHz 16-bit tone (2.2 MB: under the upload limit, over 60 s).
    let n = 70 * 16_000u32;
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + 2 * n).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&16_000u32.to_le_bytes());
    wav.extend_from_slice(&32_000u32.to_le_bytes());
    wav.extend_from_slice(&2u16.to_le_bytes());
    wav.extend_from_slice(&16u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&(2 * n).to_le_bytes());
    for i in 0..n {
        let v = ((i as f32 * 0.05).sin() * 300.0) as i16;
        wav.extend_from_slice(&v.to_le_bytes());
    }
    let e = post_form(
        "/v1/audio/transcriptions",
        &[("model", "whisper-1")],
        Some(("long.wav", &wav)),
    )
    .assert_error(400);
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("70.0 s of audio") && msg.contains("at most 60 s"),
        "{msg}"
    );
    // Still serving: jfk.wav transcribes.
    let jfk = std::fs::read(JFK).unwrap();
    let r = post_form(
        "/v1/audio/transcriptions",
        &[("model", "whisper-1"), ("response_format", "text")],
        Some(("jfk.wav", &jfk)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().to_lowercase().contains(PHRASE), "{}", r.text());
}

/// `/v1/audio/live`: jfk.wav streamed as binary PCM messages over a WebSocket, then
/// `{"type": "end"}`: partial transcripts, then finals whose words are the speech's, then
/// `done`. A plain GET is a 400 that says it is a WebSocket; a text message that is not
/// `end` is an error event and the session goes on.
#[test]
fn live_transcription_over_a_websocket() {
    use tungstenite::Message;
    let addr = server();
    let get = |path: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        raw
    };
    let plain = get("/v1/audio/live");
    assert!(
        plain.starts_with("HTTP/1.1 400") && plain.contains("WebSocket"),
        "{plain}"
    );
    let bad = get("/v1/audio/live?nope=1");
    assert!(
        bad.starts_with("HTTP/1.1 400") && bad.contains("nope"),
        "{bad}"
    );

    let jfk = kiln_audio::load_16k(Path::new(JFK)).unwrap().samples;
    let mut audio = vec![0f32; 8000];
    audio.extend_from_slice(&jfk);
    audio.extend(std::iter::repeat_n(0f32, 16000));
    let pcm: Vec<u8> = audio
        .iter()
        .flat_map(|&s| ((s * 32767.0).round() as i16).to_le_bytes())
        .collect();
    let stream = std::net::TcpStream::connect(addr).unwrap();
    let url = format!("ws://{addr}/v1/audio/live?end_silence_ms=700");
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).expect("websocket handshake");
    ws.send(Message::Text(r#"{"type": "hello"}"#.into()))
        .unwrap();
    // 0.1 s a message, odd sizes too (a sample split across two messages).
    for piece in pcm.chunks(3201) {
        ws.send(Message::Binary(piece.to_vec().into())).unwrap();
    }
    ws.send(Message::Text(r#"{"type": "end"}"#.into())).unwrap();
    let mut events = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                let done = v["type"] == "done";
                events.push(v);
                if done {
                    break;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(events[0]["type"], "error", "{events:?}");
    assert_eq!(events.last().unwrap()["type"], "done", "{events:?}");
    assert!(events.iter().any(|e| e["type"] == "partial"), "{events:?}");
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "final")
        .map(|e| format!("{} ", e["text"].as_str().unwrap()))
        .collect();
    assert!(
        words(&text).contains("what you can do for your country"),
        "{events:?}"
    );
    let first = events.iter().find(|e| e["type"] == "final").unwrap();
    let s0 = first["start"].as_f64().unwrap();
    assert!((0.1..=0.6).contains(&s0), "{first}");
}
