//! Every CUDA op against the CPU backend on random inputs of odd shapes, and whole models
//! (the tiny random Hugging Face fixtures) against the CPU path and transformers' logits.
//!
//! These need an NVIDIA GPU: they are `#[ignore]`d, and run with
//! `cargo test --release -p kiln-cuda -- --ignored` on a GPU machine.
//!
//! Error measure: max |cuda - cpu| / max |cpu| per output. The CUDA products quantize
//! activations to int8 blocks of 32 (as the CPU's integer kernels do) and the CUDA cache
//! holds f16, so bounds are a few 1e-3 for products and 1e-2 where both meet.

use kiln_backend::cpu::CpuBackend;
use kiln_backend::{
    AttnShape, Backend, Conv1dShape, RopeConfig, RopeScaling, RopeStyle, SeqKv, WeightData,
};
use kiln_cuda::CudaBackend;
use kiln_quant::GgmlType;

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn v(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn gpu() -> CudaBackend {
    CudaBackend::new().expect("these tests need a CUDA GPU")
}

fn rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut m) = (0f32, 0f32);
    for (g, w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        e = e.max((g - w).abs());
        m = m.max(w.abs());
    }
    e / m.max(1e-30)
}

fn read<B: Backend>(b: &B, t: &B::Tensor, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = vec![0f32; rows * cols];
    b.read(t, rows, &mut v);
    v
}

fn weight<B: Backend>(b: &B, ty: GgmlType, rows: usize, cols: usize, x: &[f32]) -> B::Weight {
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
#[ignore]
fn matmul_every_format_and_token_count() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(1);
    for ty in TYPES {
        for (rows, cols) in [(75, 256), (264, 512), (33, 1024)] {
            let w = r.v(rows * cols);
            let bias = r.v(rows);
            let (wg, wc) = (
                weight(&g, ty, rows, cols, &w),
                weight(&c, ty, rows, cols, &w),
            );
            for n in [1, 3, 6, 17, 64, 65] {
                let x = r.v(n * cols);
                let (xg, xc) = (g.tensor_from(n, cols, &x), c.tensor_from(n, cols, &x));
                let (bg, bc) = (g.tensor_from(1, rows, &bias), c.tensor_from(1, rows, &bias));
                let (mut og, mut oc) = (g.tensor(n, rows), c.tensor(n, rows));
                g.matmul(&wg, &xg, Some(&bg), n, &mut og);
                c.matmul(&wc, &xc, Some(&bc), n, &mut oc);
                let e = rel(&read(&g, &og, n, rows), &read(&c, &oc, n, rows));
                assert!(e < 1e-2, "{ty:?} {rows}x{cols} n={n}: {e}");
                // out += W x on top.
                g.matmul_add(&wg, &xg, n, &mut og);
                c.matmul_add(&wc, &xc, n, &mut oc);
                let e = rel(&read(&g, &og, n, rows), &read(&c, &oc, n, rows));
                assert!(e < 1e-2, "{ty:?} add {rows}x{cols} n={n}: {e}");
            }
        }
    }
}

#[test]
#[ignore]
fn fused_norm_products_equal_their_parts() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(2);
    let (dim, q, kv, ffn) = (512, 512, 128, 768);
    let types = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0];
    let ws: Vec<Vec<f32>> = [q, kv, kv].iter().map(|&rows| r.v(rows * dim)).collect();
    let wg: Vec<_> = (0..3)
        .map(|i| weight(&g, types[i], [q, kv, kv][i], dim, &ws[i]))
        .collect();
    let wc: Vec<_> = (0..3)
        .map(|i| weight(&c, types[i], [q, kv, kv][i], dim, &ws[i]))
        .collect();
    let norm = r.v(dim);
    for n in [1, 5] {
        let x = r.v(n * dim);
        let (xg, xc) = (g.tensor_from(n, dim, &x), c.tensor_from(n, dim, &x));
        let (ng, nc) = (g.tensor_from(1, dim, &norm), c.tensor_from(1, dim, &norm));
        let mut hg = g.tensor(n, dim);
        let mut hc = c.tensor(n, dim);
        let mut og: Vec<_> = [q, kv, kv].iter().map(|&k| g.tensor(n, k)).collect();
        let mut oc: Vec<_> = [q, kv, kv].iter().map(|&k| c.tensor(n, k)).collect();
        {
            let [a, b, d] = &mut og[..] else {
                unreachable!()
            };
            g.rms_norm_matmul3(
                &xg,
                &ng,
                1e-5,
                [&wg[0], &wg[1], &wg[2]],
                [None; 3],
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
                [None; 3],
                n,
                &mut hc,
                [a, b, d],
            );
        }
        for i in 0..3 {
            let k = [q, kv, kv][i];
            let e = rel(&read(&g, &og[i], n, k), &read(&c, &oc[i], n, k));
            assert!(e < 1e-2, "norm+matmul3 part {i} n={n}: {e}");
        }
        let wgate = r.v(ffn * dim);
        let wup = r.v(ffn * dim);
        let gg = weight(&g, GgmlType::Q4_0, ffn, dim, &wgate);
        let gu = weight(&g, GgmlType::Q4_0, ffn, dim, &wup);
        let cg = weight(&c, GgmlType::Q4_0, ffn, dim, &wgate);
        let cu = weight(&c, GgmlType::Q4_0, ffn, dim, &wup);
        let (mut fg, mut fc) = (g.tensor(n, ffn), c.tensor(n, ffn));
        g.rms_norm_gate_up_silu(&xg, &ng, 1e-5, &gg, &gu, n, &mut hg, &mut fg);
        c.rms_norm_gate_up_silu(&xc, &nc, 1e-5, &cg, &cu, n, &mut hc, &mut fc);
        let e = rel(&read(&g, &fg, n, ffn), &read(&c, &fc, n, ffn));
        assert!(e < 2e-2, "norm+gate_up n={n}: {e}");
    }
}

/// Sampling candidates selected on the GPU hold the row's top k in f32::total_cmp's order
/// (ties by the lower column, NaNs and infinities included), for k from 1 to a whole chunk
/// and rows shorter and longer than one.
#[test]
#[ignore]
fn top_candidates_hold_the_top_k() {
    let g = gpu().with_gpu_candidates();
    let mut r = Rng(12);
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    for (cols, k) in [
        (151936, 40),
        (151936, 1),
        (5000, 256),
        (100, 40),
        (3000, 2048),
    ] {
        // Coarse values, so many ties; a NaN, infinities and a negative zero.
        let mut v: Vec<f32> = r.v(cols).iter().map(|x| (x * 30.0).floor() / 4.0).collect();
        v[cols / 3] = f32::NAN;
        v[cols / 2] = f32::INFINITY;
        v[cols - 1] = f32::NEG_INFINITY;
        v[0] = -0.0;
        let x = g.tensor_from(1, cols, &v);
        let mut got = Vec::new();
        assert!(g.top_candidates(&x, cols, k, &mut got), "cols {cols} k {k}");
        got.sort_by(order);
        got.truncate(k);
        let mut want: Vec<(f32, u32)> = v.iter().enumerate().map(|(i, &l)| (l, i as u32)).collect();
        want.sort_by(order);
        want.truncate(k);
        let bits = |x: &[(f32, u32)]| x.iter().map(|&(l, i)| (l.to_bits(), i)).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "cols {cols} k {k}");
    }
}

/// A decode layer's products chained inside a step, where each writes its output quantized
/// for the next (the RMSNorm's weights folded in, its 1 / rms applied by the consumer), in
/// two formats, for 1 to 64 tokens, against the CPU doing the same ops; and each token's
/// results the same bits as when it runs alone (the decode products are batch-invariant).
#[test]
#[ignore]
fn decode_products_chained_in_a_step() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(7);
    let (dim, ffn) = (512, 768);
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::Q8_0] {
        let (wo, wgate, wup, wdown, wq) = (
            r.v(dim * dim),
            r.v(ffn * dim),
            r.v(ffn * dim),
            r.v(dim * ffn),
            r.v(dim * dim),
        );
        let norms = (r.v(dim), r.v(dim));
        let n_max = 64;
        let (x0, attn) = (r.v(n_max * dim), r.v(n_max * dim));
        // The chain over tokens t0..t0 + n: the residual rows and the next product's.
        fn chain<B: Backend>(
            b: &B,
            ty: GgmlType,
            (dim, ffn): (usize, usize),
            w: [&[f32]; 5],
            norms: (&[f32], &[f32]),
            (x0, attn): (&[f32], &[f32]),
        ) -> (Vec<f32>, Vec<f32>) {
            let n = x0.len() / dim;
            let o = weight(b, ty, dim, dim, w[0]);
            let gt = weight(b, ty, ffn, dim, w[1]);
            let up = weight(b, ty, ffn, dim, w[2]);
            let dn = weight(b, ty, dim, ffn, w[3]);
            let q = weight(b, ty, dim, dim, w[4]);
            let n1 = b.tensor_from(1, dim, norms.0);
            let n2 = b.tensor_from(1, dim, norms.1);
            let mut x = b.tensor_from(n, dim, x0);
            let a = b.tensor_from(n, dim, attn);
            let mut h = b.tensor(n, dim);
            let mut f = b.tensor(n, ffn);
            let mut qo = b.tensor(n, dim);
            let (mut ko, mut vo) = (b.tensor(n, dim), b.tensor(n, dim));
            b.step(None, &[], 0, &mut || {
                b.matmul_add_before_norm(&o, &a, n, &mut x, (&n1, 1e-5));
                b.rms_norm_gate_up_silu(&x, &n1, 1e-5, &gt, &up, n, &mut h, &mut f);
                b.matmul_add_before_norm(&dn, &f, n, &mut x, (&n2, 1e-5));
                b.rms_norm_matmul3(
                    &x,
                    &n2,
                    1e-5,
                    [&q, &q, &q],
                    [None; 3],
                    n,
                    &mut h,
                    [&mut qo, &mut ko, &mut vo],
                );
                Ok(())
            })
            .unwrap();
            (read(b, &x, n, dim), read(b, &qo, n, dim))
        }
        let w = [&wo[..], &wgate, &wup, &wdown, &wq];
        let ns = (&norms.0[..], &norms.1[..]);
        let alone: Vec<(Vec<f32>, Vec<f32>)> = (0..n_max)
            .map(|t| {
                let rows = t * dim..(t + 1) * dim;
                chain(&g, ty, (dim, ffn), w, ns, (&x0[rows.clone()], &attn[rows]))
            })
            .collect();
        for n in [1, 2, 9, 64] {
            let xs = (&x0[..n * dim], &attn[..n * dim]);
            let got = chain(&g, ty, (dim, ffn), w, ns, xs);
            let want = chain(&c, ty, (dim, ffn), w, ns, xs);
            let e = rel(&got.0, &want.0);
            assert!(e < 2e-2, "{ty:?} n={n} residual: {e}");
            let e = rel(&got.1, &want.1);
            assert!(e < 2e-2, "{ty:?} n={n} next product: {e}");
            for (t, (x1, q1)) in alone.iter().take(n).enumerate() {
                let rows = t * dim..(t + 1) * dim;
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got.0[rows.clone()]),
                    bits(x1),
                    "{ty:?} n={n} token {t}: residual"
                );
                assert_eq!(
                    bits(&got.1[rows]),
                    bits(q1),
                    "{ty:?} n={n} token {t}: next product"
                );
            }
        }
    }
}

#[test]
#[ignore]
fn embed_norm_add_argmax() {
    let (g, c) = (gpu(), CpuBackend::new(2));
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
    let x = r.v(3 * dim);
    let w = r.v(dim);
    let (xg, xc) = (g.tensor_from(3, dim, &x), c.tensor_from(3, dim, &x));
    let (wg, wc) = (g.tensor_from(1, dim, &w), c.tensor_from(1, dim, &w));
    let (mut og, mut oc) = (g.tensor(3, dim), c.tensor(3, dim));
    g.rms_norm(&xg, &wg, 1e-6, 3, &mut og);
    c.rms_norm(&xc, &wc, 1e-6, 3, &mut oc);
    assert!(rel(&read(&g, &og, 3, dim), &read(&c, &oc, 3, dim)) < 1e-5);
    g.add(&mut og, &xg, 3);
    c.add(&mut oc, &xc, 3);
    assert!(rel(&read(&g, &og, 3, dim), &read(&c, &oc, 3, dim)) < 1e-5);
    // argmax: the first of equal maxima.
    let mut l = r.v(2 * 70001);
    l[5] = 9.0;
    l[900] = 9.0;
    l[70001 + 69999] = 3.0;
    let lg = g.tensor_from(2, 70001, &l);
    assert_eq!(g.argmax_rows(&lg, 2, 70001), vec![5, 69999]);
    // The first columns only: of one row (on the GPU) and of two (through the host).
    assert_eq!(g.argmax_rows(&lg, 1, 800), vec![5]);
    l[70001 + 12] = 8.0;
    let lg = g.tensor_from(2, 70001, &l);
    assert_eq!(g.argmax_rows(&lg, 2, 60000), vec![5, 12]);
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
#[ignore]
fn heads_rope_cache_attention() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(4);
    for (hd, heads, kvh, style, dims, qk) in [
        (128, 16, 8, RopeStyle::Neox, 128, true),
        (64, 12, 4, RopeStyle::Interleaved, 64, false),
        (64, 6, 2, RopeStyle::Neox, 32, false),
        (128, 24, 8, RopeStyle::Interleaved, 128, false),
        // A head size whose lanes' slices are not aligned for wide loads, one query head a
        // KV head, and a group of eight.
        (80, 8, 8, RopeStyle::Neox, 80, false),
        (112, 16, 2, RopeStyle::Neox, 112, false),
    ] {
        let n_ctx = 700;
        let rope = rope_cfg(style, dims, hd);
        let (mut kg, mut kc) = (g.kv_cache(2, n_ctx, kvh, hd), c.kv_cache(2, n_ctx, kvh, hd));
        let qn = r.v(hd);
        let kn = r.v(hd);
        let (qng, qnc) = (g.tensor_from(1, hd, &qn), c.tensor_from(1, hd, &qn));
        let (kng, knc) = (g.tensor_from(1, hd, &kn), c.tensor_from(1, hd, &kn));
        // A prompt of 600 at 0, then 37 at 600 (both through cuBLAS), 9 at 637 (the split
        // kernel) and 1 at 646 (decode: over 16 keys a split, so past the keys each warp
        // loads before its wait), each checked.
        let mut pos0 = 0;
        for n in [600, 37, 9, 1] {
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
            assert!(
                e < 5e-3,
                "attention hd={hd} g={} n={n} pos0={pos0}: {e}",
                heads / kvh
            );
            // The same prompt attention in query chunks of 7.
            let ld = (pos0 + n).next_multiple_of(8);
            g.set_prompt_attention_bytes(7 * heads * ld * 6);
            let mut og = g.tensor(n, heads * hd);
            g.attention(&qg, &kg, 1, shape, &mut og);
            g.set_prompt_attention_bytes(256 << 20);
            let e = rel(&read(&g, &og, n, heads * hd), &read(&c, &oc, n, heads * hd));
            assert!(e < 5e-3, "chunked attention hd={hd} n={n} pos0={pos0}: {e}");
            pos0 += n;
        }
        // Two decode steps through the fused call (the second reads the key and value the
        // first stored).
        for _ in 0..2 {
            let (q, k, v) = (r.v(heads * hd), r.v(kvh * hd), r.v(kvh * hd));
            let (mut qg, mut kgt, vg) = (
                g.tensor_from(1, heads * hd, &q),
                g.tensor_from(1, kvh * hd, &k),
                g.tensor_from(1, kvh * hd, &v),
            );
            let (mut qc, mut kct, vc) = (
                c.tensor_from(1, heads * hd, &q),
                c.tensor_from(1, kvh * hd, &k),
                c.tensor_from(1, kvh * hd, &v),
            );
            let shape = AttnShape {
                n_heads: heads,
                n_kv_heads: kvh,
                head_dim: hd,
                pos0,
                n_tokens: 1,
            };
            let norms_g = qk.then_some((&qng, &kng, 1e-6));
            let norms_c = qk.then_some((&qnc, &knc, 1e-6));
            let (mut og, mut oc) = (g.tensor(1, heads * hd), c.tensor(1, heads * hd));
            let [t0, t1, t2] = [0, 1, 2].map(|_| g.tensor(1, 1));
            g.qk_norm_rope_attention(
                &mut qg,
                &mut kgt,
                &vg,
                norms_g,
                &rope,
                &mut [SeqKv {
                    cache: &mut kg,
                    shape,
                }],
                1,
                &mut og,
                [&mut { t0 }, &mut { t1 }, &mut { t2 }],
            );
            let [t0, t1, t2] = [0, 1, 2].map(|_| c.tensor(1, 1));
            c.qk_norm_rope_attention(
                &mut qc,
                &mut kct,
                &vc,
                norms_c,
                &rope,
                &mut [SeqKv {
                    cache: &mut kc,
                    shape,
                }],
                1,
                &mut oc,
                [&mut { t0 }, &mut { t1 }, &mut { t2 }],
            );
            let e = rel(&read(&g, &og, 1, heads * hd), &read(&c, &oc, 1, heads * hd));
            assert!(e < 5e-3, "fused decode attention hd={hd} pos0={pos0}: {e}");
            pos0 += 1;
        }
        // The separate ops agree with the fused one.
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

/// One `qk_norm_rope_attention` of the sequences (`caches[i]` with `shapes[i]`) whose rows of
/// q, k and v (host values) are stacked; returns the attention output rows.
fn step_seqs<B: Backend>(
    b: &B,
    caches: &mut [B::KvCache],
    shapes: &[AttnShape],
    [q, k, v]: [&[f32]; 3],
    norms: Option<(&B::Tensor, &B::Tensor, f32)>,
    rope: &RopeConfig,
) -> Vec<f32> {
    let s = shapes[0];
    let (qd, kd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let rows: usize = shapes.iter().map(|s| s.n_tokens).sum();
    let (mut qt, mut kt, vt) = (
        b.tensor_from(rows, qd, q),
        b.tensor_from(rows, kd, k),
        b.tensor_from(rows, kd, v),
    );
    let mut out = b.tensor(rows, qd);
    let mut seqs: Vec<_> = caches
        .iter_mut()
        .zip(shapes)
        .map(|(cache, &shape)| SeqKv { cache, shape })
        .collect();
    let (mut t0, mut t1, mut t2) = (b.tensor(rows, qd), b.tensor(rows, kd), b.tensor(rows, kd));
    b.qk_norm_rope_attention(
        &mut qt,
        &mut kt,
        &vt,
        norms,
        rope,
        &mut seqs,
        1,
        &mut out,
        [&mut t0, &mut t1, &mut t2],
    );
    read(b, &out, rows, qd)
}

/// Several sequences in one step, each over its own cache at its own position: one token
/// each (the batched decode kernel, one launch for all), then a mixed step (a prompt chunk
/// beside decode tokens: the composed path), against the CPU doing the same; and each
/// sequence's rows equal to what it gets alone on the GPU (batch invariance).
#[test]
#[ignore]
fn batched_attention_over_sequences() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(11);
    for (hd, heads, kvh, qk) in [(128, 16, 8, true), (64, 12, 4, false), (80, 8, 8, false)] {
        let rope = rope_cfg(RopeStyle::Neox, hd, hd);
        let (qn, kn) = (r.v(hd), r.v(hd));
        let (qng, qnc) = (g.tensor_from(1, hd, &qn), c.tensor_from(1, hd, &qn));
        let (kng, knc) = (g.tensor_from(1, hd, &kn), c.tensor_from(1, hd, &kn));
        // Four sequences of different lengths (and cache sizes), their prompts stored first.
        let lens = [5usize, 300, 41, 1];
        let ctxs = [64usize, 400, 128, 32];
        let mut kg: Vec<_> = ctxs.iter().map(|&n| g.kv_cache(2, n, kvh, hd)).collect();
        let mut kc: Vec<_> = ctxs.iter().map(|&n| c.kv_cache(2, n, kvh, hd)).collect();
        let mut alone: Vec<_> = ctxs.iter().map(|&n| g.kv_cache(2, n, kvh, hd)).collect();
        for (i, &n) in lens.iter().enumerate() {
            let (k, v) = (r.v(n * kvh * hd), r.v(n * kvh * hd));
            for layer in 0..2 {
                let (kt, vt) = (
                    g.tensor_from(n, kvh * hd, &k),
                    g.tensor_from(n, kvh * hd, &v),
                );
                g.kv_store(&mut kg[i], layer, &kt, &vt, 0, n);
                g.kv_store(&mut alone[i], layer, &kt, &vt, 0, n);
                let (kt, vt) = (
                    c.tensor_from(n, kvh * hd, &k),
                    c.tensor_from(n, kvh * hd, &v),
                );
                c.kv_store(&mut kc[i], layer, &kt, &vt, 0, n);
            }
        }
        let mut pos = lens;
        // Two decode steps (the second reads what the first stored), then a mixed step.
        for tokens in [[1usize, 1, 1, 1], [1, 1, 1, 1], [1, 7, 1, 3]] {
            let rows: usize = tokens.iter().sum();
            let (q, k, v) = (
                r.v(rows * heads * hd),
                r.v(rows * kvh * hd),
                r.v(rows * kvh * hd),
            );
            let shapes: Vec<AttnShape> = (0..4)
                .map(|i| AttnShape {
                    n_heads: heads,
                    n_kv_heads: kvh,
                    head_dim: hd,
                    pos0: pos[i],
                    n_tokens: tokens[i],
                })
                .collect();
            let norms_g = qk.then_some((&qng, &kng, 1e-6));
            let norms_c = qk.then_some((&qnc, &knc, 1e-6));
            let og = step_seqs(&g, &mut kg, &shapes, [&q, &k, &v], norms_g, &rope);
            let oc = step_seqs(&c, &mut kc, &shapes, [&q, &k, &v], norms_c, &rope);
            let e = rel(&og, &oc);
            assert!(e < 5e-3, "batched attention hd={hd} tokens={tokens:?}: {e}");
            // Each sequence alone on the GPU: the same rows, bit for bit, for the decode steps.
            let mut r0 = 0;
            for i in 0..4 {
                let n = tokens[i];
                let (qr, kr, vr) = (
                    &q[r0 * heads * hd..(r0 + n) * heads * hd],
                    &k[r0 * kvh * hd..(r0 + n) * kvh * hd],
                    &v[r0 * kvh * hd..(r0 + n) * kvh * hd],
                );
                let alone_i = std::slice::from_mut(&mut alone[i]);
                let sh = &shapes[i..=i];
                let want = step_seqs(&g, alone_i, sh, [qr, kr, vr], norms_g, &rope);
                let got = &og[r0 * heads * hd..(r0 + n) * heads * hd];
                if tokens == [1, 1, 1, 1] {
                    assert_eq!(got, &want[..], "sequence {i} batched vs alone, hd={hd}");
                } else {
                    let e = rel(got, &want);
                    assert!(e < 5e-3, "sequence {i} mixed step vs alone, hd={hd}: {e}");
                }
                r0 += n;
                pos[i] += n;
            }
        }
    }
}

#[test]
#[ignore]
fn whisper_layer_norm_gelu_dense_attention() {
    let g = gpu();
    let c = CpuBackend::new(2);
    let mut r = Rng(9);
    // Layer norm over rows of 384 (Whisper tiny's width) and 1500 (an odd row length).
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
        // GELU (erf) in place, on the normalised rows.
        g.gelu(&mut og, n);
        c.gelu(&mut oc, n);
        let e = rel(&read(&g, &og, n, cols), &read(&c, &oc, n, cols));
        assert!(e < 1e-5, "gelu {n}x{cols}: {e}");
    }
    // Rows by position (Whisper's positional embedding), f32 and f16 tables.
    for ty in [GgmlType::F32, GgmlType::F16] {
        let tab = r.v(448 * 384);
        let (tg, tc) = (
            weight(&g, ty, 448, 384, &tab),
            weight(&c, ty, 448, 384, &tab),
        );
        let (mut og, mut oc) = (g.tensor(3, 384), c.tensor(3, 384));
        g.embed_positions(&tg, 445, 3, &mut og).unwrap();
        c.embed_positions(&tc, 445, 3, &mut oc).unwrap();
        assert_eq!(read(&g, &og, 3, 384), read(&c, &oc, 3, 384), "{ty:?}");
        assert!(g.embed_positions(&tg, 446, 3, &mut og).is_err());
    }
    // Dense attention, heads of 64: the encoder's (many queries, the tiled kernel) and the
    // decoder's cross-attention (a few queries over 1500 keys), causal and not.
    for (heads, n_q, n_kv, causal) in [
        (6, 300, 300, false),
        (6, 75, 75, true),
        (3, 37, 200, true),
        (6, 1, 1500, false),
        (6, 3, 1500, false),
        (4, 5, 40, true),
    ] {
        let d = heads * 64;
        let (q, k, v) = (r.v(n_q * d), r.v(n_kv * d), r.v(n_kv * d));
        let shape = kiln_backend::DenseAttnShape {
            heads,
            head_dim: 64,
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
        // Both in f32 (the CPU's encoder path may round through bf16 tiles on AMX: 1e-2).
        assert!(e < 1e-2, "attention_dense {shape:?}: {e}");
    }
}

/// Kokoro's feature-map ops (kernels/signal.cu) against the CPU backend: convolutions plain,
/// dilated, strided, grouped and transposed, the norms, activations, transpose, upsampling,
/// the uint8 rounding (exactly) and the BERT's attention.
#[test]
#[ignore]
fn kokoro_signal_ops_match_the_cpu() {
    // The CPU's f32 reference for the norms and activations; the convolutions and the product
    // against the sums written out below in f64 (the CPU's fast convolutions may round through
    // bf16 where the CPU has AMX). Every check runs; the failures are reported together.
    let (g, c) = (gpu(), CpuBackend::reference());
    let mut bad: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            bad.push(what)
        }
    };
    let mut r = Rng(21);
    let conv = |c_in, c_out, len_in, k, stride, pad, dilation, groups, output_pad| Conv1dShape {
        c_in,
        c_out,
        len_in,
        k,
        stride,
        pad,
        dilation,
        groups,
        output_pad,
    };
    for (s, transposed) in [
        (conv(64, 48, 300, 7, 1, 9, 3, 1, 0), false),
        (conv(32, 32, 257, 1, 1, 0, 1, 1, 0), false),
        (conv(16, 24, 101, 3, 2, 1, 1, 1, 0), false),
        (conv(24, 24, 99, 3, 1, 1, 1, 24, 0), false),
        (conv(16, 8, 50, 5, 1, 2, 1, 2, 0), false),
        (conv(64, 32, 40, 20, 10, 5, 1, 1, 0), true),
        (conv(24, 24, 33, 3, 2, 1, 1, 24, 1), true),
        (conv(16, 8, 20, 4, 2, 1, 1, 1, 1), true),
    ] {
        let (wr, wc) = match transposed {
            false => (s.c_out, s.c_in / s.groups * s.k),
            true => (s.c_in, s.c_out / s.groups * s.k),
        };
        let lo = match transposed {
            false => s.len_out(),
            true => s.len_out_transposed(),
        };
        let (x, w, b) = (r.v(s.c_in * s.len_in), r.v(wr * wc), r.v(s.c_out));
        let xg = g.tensor_from(s.c_in, s.len_in, &x);
        let wg = g.tensor_from(wr, wc, &w);
        let bg = g.tensor_from(1, s.c_out, &b);
        let mut og = g.tensor(s.c_out, lo);
        for bias in [true, false] {
            let bgo = bias.then_some(&bg);
            match transposed {
                true => g.conv_transpose1d(&xg, &wg, bgo, s, &mut og),
                false => g.conv1d_nc(&xg, &wg, bgo, s, &mut og),
            }
            let want = conv_f64(&x, &w, bias.then_some(&b[..]), s, transposed);
            let e = rel(&read(&g, &og, s.c_out, lo), &want);
            check(
                e < 1e-5,
                format!("conv (transposed {transposed}, bias {bias}) {s:?}: {e}"),
            );
        }
    }
    // The norms over (c, len) channels, (len, c) steps and plain rows.
    let (ch, len) = (48, 300);
    let x: Vec<f32> = r.v(ch * len).iter().map(|v| v * 3.0 + 0.5).collect();
    let gb = r.v(2 * ch);
    let (gbg, gbc) = (g.tensor_from(1, 2 * ch, &gb), c.tensor_from(1, 2 * ch, &gb));
    let (mut xg, mut xc) = (g.tensor_from(ch, len, &x), c.tensor_from(ch, len, &x));
    g.ada_in(&mut xg, &gbg, ch, len, 1e-5);
    c.ada_in(&mut xc, &gbc, ch, len, 1e-5);
    let e = rel(&read(&g, &xg, ch, len), &read(&c, &xc, ch, len));
    check(e < 1e-5, format!("ada_in: {e}"));
    let (mut xg, mut xc) = (g.tensor_from(len, ch, &x), c.tensor_from(len, ch, &x));
    g.ada_layer_norm(&mut xg, &gbg, len, ch, 1e-5);
    c.ada_layer_norm(&mut xc, &gbc, len, ch, 1e-5);
    let e = rel(&read(&g, &xg, len, ch), &read(&c, &xc, len, ch));
    check(e < 1e-5, format!("ada_layer_norm: {e}"));
    let (rows, cols) = (31, 768);
    let x: Vec<f32> = r.v(rows * cols).iter().map(|v| v * 2.0 - 0.3).collect();
    let (lw, lb) = (r.v(cols), r.v(cols));
    let (lwg, lwc) = (g.tensor_from(1, cols, &lw), c.tensor_from(1, cols, &lw));
    let (lbg, lbc) = (g.tensor_from(1, cols, &lb), c.tensor_from(1, cols, &lb));
    for affine in [true, false] {
        let (mut xg, mut xc) = (g.tensor_from(rows, cols, &x), c.tensor_from(rows, cols, &x));
        let (wg, bg) = (affine.then_some(&lwg), affine.then_some(&lbg));
        let (wc, bc) = (affine.then_some(&lwc), affine.then_some(&lbc));
        g.layer_norm_rows(&mut xg, wg, bg, 1e-12, rows, cols);
        c.layer_norm_rows(&mut xc, wc, bc, 1e-12, rows, cols);
        let e = rel(&read(&g, &xg, rows, cols), &read(&c, &xc, rows, cols));
        check(e < 1e-5, format!("layer_norm_rows (affine {affine}): {e}"));
        // GELU (tanh) on the normalised rows.
        g.gelu_tanh(&mut xg, rows * cols);
        c.gelu_tanh(&mut xc, rows * cols);
        let e = rel(&read(&g, &xg, rows, cols), &read(&c, &xc, rows, cols));
        check(e < 1e-5, format!("gelu_tanh: {e}"));
    }
    // Snake, leaky ReLU, transpose and upsampling.
    let x: Vec<f32> = r.v(ch * len).iter().map(|v| v * 4.0).collect();
    let alpha: Vec<f32> = r.v(ch).iter().map(|v| 0.3 + v.abs()).collect();
    let (ag, ac) = (g.tensor_from(1, ch, &alpha), c.tensor_from(1, ch, &alpha));
    let (mut xg, mut xc) = (g.tensor_from(ch, len, &x), c.tensor_from(ch, len, &x));
    g.snake(&mut xg, &ag, ch, len);
    c.snake(&mut xc, &ac, ch, len);
    let e = rel(&read(&g, &xg, ch, len), &read(&c, &xc, ch, len));
    check(e < 1e-5, format!("snake: {e}"));
    g.leaky_relu(&mut xg, 0.2, ch * len);
    c.leaky_relu(&mut xc, 0.2, ch * len);
    let e = rel(&read(&g, &xg, ch, len), &read(&c, &xc, ch, len));
    check(e < 1e-5, format!("leaky_relu: {e}"));
    let (mut tg, mut tc) = (g.tensor(len, ch), c.tensor(len, ch));
    g.transpose(&xg, ch, len, &mut tg);
    c.transpose(&xc, ch, len, &mut tc);
    let e = rel(&read(&g, &tg, len, ch), &read(&c, &tc, len, ch));
    check(e < 1e-5, format!("transpose: {e}"));
    let (mut ug, mut uc) = (g.tensor(5, 17 * 3), c.tensor(5, 17 * 3));
    // (From the same input bits: snake's sines differ between the two in the last bits.)
    let (x0g, x0c) = (g.tensor_from(ch, len, &x), c.tensor_from(ch, len, &x));
    g.upsample_nearest(&x0g, 5, 17, 3, &mut ug);
    c.upsample_nearest(&x0c, 5, 17, 3, &mut uc);
    check(
        read(&g, &ug, 5, 51) == read(&c, &uc, 5, 51),
        format!("upsample_nearest"),
    );
    // The uint8 rounding: the same grid, value for value (one range all positive; one of
    // exact halves between grid points, where rounding half to even decides).
    // (-127.5..=127.5 in halves: scale exactly 1, every other value a tie.)
    let ties: Vec<f32> = (-255..=255).map(|i| i as f32 * 0.5).collect();
    for shift in [0.0, 5.0, f32::NAN] {
        let x: Vec<f32> = match shift.is_nan() {
            true => ties.clone(),
            false => r.v(70_001).iter().map(|v| v * 3.0 + shift).collect(),
        };
        let (mut xg, mut xc) = (g.tensor_from(1, x.len(), &x), c.tensor_from(1, x.len(), &x));
        g.fake_quant_u8(&mut xg, x.len());
        c.fake_quant_u8(&mut xc, x.len());
        let (got, want) = (read(&g, &xg, 1, x.len()), read(&c, &xc, 1, x.len()));
        let off = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        check(
            off == 0,
            format!(
                "fake_quant_u8 (shift {shift}, NaN: the ties): {off} values off the CPU's grid"
            ),
        );
    }
    // f32 products of a prompt's rows (cuBLAS in f32, as the CPU multiplies them).
    let (rows, cols, n) = (96, 768, 31);
    let (w, x, b) = (r.v(rows * cols), r.v(n * cols), r.v(rows));
    let wg = weight(&g, GgmlType::F32, rows, cols, &w);
    let (xg, bg) = (g.tensor_from(n, cols, &x), g.tensor_from(1, rows, &b));
    let mut og = g.tensor(n, rows);
    g.matmul(&wg, &xg, Some(&bg), n, &mut og);
    let want: Vec<f32> = (0..n * rows)
        .map(|i| {
            let (t, o) = (i / rows, i % rows);
            let d: f64 = (0..cols)
                .map(|j| w[o * cols + j] as f64 * x[t * cols + j] as f64)
                .sum();
            (d + b[o] as f64) as f32
        })
        .collect();
    let e = rel(&read(&g, &og, n, rows), &want);
    check(e < 1e-5, format!("f32 matmul of {n} rows: {e}"));
    // The BERT's bidirectional attention (heads of 64).
    let (heads, hd, n) = (12, 64, 40);
    let (q, k, v) = (
        r.v(n * heads * hd),
        r.v(n * heads * hd),
        r.v(n * heads * hd),
    );
    let (qg, kg, vg) = (
        g.tensor_from(n, heads * hd, &q),
        g.tensor_from(n, heads * hd, &k),
        g.tensor_from(n, heads * hd, &v),
    );
    let (qc, kc, vc) = (
        c.tensor_from(n, heads * hd, &q),
        c.tensor_from(n, heads * hd, &k),
        c.tensor_from(n, heads * hd, &v),
    );
    let (mut og, mut oc) = (g.tensor(n, heads * hd), c.tensor(n, heads * hd));
    g.self_attention(&qg, &kg, &vg, heads, hd, n, &mut og);
    c.self_attention(&qc, &kc, &vc, heads, hd, n, &mut oc);
    let e = rel(&read(&g, &og, n, heads * hd), &read(&c, &oc, n, heads * hd));
    check(e < 1e-4, format!("self_attention: {e}"));
    drop(check);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// conv1d_nc / conv_transpose1d as their docs write them, summed in f64.
fn conv_f64(x: &[f32], w: &[f32], b: Option<&[f32]>, s: Conv1dShape, transposed: bool) -> Vec<f32> {
    let (cig, cog) = (s.c_in / s.groups, s.c_out / s.groups);
    let lo = if transposed {
        s.len_out_transposed()
    } else {
        s.len_out()
    };
    let mut y: Vec<f64> = (0..s.c_out * lo)
        .map(|i| b.map_or(0.0, |b| b[i / lo] as f64))
        .collect();
    for o in 0..s.c_out {
        let g = o / cog;
        for i in 0..cig {
            let ci = g * cig + i;
            for j in 0..s.k {
                let wv = match transposed {
                    false => w[(o * cig + i) * s.k + j],
                    true => w[(ci * cog + o % cog) * s.k + j],
                } as f64;
                for t in 0..if transposed { s.len_in } else { lo } {
                    // conv: out t reads x[t * stride + j * dil - pad]; transposed: x[t]
                    // writes out[t * stride + j * dil - pad].
                    let p = (t * s.stride + j * s.dilation) as isize - s.pad as isize;
                    match transposed {
                        false if p >= 0 && (p as usize) < s.len_in => {
                            y[o * lo + t] += wv * x[ci * s.len_in + p as usize] as f64
                        }
                        true if p >= 0 && (p as usize) < lo => {
                            y[o * lo + p as usize] += wv * x[ci * s.len_in + t] as f64
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    y.into_iter().map(|v| v as f32).collect()
}

/// Prompt-sized products of f32 weights (Kokoro's, a BERT's) through cuBLAS in f32: with the
/// fused RMSNorm, as gate/up + SwiGLU and accumulating, against the CPU's f32 reference.
#[test]
#[ignore]
fn f32_prompt_products_match_the_reference() {
    let (g, c) = (gpu(), CpuBackend::reference());
    let mut r = Rng(31);
    let (dim, q, kv, ffn, n) = (256, 256, 64, 384, 20);
    let ws: Vec<Vec<f32>> = [q, kv, kv].iter().map(|&rows| r.v(rows * dim)).collect();
    let wg: Vec<_> = (0..3)
        .map(|i| weight(&g, GgmlType::F32, [q, kv, kv][i], dim, &ws[i]))
        .collect();
    let wc: Vec<_> = (0..3)
        .map(|i| weight(&c, GgmlType::F32, [q, kv, kv][i], dim, &ws[i]))
        .collect();
    let (x, norm) = (r.v(n * dim), r.v(dim));
    let (xg, xc) = (g.tensor_from(n, dim, &x), c.tensor_from(n, dim, &x));
    let (ng, nc) = (g.tensor_from(1, dim, &norm), c.tensor_from(1, dim, &norm));
    let (mut hg, mut hc) = (g.tensor(n, dim), c.tensor(n, dim));
    let mut og: Vec<_> = [q, kv, kv].iter().map(|&k| g.tensor(n, k)).collect();
    let mut oc: Vec<_> = [q, kv, kv].iter().map(|&k| c.tensor(n, k)).collect();
    {
        let [a, b, d] = &mut og[..] else {
            unreachable!()
        };
        let w = [&wg[0], &wg[1], &wg[2]];
        g.rms_norm_matmul3(&xg, &ng, 1e-5, w, [None; 3], n, &mut hg, [a, b, d]);
        let [a, b, d] = &mut oc[..] else {
            unreachable!()
        };
        let w = [&wc[0], &wc[1], &wc[2]];
        c.rms_norm_matmul3(&xc, &nc, 1e-5, w, [None; 3], n, &mut hc, [a, b, d]);
    }
    for (i, k) in [q, kv, kv].into_iter().enumerate() {
        let e = rel(&read(&g, &og[i], n, k), &read(&c, &oc[i], n, k));
        assert!(e < 1e-5, "f32 norm + matmul3 part {i}: {e}");
    }
    let (wgate, wup) = (r.v(ffn * dim), r.v(ffn * dim));
    let (gg, gu) = (
        weight(&g, GgmlType::F32, ffn, dim, &wgate),
        weight(&g, GgmlType::F32, ffn, dim, &wup),
    );
    let (cg, cu) = (
        weight(&c, GgmlType::F32, ffn, dim, &wgate),
        weight(&c, GgmlType::F32, ffn, dim, &wup),
    );
    let (mut fg, mut fc) = (g.tensor(n, ffn), c.tensor(n, ffn));
    g.rms_norm_gate_up_silu(&xg, &ng, 1e-5, &gg, &gu, n, &mut hg, &mut fg);
    c.rms_norm_gate_up_silu(&xc, &nc, 1e-5, &cg, &cu, n, &mut hc, &mut fc);
    let e = rel(&read(&g, &fg, n, ffn), &read(&c, &fc, n, ffn));
    assert!(e < 1e-5, "f32 norm + gate/up + SwiGLU: {e}");
    // down(ffn -> dim) added onto the rows.
    let wd = r.v(dim * ffn);
    let (dg, dc) = (
        weight(&g, GgmlType::F32, dim, ffn, &wd),
        weight(&c, GgmlType::F32, dim, ffn, &wd),
    );
    let (mut yg, mut yc) = (g.tensor_from(n, dim, &x), c.tensor_from(n, dim, &x));
    g.matmul_add(&dg, &fg, n, &mut yg);
    c.matmul_add(&dc, &fc, n, &mut yc);
    let e = rel(&read(&g, &yg, n, dim), &read(&c, &yc, n, dim));
    assert!(e < 1e-5, "f32 matmul_add: {e}");
}
