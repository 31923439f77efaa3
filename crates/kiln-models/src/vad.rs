//! Silero VAD (v5/v6, 16 kHz): the probability that each 32 ms of audio is speech, and the
//! speech regions those probabilities describe.
//!
//! The network, per step of 512 new samples: the step with the previous step's last 64
//! samples before it, reflect-padded by 64 at its end (640 samples); a learned STFT (a
//! 256-tap convolution of stride 128: 4 frames of 129 real and imaginary bins) to magnitudes;
//! four 3-tap convolutions with ReLU (129 -> 128 -> 64 (stride 2) -> 64 (stride 2) -> 128
//! channels, ending at one frame); an LSTM cell of 128 whose state carries to the next step;
//! ReLU, a 1x1 convolution to one value and a sigmoid. About 0.7 M multiply-adds a step: it
//! runs on the CPU whatever backend runs Whisper. All but the LSTM's recurrence is
//! independent between steps, so a run of steps goes through it as block products (frames,
//! or each convolution's three taps side by side, as rows); the recurrence then runs step
//! by step.

use std::path::{Path, PathBuf};

use kiln_backend::cpu::gemm_f32;
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

/// A 3-tap convolution (one zero of padding each side) as a block product: weights as
/// `[3 * cin][cout]`, tap-major, against rows of the three input frames side by side.
struct Conv {
    w: Vec<f32>,
    b: Vec<f32>,
    cin: usize,
    cout: usize,
    stride: usize,
}

impl Conv {
    /// `x`: `steps` sequences of `tin` frames of `cin` values (frame-major); the output's
    /// frames likewise, after ReLU.
    fn relu(&self, x: &[f32], steps: usize, tin: usize) -> (Vec<f32>, usize) {
        let (cin, cout) = (self.cin, self.cout);
        let tout = (tin + 2 - 3) / self.stride + 1;
        let rows = steps * tout;
        let mut cols = vec![0f32; rows * 3 * cin];
        for st in 0..steps {
            for t in 0..tout {
                let row = &mut cols[(st * tout + t) * 3 * cin..][..3 * cin];
                for k in 0..3 {
                    // Input frame stride * t + k - 1, zero outside the step's frames.
                    let Some(ti) = (self.stride * t + k).checked_sub(1).filter(|&ti| ti < tin)
                    else {
                        continue;
                    };
                    row[k * cin..(k + 1) * cin].copy_from_slice(&x[(st * tin + ti) * cin..][..cin]);
                }
            }
        }
        let mut y = vec![0f32; rows * cout];
        gemm_f32(
            &cols,
            3 * cin,
            rows,
            &self.w,
            cout,
            cout,
            3 * cin,
            &mut y,
            cout,
        );
        for r in y.chunks_exact_mut(cout) {
            for (v, b) in r.iter_mut().zip(&self.b) {
                *v = (*v + b).max(0.0);
            }
        }
        (y, tout)
    }
}

/// `[rows][cols]` -> `[cols][rows]`.
fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// The weights of Silero VAD's 16 kHz network.
pub struct SileroVad {
    /// The STFT basis as `[N_FFT][2 * BINS]`.
    stft: Vec<f32>,
    convs: [Conv; 4],
    /// `[HIDDEN][4 * HIDDEN]`: input and recurrent weights, transposed for block products.
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
            let torch = get(&format!("{w}.weight"), &[cout as u64, cin as u64, 3])?;
            // [cout][cin][3] -> [3][cin][cout].
            let mut wt = vec![0f32; torch.len()];
            for o in 0..cout {
                for i in 0..cin {
                    for k in 0..3 {
                        wt[(k * cin + i) * cout + o] = torch[(o * cin + i) * 3 + k];
                    }
                }
            }
            Ok(Conv {
                w: wt,
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
            stft: transpose(
                &get(
                    "model.stft.forward_basis_buffer",
                    &[2 * BINS as u64, 1, N_FFT as u64],
                )?,
                2 * BINS,
                N_FFT,
            ),
            convs: [
                conv(0, BINS, 128, 1)?,
                conv(1, 128, 64, 2)?,
                conv(2, 64, 64, 2)?,
                conv(3, 64, 128, 1)?,
            ],
            w_ih: transpose(
                &get(&format!("{rnn}.weight_ih"), &[4 * h, h])?,
                4 * HIDDEN,
                HIDDEN,
            ),
            w_hh: transpose(
                &get(&format!("{rnn}.weight_hh"), &[4 * h, h])?,
                4 * HIDDEN,
                HIDDEN,
            ),
            bias: b_ih.iter().zip(&b_hh).map(|(a, b)| a + b).collect(),
            out_w: get(&format!("{out}.weight"), &[1, h, 1])?,
            out_b: get(&format!("{out}.bias"), &[1])?[0],
            file,
        })
    }

    /// The speech probability of each step of `steps` (512 samples at 16 kHz each),
    /// advancing `s`: one call for a whole file, or call by call as audio arrives.
    pub fn run(&self, s: &mut VadState, steps: &[f32]) -> Vec<f32> {
        let n = steps.len() / STEP;
        if n == 0 {
            return Vec::new();
        }
        // Each step: the context, the step, 64 samples reflected about its last one; as
        // frames of N_FFT, HOP apart, one row each.
        const WIN: usize = CONTEXT + STEP + CONTEXT;
        const FRAMES: usize = (WIN - N_FFT) / HOP + 1;
        let mut rows = vec![0f32; n * FRAMES * N_FFT];
        let mut x = [0f32; WIN];
        for (i, step) in steps.chunks_exact(STEP).enumerate() {
            x[..CONTEXT].copy_from_slice(&s.context);
            x[CONTEXT..CONTEXT + STEP].copy_from_slice(step);
            let m = CONTEXT + STEP;
            for j in 0..CONTEXT {
                x[m + j] = x[m - 2 - j];
            }
            s.context.copy_from_slice(&step[STEP - CONTEXT..]);
            for t in 0..FRAMES {
                rows[(i * FRAMES + t) * N_FFT..][..N_FFT]
                    .copy_from_slice(&x[t * HOP..t * HOP + N_FFT]);
            }
        }
        let f = n * FRAMES;
        let mut spec = vec![0f32; f * 2 * BINS];
        gemm_f32(
            &rows,
            N_FFT,
            f,
            &self.stft,
            2 * BINS,
            2 * BINS,
            N_FFT,
            &mut spec,
            2 * BINS,
        );
        let mut y: Vec<f32> = spec
            .chunks_exact(2 * BINS)
            .flat_map(|r| (0..BINS).map(move |b| (r[b] * r[b] + r[BINS + b] * r[BINS + b]).sqrt()))
            .collect();
        let mut t = FRAMES;
        for c in &self.convs {
            (y, t) = c.relu(&y, n, t);
        }
        debug_assert_eq!((t, y.len()), (1, n * HIDDEN));
        // The LSTM's input products for every step at once, then the recurrence.
        let g4 = 4 * HIDDEN;
        let mut gx = vec![0f32; n * g4];
        gemm_f32(&y, HIDDEN, n, &self.w_ih, g4, g4, HIDDEN, &mut gx, g4);
        let mut gh = vec![0f32; g4];
        let mut probs = Vec::with_capacity(n);
        for gates in gx.chunks_exact(g4) {
            gemm_f32(&s.h, HIDDEN, 1, &self.w_hh, g4, g4, HIDDEN, &mut gh, g4);
            let g = |k: usize, j: usize| {
                gates[k * HIDDEN + j] + gh[k * HIDDEN + j] + self.bias[k * HIDDEN + j]
            };
            // Gate order: input, forget, cell, output.
            let mut p = self.out_b;
            for j in 0..HIDDEN {
                let (i, f) = (sigmoid(g(0, j)), sigmoid(g(1, j)));
                let (c, o) = (g(2, j).tanh(), sigmoid(g(3, j)));
                s.c[j] = f * s.c[j] + i * c;
                s.h[j] = o * s.c[j].tanh();
                p += self.out_w[j] * s.h[j].max(0.0);
            }
            probs.push(sigmoid(p));
        }
        probs
    }

    /// One probability per 512 samples of `samples` (16 kHz; the last step zero-padded).
    pub fn probs(&self, samples: &[f32]) -> Vec<f32> {
        let mut s = VadState::default();
        let whole = samples.len() / STEP * STEP;
        let mut probs = self.run(&mut s, &samples[..whole]);
        if whole < samples.len() {
            let mut last = [0f32; STEP];
            last[..samples.len() - whole].copy_from_slice(&samples[whole..]);
            probs.extend(self.run(&mut s, &last));
        }
        probs
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
