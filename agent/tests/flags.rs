//! The `ringmaster-agent` binary refuses bad flags at startup with exit code 2 and a message
//! naming the problem, before it touches the network or the work dir.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs the agent with `args`; an agent that accepted them (and keeps retrying a master that
/// is not there) is killed after 10 s and fails the test.
fn agent(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let work_dir = dir.path().join("work");
    let child = Command::new(env!("CARGO_BIN_EXE_ringmaster-agent"))
        .args(["--master", "127.0.0.1:1", "--work-dir"])
        .arg(&work_dir)
        .args(args)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The exit is the event waited on: a thread waits for it, the test for the thread.
    let pid = child.id();
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match exited.recv_timeout(Duration::from_secs(10)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let out = exited.recv().unwrap().unwrap();
            panic!(
                "the agent accepted {args:?} and kept running: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn an_unknown_resource_name_is_refused_with_exit_code_2() {
    let out = agent(&["--resources", "cpu:4;mem:64"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown resource `cpu` (did you mean `cpus`?)"),
        "{stderr}"
    );
    assert!(stderr.contains("--custom-resources"), "{stderr}");
}

#[test]
fn a_bad_custom_resource_name_is_refused_with_exit_code_2() {
    let out = agent(&[
        "--custom-resources",
        "fpgas,2fast",
        "--resources",
        "fpgas:1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`2fast` is not a valid resource name"),
        "{stderr}"
    );
}
