//! `kiln speak`: text (or phonemes) to 24 kHz speech, written as WAV, FLAC, Ogg Opus or raw PCM, sentence by
//! sentence as each is synthesized; `kiln bench --tts`: time to first audio, real-time factor.

use std::io::{IsTerminal, Read, Write};

use crate::audio_out::AudioFile;
use anyhow::Context;
use clap::Args;
use kiln_backend::Backend;
use kiln_formats::OutputFile;
use kiln_runtime::speech::TextToSpeech;
use kiln_runtime::tts::{model_dir_files, pcm16, wav_header, Tts, SAMPLE_RATE};
use kiln_text::speech::Language;

pub const DEFAULT_TTS: &str = "kokoro-82m";
pub const DEFAULT_LEXICON: &str = "misaki-en-us";
/// misaki's British lexicons, for the British voices.
pub const BRITISH_LEXICON: &str = "misaki-en-gb";
/// A voice of the catalog's voices: American English, the one kokoro users reach for.
pub const DEFAULT_VOICE: &str = "af_heart";

#[derive(Args)]
pub struct SpeakArgs {
    /// Text to speak, or `-` to read it from stdin.
    #[arg(required_unless_present = "list_voices")]
    pub text: Option<String>,
    /// List the model's voices (name, language, gender) and exit.
    #[arg(long)]
    pub list_voices: bool,
    /// TTS model: a catalog name, a directory, or a model file (a kokoro-onnx export or
    /// hexgrad's `kokoro-v1_0.pth`; config.json and voices beside it, else the catalog's).
    #[arg(short = 'm', long, default_value = DEFAULT_TTS)]
    pub model: String,
    /// Voice name from the model's voice pack.
    #[arg(long, default_value = DEFAULT_VOICE)]
    pub voice: String,
    /// The text's language, when it is not the voice's (each voice's first letter names its
    /// own): en-us, en-gb, es, fr, hi, it, pt-br (`--voice jf_alpha --lang en-us` reads
    /// English with a Japanese voice).
    #[arg(long, value_name = "LANG", value_parser = parse_lang)]
    pub lang: Option<Language>,
    /// Speaking rate (1.0 = the model's own).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f32,
    /// The input is Kokoro phonemes (skips normalisation and G2P).
    #[arg(long)]
    pub phonemes: bool,
    /// Output file (`-` = stdout): WAV, or FLAC for a name ending `.flac`, Ogg Opus for `.opus`
    /// or `.ogg`.
    #[arg(short = 'o', long, default_value = "-")]
    pub output: String,
    /// Write raw 16-bit little-endian PCM (24 kHz mono) instead of WAV.
    #[arg(long)]
    pub raw: bool,
    /// Threads (default: all CPUs).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Where Kokoro runs: cpu, cuda (a build with `--features cuda`) or gpu (`--features
    /// gpu`). On a GPU, the products run there and the signal ops without kernels of their
    /// own go through the CPU backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::Device,
    /// With --device gpu: the first adapter whose name contains this (case-insensitive).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
}

/// `model`: a catalog name, a model directory, or a model file (`kokoro-v1_0.pth`, an ONNX
/// export) whose `config.json` and voices (`voices.npz`, or a `voices/` directory of `.pt`
/// files) lie beside it, else come from the catalog's Kokoro.
pub fn load(
    model: &str,
    phonemes_only: bool,
    lang: Option<Language>,
    threads: Option<usize>,
) -> anyhow::Result<Tts> {
    let threads = threads.unwrap_or_else(kiln_backend::cpu::default_threads);
    anyhow::ensure!(threads > 0, "-t/--threads must be at least 1");
    load_on(
        kiln_backend::cpu::CpuBackend::new(threads),
        model,
        phonemes_only,
        lang,
    )
}

/// Kokoro `model` on `device` (`adapter`: the wgpu one; `threads`: the CPU's), on a thread of
/// its own (the server's and the voice pipeline's text-to-speech).
pub fn spawn(
    device: crate::Device,
    adapter: Option<&str>,
    model: &str,
    phonemes_only: bool,
    lang: Option<Language>,
    threads: Option<usize>,
) -> anyhow::Result<TextToSpeech> {
    let (model, adapter) = (model.to_string(), adapter.map(str::to_string));
    let p = phonemes_only;
    match device {
        crate::Device::Cpu => TextToSpeech::spawn(move || load(&model, p, lang, threads)),
        crate::Device::Cuda => {
            TextToSpeech::spawn(move || load_on(crate::cuda_backend()?, &model, p, lang))
        }
        crate::Device::Gpu => TextToSpeech::spawn(move || {
            load_on(crate::gpu_backend(adapter.as_deref())?, &model, p, lang)
        }),
    }
}

/// [`load`] on `backend`.
pub fn load_on<B: Backend>(
    backend: B,
    model: &str,
    phonemes_only: bool,
    lang: Option<Language>,
) -> anyhow::Result<Tts<B>> {
    let path = crate::resolve_model(model)?;
    let lex = if phonemes_only {
        None
    } else {
        Some(crate::resolve_model(DEFAULT_LEXICON)?)
    };
    let (file, config, voices) = if path.is_dir() {
        model_dir_files(&path)
    } else {
        let beside = |name: &str| path.parent().map(|d| d.join(name)).filter(|p| p.exists());
        let catalog = || crate::resolve_model(DEFAULT_TTS);
        let config = match beside("config.json") {
            Some(c) => c,
            None => catalog()?.join("config.json"),
        };
        let voices = match beside("voices.npz").or_else(|| beside("voices")) {
            Some(v) => v,
            None => catalog()?.join("voices.npz"),
        };
        (path.clone(), config, voices)
    };
    let tts =
        Tts::load_files_on(backend, &file, &config, &voices, lex.as_deref())?.with_language(lang);
    // Fetched when a British voice first speaks text, not by every user of the others.
    Ok(match phonemes_only {
        true => tts,
        false => tts.with_british_lexicons_from(|| {
            crate::resolve_model(BRITISH_LEXICON).map_err(|e| format!("{e:#}"))
        }),
    })
}

fn read_text(text: &str) -> anyhow::Result<String> {
    if text == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading text from stdin")?;
        Ok(s)
    } else {
        Ok(text.to_string())
    }
}

pub fn speak(a: SpeakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.speed > 0.0 && a.speed.is_finite() && a.speed <= 4.0,
        "--speed {} must be in (0, 4]",
        a.speed
    );
    if a.list_voices {
        let tts = spawn(
            a.device,
            a.adapter.as_deref(),
            &a.model,
            true,
            None,
            a.threads,
        )?;
        for v in tts.voices() {
            println!("{v:<16} {}", describe_voice(v));
        }
        return Ok(());
    }
    let Some(text) = a.text.as_deref() else {
        anyhow::bail!("nothing to say: pass TEXT, or - to read it from stdin");
    };
    if a.output == "-" && std::io::stdout().is_terminal() {
        anyhow::bail!("not writing audio to a terminal: pass -o FILE, or redirect stdout");
    }
    let text = read_text(text)?;
    let tts = spawn(
        a.device,
        a.adapter.as_deref(),
        &a.model,
        a.phonemes,
        a.lang,
        a.threads,
    )?;
    let text = text.as_str();
    let st = if a.output == "-" {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        if !a.raw {
            out.write_all(&wav_header(u32::MAX - 36))?;
        }
        tts.speak(text, a.phonemes, &a.voice, a.speed, &mut |s| {
            out.write_all(&pcm16(s))?;
            out.flush()
        })?
    } else {
        if a.raw {
            // Replaces the file only once all of the audio is written.
            let mut out = OutputFile::create(&a.output)?;
            let f = out.file();
            let st = tts.speak(text, a.phonemes, &a.voice, a.speed, &mut |s| {
                f.write_all(&pcm16(s))
            })?;
            out.commit()?;
            crate::leave_for_exit(tts);
            return report(&st);
        }
        let mut out = AudioFile::create(std::path::Path::new(&a.output), SAMPLE_RATE)?;
        let st = tts.speak(text, a.phonemes, &a.voice, a.speed, &mut |s| out.write(s))?;
        out.commit()?;
        st
    };
    crate::leave_for_exit(tts);
    report(&st)
}

/// The stats line on stderr.
fn report(st: &kiln_runtime::tts::TtsStats) -> anyhow::Result<()> {
    eprintln!(
        "{:.2} s of audio in {} chunk(s): first audio after {:.2} s, total {:.2} s (real-time factor {:.3})",
        st.audio_s,
        st.chunks,
        st.first_audio_s,
        st.total_s,
        st.total_s / st.audio_s.max(1e-9)
    );
    Ok(())
}

/// `kiln bench --tts TEXT`: warm-up, then `reps` timed runs: time to first audio and real-time
/// factor (synthesis time / audio duration), mean ± sd.
#[allow(clippy::too_many_arguments)]
pub fn bench(
    text: &str,
    phonemes: bool,
    model: &str,
    voice: &str,
    reps: usize,
    threads: &[usize],
    json: bool,
    device: crate::Device,
    adapter: Option<&str>,
) -> anyhow::Result<()> {
    // TEXT may name a file (one utterance per line with --phonemes).
    let text = match std::fs::read_to_string(text) {
        Ok(s) => s,
        Err(_) => text.to_string(),
    };
    let text = text.as_str();
    if device != crate::Device::Cpu {
        // One run: the threads are the CPU backend's.
        let label = format!("{device:?}").to_lowercase();
        let tts = spawn(device, adapter, model, phonemes, None, None)?;
        return bench_one(&tts, text, phonemes, model, voice, reps, json, &label, None);
    }
    for &t in threads {
        let tts = spawn(device, adapter, model, phonemes, None, Some(t))?;
        bench_one(
            &tts,
            text,
            phonemes,
            model,
            voice,
            reps,
            json,
            "cpu",
            Some(t),
        )?;
    }
    Ok(())
}

/// One model's warm-up and timed runs: `device` and `threads` describe where it runs.
#[allow(clippy::too_many_arguments)]
fn bench_one(
    tts: &TextToSpeech,
    text: &str,
    phonemes: bool,
    model: &str,
    voice: &str,
    reps: usize,
    json: bool,
    device: &str,
    threads: Option<usize>,
) -> anyhow::Result<()> {
    let mut sink = |_: &[f32]| Ok(());
    tts.speak(text, phonemes, voice, 1.0, &mut sink)?;
    let (mut first, mut rtf, mut audio) = (Vec::new(), Vec::new(), 0.0);
    for _ in 0..reps {
        let st = tts.speak(text, phonemes, voice, 1.0, &mut sink)?;
        first.push(st.first_audio_s);
        rtf.push(st.total_s / st.audio_s.max(1e-9));
        audio = st.audio_s;
    }
    let ms = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let sd =
            (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64).sqrt();
        (m, sd)
    };
    let ((f, fsd), (r, rsd)) = (ms(&first), ms(&rtf));
    let t = threads.map_or("null".to_string(), |t| t.to_string());
    if json {
        println!(
            "{{\"model\":\"{model}\",\"voice\":\"{voice}\",\"device\":\"{device}\",\"threads\":{t},\"audio_s\":{audio:.3},\"first_audio_s\":{f:.4},\"first_audio_sd\":{fsd:.4},\"rtf\":{r:.4},\"rtf_sd\":{rsd:.4},\"reps\":{reps}}}"
        );
    } else {
        let on = match threads {
            Some(t) => format!("{t} threads"),
            None => device.to_string(),
        };
        println!(
            "| {model} | {voice} | {on} | {audio:.2} s audio | first audio {f:.3} ± {fsd:.3} s | RTF {r:.3} ± {rsd:.3} |"
        );
    }
    Ok(())
}

/// A `--lang` value.
pub(crate) fn parse_lang(s: &str) -> Result<Language, String> {
    kiln_text::speech::language_by_code(s).ok_or_else(|| {
        format!("unknown language '{s}' (en-us, en-gb, es, fr, hi, it, pt-br, ja, zh)")
    })
}

/// "American English, female" for `af_heart`: Kokoro's voices are named by language (first
/// letter) and gender (second).
fn describe_voice(name: &str) -> String {
    let Some(lang) = kiln_text::speech::voice_language(name) else {
        return String::new();
    };
    match name.chars().nth(1) {
        Some('f') => format!("{}, female", lang.name),
        Some('m') => format!("{}, male", lang.name),
        _ => lang.name.to_string(),
    }
}
