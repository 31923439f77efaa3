//! Whisper tiny.en on jfk.wav, as the golden tests read it: the independent numpy forward
//! pass's prompt and greedy ids, the catalog model's directory, the first 30 s window's
//! log-mel values. Shared by kiln-models' Whisper tests and kiln-wgpu's (`#[path]`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_models::whisper::{CrossKv, Whisper};

pub const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/assets");

/// The golden's prompt ids and greedy ids (no timestamps, one padded window).
pub fn golden() -> (Vec<u32>, Vec<u32>) {
    let p = format!("{SHARED}/golden/whisper_tiny_en_jfk.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let ids = |k: &str| {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("prompt_ids"), ids("greedy_ids"))
}

/// The catalog's whisper-tiny.en (fetched into the cache when absent).
pub fn model_dir() -> PathBuf {
    let p = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    if p.is_dir() {
        p
    } else {
        p.parent().unwrap().into()
    }
}

/// The first 30 s window of jfk.wav (padded), as Whisper computes it.
pub fn jfk_mel(n_mels: usize) -> Vec<f32> {
    let a = kiln_audio::load_16k(Path::new(&format!("{SHARED}/audio/jfk.wav"))).unwrap();
    let mut x = a.samples;
    x.resize(480_000, 0.0);
    let mel = kiln_audio::log_mel_spectrogram(&x, n_mels, 0).unwrap();
    assert_eq!(mel.n_frames, 3000);
    mel.data
}

/// The jfk window encoded by `m`: every decoder layer's cross-attention keys and values.
pub fn jfk_cross<B: Backend>(b: &B, m: &Whisper<B>) -> CrossKv<B> {
    let mel = jfk_mel(m.cfg.n_mels);
    let mut enc = m.encoder_state(b);
    let mut cross = m.cross_kv(b);
    m.encode(b, &mel, &mut enc, &mut cross).unwrap();
    cross
}

/// Greedy ids after `prompt` until end-of-text (50256) or `max` tokens (the first of equal
/// logits).
pub fn greedy<B: Backend>(b: &B, m: &Whisper<B>, prompt: &[u32], max: usize) -> Vec<u32> {
    let cross = jfk_cross(b, m);
    let mut st = m.decoder_state(b);
    let mut logits = m.decode(b, &mut st, &cross, prompt, 0).unwrap().to_vec();
    let mut ids = Vec::new();
    for pos in prompt.len()..prompt.len() + max {
        let next = (0..logits.len())
            .max_by(|&a, &c| logits[a].total_cmp(&logits[c]).then(c.cmp(&a)))
            .unwrap() as u32;
        if next == 50256 {
            break;
        }
        ids.push(next);
        logits = m.decode(b, &mut st, &cross, &[next], pos).unwrap().to_vec();
    }
    ids
}
