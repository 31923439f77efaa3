//! Sessions, sampling and the generation loop: what turns a model into answers; the voice
//! pipeline (speech in, speech out) over them.

pub mod calibrate;
pub mod embed;
pub mod engine;
mod generation;
pub mod grammar;
pub mod live;
mod llm;
pub mod memory;
pub mod mix;
mod perplexity;
pub mod resident;
pub mod sampler;
pub mod scheduler;
mod speculative;
pub mod speech;
mod stop;
pub mod tts;
pub mod voice;
pub mod whisper;

pub use calibrate::{CalibOptions, Choice, SensitivityTable, TensorSensitivity};
pub use embed::Pooling;
pub use generation::GenerationDefaults;
pub use grammar::{Constraint, Grammar};
pub use llm::{
    find_gguf, llm_path, FinishReason, GenerateOptions, GenerationStats, Llm, LlmSession,
    RuntimeError,
};
pub use mix::{choose_mix, mix_bpw, Mix, MixError};
pub use perplexity::{nll, Perplexity};
pub use sampler::{Sampler, SamplerConfig};
pub use scheduler::{
    Completion, Embeddings, Event, EventSink, ModelInfo, Prompt, Request, Scheduler,
    SchedulerConfig, SchedulerStats, SubmitError, TokenLogprob,
};
pub use speculative::{DraftModel, Drafter, PromptLookup};
pub use stop::StopMatcher;

/// A scoped thread's result; its panic, if it panicked, goes on in the caller.
pub fn join_scoped<T>(t: std::thread::ScopedJoinHandle<'_, T>) -> T {
    t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}
