//! Gemma 3 270M (the catalog's `gemma3-270m-it`, a Q4_K_M GGUF) against transformers running
//! the same file (its own GGUF reader dequantizing to f32, `tools/gemma3_reference.py`):
//! the tokenizer's prompt ids; greedy ids on kiln's f32 reference path for five prompts;
//! and the threaded quantized path, teacher-forced along transformers' tokens, picking the
//! same token wherever transformers' choice is clear, on those prompts and on a 700-token
//! prompt that runs past the 512-position sliding window.

use kiln_backend::cpu::CpuBackend;
use kiln_formats::GgufFile;
use kiln_models::llm::Llama;
use serde_json::Value;

struct Case {
    name: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    margins: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemma3_270m_transformers.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_ids"]),
            margins: c["margins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

fn model_file() -> GgufFile {
    let path = kiln_assets::resolve("gemma3-270m-it", &mut |_| {}).unwrap();
    GgufFile::open(path).unwrap()
}

fn argmax(l: &[f32]) -> u32 {
    kiln_backend::argmax_first(l)
}

/// The file's tokenizer gives transformers' prompt ids (BOS first, SentencePiece without a
/// space prefix, `\n` as its own token).
#[test]
fn tokenizer_matches_transformers() {
    let g = model_file();
    let tok = kiln_text::Tokenizer::from_gguf(&g).unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tools/text/eval_en.txt"
    ))
    .unwrap();
    for c in cases() {
        let src = match c.name.starts_with("eval_en.txt") {
            true => text.clone(),
            false => c.name.clone(),
        };
        let mut ids = tok.encode(&src, true).unwrap();
        ids.truncate(c.prompt.len());
        assert_eq!(ids, c.prompt, "{}", c.name);
    }
}

/// kiln's f32 reference path: transformers' greedy tokens exactly (32 per short prompt).
#[test]
fn reference_path_greedy_matches_transformers() {
    let g = model_file();
    let b = CpuBackend::reference();
    let m = Llama::load(&b, &g).unwrap();
    for c in cases().iter().filter(|c| c.prompt.len() < 64) {
        let mut st = m.new_state(&b, 128, 64);
        let mut logits = m
            .forward(&b, &mut st, &c.prompt, 0, false)
            .unwrap()
            .to_vec();
        let mut got = Vec::new();
        for i in 0..c.greedy.len() {
            let next = argmax(&logits);
            got.push(next);
            logits = m
                .forward(&b, &mut st, &[next], c.prompt.len() + i, false)
                .unwrap()
                .to_vec();
        }
        assert_eq!(got, c.greedy, "{}", c.name);
    }
}

/// The threaded quantized path (8-bit activations), teacher-forced along transformers'
/// tokens: its pick is transformers' wherever transformers' top two are more than 0.5 apart
/// (smaller margins may flip under 8-bit activation arithmetic, as llama.cpp's do), and it
/// agrees on most of the steps overall. The long prompt attends past the sliding window.
#[test]
fn quantized_path_follows_transformers() {
    let g = model_file();
    let b = CpuBackend::new(2);
    let m = Llama::load(&b, &g).unwrap();
    let (mut same, mut total) = (0, 0);
    for c in cases() {
        let n_ctx = c.prompt.len() + c.greedy.len() + 1;
        let mut st = m.new_state(&b, n_ctx, 256);
        let mut logits = m
            .forward(&b, &mut st, &c.prompt, 0, false)
            .unwrap()
            .to_vec();
        for (i, (&want, &margin)) in c.greedy.iter().zip(&c.margins).enumerate() {
            let got = argmax(&logits);
            total += 1;
            same += usize::from(got == want);
            assert!(
                got == want || margin <= 0.5,
                "{}: step {i} picks {got}, transformers {want} by a margin of {margin}",
                c.name
            );
            logits = m
                .forward(&b, &mut st, &[want], c.prompt.len() + i, false)
                .unwrap()
                .to_vec();
        }
    }
    assert!(same * 10 >= total * 9, "{same} of {total} steps agree");
}
