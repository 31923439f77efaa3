//! Decoder-only language models.

mod config;
pub mod llama;

pub use config::LlmConfig;
pub use llama::{Llama, LlamaBatch, LlamaState, SeqChunk};
