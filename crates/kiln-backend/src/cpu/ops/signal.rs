//! Element-wise signal ops (snake, leaky ReLU), layout moves, dynamic-quantization rounding,
//! and the STFT / inverse STFT of iSTFTNet (small n_fft: direct DFT).

use std::f64::consts::PI;

use crate::cpu::CpuTensor;

/// Shares a feature map between threads that write disjoint channels.
#[derive(Clone, Copy)]
struct Rows(*mut f32);
// SAFETY: each thread writes only the rows of its own channel range.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

/// f(channel, row) for every channel of x (c, len), channels split over threads.
pub fn per_channel(
    pool: &crate::cpu::Pool,
    x: &mut CpuTensor,
    c: usize,
    len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    assert!(x.data.len() >= c * len, "feature map shape");
    let rows = Rows(x.data.as_mut_ptr());
    pool.run(c, |a, b| {
        let rows = rows;
        for ch in a..b {
            // SAFETY: row ch belongs to this thread alone and lies inside x (checked).
            let r = unsafe { std::slice::from_raw_parts_mut(rows.0.add(ch * len), len) };
            f(ch, r);
        }
    });
}

pub fn snake(pool: &crate::cpu::Pool, x: &mut CpuTensor, alpha: &CpuTensor, c: usize, len: usize) {
    per_channel(pool, x, c, len, |ch, r| {
        super::vmath::snake_row(r, alpha.data[ch])
    });
}

/// f(chunk, offset) over `v` in contiguous chunks, split over the pool's threads when `v` is
/// long enough to be worth it (feature maps of the vocoder), else in one call here.
pub fn par_chunks(pool: &crate::cpu::Pool, v: &mut [f32], f: impl Fn(&mut [f32], usize) + Sync) {
    const MIN: usize = 1 << 16;
    if v.len() < MIN {
        return f(v, 0);
    }
    let (p, n) = (Rows(v.as_mut_ptr()), v.len());
    pool.run_aligned(n, 1024, |a, b| {
        let p = p;
        // SAFETY: a..b is this thread's alone and lies inside v.
        f(
            unsafe { std::slice::from_raw_parts_mut(p.0.add(a), b - a) },
            a,
        )
    });
}

pub fn leaky_relu(pool: &crate::cpu::Pool, x: &mut CpuTensor, slope: f32, n: usize) {
    par_chunks(pool, &mut x.data[..n], |c, _| {
        for v in c {
            if *v < 0.0 {
                *v *= slope;
            }
        }
    })
}

pub fn scale(pool: &crate::cpu::Pool, x: &mut CpuTensor, s: f32, n: usize) {
    par_chunks(pool, &mut x.data[..n], |c, _| {
        for v in c {
            *v *= s;
        }
    })
}

pub fn transpose(x: &CpuTensor, rows: usize, cols: usize, out: &mut CpuTensor) {
    assert!(
        x.data.len() >= rows * cols && out.data.len() >= rows * cols,
        "transpose shape"
    );
    for r in 0..rows {
        for c in 0..cols {
            out.data[c * rows + r] = x.data[r * cols + c];
        }
    }
}

/// DynamicQuantizeLinear's (scale, zero point) for values in [lo, hi], and the rounding.
pub fn fake_quant_u8(x: &mut CpuTensor, n: usize) {
    let v = &mut x.data[..n];
    let lo = v.iter().fold(0f32, |a, &b| a.min(b));
    let hi = v.iter().fold(0f32, |a, &b| a.max(b));
    let scale = (hi - lo) / 255.0;
    if scale == 0.0 {
        return;
    }
    let zp = (-lo / scale).round_ties_even().clamp(0.0, 255.0);
    // Round half to even without a libm call: adding and removing 1.5 * 2^23 rounds any
    // |v| < 2^22 to the nearest integer, ties to even (here |x / scale| <= 255).
    const MAGIC: f32 = 12_582_912.0;
    for x in v.iter_mut() {
        let r = (*x / scale + MAGIC) - MAGIC;
        let q = (r + zp).clamp(0.0, 255.0);
        *x = (q - zp) * scale;
    }
}

fn hann(n_fft: usize) -> Vec<f64> {
    (0..n_fft)
        .map(|i| 0.5 - 0.5 * (2.0 * PI * i as f64 / n_fft as f64).cos())
        .collect()
}

/// Frames split over the pool's threads.
pub fn stft(
    pool: &crate::cpu::Pool,
    signal: &CpuTensor,
    len: usize,
    n_fft: usize,
    hop: usize,
    out: &mut CpuTensor,
) {
    let half = n_fft / 2;
    let bins = half + 1;
    let frames = len / hop + 1;
    assert!(
        out.cols == frames && out.data.len() >= 2 * bins * frames,
        "stft output shape"
    );
    let x = &signal.data[..len];
    // Reflect padding: index -i -> i, len - 1 + i -> len - 1 - i.
    let at = |i: isize| -> f64 {
        let n = len as isize;
        let j = if i < 0 {
            -i
        } else if i >= n {
            2 * (n - 1) - i
        } else {
            i
        };
        x[j.clamp(0, n - 1) as usize] as f64
    };
    let w = hann(n_fft);
    let (cos, sin): (Vec<f64>, Vec<f64>) = (0..bins * n_fft)
        .map(|i| {
            let a = 2.0 * PI * ((i / n_fft) * (i % n_fft)) as f64 / n_fft as f64;
            (a.cos(), a.sin())
        })
        .unzip();
    let o = crate::cpu::par::SharedMut(out.data.as_mut_ptr());
    pool.run(frames, |f0, f1| {
        let o = o;
        let mut frame = vec![0f64; n_fft];
        for f in f0..f1 {
            for (j, v) in frame.iter_mut().enumerate() {
                *v = at((f * hop + j) as isize - half as isize) * w[j];
            }
            for k in 0..bins {
                let (mut re, mut im) = (0f64, 0f64);
                for (j, &v) in frame.iter().enumerate() {
                    re += v * cos[k * n_fft + j];
                    im -= v * sin[k * n_fft + j];
                }
                // SAFETY: column f is this thread's; both rows lie inside out (checked).
                unsafe {
                    o.write(k * frames + f, (re * re + im * im).sqrt() as f32);
                    o.write((bins + k) * frames + f, im.atan2(re) as f32);
                }
            }
        }
    });
}

/// Each frame's inverse DFT on the pool's threads, then the overlap-add in frame order.
pub fn istft(
    pool: &crate::cpu::Pool,
    spec: &CpuTensor,
    frames: usize,
    n_fft: usize,
    hop: usize,
    out: &mut CpuTensor,
) {
    let half = n_fft / 2;
    let bins = half + 1;
    let full = (frames - 1) * hop + n_fft;
    let n_out = (frames - 1) * hop;
    assert!(spec.data.len() >= 2 * bins * frames, "istft input shape");
    assert!(out.data.len() >= n_out, "istft output shape");
    let w = hann(n_fft);
    let mut acc = vec![0f64; full];
    let mut env = vec![0f64; full];
    // cos / sin of 2 pi k j / n_fft, and each bin's weight in the one-sided sum.
    let (cos, sin): (Vec<f64>, Vec<f64>) = (0..bins * n_fft)
        .map(|i| {
            let a = 2.0 * PI * ((i / n_fft) * (i % n_fft)) as f64 / n_fft as f64;
            (a.cos(), a.sin())
        })
        .unzip();
    let weight = |k: usize| {
        if k == 0 || (n_fft % 2 == 0 && k == half) {
            1.0
        } else {
            2.0
        }
    };
    // Windowed samples of every frame: y[f][j].
    let mut y = vec![0f64; frames * n_fft];
    let yp = YPtr(y.as_mut_ptr());
    pool.run(frames, |f0, f1| {
        let yp = yp;
        let mut re = vec![0f64; bins];
        let mut im = vec![0f64; bins];
        for f in f0..f1 {
            for k in 0..bins {
                let mag = spec.data[k * frames + f] as f64;
                let ph = spec.data[(bins + k) * frames + f] as f64;
                let (s, c) = ph.sin_cos();
                re[k] = weight(k) * mag * c;
                im[k] = weight(k) * mag * s;
            }
            // SAFETY: row f of y is this thread's alone and lies inside y.
            let row = unsafe { std::slice::from_raw_parts_mut(yp.0.add(f * n_fft), n_fft) };
            for (j, yv) in row.iter_mut().enumerate() {
                // Real inverse DFT of the one-sided spectrum at sample j of the frame.
                let mut v = 0f64;
                for k in 0..bins {
                    v += re[k] * cos[k * n_fft + j] - im[k] * sin[k * n_fft + j];
                }
                v /= n_fft as f64;
                *yv = v * w[j];
            }
        }
    });
    for (f, row) in y.chunks_exact(n_fft).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            acc[f * hop + j] += v;
            env[f * hop + j] += w[j] * w[j];
        }
    }
    for (i, o) in out.data[..n_out].iter_mut().enumerate() {
        let e = env[i + half];
        *o = if e > 1e-11 {
            (acc[i + half] / e) as f32
        } else {
            acc[i + half] as f32
        };
    }
}

/// Rows of `istft`'s frame buffer, shared by its threads (disjoint rows).
#[derive(Clone, Copy)]
struct YPtr(*mut f64);
// SAFETY: each thread writes only its own frames' rows.
unsafe impl Send for YPtr {}
unsafe impl Sync for YPtr {}

pub fn upsample_nearest(x: &CpuTensor, c: usize, len: usize, factor: usize, out: &mut CpuTensor) {
    assert!(
        out.data.len() >= c * len * factor,
        "upsample_nearest output shape"
    );
    for ch in 0..c {
        let src = &x.data[ch * len..(ch + 1) * len];
        let dst = &mut out.data[ch * len * factor..(ch + 1) * len * factor];
        for (d, &v) in dst.chunks_exact_mut(factor).zip(src) {
            d.fill(v);
        }
    }
}

/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
pub fn gelu_tanh(x: &mut CpuTensor, n: usize) {
    const C: f32 = 0.797_884_6;
    for v in &mut x.data[..n] {
        let u = *v;
        *v = 0.5 * u * (1.0 + (C * (u + 0.044715 * u * u * u)).tanh());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rounding matches round-half-even on the whole grid, ties included.
    #[test]
    fn fake_quant_rounds_half_to_even() {
        let mut vals: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.25).collect();
        vals.push(-150.0); // min: scale = 300 / 255
        vals.push(150.0);
        let lo = -150f32;
        let scale = 300f32 / 255.0;
        let zp = (-lo / scale).round_ties_even();
        let want: Vec<f32> = vals
            .iter()
            .map(|&x| (((x / scale).round_ties_even() + zp).clamp(0.0, 255.0) - zp) * scale)
            .collect();
        let mut t = CpuTensor {
            data: vals.clone(),
            cols: vals.len(),
        };
        fake_quant_u8(&mut t, vals.len());
        assert_eq!(t.data, want);
    }
}
