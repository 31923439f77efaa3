//! The CPU backend: the numerical reference, and the default everywhere.
//!
//! Two modes share every op: `reference()` dequantizes all weights to f32 at load and does
//! plain f32 arithmetic (what the golden tests pin), `new(threads)` keeps weights in their
//! stored format and dequantizes rows on the fly, split over threads.

pub mod huge;
pub mod kernels;
mod kv;
pub mod membw;
mod ops;

pub use kv::CpuKvCache;

/// From this many rows of x, products over weights marked [`TensorOps::prefer_batches`] run on
/// AMX bf16 tiles where the CPU has them.
pub const AMX_MIN_ROWS: usize = ops::matmul_amx::MIN_ROWS;
mod par;

use std::sync::Mutex;

use kiln_quant::{dequantize_row, GgmlType};

use kernels::pack::{dequant_packed_row, pack_row};
use kernels::{x8, Kernels, QuantAct};
use ops::matmul::{Epilogue, Job};

use crate::{
    AttnShape, BackendError, Conv1dShape, ConvWeightQ8, DenseAttnShape, KvType, KvWindow, LlmOps,
    LstmShape, MlxWeightData, RopeConfig, SpeechOps, TensorOps, WeightData,
};
pub use ops::vmath;

/// C[i][..n] = Σ_p A[i][p] · B[p][..n] for i < m (B by rows of its k dimension; rows of A,
/// B and C start `lda`, `ldb`, `ldc` apart; C overwritten), on this thread with the CPU's
/// SIMD kernel: for the small models run beside whatever backend holds the large one (the
/// VAD before Whisper).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    ops::gemm::gemm_nn(a, lda, m, b, ldb, n, k, c, ldc, ops::gemm::simd_ok());
}
pub use par::Pool;

pub struct CpuBackend {
    reference: bool,
    pool: Pool,
    kernels: &'static Kernels,
    /// Activations quantized for the integer kernels (reused across ops).
    act: Mutex<QuantAct>,
    /// The last RoPE configs' per-pair frequencies and angles.
    rope_freqs: Mutex<Vec<(RopeConfig, ops::rope::Angles)>>,
    /// conv1d's receptive fields (im2col), kept between calls.
    conv_cols: Mutex<CpuTensor>,
}

/// f32 activations with room for `data.len() / cols` rows.
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub cols: usize,
}

impl CpuTensor {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight matrix: `bytes` holds `rows` rows of `ty.row_bytes(cols)` bytes, each in kiln's
/// packed layout for the format (`kernels::pack`), or, when `x8`, groups of 8 interleaved
/// rows (`kernels::x8`), or, when `mlx` is set, rows of MLX packed q (`ty` is then
/// meaningless; `ops::mlx` runs such weights).
pub struct CpuWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub x8: bool,
    pub bytes: huge::Bytes,
    pub mlx: Option<Box<ops::mlx::MlxParts>>,
    /// A second copy in AMX tile order (bf16) for products over many rows, made when the
    /// model marks the weight as such ([`TensorOps::prefer_batches`]) and the CPU has AMX.
    pub amx: Option<Box<kernels::amx::PackedB>>,
    /// The same, where the model allows int8 and the CPU has no AMX: int8 rows with one
    /// scale a row for the integer block products (`kernels::vnni_gemm`).
    pub i8: Option<Box<kernels::vnni_gemm::PackedI8>>,
    /// The same on an AVX-512 CPU with neither AMX nor AVX-512 BF16, or on aarch64 (NEON)
    /// where the int8 copy is not made: f32 in vector order for the f32 block products
    /// (`kernels::f32_gemm`).
    pub f32p: Option<Box<kernels::f32_gemm::PackedF32>>,
    /// An integer convolution's weight in tile order ([`SpeechOps::conv_weight_q8`]).
    pub conv: Option<Box<ops::conv1d_q8::PackedConvQ8>>,
    /// A transposed convolution's weight as stacked phases ([`SpeechOps::conv_transpose_weight`]).
    pub conv_t: Option<Box<ConvT>>,
}

/// A transposed convolution's weight packed at load: for the bf16 block products where they
/// run, else for the f32 tiles (each phase's taps, which the unpacked form packs at every
/// call).
pub enum ConvT {
    Bf16(ops::conv1d_amx::PackedConvT),
    F32(ops::conv1d_nc::PackedPhases),
}

impl ConvT {
    fn bytes(&self) -> usize {
        match self {
            ConvT::Bf16(p) => p.bytes(),
            ConvT::F32(p) => p.bytes(),
        }
    }
}

impl CpuWeight {
    fn row_bytes_of(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Group `g` of an interleaved weight.
    pub fn group(&self, g: usize) -> &[u8] {
        let gb = x8::group_bytes(self.ty, self.cols);
        &self.bytes[g * gb..(g + 1) * gb]
    }

    /// Dequantizes row `r` into `out` (cols values).
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        if self.x8 {
            let group = self.group(r / x8::ROWS);
            x8::dequant_row(self.ty, group, self.cols, r % x8::ROWS, out)
                .expect("row length checked at load");
            return;
        }
        if let Some(m) = &self.mlx {
            return m.dequant_row(self.row_bytes_of(r), r, out);
        }
        if self.ty == GgmlType::F32 {
            for (o, c) in out.iter_mut().zip(self.row_bytes_of(r).chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            return;
        }
        // Lengths were checked at load; a failure here is a bug, not bad input.
        dequant_packed_row(self.ty, self.row_bytes_of(r), out).expect("row length checked at load");
    }
}

impl CpuBackend {
    /// Weights kept in their stored format, `threads` workers, the best kernels this CPU runs.
    pub fn new(threads: usize) -> Self {
        Self::with_kernels(threads, kernels::best())
    }

    /// Quantized weights with a chosen kernel set (tests compare every set).
    pub fn with_kernels(threads: usize, kernels: &'static Kernels) -> Self {
        CpuBackend {
            reference: false,
            pool: Pool::new(threads),
            kernels,
            act: Mutex::default(),
            rope_freqs: Mutex::default(),
            conv_cols: Mutex::new(CpuTensor {
                data: Vec::new(),
                cols: 0,
            }),
        }
    }

    /// Weights dequantized at load, f32 arithmetic, one thread: the numerical reference.
    pub fn reference() -> Self {
        CpuBackend {
            reference: true,
            pool: Pool::new(1),
            kernels: &kernels::SCALAR,
            act: Mutex::default(),
            rope_freqs: Mutex::default(),
            conv_cols: Mutex::new(CpuTensor {
                data: Vec::new(),
                cols: 0,
            }),
        }
    }

    /// The integer kernel set in use.
    pub fn kernels(&self) -> &'static str {
        self.kernels.name
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// Physical cores are not visible portably; logical CPUs is the default thread count.
/// Keeps freed memory in the process for the next allocation (glibc only; elsewhere nothing).
///
/// By default glibc maps every block above its mmap threshold afresh and unmaps it when freed,
/// and gives the heap's free top back to the OS: each op that allocates a large output then
/// pays page faults and the kernel's zero-fill again (a Whisper transcription between Kokoro
/// syntheses took 2.2x as long). With a 32 MiB threshold (glibc's ceiling) and no trimming,
/// blocks are reused; the resident size stays at its peak instead of shrinking after a burst.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only changes allocator parameters; called before heavy allocation.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

/// Lowers the calling thread's scheduling priority to `nice` (Linux: a per-thread value that
/// threads it spawns inherit, so a pool created afterwards runs at it too). Returns whether
/// the change took; elsewhere it does nothing and returns false.
pub fn lower_thread_priority(nice: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn setpriority(which: i32, who: u32, prio: i32) -> i32;
        }
        const PRIO_PROCESS: i32 = 0;
        // SAFETY: a plain system call on the calling thread (who = 0).
        unsafe { setpriority(PRIO_PROCESS, 0, nice) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        false
    }
}

/// The integer convolution kernel of this CPU (Kokoro's int8 layers): "amx",
/// "avx512-vnni-conv", "avx-vnni-conv", "avx2-conv", "neon-i8mm-conv" or
/// "neon-dotprod-conv", or None where none runs.
pub fn integer_conv_kernel() -> Option<&'static str> {
    ops::conv1d_q8::kernel_name()
}

/// Every integer convolution kernel set this CPU has (the one it runs first): the tests
/// check each against the same integer sums.
pub fn integer_conv_kernels() -> Vec<&'static str> {
    ops::conv1d_q8::kernel_names()
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl CpuBackend {
    fn jobs(&self, x: &CpuTensor, n: usize, jobs: &mut [Job]) {
        let mut act = self.act.lock().unwrap_or_else(|p| p.into_inner());
        ops::matmul::matmul_jobs(&self.pool, self.kernels, &mut act, x, n, jobs)
    }
}

impl TensorOps for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;

    fn name(&self) -> String {
        if self.reference {
            "cpu-reference".into()
        } else {
            format!(
                "cpu ({}, {} threads)",
                self.kernels.name,
                self.pool.threads()
            )
        }
    }

    fn load_weight(&self, w: WeightData) -> Result<CpuWeight, BackendError> {
        let quant = |source| BackendError::Quant {
            name: w.name.to_string(),
            source,
        };
        let row_bytes = w.ty.row_bytes(w.cols).map_err(quant)?;
        let expected = row_bytes.checked_mul(w.rows);
        if expected != Some(w.bytes.len()) {
            return Err(BackendError::Weight {
                name: w.name.to_string(),
                what: format!(
                    "{} rows x {} cols of {} need {:?} bytes, got {}",
                    w.rows,
                    w.cols,
                    w.ty.name(),
                    expected,
                    w.bytes.len()
                ),
            });
        }
        if w.ty != GgmlType::F32 && w.rows > 0 {
            // Unsupported formats fail here, at load.
            let mut tmp = vec![0f32; w.cols];
            dequantize_row(w.ty, &w.bytes[..row_bytes], &mut tmp).map_err(quant)?;
        }
        if !self.reference && self.kernels.x8_for(w.ty).is_some() && w.rows > 0 {
            // Groups of 8 interleaved rows for kernels whose lanes are rows.
            let gb = x8::group_bytes(w.ty, w.cols);
            let mut bytes = huge::Bytes::zeroed(x8::matrix_bytes(w.ty, w.rows, w.cols));
            for (g, dst) in bytes.chunks_exact_mut(gb).enumerate() {
                let r1 = (8 * g + 8).min(w.rows);
                let rows: Vec<&[u8]> = (8 * g..r1)
                    .map(|r| &w.bytes[r * row_bytes..(r + 1) * row_bytes])
                    .collect();
                x8::pack_group(w.ty, &rows, w.cols, dst);
            }
            return Ok(CpuWeight {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
                row_bytes,
                x8: true,
                bytes,
                mlx: None,
                amx: None,
                i8: None,
                f32p: None,
                conv: None,
                conv_t: None,
            });
        }
        let mut weight = CpuWeight {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            row_bytes,
            x8: false,
            bytes: huge::Bytes::zeroed(w.bytes.len()),
            mlx: None,
            amx: None,
            i8: None,
            f32p: None,
            conv: None,
            conv_t: None,
        };
        for (src, dst) in w
            .bytes
            .chunks_exact(row_bytes.max(1))
            .zip(weight.bytes.chunks_exact_mut(row_bytes.max(1)))
        {
            pack_row(w.ty, src, dst);
        }
        if self.reference && w.ty != GgmlType::F32 {
            let mut out = Vec::with_capacity(w.rows * w.cols * 4);
            let mut row = vec![0f32; w.cols];
            for r in 0..w.rows {
                weight.dequant_row(r, &mut row);
                out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
            }
            weight = CpuWeight {
                ty: GgmlType::F32,
                rows: w.rows,
                cols: w.cols,
                row_bytes: w.cols * 4,
                x8: false,
                bytes: out.into(),
                mlx: None,
                amx: None,
                i8: None,
                f32p: None,
                conv: None,
                conv_t: None,
            };
        }
        Ok(weight)
    }

    fn load_weight_mlx(&self, w: MlxWeightData) -> Result<CpuWeight, BackendError> {
        w.check()?;
        if self.reference {
            // The reference runs every format as f32 weights.
            let f = w.dequantize()?;
            let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
            return self.load_weight(WeightData {
                name: w.name,
                ty: GgmlType::F32,
                rows: w.rows,
                cols: w.cols,
                bytes: &bytes,
            });
        }
        Ok(ops::mlx::load(w))
    }

    fn prefer_batches(&self, w: &mut CpuWeight, int8: bool) {
        if self.reference || w.mlx.is_some() || w.rows == 0 {
            return;
        }
        let (rows, cols) = (w.rows, w.cols);
        if int8 && !kernels::amx::available() && kernels::vnni_gemm::available() {
            // Integer block products: 4x the multiply rate of f32 FMA (AMX's bf16 tiles
            // are faster still, where present).
            let packed =
                kernels::vnni_gemm::PackedI8::from_rows(rows, cols, |r, out| w.dequant_row(r, out));
            w.i8 = Some(Box::new(packed));
            return;
        }
        if kernels::f32_gemm::available() {
            let packed =
                kernels::f32_gemm::PackedF32::from_rows(rows, cols, |r, out| w.dequant_row(r, out));
            w.f32p = Some(Box::new(packed));
            return;
        }
        if !kernels::amx::bf16_products() {
            return;
        }
        let packed = kernels::amx::PackedB::from_rows(rows, cols, |r, out| w.dequant_row(r, out));
        w.amx = Some(Box::new(packed));
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes.len()
            + w.mlx.as_ref().map_or(0, |m| m.extra_bytes())
            + w.amx.as_ref().map_or(0, |p| p.bytes())
            + w.i8.as_ref().map_or(0, |p| p.bytes())
            + w.f32p.as_ref().map_or(0, |p| p.bytes())
            + w.conv.as_ref().map_or(0, |p| p.bytes())
            + w.conv_t.as_ref().map_or(0, |p| p.bytes())
    }

    fn tensor(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            data: vec![0.0; rows * cols],
            cols,
        }
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
        let mut t = self.tensor(rows, cols);
        t.data[..data.len()].copy_from_slice(data);
        t
    }

    fn read(&self, t: &CpuTensor, rows: usize, out: &mut [f32]) {
        out.copy_from_slice(&t.data[..rows * t.cols]);
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32, n: usize, out: &mut CpuTensor) {
        ops::norm::rms_norm(x, w, eps, n, out)
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        bias: Option<&CpuTensor>,
        n: usize,
        out: &mut CpuTensor,
    ) {
        // (An MLX weight's `ty` is F32 too, its bytes packed q: it goes to the jobs below.)
        let f32_weight = w.ty == GgmlType::F32 && w.mlx.is_none();
        if !self.reference && f32_weight && n >= ops::conv1d_nc::GEMM_MIN_ROWS {
            if w.amx.is_some() {
                // A tile-order copy made at load: no per-call packing of the f32 weight.
                let mut jobs = [Job {
                    w,
                    out,
                    epilogue: Epilogue::Store(bias),
                }];
                return ops::matmul_amx::matmul_jobs(&self.pool, x, n, &mut jobs);
            }
            return ops::conv1d_nc::matmul_f32(&self.pool, w, x, bias, n, out);
        }
        self.jobs(
            x,
            n,
            &mut [Job {
                w,
                out,
                epilogue: Epilogue::Store(bias),
            }],
        );
    }

    fn matmul_add(&self, w: &CpuWeight, x: &CpuTensor, n: usize, out: &mut CpuTensor) {
        self.jobs(
            x,
            n,
            &mut [Job {
                w,
                out,
                epilogue: Epilogue::Add,
            }],
        );
    }

    fn matmul3(
        &self,
        ws: [&CpuWeight; 3],
        biases: [Option<&CpuTensor>; 3],
        x: &CpuTensor,
        n: usize,
        outs: [&mut CpuTensor; 3],
    ) {
        let [o0, o1, o2] = outs;
        self.jobs(
            x,
            n,
            &mut [
                Job {
                    w: ws[0],
                    out: o0,
                    epilogue: Epilogue::Store(biases[0]),
                },
                Job {
                    w: ws[1],
                    out: o1,
                    epilogue: Epilogue::Store(biases[1]),
                },
                Job {
                    w: ws[2],
                    out: o2,
                    epilogue: Epilogue::Store(biases[2]),
                },
            ],
        );
    }

    fn silu_mul(&self, gate: &mut CpuTensor, up: &CpuTensor, n: usize) {
        ops::elementwise::silu_mul(gate, up, n)
    }

    fn gelu_tanh_mul(&self, gate: &mut CpuTensor, up: &CpuTensor, n: usize) {
        let len = n * gate.cols;
        self.gelu_tanh(gate, len);
        let up = &up.data[..len];
        ops::signal::par_chunks(&self.pool, &mut gate.data[..len], |c, at| {
            for (g, &u) in c.iter_mut().zip(&up[at..]) {
                *g *= u;
            }
        });
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor, n: usize) {
        let len = n * x.cols;
        if len < 1 << 16 {
            return ops::elementwise::add(x, y, n);
        }
        let y = &y.data[..len];
        ops::signal::par_chunks(&self.pool, &mut x.data[..len], |c, at| {
            for (a, &b) in c.iter_mut().zip(&y[at..]) {
                *a += b;
            }
        })
    }

    fn copy_row(&self, src: &CpuTensor, src_row: usize, dst: &mut CpuTensor) {
        let c = src.cols;
        dst.data[..c].copy_from_slice(&src.data[src_row * c..(src_row + 1) * c]);
    }

    fn copy_rows(
        &self,
        src: &CpuTensor,
        src_row0: usize,
        n: usize,
        dst: &mut CpuTensor,
        dst_row0: usize,
    ) {
        let c = src.cols;
        assert_eq!(c, dst.cols, "copy_rows between tensors of different widths");
        dst.data[dst_row0 * c..(dst_row0 + n) * c]
            .copy_from_slice(&src.data[src_row0 * c..(src_row0 + n) * c]);
    }

    fn scale(&self, x: &mut CpuTensor, s: f32, n: usize) {
        ops::signal::scale(&self.pool, x, s, n)
    }
}

impl LlmOps for CpuBackend {
    type KvCache = CpuKvCache;

    fn check_window(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn check_short_conv(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn short_conv(
        &self,
        bcx: &CpuTensor,
        taps: &CpuTensor,
        state: &mut CpuTensor,
        srow: usize,
        (dim, k): (usize, usize),
        (row0, n): (usize, usize),
        fresh: bool,
        out: &mut CpuTensor,
    ) {
        assert!(bcx.cols == 3 * dim && out.cols == dim && state.cols == dim && k >= 1);
        let s = k - 1;
        let st = &mut state.data[srow * dim..(srow + s) * dim];
        if fresh {
            st.fill(0.0);
        }
        let rows = &bcx.data[row0 * 3 * dim..(row0 + n) * 3 * dim];
        let (y, next) = crate::short_conv_host(rows, &taps.data[..dim * k], st, dim, k, n);
        out.data[row0 * dim..(row0 + n) * dim].copy_from_slice(&y);
        st.copy_from_slice(&next);
    }

    fn top_candidates(
        &self,
        x: &CpuTensor,
        cols: usize,
        _k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> bool {
        // Every value, straight from the tensor: the sampler selects (no copy of the row
        // first).
        out.clear();
        out.extend(
            x.data[..cols]
                .iter()
                .enumerate()
                .map(|(i, &v)| (v, i as u32)),
        );
        true
    }

    fn argmax_rows(&self, x: &CpuTensor, n: usize, cols: usize) -> Vec<u32> {
        // Straight from the tensor: no copy of the logits.
        let pick = |r: usize| crate::argmax_first(&x.data[r * x.cols..r * x.cols + cols]);
        if n < 2 {
            return (0..n).map(pick).collect();
        }
        // A batch's rows (a vocabulary each) on every thread.
        use std::sync::atomic::{AtomicU32, Ordering};
        let picks: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        self.pool.run(n, |r0, r1| {
            for r in r0..r1 {
                picks[r].store(pick(r), Ordering::Relaxed);
            }
        });
        picks.into_iter().map(AtomicU32::into_inner).collect()
    }

    fn kv_cache(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> CpuKvCache {
        let kv_dim = n_kv_heads * head_dim;
        CpuKvCache {
            n_ctx,
            kv_dim,
            head_dim,
            k: (0..n_layers).map(|_| vec![0.0; n_ctx * kv_dim]).collect(),
            v: (0..n_layers).map(|_| vec![0.0; n_ctx * kv_dim]).collect(),
            packed: None,
            window: None,
        }
    }

    fn kv_type_default(&self, head_dim: usize) -> KvType {
        // f16 where the tiled attention reads it directly (elsewhere each step would widen
        // the layer's positions to f32 first); the reference keeps f32.
        match !self.reference && ops::attention::f16_direct(head_dim) {
            true => KvType::F16,
            false => KvType::F32,
        }
    }

    fn kv_cache_typed(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: KvType,
    ) -> Result<CpuKvCache, BackendError> {
        if ty == KvType::F32 {
            return Ok(self.kv_cache(n_layers, n_ctx, n_kv_heads, head_dim));
        }
        ty.check(head_dim)?;
        Ok(CpuKvCache {
            n_ctx,
            kv_dim: n_kv_heads * head_dim,
            head_dim,
            k: Vec::new(),
            v: Vec::new(),
            packed: Some(ops::kv_packed::PackedKv::new(
                ty, n_layers, n_ctx, n_kv_heads, head_dim,
            )),
            window: None,
        })
    }

    fn kv_cache_window(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: Option<KvType>,
        win: KvWindow,
    ) -> Result<CpuKvCache, BackendError> {
        let ty = ty.unwrap_or(KvType::F32);
        let Some(w) = crate::window::WindowSlots::new(win, n_ctx, n_layers) else {
            return self.kv_cache_typed(n_layers, n_ctx, n_kv_heads, head_dim, ty);
        };
        let mut c = self.kv_cache_typed(n_layers, w.slots, n_kv_heads, head_dim, ty)?;
        c.window = Some(w);
        Ok(c)
    }

    fn kv_kept_from(&self, cache: &CpuKvCache) -> usize {
        cache.kept_from()
    }

    fn kv_cache_bytes(&self, c: &CpuKvCache) -> usize {
        match &c.packed {
            Some(p) => p.bytes(),
            None => {
                4 * (c.k.iter().map(Vec::len).sum::<usize>()
                    + c.v.iter().map(Vec::len).sum::<usize>())
            }
        }
    }

    fn embed(
        &self,
        table: &CpuWeight,
        ids: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        for (t, &id) in ids.iter().enumerate() {
            if id as usize >= table.rows {
                return Err(BackendError::TokenOutOfRange {
                    id,
                    vocab: table.rows,
                });
            }
            let cols = out.cols;
            table.dequant_row(id as usize, &mut out.data[t * cols..(t + 1) * cols]);
        }
        Ok(())
    }

    fn embed_positions(
        &self,
        table: &CpuWeight,
        pos0: usize,
        n: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        if pos0 + n > table.rows {
            return Err(BackendError::TokenOutOfRange {
                id: (pos0 + n - 1) as u32,
                vocab: table.rows,
            });
        }
        let cols = out.cols;
        for t in 0..n {
            table.dequant_row(pos0 + t, &mut out.data[t * cols..(t + 1) * cols]);
        }
        Ok(())
    }

    fn rms_norm_heads(&self, x: &mut CpuTensor, w: &CpuTensor, eps: f32, n: usize) {
        ops::norm::rms_norm_heads(x, w, eps, n)
    }

    fn gate_up_silu(
        &self,
        gate: &CpuWeight,
        up: &CpuWeight,
        x: &CpuTensor,
        n: usize,
        out: &mut CpuTensor,
    ) {
        if gate.ty != up.ty || gate.x8 != up.x8 {
            // Mixed formats (per-tensor quantization mixes): the fused epilogue runs one
            // kernel over both rows, so the two products go separately, then silu(g) * u.
            let mut u = CpuTensor {
                data: vec![0.0; n * up.rows],
                cols: up.rows,
            };
            self.jobs(
                x,
                n,
                &mut [
                    Job {
                        w: gate,
                        out,
                        epilogue: Epilogue::Store(None),
                    },
                    Job {
                        w: up,
                        out: &mut u,
                        epilogue: Epilogue::Store(None),
                    },
                ],
            );
            return ops::elementwise::silu_mul(out, &u, n);
        }
        self.jobs(
            x,
            n,
            &mut [Job {
                w: gate,
                out,
                epilogue: Epilogue::SiluMul(up),
            }],
        );
    }

    fn rope(&self, x: &mut CpuTensor, rope: &RopeConfig, heads: usize, pos0: usize, n: usize) {
        // Frequencies computed once per config (powf per pair is not free at decode rates);
        // a few kept, as Gemma's local and global layers alternate two.
        // Each position's sines and cosines are kept too: every layer of a step (q and k)
        // rotates by the same ones.
        let mut cache = self.rope_freqs.lock().unwrap_or_else(|p| p.into_inner());
        let i = match cache.iter().position(|(c, _)| c == rope) {
            Some(i) => i,
            None => {
                if cache.len() == 4 {
                    cache.remove(0);
                }
                cache.push((rope.clone(), ops::rope::Angles::new(rope.inv_freqs())));
                cache.len() - 1
            }
        };
        ops::rope::rope(x, rope, &mut cache[i].1, heads, pos0, n)
    }

    fn kv_store(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        pos0: usize,
        n: usize,
    ) {
        let (d, hd) = (cache.kv_dim, cache.head_dim);
        let pos0 = cache.place(layer, pos0, n);
        if let Some(p) = &mut cache.packed {
            return p.store(layer, k, v, pos0, n);
        }
        // Cache layout per layer: (kv_heads, n_ctx, hd).
        for t in 0..n {
            for h in 0..d / hd {
                let dst = (h * cache.n_ctx + pos0 + t) * hd;
                let src = t * k.cols + h * hd;
                cache.k[layer][dst..dst + hd].copy_from_slice(&k.data[src..src + hd]);
                cache.v[layer][dst..dst + hd].copy_from_slice(&v.data[src..src + hd]);
            }
        }
    }

    fn attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        shape: AttnShape,
        out: &mut CpuTensor,
    ) {
        assert_eq!(shape.head_dim, cache.head_dim);
        let shape = cache.local(layer, shape);
        if let Some(p) = &cache.packed {
            if let Some((k, v)) = p.f16_layer(layer) {
                // f16 read as it is by the tiled kernel, where it runs.
                let seg = ops::attention::SegOf {
                    k,
                    v,
                    n_ctx: cache.n_ctx,
                    s: shape,
                    row0: 0,
                };
                if ops::attention::attention_segs_f16(&self.pool, q, &[seg], out) {
                    return;
                }
            }
            // Widened to f32 for the positions in use, then the f32 kernel.
            let (k, v) = &mut *p.widened(&self.pool, layer, shape.pos0 + shape.n_tokens);
            return ops::attention::attention(&self.pool, q, k, v, cache.n_ctx, shape, out);
        }
        let (k, v) = (&cache.k[layer], &cache.v[layer]);
        ops::attention::attention(&self.pool, q, k, v, cache.n_ctx, shape, out)
    }

    fn attention_batch<'c, I>(&self, q: &CpuTensor, seqs: I, layer: usize, out: &mut CpuTensor)
    where
        I: Iterator<Item = (&'c CpuKvCache, AttnShape)>,
    {
        use ops::attention::{attention_segs, Seg, SegOf, MAX_SEGS};
        const NONE: Seg<'static> = Seg {
            k: &[],
            v: &[],
            n_ctx: 0,
            s: AttnShape {
                n_heads: 0,
                n_kv_heads: 0,
                head_dim: 0,
                pos0: 0,
                n_tokens: 0,
                window: 0,
            },
            row0: 0,
        };
        // f32 caches gather into one call (one pool job), f16 caches read as they are into
        // another where the tiled kernel runs; any other packed cache runs alone on its
        // widened copy. Each query's arithmetic is the one it gets alone.
        let mut segs = [NONE; MAX_SEGS];
        let mut segs16: [SegOf<u16>; MAX_SEGS] = [SegOf {
            k: &[],
            v: &[],
            n_ctx: 0,
            s: NONE.s,
            row0: 0,
        }; MAX_SEGS];
        let (mut n, mut n16, mut row0) = (0, 0, 0);
        for (cache, shape) in seqs {
            assert_eq!(shape.head_dim, cache.head_dim);
            let shape = cache.local(layer, shape);
            let f16 = cache.packed.as_ref().and_then(|p| p.f16_layer(layer));
            match (&cache.packed, f16) {
                (Some(_), Some((k, v))) if ops::attention::f16_direct(shape.head_dim) => {
                    if n16 == MAX_SEGS {
                        ops::attention::attention_segs_f16(&self.pool, q, &segs16[..n16], out);
                        n16 = 0;
                    }
                    segs16[n16] = SegOf {
                        k,
                        v,
                        n_ctx: cache.n_ctx,
                        s: shape,
                        row0,
                    };
                    n16 += 1;
                }
                (Some(p), _) => {
                    let (k, v) = &mut *p.widened(&self.pool, layer, shape.pos0 + shape.n_tokens);
                    let seg = Seg {
                        k,
                        v,
                        n_ctx: cache.n_ctx,
                        s: shape,
                        row0,
                    };
                    attention_segs(&self.pool, q, &[seg], out);
                }
                (None, _) => {
                    if n == MAX_SEGS {
                        attention_segs(&self.pool, q, &segs[..n], out);
                        n = 0;
                    }
                    segs[n] = Seg {
                        k: &cache.k[layer],
                        v: &cache.v[layer],
                        n_ctx: cache.n_ctx,
                        s: shape,
                        row0,
                    };
                    n += 1;
                }
            }
            row0 += shape.n_tokens;
        }
        attention_segs(&self.pool, q, &segs[..n], out);
        if n16 > 0 {
            ops::attention::attention_segs_f16(&self.pool, q, &segs16[..n16], out);
        }
    }

    fn kv_copy(&self, src: &CpuKvCache, dst: &mut CpuKvCache, n: usize) {
        assert!(
            src.n_ctx == dst.n_ctx
                && src.kv_dim == dst.kv_dim
                && src.k.len() == dst.k.len()
                && src.window.as_ref().map(|w| (w.win, w.positions))
                    == dst.window.as_ref().map(|w| (w.win, w.positions)),
            "kv_copy between caches of different shapes"
        );
        let (hd, n_ctx) = (src.head_dim, src.n_ctx);
        // Slots, which are positions but in a window cache (its bases go with them).
        let n = src.copy_slots(n);
        dst.window.clone_from(&src.window);
        match (&src.packed, &mut dst.packed) {
            (Some(s), Some(d)) => return d.copy_from(s, n),
            (None, None) => {}
            _ => panic!("kv_copy between caches of different types"),
        }
        for (layer, (sk, sv)) in src.k.iter().zip(&src.v).enumerate() {
            for h in 0..src.kv_dim / hd {
                let r = h * n_ctx * hd..(h * n_ctx + n) * hd;
                dst.k[layer][r.clone()].copy_from_slice(&sk[r.clone()]);
                dst.v[layer][r.clone()].copy_from_slice(&sv[r]);
            }
        }
    }
}

impl SpeechOps for CpuBackend {
    // ---- speech ops ----

    fn layer_norm(
        &self,
        x: &CpuTensor,
        gamma: &CpuTensor,
        beta: &CpuTensor,
        eps: f32,
        n: usize,
        out: &mut CpuTensor,
    ) {
        ops::layer_norm::layer_norm(&self.pool, x, gamma, beta, eps, n, out)
    }

    fn gelu(&self, x: &mut CpuTensor, n: usize) {
        ops::gelu::gelu(&self.pool, x, n)
    }

    fn conv1d(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuTensor>,
        x: &CpuTensor,
        t_in: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        out: &mut CpuTensor,
    ) -> usize {
        let t_out = ops::conv1d::out_len(t_in, kernel, stride, pad);
        let mut cols = self.conv_cols.lock().unwrap_or_else(|p| p.into_inner());
        let width = x.cols * kernel;
        cols.cols = width;
        if cols.data.len() < t_out * width {
            cols.data.resize(t_out * width, 0.0);
        }
        ops::conv1d::im2col(x, t_in, kernel, stride, pad, &mut cols);
        self.matmul(w, &cols, bias, t_out, out);
        t_out
    }

    fn attention_dense(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: DenseAttnShape,
        out: &mut CpuTensor,
    ) {
        ops::attention_dense::attention_dense(&self.pool, q, k, v, shape, out)
    }

    // ---- Signal and sequence ops (Kokoro) ----

    fn conv1d_nc(
        &self,
        x: &CpuTensor,
        w: &CpuTensor,
        bias: Option<&CpuTensor>,
        s: Conv1dShape,
        out: &mut CpuTensor,
    ) {
        // The reference multiplies in f32 (the fast path may round through bf16 on AMX).
        if self.reference {
            return ops::conv1d_nc::conv1d_direct(&self.pool, x, w, bias, s, out);
        }
        ops::conv1d_nc::conv1d(&self.pool, x, w, bias, s, out)
    }

    fn conv_weight_q8(&self, w: ConvWeightQ8, s: Conv1dShape) -> Option<CpuWeight> {
        if self.reference || !ops::conv1d_q8::applies(&s) {
            return None;
        }
        let packed = ops::conv1d_q8::pack(w.q, w.zero, w.scale, &s)?;
        Some(CpuWeight {
            ty: GgmlType::F32,
            rows: s.c_out,
            cols: 0,
            row_bytes: 0,
            x8: false,
            bytes: Vec::new().into(),
            mlx: None,
            amx: None,
            i8: None,
            f32p: None,
            conv: Some(Box::new(packed)),
            conv_t: None,
        })
    }

    fn conv1d_q8(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        bias: Option<&CpuTensor>,
        s: Conv1dShape,
        out: &mut CpuTensor,
    ) {
        let p = w
            .conv
            .as_deref()
            .expect("conv1d_q8: a weight made by conv_weight_q8");
        ops::conv1d_q8::conv1d(&self.pool, x, p, bias, s, None, false, out)
    }

    fn ada_in_snake_conv1d_q8(
        &self,
        x: &CpuTensor,
        gamma_beta: &CpuTensor,
        alpha: Option<&CpuTensor>,
        eps: f32,
        w: &CpuWeight,
        bias: Option<&CpuTensor>,
        s: Conv1dShape,
        accumulate: bool,
        out: &mut CpuTensor,
    ) {
        let p = w
            .conv
            .as_deref()
            .expect("ada_in_snake_conv1d_q8: a weight made by conv_weight_q8");
        let (c, len) = (s.c_in, s.len_in);
        assert!(x.data.len() >= c * len, "feature map shape");
        // AdaIN's per-channel [scale, shift] and x's range, in parallel over channels.
        let mut map = vec![0f32; 4 * c];
        let mp = par::SharedMut(map.as_mut_ptr());
        self.pool.run(c, |a, b| {
            let mp = mp;
            for ch in a..b {
                let (g, bb) = (1.0 + gamma_beta.data[ch], gamma_beta.data[c + ch]);
                let r = &x.data[ch * len..(ch + 1) * len];
                for (i, v) in ops::vmath::ada_in_map(r, g, bb, eps)
                    .into_iter()
                    .enumerate()
                {
                    // SAFETY: entries 4 ch..4 ch + 4 are this thread's alone, inside map.
                    unsafe { mp.write(4 * ch + i, v) };
                }
            }
        });
        let pre = ops::conv1d_q8::Pre {
            map: &map,
            alpha: alpha.map(|a| &a.data[..c]),
        };
        ops::conv1d_q8::conv1d(&self.pool, x, p, bias, s, Some(pre), accumulate, out)
    }

    fn conv_transpose1d(
        &self,
        x: &CpuTensor,
        w: &CpuTensor,
        bias: Option<&CpuTensor>,
        s: Conv1dShape,
        out: &mut CpuTensor,
    ) {
        if self.reference {
            return ops::conv1d_nc::conv_transpose1d_direct(&self.pool, x, w, bias, s, out);
        }
        ops::conv1d_nc::conv_transpose1d(&self.pool, x, w, bias, s, out)
    }

    fn conv_transpose_weight(&self, w: &[f32], s: Conv1dShape) -> Option<CpuWeight> {
        if self.reference {
            return None;
        }
        let packed = match ops::conv1d_amx::pack_transposed(w, &s) {
            Some(p) => ConvT::Bf16(p),
            None => ConvT::F32(ops::conv1d_nc::pack_phases(w, &s)?),
        };
        Some(CpuWeight {
            ty: GgmlType::F32,
            rows: s.c_out,
            cols: 0,
            row_bytes: 0,
            x8: false,
            bytes: Vec::new().into(),
            mlx: None,
            amx: None,
            i8: None,
            f32p: None,
            conv: None,
            conv_t: Some(Box::new(packed)),
        })
    }

    fn conv_transpose1d_packed(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        bias: Option<&CpuTensor>,
        s: Conv1dShape,
        out: &mut CpuTensor,
    ) {
        match w.conv_t.as_deref() {
            Some(ConvT::Bf16(p)) => {
                ops::conv1d_amx::conv_transpose1d(&self.pool, x, p, bias, s, out)
            }
            Some(ConvT::F32(p)) => {
                ops::conv1d_nc::conv_transpose1d_packed(&self.pool, x, p, bias, s, out)
            }
            None => panic!("conv_transpose1d_packed: a weight made by conv_transpose_weight"),
        }
    }

    fn lstm(
        &self,
        x: &CpuTensor,
        w_ih: &CpuTensor,
        w_hh: &CpuTensor,
        bias: &CpuTensor,
        s: LstmShape,
        out: &mut CpuTensor,
    ) {
        ops::lstm::lstm(x, w_ih, w_hh, bias, s, out)
    }

    fn bilstm_steps(
        &self,
        gx: &CpuTensor,
        w_hh: &CpuTensor,
        len: usize,
        hidden: usize,
        out: &mut CpuTensor,
    ) {
        ops::lstm::bilstm_steps(&self.pool, gx, w_hh, len, hidden, out)
    }

    fn layer_norm_rows(
        &self,
        x: &mut CpuTensor,
        w: Option<&CpuTensor>,
        b: Option<&CpuTensor>,
        eps: f32,
        rows: usize,
        cols: usize,
    ) {
        if self.reference {
            return ops::norm1d::layer_norm(x, w, b, eps, rows, cols);
        }
        let (w, b) = (w.map(|w| &w.data[..cols]), b.map(|b| &b.data[..cols]));
        ops::signal::per_channel(&self.pool, x, rows, cols, |_, r| {
            ops::vmath::layer_norm_row(r, w, b, eps)
        })
    }

    fn ada_in(&self, x: &mut CpuTensor, gamma_beta: &CpuTensor, c: usize, len: usize, eps: f32) {
        if self.reference {
            return ops::norm1d::ada_in(x, gamma_beta, c, len, eps);
        }
        ops::signal::per_channel(&self.pool, x, c, len, |ch, r| {
            let (g, b) = (1.0 + gamma_beta.data[ch], gamma_beta.data[c + ch]);
            ops::vmath::ada_in_row(r, g, b, eps)
        })
    }

    fn ada_layer_norm(
        &self,
        x: &mut CpuTensor,
        gamma_beta: &CpuTensor,
        len: usize,
        c: usize,
        eps: f32,
    ) {
        ops::norm1d::ada_layer_norm(x, gamma_beta, len, c, eps)
    }

    fn snake(&self, x: &mut CpuTensor, alpha: &CpuTensor, c: usize, len: usize) {
        ops::signal::snake(&self.pool, x, alpha, c, len)
    }

    fn leaky_relu(&self, x: &mut CpuTensor, slope: f32, n: usize) {
        ops::signal::leaky_relu(&self.pool, x, slope, n)
    }

    fn transpose(&self, x: &CpuTensor, rows: usize, cols: usize, out: &mut CpuTensor) {
        ops::signal::transpose(x, rows, cols, out)
    }

    fn fake_quant_u8(&self, x: &mut CpuTensor, n: usize) {
        ops::signal::fake_quant_u8(x, n)
    }

    fn stft(&self, signal: &CpuTensor, len: usize, n_fft: usize, hop: usize, out: &mut CpuTensor) {
        ops::signal::stft(&self.pool, signal, len, n_fft, hop, out)
    }

    fn istft(
        &self,
        spec: &CpuTensor,
        frames: usize,
        n_fft: usize,
        hop: usize,
        out: &mut CpuTensor,
    ) {
        ops::signal::istft(&self.pool, spec, frames, n_fft, hop, out)
    }

    fn upsample_nearest(
        &self,
        x: &CpuTensor,
        c: usize,
        len: usize,
        factor: usize,
        out: &mut CpuTensor,
    ) {
        ops::signal::upsample_nearest(x, c, len, factor, out)
    }

    fn unary(
        &self,
        x: &mut CpuTensor,
        op: crate::Unary,
        (rows, cols): (usize, usize),
        start: usize,
        n: usize,
    ) {
        assert!(
            start + n <= rows * cols,
            "unary: values past {rows} x {cols}"
        );
        op.apply(&mut x.data[start..start + n]);
    }

    fn reflect_pad_left(&self, x: &CpuTensor, c: usize, len: usize) -> CpuTensor {
        assert!(len >= 2, "reflect_pad_left: rows of {len} samples");
        let mut out = self.tensor(c, len + 1);
        for (o, r) in out
            .data
            .chunks_exact_mut(len + 1)
            .zip(x.data.chunks_exact(len))
        {
            o[0] = r[1];
            o[1..].copy_from_slice(r);
        }
        out
    }

    fn self_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        heads: usize,
        head_dim: usize,
        len: usize,
        out: &mut CpuTensor,
    ) {
        if self.reference {
            return ops::self_attention::self_attention(q, k, v, heads, head_dim, len, out);
        }
        ops::self_attention::self_attention_par(&self.pool, q, k, v, heads, head_dim, len, out)
    }

    fn gelu_tanh(&self, x: &mut CpuTensor, n: usize) {
        if self.reference {
            return ops::signal::gelu_tanh(x, n);
        }
        assert!(x.data.len() >= n, "gelu_tanh length");
        let xp = par::SharedMut(x.data.as_mut_ptr());
        self.pool.run_aligned(n, 4096, |a, b| {
            let xp = xp;
            // SAFETY: a..b is this thread's alone and lies inside x (checked).
            ops::vmath::gelu_tanh(unsafe { std::slice::from_raw_parts_mut(xp.0.add(a), b - a) })
        })
    }
}
