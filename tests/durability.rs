//! Master restart from its durable registry (`--work-dir`), with raw protocol clients:
//! tasks still running stay RUNNING, tasks that ended while the master was down report their
//! real terminal state, tasks whose agent never returns become LOST and every framework is
//! told, also across a second restart; frameworks fail over across a restart.

mod common;

use std::path::Path;

use common::*;
use ringmaster::config::Config;
use ringmaster::master::Master;
use ringmaster_proto::{Message, Reconcile, StatusAck, TaskState, TaskStatus, Teardown};

async fn start_durable(config: Config, work_dir: &Path) -> Master {
    Master::start_durable("127.0.0.1:0", None, config, Some(work_dir.to_path_buf()))
        .await
        .expect("master starts from its registry")
}

/// Launches one task on `agent` for `fw`, sees it RUNNING and acknowledges that.
async fn run_one(fw: &mut Client, agent: &mut Client, id: &str) -> ringmaster_proto::TaskInfo {
    let (run, running) = run_one_status(fw, agent, id).await;
    fw.ack(&running).await;
    run
}

fn status(task: &ringmaster_proto::TaskInfo, state: TaskState) -> TaskStatus {
    TaskStatus {
        task_id: task.task_id.clone(),
        framework_id: task.framework_id.clone(),
        state: state as i32,
        ..Default::default()
    }
}

/// Asks for the state of these tasks (none: every task not ended) and returns the answers
/// sorted by task id.
async fn reconcile(fw: &mut Client, ids: &[&str], n: usize) -> Vec<TaskStatus> {
    fw.send(Message::Reconcile(Reconcile {
        task_ids: ids.iter().map(|id| id.to_string()).collect(),
    }))
    .await;
    let mut answers = Vec::new();
    while answers.len() < n {
        let s = fw
            .expect("reconciliation Update", |m| match m {
                Message::Update(u) => u.status.clone().filter(|s| s.update_id.is_empty()),
                _ => None,
            })
            .await;
        answers.push(s);
    }
    answers.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    answers
}

#[tokio::test]
async fn a_restarted_master_keeps_running_tasks_and_learns_what_ended_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let master = start_durable(test_config(""), dir.path()).await;
    let mut agent = Client::agent(master.addr(), "a1", "cpus:4;mem:1024").await;
    let mut fw = Client::framework_with(master.addr(), "f", "", 1.0, 60.0).await;
    let fw_id = fw.id.clone();
    let t1 = run_one(&mut fw, &mut agent, "t1").await;
    let t2 = run_one(&mut fw, &mut agent, "t2").await;
    master.shutdown().await;
    drop((agent, fw));

    let master = start_durable(test_config(""), dir.path()).await;
    let s = master.snapshot().await.unwrap();
    assert_eq!(s.frameworks.len(), 1, "the framework is remembered");
    assert!(!s.frameworks[0].connected);
    assert_eq!(s.agents.len(), 1, "the agent is remembered");
    assert_eq!(s.agents[0].state, "disconnected");
    assert_eq!(s.tasks.len(), 2, "both tasks are remembered");
    assert!(
        s.tasks.iter().all(|t| t.state == "RUNNING"),
        "{:?}",
        s.tasks
    );
    assert!(s.offers.is_empty(), "offers are not persisted");

    // The agent comes back: t1 still runs, t2 finished while the master was down.
    let finished = TaskStatus {
        exit_code: Some(0),
        ..status(&t2, TaskState::TaskFinished)
    };
    let _agent = Client::agent_with_tasks(
        master.addr(),
        "a1",
        "cpus:4;mem:1024",
        vec![status(&t1, TaskState::TaskRunning), finished],
    )
    .await;
    // The framework fails over to the new master under its id and keeps its tasks.
    let mut fw = Client::framework_with(master.addr(), "f", &fw_id, 1.0, 60.0).await;
    assert_eq!(fw.id, fw_id);
    let done = fw.expect_state("t2", TaskState::TaskFinished).await;
    assert_eq!(done.exit_code, Some(0));
    fw.ack(&done).await;
    let answers = reconcile(&mut fw, &[], 1).await;
    assert_eq!(answers[0].task_id, "t1");
    assert_eq!(answers[0].state, TaskState::TaskRunning as i32);
    let s = wait_for_state(&master, "t1 held again", |s| {
        s.agents[0].connected && s.agents[0].used == "cpus:1;mem:128"
    })
    .await;
    assert_eq!(s.tasks.iter().filter(|t| t.state == "RUNNING").count(), 1);
    assert_eq!(s.counters.tasks_launched, 0, "nothing is launched again");
    master.shutdown().await;
}

#[tokio::test]
async fn a_task_whose_agent_never_returns_is_lost_and_the_framework_is_told_even_later() {
    let dir = tempfile::tempdir().unwrap();
    let config = || test_config("  agent_reregister_timeout: 300ms\n");
    let master = start_durable(config(), dir.path()).await;
    let mut agent = Client::agent(master.addr(), "gone", "cpus:2;mem:1024").await;
    let mut fw = Client::framework_with(master.addr(), "f", "", 1.0, 60.0).await;
    let fw_id = fw.id.clone();
    run_one(&mut fw, &mut agent, "t1").await;
    master.shutdown().await;
    drop((agent, fw));

    // The agent never comes back; the framework is away when the task is declared LOST.
    let master = start_durable(config(), dir.path()).await;
    let s = wait_for_state(&master, "t1 lost", |s| {
        s.tasks.iter().any(|t| t.id == "t1" && t.state == "LOST")
    })
    .await;
    assert_eq!(s.tasks[0].reason, "agent_lost");
    assert!(s.agents[0].lost);
    // Not acknowledged before another restart: it is told again after that one.
    master.shutdown().await;
    let master = start_durable(config(), dir.path()).await;
    let mut fw = Client::framework_with(master.addr(), "f", &fw_id, 1.0, 60.0).await;
    let lost = fw.expect_state("t1", TaskState::TaskLost).await;
    assert_eq!(lost.reason, "agent_lost");
    assert!(
        lost.message.contains("agent_reregister_timeout"),
        "{}",
        lost.message
    );
    fw.send(Message::StatusAck(StatusAck {
        task_id: lost.task_id.clone(),
        update_id: lost.update_id.clone(),
    }))
    .await;
    // Once acknowledged, a further restart does not repeat it.
    let _ = reconcile(&mut fw, &["t1"], 1).await; // the ack is processed before this answer
    master.shutdown().await;
    drop(fw);
    let master = start_durable(config(), dir.path()).await;
    let mut fw = Client::framework_with(master.addr(), "f", &fw_id, 1.0, 60.0).await;
    fw.send(Message::Reconcile(Reconcile {
        task_ids: vec!["t1".into()],
    }))
    .await;
    let first = fw
        .expect("an Update", |m| match m {
            Message::Update(u) => u.status.clone(),
            _ => None,
        })
        .await;
    assert_eq!(first.state, TaskState::TaskLost as i32);
    assert!(
        first.update_id.is_empty(),
        "the first update after subscribing is the reconciliation answer, not a resend"
    );
    master.shutdown().await;
}

#[tokio::test]
async fn a_torn_down_framework_stays_removed_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let master = start_durable(test_config(""), dir.path()).await;
    let mut fw = Client::framework(master.addr(), "f").await;
    let fw_id = fw.id.clone();
    fw.send(Message::Teardown(Teardown {})).await;
    wait_for_state(&master, "framework removed", |s| s.frameworks.is_empty()).await;
    master.shutdown().await;

    let master = start_durable(test_config(""), dir.path()).await;
    let mut again = Client::connect(master.addr()).await;
    again
        .send(Message::Subscribe(ringmaster_proto::Subscribe {
            framework_id: fw_id.clone(),
            name: "f".into(),
            user: "tester".into(),
            weight: 1.0,
            failover_timeout_secs: 60.0,
            ..Default::default()
        }))
        .await;
    let error = again.expect_error().await;
    assert!(error.message.contains("was removed"), "{}", error.message);
    // New ids never repeat an earlier incarnation's.
    let fresh = Client::framework(master.addr(), "g").await;
    assert_ne!(fresh.id, fw_id);
    master.shutdown().await;
}

#[tokio::test]
async fn an_unusable_work_dir_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let error = Master::start_durable("127.0.0.1:0", None, test_config(""), Some(file))
        .await
        .err()
        .expect("a file is not a work dir")
        .to_string();
    assert!(error.contains("not-a-dir"), "{error}");
}

#[tokio::test]
async fn a_framework_not_back_within_its_failover_timeout_after_a_restart_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let master = start_durable(test_config(""), dir.path()).await;
    let mut agent = Client::agent(master.addr(), "a1", "cpus:2;mem:1024").await;
    let mut fw = Client::framework_with(master.addr(), "f", "", 1.0, 0.3).await;
    let fw_id = fw.id.clone();
    run_one(&mut fw, &mut agent, "t1").await;
    master.shutdown().await;
    drop((agent, fw));

    // The failover timeout counts from the restart; the framework never returns.
    let master = start_durable(test_config(""), dir.path()).await;
    let t1 = ringmaster_proto::TaskInfo {
        task_id: "t1".into(),
        framework_id: fw_id.clone(),
        ..Default::default()
    };
    let mut agent = Client::agent_with_tasks(
        master.addr(),
        "a1",
        "cpus:2;mem:1024",
        vec![status(&t1, TaskState::TaskRunning)],
    )
    .await;
    let kill = agent
        .expect("KillTask", |m| match m {
            Message::KillTask(k) => Some(k.clone()),
            _ => None,
        })
        .await;
    assert_eq!(kill.task_id, "t1");
    // Removed before or after the agent is back: killed either way, never left running.
    assert!(
        ["framework_failover_timeout", "unknown_task"].contains(&kill.reason.as_str()),
        "{kill:?}"
    );
    wait_for_state(&master, "framework removed", |s| s.frameworks.is_empty()).await;
    master.shutdown().await;

    let master = start_durable(test_config(""), dir.path()).await;
    let mut again = Client::connect(master.addr()).await;
    again
        .send(Message::Subscribe(ringmaster_proto::Subscribe {
            framework_id: fw_id,
            name: "f".into(),
            user: "tester".into(),
            weight: 1.0,
            failover_timeout_secs: 60.0,
            ..Default::default()
        }))
        .await;
    let error = again.expect_error().await;
    assert!(error.message.contains("was removed"), "{}", error.message);
    master.shutdown().await;
}
