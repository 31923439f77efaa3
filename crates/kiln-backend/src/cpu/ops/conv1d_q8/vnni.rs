#[cfg(target_arch = "x86_64")]
use crate::cpu::kernels::amx::BlockI32;

pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            !crate::cpu::kernels::simd_disabled()
                && !crate::options::get().no_avx512
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// C[r][t] = Σ_{j < taps} Σ_{p < nq} Σ_{e < 4} a'[j][r][4p + e] x[j][p][t][e] for the
/// first `rows` (rounded up to 8) of the 32 rows and the 32 columns, with a' the signed
/// bytes at `a + j * a_tap + r * lda` and x the unsigned ones at `b + b_off[j] + p * ldb`
/// (4 a column): `vpdpbusd`, exact i32 sums.
///
/// # Safety
/// [`available`] returned true; the rows of a (up to the next multiple of 8 past `rows`,
/// nq * 4 bytes each) and of b (nq rows of 128 bytes from each tap's offset) lie inside
/// the caller's buffers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    const R: usize = 8;
    debug_assert!(NB == 32 && MB % R == 0);
    for r0 in (0..MB).step_by(R) {
        let out = &mut c.0[r0 * NB..(r0 + R) * NB];
        if r0 >= rows {
            out.fill(0);
            continue;
        }
        // SAFETY (all below): reads within the bounds the caller vouched for.
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); 2]; R];
            for (j, &bo) in b_off.iter().enumerate() {
                let aj = a.add(j * a_tap + r0 * lda);
                let bj = b.add(bo);
                for p in 0..nq {
                    let xr = bj.add(p * ldb);
                    let x0 = _mm512_loadu_si512(xr as *const _);
                    let x1 = _mm512_loadu_si512(xr.add(64) as *const _);
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let wv = std::ptr::read_unaligned(aj.add(i * lda + 4 * p) as *const i32);
                        let wv = _mm512_set1_epi32(wv);
                        acc[0] = _mm512_dpbusd_epi32(acc[0], x0, wv);
                        acc[1] = _mm512_dpbusd_epi32(acc[1], x1, wv);
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                _mm512_storeu_si512(out[i * NB..].as_mut_ptr() as *mut _, acc[0]);
                _mm512_storeu_si512(out[i * NB + 16..].as_mut_ptr() as *mut _, acc[1]);
            }
        }
    }
}
