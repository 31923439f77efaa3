//! Unmasked multi-head self-attention over a short sequence (BERT-style encoders): the
//! reference (`self_attention`) and the heads split over threads, AVX-512 where the CPU has
//! it (`self_attention_par`).

use super::dot;
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

pub fn self_attention(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    heads: usize,
    hd: usize,
    len: usize,
    out: &mut CpuTensor,
) {
    let d = heads * hd;
    assert!(
        q.cols == d && k.cols == d && v.cols == d && out.cols == d,
        "self_attention shape"
    );
    let scale = 1.0 / (hd as f32).sqrt();
    let mut p = vec![0f32; len];
    for h in 0..heads {
        for i in 0..len {
            let qi = &q.data[i * d + h * hd..i * d + (h + 1) * hd];
            let mut m = f32::NEG_INFINITY;
            for (j, pj) in p.iter_mut().enumerate() {
                *pj = dot(qi, &k.data[j * d + h * hd..j * d + (h + 1) * hd]) * scale;
                m = m.max(*pj);
            }
            let mut sum = 0f32;
            for pj in p.iter_mut() {
                *pj = (*pj - m).exp();
                sum += *pj;
            }
            let o = &mut out.data[i * d + h * hd..i * d + (h + 1) * hd];
            o.fill(0.0);
            for (j, &pj) in p.iter().enumerate() {
                let w = pj / sum;
                for (ov, &vv) in o
                    .iter_mut()
                    .zip(&v.data[j * d + h * hd..j * d + (h + 1) * hd])
                {
                    *ov += w * vv;
                }
            }
        }
    }
}

/// `self_attention` with heads split over the pool's threads, softmax on `exp`.
#[allow(clippy::too_many_arguments)]
pub fn self_attention_par(
    pool: &Pool,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    heads: usize,
    hd: usize,
    len: usize,
    out: &mut CpuTensor,
) {
    let d = heads * hd;
    assert!(
        q.cols == d && k.cols == d && v.cols == d && out.cols == d,
        "self_attention shape"
    );
    assert!(
        q.data.len() >= len * d
            && k.data.len() >= len * d
            && v.data.len() >= len * d
            && out.data.len() >= len * d,
        "self_attention length"
    );
    let o = SharedMut(out.data.as_mut_ptr());
    pool.run(heads, |h0, h1| {
        let o = o;
        for h in h0..h1 {
            // SAFETY: columns h hd..(h + 1) hd of every row are this head's, inside out.
            unsafe { head(q, k, v, h, hd, d, len, o.0) };
        }
    });
}

widest!(
    /// One head of [`self_attention_par`].
    ///
    /// # Safety
    /// `out` holds len rows of d values whose columns h hd..(h + 1) hd no one else writes.
    unsafe fn head(
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        h: usize,
        hd: usize,
        d: usize,
        len: usize,
        out: *mut f32,
    ) = head_body
);

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn head_body(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    h: usize,
    hd: usize,
    d: usize,
    len: usize,
    out: *mut f32,
) {
    let scale = 1.0 / (hd as f32).sqrt();
    let mut p = vec![0f32; len];
    for i in 0..len {
        let qi = &q.data[i * d + h * hd..i * d + (h + 1) * hd];
        let mut m = f32::NEG_INFINITY;
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = dot(qi, &k.data[j * d + h * hd..j * d + (h + 1) * hd]) * scale;
            m = m.max(*pj);
        }
        let mut sum = 0f32;
        for pj in p.iter_mut() {
            *pj = super::exp(*pj - m);
            sum += *pj;
        }
        // SAFETY: row i, columns h hd..(h + 1) hd are this head's (caller).
        let o = unsafe { std::slice::from_raw_parts_mut(out.add(i * d + h * hd), hd) };
        o.fill(0.0);
        let inv = 1.0 / sum;
        for (j, &pj) in p.iter().enumerate() {
            let w = pj * inv;
            for (ov, &vv) in o
                .iter_mut()
                .zip(&v.data[j * d + h * hd..j * d + (h + 1) * hd])
            {
                *ov += w * vv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_over_threads_match_the_reference() {
        let (heads, hd, len) = (4, 16, 37);
        let d = heads * hd;
        let mut seed = 5u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                })
                .collect()
        };
        let t = |data: Vec<f32>| CpuTensor { data, cols: d };
        let (q, k, v) = (t(rnd(len * d)), t(rnd(len * d)), t(rnd(len * d)));
        let (mut want, mut got) = (t(vec![0.0; len * d]), t(vec![f32::NAN; len * d]));
        self_attention(&q, &k, &v, heads, hd, len, &mut want);
        self_attention_par(&Pool::new(2), &q, &k, &v, heads, hd, len, &mut got);
        for (i, (&a, &b)) in got.data.iter().zip(&want.data).enumerate() {
            assert!((a - b).abs() < 1e-5, "at {i}: {a} vs {b}");
        }
    }
}
