//! Tokenizers and chat templates.
//!
//! One [`Tokenizer`] type serves both sources: Hugging Face `tokenizer.json` (+ the
//! `tokenizer_config.json` beside it) and GGUF-embedded vocabularies, which are rebuilt into
//! the same `tokenizers` pipeline so encode/decode share one code path. [`StreamDecoder`]
//! turns generated ids into text without splitting UTF-8 characters; [`ChatTemplate`] renders
//! Hugging Face Jinja chat templates.

mod byte_vocab;
mod error;
mod gguf_vocab;
mod guard;
mod pyjson;
pub mod speech;
mod stream;
mod template;
mod tokenizer;

pub use error::{Result, TextError};
pub use guard::{installed as memory_guard_installed, GuardedAlloc};
pub use stream::StreamDecoder;
pub use template::{
    builtin_template, value_from_json, ChatTemplate, Limits, Message, TemplateValue,
};
pub use tokenizer::Tokenizer;
