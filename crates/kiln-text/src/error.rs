use std::path::PathBuf;

pub type Result<T, E = TextError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad tokenizer file {path}: {msg}")]
    TokenizerFile { path: PathBuf, msg: String },
    #[error("bad tokenizer config {path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("GGUF vocabulary: missing key {key}")]
    MissingKey { key: &'static str },
    #[error("GGUF vocabulary: key {key} is {found}, expected {expected}")]
    BadKey {
        key: &'static str,
        found: String,
        expected: &'static str,
    },
    #[error(
        "GGUF vocabulary: unsupported tokenizer.ggml.model {model:?} (supported: gpt2, llama)"
    )]
    UnsupportedModel { model: String },
    #[error("GGUF vocabulary: unsupported tokenizer.ggml.pre {pre:?} (supported: {supported})")]
    UnsupportedPre { pre: String, supported: String },
    #[error("GGUF vocabulary: {msg}")]
    Vocab { msg: String },
    #[error("token id {id} out of range (vocabulary has {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

impl TextError {
    pub(crate) fn tok(e: impl std::fmt::Display) -> Self {
        TextError::Tokenizer(e.to_string())
    }
}
