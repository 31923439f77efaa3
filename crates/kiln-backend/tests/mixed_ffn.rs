//! The gated MLP's fused op with gate and up in different formats (per-tensor quantization
//! mixes): the same values as same-format products, on the fast and the reference paths.

use kiln_backend::cpu::CpuBackend;
use kiln_backend::WeightData;
use kiln_backend::{LlmOps, TensorOps};
use kiln_quant::{dequantize, quantize, GgmlType};

mod common {
    pub mod rng;
}
use common::rng::Rng;

/// Rows of `cols` values encoded as `ty`.
fn encode(ty: GgmlType, w: &[f32], cols: usize) -> Vec<u8> {
    w.chunks_exact(cols)
        .flat_map(|r| quantize(ty, r).unwrap())
        .collect()
}

#[test]
fn gate_up_silu_with_mixed_formats() {
    use GgmlType::*;
    let (rows, cols, n) = (40, 256, 3);
    let mut rng = Rng(11);
    let g: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 0.05).collect();
    let u: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 0.05).collect();
    // Inputs without outliers: the 8-bit activations' rounding stays small.
    let x: Vec<f32> = (0..n * cols)
        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    for b in [CpuBackend::new(2), CpuBackend::reference()] {
        for (tg, tu) in [
            (Q4_0, Q8_0),
            (Q8_0, Q4_K),
            (Q6_K, Q4_1),
            (F16, Q5_0),
            (Q5_K, Q4_0),
        ] {
            let (gb, ub) = (encode(tg, &g, cols), encode(tu, &u, cols));
            let load = |ty, bytes: &[u8]| {
                b.load_weight(WeightData {
                    name: "w",
                    ty,
                    rows,
                    cols,
                    bytes,
                })
                .unwrap()
            };
            let (wg, wu) = (load(tg, &gb), load(tu, &ub));
            let xt = b.tensor_from(n, cols, &x);
            let mut out = b.tensor(n, rows);
            b.gate_up_silu(&wg, &wu, &xt, n, &mut out);
            let mut got = vec![0f32; n * rows];
            b.read(&out, n, &mut got);
            // f32 arithmetic on the dequantized weights.
            let (dg, du) = (
                dequantize(tg, &gb, rows * cols).unwrap(),
                dequantize(tu, &ub, rows * cols).unwrap(),
            );
            let mut want = vec![0f32; n * rows];
            for t in 0..n {
                let xr = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let dot = |w: &[f32]| -> f32 {
                        w[r * cols..(r + 1) * cols]
                            .iter()
                            .zip(xr)
                            .map(|(a, b)| a * b)
                            .sum()
                    };
                    let (a, c) = (dot(&dg), dot(&du));
                    want[t * rows + r] = a / (1.0 + (-a).exp()) * c;
                }
            }
            // Within 2% of the largest output (the 8-bit activations round).
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (v, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (v - w).abs() <= 0.02 * scale,
                    "{} {}/{} [{i}]: {v} vs {w} (largest {scale})",
                    b.name(),
                    tg.name(),
                    tu.name()
                );
            }
        }
    }
}
