//! Decoder-only language models.

mod config;
pub mod hf;
pub mod llama;
pub mod names;

pub use config::{gemma3_windows, LlmConfig};
pub use hf::{is_hf_dir, parse_config, HfCheckpoint, MlxQuant};
pub use llama::{Llama, LlamaCache, LlamaScratch, LlamaState, Logits, SeqChunk};
pub use names::{LayerParam, Naming, Param};
