//! Three replicated masters (`ringmaster serve` with `cluster:`), two agents and a
//! `ringmaster-exec` run, all real processes over loopback, every client given the list of
//! masters. The leader is killed with `kill -9` while every task runs; a new leader takes over
//! from the replicated registry, the agents and the framework follow it, and the run completes:
//! every task reaches FINISHED exactly once and a ledger the tasks append to shows each ran once.

mod processes;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use processes::*;

const TASKS: usize = 6;

/// The id of the master that most recently logged that it leads (among `logs`).
fn current_leader(logs: &BTreeMap<u64, MasterLog>) -> Option<u64> {
    logs.iter()
        .filter_map(|(id, (_, seen))| {
            seen.iter()
                .rposition(|l| l.contains("this master leads its group"))
                .map(|at| {
                    (
                        *id,
                        at,
                        seen[at..].iter().any(|l| l.contains("no longer leads")),
                    )
                })
        })
        .filter(|(_, _, deposed)| !deposed)
        .map(|(id, _, _)| id)
        .next()
}

#[test]
fn kill_9_of_the_leader_mid_run_loses_nothing_and_launches_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (masters_list, mut masters, mut logs) = start_group(dir.path(), 3, &["--http", "none"]);
    let _a1 = start_agent(
        &masters_list,
        "a1",
        "cpus:4;mem:2048",
        &dir.path().join("a1"),
    );
    let _a2 = start_agent(
        &masters_list,
        "a2",
        "cpus:4;mem:2048",
        &dir.path().join("a2"),
    );

    // Every task appends its id to the ledger, once it may go.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (go, ledger) = (shared.join("go"), shared.join("ledger"));
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; echo $RINGMASTER_TASK_ID >> '{}'",
        go.display(),
        ledger.display()
    );
    let instances = TASKS.to_string();
    let mut command_line = Command::new(workspace_bin("ringmaster-exec"));
    command_line
        .args(["--master", &masters_list, "--name", "replicated"])
        .args(["--resources", "cpus:1;mem:128", "--instances", &instances])
        .args(["--failover-timeout", "60", "--connect-timeout", "60"])
        .args(["--", &command]);
    let (mut exec, lines) = spawn_with_lines(command_line);
    let mut seen = Vec::new();
    wait_line(&lines, &mut seen, "every task RUNNING", |s| {
        count_state(s, "RUNNING") == TASKS
    });

    // kill -9 the leader while every task runs.
    for (rx, seen) in logs.values_mut() {
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
    }
    let leader = current_leader(&logs).expect("a master logged that it leads");
    drop(masters.remove(&leader)); // SIGKILL
    logs.remove(&leader);
    std::fs::write(&go, b"").unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(status) = exec.0.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            Instant::now() < deadline,
            "ringmaster-exec did not finish after the leader was killed:\n{}",
            seen.join("\n")
        );
        // Wait for the next line (or check on exec again shortly).
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(20)) {
            seen.push(line);
        }
    };
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
    // The run went on under a new leader.
    let mut took_over = false;
    for (rx, seen) in logs.values_mut() {
        let before = seen.len();
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
        took_over |= seen[before..]
            .iter()
            .any(|l| l.contains("this master leads its group"));
    }
    assert!(took_over, "no other master took the lead");
    let ledger = std::fs::read_to_string(&ledger).unwrap();
    let mut ran: Vec<&str> = ledger.lines().collect();
    ran.sort();
    let mut expected: Vec<String> = terminal.keys().cloned().collect();
    expected.sort();
    assert_eq!(ran, expected, "each task ran exactly once");
}
