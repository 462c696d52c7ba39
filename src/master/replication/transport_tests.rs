//! The TCP Raft transport between real master listeners: three masters over TLS with
//! authentication elect a leader, replicate, and survive the leader; a lagging follower
//! catches up from a snapshot larger than a frame; a master not in cluster mode, an
//! unauthenticated peer and garbled bytes are refused without a panic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::raft::VoteRequest;
use openraft::{RaftNetwork, RaftNetworkFactory, Vote};
use ringmaster_proto::security::{AuthRole, Credential};
use ringmaster_proto::transport::{ClientSecurity, TlsClient, TlsServerFiles};
use ringmaster_proto::{Connection, ErrorCode, Hello, Message, RaftRequest, RaftRpc};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::codec;
use super::raft::RaftReplicator;
use super::tests::{
    applied, batch_adding, elected_leader, framework_ids, open_storage, test_config, Node, PATIENCE,
};
use super::transport::{start_cluster_node, RaftHandler, TcpNetwork};
use super::{NodeId, Replicator};
use crate::config::{ClusterConfig, Config};
use crate::master::events::Event;
use crate::master::metrics::Metrics;
use crate::master::server::Listener;
use crate::security::{AllowedUsers, AuthConfig, PrincipalGrant};

const SECRET: &[u8] = b"masters-secret";

/// TLS material for 127.0.0.1, written once per test into `dir`.
struct Tls {
    acceptor: TlsAcceptor,
    client: TlsClient,
}

fn tls(dir: &std::path::Path) -> Tls {
    crate::certs::write_dev_certs(dir, &[], &[], false).expect("dev certificates");
    let server = TlsServerFiles {
        cert: dir.join("master.pem"),
        key: dir.join("master.key"),
        client_ca: None,
    };
    Tls {
        acceptor: server.acceptor().expect("acceptor"),
        client: TlsClient::load(&dir.join("ca.pem"), None).expect("client"),
    }
}

/// A master configuration requiring authentication, with a `master` principal `peers` and a
/// framework principal `spark`.
fn config(max_frame_bytes: usize) -> Config {
    let mut config = Config::default();
    config.master.max_frame_bytes = max_frame_bytes;
    let grant = |role| {
        PrincipalGrant::new(
            SECRET.to_vec(),
            [role].into_iter().collect(),
            AllowedUsers::Any,
        )
    };
    config.auth = AuthConfig {
        required: true,
        principals: [
            ("peers".to_string(), grant(AuthRole::Master)),
            ("spark".to_string(), grant(AuthRole::Framework)),
        ]
        .into_iter()
        .collect(),
    };
    config
}

/// A master's listener serving Raft RPCs, and how to stop it.
struct Served {
    address: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The actor's end of the event channel: Raft connections never send on it.
    events: mpsc::Receiver<Event>,
}

fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    config: Arc<Config>,
    raft: Option<Arc<RaftHandler>>,
) -> Served {
    let address = listener.local_addr().unwrap().to_string();
    let (events_tx, events) = mpsc::channel(16);
    let (stop, shutdown) = watch::channel(false);
    let listener = Listener::new(
        listener,
        tls,
        events_tx,
        config,
        Arc::new(Metrics::new()),
        shutdown,
    )
    .with_raft(raft);
    Served {
        address,
        stop,
        task: tokio::spawn(listener.run()),
        events,
    }
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the listener drains")
            .unwrap();
    }
}

struct Cluster {
    nodes: BTreeMap<NodeId, Node>,
    networks: BTreeMap<NodeId, TcpNetwork>,
    served: BTreeMap<NodeId, Served>,
    _tls_dir: tempfile::TempDir,
}

/// Three masters on real listeners (TLS, authentication required), one Raft group.
async fn start_cluster(max_frame_bytes: usize, raft: openraft::Config) -> Cluster {
    let tls_dir = tempfile::tempdir().unwrap();
    let tls = tls(tls_dir.path());
    let config = Arc::new(config(max_frame_bytes));
    let security = ClientSecurity {
        tls: Some(tls.client.clone()),
        credential: Some(Credential::new("peers", SECRET.to_vec()).unwrap()),
        dialer: None,
    };
    let mut sockets = BTreeMap::new();
    for id in 1..=3 {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        sockets.insert(id, socket);
    }
    let members: BTreeMap<NodeId, String> = sockets
        .iter()
        .map(|(id, s)| (*id, s.local_addr().unwrap().to_string()))
        .collect();
    let cluster = ClusterConfig {
        id: 0,
        peers: members,
        election_timeout: Duration::from_secs(1),
        ca: None,
        join: false,
        snapshot_threshold: crate::config::DEFAULT_SNAPSHOT_THRESHOLD,
    };
    let (mut nodes, mut served, mut networks) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (id, socket) in sockets {
        let dir = tempfile::tempdir().unwrap();
        let (log, sm) = open_storage(dir.path());
        let registry = sm.registry().clone();
        let network = TcpNetwork::new(id, security.clone(), max_frame_bytes);
        networks.insert(id, network.clone());
        // Every master forms the group with the same peers, as a real start does.
        let this = ClusterConfig {
            id,
            ..cluster.clone()
        };
        let (replicator, handler) = start_cluster_node(&this, raft.clone(), network, log, sm)
            .await
            .unwrap();
        let acceptor = Some(tls.acceptor.clone());
        served.insert(id, serve(socket, acceptor, config.clone(), Some(handler)));
        nodes.insert(
            id,
            Node {
                replicator,
                registry,
                _dir: dir,
            },
        );
    }
    Cluster {
        nodes,
        networks,
        served,
        _tls_dir: tls_dir,
    }
}

impl Cluster {
    async fn stop(mut self) {
        for node in self.nodes.values() {
            node.replicator.raft().shutdown().await.unwrap();
        }
        for served in std::mem::take(&mut self.served).into_values() {
            served.stop().await;
        }
    }
}

/// Waits until a leader (other than `not`) is elected and every master follows it in its
/// term: every master formed the group at once, so a late candidate may still be campaigning
/// when the first leader is seen.
async fn settled_leader(nodes: &BTreeMap<NodeId, Node>, not: Option<NodeId>) -> NodeId {
    loop {
        let leader = elected_leader(nodes, not).await;
        let term = nodes[&leader].replicator.status().term;
        let mut all = true;
        for node in nodes.values() {
            let seen = node
                .replicator
                .raft()
                .wait(Some(PATIENCE))
                .metrics(
                    |m| m.current_term > term || m.current_leader == Some(leader),
                    "the leader is followed",
                )
                .await
                .expect("no leader followed in time");
            all &= seen.current_term == term;
        }
        if all {
            return leader;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_masters_over_tls_replicate_and_survive_the_leader() {
    let mut cluster = start_cluster(4 * 1024 * 1024, test_config()).await;
    let leader = settled_leader(&cluster.nodes, None).await;
    let index = cluster.nodes[&leader]
        .replicator
        .replicate(batch_adding("f1"))
        .await
        .unwrap();
    for node in cluster.nodes.values() {
        applied(node, index).await;
        assert_eq!(framework_ids(node), vec!["f1"]);
        assert_eq!(node.registry.load().unwrap().jobs.len(), 1);
    }

    // The leader's process dies: its Raft node and its listener stop.
    let dead = cluster.nodes.remove(&leader).unwrap();
    dead.replicator.raft().shutdown().await.unwrap();
    cluster.served.remove(&leader).unwrap().stop().await;
    let new_leader = settled_leader(&cluster.nodes, Some(leader)).await;
    assert_ne!(new_leader, leader);
    let index = cluster.nodes[&new_leader]
        .replicator
        .replicate(batch_adding("f2"))
        .await
        .unwrap();
    for node in cluster.nodes.values() {
        applied(node, index).await;
        assert_eq!(framework_ids(node), vec!["f1", "f2"]);
    }
    // Raft connections never reached the actors.
    for served in cluster.served.values_mut() {
        assert!(served.events.try_recv().is_err());
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_larger_than_a_frame_arrives_in_smaller_chunks() {
    // 64 KiB frames; openraft itself would send the whole snapshot as one chunk.
    let max_frame = 64 * 1024;
    let raft = openraft::Config {
        snapshot_max_chunk_size: 16 * 1024 * 1024,
        ..test_config()
    };
    let mut cluster = start_cluster(max_frame, raft).await;
    let leader = settled_leader(&cluster.nodes, None).await;
    let lagging = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    // Cut the follower off both ways: its listener stops and its own RPCs fail (its node
    // keeps running).
    let address = cluster.served[&lagging].address.clone();
    cluster.served.remove(&lagging).unwrap().stop().await;
    cluster.networks[&lagging].set_offline(true);

    let mut index = 0;
    for batch in 0..25 {
        let mut many = batch_adding(&format!("f{batch:02}-0"));
        for n in 1..40 {
            let id = format!("f{batch:02}-{n}");
            many.frameworks
                .push((id.clone(), Some(super::tests::framework(&id))));
        }
        index = cluster.nodes[&leader]
            .replicator
            .replicate(many)
            .await
            .unwrap();
    }
    // Both masters that have the entries snapshot and purge them: whichever leads when the
    // follower is back (its campaigns while cut off may force an election) must send it the
    // snapshot.
    for (id, node) in &cluster.nodes {
        if *id == lagging {
            continue;
        }
        applied(node, index).await;
        let raft = node.replicator.raft();
        raft.trigger().snapshot().await.unwrap();
        raft.wait(Some(PATIENCE))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= index),
                "a snapshot is built",
            )
            .await
            .unwrap();
        let snapshot = raft.get_snapshot().await.unwrap().expect("a snapshot");
        // As one chunk, its data alone (encoded) would not fit a frame.
        let size = codec::encode(snapshot.snapshot.get_ref()).unwrap().len();
        assert!(
            size > 2 * max_frame,
            "the snapshot ({size} bytes encoded) should not fit one frame"
        );
        raft.trigger().purge_log(index).await.unwrap();
        raft.wait(Some(PATIENCE))
            .metrics(
                |m| m.purged.is_some_and(|p| p.index >= index),
                "the log is purged",
            )
            .await
            .unwrap();
    }

    // The follower's listener comes back on its address.
    let socket = TcpListener::bind(address.as_str()).await.unwrap();
    let handler = RaftHandler::new(&cluster.nodes[&lagging].replicator);
    let files = TlsServerFiles {
        cert: cluster._tls_dir.path().join("master.pem"),
        key: cluster._tls_dir.path().join("master.key"),
        client_ca: None,
    };
    cluster.served.insert(
        lagging,
        serve(
            socket,
            Some(files.acceptor().unwrap()),
            Arc::new(config(max_frame)),
            Some(handler),
        ),
    );

    cluster.networks[&lagging].set_offline(false);
    let follower = &cluster.nodes[&lagging];
    follower
        .replicator
        .raft()
        .wait(Some(PATIENCE))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= index),
            "the follower installed the snapshot",
        )
        .await
        .unwrap();
    applied(follower, index).await;
    assert_eq!(framework_ids(follower).len(), 25 * 40);
    cluster.stop().await;
}

/// Opens a plain connection to `addr` and says Hello; returns the connection and whether
/// authentication is required.
async fn hello(addr: &str) -> (Connection<tokio::net::TcpStream>, bool) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut connection = Connection::new(stream);
    connection
        .send(Message::Hello(Hello {
            protocol_version: ringmaster_proto::PROTOCOL_VERSION,
            client: "test".into(),
        }))
        .await
        .unwrap();
    match connection.recv().await.unwrap() {
        Some(Message::HelloAck(ack)) => (connection, ack.auth_required),
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

fn raft_request(id: u64, payload: &[u8]) -> Message {
    Message::RaftRequest(RaftRequest {
        id,
        rpc: RaftRpc::RaftVote as i32,
        payload: payload.to_vec(),
    })
}

async fn expect_error(connection: &mut Connection<tokio::net::TcpStream>, code: ErrorCode) {
    match tokio::time::timeout(PATIENCE, connection.recv())
        .await
        .unwrap()
    {
        Ok(Some(Message::Error(error))) => assert_eq!(error.code(), code, "{error:?}"),
        other => panic!("expected an Error {code:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_master_not_in_cluster_mode_refuses_raft_requests() {
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    let served = serve(socket, None, Arc::new(Config::default()), None);
    let (mut connection, auth_required) = hello(&addr).await;
    assert!(!auth_required);
    connection.send(raft_request(1, b"{}")).await.unwrap();
    expect_error(&mut connection, ErrorCode::UnexpectedMessage).await;
    served.stop().await;
}

#[tokio::test]
async fn raft_requests_need_a_master_principal_and_bad_bytes_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path());
    let network = TcpNetwork::new(1, ClientSecurity::default(), 1 << 20);
    let replicator = RaftReplicator::start(1, test_config(), network, log, sm)
        .await
        .unwrap();
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    let served = serve(
        socket,
        None,
        Arc::new(config(1 << 20)),
        Some(RaftHandler::new(&replicator)),
    );

    // Anonymous: refused.
    let (mut anonymous, auth_required) = hello(&addr).await;
    assert!(auth_required);
    anonymous.send(raft_request(1, b"{}")).await.unwrap();
    expect_error(&mut anonymous, ErrorCode::AuthenticationRequired).await;

    // Authenticated as a framework: not authorized for Raft.
    let connect_as = |principal: &'static str, role: AuthRole| {
        let addr = addr.clone();
        async move {
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let mut connection = Connection::new(stream);
            connection
                .send(Message::Hello(Hello {
                    protocol_version: ringmaster_proto::PROTOCOL_VERSION,
                    client: "test".into(),
                }))
                .await
                .unwrap();
            let Some(Message::HelloAck(ack)) = connection.recv().await.unwrap() else {
                panic!("no HelloAck")
            };
            let credential = Credential::new(principal, SECRET.to_vec()).unwrap();
            connection
                .send(Message::Authenticate(credential.answer(&ack, role)))
                .await
                .unwrap();
            connection
        }
    };
    let mut framework = connect_as("spark", AuthRole::Framework).await;
    assert!(matches!(
        framework.recv().await.unwrap(),
        Some(Message::Authenticated(_))
    ));
    framework.send(raft_request(1, b"{}")).await.unwrap();
    expect_error(&mut framework, ErrorCode::NotAuthorized).await;

    // A master: garbage in the payload is an error response, and the connection goes on.
    let mut peer = connect_as("peers", AuthRole::Master).await;
    assert!(matches!(
        peer.recv().await.unwrap(),
        Some(Message::Authenticated(_))
    ));
    peer.send(raft_request(7, b"\xff not json")).await.unwrap();
    match peer.recv().await.unwrap() {
        Some(Message::RaftResponse(response)) => {
            assert_eq!(response.id, 7);
            assert!(response.error.contains("malformed request"), "{response:?}");
            assert!(response.payload.is_empty());
        }
        other => panic!("expected a RaftResponse, got {other:?}"),
    }
    peer.send(Message::RaftRequest(RaftRequest {
        id: 8,
        rpc: 99,
        payload: Vec::new(),
    }))
    .await
    .unwrap();
    match peer.recv().await.unwrap() {
        Some(Message::RaftResponse(response)) => {
            assert_eq!(response.id, 8);
            assert!(response.error.contains("unknown Raft RPC"), "{response:?}");
        }
        other => panic!("expected a RaftResponse, got {other:?}"),
    }
    // A well-formed vote is answered with the node's vote response.
    let vote = VoteRequest::<NodeId>::new(Vote::new(1, 2), None);
    peer.send(raft_request(9, &codec::encode(&vote).unwrap()))
        .await
        .unwrap();
    match peer.recv().await.unwrap() {
        Some(Message::RaftResponse(response)) => {
            assert_eq!(response.id, 9);
            assert!(response.error.is_empty(), "{response:?}");
            let _: openraft::raft::VoteResponse<NodeId> = codec::decode(&response.payload).unwrap();
        }
        other => panic!("expected a RaftResponse, got {other:?}"),
    }
    replicator.raft().shutdown().await.unwrap();
    served.stop().await;
}

/// A peer that completes the handshake, then answers every request with `answer`.
async fn fake_peer(answer: fn(RaftRequest) -> Message) -> String {
    let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = socket.accept().await {
            tokio::spawn(async move {
                let mut connection = Connection::new(stream);
                let Ok(Some(Message::Hello(hello))) = connection.recv().await else {
                    return;
                };
                let ack = ringmaster_proto::answer_hello(&hello, "fake").unwrap();
                let _ = connection.send(Message::HelloAck(ack)).await;
                while let Ok(Some(Message::RaftRequest(request))) = connection.recv().await {
                    let _ = connection.send(answer(request)).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn malformed_responses_and_silent_peers_are_errors_not_panics() {
    let vote = || VoteRequest::<NodeId>::new(Vote::new(1, 1), None);
    let option = || openraft::network::RPCOption::new(Duration::from_millis(500));
    let mut network = TcpNetwork::new(1, ClientSecurity::default(), 1 << 20);

    let garbled = fake_peer(|request| {
        Message::RaftResponse(ringmaster_proto::RaftResponse {
            id: request.id,
            payload: b"\x00garbage".to_vec(),
            error: String::new(),
        })
    })
    .await;
    let mut client = network.new_client(2, &garbled).await;
    let error = client.vote(vote(), option()).await.unwrap_err();
    assert!(
        matches!(error, openraft::error::RPCError::Unreachable(_)),
        "{error:?}"
    );
    assert!(error.to_string().contains("malformed"), "{error}");

    // A remote error that is not an openraft error: unreachable, with its text.
    let refusing = fake_peer(|request| {
        Message::RaftResponse(ringmaster_proto::RaftResponse {
            id: request.id,
            payload: Vec::new(),
            error: "not today".into(),
        })
    })
    .await;
    let mut client = network.new_client(3, &refusing).await;
    let error = client.vote(vote(), option()).await.unwrap_err();
    assert!(error.to_string().contains("not today"), "{error}");

    // An openraft error from the peer's node: a remote error openraft can act on.
    let stopped = fake_peer(|request| {
        let error = openraft::error::RaftError::<NodeId>::Fatal(openraft::error::Fatal::Stopped);
        Message::RaftResponse(ringmaster_proto::RaftResponse {
            id: request.id,
            payload: codec::encode(&error).unwrap(),
            error: error.to_string(),
        })
    })
    .await;
    let mut client = network.new_client(6, &stopped).await;
    match client.vote(vote(), option()).await {
        Err(openraft::error::RPCError::RemoteError(remote)) => {
            assert_eq!(remote.target, 6);
            assert!(matches!(
                remote.source,
                openraft::error::RaftError::Fatal(openraft::error::Fatal::Stopped)
            ));
        }
        other => panic!("expected a remote error, got {other:?}"),
    }

    // No answer at all: a timeout.
    let silent = fake_peer(|_| Message::Pong(ringmaster_proto::Pong { nonce: 0 })).await;
    let mut client = network.new_client(4, &silent).await;
    let error = client.vote(vote(), option()).await.unwrap_err();
    assert!(
        matches!(error, openraft::error::RPCError::Timeout(_)),
        "{error:?}"
    );

    // Nobody listening: unreachable.
    let closed = {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        socket.local_addr().unwrap().to_string()
    };
    let mut client = network.new_client(5, &closed).await;
    let error = client.vote(vote(), option()).await.unwrap_err();
    assert!(
        matches!(error, openraft::error::RPCError::Unreachable(_)),
        "{error:?}"
    );
}

#[tokio::test]
async fn log_entries_too_large_for_a_frame_are_sent_in_fewer_per_request() {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    let max_frame = 64 * 1024;
    let mut network = TcpNetwork::new(1, ClientSecurity::default(), max_frame);
    // Nobody listens: the size check comes before connecting.
    let mut client = network.new_client(2, &"127.0.0.1:1".to_string()).await;
    let entry = |index, blob: usize| {
        let mut batch = batch_adding("big");
        batch.jobs = vec![(
            "web".into(),
            Some(serde_json::json!({ "blob": "x".repeat(blob) })),
        )];
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(batch),
        }
    };
    let request = |entries| openraft::raft::AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries,
    };
    let option = || openraft::network::RPCOption::new(Duration::from_millis(500));
    let four = (1..=4).map(|i| entry(i, 40 * 1024)).collect();
    match client.append_entries(request(four), option()).await {
        Err(openraft::error::RPCError::PayloadTooLarge(too_large)) => {
            // As many as fit (one of 40 KiB in a 64 KiB frame), in one step.
            assert_eq!(too_large.entries_hint(), 1)
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    let two = (1..=2).map(|i| entry(i, 40 * 1024)).collect();
    let error = client.append_entries(request(two), option()).await;
    assert!(
        matches!(error, Err(openraft::error::RPCError::PayloadTooLarge(_))),
        "{error:?}"
    );
    // One entry larger than a frame cannot be split: an error naming the limit.
    let one = vec![entry(1, 100 * 1024)];
    let error = client
        .append_entries(request(one), option())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("master.max_frame_bytes"),
        "{error}"
    );
}

#[tokio::test]
async fn a_snapshot_mismatch_travels_as_an_openraft_error_the_sender_can_act_on() {
    use openraft::error::{InstallSnapshotError, RaftError};
    use openraft::raft::InstallSnapshotRequest;
    use openraft::{SnapshotMeta, StoredMembership};
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open_storage(dir.path());
    let network = TcpNetwork::new(1, ClientSecurity::default(), 1 << 20);
    let replicator = RaftReplicator::start(1, test_config(), network, log, sm)
        .await
        .unwrap();
    let handler = RaftHandler::new(&replicator);
    // A chunk in the middle of a snapshot this node never saw the start of.
    let chunk = InstallSnapshotRequest::<super::TypeConfig> {
        vote: Vote::new_committed(1, 2),
        meta: SnapshotMeta {
            last_log_id: None,
            last_membership: StoredMembership::default(),
            snapshot_id: "s-1".into(),
        },
        offset: 100,
        data: vec![1, 2, 3],
        done: false,
    };
    let response = handler
        .handle(RaftRequest {
            id: 3,
            rpc: RaftRpc::RaftInstallSnapshot as i32,
            payload: codec::encode(&chunk).unwrap(),
        })
        .await;
    assert_eq!(response.id, 3);
    assert!(response.error.contains("mismatch"), "{response:?}");
    let error: RaftError<NodeId, InstallSnapshotError> =
        codec::decode(&response.payload).expect("the openraft error, encoded");
    assert!(
        matches!(
            error,
            RaftError::APIError(InstallSnapshotError::SnapshotMismatch(_))
        ),
        "{error:?}"
    );
    replicator.raft().shutdown().await.unwrap();
}
