//! Model architectures, written against `kiln_backend::Backend` and nothing below it.

pub mod kokoro;
pub mod llm;
pub mod vad;
mod weights;
pub mod whisper;

use std::path::PathBuf;
use thiserror::Error;

pub use weights::{Source, WeightMap};

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] kiln_formats::FormatError),
    #[error("{}: {source}", file.display())]
    Backend {
        file: PathBuf,
        source: kiln_backend::BackendError,
    },
    #[error("{}: missing tensor '{name}'", file.display())]
    MissingTensor { file: PathBuf, name: String },
    #[error("{}: tensor '{name}' has shape {got:?} ({ty}), expected {expected:?}", file.display())]
    Shape {
        file: PathBuf,
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
        ty: &'static str,
    },
    #[error("{}: {n} tensor(s) the {arch} architecture does not use: {names}", file.display())]
    UnusedTensors {
        file: PathBuf,
        arch: String,
        n: usize,
        names: String,
    },
    #[error("{}: unsupported architecture '{arch}' (supported: {supported})", file.display())]
    UnsupportedArch {
        file: PathBuf,
        arch: String,
        supported: &'static str,
    },
    #[error("{}: {what}", file.display())]
    Config { file: PathBuf, what: String },
    #[error("{0}")]
    Input(String),
}
