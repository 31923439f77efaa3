//! The backend trait: device buffers and coarse, fused ops that model code is written against.
//!
//! Models never see a backend's internals: they hold `B::Weight` (a matrix in any format of
//! `kiln_quant::GgmlType`), `B::Tensor` (f32 activations, `rows x cols`, allocated once with a
//! capacity of rows) and `B::KvCache`, and call the ops below. The CPU backend
//! ([`cpu::CpuBackend`]) is the numerical reference every other backend is tested against.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod cpu;
mod fallback;
pub mod options;
mod rope;
pub mod window;

use kiln_quant::{GgmlType, MlxLayout, QuantError};
use thiserror::Error;

pub use rope::{RopeConfig, RopeScaling, RopeStyle};

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("weight '{name}': {source}")]
    Quant { name: String, source: QuantError },
    #[error("weight '{name}': {what}")]
    Weight { name: String, what: String },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("KV cache type {ty}: {what}")]
    KvType { ty: &'static str, what: String },
    #[error("the {backend} backend cannot run this model: {what}")]
    Unsupported { backend: String, what: String },
    #[error("KV cache: {what}")]
    KvMemory { what: String },
}

/// How a KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
    /// GGML's Q8_0 blocks of 32 per head row (head sizes a multiple of 32).
    Q8_0,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [KvType::F32, KvType::F16, KvType::Q8_0]
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// The block format of one head row.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Errors unless rows of `head_dim` values fit the type's blocks.
    pub fn check(self, head_dim: usize) -> Result<(), BackendError> {
        self.ggml()
            .row_bytes(head_dim)
            .map(|_| ())
            .map_err(|e| BackendError::KvType {
                ty: self.name(),
                what: format!("head size {head_dim}: {e}"),
            })
    }
}

/// A host view of a weight matrix as stored in a model file: `rows` rows of `cols` values,
/// each row `ty.row_bytes(cols)` bytes, rows contiguous.
#[derive(Debug, Clone, Copy)]
pub struct WeightData<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

/// A matrix in MLX's affine group-wise format (`kiln_quant::mlx`): `rows` rows of `cols`
/// values; row r holds `layout.q_bytes(cols)` packed bytes of `q` and `layout.groups(cols)`
/// scales and biases (w = scale * q + bias).
#[derive(Debug, Clone, Copy)]
pub struct MlxWeightData<'a> {
    pub name: &'a str,
    pub layout: MlxLayout,
    pub rows: usize,
    pub cols: usize,
    pub q: &'a [u8],
    pub scales: &'a [f32],
    pub biases: &'a [f32],
}

impl MlxWeightData<'_> {
    /// Errors unless the parts have the lengths the shape implies.
    pub fn check(&self) -> Result<(), BackendError> {
        let (qb, g) = (
            self.layout.q_bytes(self.cols),
            self.layout.groups(self.cols),
        );
        let ok = Some(self.q.len()) == qb.checked_mul(self.rows)
            && Some(self.scales.len()) == g.checked_mul(self.rows)
            && self.biases.len() == self.scales.len();
        if ok {
            return Ok(());
        }
        Err(BackendError::Weight {
            name: self.name.to_string(),
            what: format!(
                "MLX {}-bit, groups of {}: {} x {} needs {} q bytes and {} scales/biases, got {}, {} and {}",
                self.layout.bits,
                self.layout.group,
                self.rows,
                self.cols,
                qb * self.rows,
                g * self.rows,
                self.q.len(),
                self.scales.len(),
                self.biases.len()
            ),
        })
    }

    /// The matrix as f32, row-major.
    pub fn dequantize(&self) -> Result<Vec<f32>, BackendError> {
        self.check()?;
        let (qb, g) = (
            self.layout.q_bytes(self.cols),
            self.layout.groups(self.cols),
        );
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            let (s, b) = (
                &self.scales[r * g..(r + 1) * g],
                &self.biases[r * g..(r + 1) * g],
            );
            kiln_quant::mlx_dequantize_row(self.layout, &self.q[r * qb..(r + 1) * qb], s, b, row)
                .map_err(|source| BackendError::Quant {
                name: self.name.to_string(),
                source,
            })?;
        }
        Ok(out)
    }
}

/// What a sliding-window KV cache serves ([`LlmOps::kv_cache_window`]): layers whose tokens
/// see the last `window` positions, fed at most `chunk` positions a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvWindow {
    pub window: usize,
    pub chunk: usize,
}

impl KvWindow {
    /// Whether a sequence of a cache that still holds positions from `kept` on may go on
    /// from position `p` (its positions from `p` on written again): from 0, or where every
    /// position `p`'s window reaches is held.
    pub fn resumes(window: usize, kept: usize, p: usize) -> bool {
        p == 0 || kept == 0 || p + 1 >= window + kept
    }
}

/// Shape of one attention step: `n_tokens` new tokens at positions `pos0..pos0 + n_tokens`.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub pos0: usize,
    pub n_tokens: usize,
    /// Sliding-window attention: the token at position p sees positions
    /// `p + 1 - window ..= p` only (Gemma 3's local layers, Mistral's `sliding_window`);
    /// 0 sees every position up to its own.
    pub window: usize,
}

impl AttnShape {
    /// The first position token `t` (of this step) attends to.
    #[inline]
    pub fn first(&self, t: usize) -> usize {
        match self.window {
            0 => 0,
            w => (self.pos0 + t + 1).saturating_sub(w),
        }
    }
}

/// Shape of one attention without a cache (encoder self-attention, cross-attention):
/// `n_q` queries over `n_kv` keys, `heads` heads of `head_dim`; `causal` lets query t see
/// keys `0..=t + n_kv - n_q` only.
#[derive(Debug, Clone, Copy)]
pub struct DenseAttnShape {
    pub heads: usize,
    pub head_dim: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub causal: bool,
}

/// Shape of a 1-D convolution over feature maps laid out `(channels, len)` row-major.
/// Weights are `(c_out, c_in / groups, k)` for [`SpeechOps::conv1d_nc`] and
/// `(c_in, c_out / groups, k)` for [`SpeechOps::conv_transpose1d`] (PyTorch's layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv1dShape {
    pub c_in: usize,
    pub c_out: usize,
    pub len_in: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub dilation: usize,
    pub groups: usize,
    /// Extra samples at the end of a transposed convolution's output.
    pub output_pad: usize,
}

impl Conv1dShape {
    /// Output length of `conv1d`.
    pub fn len_out(&self) -> usize {
        (self.len_in + 2 * self.pad).saturating_sub(self.dilation * (self.k - 1) + 1) / self.stride
            + 1
    }
    /// Output length of `conv_transpose1d`.
    pub fn len_out_transposed(&self) -> usize {
        ((self.len_in - 1) * self.stride + self.dilation * (self.k - 1) + self.output_pad + 1)
            .saturating_sub(2 * self.pad)
    }
}

/// An elementwise function of [`SpeechOps::unary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Exp,
    Sin,
    Tanh,
}

impl Unary {
    /// The CPU backend's vector math over v, in place.
    pub fn apply(self, v: &mut [f32]) {
        use crate::cpu::vmath;
        match self {
            Unary::Exp => vmath::exp_slice(v),
            Unary::Sin => vmath::sin_slice(v),
            Unary::Tanh => vmath::tanh_slice(v),
        }
    }
}

/// An integer convolution weight: uint8 values in `conv1d_nc`'s layout (c_out, c_in, k),
/// w = (q - zero) * scale with `zero` and `scale` per tensor (one value) or per output channel.
#[derive(Debug, Clone, Copy)]
pub struct ConvWeightQ8<'a> {
    pub q: &'a [u8],
    pub zero: &'a [i32],
    pub scale: &'a [f32],
}

/// One LSTM direction over a sequence: input `x` is `(len, n_in)`; weights in PyTorch's gate
/// order (i, f, g, o): `w_ih (4h, n_in)`, `w_hh (4h, h)`, `bias (4h)` (b_ih + b_hh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LstmShape {
    pub len: usize,
    pub n_in: usize,
    pub hidden: usize,
    pub reverse: bool,
    /// The hidden state is written to columns `out_col..out_col + hidden` of each output row.
    pub out_col: usize,
}

/// Host work a device backend has done since it was made ([`TensorOps::host_counters`]):
/// kernels dispatched, and the host time spent recording them and submitting them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    pub dispatches: u64,
    pub record_ns: u64,
    pub submit_ns: u64,
}

/// A key for [`TensorOps::step`] never handed out before in this process (every model state
/// that records steps takes its keys here, so no two states share one).
pub fn next_step_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One sequence of a batched step: its KV cache, and its rows' shape (`shape.n_tokens` rows
/// of the step's tensors, stacked in the order of the sequences, at positions `shape.pos0..`).
pub struct SeqKv<'a, C> {
    pub cache: &'a mut C,
    pub shape: AttnShape,
}

/// [`LlmOps::qk_norm_rope_attention`] composed of the plain ops: one sequence directly; for
/// several, the per-head norm over every row at once, RoPE and the KV store per sequence on
/// its rows gathered into `tmp` (its own positions), then one [`LlmOps::attention_batch`].
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_attention_seqs<B: LlmOps + ?Sized>(
    b: &B,
    q: &mut B::Tensor,
    k: &mut B::Tensor,
    v: &B::Tensor,
    qk_norm: Option<(&B::Tensor, &B::Tensor, f32)>,
    rope: &RopeConfig,
    seqs: &mut [SeqKv<'_, B::KvCache>],
    layer: usize,
    out: &mut B::Tensor,
    tmp: [&mut B::Tensor; 3],
) {
    if let [one] = seqs {
        let s = one.shape;
        b.qk_norm_rope_store(
            q,
            k,
            v,
            qk_norm,
            rope,
            s.n_heads,
            s.n_kv_heads,
            one.cache,
            layer,
            s.pos0,
            s.n_tokens,
        );
        return b.attention(q, one.cache, layer, s, out);
    }
    let n: usize = seqs.iter().map(|s| s.shape.n_tokens).sum();
    if let Some((qn, kn, eps)) = qk_norm {
        b.rms_norm_heads(q, qn, eps, n);
        b.rms_norm_heads(k, kn, eps, n);
    }
    let [sq, sk, sv] = tmp;
    let mut r0 = 0;
    for s in seqs.iter_mut() {
        let AttnShape {
            n_heads,
            n_kv_heads,
            pos0,
            n_tokens: ns,
            ..
        } = s.shape;
        b.copy_rows(q, r0, ns, sq, 0);
        b.copy_rows(k, r0, ns, sk, 0);
        b.copy_rows(v, r0, ns, sv, 0);
        b.rope(sq, rope, n_heads, pos0, ns);
        b.rope(sk, rope, n_kv_heads, pos0, ns);
        b.kv_store(s.cache, layer, sk, sv, pos0, ns);
        b.copy_rows(sq, 0, ns, q, r0);
        r0 += ns;
    }
    let shapes = seqs.iter().map(|s| (&*s.cache, s.shape));
    b.attention_batch(q, shapes, layer, out);
}

/// LFM2's gated short convolution on the host ([`LlmOps::short_conv`]): `rows` (n x 3·dim:
/// B, C, x), taps (dim x k), `state` ((k - 1) x dim, oldest first). Returns the n output
/// rows (dim each) and the state after them. Each output is the sum over taps j = 0..k of
/// taps[c][j] * (B * x) at position t - (k - 1) + j, in that order.
pub fn short_conv_host(
    rows: &[f32],
    taps: &[f32],
    state: &[f32],
    dim: usize,
    k: usize,
    n: usize,
) -> (Vec<f32>, Vec<f32>) {
    let s = k - 1;
    // The k - 1 previous values of B * x, then this chunk's: (s + n) x dim.
    let mut bx = Vec::with_capacity((s + n) * dim);
    bx.extend_from_slice(&state[..s * dim]);
    for t in 0..n {
        let r = &rows[t * 3 * dim..(t + 1) * 3 * dim];
        bx.extend((0..dim).map(|c| r[c] * r[2 * dim + c]));
    }
    let mut y = vec![0f32; n * dim];
    for t in 0..n {
        let cg = &rows[t * 3 * dim + dim..t * 3 * dim + 2 * dim];
        for c in 0..dim {
            let mut acc = 0f32;
            for j in 0..k {
                acc += taps[c * k + j] * bx[(t + j) * dim + c];
            }
            y[t * dim + c] = cg[c] * acc;
        }
    }
    let next = bx[n * dim..].to_vec();
    (y, next)
}

/// Index of the largest value of `r`, the first on ties (a NaN never wins; a row of NaNs
/// gives 0), as the sampler's greedy pick.
pub fn argmax_first(r: &[f32]) -> u32 {
    // Two passes the compiler vectorizes: the largest number (a NaN never compares
    // greater), then the first value equal to it (all NaN: none, so 0). The first equal
    // value is the one a running "greater than the best so far" keeps.
    const L: usize = 16;
    let mut m = [f32::NEG_INFINITY; L];
    let mut chunks = r.chunks_exact(L);
    for c in &mut chunks {
        for l in 0..L {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
    for (j, c) in r.chunks(L).enumerate() {
        if c.iter().fold(false, |any, &x| any | (x == max)) {
            let i = c.iter().position(|&x| x == max).unwrap_or(0);
            return (j * L + i) as u32;
        }
    }
    0
}

/// A step's token that is the last [`LlmOps::argmax_feed`]'s pick, which only the device
/// holds yet: one sequence's one token, where the backend [`LlmOps::feeds_picks`].
pub const FED_TOKEN: u32 = u32::MAX;

/// Tensors and weights, and the products, norms and elementwise ops every model runs:
/// the core each capability set below builds on.
pub trait TensorOps {
    /// f32 activations, row-major `rows x cols`.
    type Tensor;
    /// A weight matrix in its storage format (possibly repacked).
    type Weight;

    fn name(&self) -> String;

    fn load_weight(&self, w: WeightData) -> Result<Self::Weight, BackendError>;
    /// An MLX affine-quantized matrix. Backends without a kernel for the format get it as
    /// f32 (this default); the CPU backend keeps it packed and runs it natively.
    fn load_weight_mlx(&self, w: MlxWeightData) -> Result<Self::Weight, BackendError> {
        let f = w.dequantize()?;
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.load_weight(WeightData {
            name: w.name,
            ty: GgmlType::F32,
            rows: w.rows,
            cols: w.cols,
            bytes: &bytes,
        })
    }
    /// A hint: `w` mostly multiplies many rows at once (an encoder's weights, run once per
    /// window over every position), so the backend may keep a layout for block products
    /// beside the one for single rows. Results stay those of `matmul` up to the block
    /// product's rounding: bf16 inputs, or, where `int8` allows it (the user asked for
    /// 8-bit weights) and the backend has integer block products, weights and activations
    /// rounded to int8 with a scale a row. Default: nothing.
    fn prefer_batches(&self, w: &mut Self::Weight, int8: bool) {
        let _ = (w, int8);
    }

    /// `rows` and `cols` of a weight.

    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    /// Bytes the weight occupies in its stored format.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;

    /// A tensor with room for `rows x cols` f32, zeroed.
    fn tensor(&self, rows: usize, cols: usize) -> Self::Tensor;
    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> Self::Tensor;
    /// Copies the first `rows` rows to `out`.
    fn read(&self, t: &Self::Tensor, rows: usize, out: &mut [f32]);
    /// What the host has done to drive the device so far (`kiln bench` prints it per token),
    /// where the backend counts it. The default: None.
    fn host_counters(&self) -> Option<HostCounters> {
        None
    }
    /// out[t] = x[t] / rms(x[t]) * w
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
        n: usize,
        out: &mut Self::Tensor,
    );
    /// out[t] = W @ x[t] (+ bias): W (rows, cols), x (n, cols) -> out (n, rows)
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        n: usize,
        out: &mut Self::Tensor,
    );
    /// out[t] += W @ x[t]: the residual add done by the producing matmul.
    fn matmul_add(&self, w: &Self::Weight, x: &Self::Tensor, n: usize, out: &mut Self::Tensor);
    /// Three products of one input as one op (q, k, v projections).
    fn matmul3(
        &self,
        ws: [&Self::Weight; 3],
        biases: [Option<&Self::Tensor>; 3],
        x: &Self::Tensor,
        n: usize,
        outs: [&mut Self::Tensor; 3],
    );
    /// gate[t] = silu(gate[t]) * up[t], in place.
    fn silu_mul(&self, gate: &mut Self::Tensor, up: &Self::Tensor, n: usize);
    /// gate[t] = gelu_tanh(gate[t]) * up[t], in place (GeGLU: Gemma's MLP).
    fn gelu_tanh_mul(&self, gate: &mut Self::Tensor, up: &Self::Tensor, n: usize);
    /// x[t] += y[t]
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor, n: usize);
    /// Copies row `src_row` of `src` into row 0 of `dst`.
    fn copy_row(&self, src: &Self::Tensor, src_row: usize, dst: &mut Self::Tensor);
    /// Copies rows `src_row0..src_row0 + n` of `src` to rows `dst_row0..dst_row0 + n` of
    /// `dst` (same cols): gathers one sequence's rows out of a batch and scatters them back.
    fn copy_rows(
        &self,
        src: &Self::Tensor,
        src_row0: usize,
        n: usize,
        dst: &mut Self::Tensor,
        dst_row0: usize,
    );
    /// Row i of `dst` = row `rows[i]` of `src` (same cols). The default copies each run of
    /// consecutive source rows with one `copy_rows`.
    fn gather_rows(&self, src: &Self::Tensor, rows: &[usize], dst: &mut Self::Tensor) {
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            self.copy_rows(src, rows[i], j - i, dst, i);
            i = j;
        }
    }

    /// Runs one step: every op `f` enqueues, for `tokens` at positions `pos0..`. A backend
    /// that replays recorded work (a CUDA graph) records `f`'s ops the first time it sees
    /// `key` and replays the recording afterwards, with the step's token ids and positions as
    /// its only inputs; so for one key, `f` must enqueue the same ops on the same buffers,
    /// for the same number of tokens, every time. Keys are never reused for other buffers
    /// (the caller makes them unique per model state). Without a key the step runs `f`
    /// as it is, never recorded (its ops still see one step: the same fused ops as a
    /// recorded one, so a sequence's sums do not depend on which of the two ran it). The
    /// default runs `f`.
    fn step(
        &self,
        key: Option<u64>,
        tokens: &[u32],
        pos0: usize,
        f: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let _ = (key, tokens, pos0);
        f()
    }
    /// x = x * s over the first `n` values, in place.
    fn scale(&self, x: &mut Self::Tensor, s: f32, n: usize);
}

/// What decoders of text run beyond the core: KV caches (their memory, sharing and
/// types), embeddings, RoPE and attention, the fused decode ops, the short convolutions of
/// hybrid models, and picks where the logits are (argmax, candidates, grammar masks).
pub trait LlmOps: TensorOps {
    /// Keys and values of every layer for `n_ctx` positions.
    type KvCache;

    /// Keys and values of `n_layers` layers, `n_kv_heads` heads of `head_dim`, `n_ctx` positions.
    fn kv_cache(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self::KvCache;
    /// A KV cache storing keys and values as `ty`. This default holds f32 only.
    fn kv_cache_typed(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: KvType,
    ) -> Result<Self::KvCache, BackendError> {
        match ty {
            KvType::F32 => Ok(self.kv_cache(n_layers, n_ctx, n_kv_heads, head_dim)),
            other => Err(BackendError::KvType {
                ty: other.name(),
                what: format!("not supported by the {} backend", self.name()),
            }),
        }
    }
    /// A KV cache of `n_layers` sliding-window layers (each token sees the last
    /// `win.window` positions), fed at most `win.chunk` new positions a step: a backend may
    /// hold only the positions the window still needs (about `window + chunk` of them,
    /// whatever `n_ctx`), dropping older ones as the sequence advances. A sequence then goes
    /// on from position `p` only where [`Self::kv_kept_from`] allows it. Keys and values as
    /// `ty`, or as `kv_cache` stores them where None. The default holds every position.
    fn kv_cache_window(
        &self,
        n_layers: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
        ty: Option<KvType>,
        win: KvWindow,
    ) -> Result<Self::KvCache, BackendError> {
        let _ = win;
        match ty {
            Some(ty) => self.kv_cache_typed(n_layers, n_ctx, n_kv_heads, head_dim, ty),
            None => Ok(self.kv_cache(n_layers, n_ctx, n_kv_heads, head_dim)),
        }
    }
    /// The first position every layer of `cache` still holds (0 where it keeps them all):
    /// a window cache's sequence goes on from position `p` (its positions from `p` on
    /// written again) only where `p == 0` or `p + 1 >= window + kv_kept_from`.
    fn kv_kept_from(&self, cache: &Self::KvCache) -> usize {
        let _ = cache;
        0
    }
    /// Bytes the cache holds (keys and values of every layer).
    fn kv_cache_bytes(&self, cache: &Self::KvCache) -> usize;
    /// Readies positions `pos0..pos0 + n` of `cache` to be written by the next step (and
    /// every position before them to be read): a backend that hands cache memory out in
    /// blocks as sequences grow takes them here, before the step, so that a recorded step's
    /// replay finds them. Errors when no memory is left for them. The default does nothing
    /// (the cache holds all its positions from the start).
    fn kv_reserve(
        &self,
        cache: &mut Self::KvCache,
        pos0: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let _ = (cache, pos0, n);
        Ok(())
    }
    /// Gives back the memory `cache` holds, where the backend hands it out as sequences grow
    /// (its positions are then to be written again before they are read). The default does
    /// nothing.
    fn kv_release(&self, cache: &mut Self::KvCache) {
        let _ = cache;
    }
    /// What a cache asked for as `ty` (and accepted by `kv_cache_typed`) holds: a backend
    /// may store a wider type narrower. The default stores what is asked.
    fn kv_type_stored(&self, ty: KvType) -> KvType {
        ty
    }
    /// The cache type for heads of `head_dim` where none is asked: the narrowest this
    /// backend's attention reads directly (half the bytes of f32 a step at depth). The
    /// default: f32.
    fn kv_type_default(&self, head_dim: usize) -> KvType {
        let _ = head_dim;
        KvType::F32
    }
    /// Whether this backend's attention runs `heads` query heads over `kv_heads` KV heads of
    /// `head_dim` values: models ask at load, so that a shape it cannot run is an error then
    /// rather than a failure in the first step. The default takes any shape.
    fn check_attention(
        &self,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        let _ = (heads, kv_heads, head_dim);
        Ok(())
    }

    /// Whether this backend's cached attention honours [`AttnShape::window`]: models with
    /// sliding-window layers ask at load, so that a backend without it is an error then
    /// rather than attention over the wrong positions. The default says no.
    fn check_window(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.name(),
            what: "sliding-window attention is not implemented there".into(),
        })
    }

    /// Whether this backend runs [`LlmOps::short_conv`] (LFM2's convolution layers): models
    /// with them ask at load. The default says no: its `short_conv` works through host
    /// copies, which a backend that records its steps (CUDA graphs) must not take.
    fn check_short_conv(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.name(),
            what: "LFM2's short convolutions are not implemented there".into(),
        })
    }

    // ---- ops; `n` is the number of active rows (tokens) ----

    /// out[t] = table[ids[t]] (dequantized row).
    fn embed(
        &self,
        table: &Self::Weight,
        ids: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// out[t] = table[pos0 + t] for t < n: rows by position (Whisper's positional
    /// embedding). A backend that replays recorded steps reads pos0 from the step's
    /// positions, so one recording serves every position. The default goes through `embed`.
    fn embed_positions(
        &self,
        table: &Self::Weight,
        pos0: usize,
        n: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        let ids: Vec<u32> = (pos0..pos0 + n).map(|p| p as u32).collect();
        self.embed(table, &ids, out)
    }
    /// Per-head RMSNorm of `x` viewed as `n x heads x head_dim`, in place (Qwen3 q/k norm).
    fn rms_norm_heads(&self, x: &mut Self::Tensor, w: &Self::Tensor, eps: f32, n: usize);
    /// out[t] = silu(Wg @ x[t]) * (Wu @ x[t]): the gated MLP's first half in one op.
    fn gate_up_silu(
        &self,
        gate: &Self::Weight,
        up: &Self::Weight,
        x: &Self::Tensor,
        n: usize,
        out: &mut Self::Tensor,
    );
    /// Rotates `x` (n x heads x head_dim) for positions `pos0..pos0+n`, in place.
    fn rope(&self, x: &mut Self::Tensor, rope: &RopeConfig, heads: usize, pos0: usize, n: usize);
    /// Stores k, v (n x kv_dim) at positions `pos0..pos0+n` of `layer`.
    fn kv_store(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        pos0: usize,
        n: usize,
    );
    /// Causal grouped-query attention of q (n x heads x head_dim) over the cache's positions
    /// `0..pos0 + t + 1` for token t -> out (n x heads x head_dim).
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        layer: usize,
        shape: AttnShape,
        out: &mut Self::Tensor,
    );
    /// Attention of several sequences in one op: their tokens' rows are stacked in `q` in
    /// the order of `seqs`; each (its cache, its shape) attends over its own cache and
    /// writes the same rows of `out`. Each sequence gets exactly what `attention` gives it.
    fn attention_batch<'c, I>(
        &self,
        q: &Self::Tensor,
        seqs: I,
        layer: usize,
        out: &mut Self::Tensor,
    ) where
        I: Iterator<Item = (&'c Self::KvCache, AttnShape)>,
        Self::KvCache: 'c;

    // ---- fused forms of the ops above: the defaults compose them; a backend whose per-op
    // cost matters (GPUs) overrides them with one kernel each. `h` is scratch the default
    // writes and an override may leave untouched.

    /// `matmul3(ws, biases, rms_norm(x, norm_w))`.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_matmul3(
        &self,
        x: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
        ws: [&Self::Weight; 3],
        biases: [Option<&Self::Tensor>; 3],
        n: usize,
        h: &mut Self::Tensor,
        outs: [&mut Self::Tensor; 3],
    ) {
        self.rms_norm(x, norm_w, eps, n, h);
        self.matmul3(ws, biases, h, n, outs);
    }
    /// `matmul(w, rms_norm(x, norm_w))` (a model's head over its output norm: a GPU's product
    /// then takes the input [`LlmOps::matmul_add_before_norm`] prepared, as the layers' do).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_matmul(
        &self,
        x: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
        w: &Self::Weight,
        n: usize,
        h: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        self.rms_norm(x, norm_w, eps, n, h);
        self.matmul(w, h, None, n, out);
    }
    /// `gate_up_silu(gate, up, rms_norm(x, norm_w))`.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_gate_up_silu(
        &self,
        x: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
        gate: &Self::Weight,
        up: &Self::Weight,
        n: usize,
        h: &mut Self::Tensor,
        out: &mut Self::Tensor,
    ) {
        self.rms_norm(x, norm_w, eps, n, h);
        self.gate_up_silu(gate, up, h, n, out);
    }
    /// out[t] = gelu_tanh(Wg @ x[t]) * (Wu @ x[t]): GeGLU's first half (Gemma). `up` (n x
    /// the FFN width) is scratch the default writes and an override may leave untouched.
    fn gate_up_gelu(
        &self,
        gate: &Self::Weight,
        up: &Self::Weight,
        x: &Self::Tensor,
        n: usize,
        out: &mut Self::Tensor,
        up_out: &mut Self::Tensor,
    ) {
        self.matmul(gate, x, None, n, out);
        self.matmul(up, x, None, n, up_out);
        self.gelu_tanh_mul(out, up_out, n);
    }
    /// `gate_up_gelu(gate, up, rms_norm(x, norm_w))`.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_gate_up_gelu(
        &self,
        x: &Self::Tensor,
        norm_w: &Self::Tensor,
        eps: f32,
        gate: &Self::Weight,
        up: &Self::Weight,
        n: usize,
        h: &mut Self::Tensor,
        out: &mut Self::Tensor,
        up_out: &mut Self::Tensor,
    ) {
        self.rms_norm(x, norm_w, eps, n, h);
        self.gate_up_gelu(gate, up, h, n, out, up_out);
    }
    /// LFM2's gated short convolution over one sequence's rows `row0..row0 + n` of `bcx`
    /// (B, C and x side by side, `3 * dim` columns): the same rows of `out` (dim columns) get
    /// C * conv(B * x), the causal depthwise convolution of width `k` (taps: `dim` rows of `k`,
    /// the last on the current position) continuing from rows `srow..srow + k - 1` of
    /// `state` (the k - 1 values of B * x before row0, oldest first; zeros when `fresh`),
    /// which it then advances past the n rows. The default computes on the host.
    #[allow(clippy::too_many_arguments)]
    fn short_conv(
        &self,
        bcx: &Self::Tensor,
        taps: &Self::Tensor,
        state: &mut Self::Tensor,
        srow: usize,
        (dim, k): (usize, usize),
        (row0, n): (usize, usize),
        fresh: bool,
        out: &mut Self::Tensor,
    ) {
        let mut rows = vec![0f32; (row0 + n) * 3 * dim];
        self.read(bcx, row0 + n, &mut rows);
        let mut w = vec![0f32; dim * k];
        self.read(taps, dim, &mut w);
        let s = k - 1;
        let mut st = vec![0f32; (srow + s) * dim];
        if !fresh {
            self.read(state, srow + s, &mut st);
        }
        let (y, next) = short_conv_host(&rows[row0 * 3 * dim..], &w, &st[srow * dim..], dim, k, n);
        let t = self.tensor_from(n, dim, &y);
        self.copy_rows(&t, 0, n, out, row0);
        if s > 0 {
            let t = self.tensor_from(s, dim, &next);
            self.copy_rows(&t, 0, s, state, srow);
        }
    }
    /// x[t] += rms_norm(y[t]) * w: a block's output normed before its residual add (Gemma's
    /// post-norms). `h` is scratch the default writes. `next_norm` (weights, eps): the
    /// caller's next op RMS-normalises x with it for a product, and a backend may prepare
    /// that op's input here (as [`LlmOps::matmul_add_before_norm`]).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
        n: usize,
        h: &mut Self::Tensor,
        next_norm: Option<(&Self::Tensor, f32)>,
    ) {
        let _ = next_norm;
        self.rms_norm(y, w, eps, n, h);
        self.add(x, h, n);
    }
    /// The attention input side for tokens at `pos0..pos0 + n`: per-head RMSNorm of q and k
    /// when `qk_norm` is given (Qwen3), RoPE on both, then k and v stored in `layer` of the
    /// cache. `heads`/`kv_heads` are q's and k's head counts.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_store(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        qk_norm: Option<(&Self::Tensor, &Self::Tensor, f32)>,
        rope: &RopeConfig,
        heads: usize,
        kv_heads: usize,
        cache: &mut Self::KvCache,
        layer: usize,
        pos0: usize,
        n: usize,
    ) {
        if let Some((qn, kn, eps)) = qk_norm {
            self.rms_norm_heads(q, qn, eps, n);
            self.rms_norm_heads(k, kn, eps, n);
        }
        self.rope(q, rope, heads, pos0, n);
        self.rope(k, rope, kv_heads, pos0, n);
        self.kv_store(cache, layer, k, v, pos0, n);
    }
    /// out += W x, as [`TensorOps::matmul_add`], where the caller's next op RMS-normalises
    /// `out` with `next_norm` (weights, eps) for a product: a backend may prepare that op's
    /// input here.
    fn matmul_add_before_norm(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        n: usize,
        out: &mut Self::Tensor,
        next_norm: (&Self::Tensor, f32),
    ) {
        let _ = next_norm;
        self.matmul_add(w, x, n, out);
    }
    /// The attention side of a step over one or more sequences whose rows are stacked in
    /// q, k, v and out in the order of `seqs` (each its own cache, positions and token count):
    /// [`LlmOps::qk_norm_rope_store`] of each sequence's rows, then its attention over its
    /// cache -> its rows of out. One call, so that a backend may fuse the parts and run every
    /// sequence in one launch. q and k may be left as they came or rotated; only `out` and the
    /// caches are the result. `tmp` (rows of q's, k's and v's widths, as many as the largest
    /// sequence) is scratch the default uses for several sequences; an override may leave it.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_attention(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        qk_norm: Option<(&Self::Tensor, &Self::Tensor, f32)>,
        rope: &RopeConfig,
        seqs: &mut [SeqKv<'_, Self::KvCache>],
        layer: usize,
        out: &mut Self::Tensor,
        tmp: [&mut Self::Tensor; 3],
    ) where
        Self: Sized,
    {
        qk_norm_rope_attention_seqs(self, q, k, v, qk_norm, rope, seqs, layer, out, tmp)
    }
    /// Candidates for sampling from row 0 of x: (value, column) pairs, in any order, that
    /// include the `k` largest of its first `cols` values under `f32::total_cmp` (ties: the
    /// lower column), into `out`; false (out untouched) where this backend does not select
    /// them, and the caller reads the row. A device selects on the device, so a few
    /// candidates travel instead of the row.
    fn top_candidates(
        &self,
        x: &Self::Tensor,
        cols: usize,
        k: usize,
        out: &mut Vec<(f32, u32)>,
    ) -> bool {
        let _ = (x, cols, k, out);
        false
    }
    /// Sets the values `c < cols` of row `row` of `x` whose bit `c` of `allow` (32 per word,
    /// lowest bit first) is clear to minus infinity: a grammar's token mask applied where the
    /// logits are, so the picks after it (`argmax_rows`, `top_candidates`) stay on the
    /// device. False where the caller is to mask a host copy instead (the default: the
    /// CPU's logits are on the host already).
    fn mask_row(&self, x: &mut Self::Tensor, row: usize, cols: usize, allow: &[u32]) -> bool {
        let _ = (x, row, cols, allow);
        false
    }
    /// Index of the largest of the first `cols` values of each of the first `n` rows (the
    /// first such index on ties): greedy sampling without copying logits to the host.
    fn argmax_rows(&self, x: &Self::Tensor, n: usize, cols: usize) -> Vec<u32> {
        let mut v = vec![0f32; n * cols];
        self.read(x, n, &mut v);
        v.chunks_exact(cols.max(1)).map(argmax_first).collect()
    }
    /// Whether the work queued so far has finished: a device runs it while the host goes
    /// on (true where every op is done when its call returns, the default).
    fn work_done(&self) -> bool {
        true
    }
    /// Whether this backend feeds greedy picks to the next step itself
    /// ([`LlmOps::argmax_feed`]).
    fn feeds_picks(&self) -> bool {
        false
    }
    /// Queues the greedy pick of row 0's first `cols` values of `x` (as [`LlmOps::
    /// argmax_rows`]) as the token of the next step given [`FED_TOKEN`], and its copy to the
    /// host ([`LlmOps::fed_token`]): the next forward can be queued before the host has the
    /// token, so a device never waits for the host between decode steps. False (nothing
    /// queued) where the backend does not feed picks (the default).
    fn argmax_feed(&self, x: &Self::Tensor, cols: usize) -> bool {
        let _ = (x, cols);
        false
    }
    /// The token the last [`LlmOps::argmax_feed`] picked, once it is on the host (waits for
    /// it, not for the work queued after it); None where none was fed.
    fn fed_token(&self) -> Option<u32> {
        None
    }
    /// Copies positions `0..n` of every layer from `src` to `dst` (beam search forks a
    /// sequence). Both caches have the same shape.
    fn kv_copy(&self, src: &Self::KvCache, dst: &mut Self::KvCache, n: usize);
}

/// What the speech models run beyond the core: Whisper's convolutions and dense
/// attention, Kokoro's integer and transposed convolutions, LSTMs, style norms, snake
/// activations and STFT.
pub trait SpeechOps: TensorOps {
    // ---- speech ops (Whisper): layer norm, GELU, conv1d, attention without a cache ----

    /// out[t] = (x[t] - mean(x[t])) / sqrt(var(x[t]) + eps) * gamma + beta
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        gamma: &Self::Tensor,
        beta: &Self::Tensor,
        eps: f32,
        n: usize,
        out: &mut Self::Tensor,
    );
    /// x = gelu(x) = x/2 * (1 + erf(x/sqrt(2))) over the first n rows, in place.
    fn gelu(&self, x: &mut Self::Tensor, n: usize);
    /// 1-D convolution over time, time-major: x (t_in, c_in), W (c_out, c_in * kernel) with
    /// column `c * kernel + j` the tap j of input channel c, out (t_out, c_out):
    /// out[t] = bias + sum_{c,j} W[:, c*kernel + j] * x[t*stride + j - pad][c] (zero outside
    /// 0..t_in). Returns t_out = (t_in + 2*pad - kernel) / stride + 1.
    #[allow(clippy::too_many_arguments)]
    fn conv1d(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
        x: &Self::Tensor,
        t_in: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        out: &mut Self::Tensor,
    ) -> usize;
    /// Multi-head attention of q (n_q, heads*hd) over k, v (n_kv, heads*hd) held in plain
    /// tensors (no cache), scaled by 1/sqrt(hd) -> out (n_q, heads*hd).
    fn attention_dense(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: DenseAttnShape,
        out: &mut Self::Tensor,
    );

    // ---- Signal and sequence ops (Kokoro / StyleTTS2 / iSTFTNet) ----
    // Feature maps are `(channels, len)` row-major tensors; every op takes its shape explicitly.

    /// out (c_out, len_out) = conv1d(x (c_in, len_in), w) + bias (c_out)
    fn conv1d_nc(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        s: Conv1dShape,
        out: &mut Self::Tensor,
    );
    /// A convolution run on integers (ONNX `ConvInteger` after `DynamicQuantizeLinear`): its
    /// uint8 weight in the backend's layout for [`SpeechOps::conv1d_q8`], or None where the
    /// backend has no integer kernel for shape `s` (the caller then rounds the input with
    /// `fake_quant_u8` and runs `conv1d_nc` on the dequantized weight: the same sums).
    fn conv_weight_q8(&self, w: ConvWeightQ8, s: Conv1dShape) -> Option<Self::Weight> {
        let _ = (w, s);
        None
    }
    /// out (c_out, len_out) = conv1d(x rounded to its uint8 grid as by `fake_quant_u8`, the
    /// integer weight `w` from [`SpeechOps::conv_weight_q8`]) + bias, with integer sums.
    fn conv1d_q8(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
        s: Conv1dShape,
        out: &mut Self::Tensor,
    ) {
        let _ = (x, w, bias, s, out);
        unreachable!("conv1d_q8 needs a weight from conv_weight_q8, which returned None here")
    }
    /// `conv1d_q8` of x after `ada_in` (gamma_beta, eps) and, with alpha, `snake`, as one op
    /// (x is left as it is); with `accumulate` the result is added to out, not written over
    /// it. This default runs the ops one by one.
    #[allow(clippy::too_many_arguments)]
    fn ada_in_snake_conv1d_q8(
        &self,
        x: &Self::Tensor,
        gamma_beta: &Self::Tensor,
        alpha: Option<&Self::Tensor>,
        eps: f32,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
        s: Conv1dShape,
        accumulate: bool,
        out: &mut Self::Tensor,
    ) {
        let (c, len) = (s.c_in, s.len_in);
        let mut t = self.tensor(c, len);
        self.copy_rows(x, 0, c, &mut t, 0);
        self.ada_in(&mut t, gamma_beta, c, len, eps);
        if let Some(a) = alpha {
            self.snake(&mut t, a, c, len);
        }
        if accumulate {
            let mut y = self.tensor(s.c_out, s.len_out());
            self.conv1d_q8(&t, w, bias, s, &mut y);
            self.add(out, &y, s.c_out);
        } else {
            self.conv1d_q8(&t, w, bias, s, out);
        }
    }
    /// out (c_out, len_out_transposed) = conv_transpose1d(x (c_in, len_in), w) + bias (c_out)
    fn conv_transpose1d(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        s: Conv1dShape,
        out: &mut Self::Tensor,
    );
    /// A transposed convolution's weight (`conv_transpose1d`'s layout (c_in, c_out, k)) in the
    /// backend's layout for [`SpeechOps::conv_transpose1d_packed`], or None where the backend
    /// has none for shape `s` (the caller keeps `conv_transpose1d` on the f32 weight).
    fn conv_transpose_weight(&self, w: &[f32], s: Conv1dShape) -> Option<Self::Weight> {
        let _ = (w, s);
        None
    }
    /// `conv_transpose1d` with the weight from [`SpeechOps::conv_transpose_weight`].
    fn conv_transpose1d_packed(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
        s: Conv1dShape,
        out: &mut Self::Tensor,
    ) {
        let _ = (x, w, bias, s, out);
        unreachable!("conv_transpose1d_packed needs a weight from conv_transpose_weight")
    }
    /// One LSTM direction from zero state: h_t written to `out` (len, out.cols) at `s.out_col`.
    fn lstm(
        &self,
        x: &Self::Tensor,
        w_ih: &Self::Tensor,
        w_hh: &Self::Tensor,
        bias: &Self::Tensor,
        s: LstmShape,
        out: &mut Self::Tensor,
    );
    /// The recurrence of a bidirectional LSTM from zero state with its input gates given:
    /// gx (len, 8h) = [x W_ih_fwd^T + b_fwd | x W_ih_bwd^T + b_bwd] (gates i, f, g, o each),
    /// w_hh (2h, 4h) = [W_hh_fwd^T; W_hh_bwd^T] -> out (len, 2h) = [h_fwd | h_bwd].
    fn bilstm_steps(
        &self,
        gx: &Self::Tensor,
        w_hh: &Self::Tensor,
        len: usize,
        hidden: usize,
        out: &mut Self::Tensor,
    );
    /// Each of `rows` rows of `x` (rows, cols) normalised to zero mean and unit variance, then
    /// `* w + b` when given, in place.
    fn layer_norm_rows(
        &self,
        x: &mut Self::Tensor,
        w: Option<&Self::Tensor>,
        b: Option<&Self::Tensor>,
        eps: f32,
        rows: usize,
        cols: usize,
    );
    /// Adaptive instance norm of x (c, len), in place: each channel normalised over time, then
    /// `(1 + gamma[c]) * x + beta[c]` with `gamma_beta` row 0 = [gamma (c), beta (c)].
    fn ada_in(
        &self,
        x: &mut Self::Tensor,
        gamma_beta: &Self::Tensor,
        c: usize,
        len: usize,
        eps: f32,
    );
    /// Like `ada_in` over the channels of each time step of x (len, c) (AdaLayerNorm).
    fn ada_layer_norm(
        &self,
        x: &mut Self::Tensor,
        gamma_beta: &Self::Tensor,
        len: usize,
        c: usize,
        eps: f32,
    );
    /// Snake activation of x (c, len), in place: x + sin(alpha[c] x)^2 / alpha[c].
    fn snake(&self, x: &mut Self::Tensor, alpha: &Self::Tensor, c: usize, len: usize);
    /// x = max(x, slope * x) over the first `n` values (leaky ReLU), in place.
    fn leaky_relu(&self, x: &mut Self::Tensor, slope: f32, n: usize);
    /// out (cols, rows) = x (rows, cols) transposed.
    fn transpose(&self, x: &Self::Tensor, rows: usize, cols: usize, out: &mut Self::Tensor);
    /// Rounds the first `n` values of x to the uint8 grid that per-tensor dynamic quantization
    /// (ONNX DynamicQuantizeLinear) gives them, in place: the activation arithmetic of int8
    /// exports, reproduced for comparison with them.
    fn fake_quant_u8(&self, x: &mut Self::Tensor, n: usize);
    /// Short-time Fourier transform of `signal` (len), centred (reflect padding of n_fft / 2),
    /// periodic Hann window: out (2 * (n_fft / 2 + 1), frames) = [magnitude; phase].
    fn stft(
        &self,
        signal: &Self::Tensor,
        len: usize,
        n_fft: usize,
        hop: usize,
        out: &mut Self::Tensor,
    );
    /// Inverse of `stft` from magnitude and phase rows `spec` (2 * (n_fft / 2 + 1), frames):
    /// windowed overlap-add normalised by the window's squared sum, centre trimmed:
    /// out row 0 holds (frames - 1) * hop samples.
    fn istft(
        &self,
        spec: &Self::Tensor,
        frames: usize,
        n_fft: usize,
        hop: usize,
        out: &mut Self::Tensor,
    );
    /// out (c, len * factor) = x (c, len) with every sample repeated `factor` times.
    fn upsample_nearest(
        &self,
        x: &Self::Tensor,
        c: usize,
        len: usize,
        factor: usize,
        out: &mut Self::Tensor,
    );
    /// Values start..start + n of x (rows, cols, row-major) through `op`, in place. The
    /// default reads x to the host, runs the CPU's vector math and makes x anew.
    fn unary(
        &self,
        x: &mut Self::Tensor,
        op: Unary,
        (rows, cols): (usize, usize),
        start: usize,
        n: usize,
    ) {
        let mut v = vec![0f32; rows * cols];
        self.read(x, rows, &mut v);
        op.apply(&mut v[start..start + n]);
        *x = self.tensor_from(rows, cols, &v);
    }
    /// out (c, len + 1) = x (c, len) with sample 1 of each row put before it (PyTorch's
    /// ReflectionPad1d((1, 0)); len >= 2). The default goes through the host.
    fn reflect_pad_left(&self, x: &Self::Tensor, c: usize, len: usize) -> Self::Tensor {
        assert!(len >= 2, "reflect_pad_left: rows of {len} samples");
        let mut v = vec![0f32; c * len];
        self.read(x, c, &mut v);
        let p: Vec<f32> = v
            .chunks_exact(len)
            .flat_map(|r| std::iter::once(r[1]).chain(r.iter().copied()))
            .collect();
        self.tensor_from(c, len + 1, &p)
    }
    /// Bidirectional (unmasked) multi-head attention: q, k, v (len, heads * head_dim) ->
    /// out (len, heads * head_dim), softmax(q k^T / sqrt(head_dim)) v per head. The default
    /// is [`SpeechOps::attention_dense`] of that shape.
    #[allow(clippy::too_many_arguments)]
    fn self_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        heads: usize,
        head_dim: usize,
        len: usize,
        out: &mut Self::Tensor,
    ) {
        let s = DenseAttnShape {
            heads,
            head_dim,
            n_q: len,
            n_kv: len,
            causal: false,
        };
        self.attention_dense(q, k, v, s, out)
    }
    /// GELU, tanh approximation, over the first `n` values, in place.
    fn gelu_tanh(&self, x: &mut Self::Tensor, n: usize);
}

/// Every op a model may ask of a device: the three capability sets. A model's code names
/// `Backend`; each backend implements the three sets (`TensorOps`, `LlmOps`, `SpeechOps`).
pub trait Backend: TensorOps + LlmOps + SpeechOps {}

impl<T: TensorOps + LlmOps + SpeechOps> Backend for T {}

#[cfg(test)]
mod argmax_tests {
    use super::argmax_first;

    /// The sampler's greedy pick: the first of equal maxima, NaNs never, wherever they are.
    #[test]
    fn argmax_first_skips_nans_and_keeps_the_first_tie() {
        assert_eq!(argmax_first(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax_first(&[f32::NAN, 1.0, 2.0, f32::NAN]), 2);
        assert_eq!(argmax_first(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax_first(&[f32::NEG_INFINITY, f32::NAN, -1e30]), 2);
        assert_eq!(argmax_first(&[]), 0);
        assert_eq!(argmax_first(&[-0.0, 0.0, -1.0]), 0);
        assert_eq!(
            argmax_first(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]),
            1
        );
        // Rows longer than a pass's lanes, the largest value at every place, twice.
        let mut x = 7u32;
        for len in [15usize, 16, 17, 33, 100, 1000] {
            let mut r: Vec<f32> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 8) as f32 / 16_777_216.0 - 0.5
                })
                .collect();
            for at in 0..len {
                let keep = r[at];
                r[at] = 2.0;
                assert_eq!(argmax_first(&r), at as u32, "len {len}, at {at}");
                if at + 1 < len {
                    let next = r[len - 1];
                    r[len - 1] = 2.0;
                    assert_eq!(argmax_first(&r), at as u32, "the first of two, len {len}");
                    r[len - 1] = next;
                }
                r[at] = f32::NAN;
                let want = r
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| !v.is_nan())
                    .fold(None::<(usize, f32)>, |b, (i, &v)| match b {
                        Some((_, bv)) if v <= bv => b,
                        _ => Some((i, v)),
                    })
                    .map_or(0, |(i, _)| i);
                assert_eq!(argmax_first(&r), want as u32, "NaN at {at}, len {len}");
                r[at] = keep;
            }
        }
    }
}
