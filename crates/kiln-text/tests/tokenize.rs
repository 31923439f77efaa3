//! Token ids against the Python `tokenizers` references, round trips, special-token facts.

mod common;

use common::{fixture, ids, load, TOKENIZERS};

#[test]
fn ids_match_reference() {
    for name in TOKENIZERS {
        let tok = load(name);
        let fx = fixture(&format!("tokens_{name}.json"));
        let cases = fx["cases"].as_array().expect("cases");
        assert!(cases.len() >= 20);
        for c in cases {
            let text = c["text"].as_str().expect("text");
            let got = tok.encode(text, false).expect("encode");
            assert_eq!(got, ids(&c["ids"]), "{name}: {text:?}");
            let got = tok.encode(text, true).expect("encode");
            assert_eq!(
                got,
                ids(&c["ids_special"]),
                "{name} (add_special): {text:?}"
            );
        }
    }
}

#[test]
fn decode_inverts_encode() {
    for name in TOKENIZERS {
        let tok = load(name);
        for text in common::corpus() {
            let ids = tok.encode(&text, false).expect("encode");
            assert_eq!(tok.decode(&ids, false).expect("decode"), text, "{name}");
        }
    }
}

#[test]
fn specials_are_parsed_and_skippable() {
    let tok = load("smollm2");
    let ids = tok
        .encode("<|im_start|>user\nHi<|im_end|>", false)
        .expect("encode");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode(&ids, true).expect("decode"), "user\nHi");
    assert_eq!(tok.token_str(1).as_deref(), Some("<|im_start|>"));
}

#[test]
fn smollm2_facts() {
    let tok = load("smollm2");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert!(tok.is_eog(2) && tok.is_eog(0) && !tok.is_eog(1) && !tok.is_eog(504));
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
    // add_bos_token is false: add_special changes nothing.
    assert_eq!(
        tok.encode("Hi", true).unwrap(),
        tok.encode("Hi", false).unwrap()
    );
}

#[test]
fn qwen3_facts() {
    let tok = load("qwen3");
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
    let eot = tok.token_id("<|endoftext|>").expect("<|endoftext|>");
    assert_eq!(tok.eos_id(), Some(im_end));
    assert_eq!(tok.bos_id(), None);
    assert!(tok.is_eog(im_end) && tok.is_eog(eot));
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("enable_thinking")));
}

#[test]
fn llama32_facts() {
    let tok = load("llama3.2");
    assert_eq!(tok.bos_id(), Some(128000));
    assert_eq!(tok.bos_token(), Some("<|begin_of_text|>"));
    assert_eq!(tok.eos_token(), Some("<|eot_id|>"));
    assert!(tok.is_eog(128009) && tok.is_eog(128001) && !tok.is_eog(128000));
    assert_eq!(tok.encode("Hi", true).unwrap()[0], 128000);
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("strftime_now")));
}

#[test]
fn out_of_range_id_is_an_error() {
    let tok = load("smollm2");
    let err = tok.decode(&[5, 49152], false).unwrap_err().to_string();
    assert!(err.contains("49152"), "{err}");
}
