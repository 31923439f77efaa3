//! Strict weight loading: every read checks name, shape and format; tensors nobody read are
//! an error at the end.

use std::cell::RefCell;
use std::collections::BTreeSet;

use kiln_backend::{Backend, WeightData};
use kiln_formats::{GgufFile, TensorInfo};
use kiln_quant::{dequantize, GgmlType};

use crate::ModelError;

pub struct WeightMap<'a> {
    file: &'a GgufFile,
    unused: RefCell<BTreeSet<String>>,
}

impl<'a> WeightMap<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        let unused = file.tensors.iter().map(|t| t.name.clone()).collect();
        WeightMap {
            file,
            unused: RefCell::new(unused),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    fn info(&self, name: &str, dims: &[u64]) -> Result<&'a TensorInfo, ModelError> {
        let file = self.file.path().to_path_buf();
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: file.clone(),
                name: name.into(),
            })?;
        if t.dims != dims {
            return Err(ModelError::Shape {
                file,
                name: name.into(),
                expected: dims.to_vec(),
                got: t.dims.clone(),
                ty: t.ty.name(),
            });
        }
        self.unused.borrow_mut().remove(name);
        Ok(t)
    }

    /// A matrix of `rows` x `cols` (ggml dims `[cols, rows]`), in its stored format.
    pub fn matrix<B: Backend>(
        &self,
        b: &B,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<B::Weight, ModelError> {
        let t = self.info(name, &[cols as u64, rows as u64])?;
        let data = WeightData {
            name,
            ty: t.ty,
            rows,
            cols,
            bytes: self.file.tensor_data(t),
        };
        let w = b.load_weight(data).map_err(|source| ModelError::Backend {
            file: self.file.path().into(),
            source,
        })?;
        // The backend owns its copy now: the mapped pages need not stay resident.
        self.file.release(t);
        Ok(w)
    }

    /// A vector of `n` values, as f32.
    pub fn vector<B: Backend>(&self, b: &B, name: &str, n: usize) -> Result<B::Tensor, ModelError> {
        let v = self.vector_host(name, n)?;
        Ok(b.tensor_from(1, n, &v))
    }

    pub fn vector_host(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name, &[n as u64])?;
        let bytes = self.file.tensor_data(t);
        let v = match t.ty {
            GgmlType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            ty => dequantize(ty, bytes, n).map_err(|e| ModelError::Backend {
                file: self.file.path().into(),
                source: kiln_backend::BackendError::Quant {
                    name: name.into(),
                    source: e,
                },
            })?,
        };
        Ok(v)
    }

    /// Errors if some tensor of the file was never read.
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
