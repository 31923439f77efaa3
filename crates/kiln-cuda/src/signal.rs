//! Kokoro's feature-map ops on the GPU (kernels/signal.cu): convolutions over (channels, len)
//! maps (im2col and an f32 cuBLAS product, or directly when grouped), transposed ones (the
//! product, then a gather of its taps), the norms a block per row, the activations, and the
//! uint8 rounding of the int8 export. The LSTM recurrences and the STFT stay on the CPU.

use super::*;

fn ptr_or_null(t: Option<&CudaTensor>) -> u64 {
    t.map_or(0, |t| t.buf.ptr)
}

/// kernels/signal.cu norm_rows's modes.
pub(crate) const NORM_ADA_IN: i32 = 0;
pub(crate) const NORM_ADA_LAYER: i32 = 1;
pub(crate) const NORM_LAYER: i32 = 2;

impl CudaBackend {
    /// Column-major C (m x n, ldc) = op(A) op(B) + beta C, all f32, f32 arithmetic (no TF32).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sgemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (a, lda): (u64, usize),
        (b, ldb): (u64, usize),
        beta: f32,
        (c, ldc): (u64, usize),
    ) {
        use cudarc::cublas::sys as cb;
        let h = self.blas.get().expect("cuBLAS for the convolutions").0;
        let op = |t: bool| match t {
            true => cb::cublasOperation_t::CUBLAS_OP_T,
            false => cb::cublasOperation_t::CUBLAS_OP_N,
        };
        let alpha = 1f32;
        let f32t = cb::cudaDataType_t::CUDA_R_32F;
        unsafe {
            cudarc::cublas::result::gemm_ex(
                h,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                f32t,
                lda as i32,
                b as *const c_void,
                f32t,
                ldb as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                f32t,
                ldc as i32,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .unwrap_or_else(|e| panic!("cuBLAS convolution product failed: {e:?}"));
    }

    fn conv_args(x: u64, w: u64, bias: u64, s: &Conv1dShape, lo: usize, out: u64) -> Args {
        Args::default()
            .a(x)
            .a(w)
            .a(bias)
            .a(s.c_in as i32)
            .a(s.c_out as i32)
            .a(s.len_in as i32)
            .a(s.k as i32)
            .a(s.stride as i32)
            .a(s.pad as i32)
            .a(s.dilation as i32)
            .a(s.groups as i32)
            .a(lo as i32)
            .a(out)
    }

    /// What a convolution (or, with `transposed`, a transposed one) of shape s does before
    /// its product: checks the tensors' sizes, and runs it whole with a thread per output
    /// where it is grouped (or cuBLAS is missing). Returns the output length when the product
    /// is still to run.
    fn conv_direct(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        s: Conv1dShape,
        out: &mut CudaTensor,
        transposed: bool,
    ) -> Option<usize> {
        self.xq_src.set(None);
        let (lo, w_len, name) = match transposed {
            false => (
                s.len_out(),
                s.c_out * (s.c_in / s.groups.max(1)),
                "conv1d_direct",
            ),
            true => (
                s.len_out_transposed(),
                s.c_in * (s.c_out / s.groups.max(1)),
                "conv_t_direct",
            ),
        };
        assert!(
            x.rows * x.cols >= s.c_in * s.len_in
                && w.rows * w.cols >= w_len * s.k
                && out.rows * out.cols >= s.c_out * lo,
            "convolution (transposed: {transposed}): tensors smaller than the shape {s:?}"
        );
        if lo == 0 {
            return None;
        }
        if s.groups != 1 || !self.blas.is_some() {
            let mut a =
                Self::conv_args(x.buf.ptr, w.buf.ptr, ptr_or_null(bias), &s, lo, out.buf.ptr);
            self.elementwise_n_args(name, &mut a, s.c_out * lo);
            return None;
        }
        Some(lo)
    }

    /// out (c_out, len_out) = conv1d(x (c_in, len_in), w (c_out, c_in / groups, k)) + bias.
    pub(crate) fn conv1d_nc_gpu(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        s: Conv1dShape,
        out: &mut CudaTensor,
    ) {
        let Some(lo) = self.conv_direct(x, w, bias, s, out, false) else {
            return;
        };
        let kk = s.c_in * s.k;
        // The taps of every output step as columns (the input itself for a plain 1-tap
        // convolution), then out^T (lo x c_out) = col^T W^T on top of the bias.
        let plain = s.k == 1 && s.stride == 1 && s.pad == 0 && lo == s.len_in;
        let col = if plain {
            x.buf.ptr
        } else {
            let col = ensure(&mut self.scratch.borrow_mut().im2col, kk * lo * 4);
            let mut a = Args::default()
                .a(x.buf.ptr)
                .a(s.c_in as i32)
                .a(s.len_in as i32)
                .a(s.k as i32)
                .a(s.stride as i32)
                .a(s.pad as i32)
                .a(s.dilation as i32)
                .a(lo as i32)
                .a(col);
            self.elementwise_n_args("im2col_nc", &mut a, kk * lo);
            col
        };
        let mut a = Args::default()
            .a(out.buf.ptr)
            .a(ptr_or_null(bias))
            .a(s.c_out as i32)
            .a(lo as i32);
        self.elementwise_n_args("fill_rows", &mut a, s.c_out * lo);
        self.sgemm(
            (false, false),
            (lo, s.c_out, kk),
            (col, lo),
            (w.buf.ptr, kk),
            1.0,
            (out.buf.ptr, lo),
        );
    }

    /// out (c_out, len_out_transposed) = conv_transpose1d(x (c_in, len_in), w (c_in, c_out /
    /// groups, k)) + bias.
    pub(crate) fn conv_transpose1d_gpu(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        s: Conv1dShape,
        out: &mut CudaTensor,
    ) {
        let Some(lo) = self.conv_direct(x, w, bias, s, out, true) else {
            return;
        };
        // cols^T (len_in x c_out * k) = x^T W, then each output gathers its taps.
        let ck = s.c_out * s.k;
        let cols = ensure(&mut self.scratch.borrow_mut().tmp, ck * s.len_in * 4);
        self.sgemm(
            (false, true),
            (s.len_in, ck, s.c_in),
            (x.buf.ptr, s.len_in),
            (w.buf.ptr, ck),
            0.0,
            (cols, s.len_in),
        );
        let mut a = Args::default()
            .a(cols)
            .a(ptr_or_null(bias))
            .a(s.c_out as i32)
            .a(s.k as i32)
            .a(s.len_in as i32)
            .a(s.stride as i32)
            .a(s.pad as i32)
            .a(s.dilation as i32)
            .a(lo as i32)
            .a(out.buf.ptr);
        self.elementwise_n_args("col2im_t", &mut a, s.c_out * lo);
    }

    /// kernels/signal.cu norm_rows over `rows` rows of x (rows, cols), in place.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_rows(
        &self,
        x: &mut CudaTensor,
        a: u64,
        b: u64,
        rows: usize,
        cols: usize,
        eps: f32,
        mode: i32,
    ) {
        self.xq_src.set(None);
        assert!(
            x.rows * x.cols >= rows * cols,
            "norm: tensor smaller than {rows} x {cols}"
        );
        if rows == 0 || cols == 0 {
            return;
        }
        let mut args = Args::default()
            .a(x.buf.ptr)
            .a(a)
            .a(b)
            .a(rows as i32)
            .a(cols as i32)
            .a(eps)
            .a(mode);
        self.launch_rows("norm_rows", rows, &mut args);
    }

    /// The first n values of x rounded to their uint8 grid (ONNX DynamicQuantizeLinear): the
    /// range by atomics over blocks, then the rounding.
    pub(crate) fn fake_quant_gpu(&self, x: &mut CudaTensor, n: usize) {
        self.xq_src.set(None);
        if n == 0 {
            return;
        }
        let range = ensure(&mut self.scratch.borrow_mut().range, 8);
        // Both ends start at 0's key (the range always holds 0).
        self.dev.memset_u32(range, 0x8000_0000, 2);
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        let mut a = Args::default().a(x.buf.ptr).a(n).a(range);
        self.dev.launch(
            self.dev.func("range_keys"),
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            &mut a.ptrs(),
        );
        let mut a = Args::default().a(x.buf.ptr).a(n).a(range);
        self.elementwise_n_args("fake_quant_u8", &mut a, n);
    }

    pub(crate) fn transpose_gpu(
        &self,
        x: &CudaTensor,
        rows: usize,
        cols: usize,
        out: &mut CudaTensor,
    ) {
        self.xq_src.set(None);
        assert!(
            x.rows * x.cols >= rows * cols && out.rows * out.cols >= rows * cols,
            "transpose: tensors smaller than {rows} x {cols}"
        );
        if rows == 0 || cols == 0 {
            return;
        }
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(rows as i32)
            .a(cols as i32)
            .a(out.buf.ptr);
        self.dev.launch(
            self.dev.func("transpose_rows"),
            (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1),
            (32, 8, 1),
            0,
            &mut a.ptrs(),
        );
    }
}
