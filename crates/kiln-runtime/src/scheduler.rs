//! Continuous batching: one engine thread owns the model and decodes every running request
//! together, one batched forward per step.
//!
//! Requests arrive over a channel and join between steps. Each step feeds every decoding
//! sequence its next token in one [`Llama::forward_seqs`], then the prefilling ones a chunk
//! of their prompt each (a long prompt is spread over several steps so running streams keep
//! flowing). Each sequence has its own KV cache slot, sampler and stop
//! strings. A finished sequence leaves its tokens in its slot: the next request whose
//! prompt starts the same way (system prompt, earlier turns) reuses that prefix (prefix
//! cache). A request whose receiver is gone frees its slot before the next step; one on
//! hold ([`EventSink::held`]) sits the steps out until it is released.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kiln_backend::{Backend, FED_TOKEN};
use kiln_models::llm::{LlamaCache, LlamaScratch, Logits, SeqChunk};
use kiln_text::{Message, StreamDecoder};

use crate::grammar::{Constraint, Masker};
use crate::llm::{FinishReason, GenerateOptions, Llm, RuntimeError};
use crate::sampler::Sampler;
use crate::stop::StopMatcher;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences decoded together (KV cache slots).
    pub slots: usize,
    /// Context of each slot, in tokens (0: the model's, capped at 4096).
    pub n_ctx: usize,
    /// Prompt tokens prefilled per step, over all prefilling sequences.
    pub prefill_chunk: usize,
    /// Requests waiting for a slot before new ones are refused.
    pub max_queue: usize,
    /// A request still generating this long after it arrived ends there (finish reason
    /// `MaxTokens`, "length" to OpenAI clients), so one request cannot hold a slot forever.
    pub timeout: Option<Duration>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            slots: 4,
            n_ctx: 0,
            prefill_chunk: 128,
            max_queue: 64,
            timeout: None,
        }
    }
}

/// How often an engine whose every request is on hold looks again.
const HOLD_POLL: Duration = Duration::from_millis(1);

/// What to generate after.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
    /// A conversation with tool definitions (OpenAI's `tools` list), which the template
    /// renders as its model expects.
    ChatTools(Vec<Message>, serde_json::Value),
    /// Text sent as is (BOS added when the vocabulary asks for it).
    Text(String),
    Tokens(Vec<u32>),
}

/// What a request hears back, in order: `Text` pieces, then one `Done` or one `Error`.
/// Requests that ask for log-probabilities get a `Logprobs` before the text of each token
/// (text may lag behind it: a character split over tokens, a possible stop string).
#[derive(Debug)]
pub enum Event {
    Text(String),
    Logprobs(TokenLogprob),
    Done(Completion),
    Error(RuntimeError),
}

/// A sampled token's log-probability under the model (the log-softmax of its logits,
/// before any grammar or sampling settings), with the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    /// The token's bytes (a special token's name).
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens, most likely first: (id, bytes, logprob).
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

#[derive(Debug, Clone)]
pub struct Completion {
    pub finish: FinishReason,
    /// Tokens of the prompt, and how many of them came from the prefix cache.
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Sampled tokens (an end-of-generation token included).
    pub completion_tokens: usize,
    pub tokens: Vec<u32>,
    /// From submission to the first sampled token, and to the end.
    pub ttft_secs: f64,
    pub total_secs: f64,
}

/// Where a request's events go.
pub trait EventSink: Send {
    /// Delivers an event; false when the receiver is gone.
    fn send(&mut self, e: Event) -> bool;
    /// Whether the receiver is gone (checked before every step).
    fn closed(&self) -> bool;
    /// Whether the request is on hold: while true it is left out of the steps (its slot and
    /// cache stay; the other requests go on), so its consumer gets the cores (checked
    /// before every step).
    fn held(&self) -> bool {
        false
    }
}

impl EventSink for Sender<Event> {
    fn send(&mut self, e: Event) -> bool {
        Sender::send(self, e).is_ok()
    }
    fn closed(&self) -> bool {
        false
    }
}

/// What the engine thread is asked to do.
enum Job {
    Generate(Request),
    Embed(Vec<Prompt>, Sender<Result<Embeddings, RuntimeError>>),
    Tokenize(
        String,
        bool,
        Sender<Result<Vec<(u32, Vec<u8>)>, RuntimeError>>,
    ),
    Detokenize(Vec<u32>, Sender<Result<String, RuntimeError>>),
}

/// Unit-length embeddings, one per input, and the tokens they took.
#[derive(Debug, Clone)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: usize,
}

pub struct Request {
    pub prompt: Prompt,
    pub opts: GenerateOptions,
    pub sink: Box<dyn EventSink>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_queue` requests are already waiting.
    QueueFull,
    /// The engine thread has stopped.
    Stopped,
}

/// What the engine learnt when it loaded the model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub path: std::path::PathBuf,
    /// The chat template's source, if the model has one.
    pub chat_template: Option<String>,
    /// Length of the model's embeddings (its hidden size).
    pub embedding_dim: usize,
    pub backend: String,
    /// Context of each slot.
    pub n_ctx: usize,
    pub slots: usize,
}

/// Counters the engine keeps up to date (read by the server's metrics).
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Submitted requests not yet in a slot.
    pub queued: AtomicUsize,
    /// Requests in a slot.
    pub running: AtomicUsize,
    /// Engine steps (the decode rows' forward and any prompt chunks' forwards each).
    pub steps: AtomicUsize,
    /// Nanoseconds of the engine's steps (sampling, streaming and bookkeeping included).
    pub step_ns: AtomicU64,
    /// Nanoseconds of those in the model: forwards and their greedy picks, to the picked
    /// tokens on the host (the rest of `step_ns` is the host's own work between forwards).
    pub forward_ns: AtomicU64,
    /// Decode forwards queued before their token was on the host (a lone greedy request on
    /// a device that feeds its picks).
    pub fed_steps: AtomicUsize,
}

/// The handle to the engine thread; cheap to share (`submit` takes `&self`).
pub struct Scheduler {
    tx: Option<Sender<Job>>,
    stats: Arc<SchedulerStats>,
    max_queue: usize,
    info: ModelInfo,
    thread: Option<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the engine thread, which loads the model with `load` and owns it from then on.
    pub fn spawn<B, F>(cfg: SchedulerConfig, load: F) -> Result<Scheduler, RuntimeError>
    where
        B: Backend + 'static,
        F: FnOnce() -> Result<Llm<B>, RuntimeError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job>();
        let (info_tx, info_rx) = mpsc::channel();
        let stats = Arc::new(SchedulerStats::default());
        let st = stats.clone();
        let cfg2 = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || {
                let llm = match load() {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = info_tx.send(Err(e));
                        return;
                    }
                };
                let mut engine = Engine::new(&llm, &cfg2, st);
                let _ = info_tx.send(Ok(ModelInfo {
                    path: llm.path.clone(),
                    chat_template: llm
                        .tokenizer
                        .chat_template()
                        .or_else(|| kiln_text::builtin_template(&llm.model.cfg.arch))
                        .map(str::to_string),
                    embedding_dim: llm.model.cfg.dim,
                    backend: llm.backend.name(),
                    n_ctx: engine.n_ctx,
                    slots: engine.slots.len(),
                }));
                // The grammar tables (the vocabulary's byte trie, ~0.5 s for Qwen3's) are
                // built beside the engine as it starts serving, so the first constrained
                // request finds them ready (one that comes sooner waits for them once).
                std::thread::scope(|s| {
                    let tables = llm.grammar_tables();
                    let _ = std::thread::Builder::new()
                        .name("kiln-grammar".into())
                        .spawn_scoped(s, tables);
                    engine.run(rx);
                });
            })
            .map_err(|e| RuntimeError::Path {
                path: "kiln-engine".into(),
                what: format!("cannot start the engine thread: {e}"),
            })?;
        let info = match info_rx.recv() {
            Ok(r) => r?,
            Err(_) => {
                let _ = thread.join();
                return Err(RuntimeError::Path {
                    path: "kiln-engine".into(),
                    what: "the engine thread stopped while loading".into(),
                });
            }
        };
        Ok(Scheduler {
            tx: Some(tx),
            stats,
            max_queue: cfg.max_queue,
            info,
            thread: Some(thread),
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// Embeds `inputs` (texts get the tokenizer's special tokens) between steps; the answer
    /// comes on the receiver.
    pub fn embed(
        &self,
        inputs: Vec<Prompt>,
    ) -> Result<Receiver<Result<Embeddings, RuntimeError>>, SubmitError> {
        self.ask(|reply| Job::Embed(inputs, reply))
    }

    /// The token ids of `text` (`add_special`: BOS and the like) with each one's bytes, from
    /// the engine's tokenizer (answered between steps).
    pub fn tokenize(
        &self,
        text: String,
        add_special: bool,
    ) -> Result<Receiver<Result<Vec<(u32, Vec<u8>)>, RuntimeError>>, SubmitError> {
        self.ask(|reply| Job::Tokenize(text, add_special, reply))
    }

    /// The text of token ids (special tokens written out).
    pub fn detokenize(
        &self,
        ids: Vec<u32>,
    ) -> Result<Receiver<Result<String, RuntimeError>>, SubmitError> {
        self.ask(|reply| Job::Detokenize(ids, reply))
    }

    /// Sends the engine a job that answers on its own channel.
    fn ask<T>(&self, job: impl FnOnce(Sender<T>) -> Job) -> Result<Receiver<T>, SubmitError> {
        let (reply, rx) = mpsc::channel();
        let tx = self.tx.as_ref().ok_or(SubmitError::Stopped)?;
        tx.send(job(reply)).map_err(|_| SubmitError::Stopped)?;
        Ok(rx)
    }

    /// Queues a request; its events go to `req.sink`.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
        let q = &self.stats.queued;
        if q.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            q.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        let tx = self.tx.as_ref().ok_or(SubmitError::Stopped)?;
        tx.send(Job::Generate(req)).map_err(|_| {
            q.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }
}

impl Drop for Scheduler {
    /// Closes the channel; the engine finishes the running requests and exits.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request admitted to a slot.
struct Seq<'t> {
    sink: Box<dyn EventSink>,
    opts: GenerateOptions,
    prompt: Vec<u32>,
    cached: usize,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    stops: StopMatcher,
    /// The request's grammar, following its tokens.
    constraint: Option<Constraint>,
    generated: Vec<u32>,
    stop_hit: bool,
    /// The sampled token to feed next (decoding), or None while prefilling.
    next: Option<u32>,
    t0: Instant,
    first: Option<Instant>,
}

struct Slot<'t, B: Backend> {
    cache: LlamaCache<B>,
    /// Tokens whose keys and values are in the cache, in position order.
    tokens: Vec<u32>,
    last_used: u64,
    seq: Option<Seq<'t>>,
}

/// A request waiting for a slot, its prompt tokenized.
struct Waiting {
    req: Request,
    prompt: Vec<u32>,
    constraint: Option<Constraint>,
    t0: Instant,
}

struct Engine<'m, B: Backend> {
    llm: &'m Llm<B>,
    slots: Vec<Slot<'m, B>>,
    scratch: LlamaScratch<B>,
    /// Sampling candidates, handed back and forth with the samplers.
    cand: Vec<(f32, u32)>,
    /// A logits row being masked or measured.
    row: Vec<f32>,
    /// Grammar masks computed around forwards (made by the first constrained request).
    masker: Option<Masker>,
    /// The slot whose next decode forward is queued already, fed its pick on the device
    /// ([`Engine::feed_ahead`]); its logits are in the scratch.
    ahead: Option<usize>,
    waiting: VecDeque<Waiting>,
    n_ctx: usize,
    chunk: usize,
    clock: u64,
    timeout: Option<Duration>,
    stats: Arc<SchedulerStats>,
}

impl<'m, B: Backend> Engine<'m, B> {
    fn new(llm: &'m Llm<B>, cfg: &SchedulerConfig, stats: Arc<SchedulerStats>) -> Self {
        let n_ctx = match cfg.n_ctx {
            0 => llm.model.cfg.ctx_train.min(4096),
            n => n,
        };
        let n_slots = cfg.slots.max(1);
        let chunk = cfg.prefill_chunk.max(1);
        let slots = (0..n_slots)
            .map(|_| Slot {
                cache: llm.model.new_cache(&llm.backend, n_ctx, chunk),
                tokens: Vec::new(),
                last_used: 0,
                seq: None,
            })
            .collect();
        Engine {
            llm,
            slots,
            scratch: llm
                .model
                .new_scratch(&llm.backend, n_slots + chunk, n_slots, n_slots),
            cand: Vec::new(),
            row: Vec::new(),
            masker: None,
            ahead: None,
            waiting: VecDeque::new(),
            n_ctx,
            chunk,
            clock: 0,
            timeout: cfg.timeout,
            stats,
        }
    }

    /// Idle slots drop what their caches hold (the prefix cache's tokens go with it): the
    /// backend's blocks go back to its pool. False when no idle slot held anything.
    fn evict_idle_caches(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.slots.len() {
            let (slot, b) = (&mut self.slots[i], &self.llm.backend);
            let held = slot.cache.held_bytes(b);
            if slot.seq.is_none() && held > 0 {
                slot.tokens.clear();
                slot.cache.release(b);
                any |= slot.cache.held_bytes(b) < held;
            }
        }
        any
    }

    fn busy(&self) -> bool {
        !self.waiting.is_empty() || self.slots.iter().any(|s| s.seq.is_some())
    }

    fn run(&mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            // New requests join between steps; block only when there is nothing to do.
            while open {
                let r = if self.busy() {
                    rx.try_recv().map_err(|e| match e {
                        TryRecvError::Empty => None,
                        TryRecvError::Disconnected => Some(()),
                    })
                } else {
                    rx.recv_timeout(Duration::from_secs(3600))
                        .map_err(|e| match e {
                            RecvTimeoutError::Timeout => None,
                            RecvTimeoutError::Disconnected => Some(()),
                        })
                };
                match r {
                    Ok(job) => self.job(job),
                    Err(None) if self.busy() => break,
                    Err(None) => continue,
                    Err(Some(())) => open = false,
                }
            }
            if !open && !self.busy() {
                return;
            }
            let res = catch_unwind(AssertUnwindSafe(|| self.step()));
            if matches!(res, Ok(false)) && open {
                // Every running request is on hold: wait for a new one or a release.
                match rx.recv_timeout(HOLD_POLL) {
                    Ok(job) => self.job(job),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else if matches!(res, Ok(false)) {
                std::thread::sleep(HOLD_POLL);
            }
            if res.is_err() {
                // A bug, not bad input: fail the running requests, keep serving.
                for i in 0..self.slots.len() {
                    let e = RuntimeError::Path {
                        path: "kiln-engine".into(),
                        what: "internal error during generation (see the server log)".into(),
                    };
                    self.fail(i, e);
                    self.slots[i].tokens.clear();
                }
            }
        }
    }

    fn job(&mut self, job: Job) {
        match job {
            Job::Generate(req) => self.admit(req),
            Job::Tokenize(text, add_special, reply) => {
                let llm = self.llm;
                let r = llm.tokenize(&text, add_special).map(|ids| {
                    ids.into_iter()
                        .map(|id| (id, llm.token_bytes(id)))
                        .collect()
                });
                let _ = reply.send(r);
            }
            Job::Detokenize(ids, reply) => {
                let r = self
                    .llm
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(RuntimeError::from);
                let _ = reply.send(r);
            }
            Job::Embed(inputs, reply) => {
                // Between steps: the running streams wait for one embedding batch.
                let r =
                    catch_unwind(AssertUnwindSafe(|| self.embed(&inputs))).unwrap_or_else(|_| {
                        Err(RuntimeError::Path {
                            path: "kiln-engine".into(),
                            what: "internal error while embedding (see the server log)".into(),
                        })
                    });
                let _ = reply.send(r);
            }
        }
    }

    /// Each input's embedding, and the tokens they took.
    fn embed(&self, inputs: &[Prompt]) -> Result<Embeddings, RuntimeError> {
        let llm = self.llm;
        let mut out = Embeddings {
            vectors: Vec::with_capacity(inputs.len()),
            tokens: 0,
        };
        for p in inputs {
            let ids = self.tokenize(p)?;
            let mut s = llm.session(ids.len(), self.chunk.min(ids.len()));
            out.vectors.push(s.embed(&ids)?);
            out.tokens += ids.len();
        }
        Ok(out)
    }

    /// Tokenizes and checks a new request: errors are answered at once, the rest wait.
    fn admit(&mut self, mut req: Request) {
        let t0 = Instant::now();
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        let lazy = lazy_greedy(&req.opts) && !crate::grammar::masks_beside(&self.llm.backend);
        let constraint = req.opts.grammar.as_ref().map(|g| {
            self.llm.constraint(g).map(|mut c| {
                c.lazy = lazy;
                c
            })
        });
        // A bias on a token the model lacks is refused, not dropped.
        let vocab = self.llm.model.cfg.vocab_size;
        let biased = match req.opts.logit_bias.iter().find(|b| b.0 as usize >= vocab) {
            Some(&(id, _)) => Err(RuntimeError::TokenOutOfRange {
                field: "logit_bias",
                id,
                vocab,
            }),
            None => Ok(()),
        };
        let prompt = biased.and_then(|()| self.tokenize(&req.prompt));
        match (prompt, constraint.transpose()) {
            (Ok(prompt), Ok(constraint)) => {
                self.stats.queued.fetch_add(1, Ordering::SeqCst);
                self.waiting.push_back(Waiting {
                    req,
                    prompt,
                    constraint,
                    t0,
                });
            }
            (Err(e), _) | (_, Err(e)) => {
                req.sink.send(Event::Error(e));
            }
        }
    }

    fn tokenize(&self, p: &Prompt) -> Result<Vec<u32>, RuntimeError> {
        let llm = self.llm;
        let ids = match p {
            Prompt::Chat(m) => llm.tokenize(&llm.render_chat(m)?, false)?,
            Prompt::ChatTools(m, tools) => {
                llm.tokenize(&llm.render_chat_tools(m, tools)?, false)?
            }
            Prompt::Text(t) => llm.tokenize(t, true)?,
            Prompt::Tokens(t) => {
                let vocab = llm.model.cfg.vocab_size;
                if let Some(&id) = t.iter().find(|&&id| id as usize >= vocab) {
                    return Err(RuntimeError::TokenOutOfRange {
                        field: "prompt",
                        id,
                        vocab,
                    });
                }
                t.clone()
            }
        };
        if ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        if ids.len() > self.n_ctx {
            return Err(RuntimeError::PromptTooLong {
                tokens: ids.len(),
                n_ctx: self.n_ctx,
                ctx_train: llm.model.cfg.ctx_train,
            });
        }
        Ok(ids)
    }

    /// Moves waiting requests into free slots, each to the free slot holding the longest
    /// start of its prompt (least recently used on ties); where another slot, running or
    /// not, holds a longer start (in whole prefill chunks), that start's keys and values are
    /// copied into the slot.
    fn assign(&mut self) {
        // Requests whose client left while waiting are dropped here.
        let before = self.waiting.len();
        self.waiting.retain(|w| !w.req.sink.closed());
        let gone = before - self.waiting.len();
        self.stats.queued.fetch_sub(gone, Ordering::SeqCst);
        while !self.waiting.is_empty() {
            let w = &self.waiting[0];
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.seq.is_none())
                .map(|(i, s)| (common_prefix(&s.tokens, &w.prompt), s.last_used, i))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let Some((common, _, i)) = best else {
                return;
            };
            let w = self.waiting.pop_front().expect("checked non-empty");
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
            self.stats.running.fetch_add(1, Ordering::SeqCst);
            // The last prompt token is always recomputed: its logits start the answer.
            let mut reuse = common.min(w.prompt.len() - 1);
            let tok = &self.llm.tokenizer;
            let slot = &mut self.slots[i];
            // A recurrent state (LFM2's convolutions) goes on only from the end of what the
            // slot holds; a sliding-window layer's cache, only where it still holds the
            // window of the position it goes on from.
            if !slot
                .cache
                .resumes(&self.llm.backend, slot.tokens.len(), reuse)
            {
                reuse = 0;
            }
            slot.tokens.truncate(reuse);
            // A longer start of the prompt in another slot (running or idle: a system prompt
            // other requests hold): its keys and values copied over, or its blocks shared
            // where the backend pages its caches, instead of prefilling them again. Whole
            // prefill chunks only: the request then computes the chunks a fresh prefill
            // would, where batch-invariant products (CUDA's up to 64 rows) give the same bits.
            if !self.llm.model.has_recurrent_state() {
                let whole = |c: usize| c.min(w.prompt.len() - 1) / self.chunk * self.chunk;
                let backend = &self.llm.backend;
                let other = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(j, s)| (whole(common_prefix(&s.tokens, &w.prompt)), j, s))
                    .filter(|(c, _, s)| s.cache.resumes(backend, s.tokens.len(), *c))
                    .map(|(c, j, _)| (c, j))
                    .max();
                if let Some((c, j)) = other.filter(|&(c, _)| c > reuse) {
                    reuse = c;
                    let (src, dst) = match j < i {
                        true => {
                            let (a, b) = self.slots.split_at_mut(i);
                            (&a[j], &mut b[0])
                        }
                        false => {
                            let (a, b) = self.slots.split_at_mut(j);
                            (&b[0], &mut a[i])
                        }
                    };
                    dst.cache.copy_prefix(&self.llm.backend, &src.cache, reuse);
                    dst.tokens.clear();
                    dst.tokens.extend_from_slice(&w.prompt[..reuse]);
                }
            }
            let slot = &mut self.slots[i];
            slot.seq = Some(Seq {
                sampler: Sampler::new(w.req.opts.sampler.clone()),
                stream: StreamDecoder::new(tok, true),
                stops: StopMatcher::new(&w.req.opts.stop),
                constraint: w.constraint,
                sink: w.req.sink,
                opts: w.req.opts,
                prompt: w.prompt,
                cached: reuse,
                generated: Vec::new(),
                stop_hit: false,
                next: None,
                t0: w.t0,
                first: None,
            });
        }
    }

    /// One step: every decoding sequence's next token in one batched forward, then prompt
    /// chunks of the prefilling ones, each in a forward of its own (requests on hold left
    /// out); sampling after each. False when nothing ran.
    ///
    /// A prompt is cut at the same places whatever else runs (multiples of the chunk from
    /// its start), and decode rows never share a forward with a prompt: each sequence's
    /// products see the same rows as when it runs alone, so on backends whose products are
    /// batch-invariant (the CPU's; CUDA's up to 64 rows) a request's answer does not depend
    /// on what else the server runs.
    fn step(&mut self) -> bool {
        let t0 = Instant::now();
        let ran = self.step_inner();
        if ran {
            let ns = t0.elapsed().as_nanos() as u64;
            self.stats.step_ns.fetch_add(ns, Ordering::Relaxed);
        }
        ran
    }

    fn step_inner(&mut self) -> bool {
        for i in 0..self.slots.len() {
            if self.slots[i].seq.as_ref().is_some_and(|s| s.sink.closed()) {
                self.release(i, None);
            }
        }
        self.assign();
        // A lone decode's forward queued by the last step: this step's for its sequence,
        // picked now (and the next one queued while the sequence is still alone).
        let ahead = self.ahead.take();
        if let Some(i) = ahead {
            let seq = self.slots[i].seq.as_ref().expect("an ahead slot decodes");
            let feed = [vec![seq.next.expect("an ahead slot decodes")]];
            self.after(&[(i, 0, 1)], &feed, Instant::now());
        }
        let held: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.seq.as_ref().is_some_and(|q| q.sink.held()))
            .collect();
        // Rows of each forward: (slot, start, len) into the slot's pending tokens.
        let decode: Vec<(usize, usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| s.seq.as_ref().is_some_and(|q| q.next.is_some()) && !held[*i])
            .filter(|&(i, _)| ahead != Some(i))
            .map(|(i, _)| (i, 0, 1))
            .collect();
        // Prefill: oldest request first, whole chunks within the step's budget (the first
        // always).
        let mut pre: Vec<(Instant, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let seq = s.seq.as_ref()?;
                (seq.next.is_none() && !held[i]).then_some((seq.t0, i))
            })
            .collect();
        pre.sort();
        let mut budget = self.chunk;
        let mut prefill = Vec::new();
        for (_, i) in pre {
            let s = &self.slots[i];
            let seq = s.seq.as_ref().expect("filtered");
            let at = s.tokens.len();
            let n = (seq.prompt.len() - at).min(self.chunk - at % self.chunk);
            if n > budget && !prefill.is_empty() {
                break;
            }
            budget = budget.saturating_sub(n);
            prefill.push([(i, at, n)]);
        }
        if decode.is_empty() && prefill.is_empty() && ahead.is_none() {
            return false;
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        if !decode.is_empty() {
            self.forward(&decode);
        }
        // (The decode forward touches decode slots only: every planned chunk's is still
        // there.)
        for p in &prefill {
            self.forward(p);
        }
        true
    }

    /// One forward over `plan`'s rows (slots in increasing order), then each finished
    /// row's sampling.
    fn forward(&mut self, plan: &[(usize, usize, usize)]) {
        let llm = self.llm;
        // Each slot's tokens for this step.
        let feeds: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, at, n)| {
                let seq = self.slots[i].seq.as_ref().expect("planned");
                match seq.next {
                    Some(t) => vec![t],
                    None => seq.prompt[at..at + n].to_vec(),
                }
            })
            .collect();
        let t0 = Instant::now();
        // Rows sampled after this forward whose grammar needs its next mask: computed while
        // the forward runs.
        let mut owners = Vec::new();
        let mut masks: Vec<Constraint> = plan
            .iter()
            .filter_map(|&(i, at, n)| {
                let seq = self.slots[i].seq.as_mut().expect("planned");
                let samples = seq.next.is_some() || at + n == seq.prompt.len();
                let lazy = seq.constraint.as_ref().is_some_and(|c| c.lazy);
                let c = (samples && !lazy).then(|| seq.constraint.take())??;
                owners.push(i);
                Some(c)
            })
            .collect();
        let res = {
            let mut chunks: Vec<SeqChunk<'_, B>> = Vec::with_capacity(plan.len());
            let mut rest: &mut [Slot<'m, B>] = &mut self.slots;
            let mut base = 0;
            for (&(i, _, _), feed) in plan.iter().zip(&feeds) {
                let (head, tail) = rest.split_at_mut(i - base + 1);
                let slot = &mut head[i - base];
                rest = tail;
                base = i + 1;
                chunks.push(SeqChunk {
                    pos0: slot.tokens.len(),
                    tokens: feed,
                    cache: &mut slot.cache,
                });
            }
            let scratch = &mut self.scratch;
            let masker = self
                .masker
                .get_or_insert_with(|| Masker::new(crate::grammar::masks_beside(&llm.backend)));
            masker.around(&mut masks, || {
                llm.model
                    .forward_seqs(&llm.backend, scratch, &mut chunks, Logits::Last)
            })
        };
        for (i, c) in owners.into_iter().zip(masks) {
            if let Some(seq) = self.slots[i].seq.as_mut() {
                seq.constraint = Some(c);
            }
        }
        if let Err(e) = res {
            // Cache memory ran out (a backend that hands it out in blocks): the idle slots'
            // cached prefixes give theirs back and the step runs again on the next turn (no
            // sequence moved). Only when none is left to give do the step's requests fail.
            let kv_full = matches!(
                &e,
                kiln_models::ModelError::Backend {
                    source: kiln_backend::BackendError::KvMemory { .. },
                    ..
                }
            );
            if kv_full && self.evict_idle_caches() {
                return;
            }
            let msg = e.to_string();
            for &(i, _, _) in plan {
                self.fail(
                    i,
                    RuntimeError::Path {
                        path: "forward".into(),
                        what: msg.clone(),
                    },
                );
                self.slots[i].tokens.clear();
            }
            return;
        }
        self.after(plan, &feeds, t0);
    }

    /// Each finished row's sampling after the forward over `plan` (its logits in the
    /// scratch), begun at `t0`, that fed the slots `feeds`.
    fn after(&mut self, plan: &[(usize, usize, usize)], feeds: &[Vec<u32>], t0: Instant) {
        let llm = self.llm;
        // Greedy requests take their tokens where the logits are (one pick for every row);
        // the others read their row, or the backend's top-k candidates of it.
        let cols = llm.sample_vocab();
        // Grammar masks applied where the logits are, where the backend can and the pick
        // needs nothing else of the row (greedy, top-k): the picks then stay there too.
        let masked: Vec<bool> = plan
            .iter()
            .enumerate()
            .map(|(j, &(i, at, n))| {
                let seq = self.slots[i].seq.as_mut().expect("planned");
                let samples = seq.next.is_some() || at + n == seq.prompt.len();
                let o = &seq.opts;
                // (Lazy rows pick first and mask only on a miss: `lazy_greedy`.)
                let pick_only = o.logprobs.is_none()
                    && o.logit_bias.is_empty()
                    && (o.sampler.is_plain_argmax() || o.sampler.top_k_only().is_some());
                let (b, sc) = (&llm.backend, &mut self.scratch);
                samples
                    && pick_only
                    && seq
                        .constraint
                        .as_mut()
                        .filter(|c| !c.lazy)
                        .and_then(|c| c.allowed_words())
                        .is_some_and(|w| llm.model.mask_logits(b, sc, j, cols, w))
            })
            .collect();
        let greedy = plan.iter().enumerate().any(|(j, &(i, _, _))| {
            let seq = self.slots[i].seq.as_ref().expect("planned");
            let lazy = seq.constraint.as_ref().is_some_and(|c| c.lazy);
            seq.opts.sampler.is_plain_argmax() && (lazy || !(full_row(seq) && !masked[j]))
        });
        let argmax = match self.feed_ahead(plan) {
            Some(t) => vec![t],
            None if greedy => llm
                .model
                .argmax(&llm.backend, &self.scratch, plan.len(), cols),
            None => Vec::new(),
        };
        let ns = t0.elapsed().as_nanos() as u64;
        self.stats.forward_ns.fetch_add(ns, Ordering::Relaxed);
        self.clock += 1;
        for (j, (&(i, _, _), feed)) in plan.iter().zip(feeds).enumerate() {
            let slot = &mut self.slots[i];
            slot.tokens.extend_from_slice(feed);
            slot.last_used = self.clock;
            let seq = slot.seq.as_mut().expect("planned");
            if seq.next.is_none() && slot.tokens.len() < seq.prompt.len() {
                continue; // more prompt to prefill
            }
            let finish = if seq.generated.len() >= seq.opts.max_tokens {
                Ok(Some(FinishReason::MaxTokens))
            } else {
                let cfg = &seq.sampler.cfg;
                // A greedy constrained row: its raw pick when the grammar allows it.
                let fits = match seq.constraint.as_mut().filter(|c| c.lazy) {
                    Some(c) => c.allows_fast(argmax[j]),
                    None => false,
                };
                let next = if fits {
                    argmax[j]
                } else if full_row(seq) && !masked[j] {
                    // The whole row: masked by the grammar, measured for logprobs.
                    let l = llm.model.logits_row(&llm.backend, &mut self.scratch, j);
                    self.row.clear();
                    self.row.extend_from_slice(&l[..cols]);
                    let lp = seq
                        .opts
                        .logprobs
                        .map(|top| (top, log_softmax_max(&self.row)));
                    crate::llm::bias(&mut self.row, &seq.opts.logit_bias);
                    if let Some(c) = seq.constraint.as_mut() {
                        if let Err(e) = c.apply(&mut self.row) {
                            self.fail(i, e);
                            continue;
                        }
                    }
                    let next = seq.sampler.sample(&self.row, &slot.tokens);
                    if let Some((top, lse)) = lp {
                        // (`l`: the raw row; `self.row` was masked.)
                        let lp = token_logprob(llm, &l[..cols], lse, next, top);
                        if !seq.sink.send(Event::Logprobs(lp)) {
                            self.finish(i, FinishReason::Cancelled);
                            continue;
                        }
                    }
                    next
                } else if cfg.is_plain_argmax() {
                    argmax[j]
                } else if let Some(k) = cfg.top_k_only() {
                    let (b, sc) = (&llm.backend, &mut self.scratch);
                    match llm.model.candidates(b, sc, j, cols, k, &mut self.cand) {
                        None => seq.sampler.sample_candidates(&mut self.cand),
                        Some(l) => seq.sampler.sample(&l[..cols], &slot.tokens),
                    }
                } else {
                    let l = llm.model.logits_row(&llm.backend, &mut self.scratch, j);
                    seq.sampler.sample(&l[..cols], &slot.tokens)
                };
                emit(seq, next, llm)
            };
            let finish = match finish {
                Ok(f) => f,
                Err(e) => {
                    self.fail(i, e);
                    continue;
                }
            };
            let slot = &self.slots[i];
            let finish = finish
                .or_else(|| {
                    (slot.tokens.len() >= slot.cache.n_ctx).then_some(FinishReason::ContextFull)
                })
                .or_else(|| {
                    let seq = slot.seq.as_ref()?;
                    let late = self.timeout.is_some_and(|t| seq.t0.elapsed() >= t);
                    late.then_some(FinishReason::MaxTokens)
                });
            if let Some(f) = finish {
                self.finish(i, f);
            }
        }
    }

    /// A lone greedy row on a backend that feeds picks ([`kiln_backend::LlmOps::argmax_feed`]): its pick
    /// becomes the next forward's token on the device, and that forward is queued before the
    /// pick is read back (`ahead`), so the device does not wait for the host between steps;
    /// the pick. None (nothing queued) where other requests run or wait, where the row needs
    /// more than the argmax, or where the pick may end the request.
    fn feed_ahead(&mut self, plan: &[(usize, usize, usize)]) -> Option<u32> {
        let llm = self.llm;
        let (b, cols) = (&llm.backend, llm.sample_vocab());
        let &[(i, at, n)] = plan else {
            return None;
        };
        let alone = self.waiting.is_empty()
            && (self.slots.iter().enumerate()).all(|(j, s)| j == i || s.seq.is_none());
        let slot = &self.slots[i];
        let seq = slot.seq.as_ref()?;
        let o = &seq.opts;
        let samples = seq.next.is_some() || at + n == seq.prompt.len();
        let plain = lazy_greedy(o) && seq.constraint.is_none() && !seq.sink.held();
        // The forward after the pick is wanted unless the pick is the last token allowed
        // or fills the context (an end of generation or a stop string wastes it).
        let pos = slot.tokens.len() + n;
        let wanted = seq.generated.len() + 1 < o.max_tokens && pos < slot.cache.n_ctx;
        if !(alone && samples && plain && wanted && llm.model.feeds_picks(b))
            || !llm.model.argmax_feed(b, &self.scratch, cols)
        {
            return None;
        }
        let slot = &mut self.slots[i];
        let mut chunk = [SeqChunk {
            pos0: pos,
            tokens: &[FED_TOKEN],
            cache: &mut slot.cache,
        }];
        // (Out of cache memory: the next step runs the forward itself, and handles that.)
        let queued = llm
            .model
            .forward_seqs(b, &mut self.scratch, &mut chunk, Logits::Last)
            .is_ok();
        self.ahead = queued.then_some(i);
        if queued {
            self.stats.fed_steps.fetch_add(1, Ordering::Relaxed);
        }
        Some(b.fed_token().expect("a pick was fed"))
    }

    /// Ends slot `i`'s request: the held-back text, then `Done`.
    fn finish(&mut self, i: usize, finish: FinishReason) {
        let slot = &mut self.slots[i];
        let Some(seq) = slot.seq.as_mut() else {
            return;
        };
        if finish != FinishReason::Cancelled {
            let tail = match flush(seq) {
                Ok(t) => t,
                Err(e) => return self.fail(i, e),
            };
            if !tail.is_empty() {
                seq.sink.send(Event::Text(tail));
            }
        }
        let now = Instant::now();
        let done = Completion {
            finish,
            prompt_tokens: seq.prompt.len(),
            cached_tokens: seq.cached,
            completion_tokens: seq.generated.len(),
            tokens: seq.generated.clone(),
            ttft_secs: seq.first.map_or(0.0, |f| (f - seq.t0).as_secs_f64()),
            total_secs: (now - seq.t0).as_secs_f64(),
        };
        self.release(i, Some(Event::Done(done)));
    }

    fn fail(&mut self, i: usize, e: RuntimeError) {
        self.release(i, Some(Event::Error(e)));
    }

    /// Frees slot `i` (its cached tokens stay for the prefix cache), then sends its request
    /// the last event, if any: a client that has its answer sees the slot free (`/health`).
    fn release(&mut self, i: usize, last: Option<Event>) {
        if self.ahead == Some(i) {
            // (Its queued forward wrote past the slot's tokens: overwritten by what comes.)
            self.ahead = None;
        }
        if let Some(mut seq) = self.slots[i].seq.take() {
            self.stats.running.fetch_sub(1, Ordering::SeqCst);
            if let Some(e) = last {
                seq.sink.send(e);
            }
        }
    }
}

/// Records the sequence's sampled token and emits its text; returns why generation ends
/// here, if it does. The order of checks is [`crate::LlmSession::generate`]'s, so a request
/// gets the tokens it would get alone.
fn emit<B: Backend>(
    seq: &mut Seq<'_>,
    next: u32,
    llm: &Llm<B>,
) -> Result<Option<FinishReason>, RuntimeError> {
    seq.first.get_or_insert_with(Instant::now);
    seq.generated.push(next);
    seq.next = Some(next);
    if llm.tokenizer.is_eog(next) {
        return Ok(Some(FinishReason::Stop));
    }
    if let Some(c) = seq.constraint.as_mut() {
        c.accept(next)?;
    }
    let (text, hit) = seq.stops.push(&seq.stream.push(next)?);
    if !text.is_empty() && !seq.sink.send(Event::Text(text)) {
        return Ok(Some(FinishReason::Cancelled));
    }
    if hit {
        seq.stop_hit = true;
        return Ok(Some(FinishReason::Stop));
    }
    if seq.constraint.as_ref().is_some_and(|c| c.done()) {
        // The grammar is complete and allows nothing more.
        return Ok(Some(FinishReason::Stop));
    }
    Ok(None)
}

/// Greedy with nothing else read from the row: on the CPU a grammar checks the raw pick
/// first and masks only on a miss (a mask costs the forward's cores there; on a device it is
/// computed beside the forward and applied where the logits are).
fn lazy_greedy(o: &GenerateOptions) -> bool {
    o.sampler.is_plain_argmax() && o.logprobs.is_none() && o.logit_bias.is_empty()
}

/// Whether sampling `seq` needs its whole logits row on the host.
fn full_row(seq: &Seq<'_>) -> bool {
    seq.constraint.is_some() || seq.opts.logprobs.is_some() || !seq.opts.logit_bias.is_empty()
}

/// The log of the softmax's normaliser: `ln(sum(exp(l)))`.
fn log_softmax_max(l: &[f32]) -> f32 {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = l.iter().map(|&x| ((x - m) as f64).exp()).sum();
    m + sum.ln() as f32
}

/// `next`'s log-probability in the row `l` (normaliser `lse`) and the `top` most likely.
fn token_logprob<B: Backend>(
    llm: &Llm<B>,
    l: &[f32],
    lse: f32,
    next: u32,
    top: usize,
) -> TokenLogprob {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &x) in l.iter().enumerate() {
            if best.len() < top || x > best[best.len() - 1].0 {
                let at = best.partition_point(|&(y, _)| y >= x);
                best.insert(at, (x, id as u32));
                best.truncate(top);
            }
        }
    }
    TokenLogprob {
        token: next,
        bytes: llm.token_bytes(next),
        logprob: l.get(next as usize).map_or(f32::NEG_INFINITY, |&x| x - lse),
        top: best
            .into_iter()
            .map(|(x, id)| (id, llm.token_bytes(id), x - lse))
            .collect(),
    }
}

/// What the decoder and the stop matcher still hold, at the end (nothing after a stop).
fn flush(seq: &mut Seq<'_>) -> Result<String, RuntimeError> {
    if seq.stop_hit {
        return Ok(String::new());
    }
    let (text, hit) = seq.stops.push(&seq.stream.flush()?);
    Ok(if hit { text } else { text + &seq.stops.flush() })
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
