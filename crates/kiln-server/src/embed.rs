//! Embeddings: OpenAI's `POST /v1/embeddings` and Ollama's `POST /api/embed` and
//! `POST /api/embeddings`, through the engine thread (between its steps).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use kiln_runtime::{Embeddings, Prompt, SubmitError};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::check_unknown;
use crate::error::{invalid, ollama_error, ApiError};
use crate::{engine_error, engine_gone, json_response, parse, read_body, AppState, Kind};

/// Inputs as OpenAI takes them: a string, strings, a token list, token lists.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    Batches(Vec<Vec<u32>>),
}

impl Input {
    fn prompts(self, param: &str) -> Result<Vec<Prompt>, ApiError> {
        let v: Vec<Prompt> = match self {
            Input::Text(t) => vec![Prompt::Text(t)],
            Input::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
            Input::Tokens(t) => vec![Prompt::Tokens(t)],
            Input::Batches(v) => v.into_iter().map(Prompt::Tokens).collect(),
        };
        if v.is_empty() {
            return Err(invalid(param, format!("{param} must not be empty")));
        }
        if v.len() > 2048 {
            return Err(invalid(
                param,
                format!("{param}: at most 2048 inputs per request"),
            ));
        }
        Ok(v)
    }
}

#[derive(Debug, Deserialize)]
struct OpenAiRequest {
    input: Input,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    #[allow(dead_code)]
    user: Option<Value>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// Runs the inputs through the engine.
async fn embed(st: &AppState, inputs: Vec<Prompt>) -> Result<Embeddings, ApiError> {
    let rx = st.sched.embed(inputs).map_err(|e| match e {
        SubmitError::QueueFull | SubmitError::Stopped => engine_gone(),
    })?;
    let r = tokio::task::spawn_blocking(move || rx.recv())
        .await
        .map_err(|_| engine_gone())?
        .map_err(|_| engine_gone())?;
    r.map_err(|e| {
        let mut err = engine_error(e, Kind::Completion);
        if err.param.as_deref() == Some("prompt") {
            err.param = Some("input".into());
        }
        err
    })
}

/// The first `dims` components, scaled to unit length again (Matryoshka-style shortening).
fn shorten(v: &mut Vec<f32>, dims: Option<usize>) {
    if let Some(d) = dims {
        v.truncate(d);
        kiln_runtime::embed::normalize(v);
    }
}

fn dims(d: Option<i64>, full: usize) -> Result<Option<usize>, ApiError> {
    match d {
        None => Ok(None),
        Some(d) if d >= 1 && d as usize <= full => Ok(Some(d as usize)),
        Some(d) => Err(invalid(
            "dimensions",
            format!("dimensions must be between 1 and the model's {full}, got {d}"),
        )),
    }
}

pub async fn openai(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: OpenAiRequest = parse(&bytes)?;
        st.check_model(req.model.as_deref())?;
        check_unknown(&req.extra, "")?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => {
                return Err(invalid(
                    "encoding_format",
                    format!("encoding_format must be float or base64, got {f:?}"),
                ))
            }
        };
        let full = st.sched.info().embedding_dim;
        let d = dims(req.dimensions, full)?;
        let e = embed(&st, req.input.prompts("input")?).await?;
        let data: Vec<Value> = e
            .vectors
            .into_iter()
            .enumerate()
            .map(|(i, mut v)| {
                shorten(&mut v, d);
                let emb = match base64 {
                    true => {
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                    false => json!(v),
                };
                json!({"object": "embedding", "index": i, "embedding": emb})
            })
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "object": "list",
                "data": data,
                "model": st.cfg.model_id,
                "usage": {"prompt_tokens": e.tokens, "total_tokens": e.tokens},
            }),
        ))
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
struct OllamaEmbed {
    model: String,
    input: Option<Input>,
    /// `/api/embeddings` (the older route): one text.
    prompt: Option<String>,
    truncate: Option<bool>,
    dimensions: Option<i64>,
    keep_alive: Option<Value>,
    options: Option<Map<String, Value>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `/api/embed` (`{"embeddings": [[...]]}`) and `/api/embeddings` (`{"embedding": [...]}`).
async fn ollama(st: Arc<AppState>, headers: HeaderMap, body: Body, legacy: bool) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: OllamaEmbed = parse(&bytes)?;
        st.check_ollama_model(&req.model)?;
        check_unknown(&req.extra, "")?;
        let _ = (&req.keep_alive, &req.options);
        // (`truncate`: Ollama cuts an input past the context; kiln refuses it with a 400
        // that says so, whatever it is set to.)
        let _ = req.truncate;
        let t0 = std::time::Instant::now();
        let inputs = match (req.input, req.prompt, legacy) {
            (_, Some(p), true) => vec![Prompt::Text(p)],
            (Some(i), None, false) => i.prompts("input")?,
            (_, _, true) => return Err(invalid("prompt", "prompt is required")),
            (_, _, false) => return Err(invalid("input", "input is required")),
        };
        let d = dims(req.dimensions, st.sched.info().embedding_dim)?;
        let mut e = embed(&st, inputs).await?;
        e.vectors.iter_mut().for_each(|v| shorten(v, d));
        let v = match legacy {
            true => json!({"embedding": e.vectors[0]}),
            false => json!({
                "model": st.cfg.model_id,
                "embeddings": e.vectors,
                "total_duration": t0.elapsed().as_nanos() as u64,
                "load_duration": 0,
                "prompt_eval_count": e.tokens,
            }),
        };
        Ok(json_response(StatusCode::OK, &v))
    };
    res.await.unwrap_or_else(ollama_error)
}

pub async fn ollama_embed(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    ollama(st, headers, body, false).await
}

pub async fn ollama_embeddings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    ollama(st, headers, body, true).await
}
