//! aarch64 integer kernels: baseline NEON (widening i8 multiplies, pairwise accumulation) and
//! NEON dotprod (SDOT). Every product is i8 x i8: the symmetric formats (Q4_0, Q5_0, Q6_K)
//! take their offset off the quants (q - 8, q - 16, q - 32 fit i8), so each block's integer
//! sum is exact as in the scalar reference; Q4_1 / Q5_1 keep unsigned quants and add their
//! minimums through the activation block sums. One body per format, generic over how 16 i8
//! pairs are summed into i32 lanes; blocks are taken four at a time so their four sums are
//! scaled as one vector.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{ActRow, BlockQ8, Kernels};

pub fn available() -> Vec<&'static Kernels> {
    let mut v: Vec<&'static Kernels> = Vec::new();
    if !std::arch::is_aarch64_feature_detected!("neon") {
        return v;
    }
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        v.push(&DOTPROD);
    }
    v.push(&NEON);
    v
}

static NEON: Kernels = Kernels {
    name: "neon",
    avx512: false,
    x8: None,
    // No decoded-tile prefill or four-row K-quant kernels on ARM yet: prefill unpacks per
    // token, K-quant rows run one at a time.
    tile4: None,
    q4_kx4: None,
    q6_kx4: None,
    q5_0: neon::q5_0,
    q5_1: neon::q5_1,
    q5_0x4: neon::q5_0x4,
    q5_1x4: neon::q5_1x4,
    q4_0x4: neon::q4_0x4,
    q4_1x4: neon::q4_1x4,
    q8_0x4: neon::q8_0x4,
    q4_0: neon::q4_0,
    q4_1: neon::q4_1,
    q8_0: neon::q8_0,
    q4_k: neon::q4_k,
    q5_k: neon::q5_k,
    q6_k: neon::q6_k,
};

static DOTPROD: Kernels = Kernels {
    name: "neon-dotprod",
    avx512: false,
    x8: Some(&super::neon_x8::DOTPROD),
    // No decoded-tile prefill or four-row K-quant kernels on ARM yet: prefill unpacks per
    // token, K-quant rows run one at a time.
    tile4: None,
    q4_kx4: None,
    q6_kx4: None,
    q5_0: dotprod::q5_0,
    q5_1: dotprod::q5_1,
    q5_0x4: dotprod::q5_0x4,
    q5_1x4: dotprod::q5_1x4,
    q4_0x4: dotprod::q4_0x4,
    q4_1x4: dotprod::q4_1x4,
    q8_0x4: dotprod::q8_0x4,
    q4_0: dotprod::q4_0,
    q4_1: dotprod::q4_1,
    q8_0: dotprod::q8_0,
    q4_k: dotprod::q4_k,
    q5_k: dotprod::q5_k,
    q6_k: dotprod::q6_k,
};

/// 16 i8 x i8 products added into 4 i32 lanes (only the sum of the lanes is meaningful).
trait MulSum {
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t;
}

struct Widen;
impl MulSum for Widen {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // i8 x i8 -> i16, two products per lane (|w| <= 128, |x| <= 127: the pair stays
        // below 2^15), then pairs of i16 added into i32.
        unsafe {
            let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
            vpadalq_s16(acc, vmlal_high_s8(p, w, x))
        }
    }
}

struct Sdot;
impl MulSum for Sdot {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SDOT by hand: `vdotq_s32` is not stable Rust yet. Callers enable "dotprod".
        let mut acc = acc;
        unsafe {
            asm!(
                "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
                inout(vreg) acc,
                in(vreg) w,
                in(vreg) x,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

/// The 32-value dot of one block: weights `w` against activations `x`, as 4 i32 lanes.
#[inline(always)]
unsafe fn dot32<M: MulSum>(w: [int8x16_t; 2], x: [int8x16_t; 2]) -> int32x4_t {
    unsafe { M::dot16(M::dot16(vdupq_n_s32(0), w[0], x[0]), w[1], x[1]) }
}

/// [sum d0, sum d1, sum d2, sum d3].
#[inline(always)]
unsafe fn reduce4(d: [int32x4_t; 4]) -> int32x4_t {
    unsafe { vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3])) }
}

/// 4 f16 at p -> 4 f32. FCVTL is base ARMv8 SIMD; its intrinsic needs a newer Rust than
/// the workspace's minimum.
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8) -> float32x4_t {
    unsafe {
        let h = vreinterpret_u16_u8(vld1_u8(p));
        let r: float32x4_t;
        asm!(
            "fcvtl {0:v}.4s, {1:v}.4h",
            out(vreg) r,
            in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
        r
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    unsafe {
        let h = u16::from_le_bytes([*p, *p.add(1)]);
        let r: f32;
        asm!(
            "fcvt {0:s}, {1:h}",
            out(vreg) r,
            in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
        r
    }
}

#[inline(always)]
unsafe fn load_x(b: &BlockQ8) -> [int8x16_t; 2] {
    unsafe {
        let p = b.qs.as_ptr();
        [vld1q_s8(p), vld1q_s8(p.add(16))]
    }
}

/// 16 bytes of nibbles -> 32 quants: low nibbles then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> [uint8x16_t; 2] {
    unsafe {
        let q = vld1q_u8(p);
        [vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q)]
    }
}

#[inline(always)]
unsafe fn s8(v: [uint8x16_t; 2]) -> [int8x16_t; 2] {
    unsafe { [vreinterpretq_s8_u8(v[0]), vreinterpretq_s8_u8(v[1])] }
}

/// Unsigned quants below 128 + k, less k, as i8.
#[inline(always)]
unsafe fn offset(v: [uint8x16_t; 2], k: i8) -> [int8x16_t; 2] {
    unsafe {
        let [a, b] = s8(v);
        [vsubq_s8(a, vdupq_n_s8(k)), vsubq_s8(b, vdupq_n_s8(k))]
    }
}

/// 4 block scales d_w * d_x from 4 packed f16 weight scales and 4 activation scales.
#[inline(always)]
unsafe fn scales4(wd: *const u8, xd: *const f32) -> float32x4_t {
    unsafe { vmulq_f32(f16x4(wd), vld1q_f32(xd)) }
}

/// Sum over blocks of d_w,i * d_x,i * dot_i for the packed 32-value formats: `quants(i)`
/// gives block i's weight quants.
#[inline(always)]
unsafe fn blocks32<M: MulSum>(
    nb: usize,
    wd: *const u8,
    a: ActRow,
    quants: impl Fn(usize) -> [int8x16_t; 2],
) -> f32 {
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        let mut i = 0;
        while i + 4 <= nb {
            let mut d = [vdupq_n_s32(0); 4];
            for (j, dj) in d.iter_mut().enumerate() {
                *dj = dot32::<M>(quants(i + j), load_x(a.blocks.get_unchecked(i + j)));
            }
            let s = scales4(wd.add(2 * i), a.d.as_ptr().add(i));
            acc = vfmaq_f32(acc, vcvtq_f32_s32(reduce4(d)), s);
            i += 4;
        }
        let mut tail = 0f32;
        while i < nb {
            let dot = vaddvq_s32(dot32::<M>(quants(i), load_x(a.blocks.get_unchecked(i))));
            tail += f16_at(wd.add(2 * i)) * a.d[i] * dot as f32;
            i += 1;
        }
        vaddvq_f32(acc) + tail
    }
}

/// Sum over blocks of f16 field_i * d_x,i * xsum_i (weight offsets and minimums).
#[inline(always)]
unsafe fn scaled_xsum(nb: usize, field: *const u8, a: ActRow) -> f32 {
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        let mut i = 0;
        while i + 4 <= nb {
            let s = scales4(field.add(2 * i), a.d.as_ptr().add(i));
            acc = vfmaq_f32(acc, s, vld1q_f32(a.sum.as_ptr().add(i)));
            i += 4;
        }
        let mut tail = 0f32;
        while i < nb {
            tail += f16_at(field.add(2 * i)) * a.d[i] * a.sum[i];
            i += 1;
        }
        vaddvq_f32(acc) + tail
    }
}

/// Like `blocks32` for four rows at once against the same activations (loaded once per
/// block): `quants(row, i)` gives row's block i quants.
#[inline(always)]
unsafe fn blocks32_x4<M: MulSum>(
    nb: usize,
    wd: [*const u8; 4],
    a: ActRow,
    quants: impl Fn(usize, usize) -> [int8x16_t; 2],
) -> [f32; 4] {
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 4 <= nb {
            let xd = a.d.as_ptr().add(i);
            let x = [
                load_x(a.blocks.get_unchecked(i)),
                load_x(a.blocks.get_unchecked(i + 1)),
                load_x(a.blocks.get_unchecked(i + 2)),
                load_x(a.blocks.get_unchecked(i + 3)),
            ];
            for r in 0..4 {
                let mut d = [vdupq_n_s32(0); 4];
                for (j, dj) in d.iter_mut().enumerate() {
                    *dj = dot32::<M>(quants(r, i + j), x[j]);
                }
                let s = scales4(wd[r].add(2 * i), xd);
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(reduce4(d)), s);
            }
            i += 4;
        }
        let mut tail = [0f32; 4];
        while i < nb {
            let x = load_x(a.blocks.get_unchecked(i));
            for r in 0..4 {
                let dot = vaddvq_s32(dot32::<M>(quants(r, i), x));
                tail[r] += f16_at(wd[r].add(2 * i)) * a.d[i] * dot as f32;
            }
            i += 1;
        }
        // Four horizontal sums at once: [sum acc0, sum acc1, sum acc2, sum acc3].
        let t = vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3]));
        let mut out = [0f32; 4];
        vst1q_f32(out.as_mut_ptr(), t);
        for r in 0..4 {
            out[r] += tail[r];
        }
        out
    }
}

#[inline(always)]
fn rows4(w: &[u8], rb: usize) -> [*const u8; 4] {
    assert!(w.len() >= 4 * rb);
    let p = w.as_ptr();
    // SAFETY: w holds four rows of rb bytes (checked above).
    unsafe { [p, p.add(rb), p.add(2 * rb), p.add(3 * rb)] }
}

#[inline(always)]
unsafe fn q4_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 18).min(a.blocks.len());
        let qs = w.as_ptr().add(2 * nb);
        blocks32::<M>(nb, w.as_ptr(), a, |i| offset(nibbles(qs.add(16 * i)), 8))
    }
}

#[inline(always)]
unsafe fn q4_1<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 20).min(a.blocks.len());
        let qs = w.as_ptr().add(4 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| s8(nibbles(qs.add(16 * i))));
        dot + scaled_xsum(nb, w.as_ptr().add(2 * nb), a)
    }
}

#[inline(always)]
unsafe fn q8_quants(p: *const u8) -> [int8x16_t; 2] {
    unsafe { [vld1q_s8(p as *const i8), vld1q_s8(p.add(16) as *const i8)] }
}

#[inline(always)]
unsafe fn q8_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 34).min(a.blocks.len());
        let qs = w.as_ptr().add(2 * nb);
        blocks32::<M>(nb, w.as_ptr(), a, |i| q8_quants(qs.add(32 * i)))
    }
}

#[inline(always)]
unsafe fn q4_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 18).min(a.blocks.len());
        let p = rows4(w, rb);
        *out = blocks32_x4::<M>(nb, p, a, |r, i| {
            offset(nibbles(p[r].add(2 * nb + 16 * i)), 8)
        });
    }
}

#[inline(always)]
unsafe fn q4_1x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 20).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i| s8(nibbles(p[r].add(4 * nb + 16 * i))));
        for r in 0..4 {
            out[r] = dots[r] + scaled_xsum(nb, p[r].add(2 * nb), a);
        }
    }
}

#[inline(always)]
unsafe fn q8_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 34).min(a.blocks.len());
        let p = rows4(w, rb);
        *out = blocks32_x4::<M>(nb, p, a, |r, i| q8_quants(p[r].add(2 * nb + 32 * i)));
    }
}

/// The 5-bit quants of a packed Q5 block body (qh u32, qs[16]): nibbles, with bit j of qh
/// as 0x10 in quant j.
#[inline(always)]
unsafe fn q5_quants(p: *const u8) -> [uint8x16_t; 2] {
    unsafe {
        let [lo, hi] = nibbles(p.add(4));
        // Quant j tests bit j % 8 of qh byte j / 8.
        let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let h0 = vcombine_u8(vdup_n_u8(*p), vdup_n_u8(*p.add(1)));
        let h1 = vcombine_u8(vdup_n_u8(*p.add(2)), vdup_n_u8(*p.add(3)));
        let x10 = vdupq_n_u8(0x10);
        [
            vorrq_u8(lo, vandq_u8(vtstq_u8(h0, bits), x10)),
            vorrq_u8(hi, vandq_u8(vtstq_u8(h1, bits), x10)),
        ]
    }
}

#[inline(always)]
unsafe fn q5_0<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 22).min(a.blocks.len());
        let body = w.as_ptr().add(2 * nb);
        blocks32::<M>(nb, w.as_ptr(), a, |i| {
            offset(q5_quants(body.add(20 * i)), 16)
        })
    }
}

#[inline(always)]
unsafe fn q5_1<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let nb = (w.len() / 24).min(a.blocks.len());
        let body = w.as_ptr().add(4 * nb);
        let dot = blocks32::<M>(nb, w.as_ptr(), a, |i| s8(q5_quants(body.add(20 * i))));
        dot + scaled_xsum(nb, w.as_ptr().add(2 * nb), a)
    }
}

#[inline(always)]
unsafe fn q5_0x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 22).min(a.blocks.len());
        let p = rows4(w, rb);
        *out = blocks32_x4::<M>(nb, p, a, |r, i| {
            offset(q5_quants(p[r].add(2 * nb + 20 * i)), 16)
        });
    }
}

#[inline(always)]
unsafe fn q5_1x4<M: MulSum>(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
    unsafe {
        let nb = (rb / 24).min(a.blocks.len());
        let p = rows4(w, rb);
        let dots = blocks32_x4::<M>(nb, p, a, |r, i| s8(q5_quants(p[r].add(4 * nb + 20 * i))));
        for r in 0..4 {
            out[r] = dots[r] + scaled_xsum(nb, p[r].add(2 * nb), a);
        }
    }
}

/// 8 u8 -> two vectors of 4 f32.
#[inline(always)]
unsafe fn u8x8_to_f32(v: &[u8; 8]) -> [float32x4_t; 2] {
    unsafe {
        let w = vmovl_u8(vld1_u8(v.as_ptr()));
        [
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))),
            vcvtq_f32_u32(vmovl_high_u16(w)),
        ]
    }
}

/// Q4_K and Q5_K: super-blocks of `bytes` bytes holding d, dmin and 12 bytes of scales and
/// mins, then quants; `quants(p, j)` gives sub-blocks 2j and 2j+1 of the super-block at p.
/// value = d * sc * q - dmin * m.
#[inline(always)]
unsafe fn k4<M: MulSum>(
    w: &[u8],
    a: ActRow,
    bytes: usize,
    quants: impl Fn(*const u8, usize) -> [[int8x16_t; 2]; 2],
) -> f32 {
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        let mut mins = vdupq_n_f32(0.0);
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(w.len() / bytes) {
            let p = w.as_ptr().add(i * bytes);
            let mut dots = [vdupq_n_s32(0); 8];
            for j in 0..4 {
                let [lo, hi] = quants(p, j);
                dots[2 * j] = dot32::<M>(lo, load_x(&x[2 * j]));
                dots[2 * j + 1] = dot32::<M>(hi, load_x(&x[2 * j + 1]));
            }
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            let s12 = std::slice::from_raw_parts(p.add(4), 12);
            for j in 0..8 {
                (sc[j], m[j]) = super::scalar::scale_min_k4(j, s12);
            }
            let (sc, m) = (u8x8_to_f32(&sc), u8x8_to_f32(&m));
            let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
            for h in 0..2 {
                // Sub-blocks 4h..4h+4: d * sc * d_x and dmin * m * d_x.
                let xd = vld1q_f32(a.d.as_ptr().add(8 * i + 4 * h));
                let dot = vcvtq_f32_s32(reduce4([
                    dots[4 * h],
                    dots[4 * h + 1],
                    dots[4 * h + 2],
                    dots[4 * h + 3],
                ]));
                acc = vfmaq_f32(acc, dot, vmulq_f32(vmulq_n_f32(sc[h], d), xd));
                let xs = vld1q_f32(a.sum.as_ptr().add(8 * i + 4 * h));
                mins = vfmaq_f32(mins, xs, vmulq_f32(vmulq_n_f32(m[h], dmin), xd));
            }
        }
        vaddvq_f32(acc) - vaddvq_f32(mins)
    }
}

/// Q4_K (144 B / 256): bytes 32j..32j+32 of qs hold sub-block 2j (low nibbles) and 2j+1
/// (high nibbles).
#[inline(always)]
unsafe fn q4_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        k4::<M>(w, a, 144, |p, j| {
            let q = p.add(16 + 32 * j);
            let m4 = vdupq_n_u8(0x0F);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            [
                s8([vandq_u8(q0, m4), vandq_u8(q1, m4)]),
                s8([vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1)]),
            ]
        })
    }
}

/// Q5_K (176 B / 256): like Q4_K with qh[32] before qs; sub-block s takes bit s of qh[l].
#[inline(always)]
unsafe fn q5_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        k4::<M>(w, a, 176, |p, j| {
            let q = p.add(48 + 32 * j);
            let m4 = vdupq_n_u8(0x0F);
            let x10 = vdupq_n_u8(0x10);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            let (h0, h1) = (vld1q_u8(p.add(16)), vld1q_u8(p.add(32)));
            // Bit s of qh moved to bit 4 (a negative shift shifts right).
            let (s0, s1) = (vdupq_n_s8(4 - 2 * j as i8), vdupq_n_s8(3 - 2 * j as i8));
            let hb = |h: uint8x16_t, s: int8x16_t| vandq_u8(vshlq_u8(h, s), x10);
            [
                s8([
                    vorrq_u8(vandq_u8(q0, m4), hb(h0, s0)),
                    vorrq_u8(vandq_u8(q1, m4), hb(h1, s0)),
                ]),
                s8([
                    vorrq_u8(vshrq_n_u8::<4>(q0), hb(h0, s1)),
                    vorrq_u8(vshrq_n_u8::<4>(q1), hb(h1, s1)),
                ]),
            ]
        })
    }
}

/// Q6_K (210 B / 256): ql[128], qh[64], scales[16] i8, d f16; 16 groups of 16:
/// value = d * sc * (q - 32). The offset is taken off the quants (q - 32 fits i8), so no
/// activation sums are needed.
#[inline(always)]
unsafe fn q6_k<M: MulSum>(w: &[u8], a: ActRow) -> f32 {
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        let x30 = vdupq_n_u8(0x30);
        let off = vdupq_n_s8(32);
        let mut acc = vdupq_n_f32(0.0);
        for (i, x) in a.blocks.chunks_exact(8).enumerate().take(w.len() / 210) {
            let p = w.as_ptr().add(i * 210);
            let d = f16_at(p.add(208));
            for n in 0..2 {
                let ql = p.add(64 * n);
                let qh = p.add(128 + 32 * n);
                let ql0 = [vld1q_u8(ql), vld1q_u8(ql.add(16))];
                let ql1 = [vld1q_u8(ql.add(32)), vld1q_u8(ql.add(48))];
                let qh = [vld1q_u8(qh), vld1q_u8(qh.add(16))];
                // The dot of each group of 16, at index 2k + h (k: activation block 4n + k).
                let mut dots = [vdupq_n_s32(0); 8];
                for k in 0..4 {
                    let xb = load_x(&x[4 * n + k]);
                    // Bits 2k, 2k+1 of qh moved to bits 4, 5.
                    let shift = vdupq_n_s8(4 - 2 * k as i8);
                    for h in 0..2 {
                        let low = if k % 2 == 0 { ql0[h] } else { ql1[h] };
                        let low = if k < 2 {
                            vandq_u8(low, m4)
                        } else {
                            vshrq_n_u8::<4>(low)
                        };
                        let q = vorrq_u8(low, vandq_u8(vshlq_u8(qh[h], shift), x30));
                        let q = vsubq_s8(vreinterpretq_s8_u8(q), off);
                        dots[2 * k + h] = M::dot16(vdupq_n_s32(0), q, xb[h]);
                    }
                }
                // Times the group scales (in the same 2k + h order), then d * d_x per block.
                let sc = vmovl_s8(vld1_s8(p.add(192 + 8 * n) as *const i8));
                let xd = vmulq_n_f32(vld1q_f32(a.d.as_ptr().add(8 * i + 4 * n)), d);
                let i0 = vmulq_s32(
                    reduce4([dots[0], dots[1], dots[2], dots[3]]),
                    vmovl_s16(vget_low_s16(sc)),
                );
                let i1 = vmulq_s32(
                    reduce4([dots[4], dots[5], dots[6], dots[7]]),
                    vmovl_high_s16(sc),
                );
                acc = vfmaq_f32(acc, vcvtq_f32_s32(i0), vzip1q_f32(xd, xd));
                acc = vfmaq_f32(acc, vcvtq_f32_s32(i1), vzip2q_f32(xd, xd));
            }
        }
        vaddvq_f32(acc)
    }
}

macro_rules! instantiate {
    ($module:ident, $features:literal, $mul:ty) => {
        mod $module {
            use super::*;
            #[target_feature(enable = $features)]
            pub unsafe fn q4_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_1(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_1::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q8_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q8_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q4_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_1x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q4_1x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q8_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q8_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_0(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_0::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_1(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_1::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_0x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q5_0x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_1x4(w: &[u8], rb: usize, a: ActRow, out: &mut [f32; 4]) {
                unsafe { super::q5_1x4::<$mul>(w, rb, a, out) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q4_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q4_k::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q5_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q5_k::<$mul>(w, a) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn q6_k(w: &[u8], a: ActRow) -> f32 {
                unsafe { super::q6_k::<$mul>(w, a) }
            }
        }
    };
}

instantiate!(neon, "neon", Widen);
instantiate!(dotprod, "neon,dotprod", Sdot);
