//! Ollama's API (`/api/*`), so Ollama clients and UIs work against `kiln serve` unchanged:
//! `chat` and `generate` (NDJSON streams, on by default as in Ollama), `tags`, `show`,
//! `ps`, `version`. The same engine, tools and grammars as the OpenAI routes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_runtime::{Completion, Event, GenerateOptions, Grammar, Prompt};
use kiln_text::Message;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::check_unknown;
use crate::error::{invalid, ollama_error, ApiError};
use crate::tools::{self, Format, Piece, Splitter, Tools};
use crate::{engine_error, json_response, parse, read_body, submit, AppState, Kind};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    model: String,
    #[serde(default)]
    messages: Vec<OllamaMessage>,
    tools: Option<Vec<Value>>,
    format: Option<Value>,
    options: Option<Map<String, Value>>,
    stream: Option<bool>,
    keep_alive: Option<Value>,
    think: Option<Value>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct OllamaMessage {
    role: String,
    #[serde(default)]
    content: String,
    tool_calls: Option<Vec<Value>>,
    tool_name: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct GenerateRequest {
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    raw: Option<bool>,
    format: Option<Value>,
    options: Option<Map<String, Value>>,
    stream: Option<bool>,
    keep_alive: Option<Value>,
    think: Option<Value>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct ShowRequest {
    model: Option<String>,
    name: Option<String>,
    verbose: Option<bool>,
}

/// Options that set up a model rather than sample from it: accepted, no effect here.
const LOAD_OPTIONS: &[&str] = &[
    "num_thread",
    "num_gpu",
    "main_gpu",
    "num_batch",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "num_keep",
];

/// Ollama's `options` as generation options over OpenAI-like defaults.
fn options(st: &AppState, o: Option<&Map<String, Value>>) -> Result<GenerateOptions, ApiError> {
    let mut opts = GenerateOptions {
        max_tokens: usize::MAX,
        ..Default::default()
    };
    opts.sampler.temperature = 0.8;
    opts.sampler.top_k = 40;
    opts.sampler.top_p = 0.9;
    opts.sampler.seed = st.seed();
    opts.sampler.repeat_penalty = 1.1;
    let Some(o) = o else {
        return Ok(opts);
    };
    for (k, v) in o {
        if v.is_null() {
            continue;
        }
        let p = format!("options.{k}");
        let num = || {
            v.as_f64()
                .ok_or_else(|| invalid(&p, format!("{p} must be a number")))
        };
        let int = || {
            v.as_i64()
                .ok_or_else(|| invalid(&p, format!("{p} must be an integer")))
        };
        let s = &mut opts.sampler;
        match k.as_str() {
            "temperature" => s.temperature = num()? as f32,
            "top_k" => s.top_k = int()?.max(0) as usize,
            "top_p" => s.top_p = num()? as f32,
            "min_p" => s.min_p = num()? as f32,
            "repeat_penalty" => s.repeat_penalty = num()? as f32,
            "repeat_last_n" => s.repeat_last_n = int()?.max(0) as usize,
            "presence_penalty" => s.presence_penalty = num()? as f32,
            "frequency_penalty" => s.frequency_penalty = num()? as f32,
            "seed" => s.seed = int()? as u64,
            "num_predict" => {
                opts.max_tokens = match int()? {
                    n if n < 0 => usize::MAX,
                    0 => return Err(invalid(&p, "options.num_predict must not be 0")),
                    n => n as usize,
                }
            }
            "stop" => {
                opts.stop = match v {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) => a
                        .iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| invalid(&p, "options.stop must be strings"))?,
                    _ => return Err(invalid(&p, "options.stop must be strings")),
                }
            }
            "num_ctx" => {
                let n = int()?;
                let have = st.sched.info().n_ctx as i64;
                if n > have {
                    return Err(invalid(
                        &p,
                        format!("options.num_ctx {n} is more than this server's context of {have} (kiln serve -c)"),
                    ));
                }
            }
            "mirostat" if num()? == 0.0 => {}
            "typical_p" | "tfs_z" if num()? == 1.0 => {}
            "penalize_newline" if v.as_bool() == Some(false) => {}
            k if LOAD_OPTIONS.contains(&k) => {}
            _ => return Err(invalid(&p, format!("option {k:?} is not supported"))),
        }
    }
    Ok(opts)
}

/// `format`: "json" or a JSON schema.
fn format(v: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Grammar::JsonObject)),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema(v.clone()))),
        Some(v) => Err(invalid(
            "format",
            format!("format must be \"json\" or a JSON schema, got {v}"),
        )),
    }
}

fn no_thinking(think: Option<&Value>) -> Result<(), ApiError> {
    match think {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(_) => Err(invalid("think", "think: kiln does not separate thinking")),
    }
}

/// An Ollama error: `{"error": "..."}`.

pub async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: ChatRequest = parse(&bytes)?;
        st.check_ollama_model(&req.model)?;
        check_unknown(&req.extra, "")?;
        no_thinking(req.think.as_ref())?;
        let _ = &req.keep_alive;
        let template = st.sched.info().chat_template.as_deref();
        let tools = Tools::parse(req.tools.as_ref(), None, None, template)?;
        let fmt = tools
            .as_ref()
            .map_or_else(|| Format::of(template), |t| t.format);
        let mut messages = Vec::new();
        for (i, m) in req.messages.iter().enumerate() {
            let at = format!("messages[{i}]");
            check_unknown(&m.extra, &at)?;
            if !["system", "user", "assistant", "tool"].contains(&m.role.as_str()) {
                return Err(invalid(
                    &format!("{at}.role"),
                    format!(
                        "{at}.role must be system, user, assistant or tool, got {:?}",
                        m.role
                    ),
                ));
            }
            let mut msg = Message::new(&m.role, &m.content);
            if m.role == "tool" {
                msg.name = m.tool_name.clone();
                msg.tool_call_id = m.tool_name.clone();
            }
            // Ollama's calls: {"function": {"name", "arguments": {...}}}.
            let calls: Option<Vec<Value>> = m.tool_calls.as_ref().map(|c| {
                c.iter()
                    .map(|c| json!({"type": "function", "function": c.get("function").cloned().unwrap_or(Value::Null)}))
                    .collect()
            });
            messages.push(tools::history(fmt, msg, calls.as_ref()));
        }
        if messages.is_empty() {
            // Ollama loads the model and answers done.
            return Ok(one_line(
                &st,
                json!({"message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "load"}),
            ));
        }
        let mut opts = options(&st, req.options.as_ref())?;
        opts.grammar = format(req.format.as_ref())?;
        let prompt = match &tools {
            Some(t) => t.prompt(messages),
            None => Prompt::Chat(messages),
        };
        run(
            st.clone(),
            prompt,
            opts,
            tools.map(|t| t.format),
            true,
            req.stream.unwrap_or(true),
        )
        .await
    };
    res.await.unwrap_or_else(ollama_error)
}

pub async fn generate(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: GenerateRequest = parse(&bytes)?;
        st.check_ollama_model(&req.model)?;
        check_unknown(&req.extra, "")?;
        no_thinking(req.think.as_ref())?;
        let _ = &req.keep_alive;
        if req.prompt.is_empty() && req.system.is_none() {
            return Ok(one_line(
                &st,
                json!({"response": "", "done": true, "done_reason": "load"}),
            ));
        }
        let mut opts = options(&st, req.options.as_ref())?;
        opts.grammar = format(req.format.as_ref())?;
        let prompt = if req.raw == Some(true) {
            if req.system.is_some() {
                return Err(invalid("system", "system cannot be combined with raw"));
            }
            Prompt::Text(req.prompt.clone())
        } else if st.sched.info().chat_template.is_some() {
            let mut m = Vec::new();
            if let Some(s) = &req.system {
                m.push(Message::new("system", s));
            }
            m.push(Message::new("user", &req.prompt));
            Prompt::Chat(m)
        } else {
            let text = match &req.system {
                Some(s) => format!("{s}\n\n{}", req.prompt),
                None => req.prompt.clone(),
            };
            Prompt::Text(text)
        };
        run(
            st.clone(),
            prompt,
            opts,
            None,
            false,
            req.stream.unwrap_or(true),
        )
        .await
    };
    res.await.unwrap_or_else(ollama_error)
}

fn now() -> String {
    kiln_formats::rfc3339_utc(std::time::SystemTime::now(), true)
}

/// Unix nanoseconds as RFC 3339.
fn rfc3339(unix_ns: u128) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(unix_ns as u64);
    kiln_formats::rfc3339_utc(t, true)
}

/// A one-object answer (model and time added).
fn one_line(st: &AppState, mut v: Value) -> Response {
    v["model"] = st.cfg.model_id.clone().into();
    v["created_at"] = now().into();
    json_response(StatusCode::OK, &v)
}

/// Ollama's calls: arguments as an object.
fn call_value(c: &tools::Call) -> Value {
    let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"function": {"name": c.name, "arguments": args}})
}

/// The closing fields: why it ended, counts and durations in nanoseconds.
fn done_fields(v: &mut Value, c: &Completion, calls: usize, t0: Instant) {
    let reason = match c.finish {
        kiln_runtime::FinishReason::MaxTokens | kiln_runtime::FinishReason::ContextFull => "length",
        _ => "stop",
    };
    let ns = |s: f64| (s * 1e9) as u64;
    v["done"] = true.into();
    v["done_reason"] = if calls > 0 { "stop" } else { reason }.into();
    v["total_duration"] = (t0.elapsed().as_nanos() as u64).into();
    v["load_duration"] = 0.into();
    v["prompt_eval_count"] = c.prompt_tokens.into();
    v["prompt_eval_duration"] = ns(c.ttft_secs).into();
    v["eval_count"] = c.completion_tokens.into();
    v["eval_duration"] = ns((c.total_secs - c.ttft_secs).max(0.0)).into();
}

/// One line of the answer: a chat message, or a generate response.
fn line(st: &AppState, chat: bool, text: &str, calls: Vec<Value>) -> Value {
    let mut v = json!({"model": st.cfg.model_id, "created_at": now()});
    if chat {
        let mut m = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        v["message"] = m;
    } else {
        v["response"] = text.into();
    }
    v["done"] = false.into();
    v
}

async fn run(
    st: Arc<AppState>,
    prompt: Prompt,
    opts: GenerateOptions,
    tools: Option<Format>,
    chat: bool,
    stream: bool,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let kind = if chat { Kind::Chat } else { Kind::Completion };
    let (first, mut rx) = submit(&st, prompt, opts, kind).await?;
    let mut split = tools.map(Splitter::new);
    if !stream {
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut ev = first;
        let done = loop {
            match ev {
                Event::Text(t) => text.push_str(&t),
                Event::Logprobs(_) => {}
                Event::Done(c) => break c,
                Event::Error(e) => return Err(engine_error(e, kind)),
            }
            ev = rx.recv().await.ok_or_else(crate::engine_gone)?;
        };
        st.metrics.generation(&done);
        if let Some(sp) = split.as_mut() {
            let mut pieces = sp.push(&std::mem::take(&mut text));
            pieces.extend(sp.finish());
            for p in pieces {
                match p {
                    Piece::Text(t) => text.push_str(&t),
                    Piece::Call(c) => calls.push(call_value(&c)),
                }
            }
        }
        let n = calls.len();
        let mut v = line(&st, chat, &text, calls);
        done_fields(&mut v, &done, n, t0);
        return Ok(json_response(StatusCode::OK, &v));
    }
    struct S {
        st: Arc<AppState>,
        first: Option<Event>,
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        split: Option<Splitter>,
        chat: bool,
        ended: bool,
        t0: Instant,
    }
    let s = S {
        st,
        first: Some(first),
        rx,
        split,
        chat,
        ended: false,
        t0,
    };
    let lines = futures_util::stream::unfold(s, |mut s| async move {
        let mut out = String::new();
        while out.is_empty() && !s.ended {
            let ev = match s.first.take() {
                Some(e) => Some(e),
                None => s.rx.recv().await,
            };
            let emit = |pieces: Vec<Piece>, out: &mut String| {
                for p in pieces {
                    let v = match p {
                        Piece::Text(t) => line(&s.st, s.chat, &t, Vec::new()),
                        Piece::Call(c) => line(&s.st, s.chat, "", vec![call_value(&c)]),
                    };
                    out.push_str(&v.to_string());
                    out.push('\n');
                }
            };
            match ev {
                Some(Event::Logprobs(_)) => {}
                Some(Event::Text(t)) => {
                    let pieces = match s.split.as_mut() {
                        Some(sp) => sp.push(&t),
                        None => vec![Piece::Text(t)],
                    };
                    emit(pieces, &mut out);
                }
                Some(Event::Done(c)) => {
                    s.st.metrics.generation(&c);
                    let rest = s.split.as_mut().map(|sp| sp.finish()).unwrap_or_default();
                    emit(rest, &mut out);
                    let calls = s.split.as_ref().map_or(0, |sp| sp.calls);
                    let mut v = line(&s.st, s.chat, "", Vec::new());
                    done_fields(&mut v, &c, calls, s.t0);
                    out.push_str(&v.to_string());
                    out.push('\n');
                    s.ended = true;
                }
                Some(Event::Error(e)) => {
                    let e = engine_error(e, Kind::Chat);
                    out.push_str(&json!({"error": e.message}).to_string());
                    out.push('\n');
                    s.ended = true;
                }
                None => {
                    out.push_str(
                        &json!({"error": "the generation engine has stopped"}).to_string(),
                    );
                    out.push('\n');
                    s.ended = true;
                }
            }
        }
        if out.is_empty() {
            return None;
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), s))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// What `tags`, `show` and `ps` say of the model.
fn model_entry(st: &AppState) -> Value {
    let info = st.sched.info();
    let meta = std::fs::metadata(&info.path).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let modified = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let format = match info.path.extension().and_then(|e| e.to_str()) {
        Some("gguf") => "gguf",
        _ => "safetensors",
    };
    // A stable stand-in for a digest: the model's path and size, hashed.
    let digest = {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in info
            .path
            .to_string_lossy()
            .bytes()
            .chain(size.to_le_bytes())
        {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        format!("{h:016x}")
    };
    json!({
        "name": st.cfg.model_id,
        "model": st.cfg.model_id,
        "modified_at": rfc3339(modified),
        "size": size,
        "digest": digest,
        "details": {
            "parent_model": "",
            "format": format,
            "family": "",
            "families": null,
            "parameter_size": "",
            "quantization_level": "",
        },
    })
}

pub async fn tags(State(st): State<Arc<AppState>>) -> Response {
    json_response(StatusCode::OK, &json!({"models": [model_entry(&st)]}))
}

pub async fn ps(State(st): State<Arc<AppState>>) -> Response {
    let mut m = model_entry(&st);
    m["expires_at"] = "2318-01-01T00:00:00Z".into();
    m["size_vram"] = if st.sched.info().backend.starts_with("cpu") {
        0.into()
    } else {
        m["size"].clone()
    };
    m["context_length"] = st.sched.info().n_ctx.into();
    json_response(StatusCode::OK, &json!({"models": [m]}))
}

pub async fn show(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: ShowRequest = parse(&bytes)?;
        let _ = req.verbose;
        let name = req
            .model
            .or(req.name)
            .ok_or_else(|| invalid("model", "model is required"))?;
        st.check_ollama_model(&name)?;
        let info = st.sched.info();
        let entry = model_entry(&st);
        let mut caps = vec!["completion"];
        if info.chat_template.is_some() {
            caps.push("tools");
        }
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "modelfile": format!("FROM {}\n", info.path.display()),
                "parameters": "",
                "template": info.chat_template.clone().unwrap_or_default(),
                "details": entry["details"],
                "model_info": {"general.context_length": info.n_ctx},
                "capabilities": caps,
                "modified_at": entry["modified_at"],
            }),
        ))
    };
    res.await.unwrap_or_else(ollama_error)
}

pub async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"version": env!("CARGO_PKG_VERSION")}),
    )
}
