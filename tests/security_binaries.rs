//! The real binaries with TLS and authentication on: `ringmaster certs` writes the
//! certificates, `ringmaster serve` requires TLS and credentials, `ringmaster-agent` and
//! `ringmaster-exec` connect with `--tls-ca --principal --secret-file` and run a real task; a
//! wrong secret makes `ringmaster-exec` fail at once with a clear message.

mod processes;

use std::process::{Command, Stdio};

use processes::*;

#[test]
fn tls_and_auth_end_to_end_with_the_real_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args(["certs", "--out"])
        .arg(&certs)
        .args(["--san", "master.internal"])
        .output()
        .expect("run ringmaster certs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("master.pem") && stdout.contains("master.internal"),
        "{stdout}"
    );

    ringmaster_proto::files::write_private(&dir.path().join("agents.secret"), "agent-secret\n")
        .unwrap();
    ringmaster_proto::files::write_private(&dir.path().join("exec.secret"), "exec-secret\n")
        .unwrap();
    ringmaster_proto::files::write_private(&dir.path().join("wrong.secret"), "guess\n").unwrap();
    // `--user` is also the tasks' Unix user on the agent: a real one.
    let alice = exec_users().remove(0);
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        format!(
            "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n\
             tls:\n  cert: certs/master.pem\n  key: certs/master.key\n\
             auth:\n  required: true\n  principals:\n\
             \x20   agents: {{ secret_file: agents.secret, roles: [agent] }}\n\
             \x20   batch: {{ secret_file: exec.secret, roles: [framework], users: [{alice}] }}\n"
        ),
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let ca = certs.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let agent_secret = dir.path().join("agents.secret");
    let _agent = start_agent_with(
        &addr,
        "secure-agent",
        "cpus:2;mem:1024;disk:100",
        &dir.path().join("agent"),
        &[
            "--tls-ca",
            ca,
            "--principal",
            "agents",
            "--secret-file",
            agent_secret.to_str().unwrap(),
        ],
    );
    wait_registered(&logs, &["secure-agent"]);

    let exec_secret = dir.path().join("exec.secret");
    let (code, out) = exec(
        &addr,
        &[
            "--tls-ca",
            ca,
            "--principal",
            "batch",
            "--secret-file",
            exec_secret.to_str().unwrap(),
            "--user",
            &alice,
            "--name",
            "secure",
            "--resources",
            "cpus:1;mem:128",
            "--instances",
            "2",
            "--",
            // The task runs as the exec's --user: TaskInfo.user reaches the agent.
            &format!("test -d . && [ \"$(id -un)\" = {alice} ]"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    for i in 0..2 {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("TASK secure-{i} FINISHED agent=secure-agent"))),
            "{out}"
        );
    }

    // A wrong secret: exit 1 at once, saying why (not a retry loop until the timeout).
    let wrong = dir.path().join("wrong.secret");
    let refused = Command::new(workspace_bin("ringmaster-exec"))
        .args([
            "--master",
            &addr,
            "--tls-ca",
            ca,
            "--principal",
            "batch",
            "--secret-file",
        ])
        .arg(&wrong)
        .args([
            "--user",
            &alice,
            "--name",
            "nope",
            "--resources",
            "cpus:1",
            "--connect-timeout",
            "20",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run ringmaster-exec");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AUTHENTICATION_FAILED"), "{stderr}");

    // Without --tls-ca the plain client is told the master wants TLS.
    let plain = Command::new(workspace_bin("ringmaster-exec"))
        .args(["--master", &addr, "--principal", "batch", "--secret-file"])
        .arg(&exec_secret)
        .args([
            "--user",
            &alice,
            "--name",
            "plain",
            "--resources",
            "cpus:1",
            "--connect-timeout",
            "20",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run ringmaster-exec");
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(plain.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("TLS_REQUIRED"), "{stderr}");

    // An agent with a wrong secret stops (exit 1) instead of retrying forever.
    let agent = Command::new(workspace_bin("ringmaster-agent"))
        .args([
            "--master",
            &addr,
            "--tls-ca",
            ca,
            "--principal",
            "agents",
            "--secret-file",
        ])
        .arg(&wrong)
        .args(["--resources", "cpus:1;mem:128;disk:10", "--work-dir"])
        .arg(dir.path().join("bad-agent"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringmaster-agent");
    let mut agent = Proc(agent);
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent kept retrying a wrong secret"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(agent.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AUTHENTICATION_FAILED"), "{stderr}");

    // A missing secret file is a usage error naming the file.
    let missing = Command::new(workspace_bin("ringmaster-exec"))
        .args([
            "--master",
            &addr,
            "--principal",
            "batch",
            "--secret-file",
            "/nonexistent/s",
        ])
        .args(["--name", "x", "--resources", "cpus:1", "--", "true"])
        .output()
        .expect("run ringmaster-exec");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/s"), "{stderr}");
}

#[test]
fn serve_refuses_a_config_whose_certificate_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(&config, "tls:\n  cert: missing.pem\n  key: missing.key\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "none",
            "--config",
        ])
        .arg(&config)
        .output()
        .expect("run ringmaster serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("master.yaml:2: tls.cert") && stderr.contains("missing.pem"),
        "{stderr}"
    );
}
