//! [`Replicator`] on `openraft`: one master's Raft node over its [`LogStore`] and
//! [`StateMachine`].
//!
//! Why a thin wrapper: the master actor should know "replicate this batch" and "who leads",
//! not openraft's request and error types; those are translated here, once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Config, Raft, RaftNetworkFactory, ServerState};

use super::super::ops::model::{MemberView, MembersView};
use super::super::registry::RegistryBatch;
use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::{
    Commit, NodeAddr, NodeId, ReplicationError, ReplicationStatus, Replicator, Role, TypeConfig,
};

/// A running Raft node replicating registry batches.
#[derive(Clone)]
pub(crate) struct RaftReplicator {
    raft: Raft<TypeConfig>,
    /// Snapshots the state machine installed from a leader (its counter, shared).
    installed: Arc<AtomicU64>,
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
        let installed = state_machine.installed_snapshots();
        let raft = Raft::new(id, Arc::new(config), network, log_store, state_machine)
            .await
            .map_err(|e| ReplicationError::Stopped(e.to_string()))?;
        Ok(RaftReplicator { raft, installed })
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

/// How long adding a master waits for it to catch up before giving up (it stays a learner).
pub(crate) const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MembershipError {
    /// The request makes no sense for this group (bad id or address, last voter, …).
    #[error("{0}")]
    Invalid(String),
    /// No such member.
    #[error("{0}")]
    NotMember(String),
    /// Another membership change is still in progress.
    #[error("{0}")]
    Conflict(String),
    /// This master does not lead (any more): ask the leader.
    #[error("this master does not lead its group")]
    NotLeader,
    /// The new master did not catch up in time.
    #[error("{0}")]
    Timeout(String),
    /// Replication stopped or failed.
    #[error("{0}")]
    Failed(String),
}

impl MembershipError {
    fn from_write(error: RaftError<NodeId, ClientWriteError<NodeId, NodeAddr>>) -> Self {
        match error {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => MembershipError::NotLeader,
            RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(e),
            )) => MembershipError::Conflict(format!(
                "another membership change is in progress ({e}); try again once it is done"
            )),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                MembershipError::Invalid(e.to_string())
            }
            RaftError::Fatal(fatal) => {
                MembershipError::Failed(format!("replication stopped: {fatal}"))
            }
        }
    }
}

/// What adding a master did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// It was added and is a voter now.
    Voter,
    /// It was a voter at that address already: nothing changed.
    AlreadyVoter,
}

impl RaftReplicator {
    /// The membership this master knows (on the leader: the group's latest, possibly not yet
    /// committed), with the leader it knows.
    pub(crate) fn members(&self) -> MembersView {
        let watch = self.raft.metrics();
        let metrics = watch.borrow();
        let membership = metrics.membership_config.membership();
        let matched = |id: NodeId| -> Option<u64> {
            if id == metrics.id {
                return metrics.last_log_index;
            }
            let progress = metrics.replication.as_ref()?;
            progress.get(&id).copied().flatten().map(|log| log.index)
        };
        let view = |ids: &mut dyn Iterator<Item = NodeId>| -> Vec<MemberView> {
            ids.map(|id| MemberView {
                id,
                address: membership.get_node(&id).cloned().unwrap_or_default(),
                matched: matched(id),
            })
            .collect()
        };
        let voters = view(&mut membership.voter_ids());
        let learners = view(&mut membership.learner_ids());
        MembersView {
            leader: metrics.current_leader,
            voters,
            learners,
            applied_index: metrics.last_applied.map(|id| id.index),
            snapshot_index: metrics.snapshot.map(|id| id.index),
            purged_index: metrics.purged.map(|id| id.index),
        }
    }

    /// Every master of the membership this master knows (voters and learners): id -> address.
    pub(crate) fn member_addresses(&self) -> BTreeMap<NodeId, NodeAddr> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow();
        metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, address)| (*id, address.clone()))
            .collect()
    }

    /// The voters of the membership this master knows.
    pub(crate) fn voter_ids(&self) -> Vec<NodeId> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow();
        metrics.membership_config.membership().voter_ids().collect()
    }

    /// Log positions for status pages: (snapshot's last index, last purged index).
    pub(crate) fn log_positions(&self) -> (Option<u64>, Option<u64>) {
        let watch = self.raft.metrics();
        let metrics = watch.borrow();
        (
            metrics.snapshot.map(|id| id.index),
            metrics.purged.map(|id| id.index),
        )
    }

    /// Snapshots this master installed from a leader since it started.
    pub(crate) fn snapshots_installed(&self) -> u64 {
        self.installed.load(Ordering::Relaxed)
    }

    /// On the leader: adds master `id` at `address` as a learner, waits (at most `catch_up`)
    /// until it holds the log up to that change, then makes it a voter.
    pub(crate) async fn add_voter(
        &self,
        id: NodeId,
        address: NodeAddr,
        catch_up: Duration,
    ) -> Result<Added, MembershipError> {
        let members = self.members();
        if let Some(voter) = members.voters.iter().find(|m| m.id == id) {
            return if voter.address == address {
                Ok(Added::AlreadyVoter)
            } else {
                Err(MembershipError::Invalid(format!(
                    "master {id} is a voter at {}; remove it first to give it another address",
                    voter.address
                )))
            };
        }
        if let Some(learner) = members.learners.iter().find(|m| m.id == id) {
            if learner.address != address {
                return Err(MembershipError::Invalid(format!(
                    "master {id} is a learner at {}; remove it first to give it another address",
                    learner.address
                )));
            }
        }
        if let Some(other) = members
            .voters
            .iter()
            .chain(&members.learners)
            .find(|m| m.id != id && m.address == address)
        {
            return Err(MembershipError::Invalid(format!(
                "{address} is master {}'s address",
                other.id
            )));
        }
        let added = self
            .raft
            .add_learner(id, address.clone(), false)
            .await
            .map_err(MembershipError::from_write)?;
        let change = added.log_id;
        let caught_up = self
            .raft
            .wait(Some(catch_up))
            .metrics(
                |m| {
                    m.state != ServerState::Leader
                        || m.replication
                            .as_ref()
                            .and_then(|r| r.get(&id))
                            .is_some_and(|matched| *matched >= Some(change))
                },
                "the new master catches up",
            )
            .await;
        if caught_up.is_err() {
            return Err(MembershipError::Timeout(format!(
                "master {id} at {address} did not catch up within {} s; it stays a learner (not a \
                 voter). Check that it runs with cluster.join: true and that this master reaches \
                 it, then add it again (or remove it)",
                catch_up.as_secs()
            )));
        }
        if self.raft.metrics().borrow().state != ServerState::Leader {
            return Err(MembershipError::NotLeader);
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(MembershipError::from_write)?;
        Ok(Added::Voter)
    }

    /// On the leader: removes master `id` (a voter or a learner) from the group. The last
    /// voter is never removed.
    pub(crate) async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        let members = self.members();
        let change = if members.learners.iter().any(|m| m.id == id) {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else if members.voters.iter().any(|m| m.id == id) {
            if members.voters.len() <= 1 {
                return Err(MembershipError::Invalid(format!(
                    "master {id} is the group's only voter; a group needs at least one"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            return Err(MembershipError::NotMember(format!(
                "master {id} is not a member of the group (members: {})",
                members
                    .voters
                    .iter()
                    .chain(&members.learners)
                    .map(|m| m.id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(MembershipError::from_write)?;
        Ok(())
    }
}
