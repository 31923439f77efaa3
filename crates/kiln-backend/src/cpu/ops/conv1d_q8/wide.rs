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
/// bytes at `b + b_off[j] + p * ldb` (4 a column): exact i32 sums.
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
    use crate::cpu::kernels::amx::{MB, NB};
    use std::arch::x86_64::*;
    // Rows x groups of 4 time steps per register block: 8 accumulators, 4 inputs.
    const R: usize = 2;
    const Q: usize = 4;
    debug_assert!(NB == 32 && MB % R == 0);
    for r0 in (0..MB).step_by(R) {
        if r0 >= rows {
            c.0[r0 * NB..(r0 + R) * NB].fill(0);
            continue;
        }
        for half in 0..NB / (4 * Q) {
            // SAFETY (all below): reads within the bounds the caller vouched for.
            unsafe {
                let mut acc = [[_mm256_setzero_si256(); Q]; R];
                for (j, &bo) in b_off.iter().enumerate() {
                    let aj = a.add(j * a_tap + r0 * lda);
                    let bj = b.add(bo + half * 16 * Q);
                    for p in 0..nq {
                        let xr = bj.add(p * ldb);
                        let x: [__m256i; Q] = std::array::from_fn(|q| {
                            _mm256_cvtepu8_epi16(_mm_loadu_si128(xr.add(16 * q) as *const _))
                        });
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let wv =
                                std::ptr::read_unaligned(aj.add(r * lda + 8 * p) as *const i64);
                            let wv = _mm256_set1_epi64x(wv);
                            for (q, a) in acc.iter_mut().enumerate() {
                                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(x[q], wv));
                            }
                        }
                    }
                }
                // Lanes (2t, 2t + 1) hold time step t's two channel pairs: pairwise sums,
                // then the 64-bit quarters back in time order.
                for (r, acc) in acc.iter().enumerate() {
                    for q in (0..Q).step_by(2) {
                        let s = _mm256_hadd_epi32(acc[q], acc[q + 1]);
                        let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(s);
                        let at = (r0 + r) * NB + half * 4 * Q + 4 * q;
                        _mm256_storeu_si256(c.0[at..at + 8].as_mut_ptr() as *mut _, s);
                    }
                }
            }
        }
    }
}
