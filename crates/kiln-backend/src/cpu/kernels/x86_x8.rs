//! x86-64 kernels over the eight-row interleaved layouts (`x8`): each 32-bit lane of a
//! 256-bit vector is one row, so a u8 x i8 dot instruction against 4 broadcast activation
//! bytes advances 8 rows, block scales of 8 rows are one vector, and no horizontal sums are
//! needed. One call runs up to `MAX_T` tokens over a group, unpacking its quants once.
//!
//! Every token's arithmetic is the same sequence whatever the number of tokens per call, so
//! a token's result does not depend on its batch (decode and prefill agree bit for bit).

use std::arch::x86_64::*;

use super::x8::{X8Kernels, ROWS};
use super::ActRow;

/// How a set sums u8 x i8 products into i32 lanes (4 adjacent bytes per lane).
///
/// `acc` adds into a set's own partial sums (VNNI: i32 lanes; AVX2: i16 lanes, each the sum
/// of two adjacent products, so that the one multiply port of many cores does one
/// instruction per product vector instead of two); `widen` turns them into i32 lanes. An
/// AVX2 partial sum holds at most 32767: 8 `acc`s of u <= 15 (2 x 15 x 128 each), 4 of
/// u <= 31, 2 of u <= 63. The sums are exact integers either way, so the result does not
/// depend on the set's grouping.
trait LaneDot {
    /// Activation rows per call.
    const MAX_T: usize;
    /// The same for Q8_0, whose products take more registers.
    const MAX_T_Q8: usize;
    /// Whether the Q8_0 kernel multiplies the stored u8 (q + 128), so that 128 x the
    /// activations' sum leaves its dot.
    const Q8_UNSIGNED: bool;
    /// From how many tokens a call a 4-bit block's low and high halves share one partial
    /// sum per token: below it they go to two (two dependency chains where an instruction's
    /// latency needs them); from it one accumulator per token, where registers are short
    /// (16 of them without AVX-512).
    const ONE_CHAIN_FROM: usize;
    /// Whether the partial sums are i32 lanes (`widen` is the identity): a block's integer
    /// offset can then start a partial sum instead of being subtracted from the dot after.
    const I32_SUMS: bool = true;
    /// Partial sums + sum of u x s per lane, for u <= 63 (see the limits above).
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// Partial sums -> i32 lanes (the dot-product instructions' sums already are).
    #[inline(always)]
    unsafe fn widen(acc: __m256i) -> __m256i {
        acc
    }
    /// The i32 lanes of two partial sums whose sum stays within a partial sum's limit.
    #[inline(always)]
    unsafe fn widen2(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(Self::widen(a), Self::widen(b)) }
    }
    /// i32 lanes + sum of (u - 128) x s per lane (of u x s where `Q8_UNSIGNED`), any u8.
    #[inline(always)]
    unsafe fn acc_q8(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { Self::acc(acc, u, s) }
    }
}

struct Vnni;
impl LaneDot for Vnni {
    const MAX_T: usize = 4;
    const MAX_T_Q8: usize = 4;
    const Q8_UNSIGNED: bool = true;
    const ONE_CHAIN_FROM: usize = usize::MAX;
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` of Intel's client cores from Alder Lake,
/// which have no AVX-512): VNNI's arithmetic in 16 registers.
struct AvxVnni;
impl LaneDot for AvxVnni {
    const MAX_T: usize = 4;
    const MAX_T_Q8: usize = 2;
    const Q8_UNSIGNED: bool = true;
    const ONE_CHAIN_FROM: usize = 3;
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

struct Avx2;
impl LaneDot for Avx2 {
    const MAX_T: usize = 4;
    const MAX_T_Q8: usize = 2;
    const Q8_UNSIGNED: bool = false;
    const ONE_CHAIN_FROM: usize = 0;
    const I32_SUMS: bool = false;
    #[inline(always)]
    unsafe fn acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // Pairs of u8 x i8 -> i16 (|u| <= 63, |s| <= 128: no saturation).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s)) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(acc, _mm256_set1_epi16(1)) }
    }
    #[inline(always)]
    unsafe fn widen2(a: __m256i, b: __m256i) -> __m256i {
        unsafe { Self::widen(_mm256_add_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn acc_q8(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // Back to signed quants, then |q| x sign(s, q): the products as u8 x i8.
        unsafe {
            let q = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(s, q));
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    }
}

/// Bytes at..at+4 of an activation block's quants in every lane.
#[inline(always)]
unsafe fn bcast4(x: *const i8, at: usize) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(x.add(at) as *const i32)) }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 8 f16 at p -> 8 f32.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
}

/// 8 u8 at p -> 8 f32.
#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

/// 8 i8 at p -> 8 i32.
#[inline(always)]
unsafe fn i8x8(p: *const u8) -> __m256i {
    unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
}

/// The weight bytes `prefetch_distance()` ahead of each block (up to `lim`) requested into
/// L2 while the block computes: spread over the blocks, the fetches overlap the arithmetic
/// (a burst between calls stalls the core once the line-fill buffers are full, and an L2
/// hint leaves more misses in flight than L1's buffers allow).
pub(super) struct Prefetch {
    pd: usize,
    line: *const u8,
    /// Where the stream's own bytes end, and how far it then jumps: a kernel reading two
    /// adjacent groups at once runs one stream in each, and past its group a stream skips
    /// the other one (being read already) to the same group of the next pair.
    own_end: usize,
    skip: usize,
}

impl Prefetch {
    #[inline(always)]
    pub(super) fn new(g: *const u8) -> Self {
        Self::with(g, super::x8::prefetch_distance(), usize::MAX, 0)
    }

    /// The stream of one group of a pair (`gb` bytes each) starting at `g`, `pd` ahead.
    #[inline(always)]
    pub(super) fn in_pair(g: *const u8, gb: usize, pd: usize) -> Self {
        Self::with(g, pd, g as usize + gb, gb)
    }

    #[inline(always)]
    fn with(g: *const u8, pd: usize, own_end: usize, skip: usize) -> Self {
        let mut p = Prefetch {
            pd,
            line: g.wrapping_add(pd),
            own_end,
            skip,
        };
        p.line = p.skipped(p.line);
        p
    }

    /// An address in this stream's view -> the address it stands for.
    #[inline(always)]
    fn skipped(&self, p: *const u8) -> *const u8 {
        match p as usize >= self.own_end {
            true => p.wrapping_add(self.skip),
            false => p,
        }
    }

    /// Before the block of `len` bytes at `b`.
    #[inline(always)]
    pub(super) unsafe fn ahead_of(&mut self, b: *const u8, len: usize, lim: *const u8) {
        let end = self.skipped(b.wrapping_add(self.pd + len));
        while self.pd != 0 && self.line < end && self.line < lim {
            // SAFETY: a prefetch has no effect on program state.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.line as *const i8) };
            let next = self.line.wrapping_add(64);
            self.line = match (self.line as usize) < self.own_end {
                true => self.skipped(next),
                false => next,
            };
        }
    }
}

#[inline(always)]
pub(super) unsafe fn xq(a: &ActRow, i: usize) -> *const i8 {
    unsafe { a.blocks.get_unchecked(i).qs.as_ptr() }
}

/// Q4_0 (F = 0), Q4_1 (F = 1), Q8_0 (F = 2), Q5_0 (F = 3), Q5_1 (F = 4) over `nb` blocks
/// for T tokens.
#[inline(always)]
unsafe fn gemm_legacy<M: LaneDot, const F: u8, const T: usize>(
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
        // The stored quants' integer offset (8 for Q4_0, 16 for Q5_0, 128 for VNNI's Q8_0),
        // times the block's activation sum, leaves the integer dot; Q4_1 and Q5_1 add a
        // per-row float minimum instead.
        let shift = match F {
            0 => Some(0),
            2 if M::Q8_UNSIGNED => Some(4),
            3 => Some(1),
            _ => None,
        };
        let has_min = F == 1 || F == 4;
        let m10 = _mm256_set1_epi8(0x10);
        let m4 = _mm256_set1_epi8(0x0F);
        let mut f = [_mm256_setzero_ps(); T];
        let mut o = [_mm256_setzero_ps(); T];
        let mut pf = Prefetch::new(g);
        for i in 0..nb {
            let b = g.add(i * bb);
            pf.ahead_of(b, bb, lim);
            let dw = f16x8(b);
            let mut acc = [[_mm256_setzero_si256(); 2]; T];
            let mut dot = [_mm256_setzero_si256(); T];
            // i32 sums start from minus the offset (the same integer dot, an instruction
            // chain a token shorter).
            let folded = M::I32_SUMS && shift.is_some();
            if let (true, Some(sh)) = (folded, shift) {
                for t in 0..T {
                    let off = *a[t].s8.get_unchecked(i) << sh;
                    acc[t][0] = _mm256_set1_epi32(off.wrapping_neg());
                }
            }
            if F == 2 {
                for ch in 0..8 {
                    let w = load(b.add(16 + 32 * ch));
                    for t in 0..T {
                        let x = bcast4(xq(&a[t], i), 4 * ch);
                        acc[t][ch & 1] = M::acc_q8(acc[t][ch & 1], w, x);
                    }
                }
                for t in 0..T {
                    dot[t] = _mm256_add_epi32(acc[t][0], acc[t][1]);
                }
            } else {
                let q0 = match F {
                    0 => 16,
                    1 => 32,
                    3 => 48,
                    _ => 64,
                };
                // Q5: the fifth bits, bit c (low values) and 4 + c (high values) of each byte.
                let h = if F >= 3 { load(b.add(q0 - 32)) } else { m4 };
                for ch in 0..4 {
                    let v = load(b.add(q0 + 32 * ch));
                    let mut lo = _mm256_and_si256(v, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if F >= 3 {
                        let (hl, hh) = match ch {
                            0 => (_mm256_slli_epi16(h, 4), h),
                            1 => (_mm256_slli_epi16(h, 3), _mm256_srli_epi16(h, 1)),
                            2 => (_mm256_slli_epi16(h, 2), _mm256_srli_epi16(h, 2)),
                            _ => (_mm256_slli_epi16(h, 1), _mm256_srli_epi16(h, 3)),
                        };
                        lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m10));
                    }
                    // 4-bit quants: both halves may share a partial sum (8 adds of u <=
                    // 15); 5-bit: each half on its own (4 of u <= 31).
                    let one = F < 3 && T >= M::ONE_CHAIN_FROM;
                    for t in 0..T {
                        let x = xq(&a[t], i);
                        acc[t][0] = M::acc(acc[t][0], lo, bcast4(x, 4 * ch));
                        let j = if one { 0 } else { 1 };
                        acc[t][j] = M::acc(acc[t][j], hi, bcast4(x, 16 + 4 * ch));
                    }
                }
                for t in 0..T {
                    dot[t] = match (F >= 3, T >= M::ONE_CHAIN_FROM) {
                        (true, _) => _mm256_add_epi32(M::widen(acc[t][0]), M::widen(acc[t][1])),
                        (false, false) => M::widen2(acc[t][0], acc[t][1]),
                        (false, true) => M::widen(acc[t][0]),
                    };
                }
            }
            let ow = if has_min { f16x8(b.add(16)) } else { dw };
            for t in 0..T {
                let mut d = dot[t];
                if let Some(sh) = shift.filter(|_| !folded) {
                    let off = *a[t].s8.get_unchecked(i) << sh;
                    d = _mm256_sub_epi32(d, _mm256_set1_epi32(off));
                }
                let dx = _mm256_set1_ps(*a[t].d.get_unchecked(i));
                f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dw, dx), f[t]);
                if has_min {
                    let ds = _mm256_set1_ps(*a[t].ds.get_unchecked(i));
                    o[t] = _mm256_fmadd_ps(ow, ds, o[t]);
                }
            }
        }
        for t in 0..T {
            let r = match has_min {
                true => _mm256_add_ps(f[t], o[t]),
                false => f[t],
            };
            _mm256_storeu_ps(out[t].as_mut_ptr(), r);
        }
    }
}

/// Q4_K over `ns` super-blocks for T tokens.
#[inline(always)]
unsafe fn gemm_q4_k<M: LaneDot, const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    lim: *const u8,
) {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut f = [_mm256_setzero_ps(); T];
        let mut mn = [_mm256_setzero_ps(); T];
        let mut pf = Prefetch::new(g);
        for s in 0..ns {
            let b = g.add(s * 1184);
            pf.ahead_of(b, 1184, lim);
            let (d, dmin) = (f16x8(b), f16x8(b.add(16)));
            for p in 0..4 {
                let (j0, j1) = (8 * s + 2 * p, 8 * s + 2 * p + 1);
                let mut acc = [[_mm256_setzero_si256(); 2]; T];
                for ch in 0..8 {
                    let v = load(b.add(160 + 256 * p + 32 * ch));
                    let lo = _mm256_and_si256(v, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    for t in 0..T {
                        acc[t][0] = M::acc(acc[t][0], lo, bcast4(xq(&a[t], j0), 4 * ch));
                        acc[t][1] = M::acc(acc[t][1], hi, bcast4(xq(&a[t], j1), 4 * ch));
                    }
                }
                let s0 = _mm256_mul_ps(d, u8x8(b.add(32 + 16 * p)));
                let s1 = _mm256_mul_ps(d, u8x8(b.add(32 + 16 * p + 8)));
                let m0 = _mm256_mul_ps(dmin, u8x8(b.add(96 + 16 * p)));
                let m1 = _mm256_mul_ps(dmin, u8x8(b.add(96 + 16 * p + 8)));
                for t in 0..T {
                    let (dx0, dx1) = (*a[t].d.get_unchecked(j0), *a[t].d.get_unchecked(j1));
                    let d0 = _mm256_cvtepi32_ps(M::widen(acc[t][0]));
                    let d1 = _mm256_cvtepi32_ps(M::widen(acc[t][1]));
                    f[t] = _mm256_fmadd_ps(d0, _mm256_mul_ps(s0, _mm256_set1_ps(dx0)), f[t]);
                    f[t] = _mm256_fmadd_ps(d1, _mm256_mul_ps(s1, _mm256_set1_ps(dx1)), f[t]);
                    let (ds0, ds1) = (*a[t].ds.get_unchecked(j0), *a[t].ds.get_unchecked(j1));
                    mn[t] = _mm256_fmadd_ps(m0, _mm256_set1_ps(ds0), mn[t]);
                    mn[t] = _mm256_fmadd_ps(m1, _mm256_set1_ps(ds1), mn[t]);
                }
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(f[t], mn[t]));
        }
    }
}

/// Q6_K over `ns` super-blocks for T tokens.
#[inline(always)]
unsafe fn gemm_q6_k<M: LaneDot, const T: usize>(
    g: *const u8,
    ns: usize,
    a: &[ActRow],
    out: &mut [[f32; ROWS]],
    lim: *const u8,
) {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let (k03, k0c, k30) = (
            _mm256_set1_epi8(0x03),
            _mm256_set1_epi8(0x0C),
            _mm256_set1_epi8(0x30),
        );
        let mut f = [_mm256_setzero_ps(); T];
        let mut pf = Prefetch::new(g);
        for s in 0..ns {
            let sb = g.add(s * 1680);
            pf.ahead_of(sb, 1680, lim);
            let d = f16x8(sb);
            for blk in 0..8 {
                let i = 8 * s + blk;
                let b = sb.add(16 + 208 * blk);
                let h = [load(b.add(128)), load(b.add(160))];
                // 6-bit quants: partial sums of two chunks at a time (u <= 63).
                let mut acc = [[_mm256_setzero_si256(); 2]; T];
                for pair in 0..2 {
                    let h = h[pair];
                    let mut part = [[_mm256_setzero_si256(); 2]; T];
                    for ch in 2 * pair..2 * pair + 2 {
                        let v = load(b.add(32 * ch));
                        let (hl, hh) = if ch % 2 == 0 {
                            (
                                _mm256_slli_epi16(_mm256_and_si256(h, k03), 4),
                                _mm256_slli_epi16(_mm256_and_si256(h, k0c), 2),
                            )
                        } else {
                            (
                                _mm256_and_si256(h, k30),
                                _mm256_and_si256(_mm256_srli_epi16(h, 2), k30),
                            )
                        };
                        let lo = _mm256_or_si256(_mm256_and_si256(v, m4), hl);
                        let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hh);
                        for t in 0..T {
                            let x = xq(&a[t], i);
                            part[t][0] = M::acc(part[t][0], lo, bcast4(x, 4 * ch));
                            part[t][1] = M::acc(part[t][1], hi, bcast4(x, 16 + 4 * ch));
                        }
                    }
                    for t in 0..T {
                        acc[t][0] = _mm256_add_epi32(acc[t][0], M::widen(part[t][0]));
                        acc[t][1] = _mm256_add_epi32(acc[t][1], M::widen(part[t][1]));
                    }
                }
                let (sc0, sc1) = (i8x8(b.add(192)), i8x8(b.add(200)));
                for t in 0..T {
                    // (sum q x - 32 sum x) * sc per 16-value group, exact in i32.
                    let h32 = a[t].h32.as_ptr().add(2 * i);
                    let g0 = _mm256_sub_epi32(acc[t][0], _mm256_set1_epi32(*h32));
                    let g1 = _mm256_sub_epi32(acc[t][1], _mm256_set1_epi32(*h32.add(1)));
                    let isum =
                        _mm256_add_epi32(_mm256_mullo_epi32(g0, sc0), _mm256_mullo_epi32(g1, sc1));
                    let dx = _mm256_set1_ps(*a[t].d.get_unchecked(i));
                    f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), f[t]);
                }
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), f[t]);
        }
    }
}

macro_rules! instantiate {
    ($module:ident, $set:ident, $features:literal, $m:ty, $pairs:expr) => {
        mod $module {
            use super::*;
            use crate::cpu::kernels::x8::gemm_entry;
            gemm_entry!($features, <$m>::MAX_T, q4_0, 32, 144, gemm_legacy, $m, 0);
            gemm_entry!($features, <$m>::MAX_T, q4_1, 32, 160, gemm_legacy, $m, 1);
            gemm_entry!($features, <$m>::MAX_T_Q8, q8_0, 32, 272, gemm_legacy, $m, 2);
            gemm_entry!($features, <$m>::MAX_T, q5_0, 32, 176, gemm_legacy, $m, 3);
            gemm_entry!($features, <$m>::MAX_T, q5_1, 32, 192, gemm_legacy, $m, 4);
            gemm_entry!($features, <$m>::MAX_T, q4_k, 256, 1184, gemm_q4_k, $m);
            gemm_entry!($features, <$m>::MAX_T, q6_k, 256, 1680, gemm_q6_k, $m);
        }

        pub static $set: X8Kernels = X8Kernels {
            max_tokens: <$m>::MAX_T,
            pairs: $pairs,
            q4_0: $module::q4_0,
            q4_1: $module::q4_1,
            q5_0: $module::q5_0,
            q5_1: $module::q5_1,
            q8_0: $module::q8_0,
            q4_k: $module::q4_k,
            q6_k: $module::q6_k,
        };
    };
}

instantiate!(avx2, AVX2, "avx2,fma,f16c", Avx2, None);
instantiate!(
    vnni,
    VNNI,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    Vnni,
    Some(&super::x86_x16::VNNI_PAIRS)
);
instantiate!(avxvnni, AVX_VNNI, "avx2,fma,f16c,avxvnni", AvxVnni, None);
