use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FormatError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a {format} file ({why})", path.display())]
    NotFormat {
        path: PathBuf,
        format: &'static str,
        why: String,
    },
    #[error("{}: truncated: {what} needs bytes up to {needed} but the file has {len}", path.display())]
    Truncated {
        path: PathBuf,
        what: String,
        needed: u64,
        len: u64,
    },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("{}: tensor '{name}': {what}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        what: String,
    },
    #[error("{}: missing metadata key '{key}'", path.display())]
    MissingKey { path: PathBuf, key: String },
    #[error("{}: metadata key '{key}': expected {expected}", path.display())]
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
    },
}
