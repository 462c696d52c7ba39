//! The `ringmaster-exec` binary: usage errors exit 2 with a one-line message, and a run against
//! the SDK's fake master prints the state lines and exits 0.

mod support;

use ringmaster_proto::convert::ResourcesWire;
use std::process::Stdio;

use ringmaster_proto::{Message, Offers, Update};
use ringmaster_sdk::{Offer, Resources, TaskState, TaskStatus};
use support::{FakeMaster, PATIENCE};
use tokio::process::Command;
use tokio::time::timeout;

const EXEC: &str = env!("CARGO_BIN_EXE_ringmaster-exec");

async fn usage_error(extra: &[&str]) -> String {
    let output = Command::new(EXEC)
        .args(["--master", "127.0.0.1:1", "--name", "job"])
        .args(extra)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{extra:?}");
    assert!(output.stdout.is_empty());
    String::from_utf8(output.stderr).unwrap()
}

#[tokio::test]
async fn usage_errors_exit_two_with_a_clear_message() {
    let stderr = usage_error(&["--resources", "cpus:two", "--", "true"]).await;
    assert!(
        stderr.contains("--resources") && stderr.contains("cpus:two"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let stderr = usage_error(&["--resources", "cpus:1", "--instances", "0", "--", "true"]).await;
    assert!(stderr.contains("--instances"), "{stderr}");
    let stderr = usage_error(&["--resources", "cpus:1", "--", " "]).await;
    assert!(stderr.contains("command"), "{stderr}");
    let stderr = usage_error(&["--resources", "cpus:1"]).await; // clap: no command
    assert!(stderr.contains("COMMAND"), "{stderr}");
}

#[tokio::test]
async fn runs_a_task_and_exits_zero_when_it_finishes() {
    let master = FakeMaster::bind().await;
    let child = Command::new(EXEC)
        .args([
            "--master",
            &master.addr,
            "--name",
            "cli",
            "--resources",
            "cpus:1;mem:64",
        ])
        .args(["--", "echo", "hi"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let (mut side, subscribe) = master.accept_subscribed("fw-cli").await;
    assert_eq!(subscribe.name, "cli");
    assert!(matches!(side.recv().await, Message::Demand(d) if d.count == 1));
    side.send(Message::Offers(Offers {
        offers: vec![Offer {
            offer_id: "o-1".into(),
            agent_id: "a-1".into(),
            resources: Some(Resources::parse("cpus:2;mem:64").unwrap().to_wire()),
            ..Offer::default()
        }],
    }))
    .await;
    match side.recv().await {
        Message::Accept(accept) => {
            assert_eq!(accept.tasks.len(), 1);
            assert_eq!(accept.tasks[0].task_id, "cli-0");
            assert_eq!(accept.tasks[0].command, "echo hi");
        }
        other => panic!("expected Accept, got {other:?}"),
    }
    for (state, update_id) in [
        (TaskState::TaskRunning, "u1"),
        (TaskState::TaskFinished, "u2"),
    ] {
        side.send(Message::Update(Update {
            status: Some(TaskStatus {
                task_id: "cli-0".into(),
                agent_id: "a-1".into(),
                state: state as i32,
                update_id: update_id.into(),
                ..TaskStatus::default()
            }),
        }))
        .await;
    }
    loop {
        if let Message::Teardown(_) = side.recv().await {
            break;
        }
    }
    let output = timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        "TASK cli-0 RUNNING agent=a-1\nTASK cli-0 FINISHED agent=a-1\n"
    );
}
