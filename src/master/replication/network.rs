//! An in-process Raft network for tests: every node's RPCs are calls on the target's
//! `Raft` handle (which itself talks to its core over channels), looked up in a shared
//! router. Removing a node from the router cuts it off both ways, as a dead or partitioned
//! machine would be: nothing reaches it and nothing it sends arrives.

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
pub(crate) struct Router {
    nodes: Arc<Mutex<HashMap<NodeId, Raft<TypeConfig>>>>,
}

impl Router {
    pub(crate) fn add(&self, id: NodeId, raft: Raft<TypeConfig>) {
        self.nodes.lock().unwrap().insert(id, raft);
    }

    /// Takes the node off the network: RPCs to it fail from now on.
    pub(crate) fn remove(&self, id: NodeId) {
        self.nodes.lock().unwrap().remove(&id);
    }

    /// The network as node `me` uses it.
    pub(crate) fn for_node(&self, me: NodeId) -> NodeNetwork {
        NodeNetwork {
            router: self.clone(),
            me,
        }
    }

    fn get<E: std::error::Error>(
        &self,
        from: NodeId,
        target: NodeId,
    ) -> Result<Raft<TypeConfig>, RPCError<NodeId, NodeAddr, E>> {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .get(&target)
            .filter(|_| nodes.contains_key(&from))
            .cloned()
            .ok_or_else(|| {
                // Unreachable, not a plain network error: the sender backs off instead of
                // retrying at once, as it would for a dead machine.
                RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
                    "node {from} cannot reach node {target}"
                ))))
            })
    }
}

/// One node's view of the network: its links start from it.
pub(crate) struct NodeNetwork {
    router: Router,
    me: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for NodeNetwork {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &NodeAddr) -> Link {
        Link {
            router: self.router.clone(),
            from: self.me,
            target,
        }
    }
}

/// One node's connection to one target.
pub(crate) struct Link {
    router: Router,
    from: NodeId,
    target: NodeId,
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddr, RaftError<NodeId>>> {
        let raft = self.router.get(self.from, self.target)?;
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
        let raft = self.router.get(self.from, self.target)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddr, RaftError<NodeId>>> {
        let raft = self.router.get(self.from, self.target)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}
