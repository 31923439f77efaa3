//! Block quantization formats (the GGML family plus plain floats).
//!
//! A tensor row of `n` values in a block format is `n / block_size` blocks of `type_size`
//! bytes each. This crate is the scalar reference: `dequantize_row` and `quantize_row` are
//! what every faster kernel is tested against.

mod types;

pub use types::{GgmlType, QuantError};
