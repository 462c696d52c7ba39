//! The Raft network between masters: openraft's RPCs as `RaftRequest`/`RaftResponse` frames on
//! the ordinary protocol port (docs/architecture.md, "Replication").
//!
//! Client side ([`TcpNetwork`], openraft's `RaftNetworkFactory`): one connection per peer,
//! shared by every openraft client of that peer and opened on first use, over TLS and with the
//! master's credential when configured (`Hello`, then `Authenticate` as role `master` when the
//! peer requires it or a credential is configured). Requests carry an id; responses are matched
//! by it, so a vote is not queued behind a snapshot chunk. A broken connection fails its
//! pending requests as `Unreachable` (openraft backs off) and is reopened by the next request;
//! connecting runs in its own task, so openraft timing out a request does not abort a TLS
//! handshake half-way. Nothing the peer sends can panic this side: a malformed response is an
//! error.
//!
//! Frames stay under `master.max_frame_bytes`: an append-entries request that would not fit is
//! refused with openraft's `PayloadTooLarge` (openraft retries with fewer entries), and a
//! snapshot chunk that would not fit is sent as several smaller chunks (openraft 0.9's chunked
//! `install_snapshot`: consecutive offsets, `done` on the last).
//!
//! Server side ([`RaftHandler`]): decodes a `RaftRequest`, calls the local `Raft` and encodes
//! the answer; `server::task` runs it for connections whose first message is a `RaftRequest`.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, Raft, RaftNetwork, RaftNetworkFactory};
use ringmaster_proto::security::AuthRole;
use ringmaster_proto::transport::{BoxedStream, ClientSecurity};
use ringmaster_proto::{
    Connection, Hello, Message, RaftRequest, RaftResponse, RaftRpc, PROTOCOL_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::codec;
use super::log_store::LogStore;
use super::raft::RaftReplicator;
use super::state_machine::StateMachine;
use super::{NodeAddr, NodeId, ReplicationError, TypeConfig};
use crate::config::ClusterConfig;

/// How long connecting to a peer (TCP, TLS, `Hello`, `Authenticate`) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Room left in a frame for everything but a request's JSON payload (envelope, id, rpc).
const FRAME_OVERHEAD: usize = 1024;

/// Requests queued to one peer's connection and not yet written.
const QUEUED_REQUESTS: usize = 64;

/// How a master reaches its peers' Raft nodes: openraft's network factory over TCP.
#[derive(Clone)]
pub(crate) struct TcpNetwork {
    shared: Arc<Shared>,
}

struct Shared {
    /// This master's id (in timeout errors and the `Hello`).
    me: NodeId,
    security: ClientSecurity,
    /// The frame limit of every master in the group (`master.max_frame_bytes`).
    max_frame_bytes: usize,
    /// One connection per peer, by id; replaced when the peer's address changes.
    peers: Mutex<HashMap<NodeId, Arc<Peer>>>,
    /// Tests cut a master off: every RPC fails as unreachable while set.
    offline: Arc<AtomicBool>,
    /// How this master reaches each peer (its `cluster.peers`), over the address the group's
    /// membership records for it (which is the address the master that formed the group, or
    /// added it, knew it by).
    addresses: HashMap<NodeId, NodeAddr>,
}

impl TcpNetwork {
    /// The network of master `me`: connects with `security` (TLS, credential; an in-process
    /// dialer is ignored: peers are other processes) and keeps frames under `max_frame_bytes`.
    pub(crate) fn new(me: NodeId, security: ClientSecurity, max_frame_bytes: usize) -> Self {
        let security = ClientSecurity {
            dialer: None,
            ..security
        };
        TcpNetwork {
            shared: Arc::new(Shared {
                me,
                security,
                max_frame_bytes,
                peers: Mutex::new(HashMap::new()),
                offline: Arc::new(AtomicBool::new(false)),
                addresses: HashMap::new(),
            }),
        }
    }

    /// Reaches each peer named in `addresses` there rather than at its membership address.
    pub(crate) fn with_addresses(
        mut self,
        addresses: impl IntoIterator<Item = (NodeId, NodeAddr)>,
    ) -> Self {
        let shared = Arc::get_mut(&mut self.shared).expect("a network not yet shared");
        shared.addresses = addresses.into_iter().collect();
        self
    }

    /// Cuts this master's RPCs off (`true`) or restores them, as a partition would.
    #[cfg(test)]
    pub(crate) fn set_offline(&self, offline: bool) {
        self.shared.offline.store(offline, Ordering::Relaxed);
    }

    fn peer(&self, target: NodeId, addr: &NodeAddr) -> Arc<Peer> {
        let mut peers = self.shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get(&target) {
            Some(peer) if peer.addr == *addr => peer.clone(),
            _ => {
                let peer = Arc::new(Peer {
                    me: self.shared.me,
                    target,
                    addr: addr.clone(),
                    security: self.shared.security.clone(),
                    max_frame_bytes: self.shared.max_frame_bytes,
                    next_id: AtomicU64::new(1),
                    link: tokio::sync::Mutex::new(Link::Idle),
                    offline: self.shared.offline.clone(),
                });
                peers.insert(target, peer.clone());
                peer
            }
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> PeerClient {
        let addr = self.shared.addresses.get(&target).unwrap_or(node).clone();
        PeerClient {
            peer: self.peer(target, &addr),
        }
    }
}

/// Room left in a frame for an append-entries request's fields besides its entries.
const ENVELOPE_BYTES: usize = 4096;

/// One openraft client of one peer; every client of a peer shares its connection.
pub(crate) struct PeerClient {
    peer: Arc<Peer>,
}

/// A peer and the connection to it.
struct Peer {
    me: NodeId,
    target: NodeId,
    addr: NodeAddr,
    security: ClientSecurity,
    max_frame_bytes: usize,
    next_id: AtomicU64,
    link: tokio::sync::Mutex<Link>,
    offline: Arc<AtomicBool>,
}

enum Link {
    Idle,
    /// A connection being opened in its own task (so a caller's timeout does not abort it).
    Connecting(JoinHandle<Result<Arc<Session>, String>>),
    Live(Arc<Session>),
}

/// Why an RPC failed before the peer's Raft answered.
enum CallError {
    /// The peer cannot be reached now (no connection, refused, closed, garbled): back off.
    Unreachable(String),
    /// No answer in time.
    Timeout(Duration),
    /// The peer's Raft answered with an error: its text, and the error as JSON.
    Remote { text: String, payload: Vec<u8> },
}

impl CallError {
    /// The openraft error for an RPC whose remote error type is `E`.
    fn into_rpc<E>(
        self,
        peer: &Peer,
        action: RPCTypes,
    ) -> RPCError<NodeId, NodeAddr, RaftError<NodeId, E>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let unreachable = |text: String| {
            RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
                "master {} at {}: {text}",
                peer.target, peer.addr
            ))))
        };
        match self {
            CallError::Unreachable(text) => unreachable(text),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: peer.me,
                target: peer.target,
                timeout,
            }),
            CallError::Remote { text, payload } => {
                match codec::decode::<RaftError<NodeId, E>>(&payload) {
                    Ok(error) => RPCError::RemoteError(RemoteError::new_with_node(
                        peer.target,
                        peer.addr.clone(),
                        error,
                    )),
                    // Not an openraft error (a malformed request, a master not in cluster
                    // mode): nothing openraft can act on but waiting.
                    Err(_) => unreachable(text),
                }
            }
        }
    }
}

impl Peer {
    /// The live connection, opening one if there is none.
    async fn session(&self) -> Result<Arc<Session>, String> {
        let mut link = self.link.lock().await;
        loop {
            match &mut *link {
                Link::Live(session) if session.is_open() => return Ok(session.clone()),
                Link::Live(_) | Link::Idle => {
                    let open = open_session(
                        self.me,
                        self.addr.clone(),
                        self.security.clone(),
                        self.max_frame_bytes,
                    );
                    *link = Link::Connecting(tokio::spawn(async move {
                        match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
                            Ok(opened) => opened,
                            Err(_) => Err(format!("no connection within {CONNECT_TIMEOUT:?}")),
                        }
                    }));
                }
                Link::Connecting(opening) => {
                    // Cancel-safe: if this caller gives up, the handle stays for the next one.
                    let opened = opening.await;
                    return match opened {
                        Ok(Ok(session)) => {
                            *link = Link::Live(session.clone());
                            Ok(session)
                        }
                        Ok(Err(error)) => {
                            *link = Link::Idle;
                            Err(error)
                        }
                        Err(join) => {
                            *link = Link::Idle;
                            Err(format!("connecting failed: {join}"))
                        }
                    };
                }
            }
        }
    }

    /// The largest JSON payload a request frame may carry.
    fn payload_budget(&self) -> usize {
        self.max_frame_bytes.saturating_sub(FRAME_OVERHEAD)
    }

    /// Sends one request and waits for its response, at most `timeout` in all.
    async fn call<Req, Resp>(
        &self,
        rpc: RaftRpc,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let payload = codec::encode(request)
            .map_err(|e| CallError::Unreachable(format!("cannot encode the request: {e}")))?;
        self.call_encoded(rpc, payload, timeout).await
    }

    /// [`Peer::call`] with the request already encoded.
    async fn call_encoded<Resp>(
        &self,
        rpc: RaftRpc,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Resp, CallError>
    where
        Resp: DeserializeOwned,
    {
        if self.offline.load(Ordering::Relaxed) {
            return Err(CallError::Unreachable("cut off (test)".into()));
        }
        let work = async {
            let session = self.session().await.map_err(CallError::Unreachable)?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let response = session
                .request(RaftRequest {
                    id,
                    rpc: rpc as i32,
                    payload,
                })
                .await
                .map_err(CallError::Unreachable)?;
            if !response.error.is_empty() {
                return Err(CallError::Remote {
                    text: response.error,
                    payload: response.payload,
                });
            }
            codec::decode(&response.payload).map_err(|e| {
                CallError::Unreachable(format!("malformed {} response: {e}", rpc.as_str_name()))
            })
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or(Err(CallError::Timeout(timeout)))
    }
}

/// One open connection to a peer: a writer and a reader task, and the requests waiting for
/// their responses. Dropping the last handle closes the connection.
struct Session {
    requests: mpsc::Sender<RaftRequest>,
    pending: Arc<Pending>,
    tasks: [JoinHandle<()>; 2],
}

#[derive(Default)]
struct Pending {
    waiting: Mutex<HashMap<u64, oneshot::Sender<RaftResponse>>>,
    closed: AtomicBool,
    /// Why the connection closed, for the requests it fails.
    reason: Mutex<Option<String>>,
}

impl Pending {
    fn close(&self, reason: String) {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(reason);
        self.closed.store(true, Ordering::Release);
        // Dropping the senders fails every waiting request.
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "connection closed".into())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Removes a request from the waiting list when its caller stops waiting (answered or not).
struct Waiting<'a> {
    pending: &'a Pending,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.pending
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Session {
    fn is_open(&self) -> bool {
        !self.pending.closed.load(Ordering::Acquire)
    }

    async fn request(&self, request: RaftRequest) -> Result<RaftResponse, String> {
        let (tx, rx) = oneshot::channel();
        let id = request.id;
        {
            let mut waiting = self
                .pending
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !self.is_open() {
                return Err(self.pending.reason());
            }
            waiting.insert(id, tx);
        }
        let _waiting = Waiting {
            pending: &self.pending,
            id,
        };
        if self.requests.send(request).await.is_err() {
            return Err(self.pending.reason());
        }
        rx.await.map_err(|_| self.pending.reason())
    }
}

/// Connects to a peer, says `Hello`, authenticates as `master` where needed, and starts the
/// connection's reader and writer.
async fn open_session(
    me: NodeId,
    addr: NodeAddr,
    security: ClientSecurity,
    max_frame_bytes: usize,
) -> Result<Arc<Session>, String> {
    let stream = security
        .connect(&addr, CONNECT_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let mut connection = Connection::with_max_frame(stream, max_frame_bytes);
    handshake(&mut connection, me, &security).await?;
    let (mut reader, mut writer) = connection.split();
    let pending = Arc::new(Pending::default());
    let (requests, mut queued) = mpsc::channel::<RaftRequest>(QUEUED_REQUESTS);
    let writing = {
        let pending = pending.clone();
        tokio::spawn(async move {
            while let Some(request) = queued.recv().await {
                if let Err(e) = writer.send(Message::RaftRequest(request)).await {
                    pending.close(format!("cannot send: {e}"));
                    return;
                }
            }
        })
    };
    let reading = {
        let pending = pending.clone();
        tokio::spawn(async move {
            let reason = loop {
                match reader.recv().await {
                    Ok(Some(Message::RaftResponse(response))) => {
                        let waiter = pending
                            .waiting
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&response.id);
                        // A response nobody waits for any more (timed out) is dropped.
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(response);
                        }
                    }
                    Ok(Some(Message::Ping(_) | Message::Pong(_))) => {}
                    Ok(Some(Message::Error(error))) => {
                        break format!("the peer closed the connection: {}", error.message)
                    }
                    Ok(Some(other)) => break format!("unexpected {} from the peer", other.kind()),
                    Ok(None) => break "the peer closed the connection".to_string(),
                    Err(e) => break format!("connection failed: {e}"),
                }
            };
            pending.close(reason);
        })
    };
    Ok(Arc::new(Session {
        requests,
        pending,
        tasks: [writing, reading],
    }))
}

/// `Hello`, then `Authenticate` as `master` when the peer requires it or this master has a
/// credential.
async fn handshake(
    connection: &mut Connection<BoxedStream>,
    me: NodeId,
    security: &ClientSecurity,
) -> Result<(), String> {
    connection
        .send(Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: format!("ringmaster-master {me} {}", env!("CARGO_PKG_VERSION")),
        }))
        .await
        .map_err(|e| format!("cannot send Hello: {e}"))?;
    let ack = match connection.recv().await {
        Ok(Some(Message::HelloAck(ack))) => ack,
        Ok(Some(Message::Error(error))) => return Err(format!("refused: {}", error.message)),
        Ok(Some(other)) => return Err(format!("expected HelloAck, got {}", other.kind())),
        Ok(None) => return Err("closed during the handshake".into()),
        Err(e) => return Err(format!("handshake failed: {e}")),
    };
    let Some(answer) = security.authenticate(&ack, AuthRole::Master)? else {
        return Ok(());
    };
    connection
        .send(Message::Authenticate(answer))
        .await
        .map_err(|e| format!("cannot send Authenticate: {e}"))?;
    match connection.recv().await {
        Ok(Some(Message::Authenticated(_))) => Ok(()),
        Ok(Some(Message::Error(error))) => {
            Err(format!("authentication refused: {}", error.message))
        }
        Ok(Some(other)) => Err(format!("expected Authenticated, got {}", other.kind())),
        Ok(None) => Err("closed during authentication".into()),
        Err(e) => Err(format!("authentication failed: {e}")),
    }
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, NodeAddr, RaftError<NodeId, E>>>;

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let peer = &self.peer;
        let entries = rpc.entries.len() as u64;
        // Entries are sized one by one, stopping at the first that does not fit: a request of
        // many large entries is cut to what fits in one step (openraft retries at once with
        // that many), not halved and encoded again and again on the runtime's threads.
        if entries > 1 {
            let budget = peer.payload_budget().saturating_sub(ENVELOPE_BYTES);
            let mut total = 0usize;
            let mut fit = 0u64;
            for entry in &rpc.entries {
                total += codec::encode(entry).map_or(usize::MAX / 2, |b| b.len());
                if total > budget {
                    break;
                }
                fit += 1;
            }
            if fit < entries {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(fit.max(1)),
                ));
            }
        }
        // Sized before sending: the peer would close the connection on an oversized frame.
        let payload = codec::encode(&rpc).map_err(|e| {
            RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
                "cannot encode the request: {e}"
            ))))
        })?;
        let size = payload.len();
        if size > peer.payload_budget() {
            if entries > 1 {
                // openraft retries at once with at most this many entries.
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(entries / 2),
                ));
            }
            return Err(RPCError::Network(NetworkError::new(&AnyError::error(
                format!(
                    "one log entry of {size} bytes does not fit a {}-byte frame \
                 (master.max_frame_bytes)",
                    peer.max_frame_bytes
                ),
            ))));
        }
        peer.call_encoded(RaftRpc::RaftAppendEntries, payload, option.hard_ttl())
            .await
            .map_err(|e| e.into_rpc(peer, RPCTypes::AppendEntries))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let peer = &self.peer;
        // MessagePack writes a byte of a plain byte list as at most 2 bytes; the rest is the
        // metadata.
        let meta = codec::encode(&InstallSnapshotRequest::<TypeConfig> {
            vote: rpc.vote,
            meta: rpc.meta.clone(),
            offset: rpc.offset,
            data: Vec::new(),
            done: rpc.done,
        })
        .map(|v| v.len())
        .unwrap_or(0);
        let piece = (peer.payload_budget().saturating_sub(meta) / 2).max(1);
        if rpc.data.len() <= piece {
            return peer
                .call(RaftRpc::RaftInstallSnapshot, &rpc, option.hard_ttl())
                .await
                .map_err(|e| e.into_rpc(peer, RPCTypes::InstallSnapshot));
        }
        // Too large for one frame: consecutive smaller chunks, `done` only on the last.
        let deadline = tokio::time::Instant::now() + option.hard_ttl();
        let pieces: Vec<&[u8]> = rpc.data.chunks(piece).collect();
        let count = pieces.len();
        let mut offset = rpc.offset;
        let mut last = None;
        for (i, data) in pieces.into_iter().enumerate() {
            let chunk = InstallSnapshotRequest::<TypeConfig> {
                vote: rpc.vote,
                meta: rpc.meta.clone(),
                offset,
                data: data.to_vec(),
                done: rpc.done && i + 1 == count,
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let response: InstallSnapshotResponse<NodeId> = peer
                .call(RaftRpc::RaftInstallSnapshot, &chunk, left)
                .await
                .map_err(|e| e.into_rpc(peer, RPCTypes::InstallSnapshot))?;
            if response.vote > rpc.vote {
                // A newer leader: the rest is pointless.
                return Ok(response);
            }
            offset += data.len() as u64;
            last = Some(response);
        }
        Ok(last.expect("at least two pieces"))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let peer = &self.peer;
        peer.call(RaftRpc::RaftVote, &rpc, option.hard_ttl())
            .await
            .map_err(|e| e.into_rpc(peer, RPCTypes::Vote))
    }
}

/// Starts this master's Raft node (`cluster.id`) over its storage, reaching its peers through
/// `network`, and forms the group unless `cluster.join` is set (then it waits for the leader
/// to add it and replicate to it): a pristine node proposes `cluster.peers` as the membership
/// (the lowest id at once, the others if the group has not formed two election timeouts
/// later; every master doing so with the same peers is safe, openraft says; a node that
/// already has a log or a vote keeps the membership it has, so editing `peers` later changes
/// nothing).
/// Returns the replicator (for the actor) and the handler to pass to
/// `server::Listener::with_raft`. `raft_config` is usually
/// `cluster.raft_config(config.master.max_frame_bytes)`.
pub(crate) async fn start_cluster_node(
    cluster: &ClusterConfig,
    raft_config: openraft::Config,
    network: TcpNetwork,
    log_store: LogStore,
    state_machine: StateMachine,
) -> Result<(RaftReplicator, Arc<RaftHandler>), ReplicationError> {
    let replicator =
        RaftReplicator::start(cluster.id, raft_config, network, log_store, state_machine).await?;
    if cluster.join {
        // Joining a group that exists: the leader adds this master and replicates to it (from
        // a snapshot when it compacted its log). Proposing `peers` here would found a second
        // group at index 0.
        let handler = RaftHandler::new(&replicator);
        return Ok((replicator, handler));
    }
    // The master with the lowest id forms the group at once; the others give it two election
    // timeouts first. When every master proposes at the same moment, several stand for the
    // first term and a late one soon deposes the first leader (a needless leader change right
    // after start); once the first master's entries reach them, their own proposal is refused
    // as the group already formed (NotAllowed), which is what we want.
    let first = cluster.peers.keys().next().copied() == Some(cluster.id);
    let delay = if first {
        std::time::Duration::ZERO
    } else {
        cluster.election_timeout * 2
    };
    let (raft, peers) = (replicator.raft().clone(), cluster.peers.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        match raft.initialize(peers).await {
            Ok(()) => {}
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {}
            Err(e) => tracing::error!(error = %e, "cannot form the replication group"),
        }
    });
    let handler = RaftHandler::new(&replicator);
    Ok((replicator, handler))
}

/// Serves peers' Raft RPCs on this master's Raft node. Build one from the master's
/// [`RaftReplicator`] and hand it to the listener (`server::Listener::with_raft`).
pub(crate) struct RaftHandler {
    raft: Raft<TypeConfig>,
}

impl RaftHandler {
    pub(crate) fn new(replicator: &RaftReplicator) -> Arc<RaftHandler> {
        Arc::new(RaftHandler {
            raft: replicator.raft().clone(),
        })
    }

    /// Answers one request: the openraft response as JSON, or `error` (with the openraft error
    /// as JSON in `payload`, when it is one, so the sender can act on it).
    pub(crate) async fn handle(&self, request: RaftRequest) -> RaftResponse {
        let id = request.id;
        let payload = request.payload;
        let raft = &self.raft;
        match RaftRpc::try_from(request.rpc) {
            Ok(RaftRpc::RaftAppendEntries) => {
                answer(id, &payload, |rpc| raft.append_entries(rpc)).await
            }
            Ok(RaftRpc::RaftVote) => answer(id, &payload, |rpc| raft.vote(rpc)).await,
            Ok(RaftRpc::RaftInstallSnapshot) => {
                answer(id, &payload, |rpc| raft.install_snapshot(rpc)).await
            }
            Ok(RaftRpc::Unspecified) | Err(_) => RaftResponse {
                id,
                payload: Vec::new(),
                error: format!("unknown Raft RPC {}", request.rpc),
            },
        }
    }
}

/// Decodes the request, calls the node and encodes its answer.
async fn answer<Req, Resp, E, F, Fut>(id: u64, payload: &[u8], call: F) -> RaftResponse
where
    Req: DeserializeOwned,
    Resp: Serialize,
    E: Serialize + Display,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, E>>,
{
    let failed = |error: String, payload: Vec<u8>| RaftResponse { id, payload, error };
    let request = match codec::decode(payload) {
        Ok(request) => request,
        Err(e) => return failed(format!("malformed request: {e}"), Vec::new()),
    };
    match call(request).await {
        Ok(response) => match codec::encode(&response) {
            Ok(payload) => RaftResponse {
                id,
                payload,
                error: String::new(),
            },
            Err(e) => failed(format!("cannot encode the response: {e}"), Vec::new()),
        },
        Err(error) => failed(error.to_string(), codec::encode(&error).unwrap_or_default()),
    }
}
