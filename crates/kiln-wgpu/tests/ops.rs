//! Every wgpu op against the CPU backend on random inputs of odd shapes, on every kernel
//! variant the adapter runs (subgroup reductions and the workgroup-memory fallback).
//!
//! Without a GPU adapter (no Vulkan driver) each test prints why and passes; with
//! `KILN_REQUIRE_GPU=1` (CI, after tools/setup-lavapipe.sh) a missing adapter fails.
//!
//! Error measure: max |gpu - cpu| / max |cpu| per output. Both backends quantize the
//! activations of quantized products to the same int8 blocks, so products differ by float
//! summation order only (~1e-6); F16 weights read as f16 and f32 activations on both sides.
//! The default KV cache holds f16 (CPU: f32): attention through it ~1e-3. Elementwise ops,
//! norms and RoPE (from a host-computed table) agree to ~1e-6.

mod common;

use common::{backends, read, rel, weight, Rng};
use kiln_backend::cpu::CpuBackend;
use kiln_backend::{AttnShape, Backend, KvType, RopeConfig, RopeScaling, RopeStyle};
use kiln_quant::GgmlType;

const TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
];

#[test]
fn matmul_every_format_and_token_count() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(1);
        for ty in TYPES {
            // n = 1, 3: matrix-vector kernel; n = 9, 70: the tiled GEMM (odd tiles).
            for (rows, cols) in [(75, 256), (33, 512)] {
                let w = r.v(rows * cols);
                let bias = r.v(rows);
                let (wg, wc) = (
                    weight(&g, ty, rows, cols, &w),
                    weight(&c, ty, rows, cols, &w),
                );
                // Formats without a kernel run as f32 on the GPU, against the CPU's int8
                // activations: the CPU's activation rounding (~1e-3) is the difference.
                // The others quantize activations as the CPU does, but a GPU may divide
                // within 2.5 ULP (Vulkan's precision rule for d = max/127 and 1/d), so an
                // activation at a rounding midpoint can take the other int8 step, moving the
                // output by that step times its weight (2.4e-4 seen on an H200; lavapipe
                // rounds as the CPU does).
                let bound = if ty == GgmlType::Q5_0 { 1e-2 } else { 1e-3 };
                for n in [1, 3, 9, 70] {
                    let x = r.v(n * cols);
                    let (xg, xc) = (g.tensor_from(n, cols, &x), c.tensor_from(n, cols, &x));
                    let (bg, bc) = (g.tensor_from(1, rows, &bias), c.tensor_from(1, rows, &bias));
                    let (mut og, mut oc) = (g.tensor(n, rows), c.tensor(n, rows));
                    g.matmul(&wg, &xg, Some(&bg), n, &mut og);
                    c.matmul(&wc, &xc, Some(&bc), n, &mut oc);
                    let e = rel(&read(&g, &og, n, rows), &read(&c, &oc, n, rows));
                    assert!(e < bound, "{ty:?} {rows}x{cols} n={n}: {e}");
                    g.matmul_add(&wg, &xg, n, &mut og);
                    c.matmul_add(&wc, &xc, n, &mut oc);
                    let e = rel(&read(&g, &og, n, rows), &read(&c, &oc, n, rows));
                    assert!(e < bound, "{ty:?} add {rows}x{cols} n={n}: {e}");
                }
            }
        }
    }
}

#[test]
fn fused_norm_products_equal_the_cpu() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(2);
        let (dim, q, kv, ffn) = (256, 256, 64, 96);
        let types = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0];
        let shapes = [q, kv, kv];
        let ws: Vec<Vec<f32>> = shapes.iter().map(|&rows| r.v(rows * dim)).collect();
        let wg: Vec<_> = (0..3)
            .map(|i| weight(&g, types[i], shapes[i], dim, &ws[i]))
            .collect();
        let wc: Vec<_> = (0..3)
            .map(|i| weight(&c, types[i], shapes[i], dim, &ws[i]))
            .collect();
        let bias: Vec<Vec<f32>> = shapes.iter().map(|&k| r.v(k)).collect();
        let bg: Vec<_> = (0..3)
            .map(|i| g.tensor_from(1, shapes[i], &bias[i]))
            .collect();
        let bc: Vec<_> = (0..3)
            .map(|i| c.tensor_from(1, shapes[i], &bias[i]))
            .collect();
        let norm = r.v(dim);
        for n in [1, 5, 20] {
            let x = r.v(n * dim);
            let (xg, xc) = (g.tensor_from(n, dim, &x), c.tensor_from(n, dim, &x));
            let (ng, nc) = (g.tensor_from(1, dim, &norm), c.tensor_from(1, dim, &norm));
            let (mut hg, mut hc) = (g.tensor(n, dim), c.tensor(n, dim));
            let mut og: Vec<_> = shapes.iter().map(|&k| g.tensor(n, k)).collect();
            let mut oc: Vec<_> = shapes.iter().map(|&k| c.tensor(n, k)).collect();
            {
                let [a, b, d] = &mut og[..] else {
                    unreachable!()
                };
                g.rms_norm_matmul3(
                    &xg,
                    &ng,
                    1e-5,
                    [&wg[0], &wg[1], &wg[2]],
                    [Some(&bg[0]), Some(&bg[1]), Some(&bg[2])],
                    n,
                    &mut hg,
                    [a, b, d],
                );
                let [a, b, d] = &mut oc[..] else {
                    unreachable!()
                };
                c.rms_norm_matmul3(
                    &xc,
                    &nc,
                    1e-5,
                    [&wc[0], &wc[1], &wc[2]],
                    [Some(&bc[0]), Some(&bc[1]), Some(&bc[2])],
                    n,
                    &mut hc,
                    [a, b, d],
                );
            }
            for i in 0..3 {
                let k = shapes[i];
                let e = rel(&read(&g, &og[i], n, k), &read(&c, &oc[i], n, k));
                assert!(e < 2e-4, "norm+matmul3 part {i} n={n}: {e}");
            }
            // matmul3 without the norm.
            {
                let [a, b, d] = &mut og[..] else {
                    unreachable!()
                };
                g.matmul3([&wg[0], &wg[1], &wg[2]], [None; 3], &xg, n, [a, b, d]);
                let [a, b, d] = &mut oc[..] else {
                    unreachable!()
                };
                c.matmul3([&wc[0], &wc[1], &wc[2]], [None; 3], &xc, n, [a, b, d]);
            }
            for i in 0..3 {
                let k = shapes[i];
                let e = rel(&read(&g, &og[i], n, k), &read(&c, &oc[i], n, k));
                assert!(e < 2e-4, "matmul3 part {i} n={n}: {e}");
            }
            let wgate = r.v(ffn * dim);
            let wup = r.v(ffn * dim);
            for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16] {
                let gg = weight(&g, ty, ffn, dim, &wgate);
                let gu = weight(&g, ty, ffn, dim, &wup);
                let cg = weight(&c, ty, ffn, dim, &wgate);
                let cu = weight(&c, ty, ffn, dim, &wup);
                let (mut fg, mut fc) = (g.tensor(n, ffn), c.tensor(n, ffn));
                g.rms_norm_gate_up_silu(&xg, &ng, 1e-5, &gg, &gu, n, &mut hg, &mut fg);
                c.rms_norm_gate_up_silu(&xc, &nc, 1e-5, &cg, &cu, n, &mut hc, &mut fc);
                let e = rel(&read(&g, &fg, n, ffn), &read(&c, &fc, n, ffn));
                assert!(e < 5e-4, "norm+gate_up {ty:?} n={n}: {e}");
                g.gate_up_silu(&gg, &gu, &xg, n, &mut fg);
                c.gate_up_silu(&cg, &cu, &xc, n, &mut fc);
                let e = rel(&read(&g, &fg, n, ffn), &read(&c, &fc, n, ffn));
                assert!(e < 5e-4, "gate_up {ty:?} n={n}: {e}");
            }
        }
    }
}

#[test]
fn embed_norm_elementwise_copies_argmax() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(3);
        let (vocab, dim) = (301, 256);
        let tab = r.v(vocab * dim);
        for ty in TYPES {
            let (tg, tc) = (
                weight(&g, ty, vocab, dim, &tab),
                weight(&c, ty, vocab, dim, &tab),
            );
            let ids = [0u32, 300, 17, 17, 255];
            let (mut og, mut oc) = (g.tensor(5, dim), c.tensor(5, dim));
            g.embed(&tg, &ids, &mut og).unwrap();
            c.embed(&tc, &ids, &mut oc).unwrap();
            let e = rel(&read(&g, &og, 5, dim), &read(&c, &oc, 5, dim));
            assert!(e < 1e-6, "embed {ty:?}: {e}");
            assert!(g.embed(&tg, &[301], &mut og).is_err());
        }
        let cols = 333;
        let x = r.v(3 * cols);
        let y = r.v(3 * cols);
        let w = r.v(cols);
        let (xg, xc) = (g.tensor_from(3, cols, &x), c.tensor_from(3, cols, &x));
        let (wg, wc) = (g.tensor_from(1, cols, &w), c.tensor_from(1, cols, &w));
        let (mut og, mut oc) = (g.tensor(3, cols), c.tensor(3, cols));
        g.rms_norm(&xg, &wg, 1e-6, 3, &mut og);
        c.rms_norm(&xc, &wc, 1e-6, 3, &mut oc);
        assert!(rel(&read(&g, &og, 3, cols), &read(&c, &oc, 3, cols)) < 1e-5);
        g.add(&mut og, &xg, 3);
        c.add(&mut oc, &xc, 3);
        assert!(rel(&read(&g, &og, 3, cols), &read(&c, &oc, 3, cols)) < 1e-5);
        let (yg, yc) = (g.tensor_from(3, cols, &y), c.tensor_from(3, cols, &y));
        g.silu_mul(&mut og, &yg, 3);
        c.silu_mul(&mut oc, &yc, 3);
        assert!(rel(&read(&g, &og, 3, cols), &read(&c, &oc, 3, cols)) < 1e-5);
        g.scale(&mut og, 0.37, 2 * cols + 5);
        c.scale(&mut oc, 0.37, 2 * cols + 5);
        assert!(rel(&read(&g, &og, 3, cols), &read(&c, &oc, 3, cols)) < 1e-6);
        // Row copies: exact.
        let src = g.tensor_from(3, cols, &y);
        let (mut dg, mut dc) = (g.tensor(4, cols), c.tensor(4, cols));
        g.copy_rows(&src, 1, 2, &mut dg, 2);
        c.copy_rows(&yc, 1, 2, &mut dc, 2);
        g.copy_row(&src, 2, &mut dg);
        c.copy_row(&yc, 2, &mut dc);
        assert_eq!(read(&g, &dg, 4, cols), read(&c, &dc, 4, cols));
        // argmax: the first of equal maxima, within a 4096-column part and across parts.
        let mut l = r.v(2 * 70001);
        l[5] = 9.0;
        l[900] = 9.0;
        l[70001 + 69999] = 3.0;
        l[70001 + 12295] = 3.0;
        let lg = g.tensor_from(2, 70001, &l);
        assert_eq!(g.argmax_rows(&lg, 2, 70001), vec![5, 12295]);
        let lc = c.tensor_from(2, 70001, &l);
        assert_eq!(c.argmax_rows(&lc, 2, 70001), vec![5, 12295]);
        // One row's first columns only (the ids a tokenizer decodes): the maximum past them
        // does not count.
        let mut l = r.v(70001);
        l[69000] = 9.0;
        l[3] = 5.0;
        let (lg, lc) = (g.tensor_from(1, 70001, &l), c.tensor_from(1, 70001, &l));
        assert_eq!(g.argmax_rows(&lg, 1, 60000), vec![3]);
        assert_eq!(c.argmax_rows(&lc, 1, 60000), vec![3]);
    }
}

fn rope_cfg(style: RopeStyle, dims: usize, hd: usize) -> RopeConfig {
    RopeConfig {
        style,
        dims,
        head_dim: hd,
        theta: 10000.0,
        scaling: RopeScaling::None,
    }
}

#[test]
fn heads_rope_cache_attention() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(4);
        for (hd, heads, kvh, style, dims, qk, kv) in [
            (128, 8, 4, RopeStyle::Neox, 128, true, KvType::F16),
            (64, 6, 2, RopeStyle::Interleaved, 64, false, KvType::F32),
            (64, 3, 3, RopeStyle::Neox, 32, false, KvType::F16),
        ] {
            let n_ctx = 600;
            let rope = rope_cfg(style, dims, hd);
            let mut kg = g.kv_cache_typed(2, n_ctx, kvh, hd, kv).unwrap();
            let mut kc = c.kv_cache(2, n_ctx, kvh, hd);
            let qn = r.v(hd);
            let kn = r.v(hd);
            let (qng, qnc) = (g.tensor_from(1, hd, &qn), c.tensor_from(1, hd, &qn));
            let (kng, knc) = (g.tensor_from(1, hd, &kn), c.tensor_from(1, hd, &kn));
            // A prompt of 300 at 0 (two key chunks), then 37 at 300, 1 at 337 (decode: one
            // 32-key step per split), 250 at 338 and 1 at 588 (decode: two steps per split,
            // the softmax carried across them).
            let mut pos0 = 0;
            for n in [300, 37, 1, 250, 1] {
                let (q, k, v) = (r.v(n * heads * hd), r.v(n * kvh * hd), r.v(n * kvh * hd));
                let mut qg = g.tensor_from(n, heads * hd, &q);
                let mut kgt = g.tensor_from(n, kvh * hd, &k);
                let vg = g.tensor_from(n, kvh * hd, &v);
                let mut qc = c.tensor_from(n, heads * hd, &q);
                let mut kct = c.tensor_from(n, kvh * hd, &k);
                let vc = c.tensor_from(n, kvh * hd, &v);
                let norms_g = qk.then_some((&qng, &kng, 1e-6));
                let norms_c = qk.then_some((&qnc, &knc, 1e-6));
                g.qk_norm_rope_store(
                    &mut qg, &mut kgt, &vg, norms_g, &rope, heads, kvh, &mut kg, 1, pos0, n,
                );
                c.qk_norm_rope_store(
                    &mut qc, &mut kct, &vc, norms_c, &rope, heads, kvh, &mut kc, 1, pos0, n,
                );
                let e = rel(&read(&g, &qg, n, heads * hd), &read(&c, &qc, n, heads * hd));
                assert!(e < 1e-5, "q hd={hd} n={n}: {e}");
                let e = rel(&read(&g, &kgt, n, kvh * hd), &read(&c, &kct, n, kvh * hd));
                assert!(e < 1e-5, "k hd={hd} n={n}: {e}");
                let shape = AttnShape {
                    n_heads: heads,
                    n_kv_heads: kvh,
                    head_dim: hd,
                    pos0,
                    n_tokens: n,
                };
                let (mut og, mut oc) = (g.tensor(n, heads * hd), c.tensor(n, heads * hd));
                g.attention(&qg, &kg, 1, shape, &mut og);
                c.attention(&qc, &kc, 1, shape, &mut oc);
                let e = rel(&read(&g, &og, n, heads * hd), &read(&c, &oc, n, heads * hd));
                let bound = if kv == KvType::F16 { 5e-3 } else { 1e-5 };
                assert!(e < bound, "attention hd={hd} {kv:?} n={n} pos0={pos0}: {e}");
                pos0 += n;
            }
            // Two sequences in one attention_batch: the same as each alone.
            let mut kg2 = g.kv_cache_typed(2, n_ctx, kvh, hd, kv).unwrap();
            let k2 = r.v(5 * kvh * hd);
            let v2 = r.v(5 * kvh * hd);
            let (k2g, v2g) = (
                g.tensor_from(5, kvh * hd, &k2),
                g.tensor_from(5, kvh * hd, &v2),
            );
            g.kv_store(&mut kg2, 1, &k2g, &v2g, 0, 5);
            let q2 = r.v(3 * heads * hd);
            let qb = g.tensor_from(3, heads * hd, &q2);
            let s1 = AttnShape {
                n_heads: heads,
                n_kv_heads: kvh,
                head_dim: hd,
                pos0: pos0 - 2,
                n_tokens: 2,
            };
            let s2 = AttnShape {
                pos0: 4,
                n_tokens: 1,
                ..s1
            };
            let mut ob = g.tensor(3, heads * hd);
            g.attention_batch(&qb, [(&kg, s1), (&kg2, s2)].into_iter(), 1, &mut ob);
            let (q1, q1b) = (&q2[..2 * heads * hd], &q2[2 * heads * hd..]);
            let mut o1 = g.tensor(2, heads * hd);
            g.attention(&g.tensor_from(2, heads * hd, q1), &kg, 1, s1, &mut o1);
            let mut o2 = g.tensor(1, heads * hd);
            g.attention(&g.tensor_from(1, heads * hd, q1b), &kg2, 1, s2, &mut o2);
            let mut want = read(&g, &o1, 2, heads * hd);
            want.extend(read(&g, &o2, 1, heads * hd));
            assert_eq!(read(&g, &ob, 3, heads * hd), want, "attention_batch");
            // The separate ops agree with the CPU's.
            let x = r.v(2 * heads * hd);
            let mut xg = g.tensor_from(2, heads * hd, &x);
            let mut xc = c.tensor_from(2, heads * hd, &x);
            g.rms_norm_heads(&mut xg, &qng, 1e-6, 2);
            c.rms_norm_heads(&mut xc, &qnc, 1e-6, 2);
            g.rope(&mut xg, &rope, heads, 55, 2);
            c.rope(&mut xc, &rope, heads, 55, 2);
            let e = rel(&read(&g, &xg, 2, heads * hd), &read(&c, &xc, 2, heads * hd));
            assert!(e < 1e-5, "rms_norm_heads + rope: {e}");
        }
    }
}

#[test]
fn conv1d_and_cpu_fallbacks() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(5);
        // Whisper's stem: (t_in, c_in) time-major, kernel 3, pad 1, strides 1 and 2.
        let (t_in, c_in, c_out, k) = (37, 20, 24, 3);
        let w = r.v(c_out * c_in * k);
        let b = r.v(c_out);
        let x = r.v(t_in * c_in);
        let (wg, wc) = (
            weight(&g, GgmlType::F32, c_out, c_in * k, &w),
            weight(&c, GgmlType::F32, c_out, c_in * k, &w),
        );
        let (bg, bc) = (g.tensor_from(1, c_out, &b), c.tensor_from(1, c_out, &b));
        let (xg, xc) = (g.tensor_from(t_in, c_in, &x), c.tensor_from(t_in, c_in, &x));
        for stride in [1, 2] {
            let (mut og, mut oc) = (g.tensor(t_in, c_out), c.tensor(t_in, c_out));
            let tg = g.conv1d(&wg, Some(&bg), &xg, t_in, k, stride, 1, &mut og);
            let tc = c.conv1d(&wc, Some(&bc), &xc, t_in, k, stride, 1, &mut oc);
            assert_eq!(tg, tc);
            let e = rel(&read(&g, &og, tg, c_out), &read(&c, &oc, tc, c_out));
            assert!(e < 1e-5, "conv1d stride {stride}: {e}");
        }
        // One op that runs on the CPU through copies: leaky ReLU.
        let mut gx = g.tensor_from(t_in, c_in, &x);
        let mut cx = c.tensor_from(t_in, c_in, &x);
        g.leaky_relu(&mut gx, 0.2, t_in * c_in);
        c.leaky_relu(&mut cx, 0.2, t_in * c_in);
        assert_eq!(read(&g, &gx, t_in, c_in), read(&c, &cx, t_in, c_in));
    }
}

#[test]
fn whisper_layer_norm_gelu_dense_attention() {
    let c = CpuBackend::new(2);
    for g in backends() {
        let mut r = Rng(9);
        for (n, cols) in [(7, 384), (3, 1500)] {
            let x: Vec<f32> = r.v(n * cols).iter().map(|v| v * 3.0 + 0.5).collect();
            let (gm, bt) = (r.v(cols), r.v(cols));
            let (xg, xc) = (g.tensor_from(n, cols, &x), c.tensor_from(n, cols, &x));
            let (gg, gc) = (g.tensor_from(1, cols, &gm), c.tensor_from(1, cols, &gm));
            let (bg, bc) = (g.tensor_from(1, cols, &bt), c.tensor_from(1, cols, &bt));
            let (mut og, mut oc) = (g.tensor(n, cols), c.tensor(n, cols));
            g.layer_norm(&xg, &gg, &bg, 1e-5, n, &mut og);
            c.layer_norm(&xc, &gc, &bc, 1e-5, n, &mut oc);
            let e = rel(&read(&g, &og, n, cols), &read(&c, &oc, n, cols));
            assert!(e < 1e-5, "layer_norm {n}x{cols}: {e}");
            // GELU through speech.wgsl's erf (|error| < 1.2e-7 against the CPU's).
            g.gelu(&mut og, n);
            c.gelu(&mut oc, n);
            let e = rel(&read(&g, &og, n, cols), &read(&c, &oc, n, cols));
            assert!(e < 1e-5, "gelu {n}x{cols}: {e}");
        }
        // Encoder-like (many queries) and cross-attention-like (a few over many keys), causal
        // and not, heads of 64 and of 80 (not a divisor of the workgroup).
        for (heads, hd, n_q, n_kv, causal) in [
            (6, 64, 150, 150, false),
            (3, 64, 37, 200, true),
            (6, 64, 2, 1500, false),
            (2, 80, 5, 40, true),
        ] {
            let d = heads * hd;
            let (q, k, v) = (r.v(n_q * d), r.v(n_kv * d), r.v(n_kv * d));
            let shape = kiln_backend::DenseAttnShape {
                heads,
                head_dim: hd,
                n_q,
                n_kv,
                causal,
            };
            let (qg, kg, vg) = (
                g.tensor_from(n_q, d, &q),
                g.tensor_from(n_kv, d, &k),
                g.tensor_from(n_kv, d, &v),
            );
            let (qc, kc, vc) = (
                c.tensor_from(n_q, d, &q),
                c.tensor_from(n_kv, d, &k),
                c.tensor_from(n_kv, d, &v),
            );
            let (mut og, mut oc) = (g.tensor(n_q, d), c.tensor(n_q, d));
            g.attention_dense(&qg, &kg, &vg, shape, &mut og);
            c.attention_dense(&qc, &kc, &vc, shape, &mut oc);
            let e = rel(&read(&g, &og, n_q, d), &read(&c, &oc, n_q, d));
            // f32 on both sides, but the CPU's many-query path may round through bf16 tiles
            // (AMX): 1e-2.
            assert!(e < 1e-2, "attention_dense {shape:?}: {e}");
        }
    }
}
