//! Chat templates: Hugging Face Jinja templates rendered with `minijinja`.
//!
//! The environment mirrors the one templates are written against: `trim_blocks` and
//! `lstrip_blocks` on, loop controls, Python string/dict methods (`.strip()`, `.split()`,
//! `.items()`), `raise_exception`, `strftime_now`, and a `tojson` that behaves like
//! `json.dumps(x, ensure_ascii=False)`.

use std::collections::BTreeMap;
use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{Result, TextError};
use crate::pyjson;
use crate::tokenizer::one_line;

pub use minijinja::Value as TemplateValue;

const NAME: &str = "chat_template";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
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
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Make `strftime_now` report this fixed time (UTC seconds since the epoch), for
    /// reproducible renders.
    pub fn with_time(mut self, unix_seconds: i64) -> Result<Self> {
        let t = chrono::DateTime::from_timestamp(unix_seconds, 0)
            .ok_or_else(|| TextError::Template(format!("time {unix_seconds} out of range")))?
            .naive_utc();
        self.env
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
            let keys = extra.try_iter().map_err(template_error)?;
            for k in keys {
                let v = extra.get_item(&k).map_err(template_error)?;
                let name = k.as_str().ok_or_else(|| {
                    TextError::Template(format!("extra context key {k} is not a string"))
                })?;
                ctx.insert(name.to_string(), v);
            }
        }
        let tmpl = self.env.get_template(NAME).map_err(template_error)?;
        tmpl.render(TemplateValue::from(ctx))
            .map_err(template_error)
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
        _ => return minijinja::escape_formatter(out, state, v),
    };
    out.write_str(text).map_err(Error::from)
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
fn template_error(e: Error) -> TextError {
    let mut msg = e.to_string();
    if let Some(line) = e.line() {
        if !msg.contains(&format!("{NAME}:{line}")) {
            msg.push_str(&format!(" (line {line})"));
        }
    }
    TextError::Template(one_line(&msg))
}
