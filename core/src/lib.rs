//! Ringmaster's core: the pure, deterministic decisions of the cluster manager.
//!
//! No I/O, no clock, no async runtime and no wire types: the master, the dry-run
//! (`ringmaster place`), the simulator and the benchmarks all drive this crate and get the same
//! answers. Time, when a decision needs it, is an argument.
//!
//! - [`resources`]: named scalar bundles in milli-units (`cpus:4;mem:8192`), their text syntax
//!   and checked arithmetic;
//! - [`devices`]: GPUs device by device (SPEC seed 004): the model, task request parsing, the
//!   one GPU-in-node selection, and the packed encoding;
//! - [`placement`]: the cluster in gradient ring buckets, the placers behind one trait, DRF,
//!   priorities and preemption, balance, batch matching, fragmentation, and why a demand does
//!   not fit.

pub mod devices;
pub mod placement;
pub mod resources;

pub use resources::{ResourceError, Resources};
