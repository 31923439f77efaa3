//! kiln-backend
