//! Causal grouped-query attention over the KV cache.
//! q (n, heads*hd), k/v cache (n_ctx, kv_heads*hd) -> out (n, heads*hd)

use super::dot;
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::AttnShape;

pub fn attention(
    pool: &Pool,
    q: &CpuTensor,
    k: &[f32],
    v: &[f32],
    s: AttnShape,
    out: &mut CpuTensor,
) {
    let hd = s.head_dim;
    let kv_dim = s.n_kv_heads * hd;
    let group = s.n_heads / s.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let dst = SharedMut(out.data.as_mut_ptr());
    let out_cols = out.cols;
    // One work item per (token, head).
    pool.run(s.n_tokens * s.n_heads, |i0, i1| {
        let mut scores = vec![0f32; s.pos0 + s.n_tokens];
        let mut acc = vec![0f32; hd];
        for i in i0..i1 {
            let (t, h) = (i / s.n_heads, i % s.n_heads);
            let kvh = h / group;
            let qv = &q.data[t * q.cols + h * hd..t * q.cols + (h + 1) * hd];
            let len = s.pos0 + t + 1;
            let mut max = f32::NEG_INFINITY;
            for p in 0..len {
                let kp = &k[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
                let sc = dot(qv, kp) * scale;
                scores[p] = sc;
                max = max.max(sc);
            }
            let mut sum = 0f32;
            for sc in &mut scores[..len] {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            acc.fill(0.0);
            for p in 0..len {
                let w = scores[p] / sum;
                let vp = &v[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
                for (a, &x) in acc.iter_mut().zip(vp) {
                    *a += w * x;
                }
            }
            for (j, &a) in acc.iter().enumerate() {
                // SAFETY: (t, h) is this worker's alone; the index is inside out (n x heads*hd).
                unsafe { dst.write(t * out_cols + h * hd + j, a) };
            }
        }
    });
}
