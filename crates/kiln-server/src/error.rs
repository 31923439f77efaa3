//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_runtime::RuntimeError;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

/// 400 invalid_request_error naming the field `param`.
pub(crate) fn invalid(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(msg).param(param)
}

/// An error in Ollama's shape: `{"error": "..."}` with the status.
pub(crate) fn ollama_error(e: ApiError) -> Response {
    (
        e.status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": e.message}).to_string(),
    )
        .into_response()
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 invalid_request_error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn param(mut self, p: &str) -> Self {
        self.param = Some(p.to_string());
        self
    }

    pub fn code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let msg = e.to_string();
        match e {
            RuntimeError::PromptTooLong { .. } => ApiError::invalid(msg)
                .param("messages")
                .code("context_length_exceeded"),
            RuntimeError::EmptyPrompt | RuntimeError::NoChatTemplate | RuntimeError::Text(_) => {
                ApiError::invalid(msg)
            }
            // Token ids a client sent that the model does not have.
            RuntimeError::TokenOutOfRange { field, .. } => ApiError::invalid(msg).param(field),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}
