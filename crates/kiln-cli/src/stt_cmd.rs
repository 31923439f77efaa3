//! `kiln transcribe` and `kiln bench --stt`: Whisper speech to text.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_backend::Backend;
use kiln_models::whisper::LoadOptions;
use kiln_quant::GgmlType;
use kiln_runtime::whisper::{output, Stt, TranscribeOptions, Vad, WhisperError};

pub const DEFAULT_STT: &str = "whisper-tiny.en";
/// The VAD model (catalog name).
pub const VAD_MODEL: &str = "silero-vad";

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Txt,
    Srt,
    Vtt,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Task {
    Transcribe,
    Translate,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
pub enum Quant {
    /// Keep the file's weights (fp16 for the catalog model, as stored for a ggml file).
    None,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
}

#[derive(Args, Clone)]
pub struct SttModelArgs {
    /// Whisper model: a catalog name, a CTranslate2 model directory, a whisper.cpp ggml
    /// `.bin` (f32, f16, q4_0..q8_0) or a Hugging Face directory (config.json +
    /// model.safetensors).
    #[arg(short = 'm', long, default_value = DEFAULT_STT)]
    pub model: String,
    /// Threads (default: all CPUs).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Quantize the linear weights at load (faster; "none" keeps the file's fp16).
    #[arg(long, value_enum, default_value = "none")]
    pub quant: Quant,
    /// Voice activity detection (Silero VAD) before Whisper: auto = audio without speech
    /// transcribes as nothing and 30 s windows without speech are skipped; on = the speech
    /// alone is transcribed (pauses of 2 s or more cut out, times kept); off = none.
    #[arg(long, value_enum, default_value = "auto")]
    pub vad: VadArg,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum VadArg {
    Auto,
    On,
    Off,
}

impl From<VadArg> for Vad {
    fn from(v: VadArg) -> Vad {
        match v {
            VadArg::Auto => Vad::Auto,
            VadArg::On => Vad::On,
            VadArg::Off => Vad::Off,
        }
    }
}

#[derive(Args)]
pub struct TranscribeArgs {
    /// Audio file (WAV, FLAC, MP3, Ogg Vorbis or Opus; any rate and channels), or `-` for stdin:
    /// one of those streams, else raw s16le 16 kHz mono PCM.
    pub file: PathBuf,
    #[command(flatten)]
    pub model: SttModelArgs,
    #[arg(long, value_enum, default_value = "txt")]
    pub format: Format,
    /// Beam size (1: greedy).
    #[arg(long, default_value_t = 1)]
    pub beam: usize,
    /// Candidates sampled when falling back to temperature > 0.
    #[arg(long, default_value_t = 5)]
    pub best_of: usize,
    /// Spoken language (multilingual models; default: detected).
    #[arg(long)]
    pub language: Option<String>,
    #[arg(long, value_enum, default_value = "transcribe")]
    pub task: Task,
    /// Text that precedes the audio (names, spelling, style).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Do not predict timestamps (one segment per 30 s window).
    #[arg(long)]
    pub no_timestamps: bool,
    /// Each word's start and end (cross-attention alignment, as openai-whisper computes
    /// them): `words` in json, one cue per word in srt and vtt.
    #[arg(long)]
    pub word_timestamps: bool,
    /// Do not feed each window's text to the next as a prompt.
    #[arg(long)]
    pub no_condition: bool,
    /// Transcribe as the audio arrives (`-`: raw s16le 16 kHz mono on stdin, or a WAV of
    /// that; a file is replayed as a stream): each utterance, found by the VAD, is printed
    /// when its speaker has been quiet for --end-silence-ms (txt: one line each; json: one
    /// JSON object a line, with `partial` transcripts as the utterance grows).
    #[arg(long)]
    pub live: bool,
    /// With --live: the silence that ends an utterance.
    #[arg(long, default_value_t = 700, value_name = "MS")]
    pub end_silence_ms: u32,
    /// Only temperature 0 (no fallback on loops or low confidence).
    #[arg(long)]
    pub no_fallback: bool,
    /// Seed for sampling at temperature > 0.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where Whisper runs: cpu; cuda (a build with `--features cuda` and an NVIDIA GPU);
    /// gpu (a build with `--features gpu`: wgpu on Vulkan or Metal). The mel spectrogram is
    /// computed on the CPU.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::Device,
    /// With --device gpu: the first adapter whose name contains this (case-insensitive).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
}

pub fn load(m: &SttModelArgs) -> anyhow::Result<Stt<CpuBackend>> {
    let threads = m.threads.unwrap_or_else(default_threads).max(1);
    load_on(|| Ok(CpuBackend::new(threads)), m)
}

/// Whisper on the backend `make` gives.
pub fn load_on<B: Backend>(
    make: impl FnOnce() -> anyhow::Result<B>,
    m: &SttModelArgs,
) -> anyhow::Result<Stt<B>> {
    let quant = match m.quant {
        Quant::None => None,
        Quant::Q8_0 => Some(GgmlType::Q8_0),
        Quant::Q4_0 => Some(GgmlType::Q4_0),
    };
    let opts = LoadOptions { quant };
    let mut stt = match kiln_assets::resolve_local(&m.model) {
        // On disk already: its vocabulary is read while the backend is made (a CUDA
        // context's 0.3 s).
        Some(path) => Stt::load_with(
            || make().map_err(|e| WhisperError::Device(format!("{e:#}"))),
            &path,
            opts,
        )?,
        // To be fetched: the backend first, so that a missing GPU is said before a download.
        None => {
            let backend = make()?;
            Stt::load(backend, &crate::resolve_model(&m.model)?, opts)?
        }
    };
    stt.vad = load_vad(m.vad)?;
    Ok(stt)
}

/// The VAD model `vad` asks for: fetched on first use; under `auto` a VAD that cannot be
/// had is a warning (transcription goes on without it), under `on` an error.
fn load_vad(vad: VadArg) -> anyhow::Result<Option<kiln_models::vad::SileroVad>> {
    if vad == VadArg::Off {
        return Ok(None);
    }
    let loaded =
        crate::resolve_model(VAD_MODEL).and_then(|p| Ok(kiln_models::vad::SileroVad::load(&p)?));
    match loaded {
        Ok(v) => Ok(Some(v)),
        Err(e) if vad == VadArg::Auto => {
            eprintln!("kiln: warning: transcribing without a VAD ({VAD_MODEL}: {e:#})");
            Ok(None)
        }
        Err(e) => Err(e.context(format!("--vad on needs {VAD_MODEL}"))),
    }
}

/// Whisper from `m` on `device` (`adapter`: the wgpu one), on a thread of its own (the
/// server's and the voice pipeline's speech-to-text).
pub fn spawn(
    device: crate::Device,
    adapter: Option<&str>,
    m: &SttModelArgs,
) -> anyhow::Result<kiln_runtime::speech::SpeechToText> {
    use kiln_runtime::speech::SpeechToText;
    let (m, adapter) = (m.clone(), adapter.map(str::to_string));
    match device {
        crate::Device::Cpu => SpeechToText::spawn(move || load(&m)),
        crate::Device::Cuda => SpeechToText::spawn(move || load_on(crate::cuda_stt_backend, &m)),
        crate::Device::Gpu => {
            SpeechToText::spawn(move || load_on(|| crate::gpu_backend(adapter.as_deref()), &m))
        }
    }
}

pub fn options(a: &TranscribeArgs) -> TranscribeOptions {
    let mut o = TranscribeOptions::default();
    o.decode.beam_size = a.beam.max(1);
    o.decode.best_of = a.best_of.max(1);
    o.decode.timestamps = !a.no_timestamps;
    o.decode.seed = a.seed;
    o.condition_on_previous_text = !a.no_condition;
    o.initial_prompt = a.prompt.clone();
    o.language = a.language.clone();
    o.translate = matches!(a.task, Task::Translate);
    o.vad = a.model.vad.into();
    o.word_timestamps = a.word_timestamps;
    if a.no_fallback {
        o.temperatures = vec![0.0];
    }
    o
}

pub fn transcribe(a: TranscribeArgs) -> anyhow::Result<()> {
    if a.live {
        return live(a);
    }
    // The audio is decoded while the model loads; a load error (a missing GPU, a bad model
    // file) is said before a bad audio file's.
    let (stt, audio) = std::thread::scope(|s| {
        let audio = s.spawn(|| kiln_audio::load_16k(&a.file));
        let stt = spawn(a.device, a.adapter.as_deref(), &a.model);
        (stt, kiln_runtime::join_scoped(audio))
    });
    let (stt, audio) = (stt?, audio?);
    let t = stt.transcribe(&audio.samples, &options(&a))?;
    let out = match a.format {
        Format::Txt => output::txt(&t),
        Format::Srt => output::srt(&t),
        Format::Vtt => output::vtt(&t),
        Format::Json => output::json(&t),
    };
    print!("{out}");
    let s = &t.stats;
    let vad = if s.vad_ms > 0.0 {
        format!(" | vad {:.0} ms ({:.1} s of speech)", s.vad_ms, s.speech_s)
    } else {
        String::new()
    };
    eprintln!(
        "audio {:.1} s{vad} | load {:.0} ms | mel {:.0} ms | encode {:.0} ms ({} windows) | decode {:.0} ms ({} tokens, {:.1} ms/token) | total {:.0} ms | RTF {:.3}",
        s.audio_s,
        stt.load_ms(),
        s.mel_ms,
        s.encode_ms,
        s.windows,
        s.decode_ms,
        s.decode_tokens,
        s.decode_ms / s.decode_tokens.max(1) as f64,
        s.total_ms,
        s.total_ms / 1e3 / s.audio_s.max(1e-9)
    );
    crate::leave_for_exit(stt);
    Ok(())
}

/// A WAV header on a live stream: checked to be 16 kHz mono 16-bit PCM and skipped up to
/// its samples. None when the stream does not start with one.
fn skip_wav_header(r: &mut impl Read, first: &[u8; 4]) -> anyhow::Result<bool> {
    if first != b"RIFF" {
        return Ok(false);
    }
    let mut head = [0u8; 8];
    r.read_exact(&mut head)?;
    anyhow::ensure!(
        &head[4..] == b"WAVE",
        "stdin: a RIFF stream that is not WAVE"
    );
    loop {
        let mut ch = [0u8; 8];
        r.read_exact(&mut ch)
            .context("stdin: the WAV header ended before its data")?;
        let len = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]) as usize;
        match &ch[..4] {
            b"data" => return Ok(true),
            b"fmt " => {
                let mut f = vec![0u8; len + len % 2];
                r.read_exact(&mut f)?;
                let u16_at = |i: usize| u16::from_le_bytes([f[i], f[i + 1]]);
                let rate = u32::from_le_bytes([f[4], f[5], f[6], f[7]]);
                let (format, channels, bits) = (u16_at(0), u16_at(2), u16_at(14));
                anyhow::ensure!(
                    format == 1 && channels == 1 && rate == 16_000 && bits == 16,
                    "stdin: --live takes 16 kHz mono 16-bit PCM, this WAV is {rate} Hz, \
                     {channels} channel(s), {bits}-bit (convert it: ffmpeg -i IN -ar 16000 -ac 1 \
                     -f s16le -)"
                );
            }
            _ => {
                std::io::copy(&mut r.take((len + len % 2) as u64), &mut std::io::sink())?;
            }
        }
    }
}

/// Audio for a live stream, 100 ms at a time: `-` is stdin (raw s16le 16 kHz mono, or a WAV
/// of that), a file is decoded and replayed.
pub fn feed_live(
    file: &Path,
    push: &mut dyn FnMut(&[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    const CHUNK: usize = 1600;
    if file.as_os_str() != "-" {
        let audio = kiln_audio::load_16k(file)?;
        for piece in audio.samples.chunks(CHUNK) {
            push(piece)?;
        }
        return Ok(());
    }
    let stdin = std::io::stdin();
    anyhow::ensure!(
        !stdin.is_terminal(),
        "--live -: pipe audio in (raw s16le 16 kHz mono, e.g. arecord -f S16_LE -r 16000 -c 1)"
    );
    let mut r = stdin.lock();
    let mut first = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut first[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let mut carry: Vec<u8> = Vec::new();
    if !(got == 4 && skip_wav_header(&mut r, &first)?) {
        carry.extend_from_slice(&first[..got]);
    }
    let mut buf = vec![0u8; CHUNK * 2];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        carry.extend_from_slice(&buf[..n]);
        let whole = carry.len() / 2 * 2;
        let samples: Vec<f32> = carry[..whole]
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0)
            .collect();
        carry.drain(..whole);
        push(&samples)?;
    }
    Ok(())
}

/// `kiln transcribe --live`: utterances as they end, from stdin or a file replayed.
fn live(a: TranscribeArgs) -> anyhow::Result<()> {
    use kiln_runtime::live::{Live, LiveEvent, LiveOptions};
    use std::io::{IsTerminal, Write};
    anyhow::ensure!(
        matches!(a.format, Format::Txt | Format::Json),
        "--live writes txt or json (one line per utterance)"
    );
    let vad = crate::resolve_model(VAD_MODEL)
        .and_then(|p| Ok(kiln_models::vad::SileroVad::load(&p)?))
        .context(format!("--live needs {VAD_MODEL}"))?;
    let stt = spawn(a.device, a.adapter.as_deref(), &a.model)?;
    let mut o = options(&a);
    o.vad = kiln_runtime::whisper::Vad::Off;
    o.condition_on_previous_text = false;
    o.word_timestamps = false;
    let mut transcribe = |s: &[f32]| stt.transcribe(s, &o).map(|t| t.text);
    let json = matches!(a.format, Format::Json);
    let show_partials = json || std::io::stderr().is_terminal();
    let mut on = |e: LiveEvent| {
        let mut out = std::io::stdout().lock();
        match (&e, json) {
            (LiveEvent::Partial { start, text }, true) => {
                let v = serde_json::json!({"type": "partial", "start": start, "text": text});
                let _ = writeln!(out, "{v}");
            }
            (LiveEvent::Final { start, end, text }, true) => {
                let v =
                    serde_json::json!({"type": "final", "start": start, "end": end, "text": text});
                let _ = writeln!(out, "{v}");
            }
            (LiveEvent::Partial { text, .. }, false) if show_partials => {
                eprint!("\r\x1b[2K… {text}");
            }
            (LiveEvent::Final { text, .. }, false) => {
                if show_partials {
                    eprint!("\r\x1b[2K");
                }
                let _ = writeln!(out, "{text}");
            }
            _ => {}
        }
        let _ = out.flush();
    };
    let mut live = Live::new(
        std::sync::Arc::new(vad),
        LiveOptions {
            end_silence_ms: a.end_silence_ms,
            ..Default::default()
        },
    );
    feed_live(&a.file, &mut |samples| {
        Ok(live.push(samples, &mut transcribe, &mut on)?)
    })?;
    live.finish(&mut transcribe, &mut on)?;
    Ok(())
}

/// `kiln bench --stt FILE`: encoder ms per window, decoder ms per token, real-time factor,
/// over `reps` timed runs after a warm-up.
pub fn bench(
    file: &Path,
    m: &SttModelArgs,
    reps: usize,
    json: bool,
    device: crate::Device,
    adapter: Option<&str>,
) -> anyhow::Result<()> {
    let stt = spawn(device, adapter, m)?;
    let audio = kiln_audio::load_16k(file)?;
    let mut o = TranscribeOptions::default();
    o.temperatures = vec![0.0];
    stt.transcribe(&audio.samples, &o).context("warm-up")?;
    let (mut enc, mut tok, mut rtf) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let t = stt.transcribe(&audio.samples, &o)?;
        let wall = t0.elapsed().as_secs_f64();
        let s = &t.stats;
        enc.push(s.encode_ms / s.windows.max(1) as f64);
        tok.push(s.decode_ms / s.decode_tokens.max(1) as f64);
        rtf.push(wall / s.audio_s.max(1e-9));
    }
    let ms = |v: &[f64]| {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
        (mean, sd)
    };
    let (e, t, r) = (ms(&enc), ms(&tok), ms(&rtf));
    let threads = m.threads.unwrap_or_else(default_threads);
    let quant = match m.quant {
        Quant::None => "file",
        Quant::Q8_0 => "q8_0",
        Quant::Q4_0 => "q4_0",
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "model": m.model, "weights": quant, "threads": threads,
                "audio_s": audio.duration_s(), "reps": reps,
                "encoder_ms_per_window": e.0, "encoder_ms_sd": e.1,
                "decode_ms_per_token": t.0, "decode_ms_sd": t.1,
                "rtf": r.0, "rtf_sd": r.1,
            })
        );
    } else {
        println!(
            "| model | weights | threads | audio s | encoder ms/window | decode ms/token | RTF |"
        );
        println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
        println!(
            "| {} | {} | {} | {:.1} | {:.1} ± {:.1} | {:.2} ± {:.2} | {:.4} ± {:.4} |",
            m.model,
            quant,
            threads,
            audio.duration_s(),
            e.0,
            e.1,
            t.0,
            t.1,
            r.0,
            r.1
        );
    }
    Ok(())
}
