//! The keys the placement books give agents and frameworks.

/// An agent's slab key: compact, stable while the agent is present, reused after removal.
pub type AgentKey = usize;
/// A framework's key, chosen by the caller.
pub type FrameworkKey = usize;
