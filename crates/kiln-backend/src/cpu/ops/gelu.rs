//! GELU, the exact form: gelu(x) = x · Φ(x) = x/2 · (1 + erf(x / √2)).

use crate::cpu::par::{Pool, SharedMut};
use crate::cpu::CpuTensor;

/// erf for f32 arguments: Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7 in exact
/// arithmetic; a few f32 ulps here), branch-free so loops over it vectorize.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let p = ((((1.061_405_4 * t - 1.453_152_1) * t) + 1.421_413_8) * t - 0.284_496_74) * t
        + 0.254_829_6;
    let y = 1.0 - p * t * super::exp(-a * a);
    y.copysign(x)
}

#[inline(always)]
pub fn gelu1(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// x = gelu(x) over the first n rows, in place, split over the pool's threads.
pub fn gelu(pool: &Pool, x: &mut CpuTensor, n: usize) {
    let len = n * x.cols;
    let p = SharedMut(x.data[..len].as_mut_ptr());
    const CHUNK: usize = 4096;
    let run = |a: usize, b: usize| {
        let p = p; // the whole wrapper (Sync), not its raw field
                   // SAFETY: a..b lies in the first len values and belongs to this caller alone.
        let v = unsafe { std::slice::from_raw_parts_mut(p.0.add(a), b - a) };
        gelu_in_place(v)
    };
    if len < 4 * CHUNK {
        return run(0, len);
    }
    pool.run_aligned(len, CHUNK, run);
}

/// gelu over a slice with the widest vectors this CPU has.
pub fn gelu_in_place(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::kernels::avx512_allowed() {
        // SAFETY: AVX-512F was detected on this CPU.
        return unsafe { gelu_avx512(v) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::gemm::avx2_ok() {
        // SAFETY: AVX2 and FMA were detected on this CPU.
        return unsafe { gelu_avx2(v) };
    }
    gelu_slice(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_avx512(v: &mut [f32]) {
    gelu_slice(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_avx2(v: &mut [f32]) {
    gelu_slice(v)
}

#[inline(always)]
fn gelu_slice(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = gelu1(*x);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_matches_known_values() {
        // erf at a few points (to 10 digits).
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
            (-1.5, -0.966_105_146_5),
            (4.0, 0.999_999_984_6),
        ] {
            let got = super::erf(x) as f64;
            assert!((got - want).abs() < 5e-7, "erf({x}) = {got}, want {want}");
        }
    }
}
