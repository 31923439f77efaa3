//! Transcription from the other Whisper formats, written at test time from the catalog's
//! CTranslate2 tiny.en by tools/whisper_ct2_to_{ggml,hf}.py: a whisper.cpp ggml `.bin` with
//! no tokenizer.json beside it (its own vocabulary becomes the tokenizer) and a Hugging Face
//! directory must transcribe exactly as the CTranslate2 model does.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_backend::cpu::CpuBackend;
use kiln_models::whisper::LoadOptions;
use kiln_runtime::whisper::{Stt, TranscribeOptions};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/assets");

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("whisper-formats")
}

fn ct2() -> &'static Stt<CpuBackend> {
    static S: OnceLock<Stt<CpuBackend>> = OnceLock::new();
    S.get_or_init(|| {
        let p = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
        Stt::load(CpuBackend::new(2), &p, LoadOptions::default()).unwrap()
    })
}

fn ggml() -> &'static Stt<CpuBackend> {
    static S: OnceLock<Stt<CpuBackend>> = OnceLock::new();
    S.get_or_init(|| {
        let p = kiln_assets::convert::whisper_ggml(&out_dir(), "f16").unwrap();
        assert!(!p.with_file_name("tokenizer.json").exists());
        Stt::load(CpuBackend::new(2), &p, LoadOptions::default()).unwrap()
    })
}

fn jfk() -> Vec<f32> {
    kiln_audio::load_16k(Path::new(&format!("{SHARED}/audio/jfk.wav")))
        .unwrap()
        .samples
}

fn golden() -> (Vec<u32>, String) {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{SHARED}/golden/whisper_tiny_en_jfk.json")).unwrap(),
    )
    .unwrap();
    let ids = v["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (ids, v["text"].as_str().unwrap().to_string())
}

#[test]
fn ggml_vocabulary_tokenizes_like_tokenizer_json() {
    let (a, b) = (ct2(), ggml());
    // Hebrew is `<|iw|>` in Hugging Face's vocabulary, `<|he|>` (OpenAI's code) here.
    let show =
        |s: &kiln_runtime::whisper::SpecialTokens| format!("{s:?}").replace("\"iw\"", "\"he\"");
    assert_eq!(show(&a.special), show(&b.special));
    assert_eq!(a.special.language("he"), b.special.language("iw"));
    assert_eq!(a.suppress, b.suppress);
    for text in [
        " And so my fellow Americans, ask not what your country can do for you.",
        "Hello world! It's 2024: 3.14159 and 1,000,000 dollars.",
        " naïve café — Größe, 東京 and emoji 🎉 ♪♪",
        "  two  spaces\tand\nnewlines  ",
        "<|endoftext|> is special, <|en|> too",
        "'s 't 're 've 'm 'll 'd",
    ] {
        let (x, y) = (a.encode(text).unwrap(), b.encode(text).unwrap());
        assert_eq!(x, y, "{text:?}");
        assert_eq!(a.text(&x).unwrap(), b.text(&y).unwrap());
    }
    let (ids, text) = golden();
    assert_eq!(b.text(&ids).unwrap(), text);
    // Every text token decodes to the same bytes (one at a time, so no merging hides one).
    for id in (0..50256u32).step_by(7) {
        let (x, y) = (
            a.tokenizer.decode(&[id], false),
            b.tokenizer.decode(&[id], false),
        );
        assert_eq!(x.unwrap(), y.unwrap(), "token {id}");
    }
}

#[test]
fn ggml_file_transcribes_exactly_like_ct2() {
    let mut o = TranscribeOptions::default();
    o.decode.timestamps = false;
    let t = ggml().transcribe(&jfk(), &o).unwrap();
    let (ids, text) = golden();
    assert_eq!(t.segments[0].tokens, ids);
    assert_eq!(t.text, text);
    let o = TranscribeOptions::default();
    let (x, y) = (
        ct2().transcribe(&jfk(), &o).unwrap(),
        ggml().transcribe(&jfk(), &o).unwrap(),
    );
    let toks = |t: &kiln_runtime::whisper::Transcript| {
        t.segments
            .iter()
            .map(|s| s.tokens.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(toks(&x), toks(&y));
}

#[test]
fn hf_directory_transcribes_exactly_like_ct2() {
    let p = kiln_assets::convert::whisper_hf(&out_dir(), "f16", 1).unwrap();
    let hf = Stt::load(CpuBackend::new(2), &p, LoadOptions::default()).unwrap();
    assert_eq!(hf.suppress, ct2().suppress);
    let o = TranscribeOptions::default();
    let (x, y) = (
        ct2().transcribe(&jfk(), &o).unwrap(),
        hf.transcribe(&jfk(), &o).unwrap(),
    );
    assert_eq!(x.text, y.text);
    let toks = |t: &kiln_runtime::whisper::Transcript| {
        t.segments
            .iter()
            .map(|s| s.tokens.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(toks(&x), toks(&y));
    // generation_config.json's special ids are checked against the tokenizer.
    let bad = out_dir().join("hf-bad-generation");
    std::fs::create_dir_all(&bad).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(p.join(f), bad.join(f)).unwrap();
    }
    std::fs::write(
        bad.join("generation_config.json"),
        r#"{"no_timestamps_token_id": 50363}"#,
    )
    .unwrap();
    let e = Stt::load(CpuBackend::new(1), &bad, LoadOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no_timestamps_token_id is 50363 but the tokenizer has 50362"),
        "{e}"
    );
}
