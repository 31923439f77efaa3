//! `kiln run` and `kiln chat`.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_backend::Backend;
use kiln_runtime::{GenerateOptions, GenerationStats, Llm, SamplerConfig};
use kiln_text::Message;

use crate::{resolve_model, ModelArgs};

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 disables).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 disables).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
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
    fn options(&self) -> GenerateOptions {
        GenerateOptions {
            max_tokens: self.n_predict,
            stop: self.stop.clone(),
            sampler: SamplerConfig {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                seed: self.seed,
            },
        }
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
}

fn load(m: &ModelArgs) -> anyhow::Result<Llm<CpuBackend>> {
    let path = resolve_model(&m.model)?;
    let backend = if m.reference {
        CpuBackend::reference()
    } else {
        CpuBackend::new(m.threads.unwrap_or_else(default_threads).max(1))
    };
    Llm::load(backend, &path).with_context(|| format!("loading {}", path.display()))
}

fn stats_line(s: &GenerationStats) -> String {
    format!(
        "prompt {} tok{} | ttft {:.0} ms | prefill {:.1} tok/s | decode {:.1} tok/s | {} tok generated",
        s.prompt_tokens,
        if s.cached_tokens > 0 { format!(" (+{} cached)", s.cached_tokens) } else { String::new() },
        s.ttft_secs * 1e3,
        s.prefill_tps(),
        s.decode_tps(),
        s.generated_tokens,
    )
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let llm = load(&a.model)?;
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
    let mut session = llm.session(a.model.ctx_size, 512);
    let mut out = std::io::stdout().lock();
    let stats = session.generate(&ids, &a.sampling.options(), &mut |t| {
        // A closed stdout (e.g. `| head`) ends generation quietly.
        out.write_all(t.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    })?;
    let _ = writeln!(out);
    eprintln!("{}", stats_line(&stats));
    Ok(())
}

pub fn chat(a: ChatArgs) -> anyhow::Result<()> {
    let llm = load(&a.model)?;
    let mut session = llm.session(a.model.ctx_size, 512);
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(Message::new("system", s));
    }
    let opts = a.sampling.options();
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
        let res = session.generate(&ids, &opts, &mut |t| {
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
