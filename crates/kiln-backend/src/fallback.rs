//! The CPU backend as a fallback for a device backend's ops that have no kernel there.

/// Implements, inside a device backend's `impl SpeechOps`, the recurrent and spectral ops
/// (LSTMs, STFT, iSTFT) through the CPU backend: inputs copied to the host, the CPU op run,
/// outputs copied back. The backend provides `self.cpu` (a
/// [`CpuBackend`](crate::cpu::CpuBackend)), `self.to_cpu(&tensor) -> CpuTensor` and
/// `self.from_cpu(&CpuTensor, &mut tensor)`.
#[macro_export]
macro_rules! cpu_fallback_sequence_ops {
    () => {
        $crate::cpu_fallback_lstm_ops!();
        $crate::cpu_fallback_spectral_ops!();
    };
}

/// [`cpu_fallback_sequence_ops`]' LSTMs alone: sequential work that a device backend with
/// kernels for the rest still runs on the CPU.
#[macro_export]
macro_rules! cpu_fallback_lstm_ops {
    () => {
        $crate::cpu_fallback_lstm!();
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
    };
}

/// The one-direction LSTM from its input (`SpeechOps::lstm`) alone.
#[macro_export]
macro_rules! cpu_fallback_lstm {
    () => {
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
    };
}

/// [`cpu_fallback_sequence_ops`]' STFT and its inverse alone.
#[macro_export]
macro_rules! cpu_fallback_spectral_ops {
    () => {
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
    };
}
