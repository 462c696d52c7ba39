//! Three replicated masters (`cluster:`) in one process over loopback TCP: a leader is
//! elected, followers send agents and frameworks to it with `NOT_LEADER`, the leader stamps its
//! term on `RunTasks`, and when the leader stops a new one leads from the replicated registry:
//! the framework fails over to it with its id, the agent re-registers with its running task,
//! and nothing is launched again.

mod cluster;
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::*;
use common::*;
use ringmaster::config::Config;
use ringmaster::master::{Master, Snapshot};
use ringmaster_proto::{ErrorCode, Message, Subscribe, TaskState, TaskStatus};

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

async fn start_group() -> (Group, Vec<u16>) {
    let ports = free_ports(3);
    let mut group = Group {
        masters: BTreeMap::new(),
        addrs: BTreeMap::new(),
        dirs: BTreeMap::new(),
    };
    for id in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let listen = format!("127.0.0.1:{}", ports[id as usize - 1]);
        let master =
            Master::start_durable(&listen, None, config(id, &ports), Some(dir.path().into()))
                .await
                .expect("a replicated master starts");
        group.masters.insert(id, master);
        group.addrs.insert(id, listen.parse().unwrap());
        group.dirs.insert(id, dir);
    }
    (group, ports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_from_the_replicated_registry() {
    let (mut group, ports) = start_group().await;
    let first = settled_leader(&group, Duration::from_secs(1)).await;

    // A follower sends a framework away with NOT_LEADER.
    let follower = (1..=3).find(|id| *id != first).unwrap();
    let mut stray = Client::connect(group.addrs[&follower]).await;
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
    let (first, mut agent) = with_leader(&group, None, agent_registration(vec![])).await;
    let term = group.masters[&first]
        .snapshot()
        .await
        .unwrap()
        .cluster
        .unwrap()
        .term;
    let (_, mut fw) = with_leader(&group, None, subscribe("")).await;
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
    let (second, mut fw) = with_leader(&group, Some(first), subscribe(&id)).await;
    assert_eq!(fw.id, id, "the framework kept its id");
    let status = TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        agent_id: "a1".into(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    };
    let (_, _agent) = with_leader(
        &group,
        Some(first),
        agent_registration(vec![status.clone()]),
    )
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

/// The one framework the new leader recovered (beside the built-in jobs framework, which runs
/// beside every leader).
fn fw_id(state: &Snapshot) -> String {
    let ours: Vec<_> = state
        .frameworks
        .iter()
        .filter(|f| f.name != "ringmaster-jobs")
        .collect();
    assert_eq!(ours.len(), 1, "{:?}", state.frameworks);
    ours[0].id.clone()
}

/// Masters that serve TLS and require authentication replicate over TLS (each trusting
/// `cluster.ca` for its peers) and authenticate to each other as a `master` principal: a
/// framework over TLS is subscribed by the leader, which answers only once a quorum holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_replicate_over_tls_with_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    ringmaster::certs::write_dev_certs(&certs, &[], &[], false).unwrap();
    let ports = free_ports(3);
    let mut masters = BTreeMap::new();
    let mut addrs = BTreeMap::new();
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
        addrs.insert(id, listen.parse().unwrap());
    }
    let group = Group {
        masters,
        addrs,
        dirs: BTreeMap::new(),
    };
    let tls = ringmaster_proto::transport::TlsClient::load(&certs.join("ca.pem"), None).unwrap();
    let credential =
        ringmaster_proto::security::Credential::new("alice", b"alice-secret".to_vec()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let subscribed = loop {
        let (id, _) = leader(&group, None).await;
        let stream =
            ringmaster_proto::transport::connect(&group.addrs[&id].to_string(), Some(&tls), WAIT)
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

/// A work dir a single master wrote holds records the group's log does not: a replicated
/// master refuses it with a clear error instead of leading from records its peers never get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_master_s_registry_is_refused_by_a_replicated_master() {
    let dir = tempfile::tempdir().unwrap();
    let single = Master::start_durable(
        "127.0.0.1:0",
        None,
        test_config(""),
        Some(dir.path().into()),
    )
    .await
    .unwrap();
    let mut fw = Client::framework(single.addr(), "f").await;
    fw.demand("cpus:1;mem:128", 0).await;
    wait_for_state(&single, "the framework is recorded", |s| {
        s.frameworks.len() == 1
    })
    .await;
    single.shutdown().await;

    let ports = free_ports(3);
    let listen = format!("127.0.0.1:{}", ports[0]);
    let error = match Master::start_durable(
        &listen,
        None,
        config(1, &ports),
        Some(dir.path().into()),
    )
    .await
    {
        Ok(_) => panic!("a replicated master started on a single master's registry"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("written by a single master"), "{error}");
    assert!(error.contains("ringmaster cluster init --from"), "{error}");
}
