//! Seeding a replication group from a single master's work dir (`ringmaster cluster init`,
//! docs/operations.md, "From one master to three").
//!
//! Why in place, without copying a record: a replicated master's registry IS its Raft state
//! machine (`super::state_machine`), and what the group's log holds up to a point may be
//! replaced by a snapshot of the registry. So the single master's registry becomes master 1's
//! state machine as it is, and the log is written as if every record had been committed and
//! then compacted into a snapshot:
//!
//! - the registry records the applied point [`SEED_INDEX`] (at term [`SEED_TERM`], led by
//!   master 1) and the membership of the config's `cluster.peers`, in one durable transaction
//!   (the commit point of the whole operation: once it is there, the work dir is master 1's);
//! - `raft.redb` records the log as purged up to that point, that point as committed, and
//!   master 1's vote for itself in that term (so the first election is for the next term).
//!
//! Master 1 starts as a follower holding everything; it wins the first election with the
//! votes of masters 2 and 3 (empty, `cluster.join: true`: they propose no membership of their
//! own), and since its log starts after the seed point, openraft sends each of them a snapshot
//! of the registry ([`super::state_machine`] builds one at start when the log was purged), then
//! the entries that follow. Nothing is replayed or rewritten: every framework, agent, task and
//! job the single master had is in the first snapshot, and the leader recovers from it as a
//! restarted single master recovers from its registry (the agents re-register, their tasks go
//! on running).
//!
//! Offline only: the registry's lock refuses the seed while a master runs on the work dir.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership, Vote};

use super::super::registry::{Registry, REGISTRY_FILE};
use super::log_store::{LogStore, RAFT_FILE};
use super::state_machine::applied_record;
use super::NodeId;
use crate::config::ClusterConfig;

/// The term of the seed point: the first term a group can have after its initial membership.
pub(crate) const SEED_TERM: u64 = 1;
/// The log index of the seed point: everything the single master had is "entry" 1.
pub(crate) const SEED_INDEX: u64 = 1;

/// What [`seed_from_single`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seeded {
    /// The registry that became master `id`'s state machine.
    pub registry: PathBuf,
    /// The Raft log written next to it.
    pub raft_log: PathBuf,
    pub id: NodeId,
    /// The group's first membership (every voter's protocol address).
    pub voters: BTreeMap<NodeId, String>,
    pub frameworks: usize,
    pub agents: usize,
    pub tasks: usize,
    pub jobs: usize,
}

/// Why a work dir was not seeded. The message names the work dir and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SeedError(String);

/// Turns the single master's work dir `work_dir` into the work dir of master `cluster.id` of a
/// new group whose voters are `cluster.peers` (see the module docs). Refuses, changing
/// nothing, when `work_dir` has no registry, the registry has no records, a master holds it,
/// or it already has replication state.
pub async fn seed_from_single(
    work_dir: &Path,
    cluster: &ClusterConfig,
) -> Result<Seeded, SeedError> {
    let dir = work_dir.display();
    if !cluster.peers.contains_key(&cluster.id) {
        return Err(SeedError(format!(
            "cluster.id {} is not one of cluster.peers; the config must be the config of the \
             master that will run on {dir}",
            cluster.id
        )));
    }
    let registry_path = work_dir.join(REGISTRY_FILE);
    if !registry_path.is_file() {
        return Err(SeedError(format!(
            "{dir} has no registry ({} is missing): it is not a single master's work dir \
             (`ringmaster serve --work-dir {dir}`), so there is nothing to seed the group from",
            registry_path.display()
        )));
    }
    let registry = Registry::open(work_dir).map_err(|e| {
        SeedError(format!(
            "cannot open the registry in {dir}: {e}. `cluster init` runs offline: stop the \
             master running on {dir} first"
        ))
    })?;
    let applied = registry
        .replication_applied()
        .map_err(|e| SeedError(format!("cannot read the registry in {dir}: {e}")))?;
    if applied.is_some() {
        return Err(SeedError(format!(
            "{dir} already has replication state: it is a replicated master's work dir \
             (seeded before, or written by a group); start its master with its group config \
             instead"
        )));
    }
    let raft_path = work_dir.join(RAFT_FILE);
    if raft_path.exists() {
        return Err(SeedError(format!(
            "{dir} already has a Raft log ({}) although its registry has no replication \
             state; refusing to overwrite it. If it is left over from an interrupted seed or \
             another group, move it away and run `cluster init` again",
            raft_path.display()
        )));
    }
    let recovered = registry
        .load()
        .map_err(|e| SeedError(format!("cannot read the registry in {dir}: {e}")))?;
    if recovered.is_empty() && recovered.jobs.is_empty() && recovered.jobs_meta.is_none() {
        return Err(SeedError(format!(
            "the registry in {dir} has no records: there is nothing to seed the group from; \
             start every master of the group on an empty work dir instead"
        )));
    }

    let seed = LogId::new(CommittedLeaderId::new(SEED_TERM, cluster.id), SEED_INDEX);
    let voters: BTreeSet<NodeId> = cluster.peers.keys().copied().collect();
    let membership = Membership::new(vec![voters], cluster.peers.clone());
    let record = applied_record(Some(seed), StoredMembership::new(Some(seed), membership))
        .map_err(|e| SeedError(format!("cannot encode the replication state: {e}")))?;
    // The registry first: its applied point is what makes the work dir a group's. Should the
    // Raft log not be written after it, a master started here still starts from the seed
    // point (openraft purges an empty log up to the applied point at start).
    registry
        .commit_replicated(&[], &record)
        .map_err(|e| SeedError(format!("cannot write the registry in {dir}: {e}")))?;
    let write_log = async {
        let mut log = LogStore::open(work_dir).map_err(|e| e.to_string())?;
        log.save_vote(&Vote::new(SEED_TERM, cluster.id))
            .await
            .map_err(|e| e.to_string())?;
        // The committed id is written without an fsync; the purge after it makes it durable.
        log.save_committed(Some(seed))
            .await
            .map_err(|e| e.to_string())?;
        log.purge(seed).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    write_log.await.map_err(|e| {
        SeedError(format!(
            "the registry in {dir} is seeded, but writing the Raft log {} failed ({e}); the \
             master starts from the registry's seed point without it",
            raft_path.display()
        ))
    })?;
    Ok(Seeded {
        registry: registry_path,
        raft_log: raft_path,
        id: cluster.id,
        voters: cluster.peers.clone(),
        frameworks: recovered.frameworks.len(),
        agents: recovered.agents.len(),
        tasks: recovered.tasks.len(),
        jobs: recovered.jobs.len(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::super::network::Router;
    use super::super::raft::RaftReplicator;
    use super::super::tests::{
        applied, batch_adding, elected_leader, framework_ids, open_storage, test_config, Node,
    };
    use super::super::Replicator;
    use super::*;
    use crate::config::Config;

    /// Master `id`'s cluster config in a group of masters 1..=3.
    fn cluster(id: NodeId) -> ClusterConfig {
        let yaml = format!(
            "cluster:\n  id: {id}\n  peers:\n    1: 127.0.0.1:5051\n    2: 127.0.0.1:5052\n    \
             3: 127.0.0.1:5053\n"
        );
        Config::from_yaml(&yaml, "group.yaml")
            .unwrap()
            .cluster
            .unwrap()
    }

    /// A single master's work dir: framework `f1` and a job, no replication state.
    fn single_master_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        registry.commit(batch_adding("f1")).unwrap();
        dir
    }

    async fn seed_error(dir: &Path) -> String {
        seed_from_single(dir, &cluster(1))
            .await
            .expect_err("refused")
            .to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_seeded_master_leads_and_empty_masters_catch_up_from_its_registry() {
        let single = single_master_dir();
        let seeded = seed_from_single(single.path(), &cluster(1)).await.unwrap();
        assert_eq!((seeded.id, seeded.frameworks, seeded.jobs), (1, 1, 1));
        assert_eq!(seeded.voters.len(), 3);

        // Master 1 on the seeded dir, masters 2 and 3 on empty ones; nobody initializes.
        let router = Router::default();
        let mut dirs = BTreeMap::from([(1, single)]);
        let mut nodes: BTreeMap<NodeId, Node> = BTreeMap::new();
        for id in 1..=3 {
            let dir = dirs
                .remove(&id)
                .unwrap_or_else(|| tempfile::tempdir().unwrap());
            let (log, sm) = open_storage(dir.path());
            let registry: Arc<Registry> = sm.registry().clone();
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
        assert_eq!(
            elected_leader(&nodes, None).await,
            1,
            "only the seeded master can win"
        );
        let index = nodes[&1]
            .replicator
            .replicate(batch_adding("f2"))
            .await
            .unwrap();
        assert!(index > SEED_INDEX);
        for (id, node) in &nodes {
            applied(node, index).await;
            assert_eq!(framework_ids(node), vec!["f1", "f2"], "master {id}");
            assert_eq!(node.registry.load().unwrap().jobs.len(), 1, "master {id}");
            if *id != 1 {
                assert!(
                    node.replicator.snapshots_installed() >= 1,
                    "master {id} caught up from a snapshot"
                );
            }
        }
        assert_eq!(nodes[&1].replicator.voter_ids(), vec![1, 2, 3]);

        // Masters 2 and 3 hold everything: they elect a leader without master 1.
        router.remove(1);
        let dead = nodes.remove(&1).unwrap();
        dead.replicator.raft().shutdown().await.unwrap();
        let leader = elected_leader(&nodes, Some(1)).await;
        let index = nodes[&leader]
            .replicator
            .replicate(batch_adding("f3"))
            .await
            .unwrap();
        for node in nodes.values() {
            applied(node, index).await;
            assert_eq!(framework_ids(node), vec!["f1", "f2", "f3"]);
        }
        for node in nodes.values() {
            node.replicator.raft().shutdown().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_dir_without_a_registry_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = seed_error(dir.path()).await;
        assert!(error.contains("has no registry"), "{error}");
        assert!(error.contains(&dir.path().display().to_string()), "{error}");
        assert!(!dir.path().join(REGISTRY_FILE).exists(), "nothing created");
        let missing = dir.path().join("nope");
        let error = seed_error(&missing).await;
        assert!(error.contains("has no registry"), "{error}");
    }

    #[tokio::test]
    async fn an_empty_registry_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Registry::open(dir.path()).unwrap());
        let error = seed_error(dir.path()).await;
        assert!(error.contains("has no records"), "{error}");
        assert!(!dir.path().join(RAFT_FILE).exists());
    }

    #[tokio::test]
    async fn a_registry_a_master_holds_is_refused() {
        let dir = single_master_dir();
        let held = Registry::open(dir.path()).unwrap();
        let error = seed_error(dir.path()).await;
        assert!(error.contains("runs offline"), "{error}");
        assert!(error.contains("in use by another process"), "{error}");
        drop(held);
        let registry = Registry::open(dir.path()).unwrap();
        assert_eq!(registry.replication_applied().unwrap(), None, "unchanged");
    }

    #[tokio::test]
    async fn a_dir_seeded_or_with_a_raft_log_is_refused() {
        let dir = single_master_dir();
        seed_from_single(dir.path(), &cluster(1)).await.unwrap();
        let error = seed_error(dir.path()).await;
        assert!(error.contains("already has replication state"), "{error}");

        let other = single_master_dir();
        drop(LogStore::open(other.path()).unwrap());
        let error = seed_error(other.path()).await;
        assert!(error.contains("already has a Raft log"), "{error}");
    }
}
