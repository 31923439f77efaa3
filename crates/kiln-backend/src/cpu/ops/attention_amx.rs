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
    s.n_q >= MIN_LEN && s.n_kv >= MIN_LEN && amx::bf16_products()
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
    if bf16_vectors() {
        // SAFETY: AVX-512F, BF16 and VL were detected.
        return unsafe { softmax_bf16_512(x, scale, p) };
    }
    softmax_bf16_body(x, scale, p)
}

/// `softmax_bf16_body` with explicit vectors: the exp of `super::exp` 16 lanes wide and
/// the hardware's round-to-nearest-even bf16 conversion (the same bits as `amx::bf16`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
unsafe fn softmax_bf16_512(x: &[f32], scale: f32, p: &mut [u16]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len();
    assert!(p.len() >= n);
    unsafe {
        let xp = x.as_ptr();
        let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            };
            mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, k, xp.add(i)));
            i += 16;
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        let sv = _mm512_set1_ps(scale);
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            };
            let v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), max), sv);
            let e = exp512(v);
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(e));
            _mm256_mask_storeu_epi16(p.as_mut_ptr().add(i) as *mut i16, k, b);
            let back = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b)));
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, back));
            i += 16;
        }
        p[n..].fill(0);
        1.0 / _mm512_reduce_add_ps(sum)
    }
}

/// e^x, 16 lanes: `super::exp`'s range reduction and polynomial.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    const SHIFT: f32 = 12_582_912.0;
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let shift = _mm512_set1_ps(SHIFT);
    let t = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), shift);
    let n = _mm512_sub_ps(t, shift);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_slli_epi32::<23>(_mm512_sub_epi32(
        _mm512_castps_si512(t),
        _mm512_set1_epi32(SHIFT.to_bits() as i32),
    ));
    _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e))
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

#[cfg(target_arch = "x86_64")]
fn bf16_vectors() -> bool {
    crate::cpu::kernels::avx512_allowed()
        && std::is_x86_feature_detected!("avx512bf16")
        && std::is_x86_feature_detected!("avx512vl")
}
