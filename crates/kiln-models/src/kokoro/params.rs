//! Kokoro's parameters under hexgrad's canonical names, read from the kokoro-onnx export (int8
//! or fp32) or from hexgrad's PyTorch checkpoint ([`Params::from_torch`]).
//!
//! The export names most tensors after their consumer nodes (`onnx::MatMul_6547_quantized`,
//! `/encoder/F0.0/Mul_output_0_quantized`), so names come from the graph: the consumer's scope
//! (`/encoder/bert/encoder/.../attention_3/query_3/MatMul_quant`) is the module path
//! (`bert.encoder.albert_layer_groups.0.albert_layers.0.attention.query`). Int8 / uint8 weights
//! are dequantized (`(q - zero_point) * scale`, per tensor or per output channel) into PyTorch
//! layouts: Linear `(out, in)`, Conv1d `(out, in / groups, k)`, ConvTranspose1d
//! `(in, out / groups, k)`, LSTM `weight_ih_l0 (4h, in)` in PyTorch's gate order (i, f, g, o).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kiln_formats::{OnnxFile, OnnxNode, OnnxTensor};

use crate::ModelError;

#[derive(Debug, Clone)]
pub struct Param {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A weight the export stores as 8-bit integers: `q` as uint8 (int8 values shifted by 128,
/// with their zero points), w = (q - zero) * scale per tensor or per output channel.
#[derive(Debug, Clone)]
pub struct QuantParam {
    pub q: Vec<u8>,
    pub zero: Vec<i32>,
    pub scale: Vec<f32>,
}

/// A parameter as held: its values, or (an integer layer's f32 weight) made from the layer's
/// integer form when first read, which a backend that multiplies on integers never does.
enum Entry {
    Ready(Param),
    FromInt {
        shape: Vec<usize>,
        made: std::cell::OnceCell<Param>,
    },
}

impl Entry {
    fn shape(&self) -> &[usize] {
        match self {
            Entry::Ready(p) => &p.shape,
            Entry::FromInt { shape, .. } => shape,
        }
    }
}

pub struct Params {
    file: PathBuf,
    map: BTreeMap<String, Entry>,
    /// The integer form of the convolution and linear weights that the export runs on
    /// integers (a linear one as a convolution of one tap: (n_out, n_in)).
    quantized: BTreeMap<String, QuantParam>,
    /// Weights the export multiplies on integers (their inputs are dynamically quantized).
    integer: BTreeSet<String>,
    unused: RefCell<BTreeSet<String>>,
}

/// The module path of a node: its scope without the wrapper (`encoder`/`decoder`), with
/// PyTorch's call suffixes (`query_3`) and repeated Sequential prefixes (`cnn.0/cnn.0.0`)
/// folded; the predictor's F0/N/shared scopes gain their `predictor.` prefix.
pub fn module_of(node: &str) -> String {
    let comps: Vec<&str> = node.trim_start_matches('/').split('/').collect();
    let comps = &comps[..comps.len().saturating_sub(1)];
    let mut out: Vec<String> = Vec::new();
    for c in comps {
        let c = match c.rfind('_') {
            Some(i) if i + 1 < c.len() && c[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &c[..i],
            _ => c,
        };
        if let Some(last) = out.last_mut() {
            if c.starts_with(&format!("{last}.")) {
                *last = c.to_string();
                continue;
            }
        }
        out.push(c.to_string());
    }
    if out.is_empty() {
        return String::new();
    }
    let wrapper = out.remove(0);
    if wrapper == "encoder"
        && !matches!(
            out.first().map(|s| s.as_str()),
            Some("bert" | "bert_encoder" | "text_encoder" | "predictor")
        )
    {
        out.insert(0, "predictor".into());
    }
    out.join(".")
}

/// An initializer's canonical name: the wrapper prefix dropped (`decoder.decoder.x` -> `decoder.x`).
fn strip_wrapper(name: &str) -> Option<&str> {
    name.strip_prefix("encoder.")
        .or_else(|| name.strip_prefix("decoder."))
}

struct Reader<'a> {
    f: &'a OnnxFile,
}

impl<'a> Reader<'a> {
    fn err(&self, what: String) -> ModelError {
        ModelError::Config {
            file: self.f.path().to_path_buf(),
            what,
        }
    }

    fn init(&self, name: &str, node: &OnnxNode) -> Result<&'a OnnxTensor, ModelError> {
        self.f.initializer(name).ok_or_else(|| {
            self.err(format!(
                "node '{}' ({}) reads '{name}', which is not an initializer",
                node.name, node.op_type
            ))
        })
    }

    fn input(&self, node: &OnnxNode, i: usize) -> Result<&'a OnnxTensor, ModelError> {
        let name = node
            .inputs
            .get(i)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                self.err(format!(
                    "node '{}' ({}) has no input {i}",
                    node.name, node.op_type
                ))
            })?;
        self.init(name, node)
    }

    fn f32s(&self, t: &OnnxTensor) -> Result<Vec<f32>, ModelError> {
        Ok(self.f.f32s(t)?)
    }

    /// `(q - zp) * scale` with scale / zp per tensor or per slice along `axis` of `dims`.
    fn dequant(
        &self,
        q: &OnnxTensor,
        scale: &OnnxTensor,
        zp: Option<&OnnxTensor>,
        axis: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let mut v = self.f32s(q)?;
        let s = self.f32s(scale)?;
        let z = match zp {
            Some(z) => self.f32s(z)?,
            None => vec![0.0],
        };
        let dims: Vec<usize> = q.dims.iter().map(|&d| d as usize).collect();
        let n_axis = dims.get(axis).copied().unwrap_or(1);
        let inner: usize = dims.iter().skip(axis + 1).product();
        // One value for the tensor, or one a channel of `axis`.
        let per_channel = |a: &[f32], what: &str| -> Result<bool, ModelError> {
            match a.len() {
                1 => Ok(false),
                n if n == n_axis && n > 0 => Ok(true),
                n => Err(self.err(format!(
                    "'{}': {what} has {n} values for {n_axis} channels",
                    q.name
                ))),
            }
        };
        if v.is_empty() {
            return Ok(v);
        }
        let (z_each, s_each) = (per_channel(&z, "zero point")?, per_channel(&s, "scale")?);
        // Runs of `inner` values share a channel (in place: no second copy of the weights).
        for (run, xs) in v.chunks_mut(inner.max(1)).enumerate() {
            let ch = run % n_axis.max(1);
            let zv = z[if z_each { ch } else { 0 }];
            let sv = s[if s_each { ch } else { 0 }];
            xs.iter_mut().for_each(|x| *x = (*x - zv) * sv);
        }
        Ok(v)
    }

    /// The integer form of quantized weight `w` (scale and zero points per tensor or per
    /// slice along `axis`), `transposed` from (rows, cols) where the kernel wants that: int8
    /// shifted to uint8 with its zero points, so the sums are the same; None where a value
    /// falls outside uint8.
    fn quant_param(
        &self,
        w: &OnnxTensor,
        scale: &OnnxTensor,
        zp: Option<&OnnxTensor>,
        axis: usize,
        transposed: Option<(usize, usize)>,
    ) -> Result<Option<QuantParam>, ModelError> {
        let d = dims(w);
        let n_axis = d.get(axis).copied().unwrap_or(1);
        let s = self.f32s(scale)?;
        let z = match zp {
            Some(z) => self.f32s(z)?,
            None => vec![0.0],
        };
        for (a, what) in [(&z, "zero point"), (&s, "scale")] {
            if a.len() != 1 && (a.len() != n_axis || n_axis == 0) {
                return Err(self.err(format!(
                    "'{}': {what} has {} values for {n_axis} channels",
                    w.name,
                    a.len()
                )));
            }
        }
        let (q, shift) = match w.ty {
            kiln_formats::OnnxType::I8 => {
                (self.f.bytes(w).iter().map(|&b| b ^ 0x80).collect(), 128.0)
            }
            kiln_formats::OnnxType::U8 => (self.f.bytes(w).to_vec(), 0.0),
            _ => {
                let v = self.f32s(w)?;
                if !v.iter().all(|x| (0.0..=255.0).contains(x)) {
                    return Ok(None);
                }
                (v.iter().map(|&x| x as u8).collect::<Vec<u8>>(), 0.0)
            }
        };
        if q.len() != d.iter().product::<usize>() {
            return Err(self.err(format!("'{}': {} values for dims {d:?}", w.name, q.len())));
        }
        let q = match transposed {
            Some((rows, cols)) => transpose(&q, rows, cols),
            None => q,
        };
        Ok(Some(QuantParam {
            q,
            zero: z.iter().map(|&z| (z + shift) as i32).collect(),
            scale: s,
        }))
    }

    /// Scale initializer of a quantized weight `<base>_quantized`: `<base>_scale`.
    fn scale_of(&self, q: &OnnxTensor, node: &OnnxNode) -> Result<&'a OnnxTensor, ModelError> {
        let base = q.name.strip_suffix("_quantized").ok_or_else(|| {
            self.err(format!(
                "weight '{}' of '{}' is not a quantized initializer",
                q.name, node.name
            ))
        })?;
        self.init(&format!("{base}_scale"), node)
    }
}

fn dims(t: &OnnxTensor) -> Vec<usize> {
    t.dims.iter().map(|&d| d as usize).collect()
}

/// w = g v / |v|: v (out, ...), g (out, 1, ...), the norm of each `out` slice of v.
fn weight_norm(g_name: &str, g: &Param, v: &Param) -> Result<Param, String> {
    let out = v.shape.first().copied().unwrap_or(0);
    // g (out, 1, ...): the norm taken over every dim but the first (PyTorch's dim = 0).
    let g_ok = g.shape.len() == v.shape.len()
        && g.shape.first() == Some(&out)
        && g.shape.iter().skip(1).all(|&d| d == 1);
    if out == 0 || !g_ok || g.data.len() != out || !v.data.len().is_multiple_of(out) {
        return Err(format!(
            "weight norm '{g_name}': magnitude {:?} for direction {:?}",
            g.shape, v.shape
        ));
    }
    let inner = v.data.len() / out;
    let mut data = Vec::with_capacity(v.data.len());
    for (row, &gv) in v.data.chunks_exact(inner.max(1)).zip(&g.data) {
        let norm = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        let k = if norm > 0.0 { gv as f64 / norm } else { 0.0 };
        data.extend(row.iter().map(|&x| (x as f64 * k) as f32));
    }
    Ok(Param {
        shape: v.shape.clone(),
        data,
    })
}

/// Folds each AdaIN's instance-norm affine (`X.norm.weight`, `X.norm.bias`) into its style
/// projection `X.fc` (see [`Params::from_torch`]); computed in f64, exact where w = 1, b = 0.
fn fold_instance_norms(map: &mut BTreeMap<String, Param>) -> Result<(), String> {
    let norms: Vec<String> = map
        .keys()
        .filter_map(|k| k.strip_suffix(".norm.weight"))
        .filter(|base| map.contains_key(&format!("{base}.fc.weight")))
        .map(str::to_string)
        .collect();
    for base in norms {
        let take = |map: &mut BTreeMap<String, Param>, what: &str| {
            map.remove(&format!("{base}.{what}"))
                .ok_or_else(|| format!("AdaIN '{base}' has no '{what}'"))
        };
        let w = take(map, "norm.weight")?.data;
        let b = take(map, "norm.bias")?.data;
        let c = w.len();
        let fw = map
            .get_mut(&format!("{base}.fc.weight"))
            .ok_or_else(|| format!("AdaIN '{base}' has no fc.weight"))?;
        if b.len() != c || fw.shape.len() != 2 || fw.shape[0] != 2 * c {
            return Err(format!(
                "AdaIN '{base}': norm of {c} channels, bias {}, fc {:?}",
                b.len(),
                fw.shape
            ));
        }
        let sd = fw.shape[1];
        let (gw, bw) = fw.data.split_at_mut(c * sd);
        for ch in 0..c {
            let (wc, bc) = (w[ch] as f64, b[ch] as f64);
            for j in 0..sd {
                let gamma = gw[ch * sd + j] as f64;
                bw[ch * sd + j] = (bw[ch * sd + j] as f64 + bc * gamma) as f32;
                gw[ch * sd + j] = (wc * gamma) as f32;
            }
        }
        let fb = map
            .get_mut(&format!("{base}.fc.bias"))
            .filter(|p| p.data.len() == 2 * c)
            .ok_or_else(|| format!("AdaIN '{base}' has no fc.bias of {} values", 2 * c))?;
        let (gb, bb) = fb.data.split_at_mut(c);
        for ch in 0..c {
            let (wc, bc, gamma) = (w[ch] as f64, b[ch] as f64, gb[ch] as f64);
            bb[ch] = (bb[ch] as f64 + bc * (1.0 + gamma)) as f32;
            gb[ch] = (wc * gamma + (wc - 1.0)) as f32;
        }
    }
    Ok(())
}

/// (rows, cols) row-major -> (cols, rows), a 32 x 32 tile at a time through a buffer, so
/// that reads and writes both run along rows (a column walk of a matrix whose rows are a
/// multiple of 4 KiB apart thrashes the cache).
fn transpose<V: Copy + Default>(v: &[V], rows: usize, cols: usize) -> Vec<V> {
    const T: usize = 32;
    let mut out = vec![V::default(); v.len()];
    let mut tile = [[V::default(); T]; T];
    for r0 in (0..rows).step_by(T) {
        let nr = T.min(rows - r0);
        for c0 in (0..cols).step_by(T) {
            let nc = T.min(cols - c0);
            for i in 0..nr {
                let src = &v[(r0 + i) * cols + c0..][..nc];
                for (j, &x) in src.iter().enumerate() {
                    tile[j][i] = x;
                }
            }
            for (j, t) in tile.iter().enumerate().take(nc) {
                out[(c0 + j) * rows + r0..][..nr].copy_from_slice(&t[..nr]);
            }
        }
    }
    out
}

impl Params {
    pub fn from_onnx(f: &OnnxFile) -> Result<Params, ModelError> {
        let r = Reader { f };
        let map: RefCell<BTreeMap<String, Entry>> = Default::default();
        let mut integer = BTreeSet::new();
        let quantized: RefCell<BTreeMap<String, QuantParam>> = Default::default();
        // The first node to name a parameter gives it (its integer form with it).
        let put = |name: String, shape: Vec<usize>, data: Vec<f32>| {
            let mut map = map.borrow_mut();
            map.entry(name)
                .or_insert(Entry::Ready(Param { shape, data }));
        };
        let put_int = |name: String, shape: Vec<usize>, q: QuantParam| {
            // A name without a parameter has no integer form yet either: this one's.
            quantized.borrow_mut().entry(name.clone()).or_insert(q);
            let made = Default::default();
            map.borrow_mut()
                .entry(name)
                .or_insert(Entry::FromInt { shape, made });
        };
        let producer: BTreeMap<&str, &OnnxNode> = f
            .nodes
            .iter()
            .flat_map(|n| n.outputs.iter().map(move |o| (o.as_str(), n)))
            .collect();
        for n in &f.nodes {
            let module = module_of(&n.name);
            match n.op_type.as_str() {
                "MatMulInteger" => {
                    let Some(w) = n.inputs.get(1).and_then(|i| f.initializer(i)) else {
                        continue;
                    };
                    let zp = r.input(n, 3).ok();
                    let d = dims(w);
                    if d.len() != 2 {
                        return Err(r.err(format!("'{}': Linear weight dims {d:?}", w.name)));
                    }
                    let scale = r.scale_of(w, n)?;
                    integer.insert(format!("{module}.weight"));
                    // As integers, a convolution of one tap (n_out, n_in) with zero points
                    // and scales per tensor or per output column; its f32 weight is made from
                    // them if read.
                    match r.quant_param(w, scale, zp, 1, Some((d[0], d[1])))? {
                        Some(q) => put_int(format!("{module}.weight"), vec![d[1], d[0]], q),
                        None => put(
                            format!("{module}.weight"),
                            vec![d[1], d[0]],
                            transpose(&r.dequant(w, scale, zp, 1)?, d[0], d[1]),
                        ),
                    }
                }
                "MatMul" => {
                    let Some(w) = n.inputs.get(1).and_then(|i| f.initializer(i)) else {
                        continue;
                    };
                    let d = dims(w);
                    if d.len() != 2 {
                        return Err(r.err(format!("'{}': Linear weight dims {d:?}", w.name)));
                    }
                    let v = r.f32s(w)?;
                    put(
                        format!("{module}.weight"),
                        vec![d[1], d[0]],
                        transpose(&v, d[0], d[1]),
                    );
                }
                "ConvInteger" => {
                    let w = r.input(n, 1)?;
                    let zp = r.input(n, 3).ok();
                    let scale = r.scale_of(w, n)?;
                    integer.insert(format!("{module}.weight"));
                    match r.quant_param(w, scale, zp, 0, None)? {
                        Some(q) => put_int(format!("{module}.weight"), dims(w), q),
                        None => put(
                            format!("{module}.weight"),
                            dims(w),
                            r.dequant(w, scale, zp, 0)?,
                        ),
                    }
                }
                "Conv" | "ConvTranspose" => {
                    let w = r.input(n, 1)?;
                    put(format!("{module}.weight"), dims(w), r.f32s(w)?);
                    if let Ok(b) = r.input(n, 2) {
                        put(format!("{module}.bias"), dims(b), r.f32s(b)?);
                    }
                }
                "DequantizeLinear" => {
                    // Embedding tables: Gather(table_quantized, ids) -> DequantizeLinear.
                    let Some(g) = n.inputs.first().and_then(|i| producer.get(i.as_str())) else {
                        continue;
                    };
                    let Some(table) = g.inputs.first().and_then(|i| f.initializer(i)) else {
                        continue;
                    };
                    let name = strip_wrapper(&table.name)
                        .and_then(|s| s.strip_suffix("_quantized"))
                        .ok_or_else(|| r.err(format!("embedding table '{}'", table.name)))?;
                    let v = r.dequant(table, r.input(n, 1)?, r.input(n, 2).ok(), 0)?;
                    put(name.to_string(), dims(table), v);
                }
                "LSTM" | "DynamicQuantizeLSTM" => {
                    // W (2, 4h, in), R (2, 4h, h) for LSTM; transposed, (2, in, 4h) and
                    // (2, h, 4h), and 8-bit for the dynamically quantized op. B (2, 8h).
                    let float = n.op_type == "LSTM";
                    let (w, rw, b) = (r.input(n, 1)?, r.input(n, 2)?, r.input(n, 3)?);
                    let (wv, rv) = if float {
                        (r.f32s(w)?, r.f32s(rw)?)
                    } else {
                        (
                            r.dequant(w, r.input(n, 8)?, r.input(n, 9).ok(), 0)?,
                            r.dequant(rw, r.input(n, 10)?, r.input(n, 11).ok(), 0)?,
                        )
                    };
                    let bv = r.f32s(b)?;
                    let (wd, rd) = (dims(w), dims(rw));
                    let (n_in, h4) = match *wd.as_slice() {
                        [2, a, b] if float => (b, a),
                        [2, a, b] => (a, b),
                        _ => (0, 0),
                    };
                    let h = h4 / 4;
                    let r_dims = if float { [2, h4, h] } else { [2, h, h4] };
                    if h4 == 0 || h4 % 4 != 0 || rd != r_dims || bv.len() != 2 * 2 * h4 {
                        return Err(r.err(format!(
                            "LSTM '{}': W dims {wd:?}, R dims {rd:?}, B {} values",
                            n.name,
                            bv.len()
                        )));
                    }
                    // ONNX gate blocks (i, o, f, c) -> PyTorch (i, f, g, o).
                    const ORDER: [usize; 4] = [0, 2, 3, 1];
                    let regate = |m: Vec<f32>, cols: usize| -> Vec<f32> {
                        let mut out = Vec::with_capacity(m.len());
                        for &g in &ORDER {
                            out.extend_from_slice(&m[g * h * cols..(g + 1) * h * cols]);
                        }
                        out
                    };
                    // (4h, cols) of direction `dir` from m holding (2, 4h, cols) or (2, cols, 4h).
                    let gates = |m: &[f32], dir: usize, cols: usize| -> Vec<f32> {
                        let d = &m[dir * cols * h4..(dir + 1) * cols * h4];
                        if float {
                            d.to_vec()
                        } else {
                            transpose(d, cols, h4)
                        }
                    };
                    for dir in 0..2 {
                        let sfx = if dir == 0 { "" } else { "_reverse" };
                        let bd = &bv[dir * 2 * h4..(dir + 1) * 2 * h4];
                        let bias: Vec<f32> = (0..h4).map(|j| bd[j] + bd[h4 + j]).collect();
                        let bias = regate(bias, 1);
                        put(
                            format!("{module}.weight_ih_l0{sfx}"),
                            vec![h4, n_in],
                            regate(gates(&wv, dir, n_in), n_in),
                        );
                        put(
                            format!("{module}.weight_hh_l0{sfx}"),
                            vec![h4, h],
                            regate(gates(&rv, dir, h), h),
                        );
                        put(format!("{module}.bias_l0{sfx}"), vec![h4], bias);
                    }
                }
                "Gemm" => {
                    // y = x B (+ C), B (in, out), or (out, in) with transB = 1: a Linear.
                    let Some(w) = n.inputs.get(1).and_then(|i| f.initializer(i)) else {
                        continue;
                    };
                    let d = dims(w);
                    let trans_b = n.attr_i("transB").unwrap_or(0) == 1;
                    let unit = |a: &str| match n.attr(a) {
                        Some(kiln_formats::onnx::Attr::Float(v)) => *v == 1.0,
                        _ => true,
                    };
                    if d.len() != 2
                        || n.attr_i("transA").unwrap_or(0) != 0
                        || !unit("alpha")
                        || !unit("beta")
                    {
                        return Err(r.err(format!(
                            "Gemm '{}': weight dims {d:?} (a Linear: no transA, alpha = beta = 1)",
                            n.name
                        )));
                    }
                    let v = r.f32s(w)?;
                    let (shape, v) = if trans_b {
                        (d, v)
                    } else {
                        (vec![d[1], d[0]], transpose(&v, d[0], d[1]))
                    };
                    put(format!("{module}.weight"), shape, v);
                    if let Ok(b) = r.input(n, 2) {
                        put(format!("{module}.bias"), dims(b), r.f32s(b)?);
                    }
                }
                _ => {}
            }
        }
        // Float parameters stored under their own names (biases, norms, Snake alphas).
        for t in &f.initializers {
            let Some(name) = strip_wrapper(&t.name) else {
                continue;
            };
            if name.ends_with("_quantized")
                || name.ends_with("_scale")
                || name.ends_with("_zero_point")
            {
                continue;
            }
            if t.ty == kiln_formats::OnnxType::F32 {
                put(name.to_string(), dims(t), r.f32s(t)?);
            }
        }
        let (map, quantized) = (map.into_inner(), quantized.into_inner());
        let unused = RefCell::new(map.keys().cloned().collect());
        Ok(Params {
            file: f.path().to_path_buf(),
            map,
            quantized,
            integer,
            unused,
        })
    }

    /// From hexgrad's checkpoint (`kokoro-v1_0.pth`): a dict of the five modules' state dicts
    /// (`bert`, `bert_encoder`, `predictor`, `text_encoder`, `decoder`), keys prefixed with
    /// `module.` (training's DataParallel), read by [`kiln_formats::read_torch`] as
    /// `<module>.module.<key>`. Folded into the names and forms the model reads:
    ///
    /// - weight norm: `X.weight_g` (out, 1, ..) and `X.weight_v` (or the parametrization's
    ///   `X.parametrizations.weight.original0` / `original1`) -> `X.weight = g v / |v|`, the
    ///   norm over every dim but the first;
    /// - LSTM biases: `bias_ih_l0 + bias_hh_l0` -> `bias_l0` (each direction);
    /// - AdaIN's instance-norm affine (`X.norm.weight` w, `X.norm.bias` b, present when the
    ///   checkpoint has them) into its style projection `X.fc` ([gamma; beta] = W s + c):
    ///   `(1 + gamma)(w n + b) + beta` is `(1 + gamma') n + beta'` with
    ///   `gamma' = w gamma + w - 1` and `beta' = beta + b (1 + gamma)`, both linear in s;
    /// - ALBERT's pooler and `position_ids` buffer (not used for speech) are dropped.
    ///
    /// Every weight is f32 and nothing runs on integers.
    pub fn from_torch(
        file: &Path,
        tensors: Vec<(String, kiln_formats::TorchTensor)>,
    ) -> Result<Params, ModelError> {
        let err = |what: String| ModelError::Config {
            file: file.to_path_buf(),
            what,
        };
        let mut map: BTreeMap<String, Param> = BTreeMap::new();
        for (name, t) in tensors {
            let (section, key) = name.split_once('.').unwrap_or(("", &name));
            let key = key.strip_prefix("module.").unwrap_or(key);
            let name = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            if name.starts_with("bert.pooler.") || name == "bert.embeddings.position_ids" {
                continue;
            }
            let p = Param {
                shape: t.shape,
                data: t.data,
            };
            if map.insert(name.clone(), p).is_some() {
                return Err(err(format!("tensor '{name}' appears twice")));
            }
        }
        let mut out: BTreeMap<String, Param> = BTreeMap::new();
        let names: Vec<String> = map.keys().cloned().collect();
        for name in names {
            let Some(p) = map.remove(&name) else {
                continue; // consumed with its partner
            };
            let pair = |a: &str, b: &str| -> Option<String> {
                name.strip_suffix(a).map(|base| format!("{base}{b}"))
            };
            if let Some(v_name) = pair(".weight_g", ".weight_v").or_else(|| {
                pair(
                    ".parametrizations.weight.original0",
                    ".parametrizations.weight.original1",
                )
            }) {
                let v = map
                    .remove(&v_name)
                    .ok_or_else(|| err(format!("'{name}' without its '{v_name}'")))?;
                let base = v_name
                    .strip_suffix(".weight_v")
                    .or_else(|| v_name.strip_suffix(".parametrizations.weight.original1"))
                    .unwrap_or(&v_name);
                out.insert(
                    format!("{base}.weight"),
                    weight_norm(&name, &p, &v).map_err(err)?,
                );
            } else if name.ends_with(".weight_v") || name.ends_with(".original1") {
                return Err(err(format!("'{name}' without its weight-norm magnitude")));
            } else if let Some((base, sfx)) = name
                .split_once(".bias_ih_l")
                .or_else(|| name.split_once(".bias_hh_l"))
            {
                let (ih, hh) = (
                    format!("{base}.bias_ih_l{sfx}"),
                    format!("{base}.bias_hh_l{sfx}"),
                );
                let other = if name == ih { &hh } else { &ih };
                let o = map
                    .remove(other)
                    .ok_or_else(|| err(format!("'{name}' without its '{other}'")))?;
                if o.data.len() != p.data.len() {
                    return Err(err(format!("'{name}' and '{other}' differ in size")));
                }
                let data = p.data.iter().zip(&o.data).map(|(a, b)| a + b).collect();
                out.insert(
                    format!("{base}.bias_l{sfx}"),
                    Param {
                        shape: p.shape,
                        data,
                    },
                );
            } else {
                out.insert(name, p);
            }
        }
        fold_instance_norms(&mut out).map_err(err)?;
        let unused = RefCell::new(out.keys().cloned().collect());
        Ok(Params {
            file: file.to_path_buf(),
            map: out.into_iter().map(|(k, p)| (k, Entry::Ready(p))).collect(),
            quantized: BTreeMap::new(),
            integer: BTreeSet::new(),
            unused,
        })
    }

    pub fn names(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.shape()))
    }

    /// The parameter `name`, checked against `shape` (a `0` matches any size).
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<&Param, ModelError> {
        Ok(match self.entry(name, shape)? {
            Entry::Ready(p) => p,
            Entry::FromInt { shape, made } => made.get_or_init(|| self.from_int(name, shape)),
        })
    }

    /// As [`Params::get`] without the values: that `name` is there with `shape`, now read.
    pub fn check(&self, name: &str, shape: &[usize]) -> Result<(), ModelError> {
        self.entry(name, shape).map(|_| ())
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry, ModelError> {
        let e = self
            .map
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.file.clone(),
                name: name.into(),
            })?;
        let have = e.shape();
        let ok =
            have.len() == shape.len() && have.iter().zip(shape).all(|(&a, &b)| b == 0 || a == b);
        if !ok {
            return Err(ModelError::Shape {
                file: self.file.clone(),
                name: name.into(),
                expected: shape.iter().map(|&v| v as u64).collect(),
                got: have.iter().map(|&v| v as u64).collect(),
                ty: "f32",
            });
        }
        self.unused.borrow_mut().remove(name);
        Ok(e)
    }

    /// `name`'s f32 values from its integer form: (q - zero) * scale, by row (the first axis)
    /// where they are per channel. The same values as the export's (both shifted by 128).
    fn from_int(&self, name: &str, shape: &[usize]) -> Param {
        let q = &self.quantized[name];
        let rows = shape.first().copied().unwrap_or(1).max(1);
        let inner = q.q.len() / rows;
        let at = |v: usize, r: usize| if v == 1 { 0 } else { r };
        let mut data = Vec::with_capacity(q.q.len());
        for (r, run) in q.q.chunks(inner.max(1)).enumerate() {
            let (z, s) = (
                q.zero[at(q.zero.len(), r)] as f32,
                q.scale[at(q.scale.len(), r)],
            );
            data.extend(run.iter().map(|&x| (x as f32 - z) * s));
        }
        Param {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The integer form of weight `name`, where the export holds one.
    pub fn quantized(&self, name: &str) -> Option<&QuantParam> {
        self.quantized.get(name)
    }

    /// Every layer as the float graph runs it: no integer forms, nothing on integers.
    pub fn drop_integer_forms(&mut self) {
        let names: Vec<String> = self.map.keys().cloned().collect();
        for name in names {
            if let Some(Entry::FromInt { shape, .. }) = self.map.get(&name) {
                let p = self.from_int(&name, shape);
                self.map.insert(name, Entry::Ready(p));
            }
        }
        self.quantized.clear();
        self.integer.clear();
    }

    /// Whether the export runs the layer of weight `name` on integers.
    pub fn is_integer(&self, name: &str) -> bool {
        self.integer.contains(name)
    }

    /// Whether any weight runs on integers (the int8 export): only then are activations
    /// rounded to the export's uint8 grid.
    pub fn is_quantized(&self) -> bool {
        !self.integer.is_empty()
    }

    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Parameters nobody read.
    pub fn unused(&self) -> Vec<String> {
        self.unused.borrow().iter().cloned().collect()
    }
}

#[cfg(test)]
mod torch_tests {
    use super::*;

    #[test]
    fn transpose_moves_every_value() {
        for (rows, cols) in [
            (1, 1),
            (1, 7),
            (7, 1),
            (32, 32),
            (33, 65),
            (100, 31),
            (64, 96),
        ] {
            let v: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transpose(&v, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], v[r * cols + c], "{rows}x{cols} at {r},{c}");
                }
            }
        }
    }

    fn param(shape: &[usize], f: impl Fn(usize) -> f32) -> Param {
        let n = shape.iter().product();
        Param {
            shape: shape.to_vec(),
            data: (0..n).map(f).collect(),
        }
    }

    /// AdaIN with the norm's affine, (1 + gamma)(w n + b) + beta, is the folded fc's
    /// (1 + gamma') n + beta' for any style s and normalized value n.
    #[test]
    fn instance_norm_affine_folds_into_the_style_projection() {
        let (c, sd) = (3, 4);
        let fc_w = param(&[2 * c, sd], |i| ((i * 7 % 11) as f32 - 5.0) / 8.0);
        let fc_b = param(&[2 * c], |i| (i as f32 - 2.5) / 4.0);
        let w = param(&[c], |i| 0.5 + i as f32);
        let b = param(&[c], |i| i as f32 * 0.3 - 0.2);
        let mut map = BTreeMap::new();
        map.insert("a.norm.weight".to_string(), w.clone());
        map.insert("a.norm.bias".to_string(), b.clone());
        map.insert("a.fc.weight".to_string(), fc_w.clone());
        map.insert("a.fc.bias".to_string(), fc_b.clone());
        fold_instance_norms(&mut map).unwrap();
        assert_eq!(map.len(), 2, "the norm's affine is gone");
        let s = [0.3f64, -1.2, 0.7, 2.0];
        let fc = |wt: &Param, bs: &Param, row: usize| -> f64 {
            bs.data[row] as f64
                + (0..sd)
                    .map(|j| wt.data[row * sd + j] as f64 * s[j])
                    .sum::<f64>()
        };
        let (fw, fb) = (&map["a.fc.weight"], &map["a.fc.bias"]);
        for ch in 0..c {
            let (g, be) = (fc(&fc_w, &fc_b, ch), fc(&fc_w, &fc_b, c + ch));
            let (g2, be2) = (fc(fw, fb, ch), fc(fw, fb, c + ch));
            for n in [-1.5f64, 0.0, 0.8] {
                let want = (1.0 + g) * (w.data[ch] as f64 * n + b.data[ch] as f64) + be;
                let got = (1.0 + g2) * n + be2;
                assert!(
                    (want - got).abs() < 1e-5,
                    "channel {ch}, n {n}: {got} vs {want}"
                );
            }
        }
    }

    /// PyTorch's own weight-norm pair (g (2, 1, 1) ones, v (2, 3, 4)), from the torch fixture:
    /// w = g v / |v| per output channel, under `decoder.x.weight`.
    #[test]
    fn weight_norm_pairs_from_pytorch_become_weights() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../kiln-formats/tests/fixtures/torch/state.pth"
        );
        let path = Path::new(path);
        let tensors = kiln_formats::read_torch(path).unwrap();
        let v = tensors
            .iter()
            .find(|(n, _)| n == "decoder.module.x.weight_v")
            .unwrap()
            .1
            .data
            .clone();
        let p = Params::from_torch(path, tensors).unwrap();
        let w = p.get("decoder.x.weight", &[2, 3, 4]).unwrap();
        assert!(!p.has("decoder.x.weight_g") && !p.has("decoder.x.weight_v"));
        for (row_w, row_v) in w.data.chunks(12).zip(v.chunks(12)) {
            let norm = row_v
                .iter()
                .map(|&x| (x as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            for (&a, &b) in row_w.iter().zip(row_v) {
                assert!((a as f64 - b as f64 / norm).abs() < 1e-6);
            }
        }
        // A direction without its magnitude is an error naming it.
        let mut t = kiln_formats::read_torch(path).unwrap();
        t.retain(|(n, _)| n != "decoder.module.x.weight_g");
        let e = Params::from_torch(path, t).err().unwrap().to_string();
        assert!(e.contains("decoder.x.weight_v"), "{e}");
    }
}
