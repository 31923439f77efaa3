//! `kiln serve`: the OpenAI-compatible server.

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::SchedulerConfig;
use kiln_server::{AppState, AudioModels, ServerConfig};
use std::sync::Arc;

use crate::speak::{DEFAULT_TTS, DEFAULT_VOICE};
use crate::stt_cmd::{Quant, SttModelArgs, VadArg, DEFAULT_STT};
use crate::{resolve_model, ModelArgs};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// Requests decoded together (each has its own KV cache of -c tokens).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Requests waiting for a slot before new ones get 429.
    #[arg(long = "max-queue", value_name = "N", default_value_t = 64)]
    pub max_queue: usize,
    /// Prompt tokens prefilled per step (long prompts are spread over steps so running
    /// streams keep flowing).
    #[arg(long = "prefill-chunk", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub prefill_chunk: u32,
    /// A request still generating this many seconds after it arrived ends there (finish
    /// reason "length"); 0: no limit.
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body in bytes (larger: 413).
    #[arg(long = "max-body", value_name = "BYTES", default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Whisper model for /v1/audio/transcriptions and /v1/audio/chat (default:
    /// whisper-tiny.en, skipped with a warning when it cannot be had; `none`: no STT).
    #[arg(long, value_name = "MODEL")]
    pub stt: Option<String>,
    /// Kokoro model for /v1/audio/speech and /v1/audio/chat (default: kokoro-82m, skipped
    /// with a warning when it cannot be had; `none`: no TTS).
    #[arg(long, value_name = "MODEL")]
    pub tts: Option<String>,
    /// Serve the LLM only: no speech models, no audio routes.
    #[arg(long = "no-audio", conflicts_with_all = ["stt", "tts"])]
    pub no_audio: bool,
    /// Largest audio upload in bytes (larger: 413).
    #[arg(long = "max-upload", value_name = "BYTES", default_value_t = 25 << 20)]
    pub max_upload: usize,
    /// Longest audio the audio-in routes take, in seconds (longer: 400).
    #[arg(long = "max-audio", value_name = "SECS", default_value_t = 3600.0)]
    pub max_audio: f64,
}

/// Loads a speech model: an explicit one must load; the default one is skipped (with a
/// warning) when it cannot be had.
fn optional<T>(
    given: &Option<String>,
    default: &str,
    what: &str,
    load: impl FnOnce(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Option<(String, T)>> {
    let name = given.as_deref().unwrap_or(default);
    if name == "none" {
        return Ok(None);
    }
    match load(name) {
        Ok(m) => Ok(Some((name.to_string(), m))),
        Err(e) if given.is_none() => {
            eprintln!("kiln serve: warning: no {what} ({name}: {e:#}); its routes answer 404");
            Ok(None)
        }
        Err(e) => Err(e.context(format!("loading the {what} model {name}"))),
    }
}

/// The model's name for clients: a catalog name, alias or Hugging Face repository as given,
/// else the file's stem.
fn model_id(model: &str, path: &std::path::Path) -> String {
    let named = kiln_assets::entry(model).is_some()
        || kiln_assets::alias_of(model).is_some()
        || (!std::path::Path::new(model).exists() && kiln_assets::hub::parse(model).is_some());
    if named {
        return model.to_string();
    }
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string())
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let path = resolve_model(&a.model.model)?;
    let file = kiln_runtime::llm_path(&path)?;
    let id = model_id(&a.model.model, &file);
    let (reference, threads) = (a.model.reference, a.model.threads);
    let cfg = SchedulerConfig {
        slots: a.parallel as usize,
        n_ctx: a.model.ctx_size,
        prefill_chunk: a.prefill_chunk as usize,
        max_queue: a.max_queue,
        timeout: (a.timeout > 0).then(|| std::time::Duration::from_secs(a.timeout)),
    };
    crate::llm_cmd::check_reference(&a.model)?;
    // The LLM, Whisper and Kokoro (on the LLM's device, each on a thread of its own) load at
    // once; a failure is said in that order.
    let (device, adapter) = (a.model.device, a.model.adapter.as_deref());
    let (sched, stt, tts) = std::thread::scope(|s| {
        let stt = (!a.no_audio).then(|| {
            s.spawn(|| {
                optional(&a.stt, DEFAULT_STT, "speech-to-text", |m| {
                    let args = SttModelArgs {
                        model: m.to_string(),
                        threads,
                        quant: Quant::None,
                        vad: VadArg::Auto,
                    };
                    crate::stt_cmd::spawn(device, adapter, &args)
                })
            })
        });
        let tts = (!a.no_audio).then(|| {
            s.spawn(|| {
                optional(&a.tts, DEFAULT_TTS, "text-to-speech", |m| {
                    crate::speak::spawn(device, adapter, m, false, None, threads)
                })
            })
        });
        let sched = crate::llm_cmd::spawn_scheduler(
            cfg,
            &file,
            device,
            a.model.adapter.clone(),
            move || match reference {
                true => CpuBackend::reference(),
                false => CpuBackend::new(threads.unwrap_or_else(default_threads).max(1)),
            },
        );
        let (stt, tts) = (
            stt.map(kiln_runtime::join_scoped),
            tts.map(kiln_runtime::join_scoped),
        );
        (sched, stt, tts)
    });
    let sched = sched?;
    let (stt, tts) = (stt.transpose()?.flatten(), tts.transpose()?.flatten());
    let info = sched.info().clone();
    let mut audio = AudioModels {
        max_upload: a.max_upload,
        max_audio_secs: a.max_audio,
        ..Default::default()
    };
    if !a.no_audio {
        audio.stt = stt.map(|(id, m)| (id, Arc::new(m)));
        // Live transcription's VAD (where utterances end): without it /v1/audio/live says so.
        if audio.stt.is_some() {
            let vad = crate::resolve_model(crate::stt_cmd::VAD_MODEL)
                .and_then(|p| Ok(kiln_models::vad::SileroVad::load(&p)?));
            match vad {
                Ok(v) => audio.vad = Some(Arc::new(v)),
                Err(e) => eprintln!(
                    "kiln serve: warning: no VAD ({}: {e:#}); /v1/audio/live answers 404",
                    crate::stt_cmd::VAD_MODEL
                ),
            }
        }
        audio.tts = tts.map(|(id, m)| {
            let mut voices: Vec<String> = m.voices().map(str::to_string).collect();
            // The CLI's default voice first: it is the server's default too.
            if let Some(i) = voices.iter().position(|v| v == DEFAULT_VOICE) {
                voices[..=i].rotate_right(1);
            }
            (id, Arc::new(m), voices)
        });
    }
    let stt = audio.stt.as_ref().map(|s| (&s.0, s.1.backend()));
    let tts = audio.tts.as_ref().map(|t| (&t.0, t.1.backend()));
    for (what, model) in [("speech-to-text", stt), ("text-to-speech", tts)] {
        if let Some((id, backend)) = model {
            eprintln!("kiln serve: {what}: {id} ({backend})");
        }
    }
    let state = AppState::with_audio(
        sched,
        ServerConfig {
            model_id: id.clone(),
            api_key: a.api_key.clone(),
            max_body: a.max_body,
        },
        audio,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "kiln serve: {id} ({}), {} slots of {} tokens, on {}",
            info.backend,
            info.slots,
            info.n_ctx,
            info.path.display()
        );
        eprintln!("kiln serve: listening on http://{addr}");
        kiln_server::serve(listener, state).await.context("serving")
    })
}
