//! The wgpu device and the recording of work: adapter choice, pipelines, one command
//! encoder holding every dispatch until something is read back, per-dispatch parameters in
//! a uniform ring (dynamic offsets), bind groups cached by the buffers they name.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

/// Parameter words per dispatch (common.wgsl `Params`).
pub const PARAM_WORDS: usize = 32;
/// Dispatch parameter slots per submission.
const RING_SLOTS: usize = 4096;
/// Token ids per submission (the embedding's inputs).
const IDS_WORDS: usize = 1 << 16;
/// Storage buffers a dispatch binds at most.
pub const MAX_BINDINGS: usize = 11;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

type PipelineKey = (&'static str, &'static str, [u32; 5]);

/// Override constants a module may declare: the weight formats its pipelines specialise on,
/// rows a row group computes, lanes a Q4_0 block (matvec.wgsl).
const CONSTS: [&str; 5] = ["FMT1", "FMT2", "FMT3", "ROWS", "QL"];

/// A device buffer with an id that is never reused (the bind group cache's key).
#[derive(Clone, Debug)]
pub struct Buf {
    pub b: wgpu::Buffer,
    pub id: u64,
    pub bytes: u64,
    /// Whether the host maps it to read (`Gpu::unified`): a read then copies nothing on the
    /// GPU.
    pub mappable: bool,
}

/// Why there is no GPU to run on: one line.
#[derive(Debug)]
pub struct WgpuInitError(pub String);

impl std::fmt::Display for WgpuInitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no GPU adapter found (wgpu): {}", self.0)
    }
}

impl std::error::Error for WgpuInitError {}

/// Drives a future that wgpu's native backends resolve without waiting on anything else.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// Options of [`Gpu::new`].
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Only adapters whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Never use subgroup operations, even where the adapter has them.
    pub no_subgroups: bool,
    /// Read buffers through a staging copy even where memory is unified (`Gpu::unified`).
    pub no_unified: bool,
    /// Whether each matrix-vector workgroup normalises and quantizes its input itself (one
    /// dispatch per product) instead of reading activations a prep dispatch wrote. Default:
    /// on GPUs, not on CPU adapters (lavapipe), where the repeated prologue is real work.
    pub fused_prologue: Option<bool>,
    /// Bytes a weight's buffer holds at most (below the adapter's binding limit; tests use
    /// it to split small weights). Larger weights are held as several row ranges.
    pub max_binding: Option<u64>,
    /// Rows each row group of a matrix-vector product computes together (1, 2 or 4);
    /// default: chosen per product by its size (tests fix it to reach every variant).
    pub matvec_rows: Option<usize>,
    /// Whether prompt attention runs by tiles of tokens and keys through workgroup memory
    /// (attention.wgsl attn_tile) where the adapter has the memory and the head size fits,
    /// instead of a workgroup a token and chunk of keys (attn_split). Default: on GPUs, not
    /// on CPU adapters (lavapipe), where the tiles' barriers cost more than they save.
    pub tiled_attention: Option<bool>,
    /// Lanes that share a Q4_0 block in the matrix-vector products: 4 (each one word of
    /// nibbles, so that a subgroup's loads of a row are consecutive words) or 1 (a lane a
    /// whole block). Default: by the product's row length (`Gpu::q4_lanes`).
    pub q4_lanes: Option<u32>,
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL;
    wgpu::Instance::new(desc)
}

/// Every adapter of the Vulkan and Metal backends: (name, type, driver).
pub fn adapters() -> Vec<(String, String, String)> {
    block_on(instance().enumerate_adapters(wgpu::Backends::VULKAN | wgpu::Backends::METAL))
        .iter()
        .map(|a| {
            let i = a.get_info();
            (i.name, format!("{:?}", i.device_type), i.driver)
        })
        .collect()
}

struct Enc {
    encoder: Option<wgpu::CommandEncoder>,
    /// Dispatches recorded since the last submission.
    recorded: usize,
    pass: Option<wgpu::ComputePass<'static>>,
    /// The pipeline the open pass has set (not set again for the next dispatch).
    pipeline: Option<PipelineKey>,
    /// Parameter slots of the recorded dispatches, written to the ring before submission.
    params: Vec<u8>,
    /// Token ids (little-endian u32) for the ids buffer.
    ids: Vec<u8>,
}

/// Workgroup memory of attention.wgsl attn_tile (qt, kvt, pt).
const ATTN_TILE_BYTES: u32 = (2048 + 32 * 129 + 512) * 4;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub subgroups: bool,
    pub fused_prologue: bool,
    /// Rows each row group of a matrix-vector product computes together (1, 2 or 4;
    /// KILN_WGPU_MV_ROWS; 0: by the product's workgroups, `matvec_rows` in lib.rs).
    pub matvec_rows: usize,
    /// Workgroups a product keeps when rows are computed together (KILN_WGPU_MV_WGS).
    pub matvec_wgs: usize,
    /// Lanes a Q4_0 block in the matrix-vector products where fixed (GpuOptions::q4_lanes;
    /// KILN_WGPU_Q4_LANES=1/4 in a dev-switches build), else by the row length: four from
    /// `q4_cols` values a row (KILN_WGPU_Q4_COLS).
    pub q4_fixed: Option<u32>,
    pub q4_cols: usize,
    /// Longest input rows (at most shaders::MATVEC_MAXC) whose products run the fused
    /// prologue where `fused_prologue` is on (KILN_WGPU_FUSED_COLS); longer rows are
    /// prepared once (prep.wgsl) for every workgroup.
    pub fused_cols: usize,
    /// Fewest keys of a decode attention split (KILN_WGPU_DEC_MIN_KEYS).
    pub dec_min_keys: usize,
    /// One decode token's heads' work inside the attention dispatch (KILN_WGPU_NO_FUSED_HEADS
    /// turns it off).
    pub fused_heads: bool,
    /// Prompt attention by tiles (attention.wgsl attn_tile) where the adapter gives a
    /// workgroup its memory (GpuOptions::tiled_attention; KILN_WGPU_TILED_ATTN=0/1 in a
    /// dev-switches build).
    pub tiled_attn: bool,
    pub max_binding: u64,
    slot: usize,
    ring: wgpu::Buffer,
    pub ids: Buf,
    pub dummy: Buf,
    layouts: Vec<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    modules: RefCell<HashMap<&'static str, wgpu::ShaderModule>>,
    /// By (module, entry, the values of its override constants FMT1..FMT3).
    pipelines: RefCell<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    binds: RefCell<HashMap<[u64; MAX_BINDINGS + 1], wgpu::BindGroup>>,
    enc: RefCell<Enc>,
    readback: RefCell<Option<wgpu::Buffer>>,
    /// Memory the host and the GPU share (an integrated GPU, Apple silicon, a CPU driver)
    /// with storage buffers the host may map (`MAPPABLE_PRIMARY_BUFFERS`): buffers made by
    /// `buffer` are read where they lie, not through a copy to a staging buffer
    /// (KILN_WGPU_NO_UNIFIED=1 turns it off).
    pub unified: bool,
    /// Submit after this many dispatches (KILN_WGPU_FLUSH; 0: only when a result is read;
    /// default 32 on GPUs, 0 on CPU adapters),
    /// so the GPU starts on a step's first layers while the rest are still being recorded.
    flush_every: usize,
    /// KILN_WGPU_PROFILE=1: GPU time per kernel from timestamps around every dispatch, and
    /// host time per phase; printed when the device is dropped.
    prof: Option<RefCell<Profile>>,
    /// Dispatches recorded and the host time spent recording and submitting them, always
    /// kept (two clock reads a dispatch).
    counters: Cell<kiln_backend::HostCounters>,
}

/// Timestamps per submission in profile mode.
const PROF_QUERIES: u32 = 4096;

struct Profile {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    /// The kernel and grid of each timestamp of the open submission (timestamp i opens
    /// dispatch i).
    names: Vec<String>,
    /// Per kernel and grid: dispatches, nanoseconds from its start to the next one's.
    gpu: HashMap<String, (u64, f64)>,
    record_ns: u128,
    submit_ns: u128,
    wait_ns: u128,
    submits: u64,
}

impl Gpu {
    /// Whether prompt attention over heads of `head_dim` runs by tiles (attn_tile).
    pub fn tiled_attention(&self, head_dim: usize) -> bool {
        self.tiled_attn && head_dim <= 128 && head_dim % 8 == 0
    }

    pub fn new(opt: &GpuOptions) -> Result<Self, WgpuInitError> {
        let inst = instance();
        let mut list = block_on(inst.enumerate_adapters(wgpu::Backends::all()));
        let names: Vec<String> = list.iter().map(|a| a.get_info().name).collect();
        if let Some(want) = &opt.adapter {
            let w = want.to_lowercase();
            list.retain(|a| a.get_info().name.to_lowercase().contains(&w));
            if list.is_empty() {
                return Err(WgpuInitError(format!(
                    "no adapter's name contains '{want}' (adapters: {})",
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        }
        list.sort_by_key(|a| type_rank(a.get_info().device_type));
        let adapter = list.into_iter().next().ok_or_else(|| {
            WgpuInitError(
                "no Vulkan or Metal adapter (install a Vulkan driver; in CI: tools/setup-lavapipe.sh)"
                    .into(),
            )
        })?;
        let info = adapter.get_info();
        let lim = adapter.limits();
        if lim.max_compute_invocations_per_workgroup < 256 || lim.max_compute_workgroup_size_x < 256
        {
            return Err(WgpuInitError(format!(
                "adapter '{}' runs {} invocations per workgroup; kiln's kernels need 256",
                info.name, lim.max_compute_invocations_per_workgroup
            )));
        }
        if lim.max_storage_buffers_per_shader_stage < MAX_BINDINGS as u32 {
            return Err(WgpuInitError(format!(
                "adapter '{}' binds {} storage buffers per stage; kiln's kernels need {MAX_BINDINGS}",
                info.name, lim.max_storage_buffers_per_shader_stage
            )));
        }
        // (The kernels' subgroup variants take 8 consecutive lanes as a quantization
        // block's words.)
        let subgroups = !opt.no_subgroups
            && !kiln_backend::options::dev_flag("KILN_WGPU_NO_SUBGROUPS")
            && adapter.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size >= 8;
        let mut features = wgpu::Features::empty();
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        let unified = matches!(
            info.device_type,
            wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu
        ) && adapter
            .features()
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
            && !opt.no_unified
            && !kiln_backend::options::dev_flag("KILN_WGPU_NO_UNIFIED");
        if unified {
            features |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let timestamps = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let profile = kiln_backend::options::dev_flag("KILN_WGPU_PROFILE");
        if profile {
            if !adapter.features().contains(timestamps) {
                return Err(WgpuInitError(format!(
                    "KILN_WGPU_PROFILE=1: adapter '{}' has no timestamp queries inside passes",
                    info.name
                )));
            }
            features |= timestamps;
        }
        let (device, queue) = block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: lim.clone(),
            ..Default::default()
        }))
        .map_err(|e| WgpuInitError(format!("adapter '{}': {e}", info.name)))?;
        let slot = (lim.min_uniform_buffer_offset_alignment as usize).max(4 * PARAM_WORDS);
        let ring = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (slot * RING_SLOTS) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mk = |bytes: u64, label| {
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            Buf {
                b,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                bytes,
                mappable: false,
            }
        };
        let ids = mk((IDS_WORDS * 4) as u64, "ids");
        let dummy = mk(16, "dummy");
        let layouts = (0..=MAX_BINDINGS)
            .map(|n| {
                let mut entries = vec![wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: wgpu::BufferSize::new((4 * PARAM_WORDS) as u64),
                    },
                    count: None,
                }];
                for i in 0..n {
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: 1 + i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: false },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    });
                }
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: None,
                    entries: &entries,
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: None,
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: 0,
                });
                (bgl, pl)
            })
            .collect();
        let fused_prologue = opt
            .fused_prologue
            .or(kiln_backend::options::dev_parsed::<u8>("KILN_WGPU_FUSED").map(|v| v == 1))
            .unwrap_or(info.device_type != wgpu::DeviceType::Cpu);
        let prof = profile.then(|| {
            let bytes = 8 * PROF_QUERIES as u64;
            RefCell::new(Profile {
                queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: PROF_QUERIES,
                }),
                resolve: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile resolve"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                read: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile read"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                names: Vec::new(),
                gpu: HashMap::new(),
                record_ns: 0,
                submit_ns: 0,
                wait_ns: 0,
                submits: 0,
            })
        });
        // Measured on an H200 (Qwen3-0.6B Q4_0 tg128): whole steps 382 t/s, every 16
        // dispatches 418, 32: 423, 64: 415. A CPU adapter (lavapipe) gains nothing from
        // overlap, only more submissions.
        let flush_every = kiln_backend::options::dev_parsed("KILN_WGPU_FLUSH").unwrap_or(
            if info.device_type == wgpu::DeviceType::Cpu {
                0
            } else {
                32
            },
        );
        let matvec_rows = match opt
            .matvec_rows
            .or_else(|| kiln_backend::options::dev_parsed("KILN_WGPU_MV_ROWS"))
        {
            Some(k @ (1 | 2 | 4)) => k,
            _ => 0,
        };
        let matvec_wgs = kiln_backend::options::dev_parsed("KILN_WGPU_MV_WGS").unwrap_or(256);
        let q4_fixed = opt
            .q4_lanes
            .or_else(|| kiln_backend::options::dev_parsed("KILN_WGPU_Q4_LANES"))
            .map(|l| if l == 1 { 1 } else { 4 });
        Ok(Gpu {
            fused_prologue,
            matvec_rows,
            matvec_wgs,
            q4_fixed,
            q4_cols: kiln_backend::options::dev_parsed("KILN_WGPU_Q4_COLS").unwrap_or(2560),
            fused_heads: !kiln_backend::options::dev_flag("KILN_WGPU_NO_FUSED_HEADS"),
            tiled_attn: lim.max_compute_workgroup_storage_size >= ATTN_TILE_BYTES
                && opt
                    .tiled_attention
                    .or(
                        kiln_backend::options::dev_parsed::<u8>("KILN_WGPU_TILED_ATTN")
                            .map(|v| v == 1),
                    )
                    .unwrap_or(info.device_type != wgpu::DeviceType::Cpu),
            fused_cols: kiln_backend::options::dev_parsed("KILN_WGPU_FUSED_COLS")
                .unwrap_or(2048)
                .min(crate::shaders::MATVEC_MAXC),
            dec_min_keys: kiln_backend::options::dev_parsed("KILN_WGPU_DEC_MIN_KEYS")
                .unwrap_or(crate::DEC_MIN_KEYS)
                .max(1),
            max_binding: lim
                .max_storage_buffer_binding_size
                .min(lim.max_buffer_size)
                .min(opt.max_binding.unwrap_or(u64::MAX)),
            device,
            queue,
            info,
            subgroups,
            slot,
            ring,
            ids,
            dummy,
            layouts,
            modules: RefCell::default(),
            pipelines: RefCell::default(),
            binds: RefCell::default(),
            enc: RefCell::new(Enc {
                encoder: None,
                recorded: 0,
                pass: None,
                pipeline: None,
                params: Vec::with_capacity(slot * RING_SLOTS),
                ids: Vec::with_capacity(4 * IDS_WORDS),
            }),
            readback: RefCell::new(None),
            unified,
            flush_every,
            prof,
            counters: Cell::default(),
        })
    }

    /// A zeroed storage buffer of at least `bytes` (4 at least); one the host maps to read
    /// where memory is unified.
    pub fn buffer(&self, bytes: usize) -> Buf {
        let bytes = (bytes.max(4).div_ceil(4) * 4) as u64;
        let mut usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        if self.unified {
            usage |= wgpu::BufferUsages::MAP_READ;
        }
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage,
            mapped_at_creation: false,
        });
        Buf {
            b,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bytes,
            mappable: self.unified,
        }
    }

    /// Drops buffers and the cached bind groups that hold them, so that their memory goes
    /// back now rather than when the bind-group cache is next cleared (work already
    /// recorded keeps what it uses alive until it has run).
    pub fn drop_buffers(&self, bufs: impl IntoIterator<Item = Buf>) {
        let ids: Vec<u64> = bufs.into_iter().map(|b| b.id).collect();
        self.binds
            .borrow_mut()
            .retain(|key, _| !key[1..].iter().any(|k| ids.contains(k)));
    }

    /// A storage buffer holding `data` (padded with zeros to a word).
    pub fn buffer_init(&self, data: &[u8]) -> Buf {
        let mut v;
        let data = if data.len() % 4 != 0 || data.is_empty() {
            v = data.to_vec();
            v.resize(data.len().max(4).div_ceil(4) * 4, 0);
            &v[..]
        } else {
            data
        };
        let b = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: data,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            });
        Buf {
            b,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bytes: data.len() as u64,
            mappable: false,
        }
    }

    /// Writes `data` at byte `offset` of `buf` after all work recorded so far.
    pub fn write(&self, buf: &Buf, offset: u64, data: &[u8]) {
        self.flush();
        self.queue.write_buffer(&buf.b, offset, data);
    }

    fn pipeline(
        &self,
        module: &'static str,
        entry: &'static str,
        n: usize,
        consts: &[u32],
    ) -> wgpu::ComputePipeline {
        let mut cv = [0u32; CONSTS.len()];
        cv[..consts.len()].copy_from_slice(consts);
        let key = (module, entry, cv);
        if let Some(p) = self.pipelines.borrow().get(&key) {
            return p.clone();
        }
        let mut mods = self.modules.borrow_mut();
        let m = mods.entry(module).or_insert_with(|| {
            let src = crate::shaders::source(module, self.subgroups);
            self.device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(module),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                })
        });
        let constants: Vec<(&str, f64)> = CONSTS
            .iter()
            .zip(consts)
            .map(|(k, &v)| (*k, v as f64))
            .collect();
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&self.layouts[n].1),
                module: m,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        self.pipelines.borrow_mut().insert(key, p.clone());
        p
    }

    /// Appends token ids for the next submission; returns their word offset in `self.ids`.
    pub fn push_ids(&self, ids: &[u32]) -> u32 {
        assert!(
            ids.len() <= IDS_WORDS,
            "{} token ids in one call",
            ids.len()
        );
        if self.enc.borrow().ids.len() / 4 + ids.len() > IDS_WORDS {
            self.flush();
        }
        let mut e = self.enc.borrow_mut();
        let off = (e.ids.len() / 4) as u32;
        for id in ids {
            e.ids.extend_from_slice(&id.to_le_bytes());
        }
        off
    }

    /// Records one dispatch of `module::entry` over `groups` workgroups with parameters `p`
    /// and storage buffers `bufs` (bindings 1..).
    pub fn dispatch(
        &self,
        module: &'static str,
        entry: &'static str,
        p: &[u32],
        bufs: &[&Buf],
        groups: (u32, u32, u32),
    ) {
        self.dispatch_with(module, entry, &[], p, bufs, groups)
    }

    /// Lanes a Q4_0 block in the matrix-vector products over rows of `cols` values
    /// (matvec.wgsl's QL). Four lanes a block make a subgroup's loads of a row consecutive
    /// words, but a row of few blocks then takes several steps one after the other: on an
    /// H100 through Vulkan (tg128, every product at four lanes against every product at one)
    /// Qwen3-4B gained 10% and Llama-3.2-3B 5%, whose rows are 2560 values and longer, and
    /// Qwen3-0.6B lost 5%, whose rows are mostly 1024; so rows shorter than `q4_cols` keep a
    /// lane a block.
    pub fn q4_lanes(&self, cols: usize) -> u32 {
        self.q4_fixed
            .unwrap_or(if cols >= self.q4_cols { 4 } else { 1 })
    }

    /// `dispatch` of the pipeline specialised on `consts` (the module's FMT1.. overrides).
    pub fn dispatch_with(
        &self,
        module: &'static str,
        entry: &'static str,
        consts: &[u32],
        p: &[u32],
        bufs: &[&Buf],
        groups: (u32, u32, u32),
    ) {
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return;
        }
        let t_rec = std::time::Instant::now();
        let t0 = self.prof.as_ref().map(|_| t_rec);
        assert!(p.len() <= PARAM_WORDS && bufs.len() <= MAX_BINDINGS);
        let pipe = self.pipeline(module, entry, bufs.len(), consts);
        let full = self
            .prof
            .as_ref()
            .is_some_and(|pr| pr.borrow().names.len() + 1 >= PROF_QUERIES as usize);
        if full || self.enc.borrow().params.len() + self.slot > self.slot * RING_SLOTS {
            self.flush();
        }
        let mut key = [0u64; MAX_BINDINGS + 1];
        key[0] = bufs.len() as u64;
        for (k, b) in key[1..].iter_mut().zip(bufs) {
            *k = b.id;
        }
        let bg = {
            let mut binds = self.binds.borrow_mut();
            if binds.len() > 8192 {
                binds.clear();
            }
            binds
                .entry(key)
                .or_insert_with(|| {
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &self.ring,
                            offset: 0,
                            size: wgpu::BufferSize::new((4 * PARAM_WORDS) as u64),
                        }),
                    }];
                    for (i, b) in bufs.iter().enumerate() {
                        entries.push(wgpu::BindGroupEntry {
                            binding: 1 + i as u32,
                            resource: b.b.as_entire_binding(),
                        });
                    }
                    self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &self.layouts[bufs.len()].0,
                        entries: &entries,
                    })
                })
                .clone()
        };
        let mut e = self.enc.borrow_mut();
        let off = e.params.len();
        for &w in p {
            e.params.extend_from_slice(&w.to_le_bytes());
        }
        e.params.resize(off + self.slot, 0);
        if e.encoder.is_none() {
            e.encoder = Some(self.device.create_command_encoder(&Default::default()));
        }
        if e.pass.is_none() {
            let pass = e
                .encoder
                .as_mut()
                .unwrap()
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            e.pass = Some(pass);
            e.pipeline = None;
        }
        let mut cv = [0u32; CONSTS.len()];
        cv[..consts.len()].copy_from_slice(consts);
        let same = e.pipeline == Some((module, entry, cv));
        e.pipeline = Some((module, entry, cv));
        let pass = e.pass.as_mut().unwrap();
        if !same {
            pass.set_pipeline(&pipe);
        }
        pass.set_bind_group(0, &bg, &[off as u32]);
        if let Some(pr) = &self.prof {
            let mut pr = pr.borrow_mut();
            pass.write_timestamp(&pr.queries, pr.names.len() as u32);
            let name = format!("{entry} {}x{}x{}", groups.0, groups.1, groups.2);
            pr.names.push(name);
        }
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        e.recorded += 1;
        let flush = self.flush_every > 0 && e.recorded >= self.flush_every;
        drop(e);
        if let (Some(pr), Some(t0)) = (&self.prof, t0) {
            pr.borrow_mut().record_ns += t0.elapsed().as_nanos();
        }
        let mut c = self.counters.get();
        c.dispatches += 1;
        c.record_ns += t_rec.elapsed().as_nanos() as u64;
        self.counters.set(c);
        if flush {
            self.flush();
        }
    }

    /// Dispatches recorded and host time spent on them since the device was made.
    pub fn counters(&self) -> kiln_backend::HostCounters {
        self.counters.get()
    }

    /// Ends the open compute pass (in profile mode after a last timestamp, which closes the
    /// last dispatch's interval).
    fn end_pass(&self, e: &mut Enc) {
        if let (Some(pass), Some(pr)) = (e.pass.as_mut(), &self.prof) {
            let pr = pr.borrow();
            pass.write_timestamp(&pr.queries, pr.names.len() as u32);
        }
        e.pass = None;
    }

    /// Submits everything recorded (parameters and ids written first).
    pub fn flush(&self) {
        let t0 = std::time::Instant::now();
        let mut e = self.enc.borrow_mut();
        self.end_pass(&mut e);
        e.recorded = 0;
        let Some(mut enc) = e.encoder.take() else {
            return;
        };
        let timed = self.prof.as_ref().and_then(|pr| {
            let pr = pr.borrow();
            let n = pr.names.len() as u32;
            (n > 0).then(|| {
                enc.resolve_query_set(&pr.queries, 0..n + 1, &pr.resolve, 0);
                enc.copy_buffer_to_buffer(&pr.resolve, 0, &pr.read, 0, 8 * (n as u64 + 1));
                n
            })
        });
        if !e.params.is_empty() {
            self.queue.write_buffer(&self.ring, 0, &e.params);
        }
        if !e.ids.is_empty() {
            self.queue.write_buffer(&self.ids.b, 0, &e.ids);
        }
        e.params.clear();
        e.ids.clear();
        self.queue.submit([enc.finish()]);
        drop(e);
        let mut c = self.counters.get();
        c.submit_ns += t0.elapsed().as_nanos() as u64;
        self.counters.set(c);
        if let Some(pr) = &self.prof {
            let submit = t0.elapsed().as_nanos();
            let mut pr = pr.borrow_mut();
            pr.submit_ns += submit;
            pr.submits += 1;
            if let Some(n) = timed {
                // Profile mode waits for each submission to read its timestamps.
                let slice = pr.read.slice(..8 * (n as u64 + 1));
                slice.map_async(wgpu::MapMode::Read, |_| {});
                let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
                let ticks: Vec<u64> = slice
                    .get_mapped_range()
                    .map(|v| {
                        v.chunks_exact(8)
                            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                            .collect()
                    })
                    .unwrap_or_default();
                pr.read.unmap();
                let period = self.queue.get_timestamp_period() as f64;
                let names = std::mem::take(&mut pr.names);
                for (i, name) in names.into_iter().enumerate() {
                    if let (Some(a), Some(b)) = (ticks.get(i), ticks.get(i + 1)) {
                        let g = pr.gpu.entry(name).or_default();
                        g.0 += 1;
                        g.1 += b.saturating_sub(*a) as f64 * period;
                    }
                }
            }
        }
    }

    /// Copies `bytes` from byte `offset` of `src` to the host, after all recorded work:
    /// through a staging buffer, or where `src` lies when the host maps it.
    pub fn read(&self, src: &Buf, offset: u64, out: &mut [u8]) {
        let bytes = out.len() as u64;
        if bytes == 0 {
            return;
        }
        if src.mappable {
            // A mapping starts at a multiple of 8 (wgpu::MAP_ALIGNMENT) and spans words.
            let start = offset / 8 * 8;
            let end = (offset + bytes).div_ceil(4) * 4;
            self.flush();
            return self.map_read(&src.b, start..end, (offset - start) as usize, out);
        }
        let size = bytes.div_ceil(4) * 4;
        {
            let mut rb = self.readback.borrow_mut();
            if rb.as_ref().is_none_or(|b| b.size() < size) {
                *rb = Some(self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: size.max(1 << 16),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
            }
            let mut e = self.enc.borrow_mut();
            self.end_pass(&mut e);
            if e.encoder.is_none() {
                e.encoder = Some(self.device.create_command_encoder(&Default::default()));
            }
            e.encoder.as_mut().unwrap().copy_buffer_to_buffer(
                &src.b,
                offset,
                rb.as_ref().unwrap(),
                0,
                size,
            );
        }
        self.flush();
        let rb = self.readback.borrow();
        self.map_read(rb.as_ref().unwrap(), 0..size, 0, out);
    }

    /// Maps `range` of `buf` once the submitted work is done and copies `out.len()` bytes
    /// from `skip` bytes into it.
    fn map_read(
        &self,
        buf: &wgpu::Buffer,
        range: std::ops::Range<u64>,
        skip: usize,
        out: &mut [u8],
    ) {
        let slice = buf.slice(range);
        let done = Arc::new(Mutex::new(None));
        let d2 = done.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            *d2.lock().unwrap() = Some(r.is_ok());
        });
        let t0 = std::time::Instant::now();
        loop {
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .unwrap_or_else(|e| panic!("wgpu: waiting for the GPU failed: {e}"));
            if done.lock().unwrap().is_some() {
                break;
            }
        }
        if let Some(pr) = &self.prof {
            pr.borrow_mut().wait_ns += t0.elapsed().as_nanos();
        }
        assert_eq!(
            *done.lock().unwrap(),
            Some(true),
            "wgpu: mapping a buffer to read failed"
        );
        {
            let view = slice
                .get_mapped_range()
                .unwrap_or_else(|e| panic!("wgpu: reading a mapped buffer failed: {e:?}"));
            out.copy_from_slice(&view[skip..skip + out.len()]);
        }
        buf.unmap();
    }

    /// Waits for all submitted work.
    pub fn sync(&self) {
        self.flush();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}

impl Drop for Gpu {
    /// Profile mode's report: GPU time per kernel (largest first) and host time per phase.
    fn drop(&mut self) {
        let Some(pr) = &self.prof else { return };
        let pr = pr.borrow();
        let mut rows: Vec<_> = pr.gpu.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        eprintln!(
            "wgpu profile ({}): GPU time per kernel, start to next start",
            self.info.name
        );
        for (name, (n, ns)) in rows {
            eprintln!(
                "  {name:<36} {n:>8} dispatches {:>10.2} ms {:>8.2} us each {:>5.1}%",
                ns / 1e6,
                ns / 1e3 / *n as f64,
                100.0 * ns / total.max(1.0)
            );
        }
        eprintln!(
            "  host: recording {:.2} ms, submitting {:.2} ms ({} submissions), waiting for reads {:.2} ms",
            pr.record_ns as f64 / 1e6,
            pr.submit_ns as f64 / 1e6,
            pr.submits,
            pr.wait_ns as f64 / 1e6
        );
    }
}
