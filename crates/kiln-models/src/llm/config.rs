//! Hyper-parameters of the Llama family (Llama 2/3, SmolLM, Qwen2, Qwen3), Gemma 3 and LFM2,
//! from GGUF metadata.

use kiln_backend::{RopeConfig, RopeScaling, RopeStyle};
use kiln_formats::GgufFile;

use crate::ModelError;

#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    pub arch: String,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub ctx_train: usize,
    pub norm_eps: f32,
    pub rope: RopeConfig,
    /// Qwen2: biases on q, k, v projections.
    pub qkv_bias: bool,
    /// Qwen3: RMSNorm over each q and k head before RoPE.
    pub qk_norm: bool,
    /// Output projection shares the embedding table.
    pub tied_embeddings: bool,
    /// The MLP's gate activation.
    pub act: Activation,
    /// Gemma's blocks: an RMSNorm of the attention's and the MLP's outputs too, before each
    /// is added to the residual stream.
    pub post_norms: bool,
    /// Embeddings are multiplied by this (Gemma: sqrt(dim)); 1 elsewhere.
    pub embed_scale: f32,
    /// Each layer's sliding window (0: the layer attends to every position); empty when no
    /// layer has one.
    pub layer_window: Vec<usize>,
    /// RoPE of the windowed layers where it differs from `rope` (Gemma 3's local base).
    pub rope_local: Option<RopeConfig>,
    /// Attention scores' scale over 1/sqrt(head_dim) (Gemma's `query_pre_attn_scalar`),
    /// folded into the queries' head norm at load; 1 elsewhere.
    pub q_scale: f32,
    /// LFM2: which layers are gated short convolutions instead of attention (empty: none).
    pub conv_layers: Vec<bool>,
    /// LFM2: the short convolutions' width (`conv_L_cache`: the current position and the
    /// k - 1 before it).
    pub conv_k: usize,
}

/// The gated MLP's activation: SwiGLU's SiLU, or GeGLU's tanh-approximated GELU (Gemma).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

pub const SUPPORTED_ARCHS: &str = "llama, qwen2, qwen3, gemma3, lfm2";

/// The widest short convolution kiln runs (LFM2's is 3).
pub const MAX_CONV_K: usize = 64;

/// Gemma 3's sliding-window layers: five local layers to each global one (llama.cpp's
/// GGUFs do not store the pattern; transformers' configs name every layer's type).
pub const GEMMA3_GLOBAL_EVERY: usize = 6;

/// The widest attention head kiln accepts (models use 64..256). A header saying more is
/// corrupt, and is refused before anything (RoPE tables) is sized by it.
pub const MAX_HEAD_DIM: usize = 4096;

/// Rejects a head or RoPE width no model has.
pub(crate) fn check_head_dim(head_dim: usize, what: &str) -> Result<(), String> {
    if head_dim == 0 || head_dim > MAX_HEAD_DIM {
        return Err(format!(
            "{what} {head_dim} is out of range (1..={MAX_HEAD_DIM}): corrupt header?"
        ));
    }
    Ok(())
}

impl LlmConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let file = g.path().to_path_buf();
        let arch = g.architecture()?.to_string();
        let (style, qkv_bias, qk_norm) = match arch.as_str() {
            "llama" => (RopeStyle::Interleaved, false, false),
            "qwen2" => (RopeStyle::Neox, true, false),
            "qwen3" | "gemma3" | "lfm2" => (RopeStyle::Neox, false, true),
            _ => {
                return Err(ModelError::UnsupportedArch {
                    file,
                    arch,
                    supported: SUPPORTED_ARCHS,
                })
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let usize_of = |k: &str| -> Result<usize, ModelError> {
            let v = g.get_u64(&key(k))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < (1 << 31))
                .ok_or_else(|| ModelError::Config {
                    file: file.clone(),
                    what: format!("{} = {v} is out of range", key(k)),
                })
        };
        let n_layers = usize_of("block_count")?;
        let dim = usize_of("embedding_length")?;
        let ffn_dim = usize_of("feed_forward_length")?;
        let n_heads = usize_of("attention.head_count")?;
        // LFM2 gives the KV heads per layer, 0 for its convolution layers.
        let mut conv_layers = Vec::new();
        let n_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(v) if v.as_array().is_some() => {
                let per: Vec<u64> = v
                    .as_array()
                    .unwrap_or_default()
                    .iter()
                    .map(|x| x.as_u64().unwrap_or(u64::MAX))
                    .collect();
                let bad_len = per.len() as u64 != g.get_u64(&key("block_count")).unwrap_or(0);
                let heads: Vec<u64> = per.iter().copied().filter(|&h| h != 0).collect();
                let h = heads.first().copied().unwrap_or(0);
                if bad_len || h == 0 || h >= 1 << 31 || heads.iter().any(|&x| x != h) {
                    return Err(ModelError::Config {
                        file: file.clone(),
                        what: format!(
                            "{} is not one KV head count per layer (0 for convolution layers)",
                            key("attention.head_count_kv")
                        ),
                    });
                }
                if arch == "lfm2" {
                    conv_layers = per.iter().map(|&h| h == 0).collect();
                } else if per.contains(&0) {
                    return Err(ModelError::Config {
                        file: file.clone(),
                        what: format!("layers without attention are not supported for {arch}"),
                    });
                }
                h as usize
            }
            Some(_) => usize_of("attention.head_count_kv")?,
            None => n_heads,
        };
        let conv_k = match arch.as_str() {
            "lfm2" => usize_of("shortconv.l_cache")?,
            _ => 0,
        };
        if conv_k > MAX_CONV_K {
            return Err(ModelError::Config {
                file: file.clone(),
                what: format!("{} = {conv_k} is out of range", key("shortconv.l_cache")),
            });
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(_) => usize_of("attention.key_length")?,
            None => dim / n_heads,
        };
        let ctx_train = usize_of("context_length")?;
        let vocab_size = match g.get(&key("vocab_size")) {
            Some(_) => usize_of("vocab_size")?,
            None => g.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let norm_eps = g
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5) as f32;
        let theta = g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let rope_dims = match g.get(&key("rope.dimension_count")) {
            Some(_) => usize_of("rope.dimension_count")?,
            None => head_dim,
        };
        let bad = |what: String| ModelError::Config {
            file: file.clone(),
            what,
        };
        if n_heads % n_kv_heads != 0 {
            return Err(bad(format!(
                "{n_heads} heads is not a multiple of {n_kv_heads} kv heads"
            )));
        }
        check_head_dim(head_dim, "head size").map_err(bad)?;
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad(format!(
                "rope dimension {rope_dims} does not fit head size {head_dim}"
            )));
        }
        let scaling = match g.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                let f = g.get_f64(&key("rope.scaling.factor"))? as f32;
                RopeScaling::Factors(vec![f; rope_dims / 2])
            }
            Some(other) => return Err(bad(format!("rope scaling '{other}' is not supported"))),
        };
        let tied_embeddings = g.tensor("output.weight").is_none();
        let rope = RopeConfig {
            style,
            dims: rope_dims,
            head_dim,
            theta,
            scaling,
        };
        let gemma = arch == "gemma3";
        let (mut layer_window, mut rope_local, mut q_scale) = (Vec::new(), None, 1.0);
        if gemma {
            let window = match g.get(&key("attention.sliding_window")) {
                Some(_) => usize_of("attention.sliding_window")?,
                None => 0,
            };
            if window > 0 {
                layer_window = gemma3_windows(n_layers, window);
            }
            // Local layers: base 10000, never scaled (as llama.cpp runs these files).
            rope_local = Some(RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::None,
                ..rope.clone()
            });
            q_scale = Self::gemma3_q_scale(n_layers, dim, n_heads, head_dim);
        }
        Ok(LlmConfig {
            rope,
            act: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            post_norms: gemma,
            embed_scale: if gemma { (dim as f32).sqrt() } else { 1.0 },
            layer_window,
            rope_local,
            q_scale,
            conv_layers,
            conv_k,
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            ctx_train,
            norm_eps,
            qkv_bias,
            qk_norm,
            tied_embeddings,
        })
    }

    /// The queries' scale a gemma3 GGUF implies (it stores no query_pre_attn_scalar): scores
    /// scaled by 1/sqrt(head_dim) for every size but the 27B (62 layers), whose scalar is
    /// dim / heads (llama.cpp's rule).
    pub fn gemma3_q_scale(n_layers: usize, dim: usize, n_heads: usize, head_dim: usize) -> f32 {
        match n_layers {
            62 => (head_dim as f32 / (dim / n_heads) as f32).sqrt(),
            _ => 1.0,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `il` is a short convolution (LFM2) rather than attention.
    pub fn is_conv(&self, il: usize) -> bool {
        self.conv_layers.get(il).copied().unwrap_or(false)
    }

    /// Convolution layers (each sequence keeps k - 1 rows of state for each).
    pub fn n_conv_layers(&self) -> usize {
        self.conv_layers.iter().filter(|&&c| c).count()
    }

    /// Layer `il`'s sliding window (0: none).
    pub fn window(&self, il: usize) -> usize {
        self.layer_window.get(il).copied().unwrap_or(0)
    }

    /// Positions the layers' KV caches hold for a context of `n_ctx` (every layer has a
    /// cache, `kv_groups`): a sliding-window layer its slots for steps of up to `chunk`.
    pub fn kv_cache_positions(&self, n_ctx: usize, chunk: usize) -> usize {
        (0..self.n_layers)
            .map(|il| {
                let win = kiln_backend::KvWindow {
                    window: self.window(il),
                    chunk,
                };
                kiln_backend::window::WindowSlots::new(win, n_ctx, 1).map_or(n_ctx, |w| w.slots)
            })
            .sum()
    }

    /// The layers' KV caches: one per distinct window (0: every position), in the order the
    /// layers first use them, and each layer's (cache, index within it).
    pub fn kv_groups(&self) -> (Vec<usize>, Vec<(usize, usize)>) {
        let (mut windows, mut counts) = (Vec::<usize>::new(), Vec::<usize>::new());
        let map = (0..self.n_layers)
            .map(|il| {
                let w = self.window(il);
                let g = match windows.iter().position(|&x| x == w) {
                    Some(g) => g,
                    None => {
                        windows.push(w);
                        counts.push(0);
                        windows.len() - 1
                    }
                };
                counts[g] += 1;
                (g, counts[g] - 1)
            })
            .collect();
        (windows, map)
    }

    /// Layer `il`'s RoPE.
    pub fn rope_of(&self, il: usize) -> &RopeConfig {
        match &self.rope_local {
            Some(local) if self.window(il) > 0 => local,
            _ => &self.rope,
        }
    }
}

/// Gemma 3's layer windows: `window` for the local layers, 0 for every sixth (global).
pub fn gemma3_windows(n_layers: usize, window: usize) -> Vec<usize> {
    (0..n_layers)
        .map(|i| {
            if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 {
                0
            } else {
                window
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_formats::{GgufWriter, Value};

    /// An embedding length of 2^30 over 4 heads made head_dim 2^28, and linear RoPE scaling
    /// then asked for a table of 2^27 floats per the file's say-so (found by the `gguf` fuzz
    /// target as a refused 805 MB allocation).
    #[test]
    fn absurd_head_size_is_an_error_not_an_allocation() {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", Value::String("llama".into()))
            .meta("llama.block_count", Value::U32(1))
            .meta("llama.context_length", Value::U32(128))
            .meta("llama.embedding_length", Value::U32(1 << 30))
            .meta("llama.feed_forward_length", Value::U32(64))
            .meta("llama.attention.head_count", Value::U32(4))
            .meta("llama.vocab_size", Value::U32(4))
            .meta("llama.rope.scaling.type", Value::String("linear".into()))
            .meta("llama.rope.scaling.factor", Value::F32(2.0));
        let g = GgufFile::from_bytes("big-head.gguf", w.to_bytes()).unwrap();
        let e = LlmConfig::from_gguf(&g).unwrap_err().to_string();
        assert!(
            e.contains("big-head.gguf") && e.contains("head size 268435456 is out of range"),
            "{e}"
        );
    }
}
