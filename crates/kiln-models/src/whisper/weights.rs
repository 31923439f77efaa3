//! Where Whisper's weights come from, and strict loading from any of them.
//!
//! Every read names a canonical parameter: OpenAI's own name (`encoder.blocks.0.attn.query
//! .weight`, which whisper.cpp keeps), mapped per format to the stored tensor:
//!
//! | canonical                      | CTranslate2 `model.bin`                  | Hugging Face                          |
//! | ------------------------------ | ---------------------------------------- | ------------------------------------- |
//! | encoder.conv1.weight           | encoder/conv1/weight                     | model.encoder.conv1.weight            |
//! | encoder.positional_embedding   | encoder/position_encodings/encodings     | model.encoder.embed_positions.weight  |
//! | X.blocks.i.attn_ln.weight      | X/layer_i/self_attention/layer_norm/gamma| model.X.layers.i.self_attn_layer_norm |
//! | X.blocks.i.attn.query/key/value| X/layer_i/self_attention/linear_0 (rows) | model.X.layers.i.self_attn.q/k/v_proj |
//! | X.blocks.i.attn.out            | X/layer_i/self_attention/linear_1        | model.X.layers.i.self_attn.out_proj   |
//! | decoder.blocks.i.cross_attn_ln | decoder/layer_i/attention/layer_norm     | ....encoder_attn_layer_norm           |
//! | decoder.blocks.i.cross_attn.q  | decoder/layer_i/attention/linear_0       | ....encoder_attn.q_proj               |
//! | decoder.blocks.i.cross_attn.k/v| decoder/layer_i/attention/linear_1 (rows)| ....encoder_attn.k_proj / v_proj      |
//! | decoder.blocks.i.cross_attn.out| decoder/layer_i/attention/linear_2       | ....encoder_attn.out_proj             |
//! | X.blocks.i.mlp_ln / mlp.0/.2   | X/layer_i/ffn/layer_norm / linear_0/_1   | ....final_layer_norm / fc1 / fc2      |
//! | encoder.ln_post, decoder.ln    | encoder/layer_norm, decoder/layer_norm   | model.encoder/decoder.layer_norm      |
//! | decoder.token_embedding.weight | decoder/embeddings/weight                | model.decoder.embed_tokens.weight     |
//! | decoder.positional_embedding   | decoder/position_encodings/encodings     | model.decoder.embed_positions.weight  |
//!
//! CTranslate2 fuses q/k/v (and the cross-attention k/v) into one matrix, read here as row
//! ranges of it; norms store `gamma`/`beta` for `weight`/`bias`. Shapes are row-major
//! (outermost first) in every format (ggml's innermost-first dims are reversed). Shape and
//! type are checked on every read; tensors nobody read are an error at the end.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kiln_backend::{Backend, BackendError, WeightData};
use kiln_formats::{
    is_whisper_ggml, Ct2Dtype, Ct2File, FormatError, SafetensorsSet, StDtype, WhisperGgmlFile,
};
use kiln_quant::{dequantize, dequantize_row, quantize_row, GgmlType};

use crate::ModelError;

/// A Hugging Face `openai/whisper-*` checkpoint directory.
pub struct HfWhisper {
    pub dir: PathBuf,
    pub set: SafetensorsSet,
    /// `config.json`.
    pub config: serde_json::Value,
    /// `generation_config.json`, when present.
    pub generation: Option<serde_json::Value>,
}

/// An opened Whisper model file in one of the formats kiln reads.
pub enum WhisperFile {
    /// CTranslate2 `model.bin` (faster-whisper's format).
    Ct2(Ct2File),
    /// whisper.cpp ggml `.bin`.
    Ggml(WhisperGgmlFile),
    /// Hugging Face `config.json` + `model.safetensors` (or shards with an index).
    Hf(HfWhisper),
}

fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| FormatError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config {
        file: path.into(),
        what: format!("not JSON: {e}"),
    })
}

fn has_safetensors(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
    })
}

/// Whether the file at `path` starts with the ggml magic.
fn starts_like_ggml(path: &Path) -> Result<bool, FormatError> {
    use std::io::Read;
    let io = |source| FormatError::Io {
        path: path.into(),
        source,
    };
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(io)?;
    let n = f.read(&mut head).map_err(io)?;
    Ok(is_whisper_ggml(&head[..n]))
}

/// The `.bin` files in `dir` that start like whisper.cpp models.
fn ggml_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .filter(|p| starts_like_ggml(p).unwrap_or(false))
        .collect();
    v.sort();
    v
}

impl WhisperFile {
    /// Opens `path`, telling the format from what is there: a directory with `model.bin`
    /// (CTranslate2) or with `config.json` and safetensors weights (Hugging Face); a file
    /// that starts with the ggml magic (whisper.cpp), else a CTranslate2 `model.bin`.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            if path.join("model.bin").is_file() {
                return Ok(WhisperFile::Ct2(Ct2File::open(path.join("model.bin"))?));
            }
            if path.join("config.json").is_file() && has_safetensors(path) {
                return Self::open_hf(path);
            }
            // A folder holding one whisper.cpp file.
            if let [one] = &ggml_files(path)[..] {
                return Ok(WhisperFile::Ggml(WhisperGgmlFile::open(one)?));
            }
            return Err(ModelError::Config {
                file: path.into(),
                what: "not a Whisper model directory: expected model.bin (CTranslate2), \
                       config.json with model.safetensors (Hugging Face) or one whisper.cpp \
                       ggml .bin"
                    .into(),
            });
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "config.json" || name.ends_with(".safetensors") {
            let dir = path.parent().unwrap_or(Path::new("."));
            return Self::open_hf(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            });
        }
        if starts_like_ggml(path)? {
            return Ok(WhisperFile::Ggml(WhisperGgmlFile::open(path)?));
        }
        Ok(WhisperFile::Ct2(Ct2File::open(path)?))
    }

    pub fn open_hf(dir: &Path) -> Result<Self, ModelError> {
        let config = read_json(&dir.join("config.json"))?;
        let gen = dir.join("generation_config.json");
        let generation = if gen.is_file() {
            Some(read_json(&gen)?)
        } else {
            None
        };
        Ok(WhisperFile::Hf(HfWhisper {
            dir: dir.into(),
            set: SafetensorsSet::open_dir(dir)?,
            config,
            generation,
        }))
    }

    /// The file (or directory) errors name.
    pub fn path(&self) -> &Path {
        match self {
            WhisperFile::Ct2(f) => f.path(),
            WhisperFile::Ggml(f) => f.path(),
            WhisperFile::Hf(h) => &h.dir,
        }
    }

    pub fn format_name(&self) -> &'static str {
        match self {
            WhisperFile::Ct2(_) => "CTranslate2",
            WhisperFile::Ggml(_) => "whisper.cpp ggml",
            WhisperFile::Hf(_) => "Hugging Face safetensors",
        }
    }
}

/// Where a canonical parameter lies in the file: the stored tensor, and which of its
/// `parts` equal row blocks (`part`) it is.
struct Loc {
    name: String,
    part: usize,
    parts: usize,
}

fn loc(name: impl Into<String>, part: usize, parts: usize) -> Loc {
    Loc {
        name: name.into(),
        part,
        parts,
    }
}

/// `encoder.blocks.3.attn.query.weight` -> (`encoder`, Some(3), `attn.query`, `weight`).
fn split_canonical(c: &str) -> Option<(&str, Option<&str>, &str, &str)> {
    let (base, leaf) = c.rsplit_once('.')?;
    let (stack, rest) = base.split_once('.')?;
    match rest.strip_prefix("blocks.") {
        Some(r) => {
            let (i, m) = r.split_once('.')?;
            Some((stack, Some(i), m, leaf))
        }
        None => Some((stack, None, rest, leaf)),
    }
}

fn ct2_name(c: &str) -> Option<Loc> {
    match c {
        "encoder.positional_embedding" => {
            return Some(loc("encoder/position_encodings/encodings", 0, 1))
        }
        "decoder.positional_embedding" => {
            return Some(loc("decoder/position_encodings/encodings", 0, 1))
        }
        "decoder.token_embedding.weight" => return Some(loc("decoder/embeddings/weight", 0, 1)),
        _ => {}
    }
    let (stack, layer, m, leaf) = split_canonical(c)?;
    let prefix = match layer {
        Some(i) => format!("{stack}/layer_{i}"),
        None => stack.to_string(),
    };
    let (path, part, parts) = match m {
        "conv1" | "conv2" => (m, 0, 1),
        "ln_post" | "ln" => ("layer_norm", 0, 1),
        "attn_ln" => ("self_attention/layer_norm", 0, 1),
        "attn.query" => ("self_attention/linear_0", 0, 3),
        "attn.key" => ("self_attention/linear_0", 1, 3),
        "attn.value" => ("self_attention/linear_0", 2, 3),
        "attn.out" => ("self_attention/linear_1", 0, 1),
        "cross_attn_ln" => ("attention/layer_norm", 0, 1),
        "cross_attn.query" => ("attention/linear_0", 0, 1),
        "cross_attn.key" => ("attention/linear_1", 0, 2),
        "cross_attn.value" => ("attention/linear_1", 1, 2),
        "cross_attn.out" => ("attention/linear_2", 0, 1),
        "mlp_ln" => ("ffn/layer_norm", 0, 1),
        "mlp.0" => ("ffn/linear_0", 0, 1),
        "mlp.2" => ("ffn/linear_1", 0, 1),
        _ => return None,
    };
    let leaf = match (path.ends_with("layer_norm"), leaf) {
        (true, "weight") => "gamma",
        (true, "bias") => "beta",
        (_, l) => l,
    };
    Some(loc(format!("{prefix}/{path}/{leaf}"), part, parts))
}

fn hf_name(c: &str) -> Option<Loc> {
    match c {
        "encoder.positional_embedding" => {
            return Some(loc("model.encoder.embed_positions.weight", 0, 1))
        }
        "decoder.positional_embedding" => {
            return Some(loc("model.decoder.embed_positions.weight", 0, 1))
        }
        "decoder.token_embedding.weight" => {
            return Some(loc("model.decoder.embed_tokens.weight", 0, 1))
        }
        _ => {}
    }
    let (stack, layer, m, leaf) = split_canonical(c)?;
    let prefix = match layer {
        Some(i) => format!("model.{stack}.layers.{i}"),
        None => format!("model.{stack}"),
    };
    let path = match m {
        "conv1" | "conv2" => m,
        "ln_post" | "ln" => "layer_norm",
        "attn_ln" => "self_attn_layer_norm",
        "attn.query" => "self_attn.q_proj",
        "attn.key" => "self_attn.k_proj",
        "attn.value" => "self_attn.v_proj",
        "attn.out" => "self_attn.out_proj",
        "cross_attn_ln" => "encoder_attn_layer_norm",
        "cross_attn.query" => "encoder_attn.q_proj",
        "cross_attn.key" => "encoder_attn.k_proj",
        "cross_attn.value" => "encoder_attn.v_proj",
        "cross_attn.out" => "encoder_attn.out_proj",
        "mlp_ln" => "final_layer_norm",
        "mlp.0" => "fc1",
        "mlp.2" => "fc2",
        _ => return None,
    };
    Some(loc(format!("{prefix}.{path}.{leaf}"), 0, 1))
}

/// A stored tensor's bytes (one part of it), type and row-major shape.
struct Stored<'a> {
    name: String,
    ty: GgmlType,
    bytes: &'a [u8],
    file: PathBuf,
}

/// Reads canonical parameters from a [`WhisperFile`].
pub struct Weights<'a> {
    pub file: &'a WhisperFile,
    unused: RefCell<BTreeSet<String>>,
    /// Format to quantize linear weights into at load (None: keep the file's).
    quant: Option<GgmlType>,
    /// Whether `quant` applies to the matrices loaded now.
    quant_on: Cell<bool>,
    /// Whether the matrices loaded now run over every position of a window (marked
    /// `prefer_batches`).
    batched: Cell<bool>,
}

impl<'a> Weights<'a> {
    pub fn new(file: &'a WhisperFile, quant: Option<GgmlType>) -> Self {
        let unused = match file {
            // Newer CTranslate2 converters also write the decoder's ALiBi options; they mean
            // nothing while ALiBi itself is off, as it is for every Whisper (a file that turns
            // it on keeps its `decoder/alibi` variable unread and is refused).
            WhisperFile::Ct2(f) => f
                .vars
                .iter()
                .map(|v| v.name.clone())
                .filter(|n| {
                    n != "decoder/alibi_use_positive_positions" && n != "decoder/scale_alibi"
                })
                .collect(),
            WhisperFile::Ggml(f) => f.tensors.iter().map(|t| t.name.clone()).collect(),
            WhisperFile::Hf(h) => h.set.tensors().map(|t| t.name.clone()).collect(),
        };
        Weights {
            file,
            unused: RefCell::new(unused),
            quant,
            quant_on: Cell::new(true),
            batched: Cell::new(false),
        }
    }

    /// Whether the matrices read from now on run once per window over every position (the
    /// encoder, the cross-attention keys and values: arithmetic-bound; they keep the file's
    /// format, marked `prefer_batches`, with int8 block products allowed where the load-time
    /// format or the file's is Q8_0) or once per token (the rest of the decoder: bound by
    /// weight bytes, so the load-time format applies).
    pub fn set_batched(&self, on: bool) {
        self.batched.set(on);
        self.quant_on.set(!on);
    }

    fn origin(&self) -> PathBuf {
        self.file.path().into()
    }

    fn locate(&self, canon: &str) -> Option<Loc> {
        match self.file {
            WhisperFile::Ct2(_) => ct2_name(canon),
            WhisperFile::Ggml(_) => Some(loc(canon, 0, 1)),
            WhisperFile::Hf(_) => hf_name(canon),
        }
    }

    /// Whether the file holds the canonical parameter.
    pub fn has(&self, canon: &str) -> bool {
        let Some(l) = self.locate(canon) else {
            return false;
        };
        match self.file {
            WhisperFile::Ct2(f) => f.var(&l.name).is_some(),
            WhisperFile::Ggml(f) => f.tensor(&l.name).is_some(),
            WhisperFile::Hf(h) => h.set.tensor(&l.name).is_some(),
        }
    }

    /// Marks a stored tensor as understood without loading it (config scalars, aliases).
    pub fn touch(&self, stored: &str) {
        if let WhisperFile::Ct2(f) = self.file {
            if let Some(v) = f.var(stored) {
                self.unused.borrow_mut().remove(&v.name);
                return;
            }
        }
        self.unused.borrow_mut().remove(stored);
    }

    /// The parameter `canon` of row-major `shape` (its part of a fused tensor).
    fn stored(&self, canon: &str, shape: &[u64]) -> Result<Stored<'a>, ModelError> {
        let l = self
            .locate(canon)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.origin(),
                name: canon.into(),
            })?;
        let missing = || ModelError::MissingTensor {
            file: self.origin(),
            name: l.name.clone(),
        };
        let mut want = shape.to_vec();
        if let Some(r) = want.first_mut() {
            *r *= l.parts as u64;
        }
        let shape_err = |got: Vec<u64>, ty: &'static str| ModelError::Shape {
            file: self.origin(),
            name: l.name.clone(),
            expected: want.clone(),
            got,
            ty,
        };
        let unsupported = |file: &Path, ty: &str| ModelError::Config {
            file: file.into(),
            what: format!(
                "tensor '{}' is {ty}; kiln reads float32/float16/bfloat16 weights here",
                l.name
            ),
        };
        let (real_name, ty, bytes, file) = match self.file {
            WhisperFile::Ct2(f) => {
                let v = f.var(&l.name).ok_or_else(missing)?;
                if v.shape != want {
                    return Err(shape_err(v.shape.clone(), v.dtype.name()));
                }
                let ty = match v.dtype {
                    Ct2Dtype::F32 => GgmlType::F32,
                    Ct2Dtype::F16 => GgmlType::F16,
                    Ct2Dtype::BF16 => GgmlType::BF16,
                    t => {
                        return Err(ModelError::Config {
                            file: f.path().into(),
                            what: format!(
                                "tensor '{}' is {}; kiln reads float32/float16/bfloat16 \
                                 CTranslate2 models (convert with --quantization float16)",
                                l.name,
                                t.name()
                            ),
                        })
                    }
                };
                (v.name.clone(), ty, f.data(v), f.path().to_path_buf())
            }
            WhisperFile::Ggml(f) => {
                let t = f.tensor(&l.name).ok_or_else(missing)?;
                // ggml keeps size-1 dims (a conv bias is (1, d)): compare without them.
                let squeeze = |s: &[u64]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
                if squeeze(&t.shape()) != squeeze(&want) {
                    return Err(shape_err(t.shape(), t.ty.name()));
                }
                (t.name.clone(), t.ty, f.data(t), f.path().to_path_buf())
            }
            WhisperFile::Hf(h) => {
                let t = h.set.tensor(&l.name).ok_or_else(missing)?;
                if t.shape != want {
                    return Err(shape_err(t.shape.clone(), t.dtype.name()));
                }
                let file = h.set.path_of(t).to_path_buf();
                let ty = match t.dtype {
                    StDtype::F32 => GgmlType::F32,
                    StDtype::F16 => GgmlType::F16,
                    StDtype::BF16 => GgmlType::BF16,
                    other => return Err(unsupported(&file, other.name())),
                };
                (t.name.clone(), ty, h.set.data(t), file)
            }
        };
        self.unused.borrow_mut().remove(&real_name);
        let bytes = if l.parts > 1 {
            let n = bytes.len() / l.parts;
            &bytes[l.part * n..(l.part + 1) * n]
        } else {
            bytes
        };
        Ok(Stored {
            name: real_name,
            ty,
            bytes,
            file,
        })
    }

    fn quant_err(&self, file: &Path, name: &str, source: kiln_quant::QuantError) -> ModelError {
        ModelError::Backend {
            file: file.into(),
            source: BackendError::Quant {
                name: name.into(),
                source,
            },
        }
    }

    /// Values of the parameter as f32.
    pub fn floats(&self, canon: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let s = self.stored(canon, shape)?;
        let n: u64 = shape.iter().product();
        dequantize(s.ty, s.bytes, n as usize).map_err(|e| self.quant_err(&s.file, &s.name, e))
    }

    pub fn vector<B: Backend>(
        &self,
        b: &B,
        canon: &str,
        n: usize,
    ) -> Result<B::Tensor, ModelError> {
        Ok(b.tensor_from(1, n, &self.floats(canon, &[n as u64])?))
    }

    /// A bias some formats leave out when it is zero (the attention keys' in OpenAI's
    /// Whisper): zeros where the file has none.
    pub fn vector_or_zeros<B: Backend>(
        &self,
        b: &B,
        canon: &str,
        n: usize,
    ) -> Result<B::Tensor, ModelError> {
        if self.has(canon) {
            self.vector(b, canon, n)
        } else {
            Ok(b.tensor_from(1, n, &vec![0.0; n]))
        }
    }

    /// A matrix of row-major `shape` (rows = shape[0], cols = the rest multiplied, so a conv
    /// kernel (d, c_in, k) reads as (d, c_in*k)); `quantize` lets the load-time format apply.
    pub fn matrix<B: Backend>(
        &self,
        b: &B,
        canon: &str,
        shape: &[u64],
        quantize: bool,
    ) -> Result<B::Weight, ModelError> {
        let s = self.stored(canon, shape)?;
        let rows = shape[0] as usize;
        let cols = shape[1..].iter().product::<u64>() as usize;
        let backend_err = |source| ModelError::Backend {
            file: s.file.clone(),
            source,
        };
        let target = self
            .quant
            .filter(|q| quantize && self.quant_on.get() && cols % q.block_size() == 0)
            .filter(|&q| q != s.ty);
        let w = match target {
            None => b.load_weight(WeightData {
                name: &s.name,
                ty: s.ty,
                rows,
                cols,
                bytes: s.bytes,
            }),
            Some(q) => {
                let qe = |e| self.quant_err(&s.file, &s.name, e);
                let (srb, rb) = (
                    s.ty.row_bytes(cols).map_err(qe)?,
                    q.row_bytes(cols).map_err(qe)?,
                );
                if s.bytes.len() != srb * rows {
                    return Err(backend_err(BackendError::Weight {
                        name: s.name.clone(),
                        what: format!("{} bytes are not {rows} rows of {cols}", s.bytes.len()),
                    }));
                }
                let mut out = vec![0u8; rb * rows];
                let mut row = vec![0f32; cols];
                for (src, dst) in s.bytes.chunks_exact(srb).zip(out.chunks_exact_mut(rb)) {
                    dequantize_row(s.ty, src, &mut row).map_err(qe)?;
                    quantize_row(q, &row, dst).map_err(qe)?;
                }
                b.load_weight(WeightData {
                    name: &s.name,
                    ty: q,
                    rows,
                    cols,
                    bytes: &out,
                })
            }
        };
        let mut w = w.map_err(backend_err)?;
        if self.batched.get() {
            let int8 = self.quant == Some(GgmlType::Q8_0) || s.ty == GgmlType::Q8_0;
            b.prefer_batches(&mut w, int8);
        }
        Ok(w)
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
