//! Health checks end to end through the real binaries (`ringmaster serve`, an agent, the
//! CLI): a service whose health command checks for a file in its sandbox becomes healthy;
//! once the file is removed from outside the instance is reported unhealthy, killed (it ends
//! FAILED with reason health_check_failed) and replaced under a new task id (restarts = 1),
//! and the replacement becomes healthy. `job status`, `--json` and `/state` show the health.
//! Runs as root (tasks and checks as the agent's task user) and as an unprivileged user.

mod processes;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use processes::*;

const SERVICE: &str = r#"name: web
type: service
task:
  command: "echo $$ > pid; touch ok; exec sleep 1000"
  resources: "cpus:0.5;mem:64"
  kill_grace: 1s
  health:
    command: "test -e ok || { echo ok is missing; exit 1; }"
    interval: 1s
    # As long as the interval allows: a check that only times out on a loaded machine must
    # not kill the replacement too (restarts is asserted exactly).
    timeout: 1s
    failures: 2
    grace: 0s
restart:
  attempts: 5
  delay: 100ms
"#;

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

/// Polls `job status web --json` until `cond` holds for instance 0.
fn instance_when(
    master: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, out, err) = job(master, &["status", "web", "--json"]);
        assert_eq!(code, 0, "{err}");
        let status: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let instance = &status["instances"][0];
        if cond(instance) {
            return instance.clone();
        }
        assert!(Instant::now() < deadline, "{what}: last status {status:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn state_task(master: &str, task_id: &str) -> serde_json::Value {
    let mut answer = ureq::get(&format!("http://{master}/state"))
        .call()
        .expect("GET /state");
    let state: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
    state["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == task_id)
        .cloned()
        .unwrap_or_else(|| panic!("no task {task_id} in /state: {state:#}"))
}

/// The sandbox under `dir` of the task `task` (a directory whose name contains its id), once
/// its command wrote its pid file.
fn sandbox_of(dir: &Path, task: &str) -> PathBuf {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    // `<task>/<run>/`: a run of the task whose command wrote its pid.
                    if path.to_string_lossy().ends_with(task) {
                        let runs = std::fs::read_dir(&path).into_iter().flatten().flatten();
                        if let Some(run) = runs.map(|r| r.path()).find(|r| r.join("pid").is_file())
                        {
                            return run;
                        }
                    }
                    stack.push(path);
                }
            }
        }
        assert!(Instant::now() < deadline, "no sandbox for {task}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_unhealthy_instance_is_killed_and_replaced_by_a_healthy_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, master, logs) = start_master(&config);
    let agent_dir = dir.path().join("agent");
    let _agent = start_agent(&master, "a1", "cpus:4;mem:4096", &agent_dir);
    wait_registered(&logs, &["a1"]);

    let spec = dir.path().join("web.yaml");
    std::fs::write(&spec, SERVICE).unwrap();
    let (code, out, err) = job(&master, &["plan", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("health: `test -e ok"), "{out}");
    let (code, _, err) = job(&master, &["run", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");

    let first = instance_when(&master, "the first task healthy", |i| {
        i["state"] == "running" && i["health"] == "healthy"
    });
    let first_task = first["task_id"].as_str().unwrap().to_string();
    let (_, table, _) = job(&master, &["status", "web"]);
    assert!(table.contains("HEALTH"), "{table}");
    assert!(table.contains(" healthy "), "{table}");
    assert_eq!(state_task(&master, &first_task)["healthy"], true);

    // The file goes away: two failed checks later the task is unhealthy, killed, replaced.
    let sandbox = sandbox_of(&agent_dir, &first_task);
    let pid: i32 = std::fs::read_to_string(sandbox.join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::remove_file(sandbox.join("ok")).unwrap();
    let second = instance_when(&master, "a healthy replacement", |i| {
        i["state"] == "running"
            && i["health"] == "healthy"
            && i["task_id"].as_str().is_some_and(|t| t != first_task)
    });
    assert_eq!(second["restarts"], 1, "{second:#}");
    assert!(
        second["last_message"]
            .as_str()
            .unwrap()
            .starts_with("health check failed 2 times: ok is missing"),
        "{second:#}"
    );
    assert!(
        !ringmaster_agent::process::process_is_alive(pid as u32),
        "the unhealthy task's process was killed"
    );
    let old = state_task(&master, &first_task);
    assert_eq!(old["state"], "FAILED", "{old:#}");
    assert_eq!(old["reason"], "health_check_failed", "{old:#}");
    assert_eq!(old["healthy"], false, "{old:#}");
    let second_task = second["task_id"].as_str().unwrap();
    assert_eq!(state_task(&master, second_task)["healthy"], true);

    let (code, _, err) = job(&master, &["stop", "web"]);
    assert_eq!(code, 0, "{err}");
}
