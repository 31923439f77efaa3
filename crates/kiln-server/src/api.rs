//! The OpenAI request bodies kiln reads, and the sampling options they turn into.
//!
//! Unknown fields are ignored (clients send many); fields kiln cannot honour (`n` > 1,
//! `logprobs`, `tools`) are refused with a 400 rather than silently dropped.

use kiln_runtime::{GenerateOptions, SamplerConfig};
use kiln_text::Message;
use serde::Deserialize;

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
    pub tools: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
    pub echo: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
}

/// A message's content: a string, or a list of parts of which kiln reads the text ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    Batches(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Sampling fields shared by both routes (`top_k`, `min_p`, `repeat_penalty` are
/// extensions llama.cpp's server also takes).
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    pub logprobs: Option<serde_json::Value>,
}

fn invalid(param: &str, msg: String) -> ApiError {
    ApiError::invalid(msg).param(param)
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) || x.is_nan() => Err(invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

impl Sampling {
    /// Generation options (OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p;
    /// no max_tokens: until the context is full). `seed`: the one to use when none is given.
    pub fn options(&self, seed: u64) -> Result<GenerateOptions, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(invalid("n", format!("n must be 1 (got {n})")));
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|v| !v.is_null() && *v != serde_json::Value::Bool(false))
        {
            return Err(invalid("logprobs", "logprobs are not supported".into()));
        }
        range("temperature", self.temperature, 0.0, 2.0)?;
        range("top_p", self.top_p, 0.0, 1.0)?;
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        range("repeat_penalty", self.repeat_penalty, 0.0, 10.0)?;
        let (param, max) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        let max_tokens = match max {
            None => usize::MAX,
            Some(m) if m >= 1 => m as usize,
            Some(m) => {
                return Err(invalid(
                    param,
                    format!("{param} must be at least 1, got {m}"),
                ))
            }
        };
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k >= 0 => k as usize,
            Some(k) => return Err(invalid("top_k", format!("top_k must be >= 0, got {k}"))),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok(GenerateOptions {
            max_tokens,
            stop,
            sampler: SamplerConfig {
                temperature: self.temperature.unwrap_or(1.0),
                top_k,
                top_p: self.top_p.unwrap_or(1.0),
                min_p: self.min_p.unwrap_or(0.0),
                repeat_penalty: self.repeat_penalty.unwrap_or(1.0),
                repeat_last_n: 64,
                presence_penalty: self.presence_penalty.unwrap_or(0.0),
                frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
                seed: self.seed.map_or(seed, |s| s as u64),
            },
        })
    }
}

impl ChatRequest {
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(invalid("tools", "tools are not supported".into()));
        }
        if self.messages.is_empty() {
            return Err(invalid("messages", "messages must not be empty".into()));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let content = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut s = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => s.push_str(t),
                                (kind, _) => {
                                    return Err(invalid(
                                        &format!("messages[{i}].content"),
                                        format!("content parts of type '{kind}' are not supported"),
                                    ))
                                }
                            }
                        }
                        s
                    }
                };
                Ok(Message::new(m.role.clone(), content))
            })
            .collect()
    }
}

impl CompletionRequest {
    pub fn prompt(&self) -> Result<kiln_runtime::Prompt, ApiError> {
        if self.echo == Some(true) {
            return Err(invalid("echo", "echo is not supported".into()));
        }
        use kiln_runtime::Prompt;
        let one = || invalid("prompt", "one prompt per request (n = 1)".into());
        Ok(match &self.prompt {
            PromptInput::Text(t) => Prompt::Text(t.clone()),
            PromptInput::Texts(v) if v.len() == 1 => Prompt::Text(v[0].clone()),
            PromptInput::Tokens(t) => Prompt::Tokens(t.clone()),
            PromptInput::Batches(v) if v.len() == 1 => Prompt::Tokens(v[0].clone()),
            _ => return Err(one()),
        })
    }
}

pub fn include_usage(o: &Option<StreamOptions>) -> bool {
    o.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
}
