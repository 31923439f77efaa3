//! The device side: the CUDA context and stream, device buffers, the kernel module (compiled
//! by NVRTC once per source and architecture, the PTX cached on disk) and launches.

use std::cell::Cell;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaContext, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::{CompileOptions, Ptx};

use aot::SOURCE;

/// Why the CUDA backend could not start.
#[derive(Debug)]
pub struct CudaInitError(pub String);

impl std::fmt::Display for CudaInitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CudaInitError {}

fn init_err(what: &str, e: impl std::fmt::Debug) -> CudaInitError {
    CudaInitError(format!("CUDA: {what}: {e:?}"))
}

/// Eight bytes of page-locked host memory that the stream copies to ([`Device::read_back`])
/// and an event after the copy: a value read back while later work stays queued.
pub struct Readback {
    ptr: *mut u64,
    event: sys::CUevent,
}

impl Readback {
    pub fn new() -> Result<Readback, DriverError> {
        // Not write-combined: the host reads it. The event spins (no blocking-sync flag): a
        // decode step's token is waited for every ~0.5 ms.
        let ptr = unsafe { result::malloc_host(8, 0)? } as *mut u64;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .inspect_err(|_| unsafe {
                let _ = result::free_host(ptr as *mut c_void);
            })?;
        unsafe { ptr.write(0) };
        Ok(Readback { ptr, event })
    }

    /// The value of the last [`Device::read_back`], once its copy is done.
    pub fn wait(&self) -> u64 {
        unsafe { result::event::synchronize(self.event) }
            .unwrap_or_else(|e| panic!("CUDA: waiting for a copy from the device failed: {e:?}"));
        unsafe { self.ptr.read_volatile() }
    }
}

impl Drop for Readback {
    fn drop(&mut self) {
        unsafe {
            let _ = result::event::synchronize(self.event);
            let _ = result::event::destroy(self.event);
            let _ = result::free_host(self.ptr as *mut c_void);
        }
    }
}

/// Bytes of device memory, freed on drop.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DevBuf {
    pub fn alloc(bytes: usize) -> DevBuf {
        // A zero-byte allocation is an error in CUDA: keep one word so every buffer has an
        // address.
        let n = bytes.max(4);
        let ptr = unsafe { result::malloc_sync(n) }
            .unwrap_or_else(|e| panic!("CUDA: allocating {n} bytes of device memory: {e:?}"));
        DevBuf { ptr, bytes }
    }

    /// As [`DevBuf::alloc`], the driver's error returned instead of a panic.
    pub fn try_alloc(bytes: usize) -> Result<DevBuf, DriverError> {
        let ptr = unsafe { result::malloc_sync(bytes.max(4)) }?;
        Ok(DevBuf { ptr, bytes })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let Some(t) = &self.times else { return };
        eprintln!("CUDA host time per kind of call (KILN_CUDA_TIMES):");
        for (name, c) in [
            ("kernel launches", &t.launch),
            ("graph launches", &t.graph),
            ("copies to the device", &t.htod),
            ("  of them 1 MiB or more", &t.htod_big),
            ("copies from the device", &t.dtoh),
            ("waits after them", &t.sync),
            ("kernel lookups", &t.lookup),
            ("weights loaded", &t.weights),
            ("tensors made", &t.tensors),
        ] {
            let (n, ns) = c.get();
            eprintln!(
                "  {name:<24} {n:>9} calls {:>10.2} ms {:>8.2} us each",
                ns as f64 / 1e6,
                ns as f64 / 1e3 / n.max(1) as f64
            );
        }
        eprintln!(
            "  {:.1} MB copied to the device",
            t.htod_bytes.get() as f64 / 1e6
        );
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// Kernels whose dynamic shared memory passes the default 48 KiB bound, and what they take
/// (kernels/gemm.cu GM_SMEM).
pub(crate) const BIG_SMEM: &[(&str, u32)] = &[("gemm_f16_128", 4 * 256 * 40 * 2)];

/// The dynamic shared memory a kernel may take beyond the default 48 KiB: [`BIG_SMEM`]'s and
/// the tensor-core decode attention's (attention.rs decm_smem).
fn big_smem(name: &str) -> Option<u32> {
    BIG_SMEM
        .iter()
        .find(|k| k.0 == name)
        .map(|k| k.1)
        .or_else(|| crate::attention::decm_smem_of(name))
}

/// Every kernel the backend loads: [`KERNELS`], then the products' launch tables
/// (products.rs) and the decode attention's (attention.rs).
pub(crate) fn kernel_names() -> impl Iterator<Item = &'static str> {
    KERNELS
        .iter()
        .copied()
        .chain(crate::products::product_kernel_names())
        .chain(crate::attention::dec_kernel_names())
}

/// Kernel names of kernels/*.cu but the products' and the decode attention's
/// ([`kernel_names`]).
pub const KERNELS: &[&str] = &[
    "attn_flash_64",
    "attn_flash_128",
    "attn_flash2_64",
    "attn_flash2_128",
    "gemm_f16_64",
    "gemm_f16_128",
    "quant_act",
    "embed",
    "rms_norm",
    "add_rms_norm",
    "add_rms_norm_quant",
    "short_conv",
    "heads",
    "attn_split_1",
    "attn_split_2",
    "attn_split_3",
    "attn_split_4",
    "attn_split_5",
    "attn_split_6",
    "attn_split_7",
    "attn_split_8",
    "attn_combine_1",
    "attn_combine_2",
    "attn_combine_4",
    "attn_combine_8",
    "attn_q16",
    "attn_softmax_causal",
    "add",
    "silu_mul",
    "gelu_tanh_mul",
    "scale",
    "kv_store",
    "read_probe",
    "kv_gather",
    "im2col",
    "argmax",
    "feed_pick",
    "topk_chunks",
    "mask_row",
    "dequant_f16",
    "rows_f16",
    "layer_norm",
    "gelu",
    "embed_pos",
    "attn_dense_rows",
    "attn_dense_few",
    "add_bias",
    "im2col_nc",
    "fill_rows",
    "conv1d_direct",
    "col2im_t",
    "conv_t_direct",
    "norm_rows",
    "snake_rows",
    "leaky_relu",
    "gelu_tanh",
    "transpose_rows",
    "upsample_nearest",
    "range_keys",
    "fake_quant_u8",
];

/// Host time per kind of driver call (KILN_CUDA_TIMES=1, a `dev-switches` build), printed when the device is dropped:
/// where a decode step's host time goes.
#[derive(Default)]
pub struct HostTimes {
    /// (calls, nanoseconds): kernel launches, graph launches, copies to the device, copies
    /// from it (the call), waits for the stream after them.
    pub launch: Cell<(u64, u128)>,
    pub graph: Cell<(u64, u128)>,
    pub htod: Cell<(u64, u128)>,
    pub dtoh: Cell<(u64, u128)>,
    pub sync: Cell<(u64, u128)>,
    /// Kernels looked up at their first launch (CUDA's lazy loading loads each then), and
    /// weights packed and uploaded (load_weight, from its start to its wait).
    pub lookup: Cell<(u64, u128)>,
    pub weights: Cell<(u64, u128)>,
    /// Tensors made (an allocation and its zeroing).
    pub tensors: Cell<(u64, u128)>,
    /// Bytes copied to the device, and the copies of 1 MiB or more.
    pub htod_bytes: Cell<u64>,
    pub htod_big: Cell<(u64, u128)>,
}

impl HostTimes {
    pub fn add(&self, c: &Cell<(u64, u128)>, t0: Option<Instant>) {
        if let Some(t0) = t0 {
            let (n, ns) = c.get();
            c.set((n + 1, ns + t0.elapsed().as_nanos()));
        }
    }
}

pub struct Device {
    /// Some with KILN_CUDA_TIMES=1.
    pub times: Option<HostTimes>,
    /// The context (kept alive; cuBLAS's thread binds it).
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    /// kernel_names()' functions, each looked up at its first launch (under CUDA's lazy loading, a
    /// lookup loads the kernel: a process loads only those it runs).
    funcs: Vec<std::cell::OnceCell<sys::CUfunction>>,
    /// Each kernel's index in kernel_names().
    index: std::collections::HashMap<&'static str, usize>,
    pub num_sms: usize,
    /// Shared memory a multiprocessor holds (bytes).
    pub smem_per_sm: usize,
    /// The compute capability's major version (8 and up: mma.sync, cp.async, ldmatrix).
    pub major: i32,
    pub name: String,
    /// Kernels launched with programmatic stream serialization (sm_90+; KILN_CUDA_NO_PDL=1
    /// turns it off): each may start while the previous one finishes (kernels/*.cu pdl_*), a
    /// decode product loading its first weights into registers meanwhile. Measured on an
    /// H200 (Qwen3-0.6B shape, Q4_0, tg128): 1350 vs 1158 tok/s without.
    pub pdl: bool,
    /// Kernels never launched (KILN_CUDA_SKIP=name,prefix,...): for measuring what each
    /// kind costs inside a step by leaving it out. The results are garbage.
    pub skip: Vec<sys::CUfunction>,
}

/// Where compiled PTX is kept: `$KILN_HOME/cuda` (KILN_HOME defaults to ~/.cache/kiln).
fn cache_dir() -> Option<PathBuf> {
    let home = kiln_backend::options::value("KILN_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kiln")))?;
    Some(home.join("cuda"))
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn arch_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (m, _) if m >= 10 => "compute_90",
        (9, _) => "compute_90",
        (8, 9) => "compute_89",
        (8, 6..) => "compute_86",
        (8, _) => "compute_80",
        (7, 5..) => "compute_75",
        _ => "compute_70",
    }
}

impl Device {
    pub fn new(ordinal: usize) -> Result<Device, CudaInitError> {
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaInitError(
                "CUDA: the driver library (libcuda) is not installed on this machine".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| init_err("opening the device", e))?;
        ctx.bind_to_thread()
            .map_err(|e| init_err("making the context current", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| init_err("reading the compute capability", e))?;
        let num_sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| init_err("reading the multiprocessor count", e))? as usize;
        let smem_per_sm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )
            .map_err(|e| init_err("reading the shared memory a multiprocessor holds", e))?
            as usize;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let arch = arch_for(major, minor);
        let module = match aot_module(&ctx, major, minor) {
            Some(m) => m,
            None => ctx
                .load_module(load_or_compile(arch)?)
                .map_err(|e| init_err("loading the kernels", e))?,
        };
        let funcs = kernel_names().map(|_| Default::default()).collect();
        let stream = ctx
            .new_stream()
            .map_err(|e| init_err("creating a stream", e))?;
        let mut dev = Device {
            times: kiln_backend::options::dev_flag("KILN_CUDA_TIMES").then(HostTimes::default),
            ctx,
            stream,
            module,
            funcs,
            index: kernel_names().enumerate().map(|(i, k)| (k, i)).collect(),
            num_sms,
            smem_per_sm,
            major,
            pdl: major >= 9 && !kiln_backend::options::dev_flag("KILN_CUDA_NO_PDL"),
            skip: Vec::new(),
            name,
        };
        if let Some(v) = kiln_backend::options::dev_value("KILN_CUDA_SKIP") {
            // A name, or a prefix of names ("matvec" for them all).
            let names: Vec<&str> = v.split(',').collect();
            dev.skip = kernel_names()
                .filter(|k| names.iter().any(|n| k.starts_with(n)))
                .map(|k| dev.func(k))
                .collect();
        }
        Ok(dev)
    }

    pub fn func(&self, name: &str) -> sys::CUfunction {
        let i = *self.index.get(name).expect("kernel name");
        *self.funcs[i].get_or_init(|| {
            let t0 = self.t0();
            let f = self.module.load_function(name);
            if let Some(t) = &self.times {
                t.add(&t.lookup, t0);
            }
            // Every name of kernel_names() is a kernel of the module (device::tests::kernels_compile_with_nvrtc).
            let f = f
                .unwrap_or_else(|e| panic!("CUDA: loading kernel {name}: {e:?}"))
                .cu_function();
            if let Some(bytes) = big_smem(name) {
                let attr =
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                unsafe { sys::cuFuncSetAttribute(f, attr, bytes as i32) }
                    .result()
                    .unwrap_or_else(|e| {
                        panic!("CUDA: {name}'s {bytes} bytes of shared memory: {e:?}")
                    });
            }
            f
        })
    }

    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Launches `f` on the stream; `args` are pointers to each argument's value.
    pub fn launch(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &mut [*mut c_void],
    ) {
        if self.skip.contains(&f) {
            return;
        }
        let t0 = self.t0();
        if !self.pdl {
            unsafe { result::launch_kernel(f, grid, block, smem, self.cu_stream(), args) }
                .unwrap_or_else(|e| panic!("CUDA: kernel launch failed: {e:?}"));
            if let Some(t) = &self.times {
                t.add(&t.launch, t0);
            }
            return;
        }
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: smem,
            hStream: self.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        unsafe { sys::cuLaunchKernelEx(&cfg, f, args.as_mut_ptr(), std::ptr::null_mut()).result() }
            .unwrap_or_else(|e| panic!("CUDA: kernel launch failed: {e:?}"));
        if let Some(t) = &self.times {
            t.add(&t.launch, t0);
        }
    }

    pub fn htod<T: Copy>(&self, dst: sys::CUdeviceptr, src: &[T]) {
        if src.is_empty() {
            return;
        }
        // Pageable host memory: the call returns once the data is staged, so `src` may go.
        let t0 = self.t0();
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }
            .unwrap_or_else(|e| panic!("CUDA: copy to the device failed: {e:?}"));
        if let Some(t) = &self.times {
            t.add(&t.htod, t0);
            let bytes = std::mem::size_of_val(src);
            t.htod_bytes.set(t.htod_bytes.get() + bytes as u64);
            if bytes >= 1 << 20 {
                t.add(&t.htod_big, t0);
            }
        }
    }

    /// Now, when host times are kept.
    pub fn t0(&self) -> Option<Instant> {
        self.times.as_ref().map(|_| Instant::now())
    }

    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: sys::CUdeviceptr) {
        if dst.is_empty() {
            return;
        }
        let t0 = self.t0();
        let r = unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) };
        let t1 = self.t0();
        let r = r.and_then(|_| unsafe { result::stream::synchronize(self.cu_stream()) });
        if let Some(t) = &self.times {
            t.add(&t.dtoh, t0);
            t.add(&t.sync, t1);
        }
        r.unwrap_or_else(|e| panic!("CUDA: copy from the device failed: {e:?}"));
    }

    pub fn dtod(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize) {
        if bytes == 0 {
            return;
        }
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) }
            .unwrap_or_else(|e| panic!("CUDA: device copy failed: {e:?}"));
    }

    /// Queues a copy of the 8 bytes at `src` to `rb` and marks it, without waiting for
    /// it (or for the work queued before it): [`Readback::wait`] does.
    pub fn read_back(&self, rb: &Readback, src: sys::CUdeviceptr) {
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(rb.ptr as *mut c_void, src, 8, self.cu_stream()).result()
        }
        .and_then(|_| unsafe { result::event::record(rb.event, self.cu_stream()) })
        .unwrap_or_else(|e| panic!("CUDA: queueing a copy from the device failed: {e:?}"));
    }

    pub fn memset_u32(&self, dst: sys::CUdeviceptr, v: u32, n: usize) {
        unsafe { sys::cuMemsetD32Async(dst, v, n, self.cu_stream()).result() }
            .unwrap_or_else(|e| panic!("CUDA: memset failed: {e:?}"));
    }

    /// Whether everything queued on the stream has run (an error counts as done: the next
    /// synchronizing call reports it).
    pub fn idle(&self) -> bool {
        let r = unsafe { sys::cuStreamQuery(self.cu_stream()) };
        r != sys::cudaError_enum::CUDA_ERROR_NOT_READY
    }

    pub fn sync(&self) -> Result<(), DriverError> {
        unsafe { result::stream::synchronize(self.cu_stream()) }
    }
}

/// The kernels' source and those compiled when kiln was built (build.rs, `KILN_CUDA_ARCHS`).
mod aot {
    include!(concat!(env!("OUT_DIR"), "/aot.rs"));
}

/// The kernels built ahead of time for this GPU's architecture, where the build has them and
/// the driver takes them (else None: the run-time compile follows).
fn aot_module(ctx: &Arc<CudaContext>, major: i32, minor: i32) -> Option<Arc<CudaModule>> {
    let sm = format!("sm_{major}{minor}");
    let (_, image) = aot::AOT.iter().find(|(a, _)| *a == sm)?;
    match ctx.load_module(Ptx::from_binary(image.to_vec())) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("kiln's built-in CUDA kernels for {sm} did not load ({e:?}): compiling them");
            None
        }
    }
}

fn load_or_compile(arch: &'static str) -> Result<Ptx, CudaInitError> {
    let key = format!("kernels-{:016x}-{arch}.ptx", fnv1a(SOURCE));
    let cached = cache_dir().map(|d| d.join(&key));
    if let Some(p) = &cached {
        if let Ok(src) = std::fs::read_to_string(p) {
            return Ok(Ptx::from_src(src));
        }
    }
    // Tens of seconds, once per kiln version and GPU architecture: said, so a first run does
    // not look hung.
    let kept = match &cached {
        Some(p) => format!("kept in {}", p.parent().unwrap_or(p).display()),
        None => "not kept: no KILN_HOME or HOME".into(),
    };
    eprintln!("compiling kiln's CUDA kernels for {arch} (once; {kept}) ...");
    let t0 = std::time::Instant::now();
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| init_err("compiling the kernels with NVRTC", e))?;
    eprintln!("compiled in {:.1} s", t0.elapsed().as_secs_f64());
    if let Some(p) = &cached {
        // A cache that cannot be written only costs the next start a compile.
        let _ = std::fs::create_dir_all(p.parent().unwrap_or(p));
        let _ = std::fs::write(p, ptx.to_src());
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    /// The kernels compile for every architecture kiln targets, where NVRTC can be loaded
    /// (a GPU machine, or libnvrtc from the `nvidia-cuda-nvrtc` wheel on LD_LIBRARY_PATH).
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("libnvrtc not found: kernel compilation not checked");
            return;
        }
        for arch in ["compute_75", "compute_80", "compute_90"] {
            let opts = cudarc::nvrtc::CompileOptions {
                arch: Some(arch),
                options: vec!["--std=c++17".into()],
                ..Default::default()
            };
            let ptx = match cudarc::nvrtc::compile_ptx_with_opts(super::SOURCE, opts) {
                Ok(p) => p.to_src(),
                Err(e) => panic!("{arch}: {e:?}"),
            };
            // Every kernel the backend loads is there.
            for k in super::kernel_names() {
                assert!(
                    ptx.contains(&format!(".entry {k}(")),
                    "{arch}: no kernel {k}"
                );
            }
        }
        // And the PTX assembles for real GPUs: an instruction newer than the target (the
        // tensor-core kernels' mma.sync m16n8k16 and cp.async below sm_80) passes into PTX
        // unchecked and fails only in ptxas, or in the driver's JIT on the user's GPU.
        for arch in ["sm_75", "sm_80", "sm_90"] {
            assert!(
                !cubin(super::SOURCE, arch).is_empty(),
                "{arch}: an empty cubin"
            );
        }
    }

    // cubin(source, arch), as build.rs compiles the kernels built ahead of time.
    include!("cubin.rs");
}
