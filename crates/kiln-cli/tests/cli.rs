//! The `kiln` binary as a user runs it: real model answers, bad input gets one clear line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const DEFAULT: &str = "smollm2-135m-instruct";

fn model() -> PathBuf {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A failed command: non-zero exit, one stderr line naming the problem, no panic.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

#[test]
fn run_answers_tokyo_with_stats() {
    model();
    let out = kiln(&[
        "run",
        "-p",
        "What is the capital of Japan?",
        "--temp",
        "0",
        "-n",
        "48",
    ]);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{se}");
    assert!(so.contains("Tokyo"), "answer: {so}");
    let stats = se.lines().last().unwrap_or("");
    for k in ["prompt", "ttft", "prefill", "tok/s", "decode"] {
        assert!(stats.contains(k), "stats line lacks {k}: {stats}");
    }
}

#[test]
fn info_describes_the_model() {
    let m = model();
    let out = kiln(&["info", m.to_str().unwrap()]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for k in [
        "GGUF v3",
        "llama",
        "layers 30",
        "Q4_1",
        "Q8_0",
        "byte-level BPE",
        "token_embd.weight",
    ] {
        assert!(so.contains(k), "info lacks {k}:\n{so}");
    }
}

#[test]
fn bad_model_files_are_one_line_errors() {
    let real = std::fs::read(model()).unwrap();
    let trunc = scratch("truncated.gguf");
    std::fs::write(&trunc, &real[..1 << 20]).unwrap();
    let out = kiln(&["run", "-m", trunc.to_str().unwrap(), "-p", "hi"]);
    assert_clean_error(&out, "truncated.gguf");

    let oob = scratch("short-tail.gguf");
    std::fs::write(&oob, &real[..real.len() - 1000]).unwrap();
    let out = kiln(&["run", "-m", oob.to_str().unwrap(), "-p", "hi"]);
    assert_clean_error(&out, "past the end");

    let rnd = scratch("random.gguf");
    let bytes: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&rnd, bytes).unwrap();
    let out = kiln(&["info", rnd.to_str().unwrap()]);
    assert_clean_error(&out, "not a GGUF file");

    let out = kiln(&["run", "-m", "/no/such/model.gguf", "-p", "hi"]);
    assert_clean_error(&out, "/no/such/model.gguf");
}

#[test]
fn prompt_longer_than_context_is_a_clear_error() {
    let m = model();
    let out = kiln(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-c",
        "16",
        "-p",
        "Tell me a long story about the sea.",
    ]);
    assert_clean_error(&out, "context holds 16");
}

#[test]
fn chat_keeps_the_conversation() {
    use std::io::Write;
    model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["chat", "--temp", "0", "-n", "40"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"What is the capital of Japan?\nAnd what is the capital of France?\n/exit\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{se}");
    assert!(so.contains("Tokyo"), "first answer: {so}");
    assert!(so.contains("Paris"), "second answer: {so}");
    // The second turn reuses the first turn's KV cache.
    assert!(se.contains("cached"), "no prefix reuse reported: {se}");
}

fn chat_with(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("chat")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn speculative_decoding_changes_nothing_at_temp_0() {
    model();
    let p = "Rewrite this text, fixing the typos: Teh old lighthouse stood on the edge of the \
             clif, its light sweeping acros the dark water every night.";
    let args = ["run", "-p", p, "--temp", "0", "-n", "32"];
    let plain = kiln(&args);
    let spec = kiln(&[&args[..], &["--lookup", "3"]].concat());
    assert!(spec.status.success(), "{}", text(&spec.stderr));
    assert_eq!(text(&plain.stdout), text(&spec.stdout));
    let stats = text(&spec.stderr);
    assert!(
        stats.contains("accepted") && stats.contains("tok/s"),
        "{stats}"
    );

    // Chat with a draft model (here the model itself): two turns, the draft's cache kept.
    let input = "What is the capital of Japan?\nAnd of France?\n/exit\n";
    let plain = chat_with(&["--temp", "0", "-n", "24"], input);
    let spec = chat_with(
        &[
            "--temp",
            "0",
            "-n",
            "24",
            "--draft",
            DEFAULT,
            "--draft-max",
            "4",
        ],
        input,
    );
    assert!(spec.status.success(), "{}", text(&spec.stderr));
    assert_eq!(text(&plain.stdout), text(&spec.stdout));
    assert!(text(&spec.stderr).contains("accepted"));

    let out = kiln(&["run", "-p", "hi", "--lookup", "3", "--draft", DEFAULT]);
    assert!(!out.status.success());
}

/// A model or a KV cache that does not fit in memory is refused before loading, saying how
/// much it needs (KILN_MEMORY_LIMIT stands in for a small machine).
#[test]
fn model_that_does_not_fit_is_refused_before_loading() {
    let m = model();
    let m = m.to_str().unwrap();
    let run = |limit: &str, extra: &[&str]| {
        let mut args = vec!["run", "-m", m, "-p", "hi", "-n", "2"];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(&args)
            .env("KILN_MEMORY_LIMIT", limit)
            .output()
            .expect("run kiln")
    };
    // The weights: ~92 MiB against 48 MiB.
    let out = run("50000000", &[]);
    assert_clean_error(&out, "needs 92 MiB of memory but 48 MiB is available");
    // The weights fit, a 32768-position f32 KV cache (1.4 GiB) does not, nor an f16 one.
    let out = run("400000000", &["-c", "32768", "--kv-type", "f32"]);
    assert_clean_error(&out, "the KV cache (1 x 32768 positions) needs 1.4 GiB");
    let out = run("400000000", &["-c", "32768", "--kv-type", "f16"]);
    assert_clean_error(&out, "the KV cache (1 x 32768 positions) needs 720 MiB");
    // Enough memory: it answers.
    let out = run("100000000000", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Flags win over the variables: --memory-limit over KILN_MEMORY_LIMIT (either way), and
    // --no-memory-check loads what the limit refuses. A flag after the command or before it.
    let out = run("100000000000", &["--memory-limit", "50000000"]);
    assert_clean_error(&out, "needs 92 MiB of memory but 48 MiB is available");
    let out = run("50000000", &["--memory-limit", "100000000000"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run("50000000", &["--no-memory-check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--memory-limit", "50000000", "run", "-m", m, "-p", "hi"])
        .env_remove("KILN_MEMORY_LIMIT")
        .output()
        .expect("run kiln");
    assert_clean_error(&out, "needs 92 MiB of memory but 48 MiB is available");
}

#[test]
fn device_without_its_backend_is_a_clear_error() {
    // The test build has neither CUDA nor wgpu: every LLM, speech-to-text and text-to-speech
    // command says why, in one line, before loading anything.
    let m = model();
    let m = m.to_str().unwrap();
    for (dev, says) in [("cuda", "CUDA"), ("gpu", "wgpu")] {
        let run = ["run", "-m", m, "-p", "hi", "--device", dev];
        let ppl = ["perplexity", "-m", m, "-f", "Cargo.toml", "--device", dev];
        let serve = [
            "serve",
            "-m",
            m,
            "--no-audio",
            "--port",
            "0",
            "--device",
            dev,
        ];
        // Speech to text too (the audio is not read before the backend is made).
        let stt = ["transcribe", "Cargo.toml", "--device", dev];
        let stt_bench = ["bench", "--stt", "Cargo.toml", "--device", dev];
        // And text to speech (the backend is made before the model is looked for).
        let tts = ["speak", "hello", "-o", "/dev/null", "--device", dev];
        let tts_bench = ["bench", "--tts", "hello", "--device", dev];
        for args in [
            &run[..],
            &ppl[..],
            &serve[..],
            &stt[..],
            &stt_bench[..],
            &tts[..],
            &tts_bench[..],
        ] {
            assert_clean_error(&kiln(args), says);
        }
    }
}

/// `-m ollama:NAME[:TAG]` runs a model from Ollama's store as Ollama laid it out (a manifest
/// naming the GGUF blob by digest): here SmolLM2 placed in a store of its own.
#[test]
fn ollama_models_run_from_its_store() {
    use sha2::{Digest, Sha256};
    let gguf = std::fs::read(model()).unwrap();
    let hex: String = Sha256::digest(&gguf)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let store = scratch("ollama-store");
    let _ = std::fs::remove_dir_all(&store);
    let manifests = store.join("manifests/registry.ollama.ai/library/smollm2");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(store.join("blobs")).unwrap();
    std::fs::write(store.join(format!("blobs/sha256-{hex}")), &gguf).unwrap();
    let manifest = format!(
        r#"{{"schemaVersion":2,"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{hex}","size":{}}}]}}"#,
        gguf.len()
    );
    std::fs::write(manifests.join("135m"), manifest).unwrap();
    let question = |name: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
        c.args(["run", "-m", name, "--temp", "0", "-n", "8"])
            .args(["-p", "What is the capital of France?"])
            .env("OLLAMA_MODELS", &store);
        c.output().expect("run kiln")
    };
    let out = question("ollama:smollm2:135m");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let direct = question(model().to_str().unwrap());
    assert!(!text(&out.stdout).trim().is_empty());
    assert_eq!(text(&out.stdout), text(&direct.stdout));
    // A tag that is not there: one line naming what was looked for.
    assert_clean_error(
        &question("ollama:smollm2:7b"),
        "manifests/registry.ollama.ai/library/smollm2/7b",
    );
}
