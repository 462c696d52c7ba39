//! Lists of masters against the real binaries: with the first address of `--master` refusing
//! connections, `ringmaster-agent`, `ringmaster-exec` and `ringmaster status` move on to the
//! second (a master without replication, which stamps term 0 and is always obeyed).

mod processes;

use std::process::Command;

use processes::*;

/// A loopback address nothing listens on.
fn closed_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

#[test]
fn every_client_moves_past_an_unreachable_master() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(&config, "master:\n  allocation_interval: 5ms\n").unwrap();
    let (_master, addr, logs) = start_master(&config);
    let list = format!("{},{addr}", closed_address());
    let agent_dir = dir.path().join("agent");
    let _agent = start_agent(&list, "a1", "cpus:2;mem:512;disk:100", &agent_dir);
    wait_registered(&logs, &["a1"]);

    let (code, out) = exec(
        &list,
        &["--name", "hi", "--resources", "cpus:1;mem:64", "--", "true"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("TASK hi-0 FINISHED agent=a1"), "{out}");
    // A master without replication stamps term 0: nothing is fenced, nothing is saved.
    assert!(!agent_dir.join("leader_term").exists());

    let status = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args(["status", "agents", "--master", &list])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(text.contains("a1"), "{text}");

    // A bad entry is refused naming the flag.
    let bad = Command::new(workspace_bin("ringmaster-agent"))
        .args(["--master", &format!("{addr},nope"), "--work-dir"])
        .arg(dir.path().join("bad"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("entry `nope`: expected HOST:PORT"), "{err}");
    assert!(err.contains("--master"), "{err}");
}
