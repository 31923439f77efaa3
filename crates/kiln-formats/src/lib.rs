//! Model file readers. Every reader maps the file, checks every offset and count against the
//! file's length before it touches the bytes, and reports a defect as a [`FormatError`] that
//! names the file and the problem; nothing a file contains can make it panic.

mod error;
pub mod gguf;
pub mod npy;
pub mod onnx;

pub use error::FormatError;
pub use gguf::{GgufFile, GgufWriter, TensorInfo, Value};
pub use npy::{read_npy, read_npz, NpyArray};
pub use onnx::{OnnxFile, OnnxNode, OnnxTensor, OnnxType};
