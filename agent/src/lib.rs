//! Agent daemon.
