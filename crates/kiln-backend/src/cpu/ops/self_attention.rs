//! Unmasked multi-head self-attention over a short sequence (BERT-style encoders).

use super::dot;
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
