//! Chat templates: Hugging Face Jinja templates rendered with `minijinja`.
//!
//! The environment mirrors the one templates are written against: `trim_blocks` and
//! `lstrip_blocks` on, loop controls, Python string/dict methods (`.strip()`, `.split()`,
//! `.items()`), `raise_exception`, `strftime_now`, and a `tojson` that behaves like
//! `json.dumps(x, ensure_ascii=False)`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{Result, TextError};
use crate::guard::{self, Stopped};
use crate::pyjson;
use crate::tokenizer::one_line;

pub use minijinja::Value as TemplateValue;

const NAME: &str = "chat_template";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, as Hugging Face templates read them:
    /// `[{"type": "function", "function": {"name": ..., "arguments": {...}}}]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool result's call id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Bounds on one render. Templates come from model files, so rendering one is running code
/// a stranger wrote: each bound turns a hostile template (an endless loop, a string doubled
/// in a loop, runaway recursion) into an error that names the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// minijinja instructions (its `fuel`): bounds loops.
    pub fuel: u64,
    /// Nesting of macro calls, loops and blocks.
    pub recursion: usize,
    /// Bytes the template may emit, counting captured output (macro bodies, `{% set %}`
    /// blocks, filter blocks).
    pub output: usize,
    /// Bytes the rendering thread may hold at once: bounds strings built and never emitted.
    /// Enforced where the binary installs [`crate::GuardedAlloc`].
    pub memory: usize,
    /// Wall-clock time.
    pub time: Duration,
}

impl Default for Limits {
    /// Far above what real chat templates need: a 500-message conversation through the
    /// Qwen3, Llama 3.2 and SmolLM2 templates fits in a tenth of the fuel and output
    /// (tests/chat.rs).
    fn default() -> Self {
        Limits {
            fuel: 5_000_000,
            recursion: 100,
            output: 16 << 20,
            memory: 256 << 20,
            time: Duration::from_secs(10),
        }
    }
}

pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    bos_token: String,
    eos_token: String,
    limits: Limits,
    /// Set when a render was stopped: its thread is parked for good (see `guard`), and the
    /// template is not run again, so one hostile template costs one bounded leak at most.
    stopped: Arc<AtomicBool>,
}

thread_local! {
    /// Bytes the render on this thread may still emit (each render has its own thread).
    static OUTPUT_LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
}

impl ChatTemplate {
    /// Compile `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_formatter(python_formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: &str| {
            strftime(&chrono::Local::now().naive_local(), fmt)
        });
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| template_error(e, &Limits::default()))?;
        let t = ChatTemplate {
            env: Arc::new(env),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits: Limits::default(),
            stopped: Arc::new(AtomicBool::new(false)),
        };
        Ok(t.with_limits(Limits::default()))
    }

    /// Render within other bounds.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        let env = Arc::make_mut(&mut self.env);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion);
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Make `strftime_now` report this fixed time (UTC seconds since the epoch), for
    /// reproducible renders.
    pub fn with_time(mut self, unix_seconds: i64) -> Result<Self> {
        let t = chrono::DateTime::from_timestamp(unix_seconds, 0)
            .ok_or_else(|| TextError::Template(format!("time {unix_seconds} out of range")))?
            .naive_utc();
        Arc::make_mut(&mut self.env)
            .add_function("strftime_now", move |fmt: &str| strftime(&t, fmt));
        Ok(self)
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, TemplateValue::UNDEFINED)
    }

    /// Render with extra variables (a map, e.g. `{"enable_thinking": false}` or `tools`),
    /// which override the defaults (`tools` and `documents` are none).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: TemplateValue,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, TemplateValue> = BTreeMap::new();
        ctx.insert("messages".into(), TemplateValue::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            TemplateValue::from(add_generation_prompt),
        );
        ctx.insert(
            "bos_token".into(),
            TemplateValue::from(self.bos_token.as_str()),
        );
        ctx.insert(
            "eos_token".into(),
            TemplateValue::from(self.eos_token.as_str()),
        );
        ctx.insert("tools".into(), TemplateValue::from(()));
        ctx.insert("documents".into(), TemplateValue::from(()));
        if !extra.is_undefined() && !extra.is_none() {
            let bad = |e| template_error(e, &self.limits);
            let keys = extra.try_iter().map_err(bad)?;
            for k in keys {
                let v = extra.get_item(&k).map_err(bad)?;
                let name = k.as_str().ok_or_else(|| {
                    TextError::Template(format!("extra context key {k} is not a string"))
                })?;
                ctx.insert(name.to_string(), v);
            }
        }
        if self.stopped.load(Ordering::Relaxed) {
            return Err(TextError::Template(
                "not rendered: an earlier render of this template was stopped at its limits".into(),
            ));
        }
        let env = self.env.clone();
        let limits = self.limits;
        let render = move || {
            OUTPUT_LEFT.with(|l| l.set(limits.output));
            let tmpl = env
                .get_template(NAME)
                .map_err(|e| template_error(e, &limits))?;
            tmpl.render(TemplateValue::from(ctx))
                .map_err(|e| template_error(e, &limits))
        };
        match guard::run_guarded(limits.memory, limits.time, render) {
            Ok(r) => r,
            Err(why) => {
                self.stopped.store(true, Ordering::Relaxed);
                Err(TextError::Template(match why {
                    Stopped::Memory => format!(
                        "stopped: rendering needed more than {} MiB (a string or list grown without bound?)",
                        limits.memory >> 20
                    ),
                    Stopped::Time => format!(
                        "stopped: rendering took longer than {:?}",
                        limits.time
                    ),
                    Stopped::Panicked => "the template engine failed (a bug in kiln)".into(),
                }))
            }
        }
    }
}

/// Parse JSON text into a template value, keeping object key order (for `tools`, which
/// templates print with `tojson`).
pub fn value_from_json(text: &str) -> Result<TemplateValue> {
    serde_json::from_str(text).map_err(|e| TextError::Template(format!("extra JSON: {e}")))
}

fn tojson(value: &TemplateValue, kwargs: Kwargs) -> Result<String, Error> {
    let opts = pyjson::Opts::from_kwargs(&kwargs)?;
    pyjson::dumps(value, &opts)
}

/// `{{ x }}` prints booleans and none the Python way (`True`, `None`).
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    v: &TemplateValue,
) -> Result<(), Error> {
    let text = match v.kind() {
        ValueKind::Bool if v.is_true() => "True",
        ValueKind::Bool => "False",
        ValueKind::None => "None",
        _ => {
            let n = match v.as_str() {
                Some(s) => s.len(),
                None => v.to_string().len(),
            };
            spend_output(n)?;
            return minijinja::escape_formatter(out, state, v);
        }
    };
    spend_output(text.len())?;
    out.write_str(text).map_err(Error::from)
}

/// Counts `n` emitted bytes against the render's output bound.
fn spend_output(n: usize) -> Result<(), Error> {
    OUTPUT_LEFT.with(|left| match left.get().checked_sub(n) {
        Some(l) => {
            left.set(l);
            Ok(())
        }
        None => Err(Error::new(
            ErrorKind::InvalidOperation,
            "output limit reached (the template emits more than its output bound)",
        )),
    })
}

fn raise_exception(msg: String) -> Result<TemplateValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime(t: &chrono::NaiveDateTime, fmt: &str) -> Result<String, Error> {
    let mut s = String::new();
    write!(s, "{}", t.format(fmt)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {fmt:?}"),
        )
    })?;
    Ok(s)
}

/// One line: kind, message and the template line.
fn template_error(e: Error, limits: &Limits) -> TextError {
    let mut msg = e.to_string();
    match e.kind() {
        ErrorKind::OutOfFuel => {
            msg = format!(
                "ran out of fuel: more than {} instructions (an endless or runaway loop?)",
                limits.fuel
            )
        }
        ErrorKind::InvalidOperation if msg.contains("output limit") => {
            msg = format!(
                "output limit: the template emits more than {} bytes",
                limits.output
            )
        }
        _ => {}
    }
    if let Some(line) = e.line() {
        if !msg.contains(&format!("{NAME}:{line}")) {
            msg.push_str(&format!(" (line {line})"));
        }
    }
    TextError::Template(one_line(&msg))
}

/// The chat format of an architecture whose GGUF files commonly ship without a template
/// (llama.cpp's Gemma 3 conversions): Gemma's turns, `<start_of_turn>user|model` ...
/// `<end_of_turn>`, a system message put before the first user turn, roles alternating.
pub fn builtin_template(arch: &str) -> Option<&'static str> {
    match arch {
        "gemma3" => Some(GEMMA_TURNS),
        _ => None,
    }
}

const GEMMA_TURNS: &str = "{{- bos_token -}}
{%- set sys = '' -%}
{%- set turns = messages -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set sys = messages[0]['content'] ~ '\n\n' -%}
{%- set turns = messages[1:] -%}
{%- endif -%}
{%- for m in turns -%}
{%- if (m['role'] == 'user') != (loop.index0 is even) -%}
{{- raise_exception('Gemma chats alternate user and assistant turns, starting with the user') -}}
{%- endif -%}
<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}
{{ (sys if loop.first else '') ~ (m['content'] | trim) }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% endif -%}";

#[cfg(test)]
mod builtin_tests {
    use super::*;

    /// Gemma's turns: the system message before the first user turn, `model` for the
    /// assistant, contents trimmed, the generation prompt; roles out of turn are an error.
    #[test]
    fn gemma_turns() {
        let t = ChatTemplate::new(builtin_template("gemma3").unwrap(), "<bos>", "<eos>").unwrap();
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", " Hi! "),
            Message::new("assistant", "Hello."),
            Message::new("user", "Name a colour."),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&msgs[1..2], false).unwrap(),
            "<bos><start_of_turn>user\nHi!<end_of_turn>\n"
        );
        let e = t.render(&msgs[2..], true).unwrap_err().to_string();
        assert!(e.contains("alternate"), "{e}");
        assert!(builtin_template("qwen3").is_none());
    }
}
