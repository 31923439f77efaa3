//! `kiln serve`: an OpenAI-compatible HTTP server over the continuous-batching scheduler.
//!
//! HTTP only: requests become [`kiln_runtime::Request`]s for the engine thread (which owns
//! the model and batches every running request into one forward per step), and its events
//! become JSON or server-sent events. Routes:
//!
//! - `GET /health`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /metrics` (Prometheus)
//! - `POST /v1/chat/completions`, `POST /v1/completions` (streamed with `"stream": true`)
//! - `POST /v1/audio/transcriptions`, `POST /v1/audio/speech`, `POST /v1/audio/chat`
//!   (speech in, speech out), in [`audio`], when the server has the speech models
//! - `POST /v1/embeddings` and Ollama's `/api/embed`, `/api/embeddings`, in [`embed`]
//! - Ollama's `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//!   `/api/version`, in [`ollama`]
//! - llama-server's `/tokenize`, `/detokenize`, `/props`, in [`llamacpp`]
//!
//! Chat answers may call tools ([`tools`]) and follow a JSON schema or grammar
//! (`response_format`, through `kiln_runtime::grammar`); log-probabilities come with the
//! tokens when asked for.

mod api;
mod audio;
mod embed;
mod error;
mod llamacpp;
mod metrics;
mod ollama;
mod tools;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use kiln_runtime::{
    Completion, Event, EventSink, FinishReason, GenerateOptions, Prompt, Request, Scheduler,
    SubmitError, TokenLogprob,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub use audio::AudioModels;
pub use error::ApiError;
use metrics::Metrics;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients use in `model` (and that `/v1/models` lists).
    pub model_id: String,
    /// When set, every route wants `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Largest request body in bytes (larger: 413).
    pub max_body: usize,
}

pub struct AppState {
    sched: Scheduler,
    cfg: ServerConfig,
    metrics: Metrics,
    audio: AudioModels,
    created: u64,
    counter: AtomicU64,
}

impl AppState {
    pub fn new(sched: Scheduler, cfg: ServerConfig) -> Arc<Self> {
        Self::with_audio(sched, cfg, AudioModels::default())
    }

    /// A server with speech models beside the LLM (the audio routes).
    pub fn with_audio(sched: Scheduler, cfg: ServerConfig, audio: AudioModels) -> Arc<Self> {
        Arc::new(AppState {
            sched,
            cfg,
            metrics: Metrics::default(),
            audio,
            created: unix_now(),
            counter: AtomicU64::new(0),
        })
    }

    fn next_id(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:04x}", self.created)
    }

    /// A seed for requests that give none: different per request.
    fn seed(&self) -> u64 {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ self.counter.fetch_add(1, Ordering::Relaxed).rotate_left(32)
    }

    /// Ollama clients name models `name:tag` (`:latest` by default).
    fn check_ollama_model(&self, model: &str) -> Result<(), ApiError> {
        let m = model.strip_suffix(":latest").unwrap_or(model);
        self.check_model(Some(m))
    }

    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.cfg.model_id => Ok(()),
            Some(m) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "the model '{m}' does not exist (this server serves '{}')",
                    self.cfg.model_id
                ),
            )
            .param("model")
            .code("model_not_found")),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes, behind the API key check and the request counter.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/metrics", get(metrics_text))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/audio/transcriptions", post(audio::transcriptions))
        .route("/v1/audio/translations", post(audio::translations))
        .route("/v1/audio/live", get(audio::live))
        .route("/v1/audio/speech", post(audio::speech))
        .route("/v1/audio/chat", post(audio::chat))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/embed", post(embed::ollama_embed))
        .route("/api/embeddings", post(embed::ollama_embeddings))
        .route("/v1/embeddings", post(embed::openai))
        .route("/tokenize", post(llamacpp::tokenize))
        .route("/detokenize", post(llamacpp::detokenize))
        .route("/props", get(llamacpp::props))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read (and limited) by the handlers themselves.
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Serves `state` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

/// Route names for metrics (unknown paths share one label).
fn route_label(path: &str) -> &'static str {
    match path {
        "/health" => "/health",
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/metrics" => "/metrics",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/embeddings" => "/v1/embeddings",
        "/v1/audio/transcriptions" => "/v1/audio/transcriptions",
        "/v1/audio/speech" => "/v1/audio/speech",
        "/v1/audio/chat" => "/v1/audio/chat",
        p if p.starts_with("/api/") => "/api/*",
        "/tokenize" | "/detokenize" | "/props" => "llama-server",
        _ => "other",
    }
}

/// API key check on every route, then the request counted by route and status.
async fn guard(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: Next,
) -> Response {
    let route = route_label(req.uri().path());
    let ok = match &st.cfg.api_key {
        None => true,
        Some(key) => bearer(req.headers()).is_some_and(|k| same(k.as_bytes(), key.as_bytes())),
    };
    let resp = if ok {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key (send 'Authorization: Bearer KEY')",
        )
        .code("invalid_api_key")
        .into_response()
    };
    st.metrics.request(route, resp.status().as_u16());
    resp
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(str::trim)
}

/// Equality whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route {}", uri.path()),
    )
    .code("not_found")
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", method, uri.path()),
    )
    .code("method_not_allowed")
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let s = st.sched.stats();
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "model": st.cfg.model_id,
            "slots": st.sched.info().slots,
            "running": s.running.load(Ordering::SeqCst),
            "queued": s.queued.load(Ordering::SeqCst),
        }),
    )
}

fn model_object(st: &AppState) -> Value {
    json!({
        "id": st.cfg.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "kiln",
        "context_length": st.sched.info().n_ctx,
    })
}

/// Every model served: the LLM, then the speech models.
fn model_objects(st: &AppState) -> Vec<Value> {
    let mut v = vec![model_object(st)];
    let audio = [
        st.audio.stt.as_ref().map(|s| (&s.0, "speech-to-text")),
        st.audio.tts.as_ref().map(|t| (&t.0, "text-to-speech")),
    ];
    for (id, kind) in audio.into_iter().flatten() {
        v.push(json!({"id": id, "object": "model", "created": st.created, "owned_by": "kiln", "kind": kind}));
    }
    v
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": model_objects(&st)}),
    )
}

async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match model_objects(&st)
        .into_iter()
        .find(|m| m["id"] == id.as_str())
    {
        Some(m) => json_response(StatusCode::OK, &m),
        None => st.check_model(Some(&id)).err().map_or_else(
            || json_response(StatusCode::OK, &model_object(&st)),
            IntoResponse::into_response,
        ),
    }
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(st.sched.stats()),
    )
        .into_response()
}

/// Bodies past this are not even drained before the 413 (the connection closes instead).
const DRAIN_MAX: usize = 64 << 20;

/// The body, up to `limit` bytes. A larger one is read to its end (up to `DRAIN_MAX`), so
/// the client is reading when the 413 comes, then refused.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
        .code("request_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > DRAIN_MAX) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        total += chunk.len();
        if total <= limit {
            buf.extend_from_slice(&chunk);
        } else if total > DRAIN_MAX {
            break;
        }
    }
    if total > limit {
        return Err(too_large());
    }
    Ok(buf.into())
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the body does not match the request schema"
        };
        ApiError::invalid(format!("{what}: {e}"))
    })
}

async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: api::ChatRequest = parse(&bytes)?;
        st.check_model(req.model.as_deref())?;
        let template = st.sched.info().chat_template.as_deref();
        let tools = req.tools(template)?;
        let format = tools
            .as_ref()
            .map_or_else(|| tools::Format::of(template), |t| t.format);
        let messages = req.messages(format)?;
        let mut opts = req.sampling.options(st.seed())?;
        opts.logprobs = req.logprobs()?;
        let answer_format = api::response_format(req.response_format.as_ref())?;
        let call_grammar = tools.as_ref().and_then(|t| t.grammar());
        if answer_format.is_some() && call_grammar.is_some() {
            return Err(ApiError::invalid(
                "response_format cannot be combined with a required or named tool_choice (the call is already constrained)",
            )
            .param("response_format"));
        }
        opts.grammar = call_grammar.or(answer_format);
        let shape = Shape {
            kind: Kind::Chat,
            tools: tools.as_ref().map(|t| t.format),
            logprobs: opts.logprobs.is_some(),
        };
        let prompt = match &tools {
            Some(t) => t.prompt(messages),
            None => Prompt::Chat(messages),
        };
        let stream = req.stream.unwrap_or(false);
        let usage = api::include_usage(&req.stream_options);
        let n = req.sampling.choices()?;
        generate(st.clone(), shape, prompt, opts, n, stream, usage).await
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: api::CompletionRequest = parse(&bytes)?;
        st.check_model(req.model.as_deref())?;
        let prompt = req.prompt()?;
        let mut opts = req.sampling.options(st.seed())?;
        opts.logprobs = req.logprobs()?;
        opts.grammar = api::response_format(req.response_format.as_ref())?;
        let shape = Shape {
            kind: Kind::Completion,
            tools: None,
            logprobs: opts.logprobs.is_some(),
        };
        let stream = req.stream.unwrap_or(false);
        let usage = api::include_usage(&req.stream_options);
        let n = req.sampling.choices()?;
        generate(st.clone(), shape, prompt, opts, n, stream, usage).await
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

/// Events for one request; the engine sees the receiver drop (a client gone) at once.
struct ChannelSink(mpsc::UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&mut self, e: Event) -> bool {
        self.0.send(e).is_ok()
    }
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// What an answer carries besides its text.
#[derive(Clone, Copy)]
struct Shape {
    kind: Kind,
    /// Tool calls are split from the text (in this format).
    tools: Option<tools::Format>,
    logprobs: bool,
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
    }
}

/// Usage of a request's choices: the prompt counted once (as OpenAI counts it), every
/// choice's completion tokens.
fn usage(done: &[Completion]) -> Value {
    let prompt = done.first().map_or(0, |c| c.prompt_tokens);
    let cached = done.first().map_or(0, |c| c.cached_tokens);
    let completion: usize = done.iter().map(|c| c.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn engine_gone() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the generation engine has stopped",
    )
}

/// Submits a request to the engine; its events arrive on the receiver, the first one
/// already read (an error before the first token is an `Err`, so it can be a status code).
async fn submit(
    st: &AppState,
    prompt: Prompt,
    opts: GenerateOptions,
    kind: Kind,
) -> Result<(Event, mpsc::UnboundedReceiver<Event>), ApiError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let req = Request {
        prompt,
        opts,
        sink: Box::new(ChannelSink(tx)),
    };
    st.sched.submit(req).map_err(|e| match e {
        SubmitError::QueueFull => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server's queue is full; retry later",
        )
        .code("queue_full"),
        SubmitError::Stopped => engine_gone(),
    })?;
    let first = rx.recv().await.ok_or_else(engine_gone)?;
    if let Event::Error(e) = first {
        return Err(engine_error(e, kind));
    }
    Ok((first, rx))
}

/// An engine error, naming the field the request's kind sent the prompt in.
fn engine_error(e: kiln_runtime::RuntimeError, kind: Kind) -> ApiError {
    let mut err = ApiError::from(e);
    if err.param.as_deref() == Some("messages") && kind == Kind::Completion {
        err.param = Some("prompt".into());
    }
    if err.message.starts_with("grammar:") {
        err = ApiError::invalid(err.message).param("response_format");
    }
    err
}

/// A tool call as OpenAI returns it.
fn call_json(id: String, c: &tools::Call) -> Value {
    json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// A log-probability JSON can carry (-inf becomes OpenAI's floor of -9999).
fn lp_value(x: f32) -> f64 {
    if x.is_finite() {
        x as f64
    } else {
        -9999.0
    }
}

fn token_text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `logprobs` of a choice: chat's `content` list, or legacy completions' parallel lists.
fn logprobs_json(kind: Kind, lps: &[TokenLogprob], text_start: &mut usize) -> Value {
    match kind {
        Kind::Chat => {
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let top: Vec<Value> = l
                        .top
                        .iter()
                        .map(|(_, b, x)| json!({"token": token_text(b), "logprob": lp_value(*x), "bytes": b}))
                        .collect();
                    json!({
                        "token": token_text(&l.bytes),
                        "logprob": lp_value(l.logprob),
                        "bytes": l.bytes,
                        "top_logprobs": top,
                    })
                })
                .collect();
            json!({"content": content, "refusal": null})
        }
        Kind::Completion => {
            let mut offsets = Vec::with_capacity(lps.len());
            for l in lps {
                offsets.push(*text_start);
                *text_start += token_text(&l.bytes).chars().count();
            }
            let top: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let m: serde_json::Map<String, Value> = l
                        .top
                        .iter()
                        .map(|(_, b, x)| (token_text(b), json!(lp_value(*x))))
                        .collect();
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": lps.iter().map(|l| token_text(&l.bytes)).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|l| lp_value(l.logprob)).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// Submits a request's `n` choices (sampled with seeds seed, seed + 1, ...) and answers
/// them: one JSON body, or server-sent events. Errors the engine finds before the first
/// token (a prompt too long for the context) are still status codes; later ones arrive as
/// an `error` event.
#[allow(clippy::too_many_arguments)]
async fn generate(
    st: Arc<AppState>,
    shape: Shape,
    prompt: Prompt,
    opts: GenerateOptions,
    n: usize,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    // Every choice is its own sequence in the engine (the prompt's cache is shared); their
    // events are read as one stream, each tagged with its choice's index (no task or
    // channel between the engine's receivers and the response).
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let mut o = opts.clone();
        o.sampler.seed = o.sampler.seed.wrapping_add(i as u64);
        let (first, rx) = submit(&st, prompt.clone(), o, shape.kind).await?;
        let rest =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
            );
        streams.push(
            futures_util::stream::once(async move { first })
                .chain(rest)
                .map(move |e| (i, e))
                .boxed(),
        );
    }
    let mut rx = futures_util::stream::select_all(streams);
    let (prefix, object) = match shape.kind {
        Kind::Chat => ("chatcmpl", "chat.completion"),
        Kind::Completion => ("cmpl", "text_completion"),
    };
    let head = Head {
        id: st.next_id(prefix),
        created: unix_now(),
        model: st.cfg.model_id.clone(),
        kind: shape.kind,
    };
    if stream {
        return Ok(sse(st, head, shape, n, rx, include_usage));
    }
    let mut text = vec![String::new(); n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut done: Vec<Option<Completion>> = vec![None; n];
    while done.iter().any(Option::is_none) {
        let (i, ev) = rx.next().await.ok_or_else(engine_gone)?;
        match ev {
            Event::Text(t) => text[i].push_str(&t),
            Event::Logprobs(l) => lps[i].push(l),
            Event::Done(c) => done[i] = Some(c),
            Event::Error(e) => return Err(engine_error(e, shape.kind)),
        }
    }
    let done: Vec<Completion> = done.into_iter().flatten().collect();
    let mut choices = Vec::with_capacity(n);
    for (i, (text, c)) in text.into_iter().zip(&done).enumerate() {
        st.metrics.generation(c);
        choices.push(choice_json(&st, shape, i, text, &lps[i], c));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": head.id,
            "object": object,
            "created": head.created,
            "model": head.model,
            "choices": choices,
            "usage": usage(&done),
        }),
    ))
}

/// One whole choice: the message (its tool calls split from the text) or the text.
fn choice_json(
    st: &AppState,
    shape: Shape,
    index: usize,
    text: String,
    lps: &[TokenLogprob],
    done: &Completion,
) -> Value {
    let logprobs = match shape.logprobs {
        true => logprobs_json(shape.kind, lps, &mut 0),
        false => Value::Null,
    };
    match shape.kind {
        Kind::Chat => {
            let mut calls = Vec::new();
            let content = match shape.tools {
                None => text,
                Some(f) => {
                    let mut sp = tools::Splitter::new(f);
                    let mut pieces = sp.push(&text);
                    pieces.extend(sp.finish());
                    let mut content = String::new();
                    for p in pieces {
                        match p {
                            tools::Piece::Text(t) => content.push_str(&t),
                            tools::Piece::Call(c) => calls.push(call_json(st.next_id("call"), &c)),
                        }
                    }
                    content
                }
            };
            let mut message = json!({"role": "assistant", "content": content});
            let finish = if calls.is_empty() {
                finish_reason(done.finish)
            } else {
                if content.trim().is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = Value::Array(calls);
                "tool_calls"
            };
            json!({
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            })
        }
        Kind::Completion => json!({
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(done.finish),
        }),
    }
}

/// What every chunk of one response repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Head {
    /// One `data:` event with one choice: `delta` (chat) or text (completions), its
    /// log-probabilities, the finish.
    fn chunk(
        &self,
        index: usize,
        delta: serde_json::Map<String, Value>,
        logprobs: Value,
        finish: Option<&str>,
        usage: bool,
    ) -> String {
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => json!({
                "index": index,
                "text": delta.get("content").and_then(Value::as_str).unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut v = self.object(vec![choice]);
        if usage {
            v["usage"] = Value::Null;
        }
        data(&v)
    }

    fn object(&self, choices: Vec<Value>) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The events of a request's choices, tagged with their index.
type Choices =
    futures_util::stream::SelectAll<futures_util::stream::BoxStream<'static, (usize, Event)>>;

/// One choice of a streamed response.
struct ChoiceStream {
    role_sent: bool,
    split: Option<tools::Splitter>,
    /// Log-probabilities not yet sent (their text is held back).
    lps: Vec<TokenLogprob>,
    /// Characters of text sent (completions' `text_offset`).
    offset: usize,
}

struct SseState {
    st: Arc<AppState>,
    head: Head,
    shape: Shape,
    rx: Choices,
    include_usage: bool,
    ended: bool,
    choices: Vec<ChoiceStream>,
    /// Each finished choice's completion, in the order they finished.
    done: Vec<Completion>,
}

impl SseState {
    /// Chunks of choice `i` for `pieces`: content deltas, and each tool call as a delta
    /// naming it (id, name, empty arguments) then one with its arguments. Pending
    /// log-probabilities ride on the first chunk.
    fn pieces(&mut self, i: usize, pieces: Vec<tools::Piece>, out: &mut String) {
        for p in pieces {
            let delta = self.role(i);
            let lp = self.take_logprobs(i);
            let u = self.include_usage;
            let mut delta = delta;
            match p {
                tools::Piece::Text(t) => {
                    delta.insert("content".into(), t.into());
                    out.push_str(&self.head.chunk(i, delta, lp, None, u));
                }
                tools::Piece::Call(c) => {
                    let index = self.choices[i].split.as_ref().map_or(1, |s| s.calls) - 1;
                    let id = self.st.next_id("call");
                    delta.insert(
                        "tool_calls".into(),
                        json!([{"index": index, "id": id, "type": "function", "function": {"name": c.name, "arguments": ""}}]),
                    );
                    out.push_str(&self.head.chunk(i, delta, lp, None, u));
                    let mut args = serde_json::Map::new();
                    args.insert(
                        "tool_calls".into(),
                        json!([{"index": index, "function": {"arguments": c.arguments}}]),
                    );
                    out.push_str(&self.head.chunk(i, args, Value::Null, None, u));
                }
            }
        }
    }

    /// A delta carrying the role when it is choice `i`'s first (chat).
    fn role(&mut self, i: usize) -> serde_json::Map<String, Value> {
        let mut delta = serde_json::Map::new();
        if self.head.kind == Kind::Chat && !self.choices[i].role_sent {
            delta.insert("role".into(), "assistant".into());
            self.choices[i].role_sent = true;
        }
        delta
    }

    fn take_logprobs(&mut self, i: usize) -> Value {
        let c = &mut self.choices[i];
        if !self.shape.logprobs || c.lps.is_empty() {
            return Value::Null;
        }
        let lps = std::mem::take(&mut c.lps);
        logprobs_json(self.head.kind, &lps, &mut c.offset)
    }
}

/// Server-sent events: `data: {chunk}` per text piece of each choice, each choice's
/// finishing chunk, the usage chunk when asked for (`stream_options.include_usage`) once
/// every choice is done, then `data: [DONE]`.
fn sse(
    st: Arc<AppState>,
    head: Head,
    shape: Shape,
    n: usize,
    rx: Choices,
    include_usage: bool,
) -> Response {
    let state = SseState {
        st,
        head,
        shape,
        rx,
        include_usage,
        ended: false,
        choices: (0..n)
            .map(|_| ChoiceStream {
                role_sent: false,
                split: shape.tools.map(tools::Splitter::new),
                lps: Vec::new(),
                offset: 0,
            })
            .collect(),
        done: Vec::new(),
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let mut out = String::new();
        while out.is_empty() && !s.ended {
            let u = s.include_usage;
            match s.rx.next().await {
                Some((i, Event::Logprobs(l))) => s.choices[i].lps.push(l),
                Some((i, Event::Text(t))) => {
                    let pieces = match s.choices[i].split.as_mut() {
                        Some(sp) => sp.push(&t),
                        None => vec![tools::Piece::Text(t)],
                    };
                    s.pieces(i, pieces, &mut out);
                }
                Some((i, Event::Done(c))) => {
                    s.st.metrics.generation(&c);
                    let rest = s.choices[i]
                        .split
                        .as_mut()
                        .map(|sp| sp.finish())
                        .unwrap_or_default();
                    s.pieces(i, rest, &mut out);
                    let calls = s.choices[i].split.as_ref().map_or(0, |sp| sp.calls);
                    let fin = if calls > 0 {
                        "tool_calls"
                    } else {
                        finish_reason(c.finish)
                    };
                    let delta = s.role(i);
                    let lp = s.take_logprobs(i);
                    out.push_str(&s.head.chunk(i, delta, lp, Some(fin), u));
                    s.done.push(c);
                    if s.done.len() == s.choices.len() {
                        if u {
                            let mut v = s.head.object(Vec::new());
                            v["usage"] = usage(&s.done);
                            out.push_str(&data(&v));
                        }
                        out.push_str("data: [DONE]\n\n");
                        s.ended = true;
                    }
                }
                Some((_, Event::Error(e))) => {
                    out.push_str(&data(&engine_error(e, s.head.kind).body()));
                    out.push_str("data: [DONE]\n\n");
                    s.ended = true;
                }
                None => {
                    out.push_str(&data(&engine_gone().body()));
                    s.ended = true;
                }
            }
        }
        if out.is_empty() {
            return None;
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), s))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}
