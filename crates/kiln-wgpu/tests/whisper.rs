//! Whisper tiny.en on wgpu with prompt attention by tiles (the encoder's dense attention,
//! the GEMM for its products), against the greedy ids of an independent numpy forward pass
//! on jfk.wav (the golden kiln-models' CPU test reads too): the first ids, no timestamps,
//! one 30 s padded window.

mod common;
#[path = "../../kiln-models/tests/jfk/mod.rs"]
mod jfk;

use kiln_models::whisper::{LoadOptions, Whisper};
use kiln_wgpu::{GpuOptions, WgpuBackend};

use jfk::{golden, greedy, model_dir};

/// Greedy ids compared (of the golden's 27): each costs a decode step on lavapipe.
const IDS: usize = 8;

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
