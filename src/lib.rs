//! Ringmaster master crate: the imperative shell around the pure core (`ringmaster-core`):
//! configuration, the master, local mode, the dry-run, the trace-driven simulator and the
//! `ringmaster` binary.
//!
//! [`config`] reads the operator's YAML with errors that name file, line and key; [`master`]
//! runs the offer cycle over the wire, deciding with `ringmaster_core::placement`; [`local`]
//! runs a master and agents in one process; [`dry_run`] runs the core's allocation over a
//! scenario file for `ringmaster place` (with [`dry_run_batch`] for a scenario's `batch:`
//! section); [`status`] renders the master's `/state` for `ringmaster status` ([`leader_http`]:
//! the HTTP clients find the leader among several masters); [`sim`] replays
//! real traces through the same core for `ringmaster sim`; [`security`] reads the TLS and
//! authentication settings, and [`certs`] writes development certificates for `ringmaster certs`.
//!
//! Dev-only code (the protocol fuzzer, `ringmaster-stress`, `ringmaster-loadgen`) lives in the
//! unpublished `ringmaster-tools` crate (`tools/`).

pub mod certs;
pub mod cluster_cli;
pub mod config;
pub mod dry_run;
pub mod dry_run_batch;
pub mod jobs;
pub mod leader_http;
pub mod local;
pub mod log_limit;
pub mod master;
pub mod security;
pub mod sim;
pub mod status;
/// The located-YAML errors live in `ringmaster_proto::yaml` (shared with the agent's config
/// file); `crate::yaml` keeps naming them here.
use ringmaster_proto::yaml;
/// The YAML nesting bound every parsed text passes first (`ringmaster_proto::yaml_depth`).
use ringmaster_proto::yaml_depth;
