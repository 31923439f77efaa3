//! NEON dotprod kernels over the eight-row interleaved layouts (`x8`): a 32-byte chunk of a
//! group is two 128-bit vectors of 4 rows x 4 bytes, and the indexed SDOT multiplies each
//! row's 4 bytes by the same 4 activation bytes (a lane of the activation vector), so one
//! instruction advances 4 rows with no horizontal sums. Up to 4 tokens per call share the
//! unpacked quants; a token's arithmetic does not depend on how many share the call.
//!
//! SDOT is i8 x i8: nibbles, 5- and 6-bit quants are non-negative i8 as stored, Q8_0 quants
//! are turned back to i8 (so its kernel needs no offset).

use std::arch::aarch64::*;
use std::arch::asm;

use super::neon::f16x4;
use super::x8::{X8Kernels, ROWS};
use super::ActRow;

const MAX_T: usize = 4;

/// acc + per lane (row) the dot of w's 4 bytes with bytes 4L..4L+4 of x.
#[inline(always)]
unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: callers enable "dotprod"; registers only.
    unsafe {
        asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.4b[{l}]",
            inout(vreg) acc,
            in(vreg) w,
            in(vreg) x,
            l = const L,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `sdot_lane` with the lane chosen by a value (constant after unrolling).
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, w: int8x16_t, x: int8x16_t, lane: usize) -> int32x4_t {
    unsafe {
        match lane {
            0 => sdot_lane::<0>(acc, w, x),
            1 => sdot_lane::<1>(acc, w, x),
            2 => sdot_lane::<2>(acc, w, x),
            _ => sdot_lane::<3>(acc, w, x),
        }
    }
}

/// One 32-byte chunk at p: rows 0-3 and rows 4-7.
#[inline(always)]
unsafe fn load2(p: *const u8) -> [uint8x16_t; 2] {
    unsafe { [vld1q_u8(p), vld1q_u8(p.add(16))] }
}

/// The two activation vectors of block i: values 0..16 and 16..32.
#[inline(always)]
unsafe fn xv(a: &ActRow, i: usize) -> [int8x16_t; 2] {
    unsafe {
        let p = a.blocks.get_unchecked(i).qs.as_ptr();
        [vld1q_s8(p), vld1q_s8(p.add(16))]
    }
}

/// 8 f16 at p as two halves of 4 rows.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> [float32x4_t; 2] {
    unsafe { [f16x4(p), f16x4(p.add(8))] }
}

/// 8 u8 at p -> two halves of 4 f32.
#[inline(always)]
unsafe fn u8x8(p: *const u8) -> [float32x4_t; 2] {
    unsafe {
        let w = vmovl_u8(vld1_u8(p));
        [
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))),
            vcvtq_f32_u32(vmovl_u16(vget_high_u16(w))),
        ]
    }
}

/// 8 i8 at p -> two halves of 4 i32.
#[inline(always)]
unsafe fn i8x8(p: *const u8) -> [int32x4_t; 2] {
    unsafe {
        let w = vmovl_s8(vld1_s8(p as *const i8));
        [vmovl_s16(vget_low_s16(w)), vmovl_s16(vget_high_s16(w))]
    }
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    unsafe { vreinterpretq_s8_u8(v) }
}

/// Q4_0 (F = 0), Q4_1 (1), Q8_0 (2), Q5_0 (3), Q5_1 (4) over `nb` blocks for T tokens.
#[inline(always)]
unsafe fn gemm_legacy<const F: u8, const T: usize>(
    g: *const u8,
    nb: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    _lim: *const u8,
) {
    unsafe {
        let (bb, c) = match F {
            0 => (144, -8.0),
            1 => (160, 1.0),
            2 => (272, 0.0),
            3 => (176, -16.0),
            _ => (192, 1.0),
        };
        let m4 = vdupq_n_u8(0x0F);
        let m10 = vdupq_n_u8(0x10);
        let zero = vdupq_n_f32(0.0);
        let mut f = [[zero; 2]; T];
        let mut o = [[zero; 2]; T];
        for i in 0..nb {
            let b = g.add(i * bb);
            let dw = f16x8(b);
            let ow = if F == 1 || F == 4 {
                f16x8(b.add(16))
            } else {
                dw
            };
            let mut acc = [[vdupq_n_s32(0); 4]; T];
            if F == 2 {
                for ch in 0..8 {
                    let w = load2(b.add(16 + 32 * ch));
                    let w = [
                        s8(veorq_u8(w[0], vdupq_n_u8(0x80))),
                        s8(veorq_u8(w[1], vdupq_n_u8(0x80))),
                    ];
                    for t in 0..T {
                        let x = xv(&a[t], i)[ch / 4];
                        let k = 2 * (ch & 1);
                        acc[t][k] = sdot(acc[t][k], w[0], x, ch % 4);
                        acc[t][k + 1] = sdot(acc[t][k + 1], w[1], x, ch % 4);
                    }
                }
            } else {
                let q0 = match F {
                    0 => 16,
                    1 => 32,
                    3 => 48,
                    _ => 64,
                };
                let h = if F >= 3 {
                    load2(b.add(q0 - 32))
                } else {
                    [m4; 2]
                };
                for ch in 0..4 {
                    let v = load2(b.add(q0 + 32 * ch));
                    let mut lo = [vandq_u8(v[0], m4), vandq_u8(v[1], m4)];
                    let mut hi = [vshrq_n_u8::<4>(v[0]), vshrq_n_u8::<4>(v[1])];
                    if F >= 3 {
                        for k in 0..2 {
                            // Fifth bits: bit ch of each byte for low values, 4 + ch for high.
                            let (hl, hh) = match ch {
                                0 => (vshlq_n_u8::<4>(h[k]), h[k]),
                                1 => (vshlq_n_u8::<3>(h[k]), vshrq_n_u8::<1>(h[k])),
                                2 => (vshlq_n_u8::<2>(h[k]), vshrq_n_u8::<2>(h[k])),
                                _ => (vshlq_n_u8::<1>(h[k]), vshrq_n_u8::<3>(h[k])),
                            };
                            lo[k] = vorrq_u8(lo[k], vandq_u8(hl, m10));
                            hi[k] = vorrq_u8(hi[k], vandq_u8(hh, m10));
                        }
                    }
                    for t in 0..T {
                        let x = xv(&a[t], i);
                        acc[t][0] = sdot(acc[t][0], s8(lo[0]), x[0], ch);
                        acc[t][1] = sdot(acc[t][1], s8(lo[1]), x[0], ch);
                        acc[t][2] = sdot(acc[t][2], s8(hi[0]), x[1], ch);
                        acc[t][3] = sdot(acc[t][3], s8(hi[1]), x[1], ch);
                    }
                }
            }
            for t in 0..T {
                let dx = *a[t].d.get_unchecked(i);
                let ds = *a[t].ds.get_unchecked(i);
                for k in 0..2 {
                    let dot = vcvtq_f32_s32(vaddq_s32(acc[t][k], acc[t][k + 2]));
                    f[t][k] = vfmaq_f32(f[t][k], dot, vmulq_n_f32(dw[k], dx));
                    if c != 0.0 {
                        o[t][k] = vfmaq_n_f32(o[t][k], ow[k], ds);
                    }
                }
            }
        }
        for t in 0..T {
            for k in 0..2 {
                let r = vfmaq_n_f32(f[t][k], o[t][k], c);
                vst1q_f32(out[t].as_mut_ptr().add(4 * k), r);
            }
        }
    }
}

/// Q4_K over `ns` super-blocks for T tokens.
#[inline(always)]
unsafe fn gemm_q4_k<const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    _lim: *const u8,
) {
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        let zero = vdupq_n_f32(0.0);
        let mut f = [[zero; 2]; T];
        let mut mn = [[zero; 2]; T];
        for s in 0..ns {
            let b = g.add(s * 1184);
            let (d, dmin) = (f16x8(b), f16x8(b.add(16)));
            for p in 0..4 {
                let (j0, j1) = (8 * s + 2 * p, 8 * s + 2 * p + 1);
                let mut acc = [[vdupq_n_s32(0); 4]; T];
                for ch in 0..8 {
                    let v = load2(b.add(160 + 256 * p + 32 * ch));
                    let lo = [s8(vandq_u8(v[0], m4)), s8(vandq_u8(v[1], m4))];
                    let hi = [s8(vshrq_n_u8::<4>(v[0])), s8(vshrq_n_u8::<4>(v[1]))];
                    for t in 0..T {
                        let (x0, x1) = (xv(&a[t], j0)[ch / 4], xv(&a[t], j1)[ch / 4]);
                        acc[t][0] = sdot(acc[t][0], lo[0], x0, ch % 4);
                        acc[t][1] = sdot(acc[t][1], lo[1], x0, ch % 4);
                        acc[t][2] = sdot(acc[t][2], hi[0], x1, ch % 4);
                        acc[t][3] = sdot(acc[t][3], hi[1], x1, ch % 4);
                    }
                }
                let (sc0, sc1) = (u8x8(b.add(32 + 16 * p)), u8x8(b.add(32 + 16 * p + 8)));
                let (mi0, mi1) = (u8x8(b.add(96 + 16 * p)), u8x8(b.add(96 + 16 * p + 8)));
                for t in 0..T {
                    let (dx0, dx1) = (*a[t].d.get_unchecked(j0), *a[t].d.get_unchecked(j1));
                    let (ds0, ds1) = (*a[t].ds.get_unchecked(j0), *a[t].ds.get_unchecked(j1));
                    for k in 0..2 {
                        let s0 = vmulq_n_f32(vmulq_f32(d[k], sc0[k]), dx0);
                        let s1 = vmulq_n_f32(vmulq_f32(d[k], sc1[k]), dx1);
                        f[t][k] = vfmaq_f32(f[t][k], vcvtq_f32_s32(acc[t][k]), s0);
                        f[t][k] = vfmaq_f32(f[t][k], vcvtq_f32_s32(acc[t][k + 2]), s1);
                        let m0 = vmulq_f32(dmin[k], mi0[k]);
                        let m1 = vmulq_f32(dmin[k], mi1[k]);
                        mn[t][k] = vfmaq_n_f32(mn[t][k], m0, ds0);
                        mn[t][k] = vfmaq_n_f32(mn[t][k], m1, ds1);
                    }
                }
            }
        }
        for t in 0..T {
            for k in 0..2 {
                vst1q_f32(out[t].as_mut_ptr().add(4 * k), vsubq_f32(f[t][k], mn[t][k]));
            }
        }
    }
}

/// Q6_K over `ns` super-blocks for T tokens.
#[inline(always)]
unsafe fn gemm_q6_k<const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    _lim: *const u8,
) {
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        let (k03, k0c, k30) = (vdupq_n_u8(0x03), vdupq_n_u8(0x0C), vdupq_n_u8(0x30));
        let zero = vdupq_n_f32(0.0);
        let mut f = [[zero; 2]; T];
        for s in 0..ns {
            let sb = g.add(s * 1680);
            let d = f16x8(sb);
            for blk in 0..8 {
                let i = 8 * s + blk;
                let b = sb.add(16 + 208 * blk);
                let h = [load2(b.add(128)), load2(b.add(160))];
                let mut acc = [[vdupq_n_s32(0); 4]; T];
                for ch in 0..4 {
                    let v = load2(b.add(32 * ch));
                    let mut lo = [m4; 2];
                    let mut hi = [m4; 2];
                    for k in 0..2 {
                        let h = h[ch / 2][k];
                        let (hl, hh) = if ch % 2 == 0 {
                            (
                                vshlq_n_u8::<4>(vandq_u8(h, k03)),
                                vshlq_n_u8::<2>(vandq_u8(h, k0c)),
                            )
                        } else {
                            (vandq_u8(h, k30), vandq_u8(vshrq_n_u8::<2>(h), k30))
                        };
                        lo[k] = vorrq_u8(vandq_u8(v[k], m4), hl);
                        hi[k] = vorrq_u8(vshrq_n_u8::<4>(v[k]), hh);
                    }
                    for t in 0..T {
                        let x = xv(&a[t], i);
                        acc[t][0] = sdot(acc[t][0], s8(lo[0]), x[0], ch);
                        acc[t][1] = sdot(acc[t][1], s8(lo[1]), x[0], ch);
                        acc[t][2] = sdot(acc[t][2], s8(hi[0]), x[1], ch);
                        acc[t][3] = sdot(acc[t][3], s8(hi[1]), x[1], ch);
                    }
                }
                let (sc0, sc1) = (i8x8(b.add(192)), i8x8(b.add(200)));
                for t in 0..T {
                    let h32 = a[t].h32.as_ptr().add(2 * i);
                    let dx = *a[t].d.get_unchecked(i);
                    for k in 0..2 {
                        // (sum q x - 32 sum x) * sc per 16-value group, exact in i32.
                        let g0 = vsubq_s32(acc[t][k], vdupq_n_s32(*h32));
                        let g1 = vsubq_s32(acc[t][k + 2], vdupq_n_s32(*h32.add(1)));
                        let isum = vaddq_s32(vmulq_s32(g0, sc0[k]), vmulq_s32(g1, sc1[k]));
                        f[t][k] = vfmaq_f32(f[t][k], vcvtq_f32_s32(isum), vmulq_n_f32(d[k], dx));
                    }
                }
            }
        }
        for t in 0..T {
            for k in 0..2 {
                vst1q_f32(out[t].as_mut_ptr().add(4 * k), f[t][k]);
            }
        }
    }
}

use super::x8::gemm_entry;

gemm_entry!("neon,dotprod", MAX_T, q4_0, 32, 144, gemm_legacy, 0);
gemm_entry!("neon,dotprod", MAX_T, q4_1, 32, 160, gemm_legacy, 1);
gemm_entry!("neon,dotprod", MAX_T, q8_0, 32, 272, gemm_legacy, 2);
gemm_entry!("neon,dotprod", MAX_T, q5_0, 32, 176, gemm_legacy, 3);
gemm_entry!("neon,dotprod", MAX_T, q5_1, 32, 192, gemm_legacy, 4);
gemm_entry!("neon,dotprod", MAX_T, q4_k, 256, 1184, gemm_q4_k);
gemm_entry!("neon,dotprod", MAX_T, q6_k, 256, 1680, gemm_q6_k);

pub static DOTPROD: X8Kernels = X8Kernels {
    max_tokens: MAX_T,
    pairs: None,
    q4_0,
    q4_1,
    q5_0,
    q5_1,
    q8_0,
    q4_k,
    q6_k,
};
