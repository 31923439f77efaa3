//! Dense attention for a few queries over many keys (the decoder's cross-attention over 1500
//! audio positions) in AVX-512 (or AVX2, [`avx2`]), for head sizes of 64 or 128: a work item is one (query, head);
//! its query sits in registers, four keys are scored at once (independent sums), and the
//! key and value rows are prefetched a few positions ahead (each row is a strided 256-512 B
//! piece of the (n_kv, heads·hd) tensors, which the hardware prefetcher follows poorly).
//! Same results as the portable path up to f32 summation order.
//!
//! Without a causal mask (cross-attention), the queries of several rows (a beam search's
//! hypotheses over one window) run together: a work item is one head and up to [`group`]
//! queries, so each key and value row is read once for all of them instead of once each.

use std::arch::x86_64::*;

use crate::cpu::par::SharedMut;
use crate::cpu::CpuTensor;
use crate::DenseAttnShape;

/// Positions ahead of the one computed whose rows are prefetched.
const AHEAD: usize = 8;

pub fn handles(s: &DenseAttnShape) -> bool {
    matches!(s.head_dim, 64 | 128)
        && (crate::cpu::kernels::avx512_allowed() || super::gemm::avx2_ok())
}

/// Queries a work item takes (registers: the queries and their outputs).
pub fn group(s: &DenseAttnShape) -> usize {
    match (s.causal, s.head_dim) {
        (true, _) => 1,
        (false, 64) => 4,
        _ => 2,
    }
}

/// Work items of the shape: (query group, head) pairs.
pub fn count(s: &DenseAttnShape) -> usize {
    s.n_q.div_ceil(group(s)) * s.heads
}

/// Score rows a work item needs (`group` of `n_kv`).
pub fn scores_len(s: &DenseAttnShape) -> usize {
    group(s) * s.n_kv
}

/// Items i0..i1 (item = g · heads + h: queries g·group.. of head h).
#[allow(clippy::too_many_arguments)]
pub fn items(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseAttnShape,
    dst: SharedMut,
    i0: usize,
    i1: usize,
    scores: &mut [f32],
) {
    if !crate::cpu::kernels::avx512_allowed() {
        // SAFETY: AVX2 and FMA were detected (handles()).
        return unsafe { avx2::items(q, k, v, s, dst, i0, i1, scores) };
    }
    let (hd, d) = (s.head_dim, s.heads * s.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    let g = group(&s);
    if g > 1 {
        let n = s.n_kv;
        assert!(k.data.len() >= n * d && v.data.len() >= n * d && scores.len() >= g * n);
        for i in i0..i1 {
            let (t0, h) = (i / s.heads * g, i % s.heads);
            let nq = (s.n_q - t0).min(g);
            // SAFETY: AVX-512F was detected (handles()); rows p < n_kv of k and v hold d
            // values (asserted), head h's hd of them start at h·hd; rows t0..t0+nq of q
            // and out exist (n_q rows), head h of them is this item's.
            unsafe {
                let qp = q.data.as_ptr().add(t0 * d + h * hd);
                let (kp, vp) = (k.data.as_ptr().add(h * hd), v.data.as_ptr().add(h * hd));
                let out = dst.0.add(t0 * d + h * hd);
                match (hd, nq) {
                    (64, 4) => grouped::<4, 4>(qp, kp, vp, d, n, scale, scores, out),
                    (64, 3) => grouped::<4, 3>(qp, kp, vp, d, n, scale, scores, out),
                    (64, 2) => grouped::<4, 2>(qp, kp, vp, d, n, scale, scores, out),
                    (64, _) => grouped::<4, 1>(qp, kp, vp, d, n, scale, scores, out),
                    (_, 2) => grouped::<8, 2>(qp, kp, vp, d, n, scale, scores, out),
                    _ => grouped::<8, 1>(qp, kp, vp, d, n, scale, scores, out),
                }
            }
        }
        return;
    }
    for i in i0..i1 {
        let (t, h) = (i / s.heads, i % s.heads);
        let len = super::attention_dense::keys_seen(&s, t);
        assert!(k.data.len() >= len * d && v.data.len() >= len * d && scores.len() >= len);
        let qh = &q.data[t * d + h * hd..t * d + (h + 1) * hd];
        // SAFETY: AVX-512F was detected (handles()); rows p < len of k and v hold d values
        // (asserted), head h's hd of them start at h·hd; out row t, head h is this item's.
        unsafe {
            let (kp, vp) = (k.data.as_ptr().add(h * hd), v.data.as_ptr().add(h * hd));
            let out = dst.0.add(t * d + h * hd);
            match hd {
                64 => item::<4>(qh.as_ptr(), kp, vp, d, len, scale, scores, out),
                _ => item::<8>(qh.as_ptr(), kp, vp, d, len, scale, scores, out),
            }
        }
    }
}

#[inline(always)]
unsafe fn prefetch_row<const HV: usize>(p: *const f32) {
    for i in 0..HV {
        // SAFETY: prefetching has no effect on program state, in bounds or not.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * i) as *const i8) };
    }
}

/// One (query, head): HV vectors of 16 per head row.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn item<const HV: usize>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    d: usize,
    len: usize,
    scale: f32,
    scores: &mut [f32],
    out: *mut f32,
) {
    unsafe {
        let sv = _mm512_set1_ps(scale);
        let qv: [__m512; HV] =
            std::array::from_fn(|i| _mm512_mul_ps(_mm512_loadu_ps(q.add(16 * i)), sv));
        let mut p = 0;
        while p + 4 <= len {
            for r in 0..4 {
                prefetch_row::<HV>(k.wrapping_add((p + r + AHEAD) * d));
            }
            let mut acc = [_mm512_setzero_ps(); 4];
            for (r, a) in acc.iter_mut().enumerate() {
                let row = k.add((p + r) * d);
                for (i, &qi) in qv.iter().enumerate() {
                    *a = _mm512_fmadd_ps(qi, _mm512_loadu_ps(row.add(16 * i)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                scores[p + r] = _mm512_reduce_add_ps(*a);
            }
            p += 4;
        }
        while p < len {
            let row = k.add(p * d);
            let mut a = _mm512_setzero_ps();
            for (i, &qi) in qv.iter().enumerate() {
                a = _mm512_fmadd_ps(qi, _mm512_loadu_ps(row.add(16 * i)), a);
            }
            scores[p] = _mm512_reduce_add_ps(a);
            p += 1;
        }
        let sc = &mut scores[..len];
        super::attention_dense::softmax8(sc, 1.0);
        let mut o = [_mm512_setzero_ps(); HV];
        for (p, &w) in sc.iter().enumerate() {
            prefetch_row::<HV>(v.wrapping_add((p + AHEAD) * d));
            let wv = _mm512_set1_ps(w);
            let row = v.add(p * d);
            for (i, oi) in o.iter_mut().enumerate() {
                *oi = _mm512_fmadd_ps(wv, _mm512_loadu_ps(row.add(16 * i)), *oi);
            }
        }
        for (i, oi) in o.iter().enumerate() {
            _mm512_storeu_ps(out.add(16 * i), *oi);
        }
    }
}

/// NQ queries (rows `d` apart from `q`) of one head over every key (no mask): per key row
/// one load of its HV vectors for all the queries' scores, then per value row one load for
/// all their outputs. `scores` holds NQ rows of `len`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn grouped<const HV: usize, const NQ: usize>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    d: usize,
    len: usize,
    scale: f32,
    scores: &mut [f32],
    out: *mut f32,
) {
    // SAFETY: the caller bounds q and out (NQ rows), k and v (len rows) and scores.
    unsafe {
        let sv = _mm512_set1_ps(scale);
        let qv: [[__m512; HV]; NQ] = std::array::from_fn(|j| {
            std::array::from_fn(|i| _mm512_mul_ps(_mm512_loadu_ps(q.add(j * d + 16 * i)), sv))
        });
        // Sixteen keys at a time: their rows stay in L1 for every query, and the sixteen
        // sums reduce together into one vector of scores.
        let mut p = 0;
        while p + 16 <= len {
            for r in 0..16 {
                prefetch_row::<HV>(k.wrapping_add((p + r + 16) * d));
            }
            for (j, qj) in qv.iter().enumerate() {
                let acc: [__m512; 16] = std::array::from_fn(|r| {
                    let row = k.add((p + r) * d);
                    let mut a = _mm512_mul_ps(qj[0], _mm512_loadu_ps(row));
                    for i in 1..HV {
                        a = _mm512_fmadd_ps(qj[i], _mm512_loadu_ps(row.add(16 * i)), a);
                    }
                    a
                });
                _mm512_storeu_ps(scores.as_mut_ptr().add(j * len + p), sum16(&acc));
            }
            p += 16;
        }
        for p in p..len {
            let row = k.add(p * d);
            for (j, qj) in qv.iter().enumerate() {
                let mut a = _mm512_mul_ps(qj[0], _mm512_loadu_ps(row));
                for i in 1..HV {
                    a = _mm512_fmadd_ps(qj[i], _mm512_loadu_ps(row.add(16 * i)), a);
                }
                scores[j * len + p] = _mm512_reduce_add_ps(a);
            }
        }
        for j in 0..NQ {
            super::attention_dense::softmax8(&mut scores[j * len..(j + 1) * len], 1.0);
        }
        let mut o = [[_mm512_setzero_ps(); HV]; NQ];
        for p in 0..len {
            prefetch_row::<HV>(v.wrapping_add((p + AHEAD) * d));
            let row = v.add(p * d);
            let vr: [__m512; HV] = std::array::from_fn(|i| _mm512_loadu_ps(row.add(16 * i)));
            for (j, oj) in o.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(scores[j * len + p]);
                for (i, oi) in oj.iter_mut().enumerate() {
                    *oi = _mm512_fmadd_ps(wv, vr[i], *oi);
                }
            }
        }
        for (j, oj) in o.iter().enumerate() {
            for (i, oi) in oj.iter().enumerate() {
                _mm512_storeu_ps(out.add(j * d + 16 * i), *oi);
            }
        }
    }
}

/// Lane r of the result = the sum of a[r]'s sixteen lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn sum16(a: &[__m512; 16]) -> __m512 {
    // Pairs within 128-bit chunks, then the four rows of a chunk, then across chunks.
    let pair =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    let y: [__m512; 4] = std::array::from_fn(|g| {
        let b = 4 * g;
        let (x01, x23) = (pair(a[b], a[b + 1]), pair(a[b + 2], a[b + 3]));
        let lo = _mm512_castpd_ps(_mm512_unpacklo_pd(
            _mm512_castps_pd(x01),
            _mm512_castps_pd(x23),
        ));
        let hi = _mm512_castpd_ps(_mm512_unpackhi_pd(
            _mm512_castps_pd(x01),
            _mm512_castps_pd(x23),
        ));
        _mm512_add_ps(lo, hi)
    });
    let cross = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    cross(cross(y[0], y[1]), cross(y[2], y[3]))
}

/// The same work items on AVX2 and FMA (CPUs without AVX-512, where the portable path scored
/// one key at a time with a horizontal sum each and read the strided rows without prefetch).
/// Sixteen vector registers hold no whole query beside its sums, so the query is read from L1:
/// eight keys are scored at once (eight independent sums, reduced together into one vector of
/// scores), and the values are summed 64 dimensions at a time (eight accumulators), a query
/// after another. Key and value rows are prefetched ahead as on AVX-512. The arithmetic is the
/// portable path's (`attention_dense::items`) bit for bit: products rounded before each sum
/// (no fused multiply-add), a score's eight lanes summed as `ops::dot` sums them, the values'
/// weighted sums in key order. A greedy decode over silence can turn on the last bit of a score
/// (with the fused form, a window of 8 s of silence then speech decoded into a repetition at
/// temperature 0 and a fallback: 76 tokens for a 66 s file became 423), so transcripts stay as
/// they were.
pub(super) mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cpu::ops) unsafe fn items(
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        s: DenseAttnShape,
        dst: SharedMut,
        i0: usize,
        i1: usize,
        scores: &mut [f32],
    ) {
        let (hd, d) = (s.head_dim, s.heads * s.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let g = group(&s);
        for i in i0..i1 {
            let (t0, h) = (i / s.heads * g, i % s.heads);
            let nq = (s.n_q - t0).min(g);
            // A causal item holds one query (group 1).
            let len = super::super::attention_dense::keys_seen(&s, t0);
            assert!(k.data.len() >= len * d && v.data.len() >= len * d);
            assert!(scores.len() >= nq * len);
            // SAFETY: AVX2 and FMA were detected (caller); rows p < len of k and v hold d
            // values (asserted), head h's hd of them start at h·hd; rows t0..t0+nq of q and
            // out exist (n_q rows), head h of them is this item's.
            unsafe {
                let qp = q.data.as_ptr().add(t0 * d + h * hd);
                let (kp, vp) = (k.data.as_ptr().add(h * hd), v.data.as_ptr().add(h * hd));
                let out = dst.0.add(t0 * d + h * hd);
                let at = Head {
                    k: kp,
                    v: vp,
                    d,
                    len,
                    scale,
                };
                match hd {
                    64 => head::<8>(&at, qp, nq, scores, out),
                    _ => head::<16>(&at, qp, nq, scores, out),
                }
            }
        }
    }

    /// One head's keys and values: rows `d` apart, `len` of them.
    struct Head {
        k: *const f32,
        v: *const f32,
        d: usize,
        len: usize,
        scale: f32,
    }

    /// `n` 64-byte lines from `p` into L1.
    #[inline(always)]
    unsafe fn prefetch(p: *const f32, n: usize) {
        for i in 0..n {
            // SAFETY: prefetching has no effect on program state, in bounds or not.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * i) as *const i8) };
        }
    }

    /// `nq` queries (rows `d` apart from `q`) of a head of HV vectors of 8 over every key of
    /// `at` into `out` (rows `d` apart); `scores` holds `nq` rows of `at.len`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn head<const HV: usize>(
        at: &Head,
        q: *const f32,
        nq: usize,
        scores: &mut [f32],
        out: *mut f32,
    ) {
        let Head {
            k,
            v,
            d,
            len,
            scale,
        } = *at;
        // SAFETY: the caller bounds q and out (nq rows), k and v (len rows) and scores.
        unsafe {
            let sv = _mm256_set1_ps(scale);
            for j in 0..nq {
                let qj = q.add(j * d);
                let sc = &mut scores[j * len..(j + 1) * len];
                let mut p = 0;
                while p + 8 <= len {
                    if j == 0 {
                        for r in 16..24 {
                            prefetch(k.wrapping_add((p + r) * d), HV / 2);
                        }
                    }
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for i in 0..HV {
                        let qi = _mm256_loadu_ps(qj.add(8 * i));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let kv = _mm256_loadu_ps(k.add((p + r) * d + 8 * i));
                            *a = _mm256_add_ps(*a, _mm256_mul_ps(qi, kv));
                        }
                    }
                    _mm256_storeu_ps(sc.as_mut_ptr().add(p), _mm256_mul_ps(sum8(&acc), sv));
                    p += 8;
                }
                for (p, sp) in sc.iter_mut().enumerate().skip(p) {
                    let mut a = _mm256_setzero_ps();
                    for i in 0..HV {
                        let kv = _mm256_loadu_ps(k.add(p * d + 8 * i));
                        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qj.add(8 * i)), kv));
                    }
                    let a = sum8(&[a, a, a, a, a, a, a, a]);
                    *sp = _mm_cvtss_f32(_mm256_castps256_ps128(a)) * scale;
                }
                super::super::attention_dense::softmax8(sc, 1.0);
            }
            for c in 0..HV / 8 {
                for j in 0..nq {
                    let sc = &scores[j * len..(j + 1) * len];
                    let mut o = [_mm256_setzero_ps(); 8];
                    for (p, &w) in sc.iter().enumerate() {
                        if j == 0 {
                            prefetch(v.wrapping_add((p + AHEAD) * d + 64 * c), 4);
                        }
                        let wv = _mm256_set1_ps(w);
                        let row = v.add(p * d + 64 * c);
                        for (i, oi) in o.iter_mut().enumerate() {
                            *oi = _mm256_add_ps(
                                *oi,
                                _mm256_mul_ps(wv, _mm256_loadu_ps(row.add(8 * i))),
                            );
                        }
                    }
                    for (i, oi) in o.iter().enumerate() {
                        _mm256_storeu_ps(out.add(j * d + 64 * c + 8 * i), *oi);
                    }
                }
            }
        }
    }

    /// Lane r of the result = the sum of a[r]'s eight lanes l0..l7 in `ops::dot`'s order:
    /// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn sum8(a: &[__m256; 8]) -> __m256 {
        // Halves added: [a[r]'s l0+l4, l1+l5, l2+l6, l3+l7 | a[r+1]'s].
        let h: [__m256; 4] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(x, y),
                _mm256_permute2f128_ps::<0x31>(x, y),
            )
        });
        // Pairs: [a0's (l0+l4)+(l1+l5), (l2+l6)+(l3+l7), a2's both | a1's both, a3's both].
        let (p0, p1) = (_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
        // Lanes hold a0, a2, a4, a6, a1, a3, a5, a7: back in order.
        let s = _mm256_hadd_ps(p0, p1);
        _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}
