//! Replication's storage against openraft's own storage test suite, its durability across a
//! reopen, and three Raft nodes in one process replicating registry batches through a leader
//! change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{Config, StorageError};
use tempfile::TempDir;

use super::super::registry::{FrameworkEntry, Registry, RegistryBatch};
use super::log_store::LogStore;
use super::network::Router;
use super::raft::RaftReplicator;
use super::state_machine::StateMachine;
use super::{NodeId, ReplicationError, Replicator, Role, TypeConfig};

/// Opens the log store and the state machine of one master in `dir`.
pub(super) fn open_storage(dir: &std::path::Path) -> (LogStore, StateMachine) {
    let log = LogStore::open(dir).expect("open raft.redb");
    let registry = Arc::new(Registry::open(dir).expect("open registry.redb"));
    let sm = StateMachine::new(registry).expect("state machine");
    (log, sm)
}

/// Fresh storage in a fresh temp dir for each suite case; the dir lives as long as the case.
struct FreshStorage;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for FreshStorage {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, sm) = open_storage(dir.path());
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(FreshStorage).expect("openraft storage suite");
}

pub(super) fn framework(id: &str) -> FrameworkEntry {
    FrameworkEntry {
        id: id.into(),
        name: "exec".into(),
        user: "alice".into(),
        weight: 1.0,
        partition: "default".into(),
        failover_timeout_secs: 30.0,
        principal: String::new(),
    }
}

pub(super) fn batch_adding(id: &str) -> RegistryBatch {
    RegistryBatch {
        frameworks: vec![(id.into(), Some(framework(id)))],
        jobs: vec![(
            "web".into(),
            Some(serde_json::json!({"spec": {"count": 2}})),
        )],
        ..Default::default()
    }
}

#[tokio::test]
async fn the_vote_the_log_and_the_applied_point_survive_a_reopen() {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
    let dir = tempfile::tempdir().unwrap();
    let log_id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
    {
        let (mut log, mut sm) = open_storage(dir.path());
        log.save_vote(&Vote::new(1, 1)).await.unwrap();
        let entries = vec![
            Entry {
                log_id: log_id(1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2),
                payload: EntryPayload::Normal(batch_adding("f1")),
            },
        ];
        openraft::storage::RaftLogStorageExt::blocking_append(&mut log, entries.clone())
            .await
            .unwrap();
        sm.apply(entries).await.unwrap();
    }
    let (mut log, mut sm) = open_storage(dir.path());
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(log_id(2))
    );
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(2)));
    let recovered = sm.registry().load().unwrap();
    assert_eq!(recovered.frameworks, vec![framework("f1")]);
}

#[tokio::test]
async fn a_failed_apply_leaves_neither_records_nor_an_applied_point() {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm) = open_storage(dir.path());
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Normal(batch_adding("f1")),
    };
    sm.registry()
        .fail_commits
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(sm.apply(vec![entry.clone()]).await.is_err());
    assert_eq!(sm.applied_state().await.unwrap().0, None);
    assert!(sm.registry().load().unwrap().frameworks.is_empty());
    assert_eq!(sm.registry().replication_applied().unwrap(), None);

    // Applied again once the disk works: exactly once, with its applied point.
    sm.registry()
        .fail_commits
        .store(false, std::sync::atomic::Ordering::Relaxed);
    sm.apply(vec![entry.clone()]).await.unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, Some(entry.log_id));
    // A state machine opened afresh reads the same applied point back from the registry.
    let mut reopened = StateMachine::new(sm.registry().clone()).unwrap();
    assert_eq!(
        reopened.applied_state().await.unwrap().0,
        Some(entry.log_id)
    );
    assert_eq!(
        reopened.registry().load().unwrap().frameworks,
        vec![framework("f1")]
    );
}

#[test]
fn a_damaged_replication_record_in_the_registry_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::open(dir.path()).unwrap());
    registry
        .commit_replicated(&[], b"{not json")
        .expect("plant a damaged record");
    let error = StateMachine::new(registry).err().expect("refused");
    assert!(
        error.to_string().contains("bad replication record"),
        "{error}"
    );
}

/// How long a test waits for an event before it fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// Elections are slow enough that a busy CI machine stalling a thread for a few hundred
/// milliseconds does not depose a healthy leader mid-test.
pub(super) fn test_config() -> Config {
    Config {
        cluster_name: "ringmaster-test".into(),
        heartbeat_interval: 100,
        election_timeout_min: 800,
        election_timeout_max: 1600,
        ..Default::default()
    }
}

pub(crate) struct Node {
    pub replicator: RaftReplicator,
    pub registry: Arc<Registry>,
    pub _dir: TempDir,
}

/// Waits until `node` sees a leader other than `not`, and returns it.
async fn leader_seen_by(node: &Node, not: Option<NodeId>) -> NodeId {
    let metrics = node
        .replicator
        .raft()
        .wait(Some(PATIENCE))
        .metrics(
            |m| m.current_leader.is_some() && m.current_leader != not,
            "a leader is elected",
        )
        .await
        .expect("no leader elected in time");
    metrics.current_leader.unwrap()
}

/// Waits until `node` applied at least `index`.
pub(super) async fn applied(node: &Node, index: u64) {
    node.replicator
        .raft()
        .wait(Some(PATIENCE))
        .applied_index_at_least(Some(index), "the batch is applied")
        .await
        .expect("not applied in time");
}

/// Starts three masters on `router` and makes them one group.
pub(crate) async fn start_cluster(router: &Router) -> BTreeMap<NodeId, Node> {
    let mut nodes: BTreeMap<NodeId, Node> = BTreeMap::new();
    for id in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let (log, sm) = open_storage(dir.path());
        let registry = sm.registry().clone();
        let replicator = RaftReplicator::start(id, test_config(), router.for_node(id), log, sm)
            .await
            .unwrap();
        router.add(id, replicator.raft().clone());
        nodes.insert(
            id,
            Node {
                replicator,
                registry,
                _dir: dir,
            },
        );
    }
    let members: BTreeMap<NodeId, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", 5050 + id)))
        .collect();
    nodes[&1]
        .replicator
        .raft()
        .initialize(members)
        .await
        .unwrap();
    nodes
}

/// Waits until a leader (other than `not`) is elected and knows it leads; returns its id.
pub(crate) async fn elected_leader(nodes: &BTreeMap<NodeId, Node>, not: Option<NodeId>) -> NodeId {
    let witness = nodes.values().next().unwrap();
    let leader = leader_seen_by(witness, not).await;
    nodes[&leader]
        .replicator
        .raft()
        .wait(Some(PATIENCE))
        .state(openraft::ServerState::Leader, "the leader knows it leads")
        .await
        .unwrap();
    leader
}

pub(super) fn framework_ids(node: &Node) -> Vec<String> {
    let mut ids: Vec<String> = node
        .registry
        .load()
        .unwrap()
        .frameworks
        .into_iter()
        .map(|f| f.id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_masters_replicate_a_batch_and_survive_the_leader() {
    let router = Router::default();
    let mut nodes = start_cluster(&router).await;

    // A leader is elected and replicates the first batch to every master's registry.
    let leader = elected_leader(&nodes, None).await;
    let index = nodes[&leader]
        .replicator
        .replicate(batch_adding("f1"))
        .await
        .unwrap();
    let status = nodes[&leader].replicator.status();
    assert_eq!(status.role, Role::Leader);
    assert_eq!(status.leader, Some(leader));
    for node in nodes.values() {
        applied(node, index).await;
        let recovered = node.registry.load().unwrap();
        assert_eq!(recovered.frameworks, vec![framework("f1")]);
        assert_eq!(recovered.jobs.len(), 1);
    }

    // A follower refuses to replicate and names the leader.
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    match nodes[&follower]
        .replicator
        .replicate(batch_adding("f-refused"))
        .await
    {
        Err(ReplicationError::NotLeader { leader: named, .. }) => {
            assert_eq!(named, Some(leader))
        }
        other => panic!("a follower replicated: {other:?}"),
    }

    // The leader dies; the two survivors elect a new one and replicate the next batch.
    router.remove(leader);
    let dead = nodes.remove(&leader).unwrap();
    dead.replicator.raft().shutdown().await.unwrap();
    let new_leader = elected_leader(&nodes, Some(leader)).await;
    assert_ne!(new_leader, leader);
    let index = nodes[&new_leader]
        .replicator
        .replicate(batch_adding("f2"))
        .await
        .unwrap();
    for node in nodes.values() {
        applied(node, index).await;
        assert_eq!(framework_ids(node), vec!["f1", "f2"]);
    }
    for node in nodes.values() {
        node.replicator.raft().shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_missed_purged_entries_catches_up_from_a_snapshot() {
    let router = Router::default();
    let nodes = start_cluster(&router).await;
    let leader = elected_leader(&nodes, None).await;
    let lagging = *nodes.keys().find(|id| **id != leader).unwrap();

    // While one follower is cut off, the other one makes the quorum.
    router.remove(lagging);
    let mut index = 0;
    for id in ["f1", "f2", "f3"] {
        index = nodes[&leader]
            .replicator
            .replicate(batch_adding(id))
            .await
            .unwrap();
    }

    // The leader snapshots its registry and purges the entries the cut-off follower lacks.
    let raft = nodes[&leader].replicator.raft();
    raft.trigger().snapshot().await.unwrap();
    raft.wait(Some(PATIENCE))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= index),
            "the leader built a snapshot",
        )
        .await
        .unwrap();
    raft.trigger().purge_log(index).await.unwrap();
    raft.wait(Some(PATIENCE))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index >= index),
            "the leader purged its log",
        )
        .await
        .unwrap();

    // Back on the network, the follower can only catch up by installing the snapshot.
    let follower = &nodes[&lagging];
    router.add(lagging, follower.replicator.raft().clone());
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
    assert_eq!(framework_ids(follower), vec!["f1", "f2", "f3"]);
    assert_eq!(follower.registry.load().unwrap().jobs.len(), 1);
    for node in nodes.values() {
        node.replicator.raft().shutdown().await.unwrap();
    }
}
