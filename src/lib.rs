//! Ringmaster master crate: the pure placement library, its configuration, and the dry-run.
//!
//! [`placement`] decides (no I/O); [`config`] reads the operator's YAML with errors that name
//! file, line and key; [`dry_run`] runs placement over a scenario file for `ringmaster place`.

pub mod config;
pub mod dry_run;
pub mod placement;
