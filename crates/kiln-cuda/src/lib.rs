//! kiln's CUDA backend.
//!
//! The driver API is loaded at run time through `cudarc` and the kernels (kernels/*.cu) are
//! compiled by NVRTC on first use (PTX cached under `$KILN_HOME/cuda`), so building needs no
//! CUDA toolkit and a machine without a GPU gets a clear error from [`CudaBackend::new`].
//!
//! What runs on the GPU: the whole LLM path — embedding lookup, RMSNorm fused into the
//! matrix products that follow it, matrix-vector products for F32, F16, Q4_0, Q4_1, Q8_0,
//! Q4_K and Q6_K (other formats widened to f32 at load), per-head q/k norm + RoPE + KV-cache
//! store in one kernel, split-K attention over an f16 KV cache, SwiGLU, residual adds fused
//! into the producing product, greedy argmax — and one decode step is recorded as a CUDA
//! graph the second time it runs and replayed afterwards ([`TensorOps::step`]); positions and
//! token ids are read from device memory, so the graph stays valid from token to token.
//!
//! The speech ops (Whisper's layer norm, GELU, dense attention; Kokoro's signal ops) run on
//! the CPU backend for now: inputs are copied to the host, the CPU op runs, outputs are
//! copied back. Whisper's conv1d runs on the GPU (im2col + the matrix product).

mod attention;
mod device;
mod kv;
mod launch;
mod membw;
pub mod pack;
mod picks;
mod products;
mod signal;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

use cudarc::driver::sys;
use kiln_backend::cpu::CpuBackend;
use kiln_backend::{
    AttnShape, BackendError, Conv1dShape, DenseAttnShape, KvType, KvWindow, LlmOps, MlxWeightData,
    RopeConfig, RopeStyle, SeqKv, SpeechOps, TensorOps, WeightData, FED_TOKEN,
};

pub use device::CudaInitError;
use device::{DevBuf, Device, Readback};
use pack::{FMT_F16, FMT_F32};

pub use attention::attention_supported;
use attention::*;
pub use kv::CudaKvCache;
use kv::*;
use launch::*;
pub use launch::{BlasStart, BLAS_MIN_SIDE};
use products::*;

/// Tokens one matvec launch takes (kernels/*.cu MAX_TOK).
/// From this many queries, dense attention runs as attn_dense_rows (a thread per query), below
/// as attn_dense_few (a block per query).
const DENSE_ROWS_MIN_QUERIES: usize = 8;

const MAX_TOK: usize = 4;
/// Warps per matvec block (kernels/*.cu WARPS).
const WARPS: usize = 8;
/// Token ids the step parameters hold.
const MAX_IDS: usize = 4096;

pub struct CudaTensor {
    buf: DevBuf,
    rows: usize,
    cols: usize,
}

pub struct CudaWeight {
    fmt: i32,
    rows: usize,
    cols: usize,
    stored_bytes: usize,
    /// FMT_F32 holding another format widened at load (pack.rs).
    widened: bool,
    q: DevBuf,
    s: DevBuf,
    s2: DevBuf,
}

pub struct CudaBackend {
    /// Step parameters on the device: [pos0, n, ids...]; `params_host` mirrors them.
    params: DevBuf,
    params_host: RefCell<Option<(u32, Vec<u32>)>>,
    /// The key of the last pick fed to the next step (`argmax_feed`) and its copy to the
    /// host (made by the first feed); `feeds` false with KILN_CUDA_NO_FEED=1 (the host reads
    /// each pick before the next step is queued).
    feeds: bool,
    fed_key: DevBuf,
    fed: RefCell<Option<Readback>>,
    recording: Cell<bool>,
    xq_src: Cell<Option<XqSrc>>,
    /// Inside [`TensorOps::step`]: the sums-of-squares slots from `ss_next` on are free.
    in_step: Cell<bool>,
    /// Sampling candidates selected on the GPU (kernels/*.cu topk_chunks; KILN_CUDA_NO_TOPK=1
    /// turns it off: the logits go to the host).
    topk: bool,
    tune: Tune,
    ss: DevBuf,
    ss_next: Cell<usize>,
    graphs: RefCell<HashMap<u64, Graph>>,
    seen: RefCell<HashSet<u64>>,
    /// SCRATCH_GEN when `graphs` were recorded.
    graphs_gen: Cell<u64>,
    use_graphs: bool,
    /// Steps run by replaying a recording (tests check that decoding replays).
    replays: Cell<u64>,
    /// Every RoPE table a model has used (Gemma 3 alternates two), kept so that a recorded
    /// step's layers each find theirs at the address it was recorded with.
    rope: RefCell<Vec<(RopeConfig, DevBuf)>>,
    scratch: RefCell<Scratch>,
    /// Bytes of scores and probabilities one query chunk of the prompt attention may take.
    prompt_attn_bytes: Cell<usize>,
    /// cuBLAS, for prompt-sized products (None where libcublas is missing).
    blas: LazyBlas,
    /// The KV caches' blocks (kv.rs).
    kv_pool: std::sync::Arc<std::sync::Mutex<BlockPool>>,
    cpu: CpuBackend,
    /// Last: everything above holds device memory or graphs of this context.
    dev: Device,
}

impl CudaBackend {
    /// The first GPU. Errors (one line) when no driver or device is there.
    pub fn new() -> Result<Self, CudaInitError> {
        Self::with_device(0)
    }

    pub fn with_device(ordinal: usize) -> Result<Self, CudaInitError> {
        Self::with_blas(ordinal, BlasStart::Early)
    }

    /// GPU `ordinal`, with cuBLAS brought up as `start` says (a speech model's products are
    /// small enough for kiln's own kernel: it need not pay the library's load).
    pub fn with_blas(ordinal: usize, start: BlasStart) -> Result<Self, CudaInitError> {
        let blas = LazyBlas::new(start);
        let dev = match Device::new(ordinal) {
            Ok(dev) => dev,
            Err(e) => {
                // No context: the thread's handle can never be made, so it is not waited for.
                blas.detach();
                return Err(e);
            }
        };
        let params = DevBuf::alloc(4 * (2 + MAX_IDS));
        dev.memset_u32(params.ptr, 0, 2 + MAX_IDS);
        blas.target(dev.ctx.clone(), dev.cu_stream());
        Ok(CudaBackend {
            blas,
            dev,
            params,
            params_host: RefCell::new(None),
            feeds: !kiln_backend::options::dev_flag("KILN_CUDA_NO_FEED"),
            fed_key: DevBuf::alloc(8),
            fed: RefCell::new(None),
            recording: Cell::new(false),
            xq_src: Cell::new(None),
            in_step: Cell::new(false),
            topk: !kiln_backend::options::dev_flag("KILN_CUDA_NO_TOPK"),
            tune: Tune::from_env(),
            ss: DevBuf::alloc(4 * SS_SLOTS),
            ss_next: Cell::new(0),
            graphs: RefCell::default(),
            seen: RefCell::default(),
            graphs_gen: Cell::new(SCRATCH_GEN.load(std::sync::atomic::Ordering::Relaxed)),
            use_graphs: !kiln_backend::options::get().no_cuda_graphs,
            replays: Cell::new(0),
            rope: RefCell::new(Vec::new()),
            scratch: RefCell::default(),
            prompt_attn_bytes: Cell::new(PROMPT_ATTN_BYTES),
            kv_pool: Default::default(),
            cpu: CpuBackend::new(kiln_backend::cpu::default_threads()),
        })
    }

    /// At most `blocks` KV cache blocks (of 64 positions, every layer) are allocated by this
    /// backend's caches at once (None: as many as device memory holds); a step that needs
    /// more fails with the cache's error.
    pub fn set_kv_block_limit(&self, blocks: Option<usize>) {
        self.kv_pool.lock().unwrap().limit = blocks;
    }

    /// Sampling candidates selected on the GPU (the default; KILN_CUDA_NO_TOPK=1 turns it off).
    pub fn with_gpu_candidates(mut self) -> Self {
        self.topk = true;
        self
    }

    /// Bounds the scores and probabilities of one query chunk of the prompt attention (for
    /// tests: a small bound splits a prompt into many chunks).
    pub fn set_prompt_attention_bytes(&self, bytes: usize) {
        self.prompt_attn_bytes.set(bytes.max(1));
    }

    /// Prompts' attention in one pass over the cache in `form` (1, or 2: the second form,
    /// split over the keys, `splits` of them or sized to the GPU) whatever their length: for
    /// tests and comparisons (KILN_CUDA_FLASH_PROMPT, KILN_CUDA_FLASH_SPLITS).
    pub fn with_flash_prompt(mut self, form: usize, splits: Option<usize>) -> Self {
        self.tune.flash_prompt = Some(form.min(2));
        self.tune.flash_splits = splits.filter(|n| (1..=64).contains(n));
        self
    }

    /// Every step launched op by op (no graph recording): for comparisons.
    pub fn without_graphs(mut self) -> Self {
        self.use_graphs = false;
        self
    }

    /// Whether cuBLAS has been started for this backend (loading or loaded; [`BlasStart`]).
    pub fn blas_started(&self) -> bool {
        self.blas.started()
    }

    /// How many steps ran by replaying a recorded graph so far.
    pub fn replayed_steps(&self) -> u64 {
        self.replays.get()
    }

    /// Waits for all queued work; errors of earlier kernels surface here.
    pub fn synchronize(&self) -> Result<(), String> {
        self.dev.sync().map_err(|e| format!("CUDA: {e:?}"))
    }

    /// Makes the device's step parameters hold `pos0` and `ids` (when given). The mirror's
    /// buffer is reused: no allocation per step.
    fn set_params(&self, pos0: usize, ids: Option<&[u32]>) {
        let mut cur = self.params_host.borrow_mut();
        let same = match (&*cur, ids) {
            (Some((p, _)), None) => *p == pos0 as u32,
            (Some((p, have)), Some(ids)) => *p == pos0 as u32 && have[2..] == *ids,
            (None, _) => false,
        };
        if same {
            return;
        }
        assert!(
            !self.recording.get(),
            "a recorded step changed its positions or tokens"
        );
        // The mirror holds exactly what the device holds: [pos0, n, ids...], where
        // FED_TOKEN stands for the pick argmax_feed left there (only the position is
        // written then).
        let v = cur.get_or_insert_with(|| (0, vec![0, 0]));
        v.0 = pos0 as u32;
        v.1[0] = pos0 as u32;
        if let Some(ids) = ids {
            v.1.truncate(2);
            v.1[1] = ids.len() as u32;
            v.1.extend_from_slice(ids);
        }
        let n = match ids {
            Some([FED_TOKEN]) => 2,
            _ => v.1.len(),
        };
        self.dev.htod(self.params.ptr, &v.1[..n]);
    }

    fn elementwise_n_args(&self, name: &str, args: &mut Args, n: usize) {
        self.xq_src.set(None);
        let blocks = n.div_ceil(256).clamp(1, 65535 * 4) as u32;
        self.dev.launch(
            self.dev.func(name),
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            &mut args.ptrs(),
        );
    }

    fn elementwise(&self, name: &str, args: Args, n: usize) {
        self.xq_src.set(None);
        let mut args = args.a(n);
        let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
        self.dev.launch(
            self.dev.func(name),
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            &mut args.ptrs(),
        );
    }

    // ---- CPU fallback for the ops without a kernel yet ----

    fn to_cpu(&self, t: &CudaTensor) -> kiln_backend::cpu::CpuTensor {
        let mut v = vec![0f32; t.rows * t.cols];
        self.dev.dtoh(&mut v, t.buf.ptr);
        self.cpu.tensor_from(t.rows, t.cols, &v)
    }

    fn from_cpu(&self, c: &kiln_backend::cpu::CpuTensor, t: &mut CudaTensor) {
        self.xq_src.set(None);
        let n = (c.data.len()).min(t.rows * t.cols);
        self.dev.htod(t.buf.ptr, &c.data[..n]);
    }
}

fn dev_vec(dev: &Device, bytes: &[u8]) -> DevBuf {
    let b = DevBuf::alloc(bytes.len());
    dev.htod(b.ptr, bytes);
    b
}

impl TensorOps for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;

    fn name(&self) -> String {
        format!("CUDA ({})", self.dev.name)
    }

    fn load_weight(&self, w: WeightData) -> Result<CudaWeight, BackendError> {
        let t0 = self.dev.t0();
        let p =
            pack::pack(w.ty, w.rows, w.cols, w.bytes).map_err(|source| BackendError::Quant {
                name: w.name.to_string(),
                source,
            })?;
        if p.fmt != FMT_F32 && p.fmt != FMT_F16 && w.cols % 32 != 0 {
            return Err(BackendError::Weight {
                name: w.name.into(),
                what: format!("{} columns: not a multiple of 32", w.cols),
            });
        }
        if w.rows.min(w.cols) >= BLAS_MIN_SIDE {
            // Products big enough to want cuBLAS's kernels: loaded beside the rest.
            self.blas.want();
        }
        let stored_bytes = w.bytes.len();
        let q = dev_vec(&self.dev, &p.q);
        let s = dev_vec(&self.dev, &p.s);
        let s2 = dev_vec(&self.dev, &p.s2);
        self.dev.sync().map_err(|e| BackendError::Weight {
            name: w.name.into(),
            what: format!("CUDA upload: {e:?}"),
        })?;
        if let Some(t) = &self.dev.times {
            t.add(&t.weights, t0);
        }
        Ok(CudaWeight {
            fmt: p.fmt,
            rows: w.rows,
            cols: w.cols,
            stored_bytes,
            widened: p.fmt == FMT_F32 && w.ty != kiln_quant::GgmlType::F32,
            q,
            s,
            s2,
        })
    }

    /// MLX 4-bit matrices run on the Q4_1 kernel (repacked exactly, see
    /// [`pack::mlx_as_q4_1`]); 8-bit ones, and scales no f16 holds, are widened to f32.
    fn load_weight_mlx(&self, w: MlxWeightData) -> Result<CudaWeight, BackendError> {
        w.check()?;
        let (bits, group) = (w.layout.bits, w.layout.group);
        match pack::mlx_as_q4_1(bits, group, w.rows, w.cols, w.q, w.scales, w.biases) {
            Some(bytes) => {
                let mut cw = self.load_weight(WeightData {
                    name: w.name,
                    ty: kiln_quant::GgmlType::Q4_1,
                    rows: w.rows,
                    cols: w.cols,
                    bytes: &bytes,
                })?;
                // What the checkpoint holds: packed q plus a scale and bias per group.
                cw.stored_bytes = w.q.len() + 2 * 2 * w.scales.len();
                Ok(cw)
            }
            None => {
                let f = w.dequantize()?;
                let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
                self.load_weight(WeightData {
                    name: w.name,
                    ty: kiln_quant::GgmlType::F32,
                    rows: w.rows,
                    cols: w.cols,
                    bytes: &bytes,
                })
            }
        }
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    /// The weights keep their one layout; the hint that block products come soon (Whisper's
    /// encoder right after the load, Kokoro's layers) warms cuBLAS up beside the load.
    fn prefer_batches(&self, w: &mut CudaWeight, int8: bool) {
        let _ = (w, int8);
        self.blas.warm();
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.stored_bytes
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        let t0 = self.dev.t0();
        let buf = DevBuf::alloc(rows * cols * 4);
        self.dev.memset_u32(buf.ptr, 0, (rows * cols).max(1));
        if let Some(t) = &self.dev.times {
            t.add(&t.tensors, t0);
        }
        CudaTensor { buf, rows, cols }
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> CudaTensor {
        let n = data.len().min(rows * cols);
        // Zeroed first only where the values do not cover it.
        let t = match n < rows * cols {
            true => self.tensor(rows, cols),
            false => CudaTensor {
                buf: DevBuf::alloc(n * 4),
                rows,
                cols,
            },
        };
        self.dev.htod(t.buf.ptr, &data[..n]);
        t
    }

    fn read(&self, t: &CudaTensor, rows: usize, out: &mut [f32]) {
        let n = (rows * t.cols).min(out.len()).min(t.rows * t.cols);
        self.dev.dtoh(&mut out[..n], t.buf.ptr);
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32, n: usize, out: &mut CudaTensor) {
        self.rms_norm_rows(x.buf.ptr, w.buf.ptr, eps, x.cols, n, out.buf.ptr);
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        bias: Option<&CudaTensor>,
        n: usize,
        out: &mut CudaTensor,
    ) {
        let m = self.mats(&[(w, bias, out)]);
        self.matvec(m, (x.buf.ptr, x.cols), w.cols, n, None, MODE_STORE, None);
    }

    fn matmul_add(&self, w: &CudaWeight, x: &CudaTensor, n: usize, out: &mut CudaTensor) {
        let m = self.mats(&[(w, None, out)]);
        self.matvec(m, (x.buf.ptr, x.cols), w.cols, n, None, MODE_ADD, None);
    }

    fn matmul3(
        &self,
        ws: [&CudaWeight; 3],
        biases: [Option<&CudaTensor>; 3],
        x: &CudaTensor,
        n: usize,
        outs: [&mut CudaTensor; 3],
    ) {
        self.matvec3(ws, biases, x, n, None, outs)
    }

    fn silu_mul(&self, gate: &mut CudaTensor, up: &CudaTensor, n: usize) {
        let a = Args::default().a(gate.buf.ptr).a(up.buf.ptr);
        self.elementwise("silu_mul", a, n * gate.cols);
    }

    fn gelu_tanh_mul(&self, gate: &mut CudaTensor, up: &CudaTensor, n: usize) {
        let a = Args::default().a(gate.buf.ptr).a(up.buf.ptr);
        self.elementwise("gelu_tanh_mul", a, n * gate.cols);
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor, n: usize) {
        let a = Args::default().a(x.buf.ptr).a(y.buf.ptr);
        self.elementwise("add", a, n * x.cols);
    }

    fn copy_row(&self, src: &CudaTensor, src_row: usize, dst: &mut CudaTensor) {
        self.dev.dtod(
            dst.buf.ptr,
            src.buf.ptr + (src_row * src.cols * 4) as u64,
            src.cols * 4,
        );
    }

    fn copy_rows(
        &self,
        src: &CudaTensor,
        src_row0: usize,
        n: usize,
        dst: &mut CudaTensor,
        dst_row0: usize,
    ) {
        self.xq_src.set(None);
        self.dev.dtod(
            dst.buf.ptr + (dst_row0 * dst.cols * 4) as u64,
            src.buf.ptr + (src_row0 * src.cols * 4) as u64,
            n * src.cols * 4,
        );
    }

    fn step(
        &self,
        key: Option<u64>,
        tokens: &[u32],
        pos0: usize,
        f: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        // Every run of f hands out the step's sums-of-squares slots from the start.
        let mut f = || {
            self.ss_next.set(0);
            self.in_step.set(true);
            let r = f();
            self.in_step.set(false);
            self.xq_src.set(None);
            r
        };
        let key = match key {
            Some(k) if self.use_graphs && !self.recording.get() && tokens.len() <= MAX_IDS => k,
            _ => return f(),
        };
        // A short cache's decode attention has no combine: a recording of its own.
        let key = key ^ (self.one_split_step(pos0, tokens.len()) as u64) << 63;
        self.set_params(pos0, Some(tokens));
        // A buffer moved since the recordings (a batch of several sequences grew one, say):
        // they would write to freed memory, so each step is recorded again.
        let gen = SCRATCH_GEN.load(std::sync::atomic::Ordering::Relaxed);
        if gen != self.graphs_gen.get() {
            self.graphs.borrow_mut().clear();
            self.seen.borrow_mut().clear();
            self.graphs_gen.set(gen);
        }
        if let Some(g) = self.graphs.borrow().get(&key) {
            let t0 = self.dev.t0();
            unsafe { sys::cuGraphLaunch(g.exec, self.dev.cu_stream()).result() }
                .unwrap_or_else(|e| panic!("CUDA: graph launch failed: {e:?}"));
            self.replays.set(self.replays.get() + 1);
            if let Some(t) = &self.dev.times {
                t.add(&t.graph, t0);
            }
            return Ok(());
        }
        if self.seen.borrow_mut().insert(key) {
            // First time: run eagerly, so that every buffer the step needs gets allocated
            // before anything is recorded.
            return f();
        }
        // cuBLAS made first: its thread's allocations must not meet a capture in progress.
        self.blas.get();
        let s = self.dev.cu_stream();
        unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .result()
        }
        .unwrap_or_else(|e| panic!("CUDA: starting a graph capture failed: {e:?}"));
        self.recording.set(true);
        let r = f();
        self.recording.set(false);
        let mut graph = std::ptr::null_mut();
        unsafe { sys::cuStreamEndCapture(s, &mut graph).result() }
            .unwrap_or_else(|e| panic!("CUDA: ending a graph capture failed: {e:?}"));
        r?;
        let mut exec = std::ptr::null_mut();
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result() }
            .unwrap_or_else(|e| panic!("CUDA: instantiating the step graph failed: {e:?}"));
        let g = Graph { exec, graph };
        unsafe { sys::cuGraphLaunch(g.exec, s).result() }
            .unwrap_or_else(|e| panic!("CUDA: graph launch failed: {e:?}"));
        let mut graphs = self.graphs.borrow_mut();
        if graphs.len() >= 64 {
            // Keys are never reused; an old state's recording is only memory.
            graphs.clear();
        }
        graphs.insert(key, g);
        Ok(())
    }

    fn scale(&self, x: &mut CudaTensor, s: f32, n: usize) {
        let a = Args::default().a(x.buf.ptr).a(s);
        self.elementwise("scale", a, n);
    }
}

impl LlmOps for CudaBackend {
    type KvCache = CudaKvCache;

    fn kv_cache(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> CudaKvCache {
        self.kv_cache_typed(n_layers, n_ctx, n_kv_heads, head_dim, KvType::F16)
            .expect("an f16 cache of any shape")
    }

    fn kv_cache_typed(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: KvType,
    ) -> Result<CudaKvCache, BackendError> {
        // f16 keys and values (f32 is stored as f16) or q8_0 ones, in blocks taken as the
        // sequence grows (kv.rs).
        if ty == KvType::Q8_0 {
            ty.check(head_dim)?;
        }
        Ok(CudaKvCache::new(
            &self.dev,
            self.kv_pool.clone(),
            n_layers,
            n_ctx,
            n_kv_heads,
            head_dim,
            ty == KvType::Q8_0,
        ))
    }

    fn kv_cache_window(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: Option<KvType>,
        win: KvWindow,
    ) -> Result<CudaKvCache, BackendError> {
        let ty = ty.unwrap_or(KvType::F16);
        let mut c = self.kv_cache_typed(n_layers, n_ctx, n_kv_heads, head_dim, ty)?;
        c.window = (win.window > 0).then_some(win);
        Ok(c)
    }

    fn kv_kept_from(&self, cache: &CudaKvCache) -> usize {
        cache.kept_from()
    }

    fn check_window(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn check_short_conv(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn short_conv(
        &self,
        bcx: &CudaTensor,
        taps: &CudaTensor,
        state: &mut CudaTensor,
        srow: usize,
        (dim, k): (usize, usize),
        (row0, n): (usize, usize),
        fresh: bool,
        out: &mut CudaTensor,
    ) {
        assert!((1..=64).contains(&k), "short convolution width {k}");
        self.xq_src.set(None);
        // A recorded step (one sequence's decode token) reads "fresh" from its position at
        // every replay; otherwise the caller's flag.
        let fresh = match self.recording.get() {
            true => 2,
            false => fresh as i32,
        };
        let mut a = Args::default()
            .a(bcx.buf.ptr)
            .a(taps.buf.ptr)
            .a(state.buf.ptr)
            .a(srow as i32)
            .a(dim as i32)
            .a(k as i32)
            .a(row0 as i32)
            .a(n as i32)
            .a(fresh)
            .a(self.params.ptr)
            .a(out.buf.ptr);
        self.dev.launch(
            self.dev.func("short_conv"),
            (dim.div_ceil(128) as u32, 1, 1),
            (128, 1, 1),
            0,
            &mut a.ptrs(),
        );
    }

    fn check_attention(
        &self,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        attention_supported(heads, kv_heads, head_dim).map_err(|what| BackendError::Unsupported {
            backend: "CUDA".into(),
            what,
        })
    }

    fn kv_type_stored(&self, ty: KvType) -> KvType {
        match ty {
            KvType::F32 | KvType::F16 => KvType::F16,
            other => other,
        }
    }

    fn kv_type_default(&self, _head_dim: usize) -> KvType {
        KvType::F16
    }

    fn kv_cache_bytes(&self, c: &CudaKvCache) -> usize {
        c.held_bytes()
    }

    fn kv_reserve(
        &self,
        cache: &mut CudaKvCache,
        pos0: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        cache.reserve(&self.dev, pos0, n)
    }

    fn kv_release(&self, cache: &mut CudaKvCache) {
        cache.release(&self.dev);
    }

    fn embed(
        &self,
        table: &CudaWeight,
        ids: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        // FED_TOKEN: the pick the last argmax_feed left in the step's parameters.
        let fed = ids == [FED_TOKEN] && self.fed.borrow().is_some();
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= table.rows && !fed) {
            return Err(BackendError::TokenOutOfRange {
                id,
                vocab: table.rows,
            });
        }
        for (c, chunk) in ids.chunks(MAX_IDS).enumerate() {
            let pos = self
                .params_host
                .borrow()
                .as_ref()
                .map_or(0, |p| p.0 as usize);
            self.set_params(pos, Some(chunk));
            let m = Mat {
                q: table.q.ptr,
                s: table.s.ptr,
                s2: table.s2.ptr,
                rows: table.rows as i32,
                fmt: table.fmt,
                ..Default::default()
            };
            let dst = out.buf.ptr + (c * MAX_IDS * out.cols * 4) as u64;
            let mut a = Args::default()
                .a(m)
                .a(table.cols as i32)
                .a(self.params.ptr)
                .a(dst);
            let bx = table.cols.div_ceil(256).min(64) as u32;
            self.dev.launch(
                self.dev.func("embed"),
                (bx, chunk.len() as u32, 1),
                (256, 1, 1),
                0,
                &mut a.ptrs(),
            );
        }
        Ok(())
    }

    fn embed_positions(
        &self,
        table: &CudaWeight,
        pos0: usize,
        n: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if pos0 + n > table.rows {
            return Err(BackendError::TokenOutOfRange {
                id: (pos0 + n - 1) as u32,
                vocab: table.rows,
            });
        }
        if n == 0 {
            return Ok(());
        }
        self.xq_src.set(None);
        // The row comes from the device's pos0 (a recorded step replays at any position).
        self.set_params(pos0, None);
        let m = Mat {
            q: table.q.ptr,
            s: table.s.ptr,
            s2: table.s2.ptr,
            rows: table.rows as i32,
            fmt: table.fmt,
            ..Default::default()
        };
        let mut a = Args::default()
            .a(m)
            .a(table.cols as i32)
            .a(self.params.ptr)
            .a(out.buf.ptr);
        let bx = table.cols.div_ceil(256).min(64) as u32;
        self.dev.launch(
            self.dev.func("embed_pos"),
            (bx, n as u32, 1),
            (256, 1, 1),
            0,
            &mut a.ptrs(),
        );
        Ok(())
    }

    fn rms_norm_heads(&self, x: &mut CudaTensor, w: &CudaTensor, eps: f32, n: usize) {
        let head_dim = w.cols;
        let g = HeadGroup {
            x: x.buf.ptr,
            norm_w: w.buf.ptr,
            heads: (x.cols / head_dim) as i32,
            ..Default::default()
        };
        let pos = self
            .params_host
            .borrow()
            .as_ref()
            .map_or(0, |p| p.0 as usize);
        self.heads_launch(&[g], head_dim, eps, None, pos, n);
    }

    fn matmul_add_before_norm(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        n: usize,
        out: &mut CudaTensor,
        next_norm: (&CudaTensor, f32),
    ) {
        let m = self.mats(&[(w, None, &*out)]);
        let qout = Some(next_norm.0.buf.ptr);
        self.matvec(m, (x.buf.ptr, x.cols), w.cols, n, None, MODE_ADD, qout);
    }

    fn gate_up_silu(
        &self,
        gate: &CudaWeight,
        up: &CudaWeight,
        x: &CudaTensor,
        n: usize,
        out: &mut CudaTensor,
    ) {
        self.gate_up(gate, up, x, n, None, out, MODE_GATE_UP)
    }

    fn gate_up_gelu(
        &self,
        gate: &CudaWeight,
        up: &CudaWeight,
        x: &CudaTensor,
        n: usize,
        out: &mut CudaTensor,
        _up_out: &mut CudaTensor,
    ) {
        self.gate_up(gate, up, x, n, None, out, MODE_GATE_UP_GELU)
    }

    fn rms_norm_gate_up_gelu(
        &self,
        x: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        gate: &CudaWeight,
        up: &CudaWeight,
        n: usize,
        _h: &mut CudaTensor,
        out: &mut CudaTensor,
        _up_out: &mut CudaTensor,
    ) {
        let norm = Some((norm_w, eps));
        self.gate_up(gate, up, x, n, norm, out, MODE_GATE_UP_GELU)
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
        n: usize,
        _h: &mut CudaTensor,
        next_norm: Option<(&CudaTensor, f32)>,
    ) {
        self.xq_src.set(None);
        let cols = x.cols;
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(y.buf.ptr)
            .a(w.buf.ptr)
            .a(eps)
            .a(cols as i32);
        // A decode step's next product reads x RMS-normed and quantized: written here, as
        // quant_act would write them, that product's quant_act launch goes.
        let Some((nw, next_eps)) = next_norm.filter(|_| n <= DEC_MAX_TOK && cols % 32 == 0) else {
            return self.launch_rows("add_rms_norm", n, &mut a);
        };
        let xq = self.xq_scratch(pack::xq_bytes(cols, DEC_MAX_TOK.max(MAX_TOK)));
        let mut a = a.a(nw.buf.ptr).a(next_eps).a(n as i32).a(xq);
        self.dev.launch(
            self.dev.func("add_rms_norm_quant"),
            (n as u32, 1, 1),
            (1024, 1, 1),
            0,
            &mut a.ptrs(),
        );
        self.xq_src.set(Some(XqSrc {
            x: x.buf.ptr,
            n,
            norm: nw.buf.ptr,
            ss: 0,
            xq,
            inv: true,
        }));
    }

    fn rms_norm_matmul3(
        &self,
        x: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        ws: [&CudaWeight; 3],
        biases: [Option<&CudaTensor>; 3],
        n: usize,
        _h: &mut CudaTensor,
        outs: [&mut CudaTensor; 3],
    ) {
        self.matvec3(ws, biases, x, n, Some((norm_w, eps)), outs)
    }

    fn rms_norm_matmul(
        &self,
        x: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        w: &CudaWeight,
        n: usize,
        _h: &mut CudaTensor,
        out: &mut CudaTensor,
    ) {
        let m = self.mats(&[(w, None, &*out)]);
        let norm = Some((norm_w, eps));
        self.matvec(m, (x.buf.ptr, x.cols), w.cols, n, norm, MODE_STORE, None);
    }

    fn rms_norm_gate_up_silu(
        &self,
        x: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        gate: &CudaWeight,
        up: &CudaWeight,
        n: usize,
        _h: &mut CudaTensor,
        out: &mut CudaTensor,
    ) {
        self.gate_up(gate, up, x, n, Some((norm_w, eps)), out, MODE_GATE_UP)
    }

    fn qk_norm_rope_store(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        qk_norm: Option<(&CudaTensor, &CudaTensor, f32)>,
        rope: &RopeConfig,
        heads: usize,
        kv_heads: usize,
        cache: &mut CudaKvCache,
        layer: usize,
        pos0: usize,
        n: usize,
    ) {
        let hd = cache.head_dim;
        self.kv_ready(cache, pos0, n);
        let (k_off, v_off) = cache.offsets(layer);
        let (qn, kn, eps) = match qk_norm {
            Some((a, b, e)) => (a.buf.ptr, b.buf.ptr, e),
            None => (0, 0, 0.0),
        };
        let groups = [
            HeadGroup {
                x: q.buf.ptr,
                norm_w: qn,
                heads: heads as i32,
                rope: 1,
                ..Default::default()
            },
            HeadGroup {
                x: k.buf.ptr,
                norm_w: kn,
                tbl: cache.table(),
                off: k_off,
                heads: kv_heads as i32,
                rope: 1,
                q8: cache.q8_arg(),
                pad: 0,
            },
            HeadGroup {
                x: v.buf.ptr,
                norm_w: 0,
                tbl: cache.table(),
                off: v_off,
                heads: kv_heads as i32,
                rope: 0,
                q8: cache.q8_arg(),
                pad: 0,
            },
        ];
        self.heads_launch(&groups, hd, eps, Some(rope), pos0, n);
    }

    fn rope(&self, x: &mut CudaTensor, rope: &RopeConfig, heads: usize, pos0: usize, n: usize) {
        let g = HeadGroup {
            x: x.buf.ptr,
            heads: heads as i32,
            rope: 1,
            ..Default::default()
        };
        self.heads_launch(&[g], rope.head_dim, 0.0, Some(rope), pos0, n);
    }

    fn kv_store(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        pos0: usize,
        n: usize,
    ) {
        self.kv_ready(cache, pos0, n);
        self.set_params(pos0, None);
        let (k_off, v_off) = cache.offsets(layer);
        for (src, off) in [(k, k_off), (v, v_off)] {
            let mut a = Args::default()
                .a(src.buf.ptr)
                .a(cache.table())
                .a(off)
                .a(cache.kv_heads as i32)
                .a(cache.head_dim as i32)
                .a(self.params.ptr)
                .a(cache.q8_arg());
            let bx = (cache.kv_heads * cache.head_dim).div_ceil(256) as u32;
            self.dev.launch(
                self.dev.func("kv_store"),
                (bx, n as u32, 1),
                (256, 1, 1),
                0,
                &mut a.ptrs(),
            );
        }
    }

    fn qk_norm_rope_attention(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        qk_norm: Option<(&CudaTensor, &CudaTensor, f32)>,
        rope: &RopeConfig,
        seqs: &mut [SeqKv<'_, CudaKvCache>],
        layer: usize,
        out: &mut CudaTensor,
        tmp: [&mut CudaTensor; 3],
    ) {
        if let [one] = seqs {
            let s = one.shape;
            return self
                .qk_norm_rope_attention_one(q, k, v, qk_norm, rope, one.cache, layer, s, out);
        }
        let s = seqs.first().map(|s| s.shape);
        let fused = s.is_some_and(|s| {
            s.n_heads % s.n_kv_heads == 0
                && s.n_heads / s.n_kv_heads <= MAX_GROUP
                && s.head_dim % 8 == 0
                && s.head_dim <= 256
        }) && seqs.len() <= 65535
            && seqs
                .iter()
                .all(|x| x.shape.n_tokens == 1 && x.cache.head_dim == x.shape.head_dim);
        if !fused {
            return kiln_backend::qk_norm_rope_attention_seqs(
                self, q, k, v, qk_norm, rope, seqs, layer, out, tmp,
            );
        }
        // One token a sequence: one launch for them all, each normalising and rotating its
        // q and new key and storing its key and value as the one-sequence kernel does.
        for x in seqs.iter_mut() {
            self.kv_ready(x.cache, x.shape.pos0, 1);
        }
        let dh = self.dec_heads(k, v, qk_norm, rope);
        let quant = seqs[0].shape.head_dim % 32 == 0
            && out.cols == seqs[0].shape.n_heads * seqs[0].shape.head_dim;
        self.attention_seqs(q.buf.ptr, seqs, layer, out.buf.ptr, quant, dh);
    }

    fn attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        s: AttnShape,
        out: &mut CudaTensor,
    ) {
        let quant =
            s.n_tokens <= MAX_TOK && s.head_dim % 32 == 0 && out.cols == s.n_heads * s.head_dim;
        self.attention_at(q.buf.ptr, cache, layer, s, out.buf.ptr, quant, None);
    }

    fn attention_batch<'c, I>(&self, q: &CudaTensor, seqs: I, layer: usize, out: &mut CudaTensor)
    where
        I: Iterator<Item = (&'c CudaKvCache, AttnShape)>,
    {
        // One launch pair per sequence (each has its own positions).
        let mut row = 0;
        for (cache, s) in seqs {
            let off = (row * q.cols * 4) as u64;
            self.attention_at(
                q.buf.ptr + off,
                cache,
                layer,
                s,
                out.buf.ptr + off,
                false,
                None,
            );
            row += s.n_tokens;
        }
    }

    fn top_candidates(
        &self,
        x: &CudaTensor,
        cols: usize,
        k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> bool {
        self.candidates_gpu(x, cols, k, out)
    }

    fn mask_row(&self, x: &mut CudaTensor, row: usize, cols: usize, allow: &[u32]) -> bool {
        self.mask_row_gpu(x, row, cols, allow)
    }

    fn argmax_rows(&self, x: &CudaTensor, n: usize, cols: usize) -> Vec<u32> {
        self.argmax_rows_gpu(x, n, cols)
    }

    fn work_done(&self) -> bool {
        self.dev.idle()
    }

    fn feeds_picks(&self) -> bool {
        self.feeds
    }

    fn argmax_feed(&self, x: &CudaTensor, cols: usize) -> bool {
        self.argmax_feed_gpu(x, cols)
    }

    fn fed_token(&self) -> Option<u32> {
        self.fed_token_gpu()
    }

    fn kv_copy(&self, src: &CudaKvCache, dst: &mut CudaKvCache, n: usize) {
        dst.share_from(&self.dev, src, n);
    }
}

impl SpeechOps for CudaBackend {
    // ---- speech ops ----

    // The LSTM recurrences and the STFT on the CPU backend, through host copies
    // (kiln_backend::cpu_fallback_sequence_ops); Kokoro's feature-map ops (signal.rs) and
    // Whisper's layer norm, GELU and dense attention have kernels.
    kiln_backend::cpu_fallback_sequence_ops!();

    fn conv1d_nc(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        s: Conv1dShape,
        out: &mut CudaTensor,
    ) {
        self.conv1d_nc_gpu(x, w, bias, s, out)
    }

    fn conv_transpose1d(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        s: Conv1dShape,
        out: &mut CudaTensor,
    ) {
        self.conv_transpose1d_gpu(x, w, bias, s, out)
    }

    fn ada_in(&self, x: &mut CudaTensor, gb: &CudaTensor, c: usize, len: usize, eps: f32) {
        assert!(
            gb.rows * gb.cols >= 2 * c,
            "ada_in: gamma/beta of {c} channels"
        );
        self.norm_rows(x, gb.buf.ptr, 0, c, len, eps, signal::NORM_ADA_IN)
    }

    fn ada_layer_norm(&self, x: &mut CudaTensor, gb: &CudaTensor, len: usize, c: usize, eps: f32) {
        assert!(
            gb.rows * gb.cols >= 2 * c,
            "ada_layer_norm: gamma/beta of {c} channels"
        );
        self.norm_rows(x, gb.buf.ptr, 0, len, c, eps, signal::NORM_ADA_LAYER)
    }

    fn layer_norm_rows(
        &self,
        x: &mut CudaTensor,
        w: Option<&CudaTensor>,
        b: Option<&CudaTensor>,
        eps: f32,
        rows: usize,
        cols: usize,
    ) {
        let (w, b) = (w.map_or(0, |t| t.buf.ptr), b.map_or(0, |t| t.buf.ptr));
        self.norm_rows(x, w, b, rows, cols, eps, signal::NORM_LAYER)
    }

    fn snake(&self, x: &mut CudaTensor, alpha: &CudaTensor, c: usize, len: usize) {
        assert!(
            x.rows * x.cols >= c * len,
            "snake: tensor smaller than {c} x {len}"
        );
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(alpha.buf.ptr)
            .a(c as i32)
            .a(len as i32);
        self.elementwise_n_args("snake_rows", &mut a, c * len);
    }

    fn leaky_relu(&self, x: &mut CudaTensor, slope: f32, n: usize) {
        let a = Args::default().a(x.buf.ptr).a(slope);
        self.elementwise("leaky_relu", a, n);
    }

    fn gelu_tanh(&self, x: &mut CudaTensor, n: usize) {
        let a = Args::default().a(x.buf.ptr);
        self.elementwise("gelu_tanh", a, n);
    }

    fn transpose(&self, x: &CudaTensor, rows: usize, cols: usize, out: &mut CudaTensor) {
        self.transpose_gpu(x, rows, cols, out)
    }

    fn fake_quant_u8(&self, x: &mut CudaTensor, n: usize) {
        self.fake_quant_gpu(x, n)
    }

    fn upsample_nearest(
        &self,
        x: &CudaTensor,
        c: usize,
        len: usize,
        factor: usize,
        out: &mut CudaTensor,
    ) {
        let n = c * len * factor;
        assert!(
            out.rows * out.cols >= n,
            "upsample_nearest: output smaller than {n}"
        );
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(len as i32)
            .a(factor as i32)
            .a(n)
            .a(out.buf.ptr);
        self.elementwise_n_args("upsample_nearest", &mut a, n);
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        gamma: &CudaTensor,
        beta: &CudaTensor,
        eps: f32,
        n: usize,
        out: &mut CudaTensor,
    ) {
        if n == 0 {
            return;
        }
        self.xq_src.set(None);
        let mut a = Args::default()
            .a(x.buf.ptr)
            .a(gamma.buf.ptr)
            .a(beta.buf.ptr)
            .a(eps)
            .a(x.cols as i32)
            .a(out.buf.ptr);
        self.launch_rows("layer_norm", n, &mut a);
    }

    fn gelu(&self, x: &mut CudaTensor, n: usize) {
        let a = Args::default().a(x.buf.ptr);
        self.elementwise("gelu", a, n * x.cols);
    }

    fn attention_dense(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        s: DenseAttnShape,
        out: &mut CudaTensor,
    ) {
        if s.n_q == 0 {
            return;
        }
        // kernels/*.cu attn_dense_*: heads of 64 (every Whisper model); scores of a few
        // queries in shared memory (48 KiB). Others through the CPU backend.
        let few = s.n_q < DENSE_ROWS_MIN_QUERIES;
        if s.head_dim != 64 || (few && s.n_kv > 12 * 1024) || (s.causal && s.n_kv < s.n_q) {
            let (cq, ck, cv) = (self.to_cpu(q), self.to_cpu(k), self.to_cpu(v));
            let mut co = self.to_cpu(out);
            self.cpu.attention_dense(&cq, &ck, &cv, s, &mut co);
            return self.from_cpu(&co, out);
        }
        self.xq_src.set(None);
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let mut a = Args::default()
            .a(q.buf.ptr)
            .a(k.buf.ptr)
            .a(v.buf.ptr)
            .a(s.heads as i32)
            .a(s.n_q as i32)
            .a(s.n_kv as i32)
            .a(s.causal as i32)
            .a(scale)
            .a(out.buf.ptr);
        if few {
            self.dev.launch(
                self.dev.func("attn_dense_few"),
                (s.n_q as u32, s.heads as u32, 1),
                (1024, 1, 1),
                (4 * s.n_kv) as u32,
                &mut a.ptrs(),
            );
        } else {
            self.dev.launch(
                self.dev.func("attn_dense_rows"),
                (s.n_q.div_ceil(32) as u32, s.heads as u32, 1),
                (32, 1, 1),
                0,
                &mut a.ptrs(),
            );
        }
    }

    fn conv1d(
        &self,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
        x: &CudaTensor,
        t_in: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        out: &mut CudaTensor,
    ) -> usize {
        let c_in = x.cols;
        let t_out = (t_in + 2 * pad - kernel) / stride + 1;
        let cols_buf = ensure(
            &mut self.scratch.borrow_mut().im2col,
            t_out * c_in * kernel * 4,
        );
        let a = Args::default()
            .a(x.buf.ptr)
            .a(t_in as i32)
            .a(c_in as i32)
            .a(kernel as i32)
            .a(stride as i32)
            .a(pad as i32)
            .a(t_out as i32)
            .a(cols_buf);
        self.elementwise_n("im2col", a, t_out * c_in * kernel);
        let m = self.mats(&[(w, bias, &*out)]);
        self.matvec(
            m,
            (cols_buf, c_in * kernel),
            w.cols,
            t_out,
            None,
            MODE_STORE,
            None,
        );
        t_out
    }
}

impl CudaBackend {
    /// Positions `pos0..pos0 + n` of `cache` readied for the store that follows: outside a
    /// recording the blocks are taken here (a step's owner takes them before the step,
    /// [`LlmOps::kv_reserve`]: a recording cannot copy to the device, and a replay runs
    /// no host code).
    fn kv_ready(&self, cache: &mut CudaKvCache, pos0: usize, n: usize) {
        if cache.ready(pos0, n) {
            return;
        }
        assert!(
            !self.recording.get(),
            "KV cache positions {pos0}..{} not reserved before a recorded step",
            pos0 + n
        );
        cache
            .reserve(&self.dev, pos0, n)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A kernel that takes a row a block (256 threads) over `rows` rows.
    fn launch_rows(&self, name: &str, rows: usize, args: &mut Args) {
        self.dev.launch(
            self.dev.func(name),
            (rows as u32, 1, 1),
            (256, 1, 1),
            0,
            &mut args.ptrs(),
        );
    }

    /// The gated MLP's first half, out = act(Wg x) * (Wu x) (x RMS-normed with `norm` first,
    /// where given): one product launch for both matrices, `mode` naming the activation.
    #[allow(clippy::too_many_arguments)]
    fn gate_up(
        &self,
        gate: &CudaWeight,
        up: &CudaWeight,
        x: &CudaTensor,
        n: usize,
        norm: Option<(&CudaTensor, f32)>,
        out: &mut CudaTensor,
        mode: i32,
    ) {
        let m = self.mats(&[(gate, None, &*out), (up, None, &*out)]);
        self.matvec(m, (x.buf.ptr, x.cols), gate.cols, n, norm, mode, Some(0));
    }

    /// rms_norm: n rows of x (cols values) normalised, times w, into out.
    pub(crate) fn rms_norm_rows(&self, x: u64, w: u64, eps: f32, cols: usize, n: usize, out: u64) {
        let mut a = Args::default().a(x).a(w).a(eps).a(cols as i32).a(out);
        self.launch_rows("rms_norm", n, &mut a);
    }

    fn elementwise_n(&self, name: &str, mut args: Args, n: usize) {
        self.xq_src.set(None);
        let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
        self.dev.launch(
            self.dev.func(name),
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            &mut args.ptrs(),
        );
    }
}
