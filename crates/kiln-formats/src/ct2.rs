//! CTranslate2 `model.bin` (binary versions 1..=6), memory-mapped.
//!
//! Layout (little-endian; string = `u16 len | len bytes`, NUL-terminated):
//! `u32 version | [v>=2: string spec_name | u32 spec_revision] | u32 n_vars | var* |
//!  [v>=3: u32 n_aliases | (string alias, string target)*]`
//! var: `string name | u8 rank | u32 dims[rank] | v>=4: (u8 dtype | u32 n_bytes)
//!       else (u8 item_size | u32 n_items) | data`
//! Dims are outermost first (a linear weight is `[out, in]`). Scalars (rank 0) hold one value.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::bytes::Bytes;
use crate::FormatError;

/// The newest binary version this reader knows.
pub const MAX_VERSION: u32 = 6;
const MAX_RANK: usize = 8;

/// Element types of CTranslate2's `DataType`, by their stored id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ct2Dtype {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl Ct2Dtype {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Ct2Dtype::F32,
            1 => Ct2Dtype::I8,
            2 => Ct2Dtype::I16,
            3 => Ct2Dtype::I32,
            4 => Ct2Dtype::F16,
            5 => Ct2Dtype::BF16,
            _ => return None,
        })
    }

    /// Versions before 4 stored only the item size.
    fn from_item_size(size: u8) -> Option<Self> {
        Some(match size {
            4 => Ct2Dtype::F32,
            2 => Ct2Dtype::I16,
            1 => Ct2Dtype::I8,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Ct2Dtype::I8 => 1,
            Ct2Dtype::I16 | Ct2Dtype::F16 | Ct2Dtype::BF16 => 2,
            Ct2Dtype::F32 | Ct2Dtype::I32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Ct2Dtype::F32 => "float32",
            Ct2Dtype::I8 => "int8",
            Ct2Dtype::I16 => "int16",
            Ct2Dtype::I32 => "int32",
            Ct2Dtype::F16 => "float16",
            Ct2Dtype::BF16 => "bfloat16",
        }
    }
}

/// One variable: its shape, type and where its bytes lie in the file.
#[derive(Debug, Clone)]
pub struct Ct2Var {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: Ct2Dtype,
    pub offset: u64,
    pub n_bytes: u64,
}

impl Ct2Var {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

pub struct Ct2File {
    path: PathBuf,
    map: Bytes,
    pub version: u32,
    pub spec: String,
    pub revision: u32,
    pub vars: Vec<Ct2Var>,
    index: HashMap<String, usize>,
    /// alias -> target variable name
    pub aliases: HashMap<String, String>,
}

struct Reader<'a> {
    path: &'a Path,
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&[u8], FormatError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(FormatError::Truncated {
                path: self.path.into(),
                what: what(),
                needed: self.pos as u64 + n as u64,
                len: self.b.len() as u64,
            });
        };
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, FormatError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16, FormatError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let n = self.u16(what)? as usize;
        let s = self.take(n, what)?;
        // NUL-terminated: the name is what precedes the first NUL.
        let s = s.split(|&c| c == 0).next().unwrap_or(&[]);
        String::from_utf8(s.to_vec()).map_err(|_| FormatError::Invalid {
            path: self.path.into(),
            what: format!("{}: not UTF-8", what()),
        })
    }
}

impl Ct2File {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref();
        let io = |source| FormatError::Io {
            path: path.into(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; model files are not modified while in use.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Bytes::Map(map))
    }

    /// Parses a model.bin image held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::parse(path.as_ref(), Bytes::Owned(bytes))
    }

    fn parse(path: &Path, map: Bytes) -> Result<Self, FormatError> {
        let invalid = |what: String| FormatError::Invalid {
            path: path.into(),
            what,
        };
        if map.len() < 4 {
            return Err(FormatError::NotFormat {
                path: path.into(),
                format: "CTranslate2 model.bin",
                why: format!("{} bytes", map.len()),
            });
        }
        let mut r = Reader {
            path,
            b: &map,
            pos: 0,
        };
        let version = r.u32(&|| "binary version".into())?;
        if version == 0 || version > MAX_VERSION {
            return Err(FormatError::NotFormat {
                path: path.into(),
                format: "CTranslate2 model.bin",
                why: format!("binary version {version} (kiln reads 1..={MAX_VERSION})"),
            });
        }
        let (spec, revision) = if version >= 2 {
            let spec = r.string(&|| "spec name".into())?;
            (spec, r.u32(&|| "spec revision".into())?)
        } else {
            (String::new(), 1)
        };
        let n_vars = r.u32(&|| "variable count".into())? as usize;
        // Each variable takes at least 8 bytes: a count beyond that is a corrupt header.
        if n_vars > map.len() / 8 {
            return Err(invalid(format!(
                "{n_vars} variables cannot fit in {} bytes",
                map.len()
            )));
        }
        let mut vars = Vec::with_capacity(n_vars);
        let mut index = HashMap::with_capacity(n_vars);
        for i in 0..n_vars {
            let name = r.string(&|| format!("name of variable {i}"))?;
            let what = |s: &str| format!("variable '{name}': {s}");
            let rank = r.u8(&|| what("rank"))? as usize;
            if rank > MAX_RANK {
                return Err(FormatError::Tensor {
                    path: path.into(),
                    name,
                    what: format!("rank {rank} (at most {MAX_RANK})"),
                });
            }
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(r.u32(&|| what("dims"))? as u64);
            }
            let (dtype, n_bytes) = if version >= 4 {
                let id = r.u8(&|| what("dtype"))?;
                let dtype = Ct2Dtype::from_id(id).ok_or_else(|| FormatError::Tensor {
                    path: path.into(),
                    name: name.clone(),
                    what: format!("unknown dtype id {id}"),
                })?;
                (dtype, r.u32(&|| what("byte count"))? as u64)
            } else {
                let size = r.u8(&|| what("item size"))?;
                let dtype = Ct2Dtype::from_item_size(size).ok_or_else(|| FormatError::Tensor {
                    path: path.into(),
                    name: name.clone(),
                    what: format!("unknown item size {size}"),
                })?;
                (dtype, r.u32(&|| what("item count"))? as u64 * size as u64)
            };
            let n_el = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if n_el.and_then(|n| n.checked_mul(dtype.size() as u64)) != Some(n_bytes) {
                return Err(FormatError::Tensor {
                    path: path.into(),
                    name,
                    what: format!(
                        "shape {shape:?} of {} needs {} bytes, header says {n_bytes}",
                        dtype.name(),
                        n_el.map_or(u64::MAX, |n| n.saturating_mul(dtype.size() as u64))
                    ),
                });
            }
            let offset = r.pos as u64;
            r.take(n_bytes as usize, &|| what("data"))?;
            if index.insert(name.clone(), vars.len()).is_some() {
                return Err(invalid(format!("variable '{name}' appears twice")));
            }
            vars.push(Ct2Var {
                name,
                shape,
                dtype,
                offset,
                n_bytes,
            });
        }
        let mut aliases = HashMap::new();
        if version >= 3 {
            let n = r.u32(&|| "alias count".into())? as usize;
            if n > map.len() / 4 {
                return Err(invalid(format!("{n} aliases cannot fit in the file")));
            }
            for i in 0..n {
                let alias = r.string(&|| format!("alias {i}"))?;
                let target = r.string(&|| format!("target of alias '{alias}'"))?;
                if !index.contains_key(&target) {
                    return Err(invalid(format!(
                        "alias '{alias}' names variable '{target}', which the file lacks"
                    )));
                }
                aliases.insert(alias, target);
            }
        }
        if r.pos != map.len() {
            return Err(invalid(format!(
                "{} unexpected bytes after the last record",
                map.len() - r.pos
            )));
        }
        Ok(Ct2File {
            path: path.into(),
            map,
            version,
            spec,
            revision,
            vars,
            index,
            aliases,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A variable by name or alias.
    pub fn var(&self, name: &str) -> Option<&Ct2Var> {
        let name = self.aliases.get(name).map_or(name, |t| t.as_str());
        self.index.get(name).map(|&i| &self.vars[i])
    }

    /// The variable's bytes (bounds checked at open).
    pub fn data(&self, v: &Ct2Var) -> &[u8] {
        &self.map[v.offset as usize..(v.offset + v.n_bytes) as usize]
    }

    /// A scalar or 1-element integer/bool variable (config flags such as `num_heads`).
    pub fn scalar_i64(&self, name: &str) -> Result<i64, FormatError> {
        let v = self.var(name).ok_or_else(|| FormatError::Tensor {
            path: self.path.clone(),
            name: name.into(),
            what: "missing".into(),
        })?;
        let d = self.data(v);
        let bad = || FormatError::Tensor {
            path: self.path.clone(),
            name: name.into(),
            what: format!("expected one integer, got {:?} {}", v.shape, v.dtype.name()),
        };
        if v.n_elements() != 1 {
            return Err(bad());
        }
        Ok(match v.dtype {
            Ct2Dtype::I8 => d[0] as i8 as i64,
            Ct2Dtype::I16 => i16::from_le_bytes([d[0], d[1]]) as i64,
            Ct2Dtype::I32 => i32::from_le_bytes([d[0], d[1], d[2], d[3]]) as i64,
            _ => return Err(bad()),
        })
    }

    /// A float variable converted to f32.
    pub fn f32_values(&self, v: &Ct2Var) -> Result<Vec<f32>, FormatError> {
        let d = self.data(v);
        Ok(match v.dtype {
            Ct2Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Ct2Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Ct2Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            t => {
                return Err(FormatError::Tensor {
                    path: self.path.clone(),
                    name: v.name.clone(),
                    what: format!("expected a float type, got {}", t.name()),
                })
            }
        })
    }
}
