//! Ringmaster master crate.
