//! Band-limited resampling: a Kaiser-windowed sinc, evaluated from a finely sampled table.
//!
//! y[n] = c · Σ_k x[k] · sinc(c·(t_n − k)) · w((t_n − k) / W),  t_n = n · in_rate / out_rate
//! with c = min(1, out/in) · ROLLOFF the cut-off (relative to the input's Nyquist), w a Kaiser
//! window of half-width W = ZEROS / c input samples. The kernel is tabulated at
//! 1/PHASES of a sample and interpolated linearly, so any pair of rates works (no gcd tricks).

use crate::AudioError;

/// Zero crossings of the sinc on each side (filter length ~ 2·ZEROS/c taps).
const ZEROS: usize = 24;
/// Table entries per input sample.
const PHASES: usize = 512;
/// Pass band edge as a fraction of the output's Nyquist.
const ROLLOFF: f64 = 0.945;
/// Kaiser window shape (~ 90 dB stop-band attenuation).
const BETA: f64 = 9.0;

/// Resamples `x` from `from` Hz to `to` Hz.
pub fn resample(x: &[f32], from: u32, to: u32) -> Result<Vec<f32>, AudioError> {
    if from == 0 || to == 0 {
        return Err(AudioError::Invalid {
            what: format!("cannot resample {from} Hz -> {to} Hz"),
        });
    }
    if from == to || x.is_empty() {
        return Ok(x.to_vec());
    }
    let step = from as f64 / to as f64; // input samples per output sample
    let c = (to as f64 / from as f64).min(1.0) * ROLLOFF;
    let half = ZEROS as f64 / c; // half-width in input samples
                                 // Kernel h(d) for d = i / PHASES, i = 0..=half·PHASES (+1 guard entry for interpolation).
    let n_tab = (half * PHASES as f64).ceil() as usize + 2;
    let i0_beta = bessel_i0(BETA);
    let table: Vec<f32> = (0..n_tab)
        .map(|i| {
            let d = i as f64 / PHASES as f64;
            if d >= half {
                return 0.0;
            }
            let r = d / half;
            let w = bessel_i0(BETA * (1.0 - r * r).sqrt()) / i0_beta;
            (c * sinc(c * d) * w) as f32
        })
        .collect();
    let kernel = |d: f64| -> f32 {
        let p = d.abs() * PHASES as f64;
        let i = p as usize;
        if i + 1 >= n_tab {
            return 0.0;
        }
        let f = (p - i as f64) as f32;
        table[i] + (table[i + 1] - table[i]) * f
    };
    let n_out = ((x.len() as u64 * to as u64).div_ceil(from as u64)) as usize;
    let reach = half.ceil() as isize;
    let mut out = Vec::with_capacity(n_out);
    for n in 0..n_out {
        let t = n as f64 * step;
        let center = t.floor() as isize;
        let lo = (center - reach).max(0);
        let hi = (center + reach + 1).min(x.len() as isize - 1);
        let mut acc = 0f32;
        for k in lo..=hi {
            acc += x[k as usize] * kernel(t - k as f64);
        }
        out.push(acc);
    }
    Ok(out)
}

fn sinc(x: f64) -> f64 {
    if x.abs() < 1e-12 {
        1.0
    } else {
        let px = std::f64::consts::PI * x;
        px.sin() / px
    }
}

/// Modified Bessel function of the first kind, order 0 (power series).
fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term) = (1.0, 1.0);
    let q = x * x / 4.0;
    for k in 1..64 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(freq: f64, rate: u32, secs: f64) -> Vec<f32> {
        let n = (rate as f64 * secs) as usize;
        (0..n)
            .map(|i| (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() as f32)
            .collect()
    }

    /// Amplitude of `freq` in `x` (rate Hz), by correlation, away from the edges.
    fn amplitude(x: &[f32], freq: f64, rate: u32) -> f64 {
        let skip = x.len() / 10;
        let (mut s, mut c) = (0f64, 0f64);
        let body = &x[skip..x.len() - skip];
        for (i, &v) in body.iter().enumerate() {
            let ph = 2.0 * std::f64::consts::PI * freq * (i + skip) as f64 / rate as f64;
            s += v as f64 * ph.sin();
            c += v as f64 * ph.cos();
        }
        2.0 * (s * s + c * c).sqrt() / body.len() as f64
    }

    #[test]
    fn passes_speech_band_and_rejects_aliases() {
        for from in [44_100, 48_000, 22_050, 8_000, 11_025] {
            let out = resample(&tone(1000.0, from, 1.0), from, 16_000).unwrap();
            let expect = (from as usize).div_ceil(1) * 16_000 / from as usize;
            assert!(
                (out.len() as i64 - expect as i64).abs() <= 1,
                "{from}: {}",
                out.len()
            );
            let a = amplitude(&out, 1000.0, 16_000);
            assert!((a - 1.0).abs() < 0.01, "{from} Hz: 1 kHz amplitude {a}");
        }
        // 12 kHz at 48 kHz would alias to 4 kHz at 16 kHz: it must be gone (< -60 dB).
        let out = resample(&tone(12_000.0, 48_000, 1.0), 48_000, 16_000).unwrap();
        let a = amplitude(&out, 4000.0, 16_000);
        assert!(a < 1e-3, "alias amplitude {a}");
    }

    #[test]
    fn same_rate_is_identity_and_zero_rate_is_an_error() {
        let x = tone(440.0, 16_000, 0.1);
        assert_eq!(resample(&x, 16_000, 16_000).unwrap(), x);
        assert!(resample(&x, 0, 16_000).is_err());
    }
}
