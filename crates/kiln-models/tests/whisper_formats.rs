//! Whisper tiny.en from a whisper.cpp ggml `.bin` and from a Hugging Face safetensors
//! directory, both written at test time from the CTranslate2 weights by the project's own
//! scripts (tools/whisper_ct2_to_{ggml,hf}.py): on jfk.wav they must give the golden greedy
//! ids exactly (same fp16 weights, same model code). Quantized ggml files must load and
//! stay close; broken files are one-line errors.

use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_models::whisper::{LoadOptions, Whisper, WhisperFile};

mod jfk;
use jfk::{golden, greedy};

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("whisper-formats")
}

fn run(path: &Path) -> (Vec<u32>, &'static str) {
    let (prompt, _) = golden();
    let b = CpuBackend::new(2);
    let (m, f) = Whisper::open(&b, path, LoadOptions::default()).unwrap();
    assert_eq!(
        (m.cfg.n_mels, m.cfg.n_vocab, m.cfg.d_model),
        (80, 51864, 384)
    );
    assert_eq!(
        (m.cfg.n_audio_layers, m.cfg.n_text_layers, m.cfg.ffn_dim),
        (4, 4, 1536)
    );
    (greedy(&b, &m, &prompt, 64), f.format_name())
}

#[test]
fn ggml_f16_jfk_greedy_ids_match_golden() {
    let p = kiln_assets::convert::whisper_ggml(&out_dir(), "f16").unwrap();
    let (ids, fmt) = run(&p);
    assert_eq!(fmt, "whisper.cpp ggml");
    assert_eq!(ids, golden().1);
}

#[test]
fn hf_f16_safetensors_jfk_greedy_ids_match_golden() {
    let p = kiln_assets::convert::whisper_hf(&out_dir(), "f16", 1).unwrap();
    let (ids, fmt) = run(&p);
    assert_eq!(fmt, "Hugging Face safetensors");
    assert_eq!(ids, golden().1);
}

#[test]
fn hf_f32_sharded_jfk_greedy_ids_match_golden() {
    // f16 -> f32 is exact: the same numbers in another dtype, over 3 shards and an index.
    let p = kiln_assets::convert::whisper_hf(&out_dir(), "f32", 3).unwrap();
    assert!(p.join("model.safetensors.index.json").is_file());
    assert_eq!(run(&p).0, golden().1);
}

/// Quantized ggml files (written by the script with ggml's reference rounding): nearly
/// all golden ids, in order.
#[test]
fn ggml_q8_0_and_q5_0_stay_close_to_golden() {
    let want = golden().1;
    for ty in ["q8_0", "q5_0"] {
        let p = kiln_assets::convert::whisper_ggml(&out_dir(), ty).unwrap();
        if let WhisperFile::Ggml(g) = WhisperFile::open(&p).unwrap() {
            let q = g.tensor("encoder.blocks.0.mlp.0.weight").unwrap();
            assert_eq!(q.ty.name().to_lowercase(), ty);
        } else {
            panic!("{} not read as ggml", p.display());
        }
        let ids = run(&p).0;
        let same = ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert!(same >= 14, "{ty}: {ids:?} vs {want:?}");
        assert!(ids.len().abs_diff(want.len()) <= 2, "{ty}: {ids:?}");
    }
}

fn one_line_error(path: &Path) -> String {
    let b = CpuBackend::new(1);
    let e = Whisper::open(&b, path, LoadOptions::default())
        .err()
        .unwrap_or_else(|| panic!("{} loaded", path.display()));
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "{msg}");
    msg
}

#[test]
fn broken_ggml_and_hf_files_are_one_line_errors() {
    let dir = out_dir().join("broken");
    std::fs::create_dir_all(&dir).unwrap();
    let ggml =
        std::fs::read(kiln_assets::convert::whisper_ggml(&out_dir(), "f16").unwrap()).unwrap();
    let cut = dir.join("cut.bin");
    for at in [4, 50, 200, 400_000, ggml.len() / 2, ggml.len() - 1] {
        std::fs::write(&cut, &ggml[..at]).unwrap();
        let msg = one_line_error(&cut);
        assert!(msg.contains("cut.bin"), "{msg}");
        assert!(msg.contains("truncated"), "{msg}");
    }
    // An HF directory whose safetensors lacks a tensor the config implies.
    let hf = kiln_assets::convert::whisper_hf(&out_dir(), "f16", 1).unwrap();
    let bad = dir.join("hf-missing");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(hf.join("config.json"), bad.join("config.json")).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    let mut cfg = cfg;
    cfg["decoder_layers"] = 5.into();
    std::fs::write(bad.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(hf.join("model.safetensors"), bad.join("model.safetensors")).unwrap();
    let msg = one_line_error(&bad);
    assert!(msg.contains("model.decoder.layers.4."), "{msg}");
    // A directory that is neither format.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(one_line_error(&empty).contains("not a Whisper model directory"));
}

#[test]
fn a_folder_holding_one_ggml_file_opens_it() {
    let src = kiln_assets::convert::whisper_ggml(&out_dir(), "q5_0").unwrap();
    let dir = out_dir().join("one-ggml");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("ggml-model.bin");
    std::fs::hard_link(&src, &link)
        .or_else(|_| std::fs::copy(&src, &link).map(|_| ()))
        .unwrap();
    let f = WhisperFile::open(&dir).unwrap();
    assert_eq!(f.path(), link);
    assert_eq!(f.format_name(), "whisper.cpp ggml");
}
