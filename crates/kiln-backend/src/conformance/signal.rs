//! Speech and signal ops: convolutions (integer ones too), LSTMs, STFT, uint8 fake quantization.

use super::*;
use crate::{SpeechOps, TensorOps};

/// Whisper's time-major `conv1d` (kernel 3, pad 1, strides 1 and 2, with and without a
/// bias), f32 and f16 weights.
pub fn conv1d<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4001));
    for (t_in, c_in, c_out, k) in [(37, 20, 24, 3), (150, 80, 64, 3), (1, 8, 16, 3)] {
        for ty in [GgmlType::F32, GgmlType::F16] {
            let bytes = weight_data(ty, c_out, c_in * k, &mut rng);
            let Some(wb) = load(b, "conv1d", ty, c_out, c_in * k, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, c_out, c_in * k, &bytes);
            let (bias, x) = (rng.v(c_out), rng.v(t_in * c_in));
            let (bt, br) = both(b, &rf, 1, c_out, &bias);
            let (xt, xr) = both(b, &rf, t_in, c_in, &x);
            for (stride, with_bias) in [(1, true), (2, true), (1, false)] {
                let (mut o, mut orf) = (b.tensor(t_in, c_out), rf.r.tensor(t_in, c_out));
                let tb = b.conv1d(
                    &wb,
                    with_bias.then_some(&bt),
                    &xt,
                    t_in,
                    k,
                    stride,
                    1,
                    &mut o,
                );
                let tr = rf.r.conv1d(
                    &wr,
                    with_bias.then_some(&br),
                    &xr,
                    t_in,
                    k,
                    stride,
                    1,
                    &mut orf,
                );
                let case = format!("{} t_in={t_in} c_in={c_in} c_out={c_out} k={k} stride={stride} bias={with_bias}", ty.name());
                assert_eq!(tb, tr, "{name}: conv1d [{case}]: output length");
                // A product over the im2col rows: f16 weights may take the backend's prompt
                // product (f16 activations on tensor cores), which the product bound holds.
                let bound = if ty == GgmlType::F16 {
                    tol.product
                } else {
                    tol.conv
                };
                check_rel(
                    &name,
                    "conv1d",
                    case,
                    &read(b, &o, tb, c_out),
                    &read(&rf.r, &orf, tr, c_out),
                    bound,
                );
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
const fn conv(
    c_in: usize,
    c_out: usize,
    len_in: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    groups: usize,
    output_pad: usize,
) -> Conv1dShape {
    Conv1dShape {
        c_in,
        c_out,
        len_in,
        k,
        stride,
        pad,
        dilation,
        groups,
        output_pad,
    }
}

/// The shapes `conv1d_nc` runs, with whether each is transposed: plain, dilated, strided,
/// grouped, depthwise; transposed plain, depthwise and with an output pad (Kokoro's kinds).
pub const CONV_NC_CASES: [(Conv1dShape, bool); 8] = [
    (conv(64, 48, 300, 7, 1, 9, 3, 1, 0), false),
    (conv(32, 32, 257, 1, 1, 0, 1, 1, 0), false),
    (conv(16, 24, 101, 3, 2, 1, 1, 1, 0), false),
    (conv(24, 24, 99, 3, 1, 1, 1, 24, 0), false),
    (conv(16, 8, 50, 5, 1, 2, 1, 2, 0), false),
    (conv(64, 32, 40, 20, 10, 5, 1, 1, 0), true),
    (conv(24, 24, 33, 3, 2, 1, 1, 24, 1), true),
    (conv(16, 8, 20, 4, 2, 1, 1, 1, 1), true),
];

/// `conv1d_nc` (plain, dilated, strided, grouped, depthwise) and `conv_transpose1d` (and its
/// packed weight where the backend makes one), with and without a bias.
pub fn conv1d_nc<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4002));
    for (s, transposed) in CONV_NC_CASES {
        let (wr_rows, wr_cols) = match transposed {
            false => (s.c_out, s.c_in / s.groups * s.k),
            true => (s.c_in, s.c_out / s.groups * s.k),
        };
        let lo = if transposed {
            s.len_out_transposed()
        } else {
            s.len_out()
        };
        let (x, w, bias) = (
            rng.v(s.c_in * s.len_in),
            rng.v(wr_rows * wr_cols),
            rng.v(s.c_out),
        );
        let (xt, xr) = both(b, &rf, s.c_in, s.len_in, &x);
        let (wt, wr) = both(b, &rf, wr_rows, wr_cols, &w);
        let (bt, br) = both(b, &rf, 1, s.c_out, &bias);
        let packed = transposed.then(|| b.conv_transpose_weight(&w, s)).flatten();
        if transposed && packed.is_none() {
            declined(
                &name,
                "conv_transpose1d_packed",
                format!("{s:?}"),
                "conv_transpose_weight gives None",
            );
        }
        for with_bias in [true, false] {
            let (bo, bro) = (with_bias.then_some(&bt), with_bias.then_some(&br));
            let (mut o, mut orf) = (b.tensor(s.c_out, lo), rf.r.tensor(s.c_out, lo));
            match transposed {
                true => rf.r.conv_transpose1d(&xr, &wr, bro, s, &mut orf),
                false => rf.r.conv1d_nc(&xr, &wr, bro, s, &mut orf),
            }
            let want = read(&rf.r, &orf, s.c_out, lo);
            let case = format!("{s:?} bias={with_bias}");
            match transposed {
                true => b.conv_transpose1d(&xt, &wt, bo, s, &mut o),
                false => b.conv1d_nc(&xt, &wt, bo, s, &mut o),
            }
            let op = if transposed {
                "conv_transpose1d"
            } else {
                "conv1d_nc"
            };
            check_rel(&name, op, &case, &read(b, &o, s.c_out, lo), &want, tol.conv);
            if let Some(p) = &packed {
                let mut o = b.tensor(s.c_out, lo);
                b.conv_transpose1d_packed(&xt, p, bo, s, &mut o);
                check_rel(
                    &name,
                    "conv_transpose1d_packed",
                    &case,
                    &read(b, &o, s.c_out, lo),
                    &want,
                    tol.conv,
                );
            }
        }
    }
}

/// `conv1d_q8` and `ada_in_snake_conv1d_q8` where the backend makes an integer weight
/// (`conv_weight_q8`), against the reference's route: `fake_quant_u8` of the input and
/// `conv1d_nc` on the dequantized weight; per-tensor and per-channel zero points.
pub fn conv1d_q8<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4003));
    for (s, per_channel) in [
        (conv(64, 48, 300, 7, 1, 9, 3, 1, 0), false),
        (conv(32, 32, 257, 1, 1, 0, 1, 1, 0), true),
        (conv(16, 24, 101, 3, 2, 1, 1, 1, 0), true),
    ] {
        let nw = s.c_out * s.c_in * s.k;
        let q: Vec<u8> = (0..nw).map(|_| rng.next() as u8).collect();
        let np = if per_channel { s.c_out } else { 1 };
        let zero: Vec<i32> = (0..np).map(|_| 100 + (rng.next() % 56) as i32).collect();
        let scale: Vec<f32> = (0..np).map(|_| 0.002 + rng.f().abs() * 0.004).collect();
        let case = format!("{s:?} per_channel={per_channel}");
        let Some(wq) = b.conv_weight_q8(
            ConvWeightQ8 {
                q: &q,
                zero: &zero,
                scale: &scale,
            },
            s,
        ) else {
            declined(
                &name,
                "conv1d_q8",
                &case,
                "conv_weight_q8 gives None (no integer kernel)",
            );
            continue;
        };
        let wd: Vec<f32> = (0..nw)
            .map(|i| {
                let o = i / (s.c_in * s.k);
                let (z, sc) = if per_channel {
                    (zero[o], scale[o])
                } else {
                    (zero[0], scale[0])
                };
                (q[i] as i32 - z) as f32 * sc
            })
            .collect();
        let wr = rf.t(s.c_out, s.c_in * s.k, &wd);
        let (x, bias) = (rng.v(s.c_in * s.len_in), rng.v(s.c_out));
        let x: Vec<f32> = x.iter().map(|v| v * 2.0 + 0.3).collect();
        let (bt, br) = both(b, &rf, 1, s.c_out, &bias);
        let lo = s.len_out();
        // The reference route from `x` (already through ada_in/snake where those apply).
        let want_from = |xr: &mut CpuTensor| {
            rf.r.fake_quant_u8(xr, s.c_in * s.len_in);
            let mut o = rf.r.tensor(s.c_out, lo);
            rf.r.conv1d_nc(xr, &wr, Some(&br), s, &mut o);
            read(&rf.r, &o, s.c_out, lo)
        };
        let (xt, mut xr) = both(b, &rf, s.c_in, s.len_in, &x);
        let mut o = b.tensor(s.c_out, lo);
        b.conv1d_q8(&xt, &wq, Some(&bt), s, &mut o);
        let want = want_from(&mut xr);
        check_rel(
            &name,
            "conv1d_q8",
            &case,
            &read(b, &o, s.c_out, lo),
            &want,
            tol.conv,
        );
        let gb = rng.v(2 * s.c_in);
        let alpha: Vec<f32> = rng.v(s.c_in).iter().map(|v| 0.3 + v.abs()).collect();
        let (gbt, gbr) = both(b, &rf, 1, 2 * s.c_in, &gb);
        let (at, ar) = both(b, &rf, 1, s.c_in, &alpha);
        for (with_alpha, accumulate) in [(true, false), (false, true)] {
            let start = rng.v(s.c_out * lo);
            let mut o = b.tensor_from(s.c_out, lo, &start);
            b.ada_in_snake_conv1d_q8(
                &xt,
                &gbt,
                with_alpha.then_some(&at),
                1e-5,
                &wq,
                Some(&bt),
                s,
                accumulate,
                &mut o,
            );
            let mut xr = rf.t(s.c_in, s.len_in, &x);
            rf.r.ada_in(&mut xr, &gbr, s.c_in, s.len_in, 1e-5);
            if with_alpha {
                rf.r.snake(&mut xr, &ar, s.c_in, s.len_in);
            }
            let mut want = want_from(&mut xr);
            if accumulate {
                want = added(&want, &start);
            }
            let case = format!("{case} snake={with_alpha} accumulate={accumulate}");
            check_rel(
                &name,
                "ada_in_snake_conv1d_q8",
                case,
                &read(b, &o, s.c_out, lo),
                &want,
                tol.conv,
            );
        }
    }
}

/// `lstm` (both directions, written at a column offset) and `bilstm_steps` (Kokoro's 256
/// units over 300 steps too). Weights in PyTorch's initial range, U(-1/sqrt(h), 1/sqrt(h)):
/// with weights up to 1 a recurrence of 64 units is chaotic, and a last-bit difference in
/// one step (another exp, a fused multiply-add) grows 20% a step (4.7e-4 after 50 steps on
/// lavapipe).
pub fn lstm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4004));
    for (len, n_in, h) in [(17, 24, 16), (1, 8, 40), (50, 64, 64), (300, 64, 256)] {
        let x = rng.v(len * n_in);
        let (xt, xr) = both(b, &rf, len, n_in, &x);
        let k = 1.0 / (h as f32).sqrt();
        let init =
            |rng: &mut Rng, n: usize| -> Vec<f32> { rng.v(n).iter().map(|v| v * k).collect() };
        let (wih, whh, bias) = (
            init(&mut rng, 4 * h * n_in),
            init(&mut rng, 4 * h * h),
            init(&mut rng, 4 * h),
        );
        let (wiht, wihr) = both(b, &rf, 4 * h, n_in, &wih);
        let (whht, whhr) = both(b, &rf, 4 * h, h, &whh);
        let (bt, br) = both(b, &rf, 1, 4 * h, &bias);
        let (mut o, mut orf) = (b.tensor(len, 2 * h), rf.r.tensor(len, 2 * h));
        for (reverse, out_col) in [(false, 0), (true, h)] {
            let s = LstmShape {
                len,
                n_in,
                hidden: h,
                reverse,
                out_col,
            };
            b.lstm(&xt, &wiht, &whht, &bt, s, &mut o);
            rf.r.lstm(&xr, &wihr, &whhr, &br, s, &mut orf);
        }
        let case = format!("len={len} n_in={n_in} hidden={h}");
        check_rel(
            &name,
            "lstm",
            &case,
            &read(b, &o, len, 2 * h),
            &read(&rf.r, &orf, len, 2 * h),
            tol.lstm,
        );
        let (gx, w2) = (rng.v(len * 8 * h), init(&mut rng, 2 * h * 4 * h));
        let (gxt, gxr) = both(b, &rf, len, 8 * h, &gx);
        let (w2t, w2r) = both(b, &rf, 2 * h, 4 * h, &w2);
        let (mut o, mut orf) = (b.tensor(len, 2 * h), rf.r.tensor(len, 2 * h));
        b.bilstm_steps(&gxt, &w2t, len, h, &mut o);
        rf.r.bilstm_steps(&gxr, &w2r, len, h, &mut orf);
        check_rel(
            &name,
            "bilstm_steps",
            &case,
            &read(b, &o, len, 2 * h),
            &read(&rf.r, &orf, len, 2 * h),
            tol.lstm,
        );
    }
}

/// `stft` (compared as complex values: a phase near ±π may flip sign) and `istft`.
pub fn stft<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4005));
    for (len, n_fft, hop) in [(999, 20, 5), (4000, 64, 16), (30, 16, 4)] {
        let bins = n_fft / 2 + 1;
        let frames = len / hop + 1;
        let x = rng.v(len);
        let (xt, xr) = both(b, &rf, 1, len, &x);
        let (mut o, mut orf) = (b.tensor(2 * bins, frames), rf.r.tensor(2 * bins, frames));
        b.stft(&xt, len, n_fft, hop, &mut o);
        rf.r.stft(&xr, len, n_fft, hop, &mut orf);
        let complex = |v: Vec<f32>| -> Vec<f32> {
            let (m, p) = v.split_at(bins * frames);
            m.iter()
                .zip(p)
                .flat_map(|(m, p)| [m * p.cos(), m * p.sin()])
                .collect()
        };
        let case = format!("len={len} n_fft={n_fft} hop={hop}");
        let (got, want) = (
            complex(read(b, &o, 2 * bins, frames)),
            complex(read(&rf.r, &orf, 2 * bins, frames)),
        );
        check_rel(&name, "stft", &case, &got, &want, tol.stft);
        // A spectrum of positive magnitudes and any phases back to samples.
        let mag: Vec<f32> = rng.v(bins * frames).iter().map(|v| v.abs() + 0.1).collect();
        let ph: Vec<f32> = rng.v(bins * frames).iter().map(|v| v * 3.0).collect();
        let spec = [mag, ph].concat();
        let (st, sr) = both(b, &rf, 2 * bins, frames, &spec);
        let n_out = (frames - 1) * hop;
        let (mut o, mut orf) = (b.tensor(1, n_out), rf.r.tensor(1, n_out));
        b.istft(&st, frames, n_fft, hop, &mut o);
        rf.r.istft(&sr, frames, n_fft, hop, &mut orf);
        check_rel(
            &name,
            "istft",
            &case,
            &read(b, &o, 1, n_out),
            &read(&rf.r, &orf, 1, n_out),
            tol.stft,
        );
    }
}

/// `fake_quant_u8`: the same uint8 grid value for value (all positive; exact halves where
/// rounding half to even decides; a count that ends inside a row).
pub fn fake_quant_u8<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4006));
    let ties: Vec<f32> = (-255..=255).map(|i| i as f32 * 0.5).collect();
    let mixed: Vec<f32> = rng.v(70_001).iter().map(|v| v * 3.0).collect();
    let positive: Vec<f32> = rng.v(3_001).iter().map(|v| v * 3.0 + 5.0).collect();
    for (what, x, n) in [
        ("ties", &ties, ties.len()),
        ("mixed", &mixed, mixed.len()),
        ("positive", &positive, 2_999),
    ] {
        let (mut xt, mut xr) = both(b, &rf, 1, x.len(), x);
        b.fake_quant_u8(&mut xt, n);
        rf.r.fake_quant_u8(&mut xr, n);
        let case = format!("{what}, {n} of {} values", x.len());
        check_exact(
            &name,
            "fake_quant_u8",
            case,
            &read(b, &xt, 1, x.len()),
            &read(&rf.r, &xr, 1, x.len()),
        );
    }
}

/// `unary` (exp, sin, tanh over a range of a tensor that starts and ends inside rows, the
/// rest left as it was; tanh past where it is 1 in f32) and `reflect_pad_left`.
pub fn unary_pad<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4007));
    let (rows, cols) = (22, 301);
    let x: Vec<f32> = rng.v(rows * cols).iter().map(|v| v * 9.0).collect();
    for op in [Unary::Exp, Unary::Sin, Unary::Tanh] {
        for (start, n) in [
            (0, rows * cols),
            (cols + 7, 5 * cols - 3),
            (11 * cols, 11 * cols),
        ] {
            let (mut xt, mut xr) = both(b, &rf, rows, cols, &x);
            b.unary(&mut xt, op, (rows, cols), start, n);
            rf.r.unary(&mut xr, op, (rows, cols), start, n);
            check_rel(
                &name,
                "unary",
                format!("{op:?} values {start}..{} of {rows}x{cols}", start + n),
                &read(b, &xt, rows, cols),
                &read(&rf.r, &xr, rows, cols),
                tol.elementwise,
            );
        }
    }
    for (c, len) in [(128, 1213), (3, 2)] {
        let x = rng.v(c * len);
        let (xt, xr) = both(b, &rf, c, len, &x);
        let (o, orf) = (
            b.reflect_pad_left(&xt, c, len),
            rf.r.reflect_pad_left(&xr, c, len),
        );
        check_exact(
            &name,
            "reflect_pad_left",
            format!("{c}x{len}"),
            &read(b, &o, c, len + 1),
            &read(&rf.r, &orf, c, len + 1),
        );
    }
}
