#[cfg(target_arch = "x86_64")]
use crate::cpu::kernels::amx::BlockI32;

pub fn available() -> bool {
    crate::cpu::kernels::avx_vnni_allowed()
}

/// As `vnni::conv_block` (signed weight bytes, unsigned input bytes, exact i32 sums),
/// the first `rows` rounded up to 2: steps of 3 rows (12 accumulators of 8 time steps: enough
/// independent sums to keep both VNNI ports busy through `vpdpbusd`'s latency; 2 rows, 8, kept
/// it 80% busy), then the 1 or 2 rows left.
///
/// # Safety
/// [`available`] returned true; the rows of a (up to the next multiple of 2 past `rows`,
/// nq * 4 bytes each) and of b (nq rows of 128 bytes from each tap's offset) lie inside
/// the caller's buffers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
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
            1 => rows_block::<1>(&o, r0, c),
            // Threes while more than 4 rows are left; 4 as two pairs (not 3 and 1).
            2 | 4 => rows_block::<2>(&o, r0, c),
            _ => rows_block::<3>(&o, r0, c),
        }
    })
}

/// Rows r0..r0 + R of the block: R x 32 time steps of accumulators (R * 4 registers).
/// Returns R.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
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
    const Q: usize = NB / 8;
    // SAFETY (all below): reads within the bounds the caller vouched for.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); Q]; R];
        for (j, &bo) in b_off.iter().enumerate() {
            let aj = a.add(j * a_tap + r0 * lda);
            let bj = b.add(bo);
            for p in 0..nq {
                let xr = bj.add(p * ldb);
                let w: [__m256i; R] = std::array::from_fn(|r| {
                    _mm256_set1_epi32(std::ptr::read_unaligned(
                        aj.add(r * lda + 4 * p) as *const i32
                    ))
                });
                for q in 0..Q {
                    let x = _mm256_loadu_si256(xr.add(32 * q) as *const _);
                    for r in 0..R {
                        acc[r][q] = _mm256_dpbusd_avx_epi32(acc[r][q], x, w[r]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, v) in acc.iter().enumerate() {
                let at = (r0 + r) * NB + 8 * q;
                _mm256_storeu_si256(c.0[at..at + 8].as_mut_ptr() as *mut _, *v);
            }
        }
    }
    R
}
