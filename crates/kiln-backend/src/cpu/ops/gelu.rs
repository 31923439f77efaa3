//! GELU, the exact form: gelu(x) = x · Φ(x) = x/2 · (1 + erf(x / √2)).

use crate::cpu::CpuTensor;

/// erf for f32 arguments: Abramowitz & Stegun 7.1.26 refined in f64 (|error| < 1.5e-7,
/// below f32 resolution of the result).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    (if x < 0.0 { -y } else { y }) as f32
}

#[inline(always)]
pub fn gelu1(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// x = gelu(x) over the first n rows, in place.
pub fn gelu(x: &mut CpuTensor, n: usize) {
    let len = n * x.cols;
    for v in x.data[..len].iter_mut() {
        *v = gelu1(*v);
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
            assert!((got - want).abs() < 3e-7, "erf({x}) = {got}, want {want}");
        }
    }
}
