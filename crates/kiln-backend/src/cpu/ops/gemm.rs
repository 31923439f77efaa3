//! f32 block products for prefill-sized matrix products and attention over many positions:
//! C[i][..n] = Σ_p A[i][p] · B[p][..n] ("NN": B by rows of the k dimension). Each step
//! broadcasts one value of A over vectors of C's row held in registers (AVX-512: 6 rows x 32
//! columns, or 12 rows x 16 for narrow C; AVX2 and NEON: 6 rows x 16), so results need no
//! horizontal sums. Also the fp16 row dot of decode-time products.

/// Whether the 16-lane AVX-512 kernel may run here.
#[cfg(target_arch = "x86_64")]
fn avx512_ok() -> bool {
    crate::cpu::kernels::avx512_allowed()
}

/// Whether the AVX2 kernel may run here.
pub fn avx2_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    return !crate::cpu::kernels::simd_disabled()
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma");
    #[allow(unreachable_code)]
    false
}

/// Whether [`gemm_nn`]'s vector kernels may run here (its `simd` argument): AVX2 and FMA on
/// x86-64 ([`avx2_ok`]), NEON (the baseline) on aarch64, unless SIMD is switched off.
pub fn simd_ok() -> bool {
    #[cfg(target_arch = "aarch64")]
    return !crate::cpu::kernels::simd_disabled();
    #[allow(unreachable_code)]
    avx2_ok()
}

/// Whether the F16C half-precision dot may run here.
pub fn f16c_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2_ok() && is_x86_feature_detected!("f16c");
    #[allow(unreachable_code)]
    false
}

/// A row of little-endian f16 values · x (decode-time products over fp16 weights, no
/// dequantized copy of the row).
#[inline(always)]
pub fn dot_f16(w: &[u8], x: &[f32], f16c: bool) -> f32 {
    let n = x.len().min(w.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if f16c {
        // SAFETY: the caller detected AVX2, FMA and F16C; n bounds both operands.
        return unsafe { x86_f16::dot(w.as_ptr(), x.as_ptr(), n) };
    }
    let _ = f16c;
    let mut acc = 0f32;
    for i in 0..n {
        acc += half::f16::from_le_bytes([w[2 * i], w[2 * i + 1]]).to_f32() * x[i];
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86_f16 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(w: *const u8, x: *const f32, n: usize) -> f32 {
        unsafe {
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let n16 = n / 16 * 16;
            let mut i = 0;
            while i < n16 {
                let h0 = _mm_loadu_si128(w.add(2 * i) as *const __m128i);
                let h1 = _mm_loadu_si128(w.add(2 * i + 16) as *const __m128i);
                a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(h0), _mm256_loadu_ps(x.add(i)), a0);
                a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(h1), _mm256_loadu_ps(x.add(i + 8)), a1);
                i += 16;
            }
            let c = _mm256_add_ps(a0, a1);
            let hi = _mm256_extractf128_ps(c, 1);
            let s = _mm_add_ps(_mm256_castps256_ps128(c), hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            let mut v = _mm_cvtss_f32(s);
            while i < n {
                let b = [*w.add(2 * i), *w.add(2 * i + 1)];
                v += half::f16::from_le_bytes(b).to_f32() * *x.add(i);
                i += 1;
            }
            v
        }
    }
}

/// C[i][..n] = Σ_p A[i][p] · B[p][..n] for i < m ("NN": B by rows of its k dimension, so
/// each step broadcasts one A value over a vector of C; no horizontal sums, which suits
/// short k such as a head's 64 values). A's rows start `lda` apart, B's `ldb`, C's `ldc`;
/// C is overwritten. `simd`: [`simd_ok`] (else the plain loops run).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn gemm_nn(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
    simd: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.len() >= (m - 1) * lda + k && c.len() >= (m - 1) * ldc + n);
    assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    #[cfg(target_arch = "x86_64")]
    if simd {
        if avx512_ok() {
            // SAFETY: AVX-512F was detected; bounds were checked above.
            return unsafe { nn512::gemm(a, lda, m, b, ldb, n, k, c, ldc) };
        }
        // SAFETY: the caller detected AVX2 and FMA; bounds were checked above.
        return unsafe { nn256::gemm(a, lda, m, b, ldb, n, k, c, ldc) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        // SAFETY: NEON is the aarch64 baseline; bounds were checked above.
        return unsafe { nn_neon::gemm(a, lda, m, b, ldb, n, k, c, ldc) };
    }
    let _ = simd;
    nn_scalar(a, lda, 0, m, b, ldb, 0, n, k, c, ldc);
}

/// Rows i0..i1, columns j0..j1 of C, plainly.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn nn_scalar(
    a: &[f32],
    lda: usize,
    i0: usize,
    i1: usize,
    b: &[f32],
    ldb: usize,
    j0: usize,
    j1: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for i in i0..i1 {
        let row = &mut c[i * ldc + j0..i * ldc + j1];
        row.fill(0.0);
        for p in 0..k {
            let av = a[i * lda + p];
            for (x, &y) in row.iter_mut().zip(&b[p * ldb + j0..p * ldb + j1]) {
                *x += av * y;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod nn512 {
    use std::arch::x86_64::*;

    /// 6 rows x 32 columns of C per block (12 accumulators); column tails masked.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        a: &[f32],
        lda: usize,
        m: usize,
        b: &[f32],
        ldb: usize,
        n: usize,
        k: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut i = 0;
        while i < m {
            let mi = (m - i).min(6);
            if n <= 16 {
                // One vector of columns: twice the rows per block instead.
                let m0: __mmask16 = if n >= 16 { 0xffff } else { (1u16 << n) - 1 };
                let mi = (m - i).min(12);
                unsafe {
                    match mi {
                        12 => narrow::<12>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        11 => narrow::<11>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        10 => narrow::<10>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        9 => narrow::<9>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        8 => narrow::<8>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        7 => narrow::<7>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        6 => narrow::<6>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        5 => narrow::<5>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        4 => narrow::<4>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        3 => narrow::<3>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        2 => narrow::<2>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                        _ => narrow::<1>(ap, lda, i, bp, ldb, k, cp, ldc, m0),
                    }
                }
                i += mi;
                continue;
            }
            let mut j = 0;
            while j < n {
                let rem = n - j;
                let m0: __mmask16 = if rem >= 16 { 0xffff } else { (1u16 << rem) - 1 };
                let m1: __mmask16 = if rem >= 32 {
                    0xffff
                } else if rem > 16 {
                    (1u16 << (rem - 16)) - 1
                } else {
                    0
                };
                unsafe {
                    match mi {
                        6 => block::<6>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                        5 => block::<5>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                        4 => block::<4>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                        3 => block::<3>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                        2 => block::<2>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                        _ => block::<1>(ap, lda, i, bp, ldb, j, k, cp, ldc, m0, m1),
                    }
                }
                j += 32;
            }
            i += mi;
        }
    }

    /// MR rows x up to 16 columns (mask m0).
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn narrow<const MR: usize>(
        a: *const f32,
        lda: usize,
        i0: usize,
        b: *const f32,
        ldb: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        m0: __mmask16,
    ) {
        unsafe {
            let mut acc = [_mm512_setzero_ps(); MR];
            for p in 0..k {
                let b0 = _mm512_maskz_loadu_ps(m0, b.add(p * ldb));
                for (r, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(_mm512_set1_ps(*a.add((i0 + r) * lda + p)), b0, *x);
                }
            }
            for (r, x) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add((i0 + r) * ldc), m0, *x);
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const MR: usize>(
        a: *const f32,
        lda: usize,
        i0: usize,
        b: *const f32,
        ldb: usize,
        j0: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        m0: __mmask16,
        m1: __mmask16,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for p in 0..k {
                let b0 = _mm512_maskz_loadu_ps(m0, b.add(p * ldb + j0));
                let b1 = _mm512_maskz_loadu_ps(m1, b.add(p * ldb + j0 + 16));
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a.add((i0 + r) * lda + p));
                    row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(av, b1, row[1]);
                }
            }
            for (r, row) in acc.iter().enumerate() {
                let dst = c.add((i0 + r) * ldc + j0);
                _mm512_mask_storeu_ps(dst, m0, row[0]);
                _mm512_mask_storeu_ps(dst.add(16), m1, row[1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod nn256 {
    use std::arch::x86_64::*;

    /// Steps of k a pass takes: a strip of A (6 x KC) and a panel of B (KC x 16) stay in L1
    /// (6 + 16 KiB) while every strip runs over the panel.
    const KC: usize = 256;

    /// 6 rows x 16 columns of C per block (12 accumulators); the last columns masked. k in
    /// passes of [`KC`], each panel of 16 columns under every strip of rows in turn, so the
    /// panel is read from memory once a pass (it was once a strip: wide C, as attention's
    /// scores, streamed B from L2 for every 6 rows). A pass continues the accumulators where
    /// the last one stored them: each C value is the same chain of fused multiply-adds.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        a: &[f32],
        lda: usize,
        m: usize,
        b: &[f32],
        ldb: usize,
        n: usize,
        k: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        let n16 = n / 16 * 16;
        let whole = Pass {
            a: a.as_ptr(),
            lda,
            b: b.as_ptr(),
            ldb,
            k0: 0,
            kc: k,
            c: c.as_mut_ptr(),
            ldc,
        };
        for k0 in (0..k.max(1)).step_by(KC) {
            let at = Pass {
                k0,
                kc: KC.min(k - k0),
                ..whole
            };
            for j in (0..n16).step_by(16) {
                // SAFETY: columns j..j+16 and steps k0..k0+kc lie inside the operands (the
                // caller checked their bounds).
                unsafe { strips(&at, m, j, 16) };
            }
        }
        if n16 < n {
            // SAFETY: columns n16..n lie inside the operands; the masks keep every access to
            // them.
            unsafe { strips(&whole, m, n16, n - n16) };
        }
    }

    /// Rows 0..m in strips of 6 (then the 1-5 left) at columns j0..j0 + w: a panel (w = 16)
    /// or the last columns (w < 16).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn strips(at: &Pass, m: usize, j0: usize, w: usize) {
        let mut i = 0;
        while i < m {
            let mi = (m - i).min(6);
            // SAFETY: rows i..i+mi lie inside the operands (caller).
            unsafe {
                match mi {
                    6 => cols::<6>(at, i, j0, w),
                    5 => cols::<5>(at, i, j0, w),
                    4 => cols::<4>(at, i, j0, w),
                    3 => cols::<3>(at, i, j0, w),
                    2 => cols::<2>(at, i, j0, w),
                    _ => cols::<1>(at, i, j0, w),
                }
            }
            i += mi;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn cols<const MR: usize>(at: &Pass, i0: usize, j0: usize, w: usize) {
        // SAFETY: as for `strips`.
        unsafe {
            match w {
                16 => block::<MR>(at, i0, j0),
                _ => tail::<MR>(at, i0, j0, w),
            }
        }
    }

    /// The last `w` (< 16) columns from j0 of MR rows from i0, through masked loads and
    /// stores, with the portable loop's arithmetic (`nn_scalar`: each product rounded, then
    /// added in step order from zero), so those columns keep their values bit for bit. (They
    /// were that scalar loop: attention's scores over 1500 keys spent a fifth of their time
    /// in their last 12 columns.)
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tail<const MR: usize>(at: &Pass, i0: usize, j0: usize, w: usize) {
        let (a, b, c) = (at.a, at.b, at.c);
        let (lda, ldb, ldc) = (at.lda, at.ldb, at.ldc);
        unsafe {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32), lane);
            let m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32 - 8), lane);
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            // The second vector's address may lie past the operand where w <= 8 (its mask is
            // then empty and nothing is read or written): wrapping arithmetic, no bounds claim.
            for p in at.k0..at.k0 + at.kc {
                let b0 = _mm256_maskload_ps(b.add(p * ldb + j0), m0);
                let b1 = _mm256_maskload_ps(b.wrapping_add(p * ldb + j0 + 8), m1);
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*a.add((i0 + r) * lda + p));
                    row[0] = _mm256_add_ps(row[0], _mm256_mul_ps(av, b0));
                    row[1] = _mm256_add_ps(row[1], _mm256_mul_ps(av, b1));
                }
            }
            for (r, row) in acc.iter().enumerate() {
                let dst = c.add((i0 + r) * ldc + j0);
                _mm256_maskstore_ps(dst, m0, row[0]);
                _mm256_maskstore_ps(dst.wrapping_add(8), m1, row[1]);
            }
        }
    }

    /// The operands and the steps k0..k0 + kc of one pass.
    struct Pass {
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        k0: usize,
        kc: usize,
        c: *mut f32,
        ldc: usize,
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block<const MR: usize>(at: &Pass, i0: usize, j0: usize) {
        let Pass {
            a,
            lda,
            b,
            ldb,
            k0,
            kc,
            c,
            ldc,
        } = *at;
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            if k0 > 0 {
                for (r, row) in acc.iter_mut().enumerate() {
                    let src = c.add((i0 + r) * ldc + j0);
                    *row = [_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(8))];
                }
            }
            for p in k0..k0 + kc {
                let b0 = _mm256_loadu_ps(b.add(p * ldb + j0));
                let b1 = _mm256_loadu_ps(b.add(p * ldb + j0 + 8));
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*a.add((i0 + r) * lda + p));
                    row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(av, b1, row[1]);
                }
            }
            for (r, row) in acc.iter().enumerate() {
                let dst = c.add((i0 + r) * ldc + j0);
                _mm256_storeu_ps(dst, row[0]);
                _mm256_storeu_ps(dst.add(8), row[1]);
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod nn_neon {
    use std::arch::aarch64::*;

    /// 6 rows x 16 columns of C per block: 24 accumulators, per step four vectors of B's row
    /// and each row's value of A taken by `fmla` by element. The columns past the last 16
    /// go in whole 4-lane vectors, then the last 1-3 through a zero-padded vector. Each C
    /// element is Σ_p A[i][p] · B[p][j] for p = 0, 1, .. in turn, one fused multiply-add a
    /// step from zero (as the AVX-512 kernel; the scalar loops and AVX2's column tail round
    /// each product).
    #[target_feature(enable = "neon")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        a: &[f32],
        lda: usize,
        m: usize,
        b: &[f32],
        ldb: usize,
        n: usize,
        k: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let n16 = n / 16 * 16;
        let nv = (n - n16) / 4;
        let n4 = n16 + 4 * nv;
        let mut i = 0;
        while i < m {
            let mi = (m - i).min(6);
            let at = Rows {
                a: ap,
                lda,
                i0: i,
                b: bp,
                ldb,
                k,
                c: cp,
                ldc,
            };
            // SAFETY: rows i..i+mi and every column block lie inside the operands (the
            // caller checked their bounds).
            unsafe {
                for j in (0..n16).step_by(16) {
                    rows::<4, false>(mi, &at, j, 4);
                }
                match nv {
                    3 => rows::<3, false>(mi, &at, n16, 4),
                    2 => rows::<2, false>(mi, &at, n16, 4),
                    1 => rows::<1, false>(mi, &at, n16, 4),
                    _ => {}
                }
                if n4 < n {
                    rows::<1, true>(mi, &at, n4, n - n4);
                }
            }
            i += mi;
        }
    }

    /// The operands of one block of rows (`i0..`): pointers and strides as [`gemm`] has them.
    struct Rows {
        a: *const f32,
        lda: usize,
        i0: usize,
        b: *const f32,
        ldb: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
    }

    /// `block` for `mi` (1..=6) rows.
    #[inline(always)]
    unsafe fn rows<const NV: usize, const PART: bool>(mi: usize, at: &Rows, j0: usize, w: usize) {
        // SAFETY: as the caller promises.
        unsafe {
            match mi {
                6 => block::<6, NV, PART>(at, j0, w),
                5 => block::<5, NV, PART>(at, j0, w),
                4 => block::<4, NV, PART>(at, j0, w),
                3 => block::<3, NV, PART>(at, j0, w),
                2 => block::<2, NV, PART>(at, j0, w),
                _ => block::<1, NV, PART>(at, j0, w),
            }
        }
    }

    /// C rows i0..i0+MR, columns j0..j0+4 NV (PART: NV = 1 and only `w` < 4 columns, read
    /// and written through a zero-padded vector).
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn block<const MR: usize, const NV: usize, const PART: bool>(
        at: &Rows,
        j0: usize,
        w: usize,
    ) {
        debug_assert!(!PART || (NV == 1 && w < 4));
        // SAFETY: rows i0..i0+MR of A (k values) and C, columns j0.. (4 NV, or w) of B's k
        // rows and of C lie inside the operands (caller).
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); NV]; MR];
            for p in 0..at.k {
                let row = at.b.add(p * at.ldb + j0);
                let mut bv = [vdupq_n_f32(0.0); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = if PART {
                        let mut t = [0f32; 4];
                        std::ptr::copy_nonoverlapping(row, t.as_mut_ptr(), w);
                        vld1q_f32(t.as_ptr())
                    } else {
                        vld1q_f32(row.add(4 * v))
                    };
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = *at.a.add((at.i0 + r) * at.lda + p);
                    for (x, &y) in acc.iter_mut().zip(&bv) {
                        *x = vfmaq_n_f32(*x, y, av);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let dst = at.c.add((at.i0 + r) * at.ldc + j0);
                if PART {
                    let mut t = [0f32; 4];
                    vst1q_f32(t.as_mut_ptr(), acc[0]);
                    std::ptr::copy_nonoverlapping(t.as_ptr(), dst, w);
                } else {
                    for (v, x) in acc.iter().enumerate() {
                        vst1q_f32(dst.add(4 * v), *x);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1) from a fixed seed.
    fn values(seed: u32) -> impl FnMut() -> f32 {
        crate::cpu::kernels::amx::check_values(seed)
    }

    /// `gemm_nn` with this CPU's vector kernel against f64 sums of the same products, over
    /// shapes that leave every kind of tail (rows past a block of 6 or 12, columns past 32,
    /// 16 and 4 lanes, k = 1, k = 0) with strides wider than the rows; C's columns past n
    /// must stay untouched. On aarch64 each element also equals, bit for bit, the fused sum
    /// in increasing p from zero (the order the kernel documents).
    #[test]
    fn gemm_nn_matches_f64_sums() {
        let mut rnd = values(0x1357_9bdf);
        let shapes = [
            (1, 1, 1),
            (1, 3, 5),
            (2, 4, 1),
            (5, 7, 3),
            (6, 16, 8),
            (7, 17, 9),
            (13, 30, 64),
            (12, 33, 0),
            (19, 47, 65),
            (25, 64, 31),
            (8, 100, 250),
            (7, 300, 270),
            (13, 21, 600),
        ];
        for (m, n, k) in shapes {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
            let a: Vec<f32> = (0..m * lda).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..k.max(1) * ldb).map(|_| rnd()).collect();
            let mut c = vec![f32::NAN; m * ldc];
            gemm_nn(&a, lda, m, &b, ldb, n, k, &mut c, ldc, simd_ok());
            for i in 0..m {
                for j in 0..ldc {
                    let got = c[i * ldc + j];
                    if j >= n {
                        assert!(got.is_nan(), "{m}x{n}x{k}: C[{i}][{j}] written");
                        continue;
                    }
                    let want: f64 = (0..k)
                        .map(|p| a[i * lda + p] as f64 * b[p * ldb + j] as f64)
                        .sum();
                    assert!(
                        (got as f64 - want).abs()
                            <= 1e-5 * (k.max(1) as f64).sqrt() * (1.0 + want.abs()),
                        "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                    );
                    #[cfg(target_arch = "aarch64")]
                    if simd_ok() {
                        let fused =
                            (0..k).fold(0f32, |s, p| a[i * lda + p].mul_add(b[p * ldb + j], s));
                        assert_eq!(got.to_bits(), fused.to_bits(), "{m}x{n}x{k} ({i},{j})");
                    }
                }
            }
            // The AVX2 kernel, whatever else this CPU has: fused chains in step order over
            // whole 16-column panels (k in passes), the scalar loop's rounding in the tail.
            #[cfg(target_arch = "x86_64")]
            if avx2_ok() {
                let mut c = vec![f32::NAN; m * ldc];
                // SAFETY: AVX2 and FMA were detected; the operands hold m, k rows.
                unsafe { nn256::gemm(&a, lda, m, &b, ldb, n, k, &mut c, ldc) };
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        let (x, y) = (|p: usize| a[i * lda + p], |p: usize| b[p * ldb + j]);
                        let want = match j {
                            _ if j >= n => f32::NAN,
                            _ if j < n / 16 * 16 => (0..k).fold(0f32, |s, p| x(p).mul_add(y(p), s)),
                            _ => (0..k).fold(0f32, |s, p| s + x(p) * y(p)),
                        };
                        assert_eq!(got.to_bits(), want.to_bits(), "avx2 {m}x{n}x{k} ({i},{j})");
                    }
                }
            }
        }
    }
}
