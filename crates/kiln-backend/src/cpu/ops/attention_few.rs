//! Dense attention for a few queries over many keys (the decoder's cross-attention over 1500
//! audio positions) in AVX-512, for head sizes of 64 or 128: a work item is one (query, head);
//! its query sits in registers, four keys are scored at once (independent sums), and the
//! key and value rows are prefetched a few positions ahead (each row is a strided 256-512 B
//! piece of the (n_kv, heads·hd) tensors, which the hardware prefetcher follows poorly).
//! Same results as the portable path up to f32 summation order.

use std::arch::x86_64::*;

use crate::cpu::par::SharedMut;
use crate::cpu::CpuTensor;
use crate::DenseAttnShape;

/// Positions ahead of the one computed whose rows are prefetched.
const AHEAD: usize = 8;

pub fn handles(s: &DenseAttnShape) -> bool {
    crate::cpu::kernels::avx512_allowed() && matches!(s.head_dim, 64 | 128)
}

/// Items i0..i1 (item = t · heads + h).
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
    let (hd, d) = (s.head_dim, s.heads * s.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    for i in i0..i1 {
        let (t, h) = (i / s.heads, i % s.heads);
        let len = if s.causal {
            (t + 1 + s.n_kv.saturating_sub(s.n_q)).min(s.n_kv)
        } else {
            s.n_kv
        };
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
