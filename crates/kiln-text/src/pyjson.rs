//! `json.dumps` output for template values: the `tojson` filter chat templates expect
//! (no HTML escaping, `", "`/`": "` separators, optional indent, `ensure_ascii`, `sort_keys`).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

pub(crate) struct Opts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Opts {
    /// From filter keyword arguments: `indent`, `ensure_ascii`, `separators`, `sort_keys`.
    pub(crate) fn from_kwargs(kw: &Kwargs) -> Result<Self, Error> {
        let indent = match kw.get::<Option<Value>>("indent")? {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
            Some(v) => {
                let n = v.as_i64().ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "tojson indent must be an int")
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        };
        let (item_sep, key_sep) = match kw.get::<Option<Vec<String>>>("separators")? {
            Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
            Some(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be a pair",
                ))
            }
            None if indent.is_some() => (",".into(), ": ".into()),
            None => (", ".into(), ": ".into()),
        };
        let opts = Opts {
            indent,
            item_sep,
            key_sep,
            ensure_ascii: kw.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
            sort_keys: kw.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        };
        kw.assert_all_used()?;
        Ok(opts)
    }
}

pub(crate) fn dumps(v: &Value, o: &Opts) -> Result<String, Error> {
    let mut out = String::new();
    dump(v, o, 0, &mut out)?;
    Ok(out)
}

fn dump(v: &Value, o: &Opts, depth: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => number(v, out),
        ValueKind::String => string(v.as_str().unwrap_or(""), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            container(out, o, depth, '[', ']', items.len(), |i, out| {
                dump(&items[i], o, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for k in v.try_iter()? {
                let item = v.get_item(&k)?;
                entries.push((key_string(&k)?, item));
            }
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            container(out, o, depth, '{', '}', entries.len(), |i, out| {
                string(&entries[i].0, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                dump(&entries[i].1, o, depth + 1, out)
            })?;
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: value of kind {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// `[a, b]` or, with an indent, one item per line at `depth + 1`.
fn container(
    out: &mut String,
    o: &Opts,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        newline(out, depth + 1);
        item(i, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Map keys as Python stringifies them: strings as-is, numbers and bools via JSON.
fn key_string(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or("").to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            number(k, &mut s);
            Ok(s)
        }
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

fn number(v: &Value, out: &mut String) {
    if v.is_integer() {
        out.push_str(&v.to_string());
    } else {
        out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)));
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside 1e-4..1e16.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    }
}

fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(py_float(f), s);
        }
    }

    #[test]
    fn strings_like_python() {
        let mut out = String::new();
        string("a\"b\\c\n\u{1}é😀\u{7f}", true, &mut out);
        assert_eq!(out, r#""a\"b\\c\n\u0001\u00e9\ud83d\ude00\u007f""#);
    }
}
