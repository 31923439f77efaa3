//! Multi-head attention without a cache, for encoders and cross-attention:
//! q (n_q, heads·hd), k and v (n_kv, heads·hd) -> out (n_q, heads·hd),
//! out[t, h] = softmax(q[t, h] · k[·, h]ᵀ / √hd) · v[·, h], over every key (non-causal) or
//! over keys 0..=t + n_kv − n_q (causal, the queries being the last n_q positions).
//!
//! A few queries (decoder cross-attention): work items are (query, head). From 8 queries on
//! (encoders): work items are heads, each two block products (`gemm::gemm_nn`) by chunks of
//! queries. Scores live in per-thread scratch.

use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::DenseAttnShape as DenseShape;

pub fn attention_dense(
    pool: &Pool,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseShape,
    out: &mut CpuTensor,
) {
    let d = s.heads * s.head_dim;
    assert!(q.cols == d && k.cols == d && v.cols == d && out.cols == d);
    assert!(k.data.len() >= s.n_kv * d && v.data.len() >= s.n_kv * d);
    let dst = SharedMut(out.data.as_mut_ptr());
    if super::attention_amx::applies(&s) {
        return super::attention_amx::attention(pool, q, k, v, s, dst);
    }
    let simd = super::gemm::simd_ok();
    if s.n_q >= BLOCKED_MIN_QUERIES {
        return blocked(pool, q, k, v, s, dst, simd);
    }
    #[cfg(target_arch = "x86_64")]
    if super::attention_few::handles(&s) {
        return pool.run(super::attention_few::count(&s), |i0, i1| {
            SCRATCH.with(|cell| {
                let mut guard = cell.borrow_mut();
                let scores: &mut Vec<f32> = &mut guard;
                let want = scores.len().max(super::attention_few::scores_len(&s));
                scores.resize(want, 0.0);
                super::attention_few::items(q, k, v, s, dst, i0, i1, scores)
            })
        });
    }
    pool.run(s.n_q * s.heads, |i0, i1| {
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let scores: &mut Vec<f32> = &mut guard;
            let want = scores.len().max(s.n_kv);
            scores.resize(want, 0.0);
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX2 and FMA were detected on this CPU.
                return unsafe { items_avx2(q, k, v, s, dst, i0, i1, scores) };
            }
            let _ = simd;
            items(q, k, v, s, dst, i0, i1, scores)
        })
    });
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = Default::default();
    /// Blocked path: one head's keys transposed (hd, n_kv), and a chunk's scores and outputs.
    static BLOCK_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = Default::default();
}

/// From this many queries, attention runs as two block products per head (encoders).
const BLOCKED_MIN_QUERIES: usize = 8;
/// Queries per score block: QUERY_CHUNK x n_kv scores stay in L2.
const QUERY_CHUNK: usize = 48;

/// Per head: S = Q_h K_hᵀ / √hd by blocks of queries, softmax by rows, O_h = S V_h, both
/// products by the register-blocked kernel (V_h transposed once per head). Work items are
/// heads, so each writes its own columns of out.
fn blocked(
    pool: &Pool,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseShape,
    dst: SharedMut,
    simd: bool,
) {
    let n_kv = s.n_kv;
    pool.run(s.heads, |h0, h1| {
        BLOCK_SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let (kt, sc) = &mut *guard;
            kt.resize(s.head_dim * n_kv, 0.0);
            sc.resize(QUERY_CHUNK * (n_kv + s.head_dim), 0.0);
            let job = Heads { q, k, v, s, dst };
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX2 and FMA were detected on this CPU. (The feature boundary is
                // this call: closures do not inherit target features.)
                return unsafe { heads_avx2(&job, h0, h1, kt, sc) };
            }
            // Elsewhere `gemm_nn` takes the flag to its own vector kernels (NEON).
            heads(&job, h0, h1, kt, sc, simd)
        })
    });
}

struct Heads<'a> {
    q: &'a CpuTensor,
    k: &'a CpuTensor,
    v: &'a CpuTensor,
    s: DenseShape,
    dst: SharedMut,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads_avx2(job: &Heads, h0: usize, h1: usize, kt: &mut [f32], sc: &mut [f32]) {
    heads(job, h0, h1, kt, sc, true)
}

/// Heads h0..h1, all queries. `kt` holds one head's keys transposed (hd, n_kv); `sc` a chunk's
/// scores (QUERY_CHUNK, n_kv) followed by its outputs (QUERY_CHUNK, hd).
#[inline(always)]
fn heads(job: &Heads, h0: usize, h1: usize, kt: &mut [f32], sc: &mut [f32], simd: bool) {
    let Heads { q, k, v, s, dst } = *job;
    let (hd, d, n_kv) = (s.head_dim, s.heads * s.head_dim, s.n_kv);
    let scale = 1.0 / (hd as f32).sqrt();
    let shift = n_kv.saturating_sub(s.n_q);
    let (sc, o) = sc.split_at_mut(QUERY_CHUNK * n_kv);
    for h in h0..h1 {
        for p in 0..n_kv {
            let row = &k.data[p * d + h * hd..p * d + (h + 1) * hd];
            for (e, &x) in row.iter().enumerate() {
                kt[e * n_kv + p] = x;
            }
        }
        for c0 in (0..s.n_q).step_by(QUERY_CHUNK) {
            let qc = QUERY_CHUNK.min(s.n_q - c0);
            // Keys any query of this chunk may see.
            let used = if s.causal {
                (c0 + qc + shift).min(n_kv)
            } else {
                n_kv
            };
            // S = Q_h K_hᵀ (scaled inside the softmax)
            let qa = &q.data[c0 * d + h * hd..];
            super::gemm::gemm_nn(qa, d, qc, kt, n_kv, used, hd, sc, n_kv, simd);
            for i in 0..qc {
                let len = if s.causal {
                    (c0 + i + 1 + shift).min(n_kv)
                } else {
                    n_kv
                };
                let row = &mut sc[i * n_kv..i * n_kv + used];
                softmax8(&mut row[..len], scale);
                row[len..].fill(0.0);
            }
            // O_h = softmax(S) V_h
            let vb = &v.data[h * hd..];
            super::gemm::gemm_nn(sc, n_kv, qc, vb, d, hd, used, o, hd, simd);
            for i in 0..qc {
                for e in 0..hd {
                    // SAFETY: head h's columns of out are written by this item only.
                    unsafe { dst.write((c0 + i) * d + h * hd + e, o[i * hd + e]) }
                }
            }
        }
    }
}

/// In-place softmax of `x * scale` (scale > 0) whose max, exponentials and sum run 8 lanes
/// wide (independent accumulators, so the loops vectorize).
#[inline(always)]
pub(super) fn softmax8(x: &mut [f32], scale: f32) {
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = x.len() / 8 * 8;
    for c in x[..chunks].chunks_exact(8) {
        for l in 0..8 {
            m[l] = m[l].max(c[l]);
        }
    }
    let mut max = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &x[chunks..] {
        max = max.max(v);
    }
    for v in x.iter_mut() {
        *v = super::exp((*v - max) * scale);
    }
    let mut s = [0f32; 8];
    for c in x[..chunks].chunks_exact(8) {
        for l in 0..8 {
            s[l] += c[l];
        }
    }
    let mut sum: f32 = s.iter().sum();
    for &v in &x[chunks..] {
        sum += v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Keys query t sees: all of them, or with the causal mask those up to its position (the
/// queries being the last n_q positions).
#[inline(always)]
pub(super) fn keys_seen(s: &DenseShape, t: usize) -> usize {
    match s.causal {
        true => (t + 1 + s.n_kv.saturating_sub(s.n_q)).min(s.n_kv),
        false => s.n_kv,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn items_avx2(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseShape,
    dst: SharedMut,
    i0: usize,
    i1: usize,
    scores: &mut [f32],
) {
    items(q, k, v, s, dst, i0, i1, scores)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn items(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseShape,
    dst: SharedMut,
    i0: usize,
    i1: usize,
    scores: &mut [f32],
) {
    let (hd, d) = (s.head_dim, s.heads * s.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut acc = [0f32; 256];
    for i in i0..i1 {
        let (t, h) = (i / s.heads, i % s.heads);
        let len = keys_seen(&s, t);
        let qh = &q.data[t * d + h * hd..t * d + (h + 1) * hd];
        let sc = &mut scores[..len];
        for (p, sv) in sc.iter_mut().enumerate() {
            let kp = &k.data[p * d + h * hd..p * d + (h + 1) * hd];
            *sv = super::dot(qh, kp) * scale;
        }
        softmax8(sc, 1.0);
        let inv = 1.0;
        let o = &mut acc[..hd.min(256)];
        if hd <= 256 {
            o.fill(0.0);
            for (p, &w) in sc.iter().enumerate() {
                let vp = &v.data[p * d + h * hd..p * d + (h + 1) * hd];
                for (x, &y) in o.iter_mut().zip(vp) {
                    *x += w * y;
                }
            }
            let base = t * d + h * hd;
            for (e, &val) in o.iter().enumerate() {
                // SAFETY: head h of query t is written by this work item only.
                unsafe { dst.write(base + e, val * inv) };
            }
        } else {
            // Rare head sizes: accumulate straight into the output.
            let base = t * d + h * hd;
            for e in 0..hd {
                let mut a = 0f32;
                for (p, &w) in sc.iter().enumerate() {
                    a += w * v.data[p * d + h * hd + e];
                }
                // SAFETY: as above.
                unsafe { dst.write(base + e, a * inv) };
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// attention_few's AVX2 items equal the portable items bit for bit (few queries over
    /// many keys: one, three and five rows, causal and not, heads of 64 and 128, key counts
    /// off the eight-key steps), wherever AVX2 and FMA run.
    #[test]
    fn avx2_few_queries_equal_the_portable_items() {
        if !super::super::gemm::avx2_ok() {
            eprintln!("skipped: no AVX2 and FMA on this CPU");
            return;
        }
        let mut seed = 0x2468_ace1u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for (heads, hd, n_q, n_kv, causal) in [
            (6, 64, 1, 1500, false),
            (6, 64, 3, 1500, false),
            (6, 64, 5, 203, false),
            (4, 128, 2, 333, false),
            (4, 64, 5, 40, true),
            (2, 128, 3, 19, true),
        ] {
            let d = heads * hd;
            let mut t = |rows: usize| CpuTensor {
                data: (0..rows * d).map(|_| rnd()).collect(),
                cols: d,
            };
            let (q, k, v) = (t(n_q), t(n_kv), t(n_kv));
            let s = DenseShape {
                heads,
                head_dim: hd,
                n_q,
                n_kv,
                causal,
            };
            let mut want = vec![f32::NAN; n_q * d];
            let mut scores = vec![0f32; n_kv];
            items(
                &q,
                &k,
                &v,
                s,
                SharedMut(want.as_mut_ptr()),
                0,
                n_q * heads,
                &mut scores,
            );
            let mut got = vec![f32::NAN; n_q * d];
            let mut scores = vec![0f32; super::super::attention_few::scores_len(&s)];
            let n = super::super::attention_few::count(&s);
            // SAFETY: AVX2 and FMA were detected above.
            unsafe {
                super::super::attention_few::avx2::items(
                    &q,
                    &k,
                    &v,
                    s,
                    SharedMut(got.as_mut_ptr()),
                    0,
                    n,
                    &mut scores,
                )
            };
            let case = format!("heads={heads} hd={hd} n_q={n_q} n_kv={n_kv} causal={causal}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{case}: value {i}: {g} vs {w}");
            }
        }
    }
}
