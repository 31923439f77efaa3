//! A model whose sequences carry more than a KV cache (LFM2's convolution state, the tiny
//! fixture kiln-models' tests check against transformers): a session reuses its cache only
//! where it continues from its end, restarts where a prompt parts from what it holds, and
//! speculative decoding (which would have to rewind past rejected drafts) is refused.

use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_runtime::engine::{EngineSetup, LlmEngine};
use kiln_runtime::{GenerateOptions, Llm, RuntimeError, SamplerConfig};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-models/tests/fixtures/hf/lfm2")
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: Vec::new(),
        sampler: SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The greedy tokens after `prompt` in a session of its own.
fn fresh(llm: &Llm<CpuBackend>, prompt: &[u32]) -> Vec<u32> {
    let mut s = llm.session(128, 16);
    s.generate(prompt, &greedy(8), &mut |_| true)
        .unwrap()
        .tokens
}

#[test]
fn a_session_reuses_only_what_continues_its_state() {
    let llm = Llm::load(CpuBackend::new(1), &fixture()).unwrap();
    assert!(llm.model.has_recurrent_state());
    let a: Vec<u32> = vec![5, 71, 290, 3, 150, 42, 17, 255, 256, 100];
    let mut s = llm.session(128, 16);
    let first = s.generate(&a, &greedy(8), &mut |_| true).unwrap();
    assert_eq!(first.tokens, fresh(&llm, &a));
    // A prompt that extends what the session holds goes on from its end.
    let mut b = s.tokens().to_vec();
    b.extend([9, 77, 281]);
    let st = s.generate(&b, &greedy(8), &mut |_| true).unwrap();
    assert_eq!(
        st.cached_tokens,
        b.len() - 3,
        "continued from the cached state"
    );
    assert_eq!(st.tokens, fresh(&llm, &b));
    // One that parts from it midway starts over (the state cannot be rewound).
    let mut c = a[..6].to_vec();
    c.extend([33, 64, 200]);
    let st = s.generate(&c, &greedy(8), &mut |_| true).unwrap();
    assert_eq!(st.cached_tokens, 0);
    assert_eq!(st.tokens, fresh(&llm, &c));
    // The same prompt again: its last token would be recomputed, so it starts over too.
    let st = s.generate(&c, &greedy(8), &mut |_| true).unwrap();
    assert_eq!(st.tokens, fresh(&llm, &c));
}

#[test]
fn speculative_decoding_is_refused() {
    let path = fixture();
    let e = LlmEngine::spawn(move || {
        Ok::<_, RuntimeError>(EngineSetup {
            llm: Llm::load(CpuBackend::new(1), &path)?,
            draft: None,
            n_ctx: 128,
            lookup: Some(2),
            draft_max: 4,
        })
    });
    let err = e.err().expect("refused").to_string();
    assert!(
        err.contains("speculative decoding") && err.contains("lfm2"),
        "{err}"
    );
}
