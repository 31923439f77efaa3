//! The server's scheduler on CUDA: 32 concurrent greedy requests (different prompts and
//! lengths, joining while others decode) each get exactly the tokens the same prompt gets
//! alone through the single-sequence generation loop. A request's answer must not depend on
//! what else the server runs (the batched decode products are batch-invariant); the same
//! with grammar-constrained requests, masked on the device, among them.
//!
//! Needs an NVIDIA GPU: `cargo test --release -p kiln-cuda -- --ignored`.

use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::time::Duration;

use kiln_cuda::CudaBackend;
use kiln_quant::GgmlType;
use kiln_runtime::{
    Event, GenerateOptions, Grammar, Llm, Prompt, Request, SamplerConfig, Scheduler,
    SchedulerConfig,
};

fn fixture(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-models/tests/fixtures/hf")
        .join(dir)
}

fn prompts(dir: &str, n: usize) -> Vec<Vec<u32>> {
    // A model's own reference file where it has one (Gemma 3), else reference.json.
    let own = fixture(&format!("reference_{dir}.json"));
    let file = match own.is_file() {
        true => own,
        false => fixture("reference.json"),
    };
    let text = std::fs::read_to_string(file).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let base: Vec<u32> = r["models"][dir]["prompts"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    // Rotations of the reference prompt, cut to different lengths, some longer than it.
    (0..n)
        .map(|i| {
            let mut p = base.clone();
            p.rotate_left(i % base.len());
            if i % 3 == 0 {
                p.extend_from_slice(&base);
            }
            p.truncate(p.len() - i % 5);
            p
        })
        .collect()
}

/// The scheduler over `slots` slots of `n_ctx` positions (prompt chunks of 64).
fn spawn<F>(slots: usize, n_ctx: usize, load: F) -> Scheduler
where
    F: FnOnce() -> Result<Llm<CudaBackend>, kiln_runtime::RuntimeError> + Send + 'static,
{
    let cfg = SchedulerConfig {
        slots,
        n_ctx,
        prefill_chunk: 64,
        max_queue: 64,
        timeout: None,
    };
    Scheduler::spawn(cfg, load).unwrap()
}

#[test]
#[ignore]
fn scheduler_greedy_equals_alone() {
    // Gemma 3's sliding-window layers on window caches; the alone runs feed their picks
    // on the device (queued a step ahead), the scheduler's do not.
    for (dir, quant) in [
        ("qwen3", Some(GgmlType::Q4_0)),
        ("llama3", Some(GgmlType::Q8_0)),
        ("gemma3", None),
    ] {
        check(dir, quant, 32, |i| GenerateOptions {
            max_tokens: 12 + i % 7,
            sampler: SamplerConfig::greedy(),
            ..Default::default()
        });
    }
}

/// Constrained greedy requests (masked where the logits are) beside free ones: each gets
/// what it gets alone, and each finished constrained answer is valid JSON of the schema.
#[test]
#[ignore]
fn scheduler_constrained_greedy_equals_alone() {
    let schema = serde_json::json!({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 6}, "b": {"type": "integer", "maximum": 999}},
        "required": ["a", "b"], "additionalProperties": false});
    let texts = check("qwen3", Some(GgmlType::Q4_0), 8, move |i| GenerateOptions {
        max_tokens: 40,
        sampler: SamplerConfig::greedy(),
        grammar: (i % 2 == 0).then(|| Grammar::JsonSchema(schema.clone())),
        ..Default::default()
    });
    for (i, t) in texts.iter().enumerate().step_by(2) {
        let v: serde_json::Value =
            serde_json::from_str(t).unwrap_or_else(|e| panic!("request {i}: {e}: {t:?}"));
        assert!(v["a"].is_string() && v["b"].is_i64(), "{t}");
    }
}

/// Greedy decoding on CUDA queues each step before its token is read back (the picks fed on
/// the device), so a generation that ends at a token whose step was queued already (a
/// grammar that completes, an end token) leaves the cache a position past what the session
/// holds. The next turn reuses the session's prefix and gets what a fresh session gets;
/// the constrained answer is what the host's masked pick gives (the CPU backend's tokens
/// are not compared: its sums differ in the last bits).
#[test]
#[ignore]
fn fed_greedy_resumes_after_a_queued_step() {
    let llm = Llm::load_quantized(
        CudaBackend::new().expect("a CUDA GPU"),
        &fixture("qwen3"),
        Some(GgmlType::Q4_0),
    )
    .unwrap();
    let p = prompts("qwen3", 1).remove(0);
    let greedy = |max_tokens, grammar| GenerateOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        grammar,
        ..Default::default()
    };
    let digit =
        Grammar::JsonSchema(serde_json::json!({"type": "integer", "minimum": 0, "maximum": 9}));
    let mut s = llm.session(256, 64);
    let first = s
        .generate(&p, &greedy(16, Some(digit)), &mut |_| true)
        .unwrap();
    assert!(
        first.tokens.len() < 16,
        "the grammar ends the answer: {:?}",
        first.tokens
    );
    let text = llm.tokenizer.decode(&first.tokens, true).unwrap();
    assert!(text.trim().parse::<u8>().is_ok_and(|d| d <= 9), "{text:?}");
    let mut p2 = p.clone();
    p2.extend_from_slice(&first.tokens);
    p2.extend_from_slice(&p[..5]);
    let again = s.generate(&p2, &greedy(24, None), &mut |_| true).unwrap();
    assert!(again.cached_tokens >= p.len(), "{}", again.cached_tokens);
    let fresh = llm
        .session(256, 64)
        .generate(&p2, &greedy(24, None), &mut |_| true)
        .unwrap();
    eprintln!(
        "fed greedy: {} tokens under the grammar, then {} from {} cached: {:?}",
        first.tokens.len(),
        again.tokens.len(),
        again.cached_tokens,
        again.tokens
    );
    assert_eq!(again.tokens, fresh.tokens);
}

/// A lone greedy request's next forward is queued before its pick is read back (the pick
/// fed on the device). Each way that ends gives what the prompt gets alone: the request
/// reaches its token limit (its answer then a prefix of the next prompt), a second request
/// arrives (the queued step is picked, then both decode together), the client leaves (the
/// queued step, written past the slot's tokens, dropped; the slot's prefix reused).
#[test]
#[ignore]
fn lone_requests_feed_their_picks() {
    use std::sync::atomic::Ordering;
    let (dir, quant) = ("qwen3", Some(GgmlType::Q4_0));
    let load = move || {
        Llm::load_quantized(
            CudaBackend::new().expect("a CUDA GPU"),
            &fixture(dir),
            quant,
        )
    };
    let greedy = |max_tokens| GenerateOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let ps = prompts(dir, 3);
    // What each prompt gets alone (the second turn's prompt: the first's answer and more).
    let (p, alone) = {
        let llm = load().unwrap();
        let run = |p: &[u32], n: usize| {
            let mut s = llm.session(256, 64);
            s.generate(p, &greedy(n), &mut |_| true).unwrap().tokens
        };
        let a = run(&ps[0], 24);
        let mut p = ps[0].clone();
        p.extend_from_slice(&a);
        p.extend_from_slice(&ps[1][..7]);
        let alone = [
            a,
            run(&p, 20),
            run(&ps[1], 60),
            run(&ps[2], 16),
            run(&ps[2], 30),
        ];
        (p, alone)
    };
    let s = spawn(4, 256, load);
    let submit = |p: &[u32], n: usize| {
        let (tx, rx) = channel();
        s.submit(Request {
            prompt: Prompt::Tokens(p.to_vec()),
            opts: greedy(n),
            sink: Box::new(tx),
        })
        .unwrap();
        rx
    };
    // Waits for `texts` text events (0: the end); the tokens at the end.
    let wait = |rx: &std::sync::mpsc::Receiver<Event>, mut texts: usize| loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Text(_) if texts == 1 => return Vec::new(),
            Event::Text(_) => texts = texts.saturating_sub(1),
            Event::Logprobs(_) => {}
            Event::Done(c) => return c.tokens,
            Event::Error(e) => panic!("request failed: {e}"),
        }
    };
    let fed = || s.stats().fed_steps.load(Ordering::Relaxed);
    // Alone, then again with its answer and more as the prompt (the slot's prefix).
    assert_eq!(wait(&submit(&ps[0], 24), 0), alone[0]);
    let fed_alone = fed();
    assert!(fed_alone >= 16, "{fed_alone} of 23 decode forwards fed");
    assert_eq!(wait(&submit(&p, 20), 0), alone[1]);
    // A second request while the first decodes alone.
    let rx1 = submit(&ps[1], 60);
    assert!(
        wait(&rx1, 4).is_empty(),
        "the first request is still decoding"
    );
    let rx2 = submit(&ps[2], 16);
    let (t1, t2) = (wait(&rx1, 0), wait(&rx2, 0));
    assert_eq!(t1, alone[2]);
    assert_eq!(t2, alone[3]);
    // A client that leaves mid-answer; its prompt again.
    let rx = submit(&ps[2], 60);
    assert!(wait(&rx, 3).is_empty());
    drop(rx);
    assert_eq!(wait(&submit(&ps[2], 30), 0), alone[4]);
    eprintln!(
        "lone requests: {fed_alone} of 23 decode forwards fed alone, {} in all",
        fed()
    );
}

/// Submits `n` requests at once; asserts each gets the tokens it gets alone; returns the
/// texts of the alone runs.
fn check(
    dir: &'static str,
    quant: Option<GgmlType>,
    n: usize,
    opts: impl Fn(usize) -> GenerateOptions,
) -> Vec<String> {
    let ps = prompts(dir, n);
    let load = move || {
        Llm::load_quantized(
            CudaBackend::new().expect("a CUDA GPU"),
            &fixture(dir),
            quant,
        )
    };
    let (alone, texts): (Vec<Vec<u32>>, Vec<String>) = {
        let llm = load().unwrap();
        ps.iter()
            .enumerate()
            .map(|(i, p)| {
                let mut s = llm.session(256, 64);
                let mut text = String::new();
                let t = s
                    .generate(p, &opts(i), &mut |t| {
                        text.push_str(t);
                        true
                    })
                    .unwrap()
                    .tokens;
                (t, text)
            })
            .unzip()
    };
    let s = spawn(n, 256, load);
    let rxs: Vec<_> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (tx, rx) = channel();
            s.submit(Request {
                prompt: Prompt::Tokens(p.clone()),
                opts: opts(i),
                sink: Box::new(tx),
            })
            .unwrap();
            rx
        })
        .collect();
    let batched: Vec<Vec<u32>> = rxs
        .iter()
        .map(|rx| loop {
            match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
                Event::Text(_) | Event::Logprobs(_) => {}
                Event::Done(c) => break c.tokens,
                Event::Error(e) => panic!("request failed: {e}"),
            }
        })
        .collect();
    let same = alone.iter().zip(&batched).filter(|(a, b)| a == b).count();
    eprintln!("{dir} {quant:?}: {same} of {n} concurrent requests equal alone");
    for (i, (a, b)) in alone
        .iter()
        .zip(&batched)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
    {
        eprintln!(
            "request {i} (prompt of {}): alone {a:?}, batched {b:?}",
            ps[i].len()
        );
    }
    assert_eq!(same, n, "{dir}: {alone:?}\nvs\n{batched:?}");
    texts
}

/// The paged cache under a block limit (five blocks of 64 positions): four short requests
/// leave their prefixes in four slots (a block each); a long one then needs three blocks, so
/// the idle slots give theirs back and it gets what it gets alone; one needing more than the
/// limit fails with the cache's error, and the scheduler goes on serving.
#[test]
#[ignore]
fn scheduler_evicts_idle_prefixes_when_blocks_run_out() {
    let (dir, n_ctx) = ("qwen3", 512);
    let base = prompts(dir, 1).remove(0);
    let long = |n: usize| {
        base.iter()
            .copied()
            .cycle()
            .skip(3)
            .take(n)
            .collect::<Vec<u32>>()
    };
    let opts = GenerateOptions {
        max_tokens: 8,
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let load = move || {
        let b = CudaBackend::new().expect("a CUDA GPU");
        b.set_kv_block_limit(Some(5));
        Llm::load_quantized(b, &fixture(dir), Some(GgmlType::Q4_0))
    };
    let alone = {
        let llm = load().unwrap();
        let mut s = llm.session(n_ctx, 64);
        s.generate(&long(150), &opts, &mut |_| true).unwrap().tokens
    };
    let s = spawn(4, n_ctx, load);
    let run = |p: Vec<u32>| -> Result<Vec<u32>, String> {
        let (tx, rx) = channel();
        s.submit(Request {
            prompt: Prompt::Tokens(p),
            opts: opts.clone(),
            sink: Box::new(tx),
        })
        .unwrap();
        loop {
            match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
                Event::Text(_) | Event::Logprobs(_) => {}
                Event::Done(c) => return Ok(c.tokens),
                Event::Error(e) => return Err(e.to_string()),
            }
        }
    };
    // Four slots busy at once, each then holding its prefix (one block each). They start
    // with a token the long prompts do not, so those prefill from scratch as alone.
    let other = if long(1)[0] == 1 { 2 } else { 1 };
    let short: Vec<_> = (0..4)
        .map(|i| {
            let (tx, rx) = channel();
            let mut p = base.clone();
            p.rotate_left(i + 1);
            p.insert(0, other);
            s.submit(Request {
                prompt: Prompt::Tokens(p),
                opts: opts.clone(),
                sink: Box::new(tx),
            })
            .unwrap();
            rx
        })
        .collect();
    for rx in short {
        loop {
            match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
                Event::Done(_) => break,
                Event::Error(e) => panic!("short request failed: {e}"),
                _ => {}
            }
        }
    }
    assert_eq!(run(long(150)).expect("the long request"), alone);
    let e = run(long(400)).expect_err("a request past the limit");
    assert!(e.contains("KV cache"), "{e}");
    assert_eq!(run(long(150)).expect("served after the failure"), alone);
}
