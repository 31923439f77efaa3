//! Hugging Face / MLX directories through the binary: `kiln quantize` to GGUF (loaded back
//! by kiln, logits against transformers' reference), `kiln info` and `kiln run` on a
//! directory, and clean errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_backend::cpu::CpuBackend;
use kiln_formats::GgufFile;
use kiln_models::llm::Llama;
use serde_json::Value;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-models/tests/fixtures/hf")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-hf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn reference(model: &str) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let text = std::fs::read_to_string(fixture("reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    let m = &r["models"][model];
    let prompts = m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let logits = m["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    (prompts, logits)
}

/// max |kiln - ref| / max |ref| of the GGUF's logits at every prompt position.
fn gguf_err(path: &Path, model: &str) -> f32 {
    let (prompts, want) = reference(model);
    let g = GgufFile::open(path).unwrap();
    let b = CpuBackend::new(2);
    let m = Llama::load(&b, &g).unwrap();
    let (mut err, mut mag) = (0f32, 0f32);
    for (p, w) in prompts.iter().zip(&want) {
        let mut st = m.new_state(&b, 64, 16);
        let got = m.forward(&b, &mut st, p, 0, true).unwrap();
        for (g, w) in got.iter().zip(w) {
            err = err.max((g - w).abs());
            mag = mag.max(w.abs());
        }
    }
    err / mag
}

fn quantize(src: &Path, out: &Path, ty: &str) {
    let o = kiln(&[
        "quantize",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        ty,
    ]);
    assert!(
        o.status.success(),
        "quantize {} {ty}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn quantized_gguf_matches_the_source() {
    // (type, bound): F16 checks the conversion itself (names, Llama's q/k permutation,
    // rope_freqs, metadata); the quantized bounds are those of the load-time tests.
    for (ty, bound) in [("f16", 3e-3), ("q8_0", 8e-2), ("q4_k_m", 0.5)] {
        for (dir, reference_of) in [
            ("qwen3", "qwen3"),
            ("qwen2", "qwen2"),
            ("llama3", "llama3"),
            ("qwen3-mlx4", "qwen3-mlx4"),
        ] {
            let out = scratch(&format!("{dir}-{ty}.gguf"));
            quantize(&fixture(dir), &out, ty);
            let err = gguf_err(&out, reference_of);
            eprintln!("{dir} -> {ty}: rel err {err:.2e}");
            assert!(err < bound, "{dir} -> {ty}: rel err {err:e}");
        }
    }
}

#[test]
fn gguf_metadata_is_what_llama_cpp_reads() {
    let out = scratch("meta-qwen3.gguf");
    quantize(&fixture("qwen3"), &out, "q4_k_m");
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "qwen3");
    assert_eq!(g.get_u64("general.file_type").unwrap(), 15);
    assert_eq!(g.get_u64("qwen3.block_count").unwrap(), 2);
    assert_eq!(g.get_u64("qwen3.attention.key_length").unwrap(), 32);
    assert_eq!(g.get_u64("qwen3.attention.head_count_kv").unwrap(), 2);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "qwen2");
    assert_eq!(g.get_array("tokenizer.ggml.tokens").unwrap().len(), 320);
    assert_eq!(g.get_array("tokenizer.ggml.token_type").unwrap().len(), 320);
    assert!(g.get_array("tokenizer.ggml.merges").unwrap().len() > 10);
    assert!(g
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));
    // Tied embeddings: no output tensor; rows of 64 do not take Q4_K (256): fallback.
    assert!(g.tensor("output.weight").is_none());
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ty.name(), "Q5_0");
    // The embedded tokenizer tokenizes like the source tokenizer.json.
    let tok = kiln_text::Tokenizer::from_gguf(&g).unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("reference.json")).unwrap()).unwrap();
    for (s, ids) in r["tokenize"].as_object().unwrap() {
        let want: Vec<u32> = ids
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(s, false).unwrap(), want, "{s:?}");
    }
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
}

#[test]
fn gguf_requantizes_gguf() {
    let f16 = scratch("llama3-src-f16.gguf");
    quantize(&fixture("llama3"), &f16, "f16");
    let q8 = scratch("llama3-from-gguf-q8_0.gguf");
    quantize(&f16, &q8, "q8_0");
    let g = GgufFile::open(&q8).unwrap();
    assert_eq!(g.tensor("blk.0.ffn_up.weight").unwrap().ty.name(), "Q8_0");
    let err = gguf_err(&q8, "llama3");
    assert!(err < 8e-2, "f16 gguf -> q8_0: rel err {err:e}");
}

#[test]
fn info_and_run_on_a_directory() {
    let d = fixture("qwen3-mlx4");
    let o = kiln(&["info", d.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(out.contains("MLX affine 4-bit, groups of 64"), "{out}");
    assert!(out.contains("qwen3"), "{out}");
    let o = kiln(&[
        "run",
        "-m",
        d.to_str().unwrap(),
        "-p",
        "hello",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("4 tok generated"), "{err}");
}

#[test]
fn bad_type_and_bad_directory_are_clean_errors() {
    let o = kiln(&[
        "quantize",
        fixture("qwen3").to_str().unwrap(),
        "/tmp/x.gguf",
        "--type",
        "q3_x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown type 'q3_x'"));
    let empty = scratch("empty-dir");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    let o = kiln(&["run", "-m", empty.to_str().unwrap(), "-p", "x"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("config.json") && err.contains("hidden_size"),
        "{err}"
    );
}
