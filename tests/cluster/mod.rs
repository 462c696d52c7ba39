//! Helpers of the replicated-master tests that run masters in this process: a group of
//! masters, finding the one that leads, and clients that follow `NOT_LEADER` as the real ones
//! do.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ringmaster::master::{Master, Snapshot};
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{ErrorCode, Message, Subscribe, TaskStatus};

use crate::common::Client;

/// How long a group may take to elect a leader or take a client.
pub const ELECTION_PATIENCE: Duration = Duration::from_secs(30);

/// `n` free loopback ports (bound, then released for the masters to take).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Masters by id, with the address clients reach each at.
pub struct Group {
    pub masters: BTreeMap<u64, Master>,
    pub addrs: BTreeMap<u64, SocketAddr>,
    pub dirs: BTreeMap<u64, tempfile::TempDir>,
}

impl Group {
    pub async fn shutdown(&mut self) {
        for (_, master) in std::mem::take(&mut self.masters) {
            master.shutdown().await;
        }
    }
}

/// Polls every master's state until one reports it leads (not `not`); returns its id and
/// state.
pub async fn leader(group: &Group, not: Option<u64>) -> (u64, Snapshot) {
    leader_among(&group.masters, not, ELECTION_PATIENCE).await
}

/// [`leader`] among `masters`, failing after `patience`.
pub async fn leader_among(
    masters: &BTreeMap<u64, Master>,
    not: Option<u64>,
    patience: Duration,
) -> (u64, Snapshot) {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        for (id, master) in masters {
            // A master stopped by the test, or a leader deposed while answering, gives no
            // answer: ask again.
            let Ok(s) = master.snapshot().await else {
                continue;
            };
            let cluster = s
                .cluster
                .clone()
                .expect("a replicated master has a cluster view");
            if cluster.role == "leader" && cluster.leader == Some(*id) && Some(*id) != not {
                return (*id, s);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader elected in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader once the group has settled: the same leader in the same term twice, `calm`
/// apart (right after a group forms, a late candidate may still depose the first leader).
pub async fn settled_leader(group: &Group, calm: Duration) -> u64 {
    let deadline = tokio::time::Instant::now() + ELECTION_PATIENCE;
    loop {
        let (id, s) = leader(group, None).await;
        let term = s.cluster.map(|c| c.term);
        tokio::time::sleep(calm).await;
        let (again, s) = leader(group, None).await;
        if again == id && s.cluster.map(|c| c.term) == term {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the group did not settle"
        );
    }
}

/// Sends `first` to the master that leads (not `not`) until one registers or subscribes it,
/// as a client following `NOT_LEADER` does; returns that leader and the connection, its `id`
/// set.
pub async fn with_leader(group: &Group, not: Option<u64>, first: Message) -> (u64, Client) {
    let deadline = tokio::time::Instant::now() + ELECTION_PATIENCE;
    loop {
        let (id, _) = leader(group, not).await;
        let mut c = Client::connect(group.addrs[&id]).await;
        c.send(first.clone()).await;
        let answer = c
            .expect("the first answer", |m| match m {
                Message::AgentRegistered(r) => Some(Ok(r.agent_id.clone())),
                Message::Subscribed(s) => Some(Ok(s.framework_id.clone())),
                Message::Error(e) if e.code() == ErrorCode::NotLeader => Some(Err(())),
                Message::Error(e) => panic!("refused: {e:?}"),
                _ => None,
            })
            .await;
        if let Ok(client_id) = answer {
            c.id = client_id;
            return (id, c);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no master would take the client"
        );
    }
}

/// Agent `a1` (cpus:4;mem:1024) registering with `tasks` running.
pub fn agent_registration(tasks: Vec<TaskStatus>) -> Message {
    Message::RegisterAgent(ringmaster_proto::RegisterAgent {
        agent_id: "a1".into(),
        hostname: "host-a1".into(),
        total: Some(
            ringmaster_proto::resources::Resources::parse("cpus:4;mem:1024")
                .unwrap()
                .to_wire(),
        ),
        tasks,
        ..Default::default()
    })
}

/// Framework `f` subscribing (`id` empty: a new one).
pub fn subscribe(id: &str) -> Message {
    Message::Subscribe(Subscribe {
        framework_id: id.into(),
        name: "f".into(),
        user: "tester".into(),
        weight: 1.0,
        failover_timeout_secs: 600.0,
        ..Default::default()
    })
}
