//! Integer block products on AVX-512 VNNI for prefill-sized products over 8-bit weights
//! marked `prefer_batches` (Whisper's encoder with `--quant q8_0`) on CPUs without AMX tiles:
//! C (m, n) = A (m, k) · Wᵀ with W's rows quantized to int8 with one scale a row and A's rows
//! quantized on the fly to int8 with one scale a row (what CTranslate2 and ONNX Runtime's
//! dynamic quantization do). `vpdpbusd` multiplies unsigned by signed bytes, so A is stored
//! as q + 128 and 128 · Σ W[j] is taken off each sum: the integer sums are exact, and
//! C[i][j] = ((Σ (qa + 128) qw) - 128 Σ qw) · sa[i] · sw[j] in f32.
//!
//! Layouts: A row-major u8, rows padded to a multiple of [`MB`] (with q = 0), `k` to
//! [`KP`] (q = 0 against zero weights); W packed in 16-row blocks, each block's k in steps
//! of 4: 64 bytes a step, lane j holding row j's four bytes, so one load is the step's
//! vector. Output comes in 32 x 32 f32 blocks for the caller's epilogue, as the bf16 block
//! products do ([`super::amx::gemm`]).

use super::amx::{round_up, MB, NB};

/// k is padded to a multiple of this (a 64-byte step of each row).
pub const KP: usize = 64;
/// Rows of W per packed block (lanes of a vector).
const TN: usize = 16;

/// Whether these products run here: AVX-512F, BW and VNNI, allowed by the AVX-512 switch.
pub fn available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return super::avx512_allowed()
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni");
        #[allow(unreachable_code)]
        false
    })
}

/// W (n rows of k) as int8, one scale a row, in vector order.
#[derive(Debug, Clone, Default)]
pub struct PackedI8 {
    pub data: Vec<i8>,
    /// Each row's scale (max |w| / 127), `np` of them (zeros past n).
    pub scale: Vec<f32>,
    /// 128 · Σ q over each row: what the +128 of A's bytes adds to every sum.
    pub corr: Vec<i32>,
    pub k: usize,
    pub n: usize,
    pub kp: usize,
    pub np: usize,
}

/// x (finite) to int8 with `inv` = 1 / scale: round to nearest even, clamped to ±127.
#[inline(always)]
fn q8(x: f32, inv: f32) -> i8 {
    (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8
}

impl PackedI8 {
    /// Packs W from its rows: `row(j, buf)` writes W[j][..k].
    pub fn from_rows(n: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> Self {
        let (kp, np) = (round_up(k.max(1), KP), round_up(n.max(1), NB));
        let mut p = PackedI8 {
            data: vec![0; np * kp],
            scale: vec![0.0; np],
            corr: vec![0; np],
            k,
            n,
            kp,
            np,
        };
        let mut buf = vec![0f32; k];
        for j in 0..n {
            row(j, &mut buf);
            let max = buf.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = max / 127.0;
            let inv = if max > 0.0 { 127.0 / max } else { 0.0 };
            let (blk, lane) = (j / TN, j % TN);
            let base = blk * TN * kp;
            let mut sum = 0i32;
            for (kk, &v) in buf.iter().enumerate() {
                let q = q8(v, inv);
                sum += q as i32;
                p.data[base + (kk / 4) * 4 * TN + lane * 4 + kk % 4] = q;
            }
            p.scale[j] = scale;
            p.corr[j] = 128 * sum;
        }
        p
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + self.np * 8
    }
}

/// Rows `x[i * ldx ..][..k]` for i < m as q + 128 bytes into `a` (`round_up(m, MB)` rows of
/// `kp`, padding 128) and their scales into `sa` (one a row, zeros for padding rows).
pub fn quantize_rows(
    x: &[f32],
    ldx: usize,
    m: usize,
    k: usize,
    kp: usize,
    a: &mut Vec<u8>,
    sa: &mut Vec<f32>,
) {
    let mp = round_up(m.max(1), MB);
    a.clear();
    a.resize(mp * kp, 128);
    sa.clear();
    sa.resize(mp, 0.0);
    for i in 0..m {
        let src = &x[i * ldx..i * ldx + k];
        let dst = &mut a[i * kp..i * kp + k];
        #[cfg(target_arch = "x86_64")]
        if available() {
            // SAFETY: AVX-512F/BW were detected; both rows hold k values.
            sa[i] = unsafe { quantize_row_512(src, dst) };
            continue;
        }
        let max = src.iter().fold(0f32, |m, v| m.max(v.abs()));
        if max == 0.0 {
            continue;
        }
        let inv = 127.0 / max;
        sa[i] = max / 127.0;
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = (q8(v, inv) as i32 + 128) as u8;
        }
    }
}

/// One row of [`quantize_rows`] 16 lanes at a time (the conversion rounds to nearest even,
/// as `q8`); returns the row's scale.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_512(src: &[f32], dst: &mut [u8]) -> f32 {
    use std::arch::x86_64::*;
    let k = src.len();
    assert!(dst.len() >= k);
    let mask = |i: usize| -> __mmask16 {
        match k - i >= 16 {
            true => 0xffff,
            false => (1u16 << (k - i)) - 1,
        }
    };
    // SAFETY: every access is masked to the k values of both rows.
    unsafe {
        let sp = src.as_ptr();
        let mut mv = _mm512_setzero_ps();
        let mut i = 0;
        while i < k {
            let v = _mm512_maskz_loadu_ps(mask(i), sp.add(i));
            mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
            i += 16;
        }
        let max = _mm512_reduce_max_ps(mv);
        if max == 0.0 {
            return 0.0;
        }
        let inv = _mm512_set1_ps(127.0 / max);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let bias = _mm512_set1_epi32(128);
        let mut i = 0;
        while i < k {
            let m = mask(i);
            let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sp.add(i)), inv);
            let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
            let q = _mm512_add_epi32(_mm512_cvtps_epi32(v), bias);
            _mm_mask_storeu_epi8(
                dst.as_mut_ptr().add(i) as *mut i8,
                m,
                _mm512_cvtepi32_epi8(q),
            );
            i += 16;
        }
        max / 127.0
    }
}

/// A 32 x 32 block of C, 64-byte aligned.
#[repr(C, align(64))]
pub struct Block(pub [f32; MB * NB]);

impl Default for Block {
    fn default() -> Self {
        Block([0.0; MB * NB])
    }
}

/// C (m, columns j0..j1) = A · Wᵀ for A's rows 0..m (`a`, `sa` from [`quantize_rows`] with
/// `b.kp`), by 32 x 32 blocks handed to `emit(i0, j0, block)` (row-major, 32 wide; rows
/// past m hold zeros). `j0`, `j1` multiples of [`NB`], `j1 <= b.np`.
///
/// # Safety
/// [`available`] returned true.
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm_cols(
    a: &[u8],
    sa: &[f32],
    m: usize,
    b: &PackedI8,
    j0: usize,
    j1: usize,
    c: &mut Block,
    mut emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0 % NB == 0 && j1 % NB == 0 && j1 <= b.np,
        "gemm_cols range"
    );
    let (kp, mp) = (b.kp, round_up(m.max(1), MB));
    assert!(a.len() >= mp * kp && sa.len() >= mp && b.data.len() >= b.np * kp);
    let mut sums = Sums([0; R * NB]);
    for i0 in (0..mp).step_by(MB) {
        let strips = (m - i0).min(MB).div_ceil(R);
        if strips * R < MB {
            c.0[strips * R * NB..].fill(0.0);
        }
        for nb in (j0 / TN..j1 / TN).step_by(2) {
            // SAFETY: rows i0.. of `a` and the two packed blocks lie inside the operands
            // (checked above); AVX-512 VNNI is present (caller).
            unsafe {
                let b0 = b.data.as_ptr().add(nb * TN * kp);
                let b1 = b0.add(TN * kp);
                for s in 0..strips {
                    let r0 = i0 + s * R;
                    strip(a.as_ptr().add(r0 * kp), kp, b0, b1, kp / 4, &mut sums);
                    let cols = nb * TN;
                    finish(
                        &sums,
                        &sa[r0..r0 + R],
                        &b.scale[cols..cols + NB],
                        &b.corr[cols..cols + NB],
                        &mut c.0[s * R * NB..(s + 1) * R * NB],
                    );
                }
            }
            emit(i0, nb * TN, &c.0);
        }
    }
}

/// Without x86_64 there is no VNNI ([`available`] is false, so this is never called).
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    _: &[u8],
    _: &[f32],
    _: usize,
    _: &PackedI8,
    _: usize,
    _: usize,
    _: &mut Block,
    _: impl FnMut(usize, usize, &[f32]),
) {
    unreachable!("AVX-512 VNNI is x86_64 only")
}

/// Rows of C per strip.
const R: usize = 8;

#[repr(C, align(64))]
struct Sums([i32; R * NB]);

/// c[r][j] = (sums[r][j] - corr[j]) · sa[r] · sw[j], 8 rows of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn finish(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY: every slice holds what is read or written (8 rows x 32 columns).
    unsafe {
        for h in 0..2 {
            let w = _mm512_loadu_ps(sw.as_ptr().add(h * TN));
            let k = _mm512_loadu_si512(corr.as_ptr().add(h * TN) as _);
            for r in 0..R {
                let s = _mm512_load_si512(sums.0.as_ptr().add(r * NB + h * TN) as _);
                let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, k));
                let v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(sa[r])), w);
                _mm512_storeu_ps(c.as_mut_ptr().add(r * NB + h * TN), v);
            }
        }
    }
}

/// Integer sums of 8 rows of A (`lda` bytes apart) with two packed 16-row blocks of W, over
/// `steps` steps of 4 bytes: accumulators zmm0-7 (block 0) and zmm8-15 (block 1), the
/// step's two vectors in zmm16-17, each row's 4 bytes broadcast once.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn strip(
    a: *const u8,
    lda: usize,
    b0: *const i8,
    b1: *const i8,
    steps: usize,
    out: &mut Sums,
) {
    debug_assert!(steps > 0);
    let lda = lda as isize;
    // SAFETY: the caller bounds every read (steps * 4 bytes of 8 rows and of each block's
    // 16 rows) and `out` holds the 8 x 32 sums; AVX-512 VNNI is present (caller).
    unsafe {
        super::strip_8x32!("vpdpbusd", a, lda, b0, b1, steps, out.0.as_mut_ptr());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer sums are exact and the scaling is the same f32 arithmetic: the kernel
    /// equals the scalar form of the same quantized product bit for bit.
    #[test]
    fn gemm_equals_the_scalar_quantized_product() {
        if !available() {
            eprintln!("AVX-512 VNNI not available here: skipped");
            return;
        }
        let mut seed = 0x1234_5679u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        for (m, n, k) in [
            (1, 1, 1),
            (33, 17, 40),
            (64, 64, 64),
            (70, 100, 250),
            (5, 48, 1536),
        ] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rnd() * 3.0).collect();
            x[..k.min(3)].fill(0.0);
            if m > 1 {
                // A row of zeros: scale 0.
                x[k..2 * k].fill(0.0);
            }
            let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let b = PackedI8::from_rows(n, k, |j, r| r.copy_from_slice(&w[j * k..(j + 1) * k]));
            let (mut a, mut sa) = (Vec::new(), Vec::new());
            quantize_rows(&x, k, m, k, b.kp, &mut a, &mut sa);
            let mut c = vec![f32::NAN; m * n];
            let mut blk = Block::default();
            for j_lo in [0, b.np / NB / 2 * NB] {
                // SAFETY: available() was checked above.
                unsafe {
                    gemm_cols(&a, &sa, m, &b, j_lo, b.np, &mut blk, |i0, j0, bl| {
                        for i in i0..(i0 + MB).min(m) {
                            for j in j0..(j0 + NB).min(n) {
                                c[i * n + j] = bl[(i - i0) * NB + j - j0];
                            }
                        }
                    })
                };
            }
            for i in 0..m {
                let max = x[i * k..(i + 1) * k]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()));
                let inv = if max > 0.0 { 127.0 / max } else { 0.0 };
                for j in 0..n {
                    let wm = w[j * k..(j + 1) * k]
                        .iter()
                        .fold(0f32, |m, v| m.max(v.abs()));
                    let winv = if wm > 0.0 { 127.0 / wm } else { 0.0 };
                    let d: i32 = (0..k)
                        .map(|p| q8(x[i * k + p], inv) as i32 * q8(w[j * k + p], winv) as i32)
                        .sum();
                    let want = d as f32 * (max / 127.0) * (wm / 127.0);
                    assert_eq!(
                        c[i * n + j].to_bits(),
                        want.to_bits(),
                        "{m}x{n}x{k} ({i},{j})"
                    );
                    // And near the f32 product (int8 rounding of both operands).
                    let exact: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
                    let bound = 0.02 * max * (k as f32).sqrt();
                    assert!((want - exact).abs() <= bound, "{want} vs {exact}");
                }
            }
        }
    }
}
