//! Strict weight loading: every read names a canonical parameter ([`Param`]), which the
//! source resolves to its own name; shape and format are checked on every read; tensors
//! nobody read are an error at the end.
//!
//! Sources: a GGUF file (ggml dims, any GGML type) or a safetensors set (row-major shapes;
//! f32/f16/bf16, or MLX affine-quantized `weight`/`scales`/`biases` triples). With a
//! `quant` type, matrices are requantized at load (rows whose length the type's block does
//! not divide fall back like llama.cpp's, see `kiln_quant::fallback_type`).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;

use kiln_backend::{Backend, BackendError, MlxWeightData, WeightData};
use kiln_formats::{GgufFile, SafetensorsSet, StDtype, StTensor};
use kiln_quant::{dequantize, dequantize_row, quantize_row, GgmlType, MlxLayout};

use crate::llm::hf::MlxQuant;
use crate::llm::names::{Naming, Param};
use crate::ModelError;

/// Where the tensors come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    Gguf(&'a GgufFile),
    SafeTensors {
        set: &'a SafetensorsSet,
        /// The checkpoint directory (named in errors about missing tensors).
        dir: &'a std::path::Path,
        mlx: Option<&'a MlxQuant>,
    },
}

pub struct WeightMap<'a> {
    src: Source<'a>,
    unused: RefCell<BTreeSet<String>>,
    quant: Option<GgmlType>,
    /// Gemma: its Hugging Face names, and its norms stored as w - 1 there.
    gemma: bool,
    /// LFM2: its names (Hugging Face, and the GGUF final norm's).
    lfm2: bool,
}

/// A stored matrix, before it goes to the backend.
enum Matrix<'a> {
    Plain {
        ty: GgmlType,
        bytes: &'a [u8],
    },
    Mlx {
        layout: MlxLayout,
        q: &'a [u8],
        scales: Vec<f32>,
        biases: Vec<f32>,
    },
}

impl<'a> WeightMap<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        Self::from_source(Source::Gguf(file), None)
    }

    /// `quant`: requantize every matrix to this type at load.
    pub fn from_source(src: Source<'a>, quant: Option<GgmlType>) -> Self {
        let unused = match src {
            Source::Gguf(g) => g.tensors.iter().map(|t| t.name.clone()).collect(),
            Source::SafeTensors { set, .. } => set.tensors().map(|t| t.name.clone()).collect(),
        };
        WeightMap {
            src,
            unused: RefCell::new(unused),
            quant,
            gemma: false,
            lfm2: false,
        }
    }

    /// The weights of a model of architecture `arch` (Gemma's Hugging Face checkpoints
    /// name and store some parameters their own way).
    pub fn for_arch(mut self, arch: &str) -> Self {
        self.gemma = arch == "gemma3";
        self.lfm2 = arch == "lfm2";
        self
    }

    fn naming(&self) -> Naming {
        match self.src {
            Source::Gguf(_) if self.lfm2 => Naming::GgufLfm2,
            Source::Gguf(_) => Naming::Gguf,
            Source::SafeTensors { .. } if self.lfm2 => Naming::HuggingFaceLfm2,
            Source::SafeTensors { .. } if self.gemma => Naming::HuggingFaceGemma,
            Source::SafeTensors { .. } => Naming::HuggingFace,
        }
    }

    /// The file (GGUF) or directory (safetensors) errors name when no single file applies.
    /// The file (or checkpoint directory) the weights come from.
    pub fn origin(&self) -> PathBuf {
        match self.src {
            Source::Gguf(g) => g.path().into(),
            Source::SafeTensors { dir, .. } => dir.into(),
        }
    }

    fn stored_name(&self, p: Param) -> Option<String> {
        p.name(self.naming())
    }

    pub fn has(&self, p: Param) -> bool {
        let Some(name) = self.stored_name(p) else {
            return false;
        };
        match self.src {
            Source::Gguf(g) => g.tensor(&name).is_some(),
            Source::SafeTensors { set, .. } => set.tensor(&name).is_some(),
        }
    }

    /// Marks a tensor as read without loading it (e.g. a tied `lm_head.weight` some
    /// exporters save anyway).
    pub fn skip(&self, p: Param) {
        if let Some(name) = self.stored_name(p) {
            self.unused.borrow_mut().remove(&name);
        }
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor {
            file: self.origin(),
            name: name.into(),
        }
    }

    fn shape_err(
        &self,
        file: PathBuf,
        name: &str,
        expected: &[u64],
        got: &[u64],
        ty: &'static str,
    ) -> ModelError {
        ModelError::Shape {
            file,
            name: name.into(),
            expected: expected.to_vec(),
            got: got.to_vec(),
            ty,
        }
    }

    /// A safetensors tensor of exactly `shape` (row-major).
    fn st(
        &self,
        set: &'a SafetensorsSet,
        name: &str,
        shape: &[u64],
    ) -> Result<&'a StTensor, ModelError> {
        let t = set.tensor(name).ok_or_else(|| self.missing(name))?;
        if t.shape != shape {
            return Err(self.shape_err(
                set.path_of(t).into(),
                name,
                shape,
                &t.shape,
                t.dtype.name(),
            ));
        }
        self.unused.borrow_mut().remove(name);
        Ok(t)
    }

    fn float_type(&self, set: &SafetensorsSet, t: &StTensor) -> Result<GgmlType, ModelError> {
        match t.dtype {
            StDtype::F32 => Ok(GgmlType::F32),
            StDtype::F16 => Ok(GgmlType::F16),
            StDtype::BF16 => Ok(GgmlType::BF16),
            other => Err(ModelError::Config {
                file: set.path_of(t).into(),
                what: format!(
                    "tensor '{}' is {} (expected F32, F16 or BF16)",
                    t.name,
                    other.name()
                ),
            }),
        }
    }

    /// Scales or biases as f32.
    fn floats(&self, set: &SafetensorsSet, t: &StTensor) -> Result<Vec<f32>, ModelError> {
        let ty = self.float_type(set, t)?;
        let n = t.n_elements() as usize;
        dequantize(ty, set.data(t), n).map_err(|source| ModelError::Backend {
            file: set.path_of(t).into(),
            source: BackendError::Quant {
                name: t.name.clone(),
                source,
            },
        })
    }

    fn stored_matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(Matrix<'a>, PathBuf), ModelError> {
        match self.src {
            Source::Gguf(g) => {
                let file = g.path().to_path_buf();
                let t = g.tensor(name).ok_or_else(|| self.missing(name))?;
                let dims = [cols as u64, rows as u64];
                if t.dims != dims {
                    return Err(self.shape_err(file, name, &dims, &t.dims, t.ty.name()));
                }
                self.unused.borrow_mut().remove(name);
                Ok((
                    Matrix::Plain {
                        ty: t.ty,
                        bytes: g.tensor_data(t),
                    },
                    file,
                ))
            }
            Source::SafeTensors { set, mlx, .. } => {
                let base = name.strip_suffix(".weight").unwrap_or(name);
                let scales_name = format!("{base}.scales");
                let q = mlx.and_then(|m| m.of(base));
                match (set.tensor(&scales_name), q) {
                    (Some(_), Some((bits, group))) => {
                        let bad_layout = |source| ModelError::Backend {
                            file: self.origin(),
                            source: BackendError::Quant { name: name.into(), source },
                        };
                        let layout = MlxLayout::new(bits, group, cols).map_err(bad_layout)?;
                        let packed_cols = (cols * bits as usize / 32) as u64;
                        let wt = self.st(set, name, &[rows as u64, packed_cols])?;
                        if !matches!(wt.dtype, StDtype::U32 | StDtype::I32) {
                            return Err(ModelError::Config {
                                file: set.path_of(wt).into(),
                                what: format!("MLX weight '{name}' is {}, expected U32", wt.dtype.name()),
                            });
                        }
                        let gshape = [rows as u64, (cols / group) as u64];
                        let st = self.st(set, &scales_name, &gshape)?;
                        let bt = self.st(set, &format!("{base}.biases"), &gshape)?;
                        let (scales, biases) = (self.floats(set, st)?, self.floats(set, bt)?);
                        Ok((
                            Matrix::Mlx { layout, q: set.data(wt), scales, biases },
                            set.path_of(wt).into(),
                        ))
                    }
                    (Some(_), None) => Err(ModelError::Config {
                        file: self.origin(),
                        what: format!(
                            "'{scales_name}' is present but config.json has no MLX quantization for '{base}'"
                        ),
                    }),
                    (None, _) => {
                        let t = self.st(set, name, &[rows as u64, cols as u64])?;
                        let ty = self.float_type(set, t)?;
                        Ok((Matrix::Plain { ty, bytes: set.data(t) }, set.path_of(t).into()))
                    }
                }
            }
        }
    }

    fn release(&self, name: &str) {
        match self.src {
            Source::Gguf(g) => {
                if let Some(t) = g.tensor(name) {
                    g.release(t)
                }
            }
            Source::SafeTensors { set, .. } => {
                if let Some(t) = set.tensor(name) {
                    set.release(t)
                }
            }
        }
    }

    /// A matrix of `rows` x `cols`, in its stored format (or the load-time `quant` type).
    pub fn matrix<B: Backend>(
        &self,
        b: &B,
        p: Param,
        rows: usize,
        cols: usize,
    ) -> Result<B::Weight, ModelError> {
        let name = self.stored_name(p).ok_or_else(|| self.missing(&p.gguf()))?;
        let (m, file) = self.stored_matrix(&name, rows, cols)?;
        let backend_err = |source| ModelError::Backend {
            file: file.clone(),
            source,
        };
        let w = match (self.quant, m) {
            (Some(target), m) => {
                let ty = kiln_quant::fallback_type(target, cols);
                let bytes = requantize(&name, &m, rows, cols, ty).map_err(backend_err)?;
                b.load_weight(WeightData {
                    name: &name,
                    ty,
                    rows,
                    cols,
                    bytes: &bytes,
                })
            }
            (None, Matrix::Plain { ty, bytes }) => b.load_weight(WeightData {
                name: &name,
                ty,
                rows,
                cols,
                bytes,
            }),
            (
                None,
                Matrix::Mlx {
                    layout,
                    q,
                    scales,
                    biases,
                },
            ) => b.load_weight_mlx(MlxWeightData {
                name: &name,
                layout,
                rows,
                cols,
                q,
                scales: &scales,
                biases: &biases,
            }),
        }
        .map_err(backend_err)?;
        // The backend owns its copy now: the mapped pages need not stay resident.
        self.release(&name);
        Ok(w)
    }

    /// A vector of `n` values, as f32.
    pub fn vector<B: Backend>(&self, b: &B, p: Param, n: usize) -> Result<B::Tensor, ModelError> {
        let v = self.vector_host(p, n)?;
        Ok(b.tensor_from(1, n, &v))
    }

    pub fn vector_host(&self, p: Param, n: usize) -> Result<Vec<f32>, ModelError> {
        self.floats_host(p, &[n as u64], &[n as u64])
    }

    /// A small tensor as f32, of GGUF dims `gguf_dims` or safetensors shape `st_shape`
    /// (the same values in the same order: LFM2's taps are GGUF [k, dim], HF (dim, 1, k)).
    pub fn floats_host(
        &self,
        p: Param,
        gguf_dims: &[u64],
        st_shape: &[u64],
    ) -> Result<Vec<f32>, ModelError> {
        let n = gguf_dims.iter().product::<u64>() as usize;
        let name = self.stored_name(p).ok_or_else(|| self.missing(&p.gguf()))?;
        let (ty, bytes, file) = match self.src {
            Source::Gguf(g) => {
                let file = g.path().to_path_buf();
                let t = g.tensor(&name).ok_or_else(|| self.missing(&name))?;
                if t.dims != gguf_dims {
                    return Err(self.shape_err(file, &name, gguf_dims, &t.dims, t.ty.name()));
                }
                self.unused.borrow_mut().remove(&name);
                (t.ty, g.tensor_data(t), file)
            }
            Source::SafeTensors { set, .. } => {
                let t = self.st(set, &name, st_shape)?;
                (
                    self.float_type(set, t)?,
                    set.data(t),
                    set.path_of(t).to_path_buf(),
                )
            }
        };
        let mut v = dequantize(ty, bytes, n).map_err(|source| ModelError::Backend {
            file,
            source: BackendError::Quant { name, source },
        })?;
        if self.naming() == Naming::HuggingFaceGemma && p.is_norm() {
            // Gemma's RMSNorm scales by 1 + w (GGUF conversion stored 1 + w already).
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        Ok(v)
    }

    /// Errors if some tensor of the source was never read.
    pub fn finish(self, arch: &str) -> Result<(), ModelError> {
        let file = self.origin();
        let unused = self.unused.into_inner();
        if unused.is_empty() {
            return Ok(());
        }
        let mut names: Vec<&str> = unused.iter().map(|s| s.as_str()).take(8).collect();
        if unused.len() > 8 {
            names.push("...");
        }
        Err(ModelError::UnusedTensors {
            file,
            arch: arch.into(),
            n: unused.len(),
            names: names.join(", "),
        })
    }
}

/// A stored matrix re-encoded as `ty`, row by row through f32.
fn requantize(
    name: &str,
    m: &Matrix,
    rows: usize,
    cols: usize,
    ty: GgmlType,
) -> Result<Vec<u8>, BackendError> {
    let quant = |source| BackendError::Quant {
        name: name.into(),
        source,
    };
    let rb = ty.row_bytes(cols).map_err(quant)?;
    let mut out = vec![0u8; rows * rb];
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        match m {
            Matrix::Plain { ty: src, bytes } => {
                let srb = src.row_bytes(cols).map_err(quant)?;
                let src_row =
                    bytes
                        .get(r * srb..(r + 1) * srb)
                        .ok_or_else(|| BackendError::Weight {
                            name: name.into(),
                            what: format!(
                                "{} bytes hold fewer than {rows} rows of {cols}",
                                bytes.len()
                            ),
                        })?;
                dequantize_row(*src, src_row, &mut row).map_err(quant)?;
            }
            Matrix::Mlx {
                layout,
                q,
                scales,
                biases,
            } => {
                let (qb, g) = (layout.q_bytes(cols), layout.groups(cols));
                kiln_quant::mlx_dequantize_row(
                    *layout,
                    &q[r * qb..(r + 1) * qb],
                    &scales[r * g..(r + 1) * g],
                    &biases[r * g..(r + 1) * g],
                    &mut row,
                )
                .map_err(quant)?;
            }
        }
        quantize_row(ty, &row, &mut out[r * rb..(r + 1) * rb]).map_err(quant)?;
    }
    Ok(out)
}
