//! Speech to text with Whisper: audio -> log-mel -> 30 s windows -> tokens -> segments.

mod decode;
pub mod output;
mod tokens;
mod transcribe;
mod words;

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_backend::Backend;
use kiln_models::whisper::{LoadOptions, Whisper, WhisperFile};
use kiln_models::ModelError;
use kiln_text::{TextError, Tokenizer};
use thiserror::Error;

pub use decode::{compression_ratio, DecodeOptions, WindowDecoder, WindowResult};
pub use tokens::{ggml_tokenizer, suppressed_tokens, SpecialTokens, LANGUAGES, TIME_PRECISION};
pub use transcribe::{Segment, TranscribeOptions, TranscribeStats, Transcript, Vad};
pub use words::Word;

#[derive(Debug, Error)]
pub enum WhisperError {
    #[error(transparent)]
    Format(#[from] kiln_formats::FormatError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Audio(#[from] kiln_audio::AudioError),
    #[error("{}: {what}", path.display())]
    Path { path: PathBuf, what: String },
    #[error("vocabulary: {0}")]
    Vocabulary(String),
    #[error("{0}")]
    Input(String),
    /// The backend could not be made (no GPU, say).
    #[error("{0}")]
    Device(String),
}

/// A loaded Whisper model with its tokenizer.
pub struct Stt<B: Backend> {
    pub backend: B,
    pub model: Whisper<B>,
    pub tokenizer: Tokenizer,
    pub special: SpecialTokens,
    /// Never sampled: non-speech symbols and control tokens.
    pub suppress: Vec<u32>,
    pub dir: PathBuf,
    pub load_ms: f64,
    /// Voice activity detection run before Whisper ([`TranscribeOptions::vad`]); none
    /// unless the caller loads one.
    pub vad: Option<kiln_models::vad::SileroVad>,
    /// The decoder's (layer, head) pairs whose cross-attention follows the audio, for word
    /// timestamps: the model's own list (`alignment_heads` in its configuration), else
    /// every head of the second half of the layers, as openai-whisper does without one.
    pub alignment_heads: Vec<(usize, usize)>,
}

/// `alignment_heads` from a CTranslate2 `config.json` or a Hugging Face
/// `generation_config.json` in `dir`: a list of [layer, head] pairs.
fn alignment_heads(dir: &Path, layers: usize, heads: usize) -> Vec<(usize, usize)> {
    for f in ["config.json", "generation_config.json"] {
        let Ok(text) = std::fs::read_to_string(dir.join(f)) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(list) = v.get("alignment_heads").and_then(|a| a.as_array()) else {
            continue;
        };
        let pairs: Vec<(usize, usize)> = list
            .iter()
            .filter_map(|p| {
                let p = p.as_array()?;
                Some((p.first()?.as_u64()? as usize, p.get(1)?.as_u64()? as usize))
            })
            .filter(|&(l, h)| l < layers && h < heads)
            .collect();
        if !pairs.is_empty() {
            return pairs;
        }
    }
    (layers / 2..layers)
        .flat_map(|l| (0..heads).map(move |h| (l, h)))
        .collect()
}

impl<B: Backend> Stt<B> {
    /// Loads a Whisper model in any format kiln reads: a CTranslate2 directory (or its
    /// `model.bin`), a Hugging Face directory, or a whisper.cpp ggml `.bin`. The tokenizer
    /// is the `tokenizer.json` beside the weights; a ggml file without one uses its own
    /// vocabulary.
    pub fn load(backend: B, path: &Path, opts: LoadOptions) -> Result<Self, WhisperError> {
        Self::load_with(|| Ok(backend), path, opts)
    }

    /// As [`Stt::load`], the backend made by `make` while the vocabulary is read beside it
    /// (a CUDA context takes about 0.3 s to open, a ggml file's vocabulary 0.05-0.2 s to
    /// rebuild). An error of `make` is said before one of the file's.
    pub fn load_with(
        make: impl FnOnce() -> Result<B, WhisperError>,
        path: &Path,
        opts: LoadOptions,
    ) -> Result<Self, WhisperError> {
        let t0 = Instant::now();
        let f = match WhisperFile::open(path) {
            Ok(f) => f,
            Err(e) => {
                make()?;
                return Err(e.into());
            }
        };
        let dir = match &f {
            WhisperFile::Hf(h) => h.dir.clone(),
            _ => f.path().parent().unwrap_or(Path::new(".")).to_path_buf(),
        };
        let tok_path = dir.join("tokenizer.json");
        // The vocabulary (tokenizer.json, else a ggml file's own) is read on a thread of its
        // own while the backend is made and the weights load.
        let t_open = t0.elapsed();
        let (made, tokenizer, t_tok, t_model) = std::thread::scope(|s| {
            let tokenizer = s.spawn(|| {
                let tok = match &f {
                    WhisperFile::Ggml(g) if !tok_path.is_file() => {
                        ggml_tokenizer(g, g.hparams.n_vocab as usize)
                    }
                    _ => Tokenizer::from_file(&tok_path).map_err(WhisperError::from),
                };
                (tok, t0.elapsed())
            });
            let made = make().map(|b| {
                let model = Whisper::load(&b, &f, opts);
                (b, model)
            });
            let t_model = t0.elapsed();
            let (tok, t_tok) = crate::join_scoped(tokenizer);
            (made, tok, t_tok, t_model)
        });
        let (backend, model) = made?;
        if kiln_backend::options::dev_flag("KILN_LOAD_TIMES") {
            eprintln!(
                "whisper load: file open {:.1} ms, backend and weights done at {:.1} ms, vocabulary done at {:.1} ms",
                t_open.as_secs_f64() * 1e3,
                t_model.as_secs_f64() * 1e3,
                t_tok.as_secs_f64() * 1e3
            );
        }
        let (model, tokenizer) = (model?, tokenizer?);
        let special = SpecialTokens::from_tokenizer(&tokenizer, model.cfg.n_vocab)?;
        if let WhisperFile::Hf(h) = &f {
            special.check_hf(h)?;
        }
        let mut suppress = suppressed_tokens(&tokenizer, &special);
        if let WhisperFile::Hf(h) = &f {
            // The checkpoint's own list (OpenAI's non-speech symbols, as transformers
            // computed them) joins kiln's.
            let listed = h.generation.as_ref().and_then(|g| g.get("suppress_tokens"));
            if let Some(list) = listed.and_then(|l| l.as_array()) {
                let n = model.cfg.n_vocab as u64;
                suppress.extend(
                    list.iter()
                        .filter_map(|v| v.as_u64())
                        .filter(|&t| t < n)
                        .map(|t| t as u32),
                );
                suppress.sort_unstable();
                suppress.dedup();
            }
        }
        let alignment_heads =
            alignment_heads(&dir, model.cfg.n_text_layers, model.cfg.n_text_heads);
        Ok(Stt {
            alignment_heads,
            backend,
            model,
            tokenizer,
            special,
            suppress,
            dir,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
            vad: None,
        })
    }

    /// Text of the text tokens among `tokens` (timestamps and control tokens dropped).
    pub fn text(&self, tokens: &[u32]) -> Result<String, WhisperError> {
        let text: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t < self.special.eot)
            .collect();
        Ok(self.tokenizer.decode(&text, true)?)
    }

    /// Tokens of `text` (no special tokens).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, WhisperError> {
        Ok(self.tokenizer.encode(text, false)?)
    }
}
