//! The server's scheduler on wgpu with the growing KV caches (src/kv.rs) under a byte limit
//! of five 64-position steps of the model's cache: four short requests leave their prefixes
//! in four slots (a step each); a long one then needs four steps, so the idle slots give
//! theirs back and it gets what it gets alone; one needing more than the limit fails with
//! the cache's error, and the scheduler goes on serving.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::time::Duration;

use kiln_backend::KvType;
use kiln_quant::GgmlType;
use kiln_runtime::{
    Event, GenerateOptions, Llm, Prompt, Request, SamplerConfig, Scheduler, SchedulerConfig,
};
use kiln_wgpu::WgpuBackend;

fn fixture(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-models/tests/fixtures/hf")
        .join(dir)
}

/// The fixture's first reference prompt.
fn base_prompt() -> Vec<u32> {
    let text = std::fs::read_to_string(fixture("reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    r["models"]["qwen3"]["prompts"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The Qwen3 fixture on wgpu, f16 caches limited to five 64-position steps.
fn load() -> Result<Llm<WgpuBackend>, kiln_runtime::RuntimeError> {
    let b = WgpuBackend::new().expect("the adapter the test found");
    let mut llm = Llm::load_quantized(b, &fixture("qwen3"), Some(GgmlType::Q4_0))?;
    // f16, as the scheduler's caches hold (the backend's `kv_cache`).
    llm.set_kv_type(KvType::F16)?;
    let step = llm.kv_bytes_for(64) as usize;
    llm.backend.set_kv_byte_limit(Some(5 * step));
    Ok(llm)
}

#[test]
fn scheduler_evicts_idle_prefixes_when_cache_memory_runs_out() {
    if common::gpu().is_none() {
        return;
    }
    let n_ctx = 512;
    let base = base_prompt();
    let long = |n: usize| {
        base.iter()
            .copied()
            .cycle()
            .skip(3)
            .take(n)
            .collect::<Vec<u32>>()
    };
    let opts = GenerateOptions {
        max_tokens: 8,
        sampler: SamplerConfig::greedy(),
        ..Default::default()
    };
    let alone = {
        let llm = load().unwrap();
        let mut s = llm.session(n_ctx, 64);
        s.generate(&long(150), &opts, &mut |_| true).unwrap().tokens
    };
    let cfg = SchedulerConfig {
        slots: 4,
        n_ctx,
        prefill_chunk: 64,
        max_queue: 64,
        timeout: None,
    };
    let s = Scheduler::spawn(cfg, load).unwrap();
    let submit = |p: Vec<u32>| {
        let (tx, rx) = channel();
        s.submit(Request {
            prompt: Prompt::Tokens(p),
            opts: opts.clone(),
            sink: Box::new(tx),
        })
        .unwrap();
        rx
    };
    let wait = |rx: std::sync::mpsc::Receiver<Event>| -> Result<Vec<u32>, String> {
        loop {
            match rx.recv_timeout(Duration::from_secs(300)).expect("event") {
                Event::Text(_) | Event::Logprobs(_) => {}
                Event::Done(c) => return Ok(c.tokens),
                Event::Error(e) => return Err(e.to_string()),
            }
        }
    };
    // Four slots busy at once, each then holding its prefix (a step each). They start with
    // a token the long prompts do not, so those prefill from scratch as alone.
    let other = if long(1)[0] == 1 { 2 } else { 1 };
    let short: Vec<_> = (0..4)
        .map(|i| {
            let mut p = base.clone();
            p.rotate_left(i + 1);
            p.insert(0, other);
            submit(p)
        })
        .collect();
    for rx in short {
        wait(rx).expect("a short request");
    }
    assert_eq!(wait(submit(long(150))).expect("the long request"), alone);
    let e = wait(submit(long(400))).expect_err("a request past the limit");
    assert!(e.contains("KV cache"), "{e}");
    assert_eq!(
        wait(submit(long(150))).expect("served after the failure"),
        alone
    );
}
