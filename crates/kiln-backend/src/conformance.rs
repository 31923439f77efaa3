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
//! ([`Backend::kv_type_stored`]), so both see keys and values rounded alike.
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

use std::fmt::Display;
use std::io::Write;

use kiln_quant::{GgmlType, MlxLayout, QuantError};

use crate::cpu::{CpuBackend, CpuTensor, CpuWeight};
use crate::{
    AttnShape, Backend, BackendError, Conv1dShape, ConvWeightQ8, DenseAttnShape, KvType, LstmShape,
    MlxWeightData, RopeConfig, RopeScaling, RopeStyle, SeqKv, WeightData,
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
    /// `silu_mul`, `gelu`, `gelu_tanh`, `snake` (`add`, `scale`, `leaky_relu`: exact).
    pub elementwise: f32,
    /// `rope` and the q, k that `qk_norm_rope_store` leaves.
    pub rope: f32,
    /// `matmul`, `matmul_add` (MLX weights and steps too), against the nearer of the two
    /// references.
    pub product: f32,
    /// `matmul3`, `gate_up_silu`, their RMSNorm-fused forms and `matmul_add_before_norm`'s
    /// chain, likewise.
    pub fused_product: f32,
    /// Products over a weight marked [`Backend::prefer_batches`] (block products that may
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
    /// summation order, except where AMX tiles round through bf16 (`batched`, and the dense
    /// attention and convolutions of a CPU with AMX).
    pub fn cpu() -> Self {
        let amx = crate::cpu::kernels::amx::available();
        let bf16 = |exact: f32| if amx { 1e-2 } else { exact };
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
            batched: bf16(1e-5),
            attention: 1e-5,
            attention_packed: 1e-5,
            attention_dense: bf16(1e-5),
            conv: bf16(1e-5),
            lstm: 1e-5,
            stft: 1e-5,
        }
    }
}

/// Every test of the suite, in order.
pub fn run_all<B: Backend>(b: &B, tol: &Tolerances) {
    matmul(b, tol);
    matmul3(b, tol);
    gate_up_silu(b, tol);
    matmul_add_before_norm(b, tol);
    prefer_batches(b, tol);
    mlx_weights(b, tol);
    embed(b, tol);
    rms_norm(b, tol);
    layer_norm(b, tol);
    signal_norms(b, tol);
    elementwise(b, tol);
    copies(b, tol);
    argmax_rows(b, tol);
    top_candidates(b, tol);
    rope(b, tol);
    attention(b, tol);
    attention_batch(b, tol);
    qk_norm_rope_attention(b, tol);
    kv_copy(b, tol);
    attention_dense(b, tol);
    self_attention(b, tol);
    conv1d(b, tol);
    conv1d_nc(b, tol);
    conv1d_q8(b, tol);
    lstm(b, tol);
    stft(b, tol);
    fake_quant_u8(b, tol);
    step(b, tol);
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
            attention_dense self_attention conv1d conv1d_nc conv1d_q8 lstm stft
            fake_quant_u8 step);
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

// ---- products ----

/// `matmul` (with a bias) and `matmul_add` on top of it, every format, rows 75 and 33 (and
/// 333 columns for the float formats), 1 to 130 tokens (decode kernels and tiled GEMMs).
pub fn matmul<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1001));
    for ty in FORMATS {
        let mut shapes = vec![(75, 256), (33, 512)];
        if is_float(ty) {
            shapes.push((75, 333));
        }
        for (rows, cols) in shapes {
            let bytes = weight_data(ty, rows, cols, &mut rng);
            let Some(wb) = load(b, "matmul", ty, rows, cols, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, rows, cols, &bytes);
            let bias = rng.v(rows);
            let bt = b.tensor_from(1, rows, &bias);
            for n in [1, 3, 9, 70, 130] {
                let case = format!("{} {rows}x{cols} n={n}", ty.name());
                let x = rng.v(n * cols);
                let xt = b.tensor_from(n, cols, &x);
                let mut o = b.tensor(n, rows);
                b.matmul(&wb, &xt, Some(&bt), n, &mut o);
                let want = rf.mm2(&wr, &x, n, Some(&bias));
                check_either(
                    &name,
                    "matmul",
                    &case,
                    &read(b, &o, n, rows),
                    &want,
                    tol.product,
                );
                b.matmul_add(&wb, &xt, n, &mut o);
                let plain = rf.mm2(&wr, &x, n, None);
                let want = [0, 1].map(|i| added(&want[i], &plain[i]));
                let got = read(b, &o, n, rows);
                check_either(&name, "matmul_add", &case, &got, &want, tol.product);
            }
        }
    }
}

/// `matmul3` (biases and none) and `rms_norm_matmul3`: each format as the first of three
/// different ones, outputs of 75, 33 and 33 rows, 1, 9 and 70 tokens.
pub fn matmul3<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1002));
    let (dim, outs, eps) = (256, [75, 33, 33], 1e-5);
    for i in 0..FORMATS.len() {
        let tys = [0, 5, 10].map(|o| FORMATS[(i + o) % FORMATS.len()]);
        let bytes: Vec<Vec<u8>> = (0..3)
            .map(|p| weight_data(tys[p], outs[p], dim, &mut rng))
            .collect();
        let wb: Option<Vec<B::Weight>> = (0..3)
            .map(|p| load(b, "matmul3", tys[p], outs[p], dim, &bytes[p]))
            .collect();
        let Some(wb) = wb else { continue };
        let wr: Vec<CpuWeight> = (0..3)
            .map(|p| rf.load(tys[p], outs[p], dim, &bytes[p]))
            .collect();
        let biases: Vec<Vec<f32>> = outs.iter().map(|&k| rng.v(k)).collect();
        let bt: Vec<B::Tensor> = (0..3)
            .map(|p| b.tensor_from(1, outs[p], &biases[p]))
            .collect();
        let norm = rng.v(dim);
        let nt = b.tensor_from(1, dim, &norm);
        let tys_name = tys.map(|t| t.name()).join("+");
        for n in [1, 9, 70] {
            let with_bias = n != 9;
            let bs = [0, 1, 2].map(|p| with_bias.then_some(&bt[p]));
            let x = rng.v(n * dim);
            let xt = b.tensor_from(n, dim, &x);
            let mut o: Vec<B::Tensor> = outs.iter().map(|&k| b.tensor(n, k)).collect();
            let mut h = b.tensor(n, dim);
            let hr = rf.rms_norm(&x, n, &norm, eps);
            for fused in [false, true] {
                {
                    let [o0, o1, o2] = &mut o[..] else {
                        unreachable!()
                    };
                    let ws = [&wb[0], &wb[1], &wb[2]];
                    match fused {
                        false => b.matmul3(ws, bs, &xt, n, [o0, o1, o2]),
                        true => b.rms_norm_matmul3(&xt, &nt, eps, ws, bs, n, &mut h, [o0, o1, o2]),
                    }
                }
                let op = if fused { "rms_norm_matmul3" } else { "matmul3" };
                let input = if fused { &hr } else { &x };
                for p in 0..3 {
                    let bias = with_bias.then_some(&biases[p][..]);
                    let want = rf.mm2(&wr[p], input, n, bias);
                    let got = read(b, &o[p], n, outs[p]);
                    let case = format!("{tys_name} part {p} dim={dim} n={n} bias={with_bias}");
                    check_either(&name, op, case, &got, &want, tol.fused_product);
                }
            }
        }
    }
}

/// `gate_up_silu` and `rms_norm_gate_up_silu`, every format as gate, up in the same format
/// or another, 75 rows, 1, 3 and 70 tokens.
pub fn gate_up_silu<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1003));
    let (dim, ffn, eps) = (256, 75, 1e-5);
    for i in 0..FORMATS.len() {
        // Gate and up alike for even i, of two formats for odd i.
        {
            let j = if i % 2 == 0 {
                i
            } else {
                (i + 4) % FORMATS.len()
            };
            let tys = [FORMATS[i], FORMATS[j]];
            let bytes = tys.map(|t| weight_data(t, ffn, dim, &mut rng));
            let (Some(g), Some(u)) = (
                load(b, "gate_up_silu", tys[0], ffn, dim, &bytes[0]),
                load(b, "gate_up_silu", tys[1], ffn, dim, &bytes[1]),
            ) else {
                continue;
            };
            let [gr, ur] = [0, 1].map(|p| rf.load(tys[p], ffn, dim, &bytes[p]));
            let norm = rng.v(dim);
            let nt = b.tensor_from(1, dim, &norm);
            for n in [1, 3, 70] {
                let x = rng.v(n * dim);
                let xt = b.tensor_from(n, dim, &x);
                let (mut h, mut o) = (b.tensor(n, dim), b.tensor(n, ffn));
                let hr = rf.rms_norm(&x, n, &norm, eps);
                for fused in [false, true] {
                    match fused {
                        false => b.gate_up_silu(&g, &u, &xt, n, &mut o),
                        true => b.rms_norm_gate_up_silu(&xt, &nt, eps, &g, &u, n, &mut h, &mut o),
                    }
                    let input = if fused { &hr } else { &x };
                    let (gw, uw) = (rf.mm2(&gr, input, n, None), rf.mm2(&ur, input, n, None));
                    // Each product on either activations (the two formats may differ).
                    let want: Vec<Vec<f32>> =
                        (0..4).map(|c| silu_mul(&gw[c / 2], &uw[c % 2])).collect();
                    let op = if fused {
                        "rms_norm_gate_up_silu"
                    } else {
                        "gate_up_silu"
                    };
                    let case = format!("{}+{} {ffn}x{dim} n={n}", tys[0].name(), tys[1].name());
                    check_either(
                        &name,
                        op,
                        case,
                        &read(b, &o, n, ffn),
                        &want,
                        tol.fused_product,
                    );
                }
            }
        }
    }
}

/// A decode layer's products chained in one step as a model runs them, each format:
/// `matmul_add_before_norm` (o and down projections) feeding `rms_norm_gate_up_silu` and
/// `rms_norm_matmul3` with the norm it was told about, in 9 formats. Each op's output is checked against
/// the reference given the backend's own input to that op (the two residuals are separate
/// tensors, so every intermediate can be read): an int8 rounding step taken the other way
/// upstream (a value at a rounding midpoint) then cannot grow along the chain.
pub fn matmul_add_before_norm<B: Backend>(b: &B, tol: &Tolerances) {
    use GgmlType::*;
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1004));
    let (dim, ffn, eps) = (256, 256, 1e-5);
    // The formats of the GPUs' own kernels and two they widen (every format's products are
    // `matmul`'s; this is about the hand-over between ops).
    for ty in [F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, Q5_0, Q5_K] {
        let shapes = [(dim, dim), (ffn, dim), (ffn, dim), (dim, ffn)];
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(r, c)| weight_data(ty, r, c, &mut rng))
            .collect();
        let wb: Option<Vec<B::Weight>> = (0..4)
            .map(|i| {
                load(
                    b,
                    "matmul_add_before_norm",
                    ty,
                    shapes[i].0,
                    shapes[i].1,
                    &bytes[i],
                )
            })
            .collect();
        let Some(wb) = wb else { continue };
        let wr: Vec<CpuWeight> = (0..4)
            .map(|i| rf.load(ty, shapes[i].0, shapes[i].1, &bytes[i]))
            .collect();
        let (n1, n2) = (rng.v(dim), rng.v(dim));
        let (n1t, n2t) = (b.tensor_from(1, dim, &n1), b.tensor_from(1, dim, &n2));
        for n in [1, 9, 70] {
            let (x0, y0, a) = (rng.v(n * dim), rng.v(n * dim), rng.v(n * dim));
            let (mut x, mut y) = (b.tensor_from(n, dim, &x0), b.tensor_from(n, dim, &y0));
            let at = b.tensor_from(n, dim, &a);
            let (mut h, mut f) = (b.tensor(n, dim), b.tensor(n, ffn));
            let (mut q, mut k, mut v) = (b.tensor(n, dim), b.tensor(n, dim), b.tensor(n, dim));
            b.step(None, &[], 0, &mut || {
                b.matmul_add_before_norm(&wb[0], &at, n, &mut x, (&n1t, eps));
                b.rms_norm_gate_up_silu(&x, &n1t, eps, &wb[1], &wb[2], n, &mut h, &mut f);
                b.matmul_add_before_norm(&wb[3], &f, n, &mut y, (&n2t, eps));
                let w = &wb[0];
                let outs = [&mut q, &mut k, &mut v];
                b.rms_norm_matmul3(&y, &n2t, eps, [w, w, w], [None; 3], n, &mut h, outs);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: step: {e}"));
            let (xg, fg, yg) = (
                read(b, &x, n, dim),
                read(b, &f, n, ffn),
                read(b, &y, n, dim),
            );
            let want_x = rf.mm2(&wr[0], &a, n, None).map(|p| added(&x0, &p));
            let h1 = rf.rms_norm(&xg, n, &n1, eps);
            let (g1, u1) = (rf.mm2(&wr[1], &h1, n, None), rf.mm2(&wr[2], &h1, n, None));
            let want_f = [0, 1].map(|i| silu_mul(&g1[i], &u1[i]));
            let want_y = rf.mm2(&wr[3], &fg, n, None).map(|p| added(&y0, &p));
            let want_q = rf.mm2(&wr[0], &rf.rms_norm(&yg, n, &n2, eps), n, None);
            let case = format!("{} dim={dim} ffn={ffn} n={n}", ty.name());
            let op = "matmul_add_before_norm";
            check_either(
                &name,
                op,
                format!("{case} residual"),
                &xg,
                &want_x,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} gate/up after it"),
                &fg,
                &want_f,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} second residual"),
                &yg,
                &want_y,
                tol.fused_product,
            );
            check_either(
                &name,
                op,
                format!("{case} matmul3 after it"),
                &read(b, &q, n, dim),
                &want_q,
                tol.fused_product,
            );
        }
    }
}

/// Products over weights marked `prefer_batches`, for a token and for prompts.
pub fn prefer_batches<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1005));
    let (rows, cols) = (75, 256);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let bytes = weight_data(ty, rows, cols, &mut rng);
        let Some(mut wb) = load(b, "prefer_batches", ty, rows, cols, &bytes) else {
            continue;
        };
        b.prefer_batches(&mut wb);
        let wr = rf.load(ty, rows, cols, &bytes);
        for n in [1, 130] {
            let x = rng.v(n * cols);
            let mut o = b.tensor(n, rows);
            b.matmul(&wb, &b.tensor_from(n, cols, &x), None, n, &mut o);
            let want = rf.mm2(&wr, &x, n, None);
            let case = format!("{} {rows}x{cols} n={n}", ty.name());
            check_either(
                &name,
                "prefer_batches matmul",
                case,
                &read(b, &o, n, rows),
                &want,
                tol.batched,
            );
        }
    }
}

/// `load_weight_mlx` (4 and 8 bits, groups of 32, 64 and 128) and products over it.
pub fn mlx_weights<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x1006));
    let (rows, cols) = (75, 256);
    for (bits, group) in [(4, 32), (4, 64), (8, 64), (4, 128), (8, 128)] {
        let layout = MlxLayout::new(bits, group, cols).expect("a valid MLX layout");
        let (qb, g) = (layout.q_bytes(cols), layout.groups(cols));
        let (mut q, mut s, mut bi) = (
            vec![0u8; rows * qb],
            vec![0f32; rows * g],
            vec![0f32; rows * g],
        );
        for r in 0..rows {
            let w = rng.v(cols);
            kiln_quant::mlx_quantize_row(
                layout,
                &w,
                &mut q[r * qb..(r + 1) * qb],
                &mut s[r * g..(r + 1) * g],
                &mut bi[r * g..(r + 1) * g],
            );
        }
        let data = MlxWeightData {
            name: "w",
            layout,
            rows,
            cols,
            q: &q,
            scales: &s,
            biases: &bi,
        };
        let case0 = format!("mlx {bits}-bit group {group} {rows}x{cols}");
        let wb = match b.load_weight_mlx(data) {
            Ok(w) => w,
            Err(e) if is_unsupported(&e) => {
                declined(&name, "load_weight_mlx", &case0, e);
                continue;
            }
            Err(e) => panic!("{name}: load_weight_mlx [{case0}]: {e}"),
        };
        assert_eq!(
            b.weight_shape(&wb),
            (rows, cols),
            "{name}: weight_shape [{case0}]"
        );
        let wr = rf.r.load_weight_mlx(data).expect("the reference reads MLX");
        for n in [1, 9, 70] {
            let x = rng.v(n * cols);
            let mut o = b.tensor(n, rows);
            b.matmul(&wb, &b.tensor_from(n, cols, &x), None, n, &mut o);
            let mut want = [Act::F32, Act::Int8, Act::Int16].map(|a| rf.mm(&wr, &x, n, None, a));
            // The CPU's MLX kernels: q . x on x in int16 blocks, the bias term on x as given
            // (bias[g] * sum of the group's x), so the int16 reference gets the bias term's
            // share of the rounding back.
            let x16 = round_act(&x, cols, 32767.0);
            for t in 0..n {
                for r in 0..rows {
                    let d: f32 = (0..cols)
                        .map(|j| bi[r * g + j / group] * (x[t * cols + j] - x16[t * cols + j]))
                        .sum();
                    want[2][t * rows + r] += d;
                }
            }
            check_either(
                &name,
                "load_weight_mlx matmul",
                format!("{case0} n={n}"),
                &read(b, &o, n, rows),
                &want,
                tol.product,
            );
        }
    }
}

// ---- rows, norms, elementwise ----

/// `embed` (repeated ids, the first and last rows) and `embed_positions`, every format,
/// 301 rows; an id or position past the table is an error.
pub fn embed<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2001));
    let vocab = 301;
    for ty in FORMATS {
        let mut dims = vec![256];
        if is_float(ty) {
            dims.push(333);
        }
        for dim in dims {
            let bytes = weight_data(ty, vocab, dim, &mut rng);
            let Some(wb) = load(b, "embed", ty, vocab, dim, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, vocab, dim, &bytes);
            let case = format!("{} {vocab}x{dim}", ty.name());
            let ids = [0u32, 300, 17, 17, 255];
            let (mut o, mut orf) = (b.tensor(5, dim), rf.r.tensor(5, dim));
            b.embed(&wb, &ids, &mut o)
                .unwrap_or_else(|e| panic!("{name}: embed [{case}]: {e}"));
            rf.r.embed(&wr, &ids, &mut orf).unwrap();
            // Float formats convert exactly: the same bits.
            let check_rows = |op: &str, case: &str, got: &[f32], want: &[f32]| match is_float(ty) {
                true => check_exact(&name, op, case, got, want),
                false => check_rel(&name, op, case, got, want, tol.embed),
            };
            check_rows(
                "embed",
                &case,
                &read(b, &o, 5, dim),
                &read(&rf.r, &orf, 5, dim),
            );
            assert!(
                b.embed(&wb, &[vocab as u32], &mut o).is_err(),
                "{name}: embed [{case}]: id {vocab} past the table is no error"
            );
            let (mut o, mut orf) = (b.tensor(3, dim), rf.r.tensor(3, dim));
            b.embed_positions(&wb, vocab - 3, 3, &mut o)
                .unwrap_or_else(|e| panic!("{name}: embed_positions [{case}]: {e}"));
            rf.r.embed_positions(&wr, vocab - 3, 3, &mut orf).unwrap();
            let case_p = format!("{case} pos0={}", vocab - 3);
            check_rows(
                "embed_positions",
                &case_p,
                &read(b, &o, 3, dim),
                &read(&rf.r, &orf, 3, dim),
            );
            assert!(
                b.embed_positions(&wb, vocab - 2, 3, &mut o).is_err(),
                "{name}: embed_positions [{case}]: positions past the table are no error"
            );
        }
    }
}

/// `rms_norm` (rows of 333, 256 and 4096) and `rms_norm_heads` (heads of 64, 128 and 80).
pub fn rms_norm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2002));
    for cols in [333, 256, 4096] {
        let w = rng.v(cols);
        for n in [1, 3, 70] {
            let x: Vec<f32> = rng.v(n * cols).iter().map(|v| v * 4.0).collect();
            let (xt, _) = both(b, &rf, n, cols, &x);
            let mut o = b.tensor(n, cols);
            b.rms_norm(&xt, &b.tensor_from(1, cols, &w), 1e-6, n, &mut o);
            let want = rf.rms_norm(&x, n, &w, 1e-6);
            check_rel(
                &name,
                "rms_norm",
                format!("{n}x{cols}"),
                &read(b, &o, n, cols),
                &want,
                tol.norm,
            );
        }
    }
    for (heads, hd) in [(3, 64), (8, 128), (5, 80)] {
        let w = rng.v(hd);
        for n in [1, 9] {
            let x = rng.v(n * heads * hd);
            let (mut xt, mut xr) = both(b, &rf, n, heads * hd, &x);
            b.rms_norm_heads(&mut xt, &b.tensor_from(1, hd, &w), 1e-6, n);
            rf.r.rms_norm_heads(&mut xr, &rf.t(1, hd, &w), 1e-6, n);
            let case = format!("n={n} heads={heads} hd={hd}");
            check_rel(
                &name,
                "rms_norm_heads",
                case,
                &read(b, &xt, n, heads * hd),
                &read(&rf.r, &xr, n, heads * hd),
                tol.norm,
            );
        }
    }
}

/// Whisper's `layer_norm` and `gelu` (erf) on its output.
pub fn layer_norm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2003));
    for (n, cols) in [(7, 384), (3, 1500), (1, 333), (70, 256)] {
        let x: Vec<f32> = rng.v(n * cols).iter().map(|v| v * 3.0 + 0.5).collect();
        let (gm, bt) = (rng.v(cols), rng.v(cols));
        let (xt, xr) = both(b, &rf, n, cols, &x);
        let (gt, gr) = both(b, &rf, 1, cols, &gm);
        let (btt, btr) = both(b, &rf, 1, cols, &bt);
        let (mut o, mut orf) = (b.tensor(n, cols), rf.r.tensor(n, cols));
        b.layer_norm(&xt, &gt, &btt, 1e-5, n, &mut o);
        rf.r.layer_norm(&xr, &gr, &btr, 1e-5, n, &mut orf);
        let case = format!("{n}x{cols}");
        check_rel(
            &name,
            "layer_norm",
            &case,
            &read(b, &o, n, cols),
            &read(&rf.r, &orf, n, cols),
            tol.norm,
        );
        b.gelu(&mut o, n);
        rf.r.gelu(&mut orf, n);
        check_rel(
            &name,
            "gelu",
            &case,
            &read(b, &o, n, cols),
            &read(&rf.r, &orf, n, cols),
            tol.elementwise,
        );
    }
}

/// Kokoro's norms: `layer_norm_rows` (affine and not), `ada_in` over (c, len) channels,
/// `ada_layer_norm` over (len, c) steps.
pub fn signal_norms<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2004));
    for (rows, cols, eps) in [(31, 768, 1e-12), (1, 333, 1e-5), (70, 256, 1e-5)] {
        let x: Vec<f32> = rng.v(rows * cols).iter().map(|v| v * 2.0 - 0.3).collect();
        let (w, bb) = (rng.v(cols), rng.v(cols));
        let (wt, wr) = both(b, &rf, 1, cols, &w);
        let (bt, br) = both(b, &rf, 1, cols, &bb);
        for affine in [true, false] {
            let (mut xt, mut xr) = both(b, &rf, rows, cols, &x);
            b.layer_norm_rows(
                &mut xt,
                affine.then_some(&wt),
                affine.then_some(&bt),
                eps,
                rows,
                cols,
            );
            rf.r.layer_norm_rows(
                &mut xr,
                affine.then_some(&wr),
                affine.then_some(&br),
                eps,
                rows,
                cols,
            );
            let case = format!("{rows}x{cols} affine={affine}");
            check_rel(
                &name,
                "layer_norm_rows",
                case,
                &read(b, &xt, rows, cols),
                &read(&rf.r, &xr, rows, cols),
                tol.signal_norm,
            );
        }
    }
    for (c, len) in [(48, 300), (5, 1), (3, 77)] {
        let x: Vec<f32> = rng.v(c * len).iter().map(|v| v * 3.0 + 0.5).collect();
        let gb = rng.v(2 * c);
        let (gbt, gbr) = both(b, &rf, 1, 2 * c, &gb);
        let (mut xt, mut xr) = both(b, &rf, c, len, &x);
        b.ada_in(&mut xt, &gbt, c, len, 1e-5);
        rf.r.ada_in(&mut xr, &gbr, c, len, 1e-5);
        let case = format!("c={c} len={len}");
        check_rel(
            &name,
            "ada_in",
            &case,
            &read(b, &xt, c, len),
            &read(&rf.r, &xr, c, len),
            tol.signal_norm,
        );
        let (mut xt, mut xr) = both(b, &rf, len, c, &x);
        b.ada_layer_norm(&mut xt, &gbt, len, c, 1e-5);
        rf.r.ada_layer_norm(&mut xr, &gbr, len, c, 1e-5);
        check_rel(
            &name,
            "ada_layer_norm",
            &case,
            &read(b, &xt, len, c),
            &read(&rf.r, &xr, len, c),
            tol.signal_norm,
        );
    }
}

/// `add`, `silu_mul`, `scale`, `gelu_tanh`, `leaky_relu` (the value-count ops on a count
/// that ends inside a row) and `snake`.
pub fn elementwise<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2005));
    for (n, cols) in [(1, 333), (3, 256), (70, 96)] {
        let (x, y) = (rng.v(n * cols), rng.v(n * cols));
        let x: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
        let case = format!("{n}x{cols}");
        let count = n * cols - 5;
        let (yt, yr) = both(b, &rf, n, cols, &y);
        type Op<'a, T> = &'a dyn Fn(&mut T);
        // (op, backend, reference, exact: one IEEE operation per value)
        let cases: [(&str, Op<B::Tensor>, Op<CpuTensor>, bool); 5] = [
            ("add", &|t| b.add(t, &yt, n), &|t| rf.r.add(t, &yr, n), true),
            (
                "silu_mul",
                &|t| b.silu_mul(t, &yt, n),
                &|t| rf.r.silu_mul(t, &yr, n),
                false,
            ),
            (
                "scale",
                &|t| b.scale(t, 0.37, count),
                &|t| rf.r.scale(t, 0.37, count),
                true,
            ),
            (
                "gelu_tanh",
                &|t| b.gelu_tanh(t, count),
                &|t| rf.r.gelu_tanh(t, count),
                false,
            ),
            (
                "leaky_relu",
                &|t| b.leaky_relu(t, 0.2, count),
                &|t| rf.r.leaky_relu(t, 0.2, count),
                true,
            ),
        ];
        for (op, fb, fr, exact) in cases {
            let (mut xt, mut xr) = both(b, &rf, n, cols, &x);
            fb(&mut xt);
            fr(&mut xr);
            let (got, want) = (read(b, &xt, n, cols), read(&rf.r, &xr, n, cols));
            match exact {
                true => check_exact(&name, op, &case, &got, &want),
                false => check_rel(&name, op, &case, &got, &want, tol.elementwise),
            }
        }
    }
    for (c, len) in [(48, 300), (3, 1)] {
        let x: Vec<f32> = rng.v(c * len).iter().map(|v| v * 4.0).collect();
        let alpha: Vec<f32> = rng.v(c).iter().map(|v| 0.3 + v.abs()).collect();
        let (at, ar) = both(b, &rf, 1, c, &alpha);
        let (mut xt, mut xr) = both(b, &rf, c, len, &x);
        b.snake(&mut xt, &at, c, len);
        rf.r.snake(&mut xr, &ar, c, len);
        check_rel(
            &name,
            "snake",
            format!("c={c} len={len}"),
            &read(b, &xt, c, len),
            &read(&rf.r, &xr, c, len),
            tol.elementwise,
        );
    }
}

/// `copy_row`, `copy_rows`, `transpose`, `upsample_nearest`: exact.
pub fn copies<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x2006));
    for cols in [333, 64] {
        let (src, dst) = (rng.v(5 * cols), rng.v(4 * cols));
        let (st, sr) = both(b, &rf, 5, cols, &src);
        let (mut dt, mut dr) = both(b, &rf, 4, cols, &dst);
        b.copy_rows(&st, 1, 3, &mut dt, 1);
        rf.r.copy_rows(&sr, 1, 3, &mut dr, 1);
        check_exact(
            &name,
            "copy_rows",
            format!("3 of 5x{cols} to row 1"),
            &read(b, &dt, 4, cols),
            &read(&rf.r, &dr, 4, cols),
        );
        b.copy_row(&st, 4, &mut dt);
        rf.r.copy_row(&sr, 4, &mut dr);
        check_exact(
            &name,
            "copy_row",
            format!("row 4 of 5x{cols}"),
            &read(b, &dt, 4, cols),
            &read(&rf.r, &dr, 4, cols),
        );
    }
    for (rows, cols) in [(33, 75), (1, 7), (64, 48)] {
        let x = rng.v(rows * cols);
        let (xt, xr) = both(b, &rf, rows, cols, &x);
        let (mut o, mut orf) = (b.tensor(cols, rows), rf.r.tensor(cols, rows));
        b.transpose(&xt, rows, cols, &mut o);
        rf.r.transpose(&xr, rows, cols, &mut orf);
        check_exact(
            &name,
            "transpose",
            format!("{rows}x{cols}"),
            &read(b, &o, cols, rows),
            &read(&rf.r, &orf, cols, rows),
        );
    }
    for (c, len, factor) in [(5, 17, 3), (1, 1, 2), (48, 300, 2)] {
        let x = rng.v(c * len);
        let (xt, xr) = both(b, &rf, c, len, &x);
        let (mut o, mut orf) = (b.tensor(c, len * factor), rf.r.tensor(c, len * factor));
        b.upsample_nearest(&xt, c, len, factor, &mut o);
        rf.r.upsample_nearest(&xr, c, len, factor, &mut orf);
        let case = format!("c={c} len={len} x{factor}");
        check_exact(
            &name,
            "upsample_nearest",
            case,
            &read(b, &o, c, len * factor),
            &read(&rf.r, &orf, c, len * factor),
        );
    }
}

/// `argmax_rows`: the first of equal maxima, within a row's first columns only, rows longer
/// than any one workgroup's part; exact.
pub fn argmax_rows<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, mut rng) = (b.name(), Rng(0x2007));
    let cols = 70001;
    let mut l = rng.v(3 * cols);
    l[5] = 9.0;
    l[900] = 9.0;
    l[cols + 69999] = 3.0;
    l[cols + 12295] = 3.0;
    l[2 * cols + 3] = 5.0;
    l[2 * cols + 69000] = 9.0;
    let t = b.tensor_from(3, cols, &l);
    let want = |n: usize, c: usize| -> Vec<u32> {
        l.chunks_exact(cols)
            .take(n)
            .map(|r| crate::argmax_first(&r[..c]))
            .collect()
    };
    for (n, c) in [(3, cols), (1, cols), (3, 60000), (1, 800), (2, 1)] {
        let got = b.argmax_rows(&t, n, c);
        assert_eq!(
            got,
            want(n, c),
            "{name}: argmax_rows [{n} rows, first {c} of {cols} columns]: exact"
        );
    }
}

/// `top_candidates` where the backend selects: the row's top k under `f32::total_cmp` (ties
/// by the lower column; a NaN, infinities, a negative zero) among what it returns.
pub fn top_candidates<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, mut rng) = (b.name(), Rng(0x2008));
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    for (cols, k) in [
        (151936, 40),
        (151936, 1),
        (5000, 256),
        (100, 40),
        (3000, 2048),
    ] {
        let mut v: Vec<f32> = rng
            .v(cols)
            .iter()
            .map(|x| (x * 30.0).floor() / 4.0)
            .collect();
        v[cols / 3] = f32::NAN;
        v[cols / 2] = f32::INFINITY;
        v[cols - 1] = f32::NEG_INFINITY;
        v[0] = -0.0;
        let x = b.tensor_from(1, cols, &v);
        let mut got = Vec::new();
        if !b.top_candidates(&x, cols, k, &mut got) {
            declined(
                &name,
                "top_candidates",
                format!("{cols} columns, k={k}"),
                "the backend does not select (returns false)",
            );
            continue;
        }
        got.sort_by(order);
        got.truncate(k);
        let mut want: Vec<(f32, u32)> = v.iter().enumerate().map(|(i, &l)| (l, i as u32)).collect();
        want.sort_by(order);
        want.truncate(k);
        let bits = |x: &[(f32, u32)]| x.iter().map(|&(l, i)| (l.to_bits(), i)).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{name}: top_candidates [{cols} columns, k={k}]: exact"
        );
    }
}

// ---- RoPE and attention ----

fn rope_cfg(style: RopeStyle, dims: usize, head_dim: usize, scaling: RopeScaling) -> RopeConfig {
    RopeConfig {
        style,
        dims,
        head_dim,
        theta: 10000.0,
        scaling,
    }
}

/// `rope`: both styles, partial rotation, Llama 3 and per-frequency scaling, heads of 64,
/// 128 and 80, at positions 0 to 4000, 1 to 70 tokens.
pub fn rope<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3001));
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_ctx: 8192.0,
    };
    let factors = RopeScaling::Factors((0..40).map(|i| 1.0 + i as f32 / 10.0).collect());
    for cfg in [
        rope_cfg(RopeStyle::Neox, 64, 64, RopeScaling::None),
        rope_cfg(RopeStyle::Interleaved, 128, 128, RopeScaling::None),
        rope_cfg(RopeStyle::Neox, 64, 128, llama3),
        rope_cfg(RopeStyle::Neox, 80, 80, factors),
        rope_cfg(RopeStyle::Interleaved, 32, 64, RopeScaling::None),
    ] {
        let heads = 3;
        let cols = heads * cfg.head_dim;
        for (pos0, n) in [(0, 1), (0, 70), (130, 9), (4000, 1)] {
            let x = rng.v(n * cols);
            let (mut xt, mut xr) = both(b, &rf, n, cols, &x);
            b.rope(&mut xt, &cfg, heads, pos0, n);
            rf.r.rope(&mut xr, &cfg, heads, pos0, n);
            let case = format!(
                "{:?} dims={} hd={} {:?} pos0={pos0} n={n}",
                cfg.style,
                cfg.dims,
                cfg.head_dim,
                std::mem::discriminant(&cfg.scaling)
            );
            check_rel(
                &name,
                "rope",
                case,
                &read(b, &xt, n, cols),
                &read(&rf.r, &xr, n, cols),
                tol.rope,
            );
        }
    }
}

/// Attention shapes: (heads, kv_heads, head_dim, qk_norm, rope style, rotated dims): groups
/// of 4, 1, 3, 1 and 8, heads of 128, 64, 80, one rotated in part.
const ATTN_SHAPES: [(usize, usize, usize, bool, RopeStyle, usize); 5] = [
    (8, 2, 128, true, RopeStyle::Neox, 128),
    (6, 6, 64, false, RopeStyle::Interleaved, 64),
    (12, 4, 64, false, RopeStyle::Neox, 32),
    (8, 8, 80, false, RopeStyle::Neox, 80),
    (16, 2, 64, true, RopeStyle::Neox, 64),
];

/// The backend's cache of `ty` and the reference's cache of the type the backend stores, or
/// None after a line saying why the backend does not run this shape or type.
fn caches<B: Backend>(
    b: &B,
    rf: &Ref,
    op: &str,
    (layers, n_ctx, heads, kvh, hd): (usize, usize, usize, usize, usize),
    ty: KvType,
) -> Option<(B::KvCache, crate::cpu::CpuKvCache)> {
    let (name, case) = (
        b.name(),
        format!("heads={heads}/{kvh} hd={hd} kv={}", ty.name()),
    );
    if let Err(e) = b.check_attention(heads, kvh, hd) {
        assert!(is_unsupported(&e), "{name}: check_attention [{case}]: {e}");
        declined(&name, op, &case, e);
        return None;
    }
    let cb = match b.kv_cache_typed(layers, n_ctx, kvh, hd, ty) {
        Ok(c) => c,
        Err(e) if is_unsupported(&e) => {
            declined(&name, op, &case, e);
            return None;
        }
        Err(e) => panic!("{name}: kv_cache_typed [{case}]: {e}"),
    };
    let stored = b.kv_type_stored(ty);
    let cr =
        rf.r.kv_cache_typed(layers, n_ctx, kvh, hd, stored)
            .unwrap_or_else(|e| panic!("the reference cache of {}: {e}", stored.name()));
    Some((cb, cr))
}

/// `qk_norm_rope_store` (with and without the per-head norm) then `attention`, every KV
/// type: a prompt of 130 at 0, 9 at 130, then two single tokens; for the first shape
/// a context past 512 instead (300 at 0, 37, 1, 250 and 1: key chunks and decode splits
/// with the softmax carried across them); q and k as rotated, and the attention output.
pub fn attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3002));
    for (si, (heads, kvh, hd, qk, style, dims)) in ATTN_SHAPES.into_iter().enumerate() {
        let steps: &[usize] = if si == 0 {
            &[300, 37, 1, 250, 1]
        } else {
            &[130, 9, 1, 1]
        };
        let n_ctx = steps.iter().sum::<usize>() + 8;
        for ty in KV_TYPES {
            let Some((mut cb, mut cr)) =
                caches(b, &rf, "attention", (2, n_ctx, heads, kvh, hd), ty)
            else {
                continue;
            };
            let rope = rope_cfg(style, dims, hd, RopeScaling::None);
            let (qn, kn) = (rng.v(hd), rng.v(hd));
            let (qnt, qnr) = both(b, &rf, 1, hd, &qn);
            let (knt, knr) = both(b, &rf, 1, hd, &kn);
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos0 = 0;
            for &n in steps {
                let (q, k, v) = (rng.v(n * qd), rng.v(n * kd), rng.v(n * kd));
                let (mut qt, mut qr) = both(b, &rf, n, qd, &q);
                let (mut kt, mut kr) = both(b, &rf, n, kd, &k);
                let (vt, vr) = both(b, &rf, n, kd, &v);
                let nb = qk.then_some((&qnt, &knt, 1e-6));
                let nr = qk.then_some((&qnr, &knr, 1e-6));
                b.qk_norm_rope_store(
                    &mut qt, &mut kt, &vt, nb, &rope, heads, kvh, &mut cb, 1, pos0, n,
                );
                rf.r.qk_norm_rope_store(
                    &mut qr, &mut kr, &vr, nr, &rope, heads, kvh, &mut cr, 1, pos0, n,
                );
                let case = format!("heads={heads}/{kvh} hd={hd} rope dims={dims} qk_norm={qk} kv={} pos0={pos0} n={n}", ty.name());
                let op = "qk_norm_rope_store";
                check_rel(
                    &name,
                    op,
                    format!("{case} q"),
                    &read(b, &qt, n, qd),
                    &read(&rf.r, &qr, n, qd),
                    tol.rope,
                );
                check_rel(
                    &name,
                    op,
                    format!("{case} k"),
                    &read(b, &kt, n, kd),
                    &read(&rf.r, &kr, n, kd),
                    tol.rope,
                );
                let shape = AttnShape {
                    n_heads: heads,
                    n_kv_heads: kvh,
                    head_dim: hd,
                    pos0,
                    n_tokens: n,
                };
                let (mut o, mut orf) = (b.tensor(n, qd), rf.r.tensor(n, qd));
                b.attention(&qt, &cb, 1, shape, &mut o);
                rf.r.attention(&qr, &cr, 1, shape, &mut orf);
                check_rel(
                    &name,
                    "attention",
                    case,
                    &read(b, &o, n, qd),
                    &read(&rf.r, &orf, n, qd),
                    kv_bound(tol, ty),
                );
                pos0 += n;
            }
        }
    }
}

fn kv_bound(tol: &Tolerances, ty: KvType) -> f32 {
    match ty {
        KvType::F32 => tol.attention,
        KvType::F16 | KvType::Q8_0 => tol.attention_packed,
    }
}

/// Sequence lengths before the steps of the batched tests, and the steps' token counts.
const SEQ_LENS: [usize; 4] = [5, 300, 41, 1];
const SEQ_CTX: [usize; 4] = [64, 400, 128, 32];
const SEQ_STEPS: [[usize; 4]; 3] = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 7, 1, 3]];

/// Several sequences' caches on the backend and the reference, their prompts stored (other
/// values in layer 0, so a layer mix-up shows).
#[allow(clippy::type_complexity)]
fn seq_caches<B: Backend>(
    b: &B,
    rf: &Ref,
    op: &str,
    (heads, kvh, hd): (usize, usize, usize),
    ty: KvType,
    rng: &mut Rng,
    copies: usize,
) -> Option<(Vec<Vec<B::KvCache>>, Vec<crate::cpu::CpuKvCache>)> {
    let kd = kvh * hd;
    let mut cb: Vec<Vec<B::KvCache>> = (0..copies).map(|_| Vec::new()).collect();
    let mut cr = Vec::new();
    for (i, &n) in SEQ_LENS.iter().enumerate() {
        for c in cb.iter_mut() {
            c.push(caches(b, rf, op, (2, SEQ_CTX[i], heads, kvh, hd), ty)?.0);
        }
        cr.push(caches(b, rf, op, (2, SEQ_CTX[i], heads, kvh, hd), ty)?.1);
        for layer in 0..2 {
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, kr) = both(b, rf, n, kd, &k);
            let (vt, vr) = both(b, rf, n, kd, &v);
            for c in cb.iter_mut() {
                b.kv_store(&mut c[i], layer, &kt, &vt, 0, n);
            }
            rf.r.kv_store(&mut cr[i], layer, &kr, &vr, 0, n);
        }
    }
    Some((cb, cr))
}

/// `kv_store` and `attention_batch` over four sequences (own caches, lengths 1 to 300): two
/// decode steps and a mixed one, against the reference; each sequence's rows exactly what
/// `attention` gives it alone (the trait's contract).
pub fn attention_batch<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3003));
    for (heads, kvh, hd, _, _, _) in [ATTN_SHAPES[0], ATTN_SHAPES[2], ATTN_SHAPES[3]] {
        for ty in KV_TYPES {
            let Some((mut cb, mut cr)) =
                seq_caches(b, &rf, "attention_batch", (heads, kvh, hd), ty, &mut rng, 1)
            else {
                continue;
            };
            let mut cb = cb.pop().unwrap();
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos = SEQ_LENS;
            for tokens in SEQ_STEPS {
                let rows: usize = tokens.iter().sum();
                let shapes: Vec<AttnShape> = (0..4)
                    .map(|i| AttnShape {
                        n_heads: heads,
                        n_kv_heads: kvh,
                        head_dim: hd,
                        pos0: pos[i],
                        n_tokens: tokens[i],
                    })
                    .collect();
                for i in 0..4 {
                    let n = tokens[i];
                    let (k, v) = (rng.v(n * kd), rng.v(n * kd));
                    let (kt, kr) = both(b, &rf, n, kd, &k);
                    let (vt, vr) = both(b, &rf, n, kd, &v);
                    b.kv_store(&mut cb[i], 1, &kt, &vt, pos[i], n);
                    rf.r.kv_store(&mut cr[i], 1, &kr, &vr, pos[i], n);
                }
                let q = rng.v(rows * qd);
                let (qt, qr) = both(b, &rf, rows, qd, &q);
                let (mut o, mut orf) = (b.tensor(rows, qd), rf.r.tensor(rows, qd));
                b.attention_batch(&qt, cb.iter().zip(shapes.iter().copied()), 1, &mut o);
                rf.r.attention_batch(&qr, cr.iter().zip(shapes.iter().copied()), 1, &mut orf);
                let got = read(b, &o, rows, qd);
                let case = format!(
                    "heads={heads}/{kvh} hd={hd} kv={} tokens={tokens:?}",
                    ty.name()
                );
                check_rel(
                    &name,
                    "attention_batch",
                    &case,
                    &got,
                    &read(&rf.r, &orf, rows, qd),
                    kv_bound(tol, ty),
                );
                let mut r0 = 0;
                for i in 0..4 {
                    let n = tokens[i];
                    let mut oa = b.tensor(n, qd);
                    b.attention(
                        &b.tensor_from(n, qd, &q[r0 * qd..(r0 + n) * qd]),
                        &cb[i],
                        1,
                        shapes[i],
                        &mut oa,
                    );
                    let op = "attention_batch vs attention alone";
                    check_exact(
                        &name,
                        op,
                        format!("{case} sequence {i}"),
                        &got[r0 * qd..(r0 + n) * qd],
                        &read(b, &oa, n, qd),
                    );
                    r0 += n;
                    pos[i] += n;
                }
            }
        }
    }
}

/// One `qk_norm_rope_attention` over the sequences whose rows of q, k, v are stacked.
fn step_seqs<B: Backend>(
    b: &B,
    caches: &mut [B::KvCache],
    shapes: &[AttnShape],
    [q, k, v]: [&[f32]; 3],
    norms: Option<(&B::Tensor, &B::Tensor, f32)>,
    rope: &RopeConfig,
) -> Vec<f32> {
    let s = shapes[0];
    let (qd, kd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let rows: usize = shapes.iter().map(|s| s.n_tokens).sum();
    let (mut qt, mut kt, vt) = (
        b.tensor_from(rows, qd, q),
        b.tensor_from(rows, kd, k),
        b.tensor_from(rows, kd, v),
    );
    let mut out = b.tensor(rows, qd);
    let mut seqs: Vec<_> = caches
        .iter_mut()
        .zip(shapes)
        .map(|(cache, &shape)| SeqKv { cache, shape })
        .collect();
    let (mut t0, mut t1, mut t2) = (b.tensor(rows, qd), b.tensor(rows, kd), b.tensor(rows, kd));
    b.qk_norm_rope_attention(
        &mut qt,
        &mut kt,
        &vt,
        norms,
        rope,
        &mut seqs,
        1,
        &mut out,
        [&mut t0, &mut t1, &mut t2],
    );
    read(b, &out, rows, qd)
}

/// `qk_norm_rope_attention` over four sequences (two decode steps, then a prompt chunk beside
/// decode tokens), with and without the per-head norm, against the reference; in a decode
/// step each sequence's rows are bit for bit what it gets alone.
pub fn qk_norm_rope_attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3004));
    for (heads, kvh, hd, qk, style, dims) in [ATTN_SHAPES[0], ATTN_SHAPES[1], ATTN_SHAPES[3]] {
        for ty in KV_TYPES {
            let op = "qk_norm_rope_attention";
            let Some((mut cb, mut cr)) = seq_caches(b, &rf, op, (heads, kvh, hd), ty, &mut rng, 2)
            else {
                continue;
            };
            let (mut alone, mut cb) = (cb.pop().unwrap(), cb.pop().unwrap());
            let rope = rope_cfg(style, dims, hd, RopeScaling::None);
            let (qn, kn) = (rng.v(hd), rng.v(hd));
            let (qnt, qnr) = both(b, &rf, 1, hd, &qn);
            let (knt, knr) = both(b, &rf, 1, hd, &kn);
            let nb = qk.then_some((&qnt, &knt, 1e-6));
            let nr = qk.then_some((&qnr, &knr, 1e-6));
            let (qd, kd) = (heads * hd, kvh * hd);
            let mut pos = SEQ_LENS;
            for tokens in SEQ_STEPS {
                let rows: usize = tokens.iter().sum();
                let (q, k, v) = (rng.v(rows * qd), rng.v(rows * kd), rng.v(rows * kd));
                let shapes: Vec<AttnShape> = (0..4)
                    .map(|i| AttnShape {
                        n_heads: heads,
                        n_kv_heads: kvh,
                        head_dim: hd,
                        pos0: pos[i],
                        n_tokens: tokens[i],
                    })
                    .collect();
                let got = step_seqs(b, &mut cb, &shapes, [&q, &k, &v], nb, &rope);
                let want = step_seqs(&rf.r, &mut cr, &shapes, [&q, &k, &v], nr, &rope);
                let case = format!(
                    "heads={heads}/{kvh} hd={hd} qk_norm={qk} kv={} tokens={tokens:?}",
                    ty.name()
                );
                check_rel(&name, op, &case, &got, &want, kv_bound(tol, ty));
                let mut r0 = 0;
                for i in 0..4 {
                    let n = tokens[i];
                    let part = |x: &[f32], d: usize| x[r0 * d..(r0 + n) * d].to_vec();
                    let one = [part(&q, qd), part(&k, kd), part(&v, kd)];
                    let a = step_seqs(
                        b,
                        std::slice::from_mut(&mut alone[i]),
                        &shapes[i..=i],
                        [&one[0], &one[1], &one[2]],
                        nb,
                        &rope,
                    );
                    let g = &got[r0 * qd..(r0 + n) * qd];
                    let case = format!("{case} sequence {i}");
                    if tokens == [1, 1, 1, 1] {
                        check_exact(
                            &name,
                            "qk_norm_rope_attention batched vs alone",
                            case,
                            g,
                            &a,
                        );
                    } else {
                        check_rel(
                            &name,
                            "qk_norm_rope_attention batched vs alone",
                            case,
                            g,
                            &a,
                            kv_bound(tol, ty),
                        );
                    }
                    r0 += n;
                    pos[i] += n;
                }
            }
        }
    }
}

/// `kv_copy`: a fork's attention over the copied positions is exactly the source's.
pub fn kv_copy<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3005));
    let (heads, kvh, hd, _, _, _) = ATTN_SHAPES[0];
    let (qd, kd, n) = (heads * hd, kvh * hd, 41);
    for ty in KV_TYPES {
        let dims = (2, 64, heads, kvh, hd);
        let (Some((mut src, mut src_r)), Some((mut dst, mut dst_r))) = (
            caches(b, &rf, "kv_copy", dims, ty),
            caches(b, &rf, "kv_copy", dims, ty),
        ) else {
            continue;
        };
        for layer in 0..2 {
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, kr) = both(b, &rf, n, kd, &k);
            let (vt, vr) = both(b, &rf, n, kd, &v);
            b.kv_store(&mut src, layer, &kt, &vt, 0, n);
            rf.r.kv_store(&mut src_r, layer, &kr, &vr, 0, n);
        }
        b.kv_copy(&src, &mut dst, n);
        rf.r.kv_copy(&src_r, &mut dst_r, n);
        let shape = AttnShape {
            n_heads: heads,
            n_kv_heads: kvh,
            head_dim: hd,
            pos0: n - 3,
            n_tokens: 3,
        };
        let q = rng.v(3 * qd);
        let (qt, qr) = both(b, &rf, 3, qd, &q);
        let case = format!("{n} positions, kv={}", ty.name());
        for layer in 0..2 {
            let (mut os, mut od, mut orf) = (b.tensor(3, qd), b.tensor(3, qd), rf.r.tensor(3, qd));
            b.attention(&qt, &src, layer, shape, &mut os);
            b.attention(&qt, &dst, layer, shape, &mut od);
            rf.r.attention(&qr, &dst_r, layer, shape, &mut orf);
            let got = read(b, &od, 3, qd);
            check_exact(
                &name,
                "kv_copy",
                format!("{case} layer {layer} copy vs source"),
                &got,
                &read(b, &os, 3, qd),
            );
            check_rel(
                &name,
                "kv_copy",
                format!("{case} layer {layer}"),
                &got,
                &read(&rf.r, &orf, 3, qd),
                kv_bound(tol, ty),
            );
        }
    }
}

/// `attention_dense`: an encoder's (many queries), cross-attention's (a few over 1500 keys),
/// causal and not, heads of 64 and 80.
pub fn attention_dense<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3006));
    for (heads, hd, n_q, n_kv, causal) in [
        (6, 64, 300, 300, false),
        (6, 64, 150, 150, false),
        (6, 64, 75, 75, true),
        (3, 64, 37, 200, true),
        (6, 64, 1, 1500, false),
        (6, 64, 2, 1500, false),
        (6, 64, 3, 1500, false),
        (4, 64, 5, 40, true),
        (2, 80, 5, 40, true),
    ] {
        let d = heads * hd;
        let (q, k, v) = (rng.v(n_q * d), rng.v(n_kv * d), rng.v(n_kv * d));
        let shape = DenseAttnShape {
            heads,
            head_dim: hd,
            n_q,
            n_kv,
            causal,
        };
        let (qt, qr) = both(b, &rf, n_q, d, &q);
        let (kt, kr) = both(b, &rf, n_kv, d, &k);
        let (vt, vr) = both(b, &rf, n_kv, d, &v);
        let (mut o, mut orf) = (b.tensor(n_q, d), rf.r.tensor(n_q, d));
        b.attention_dense(&qt, &kt, &vt, shape, &mut o);
        rf.r.attention_dense(&qr, &kr, &vr, shape, &mut orf);
        let case = format!("heads={heads} hd={hd} n_q={n_q} n_kv={n_kv} causal={causal}");
        check_rel(
            &name,
            "attention_dense",
            case,
            &read(b, &o, n_q, d),
            &read(&rf.r, &orf, n_q, d),
            tol.attention_dense,
        );
    }
}

/// `self_attention` (a BERT's, unmasked): heads of 64 and 80, 1 to 40 positions.
pub fn self_attention<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x3007));
    for (heads, hd, len) in [(12, 64, 40), (4, 80, 7), (2, 64, 1)] {
        let d = heads * hd;
        let (q, k, v) = (rng.v(len * d), rng.v(len * d), rng.v(len * d));
        let (qt, qr) = both(b, &rf, len, d, &q);
        let (kt, kr) = both(b, &rf, len, d, &k);
        let (vt, vr) = both(b, &rf, len, d, &v);
        let (mut o, mut orf) = (b.tensor(len, d), rf.r.tensor(len, d));
        b.self_attention(&qt, &kt, &vt, heads, hd, len, &mut o);
        rf.r.self_attention(&qr, &kr, &vr, heads, hd, len, &mut orf);
        let case = format!("heads={heads} hd={hd} len={len}");
        check_rel(
            &name,
            "self_attention",
            case,
            &read(b, &o, len, d),
            &read(&rf.r, &orf, len, d),
            tol.attention_dense,
        );
    }
}

// ---- convolutions, recurrences, signal ----

/// Whisper's time-major `conv1d` (kernel 3, pad 1, strides 1 and 2, with and without a
/// bias), f32 and f16 weights.
pub fn conv1d<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4001));
    for (t_in, c_in, c_out, k) in [(37, 20, 24, 3), (150, 80, 64, 3), (1, 8, 16, 3)] {
        for ty in [GgmlType::F32, GgmlType::F16] {
            let bytes = weight_data(ty, c_out, c_in * k, &mut rng);
            let Some(wb) = load(b, "conv1d", ty, c_out, c_in * k, &bytes) else {
                continue;
            };
            let wr = rf.load(ty, c_out, c_in * k, &bytes);
            let (bias, x) = (rng.v(c_out), rng.v(t_in * c_in));
            let (bt, br) = both(b, &rf, 1, c_out, &bias);
            let (xt, xr) = both(b, &rf, t_in, c_in, &x);
            for (stride, with_bias) in [(1, true), (2, true), (1, false)] {
                let (mut o, mut orf) = (b.tensor(t_in, c_out), rf.r.tensor(t_in, c_out));
                let tb = b.conv1d(
                    &wb,
                    with_bias.then_some(&bt),
                    &xt,
                    t_in,
                    k,
                    stride,
                    1,
                    &mut o,
                );
                let tr = rf.r.conv1d(
                    &wr,
                    with_bias.then_some(&br),
                    &xr,
                    t_in,
                    k,
                    stride,
                    1,
                    &mut orf,
                );
                let case = format!("{} t_in={t_in} c_in={c_in} c_out={c_out} k={k} stride={stride} bias={with_bias}", ty.name());
                assert_eq!(tb, tr, "{name}: conv1d [{case}]: output length");
                // A product over the im2col rows: f16 weights may take the backend's prompt
                // product (f16 activations on tensor cores), which the product bound holds.
                let bound = if ty == GgmlType::F16 {
                    tol.product
                } else {
                    tol.conv
                };
                check_rel(
                    &name,
                    "conv1d",
                    case,
                    &read(b, &o, tb, c_out),
                    &read(&rf.r, &orf, tr, c_out),
                    bound,
                );
            }
        }
    }
}

fn conv(
    c_in: usize,
    c_out: usize,
    len_in: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    groups: usize,
    output_pad: usize,
) -> Conv1dShape {
    Conv1dShape {
        c_in,
        c_out,
        len_in,
        k,
        stride,
        pad,
        dilation,
        groups,
        output_pad,
    }
}

/// `conv1d_nc` (plain, dilated, strided, grouped, depthwise) and `conv_transpose1d` (and its
/// packed weight where the backend makes one), with and without a bias.
pub fn conv1d_nc<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4002));
    for (s, transposed) in [
        (conv(64, 48, 300, 7, 1, 9, 3, 1, 0), false),
        (conv(32, 32, 257, 1, 1, 0, 1, 1, 0), false),
        (conv(16, 24, 101, 3, 2, 1, 1, 1, 0), false),
        (conv(24, 24, 99, 3, 1, 1, 1, 24, 0), false),
        (conv(16, 8, 50, 5, 1, 2, 1, 2, 0), false),
        (conv(64, 32, 40, 20, 10, 5, 1, 1, 0), true),
        (conv(24, 24, 33, 3, 2, 1, 1, 24, 1), true),
        (conv(16, 8, 20, 4, 2, 1, 1, 1, 1), true),
    ] {
        let (wr_rows, wr_cols) = match transposed {
            false => (s.c_out, s.c_in / s.groups * s.k),
            true => (s.c_in, s.c_out / s.groups * s.k),
        };
        let lo = if transposed {
            s.len_out_transposed()
        } else {
            s.len_out()
        };
        let (x, w, bias) = (
            rng.v(s.c_in * s.len_in),
            rng.v(wr_rows * wr_cols),
            rng.v(s.c_out),
        );
        let (xt, xr) = both(b, &rf, s.c_in, s.len_in, &x);
        let (wt, wr) = both(b, &rf, wr_rows, wr_cols, &w);
        let (bt, br) = both(b, &rf, 1, s.c_out, &bias);
        let packed = transposed.then(|| b.conv_transpose_weight(&w, s)).flatten();
        if transposed && packed.is_none() {
            declined(
                &name,
                "conv_transpose1d_packed",
                format!("{s:?}"),
                "conv_transpose_weight gives None",
            );
        }
        for with_bias in [true, false] {
            let (bo, bro) = (with_bias.then_some(&bt), with_bias.then_some(&br));
            let (mut o, mut orf) = (b.tensor(s.c_out, lo), rf.r.tensor(s.c_out, lo));
            match transposed {
                true => rf.r.conv_transpose1d(&xr, &wr, bro, s, &mut orf),
                false => rf.r.conv1d_nc(&xr, &wr, bro, s, &mut orf),
            }
            let want = read(&rf.r, &orf, s.c_out, lo);
            let case = format!("{s:?} bias={with_bias}");
            match transposed {
                true => b.conv_transpose1d(&xt, &wt, bo, s, &mut o),
                false => b.conv1d_nc(&xt, &wt, bo, s, &mut o),
            }
            let op = if transposed {
                "conv_transpose1d"
            } else {
                "conv1d_nc"
            };
            check_rel(&name, op, &case, &read(b, &o, s.c_out, lo), &want, tol.conv);
            if let Some(p) = &packed {
                let mut o = b.tensor(s.c_out, lo);
                b.conv_transpose1d_packed(&xt, p, bo, s, &mut o);
                check_rel(
                    &name,
                    "conv_transpose1d_packed",
                    &case,
                    &read(b, &o, s.c_out, lo),
                    &want,
                    tol.conv,
                );
            }
        }
    }
}

/// `conv1d_q8` and `ada_in_snake_conv1d_q8` where the backend makes an integer weight
/// (`conv_weight_q8`), against the reference's route: `fake_quant_u8` of the input and
/// `conv1d_nc` on the dequantized weight; per-tensor and per-channel zero points.
pub fn conv1d_q8<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4003));
    for (s, per_channel) in [
        (conv(64, 48, 300, 7, 1, 9, 3, 1, 0), false),
        (conv(32, 32, 257, 1, 1, 0, 1, 1, 0), true),
        (conv(16, 24, 101, 3, 2, 1, 1, 1, 0), true),
    ] {
        let nw = s.c_out * s.c_in * s.k;
        let q: Vec<u8> = (0..nw).map(|_| rng.next() as u8).collect();
        let np = if per_channel { s.c_out } else { 1 };
        let zero: Vec<i32> = (0..np).map(|_| 100 + (rng.next() % 56) as i32).collect();
        let scale: Vec<f32> = (0..np).map(|_| 0.002 + rng.f().abs() * 0.004).collect();
        let case = format!("{s:?} per_channel={per_channel}");
        let Some(wq) = b.conv_weight_q8(
            ConvWeightQ8 {
                q: &q,
                zero: &zero,
                scale: &scale,
            },
            s,
        ) else {
            declined(
                &name,
                "conv1d_q8",
                &case,
                "conv_weight_q8 gives None (no integer kernel)",
            );
            continue;
        };
        let wd: Vec<f32> = (0..nw)
            .map(|i| {
                let o = i / (s.c_in * s.k);
                let (z, sc) = if per_channel {
                    (zero[o], scale[o])
                } else {
                    (zero[0], scale[0])
                };
                (q[i] as i32 - z) as f32 * sc
            })
            .collect();
        let wr = rf.t(s.c_out, s.c_in * s.k, &wd);
        let (x, bias) = (rng.v(s.c_in * s.len_in), rng.v(s.c_out));
        let x: Vec<f32> = x.iter().map(|v| v * 2.0 + 0.3).collect();
        let (bt, br) = both(b, &rf, 1, s.c_out, &bias);
        let lo = s.len_out();
        // The reference route from `x` (already through ada_in/snake where those apply).
        let want_from = |xr: &mut CpuTensor| {
            rf.r.fake_quant_u8(xr, s.c_in * s.len_in);
            let mut o = rf.r.tensor(s.c_out, lo);
            rf.r.conv1d_nc(xr, &wr, Some(&br), s, &mut o);
            read(&rf.r, &o, s.c_out, lo)
        };
        let (xt, mut xr) = both(b, &rf, s.c_in, s.len_in, &x);
        let mut o = b.tensor(s.c_out, lo);
        b.conv1d_q8(&xt, &wq, Some(&bt), s, &mut o);
        let want = want_from(&mut xr);
        check_rel(
            &name,
            "conv1d_q8",
            &case,
            &read(b, &o, s.c_out, lo),
            &want,
            tol.conv,
        );
        let gb = rng.v(2 * s.c_in);
        let alpha: Vec<f32> = rng.v(s.c_in).iter().map(|v| 0.3 + v.abs()).collect();
        let (gbt, gbr) = both(b, &rf, 1, 2 * s.c_in, &gb);
        let (at, ar) = both(b, &rf, 1, s.c_in, &alpha);
        for (with_alpha, accumulate) in [(true, false), (false, true)] {
            let start = rng.v(s.c_out * lo);
            let mut o = b.tensor_from(s.c_out, lo, &start);
            b.ada_in_snake_conv1d_q8(
                &xt,
                &gbt,
                with_alpha.then_some(&at),
                1e-5,
                &wq,
                Some(&bt),
                s,
                accumulate,
                &mut o,
            );
            let mut xr = rf.t(s.c_in, s.len_in, &x);
            rf.r.ada_in(&mut xr, &gbr, s.c_in, s.len_in, 1e-5);
            if with_alpha {
                rf.r.snake(&mut xr, &ar, s.c_in, s.len_in);
            }
            let mut want = want_from(&mut xr);
            if accumulate {
                want = added(&want, &start);
            }
            let case = format!("{case} snake={with_alpha} accumulate={accumulate}");
            check_rel(
                &name,
                "ada_in_snake_conv1d_q8",
                case,
                &read(b, &o, s.c_out, lo),
                &want,
                tol.conv,
            );
        }
    }
}

/// `lstm` (both directions, written at a column offset) and `bilstm_steps`.
pub fn lstm<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4004));
    for (len, n_in, h) in [(17, 24, 16), (1, 8, 40), (50, 64, 64)] {
        let x = rng.v(len * n_in);
        let (xt, xr) = both(b, &rf, len, n_in, &x);
        let (wih, whh, bias) = (rng.v(4 * h * n_in), rng.v(4 * h * h), rng.v(4 * h));
        let (wiht, wihr) = both(b, &rf, 4 * h, n_in, &wih);
        let (whht, whhr) = both(b, &rf, 4 * h, h, &whh);
        let (bt, br) = both(b, &rf, 1, 4 * h, &bias);
        let (mut o, mut orf) = (b.tensor(len, 2 * h), rf.r.tensor(len, 2 * h));
        for (reverse, out_col) in [(false, 0), (true, h)] {
            let s = LstmShape {
                len,
                n_in,
                hidden: h,
                reverse,
                out_col,
            };
            b.lstm(&xt, &wiht, &whht, &bt, s, &mut o);
            rf.r.lstm(&xr, &wihr, &whhr, &br, s, &mut orf);
        }
        let case = format!("len={len} n_in={n_in} hidden={h}");
        check_rel(
            &name,
            "lstm",
            &case,
            &read(b, &o, len, 2 * h),
            &read(&rf.r, &orf, len, 2 * h),
            tol.lstm,
        );
        let (gx, w2) = (rng.v(len * 8 * h), rng.v(2 * h * 4 * h));
        let (gxt, gxr) = both(b, &rf, len, 8 * h, &gx);
        let (w2t, w2r) = both(b, &rf, 2 * h, 4 * h, &w2);
        let (mut o, mut orf) = (b.tensor(len, 2 * h), rf.r.tensor(len, 2 * h));
        b.bilstm_steps(&gxt, &w2t, len, h, &mut o);
        rf.r.bilstm_steps(&gxr, &w2r, len, h, &mut orf);
        check_rel(
            &name,
            "bilstm_steps",
            &case,
            &read(b, &o, len, 2 * h),
            &read(&rf.r, &orf, len, 2 * h),
            tol.lstm,
        );
    }
}

/// `stft` (compared as complex values: a phase near ±π may flip sign) and `istft`.
pub fn stft<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4005));
    for (len, n_fft, hop) in [(999, 20, 5), (4000, 64, 16), (30, 16, 4)] {
        let bins = n_fft / 2 + 1;
        let frames = len / hop + 1;
        let x = rng.v(len);
        let (xt, xr) = both(b, &rf, 1, len, &x);
        let (mut o, mut orf) = (b.tensor(2 * bins, frames), rf.r.tensor(2 * bins, frames));
        b.stft(&xt, len, n_fft, hop, &mut o);
        rf.r.stft(&xr, len, n_fft, hop, &mut orf);
        let complex = |v: Vec<f32>| -> Vec<f32> {
            let (m, p) = v.split_at(bins * frames);
            m.iter()
                .zip(p)
                .flat_map(|(m, p)| [m * p.cos(), m * p.sin()])
                .collect()
        };
        let case = format!("len={len} n_fft={n_fft} hop={hop}");
        let (got, want) = (
            complex(read(b, &o, 2 * bins, frames)),
            complex(read(&rf.r, &orf, 2 * bins, frames)),
        );
        check_rel(&name, "stft", &case, &got, &want, tol.stft);
        // A spectrum of positive magnitudes and any phases back to samples.
        let mag: Vec<f32> = rng.v(bins * frames).iter().map(|v| v.abs() + 0.1).collect();
        let ph: Vec<f32> = rng.v(bins * frames).iter().map(|v| v * 3.0).collect();
        let spec = [mag, ph].concat();
        let (st, sr) = both(b, &rf, 2 * bins, frames, &spec);
        let n_out = (frames - 1) * hop;
        let (mut o, mut orf) = (b.tensor(1, n_out), rf.r.tensor(1, n_out));
        b.istft(&st, frames, n_fft, hop, &mut o);
        rf.r.istft(&sr, frames, n_fft, hop, &mut orf);
        check_rel(
            &name,
            "istft",
            &case,
            &read(b, &o, 1, n_out),
            &read(&rf.r, &orf, 1, n_out),
            tol.stft,
        );
    }
}

/// `fake_quant_u8`: the same uint8 grid value for value (all positive; exact halves where
/// rounding half to even decides; a count that ends inside a row).
pub fn fake_quant_u8<B: Backend>(b: &B, _tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4006));
    let ties: Vec<f32> = (-255..=255).map(|i| i as f32 * 0.5).collect();
    let mixed: Vec<f32> = rng.v(70_001).iter().map(|v| v * 3.0).collect();
    let positive: Vec<f32> = rng.v(3_001).iter().map(|v| v * 3.0 + 5.0).collect();
    for (what, x, n) in [
        ("ties", &ties, ties.len()),
        ("mixed", &mixed, mixed.len()),
        ("positive", &positive, 2_999),
    ] {
        let (mut xt, mut xr) = both(b, &rf, 1, x.len(), x);
        b.fake_quant_u8(&mut xt, n);
        rf.r.fake_quant_u8(&mut xr, n);
        let case = format!("{what}, {n} of {} values", x.len());
        check_exact(
            &name,
            "fake_quant_u8",
            case,
            &read(b, &xt, 1, x.len()),
            &read(&rf.r, &xr, 1, x.len()),
        );
    }
}

/// `step` with a key, run again with other token ids and positions (a backend that records
/// replays the first recording, its only inputs the step's tokens and pos0): token
/// embeddings plus positional rows through a product, every time equal to the reference.
pub fn step<B: Backend>(b: &B, tol: &Tolerances) {
    let (name, rf, mut rng) = (b.name(), Ref::new(), Rng(0x4007));
    let (vocab, dim, rows) = (301, 256, 75);
    for ty in [GgmlType::F32, GgmlType::Q4_0, GgmlType::Q8_0] {
        let (tb, pb, wbytes) = (
            weight_data(ty, vocab, dim, &mut rng),
            weight_data(GgmlType::F32, vocab, dim, &mut rng),
            weight_data(ty, rows, dim, &mut rng),
        );
        let (Some(tab), Some(pos), Some(w)) = (
            load(b, "step", ty, vocab, dim, &tb),
            load(b, "step", GgmlType::F32, vocab, dim, &pb),
            load(b, "step", ty, rows, dim, &wbytes),
        ) else {
            continue;
        };
        let (tab_r, pos_r, w_r) = (
            rf.load(ty, vocab, dim, &tb),
            rf.load(GgmlType::F32, vocab, dim, &pb),
            rf.load(ty, rows, dim, &wbytes),
        );
        for n in [1, 3] {
            let key = crate::next_step_key();
            let (mut x, mut p, mut o) = (b.tensor(n, dim), b.tensor(n, dim), b.tensor(n, rows));
            for (round, pos0) in [(0u32, 0usize), (1, 7), (2, 290)] {
                let tokens: Vec<u32> = (0..n as u32)
                    .map(|i| (round * 97 + i * 31 + 5) % vocab as u32)
                    .collect();
                b.step(Some(key), &tokens, pos0, &mut || {
                    b.embed(&tab, &tokens, &mut x)?;
                    b.embed_positions(&pos, pos0, n, &mut p)?;
                    b.add(&mut x, &p, n);
                    b.matmul(&w, &x, None, n, &mut o);
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{name}: step: {e}"));
                let (mut xr, mut prr) = (rf.r.tensor(n, dim), rf.r.tensor(n, dim));
                rf.r.embed(&tab_r, &tokens, &mut xr).unwrap();
                rf.r.embed_positions(&pos_r, pos0, n, &mut prr).unwrap();
                rf.r.add(&mut xr, &prr, n);
                let want = rf.mm2(&w_r, &read(&rf.r, &xr, n, dim), n, None);
                let case = format!(
                    "{} n={n} tokens={tokens:?} pos0={pos0} (run {round} of one key)",
                    ty.name()
                );
                check_either(
                    &name,
                    "step",
                    case,
                    &read(b, &o, n, rows),
                    &want,
                    tol.product,
                );
            }
        }
    }
}
