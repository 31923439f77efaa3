//! Continuous batching against one request at a time on SmolLM2-135M-Instruct: at
//! temperature 0 (and at temperature 0.9 with a seed) every request of a batch gets exactly
//! the tokens `LlmSession::generate` gives it alone, whether it joins with the others, later,
//! or with a prompt prefilled over several steps; the prefix cache reuses a shared start;
//! a dropped receiver frees its slot; a held request waits while the others run; a full
//! queue and bad prompts are refused cleanly.

use std::sync::mpsc::{channel, Receiver};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::{
    Completion, Event, EventSink, FinishReason, GenerateOptions, Llm, Prompt, Request,
    RuntimeError, SamplerConfig, Scheduler, SchedulerConfig, SubmitError,
};
use kiln_text::Message;

const N_CTX: usize = 1024;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn load() -> Result<Llm<CpuBackend>, RuntimeError> {
    let path = kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap();
    Llm::load(CpuBackend::new(default_threads()), &path)
}

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
    "Why is the sky blue? Answer in one sentence.",
    "List the first five prime numbers.",
];

fn chat(q: &str) -> Vec<Message> {
    vec![Message::new("user", q)]
}

fn opts(max_tokens: usize, sampler: SamplerConfig) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler,
        ..Default::default()
    }
}

/// What one request gets alone, through the plain generation loop.
fn alone(llm: &Llm<CpuBackend>, prompt: &[u32], o: &GenerateOptions) -> (Vec<u32>, String) {
    let mut s = llm.session(N_CTX, 512);
    let mut text = String::new();
    let st = s
        .generate(prompt, o, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    (st.tokens, text)
}

fn submit(s: &Scheduler, prompt: Prompt, o: GenerateOptions) -> Receiver<Event> {
    let (tx, rx) = channel();
    s.submit(Request {
        prompt,
        opts: o,
        sink: Box::new(tx),
    })
    .unwrap();
    rx
}

/// All text, then the completion (panics on an error event).
fn collect(rx: &Receiver<Event>) -> (String, Completion) {
    let mut text = String::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(_) => {}
            Event::Done(c) => return (text, c),
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

fn scheduler(slots: usize, chunk: usize) -> Scheduler {
    Scheduler::spawn(
        SchedulerConfig {
            slots,
            n_ctx: N_CTX,
            prefill_chunk: chunk,
            max_queue: 64,
            timeout: None,
        },
        load,
    )
    .unwrap()
}

#[test]
fn batched_requests_match_single_requests() {
    let _g = serial();
    let llm = load().unwrap();
    let prompts: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| {
            llm.tokenize(&llm.render_chat(&chat(q)).unwrap(), false)
                .unwrap()
        })
        .collect();
    let seeded = SamplerConfig {
        temperature: 0.9,
        seed: 7,
        ..Default::default()
    };
    let mut cases = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        // Half greedy, half seeded sampling; lengths differ so sequences leave at different steps.
        let sampler = if i % 2 == 0 {
            SamplerConfig::greedy()
        } else {
            seeded.clone()
        };
        let o = opts(24 + 4 * i, sampler);
        let want = alone(&llm, p, &o);
        cases.push((p.clone(), o, want));
    }
    drop(llm);
    // 8 slots, prompts prefilled 16 tokens per step over all of them: requests share steps
    // while some still prefill.
    let s = scheduler(8, 16);
    let rxs: Vec<_> = cases
        .iter()
        .map(|(p, o, _)| submit(&s, Prompt::Tokens(p.clone()), o.clone()))
        .collect();
    for ((_, _, (tokens, text)), rx) in cases.iter().zip(&rxs) {
        let (got_text, c) = collect(rx);
        assert_eq!(
            &c.tokens, tokens,
            "batched tokens differ from the single run"
        );
        assert_eq!(&got_text, text);
        assert_eq!(c.completion_tokens, tokens.len());
    }
    assert!(
        s.stats().steps.load(std::sync::atomic::Ordering::Relaxed) < 80,
        "requests were not batched"
    );
    // Fewer slots than requests: the rest wait, then join between steps.
    let s = scheduler(3, 64);
    let rxs: Vec<_> = cases
        .iter()
        .map(|(p, o, _)| submit(&s, Prompt::Tokens(p.clone()), o.clone()))
        .collect();
    for ((_, _, (tokens, _)), rx) in cases.iter().zip(&rxs) {
        assert_eq!(&collect(rx).1.tokens, tokens);
    }
}

#[test]
fn prefix_cache_and_stop_strings() {
    let _g = serial();
    let s = scheduler(2, 64);
    let system = "You are a concise assistant. Answer in one short sentence, without any \
        preamble, and never ask a question back.";
    let conv = |q: &str| {
        Prompt::Chat(vec![
            Message::new("system", system),
            Message::new("user", q),
        ])
    };
    let o = opts(16, SamplerConfig::greedy());
    let (a, c1) = collect(&submit(
        &s,
        conv("What is the capital of France?"),
        o.clone(),
    ));
    assert!(a.contains("Paris"), "answer: {a}");
    assert_eq!(c1.cached_tokens, 0);
    // The slot holding the longest start of the prompt takes it: the system prompt is reused.
    let (b, c2) = collect(&submit(
        &s,
        conv("What is the capital of Italy?"),
        o.clone(),
    ));
    assert!(
        c2.cached_tokens >= 20,
        "the system prompt was not reused: {c2:?}"
    );
    // The same request again: all but the last prompt token come from the cache, same answer.
    let (b3, c3) = collect(&submit(
        &s,
        conv("What is the capital of Italy?"),
        o.clone(),
    ));
    assert_eq!(b3, b);
    assert_eq!(c3.cached_tokens, c3.prompt_tokens - 1);
    // A stop string cuts the answer before it.
    let stop = GenerateOptions {
        stop: vec!["Paris".into()],
        ..o.clone()
    };
    let (a4, c4) = collect(&submit(&s, conv("What is the capital of France?"), stop));
    assert_eq!(c4.finish, FinishReason::Stop);
    assert!(
        !a4.contains("Paris") && a.starts_with(&a4),
        "{a4:?} vs {a:?}"
    );
    let (_, c5) = collect(&submit(&s, Prompt::Text("Once upon a time".into()), o));
    assert_eq!(c5.finish, FinishReason::MaxTokens);
    assert_eq!(c5.completion_tokens, 16);
}

/// A request whose system prompt a running request holds in another slot gets that start
/// copied into its own slot (not prefilled again), and both get what they get alone.
#[test]
fn prefix_copied_from_a_running_slot() {
    let _g = serial();
    let llm = load().unwrap();
    let system = "You are a concise assistant. Answer in one short sentence, without any \
        preamble, and never ask a question back.";
    let conv = |q: &str| vec![Message::new("system", system), Message::new("user", q)];
    let ids = |m: &[Message]| llm.tokenize(&llm.render_chat(m).unwrap(), false).unwrap();
    let (pa, pb) = (
        ids(&conv("Tell me a long story about a lighthouse.")),
        ids(&conv("What is the capital of Italy?")),
    );
    let (oa, ob) = (
        opts(160, SamplerConfig::greedy()),
        opts(16, SamplerConfig::greedy()),
    );
    let (want_a, want_b) = (alone(&llm, &pa, &oa).0, alone(&llm, &pb, &ob).0);
    drop(llm);
    // Chunks of 16: the system prompt spans whole ones, and only whole chunks are copied.
    let s = scheduler(2, 16);
    let ra = submit(&s, Prompt::Tokens(pa), oa);
    // A is decoding (its prompt in slot 0) when B arrives: B takes the other slot.
    match ra.recv_timeout(Duration::from_secs(120)).expect("event") {
        Event::Text(_) => {}
        e => panic!("expected text first: {e:?}"),
    }
    let (_, cb) = collect(&submit(&s, Prompt::Tokens(pb), ob));
    assert!(
        cb.cached_tokens >= 16 && cb.cached_tokens % 16 == 0,
        "the running request's system prompt was not copied in whole chunks: {cb:?}"
    );
    assert_eq!(cb.tokens, want_b);
    let (_, ca) = collect(&ra);
    // A's first token came before collect(); the rest as alone.
    assert_eq!(ca.tokens, want_a);
}

/// A sink whose receiver is gone as soon as `closed` is set.
struct Dropping(std::sync::Arc<std::sync::atomic::AtomicBool>);
impl EventSink for Dropping {
    fn send(&mut self, _: Event) -> bool {
        !self.closed()
    }
    fn closed(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn disconnects_free_slots_and_bad_requests_are_refused() {
    let _g = serial();
    let s = Scheduler::spawn(
        SchedulerConfig {
            slots: 1,
            n_ctx: 64,
            prefill_chunk: 32,
            max_queue: 2,
            timeout: None,
        },
        load,
    )
    .unwrap();
    let long = opts(100_000, SamplerConfig::greedy());
    // A request whose client leaves at once: its slot serves the next one.
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    s.submit(Request {
        prompt: Prompt::Text("Count to a thousand:".into()),
        opts: long.clone(),
        sink: Box::new(Dropping(gone.clone())),
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    let t = Instant::now();
    let (_, c) = collect(&submit(
        &s,
        Prompt::Text("Hello".into()),
        opts(4, SamplerConfig::greedy()),
    ));
    assert_eq!(c.completion_tokens, 4);
    assert!(t.elapsed() < Duration::from_secs(20));
    // The context fills: finish reason ContextFull.
    let (_, c) = collect(&submit(
        &s,
        Prompt::Text("Count to a thousand:".into()),
        long.clone(),
    ));
    assert_eq!(c.finish, FinishReason::ContextFull);
    assert_eq!(c.prompt_tokens + c.completion_tokens, 64 + 1);
    // Bad prompts: one error event each.
    let too_long = Prompt::Text("word ".repeat(100));
    for (p, what) in [
        (too_long, "context holds 64"),
        (Prompt::Tokens(vec![]), "empty"),
        (Prompt::Tokens(vec![u32::MAX]), "outside the vocabulary"),
    ] {
        match submit(&s, p, long.clone()).recv().unwrap() {
            Event::Error(e) => assert!(e.to_string().contains(what), "{e}"),
            e => panic!("expected an error, got {e:?}"),
        }
    }
    // The queue holds two waiting requests: a third is refused. The slot is taken first (its
    // request has produced text), so all three wait whatever the engine thread's timing.
    let blocker = submit(
        &s,
        Prompt::Text("Count to a thousand:".into()),
        long.clone(),
    );
    match blocker
        .recv_timeout(Duration::from_secs(120))
        .expect("event")
    {
        Event::Text(_) => {}
        e => panic!("expected text, got {e:?}"),
    }
    let busy: Vec<_> = (0..3)
        .map(|_| {
            let (tx, rx) = channel();
            let r = s.submit(Request {
                prompt: Prompt::Text("Count to a thousand:".into()),
                opts: opts(40, SamplerConfig::greedy()),
                sink: Box::new(tx),
            });
            (r, rx)
        })
        .collect();
    let refused = busy
        .iter()
        .filter(|(r, _)| *r == Err(SubmitError::QueueFull))
        .count();
    assert!(refused >= 1, "a full queue must refuse");
    collect(&blocker);
    for (r, rx) in &busy {
        if r.is_ok() {
            collect(rx);
        }
    }
}

/// A request that outlives the scheduler's timeout ends there, as if out of tokens, and the
/// slot serves the next request.
#[test]
fn a_request_past_its_timeout_ends() {
    let _g = serial();
    let s = Scheduler::spawn(
        SchedulerConfig {
            slots: 1,
            n_ctx: N_CTX,
            prefill_chunk: 32,
            max_queue: 4,
            timeout: Some(Duration::from_millis(300)),
        },
        load,
    )
    .unwrap();
    let o = opts(200, SamplerConfig::greedy());
    let long = Prompt::Text("Once upon a time".into());
    let t0 = std::time::Instant::now();
    let (_, c) = collect(&submit(&s, long.clone(), o.clone()));
    assert_eq!(c.finish, FinishReason::MaxTokens);
    assert!(c.completion_tokens < 200, "{} tokens", c.completion_tokens);
    assert!(t0.elapsed() < Duration::from_secs(30));
    // The slot is free again.
    let (_, c2) = collect(&submit(&s, long, opts(2, SamplerConfig::greedy())));
    assert_eq!(c2.completion_tokens, 2);
}

/// A sink on hold while `hold` is set.
struct Holding {
    tx: std::sync::mpsc::Sender<Event>,
    hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
impl EventSink for Holding {
    fn send(&mut self, e: Event) -> bool {
        self.tx.send(e).is_ok()
    }
    fn closed(&self) -> bool {
        false
    }
    fn held(&self) -> bool {
        self.hold.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn a_held_request_waits_and_the_others_go_on() {
    let _g = serial();
    let llm = load().unwrap();
    let o = opts(12, SamplerConfig::greedy());
    let prompt = |q: &str| {
        llm.tokenize(&llm.render_chat(&chat(q)).unwrap(), false)
            .unwrap()
    };
    let (want, _) = alone(&llm, &prompt(QUESTIONS[0]), &o);
    drop(llm);
    let s = scheduler(2, 128);
    let hold = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (tx, held_rx) = channel();
    s.submit(Request {
        prompt: Prompt::Chat(chat(QUESTIONS[0])),
        opts: o.clone(),
        sink: Box::new(Holding {
            tx,
            hold: hold.clone(),
        }),
    })
    .unwrap();
    // Another request runs to its end meanwhile; the held one has not started.
    let (_, c) = collect(&submit(&s, Prompt::Chat(chat(QUESTIONS[1])), o.clone()));
    assert_eq!(c.completion_tokens, 12);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        held_rx.try_recv().is_err(),
        "a held request produced output"
    );
    // Released, it gets what it gets alone.
    hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let (_, c) = collect(&held_rx);
    assert_eq!(c.tokens, want);
}
