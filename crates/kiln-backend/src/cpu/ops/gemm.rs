//! f32 block products for prefill-sized matrix products and attention over many positions:
//! C[i][..n] = Σ_p A[i][p] · B[p][..n] ("NN": B by rows of the k dimension). Each step
//! broadcasts one value of A over vectors of C's row held in registers (6 rows x 32 columns,
//! or 12 rows x 16 for narrow C), so results need no horizontal sums. Also the fp16 row dot
//! of decode-time products.

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
/// C is overwritten.
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

    /// 6 rows x 16 columns of C per block (12 accumulators); the column tail is scalar.
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
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i < m {
            let mi = (m - i).min(6);
            let cp = c.as_mut_ptr();
            for j in (0..n16).step_by(16) {
                unsafe {
                    match mi {
                        6 => block::<6>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                        5 => block::<5>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                        4 => block::<4>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                        3 => block::<3>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                        2 => block::<2>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                        _ => block::<1>(ap, lda, i, bp, ldb, j, k, cp, ldc),
                    }
                }
            }
            if n16 < n {
                super::nn_scalar(a, lda, i, i + mi, b, ldb, n16, n, k, c, ldc);
            }
            i += mi;
        }
    }

    #[target_feature(enable = "avx2,fma")]
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
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            for p in 0..k {
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
