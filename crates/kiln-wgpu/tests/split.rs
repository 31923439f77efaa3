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
