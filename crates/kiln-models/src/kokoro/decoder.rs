//! The iSTFTNet decoder: AdaIN residual blocks over [aligned text, F0, energy], then the
//! generator: a harmonic-plus-noise source from F0 (SineGen), two transposed-conv upsamplings
//! (x10, x6) each joined by the source's STFT through a strided conv and an AdaIN resblock,
//! multi-kernel AdaINResBlock1s with Snake activations, conv_post to a magnitude / phase
//! spectrogram and an inverse STFT (n_fft 20, hop 5) to 24 kHz audio.

use kiln_backend::{Backend, Unary};

use super::blocks::{AdaInResBlock1, AdainResBlk1d, Conv, ConvSpec, Ctx, Linear};
use super::params::Params;
use super::Config;
use crate::ModelError;

pub struct Decoder<B: Backend> {
    encode: AdainResBlk1d<B>,
    decode: Vec<AdainResBlk1d<B>>,
    f0_conv: Conv<B>,
    n_conv: Conv<B>,
    asr_res: Conv<B>,
    gen: Generator<B>,
    dim_in: usize,
}

impl<B: Backend> Decoder<B> {
    pub fn load(b: &B, p: &Params, c: &Config) -> Result<Self, ModelError> {
        let (d, sty) = (c.hidden_dim, c.style_dim);
        let res = 64; // asr_res width
        let half = ConvSpec {
            k: 3,
            stride: 2,
            pad: 1,
            dilation: 1,
            groups: 1,
            output_pad: 0,
            transposed: false,
        };
        let half2 = ConvSpec { ..half };
        let mut decode = Vec::new();
        for i in 0..4 {
            let out = if i == 3 { 512 } else { 1024 };
            decode.push(AdainResBlk1d::load(
                b,
                p,
                &format!("decoder.decode.{i}"),
                1024 + 2 + res,
                out,
                sty,
                i == 3,
            )?);
        }
        Ok(Decoder {
            encode: AdainResBlk1d::load(b, p, "decoder.encode", d + 2, 1024, sty, false)?,
            decode,
            f0_conv: Conv::load(b, p, "decoder.F0_conv", 1, 1, half)?,
            n_conv: Conv::load(b, p, "decoder.N_conv", 1, 1, half2)?,
            asr_res: Conv::load(b, p, "decoder.asr_res.0", d, res, ConvSpec::same(1, 1))?,
            gen: Generator::load(b, p, c)?,
            dim_in: d,
        })
    }

    /// asr (d, frames), f0 and n (1, 2 frames), s (1, style) -> audio (1, samples)
    pub fn forward(
        &self,
        cx: &Ctx<B>,
        asr: &B::Tensor,
        f0: &B::Tensor,
        n: &B::Tensor,
        s: &B::Tensor,
        frames: usize,
    ) -> (B::Tensor, usize) {
        let b = cx.b;
        let d = self.dim_in;
        let f0d = self.f0_conv.forward(cx, f0, 2 * frames);
        let nd = self.n_conv.forward(cx, n, 2 * frames);
        let asr_res = self.asr_res.forward(cx, asr, frames);
        let mut x = b.tensor(d + 2, frames);
        b.copy_rows(asr, 0, d, &mut x, 0);
        b.copy_rows(&f0d, 0, 1, &mut x, d);
        b.copy_rows(&nd, 0, 1, &mut x, d + 1);
        let mut x = self.encode.forward(cx, &x, s, frames);
        cx.put("dec.encode", &x, 1024, frames);
        cx.lap("decoder encode");
        let mut len = frames;
        let mut res = true;
        for blk in &self.decode {
            if res {
                let c = 1024;
                let mut cat = b.tensor(c + 66, len);
                b.copy_rows(&x, 0, c, &mut cat, 0);
                b.copy_rows(&asr_res, 0, 64, &mut cat, c);
                b.copy_rows(&f0d, 0, 1, &mut cat, c + 64);
                b.copy_rows(&nd, 0, 1, &mut cat, c + 65);
                x = cat;
            }
            x = blk.forward(cx, &x, s, len);
            if blk.len_out(len) != len {
                res = false;
            }
            len = blk.len_out(len);
        }
        cx.put("dec.decode", &x, 512, len);
        cx.lap("decoder decode");
        self.gen.forward(cx, &x, s, f0, len)
    }
}

pub struct Generator<B: Backend> {
    /// `m_source.l_linear`: the harmonics merged into one source signal.
    l_linear: Linear<B>,
    noise_convs: Vec<Conv<B>>,
    noise_res: Vec<AdaInResBlock1<B>>,
    ups: Vec<Conv<B>>,
    resblocks: Vec<AdaInResBlock1<B>>,
    conv_post: Conv<B>,
    harmonics: usize,
    upsample: usize,
    n_fft: usize,
    hop: usize,
    sample_rate: f32,
    n_kernels: usize,
}

impl<B: Backend> Generator<B> {
    pub fn load(b: &B, p: &Params, c: &Config) -> Result<Self, ModelError> {
        let g = "decoder.generator";
        let sty = c.style_dim;
        let (rates, kernels) = (&c.upsample_rates, &c.upsample_kernel_sizes);
        let n_fft = c.gen_istft_n_fft;
        let mut ups = Vec::new();
        let mut noise_convs = Vec::new();
        let mut noise_res = Vec::new();
        let mut resblocks = Vec::new();
        let mut ch = c.upsample_initial_channel;
        for (i, (&u, &k)) in rates.iter().zip(kernels).enumerate() {
            let s = ConvSpec {
                k,
                stride: u,
                pad: (k - u) / 2,
                dilation: 1,
                groups: 1,
                output_pad: 0,
                transposed: true,
            };
            ups.push(Conv::load(b, p, &format!("{g}.ups.{i}"), ch, ch / 2, s)?);
            ch /= 2;
            for (j, (&rk, dil)) in c
                .resblock_kernel_sizes
                .iter()
                .zip(&c.resblock_dilation_sizes)
                .enumerate()
            {
                let idx = i * c.resblock_kernel_sizes.len() + j;
                resblocks.push(AdaInResBlock1::load(
                    b,
                    p,
                    &format!("{g}.resblocks.{idx}"),
                    ch,
                    rk,
                    dil,
                    sty,
                )?);
            }
            let (spec, rk) = if i + 1 < rates.len() {
                let stride: usize = rates[i + 1..].iter().product();
                let s = ConvSpec {
                    k: 2 * stride,
                    stride,
                    pad: (stride + 1) / 2,
                    dilation: 1,
                    groups: 1,
                    output_pad: 0,
                    transposed: false,
                };
                (s, 7)
            } else {
                (ConvSpec::same(1, 1), 11)
            };
            noise_convs.push(Conv::load(
                b,
                p,
                &format!("{g}.noise_convs.{i}"),
                n_fft + 2,
                ch,
                spec,
            )?);
            noise_res.push(AdaInResBlock1::load(
                b,
                p,
                &format!("{g}.noise_res.{i}"),
                ch,
                rk,
                &[1, 3, 5],
                sty,
            )?);
        }
        let upsample = rates.iter().product::<usize>() * c.gen_istft_hop_size;
        Ok(Generator {
            l_linear: Linear::load(b, p, &format!("{g}.m_source.l_linear"), 9, 1)?,
            noise_convs,
            noise_res,
            ups,
            resblocks,
            conv_post: Conv::load(
                b,
                p,
                &format!("{g}.conv_post"),
                ch,
                n_fft + 2,
                ConvSpec::same(7, 1),
            )?,
            harmonics: 9,
            upsample,
            n_fft,
            hop: c.gen_istft_hop_size,
            sample_rate: 24000.0,
            n_kernels: c.resblock_kernel_sizes.len(),
        })
    }

    fn noise_res_c(&self, i: usize) -> usize {
        self.noise_convs[i].c_out
    }

    /// SineGen + SourceModuleHnNSF without their noise terms (the export drops them):
    /// f0 (frames) -> source (frames * upsample, 1), tanh(l_linear(harmonic sines * uv)).
    fn source(&self, cx: &Ctx<B>, f0: &[f32]) -> B::Tensor {
        let (up, nh) = (self.upsample, self.harmonics);
        let frames = f0.len();
        let len = frames * up;
        // Per harmonic: the phase increment per frame, its cumulative sum (x 2 pi x upsample),
        // linearly interpolated (half-pixel) back to the sample rate.
        let mut sines = vec![0f32; len * nh];
        for h in 0..nh {
            let mut cum = 0f32;
            let mut phase = Vec::with_capacity(frames);
            for &f in f0 {
                let r = f * (h + 1) as f32 / self.sample_rate;
                cum += r - r.floor();
                phase.push(cum * 2.0 * std::f32::consts::PI * up as f32);
            }
            for j in 0..len {
                let src = ((j as f32 + 0.5) / up as f32 - 0.5).max(0.0);
                let i0 = (src.floor() as usize).min(frames - 1);
                let i1 = (i0 + 1).min(frames - 1);
                let w = src - i0 as f32;
                sines[j * nh + h] = phase[i0] + (phase[i1] - phase[i0]) * w;
            }
        }
        kiln_backend::cpu::vmath::sin_slice(&mut sines);
        for (j, row) in sines.chunks_exact_mut(nh).enumerate() {
            let uv = if f0[j / up] > 10.0 { 0.1 } else { 0.0 };
            for v in row {
                *v *= uv;
            }
        }
        let x = cx.b.tensor_from(len, nh, &sines);
        let mut y = self.l_linear.forward(cx, &x, len);
        cx.b.unary(&mut y, Unary::Tanh, (len, 1), 0, len);
        y
    }

    /// x (ch, frames2), f0 (1, frames2) -> audio (1, samples)
    pub fn forward(
        &self,
        cx: &Ctx<B>,
        x: &B::Tensor,
        s: &B::Tensor,
        f0: &B::Tensor,
        frames: usize,
    ) -> (B::Tensor, usize) {
        let b = cx.b;
        let mut f0v = vec![0f32; frames];
        b.read(f0, 1, &mut f0v);
        let src = self.source(cx, &f0v);
        cx.put("gen.source", &src, frames * self.upsample, 1);
        let n_src = frames * self.upsample;
        let har_frames = n_src / self.hop + 1;
        let mut har = b.tensor(self.n_fft + 2, har_frames);
        b.stft(&src, n_src, self.n_fft, self.hop, &mut har);
        cx.put("gen.har", &har, self.n_fft + 2, har_frames);
        cx.lap("gen source, stft");

        let mut x = {
            let c = self.ups[0].c_in;
            let mut t = b.tensor(c, frames);
            b.copy_rows(x, 0, c, &mut t, 0);
            t
        };
        let mut len = frames;
        for i in 0..self.ups.len() {
            let c = self.ups[i].c_in;
            b.leaky_relu(&mut x, 0.1, c * len);
            let xs = self.noise_convs[i].forward(cx, &har, har_frames);
            let xs_len = self.noise_convs[i].len_out(har_frames);
            let xs = self.noise_res[i].forward(cx, &xs, s, xs_len);
            cx.lap(&format!("gen noise {i}"));
            cx.put(
                &format!("gen.noise_res.{i}"),
                &xs,
                self.noise_res_c(i),
                xs_len,
            );
            let mut y = self.ups[i].forward(cx, &x, len);
            let mut ylen = self.ups[i].len_out(len);
            let co = self.ups[i].c_out;
            if i + 1 == self.ups.len() {
                // ReflectionPad1d((1, 0)): prepend sample 1.
                y = b.reflect_pad_left(&y, co, ylen);
                ylen += 1;
            }
            debug_assert_eq!(ylen, xs_len);
            cx.lap(&format!("gen ups {i}"));
            b.add(&mut y, &xs, co);
            let k = self.n_kernels;
            let mut acc = self.resblocks[i * k].forward(cx, &y, s, ylen);
            for j in 1..k {
                let r = self.resblocks[i * k + j].forward(cx, &y, s, ylen);
                b.add(&mut acc, &r, co);
            }
            b.scale(&mut acc, 1.0 / k as f32, co * ylen);
            cx.put(&format!("gen.stage.{i}"), &acc, co, ylen);
            cx.lap(&format!("gen resblocks {i}"));
            x = acc;
            len = ylen;
        }
        let c = self.conv_post.c_in;
        b.leaky_relu(&mut x, 0.01, c * len);
        let mut spec = self.conv_post.forward(cx, &x, len);
        cx.put("gen.post", &spec, self.n_fft + 2, len);
        // Magnitude exp(post[..bins]), phase sin(post[bins..]).
        let bins = self.n_fft / 2 + 1;
        let shape = (2 * bins, len);
        b.unary(&mut spec, Unary::Exp, shape, 0, bins * len);
        b.unary(&mut spec, Unary::Sin, shape, bins * len, bins * len);
        let n_out = (len - 1) * self.hop;
        let mut audio = b.tensor(1, n_out);
        b.istft(&spec, len, self.n_fft, self.hop, &mut audio);
        // The level of Kokoro's ONNX export, which users compare against (kokoro-onnx): its
        // inverse STFT overlap-adds the windowed frames without dividing by the squared
        // window's overlap (torch.istft's normalization, which `istft` follows), so its audio
        // is that overlap's steady value louder: 1.5 for the Hann window of 20 at hop 5
        // (+3.5 dB; hexgrad's PyTorch pipeline, on torch.istft, is that much quieter).
        let gain = ola_gain(self.n_fft, self.hop);
        b.scale(&mut audio, gain, n_out);
        cx.lap("gen post, istft");
        (audio, n_out)
    }
}

/// The steady overlap of the squared periodic Hann window of `n_fft` at `hop`: the mean over
/// a hop's phases of the sum of w^2 at that phase in every overlapping frame.
fn ola_gain(n_fft: usize, hop: usize) -> f32 {
    let w2 = |j: usize| {
        let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * j as f64 / n_fft as f64).cos();
        w * w
    };
    let hop = hop.max(1);
    let total: f64 = (0..hop)
        .map(|p| (p..n_fft).step_by(hop).map(w2).sum::<f64>())
        .sum();
    (total / hop as f64) as f32
}
