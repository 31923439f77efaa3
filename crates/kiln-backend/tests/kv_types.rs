//! f16 and Q8_0 KV caches against the f32 cache: same attention within each type's rounding,
//! and the memory they hold.

use kiln_backend::cpu::CpuBackend;
use kiln_backend::{AttnShape, KvType};
use kiln_backend::{LlmOps, TensorOps};

fn rnd(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % 2001) as f32 / 1000.0 - 1.0
}

#[test]
fn packed_caches_match_f32() {
    let (heads, kv_heads, hd, n_ctx, layers) = (8, 2, 64, 96, 3);
    let kv_dim = kv_heads * hd;
    let b = CpuBackend::new(2);
    let mut seed = 0x9e3779b97f4a7c15_u64;
    let (pos0, n) = (70, 4);
    let total = pos0 + n;
    let keys: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed) * 2.0).collect();
    let vals: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed)).collect();
    let qs: Vec<f32> = (0..n * heads * hd).map(|_| rnd(&mut seed) * 2.0).collect();
    let shape = AttnShape {
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        pos0,
        n_tokens: n,
        window: 0,
    };
    let run = |ty: KvType| -> (Vec<f32>, usize) {
        let mut cache = b.kv_cache_typed(layers, n_ctx, kv_heads, hd, ty).unwrap();
        for (p0, cnt) in [(0, pos0), (pos0, n)] {
            let k = b.tensor_from(cnt, kv_dim, &keys[p0 * kv_dim..(p0 + cnt) * kv_dim]);
            let v = b.tensor_from(cnt, kv_dim, &vals[p0 * kv_dim..(p0 + cnt) * kv_dim]);
            b.kv_store(&mut cache, 1, &k, &v, p0, cnt);
        }
        let q = b.tensor_from(n, heads * hd, &qs);
        let mut out = b.tensor(n, heads * hd);
        b.attention(&q, &cache, 1, shape, &mut out);
        let mut got = vec![0f32; n * heads * hd];
        b.read(&out, n, &mut got);
        (got, b.kv_cache_bytes(&cache))
    };
    let (want, f32_bytes) = run(KvType::F32);
    assert_eq!(f32_bytes, 2 * layers * n_ctx * kv_dim * 4);
    for (ty, tol) in [(KvType::F16, 2e-3), (KvType::Q8_0, 2e-2)] {
        let (got, bytes) = run(ty);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let mag = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            err < tol * mag,
            "{}: max err {err} (max |out| {mag})",
            ty.name()
        );
        assert!(
            err > 0.0,
            "{}: identical to f32, so not stored packed",
            ty.name()
        );
        // Packed layers plus one layer of f32 scratch.
        let row = ty.ggml().row_bytes(hd).unwrap();
        let expected = 2 * layers * n_ctx * kv_heads * row + 2 * n_ctx * kv_dim * 4;
        assert_eq!(bytes, expected, "{}", ty.name());
        assert!(bytes < f32_bytes, "{}", ty.name());
    }
}

#[test]
fn q8_0_needs_whole_blocks() {
    let b = CpuBackend::new(1);
    let e = b.kv_cache_typed(1, 8, 2, 16, KvType::Q8_0).err().unwrap();
    assert!(
        e.to_string().contains("q8_0") && e.to_string().contains("16"),
        "{e}"
    );
    assert!(b.kv_cache_typed(1, 8, 2, 16, KvType::F16).is_ok());
}
