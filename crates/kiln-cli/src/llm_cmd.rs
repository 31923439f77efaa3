//! `kiln run` and `kiln chat`.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_backend::Backend;
use kiln_runtime::{
    DraftModel, Drafter, GenerateOptions, GenerationDefaults, GenerationStats, Llm, LlmSession,
    PromptLookup, RuntimeError, SamplerConfig,
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
}

impl SamplingArgs {
    /// The user's values over the model's defaults over kiln's.
    fn options(&self, model: &GenerationDefaults) -> GenerateOptions {
        let base = model.apply(&SamplerConfig {
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplerConfig::default()
        });
        GenerateOptions {
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
        }
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

/// The draft model, loaded when asked for (it must outlive the drafter that borrows it).
fn load_draft<B: Backend>(
    spec: &SpecArgs,
    load: &dyn Fn(&str) -> anyhow::Result<Llm<B>>,
) -> anyhow::Result<Option<Llm<B>>> {
    spec.draft.as_deref().map(load).transpose()
}

fn drafter<'a, B: Backend>(
    spec: &SpecArgs,
    llm: &Llm<B>,
    draft: Option<&'a Llm<B>>,
    n_ctx: usize,
) -> anyhow::Result<Option<Box<dyn Drafter + 'a>>> {
    let k = spec.draft_max as usize;
    Ok(match (spec.lookup, draft) {
        (Some(n), _) => Some(Box::new(PromptLookup::new(n as usize, k))),
        (None, Some(d)) => Some(Box::new(DraftModel::new(llm, d, n_ctx, k)?)),
        (None, None) => None,
    })
}

fn generate<B: Backend>(
    session: &mut LlmSession<'_, B>,
    drafter: &mut Option<Box<dyn Drafter + '_>>,
    ids: &[u32],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<GenerationStats, RuntimeError> {
    match drafter {
        Some(d) => session.generate_speculative(ids, opts, d.as_mut(), on_text),
        None => session.generate(ids, opts, on_text),
    }
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

/// Loads `model` on the CPU with the backend options of `m`.
pub fn load(model: &str, m: &ModelArgs) -> anyhow::Result<Llm<CpuBackend>> {
    let backend = if m.reference {
        CpuBackend::reference()
    } else {
        CpuBackend::new(m.threads.unwrap_or_else(default_threads).max(1))
    };
    load_on(backend, model, m)
}

/// Loads `model` onto `backend` with the options of `m`.
pub fn load_on<B: Backend>(backend: B, model: &str, m: &ModelArgs) -> anyhow::Result<Llm<B>> {
    let path = resolve_model(model)?;
    let mut llm = Llm::load_quantized(backend, &path, m.quant)
        .with_context(|| format!("loading {}", path.display()))?;
    llm.set_kv_type(m.kv_type)?;
    Ok(llm)
}

/// `--reference` is the CPU's scalar path: refused with another device.
pub fn check_reference(m: &ModelArgs) -> anyhow::Result<()> {
    if m.reference && m.device != Device::Cpu {
        anyhow::bail!("--reference runs on the CPU only (leave out --device)");
    }
    Ok(())
}

/// Fails unless `m.device` can be opened (no GPU, no driver, a build without the backend),
/// for callers that open it later on another thread (the server's scheduler).
pub fn check_device(m: &ModelArgs) -> anyhow::Result<()> {
    check_reference(m)?;
    match m.device {
        Device::Cpu => {}
        Device::Cuda => drop(crate::cuda_backend()?),
        Device::Gpu => drop(crate::gpu_backend(m.adapter.as_deref())?),
    }
    Ok(())
}

/// Evaluates `$body` with `$l` bound to the model loader of `$m.device` (the CPU, or a new
/// CUDA / wgpu backend per model, opened before the model is looked at, so a missing GPU is
/// the first error): `$body` is a generic call, instantiated per backend.
macro_rules! with_device {
    ($m:expr, |$l:ident| $body:expr) => {{
        let m: &$crate::ModelArgs = $m;
        $crate::llm_cmd::check_reference(m)?;
        match m.device {
            $crate::Device::Cpu => {
                let $l = &|name: &str| $crate::llm_cmd::load(name, m);
                $body
            }
            $crate::Device::Cuda => {
                let $l = &|name: &str| $crate::llm_cmd::load_on($crate::cuda_backend()?, name, m);
                $body
            }
            $crate::Device::Gpu => {
                let $l = &|name: &str| {
                    $crate::llm_cmd::load_on($crate::gpu_backend(m.adapter.as_deref())?, name, m)
                };
                $body
            }
        }
    }};
}
pub(crate) use with_device;

/// Weights and KV cache sizes, printed at load.
fn memory_line<B: Backend>(llm: &Llm<B>, s: &LlmSession<'_, B>) -> String {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    format!(
        "memory: weights {:.1} MiB | KV cache {} x {} positions {:.1} MiB",
        mib(llm.model.weight_bytes(&llm.backend)),
        llm.kv_type().name(),
        s.n_ctx(),
        mib(s.kv_bytes())
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
    with_device!(&a.model, |l| run_on(&a, l))
}

fn run_on<B: Backend>(
    a: &RunArgs,
    load: &dyn Fn(&str) -> anyhow::Result<Llm<B>>,
) -> anyhow::Result<()> {
    let llm = load(&a.model.model)?;
    let draft = load_draft(&a.spec, load)?;
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
    llm.check_kv_memory(a.model.ctx_size, 1)?;
    let mut session = llm.session(a.model.ctx_size, 512);
    let memory = memory_line(&llm, &session);
    let mut drafter = drafter(&a.spec, &llm, draft.as_ref(), session.n_ctx())?;
    let mut out = std::io::stdout().lock();
    let opts = a.sampling.options(&llm.generation);
    let stats = generate(&mut session, &mut drafter, &ids, &opts, &mut |t| {
        // A closed stdout (e.g. `| head`) ends generation quietly.
        out.write_all(t.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    })?;
    let _ = writeln!(out);
    // After the answer, so a failed run stays one line on stderr.
    eprintln!("{memory}");
    eprintln!("{}", stats_line(&stats));
    Ok(())
}

pub fn chat(a: ChatArgs) -> anyhow::Result<()> {
    with_device!(&a.model, |l| chat_on(&a, l))
}

fn chat_on<B: Backend>(
    a: &ChatArgs,
    load: &dyn Fn(&str) -> anyhow::Result<Llm<B>>,
) -> anyhow::Result<()> {
    let llm = load(&a.model.model)?;
    let draft = load_draft(&a.spec, load)?;
    llm.check_kv_memory(a.model.ctx_size, 1)?;
    let mut session = llm.session(a.model.ctx_size, 512);
    eprintln!("{}", memory_line(&llm, &session));
    let mut drafter = drafter(&a.spec, &llm, draft.as_ref(), session.n_ctx())?;
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(Message::new("system", s));
    }
    let opts = a.sampling.options(&llm.generation);
    eprintln!(
        "kiln chat — {} ({}); /reset clears, /exit or Ctrl-D quits",
        llm.path.display(),
        llm.backend.name()
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
                session.reset();
                continue;
            }
            _ => {}
        }
        msgs.push(Message::new("user", text));
        let ids = llm.tokenize(&llm.render_chat(&msgs)?, false)?;
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let res = generate(&mut session, &mut drafter, &ids, &opts, &mut |t| {
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
