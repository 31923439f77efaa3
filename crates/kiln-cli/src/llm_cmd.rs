//! `kiln run` and `kiln chat`.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_backend::Backend;
use kiln_runtime::engine::{EngineInfo, EngineSetup, LlmEngine};
use kiln_runtime::{
    GenerateOptions, GenerationDefaults, GenerationStats, Grammar, Llm, SamplerConfig,
};
use kiln_text::Message;

use crate::{resolve_model, Device, ModelArgs};

/// Sampling options. Left unset, a Hugging Face model's `generation_config.json` decides,
/// then kiln's defaults (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1).
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Temperature; 0 is greedy.
    #[arg(long)]
    pub temp: Option<f32>,
    /// Top-k (0 disables).
    #[arg(long = "top-k")]
    pub top_k: Option<usize>,
    /// Top-p (1 disables).
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// Min-p (0 disables).
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 disables).
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: fixed, so runs repeat).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Stop when this text is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Constrain the output to JSON valid against this JSON schema (a file, or the schema
    /// itself when it starts with `{`).
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA", conflicts_with_all = ["grammar", "regex", "json"])]
    pub json_schema: Option<String>,
    /// Constrain the output to any JSON object.
    #[arg(long, conflicts_with_all = ["grammar", "regex"])]
    pub json: bool,
    /// Constrain the output to a grammar (a file in Lark syntax: `start: ...`).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    pub grammar: Option<std::path::PathBuf>,
    /// Constrain the output to match a regular expression.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
}

impl SamplingArgs {
    /// The user's values over the model's defaults over kiln's.
    fn options(&self, model: &GenerationDefaults) -> anyhow::Result<GenerateOptions> {
        let base = model.apply(&SamplerConfig {
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplerConfig::default()
        });
        Ok(GenerateOptions {
            grammar: self.grammar()?,
            logprobs: None,
            logit_bias: Vec::new(),
            max_tokens: self.n_predict,
            stop: self.stop.clone(),
            sampler: SamplerConfig {
                temperature: self.temp.unwrap_or(base.temperature),
                top_k: self.top_k.unwrap_or(base.top_k),
                top_p: self.top_p.unwrap_or(base.top_p),
                min_p: self.min_p.unwrap_or(base.min_p),
                repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
                ..base
            },
        })
    }

    /// The output constraint the flags ask for (files read and JSON parsed here, so a bad
    /// one is an error before the model loads).
    fn grammar(&self) -> anyhow::Result<Option<Grammar>> {
        if let Some(s) = &self.json_schema {
            let (text, from) = if s.trim_start().starts_with('{') {
                (s.clone(), "--json-schema".to_string())
            } else {
                let t = std::fs::read_to_string(s).with_context(|| format!("reading {s}"))?;
                (t, s.clone())
            };
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{from}: not a JSON schema"))?;
            return Ok(Some(Grammar::JsonSchema(v)));
        }
        if self.json {
            return Ok(Some(Grammar::JsonObject));
        }
        if let Some(p) = &self.grammar {
            let t =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            return Ok(Some(Grammar::Lark(t)));
        }
        Ok(self.regex.clone().map(Grammar::Regex))
    }
}

/// Speculative decoding: a drafter guesses tokens, the model checks them in one pass.
#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Draft by prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// last N tokens (N down to 1). Pays when the answer repeats the prompt (edits, code).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..), conflicts_with = "draft")]
    pub lookup: Option<u16>,
    /// Draft with a smaller model sharing the model's tokenizer (file, directory or catalog
    /// name).
    #[arg(long, value_name = "MODEL")]
    pub draft: Option<String>,
    /// Most tokens drafted per step.
    #[arg(long = "draft-max", value_name = "K", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub draft_max: u16,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Send the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Loads `model` onto `backend` with the options of `m`.
pub fn load_on<B: Backend>(backend: B, model: &str, m: &ModelArgs) -> anyhow::Result<Llm<B>> {
    let path = resolve_model(model)?;
    let mut llm = Llm::load_quantized(backend, &path, m.quant)
        .with_context(|| format!("loading {}", path.display()))?;
    let kv = m.kv_type.unwrap_or_else(|| llm.kv_type_default());
    llm.set_kv_type(kv)?;
    Ok(llm)
}

/// `--reference` is the CPU's scalar path: refused with another device.
pub fn check_reference(m: &ModelArgs) -> anyhow::Result<()> {
    if m.reference && m.device != Device::Cpu {
        anyhow::bail!("--reference runs on the CPU only (leave out --device)");
    }
    Ok(())
}

/// The LLM engine for `m` (its model, device and options; `spec`: speculative decoding; a
/// session of `n_ctx` positions) on a thread of its own. With [`spawn_scheduler`], where an
/// LLM command's device picks a backend type: everything after talks to the device-erased
/// handle.
pub fn spawn_engine(
    m: &ModelArgs,
    spec: Option<&SpecArgs>,
    n_ctx: usize,
) -> anyhow::Result<LlmEngine> {
    check_reference(m)?;
    let spec = spec.cloned();
    // The backend first (a missing GPU is the first error), then the models, on the engine's
    // thread.
    fn setup<B: Backend>(
        backend: &dyn Fn() -> anyhow::Result<B>,
        m: &ModelArgs,
        spec: Option<SpecArgs>,
        n_ctx: usize,
    ) -> anyhow::Result<EngineSetup<B>> {
        let llm = load_on(backend()?, &m.model, m)?;
        let draft = match spec.as_ref().and_then(|s| s.draft.as_deref()) {
            Some(d) => Some(load_on(backend()?, d, m)?),
            None => None,
        };
        Ok(EngineSetup {
            llm,
            draft,
            n_ctx,
            lookup: spec.as_ref().and_then(|s| s.lookup).map(usize::from),
            draft_max: spec.map_or(4, |s| s.draft_max as usize),
        })
    }
    let m = m.clone();
    match m.device {
        Device::Cpu => LlmEngine::spawn(move || {
            let cpu = || {
                Ok(if m.reference {
                    CpuBackend::reference()
                } else {
                    CpuBackend::new(m.threads.unwrap_or_else(default_threads).max(1))
                })
            };
            setup(&cpu, &m, spec, n_ctx)
        }),
        Device::Cuda => LlmEngine::spawn(move || setup(&crate::cuda_backend, &m, spec, n_ctx)),
        Device::Gpu => LlmEngine::spawn(move || {
            let adapter = m.adapter.clone();
            setup(&|| crate::gpu_backend(adapter.as_deref()), &m, spec, n_ctx)
        }),
    }
}

/// The scheduler (`kiln serve`, `kiln voice`) for GGUF `file` on `device` (`adapter`: the
/// wgpu one; `cpu`: how the CPU backend is made, on the engine's thread), its slots' KV
/// caches checked to fit. A GPU that cannot be opened is the first error, said here.
pub fn spawn_scheduler(
    cfg: kiln_runtime::SchedulerConfig,
    file: &std::path::Path,
    device: Device,
    adapter: Option<String>,
    cpu: impl FnOnce() -> CpuBackend + Send + 'static,
) -> anyhow::Result<kiln_runtime::Scheduler> {
    use kiln_runtime::{RuntimeError, Scheduler};
    fn load<B: Backend>(
        backend: anyhow::Result<B>,
        path: &std::path::Path,
        (n_ctx, slots): (usize, usize),
    ) -> Result<Llm<B>, RuntimeError> {
        // A backend that could not be opened on the engine's thread, as a load error.
        let backend = backend.map_err(|e| RuntimeError::Path {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        let llm = Llm::load(backend, path)?;
        if slots > 0 {
            llm.check_kv_memory(n_ctx, slots)?;
        }
        Ok(llm)
    }
    let (path, fit) = (file.to_path_buf(), (cfg.n_ctx, cfg.slots));
    match device {
        Device::Cpu => Scheduler::spawn(cfg, move || load(Ok(cpu()), &path, fit)),
        Device::Cuda => {
            drop(crate::cuda_backend()?);
            // The CUDA cache is device memory taken in blocks as sequences grow (not the
            // slots' full contexts up front, nor host memory): nothing to check here; a step
            // that finds no block left first empties the idle slots' prefix caches, then
            // fails its requests with the cache's error.
            let fit = (fit.0, 0);
            Scheduler::spawn(cfg, move || load(crate::cuda_backend(), &path, fit))
        }
        Device::Gpu => {
            drop(crate::gpu_backend(adapter.as_deref())?);
            // wgpu's caches grow as sequences do, within the adapter's memory (the host's
            // available memory where it shares it: `gpu_backend`), as on CUDA.
            let fit = (fit.0, 0);
            Scheduler::spawn(cfg, move || {
                load(crate::gpu_backend(adapter.as_deref()), &path, fit)
            })
        }
    }
    .with_context(|| format!("loading {}", file.display()))
}

/// Weights and KV cache sizes, printed at load.
fn memory_line(e: &EngineInfo) -> String {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    // A cache that grows with its sequence (CUDA, wgpu) holds less than its full size now.
    let growing = if e.kv_bytes < e.kv_bytes_full {
        format!(" now, {:.1} MiB full", mib(e.kv_bytes_full))
    } else {
        String::new()
    };
    format!(
        "memory: weights {:.1} MiB | KV cache {} x {} positions {:.1} MiB{growing}",
        mib(e.weight_bytes),
        e.kv_type,
        e.n_ctx,
        mib(e.kv_bytes)
    )
}

fn stats_line(s: &GenerationStats) -> String {
    let decode = if s.speculative {
        format!(
            "decode {:.1} tok/s ({:.1} passes/s) | drafts {}/{} accepted ({:.0}%)",
            s.effective_decode_tps(),
            s.decode_tps(),
            s.accepted,
            s.drafted,
            100.0 * s.acceptance(),
        )
    } else {
        format!("decode {:.1} tok/s", s.decode_tps())
    };
    format!(
        "prompt {} tok{} | ttft {:.0} ms | prefill {:.1} tok/s | {decode} | {} tok generated",
        s.prompt_tokens,
        if s.cached_tokens > 0 {
            format!(" (+{} cached)", s.cached_tokens)
        } else {
            String::new()
        },
        s.ttft_secs * 1e3,
        s.prefill_tps(),
        s.generated_tokens,
    )
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    a.sampling.grammar()?; // a bad schema or grammar file: said before the model loads
    let llm = spawn_engine(&a.model, Some(&a.spec), a.model.ctx_size)?;
    let ids = if a.raw {
        llm.tokenize(&a.prompt, true)?
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &a.prompt));
        llm.tokenize(&llm.render_chat(&msgs)?, false)?
    };
    let mut out = std::io::stdout().lock();
    let opts = a.sampling.options(&llm.info().generation)?;
    let stats = llm.generate(&ids, &opts, &mut |t| {
        // A closed stdout (e.g. `| head`) ends generation quietly.
        out.write_all(t.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    })?;
    let _ = writeln!(out);
    // After the answer, so a failed run stays one line on stderr.
    eprintln!("{}", memory_line(llm.info()));
    eprintln!("{}", stats_line(&stats));
    crate::leave_for_exit(llm);
    Ok(())
}

pub fn chat(a: ChatArgs) -> anyhow::Result<()> {
    a.sampling.grammar()?;
    let llm = spawn_engine(&a.model, Some(&a.spec), a.model.ctx_size)?;
    let info = llm.info();
    eprintln!("{}", memory_line(info));
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(Message::new("system", s));
    }
    let opts = a.sampling.options(&info.generation)?;
    eprintln!(
        "kiln chat — {} ({}); /reset clears, /exit or Ctrl-D quits",
        info.path.display(),
        info.backend
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                msgs.retain(|m: &Message| m.role == "system");
                llm.reset();
                continue;
            }
            _ => {}
        }
        msgs.push(Message::new("user", text));
        let ids = llm.tokenize(&llm.render_chat(&msgs)?, false)?;
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let res = llm.generate(&ids, &opts, &mut |t| {
            reply.push_str(t);
            out.write_all(t.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        });
        match res {
            Ok(stats) => {
                let _ = writeln!(out);
                eprintln!("[{}]", stats_line(&stats));
                msgs.push(Message::new("assistant", reply.trim()));
            }
            Err(e) => {
                // The conversation outgrew the context: say so and keep the session usable.
                msgs.pop();
                eprintln!("kiln: error: {e}");
            }
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Texts to embed (none: one per line of stdin).
    pub texts: Vec<String>,
}

/// `kiln embed`: one JSON array per input, in order.
pub fn embed(a: EmbedArgs) -> anyhow::Result<()> {
    let texts: Vec<String> = if a.texts.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("reading stdin")?
    } else {
        a.texts.clone()
    };
    let llm = spawn_engine(&a.model, None, a.model.ctx_size)?;
    let mut out = std::io::stdout().lock();
    for (i, t) in texts.iter().enumerate() {
        let ids = llm.tokenize(t, true)?;
        let v = llm
            .embed(&ids)
            .with_context(|| format!("input {} ({} tokens)", i + 1, ids.len()))?;
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    Ok(())
}
