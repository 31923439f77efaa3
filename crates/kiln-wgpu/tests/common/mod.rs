//! Test helpers: the backends to test (or a printed reason to skip), random data, errors.

#![allow(dead_code)]

use kiln_backend::{Backend, WeightData};
use kiln_quant::GgmlType;
use kiln_wgpu::{GpuOptions, WgpuBackend};

pub struct Rng(pub u64);

impl Rng {
    pub fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn v(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn required() -> bool {
    kiln_backend::options::flag("KILN_REQUIRE_GPU")
}

/// The default backend, or None (after saying why) where this machine has no adapter.
/// With KILN_REQUIRE_GPU=1 a missing adapter is a failure.
pub fn gpu() -> Option<WgpuBackend> {
    match WgpuBackend::new() {
        Ok(b) => {
            eprintln!(
                "wgpu adapter: {} (subgroups: {}, unified memory: {})",
                b.adapter(),
                b.subgroups(),
                b.unified_memory()
            );
            Some(b)
        }
        Err(e) if required() => panic!("KILN_REQUIRE_GPU=1: {e}"),
        Err(e) => {
            // Straight to stderr (not the harness's captured eprintln), so a passing run
            // still says that it skipped.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping a wgpu test: {e}");
            None
        }
    }
}

/// Every kernel variant the adapter runs: the default (subgroups where it has them), the
/// workgroup-memory reductions when the default used subgroups, and the other choice of
/// the matvec prologue (fused or prep + matvec) and of prompt attention (tiled or not), with
/// reads through a staging copy where the default maps buffers (unified memory); the last
/// two compute 2 and 4 rows a matrix-vector row group (the default picks by size, 1 on test
/// shapes), both with four lanes a Q4_0 block (the default takes a lane a block on the test
/// shapes' short rows).
pub fn backends() -> Vec<WgpuBackend> {
    let Some(b) = gpu() else {
        return Vec::new();
    };
    let mut opts = Vec::new();
    if b.subgroups() {
        opts.push(GpuOptions {
            no_subgroups: true,
            matvec_rows: Some(2),
            q4_lanes: Some(4),
            ..Default::default()
        });
    }
    opts.push(GpuOptions {
        no_unified: b.unified_memory(),
        fused_prologue: Some(!b.fused_prologue()),
        tiled_attention: Some(!b.tiled_attention()),
        matvec_rows: Some(4),
        q4_lanes: Some(4),
        ..Default::default()
    });
    let mut v = vec![b];
    for o in opts {
        v.push(WgpuBackend::with_options(&o).expect("the same adapter again"));
    }
    v
}

pub fn rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut m) = (0f32, 0f32);
    for (g, w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        e = e.max((g - w).abs());
        m = m.max(w.abs());
    }
    e / m.max(1e-30)
}

pub fn read<B: Backend>(b: &B, t: &B::Tensor, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = vec![0f32; rows * cols];
    b.read(t, rows, &mut v);
    v
}

pub fn weight<B: Backend>(b: &B, ty: GgmlType, rows: usize, cols: usize, x: &[f32]) -> B::Weight {
    let bytes = if ty == GgmlType::F32 {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        kiln_quant::quantize(ty, x).unwrap()
    };
    b.load_weight(WeightData {
        name: "w",
        ty,
        rows,
        cols,
        bytes: &bytes,
    })
    .unwrap()
}
