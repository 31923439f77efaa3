//! Hugging Face checkpoints of the Llama family, Gemma 3 and LFM2: a directory with
//! `config.json` (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
//! Gemma3ForCausalLM, Lfm2ForCausalLM) and safetensors weights (f32, f16,
//! bf16, or MLX affine 4/8-bit with a `quantization` entry in the config).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_backend::{RopeConfig, RopeScaling, RopeStyle};
use kiln_formats::SafetensorsSet;
use serde_json::Value as Json;

use super::config::Activation;
use super::LlmConfig;
use crate::ModelError;

/// MLX quantization of a checkpoint: defaults and per-module overrides (`false`: kept in
/// floating point).
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuant {
    pub bits: u32,
    pub group: usize,
    pub overrides: BTreeMap<String, Option<(u32, usize)>>,
}

impl MlxQuant {
    /// Bits and group size of the module at `path` (a tensor name without `.weight`).
    pub fn of(&self, path: &str) -> Option<(u32, usize)> {
        match self.overrides.get(path) {
            Some(o) => *o,
            None => Some((self.bits, self.group)),
        }
    }
}

/// A Hugging Face model directory, opened: hyper-parameters and mapped weights.
pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub cfg: LlmConfig,
    /// `config.json` as read.
    pub config: Json,
    pub mlx: Option<MlxQuant>,
    pub tensors: SafetensorsSet,
}

impl HfCheckpoint {
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Config {
            file: path.clone(),
            what: format!("cannot read: {e}"),
        })?;
        let (config, cfg, mlx) = parse_config(&path, &text)?;
        let tensors = SafetensorsSet::open_dir(dir)?;
        Ok(HfCheckpoint {
            dir: dir.into(),
            cfg,
            config,
            mlx,
            tensors,
        })
    }
}

/// Whether `dir` looks like a Hugging Face model directory.
pub fn is_hf_dir(dir: &Path) -> bool {
    dir.is_dir() && dir.join("config.json").is_file()
}

pub fn read_json(path: &Path) -> Result<Json, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Config {
        file: path.into(),
        what: format!("cannot read: {e}"),
    })?;
    json_of(path, &text)
}

fn json_of(path: &Path, text: &str) -> Result<Json, ModelError> {
    serde_json::from_str(text).map_err(|e| ModelError::Config {
        file: path.into(),
        what: format!("not valid JSON: {e}"),
    })
}

/// `config.json` text (`file` names it in errors): the JSON, the hyper-parameters and the MLX
/// quantization, if any.
pub fn parse_config(
    file: &Path,
    text: &str,
) -> Result<(Json, LlmConfig, Option<MlxQuant>), ModelError> {
    let config = json_of(file, text)?;
    let cfg = LlmConfig::from_hf(file, &config)?;
    let mlx = mlx_quant(file, &config)?;
    Ok((config, cfg, mlx))
}

fn mlx_quant(file: &Path, c: &Json) -> Result<Option<MlxQuant>, ModelError> {
    let Some(q) = c.get("quantization").or_else(|| {
        // MLX writes both; a transformers `quantization_config` without bits/group_size is
        // some other scheme (rejected below by the tensors it brings).
        c.get("quantization_config")
            .filter(|q| q.get("group_size").is_some() && q.get("bits").is_some())
    }) else {
        return Ok(None);
    };
    let bad = |what: String| ModelError::Config {
        file: file.into(),
        what,
    };
    if let Some(mode) = q.get("mode").and_then(|m| m.as_str()) {
        if mode != "affine" {
            return Err(bad(format!(
                "MLX quantization mode '{mode}' is not supported (affine is)"
            )));
        }
    }
    let pair = |v: &Json, what: &str| -> Result<(u32, usize), ModelError> {
        let bits = v.get("bits").and_then(|b| b.as_u64());
        let group = v.get("group_size").and_then(|g| g.as_u64());
        match (bits, group) {
            (Some(b), Some(g)) if b <= 64 && g <= 1 << 20 => Ok((b as u32, g as usize)),
            (Some(b), Some(g)) => Err(bad(format!(
                "{what}: bits {b} / group_size {g} out of range"
            ))),
            _ => Err(bad(format!(
                "{what}: needs integer 'bits' and 'group_size'"
            ))),
        }
    };
    let (bits, group) = pair(q, "quantization")?;
    let mut overrides = BTreeMap::new();
    if let Some(obj) = q.as_object() {
        for (k, v) in obj {
            match v {
                Json::Object(_) => {
                    overrides.insert(k.clone(), Some(pair(v, &format!("quantization.{k}"))?));
                }
                Json::Bool(false) => {
                    overrides.insert(k.clone(), None);
                }
                _ => {}
            }
        }
    }
    Ok(Some(MlxQuant {
        bits,
        group,
        overrides,
    }))
}

impl LlmConfig {
    /// Hyper-parameters from a Hugging Face `config.json` (transformers 4.x keys, and 5.x's
    /// `rope_parameters`).
    pub fn from_hf(file: &Path, c: &Json) -> Result<Self, ModelError> {
        let bad = |what: String| ModelError::Config {
            file: file.into(),
            what,
        };
        let model_type = c.get("model_type").and_then(|v| v.as_str());
        let class = c
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|v| v.as_str());
        let arch = match (model_type, class) {
            (Some("llama"), _) | (None, Some("LlamaForCausalLM")) => "llama",
            // Mistral is Llama with a sliding window (read below).
            (Some("mistral"), _) | (None, Some("MistralForCausalLM")) => "llama",
            (Some("qwen2"), _) | (None, Some("Qwen2ForCausalLM")) => "qwen2",
            (Some("qwen3"), _) | (None, Some("Qwen3ForCausalLM")) => "qwen3",
            (Some("gemma3_text"), _) | (None, Some("Gemma3ForCausalLM")) => "gemma3",
            (Some("lfm2"), _) | (None, Some("Lfm2ForCausalLM")) => "lfm2",
            _ => {
                return Err(ModelError::UnsupportedArch {
                    file: file.into(),
                    arch: model_type.or(class).unwrap_or("(none given)").to_string(),
                    supported: "llama, mistral, qwen2, qwen3, gemma3_text, lfm2 \
                                (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
                                Qwen3ForCausalLM, Gemma3ForCausalLM, Lfm2ForCausalLM)",
                })
            }
        };
        let gemma = arch == "gemma3";
        let lfm2 = arch == "lfm2";
        let num = |k: &str| -> Result<Option<usize>, ModelError> {
            match c.get(k) {
                None | Some(Json::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|&v| v > 0 && v < (1 << 31))
                    .map(|v| Some(v as usize))
                    .ok_or_else(|| bad(format!("'{k}' = {v} is not a positive integer"))),
            }
        };
        let need = |k: &str| -> Result<usize, ModelError> {
            num(k)?.ok_or_else(|| bad(format!("missing '{k}'")))
        };
        let float = |v: Option<&Json>, k: &str| -> Result<Option<f64>, ModelError> {
            match v {
                None | Some(Json::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| bad(format!("'{k}' = {v} is not a number"))),
            }
        };
        let flag = |k: &str| c.get(k).and_then(|v| v.as_bool());
        let dim = need("hidden_size")?;
        let n_layers = need("num_hidden_layers")?;
        let n_heads = need("num_attention_heads")?;
        let n_kv_heads = num("num_key_value_heads")?.unwrap_or(n_heads);
        let head_dim = num("head_dim")?.unwrap_or(dim / n_heads);
        let ffn_dim = match lfm2 {
            true => lfm2_ffn_dim(c).map_err(bad)?,
            false => need("intermediate_size")?,
        };
        let vocab_size = need("vocab_size")?;
        let ctx_train = num("max_position_embeddings")?.unwrap_or(4096);
        let eps_key = if lfm2 { "norm_eps" } else { "rms_norm_eps" };
        let norm_eps = float(c.get(eps_key), eps_key)?.unwrap_or(1e-6) as f32;
        // Gemma names it hidden_activation (hidden_act in older configs).
        let act = c
            .get("hidden_activation")
            .filter(|v| !v.is_null())
            .or(c.get("hidden_act"))
            .and_then(|v| v.as_str());
        let act = match (act, gemma) {
            (None, false) | (Some("silu"), _) => Activation::Silu,
            (None, true) | (Some("gelu_pytorch_tanh"), true) => Activation::GeluTanh,
            (Some(other), _) => {
                return Err(bad(format!(
                    "hidden_act '{other}' is not supported (silu and gelu_pytorch_tanh are)"
                )))
            }
        };
        for k in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if c.get(k).is_some_and(|v| !v.is_null()) {
                return Err(bad(format!("{k} is not supported")));
            }
        }
        if flag("use_bidirectional_attention") == Some(true) {
            return Err(bad("use_bidirectional_attention is not supported".into()));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "{n_heads} heads is not a multiple of {n_kv_heads} kv heads"
            )));
        }
        super::config::check_head_dim(head_dim, "head_dim").map_err(bad)?;
        if head_dim % 2 != 0 {
            return Err(bad(format!("head_dim {head_dim} is odd")));
        }
        if flag("mlp_bias") == Some(true) {
            return Err(bad("mlp_bias is not supported".into()));
        }
        let qkv_bias = match arch {
            // Qwen2's q/k/v projections always carry biases (and o_proj none).
            "qwen2" => true,
            _ if flag("attention_bias") == Some(true) => return Err(bad(
                "attention_bias (biases on q, k, v and o) is not supported for this architecture"
                    .into(),
            )),
            _ => false,
        };
        let layer_window = match lfm2 {
            true => Vec::new(),
            false => layer_windows(c, arch, n_layers).map_err(bad)?,
        };
        let (conv_layers, conv_k) = match lfm2 {
            true => {
                if flag("conv_bias") == Some(true) {
                    return Err(bad("conv_bias is not supported".into()));
                }
                let k = num("conv_L_cache")?.unwrap_or(3);
                if k > super::config::MAX_CONV_K {
                    return Err(bad(format!("conv_L_cache {k} is out of range")));
                }
                (lfm2_conv_layers(c, n_layers).map_err(bad)?, k)
            }
            false => (Vec::new(), 0),
        };
        // transformers 5 folds theta and scaling into `rope_parameters` (Gemma 3: one per
        // layer type); 4.x has `rope_theta` and `rope_scaling` (Gemma 3 also
        // `rope_local_base_freq`).
        let rp_all = c.get("rope_parameters").filter(|v| v.is_object());
        let rp = rp_all
            .and_then(|p| p.get("full_attention"))
            .filter(|v| v.is_object())
            .or(rp_all);
        let rp_local = rp_all
            .and_then(|p| p.get("sliding_attention"))
            .filter(|v| v.is_object());
        let theta = float(
            rp.and_then(|p| p.get("rope_theta")).or(c.get("rope_theta")),
            "rope_theta",
        )?
        .unwrap_or(10000.0) as f32;
        let scaling_obj = c.get("rope_scaling").filter(|v| v.is_object()).or(rp);
        let rope_type = scaling_obj
            .and_then(|s| s.get("rope_type").or(s.get("type")))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        let sf = |k: &str| -> Result<f64, ModelError> {
            float(scaling_obj.and_then(|s| s.get(k)), k)?
                .ok_or_else(|| bad(format!("rope scaling '{rope_type}' needs '{k}'")))
        };
        let dims = head_dim;
        let scaling = match rope_type {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Factors(vec![sf("factor")? as f32; dims / 2]),
            "llama3" => RopeScaling::Factors(llama3_factors(
                theta,
                dims,
                sf("factor")?,
                sf("low_freq_factor")?,
                sf("high_freq_factor")?,
                sf("original_max_position_embeddings")?,
            )),
            other => {
                return Err(bad(format!(
                    "rope scaling '{other}' is not supported (linear and llama3 are)"
                )))
            }
        };
        // Gemma and LFM2 tie their embeddings unless the config says otherwise (LFM2's
        // configs name it `tie_embedding`).
        let tied_embeddings = flag("tie_word_embeddings")
            .or(flag("tie_embedding"))
            .unwrap_or(gemma || lfm2);
        let rope = RopeConfig {
            // Hugging Face q/k weights are laid out for rotate-half RoPE (GGUF conversion
            // permutes Llama's into interleaved pairs; here they stay as trained).
            style: RopeStyle::Neox,
            dims,
            head_dim,
            theta,
            scaling,
        };
        let rope_local = match (gemma, rp_local) {
            (false, _) => None,
            (true, Some(p)) => {
                let t = p
                    .get("rope_type")
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                if t != "default" {
                    return Err(bad(format!(
                        "rope scaling '{t}' of the sliding layers is not supported"
                    )));
                }
                let theta = float(p.get("rope_theta"), "rope_theta")?.unwrap_or(10000.0);
                Some(RopeConfig {
                    theta: theta as f32,
                    scaling: RopeScaling::None,
                    ..rope.clone()
                })
            }
            (true, None) => Some(RopeConfig {
                theta: float(c.get("rope_local_base_freq"), "rope_local_base_freq")?
                    .unwrap_or(10000.0) as f32,
                scaling: RopeScaling::None,
                ..rope.clone()
            }),
        };
        let q_scale = match gemma {
            true => {
                let s = float(c.get("query_pre_attn_scalar"), "query_pre_attn_scalar")?
                    .unwrap_or(head_dim as f64);
                if s <= 0.0 {
                    return Err(bad(format!("query_pre_attn_scalar {s} is not positive")));
                }
                (head_dim as f64 / s).sqrt() as f32
            }
            false => 1.0,
        };
        Ok(LlmConfig {
            arch: arch.into(),
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            ctx_train,
            norm_eps,
            rope,
            qkv_bias,
            qk_norm: arch == "qwen3" || gemma || lfm2,
            tied_embeddings,
            act,
            post_norms: gemma,
            embed_scale: if gemma { (dim as f32).sqrt() } else { 1.0 },
            layer_window,
            rope_local,
            q_scale,
            conv_layers,
            conv_k,
        })
    }
}

/// LFM2's MLP width as transformers derives it: `block_ff_dim` (else `intermediate_size`),
/// taken to 2/3 when `block_auto_adjust_ff_dim`, then times `block_ffn_dim_multiplier` and
/// rounded up to `block_multiple_of` where a multiplier is given.
fn lfm2_ffn_dim(c: &Json) -> Result<usize, String> {
    let base = ["block_ff_dim", "intermediate_size"]
        .iter()
        .find_map(|k| c.get(*k).and_then(|v| v.as_u64()))
        .filter(|&v| v > 0 && v < 1 << 31)
        .ok_or("missing 'intermediate_size'")? as usize;
    if c.get("block_auto_adjust_ff_dim").and_then(|v| v.as_bool()) == Some(false) {
        return Ok(base);
    }
    let mut ff = 2 * base / 3;
    // Absent: transformers' default multiplier, 1.0; null: none (no rounding either).
    let multiplier = match c.get("block_ffn_dim_multiplier") {
        None => Some(1.0),
        Some(v) => v.as_f64(),
    };
    if let Some(m) = multiplier {
        let of = c
            .get("block_multiple_of")
            .and_then(|v| v.as_u64())
            .unwrap_or(256)
            .clamp(1, 1 << 20) as usize;
        ff = (m * ff as f64) as usize;
        ff = of * ff.div_ceil(of);
    }
    match ff {
        0 => Err("the MLP width comes out as 0".into()),
        ff => Ok(ff),
    }
}

/// LFM2's convolution layers: `layer_types` ("conv" / "full_attention"), else every layer
/// not in `full_attn_idxs` (neither: all attention).
fn lfm2_conv_layers(c: &Json, n_layers: usize) -> Result<Vec<bool>, String> {
    if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
        let types = types
            .as_array()
            .filter(|a| a.len() == n_layers)
            .ok_or_else(|| format!("'layer_types' is not a list of {n_layers} layer types"))?;
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("conv") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(format!("layer type {t} is not supported")),
            })
            .collect();
    }
    match c.get("full_attn_idxs").and_then(|v| v.as_array()) {
        Some(idx) => {
            let idx: Vec<u64> = idx.iter().filter_map(|v| v.as_u64()).collect();
            Ok((0..n_layers as u64).map(|i| !idx.contains(&i)).collect())
        }
        None => Ok(vec![false; n_layers]),
    }
}

/// Each layer's sliding window from a config (empty: none): `layer_types` where the config
/// names them (Gemma 3, Qwen2/3 in transformers 5), else Qwen2's `use_sliding_window` from
/// layer `max_window_layers` on, Mistral's `sliding_window` on every layer, Gemma 3's
/// pattern of one global layer in six.
fn layer_windows(c: &Json, arch: &str, n_layers: usize) -> Result<Vec<usize>, String> {
    let window = match c.get("sliding_window") {
        None | Some(Json::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&w| w > 0 && w < (1 << 31))
                .ok_or_else(|| format!("'sliding_window' = {v} is not a positive integer"))?
                as usize,
        ),
    };
    let model_type = c.get("model_type").and_then(|v| v.as_str());
    let use_sw = c.get("use_sliding_window").and_then(|v| v.as_bool());
    if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
        let types = types
            .as_array()
            .filter(|a| a.len() == n_layers)
            .ok_or_else(|| format!("'layer_types' is not a list of {n_layers} layer types"))?;
        // Qwen2/3 write `sliding_attention` types but only use them with use_sliding_window.
        let honoured = arch == "gemma3" || use_sw != Some(false);
        let mut out = Vec::with_capacity(n_layers);
        for t in types {
            match t.as_str() {
                Some("full_attention") => out.push(0),
                Some("sliding_attention") if !honoured => out.push(0),
                Some("sliding_attention") => out.push(
                    window.ok_or("'layer_types' has sliding layers but no 'sliding_window'")?,
                ),
                _ => return Err(format!("layer type {t} is not supported")),
            }
        }
        return Ok(if out.iter().all(|&w| w == 0) {
            Vec::new()
        } else {
            out
        });
    }
    let Some(w) = window else {
        return Ok(Vec::new());
    };
    Ok(match (arch, model_type) {
        ("gemma3", _) => super::config::gemma3_windows(n_layers, w),
        (_, Some("mistral")) => vec![w; n_layers],
        ("qwen2" | "qwen3", _) if use_sw == Some(true) => {
            let from = c
                .get("max_window_layers")
                .and_then(|v| v.as_u64())
                .unwrap_or(0) as usize;
            (0..n_layers)
                .map(|i| if i >= from { w } else { 0 })
                .collect()
        }
        _ => Vec::new(),
    })
}

/// Llama 3's frequency rule as per-pair divisors of the base frequencies: wavelengths
/// shorter than `orig / high` keep their frequency, longer than `orig / low` are divided by
/// `factor`, and those between blend the two.
pub fn llama3_factors(
    theta: f32,
    dims: usize,
    factor: f64,
    low: f64,
    high: f64,
    orig: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (orig / low, orig / high);
    (0..dims / 2)
        .map(|i| {
            let freq = 1.0 / (theta as f64).powf(2.0 * i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Json) -> Result<LlmConfig, ModelError> {
        LlmConfig::from_hf(Path::new("config.json"), &v)
    }

    /// A head_dim from the file sized the RoPE factor table before anything checked it: 2^31
    /// made a multi-GiB allocation (found by the `hf_config` fuzz target's sibling `gguf`).
    #[test]
    fn absurd_head_dim_is_an_error_not_an_allocation() {
        let e = cfg(json!({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 1, "intermediate_size": 64, "vocab_size": 8,
            "head_dim": 2147483646, "rope_scaling": {"rope_type": "linear", "factor": 2.0}
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("head_dim 2147483646 is out of range"), "{e}");
    }

    /// transformers 4.x keys, as Hugging Face's Llama 3.2 and Qwen configs have them.
    #[test]
    fn transformers_4_keys() {
        let c = cfg(json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": true, "hidden_act": "silu"
        }))
        .unwrap();
        assert_eq!((c.head_dim, c.n_kv_heads, c.rope.theta), (64, 8, 500000.0));
        assert!(c.tied_embeddings && !c.qkv_bias && !c.qk_norm);
        let RopeScaling::Factors(f) = &c.rope.scaling else {
            panic!("llama3 scaling")
        };
        // Short wavelengths untouched, long ones divided by the factor.
        assert_eq!((f[0], f[31]), (1.0, 32.0));

        let q = cfg(json!({
            "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
            "vocab_size": 151936, "rope_theta": 1000000.0, "rope_scaling": null,
            "use_sliding_window": false
        }))
        .unwrap();
        assert!(q.qkv_bias && q.rope.scaling == RopeScaling::None && q.head_dim == 64);

        let lin = cfg(json!({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 10,
            "rope_scaling": {"type": "linear", "factor": 4.0}
        }))
        .unwrap();
        assert_eq!(lin.rope.scaling, RopeScaling::Factors(vec![4.0; 8]));
    }

    #[test]
    fn unsupported_settings_are_named() {
        let base = json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 10});
        let with = |k: &str, v: Json| {
            let mut b = base.clone();
            b[k] = v;
            cfg(b).unwrap_err().to_string()
        };
        assert!(with("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})).contains("yarn"));
        assert!(with("hidden_act", json!("gelu")).contains("gelu"));
        assert!(with("attention_bias", json!(true)).contains("attention_bias"));
        assert!(with("num_key_value_heads", json!(3)).contains("kv heads"));
        assert!(with("hidden_size", json!("big")).contains("hidden_size"));
        let mut b = base.clone();
        b.as_object_mut().unwrap().remove("intermediate_size");
        assert!(cfg(b)
            .unwrap_err()
            .to_string()
            .contains("missing 'intermediate_size'"));
    }

    #[test]
    fn mlx_overrides() {
        let q = mlx_quant(
            Path::new("config.json"),
            &json!({"quantization": {"group_size": 64, "bits": 4,
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
                "lm_head": false}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.of("model.layers.1.mlp.down_proj"), Some((4, 64)));
        assert_eq!(q.of("model.layers.0.mlp.down_proj"), Some((8, 32)));
        assert_eq!(q.of("lm_head"), None);
        let e = mlx_quant(
            Path::new("config.json"),
            &json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("mxfp4"));
    }
}
