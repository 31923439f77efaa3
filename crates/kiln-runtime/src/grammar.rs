//! Constrained decoding: a JSON schema, a Lark grammar or a regex turned into a token mask
//! per step (llguidance), so the sampler only ever picks tokens that keep the output valid.
//!
//! [`Grammars`] is built once per model (the vocabulary's byte trie); each request compiles
//! its [`Grammar`] into a [`Constraint`], which follows the sampled tokens. The mask of the
//! next step is computed while the forward runs ([`Masker`]): it depends only on the
//! tokens sampled so far, not on the logits (on the CPU backend, whose forward uses every
//! core, just before it).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value as Json;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use kiln_text::Tokenizer;

use crate::RuntimeError;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object` mode).
    JsonObject,
    /// A JSON document valid against this JSON schema.
    JsonSchema(Json),
    /// A grammar in llguidance's Lark dialect (`start: ...`; `%json {schema}` embeds a
    /// schema).
    Lark(String),
    /// A regular expression the whole output must match.
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_layout(s.clone())),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// JSON laid out as Python's `json.dumps` writes it (`", "`, `": "`, no other whitespace)
/// unless the schema sets its own layout (`x-guidance`): free whitespace lets small models
/// wander into endless newlines, and this is the layout they saw most in training.
fn with_layout(mut schema: Json) -> Json {
    if let Json::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// The model's vocabulary as grammars see it, shared by every request.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
    eog: Vec<u32>,
}

/// The tokenizer as llguidance asks for it: each id's bytes in a trie, and tokenization of
/// forced text.
struct Env {
    trie: TokTrie,
    tok: tokenizers::Tokenizer,
    canonical: bool,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let ids = std::str::from_utf8(s)
            .ok()
            .and_then(|t| self.tok.encode_fast(t, false).ok())
            .map(|e| e.get_ids().to_vec());
        match ids {
            Some(ids) if self.canonical => ids,
            _ => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, RuntimeError> {
        Self::with_bytes(tokenizer, &tokenizer.token_bytes())
    }

    /// As `new`, with the tokenizer's `token_bytes` already at hand.
    pub fn with_bytes(tokenizer: &Tokenizer, words: &[Vec<u8>]) -> Result<Self, RuntimeError> {
        let slices = match kiln_backend::options::dev_flag("KILN_LLG_DEFAULT_SLICES") {
            true => SlicedBiasComputer::general_slices(),
            false => slices(),
        };
        Self::with_slices(tokenizer, words, &slices)
    }

    /// As `with_bytes`, with llguidance's own slices (the reference kiln's are checked
    /// against).
    #[doc(hidden)]
    pub fn with_llguidance_slices(tokenizer: &Tokenizer) -> Result<Self, RuntimeError> {
        let words = tokenizer.token_bytes();
        Self::with_slices(tokenizer, &words, &SlicedBiasComputer::general_slices())
    }

    fn with_slices(
        tokenizer: &Tokenizer,
        words: &[Vec<u8>],
        slices: &[String],
    ) -> Result<Self, RuntimeError> {
        let eog: Vec<u32> = tokenizer
            .eog_ids()
            .filter(|&id| (id as usize) < words.len())
            .collect();
        let Some(&eos) = eog.first() else {
            return Err(RuntimeError::Grammar(
                "constrained decoding needs an end-of-generation token, and this vocabulary has none"
                    .into(),
            ));
        };
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, words).with_eos_tokens(&eog);
        let eog = eog.clone();
        let env: TokEnv = Arc::new(Env {
            trie,
            tok: tokenizer.inner().clone(),
            canonical: tokenizer.is_byte_level(),
        });
        let mut factory = ParserFactory::new(&env, Default::default(), slices)
            .map_err(|e| RuntimeError::Grammar(format!("vocabulary: {e}")))?;
        factory.quiet();
        Ok(Grammars {
            factory,
            vocab: words.len(),
            eog,
        })
    }

    /// Ids the grammars know (the tokenizer's).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Whether `t` ends a generation (an end token a complete grammar allows).
    pub fn is_end(&self, t: u32) -> bool {
        self.eog.contains(&t)
    }

    /// A fresh constraint for one generation; a grammar that does not compile is an error
    /// that says why.
    pub fn compile(&self, g: &Grammar) -> Result<Constraint, RuntimeError> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(|e| RuntimeError::Grammar(one_line(&e.to_string())))?;
        let mut m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(RuntimeError::Grammar(one_line(&e)));
        }
        let mask = m
            .compute_mask()
            .map_err(|e| RuntimeError::Grammar(one_line(&e.to_string())))?;
        Ok(Constraint {
            m,
            mask: Some(mask),
            vocab: self.vocab,
            eog: self.eog.clone(),
            lazy: false,
        })
    }
}

/// The token sets whose masks llguidance precomputes ("slices"): a lexer state that accepts
/// every string of a slice takes the slice's mask whole and walks the vocabulary's trie only
/// for the tokens outside it. llguidance's JSON slices (whitespace; string bodies of 1-10,
/// 1-30 and any number of characters) plus bodies of 1-2, 1-4 and 1-6: a string bounded by
/// `maxLength` with fewer than 10 characters left matches none of the longer ones and walked
/// the whole trie (~1 ms a mask on the Qwen3 vocabulary, longer than a GPU decode step). The
/// masks are the same either way (`bounded_string_slices_give_the_same_masks`).
fn slices() -> Vec<String> {
    let body = r#"[^"\\\x00-\x1F\x7F]"#;
    let mut s = vec![r"[\x20\x0A\x0D\x09]+".to_string()];
    for n in [2, 4, 6, 10, 30] {
        s.push(format!("{body}{{1,{n}}}"));
    }
    s.push(format!("{body}+"));
    s
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One generation's grammar state.
pub struct Constraint {
    m: Matcher,
    /// The allowed tokens of the next step, once computed.
    mask: Option<SimpleVob>,
    vocab: usize,
    eog: Vec<u32>,
    /// Masks only when asked ([`Constraint::allows_fast`] first): for greedy picks, which
    /// the mask changes only when the pick breaks the grammar.
    pub lazy: bool,
}

impl Constraint {
    /// Computes the next step's mask (no-op when it is ready).
    pub fn prepare(&mut self) {
        if self.mask.is_none() {
            self.mask = self.m.compute_mask().ok();
        }
    }

    /// Sets every token the grammar does not allow next to minus infinity.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), RuntimeError> {
        self.prepare();
        let Some(mask) = &self.mask else {
            return Err(self.error());
        };
        let words = mask.as_slice();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = if w * 32 < self.vocab {
                words.get(w).copied().unwrap_or(0)
            } else {
                0
            };
            if bits == u32::MAX {
                any = true;
                continue;
            }
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                } else {
                    any = true;
                }
            }
        }
        if !any {
            return Err(RuntimeError::Grammar(
                "the grammar allows no token of this vocabulary here".into(),
            ));
        }
        Ok(())
    }

    /// The next step's allowed tokens as bits (32 per word, lowest first), for a backend
    /// that masks where the logits are; None when the grammar has failed.
    pub fn allowed_words(&mut self) -> Option<&[u32]> {
        self.prepare();
        self.mask.as_ref().map(|m| m.as_slice())
    }

    /// Whether `t` is allowed next, without computing the whole mask when none is ready:
    /// a greedy pick that fits the grammar is the pick of the masked row too, so the mask
    /// (whose cost inside a JSON string can pass a decode step's) is needed only on a miss.
    pub fn allows_fast(&mut self, t: u32) -> bool {
        if let Some(m) = &self.mask {
            return m.is_allowed(t);
        }
        if t as usize >= self.vocab {
            return false;
        }
        if self.eog.contains(&t) {
            return self.m.is_accepting().unwrap_or(false);
        }
        self.m.validate_tokens(&[t]).is_ok_and(|n| n == 1)
    }

    /// An independent copy of this state (its own lexer caches, so the two never wait for
    /// each other), for a [`MaskWorker`].
    pub fn fork(&self) -> Constraint {
        Constraint {
            m: self.m.deep_clone(),
            mask: self.mask.clone(),
            vocab: self.vocab,
            eog: self.eog.clone(),
            lazy: false,
        }
    }

    /// Whether `t` is allowed next.
    pub fn allows(&mut self, t: u32) -> bool {
        self.prepare();
        self.mask.as_ref().is_some_and(|m| m.is_allowed(t))
    }

    /// Advances past the sampled token.
    pub fn accept(&mut self, t: u32) -> Result<(), RuntimeError> {
        self.mask = None;
        self.m.consume_token(t).map_err(|_| self.error())
    }

    /// Back to the grammar's start (a new document under the same grammar).
    pub fn reset(&mut self) -> Result<(), RuntimeError> {
        self.mask = None;
        self.m.reset().map_err(|_| self.error())
    }

    /// True once the grammar is complete and allows nothing more (generation ends).
    pub fn done(&self) -> bool {
        self.m.is_stopped()
    }

    fn error(&self) -> RuntimeError {
        RuntimeError::Grammar(one_line(
            &self
                .m
                .get_error()
                .unwrap_or_else(|| "the grammar cannot continue".into()),
        ))
    }
}

/// Computes constraints' next masks around forwards: on a thread of its own, kept for as
/// long as the masker lives, while the forward runs on a device (`beside`); before the
/// forward where it keeps every core busy (the CPU backend: another thread would only take
/// a core from the forward's pool). The forward always runs on the calling thread (GPU
/// contexts are bound to it).
pub struct Masker {
    worker: Option<Worker>,
    beside: bool,
}

struct Worker {
    tx: std::sync::mpsc::Sender<Vec<Constraint>>,
    rx: std::sync::mpsc::Receiver<Vec<Constraint>>,
}

impl Masker {
    pub fn new(beside: bool) -> Self {
        Masker {
            worker: None,
            beside,
        }
    }

    /// Runs `forward` with the next masks of `cs` computed meanwhile (or first).
    pub fn around<R>(&mut self, cs: &mut Vec<Constraint>, forward: impl FnOnce() -> R) -> R {
        if cs.iter().all(|c| c.lazy || c.mask.is_some()) {
            return forward();
        }
        if !self.beside {
            for c in cs.iter_mut().filter(|c| !c.lazy) {
                c.prepare();
            }
            return forward();
        }
        let w = self.worker.get_or_insert_with(|| {
            let (tx, jobs) = std::sync::mpsc::channel::<Vec<Constraint>>();
            let (done, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("kiln-masks".into())
                .spawn(move || {
                    for mut batch in jobs {
                        for c in batch.iter_mut().filter(|c| !c.lazy) {
                            c.prepare();
                        }
                        if done.send(batch).is_err() {
                            return;
                        }
                    }
                })
                .expect("start the mask thread");
            Worker { tx, rx }
        });
        w.tx.send(std::mem::take(cs)).expect("the mask thread runs");
        let r = forward();
        *cs =
            w.rx.recv()
                .expect("the mask thread hands the constraints back");
        r
    }
}

/// A constraint's masks computed on a thread of its own, on a copy that takes the same
/// tokens ([`Constraint::fork`]), while the caller's device runs the step's forward. A
/// caller whose forward ends before the mask need not wait for it: the step's best tokens
/// (the raw greedy pick, then a few candidates in order), checked on the caller's own copy
/// ([`Constraint::allows_fast`], microseconds), give the masked pick whenever one of them
/// fits. The copy then catches up by itself: the mask it was
/// computing is dropped, and the next it computes is the latest step's. So a slow mask (a
/// bounded JSON string's can take milliseconds) costs a step only when none of those fits.
pub struct MaskWorker {
    tx: std::sync::mpsc::Sender<WorkerJob>,
    rx: std::sync::mpsc::Receiver<(usize, Option<SimpleVob>)>,
    /// Tokens and resets sent: the step whose mask the caller wants.
    step: usize,
    /// The step of the last mask the worker gave (taken or dropped; MAX before the first).
    given: usize,
}

enum WorkerJob {
    Accept(u32),
    Reset,
}

impl MaskWorker {
    /// Starts computing masks of `c` (a [`Constraint::fork`]), the first for its state now.
    pub fn new(mut c: Constraint) -> Self {
        use std::sync::mpsc::{channel, TryRecvError};
        let (tx, jobs) = channel::<WorkerJob>();
        let (done, rx) = channel();
        std::thread::Builder::new()
            .name("kiln-masks".into())
            .spawn(move || {
                let (mut step, mut computed) = (0usize, None);
                loop {
                    // Every job sent so far, waiting for one when this step's mask is out.
                    let mut job = match computed == Some(step) {
                        true => match jobs.recv() {
                            Ok(j) => Some(j),
                            Err(_) => return,
                        },
                        false => None,
                    };
                    loop {
                        match job.take() {
                            Some(WorkerJob::Accept(t)) => {
                                // A failed accept leaves no mask (the caller's copy reports).
                                let _ = c.accept(t);
                            }
                            Some(WorkerJob::Reset) => {
                                let _ = c.reset();
                            }
                            None => break,
                        }
                        step += 1;
                        job = match jobs.try_recv() {
                            Ok(j) => Some(j),
                            Err(TryRecvError::Empty) => None,
                            Err(TryRecvError::Disconnected) => return,
                        };
                    }
                    c.prepare();
                    computed = Some(step);
                    if done.send((step, c.mask.take())).is_err() {
                        return;
                    }
                }
            })
            .expect("start the mask thread");
        MaskWorker {
            tx,
            rx,
            step: 0,
            given: usize::MAX,
        }
    }

    /// The caller's copy took `t`.
    pub fn accept(&mut self, t: u32) {
        self.send(WorkerJob::Accept(t));
    }

    /// The caller's copy went back to the grammar's start.
    pub fn reset(&mut self) {
        self.send(WorkerJob::Reset);
    }

    fn send(&mut self, job: WorkerJob) {
        self.step += 1;
        // A worker gone (it never panics on its own) only means no masks arrive: the caller
        // computes them on its copy.
        let _ = self.tx.send(job);
    }

    /// Waits for this step's mask (then set on `c`, the caller's copy, and None returned)
    /// or for the step's forward (`forward_done`), whichever is first. Then what `pick`
    /// finds among the forward's best tokens with `c` allowing them (the raw greedy pick,
    /// then a few candidates in order: the masked pick, found without the mask). Else None,
    /// with this step's mask set on `c` when the worker has it or is nearer it (if not, `c`
    /// computes it).
    pub fn mask_or_raw(
        &mut self,
        c: &mut Constraint,
        forward_done: impl Fn() -> bool,
        pick: impl FnOnce(&mut dyn FnMut(u32) -> bool) -> Option<u32>,
    ) -> Option<u32> {
        loop {
            if let Some(m) = self.try_mask() {
                c.mask = m;
                return None;
            }
            if forward_done() {
                break;
            }
            std::hint::spin_loop();
        }
        if let Some(t) = pick(&mut |t| c.allows_fast(t)) {
            return Some(t);
        }
        // The mask is needed. A worker that gave the last step's mask has been on this one
        // since the step began, so it is nearer its end than `c` would be from the start;
        // one still on an earlier step leaves this mask to `c`.
        if self.given.wrapping_add(1) == self.step {
            while let Ok((step, mask)) = self.rx.recv() {
                self.given = step;
                if step == self.step {
                    c.mask = mask;
                    break;
                }
            }
        } else if let Some(m) = self.try_mask() {
            c.mask = m;
        }
        None
    }

    /// This step's mask, if it is out (Some(None): the grammar failed there); earlier
    /// steps' masks are dropped.
    pub fn try_mask(&mut self) -> Option<Option<SimpleVob>> {
        while let Ok((step, mask)) = self.rx.try_recv() {
            self.given = step;
            if step == self.step {
                return Some(mask);
            }
        }
        None
    }
}

/// Whether masks are computed beside `b`'s forwards (see [`Masker`]).
pub fn masks_beside<B: kiln_backend::Backend>(b: &B) -> bool {
    !b.name().starts_with("cpu")
}
