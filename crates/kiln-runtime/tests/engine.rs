//! `LlmEngine` (the model on a thread of its own) against the same model driven directly on
//! SmolLM2-135M-Instruct at temperature 0: the same text streamed piece by piece, a session
//! that keeps its tokens between turns until reset, a reader that stops the generation, and
//! a load error returned from `spawn`.

use kiln_backend::TensorOps;
use std::path::PathBuf;

use kiln_backend::cpu::CpuBackend;
use kiln_runtime::engine::{EngineSetup, LlmEngine};
use kiln_runtime::{GenerateOptions, Llm, RuntimeError, SamplerConfig};
use kiln_text::Message;

fn model_path() -> PathBuf {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap()
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

fn engine() -> LlmEngine {
    let path = model_path();
    LlmEngine::spawn(move || {
        Ok::<_, RuntimeError>(EngineSetup {
            llm: Llm::load(CpuBackend::new(2), &path)?,
            draft: None,
            n_ctx: 512,
            lookup: None,
            draft_max: 4,
        })
    })
    .unwrap()
}

#[test]
fn engine_answers_as_the_model_does_directly() {
    let msgs = [Message::new("user", "What is the capital of France?")];
    // Directly, on this thread.
    let llm = Llm::load(CpuBackend::new(2), &model_path()).unwrap();
    let ids = llm
        .tokenize(&llm.render_chat(&msgs).unwrap(), false)
        .unwrap();
    let mut session = llm.session(512, 512);
    let mut want = String::new();
    session
        .generate(&ids, &greedy(24), &mut |t| {
            want.push_str(t);
            true
        })
        .unwrap();
    assert!(!want.is_empty());

    let e = engine();
    assert_eq!(e.info().backend, llm.backend.name());
    assert_eq!(e.info().n_ctx, 512);
    let got_ids = e.tokenize(&e.render_chat(&msgs).unwrap(), false).unwrap();
    assert_eq!(got_ids, ids);
    let (mut got, mut pieces) = (String::new(), 0);
    let st = e
        .generate(&got_ids, &greedy(24), &mut |t| {
            got.push_str(t);
            pieces += 1;
            true
        })
        .unwrap();
    assert_eq!(got, want);
    assert!(pieces > 1, "streamed as it came, not at the end");
    assert_eq!(st.prompt_tokens, ids.len());

    // The session keeps the turn: the same prompt again comes from its cache.
    let st = e.generate(&got_ids, &greedy(4), &mut |_| true).unwrap();
    assert!(st.cached_tokens > 0, "{st:?}");
    e.reset();
    let st = e.generate(&got_ids, &greedy(4), &mut |_| true).unwrap();
    assert_eq!(st.cached_tokens, 0);

    // A reader that stops after the second piece ends the generation there.
    let mut n = 0;
    let st = e
        .generate(&got_ids, &greedy(64), &mut |_| {
            n += 1;
            n < 2
        })
        .unwrap();
    assert_eq!(n, 2);
    assert!(st.generated_tokens < 64, "{st:?}");
}

#[test]
fn a_model_that_does_not_load_is_an_error_from_spawn() {
    let e = LlmEngine::spawn(|| {
        Ok::<_, RuntimeError>(EngineSetup {
            llm: Llm::load(
                CpuBackend::new(1),
                std::path::Path::new("/no/such/model.gguf"),
            )?,
            draft: None,
            n_ctx: 0,
            lookup: None,
            draft_max: 4,
        })
    });
    let err = e.err().expect("no model, no engine").to_string();
    assert!(err.contains("/no/such/model.gguf"), "{err}");
}
