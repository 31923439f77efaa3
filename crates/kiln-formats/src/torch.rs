//! PyTorch checkpoints: `torch.save`'s zip format (PyTorch 1.6 and later). The archive holds
//! `<prefix>/data.pkl`, a pickle of the saved object whose tensors refer to storages kept as
//! members `<prefix>/data/<key>`. The pickle is run by a small interpreter that knows only what
//! state dicts are made of: dicts (and `collections.OrderedDict`), lists, tuples, strings,
//! numbers, booleans, None, storages (persistent ids) and tensors rebuilt from them
//! (`torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`). Any other global, any opcode
//! outside that set and any view that reaches past its storage is an error naming the byte.
//!
//! Tensors come out in the order the pickle holds them, named by their path through the
//! nested dicts and lists joined with `.` (a bare tensor is named ``), as f32 with the view's
//! size, stride and storage offset applied.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::zip::{self, ZipMember};
use crate::FormatError;

/// Element type of a storage (`torch.FloatStorage`, `torch.HalfStorage`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchDtype {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl TorchDtype {
    fn from_storage(name: &str) -> Option<Self> {
        Some(match name {
            "DoubleStorage" => Self::F64,
            "FloatStorage" => Self::F32,
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::BF16,
            "LongStorage" => Self::I64,
            "IntStorage" => Self::I32,
            "ShortStorage" => Self::I16,
            "CharStorage" => Self::I8,
            "ByteStorage" => Self::U8,
            "BoolStorage" => Self::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
        }
    }

    /// PyTorch's name (`torch.float32`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F64 => "torch.float64",
            Self::F32 => "torch.float32",
            Self::F16 => "torch.float16",
            Self::BF16 => "torch.bfloat16",
            Self::I64 => "torch.int64",
            Self::I32 => "torch.int32",
            Self::I16 => "torch.int16",
            Self::I8 => "torch.int8",
            Self::U8 => "torch.uint8",
            Self::Bool => "torch.bool",
        }
    }

    /// Element `i` of little-endian bytes `b` (holding at least `i + 1` elements) as f32.
    fn get(self, b: &[u8], i: usize) -> f32 {
        let n = self.size();
        let e = &b[i * n..i * n + n];
        match self {
            Self::F64 => f64::from_le_bytes(e.try_into().unwrap_or([0; 8])) as f32,
            Self::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            Self::F16 => half::f16::from_le_bytes([e[0], e[1]]).to_f32(),
            Self::BF16 => half::bf16::from_le_bytes([e[0], e[1]]).to_f32(),
            Self::I64 => i64::from_le_bytes(e.try_into().unwrap_or([0; 8])) as f32,
            Self::I32 => i32::from_le_bytes([e[0], e[1], e[2], e[3]]) as f32,
            Self::I16 => i16::from_le_bytes([e[0], e[1]]) as f32,
            Self::I8 => e[0] as i8 as f32,
            Self::U8 => e[0] as f32,
            Self::Bool => (e[0] != 0) as u8 as f32,
        }
    }
}

/// One tensor of a checkpoint, widened to f32.
#[derive(Debug, Clone)]
pub struct TorchTensor {
    /// The storage's element type (the values are widened or converted to f32).
    pub dtype: TorchDtype,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Reads a `torch.save` file (mapped, not read into memory).
pub fn read_torch(path: impl AsRef<Path>) -> Result<Vec<(String, TorchTensor)>, FormatError> {
    let path = path.as_ref();
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only; kiln does not write model files while they are open.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    parse_torch(path, &map)
}

fn invalid(path: &Path, what: String) -> FormatError {
    FormatError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

/// The tensors of a `torch.save` image held in memory; `path` names it in errors.
pub fn parse_torch(path: &Path, b: &[u8]) -> Result<Vec<(String, TorchTensor)>, FormatError> {
    if !b.starts_with(b"PK\x03\x04") {
        let why = if b.starts_with(b"\x80") {
            "a legacy torch.save file (PyTorch before 1.6: a bare pickle, not a zip archive); \
             re-save it with a current PyTorch"
        } else {
            "not a PyTorch checkpoint (no zip header)"
        };
        return Err(invalid(path, why.into()));
    }
    let members = zip::members(path, b)?;
    let pkl = members
        .iter()
        .find(|m| m.name.ends_with("/data.pkl") && m.name.matches('/').count() == 1)
        .ok_or_else(|| invalid(path, "zip archive without <name>/data.pkl".into()))?;
    let prefix = &pkl.name[..pkl.name.len() - "data.pkl".len()];
    let by_name: HashMap<&str, &ZipMember> = members.iter().map(|m| (m.name.as_str(), m)).collect();
    for m in &members {
        if m.method != 0 {
            return Err(invalid(
                path,
                format!("member '{}' is compressed (method {})", m.name, m.method),
            ));
        }
    }
    if let Some(m) = by_name.get(format!("{prefix}byteorder").as_str()) {
        if m.data(b) != b"little" {
            return Err(invalid(
                path,
                format!(
                    "byte order '{}' (only little-endian checkpoints are read)",
                    String::from_utf8_lossy(m.data(b))
                ),
            ));
        }
    }
    let mut vm = Pickle {
        path,
        code: pkl.data(b),
        pos: 0,
        objs: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    let root = vm.run()?;
    let mut leaves = Vec::new();
    let mut budget = MAX_VISITS;
    vm.flatten(root, String::new(), 0, &mut budget, &mut leaves)?;
    let mut out = Vec::with_capacity(leaves.len());
    // Views may share a storage, but all of them together may not hold more than two values
    // per byte of the file (a dict reaching one tensor by a million paths is not a checkpoint).
    let mut total = 0u64;
    for (name, t) in leaves {
        let Obj::Tensor {
            storage,
            offset,
            size,
            stride,
        } = &vm.objs[t]
        else {
            continue;
        };
        let Obj::Storage { dtype, key, numel } = &vm.objs[*storage] else {
            continue;
        };
        let bad = |what: String| FormatError::Tensor {
            path: path.to_path_buf(),
            name: name.clone(),
            what,
        };
        let member = format!("{prefix}data/{key}");
        let data = by_name
            .get(member.as_str())
            .ok_or_else(|| bad(format!("its storage '{member}' is not in the archive")))?
            .data(b);
        if numel.checked_mul(dtype.size() as u64) != Some(data.len() as u64) {
            return Err(bad(format!(
                "storage '{member}' has {} bytes for {numel} elements of {}",
                data.len(),
                dtype.name()
            )));
        }
        total = total.saturating_add(size.iter().fold(1u64, |a, &d| a.saturating_mul(d)));
        if total > 2 * b.len() as u64 {
            return Err(bad(format!(
                "the tensors so far hold {total} values, more than two per byte of the file"
            )));
        }
        let values = view(*dtype, data, *numel, *offset, size, stride).map_err(bad)?;
        out.push((
            name,
            TorchTensor {
                dtype: *dtype,
                shape: size.iter().map(|&d| d as usize).collect(),
                data: values,
            },
        ));
    }
    Ok(out)
}

/// The elements of the view (offset, size, stride) of a storage of `numel` elements, in C
/// order. Every index the view reaches must lie in the storage, and a view may not hold more
/// elements than its storage (overlapping or broadcast views are not read).
fn view(
    dtype: TorchDtype,
    data: &[u8],
    numel: u64,
    offset: u64,
    size: &[u64],
    stride: &[u64],
) -> Result<Vec<f32>, String> {
    let n = size
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or("its size overflows")?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let last = size
        .iter()
        .zip(stride)
        .try_fold(offset, |a, (&d, &s)| a.checked_add((d - 1).checked_mul(s)?));
    if last.is_none_or(|l| l >= numel) {
        return Err(format!(
            "view (offset {offset}, size {size:?}, stride {stride:?}) reaches past its storage \
             of {numel} elements"
        ));
    }
    if n > numel {
        return Err(format!(
            "view of {n} elements over a storage of {numel} (overlapping views are not read)"
        ));
    }
    let (n, offset) = (n as usize, offset as usize);
    // C-contiguous: one run of the storage.
    let mut want = 1u64;
    let contiguous = size.iter().zip(stride).rev().all(|(&d, &s)| {
        let ok = d == 1 || s == want;
        want *= d;
        ok
    });
    if contiguous {
        return Ok((offset..offset + n).map(|i| dtype.get(data, i)).collect());
    }
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0u64; size.len()];
    let mut at = offset as u64;
    for _ in 0..n {
        out.push(dtype.get(data, at as usize));
        // Odometer over the dims, last fastest. Wrapping: a dim of size 1 may have any
        // stride; every index actually read was checked above.
        for d in (0..size.len()).rev() {
            idx[d] += 1;
            at = at.wrapping_add(stride[d]);
            if idx[d] < size[d] {
                break;
            }
            at = at.wrapping_sub(stride[d].wrapping_mul(size[d]));
            idx[d] = 0;
        }
    }
    Ok(out)
}

/// Tree nodes visited while naming tensors (shared subtrees count each time they are seen).
const MAX_VISITS: usize = 1 << 20;
/// Nesting depth of dicts and lists.
const MAX_DEPTH: usize = 64;
/// Length of a tensor's dotted name.
const MAX_NAME: usize = 4096;

/// The first 64 characters of `name`, for errors.
fn short(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &name[..i]),
        None => name.to_string(),
    }
}

#[derive(Debug, Clone, Copy)]
enum Callable {
    OrderedDict,
    RebuildTensor,
    RebuildParameter,
    Storage(TorchDtype),
}

#[derive(Debug)]
enum Obj {
    None,
    Bool,
    Int(i64),
    Float,
    Str(String),
    Bytes,
    Tuple(Vec<usize>),
    List(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Global(Callable),
    Storage {
        dtype: TorchDtype,
        key: String,
        numel: u64,
    },
    Tensor {
        storage: usize,
        offset: u64,
        size: Vec<u64>,
        stride: Vec<u64>,
    },
}

/// The pickle machine: objects in an arena (containers hold indices, so an object shared
/// through the memo is one object, as in Python), the stack and marks as indices into it.
struct Pickle<'a> {
    path: &'a Path,
    code: &'a [u8],
    pos: usize,
    objs: Vec<Obj>,
    stack: Vec<usize>,
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
}

impl<'a> Pickle<'a> {
    fn err(&self, at: usize, what: String) -> FormatError {
        invalid(self.path, format!("data.pkl byte {at}: {what}"))
    }

    fn take(&mut self, n: usize, at: usize) -> Result<&'a [u8], FormatError> {
        let code = self.code;
        let s = self
            .pos
            .checked_add(n)
            .and_then(|e| code.get(self.pos..e))
            .ok_or_else(|| self.err(at, format!("truncated: the opcode needs {n} more bytes")))?;
        self.pos += n;
        Ok(s)
    }

    fn uint(&mut self, n: usize, at: usize) -> Result<u64, FormatError> {
        let s = self.take(n, at)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(s);
        Ok(u64::from_le_bytes(v))
    }

    fn push(&mut self, o: Obj) {
        self.objs.push(o);
        self.stack.push(self.objs.len() - 1);
    }

    fn pop(&mut self, at: usize) -> Result<usize, FormatError> {
        if self.stack.len() <= self.marks.last().copied().unwrap_or(0) {
            return Err(self.err(at, "pop from an empty stack".into()));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err(at, "pop from an empty stack".into()))
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<usize>, FormatError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.err(at, "no mark to pop to".into()))?;
        Ok(self.stack.split_off(m))
    }

    fn top(&self, at: usize) -> Result<usize, FormatError> {
        match self.stack.last() {
            Some(&t) if self.stack.len() > self.marks.last().copied().unwrap_or(0) => Ok(t),
            _ => Err(self.err(at, "the stack is empty".into())),
        }
    }

    fn string(&mut self, n: usize, at: usize) -> Result<String, FormatError> {
        let s = self.take(n, at)?;
        std::str::from_utf8(s)
            .map(str::to_string)
            .map_err(|_| self.err(at, "a string that is not UTF-8".into()))
    }

    fn line(&mut self, at: usize) -> Result<String, FormatError> {
        let rest = &self.code[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| self.err(at, "truncated: unterminated line".into()))?;
        let s = self.string(n, at)?;
        self.pos += 1;
        Ok(s)
    }

    fn global(&self, module: &str, name: &str, at: usize) -> Result<Callable, FormatError> {
        let storage = (module == "torch")
            .then(|| TorchDtype::from_storage(name))
            .flatten();
        Ok(match (module, name, storage) {
            (_, _, Some(dtype)) => Callable::Storage(dtype),
            ("collections", "OrderedDict", _) => Callable::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2", _) => Callable::RebuildTensor,
            ("torch._utils", "_rebuild_parameter", _) => Callable::RebuildParameter,
            _ => {
                return Err(self.err(
                    at,
                    format!(
                        "global '{module}.{name}' is not read (a state dict holds only tensors, \
                         storages and OrderedDicts)"
                    ),
                ))
            }
        })
    }

    fn int(&self, i: usize) -> Option<i64> {
        match self.objs[i] {
            Obj::Int(v) => Some(v),
            _ => None,
        }
    }

    fn ints(&self, i: usize) -> Option<Vec<u64>> {
        match &self.objs[i] {
            Obj::Tuple(v) => v
                .iter()
                .map(|&x| self.int(x).and_then(|v| u64::try_from(v).ok()))
                .collect(),
            _ => None,
        }
    }

    /// f(*args) for the callables a state dict uses.
    fn reduce(&mut self, f: Callable, args: usize, at: usize) -> Result<(), FormatError> {
        let Obj::Tuple(a) = &self.objs[args] else {
            return Err(self.err(at, "REDUCE with arguments that are not a tuple".into()));
        };
        let a = a.clone();
        match f {
            Callable::OrderedDict if a.is_empty() => self.push(Obj::Dict(Vec::new())),
            Callable::OrderedDict => {
                return Err(self.err(at, "OrderedDict built from arguments".into()))
            }
            Callable::RebuildTensor => {
                if a.len() != 6 && a.len() != 7 {
                    return Err(self.err(
                        at,
                        format!("_rebuild_tensor_v2 with {} arguments (6 or 7)", a.len()),
                    ));
                }
                if !matches!(self.objs[a[0]], Obj::Storage { .. }) {
                    return Err(
                        self.err(at, "_rebuild_tensor_v2 of something not a storage".into())
                    );
                }
                let offset = self.int(a[1]).and_then(|v| u64::try_from(v).ok());
                let (size, stride) = (self.ints(a[2]), self.ints(a[3]));
                match (offset, size, stride) {
                    (Some(offset), Some(size), Some(stride)) if size.len() == stride.len() => self
                        .push(Obj::Tensor {
                            storage: a[0],
                            offset,
                            size,
                            stride,
                        }),
                    _ => {
                        return Err(self.err(
                            at,
                            "_rebuild_tensor_v2: offset, size and stride must be \
                             non-negative integers (size and stride of one length)"
                                .into(),
                        ))
                    }
                }
            }
            Callable::RebuildParameter => match a.first() {
                Some(&t) if matches!(self.objs[t], Obj::Tensor { .. }) => self.stack.push(t),
                _ => {
                    return Err(self.err(at, "_rebuild_parameter of something not a tensor".into()))
                }
            },
            Callable::Storage(_) => {
                return Err(self.err(at, "a storage class called as a function".into()))
            }
        }
        Ok(())
    }

    /// `('storage', torch.<Kind>Storage, key, location, numel)`
    fn persistent(&mut self, pid: usize, at: usize) -> Result<(), FormatError> {
        let bad = |s: &Self| s.err(at, "a persistent id that is not a storage tuple".into());
        let Obj::Tuple(t) = &self.objs[pid] else {
            return Err(bad(self));
        };
        if t.len() != 5 || !matches!(&self.objs[t[0]], Obj::Str(s) if s == "storage") {
            return Err(bad(self));
        }
        let Obj::Global(Callable::Storage(dtype)) = self.objs[t[1]] else {
            return Err(bad(self));
        };
        let key = match &self.objs[t[2]] {
            Obj::Str(s) => s.clone(),
            Obj::Int(v) => v.to_string(),
            _ => return Err(bad(self)),
        };
        let numel = self
            .int(t[4])
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| bad(self))?;
        self.push(Obj::Storage { dtype, key, numel });
        Ok(())
    }

    /// Runs the pickle to STOP; the object it returns.
    fn run(&mut self) -> Result<usize, FormatError> {
        loop {
            let at = self.pos;
            let op = *self
                .code
                .get(at)
                .ok_or_else(|| self.err(at, "truncated: the pickle ends before STOP".into()))?;
            self.pos += 1;
            match op {
                0x80 => {
                    let v = self.uint(1, at)?;
                    if v < 2 {
                        return Err(
                            self.err(at, format!("pickle protocol {v} (2 or later is read)"))
                        );
                    }
                }
                0x95 => {
                    self.take(8, at)?;
                }
                b'.' => return self.pop(at),
                b'(' => self.marks.push(self.stack.len()),
                b'}' => self.push(Obj::Dict(Vec::new())),
                b']' => self.push(Obj::List(Vec::new())),
                b')' => self.push(Obj::Tuple(Vec::new())),
                b't' => {
                    let v = self.pop_mark(at)?;
                    self.push(Obj::Tuple(v));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(self.pop(at)?);
                    }
                    v.reverse();
                    self.push(Obj::Tuple(v));
                }
                b'l' => {
                    let v = self.pop_mark(at)?;
                    self.push(Obj::List(v));
                }
                b'd' => {
                    let v = self.pop_mark(at)?;
                    if v.len() % 2 != 0 {
                        return Err(self.err(at, "DICT with an odd number of items".into()));
                    }
                    self.push(Obj::Dict(v.chunks_exact(2).map(|p| (p[0], p[1])).collect()));
                }
                b'a' | b'e' => {
                    let items = if op == b'a' {
                        vec![self.pop(at)?]
                    } else {
                        self.pop_mark(at)?
                    };
                    let l = self.top(at)?;
                    let Obj::List(v) = &mut self.objs[l] else {
                        return Err(self.err(at, "APPEND to something not a list".into()));
                    };
                    v.extend(items);
                }
                b's' | b'u' => {
                    let items = if op == b's' {
                        let v = self.pop(at)?;
                        let k = self.pop(at)?;
                        vec![k, v]
                    } else {
                        self.pop_mark(at)?
                    };
                    if items.len() % 2 != 0 {
                        return Err(self.err(at, "SETITEMS with an odd number of items".into()));
                    }
                    let d = self.top(at)?;
                    let Obj::Dict(v) = &mut self.objs[d] else {
                        return Err(self.err(at, "SETITEM on something not a dict".into()));
                    };
                    v.extend(items.chunks_exact(2).map(|p| (p[0], p[1])));
                }
                b'q' | b'r' | 0x94 => {
                    let key = match op {
                        b'q' => self.uint(1, at)?,
                        b'r' => self.uint(4, at)?,
                        _ => self.memo.len() as u64,
                    };
                    let t = self.top(at)?;
                    self.memo.insert(key, t);
                }
                b'h' | b'j' => {
                    let key = self.uint(if op == b'h' { 1 } else { 4 }, at)?;
                    let o = *self.memo.get(&key).ok_or_else(|| {
                        self.err(at, format!("memo entry {key} was never stored"))
                    })?;
                    self.stack.push(o);
                }
                b'c' => {
                    let module = self.line(at)?;
                    let name = self.line(at)?;
                    let g = self.global(&module, &name, at)?;
                    self.push(Obj::Global(g));
                }
                0x93 => {
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    let (Obj::Str(m), Obj::Str(n)) = (&self.objs[module], &self.objs[name]) else {
                        return Err(
                            self.err(at, "STACK_GLOBAL of names that are not strings".into())
                        );
                    };
                    let g = self.global(m, n, at)?;
                    self.push(Obj::Global(g));
                }
                b'R' => {
                    let args = self.pop(at)?;
                    let f = self.pop(at)?;
                    let Obj::Global(f) = self.objs[f] else {
                        return Err(self.err(at, "REDUCE of something not callable".into()));
                    };
                    self.reduce(f, args, at)?;
                }
                b'b' => {
                    // State set on an object: an OrderedDict's `_metadata`; not needed.
                    self.pop(at)?;
                    let o = self.top(at)?;
                    if !matches!(self.objs[o], Obj::Dict(_)) {
                        return Err(self.err(at, "BUILD on something not a dict".into()));
                    }
                }
                b'Q' => {
                    let pid = self.pop(at)?;
                    self.persistent(pid, at)?;
                }
                b'K' => {
                    let v = self.uint(1, at)?;
                    self.push(Obj::Int(v as i64));
                }
                b'M' => {
                    let v = self.uint(2, at)?;
                    self.push(Obj::Int(v as i64));
                }
                b'J' => {
                    let v = self.uint(4, at)? as u32 as i32;
                    self.push(Obj::Int(v as i64));
                }
                0x8a => {
                    let n = self.uint(1, at)? as usize;
                    if n > 8 {
                        return Err(
                            self.err(at, format!("a {n}-byte integer (8 at most are read)"))
                        );
                    }
                    let s = self.take(n, at)?;
                    let mut v = [if s.last().is_some_and(|&b| b & 0x80 != 0) {
                        0xff
                    } else {
                        0
                    }; 8];
                    v[..n].copy_from_slice(s);
                    self.push(Obj::Int(i64::from_le_bytes(v)));
                }
                b'G' => {
                    self.take(8, at)?;
                    self.push(Obj::Float);
                }
                0x88 | 0x89 => self.push(Obj::Bool),
                b'N' => self.push(Obj::None),
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'X' => self.uint(4, at)?,
                        0x8c => self.uint(1, at)?,
                        _ => self.uint(8, at)?,
                    };
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    let s = self.string(n, at)?;
                    self.push(Obj::Str(s));
                }
                b'U' | b'T' | b'C' | b'B' | 0x8e => {
                    let n = match op {
                        b'U' | b'C' => self.uint(1, at)?,
                        b'T' | b'B' => self.uint(4, at)?,
                        _ => self.uint(8, at)?,
                    };
                    self.take(usize::try_from(n).unwrap_or(usize::MAX), at)?;
                    self.push(Obj::Bytes);
                }
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let t = self.top(at)?;
                    self.stack.push(t);
                }
                _ => {
                    return Err(self.err(
                        at,
                        format!("pickle opcode 0x{op:02x} is not read (a state dict needs none)"),
                    ))
                }
            }
        }
    }

    /// Appends (name, tensor object) for every tensor under `o`.
    fn flatten(
        &self,
        o: usize,
        name: String,
        depth: usize,
        budget: &mut usize,
        out: &mut Vec<(String, usize)>,
    ) -> Result<(), FormatError> {
        let deep = || {
            invalid(
                self.path,
                format!("'{}': nested deeper than {MAX_DEPTH}", short(&name)),
            )
        };
        if name.len() > MAX_NAME {
            return Err(invalid(
                self.path,
                format!("'{}': a name longer than {MAX_NAME} bytes", short(&name)),
            ));
        }
        if *budget == 0 {
            return Err(invalid(
                self.path,
                "more than a million objects to name".into(),
            ));
        }
        *budget -= 1;
        let join = |k: &str| {
            if name.is_empty() {
                k.to_string()
            } else {
                format!("{name}.{k}")
            }
        };
        match &self.objs[o] {
            Obj::Tensor { .. } => out.push((name, o)),
            Obj::Dict(items) => {
                if depth >= MAX_DEPTH {
                    return Err(deep());
                }
                for &(k, v) in items {
                    let key = match &self.objs[k] {
                        Obj::Str(s) => s.clone(),
                        Obj::Int(i) => i.to_string(),
                        _ => continue,
                    };
                    self.flatten(v, join(&key), depth + 1, budget, out)?;
                }
            }
            Obj::List(items) | Obj::Tuple(items) => {
                if depth >= MAX_DEPTH {
                    return Err(deep());
                }
                for (i, &v) in items.iter().enumerate() {
                    self.flatten(v, join(&i.to_string()), depth + 1, budget, out)?;
                }
            }
            Obj::None
            | Obj::Bool
            | Obj::Int(_)
            | Obj::Float
            | Obj::Str(_)
            | Obj::Bytes
            | Obj::Global(_)
            | Obj::Storage { .. } => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A checkpoint of one FloatStorage ('0', 6 elements) and the tensor pickle `pkl`.
    fn checkpoint(pkl: &[u8]) -> Vec<u8> {
        let data = f32s(&[0., 1., 2., 3., 4., 5.]);
        crate::zip::tests::archive(
            &[
                ("a/data.pkl", pkl),
                ("a/byteorder", b"little"),
                ("a/data/0", &data),
            ],
            true,
        )
    }

    /// `{'w': _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())}`
    fn pickle(offset: u8, size: &[u8], stride: &[u8]) -> Vec<u8> {
        let mut p =
            b"\x80\x02}q\x00X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
        p.extend(b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ");
        p.extend([b'K', offset, b'(']);
        for &s in size {
            p.extend([b'K', s]);
        }
        p.extend(b"t(");
        for &s in stride {
            p.extend([b'K', s]);
        }
        p.extend(b"t\x89ccollections\nOrderedDict\n)RtRs.");
        p
    }

    fn one(b: &[u8]) -> Result<TorchTensor, FormatError> {
        let mut t = parse_torch(Path::new("t.pth"), b)?;
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].0, "w");
        Ok(t.remove(0).1)
    }

    #[test]
    fn views_honour_offset_size_and_stride() {
        let t = one(&checkpoint(&pickle(0, &[2, 3], &[3, 1]))).unwrap();
        assert_eq!(
            (t.shape, t.data),
            (vec![2, 3], vec![0., 1., 2., 3., 4., 5.])
        );
        let t = one(&checkpoint(&pickle(0, &[3, 2], &[1, 3]))).unwrap();
        assert_eq!(t.data, vec![0., 3., 1., 4., 2., 5.]);
        let t = one(&checkpoint(&pickle(1, &[2], &[3]))).unwrap();
        assert_eq!(t.data, vec![1., 4.]);
    }

    #[test]
    fn a_view_past_its_storage_is_an_error() {
        let e = one(&checkpoint(&pickle(1, &[2, 3], &[3, 1])))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'w'") && e.contains("reaches past its storage"),
            "{e}"
        );
        let e = one(&checkpoint(&pickle(0, &[4, 3], &[0, 1])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlapping"), "{e}");
    }

    #[test]
    fn other_globals_are_errors() {
        let mut p = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.".to_vec();
        let e = parse_torch(Path::new("evil.pth"), &checkpoint(&p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("evil.pth") && e.contains("byte 2") && e.contains("'os.system'"),
            "{e}"
        );
        p = b"\x80\x02\x81.".to_vec();
        let e = parse_torch(Path::new("t.pth"), &checkpoint(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("byte 2: pickle opcode 0x81"), "{e}");
    }

    /// A list holding itself: refused at the depth limit; pairs of references to the pair
    /// before, 30 deep (2^30 paths to one tensor): refused at the visit limit, 12 deep: at the
    /// limit on values; a dict holding itself under a long key: refused at the name limit.
    #[test]
    fn self_referential_and_exponential_containers_are_errors() {
        let t = pickle(0, &[2, 3], &[3, 1]);
        // `{'w': tensor}` without the protocol header and STOP.
        let tensor = &t[2..t.len() - 1];
        let parse = |p: &[u8]| {
            parse_torch(Path::new("t.pth"), &checkpoint(p))
                .unwrap_err()
                .to_string()
        };
        let mut p = b"\x80\x02]q\x00(h\x00h\x00".to_vec();
        p.extend(tensor);
        p.extend(b"e.");
        let e = parse(&p);
        assert!(e.contains("nested deeper than 64"), "{e}");
        let doubling = |levels: u8| {
            let mut p = b"\x80\x02".to_vec();
            p.extend(tensor); // memo 0
            for i in 0..levels {
                p.extend([b'h', i, b'h', i, 0x86, 0x94]);
            }
            p.push(b'.');
            p
        };
        let e = parse(&doubling(30));
        assert!(e.contains("more than a million objects"), "{e}");
        // 2^12 paths, within the visit limit: their values together exceed the file's bytes.
        let e = parse(&doubling(12));
        assert!(e.contains("more than two per byte of the file"), "{e}");
        let key = "k".repeat(200);
        let mut p = b"\x80\x02}q\x00(X".to_vec();
        p.extend((key.len() as u32).to_le_bytes());
        p.extend(key.as_bytes());
        p.extend(b"h\x00X\x01\x00\x00\x00t");
        p.extend(tensor);
        p.extend(b"u.");
        let e = parse_torch(Path::new("t.pth"), &checkpoint(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a name longer than 4096 bytes"), "{e}");
    }

    #[test]
    fn truncations_and_legacy_files_are_errors() {
        let b = checkpoint(&pickle(0, &[2, 3], &[3, 1]));
        for n in 0..b.len() {
            assert!(parse_torch(Path::new("t.pth"), &b[..n]).is_err(), "{n}");
        }
        let p = pickle(0, &[2, 3], &[3, 1]);
        for n in 0..p.len() {
            let e = parse_torch(Path::new("t.pth"), &checkpoint(&p[..n]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("data.pkl byte"), "{e}");
        }
        let e = parse_torch(
            Path::new("old.pt"),
            b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("legacy"), "{e}");
    }
}
