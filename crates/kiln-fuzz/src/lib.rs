//! Fuzz targets: one function per parser kiln runs on files it is handed, each taking the
//! file's bytes. A target returns normally whatever the bytes are (a parse error is a normal
//! outcome); a panic, an abort or a refused allocation (see [`alloc::CappedAlloc`]) is a bug
//! in the parser. After a successful parse each target reads what the parser promised to be
//! valid (every tensor's bytes, conversions), so a header that passed validation but lies is
//! found too.
//!
//! `fuzz/` drives these with libFuzzer (`tools/fuzz.sh`); `tests/smoke.rs` runs each over its
//! seeds and a few thousand mutations in the normal test suite.

pub mod alloc;

pub use kiln_text;
pub mod mutate;
pub mod seeds;

use std::path::Path;

use kiln_formats::{Ct2Dtype, Ct2File, GgufFile, OnnxFile, SafetensorsSet, WhisperGgmlFile};

/// A parser under test: its name (the libFuzzer target of the same name), the function and the
/// synthetic seeds it starts from.
pub struct Target {
    pub name: &'static str,
    /// Whether the input parsed (seeds must); panics on a parser bug.
    pub run: fn(&[u8]) -> bool,
    pub seeds: fn() -> Vec<Vec<u8>>,
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "gguf",
        run: gguf,
        seeds: seeds::gguf,
    },
    Target {
        name: "gguf_vocab",
        run: gguf_vocab,
        seeds: seeds::gguf_vocab,
    },
    Target {
        name: "safetensors",
        run: safetensors,
        seeds: seeds::safetensors,
    },
    Target {
        name: "safetensors_index",
        run: safetensors_index,
        seeds: seeds::safetensors_index,
    },
    Target {
        name: "hf_config",
        run: hf_config,
        seeds: seeds::hf_config,
    },
    Target {
        name: "ct2",
        run: ct2,
        seeds: seeds::ct2,
    },
    Target {
        name: "whisper_ggml",
        run: whisper_ggml,
        seeds: seeds::whisper_ggml,
    },
    Target {
        name: "onnx",
        run: onnx,
        seeds: seeds::onnx,
    },
    Target {
        name: "voice_npy",
        run: voice_npy,
        seeds: seeds::voice_npy,
    },
    Target {
        name: "voice_npz",
        run: voice_npz,
        seeds: seeds::voice_npz,
    },
    Target {
        name: "torch",
        run: torch,
        seeds: seeds::torch,
    },
    Target {
        name: "audio",
        run: audio,
        seeds: seeds::audio,
    },
    Target {
        name: "chat_template",
        run: chat_template,
        seeds: seeds::chat_template,
    },
];

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// GGUF header, metadata and tensor table; then every tensor's bytes and the LLM config keys.
pub fn gguf(data: &[u8]) -> bool {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return false;
    };
    for t in &g.tensors {
        assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
        assert!(t.offset >= g.data_offset && t.offset + t.n_bytes <= g.file_len());
        let _ = t.n_elements();
    }
    for (_, v) in &g.metadata {
        let _ = v.summary();
    }
    let _ = kiln_models::llm::LlmConfig::from_gguf(&g);
    true
}

/// A GGUF-embedded vocabulary rebuilt into a tokenizer, then a round trip through it.
pub fn gguf_vocab(data: &[u8]) -> bool {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return false;
    };
    let Ok(tok) = kiln_text::Tokenizer::from_gguf(&g) else {
        return false;
    };
    if let Ok(ids) = tok.encode("Hello, world! <|im_start|>", true) {
        let _ = tok.decode(&ids, false);
    }
    let _ = tok.decode(&[0, 1, 2, u32::MAX], true);
    true
}

/// One safetensors file; every tensor's range and shape.
pub fn safetensors(data: &[u8]) -> bool {
    let Ok(set) = SafetensorsSet::from_bytes(vec![("model.safetensors".into(), data.to_vec())])
    else {
        return false;
    };
    for t in set.tensors() {
        assert_eq!(set.data(t).len(), t.n_bytes(), "{}", t.name);
        let _ = t.n_elements();
    }
    true
}

/// `model.safetensors.index.json`.
pub fn safetensors_index(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(shards) = kiln_formats::safetensors::parse_index(Path::new("index.json"), &text) else {
        return false;
    };
    assert!(!shards.is_empty());
    for s in shards {
        assert!(
            !s.contains('/') && !s.contains('\\') && !s.starts_with('.'),
            "{s}"
        );
    }
    true
}

/// A Hugging Face / MLX `config.json`.
pub fn hf_config(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok((_, cfg, _)) = kiln_models::llm::parse_config(Path::new("config.json"), &text) else {
        return false;
    };
    let _ = (cfg.q_dim(), cfg.kv_dim());
    true
}

/// CTranslate2 `model.bin`; every variable's bytes and float conversion, the scalars Whisper
/// reads.
pub fn ct2(data: &[u8]) -> bool {
    let Ok(f) = Ct2File::from_bytes("model.bin", data.to_vec()) else {
        return false;
    };
    for v in &f.vars {
        assert_eq!(f.data(v).len() as u64, v.n_bytes, "{}", v.name);
        if matches!(v.dtype, Ct2Dtype::F32 | Ct2Dtype::F16 | Ct2Dtype::BF16) {
            let n = f.f32_values(v).map(|x| x.len()).unwrap_or(0);
            assert_eq!(n as u64, v.n_elements());
        }
        let _ = f.scalar_i64(&v.name);
    }
    for a in f.aliases.keys() {
        assert!(f.var(a).is_some());
    }
    true
}

/// whisper.cpp ggml `.bin`: hparams, filters, vocabulary and every tensor's bytes; the
/// Whisper config read from it; its vocabulary rebuilt as a byte-level BPE tokenizer and a
/// round trip through that.
pub fn whisper_ggml(data: &[u8]) -> bool {
    let Ok(f) = WhisperGgmlFile::from_bytes("ggml.bin", data.to_vec()) else {
        return false;
    };
    for t in &f.tensors {
        assert_eq!(f.data(t).len() as u64, t.n_bytes, "{}", t.name);
        let _ = t.shape();
    }
    let (m, n, _) = f.mel_filters;
    assert_eq!(f.mel_filters().len(), m as usize * n as usize);
    let tokens: Vec<&[u8]> = (0..f.tokens.len()).filter_map(|i| f.token(i)).collect();
    assert_eq!(tokens.len(), f.tokens.len());
    let _ = kiln_models::whisper::WhisperConfig::from_ggml(&f);
    let specials = [(tokens.len() as u32, "<|endoftext|>".to_string())];
    if let Ok(tok) = kiln_text::Tokenizer::from_byte_vocab(&tokens, &specials) {
        if let Ok(ids) = tok.encode(" the fuzzed text, 123 <|endoftext|>", false) {
            let _ = tok.decode(&ids, false);
        }
    }
    true
}

/// ONNX model: initializers, nodes and their attributes; every tensor's values.
pub fn onnx(data: &[u8]) -> bool {
    let Ok(f) = OnnxFile::from_bytes("model.onnx", data.to_vec()) else {
        return false;
    };
    for t in &f.initializers {
        let b = f.bytes(t);
        if let Some(sz) = t.ty.size() {
            assert_eq!(b.len(), t.numel() * sz, "{}", t.name);
        }
        let _ = f.f32s(t);
        let _ = f.i64s(t);
        let _ = f.initializer(&t.name);
    }
    for n in &f.nodes {
        for (_, a) in &n.attrs {
            if let kiln_formats::onnx::Attr::Tensor(t) = a {
                let _ = f.f32s(t);
            }
        }
    }
    true
}

/// Kokoro voice width: 128 decoder + 128 predictor style values.
const VOICE_WIDTH: usize = 256;

/// One voice as `.npy`.
pub fn voice_npy(data: &[u8]) -> bool {
    let path = Path::new("af.npy");
    let Ok(v) = kiln_models::kokoro::voices_from_bytes(path, data, VOICE_WIDTH) else {
        return false;
    };
    for voice in v {
        assert_eq!(voice.style(1).len(), VOICE_WIDTH);
        assert_eq!(voice.style(usize::MAX).len(), VOICE_WIDTH);
    }
    true
}

/// A voice pack as `.npz`.
pub fn voice_npz(data: &[u8]) -> bool {
    let path = Path::new("voices.npz");
    let Ok(v) = kiln_models::kokoro::voices_from_bytes(path, data, VOICE_WIDTH) else {
        return false;
    };
    for voice in v {
        assert_eq!(voice.style(0).len(), VOICE_WIDTH);
    }
    true
}

/// A PyTorch checkpoint (torch.save's zip: the pickle, storages, views); every tensor's
/// values; then the same bytes as a Kokoro `.pt` voice.
pub fn torch(data: &[u8]) -> bool {
    let path = Path::new("model.pth");
    let Ok(tensors) = kiln_formats::parse_torch(path, data) else {
        return false;
    };
    for (name, t) in &tensors {
        let n: usize = t.shape.iter().product();
        assert_eq!(t.data.len(), n, "{name}");
    }
    let _ = kiln_models::kokoro::voices_from_bytes(Path::new("af.pt"), data, VOICE_WIDTH);
    true
}

/// Any audio file kiln decodes (WAV, FLAC, MP3, Ogg Vorbis and Opus), mixed down to mono.
pub fn audio(data: &[u8]) -> bool {
    let Ok(d) = kiln_audio::decode_bytes(data.to_vec(), None, Path::new("input")) else {
        return false;
    };
    assert!(d.channels > 0 && d.rate > 0);
    assert_eq!(d.mono().len() * d.channels, d.samples.len());
    true
}

/// A chat template from a model file, compiled and rendered with a short conversation.
pub fn chat_template(data: &[u8]) -> bool {
    let src = String::from_utf8_lossy(data);
    let Ok(t) = kiln_text::ChatTemplate::new(&src, "<s>", "</s>") else {
        return false;
    };
    // Tighter than the defaults, to keep executions fast; the bounds themselves are what
    // kiln-text's template_limits tests check.
    let t = t.with_limits(kiln_text::Limits {
        fuel: 200_000,
        output: 1 << 20,
        memory: 16 << 20,
        time: std::time::Duration::from_secs(2),
        ..kiln_text::Limits::default()
    });
    let msgs = [
        kiln_text::Message::new("system", "Be brief."),
        kiln_text::Message::new("user", "Hi {{ there }}"),
        kiln_text::Message::new("assistant", "Hello."),
    ];
    t.render(&msgs, true).is_ok()
}
