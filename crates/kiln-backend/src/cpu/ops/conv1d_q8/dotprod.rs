#[cfg(target_arch = "aarch64")]
use crate::cpu::kernels::amx::BlockI32;

pub fn available() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        !crate::cpu::kernels::simd_disabled() && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// `sdot acc.4s, x.16b, w.16b`: lane i += Σ_e x[4i + e] w[4i + e].
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn sdot(
    acc: std::arch::aarch64::int32x4_t,
    x: std::arch::aarch64::int8x16_t,
    w: std::arch::aarch64::int8x16_t,
) -> std::arch::aarch64::int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only; callers enable "dotprod".
    unsafe {
        std::arch::asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) x,
            in(vreg) w,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// As `vnni::conv_block`, the first `rows` rounded up to 2.
///
/// # Safety
/// [`available`] returned true; the rows of a (up to the next multiple of 2 past `rows`,
/// nq * 4 bytes each) and of b (nq rows of 128 bytes from each tap's offset) lie inside
/// the caller's buffers.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
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
    use std::arch::aarch64::*;
    const R: usize = 2;
    const Q: usize = NB / 4;
    for r0 in (0..MB).step_by(R) {
        if r0 >= rows {
            c.0[r0 * NB..(r0 + R) * NB].fill(0);
            continue;
        }
        // SAFETY (all below): reads within the bounds the caller vouched for.
        unsafe {
            let flip = vdupq_n_u8(0x80);
            let mut acc = [[vdupq_n_s32(0); Q]; R];
            let mut wsum = [0i32; R];
            for (j, &bo) in b_off.iter().enumerate() {
                let aj = a.add(j * a_tap + r0 * lda);
                let bj = b.add(bo);
                for p in 0..nq {
                    let xr = bj.add(p * ldb);
                    let x: [int8x16_t; Q] = std::array::from_fn(|q| {
                        vreinterpretq_s8_u8(veorq_u8(vld1q_u8(xr.add(16 * q)), flip))
                    });
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let wb =
                            std::ptr::read_unaligned(aj.add(r * lda + 4 * p) as *const [i8; 4]);
                        wsum[r] += wb.iter().map(|&v| v as i32).sum::<i32>();
                        let wv = vreinterpretq_s8_s32(vdupq_n_s32(i32::from_le_bytes(
                            wb.map(|v| v as u8),
                        )));
                        for (q, a) in acc.iter_mut().enumerate() {
                            *a = sdot(*a, x[q], wv);
                        }
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let back = vdupq_n_s32(128 * wsum[r]);
                for (q, v) in acc.iter().enumerate() {
                    let at = (r0 + r) * NB + 4 * q;
                    vst1q_s32(c.0[at..at + 4].as_mut_ptr(), vaddq_s32(*v, back));
                }
            }
        }
    }
}
