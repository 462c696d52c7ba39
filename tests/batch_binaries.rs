//! Batch matching end to end through the real binaries: `ringmaster serve`, two
//! `ringmaster-agent` processes reporting `cpu_speed` as an attribute, and
//! `ringmaster-exec --batch FILE` running real processes.

mod processes;

use processes::*;

#[test]
fn exec_batch_runs_the_matched_tasks_and_reports_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let _fast = start_agent_with(
        &addr,
        "fast",
        "cpus:2;mem:512",
        &dir.path().join("fast"),
        &["--attributes", "cpu_speed:4;unit_cost:2"],
    );
    let _slow = start_agent_with(
        &addr,
        "slow",
        "cpus:2;mem:512",
        &dir.path().join("slow"),
        &["--attributes", "cpu_speed:1"],
    );
    wait_registered(&logs, &["fast", "slow"]);

    // Worked in docs/batch.md ("Through the real system"): every task prefers `fast` (4× the
    // cpu power). fast ranks urgent, urgent2, ok1, ok2 by E; it keeps urgent (1 cpu), skips
    // urgent2 (2 cpus do not fit beside it), keeps ok1. ok2 goes to slow; urgent2 can use only
    // fast (exec 0.5 s there, 2 s on slow > deadline 1 s) and is outbid.
    let batch = dir.path().join("batch.yaml");
    std::fs::write(
        &batch,
        "batch_id: burst-1
tasks:
  - { id: urgent, command: 'echo $RINGMASTER_TASK_ID > out', resources: 'cpus:1;mem:64', deadline: 1, work: 2, price: 5 }
  - { id: urgent2, command: 'true', resources: 'cpus:2;mem:64', deadline: 1, work: 2 }
  - { id: ok1, command: 'true', resources: 'cpus:1;mem:64', deadline: 10, work: 1 }
  - { id: ok2, command: 'true', resources: 'cpus:1;mem:64', deadline: 10, work: 1 }
  - { id: big, command: 'true', resources: 'cpus:16', deadline: 10, work: 1 }
  - { id: impossible, command: 'true', resources: 'cpus:1', deadline: 0.1, work: 10 }
",
    )
    .unwrap();
    let batch_arg = batch.display().to_string();
    let (code, out) = exec(&addr, &["--name", "burst", "--batch", &batch_arg]);
    // Not every task ran, so the exit code is 1.
    assert_eq!(code, 1, "{out}");
    for line in [
        "TASK urgent FINISHED agent=fast",
        "TASK ok1 FINISHED agent=fast",
        "TASK ok2 FINISHED agent=slow",
        "UNMATCHED urgent2 reason=outbid (outbid)",
        "UNMATCHED big reason=no_agent_fits (no agent fits)",
        "UNMATCHED impossible reason=deadline_impossible (deadline impossible on every agent)",
        "BATCH burst-1 matched=3 unmatched=3 proposals=5",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "missing `{line}` in:\n{out}"
        );
    }
    // The task really ran on the fast agent.
    let sandboxes = dir.path().join("fast").join("sandboxes");
    let mut found = false;
    for fw in std::fs::read_dir(&sandboxes).unwrap().flatten() {
        let id = fw.file_name().to_string_lossy().into_owned();
        let run =
            ringmaster_agent::sandbox::latest_run_dir(&dir.path().join("fast"), &id, "urgent");
        let written = std::fs::read_to_string(run.join("out"));
        found |= written.is_ok_and(|w| w.trim() == "urgent");
    }
    assert!(
        found,
        "urgent's sandbox on fast holds its output; fast's work dir:\n{}",
        tree(&dir.path().join("fast"))
    );

    // A bad batch file is a usage error naming the field.
    std::fs::write(
        &batch,
        "tasks:\n  - { id: a, command: x, resources: 'cpus:1', deadline: 0, work: 1 }\n",
    )
    .unwrap();
    let (code, _) = exec(&addr, &["--name", "bad", "--batch", &batch_arg]);
    assert_eq!(code, 2);
}

/// Every path under `root` with its size (files) or `/` (directories), for a failure message.
fn tree(root: &std::path::Path) -> String {
    let mut out = String::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let shown = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if meta.is_dir() {
            out.push_str(&format!("{shown}/\n"));
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else {
            out.push_str(&format!("{shown} {}\n", meta.len()));
        }
    }
    out
}
