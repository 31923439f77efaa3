/// Defines `fn $name(args) = $body(args)`, `$body` an `#[inline(always)]` function built for
/// the widest vectors this CPU and the options allow (AVX-512F; else AVX2 and FMA; else as
/// the crate is compiled): the compiler vectorizes the body for each build. An `unsafe fn`
/// carries `$body`'s contract to its callers.
macro_rules! widest {
    ($(#[$m:meta])* $vis:vis unsafe fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)?
        = $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis unsafe fn $name($($a: $t),*) $(-> $r)? {
            widest!(@call $body($($a: $t),*) $(-> $r)?)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)?
        = $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($a: $t),*) $(-> $r)? {
            widest!(@call $body($($a: $t),*) $(-> $r)?)
        }
    };
    (@call $body:ident($($a:ident: $t:ty),*) $(-> $r:ty)?) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            #[allow(clippy::too_many_arguments, unused_unsafe)]
            unsafe fn on_avx512($($a: $t),*) $(-> $r)? {
                // SAFETY: as the caller of the function `widest!` defined promises.
                unsafe { $body($($a),*) }
            }
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments, unused_unsafe)]
            unsafe fn on_avx2($($a: $t),*) $(-> $r)? {
                // SAFETY: as the caller of the function `widest!` defined promises.
                unsafe { $body($($a),*) }
            }
            if crate::cpu::kernels::avx512_allowed() {
                // SAFETY: the CPU has AVX-512F (checked); the rest as the caller promises.
                return unsafe { on_avx512($($a),*) };
            }
            if crate::cpu::ops::gemm::avx2_ok() {
                // SAFETY: the CPU has AVX2 and FMA (checked); the rest as the caller promises.
                return unsafe { on_avx2($($a),*) };
            }
        }
        // SAFETY: as the caller of the function `widest!` defined promises.
        #[allow(unused_unsafe)]
        unsafe { $body($($a),*) }
    }};
}

pub mod attention;
pub mod attention_amx;
pub mod attention_dense;
#[cfg(target_arch = "x86_64")]
mod attention_few;
#[cfg(target_arch = "x86_64")]
mod attention_tiled;
pub mod conv1d;
pub mod conv1d_amx;
pub mod conv1d_nc;
pub mod conv1d_q8;
pub mod elementwise;
pub mod gelu;
pub mod gemm;
pub mod kv_packed;
pub mod layer_norm;
pub mod lstm;
pub mod matmul;
pub mod matmul_amx;
pub mod mlx;
pub mod norm;
pub mod norm1d;
pub mod rope;
pub mod self_attention;
pub mod signal;
pub mod vmath;

/// Dot product with 8 independent accumulators (vectorizes, stable order per length).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// e^x for x in [-87, 88] (clamped outside), relative error ~1e-7, branch-free and free of
/// libm calls so loops over it vectorize: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two
/// for an exact n ln2), then e^x = 2^n e^r with e^r from its Taylor series to r^6.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer (ties to even) held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    let x = x.max(-87.0).min(88.0);
    let t = x * std::f32::consts::LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let n = t.to_bits().wrapping_sub(SHIFT.to_bits());
    f32::from_bits(p.to_bits().wrapping_add(n << 23))
}
