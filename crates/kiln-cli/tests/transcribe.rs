//! `kiln transcribe` and `kiln bench --stt` as a user runs them: the default Whisper model on
//! real speech (file and raw PCM on stdin), subtitle output, and one clear line for bad input.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const JFK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/assets/audio/jfk.wav"
);

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-stt-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn assert_clean_error(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "expected failure: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

fn fetch() {
    kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
}

#[test]
fn transcribes_a_wav_file_to_srt() {
    fetch();
    let out = kiln(&["transcribe", JFK, "--format", "srt", "-t", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let srt = text(&out.stdout);
    assert!(srt.starts_with("1\n00:00:0"), "{srt}");
    assert!(srt.contains(" --> "), "{srt}");
    assert!(
        srt.contains("ask not what your country can do for you"),
        "{srt}"
    );
    let err = text(&out.stderr);
    assert!(err.contains("RTF"), "stats line: {err}");
}

#[test]
fn raw_pcm_on_stdin_and_q8_0_weights() {
    fetch();
    // jfk.wav is 16 kHz mono s16le after a 44-byte header.
    let wav = std::fs::read(JFK).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "transcribe",
            "-",
            "--quant",
            "q8_0",
            "-t",
            "2",
            "--no-timestamps",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&wav[44..]).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout).to_lowercase();
    assert!(
        t.contains("ask not what your country can do for you"),
        "{t}"
    );
    assert!(t.contains("ask what you can do for your country"), "{t}");
}

#[test]
fn bad_input_is_one_clear_line() {
    fetch();
    let p = scratch("notes.wav");
    std::fs::write(&p, "not audio at all, just some text\n".repeat(10)).unwrap();
    assert_clean_error(
        &kiln(&["transcribe", p.to_str().unwrap()]),
        "not a supported audio file",
    );
    let e = scratch("empty.wav");
    std::fs::write(&e, b"").unwrap();
    assert_clean_error(&kiln(&["transcribe", e.to_str().unwrap()]), "empty");
    assert_clean_error(
        &kiln(&["transcribe", "/no/such/file.wav"]),
        "/no/such/file.wav",
    );
    // A truncated model.bin in a model directory.
    let dir = scratch("model");
    std::fs::create_dir_all(&dir).unwrap();
    let src = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    let src = if src.is_dir() {
        src
    } else {
        src.parent().unwrap().into()
    };
    let bin = std::fs::read(src.join("model.bin")).unwrap();
    std::fs::write(dir.join("model.bin"), &bin[..bin.len() / 3]).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let out = kiln(&["transcribe", JFK, "-m", dir.to_str().unwrap()]);
    assert_clean_error(&out, "truncated");
    // English-only model asked for another language.
    let out = kiln(&["transcribe", JFK, "--language", "de"]);
    assert_clean_error(&out, "English-only");
}

#[test]
fn bench_stt_reports_encoder_decoder_and_rtf() {
    fetch();
    let out = kiln(&["bench", "--stt", JFK, "-r", "1", "-t", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    for k in ["encoder_ms_per_window", "decode_ms_per_token", "rtf"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
}
