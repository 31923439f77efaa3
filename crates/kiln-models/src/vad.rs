//! Silero VAD (v5/v6, 16 kHz): the probability that each 32 ms of audio is speech, and the
//! speech regions those probabilities describe.
//!
//! The network, per step of 512 new samples: the step with the previous step's last 64
//! samples before it, reflect-padded by 64 at its end (640 samples); a learned STFT (a
//! 256-tap convolution of stride 128: 4 frames of 129 real and imaginary bins) to magnitudes;
//! four 3-tap convolutions with ReLU (129 -> 128 -> 64 (stride 2) -> 64 (stride 2) -> 128
//! channels, ending at one frame); an LSTM cell of 128 whose state carries to the next step;
//! ReLU, a 1x1 convolution to one value and a sigmoid. About 0.7 M multiply-adds a step: it
//! runs on the CPU whatever backend runs Whisper.

use std::path::{Path, PathBuf};

use kiln_formats::{OnnxFile, OnnxType};

use crate::ModelError;

/// Samples per step at 16 kHz.
pub const STEP: usize = 512;
/// Samples of the previous step each step sees.
const CONTEXT: usize = 64;
const N_FFT: usize = 256;
const HOP: usize = 128;
const BINS: usize = N_FFT / 2 + 1;
const HIDDEN: usize = 128;

struct Conv {
    w: Vec<f32>,
    b: Vec<f32>,
    cin: usize,
    cout: usize,
    stride: usize,
}

impl Conv {
    /// A 3-tap convolution with one zero of padding each side over `tin` frames of `x`
    /// (`cin` rows of `tin`), then ReLU.
    fn relu(&self, x: &[f32], tin: usize) -> (Vec<f32>, usize) {
        let tout = (tin + 2 - 3) / self.stride + 1;
        let mut y = vec![0f32; self.cout * tout];
        for o in 0..self.cout {
            for t in 0..tout {
                let mut acc = self.b[o];
                for k in 0..3 {
                    // Input frame 2t + k - 1 (stride 2) or t + k - 1, zero outside.
                    let Some(ti) = (self.stride * t + k).checked_sub(1).filter(|&ti| ti < tin)
                    else {
                        continue;
                    };
                    let w = &self.w[o * self.cin * 3 + k..];
                    acc += (0..self.cin)
                        .map(|i| w[i * 3] * x[i * tin + ti])
                        .sum::<f32>();
                }
                y[o * tout + t] = acc.max(0.0);
            }
        }
        (y, tout)
    }
}

/// The weights of Silero VAD's 16 kHz network.
pub struct SileroVad {
    stft: Vec<f32>,
    convs: [Conv; 4],
    w_ih: Vec<f32>,
    w_hh: Vec<f32>,
    bias: Vec<f32>,
    out_w: Vec<f32>,
    out_b: f32,
    pub file: PathBuf,
}

/// The state carried between steps: the LSTM's and the last samples seen.
#[derive(Clone)]
pub struct VadState {
    h: Vec<f32>,
    c: Vec<f32>,
    context: [f32; CONTEXT],
}

impl Default for VadState {
    fn default() -> Self {
        VadState {
            h: vec![0.0; HIDDEN],
            c: vec![0.0; HIDDEN],
            context: [0.0; CONTEXT],
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl SileroVad {
    /// Reads the package's 16 kHz ONNX export (`silero_vad_16k_op15.onnx`): its weights,
    /// the graph being the one described above.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let f = OnnxFile::open(path)?;
        let file = path.to_path_buf();
        let get = |name: &str, shape: &[u64]| -> Result<Vec<f32>, ModelError> {
            let t = f
                .initializer(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    file: file.clone(),
                    name: name.into(),
                })?;
            let dims: Vec<u64> = t.dims.iter().map(|&d| d.max(0) as u64).collect();
            if dims != shape || t.ty != OnnxType::F32 {
                return Err(ModelError::Shape {
                    file: file.clone(),
                    name: name.into(),
                    expected: shape.to_vec(),
                    got: dims,
                    ty: "ONNX tensor",
                });
            }
            Ok(f.f32s(t)?)
        };
        let conv = |i: usize, cin: usize, cout: usize, stride: usize| -> Result<Conv, ModelError> {
            let w = format!("model.encoder.{i}.reparam_conv");
            Ok(Conv {
                w: get(&format!("{w}.weight"), &[cout as u64, cin as u64, 3])?,
                b: get(&format!("{w}.bias"), &[cout as u64])?,
                cin,
                cout,
                stride,
            })
        };
        let h = HIDDEN as u64;
        let rnn = "model.decoder.rnn";
        let b_ih = get(&format!("{rnn}.bias_ih"), &[4 * h])?;
        let b_hh = get(&format!("{rnn}.bias_hh"), &[4 * h])?;
        let out = "model.decoder.decoder.2";
        Ok(SileroVad {
            stft: get(
                "model.stft.forward_basis_buffer",
                &[2 * BINS as u64, 1, N_FFT as u64],
            )?,
            convs: [
                conv(0, BINS, 128, 1)?,
                conv(1, 128, 64, 2)?,
                conv(2, 64, 64, 2)?,
                conv(3, 64, 128, 1)?,
            ],
            w_ih: get(&format!("{rnn}.weight_ih"), &[4 * h, h])?,
            w_hh: get(&format!("{rnn}.weight_hh"), &[4 * h, h])?,
            bias: b_ih.iter().zip(&b_hh).map(|(a, b)| a + b).collect(),
            out_w: get(&format!("{out}.weight"), &[1, h, 1])?,
            out_b: get(&format!("{out}.bias"), &[1])?[0],
            file,
        })
    }

    /// The speech probability of `step` (512 samples at 16 kHz), advancing `s`.
    pub fn step(&self, s: &mut VadState, step: &[f32; STEP]) -> f32 {
        // Context, the step, then 64 samples reflected about the last one.
        let mut x = [0f32; CONTEXT + STEP + CONTEXT];
        x[..CONTEXT].copy_from_slice(&s.context);
        x[CONTEXT..CONTEXT + STEP].copy_from_slice(step);
        let n = CONTEXT + STEP;
        for j in 0..CONTEXT {
            x[n + j] = x[n - 2 - j];
        }
        s.context.copy_from_slice(&step[STEP - CONTEXT..]);
        let frames = (x.len() - N_FFT) / HOP + 1;
        let mut mag = vec![0f32; BINS * frames];
        let row = |c: usize, t: usize| -> f32 {
            let w = &self.stft[c * N_FFT..(c + 1) * N_FFT];
            let xs = &x[t * HOP..t * HOP + N_FFT];
            w.iter().zip(xs).map(|(a, b)| a * b).sum()
        };
        for f in 0..BINS {
            for t in 0..frames {
                let (re, im) = (row(f, t), row(f + BINS, t));
                mag[f * frames + t] = (re * re + im * im).sqrt();
            }
        }
        let (mut y, mut t) = (mag, frames);
        for c in &self.convs {
            (y, t) = c.relu(&y, t);
        }
        debug_assert_eq!(t, 1);
        let mut gates = self.bias.clone();
        for (g, out) in gates.iter_mut().enumerate() {
            let wi = &self.w_ih[g * HIDDEN..(g + 1) * HIDDEN];
            let wh = &self.w_hh[g * HIDDEN..(g + 1) * HIDDEN];
            *out += wi.iter().zip(&y).map(|(a, b)| a * b).sum::<f32>()
                + wh.iter().zip(&s.h).map(|(a, b)| a * b).sum::<f32>();
        }
        // Gate order: input, forget, cell, output.
        let mut p = self.out_b;
        for j in 0..HIDDEN {
            let (i, f) = (sigmoid(gates[j]), sigmoid(gates[HIDDEN + j]));
            let (g, o) = (gates[2 * HIDDEN + j].tanh(), sigmoid(gates[3 * HIDDEN + j]));
            s.c[j] = f * s.c[j] + i * g;
            s.h[j] = o * s.c[j].tanh();
            p += self.out_w[j] * s.h[j].max(0.0);
        }
        sigmoid(p)
    }

    /// One probability per 512 samples of `samples` (16 kHz; the last step zero-padded).
    pub fn probs(&self, samples: &[f32]) -> Vec<f32> {
        let mut s = VadState::default();
        samples
            .chunks(STEP)
            .map(|c| {
                let mut step = [0f32; STEP];
                step[..c.len()].copy_from_slice(c);
                self.step(&mut s, &step)
            })
            .collect()
    }
}

/// How probabilities become speech regions.
#[derive(Debug, Clone)]
pub struct VadOptions {
    /// Speech starts at a step at least this likely.
    pub threshold: f32,
    /// Speech may end at a step below this (default: `threshold - 0.15`, at least 0.01).
    pub neg_threshold: Option<f32>,
    /// Regions shorter than this are dropped.
    pub min_speech_ms: u32,
    /// Speech ends after this much time below `neg_threshold`.
    pub min_silence_ms: u32,
    /// Each region is widened by this much each side (half the gap where two would meet).
    pub speech_pad_ms: u32,
}

impl Default for VadOptions {
    /// The settings Silero's own `get_speech_timestamps` defaults to.
    fn default() -> Self {
        VadOptions {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_ms: 250,
            min_silence_ms: 100,
            speech_pad_ms: 30,
        }
    }
}

impl VadOptions {
    /// For transcription: long pauses only split regions, and generous padding keeps word
    /// edges (the settings faster-whisper's VAD filter uses).
    pub fn transcription() -> Self {
        VadOptions {
            min_speech_ms: 0,
            min_silence_ms: 2000,
            speech_pad_ms: 400,
            ..Default::default()
        }
    }
}

/// Speech regions `[start, end)` in samples of `n_samples` at 16 kHz, from one probability
/// per [`STEP`] samples.
pub fn speech_regions(probs: &[f32], n_samples: usize, o: &VadOptions) -> Vec<(usize, usize)> {
    let ms = |v: u32| v as usize * 16;
    let neg = o.neg_threshold.unwrap_or((o.threshold - 0.15).max(0.01));
    let mut regions = Vec::new();
    let mut start: Option<usize> = None;
    let mut quiet_since: Option<usize> = None;
    for (i, &p) in probs.iter().enumerate() {
        let at = i * STEP;
        if p >= o.threshold {
            quiet_since = None;
            start.get_or_insert(at);
            continue;
        }
        let Some(s) = start else { continue };
        if p < neg {
            let q = *quiet_since.get_or_insert(at);
            if at - q >= ms(o.min_silence_ms) {
                if q - s > ms(o.min_speech_ms) {
                    regions.push((s, q));
                }
                (start, quiet_since) = (None, None);
            }
        }
    }
    if let Some(s) = start {
        if n_samples.saturating_sub(s) > ms(o.min_speech_ms) {
            regions.push((s, n_samples));
        }
    }
    // Padding: each side by speech_pad, or half the gap to a neighbour nearer than twice it.
    let pad = ms(o.speech_pad_ms);
    let mut out = regions.clone();
    for i in 0..regions.len() {
        if i == 0 {
            out[0].0 = regions[0].0.saturating_sub(pad);
        }
        if i + 1 < regions.len() {
            let gap = regions[i + 1].0 - regions[i].1;
            let widen = if gap < 2 * pad { gap / 2 } else { pad };
            out[i].1 = regions[i].1 + widen;
            out[i + 1].0 = regions[i + 1].0.saturating_sub(widen);
        } else {
            out[i].1 = (regions[i].1 + pad).min(n_samples);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hysteresis, minimum silence and speech, and padding, on hand-made probabilities.
    #[test]
    fn regions_from_probabilities() {
        let o = VadOptions::default();
        // 0.6 starts speech, 0.4 (between the thresholds) neither starts nor ends it.
        let mut p = vec![0.0f32; 40];
        for x in &mut p[5..15] {
            *x = 0.9;
        }
        p[15] = 0.4;
        p[16] = 0.4;
        // A 2-step dip (64 ms < 100 ms) does not end it; 4 quiet steps (>= 100 ms) do.
        for x in &mut p[17..19] {
            *x = 0.1;
        }
        for x in &mut p[19..25] {
            *x = 0.8;
        }
        let n = 40 * STEP;
        let r = speech_regions(&p, n, &o);
        // Speech 5..25 steps, quiet from step 25; padded by 30 ms (480 samples).
        assert_eq!(r, vec![(5 * STEP - 480, 25 * STEP + 480)]);
        // Too short a region (3 steps = 96 ms < 250 ms) is dropped.
        let mut q = vec![0.0f32; 20];
        for x in &mut q[2..5] {
            *x = 0.9;
        }
        assert!(speech_regions(&q, 20 * STEP, &o).is_empty());
        // Two regions 6 steps apart: padding meets halfway; speech to the end is kept.
        let mut two = vec![0.0f32; 40];
        for x in &mut two[0..10] {
            *x = 0.9;
        }
        for x in &mut two[16..40] {
            *x = 0.9;
        }
        let wide = VadOptions {
            speech_pad_ms: 200,
            ..o
        };
        let r = speech_regions(&two, 40 * STEP - 100, &wide);
        let gap = 6 * STEP;
        assert_eq!(
            r,
            vec![
                (0, 10 * STEP + gap / 2),
                (16 * STEP - gap / 2, 40 * STEP - 100)
            ]
        );
        assert!(speech_regions(&[], 0, &wide).is_empty());
    }
}
