//! [`Replicator`] on `openraft`: one master's Raft node over its [`LogStore`] and
//! [`StateMachine`].
//!
//! Why a thin wrapper: the master actor should know "replicate this batch" and "who leads",
//! not openraft's request and error types; those are translated here, once.

use std::sync::Arc;

use openraft::error::ClientWriteError;
use openraft::{Config, Raft, RaftNetworkFactory, ServerState};

use super::super::registry::RegistryBatch;
use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::{Commit, NodeId, ReplicationError, ReplicationStatus, Replicator, Role, TypeConfig};

/// A running Raft node replicating registry batches.
#[derive(Clone)]
pub(crate) struct RaftReplicator {
    raft: Raft<TypeConfig>,
}

impl RaftReplicator {
    /// Starts the node `id` over its storage; `network` reaches the other masters.
    pub(crate) async fn start<N>(
        id: NodeId,
        config: Config,
        network: N,
        log_store: LogStore,
        state_machine: StateMachine,
    ) -> Result<RaftReplicator, ReplicationError>
    where
        N: RaftNetworkFactory<TypeConfig>,
    {
        let config = config
            .validate()
            .map_err(|e| ReplicationError::Other(format!("bad raft config: {e}")))?;
        let raft = Raft::new(id, Arc::new(config), network, log_store, state_machine)
            .await
            .map_err(|e| ReplicationError::Stopped(e.to_string()))?;
        Ok(RaftReplicator { raft })
    }

    /// The openraft handle (membership changes, RPC entry points, metrics).
    pub(crate) fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }
}

#[async_trait::async_trait]
impl Replicator for RaftReplicator {
    async fn submit(&self, batch: RegistryBatch) -> Result<Commit, ReplicationError> {
        // The request is queued to the Raft core before this returns, so submission order is
        // log order. Its answer comes once the entry is committed and applied by this node's
        // state machine, i.e. in this master's registry.
        let answer = self
            .raft
            .client_write_ff(batch)
            .await
            .map_err(|fatal| ReplicationError::Stopped(fatal.to_string()))?;
        Ok(Box::pin(async move {
            match answer.await {
                Ok(Ok(written)) => Ok(written.log_id.index),
                Ok(Err(ClientWriteError::ForwardToLeader(forward))) => {
                    Err(ReplicationError::NotLeader {
                        leader: forward.leader_id,
                        address: forward.leader_node,
                    })
                }
                Ok(Err(other)) => Err(ReplicationError::Other(other.to_string())),
                Err(_) => Err(ReplicationError::Stopped(
                    "the Raft core dropped the request".into(),
                )),
            }
        }))
    }

    fn status(&self) -> ReplicationStatus {
        let watch = self.raft.metrics();
        let metrics = watch.borrow();
        let role = match metrics.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner | ServerState::Shutdown => Role::Other,
        };
        ReplicationStatus {
            role,
            leader: metrics.current_leader,
            term: metrics.current_term,
            applied_index: metrics.last_applied.map(|id| id.index),
        }
    }
}
