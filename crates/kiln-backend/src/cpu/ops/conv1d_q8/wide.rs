#[cfg(target_arch = "x86_64")]
use crate::cpu::kernels::amx::BlockI32;

pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            !crate::cpu::kernels::simd_disabled() && is_x86_feature_detected!("avx2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// C[r][t] = Σ_{j < taps} Σ_{p < nq} Σ_{e < 4} a'[j][r][4p + e] x[j][p][t][e] for the
/// first `rows` (rounded up to 2) of the 32 rows and the 32 columns, with a' the i16
/// values at `a + j * a_tap + r * lda` (little-endian, 2 bytes each) and x the unsigned
/// bytes at `b + b_off[j] + p * ldb` (4 a column): exact i32 sums. Rows in steps of 6
/// (12 accumulators of 4 time steps, each widened input vector used for 6 rows), then 4 or 2.
///
/// # Safety
/// [`available`] returned true; the rows of a (up to the next multiple of 2 past `rows`,
/// nq * 8 bytes each) and of b (nq rows of 128 bytes from each tap's offset) lie inside
/// the caller's buffers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_block(
    a: *const u8,
    lda: usize,
    a_tap: usize,
    b: *const u8,
    ldb: usize,
    b_off: &[usize],
    nq: usize,
    rows: usize,
    c: &mut BlockI32,
) {
    let o = super::Operands {
        a,
        lda,
        a_tap,
        b,
        ldb,
        b_off,
        nq,
    };
    // SAFETY: every step computes rows below the live ones, inside the caller's bounds, on
    // the instructions `available` found.
    super::row_steps(rows, c, |r0, left, c| unsafe {
        match left {
            6.. => rows_block::<6>(&o, r0, c),
            4 | 5 => rows_block::<4>(&o, r0, c),
            _ => rows_block::<2>(&o, r0, c),
        }
    })
}

/// Rows r0..r0 + R of the block, 8 time steps at a time (2 input vectors of 4 steps, R x 2
/// accumulators). Returns R.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows_block<const R: usize>(o: &super::Operands, r0: usize, c: &mut BlockI32) -> usize {
    let super::Operands {
        a,
        lda,
        a_tap,
        b,
        ldb,
        b_off,
        nq,
    } = *o;
    use crate::cpu::kernels::amx::NB;
    use std::arch::x86_64::*;
    const Q: usize = 2;
    for part in 0..NB / (4 * Q) {
        // SAFETY (all below): reads within the bounds the caller vouched for.
        unsafe {
            let mut acc = [[_mm256_setzero_si256(); Q]; R];
            for (j, &bo) in b_off.iter().enumerate() {
                let aj = a.add(j * a_tap + r0 * lda);
                let bj = b.add(bo + part * 16 * Q);
                for p in 0..nq {
                    let xr = bj.add(p * ldb);
                    let x: [__m256i; Q] = std::array::from_fn(|q| {
                        _mm256_cvtepu8_epi16(_mm_loadu_si128(xr.add(16 * q) as *const _))
                    });
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let wv = std::ptr::read_unaligned(aj.add(r * lda + 8 * p) as *const i64);
                        let wv = _mm256_set1_epi64x(wv);
                        for (q, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_add_epi32(*a, _mm256_madd_epi16(x[q], wv));
                        }
                    }
                }
            }
            // Lanes (2t, 2t + 1) hold time step t's two channel pairs: pairwise sums, then
            // the 64-bit quarters back in time order.
            for (r, acc) in acc.iter().enumerate() {
                let s = _mm256_hadd_epi32(acc[0], acc[1]);
                let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(s);
                let at = (r0 + r) * NB + part * 4 * Q;
                _mm256_storeu_si256(c.0[at..at + 8].as_mut_ptr() as *mut _, s);
            }
        }
    }
    R
}
