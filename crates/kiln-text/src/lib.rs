//! kiln-text
