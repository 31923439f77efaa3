//! Strict loading from a CTranslate2 `model.bin`: every read checks name, shape and dtype;
//! variables nobody read are an error at the end. Matrices may be quantized at load.

use std::cell::RefCell;
use std::collections::BTreeSet;

use kiln_backend::{Backend, BackendError, WeightData};
use kiln_formats::{Ct2Dtype, Ct2File, Ct2Var};
use kiln_quant::{quantize_row, GgmlType};

use crate::ModelError;

pub struct Ct2Weights<'a> {
    pub file: &'a Ct2File,
    unused: RefCell<BTreeSet<String>>,
    /// Format to quantize linear weights into at load (None: keep the file's).
    quant: Option<GgmlType>,
    /// Whether `quant` applies to the matrices loaded now.
    quant_on: std::cell::Cell<bool>,
}

impl<'a> Ct2Weights<'a> {
    pub fn new(file: &'a Ct2File, quant: Option<GgmlType>) -> Self {
        let unused = file.vars.iter().map(|v| v.name.clone()).collect();
        Ct2Weights {
            file,
            unused: RefCell::new(unused),
            quant,
            quant_on: std::cell::Cell::new(true),
        }
    }

    /// Turns quantization at load on or off for the matrices read from now on.
    pub fn set_quantize(&self, on: bool) {
        self.quant_on.set(on);
    }

    fn err_backend(&self, source: BackendError) -> ModelError {
        ModelError::Backend {
            file: self.file.path().into(),
            source,
        }
    }

    /// The variable `name` (or an alias of it) with exactly `shape`.
    pub fn var(&self, name: &str, shape: &[u64]) -> Result<&'a Ct2Var, ModelError> {
        let file = self.file.path().to_path_buf();
        let v = self
            .file
            .var(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: file.clone(),
                name: name.into(),
            })?;
        if v.shape != shape {
            return Err(ModelError::Shape {
                file,
                name: name.into(),
                expected: shape.to_vec(),
                got: v.shape.clone(),
                ty: v.dtype.name(),
            });
        }
        self.unused.borrow_mut().remove(&v.name);
        Ok(v)
    }

    /// Values of a float variable as f32.
    pub fn floats(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let v = self.var(name, shape)?;
        Ok(self.file.f32_values(v)?)
    }

    pub fn vector<B: Backend>(&self, b: &B, name: &str, n: usize) -> Result<B::Tensor, ModelError> {
        Ok(b.tensor_from(1, n, &self.floats(name, &[n as u64])?))
    }

    /// A slice of a vector (a fused q/k/v bias split in parts).
    pub fn vector_part<B: Backend>(
        &self,
        b: &B,
        name: &str,
        n: usize,
        part: (usize, usize),
    ) -> Result<B::Tensor, ModelError> {
        let all = self.floats(name, &[n as u64])?;
        Ok(b.tensor_from(1, part.1 - part.0, &all[part.0..part.1]))
    }

    /// A matrix `rows x cols` (stored `[rows, cols]`, or any shape whose trailing dims
    /// multiply to `cols`, like a conv kernel), rows `r0..r1` of it.
    pub fn matrix_rows<B: Backend>(
        &self,
        b: &B,
        name: &str,
        shape: &[u64],
        rows: (usize, usize),
        quantize: bool,
    ) -> Result<B::Weight, ModelError> {
        let v = self.var(name, shape)?;
        let cols: u64 = shape[1..].iter().product();
        let cols = cols as usize;
        let ty = match v.dtype {
            Ct2Dtype::F32 => GgmlType::F32,
            Ct2Dtype::F16 => GgmlType::F16,
            Ct2Dtype::BF16 => GgmlType::BF16,
            t => {
                return Err(ModelError::Config {
                    file: self.file.path().into(),
                    what: format!(
                        "tensor '{name}' is {}; kiln reads float32/float16/bfloat16 CTranslate2 \
                         models (convert with --quantization float16)",
                        t.name()
                    ),
                })
            }
        };
        let es = v.dtype.size();
        let bytes = &self.file.data(v)[rows.0 * cols * es..rows.1 * cols * es];
        let n_rows = rows.1 - rows.0;
        let target = self
            .quant
            .filter(|q| quantize && self.quant_on.get() && cols % q.block_size() == 0);
        let w = match target {
            None => b.load_weight(WeightData {
                name,
                ty,
                rows: n_rows,
                cols,
                bytes,
            }),
            Some(q) => {
                let floats = self.file.f32_values(v)?;
                let rb = q.row_bytes(cols).map_err(|source| {
                    self.err_backend(BackendError::Quant {
                        name: name.into(),
                        source,
                    })
                })?;
                let mut out = vec![0u8; rb * n_rows];
                for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
                    let src = &floats[(rows.0 + r) * cols..(rows.0 + r + 1) * cols];
                    quantize_row(q, src, dst).map_err(|source| {
                        self.err_backend(BackendError::Quant {
                            name: name.into(),
                            source,
                        })
                    })?;
                }
                b.load_weight(WeightData {
                    name,
                    ty: q,
                    rows: n_rows,
                    cols,
                    bytes: &out,
                })
            }
        };
        let mut w = w.map_err(|e| self.err_backend(e))?;
        if !self.quant_on.get() {
            // Weights kept in the file's format are those run once per window over every
            // position (the encoder, the cross-attention keys/values).
            b.prefer_batches(&mut w);
        }
        Ok(w)
    }

    /// A whole matrix `[rows, cols]`.
    pub fn matrix<B: Backend>(
        &self,
        b: &B,
        name: &str,
        rows: usize,
        cols: usize,
        quantize: bool,
    ) -> Result<B::Weight, ModelError> {
        self.matrix_rows(b, name, &[rows as u64, cols as u64], (0, rows), quantize)
    }

    /// Marks a variable as understood without loading it (config scalars).
    pub fn touch(&self, name: &str) {
        if let Some(v) = self.file.var(name) {
            self.unused.borrow_mut().remove(&v.name);
        }
    }

    pub fn finish(self, arch: &str) -> Result<(), ModelError> {
        let unused = self.unused.into_inner();
        if unused.is_empty() {
            return Ok(());
        }
        let mut names: Vec<&str> = unused.iter().map(|s| s.as_str()).take(8).collect();
        if unused.len() > 8 {
            names.push("...");
        }
        Err(ModelError::UnusedTensors {
            file: self.file.path().into(),
            arch: arch.into(),
            n: unused.len(),
            names: names.join(", "),
        })
    }
}
