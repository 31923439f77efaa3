//! Hugging Face and MLX checkpoints against transformers: tiny random Qwen3, Qwen2 (sharded)
//! and Llama 3 (llama3 RoPE scaling) models made by `tools/make_hf_fixtures.py`, and Gemma 3
//! (sliding windows, post-norms, GeGLU) made by `tools/make_gemma3_fixtures.py`, and LFM2
//! (gated short convolutions) made by `tools/make_lfm2_fixtures.py`, with
//! transformers' f32 logits at every prompt position and 32 greedy tokens.
//!
//! Error measure: max |kiln - ref| / max |ref| over all logits of both prompts.

use kiln_backend::TensorOps;
use std::path::{Path, PathBuf};

use kiln_backend::cpu::CpuBackend;
use kiln_backend::Backend;
use kiln_models::llm::{HfCheckpoint, Llama};
use kiln_models::ModelError;
use kiln_quant::GgmlType;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

/// reference.json, with the models of every `reference_*.json` beside it added.
fn reference() -> Value {
    let read = |p: PathBuf| -> Value {
        let text = std::fs::read_to_string(&p).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mut r = read(fixtures().join("reference.json"));
    for e in std::fs::read_dir(fixtures()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("reference_") && name.ends_with(".json") {
            let more = read(p);
            for (k, v) in more["models"].as_object().unwrap() {
                r["models"][k] = v.clone();
            }
        }
    }
    r
}

struct Ref {
    prompts: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn model_ref(name: &str) -> Ref {
    let r = reference();
    let m = &r["models"][name];
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    Ref {
        prompts: m["prompts"].as_array().unwrap().iter().map(ids).collect(),
        logits: m["logits"]
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
            .collect(),
        greedy: ids(&m["greedy"]),
    }
}

fn load<B: Backend>(b: &B, dir: &str, quant: Option<GgmlType>) -> Llama<B> {
    let ck = HfCheckpoint::open(&fixtures().join(dir)).unwrap();
    Llama::load_hf(b, &ck, quant).unwrap()
}

/// Relative error of kiln's logits at every position of every prompt.
fn logits_err<B: Backend>(b: &B, m: &Llama<B>, r: &Ref) -> f32 {
    let (mut err, mut mag) = (0f32, 0f32);
    for (p, want) in r.prompts.iter().zip(&r.logits) {
        let mut st = m.new_state(b, 64, 16);
        let got = m.forward(b, &mut st, p, 0, true).unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            err = err.max((g - w).abs());
            mag = mag.max(w.abs());
        }
    }
    err / mag
}

/// Greedy tokens after the first prompt, decoding one token per forward (KV cache).
fn greedy<B: Backend>(b: &B, m: &Llama<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut st = m.new_state(b, 64, 16);
    let mut logits = m.forward(b, &mut st, prompt, 0, false).unwrap().to_vec();
    let mut out = Vec::new();
    for i in 0..n {
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        out.push(next);
        if i + 1 < n {
            logits = m
                .forward(b, &mut st, &[next], prompt.len() + i, false)
                .unwrap()
                .to_vec();
        }
    }
    out
}

fn check_f32(dir: &str) {
    let r = model_ref(dir);
    for b in [CpuBackend::reference(), CpuBackend::new(2)] {
        let m = load(&b, dir, None);
        let err = logits_err(&b, &m, &r);
        assert!(err < 1e-4, "{dir} on {}: logits rel err {err:e}", b.name());
        assert_eq!(
            greedy(&b, &m, &r.prompts[0], 32),
            r.greedy,
            "{dir} on {}",
            b.name()
        );
    }
}

#[test]
fn qwen3_f32_matches_transformers() {
    check_f32("qwen3");
}

/// LFM2: gated short convolutions (width 3) on four layers of six, Qwen3-style attention on
/// the other two; each sequence's convolution state carried from prompt to decode.
#[test]
fn lfm2_f32_matches_transformers() {
    check_f32("lfm2");
    let ck = HfCheckpoint::open(&fixtures().join("lfm2")).unwrap();
    assert_eq!(ck.cfg.conv_layers, [true, true, false, true, false, true]);
    assert_eq!((ck.cfg.conv_k, ck.cfg.ffn_dim), (3, 96));
    let r = model_ref("lfm2");
    let b = CpuBackend::new(2);
    let m = load(&b, "lfm2", None);
    assert!(m.has_recurrent_state());
    // Prefill in chunks gives the logits of one pass (the state crosses chunk boundaries).
    let p = &r.prompts[0];
    let mut whole = m.new_state(&b, 64, 16);
    let want = m.forward(&b, &mut whole, p, 0, true).unwrap().to_vec();
    for chunk in [1, 2, 5] {
        let mut st = m.new_state(&b, 64, chunk);
        let mut got = Vec::new();
        for (i, c) in p.chunks(chunk).enumerate() {
            got.extend_from_slice(m.forward(&b, &mut st, c, i * chunk, true).unwrap());
        }
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "chunks of {chunk}: logits differ by {err}");
    }
    // A state that restarts at position 0 forgets what it held (the same cache reused).
    let again = m.forward(&b, &mut whole, p, 0, true).unwrap();
    assert_eq!(again, &want[..]);
}

/// LFM2 from llama.cpp's own conversion of the same checkpoint (convert_hf_to_gguf.py:
/// `lfm2` names, per-layer KV head counts, `token_embd_norm`): transformers' logits.
#[test]
fn lfm2_gguf_from_llama_cpp_matches_transformers() {
    let path = fixtures().join("../llama-cpp/lfm2-tiny-f32.gguf");
    let g = kiln_formats::GgufFile::open(&path).unwrap();
    let r = model_ref("lfm2");
    for b in [CpuBackend::reference(), CpuBackend::new(2)] {
        let m = Llama::load(&b, &g).unwrap();
        assert_eq!(m.cfg.conv_layers, [true, true, false, true, false, true]);
        let err = logits_err(&b, &m, &r);
        assert!(
            err < 1e-4,
            "lfm2 GGUF on {}: logits rel err {err:e}",
            b.name()
        );
        assert_eq!(greedy(&b, &m, &r.prompts[0], 32), r.greedy, "{}", b.name());
    }
}

/// Sequences decoded together in one forward (as the server batches them), each with its
/// own convolution state and KV cache, get the logits each gets alone.
#[test]
fn lfm2_batched_sequences_keep_their_own_state() {
    use kiln_models::llm::{Logits, SeqChunk};
    let r = model_ref("lfm2");
    let b = CpuBackend::new(2);
    let m = load(&b, "lfm2", None);
    let (p0, p1) = (&r.prompts[0], &r.prompts[1]);
    let alone = |p: &[u32], steps: &[u32]| -> Vec<Vec<f32>> {
        let mut st = m.new_state(&b, 64, 16);
        let mut out = vec![m.forward(&b, &mut st, p, 0, false).unwrap().to_vec()];
        for (i, &t) in steps.iter().enumerate() {
            out.push(
                m.forward(&b, &mut st, &[t], p.len() + i, false)
                    .unwrap()
                    .to_vec(),
            );
        }
        out
    };
    let steps = [7u32, 19, 201, 3];
    let (want0, want1) = (alone(p0, &steps), alone(p1, &steps));
    let mut c0 = m.new_cache(&b, 64, 64);
    let mut c1 = m.new_cache(&b, 64, 64);
    let mut sc = m.new_scratch(&b, 32, 2, 2);
    let vocab = m.cfg.vocab_size;
    let mut got = Vec::new();
    for step in 0..=steps.len() {
        let (t0, t1, q0, q1);
        if step == 0 {
            (t0, t1, q0, q1) = (&p0[..], &p1[..], 0, 0);
        } else {
            (t0, t1) = (&steps[step - 1..step], &steps[step - 1..step]);
            (q0, q1) = (p0.len() + step - 1, p1.len() + step - 1);
        }
        let mut seqs = [
            SeqChunk {
                cache: &mut c0,
                tokens: t0,
                pos0: q0,
            },
            SeqChunk {
                cache: &mut c1,
                tokens: t1,
                pos0: q1,
            },
        ];
        let rows = m
            .forward_seqs(&b, &mut sc, &mut seqs, Logits::Last)
            .unwrap();
        let l = m.logits(&b, &mut sc, rows);
        got.push((l[..vocab].to_vec(), l[vocab..2 * vocab].to_vec()));
    }
    for (i, (g0, g1)) in got.iter().enumerate() {
        for (g, w, which) in [(g0, &want0[i], 0), (g1, &want1[i], 1)] {
            let err = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-4, "sequence {which} step {i}: {err}");
        }
    }
}

/// Gemma 3: five sliding-window layers (window 5) to one global, post-norms, GeGLU, scaled
/// embeddings, query_pre_attn_scalar, two RoPE bases (the global one linearly scaled).
#[test]
fn gemma3_f32_matches_transformers() {
    check_f32("gemma3");
    let ck = HfCheckpoint::open(&fixtures().join("gemma3")).unwrap();
    assert_eq!(ck.cfg.layer_window, [5, 5, 5, 5, 5, 0, 5]);
    assert!(ck.cfg.post_norms && ck.cfg.qk_norm && ck.cfg.tied_embeddings);
    // Prefill in chunks shorter than the window and across it gives the logits of one pass.
    let r = model_ref("gemma3");
    let b = CpuBackend::new(2);
    let m = load(&b, "gemma3", None);
    let p = &r.prompts[0];
    let mut whole = m.new_state(&b, 64, 16);
    let want = m.forward(&b, &mut whole, p, 0, false).unwrap().to_vec();
    for chunk in [1, 2, 3, 7] {
        let mut st = m.new_state(&b, 64, chunk);
        let got = m.forward(&b, &mut st, p, 0, false).unwrap();
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "chunks of {chunk}: logits differ by {err}");
    }
}

#[test]
fn qwen2_sharded_f32_matches_transformers() {
    check_f32("qwen2");
}

#[test]
fn llama3_rope_scaling_f32_matches_transformers() {
    check_f32("llama3");
}

#[test]
fn llama3_rope_frequencies_match_transformers() {
    let ck = HfCheckpoint::open(&fixtures().join("llama3")).unwrap();
    let got = ck.cfg.rope.inv_freqs();
    let want: Vec<f32> = reference()["models"]["llama3"]["inv_freq"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * w.abs(), "pair {i}: {g} vs {w}");
    }
    // The scaling is in effect: the default frequencies differ from these past pair 1.
    assert!(want[3] < 0.5 * 500000f32.powf(-6.0 / 32.0));
}

#[test]
fn qwen3_bf16_weights() {
    // Against transformers run on the same bf16 weights in f32 arithmetic: as tight as f32.
    let r = model_ref("qwen3-bf16");
    let b = CpuBackend::new(2);
    let m = load(&b, "qwen3-bf16", None);
    let err = logits_err(&b, &m, &r);
    assert!(err < 1e-4, "bf16 weights: rel err {err:e}");
    assert_eq!(greedy(&b, &m, &r.prompts[0], 32), r.greedy);
    // And against the f32 model: bf16's rounding of the weights shows, but stays small.
    let err32 = logits_err(&b, &m, &model_ref("qwen3"));
    assert!(err32 < 3e-2, "bf16 vs f32 model: rel err {err32:e}");
}

/// Load-time quantization of the f32 checkpoints. Two measures:
/// - against transformers' f32 logits: the format's own error. These random, untrained models
///   are far more sensitive to weight noise than trained ones (measured here: F16 0.8-1.5e-3,
///   Q8_0 4.0-4.4e-2, Q4_K 0.19-0.26, Q4_0 0.40-0.49), so these bounds are loose for 4 bits;
/// - against kiln's reference path on the same quantized weights (dequantized, f32
///   arithmetic): the integer kernels' own error (8-bit activations), tight for every type.
#[test]
fn quantized_at_load() {
    for (ty, bound) in [
        (GgmlType::F16, 3e-3),
        (GgmlType::Q8_0, 8e-2),
        (GgmlType::Q4_K, 0.5),
        (GgmlType::Q4_0, 0.8),
    ] {
        for dir in ["qwen3", "qwen2", "llama3"] {
            let r = model_ref(dir);
            let b = CpuBackend::new(2);
            let m = load(&b, dir, Some(ty));
            let err = logits_err(&b, &m, &r);
            let refb = CpuBackend::reference();
            let mr = load(&refb, dir, Some(ty));
            let same_weights = Ref {
                prompts: r.prompts.clone(),
                logits: r.prompts.iter().map(|p| logits(&refb, &mr, p)).collect(),
                greedy: Vec::new(),
            };
            let kernel_err = logits_err(&b, &m, &same_weights);
            eprintln!(
                "{dir} {}: rel err {err:.2e} (vs reference path on the same weights {kernel_err:.2e})",
                ty.name()
            );
            assert!(
                err < bound,
                "{dir} quantized to {}: rel err {err:e}",
                ty.name()
            );
            assert!(
                kernel_err < 6e-2,
                "{dir} {}: kernels vs reference {kernel_err:e}",
                ty.name()
            );
            // Not a no-op: the weights really are smaller than f32.
            let f32_bytes = load(&b, dir, None).weight_bytes(&b);
            assert!(m.weight_bytes(&b) < f32_bytes, "{dir} {}", ty.name());
        }
    }
}

fn logits<B: Backend>(b: &B, m: &Llama<B>, p: &[u32]) -> Vec<f32> {
    let mut st = m.new_state(b, 64, 16);
    m.forward(b, &mut st, p, 0, true).unwrap().to_vec()
}

#[test]
fn mlx_checkpoints_match_dequantized_reference() {
    for dir in ["qwen3-mlx4", "llama3-mlx8"] {
        let r = model_ref(dir);
        // Native MLX kernels (fast backend) and the reference (dequantized at load).
        let fast = CpuBackend::new(2);
        let m = load(&fast, dir, None);
        let err = logits_err(&fast, &m, &r);
        assert!(err < 1e-3, "{dir} native: rel err {err:e}");
        assert_eq!(greedy(&fast, &m, &r.prompts[0], 32), r.greedy, "{dir}");
        let reference = CpuBackend::reference();
        let mr = load(&reference, dir, None);
        let err_ref = logits_err(&reference, &mr, &r);
        assert!(err_ref < 1e-4, "{dir} dequantized: rel err {err_ref:e}");
        // The MLX weights are held packed: about bits/32 of the f32 size.
        let f32_bytes = mr.weight_bytes(&reference);
        assert!(m.weight_bytes(&fast) * 2 < f32_bytes, "{dir}");
    }
}

#[test]
fn mlx_kernels_scalar_equals_simd() {
    // KILN_NO_SIMD forces the scalar MLX kernel in this process only for new backends,
    // so compare the two kernel sets through the public kernel selection.
    let r = model_ref("qwen3-mlx4");
    let scalar = CpuBackend::with_kernels(1, &kiln_backend::cpu::kernels::SCALAR);
    let m = load(&scalar, "qwen3-mlx4", None);
    let err = logits_err(&scalar, &m, &r);
    assert!(err < 1e-3, "scalar MLX kernel: rel err {err:e}");
}

/// f16 and Q8_0 KV caches on the transformers fixtures (head size 32: Qwen3 and Llama 3).
#[test]
fn packed_kv_caches() {
    use kiln_backend::KvType;
    for dir in ["qwen3", "llama3"] {
        let r = model_ref(dir);
        let b = CpuBackend::new(2);
        let m = load(&b, dir, None);
        for (ty, bound) in [(KvType::F16, 2e-3), (KvType::Q8_0, 3e-2)] {
            let (mut err, mut mag) = (0f32, 0f32);
            for (p, want) in r.prompts.iter().zip(&r.logits) {
                let mut st = m.new_state_kv(&b, 64, 16, ty).unwrap();
                let got = m.forward(&b, &mut st, p, 0, true).unwrap();
                for (g, w) in got.iter().zip(want) {
                    err = err.max((g - w).abs());
                    mag = mag.max(w.abs());
                }
            }
            eprintln!("{dir} KV {}: rel err {:.2e}", ty.name(), err / mag);
            assert!(
                err / mag < bound,
                "{dir} KV {}: rel err {:e}",
                ty.name(),
                err / mag
            );
        }
    }
}

// ---- strictness: bad checkpoints are errors that name the tensor and file ----

/// Copies a fixture directory, rewriting model.safetensors with `edit` applied to its
/// tensor list.
fn edited(
    dir: &str,
    tag: &str,
    edit: impl FnOnce(&mut Vec<(String, String, Vec<u64>, Vec<u8>)>),
) -> PathBuf {
    let src = fixtures().join(dir);
    let dst = std::env::temp_dir().join(format!("kiln-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut tensors = Vec::new();
    for (name, info) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let off = info["data_offsets"].as_array().unwrap();
        let (s, e) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        let shape = info["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        tensors.push((
            name.clone(),
            info["dtype"].as_str().unwrap().to_string(),
            shape,
            bytes[8 + n + s..8 + n + e].to_vec(),
        ));
    }
    edit(&mut tensors);
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, b) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + b.len()]}),
        );
        data.extend_from_slice(b);
    }
    let h = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(dst.join("model.safetensors"), out).unwrap();
    dst
}

fn load_err(dir: &Path) -> String {
    let b = CpuBackend::reference();
    let res: Result<Llama<CpuBackend>, ModelError> =
        HfCheckpoint::open(dir).and_then(|ck| Llama::load_hf(&b, &ck, None));
    match res {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let d = edited("qwen3", "missing", |t| {
        t.retain(|x| x.0 != "model.layers.1.mlp.up_proj.weight")
    });
    let e = load_err(&d);
    assert!(
        e.contains("missing tensor 'model.layers.1.mlp.up_proj.weight'"),
        "{e}"
    );
    assert!(e.contains("kiln-hf-missing"), "{e}");
}

#[test]
fn unused_tensor_is_named() {
    let d = edited("qwen3", "unused", |t| {
        t.push((
            "model.layers.0.extra.weight".into(),
            "F32".into(),
            vec![4],
            vec![0; 16],
        ))
    });
    let e = load_err(&d);
    assert!(
        e.contains("model.layers.0.extra.weight") && e.contains("does not use"),
        "{e}"
    );
}

#[test]
fn wrong_shape_is_named() {
    let d = edited("qwen3", "shape", |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        x.2 = vec![x.2[1], x.2[0]];
    });
    let e = load_err(&d);
    assert!(
        e.contains("model.layers.0.self_attn.q_proj.weight") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn truncated_file_is_an_error() {
    let d = edited("qwen3", "trunc", |_| {});
    let f = d.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&d);
    assert!(
        e.contains("model.safetensors") && e.contains("safetensors"),
        "{e}"
    );
}

#[test]
fn unsupported_architecture_is_an_error() {
    let d = edited("qwen3", "arch", |_| {});
    let cfg = d.join("config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"qwen3\"", "\"gemma3\"")
        .replace("Qwen3ForCausalLM", "Gemma3ForCausalLM");
    std::fs::write(&cfg, text).unwrap();
    let e = load_err(&d);
    assert!(e.contains("gemma3") && e.contains("config.json"), "{e}");
}

/// The final-normed hidden states (what embedding models pool) against transformers: the
/// tiny Qwen3 ties its output to the embedding table, so the states times that table must
/// give transformers' logits at every position.
#[test]
fn hidden_states_times_the_tied_table_are_transformers_logits() {
    let dir = "qwen3";
    let r = model_ref(dir);
    let st = kiln_formats::SafetensorsSet::open_dir(&fixtures().join(dir)).unwrap();
    let t = st.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(t.dtype, kiln_formats::StDtype::F32);
    let table: Vec<f32> = st
        .data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (vocab, dim) = (t.shape[0] as usize, t.shape[1] as usize);
    for b in [CpuBackend::reference(), CpuBackend::new(2)] {
        let m = load(&b, dir, None);
        assert_eq!(m.cfg.dim, dim);
        let (mut err, mut mag) = (0f32, 0f32);
        for (p, want) in r.prompts.iter().zip(&r.logits) {
            // A batch smaller than the prompt: states gathered over several chunks.
            let mut s = m.new_state(&b, 64, 5);
            let h = m.hidden_states(&b, &mut s, p).unwrap();
            assert_eq!(h.len(), p.len() * dim);
            for (i, row) in h.chunks_exact(dim).enumerate() {
                for v in 0..vocab {
                    let e = &table[v * dim..(v + 1) * dim];
                    let got: f32 = row.iter().zip(e).map(|(a, b)| a * b).sum();
                    let w = want[i * vocab + v];
                    err = err.max((got - w).abs());
                    mag = mag.max(w.abs());
                }
            }
        }
        assert!(err / mag < 1e-4, "{}: rel err {:e}", b.name(), err / mag);
    }
}
