//! What every launch needs around the kernels: boxed kernel arguments, the scratch buffers
//! sized on demand (and the generation counter that tells recorded graphs they moved), the
//! recorded graphs, cuBLAS's handle, and the tuning overrides.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::attention::SeqDesc;
use crate::device::DevBuf;

/// Kernel arguments: each value boxed so its address is stable until the launch.
#[derive(Default)]
pub(crate) struct Args(pub(crate) Vec<Box<dyn Any>>);

impl Args {
    pub(crate) fn a<T: 'static>(mut self, v: T) -> Self {
        self.0.push(Box::new(v));
        self
    }
    pub(crate) fn ptrs(&mut self) -> Vec<*mut c_void> {
        self.0
            .iter_mut()
            .map(|b| (&mut **b) as *mut dyn Any as *mut c_void)
            .collect()
    }
}

/// Buffers sized on demand (outside graph recording: a step runs eagerly once first).
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) w16: Option<DevBuf>,
    pub(crate) x16: Option<DevBuf>,
    pub(crate) tmp: Option<DevBuf>,
    pub(crate) attn_acc: Option<DevBuf>,
    pub(crate) attn_ml: Option<DevBuf>,
    pub(crate) argmax: Option<DevBuf>,
    /// A grammar's token mask (`mask_row`).
    pub(crate) mask: Option<DevBuf>,
    pub(crate) topk: Option<DevBuf>,
    /// The candidates' keys on the host, kept from token to token.
    pub(crate) topk_keys: Vec<u64>,
    pub(crate) im2col: Option<DevBuf>,
    /// fake_quant_u8's range (two order-preserving keys).
    pub(crate) range: Option<DevBuf>,
    pub(crate) xq: Option<DevBuf>,
    /// The other activation buffer: a decode product writing its output quantized reads
    /// its input from one and writes the other.
    pub(crate) xq2: Option<DevBuf>,
    /// A batched decode step's sequences (kernels/*.cu SeqDesc) on the device, and what it
    /// holds, so an unchanged table is not sent again.
    pub(crate) seq_table: Option<DevBuf>,
    pub(crate) seq_table_host: Vec<SeqDesc>,
    /// A prompt's keys and values of one layer gathered from the cache's blocks.
    pub(crate) kv_gather: Option<DevBuf>,
}

/// Bumped whenever a scratch buffer (or the RoPE table) is reallocated: a recorded step holds
/// the old addresses, so `TensorOps::step` drops every recording made before.
pub(crate) static SCRATCH_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn scratch_moved() {
    SCRATCH_GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn ensure(slot: &mut Option<DevBuf>, bytes: usize) -> u64 {
    if slot.as_ref().is_none_or(|b| b.bytes < bytes) {
        *slot = Some(DevBuf::alloc(bytes));
        scratch_moved();
    }
    slot.as_ref().unwrap().ptr
}

pub(crate) struct Graph {
    pub(crate) exec: sys::CUgraphExec,
    pub(crate) graph: sys::CUgraph,
}

impl Drop for Graph {
    fn drop(&mut self) {
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Tuning overrides (`dev-switches` builds), read from the environment once: KILN_CUDA_KW (warps a row: 1, 2, 4, 8)
/// and KILN_CUDA_NR (rows a warp group: 1, 2), KILN_CUDA_NO_PROMPT_GEMM, KILN_CUDA_DEC_BPS,
/// KILN_CUDA_DEC_ROWS, KILN_CUDA_DEC_KW, KILN_CUDA_DEC_GU, KILN_CUDA_DEC_FIXED,
/// KILN_CUDA_FLASH_PROMPT, KILN_CUDA_COMBINE_GROUPS.
#[derive(Default)]
pub(crate) struct Tune {
    pub(crate) kw: Option<usize>,
    pub(crate) nr: Option<usize>,
    /// Prompt attention through cuBLAS (KILN_CUDA_NO_PROMPT_GEMM=1: the split kernel instead).
    pub(crate) prompt_gemm: bool,
    /// Prompt attention in one pass over the cache (head sizes 64 and 128, sm_80 and later):
    /// by default in the second form (attn_flash2_*, split over the keys); KILN_CUDA_FLASH_PROMPT
    /// 0 never (cuBLAS products over gathered keys), 1 the first form, 2 the second.
    pub(crate) flash_prompt: Option<usize>,
    /// Splits of the second form (KILN_CUDA_FLASH_SPLITS, 1-64; by default sized to the GPU).
    pub(crate) flash_splits: Option<usize>,
    /// Decode attention blocks a multiprocessor (KILN_CUDA_DEC_BPS, 1-16).
    pub(crate) dec_blocks_per_sm: Option<usize>,
    /// Decode attention over f16 caches on the tensor cores where the shape and the GPU allow
    /// (attention.rs decm; KILN_CUDA_NO_DEC_MMA=1: the CUDA-core kernels everywhere).
    pub(crate) dec_mma: bool,
    /// Rows a warp of one-token decode products without a quantized output
    /// (KILN_CUDA_DEC_ROWS: 1 or 4).
    pub(crate) dec_rows: Option<usize>,
    /// Warps a row of decode products (KILN_CUDA_DEC_KW: 1 or 2).
    pub(crate) dec_kw: Option<usize>,
    /// One token's gate/up pairs in three blocks a multiprocessor (KILN_CUDA_DEC_GU: 0 never,
    /// 1 always).
    pub(crate) dec_gu: Option<usize>,
    /// One token's four-row products in the kernels fixed to their mode (KILN_CUDA_DEC_FIXED:
    /// 0 never, 1 always; by default for the formats whose run-time-mode kernel spills).
    pub(crate) dec_fixed: Option<usize>,
    /// Keys a decode token takes in one split, its block writing the rows itself with no
    /// combine after it (attention.rs DEC_ONE_SPLIT; KILN_CUDA_ONE_SPLIT, 0: never).
    pub(crate) one_split: usize,
    /// Thread groups of a decode attention combine block (KILN_CUDA_COMBINE_GROUPS: 1, 2,
    /// 4, 8).
    pub(crate) combine_groups: Option<usize>,
    /// Block products on kiln's own kernel even where cuBLAS is loaded
    /// (KILN_CUDA_OWN_GEMM=1), for comparing the two.
    pub(crate) own_gemm: bool,
}

impl Tune {
    pub(crate) fn from_env() -> Tune {
        let env = kiln_backend::options::dev_parsed::<usize>;
        Tune {
            kw: env("KILN_CUDA_KW").filter(|k| [1, 2, 4, 8].contains(k)),
            nr: env("KILN_CUDA_NR").filter(|n| [1, 2].contains(n)),
            prompt_gemm: !kiln_backend::options::dev_flag("KILN_CUDA_NO_PROMPT_GEMM"),
            flash_prompt: env("KILN_CUDA_FLASH_PROMPT").filter(|n| [0, 1, 2].contains(n)),
            flash_splits: env("KILN_CUDA_FLASH_SPLITS").filter(|n| (1..=64).contains(n)),
            dec_blocks_per_sm: env("KILN_CUDA_DEC_BPS").filter(|n| (1..=16).contains(n)),
            dec_mma: !kiln_backend::options::dev_flag("KILN_CUDA_NO_DEC_MMA"),
            dec_rows: env("KILN_CUDA_DEC_ROWS").filter(|n| [1, 4].contains(n)),
            dec_kw: env("KILN_CUDA_DEC_KW").filter(|n| [1, 2].contains(n)),
            dec_gu: env("KILN_CUDA_DEC_GU").filter(|n| [0, 1].contains(n)),
            dec_fixed: env("KILN_CUDA_DEC_FIXED").filter(|n| [0, 1].contains(n)),
            one_split: env("KILN_CUDA_ONE_SPLIT")
                .filter(|&n| n <= 4096)
                .unwrap_or(crate::attention::DEC_ONE_SPLIT),
            combine_groups: env("KILN_CUDA_COMBINE_GROUPS").filter(|n| [1, 2, 4, 8].contains(n)),
            own_gemm: kiln_backend::options::dev_flag("KILN_CUDA_OWN_GEMM"),
        }
    }
}

pub(crate) struct Blas(pub(crate) cudarc::cublas::sys::cublasHandle_t);

// A handle is used by one thread at a time: made on the thread that starts it, then used and
// destroyed by the backend's.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        unsafe {
            let _ = cudarc::cublas::result::destroy_handle(self.0);
        }
    }
}

/// When cuBLAS (the library, ~0.25 s to load and set up) comes up for a backend. Prompt-sized
/// products of f16-path weights run on kiln's own tensor-core kernel where it is not loaded
/// (kernels/gemm.cu); f32 weights' products and Kokoro's convolutions then take kiln's
/// slower non-tensor-core kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlasStart {
    /// From the backend's start, loading beside the driver's context (LLMs: any prompt of
    /// more than 64 tokens runs through it).
    #[default]
    Early,
    /// When a weight whose smaller side is [`BLAS_MIN_SIDE`] or more is loaded, or at the
    /// first block product if that needs it (f32 weights); not after a first block product
    /// went without it. A small model (Whisper tiny and base, f16 or quantized) never loads it.
    OnDemand,
    /// Never (tests of kiln's own kernels).
    Never,
}

/// The smaller side of a matrix from which, under [`BlasStart::OnDemand`], cuBLAS is loaded
/// for its products (Whisper small's 768 and up).
pub const BLAS_MIN_SIDE: usize = 768;

/// cuBLAS, brought up on a thread of its own: its libraries load (from the backend's start,
/// or when a weight asks: [`BlasStart`]) while other work goes on; its handle is made once the
/// context is there; the first prompt-sized product or convolution waits for it. None where
/// libcublas is missing or it was never started.
pub(crate) struct LazyBlas {
    pending: RefCell<Option<std::thread::JoinHandle<Option<Blas>>>>,
    ready: std::cell::OnceCell<Option<Blas>>,
    /// To the thread until the handle is taken (dropped: the thread finishes).
    tell: RefCell<Option<std::sync::mpsc::Sender<BlasMsg>>>,
    start: BlasStart,
    /// The context and stream, kept for a thread started later (BlasStart::OnDemand).
    target: RefCell<Option<(Arc<CudaContext>, usize)>>,
    /// Weights that want products soon were loaded (told to a thread started later too).
    warm: std::cell::Cell<bool>,
}

/// What the cuBLAS thread is told: the context and the stream to queue on; to warm the
/// library up (a model whose weights will run block products soon). Its channel closing says
/// that the handle is wanted now.
enum BlasMsg {
    Target(Arc<CudaContext>, usize),
    Warm,
}

/// out (column-major, m x n, ldc apart) = w^T x (+ beta out) through cuBLAS: w holds m rows
/// and x n rows of k f16 values each, sums in f32 (the block products of products.rs, and the
/// warm-up, which must pick the same kind of kernel).
///
/// # Safety
/// `h` is a live handle; the pointers are device buffers of those shapes.
pub(crate) unsafe fn blas_gemm_f16(
    h: cudarc::cublas::sys::cublasHandle_t,
    (m, n, k): (usize, usize, usize),
    w: u64,
    x: u64,
    beta: f32,
    (out, ldc): (u64, usize),
) -> Result<(), cudarc::cublas::result::CublasError> {
    use cudarc::cublas::sys as cb;
    let alpha = 1f32;
    cudarc::cublas::result::gemm_ex(
        h,
        cb::cublasOperation_t::CUBLAS_OP_T,
        cb::cublasOperation_t::CUBLAS_OP_N,
        m as i32,
        n as i32,
        k as i32,
        &alpha as *const f32 as *const c_void,
        w as *const c_void,
        cb::cudaDataType_t::CUDA_R_16F,
        k as i32,
        x as *const c_void,
        cb::cudaDataType_t::CUDA_R_16F,
        k as i32,
        &beta as *const f32 as *const c_void,
        out as *mut c_void,
        cb::cudaDataType_t::CUDA_R_32F,
        ldc as i32,
        cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    )
}

/// One small f16 product on a stream of the thread's own, waited for: cuBLAS's first product
/// in a process sets up the library (tens of milliseconds, measured on an H200 as the gap
/// between a cold first encoder window and a warm one) and this moves that set-up beside the
/// model's load. The kernels a real shape picks still load at its first use.
fn warm_up(h: cudarc::cublas::sys::cublasHandle_t) -> Option<()> {
    const N: usize = 256;
    let a = DevBuf::try_alloc(N * N * 2).ok()?;
    let c = DevBuf::try_alloc(N * N * 4).ok()?;
    let mut s: sys::CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    unsafe { sys::cuStreamCreate(&mut s, flags) }
        .result()
        .ok()?;
    let beta = 0f32;
    // Zeros for operands (fresh device memory holds anything); the products' own call.
    let ran = unsafe {
        cudarc::cublas::result::set_stream(h, s as _).is_ok()
            && sys::cuMemsetD8Async(a.ptr, 0, N * N * 2, s)
                .result()
                .is_ok()
            && blas_gemm_f16(h, (N, N, N), a.ptr, a.ptr, beta, (c.ptr, N)).is_ok()
    };
    // The stream goes whatever happened (the caller sets the handle's stream again).
    unsafe {
        let _ = sys::cuStreamSynchronize(s);
        let _ = sys::cuStreamDestroy_v2(s);
    }
    ran.then_some(())
}

impl LazyBlas {
    /// Under [`BlasStart::Early`], starts loading the libraries now, before there is a
    /// context; the handle is made once [`LazyBlas::target`] names the context.
    pub(crate) fn new(start: BlasStart) -> LazyBlas {
        let b = LazyBlas {
            pending: RefCell::new(None),
            ready: Default::default(),
            tell: RefCell::new(None),
            start,
            target: RefCell::new(None),
            warm: Default::default(),
        };
        if start == BlasStart::Early {
            b.spawn();
        }
        b
    }

    /// The thread that loads the libraries and makes the handle.
    fn spawn(&self) {
        let (tx, rx) = std::sync::mpsc::channel::<BlasMsg>();
        let none = kiln_backend::options::dev_flag("KILN_CUDA_NO_BLAS");
        // KILN_CUDA_NO_BLAS_WARM=1 (dev-switches): no warm-up, for measuring what it gains.
        let warm_off = kiln_backend::options::dev_flag("KILN_CUDA_NO_BLAS_WARM");
        let make = move || {
            // dlopen of libcublas (and libcublasLt, which it needs), while the caller goes on.
            if none || !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return None;
            }
            let mut warm = false;
            let (ctx, stream) = loop {
                match rx.recv().ok()? {
                    BlasMsg::Target(ctx, stream) => break (ctx, stream),
                    BlasMsg::Warm => warm = true,
                }
            };
            ctx.bind_to_thread().ok()?;
            let h = cudarc::cublas::result::create_handle().ok()?;
            let blas = Blas(h);
            let mut warmed = false;
            loop {
                if warm && !warmed && !warm_off {
                    // A failed warm-up leaves a handle that works as well, only colder.
                    let _ = warm_up(h);
                    warmed = true;
                }
                match rx.recv() {
                    Ok(BlasMsg::Warm) => warm = true,
                    Ok(BlasMsg::Target(..)) => {}
                    Err(_) => break,
                }
            }
            unsafe { cudarc::cublas::result::set_stream(h, stream as _) }.ok()?;
            Some(blas)
        };
        *self.pending.borrow_mut() = std::thread::Builder::new()
            .name("kiln-cublas".into())
            .spawn(make)
            .ok();
        *self.tell.borrow_mut() = Some(tx);
        if let Some((ctx, stream)) = self.target.borrow().clone() {
            self.tell(BlasMsg::Target(ctx, stream));
        }
        if self.warm.get() {
            self.tell(BlasMsg::Warm);
        }
    }

    /// Products that want cuBLAS are coming: under [`BlasStart::OnDemand`] its thread starts
    /// now (unless a block product already went without it).
    pub(crate) fn want(&self) {
        if self.start == BlasStart::OnDemand
            && self.ready.get().is_none()
            && self.pending.borrow().is_none()
        {
            self.spawn();
        }
    }

    /// Started: loading, or done (with or without a handle).
    pub(crate) fn started(&self) -> bool {
        self.pending.borrow().is_some() || self.ready.get().is_some_and(|b| b.is_some())
    }

    fn tell(&self, m: BlasMsg) {
        if let Some(tx) = self.tell.borrow().as_ref() {
            // A thread that has ended (no libcublas) makes no handle: nothing to tell.
            let _ = tx.send(m);
        }
    }

    /// The context, and the stream whose work cuBLAS queues on.
    pub(crate) fn target(&self, ctx: Arc<CudaContext>, stream: sys::CUstream) {
        *self.target.borrow_mut() = Some((ctx.clone(), stream as usize));
        self.tell(BlasMsg::Target(ctx, stream as usize));
    }

    /// Block products come soon (weights marked `prefer_batches`): cuBLAS's first-product
    /// set-up is done on its thread now, beside the rest of the load.
    pub(crate) fn warm(&self) {
        self.warm.set(true);
        self.tell(BlasMsg::Warm);
    }

    /// Lets the thread end on its own (it makes no handle without a context).
    pub(crate) fn detach(self) {
        drop(self.tell.borrow_mut().take());
        drop(self.pending.borrow_mut().take());
    }

    /// The handle, once made (None: no cuBLAS on this machine, or not started: from then on
    /// none for this backend).
    pub(crate) fn get(&self) -> Option<&Blas> {
        self.ready
            .get_or_init(|| {
                drop(self.tell.borrow_mut().take());
                let pending = self.pending.borrow_mut().take();
                pending.and_then(|t| t.join().ok().flatten())
            })
            .as_ref()
    }

    pub(crate) fn is_some(&self) -> bool {
        self.get().is_some()
    }
}

impl Drop for LazyBlas {
    fn drop(&mut self) {
        // A handle still being made is waited for, so that it is destroyed before the context.
        drop(self.tell.get_mut().take());
        if let Some(t) = self.pending.get_mut().take() {
            drop(t.join());
        }
    }
}
