//! The `ringmaster-agent` binary refuses bad flags (and a bad `--config` file, with its
//! `FILE:LINE: KEY:`) at startup with exit code 2 and a message naming the problem, before it
//! touches the network or the work dir; a good config file is accepted and flags override it.

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

/// Runs the agent with only `args` (no `--master`, no `--work-dir`) and waits for its exit.
fn agent_alone(args: &[&std::ffi::OsStr]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_ringmaster-agent"))
        .args(args)
        .env("RUST_LOG", "off")
        .env_remove("RINGMASTER_MASTER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
fn a_bad_config_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    std::fs::write(
        &file,
        "master: 127.0.0.1:1\nwork_dir: work\n# comment\npids_per_task: 8\n",
    )
    .unwrap();
    let out = agent_alone(&["--config".as_ref(), file.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let expected = format!(
        "{}:4: pids_per_task: 8 is out of range (16 - 4194304)",
        file.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    std::fs::write(&file, "master: 127.0.0.1:1\nkill_grace_ms: 500\n").unwrap();
    let out = agent_alone(&["--config".as_ref(), file.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(":2: kill_grace_ms: unknown key (did you mean `kill_grace`?)"),
        "{stderr}"
    );
    // No master anywhere.
    std::fs::write(&file, "work_dir: work\n").unwrap();
    let out = agent_alone(&["--config".as_ref(), file.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the master's address is required"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("work").exists(),
        "refused before the work dir"
    );
}

/// Starts the agent with `args` and waits until it connects to `listener` (the event that
/// shows it accepted its configuration), then kills it.
fn connects(listener: std::net::TcpListener, args: &[&std::ffi::OsStr]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringmaster-agent"))
        .args(args)
        .env("RUST_LOG", "off")
        .env_remove("RINGMASTER_MASTER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (done, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(listener.accept().map(|_| ()));
    });
    let result = accepted.recv_timeout(Duration::from_secs(20));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        matches!(result, Ok(Ok(()))),
        "the agent never connected ({result:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_good_config_file_is_accepted_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::fs::write(
        &file,
        format!(
            "master: {addr}\nwork_dir: work\nresources: cpus:1;mem:64\nisolation: none\n\
             kill_grace: 1s\ngpu_sharing: mps\nattributes: {{ rack: r1 }}\n"
        ),
    )
    .unwrap();
    connects(listener, &["--config".as_ref(), file.as_os_str()]);
    // The relative work dir is the file's directory's.
    assert!(dir.path().join("work").is_dir());
    // A flag wins over the file: the file's master is unreachable, the flag's is not.
    std::fs::write(
        &file,
        "master: 127.0.0.1:1\nwork_dir: work\nresources: cpus:1;mem:64\nisolation: none\n",
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    connects(
        listener,
        &[
            "--config".as_ref(),
            file.as_os_str(),
            "--master".as_ref(),
            addr.as_ref(),
        ],
    );
}
