//! From one master to three without stopping a task (issue 45), through the real binaries: a
//! single `ringmaster serve --work-dir D` runs a service (`ringmaster job run`) on an agent
//! given the three future masters' addresses. The single master is killed (the agent and the
//! tasks keep running), `ringmaster cluster init --from D --config G1.yaml` makes D master 1's
//! work dir, and master 1 starts on it with masters 2 and 3 on empty work dirs
//! (`cluster.join: true`). The group serves the same job, agent and tasks, the same processes
//! (nothing relaunched); with master 1 killed the other two still have everything.

mod processes;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use processes::*;

const SERVICE: &str = "name: web\ntype: service\ncount: 2\ntask:\n  \
    command: \"echo $$ > pid; exec sleep 1000\"\n  resources: \"cpus:0.5;mem:64\"\n  \
    kill_grace: 1s\nrestart:\n  attempts: 5\n  delay: 100ms\n";

const MASTER: &str = "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n  \
    agent_reregister_timeout: 30s\n";

/// Runs `ringmaster ARGS`: (exit code, stdout, stderr).
fn ringmaster(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args(args)
        .output()
        .expect("run ringmaster");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `ringmaster status --master LIST --json` (the leader's `/state`) until `cond` holds.
fn state_when(
    list: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, out, err) = ringmaster(&["status", "--master", list, "--json"]);
        let state: serde_json::Value = if code == 0 {
            serde_json::from_str(&out).expect("status --json is JSON")
        } else {
            serde_json::json!({ "error": err })
        };
        if cond(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "{what}: last state {state:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent `a1` is registered and tasks `tasks` run on it.
fn agent_runs(state: &serde_json::Value, tasks: &[String]) -> bool {
    let agent = state["agents"]
        .as_array()
        .is_some_and(|agents| agents.iter().any(|a| a["id"] == "a1"));
    let running = |id: &String| {
        state["tasks"].as_array().is_some_and(|all| {
            all.iter().any(|t| {
                t["id"] == id.as_str()
                    && t["agent"] == "a1"
                    && t["state"].as_str().is_some_and(|s| s.contains("RUNNING"))
            })
        })
    };
    agent && tasks.iter().all(running)
}

/// Starts `ringmaster serve --config CONFIG --listen LISTEN --work-dir WORK`: the process and
/// a channel of its log lines. Panics with its log when it exits before logging its address.
fn serve(config: &Path, listen: &str, work: &Path) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringmaster"));
    command
        .args(["serve", "--listen", listen, "--config"])
        .arg(config)
        .arg("--work-dir")
        .arg(work)
        // HTTP on an ephemeral port (not the protocol port's next, which may be taken); the
        // protocol port serves it too, so the CLIs get the masters' protocol addresses.
        .args(["--http", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut master = Proc(command.spawn().expect("start ringmaster serve"));
    let stderr = master.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("master listening") => return (master, rx),
            Ok(line) => seen.push(line),
            Err(_) => panic!(
                "ringmaster serve --listen {listen} --config {} did not start:\n{}",
                config.display(),
                seen.join("\n")
            ),
        }
    }
}

/// Master `id`'s config in the group of `addresses` (ids 1..=3).
fn group_config(dir: &Path, id: u64, addresses: &[String], join: bool) -> PathBuf {
    let mut text = format!("{MASTER}cluster:\n  id: {id}\n  election_timeout: 500ms\n");
    if join {
        text.push_str("  join: true\n");
    }
    text.push_str("  peers:\n");
    for (i, address) in addresses.iter().enumerate() {
        text.push_str(&format!("    {}: {address}\n", i + 1));
    }
    let path = dir.join(format!("g{id}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The tests of this file take ports with `free_port` and bind them later: one at a time, so
/// one's master cannot take a port the other picked.
static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_single_master_becomes_three_without_restarting_a_task() {
    let _ports = PORTS.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let addresses: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let list = addresses.join(",");

    // The single master, on master 1's future address; the agent knows all three.
    let single_config = dir.path().join("single.yaml");
    std::fs::write(&single_config, MASTER).unwrap();
    let work1 = dir.path().join("master1");
    let work1_arg = work1.to_str().unwrap();
    let (single, _single_log) = serve(&single_config, &addresses[0], &work1);
    let agent_dir: PathBuf = dir.path().join("a1");
    let _agent = start_agent(&list, "a1", "cpus:4;mem:2048", &agent_dir);
    let spec = dir.path().join("web.yaml");
    std::fs::write(&spec, SERVICE).unwrap();
    let (code, out, err) = job(&addresses[0], &["run", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let status = status_when(&addresses[0], "web", "two instances running", |s| {
        running_tasks(s).len() == 2
    });
    let before = running_tasks(&status);
    let pids: Vec<i32> = before
        .iter()
        .map(|t| pid_of(&agent_dir, t).expect("a pid file"))
        .collect();

    // The single master stops (killed); the agent and the tasks go on.
    drop(single);
    let g1 = group_config(dir.path(), 1, &addresses, false);
    let g2 = group_config(dir.path(), 2, &addresses, true);
    let g3 = group_config(dir.path(), 3, &addresses, true);
    let g1_arg = g1.to_str().unwrap();
    let (code, out, err) =
        ringmaster(&["cluster", "init", "--from", work1_arg, "--config", g1_arg]);
    assert_eq!(code, 0, "cluster init: {out}{err}");
    assert!(out.contains("master 1's work dir"), "{out}");
    // Seeding twice is refused, naming the work dir.
    let (code, _, err) = ringmaster(&["cluster", "init", "--from", work1_arg, "--config", g1_arg]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("already has replication state") && err.contains(work1_arg),
        "{err}"
    );

    // Master 1 on the seeded work dir, masters 2 and 3 on empty ones.
    let mut masters = BTreeMap::new();
    for (id, config) in [(1, &g1), (2, &g2), (3, &g3)] {
        let work = dir.path().join(format!("master{id}"));
        masters.insert(id, serve(config, &addresses[id as usize - 1], &work));
    }

    // The group serves the job, the agent and its tasks: the same processes, none relaunched.
    let after = status_when(&list, "web", "the group reports the job's instances", |s| {
        running_tasks(s) == before
    });
    assert_eq!(running_tasks(&after), before);
    let state = state_when(
        &list,
        "the leader has the agent and its running tasks",
        |s| agent_runs(s, &before),
    );
    assert!(state["cluster"]["leader"].as_u64().is_some(), "{state:#}");
    for (task, pid) in before.iter().zip(&pids) {
        assert_eq!(
            pid_of(&agent_dir, task),
            Some(*pid),
            "{task} kept its process"
        );
        assert_eq!(runs_of(&agent_dir, task), 1, "{task} ran once");
        assert!(ringmaster_agent::process::process_is_alive(*pid as u32));
    }

    // Master 1 goes: masters 2 and 3 caught up, and the new leader has everything.
    drop(masters.remove(&1));
    let state = state_when(
        &list,
        "a new leader has the agent and its running tasks",
        |s| s["cluster"]["leader"].as_u64().is_some_and(|l| l != 1) && agent_runs(s, &before),
    );
    assert_ne!(state["cluster"]["id"].as_u64(), Some(1));
    let again = status_when(&list, "web", "the new leader reports the job", |s| {
        running_tasks(s) == before
    });
    assert_eq!(running_tasks(&again), before);
    for (task, pid) in before.iter().zip(&pids) {
        assert_eq!(
            pid_of(&agent_dir, task),
            Some(*pid),
            "{task} kept its process"
        );
        assert_eq!(runs_of(&agent_dir, task), 1, "{task} ran once");
    }
    let (code, _, err) = job(&list, &["stop", "web"]);
    assert_eq!(code, 0, "{err}");
}

/// `cluster init` refuses a work dir without a registry, and one a running master holds.
#[test]
fn cluster_init_refuses_a_dir_without_a_registry_and_a_running_master_s() {
    let _ports = PORTS.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let addresses: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let g1 = group_config(dir.path(), 1, &addresses, false);
    let g1_arg = g1.to_str().unwrap();

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, _, err) = ringmaster(&[
        "cluster",
        "init",
        "--from",
        empty.to_str().unwrap(),
        "--config",
        g1_arg,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("has no registry") && err.contains(empty.to_str().unwrap()),
        "{err}"
    );

    let single_config = dir.path().join("single.yaml");
    std::fs::write(&single_config, MASTER).unwrap();
    let work = dir.path().join("single");
    let work_arg = work.to_str().unwrap();
    let (_single, _log) = serve(&single_config, "127.0.0.1:0", &work);
    let (code, _, err) = ringmaster(&["cluster", "init", "--from", work_arg, "--config", g1_arg]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("runs offline") && err.contains(work_arg),
        "{err}"
    );

    // A config without `cluster:` is a usage error.
    let (code, _, err) = ringmaster(&[
        "cluster",
        "init",
        "--from",
        work_arg,
        "--config",
        single_config.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no cluster: section"), "{err}");
}
