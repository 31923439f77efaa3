//! [`LlmEngine`]: an LLM on a thread of its own, whatever its backend, with one session whose
//! KV cache lasts from turn to turn and, if asked, speculative decoding. What `kiln run`,
//! `kiln chat` and `kiln perplexity` hold; the server and `kiln voice` hold a
//! [`crate::Scheduler`] (the same idea for many sequences).

use std::path::PathBuf;

use kiln_backend::Backend;
use kiln_text::Message;

use crate::generation::GenerationDefaults;
use crate::llm::{GenerateOptions, GenerationStats, Llm, LlmSession, RuntimeError};
use crate::perplexity::Perplexity;
use crate::resident::Resident;
use crate::speculative::{DraftModel, Drafter, PromptLookup};

/// What an engine is given, made on its thread: the model, a draft model, the context and
/// how to speculate.
pub struct EngineSetup<B: Backend> {
    pub llm: Llm<B>,
    /// A smaller model that guesses ahead (the same tokenizer).
    pub draft: Option<Llm<B>>,
    /// Positions of the session (0: the model's own, 4096 at most).
    pub n_ctx: usize,
    /// Guess from n-grams of the prompt instead of a draft model.
    pub lookup: Option<usize>,
    /// Tokens guessed ahead at most.
    pub draft_max: usize,
}

/// What the engine learnt when it loaded the model.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub path: PathBuf,
    /// The backend's name.
    pub backend: String,
    pub generation: GenerationDefaults,
    pub weight_bytes: usize,
    /// The KV cache: its type's name, positions and bytes (held at load, and when full: a
    /// backend whose caches grow with their sequence, CUDA's and wgpu's, holds less at first).
    pub kv_type: &'static str,
    pub n_ctx: usize,
    pub kv_bytes: usize,
    pub kv_bytes_full: usize,
}

/// An LLM and its session on any backend.
trait Ops {
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RuntimeError>;
    fn render_chat(&self, msgs: &[Message]) -> Result<String, RuntimeError>;
    fn bos_id(&self) -> Option<u32>;
    fn generate(
        &mut self,
        ids: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats, RuntimeError>;
    fn reset(&mut self);
    fn embed(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError>;
    fn perplexity(
        &self,
        tokens: &[u32],
        n_ctx: usize,
        add_bos: bool,
        max_chunks: usize,
        on_chunk: &mut dyn FnMut(usize, f64),
    ) -> Result<Perplexity, RuntimeError>;
}

struct Session<'a, B: Backend> {
    llm: &'a Llm<B>,
    session: LlmSession<'a, B>,
    drafter: Option<Box<dyn Drafter + 'a>>,
}

impl<B: Backend> Ops for Session<'_, B> {
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RuntimeError> {
        self.llm.tokenize(text, add_special)
    }
    fn render_chat(&self, msgs: &[Message]) -> Result<String, RuntimeError> {
        self.llm.render_chat(msgs)
    }
    fn bos_id(&self) -> Option<u32> {
        self.llm.tokenizer.bos_id()
    }
    fn generate(
        &mut self,
        ids: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats, RuntimeError> {
        // (A grammar's mask follows one token at a time: constrained runs are not speculated.)
        match self.drafter.as_mut().filter(|_| opts.grammar.is_none()) {
            Some(d) => self
                .session
                .generate_speculative(ids, opts, d.as_mut(), on_text),
            None => self.session.generate(ids, opts, on_text),
        }
    }
    fn reset(&mut self) {
        self.session.reset();
    }
    fn embed(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        self.session.embed(ids)
    }
    fn perplexity(
        &self,
        tokens: &[u32],
        n_ctx: usize,
        add_bos: bool,
        max_chunks: usize,
        on_chunk: &mut dyn FnMut(usize, f64),
    ) -> Result<Perplexity, RuntimeError> {
        self.llm
            .perplexity(tokens, n_ctx, add_bos, max_chunks, on_chunk)
    }
}

/// An LLM on a thread of its own (see the module doc).
pub struct LlmEngine {
    ops: Resident<dyn Ops>,
    info: EngineInfo,
}

impl LlmEngine {
    /// Makes the model with `load` on the engine's thread (a GPU backend made inside `load`
    /// stays there), checks that its KV cache fits in memory, and opens the session.
    pub fn spawn<B, E>(
        load: impl FnOnce() -> Result<EngineSetup<B>, E> + Send + 'static,
    ) -> Result<Self, E>
    where
        B: Backend + 'static,
        E: From<RuntimeError> + Send + 'static,
    {
        let (info_tx, info_rx) = std::sync::mpsc::channel();
        let ops = Resident::<dyn Ops>::spawn_scoped("kiln-llm", move |serve| -> Result<(), E> {
            let s = load()?;
            s.llm.check_kv_memory(s.n_ctx, 1)?;
            let (llm, draft) = (&s.llm, s.draft.as_ref());
            let session = llm.session(s.n_ctx, 512);
            if (s.lookup.is_some() || draft.is_some()) && llm.model.has_recurrent_state() {
                return Err(RuntimeError::NoSpeculation {
                    path: llm.path.clone(),
                }
                .into());
            }
            let drafter: Option<Box<dyn Drafter>> = match (s.lookup, draft) {
                (Some(n), _) => Some(Box::new(PromptLookup::new(n, s.draft_max))),
                (None, Some(d)) => Some(Box::new(DraftModel::new(
                    llm,
                    d,
                    session.n_ctx(),
                    s.draft_max,
                )?)),
                (None, None) => None,
            };
            let _ = info_tx.send(EngineInfo {
                path: llm.path.clone(),
                backend: llm.backend.name(),
                generation: llm.generation.clone(),
                weight_bytes: llm.model.weight_bytes(&llm.backend),
                kv_type: llm.kv_type().name(),
                n_ctx: session.n_ctx(),
                kv_bytes: session.kv_bytes(),
                kv_bytes_full: llm.kv_bytes_for(session.n_ctx()) as usize,
            });
            let mut sess = Session {
                llm,
                session,
                drafter,
            };
            let ops: &mut (dyn Ops + '_) = &mut sess;
            // SAFETY: the lifetime is widened for `serve` only, which returns before `sess`
            // and the models it borrows go. A call gets the reference for its own duration
            // (`Resident`'s jobs are `for<'r> FnOnce(&'r mut M)`) and `Ops`, private to this
            // module, returns owned values only, so no borrow of it outlives the call.
            let ops: &mut (dyn Ops + 'static) = unsafe { std::mem::transmute(ops) };
            serve(ops);
            Ok(())
        })?;
        let info = info_rx
            .recv()
            .expect("the engine sends its description before it serves");
        Ok(LlmEngine { ops, info })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Token ids of `text` (`add_special`: the tokenizer's BOS and the like).
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RuntimeError> {
        let text = text.to_string();
        self.ops.call(move |o| o.tokenize(&text, add_special))
    }

    /// `msgs` through the model's chat template, ready for the assistant's turn.
    pub fn render_chat(&self, msgs: &[Message]) -> Result<String, RuntimeError> {
        let msgs = msgs.to_vec();
        self.ops.call(move |o| o.render_chat(&msgs))
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.ops.call(|o| o.bos_id())
    }

    /// Generates from `ids` in the session (its cached start reused), `on_text` getting each
    /// piece of text here as it comes; false from it stops the generation.
    pub fn generate(
        &self,
        ids: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats, RuntimeError> {
        let (ids, opts) = (ids.to_vec(), opts.clone());
        self.ops.stream(
            move |o, emit: &mut dyn FnMut(String) -> bool| {
                o.generate(&ids, &opts, &mut |t| emit(t.to_string()))
            },
            &mut |t: String| on_text(&t),
        )
    }

    /// The embedding of `ids` (the session's cache is reused for it).
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let ids = ids.to_vec();
        self.ops.call(move |o| o.embed(&ids))
    }

    /// Forgets the session's tokens.
    pub fn reset(&self) {
        self.ops.call(|o| o.reset())
    }

    /// llama-perplexity's measure over `tokens` (see [`Llm::perplexity`]); `on_chunk` gets
    /// each chunk's running estimate here.
    pub fn perplexity(
        &self,
        tokens: &[u32],
        n_ctx: usize,
        add_bos: bool,
        max_chunks: usize,
        on_chunk: &mut dyn FnMut(usize, f64),
    ) -> Result<Perplexity, RuntimeError> {
        let tokens = tokens.to_vec();
        self.ops.stream(
            move |o, emit: &mut dyn FnMut((usize, f64)) -> bool| {
                o.perplexity(&tokens, n_ctx, add_bos, max_chunks, &mut |i, p| {
                    emit((i, p));
                })
            },
            &mut |(i, p)| {
                on_chunk(i, p);
                true
            },
        )
    }
}
