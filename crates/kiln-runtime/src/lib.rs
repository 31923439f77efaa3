//! Sessions, sampling and the generation loop: what turns a model into answers.

mod llm;
pub mod sampler;
mod speculative;
mod stop;
pub mod tts;

pub use llm::{
    find_gguf, FinishReason, GenerateOptions, GenerationStats, Llm, LlmSession, RuntimeError,
};
pub use sampler::{Sampler, SamplerConfig};
pub use speculative::{DraftModel, Drafter, PromptLookup};
pub use stop::StopMatcher;
