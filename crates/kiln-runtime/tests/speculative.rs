//! Speculative decoding against plain decoding on SmolLM2-135M-Instruct at temperature 0:
//! the same tokens with prompt lookup and with a draft model (the same weights requantized
//! from Q4_1 to Q4_0, so its guesses differ now and then), also when EOS arrives inside an
//! accepted draft, when max_tokens cuts a draft, when the context fills and at stop strings;
//! and a draft model with another vocabulary refused.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_formats::{GgufFile, GgufWriter, Value};
use kiln_quant::GgmlType;
use kiln_runtime::{
    DraftModel, Drafter, FinishReason, GenerateOptions, GenerationStats, Llm, LlmSession,
    PromptLookup, RuntimeError, SamplerConfig,
};
use kiln_text::Message;

const EDIT: &str = "Rewrite this text, fixing the typos:\n\nTeh old lighthouse stood on the \
    edge of the clif, its light sweeping acros the dark water every night. For a hundred \
    years, sailors trusted it to guide them home safely thrugh the winter storms. When the \
    keeper retired, the vilage decided to keep the lamp burning, and children still climb \
    the narow stairs to watch the ships come in.";
const REPEAT: &str = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog.";
const N_CTX: usize = 512;
const MAX_BATCH: usize = 64;

/// One model run at a time: the tests share a few cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn model_path() -> PathBuf {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap()
}

fn load(path: &Path) -> Llm<CpuBackend> {
    Llm::load(CpuBackend::new(default_threads()), path).unwrap()
}

fn target() -> &'static Llm<CpuBackend> {
    static T: OnceLock<Llm<CpuBackend>> = OnceLock::new();
    T.get_or_init(|| load(&model_path()))
}

/// A copy of the model file in a temp dir: matrices requantized to Q4_0 when `q4_0` (norms
/// stay F32), metadata passed through `meta` (None drops a key).
fn variant(
    name: &str,
    q4_0: bool,
    meta: impl Fn(&str, &Value) -> Option<Value>,
) -> Llm<CpuBackend> {
    let g = GgufFile::open(model_path()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        if let Some(v) = meta(k, v).filter(|_| k != "general.alignment") {
            w.meta(k, v);
        }
    }
    for t in &g.tensors {
        let data = g.tensor_data(t);
        if q4_0 && t.dims.len() == 2 {
            let f = kiln_quant::dequantize(t.ty, data, t.n_elements() as usize).unwrap();
            let q = kiln_quant::quantize(GgmlType::Q4_0, &f).unwrap();
            w.tensor(&t.name, &t.dims, GgmlType::Q4_0, q);
        } else {
            w.tensor(&t.name, &t.dims, t.ty, data.to_vec());
        }
    }
    let dir = std::env::temp_dir().join(format!("kiln-spec-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    w.write(&path).unwrap();
    let llm = load(&path);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    llm
}

/// The draft: the model with every matrix requantized from Q4_1 to Q4_0.
fn draft() -> &'static Llm<CpuBackend> {
    static D: OnceLock<Llm<CpuBackend>> = OnceLock::new();
    D.get_or_init(|| variant("smollm2-135m-q4_0.gguf", true, |_, v| Some(v.clone())))
}

fn chat(llm: &Llm<CpuBackend>, user: &str) -> Vec<u32> {
    let text = llm.render_chat(&[Message::new("user", user)]).unwrap();
    llm.tokenize(&text, false).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    }
}

struct Run {
    text: String,
    stats: GenerationStats,
}

type Session = LlmSession<'static, CpuBackend>;

/// A session of the target. Runs may share one: a cached prompt is reused, not recomputed.
fn session(n_ctx: usize) -> Session {
    target().session(n_ctx, MAX_BATCH)
}

fn plain(s: &mut Session, prompt: &[u32], opts: &GenerateOptions) -> Run {
    let mut text = String::new();
    let stats = s
        .generate(prompt, opts, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    Run { text, stats }
}

fn spec(s: &mut Session, prompt: &[u32], opts: &GenerateOptions, d: &mut dyn Drafter) -> Run {
    let mut text = String::new();
    let stats = s
        .generate_speculative(prompt, opts, d, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    Run { text, stats }
}

/// The plain greedy answer to EDIT, 64 tokens.
fn plain_edit() -> &'static Run {
    static R: OnceLock<Run> = OnceLock::new();
    R.get_or_init(|| plain(&mut session(N_CTX), &chat(target(), EDIT), &greedy(64)))
}

fn assert_same(a: &Run, b: &Run) {
    assert_eq!(a.stats.tokens, b.stats.tokens, "tokens differ");
    assert_eq!(a.text, b.text);
    assert_eq!(a.stats.finish, b.stats.finish);
}

fn report(what: &str, p: &Run, s: &Run) {
    eprintln!(
        "{what}: {} tok, drafted {} accepted {} ({:.0}%), {} passes; plain {:.1} tok/s, speculative {:.1} tok/s",
        s.stats.generated_tokens,
        s.stats.drafted,
        s.stats.accepted,
        100.0 * s.stats.acceptance(),
        s.stats.decode_forwards,
        p.stats.effective_decode_tps(),
        s.stats.effective_decode_tps(),
    );
}

/// Records each draft: the context length it follows, the room it was given, the guesses.
struct Recorder<D> {
    inner: D,
    calls: Vec<(usize, usize, Vec<u32>)>,
}

impl<D: Drafter> Drafter for Recorder<D> {
    fn begin(&mut self, prompt: &[u32]) -> Result<(), RuntimeError> {
        self.inner.begin(prompt)
    }

    fn draft(&mut self, ctx: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), RuntimeError> {
        let n = out.len();
        self.inner.draft(ctx, max, out)?;
        self.calls.push((ctx.len(), max, out[n..].to_vec()));
        Ok(())
    }
}

#[test]
fn prompt_lookup_matches_greedy() {
    let _g = serial();
    let p = plain_edit();
    let s = spec(
        &mut session(N_CTX),
        &chat(target(), EDIT),
        &greedy(64),
        &mut PromptLookup::new(3, 8),
    );
    report("prompt lookup", p, &s);
    assert_same(p, &s);
    assert_eq!(s.stats.finish, FinishReason::MaxTokens);
    assert!(s.stats.accepted > 0, "no draft accepted");
    assert!(s.stats.decode_forwards < p.stats.decode_forwards);
}

#[test]
fn draft_model_matches_greedy() {
    let _g = serial();
    let (t, d) = (target(), draft());
    let prompt = chat(t, EDIT);
    // The draft really is another model: its logits differ.
    let lt = t.session(64, 16).eval(&prompt[..16], false).unwrap();
    let ld = d.session(64, 16).eval(&prompt[..16], false).unwrap();
    assert!(lt.iter().zip(&ld).any(|(a, b)| a != b));

    let p = plain_edit();
    let mut dm = DraftModel::new(t, d, N_CTX, 6).unwrap();
    let s = spec(&mut session(N_CTX), &prompt, &greedy(64), &mut dm);
    report("draft model", p, &s);
    assert_same(p, &s);
    assert!(s.stats.accepted > 0, "no draft accepted");
    // The draft session follows the accepted tokens.
    let all: Vec<u32> = prompt.iter().chain(&s.stats.tokens).copied().collect();
    assert!(all.starts_with(dm.tokens()));
    assert!(dm.tokens().len() > prompt.len());
}

#[test]
fn draft_with_another_vocabulary_is_refused() {
    let _g = serial();
    // The same model with a tokenizer one token short (and without the merges naming it).
    let g = GgufFile::open(model_path()).unwrap();
    let last = g
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .last()
        .unwrap();
    let last = last.as_str().unwrap().to_string();
    let other = variant("smollm2-135m-short-vocab.gguf", false, |k, v| {
        match (k, v) {
            ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type", Value::Array(a)) => {
                Some(Value::Array(a[..a.len() - 1].to_vec()))
            }
            ("tokenizer.ggml.merges", Value::Array(a)) => {
                let uses_last = |m: &Value| {
                    let m = m.as_str().unwrap_or("");
                    m.replace(' ', "") == last || m.split(' ').any(|p| p == last)
                };
                Some(Value::Array(
                    a.iter().filter(|m| !uses_last(m)).cloned().collect(),
                ))
            }
            _ => Some(v.clone()),
        }
    });
    let err = DraftModel::new(target(), &other, N_CTX, 8)
        .err()
        .expect("a draft with another vocabulary");
    let msg = err.to_string();
    assert!(matches!(err, RuntimeError::DraftMismatch { .. }), "{msg}");
    assert!(msg.contains("49151") && msg.contains("49152"), "{msg}");
}

#[test]
fn eos_inside_an_accepted_draft() {
    let _g = serial();
    let prompt = chat(target(), REPEAT);
    let mut ss = session(N_CTX);
    let p = plain(&mut ss, &prompt, &greedy(64));
    let mut rec = Recorder {
        inner: PromptLookup::new(3, 16),
        calls: Vec::new(),
    };
    let s = spec(&mut ss, &prompt, &greedy(64), &mut rec);
    report("repeat", &p, &s);
    assert_same(&p, &s);
    assert_eq!(s.stats.finish, FinishReason::Stop);
    let tok = &target().tokenizer;
    let gen = &s.stats.tokens;
    assert!(tok.is_eog(*gen.last().unwrap()));
    // The last draft guessed everything after its context, EOS included.
    let (ctx_len, _, guess) = rec.calls.last().unwrap();
    let after = &gen[ctx_len - prompt.len()..];
    assert!(
        !after.is_empty() && guess.starts_with(after),
        "{after:?} vs {guess:?}"
    );
}

#[test]
fn max_tokens_cuts_drafts() {
    let _g = serial();
    let prompt = chat(target(), EDIT);
    let p = plain_edit();
    let mut ss = session(N_CTX);
    let mut cut = false;
    for m in [1, 2, 3, 9, 21] {
        let mut rec = Recorder {
            inner: PromptLookup::new(3, 8),
            calls: Vec::new(),
        };
        let s = spec(&mut ss, &prompt, &greedy(m), &mut rec);
        assert_eq!(s.stats.tokens, p.stats.tokens[..m], "max_tokens {m}");
        assert_eq!(s.stats.finish, FinishReason::MaxTokens);
        assert!(s.stats.generated_tokens == m);
        cut |= rec
            .calls
            .iter()
            .any(|(_, max, g)| *max < 8 && g.len() == *max);
    }
    assert!(cut, "no draft was cut by max_tokens");
}

#[test]
fn context_full_and_stop_strings() {
    let _g = serial();
    let prompt = chat(target(), EDIT);
    let mut ss = session(prompt.len() + 20);
    let p = plain(&mut ss, &prompt, &greedy(64));
    let s = spec(&mut ss, &prompt, &greedy(64), &mut PromptLookup::new(3, 8));
    assert_same(&p, &s);
    assert_eq!(s.stats.finish, FinishReason::ContextFull);

    // A stop string from the middle of the answer.
    let full = &plain_edit().text;
    let at = full.len() / 2;
    let at = (at..full.len())
        .find(|&i| full.is_char_boundary(i))
        .unwrap();
    let stop = full[at..].chars().take(6).collect::<String>();
    let opts = GenerateOptions {
        stop: vec![stop.clone()],
        ..greedy(64)
    };
    let mut ss = session(N_CTX);
    let p = plain(&mut ss, &prompt, &opts);
    let s = spec(&mut ss, &prompt, &opts, &mut PromptLookup::new(3, 8));
    assert_same(&p, &s);
    assert_eq!(s.stats.finish, FinishReason::Stop, "stop {stop:?}");
    assert!(!s.text.contains(&stop));
}

#[test]
fn sampling_with_speculation_runs() {
    let _g = serial();
    let prompt = chat(target(), EDIT);
    let opts = GenerateOptions {
        max_tokens: 24,
        sampler: SamplerConfig {
            temperature: 0.7,
            ..Default::default()
        },
        ..Default::default()
    };
    let s = spec(
        &mut session(N_CTX),
        &prompt,
        &opts,
        &mut PromptLookup::new(3, 8),
    );
    assert_eq!(s.stats.generated_tokens, 24);
    assert!(s.stats.drafted > 0);
}
