//! whisper.cpp ggml `.bin` (`ggml-tiny.en.bin`, ...), memory-mapped.
//!
//! Layout (little-endian, no padding anywhere):
//! `u32 magic 0x67676d6c ("ggml") | i32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
//!  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype |
//!  i32 n_mel, i32 n_fft, f32 filters[n_mel * n_fft] |
//!  i32 n_tokens, (u32 len, len bytes)* | tensor* up to the end of the file`
//! tensor: `i32 n_dims, i32 name_len, i32 ggml_type | i32 ne[n_dims] (innermost first) |
//!  name | data (ne[0] is the contiguous row, in blocks of the type)`.
//! `ftype` may carry the quantization version as `version * 1000 + ftype`.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use kiln_quant::GgmlType;
use memmap2::Mmap;

use crate::bytes::Bytes;
use crate::FormatError;

/// The first four bytes of a whisper.cpp model ("ggml" as a little-endian u32).
pub const GGML_MAGIC: u32 = 0x6767_6d6c;
const FORMAT: &str = "whisper.cpp ggml";
const MAX_DIMS: usize = 4;

/// The model's hyperparameters, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlHparams {
    pub n_vocab: u32,
    pub n_audio_ctx: u32,
    pub n_audio_state: u32,
    pub n_audio_head: u32,
    pub n_audio_layer: u32,
    pub n_text_ctx: u32,
    pub n_text_state: u32,
    pub n_text_head: u32,
    pub n_text_layer: u32,
    pub n_mels: u32,
    /// The file's weight type (0 f32, 1 f16, 2 q4_0, 3 q4_1, 7 q8_0, 8 q5_0, 9 q5_1, ...),
    /// quantization version removed.
    pub ftype: u32,
    /// `ftype / 1000` as stored (ggml's quantization version).
    pub qnt_version: u32,
}

#[derive(Debug, Clone)]
pub struct GgmlTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
    pub n_bytes: u64,
}

impl GgmlTensor {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape outermost first (row-major, as safetensors and CTranslate2 write it).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

pub struct WhisperGgmlFile {
    path: PathBuf,
    map: Bytes,
    pub hparams: GgmlHparams,
    /// Mel filterbank shape (n_mel, n_fft) and where its f32 values lie.
    pub mel_filters: (u32, u32, u64),
    /// Text tokens as raw bytes, by id (byte-level BPE pieces, not yet UTF-8).
    pub tokens: Vec<(u64, u32)>,
    pub tensors: Vec<GgmlTensor>,
    index: HashMap<String, usize>,
}

struct Reader<'a> {
    path: &'a Path,
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&[u8], FormatError> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|&e| e <= self.b.len() as u64);
        let Some(end) = end else {
            return Err(FormatError::Truncated {
                path: self.path.into(),
                what: what(),
                needed: (self.pos as u64).saturating_add(n),
                len: self.b.len() as u64,
            });
        };
        let s = &self.b[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// An i32 that must be >= 0 (counts and sizes).
    fn count(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        let v = self.u32(what)? as i32;
        u32::try_from(v).map_err(|_| FormatError::Invalid {
            path: self.path.into(),
            what: format!("{} is {v}", what()),
        })
    }
}

/// Whether `bytes` start like a whisper.cpp model.
pub fn is_whisper_ggml(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == GGML_MAGIC
}

/// whisper.cpp `ftype` ids (llama.cpp's `LLAMA_FTYPE_*`) to the weight type they mean.
pub fn ftype_name(ftype: u32) -> &'static str {
    match ftype {
        0 => "f32",
        1 => "f16",
        2 => "q4_0",
        3 => "q4_1",
        7 => "q8_0",
        8 => "q5_0",
        9 => "q5_1",
        10 => "q2_k",
        11 => "q3_k",
        12 => "q4_k",
        13 => "q5_k",
        14 => "q6_k",
        _ => "unknown",
    }
}

impl WhisperGgmlFile {
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

    /// Parses a model image held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<Self, FormatError> {
        Self::parse(path.as_ref(), Bytes::Owned(bytes))
    }

    fn parse(path: &Path, map: Bytes) -> Result<Self, FormatError> {
        if !is_whisper_ggml(&map) {
            return Err(FormatError::NotFormat {
                path: path.into(),
                format: FORMAT,
                why: if map.len() < 4 {
                    format!("{} bytes", map.len())
                } else {
                    "no 'ggml' magic".into()
                },
            });
        }
        let invalid = |what: String| FormatError::Invalid {
            path: path.into(),
            what,
        };
        let len = map.len() as u64;
        let mut r = Reader {
            path,
            b: &map,
            pos: 4,
        };
        let mut h = [0u32; 11];
        const NAMES: [&str; 11] = [
            "n_vocab",
            "n_audio_ctx",
            "n_audio_state",
            "n_audio_head",
            "n_audio_layer",
            "n_text_ctx",
            "n_text_state",
            "n_text_head",
            "n_text_layer",
            "n_mels",
            "ftype",
        ];
        for (v, name) in h.iter_mut().zip(NAMES) {
            *v = r.count(&|| format!("hparam {name}"))?;
        }
        let hparams = GgmlHparams {
            n_vocab: h[0],
            n_audio_ctx: h[1],
            n_audio_state: h[2],
            n_audio_head: h[3],
            n_audio_layer: h[4],
            n_text_ctx: h[5],
            n_text_state: h[6],
            n_text_head: h[7],
            n_text_layer: h[8],
            n_mels: h[9],
            ftype: h[10] % 1000,
            qnt_version: h[10] / 1000,
        };
        let n_mel = r.count(&|| "mel filter count".into())?;
        let n_fft = r.count(&|| "mel filter length".into())?;
        let filters_at = r.pos as u64;
        let n_filter_bytes = (n_mel as u64 * n_fft as u64).saturating_mul(4);
        r.take(n_filter_bytes, &|| {
            format!("mel filters ({n_mel} x {n_fft} f32)")
        })?;

        let n_tokens = r.count(&|| "vocabulary size".into())?;
        // Each token takes at least its 4-byte length.
        if n_tokens as u64 > (len - r.pos as u64) / 4 {
            return Err(invalid(format!(
                "{n_tokens} vocabulary tokens cannot fit in the {} bytes left",
                len - r.pos as u64
            )));
        }
        let mut tokens = Vec::with_capacity(n_tokens as usize);
        for i in 0..n_tokens {
            let n = r.u32(&|| format!("length of token {i}"))?;
            let at = r.pos as u64;
            r.take(n as u64, &|| format!("token {i} ({n} bytes)"))?;
            tokens.push((at, n));
        }

        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        while r.pos < map.len() {
            let i = tensors.len();
            let n_dims = r.count(&|| format!("dims of tensor {i}"))? as usize;
            let name_len = r.count(&|| format!("name length of tensor {i}"))?;
            let ty_id = r.count(&|| format!("type of tensor {i}"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(invalid(format!(
                    "tensor {i} has {n_dims} dims (1..={MAX_DIMS})"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.count(&|| format!("dims of tensor {i}"))? as u64);
            }
            let name = r.take(name_len as u64, &|| format!("name of tensor {i}"))?;
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| invalid(format!("name of tensor {i} is not UTF-8")))?;
            let bad = |what: String| FormatError::Tensor {
                path: path.into(),
                name: name.clone(),
                what,
            };
            let ty = GgmlType::from_id(ty_id)
                .ok_or_else(|| bad(format!("unknown ggml type id {ty_id}")))?;
            if dims[0] % ty.block_size() as u64 != 0 {
                return Err(bad(format!(
                    "rows of {} are not whole {} blocks of {}",
                    dims[0],
                    ty.name(),
                    ty.block_size()
                )));
            }
            let n_bytes = dims[1..]
                .iter()
                .try_fold(
                    dims[0] / ty.block_size() as u64 * ty.type_size() as u64,
                    |a, &d| a.checked_mul(d),
                )
                .ok_or_else(|| bad(format!("dims {dims:?} overflow")))?;
            let offset = r.pos as u64;
            r.take(n_bytes, &|| {
                format!("tensor '{name}' ({} {dims:?})", ty.name())
            })?;
            if index.insert(name.clone(), i).is_some() {
                return Err(bad("appears twice".into()));
            }
            tensors.push(GgmlTensor {
                name,
                dims,
                ty,
                offset,
                n_bytes,
            });
        }
        if tensors.is_empty() {
            return Err(FormatError::Truncated {
                path: path.into(),
                what: "tensors (the file ends after the vocabulary)".into(),
                needed: len + 12,
                len,
            });
        }
        Ok(WhisperGgmlFile {
            path: path.into(),
            map,
            hparams,
            mel_filters: (n_mel, n_fft, filters_at),
            tokens,
            tensors,
            index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensor(&self, name: &str) -> Option<&GgmlTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes (bounds checked at open).
    pub fn data(&self, t: &GgmlTensor) -> &[u8] {
        &self.map[t.offset as usize..(t.offset + t.n_bytes) as usize]
    }

    /// Token `id`'s bytes.
    pub fn token(&self, id: usize) -> Option<&[u8]> {
        let &(at, n) = self.tokens.get(id)?;
        Some(&self.map[at as usize..at as usize + n as usize])
    }

    /// The mel filterbank (n_mel rows of n_fft values).
    pub fn mel_filters(&self) -> Vec<f32> {
        let (m, f, at) = self.mel_filters;
        let n = m as usize * f as usize * 4;
        self.map[at as usize..at as usize + n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Tells the OS the tensor's pages may be dropped once copied (a hint).
    pub fn release(&self, t: &GgmlTensor) {
        self.map
            .release(t.offset as usize, (t.offset + t.n_bytes) as usize);
    }
}
