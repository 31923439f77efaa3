//! The `llama-bpe` and `qwen2` pre-tokenizers: Qwen3 and Llama-3.2 vocabularies written into
//! GGUF metadata (as a converter does) must tokenize like their `tokenizer.json`.

mod common;

use common::{asset, fixture, ids};
use kiln_formats::{GgufFile, GgufWriter, Value};
use kiln_text::Tokenizer;
use serde_json::Value as Json;

fn gguf_from_tokenizer_json(dir: &str, pre: &str) -> GgufFile {
    let path = asset(dir).join("tokenizer.json");
    let j: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let added = j["added_tokens"].as_array().unwrap();
    let n = vocab.len().max(
        added
            .iter()
            .map(|a| a["id"].as_u64().unwrap() as usize + 1)
            .max()
            .unwrap(),
    );
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_string();
        types[id] = if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    let merges: Vec<Value> = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => Value::String(s.clone()),
            pair => Value::String(format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            )),
        })
        .collect();

    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("test".into()));
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.meta("tokenizer.ggml.pre", Value::String(pre.into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    w.meta("tokenizer.ggml.merges", Value::Array(merges));
    let out = std::env::temp_dir().join(format!("kiln-text-{}-{pre}.gguf", std::process::id()));
    w.write(&out).unwrap();
    let g = GgufFile::open(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    g
}

fn check(dir: &str, pre: &str, fixture_name: &str) {
    let tok = Tokenizer::from_gguf(&gguf_from_tokenizer_json(dir, pre)).unwrap();
    for c in fixture(fixture_name)["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&c["ids"]),
            "{pre}: {text:?}"
        );
        let back = tok.decode(&ids(&c["ids"]), false).unwrap();
        assert_eq!(back, text, "{pre}");
    }
}

#[test]
fn qwen2_pre_matches_qwen3_tokenizer_json() {
    check("qwen3-tokenizer", "qwen2", "tokens_qwen3.json");
}

#[test]
fn llama_bpe_pre_matches_llama32_tokenizer_json() {
    check("llama3.2-tokenizer", "llama-bpe", "tokens_llama3.2.json");
}
