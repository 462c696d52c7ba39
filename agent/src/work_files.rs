//! The files the agent keeps at the top of its work dir, between runs.

/// The file in the work dir that keeps the agent id between runs.
pub const AGENT_ID_FILE: &str = "agent_id";
/// The file in the work dir that keeps the newest leader term seen (fencing, docs/protocol.md).
pub const LEADER_TERM_FILE: &str = "leader_term";
