//! `ringmaster job` end to end through the real binaries (`ringmaster serve`, an agent, the
//! CLI): a service whose instance is killed from outside is replaced; a batch job's `--wait`
//! exit code says whether every instance succeeded; after a `kill -9` of the master and a
//! restart on its work dir every job is still there (from the registry: no `jobs.json`), its
//! running instances are adopted, not launched again, and the finished batch jobs keep their
//! outcomes; scale and stop end the processes.

mod processes;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use processes::*;

const SERVICE: &str = "name: web\ntype: service\ncount: 2\ntask:\n  \
    command: \"echo $$ > pid; exec sleep 1000\"\n  resources: \"cpus:0.5;mem:64\"\n  \
    kill_grace: 1s\nrestart:\n  attempts: 5\n  delay: 100ms\n";

/// The `pid` file of every sandbox under `dir` whose task id contains `task`.
fn pid_of(dir: &Path, task: &str) -> Option<i32> {
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.to_string_lossy().contains(task) {
                    if let Ok(text) = std::fs::read_to_string(path.join("pid")) {
                        return text.trim().parse().ok();
                    }
                }
                stack.push(path);
            }
        }
    }
    None
}

fn alive(pid: i32) -> bool {
    ringmaster_agent::process::process_is_alive(pid as u32)
}

fn start(dir: &Path, port: u16, http: u16) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let config = dir.join("master.yaml");
    let listen = format!("127.0.0.1:{port}");
    let http = format!("127.0.0.1:{http}");
    let work = dir.join("master");
    let (master, _addr, logs) = start_master_with(
        &config,
        &listen,
        &["--http", &http, "--work-dir", work.to_str().unwrap()],
    );
    (master, logs)
}

#[test]
fn jobs_run_restart_survive_a_master_restart_scale_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("master.yaml"),
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (port, http_port) = (free_port(), free_port());
    // The address agents use: the protocol port serves HTTP too.
    let http = format!("127.0.0.1:{port}");
    let (mut master, logs) = start(dir.path(), port, http_port);
    let agent_dir = dir.path().join("agent");
    let _agent = start_agent(
        &format!("127.0.0.1:{port}"),
        "a1",
        "cpus:4;mem:4096",
        &agent_dir,
    );
    wait_registered(&logs, &["a1"]);

    // A dry run first: where the instances would go, or why not; nothing launched.
    let spec = dir.path().join("web.yaml");
    std::fs::write(&spec, SERVICE).unwrap();
    let (code, out, err) = job(&http, &["plan", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("  a1\n").count(), 2, "{out}");
    let huge = dir.path().join("huge.yaml");
    std::fs::write(&huge, SERVICE.replace("cpus:0.5", "cpus:64")).unwrap();
    let (code, out, _) = job(&http, &["plan", huge.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("2 more cannot be placed"), "{out}");
    let (_, out, _) = job(&http, &["status"]);
    assert!(out.contains("no jobs"), "plan launched nothing: {out}");

    // A service: both instances run.
    let (code, out, err) = job(&http, &["run", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("job web created"), "{out}");
    let status = status_when(&http, "web", "both instances running", |s| {
        running_tasks(s).len() == 2
    });
    let tasks = running_tasks(&status);

    // One instance killed from outside is replaced under a new task id.
    let victim = &tasks[1];
    let pid = {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(pid) = pid_of(&agent_dir, victim) {
                break pid;
            }
            assert!(Instant::now() < deadline, "no pid file for {victim}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = status_when(&http, "web", "the killed instance replaced", |s| {
        let ids = running_tasks(s);
        ids.len() == 2 && !ids.contains(victim)
    });
    let restarted = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["restarts"] == 1)
        .expect("one instance restarted");
    assert!(restarted["last_exit_code"].as_i64().is_some() || restarted["last_message"] != "");
    let tasks = running_tasks(&status);

    // Batch jobs: --wait says whether every instance succeeded.
    let ok = dir.path().join("ok.yaml");
    std::fs::write(
        &ok,
        "name: ok\ntype: batch\ncount: 2\ntask:\n  command: \"true\"\n  resources: cpus:0.1\n",
    )
    .unwrap();
    let (code, _, err) = job(&http, &["run", ok.to_str().unwrap(), "--wait"]);
    assert_eq!(code, 0, "{err}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: bad\ntype: batch\ntask:\n  command: \"exit 3\"\n  resources: cpus:0.1\n\
         restart:\n  attempts: 1\n  delay: 10ms\n",
    )
    .unwrap();
    let (code, out, _) = job(&http, &["run", bad.to_str().unwrap(), "--wait"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("failed"), "{out}");

    // kill -9 of the master, restart on its work dir: every job is back, the running
    // instances adopted (same task ids, same processes), the finished batch job not rerun.
    master.0.kill().unwrap();
    master.0.wait().unwrap();
    let (_master, logs) = start(dir.path(), port, http_port);
    wait_registered(&logs, &["a1"]);
    let status = status_when(&http, "web", "instances adopted after the restart", |s| {
        running_tasks(s).len() == 2
    });
    assert_eq!(running_tasks(&status), tasks, "adopted, not relaunched");
    let ok_status = status_json(&http, "ok");
    assert!(ok_status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["state"] == "succeeded"));
    // The failed batch job is back with its outcome, from the registry: no jobs file.
    let bad_status = status_json(&http, "bad");
    let bad0 = &bad_status["instances"][0];
    assert_eq!(bad0["state"], "failed", "{bad_status:#}");
    assert_eq!(bad0["last_exit_code"], 3, "{bad_status:#}");
    assert!(!dir.path().join("master").join("jobs.json").exists());
    assert!(dir.path().join("master").join("registry.redb").exists());
    let (code, out, _) = job(&http, &["status"]);
    assert_eq!(code, 0);
    for name in ["job web", "job ok", "job bad"] {
        assert!(out.contains(name), "{out}");
    }

    // Scale down, then stop: the processes end.
    let pids: Vec<i32> = tasks
        .iter()
        .map(|t| pid_of(&agent_dir, t).expect("pid file"))
        .collect();
    let (code, _, err) = job(&http, &["scale", "web", "1"]);
    assert_eq!(code, 0, "{err}");
    status_when(&http, "web", "scaled to one", |s| {
        s["instances"].as_array().unwrap().len() == 1 && running_tasks(s).len() == 1
    });
    let (code, _, err) = job(&http, &["stop", "web"]);
    assert_eq!(code, 0, "{err}");
    status_when(&http, "web", "stopped", |s| {
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["state"] == "stopped")
    });
    let deadline = Instant::now() + WAIT;
    while pids.iter().any(|p| alive(*p)) {
        assert!(Instant::now() < deadline, "task processes still alive");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, _, err) = job(&http, &["stop", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no job named `nope`"), "{err}");
}
