//! kiln's portable GPU backend: `wgpu` over Vulkan (Linux, Windows, Android; Mesa's
//! lavapipe in CI) and Metal (Apple), kernels in WGSL (src/shaders/, one file per op
//! family, mirroring kiln-cuda's kernels).
//!
//! What runs on the GPU: the whole LLM path — embedding lookup, matrix-vector products for
//! F32, F16, Q4_0, Q4_1, Q8_0, Q4_K and Q6_K (other formats widened to f32 at load) with
//! the RMSNorm and the int8 quantization of their input (the CPU backend's blocks) in each
//! workgroup's prologue (rows up to 2048 values; longer ones by a `prep` dispatch), a tiled
//! GEMM for prompts, per-head q/k norm + RoPE + KV-cache store (inside the attention for one
//! decode token), split-K attention over an f16 (or f32) KV cache, SwiGLU, residual adds
//! done by the producing product, greedy argmax. A decode layer is 5 to 9 dispatches (q/k/v
//! products; attention with the heads' work (+ a combine of its splits); output product +
//! residual; gate/up + SwiGLU; down product + residual; a `prep` before each product over
//! long rows). Pipelines of the products are specialised on the weight formats and on the
//! rows a row group computes (override constants). Work is submitted every 32 dispatches on
//! GPUs (device.rs `flush_every`), else when a result is read; a step is read back as one
//! argmax (or its logits). Weights are uploaded once; scratch buffers are sized on first use
//! and kept.
//!
//! Subgroup operations are used where the adapter has them (`Features::SUBGROUP`; a row
//! group of a product is then one subgroup), else sums go through workgroup memory. The KV cache
//! holds f16 through `pack2x16float`, core WGSL, so no adapter needs `SHADER_F16`.
//!
//! Whisper runs on the GPU (speech.wgsl: layer norm, GELU, dense attention; conv1d as
//! im2col + the matrix product), and so do Kokoro's signal ops (signal.wgsl: convolutions,
//! transposed ones, the uint8 rounding, STFT and its inverse, LSTM recurrences; speech.wgsl:
//! the norms and activations).

mod device;
mod kv;
pub mod pack;
mod parts;
pub mod shaders;
mod signal;
mod speech;

use std::cell::RefCell;

use kiln_backend::cpu::{CpuBackend, CpuTensor};
use kiln_backend::window::WindowSlots;
use kiln_backend::{
    AttnShape, BackendError, KvType, KvWindow, LlmOps, RopeConfig, RopeStyle, SeqKv, TensorOps,
    WeightData,
};

pub use device::{adapters, GpuOptions, WgpuInitError};
use device::{Buf, Gpu};
pub use kv::WgpuKvCache;
use pack::{FMT_F16, FMT_F32};

/// Tokens from which a product runs as the tiled GEMM instead of matrix-vector products.
const GEMM_MIN_TOKENS: usize = 16;
/// Keys per attention workgroup (attention.wgsl CH).
const ATT_CHUNK: usize = 256;
/// Tokens per workgroup of the tiled prompt attention (attention.wgsl TQ).
pub(crate) const ATT_TILE_TOKENS: usize = 16;
/// Tokens up to which attention runs as decode attention (attention.wgsl attn_dec); its
/// most splits of a head's keys, and its fewest keys per split (short contexts still give
/// a GPU's multiprocessors heads x splits workgroups).
const DEC_MAX_TOKENS: usize = 4;
const DEC_SPLITS: usize = 16;
pub(crate) const DEC_MIN_KEYS: usize = 16;
/// Columns per workgroup of greedy sampling's first pass (misc.wgsl argmax).
const ARGMAX_CHUNK: usize = 4096;
/// Product modes (matvec.wgsl).
const MODE_STORE: u32 = 0;
const MODE_ADD: u32 = 1;
const MODE_SILU_MUL: u32 = 2;
const MODE_GATE_UP: u32 = 3;
const MODE_THREE: u32 = 4;
/// Elementwise ops (misc.wgsl).
const OP_ADD: u32 = 0;
const OP_SILU_MUL: u32 = 1;
const OP_SCALE: u32 = 2;
const OP_GELU_TANH_MUL: u32 = 3;

/// One product of [`WgpuBackend::products`]: (weight, SwiGLU's up matrix, bias, out, mode).
type Product<'a> = (
    &'a WgpuWeight,
    Option<&'a WgpuWeight>,
    Option<&'a WgpuTensor>,
    &'a WgpuTensor,
    u32,
);

pub struct WgpuTensor {
    buf: Buf,
    rows: usize,
    cols: usize,
}

pub struct WgpuWeight {
    buf: Buf,
    fmt: u32,
    rw: usize,
    rows: usize,
    cols: usize,
    stored_bytes: usize,
    /// Where the matrix is more than the adapter binds at once (a large vocabulary's
    /// embedding on a 128 MiB limit): its row ranges in order, each a weight of its own in
    /// its own buffer (`buf` then holds the first part's rows). Empty otherwise.
    parts: Vec<WgpuWeight>,
}

/// What attn_dec needs to do one token's heads' work itself: the token's k and v rows (as
/// the products wrote them), the q and k norm weights and epsilon, the rotation.
#[derive(Clone, Copy)]
struct DecHeads<'a> {
    k: &'a WgpuTensor,
    v: &'a WgpuTensor,
    qk_norm: Option<(&'a WgpuTensor, &'a WgpuTensor, f32)>,
    rope: &'a RopeConfig,
}

/// Buffers sized on first use and kept (grown only when a larger call comes).
#[derive(Default)]
struct Scratch {
    act: Option<Buf>,
    /// A split weight's part products (`products_split`), and its bias rows.
    part: Option<Buf>,
    part_bias: Option<Buf>,
    /// The up half of a split SwiGLU pair.
    part_up: Option<Buf>,
    attn: Option<Buf>,
    argmax: Option<Buf>,
    /// Whisper's im2col rows; a transposed convolution's product (signal.rs).
    im2col: Option<Buf>,
    /// fake_quant_u8's scale and zero point, and its chunks' ranges.
    range: Option<Buf>,
    range_parts: Option<Buf>,
    /// A bidirectional LSTM's c and h between dispatches.
    lstm: Option<Buf>,
    /// The STFT's cos / sin / window table by n_fft.
    dft: Vec<(usize, Buf)>,
    /// cos/sin per (position, pair) by RoPE config, for `positions` positions (Gemma 3's
    /// layers alternate two configs: one table would be rebuilt at every layer).
    rope: Vec<(RopeConfig, usize, Buf)>,
}

fn ensure(gpu: &Gpu, slot: &mut Option<Buf>, bytes: usize) -> Buf {
    if slot.as_ref().is_none_or(|b| (b.bytes as usize) < bytes) {
        *slot = Some(gpu.buffer(bytes));
    }
    slot.clone().unwrap()
}

fn f(v: f32) -> u32 {
    v.to_bits()
}

/// Workgroups for `n` items of 256 as a 2-D grid (x at most 65535).
fn grid_1d(n: usize) -> (u32, u32, u32) {
    let wgs = n.div_ceil(256).max(1);
    let x = wgs.min(65535);
    (x as u32, wgs.div_ceil(x) as u32, 1)
}

/// Whether the attention shaders run this shape (query heads a whole multiple of the KV
/// heads; head sizes even, at most 256).
pub fn attention_supported(heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), String> {
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(format!("{heads} query heads over {kv_heads} KV heads"));
    }
    if head_dim == 0 || head_dim % 2 != 0 || head_dim > 256 {
        return Err(format!("head size {head_dim} (even, at most 256)"));
    }
    Ok(())
}

pub struct WgpuBackend {
    gpu: Gpu,
    scratch: RefCell<Scratch>,
    cpu: CpuBackend,
    kv: kv::KvBudget,
}

/// prep.wgsl's workgroups a row of `cols` values.
fn prep_tiles(cols: usize) -> u32 {
    cols.div_ceil(1024) as u32
}

/// Rows each row group of a matrix-vector product computes together (1, 2 or 4) for a
/// product of `rows` rows at `g` row groups a workgroup: `fixed` where set, else the most
/// that still leaves `wgs` workgroups (four rows: 4 x `wgs`). Rows computed together share
/// each activation block and keep more loads in flight, but fewer workgroups fill fewer
/// multiprocessors (H200, Vulkan: Qwen3-4B's 9728-row pair gains at 2, Qwen3-0.6B's
/// 1024-row products lose; the output heads gain at 4).
fn matvec_rows(rows: usize, g: usize, fixed: usize, wgs: usize) -> usize {
    if fixed > 0 {
        return fixed;
    }
    let groups = |k: usize| rows.div_ceil(g * k);
    if groups(4) >= 4 * wgs {
        4
    } else if groups(2) >= wgs {
        2
    } else {
        1
    }
}

impl WgpuBackend {
    /// The best adapter (discrete > integrated > CPU). Errors (one line) when there is none.
    pub fn new() -> Result<Self, WgpuInitError> {
        Self::with_options(&GpuOptions::default())
    }

    pub fn with_options(opt: &GpuOptions) -> Result<Self, WgpuInitError> {
        Ok(WgpuBackend {
            gpu: Gpu::new(opt)?,
            scratch: RefCell::default(),
            kv: Default::default(),
            cpu: CpuBackend::new(kiln_backend::cpu::default_threads()),
        })
    }

    /// Whether the kernels use subgroup operations on this adapter.
    pub fn subgroups(&self) -> bool {
        self.gpu.subgroups
    }

    /// Whether the host reads buffers where they lie, memory being unified
    /// (GpuOptions::no_unified).
    pub fn unified_memory(&self) -> bool {
        self.gpu.unified
    }

    /// Whether products run the fused matvec prologue (GpuOptions::fused_prologue).
    pub fn fused_prologue(&self) -> bool {
        self.gpu.fused_prologue
    }

    /// Whether prompt attention runs by tiles where heads fit (GpuOptions::tiled_attention).
    pub fn tiled_attention(&self) -> bool {
        self.gpu.tiled_attn
    }

    /// Whether the adapter's memory is the host's (integrated GPUs, Apple's unified memory,
    /// CPU adapters such as lavapipe).
    pub fn shares_host_memory(&self) -> bool {
        matches!(
            self.gpu.info.device_type,
            wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu
        )
    }

    /// The adapter's name and driver.
    pub fn adapter(&self) -> String {
        let i = &self.gpu.info;
        format!("{} ({:?}, {})", i.name, i.device_type, i.driver)
    }

    /// Waits for all recorded work.
    pub fn synchronize(&self) {
        self.gpu.sync();
    }

    /// Row groups per matvec workgroup the host counts on (the fewest the adapter may run).
    fn groups(&self) -> usize {
        match self.gpu.subgroups {
            true => (256 / self.gpu.info.subgroup_max_size.max(1) as usize).max(1),
            false => 8,
        }
    }

    /// Products of one input: for each (weight, bias, out, mode), out (n, rows) = mode(W x)
    /// with x (n, cols) RMS-normalised first when `norm` is given; `up` (MODE_GATE_UP)
    /// is the second matrix of SwiGLU. Up to GEMM_MIN_TOKENS tokens and MATVEC_MAXC
    /// columns, each matrix-vector workgroup normalises and quantizes x itself; otherwise
    /// the activations are prepared once (prep.wgsl) for every product.
    fn products(
        &self,
        list: &[Product<'_>],
        x: &WgpuTensor,
        n: usize,
        norm: Option<(&WgpuTensor, f32)>,
    ) {
        if n == 0 || list.is_empty() {
            return;
        }
        let split = |w: &WgpuWeight| !w.parts.is_empty();
        if list.iter().any(|l| split(l.0) || l.1.is_some_and(split)) {
            for &l in list {
                if split(l.0) || l.1.is_some_and(split) {
                    self.products_split(l, x, n, norm);
                } else {
                    self.products(&[l], x, n, norm);
                }
            }
            return;
        }
        let cols = list[0].0.cols;
        let all = || list.iter().flat_map(|l| std::iter::once(l.0).chain(l.1));
        assert!(
            all().all(|w| w.cols == cols) && x.cols >= cols,
            "products of {} columns over activations of {}",
            cols,
            x.cols
        );
        let float = |w: &WgpuWeight| w.fmt == FMT_F32 || w.fmt == FMT_F16;
        let write_q = all().any(|w| !float(w)) && cols % 32 == 0;
        let write_f = all().any(float);
        let nw = norm.map_or(&self.gpu.dummy, |(w, _)| &w.buf);
        let eps = f(norm.map_or(0.0, |(_, e)| e));
        let flags = (norm.is_some() as u32) << 1 | (write_q as u32) << 2;
        // Matrix-vector dispatches: the three products of matmul3 in one, else one each.
        let three = list.len() == 3 && list.iter().all(|l| l.1.is_none() && l.4 == MODE_STORE);
        let batches = list.chunks(if three { 3 } else { 1 });
        let g = self.groups();
        let matvec = |module: &'static str, xb: &Buf, nwb: &Buf, offs: [usize; 3]| {
            for batch in batches.clone() {
                let (w, w2, _, out, mode) = batch[0];
                let mode = if batch.len() == 3 { MODE_THREE } else { mode };
                let rows: usize = batch.iter().map(|e| e.0.rows).sum();
                let mut k = matvec_rows(rows, g, self.gpu.matvec_rows, self.gpu.matvec_wgs);
                // MODE_THREE's matrices start on a multiple of it.
                while k > 1 && batch.len() == 3 && batch.iter().any(|e| e.0.rows % k != 0) {
                    k /= 2;
                }
                let wgs = rows.div_ceil(g * k);
                let per = wgs.div_ceil(65535).max(1);
                let e = |i: usize| batch.get(i).copied().unwrap_or(batch[0]);
                let second = w2.unwrap_or(e(1).0);
                let mut bias_bits = 0;
                for (i, en) in batch.iter().enumerate() {
                    bias_bits |= (en.2.is_some() as u32) << i;
                }
                let mut p = [0u32; 32];
                p[..23].copy_from_slice(&[
                    rows as u32,
                    cols as u32,
                    w.fmt,
                    w.rw as u32,
                    mode,
                    flags,
                    per as u32,
                    g as u32,
                    offs[0] as u32,
                    offs[1] as u32,
                    offs[2] as u32,
                    out.cols as u32,
                    second.fmt,
                    second.rw as u32,
                    x.cols as u32,
                    eps,
                    e(2).0.fmt,
                    e(2).0.rw as u32,
                    e(1).3.cols as u32,
                    e(2).3.cols as u32,
                    w.rows as u32,
                    (w.rows + e(1).0.rows) as u32,
                    bias_bits,
                ]);
                let d = &self.gpu.dummy;
                let bias = |i: usize| batch.get(i).and_then(|e| e.2).map_or(d, |b| &b.buf);
                let out_i = |i: usize| batch.get(i).map_or(d, |e| &e.3.buf);
                let bufs = [
                    &w.buf,
                    &second.buf,
                    xb,
                    nwb,
                    &out.buf,
                    bias(0),
                    &e(2).0.buf,
                    out_i(1),
                    out_i(2),
                    bias(1),
                    bias(2),
                ];
                let grid = (wgs.div_ceil(per) as u32, n as u32, 1);
                let consts = [
                    w.fmt,
                    second.fmt,
                    e(2).0.fmt,
                    k as u32,
                    self.gpu.q4_lanes(cols),
                ];
                self.gpu
                    .dispatch_with(module, "matvec", &consts, &p[..23], &bufs, grid);
            }
        };
        if self.gpu.fused_prologue && n < GEMM_MIN_TOKENS && cols <= self.gpu.fused_cols {
            matvec("matvec", &x.buf, nw, [0; 3]);
            return;
        }
        let nb = cols / 32;
        let q_words = if write_q { n * cols / 4 } else { 0 };
        let d_off = q_words;
        let s_off = d_off + if write_q { n * nb } else { 0 };
        let f_off = s_off + if write_q { n * nb } else { 0 };
        let total = f_off + if write_f { n * cols } else { 0 };
        let act = ensure(&self.gpu, &mut self.scratch.borrow_mut().act, total * 4);
        self.gpu.dispatch(
            "prep",
            "prep",
            &[
                cols as u32,
                eps,
                norm.is_some() as u32,
                write_q as u32,
                0,
                x.cols as u32,
                f_off as u32,
                cols as u32,
                d_off as u32,
                s_off as u32,
                write_f as u32,
            ],
            &[&x.buf, nw, &act, &act],
            (prep_tiles(cols), n as u32, 1),
        );
        for &(w, w2, bias, out, mode) in list {
            let b = bias.map_or(&self.gpu.dummy, |b| &b.buf);
            if n >= GEMM_MIN_TOKENS {
                // SwiGLU as two passes: gate stored, then out = silu(out) * up.
                let passes: &[(&WgpuWeight, u32)] = match (mode, w2) {
                    (MODE_GATE_UP, Some(up)) => &[(w, MODE_STORE), (up, MODE_SILU_MUL)],
                    _ => &[(w, mode)],
                };
                for &(w, mode) in passes {
                    let p = [
                        w.rows as u32,
                        cols as u32,
                        w.fmt,
                        w.rw as u32,
                        mode,
                        bias.is_some() as u32,
                        n as u32,
                        0,
                        d_off as u32,
                        s_off as u32,
                        f_off as u32,
                        out.cols as u32,
                        0,
                    ];
                    self.gpu.dispatch_with(
                        "gemm",
                        "gemm",
                        &[w.fmt],
                        &p,
                        &[&w.buf, &act, &out.buf, b],
                        (w.rows.div_ceil(64) as u32, n.div_ceil(64) as u32, 1),
                    );
                }
            }
        }
        if n < GEMM_MIN_TOKENS {
            matvec("matvec_g", &act, &self.gpu.dummy, [d_off, s_off, f_off]);
        }
    }

    /// The cos/sin table of `rope` for at least `positions` positions.
    fn rope_table(&self, rope: &RopeConfig, positions: usize) -> Buf {
        let mut sc = self.scratch.borrow_mut();
        if let Some((_, _, b)) = sc
            .rope
            .iter()
            .find(|(c, p, _)| c == rope && *p >= positions)
        {
            return b.clone();
        }
        let positions = positions.max(4096).next_power_of_two();
        let inv = rope.inv_freqs();
        let mut v = Vec::with_capacity(positions * inv.len() * 2);
        for pos in 0..positions {
            // As the CPU backend: the f32 angle, f32 sin and cos.
            for &fr in &inv {
                let (s, c) = (pos as f32 * fr).sin_cos();
                v.push(c);
                v.push(s);
            }
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let b = self.gpu.buffer_init(&bytes);
        sc.rope.retain(|(c, _, _)| c != rope);
        if sc.rope.len() >= 4 {
            sc.rope.remove(0);
        }
        sc.rope.push((rope.clone(), positions, b.clone()));
        b
    }

    /// Per-head work (heads.wgsl) over up to three groups: q (`q`, its heads, norm, rope),
    /// and, when given, k and v (`kv`: k, v, kv heads, k's norm, the cache, its layer and
    /// the slot shift). A single group may store into a cache (`cache0`: buffer, plane,
    /// slots, f16).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn heads(
        &self,
        q: (&WgpuTensor, usize, Option<(&WgpuTensor, f32)>, bool),
        kv: Option<(
            &WgpuTensor,
            &WgpuTensor,
            usize,
            Option<&WgpuTensor>,
            &WgpuKvCache,
            (usize, usize),
        )>,
        cache0: Option<(&Buf, usize, usize, bool)>,
        head_dim: usize,
        rope: Option<&RopeConfig>,
        pos0: usize,
        n: usize,
    ) {
        assert!(head_dim <= 256, "head size {head_dim} > 256");
        let (x, nq, qnorm, qrope) = q;
        // The table covers the cache's positions from the first call on.
        let positions = kv.map_or(pos0 + n, |k| k.4.n_ctx.max(pos0 + n));
        let table = rope.map(|r| self.rope_table(r, positions));
        let (dims, neox) = rope.map_or((0, 0), |r| (r.dims, (r.style == RopeStyle::Neox) as u32));
        let d = &self.gpu.dummy;
        let eps = qnorm.map_or(0.0, |(_, e)| e);
        let mut norm_flags = qnorm.is_some() as u32;
        let rope_bit = rope.is_some() as u32;
        let mut rope_flags = (qrope as u32) & rope_bit;
        let mut cache_flags = cache0.is_some() as u32;
        let (mut plane, mut slots, mut f16) = cache0.map_or((0, 0, false), |c| (c.1, c.2, c.3));
        let (mut kb, mut vb, mut knb, mut kcb, mut vcb) = (d, d, d, cache0.map_or(d, |c| c.0), d);
        let (mut nkv, mut kv_ld, mut shift) = (0, 0, 0);
        if let Some((k, v, kvh, kn, cache, (layer, sh))) = kv {
            shift = sh;
            (kb, vb, nkv, kv_ld) = (&k.buf, &v.buf, kvh, k.cols);
            if let Some(kn) = kn {
                knb = &kn.buf;
                norm_flags |= 2;
            }
            rope_flags |= 2 * rope_bit;
            cache_flags |= 2 | 4;
            (kcb, vcb) = cache.bufs(layer);
            (plane, slots, f16) = (cache.plane(layer), cache.slots, cache.f16);
        }
        let p = [
            nq as u32,
            nkv as u32,
            head_dim as u32,
            f(eps),
            norm_flags,
            rope_flags,
            cache_flags,
            dims as u32,
            neox,
            pos0 as u32,
            slots as u32,
            plane as u32,
            f16 as u32,
            x.cols as u32,
            kv_ld as u32,
            shift as u32,
        ];
        let qn = qnorm.map_or(d, |(w, _)| &w.buf);
        let tb = table.as_ref().unwrap_or(d);
        self.gpu.dispatch(
            "heads",
            "heads",
            &p,
            &[&x.buf, qn, kcb, tb, kb, vb, knb, vcb],
            ((nq + 2 * nkv) as u32, n as u32, 1),
        );
    }

    fn elementwise(&self, a: &Buf, b: &Buf, op: u32, s: f32, n: usize) {
        if n == 0 {
            return;
        }
        self.gpu.dispatch(
            "misc",
            "elementwise",
            &[n as u32, op, f(s), 0, 0],
            &[a, b],
            grid_1d(n),
        );
    }

    /// speech.wgsl `norm_rows` over `rows` rows of `cols` of `x` in place: `mode` 0 layer norm
    /// (times `g` and plus `b` as `flags` say), 1 AdaIN by channel rows, 2 AdaLN by time rows
    /// (`g` the style's gammas then betas).
    #[allow(clippy::too_many_arguments)]
    fn norm_rows(
        &self,
        x: &mut WgpuTensor,
        g: &Buf,
        b: &Buf,
        (rows, cols): (usize, usize),
        eps: f32,
        mode: u32,
        flags: [u32; 2],
    ) {
        if rows == 0 || cols == 0 {
            return;
        }
        let groups = (rows.min(65535) as u32, rows.div_ceil(65535) as u32, 1);
        let p = [rows as u32, cols as u32, f(eps), mode, flags[0], flags[1]];
        let d = &self.gpu.dummy;
        self.gpu
            .dispatch("speech", "norm_rows", &p, &[&x.buf, g, b, d], groups);
    }

    /// Copies `n` words from word `so` of `src` to word `doff` of `dst`.
    fn copy_words(&self, src: &Buf, so: usize, dst: &Buf, doff: usize, n: usize) {
        if n == 0 {
            return;
        }
        self.gpu.dispatch(
            "misc",
            "copy",
            &[n as u32, 0, 0, so as u32, doff as u32],
            &[src, dst],
            grid_1d(n),
        );
    }

    /// Attention of the rows of q from row `row0` over `cache`, into the same rows of out;
    /// with `heads`, one token whose heads' work attn_dec does itself (q and the new key
    /// normalised and rotated, the new key and value stored).
    #[allow(clippy::too_many_arguments)]
    fn attention_at(
        &self,
        q: &WgpuTensor,
        row0: usize,
        cache: &WgpuKvCache,
        layer: usize,
        s: AttnShape,
        out: &WgpuTensor,
        heads: Option<DecHeads<'_>>,
    ) {
        assert!(
            s.n_heads % s.n_kv_heads == 0 && s.head_dim <= 256 && s.head_dim % 2 == 0,
            "wgpu attention: {} heads over {} KV heads of {} (head size even, at most 256)",
            s.n_heads,
            s.n_kv_heads,
            s.head_dim
        );
        if s.n_tokens == 0 {
            return;
        }
        // A few tokens (decode): attn_dec over up to DEC_SPLITS splits of DEC_MIN_KEYS or more;
        // else attn_tile by tiles of ATT_TILE_TOKENS tokens where tiles are on and the head
        // fits, or attn_split over chunks of ATT_CHUNK keys.
        let len = s.pos0 + s.n_tokens;
        let dec = s.n_tokens <= DEC_MAX_TOKENS;
        let (kb, vb) = cache.bufs(layer);
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        // Params both paths share (attention.wgsl's list).
        let mut p = [0u32; 20];
        p[..8].copy_from_slice(&[
            s.n_heads as u32,
            s.n_kv_heads as u32,
            s.head_dim as u32,
            cache.slots as u32,
            s.pos0 as u32,
            cache.plane(layer) as u32,
            cache.f16 as u32,
            f(scale),
        ]);
        p[9] = (row0 * q.cols) as u32;
        p[11] = q.cols as u32;
        p[12] = (row0 * out.cols) as u32;
        p[13] = out.cols as u32;
        p[15] = s.window as u32;
        if !dec && heads.is_none() && self.gpu.tiled_attention(s.head_dim) {
            p[8] = 1;
            p[16] = s.n_tokens as u32;
            p[17] = s.head_dim as u32;
            p[19] = (cache.slots * s.head_dim) as u32;
            let d = &self.gpu.dummy;
            let tiles = s.n_tokens.div_ceil(ATT_TILE_TOKENS) as u32;
            self.gpu.dispatch(
                "attention",
                "attn_tile",
                &p,
                &[&q.buf, kb, vb, d, &out.buf],
                (s.n_heads as u32, tiles, 1),
            );
            return;
        }
        let (splits, per) = if dec {
            let min_keys = self.gpu.dec_min_keys;
            let splits = len.div_ceil(min_keys).clamp(1, DEC_SPLITS);
            (splits, len.div_ceil(splits))
        } else {
            (len.div_ceil(ATT_CHUNK), ATT_CHUNK)
        };
        let slots = s.n_tokens * s.n_heads * splits;
        let ml_off = slots * s.head_dim;
        // Sized for the whole cache at once, so a growing context never reallocates it.
        let most_splits = if dec {
            DEC_SPLITS
        } else {
            cache.n_ctx.div_ceil(ATT_CHUNK).max(splits)
        };
        let most = s.n_tokens * s.n_heads * most_splits;
        let part = ensure(
            &self.gpu,
            &mut self.scratch.borrow_mut().attn,
            (most * s.head_dim + 2 * most) * 4,
        );
        p[8] = splits as u32;
        p[10] = ml_off as u32;
        p[14] = per as u32;
        let d = &self.gpu.dummy;
        let mut bufs = [&q.buf, kb, vb, &part, &out.buf, d, d, d, d, d];
        let table;
        if let Some(h) = heads {
            assert!(dec && s.n_tokens == 1, "fused heads: one decode token");
            table = self.rope_table(h.rope, cache.n_ctx.max(s.pos0 + 1));
            let neox = h.rope.style == RopeStyle::Neox;
            p[16] = 1 | (h.qk_norm.is_some() as u32) << 1 | 4 | (neox as u32) << 3;
            p[17] = f(h.qk_norm.map_or(0.0, |n| n.2));
            p[18] = h.rope.dims as u32;
            p[19] = (row0 * h.k.cols) as u32;
            bufs[5..].copy_from_slice(&[
                &h.k.buf,
                &h.v.buf,
                h.qk_norm.map_or(d, |n| &n.0.buf),
                h.qk_norm.map_or(d, |n| &n.1.buf),
                &table,
            ]);
        }
        if dec {
            self.gpu.dispatch(
                "attention",
                "attn_dec",
                &p,
                &bufs,
                (s.n_heads as u32, splits as u32, s.n_tokens as u32),
            );
        } else {
            self.gpu.dispatch(
                "attention",
                "attn_split",
                &p,
                &bufs[..5],
                (s.n_heads as u32, splits as u32, s.n_tokens as u32),
            );
        }
        if splits == 1 {
            return;
        }
        self.gpu.dispatch(
            "attention",
            "attn_combine",
            &p,
            &[&q.buf, kb, vb, &part, &out.buf],
            (s.n_heads as u32, s.n_tokens as u32, 1),
        );
    }

    // ---- CPU fallback for the ops without a kernel yet ----

    fn to_cpu(&self, t: &WgpuTensor) -> CpuTensor {
        let mut v = vec![0f32; t.rows * t.cols];
        self.read_f32(&t.buf, &mut v);
        self.cpu.tensor_from(t.rows, t.cols, &v)
    }

    fn from_cpu(&self, c: &CpuTensor, t: &mut WgpuTensor) {
        let n = c.data.len().min(t.rows * t.cols);
        let bytes: Vec<u8> = c.data[..n].iter().flat_map(|v| v.to_le_bytes()).collect();
        self.gpu.write(&t.buf, 0, &bytes);
    }

    fn read_f32(&self, b: &Buf, out: &mut [f32]) {
        let mut bytes = vec![0u8; out.len() * 4];
        self.gpu.read(b, 0, &mut bytes);
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
}

impl WgpuWeight {
    /// GPU buffers holding the matrix: 1, or its parts where it is more than the adapter
    /// binds at once.
    pub fn buffers(&self) -> usize {
        self.parts.len().max(1)
    }

    /// The matrix's row ranges in order: itself, or its parts.
    fn pieces(&self) -> &[WgpuWeight] {
        if self.parts.is_empty() {
            std::slice::from_ref(self)
        } else {
            &self.parts
        }
    }
}

impl TensorOps for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    fn name(&self) -> String {
        format!("wgpu ({})", self.gpu.info.name)
    }

    fn host_counters(&self) -> Option<kiln_backend::HostCounters> {
        Some(self.gpu.counters())
    }

    fn load_weight(&self, w: WeightData) -> Result<WgpuWeight, BackendError> {
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
        self.weight_in_parts(&w, p)
    }

    fn weight_shape(&self, w: &WgpuWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn weight_bytes(&self, w: &WgpuWeight) -> usize {
        w.stored_bytes
    }

    fn tensor(&self, rows: usize, cols: usize) -> WgpuTensor {
        WgpuTensor {
            buf: self.gpu.buffer(rows * cols * 4),
            rows,
            cols,
        }
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> WgpuTensor {
        let mut v = data[..data.len().min(rows * cols)].to_vec();
        v.resize(rows * cols, 0.0);
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        WgpuTensor {
            buf: self.gpu.buffer_init(&bytes),
            rows,
            cols,
        }
    }

    fn read(&self, t: &WgpuTensor, rows: usize, out: &mut [f32]) {
        let n = (rows * t.cols).min(out.len()).min(t.rows * t.cols);
        self.read_f32(&t.buf, &mut out[..n]);
    }

    fn rms_norm(&self, x: &WgpuTensor, w: &WgpuTensor, eps: f32, n: usize, out: &mut WgpuTensor) {
        let cols = x.cols;
        self.gpu.dispatch(
            "prep",
            "prep",
            &[
                cols as u32,
                f(eps),
                1,
                0,
                0,
                x.cols as u32,
                0,
                out.cols as u32,
                0,
                0,
                1,
            ],
            &[&x.buf, &w.buf, &out.buf, &self.gpu.dummy],
            (prep_tiles(cols), n as u32, 1),
        );
    }

    fn matmul(
        &self,
        w: &WgpuWeight,
        x: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        n: usize,
        out: &mut WgpuTensor,
    ) {
        self.products(&[(w, None, bias, out, MODE_STORE)], x, n, None);
    }

    fn matmul_add(&self, w: &WgpuWeight, x: &WgpuTensor, n: usize, out: &mut WgpuTensor) {
        self.products(&[(w, None, None, out, MODE_ADD)], x, n, None);
    }

    fn matmul3(
        &self,
        ws: [&WgpuWeight; 3],
        biases: [Option<&WgpuTensor>; 3],
        x: &WgpuTensor,
        n: usize,
        outs: [&mut WgpuTensor; 3],
    ) {
        let [o0, o1, o2] = outs;
        self.products(
            &[
                (ws[0], None, biases[0], o0, MODE_STORE),
                (ws[1], None, biases[1], o1, MODE_STORE),
                (ws[2], None, biases[2], o2, MODE_STORE),
            ],
            x,
            n,
            None,
        );
    }

    fn silu_mul(&self, gate: &mut WgpuTensor, up: &WgpuTensor, n: usize) {
        self.elementwise(&gate.buf, &up.buf, OP_SILU_MUL, 0.0, n * gate.cols);
    }

    fn gelu_tanh_mul(&self, gate: &mut WgpuTensor, up: &WgpuTensor, n: usize) {
        self.elementwise(&gate.buf, &up.buf, OP_GELU_TANH_MUL, 0.0, n * gate.cols);
    }

    fn add(&self, x: &mut WgpuTensor, y: &WgpuTensor, n: usize) {
        self.elementwise(&x.buf, &y.buf, OP_ADD, 0.0, n * x.cols);
    }

    fn copy_row(&self, src: &WgpuTensor, src_row: usize, dst: &mut WgpuTensor) {
        self.copy_words(&src.buf, src_row * src.cols, &dst.buf, 0, src.cols);
    }

    fn copy_rows(
        &self,
        src: &WgpuTensor,
        src_row0: usize,
        n: usize,
        dst: &mut WgpuTensor,
        dst_row0: usize,
    ) {
        self.copy_words(
            &src.buf,
            src_row0 * src.cols,
            &dst.buf,
            dst_row0 * dst.cols,
            n * src.cols,
        );
    }

    fn gather_rows(&self, src: &WgpuTensor, rows: &[usize], dst: &mut WgpuTensor) {
        assert!(
            src.cols == dst.cols && dst.rows >= rows.len() && rows.iter().all(|&r| r < src.rows),
            "gather_rows: {} rows of a {}x{} tensor into {}x{}",
            rows.len(),
            src.rows,
            src.cols,
            dst.rows,
            dst.cols
        );
        if rows.is_empty() || src.cols == 0 {
            return;
        }
        let idx: Vec<u8> = rows
            .iter()
            .flat_map(|&r| (r as u32).to_le_bytes())
            .collect();
        let idx = self.gpu.buffer_init(&idx);
        let p = [rows.len() as u32, src.cols as u32];
        let d = &self.gpu.dummy;
        let grid = grid_1d(rows.len() * src.cols);
        self.gpu.dispatch(
            "signal",
            "gather_rows",
            &p,
            &[&src.buf, &idx, d, &dst.buf],
            grid,
        );
    }

    fn scale(&self, x: &mut WgpuTensor, s: f32, n: usize) {
        self.elementwise(&x.buf, &self.gpu.dummy, OP_SCALE, s, n);
    }
}

impl LlmOps for WgpuBackend {
    type KvCache = WgpuKvCache;

    fn kv_cache(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> WgpuKvCache {
        // f16 keys and values whatever the default type is (as the CUDA backend).
        self.kv_typed(n_layers, n_ctx, n_kv_heads, head_dim, true, None)
    }

    fn kv_cache_typed(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: KvType,
    ) -> Result<WgpuKvCache, BackendError> {
        let f16 = kv_f16(ty)?;
        Ok(self.kv_typed(n_layers, n_ctx, n_kv_heads, head_dim, f16, None))
    }

    fn kv_cache_window(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: Option<KvType>,
        win: KvWindow,
    ) -> Result<WgpuKvCache, BackendError> {
        let ty = ty.unwrap_or(KvType::F16);
        let Some(w) = WindowSlots::new(win, n_ctx, n_layers) else {
            return self.kv_cache_typed(n_layers, n_ctx, n_kv_heads, head_dim, ty);
        };
        let (slots, f16) = (w.slots, kv_f16(ty)?);
        Ok(self.kv_typed(n_layers, slots, n_kv_heads, head_dim, f16, Some(w)))
    }

    fn kv_kept_from(&self, cache: &WgpuKvCache) -> usize {
        cache.window.as_ref().map_or(0, WindowSlots::kept_from)
    }

    fn check_window(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// LFM2's convolutions through the trait's host default (no recorded steps here).
    fn check_short_conv(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn check_attention(
        &self,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        attention_supported(heads, kv_heads, head_dim).map_err(|what| BackendError::Unsupported {
            backend: "wgpu".into(),
            what,
        })
    }

    /// f16, which the attention shaders read directly (`unpack2x16float`): half the bytes a
    /// step at depth. (Sessions used f32 before, the scheduler's caches f16.)
    fn kv_type_default(&self, _head_dim: usize) -> KvType {
        KvType::F16
    }

    fn kv_cache_bytes(&self, c: &WgpuKvCache) -> usize {
        c.bytes()
    }

    fn kv_reserve(
        &self,
        cache: &mut WgpuKvCache,
        pos0: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        self.kv_grow(cache, pos0, n)
    }

    fn kv_release(&self, cache: &mut WgpuKvCache) {
        self.kv_release_memory(cache)
    }

    fn embed(
        &self,
        table: &WgpuWeight,
        ids: &[u32],
        out: &mut WgpuTensor,
    ) -> Result<(), BackendError> {
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= table.rows) {
            return Err(BackendError::TokenOutOfRange {
                id,
                vocab: table.rows,
            });
        }
        // A table held in parts: each part writes the rows of the ids in its range.
        let parts = table.pieces();
        for (c, chunk) in ids.chunks(60000).enumerate() {
            let off = self.gpu.push_ids(chunk);
            let mut row0 = 0;
            for part in parts {
                let p = [
                    part.rows as u32,
                    table.cols as u32,
                    table.fmt,
                    table.rw as u32,
                    off,
                    (c * 60000 * out.cols) as u32,
                    row0 as u32,
                ];
                self.gpu.dispatch(
                    "embed",
                    "embed",
                    &p,
                    &[&part.buf, &self.gpu.ids, &out.buf],
                    (table.cols.div_ceil(256) as u32, chunk.len() as u32, 1),
                );
                row0 += part.rows;
            }
        }
        Ok(())
    }

    fn rms_norm_heads(&self, x: &mut WgpuTensor, w: &WgpuTensor, eps: f32, n: usize) {
        let hd = w.cols;
        self.heads(
            (x, x.cols / hd, Some((w, eps)), false),
            None,
            None,
            hd,
            None,
            0,
            n,
        );
    }

    fn gate_up_silu(
        &self,
        gate: &WgpuWeight,
        up: &WgpuWeight,
        x: &WgpuTensor,
        n: usize,
        out: &mut WgpuTensor,
    ) {
        self.products(&[(gate, Some(up), None, out, MODE_GATE_UP)], x, n, None);
    }

    fn rms_norm_matmul(
        &self,
        x: &WgpuTensor,
        norm_w: &WgpuTensor,
        eps: f32,
        w: &WgpuWeight,
        n: usize,
        _h: &mut WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        let norm = Some((norm_w, eps));
        self.products(&[(w, None, None, out, MODE_STORE)], x, n, norm);
    }

    fn rms_norm_matmul3(
        &self,
        x: &WgpuTensor,
        norm_w: &WgpuTensor,
        eps: f32,
        ws: [&WgpuWeight; 3],
        biases: [Option<&WgpuTensor>; 3],
        n: usize,
        _h: &mut WgpuTensor,
        outs: [&mut WgpuTensor; 3],
    ) {
        let [o0, o1, o2] = outs;
        self.products(
            &[
                (ws[0], None, biases[0], o0, MODE_STORE),
                (ws[1], None, biases[1], o1, MODE_STORE),
                (ws[2], None, biases[2], o2, MODE_STORE),
            ],
            x,
            n,
            Some((norm_w, eps)),
        );
    }

    fn rms_norm_gate_up_silu(
        &self,
        x: &WgpuTensor,
        norm_w: &WgpuTensor,
        eps: f32,
        gate: &WgpuWeight,
        up: &WgpuWeight,
        n: usize,
        _h: &mut WgpuTensor,
        out: &mut WgpuTensor,
    ) {
        self.products(
            &[(gate, Some(up), None, out, MODE_GATE_UP)],
            x,
            n,
            Some((norm_w, eps)),
        );
    }

    fn qk_norm_rope_store(
        &self,
        q: &mut WgpuTensor,
        k: &mut WgpuTensor,
        v: &WgpuTensor,
        qk_norm: Option<(&WgpuTensor, &WgpuTensor, f32)>,
        rope: &RopeConfig,
        heads: usize,
        kv_heads: usize,
        cache: &mut WgpuKvCache,
        layer: usize,
        pos0: usize,
        n: usize,
    ) {
        let hd = cache.head_dim;
        // Rotated at positions pos0.., stored at their slots.
        let shift = pos0 - self.kv_place(cache, layer, pos0, n);
        let (qn, kn) = match qk_norm {
            Some((a, b, e)) => (Some((a, e)), Some(b)),
            None => (None, None),
        };
        self.heads(
            (q, heads, qn, true),
            Some((k, v, kv_heads, kn, cache, (layer, shift))),
            None,
            hd,
            Some(rope),
            pos0,
            n,
        );
    }

    fn rope(&self, x: &mut WgpuTensor, rope: &RopeConfig, heads: usize, pos0: usize, n: usize) {
        self.heads(
            (x, heads, None, true),
            None,
            None,
            rope.head_dim,
            Some(rope),
            pos0,
            n,
        );
    }

    fn kv_store(
        &self,
        cache: &mut WgpuKvCache,
        layer: usize,
        k: &WgpuTensor,
        v: &WgpuTensor,
        pos0: usize,
        n: usize,
    ) {
        let pos0 = self.kv_place(cache, layer, pos0, n);
        let plane = cache.plane(layer);
        let (hd, kvh) = (cache.head_dim, cache.kv_heads);
        let (kb, vb) = cache.bufs(layer);
        let kc = Some((kb, plane, cache.slots, cache.f16));
        let vc = Some((vb, plane, cache.slots, cache.f16));
        self.heads((k, kvh, None, false), None, kc, hd, None, pos0, n);
        self.heads((v, kvh, None, false), None, vc, hd, None, pos0, n);
    }

    fn attention(
        &self,
        q: &WgpuTensor,
        cache: &WgpuKvCache,
        layer: usize,
        s: AttnShape,
        out: &mut WgpuTensor,
    ) {
        self.attention_at(q, 0, cache, layer, cache.local(layer, s), out, None);
    }

    fn qk_norm_rope_attention(
        &self,
        q: &mut WgpuTensor,
        k: &mut WgpuTensor,
        v: &WgpuTensor,
        qk_norm: Option<(&WgpuTensor, &WgpuTensor, f32)>,
        rope: &RopeConfig,
        seqs: &mut [SeqKv<'_, WgpuKvCache>],
        layer: usize,
        out: &mut WgpuTensor,
        tmp: [&mut WgpuTensor; 3],
    ) {
        // One decode token of each sequence, over caches without windows: a dispatch a
        // sequence (attn_dec's fused heads, on the sequence's rows) instead of the heads'
        // dispatch and then attention. A sequence among others then runs the dispatch it
        // runs alone, so its values are the same bits whatever else the step holds.
        let fused = |one: &SeqKv<'_, WgpuKvCache>| {
            let s = one.shape;
            let hd = one.cache.head_dim;
            s.n_tokens == 1
                && one.cache.window.is_none()
                && s.head_dim == hd
                && s.n_heads % s.n_kv_heads == 0
                && hd <= 256
                && hd % 2 == 0
                && rope.dims <= hd
                && rope.dims % 2 == 0
        };
        if self.gpu.fused_heads && !seqs.is_empty() && seqs.iter().all(fused) {
            for (row, one) in seqs.iter_mut().enumerate() {
                self.kv_ready(one.cache, one.shape.pos0, 1);
                let heads = DecHeads {
                    k,
                    v,
                    qk_norm,
                    rope,
                };
                self.attention_at(q, row, one.cache, layer, one.shape, out, Some(heads));
            }
            return;
        }
        kiln_backend::qk_norm_rope_attention_seqs(
            self, q, k, v, qk_norm, rope, seqs, layer, out, tmp,
        )
    }

    fn attention_batch<'c, I>(&self, q: &WgpuTensor, seqs: I, layer: usize, out: &mut WgpuTensor)
    where
        I: Iterator<Item = (&'c WgpuKvCache, AttnShape)>,
    {
        let mut row = 0;
        for (cache, s) in seqs {
            self.attention_at(q, row, cache, layer, cache.local(layer, s), out, None);
            row += s.n_tokens;
        }
    }

    fn argmax_rows(&self, x: &WgpuTensor, n: usize, cols: usize) -> Vec<u32> {
        if n == 0 {
            return Vec::new();
        }
        assert!(cols <= x.cols, "argmax over {cols} of {} columns", x.cols);
        // The shaders step rows by `cols`: several rows' first columns are gathered first.
        if n > 1 && cols < x.cols {
            let packed = self.tensor(n, cols);
            for r in 0..n {
                self.copy_words(&x.buf, r * x.cols, &packed.buf, r * cols, cols);
            }
            return self.argmax_rows(&packed, n, cols);
        }
        // Parts of ARGMAX_CHUNK columns, then one merge per row; the indices follow the
        // parts' (value, index) pairs.
        let parts = cols.div_ceil(ARGMAX_CHUNK).max(1);
        let idx_off = 2 * n * parts;
        let out = ensure(
            &self.gpu,
            &mut self.scratch.borrow_mut().argmax,
            4 * (idx_off + n).max(64),
        );
        let p = [
            cols as u32,
            ARGMAX_CHUNK as u32,
            parts as u32,
            idx_off as u32,
        ];
        let bufs = [&x.buf, &out];
        self.gpu
            .dispatch("misc", "argmax", &p, &bufs, (parts as u32, n as u32, 1));
        self.gpu
            .dispatch("misc", "argmax_final", &p, &bufs, (n as u32, 1, 1));
        let mut bytes = vec![0u8; 4 * n];
        self.gpu.read(&out, 4 * idx_off as u64, &mut bytes);
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn kv_copy(&self, src: &WgpuKvCache, dst: &mut WgpuKvCache, n: usize) {
        self.kv_copy_slots(src, dst, n)
    }
}

/// Whether a cache of `ty` stores f16 (else f32): the two types the shaders read.
fn kv_f16(ty: KvType) -> Result<bool, BackendError> {
    match ty {
        KvType::F16 => Ok(true),
        KvType::F32 => Ok(false),
        other => Err(BackendError::KvType {
            ty: other.name(),
            what: "the wgpu backend stores keys and values as f16 or f32".into(),
        }),
    }
}

#[cfg(test)]
mod attention_shape_tests {
    use super::attention_supported;

    #[test]
    fn attention_shapes_the_shaders_run() {
        assert!(attention_supported(16, 8, 128).is_ok());
        assert!(attention_supported(32, 2, 256).is_ok());
        let e = attention_supported(12, 5, 64).unwrap_err();
        assert!(e.contains("12 query heads over 5"), "{e}");
        let e = attention_supported(8, 8, 300).unwrap_err();
        assert!(e.contains("head size 300"), "{e}");
    }
}
