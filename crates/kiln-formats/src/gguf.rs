//! GGUF v2/v3: header, metadata key/values (every value type, nested arrays), tensor infos,
//! aligned tensor data, memory-mapped.
//!
//! Layout (little-endian):
//! `"GGUF" u32 version | u64 n_tensors | u64 n_kv | kv* | tensor_info* | pad to alignment | data`
//! kv: `string key | u32 type | value`; string: `u64 len | bytes`;
//! array: `u32 elem_type | u64 count | values`;
//! tensor_info: `string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset`,
//! offsets relative to the data section, dims fastest-varying first (`dims[0]` = row length).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use kiln_quant::GgmlType;
use memmap2::Mmap;

use crate::bytes::Bytes;
use crate::FormatError;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_DEPTH: u32 = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer value that fits in u64 (files disagree on u32 / i32 / u64 for counts).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human rendering (arrays summarised), for `kiln info`.
    pub fn summary(&self) -> String {
        match self {
            Value::String(s) => {
                let one_line = s.replace('\n', "\\n");
                if one_line.chars().count() > 80 {
                    let head: String = one_line.chars().take(77).collect();
                    format!("{head:?}...")
                } else {
                    format!("{one_line:?}")
                }
            }
            Value::Array(a) => {
                let kind = a.first().map(|v| v.type_name()).unwrap_or("?");
                let head: Vec<String> = a.iter().take(4).map(|v| v.summary()).collect();
                let more = if a.len() > 4 { ", ..." } else { "" };
                format!("[{kind}; {}] [{}{more}]", a.len(), head.join(", "))
            }
            Value::F32(v) => format!("{v}"),
            Value::F64(v) => format!("{v}"),
            Value::Bool(v) => format!("{v}"),
            other => other.as_i64().map(|v| v.to_string()).unwrap_or_default(),
        }
    }
}

/// One tensor's description; its bytes are `GgufFile::tensor_data`.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset in the file (absolute, already checked to lie inside it).
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A memory-mapped, fully validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Bytes,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub data_offset: u64,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(FormatError::NotFormat {
                path,
                format: "GGUF",
                why: "it is a directory".into(),
            });
        }
        // SAFETY: the map is read-only; kiln never writes model files while they are open.
        // A file truncated by another process while mapped is outside what we can defend.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Bytes::Map(mmap))
    }

    /// Parses a GGUF image held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::parse(path.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, mmap: Bytes) -> Result<Self, FormatError> {
        let mut r = Reader {
            buf: &mmap,
            pos: 0,
            path: &path,
        };
        if r.buf.len() < 4 || &r.buf[..4] != MAGIC {
            let why = if r.buf.len() < 4 {
                format!("only {} bytes long", r.buf.len())
            } else {
                format!("starts with {:02x?}, not \"GGUF\"", &r.buf[..4])
            };
            return Err(FormatError::NotFormat {
                path: path.clone(),
                format: "GGUF",
                why,
            });
        }
        r.pos = 4;
        let version = r.u32("version")?;
        if version == 1 {
            return Err(r.invalid("GGUF version 1 is not supported (re-convert the model)"));
        }
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() <= 3 {
                " (a big-endian file?)"
            } else {
                ""
            };
            return Err(r.invalid(format!("unsupported GGUF version {version}{hint}")));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Every kv needs at least 8 (key len) + 4 (type) + 1 bytes, every tensor info 8+4+4+8.
        r.check_count(n_kv, 13, "metadata count")?;
        r.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&format!("type of '{key}'"))?;
            let value = r.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(r.invalid(format!("metadata key '{key}' appears twice")));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => return Err(r.invalid(format!("bad general.alignment {}", v.summary()))),
            },
        };

        struct RawInfo {
            name: String,
            dims: Vec<u64>,
            ty: GgmlType,
            rel: u64,
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("name of tensor #{i}"))?;
            let tensor_err = |what: String| FormatError::Tensor {
                path: path.clone(),
                name: name.clone(),
                what,
            };
            let n_dims = r.u32("tensor dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(tensor_err(format!(
                    "{n_dims} dimensions (1..={MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64("tensor dim")?);
            }
            let ty_id = r.u32("tensor type")?;
            let ty = GgmlType::from_id(ty_id)
                .ok_or_else(|| tensor_err(format!("unsupported ggml type id {ty_id}")))?;
            let rel = r.u64("tensor offset")?;
            raw.push(RawInfo {
                name,
                dims,
                ty,
                rel,
            });
        }
        let data_offset = align_up(r.pos as u64, alignment)
            .ok_or_else(|| r.invalid("data section offset overflows"))?;
        let file_len = r.buf.len() as u64;
        if n_tensors > 0 && data_offset > file_len {
            return Err(FormatError::Truncated {
                path: path.clone(),
                what: "tensor data section".into(),
                needed: data_offset,
                len: file_len,
            });
        }

        let mut tensors = Vec::with_capacity(raw.len());
        let mut tensor_index = HashMap::with_capacity(raw.len());
        for RawInfo {
            name,
            dims,
            ty,
            rel,
        } in raw
        {
            let tensor_err = |what: String| FormatError::Tensor {
                path: path.clone(),
                name: name.clone(),
                what,
            };
            let n = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
            let n = n.ok_or_else(|| tensor_err(format!("shape {dims:?} overflows")))?;
            if dims[0] % ty.block_size() as u64 != 0 {
                return Err(tensor_err(format!(
                    "row length {} is not a multiple of {}'s block size {}",
                    dims[0],
                    ty.name(),
                    ty.block_size()
                )));
            }
            let n_bytes = ty
                .checked_bytes(n)
                .ok_or_else(|| tensor_err(format!("shape {dims:?} overflows")))?;
            if rel % alignment != 0 {
                return Err(tensor_err(format!(
                    "data offset {rel} is not aligned to {alignment}"
                )));
            }
            let start = data_offset.checked_add(rel);
            let end = start.and_then(|s| s.checked_add(n_bytes));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(tensor_err(format!(
                        "data [{}, +{n_bytes}) lies past the end of the file ({file_len} bytes): truncated or corrupt",
                        data_offset.saturating_add(rel)
                    )))
                }
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(tensor_err("appears twice".into()));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset: data_offset + rel,
                n_bytes,
            });
        }

        Ok(GgufFile {
            path,
            mmap,
            version,
            alignment,
            metadata,
            index,
            tensors,
            tensor_index,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, FormatError> {
        self.get(key).ok_or_else(|| FormatError::MissingKey {
            path: self.path.clone(),
            key: key.into(),
        })
    }

    fn wrong(&self, key: &str, expected: &'static str) -> FormatError {
        FormatError::WrongType {
            path: self.path.clone(),
            key: key.into(),
            expected,
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, FormatError> {
        self.require(key)?
            .as_u64()
            .ok_or_else(|| self.wrong(key, "an unsigned integer"))
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, FormatError> {
        self.require(key)?
            .as_f64()
            .ok_or_else(|| self.wrong(key, "a number"))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        self.require(key)?
            .as_str()
            .ok_or_else(|| self.wrong(key, "a string"))
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], FormatError> {
        self.require(key)?
            .as_array()
            .ok_or_else(|| self.wrong(key, "an array"))
    }

    /// An optional key that, when present, must have the right type.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, FormatError> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, FormatError> {
        self.get(key).map(|_| self.get_f64(key)).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, FormatError> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, FormatError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a bool")),
        }
    }

    /// `general.architecture`, e.g. "llama".
    pub fn architecture(&self) -> Result<&str, FormatError> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Tells the OS this process is done with the tensor's pages (after a backend has copied or
    /// repacked them), so they stop counting in its resident memory. Reading the tensor again
    /// faults them back in from the file: a hint, never a change of contents.
    pub fn release(&self, info: &TensorInfo) {
        let start = info.offset as usize;
        self.mmap.release(start, start + info.n_bytes as usize);
    }

    /// The tensor's bytes (bounds were checked when the file was opened).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl Reader<'_> {
    fn invalid(&self, what: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            path: self.path.to_path_buf(),
            what: what.into(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], FormatError> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|&e| e <= self.buf.len() as u64);
        let Some(end) = end else {
            return Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                needed: (self.pos as u64).saturating_add(n),
                len: self.buf.len() as u64,
            });
        };
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    /// Rejects a count that could not fit in the rest of the file at `min_size` bytes each,
    /// before anything is allocated for it.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), FormatError> {
        let left = (self.buf.len() - self.pos) as u64;
        if count.checked_mul(min_size).is_none_or(|need| need > left) {
            return Err(self.invalid(format!(
                "{what} {count} cannot fit in the {left} bytes that remain (corrupt header?)"
            )));
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        // Vocabularies occasionally hold invalid UTF-8; keep going with replacement characters.
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, FormatError> {
        let what = || format!("value of '{key}'");
        Ok(match ty {
            0 => Value::U8(self.array::<1>(&what())?[0]),
            1 => Value::I8(self.array::<1>(&what())?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.invalid(format!("'{key}': bool byte {b}"))),
            },
            8 => Value::String(self.string(&what())?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(format!("'{key}': arrays nested too deep")));
                }
                let elem = self.u32(&what())?;
                let count = self.u64(&what())?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8, // strings and arrays carry a u64 length
                    _ => return Err(self.invalid(format!("'{key}': unknown array type {elem}"))),
                };
                self.check_count(count, min, &format!("'{key}': array length"))?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            _ => return Err(self.invalid(format!("'{key}': unknown value type {ty}"))),
        })
    }
}

/// Writes GGUF v3 files (tests, `kiln quantize`, tools): metadata in insertion order, tensors
/// aligned to 32 bytes.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// `dims` in ggml order (row length first); `data` must hold exactly the tensor's bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = align_up(offset + data.len() as u64, DEFAULT_ALIGNMENT).unwrap_or(offset);
        }
        let data_start = align_up(out.len() as u64, DEFAULT_ALIGNMENT).unwrap_or(0) as usize;
        out.resize(data_start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Writes the file to `path` in full or not at all ([`crate::output`]).
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        crate::output::write(path, &self.to_bytes())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // An empty array is written as an array of u8.
            let elem = items.first().map(value_type).unwrap_or(0);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
