//! Three replicated masters (`cluster:`) in one process over loopback TCP: a leader is
//! elected, followers send agents and frameworks to it with `NOT_LEADER`, the leader stamps its
//! term on `RunTasks`, and when the leader stops a new one leads from the replicated registry:
//! the framework fails over to it with its id, the agent re-registers with its running task,
//! and nothing is launched again.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use ringmaster::config::Config;
use ringmaster::master::{Master, Snapshot};
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{ErrorCode, Message, Subscribe, TaskState, TaskStatus};

/// Three free loopback ports (bound, then released for the masters to take).
fn free_ports() -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn config(id: u64, ports: &[u16]) -> Config {
    let mut yaml = String::from(
        "master:\n  agent_timeout: 30s\n  allocation_interval: 5ms\n  heartbeat_interval: 100ms\n  \
         status_retry_interval: 5s\ncluster:\n",
    );
    yaml.push_str(&format!(
        "  id: {id}\n  election_timeout: 500ms\n  peers:\n"
    ));
    for (i, port) in ports.iter().enumerate() {
        yaml.push_str(&format!("    {}: 127.0.0.1:{port}\n", i + 1));
    }
    Config::from_yaml(&yaml, "cluster.yaml").expect("valid cluster config")
}

struct Group {
    masters: BTreeMap<u64, Master>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn start_group() -> (Group, Vec<u16>) {
    let ports = free_ports();
    let mut masters = BTreeMap::new();
    let mut dirs = Vec::new();
    for id in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let listen = format!("127.0.0.1:{}", ports[id as usize - 1]);
        let master =
            Master::start_durable(&listen, None, config(id, &ports), Some(dir.path().into()))
                .await
                .expect("a replicated master starts");
        masters.insert(id, master);
        dirs.push(dir);
    }
    (
        Group {
            masters,
            _dirs: dirs,
        },
        ports,
    )
}

/// Polls every master's state until one reports it leads (not `not`); returns its id and
/// state.
async fn leader(group: &Group, not: Option<u64>) -> (u64, Snapshot) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for (id, master) in &group.masters {
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

fn addr(ports: &[u16], id: u64) -> SocketAddr {
    format!("127.0.0.1:{}", ports[id as usize - 1])
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_from_the_replicated_registry() {
    let (mut group, ports) = start_group().await;
    let (first, _) = leader(&group, None).await;

    // A follower sends a framework away with NOT_LEADER.
    let follower = (1..=3).find(|id| *id != first).unwrap();
    let mut stray = Client::connect(addr(&ports, follower)).await;
    stray
        .send(Message::Subscribe(Subscribe {
            name: "f".into(),
            user: "tester".into(),
            ..Default::default()
        }))
        .await;
    let refused = stray.expect_error().await;
    assert_eq!(refused.code(), ErrorCode::NotLeader, "{refused:?}");
    // It names the leader it knows (none right after an election).
    if !refused.leader.is_empty() {
        assert!(ports
            .iter()
            .any(|p| refused.leader == format!("127.0.0.1:{p}")));
    }

    // The leader launches a task, stamped with its term. (Right after the group forms, a late
    // candidate may still depose the first leader: clients follow whoever leads, as the real
    // ones do.)
    let (first, mut agent) = with_leader(&group, &ports, None, |a| {
        Message::RegisterAgent(agent_registration(a, vec![]))
    })
    .await;
    let term = group.masters[&first]
        .snapshot()
        .await
        .unwrap()
        .cluster
        .unwrap()
        .term;
    let (_, mut fw) = with_leader(&group, &ports, None, |_| subscribe("")).await;
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
    assert_eq!(run.leader_term, term);
    assert!(term > 0);
    agent
        .report(&run.tasks[0], TaskState::TaskRunning, "u1")
        .await;
    let running = fw.expect_state("t1", TaskState::TaskRunning).await;
    fw.ack(&running).await;

    // The leader stops; another leads from the replicated registry.
    group.masters.remove(&first).unwrap().shutdown().await;
    drop((agent, fw));
    let (_, state) = leader(&group, Some(first)).await;
    let new_term = state.cluster.as_ref().unwrap().term;
    assert!(new_term > term, "{new_term} after {term}");
    let id = fw_id(&state);
    let (second, mut fw) = with_leader(&group, &ports, Some(first), |_| subscribe(&id)).await;
    assert_eq!(fw.id, id, "the framework kept its id");
    let status = TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        agent_id: "a1".into(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    };
    let (_, _agent) = with_leader(&group, &ports, Some(first), |a| {
        Message::RegisterAgent(agent_registration(a, vec![status.clone()]))
    })
    .await;
    let s = common::wait_for_state(&group.masters[&second], "the task is running again", |s| {
        s.tasks.iter().any(|t| t.id == "t1" && t.state == "RUNNING")
            && s.agents.iter().any(|a| a.connected)
    })
    .await;
    assert_eq!(
        s.counters.tasks_launched, 0,
        "the new leader launched nothing"
    );
    fw.demand("cpus:1;mem:128", 0).await;
    for (_, master) in std::mem::take(&mut group.masters) {
        master.shutdown().await;
    }
}

fn agent_registration(_: u64, tasks: Vec<TaskStatus>) -> ringmaster_proto::RegisterAgent {
    ringmaster_proto::RegisterAgent {
        agent_id: "a1".into(),
        hostname: "host-a1".into(),
        total: Some(
            ringmaster_proto::resources::Resources::parse("cpus:4;mem:1024")
                .unwrap()
                .to_wire(),
        ),
        tasks,
        ..Default::default()
    }
}

fn subscribe(id: &str) -> Message {
    Message::Subscribe(Subscribe {
        framework_id: id.into(),
        name: "f".into(),
        user: "tester".into(),
        weight: 1.0,
        failover_timeout_secs: 600.0,
        ..Default::default()
    })
}

/// Sends `first` (built for the leader's id) to the master that leads (not `not`) until one
/// registers or subscribes it, as a client following `NOT_LEADER` does; returns that leader
/// and the connection, its `id` set.
async fn with_leader(
    group: &Group,
    ports: &[u16],
    not: Option<u64>,
    first: impl Fn(u64) -> Message,
) -> (u64, Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (id, _) = leader(group, not).await;
        let mut c = Client::connect(addr(ports, id)).await;
        c.send(first(id)).await;
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

/// The one framework the new leader recovered.
fn fw_id(state: &Snapshot) -> String {
    assert_eq!(state.frameworks.len(), 1, "{:?}", state.frameworks);
    state.frameworks[0].id.clone()
}

/// Masters that serve TLS and require authentication replicate over TLS (each trusting
/// `cluster.ca` for its peers) and authenticate to each other as a `master` principal: a
/// framework over TLS is subscribed by the leader, which answers only once a quorum holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_replicate_over_tls_with_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    ringmaster::certs::write_dev_certs(&certs, &[], &[], false).unwrap();
    let ports = free_ports();
    let mut masters = BTreeMap::new();
    for id in 1..=3u64 {
        let mut yaml = String::from(
            "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 100ms\n\
             tls:\n  cert: certs/master.pem\n  key: certs/master.key\n\
             auth:\n  required: true\n  principals:\n\
             \x20   peers: { secret: peer-secret, roles: [master] }\n\
             \x20   alice: { secret: alice-secret, roles: [framework], users: [alice] }\n\
             cluster:\n  ca: certs/ca.pem\n",
        );
        yaml.push_str(&format!(
            "  id: {id}\n  election_timeout: 500ms\n  peers:\n"
        ));
        for (i, port) in ports.iter().enumerate() {
            yaml.push_str(&format!("    {}: 127.0.0.1:{port}\n", i + 1));
        }
        let file = dir.path().join(format!("m{id}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        let config = Config::load(&file).unwrap();
        let listen = format!("127.0.0.1:{}", ports[id as usize - 1]);
        let work = dir.path().join(format!("w{id}"));
        let master = Master::start_durable(&listen, None, config, Some(work))
            .await
            .expect("a replicated TLS master starts");
        masters.insert(id, master);
    }
    let group = Group {
        masters,
        _dirs: Vec::new(),
    };
    let tls = ringmaster_proto::transport::TlsClient::load(&certs.join("ca.pem"), None).unwrap();
    let credential =
        ringmaster_proto::security::Credential::new("alice", b"alice-secret".to_vec()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let subscribed = loop {
        let (id, _) = leader(&group, None).await;
        let stream =
            ringmaster_proto::transport::connect(&addr(&ports, id).to_string(), Some(&tls), WAIT)
                .await
                .expect("TLS connect");
        let mut conn = ringmaster_proto::Connection::new(stream);
        conn.send(Message::Hello(ringmaster_proto::Hello {
            protocol_version: ringmaster_proto::PROTOCOL_VERSION,
            client: "ha-test".into(),
        }))
        .await
        .unwrap();
        let ack = match conn.recv().await {
            Ok(Some(Message::HelloAck(ack))) => ack,
            other => panic!("expected HelloAck, got {other:?}"),
        };
        let answer = credential.answer(&ack, ringmaster_proto::security::AuthRole::Framework);
        conn.send(Message::Authenticate(answer)).await.unwrap();
        let mut sub = subscribe("");
        if let Message::Subscribe(s) = &mut sub {
            s.user = "alice".into();
        }
        conn.send(sub).await.unwrap();
        let reply = loop {
            match tokio::time::timeout(WAIT, conn.recv()).await {
                Ok(Ok(Some(Message::Authenticated(_)))) => continue,
                Ok(Ok(Some(other))) => break other,
                other => panic!("no answer: {other:?}"),
            }
        };
        match reply {
            Message::Subscribed(s) => break s.framework_id,
            Message::Error(e) if e.code() == ErrorCode::NotLeader => {
                assert!(tokio::time::Instant::now() < deadline, "no leader took it");
            }
            other => panic!("unexpected answer {other:?}"),
        }
    };
    assert!(!subscribed.is_empty());
    for (_, master) in group.masters {
        master.shutdown().await;
    }
}
