//! Whisper's log-mel spectrogram, computed natively:
//!
//! 1. STFT: n_fft 400, hop 160, periodic Hann window, frames centred (the signal reflect-padded
//!    by n_fft/2 on both sides, as `torch.stft(center=True, pad_mode="reflect")`); the last
//!    frame dropped; power |X|².
//! 2. mel = filters (n_mels x 201, Slaney scale and area normalisation) @ power
//! 3. log10(max(mel, 1e-10)), clamped below at (its maximum − 8), then (x + 4) / 4.

use realfft::RealFftPlanner;

use crate::AudioError;

pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
pub const N_FREQS: usize = N_FFT / 2 + 1;

/// `n_mels x n_frames`, row-major (one row per mel bin, like Whisper's input).
#[derive(Debug, Clone)]
pub struct MelSpectrogram {
    pub n_mels: usize,
    pub n_frames: usize,
    pub data: Vec<f32>,
}

impl MelSpectrogram {
    /// Frames `start..start + len` of every bin, zero-padded past the end (Whisper's
    /// `pad_or_trim` of a window), as `n_mels x len`.
    pub fn window(&self, start: usize, len: usize, pad: f32) -> Vec<f32> {
        let mut out = vec![pad; self.n_mels * len];
        if start < self.n_frames {
            let take = len.min(self.n_frames - start);
            for m in 0..self.n_mels {
                let src = &self.data[m * self.n_frames + start..m * self.n_frames + start + take];
                out[m * len..m * len + take].copy_from_slice(src);
            }
        }
        out
    }
}

fn hz_to_mel(f: f64) -> f64 {
    // Slaney: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let logstep = 6.4f64.ln() / 27.0;
    if f >= MIN_LOG_HZ {
        min_log_mel + (f / MIN_LOG_HZ).ln() / logstep
    } else {
        f / F_SP
    }
}

fn mel_to_hz(m: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let logstep = 6.4f64.ln() / 27.0;
    if m >= min_log_mel {
        MIN_LOG_HZ * (logstep * (m - min_log_mel)).exp()
    } else {
        F_SP * m
    }
}

/// Slaney-style mel filterbank for 16 kHz audio and a 400-point FFT: `n_mels x 201`,
/// triangles between consecutive mel-spaced edges from 0 Hz to 8 kHz, each scaled by
/// 2 / (its bandwidth in Hz).
pub fn mel_filters(n_mels: usize) -> Vec<f32> {
    let sr = crate::SAMPLE_RATE as f64;
    let fft_freqs: Vec<f64> = (0..N_FREQS).map(|k| k as f64 * sr / N_FFT as f64).collect();
    let (m0, m1) = (hz_to_mel(0.0), hz_to_mel(sr / 2.0));
    let edges: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(m0 + (m1 - m0) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut w = vec![0f32; n_mels * N_FREQS];
    for i in 0..n_mels {
        let (lo, mid, hi) = (edges[i], edges[i + 1], edges[i + 2]);
        let enorm = 2.0 / (hi - lo);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let lower = (f - lo) / (mid - lo);
            let upper = (hi - f) / (hi - mid);
            w[i * N_FREQS + k] = (lower.min(upper).max(0.0) * enorm) as f32;
        }
    }
    w
}

/// Whisper's input features for 16 kHz mono `samples`, followed by `pad` zero samples
/// (Whisper pads 30 s so that the last window is complete).
pub fn log_mel_spectrogram(
    samples: &[f32],
    n_mels: usize,
    pad: usize,
) -> Result<MelSpectrogram, AudioError> {
    if n_mels == 0 {
        return Err(AudioError::Invalid {
            what: "n_mels must be positive".into(),
        });
    }
    let len = samples.len() + pad;
    if len == 0 {
        return Err(AudioError::Invalid {
            what: "no samples for a spectrogram".into(),
        });
    }
    let sample = |i: usize| samples.get(i).copied().unwrap_or(0.0);
    // Reflect-padded signal index (-n_fft/2 .. len + n_fft/2) -> sample.
    let reflect = |j: isize| -> f32 {
        if len == 1 {
            return sample(0);
        }
        let period = 2 * (len as isize - 1);
        let mut j = j.rem_euclid(period);
        if j >= len as isize {
            j = period - j;
        }
        sample(j as usize)
    };
    let n_frames = len / HOP; // 1 + len/HOP centred frames, the last one dropped
    let window: Vec<f32> = (0..N_FFT)
        .map(|i| {
            let x = 2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64;
            (0.5 - 0.5 * x.cos()) as f32
        })
        .collect();
    let filters = mel_filters(n_mels);
    // Non-zero range of each filter (the triangles are narrow).
    let ranges: Vec<(usize, usize)> = (0..n_mels)
        .map(|m| {
            let row = &filters[m * N_FREQS..(m + 1) * N_FREQS];
            let a = row.iter().position(|&v| v != 0.0).unwrap_or(0);
            let b = row.iter().rposition(|&v| v != 0.0).map_or(0, |b| b + 1);
            (a, b.max(a))
        })
        .collect();

    let mut planner = RealFftPlanner::<f32>::new();
    let fft = planner.plan_fft_forward(N_FFT);
    let mut frame = fft.make_input_vec();
    let mut spec = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0f32; N_FREQS];
    let mut data = vec![0f32; n_mels * n_frames];
    let half = (N_FFT / 2) as isize;
    for t in 0..n_frames {
        let start = (t * HOP) as isize - half;
        for (i, v) in frame.iter_mut().enumerate() {
            let j = start + i as isize;
            let x = if j >= 0 && (j as usize) < len {
                sample(j as usize)
            } else {
                reflect(j)
            };
            *v = x * window[i];
        }
        fft.process_with_scratch(&mut frame, &mut spec, &mut scratch)
            .map_err(|e| AudioError::Invalid {
                what: format!("fft: {e}"),
            })?;
        for (p, c) in power.iter_mut().zip(&spec) {
            *p = c.re * c.re + c.im * c.im;
        }
        for (m, &(a, b)) in ranges.iter().enumerate() {
            let row = &filters[m * N_FREQS..(m + 1) * N_FREQS];
            let mut acc = 0f32;
            for k in a..b {
                acc += row[k] * power[k];
            }
            data[m * n_frames + t] = acc;
        }
    }
    let mut max = f32::NEG_INFINITY;
    for v in data.iter_mut() {
        *v = v.max(1e-10).log10();
        max = max.max(*v);
    }
    let floor = max - 8.0;
    for v in data.iter_mut() {
        *v = (v.max(floor) + 4.0) / 4.0;
    }
    Ok(MelSpectrogram {
        n_mels,
        n_frames,
        data,
    })
}
