//! Hyper-parameters of the Llama family (Llama 2/3, SmolLM, Qwen2, Qwen3), from GGUF metadata.

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
}

pub const SUPPORTED_ARCHS: &str = "llama, qwen2, qwen3";

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
            "qwen3" => (RopeStyle::Neox, false, true),
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
        let n_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(_) => usize_of("attention.head_count_kv")?,
            None => n_heads,
        };
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
        Ok(LlmConfig {
            rope: RopeConfig {
                style,
                dims: rope_dims,
                head_dim,
                theta,
                scaling,
            },
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

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
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
