//! Causal grouped-query attention over the KV cache.
//! q (n, heads*hd), cache per kv head (n_ctx, hd) -> out (n, heads*hd)
//!
//! Work items are (token, kv head): the query heads sharing a kv head run back to back over
//! the same keys and values (hot in cache). The cache stores each kv head's positions
//! contiguously, so every scan over positions is sequential.

use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::AttnShape;

/// `k`, `v`: one layer of the cache, laid out (kv_heads, n_ctx, hd).
pub fn attention(
    pool: &Pool,
    q: &CpuTensor,
    k: &[f32],
    v: &[f32],
    n_ctx: usize,
    s: AttnShape,
    out: &mut CpuTensor,
) {
    let seg = Seg {
        k,
        v,
        n_ctx,
        s,
        row0: 0,
    };
    attention_segs(pool, q, &[seg], out)
}

/// Sequences one batched call takes at most (callers split larger batches).
pub const MAX_SEGS: usize = 64;

/// One sequence of a batched attention: its layer of its cache (`k`, `v` laid out
/// (kv_heads, n_ctx, hd)), its shape, and where its tokens' rows start in q and out.
#[derive(Clone, Copy)]
pub struct SegOf<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub n_ctx: usize,
    pub s: AttnShape,
    pub row0: usize,
}

/// A sequence over an f32 cache.
pub type Seg<'a> = SegOf<'a, f32>;

/// Whether `attention_segs_f16` runs for head size `hd` on this CPU (AVX2 + F16C, a head size
/// the tiled kernel has).
pub fn f16_direct(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_ok().0 && std::is_x86_feature_detected!("f16c") && super::attention_tiled::handles(hd)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// `attention_segs` over f16 caches (values as their bit patterns) read as they are, the
/// tiled kernel widening each block of keys or values as it loads it: the sums of the
/// widened f32 cache, bit for bit, at half the memory traffic. False (nothing done) where
/// the tiled kernel does not run (no AVX2/F16C, or a head size it lacks).
pub fn attention_segs_f16(
    pool: &Pool,
    q: &CpuTensor,
    segs: &[SegOf<'_, u16>],
    out: &mut CpuTensor,
) -> bool {
    assert!(
        segs.len() <= MAX_SEGS,
        "at most {MAX_SEGS} sequences per call"
    );
    if !cfg!(target_arch = "x86_64") || !segs.iter().all(|g| f16_direct(g.s.head_dim)) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if !segs.is_empty() {
        super::attention_tiled::attention(pool, q, segs, out, simd_ok().1);
    }
    let _ = (pool, q, out);
    true
}

/// Attention of every sequence of `segs` (at most `MAX_SEGS`, disjoint rows): with the
/// tiled kernel one pool job for all of them; each query's arithmetic is the one it gets
/// alone.
pub fn attention_segs(pool: &Pool, q: &CpuTensor, segs: &[Seg<'_>], out: &mut CpuTensor) {
    assert!(
        segs.len() <= MAX_SEGS,
        "at most {MAX_SEGS} sequences per call"
    );
    if segs.is_empty() {
        return;
    }
    let (avx2, avx512) = simd_ok();
    #[cfg(target_arch = "x86_64")]
    if avx2
        && segs
            .iter()
            .all(|g| super::attention_tiled::handles(g.s.head_dim))
    {
        return super::attention_tiled::attention(pool, q, segs, out, avx512);
    }
    let _ = (avx2, avx512);
    let dst = SharedMut(out.data.as_mut_ptr());
    let out_cols = out.cols;
    for g in segs {
        let s = g.s;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        pool.run(s.n_tokens * s.n_kv_heads, |i0, i1| {
            let job = Items {
                q,
                k: g.k,
                v: g.v,
                n_ctx: g.n_ctx,
                s,
                row0: g.row0,
                dst,
                out_cols,
                scale,
            };
            // Per-thread scratch, kept between calls (no allocation per token): one head's
            // scores over every position, and its output.
            SCRATCH.with(|cell| {
                let mut guard = cell.borrow_mut();
                let (scores, acc) = &mut *guard;
                scores.resize(scores.len().max(s.pos0 + s.n_tokens), 0.0);
                acc.resize(acc.len().max(s.head_dim), 0.0);
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: AVX2 and FMA were detected on this CPU. (The feature boundary
                    // is this call: closures do not inherit target features.)
                    return unsafe { items_avx2(&job, i0, i1, scores, acc) };
                }
                items(&job, i0, i1, scores, acc)
            })
        });
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = Default::default();
}

struct Items<'a> {
    q: &'a CpuTensor,
    k: &'a [f32],
    v: &'a [f32],
    n_ctx: usize,
    s: AttnShape,
    /// The sequence's first row in q and out.
    row0: usize,
    dst: SharedMut,
    out_cols: usize,
    scale: f32,
}

/// (AVX2 + FMA, AVX-512F) usable, unless SIMD is disabled.
pub(crate) fn simd_ok() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = !crate::cpu::kernels::simd_disabled()
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma");
        return (avx2, avx2 && crate::cpu::kernels::avx512_allowed());
    }
    #[allow(unreachable_code)]
    (false, false)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn items_avx2(job: &Items, i0: usize, i1: usize, scores: &mut [f32], acc: &mut [f32]) {
    items(job, i0, i1, scores, acc)
}

/// The token of work slot `u` of `n`: 0, n-1, 1, n-2, ... so that any contiguous range of
/// slots (one thread's share) mixes short and long causal rows and costs about the same.
#[inline(always)]
pub(super) fn zigzag(u: usize, n: usize) -> usize {
    if u % 2 == 0 {
        u / 2
    } else {
        n - 1 - u / 2
    }
}

/// Work items i0..i1, each one (token, kv head).
#[inline(always)]
fn items(job: &Items, i0: usize, i1: usize, scores: &mut [f32], acc: &mut [f32]) {
    let Items {
        q,
        k,
        v,
        n_ctx,
        s,
        row0,
        dst,
        out_cols,
        scale,
    } = *job;
    let hd = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    for i in i0..i1 {
        let (t, kvh) = (zigzag(i / s.n_kv_heads, s.n_tokens), i % s.n_kv_heads);
        // Positions lo..len (a sliding window starts past 0).
        let (lo, len) = (s.first(t), s.pos0 + t + 1);
        let kh = &k[(kvh * n_ctx + lo) * hd..(kvh * n_ctx + len) * hd];
        let vh = &v[(kvh * n_ctx + lo) * hd..(kvh * n_ctx + len) * hd];
        for j in 0..group {
            let h = kvh * group + j;
            let qr = (row0 + t) * q.cols;
            let qh = &q.data[qr + h * hd..qr + (h + 1) * hd];
            let o = &mut acc[..hd];
            let sc = &mut scores[..len - lo];
            match hd {
                64 => head::<64>(qh, kh, vh, scale, sc, o),
                128 => head::<128>(qh, kh, vh, scale, sc, o),
                _ => head_any(qh, kh, vh, scale, sc, o),
            }
            let base = (row0 + t) * out_cols + h * hd;
            for (e, &val) in o.iter().enumerate() {
                // SAFETY: head h of token t is written by this work item only.
                unsafe { dst.write(base + e, val) };
            }
        }
    }
}

/// One query head over `len` cached positions, head size known at compile time so the
/// query and the output accumulator live in registers (the portable path; x86 with AVX2
/// takes `attention_tiled` for these sizes).
#[inline(always)]
fn head<const HD: usize>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    sc: &mut [f32],
    out: &mut [f32],
) {
    let q: &[f32; HD] = q.try_into().expect("head size");
    for (s, kp) in sc.iter_mut().zip(k.chunks_exact(HD)) {
        let kp: &[f32; HD] = kp.try_into().expect("head size");
        let mut acc = [0f32; 8];
        for c in 0..HD / 8 {
            for l in 0..8 {
                acc[l] += q[c * 8 + l] * kp[c * 8 + l];
            }
        }
        *s =
            ((acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7])) * scale;
    }
    softmax(sc);
    let mut o = [0f32; HD];
    for (&w, vp) in sc.iter().zip(v.chunks_exact(HD)) {
        let vp: &[f32; HD] = vp.try_into().expect("head size");
        for e in 0..HD {
            o[e] += w * vp[e];
        }
    }
    out.copy_from_slice(&o);
}

/// Any head size.
#[inline(always)]
fn head_any(q: &[f32], k: &[f32], v: &[f32], scale: f32, sc: &mut [f32], out: &mut [f32]) {
    let hd = q.len();
    for (s, kp) in sc.iter_mut().zip(k.chunks_exact(hd)) {
        *s = dot(q, kp) * scale;
    }
    softmax(sc);
    out.fill(0.0);
    for (&w, vp) in sc.iter().zip(v.chunks_exact(hd)) {
        for (x, &y) in out.iter_mut().zip(vp) {
            *x += w * y;
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    super::dot(a, b)
}

/// In-place softmax; every pass vectorizes (8 lanes for the max and the sum).
#[inline(always)]
pub(super) fn softmax(x: &mut [f32]) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    for v in x.iter_mut() {
        *v = super::exp(*v - max);
    }
    let mut s = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            s[l] += c[l];
        }
    }
    let sum = s.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let got = super::super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
    }
}
