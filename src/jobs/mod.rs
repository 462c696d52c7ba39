//! Jobs (`ringmaster job ...`): declarative specs for services and batch jobs, run by a
//! framework built into the master. [`spec`] reads and checks spec files; [`engine`] decides,
//! without I/O, which instances to launch, restart or kill; [`records`] is how they are kept
//! in the master's registry.

pub mod cli;
pub mod constraints;
pub mod engine;
pub mod logs;
pub mod records;
pub mod runner;
pub mod spec;
