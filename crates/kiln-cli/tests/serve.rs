//! `kiln serve` as a user starts it (LLM, Whisper and Kokoro), driven by the official
//! `openai` Python client (tools/openai_client_test.py): chat, completions, transcriptions
//! of jfk.wav in every format, speech transcribed back. Then as apps use it, through the
//! official `openai` and `ollama` clients (tools/api_clients.py): tool round trips, JSON
//! schemas, logprobs, Ollama's routes. The clients are installed with pip when missing;
//! failing to get them fails the test (it is never skipped).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the Python packages missing for `modules` ((import name, pip requirement)), one
/// test at a time: two pip runs installing into one site-packages at once fail each other
/// (one removed a file the other was compiling).
fn python_packages(modules: &[(&str, &str)]) {
    static PIP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = PIP.lock().unwrap_or_else(|p| p.into_inner());
    for (module, req) in modules {
        if python_has(module) {
            continue;
        }
        let st = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", req])
            .status()
            .expect("run python3 -m pip");
        assert!(st.success(), "pip install {req} failed");
        assert!(
            python_has(module),
            "{module} still not importable after pip install"
        );
    }
}

/// Starts `kiln serve ARGS` on a free port; its URL once it says "kiln serve: listening on
/// http://127.0.0.1:PORT" (its stderr drained after, so it never blocks on a full pipe).
fn start(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kiln serve");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("kiln serve exited before listening")
            .unwrap();
        if let Some(u) = line.split("listening on ").nth(1) {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (server, url)
}

#[test]
fn openai_and_ollama_clients_as_apps_use_them() {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap();
    python_packages(&[
        ("openai", "openai"),
        ("ollama", "ollama"),
        ("jsonschema", "jsonschema"),
    ]);
    let (server, url) = start(&["-c", "1024", "--parallel", "4", "--no-audio"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/api_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&url)
        .output()
        .expect("run the client checks");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "client checks failed:\n{so}\n{se}");
    assert!(so.contains("all client checks passed"), "{so}");
    eprintln!("{}", so.trim());
    drop(server);
}

/// The official openai client's tool round trip (streamed and not) under the real Qwen3
/// chat template (its own `<tool_call>` format), served by `kiln serve` from a Hugging Face
/// directory: the tiny random Qwen3 of the model tests with Qwen3's template put in.
#[test]
fn openai_client_tool_round_trip_under_the_qwen3_template() {
    python_packages(&[
        ("openai", "openai"),
        ("jsonschema", "jsonschema"),
        ("ollama", "ollama"),
    ]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-models/tests/fixtures/hf/qwen3");
    let dir = std::env::temp_dir().join(format!("kiln-serve-tiny-qwen3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let tok = kiln_assets::resolve("qwen3-tokenizer", &mut |_| {}).unwrap();
    let real: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tok.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap())
            .unwrap();
    c["chat_template"] = real["chat_template"].clone();
    assert!(c["chat_template"].as_str().unwrap().contains("<tool_call>"));
    std::fs::write(dir.join("tokenizer_config.json"), c.to_string()).unwrap();
    let (server, url) = start(&["-m", dir.to_str().unwrap(), "-c", "1024", "--no-audio"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/api_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&url)
        .args(["--tools-only", "--max-tokens", "200"])
        .output()
        .expect("run the client checks");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "client checks failed:\n{so}\n{se}");
    assert!(so.contains("tool round trip (stream=False)"), "{so}");
    assert!(so.contains("tool round trip (stream=True)"), "{so}");
    eprintln!("{}", so.trim());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn openai_python_client_against_kiln_serve() {
    for m in [
        "smollm2-135m-instruct",
        "whisper-tiny.en",
        "kokoro-82m",
        "misaki-en-us",
    ] {
        kiln_assets::resolve(m, &mut |_| {}).unwrap();
    }
    let jfk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/assets/audio/jfk.wav");
    assert!(jfk.is_file(), "{} is missing", jfk.display());
    python_packages(&[("openai", "openai")]);
    let (server, url) = start(&[
        "-c",
        "1024",
        "--parallel",
        "2",
        "--api-key",
        "k3y",
        "--stt",
        "whisper-tiny.en",
        "--tts",
        "kokoro-82m",
    ]);
    // The default address is the loopback one: nothing outside the machine reaches it.
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/openai_client_test.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--base-url", &format!("{url}/v1"), "--api-key", "k3y"])
        .arg("--audio")
        .arg(&jfk)
        .output()
        .expect("run the openai client test");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "openai client test failed:\n{so}\n{se}"
    );
    assert!(so.contains("unknown model: ok"), "{so}");
    assert!(so.contains("streamed transcription: ok"), "{so}");
    assert!(so.contains("speech wav -> transcription: ok"), "{so}");
    eprintln!("{}", so.trim());
    drop(server);
}

/// A speech model named on the command line must load: a one-line error, not a server
/// without it.
#[test]
fn a_named_speech_model_that_cannot_load_is_an_error() {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "--stt", "/no/such/whisper"])
        .output()
        .expect("run kiln serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let last = err.trim().lines().last().unwrap_or("");
    assert!(
        last.starts_with("kiln: error: loading the speech-to-text model /no/such/whisper"),
        "{err}"
    );
}

/// Spanish speech (Kokoro's ef_dora speaking fixed phonemes, so no espeak-ng is needed)
/// through the multilingual Whisper base: `/v1/audio/transcriptions` writes it in Spanish,
/// `/v1/audio/translations` in English, both through the official `openai` client; an
/// English-only model's translation is a 400 that says why.
#[test]
fn translations_write_spanish_speech_in_english() {
    for m in [
        "smollm2-135m-instruct",
        "whisper-base",
        "whisper-tiny.en",
        "kokoro-82m",
    ] {
        kiln_assets::resolve(m, &mut |_| {}).unwrap();
    }
    python_packages(&[("openai", "openai")]);
    let wav = std::env::temp_dir().join(format!("kiln-serve-es-{}.wav", std::process::id()));
    let spoke = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["speak", "--phonemes", "ˈola, kˈomo estˈas? me ʎˈamo xwˈan."])
        .args(["--voice", "ef_dora", "-o", wav.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        spoke.status.success(),
        "{}",
        String::from_utf8_lossy(&spoke.stderr)
    );
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none")
print("T:" + c.audio.transcriptions.create(model="whisper-1", file=open(sys.argv[2], "rb")).text)
print("E:" + c.audio.translations.create(model="whisper-1", file=open(sys.argv[2], "rb")).text)
"#;
    let words = |s: &str| -> String {
        s.to_lowercase()
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { ' ' })
            .collect::<String>()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (server, url) = start(&["-c", "512", "--stt", "whisper-base", "--tts", "none"]);
    let out = Command::new("python3")
        .args(["-c", script, &format!("{url}/v1"), wav.to_str().unwrap()])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |p: &str| {
        so.lines()
            .find_map(|l| l.strip_prefix(p))
            .unwrap_or_default()
    };
    assert_eq!(words(line("T:")), "hola cómo estás me llamo juan", "{so}");
    assert!(words(line("E:")).starts_with("hello how are you"), "{so}");
    drop(server);

    let (server, url) = start(&["-c", "512", "--stt", "whisper-tiny.en", "--tts", "none"]);
    let out = Command::new("python3")
        .args(["-c", script, &format!("{url}/v1"), wav.to_str().unwrap()])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(se.contains("400") && se.contains("English-only"), "{se}");
    drop(server);
}
