//! A loaded language model (weights, tokenizer, chat template) and its sessions.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_backend::{Backend, KvType, FED_TOKEN};
use kiln_formats::GgufFile;
use kiln_models::llm::{is_hf_dir, HfCheckpoint, Llama, LlamaState};
use kiln_models::ModelError;
use kiln_quant::GgmlType;
use kiln_text::{ChatTemplate, Message, StreamDecoder, TextError, Tokenizer};
use thiserror::Error;

use crate::generation::GenerationDefaults;
use crate::grammar::{Constraint, Grammar, MaskWorker};
use crate::join_scoped;
use crate::sampler::{Sampler, SamplerConfig};
use crate::stop::StopMatcher;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Format(#[from] kiln_formats::FormatError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error("{}: {what}", path.display())]
    Path { path: PathBuf, what: String },
    #[error("the prompt is {tokens} tokens but the context holds {n_ctx} (raise -c/--ctx-size, up to the model's {ctx_train})")]
    PromptTooLong {
        tokens: usize,
        n_ctx: usize,
        ctx_train: usize,
    },
    #[error("the model has no chat template; pass --raw to send the prompt as is")]
    NoChatTemplate,
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A token id a caller sent (`field`: "prompt", "logit_bias") that the model lacks.
    #[error("{field}: token id {id} is outside the vocabulary ({vocab})")]
    TokenOutOfRange {
        field: &'static str,
        id: u32,
        vocab: usize,
    },
    /// A grammar or schema that does not compile, or output it cannot continue.
    #[error("grammar: {0}")]
    Grammar(String),
    #[error("the draft model {} does not share the model's tokenizer: {what}", path.display())]
    DraftMismatch { path: PathBuf, what: String },
    #[error("{}: speculative decoding (--draft, --lookup) is not supported for this model: its convolution layers' state cannot be rewound past rejected drafts", path.display())]
    NoSpeculation { path: PathBuf },
    #[error("{what} needs {} of memory but {} is available (--no-memory-check or KILN_NO_MEMORY_CHECK=1 tries anyway)", crate::memory::size_label(*need), crate::memory::size_label(*have))]
    OutOfMemory { what: String, need: u64, have: u64 },
}

pub struct Llm<B: Backend> {
    pub backend: B,
    pub model: Llama<B>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub path: PathBuf,
    /// The model's sampling defaults (Hugging Face `generation_config.json`; empty for GGUF).
    pub generation: GenerationDefaults,
    /// How sessions' KV caches store keys and values (`set_kv_type`).
    kv_type: KvType,
    /// The vocabulary's grammar tables, built by the first constrained request.
    grammars: std::sync::OnceLock<Result<crate::grammar::Grammars, String>>,
    /// How `embed` pools a text's token states (the model's configuration).
    pub pooling: crate::embed::Pooling,
    /// Each id's bytes (`token_bytes`), built on first use.
    token_bytes: std::sync::OnceLock<Vec<Vec<u8>>>,
}

impl<B: Backend> Llm<B> {
    /// Loads a GGUF file (or the only `.gguf` in a directory), or a Hugging Face / MLX
    /// directory (`config.json`, safetensors, `tokenizer.json`).
    pub fn load(backend: B, path: &Path) -> Result<Self, RuntimeError> {
        Self::load_quantized(backend, path, None)
    }

    /// As `load`, every weight matrix requantized to `quant` at load.
    pub fn load_quantized(
        backend: B,
        path: &Path,
        quant: Option<GgmlType>,
    ) -> Result<Self, RuntimeError> {
        let (model, tokenizer, generation, file, pooling) = if is_hf_dir(path) {
            let ck = HfCheckpoint::open(path)?;
            // The tokenizer is read on a thread of its own while the weights load (a large
            // vocabulary takes tens of milliseconds or more).
            let (model, tokenizer) = std::thread::scope(|s| {
                let tokenizer = s.spawn(|| Tokenizer::from_file(path));
                let model = Llama::load_hf(&backend, &ck, quant);
                (model, join_scoped(tokenizer))
            });
            let model = model?;
            let generation = GenerationDefaults::from_dir(path)?;
            let mut tokenizer = tokenizer?;
            for &id in &generation.eos_ids {
                tokenizer.add_eog(id);
            }
            let pooling = crate::embed::Pooling::from_dir(path);
            (model, tokenizer, generation, path.to_path_buf(), pooling)
        } else {
            let file = find_gguf(path)?;
            let gguf = GgufFile::open(&file)?;
            crate::memory::check_gguf_fits(&gguf, quant, &file)?;
            let (model, tokenizer) = std::thread::scope(|s| {
                let tokenizer = s.spawn(|| Tokenizer::from_gguf(&gguf));
                let model = Llama::load_gguf(&backend, &gguf, quant);
                (model, join_scoped(tokenizer))
            });
            // The vocabulary's error first, as when it was read before the weights.
            let tokenizer = tokenizer?;
            let model = model?;
            let pooling = crate::embed::Pooling::from_gguf(&gguf);
            (
                model,
                tokenizer,
                GenerationDefaults::default(),
                file,
                pooling,
            )
        };
        // The file's template, else the one its architecture is known to use.
        let source = tokenizer
            .chat_template()
            .or_else(|| kiln_text::builtin_template(&model.cfg.arch));
        let template = match source {
            Some(src) => Some(ChatTemplate::new(
                src,
                tokenizer.bos_token().unwrap_or(""),
                tokenizer.eos_token().unwrap_or(""),
            )?),
            None => None,
        };
        Ok(Llm {
            backend,
            model,
            tokenizer,
            template,
            path: file,
            generation,
            kv_type: KvType::F32,
            grammars: std::sync::OnceLock::new(),
            token_bytes: std::sync::OnceLock::new(),
            pooling,
        })
    }

    /// Sessions from now on store keys and values as `ty` (errors when the model's head
    /// size does not fit the type's blocks).
    pub fn set_kv_type(&mut self, ty: KvType) -> Result<(), RuntimeError> {
        ty.check(self.model.cfg.head_dim)
            .map_err(|source| ModelError::Backend {
                file: self.path.clone(),
                source,
            })?;
        self.kv_type = ty;
        Ok(())
    }

    /// The backend's cache type for this model where none is asked
    /// ([`kiln_backend::LlmOps::kv_type_default`]).
    pub fn kv_type_default(&self) -> KvType {
        self.backend.kv_type_default(self.model.cfg.head_dim)
    }

    pub fn kv_type(&self) -> KvType {
        self.backend.kv_type_stored(self.kv_type)
    }

    /// Ids the sampler may pick: the model's rows that the tokenizer can decode (checkpoints
    /// pad the embedding table past the vocabulary).
    pub fn sample_vocab(&self) -> usize {
        self.model.cfg.vocab_size.min(self.tokenizer.vocab_size())
    }

    /// A job that builds the grammar tables (what the first constrained request would
    /// otherwise build), borrowing only what they are made of: it can run on a thread of
    /// its own beside the model's work.
    pub fn grammar_tables(&self) -> impl FnOnce() + Send + '_ {
        let (tok, bytes, grammars) = (&self.tokenizer, &self.token_bytes, &self.grammars);
        move || {
            build_tables(tok, bytes, grammars);
        }
    }

    /// A fresh constraint that makes generation follow `g`.
    pub fn constraint(&self, g: &Grammar) -> Result<Constraint, RuntimeError> {
        let tables = build_tables(&self.tokenizer, &self.token_bytes, &self.grammars);
        match tables {
            Ok(t) => t.compile(g),
            Err(e) => Err(RuntimeError::Grammar(e.clone())),
        }
    }

    /// The bytes token `id` stands for (a special token's name; empty for unknown ids).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let b = self
            .all_token_bytes()
            .get(id as usize)
            .map_or(&[][..], |b| &b[..]);
        b.strip_prefix(&[0xFF]).unwrap_or(b).to_vec()
    }

    /// Every id's bytes (`Tokenizer::token_bytes`), built once.
    fn all_token_bytes(&self) -> &[Vec<u8>] {
        self.token_bytes
            .get_or_init(|| self.tokenizer.token_bytes())
    }

    /// Renders a conversation with the model's chat template, ready for the assistant's turn.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String, RuntimeError> {
        let t = self.template.as_ref().ok_or(RuntimeError::NoChatTemplate)?;
        Ok(t.render(messages, true)?)
    }

    /// As `render_chat`, with the tools the model may call (OpenAI's `tools` list) given to
    /// the template.
    pub fn render_chat_tools(
        &self,
        messages: &[Message],
        tools: &serde_json::Value,
    ) -> Result<String, RuntimeError> {
        let t = self.template.as_ref().ok_or(RuntimeError::NoChatTemplate)?;
        let extra = kiln_text::value_from_json(&serde_json::json!({ "tools": tools }).to_string())?;
        Ok(t.render_with(messages, true, extra)?)
    }

    /// Token ids of a prompt. Rendered chats already hold their special tokens; raw prompts
    /// get BOS when the vocabulary asks for it.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RuntimeError> {
        Ok(self.tokenizer.encode(text, add_special)?)
    }

    /// Bytes of the KV cache of a session of `n_ctx` positions (0: the default context), in
    /// the sessions' type (sliding-window layers: what their caches hold for steps of 512).
    pub fn kv_bytes_for(&self, n_ctx: usize) -> u64 {
        let c = &self.model.cfg;
        let n_ctx = if n_ctx == 0 {
            c.ctx_train.min(4096)
        } else {
            n_ctx
        };
        let row = self
            .kv_type()
            .ggml()
            .row_bytes(c.head_dim)
            .unwrap_or(4 * c.head_dim) as u64;
        2 * (c.kv_cache_positions(n_ctx, 512) * c.n_kv_heads) as u64 * row
    }

    /// Errors when `sessions` sessions of `n_ctx` positions would not fit in memory.
    pub fn check_kv_memory(&self, n_ctx: usize, sessions: usize) -> Result<(), RuntimeError> {
        crate::memory::check_fits(
            self.kv_bytes_for(n_ctx) * sessions as u64,
            &format!(
                "the KV cache ({sessions} x {} positions)",
                if n_ctx == 0 {
                    self.model.cfg.ctx_train.min(4096)
                } else {
                    n_ctx
                }
            ),
        )
    }

    /// A session with a KV cache of `n_ctx` positions (0: the model's trained context, capped
    /// at 4096) and prefill batches of up to `max_batch` tokens.
    pub fn session(&self, n_ctx: usize, max_batch: usize) -> LlmSession<'_, B> {
        let ctx_train = self.model.cfg.ctx_train;
        let n_ctx = if n_ctx == 0 {
            ctx_train.min(4096)
        } else {
            n_ctx
        };
        let state = self
            .model
            .new_state_kv(&self.backend, n_ctx, max_batch, self.kv_type)
            // The type was checked against the model when it was set.
            .expect("KV cache type checked by set_kv_type");
        LlmSession {
            llm: self,
            state,
            tokens: Vec::new(),
        }
    }
}

/// The grammar tables of a vocabulary, built once (every id's bytes first, also once).
fn build_tables<'a>(
    tok: &Tokenizer,
    bytes: &std::sync::OnceLock<Vec<Vec<u8>>>,
    grammars: &'a std::sync::OnceLock<Result<crate::grammar::Grammars, String>>,
) -> &'a Result<crate::grammar::Grammars, String> {
    grammars.get_or_init(|| {
        let words = bytes.get_or_init(|| tok.token_bytes());
        crate::grammar::Grammars::with_bytes(tok, words).map_err(|e| e.to_string())
    })
}

/// What an LLM loads from `path`: a Hugging Face / MLX directory as it is, else the GGUF
/// file ([`find_gguf`]).
pub fn llm_path(path: &Path) -> Result<PathBuf, RuntimeError> {
    match is_hf_dir(path) {
        true => Ok(path.to_path_buf()),
        false => find_gguf(path),
    }
}

/// `path` itself, or the only `.gguf` file in it when it is a directory.
pub fn find_gguf(path: &Path) -> Result<PathBuf, RuntimeError> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let err = |what: String| RuntimeError::Path {
        path: path.into(),
        what,
    };
    let mut found = Vec::new();
    for e in std::fs::read_dir(path).map_err(|e| err(e.to_string()))? {
        let p = e.map_err(|e| err(e.to_string()))?.path();
        if p.extension().is_some_and(|x| x == "gguf") {
            found.push(p);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(err("no .gguf model file in this directory".into())),
        n => Err(err(format!("{n} .gguf files in this directory; name one"))),
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// What the output must match (JSON schema, grammar, regex).
    pub grammar: Option<Grammar>,
    /// Report each sampled token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            grammar: None,
            logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` reached.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The caller's callback asked to stop.
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct GenerationStats {
    /// Tokens the model actually processed for the prompt (after reusing the cached prefix).
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Forward passes after the first sampled token: one per token in plain decoding, one
    /// per verified draft with speculation.
    pub decode_forwards: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// From the call to the first sampled token.
    pub ttft_secs: f64,
    pub finish: FinishReason,
    pub tokens: Vec<u32>,
    /// Whether a drafter guessed tokens for the model to verify (speculative decoding).
    pub speculative: bool,
    /// Draft tokens sent to the model for verification, and how many it accepted.
    pub drafted: usize,
    pub accepted: usize,
}

impl GenerationStats {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(1e-9)
    }

    /// Decode speed: forward passes per second (tokens per second without speculation).
    pub fn decode_tps(&self) -> f64 {
        self.decode_forwards as f64 / self.decode_secs.max(1e-9)
    }

    /// Tokens per second after the first one (which prefill produced), speculation included.
    pub fn effective_decode_tps(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }

    /// Share of drafted tokens the model accepted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// One conversation: the KV cache and the tokens it holds.
pub struct LlmSession<'a, B: Backend> {
    pub(crate) llm: &'a Llm<B>,
    pub(crate) state: LlamaState<B>,
    /// Tokens whose keys and values are in the cache, in position order.
    pub(crate) tokens: Vec<u32>,
}

impl<B: Backend> LlmSession<'_, B> {
    pub fn n_ctx(&self) -> usize {
        self.state.n_ctx
    }

    /// Bytes of this session's KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.llm.model.kv_bytes(&self.llm.backend, &self.state)
    }

    /// Tokens in the KV cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn reset(&mut self) {
        self.tokens.clear();
    }

    /// The embedding of `tokens` (a text tokenized with its special tokens): its token
    /// states pooled as the model says ([`Llm::pooling`]), unit length. The cache is
    /// overwritten from position 0.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        self.check_fits(tokens.len())?;
        self.tokens.clear();
        let llm = self.llm;
        let states = llm
            .model
            .hidden_states(&llm.backend, &mut self.state, tokens)?;
        self.tokens.extend_from_slice(tokens);
        Ok(llm.pooling.pool(&states, llm.model.cfg.dim))
    }

    /// Logits after feeding `tokens` from position `pos0` (for tests and tools).
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, RuntimeError> {
        self.check_fits(self.tokens.len() + tokens.len())?;
        let pos0 = self.tokens.len();
        let l =
            self.llm
                .model
                .forward(&self.llm.backend, &mut self.state, tokens, pos0, all_logits)?;
        self.tokens.extend_from_slice(tokens);
        Ok(l.to_vec())
    }

    fn check_fits(&self, n: usize) -> Result<(), RuntimeError> {
        if n > self.state.n_ctx {
            return Err(RuntimeError::PromptTooLong {
                tokens: n,
                n_ctx: self.state.n_ctx,
                ctx_train: self.llm.model.cfg.ctx_train,
            });
        }
        Ok(())
    }

    /// Feeds what the cache lacks of `prompt` (tokens already cached that match its start
    /// are reused, but the last prompt token is always recomputed). Returns its logits
    /// (vocab) and the number of reused tokens.
    pub(crate) fn prefill(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, usize), RuntimeError> {
        self.check_fits(prompt.len())?;
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let llm = self.llm;
        let mut reuse = common.min(prompt.len() - 1);
        // A recurrent state (LFM2's convolutions) holds every token fed so far: it goes on
        // only from the end of what the cache holds, never from an earlier position; a
        // sliding-window layer's cache only where it still holds that position's window.
        if !self.state.resumes(&llm.backend, self.tokens.len(), reuse) {
            reuse = 0;
        }
        self.tokens.truncate(reuse);
        let new = &prompt[reuse..];
        let logits = llm
            .model
            .forward(&llm.backend, &mut self.state, new, reuse, false)?;
        let logits = logits.to_vec();
        self.tokens.extend_from_slice(new);
        Ok((logits, reuse))
    }

    /// Generates after `prompt` (the whole conversation so far: tokens already in the cache
    /// that match its start are reused). `on_text` receives text pieces as they complete and
    /// returns false to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerationStats, RuntimeError> {
        let t0 = Instant::now();
        let (mut logits, reuse) = self.prefill(prompt)?;
        let prefill_secs = t0.elapsed().as_secs_f64();

        let llm = self.llm;
        let mut sampler = Sampler::new(opts.sampler.clone());
        let mut out = TextOut::new(&llm.tokenizer, &opts.stop, on_text);
        let mut decode_forwards = 0usize;
        // Greedy without penalties: each step's argmax is taken where the logits are (a GPU
        // backend reads back one id, not the vocabulary's logits); the same tokens.
        // A grammar masks the row before the pick (where the logits are, if it can).
        let mut cons: Vec<Constraint> = match &opts.grammar {
            Some(g) => vec![llm.constraint(g)?],
            None => Vec::new(),
        };
        let mut masker = crate::grammar::Masker::new(crate::grammar::masks_beside(&llm.backend));
        let full_row = !cons.is_empty() || !opts.logit_bias.is_empty();
        let device_argmax = opts.sampler.is_plain_argmax() && !full_row;
        let masked_greedy = opts.sampler.is_plain_argmax() && opts.logit_bias.is_empty();
        // Greedy on the CPU: the raw pick first, the mask only when it breaks the grammar (on a
        // device the mask is computed beside the forward and applied where the logits are).
        let lazy = masked_greedy && !crate::grammar::masks_beside(&llm.backend);
        cons.iter_mut().for_each(|c| c.lazy = lazy);
        let top_k = opts.sampler.top_k_only().filter(|_| !full_row);
        // Greedy where the device feeds each pick to the next step: `ahead` when the forward
        // of the pick not yet read back is queued already.
        let feeds = masked_greedy && llm.model.feeds_picks(&llm.backend);
        let mut ahead = false;
        // There, a grammar's masks come from a worker beside the forwards (started after the
        // first token, from the state then).
        let mut worker: Option<MaskWorker> = None;
        let mut cand = Vec::new();
        let mut picked: Option<u32> = None;
        let finish = loop {
            if out.generated.len() >= opts.max_tokens {
                break FinishReason::MaxTokens;
            }
            let next = match picked.take() {
                Some(t) => t,
                None => {
                    let v = llm.sample_vocab();
                    bias(&mut logits[..v], &opts.logit_bias);
                    if let Some(c) = cons.first_mut() {
                        c.apply(&mut logits[..v])?;
                    }
                    sampler.sample(&logits[..v], &self.tokens)
                }
            };
            if let Some(c) = cons.first_mut().filter(|_| !llm.tokenizer.is_eog(next)) {
                c.accept(next)?;
                if let Some(w) = &mut worker {
                    w.accept(next);
                }
            }
            if let Some(finish) = out.push(next)? {
                break finish;
            }
            if cons.first().is_some_and(|c| c.done()) {
                break FinishReason::Stop;
            }
            if self.tokens.len() >= self.state.n_ctx {
                break FinishReason::ContextFull;
            }
            let pos = self.tokens.len();
            if feeds {
                // This token's forward is queued (before it was read back, if it was a fed
                // pick); a grammar's mask is computed beside it ([`MaskWorker`]); the pick is
                // fed to the next forward, queued before the pick is read back, so the device
                // does not wait for the host between steps. Where the forward ends before the
                // mask, its raw pick is taken if the grammar allows it (the same token).
                let (b, cols) = (&llm.backend, llm.sample_vocab());
                if !ahead {
                    llm.model.forward_last(b, &mut self.state, &[next], pos)?;
                }
                self.tokens.push(next);
                decode_forwards += 1;
                ahead = false;
                if let Some(c) = cons.first_mut() {
                    // The mask, or the raw pick when the forward ends first and it fits.
                    let w = worker.get_or_insert_with(|| MaskWorker::new(c.fork()));
                    let state = &mut self.state;
                    let raw = w.mask_or_raw(
                        c,
                        || b.work_done(),
                        |allowed| llm.model.best_allowed_last(b, state, cols, allowed),
                    );
                    if raw.is_some() {
                        picked = raw;
                        continue;
                    }
                }
                let masked = match cons.first_mut() {
                    None => true,
                    Some(c) => c
                        .allowed_words()
                        .is_some_and(|w| llm.model.mask_last(b, &mut self.state, cols, w)),
                };
                if !masked || !llm.model.argmax_feed_last(b, &self.state, cols) {
                    // The host picks (and reports a grammar that cannot go on).
                    logits.copy_from_slice(llm.model.logits_last(b, &mut self.state));
                    continue;
                }
                if out.generated.len() < opts.max_tokens && pos + 1 < self.state.n_ctx {
                    llm.model
                        .forward_last(b, &mut self.state, &[FED_TOKEN], pos + 1)?;
                    ahead = true;
                }
                picked = b.fed_token();
                continue;
            }
            if !cons.is_empty() {
                // The next mask is computed while this forward runs (before it on the CPU).
                let state = &mut self.state;
                let (b, cols) = (&llm.backend, llm.sample_vocab());
                masker.around(&mut cons, || llm.model.forward_last(b, state, &[next], pos))?;
                let c = &mut cons[0];
                // Greedy: the raw pick if the grammar allows it; else masked and picked where
                // the logits are, if the backend can.
                let raw = c.lazy.then(|| llm.model.argmax_last(b, state, cols));
                if let Some(t) = raw.filter(|&t| c.allows_fast(t)) {
                    picked = Some(t);
                } else if masked_greedy
                    && c.allowed_words()
                        .is_some_and(|w| llm.model.mask_last(b, state, cols, w))
                {
                    picked = Some(llm.model.argmax_last(b, state, cols));
                } else {
                    logits.copy_from_slice(llm.model.logits_last(b, state));
                }
            } else if device_argmax {
                picked = Some(llm.model.forward_argmax_within(
                    &llm.backend,
                    &mut self.state,
                    &[next],
                    pos,
                    llm.sample_vocab(),
                )?);
            } else if let Some(k) = top_k {
                // Only the top k matter: the backend's candidates, where it selects them.
                let got = llm.model.forward_candidates(
                    &llm.backend,
                    &mut self.state,
                    &[next],
                    pos,
                    llm.sample_vocab(),
                    k,
                    &mut cand,
                )?;
                match got {
                    None => picked = Some(sampler.sample_candidates(&mut cand)),
                    Some(l) => logits.copy_from_slice(l),
                }
            } else {
                let l = llm
                    .model
                    .forward(&llm.backend, &mut self.state, &[next], pos, false)?;
                logits.copy_from_slice(l);
            }
            self.tokens.push(next);
            decode_forwards += 1;
        };
        let mut stats = out.finish(finish, t0)?;
        stats.prompt_tokens = prompt.len() - reuse;
        stats.cached_tokens = reuse;
        stats.prefill_secs = prefill_secs;
        stats.decode_forwards = decode_forwards;
        Ok(stats)
    }
}

/// Adds each `(id, b)` of `bias` to the logit of `id` (ids past the row are skipped).
pub(crate) fn bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Sampled tokens to streamed text: end-of-generation tokens, stop strings and the caller's
/// callback, for every generation loop alike.
pub(crate) struct TextOut<'t, 'f> {
    tokenizer: &'t Tokenizer,
    stream: StreamDecoder<'t>,
    stops: StopMatcher,
    on_text: &'f mut dyn FnMut(&str) -> bool,
    pub generated: Vec<u32>,
    stop_hit: bool,
    first: Option<Instant>,
}

impl<'t, 'f> TextOut<'t, 'f> {
    pub fn new(
        tokenizer: &'t Tokenizer,
        stop: &[String],
        on_text: &'f mut dyn FnMut(&str) -> bool,
    ) -> Self {
        TextOut {
            tokenizer,
            stream: StreamDecoder::new(tokenizer, true),
            stops: StopMatcher::new(stop),
            on_text,
            generated: Vec::new(),
            stop_hit: false,
            first: None,
        }
    }

    /// Takes one sampled token; returns why generation ends here, if it does.
    pub fn push(&mut self, t: u32) -> Result<Option<FinishReason>, RuntimeError> {
        self.first.get_or_insert_with(Instant::now);
        self.generated.push(t);
        if self.tokenizer.is_eog(t) {
            return Ok(Some(FinishReason::Stop));
        }
        let (text, hit) = self.stops.push(&self.stream.push(t)?);
        if !text.is_empty() && !(self.on_text)(&text) {
            return Ok(Some(FinishReason::Cancelled));
        }
        if hit {
            self.stop_hit = true;
            return Ok(Some(FinishReason::Stop));
        }
        Ok(None)
    }

    /// Emits what is held back and returns the stats this part knows (tokens and timing;
    /// the caller fills in prompt and forward counts). `t0`: when the call began.
    pub fn finish(
        mut self,
        finish: FinishReason,
        t0: Instant,
    ) -> Result<GenerationStats, RuntimeError> {
        if finish != FinishReason::Cancelled && !self.stop_hit {
            let (text, hit) = self.stops.push(&self.stream.flush()?);
            let tail = if hit {
                text
            } else {
                text + &self.stops.flush()
            };
            if !tail.is_empty() {
                (self.on_text)(&tail);
            }
        }
        let ttft_secs = self.first.map_or(0.0, |f| (f - t0).as_secs_f64());
        let decode_secs = self.first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        Ok(GenerationStats {
            prompt_tokens: 0,
            cached_tokens: 0,
            generated_tokens: self.generated.len(),
            decode_forwards: 0,
            prefill_secs: 0.0,
            decode_secs,
            ttft_secs,
            finish,
            tokens: self.generated,
            speculative: false,
            drafted: 0,
            accepted: 0,
        })
    }
}
