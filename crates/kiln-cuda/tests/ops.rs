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
use kiln_backend::{AttnShape, Backend, RopeConfig, RopeScaling, RopeStyle, WeightData};
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
            for n in [1, 3, 6] {
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
/// two formats, against the CPU doing the same ops.
#[test]
#[ignore]
fn decode_products_chained_in_a_step() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(7);
    let (dim, ffn) = (512, 768);
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K] {
        let (wo, wgate, wup, wdown, wq) = (
            r.v(dim * dim),
            r.v(ffn * dim),
            r.v(ffn * dim),
            r.v(dim * ffn),
            r.v(dim * dim),
        );
        let norms = (r.v(dim), r.v(dim));
        let (x0, attn) = (r.v(dim), r.v(dim));
        let mut outs = Vec::new();
        macro_rules! run {
            ($b:expr) => {{
                let b = $b;
                let o = weight(b, ty, dim, dim, &wo);
                let gt = weight(b, ty, ffn, dim, &wgate);
                let up = weight(b, ty, ffn, dim, &wup);
                let dn = weight(b, ty, dim, ffn, &wdown);
                let q = weight(b, ty, dim, dim, &wq);
                let n1 = b.tensor_from(1, dim, &norms.0);
                let n2 = b.tensor_from(1, dim, &norms.1);
                let mut x = b.tensor_from(1, dim, &x0);
                let a = b.tensor_from(1, dim, &attn);
                let mut h = b.tensor(1, dim);
                let mut f = b.tensor(1, ffn);
                let mut qo = b.tensor(1, dim);
                let (mut ko, mut vo) = (b.tensor(1, dim), b.tensor(1, dim));
                b.step(kiln_backend::next_step_key(), &[0], 0, &mut || {
                    b.matmul_add_before_norm(&o, &a, 1, &mut x, (&n1, 1e-5));
                    b.rms_norm_gate_up_silu(&x, &n1, 1e-5, &gt, &up, 1, &mut h, &mut f);
                    b.matmul_add_before_norm(&dn, &f, 1, &mut x, (&n2, 1e-5));
                    b.rms_norm_matmul3(
                        &x,
                        &n2,
                        1e-5,
                        [&q, &q, &q],
                        [None; 3],
                        1,
                        &mut h,
                        [&mut qo, &mut ko, &mut vo],
                    );
                    Ok(())
                })
                .unwrap();
                outs.push((read(b, &x, 1, dim), read(b, &qo, 1, dim)));
            }};
        }
        run!(&g);
        run!(&c);
        let e = rel(&outs[0].0, &outs[1].0);
        assert!(e < 2e-2, "{ty:?} residual: {e}");
        let e = rel(&outs[0].1, &outs[1].1);
        assert!(e < 2e-2, "{ty:?} next product: {e}");
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
        // A prompt of 300 at 0, then 37 at 300 (both through cuBLAS), 9 at 337 (the split
        // kernel) and 1 at 346 (decode), each checked.
        let mut pos0 = 0;
        for n in [300, 37, 9, 1] {
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
            g.qk_norm_rope_attention(
                &mut qg, &mut kgt, &vg, norms_g, &rope, &mut kg, 1, shape, &mut og,
            );
            c.qk_norm_rope_attention(
                &mut qc, &mut kct, &vc, norms_c, &rope, &mut kc, 1, shape, &mut oc,
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
