//! `kiln perplexity -m MODEL -f FILE`: llama-perplexity's measure (chunks of n_ctx, the second
//! half of each scored) and its output lines.

use std::io::Write;

use anyhow::Context;
use clap::Args;

use crate::ModelArgs;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: String,
    /// Score at most this many chunks (default: all).
    #[arg(long, default_value_t = 0)]
    pub chunks: usize,
}

pub fn perplexity(a: PerplexityArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file))?;
    // llama-perplexity's default context.
    let n_ctx = if a.model.ctx_size == 0 {
        512
    } else {
        a.model.ctx_size
    };
    let llm = crate::llm_cmd::spawn_engine(&a.model, None, n_ctx)?;
    let tokens = llm.tokenize(&text, true)?;
    let bos = llm.bos_id();
    let add_bos = bos.is_some() && tokens.first() == bos.as_ref();
    let n_chunks = match a.chunks {
        0 => tokens.len() / n_ctx,
        c => c.min(tokens.len() / n_ctx),
    };
    eprintln!(
        "perplexity: {} tokens, calculating perplexity over {n_chunks} chunks, n_ctx={n_ctx}",
        tokens.len()
    );
    let t0 = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    let r = llm.perplexity(&tokens, n_ctx, add_bos, a.chunks, &mut |i, ppl| {
        let _ = write!(out, "[{}]{ppl:.4},", i + 1);
        let _ = out.flush();
    })?;
    let _ = writeln!(out);
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_err);
    eprintln!(
        "perplexity: {} tokens scored in {:.2} s",
        r.scored,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
