//! The wgpu device and the recording of work: adapter choice, pipelines, one command
//! encoder holding every dispatch until something is read back, per-dispatch parameters in
//! a uniform ring (dynamic offsets), bind groups cached by the buffers they name.

use std::cell::RefCell;
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

type PipelineKey = (&'static str, &'static str, [u32; 3]);

/// Override constants a module may declare: the weight formats its pipelines specialise on.
const CONSTS: [&str; 3] = ["FMT1", "FMT2", "FMT3"];

/// A device buffer with an id that is never reused (the bind group cache's key).
#[derive(Clone, Debug)]
pub struct Buf {
    pub b: wgpu::Buffer,
    pub id: u64,
    pub bytes: u64,
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
    /// Whether each matrix-vector workgroup normalises and quantizes its input itself (one
    /// dispatch per product) instead of reading activations a prep dispatch wrote. Default:
    /// on GPUs, not on CPU adapters (lavapipe), where the repeated prologue is real work.
    pub fused_prologue: Option<bool>,
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
    pass: Option<wgpu::ComputePass<'static>>,
    /// The pipeline the open pass has set (not set again for the next dispatch).
    pipeline: Option<PipelineKey>,
    /// Parameter slots of the recorded dispatches, written to the ring before submission.
    params: Vec<u8>,
    /// Token ids (little-endian u32) for the ids buffer.
    ids: Vec<u8>,
}

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub subgroups: bool,
    pub fused_prologue: bool,
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
}

impl Gpu {
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
        let subgroups = !opt.no_subgroups
            && std::env::var("KILN_WGPU_SUBGROUPS").map_or(true, |v| v != "0")
            && adapter.features().contains(wgpu::Features::SUBGROUP);
        let mut features = wgpu::Features::empty();
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
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
            .unwrap_or(info.device_type != wgpu::DeviceType::Cpu);
        Ok(Gpu {
            fused_prologue,
            max_binding: lim.max_storage_buffer_binding_size.min(lim.max_buffer_size),
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
                pass: None,
                pipeline: None,
                params: Vec::with_capacity(slot * RING_SLOTS),
                ids: Vec::with_capacity(4 * IDS_WORDS),
            }),
            readback: RefCell::new(None),
        })
    }

    /// A zeroed storage buffer of at least `bytes` (4 at least).
    pub fn buffer(&self, bytes: usize) -> Buf {
        let bytes = (bytes.max(4).div_ceil(4) * 4) as u64;
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Buf {
            b,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bytes,
        }
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
        let mut cv = [0u32; 3];
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
        assert!(p.len() <= PARAM_WORDS && bufs.len() <= MAX_BINDINGS);
        let pipe = self.pipeline(module, entry, bufs.len(), consts);
        if self.enc.borrow().params.len() + self.slot > self.slot * RING_SLOTS {
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
        let mut cv = [0u32; 3];
        cv[..consts.len()].copy_from_slice(consts);
        let same = e.pipeline == Some((module, entry, cv));
        e.pipeline = Some((module, entry, cv));
        let pass = e.pass.as_mut().unwrap();
        if !same {
            pass.set_pipeline(&pipe);
        }
        pass.set_bind_group(0, &bg, &[off as u32]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
    }

    /// Submits everything recorded (parameters and ids written first).
    pub fn flush(&self) {
        let mut e = self.enc.borrow_mut();
        e.pass = None;
        let Some(enc) = e.encoder.take() else {
            return;
        };
        if !e.params.is_empty() {
            self.queue.write_buffer(&self.ring, 0, &e.params);
        }
        if !e.ids.is_empty() {
            self.queue.write_buffer(&self.ids.b, 0, &e.ids);
        }
        e.params.clear();
        e.ids.clear();
        self.queue.submit([enc.finish()]);
    }

    /// Copies `bytes` from byte `offset` of `src` to the host, after all recorded work.
    pub fn read(&self, src: &Buf, offset: u64, out: &mut [u8]) {
        let bytes = out.len() as u64;
        if bytes == 0 {
            return;
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
            e.pass = None;
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
        let rb = rb.as_ref().unwrap();
        let slice = rb.slice(..size);
        let done = Arc::new(Mutex::new(None));
        let d2 = done.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            *d2.lock().unwrap() = Some(r.is_ok());
        });
        loop {
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .unwrap_or_else(|e| panic!("wgpu: waiting for the GPU failed: {e}"));
            if done.lock().unwrap().is_some() {
                break;
            }
        }
        assert_eq!(
            *done.lock().unwrap(),
            Some(true),
            "wgpu: mapping the readback failed"
        );
        {
            let view = slice
                .get_mapped_range()
                .unwrap_or_else(|e| panic!("wgpu: reading the readback failed: {e:?}"));
            out.copy_from_slice(&view[..out.len()]);
        }
        rb.unmap();
    }

    /// Waits for all submitted work.
    pub fn sync(&self) {
        self.flush();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}
