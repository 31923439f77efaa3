//! Building blocks shared by Kokoro's encoders, prosody predictor and decoder: linear and
//! convolution layers, the bidirectional LSTM, AdaIN and the two AdaIN residual blocks.
//!
//! Feature maps are `(channels, len)` tensors; sequences fed to linear layers and LSTMs are
//! `(len, features)`. `Ctx::quant` reproduces the int8 export's activation arithmetic: the input
//! of every integer matmul / convolution rounded to its per-tensor uint8 grid.

use kiln_backend::{Backend, Conv1dShape, ConvWeightQ8, WeightData};
use kiln_quant::GgmlType;

use super::params::Params;
use crate::ModelError;

pub struct Ctx<'a, B: Backend> {
    pub b: &'a B,
    /// Round integer-op inputs as the int8 export's dynamic quantization does.
    pub quant: bool,
    /// Named activations, when tracing.
    pub trace: Option<&'a std::cell::RefCell<super::Trace>>,
    /// With `KILN_KOKORO_TIMES` set (a `dev-switches` build): the time of the last [`Ctx::lap`].
    pub timer: Option<std::cell::Cell<std::time::Instant>>,
}

impl<'a, B: Backend> Ctx<'a, B> {
    pub fn new(b: &'a B, quant: bool, trace: Option<&'a std::cell::RefCell<super::Trace>>) -> Self {
        let timer = kiln_backend::options::dev_flag("KILN_KOKORO_TIMES")
            .then(|| std::cell::Cell::new(std::time::Instant::now()));
        Ctx {
            b,
            quant,
            trace,
            timer,
        }
    }

    /// With `KILN_KOKORO_TIMES` set, prints the time since the last lap under `stage` (stderr).
    pub fn lap(&self, stage: &str) {
        if let Some(t) = &self.timer {
            let now = std::time::Instant::now();
            eprintln!(
                "kokoro {stage:<18} {:7.1} ms",
                (now - t.get()).as_secs_f64() * 1e3
            );
            t.set(now);
        }
    }

    /// Records x (rows, cols) under `name` when tracing.
    pub fn put(&self, name: &str, x: &B::Tensor, rows: usize, cols: usize) {
        if let Some(t) = self.trace {
            let mut v = vec![0f32; rows * cols];
            self.b.read(x, rows, &mut v);
            t.borrow_mut().push((name.to_string(), v));
        }
    }

    /// A copy of x (rows, cols), rounded to the uint8 grid when `quant` is on.
    pub fn quantized(&self, x: &B::Tensor, rows: usize, cols: usize) -> B::Tensor {
        let mut q = self.b.tensor(rows, cols);
        self.b.copy_rows(x, 0, rows, &mut q, 0);
        if self.quant {
            self.b.fake_quant_u8(&mut q, rows * cols);
        }
        q
    }
}

/// f32 values as the little-endian bytes a weight is loaded from: the values themselves on
/// a little-endian machine, a copy elsewhere.
pub fn f32_bytes(v: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: f32 has no padding and any byte is a valid u8; the slice borrows `v`.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        })
    } else {
        std::borrow::Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

pub fn tensor<B: Backend>(
    b: &B,
    p: &Params,
    name: &str,
    shape: &[usize],
) -> Result<B::Tensor, ModelError> {
    let v = p.get(name, shape)?;
    let cols = *v.shape.last().unwrap_or(&1);
    Ok(b.tensor_from(v.data.len() / cols.max(1), cols, &v.data))
}

/// y = W x + b: W (out, in) (`<name>.weight`, `<name>.bias`).
pub struct Linear<B: Backend> {
    /// The f32 weight, where there is no integer form (only one of the two is kept).
    w: Option<B::Weight>,
    /// The backend's integer form of the weight (a convolution of one tap over the tokens),
    /// where it multiplies this layer on integers.
    w8: Option<B::Weight>,
    bias: Option<B::Tensor>,
    integer: bool,
    pub n_in: usize,
    pub n_out: usize,
}

impl<B: Backend> Linear<B> {
    /// From an f32 weight (n_out, n_in) and bias held here (run in f32, not on integers).
    pub fn from_f32(
        b: &B,
        name: &str,
        w: &[f32],
        bias: Option<&[f32]>,
        n_in: usize,
        n_out: usize,
    ) -> Result<Self, ModelError> {
        let bytes = f32_bytes(w);
        let mut w = b
            .load_weight(WeightData {
                name,
                ty: GgmlType::F32,
                rows: n_out,
                cols: n_in,
                bytes: &bytes,
            })
            .map_err(|source| ModelError::Backend {
                file: name.into(),
                source,
            })?;
        if n_in >= 32 && n_out >= 32 {
            b.prefer_batches(&mut w, false);
        }
        Ok(Linear {
            w: Some(w),
            w8: None,
            bias: bias.map(|v| b.tensor_from(1, n_out, v)),
            integer: false,
            n_in,
            n_out,
        })
    }

    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        n_in: usize,
        n_out: usize,
    ) -> Result<Self, ModelError> {
        let wn = format!("{name}.weight");
        p.check(&wn, &[n_out, n_in])?;
        let bn = format!("{name}.bias");
        let bias = if p.has(&bn) {
            Some(tensor(b, p, &bn, &[n_out])?)
        } else {
            None
        };
        let integer = p.is_integer(&wn);
        let w8 = match (integer, p.quantized(&wn)) {
            (true, Some(q)) => {
                let wq = ConvWeightQ8 {
                    q: &q.q,
                    zero: &q.zero,
                    scale: &q.scale,
                };
                b.conv_weight_q8(wq, Self::conv_shape(n_in, n_out, 0))
            }
            _ => None,
        };
        // The f32 weight only where the backend has no integer form: a layer that has one
        // always runs on it (the export's int8 model is the only one with integer layers).
        let w = match w8 {
            Some(_) => None,
            None => {
                let mut w = b
                    .load_weight(WeightData {
                        name: &wn,
                        ty: GgmlType::F32,
                        rows: n_out,
                        cols: n_in,
                        bytes: &f32_bytes(&p.get(&wn, &[n_out, n_in])?.data),
                    })
                    .map_err(|source| ModelError::Backend {
                        file: wn.clone().into(),
                        source,
                    })?;
                if n_in >= 32 && n_out >= 32 {
                    // PL-BERT, the LSTMs' input projections, duration_proj: products over
                    // every token.
                    b.prefer_batches(&mut w, false);
                }
                Some(w)
            }
        };
        Ok(Linear {
            w,
            w8,
            bias,
            integer,
            n_in,
            n_out,
        })
    }

    /// The layer as a convolution of one tap over `n` tokens: (n_in, n) -> (n_out, n).
    fn conv_shape(n_in: usize, n_out: usize, n: usize) -> Conv1dShape {
        Conv1dShape {
            c_in: n_in,
            c_out: n_out,
            len_in: n,
            k: 1,
            stride: 1,
            pad: 0,
            dilation: 1,
            groups: 1,
            output_pad: 0,
        }
    }

    /// x (n, n_in) -> (n, n_out)
    pub fn forward(&self, cx: &Ctx<B>, x: &B::Tensor, n: usize) -> B::Tensor {
        let mut out = cx.b.tensor(n, self.n_out);
        if let (Some(w8), true) = (&self.w8, self.integer && cx.quant) {
            // On integers (the export's MatMulInteger): tokens as the time axis of a
            // convolution of one tap, whose input rounding is the same per-tensor grid.
            let b = cx.b;
            let mut xt = b.tensor(self.n_in, n);
            b.transpose(x, n, self.n_in, &mut xt);
            let mut ot = b.tensor(self.n_out, n);
            let s = Self::conv_shape(self.n_in, self.n_out, n);
            b.conv1d_q8(&xt, w8, self.bias.as_ref(), s, &mut ot);
            b.transpose(&ot, self.n_out, n, &mut out);
        } else if self.integer && cx.quant {
            let q = cx.quantized(x, n, self.n_in);
            cx.b.matmul(self.f32_weight(), &q, self.bias.as_ref(), n, &mut out);
        } else {
            cx.b.matmul(self.f32_weight(), x, self.bias.as_ref(), n, &mut out);
        }
        out
    }

    fn f32_weight(&self) -> &B::Weight {
        // None only beside an integer form, which the forwards use (Linear::load).
        self.w
            .as_ref()
            .expect("a layer without its integer form keeps its f32 weight")
    }
}

/// Conv1d / ConvTranspose1d with PyTorch's hyper-parameters.
pub struct Conv<B: Backend> {
    /// The f32 weight, where there is no packed form (only one of the two is kept).
    w: Option<B::Tensor>,
    /// The backend's packed form of the weight: integer where it multiplies this layer on
    /// integers, the transposed layer's phases where it has a kernel for them.
    packed: Option<B::Weight>,
    bias: Option<B::Tensor>,
    pub c_in: usize,
    pub c_out: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    groups: usize,
    output_pad: usize,
    transposed: bool,
    /// Whether the export runs this layer on integers (its input is quantized).
    integer: bool,
}

pub struct ConvSpec {
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub dilation: usize,
    pub groups: usize,
    pub output_pad: usize,
    pub transposed: bool,
}

impl ConvSpec {
    pub fn same(k: usize, dilation: usize) -> Self {
        ConvSpec {
            k,
            stride: 1,
            pad: (k * dilation - dilation) / 2,
            dilation,
            groups: 1,
            output_pad: 0,
            transposed: false,
        }
    }
}

impl<B: Backend> Conv<B> {
    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        c_in: usize,
        c_out: usize,
        s: ConvSpec,
    ) -> Result<Self, ModelError> {
        let shape = if s.transposed {
            [c_in, c_out / s.groups, s.k]
        } else {
            [c_out, c_in / s.groups, s.k]
        };
        let wn = format!("{name}.weight");
        p.check(&wn, &shape)?;
        let bn = format!("{name}.bias");
        let bias = if p.has(&bn) {
            Some(tensor(b, p, &bn, &[c_out])?)
        } else {
            None
        };
        let integer = p.is_integer(&wn);
        let mut conv = Conv {
            w: None,
            packed: None,
            bias,
            c_in,
            c_out,
            k: s.k,
            stride: s.stride,
            pad: s.pad,
            dilation: s.dilation,
            groups: s.groups,
            output_pad: s.output_pad,
            transposed: s.transposed,
            integer,
        };
        if conv.transposed {
            conv.packed = b.conv_transpose_weight(&p.get(&wn, &shape)?.data, conv.shape(1));
        } else if let (true, Some(q)) = (integer, p.quantized(&wn)) {
            let wq = ConvWeightQ8 {
                q: &q.q,
                zero: &q.zero,
                scale: &q.scale,
            };
            conv.packed = b.conv_weight_q8(wq, conv.shape(0));
        }
        // The f32 weight only where the backend has no packed form: a layer that has one
        // always runs on it (integer forms exist only in the export's int8 model, whose
        // layers run on integers).
        if conv.packed.is_none() {
            let wv = p.get(&wn, &shape)?;
            conv.w = Some(b.tensor_from(wv.data.len() / s.k, s.k, &wv.data));
        }
        Ok(conv)
    }

    fn f32_weight(&self) -> &B::Tensor {
        self.w
            .as_ref()
            .expect("a layer without its packed form keeps its f32 weight")
    }

    fn shape(&self, len: usize) -> Conv1dShape {
        Conv1dShape {
            c_in: self.c_in,
            c_out: self.c_out,
            len_in: len,
            k: self.k,
            stride: self.stride,
            pad: self.pad,
            dilation: self.dilation,
            groups: self.groups,
            output_pad: self.output_pad,
        }
    }

    pub fn len_out(&self, len: usize) -> usize {
        let s = self.shape(len);
        if self.transposed {
            s.len_out_transposed()
        } else {
            s.len_out()
        }
    }

    /// x (c_in, len) -> (c_out, len_out)
    pub fn forward(&self, cx: &Ctx<B>, x: &B::Tensor, len: usize) -> B::Tensor {
        let s = self.shape(len);
        let lo = self.len_out(len);
        let mut out = cx.b.tensor(self.c_out, lo);
        if let (true, Some(wt)) = (self.transposed, &self.packed) {
            cx.b.conv_transpose1d_packed(x, wt, self.bias.as_ref(), s, &mut out);
        } else if self.transposed {
            cx.b.conv_transpose1d(x, self.f32_weight(), self.bias.as_ref(), s, &mut out);
        } else if let (Some(w8), true) = (&self.packed, cx.quant) {
            cx.b.conv1d_q8(x, w8, self.bias.as_ref(), s, &mut out);
        } else if self.integer && cx.quant {
            let q = cx.quantized(x, self.c_in, len);
            cx.b.conv1d_nc(&q, self.f32_weight(), self.bias.as_ref(), s, &mut out);
        } else {
            cx.b.conv1d_nc(x, self.f32_weight(), self.bias.as_ref(), s, &mut out);
        }
        out
    }
}

impl<B: Backend> Conv<B> {
    /// out (c_out, len_out) = this layer on snake_alpha(norm(x)), x (c_in, len) left as it is.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_normed(
        &self,
        cx: &Ctx<B>,
        x: &B::Tensor,
        norm: &AdaIn<B>,
        alpha: &B::Tensor,
        s: &B::Tensor,
        len: usize,
        out: &mut B::Tensor,
    ) {
        self.normed(cx, x, norm, alpha, s, len, false, out)
    }

    /// acc (c_out, len_out) += this layer on snake_alpha(norm(x)).
    #[allow(clippy::too_many_arguments)]
    pub fn add_forward_normed(
        &self,
        cx: &Ctx<B>,
        x: &B::Tensor,
        norm: &AdaIn<B>,
        alpha: &B::Tensor,
        s: &B::Tensor,
        len: usize,
        acc: &mut B::Tensor,
    ) {
        self.normed(cx, x, norm, alpha, s, len, true, acc)
    }

    /// One op where the backend runs this layer on integers; else AdaIN, Snake, the layer and
    /// the sum one by one.
    #[allow(clippy::too_many_arguments)]
    fn normed(
        &self,
        cx: &Ctx<B>,
        x: &B::Tensor,
        norm: &AdaIn<B>,
        alpha: &B::Tensor,
        s: &B::Tensor,
        len: usize,
        add: bool,
        out: &mut B::Tensor,
    ) {
        let b = cx.b;
        let gb = norm.fc.forward(cx, s, 1);
        if let (Some(w8), true, false) = (&self.packed, cx.quant, self.transposed) {
            let bias = self.bias.as_ref();
            b.ada_in_snake_conv1d_q8(
                x,
                &gb,
                Some(alpha),
                EPS,
                w8,
                bias,
                self.shape(len),
                add,
                out,
            );
            return;
        }
        let mut t = b.tensor(self.c_in, len);
        b.copy_rows(x, 0, self.c_in, &mut t, 0);
        b.ada_in(&mut t, &gb, self.c_in, len, EPS);
        b.snake(&mut t, alpha, self.c_in, len);
        let y = self.forward(cx, &t, len);
        if add {
            b.add(out, &y, self.c_out);
        } else {
            b.copy_rows(&y, 0, self.c_out, out, 0);
        }
    }
}

/// Bidirectional single-layer LSTM (`weight_ih_l0`, `weight_hh_l0`, `bias_l0`, `*_reverse`):
/// the input projections of both directions and every step as one product, then the
/// recurrence (`h W_hh^T` per step) of the two directions side by side.
pub struct BiLstm<B: Backend> {
    /// [W_ih_fwd; W_ih_bwd] (8 hidden, n_in) with [b_fwd; b_bwd].
    ih: Linear<B>,
    /// [W_hh_fwd^T; W_hh_bwd^T] (2 hidden, 4 hidden).
    hh: B::Tensor,
    n_in: usize,
    pub hidden: usize,
}

impl<B: Backend> BiLstm<B> {
    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        n_in: usize,
        hidden: usize,
    ) -> Result<Self, ModelError> {
        let h4 = 4 * hidden;
        let both = |what: &str, shape: &[usize]| -> Result<Vec<f32>, ModelError> {
            let f = p.get(&format!("{name}.{what}_l0"), shape)?;
            let r = p.get(&format!("{name}.{what}_l0_reverse"), shape)?;
            Ok([f.data.as_slice(), r.data.as_slice()].concat())
        };
        let wi = both("weight_ih", &[h4, n_in])?;
        let wh = both("weight_hh", &[h4, hidden])?;
        let bias = both("bias", &[h4])?;
        Ok(BiLstm {
            ih: Linear::from_f32(
                b,
                &format!("{name}.weight_ih"),
                &wi,
                Some(&bias),
                n_in,
                2 * h4,
            )?,
            hh: b.tensor_from(2 * hidden, h4, &transpose_halves(&wh, h4, hidden)),
            n_in,
            hidden,
        })
    }

    /// x (len, n_in) -> (len, 2 hidden): [forward | backward]
    pub fn forward(&self, cx: &Ctx<B>, x: &B::Tensor, len: usize) -> B::Tensor {
        let b = cx.b;
        let q = cx.quantized(x, len, self.n_in);
        let mut gx = b.tensor(len, 8 * self.hidden);
        b.matmul(
            self.ih.f32_weight(),
            &q,
            self.ih.bias.as_ref(),
            len,
            &mut gx,
        );
        let mut out = b.tensor(len, 2 * self.hidden);
        b.bilstm_steps(&gx, &self.hh, len, self.hidden, &mut out);
        out
    }
}

/// [A^T; B^T] of w = [A; B], A and B (rows, cols) each.
fn transpose_halves(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for (d, half) in w.chunks_exact(rows * cols).enumerate() {
        for (r, row) in half.chunks_exact(cols).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                t[d * rows * cols + c * rows + r] = v;
            }
        }
    }
    t
}

/// AdaIN's epsilon.
const EPS: f32 = 1e-5;

/// AdaIN1d: instance norm, then a style-conditioned affine map `(1 + gamma) x + beta`.
pub struct AdaIn<B: Backend> {
    fc: Linear<B>,
    c: usize,
}

impl<B: Backend> AdaIn<B> {
    pub fn load(b: &B, p: &Params, name: &str, style: usize, c: usize) -> Result<Self, ModelError> {
        Ok(AdaIn {
            fc: Linear::load(b, p, &format!("{name}.fc"), style, 2 * c)?,
            c,
        })
    }

    /// x (c, len) in place; s (1, style)
    pub fn forward(&self, cx: &Ctx<B>, x: &mut B::Tensor, s: &B::Tensor, len: usize) {
        let gb = self.fc.forward(cx, s, 1);
        cx.b.ada_in(x, &gb, self.c, len, EPS);
    }
}

/// StyleTTS2's AdainResBlk1d: (AdaIN, LeakyReLU 0.2, [2x upsample], conv) x 2 on the
/// residual path, [nearest 2x upsample and 1x1 conv] on the shortcut, sum / sqrt(2).
pub struct AdainResBlk1d<B: Backend> {
    norm1: AdaIn<B>,
    norm2: AdaIn<B>,
    conv1: Conv<B>,
    conv2: Conv<B>,
    conv1x1: Option<Conv<B>>,
    /// Depthwise transposed conv doubling the length (`pool`), when upsampling.
    pool: Option<Conv<B>>,
    c_in: usize,
    pub c_out: usize,
}

impl<B: Backend> AdainResBlk1d<B> {
    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        c_in: usize,
        c_out: usize,
        style: usize,
        upsample: bool,
    ) -> Result<Self, ModelError> {
        let conv1x1 = if c_in != c_out {
            Some(Conv::load(
                b,
                p,
                &format!("{name}.conv1x1"),
                c_in,
                c_out,
                ConvSpec::same(1, 1),
            )?)
        } else {
            None
        };
        let pool = if upsample {
            let s = ConvSpec {
                k: 3,
                stride: 2,
                pad: 1,
                dilation: 1,
                groups: c_in,
                output_pad: 1,
                transposed: true,
            };
            Some(Conv::load(b, p, &format!("{name}.pool"), c_in, c_in, s)?)
        } else {
            None
        };
        Ok(AdainResBlk1d {
            norm1: AdaIn::load(b, p, &format!("{name}.norm1"), style, c_in)?,
            norm2: AdaIn::load(b, p, &format!("{name}.norm2"), style, c_out)?,
            conv1: Conv::load(
                b,
                p,
                &format!("{name}.conv1"),
                c_in,
                c_out,
                ConvSpec::same(3, 1),
            )?,
            conv2: Conv::load(
                b,
                p,
                &format!("{name}.conv2"),
                c_out,
                c_out,
                ConvSpec::same(3, 1),
            )?,
            conv1x1,
            pool,
            c_in,
            c_out,
        })
    }

    pub fn len_out(&self, len: usize) -> usize {
        if self.pool.is_some() {
            2 * len
        } else {
            len
        }
    }

    /// x (c_in, len) -> (c_out, len_out)
    pub fn forward(&self, cx: &Ctx<B>, x: &B::Tensor, s: &B::Tensor, len: usize) -> B::Tensor {
        let b = cx.b;
        let lo = self.len_out(len);
        // Residual path.
        let mut h = b.tensor(self.c_in, len);
        b.copy_rows(x, 0, self.c_in, &mut h, 0);
        self.norm1.forward(cx, &mut h, s, len);
        b.leaky_relu(&mut h, 0.2, self.c_in * len);
        if let Some(pool) = &self.pool {
            h = pool.forward(cx, &h, len);
        }
        let mut h = self.conv1.forward(cx, &h, lo);
        self.norm2.forward(cx, &mut h, s, lo);
        b.leaky_relu(&mut h, 0.2, self.c_out * lo);
        let mut h = self.conv2.forward(cx, &h, lo);
        // Shortcut.
        let sc = if self.pool.is_some() {
            let mut up = b.tensor(self.c_in, lo);
            b.upsample_nearest(x, self.c_in, len, 2, &mut up);
            up
        } else {
            let mut c = b.tensor(self.c_in, len);
            b.copy_rows(x, 0, self.c_in, &mut c, 0);
            c
        };
        let sc = match &self.conv1x1 {
            Some(c) => c.forward(cx, &sc, lo),
            None => sc,
        };
        b.add(&mut h, &sc, self.c_out);
        b.scale(&mut h, std::f32::consts::FRAC_1_SQRT_2, self.c_out * lo);
        h
    }
}

/// iSTFTNet's AdaINResBlock1: three (AdaIN, Snake, dilated conv, AdaIN, Snake, conv) residual
/// units with dilations 1, 3, 5.
pub struct AdaInResBlock1<B: Backend> {
    units: Vec<ResUnit<B>>,
    c: usize,
}

struct ResUnit<B: Backend> {
    adain1: AdaIn<B>,
    adain2: AdaIn<B>,
    alpha1: B::Tensor,
    alpha2: B::Tensor,
    conv1: Conv<B>,
    conv2: Conv<B>,
}

impl<B: Backend> AdaInResBlock1<B> {
    pub fn load(
        b: &B,
        p: &Params,
        name: &str,
        c: usize,
        k: usize,
        dilations: &[usize],
        style: usize,
    ) -> Result<Self, ModelError> {
        let mut units = Vec::new();
        for (j, &d) in dilations.iter().enumerate() {
            units.push(ResUnit {
                adain1: AdaIn::load(b, p, &format!("{name}.adain1.{j}"), style, c)?,
                adain2: AdaIn::load(b, p, &format!("{name}.adain2.{j}"), style, c)?,
                alpha1: tensor(b, p, &format!("{name}.alpha1.{j}"), &[1, c, 1])?,
                alpha2: tensor(b, p, &format!("{name}.alpha2.{j}"), &[1, c, 1])?,
                conv1: Conv::load(
                    b,
                    p,
                    &format!("{name}.convs1.{j}"),
                    c,
                    c,
                    ConvSpec::same(k, d),
                )?,
                conv2: Conv::load(
                    b,
                    p,
                    &format!("{name}.convs2.{j}"),
                    c,
                    c,
                    ConvSpec::same(k, 1),
                )?,
            });
        }
        Ok(AdaInResBlock1 { units, c })
    }

    /// x (c, len) -> (c, len)
    pub fn forward(&self, cx: &Ctx<B>, x: &B::Tensor, s: &B::Tensor, len: usize) -> B::Tensor {
        let b = cx.b;
        let mut x = {
            let mut c = b.tensor(self.c, len);
            b.copy_rows(x, 0, self.c, &mut c, 0);
            c
        };
        let mut t = b.tensor(self.c, len);
        for u in &self.units {
            u.conv1
                .forward_normed(cx, &x, &u.adain1, &u.alpha1, s, len, &mut t);
            u.conv2
                .add_forward_normed(cx, &t, &u.adain2, &u.alpha2, s, len, &mut x);
        }
        x
    }
}
