//! Whisper (Radford et al., 2022): a log-mel spectrogram goes through a convolutional stem and
//! a pre-norm transformer encoder once per 30 s window; a pre-norm transformer decoder then
//! writes text tokens, attending to its own past (KV cache) and to the encoder's output
//! (cross-attention keys/values computed once per window).
//!
//! audio:  x = gelu(conv2(gelu(conv1(mel)))) + sinusoids        (conv2 has stride 2)
//!         for each layer:  x += attn(ln(x));  x += mlp(ln(x))    -> ln_post(x)
//! text:   x = embed(tokens) + pos[positions]
//!         for each layer:  x += self_attn(ln(x));  x += cross_attn(ln(x), audio);  x += mlp(ln(x))
//!         logits = ln(x) · embedᵀ                                 (tied output projection)
//!
//! One implementation for every size (tiny .. large-v3), 80 or 128 mel bins, English-only or
//! multilingual vocabularies; weights from a CTranslate2 `model.bin`, a whisper.cpp ggml `.bin`
//! (f32, f16 or quantized) or a Hugging Face `openai/whisper-*` safetensors directory, all
//! read through one canonical name map ([`Weights`]).

mod decoder;
mod encoder;
mod weights;

use std::path::Path;

use kiln_backend::Backend;
use kiln_formats::{Ct2File, WhisperGgmlFile};
use kiln_quant::GgmlType;

pub use decoder::{BeamScratch, CrossKv, Decoder, DecoderState};
pub use encoder::{Encoder, EncoderState};
pub use weights::{HfWhisper, Weights, WhisperFile};

use crate::ModelError;

/// LayerNorm epsilon of every Whisper norm.
pub const LN_EPS: f32 = 1e-5;

#[derive(Debug, Clone, PartialEq)]
pub struct WhisperConfig {
    pub n_mels: usize,
    /// Encoder positions per window (1500 = 3000 mel frames / 2).
    pub n_audio_ctx: usize,
    pub n_audio_layers: usize,
    pub n_audio_heads: usize,
    pub d_model: usize,
    pub ffn_dim: usize,
    pub n_text_ctx: usize,
    pub n_text_layers: usize,
    pub n_text_heads: usize,
    pub n_vocab: usize,
}

impl WhisperConfig {
    /// Mel frames per window (the encoder halves them).
    pub fn n_frames(&self) -> usize {
        self.n_audio_ctx * 2
    }

    /// Read from the shapes and scalars of a CTranslate2 `WhisperSpec` file.
    pub fn from_ct2(f: &Ct2File) -> Result<Self, ModelError> {
        let cfg_err = |what: String| ModelError::Config {
            file: f.path().into(),
            what,
        };
        if !f.spec.is_empty() && f.spec != "WhisperSpec" {
            return Err(ModelError::UnsupportedArch {
                file: f.path().into(),
                arch: f.spec.clone(),
                supported: "WhisperSpec",
            });
        }
        let shape = |name: &str| -> Result<Vec<usize>, ModelError> {
            f.var(name)
                .map(|v| v.shape.iter().map(|&d| d as usize).collect())
                .ok_or_else(|| ModelError::MissingTensor {
                    file: f.path().into(),
                    name: name.into(),
                })
        };
        let conv1 = shape("encoder/conv1/weight")?;
        if conv1.len() != 3 || conv1[2] != 3 {
            return Err(cfg_err(format!("encoder/conv1/weight has shape {conv1:?}")));
        }
        let (d_model, n_mels) = (conv1[0], conv1[1]);
        let count = |prefix: &str| {
            (0..)
                .take_while(|i| {
                    f.var(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))
                        .is_some()
                })
                .count()
        };
        let emb = shape("decoder/embeddings/weight")?;
        let n_text_ctx = shape("decoder/position_encodings/encodings")?[0];
        let n_audio_ctx = match f.var("encoder/position_encodings/encodings") {
            Some(v) => v.shape[0] as usize,
            None => 1500,
        };
        let heads = |name: &str| -> Result<usize, ModelError> {
            let h = f.scalar_i64(name)?;
            usize::try_from(h)
                .ok()
                .filter(|&h| h > 0 && d_model % h == 0)
                .ok_or_else(|| cfg_err(format!("{name} = {h} does not divide d_model {d_model}")))
        };
        let cfg = WhisperConfig {
            n_mels,
            n_audio_ctx,
            n_audio_layers: count("encoder"),
            n_audio_heads: heads("encoder/num_heads")?,
            d_model,
            ffn_dim: shape("encoder/layer_0/ffn/linear_0/weight")?[0],
            n_text_ctx,
            n_text_layers: count("decoder"),
            n_text_heads: heads("decoder/num_heads")?,
            n_vocab: emb[0],
        };
        if emb.get(1) != Some(&d_model) || cfg.n_audio_layers == 0 || cfg.n_text_layers == 0 {
            return Err(cfg_err(format!("inconsistent shapes: {cfg:?}")));
        }
        // The decoder variant this implementation computes (CTranslate2 flags).
        for (flag, want) in [
            ("decoder/activation", 3), // GELU (erf)
            ("decoder/pre_norm", 1),
            ("decoder/scale_embeddings", 0),
            ("decoder/alibi", 0),
            ("decoder/start_from_zero_embedding", 0),
        ] {
            if f.var(flag).is_some() && f.scalar_i64(flag)? != want {
                return Err(cfg_err(format!(
                    "{flag} = {} (Whisper has {want})",
                    f.scalar_i64(flag)?
                )));
            }
        }
        Ok(cfg)
    }

    /// Read from whichever format `f` is.
    pub fn from_file(f: &WhisperFile) -> Result<Self, ModelError> {
        let cfg = match f {
            WhisperFile::Ct2(c) => Self::from_ct2(c)?,
            WhisperFile::Ggml(g) => Self::from_ggml(g)?,
            WhisperFile::Hf(h) => Self::from_hf(h)?,
        };
        cfg.check(f.path())?;
        Ok(cfg)
    }

    fn check(&self, file: &Path) -> Result<(), ModelError> {
        let c = self;
        let bad = [
            (c.n_mels, "n_mels"),
            (c.n_audio_ctx, "n_audio_ctx"),
            (c.n_audio_layers, "audio layers"),
            (c.n_audio_heads, "audio heads"),
            (c.d_model, "d_model"),
            (c.ffn_dim, "ffn_dim"),
            (c.n_text_ctx, "n_text_ctx"),
            (c.n_text_layers, "text layers"),
            (c.n_text_heads, "text heads"),
            (c.n_vocab, "n_vocab"),
        ]
        .into_iter()
        .find(|&(v, _)| v == 0 || v > 1 << 20)
        .map(|(v, n)| format!("{n} = {v}"))
        .or_else(|| {
            (c.d_model % c.n_audio_heads != 0 || c.d_model % c.n_text_heads != 0).then(|| {
                format!(
                    "heads {}/{} do not divide d_model {}",
                    c.n_audio_heads, c.n_text_heads, c.d_model
                )
            })
        });
        match bad {
            Some(what) => Err(ModelError::Config {
                file: file.into(),
                what: format!("implausible Whisper hyperparameters: {what}"),
            }),
            None => Ok(()),
        }
    }

    /// From a whisper.cpp file's hparams (the MLP width from its first layer's shape).
    pub fn from_ggml(f: &WhisperGgmlFile) -> Result<Self, ModelError> {
        let h = &f.hparams;
        let cfg_err = |what: String| ModelError::Config {
            file: f.path().into(),
            what,
        };
        if h.n_audio_state != h.n_text_state {
            return Err(cfg_err(format!(
                "n_audio_state {} differs from n_text_state {}",
                h.n_audio_state, h.n_text_state
            )));
        }
        let fc1 = "encoder.blocks.0.mlp.0.weight";
        let ffn_dim = f
            .tensor(fc1)
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| ModelError::MissingTensor {
                file: f.path().into(),
                name: fc1.into(),
            })? as usize;
        Ok(WhisperConfig {
            n_mels: h.n_mels as usize,
            n_audio_ctx: h.n_audio_ctx as usize,
            n_audio_layers: h.n_audio_layer as usize,
            n_audio_heads: h.n_audio_head as usize,
            d_model: h.n_audio_state as usize,
            ffn_dim,
            n_text_ctx: h.n_text_ctx as usize,
            n_text_layers: h.n_text_layer as usize,
            n_text_heads: h.n_text_head as usize,
            n_vocab: h.n_vocab as usize,
        })
    }

    /// From a Hugging Face `config.json` (`WhisperConfig` of transformers).
    pub fn from_hf(h: &HfWhisper) -> Result<Self, ModelError> {
        let file = h.dir.join("config.json");
        let cfg_err = |what: String| ModelError::Config {
            file: file.clone(),
            what,
        };
        let c = &h.config;
        let model_type = c.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        if model_type != "whisper" {
            return Err(ModelError::UnsupportedArch {
                file: file.clone(),
                arch: model_type.into(),
                supported: "whisper",
            });
        }
        let num = |key: &str| -> Result<usize, ModelError> {
            c.get(key)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| cfg_err(format!("'{key}' is missing or not a number")))
        };
        if num("encoder_ffn_dim")? != num("decoder_ffn_dim")? {
            return Err(cfg_err(
                "encoder_ffn_dim differs from decoder_ffn_dim".into(),
            ));
        }
        if let Some(a) = c.get("activation_function").and_then(|v| v.as_str()) {
            if a != "gelu" {
                return Err(cfg_err(format!(
                    "activation_function '{a}' (Whisper has gelu)"
                )));
            }
        }
        if c.get("scale_embedding").and_then(|v| v.as_bool()) == Some(true) {
            return Err(cfg_err(
                "scale_embedding is true (Whisper has false)".into(),
            ));
        }
        Ok(WhisperConfig {
            n_mels: num("num_mel_bins")?,
            n_audio_ctx: num("max_source_positions")?,
            n_audio_layers: num("encoder_layers")?,
            n_audio_heads: num("encoder_attention_heads")?,
            d_model: num("d_model")?,
            ffn_dim: num("encoder_ffn_dim")?,
            n_text_ctx: num("max_target_positions")?,
            n_text_layers: num("decoder_layers")?,
            n_text_heads: num("decoder_attention_heads")?,
            n_vocab: num("vocab_size")?,
        })
    }
}

/// How to load: the format the decoder's per-token weights (projections, MLP, embeddings)
/// are quantized into at load (None keeps the file's format; the encoder and the
/// cross-attention key/value projections, run once per window, always keep it).
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    pub quant: Option<GgmlType>,
}

pub struct Whisper<B: Backend> {
    pub cfg: WhisperConfig,
    pub encoder: Encoder<B>,
    pub decoder: Decoder<B>,
}

impl<B: Backend> Whisper<B> {
    pub fn load(b: &B, f: &WhisperFile, opts: LoadOptions) -> Result<Self, ModelError> {
        let cfg = WhisperConfig::from_file(f)?;
        let w = Weights::new(f, opts.quant);
        // Quantization applies to the decoder: it runs once per token and is bound by
        // weight bytes. The encoder runs once per window and is bound by arithmetic: it
        // keeps the file's format except for Q8_0 (see `set_batched`).
        let t0 = std::time::Instant::now();
        w.set_batched(true);
        let encoder = Encoder::load(b, &w, &cfg)?;
        let t_enc = t0.elapsed();
        w.set_batched(false);
        let decoder = Decoder::load(b, &w, &cfg)?;
        if kiln_backend::options::dev_flag("KILN_LOAD_TIMES") {
            eprintln!(
                "whisper weights: encoder {:.1} ms, decoder {:.1} ms",
                t_enc.as_secs_f64() * 1e3,
                (t0.elapsed() - t_enc).as_secs_f64() * 1e3
            );
        }
        Self::check_tied(f, &w)?;
        if let WhisperFile::Ct2(_) = f {
            for s in [
                "encoder/num_heads",
                "decoder/num_heads",
                "decoder/activation",
                "decoder/pre_norm",
                "decoder/scale_embeddings",
                "decoder/alibi",
                "decoder/start_from_zero_embedding",
                // Cross-attention heads that align text to audio (word timestamps; unused).
                "decoder/alignment_heads",
                "decoder/alignment_layer",
            ] {
                w.touch(s);
            }
        }
        w.finish("whisper")?;
        Ok(Whisper {
            cfg,
            encoder,
            decoder,
        })
    }

    /// The output projection is the token embedding: a stored copy must be that.
    fn check_tied(f: &WhisperFile, w: &Weights) -> Result<(), ModelError> {
        let untied = |name: &str| ModelError::Config {
            file: f.path().into(),
            what: format!("{name} is not tied to the token embeddings (kiln's Whisper ties them)"),
        };
        match f {
            WhisperFile::Ct2(c) => {
                if let Some(p) = c.var("decoder/projection/weight") {
                    if p.name != "decoder/embeddings/weight" {
                        return Err(untied("decoder/projection/weight"));
                    }
                }
            }
            WhisperFile::Hf(h) => {
                if let Some(p) = h.set.tensor("proj_out.weight") {
                    let e = h.set.tensor("model.decoder.embed_tokens.weight");
                    if e.is_none_or(|e| h.set.data(e) != h.set.data(p)) {
                        return Err(untied("proj_out.weight"));
                    }
                    w.touch("proj_out.weight");
                }
            }
            WhisperFile::Ggml(_) => {}
        }
        Ok(())
    }

    /// Opens a Whisper model in any format kiln reads (see [`WhisperFile::open`]) and loads it.
    pub fn open(b: &B, path: &Path, opts: LoadOptions) -> Result<(Self, WhisperFile), ModelError> {
        let f = WhisperFile::open(path)?;
        let m = Self::load(b, &f, opts)?;
        Ok((m, f))
    }

    pub fn encoder_state(&self, b: &B) -> EncoderState<B> {
        EncoderState::new(b, &self.cfg)
    }

    /// Decoder state for one sequence of up to `n_text_ctx` tokens.
    pub fn decoder_state(&self, b: &B) -> DecoderState<B> {
        DecoderState::new(b, &self.cfg)
    }

    pub fn cross_kv(&self, b: &B) -> CrossKv<B> {
        CrossKv::new(b, &self.cfg)
    }

    /// Encodes one window of `n_mels x n_frames()` log-mel values and fills `cross` with every
    /// decoder layer's cross-attention keys and values over it.
    pub fn encode(
        &self,
        b: &B,
        mel: &[f32],
        st: &mut EncoderState<B>,
        cross: &mut CrossKv<B>,
    ) -> Result<(), ModelError> {
        self.encoder.forward(b, &self.cfg, mel, st)?;
        self.decoder.cross_kv(b, &self.cfg, st.output(), cross);
        Ok(())
    }

    /// Runs `tokens` at positions `pos0..` and returns the logits after the last one.
    pub fn decode<'s>(
        &self,
        b: &B,
        st: &'s mut DecoderState<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<&'s [f32], ModelError> {
        self.decoder.forward(b, &self.cfg, st, cross, tokens, pos0)
    }

    /// Scratch for steps of up to `rows` sequences at once ([`Self::decode_beams`]).
    pub fn beam_scratch(&self, b: &B, rows: usize) -> BeamScratch<B> {
        BeamScratch::new(b, &self.cfg, rows)
    }

    /// [`Decoder::forward_beams`]: one token for each sequence of `sts`, all at `pos`, in one
    /// pass; their logits, a row each.
    pub fn decode_beams<'s>(
        &self,
        b: &B,
        sts: &mut [DecoderState<B>],
        s: &'s mut BeamScratch<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        pos: usize,
    ) -> Result<&'s [f32], ModelError> {
        self.decoder
            .forward_beams(b, &self.cfg, sts, s, cross, tokens, pos)
    }

    /// [`Decoder::cross_attention_logits`]: the alignment heads' view of `tokens` over the
    /// first `n_frames` audio positions of the window in `cross`.
    pub fn cross_attention_logits(
        &self,
        b: &B,
        st: &mut DecoderState<B>,
        cross: &CrossKv<B>,
        tokens: &[u32],
        heads: &[(usize, usize)],
        n_frames: usize,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.decoder
            .cross_attention_logits(b, &self.cfg, st, cross, tokens, heads, n_frames)
    }

    pub fn weight_bytes(&self, b: &B) -> usize {
        self.encoder.weight_bytes(b) + self.decoder.weight_bytes(b)
    }
}

/// Whisper's sinusoidal position table (positions x channels): sin of position · 10000^(-i/(c/2-1))
/// in the first half of the channels, cos in the second.
pub fn sinusoids(positions: usize, channels: usize) -> Vec<f32> {
    let half = channels / 2;
    let inc = (10000f64).ln() / (half.max(2) - 1) as f64;
    let mut out = vec![0f32; positions * channels];
    for p in 0..positions {
        for i in 0..half {
            let t = p as f64 * (-inc * i as f64).exp();
            out[p * channels + i] = t.sin() as f32;
            out[p * channels + half + i] = t.cos() as f32;
        }
    }
    out
}
