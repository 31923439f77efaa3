//! `kiln serve`: the OpenAI-compatible server.

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::{Llm, Scheduler, SchedulerConfig};
use kiln_server::{AppState, ServerConfig};

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
    /// Largest request body in bytes (larger: 413).
    #[arg(long = "max-body", value_name = "BYTES", default_value_t = 1 << 20)]
    pub max_body: usize,
}

/// The model's name for clients: a catalog name as given, else the file's stem.
fn model_id(model: &str, path: &std::path::Path) -> String {
    if kiln_assets::entry(model).is_some() {
        return model.to_string();
    }
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string())
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let path = resolve_model(&a.model.model)?;
    let file = kiln_runtime::find_gguf(&path)?;
    let id = model_id(&a.model.model, &file);
    let (reference, threads) = (a.model.reference, a.model.threads);
    let cfg = SchedulerConfig {
        slots: a.parallel as usize,
        n_ctx: a.model.ctx_size,
        prefill_chunk: a.prefill_chunk as usize,
        max_queue: a.max_queue,
    };
    let load_path = file.clone();
    let sched = Scheduler::spawn(cfg, move || {
        let backend = if reference {
            CpuBackend::reference()
        } else {
            CpuBackend::new(threads.unwrap_or_else(default_threads).max(1))
        };
        Llm::load(backend, &load_path)
    })
    .with_context(|| format!("loading {}", file.display()))?;
    let info = sched.info().clone();
    let state = AppState::new(
        sched,
        ServerConfig {
            model_id: id.clone(),
            api_key: a.api_key.clone(),
            max_body: a.max_body,
        },
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
