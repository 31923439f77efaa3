//! Constrained decoding, log-probabilities and logit bias on SmolLM2-135M-Instruct: every
//! token's bytes as grammars see them; JSON-schema answers that parse and validate at
//! temperature 1; Lark grammars and regexes matched; constrained requests batched by the
//! scheduler get what they get alone; logprobs equal the log-softmax of the model's logits;
//! bad grammars are errors that say why.

use std::sync::mpsc::{channel, Receiver};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::{
    Completion, Event, GenerateOptions, Grammar, Llm, Prompt, Request, RuntimeError, SamplerConfig,
    Scheduler, SchedulerConfig, TokenLogprob,
};
use kiln_text::{Message, Tokenizer};
use serde_json::{json, Value};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn load() -> Result<Llm<CpuBackend>, RuntimeError> {
    let path = kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap();
    Llm::load(CpuBackend::new(default_threads()), &path)
}

fn llm() -> &'static Llm<CpuBackend> {
    static L: OnceLock<Llm<CpuBackend>> = OnceLock::new();
    L.get_or_init(|| load().unwrap())
}

fn prompt(llm: &Llm<CpuBackend>, q: &str) -> Vec<u32> {
    llm.tokenize(&llm.render_chat(&[Message::new("user", q)]).unwrap(), false)
        .unwrap()
}

fn run(llm: &Llm<CpuBackend>, q: &str, o: &GenerateOptions) -> (String, FinishOf) {
    let mut s = llm.session(1024, 512);
    let mut text = String::new();
    let st = s
        .generate(&prompt(llm, q), o, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    (text, FinishOf(format!("{:?}", st.finish), st.tokens))
}

#[derive(Debug)]
struct FinishOf(String, Vec<u32>);

const PERSON: &str = r#"{
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": false
}"#;

/// The PERSON schema, checked by hand: exactly its keys, each of its type and range.
fn valid_person(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    if keys != ["name", "age", "hobbies"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 40 {
        return Err("name too long".into());
    }
    let age = o["age"].as_i64().ok_or("age is not an integer")?;
    if !(0..=150).contains(&age) {
        return Err(format!("age {age}"));
    }
    let h = o["hobbies"].as_array().ok_or("hobbies is not an array")?;
    if h.len() > 3
        || h.iter()
            .any(|x| x.as_str().is_none_or(|s| s.chars().count() > 30))
    {
        return Err(format!("hobbies {h:?}"));
    }
    Ok(())
}

fn schema() -> Grammar {
    Grammar::JsonSchema(serde_json::from_str(PERSON).unwrap())
}

#[test]
fn token_bytes_spell_text_for_gguf_and_json_vocabularies() {
    let gguf = &llm().tokenizer;
    let qwen = kiln_assets::resolve("qwen3-tokenizer", &mut |_| {}).unwrap();
    let json = Tokenizer::from_file(&qwen).unwrap();
    for (name, tok) in [("smollm2 gguf", gguf), ("qwen3 tokenizer.json", &json)] {
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size(), "{name}");
        let text = "Hello, wörld! 1234 — naïve café 東京 \n\tcode(x) {\"a\": [1, 2]}";
        let ids = tok.encode(text, false).unwrap();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&i| bytes[i as usize].clone())
            .collect();
        assert_eq!(String::from_utf8(spelled).unwrap(), text, "{name}");
        // Every ordinary token that decodes to whole characters decodes to its bytes.
        let mut checked = 0;
        for (id, b) in bytes.iter().enumerate() {
            let d = tok.decode(&[id as u32], false).unwrap();
            if b.first() == Some(&0xFF) || d.contains('\u{FFFD}') || b.is_empty() {
                continue;
            }
            assert_eq!(d.as_bytes(), &b[..], "{name}: id {id}");
            checked += 1;
        }
        assert!(checked > tok.vocab_size() * 9 / 10, "{name}: {checked}");
        // End-of-generation tokens are special: never matched by text.
        for id in tok.eog_ids() {
            assert_eq!(bytes[id as usize].first(), Some(&0xFF), "{name}: eog {id}");
        }
    }
}

/// kiln's slices (bounded string bodies added to llguidance's) change how masks are computed,
/// never what they are: the same masks at every step of random walks through a schema of
/// bounded strings, on the Qwen3 vocabulary (151,936 ids, byte-level pieces of characters).
#[test]
fn bounded_string_slices_give_the_same_masks() {
    let qwen = kiln_assets::resolve("qwen3-tokenizer", &mut |_| {}).unwrap();
    let tok = Tokenizer::from_file(&qwen).unwrap();
    let ours = kiln_runtime::grammar::Grammars::new(&tok).unwrap();
    let theirs = kiln_runtime::grammar::Grammars::with_llguidance_slices(&tok).unwrap();
    let people = json!({"type": "array", "minItems": 3, "items": {"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12},
            "city": {"type": "string", "minLength": 2, "maxLength": 5},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "city", "age"], "additionalProperties": false}});
    let g = Grammar::JsonSchema(people);
    let (mut a, mut b) = (ours.compile(&g).unwrap(), theirs.compile(&g).unwrap());
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let (mut steps, mut in_strings) = (0, 0);
    while steps < 400 {
        let (wa, wb) = (
            a.allowed_words().unwrap().to_vec(),
            b.allowed_words().unwrap(),
        );
        assert_eq!(wa, wb, "step {steps}");
        let allowed: Vec<u32> = (0..wa.len() * 32)
            .filter(|&i| wa[i / 32] >> (i % 32) & 1 == 1)
            .map(|i| i as u32)
            .collect();
        in_strings += (allowed.len() > 10_000) as usize;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let t = allowed[(rng % allowed.len() as u64) as usize];
        if ours.is_end(t) || a.accept(t).is_err() || a.done() {
            a.reset().unwrap();
            b.reset().unwrap();
        } else {
            b.accept(t).unwrap();
        }
        steps += 1;
    }
    // Many steps are inside strings, where the slices apply.
    assert!(in_strings > 40, "{in_strings} steps in strings");
}

/// A mask worker (masks computed on a copy of the constraint, on a thread of its own) gives
/// each step the mask of that step, also after steps whose forward ended first and took the
/// raw pick (the worker's mask then in flight is dropped): along a random walk through a
/// schema of bounded strings, every mask taken equals one computed on a copy that took the
/// same tokens; a raw pick the grammar allows is taken as it is, one it does not is refused.
#[test]
fn mask_worker_gives_each_step_its_own_mask() {
    use kiln_runtime::grammar::{Grammars, MaskWorker};
    let qwen = kiln_assets::resolve("qwen3-tokenizer", &mut |_| {}).unwrap();
    let tok = Tokenizer::from_file(&qwen).unwrap();
    let grammars = Grammars::new(&tok).unwrap();
    let g = Grammar::JsonSchema(json!({"type": "array", "minItems": 3, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": false}}));
    let (mut c, mut reference) = (grammars.compile(&g).unwrap(), grammars.compile(&g).unwrap());
    let mut worker = MaskWorker::new(c.fork());
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut raw_taken, mut raw_refused, mut waited) = (0, 0, 0);
    // Which of the two comes first depends on timing (a mask inside a string takes the
    // worker milliseconds; most others microseconds): steps go on until each case was seen
    // often enough.
    let mut step = 0;
    while (waited < 30 || raw_taken < 30 || raw_refused < 30) && step < 20_000 {
        step += 1;
        // The step's forward ends first (a random raw pick), or its mask does.
        let first = next() % 3 != 0;
        // Half the raw picks drawn among the tokens the grammar allows, half from the whole
        // vocabulary.
        let (vocab, among_allowed) = (grammars.vocab() as u64, next() % 2 == 0);
        let (mut raw, mut raw_called) = ((next() % vocab) as u32, false);
        let got = worker.mask_or_raw(
            &mut c,
            || first,
            |allowed| {
                raw_called = true;
                if among_allowed {
                    let w = reference.allowed_words().unwrap();
                    let ids: Vec<u32> = (0..w.len() as u32 * 32)
                        .filter(|&i| w[i as usize / 32] >> (i % 32) & 1 == 1)
                        .collect();
                    raw = ids[(next() % ids.len() as u64) as usize];
                }
                allowed(raw).then_some(raw)
            },
        );
        let want = reference.allowed_words().unwrap().to_vec();
        let allows = |t: u32| want[t as usize / 32] >> (t % 32) & 1 == 1;
        let t = match got {
            Some(t) => {
                assert!(first && t == raw && allows(t), "step {step}: took {t}");
                raw_taken += 1;
                t
            }
            None => {
                assert_eq!(c.allowed_words().unwrap(), &want[..], "step {step}");
                match raw_called && !allows(raw) {
                    true => raw_refused += 1,
                    false => waited += 1,
                }
                let allowed: Vec<u32> =
                    (0..want.len() as u32 * 32).filter(|&i| allows(i)).collect();
                allowed[(next() % allowed.len() as u64) as usize]
            }
        };
        if grammars.is_end(t) || c.accept(t).is_err() || c.done() {
            c.reset().unwrap();
            reference.reset().unwrap();
            worker.reset();
        } else {
            reference.accept(t).unwrap();
            worker.accept(t);
        }
    }
    eprintln!(
        "{step} steps: {waited} masks taken, {raw_taken} raw picks taken, {raw_refused} refused"
    );
    assert!(waited >= 30 && raw_taken >= 30 && raw_refused >= 30);
}

#[test]
fn json_schema_answers_are_valid_when_sampled() {
    let _g = serial();
    let llm = llm();
    for seed in 0..20 {
        let o = GenerateOptions {
            max_tokens: 120,
            grammar: Some(schema()),
            sampler: SamplerConfig {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            },
            ..Default::default()
        };
        let (text, f) = run(llm, "Invent a person: name, age and hobbies.", &o);
        assert_eq!(f.0, "Stop", "seed {seed}: {text:?}");
        valid_person(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
    }
}

#[test]
fn lark_grammars_regexes_and_json_objects_are_followed() {
    let _g = serial();
    let llm = llm();
    let greedy = |g: Grammar| GenerateOptions {
        max_tokens: 40,
        grammar: Some(g),
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let (t, _) = run(
        llm,
        "Is the sky blue?",
        &greedy(Grammar::Lark(r#"start: ("yes" | "no") "." "#.into())),
    );
    assert!(t == "yes." || t == "no.", "{t:?}");
    let (t, _) = run(
        llm,
        "What is 12 times 12?",
        &greedy(Grammar::Regex("The answer is [0-9]{1,4}\\.".into())),
    );
    assert!(
        t.starts_with("The answer is ")
            && t.ends_with('.')
            && t[14..t.len() - 1].parse::<u32>().is_ok(),
        "{t:?}"
    );
    let (t, f) = run(llm, "Describe a cat.", &greedy(Grammar::JsonObject));
    if f.0 == "Stop" {
        assert!(
            serde_json::from_str::<Value>(&t).unwrap().is_object(),
            "{t:?}"
        );
    } else {
        assert!(t.starts_with('{'), "{t:?}");
    }
}

#[test]
fn bad_grammars_are_errors_that_say_why() {
    let llm = llm();
    let bad = [
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::Regex("(unclosed".into()),
        Grammar::JsonSchema(json!({"type": "no-such-type"})),
    ];
    for g in bad {
        match llm.constraint(&g) {
            Err(RuntimeError::Grammar(m)) => assert!(!m.is_empty() && !m.contains('\n'), "{m}"),
            Err(e) => panic!("{g:?}: {e}"),
            Ok(_) => panic!("{g:?} compiled"),
        }
    }
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

fn collect(rx: &Receiver<Event>) -> (String, Vec<TokenLogprob>, Completion) {
    let mut text = String::new();
    let mut lps = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(l) => lps.push(l),
            Event::Done(c) => return (text, lps, c),
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

#[test]
fn batched_constrained_requests_equal_their_single_runs() {
    let _g = serial();
    let s = Scheduler::spawn(
        SchedulerConfig {
            slots: 4,
            n_ctx: 1024,
            prefill_chunk: 64,
            max_queue: 16,
            timeout: None,
        },
        load,
    )
    .unwrap();
    let llm = llm();
    let cases: Vec<(&str, GenerateOptions)> = (0..4)
        .map(|i| {
            let o = GenerateOptions {
                max_tokens: 100,
                grammar: Some(schema()),
                sampler: SamplerConfig {
                    temperature: 0.9,
                    seed: 11 + i,
                    ..Default::default()
                },
                ..Default::default()
            };
            ("Invent a person: name, age and hobbies.", o)
        })
        .chain([(
            // Greedy: the raw pick checked first, the mask only on a miss.
            "Invent a person: name, age and hobbies.",
            GenerateOptions {
                max_tokens: 100,
                grammar: Some(schema()),
                sampler: SamplerConfig::greedy(),
                ..Default::default()
            },
        )])
        .chain([(
            "Name three primary colors.",
            GenerateOptions {
                max_tokens: 24,
                sampler: SamplerConfig::greedy(),
                ..Default::default()
            },
        )])
        .collect();
    let rxs: Vec<_> = cases
        .iter()
        .map(|(q, o)| submit(&s, Prompt::Chat(vec![Message::new("user", *q)]), o.clone()))
        .collect();
    for ((q, o), rx) in cases.iter().zip(rxs) {
        let (text, _, c) = collect(&rx);
        let (alone, f) = run(llm, q, o);
        assert_eq!(text, alone, "{q}");
        assert_eq!(c.tokens, f.1, "{q}");
        if o.grammar.is_some() {
            valid_person(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        }
    }
}

#[test]
fn logprobs_are_the_models_log_softmax_and_bias_moves_picks() {
    let _g = serial();
    let s = Scheduler::spawn(
        SchedulerConfig {
            slots: 2,
            n_ctx: 512,
            prefill_chunk: 64,
            max_queue: 16,
            timeout: None,
        },
        load,
    )
    .unwrap();
    let llm = llm();
    let p = prompt(llm, "What is the capital of France?");
    let o = GenerateOptions {
        max_tokens: 12,
        logprobs: Some(4),
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let (_, lps, c) = collect(&submit(&s, Prompt::Tokens(p.clone()), o));
    assert_eq!(lps.len(), c.tokens.len());
    // The reference: the model's logits at each position, through a plain session.
    let mut sess = llm.session(512, 512);
    let v = llm.model.cfg.vocab_size;
    let mut all = p.clone();
    all.extend_from_slice(&c.tokens[..c.tokens.len() - 1]);
    let logits = sess.eval(&all, true).unwrap();
    let cols = llm.sample_vocab();
    for (k, lp) in lps.iter().enumerate() {
        let row = &logits[(p.len() - 1 + k) * v..][..cols];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + row
            .iter()
            .map(|&x| ((x - m) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
        assert_eq!(lp.token, c.tokens[k]);
        assert!(
            (lp.logprob - (row[lp.token as usize] - lse)).abs() < 1e-3,
            "{k}: {lp:?}"
        );
        assert_eq!(lp.top.len(), 4);
        assert_eq!(lp.top[0].0, lp.token, "greedy picks the most likely");
        for w in lp.top.windows(2) {
            assert!(w[0].2 >= w[1].2);
        }
        for (id, bytes, x) in &lp.top {
            assert!((x - (row[*id as usize] - lse)).abs() < 1e-3);
            assert_eq!(bytes, &llm.token_bytes(*id));
        }
    }
    // A +100 bias on a token nobody would pick makes it the first token.
    let odd = llm.tokenize(" zebra", false).unwrap()[0];
    let o = GenerateOptions {
        max_tokens: 1,
        logit_bias: vec![(odd, 100.0)],
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let (_, _, c) = collect(&submit(&s, Prompt::Tokens(p.clone()), o.clone()));
    assert_eq!(c.tokens, [odd]);
    let (_, f) = run(llm, "What is the capital of France?", &o);
    assert_eq!(f.1, [odd]);
}
