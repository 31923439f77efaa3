//! `kiln quantize IN OUT --type T`: a Hugging Face / MLX directory or a GGUF file to a GGUF v3
//! file llama.cpp loads (llama/qwen2/qwen3 metadata keys, the tokenizer as
//! `tokenizer.ggml.*`, the chat template), each matrix in the type the recipe gives it.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_formats::{GgufFile, GgufWriter, SafetensorsSet, StDtype, Value};
use kiln_models::llm::{
    gemma3_windows, is_hf_dir, HfCheckpoint, LayerParam, LlmConfig, Naming, Param,
};
use kiln_quant::{dequantize_row, fallback_type, quantize_row, GgmlType};
use serde_json::Value as Json;

#[derive(Args)]
pub struct QuantizeArgs {
    /// A Hugging Face / MLX model directory or a GGUF file.
    pub input: String,
    /// The GGUF file to write.
    pub output: String,
    /// q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, f16, or the mix q4_k_m (attn_v,
    /// ffn_down and output in Q6_K, the rest Q4_K).
    #[arg(long = "type", value_name = "T", value_parser = parse_recipe, required_unless_present = "calibrate", conflicts_with = "calibrate")]
    pub ty: Option<Recipe>,
    #[command(flatten)]
    pub calib: crate::calibrate::CalibArgs,
}

/// Which type each tensor gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    Pure(GgmlType),
    Q4KM,
}

fn parse_recipe(s: &str) -> Result<Recipe, String> {
    use GgmlType::*;
    Ok(match s.to_ascii_lowercase().as_str() {
        "q4_0" => Recipe::Pure(Q4_0),
        "q4_1" => Recipe::Pure(Q4_1),
        "q8_0" => Recipe::Pure(Q8_0),
        "q4_k" | "q4_k_s" => Recipe::Pure(Q4_K),
        "q5_0" => Recipe::Pure(Q5_0),
        "q5_1" => Recipe::Pure(Q5_1),
        "q5_k" | "q5_k_s" => Recipe::Pure(Q5_K),
        "q6_k" => Recipe::Pure(Q6_K),
        "f16" => Recipe::Pure(F16),
        "q4_k_m" => Recipe::Q4KM,
        _ => {
            return Err(format!(
                "unknown type '{s}' (one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q4_k_m, q5_k, q6_k, f16)"
            ))
        }
    })
}

impl Recipe {
    /// The type for a matrix named `name` (GGUF naming) of rows of `cols` values.
    pub fn type_for(self, name: &str, cols: usize) -> GgmlType {
        use GgmlType::*;
        let ty = match self {
            Recipe::Pure(t)
                if name == "output.weight" && matches!(t, Q4_0 | Q4_1 | Q4_K | Q5_K) =>
            {
                Q6_K
            }
            Recipe::Pure(t) => t,
            Recipe::Q4KM => {
                let more_bits = name == "output.weight"
                    || name.ends_with(".attn_v.weight")
                    || name.ends_with(".ffn_down.weight");
                if more_bits {
                    Q6_K
                } else {
                    Q4_K
                }
            }
        };
        fallback_type(ty, cols)
    }

    /// llama.cpp's `general.file_type` (LLAMA_FTYPE_*).
    pub fn file_type(self) -> u32 {
        use GgmlType::*;
        match self {
            Recipe::Pure(F16) => 1,
            Recipe::Pure(Q4_0) => 2,
            Recipe::Pure(Q4_1) => 3,
            Recipe::Pure(Q8_0) => 7,
            Recipe::Pure(Q5_0) => 8,
            Recipe::Pure(Q5_1) => 9,
            Recipe::Pure(Q4_K) => 14,
            Recipe::Pure(Q5_K) => 16,
            Recipe::Q4KM => 15,
            Recipe::Pure(Q6_K) => 18,
            Recipe::Pure(_) => 0,
        }
    }
}

/// The type of every matrix: a recipe, or one chosen per tensor (GGUF names).
pub enum Plan {
    Recipe(Recipe),
    PerTensor {
        types: HashMap<String, GgmlType>,
        file_type: u32,
    },
}

impl Plan {
    fn type_for(&self, name: &str, cols: usize) -> anyhow::Result<GgmlType> {
        match self {
            Plan::Recipe(r) => Ok(r.type_for(name, cols)),
            Plan::PerTensor { types, .. } => types
                .get(name)
                .map(|&t| fallback_type(t, cols))
                .ok_or_else(|| anyhow!("matrix '{name}' has no type in the calibrated mix")),
        }
    }

    fn file_type(&self) -> u32 {
        match self {
            Plan::Recipe(r) => r.file_type(),
            Plan::PerTensor { file_type, .. } => *file_type,
        }
    }
}

pub fn quantize(a: QuantizeArgs) -> anyhow::Result<()> {
    match a.ty {
        Some(r) => write_gguf(&a.input, &a.output, &Plan::Recipe(r)),
        None => crate::calibrate::calibrate(&a.input, &a.output, &a.calib),
    }
}

/// `input` (a Hugging Face / MLX directory or a GGUF) to the GGUF file `output`.
pub fn write_gguf(input: &str, output: &str, plan: &Plan) -> anyhow::Result<()> {
    let path = Path::new(input);
    let mut w = GgufWriter::new();
    let n = if is_hf_dir(path) {
        from_hf(path, plan, &mut w)?
    } else {
        from_gguf(path, plan, &mut w)?
    };
    w.write(output)
        .with_context(|| format!("writing {output}"))?;
    let bytes = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {output} ({n} tensors, {:.1} MiB)",
        bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}

fn bar(n: usize) -> ProgressBar {
    let b = ProgressBar::new(n as u64);
    b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("quantizing [{bar:30}] {pos}/{len} {msg} {elapsed}")
    {
        b.set_style(style.progress_chars("=> "));
    }
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// Rows of `cols` f32 values re-encoded as `ty`.
fn encode(rows: &[f32], cols: usize, ty: GgmlType, name: &str) -> anyhow::Result<Vec<u8>> {
    if ty == GgmlType::F32 {
        return Ok(rows.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    let rb = ty.row_bytes(cols).map_err(|e| anyhow!("{name}: {e}"))?;
    let mut out = vec![0u8; rows.len() / cols.max(1) * rb];
    for (src, dst) in rows.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        quantize_row(ty, src, dst).map_err(|e| anyhow!("{name}: {e}"))?;
    }
    Ok(out)
}

// ---- from a GGUF file ----

fn from_gguf(path: &Path, recipe: &Plan, w: &mut GgufWriter) -> anyhow::Result<usize> {
    let g = GgufFile::open(path)?;
    for (k, v) in &g.metadata {
        if k != "general.file_type" {
            w.meta(k, v.clone());
        }
    }
    w.meta("general.file_type", Value::U32(recipe.file_type()));
    let pb = bar(g.tensors.len());
    for t in &g.tensors {
        pb.set_message(t.name.clone());
        let cols = t.dims.first().copied().unwrap_or(1) as usize;
        let n = t.n_elements() as usize;
        let mut f = vec![0f32; n];
        dequantize_row(t.ty, g.tensor_data(t), &mut f)
            .map_err(|e| anyhow!("{}: tensor '{}': {e}", path.display(), t.name))?;
        // Matrices only: LFM2's convolution taps (`shortconv.conv`, k values a channel) stay
        // f32.
        let matrix = t.dims.len() == 2 && !t.name.ends_with("shortconv.conv.weight");
        let ty = if matrix && t.name.ends_with(".weight") {
            recipe.type_for(&t.name, cols)?
        } else {
            GgmlType::F32
        };
        w.tensor(&t.name, &t.dims, ty, encode(&f, cols, ty, &t.name)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(g.tensors.len())
}

// ---- from a Hugging Face directory ----

fn from_hf(dir: &Path, recipe: &Plan, w: &mut GgufWriter) -> anyhow::Result<usize> {
    let ck = HfCheckpoint::open(dir)?;
    let c = &ck.cfg;
    let arch = c.arch.as_str();
    let (gemma, lfm2) = (arch == "gemma3", arch == "lfm2");
    let window = c.layer_window.iter().copied().max().unwrap_or(0);
    // What llama.cpp's GGUF can say: Gemma 3's windows on five layers of every six (its
    // local layers' RoPE base 10000, unscaled), no other family's windows.
    let unsupported = |what: &str| {
        anyhow!(
            "{}: {what} has no GGUF form (run the directory as it is)",
            dir.display()
        )
    };
    if window > 0 && !(gemma && c.layer_window == gemma3_windows(c.n_layers, window)) {
        return Err(unsupported(&format!("{arch}'s sliding-window layers")));
    }
    if let Some(local) = &c.rope_local {
        if local.theta != 10000.0 || local.scaling != kiln_backend::RopeScaling::None {
            return Err(unsupported(
                "a local-layer RoPE other than base 10000 unscaled",
            ));
        }
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| arch.into());
    w.meta("general.architecture", Value::String(arch.into()));
    w.meta("general.name", Value::String(name));
    w.meta("general.file_type", Value::U32(recipe.file_type()));
    w.meta("general.quantization_version", Value::U32(2));
    let k = |s: &str| format!("{arch}.{s}");
    let u = |v: usize| Value::U32(v as u32);
    w.meta(&k("vocab_size"), u(c.vocab_size));
    w.meta(&k("context_length"), u(c.ctx_train));
    w.meta(&k("embedding_length"), u(c.dim));
    w.meta(&k("block_count"), u(c.n_layers));
    w.meta(&k("feed_forward_length"), u(c.ffn_dim));
    w.meta(&k("attention.head_count"), u(c.n_heads));
    w.meta(&k("attention.key_length"), u(c.head_dim));
    w.meta(&k("attention.value_length"), u(c.head_dim));
    w.meta(&k("rope.dimension_count"), u(c.rope.dims));
    w.meta(&k("rope.freq_base"), Value::F32(c.rope.theta));
    w.meta(
        &k("attention.layer_norm_rms_epsilon"),
        Value::F32(c.norm_eps),
    );
    if window > 0 {
        w.meta(&k("attention.sliding_window"), u(window));
    }
    if lfm2 {
        // KV heads per layer, 0 for the convolution layers (as llama.cpp's converter writes
        // them: signed).
        let per = (0..c.n_layers)
            .map(|i| Value::I32(if c.is_conv(i) { 0 } else { c.n_kv_heads as i32 }))
            .collect();
        w.meta(&k("attention.head_count_kv"), Value::Array(per));
        w.meta(&k("shortconv.l_cache"), u(c.conv_k));
    } else {
        w.meta(&k("attention.head_count_kv"), u(c.n_kv_heads));
    }
    tokenizer_meta(dir, c, w)?;

    // Tensors in llama.cpp's order: embeddings, layers, output norm, output.
    let mut params = vec![Param::TokenEmbd];
    for i in 0..c.n_layers {
        use LayerParam::*;
        let mut l = vec![AttnNorm];
        if c.is_conv(i) {
            l.extend([ConvInProj, ConvTaps, ConvOutProj]);
        } else {
            l.extend([AttnQ, AttnK, AttnV, AttnOutput]);
            if c.qkv_bias {
                l.extend([AttnQBias, AttnKBias, AttnVBias]);
            }
            if c.qk_norm {
                l.extend([AttnQNorm, AttnKNorm]);
            }
        }
        if c.post_norms {
            l.push(PostAttnNorm);
        }
        l.extend([FfnNorm, FfnGate, FfnUp, FfnDown]);
        if c.post_norms {
            l.push(PostFfnNorm);
        }
        params.extend(l.into_iter().map(|p| Param::Layer(i, p)));
    }
    params.push(Param::OutputNorm);
    if !c.tied_embeddings {
        params.push(Param::Output);
    }
    let pb = bar(params.len());
    let mut n = 0;
    if let kiln_backend::RopeScaling::Factors(f) = &c.rope.scaling {
        if f.iter().all(|&x| x == f[0]) {
            // Linear scaling: one factor.
            w.meta(&k("rope.scaling.type"), Value::String("linear".into()));
            w.meta(&k("rope.scaling.factor"), Value::F32(f[0]));
        } else if arch == "llama" {
            // Llama 3's rule as llama.cpp reads it: per-pair frequency divisors.
            let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, bytes);
            n += 1;
        } else {
            bail!(
                "{}: per-frequency RoPE scaling has no GGUF form for {arch}",
                dir.display()
            );
        }
    }
    let (hf_naming, gguf_naming) = match arch {
        "gemma3" => (Naming::HuggingFaceGemma, Naming::Gguf),
        "lfm2" => (Naming::HuggingFaceLfm2, Naming::GgufLfm2),
        _ => (Naming::HuggingFace, Naming::Gguf),
    };
    // Gemma's scores are scaled by 1/sqrt(query_pre_attn_scalar); llama.cpp's gemma3 by its
    // own rule (the config's LlmConfig::from_gguf reads): the ratio goes into the q norm's
    // weights, which scale the queries before RoPE (a linear map) and the scores.
    let q_norm_gain = if gemma {
        let gguf_scale = LlmConfig::gemma3_q_scale(c.n_layers, c.dim, c.n_heads, c.head_dim);
        c.q_scale / gguf_scale
    } else {
        1.0
    };
    for p in params {
        let hf = p
            .name(hf_naming)
            .ok_or_else(|| anyhow!("{p:?} has no Hugging Face name"))?;
        let gguf = p
            .name(gguf_naming)
            .ok_or_else(|| anyhow!("{p:?} has no GGUF name"))?;
        pb.set_message(gguf.clone());
        let (rows, cols) = shape_of(c, p);
        let mut f = read_f32(&ck, &hf, rows, cols)?;
        if gemma && p.is_norm() {
            // Gemma's RMSNorm scales by 1 + w; GGUF stores 1 + w.
            f.iter_mut().for_each(|x| *x += 1.0);
        }
        if matches!(p, Param::Layer(_, LayerParam::AttnQNorm)) && q_norm_gain != 1.0 {
            f.iter_mut().for_each(|x| *x *= q_norm_gain);
        }
        if arch == "llama" {
            // GGUF Llama rotates interleaved pairs: permute q/k rows from rotate-half order.
            match p {
                Param::Layer(_, LayerParam::AttnQ) => f = permute(&f, c.n_heads, cols),
                Param::Layer(_, LayerParam::AttnK) => f = permute(&f, c.n_kv_heads, cols),
                _ => {}
            }
        }
        let (dims, ty) = if p.is_matrix() {
            (
                vec![cols as u64, rows as u64],
                recipe.type_for(&gguf, cols)?,
            )
        } else if rows > 1 {
            // LFM2's convolution taps: (channels, width), kept f32.
            (vec![cols as u64, rows as u64], GgmlType::F32)
        } else {
            (vec![(rows * cols) as u64], GgmlType::F32)
        };
        w.tensor(&gguf, &dims, ty, encode(&f, cols, ty, &gguf)?);
        n += 1;
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(n)
}

/// (rows, cols) of a parameter; vectors are one row.
fn shape_of(c: &LlmConfig, p: Param) -> (usize, usize) {
    use LayerParam::*;
    let (q, kv) = (c.q_dim(), c.kv_dim());
    match p {
        Param::TokenEmbd | Param::Output => (c.vocab_size, c.dim),
        Param::OutputNorm => (1, c.dim),
        Param::RopeFreqs => (1, c.rope.dims / 2),
        Param::Layer(_, l) => match l {
            AttnNorm | FfnNorm | PostAttnNorm | PostFfnNorm => (1, c.dim),
            ConvInProj => (3 * c.dim, c.dim),
            ConvOutProj => (c.dim, c.dim),
            ConvTaps => (c.dim, c.conv_k),
            AttnQ => (q, c.dim),
            AttnK | AttnV => (kv, c.dim),
            AttnOutput => (c.dim, q),
            AttnQBias => (1, q),
            AttnKBias | AttnVBias => (1, kv),
            AttnQNorm | AttnKNorm => (1, c.head_dim),
            FfnGate | FfnUp => (c.ffn_dim, c.dim),
            FfnDown => (c.dim, c.ffn_dim),
        },
    }
}

/// Rows of each head reordered from (half, pair) to (pair, half): rotate-half -> interleaved.
fn permute(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / heads;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for j in 0..hd / 2 {
            for k in 0..2 {
                let src = (h * hd + k * hd / 2 + j) * cols;
                let dst = (h * hd + 2 * j + k) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

/// A tensor as f32 (float dtypes, or an MLX triple dequantized).
fn read_f32(ck: &HfCheckpoint, name: &str, rows: usize, cols: usize) -> anyhow::Result<Vec<f32>> {
    let set: &SafetensorsSet = &ck.tensors;
    let t = set
        .tensor(name)
        .ok_or_else(|| anyhow!("{}: missing tensor '{name}'", ck.dir.display()))?;
    let file = set.path_of(t).display().to_string();
    let float = |t: &kiln_formats::StTensor| -> anyhow::Result<Vec<f32>> {
        let ty = match t.dtype {
            StDtype::F32 => GgmlType::F32,
            StDtype::F16 => GgmlType::F16,
            StDtype::BF16 => GgmlType::BF16,
            d => bail!("{file}: tensor '{}' is {}", t.name, d.name()),
        };
        let mut f = vec![0f32; t.n_elements() as usize];
        dequantize_row(ty, set.data(t), &mut f).map_err(|e| anyhow!("{file}: {}: {e}", t.name))?;
        Ok(f)
    };
    let base = name.strip_suffix(".weight").unwrap_or(name);
    if let (Some(q), Some(s), Some(b)) = (
        ck.mlx.as_ref().and_then(|m| m.of(base)),
        set.tensor(&format!("{base}.scales")),
        set.tensor(&format!("{base}.biases")),
    ) {
        let layout =
            kiln_quant::MlxLayout::new(q.0, q.1, cols).map_err(|e| anyhow!("{name}: {e}"))?;
        let (scales, biases) = (float(s)?, float(b)?);
        let (qb, g) = (layout.q_bytes(cols), layout.groups(cols));
        let packed = set.data(t);
        if packed.len() != rows * qb || scales.len() != rows * g || biases.len() != rows * g {
            bail!("{file}: MLX tensor '{name}' does not hold {rows} x {cols} values");
        }
        let mut out = vec![0f32; rows * cols];
        for (r, row) in out.chunks_exact_mut(cols).enumerate() {
            kiln_quant::mlx_dequantize_row(
                layout,
                &packed[r * qb..(r + 1) * qb],
                &scales[r * g..(r + 1) * g],
                &biases[r * g..(r + 1) * g],
                row,
            )
            .map_err(|e| anyhow!("{name}: {e}"))?;
        }
        return Ok(out);
    }
    if t.n_elements() as usize != rows * cols {
        bail!(
            "{file}: tensor '{name}' has shape {:?}, expected {} values",
            t.shape,
            rows * cols
        );
    }
    float(t)
}

// ---- tokenizer.json -> tokenizer.ggml.* ----

fn tokenizer_meta(dir: &Path, c: &LlmConfig, w: &mut GgufWriter) -> anyhow::Result<()> {
    let path = dir.join("tokenizer.json");
    let read = |p: &Path| -> anyhow::Result<Json> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", p.display()))
    };
    let tj = read(&path)?;
    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        bail!(
            "{}: only BPE tokenizers are written to GGUF (this one is {})",
            path.display(),
            model["type"]
        );
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| anyhow!("{}: model.vocab is not an object", path.display()))?;
    let n = c.vocab_size;
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![1i32; n];
    let mut put = |id: u64, s: &str, ty: i32| -> anyhow::Result<()> {
        let slot = tokens
            .get_mut(id as usize)
            .ok_or_else(|| anyhow!("{}: token id {id} is past vocab_size {n}", path.display()))?;
        *slot = Some(s.to_string());
        types[id as usize] = ty;
        Ok(())
    };
    for (s, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| anyhow!("{}: id of '{s}'", path.display()))?;
        put(id, s, 1)?;
    }
    let mut past = Vec::new();
    for t in tj["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(s)) = (t["id"].as_u64(), t["content"].as_str()) else {
            continue;
        };
        if id as usize >= n {
            // A family's shared tokenizer may name tokens a smaller model has no embedding
            // row for (Gemma 3's image token on the text-only 270M): they cannot be used.
            past.push(format!("{s} ({id})"));
            continue;
        }
        // Special tokens are control tokens; other added tokens user-defined.
        let ty = if t["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        put(id, s, ty)?;
    }
    if !past.is_empty() {
        eprintln!(
            "{}: added tokens past the model's {n} embeddings left out: {}",
            path.display(),
            past.join(", ")
        );
    }
    let mut names = Vec::with_capacity(n);
    for (i, t) in tokens.into_iter().enumerate() {
        match t {
            Some(s) => names.push(Value::String(s)),
            None => {
                // Rows past the vocabulary (padded embeddings), as llama.cpp's converter pads.
                names.push(Value::String(format!("[PAD{i}]")));
                types[i] = 5;
            }
        }
    }
    let merges: Vec<(String, String)> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            Json::String(s) => s.split_once(' ').map(|(a, b)| (a.into(), b.into())),
            Json::Array(p) => Some((p.first()?.as_str()?.into(), p.get(1)?.as_str()?.into())),
            _ => None,
        })
        .collect();
    if sentencepiece_style(&tj) {
        spm_vocab(&tj, &mut names, &mut types, &merges, w);
    } else {
        let pre = byte_level_pre(&tj, &c.arch, &path);
        w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
        w.meta("tokenizer.ggml.pre", Value::String(pre.into()));
        let merges = merges
            .iter()
            .map(|(a, b)| Value::String(format!("{a} {b}")));
        w.meta("tokenizer.ggml.merges", Value::Array(merges.collect()));
    }
    w.meta("tokenizer.ggml.tokens", Value::Array(names.clone()));
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    let id_of = |s: &str| {
        names
            .iter()
            .position(|v| matches!(v, Value::String(x) if x == s))
    };
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = if cfg_path.is_file() {
        Some(read(&cfg_path)?)
    } else {
        None
    };
    let special = |key: &str| -> Option<String> {
        let v = cfg.as_ref()?.get(key)?;
        v.as_str()
            .map(String::from)
            .or_else(|| v.get("content")?.as_str().map(String::from))
    };
    let gen = kiln_runtime::GenerationDefaults::from_dir(dir)?;
    let bos = special("bos_token").and_then(|s| id_of(&s));
    let eos = special("eos_token")
        .and_then(|s| id_of(&s))
        .or(gen.eos_ids.first().map(|&i| i as usize));
    if let Some(b) = bos {
        w.meta("tokenizer.ggml.bos_token_id", Value::U32(b as u32));
    }
    if let Some(e) = eos {
        w.meta("tokenizer.ggml.eos_token_id", Value::U32(e as u32));
    }
    if let Some(p) = special("pad_token").and_then(|s| id_of(&s)) {
        w.meta("tokenizer.ggml.padding_token_id", Value::U32(p as u32));
    }
    let add_bos = cfg
        .as_ref()
        .and_then(|c| c.get("add_bos_token"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    w.meta(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(add_bos && bos.is_some()),
    );
    let template = match cfg.as_ref().and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t["name"].as_str() == Some("default"))
            .and_then(|t| t["template"].as_str())
            .map(String::from),
        _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    if let Some(t) = template {
        w.meta("tokenizer.chat_template", Value::String(t));
    }
    Ok(())
}

/// The `tokenizer.ggml.pre` of a byte-level BPE tokenizer.json: by its pre-tokenizer's
/// split regex where that is one GGUF names (Llama 3's, Qwen2's; GPT-2's built into the
/// byte-level step), else by the architecture (Qwen's, else Llama 3's), said on stderr.
fn byte_level_pre(tj: &Json, arch: &str, path: &Path) -> &'static str {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let pt = &tj["pre_tokenizer"];
    let steps: Vec<&Json> = match pt["pretokenizers"].as_array() {
        Some(list) => list.iter().collect(),
        None => vec![pt],
    };
    let regex = steps
        .iter()
        .find(|s| s["type"] == "Split")
        .and_then(|s| s["pattern"]["Regex"].as_str());
    let gpt2 = steps
        .iter()
        .any(|s| s["type"] == "ByteLevel" && s["use_regex"].as_bool() != Some(false));
    match (regex, gpt2) {
        (Some(LLAMA3), _) => "llama-bpe",
        (Some(QWEN2), _) => "qwen2",
        (None, true) if steps.len() == 1 => "gpt2",
        _ => {
            let pre = match arch {
                "qwen2" | "qwen3" => "qwen2",
                _ => "llama-bpe",
            };
            eprintln!(
                "{}: pre-tokenizer not one GGUF names; written as '{pre}' (the {arch} default)",
                path.display()
            );
            pre
        }
    }
}

/// Whether a BPE tokenizer.json is SentencePiece's (Gemma, Llama 2, Mistral: spaces as `▁`,
/// unknown bytes as `<0xXX>` pieces) rather than byte-level (GPT-2's byte alphabet).
fn sentencepiece_style(tj: &Json) -> bool {
    let text = |v: &Json| v.to_string();
    tj["model"]["byte_fallback"].as_bool() == Some(true)
        || text(&tj["normalizer"]).contains('\u{2581}')
        || text(&tj["pre_tokenizer"]).contains("Metaspace")
}

/// GGUF's SentencePiece vocabulary (`llama`) for a SentencePiece-style BPE tokenizer.json:
/// a pair merges when the joined piece is in the vocabulary, highest score first, so each
/// piece's score is minus the rank of the first merge that makes it (pieces no merge makes,
/// single characters, score below all of them); byte pieces are BYTE, the unknown token
/// UNKNOWN. `types` holds the control and user-defined marks of the added tokens already.
fn spm_vocab(
    tj: &Json,
    names: &mut [Value],
    types: &mut [i32],
    merges: &[(String, String)],
    w: &mut GgufWriter,
) {
    let mut rank: HashMap<String, usize> = HashMap::with_capacity(merges.len());
    for (i, (a, b)) in merges.iter().enumerate() {
        rank.entry(format!("{a}{b}")).or_insert(i);
    }
    let unk = tj["model"]["unk_token"].as_str();
    let is_byte = |s: &str| {
        s.len() == 6
            && s.starts_with("<0x")
            && s.ends_with('>')
            && s[3..5].chars().all(|c| c.is_ascii_hexdigit())
    };
    let mut unk_id = None;
    let scores: Vec<Value> = names
        .iter_mut()
        .zip(types.iter_mut())
        .enumerate()
        .map(|(i, (name, ty))| {
            let Value::String(s) = name else {
                return Value::F32(0.0);
            };
            if *ty == 4 {
                // User-defined pieces are matched in the text as it is (runs of spaces
                // among them), as llama.cpp's converter writes them.
                *s = s.replace('\u{2581}', " ");
            }
            if Some(s.as_str()) == unk {
                *ty = 2;
                unk_id = Some(i);
            } else if *ty == 1 && is_byte(s) {
                *ty = 6;
            }
            Value::F32(match (*ty, rank.get(s)) {
                (1, Some(&r)) => -(r as f32),
                (1, None) => -(merges.len() as f32) - 1.0,
                (6, _) => 0.0,
                _ => -1000.0,
            })
        })
        .collect();
    // A space before the text: a normalizer that prepends `▁`, or a Metaspace pre-tokenizer
    // that adds it.
    let text = |v: &Json| v.to_string();
    let prefix = text(&tj["normalizer"]).contains("\"Prepend\"")
        || (text(&tj["pre_tokenizer"]).contains("Metaspace")
            && !text(&tj["pre_tokenizer"]).contains("\"never\""));
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    w.meta("tokenizer.ggml.pre", Value::String("default".into()));
    w.meta("tokenizer.ggml.scores", Value::Array(scores));
    w.meta("tokenizer.ggml.add_space_prefix", Value::Bool(prefix));
    if let Some(u) = unk_id {
        w.meta("tokenizer.ggml.unknown_token_id", Value::U32(u as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes() {
        let m = Recipe::Q4KM;
        assert_eq!(m.type_for("blk.0.attn_v.weight", 512), GgmlType::Q6_K);
        assert_eq!(m.type_for("blk.0.ffn_down.weight", 512), GgmlType::Q6_K);
        assert_eq!(m.type_for("blk.0.attn_q.weight", 512), GgmlType::Q4_K);
        assert_eq!(m.type_for("blk.0.attn_q.weight", 96), GgmlType::Q5_0);
        assert_eq!(m.type_for("output.weight", 160), GgmlType::Q8_0);
        assert_eq!(
            Recipe::Pure(GgmlType::Q8_0).type_for("output.weight", 64),
            GgmlType::Q8_0
        );
    }

    #[test]
    fn permute_interleaves_halves() {
        // One head of 4 rows (cols 1): rotate-half rows [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        assert_eq!(permute(&[0., 1., 2., 3.], 1, 1), vec![0., 2., 1., 3.]);
    }
}
