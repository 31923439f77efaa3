//! Attention over the KV cache against a plain f64 computation, for grouped-query shapes,
//! several tokens at once after a cached prefix, one and two threads (shared by the test
//! binaries that run it under different kernel choices).

use kiln_backend::cpu::CpuBackend;
use kiln_backend::{AttnShape, KvType};
use kiln_backend::{LlmOps, TensorOps};

fn rnd(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % 2001) as f32 / 1000.0 - 1.0
}

pub fn attention_matches_naive() {
    // (heads, kv heads, head size, cached prefix, new tokens, sliding window (0: none))
    for (heads, kv_heads, hd, pos0, n, window) in [
        (4, 4, 8, 0, 5, 0),
        (9, 3, 64, 7, 3, 0),
        (16, 8, 128, 30, 1, 0),
        (6, 1, 16, 0, 9, 0),
        (8, 2, 64, 40, 21, 0),
        (4, 2, 128, 0, 64, 0),
        (4, 1, 256, 20, 9, 0),
        (4, 4, 8, 0, 5, 2),
        (9, 3, 64, 7, 3, 4),
        (16, 8, 128, 30, 1, 13),
        (8, 2, 64, 40, 21, 9),
        (4, 2, 128, 0, 64, 33),
        (4, 1, 256, 20, 9, 7),
        (8, 2, 64, 3, 40, 100),
    ] {
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let n_ctx = 64;
            let kv_dim = kv_heads * hd;
            let mut cache = b.kv_cache(1, n_ctx, kv_heads, hd);
            let mut seed = 0x2545f4914f6cdd1d_u64;
            let total = pos0 + n;
            let keys: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed) * 2.0).collect();
            let vals: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed)).collect();
            let qs: Vec<f32> = (0..n * heads * hd).map(|_| rnd(&mut seed) * 2.0).collect();
            // The prefix in one store, the new tokens in another.
            for (p0, cnt) in [(0, pos0), (pos0, n)] {
                if cnt == 0 {
                    continue;
                }
                let k = b.tensor_from(cnt, kv_dim, &keys[p0 * kv_dim..(p0 + cnt) * kv_dim]);
                let v = b.tensor_from(cnt, kv_dim, &vals[p0 * kv_dim..(p0 + cnt) * kv_dim]);
                b.kv_store(&mut cache, 0, &k, &v, p0, cnt);
            }
            let q = b.tensor_from(n, heads * hd, &qs);
            let mut out = b.tensor(n, heads * hd);
            let shape = AttnShape {
                n_heads: heads,
                n_kv_heads: kv_heads,
                head_dim: hd,
                pos0,
                n_tokens: n,
                window,
            };
            b.attention(&q, &cache, 0, shape, &mut out);
            let mut got = vec![0f32; n * heads * hd];
            b.read(&out, n, &mut got);
            for t in 0..n {
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let len = pos0 + t + 1;
                    let lo = if window == 0 {
                        0
                    } else {
                        len.saturating_sub(window)
                    };
                    let qv = &qs[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                    let sc: Vec<f64> = (lo..len)
                        .map(|p| {
                            let kp = &keys[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
                            qv.iter()
                                .zip(kp)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for e in 0..hd {
                        let want: f64 = (lo..len)
                            .map(|p| w[p - lo] / z * vals[p * kv_dim + kvh * hd + e] as f64)
                            .sum();
                        let g = got[(t * heads + h) * hd + e] as f64;
                        assert!(
                            (g - want).abs() < 1e-5,
                            "shape {heads}/{kv_heads}x{hd} window {window} t{t} h{h} e{e}: {g} vs {want}"
                        );
                    }
                }
            }
            // Each token alone (as decoding computes it) gives bit for bit what the batch
            // gave it.
            for t in 0..n {
                let qt = b.tensor_from(1, heads * hd, &qs[t * heads * hd..(t + 1) * heads * hd]);
                let mut one = b.tensor(1, heads * hd);
                let shape1 = AttnShape {
                    pos0: pos0 + t,
                    n_tokens: 1,
                    ..shape
                };
                b.attention(&qt, &cache, 0, shape1, &mut one);
                let mut alone = vec![0f32; heads * hd];
                b.read(&one, 1, &mut alone);
                let batch = &got[t * heads * hd..(t + 1) * heads * hd];
                assert!(
                    alone
                        .iter()
                        .zip(batch)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "shape {heads}/{kv_heads}x{hd}: token {t} alone differs from its batch"
                );
            }
        }
    }
}

/// `attention_batch` over sequences of different lengths and offsets (one of them in a
/// packed q8_0 or f16 cache) gives every sequence bit for bit what `attention` gives it alone.
#[allow(dead_code)]
pub fn attention_batch_matches_each() {
    use kiln_backend::KvType;
    for (heads, kv_heads, hd) in [(9, 3, 64), (4, 2, 16), (8, 2, 128)] {
        for threads in [1, 2] {
            let b = CpuBackend::new(threads);
            let (n_ctx, kv_dim, q_dim) = (48, kv_heads * hd, heads * hd);
            let mut seed = 0x9e3779b97f4a7c15_u64;
            // (pos0, new tokens, cache type)
            let seqs = [
                (5, 1, KvType::F32),
                (0, 4, KvType::F32),
                (17, 3, KvType::F32),
                (
                    9,
                    2,
                    if hd % 32 == 0 {
                        KvType::Q8_0
                    } else {
                        KvType::F16
                    },
                ),
                (30, 1, KvType::F32),
            ];
            let mut caches = Vec::new();
            for &(pos0, n, ty) in &seqs {
                let mut c = b.kv_cache_typed(2, n_ctx, kv_heads, hd, ty).unwrap();
                let total = pos0 + n;
                let keys: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed) * 2.0).collect();
                let vals: Vec<f32> = (0..total * kv_dim).map(|_| rnd(&mut seed)).collect();
                let k = b.tensor_from(total, kv_dim, &keys);
                let v = b.tensor_from(total, kv_dim, &vals);
                b.kv_store(&mut c, 1, &k, &v, 0, total);
                caches.push(c);
            }
            let rows: usize = seqs.iter().map(|s| s.1).sum();
            let qs: Vec<f32> = (0..rows * q_dim).map(|_| rnd(&mut seed) * 2.0).collect();
            let shape = |pos0, n_tokens| AttnShape {
                n_heads: heads,
                n_kv_heads: kv_heads,
                head_dim: hd,
                pos0,
                n_tokens,
                // One sequence with a sliding window (and the packed one, past it).
                window: match pos0 {
                    17 => 6,
                    9 => 4,
                    _ => 0,
                },
            };
            let q = b.tensor_from(rows, q_dim, &qs);
            let mut out = b.tensor(rows, q_dim);
            let it = seqs
                .iter()
                .zip(&caches)
                .map(|(&(pos0, n, _), c)| (c, shape(pos0, n)));
            b.attention_batch(&q, it, 1, &mut out);
            let mut got = vec![0f32; rows * q_dim];
            b.read(&out, rows, &mut got);
            let mut r0 = 0;
            for (&(pos0, n, ty), c) in seqs.iter().zip(&caches) {
                let qi = b.tensor_from(n, q_dim, &qs[r0 * q_dim..(r0 + n) * q_dim]);
                let mut oi = b.tensor(n, q_dim);
                b.attention(&qi, c, 1, shape(pos0, n), &mut oi);
                let mut want = vec![0f32; n * q_dim];
                b.read(&oi, n, &mut want);
                let g = &got[r0 * q_dim..(r0 + n) * q_dim];
                let same = g.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{heads}/{kv_heads}x{hd}, {threads} threads, sequence at pos {pos0} ({ty:?}): batched != alone"
                );
                r0 += n;
            }
        }
    }
}

/// A token's attention does not depend on the tokens computed with it: the last of a prompt
/// attended by decode (one token, after the rest) gives bit for bit what the whole prompt
/// gives it (tiles of several tokens), on f16 and f32 caches, grouped-query heads of 64, 128
/// and 256 values.
pub fn decode_equals_prefill_bits() {
    for (heads, kv_heads, hd, n) in [
        (16, 8, 128, 70),
        (8, 2, 64, 33),
        (4, 1, 256, 41),
        (6, 2, 128, 37),
    ] {
        for ty in [KvType::F16, KvType::F32] {
            let b = CpuBackend::new(2);
            let kv_dim = kv_heads * hd;
            let mut seed = 0x9e3779b97f4a7c15_u64;
            let keys: Vec<f32> = (0..n * kv_dim).map(|_| rnd(&mut seed) * 2.0).collect();
            let vals: Vec<f32> = (0..n * kv_dim).map(|_| rnd(&mut seed)).collect();
            let qs: Vec<f32> = (0..n * heads * hd).map(|_| rnd(&mut seed) * 2.0).collect();
            let mut cache = b.kv_cache_typed(1, n + 8, kv_heads, hd, ty).unwrap();
            let k = b.tensor_from(n, kv_dim, &keys);
            let v = b.tensor_from(n, kv_dim, &vals);
            b.kv_store(&mut cache, 0, &k, &v, 0, n);
            let shape = |pos0: usize, n_tokens: usize| AttnShape {
                n_heads: heads,
                n_kv_heads: kv_heads,
                head_dim: hd,
                pos0,
                n_tokens,
                window: 0,
            };
            let qd = heads * hd;
            let q = b.tensor_from(n, qd, &qs);
            let mut all = b.tensor(n, qd);
            b.attention(&q, &cache, 0, shape(0, n), &mut all);
            let q1 = b.tensor_from(1, qd, &qs[(n - 1) * qd..]);
            let mut one = b.tensor(1, qd);
            b.attention(&q1, &cache, 0, shape(n - 1, 1), &mut one);
            let (mut va, mut v1) = (vec![0f32; n * qd], vec![0f32; qd]);
            b.read(&all, n, &mut va);
            b.read(&one, 1, &mut v1);
            let last = &va[(n - 1) * qd..];
            let differ = last
                .iter()
                .zip(&v1)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "heads {heads}/{kv_heads} hd {hd} {ty:?}: {differ} of {qd} values of the last token differ between the prompt and decode"
            );
        }
    }
}
