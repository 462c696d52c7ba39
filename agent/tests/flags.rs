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

#[test]
fn bad_safeguard_flags_are_refused_with_exit_code_2_and_their_range() {
    for (args, expected) in [
        (
            &["--default-task-resources", "cpus:0.1;mem:32;disk:10"][..],
            "--default-task-resources `cpus:0.1;mem:32;disk:10`: `disk` cannot be given (both \
             cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
        ),
        (
            &["--default-task-resources", "cpus:0;mem:32"],
            "--default-task-resources `cpus:0;mem:32`: `cpus` must be more than 0 (both cpus \
             and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
        ),
        (
            &["--default-task-resources", "cpus:1"],
            "--default-task-resources `cpus:1`: names no `mem` (both cpus and mem, each more \
             than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
        ),
        (
            &["--sandbox-gc-delay", "721h"],
            "--sandbox-gc-delay `721h`: out of range (0s - 720h, i.e. 30 days)",
        ),
        (
            &["--sandbox-gc-delay", "1d"],
            "--sandbox-gc-delay `1d`: unknown unit `d` (expected ms, s, m or h, e.g. `3s`)",
        ),
        (
            &["--disk-watermark", "0"],
            "--disk-watermark 0 is out of range (more than 0, at most 1)",
        ),
        (
            &["--disk-watermark", "1.5"],
            "--disk-watermark 1.5 is out of range (more than 0, at most 1)",
        ),
        (
            &["--max-task-pids", "63"],
            "--max-task-pids 63 is out of range (64 - 4194304)",
        ),
        (
            &["--max-task-pids", "4194305"],
            "--max-task-pids 4194305 is out of range (64 - 4194304)",
        ),
    ] {
        let out = agent(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!("ringmaster-agent: {expected}"),
            "{args:?}"
        );
    }
    // Not a number at all: clap refuses it, exit code 2 too.
    let out = agent(&["--disk-watermark", "most"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--disk-watermark"));
}

#[test]
fn bad_safeguard_keys_are_refused_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    for (text, expected) in [
        (
            "master: 127.0.0.1:1\ndefault_task_resources: gpus:1\n",
            ":2: default_task_resources: `gpus:1`: `gpus` cannot be given (both cpus and mem, \
             each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
        ),
        (
            "master: 127.0.0.1:1\nsandbox_gc_delay: 800h\n",
            ":2: sandbox_gc_delay: `800h`: out of range (0s - 720h, i.e. 30 days)",
        ),
        (
            "master: 127.0.0.1:1\ndisk_watermark: 2\n",
            ":2: disk_watermark: 2 is out of range (more than 0, at most 1)",
        ),
        (
            "master: 127.0.0.1:1\nmax_task_pids: 10\n",
            ":2: max_task_pids: 10 is out of range (64 - 4194304)",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = agent_alone(&["--config".as_ref(), file.as_os_str()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        let expected = format!("{}{expected}", file.display());
        assert!(stderr.contains(&expected), "{text}: {stderr}");
    }
}

#[test]
fn good_safeguard_flags_and_keys_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.yaml");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::fs::write(
        &file,
        format!(
            "master: {addr}\nwork_dir: work\nresources: cpus:1;mem:64\nisolation: none\n\
             default_task_resources: none\nsandbox_gc_delay: 0s\ndisk_watermark: 1\n\
             max_task_pids: 64\n"
        ),
    )
    .unwrap();
    connects(listener, &["--config".as_ref(), file.as_os_str()]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let work = dir.path().join("work2");
    connects(
        listener,
        &[
            "--master".as_ref(),
            addr.as_ref(),
            "--work-dir".as_ref(),
            work.as_os_str(),
            "--resources".as_ref(),
            "cpus:1;mem:64".as_ref(),
            "--isolation".as_ref(),
            "none".as_ref(),
            "--default-task-resources".as_ref(),
            "cpus:0.5;mem:128".as_ref(),
            "--sandbox-gc-delay".as_ref(),
            "720h".as_ref(),
            "--disk-watermark".as_ref(),
            "0.95".as_ref(),
            "--max-task-pids".as_ref(),
            "4194304".as_ref(),
        ],
    );
}
