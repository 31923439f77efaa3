//! Chat templates rendered byte for byte like Jinja2, errors, and the SmolLM2 golden prompt.

mod common;

use std::path::Path;

use common::{fixture, ids, load};
use kiln_text::{ChatTemplate, Message, TemplateValue};
use serde_json::Value;

fn messages(v: &Value) -> Vec<Message> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let mut msg = Message::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            );
            msg.tool_calls = m.get("tool_calls").cloned();
            msg.tool_call_id = m["tool_call_id"].as_str().map(str::to_string);
            msg.name = m["name"].as_str().map(str::to_string);
            msg
        })
        .collect()
}

/// The template source and bos/eos strings each fixture case names.
fn template(fx: &Value, name: &str) -> ChatTemplate {
    let source = match name {
        "qwen3" | "llama3.2" | "smollm2" => {
            load(name).chat_template().expect("template").to_string()
        }
        synth => fx["synthetic"][synth]
            .as_str()
            .expect("synthetic")
            .to_string(),
    };
    let be = &fx["bos_eos"][name];
    let (bos, eos) = (be[0].as_str().unwrap(), be[1].as_str().unwrap());
    let time = fx["fixed_time"].as_i64().expect("fixed_time");
    ChatTemplate::new(&source, bos, eos)
        .expect("compile")
        .with_time(time)
        .expect("time")
}

#[test]
fn renders_match_jinja2() {
    let fx = fixture("chat.json");
    let cases = fx["cases"].as_array().expect("cases");
    let mut by_name = std::collections::BTreeMap::new();
    let (mut ok, mut errors) = (0, 0);
    for c in cases {
        let name = c["template"].as_str().unwrap();
        let tmpl = by_name
            .entry(name.to_string())
            .or_insert_with(|| template(&fx, name));
        let conv = c["conversation"].as_str().unwrap();
        let msgs = messages(&fx["conversations"][conv]);
        let agp = c["add_generation_prompt"].as_bool().unwrap();
        let extra = TemplateValue::from_serialize(&c["extra"]);
        let got = tmpl.render_with(&msgs, agp, extra);
        let what = format!("{name} / {conv} / agp={agp} / extra={}", c["extra"]);
        match (&c["expected"], &c["error"]) {
            (Value::String(want), _) => {
                assert_eq!(got.expect(&what), *want, "{what}");
                ok += 1;
            }
            (_, Value::String(msg)) => {
                let err = got.expect_err(&what).to_string();
                assert!(err.contains(msg.as_str()), "{what}: {err}");
                assert!(!err.contains('\n'), "one-line error: {err:?}");
                errors += 1;
            }
            _ => panic!("bad case {what}"),
        }
    }
    assert!(ok >= 60 && errors >= 1, "{ok} renders, {errors} errors");
}

#[test]
fn raise_exception_is_an_error() {
    let t = ChatTemplate::new("{{ raise_exception('nope: ' + messages[0].role) }}", "", "")
        .expect("compile");
    let err = t.render(&[Message::new("user", "x")], false).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("nope: user"), "{msg}");
}

#[test]
fn malformed_template_is_an_error() {
    for bad in [
        "{% for m in messages %}",
        "{{ messages[0 }}",
        "{% if %}x{% endif %}",
    ] {
        let err = ChatTemplate::new(bad, "", "").err().expect(bad).to_string();
        assert!(
            err.starts_with("chat template:") && !err.contains('\n'),
            "{err:?}"
        );
    }
    // Runtime errors too: unknown filter, calling a string.
    let t = ChatTemplate::new("{{ messages | nosuchfilter }}", "", "");
    assert!(t.is_err() || t.unwrap().render(&[], false).is_err());
    let t = ChatTemplate::new("{{ 'a'() }}", "", "").expect("compile");
    assert!(t.render(&[], false).is_err());
}

#[test]
fn qwen3_enable_thinking() {
    let tok = load("qwen3");
    let t = ChatTemplate::new(tok.chat_template().unwrap(), "", "<|im_end|>").unwrap();
    let msgs = [Message::new("user", "Hi")];
    let extra = kiln_text::value_from_json(r#"{"enable_thinking": false}"#).unwrap();
    let off = t.render_with(&msgs, true, extra).unwrap();
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off:?}"
    );
    let on = t.render(&msgs, true).unwrap();
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
}

#[test]
fn smollm2_golden_prompt() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/assets/golden/smollm2_135m_instruct_q4_1_capital_of_france.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let golden: Value = serde_json::from_str(&text).unwrap();

    let tok = load("smollm2");
    let t = ChatTemplate::new(
        tok.chat_template().expect("embedded template"),
        tok.bos_token().unwrap_or(""),
        tok.eos_token().unwrap_or(""),
    )
    .unwrap();
    let prompt = t
        .render(
            &[Message::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(prompt, golden["prompt"].as_str().unwrap());
    assert_eq!(
        tok.encode(&prompt, true).unwrap(),
        ids(&golden["prompt_ids"])
    );
    let greedy = ids(&golden["greedy_ids"]);
    assert_eq!(
        tok.decode(&greedy, true).unwrap(),
        golden["greedy_text"].as_str().unwrap()
    );
}

/// The bounds on a render (kiln_text::Limits) leave real templates a wide margin: a
/// 500-message conversation through the Qwen3, Llama 3.2 and SmolLM2 templates renders within a
/// tenth of the default fuel and output.
#[test]
fn real_templates_fit_a_tenth_of_the_default_limits() {
    let d = kiln_text::Limits::default();
    let tenth = kiln_text::Limits {
        fuel: d.fuel / 10,
        output: d.output / 10,
        ..d
    };
    let msgs: Vec<Message> = (0..500)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            Message::new(
                role,
                "a sentence of about ten words, for the template. ".repeat(4),
            )
        })
        .collect();
    for name in ["qwen3", "llama3.2", "smollm2"] {
        let src = load(name).chat_template().expect("template").to_string();
        let t = ChatTemplate::new(&src, "<s>", "</s>")
            .unwrap()
            .with_limits(tenth);
        let out = t
            .render(&msgs, true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.len() > 500 * 200, "{name}");
    }
}
