//! StreamDecoder: chunks concatenate to the full decode and never split a character.

mod common;

use common::{load, TOKENIZERS};

const FFFD: char = '\u{FFFD}';

fn stream_all(tok: &kiln_text::Tokenizer, ids: &[u32], skip: bool) -> Vec<String> {
    let mut s = tok.stream(skip);
    let mut chunks: Vec<String> = ids.iter().map(|&id| s.push(id).expect("push")).collect();
    chunks.push(s.flush().expect("flush"));
    chunks
}

#[test]
fn chunks_concatenate_to_full_decode() {
    for name in TOKENIZERS {
        let tok = load(name);
        for text in common::corpus() {
            let ids = tok.encode(&text, false).unwrap();
            let chunks = stream_all(&tok, &ids, false);
            assert_eq!(
                chunks.concat(),
                tok.decode(&ids, false).unwrap(),
                "{name}: {text:?}"
            );
            for c in &chunks {
                assert!(!c.contains(FFFD), "{name}: chunk {c:?} of {text:?}");
            }
        }
    }
}

/// Emoji and CJK do get split across byte tokens, and the stream holds them back.
#[test]
fn split_characters_are_held_back() {
    for name in TOKENIZERS {
        let tok = load(name);
        let text = "👨‍👩‍👧‍👦 🏳️‍🌈 日本語 𝄞";
        let ids = tok.encode(text, false).unwrap();
        let partial = ids
            .iter()
            .filter(|&&id| tok.decode(&[id], false).unwrap().contains(FFFD))
            .count();
        assert!(partial > 0, "{name}: no token splits a character");
        let mut s = tok.stream(false);
        let mut held = 0;
        let mut out = String::new();
        for &id in &ids {
            let chunk = s.push(id).unwrap();
            held += chunk.is_empty() as usize;
            assert!(!chunk.contains(FFFD));
            out += &chunk;
        }
        out += &s.flush().unwrap();
        assert!(held > 0, "{name}: nothing was held back");
        assert_eq!(out, text);
    }
}

#[test]
fn skip_special_in_stream() {
    let tok = load("smollm2");
    let ids = tok
        .encode("<|im_start|>user\nHi 😀<|im_end|>", false)
        .unwrap();
    assert_eq!(stream_all(&tok, &ids, true).concat(), "user\nHi 😀");
}

#[test]
fn flush_emits_an_incomplete_character_as_replacement() {
    let tok = load("qwen3");
    let ids = tok.encode("𠜎", false).unwrap();
    assert!(ids.len() > 1, "expected 𠜎 to span byte tokens: {ids:?}");
    let mut s = tok.stream(false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(s.push(id).unwrap(), "");
    }
    assert!(s.flush().unwrap().contains(FFFD));
    assert_eq!(s.flush().unwrap(), "");
}
