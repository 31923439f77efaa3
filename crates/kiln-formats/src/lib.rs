//! Model file readers. Every reader maps the file, checks every offset and count against the
//! file's length before it touches the bytes, and reports a defect as a [`FormatError`] that
//! names the file and the problem; nothing a file contains can make it panic.

mod bytes;
pub mod ct2;
mod error;
pub mod gguf;
pub mod npy;
pub mod onnx;
pub mod output;
pub mod safetensors;
pub mod time;
pub mod torch;
pub mod whisper_ggml;
pub mod zip;

pub use ct2::{Ct2Dtype, Ct2File, Ct2Var};
pub use error::FormatError;
pub use gguf::{GgufFile, GgufWriter, TensorInfo, Value};
pub use npy::{parse_npy, parse_npz, read_npy, read_npz, NpyArray};
pub use onnx::{OnnxFile, OnnxNode, OnnxTensor, OnnxType};
pub use output::OutputFile;
pub use safetensors::{SafetensorsSet, StDtype, StTensor};
pub use time::rfc3339_utc;
pub use torch::{parse_torch, read_torch, TorchDtype, TorchTensor};
pub use whisper_ggml::{is_whisper_ggml, GgmlHparams, GgmlTensor, WhisperGgmlFile};
