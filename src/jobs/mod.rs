//! Jobs (`ringmaster job ...`): declarative specs for services and batch jobs, run by a
//! framework built into the master. [`spec`] reads and checks spec files; [`engine`] decides,
//! without I/O, which instances to launch, restart or kill; [`records`] is how they are kept
//! in the store the master gives the framework ([`store`]).
//!
//! The jobs framework is a framework: it talks to the master through the SDK and the master
//! starts it, handing it a [`store::JobsStore`]. Nothing here imports the master; the master
//! imports from here (tests/layering.rs checks it).

pub mod cli;
pub mod constraints;
pub mod engine;
pub mod logs;
pub mod plan;
pub mod records;
pub mod runner;
pub mod spec;
pub mod store;
