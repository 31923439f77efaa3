//! Speech and signal ops on wgpu: Whisper's (layer norm, GELU, dense attention, conv1d as
//! im2col + the product) and Kokoro's norms, activations, convolutions, uint8 rounding and
//! STFTs and bidirectional LSTM recurrences (signal.rs) on the GPU; a one-direction LSTM from
//! its input (no model runs it) through the CPU backend (host copies).

use kiln_backend::{Conv1dShape, SpeechOps, Unary};

use crate::{ensure, f, grid_1d, WgpuBackend, WgpuTensor, WgpuWeight, ATT_TILE_TOKENS, MODE_STORE};

impl SpeechOps for WgpuBackend {
    // ---- speech ops ----

    fn bilstm_steps(
        &self,
        gx: &WgpuTensor,
        w_hh: &WgpuTensor,
        len: usize,
        hidden: usize,
        out: &mut WgpuTensor,
    ) {
        if self.bilstm_steps_gpu(gx, w_hh, len, hidden, out).is_none() {
            let (cg, ch) = (self.to_cpu(gx), self.to_cpu(w_hh));
            let mut co = self.to_cpu(out);
            self.cpu.bilstm_steps(&cg, &ch, len, hidden, &mut co);
            self.from_cpu(&co, out);
        }
    }

    // One LSTM direction from its input (the models run `bilstm_steps` on products'
    // gates): on the CPU backend, through host copies.
    kiln_backend::cpu_fallback_lstm!();

    fn conv1d_nc(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        s: Conv1dShape,
        out: &mut WgpuTensor,
    ) {
        self.conv1d_nc_gpu(x, w, bias, s, out)
    }

    fn conv_transpose1d(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        s: Conv1dShape,
        out: &mut WgpuTensor,
    ) {
        self.conv_transpose1d_gpu(x, w, bias, s, out)
    }

    fn fake_quant_u8(&self, x: &mut WgpuTensor, n: usize) {
        self.fake_quant_gpu(x, n)
    }

    fn unary(&self, x: &mut WgpuTensor, op: Unary, _shape: (usize, usize), start: usize, n: usize) {
        self.unary_gpu(x, op, start, n)
    }

    fn reflect_pad_left(&self, x: &WgpuTensor, c: usize, len: usize) -> WgpuTensor {
        self.reflect_pad_left_gpu(x, c, len)
    }

    fn stft(
        &self,
        signal: &WgpuTensor,
        len: usize,
        n_fft: usize,
        hop: usize,
        out: &mut WgpuTensor,
    ) {
        self.stft_gpu(signal, len, n_fft, hop, out)
    }

    fn istft(
        &self,
        spec: &WgpuTensor,
        frames: usize,
        n_fft: usize,
        hop: usize,
        out: &mut WgpuTensor,
    ) {
        self.istft_gpu(spec, frames, n_fft, hop, out)
    }

    fn layer_norm(
        &self,
        x: &WgpuTensor,
        gamma: &WgpuTensor,
        beta: &WgpuTensor,
        eps: f32,
        n: usize,
        out: &mut WgpuTensor,
    ) {
        if n == 0 {
            return;
        }
        let x_dim = (n.min(65535) as u32, n.div_ceil(65535) as u32, 1);
        self.gpu.dispatch(
            "speech",
            "layer_norm",
            &[x.cols as u32, f(eps), n as u32],
            &[&x.buf, &gamma.buf, &beta.buf, &out.buf],
            x_dim,
        );
    }

    fn layer_norm_rows(
        &self,
        x: &mut WgpuTensor,
        w: Option<&WgpuTensor>,
        b: Option<&WgpuTensor>,
        eps: f32,
        rows: usize,
        cols: usize,
    ) {
        let d = &self.gpu.dummy;
        let (wb, bb) = (w.map_or(d, |t| &t.buf), b.map_or(d, |t| &t.buf));
        let flags = [w.is_some() as u32, b.is_some() as u32];
        self.norm_rows(x, wb, bb, (rows, cols), eps, 0, flags);
    }

    fn ada_in(&self, x: &mut WgpuTensor, gamma_beta: &WgpuTensor, c: usize, len: usize, eps: f32) {
        let d = &self.gpu.dummy;
        self.norm_rows(x, &gamma_beta.buf, d, (c, len), eps, 1, [0, 0]);
    }

    fn ada_layer_norm(
        &self,
        x: &mut WgpuTensor,
        gamma_beta: &WgpuTensor,
        len: usize,
        c: usize,
        eps: f32,
    ) {
        let d = &self.gpu.dummy;
        self.norm_rows(x, &gamma_beta.buf, d, (len, c), eps, 2, [0, 0]);
    }

    fn snake(&self, x: &mut WgpuTensor, alpha: &WgpuTensor, c: usize, len: usize) {
        let d = &self.gpu.dummy;
        let n = c * len;
        let (bufs, p) = ([&x.buf, &alpha.buf, d, d], [n as u32, len as u32]);
        self.gpu.dispatch("speech", "snake", &p, &bufs, grid_1d(n));
    }

    fn leaky_relu(&self, x: &mut WgpuTensor, slope: f32, n: usize) {
        let d = &self.gpu.dummy;
        let (bufs, p) = ([&x.buf, d, d, d], [n as u32, f(slope)]);
        self.gpu
            .dispatch("speech", "leaky_relu", &p, &bufs, grid_1d(n));
    }

    fn gelu_tanh(&self, x: &mut WgpuTensor, n: usize) {
        let d = &self.gpu.dummy;
        let bufs = [&x.buf, d, d, d];
        self.gpu
            .dispatch("speech", "gelu_tanh", &[n as u32], &bufs, grid_1d(n));
    }

    fn transpose(&self, x: &WgpuTensor, rows: usize, cols: usize, out: &mut WgpuTensor) {
        let d = &self.gpu.dummy;
        let (n, bufs) = (rows * cols, [&x.buf, d, d, &out.buf]);
        let p = [n as u32, rows as u32, cols as u32];
        self.gpu
            .dispatch("speech", "transpose", &p, &bufs, grid_1d(n));
    }

    fn upsample_nearest(
        &self,
        x: &WgpuTensor,
        c: usize,
        len: usize,
        factor: usize,
        out: &mut WgpuTensor,
    ) {
        let d = &self.gpu.dummy;
        let (n, bufs) = (c * len * factor, [&x.buf, d, d, &out.buf]);
        let p = [n as u32, len as u32, factor as u32];
        self.gpu
            .dispatch("speech", "upsample_nearest", &p, &bufs, grid_1d(n));
    }

    fn gelu(&self, x: &mut WgpuTensor, n: usize) {
        let len = n * x.cols;
        let d = &self.gpu.dummy;
        self.gpu.dispatch(
            "speech",
            "gelu",
            &[len as u32],
            &[&x.buf, d, d, d],
            grid_1d(len),
        );
    }

    fn attention_dense(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        s: kiln_backend::DenseAttnShape,
        out: &mut WgpuTensor,
    ) {
        if s.n_q == 0 {
            return;
        }
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        // attention.wgsl attn_tile over the dense rows for a tile of queries or more (or
        // keys past attn_dense's): the queries are the last n_q positions (pos0 = n_kv -
        // n_q), every one sees every key unless causal.
        let tile_worth = s.n_q >= ATT_TILE_TOKENS || s.n_kv > 3072;
        if tile_worth && s.n_kv >= s.n_q && self.gpu.tiled_attention(s.head_dim) {
            let ld = (s.heads * s.head_dim) as u32;
            let p = [
                s.heads as u32,
                s.heads as u32,
                s.head_dim as u32,
                0,
                (s.n_kv - s.n_q) as u32,
                0,
                0,
                f(scale),
                1,
                0,
                0,
                ld,
                0,
                ld,
                0,
                0,
                s.n_q as u32,
                ld,
                !s.causal as u32,
                s.head_dim as u32,
            ];
            let d = &self.gpu.dummy;
            self.gpu.dispatch(
                "attention",
                "attn_tile",
                &p,
                &[&q.buf, &k.buf, &v.buf, d, &out.buf],
                (s.heads as u32, s.n_q.div_ceil(ATT_TILE_TOKENS) as u32, 1),
            );
            return;
        }
        // speech.wgsl attn_dense: scores in workgroup memory (3072 keys), heads up to 256.
        if s.n_kv > 3072 || s.head_dim > 256 || (s.causal && s.n_kv < s.n_q) {
            let (cq, ck, cv) = (self.to_cpu(q), self.to_cpu(k), self.to_cpu(v));
            let mut co = self.to_cpu(out);
            self.cpu.attention_dense(&cq, &ck, &cv, s, &mut co);
            return self.from_cpu(&co, out);
        }
        self.gpu.dispatch(
            "speech",
            "attn_dense",
            &[
                s.heads as u32,
                s.head_dim as u32,
                s.n_q as u32,
                s.n_kv as u32,
                s.causal as u32,
                f(scale),
            ],
            &[&q.buf, &k.buf, &v.buf, &out.buf],
            (s.n_q as u32, s.heads as u32, 1),
        );
    }

    fn conv1d(
        &self,
        w: &WgpuWeight,
        bias: Option<&WgpuTensor>,
        x: &WgpuTensor,
        t_in: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        out: &mut WgpuTensor,
    ) -> usize {
        let c_in = x.cols;
        let t_out = (t_in + 2 * pad - kernel) / stride + 1;
        let n = t_out * c_in * kernel;
        let cols = ensure(&self.gpu, &mut self.scratch.borrow_mut().im2col, n * 4);
        self.gpu.dispatch(
            "misc",
            "im2col",
            &[
                n as u32,
                t_in as u32,
                c_in as u32,
                kernel as u32,
                stride as u32,
                pad as u32,
            ],
            &[&x.buf, &cols],
            grid_1d(n),
        );
        let xt = WgpuTensor {
            buf: cols,
            rows: t_out,
            cols: c_in * kernel,
        };
        self.products(&[(w, None, bias, out, MODE_STORE)], &xt, t_out, None);
        t_out
    }
}
