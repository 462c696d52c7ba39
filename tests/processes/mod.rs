//! Helpers for tests of the real binaries: start `ringmaster serve`, agents and
//! `ringmaster-exec` as processes that are killed when dropped; every wait has a timeout.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const WAIT: Duration = Duration::from_secs(30);

/// The path of `name`, a binary of another workspace package (`ringmaster-agent` of the agent
/// crate, `ringmaster-exec` of the SDK). Cargo sets `CARGO_BIN_EXE_<name>` only for this
/// package's own binaries and does not build other packages' binaries for its tests, so the
/// binary is looked up next to `ringmaster` (the same target directory), where
/// `cargo test --workspace` and `cargo build --workspace` put it. Panics if it is not there.
pub fn workspace_bin(name: &str) -> PathBuf {
    let ringmaster = Path::new(env!("CARGO_BIN_EXE_ringmaster"));
    let bin = ringmaster.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{name} not found at {}: it is a binary of another workspace package; \
         build it first: cargo build --workspace (cargo test --workspace does it too)",
        bin.display()
    );
    bin
}

/// Kills the child when dropped, so a failing test leaves no process behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ringmaster serve`; returns it, its address, and a channel of its log lines.
pub fn start_master(config: &Path) -> (Proc, String, mpsc::Receiver<String>) {
    start_master_with(config, "127.0.0.1:0", &[])
}

/// A loopback port free right now (for a master that must come back on the same address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// As [`start_master`], listening on `listen`, with `extra` flags (e.g. `--work-dir DIR`).
pub fn start_master_with(
    config: &Path,
    listen: &str,
    extra: &[&str],
) -> (Proc, String, mpsc::Receiver<String>) {
    let mut master = Proc(
        Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["serve", "--listen", listen, "--config"])
            .arg(config)
            .args(extra)
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

/// Starts `ringmaster-agent` with `extra` flags (e.g. `--attributes`) before the usual ones.
pub fn start_agent_with(
    master: &str,
    id: &str,
    resources: &str,
    work_dir: &Path,
    extra: &[&str],
) -> Proc {
    // Tests read ended tasks' sandboxes: never collect them early because the build machine's
    // disk is nearly full (the watermark is tested in agent/tests/disk.rs).
    let watermark: &[&str] = if extra.contains(&"--disk-watermark") {
        &[]
    } else {
        &["--disk-watermark", "1"]
    };
    let child = Command::new(workspace_bin("ringmaster-agent"))
        .args(extra)
        .args(watermark)
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

pub fn start_agent(master: &str, id: &str, resources: &str, work_dir: &Path) -> Proc {
    start_agent_with(master, id, resources, work_dir, &[])
}

/// Waits until the master has logged `agent registered` for every id.
pub fn wait_registered(logs: &mpsc::Receiver<String>, ids: &[&str]) {
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
pub fn exec(master: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(workspace_bin("ringmaster-exec"))
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

/// Real Unix users for `ringmaster-exec --user`, which is also the user its tasks run as on the
/// agent (docs/security.md, "Task users"): two distinct system users when the tests run as
/// root (a root agent switches to them), else only the tests' own user (an agent that is not
/// root runs tasks only as itself).
pub fn exec_users() -> Vec<String> {
    if ringmaster_agent::users::agent_uid() == 0 {
        vec!["daemon".to_string(), "bin".to_string()]
    } else {
        vec![ringmaster_agent::users::default_task_user()]
    }
}

/// Runs `ringmaster job ARGS --master HTTP`: (exit code, stdout, stderr).
pub fn job(http: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .arg("job")
        .args(args)
        .args(["--master", http])
        .output()
        .expect("run ringmaster job");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn status_json(http: &str, name: &str) -> serde_json::Value {
    let (code, out, err) = job(http, &["status", name, "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).expect("job status --json is JSON")
}

/// Polls `job status NAME --json` until `cond` holds.
pub fn status_when(
    http: &str,
    name: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    status_when_as(http, name, &[], what, cond)
}

/// [`status_when`] with environment `env` for the CLI (e.g. its credential).
pub fn status_when_as(
    http: &str,
    name: &str,
    env: &[(&str, &Path)],
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, out, err) = job_with_env(http, &["status", name, "--json"], env);
        assert_eq!(code, 0, "{err}");
        let status: serde_json::Value =
            serde_json::from_str(&out).expect("job status --json is JSON");
        if cond(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}: last status {status:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for a line satisfying `want` on `lines`, collecting every line into `seen`.
pub fn wait_line(
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    mut want: impl FnMut(&[String]) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !want(seen) {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => seen.push(line),
            Err(_) => panic!(
                "timed out waiting for {what}; seen so far:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// How many `TASK <id> <STATE>` lines of ringmaster-exec in `seen` have `state`.
pub fn count_state(seen: &[String], state: &str) -> usize {
    seen.iter()
        .filter(|l| l.starts_with("TASK ") && l.split_whitespace().nth(2) == Some(state))
        .count()
}

/// Starts `command` with its stdout piped: the process and a channel of its stdout lines.
pub fn spawn_with_lines(mut command: Command) -> (Proc, mpsc::Receiver<String>) {
    let mut child = Proc(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the process"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

/// A master's log lines: the channel and what was read from it so far.
pub type MasterLog = (mpsc::Receiver<String>, Vec<String>);

/// Starts `n` replicated masters (`cluster:` with ids 1..=n on free loopback ports, a 500 ms
/// election timeout, each with its own work dir under `dir`), each given `extra` flags: their
/// comma-separated protocol addresses, the processes and their logs by id.
pub fn start_group(
    dir: &Path,
    n: u64,
    extra: &[&str],
) -> (
    String,
    std::collections::BTreeMap<u64, Proc>,
    std::collections::BTreeMap<u64, MasterLog>,
) {
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    start_group_with(dir, n, "", |_| extra.clone())
}

/// [`start_group`] with `yaml` appended to every master's config and `args(id)` as each one's
/// extra flags.
pub fn start_group_with(
    dir: &Path,
    n: u64,
    yaml: &str,
    args: impl Fn(u64) -> Vec<String>,
) -> (
    String,
    std::collections::BTreeMap<u64, Proc>,
    std::collections::BTreeMap<u64, MasterLog>,
) {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let list = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut masters = std::collections::BTreeMap::new();
    let mut logs = std::collections::BTreeMap::new();
    for id in 1..=n {
        let config = dir.join(format!("master{id}.yaml"));
        let mut text = String::from(
            "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n  \
             agent_reregister_timeout: 30s\ncluster:\n",
        );
        text.push_str(&format!(
            "  id: {id}\n  election_timeout: 500ms\n  peers:\n"
        ));
        for (i, port) in ports.iter().enumerate() {
            text.push_str(&format!("    {}: 127.0.0.1:{port}\n", i + 1));
        }
        text.push_str(yaml);
        std::fs::write(&config, text).unwrap();
        let work = dir.join(format!("master{id}"));
        let listen = format!("127.0.0.1:{}", ports[id as usize - 1]);
        let mut flags = vec!["--work-dir".to_string(), work.to_str().unwrap().to_string()];
        flags.extend(args(id));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (proc, _, rx) = start_master_with(&config, &listen, &flags);
        masters.insert(id, proc);
        logs.insert(id, (rx, Vec::new()));
    }
    (list, masters, logs)
}

/// Runs `ringmaster job ARGS --master HTTP` with environment `env` (e.g. the credential's
/// `RINGMASTER_PRINCIPAL` and `RINGMASTER_SECRET_FILE`): (exit code, stdout, stderr).
pub fn job_with_env(http: &str, args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringmaster"));
    command.arg("job").args(args).args(["--master", http]);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().expect("run ringmaster job");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The task ids of a job's running instances in `job status --json`, sorted.
pub fn running_tasks(status: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "running")
        .filter_map(|i| i["task_id"].as_str().map(String::from))
        .collect();
    ids.sort();
    ids
}

/// The `pid` file of the newest run of task `task` under the agent's work dir.
pub fn pid_of(work_dir: &Path, task: &str) -> Option<i32> {
    let sandboxes = work_dir.join("sandboxes");
    for fw in std::fs::read_dir(&sandboxes).ok()?.flatten() {
        let id = fw.file_name().to_string_lossy().into_owned();
        let run = ringmaster_agent::sandbox::latest_run_dir(work_dir, &id, task);
        if let Ok(text) = std::fs::read_to_string(run.join("pid")) {
            return text.trim().parse().ok();
        }
    }
    None
}

/// How many runs task `task` has had on the agent (a relaunch makes a second).
pub fn runs_of(work_dir: &Path, task: &str) -> usize {
    let sandboxes = work_dir.join("sandboxes");
    let Ok(frameworks) = std::fs::read_dir(&sandboxes) else {
        return 0;
    };
    frameworks
        .flatten()
        .map(|fw| {
            fw.path()
                .join(ringmaster_agent::sandbox::escape_component(task))
        })
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .map(|runs| runs.count())
        .sum()
}
