//! The OpenAI request bodies kiln reads, and the generation options they turn into.
//!
//! One rule for fields: each is implemented, or refused with a 400 that names it. A field
//! kiln does not know is refused too (a typo must not pass silently), except when its
//! value is null, which means "not given"; `user`, `metadata` and `service_tier` are
//! accepted and change nothing, as they change nothing in the answer.

use kiln_runtime::{GenerateOptions, Grammar, SamplerConfig};
use kiln_text::Message;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{invalid, ApiError};
use crate::tools::{self, Format, Tools};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub echo: Option<bool>,
    /// Legacy completions: the number of top alternatives (0-5) per token.
    pub logprobs: Option<i64>,
    pub response_format: Option<Value>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<Value>>,
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
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
    pub best_of: Option<i64>,
    pub logit_bias: Option<Map<String, Value>>,
    pub suffix: Option<Value>,
    /// Accepted, no effect on the answer (an end-user id, request tags, a service tier).
    #[allow(dead_code)]
    pub user: Option<Value>,
    #[allow(dead_code)]
    pub metadata: Option<Value>,
    #[allow(dead_code)]
    pub service_tier: Option<Value>,
    pub store: Option<bool>,
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

/// Most choices one request may ask for.
pub const MAX_CHOICES: i64 = 16;

impl Sampling {
    /// How many choices to generate (`n`, 1 unless given).
    pub fn choices(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n as usize),
            Some(n) => Err(invalid(
                "n",
                format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
            )),
        }
    }

    /// Generation options (OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p;
    /// no max_tokens: until the context is full). `seed`: the one to use when none is given.
    pub fn options(&self, seed: u64) -> Result<GenerateOptions, ApiError> {
        if let Some(n) = self.best_of.filter(|&n| n != 1) {
            return Err(invalid("best_of", format!("best_of must be 1 (got {n})")));
        }
        if self.suffix.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(invalid(
                "suffix",
                "suffix (fill in the middle) is not supported",
            ));
        }
        if self.store == Some(true) {
            return Err(invalid(
                "store",
                "store: kiln keeps no completions (send false or leave it out)",
            ));
        }
        let mut logit_bias = Vec::new();
        for (k, v) in self.logit_bias.iter().flatten() {
            let id = k.parse::<u32>().map_err(|_| {
                invalid(
                    "logit_bias",
                    format!("logit_bias keys are token ids, got {k:?}"),
                )
            })?;
            let b = v
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    invalid(
                        "logit_bias",
                        format!("logit_bias values are numbers from -100 to 100, got {v}"),
                    )
                })?;
            logit_bias.push((id, b as f32));
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
            grammar: None,
            logprobs: None,
            logit_bias,
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

/// Refuses unknown fields with a value (null means "not given").
pub fn check_unknown(extra: &Map<String, Value>, at: &str) -> Result<(), ApiError> {
    match extra.iter().find(|(_, v)| !v.is_null()) {
        None => Ok(()),
        Some((k, _)) => {
            let p = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            Err(invalid(&p, format!("unknown or unsupported field '{p}'")))
        }
    }
}

/// `response_format`: text, json_object or json_schema.
pub fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let p = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonObject)),
        "json_schema" => {
            let js = v.get("json_schema").ok_or_else(|| {
                invalid(p, "response_format json_schema needs a json_schema object")
            })?;
            let schema = js
                .get("schema")
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    invalid(
                        p,
                        "response_format.json_schema.schema must be a JSON schema",
                    )
                })?;
            Ok(Some(Grammar::JsonSchema(schema.clone())))
        }
        other => Err(invalid(
            p,
            format!("response_format.type must be text, json_object or json_schema, got {other:?}"),
        )),
    }
}

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

impl ChatRequest {
    /// The tools the model may call (None: none may be).
    pub fn tools(&self, template: Option<&str>) -> Result<Option<Tools>, ApiError> {
        Tools::parse(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
            template,
        )
    }

    /// The conversation, for the tool format in use (`Described` when there are no tools:
    /// earlier calls become text all the same).
    pub fn messages(&self, format: Format) -> Result<Vec<Message>, ApiError> {
        check_unknown(&self.extra, "")?;
        if self.messages.is_empty() {
            return Err(invalid("messages", "messages must not be empty"));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let at = format!("messages[{i}]");
                check_unknown(&m.extra, &at)?;
                if !ROLES.contains(&m.role.as_str()) {
                    return Err(invalid(
                        &format!("{at}.role"),
                        format!(
                            "{at}.role must be one of {}, got {:?}",
                            ROLES.join(", "),
                            m.role
                        ),
                    ));
                }
                let calls = m.tool_calls.as_ref().filter(|c| !c.is_empty());
                if calls.is_some() && m.role != "assistant" {
                    return Err(invalid(
                        &format!("{at}.tool_calls"),
                        format!("{at}: only assistant messages carry tool_calls"),
                    ));
                }
                let content = match &m.content {
                    None if calls.is_some() => String::new(),
                    None => {
                        return Err(invalid(
                            &format!("{at}.content"),
                            format!("{at}.content is missing (only an assistant message with tool_calls may leave it out)"),
                        ))
                    }
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut s = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => s.push_str(t),
                                (kind, _) => {
                                    return Err(invalid(
                                        &format!("{at}.content"),
                                        format!("content parts of type '{kind}' are not supported"),
                                    ))
                                }
                            }
                        }
                        s
                    }
                };
                if m.role == "tool" && m.tool_call_id.is_none() {
                    return Err(invalid(
                        &format!("{at}.tool_call_id"),
                        format!("{at}: a tool message needs tool_call_id"),
                    ));
                }
                // `developer` is the newer name of `system`.
                let role = if m.role == "developer" { "system" } else { &m.role };
                let mut msg = Message::new(role, content);
                msg.tool_call_id = m.tool_call_id.clone();
                msg.name = m.name.clone();
                Ok(tools::history(format, msg, calls))
            })
            .collect()
    }

    /// Log-probabilities asked for: None, or the number of alternatives.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (Some(true), None) => Ok(Some(0)),
            (Some(true), Some(n)) if (0..=20).contains(&n) => Ok(Some(n as usize)),
            (_, Some(n)) if !(0..=20).contains(&n) => Err(invalid(
                "top_logprobs",
                format!("top_logprobs must be between 0 and 20, got {n}"),
            )),
            (_, Some(_)) => Err(invalid("top_logprobs", "top_logprobs needs logprobs: true")),
            _ => Ok(None),
        }
    }
}

impl CompletionRequest {
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            None => Ok(None),
            Some(n) if (0..=5).contains(&n) => Ok(Some(n as usize)),
            Some(n) => Err(invalid(
                "logprobs",
                format!("logprobs must be between 0 and 5, got {n}"),
            )),
        }
    }

    pub fn prompt(&self) -> Result<kiln_runtime::Prompt, ApiError> {
        check_unknown(&self.extra, "")?;
        if self.echo == Some(true) {
            return Err(invalid("echo", "echo is not supported"));
        }
        use kiln_runtime::Prompt;
        let one = || invalid("prompt", "one prompt per request (n = 1)");
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
