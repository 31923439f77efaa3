//! Branch-free f32 math that vectorizes (no libm calls), with AVX-512 and AVX2 builds of the
//! slice loops picked at run time: sin, and the Snake activation and AdaIN built on it; layer norm
//! of a row and the tanh form of GELU (tanh from `exp`).

/// sin x, absolute error ~1e-7 for |x| < 8e4 (phases of a few seconds of audio): x = n pi + r
/// with pi in three parts (n pi exact for |n| < 2^16), then sin r (|r| <= pi/2) by its Taylor
/// series to r^11 (truncation < 6e-8) and the sign of (-1)^n.
#[inline(always)]
pub fn sin(x: f32) -> f32 {
    const INV_PI: f32 = std::f32::consts::FRAC_1_PI;
    const P1: f32 = 3.140625;
    const P2: f32 = 9.675_026e-4;
    const P3: f32 = 1.509_958e-7;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    let t = x * INV_PI + SHIFT;
    let n = t - SHIFT;
    let r = ((x - n * P1) - n * P2) - n * P3;
    let r2 = r * r;
    let p = -1.0 / 39_916_800.0;
    let p = p * r2 + 1.0 / 362_880.0;
    let p = p * r2 - 1.0 / 5040.0;
    let p = p * r2 + 1.0 / 120.0;
    let p = p * r2 - 1.0 / 6.0;
    let s = r + r * r2 * p;
    f32::from_bits(s.to_bits() ^ (t.to_bits() << 31))
}

#[inline(always)]
fn sin_slice_body(v: &mut [f32]) {
    for x in v {
        *x = sin(*x);
    }
}

#[inline(always)]
fn snake_body(r: &mut [f32], a: f32) {
    let inv = 1.0 / a;
    for v in r {
        let s = sin(a * *v);
        *v += inv * s * s;
    }
}

/// (mean, 1 / sqrt(var + eps), min, max) of r: sums in 16 lanes, then in f64.
#[inline(always)]
fn moments_body(r: &[f32], eps: f32) -> (f32, f32, f32, f32) {
    let n = r.len() as f64;
    let mut acc = [0f32; 16];
    let (mut lo, mut hi) = ([f32::INFINITY; 16], [f32::NEG_INFINITY; 16]);
    let mut it = r.chunks_exact(16);
    for c in &mut it {
        for l in 0..16 {
            acc[l] += c[l];
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
        }
    }
    let mut sum: f64 = acc.iter().map(|&v| v as f64).sum();
    sum += it.remainder().iter().map(|&v| v as f64).sum::<f64>();
    let (mut mn, mut mx) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in lo.iter().chain(it.remainder()) {
        mn = mn.min(v);
    }
    for &v in hi.iter().chain(it.remainder()) {
        mx = mx.max(v);
    }
    let mean = (sum / n) as f32;
    let mut acc = [0f32; 16];
    let mut it = r.chunks_exact(16);
    for c in &mut it {
        for l in 0..16 {
            let d = c[l] - mean;
            acc[l] += d * d;
        }
    }
    let mut ss: f64 = acc.iter().map(|&v| v as f64).sum();
    ss += it
        .remainder()
        .iter()
        .map(|&v| ((v - mean) as f64).powi(2))
        .sum::<f64>();
    (mean, (1.0 / (ss / n + eps as f64).sqrt()) as f32, mn, mx)
}

#[inline(always)]
fn ada_in_body(r: &mut [f32], g: f32, b: f32, eps: f32) {
    let (m, inv, _, _) = moments_body(r, eps);
    let (scale, shift) = (g * inv, b - g * inv * m);
    for v in r {
        *v = *v * scale + shift;
    }
}

#[inline(always)]
fn ada_in_map_body(r: &[f32], g: f32, b: f32, eps: f32) -> [f32; 4] {
    let (m, inv, mn, mx) = moments_body(r, eps);
    [g * inv, b - g * inv * m, mn, mx]
}

#[inline(always)]
fn layer_norm_body(r: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) {
    let (m, inv, _, _) = moments_body(r, eps);
    match (w, b) {
        (Some(w), Some(b)) => {
            for ((v, &wv), &bv) in r.iter_mut().zip(w).zip(b) {
                *v = (*v - m) * inv * wv + bv;
            }
        }
        _ => {
            for (j, v) in r.iter_mut().enumerate() {
                let mut y = (*v - m) * inv;
                if let Some(w) = w {
                    y *= w[j];
                }
                if let Some(b) = b {
                    y += b[j];
                }
                *v = y;
            }
        }
    }
}

/// tanh z = 1 - 2 / (e^{2z} + 1): absolute error ~1e-7 (relative error grows as z -> 0).
#[inline(always)]
fn tanh(z: f32) -> f32 {
    1.0 - 2.0 / (super::exp(2.0 * z) + 1.0)
}

/// 0.5 u (1 + tanh(sqrt(2 / pi) (u + 0.044715 u^3))) (tanh's absolute error is all GELU
/// sees: it is added to 1).
#[inline(always)]
fn gelu_tanh_body(v: &mut [f32]) {
    const C: f32 = 0.797_884_6;
    for x in v {
        let u = *x;
        *x = 0.5 * u * (1.0 + tanh(C * (u + 0.044715 * u * u * u)));
    }
}

#[inline(always)]
fn tanh_slice_body(v: &mut [f32]) {
    for x in v {
        *x = tanh(*x);
    }
}

#[inline(always)]
fn exp_slice_body(v: &mut [f32]) {
    for x in v {
        *x = super::exp(*x);
    }
}

widest!(
    /// v = sin(v) in place.
    pub fn sin_slice(v: &mut [f32]) = sin_slice_body
);

widest!(
    /// r = r + sin(a r)^2 / a in place (one channel of Snake).
    pub fn snake_row(r: &mut [f32], a: f32) = snake_body
);

widest!(
    /// r = g (r - mean) / sqrt(var + eps) + b in place (one channel of AdaIN, g = 1 + gamma).
    pub fn ada_in_row(r: &mut [f32], g: f32, b: f32, eps: f32) = ada_in_body
);

widest!(
    /// [scale, shift, min, max]: the map `ada_in_row` applies to r, r scale + shift = g (r -
    /// mean) / sqrt(var + eps) + b, and the range of r.
    pub fn ada_in_map(r: &[f32], g: f32, b: f32, eps: f32) -> [f32; 4] = ada_in_map_body
);

widest!(
    /// r = (r - mean) / sqrt(var + eps) * w + b in place (one row of layer norm; w, b when given).
    pub fn layer_norm_row(
        r: &mut [f32],
        w: Option<&[f32]>,
        b: Option<&[f32]>,
        eps: f32,
    ) = layer_norm_body
);

widest!(
    /// v = tanh(v) in place (absolute error ~1e-7).
    pub fn tanh_slice(v: &mut [f32]) = tanh_slice_body
);

widest!(
    /// v = e^v in place (relative error ~1e-7, v clamped to [-87, 88]).
    pub fn exp_slice(v: &mut [f32]) = exp_slice_body
);

widest!(
    /// GELU, tanh form, in place.
    pub fn gelu_tanh(v: &mut [f32]) = gelu_tanh_body
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sin_matches_libm() {
        let mut worst = 0f64;
        for i in -200_000..200_000 {
            let x = i as f32 * 0.013_7;
            let e = (sin(x) as f64 - (x as f64).sin()).abs();
            worst = worst.max(e);
        }
        assert!(worst < 4e-7, "worst {worst}");
        let mut v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 150.0).collect();
        let want: Vec<f32> = v.iter().map(|x| x.sin()).collect();
        sin_slice(&mut v);
        for (a, b) in v.iter().zip(&want) {
            assert!((a - b).abs() < 4e-7);
        }
    }

    #[test]
    fn tanh_and_exp_match_libm() {
        let x: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.01).collect();
        let (mut t, mut e) = (x.clone(), x.clone());
        tanh_slice(&mut t);
        exp_slice(&mut e);
        for ((&v, &a), &b) in x.iter().zip(&t).zip(&e) {
            assert!((a - v.tanh()).abs() < 3e-7, "tanh {v}: {a}");
            assert!((b - v.exp()).abs() <= 4e-7 * v.exp(), "exp {v}: {b}");
        }
    }

    #[test]
    fn gelu_tanh_matches_libm() {
        let mut v: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.003).collect();
        let want: Vec<f32> = v
            .iter()
            .map(|&u| 0.5 * u * (1.0 + (0.797_884_6 * (u + 0.044715 * u * u * u)).tanh()))
            .collect();
        gelu_tanh(&mut v);
        for (a, b) in v.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn ada_in_row_matches_f64() {
        let r0: Vec<f32> = (0..1001)
            .map(|i| ((i * 37 % 101) as f32) * 0.3 - 7.0)
            .collect();
        let n = r0.len() as f64;
        let m = r0.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = r0.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n;
        let mut r = r0.clone();
        ada_in_row(&mut r, 1.5, 0.25, 1e-5);
        for (&a, &x) in r.iter().zip(&r0) {
            let want = 1.5 * (x as f64 - m) / (var + 1e-5).sqrt() + 0.25;
            assert!((a as f64 - want).abs() < 1e-5, "{a} vs {want}");
        }
    }
}
