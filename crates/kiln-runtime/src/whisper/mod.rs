//! Speech to text with Whisper: audio -> log-mel -> 30 s windows -> tokens -> segments.

mod decode;
pub mod output;
mod tokens;
mod transcribe;

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_backend::Backend;
use kiln_formats::Ct2File;
use kiln_models::whisper::{LoadOptions, Whisper};
use kiln_models::ModelError;
use kiln_text::{TextError, Tokenizer};
use thiserror::Error;

pub use decode::{compression_ratio, DecodeOptions, WindowDecoder, WindowResult};
pub use tokens::{suppressed_tokens, SpecialTokens, TIME_PRECISION};
pub use transcribe::{Segment, TranscribeOptions, TranscribeStats, Transcript};

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
}

impl<B: Backend> Stt<B> {
    /// Loads `model.bin` and `tokenizer.json` from a model directory (or beside a model.bin).
    pub fn load(backend: B, path: &Path, opts: LoadOptions) -> Result<Self, WhisperError> {
        let t0 = Instant::now();
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        };
        let bin = dir.join("model.bin");
        if !bin.is_file() {
            return Err(WhisperError::Path {
                path: dir,
                what: "no model.bin here (a CTranslate2 Whisper model directory is expected)"
                    .into(),
            });
        }
        let f = Ct2File::open(&bin)?;
        let model = Whisper::load(&backend, &f, opts)?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tok_path)?;
        let special = SpecialTokens::from_tokenizer(&tokenizer, model.cfg.n_vocab)?;
        let suppress = suppressed_tokens(&tokenizer, &special);
        Ok(Stt {
            backend,
            model,
            tokenizer,
            special,
            suppress,
            dir,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
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
