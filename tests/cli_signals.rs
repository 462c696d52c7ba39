//! The command-line processes and signals, through the real binaries: Ctrl-C on
//! `ringmaster-exec` kills its tasks in the master at once (not after the failover timeout);
//! `ringmaster local` cleans its temporary directory on SIGTERM as on Ctrl-C, and `--demo`
//! with `--hold` keeps the cluster and its dashboard up until Ctrl-C, else ends; no colour
//! codes in a log that is not a terminal. Every wait is on output or state, with a timeout.

mod processes;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use processes::*;

/// Sends `signal` (`-INT`, `-TERM`) to `child` with kill(1).
fn send_signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

/// The lines of `reader`, on a channel.
fn lines_of(reader: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The first line containing `needle` within [`WAIT`]; panics with the lines seen otherwise.
fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(_) => panic!("no line with {needle:?} within {WAIT:?}; saw {seen:#?}"),
        }
    }
}

/// Every line until the writer closes (or [`WAIT`] passes).
fn drain(lines: &mpsc::Receiver<String>) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    let mut all = Vec::new();
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        all.push(line);
    }
    all
}

/// Waits for `child` to exit within [`WAIT`]; its exit code (`None`: killed by a signal).
fn wait_exit(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            Instant::now() < deadline,
            "the process did not exit within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `ringmaster-local-*` directories in `dir`.
fn local_temp_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("ringmaster-local-"))
        .collect()
}

/// `ringmaster local ARGS` with its temporary directories under `tmp`, stdout on a channel.
fn start_local(tmp: &Path, args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args(["local", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(args)
        .env("TMPDIR", tmp)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringmaster local");
    let stdout = lines_of(child.stdout.take().unwrap());
    (Proc(child), stdout)
}

/// The HOST:PORT of the first `http://HOST:PORT/` in `line`.
fn http_address_in(line: &str) -> String {
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no http:// address in {line:?}"))
        .to_string()
}

/// The body of `GET path` from `addr` (plain HTTP/1.1), with its status line.
fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the dashboard");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

#[test]
fn ctrl_c_on_exec_kills_its_tasks_in_the_master_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let http_line = wait_for_line(&logs, "operator HTTP");
    let http = http_address_in(&http_line);
    let _agent = start_agent(
        &addr,
        "a1",
        "cpus:2;mem:512;disk:100",
        &dir.path().join("a1"),
    );
    wait_registered(&logs, &["a1"]);

    // The failover timeout stays at its default (60 s): the kill must not wait for it.
    let mut exec = Proc(
        Command::new(workspace_bin("ringmaster-exec"))
            .args([
                "--master",
                &addr,
                "--name",
                "sleeper",
                "--resources",
                "cpus:1;mem:64",
            ])
            .args(["--", "sleep", "1000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ringmaster-exec"),
    );
    let stdout = lines_of(exec.0.stdout.take().unwrap());
    let stderr = lines_of(exec.0.stderr.take().unwrap());
    wait_for_line(&stdout, "TASK sleeper-0 RUNNING");

    let interrupted = Instant::now();
    send_signal(&exec.0, "-INT");
    assert_eq!(wait_exit(&mut exec.0), Some(130));
    let said = wait_for_line(&stderr, "SIGINT");
    assert!(said.contains("tearing down framework"), "{said}");

    // The master killed the task, long before the 60 s failover timeout.
    let deadline = interrupted + Duration::from_secs(20);
    loop {
        let snapshot = ringmaster::status::fetch(&http).expect("/state");
        let task = snapshot.tasks.iter().find(|t| t.id == "sleeper-0");
        if task.is_some_and(|t| t.state.contains("KILLED")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sleeper-0 not KILLED 20 s after SIGINT: {task:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_logs_without_colour_codes_when_stderr_is_not_a_terminal() {
    let mut master = Proc(
        Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["serve", "--listen", "127.0.0.1:0", "--http", "none"])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .env_remove("CLICOLOR_FORCE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ringmaster serve"),
    );
    let logs = lines_of(master.0.stderr.take().unwrap());
    let line = wait_for_line(&logs, "master listening");
    assert!(!line.contains('\u{1b}'), "colour codes in {line:?}");
}

#[test]
fn sigterm_on_local_removes_its_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut local, stdout) = start_local(tmp.path(), &["--agents", "1"]);
    wait_for_line(&stdout, "Ctrl-C stops.");
    assert_eq!(local_temp_dirs(tmp.path()).len(), 1);
    send_signal(&local.0, "-TERM");
    assert_eq!(wait_exit(&mut local.0), Some(0));
    assert_eq!(local_temp_dirs(tmp.path()), Vec::<String>::new());
}

#[test]
fn local_demo_holds_the_dashboard_until_ctrl_c() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut local, stdout) = start_local(tmp.path(), &["--demo", "--hold"]);
    let line = wait_for_line(&stdout, "demo done; dashboard at http://");
    assert!(line.ends_with("/ — Ctrl-C to stop"), "{line}");
    let http = http_address_in(&line);
    // Still up, and the dashboard answers.
    assert!(
        local.0.try_wait().unwrap().is_none(),
        "local ended after the demo"
    );
    let response = http_get(&http, "/");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    send_signal(&local.0, "-INT");
    assert_eq!(wait_exit(&mut local.0), Some(0));
    assert_eq!(local_temp_dirs(tmp.path()), Vec::<String>::new());
}

#[test]
fn local_demo_without_hold_ends_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut local, stdout) = start_local(tmp.path(), &["--demo"]);
    assert_eq!(wait_exit(&mut local.0), Some(0));
    let printed = drain(&stdout);
    assert!(
        printed.iter().any(|l| l.starts_with("FRAMEWORK")),
        "{printed:#?}"
    );
    assert!(
        printed.iter().all(|l| !l.contains("demo done")),
        "{printed:#?}"
    );
    assert_eq!(local_temp_dirs(tmp.path()), Vec::<String>::new());
}
