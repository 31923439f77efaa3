//! Hand-built GGUF vocabularies: SentencePiece merges by score, byte fallback, BOS, errors.

use kiln_formats::{GgufFile, GgufWriter, Value};
use kiln_text::{TextError, Tokenizer};

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
}

fn open(name: &str, meta: Vec<(&str, Value)>) -> GgufFile {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()));
    for (k, v) in meta {
        w.meta(k, v);
    }
    // A path of its own for every call: tests running at once build the same vocabulary.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "kiln-text-{}-{name}-{call}.gguf",
        std::process::id()
    ));
    w.write(&path).expect("write GGUF");
    let g = GgufFile::open(&path).expect("open GGUF");
    let _ = std::fs::remove_file(&path);
    g
}

/// `<unk> <s> </s>`, 256 byte tokens, then scored pieces.
fn spm_vocab() -> GgufFile {
    let pieces: [(&str, f32); 21] = [
        ("▁hello", -1.0),
        ("▁world", -2.0),
        ("▁he", -3.0),
        ("llo", -4.0),
        ("▁wor", -5.0),
        ("ld", -6.0),
        ("▁h", -7.0),
        ("he", -8.0),
        ("ll", -9.0),
        ("▁w", -10.0),
        ("or", -11.0),
        ("▁", -20.0),
        ("h", -21.0),
        ("e", -22.0),
        ("l", -23.0),
        ("o", -24.0),
        ("w", -25.0),
        ("r", -26.0),
        ("d", -27.0),
        ("!", -28.0),
        ("<|user|>", 0.0),
    ];
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let mut scores = vec![0.0f32; tokens.len()];
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(if p == "<|user|>" { 4 } else { 1 });
        scores.push(s);
    }
    let toks: Vec<&str> = tokens.iter().map(String::as_str).collect();
    open(
        "spm",
        vec![
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.tokens", strs(&toks)),
            (
                "tokenizer.ggml.scores",
                Value::Array(scores.into_iter().map(Value::F32).collect()),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types.into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
            ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
        ],
    )
}

fn pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| tok.token_str(i).unwrap()).collect()
}

#[test]
fn sentencepiece_merges_by_score() {
    let tok = Tokenizer::from_gguf(&spm_vocab()).unwrap();
    let ids = tok.encode("hello world", false).unwrap();
    assert_eq!(pieces(&tok, &ids), ["▁hello", "▁world"]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");
    // add_bos_token defaults to true for SentencePiece vocabularies.
    assert_eq!(tok.encode("hello", true).unwrap()[0], 1);
    assert!(tok.is_eog(2) && !tok.is_eog(1));
    let ids = tok.encode("hold", false).unwrap();
    assert_eq!(pieces(&tok, &ids), ["▁h", "o", "ld"]);
}

#[test]
fn sentencepiece_byte_fallback_and_stream() {
    let tok = Tokenizer::from_gguf(&spm_vocab()).unwrap();
    let text = "hello 日本!<|user|>hello";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(
        pieces(&tok, &ids),
        [
            "▁hello", "▁", "<0xE6>", "<0x97>", "<0xA5>", "<0xE6>", "<0x9C>", "<0xAC>", "!",
            "<|user|>", "▁hello"
        ]
    );
    // Text after a special token gets the space prefix again, as on the first fragment.
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "hello 日本!<|user|> hello"
    );
    let mut s = tok.stream(false);
    let chunks: Vec<String> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
    assert_eq!(
        chunks,
        ["hello", " ", "", "", "日", "", "", "本", "!", "<|user|>", " hello"]
    );
    assert_eq!(s.flush().unwrap(), "");
}

fn gpt2_meta(pre: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges", strs(&["a b"])),
    ]
}

#[test]
fn unknown_types_are_named() {
    let err = Tokenizer::from_gguf(&open("pre", gpt2_meta("klingon")))
        .err()
        .unwrap();
    assert!(matches!(err, TextError::UnsupportedPre { .. }), "{err}");
    assert!(err.to_string().contains("\"klingon\""), "{err}");

    let mut meta = gpt2_meta("default");
    meta[0].1 = Value::String("rwkv".into());
    let err = Tokenizer::from_gguf(&open("model", meta)).err().unwrap();
    assert!(err.to_string().contains("\"rwkv\""), "{err}");

    let err = Tokenizer::from_gguf(&open("none", vec![])).err().unwrap();
    assert!(err.to_string().contains("tokenizer.ggml.model"), "{err}");
}

#[test]
fn bad_values_are_errors() {
    let mut meta = gpt2_meta("gpt2");
    meta.push(("tokenizer.ggml.eos_token_id", Value::U32(7)));
    let err = Tokenizer::from_gguf(&open("eos", meta))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("eos_token_id") && err.contains('7'), "{err}");

    let mut meta = gpt2_meta("gpt2");
    meta[3].1 = strs(&["ab"]);
    let err = Tokenizer::from_gguf(&open("merge", meta))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("merge 0"), "{err}");

    let mut meta = gpt2_meta("gpt2");
    meta[2].1 = Value::U32(3);
    let err = Tokenizer::from_gguf(&open("tokens", meta))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");
}
