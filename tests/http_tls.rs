//! Issue 45: with `tls:` the master's `--http` port speaks HTTPS, with the master's certificate,
//! through the real `ringmaster serve` binary (certificates from `ringmaster certs`, an
//! operator principal, `auth.required: true`): `ringmaster status` and `ringmaster job run`
//! reach it with `--tls-ca` (or `RINGMASTER_TLS_CA`) and `--principal/--secret-file`; a plain
//! HTTP request gets no HTTP answer; a CLI without `--tls-ca` fails saying to give it; a failed
//! handshake does not stop the server. With replicated TLS masters, a CLI given their HTTPS
//! addresses reaches the leader although a follower names the leader's protocol address
//! (which serves no HTTP).

mod processes;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Instant;

use processes::{start_group_with, start_master_with, wait_line, MasterLog, WAIT};

/// The HTTPS address a master logs (`operator HTTP ... on https://ADDR/`).
fn https_address(logs: &mpsc::Receiver<String>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let line = logs
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the master logs its HTTP address");
        if line.contains("operator HTTP") {
            assert!(line.contains("https://"), "{line}");
            let at = line.rfind("http=").expect("an http= field") + 5;
            return line[at..].split_whitespace().next().unwrap().to_string();
        }
    }
}

/// Runs `ringmaster ARGS` (with no `RINGMASTER_*` settings from the environment).
fn ringmaster(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringmaster"));
    command.args(args);
    for key in [
        "RINGMASTER_MASTER",
        "RINGMASTER_PRINCIPAL",
        "RINGMASTER_SECRET_FILE",
        "RINGMASTER_TLS_CA",
        "RINGMASTER_TLS_CERT",
        "RINGMASTER_TLS_KEY",
    ] {
        command.env_remove(key);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run ringmaster")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_tls_master_serves_its_http_api_over_https_to_the_clis() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = ringmaster(
        &[
            "certs",
            "--out",
            certs.to_str().unwrap(),
            "--san",
            "localhost",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let secret = dir.path().join("ops.secret");
    ringmaster_proto::files::write_private(&secret, "ops-secret\n").unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n\
         tls:\n  cert: certs/master.pem\n  key: certs/master.key\n\
         auth:\n  required: true\n  principals:\n\
         \x20   ops: { secret_file: ops.secret, roles: [operator] }\n",
    )
    .unwrap();
    let (_master, _addr, logs) =
        start_master_with(&config, "127.0.0.1:0", &["--http", "127.0.0.1:0"]);
    let http = https_address(&logs);
    let ca = certs.join("ca.pem");
    let (ca, secret) = (ca.to_str().unwrap(), secret.to_str().unwrap());
    let credential = ["--principal", "ops", "--secret-file", secret];

    // `status` over HTTPS: a bare HOST:PORT with --tls-ca, and an https:// entry.
    for master in [http.clone(), format!("https://{http}/")] {
        let mut args = vec!["status", "--master", &master, "--tls-ca", ca];
        args.extend(credential);
        let out = ringmaster(&args, &[]);
        assert!(out.status.success(), "{master}: {}", text(&out));
    }

    // `job run` over HTTPS, the CA from the environment: the job is accepted (no agent needed).
    let spec = dir.path().join("web.yaml");
    std::fs::write(
        &spec,
        "name: web\ntype: service\ncount: 1\ntask:\n  command: \"sleep 600\"\n  \
         resources: \"cpus:0.1;mem:16\"\n",
    )
    .unwrap();
    let mut args = vec!["job", "run", spec.to_str().unwrap(), "--master", &http];
    args.extend(credential);
    let out = ringmaster(&args, &[("RINGMASTER_TLS_CA", Path::new(ca))]);
    assert!(out.status.success(), "job run: {}", text(&out));
    let mut args = vec![
        "job", "status", "web", "--json", "--master", &http, "--tls-ca", ca,
    ];
    args.extend(credential);
    let out = ringmaster(&args, &[]);
    assert!(out.status.success(), "job status: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"web\""),
        "{}",
        text(&out)
    );

    // Plain HTTP to the HTTPS port: no HTTP answer, only a TLS alert or the connection closed.
    let mut plain = std::net::TcpStream::connect(&http).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // A CLI without --tls-ca fails and says to give it: plain HTTP to the port, and an
    // https:// entry.
    for master in [http.clone(), format!("https://{http}")] {
        let mut args = vec!["status", "--master", &master];
        args.extend(credential);
        let out = ringmaster(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{master}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--tls-ca"),
            "{master}: {}",
            text(&out)
        );
        let mut args = vec!["job", "status", "--master", &master];
        args.extend(credential);
        let out = ringmaster(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{master}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--tls-ca"),
            "{master}: {}",
            text(&out)
        );
    }

    // A CA that did not sign the master's certificate: the handshake fails, the CLI says so.
    let elsewhere = dir.path().join("elsewhere");
    let out = ringmaster(&["certs", "--out", elsewhere.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let wrong_ca = elsewhere.join("ca.pem");
    let mut args = vec![
        "status",
        "--master",
        &http,
        "--tls-ca",
        wrong_ca.to_str().unwrap(),
    ];
    args.extend(credential);
    let out = ringmaster(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-ca"),
        "{}",
        text(&out)
    );

    // A CA file that is not there: bad input (exit 2), naming the flag.
    let mut args = vec![
        "status",
        "--master",
        &http,
        "--tls-ca",
        "/nonexistent/ca.pem",
    ];
    args.extend(credential);
    let out = ringmaster(&args, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-ca"),
        "{}",
        text(&out)
    );

    // After all those failed handshakes the server still serves; without credentials the
    // API still refuses (401) over HTTPS.
    let mut args = vec!["status", "--master", &http, "--tls-ca", ca];
    args.extend(credential);
    let out = ringmaster(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = ringmaster(&["status", "--master", &http, "--tls-ca", ca], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        text(&out)
    );
}

/// The HTTPS address in a master's `operator HTTP ... http=ADDR` line, waiting for it.
fn https_address_of(log: &mut MasterLog) -> String {
    let (lines, seen) = log;
    wait_line(lines, seen, "the master's HTTPS address", |seen| {
        seen.iter().any(|l| l.contains("operator HTTP"))
    });
    let line = seen.iter().find(|l| l.contains("operator HTTP")).unwrap();
    assert!(line.contains("https://"), "{line}");
    let at = line.rfind("http=").expect("an http= field") + 5;
    line[at..].split_whitespace().next().unwrap().to_string()
}

#[test]
fn the_clis_reach_the_leader_of_replicated_tls_masters_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = ringmaster(&["certs", "--out", certs.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let (_list, _masters, mut logs) = start_group_with(
        dir.path(),
        3,
        "  ca: certs/ca.pem\ntls:\n  cert: certs/master.pem\n  key: certs/master.key\n",
        |_| vec!["--http".into(), "127.0.0.1:0".into()],
    );
    let https: Vec<(u64, String)> = logs
        .iter_mut()
        .map(|(id, log)| (*id, https_address_of(log)))
        .collect();
    // Wait until a master logs that it leads.
    let deadline = Instant::now() + WAIT;
    let leader = loop {
        let leading = logs.iter().find_map(|(id, (_, seen))| {
            seen.iter()
                .any(|l| l.contains("this master leads its group"))
                .then_some(*id)
        });
        if let Some(id) = leading {
            break id;
        }
        assert!(Instant::now() < deadline, "no master leads");
        for (lines, seen) in logs.values_mut() {
            if let Ok(line) = lines.recv_timeout(std::time::Duration::from_millis(20)) {
                seen.push(line);
            }
        }
    };
    // The followers first: each names the leader's protocol address, which does not answer
    // HTTP; the list goes on to the leader's HTTPS port.
    let mut ordered: Vec<&str> = https
        .iter()
        .filter(|(id, _)| *id != leader)
        .map(|(_, a)| a.as_str())
        .collect();
    ordered.extend(
        https
            .iter()
            .filter(|(id, _)| *id == leader)
            .map(|(_, a)| a.as_str()),
    );
    let list = ordered.join(",");
    let ca = certs.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let out = ringmaster(&["status", "--master", &list, "--tls-ca", ca], &[]);
    assert!(out.status.success(), "status: {}", text(&out));
    let out = ringmaster(
        &[
            "cluster", "members", "--json", "--master", &list, "--tls-ca", ca,
        ],
        &[],
    );
    assert!(out.status.success(), "cluster members: {}", text(&out));
    let members = String::from_utf8_lossy(&out.stdout);
    assert!(members.contains(&format!("{leader}")), "{}", text(&out));
}
