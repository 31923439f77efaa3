//! The server over real HTTP on an ephemeral port, with SmolLM2-135M-Instruct: chat and
//! completions (streamed and not) answer with the right content, usage and SSE framing;
//! 8 concurrent streamed chats each get exactly what they get alone; bad requests get a
//! 4xx error JSON and the server keeps serving; a client that leaves frees its slot; a full
//! queue answers 429; the API key guards every route.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{connect, http, send, serial, spawn, sse_events, Reply};
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::{Llm, RuntimeError, SchedulerConfig};
use kiln_server::ServerConfig;
use serde_json::{json, Value};

const MODEL: &str = "smollm2-135m-instruct";
const SYSTEM: &str = "You are a helpful assistant.";

fn load() -> Result<Llm<CpuBackend>, RuntimeError> {
    let path = kiln_assets::resolve(MODEL, &mut |_| {}).unwrap();
    Llm::load(CpuBackend::new(default_threads()), &path)
}

/// The shared server: 8 slots of 512 tokens, bodies up to 64 KiB, no key.
fn server() -> SocketAddr {
    static S: OnceLock<SocketAddr> = OnceLock::new();
    *S.get_or_init(|| {
        spawn(
            load,
            SchedulerConfig {
                slots: 8,
                n_ctx: 512,
                prefill_chunk: 64,
                max_queue: 64,
                timeout: None,
            },
            ServerConfig {
                model_id: MODEL.into(),
                api_key: None,
                max_body: 64 << 10,
            },
        )
    })
}

fn post(path: &str, body: &Value) -> Reply {
    http(server(), "POST", path, &[], body.to_string().as_bytes())
}

fn chat_body(q: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": stream},
    })
}

/// Content of a streamed chat, its finish reason, and the usage chunk.
fn stream_content(events: &[Value]) -> (String, String, Option<Value>) {
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = None;
    for e in events {
        assert_eq!(e["object"], "chat.completion.chunk", "{e}");
        let choices = e["choices"].as_array().unwrap();
        if choices.is_empty() {
            usage = Some(e["usage"].clone());
            continue;
        }
        let c = &choices[0];
        if let Some(t) = c["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, usage)
}

fn check_usage(u: &Value) -> (u64, u64) {
    let (p, c, t) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
        u["total_tokens"].as_u64().unwrap(),
    );
    assert!(p > 0 && c > 0 && t == p + c, "{u}");
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            < p
    );
    (p, c)
}

#[test]
fn chat_streamed_and_not_answer_paris() {
    let _g = serial();
    let r = post(
        "/v1/chat/completions",
        &chat_body("What is the capital of France?", 32, false),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let answer = msg["content"].as_str().unwrap().to_string();
    assert!(answer.contains("Paris"), "answer: {answer}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (p, c) = check_usage(&v["usage"]);

    let r = post(
        "/v1/chat/completions",
        &chat_body("What is the capital of France?", 32, true),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.headers.to_ascii_lowercase().contains("text/event-stream"));
    let events = sse_events(&r.body);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let (text, finish, usage) = stream_content(&events);
    assert_eq!(text, answer, "streamed and whole answers differ");
    assert_eq!(finish, "stop");
    let usage = usage.expect("include_usage asks for a usage chunk");
    assert_eq!(check_usage(&usage), (p, c));

    // max_tokens cuts: finish_reason "length", exactly that many tokens.
    let r = post(
        "/v1/chat/completions",
        &chat_body("Tell me a long story.", 5, false),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    // A stop string (one, or a list) ends the answer before it.
    let mut b = chat_body("What is the capital of France?", 32, false);
    b["stop"] = json!(["Paris"]);
    let v = post("/v1/chat/completions", &b).json();
    let cut = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.starts_with(cut) && !cut.contains("Paris"), "{cut:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    b["stop"] = json!("capital");
    let v = post("/v1/chat/completions", &b).json();
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("capital"));
}

#[test]
fn completions_streamed_and_not() {
    let _g = serial();
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "temperature": 0,
        "max_tokens": 6, "seed": 1, "top_p": 0.9, "presence_penalty": 0.1, "frequency_penalty": 0.1});
    let r = post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(check_usage(&v["usage"]).1, 6);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = post("/v1/completions", &sb);
    assert_eq!(r.status, 200);
    let events = sse_events(&r.body);
    let streamed: String = events
        .iter()
        .map(|e| {
            assert_eq!(e["object"], "text_completion");
            e["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    // No include_usage: no usage chunk.
    assert!(events
        .iter()
        .all(|e| !e["choices"].as_array().unwrap().is_empty()));
}

#[test]
fn models_health_and_metrics() {
    let _g = serial();
    let addr = server();
    let v = http(addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    let r = http(addr, "GET", &format!("/v1/models/{MODEL}"), &[], b"");
    assert_eq!(r.json()["id"], MODEL);
    http(addr, "GET", "/v1/models/nope", &[], b"").assert_error(404);
    let h = http(addr, "GET", "/health", &[], b"");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    let m = http(addr, "GET", "/metrics", &[], b"").body;
    for k in [
        "kiln_requests_total{route=\"/v1/completions\",status=\"200\"}",
        "kiln_requests_total{route=\"/health\",status=\"200\"} ",
        "kiln_prompt_tokens_total ",
        "kiln_generated_tokens_total ",
        "kiln_queue_depth ",
        "kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"} ",
        "kiln_request_duration_seconds_count ",
    ] {
        assert!(m.contains(k), "metrics lack {k}:\n{m}");
    }
    let generated: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("kiln_generated_tokens_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(generated >= 2);
}

fn metric(name: &str) -> u64 {
    let m = http(server(), "GET", "/metrics", &[], b"").body;
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap()
        .parse()
        .unwrap()
}

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
    "Why is the sky blue?",
    "List the first five prime numbers.",
];

#[test]
fn eight_concurrent_streams_equal_their_single_runs() {
    let _g = serial();
    let body = |q: &str| {
        let mut b = chat_body(q, 40, true);
        b["messages"] = json!([{"role": "user", "content": q}]);
        b
    };
    let alone: Vec<(String, Value)> = QUESTIONS
        .iter()
        .map(|q| {
            let (t, _, u) =
                stream_content(&sse_events(&post("/v1/chat/completions", &body(q)).body));
            (t, u.unwrap()["completion_tokens"].clone())
        })
        .collect();
    let steps0 = metric("kiln_batch_steps_total");
    let t = Instant::now();
    let handles: Vec<_> = QUESTIONS
        .iter()
        .map(|q| {
            let b = body(q);
            std::thread::spawn(move || post("/v1/chat/completions", &b))
        })
        .collect();
    let together: Vec<Reply> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let steps = metric("kiln_batch_steps_total") - steps0;
    let mut tokens = 0;
    for ((q, (text, n)), r) in QUESTIONS.iter().zip(&alone).zip(&together) {
        assert_eq!(r.status, 200, "{}", r.body);
        let (t, _, u) = stream_content(&sse_events(&r.body));
        assert_eq!(
            &t, text,
            "'{q}': concurrent answer differs from the single one"
        );
        assert_eq!(&u.unwrap()["completion_tokens"], n);
        tokens += n.as_u64().unwrap();
    }
    // Batched: far fewer forward passes than tokens generated.
    assert!(
        steps * 2 < tokens,
        "{steps} steps for {tokens} tokens: not batched ({:?})",
        t.elapsed()
    );
}

#[test]
fn bad_requests_get_error_json_and_the_server_keeps_serving() {
    let _g = serial();
    let addr = server();
    let chat = "/v1/chat/completions";
    http(addr, "POST", chat, &[], b"{\"messages\": [").assert_error(400);
    http(addr, "POST", chat, &[], b"not json at all").assert_error(400);
    post(chat, &json!({"messages": "hello"})).assert_error(400);
    post(chat, &json!({"messages": []})).assert_error(400);
    let v = post(
        chat,
        &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .assert_error(404);
    assert_eq!(v["error"]["code"], "model_not_found");
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(100 << 10)}]});
    http(addr, "POST", chat, &[], big.to_string().as_bytes()).assert_error(413);
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(600)}]});
    let v = post(chat, &long).assert_error(400);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let v = post(
        "/v1/completions",
        &json!({"prompt": "word ".repeat(600), "stream": true}),
    )
    .assert_error(400);
    assert!(v["error"]["message"].as_str().unwrap().contains("context"));
    for bad in [
        json!({"n": 0}),
        json!({"n": 17}),
        json!({"temperature": 7}),
        json!({"max_tokens": 0}),
        json!({"top_p": -1}),
        json!({"stop": 5}),
    ] {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in bad.as_object().unwrap() {
            b[k] = v.clone();
        }
        post(chat, &b).assert_error(400);
    }
    let v = post("/v1/completions", &json!({"prompt": [999999999u32]})).assert_error(400);
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("prompt: token id 999999999 is outside the vocabulary"),
        "{v}"
    );
    http(addr, "GET", "/v1/nothing", &[], b"").assert_error(404);
    // Still serving.
    let r = post(
        chat,
        &chat_body("What is the capital of France?", 16, false),
    );
    assert_eq!(r.status, 200);
    assert!(r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("Paris"));
}

/// `n` choices: each its own sample (seed, seed + 1, ...), indexed, streamed interleaved,
/// the prompt counted once in the usage; at temperature 0 every choice is the greedy answer.
#[test]
fn several_choices_streamed_and_not() {
    let _g = serial();
    let chat = "/v1/chat/completions";
    let one = post(
        chat,
        &chat_body("What is the capital of France?", 12, false),
    )
    .json();
    let greedy = one["choices"][0]["message"]["content"].as_str().unwrap();
    let mut b = chat_body("What is the capital of France?", 12, false);
    b["n"] = json!(2);
    let v = post(chat, &b).json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], greedy, "{v}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        2 * one["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // Sampled: three different answers, each as its seed gives it alone.
    let mut b = chat_body("Write a word.", 12, false);
    b["temperature"] = json!(1.0);
    b["seed"] = json!(7);
    b["n"] = json!(3);
    let v = post(chat, &b).json();
    let texts: Vec<String> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts.len(), 3);
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    let mut alone = b.clone();
    alone["n"] = json!(1);
    alone["seed"] = json!(8);
    let second = post(chat, &alone).json();
    assert_eq!(
        second["choices"][0]["message"]["content"],
        texts[1].as_str()
    );

    // Streamed: the same three, their chunks tagged by index, one usage chunk, then done.
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let r = post(chat, &b);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r.body);
    let mut got = vec![String::new(); 3];
    let mut finished = [0; 3];
    let mut usage = Vec::new();
    for e in &events {
        let cs = e["choices"].as_array().unwrap();
        if cs.is_empty() {
            usage.push(e["usage"].clone());
            continue;
        }
        for c in cs {
            let i = c["index"].as_u64().unwrap() as usize;
            if let Some(t) = c["delta"]["content"].as_str() {
                got[i].push_str(t);
            }
            if c["finish_reason"].is_string() {
                finished[i] += 1;
            }
        }
    }
    assert_eq!(got, texts);
    assert_eq!(finished, [1, 1, 1]);
    assert_eq!(usage.len(), 1, "{events:?}");
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[0][k], v["usage"][k], "{k}");
    }
    assert!(r.body.trim_end().ends_with("data: [DONE]"));
}

/// Reads from a streamed response until the first event has arrived.
fn read_first_event(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    while !String::from_utf8_lossy(&buf).contains("data: ") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "closed before the first event");
        buf.extend_from_slice(&b[..n]);
    }
}

#[test]
fn api_key_queue_full_and_disconnects() {
    let _g = serial();
    let addr = spawn(
        load,
        SchedulerConfig {
            slots: 1,
            n_ctx: 2048,
            prefill_chunk: 64,
            max_queue: 1,
            timeout: None,
        },
        ServerConfig {
            model_id: MODEL.into(),
            api_key: Some("sesame".into()),
            max_body: 1 << 20,
        },
    );
    let auth = [("Authorization", "Bearer sesame")];
    let body = json!({"prompt": "Count from one to one thousand: one, two,", "max_tokens": 1500,
        "temperature": 0, "stream": true})
    .to_string();
    for (path, method) in [
        ("/health", "GET"),
        ("/v1/models", "GET"),
        ("/metrics", "GET"),
    ] {
        http(addr, method, path, &[], b"").assert_error(401);
        http(
            addr,
            method,
            path,
            &[("Authorization", "Bearer wrong")],
            b"",
        )
        .assert_error(401);
        let r = http(
            addr,
            method,
            path,
            &[auth[0], ("Origin", "https://elsewhere.example")],
            b"",
        );
        assert_eq!(r.status, 200);
        // No CORS: a page from another origin gets no permission to read the answer.
        assert!(
            !r.headers
                .to_ascii_lowercase()
                .contains("access-control-allow"),
            "{}",
            r.headers
        );
    }
    http(addr, "POST", "/v1/completions", &[], body.as_bytes()).assert_error(401);

    // A takes the only slot; B waits in the queue (of one); C is refused.
    let mut a = connect(addr);
    send(&mut a, "POST", "/v1/completions", &auth, body.as_bytes());
    read_first_event(&mut a);
    let short = json!({"prompt": "Hello", "max_tokens": 3}).to_string();
    let b = std::thread::spawn(move || {
        http(
            addr,
            "POST",
            "/v1/completions",
            &[("Authorization", "Bearer sesame")],
            short.as_bytes(),
        )
    });
    let t = Instant::now();
    loop {
        let h = http(addr, "GET", "/health", &auth, b"").json();
        if h["queued"] == 1 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "B never queued: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = http(
        addr,
        "POST",
        "/v1/completions",
        &auth,
        br#"{"prompt": "Hi", "max_tokens": 2}"#,
    );
    assert_eq!(c.assert_error(429)["error"]["code"], "queue_full");
    // A's client leaves: its slot goes to B at once, long before A's 1500 tokens.
    drop(a);
    let t = Instant::now();
    let b = b.join().unwrap();
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.json()["usage"]["completion_tokens"], 3);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "slot freed late: {:?}",
        t.elapsed()
    );
    let h = http(addr, "GET", "/health", &auth, b"").json();
    assert_eq!(
        (h["running"].as_u64(), h["queued"].as_u64()),
        (Some(0), Some(0)),
        "{h}"
    );
}
