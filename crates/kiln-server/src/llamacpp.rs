//! llama-server's utility routes, for tools written against it: `POST /tokenize`,
//! `POST /detokenize`, `GET /props`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::check_unknown;
use crate::error::ApiError;
use crate::{engine_gone, json_response, parse, read_body, AppState};

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    content: String,
    add_special: Option<bool>,
    with_pieces: Option<bool>,
    /// Special tokens written in the text are read as such (always, in kiln).
    parse_special: Option<bool>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// Waits (off the async workers) for the engine's answer.
async fn answer<T: Send + 'static>(
    rx: std::sync::mpsc::Receiver<Result<T, kiln_runtime::RuntimeError>>,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || rx.recv())
        .await
        .map_err(|_| engine_gone())?
        .map_err(|_| engine_gone())?
        .map_err(ApiError::from)
}

pub async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: TokenizeRequest = parse(&bytes)?;
        check_unknown(&req.extra, "")?;
        if req.parse_special == Some(false) {
            return Err(ApiError::invalid(
                "parse_special: kiln always reads special tokens written in the text",
            )
            .param("parse_special"));
        }
        let rx = st
            .sched
            .tokenize(req.content, req.add_special.unwrap_or(false))
            .map_err(|_| engine_gone())?;
        let toks = answer(rx).await?;
        let tokens: Vec<Value> = match req.with_pieces.unwrap_or(false) {
            false => toks.iter().map(|(id, _)| json!(id)).collect(),
            true => toks
                .iter()
                .map(|(id, b)| match std::str::from_utf8(b) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    Err(_) => json!({"id": id, "piece": b}),
                })
                .collect(),
        };
        Ok(json_response(StatusCode::OK, &json!({"tokens": tokens})))
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let res = async {
        let bytes = read_body(&headers, body, st.cfg.max_body).await?;
        let req: DetokenizeRequest = parse(&bytes)?;
        check_unknown(&req.extra, "")?;
        let rx = st.sched.detokenize(req.tokens).map_err(|_| engine_gone())?;
        let content = answer(rx).await.map_err(|e| e.param("tokens"))?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &json!({"content": content})))
    };
    res.await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn props(State(st): State<Arc<AppState>>) -> Response {
    let info = st.sched.info();
    json_response(
        StatusCode::OK,
        &json!({
            "default_generation_settings": {
                "n_ctx": info.n_ctx,
                "params": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0},
            },
            "total_slots": info.slots,
            "model_path": info.path.display().to_string(),
            "model_alias": st.cfg.model_id,
            "chat_template": info.chat_template.clone().unwrap_or_default(),
            "modalities": {"vision": false, "audio": false},
            "build_info": format!("kiln {}", env!("CARGO_PKG_VERSION")),
        }),
    )
}
