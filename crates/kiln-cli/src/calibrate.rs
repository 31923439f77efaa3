//! `kiln quantize IN OUT --calibrate FILE.txt --target-bpw B`: per-tensor types chosen from
//! measured sensitivities (`kiln_runtime::calibrate`) under a size budget
//! (`kiln_runtime::mix`), written as GGUF, then the perplexity of the result against the
//! source model.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_backend::cpu::CpuBackend;
use kiln_quant::GgmlType;
use kiln_runtime::calibrate::candidates_for;
use kiln_runtime::{
    choose_mix, CalibOptions, Choice, Llm, Mix, SensitivityTable, TensorSensitivity,
};

use crate::quantize::{write_gguf, Plan, Recipe};

#[derive(Args, Clone)]
pub struct CalibArgs {
    /// Choose each matrix's type from its measured effect on this text (needs --target-bpw).
    #[arg(long, value_name = "FILE.txt", requires = "target_bpw")]
    pub calibrate: Option<String>,
    /// Size budget: bits per weight over the quantized matrices, as llama.cpp counts them.
    #[arg(long = "target-bpw", value_name = "B", requires = "calibrate")]
    pub target_bpw: Option<f64>,
    /// Calibration tokens evaluated per measurement (the text's first N).
    #[arg(long = "calib-tokens", value_name = "N", default_value_t = 256)]
    pub calib_tokens: usize,
    /// Positions per calibration chunk (each from an empty context).
    #[arg(long = "calib-ctx", value_name = "N", default_value_t = 128)]
    pub calib_ctx: usize,
    /// Candidate types, comma-separated (rows a type's block does not divide fall back like
    /// llama.cpp's).
    #[arg(
        long,
        value_name = "T,T,..",
        default_value = "q4_0,q4_k,q5_0,q5_k,q6_k,q8_0",
        value_delimiter = ','
    )]
    pub candidates: Vec<String>,
    /// Sensitivity table: read it when the file exists (and matches the model), else measure
    /// and write it there, so other budgets reuse one measurement.
    #[arg(long, value_name = "FILE.json")]
    pub table: Option<String>,
    /// Text for the perplexity comparison (default: the calibration text).
    #[arg(long = "eval", value_name = "FILE.txt")]
    pub eval: Option<String>,
    /// Context of the perplexity comparison (llama-perplexity's default 512).
    #[arg(long = "eval-ctx", value_name = "N", default_value_t = 512)]
    pub eval_ctx: usize,
    /// Skip the perplexity comparison.
    #[arg(long = "no-eval")]
    pub no_eval: bool,
    /// Print every tensor's sensitivities.
    #[arg(long)]
    pub verbose: bool,
    /// Threads (default: all CPUs).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Measure on the scalar reference path (f32 arithmetic, no 8-bit activations): slower,
    /// but a swap's KL is then the weights' alone, not also the change of kernel rounding.
    #[arg(long)]
    pub reference: bool,
}

fn parse_candidates(names: &[String]) -> anyhow::Result<Vec<GgmlType>> {
    let mut v = Vec::new();
    for n in names {
        let t = crate::parse_quant(n.trim()).map_err(|e| anyhow!("--candidates: {e}"))?;
        if !kiln_quant::can_quantize(t) || t == GgmlType::F32 {
            bail!("--candidates: {} is not a quantization type", t.name());
        }
        v.push(t);
    }
    if v.is_empty() {
        bail!("--candidates: no types given");
    }
    Ok(v)
}

pub fn calibrate(input: &str, output: &str, a: &CalibArgs) -> anyhow::Result<()> {
    let calib = a
        .calibrate
        .as_deref()
        .ok_or_else(|| anyhow!("--calibrate FILE.txt is needed without --type"))?;
    let target = a
        .target_bpw
        .ok_or_else(|| anyhow!("--calibrate needs --target-bpw B"))?;
    let candidates = parse_candidates(&a.candidates)?;
    let text = std::fs::read_to_string(calib)
        .with_context(|| format!("reading the calibration text {calib}"))?;
    let threads = a
        .threads
        .unwrap_or_else(kiln_backend::cpu::default_threads)
        .max(1);
    let path = crate::resolve_model(input)?;
    let backend = || {
        if a.reference {
            CpuBackend::reference()
        } else {
            CpuBackend::new(threads)
        }
    };
    let mut llm =
        Llm::load(backend(), &path).with_context(|| format!("loading {}", path.display()))?;

    // The budget against the sizes alone, before anything is measured.
    let skeleton = skeleton(&llm, &candidates);
    choose_mix(&skeleton, target)?;

    let tokens = llm.tokenize(&text, true)?;
    let add_bos =
        llm.tokenizer.bos_id().is_some() && tokens.first() == llm.tokenizer.bos_id().as_ref();
    let opts = CalibOptions {
        tokens: a.calib_tokens,
        ctx: a.calib_ctx,
        candidates: candidates.clone(),
    };
    let table = match a.table.as_deref().filter(|t| Path::new(t).is_file()) {
        Some(file) => {
            let t = read_table(file, &skeleton)?;
            eprintln!("sensitivities: read {file} ({} tokens)", t.tokens);
            t
        }
        None => {
            let t0 = std::time::Instant::now();
            let t = measure(&mut llm, &tokens, add_bos, &opts)?;
            eprintln!(
                "sensitivities: {} measurements of {} tokens in {:.1} s",
                t.tensors.iter().map(|x| x.choices.len()).sum::<usize>(),
                t.tokens,
                t0.elapsed().as_secs_f64()
            );
            if let Some(file) = &a.table {
                let s = serde_json::to_string_pretty(&t.to_json())?;
                kiln_formats::output::write(file, s.as_bytes())
                    .with_context(|| format!("writing {file}"))?;
                eprintln!("sensitivities: wrote {file}");
            }
            t
        }
    };
    let mix = choose_mix(&table, target)?;
    print_mix(&table, &mix, target, a.verbose);
    if !a.no_eval {
        // The additive estimate against the mix measured whole (one more pass).
        let kl = llm.mix_kl(&tokens, add_bos, &opts, &mix.types)?;
        println!(
            "measured: KL {kl:.5} nats/token on the calibration tokens with the whole mix applied (estimate {:.5})",
            mix.loss
        );
    }

    let types: HashMap<String, GgmlType> = table
        .tensors
        .iter()
        .zip(&mix.types)
        .map(|(t, &ty)| (t.name.clone(), ty))
        .collect();
    let plan = Plan::PerTensor {
        types,
        file_type: file_type(&table, &mix),
    };
    write_gguf(&path.to_string_lossy(), output, &plan)?;

    if a.no_eval {
        return Ok(());
    }
    let eval_file = a.eval.as_deref().unwrap_or(calib);
    let eval_text = std::fs::read_to_string(eval_file)
        .with_context(|| format!("reading the evaluation text {eval_file}"))?;
    let ppl_src = ppl(&llm, &eval_text, a.eval_ctx)?;
    let quant =
        Llm::load(backend(), Path::new(output)).with_context(|| format!("loading {output}"))?;
    let ppl_q = ppl(&quant, &eval_text, a.eval_ctx)?;
    println!(
        "perplexity of {eval_file} (n_ctx {}, {} chunks): source {:.4} +/- {:.5} | {:.2} bpw mix {:.4} +/- {:.5} ({:+.2}%)",
        a.eval_ctx,
        ppl_src.per_chunk.len(),
        ppl_src.ppl,
        ppl_src.ppl_err,
        mix.bpw,
        ppl_q.ppl,
        ppl_q.ppl_err,
        100.0 * (ppl_q.ppl / ppl_src.ppl - 1.0)
    );
    Ok(())
}

/// The table's shape (every matrix and its candidates) with no measurement: zero losses.
fn skeleton(llm: &Llm<CpuBackend>, candidates: &[GgmlType]) -> SensitivityTable {
    let tensors = llm
        .model
        .matrix_params()
        .into_iter()
        .map(|(p, rows, cols)| TensorSensitivity {
            name: p.gguf(),
            rows,
            cols,
            choices: candidates_for(candidates, cols)
                .into_iter()
                .map(|ty| Choice { ty, kl: 0.0 })
                .collect(),
        })
        .collect();
    SensitivityTable { tokens: 0, tensors }
}

/// A `--table` file, checked against the model's matrices and the candidates.
fn read_table(file: &str, want: &SensitivityTable) -> anyhow::Result<SensitivityTable> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{file}: not JSON"))?;
    let t = SensitivityTable::from_json(&v, Path::new(file))?;
    let shape = |t: &SensitivityTable| -> Vec<(String, usize, usize, Vec<GgmlType>)> {
        t.tensors
            .iter()
            .map(|x| {
                let mut c: Vec<GgmlType> = x.choices.iter().map(|c| c.ty).collect();
                c.sort_by_key(|t| t.id());
                (x.name.clone(), x.rows, x.cols, c)
            })
            .collect()
    };
    if shape(&t) != shape(want) {
        bail!("{file}: the table is for other tensors or candidates than this model and --candidates; delete it to measure again");
    }
    Ok(t)
}

fn measure(
    llm: &mut Llm<CpuBackend>,
    tokens: &[u32],
    add_bos: bool,
    opts: &CalibOptions,
) -> anyhow::Result<SensitivityTable> {
    let pb = ProgressBar::new(0);
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "calibrating [{bar:30}] {pos}/{len} {msg} {elapsed} (eta {eta})",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.enable_steady_tick(Duration::from_millis(500));
    let t = llm.sensitivities(tokens, add_bos, opts, &mut |done, total, name| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
        pb.set_message(name.to_string());
    });
    pb.finish_and_clear();
    Ok(t?)
}

/// llama.cpp's `general.file_type` of the type most of the weights are in.
fn file_type(table: &SensitivityTable, mix: &Mix) -> u32 {
    let mut by: HashMap<u32, u64> = HashMap::new();
    for (t, ty) in table.tensors.iter().zip(&mix.types) {
        *by.entry(ty.id()).or_default() += t.n_elements();
    }
    let top = by
        .into_iter()
        .max_by_key(|&(id, n)| (n, id))
        .and_then(|(id, _)| GgmlType::from_id(id))
        .unwrap_or(GgmlType::F16);
    Recipe::Pure(top).file_type()
}

fn ppl(
    llm: &Llm<CpuBackend>,
    text: &str,
    n_ctx: usize,
) -> anyhow::Result<kiln_runtime::Perplexity> {
    let tokens = llm.tokenize(text, true)?;
    let add_bos =
        llm.tokenizer.bos_id().is_some() && tokens.first() == llm.tokenizer.bos_id().as_ref();
    Ok(llm.perplexity(&tokens, n_ctx, add_bos, 0, &mut |_, _| {})?)
}

/// The role of a GGUF matrix name: `blk.3.attn_v.weight` -> (Some(3), "attn_v").
fn role(name: &str) -> (Option<usize>, &str) {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    match base.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((i, r)) => (i.parse().ok(), r),
        None => (None, base),
    }
}

fn short(ty: GgmlType) -> String {
    ty.name().to_lowercase()
}

/// The mix as a grid (a row per layer, a column per role), a per-type summary and the
/// achieved size.
fn print_mix(table: &SensitivityTable, mix: &Mix, target: f64, verbose: bool) {
    let mut roles: Vec<&str> = Vec::new();
    let mut grid: BTreeMap<usize, HashMap<&str, GgmlType>> = BTreeMap::new();
    let mut other = Vec::new();
    for (t, &ty) in table.tensors.iter().zip(&mix.types) {
        match role(&t.name) {
            (Some(i), r) => {
                if !roles.contains(&r) {
                    roles.push(r);
                }
                grid.entry(i).or_default().insert(r, ty);
            }
            (None, r) => other.push((r, ty)),
        }
    }
    let w = roles.iter().map(|r| r.len()).max().unwrap_or(6).max(6);
    let mut head = format!("{:<6}", "layer");
    for r in &roles {
        head.push_str(&format!(" {r:>w$}"));
    }
    println!("{head}");
    for (i, row) in &grid {
        let mut line = format!("{i:<6}");
        for r in &roles {
            let s = row.get(r).map(|&t| short(t)).unwrap_or_default();
            line.push_str(&format!(" {s:>w$}"));
        }
        println!("{line}");
    }
    for (r, ty) in other {
        println!("{r}: {}", short(ty));
    }
    let total: u64 = table.tensors.iter().map(|t| t.n_elements()).sum();
    let mut by: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
    for (t, ty) in table.tensors.iter().zip(&mix.types) {
        let e = by.entry(ty.id()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
    }
    let parts: Vec<String> = by
        .iter()
        .filter_map(|(&id, &(n, el))| {
            let ty = GgmlType::from_id(id)?;
            Some(format!(
                "{} {n} tensors ({:.1}% of weights)",
                short(ty),
                100.0 * el as f64 / total as f64
            ))
        })
        .collect();
    println!("mix: {}", parts.join(", "));
    println!(
        "size: {:.4} bpw over {} matrices ({:.1} M weights; target {target}) | estimated loss {:.5} nats/token (sum of per-tensor KL)",
        mix.bpw,
        table.tensors.len(),
        total as f64 / 1e6,
        mix.loss
    );
    if verbose {
        for (t, ty) in table.tensors.iter().zip(&mix.types) {
            let cs: Vec<String> = t
                .choices
                .iter()
                .map(|c| format!("{} {:.3e}", short(c.ty), c.kl))
                .collect();
            println!("{:<28} -> {:<5} | {}", t.name, short(*ty), cs.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_of_names() {
        assert_eq!(role("blk.12.attn_v.weight"), (Some(12), "attn_v"));
        assert_eq!(role("token_embd.weight"), (None, "token_embd"));
    }

    #[test]
    fn candidate_names() {
        let v: Vec<String> = ["q4_0", "Q8_0"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            parse_candidates(&v).unwrap(),
            vec![GgmlType::Q4_0, GgmlType::Q8_0]
        );
        assert!(parse_candidates(&["q9".to_string()]).is_err());
        assert!(parse_candidates(&["f32".to_string()]).is_err());
    }
}
