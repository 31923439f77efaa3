//! CUDA-specific op tests against the CPU backend (every op's generic check is the
//! conformance suite, tests/conformance.rs): the products at the token counts of its
//! kernels' thresholds, batch invariance of chained decode products, chunked prompt
//! attention over long contexts, Kokoro's ops against f64 sums, cuBLAS f32 products.
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
use kiln_backend::{LlmOps, SpeechOps, TensorOps};
use kiln_cuda::{BlasStart, CudaBackend};
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
        // (8192 x 512: a long matrix of short rows, as an output head, four rows a warp.)
        let shapes = [(75, 256), (264, 512), (33, 1024), (8192, 512)];
        products_match(&g, &c, &mut r, ty, &shapes, &[1, 3, 6, 17, 64, 65]);
    }
}

/// `matmul` with a bias, then `matmul_add` on top, of `ty` weights of each shape for each
/// token count: the GPU against the CPU.
fn products_match(
    g: &CudaBackend,
    c: &CpuBackend,
    r: &mut Rng,
    ty: GgmlType,
    shapes: &[(usize, usize)],
    ns: &[usize],
) {
    for &(rows, cols) in shapes {
        let w = r.v(rows * cols);
        let bias = r.v(rows);
        let (wg, wc) = (weight(g, ty, rows, cols, &w), weight(c, ty, rows, cols, &w));
        for &n in ns {
            let x = r.v(n * cols);
            let (xg, xc) = (g.tensor_from(n, cols, &x), c.tensor_from(n, cols, &x));
            let (bg, bc) = (g.tensor_from(1, rows, &bias), c.tensor_from(1, rows, &bias));
            let (mut og, mut oc) = (g.tensor(n, rows), c.tensor(n, rows));
            g.matmul(&wg, &xg, Some(&bg), n, &mut og);
            c.matmul(&wc, &xc, Some(&bc), n, &mut oc);
            let e = rel(&read(g, &og, n, rows), &read(c, &oc, n, rows));
            assert!(e < 1e-2, "{ty:?} {rows}x{cols} n={n}: {e}");
            g.matmul_add(&wg, &xg, n, &mut og);
            c.matmul_add(&wc, &xc, n, &mut oc);
            let e = rel(&read(g, &og, n, rows), &read(c, &oc, n, rows));
            assert!(e < 1e-2, "{ty:?} add {rows}x{cols} n={n}: {e}");
        }
    }
}

/// Prompt-sized products on kiln's own tensor-core kernel (no cuBLAS: kernels/gemm.cu), both
/// block shapes, against the CPU: odd rows and token counts, a column count that is not a
/// multiple of the k step, the bias, accumulation, and a gate/up pair with its activation.
#[test]
#[ignore]
fn own_block_products_match_the_cpu() {
    let g = CudaBackend::with_blas(0, BlasStart::Never).expect("these tests need a CUDA GPU");
    let c = CpuBackend::new(2);
    let mut r = Rng(5);
    let shapes = [(75, 256), (264, 512), (33, 1024), (1536, 384), (77, 200)];
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
    ] {
        // 65: one row past the decode kernels; 1500 x 1536: the 128 x 128 blocks.
        let fit: Vec<_> = shapes
            .into_iter()
            .filter(|&(_, cols)| cols % ty.block_size() == 0)
            .collect();
        products_match(&g, &c, &mut r, ty, &fit, &[65, 130, 1500]);
    }
    assert!(
        !g.blas_started(),
        "a backend told never to load cuBLAS loaded it"
    );
    let (dim, ffn, n) = (256, 384, 100);
    let (wgate, wup, x, norm) = (r.v(ffn * dim), r.v(ffn * dim), r.v(n * dim), r.v(dim));
    let (gg, gu) = (
        weight(&g, GgmlType::F16, ffn, dim, &wgate),
        weight(&g, GgmlType::F16, ffn, dim, &wup),
    );
    let (cg, cu) = (
        weight(&c, GgmlType::F16, ffn, dim, &wgate),
        weight(&c, GgmlType::F16, ffn, dim, &wup),
    );
    let (xg, xc) = (g.tensor_from(n, dim, &x), c.tensor_from(n, dim, &x));
    let (ng, nc) = (g.tensor_from(1, dim, &norm), c.tensor_from(1, dim, &norm));
    let (mut hg, mut hc) = (g.tensor(n, dim), c.tensor(n, dim));
    let (mut fg, mut fc) = (g.tensor(n, ffn), c.tensor(n, ffn));
    g.rms_norm_gate_up_silu(&xg, &ng, 1e-5, &gg, &gu, n, &mut hg, &mut fg);
    c.rms_norm_gate_up_silu(&xc, &nc, 1e-5, &cg, &cu, n, &mut hc, &mut fc);
    let e = rel(&read(&g, &fg, n, ffn), &read(&c, &fc, n, ffn));
    assert!(e < 1e-2, "f16 norm + gate/up + SwiGLU: {e}");
}

/// Under BlasStart::OnDemand, small weights leave cuBLAS unloaded; a weight of
/// BLAS_MIN_SIDE on both sides starts it, and so does a first block product of f32 weights.
#[test]
#[ignore]
fn cublas_loads_only_for_weights_that_want_it() {
    let g = CudaBackend::with_blas(0, BlasStart::OnDemand).expect("these tests need a CUDA GPU");
    let mut r = Rng(9);
    let small = (384, 1536);
    weight(&g, GgmlType::F16, small.0, small.1, &r.v(small.0 * small.1));
    weight(&g, GgmlType::Q8_0, 51864, 384, &r.v(51864 * 384));
    assert!(!g.blas_started(), "small weights started cuBLAS");
    let side = kiln_cuda::BLAS_MIN_SIDE;
    weight(&g, GgmlType::F16, side, side, &r.v(side * side));
    assert!(
        g.blas_started(),
        "a {side} x {side} weight did not start cuBLAS"
    );
    let e = CudaBackend::new().expect("a CUDA GPU");
    assert!(e.blas_started(), "BlasStart::Early did not start cuBLAS");
    // f32 weights (a table, say) start nothing at the load; their first block product starts
    // cuBLAS, for f32 arithmetic.
    let (g, c) = (
        CudaBackend::with_blas(0, BlasStart::OnDemand).expect("a CUDA GPU"),
        CpuBackend::reference(),
    );
    let (rows, cols, n) = (64, 256, 100);
    let w = r.v(rows * cols);
    let (wg, wc) = (
        weight(&g, GgmlType::F32, rows, cols, &w),
        weight(&c, GgmlType::F32, rows, cols, &w),
    );
    assert!(!g.blas_started(), "an f32 weight's load started cuBLAS");
    let x = r.v(n * cols);
    let (xg, xc) = (g.tensor_from(n, cols, &x), c.tensor_from(n, cols, &x));
    let (mut og, mut oc) = (g.tensor(n, rows), c.tensor(n, rows));
    g.matmul(&wg, &xg, None, n, &mut og);
    c.matmul(&wc, &xc, None, n, &mut oc);
    assert!(g.blas_started(), "an f32 block product went without cuBLAS");
    let e = rel(&read(&g, &og, n, rows), &read(&c, &oc, n, rows));
    assert!(e < 1e-5, "f32 block product: {e}");
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
    // (head size, heads, kv heads, rope, rotated dims, q/k norms, sliding window)
    for (hd, heads, kvh, style, dims, qk, window) in [
        (128, 16, 8, RopeStyle::Neox, 128, true, 0),
        (64, 12, 4, RopeStyle::Interleaved, 64, false, 0),
        (64, 6, 2, RopeStyle::Neox, 32, false, 0),
        (128, 24, 8, RopeStyle::Interleaved, 128, false, 0),
        // A head size whose lanes' slices are not aligned for wide loads, one query head a
        // KV head, and a group of eight.
        (80, 8, 8, RopeStyle::Neox, 80, false, 0),
        (112, 16, 2, RopeStyle::Neox, 112, false, 0),
        // Sliding windows: Gemma 3's shape (window 512, passed by the prompt of 600), and a
        // window shorter than a decode split's keys.
        (256, 4, 1, RopeStyle::Neox, 256, true, 512),
        (128, 16, 8, RopeStyle::Neox, 128, true, 13),
    ] {
        let n_ctx = 700;
        let rope = rope_cfg(style, dims, hd);
        let (mut kg, mut kc) = (g.kv_cache(2, n_ctx, kvh, hd), c.kv_cache(2, n_ctx, kvh, hd));
        let qn = r.v(hd);
        let kn = r.v(hd);
        let (qng, qnc) = (g.tensor_from(1, hd, &qn), c.tensor_from(1, hd, &qn));
        let (kng, knc) = (g.tensor_from(1, hd, &kn), c.tensor_from(1, hd, &kn));
        // A prompt of 600 at 0, then 37 at 600 (both through cuBLAS), 9 at 637 (the split
        // kernel) and 1 at 646 (decode: 64 keys or more a split, so past the keys each warp
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
                window,
            };
            let (mut og, mut oc) = (g.tensor(n, heads * hd), c.tensor(n, heads * hd));
            g.attention(&qg, &kg, 1, shape, &mut og);
            c.attention(&qc, &kc, 1, shape, &mut oc);
            let e = rel(&read(&g, &og, n, heads * hd), &read(&c, &oc, n, heads * hd));
            assert!(
                e < 5e-3,
                "attention hd={hd} g={} n={n} pos0={pos0} window {window}: {e}",
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
                window,
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

/// A prompt's keys and values (no q/k norms) stored into layer 0 of `cache` from position 0.
/// A prompt chunk's one-pass attention over a long cache, both forms (the second with its
/// keys split as the GPU asks, in three, and in more splits than the cache has blocks),
/// against the CPU: two group sizes, both head sizes, a sliding window.
#[test]
#[ignore]
fn flash_prompt_forms_match_the_cpu() {
    let c = CpuBackend::new(2);
    let forms = [(1, None), (2, None), (2, Some(3)), (2, Some(64))];
    let mut r = Rng(12);
    for (hd, heads, kvh, window) in [(128, 16, 8, 0), (64, 12, 4, 0), (128, 32, 8, 700)] {
        let rope = rope_cfg(RopeStyle::Neox, hd, hd);
        let (pre, n) = (2000, 300);
        let n_ctx = pre + n;
        let prompt = [
            r.v(pre * heads * hd),
            r.v(pre * kvh * hd),
            r.v(pre * kvh * hd),
        ];
        let chunk = [r.v(n * heads * hd), r.v(n * kvh * hd), r.v(n * kvh * hd)];
        let shape = AttnShape {
            n_heads: heads,
            n_kv_heads: kvh,
            head_dim: hd,
            pos0: pre,
            n_tokens: n,
            window,
        };
        // The chunk's queries stored and rotated at pre.., then its attention.
        fn chunk_attention<B: Backend>(
            b: &B,
            rope: &RopeConfig,
            prompt: &[Vec<f32>; 3],
            chunk: &[Vec<f32>; 3],
            shape: AttnShape,
            n_ctx: usize,
        ) -> Vec<f32> {
            let (heads, kvh, hd, n) = (
                shape.n_heads,
                shape.n_kv_heads,
                shape.head_dim,
                shape.n_tokens,
            );
            let mut cache = b.kv_cache(1, n_ctx, kvh, hd);
            store_prompt(
                b,
                &mut cache,
                rope,
                [&prompt[0], &prompt[1], &prompt[2]],
                heads,
                kvh,
            );
            let mut q = b.tensor_from(n, heads * hd, &chunk[0]);
            let mut k = b.tensor_from(n, kvh * hd, &chunk[1]);
            let v = b.tensor_from(n, kvh * hd, &chunk[2]);
            b.qk_norm_rope_store(
                &mut q, &mut k, &v, None, rope, heads, kvh, &mut cache, 0, shape.pos0, n,
            );
            let mut o = b.tensor(n, heads * hd);
            b.attention(&q, &cache, 0, shape, &mut o);
            read(b, &o, n, heads * hd)
        }
        let want = chunk_attention(&c, &rope, &prompt, &chunk, shape, n_ctx);
        for (form, splits) in forms {
            let g = gpu().with_flash_prompt(form, splits);
            let got = chunk_attention(&g, &rope, &prompt, &chunk, shape, n_ctx);
            let e = rel(&got, &want);
            assert!(
                e < 5e-3,
                "form {form} splits {splits:?} hd={hd} g={} window {window}: {e}",
                heads / kvh
            );
        }
    }
}

fn store_prompt<B: Backend>(
    b: &B,
    cache: &mut B::KvCache,
    rope: &RopeConfig,
    [q, k, v]: [&[f32]; 3],
    heads: usize,
    kvh: usize,
) {
    let hd = rope.head_dim;
    let n = k.len() / (kvh * hd);
    let mut qt = b.tensor_from(n, heads * hd, q);
    let mut kt = b.tensor_from(n, kvh * hd, k);
    let vt = b.tensor_from(n, kvh * hd, v);
    b.qk_norm_rope_store(
        &mut qt, &mut kt, &vt, None, rope, heads, kvh, cache, 0, 0, n,
    );
}

/// One decode token's fused attention (no q/k norms) over `cache`: its output row.
fn decode_step<B: Backend>(
    b: &B,
    cache: &mut B::KvCache,
    shape: AttnShape,
    rope: &RopeConfig,
    [q, k, v]: [&[f32]; 3],
) -> Vec<f32> {
    let (qw, kw) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let mut qt = b.tensor_from(1, qw, q);
    let mut kt = b.tensor_from(1, kw, k);
    let vt = b.tensor_from(1, kw, v);
    let mut o = b.tensor(1, qw);
    let [t0, t1, t2] = [0, 1, 2].map(|_| b.tensor(1, 1));
    b.qk_norm_rope_attention(
        &mut qt,
        &mut kt,
        &vt,
        None,
        rope,
        &mut [SeqKv { cache, shape }],
        0,
        &mut o,
        [&mut { t0 }, &mut { t1 }, &mut { t2 }],
    );
    read(b, &o, 1, qw)
}

/// The fused decode attention over caches long enough that every split of the grid has keys
/// and each warp several passes, for each kernel shape (lanes a key row: 4 to 32; query heads
/// a KV head: 1 to 8, 3 rounded up), with and without a sliding window, against the CPU.
#[test]
#[ignore]
fn decode_attention_over_long_caches() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(11);
    // (head size, heads, kv heads, sliding window, prompt length)
    for (hd, heads, kvh, window, n) in [
        (128, 16, 8, 0, 4500),
        (128, 24, 8, 0, 3001),
        (256, 4, 1, 0, 5000),
        (256, 4, 1, 512, 2000),
        (64, 32, 4, 0, 4097),
        (32, 8, 8, 0, 2500),
        (80, 8, 8, 0, 1500),
    ] {
        let n_ctx = n + 8;
        let rope = rope_cfg(RopeStyle::Neox, hd, hd);
        let (mut kg, mut kc) = (g.kv_cache(1, n_ctx, kvh, hd), c.kv_cache(1, n_ctx, kvh, hd));
        // The prompt's keys and values stored by both backends (f16 on the GPU), then
        // three decode steps, each reading what the one before stored.
        let (q, k, v) = (r.v(n * heads * hd), r.v(n * kvh * hd), r.v(n * kvh * hd));
        store_prompt(&g, &mut kg, &rope, [&q, &k, &v], heads, kvh);
        store_prompt(&c, &mut kc, &rope, [&q, &k, &v], heads, kvh);
        for pos0 in n..n + 3 {
            // Queries four times as large: softmax weights far from uniform over the keys.
            let q: Vec<f32> = r.v(heads * hd).iter().map(|x| 4.0 * x).collect();
            let (k, v) = (r.v(kvh * hd), r.v(kvh * hd));
            let shape = AttnShape {
                n_heads: heads,
                n_kv_heads: kvh,
                head_dim: hd,
                pos0,
                n_tokens: 1,
                window,
            };
            let out = [
                decode_step(&g, &mut kg, shape, &rope, [&q, &k, &v]),
                decode_step(&c, &mut kc, shape, &rope, [&q, &k, &v]),
            ];
            let e = rel(&out[0], &out[1]);
            assert!(
                e < 5e-3,
                "decode attention hd={hd} {heads}/{kvh} window {window} pos0={pos0}: {e}"
            );
        }
    }
}

/// The paged cache: memory follows the positions filled (not the context's size); a copy
/// shares its source's blocks, and a write into a shared block copies it first, so neither
/// cache sees the other's later keys; a dropped cache's blocks serve the next one. Decode
/// outputs of the shared and copied-on-write caches against the CPU's plain copies.
#[test]
#[ignore]
fn paged_cache_shares_blocks_and_copies_on_write() {
    let (g, c) = (gpu(), CpuBackend::new(2));
    let mut r = Rng(23);
    let (hd, heads, kvh, n_ctx) = (128, 16, 8, 8192);
    let rope = rope_cfg(RopeStyle::Neox, hd, hd);
    let block = |b: &CudaBackend, kv: &<CudaBackend as LlmOps>::KvCache| b.kv_cache_bytes(kv);
    let mut a = g.kv_cache(1, n_ctx, kvh, hd);
    let mut ac = c.kv_cache(1, n_ctx, kvh, hd);
    assert_eq!(block(&g, &a), 0, "an empty cache holds no blocks");
    // 100 positions: two blocks of 64, whatever the context's size.
    let n = 100;
    let (q, k, v) = (r.v(n * heads * hd), r.v(n * kvh * hd), r.v(n * kvh * hd));
    store_prompt(&g, &mut a, &rope, [&q, &k, &v], heads, kvh);
    store_prompt(&c, &mut ac, &rope, [&q, &k, &v], heads, kvh);
    let one = block(&g, &a) / 2;
    assert_eq!(
        one,
        2 * kvh * 64 * hd * 2,
        "one block: K and V of 64 positions"
    );
    // A fork of the first 70 positions shares both blocks ...
    let mut b = g.kv_cache(1, n_ctx, kvh, hd);
    let mut bc = c.kv_cache(1, n_ctx, kvh, hd);
    g.kv_copy(&a, &mut b, 70);
    c.kv_copy(&ac, &mut bc, 70);
    let shape = |pos0| AttnShape {
        n_heads: heads,
        n_kv_heads: kvh,
        head_dim: hd,
        pos0,
        n_tokens: 1,
        window: 0,
    };
    // ... then writes its own positions 70.. into its copy of the second block; the source
    // goes on at 100 and still sees its own keys 70..100.
    for step in 0..3 {
        let q: Vec<f32> = r.v(heads * hd).iter().map(|x| 4.0 * x).collect();
        let (k, v) = (r.v(kvh * hd), r.v(kvh * hd));
        for (gc, cc, pos0) in [(&mut b, &mut bc, 70 + step), (&mut a, &mut ac, n + step)] {
            let out = [
                decode_step(&g, gc, shape(pos0), &rope, [&q, &k, &v]),
                decode_step(&c, cc, shape(pos0), &rope, [&q, &k, &v]),
            ];
            let e = rel(&out[0], &out[1]);
            assert!(e < 5e-3, "shared cache, pos0 {pos0}: {e}");
        }
    }
    assert_eq!(
        block(&g, &b),
        2 * one,
        "the fork holds the shared first block and its own second"
    );
    // Dropped caches give their blocks back: a new cache of the same shape takes them.
    drop((a, b));
    let mut d = g.kv_cache(1, n_ctx, kvh, hd);
    let mut dc = c.kv_cache(1, n_ctx, kvh, hd);
    let (q, k, v) = (r.v(n * heads * hd), r.v(n * kvh * hd), r.v(n * kvh * hd));
    store_prompt(&g, &mut d, &rope, [&q, &k, &v], heads, kvh);
    store_prompt(&c, &mut dc, &rope, [&q, &k, &v], heads, kvh);
    let q: Vec<f32> = r.v(heads * hd).iter().map(|x| 4.0 * x).collect();
    let (k, v) = (r.v(kvh * hd), r.v(kvh * hd));
    let out = [
        decode_step(&g, &mut d, shape(n), &rope, [&q, &k, &v]),
        decode_step(&c, &mut dc, shape(n), &rope, [&q, &k, &v]),
    ];
    let e = rel(&out[0], &out[1]);
    assert!(e < 5e-3, "a cache on reused blocks: {e}");
    g.kv_release(&mut d);
    assert_eq!(block(&g, &d), 0, "a released cache holds nothing");
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
    // The conformance suite's shapes, here against f64 sums.
    for (s, transposed) in kiln_backend::conformance::CONV_NC_CASES {
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

/// A grammar's mask applied where the logits are: exactly the host's masking (disallowed to
/// minus infinity, the rest untouched, other rows untouched), and the device's greedy pick
/// and top-k candidates after it are those of the masked row.
#[test]
#[ignore]
fn mask_row_is_the_hosts_masking() {
    let b = gpu();
    let mut r = Rng(0x6d61736b);
    for (rows, cols, row) in [(1, 151_936, 0), (4, 49_152, 2), (3, 100, 1), (2, 33, 1)] {
        let x = r.v(rows * cols);
        let mut t = b.tensor_from(rows, cols, &x);
        // Sparse masks (structural tokens) and dense ones (free text).
        for density in [0.001f32, 0.5, 0.999] {
            let words: Vec<u32> = (0..cols.div_ceil(32))
                .map(|_| {
                    (0..32).fold(0u32, |w, bit| {
                        w | (((r.f() + 1.0) / 2.0 < density) as u32) << bit
                    })
                })
                .collect();
            let mut t2 = b.tensor_from(rows, cols, &x);
            assert!(b.mask_row(&mut t2, row, cols, &words));
            let got = read(&b, &t2, rows, cols);
            let mut want = x.clone();
            for c in 0..cols {
                if (words[c / 32] >> (c % 32)) & 1 == 0 {
                    want[row * cols + c] = f32::NEG_INFINITY;
                }
            }
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "{rows}x{cols} row {row} density {density}"
            );
            let masked = &want[row * cols..][..cols];
            let best = masked
                .iter()
                .enumerate()
                .fold(0, |bi, (i, &v)| if v > masked[bi] { i } else { bi });
            if masked[best].is_finite() {
                // The pick reads row 0: put the masked row there.
                b.copy_rows(&t2, row, 1, &mut t, 0);
                assert_eq!(b.argmax_rows(&t, 1, cols)[0] as usize, best);
            }
        }
    }
}
