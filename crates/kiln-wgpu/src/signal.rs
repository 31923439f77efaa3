//! Kokoro's signal ops on the GPU (shaders/signal.wgsl): convolutions over (channels, len)
//! maps as a tiled product over their taps (grouped ones a thread per output), transposed
//! ones as the product then a gather of the taps, the uint8 rounding of the int8 export, the
//! STFT and its inverse, the recurrences of a bidirectional LSTM (a workgroup a direction).

use kiln_backend::{Conv1dShape, TensorOps, Unary};

use crate::device::Buf;
use crate::{ensure, grid_1d, WgpuBackend, WgpuTensor};

/// signal.wgsl conv_gemm's output tile (rows and columns).
const TILE: usize = 64;
/// signal.wgsl bilstm_steps's most hidden units (LSTM_MAX_H).
const LSTM_MAX_H: usize = 1024;
/// Passes of bilstm_steps's inner loop an invocation makes in one dispatch at most (lavapipe
/// ends a shader's loops past 65535 passes in all).
const LSTM_STEP_LOOPS: usize = 32768;
/// Values a workgroup of signal.wgsl u8_range_parts takes (RANGE_CHUNK).
const RANGE_CHUNK: usize = 4096;

impl WgpuBackend {
    /// Checks the tensors of convolution `s` (transposed or not) and gives its output length.
    fn conv_checked(
        x: &WgpuTensor,
        w: &WgpuTensor,
        out: &WgpuTensor,
        s: &Conv1dShape,
        transposed: bool,
    ) -> usize {
        let g = s.groups.max(1);
        let (lo, w_len) = match transposed {
            false => (s.len_out(), s.c_out * (s.c_in / g)),
            true => (s.len_out_transposed(), s.c_in * (s.c_out / g)),
        };
        assert!(
            s.c_in.is_multiple_of(g)
                && s.c_out.is_multiple_of(g)
                && x.rows * x.cols >= s.c_in * s.len_in
                && w.rows * w.cols >= w_len * s.k
                && out.rows * out.cols >= s.c_out * lo,
            "convolution (transposed: {transposed}): tensors smaller than the shape {s:?}"
        );
        lo
    }

    /// signal.wgsl conv_gemm: out (m, n) = A (m, k) im2col(x) (k, n) (+ bias), A the weight
    /// rows (`a_km`: stored k-major), x (k / taps, len_in) read with (taps, stride, pad, dil).
    #[allow(clippy::too_many_arguments)]
    fn conv_gemm(
        &self,
        (m, n, k): (usize, usize, usize),
        a: &Buf,
        a_km: bool,
        x: &Buf,
        (len_in, taps, stride, pad, dil): (usize, usize, usize, i32, usize),
        bias: Option<&WgpuTensor>,
        out: &Buf,
    ) {
        let d = &self.gpu.dummy;
        let bufs = [x, a, bias.map_or(d, |b| &b.buf), out];
        // A grid dimension holds 65535 workgroups: the column tiles in runs of that many.
        let tiles = n.div_ceil(TILE);
        for t0 in (0..tiles).step_by(65535) {
            let p = [
                m as u32,
                n as u32,
                k as u32,
                a_km as u32,
                bias.is_some() as u32,
                len_in as u32,
                taps as u32,
                stride as u32,
                pad as u32,
                dil as u32,
                t0 as u32,
            ];
            let grid = ((tiles - t0).min(65535) as u32, m.div_ceil(TILE) as u32, 1);
            self.gpu.dispatch("signal", "conv_gemm", &p, &bufs, grid);
        }
    }

    /// signal.wgsl conv_direct: the grouped convolution (or transposed one) a thread per output.
    #[allow(clippy::too_many_arguments)]
    fn conv_direct(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        s: &Conv1dShape,
        lo: usize,
        transposed: bool,
        out: &WgpuTensor,
    ) {
        let d = &self.gpu.dummy;
        let p = [
            s.c_in as u32,
            s.c_out as u32,
            s.len_in as u32,
            s.k as u32,
            s.stride as u32,
            s.pad as u32,
            s.dilation as u32,
            s.groups as u32,
            lo as u32,
            bias.is_some() as u32,
            transposed as u32,
        ];
        let bufs = [&x.buf, &w.buf, bias.map_or(d, |b| &b.buf), &out.buf];
        let grid = grid_1d(s.c_out * lo);
        self.gpu.dispatch("signal", "conv_direct", &p, &bufs, grid);
    }

    /// out (c_out, len_out) = conv1d(x (c_in, len_in), w (c_out, c_in / groups, k)) + bias.
    pub(crate) fn conv1d_nc_gpu(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        s: Conv1dShape,
        out: &mut WgpuTensor,
    ) {
        let lo = Self::conv_checked(x, w, out, &s, false);
        if lo == 0 || s.c_out == 0 {
            return;
        }
        if s.groups > 1 {
            return self.conv_direct(x, w, bias, &s, lo, false, out);
        }
        let taps = (s.len_in, s.k, s.stride, s.pad as i32, s.dilation);
        let mnk = (s.c_out, lo, s.c_in * s.k);
        self.conv_gemm(mnk, &w.buf, false, &x.buf, taps, bias, &out.buf);
    }

    /// out (c_out, len_out_transposed) = conv_transpose1d(x (c_in, len_in), w (c_in, c_out /
    /// groups, k)) + bias.
    pub(crate) fn conv_transpose1d_gpu(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        s: Conv1dShape,
        out: &mut WgpuTensor,
    ) {
        let lo = Self::conv_checked(x, w, out, &s, true);
        if lo == 0 || s.c_out == 0 {
            return;
        }
        if s.groups > 1 {
            return self.conv_direct(x, w, bias, &s, lo, true, out);
        }
        // cols (c_out * k, len_in) = W^T x (W (c_in, c_out * k) read k-major), then each
        // output gathers its taps; in runs of inputs where cols would be past what the
        // adapter binds at once (a long utterance on a 128 MiB adapter), each run's taps
        // added to the outputs.
        let ck = s.c_out * s.k;
        let run = (self.gpu.max_binding as usize / (4 * ck)).clamp(1, s.len_in);
        let cols = ensure(
            &self.gpu,
            &mut self.scratch.borrow_mut().im2col,
            ck * run * 4,
        );
        let d = &self.gpu.dummy;
        for s0 in (0..s.len_in).step_by(run) {
            let n = run.min(s.len_in - s0);
            // Columns s0..s0 + n of x: a plain matrix shifted by a negative pad.
            let plain = (s.len_in, 1, 1, -(s0 as i32), 1);
            self.conv_gemm((ck, n, s.c_in), &w.buf, true, &x.buf, plain, None, &cols);
            let p = [
                s.c_out as u32,
                s.k as u32,
                s0 as u32,
                s.stride as u32,
                s.pad as u32,
                s.dilation as u32,
                lo as u32,
                bias.is_some() as u32,
                n as u32,
                (s0 > 0) as u32,
            ];
            let bufs = [&cols, d, bias.map_or(d, |b| &b.buf), &out.buf];
            let grid = grid_1d(s.c_out * lo);
            self.gpu.dispatch("signal", "col2im_t", &p, &bufs, grid);
        }
    }

    /// The first n values of x rounded to their uint8 grid (ONNX DynamicQuantizeLinear): the
    /// range of each chunk of values, of the chunks' in one workgroup, then the rounding.
    pub(crate) fn fake_quant_gpu(&self, x: &mut WgpuTensor, n: usize) {
        assert!(
            x.rows * x.cols >= n,
            "fake_quant_u8: {n} values past the tensor"
        );
        if n == 0 {
            return;
        }
        let parts = n.div_ceil(RANGE_CHUNK);
        let (range, part) = {
            let mut sc = self.scratch.borrow_mut();
            let range = ensure(&self.gpu, &mut sc.range, 8);
            (range, ensure(&self.gpu, &mut sc.range_parts, 8 * parts))
        };
        let d = &self.gpu.dummy;
        let p = [n as u32];
        let bufs = [&x.buf, d, d, &part];
        let grid = grid_1d(parts * 256);
        self.gpu
            .dispatch("signal", "u8_range_parts", &p, &bufs, grid);
        let bufs = [&part, d, d, &range];
        let pp = [parts as u32];
        self.gpu
            .dispatch("signal", "u8_range", &pp, &bufs, (1, 1, 1));
        let bufs = [&x.buf, d, &range, d];
        self.gpu
            .dispatch("signal", "fake_quant_u8", &p, &bufs, grid_1d(n));
    }

    /// cos and sin of 2 pi m / n_fft and the periodic Hann window (signal.wgsl's table), made
    /// in f64 on the host as the CPU backend's.
    fn dft_table(&self, n_fft: usize) -> Buf {
        let mut sc = self.scratch.borrow_mut();
        if let Some((_, b)) = sc.dft.iter().find(|(n, _)| *n == n_fft) {
            return b.clone();
        }
        let tau = 2.0 * std::f64::consts::PI;
        let angle = |m: usize| tau * m as f64 / n_fft as f64;
        let v: Vec<f32> = (0..n_fft)
            .map(|m| angle(m).cos() as f32)
            .chain((0..n_fft).map(|m| angle(m).sin() as f32))
            .chain((0..n_fft).map(|m| (0.5 - 0.5 * angle(m).cos()) as f32))
            .collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let b = self.gpu.buffer_init(&bytes);
        if sc.dft.len() >= 4 {
            sc.dft.remove(0);
        }
        sc.dft.push((n_fft, b.clone()));
        b
    }

    pub(crate) fn stft_gpu(
        &self,
        signal: &WgpuTensor,
        len: usize,
        n_fft: usize,
        hop: usize,
        out: &mut WgpuTensor,
    ) {
        let (bins, frames) = (n_fft / 2 + 1, len / hop.max(1) + 1);
        assert!(
            n_fft > 0
                && hop > 0
                && len > 0
                && signal.rows * signal.cols >= len
                && out.cols == frames
                && out.rows * out.cols >= 2 * bins * frames,
            "stft: len {len}, n_fft {n_fft}, hop {hop} against tensors of {} and {}x{}",
            signal.rows * signal.cols,
            out.rows,
            out.cols
        );
        let table = self.dft_table(n_fft);
        let p = [len, n_fft, hop, frames, bins].map(|v| v as u32);
        let bufs = [&signal.buf, &table, &self.gpu.dummy, &out.buf];
        let grid = grid_1d(bins * frames);
        self.gpu.dispatch("signal", "stft", &p, &bufs, grid);
    }

    pub(crate) fn istft_gpu(
        &self,
        spec: &WgpuTensor,
        frames: usize,
        n_fft: usize,
        hop: usize,
        out: &mut WgpuTensor,
    ) {
        let bins = n_fft / 2 + 1;
        let n_out = frames.saturating_sub(1) * hop;
        assert!(
            n_fft > 0 && spec.rows * spec.cols >= 2 * bins * frames && out.rows * out.cols >= n_out,
            "istft: {frames} frames of n_fft {n_fft}, hop {hop} against tensors of {} and {}",
            spec.rows * spec.cols,
            out.rows * out.cols
        );
        if n_out == 0 {
            return;
        }
        let table = self.dft_table(n_fft);
        let p = [frames, n_fft, hop, n_out, bins].map(|v| v as u32);
        let bufs = [&spec.buf, &table, &self.gpu.dummy, &out.buf];
        self.gpu
            .dispatch("signal", "istft", &p, &bufs, grid_1d(n_out));
    }

    /// Values start..start + n of x through `op`, in place.
    pub(crate) fn unary_gpu(&self, x: &mut WgpuTensor, op: Unary, start: usize, n: usize) {
        assert!(
            start + n <= x.rows * x.cols,
            "unary: values {start}..{} past the tensor",
            start + n
        );
        let code = match op {
            Unary::Exp => 0,
            Unary::Sin => 1,
            Unary::Tanh => 2,
        };
        let d = &self.gpu.dummy;
        let p = [n as u32, start as u32, code];
        let bufs = [&x.buf, d, d, d];
        self.gpu.dispatch("signal", "unary", &p, &bufs, grid_1d(n));
    }

    /// out (c, len + 1) = x (c, len) with sample 1 of each row put before it.
    pub(crate) fn reflect_pad_left_gpu(&self, x: &WgpuTensor, c: usize, len: usize) -> WgpuTensor {
        assert!(
            len >= 2 && x.rows * x.cols >= c * len,
            "reflect_pad_left: {c} rows of {len} samples"
        );
        let out = self.tensor(c, len + 1);
        let d = &self.gpu.dummy;
        let p = [c as u32, len as u32];
        let bufs = [&x.buf, d, d, &out.buf];
        let grid = grid_1d(c * (len + 1));
        self.gpu
            .dispatch("signal", "reflect_pad_left", &p, &bufs, grid);
        out
    }

    /// The recurrences of a bidirectional LSTM (SpeechOps::bilstm_steps), a workgroup per
    /// direction; None where the hidden size is past the shader's (the caller falls back).
    pub(crate) fn bilstm_steps_gpu(
        &self,
        gx: &WgpuTensor,
        w_hh: &WgpuTensor,
        len: usize,
        hidden: usize,
        out: &mut WgpuTensor,
    ) -> Option<()> {
        if hidden > LSTM_MAX_H {
            return None;
        }
        assert!(
            gx.rows * gx.cols >= len * 8 * hidden
                && w_hh.rows * w_hh.cols >= 8 * hidden * hidden
                && out.rows * out.cols >= len * 2 * hidden,
            "bilstm_steps: tensors smaller than {len} steps of {hidden} units"
        );
        if len == 0 || hidden == 0 {
            return Some(());
        }
        let state = ensure(
            &self.gpu,
            &mut self.scratch.borrow_mut().lstm,
            4 * 4 * hidden,
        );
        let bufs = [&gx.buf, &w_hh.buf, &state, &out.buf];
        // Steps a dispatch: 32768 passes of the inner loop at most (LSTM_STEP_LOOPS).
        let per = (LSTM_STEP_LOOPS / (hidden * hidden.div_ceil(256))).max(1);
        for s0 in (0..len).step_by(per) {
            let s1 = (s0 + per).min(len);
            let p = [len, hidden, s0, s1, (s0 == 0) as usize].map(|v| v as u32);
            self.gpu
                .dispatch("signal", "bilstm_steps", &p, &bufs, (2, 1, 1));
        }
        Some(())
    }
}
