//! kiln-formats
