//! ONNX model reader: the graph's initializers (weights) and nodes, from the protobuf wire format.
//!
//! A minimal reader of the messages kiln needs (ModelProto -> GraphProto -> TensorProto,
//! NodeProto, AttributeProto), written against the wire format directly: every length is
//! checked against the bytes that remain, so a truncated or corrupt file is an error naming
//! the file and the field, never a panic. Initializers keep `raw_data` as a range of the mapped
//! file; typed fields (`float_data`, `int32_data`, `int64_data`) are converted to little-endian
//! bytes of the tensor's element type, so every tensor is read through [`OnnxTensor::bytes`].

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::bytes::Bytes;
use crate::FormatError;

/// TensorProto.DataType values kiln reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnnxType {
    F32,
    U8,
    I8,
    I32,
    I64,
    F16,
    F64,
    Bool,
    Other(i32),
}

impl OnnxType {
    fn from_code(c: i32) -> Self {
        match c {
            1 => OnnxType::F32,
            2 => OnnxType::U8,
            3 => OnnxType::I8,
            6 => OnnxType::I32,
            7 => OnnxType::I64,
            9 => OnnxType::Bool,
            10 => OnnxType::F16,
            11 => OnnxType::F64,
            c => OnnxType::Other(c),
        }
    }

    /// Bytes per element, when fixed.
    pub fn size(self) -> Option<usize> {
        match self {
            OnnxType::F32 | OnnxType::I32 => Some(4),
            OnnxType::U8 | OnnxType::I8 | OnnxType::Bool => Some(1),
            OnnxType::I64 | OnnxType::F64 => Some(8),
            OnnxType::F16 => Some(2),
            OnnxType::Other(_) => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Data {
    /// Byte range of the mapped file.
    Raw(usize, usize),
    Owned(Vec<u8>),
}

/// One tensor (an initializer or a node's constant attribute).
#[derive(Debug, Clone)]
pub struct OnnxTensor {
    pub name: String,
    pub dims: Vec<i64>,
    pub ty: OnnxType,
    data: Data,
}

impl OnnxTensor {
    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d.max(0) as usize).product()
    }
}

/// Attribute values kiln reads; others are kept as `Other`.
#[derive(Debug, Clone)]
pub enum Attr {
    Float(f32),
    Int(i64),
    Str(Vec<u8>),
    Tensor(OnnxTensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Other,
}

#[derive(Debug, Clone)]
pub struct OnnxNode {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: Vec<(String, Attr)>,
}

impl OnnxNode {
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, a)| a)
    }

    /// An integer attribute.
    pub fn attr_i(&self, name: &str) -> Option<i64> {
        match self.attr(name)? {
            Attr::Int(v) => Some(*v),
            _ => None,
        }
    }
}

/// An opened ONNX file: its graph's initializers and nodes.
pub struct OnnxFile {
    path: PathBuf,
    mmap: Bytes,
    pub initializers: Vec<OnnxTensor>,
    pub nodes: Vec<OnnxNode>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    by_name: HashMap<String, usize>,
}

/// Protobuf wire reader over `buf[pos..end]`; `base` is `buf`'s offset in the file.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
    path: &'a Path,
    what: &'static str,
}

enum Field<'a> {
    Varint(u64),
    Fixed64,
    /// Bytes and their offset in the file.
    Bytes(&'a [u8], usize),
    Fixed32(u32),
}

impl<'a> Wire<'a> {
    fn new(buf: &'a [u8], base: usize, path: &'a Path, what: &'static str) -> Self {
        Wire {
            buf,
            pos: 0,
            base,
            path,
            what,
        }
    }

    fn err(&self, why: &str) -> FormatError {
        FormatError::Invalid {
            path: self.path.to_path_buf(),
            what: format!(
                "protobuf {} at byte {}: {why}",
                self.what,
                self.base + self.pos
            ),
        }
    }

    fn varint(&mut self) -> Result<u64, FormatError> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err("truncated varint"));
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<(&'a [u8], usize), FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(&format!(
                    "field of {n} bytes runs past the end ({} left)",
                    self.buf.len() - self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        let off = self.base + self.pos;
        self.pos = end;
        Ok((s, off))
    }

    /// The next (field number, value), or None at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, FormatError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (num, wt) = (key >> 3, key & 7);
        let f = match wt {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| self.err("length overflows"))?;
                let (b, off) = self.take(n)?;
                Field::Bytes(b, off)
            }
            5 => {
                let (b, _) = self.take(4)?;
                Field::Fixed32(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
            }
            w => return Err(self.err(&format!("unsupported wire type {w}"))),
        };
        Ok(Some((num, f)))
    }
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Repeated varints, packed (bytes) or not (one varint).
fn push_varints(w: &Wire, f: Field, out: &mut Vec<i64>) -> Result<(), FormatError> {
    match f {
        Field::Varint(v) => out.push(v as i64),
        Field::Bytes(b, off) => {
            let mut p = Wire::new(b, off, w.path, w.what);
            while p.pos < b.len() {
                out.push(p.varint()? as i64);
            }
        }
        _ => return Err(w.err("expected varint or packed varints")),
    }
    Ok(())
}

fn push_floats(w: &Wire, f: Field, out: &mut Vec<f32>) -> Result<(), FormatError> {
    match f {
        Field::Fixed32(v) => out.push(f32::from_bits(v)),
        Field::Bytes(b, _) => {
            if b.len() % 4 != 0 {
                return Err(w.err("packed floats not a multiple of 4 bytes"));
            }
            out.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        _ => return Err(w.err("expected float or packed floats")),
    }
    Ok(())
}

fn parse_tensor(buf: &[u8], base: usize, path: &Path) -> Result<OnnxTensor, FormatError> {
    let mut w = Wire::new(buf, base, path, "TensorProto");
    let (mut name, mut dims, mut code) = (String::new(), Vec::new(), 0i32);
    let (mut raw, mut floats, mut i32s, mut i64s) = (None, Vec::new(), Vec::new(), Vec::new());
    let mut external = false;
    while let Some((num, f)) = w.next()? {
        match (num, f) {
            (1, f) => push_varints(&w, f, &mut dims)?,
            (2, Field::Varint(v)) => code = v as i32,
            (4, f) => push_floats(&w, f, &mut floats)?,
            (5, f) => push_varints(&w, f, &mut i32s)?,
            (7, f) => push_varints(&w, f, &mut i64s)?,
            (8, Field::Bytes(b, _)) => name = string(b),
            (9, Field::Bytes(b, off)) => raw = Some((off, b.len())),
            (13, _) => external = true,
            (14, Field::Varint(v)) => external |= v == 1,
            _ => {}
        }
    }
    let ty = OnnxType::from_code(code);
    let bad = |what: String| FormatError::Tensor {
        path: path.to_path_buf(),
        name: name.clone(),
        what,
    };
    if external {
        return Err(bad("data stored in an external file (not supported)".into()));
    }
    if dims.iter().any(|&d| d < 0) {
        return Err(bad(format!("negative dimension in {dims:?}")));
    }
    let numel = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d as usize))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    let data = if let Some((off, len)) = raw {
        if let Some(sz) = ty.size() {
            if numel.checked_mul(sz) != Some(len) {
                return Err(bad(format!(
                    "raw_data has {len} bytes, dims {dims:?} of {ty:?} need {}",
                    numel.saturating_mul(sz)
                )));
            }
        }
        Data::Raw(off, len)
    } else {
        let mut out = Vec::new();
        let n = match ty {
            OnnxType::F32 => {
                out.extend(floats.iter().flat_map(|v| v.to_le_bytes()));
                floats.len()
            }
            OnnxType::I8 | OnnxType::U8 | OnnxType::Bool => {
                out.extend(i32s.iter().map(|&v| v as u8));
                i32s.len()
            }
            OnnxType::I32 => {
                out.extend(i32s.iter().flat_map(|&v| (v as i32).to_le_bytes()));
                i32s.len()
            }
            OnnxType::F16 => {
                out.extend(i32s.iter().flat_map(|&v| (v as u16).to_le_bytes()));
                i32s.len()
            }
            OnnxType::I64 => {
                out.extend(i64s.iter().flat_map(|v| v.to_le_bytes()));
                i64s.len()
            }
            _ => 0,
        };
        if n != numel && ty.size().is_some() {
            return Err(bad(format!("{n} typed values, dims {dims:?} need {numel}")));
        }
        Data::Owned(out)
    };
    Ok(OnnxTensor {
        name,
        dims,
        ty,
        data,
    })
}

fn parse_attr(buf: &[u8], base: usize, path: &Path) -> Result<(String, Attr), FormatError> {
    let mut w = Wire::new(buf, base, path, "AttributeProto");
    let (mut name, mut val) = (String::new(), Attr::Other);
    let (mut floats, mut ints) = (Vec::new(), Vec::new());
    let mut kind = 0u64;
    while let Some((num, f)) = w.next()? {
        match (num, f) {
            (1, Field::Bytes(b, _)) => name = string(b),
            (2, Field::Fixed32(v)) => val = Attr::Float(f32::from_bits(v)),
            (3, Field::Varint(v)) => val = Attr::Int(v as i64),
            (4, Field::Bytes(b, _)) => val = Attr::Str(b.to_vec()),
            (5, Field::Bytes(b, off)) => val = Attr::Tensor(parse_tensor(b, off, path)?),
            (7, f) => push_floats(&w, f, &mut floats)?,
            (8, f) => push_varints(&w, f, &mut ints)?,
            (20, Field::Varint(v)) => kind = v,
            _ => {}
        }
    }
    match kind {
        6 => val = Attr::Floats(floats),
        7 => val = Attr::Ints(ints),
        _ => {}
    }
    Ok((name, val))
}

fn parse_node(buf: &[u8], base: usize, path: &Path) -> Result<OnnxNode, FormatError> {
    let mut w = Wire::new(buf, base, path, "NodeProto");
    let mut n = OnnxNode {
        name: String::new(),
        op_type: String::new(),
        domain: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        attrs: Vec::new(),
    };
    while let Some((num, f)) = w.next()? {
        match (num, f) {
            (1, Field::Bytes(b, _)) => n.inputs.push(string(b)),
            (2, Field::Bytes(b, _)) => n.outputs.push(string(b)),
            (3, Field::Bytes(b, _)) => n.name = string(b),
            (4, Field::Bytes(b, _)) => n.op_type = string(b),
            (5, Field::Bytes(b, off)) => n.attrs.push(parse_attr(b, off, path)?),
            (7, Field::Bytes(b, _)) => n.domain = string(b),
            _ => {}
        }
    }
    Ok(n)
}

/// ValueInfoProto.name (field 1).
fn value_name(buf: &[u8], base: usize, path: &Path) -> Result<String, FormatError> {
    let mut w = Wire::new(buf, base, path, "ValueInfoProto");
    while let Some((num, f)) = w.next()? {
        if let (1, Field::Bytes(b, _)) = (num, f) {
            return Ok(string(b));
        }
    }
    Ok(String::new())
}

impl OnnxFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only; kiln does not write model files while they are open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Bytes::Map(mmap))
    }

    /// Parses an ONNX image held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::parse(path.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, mmap: Bytes) -> Result<Self, FormatError> {
        let (mut initializers, mut nodes, mut inputs, mut outputs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut graph = None;
        {
            let mut w = Wire::new(&mmap, 0, &path, "ModelProto");
            while let Some((num, f)) = w.next()? {
                if let (7, Field::Bytes(b, off)) = (num, f) {
                    graph = Some((b, off));
                }
            }
            let Some((g, goff)) = graph else {
                return Err(FormatError::NotFormat {
                    path: path.clone(),
                    format: "ONNX",
                    why: "no graph in the ModelProto".into(),
                });
            };
            let mut w = Wire::new(g, goff, &path, "GraphProto");
            while let Some((num, f)) = w.next()? {
                match (num, f) {
                    (1, Field::Bytes(b, off)) => nodes.push(parse_node(b, off, &path)?),
                    (5, Field::Bytes(b, off)) => initializers.push(parse_tensor(b, off, &path)?),
                    (11, Field::Bytes(b, off)) => inputs.push(value_name(b, off, &path)?),
                    (12, Field::Bytes(b, off)) => outputs.push(value_name(b, off, &path)?),
                    _ => {}
                }
            }
        }
        let by_name = initializers
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(OnnxFile {
            path,
            mmap,
            initializers,
            nodes,
            inputs,
            outputs,
            by_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn initializer(&self, name: &str) -> Option<&OnnxTensor> {
        self.by_name.get(name).map(|&i| &self.initializers[i])
    }

    /// The tensor's bytes (little-endian elements of its type).
    pub fn bytes<'a>(&'a self, t: &'a OnnxTensor) -> &'a [u8] {
        match &t.data {
            // Ranges were checked against the graph's bytes when parsed.
            Data::Raw(off, len) => &self.mmap[*off..*off + *len],
            Data::Owned(v) => v,
        }
    }

    fn err(&self, name: &str, what: String) -> FormatError {
        FormatError::Tensor {
            path: self.path.clone(),
            name: name.into(),
            what,
        }
    }

    /// The tensor's values as f32 (F32, F16, I8, U8, I32, I64 convert; others are an error).
    pub fn f32s(&self, t: &OnnxTensor) -> Result<Vec<f32>, FormatError> {
        let b = self.bytes(t);
        Ok(match t.ty {
            OnnxType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            OnnxType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            OnnxType::I8 => b.iter().map(|&v| v as i8 as f32).collect(),
            OnnxType::U8 => b.iter().map(|&v| v as f32).collect(),
            OnnxType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect(),
            OnnxType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                .collect(),
            ty => return Err(self.err(&t.name, format!("cannot read {ty:?} as numbers"))),
        })
    }

    /// The tensor's values as i64 (I64, I32 and integer types).
    pub fn i64s(&self, t: &OnnxTensor) -> Result<Vec<i64>, FormatError> {
        let b = self.bytes(t);
        Ok(match t.ty {
            OnnxType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            OnnxType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            OnnxType::I8 => b.iter().map(|&v| v as i8 as i64).collect(),
            OnnxType::U8 | OnnxType::Bool => b.iter().map(|&v| v as i64).collect(),
            ty => return Err(self.err(&t.name, format!("cannot read {ty:?} as integers"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
    }

    fn field(num: u64, wt: u64, body: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | wt, out);
        if wt == 2 {
            varint(body.len() as u64, out);
        }
        out.extend_from_slice(body);
    }

    fn model(tensor: &[u8]) -> Vec<u8> {
        let mut g = Vec::new();
        field(5, 2, tensor, &mut g);
        let mut m = Vec::new();
        field(7, 2, &g, &mut m);
        m
    }

    fn parse(bytes: &[u8]) -> Result<OnnxFile, FormatError> {
        let dir = std::env::temp_dir().join(format!("kiln-onnx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("t{}.onnx", bytes.len()));
        std::fs::write(&p, bytes).unwrap();
        OnnxFile::open(&p)
    }

    #[test]
    fn reads_raw_and_typed_tensors() {
        let mut t = Vec::new();
        field(1, 2, &[2, 3], &mut t); // packed dims
        field(2, 0, &[1], &mut t);
        field(8, 2, b"w", &mut t);
        let raw: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        field(9, 2, &raw, &mut t);
        let f = parse(&model(&t)).unwrap();
        let w = f.initializer("w").unwrap();
        assert_eq!(w.dims, vec![2, 3]);
        assert_eq!(f.f32s(w).unwrap(), vec![0., 1., 2., 3., 4., 5.]);

        let mut t = Vec::new();
        field(1, 0, &[2], &mut t);
        field(2, 0, &[3], &mut t); // int8 in int32_data
        field(8, 2, b"q", &mut t);
        let mut packed = Vec::new();
        varint(5, &mut packed);
        varint((-3i64) as u64, &mut packed);
        field(5, 2, &packed, &mut t);
        let f = parse(&model(&t)).unwrap();
        assert_eq!(f.f32s(f.initializer("q").unwrap()).unwrap(), vec![5., -3.]);
    }

    #[test]
    fn bad_files_are_errors() {
        let mut t = Vec::new();
        field(1, 0, &[4], &mut t);
        field(2, 0, &[1], &mut t);
        field(8, 2, b"w", &mut t);
        field(9, 2, &[0; 8], &mut t); // 8 bytes for 4 floats
        let e = parse(&model(&t)).err().unwrap().to_string();
        assert!(e.contains("'w'") && e.contains("raw_data"), "{e}");
        let mut m = model(&t);
        m.truncate(m.len() - 3);
        let e = parse(&m).err().unwrap().to_string();
        assert!(e.contains("runs past the end"), "{e}");
        let e = parse(b"\x0a").err().unwrap().to_string();
        assert!(e.contains("truncated varint"), "{e}");
    }
}
