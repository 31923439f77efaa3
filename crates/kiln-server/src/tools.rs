//! Tool calling: OpenAI's `tools` and `tool_choice` turned into what the model's chat
//! template expects, and the model's answer turned back into `tool_calls`.
//!
//! Three formats, chosen from the template's source:
//! - **Tagged** (Qwen2/2.5/3, Hermes): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//!   the template renders the tool list itself;
//! - **Bare JSON** (Llama 3.x): the answer is `{"name": ..., "parameters": {...}}`;
//! - **Described**: templates that know nothing of tools (SmolLM2) get the tool list and the
//!   tagged format explained in the system message, and earlier calls and results written
//!   into the turns as text.
//!
//! With `tool_choice` `required` or a named function the call is grammar-constrained; with
//! `auto` the model chooses and its answer is parsed.

use kiln_runtime::{Grammar, Prompt};
use kiln_text::Message;
use serde_json::{json, Value};

use crate::error::{invalid, ApiError};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tagged,
    BareJson,
    Described,
}

impl Format {
    pub fn of(template: Option<&str>) -> Format {
        let t = template.unwrap_or("");
        if t.contains(OPEN) {
            Format::Tagged
        } else if t.contains("tools") && t.contains("parameters") {
            Format::BareJson
        } else {
            Format::Described
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Auto,
    None,
    Required,
    Named(String),
}

/// A request's tools, checked.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The `tools` list as sent (each `{"type": "function", "function": {...}}`).
    list: Vec<Value>,
    names: Vec<String>,
    pub choice: Choice,
    parallel: bool,
    pub format: Format,
}

impl Tools {
    /// `tools`, `tool_choice` and `parallel_tool_calls` of a request; None when no tool
    /// may be called.
    pub fn parse(
        tools: Option<&Vec<Value>>,
        choice: Option<&Value>,
        parallel: Option<bool>,
        template: Option<&str>,
    ) -> Result<Option<Tools>, ApiError> {
        let list = tools.cloned().unwrap_or_default();
        let mut names = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let p = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid(&p, format!("{p}.type must be \"function\"")));
            }
            let f = t
                .get("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| invalid(&p, format!("{p}.function must be an object")))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid(&p, format!("{p}.function.name must be a string")))?;
            if let Some(ps) = f.get("parameters") {
                if !ps.is_object() {
                    return Err(invalid(
                        &p,
                        format!("{p}.function.parameters must be a JSON schema object"),
                    ));
                }
            }
            names.push(name.to_string());
        }
        let choice = match choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Choice::Auto,
                "none" => Choice::None,
                "required" => Choice::Required,
                other => {
                    return Err(invalid(
                        "tool_choice",
                        format!(
                            "tool_choice must be auto, none, required or a function, got {other:?}"
                        ),
                    ))
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(
                            "tool_choice",
                            "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !names.iter().any(|n| n == name) {
                    return Err(invalid(
                        "tool_choice",
                        format!("tool_choice names {name:?}, which is not in tools"),
                    ));
                }
                Choice::Named(name.to_string())
            }
        };
        if list.is_empty() {
            return match choice {
                Choice::Auto | Choice::None => Ok(None),
                _ => Err(invalid("tool_choice", "tool_choice needs tools")),
            };
        }
        if choice == Choice::None {
            return Ok(None);
        }
        Ok(Some(Tools {
            list,
            names,
            choice,
            parallel: parallel.unwrap_or(true),
            format: Format::of(template),
        }))
    }

    /// The prompt: the tools given to the template, or described in the system message.
    pub fn prompt(&self, mut messages: Vec<Message>) -> Prompt {
        match self.format {
            Format::Tagged | Format::BareJson => {
                Prompt::ChatTools(messages, Value::Array(self.list.clone()))
            }
            Format::Described => {
                let mut text = String::from(
                    "# Tools\n\nYou may call one or more functions to answer the user. \
                     They are described in JSON within <tools></tools>:\n<tools>\n",
                );
                for t in &self.list {
                    text.push_str(&t.to_string());
                    text.push('\n');
                }
                text.push_str(
                    "</tools>\n\nTo call a function, answer with one <tool_call></tool_call> \
                     block per call, each holding a JSON object with the function's name and \
                     arguments:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
                     <arguments-object>}\n</tool_call>",
                );
                match messages.first_mut().filter(|m| m.role == "system") {
                    Some(m) => m.content = format!("{}\n\n{text}", m.content),
                    None => messages.insert(0, Message::new("system", text)),
                }
                Prompt::Chat(messages)
            }
        }
    }

    /// The grammar a required or named call is held to.
    pub fn grammar(&self) -> Option<Grammar> {
        let names: Vec<&String> = match &self.choice {
            Choice::Required => self.names.iter().collect(),
            Choice::Named(n) => vec![n],
            Choice::Auto | Choice::None => return None,
        };
        let args_key = match self.format {
            Format::BareJson => "parameters",
            _ => "arguments",
        };
        let options: Vec<Value> = names
            .iter()
            .map(|n| {
                let params = self
                    .list
                    .iter()
                    .filter_map(|t| t.get("function"))
                    .find(|f| f.get("name").and_then(Value::as_str) == Some(n.as_str()))
                    .and_then(|f| f.get("parameters").cloned())
                    .unwrap_or_else(|| json!({"type": "object"}));
                json!({
                    "type": "object",
                    "properties": {"name": {"const": n}, args_key: params},
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({
            "anyOf": options,
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
        });
        Some(match self.format {
            Format::BareJson => Grammar::JsonSchema(schema),
            Format::Tagged | Format::Described => {
                let many = if self.parallel && !matches!(self.choice, Choice::Named(_)) {
                    "(\"\\n\" call)*"
                } else {
                    ""
                };
                Grammar::Lark(format!(
                    "start: call {many}\ncall: \"{OPEN}\\n\" %json {schema} \"\\n{CLOSE}\"\n"
                ))
            }
        })
    }
}

/// An earlier conversation's tool calls and results, as the format expects them.
pub fn history(format: Format, mut m: Message, calls: Option<&Vec<Value>>) -> Message {
    let calls: Vec<Value> = calls
        .into_iter()
        .flatten()
        .map(|c| {
            let f = c.get("function").cloned().unwrap_or(Value::Null);
            let name = f.get("name").cloned().unwrap_or(Value::Null);
            // Templates print arguments with `tojson`: an object, not OpenAI's string.
            let args = match f.get("arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => json!({}),
            };
            let mut c = c.clone();
            c["function"] = json!({"name": name, "arguments": args});
            c
        })
        .collect();
    match format {
        Format::Tagged | Format::BareJson => {
            if !calls.is_empty() {
                m.tool_calls = Some(Value::Array(calls));
            }
            m
        }
        Format::Described => {
            for c in &calls {
                let f = &c["function"];
                let call = json!({"name": f["name"], "arguments": f["arguments"]});
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content.push_str(&format!("{OPEN}\n{call}\n{CLOSE}"));
            }
            if m.role == "tool" {
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
                m.tool_call_id = None;
                m.name = None;
            }
            m
        }
    }
}

/// A finished call: the function's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Call(Call),
}

/// `{"name": ..., "arguments"|"parameters": {...}}` as a call.
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => s,
        v => v.to_string(),
    };
    Some(Call { name, arguments })
}

/// Splits the model's streamed answer into text and tool calls as they complete; text that
/// may start a call is held back until it is known.
pub struct Splitter {
    format: Format,
    buf: String,
    /// Inside `<tool_call>` (tagged), or holding the whole answer (bare JSON).
    in_call: bool,
    /// Bare JSON: decided whether the answer is a call.
    decided: bool,
    pub calls: usize,
}

impl Splitter {
    pub fn new(format: Format) -> Self {
        Splitter {
            format,
            buf: String::new(),
            in_call: false,
            decided: false,
            calls: 0,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if self.format == Format::BareJson {
            if !self.decided {
                let t = self.buf.trim_start();
                if t.is_empty() || PYTHON_TAG.starts_with(t) {
                    return out;
                }
                self.decided = true;
                self.in_call =
                    t.starts_with('{') || t.starts_with('[') || t.starts_with(PYTHON_TAG);
            }
            if !self.in_call {
                out.push(Piece::Text(std::mem::take(&mut self.buf)));
            }
            return out;
        }
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    return out;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                match serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .and_then(|v| call_of(&v))
                {
                    Some(c) => {
                        self.calls += 1;
                        out.push(Piece::Call(c));
                    }
                    None => out.push(Piece::Text(format!("{OPEN}{body}{CLOSE}"))),
                }
                // What separates calls is not content.
                let rest = self.buf.trim_start();
                if self.calls > 0 && rest.is_empty() {
                    self.buf.clear();
                }
                continue;
            }
            if let Some(at) = self.buf.find(OPEN) {
                let before: String = self.buf[..at].to_string();
                self.buf.drain(..at + OPEN.len());
                self.in_call = true;
                if !before.trim().is_empty() || (self.calls == 0 && !before.is_empty()) {
                    out.push(Piece::Text(before));
                }
                continue;
            }
            // Hold back a tail that could be the start of the tag.
            let keep = (1..OPEN.len().min(self.buf.len() + 1))
                .rev()
                .find(|&k| {
                    self.buf.is_char_boundary(self.buf.len() - k)
                        && OPEN.starts_with(&self.buf[self.buf.len() - k..])
                })
                .unwrap_or(0);
            let cut = self.buf.len() - keep;
            if cut > 0 {
                let text: String = self.buf.drain(..cut).collect();
                if self.calls == 0 || !text.trim().is_empty() {
                    out.push(Piece::Text(text));
                }
            }
            return out;
        }
    }

    /// The end of the answer: what is held back, a bare-JSON answer parsed.
    pub fn finish(&mut self) -> Vec<Piece> {
        let buf = std::mem::take(&mut self.buf);
        if self.format == Format::BareJson && self.in_call {
            let t = buf.trim_start();
            let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim();
            let calls: Option<Vec<Call>> = match serde_json::from_str::<Value>(t) {
                Ok(Value::Array(a)) => a.iter().map(call_of).collect(),
                Ok(v) => call_of(&v).map(|c| vec![c]),
                Err(_) => None,
            };
            return match calls {
                Some(c) if !c.is_empty() => {
                    self.calls += c.len();
                    c.into_iter().map(Piece::Call).collect()
                }
                _ => vec![Piece::Text(buf)],
            };
        }
        if self.in_call {
            // A call cut short (max_tokens): parsed if it is whole, else kept as text.
            if let Some(c) = serde_json::from_str::<Value>(buf.trim())
                .ok()
                .and_then(|v| call_of(&v))
            {
                self.calls += 1;
                return vec![Piece::Call(c)];
            }
            return vec![Piece::Text(format!("{OPEN}{buf}"))];
        }
        if buf.is_empty() || (self.calls > 0 && buf.trim().is_empty()) {
            Vec::new()
        } else {
            vec![Piece::Text(buf)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(format: Format, pieces: &[&str]) -> (String, Vec<Call>) {
        let mut s = Splitter::new(format);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| s.push(p)).collect();
        out.extend(s.finish());
        let mut text = String::new();
        let mut calls = Vec::new();
        for p in out {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (text, calls)
    }

    #[test]
    fn tagged_calls_split_from_text_whatever_the_pieces() {
        let answer = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 2, 3, 7, answer.len()] {
            let chars: Vec<char> = answer.chars().collect();
            let pieces: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (text, calls) = split(Format::Tagged, &refs);
            assert_eq!(text, "Let me look.\n", "step {step}");
            assert_eq!(
                calls,
                vec![
                    Call {
                        name: "get_weather".into(),
                        arguments: "{\"city\":\"Paris\"}".into()
                    },
                    Call {
                        name: "get_time".into(),
                        arguments: "{}".into()
                    }
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_text() {
        let (text, calls) = split(
            Format::Tagged,
            &["a <tool", "_ca", "ll is not here", " <to"],
        );
        assert_eq!(text, "a <tool_call is not here <to");
        assert!(calls.is_empty());
        let (text, calls) = split(Format::Tagged, &["<tool_call>\nnot json\n</tool_call>"]);
        assert_eq!(text, "<tool_call>\nnot json\n</tool_call>");
        assert!(calls.is_empty());
    }

    #[test]
    fn bare_json_calls_and_plain_answers() {
        let (text, calls) = split(
            Format::BareJson,
            &[
                "<|python_tag|>{\"name\": \"f\", ",
                "\"parameters\": {\"x\": 1}}",
            ],
        );
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![Call {
                name: "f".into(),
                arguments: "{\"x\":1}".into()
            }]
        );
        let (text, calls) = split(Format::BareJson, &["The answer", " is 4."]);
        assert_eq!(text, "The answer is 4.");
        assert!(calls.is_empty());
        let (text, calls) = split(Format::BareJson, &["{not a call"]);
        assert_eq!(text, "{not a call");
        assert!(calls.is_empty());
    }

    #[test]
    fn formats_from_templates() {
        assert_eq!(
            Format::of(Some("{% if tools %}<tool_call>{% endif %}")),
            Format::Tagged
        );
        assert_eq!(
            Format::of(Some("{% if tools %}\"parameters\": {% endif %}")),
            Format::BareJson
        );
        assert_eq!(
            Format::of(Some("<|im_start|>{{ m.content }}")),
            Format::Described
        );
        assert_eq!(Format::of(None), Format::Described);
    }
}
