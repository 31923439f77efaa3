//! Perplexity as llama-perplexity computes it, on the tiny Qwen3 Hugging Face fixture, with
//! the expected value built from transformers' logits (tools/make_hf_fixtures.py).

use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_runtime::{nll, Llm};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-models/tests/fixtures/hf")
}

#[test]
fn perplexity_scores_the_second_half_of_each_chunk() {
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap())
            .unwrap();
    let m = &r["models"]["qwen3"];
    let prompt: Vec<u32> = m["prompts"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let logits: Vec<f32> = m["logits"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let vocab = 320;
    // Two chunks of 6 (both the prompt's first 6 tokens, so transformers' logits of the
    // prompt are each chunk's), and 3 tokens of tail that fill no chunk.
    let n_ctx = 6;
    let mut tokens = prompt[..6].to_vec();
    tokens.extend_from_slice(&prompt[..6]);
    tokens.extend_from_slice(&prompt[..3]);
    // Scored: positions 3 and 4 of each chunk predict tokens 4 and 5.
    let want: Vec<f64> = (3..5)
        .map(|j| nll(&logits[j * vocab..(j + 1) * vocab], prompt[j + 1]))
        .collect();
    let mean = want.iter().sum::<f64>() / 2.0;
    let want_ppl = mean.exp();

    for b in [CpuBackend::reference(), CpuBackend::new(2)] {
        let llm = Llm::load(b, &fixtures().join("qwen3")).unwrap();
        let mut seen = Vec::new();
        let p = llm
            .perplexity(&tokens, n_ctx, false, 0, &mut |i, v| seen.push((i, v)))
            .unwrap();
        assert_eq!(p.scored, 4);
        assert_eq!(seen.len(), 2);
        assert!(
            (p.ppl - want_ppl).abs() < 1e-4 * want_ppl,
            "ppl {} vs {want_ppl}",
            p.ppl
        );
        // Both chunks are the same tokens: the running value is the final one throughout.
        assert!((p.per_chunk[0] - p.ppl).abs() < 1e-6 * p.ppl);
        // The spread: sample standard error of the four NLLs (two pairs), times PPL.
        let d = (want[0] - want[1]).abs() / 2.0;
        let se = (d * d * 4.0 / 3.0 / 4.0).sqrt();
        assert!(
            (p.ppl_err - se * p.ppl).abs() < 1e-3 * p.ppl.max(1.0),
            "{} vs {}",
            p.ppl_err,
            se * p.ppl
        );
        // One chunk only when asked.
        let one = llm
            .perplexity(&tokens, n_ctx, false, 1, &mut |_, _| {})
            .unwrap();
        assert_eq!(one.scored, 2);
        // Too short a text is an error, not a panic.
        let e = llm.perplexity(&tokens[..11], n_ctx, false, 0, &mut |_, _| {});
        assert!(e.unwrap_err().to_string().contains("needs at least 12"));
    }
}
