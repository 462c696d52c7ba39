//! Priorities, partitions and preemption through the master, with raw protocol clients
//! (SPEC seed 003, docs/priorities.md).

mod common;

use common::{start_master, task, Client};
use ringmaster::config::Config;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Attribute, Message, RegisterAgent, Subscribe, TaskState};

const CONFIG: &str = "\
master:
  agent_timeout: 5s
  offer_timeout: 30s
  allocation_interval: 5ms
  heartbeat_interval: 100ms
  status_retry_interval: 5s
priorities:
  base: 0
  partitions: [default, gpu]
  users:
    alice: { gpu: { priority: 10, quota: \"gpus:4\" } }
";

async fn framework(addr: std::net::SocketAddr, name: &str, user: &str, partition: &str) -> Client {
    let mut c = Client::connect(addr).await;
    c.send(Message::Subscribe(Subscribe {
        name: name.into(),
        user: user.into(),
        weight: 1.0,
        failover_timeout_secs: 60.0,
        partition: partition.into(),
        ..Default::default()
    }))
    .await;
    c.id = c
        .expect("Subscribed", |m| match m {
            Message::Subscribed(s) => Some(s.framework_id.clone()),
            Message::Error(e) => panic!("subscribe refused: {}", e.message),
            _ => None,
        })
        .await;
    c
}

async fn agent(
    addr: std::net::SocketAddr,
    id: &str,
    resources: &str,
    partition: Option<&str>,
) -> Client {
    let mut c = Client::connect(addr).await;
    c.send(Message::RegisterAgent(RegisterAgent {
        agent_id: id.into(),
        hostname: format!("host-{id}"),
        total: Some(Resources::parse(resources).unwrap().to_wire()),
        attributes: partition
            .map(|p| Attribute {
                key: "partition".into(),
                value: p.into(),
            })
            .into_iter()
            .collect(),
        tasks: vec![],
        ..Default::default()
    }))
    .await;
    c.id = c
        .expect("AgentRegistered", |m| match m {
            Message::AgentRegistered(r) => Some(r.agent_id.clone()),
            _ => None,
        })
        .await;
    c
}

/// A base-priority task fills the GPU agent; alice's demand (priority 10, within quota)
/// preempts it: the agent gets KillTask `preempted`, the victim's framework sees KILLED with
/// reason `preempted` (even though the agent reported no reason), and the freed agent is
/// offered to alice. Frameworks only ever see agents of their own partition.
#[tokio::test]
async fn higher_priority_demand_preempts_and_gets_the_agent() {
    let master = start_master(Config::from_yaml(CONFIG, "test.yaml").unwrap()).await;
    let addr = master.addr();
    let mut gpu = agent(addr, "g1", "cpus:8;gpus:8", Some("gpu")).await;
    let _cpu = agent(addr, "c1", "cpus:8;gpus:8", None).await;

    let mut low = framework(addr, "low", "bob", "gpu").await;
    low.demand("gpus:8", 1).await;
    let offers = low.expect_offers().await;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent_id, "g1", "only the gpu partition's agent");
    low.accept(
        &offers[0].offer_id,
        vec![task("low-1", "cpus:1;gpus:8", "sleep 600")],
    )
    .await;
    let run = gpu.expect_run().await;
    gpu.report(&run[0], TaskState::TaskRunning, "u1").await;
    low.expect_state("low-1", TaskState::TaskRunning).await;
    low.demand("gpus:8", 0).await;

    let mut high = framework(addr, "high", "alice", "gpu").await;
    high.demand("cpus:1;gpus:4", 1).await;
    let kill = gpu
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        (kill.task_id.as_str(), kill.reason.as_str()),
        ("low-1", "preempted")
    );
    gpu.report(&run[0], TaskState::TaskKilled, "u2").await;
    let status = low.expect_state("low-1", TaskState::TaskKilled).await;
    assert_eq!(status.reason, "preempted");

    let offers = high.expect_offers().await;
    assert_eq!(offers[0].agent_id, "g1");
    high.accept(
        &offers[0].offer_id,
        vec![task("high-1", "cpus:1;gpus:4", "sleep 600")],
    )
    .await;
    let run = gpu.expect_run().await;
    assert_eq!(run[0].task_id, "high-1");

    let s = master.snapshot().await.unwrap();
    let priority = |id: &str| s.tasks.iter().find(|t| t.id == id).unwrap().priority;
    assert_eq!(priority("low-1"), Some(0));
    assert_eq!(priority("high-1"), Some(10));
    assert_eq!(s.counters.preemptions, 1);

    // alice's quota (gpus:4) is in use: her next task would run at base. When high-1 ends the
    // quota returns and the next task runs at priority 10 again.
    gpu.report(&run[0], TaskState::TaskRunning, "u3").await;
    high.expect_state("high-1", TaskState::TaskRunning).await;
    high.demand("cpus:1;gpus:4", 1).await;
    let offers = high.expect_offers().await;
    high.accept(
        &offers[0].offer_id,
        vec![task("high-2", "cpus:1;gpus:4", "sleep 600")],
    )
    .await;
    let run2 = gpu.expect_run().await;
    gpu.report(&run[0], TaskState::TaskFinished, "u4").await;
    high.expect_state("high-1", TaskState::TaskFinished).await;
    gpu.report(&run2[0], TaskState::TaskFinished, "u5").await;
    high.expect_state("high-2", TaskState::TaskFinished).await;
    let offers = high.expect_offers().await;
    high.accept(
        &offers[0].offer_id,
        vec![task("high-3", "cpus:1;gpus:4", "sleep 600")],
    )
    .await;
    gpu.expect_run().await;
    let s = master.snapshot().await.unwrap();
    let priority = |id: &str| s.tasks.iter().find(|t| t.id == id).unwrap().priority;
    assert_eq!(priority("high-2"), Some(0), "over quota while high-1 ran");
    assert_eq!(
        priority("high-3"),
        Some(10),
        "quota returned when high-1 ended"
    );
    master.shutdown().await;
}

/// Over quota → base priority → no preemption, and "why pending" says so.
#[tokio::test]
async fn over_quota_demand_waits_and_says_why() {
    let master = start_master(Config::from_yaml(CONFIG, "test.yaml").unwrap()).await;
    let addr = master.addr();
    let mut gpu = agent(addr, "g1", "gpus:8", Some("gpu")).await;
    // In another partition: excluded by the partition rule, whatever it has free.
    let _cpu = agent(addr, "c1", "gpus:8", None).await;
    let mut low = framework(addr, "low", "bob", "gpu").await;
    low.demand("gpus:8", 1).await;
    let offers = low.expect_offers().await;
    low.accept(
        &offers[0].offer_id,
        vec![task("low-1", "gpus:8", "sleep 600")],
    )
    .await;
    let run = gpu.expect_run().await;
    gpu.report(&run[0], TaskState::TaskRunning, "u1").await;
    low.expect_state("low-1", TaskState::TaskRunning).await;

    let mut high = framework(addr, "big", "alice", "gpu").await;
    high.demand("gpus:6", 1).await;
    // Wait until an allocation run has left the demand unserved.
    let deadline = tokio::time::Instant::now() + common::WAIT;
    let pending = loop {
        let s = master.snapshot().await.unwrap();
        if let Some(p) = s
            .pending
            .iter()
            .find(|p| p.framework == high.id && p.unserved_last_run)
        {
            break p.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "demand never reported pending"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let why = &pending.why;
    assert!(
        why.starts_with("no agent fits gpus:6: 1 agent short of gpus, 1 not eligible; "),
        "{why}"
    );
    // Per rule: c1 fails the partition rule, g1 (right partition) has too little free.
    assert_eq!(
        serde_json::to_value(&pending.excluded).unwrap(),
        serde_json::json!([
            {"filter": "partition", "agents": 1},
            {"filter": "resources", "agents": 1}
        ])
    );
    assert_eq!(
        (pending.agents, pending.not_eligible, pending.fitting),
        (2, 1, 0)
    );
    assert!(
        why.ends_with("over priority quota in partition gpu: running nothing of gpus:4, task needs gpus:6 → base priority; base-priority demands never preempt"),
        "{why}"
    );
    let s = master.snapshot().await.unwrap();
    assert_eq!(s.counters.preemptions, 0);
    assert_eq!(s.tasks.iter().filter(|t| t.state == "RUNNING").count(), 1);
    master.shutdown().await;
}
