//! What apps write against, over real HTTP: structured outputs (json_object, json_schema on
//! 50 sampled answers), tool calls (required, named, streamed, the result fed back) with
//! SmolLM2 (a template without tools: described in the system message) and with a tiny
//! random Qwen3 under the real Qwen3 template (its own `<tool_call>` format), logprobs,
//! logit_bias, one rule for unknown fields, OpenAI-shaped 405s, the over-context `param`,
//! embeddings (OpenAI's and Ollama's routes, equal to the model's own), and Ollama's
//! `/api/*` routes.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;

use common::{http, serial, spawn, sse_events, Reply};
use kiln_backend::cpu::{default_threads, CpuBackend};
use kiln_runtime::{Llm, RuntimeError, SchedulerConfig};
use kiln_server::ServerConfig;
use serde_json::{json, Value};

const MODEL: &str = "smollm2-135m-instruct";

fn sched() -> SchedulerConfig {
    SchedulerConfig {
        slots: 8,
        n_ctx: 1024,
        prefill_chunk: 64,
        max_queue: 64,
        timeout: None,
    }
}

fn cfg(id: &str) -> ServerConfig {
    ServerConfig {
        model_id: id.into(),
        api_key: None,
        max_body: 1 << 20,
    }
}

fn smollm2() -> Result<Llm<CpuBackend>, RuntimeError> {
    let path = kiln_assets::resolve(MODEL, &mut |_| {}).unwrap();
    Llm::load(CpuBackend::new(default_threads()), &path)
}

fn server() -> SocketAddr {
    static S: OnceLock<SocketAddr> = OnceLock::new();
    *S.get_or_init(|| spawn(smollm2, sched(), cfg(MODEL)))
}

/// The tiny random Qwen3 of the model tests, with the real Qwen3 chat template.
fn tiny_qwen3() -> Result<Llm<CpuBackend>, RuntimeError> {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-models/tests/fixtures/hf/qwen3");
        let d = tempfile::tempdir().unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "generation_config.json",
        ] {
            if src.join(f).exists() {
                std::fs::copy(src.join(f), d.path().join(f)).unwrap();
            }
        }
        let tok = kiln_assets::resolve("qwen3-tokenizer", &mut |_| {}).unwrap();
        let real: Value = serde_json::from_str(
            &std::fs::read_to_string(tok.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        let mut c: Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        c["chat_template"] = real["chat_template"].clone();
        std::fs::write(d.path().join("tokenizer_config.json"), c.to_string()).unwrap();
        d
    });
    Llm::load(CpuBackend::new(default_threads()), dir.path())
}

fn post_to(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    http(addr, "POST", path, &[], body.to_string().as_bytes())
}

fn post(path: &str, body: &Value) -> Reply {
    post_to(server(), path, body)
}

fn user(q: &str) -> Value {
    json!([{"role": "user", "content": q}])
}

const PERSON: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
    "required": ["name", "age", "hobbies"], "additionalProperties": false}"#;

/// The PERSON schema, checked by hand.
fn valid_person(text: &str) -> bool {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys == ["name", "age", "hobbies"]
        && o["name"].as_str().is_some_and(|s| s.chars().count() <= 40)
        && o["age"].as_i64().is_some_and(|a| (0..=150).contains(&a))
        && o["hobbies"].as_array().is_some_and(|h| {
            h.len() <= 3
                && h.iter()
                    .all(|x| x.as_str().is_some_and(|s| s.chars().count() <= 30))
        })
}

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time now.",
        "parameters": {"type": "object", "properties": {}}}}])
}

#[test]
fn json_schema_answers_validate_on_50_samples() {
    let _g = serial();
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true,
        "schema": serde_json::from_str::<Value>(PERSON).unwrap()}});
    // Eight at a time: the scheduler batches constrained requests like any others.
    let answers: Vec<(String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let fmt = fmt.clone();
                s.spawn(move || {
                    (0..50)
                        .filter(|i| i % 8 == t)
                        .map(|i| {
                            let v = post(
                                "/v1/chat/completions",
                                &json!({
                                "messages": user("Invent a person: name, age and hobbies."),
                                "temperature": 1.0, "seed": i, "max_tokens": 150,
                                "response_format": fmt}),
                            )
                            .json();
                            let c = &v["choices"][0];
                            (
                                c["message"]["content"].as_str().unwrap_or("").to_string(),
                                c["finish_reason"].as_str().unwrap_or("").to_string(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(answers.len(), 50);
    for (text, finish) in &answers {
        assert_eq!(finish, "stop", "{text:?}");
        assert!(valid_person(text), "{text:?}");
    }
    // json_object: any object.
    let v = post(
        "/v1/chat/completions",
        &json!({"messages": user("Describe a cat."),
        "temperature": 0, "max_tokens": 200, "response_format": {"type": "json_object"}}),
    )
    .json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }
    // Completions take response_format too.
    let v = post(
        "/v1/completions",
        &json!({"prompt": "A person as JSON:", "temperature": 0,
        "max_tokens": 150, "response_format": fmt}),
    )
    .json();
    assert!(
        valid_person(v["choices"][0]["text"].as_str().unwrap()),
        "{v}"
    );
}

/// The one call of a non-streamed answer: (id, name, arguments).
fn one_call(v: &Value) -> (String, String, Value) {
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    let f = &calls[0]["function"];
    assert_eq!(calls[0]["type"], "function");
    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
    (
        calls[0]["id"].as_str().unwrap().to_string(),
        f["name"].as_str().unwrap().to_string(),
        args,
    )
}

/// Tool calls assembled from a stream's deltas, and its finish reason.
fn streamed_calls(body: &str) -> (Vec<(String, String, String)>, String) {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = String::new();
    for e in sse_events(body) {
        let c = &e["choices"][0];
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push(Default::default());
            }
            let call = &mut calls[i];
            if let Some(id) = d["id"].as_str() {
                call.0 = id.into();
            }
            if let Some(n) = d["function"]["name"].as_str() {
                call.1.push_str(n);
            }
            if let Some(a) = d["function"]["arguments"].as_str() {
                call.2.push_str(a);
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.into();
        }
    }
    (calls, finish)
}

/// A round trip on `addr`: a required call (streamed and not equal), its result fed back,
/// an answer in text.
fn tool_round_trip(addr: SocketAddr) {
    let ask = user("What is the weather in Paris?");
    let body = json!({"messages": ask, "tools": weather(), "tool_choice":
        {"type": "function", "function": {"name": "get_weather"}}, "temperature": 0, "max_tokens": 100});
    let v = post_to(addr, "/v1/chat/completions", &body).json();
    let (id, name, args) = one_call(&v);
    assert_eq!(name, "get_weather");
    assert!(args["city"].is_string(), "{args}");
    assert!(args.as_object().unwrap().len() == 1, "{args}");
    assert!(v["choices"][0]["message"]["content"].is_null(), "{v}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = post_to(addr, "/v1/chat/completions", &sb);
    let (calls, finish) = streamed_calls(&r.body);
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "get_weather");
    assert!(!calls[0].0.is_empty());
    assert_eq!(serde_json::from_str::<Value>(&calls[0].2).unwrap(), args);
    // The result back, the model answers in text.
    let mut msgs = ask.as_array().unwrap().clone();
    msgs.push(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
        "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}),
    );
    msgs.push(json!({"role": "tool", "tool_call_id": id, "content": "{\"sky\": \"sunny\", \"celsius\": 21}"}));
    let v = post_to(
        addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "tools": weather(),
        "tool_choice": "none", "temperature": 0, "max_tokens": 30}),
    )
    .json();
    let c = &v["choices"][0];
    assert!(
        c["message"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    assert!(c["message"].get("tool_calls").is_none(), "{v}");
    // required: any of the tools, possibly several.
    let v = post_to(
        addr,
        "/v1/chat/completions",
        &json!({"messages": user("Weather in Oslo and the time?"),
        "tools": weather(), "tool_choice": "required", "parallel_tool_calls": false,
        "temperature": 0, "max_tokens": 100}),
    )
    .json();
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty());
    for c in calls {
        let n = c["function"]["name"].as_str().unwrap();
        assert!(n == "get_weather" || n == "get_time", "{n}");
        serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap()).unwrap();
    }
}

#[test]
fn tool_calls_with_a_template_without_tools() {
    let _g = serial();
    tool_round_trip(server());
    // auto: the model may answer in text; whatever it says is text or well-formed calls.
    let v = post(
        "/v1/chat/completions",
        &json!({"messages": user("Hello!"),
        "tools": weather(), "temperature": 0, "max_tokens": 30}),
    )
    .json();
    let c = &v["choices"][0];
    assert!(
        c["message"]["content"].is_string() || c["message"]["tool_calls"].is_array(),
        "{v}"
    );
}

#[test]
fn tool_calls_with_the_qwen3_template() {
    let _g = serial();
    let addr = spawn(tiny_qwen3, sched(), cfg("tiny-qwen3"));
    tool_round_trip(addr);
}

#[test]
fn logprobs_and_logit_bias() {
    let _g = serial();
    let v = post(
        "/v1/chat/completions",
        &json!({"messages": user("Say hello."),
        "temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3}),
    )
    .json();
    let c = &v["choices"][0];
    let content = c["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut spelled = Vec::new();
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], t["token"], "greedy: the most likely");
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
        spelled.extend(
            t["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    let text = c["message"]["content"].as_str().unwrap();
    assert!(String::from_utf8(spelled).unwrap().starts_with(text), "{v}");
    // Streamed: the same tokens, spread over the chunks.
    let r = post(
        "/v1/chat/completions",
        &json!({"messages": user("Say hello."),
        "temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3, "stream": true}),
    );
    let streamed: Vec<Value> = sse_events(&r.body)
        .iter()
        .flat_map(|e| {
            e["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(&streamed, content);
    // Completions: the legacy shape.
    let v = post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is",
        "temperature": 0, "max_tokens": 4, "logprobs": 2}),
    )
    .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let joined: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, v["choices"][0]["text"].as_str().unwrap());
    assert_eq!(lp["text_offset"][0], 0);
    // logit_bias: +100 on " zebra" makes it the answer.
    let zebra = {
        let llm = smollm2().unwrap();
        llm.tokenize(" zebra", false).unwrap()[0]
    };
    let v = post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is",
        "temperature": 0, "max_tokens": 1, "logit_bias": {zebra.to_string(): 100}}),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], " zebra", "{v}");
}

#[test]
fn every_field_is_implemented_or_refused_by_name() {
    let _g = serial();
    let chat = "/v1/chat/completions";
    let refused = |body: Value, param: &str| {
        let v = post(chat, &body).assert_error(400);
        assert_eq!(v["error"]["param"], param, "{v}");
    };
    let hi = user("hi");
    refused(json!({"messages": hi, "frobnicate": 1}), "frobnicate");
    refused(json!({"messages": hi, "suffix": "x"}), "suffix");
    refused(
        json!({"messages": hi, "logit_bias": {"x": 1}}),
        "logit_bias",
    );
    // A token the model lacks is refused too (it was dropped).
    let v = post(
        chat,
        &json!({"messages": hi, "logit_bias": {"999999999": 5}}),
    )
    .assert_error(400);
    assert_eq!(v["error"]["param"], "logit_bias", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("logit_bias: token id 999999999 is outside the vocabulary"),
        "{v}"
    );
    refused(json!({"messages": hi, "top_logprobs": 2}), "top_logprobs");
    refused(
        json!({"messages": hi, "response_format": {"type": "yaml"}}),
        "response_format",
    );
    refused(
        json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema":
        {"name": "x", "schema": {"type": "no-such-type"}}}}),
        "response_format",
    );
    refused(
        json!({"messages": [{"role": "wizard", "content": "hi"}]}),
        "messages[0].role",
    );
    refused(
        json!({"messages": [{"role": "user", "content": null}]}),
        "messages[0].content",
    );
    refused(
        json!({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}),
        "messages[0].colour",
    );
    refused(
        json!({"messages": hi, "tools": [{"type": "retrieval"}]}),
        "tools[0]",
    );
    refused(
        json!({"messages": hi, "tools": weather(), "tool_choice":
        {"type": "function", "function": {"name": "nope"}}}),
        "tool_choice",
    );
    refused(
        json!({"messages": [{"role": "tool", "content": "x"}]}),
        "messages[0].tool_call_id",
    );
    // Null means not given; the accepted no-ops change nothing.
    let v = post(
        chat,
        &json!({"messages": hi, "frobnicate": null, "user": "u1",
        "metadata": {"a": "b"}, "temperature": 0, "max_tokens": 3}),
    );
    assert_eq!(v.status, 200, "{}", v.body);
    // Completions: the over-context error names `prompt`.
    let v = post("/v1/completions", &json!({"prompt": "word ".repeat(1100)})).assert_error(400);
    assert_eq!(v["error"]["param"], "prompt");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // A wrong method: 405, as an OpenAI error.
    let v = http(server(), "GET", chat, &[], b"").assert_error(405);
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

/// NDJSON lines of an Ollama stream.
fn ndjson(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
fn ollama_routes() {
    let _g = serial();
    let m = format!("{MODEL}:latest");
    let opts = json!({"temperature": 0, "num_predict": 8});
    let whole = post(
        "/api/chat",
        &json!({"model": m, "messages": user("Say hi."),
        "options": opts, "stream": false}),
    )
    .json();
    assert_eq!(whole["done"], true);
    assert_eq!(whole["message"]["role"], "assistant");
    assert_eq!(whole["eval_count"], 8);
    assert_eq!(whole["done_reason"], "length");
    let r = post(
        "/api/chat",
        &json!({"model": m, "messages": user("Say hi."), "options": opts}),
    );
    assert!(r.headers.contains("application/x-ndjson"), "{}", r.headers);
    let lines = ndjson(&r.body);
    assert!(lines.last().unwrap()["done"] == true && lines.len() > 2);
    let text: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["message"]["content"].as_str().unwrap());
    let g = post(
        "/api/generate",
        &json!({"model": MODEL, "prompt": "Describe a cat as JSON.",
        "format": "json", "stream": false, "options": {"temperature": 0, "num_predict": 120}}),
    )
    .json();
    if g["done_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(g["response"].as_str().unwrap())
                .unwrap()
                .is_object()
        );
    }
    let g = post("/api/generate", &json!({"model": MODEL, "prompt": "A person:", "stream": false,
        "format": serde_json::from_str::<Value>(PERSON).unwrap(), "options": {"temperature": 0, "num_predict": 150}}))
    .json();
    assert!(valid_person(g["response"].as_str().unwrap()), "{g}");
    let tags = http(server(), "GET", "/api/tags", &[], b"").json();
    assert_eq!(tags["models"][0]["name"], MODEL);
    assert!(tags["models"][0]["size"].as_u64().unwrap() > 1 << 20);
    let show = post("/api/show", &json!({"model": MODEL})).json();
    assert!(show["template"].as_str().unwrap().contains("im_start"));
    let ps = http(server(), "GET", "/api/ps", &[], b"").json();
    assert_eq!(ps["models"].as_array().unwrap().len(), 1);
    assert!(http(server(), "GET", "/api/version", &[], b"").json()["version"].is_string());
    // Errors are Ollama's shape, and say what.
    let r = post(
        "/api/chat",
        &json!({"model": MODEL, "messages": user("hi"), "options": {"mirostat": 2}}),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("mirostat"));
    let r = post(
        "/api/chat",
        &json!({"model": "llama9", "messages": user("hi")}),
    );
    assert_eq!(r.status, 404);
    // Tools through Ollama: a call with arguments as an object.
    let t = post(
        "/api/chat",
        &json!({"model": MODEL, "stream": false, "tools": weather(),
        "messages": user("Weather in Oslo?"), "options": {"temperature": 0, "num_predict": 60}}),
    )
    .json();
    if let Some(calls) = t["message"]["tool_calls"].as_array() {
        assert!(calls[0]["function"]["arguments"].is_object(), "{t}");
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn embeddings_openai_and_ollama() {
    let _g = serial();
    let texts = [
        "The cat sat on the mat.",
        "A cat was sitting on a mat.",
        "Stock prices fell sharply today.",
    ];
    let v = post("/v1/embeddings", &json!({"model": MODEL, "input": texts})).json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let e: Vec<Vec<f32>> = data.iter().map(|d| floats(&d["embedding"])).collect();
    let llm = smollm2().unwrap();
    let dim = llm.model.cfg.dim;
    for (i, (d, x)) in data.iter().zip(&e).enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(x.len(), dim);
        assert!((cosine(x, x) - 1.0).abs() < 1e-4, "unit length");
    }
    // The model's own: its session's embedding of the same tokens.
    let ids = llm.tokenize(texts[0], true).unwrap();
    let want = llm.session(ids.len(), 64).embed(&ids).unwrap();
    let err = e[0]
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(err < 1e-5, "{err}");
    let tokens: usize = texts
        .iter()
        .map(|t| llm.tokenize(t, true).unwrap().len())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    // Near texts nearer than far ones.
    assert!(
        cosine(&e[0], &e[1]) > cosine(&e[0], &e[2]),
        "{} {}",
        cosine(&e[0], &e[1]),
        cosine(&e[0], &e[2])
    );
    // base64: the same floats, little-endian.
    let b = post(
        "/v1/embeddings",
        &json!({"input": texts[0], "encoding_format": "base64"}),
    )
    .json();
    let raw = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        b["data"][0]["embedding"].as_str().unwrap(),
    )
    .unwrap();
    let back: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(back, e[0]);
    // dimensions: the first components, unit length again.
    let s = post(
        "/v1/embeddings",
        &json!({"input": texts[0], "dimensions": 64}),
    )
    .json();
    let short = floats(&s["data"][0]["embedding"]);
    assert_eq!(short.len(), 64);
    assert!((cosine(&short, &short) - 1.0).abs() < 1e-4);
    let head = &e[0][..64];
    assert!(cosine(&short, head) / cosine(head, head).sqrt() > 0.9999);
    // Errors name their field.
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": "x", "dimensions": 0}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "colour": 1}), "colour"),
        (json!({"input": "word ".repeat(1100)}), "input"),
    ] {
        let v = post("/v1/embeddings", &body).assert_error(400);
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    // Ollama's routes: the same vectors.
    let o = post("/api/embed", &json!({"model": MODEL, "input": texts})).json();
    let oe: Vec<Vec<f32>> = o["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(oe, e);
    assert_eq!(o["prompt_eval_count"], tokens);
    let l = post(
        "/api/embeddings",
        &json!({"model": MODEL, "prompt": texts[0]}),
    )
    .json();
    assert_eq!(floats(&l["embedding"]), e[0]);
}

#[test]
fn llama_server_tokenize_detokenize_props() {
    let _g = serial();
    let llm = smollm2().unwrap();
    let text = "Hello, wörld! <|im_start|>";
    let want = llm.tokenize(text, false).unwrap();
    let v = post("/tokenize", &json!({"content": text})).json();
    let got: Vec<u32> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(got, want);
    let v = post("/tokenize", &json!({"content": text, "with_pieces": true})).json();
    let pieces = v["tokens"].as_array().unwrap();
    assert_eq!(pieces.len(), want.len());
    assert_eq!(pieces.last().unwrap()["piece"], "<|im_start|>");
    let d = post("/detokenize", &json!({"tokens": want})).json();
    assert_eq!(d["content"], text);
    let v = post("/detokenize", &json!({"tokens": [999_999_999u32]})).assert_error(400);
    assert_eq!(v["error"]["param"], "tokens");
    let p = http(server(), "GET", "/props", &[], b"").json();
    assert_eq!(p["total_slots"], 8);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 1024);
    assert!(p["chat_template"].as_str().unwrap().contains("im_start"));
}
