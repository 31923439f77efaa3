//! `kiln voice`: one spoken turn. Speech in -> Whisper -> the LLM (through the scheduler,
//! streamed) -> Kokoro, sentence by sentence -> a reply WAV written as each sentence is
//! synthesized; the transcript, the reply and the stage latencies are printed.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::tts::{pcm16, SAMPLE_RATE};
use kiln_runtime::voice::{Voice, VoiceEvent, VoiceOptions, VoiceStats};
use kiln_runtime::whisper::TranscribeOptions;
use kiln_runtime::{GenerateOptions, SamplerConfig, SchedulerConfig};

use crate::audio_out::AudioFile;
use crate::speak::{DEFAULT_TTS, DEFAULT_VOICE};
use crate::stt_cmd::{Quant, SttModelArgs, VadArg, DEFAULT_STT};
use crate::{resolve_model, DEFAULT_LLM};

#[derive(Args)]
pub struct VoiceArgs {
    /// What the user says: an audio file (WAV, FLAC, MP3, Ogg Vorbis or Opus; any rate).
    pub input: PathBuf,
    /// The spoken reply: 24 kHz mono WAV, or FLAC for a name ending `.flac`, Ogg Opus for
    /// `.opus` or `.ogg`.
    #[arg(short = 'o', long, default_value = "reply.wav")]
    pub output: PathBuf,
    /// LLM: a GGUF file, a directory or a catalog name.
    #[arg(short = 'm', long, default_value = DEFAULT_LLM)]
    pub model: String,
    /// Whisper model: a catalog name, a CTranslate2 or Hugging Face directory, or a
    /// whisper.cpp ggml `.bin`.
    #[arg(long, default_value = DEFAULT_STT)]
    pub stt: String,
    /// Whisper's linear weights: quantized to q8_0 at load (default; same transcripts, a
    /// faster decoder) or kept as the file has them (`none`).
    #[arg(long = "stt-quant", value_enum, default_value = "q8_0")]
    pub stt_quant: Quant,
    /// Kokoro model: a directory or a catalog name.
    #[arg(long, default_value = DEFAULT_TTS)]
    pub tts: String,
    /// Voice from the TTS model's voice pack.
    #[arg(long, default_value = DEFAULT_VOICE)]
    pub voice: String,
    /// The reply's language, when it is not the voice's: en-us, en-gb, es, fr, hi, it, pt-br.
    #[arg(long, value_name = "LANG", value_parser = crate::speak::parse_lang)]
    pub lang: Option<kiln_text::speech::Language>,
    /// System prompt (default: answer in a few short spoken sentences).
    #[arg(long)]
    pub system: Option<String>,
    /// Speaking rate (1.0 = the model's own).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f32,
    /// Reply tokens at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads per model (default: all CPUs).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Where the three models run.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::Device,
    /// With --device gpu: the first adapter whose name contains this.
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
    /// Speak whole sentences only (by default the first clause or phrase, four words at
    /// least, is spoken on its own, for earlier first audio).
    #[arg(long)]
    pub whole_sentences: bool,
    /// End the first spoken piece after N words when no sentence or clause has ended by
    /// then (earlier first audio, a pause inside the first sentence; 0: off).
    #[arg(long = "first-words", value_name = "N", default_value_t = 0)]
    pub first_words: usize,
    /// Run the turn this many times (the models stay loaded) and report each run and the
    /// mean; the WAV holds the last run's reply.
    #[arg(short = 'r', long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub reps: u16,
    /// Listen to a stream instead of one file (`-`: raw s16le 16 kHz mono, or a WAV of it,
    /// on stdin; a file is replayed as a stream): each utterance is answered once its
    /// speaker has been quiet for --end-silence-ms. The replies go to -o (`-`: raw s16le
    /// 24 kHz mono on stdout as they are spoken; a file: one WAV of every reply); the
    /// dialogue and each reply's first-audio latency from the end of speech go to stderr.
    #[arg(long)]
    pub live: bool,
    /// With --live: the silence that ends the user's turn.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub end_silence_ms: u32,
}

pub fn voice(a: VoiceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.speed > 0.0 && a.speed.is_finite() && a.speed <= 4.0,
        "--speed {} must be in (0, 4]",
        a.speed
    );
    anyhow::ensure!(
        (0.0..=2.0).contains(&a.temp),
        "--temp {} must be in [0, 2]",
        a.temp
    );
    anyhow::ensure!(a.max_tokens > 0, "--max-tokens must be at least 1");
    let threads = a.threads.unwrap_or_else(default_threads);
    anyhow::ensure!(threads > 0, "-t/--threads must be at least 1");
    let audio = match a.live {
        true => None,
        false => Some(kiln_audio::load_16k(&a.input)?.samples),
    };

    let llm_path = resolve_model(&a.model)?;
    let file = kiln_runtime::llm_path(&llm_path)?;
    let cfg = SchedulerConfig {
        slots: 1,
        n_ctx: 2048,
        ..Default::default()
    };
    let device = a.device;
    let stt_args = SttModelArgs {
        model: a.stt.clone(),
        threads: Some(threads),
        quant: a.stt_quant,
        vad: VadArg::Auto,
    };
    // The three models load at once, each on its engine's thread; a failure is said in this
    // order (LLM, Whisper, Kokoro).
    let adapter = a.adapter.as_deref();
    let (sched, stt, tts) = std::thread::scope(|s| {
        let stt = s.spawn(|| crate::stt_cmd::spawn(device, adapter, &stt_args));
        let tts =
            s.spawn(|| crate::speak::spawn(device, adapter, &a.tts, false, a.lang, Some(threads)));
        let sched =
            crate::llm_cmd::spawn_scheduler(cfg, &file, device, a.adapter.clone(), move || {
                // The LLM is far ahead of speech (tokens come ~20x faster than they are spoken): its
                // engine thread and pool yield the cores to Whisper and Kokoro while those run, and
                // take them whenever they are idle. First audio waits on Kokoro alone.
                kiln_backend::cpu::lower_thread_priority(10);
                CpuBackend::new(threads)
            });
        (
            sched,
            kiln_runtime::join_scoped(stt),
            kiln_runtime::join_scoped(tts),
        )
    });
    let (sched, stt, tts) = (sched?, stt?, tts?);
    anyhow::ensure!(
        tts.voices().any(|v| v == a.voice),
        "unknown voice '{}' (voices: {})",
        a.voice,
        tts.voices().collect::<Vec<_>>().join(", ")
    );
    // Warm Whisper and Kokoro once (first-call page faults and lazily packed layouts), and
    // the LLM's prefix cache with the system prompt (below), so the first turn is timed like
    // every later one.
    let mut quick = TranscribeOptions::default();
    quick.temperatures = vec![0.0];
    let warm = audio.as_deref().unwrap_or(&[0.0; 16_000]);
    stt.transcribe(&warm[..warm.len().min(16_000)], &quick)
        .context("warming up Whisper")?;
    tts.speak("Hi.", false, &a.voice, 1.0, &mut |_| Ok(()))
        .context("warming up Kokoro")?;
    let pipeline = Voice {
        stt: &stt,
        llm: &sched,
        tts: &tts,
    };
    let opts = VoiceOptions {
        system: a.system.clone(),
        voice: a.voice.clone(),
        speed: a.speed,
        generate: GenerateOptions {
            max_tokens: a.max_tokens,
            stop: Vec::new(),
            sampler: SamplerConfig {
                temperature: a.temp,
                seed: a.seed,
                ..Default::default()
            },
            ..Default::default()
        },
        transcribe: TranscribeOptions::default(),
        first_clause: !a.whole_sentences,
        first_words: a.first_words,
    };
    pipeline.warm_llm(&opts).context("warming up the LLM")?;
    let Some(audio) = audio else {
        return live(&pipeline, &opts, &a);
    };

    let mut runs = Vec::new();
    for rep in 0..a.reps {
        let last = rep + 1 == a.reps;
        let st = turn(&pipeline, &audio, &opts, &a.output, last)?;
        if a.reps > 1 {
            eprintln!("run {}: {}", rep + 1, latencies(&st));
        }
        runs.push(st);
    }
    let st = runs.last().expect("one run at least");
    if a.reps > 1 {
        let mean = |f: fn(&VoiceStats) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
        eprintln!(
            "mean of {} runs: STT {:.0} ms | TTFT {:.0} ms | first sentence {:.0} ms | first audio {:.0} ms (TTS {:.0} ms after the first sentence) | first sound {:.0} ms | total {:.0} ms",
            runs.len(),
            mean(|s| s.stt_ms),
            mean(|s| s.ttft_ms),
            mean(|s| s.first_sentence_ms),
            mean(|s| s.first_audio_ms),
            mean(|s| s.first_audio_ms - s.first_sentence_ms),
            mean(|s| s.first_sound_ms),
            mean(|s| s.total_ms),
        );
    } else {
        eprintln!("{}", latencies(st));
    }
    eprintln!(
        "{:.2} s of speech in {} sentence(s), {} reply tokens -> {}",
        st.audio_s,
        st.sentences,
        st.completion_tokens,
        a.output.display()
    );
    crate::leave_for_exit((sched, stt, tts));
    Ok(())
}

fn latencies(st: &VoiceStats) -> String {
    format!(
        "STT {:.0} ms | TTFT {:.0} ms | first sentence {:.0} ms | first audio {:.0} ms (TTS {:.0} ms after the first sentence) | first sound {:.0} ms | total {:.0} ms",
        st.stt_ms,
        st.ttft_ms,
        st.first_sentence_ms,
        st.first_audio_ms,
        st.first_audio_ms - st.first_sentence_ms,
        st.first_sound_ms,
        st.total_ms
    )
}

/// One turn; `print`: show the transcript and stream the reply text to stdout.
fn turn(
    pipeline: &Voice<'_>,
    samples: &[f32],
    opts: &VoiceOptions,
    output: &std::path::Path,
    print: bool,
) -> anyhow::Result<VoiceStats> {
    // Replaces the file only once the whole reply is written.
    let mut out = AudioFile::create(output, SAMPLE_RATE)?;
    let mut io_err: Option<std::io::Error> = None;
    let stdout = std::io::stdout();
    let st = pipeline.converse(samples, opts, &mut |ev| {
        let res = match ev {
            VoiceEvent::Transcript(t) if print => {
                let mut o = stdout.lock();
                writeln!(o, "transcript: {t}").and_then(|_| write!(o, "reply: "))
            }
            VoiceEvent::Text(t) if print => {
                let mut o = stdout.lock();
                write!(o, "{t}").and_then(|_| o.flush())
            }
            VoiceEvent::Audio(s) => out.write(s),
            _ => Ok(()),
        };
        match res {
            Ok(()) => true,
            Err(e) => {
                io_err = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = io_err {
        return Err(e).context("writing the reply");
    }
    if print {
        println!();
    }
    out.commit()?;
    Ok(st)
}

/// `kiln voice --live`: every utterance of the stream answered as its speaker goes quiet.
fn live(pipeline: &Voice<'_>, opts: &VoiceOptions, a: &VoiceArgs) -> anyhow::Result<()> {
    use kiln_runtime::live::{Live, LiveEvent, LiveOptions};
    use std::cell::RefCell;
    use std::io::IsTerminal;
    use std::time::Instant;
    let to_stdout = a.output.as_os_str() == "-";
    anyhow::ensure!(
        !(to_stdout && std::io::stdout().is_terminal()),
        "not writing audio to a terminal: pass -o FILE, or pipe stdout to a player \
         (aplay -f S16_LE -r 24000 -c 1)"
    );
    let vad = crate::resolve_model(crate::stt_cmd::VAD_MODEL)
        .and_then(|p| Ok(kiln_models::vad::SileroVad::load(&p)?))
        .context(format!("--live needs {}", crate::stt_cmd::VAD_MODEL))?;
    let mut file = match to_stdout {
        true => None,
        false => Some(AudioFile::create(&a.output, SAMPLE_RATE)?),
    };
    // When each piece of the stream arrived: (samples so far, then).
    let arrivals: RefCell<Vec<(usize, Instant)>> = RefCell::new(Vec::new());
    let mut failed: Option<anyhow::Error> = None;
    let mut quick = opts.transcribe.clone();
    quick.vad = kiln_runtime::whisper::Vad::Off;
    quick.condition_on_previous_text = false;
    let mut transcribe = |s: &[f32]| pipeline.stt.transcribe(s, &quick).map(|t| t.text);
    let mut turns = 0;
    let mut on = |e: LiveEvent| {
        let LiveEvent::Final { end, text, .. } = e else {
            return;
        };
        if failed.is_some() {
            return;
        }
        let now = Instant::now();
        // When the speech ended, on the stream's clock (a live source delivers sample k
        // k/16000 s after its first): later reads that lagged behind do not hide the wait.
        // A stream faster than real time (a file replayed) has no such clock: there, when
        // the sample was read.
        let end_sample = (end * 16_000.0) as usize;
        let arrived = arrivals.borrow();
        let read_at = arrived
            .iter()
            .find(|(n, _)| *n >= end_sample)
            .map_or(now, |(_, t)| *t);
        let clock = arrived.first().map(|(n, t)| {
            *t + std::time::Duration::from_secs_f64(
                (end_sample.saturating_sub(*n)) as f64 / 16_000.0,
            )
        });
        drop(arrived);
        let spoke = clock.filter(|c| *c <= now).unwrap_or(read_at);
        eprintln!("you: {text}");
        eprint!("kiln: ");
        let mut io_err = None;
        let res = pipeline.reply(&text, now, 0.0, opts, &mut |ev| {
            let r = match ev {
                VoiceEvent::Text(t) => {
                    eprint!("{t}");
                    Ok(())
                }
                VoiceEvent::Audio(s) => match file.as_mut() {
                    Some(f) => f.write(s),
                    None => {
                        let mut o = std::io::stdout().lock();
                        o.write_all(&pcm16(s)).and_then(|_| o.flush())
                    }
                },
                _ => Ok(()),
            };
            match r {
                Ok(()) => true,
                Err(e) => {
                    io_err = Some(e);
                    false
                }
            }
        });
        eprintln!();
        match (res, io_err) {
            (_, Some(e)) => failed = Some(anyhow::Error::from(e).context("writing the reply")),
            (Err(e), None) => failed = Some(e.into()),
            (Ok(st), None) => {
                turns += 1;
                let waited = now.duration_since(spoke).as_secs_f64() * 1e3;
                eprintln!(
                    "first audio {:.0} ms after the end of speech ({:.0} ms to the turn's final transcript, --end-silence-ms included, then TTFT {:.0} ms, first audio {:.0} ms)",
                    waited + st.first_audio_ms,
                    waited,
                    st.ttft_ms,
                    st.first_audio_ms
                );
            }
        }
    };
    let mut live = Live::new(
        std::sync::Arc::new(vad),
        LiveOptions {
            end_silence_ms: a.end_silence_ms,
            // Nobody reads partial transcripts here: they would only delay the turn's end.
            partial_every_ms: 0,
            ..Default::default()
        },
    );
    let mut fed = 0usize;
    crate::stt_cmd::feed_live(&a.input, &mut |samples| {
        fed += samples.len();
        arrivals.borrow_mut().push((fed, Instant::now()));
        live.push(samples, &mut transcribe, &mut on)?;
        Ok(())
    })?;
    live.finish(&mut transcribe, &mut on)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(out) = file {
        out.commit()?;
    }
    eprintln!("{turns} turn(s) answered");
    Ok(())
}
