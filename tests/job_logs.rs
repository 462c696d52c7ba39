//! `ringmaster job logs` end to end through the real binaries (`ringmaster serve`, an agent,
//! the CLI): a batch job's stdout and stderr as its agent has them; `--follow` on a service
//! prints lines as the task writes them and ends once the task has ended; unknown jobs and
//! instances, and an unreachable master, are clear errors; `GET /files/read` answers JSON
//! errors for what it cannot read.

mod processes;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use processes::*;

const BATCH: &str = "name: hello\ntype: batch\ntask:\n  \
    command: \"echo out-line-1; echo err-line-1 >&2; echo out-line-2\"\n  \
    resources: \"cpus:0.1;mem:32\"\n";

const TICKER: &str = "name: ticker\ntype: service\ntask:\n  \
    command: \"i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.2; done\"\n  \
    resources: \"cpus:0.1;mem:32\"\n  kill_grace: 1s\n";

fn job(master: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .arg("job")
        .args(args)
        .args(["--master", master])
        .output()
        .expect("run ringmaster job");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `GET url`: the status and the body as JSON.
fn get_json(url: &str) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut response = agent.get(url).call().expect("the master answers");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

#[test]
fn job_logs_prints_stdout_stderr_and_follows_a_service() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let work = dir.path().join("master");
    let (_master, addr, logs) = start_master_with(
        &config,
        "127.0.0.1:0",
        &[
            "--http",
            "127.0.0.1:0",
            "--work-dir",
            work.to_str().unwrap(),
        ],
    );
    // The protocol address serves HTTP too: the one address every client uses.
    let _agent = start_agent(&addr, "a1", "cpus:2;mem:1024", &dir.path().join("agent"));
    wait_registered(&logs, &["a1"]);

    // A batch job: its stdout and stderr, whole, once it is done.
    let spec = dir.path().join("hello.yaml");
    std::fs::write(&spec, BATCH).unwrap();
    let (code, out, err) = job(&addr, &["run", spec.to_str().unwrap(), "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = job(&addr, &["logs", "hello"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "out-line-1\nout-line-2\n"),
        "{err}"
    );
    let (code, out, err) = job(&addr, &["logs", "hello", "--instance", "0", "--stderr"]);
    assert_eq!((code, out.as_str()), (0, "err-line-1\n"), "{err}");
    // --follow of an ended task prints it all and ends.
    let (code, out, err) = job(&addr, &["logs", "hello", "--follow"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "out-line-1\nout-line-2\n"),
        "{err}"
    );

    // Clear errors.
    let (code, _, err) = job(&addr, &["logs", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no job named `nope`"), "{err}");
    let (code, _, err) = job(&addr, &["logs", "hello", "--instance", "5"]);
    assert_eq!(code, 1);
    assert!(err.contains("no instance 5"), "{err}");
    let (code, _, err) = job("127.0.0.1:1", &["logs", "hello"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach the master"), "{err}");

    // /files/read: the same window by task id, and JSON errors.
    let status: serde_json::Value = {
        let (code, out, err) = job(&addr, &["status", "hello", "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    assert_eq!(status["instances"][0]["state"], "succeeded", "{status:#}");
    let (code, answer) = get_json(&format!("http://{addr}/jobs/hello/logs?length=4&offset=4"));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["data"], "line");
    assert_eq!(answer["next_offset"], 8);
    assert_eq!(answer["size"], 22);
    assert_eq!(answer["task_state"], "FINISHED");
    assert_eq!(answer["agent_id"], "a1");
    let task_id = answer["task_id"].as_str().unwrap().to_string();
    let (code, answer) = get_json(&format!(
        "http://{addr}/files/read?framework_id=nope&task_id={task_id}"
    ));
    assert_eq!(code, 404, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("no such task"));
    let (code, answer) = get_json(&format!(
        "http://{addr}/files/read?framework_id=f&task_id=t&file=secret"
    ));
    assert_eq!(code, 400, "{answer}");

    // ringmaster-exec --logs: each task's stdout once it ended, prefixed with its id.
    let (code, out) = exec(
        &addr,
        &[
            "--name",
            "say",
            "--resources",
            "cpus:0.1;mem:32",
            "--instances",
            "2",
            "--logs",
            "--",
            "echo hello from $RINGMASTER_TASK_ID; echo bye",
        ],
    );
    assert_eq!(code, 0, "{out}");
    for task in ["say-0", "say-1"] {
        assert!(
            out.contains(&format!("[{task}] hello from {task}\n[{task}] bye\n")),
            "{out}"
        );
    }

    // --follow on a service: lines as the task writes them.
    let ticker = dir.path().join("ticker.yaml");
    std::fs::write(&ticker, TICKER).unwrap();
    let (code, _, err) = job(&addr, &["run", ticker.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let mut follow = Proc(
        Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["job", "logs", "ticker", "--follow", "--master", &addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start job logs --follow"),
    );
    let stdout = follow.0.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + WAIT;
    for n in 1..=5 {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("tick-{n} not followed"));
        assert_eq!(line, format!("tick-{n}"));
    }
    // Once the task has ended and everything is printed, --follow ends by itself.
    let (code, _, err) = job(&addr, &["stop", "ticker"]);
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = follow.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "job logs --follow did not end after the task ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    // Every line it printed was a tick, in order, none lost or repeated.
    let rest: Vec<String> = lines.try_iter().collect();
    for (i, line) in rest.iter().enumerate() {
        assert_eq!(*line, format!("tick-{}", i + 6), "{rest:?}");
    }
}

#[test]
fn exec_logs_goes_on_without_the_masters_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(&config, "master:\n  allocation_interval: 5ms\n").unwrap();
    let (_master, addr, logs) = start_master_with(&config, "127.0.0.1:0", &["--http", "none"]);
    let _agent = start_agent(&addr, "a1", "cpus:2;mem:1024", &dir.path().join("agent"));
    wait_registered(&logs, &["a1"]);
    let out = Command::new(workspace_bin("ringmaster-exec"))
        .args([
            "--master",
            &addr,
            "--name",
            "quiet",
            "--resources",
            "cpus:0.1",
        ])
        .args(["--instances", "2", "--logs", "--", "echo hi"])
        .output()
        .expect("run ringmaster-exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.matches("FINISHED").count(), 2, "{stdout}");
    assert!(!stdout.contains("[quiet-"), "{stdout}");
    assert_eq!(
        stderr.matches("the master's HTTP is not reachable").count(),
        1,
        "said once: {stderr}"
    );
}
