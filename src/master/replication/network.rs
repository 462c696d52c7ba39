//! An in-process Raft network for tests: every node's RPCs are calls on the target's
//! `Raft` handle (which itself talks to its core over channels), looked up in a shared
//! router. Removing a node from the router makes it unreachable, as a dead machine would be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, Raft, RaftNetwork, RaftNetworkFactory};

use super::{NodeAddr, NodeId, TypeConfig};

/// The nodes reachable right now, by id.
#[derive(Clone, Default)]
pub(super) struct Router {
    nodes: Arc<Mutex<HashMap<NodeId, Raft<TypeConfig>>>>,
}

impl Router {
    pub(super) fn add(&self, id: NodeId, raft: Raft<TypeConfig>) {
        self.nodes.lock().unwrap().insert(id, raft);
    }

    /// Takes the node off the network: RPCs to it fail from now on.
    pub(super) fn remove(&self, id: NodeId) {
        self.nodes.lock().unwrap().remove(&id);
    }

    fn get<E: std::error::Error>(
        &self,
        target: NodeId,
    ) -> Result<Raft<TypeConfig>, RPCError<NodeId, NodeAddr, E>> {
        self.nodes
            .lock()
            .unwrap()
            .get(&target)
            .cloned()
            .ok_or_else(|| {
                // Unreachable, not a plain network error: the sender backs off instead of
                // retrying at once, as it would for a dead machine.
                RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
                    "node {target} is not on the network"
                ))))
            })
    }
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &NodeAddr) -> Link {
        Link {
            router: self.clone(),
            target,
        }
    }
}

/// One node's connection to one target.
pub(super) struct Link {
    router: Router,
    target: NodeId,
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddr, RaftError<NodeId>>> {
        let raft = self.router.get(self.target)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeAddr, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let raft = self.router.get(self.target)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddr, RaftError<NodeId>>> {
        let raft = self.router.get(self.target)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}
