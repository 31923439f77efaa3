//! AVX-512 VNNI kernels over two adjacent eight-row groups (`x8`) at once: a 512-bit vector
//! holds the same 4 quant positions of 16 rows (group g's 8 rows in the low half, group
//! g+1's in the high), so one `vpdpbusd` against 4 broadcast activation bytes advances 16
//! rows where `x86_x8`'s advances 8, and the f32 scaling covers 16 rows per instruction.
//! Cores with full-width 512-bit units (Zen 5, Intel's server cores) issue it at the 256-bit
//! rate, nearly doubling prefill's integer inner loop. With 32 registers, a call also runs
//! more tokens over a group's unpacked quants than the 256-bit sets can.
//!
//! Every lane does the arithmetic of `x86_x8`'s VNNI kernels in the same order (exact i32
//! sums, then the same f32 scale and accumulate steps), so a row's result has the same bits
//! through either kernel, whatever the number of tokens per call.
//!
//! Output: token t's 16 values in `out[2t]` (group g) and `out[2t + 1]` (group g+1).

use std::arch::x86_64::*;

use super::x8::{X8Kernels, ROWS};
use super::x86_x8::{xq, Prefetch};
use super::ActRow;

/// Tokens per call: 8 leave the legacy formats' accumulators in the 32 registers. Measured
/// on Zen 5: Q4_K (two sums and two f32 sums a token) spills some pointers yet runs ~8%
/// faster at 8 than at 6; Q6_K runs alike at 4, 6 and 8.
const MAX_T: usize = 8;
/// From how many tokens a call a 4-bit block's two halves share one sum per token (one
/// dependency chain each then keeps the dot-product units busy; two at 8 tokens measured
/// no faster).
const ONE_CHAIN_FROM: usize = 4;

/// The 32 bytes at `p` (group g's rows) and at `p + gb` (group g+1's): 16 rows' lanes.
#[inline(always)]
unsafe fn load2(p: *const u8, gb: usize) -> __m512i {
    unsafe {
        let lo = _mm256_loadu_si256(p as *const __m256i);
        let hi = _mm256_loadu_si256(p.add(gb) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// 8 f16 at `p` and 8 at `p + gb` -> 16 f32.
#[inline(always)]
unsafe fn f16x16(p: *const u8, gb: usize) -> __m512 {
    unsafe {
        let lo = _mm_loadu_si128(p as *const __m128i);
        let hi = _mm_loadu_si128(p.add(gb) as *const __m128i);
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
    }
}

/// 8 bytes at `p` and 8 at `p + gb`.
#[inline(always)]
unsafe fn bytes16(p: *const u8, gb: usize) -> __m128i {
    unsafe {
        let lo = _mm_loadl_epi64(p as *const __m128i);
        _mm_unpacklo_epi64(lo, _mm_loadl_epi64(p.add(gb) as *const __m128i))
    }
}

/// 8 u8 at `p` and 8 at `p + gb` -> 16 f32.
#[inline(always)]
unsafe fn u8x16(p: *const u8, gb: usize) -> __m512 {
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes16(p, gb))) }
}

/// 8 i8 at `p` and 8 at `p + gb` -> 16 i32.
#[inline(always)]
unsafe fn i8x16(p: *const u8, gb: usize) -> __m512i {
    unsafe { _mm512_cvtepi8_epi32(bytes16(p, gb)) }
}

/// Bytes at..at+4 of an activation block's quants in every lane.
#[inline(always)]
unsafe fn bcast4(x: *const i8, at: usize) -> __m512i {
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(x.add(at) as *const i32)) }
}

#[inline(always)]
unsafe fn dot(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
    unsafe { _mm512_dpbusd_epi32(acc, u, s) }
}

/// The prefetch streams of a pair (one per group), together `prefetch_distance()` ahead.
#[inline(always)]
fn prefetch_pair(g: *const u8, gb: usize) -> [Prefetch; 2] {
    let pd = super::x8::prefetch_distance() / 2;
    [
        Prefetch::in_pair(g, gb, pd),
        Prefetch::in_pair(g.wrapping_add(gb), gb, pd),
    ]
}

/// Token t's 16 values into `out[2t..2t + 2]`.
#[inline(always)]
unsafe fn store(out: &mut [[f32; ROWS]], t: usize, v: __m512) {
    unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(2 * t) as *mut f32, v) }
}

/// Q4_0 (F = 0), Q4_1 (F = 1), Q8_0 (F = 2), Q5_0 (F = 3), Q5_1 (F = 4) over `nb` blocks
/// for T tokens (see `x86_x8::gemm_legacy`).
#[inline(always)]
unsafe fn gemm_legacy<const F: u8, const T: usize>(
    g: *const u8,
    nb: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    lim: *const u8,
) {
    unsafe {
        let bb = match F {
            0 => 144,
            1 => 160,
            2 => 272,
            3 => 176,
            _ => 192,
        };
        let gb = nb * bb;
        let shift = match F {
            0 => Some(0),
            2 => Some(4),
            3 => Some(1),
            _ => None,
        };
        let has_min = F == 1 || F == 4;
        let m10 = _mm512_set1_epi8(0x10);
        let m4 = _mm512_set1_epi8(0x0F);
        let mut f = [_mm512_setzero_ps(); T];
        let mut o = [_mm512_setzero_ps(); T];
        let mut pf = prefetch_pair(g, gb);
        for i in 0..nb {
            let b = g.add(i * bb);
            pf[0].ahead_of(b, bb, lim);
            pf[1].ahead_of(b.add(gb), bb, lim);
            let dw = f16x16(b, gb);
            let mut acc = [[_mm512_setzero_si512(); 2]; T];
            let mut dot_t = [_mm512_setzero_si512(); T];
            if F == 2 {
                for ch in 0..8 {
                    let w = load2(b.add(16 + 32 * ch), gb);
                    for t in 0..T {
                        let x = bcast4(xq(&a[t], i), 4 * ch);
                        acc[t][ch & 1] = dot(acc[t][ch & 1], w, x);
                    }
                }
                for t in 0..T {
                    dot_t[t] = _mm512_add_epi32(acc[t][0], acc[t][1]);
                }
            } else {
                let q0 = match F {
                    0 => 16,
                    1 => 32,
                    3 => 48,
                    _ => 64,
                };
                let h = if F >= 3 {
                    load2(b.add(q0 - 32), gb)
                } else {
                    m4
                };
                for ch in 0..4 {
                    let v = load2(b.add(q0 + 32 * ch), gb);
                    let mut lo = _mm512_and_si512(v, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if F >= 3 {
                        let (hl, hh) = match ch {
                            0 => (_mm512_slli_epi16(h, 4), h),
                            1 => (_mm512_slli_epi16(h, 3), _mm512_srli_epi16(h, 1)),
                            2 => (_mm512_slli_epi16(h, 2), _mm512_srli_epi16(h, 2)),
                            _ => (_mm512_slli_epi16(h, 1), _mm512_srli_epi16(h, 3)),
                        };
                        lo = _mm512_or_si512(lo, _mm512_and_si512(hl, m10));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(hh, m10));
                    }
                    let j = if T >= ONE_CHAIN_FROM { 0 } else { 1 };
                    for t in 0..T {
                        let x = xq(&a[t], i);
                        acc[t][0] = dot(acc[t][0], lo, bcast4(x, 4 * ch));
                        acc[t][j] = dot(acc[t][j], hi, bcast4(x, 16 + 4 * ch));
                    }
                }
                for t in 0..T {
                    dot_t[t] = match T >= ONE_CHAIN_FROM {
                        true => acc[t][0],
                        false => _mm512_add_epi32(acc[t][0], acc[t][1]),
                    };
                }
            }
            let ow = if has_min { f16x16(b.add(16), gb) } else { dw };
            for t in 0..T {
                let mut d = dot_t[t];
                if let Some(sh) = shift {
                    let off = *a[t].s8.get_unchecked(i) << sh;
                    d = _mm512_sub_epi32(d, _mm512_set1_epi32(off));
                }
                let dx = _mm512_set1_ps(*a[t].d.get_unchecked(i));
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dw, dx), f[t]);
                if has_min {
                    let ds = _mm512_set1_ps(*a[t].ds.get_unchecked(i));
                    o[t] = _mm512_fmadd_ps(ow, ds, o[t]);
                }
            }
        }
        for t in 0..T {
            let r = match has_min {
                true => _mm512_add_ps(f[t], o[t]),
                false => f[t],
            };
            store(out, t, r);
        }
    }
}

/// Q4_K over `ns` super-blocks for T tokens (see `x86_x8::gemm_q4_k`).
#[inline(always)]
unsafe fn gemm_q4_k<const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    lim: *const u8,
) {
    unsafe {
        let gb = ns * 1184;
        let m4 = _mm512_set1_epi8(0x0F);
        let mut f = [_mm512_setzero_ps(); T];
        let mut mn = [_mm512_setzero_ps(); T];
        let mut pf = prefetch_pair(g, gb);
        for s in 0..ns {
            let b = g.add(s * 1184);
            pf[0].ahead_of(b, 1184, lim);
            pf[1].ahead_of(b.add(gb), 1184, lim);
            let (d, dmin) = (f16x16(b, gb), f16x16(b.add(16), gb));
            for p in 0..4 {
                let (j0, j1) = (8 * s + 2 * p, 8 * s + 2 * p + 1);
                let mut acc = [[_mm512_setzero_si512(); 2]; T];
                for ch in 0..8 {
                    let v = load2(b.add(160 + 256 * p + 32 * ch), gb);
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    for t in 0..T {
                        acc[t][0] = dot(acc[t][0], lo, bcast4(xq(&a[t], j0), 4 * ch));
                        acc[t][1] = dot(acc[t][1], hi, bcast4(xq(&a[t], j1), 4 * ch));
                    }
                }
                let s0 = _mm512_mul_ps(d, u8x16(b.add(32 + 16 * p), gb));
                let s1 = _mm512_mul_ps(d, u8x16(b.add(32 + 16 * p + 8), gb));
                let m0 = _mm512_mul_ps(dmin, u8x16(b.add(96 + 16 * p), gb));
                let m1 = _mm512_mul_ps(dmin, u8x16(b.add(96 + 16 * p + 8), gb));
                for t in 0..T {
                    let (dx0, dx1) = (*a[t].d.get_unchecked(j0), *a[t].d.get_unchecked(j1));
                    let d0 = _mm512_cvtepi32_ps(acc[t][0]);
                    let d1 = _mm512_cvtepi32_ps(acc[t][1]);
                    f[t] = _mm512_fmadd_ps(d0, _mm512_mul_ps(s0, _mm512_set1_ps(dx0)), f[t]);
                    f[t] = _mm512_fmadd_ps(d1, _mm512_mul_ps(s1, _mm512_set1_ps(dx1)), f[t]);
                    let (ds0, ds1) = (*a[t].ds.get_unchecked(j0), *a[t].ds.get_unchecked(j1));
                    mn[t] = _mm512_fmadd_ps(m0, _mm512_set1_ps(ds0), mn[t]);
                    mn[t] = _mm512_fmadd_ps(m1, _mm512_set1_ps(ds1), mn[t]);
                }
            }
        }
        for t in 0..T {
            store(out, t, _mm512_sub_ps(f[t], mn[t]));
        }
    }
}

/// Q6_K over `ns` super-blocks for T tokens (see `x86_x8::gemm_q6_k`; VNNI's i32 sums need
/// no partial sums).
#[inline(always)]
unsafe fn gemm_q6_k<const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    lim: *const u8,
) {
    unsafe {
        let gb = ns * 1680;
        let m4 = _mm512_set1_epi8(0x0F);
        let (k03, k0c, k30) = (
            _mm512_set1_epi8(0x03),
            _mm512_set1_epi8(0x0C),
            _mm512_set1_epi8(0x30),
        );
        let mut f = [_mm512_setzero_ps(); T];
        let mut pf = prefetch_pair(g, gb);
        for s in 0..ns {
            let sb = g.add(s * 1680);
            pf[0].ahead_of(sb, 1680, lim);
            pf[1].ahead_of(sb.add(gb), 1680, lim);
            let d = f16x16(sb, gb);
            for blk in 0..8 {
                let i = 8 * s + blk;
                let b = sb.add(16 + 208 * blk);
                let h = [load2(b.add(128), gb), load2(b.add(160), gb)];
                let mut acc = [[_mm512_setzero_si512(); 2]; T];
                for ch in 0..4 {
                    let h = h[ch / 2];
                    let v = load2(b.add(32 * ch), gb);
                    let (hl, hh) = if ch % 2 == 0 {
                        (
                            _mm512_slli_epi16(_mm512_and_si512(h, k03), 4),
                            _mm512_slli_epi16(_mm512_and_si512(h, k0c), 2),
                        )
                    } else {
                        (
                            _mm512_and_si512(h, k30),
                            _mm512_and_si512(_mm512_srli_epi16(h, 2), k30),
                        )
                    };
                    let lo = _mm512_or_si512(_mm512_and_si512(v, m4), hl);
                    let hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hh);
                    for t in 0..T {
                        let x = xq(&a[t], i);
                        acc[t][0] = dot(acc[t][0], lo, bcast4(x, 4 * ch));
                        acc[t][1] = dot(acc[t][1], hi, bcast4(x, 16 + 4 * ch));
                    }
                }
                let (sc0, sc1) = (i8x16(b.add(192), gb), i8x16(b.add(200), gb));
                for t in 0..T {
                    let h32 = a[t].h32.as_ptr().add(2 * i);
                    let g0 = _mm512_sub_epi32(acc[t][0], _mm512_set1_epi32(*h32));
                    let g1 = _mm512_sub_epi32(acc[t][1], _mm512_set1_epi32(*h32.add(1)));
                    let isum =
                        _mm512_add_epi32(_mm512_mullo_epi32(g0, sc0), _mm512_mullo_epi32(g1, sc1));
                    let dx = _mm512_set1_ps(*a[t].d.get_unchecked(i));
                    f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dx), f[t]);
                }
            }
        }
        for t in 0..T {
            store(out, t, f[t]);
        }
    }
}

/// A pair entry point (a [`super::x8::GemmFn`] over two groups): lengths checked, tokens in
/// calls of at most [`MAX_T`]. `$f::<$g.., T>` is the body.
macro_rules! pair_entry {
    ($name:ident, $per:expr, $bytes:expr, $f:ident $(, $g:tt)*) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
        pub unsafe fn $name(groups: &[u8], cols: usize, a: &[ActRow], out: &mut [[f32; ROWS]]) {
            crate::cpu::kernels::x8::check_args(groups, cols, a, out, 2, $per, $bytes);
            let (g, n) = (groups.as_ptr(), cols / $per);
            // The first pass over the pair may prefetch what follows it in `groups`.
            let mut lim = groups.as_ptr_range().end;
            let mut t = 0;
            while t < a.len() {
                let k = (a.len() - t).min(MAX_T);
                let (x, o) = (&a[t..t + k], &mut out[2 * t..2 * (t + k)]);
                // SAFETY: lengths checked above; the features were detected.
                unsafe {
                    match k {
                        1 => $f::<$($g,)* 1>(g, n, x, o, lim),
                        2 => $f::<$($g,)* 2>(g, n, x, o, lim),
                        3 => $f::<$($g,)* 3>(g, n, x, o, lim),
                        4 => $f::<$($g,)* 4>(g, n, x, o, lim),
                        5 => $f::<$($g,)* 5>(g, n, x, o, lim),
                        6 => $f::<$($g,)* 6>(g, n, x, o, lim),
                        7 => $f::<$($g,)* 7>(g, n, x, o, lim),
                        _ => $f::<$($g,)* 8>(g, n, x, o, lim),
                    }
                }
                lim = g;
                t += k;
            }
        }
    };
}

mod vnni {
    use super::*;
    pair_entry!(q4_0, 32, 144, gemm_legacy, 0);
    pair_entry!(q4_1, 32, 160, gemm_legacy, 1);
    pair_entry!(q8_0, 32, 272, gemm_legacy, 2);
    pair_entry!(q5_0, 32, 176, gemm_legacy, 3);
    pair_entry!(q5_1, 32, 192, gemm_legacy, 4);
    pair_entry!(q4_k, 256, 1184, gemm_q4_k);
    pair_entry!(q6_k, 256, 1680, gemm_q6_k);
}

/// The pair kernels, for `x86_x8::VNNI` on CPUs whose AVX-512 has BW (every one with VNNI).
pub static VNNI_PAIRS: X8Kernels = X8Kernels {
    max_tokens: MAX_T,
    pairs: None,
    q4_0: vnni::q4_0,
    q4_1: vnni::q4_1,
    q5_0: vnni::q5_0,
    q5_1: vnni::q5_1,
    q8_0: vnni::q8_0,
    q4_k: vnni::q4_k,
    q6_k: vnni::q6_k,
};
