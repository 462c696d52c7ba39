//! `ringmaster-exec --state-file` / `--framework-id` against the fake master: an exec killed
//! mid-run (SIGKILL) and started again with the same state file takes its framework over,
//! reconciles the tasks it launched, launches only the ones never launched, and removes the
//! file when it ends.

mod support;

use ringmaster_proto::convert::ResourcesWire;
use std::path::Path;
use std::process::Stdio;

use ringmaster_proto::{Message, Offers, Subscribed};
use ringmaster_sdk::{Offer, Resources, TaskInfo, TaskState};
use support::*;
use tokio::process::{Child, Command};
use tokio::time::timeout;

fn start_exec(master: &str, instances: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringmaster-exec"))
        .args(["--master", master, "--name", "job"])
        .args(["--resources", "cpus:1;mem:128", "--instances", instances])
        .args(extra)
        .args(["--", "sleep", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start ringmaster-exec")
}

async fn finish(child: Child) -> (i32, String, String) {
    let output = timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("ringmaster-exec exits")
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn offers(id: &str, resources: &str) -> Message {
    Message::Offers(Offers {
        offers: vec![Offer {
            offer_id: id.into(),
            agent_id: "a-1".into(),
            resources: Some(Resources::parse(resources).unwrap().to_wire()),
            ..Offer::default()
        }],
    })
}

async fn expect_demand(side: &mut MasterSide, count: u32) {
    match side.recv().await {
        Message::Demand(demand) => assert_eq!(demand.count, count),
        other => panic!("expected Demand {count}, got {other:?}"),
    }
}

async fn expect_accept(side: &mut MasterSide) -> Vec<String> {
    match side.recv().await {
        Message::Accept(accept) => accept
            .tasks
            .iter()
            .map(|t: &TaskInfo| t.task_id.clone())
            .collect(),
        other => panic!("expected Accept, got {other:?}"),
    }
}

async fn expect_reconcile(side: &mut MasterSide, ids: &[&str]) {
    match side.recv().await {
        Message::Reconcile(r) => assert_eq!(r.task_ids, ids),
        other => panic!("expected Reconcile {ids:?}, got {other:?}"),
    }
}

const AGENT: &str = "a-1";

fn read_state(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// First run: subscribes as fw-1, launches job-0 and job-1 of 3, is SIGKILLed.
async fn first_run_killed(master: &FakeMaster, state: &Path) {
    let mut first = start_exec(
        &master.addr,
        "3",
        &["--state-file", state.to_str().unwrap()],
    );
    let (mut side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.framework_id, "", "a fresh run subscribes anew");
    expect_demand(&mut side, 3).await;
    side.send(offers("o-1", "cpus:2;mem:256")).await;
    assert_eq!(expect_accept(&mut side).await, ["job-0", "job-1"]);
    expect_demand(&mut side, 1).await;
    // Written before the launch was sent.
    assert_eq!(
        read_state(state),
        "{\"name\":\"job\",\"framework_id\":\"fw-1\",\"tasks\":[\"job-0\",\"job-1\"]}\n"
    );
    side.send(update("job-0", AGENT, TaskState::TaskRunning, "", "u1"))
        .await;
    assert!(matches!(side.recv().await, Message::StatusAck(_)));
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    assert!(state.exists(), "a killed exec leaves its state file");
}

/// A first run killed after launching job-0 and job-1 of 3, then a second run with the same
/// state file: it subscribes with fw-1, reconciles job-0 and job-1 and asks for one task.
async fn second_run_reconciling(master: &FakeMaster, state: &Path) -> (Child, MasterSide) {
    first_run_killed(master, state).await;
    let second = start_exec(
        &master.addr,
        "3",
        &["--state-file", state.to_str().unwrap()],
    );
    let (mut side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.framework_id, "fw-1");
    expect_reconcile(&mut side, &["job-0", "job-1"]).await;
    expect_demand(&mut side, 1).await;
    (second, side)
}

#[tokio::test]
async fn a_restarted_exec_takes_over_and_launches_only_what_was_never_launched() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("exec.json");
    let master = FakeMaster::bind().await;
    let (second, mut side) = second_run_reconciling(&master, &state).await;
    // job-0 still runs; job-1 finished while exec was away.
    side.send(update("job-0", AGENT, TaskState::TaskRunning, "", ""))
        .await;
    side.send(update("job-1", AGENT, TaskState::TaskFinished, "", ""))
        .await;
    side.barrier(7).await;
    side.send(offers("o-2", "cpus:8;mem:1024")).await;
    assert_eq!(
        expect_accept(&mut side).await,
        ["job-2"],
        "no second launch"
    );
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    assert!(read_state(&state).contains("[\"job-0\",\"job-1\",\"job-2\"]"));
    for (task, id) in [("job-0", "u2"), ("job-2", "u3")] {
        side.send(update(task, AGENT, TaskState::TaskFinished, "", id))
            .await;
        assert!(matches!(side.recv().await, Message::StatusAck(a) if a.update_id == id));
    }
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, stdout, stderr) = finish(second).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "TASK job-0 RUNNING agent=a-1\n\
         TASK job-1 FINISHED agent=a-1\n\
         TASK job-0 FINISHED agent=a-1\n\
         TASK job-2 FINISHED agent=a-1\n"
    );
    assert!(stderr.contains("took over framework fw-1"), "{stderr}");
    assert!(!state.exists(), "removed when exec ends normally");
}

#[tokio::test]
async fn a_task_the_master_never_got_is_launched_after_the_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("exec.json");
    let master = FakeMaster::bind().await;
    let (second, mut side) = second_run_reconciling(&master, &state).await;
    side.send(update("job-0", AGENT, TaskState::TaskRunning, "", ""))
        .await;
    // The launch of job-1 never reached the master.
    side.send(update(
        "job-1",
        "",
        TaskState::TaskLost,
        "reconciliation",
        "",
    ))
    .await;
    expect_demand(&mut side, 2).await;
    assert!(matches!(side.recv().await, Message::Revive(_)));
    side.send(offers("o-2", "cpus:8;mem:1024")).await;
    assert_eq!(expect_accept(&mut side).await, ["job-1", "job-2"]);
    drop(side);
    drop(second);
}

#[tokio::test]
async fn framework_id_alone_reconciles_every_task() {
    let master = FakeMaster::bind().await;
    let exec = start_exec(&master.addr, "2", &["--framework-id", "fw-9"]);
    let (mut side, subscribe) = master.accept_subscribed("fw-9").await;
    assert_eq!(subscribe.framework_id, "fw-9");
    expect_reconcile(&mut side, &["job-0", "job-1"]).await;
    expect_demand(&mut side, 0).await;
    side.send(update("job-0", AGENT, TaskState::TaskFinished, "", ""))
        .await;
    side.send(update(
        "job-1",
        AGENT,
        TaskState::TaskFailed,
        "exit_status",
        "",
    ))
    .await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, stdout, _) = finish(exec).await;
    assert_eq!(code, 1);
    assert_eq!(
        stdout,
        "TASK job-0 FINISHED agent=a-1\nTASK job-1 FAILED agent=a-1 reason=exit_status\n"
    );
}

#[tokio::test]
async fn an_expired_framework_id_starts_over() {
    let master = FakeMaster::bind().await;
    let mut exec = start_exec(&master.addr, "1", &["--framework-id", "fw-old"]);
    let mut side = master.accept().await;
    side.handshake().await;
    assert_eq!(side.expect_subscribe().await.framework_id, "fw-old");
    side.send(Message::Subscribed(Subscribed {
        framework_id: "fw-new".into(),
        heartbeat_interval_ms: 0,
    }))
    .await;
    expect_demand(&mut side, 1).await;
    exec.start_kill().unwrap();
    let (_, _, stderr) = finish(exec).await;
    assert!(stderr.contains("framework fw-old is gone"), "{stderr}");
}

#[tokio::test]
async fn a_state_file_of_another_run_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("exec.json");
    std::fs::write(
        &state,
        "{\"name\": \"other\", \"framework_id\": \"fw-1\", \"tasks\": []}",
    )
    .unwrap();
    let exec = start_exec(
        "127.0.0.1:1",
        "1",
        &["--state-file", state.to_str().unwrap()],
    );
    let (code, _, stderr) = finish(exec).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("--state-file"), "{stderr}");
    std::fs::write(&state, "not json {").unwrap();
    let exec = start_exec(
        "127.0.0.1:1",
        "1",
        &["--state-file", state.to_str().unwrap()],
    );
    let (code, _, stderr) = finish(exec).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("is not an exec state file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn sigterm_tears_down_and_removes_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("exec.json");
    let master = FakeMaster::bind().await;
    let exec = start_exec(
        &master.addr,
        "1",
        &["--state-file", state.to_str().unwrap()],
    );
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 1).await;
    assert!(read_state(&state).contains("\"fw-1\""));
    let pid = exec.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, _, stderr) = finish(exec).await;
    assert_eq!(code, 143, "{stderr}");
    assert!(!state.exists(), "torn down: nothing left to take over");
}
