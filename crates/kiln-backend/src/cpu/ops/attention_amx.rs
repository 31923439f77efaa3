//! Dense attention over many queries through AMX bf16 tiles (encoders): per head,
//! S = Q_h K_hᵀ for 32 queries at a time over every key, softmax by rows in f32, then
//! O_h = P V_h with P rounded to bf16 and each row scaled by 1 / Σ exp afterwards.
//! Work items are heads; one head's packed keys and values stay in L2 for all its queries.

use crate::cpu::kernels::amx::{self, PackedB, MB, NB};
use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;
use crate::DenseAttnShape;

/// From this many queries and keys the tiles pay for their packing.
pub const MIN_LEN: usize = 32;

#[derive(Default)]
struct Scratch {
    q: Vec<u16>,
    k: PackedB,
    v: PackedB,
    s: Vec<f32>,
    p: Vec<u16>,
    inv: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = Default::default();
}

pub fn applies(s: &DenseAttnShape) -> bool {
    s.n_q >= MIN_LEN && s.n_kv >= MIN_LEN && amx::available()
}

pub fn attention(
    pool: &Pool,
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseAttnShape,
    dst: SharedMut,
) {
    pool.run(s.heads, |h0, h1| {
        SCRATCH.with(|cell| {
            let sc = &mut *cell.borrow_mut();
            for h in h0..h1 {
                head(q, k, v, s, h, dst, sc);
            }
        })
    });
}

fn head(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    s: DenseAttnShape,
    h: usize,
    dst: SharedMut,
    sc: &mut Scratch,
) {
    let (hd, d, n_kv, n_q) = (s.head_dim, s.heads * s.head_dim, s.n_kv, s.n_q);
    let off = h * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let shift = n_kv.saturating_sub(n_q);
    // Kᵀ: B[e][key] = K[key][e]; V: B[key][e] = V[key][e].
    sc.k.pack(hd, n_kv, |key, e| k.data[key * d + off + e]);
    sc.v.pack(n_kv, hd, |e, key| v.data[key * d + off + e]);
    let kp = sc.k.kp;
    amx::to_bf16_rows(&q.data[off..], d, n_q, hd, kp, &mut sc.q);
    let ldk = sc.v.kp; // keys padded: P's row length
    let lds = sc.k.np; // keys padded to whole blocks: S's row length
    sc.s.resize(MB * lds, 0.0);
    sc.p.resize(MB * ldk, 0);
    sc.inv.resize(MB, 0.0);
    for i0 in (0..n_q).step_by(MB) {
        let m = (n_q - i0).min(MB);
        let qa = &sc.q[i0 * kp..];
        let sbuf = &mut sc.s;
        // SAFETY: applies() checked AMX.
        unsafe {
            amx::gemm(qa, m, &sc.k, |bi, j0, blk| {
                debug_assert_eq!(bi, 0);
                for i in 0..m {
                    sbuf[i * lds + j0..i * lds + j0 + NB]
                        .copy_from_slice(&blk[i * NB..(i + 1) * NB]);
                }
            })
        };
        for i in 0..m {
            let len = if s.causal {
                (i0 + i + 1 + shift).min(n_kv)
            } else {
                n_kv
            };
            let row = &mut sc.s[i * lds..i * lds + len];
            let prow = &mut sc.p[i * ldk..(i + 1) * ldk];
            sc.inv[i] = softmax_bf16(row, scale, prow);
        }
        let inv = &sc.inv;
        // SAFETY: AMX as above; head h's columns of out are written by this item only.
        unsafe {
            amx::gemm(&sc.p, m, &sc.v, |_, j0, blk| {
                let j1 = (j0 + NB).min(hd);
                for i in 0..m {
                    for j in j0..j1 {
                        dst.write((i0 + i) * d + off + j, blk[i * NB + j - j0] * inv[i]);
                    }
                }
            })
        };
    }
}

/// p[..x.len()] = bf16(exp((x - max) · scale)), zeros after; returns 1 / Σ of the rounded
/// values (so that P·V / Σ weighs exactly the values multiplied).
fn softmax_bf16(x: &[f32], scale: f32, p: &mut [u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::kernels::avx512_allowed() {
        // SAFETY: AVX-512F was detected.
        return unsafe { softmax_bf16_512(x, scale, p) };
    }
    softmax_bf16_body(x, scale, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_bf16_512(x: &[f32], scale: f32, p: &mut [u16]) -> f32 {
    softmax_bf16_body(x, scale, p)
}

#[inline(always)]
fn softmax_bf16_body(x: &[f32], scale: f32, p: &mut [u16]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = x.len() / 16 * 16;
    for c in x[..chunks].chunks_exact(16) {
        for l in 0..16 {
            m[l] = m[l].max(c[l]);
        }
    }
    let mut max = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &x[chunks..] {
        max = max.max(v);
    }
    let mut s = [0f32; 16];
    let (pc, pt) = p[..x.len()].split_at_mut(chunks);
    for (c, o) in x[..chunks].chunks_exact(16).zip(pc.chunks_exact_mut(16)) {
        for l in 0..16 {
            let b = amx::bf16(super::exp((c[l] - max) * scale));
            o[l] = b;
            s[l] += f32::from_bits((b as u32) << 16);
        }
    }
    let mut sum: f32 = s.iter().sum();
    for (&v, o) in x[chunks..].iter().zip(pt.iter_mut()) {
        let b = amx::bf16(super::exp((v - max) * scale));
        *o = b;
        sum += f32::from_bits((b as u32) << 16);
    }
    p[x.len()..].fill(0);
    1.0 / sum
}
