//! Agent loss and return, framework failover within and beyond its timeout.

mod common;

use common::*;
use ringmaster_proto::{ErrorCode, Message, TaskState, TaskStatus};

/// Launches one task on `agent` for `fw` and sees it RUNNING.
async fn run_one(fw: &mut Client, agent: &mut Client, id: &str) -> ringmaster_proto::TaskInfo {
    run_one_status(fw, agent, id).await.0
}

fn running(task: &ringmaster_proto::TaskInfo) -> TaskStatus {
    TaskStatus {
        task_id: task.task_id.clone(),
        framework_id: task.framework_id.clone(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_silent_agent_is_lost_and_its_tasks_with_it() {
    let master = start_master(test_config("  agent_timeout: 300ms\n")).await;
    let mut agent = Client::agent(master.addr(), "quiet", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "f").await;
    run_one(&mut fw, &mut agent, "t1").await;
    // The agent sends no more heartbeats.
    let lost = fw.expect_state("t1", TaskState::TaskLost).await;
    assert_eq!(lost.reason, "agent_lost");
    let s = wait_for_state(&master, "agent lost", |s| s.agents[0].lost).await;
    assert_eq!(s.total, "", "a lost agent's resources leave the rings");
    assert_eq!(s.counters.agents_lost, 1);
}

#[tokio::test]
async fn a_lost_agent_that_returns_is_reconciled_not_duplicated() {
    let master = start_master(test_config("  agent_timeout: 300ms\n")).await;
    let mut agent = Client::agent(master.addr(), "flaky", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "f").await;
    let t1 = run_one(&mut fw, &mut agent, "t1").await;
    fw.expect_state("t1", TaskState::TaskLost).await;
    drop(agent);
    // It comes back under its id, still running t1.
    let mut back = Client::agent_with_tasks(
        master.addr(),
        "flaky",
        "cpus:2;mem:1024",
        vec![running(&t1)],
    )
    .await;
    assert_eq!(back.id, "flaky");
    let again = fw.expect_state("t1", TaskState::TaskRunning).await;
    assert_eq!(again.reason, "agent_reregistered");
    let s = wait_for_state(&master, "task adopted", |s| {
        !s.agents[0].lost && s.agents[0].tasks == 1
    })
    .await;
    assert_eq!(s.tasks.len(), 1);
    assert_eq!(s.agents[0].free, "cpus:1;mem:896");
    // It finishes normally afterwards.
    back.report(&t1, TaskState::TaskFinished, "t1-done").await;
    fw.expect_state("t1", TaskState::TaskFinished).await;
}

#[tokio::test]
async fn an_agent_that_reconnects_in_time_keeps_its_tasks() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "blip", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "f").await;
    let t1 = run_one(&mut fw, &mut agent, "t1").await;
    drop(agent);
    wait_for_state(&master, "agent disconnected", |s| !s.agents[0].connected).await;
    let _back =
        Client::agent_with_tasks(master.addr(), "blip", "cpus:2;mem:1024", vec![running(&t1)])
            .await;
    let s = wait_for_state(&master, "agent back", |s| s.agents[0].connected).await;
    assert_eq!(s.tasks.len(), 1);
    assert_eq!(s.tasks[0].state, "RUNNING");
    assert_eq!(s.agents[0].free, "cpus:1;mem:896");
}

#[tokio::test]
async fn a_task_the_returning_agent_lost_is_reported_lost() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "amnesiac", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "f").await;
    run_one(&mut fw, &mut agent, "t1").await;
    drop(agent);
    wait_for_state(&master, "agent disconnected", |s| !s.agents[0].connected).await;
    let _back = Client::agent(master.addr(), "amnesiac", "cpus:2;mem:1024").await;
    let lost = fw.expect_state("t1", TaskState::TaskLost).await;
    assert_eq!(lost.reason, "agent_reregistered");
}

#[tokio::test]
async fn a_returning_agent_running_unknown_tasks_is_told_to_kill_them() {
    let master = start_master(test_config("")).await;
    let stray = TaskStatus {
        task_id: "stray".into(),
        framework_id: "nobody".into(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    };
    let mut agent =
        Client::agent_with_tasks(master.addr(), "old", "cpus:2;mem:1024", vec![stray]).await;
    let kill = agent
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(kill.task_id, "stray");
}

#[tokio::test]
async fn framework_failover_within_the_timeout_keeps_tasks_and_redelivers_updates() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework_with(master.addr(), "phoenix", "", 1.0, 30.0).await;
    let t1 = run_one(&mut fw, &mut agent, "t1").await;
    let id = fw.id.clone();
    drop(fw);
    wait_for_state(&master, "framework disconnected", |s| {
        !s.frameworks[0].connected
    })
    .await;
    // While it is away the task finishes; the update waits for it.
    agent.report(&t1, TaskState::TaskFinished, "t1-done").await;
    let mut fw = Client::framework_with(master.addr(), "phoenix", &id, 1.0, 30.0).await;
    assert_eq!(fw.id, id);
    let done = fw.expect_state("t1", TaskState::TaskFinished).await;
    assert_eq!(done.agent_id, "a");
    let s = master.snapshot().await.unwrap();
    assert_eq!(s.frameworks.len(), 1);
}

#[tokio::test]
async fn framework_failover_beyond_the_timeout_kills_its_tasks() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework_with(master.addr(), "mortal", "", 1.0, 0.3).await;
    run_one(&mut fw, &mut agent, "t1").await;
    let id = fw.id.clone();
    drop(fw);
    let kill = agent
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(kill.task_id, "t1");
    assert_eq!(kill.reason, "framework_failover_timeout");
    let s = wait_for_state(&master, "framework removed", |s| s.frameworks.is_empty()).await;
    assert_eq!(s.agents[0].free, "cpus:2;mem:1024");
    // Coming back with the old id is refused.
    let mut late = Client::connect(master.addr()).await;
    late.send(Message::Subscribe(ringmaster_proto::Subscribe {
        framework_id: id,
        name: "mortal".into(),
        user: "u".into(),
        weight: 1.0,
        failover_timeout_secs: 1.0,
        ..Default::default()
    }))
    .await;
    let error = late.expect_closed().await.expect("an error before closing");
    assert_eq!(error.code, ErrorCode::InvalidRequest as i32);
    assert!(error.message.contains("was removed"), "{}", error.message);
}

#[tokio::test]
async fn teardown_kills_tasks_and_removes_the_framework() {
    let master = start_master(test_config("")).await;
    let mut agent = Client::agent(master.addr(), "a", "cpus:2;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "done").await;
    run_one(&mut fw, &mut agent, "t1").await;
    fw.send(Message::Teardown(ringmaster_proto::Teardown {}))
        .await;
    let kill = agent
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(kill.reason, "framework_teardown");
    wait_for_state(&master, "framework removed", |s| s.frameworks.is_empty()).await;
}
