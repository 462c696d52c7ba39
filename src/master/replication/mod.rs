//! Replication of the master's registry across masters with Raft (docs/architecture.md,
//! "Replication").
//!
//! Why: a single master's registry dies with its disk. With three masters on Raft, any
//! minority may fail: an actor turn's [`RegistryBatch`] becomes one Raft log entry, and its
//! messages leave only once a quorum holds the entry and the local registry applied it, which
//! is what the single master's group commit promises today, made to survive a lost machine.
//!
//! The master will depend on the [`Replicator`] trait only, so another consensus backend could
//! follow; [`raft::RaftReplicator`] is the one built on `openraft` 0.9. The pieces:
//! - [`log_store`]: the Raft log, vote, committed id and purge point in `<work-dir>/raft.redb`;
//! - [`state_machine`]: applies committed entries to the existing `registry.redb` and builds or
//!   installs snapshots (the registry's full contents).
//!
//! - [`seed`]: makes a single master's work dir the first master's of a new group
//!   (`ringmaster cluster init`).
//! - [`transport`]: the Raft network between masters (`RaftRequest`/`RaftResponse` frames on
//!   the protocol port) and the handler serving peers' RPCs.
//!
//! Used by the master in cluster mode (`cluster:` in its config; `super::cluster`).

// openraft's storage traits fix the error type (`StorageError`, over 200 bytes); the helpers
// here return it as is rather than boxing and unboxing it at every trait method.
#![allow(clippy::result_large_err)]

pub(crate) mod codec;
pub(crate) mod log_store;
#[cfg(test)]
pub(crate) mod network;
pub(crate) mod raft;
pub(crate) mod seed;
pub(crate) mod state_machine;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod transport;
#[cfg(test)]
mod transport_tests;

use std::io::Cursor;

use super::registry::RegistryBatch;

/// A master's id in the replication group.
pub(crate) type NodeId = u64;
/// A master's protocol address (`host:port`), how its peers reach it.
pub(crate) type NodeAddr = String;

openraft::declare_raft_types!(
    /// The type configuration of the master's Raft group: an entry's payload is one actor
    /// turn's registry batch; applying it answers nothing (the leader already knows the turn's
    /// outcome), so the response is `()`.
    pub(crate) TypeConfig:
        D = RegistryBatch,
        R = (),
        NodeId = NodeId,
        Node = NodeAddr,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Which part a master plays in the group right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Leader,
    Follower,
    Candidate,
    /// Not a voter, or shut down.
    Other,
}

/// A snapshot of a replicator's view of the group, for status pages and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplicationStatus {
    pub role: Role,
    /// The leader this master knows of, if any.
    pub leader: Option<NodeId>,
    pub term: u64,
    /// The index of the last entry applied to this master's registry. Everything applied is
    /// committed; openraft 0.9 does not publish the commit index itself, so this is the
    /// nearest honest number (it trails the commit index by the entries still being applied).
    pub applied_index: Option<u64>,
}

/// Why a batch was not replicated.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicationError {
    /// This master is not the leader: the batch was not written; the caller should step down
    /// and point its peers at the leader, if one is known.
    #[error("not the leader (leader: {leader:?} at {address:?})")]
    NotLeader {
        leader: Option<NodeId>,
        address: Option<NodeAddr>,
    },
    /// The replicator stopped (shut down, or its storage failed): nothing more can be written.
    #[error("replication stopped: {0}")]
    Stopped(String),
    /// Anything else the backend reports.
    #[error("replication failed: {0}")]
    Other(String),
}

/// A batch on its way to a quorum: resolves as [`Replicator::replicate`] would.
pub(crate) type Commit =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, ReplicationError>> + Send>>;

/// The master's view of replication: the only interface the actor uses.
#[async_trait::async_trait]
pub(crate) trait Replicator: Send + Sync {
    /// Hands one actor turn's batch to the group and returns at once with its [`Commit`].
    /// Batches are appended to the log in the order they are submitted, so their commits
    /// resolve in that order too: the actor can go on deciding while earlier turns are
    /// replicated (pipelining), and release each turn's messages as its commit resolves.
    async fn submit(&self, batch: RegistryBatch) -> Result<Commit, ReplicationError>;

    /// Replicates one actor turn's batch. Returns `Ok` only once a quorum of masters holds the
    /// batch in its log and this master applied it to its registry: the turn's messages may go.
    /// The value is the batch's position in the replicated log (increasing with each batch), so
    /// a caller can tell when another master has applied it too.
    #[cfg(test)]
    async fn replicate(&self, batch: RegistryBatch) -> Result<u64, ReplicationError> {
        self.submit(batch).await?.await
    }

    /// The current role, leader, term and applied index.
    fn status(&self) -> ReplicationStatus;
}
