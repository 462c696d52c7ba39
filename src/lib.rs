//! Ringmaster master crate: the pure placement library, its configuration, the master, local
//! mode, the dry-run, and the trace-driven simulator.
//!
//! [`placement`] decides (no I/O); [`config`] reads the operator's YAML with errors that name
//! file, line and key; [`master`] runs the offer cycle over the wire; [`local`] runs a master
//! and agents in one process; [`dry_run`] runs placement over a scenario file for
//! `ringmaster place`; [`sim`] replays real traces through the same placement code for
//! `ringmaster sim`.

pub mod config;
pub mod dry_run;
pub mod local;
pub mod master;
pub mod placement;
pub mod sim;
