//! `kiln`: run, chat, serve, transcribe, speak, voice, info, pull, bench, quantize, perplexity.

mod audio_out;
mod bench;
mod calibrate;
mod info;
mod llm_cmd;
mod perplexity;
mod quantize;
mod serve_cmd;
mod speak;
mod stt_cmd;
mod voice_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

/// The system allocator with the per-thread memory bound that chat template rendering runs
/// under (templates come from model files; see kiln_text::Limits).
#[global_allocator]
static ALLOC: kiln_text::GuardedAlloc = kiln_text::GuardedAlloc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_assets::Progress;

pub const DEFAULT_LLM: &str = "smollm2-135m-instruct";

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
    /// The portable GPU backend (wgpu: Vulkan, Metal).
    Gpu,
}

/// The CUDA backend on the first GPU, or why there is none.
#[cfg(feature = "cuda")]
pub fn cuda_backend() -> anyhow::Result<kiln_cuda::CudaBackend> {
    Ok(kiln_cuda::CudaBackend::new()?)
}

/// The GPU memory's read bandwidth, bytes a second (best of `reps`).
#[cfg(feature = "cuda")]
pub fn cuda_read_bandwidth(b: &kiln_cuda::CudaBackend, reps: usize) -> anyhow::Result<f64> {
    b.read_bandwidth(reps).map_err(anyhow::Error::msg)
}

/// The CUDA backend for Whisper: cuBLAS loads only for a model whose products want it (small
/// and up); tiny and base run on kiln's own kernels and skip the library's ~0.25 s start.
#[cfg(feature = "cuda")]
pub fn cuda_stt_backend() -> anyhow::Result<kiln_cuda::CudaBackend> {
    Ok(kiln_cuda::CudaBackend::with_blas(
        0,
        kiln_cuda::BlasStart::OnDemand,
    )?)
}

/// This build has no CUDA backend.
#[cfg(not(feature = "cuda"))]
pub fn cuda_stt_backend() -> anyhow::Result<kiln_backend::cpu::CpuBackend> {
    cuda_backend()
}

/// The CUDA backend's type (the CPU's in a build without CUDA, where it is never made).
#[cfg(feature = "cuda")]
pub type CudaBackendType = kiln_cuda::CudaBackend;
#[cfg(not(feature = "cuda"))]
pub type CudaBackendType = kiln_backend::cpu::CpuBackend;

/// This build has no CUDA backend.
#[cfg(not(feature = "cuda"))]
pub fn cuda_backend() -> anyhow::Result<kiln_backend::cpu::CpuBackend> {
    anyhow::bail!("--device cuda: this kiln was built without CUDA (build with `cargo build --release -p kiln-cli --features cuda`)")
}

#[cfg(not(feature = "cuda"))]
pub fn cuda_read_bandwidth(_: &kiln_backend::cpu::CpuBackend, _: usize) -> anyhow::Result<f64> {
    anyhow::bail!("--device cuda: this kiln was built without CUDA")
}

/// Ends a one-shot command without tearing `model` down: the process exits next and the
/// system takes back its memory and device at once, where dropping a CUDA model frees each
/// buffer and the context in turn (about 0.1 s on an H100 for Whisper tiny).
pub fn leave_for_exit<T>(model: T) {
    // Dropped where a report prints at the teardown (KILN_CUDA_TIMES), or where asked to
    // (KILN_TEARDOWN=1, for measuring what it costs); both dev-switches.
    use kiln_backend::options::dev_flag;
    if dev_flag("KILN_CUDA_TIMES") || dev_flag("KILN_TEARDOWN") {
        drop(model);
    } else {
        std::mem::forget(model);
    }
}

/// The wgpu backend on the best adapter (discrete > integrated > CPU), or the first whose
/// name contains `adapter`; or why there is none.
#[cfg(feature = "gpu")]
pub fn gpu_backend(adapter: Option<&str>) -> anyhow::Result<kiln_wgpu::WgpuBackend> {
    let opt = kiln_wgpu::GpuOptions {
        adapter: adapter.map(str::to_string),
        ..Default::default()
    };
    let b = kiln_wgpu::WgpuBackend::with_options(&opt)?;
    // KV caches grow as sequences do (kiln-wgpu/src/kv.rs). On an adapter whose memory is
    // the host's they may take what the host has available now, no more: past it a
    // reservation fails (the scheduler empties idle caches first) instead of swapping.
    if b.shares_host_memory() && !kiln_backend::options::get().no_memory_check {
        b.set_kv_byte_limit(kiln_runtime::memory::available_bytes().map(|v| v as usize));
    }
    Ok(b)
}

/// This build has no wgpu backend.
#[cfg(not(feature = "gpu"))]
pub fn gpu_backend(_adapter: Option<&str>) -> anyhow::Result<kiln_backend::cpu::CpuBackend> {
    anyhow::bail!("--device gpu: this kiln was built without the wgpu backend (build with `cargo build --release -p kiln-cli --features gpu`)")
}

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Fast on-device inference: LLMs, speech-to-text, text-to-speech"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    opts: RuntimeFlags,
}

/// How kiln computes, for any command; each flag wins over its environment variable
/// (README, "Environment").
#[derive(clap::Args)]
struct RuntimeFlags {
    /// CPU: the scalar kernels only [env: KILN_NO_SIMD]
    #[arg(long, global = true)]
    no_simd: bool,
    /// CPU: the AVX2 kernels on an AVX-512 machine [env: KILN_NO_AVX512]
    #[arg(long, global = true)]
    no_avx512: bool,
    /// CPU: no AVX-VNNI kernels; with --no-avx512, the AVX2 ones of CPUs before Alder Lake and
    /// Zen 5 [env: KILN_NO_AVX_VNNI]
    #[arg(long, global = true)]
    no_avx_vnni: bool,
    /// CPU: no AMX tiles, as most CPUs (AMD, Apple, consumer Intel) [env: KILN_NO_AMX]
    #[arg(long, global = true)]
    no_amx: bool,
    /// CPU: no AVX-512 BF16 products, as Intel CPUs before Cooper Lake [env: KILN_NO_BF16]
    #[arg(long, global = true)]
    no_bf16: bool,
    /// CUDA: launch decode steps op by op instead of replaying graphs [env: KILN_CUDA_NO_GRAPHS]
    #[arg(long, global = true)]
    no_cuda_graphs: bool,
    /// Bytes a model may take before it is refused (default: the memory available)
    /// [env: KILN_MEMORY_LIMIT]
    #[arg(long, global = true, value_name = "BYTES")]
    memory_limit: Option<u64>,
    /// Load models without checking that they fit in memory [env: KILN_NO_MEMORY_CHECK]
    #[arg(long, global = true)]
    no_memory_check: bool,
    /// Print a summary of named activations per layer to stderr [env: KILN_TRACE]
    #[arg(long, global = true)]
    trace: bool,
}

impl RuntimeFlags {
    /// The flags over the environment's options.
    fn options(&self) -> kiln_backend::options::RuntimeOptions {
        let mut o = kiln_backend::options::RuntimeOptions::from_env();
        o.no_simd |= self.no_simd;
        o.no_avx512 |= self.no_avx512;
        o.no_avx_vnni |= self.no_avx_vnni;
        o.no_amx |= self.no_amx;
        o.no_bf16 |= self.no_bf16;
        o.no_cuda_graphs |= self.no_cuda_graphs;
        o.memory_limit = self.memory_limit.or(o.memory_limit);
        o.no_memory_check |= self.no_memory_check;
        o.trace |= self.trace;
        o
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a reply to one prompt, streamed to stdout; stats to stderr.
    Run(llm_cmd::RunArgs),
    /// Interactive multi-turn chat.
    Chat(llm_cmd::ChatArgs),
    /// Embeddings of texts (arguments, else one per line of stdin): one JSON array per
    /// line, unit length, pooled as the model says (the last token by default).
    Embed(llm_cmd::EmbedArgs),
    /// OpenAI-compatible HTTP server with continuous batching.
    Serve(serve_cmd::ServeArgs),
    /// Speech to text with Whisper: txt, srt, vtt or json on stdout; stats to stderr.
    Transcribe(stt_cmd::TranscribeArgs),
    /// Speak text (Kokoro-82M): WAV or raw PCM to a file or stdout, sentence by sentence.
    Speak(speak::SpeakArgs),
    /// One spoken turn: speech in -> Whisper -> LLM -> Kokoro -> a reply WAV, streamed by
    /// sentence; prints the transcript, the reply and the stage latencies.
    Voice(voice_cmd::VoiceArgs),
    /// Describe a model file: format, architecture, hyper-parameters, tensors, tokenizer.
    Info {
        /// A model file, directory, catalog name, alias or Hugging Face repository.
        model: String,
        /// List every tensor (default: the first layers and the rest summarised).
        #[arg(long)]
        all: bool,
    },
    /// Fetch a model: a Hugging Face repository (owner/repo[:QUANT], into the Hub's cache),
    /// an alias (qwen3:0.6b, whisper:base, ...) or a catalog name (into $KILN_HOME, default
    /// ~/.cache/kiln). A repository in the cache is checked against the Hub for a newer
    /// commit. No name: the aliases and the catalog.
    Pull { name: Option<String> },
    /// The models in the caches: name, size, source, when kiln last used it.
    #[command(alias = "ls")]
    List,
    /// Remove a model from the caches (a catalog name, an alias, or hf:owner/repo).
    Rm { name: String },
    /// Measure prompt processing and decode speed, reported like llama-bench.
    Bench(bench::BenchArgs),
    /// Write a GGUF file (for kiln or llama.cpp) from a Hugging Face / MLX directory or a
    /// GGUF, its matrices quantized.
    Quantize(quantize::QuantizeArgs),
    /// Perplexity of a text file, computed and printed like llama-perplexity.
    Perplexity(perplexity::PerplexityArgs),
}

/// Options every LLM command shares.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF file, a directory, a catalog name, an alias (qwen3:0.6b), a Hugging Face
    /// repository (owner/repo[:QUANT], hf:owner/repo/file.gguf) or ollama:NAME[:TAG]
    /// (fetched on first use).
    #[arg(short = 'm', long, default_value = DEFAULT_LLM)]
    pub model: String,
    /// Threads (default: all CPUs).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Use the scalar reference path (weights dequantized to f32): slow, for checking.
    #[arg(long)]
    pub reference: bool,
    /// Requantize every weight matrix at load: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k,
    /// f16, bf16, f32 (rows the block does not divide fall back like llama.cpp's).
    #[arg(long, value_name = "TYPE", value_parser = parse_quant)]
    pub quant: Option<kiln_quant::GgmlType>,
    /// How the KV cache stores keys and values: f32, f16, q8_0 (head sizes a multiple of
    /// 32). Default: f16 where the device's attention reads it directly (CUDA, x86 CPUs with
    /// F16C), else f32.
    #[arg(long = "kv-type", value_name = "TYPE", value_parser = parse_kv)]
    pub kv_type: Option<kiln_backend::KvType>,
    /// Where the model runs: cpu; cuda (a build with `--features cuda` and an NVIDIA GPU);
    /// gpu (a build with `--features gpu`: wgpu on Vulkan or Metal).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: Device,
    /// With --device gpu: the first adapter whose name contains this (case-insensitive).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
}

pub(crate) fn parse_kv(s: &str) -> Result<kiln_backend::KvType, String> {
    kiln_backend::KvType::parse(s)
        .ok_or_else(|| format!("unknown KV cache type '{s}' (f32, f16, q8_0)"))
}

/// A GGML type by its name (any case): q4_0, Q4_K, f16, ...
pub fn parse_quant(s: &str) -> Result<kiln_quant::GgmlType, String> {
    use kiln_quant::GgmlType::*;
    let all = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
    ];
    all.into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|t| t.name().to_lowercase()).collect();
            format!("unknown type '{s}' (one of {})", names.join(", "))
        })
}

fn main() -> ExitCode {
    kiln_backend::cpu::retain_freed_memory();
    let cli = Cli::parse();
    // Before anything reads them (nothing has: no backend exists yet).
    let _ = kiln_backend::options::init(cli.opts.options());
    let res = match cli.cmd {
        Cmd::Run(a) => llm_cmd::run(a),
        Cmd::Chat(a) => llm_cmd::chat(a),
        Cmd::Embed(a) => llm_cmd::embed(a),
        Cmd::Serve(a) => serve_cmd::serve(a),
        Cmd::Transcribe(a) => stt_cmd::transcribe(a),
        Cmd::Speak(a) => speak::speak(a),
        Cmd::Voice(a) => voice_cmd::voice(a),
        Cmd::Info { model, all } => resolve_model(&model).and_then(|p| info::info(&p, all)),
        Cmd::Pull { name } => pull(name),
        Cmd::List => list(),
        Cmd::Rm { name } => rm(&name),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::Quantize(a) => quantize::quantize(a),
        Cmd::Perplexity(a) => perplexity::perplexity(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            eprintln!("kiln: error: {}", msg.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// A path as given, or a model fetched into the cache (first use) with a progress bar.
pub fn resolve_model(model: &str) -> anyhow::Result<PathBuf> {
    fetch_model(model, false)
}

fn fetch_model(model: &str, refresh: bool) -> anyhow::Result<PathBuf> {
    let bar = ProgressBar::hidden();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let mut shown = false;
    let mut show = |p: Progress| {
        shown = true;
        show_progress(&bar, p)
    };
    let res = if refresh {
        kiln_assets::pull(model, &mut show)
    } else {
        kiln_assets::resolve(model, &mut show)
    };
    if shown {
        bar.finish_and_clear();
    }
    Ok(res?)
}

fn show_progress(bar: &ProgressBar, p: Progress) {
    match p {
        Progress::Downloading { spec } => {
            bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap());
            bar.set_message(format!("downloading {spec}"));
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        Progress::Bytes { what, done, total } => {
            if bar.length() != Some(total) {
                bar.disable_steady_tick();
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
                    )
                    .unwrap()
                    .progress_chars("=> "),
                );
                bar.set_length(total);
                bar.set_message(what.to_string());
            }
            bar.set_position(done);
        }
        Progress::Notice(text) => bar.suspend(|| eprintln!("kiln: {text}")),
        Progress::Done => bar.finish_and_clear(),
    }
}

fn pull(name: Option<String>) -> anyhow::Result<()> {
    let Some(name) = name else {
        println!(
            "{:<18} {:<8} HUGGING FACE (MIRROR WHERE IT IS NOT REACHABLE)",
            "ALIAS", ""
        );
        for a in kiln_assets::ALIASES {
            let mirror = a.mirror.map(|m| format!(" ({m})")).unwrap_or_default();
            println!("{:<18} {:<8} {}{mirror}", a.name, "", a.repo);
        }
        println!();
        println!("{:<24} {:<8} ABOUT", "CATALOG NAME", "CACHED");
        for e in kiln_assets::CATALOG {
            let cached = if kiln_assets::is_cached(e) {
                "yes"
            } else {
                "no"
            };
            println!("{:<24} {:<8} {}", e.name, cached, e.about);
        }
        return Ok(());
    };
    if std::path::Path::new(&name).exists() {
        anyhow::bail!("{name} is a local path: there is nothing to pull");
    }
    let path = fetch_model(&name, true)?;
    println!("{}", path.display());
    Ok(())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.0} MB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.0} KB", b as f64 / 1024.0),
    }
}

fn ago(t: Option<std::time::SystemTime>) -> String {
    let Some(t) = t else {
        return "never".into();
    };
    let s = t.elapsed().map(|d| d.as_secs()).unwrap_or(0);
    match s {
        s if s < 60 => "just now".into(),
        s if s < 3600 => format!("{} minutes ago", s / 60),
        s if s < 86400 => format!("{} hours ago", s / 3600),
        s => format!("{} days ago", s / 86400),
    }
}

fn list() -> anyhow::Result<()> {
    let models = kiln_assets::list_cached();
    println!("{:<44} {:>9}  {:<16} SOURCE", "NAME", "SIZE", "LAST USED");
    for m in models {
        println!(
            "{:<44} {:>9}  {:<16} {}",
            m.name,
            human_bytes(m.bytes),
            ago(m.last_used),
            m.source
        );
    }
    Ok(())
}

fn rm(name: &str) -> anyhow::Result<()> {
    for dir in kiln_assets::remove(name)? {
        println!("removed {}", dir.display());
    }
    Ok(())
}
