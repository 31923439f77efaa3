#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln_formats::GgufFile;
use kiln_text::Tokenizer;
use serde_json::Value;

pub fn asset(name: &str) -> PathBuf {
    kiln_assets::resolve(name, &mut |_| {}).expect("fetch asset")
}

pub fn smollm2_gguf() -> GgufFile {
    GgufFile::open(asset("smollm2-135m-instruct")).expect("open SmolLM2 GGUF")
}

/// One of the three reference tokenizers, by fixture name.
pub fn load(name: &str) -> Tokenizer {
    match name {
        "qwen3" => Tokenizer::from_file(asset("qwen3-tokenizer")).expect("qwen3 tokenizer"),
        "llama3.2" => {
            Tokenizer::from_file(asset("llama3.2-tokenizer")).expect("llama3.2 tokenizer")
        }
        "smollm2" => Tokenizer::from_gguf(&smollm2_gguf()).expect("smollm2 vocabulary"),
        other => panic!("no tokenizer {other}"),
    }
}

pub const TOKENIZERS: [&str; 3] = ["qwen3", "llama3.2", "smollm2"];

pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).expect("fixture JSON")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The corpus texts of a token fixture.
pub fn corpus() -> Vec<String> {
    fixture("tokens_qwen3.json")["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect()
}
