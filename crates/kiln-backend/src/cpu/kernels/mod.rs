//! Integer dot products of quantized weight rows with activations quantized on the fly to
//! 8-bit blocks ([`BlockQ8`]), chosen once at run time: AVX-512 VNNI, AVX2, NEON dotprod,
//! NEON, or the scalar reference (always kept, and forced with `KILN_NO_SIMD=1`).

pub mod amx;
pub mod f32_gemm;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_x8;
pub mod pack;
pub mod scalar;
pub mod tile;
pub mod vnni_gemm;
pub mod x8;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_x16;
#[cfg(target_arch = "x86_64")]
mod x86_x8;

/// An 8 x 32 strip of a block product in 16 AVX-512 accumulators: per step, one 64-byte row
/// of each of two packed 16-column blocks (zmm16-17) and each of 8 rows' 4 bytes broadcast
/// (zmm18-25), combined by `$op` (`vdpbf16ps`: bf16 pairs into f32; `vpdpbusd`: u8 x s8
/// quads into i32); the 8 x 32 sums stored at `$c` (rows 128 bytes apart). Rows of A are
/// `$lda` bytes apart, each step 4 bytes along them and 64 along the blocks.
#[cfg(target_arch = "x86_64")]
macro_rules! strip_8x32 {
    ($op:literal, $a:expr, $lda:expr, $b0:expr, $b1:expr, $steps:expr, $c:expr) => {
        std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4",
            "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6",
            "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10",
            "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12",
            "vpxord zmm13, zmm13, zmm13",
            "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "2:",
            "vmovups zmm16, [{b0}]",
            "vmovups zmm17, [{b1}]",
            "vpbroadcastd zmm18, [{a0}]",
            "vpbroadcastd zmm19, [{a0} + {lda}]",
            "vpbroadcastd zmm20, [{a0} + {lda} * 2]",
            "vpbroadcastd zmm21, [{a0} + {l3}]",
            "vpbroadcastd zmm22, [{a4}]",
            "vpbroadcastd zmm23, [{a4} + {lda}]",
            "vpbroadcastd zmm24, [{a4} + {lda} * 2]",
            "vpbroadcastd zmm25, [{a4} + {l3}]",
            concat!($op, " zmm0, zmm18, zmm16"),
            concat!($op, " zmm8, zmm18, zmm17"),
            concat!($op, " zmm1, zmm19, zmm16"),
            concat!($op, " zmm9, zmm19, zmm17"),
            concat!($op, " zmm2, zmm20, zmm16"),
            concat!($op, " zmm10, zmm20, zmm17"),
            concat!($op, " zmm3, zmm21, zmm16"),
            concat!($op, " zmm11, zmm21, zmm17"),
            concat!($op, " zmm4, zmm22, zmm16"),
            concat!($op, " zmm12, zmm22, zmm17"),
            concat!($op, " zmm5, zmm23, zmm16"),
            concat!($op, " zmm13, zmm23, zmm17"),
            concat!($op, " zmm6, zmm24, zmm16"),
            concat!($op, " zmm14, zmm24, zmm17"),
            concat!($op, " zmm7, zmm25, zmm16"),
            concat!($op, " zmm15, zmm25, zmm17"),
            "add {a0}, 4",
            "add {a4}, 4",
            "add {b0}, 64",
            "add {b1}, 64",
            "dec {n}",
            "jnz 2b",
            "vmovups [{c}], zmm0",
            "vmovups [{c} + 64], zmm8",
            "vmovups [{c} + 128], zmm1",
            "vmovups [{c} + 192], zmm9",
            "vmovups [{c} + 256], zmm2",
            "vmovups [{c} + 320], zmm10",
            "vmovups [{c} + 384], zmm3",
            "vmovups [{c} + 448], zmm11",
            "vmovups [{c} + 512], zmm4",
            "vmovups [{c} + 576], zmm12",
            "vmovups [{c} + 640], zmm5",
            "vmovups [{c} + 704], zmm13",
            "vmovups [{c} + 768], zmm6",
            "vmovups [{c} + 832], zmm14",
            "vmovups [{c} + 896], zmm7",
            "vmovups [{c} + 960], zmm15",
            a0 = inout(reg) $a => _,
            a4 = inout(reg) $a.wrapping_byte_offset(4 * $lda) => _,
            b0 = inout(reg) $b0 => _,
            b1 = inout(reg) $b1 => _,
            n = inout(reg) $steps => _,
            lda = in(reg) $lda,
            l3 = in(reg) 3 * $lda,
            c = in(reg) $c,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
            out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
            out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
            out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
            out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
            out("zmm24") _, out("zmm25") _,
            options(nostack),
        )
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use strip_8x32;

use std::sync::OnceLock;

use kiln_quant::GgmlType;

/// 32 activations as `d * qs[i]`, with the integer sums of each half (for weight offsets
/// and minimums, and Q6_K's 16-value groups).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockQ8 {
    pub d: f32,
    pub sums: [i16; 2],
    pub qs: [i8; 32],
}

impl BlockQ8 {
    pub fn sum(&self) -> i32 {
        self.sums[0] as i32 + self.sums[1] as i32
    }
}

/// Quantizes `x` (a multiple of 32 values) into `out` (x.len() / 32 blocks):
/// d = max|x| / 127, q = round(x / d) (ties to even).
pub fn quantize_act(x: &[f32], out: &mut [BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && !simd_disabled() {
        // SAFETY: AVX2 was detected.
        return unsafe { quantize_act_avx2(x, out) };
    }
    quantize_act_body(x, out)
}

/// `quantize_act_body` in AVX2: the same values (cvtps rounds to nearest, ties to even, as
/// the portable shift does), 32 at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_act_avx2(x: &[f32], out: &mut [BlockQ8]) {
    use std::arch::x86_64::*;
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        // SAFETY: xb holds 32 f32, b.qs 32 bytes; AVX2 was detected by the caller.
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let a = [
                _mm256_andnot_ps(sign, v[0]),
                _mm256_andnot_ps(sign, v[1]),
                _mm256_andnot_ps(sign, v[2]),
                _mm256_andnot_ps(sign, v[3]),
            ];
            let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
            let d = _mm_cvtss_f32(m) / 127.0;
            let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            let q = [
                _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id)),
                _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id)),
                _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id)),
                _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id)),
            ];
            // i32 -> i16 -> i8 packs interleave 128-bit lanes; the permute restores order.
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, w);
            // (A fn, not a closure: closures do not inherit target features.)
            #[inline(always)]
            unsafe fn hsum(v: __m256i) -> i32 {
                unsafe {
                    let s =
                        _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
                    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
                    _mm_cvtsi128_si32(s)
                }
            }
            let s0 = hsum(_mm256_add_epi32(q[0], q[1]));
            let s1 = hsum(_mm256_add_epi32(q[2], q[3]));
            b.d = d;
            b.sums = [s0 as i16, s1 as i16];
        }
    }
}

/// The portable quantizer (what `quantize_act` runs without SIMD); tests hold the SIMD
/// version to it exactly.
pub fn quantize_act_portable(x: &[f32], out: &mut [BlockQ8]) {
    quantize_act_body(x, out)
}

#[inline(always)]
fn quantize_act_body(x: &[f32], out: &mut [BlockQ8]) {
    // Adding and removing 1.5 * 2^23 rounds to the nearest integer (ties to even) for
    // |v| < 2^22, without a libm call, so the loop vectorizes.
    const ROUND: f32 = 12_582_912.0;
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0i32; 32];
        for (q, &v) in q.iter_mut().zip(xb) {
            *q = (((v * id) + ROUND) - ROUND).clamp(-127.0, 127.0) as i32;
        }
        let mut sums = [0i32; 2];
        for (i, (&v, o)) in q.iter().zip(b.qs.iter_mut()).enumerate() {
            *o = v as i8;
            sums[i / 16] += v;
        }
        b.d = d;
        b.sums = [sums[0] as i16, sums[1] as i16];
    }
}

/// Rows of activations quantized to 8-bit blocks, with each block's scale and integer sum
/// also laid out flat (so kernels load 8 block scales at once).
#[derive(Default)]
pub struct QuantAct {
    pub blocks: Vec<BlockQ8>,
    pub d: Vec<f32>,
    pub sum: Vec<f32>,
    /// d * sum per block.
    pub ds: Vec<f32>,
    /// 32 * the sum of each 16-value half, two per block (Q6_K's offset).
    pub h32: Vec<i32>,
    /// 8 * each block's sum (the 4-bit formats' offset, doubled for 5-bit ones).
    pub s8: Vec<i32>,
    nb: usize,
}

/// One row of [`QuantAct`].
#[derive(Clone, Copy, Default)]
pub struct ActRow<'a> {
    pub blocks: &'a [BlockQ8],
    pub d: &'a [f32],
    pub sum: &'a [f32],
    pub ds: &'a [f32],
    pub h32: &'a [i32],
    pub s8: &'a [i32],
}

impl QuantAct {
    /// Quantizes `n` rows of `cols` values (a multiple of 32) from `x`. Reuses its buffers.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        let nb = cols / 32;
        self.nb = nb;
        self.blocks.resize(n * nb, BlockQ8::default());
        self.d.resize(n * nb, 0.0);
        self.sum.resize(n * nb, 0.0);
        self.ds.resize(n * nb, 0.0);
        self.h32.resize(2 * n * nb, 0);
        self.s8.resize(n * nb, 0);
        for t in 0..n {
            let blocks = &mut self.blocks[t * nb..(t + 1) * nb];
            quantize_act(&x[t * cols..(t + 1) * cols], blocks);
        }
        // Each block's scale and sums in the layouts the kernels read, over zipped slices
        // (no index checks): the main thread runs this at every op while the workers wait.
        let blocks = &self.blocks[..n * nb];
        let h32 = self.h32.as_chunks_mut::<2>().0;
        let per_block = self.d.iter_mut().zip(&mut self.sum).zip(&mut self.ds);
        for (((b, ((d, sum), ds)), s8), h) in
            blocks.iter().zip(per_block).zip(&mut self.s8).zip(h32)
        {
            *d = b.d;
            *sum = b.sum() as f32;
            *ds = b.d * b.sum() as f32;
            *h = [32 * b.sums[0] as i32, 32 * b.sums[1] as i32];
            *s8 = 8 * b.sum();
        }
    }

    pub fn row(&self, t: usize) -> ActRow<'_> {
        let r = t * self.nb..(t + 1) * self.nb;
        ActRow {
            blocks: &self.blocks[r.clone()],
            d: &self.d[r.clone()],
            sum: &self.sum[r.clone()],
            ds: &self.ds[r.clone()],
            h32: &self.h32[2 * t * self.nb..2 * (t + 1) * self.nb],
            s8: &self.s8[r],
        }
    }
}

/// `dot(w_row, act)`: one weight row in kiln's packed layout for its format (see `pack`)
/// against its activation blocks.
pub type DotFn = unsafe fn(w: &[u8], a: ActRow) -> f32;

/// Four consecutive rows (`w` holds 4 x `row_bytes`) against the same activations.
pub type Dot4Fn = unsafe fn(w: &[u8], row_bytes: usize, a: ActRow, out: &mut [f32; 4]);

pub struct Kernels {
    pub name: &'static str,
    /// The set needs AVX-512 (`--no-avx512` passes it over).
    pub avx512: bool,
    /// Kernels over the eight-row interleaved layouts, where a set has them: weights of
    /// those formats are packed that way at load (`x8`).
    pub x8: Option<&'static x8::X8Kernels>,
    /// Four rows of a decoded tile (prefill), bit-identical to the four-row kernels; sets
    /// without one unpack per token.
    pub tile4: Option<tile::TileDotFn>,
    pub q4_0x4: Dot4Fn,
    pub q4_1x4: Dot4Fn,
    pub q8_0x4: Dot4Fn,
    pub q5_0x4: Dot4Fn,
    /// Four-row K-quant kernels, where a set has them.
    pub q4_kx4: Option<Dot4Fn>,
    pub q6_kx4: Option<Dot4Fn>,
    pub q5_1x4: Dot4Fn,
    pub q5_0: DotFn,
    pub q5_1: DotFn,
    pub q4_0: DotFn,
    pub q4_1: DotFn,
    pub q8_0: DotFn,
    pub q4_k: DotFn,
    pub q5_k: DotFn,
    pub q6_k: DotFn,
}

impl Kernels {
    /// The interleaved kernel for a weight format, if the set has one.
    pub fn x8_for(&self, ty: GgmlType) -> Option<x8::GemmFn> {
        self.x8.and_then(|k| k.for_type(ty))
    }

    /// The decoded-tile kernel for a weight format, if the set has one.
    pub fn tile4_for(&self, ty: GgmlType) -> Option<tile::TileDotFn> {
        self.tile4.filter(|_| tile::can_decode(ty))
    }

    /// The four-row kernel for a weight format, if it has one.
    pub fn dot4_for(&self, ty: GgmlType) -> Option<Dot4Fn> {
        use GgmlType::*;
        match ty {
            Q4_0 => Some(self.q4_0x4),
            Q4_1 => Some(self.q4_1x4),
            Q8_0 => Some(self.q8_0x4),
            Q5_0 => Some(self.q5_0x4),
            Q5_1 => Some(self.q5_1x4),
            Q4_K => self.q4_kx4,
            Q6_K => self.q6_kx4,
            F32 | F16 | BF16 | Q8_1 | Q2_K | Q3_K | Q5_K | Q8_K => None,
        }
    }

    /// The integer kernel for a weight format, if it has one.
    pub fn dot_for(&self, ty: GgmlType) -> Option<DotFn> {
        use GgmlType::*;
        match ty {
            Q4_0 => Some(self.q4_0),
            Q4_1 => Some(self.q4_1),
            Q8_0 => Some(self.q8_0),
            Q5_0 => Some(self.q5_0),
            Q5_1 => Some(self.q5_1),
            Q4_K => Some(self.q4_k),
            Q5_K => Some(self.q5_k),
            Q6_K => Some(self.q6_k),
            F32 | F16 | BF16 | Q8_1 | Q2_K | Q3_K | Q8_K => None,
        }
    }
}

pub static SCALAR: Kernels = Kernels {
    name: "scalar",
    avx512: false,
    x8: None,
    tile4: None,
    q4_0x4: scalar::dot4::<{ scalar::Q4_0 }>,
    q4_1x4: scalar::dot4::<{ scalar::Q4_1 }>,
    q8_0x4: scalar::dot4::<{ scalar::Q8_0 }>,
    q5_0x4: scalar::dot4::<{ scalar::Q5_0 }>,
    q4_kx4: None,
    q6_kx4: None,
    q5_1x4: scalar::dot4::<{ scalar::Q5_1 }>,
    q5_0: scalar::dot_q5_0,
    q5_1: scalar::dot_q5_1,
    q4_0: scalar::dot_q4_0,
    q4_1: scalar::dot_q4_1,
    q8_0: scalar::dot_q8_0,
    q4_k: scalar::dot_q4_k,
    q5_k: scalar::dot_q5_k,
    q6_k: scalar::dot_q6_k,
};

/// Whether the options ask for the scalar kernels (`--no-simd`, `KILN_NO_SIMD`).
pub fn simd_disabled() -> bool {
    crate::options::get().no_simd
}

/// Whether f32 code may use 512-bit vectors: AVX-512F is present, SIMD is on, and
/// the options (`--no-avx512`, `KILN_NO_AVX512`) do not ask for the AVX2 versions (to test them on AVX-512 machines).
/// Read once per process.
pub fn avx512_allowed() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let off = crate::options::get().no_avx512;
        #[cfg(target_arch = "x86_64")]
        return !simd_disabled() && !off && std::is_x86_feature_detected!("avx512f");
        #[allow(unreachable_code)]
        {
            let _ = off;
            false
        }
    })
}

/// Whether the AVX-VNNI (VEX) kernels may run: the CPU has them (with AVX2 and FMA), SIMD is
/// on and the options (`--no-avx-vnni`, `KILN_NO_AVX_VNNI`) do not ask for plain AVX2.
pub fn avx_vnni_allowed() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        !simd_disabled()
            && !crate::options::get().no_avx_vnni
            && has!("avx2")
            && has!("fma")
            && has!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The best kernels this CPU runs (detected once).
pub fn best() -> &'static Kernels {
    static BEST: OnceLock<&'static Kernels> = OnceLock::new();
    BEST.get_or_init(|| {
        if simd_disabled() {
            return &SCALAR;
        }
        detect().unwrap_or(&SCALAR)
    })
}

/// Every kernel set this CPU can run (tests compare each with the scalar reference).
pub fn available() -> Vec<&'static Kernels> {
    let mut v = vec![&SCALAR];
    #[cfg(target_arch = "x86_64")]
    v.extend(x86::available());
    #[cfg(target_arch = "aarch64")]
    v.extend(neon::available());
    v
}

fn detect() -> Option<&'static Kernels> {
    #[cfg(target_arch = "x86_64")]
    return x86::available()
        .into_iter()
        .find(|k| !k.avx512 || avx512_allowed());
    #[cfg(target_arch = "aarch64")]
    return neon::available().into_iter().next();
    #[allow(unreachable_code)]
    None
}
