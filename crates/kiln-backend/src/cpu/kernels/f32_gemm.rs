//! f32 block products for weights marked `prefer_batches` on CPUs with neither AMX tiles nor
//! AVX-512 BF16 nor NEON bf16: the weight packed once at load in 16-row blocks, each k a 64-byte vector of
//! the block's 16 values, so a strip of 8 rows of x x 32 columns runs from registers.
//! AVX-512 (Intel Skylake-SP to Ice Lake and Tiger Lake: most x86 cloud machines):
//! `strip_8x32!` with `vfmadd231ps`, one broadcast of x a row, two vectors of W a k. NEON
//! (every aarch64 CPU: Apple silicon, ARM servers): the strip as four pieces of 4 rows x 16
//! columns, 16 accumulators, per four k one 4-value load of each row of x and per k the
//! block's four vectors, `fmla` by element taking x's value of that k.
//! Sums in f32 as the row dots, in another order (NEON: each output a fused multiply-add a k
//! in increasing k, from zero).

use super::amx::{round_up, MB, NB};

/// Rows of W per packed block (lanes of a vector).
const TN: usize = 16;

/// Whether these products run here: on aarch64 unless SIMD is off (NEON is the baseline)
/// or the CPU has bf16; on x86-64 with AVX-512F allowed and neither AMX nor AVX-512 BF16
/// (the bf16 block products are faster).
pub fn available() -> bool {
    #[cfg(target_arch = "aarch64")]
    return !super::simd_disabled() && !super::amx::bf16_products();
    #[allow(unreachable_code)]
    (super::avx512_allowed() && !super::amx::bf16_products())
}

/// Whether the kernel can run here at all (what the checks need; [`available`] adds the
/// dispatch's preferences).
fn kernel_present() -> bool {
    #[cfg(target_arch = "aarch64")]
    return true;
    #[allow(unreachable_code)]
    super::avx512_allowed()
}

/// W (n rows of k) in vector order: block b, k, lane j = W[16 b + j][k] (zeros past n).
#[derive(Debug, Clone, Default)]
pub struct PackedF32 {
    pub data: Vec<f32>,
    pub k: usize,
    pub n: usize,
    pub np: usize,
}

impl PackedF32 {
    /// Packs W from its rows: `row(j, buf)` writes W[j][..k].
    pub fn from_rows(n: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> Self {
        let np = round_up(n.max(1), NB);
        let mut data = vec![0f32; np * k];
        let mut buf = vec![0f32; k];
        for j in 0..n {
            row(j, &mut buf);
            let base = j / TN * TN * k + j % TN;
            for (kk, &v) in buf.iter().enumerate() {
                data[base + kk * TN] = v;
            }
        }
        PackedF32 { data, k, n, np }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

pub use super::amx::Block;

/// C (m, columns j0..j1) = A · Wᵀ for A's rows 0..m (`a`: `round_up(m, MB)` rows of `b.k`
/// f32, rows past m zeros), by 32 x 32 blocks handed to `emit(i0, j0, block)`. `j0`, `j1`
/// multiples of [`NB`], `j1 <= b.np`.
///
/// # Safety
/// x86-64: AVX-512F is present and allowed ([`available`] implies it). aarch64: none (NEON
/// is the baseline).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    a: &[f32],
    m: usize,
    b: &PackedF32,
    j0: usize,
    j1: usize,
    c: &mut Block,
    emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0.is_multiple_of(NB) && j1.is_multiple_of(NB) && j1 <= b.np,
        "gemm_cols range"
    );
    let (k, mp) = (b.k, round_up(m.max(1), MB));
    assert!(k > 0 && a.len() >= mp * k && b.data.len() >= b.np * k);
    let strip_of = |r0: usize, nb: usize, rows: &mut [f32]| {
        // SAFETY: rows r0..r0+8 of `a` and the two packed blocks lie inside the operands
        // (checked above); `rows` holds the strip's 8 x 32 values; the set is present
        // (caller).
        unsafe {
            let b0 = b.data.as_ptr().add(nb * TN * k);
            let (ap, cp) = (a.as_ptr().add(r0 * k), rows.as_mut_ptr());
            strip(ap, k, b0, b0.add(TN * k), cp);
        }
    };
    super::amx::strips(m, j0, j1, c, strip_of, emit)
}

/// C (8 rows of 32 at `c`) = 8 rows of A (`k` values apart) · the packed 16-row blocks at
/// `b0` (columns 0..16) and `b1` (16..32).
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn strip(a: *const f32, k: usize, b0: *const f32, b1: *const f32, c: *mut f32) {
    let lda = (k * 4) as isize;
    // SAFETY: the caller bounds every read (k values of 8 rows and of each block's 16 rows)
    // and the 8 x 32 values written; AVX-512F is present (caller).
    unsafe { super::strip_8x32!("vfmadd231ps", a, lda, b0, b1, k, c) };
}

/// C (8 rows of 32 at `c`) = 8 rows of A (`k` values apart) · the packed 16-row blocks at
/// `b0` (columns 0..16) and `b1` (16..32), as four 4 x 16 pieces.
#[cfg(target_arch = "aarch64")]
#[inline]
unsafe fn strip(a: *const f32, k: usize, b0: *const f32, b1: *const f32, c: *mut f32) {
    for (half, b) in [b0, b1].into_iter().enumerate() {
        for rows in [0, 4] {
            // SAFETY: as the caller promises for the whole strip.
            unsafe { neon::piece(a.add(rows * k), k, b, c.add(rows * NB + half * TN)) };
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{NB, TN};
    use std::arch::aarch64::*;

    /// C (4 rows of 16 at `c`, `NB` apart) = 4 rows of A (`k` values apart) · one packed
    /// 16-row block (k vectors of 16): 16 accumulators (row r, columns 4v..4v+4 in acc[r][v]),
    /// per four k one load of each row's 4 values, then per k the block's four vectors and
    /// `fmla` by element (lane p % 4 of the row's load); the last k % 4 one value at a time.
    #[target_feature(enable = "neon")]
    pub unsafe fn piece(a: *const f32, k: usize, b: *const f32, c: *mut f32) {
        // SAFETY: the caller bounds every read (k values of 4 rows, 16 k of the block) and
        // the 4 x 16 values written.
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
            let k4 = k / 4 * 4;
            let mut p = 0;
            while p < k4 {
                let x = [
                    vld1q_f32(a.add(p)),
                    vld1q_f32(a.add(k + p)),
                    vld1q_f32(a.add(2 * k + p)),
                    vld1q_f32(a.add(3 * k + p)),
                ];
                let bp = b.add(p * TN);
                step::<0>(&mut acc, &x, bp);
                step::<1>(&mut acc, &x, bp.add(TN));
                step::<2>(&mut acc, &x, bp.add(2 * TN));
                step::<3>(&mut acc, &x, bp.add(3 * TN));
                p += 4;
            }
            while p < k {
                let w = load_block_row(b.add(p * TN));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = *a.add(r * k + p);
                    for (s, &wv) in acc.iter_mut().zip(&w) {
                        *s = vfmaq_n_f32(*s, wv, xv);
                    }
                }
                p += 1;
            }
            for (r, acc) in acc.iter().enumerate() {
                for (v, &s) in acc.iter().enumerate() {
                    vst1q_f32(c.add(r * NB + 4 * v), s);
                }
            }
        }
    }

    /// One k of the block (its 16 values at `b`) into the accumulators, each row's value of
    /// that k being lane L of its load.
    #[inline(always)]
    unsafe fn step<const L: i32>(
        acc: &mut [[float32x4_t; 4]; 4],
        x: &[float32x4_t; 4],
        b: *const f32,
    ) {
        // SAFETY: 16 values at `b` (caller).
        unsafe {
            let w = load_block_row(b);
            for (acc, &xr) in acc.iter_mut().zip(x) {
                for (s, &wv) in acc.iter_mut().zip(&w) {
                    *s = vfmaq_laneq_f32::<L>(*s, wv, xr);
                }
            }
        }
    }

    /// The block's 16 values of one k as four vectors.
    #[inline(always)]
    unsafe fn load_block_row(b: *const f32) -> [float32x4_t; 4] {
        // SAFETY: 16 values at `b` (caller).
        unsafe {
            let v = vld1q_f32_x4(b);
            [v.0, v.1, v.2, v.3]
        }
    }
}

/// Elsewhere [`available`] is false, so this is never called.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    _: &[f32],
    _: usize,
    _: &PackedF32,
    _: usize,
    _: usize,
    _: &mut Block,
    _: impl FnMut(usize, usize, &[f32]),
) {
    unreachable!("no f32 block products on this architecture")
}

/// Checks [`gemm_cols`] against f64 sums of the same products (f32 rounding of k terms);
/// panics on a difference. For the tests of each process's kernel choice.
#[doc(hidden)]
pub fn check_against_f64() {
    assert!(kernel_present(), "no f32 block product kernel here");
    let mut rnd = super::amx::check_values(0x2468_ace1);
    for (m, n, k) in [
        (1, 1, 1),
        (33, 17, 40),
        (64, 64, 64),
        (70, 100, 250),
        (5, 48, 1536),
        (9, 31, 3),
        (40, 16, 7),
        (3, 65, 2),
    ] {
        let x: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        let b = PackedF32::from_rows(n, k, |j, r| r.copy_from_slice(&w[j * k..(j + 1) * k]));
        let mut a = vec![0f32; round_up(m, MB) * k];
        a[..m * k].copy_from_slice(&x);
        let mut blk = Block::default();
        let c = super::amx::check_gather(m, n, b.np, |j_lo, emit| {
            // SAFETY: the set was checked above; the operands are built whole.
            unsafe { gemm_cols(&a, m, &b, j_lo, b.np, &mut blk, emit) }
        });
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (k as f64).sqrt() * (1.0 + want.abs()),
                    "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The kernel on any AVX-512 machine (dispatch picks it only without AMX and BF16) and
    /// on every aarch64 one.
    #[test]
    fn gemm_matches_f64_sums() {
        if !super::kernel_present() {
            eprintln!("no f32 block product kernel here: skipped");
            return;
        }
        super::check_against_f64();
    }
}
