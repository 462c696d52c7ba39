//! `ringmaster-exec` explains itself and cleans up, against the SDK's fake master: a task that
//! fits no offer makes it say why on stderr (again when that changes); SIGINT and SIGTERM tear
//! the framework down (the master then kills its tasks) and exit 130 / 143; its log has no
//! colour codes when stderr is not a terminal.

mod support;

use ringmaster_proto::convert::ResourcesWire;
use std::process::Stdio;
use std::time::Duration;

use ringmaster_proto::{Message, Offers, Update};
use ringmaster_sdk::{Offer, Resources, TaskState, TaskStatus};
use support::{FakeMaster, MasterSide, PATIENCE};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio::time::timeout;

const EXEC: &str = env!("CARGO_BIN_EXE_ringmaster-exec");

/// The notice is due after 3 s without a launch; allow for a slow machine.
const NOTICE_PATIENCE: Duration = Duration::from_secs(20);

fn spawn_exec(master: &str, name: &str, resources: &str, command: &[&str]) -> Child {
    Command::new(EXEC)
        .args(["--master", master, "--name", name, "--resources", resources])
        .arg("--")
        .args(command)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn offer(id: &str, agent: &str, resources: &str) -> Message {
    Message::Offers(Offers {
        offers: vec![Offer {
            offer_id: id.into(),
            agent_id: agent.into(),
            resources: Some(Resources::parse(resources).unwrap().to_wire()),
            ..Offer::default()
        }],
    })
}

/// The next line containing `needle`, within `patience`; panics with what was seen otherwise.
async fn line_with<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    needle: &str,
    patience: Duration,
) -> String {
    let mut seen = Vec::new();
    let found = timeout(patience, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(needle) {
                return Some(line);
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        _ => panic!("no line with {needle:?} within {patience:?}; saw {seen:#?}"),
    }
}

/// Skips messages until a Teardown arrives.
async fn expect_teardown(side: &mut MasterSide) {
    loop {
        if let Message::Teardown(_) = side.recv().await {
            return;
        }
    }
}

fn stderr_lines(child: &mut Child) -> Lines<BufReader<ChildStderr>> {
    BufReader::new(child.stderr.take().unwrap()).lines()
}

fn stdout_lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().unwrap()).lines()
}

#[tokio::test]
async fn a_task_that_fits_no_offer_says_why_and_again_when_that_changes() {
    let master = FakeMaster::bind().await;
    let mut child = spawn_exec(&master.addr, "big", "cpus:64;mem:128", &["true"]);
    let mut stderr = stderr_lines(&mut child);
    let (mut side, _) = master.accept_subscribed("fw-big").await;
    assert!(matches!(side.recv().await, Message::Demand(d) if d.count == 1));

    // No offer at all: one line after the grace.
    let line = line_with(&mut stderr, "waiting for an offer", NOTICE_PATIENCE).await;
    assert_eq!(
        line,
        "ringmaster-exec: waiting for an offer that fits cpus:64;mem:128: no agent offered one yet (`ringmaster status pending` on the master shows why)"
    );

    // An offer too small in cpus: declined, and the line says what it lacked.
    side.send(offer("o-1", "a-1", "cpus:8;mem:4096")).await;
    match side.recv().await {
        Message::Decline(decline) => assert_eq!(decline.offer_ids, ["o-1"]),
        other => panic!("expected Decline, got {other:?}"),
    }
    let line = line_with(&mut stderr, "waiting for an offer", NOTICE_PATIENCE).await;
    assert!(
        line.ends_with(
            "fits cpus:64;mem:128: declined offers from 1 agent, lacking cpus (`ringmaster status pending` on the master shows why)"
        ),
        "{line}"
    );

    // A fitting offer: launched, and nothing more about waiting.
    side.send(offer("o-2", "a-2", "cpus:64;mem:128")).await;
    match side.recv().await {
        Message::Accept(accept) => assert_eq!(accept.tasks[0].task_id, "big-0"),
        other => panic!("expected Accept, got {other:?}"),
    }
    side.send(Message::Update(Update {
        status: Some(TaskStatus {
            task_id: "big-0".into(),
            agent_id: "a-2".into(),
            state: TaskState::TaskFinished as i32,
            update_id: "u1".into(),
            ..TaskStatus::default()
        }),
    }))
    .await;
    expect_teardown(&mut side).await;
    let status = timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    let rest: Vec<String> = {
        let mut rest = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            rest.push(line);
        }
        rest
    };
    assert!(
        rest.iter().all(|l| !l.contains("waiting for an offer")),
        "{rest:?}"
    );
}

/// Launches `sleep 1000` on the fake master, reports it RUNNING, sends `signal` to exec and
/// expects a Teardown, exit code `code` and a line saying what exec did.
async fn signal_tears_the_framework_down(signal: &str, code: i32) {
    let name = format!("SIG{}", signal.trim_start_matches('-'));
    let master = FakeMaster::bind().await;
    let mut child = spawn_exec(&master.addr, "long", "cpus:1", &["sleep", "1000"]);
    let mut stdout = stdout_lines(&mut child);
    let mut stderr = stderr_lines(&mut child);
    let (mut side, _) = master.accept_subscribed("fw-long").await;
    assert!(matches!(side.recv().await, Message::Demand(_)));
    side.send(offer("o-1", "a-1", "cpus:2")).await;
    assert!(matches!(side.recv().await, Message::Accept(_)));
    side.send(Message::Update(Update {
        status: Some(TaskStatus {
            task_id: "long-0".into(),
            agent_id: "a-1".into(),
            state: TaskState::TaskRunning as i32,
            update_id: "u1".into(),
            ..TaskStatus::default()
        }),
    }))
    .await;
    line_with(&mut stdout, "TASK long-0 RUNNING", PATIENCE).await;

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    expect_teardown(&mut side).await;
    let line = line_with(&mut stderr, "tearing down", PATIENCE).await;
    assert_eq!(
        line,
        format!(
            "ringmaster-exec: {name}: tearing down framework fw-long; the master kills its tasks"
        )
    );
    let status = timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(code), "{signal}");
}

#[tokio::test]
async fn sigint_tears_the_framework_down_and_exits_130() {
    signal_tears_the_framework_down("-INT", 130).await;
}

#[tokio::test]
async fn sigterm_tears_the_framework_down_and_exits_143() {
    signal_tears_the_framework_down("-TERM", 143).await;
}

#[tokio::test]
async fn no_colour_codes_when_stderr_is_not_a_terminal() {
    // Nothing listens on port 1: the SDK logs a warning, then gives up.
    let output = Command::new(EXEC)
        .args([
            "--master",
            "127.0.0.1:1",
            "--name",
            "x",
            "--resources",
            "cpus:1",
            "--connect-timeout",
            "0.5",
            "--",
            "true",
        ])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .output();
    let output = timeout(Duration::from_secs(30), output)
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("WARN"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes in {stderr:?}");
}
