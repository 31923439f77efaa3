//! Kokoro-82M (StyleTTS2 with an iSTFTNet decoder), text to 24 kHz speech:
//!
//! ```text
//! phoneme ids --PL-BERT--> d_en --duration encoder(style)--> d --LSTM, proj--> durations
//! d, durations --align--> en --shared LSTM, AdaIN blocks--> F0, N
//! phoneme ids --text encoder--> t_en --align--> asr
//! asr, F0, N, style --decoder (iSTFTNet)--> audio
//! ```
//!
//! A voice is a table of 256-wide style vectors, one per phoneme count: the first half
//! conditions the decoder, the second half the prosody predictor.

mod albert;
mod blocks;
mod decoder;
pub mod params;
mod prosody;
mod text_encoder;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_formats::OnnxFile;

use albert::Albert;
use blocks::Ctx;
use decoder::Decoder;
pub use params::Params;
use prosody::Prosody;
use text_encoder::TextEncoder;

use crate::ModelError;

pub const SAMPLE_RATE: u32 = 24_000;

/// Hyper-parameters (Kokoro's `config.json`).
#[derive(Debug, Clone)]
pub struct Config {
    pub n_token: usize,
    pub hidden_dim: usize,
    pub style_dim: usize,
    pub n_layer: usize,
    pub max_dur: usize,
    pub text_encoder_kernel_size: usize,
    pub bert_hidden: usize,
    pub bert_heads: usize,
    pub bert_intermediate: usize,
    pub bert_layers: usize,
    pub bert_max_positions: usize,
    pub upsample_rates: Vec<usize>,
    pub upsample_kernel_sizes: Vec<usize>,
    pub upsample_initial_channel: usize,
    pub resblock_kernel_sizes: Vec<usize>,
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    pub gen_istft_n_fft: usize,
    pub gen_istft_hop_size: usize,
    /// Phoneme -> id.
    pub vocab: HashMap<char, u32>,
}

impl Config {
    pub fn from_json(path: &Path) -> Result<Config, ModelError> {
        let err = |what: String| ModelError::Config {
            file: path.to_path_buf(),
            what,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
        let num = |v: &serde_json::Value, key: &str| -> Result<usize, ModelError> {
            v.get(key)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| err(format!("missing or non-integer '{key}'")))
        };
        let list = |v: &serde_json::Value, key: &str| -> Result<Vec<usize>, ModelError> {
            v.get(key)
                .and_then(|x| x.as_array())
                .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect())
                .ok_or_else(|| err(format!("missing or malformed list '{key}'")))
        };
        let ist = v
            .get("istftnet")
            .ok_or_else(|| err("missing 'istftnet'".into()))?;
        let bert = v
            .get("plbert")
            .ok_or_else(|| err("missing 'plbert'".into()))?;
        let dil = ist
            .get("resblock_dilation_sizes")
            .and_then(|x| x.as_array())
            .and_then(|a| {
                a.iter()
                    .map(|d| {
                        d.as_array().and_then(|l| {
                            l.iter().map(|x| x.as_u64().map(|x| x as usize)).collect()
                        })
                    })
                    .collect::<Option<Vec<Vec<usize>>>>()
            })
            .ok_or_else(|| err("missing or malformed 'resblock_dilation_sizes'".into()))?;
        let mut vocab = HashMap::new();
        if let Some(m) = v.get("vocab").and_then(|x| x.as_object()) {
            for (k, id) in m {
                let mut chars = k.chars();
                if let (Some(c), None, Some(id)) = (chars.next(), chars.next(), id.as_u64()) {
                    vocab.insert(c, id as u32);
                }
            }
        }
        Ok(Config {
            n_token: num(&v, "n_token")?,
            hidden_dim: num(&v, "hidden_dim")?,
            style_dim: num(&v, "style_dim")?,
            n_layer: num(&v, "n_layer")?,
            max_dur: num(&v, "max_dur")?,
            text_encoder_kernel_size: num(&v, "text_encoder_kernel_size")?,
            bert_hidden: num(bert, "hidden_size")?,
            bert_heads: num(bert, "num_attention_heads")?,
            bert_intermediate: num(bert, "intermediate_size")?,
            bert_layers: num(bert, "num_hidden_layers")?,
            bert_max_positions: num(bert, "max_position_embeddings")?,
            upsample_rates: list(ist, "upsample_rates")?,
            upsample_kernel_sizes: list(ist, "upsample_kernel_sizes")?,
            upsample_initial_channel: num(ist, "upsample_initial_channel")?,
            resblock_kernel_sizes: list(ist, "resblock_kernel_sizes")?,
            resblock_dilation_sizes: dil,
            gen_istft_n_fft: num(ist, "gen_istft_n_fft")?,
            gen_istft_hop_size: num(ist, "gen_istft_hop_size")?,
            vocab,
        })
    }
}

/// A voice: one style vector (decoder half, predictor half) per phoneme count.
#[derive(Debug, Clone)]
pub struct Voice {
    pub name: String,
    rows: Vec<Vec<f32>>,
}

impl Voice {
    /// From an array of shape (rows, 1, width) or (rows, width).
    pub fn from_array(
        name: &str,
        a: &kiln_formats::NpyArray,
        file: &Path,
        width: usize,
    ) -> Result<Voice, ModelError> {
        let rows = a.shape.first().copied().unwrap_or(0);
        if rows == 0 || rows.checked_mul(width) != Some(a.data.len()) {
            return Err(ModelError::Config {
                file: file.to_path_buf(),
                what: format!(
                    "voice '{name}' has shape {:?}, expected (rows, 1, {width})",
                    a.shape
                ),
            });
        }
        Ok(Voice {
            name: name.into(),
            rows: a.data.chunks_exact(width).map(|r| r.to_vec()).collect(),
        })
    }

    /// The style for an utterance of `n_phonemes` phonemes (row n - 1, clamped to the table).
    pub fn style(&self, n_phonemes: usize) -> &[f32] {
        &self.rows[n_phonemes.clamp(1, self.rows.len()) - 1]
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }
}

/// Every voice of a `.npz` pack; the voice of an `.npy` file or of a PyTorch `.pt` holding one
/// tensor (named after the file), or every tensor of a `.pt` holding a dict of them; or, for a
/// directory (hexgrad's `voices/`), the voices of every `.pt` / `.npy` file in it, by name.
pub fn load_voices(path: &Path, width: usize) -> Result<Vec<Voice>, ModelError> {
    let cannot = |e: std::io::Error| ModelError::Config {
        file: path.into(),
        what: format!("cannot read: {e}"),
    };
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(cannot)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "pt" || e == "npy" || e == "bin")
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Config {
                file: path.into(),
                what: "no .pt, .npy or .bin voices in this directory".into(),
            });
        }
        let mut out = Vec::new();
        for f in files {
            out.extend(load_voices(&f, width)?);
        }
        return Ok(out);
    }
    let bytes = std::fs::read(path).map_err(cannot)?;
    voices_from_bytes(path, &bytes, width)
}

/// [`load_voices`] on a file's bytes held in memory (`path` names it and its extension says
/// whether it is one `.npy` voice, one raw `.bin` voice (kokoro-js's), a PyTorch `.pt` /
/// `.pth` or an `.npz` pack).
pub fn voices_from_bytes(
    path: &Path,
    bytes: &[u8],
    width: usize,
) -> Result<Vec<Voice>, ModelError> {
    let stem = || {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => {
            let a = kiln_formats::parse_npy(path, "array", bytes)?;
            Ok(vec![Voice::from_array(&stem(), &a, path, width)?])
        }
        Some("bin") => {
            // kokoro-js's voices: little-endian f32 rows of `width`, no header.
            if bytes.is_empty() || bytes.len() % (4 * width) != 0 {
                return Err(ModelError::Config {
                    file: path.into(),
                    what: format!(
                        "{} bytes are not whole rows of {width} f32 values",
                        bytes.len()
                    ),
                });
            }
            let data: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let a = kiln_formats::NpyArray {
                shape: vec![data.len() / width, 1, width],
                data,
            };
            Ok(vec![Voice::from_array(&stem(), &a, path, width)?])
        }
        Some("pt" | "pth") => {
            let tensors = kiln_formats::parse_torch(path, bytes)?;
            if tensors.is_empty() {
                return Err(ModelError::Config {
                    file: path.into(),
                    what: "the checkpoint holds no tensors".into(),
                });
            }
            tensors
                .into_iter()
                .map(|(name, t)| {
                    let name = if name.is_empty() { stem() } else { name };
                    let a = kiln_formats::NpyArray {
                        shape: t.shape,
                        data: t.data,
                    };
                    Voice::from_array(&name, &a, path, width)
                })
                .collect()
        }
        _ => kiln_formats::parse_npz(path, bytes)?
            .iter()
            .map(|(n, a)| Voice::from_array(n, a, path, width))
            .collect(),
    }
}

/// Whether the file at `path` starts like a zip archive (a PyTorch checkpoint).
fn is_zip(path: &Path) -> Result<bool, ModelError> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| ModelError::Config {
            file: path.into(),
            what: format!("cannot read: {e}"),
        })?;
    Ok(n == 4 && head == *b"PK\x03\x04")
}

/// Named intermediate activations of one synthesis (for comparing against a reference).
pub type Trace = Vec<(String, Vec<f32>)>;

pub struct Kokoro<B: Backend> {
    pub config: Config,
    bert: Albert<B>,
    prosody: Prosody<B>,
    text_encoder: TextEncoder<B>,
    decoder: Decoder<B>,
    /// Reproduce the int8 export's dynamic activation quantization.
    quant: bool,
    pub file: PathBuf,
}

impl<B: Backend> Kokoro<B> {
    /// Loads `model` with the hyper-parameters of `config`. The file's first bytes pick the
    /// format: a PyTorch checkpoint in hexgrad's layout (`kokoro-v1_0.pth`, a zip archive) or
    /// a kokoro-onnx export (int8 or fp32).
    pub fn load(b: &B, model: &Path, config: &Path) -> Result<Self, ModelError> {
        Self::load_as(b, model, config, false)
    }

    /// As [`Kokoro::load`], an int8 export's weights run in f32 as its float graph would (no
    /// activation rounding, no integer products): for comparing the graphs.
    pub fn load_float(b: &B, model: &Path, config: &Path) -> Result<Self, ModelError> {
        Self::load_as(b, model, config, true)
    }

    fn load_as(b: &B, model: &Path, config: &Path, float: bool) -> Result<Self, ModelError> {
        let cfg = Config::from_json(config)?;
        let mut p = if is_zip(model)? {
            Params::from_torch(model, kiln_formats::read_torch(model)?)?
        } else {
            Params::from_onnx(&OnnxFile::open(model)?)?
        };
        if float {
            p.drop_integer_forms();
        }
        Self::from_params(b, &p, cfg, model)
    }

    /// Whether this model rounds activations as the int8 export does (runs on integers).
    pub fn quantized(&self) -> bool {
        self.quant
    }

    pub fn from_params(b: &B, p: &Params, cfg: Config, model: &Path) -> Result<Self, ModelError> {
        let m = Kokoro {
            bert: Albert::load(b, p, &cfg)?,
            prosody: Prosody::load(b, p, &cfg)?,
            text_encoder: TextEncoder::load(b, p, &cfg)?,
            decoder: Decoder::load(b, p, &cfg)?,
            config: cfg,
            // Only a quantized export rounds activations; a float model runs the f32 kernels.
            quant: p.is_quantized(),
            file: model.to_path_buf(),
        };
        // Everything the export holds is either read or an artifact of the export itself.
        let left: Vec<String> = p
            .unused()
            .into_iter()
            .filter(|n| {
                !n.starts_with("decoder.generator.stft.istft.")
                    && !n.starts_with("decoder.generator.istft.")
            })
            .collect();
        if !left.is_empty() {
            return Err(ModelError::UnusedTensors {
                file: model.to_path_buf(),
                arch: "kokoro".into(),
                n: left.len(),
                names: left.join(", "),
            });
        }
        Ok(m)
    }

    /// The decoder alone: asr (hidden_dim, frames), F0 and N curves (2 frames each) and the
    /// 256-wide style (its first half conditions the decoder) -> waveform.
    pub fn decode(
        &self,
        b: &B,
        asr: &[f32],
        f0: &[f32],
        n: &[f32],
        style: &[f32],
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let (d, sd) = (self.config.hidden_dim, self.config.style_dim);
        let frames = f0.len() / 2;
        if frames == 0 || asr.len() != d * frames || n.len() != 2 * frames || style.len() != 2 * sd
        {
            return Err(ModelError::Config {
                file: self.file.clone(),
                what: format!(
                    "decoder inputs: asr {} values, F0 {}, N {}, style {} (expected {d} x frames, 2 x frames, 2 x frames, {})",
                    asr.len(),
                    f0.len(),
                    n.len(),
                    style.len(),
                    2 * sd
                ),
            });
        }
        let cell = std::cell::RefCell::new(Trace::new());
        let cx = Ctx::new(b, self.quant, trace.is_some().then_some(&cell));
        let asr_t = b.tensor_from(d, frames, asr);
        let f0_t = b.tensor_from(1, 2 * frames, f0);
        let n_t = b.tensor_from(1, 2 * frames, n);
        let s = b.tensor_from(1, sd, &style[..sd]);
        let (audio, len) = self.decoder.forward(&cx, &asr_t, &f0_t, &n_t, &s, frames);
        let mut out = vec![0f32; len];
        b.read(&audio, 1, &mut out);
        if let Some(t) = trace {
            t.extend(cell.into_inner());
        }
        Ok(out)
    }

    /// Phoneme string -> ids, padded with 0 at both ends; unknown phonemes are an error.
    /// Whether `c` is one of the model's phoneme tokens.
    pub fn knows(&self, c: char) -> bool {
        self.config.vocab.contains_key(&c)
    }

    pub fn ids(&self, phonemes: &str) -> Result<Vec<u32>, ModelError> {
        let mut ids = vec![0];
        for c in phonemes.chars() {
            let id = self
                .config
                .vocab
                .get(&c)
                .ok_or_else(|| ModelError::Config {
                    file: self.file.clone(),
                    what: format!(
                        "phoneme '{c}' (U+{:04X}) is not in Kokoro's vocabulary",
                        c as u32
                    ),
                })?;
            ids.push(*id);
        }
        ids.push(0);
        Ok(ids)
    }

    /// Durations (frames per token) of `ids` at `speed`.
    fn durations(&self, logits: &[f32], n: usize, speed: f32) -> Vec<usize> {
        let md = self.prosody.max_dur();
        (0..n)
            .map(|t| {
                let s: f32 = logits[t * md..(t + 1) * md]
                    .iter()
                    .map(|&v| 1.0 / (1.0 + (-v).exp()))
                    .sum();
                (s / speed).round_ties_even().max(1.0) as usize
            })
            .collect()
    }

    /// Waveform (24 kHz) of padded ids with a 256-wide style vector at `speed`.
    pub fn synthesize(
        &self,
        b: &B,
        ids: &[u32],
        style: &[f32],
        speed: f32,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        self.run(b, ids, style, speed, None, trace)
    }

    /// Like `synthesize`, with the frames per token given instead of predicted (an alignment
    /// from elsewhere, or a reference's durations when comparing the rest of the model).
    pub fn synthesize_aligned(
        &self,
        b: &B,
        ids: &[u32],
        style: &[f32],
        durations: &[usize],
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        if durations.len() != ids.len() || durations.iter().sum::<usize>() == 0 {
            return Err(ModelError::Config {
                file: self.file.clone(),
                what: format!("{} durations for {} tokens", durations.len(), ids.len()),
            });
        }
        self.run(b, ids, style, 1.0, Some(durations), trace)
    }

    fn run(
        &self,
        b: &B,
        ids: &[u32],
        style: &[f32],
        speed: f32,
        forced: Option<&[usize]>,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let (n, sd, d) = (ids.len(), cfg.style_dim, cfg.hidden_dim);
        if style.len() != 2 * sd {
            return Err(ModelError::Config {
                file: self.file.clone(),
                what: format!(
                    "style vector has {} values, expected {}",
                    style.len(),
                    2 * sd
                ),
            });
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= cfg.n_token) {
            return Err(ModelError::Config {
                file: self.file.clone(),
                what: format!("token id {bad} is outside the vocabulary ({})", cfg.n_token),
            });
        }
        if !(speed > 0.0 && speed.is_finite()) {
            return Err(ModelError::Config {
                file: self.file.clone(),
                what: format!("speed {speed} must be a positive number"),
            });
        }
        let cell = std::cell::RefCell::new(Trace::new());
        let cx = Ctx::new(b, self.quant, trace.is_some().then_some(&cell));
        let put = |name: &str, t: &B::Tensor, rows: usize, cols: usize| cx.put(name, t, rows, cols);
        let s_dec = b.tensor_from(1, sd, &style[..sd]);
        let s_pred = b.tensor_from(1, sd, &style[sd..]);
        let rows: Vec<f32> = style[sd..]
            .iter()
            .flat_map(|&v| std::iter::repeat_n(v, n))
            .collect();
        let s_rows = b.tensor_from(sd, n, &rows);

        let d_en = self.bert.forward(&cx, ids)?;
        put("d_en", &d_en, n, d);
        cx.lap("bert");
        let enc = self.prosody.encode(&cx, &d_en, &s_pred, &s_rows, n);
        put("d", &enc, n, d + sd);
        cx.lap("duration encoder");
        let logits = self.prosody.duration_logits(&cx, &enc, n);
        let md = self.prosody.max_dur();
        put("dur_logits", &logits, n, md);
        let mut lv = vec![0f32; n * md];
        b.read(&logits, n, &mut lv);
        let dur = match forced {
            Some(d) => d.to_vec(),
            None => self.durations(&lv, n, speed),
        };
        let frames: usize = dur.iter().sum();
        let durs: Vec<f32> = dur.iter().map(|&v| v as f32).collect();
        let dt = b.tensor_from(1, n, &durs);
        put("durations", &dt, 1, n);
        // Alignment: frame f takes the features of the token it belongs to.
        let mut en = b.tensor(frames, d + sd);
        cx.lap("durations");
        let t_en = self.text_encoder.forward(&cx, ids)?;
        put("t_en", &t_en, d, n);
        cx.lap("text encoder");
        let mut t_en_t = b.tensor(n, d);
        b.transpose(&t_en, d, n, &mut t_en_t);
        let mut asr_t = b.tensor(frames, d);
        let token_of: Vec<usize> = dur
            .iter()
            .enumerate()
            .flat_map(|(tok, &k)| std::iter::repeat_n(tok, k))
            .collect();
        b.gather_rows(&enc, &token_of, &mut en);
        b.gather_rows(&t_en_t, &token_of, &mut asr_t);
        cx.lap("align");
        let (f0, nn) = self.prosody.f0_n(&cx, &en, &s_pred, frames);
        put("f0", &f0, 1, 2 * frames);
        put("n", &nn, 1, 2 * frames);
        cx.lap("F0, N");
        let mut asr = b.tensor(d, frames);
        b.transpose(&asr_t, frames, d, &mut asr);
        let (audio, len) = self.decoder.forward(&cx, &asr, &f0, &nn, &s_dec, frames);
        let mut out = vec![0f32; len];
        b.read(&audio, 1, &mut out);
        if let Some(t) = trace {
            t.extend(cell.into_inner());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod voice_tests {
    use super::*;

    /// A voice of 2^56 rows and no data: `rows * width` overflowed (a panic with overflow
    /// checks, found by the `voice_npy` fuzz target after 2,292,608 executions; in release
    /// builds 2^56 * 256 wrapped to 0 and the empty voice was accepted).
    #[test]
    fn a_voice_whose_rows_overflow_is_an_error() {
        let a = kiln_formats::NpyArray {
            shape: vec![1 << 56, 1, 0],
            data: Vec::new(),
        };
        let e = Voice::from_array("v", &a, Path::new("v.npy"), 256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("v.npy") && e.contains("expected (rows, 1, 256)"),
            "{e}"
        );
    }
}
