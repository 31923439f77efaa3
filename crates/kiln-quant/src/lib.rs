//! Block quantization formats (the GGML family plus plain floats).
//!
//! A tensor row of `n` values in a block format is `n / block_size` blocks of `type_size`
//! bytes each. This crate is the scalar reference: `dequantize_row` and `quantize_row` are
//! what every faster kernel is tested against.
//!
//! - `dequantize_row` reads every type: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//!   Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//! - `quantize_row` writes all but Q2_K and Q3_K, with GGML's reference algorithms.
//! - `mlx`: MLX's affine group-wise 4/8-bit format (scalar dequantize and quantize).

mod bits;
mod dequant;
mod fallback;
mod k_quants;
mod legacy;
mod mlx;
mod quantize;
mod types;

pub use dequant::{can_dequantize, dequantize, dequantize_row};
pub use fallback::fallback_type;
pub use k_quants::{high2_16, nibbles32, q4k_scale_mins, q4k_values, q6k_values};
pub use mlx::{mlx_dequantize_row, mlx_q, mlx_quantize_row, MlxLayout, MLX_BITS, MLX_GROUPS};
pub use quantize::{can_quantize, quantize, quantize_row};
pub use types::{GgmlType, QuantError, QK_K};
