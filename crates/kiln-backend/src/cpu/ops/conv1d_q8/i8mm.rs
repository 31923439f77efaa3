#[cfg(target_arch = "aarch64")]
use crate::cpu::kernels::amx::BlockI32;

pub fn available() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        super::dotprod::available() && std::arch::is_aarch64_feature_detected!("i8mm")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// `usmmla acc.4s, x.16b, w.16b`: acc[2i + j] += Σ_{e < 8} x[8i + e] w[8j + e], x
/// unsigned, w signed.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn usmmla(
    acc: std::arch::aarch64::int32x4_t,
    x: std::arch::aarch64::uint8x16_t,
    w: std::arch::aarch64::int8x16_t,
) -> std::arch::aarch64::int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only; callers enable "i8mm".
    unsafe {
        std::arch::asm!(
            "usmmla {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) x,
            in(vreg) w,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// As `vnni::conv_block`, the weight in row pairs: rows r, r + 1 (r even) of tap j at
/// `a + j * a_tap + r * lda`, values 8s..8s + 8 of row r then of row r + 1 at 16 s bytes
/// past it; the first `rows` rounded up to 8. An odd last channel group is paired with
/// zeros (its row of b is the last read).
///
/// # Safety
/// [`available`] returned true; the row pairs of a (up to the next multiple of 8 past
/// `rows`, 16 nq.div_ceil(2) bytes each) and the rows of b (nq rows of 128 bytes from
/// each tap's offset) lie inside the caller's buffers.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,i8mm")]
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
    // Rows and time steps a piece: 4 x 4 pairs.
    const R: usize = 8;
    const T: usize = 8;
    for r0 in (0..MB).step_by(R) {
        if r0 >= rows {
            c.0[r0 * NB..(r0 + R) * NB].fill(0);
            continue;
        }
        for t0 in (0..NB).step_by(T) {
            // SAFETY (all below): reads within the bounds the caller vouched for.
            unsafe {
                // acc[i][q]: (t, r), (t, r + 1), (t + 1, r), (t + 1, r + 1) for
                // r = r0 + 2i, t = t0 + 2q.
                let mut acc = [[vdupq_n_s32(0); T / 2]; R / 2];
                for (j, &bo) in b_off.iter().enumerate() {
                    let aj = a.add(j * a_tap + r0 * lda);
                    let bj = b.add(bo + 4 * t0);
                    for s in 0..nq.div_ceil(2) {
                        // Groups 2s, 2s + 1 at time steps t0..t0 + 4 and t0 + 4..t0 + 8.
                        let load = |p: usize| -> [uint32x4_t; 2] {
                            let at = bj.add(p * ldb);
                            [0, 16].map(|o| vreinterpretq_u32_u8(vld1q_u8(at.add(o))))
                        };
                        let lo = load(2 * s);
                        let hi = if 2 * s + 1 < nq {
                            load(2 * s + 1)
                        } else {
                            [vdupq_n_u32(0); 2]
                        };
                        let x: [uint8x16_t; T / 2] = std::array::from_fn(|q| {
                            let (l, h) = (lo[q / 2], hi[q / 2]);
                            vreinterpretq_u8_u32(if q % 2 == 0 {
                                vzip1q_u32(l, h)
                            } else {
                                vzip2q_u32(l, h)
                            })
                        });
                        let w: [int8x16_t; R / 2] = std::array::from_fn(|i| {
                            vld1q_s8(aj.add(2 * i * lda + 16 * s) as *const i8)
                        });
                        for (i, acc) in acc.iter_mut().enumerate() {
                            for (q, v) in acc.iter_mut().enumerate() {
                                *v = usmmla(*v, x[q], w[i]);
                            }
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    for h in 0..T / 4 {
                        let (u, v) = (acc[2 * h], acc[2 * h + 1]);
                        let at = (r0 + 2 * i) * NB + t0 + 4 * h;
                        vst1q_s32(c.0[at..at + 4].as_mut_ptr(), vuzp1q_s32(u, v));
                        vst1q_s32(c.0[at + NB..at + NB + 4].as_mut_ptr(), vuzp2q_s32(u, v));
                    }
                }
            }
        }
    }
}
