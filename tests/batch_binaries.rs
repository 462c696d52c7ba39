//! Batch matching end to end through the real binaries: `ringmaster serve`, two
//! `ringmaster-agent` processes reporting `cpu_speed` as an attribute, and
//! `ringmaster-exec --batch FILE` running real processes.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// Kills the child when dropped, so a failing test leaves no process behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ringmaster serve`; returns it, its address, and a channel of its log lines.
fn start_master(config: &Path) -> (Proc, String, mpsc::Receiver<String>) {
    let mut master = Proc(
        Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start ringmaster serve"),
    );
    let stderr = master.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("master logs its address");
        if let Some(pos) = line.find("addr=") {
            let addr: String = line[pos + 5..]
                .chars()
                .take_while(|c| !c.is_whitespace())
                .collect();
            return (master, addr, rx);
        }
    }
}

fn start_agent(master: &str, id: &str, resources: &str, attributes: &str, work_dir: &Path) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_ringmaster-agent"))
        .args([
            "--master",
            master,
            "--id",
            id,
            "--resources",
            resources,
            "--attributes",
            attributes,
            "--work-dir",
        ])
        .arg(work_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringmaster-agent");
    Proc(child)
}

/// Waits until the master has logged `agent registered` for every id.
fn wait_registered(logs: &mpsc::Receiver<String>, ids: &[&str]) {
    let deadline = Instant::now() + WAIT;
    let mut missing: Vec<&str> = ids.to_vec();
    while !missing.is_empty() {
        let line = logs
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("agents {missing:?} did not register"));
        if line.contains("agent registered") {
            missing.retain(|id| !line.contains(&format!("agent={id} ")));
        }
    }
}

/// Runs ringmaster-exec to completion (with a timeout) and returns (exit code, stdout).
fn exec(master: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmaster-exec"))
        .args(["--master", master])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringmaster-exec");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            return (status.code().unwrap_or(-1), out);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ringmaster-exec did not finish within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exec_batch_runs_the_matched_tasks_and_reports_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let _fast = start_agent(
        &addr,
        "fast",
        "cpus:2;mem:512",
        "cpu_speed:4;unit_cost:2",
        &dir.path().join("fast"),
    );
    let _slow = start_agent(
        &addr,
        "slow",
        "cpus:2;mem:512",
        "cpu_speed:1",
        &dir.path().join("slow"),
    );
    wait_registered(&logs, &["fast", "slow"]);

    // Worked in docs/batch.md ("Through the real system"): every task prefers `fast` (4× the
    // cpu power). fast ranks urgent, urgent2, ok1, ok2 by E; it keeps urgent (1 cpu), skips
    // urgent2 (2 cpus do not fit beside it), keeps ok1. ok2 goes to slow; urgent2 can use only
    // fast (exec 0.5 s there, 2 s on slow > deadline 1 s) and is outbid.
    let batch = dir.path().join("batch.yaml");
    std::fs::write(
        &batch,
        "batch_id: burst-1
tasks:
  - { id: urgent, command: 'echo $RINGMASTER_TASK_ID > out', resources: 'cpus:1;mem:64', deadline: 1, work: 2, price: 5 }
  - { id: urgent2, command: 'true', resources: 'cpus:2;mem:64', deadline: 1, work: 2 }
  - { id: ok1, command: 'true', resources: 'cpus:1;mem:64', deadline: 10, work: 1 }
  - { id: ok2, command: 'true', resources: 'cpus:1;mem:64', deadline: 10, work: 1 }
  - { id: big, command: 'true', resources: 'cpus:16', deadline: 10, work: 1 }
  - { id: impossible, command: 'true', resources: 'cpus:1', deadline: 0.1, work: 10 }
",
    )
    .unwrap();
    let batch_arg = batch.display().to_string();
    let (code, out) = exec(&addr, &["--name", "burst", "--batch", &batch_arg]);
    // Not every task ran, so the exit code is 1.
    assert_eq!(code, 1, "{out}");
    for line in [
        "TASK urgent FINISHED agent=fast",
        "TASK ok1 FINISHED agent=fast",
        "TASK ok2 FINISHED agent=slow",
        "UNMATCHED urgent2 reason=outbid (outbid)",
        "UNMATCHED big reason=no_agent_fits (no agent fits)",
        "UNMATCHED impossible reason=deadline_impossible (deadline impossible on every agent)",
        "BATCH burst-1 matched=3 unmatched=3 proposals=5",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "missing `{line}` in:\n{out}"
        );
    }
    // The task really ran on the fast agent.
    let sandboxes = dir.path().join("fast").join("sandboxes");
    let mut found = false;
    for fw in std::fs::read_dir(&sandboxes).unwrap().flatten() {
        let written = std::fs::read_to_string(fw.path().join("urgent").join("out"));
        found |= written.is_ok_and(|w| w.trim() == "urgent");
    }
    assert!(found, "urgent's sandbox on fast holds its output");

    // A bad batch file is a usage error naming the field.
    std::fs::write(
        &batch,
        "tasks:\n  - { id: a, command: x, resources: 'cpus:1', deadline: 0, work: 1 }\n",
    )
    .unwrap();
    let (code, _) = exec(&addr, &["--name", "bad", "--batch", &batch_arg]);
    assert_eq!(code, 2);
}
