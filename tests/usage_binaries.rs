//! Task usage through the real binaries: an agent started with `--usage-interval 1s` runs a
//! busy task, and the master's `/state` shows its cpu seconds growing above 0. Once with
//! `--isolation none` (the `/proc` process-group fallback, any user) and, as root with a
//! writable cgroup hierarchy, once with `--isolation cgroups` (the task cgroup's counters).

mod processes;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use processes::*;

/// The agent as a child that is stopped with SIGTERM when dropped, so it kills its busy task
/// on the way out (a SIGKILLed agent would leave the task spinning).
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            match self.0.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn state(addr: &str) -> serde_json::Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let text = agent
        .get(&format!("http://{addr}/state"))
        .call()
        .expect("the master answers /state")
        .body_mut()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Runs a busy task on one agent started with `isolation` and waits (polling `/state`, up to
/// [`WAIT`]) until the task shows cpu seconds above 0 and its agent a usage entry.
/// `while_running` is called on the task's `/state` entry while the task still runs.
fn busy_task_reports_usage(
    dir: &tempfile::TempDir,
    isolation: &str,
    while_running: Option<&dyn Fn(&serde_json::Value)>,
) -> serde_json::Value {
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let work = dir.path().join("agent");
    let agent = Agent(
        Command::new(workspace_bin("ringmaster-agent"))
            .args([
                "--master",
                &addr,
                "--id",
                "a1",
                "--resources",
                "cpus:2;mem:512",
            ])
            .args([
                "--usage-interval",
                "1s",
                "--isolation",
                isolation,
                "--work-dir",
            ])
            .arg(&work)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ringmaster-agent"),
    );
    wait_registered(&logs, &["a1"]);
    let exec = Proc(
        Command::new(workspace_bin("ringmaster-exec"))
            .args(["--master", &addr, "--name", "busy"])
            .args(["--resources", "cpus:1;mem:64", "--", "while :; do :; done"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ringmaster-exec"),
    );
    let deadline = Instant::now() + WAIT;
    let (task, agent_view) = loop {
        let s = state(&addr);
        let task = s["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|t| t["id"] == "busy-0"))
            .cloned();
        if let Some(task) = task {
            let cpu = task["usage"]["cpu_seconds"].as_f64().unwrap_or(0.0);
            if cpu > 0.0 {
                if let Some(check) = &while_running {
                    check(&task);
                }
                break (task, s["agents"][0].clone());
            }
        }
        assert!(
            Instant::now() < deadline,
            "isolation {isolation}: no usage with cpu_seconds > 0 within {WAIT:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(task["state"], "RUNNING", "{task}");
    assert!(
        task["usage"]["sampled_at_ms"].as_u64().unwrap() > 0,
        "{task}"
    );
    assert!(task["usage"]["mem_rss_mib"].as_f64().is_some(), "{task}");
    assert!(
        agent_view["usage"]["mem_mib"].as_f64().is_some(),
        "{agent_view}"
    );
    // The agent stops first: it kills the busy task before exiting.
    drop(agent);
    drop(exec);
    task
}

#[test]
fn a_busy_task_shows_cpu_seconds_without_cgroups() {
    let dir = tempfile::tempdir().unwrap();
    busy_task_reports_usage(&dir, "none", None);
}

#[test]
fn a_busy_task_shows_cpu_seconds_with_cgroups() {
    use ringmaster_agent::isolation::{Isolation, IsolationConfig, IsolationMode};
    if ringmaster_agent::users::agent_uid() != 0 {
        println!("skipped: needs root (cgroup isolation)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The same cgroup parent the agent will use (it follows the work dir).
    let config = IsolationConfig {
        mode: IsolationMode::Cgroups,
        ..IsolationConfig::default()
    };
    let isolation = match Isolation::setup(&config, &dir.path().join("agent")) {
        Ok(isolation) => isolation,
        Err(e) => {
            println!("skipped: needs root (and writable cgroups: {e:#})");
            return;
        }
    };
    // The figures come from the task's cgroup: it exists while the task runs.
    let in_its_cgroup = |task: &serde_json::Value| {
        let framework = task["framework"].as_str().unwrap();
        let dirs = isolation.task_usage_dirs(framework, "busy-0").unwrap();
        let cpu = dirs.cpu.expect("a cpu accounting directory");
        assert!(cpu.is_dir(), "no task cgroup at {}", cpu.display());
    };
    busy_task_reports_usage(&dir, "cgroups", Some(&in_its_cgroup));
}
