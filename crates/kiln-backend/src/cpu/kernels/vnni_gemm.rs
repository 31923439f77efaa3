//! Integer block products on AVX-512 VNNI (and NEON dotprod or i8mm) for prefill-sized
//! products over 8-bit weights marked `prefer_batches` (Whisper's encoder with `--quant q8_0`)
//! on CPUs without AMX tiles:
//! C (m, n) = A (m, k) · Wᵀ with W's rows quantized to int8 with one scale a row and A's rows
//! quantized on the fly to int8 with one scale a row (what CTranslate2 and ONNX Runtime's
//! dynamic quantization do). `vpdpbusd` multiplies unsigned by signed bytes, so A is stored
//! as q + 128 and 128 · Σ W[j] is taken off each sum: the integer sums are exact, and
//! C[i][j] = ((Σ (qa + 128) qw) - 128 Σ qw) · sa[i] · sw[j] in f32. NEON's `sdot` multiplies
//! signed by signed: there A holds qa itself ([`OFFSET`] 0) and the lane-indexed form takes
//! each row's four bytes of a step from one 16-byte load (four steps). NEON i8mm's `smmla`
//! multiplies a 2 x 8 block of A by an 8 x 2 block of W into a 2 x 2 block of sums (twice
//! `sdot`'s products an instruction), signed by signed as `sdot`: the same exact sums.
//!
//! Layouts: A row-major u8, rows padded to a multiple of [`MB`] (with q = 0), `k` to
//! [`KP`] (q = 0 against zero weights); W packed in 16-row blocks, each block's k in steps
//! of 4: 64 bytes a step, lane j holding row j's four bytes, so one load is the step's
//! vector (for i8mm, steps of 8: 128 bytes a step, rows 2i and 2i + 1's eight bytes each
//! in turn, so each 16 bytes are one `smmla` operand). Output comes in 32 x 32 f32 blocks
//! for the caller's epilogue, as the bf16 block products do ([`super::amx::gemm`]).

use super::amx::{round_up, MB, NB};

/// k is padded to a multiple of this (a 64-byte step of each row).
pub const KP: usize = 64;
/// Rows of W per packed block (lanes of a vector).
const TN: usize = 16;

/// What A's bytes carry on top of the quantized value: `vpdpbusd` takes unsigned bytes.
#[cfg(target_arch = "x86_64")]
const OFFSET: i32 = 128;
#[cfg(not(target_arch = "x86_64"))]
const OFFSET: i32 = 0;

/// The instruction set the products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F, BW and VNNI (allowed by the AVX-512 switch).
    Avx512,
    /// AVX-VNNI: `vpdpbusd` on 256-bit vectors (Intel client cores without AVX-512).
    AvxVnni,
    /// NEON dotprod (`sdot`).
    Dotprod,
    /// NEON i8mm (`smmla`), with dotprod.
    I8mm,
}

impl Isa {
    /// The kernel set's name (what `KILN_REQUIRE_KERNELS` asks for).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512-vnni-gemm",
            Isa::AvxVnni => "avx-vnni-gemm",
            Isa::Dotprod => "neon-dotprod-gemm",
            Isa::I8mm => "neon-i8mm-gemm",
        }
    }
}

/// The set these products run on here, if any.
pub fn isa() -> Option<Isa> {
    use std::sync::OnceLock;
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if super::avx512_allowed() && has!("avx512bw") && has!("avx512vnni") {
                return Some(Isa::Avx512);
            }
            if super::avx_vnni_allowed() {
                return Some(Isa::AvxVnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if !super::simd_disabled() && std::arch::is_aarch64_feature_detected!("dotprod") {
            if std::arch::is_aarch64_feature_detected!("i8mm") {
                return Some(Isa::I8mm);
            }
            return Some(Isa::Dotprod);
        }
        None
    })
}

/// Whether these products run here.
pub fn available() -> bool {
    isa().is_some()
}

/// W (n rows of k) as int8, one scale a row, in vector order.
#[derive(Debug, Clone, Default)]
pub struct PackedI8 {
    pub data: Vec<i8>,
    /// Each row's scale (max |w| / 127), `np` of them (zeros past n).
    pub scale: Vec<f32>,
    /// [`OFFSET`] · Σ q over each row: what the offset of A's bytes adds to every sum.
    pub corr: Vec<i32>,
    pub k: usize,
    pub n: usize,
    pub kp: usize,
    pub np: usize,
    /// W in `smmla`'s steps of 8 (row pairs) rather than steps of 4 (packed so only where
    /// [`Isa::I8mm`] runs).
    pub pairs: bool,
}

/// x (finite) to int8 with `inv` = 1 / scale: round to nearest even, clamped to ±127.
#[inline(always)]
fn q8(x: f32, inv: f32) -> i8 {
    (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8
}

impl PackedI8 {
    /// Packs W from its rows for this CPU's set: `row(j, buf)` writes W[j][..k].
    pub fn from_rows(n: usize, k: usize, row: impl FnMut(usize, &mut [f32])) -> Self {
        Self::from_rows_for(isa() == Some(Isa::I8mm), n, k, row)
    }

    /// [`from_rows`](Self::from_rows) in row pairs (`pairs`: for `smmla`) or in steps of 4.
    fn from_rows_for(
        pairs: bool,
        n: usize,
        k: usize,
        mut row: impl FnMut(usize, &mut [f32]),
    ) -> Self {
        let (kp, np) = (round_up(k.max(1), KP), round_up(n.max(1), NB));
        let mut p = PackedI8 {
            data: vec![0; np * kp],
            scale: vec![0.0; np],
            corr: vec![0; np],
            k,
            n,
            kp,
            np,
            pairs,
        };
        let (mut buf, mut q) = (vec![0f32; k], vec![0u8; k]);
        for j in 0..n {
            row(j, &mut buf);
            // The activations' rounding (vectorized where it is): the same q and scale.
            let scale = quantize_one(&buf, &mut q);
            let (blk, lane) = (j / TN, j % TN);
            let base = blk * TN * kp;
            let mut sum = 0i32;
            for (kk, &b) in q.iter().enumerate() {
                let v = (b as i32 - OFFSET) as i8;
                sum += v as i32;
                let at = match pairs {
                    true => (kk / 8) * 8 * TN + (lane / 2) * 16 + (lane % 2) * 8 + kk % 8,
                    false => (kk / 4) * 4 * TN + lane * 4 + kk % 4,
                };
                p.data[base + at] = v;
            }
            p.scale[j] = scale;
            p.corr[j] = OFFSET * sum;
        }
        p
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + self.np * 8
    }
}

/// Rows `x[i * ldx ..][..k]` for i < m as q + [`OFFSET`] bytes into `a` (`round_up(m, MB)`
/// rows of `kp`, padding q = 0) and their scales into `sa` (one a row, zeros for padding).
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
    a.resize(mp * kp, OFFSET as u8);
    sa.clear();
    sa.resize(mp, 0.0);
    for i in 0..m {
        sa[i] = quantize_one(&x[i * ldx..i * ldx + k], &mut a[i * kp..i * kp + k]);
    }
}

/// One row as q + [`OFFSET`] bytes; returns its scale.
fn quantize_one(src: &[f32], dst: &mut [u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: AVX-512F/BW were detected; both rows hold k values.
        Some(Isa::Avx512) => return unsafe { quantize_row_512(src, dst) },
        // SAFETY: AVX2 and FMA were detected.
        Some(Isa::AvxVnni) => return unsafe { quantize_row_avx2(src, dst) },
        _ => {}
    }
    quantize_row(src, dst)
}

/// One row of [`quantize_rows`]; returns its scale.
#[inline(always)]
fn quantize_row(src: &[f32], dst: &mut [u8]) -> f32 {
    {
        let max = src.iter().fold(0f32, |m, v| m.max(v.abs()));
        if max == 0.0 {
            return 0.0;
        }
        let inv = 127.0 / max;
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = (q8(v, inv) as i32 + OFFSET) as u8;
        }
        max / 127.0
    }
}

/// [`quantize_row`] compiled for AVX2 (vectorized: the rounding is `vroundps`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(src: &[f32], dst: &mut [u8]) -> f32 {
    quantize_row(src, dst)
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

pub use super::amx::Block;

/// C (m, columns j0..j1) = A · Wᵀ for A's rows 0..m (`a`, `sa` from [`quantize_rows`] with
/// `b.kp`), by 32 x 32 blocks handed to `emit(i0, j0, block)` (row-major, 32 wide; rows
/// past m hold zeros). `j0`, `j1` multiples of [`NB`], `j1 <= b.np`.
///
/// # Safety
/// [`available`] returned true, and `b` was packed by [`PackedI8::from_rows`] in this
/// process.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_cols(
    a: &[u8],
    sa: &[f32],
    m: usize,
    b: &PackedI8,
    j0: usize,
    j1: usize,
    c: &mut Block,
    emit: impl FnMut(usize, usize, &[f32]),
) {
    assert!(
        j0 % NB == 0 && j1 % NB == 0 && j1 <= b.np,
        "gemm_cols range"
    );
    let (kp, mp) = (b.kp, round_up(m.max(1), MB));
    assert!(a.len() >= mp * kp && sa.len() >= mp && b.data.len() >= b.np * kp);
    let mut sums = Sums([0; R * NB]);
    let strip_of = |r0: usize, nb: usize, rows: &mut [f32]| {
        let cols = nb * TN;
        // SAFETY: rows r0..r0+8 of `a` and the two packed blocks lie inside the operands
        // (checked above); the set was detected (caller).
        unsafe {
            let (a, b0) = (a.as_ptr().add(r0 * kp), b.data.as_ptr().add(cols * kp));
            #[cfg(target_arch = "aarch64")]
            if b.pairs {
                strip_mm(a, kp, b0, b0.add(TN * kp), kp / 16, &mut sums);
            } else {
                strip(a, kp, b0, b0.add(TN * kp), kp / 4, &mut sums);
            }
            #[cfg(target_arch = "x86_64")]
            strip(a, kp, b0, b0.add(TN * kp), kp / 4, &mut sums);
            finish(
                &sums,
                &sa[r0..r0 + R],
                &b.scale[cols..cols + NB],
                &b.corr[cols..cols + NB],
                rows,
            );
        }
    };
    super::amx::strips(m, j0, j1, c, strip_of, emit)
}

/// Elsewhere [`available`] is false, so this is never called.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
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
    unreachable!("no integer block products on this architecture")
}

/// Rows of C per strip.
const R: usize = super::amx::STRIP;

#[repr(C, align(64))]
struct Sums([i32; R * NB]);

/// c[r][j] = (sums[r][j] - corr[j]) · sa[r] · sw[j], 8 rows of 32 (left to the vectorizer).
#[inline(always)]
fn finish_body(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
    for r in 0..R {
        for j in 0..NB {
            c[r * NB + j] = (sums.0[r * NB + j] - corr[j]) as f32 * sa[r] * sw[j];
        }
    }
}

/// [`finish_body`] with NEON (the baseline there).
#[cfg(target_arch = "aarch64")]
unsafe fn finish(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
    finish_body(sums, sa, sw, corr, c)
}

/// c[r][j] = (sums[r][j] - corr[j]) · sa[r] · sw[j], 8 rows of 32.
#[cfg(target_arch = "x86_64")]
unsafe fn finish(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
    // SAFETY: the set was detected (caller).
    unsafe {
        match isa() {
            Some(Isa::Avx512) => finish_512(sums, sa, sw, corr, c),
            _ => finish_avx2(sums, sa, sw, corr, c),
        }
    }
}

/// [`finish`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish_avx2(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
    finish_body(sums, sa, sw, corr, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn finish_512(sums: &Sums, sa: &[f32], sw: &[f32], corr: &[i32], c: &mut [f32]) {
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
    if isa() == Some(Isa::AvxVnni) {
        for (half, b) in [b0, b1].into_iter().enumerate() {
            for rows in [0, 4] {
                // SAFETY: as for the whole strip (caller); AVX-VNNI was detected.
                unsafe {
                    piece_vex(
                        a.add(rows * lda),
                        lda,
                        b,
                        steps,
                        out.0.as_mut_ptr().add(rows * NB + half * TN),
                    )
                };
            }
        }
        return;
    }
    let lda = lda as isize;
    // SAFETY: the caller bounds every read (steps * 4 bytes of 8 rows and of each block's
    // 16 rows) and `out` holds the 8 x 32 sums; AVX-512 VNNI is present (caller).
    unsafe {
        super::strip_8x32!("vpdpbusd", a, lda, b0, b1, steps, out.0.as_mut_ptr());
    }
}

/// AVX-VNNI: 4 rows of A (`lda` bytes apart) · one packed 16-row block into c (4 rows of 16
/// i32, `NB` apart): 8 accumulators, per step the block's 64 bytes in two vectors and each
/// row's 4 bytes broadcast.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn piece_vex(a: *const u8, lda: usize, b: *const i8, steps: usize, c: *mut i32) {
    use std::arch::x86_64::*;
    // SAFETY: the caller bounds every read and the 4 x 16 values written.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 2]; 4];
        for q in 0..steps {
            let w0 = _mm256_loadu_si256(b.add(64 * q) as *const _);
            let w1 = _mm256_loadu_si256(b.add(64 * q + 32) as *const _);
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_epi32((a.add(r * lda + 4 * q) as *const i32).read_unaligned());
                acc[0] = _mm256_dpbusd_avx_epi32(acc[0], x, w0);
                acc[1] = _mm256_dpbusd_avx_epi32(acc[1], x, w1);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_si256(c.add(r * NB) as *mut _, acc[0]);
            _mm256_storeu_si256(c.add(r * NB + 8) as *mut _, acc[1]);
        }
    }
}

/// NEON dotprod: the 8 x 32 sums of [`strip`] as four 4-row x 16-column pieces, each
/// 16 accumulators (v0-v15: row r, columns 4c..4c+4 in v(4r + c)); per four steps one
/// 16-byte load of each row (v20-v23) and per step one 64-byte load of the block (v16-v19),
/// `sdot` taking the step's 4 bytes of a row by lane.
#[cfg(target_arch = "aarch64")]
#[inline]
unsafe fn strip(
    a: *const u8,
    lda: usize,
    b0: *const i8,
    b1: *const i8,
    steps: usize,
    out: &mut Sums,
) {
    debug_assert!(steps > 0 && steps % 4 == 0);
    for (half, b) in [b0, b1].into_iter().enumerate() {
        for rows in [0, 4] {
            // SAFETY: the caller bounds every read (steps * 4 bytes of rows `rows..rows + 4`
            // and of the block's 16 rows) and `out` holds the 8 x 32 sums.
            unsafe {
                piece(
                    a.add(rows * lda),
                    lda,
                    b,
                    steps / 4,
                    out.0.as_mut_ptr().add(rows * NB + half * TN),
                )
            };
        }
    }
}

/// 4 rows of A (`lda` apart) · one packed 16-row block over `quads` x 4 steps into c (4 rows
/// of 16 i32, `NB` apart).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn piece(a: *const u8, lda: usize, b: *const i8, quads: usize, c: *mut i32) {
    // SAFETY: as the caller promises.
    unsafe {
        std::arch::asm!(
            "movi v0.4s, #0",
            "movi v1.4s, #0",
            "movi v2.4s, #0",
            "movi v3.4s, #0",
            "movi v4.4s, #0",
            "movi v5.4s, #0",
            "movi v6.4s, #0",
            "movi v7.4s, #0",
            "movi v8.4s, #0",
            "movi v9.4s, #0",
            "movi v10.4s, #0",
            "movi v11.4s, #0",
            "movi v12.4s, #0",
            "movi v13.4s, #0",
            "movi v14.4s, #0",
            "movi v15.4s, #0",
            "2:",
            "ld1 {{v20.16b}}, [{a0}], #16",
            "ld1 {{v21.16b}}, [{a1}], #16",
            "ld1 {{v22.16b}}, [{a2}], #16",
            "ld1 {{v23.16b}}, [{a3}], #16",
            "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{b}], #64",
            "sdot v0.4s, v16.16b, v20.4b[0]",
            "sdot v1.4s, v17.16b, v20.4b[0]",
            "sdot v2.4s, v18.16b, v20.4b[0]",
            "sdot v3.4s, v19.16b, v20.4b[0]",
            "sdot v4.4s, v16.16b, v21.4b[0]",
            "sdot v5.4s, v17.16b, v21.4b[0]",
            "sdot v6.4s, v18.16b, v21.4b[0]",
            "sdot v7.4s, v19.16b, v21.4b[0]",
            "sdot v8.4s, v16.16b, v22.4b[0]",
            "sdot v9.4s, v17.16b, v22.4b[0]",
            "sdot v10.4s, v18.16b, v22.4b[0]",
            "sdot v11.4s, v19.16b, v22.4b[0]",
            "sdot v12.4s, v16.16b, v23.4b[0]",
            "sdot v13.4s, v17.16b, v23.4b[0]",
            "sdot v14.4s, v18.16b, v23.4b[0]",
            "sdot v15.4s, v19.16b, v23.4b[0]",
            "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{b}], #64",
            "sdot v0.4s, v16.16b, v20.4b[1]",
            "sdot v1.4s, v17.16b, v20.4b[1]",
            "sdot v2.4s, v18.16b, v20.4b[1]",
            "sdot v3.4s, v19.16b, v20.4b[1]",
            "sdot v4.4s, v16.16b, v21.4b[1]",
            "sdot v5.4s, v17.16b, v21.4b[1]",
            "sdot v6.4s, v18.16b, v21.4b[1]",
            "sdot v7.4s, v19.16b, v21.4b[1]",
            "sdot v8.4s, v16.16b, v22.4b[1]",
            "sdot v9.4s, v17.16b, v22.4b[1]",
            "sdot v10.4s, v18.16b, v22.4b[1]",
            "sdot v11.4s, v19.16b, v22.4b[1]",
            "sdot v12.4s, v16.16b, v23.4b[1]",
            "sdot v13.4s, v17.16b, v23.4b[1]",
            "sdot v14.4s, v18.16b, v23.4b[1]",
            "sdot v15.4s, v19.16b, v23.4b[1]",
            "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{b}], #64",
            "sdot v0.4s, v16.16b, v20.4b[2]",
            "sdot v1.4s, v17.16b, v20.4b[2]",
            "sdot v2.4s, v18.16b, v20.4b[2]",
            "sdot v3.4s, v19.16b, v20.4b[2]",
            "sdot v4.4s, v16.16b, v21.4b[2]",
            "sdot v5.4s, v17.16b, v21.4b[2]",
            "sdot v6.4s, v18.16b, v21.4b[2]",
            "sdot v7.4s, v19.16b, v21.4b[2]",
            "sdot v8.4s, v16.16b, v22.4b[2]",
            "sdot v9.4s, v17.16b, v22.4b[2]",
            "sdot v10.4s, v18.16b, v22.4b[2]",
            "sdot v11.4s, v19.16b, v22.4b[2]",
            "sdot v12.4s, v16.16b, v23.4b[2]",
            "sdot v13.4s, v17.16b, v23.4b[2]",
            "sdot v14.4s, v18.16b, v23.4b[2]",
            "sdot v15.4s, v19.16b, v23.4b[2]",
            "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{b}], #64",
            "sdot v0.4s, v16.16b, v20.4b[3]",
            "sdot v1.4s, v17.16b, v20.4b[3]",
            "sdot v2.4s, v18.16b, v20.4b[3]",
            "sdot v3.4s, v19.16b, v20.4b[3]",
            "sdot v4.4s, v16.16b, v21.4b[3]",
            "sdot v5.4s, v17.16b, v21.4b[3]",
            "sdot v6.4s, v18.16b, v21.4b[3]",
            "sdot v7.4s, v19.16b, v21.4b[3]",
            "sdot v8.4s, v16.16b, v22.4b[3]",
            "sdot v9.4s, v17.16b, v22.4b[3]",
            "sdot v10.4s, v18.16b, v22.4b[3]",
            "sdot v11.4s, v19.16b, v22.4b[3]",
            "sdot v12.4s, v16.16b, v23.4b[3]",
            "sdot v13.4s, v17.16b, v23.4b[3]",
            "sdot v14.4s, v18.16b, v23.4b[3]",
            "sdot v15.4s, v19.16b, v23.4b[3]",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            "st1 {{v0.4s, v1.4s, v2.4s, v3.4s}}, [{c}]",
            "add {c}, {c}, #128",
            "st1 {{v4.4s, v5.4s, v6.4s, v7.4s}}, [{c}]",
            "add {c}, {c}, #128",
            "st1 {{v8.4s, v9.4s, v10.4s, v11.4s}}, [{c}]",
            "add {c}, {c}, #128",
            "st1 {{v12.4s, v13.4s, v14.4s, v15.4s}}, [{c}]",
            "add {c}, {c}, #128",
            a0 = inout(reg) a => _,
            a1 = inout(reg) a.add(lda) => _,
            a2 = inout(reg) a.add(2 * lda) => _,
            a3 = inout(reg) a.add(3 * lda) => _,
            b = inout(reg) b => _,
            n = inout(reg) quads => _,
            c = inout(reg) c => _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            options(nostack),
        );
    }
}

/// NEON i8mm: the 8 x 32 sums of [`strip`] from blocks packed in row pairs, as four 8-row x
/// 8-column pieces.
#[cfg(target_arch = "aarch64")]
#[inline]
unsafe fn strip_mm(
    a: *const u8,
    lda: usize,
    b0: *const i8,
    b1: *const i8,
    iters: usize,
    out: &mut Sums,
) {
    debug_assert!(iters > 0);
    for (half, b) in [b0, b1].into_iter().enumerate() {
        for cols in [0, 8] {
            // SAFETY: the caller bounds every read (iters * 16 bytes of 8 rows and of the
            // block's 16 rows) and `out` holds the 8 x 32 sums; i8mm is present (the blocks
            // were packed in pairs only then).
            unsafe {
                piece_mm(
                    a,
                    lda,
                    b.add(cols * 8),
                    iters,
                    out.0.as_mut_ptr().add(half * TN + cols),
                )
            };
        }
    }
}

/// 8 rows of A (`lda` apart) · 8 rows of W (columns `cols..cols + 8` of a block packed in
/// row pairs, at `b`: 64 of each step's 128 bytes) over `iters` x 16 k into c (8 rows of 8
/// i32, `NB` apart). Accumulators v0-v15: rows 2r, 2r + 1 by columns 2j, 2j + 1 in v(4r + j)
/// as `smmla` leaves them ((2r, 2j), (2r, 2j + 1), (2r + 1, 2j), (2r + 1, 2j + 1)). Per 16 k
/// one 16-byte load of each row (v16-v23), zipped into row pairs (v24-v31: k 0-7 of rows
/// 2r, 2r + 1 in v(24 + 2r), k 8-15 in v(25 + 2r)), then per 8 k the four column pairs
/// (v16-v19, then v20-v23) and 16 `smmla`. The stores unzip each row pair into two rows.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,i8mm")]
unsafe fn piece_mm(a: *const u8, lda: usize, b: *const i8, iters: usize, c: *mut i32) {
    // SAFETY: as the caller promises.
    unsafe {
        std::arch::asm!(
            "movi v0.4s, #0",
            "movi v1.4s, #0",
            "movi v2.4s, #0",
            "movi v3.4s, #0",
            "movi v4.4s, #0",
            "movi v5.4s, #0",
            "movi v6.4s, #0",
            "movi v7.4s, #0",
            "movi v8.4s, #0",
            "movi v9.4s, #0",
            "movi v10.4s, #0",
            "movi v11.4s, #0",
            "movi v12.4s, #0",
            "movi v13.4s, #0",
            "movi v14.4s, #0",
            "movi v15.4s, #0",
            "2:",
            "ld1 {{v16.16b}}, [{a0}], #16",
            "ld1 {{v17.16b}}, [{a1}], #16",
            "ld1 {{v18.16b}}, [{a2}], #16",
            "ld1 {{v19.16b}}, [{a3}], #16",
            "ld1 {{v20.16b}}, [{a4}], #16",
            "ld1 {{v21.16b}}, [{a5}], #16",
            "ld1 {{v22.16b}}, [{a6}], #16",
            "ld1 {{v23.16b}}, [{a7}], #16",
            "zip1 v24.2d, v16.2d, v17.2d",
            "zip2 v25.2d, v16.2d, v17.2d",
            "zip1 v26.2d, v18.2d, v19.2d",
            "zip2 v27.2d, v18.2d, v19.2d",
            "zip1 v28.2d, v20.2d, v21.2d",
            "zip2 v29.2d, v20.2d, v21.2d",
            "zip1 v30.2d, v22.2d, v23.2d",
            "zip2 v31.2d, v22.2d, v23.2d",
            "ld1 {{v16.16b, v17.16b, v18.16b, v19.16b}}, [{b}], {bs}",
            "smmla v0.4s, v24.16b, v16.16b",
            "smmla v1.4s, v24.16b, v17.16b",
            "smmla v2.4s, v24.16b, v18.16b",
            "smmla v3.4s, v24.16b, v19.16b",
            "smmla v4.4s, v26.16b, v16.16b",
            "smmla v5.4s, v26.16b, v17.16b",
            "smmla v6.4s, v26.16b, v18.16b",
            "smmla v7.4s, v26.16b, v19.16b",
            "smmla v8.4s, v28.16b, v16.16b",
            "smmla v9.4s, v28.16b, v17.16b",
            "smmla v10.4s, v28.16b, v18.16b",
            "smmla v11.4s, v28.16b, v19.16b",
            "smmla v12.4s, v30.16b, v16.16b",
            "smmla v13.4s, v30.16b, v17.16b",
            "smmla v14.4s, v30.16b, v18.16b",
            "smmla v15.4s, v30.16b, v19.16b",
            "ld1 {{v20.16b, v21.16b, v22.16b, v23.16b}}, [{b}], {bs}",
            "smmla v0.4s, v25.16b, v20.16b",
            "smmla v1.4s, v25.16b, v21.16b",
            "smmla v2.4s, v25.16b, v22.16b",
            "smmla v3.4s, v25.16b, v23.16b",
            "smmla v4.4s, v27.16b, v20.16b",
            "smmla v5.4s, v27.16b, v21.16b",
            "smmla v6.4s, v27.16b, v22.16b",
            "smmla v7.4s, v27.16b, v23.16b",
            "smmla v8.4s, v29.16b, v20.16b",
            "smmla v9.4s, v29.16b, v21.16b",
            "smmla v10.4s, v29.16b, v22.16b",
            "smmla v11.4s, v29.16b, v23.16b",
            "smmla v12.4s, v31.16b, v20.16b",
            "smmla v13.4s, v31.16b, v21.16b",
            "smmla v14.4s, v31.16b, v22.16b",
            "smmla v15.4s, v31.16b, v23.16b",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            "zip1 v16.2d, v0.2d, v1.2d",
            "zip1 v17.2d, v2.2d, v3.2d",
            "zip2 v18.2d, v0.2d, v1.2d",
            "zip2 v19.2d, v2.2d, v3.2d",
            "st1 {{v16.4s, v17.4s}}, [{c}], {cs}",
            "st1 {{v18.4s, v19.4s}}, [{c}], {cs}",
            "zip1 v16.2d, v4.2d, v5.2d",
            "zip1 v17.2d, v6.2d, v7.2d",
            "zip2 v18.2d, v4.2d, v5.2d",
            "zip2 v19.2d, v6.2d, v7.2d",
            "st1 {{v16.4s, v17.4s}}, [{c}], {cs}",
            "st1 {{v18.4s, v19.4s}}, [{c}], {cs}",
            "zip1 v16.2d, v8.2d, v9.2d",
            "zip1 v17.2d, v10.2d, v11.2d",
            "zip2 v18.2d, v8.2d, v9.2d",
            "zip2 v19.2d, v10.2d, v11.2d",
            "st1 {{v16.4s, v17.4s}}, [{c}], {cs}",
            "st1 {{v18.4s, v19.4s}}, [{c}], {cs}",
            "zip1 v16.2d, v12.2d, v13.2d",
            "zip1 v17.2d, v14.2d, v15.2d",
            "zip2 v18.2d, v12.2d, v13.2d",
            "zip2 v19.2d, v14.2d, v15.2d",
            "st1 {{v16.4s, v17.4s}}, [{c}], {cs}",
            "st1 {{v18.4s, v19.4s}}, [{c}]",
            a0 = inout(reg) a => _,
            a1 = inout(reg) a.add(lda) => _,
            a2 = inout(reg) a.add(2 * lda) => _,
            a3 = inout(reg) a.add(3 * lda) => _,
            a4 = inout(reg) a.add(4 * lda) => _,
            a5 = inout(reg) a.add(5 * lda) => _,
            a6 = inout(reg) a.add(6 * lda) => _,
            a7 = inout(reg) a.add(7 * lda) => _,
            b = inout(reg) b => _,
            bs = in(reg) 8 * TN,
            cs = in(reg) 4 * NB,
            n = inout(reg) iters => _,
            c = inout(reg) c => _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _,
            out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _,
            out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _,
            out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            options(nostack),
        );
    }
}

/// Checks the products on this CPU's set against the scalar form of the same quantized
/// product (bit for bit: the integer sums are exact and the scaling is the same f32
/// arithmetic) and against the f32 product (int8 rounding of both operands); panics on a
/// difference. For the tests of each set (which a process picks once); where i8mm runs,
/// the dotprod kernel (W in steps of 4) is checked too, so both give the same sums.
#[doc(hidden)]
pub fn check_against_scalar() {
    assert!(available(), "no integer block products here");
    let mut rnd = super::amx::check_values(0x1234_5679);
    let layouts: &[bool] = match isa() {
        Some(Isa::I8mm) => &[true, false],
        _ => &[false],
    };
    for (m, n, k) in [
        (1, 1, 1),
        (33, 17, 40),
        (64, 64, 64),
        (70, 100, 250),
        (5, 48, 1536),
        (9, 47, 129),
        (40, 33, 17),
    ] {
        let mut x: Vec<f32> = (0..m * k).map(|_| rnd() * 3.0).collect();
        x[..k.min(3)].fill(0.0);
        if m > 1 {
            // A row of zeros: scale 0.
            x[k..2 * k].fill(0.0);
        }
        let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        for &pairs in layouts {
            let w_row = |j: usize, r: &mut [f32]| r.copy_from_slice(&w[j * k..(j + 1) * k]);
            let b = PackedI8::from_rows_for(pairs, n, k, w_row);
            check_one(&x, &w, m, n, k, &b);
        }
    }
}

/// [`check_against_scalar`] for one packed W.
fn check_one(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, b: &PackedI8) {
    let (mut a, mut sa) = (Vec::new(), Vec::new());
    quantize_rows(x, k, m, k, b.kp, &mut a, &mut sa);
    let mut blk = Block::default();
    let c = super::amx::check_gather(m, n, b.np, |j_lo, emit| {
        // SAFETY: the set was checked by the caller; the operands are built whole.
        unsafe { gemm_cols(&a, &sa, m, b, j_lo, b.np, &mut blk, emit) }
    });
    let layout = if b.pairs { "row pairs" } else { "steps of 4" };
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
                "{m}x{n}x{k} ({i},{j}), W in {layout}"
            );
            // And near the f32 product (int8 rounding of both operands).
            let exact: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
            let bound = 0.02 * max * (k as f32).sqrt();
            assert!((want - exact).abs() <= bound, "{want} vs {exact}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gemm_equals_the_scalar_quantized_product() {
        if !super::available() {
            eprintln!("no integer block products here: skipped");
            return;
        }
        super::check_against_scalar();
    }
}
