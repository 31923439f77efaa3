//! The backend conformance suite (feature `conformance`): every op of [`Backend`] on a backend
//! under test against the same op on [`CpuBackend::reference`] (weights dequantized at load,
//! f32 arithmetic, one thread), on deterministic random inputs (xorshift) of shapes that hit
//! edge cases: odd row counts (75, 33, 301), 1 token, a few (3, 9), long prompts (70, 130),
//! head sizes 64, 128 and 80 (and 112), GQA groups of 1 to 8, attention at pos0 > 0, several
//! sequences in one call, KV caches of f32, f16 and q8_0, every weight format of
//! [`GgmlType`], in the spirit of ggml's `tests/test-backend-ops.cpp`.
//!
//! Each backend's test file has one `#[test]` per pub fn here (a failing op names itself),
//! with its own [`Tolerances`]. A failure panics with one line: backend, op, case (format,
//! shape), error and bound.
//!
//! Error measure: max |got - want| / max |want| over an op's output (a non-finite output
//! counts as an infinite error); ops that move or pick values (copies, transpose, upsampling,
//! argmax, the uint8 rounding, a KV copy) must be exact.
//!
//! Products: a backend may multiply quantized weights by activations rounded to int8 blocks
//! of 32 (d = max|x| / 127, q = round(x / d), as the CPU's integer kernels and the GPUs'
//! decode kernels do) or by f32 activations. So a product is compared with the reference on
//! the activations as given and on the activations so rounded, and the nearer counts: both
//! are exact definitions, and the bound is then the backend's summation order (CPU kernel
//! sets: ~1e-6) rather than the rounding (~3e-3).
//!
//! Attention runs against the reference with a cache of the type the backend stores
//! ([`LlmOps::kv_type_stored`]), so both see keys and values rounded alike.
//!
//! Unsupported formats, KV types and attention shapes: a backend says so through its own API
//! (an `Unsupported`, `KvType` or quantization-`Unsupported` error from `load_weight`,
//! `kv_cache_typed` or `check_attention`); the suite prints one line to stderr for each and
//! moves on. Any other error fails. Optional ops that a backend declines by their contract
//! (`conv_weight_q8` and `conv_transpose_weight` returning None, `top_candidates` returning
//! false) are printed the same way.
//!
//! Not tested here, and why: `name` (a label); `weight_bytes` and `kv_cache_bytes` (memory
//! accounting, no numbers to compare); `kv_cache` (the untyped cache is each backend's own
//! default type, covered through `kv_cache_typed`); `check_attention` and `kv_type_stored`
//! are used to decide what to run. Backend-specific properties stay in each backend's tests:
//! kernel variants, bit-for-bit batch invariance of chained decode products, recorded-step
//! (graph) edge cases, chunked prompt attention.

use crate::TensorOps;
use std::fmt::Display;
use std::io::Write;

use kiln_quant::{GgmlType, MlxLayout, QuantError};

use crate::cpu::{CpuBackend, CpuTensor, CpuWeight};
use crate::{
    AttnShape, Backend, BackendError, Conv1dShape, ConvWeightQ8, DenseAttnShape, KvType, LstmShape,
    MlxWeightData, RopeConfig, RopeScaling, RopeStyle, SeqKv, Unary, WeightData,
};

mod attention;
mod products;
mod rows;
mod signal;

pub use attention::{
    attention, attention_batch, attention_dense, kv_copy, kv_window, qk_norm_rope_attention, rope,
    self_attention,
};
pub use products::{
    gate_up_silu, matmul, matmul3, matmul_add_before_norm, mlx_weights, prefer_batches, step,
};
pub use rows::{
    argmax_rows, copies, elementwise, embed, layer_norm, rms_norm, short_conv, signal_norms,
    top_candidates,
};
pub use signal::{
    conv1d, conv1d_nc, conv1d_q8, fake_quant_u8, lstm, stft, unary_pad, CONV_NC_CASES,
};

/// Bounds on the error measure (see the module doc) per op family.
#[derive(Debug, Clone)]
pub struct Tolerances {
    /// `embed`, `embed_positions`: dequantized rows (float formats: exact).
    pub embed: f32,
    /// `rms_norm`, `rms_norm_heads`, `layer_norm`.
    pub norm: f32,
    /// Kokoro's norms over feature maps: `layer_norm_rows`, `ada_in`, `ada_layer_norm`.
    pub signal_norm: f32,
    /// `silu_mul`, `gelu_tanh_mul`, `gelu`, `gelu_tanh`, `snake` (`add`, `scale`,
    /// `leaky_relu`: exact).
    pub elementwise: f32,
    /// `rope` and the q, k that `qk_norm_rope_store` leaves.
    pub rope: f32,
    /// `matmul`, `matmul_add` (MLX weights and steps too), against the nearer of the two
    /// references.
    pub product: f32,
    /// `matmul3`, `gate_up_silu`, their RMSNorm-fused forms and `matmul_add_before_norm`'s
    /// chain, likewise.
    pub fused_product: f32,
    /// Products over a weight marked [`TensorOps::prefer_batches`] (block products that may
    /// round through bf16).
    pub batched: f32,
    /// Attention over an f32 KV cache, against the reference.
    pub attention: f32,
    /// Attention over an f16 or q8_0 cache, against the reference with the same cache type
    /// (a key the backend rotated a last bit differently may round to the other side of a
    /// midpoint of the cache's type).
    pub attention_packed: f32,
    /// `attention_dense`, `self_attention`.
    pub attention_dense: f32,
    /// `conv1d` of f32 weights, `conv1d_nc`, `conv_transpose1d` (packed too), `conv1d_q8` (`conv1d`
    /// of f16 weights: `product`).
    pub conv: f32,
    /// `lstm`, `bilstm_steps`.
    pub lstm: f32,
    /// `stft`, `istft`.
    pub stft: f32,
}

impl Tolerances {
    /// The CPU backend's own kernel sets: the same arithmetic as the reference in another
    /// summation order, except where block products round through bf16 (`batched`, and the
    /// dense attention and convolutions of a CPU with AMX or AVX-512 BF16) or int8 (`batched`
    /// over Q8_0 weights on AVX-512 VNNI or NEON dotprod without AMX).
    pub fn cpu() -> Self {
        let amx = crate::cpu::kernels::amx::bf16_products();
        let bf16 = |exact: f32| if amx { 1e-2 } else { exact };
        // Q8_0 weights marked `prefer_batches` run as int8 block products where there are no
        // tiles (AVX-512 VNNI, NEON dotprod): activations rounded to int8 a row.
        let int8 = crate::cpu::kernels::vnni_gemm::available();
        Tolerances {
            embed: 0.0,
            norm: 1e-6,
            // ada_in's fast path applies x * scale + shift (scale = g / sigma, shift = b -
            // mean * scale): on a channel of one sample x - mean is 0, but the two terms
            // cancel only to their last bits (2e-5 of the output seen).
            signal_norm: 5e-5,
            elementwise: 1e-6,
            rope: 1e-6,
            product: 1e-5,
            fused_product: 1e-5,
            batched: if amx || int8 { 1e-2 } else { 1e-5 },
            attention: 1e-5,
            attention_packed: 1e-5,
            attention_dense: bf16(1e-5),
            conv: bf16(1e-5),
            lstm: 1e-5,
            stft: 1e-5,
        }
    }
}

/// One `#[test]` per test of the suite, each calling `$run` (a function of the backend's test
/// file taking `fn(&Backend, &Tolerances)`, which makes the backend and its tolerances and
/// calls it) with that test; attributes given first (`#[ignore]`) go on every test.
#[macro_export]
macro_rules! conformance_tests {
    ($(#[$attr:meta])* $run:path) => {
        $crate::conformance_tests!(@tests [$(#[$attr])*] $run;
            matmul matmul3 gate_up_silu matmul_add_before_norm prefer_batches mlx_weights
            embed rms_norm layer_norm signal_norms elementwise copies argmax_rows
            top_candidates rope attention attention_batch qk_norm_rope_attention kv_copy
            kv_window attention_dense self_attention conv1d conv1d_nc conv1d_q8 lstm stft
            fake_quant_u8 unary_pad step short_conv);
    };
    (@tests $attrs:tt $run:path; $op:ident $($rest:ident)*) => {
        $crate::conformance_tests!(@one $attrs $run; $op);
        $crate::conformance_tests!(@tests $attrs $run; $($rest)*);
    };
    (@tests $attrs:tt $run:path;) => {};
    (@one [$($attr:tt)*] $run:path; $op:ident) => {
        $($attr)*
        #[test]
        fn $op() {
            let t = std::time::Instant::now();
            $run($crate::conformance::$op);
            eprintln!("{}: {:.2} s", stringify!($op), t.elapsed().as_secs_f64());
        }
    };
}

/// Every weight format kiln reads.
pub const FORMATS: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

const KV_TYPES: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

/// xorshift64: uniform values in [-1, 1).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn v(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// max |got - want| / max |want|; infinite where `got` holds a non-finite value.
pub fn rel_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "output length");
    let (mut e, mut m) = (0f32, 0f32);
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f32::INFINITY;
        }
        e = e.max((g - w).abs());
        m = m.max(w.abs());
    }
    e / m.max(1e-30)
}

// ---- helpers ----

fn check(name: &str, op: &str, case: impl Display, e: f32, bound: f32) {
    eprintln!("{name} {op} [{case}]: error {e:.2e} (bound {bound:.0e})");
    assert!(
        e <= bound,
        "{name}: {op} [{case}]: error {e:.2e} > bound {bound:.0e}"
    );
}

fn check_rel(name: &str, op: &str, case: impl Display, got: &[f32], want: &[f32], bound: f32) {
    check(name, op, case, rel_error(got, want), bound)
}

/// The smallest error against any of `wants` (the two references of a product).
fn check_either(name: &str, op: &str, case: impl Display, got: &[f32], wants: &[Vec<f32>], b: f32) {
    let e = wants
        .iter()
        .map(|w| rel_error(got, w))
        .fold(f32::INFINITY, f32::min);
    check(name, op, case, e, b)
}

fn check_exact(name: &str, op: &str, case: impl Display, got: &[f32], want: &[f32]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: {op} [{case}]: output length"
    );
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{name}: {op} [{case}]: {} of {} values differ (first at {i}: {} vs {}), bound: exact",
            bad.len(),
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// A line on stderr (straight, not through the test harness's capture) for something the
/// backend declined through its API.
fn declined(name: &str, op: &str, case: impl Display, why: impl Display) {
    let _ = writeln!(std::io::stderr(), "{name}: {op} [{case}]: not run: {why}");
}

/// Whether `e` is the backend saying it does not support something (not a failure).
fn is_unsupported(e: &BackendError) -> bool {
    matches!(
        e,
        BackendError::Unsupported { .. }
            | BackendError::KvType { .. }
            | BackendError::Quant {
                source: QuantError::Unsupported { .. },
                ..
            }
    )
}

fn read<B: Backend>(b: &B, t: &B::Tensor, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = vec![0f32; rows * cols];
    b.read(t, rows, &mut v);
    v
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// `rows` rows of `cols` random values in format `ty`: quantized from uniform values, or
/// for the formats kiln does not quantize (Q2_K, Q3_K) random blocks with small scales.
pub fn weight_data(ty: GgmlType, rows: usize, cols: usize, r: &mut Rng) -> Vec<u8> {
    if kiln_quant::can_quantize(ty) {
        return kiln_quant::quantize(ty, &r.v(rows * cols)).expect("a whole number of blocks");
    }
    let mut b: Vec<u8> = (0..ty.row_bytes(cols).expect("blocks") * rows)
        .map(|_| r.next() as u8)
        .collect();
    let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let (size, d_at, dmin_at) = match ty {
        GgmlType::Q2_K => (84, 80, Some(82)),
        GgmlType::Q3_K => (110, 108, None),
        other => unreachable!("no quantizer and no block layout here for {}", other.name()),
    };
    for blk in b.chunks_exact_mut(size) {
        let d = 0.005 + (r.next() % 100) as f32 / 10000.0;
        blk[d_at..d_at + 2].copy_from_slice(&f16(d));
        if let Some(at) = dmin_at {
            blk[at..at + 2].copy_from_slice(&f16(d / 2.0));
        }
    }
    b
}

/// The weight on the backend, or None after a line saying the backend does not take it.
fn load<B: Backend>(
    b: &B,
    op: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Option<B::Weight> {
    let w = WeightData {
        name: "w",
        ty,
        rows,
        cols,
        bytes,
    };
    match b.load_weight(w) {
        Ok(w) => {
            assert_eq!(
                b.weight_shape(&w),
                (rows, cols),
                "{}: weight_shape",
                b.name()
            );
            Some(w)
        }
        Err(e) if is_unsupported(&e) => {
            declined(&b.name(), op, format!("{} {rows}x{cols}", ty.name()), e);
            None
        }
        Err(e) => panic!(
            "{}: {op} [{} {rows}x{cols}]: load_weight failed: {e}",
            b.name(),
            ty.name()
        ),
    }
}

/// How a product's activations are taken: as they are, or rounded to integer blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    F32,
    /// int8 blocks of 32 (the GGML formats' integer kernels).
    Int8,
    /// int16 blocks of 32 (the CPU's MLX kernels).
    Int16,
}

/// Rows of `cols` activations rounded to integers of at most `max` per block of 32, as
/// integer kernels round them: d = max|x| / max, x = round(x / d) * d (ties to even); a
/// shorter tail is left as it is.
pub fn round_act(x: &[f32], cols: usize, max: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(cols) {
        for blk in row.chunks_exact_mut(32) {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / max;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for v in blk.iter_mut() {
                *v = (*v * id).round_ties_even().clamp(-max, max) * d;
            }
        }
    }
    out
}

fn silu_mul(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

fn gelu_tanh_mul(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let g = g as f64;
            let t = (0.7978845608028654 * (g + 0.044715 * g * g * g)).tanh();
            (0.5 * g * (1.0 + t) * u as f64) as f32
        })
        .collect()
}

fn added(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// The reference, with products on activations as given or rounded to int8 blocks.
struct Ref {
    r: CpuBackend,
}

impl Ref {
    fn new() -> Self {
        Ref {
            r: CpuBackend::reference(),
        }
    }

    fn load(&self, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> CpuWeight {
        self.r
            .load_weight(WeightData {
                name: "w",
                ty,
                rows,
                cols,
                bytes,
            })
            .expect("the reference reads every format")
    }

    fn t(&self, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
        self.r.tensor_from(rows, cols, data)
    }

    /// W x (+ bias) for n rows of x, x taken as `act` says.
    fn mm(&self, w: &CpuWeight, x: &[f32], n: usize, bias: Option<&[f32]>, act: Act) -> Vec<f32> {
        let (rows, cols) = self.r.weight_shape(w);
        let x = match act {
            Act::F32 => x.to_vec(),
            Act::Int8 => round_act(x, cols, 127.0),
            Act::Int16 => round_act(x, cols, 32767.0),
        };
        let bias = bias.map(|b| self.t(1, rows, b));
        let mut o = self.r.tensor(n, rows);
        self.r
            .matmul(w, &self.t(n, cols, &x), bias.as_ref(), n, &mut o);
        read(&self.r, &o, n, rows)
    }

    /// Both references of one product: [f32 activations, int8 activations].
    fn mm2(&self, w: &CpuWeight, x: &[f32], n: usize, bias: Option<&[f32]>) -> [Vec<f32>; 2] {
        [Act::F32, Act::Int8].map(|a| self.mm(w, x, n, bias, a))
    }

    fn rms_norm(&self, x: &[f32], n: usize, w: &[f32], eps: f32) -> Vec<f32> {
        let cols = w.len();
        let mut o = self.r.tensor(n, cols);
        self.r
            .rms_norm(&self.t(n, cols, x), &self.t(1, cols, w), eps, n, &mut o);
        read(&self.r, &o, n, cols)
    }
}

/// A tensor of `data` on the backend and on the reference.
fn both<B: Backend>(
    b: &B,
    rf: &Ref,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> (B::Tensor, CpuTensor) {
    (b.tensor_from(rows, cols, data), rf.t(rows, cols, data))
}
