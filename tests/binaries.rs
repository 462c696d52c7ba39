//! The real binaries end to end: `ringmaster serve`, two `ringmaster-agent` processes and
//! `ringmaster-exec`, talking over loopback TCP, running real processes.

mod processes;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use processes::*;

#[test]
fn serve_agents_and_exec_run_real_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr, _logs) = start_master(&config);
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
                for run in std::fs::read_dir(fw.path())
                    .unwrap()
                    .flatten()
                    .flat_map(|task| std::fs::read_dir(task.path()).unwrap().flatten())
                {
                    let greeting = std::fs::read_to_string(run.path().join("greeting")).unwrap();
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

/// An agent larger than `master.max_agent_resources` stops at once, exit 1, with the master's
/// reason on stderr (it used to retry forever, logging "master unreachable").
#[test]
fn an_agent_above_max_agent_resources_exits_1_with_the_masters_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(&config, "master:\n  max_agent_resources: \"cpus:4\"\n").unwrap();
    let (_master, addr, _logs) = start_master(&config);
    let mut agent = Proc(
        Command::new(workspace_bin("ringmaster-agent"))
            .args([
                "--master",
                &addr,
                "--id",
                "big",
                "--resources",
                "cpus:8;mem:128",
            ])
            .arg("--work-dir")
            .arg(dir.path().join("big"))
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ringmaster-agent"),
    );
    // Its stderr reaches its end when it exits (it started no task to hold it open).
    let mut pipe = agent.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        let _ = tx.send(text);
    });
    let stderr = rx
        .recv_timeout(WAIT)
        .expect("the refused agent kept retrying");
    let status = agent.0.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "ringmaster-agent: master refused us with AGENT_REFUSED: RegisterAgent: `cpus` 8 \
             is above the limit 4 of master.max_agent_resources"
        ),
        "{stderr}"
    );
}

#[test]
fn exec_usage_errors_exit_2() {
    let (code, _) = exec(
        "127.0.0.1:1",
        &["--name", "x", "--resources", "cpus:-1", "--", "true"],
    );
    assert_eq!(code, 2);
}

/// Starts ringmaster-exec in the background; its stdout lines arrive on the channel.
fn spawn_exec(master: &str, args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
    let mut child = Command::new(workspace_bin("ringmaster-exec"))
        .args(["--master", master])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringmaster-exec");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Proc(child), rx)
}

/// Waits (up to `WAIT`) for a line containing every one of `words`; returns it.
fn wait_line(lines: &mpsc::Receiver<String>, words: &[&str]) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if words.iter().all(|w| line.contains(w)) => return line,
            Ok(_) => {}
            Err(e) => panic!("no line with {words:?} within {WAIT:?}: {e}"),
        }
    }
}

/// SPEC seed 003 through the real binaries: a base-priority `ringmaster-exec` (user bob, no
/// priority) holds the only GPU agent of partition `gpu`; alice (priority 10, quota gpus:4)
/// runs a high-priority one that preempts it: bob's task ends KILLED reason=preempted and
/// alice's runs to FINISHED on that agent. `--user` is also the tasks' Unix user, so alice and
/// bob are real system users (`exec_users`); two of them need root.
#[test]
fn high_priority_exec_preempts_a_low_priority_one() {
    let users = exec_users();
    let [alice, bob] = users.as_slice() else {
        println!("skipped: needs root (two distinct task users)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        format!(
            "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n\
             priorities:\n  partitions: [default, gpu]\n  users:\n    {alice}: {{ gpu: {{ priority: 10, quota: \"gpus:4\" }} }}\n"
        ),
    )
    .unwrap();
    let (_master, addr, _logs) = start_master(&config);
    let _gpu = start_agent_with(
        &addr,
        "g1",
        "cpus:2;mem:512;gpus:4",
        &dir.path().join("g1"),
        &["--attributes", "partition:gpu"],
    );
    // A default-partition agent with room: never used by the gpu frameworks.
    let _cpu = start_agent(
        &addr,
        "c1",
        "cpus:8;mem:8192;gpus:8",
        &dir.path().join("c1"),
    );

    let common = ["--partition", "gpu", "--resources", "cpus:1;mem:64;gpus:4"];
    let low_args: Vec<&str> = ["--name", "low", "--user", bob]
        .into_iter()
        .chain(common)
        .chain(["--", "sleep", "600"])
        .collect();
    let (mut low, low_lines) = spawn_exec(&addr, &low_args);
    let line = wait_line(&low_lines, &["TASK low-0 RUNNING"]);
    assert!(line.contains("agent=g1"), "{line}");

    let high_args: Vec<&str> = ["--name", "high", "--user", alice]
        .into_iter()
        .chain(common)
        .chain(["--", "true"])
        .collect();
    let (code, out) = exec(&addr, &high_args);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("TASK high-0 FINISHED agent=g1"), "{out}");
    let line = wait_line(&low_lines, &["TASK low-0 KILLED"]);
    assert!(line.contains("reason=preempted"), "{line}");
    // The low-priority exec ends with exit code 1 (a task did not finish).
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = low.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "low exec did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
}
