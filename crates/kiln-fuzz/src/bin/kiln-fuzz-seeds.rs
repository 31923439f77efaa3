//! Writes the seed corpus of every fuzz target: `kiln-fuzz-seeds OUT [DIR...]`.
//!
//! `OUT/<target>/` gets the synthetic seeds of `kiln_fuzz::seeds`, plus, from the model and
//! asset directories given (walked recursively), the first bytes of each real file a target
//! reads (GGUF, model.bin, ONNX, .npz, config.json, audio) and the chat templates that GGUF
//! files and tokenizer_config.json carry. Truncated seeds keep libFuzzer's inputs small; the
//! real files themselves stay where they are.

use std::path::{Path, PathBuf};

/// How much of a real file a seed keeps.
const HEAD: usize = 16 << 10;

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn head(p: &Path, n: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(p)
        .ok()?
        .take(n as u64)
        .read_to_end(&mut b)
        .ok()?;
    Some(b)
}

/// The targets a real file seeds, and the seed bytes for each.
fn real_seeds(p: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    let mut v = Vec::new();
    let mut add = |t: &'static str, b: Option<Vec<u8>>| {
        if let Some(b) = b.filter(|b| !b.is_empty()) {
            v.push((t, b));
        }
    };
    match (name, ext) {
        (_, "gguf") => {
            add("gguf", head(p, HEAD));
            if let Ok(g) = kiln_formats::GgufFile::open(p) {
                let t = g.get("tokenizer.chat_template").and_then(|v| v.as_str());
                add("chat_template", t.map(|t| t.as_bytes().to_vec()));
            }
        }
        ("model.bin", _) => add("ct2", head(p, HEAD)),
        (_, "onnx") => add("onnx", head(p, HEAD)),
        (_, "npz") => add("voice_npz", head(p, HEAD)),
        (_, "npy") => add("voice_npy", head(p, HEAD)),
        (_, "safetensors") => add("safetensors", head(p, HEAD)),
        ("model.safetensors.index.json", _) => add("safetensors_index", head(p, HEAD)),
        ("config.json", _) => add("hf_config", head(p, HEAD)),
        ("tokenizer_config.json", _) => {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let t = json.get("chat_template").and_then(|t| t.as_str());
            add("chat_template", t.map(|t| t.as_bytes().to_vec()));
        }
        (_, "wav" | "flac" | "mp3" | "ogg") => add("audio", head(p, HEAD)),
        _ => {}
    }
    v
}

/// FNV-1a, to name seeds by content.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some((out, dirs)) = args.split_first() else {
        eprintln!("usage: kiln-fuzz-seeds OUT [MODEL_OR_ASSET_DIR...]");
        std::process::exit(2);
    };
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    for t in kiln_fuzz::TARGETS {
        seeds.extend((t.seeds)().into_iter().map(|s| (t.name, s)));
    }
    let mut files = Vec::new();
    for d in dirs {
        walk(d, &mut files);
    }
    files.sort();
    for f in &files {
        seeds.extend(real_seeds(f));
    }
    let mut counts = std::collections::BTreeMap::new();
    for (t, b) in seeds {
        let dir = out.join(t);
        let written = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(dir.join(format!("seed-{:016x}", fnv(&b))), &b));
        if let Err(e) = written {
            eprintln!("kiln-fuzz-seeds: {}: {e}", dir.display());
            std::process::exit(1);
        }
        *counts.entry(t).or_insert(0) += 1;
    }
    for (t, n) in counts {
        println!("{t}: {n} seeds");
    }
}
