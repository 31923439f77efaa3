//! Weights larger than the adapter binds at once are held as row ranges in buffers of their
//! own (a 262144-token embedding on lavapipe's 128 MiB limit). Here a backend told to bind at
//! most 16 KiB splits small matrices, and every product over them must equal the same
//! product on the adapter's own limit (one buffer).
//!
//! Without a GPU adapter the test prints why and passes; with `KILN_REQUIRE_GPU=1` (CI,
//! after tools/setup-lavapipe.sh) a missing adapter fails.

mod common;

use common::{gpu, read, rel, weight, Rng};
use kiln_backend::{LlmOps, TensorOps};
use kiln_quant::GgmlType;
use kiln_wgpu::{GpuOptions, WgpuBackend};

#[test]
fn weights_past_the_binding_limit_are_held_in_parts() {
    let Some(whole) = gpu() else {
        return;
    };
    let split = WgpuBackend::with_options(&GpuOptions {
        max_binding: Some(16 << 10),
        ..Default::default()
    })
    .expect("the same adapter again");
    let (rows, cols) = (300, 256);
    let mut rng = Rng(0x5eed);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::F32,
    ] {
        let (wv, uv, bv) = (rng.v(rows * cols), rng.v(rows * cols), rng.v(rows));
        let w = [&whole, &split].map(|b| weight(b, ty, rows, cols, &wv));
        let u = [&whole, &split].map(|b| weight(b, ty, rows, cols, &uv));
        assert_eq!(w[0].buffers(), 1);
        assert!(w[1].buffers() >= 3, "{ty:?}: {} buffers", w[1].buffers());
        for n in [1, 3, 20] {
            let xv = rng.v(n * cols);
            let base = rng.v(n * rows);
            // Store with a bias, add into the output, the SwiGLU pair: each backend once.
            let run = |i: usize| {
                let b = [&whole, &split][i];
                let x = b.tensor_from(n, cols, &xv);
                let bias = b.tensor_from(1, rows, &bv);
                let mut store = b.tensor(n, rows);
                b.matmul(&w[i], &x, Some(&bias), n, &mut store);
                let mut add = b.tensor_from(n, rows, &base);
                b.matmul_add(&w[i], &x, n, &mut add);
                let mut gu = b.tensor(n, rows);
                b.gate_up_silu(&w[i], &u[i], &x, n, &mut gu);
                [store, add, gu].map(|t| read(b, &t, n, rows))
            };
            let (want, got) = (run(0), run(1));
            for (what, (g, e)) in ["matmul", "matmul_add", "gate_up_silu"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                let err = rel(g, e);
                assert!(err < 1e-5, "{ty:?} n={n} {what}: rel err {err:e}");
            }
        }
        // Ids from every part, repeated and out of order.
        let ids: Vec<u32> = vec![299, 0, 150, 101, 299, 7, 204, 100];
        let emb = [&whole, &split].map(|b| {
            let mut out = b.tensor(ids.len(), cols);
            b.embed(
                &w[if std::ptr::eq(b, &whole) { 0 } else { 1 }],
                &ids,
                &mut out,
            )
            .expect("ids in range");
            read(b, &out, ids.len(), cols)
        });
        assert_eq!(emb[0], emb[1], "{ty:?}: embedding rows");
        let mut out = split.tensor(1, cols);
        assert!(
            split.embed(&w[1], &[rows as u32], &mut out).is_err(),
            "{ty:?}: an id past the table"
        );
    }
}

/// A transposed convolution whose product over every input (c_out x k rows) is past the
/// binding limit runs in runs of inputs, each adding its taps to the outputs: the same
/// output as in one run, with and without a bias, strides that do and do not divide the taps.
#[test]
fn transposed_convolutions_past_the_binding_limit_run_in_parts() {
    use kiln_backend::{Conv1dShape, SpeechOps};
    let Some(whole) = gpu() else {
        return;
    };
    let split = WgpuBackend::with_options(&GpuOptions {
        max_binding: Some(16 << 10),
        ..Default::default()
    })
    .expect("the same adapter again");
    let mut rng = Rng(0xc0417);
    for (c_in, c_out, len_in, k, stride, pad) in [(16, 32, 300, 12, 6, 3), (8, 24, 257, 7, 3, 2)] {
        let s = Conv1dShape {
            c_in,
            c_out,
            len_in,
            k,
            stride,
            pad,
            dilation: 1,
            groups: 1,
            output_pad: 0,
        };
        // c_out k rows of 4 bytes an input: at most 16 KiB / that many inputs a run.
        assert!(
            4 * c_out * k * len_in > 4 * (16 << 10),
            "{s:?} fits one run"
        );
        let lo = s.len_out_transposed();
        let (xv, wv, bv) = (rng.v(c_in * len_in), rng.v(c_in * c_out * k), rng.v(c_out));
        for with_bias in [true, false] {
            let run = |b: &WgpuBackend| {
                let x = b.tensor_from(c_in, len_in, &xv);
                let w = b.tensor_from(c_in, c_out * k, &wv);
                let bias = b.tensor_from(1, c_out, &bv);
                let mut o = b.tensor(c_out, lo);
                b.conv_transpose1d(&x, &w, with_bias.then_some(&bias), s, &mut o);
                read(b, &o, c_out, lo)
            };
            let (want, got) = (run(&whole), run(&split));
            let err = rel(&got, &want);
            assert!(
                err < 1e-6,
                "{s:?} bias={with_bias}: {err:e} against one run"
            );
        }
    }
}
