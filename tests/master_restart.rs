//! The master killed with `kill -9` mid-run and restarted from its `--work-dir`, with the real
//! binaries: two agents and a `ringmaster-exec` run. The exec run completes, and every task is
//! reported exactly once in a terminal state: also the tasks that ended while the master was
//! down, and nothing is launched twice.

mod processes;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use processes::*;

const TASKS: usize = 6;

#[test]
fn kill_9_of_the_master_mid_run_loses_nothing_and_launches_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n  agent_reregister_timeout: 30s\n",
    )
    .unwrap();
    let registry = dir.path().join("master-work");
    let registry_arg = registry.to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let master_flags = ["--http", "none", "--work-dir", registry_arg];
    let (master, addr, logs) = start_master_with(&config, &listen, &master_flags);
    let _a1 = start_agent(&addr, "a1", "cpus:4;mem:2048", &dir.path().join("a1"));
    let _a2 = start_agent(&addr, "a2", "cpus:4;mem:2048", &dir.path().join("a2"));
    wait_registered(&logs, &["a1", "a2"]);

    // Tasks 0-2 end while the master is down, tasks 3-5 after it is back.
    let go_early = dir.path().join("go-early");
    let go_late = dir.path().join("go-late");
    let command = format!(
        "case $RINGMASTER_TASK_ID in *-[012]) f='{}';; *) f='{}';; esac; \
         while [ ! -e \"$f\" ]; do sleep 0.05; done; echo done > result",
        go_early.display(),
        go_late.display()
    );
    let instances = TASKS.to_string();
    let mut command_line = Command::new(workspace_bin("ringmaster-exec"));
    command_line
        .args(["--master", &addr, "--name", "durable"])
        .args(["--resources", "cpus:1;mem:128", "--instances", &instances])
        .args(["--failover-timeout", "60", "--connect-timeout", "60"])
        .args(["--", &command]);
    let (mut exec, lines) = spawn_with_lines(command_line);
    let mut seen = Vec::new();
    wait_line(&lines, &mut seen, "every task RUNNING", |s| {
        count_state(s, "RUNNING") == TASKS
    });

    // kill -9 the master mid-run, and let half the tasks end while it is down.
    drop(master);
    drop(logs);
    std::fs::write(&go_early, b"").unwrap();
    let finished_files = || {
        ["a1", "a2"]
            .iter()
            .flat_map(|a| {
                // The supervisors' records, in the agents' own meta directories.
                std::fs::read_dir(dir.path().join(a).join("meta").join("tasks"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .flat_map(|fw| std::fs::read_dir(fw.path()).into_iter().flatten().flatten())
                    .flat_map(|t| std::fs::read_dir(t.path()).into_iter().flatten().flatten())
                    .filter(|run| run.path().join("exit").exists())
                    .collect::<Vec<_>>()
            })
            .count()
    };
    let deadline = Instant::now() + WAIT;
    while finished_files() < 3 {
        assert!(Instant::now() < deadline, "the early tasks did not end");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The master comes back on the same address from its registry.
    let (_master, addr2, logs) = start_master_with(&config, &listen, &master_flags);
    assert_eq!(addr2, addr);
    wait_registered(&logs, &["a1", "a2"]);
    std::fs::write(&go_late, b"").unwrap();

    let deadline = Instant::now() + WAIT;
    let code = loop {
        if let Some(status) = exec.0.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "ringmaster-exec did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Every line the exec printed, to the end.
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(2)) {
        seen.push(line);
    }
    let out = seen.join("\n");
    assert_eq!(code, Some(0), "{out}");
    let mut terminal: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in seen.iter().filter(|l| l.starts_with("TASK ")) {
        let mut words = line.split_whitespace().skip(1);
        let (id, state) = (words.next().unwrap(), words.next().unwrap());
        if ["FINISHED", "FAILED", "KILLED", "LOST"].contains(&state) {
            terminal
                .entry(id.to_string())
                .or_default()
                .push(state.to_string());
        }
    }
    assert_eq!(terminal.len(), TASKS, "{out}");
    for (id, states) in &terminal {
        assert_eq!(states, &["FINISHED"], "task {id} ends exactly once: {out}");
    }
    // Each task ran once: one sandbox per task over both agents.
    let results = ["a1", "a2"]
        .iter()
        .flat_map(|a| {
            std::fs::read_dir(dir.path().join(a).join("sandboxes"))
                .into_iter()
                .flatten()
                .flatten()
                .flat_map(|fw| std::fs::read_dir(fw.path()).into_iter().flatten().flatten())
                .flat_map(|t| std::fs::read_dir(t.path()).into_iter().flatten().flatten())
                .filter(|run| run.path().join("result").exists())
                .collect::<Vec<_>>()
        })
        .count();
    assert_eq!(results, TASKS, "nothing ran twice or not at all");
}
