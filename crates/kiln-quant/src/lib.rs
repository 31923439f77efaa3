//! kiln-quant
