//! `kiln info`: what a model file holds.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_formats::GgufFile;
use kiln_models::llm::LlmConfig;

pub fn info(path: &Path, all: bool) -> anyhow::Result<()> {
    if kiln_models::llm::is_hf_dir(path) {
        return info_hf(path, all);
    }
    let file = if path.is_dir() {
        let mut ggufs: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        match ggufs.len() {
            1 => ggufs.remove(0),
            n => anyhow::bail!(
                "{}: {n} .gguf files in this directory; name one",
                path.display()
            ),
        }
    } else {
        path.to_path_buf()
    };
    let g = GgufFile::open(&file)?;
    println!("file:          {}", file.display());
    println!(
        "format:        GGUF v{} ({} bytes, alignment {})",
        g.version,
        g.file_len(),
        g.alignment
    );
    let arch = g.opt_str("general.architecture")?.unwrap_or("?");
    println!("architecture:  {arch}");
    if let Some(name) = g.opt_str("general.name")? {
        println!("name:          {name}");
    }
    match LlmConfig::from_gguf(&g) {
        Ok(c) => {
            println!(
                "hyper-params:  layers {}, dim {}, ffn {}, heads {} (kv {}), head dim {}, vocab {}, context {}",
                c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.ctx_train
            );
            println!(
                "               rms eps {:e}, rope theta {} ({:?}, {} dims), tied embeddings {}",
                c.norm_eps, c.rope.theta, c.rope.style, c.rope.dims, c.tied_embeddings
            );
            print_layer_kinds(&c);
        }
        Err(e) => println!("hyper-params:  ({e})"),
    }
    let model = g.opt_str("tokenizer.ggml.model")?;
    let pre = g.opt_str("tokenizer.ggml.pre")?;
    let n_tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map(|a| a.len());
    match (model, n_tokens) {
        (Some(m), Some(n)) => {
            let kind = match m {
                "gpt2" => "byte-level BPE",
                "llama" => "SentencePiece",
                other => other,
            };
            println!(
                "tokenizer:     {kind} ('{m}'{}), {n} tokens, chat template {}",
                pre.map(|p| format!(", pre '{p}'")).unwrap_or_default(),
                match (g.get("tokenizer.chat_template"), g.architecture().ok()) {
                    (Some(_), _) => "yes",
                    (None, Some(a)) if kiln_text::builtin_template(a).is_some() =>
                        "no (kiln's built-in one for this architecture)",
                    _ => "no",
                }
            );
        }
        _ => println!("tokenizer:     none embedded"),
    }

    println!("\nmetadata ({} keys):", g.metadata.len());
    for (k, v) in &g.metadata {
        if k.starts_with("tokenizer.ggml.") && v.as_array().is_some()
            || k == "tokenizer.chat_template"
        {
            println!("  {k:<44} {}", summarize_big(v));
        } else {
            println!("  {k:<44} {}", v.summary());
        }
    }

    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut params = 0u64;
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        params += t.n_elements();
    }
    let bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
    println!(
        "\ntensors: {} ({:.1} M parameters, {:.1} MiB, {:.2} bits/weight)",
        g.tensors.len(),
        params as f64 / 1e6,
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 * 8.0 / params.max(1) as f64
    );
    for (ty, (n, b)) in &by_type {
        println!(
            "  {ty:<6} {n:>5} tensors {:>10.1} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    println!(
        "\n  {:<32} {:<6} {:<20} {:>12}",
        "NAME", "TYPE", "SHAPE", "BYTES"
    );
    let shown = if all { usize::MAX } else { 24 };
    for t in g.tensors.iter().take(shown) {
        let shape = format!("{:?}", t.dims);
        println!(
            "  {:<32} {:<6} {:<20} {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.n_bytes
        );
    }
    if g.tensors.len() > shown {
        println!(
            "  ... {} more (--all lists every tensor)",
            g.tensors.len() - shown
        );
    }
    Ok(())
}

fn summarize_big(v: &kiln_formats::Value) -> String {
    match v {
        kiln_formats::Value::String(s) => format!("<{} chars>", s.len()),
        other => other.summary(),
    }
}

fn print_config(c: &LlmConfig) {
    println!(
        "hyper-params:  layers {}, dim {}, ffn {}, heads {} (kv {}), head dim {}, vocab {}, context {}",
        c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.ctx_train
    );
    let scaling = match &c.rope.scaling {
        kiln_backend::RopeScaling::None => "none".to_string(),
        kiln_backend::RopeScaling::Llama3 { factor, .. } => format!("llama3 x{factor}"),
        kiln_backend::RopeScaling::Factors(f) => format!(
            "factors {:.3}..{:.3}",
            f.iter().cloned().fold(f32::INFINITY, f32::min),
            f.iter().cloned().fold(0f32, f32::max)
        ),
    };
    println!(
        "               rms eps {:e}, rope theta {} ({:?}, {} dims, scaling {scaling}), tied embeddings {}, qkv bias {}, qk norm {}",
        c.norm_eps, c.rope.theta, c.rope.style, c.rope.dims, c.tied_embeddings, c.qkv_bias, c.qk_norm
    );
    print_layer_kinds(c);
}

/// Sliding-window and convolution layers, where a model has them.
fn print_layer_kinds(c: &LlmConfig) {
    let windowed: Vec<usize> = (0..c.n_layers).map(|il| c.window(il)).collect();
    let n_win = windowed.iter().filter(|&&w| w > 0).count();
    if n_win > 0 {
        let w = windowed.iter().copied().max().unwrap_or(0);
        let local = c.rope_local.as_ref().map_or(c.rope.theta, |r| r.theta);
        println!(
            "               {n_win} sliding-window layers (window {w}, rope theta {local}), {} global",
            c.n_layers - n_win
        );
    }
    let n_conv = c.n_conv_layers();
    if n_conv > 0 {
        println!(
            "               {n_conv} short-convolution layers (width {}), {} attention",
            c.conv_k,
            c.n_layers - n_conv
        );
    }
}

/// A Hugging Face / MLX directory: config, weights (per dtype), tokenizer, generation defaults.
fn info_hf(dir: &Path, all: bool) -> anyhow::Result<()> {
    let ck = kiln_models::llm::HfCheckpoint::open(dir)?;
    println!("directory:     {}", dir.display());
    let files: Vec<_> = ck.tensors.paths().map(|p| p.to_path_buf()).collect();
    let bytes: u64 = files
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "format:        Hugging Face safetensors, {} file(s), {bytes} bytes",
        files.len()
    );
    let class = ck
        .config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    println!("architecture:  {} ({class})", ck.cfg.arch);
    match &ck.mlx {
        Some(q) => println!(
            "quantization:  MLX affine {}-bit, groups of {}{}",
            q.bits,
            q.group,
            if q.overrides.is_empty() {
                String::new()
            } else {
                format!(", {} per-module overrides", q.overrides.len())
            }
        ),
        None => println!("quantization:  none"),
    }
    print_config(&ck.cfg);
    match kiln_text::Tokenizer::from_file(dir) {
        Ok(t) => println!(
            "tokenizer:     tokenizer.json, {} tokens, bos {:?}, eos {:?}, chat template {}",
            t.vocab_size(),
            t.bos_token(),
            t.eos_token(),
            if t.chat_template().is_some() {
                "yes"
            } else {
                "no"
            }
        ),
        Err(e) => println!("tokenizer:     ({e})"),
    }
    let g = kiln_runtime::GenerationDefaults::from_dir(dir)?;
    if g != Default::default() {
        println!(
            "generation:    do_sample {:?}, temperature {:?}, top_k {:?}, top_p {:?}, min_p {:?}, repetition_penalty {:?}, eos {:?}",
            g.do_sample, g.temperature, g.top_k, g.top_p, g.min_p, g.repetition_penalty, g.eos_ids
        );
    }
    let mut by_type: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut params = 0u64;
    for t in ck.tensors.tensors() {
        let e = by_type.entry(t.dtype.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes();
        params += t.n_elements();
    }
    println!(
        "\ntensors: {} ({:.1} M stored elements)",
        ck.tensors.len(),
        params as f64 / 1e6
    );
    for (ty, (n, b)) in &by_type {
        println!(
            "  {ty:<6} {n:>5} tensors {:>10.1} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    println!(
        "\n  {:<48} {:<6} {:<16} {:>10}",
        "NAME", "DTYPE", "SHAPE", "BYTES"
    );
    let shown = if all { usize::MAX } else { 24 };
    for t in ck.tensors.tensors().take(shown) {
        println!(
            "  {:<48} {:<6} {:<16} {:>10}",
            t.name,
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.n_bytes()
        );
    }
    if ck.tensors.len() > shown {
        println!(
            "  ... {} more (--all lists every tensor)",
            ck.tensors.len() - shown
        );
    }
    Ok(())
}
