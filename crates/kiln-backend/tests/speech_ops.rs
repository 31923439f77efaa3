//! The speech ops (layer_norm, gelu, conv1d, attention_dense, kv_copy) and the fp16 matrix
//! paths they lean on, against plain f64 computations on random odd shapes, 1 and 2 threads,
//! with and without SIMD kernels where the op has them.

use kiln_backend::cpu::kernels::{amx, f32_gemm};
use kiln_backend::cpu::CpuBackend;
use kiln_backend::{AttnShape, DenseAttnShape, WeightData};
use kiln_backend::{LlmOps, SpeechOps, TensorOps};
use kiln_quant::GgmlType;

fn rnd(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % 2001) as f32 / 1000.0 - 1.0
}

fn vec_of(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rnd(seed) * scale).collect()
}

fn read(
    b: &CpuBackend,
    t: &<CpuBackend as TensorOps>::Tensor,
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    b.read(t, rows, &mut out);
    out
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn layer_norm_and_gelu_match_naive() {
    let b = CpuBackend::new(1);
    let mut seed = 7u64;
    for (n, c) in [(1, 5), (3, 384), (7, 1000)] {
        let x = vec_of(n * c, &mut seed, 3.0);
        let (g, be) = (vec_of(c, &mut seed, 1.0), vec_of(c, &mut seed, 0.5));
        let mut out = b.tensor(n, c);
        b.layer_norm(
            &b.tensor_from(n, c, &x),
            &b.tensor_from(1, c, &g),
            &b.tensor_from(1, c, &be),
            1e-5,
            n,
            &mut out,
        );
        let mut want = Vec::new();
        for t in 0..n {
            let r = &x[t * c..(t + 1) * c];
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            for i in 0..c {
                want.push((r[i] as f64 - mean) / (var + 1e-5).sqrt() * g[i] as f64 + be[i] as f64);
            }
        }
        assert_close(&read(&b, &out, n, c), &want, 1e-5, "layer_norm");

        let mut y = b.tensor_from(n, c, &x);
        b.gelu(&mut y, n);
        // erf by its Taylor series in f64 (|x| <= 3 here: converges well).
        let erf = |z: f64| {
            let (mut term, mut sum) = (z, z);
            for k in 1..80 {
                term *= -z * z / k as f64;
                sum += term / (2 * k + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        };
        let want: Vec<f64> = x
            .iter()
            .map(|&v| 0.5 * v as f64 * (1.0 + erf(v as f64 / 2f64.sqrt())))
            .collect();
        assert_close(&read(&b, &y, n, c), &want, 2e-6, "gelu");
    }
}

fn f16_weight(
    b: &CpuBackend,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> <CpuBackend as TensorOps>::Weight {
    let bytes: Vec<u8> = w
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    b.load_weight(WeightData {
        name: "w",
        ty: GgmlType::F16,
        rows,
        cols,
        bytes: &bytes,
    })
    .unwrap()
}

/// The values an f16 weight actually holds.
fn f16_round(w: &[f32]) -> Vec<f32> {
    w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

#[test]
fn fp16_matmul_prefill_and_decode_match_naive() {
    let mut seed = 11u64;
    for (rows, cols, n) in [
        (37, 40, 1),
        (37, 40, 3),
        (50, 384, 9),
        (17, 1152, 100),
        (8, 7, 13),
    ] {
        let w = vec_of(rows * cols, &mut seed, 1.0);
        let x = vec_of(n * cols, &mut seed, 1.0);
        let bias = vec_of(rows, &mut seed, 1.0);
        let wr = f16_round(&w);
        let mut want = Vec::new();
        for t in 0..n {
            for r in 0..rows {
                let d: f64 = (0..cols)
                    .map(|i| wr[r * cols + i] as f64 * x[t * cols + i] as f64)
                    .sum();
                want.push(d + bias[r] as f64);
            }
        }
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let wt = f16_weight(&b, &w, rows, cols);
            let mut out = b.tensor(n, rows);
            b.matmul(
                &wt,
                &b.tensor_from(n, cols, &x),
                Some(&b.tensor_from(1, rows, &bias)),
                n,
                &mut out,
            );
            let tol = 1e-5 * (cols as f64).sqrt();
            assert_close(&read(&b, &out, n, rows), &want, tol, "fp16 matmul");
        }
    }
}

/// Weights marked `prefer_batches` (from AMX_MIN_ROWS rows of x: bf16 tiles or vectors where the
/// CPU has them, else f32 panels on AVX-512 and NEON; the usual kernels below that or without
/// any): store with bias, residual add, three jobs.
#[test]
fn batched_weights_match_naive() {
    let mut seed = 23u64;
    for (rows, cols, n) in [
        (37, 40, 33),
        (64, 240, 100),
        (17, 1152, 64),
        (50, 384, 9),
        (50, 384, 7),
        (96, 64, 1),
    ] {
        let w = vec_of(rows * cols, &mut seed, 1.0);
        let x = vec_of(n * cols, &mut seed, 1.0);
        let bias = vec_of(rows, &mut seed, 1.0);
        let wr = f16_round(&w);
        let dot = |t: usize, r: usize| -> f64 {
            (0..cols)
                .map(|i| wr[r * cols + i] as f64 * x[t * cols + i] as f64)
                .sum()
        };
        let tiles = n >= kiln_backend::cpu::AMX_MIN_ROWS && amx::bf16_products();
        // bf16 inputs: 2^-9 relative per operand, random signs over cols terms.
        let tol = if tiles {
            4e-3 * (cols as f64).sqrt()
        } else {
            1e-5 * (cols as f64).sqrt()
        };
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let mut ws: Vec<_> = (0..3).map(|_| f16_weight(&b, &w, rows, cols)).collect();
            let plain = b.weight_bytes(&ws[0]);
            for wt in ws.iter_mut() {
                b.prefer_batches(wt, false);
            }
            assert_eq!(
                b.weight_bytes(&ws[0]) > plain,
                amx::bf16_products() || f32_gemm::available(),
                "block-product copy made"
            );
            let xt = b.tensor_from(n, cols, &x);
            let bt = b.tensor_from(1, rows, &bias);
            let mut out = b.tensor(n, rows);
            b.matmul(&ws[0], &xt, Some(&bt), n, &mut out);
            let want: Vec<f64> = (0..n * rows)
                .map(|i| dot(i / rows, i % rows) + bias[i % rows] as f64)
                .collect();
            assert_close(&read(&b, &out, n, rows), &want, tol, "matmul + bias");
            b.matmul_add(&ws[1], &xt, n, &mut out);
            let want2: Vec<f64> = (0..n * rows)
                .map(|i| want[i] + dot(i / rows, i % rows))
                .collect();
            assert_close(&read(&b, &out, n, rows), &want2, 2.0 * tol, "matmul_add");
            let (mut o0, mut o1, mut o2) =
                (b.tensor(n, rows), b.tensor(n, rows), b.tensor(n, rows));
            b.matmul3(
                [&ws[0], &ws[1], &ws[2]],
                [Some(&bt), None, Some(&bt)],
                &xt,
                n,
                [&mut o0, &mut o1, &mut o2],
            );
            let plain: Vec<f64> = (0..n * rows).map(|i| dot(i / rows, i % rows)).collect();
            assert_close(&read(&b, &o0, n, rows), &want, tol, "matmul3 q");
            assert_close(&read(&b, &o1, n, rows), &plain, tol, "matmul3 k");
            assert_close(&read(&b, &o2, n, rows), &want, tol, "matmul3 v");
        }
    }
}

#[test]
fn conv1d_matches_direct_convolution() {
    let mut seed = 3u64;
    for (t_in, c_in, c_out, k, stride, pad) in
        [(20, 3, 5, 3, 1, 1), (21, 8, 6, 3, 2, 1), (9, 4, 4, 1, 1, 0)]
    {
        let x = vec_of(t_in * c_in, &mut seed, 1.0);
        // PyTorch layout (c_out, c_in, k) flattened.
        let w = vec_of(c_out * c_in * k, &mut seed, 1.0);
        let bias = vec_of(c_out, &mut seed, 1.0);
        let b = CpuBackend::new(2);
        let wt = f16_weight(&b, &w, c_out, c_in * k);
        let t_out = (t_in + 2 * pad - k) / stride + 1;
        let mut out = b.tensor(t_out, c_out);
        let got_t = b.conv1d(
            &wt,
            Some(&b.tensor_from(1, c_out, &bias)),
            &b.tensor_from(t_in, c_in, &x),
            t_in,
            k,
            stride,
            pad,
            &mut out,
        );
        assert_eq!(got_t, t_out);
        let wr = f16_round(&w);
        let mut want = Vec::new();
        for t in 0..t_out {
            for o in 0..c_out {
                let mut s = bias[o] as f64;
                for c in 0..c_in {
                    for j in 0..k {
                        let src = (t * stride + j) as isize - pad as isize;
                        if src >= 0 && (src as usize) < t_in {
                            s += wr[(o * c_in + c) * k + j] as f64
                                * x[src as usize * c_in + c] as f64;
                        }
                    }
                }
                want.push(s);
            }
        }
        assert_close(&read(&b, &out, t_out, c_out), &want, 1e-5, "conv1d");
    }
}

fn naive_attention(q: &[f32], k: &[f32], v: &[f32], s: DenseAttnShape) -> Vec<f64> {
    let (hd, d) = (s.head_dim, s.heads * s.head_dim);
    let mut out = vec![0f64; s.n_q * d];
    for t in 0..s.n_q {
        for h in 0..s.heads {
            let len = if s.causal {
                t + 1 + (s.n_kv - s.n_q)
            } else {
                s.n_kv
            };
            let sc: Vec<f64> = (0..len)
                .map(|p| {
                    (0..hd)
                        .map(|e| q[t * d + h * hd + e] as f64 * k[p * d + h * hd + e] as f64)
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = sc.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = sc.iter().map(|&x| (x - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for e in 0..hd {
                out[t * d + h * hd + e] = (0..len)
                    .map(|p| w[p] * v[p * d + h * hd + e] as f64)
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}

#[test]
fn dense_attention_matches_naive() {
    let mut seed = 5u64;
    // Few queries (per-query path) and many (blocked path), causal and not, odd sizes.
    for (heads, hd, n_q, n_kv, causal) in [
        (2, 8, 1, 7, false),
        (6, 64, 3, 150, false),
        (3, 16, 61, 61, true),
        (6, 64, 100, 150, false),
        (4, 24, 50, 70, true),
        (1, 300, 2, 5, false),
    ] {
        let d = heads * hd;
        let q = vec_of(n_q * d, &mut seed, 2.0);
        let k = vec_of(n_kv * d, &mut seed, 2.0);
        let v = vec_of(n_kv * d, &mut seed, 1.0);
        let s = DenseAttnShape {
            heads,
            head_dim: hd,
            n_q,
            n_kv,
            causal,
        };
        let want = naive_attention(&q, &k, &v, s);
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let mut out = b.tensor(n_q, d);
            b.attention_dense(
                &b.tensor_from(n_q, d, &q),
                &b.tensor_from(n_kv, d, &k),
                &b.tensor_from(n_kv, d, &v),
                s,
                &mut out,
            );
            // Many queries and keys run as bf16 tile products where the CPU has AMX.
            let tiles = n_q >= 32 && n_kv >= 32 && amx::bf16_products();
            let tol = if tiles { 1e-2 } else { 1e-5 };
            assert_close(&read(&b, &out, n_q, d), &want, tol, "attention_dense");
        }
    }
}

#[test]
fn kv_copy_forks_a_sequence() {
    let b = CpuBackend::new(1);
    let (heads, hd, n_ctx) = (3, 8, 16);
    let d = heads * hd;
    let mut seed = 9u64;
    let mut a = b.kv_cache(2, n_ctx, heads, hd);
    let mut c = b.kv_cache(2, n_ctx, heads, hd);
    let (k, v) = (vec_of(5 * d, &mut seed, 1.0), vec_of(5 * d, &mut seed, 1.0));
    for l in 0..2 {
        b.kv_store(
            &mut a,
            l,
            &b.tensor_from(5, d, &k),
            &b.tensor_from(5, d, &v),
            0,
            5,
        );
    }
    b.kv_copy(&a, &mut c, 5);
    // Attention over the copy equals attention over the original.
    let q = vec_of(d, &mut seed, 1.0);
    let shape = AttnShape {
        n_heads: heads,
        n_kv_heads: heads,
        head_dim: hd,
        pos0: 4,
        n_tokens: 1,
        window: 0,
    };
    for l in 0..2 {
        let (mut o1, mut o2) = (b.tensor(1, d), b.tensor(1, d));
        b.attention(&b.tensor_from(1, d, &q), &a, l, shape, &mut o1);
        b.attention(&b.tensor_from(1, d, &q), &c, l, shape, &mut o2);
        assert_eq!(read(&b, &o1, 1, d), read(&b, &o2, 1, d));
    }
}
