//! The CPU backend as a fallback for a device backend's ops that have no kernel there.

/// Implements, inside a device backend's `impl Backend`, the speech ops it runs through the
/// CPU backend: inputs copied to the host, the CPU op run, outputs copied back. The backend
/// provides `self.cpu` (a [`CpuBackend`](crate::cpu::CpuBackend)), `self.to_cpu(&tensor) ->
/// CpuTensor` and `self.from_cpu(&CpuTensor, &mut tensor)`.
#[macro_export]
macro_rules! cpu_fallback_ops {
    () => {
        $crate::cpu_fallback_sequence_ops!();
        $crate::cpu_fallback_signal_ops!();
    };
}

/// [`cpu_fallback_ops`]' recurrent and spectral ops (LSTMs, STFT, iSTFT): sequential or small
/// work that a device backend with kernels for the rest still runs on the CPU.
#[macro_export]
macro_rules! cpu_fallback_sequence_ops {
    () => {
        fn bilstm_steps(
            &self,
            gx: &Self::Tensor,
            w_hh: &Self::Tensor,
            len: usize,
            hidden: usize,
            out: &mut Self::Tensor,
        ) {
            let (cg, ch) = (self.to_cpu(gx), self.to_cpu(w_hh));
            let mut co = self.to_cpu(out);
            self.cpu.bilstm_steps(&cg, &ch, len, hidden, &mut co);
            self.from_cpu(&co, out);
        }
        fn istft(
            &self,
            spec: &Self::Tensor,
            frames: usize,
            n_fft: usize,
            hop: usize,
            out: &mut Self::Tensor,
        ) {
            let cs = self.to_cpu(spec);
            let mut co = self.to_cpu(out);
            self.cpu.istft(&cs, frames, n_fft, hop, &mut co);
            self.from_cpu(&co, out);
        }
        fn lstm(
            &self,
            x: &Self::Tensor,
            w_ih: &Self::Tensor,
            w_hh: &Self::Tensor,
            bias: &Self::Tensor,
            s: $crate::LstmShape,
            out: &mut Self::Tensor,
        ) {
            let (cx, ci, ch, cb) = (
                self.to_cpu(x),
                self.to_cpu(w_ih),
                self.to_cpu(w_hh),
                self.to_cpu(bias),
            );
            let mut co = self.to_cpu(out);
            self.cpu.lstm(&cx, &ci, &ch, &cb, s, &mut co);
            self.from_cpu(&co, out);
        }
        fn stft(
            &self,
            signal: &Self::Tensor,
            len: usize,
            n_fft: usize,
            hop: usize,
            out: &mut Self::Tensor,
        ) {
            let cs = self.to_cpu(signal);
            let mut co = self.to_cpu(out);
            self.cpu.stft(&cs, len, n_fft, hop, &mut co);
            self.from_cpu(&co, out);
        }
    };
}

/// [`cpu_fallback_ops`]' feature-map ops (convolutions, the uint8 rounding, the BERT's
/// attention); the norms, the elementwise and the copying ones (AdaIN, AdaLN, layer norm by
/// rows, snake, leaky ReLU, GELU's tanh form, transpose, upsampling) a device backend has
/// kernels for.
#[macro_export]
macro_rules! cpu_fallback_signal_ops {
    () => {
        fn conv1d_nc(
            &self,
            x: &Self::Tensor,
            w: &Self::Tensor,
            bias: Option<&Self::Tensor>,
            s: $crate::Conv1dShape,
            out: &mut Self::Tensor,
        ) {
            let (cx, cw) = (self.to_cpu(x), self.to_cpu(w));
            let cb = bias.map(|b| self.to_cpu(b));
            let mut co = self.to_cpu(out);
            self.cpu.conv1d_nc(&cx, &cw, cb.as_ref(), s, &mut co);
            self.from_cpu(&co, out);
        }
        fn conv_transpose1d(
            &self,
            x: &Self::Tensor,
            w: &Self::Tensor,
            bias: Option<&Self::Tensor>,
            s: $crate::Conv1dShape,
            out: &mut Self::Tensor,
        ) {
            let (cx, cw) = (self.to_cpu(x), self.to_cpu(w));
            let cb = bias.map(|b| self.to_cpu(b));
            let mut co = self.to_cpu(out);
            self.cpu.conv_transpose1d(&cx, &cw, cb.as_ref(), s, &mut co);
            self.from_cpu(&co, out);
        }
        fn fake_quant_u8(&self, x: &mut Self::Tensor, n: usize) {
            let mut cx = self.to_cpu(x);
            self.cpu.fake_quant_u8(&mut cx, n);
            self.from_cpu(&cx, x);
        }
    };
}

/// [`cpu_fallback_ops`]'s companions for Whisper's own ops (layer norm, GELU, attention
/// without a cache), for a device backend without kernels for them.
#[macro_export]
macro_rules! cpu_fallback_whisper_ops {
    () => {
        fn attention_dense(
            &self,
            q: &Self::Tensor,
            k: &Self::Tensor,
            v: &Self::Tensor,
            shape: $crate::DenseAttnShape,
            out: &mut Self::Tensor,
        ) {
            let (cq, ck, cv) = (self.to_cpu(q), self.to_cpu(k), self.to_cpu(v));
            let mut co = self.to_cpu(out);
            self.cpu.attention_dense(&cq, &ck, &cv, shape, &mut co);
            self.from_cpu(&co, out);
        }
        fn gelu(&self, x: &mut Self::Tensor, n: usize) {
            let mut c = self.to_cpu(x);
            self.cpu.gelu(&mut c, n);
            self.from_cpu(&c, x);
        }
        fn layer_norm(
            &self,
            x: &Self::Tensor,
            gamma: &Self::Tensor,
            beta: &Self::Tensor,
            eps: f32,
            n: usize,
            out: &mut Self::Tensor,
        ) {
            let (cx, cg, cb) = (self.to_cpu(x), self.to_cpu(gamma), self.to_cpu(beta));
            let mut co = self.to_cpu(out);
            self.cpu.layer_norm(&cx, &cg, &cb, eps, n, &mut co);
            self.from_cpu(&co, out);
        }
    };
}
