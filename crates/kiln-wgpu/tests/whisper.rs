//! Whisper tiny.en on wgpu with prompt attention by tiles (the encoder's dense attention,
//! the GEMM for its products), against the greedy ids of an independent numpy forward pass
//! on jfk.wav (the golden kiln-models' CPU test reads too): the first ids, no timestamps,
//! one 30 s padded window.

mod common;

use std::path::{Path, PathBuf};

use kiln_backend::Backend;
use kiln_models::whisper::{LoadOptions, Whisper};
use kiln_wgpu::{GpuOptions, WgpuBackend};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/assets");
/// Greedy ids compared (of the golden's 27): each costs a decode step on lavapipe.
const IDS: usize = 8;

fn golden() -> (Vec<u32>, Vec<u32>) {
    let p = format!("{SHARED}/golden/whisper_tiny_en_jfk.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("prompt_ids"), ids("greedy_ids"))
}

fn model_dir() -> PathBuf {
    let p = kiln_assets::resolve("whisper-tiny.en", &mut |_| {}).unwrap();
    if p.is_dir() {
        p
    } else {
        p.parent().unwrap().into()
    }
}

fn greedy<B: Backend>(b: &B, m: &Whisper<B>, prompt: &[u32], max: usize) -> Vec<u32> {
    let a = kiln_audio::load_16k(Path::new(&format!("{SHARED}/audio/jfk.wav"))).unwrap();
    let mut x = a.samples;
    x.resize(480_000, 0.0);
    let mel = kiln_audio::log_mel_spectrogram(&x, m.cfg.n_mels, 0).unwrap();
    let mut enc = m.encoder_state(b);
    let mut cross = m.cross_kv(b);
    m.encode(b, &mel.data, &mut enc, &mut cross).unwrap();
    let mut st = m.decoder_state(b);
    let mut logits = m.decode(b, &mut st, &cross, prompt, 0).unwrap().to_vec();
    let mut ids = Vec::new();
    while ids.len() < max {
        let next = (0..logits.len())
            .max_by(|&i, &j| logits[i].total_cmp(&logits[j]).then(j.cmp(&i)))
            .unwrap() as u32;
        ids.push(next);
        let pos = prompt.len() + ids.len() - 1;
        logits = m.decode(b, &mut st, &cross, &[next], pos).unwrap().to_vec();
    }
    ids
}

#[test]
fn tiny_en_jfk_greedy_ids_with_tiled_attention() {
    if common::gpu().is_none() {
        return;
    }
    let g = WgpuBackend::with_options(&GpuOptions {
        tiled_attention: Some(true),
        ..Default::default()
    })
    .unwrap();
    if !g.tiled_attention() {
        panic!(
            "adapter '{}' lacks the workgroup memory of attn_tile",
            g.adapter()
        );
    }
    let (prompt, want) = golden();
    let (m, _f) = Whisper::open(&g, &model_dir(), LoadOptions::default()).unwrap();
    let ids = greedy(&g, &m, &prompt, IDS);
    assert_eq!(
        ids,
        want[..IDS],
        "wgpu (tiled attention) against the golden"
    );
}
