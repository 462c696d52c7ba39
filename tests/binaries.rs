//! The real binaries end to end: `ringmaster serve`, two `ringmaster-agent` processes and
//! `ringmaster-exec`, talking over loopback TCP, running real processes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Kills the child when dropped, so a failing test leaves no process behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ringmaster serve` on an ephemeral port and returns it with the address it logged.
fn start_master(config: &Path) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start ringmaster serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(pos) = line.find("addr=") {
                let addr: String = line[pos + 5..]
                    .chars()
                    .take_while(|c| !c.is_whitespace())
                    .collect();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx.recv_timeout(WAIT).expect("master logs its address");
    (Proc(child), addr)
}

fn start_agent(master: &str, id: &str, resources: &str, work_dir: &Path) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_ringmaster-agent"))
        .args([
            "--master",
            master,
            "--id",
            id,
            "--resources",
            resources,
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

/// Runs ringmaster-exec to completion (with a timeout) and returns (exit code, stdout).
fn exec(master: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmaster-exec"))
        .args(["--master", master])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringmaster-exec");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            use std::io::Read;
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            return (status.code().unwrap_or(-1), out);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("ringmaster-exec did not finish within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_agents_and_exec_run_real_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr) = start_master(&config);
    let _small = start_agent(
        &addr,
        "small",
        "cpus:1;mem:512;disk:100",
        &dir.path().join("small"),
    );
    let _big = start_agent(
        &addr,
        "big",
        "cpus:8;mem:8192;disk:100",
        &dir.path().join("big"),
    );

    // Three tasks that each write a file into their sandbox.
    let (code, out) = exec(
        &addr,
        &[
            "--name",
            "hello",
            "--resources",
            "cpus:1;mem:256",
            "--instances",
            "3",
            "--",
            "echo",
            "hi",
            "from",
            "$RINGMASTER_TASK_ID",
            ">",
            "greeting",
        ],
    );
    assert_eq!(code, 0, "{out}");
    for i in 0..3 {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("TASK hello-{i} FINISHED agent="))),
            "{out}"
        );
    }
    // The tasks really ran: their sandboxes hold what they wrote.
    let mut found = 0;
    for agent in ["small", "big"] {
        let sandboxes = dir.path().join(agent).join("sandboxes");
        if let Ok(frameworks) = std::fs::read_dir(&sandboxes) {
            for fw in frameworks.flatten() {
                for task in std::fs::read_dir(fw.path()).unwrap().flatten() {
                    let greeting = std::fs::read_to_string(task.path().join("greeting")).unwrap();
                    assert!(greeting.starts_with("hi from hello-"), "{greeting}");
                    found += 1;
                }
            }
        }
    }
    assert_eq!(found, 3);

    // A failing command: exit 1, FAILED with the exit status.
    let (code, out) = exec(
        &addr,
        &[
            "--name",
            "oops",
            "--resources",
            "cpus:0.5;mem:64",
            "--",
            "exit",
            "3",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("TASK oops-0 FAILED agent="), "{out}");
    assert!(out.contains("reason=exit_status"), "{out}");
}

#[test]
fn exec_usage_errors_exit_2() {
    let (code, _) = exec(
        "127.0.0.1:1",
        &["--name", "x", "--resources", "cpus:-1", "--", "true"],
    );
    assert_eq!(code, 2);
}
