//! safetensors files (one, or a sharded set listed by `model.safetensors.index.json`), mapped
//! read-only. The header of each file is parsed and validated by the `safetensors` crate
//! (offsets contiguous, sizes matching dtype x shape, the data ending where the file ends);
//! every tensor is then a checked byte range of its file's map.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

use crate::bytes::Bytes;
use crate::FormatError;

/// Element types kiln reads from safetensors files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StDtype {
    F32,
    F16,
    BF16,
    U32,
    I32,
    U8,
    I8,
    I64,
    F64,
}

impl StDtype {
    pub fn name(self) -> &'static str {
        match self {
            StDtype::F32 => "F32",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
            StDtype::U32 => "U32",
            StDtype::I32 => "I32",
            StDtype::U8 => "U8",
            StDtype::I8 => "I8",
            StDtype::I64 => "I64",
            StDtype::F64 => "F64",
        }
    }

    fn from_dtype(d: Dtype) -> Option<Self> {
        Some(match d {
            Dtype::F32 => StDtype::F32,
            Dtype::F16 => StDtype::F16,
            Dtype::BF16 => StDtype::BF16,
            Dtype::U32 => StDtype::U32,
            Dtype::I32 => StDtype::I32,
            Dtype::U8 => StDtype::U8,
            Dtype::I8 => StDtype::I8,
            Dtype::I64 => StDtype::I64,
            Dtype::F64 => StDtype::F64,
            _ => return None,
        })
    }
}

/// One tensor of a safetensors set: its shape as stored (row-major, outermost first), dtype
/// and where its bytes are.
#[derive(Debug, Clone)]
pub struct StTensor {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<u64>,
    file: usize,
    start: usize,
    end: usize,
}

impl StTensor {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn n_bytes(&self) -> usize {
        self.end - self.start
    }
}

struct Mapped {
    path: PathBuf,
    mmap: Bytes,
}

/// The tensors of one model, possibly spread over several files.
pub struct SafetensorsSet {
    files: Vec<Mapped>,
    tensors: BTreeMap<String, StTensor>,
}

const INDEX: &str = "model.safetensors.index.json";

impl SafetensorsSet {
    /// A directory's weights: the shards named by `model.safetensors.index.json`, else
    /// `model.safetensors`, else every `*.safetensors` file in it.
    pub fn open_dir(dir: &Path) -> Result<Self, FormatError> {
        let index = dir.join(INDEX);
        let files = if index.is_file() {
            shards_of_index(&index)?
                .into_iter()
                .map(|f| dir.join(f))
                .collect()
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let rd = std::fs::read_dir(dir).map_err(|source| FormatError::Io {
                path: dir.into(),
                source,
            })?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            if v.is_empty() {
                return Err(FormatError::Invalid {
                    path: dir.into(),
                    what: "no .safetensors weights in this directory".into(),
                });
            }
            v
        };
        Self::open_files(&files)
    }

    /// One file, or several whose tensor names must not repeat.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, FormatError> {
        let mut set = SafetensorsSet {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for path in paths {
            set.add_file(path)?;
        }
        Ok(set)
    }

    fn add_file(&mut self, path: &Path) -> Result<(), FormatError> {
        let io = |source| FormatError::Io {
            path: path.into(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; the file is not expected to change while in use (the
        // same contract every model loader that maps files has).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        self.add(path, Bytes::Map(mmap))
    }

    /// Files held in memory (`(name, bytes)`, names only label errors), as `open_files` reads
    /// them from disk.
    pub fn from_bytes(files: Vec<(PathBuf, Vec<u8>)>) -> Result<Self, FormatError> {
        let mut set = SafetensorsSet {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for (path, bytes) in files {
            set.add(&path, Bytes::Owned(bytes))?;
        }
        Ok(set)
    }

    fn add(&mut self, path: &Path, mmap: Bytes) -> Result<(), FormatError> {
        let (n, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| FormatError::NotFormat {
            path: path.into(),
            format: "safetensors",
            why: e.to_string(),
        })?;
        let base = 8usize.saturating_add(n);
        let fi = self.files.len();
        for (name, info) in meta.tensors() {
            let dtype = StDtype::from_dtype(info.dtype).ok_or_else(|| FormatError::Tensor {
                path: path.into(),
                name: name.clone(),
                what: format!("dtype {:?} is not supported", info.dtype),
            })?;
            let (s, e) = info.data_offsets;
            // read_metadata checked that offsets are contiguous, sized by dtype x shape and end
            // with the file; check the range once more before holding on to it.
            let (start, end) = (base.saturating_add(s), base.saturating_add(e));
            if start > end || end > mmap.len() {
                return Err(FormatError::Truncated {
                    path: path.into(),
                    what: format!("tensor '{name}'"),
                    needed: end as u64,
                    len: mmap.len() as u64,
                });
            }
            let t = StTensor {
                name: name.clone(),
                dtype,
                shape: info.shape.iter().map(|&d| d as u64).collect(),
                file: fi,
                start,
                end,
            };
            if let Some(prev) = self.tensors.insert(name.clone(), t) {
                return Err(FormatError::Tensor {
                    path: path.into(),
                    name,
                    what: format!("also stored in {}", self.files[prev.file].path.display()),
                });
            }
        }
        self.files.push(Mapped {
            path: path.into(),
            mmap,
        });
        Ok(())
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.tensors.get(name)
    }

    /// Every tensor, by name.
    pub fn tensors(&self) -> impl Iterator<Item = &StTensor> {
        self.tensors.values()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The file holding the tensor.
    pub fn path_of(&self, t: &StTensor) -> &Path {
        &self.files[t.file].path
    }

    /// The files of the set, in the order they were opened.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// The tensor's bytes (little-endian, row-major).
    pub fn data(&self, t: &StTensor) -> &[u8] {
        &self.files[t.file].mmap[t.start..t.end]
    }

    /// Tells the OS the tensor's pages may be dropped (a hint; see `GgufFile::release`).
    pub fn release(&self, t: &StTensor) {
        self.files[t.file].mmap.release(t.start, t.end);
    }
}

/// Shard file names listed in an index's `weight_map`, each once, in first-seen order.
fn shards_of_index(index: &Path) -> Result<Vec<String>, FormatError> {
    let text = std::fs::read_to_string(index).map_err(|source| FormatError::Io {
        path: index.into(),
        source,
    })?;
    parse_index(index, &text)
}

/// The shard file names of `model.safetensors.index.json` text (`index` names it in errors):
/// plain file names only, each once, in first-seen order.
pub fn parse_index(index: &Path, text: &str) -> Result<Vec<String>, FormatError> {
    let bad = |what: String| FormatError::Invalid {
        path: index.into(),
        what,
    };
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no 'weight_map' object".into()))?;
    let mut out: Vec<String> = Vec::new();
    for (name, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| bad(format!("weight_map['{name}'] is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(bad(format!("shard name '{f}' must be a plain file name")));
        }
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    if out.is_empty() {
        return Err(bad("'weight_map' lists no files".into()));
    }
    Ok(out)
}
