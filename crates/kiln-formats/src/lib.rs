//! Model file readers. Every reader maps the file, checks every offset and count against the
//! file's length before it touches the bytes, and reports a defect as a [`FormatError`] that
//! names the file and the problem; nothing a file contains can make it panic.

pub mod ct2;
mod error;
pub mod gguf;
pub mod safetensors;

pub use ct2::{Ct2Dtype, Ct2File, Ct2Var};
pub use error::FormatError;
pub use gguf::{GgufFile, GgufWriter, TensorInfo, Value};
pub use safetensors::{SafetensorsSet, StDtype, StTensor};
