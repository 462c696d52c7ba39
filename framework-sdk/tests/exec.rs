//! The `ringmaster-exec` binary end to end against the fake master: demand, offers filled or
//! declined, suppression, one line per state change, teardown and the exit code.

mod support;

use ringmaster_proto::convert::ResourcesWire;
use std::process::Stdio;

use ringmaster_proto::{Message, Offers, Update};
use ringmaster_sdk::{Offer, Resources, TaskInfo, TaskState, TaskStatus};
use support::*;
use tokio::process::{Child, Command};
use tokio::time::timeout;

/// Starts `ringmaster-exec` against `master` running `echo hello` as `instances` tasks of
/// `cpus:1;mem:128`, with `extra` flags; its stdout is piped.
fn start_exec(master: &str, instances: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringmaster-exec"))
        .args([
            "--master",
            master,
            "--name",
            "job",
            "--resources",
            "cpus:1;mem:128",
        ])
        .args(["--instances", instances])
        .args(extra)
        .args(["--", "echo", "hello"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start ringmaster-exec")
}

/// Waits for `ringmaster-exec` to exit; returns its exit code and stdout.
async fn finish(child: Child) -> (i32, String) {
    let output = timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("ringmaster-exec exits")
        .unwrap();
    let code = output.status.code().unwrap_or(-1);
    let stdout = String::from_utf8(output.stdout).unwrap();
    (code, stdout)
}

fn offer(id: &str, agent: &str, resources: &str) -> Offer {
    Offer {
        offer_id: id.into(),
        agent_id: agent.into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        ..Offer::default()
    }
}

async fn expect_demand(side: &mut MasterSide, count: u32) {
    match side.recv().await {
        Message::Demand(demand) => {
            assert_eq!(demand.count, count);
            assert_eq!(
                Resources::from_wire(demand.resources.as_ref()).unwrap(),
                Resources::parse("cpus:1;mem:128").unwrap()
            );
        }
        other => panic!("expected Demand {count}, got {other:?}"),
    }
}

async fn expect_accept(side: &mut MasterSide, offer_id: &str) -> Vec<TaskInfo> {
    match side.recv().await {
        Message::Accept(accept) => {
            assert_eq!(accept.offer_id, offer_id);
            accept.tasks
        }
        other => panic!("expected Accept of {offer_id}, got {other:?}"),
    }
}

async fn expect_ack(side: &mut MasterSide, update_id: &str) {
    assert!(
        matches!(side.recv().await, Message::StatusAck(ack) if ack.update_id == update_id),
        "expected the ack of {update_id}"
    );
}

#[tokio::test]
async fn exec_fills_offers_prints_states_and_exits_zero() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "3", &[]);

    let (mut side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.name, "job");
    expect_demand(&mut side, 3).await;

    // Too small, room for two, then room for one more than needed.
    side.send(Message::Offers(Offers {
        offers: vec![
            offer("o-small", "a-1", "cpus:0.5;mem:1024"),
            offer("o-two", "a-2", "cpus:2.5;mem:300"),
        ],
    }))
    .await;
    let tasks = expect_accept(&mut side, "o-two").await;
    let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, ["job-0", "job-1"]);
    assert!(tasks.iter().all(|t| t.command == "echo hello"));
    assert!(matches!(side.recv().await, Message::Decline(d) if d.offer_ids == ["o-small"]));
    expect_demand(&mut side, 1).await;

    side.send(Message::Offers(Offers {
        offers: vec![offer("o-big", "a-3", "cpus:8;mem:8192")],
    }))
    .await;
    let tasks = expect_accept(&mut side, "o-big").await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].task_id, "job-2");
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));

    let script = [
        ("job-0", "a-2", TaskState::TaskRunning, "u1"),
        ("job-1", "a-2", TaskState::TaskRunning, "u2"),
        ("job-0", "a-2", TaskState::TaskRunning, "u3"), // no change: no line
        ("job-2", "a-3", TaskState::TaskRunning, "u4"),
        ("job-0", "a-2", TaskState::TaskFinished, "u5"),
        ("job-1", "a-2", TaskState::TaskFinished, "u6"),
        ("job-2", "a-3", TaskState::TaskFinished, "u7"),
    ];
    for (task, agent, state, update_id) in script {
        side.send(update(task, agent, state, "", update_id)).await;
        expect_ack(&mut side, update_id).await;
    }
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 0);
    assert_eq!(
        output,
        "TASK job-0 RUNNING agent=a-2\n\
         TASK job-1 RUNNING agent=a-2\n\
         TASK job-2 RUNNING agent=a-3\n\
         TASK job-0 FINISHED agent=a-2\n\
         TASK job-1 FINISHED agent=a-2\n\
         TASK job-2 FINISHED agent=a-3\n"
    );
}

#[tokio::test]
async fn exec_exits_one_when_a_task_fails() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "1", &[]);

    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 1).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:1;mem:128")],
    }))
    .await;
    expect_accept(&mut side, "o-1").await;
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    side.send(update(
        "job-0",
        "a-1",
        TaskState::TaskFailed,
        "exit_status",
        "u1",
    ))
    .await;
    expect_ack(&mut side, "u1").await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 1);
    assert_eq!(output, "TASK job-0 FAILED agent=a-1 reason=exit_status\n");
}

#[tokio::test]
async fn exec_reconciles_its_open_tasks_after_a_reconnect() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "1", &[]);

    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 1).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:1;mem:128")],
    }))
    .await;
    expect_accept(&mut side, "o-1").await;
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    drop(side);

    let (mut side, subscribe) = master.accept_subscribed("fw-1").await;
    assert_eq!(subscribe.framework_id, "fw-1");
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    assert!(matches!(side.recv().await, Message::Reconcile(r) if r.task_ids == ["job-0"]));
    side.send(update("job-0", "a-1", TaskState::TaskFinished, "", ""))
        .await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    assert_eq!(
        finish(running).await,
        (0, "TASK job-0 FINISHED agent=a-1\n".into())
    );
}

#[tokio::test]
async fn exec_reports_an_unreachable_master_with_exit_one() {
    let master = FakeMaster::bind().await;
    let addr = master.addr.clone();
    drop(master);
    let exec = start_exec(&addr, "1", &["--connect-timeout", "0.3"]);
    assert_eq!(finish(exec).await, (1, String::new()));
}

#[tokio::test]
async fn exec_refuses_bad_usage_with_exit_two() {
    // A later --resources overrides start_exec's.
    let exec = start_exec("127.0.0.1:1", "1", &["--resources", "cpus:lots"]);
    assert_eq!(finish(exec).await, (2, String::new()));
}

#[tokio::test]
async fn exec_reconciles_when_an_accept_is_refused() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "1", &[]);

    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 1).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:1;mem:128")],
    }))
    .await;
    expect_accept(&mut side, "o-1").await;
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    side.send(Message::Error(ringmaster_sdk::ProtoError::new(
        ringmaster_sdk::ErrorCode::InvalidOffer,
        "offer o-1 expired",
    )))
    .await;
    assert!(matches!(side.recv().await, Message::Reconcile(r) if r.task_ids == ["job-0"]));
    side.send(update("job-0", "", TaskState::TaskLost, "unknown_task", ""))
        .await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 1);
    assert_eq!(output, "TASK job-0 LOST agent= reason=unknown_task\n");
}

/// Starts exec with one task, has it offered and accepted, and returns the master's side.
async fn one_task_launched(master: &FakeMaster) -> MasterSide {
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 1).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:1;mem:128")],
    }))
    .await;
    expect_accept(&mut side, "o-1").await;
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    side
}

#[tokio::test]
async fn exec_accepts_a_task_lost_with_its_agent_coming_back_and_finishing() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "1", &[]);
    let mut side = one_task_launched(&master).await;
    let script = [
        (TaskState::TaskRunning, "", "u1"),
        // The agent missed its heartbeats (a paused agent), then came back with the task.
        (TaskState::TaskLost, "agent_lost", "u2"),
        (TaskState::TaskRunning, "agent_reregistered", "u3"),
        (TaskState::TaskFinished, "", "u4"),
    ];
    for (state, reason, update_id) in script {
        side.send(update("job-0", "a-1", state, reason, update_id))
            .await;
        // Before the fix exec tore down right after the LOST: its Teardown came here instead.
        expect_ack(&mut side, update_id).await;
    }
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 0, "{output}");
    assert_eq!(
        output,
        "TASK job-0 RUNNING agent=a-1\n\
         TASK job-0 LOST agent=a-1 reason=agent_lost\n\
         TASK job-0 RUNNING agent=a-1 reason=agent_reregistered\n\
         TASK job-0 FINISHED agent=a-1\n"
    );
}

#[tokio::test]
async fn exec_with_no_lost_grace_gives_up_on_a_lost_task_at_once() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "1", &["--lost-grace", "0"]);
    let mut side = one_task_launched(&master).await;
    side.send(update(
        "job-0",
        "a-1",
        TaskState::TaskLost,
        "agent_lost",
        "u1",
    ))
    .await;
    expect_ack(&mut side, "u1").await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 1);
    assert_eq!(output, "TASK job-0 LOST agent=a-1 reason=agent_lost\n");
}

#[tokio::test]
async fn exec_sets_the_kill_grace_on_every_task() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "2", &["--kill-grace", "5s"]);
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 2).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:2;mem:256")],
    }))
    .await;
    let tasks = expect_accept(&mut side, "o-1").await;
    let graces: Vec<u64> = tasks.iter().map(|t| t.kill_grace_ms).collect();
    assert_eq!(graces, [5000, 5000]);
    drop(side);
    drop(running);
}

#[tokio::test]
async fn exec_refuses_a_kill_grace_out_of_range() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringmaster-exec"))
        .args(["--master", "127.0.0.1:1", "--name", "job"])
        .args(["--resources", "cpus:1", "--kill-grace", "2h", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--kill-grace must be from 0s to 10m"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_failed_line_has_the_exit_code_or_signal_and_the_message() {
    let master = FakeMaster::bind().await;
    let running = start_exec(&master.addr, "2", &[]);
    let (mut side, _) = master.accept_subscribed("fw-1").await;
    expect_demand(&mut side, 2).await;
    side.send(Message::Offers(Offers {
        offers: vec![offer("o-1", "a-1", "cpus:2;mem:256")],
    }))
    .await;
    expect_accept(&mut side, "o-1").await;
    expect_demand(&mut side, 0).await;
    assert!(matches!(side.recv().await, Message::Suppress(_)));
    let failed = |task: &str, reason: &str, code: Option<i32>, message: &str, id: &str| {
        Message::Update(Update {
            status: Some(TaskStatus {
                task_id: task.into(),
                agent_id: "a-1".into(),
                state: TaskState::TaskFailed as i32,
                reason: reason.into(),
                exit_code: code,
                message: message.into(),
                update_id: id.into(),
                ..TaskStatus::default()
            }),
        })
    };
    side.send(failed(
        "job-0",
        "exit_status",
        Some(3),
        "exited with status 3\nstderr: no such file",
        "u1",
    ))
    .await;
    expect_ack(&mut side, "u1").await;
    side.send(failed(
        "job-1",
        "memory_limit",
        None,
        "memory limit 32 MiB exceeded (killed by SIGKILL (9))",
        "u2",
    ))
    .await;
    expect_ack(&mut side, "u2").await;
    assert!(matches!(side.recv().await, Message::Teardown(_)));
    let (code, output) = finish(running).await;
    assert_eq!(code, 1);
    assert_eq!(
        output,
        "TASK job-0 FAILED agent=a-1 reason=exit_status exit_code=3 message=exited with status 3\n    \
         | stderr: no such file\n\
         TASK job-1 FAILED agent=a-1 reason=memory_limit signal=SIGKILL \
         message=memory limit 32 MiB exceeded (killed by SIGKILL (9))\n"
    );
}
