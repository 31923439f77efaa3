//! The Llama family's parameters under one canonical naming, and their names in each source
//! format: GGUF (`blk.N.attn_q.weight`) and Hugging Face / MLX (`model.layers.N.self_attn.
//! q_proj.weight`).

/// A parameter of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerParam {
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    /// Gemma: RMSNorm of the attention's output before the residual add.
    PostAttnNorm,
    /// Gemma: RMSNorm of the MLP's output before the residual add.
    PostFfnNorm,
    /// LFM2's short convolution: the input projection to B, C and x (3·dim, dim).
    ConvInProj,
    /// LFM2's short convolution: the output projection (dim, dim).
    ConvOutProj,
    /// LFM2's short convolution: the depthwise taps (dim, k).
    ConvTaps,
}

/// (parameter, GGUF suffix after `blk.N.`, Hugging Face suffix after `model.layers.N.`)
const LAYER: [(LayerParam, &str, &str); 19] = [
    (
        LayerParam::AttnNorm,
        "attn_norm.weight",
        "input_layernorm.weight",
    ),
    (
        LayerParam::AttnQ,
        "attn_q.weight",
        "self_attn.q_proj.weight",
    ),
    (
        LayerParam::AttnK,
        "attn_k.weight",
        "self_attn.k_proj.weight",
    ),
    (
        LayerParam::AttnV,
        "attn_v.weight",
        "self_attn.v_proj.weight",
    ),
    (
        LayerParam::AttnOutput,
        "attn_output.weight",
        "self_attn.o_proj.weight",
    ),
    (
        LayerParam::AttnQBias,
        "attn_q.bias",
        "self_attn.q_proj.bias",
    ),
    (
        LayerParam::AttnKBias,
        "attn_k.bias",
        "self_attn.k_proj.bias",
    ),
    (
        LayerParam::AttnVBias,
        "attn_v.bias",
        "self_attn.v_proj.bias",
    ),
    (
        LayerParam::AttnQNorm,
        "attn_q_norm.weight",
        "self_attn.q_norm.weight",
    ),
    (
        LayerParam::AttnKNorm,
        "attn_k_norm.weight",
        "self_attn.k_norm.weight",
    ),
    (
        LayerParam::FfnNorm,
        "ffn_norm.weight",
        "post_attention_layernorm.weight",
    ),
    (
        LayerParam::FfnGate,
        "ffn_gate.weight",
        "mlp.gate_proj.weight",
    ),
    (LayerParam::FfnUp, "ffn_up.weight", "mlp.up_proj.weight"),
    (
        LayerParam::FfnDown,
        "ffn_down.weight",
        "mlp.down_proj.weight",
    ),
    (
        LayerParam::PostAttnNorm,
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    (
        LayerParam::PostFfnNorm,
        "post_ffw_norm.weight",
        "post_feedforward_layernorm.weight",
    ),
    (
        LayerParam::ConvInProj,
        "shortconv.in_proj.weight",
        "conv.in_proj.weight",
    ),
    (
        LayerParam::ConvOutProj,
        "shortconv.out_proj.weight",
        "conv.out_proj.weight",
    ),
    (
        LayerParam::ConvTaps,
        "shortconv.conv.weight",
        "conv.conv.weight",
    ),
];

/// LFM2's Hugging Face names where they differ from the table's (its GGUF names are the
/// table's but for the final norm, `token_embd_norm`).
fn hf_lfm2_suffix(p: LayerParam) -> &'static str {
    match p {
        LayerParam::AttnNorm => "operator_norm.weight",
        LayerParam::FfnNorm => "ffn_norm.weight",
        LayerParam::FfnGate => "feed_forward.w1.weight",
        LayerParam::FfnUp => "feed_forward.w3.weight",
        LayerParam::FfnDown => "feed_forward.w2.weight",
        LayerParam::AttnOutput => "self_attn.out_proj.weight",
        LayerParam::AttnQNorm => "self_attn.q_layernorm.weight",
        LayerParam::AttnKNorm => "self_attn.k_layernorm.weight",
        p => layer_entry(p).2,
    }
}

/// Gemma's Hugging Face names where they differ from the table's: its
/// `post_attention_layernorm` is the norm after attention, and the MLP's input norm is
/// `pre_feedforward_layernorm` (GGUF names them as for every family).
fn hf_gemma_suffix(p: LayerParam) -> &'static str {
    match p {
        LayerParam::FfnNorm => "pre_feedforward_layernorm.weight",
        p => layer_entry(p).2,
    }
}

/// A parameter of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Param {
    /// Token embeddings (vocab, dim).
    TokenEmbd,
    /// Final RMSNorm (dim).
    OutputNorm,
    /// Output projection (vocab, dim), absent when tied to the embeddings.
    Output,
    /// Llama 3 RoPE frequency factors (GGUF only; Hugging Face configs give the rule).
    RopeFreqs,
    Layer(usize, LayerParam),
}

/// Where a checkpoint's names come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    Gguf,
    HuggingFace,
    /// Gemma's Hugging Face names.
    HuggingFaceGemma,
    /// LFM2's GGUF names (llama.cpp's `lfm2`).
    GgufLfm2,
    /// LFM2's Hugging Face names.
    HuggingFaceLfm2,
}

impl Param {
    /// The parameter's name in `naming`, or `None` when that format has no such tensor.
    pub fn name(self, naming: Naming) -> Option<String> {
        match naming {
            Naming::Gguf => Some(self.gguf()),
            Naming::HuggingFace => self.hf(),
            Naming::HuggingFaceGemma => match self {
                Param::Layer(i, p) => Some(format!("model.layers.{i}.{}", hf_gemma_suffix(p))),
                p => p.hf(),
            },
            Naming::GgufLfm2 => match self {
                Param::OutputNorm => Some("token_embd_norm.weight".into()),
                p => Some(p.gguf()),
            },
            Naming::HuggingFaceLfm2 => match self {
                Param::OutputNorm => Some("model.embedding_norm.weight".into()),
                Param::Layer(i, p) => Some(format!("model.layers.{i}.{}", hf_lfm2_suffix(p))),
                p => p.hf(),
            },
        }
    }

    /// Whether the parameter is an RMSNorm's weight (Gemma's Hugging Face checkpoints store
    /// these as w - 1).
    pub fn is_norm(self) -> bool {
        use LayerParam::*;
        match self {
            Param::OutputNorm => true,
            Param::Layer(_, p) => matches!(
                p,
                AttnNorm | FfnNorm | PostAttnNorm | PostFfnNorm | AttnQNorm | AttnKNorm
            ),
            _ => false,
        }
    }

    /// GGUF name (llama.cpp's, shared by the llama, qwen2 and qwen3 architectures).
    pub fn gguf(self) -> String {
        match self {
            Param::TokenEmbd => "token_embd.weight".into(),
            Param::OutputNorm => "output_norm.weight".into(),
            Param::Output => "output.weight".into(),
            Param::RopeFreqs => "rope_freqs.weight".into(),
            Param::Layer(i, p) => format!("blk.{i}.{}", layer_entry(p).1),
        }
    }

    /// Hugging Face name (transformers' Llama/Qwen2/Qwen3 modules; MLX keeps them).
    pub fn hf(self) -> Option<String> {
        Some(match self {
            Param::TokenEmbd => "model.embed_tokens.weight".into(),
            Param::OutputNorm => "model.norm.weight".into(),
            Param::Output => "lm_head.weight".into(),
            Param::RopeFreqs => return None,
            Param::Layer(i, p) => format!("model.layers.{i}.{}", layer_entry(p).2),
        })
    }

    /// The parameter a Hugging Face name denotes.
    pub fn from_hf(name: &str) -> Option<Param> {
        match name {
            "model.embed_tokens.weight" => return Some(Param::TokenEmbd),
            "model.norm.weight" => return Some(Param::OutputNorm),
            "lm_head.weight" => return Some(Param::Output),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (i, suffix) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        LAYER
            .iter()
            .find(|e| e.2 == suffix)
            .map(|e| Param::Layer(i, e.0))
    }

    /// Whether the parameter is a matrix (quantizable) rather than a norm or bias vector.
    pub fn is_matrix(self) -> bool {
        use LayerParam::*;
        match self {
            Param::TokenEmbd | Param::Output => true,
            Param::OutputNorm | Param::RopeFreqs => false,
            Param::Layer(_, p) => matches!(
                p,
                AttnQ
                    | AttnK
                    | AttnV
                    | AttnOutput
                    | FfnGate
                    | FfnUp
                    | FfnDown
                    | ConvInProj
                    | ConvOutProj
            ),
        }
    }
}

fn layer_entry(p: LayerParam) -> &'static (LayerParam, &'static str, &'static str) {
    LAYER
        .iter()
        .find(|e| e.0 == p)
        .expect("every LayerParam has a table entry")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for e in LAYER {
            let p = Param::Layer(3, e.0);
            // Gemma's post-attention norm shares its Hugging Face name with Llama's FFN norm
            // (Naming::HuggingFaceGemma tells them apart).
            if e.0 == LayerParam::PostAttnNorm {
                continue;
            }
            assert_eq!(Param::from_hf(&p.hf().unwrap()), Some(p));
            assert!(p.gguf().starts_with("blk.3."));
        }
        assert_eq!(
            Param::Layer(0, LayerParam::AttnQ).hf().unwrap(),
            "model.layers.0.self_attn.q_proj.weight"
        );
        assert_eq!(Param::from_hf("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(Param::from_hf("model.layers.1.mlp.up_proj.scales"), None);
    }
}
