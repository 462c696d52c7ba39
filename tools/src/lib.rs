//! Ringmaster's dev-only tools (not published): [`fuzz`], the seeded generator of bad protocol
//! input behind the protocol fuzz tests and `ringmaster-stress fuzz`, and the binaries
//! `ringmaster-stress` (bad input, load and faults against a child `ringmaster serve`) and
//! `ringmaster-loadgen` (raw offer-cycle throughput with simulated agents and frameworks).

pub mod fuzz;
