//! A network partition between three replicated masters in this process. Each master reaches
//! each peer through its own cuttable proxy (`tests/proxy`), so the test can cut one master
//! off from the group while its clients still reach it:
//! - the leader cut off from the others stops deciding: a launch accepted on it never reaches
//!   the agent, and it closes its clients with `NOT_LEADER` once it cannot confirm its lead;
//! - the majority elects a new leader, which never heard of that launch; the framework and
//!   the agent move to it and the task is launched there, once;
//! - when the partition heals, the old leader follows the new one: one leader, one term.

mod cluster;
mod common;
mod proxy;

use std::collections::BTreeMap;

use cluster::*;
use common::*;
use proxy::Proxy;
use ringmaster::config::Config;
use ringmaster::master::Master;
use ringmaster_proto::{ErrorCode, Message, TaskState};

/// Three masters; `proxies[(i, j)]` carries master i's traffic to master j.
async fn start_partitionable_group() -> (Group, BTreeMap<(u64, u64), Proxy>) {
    let ports = free_ports(3);
    let real = |id: u64| format!("127.0.0.1:{}", ports[id as usize - 1]);
    let mut proxies = BTreeMap::new();
    for i in 1..=3u64 {
        for j in (1..=3u64).filter(|j| *j != i) {
            proxies.insert((i, j), Proxy::start(real(j).parse().unwrap()).await);
        }
    }
    let mut group = Group {
        masters: BTreeMap::new(),
        addrs: BTreeMap::new(),
        dirs: BTreeMap::new(),
    };
    for id in 1..=3u64 {
        let mut yaml = format!(
            "master:\n  agent_timeout: 30s\n  allocation_interval: 5ms\n  \
             heartbeat_interval: 100ms\n  status_retry_interval: 5s\n\
             cluster:\n  id: {id}\n  election_timeout: 500ms\n  peers:\n"
        );
        for peer in 1..=3u64 {
            let address = if peer == id {
                real(id)
            } else {
                proxies[&(id, peer)].addr.to_string()
            };
            yaml.push_str(&format!("    {peer}: {address}\n"));
        }
        let config = Config::from_yaml(&yaml, "cluster.yaml").expect("valid cluster config");
        let dir = tempfile::tempdir().unwrap();
        let master = Master::start_durable(&real(id), None, config, Some(dir.path().into()))
            .await
            .expect("a replicated master starts");
        group.masters.insert(id, master);
        group.addrs.insert(id, real(id).parse().unwrap());
        group.dirs.insert(id, dir);
    }
    (group, proxies)
}

/// Cuts (or heals) every proxy into and out of master `id`.
fn partition(proxies: &BTreeMap<(u64, u64), Proxy>, id: u64, cut: bool) {
    for ((from, to), proxy) in proxies {
        if *from == id || *to == id {
            if cut {
                proxy.cut()
            } else {
                proxy.heal()
            }
        }
    }
}

/// Reads messages until the master closes the connection; returns whether a RunTasks came
/// and the error it closed with.
async fn until_closed(client: &mut Client) -> (bool, Option<ringmaster_proto::Error>) {
    let mut ran = false;
    let error = loop {
        match tokio::time::timeout(WAIT, client.conn.recv()).await {
            Ok(Ok(Some(Message::RunTasks(_)))) => ran = true,
            Ok(Ok(Some(Message::Error(e)))) => {
                if e.code() == ErrorCode::NotLeader {
                    break Some(e);
                }
            }
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) | Ok(Err(_)) => break None,
            Err(_) => panic!("the cut-off leader did not close its client within {WAIT:?}"),
        }
    };
    (ran, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_launches_nothing_and_the_partition_heals_without_split_brain() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "off".into()))
        .with_test_writer()
        .try_init();
    let (mut group, proxies) = start_partitionable_group().await;
    let old = settled_leader(&group, std::time::Duration::from_secs(1)).await;
    let (at, mut agent) = with_leader(&group, None, agent_registration(vec![])).await;
    let (also, mut fw) = with_leader(&group, None, subscribe("")).await;
    assert_eq!((at, also), (old, old), "the settled leader changed");
    let old_term = group.masters[&old]
        .snapshot()
        .await
        .unwrap()
        .cluster
        .unwrap()
        .term;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);

    // Cut the leader off, then accept the offer it made.
    partition(&proxies, old, true);
    fw.accept(
        &offer.offer_id,
        vec![task("t1", "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let (ran, closed) = until_closed(&mut agent).await;
    assert!(!ran, "the cut-off leader launched a task");
    let closed = closed.expect("closed with NOT_LEADER");
    assert_eq!(closed.code(), ErrorCode::NotLeader);
    let (ran, _) = until_closed(&mut fw).await;
    assert!(!ran);

    // The majority elects another leader, which never heard of the launch.
    let (new, state) = leader(&group, Some(old)).await;
    let new_term = state.cluster.as_ref().unwrap().term;
    assert!(new_term > old_term);
    assert!(
        state.frameworks.iter().any(|f| f.id == fw.id),
        "the subscription was committed before the cut: {:?}",
        state.frameworks
    );
    let id = fw.id.clone();
    assert!(
        state.tasks.iter().all(|t| t.id != "t1"),
        "an uncommitted launch reached the new leader: {:?}",
        state.tasks
    );
    // The old leader, still cut off, serves nobody: it sends clients away.
    let mut stray = Client::connect(group.addrs[&old]).await;
    stray.send(subscribe(&id)).await;
    assert_eq!(stray.expect_error().await.code(), ErrorCode::NotLeader);

    // Framework and agent move to the new leader, which launches the task once.
    let (at, mut fw) = with_leader(&group, Some(old), subscribe(&id)).await;
    assert_eq!(at, new);
    let (_, mut agent) = with_leader(&group, Some(old), agent_registration(vec![])).await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.accept(
        &offer.offer_id,
        vec![task("t1", "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let run = agent
        .expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(run.leader_term, new_term);
    agent
        .report(&run.tasks[0], TaskState::TaskRunning, "u1")
        .await;
    fw.expect_state("t1", TaskState::TaskRunning).await;

    // Heal: the old leader follows the new one; one leader, in one term.
    partition(&proxies, old, false);
    let deadline = tokio::time::Instant::now() + ELECTION_PATIENCE;
    loop {
        let mut views = Vec::new();
        for master in group.masters.values() {
            if let Ok(s) = master.snapshot().await {
                views.push(s.cluster.unwrap());
            }
        }
        let leaders: Vec<_> = views.iter().filter(|v| v.role == "leader").collect();
        assert!(leaders.len() <= 1, "two leaders at once: {views:?}");
        let healed = views.len() == 3
            && leaders.len() == 1
            && views
                .iter()
                .all(|v| v.leader == leaders[0].leader && v.term == leaders[0].term);
        if healed {
            let old_view = views.iter().find(|v| v.id == old).unwrap();
            assert_eq!(old_view.role, "follower", "{views:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the partition did not heal: {views:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The task still runs, launched once.
    let (now_leader, state) = leader(&group, None).await;
    let t1: Vec<_> = state.tasks.iter().filter(|t| t.id == "t1").collect();
    assert_eq!(t1.len(), 1, "{:?}", state.tasks);
    assert_eq!(t1[0].state, "RUNNING");
    if now_leader == new {
        assert_eq!(state.counters.tasks_launched, 1, "launched once");
    }
    group.shutdown().await;
}
