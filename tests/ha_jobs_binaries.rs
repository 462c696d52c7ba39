//! Jobs on replicated masters, through the real binaries: three `ringmaster serve` with
//! `cluster:`, one agent given the list of masters, a service run with `ringmaster job run
//! --master a,b,c`. The leader is killed with `kill -9`: the new leader's jobs framework takes
//! the running instances over (the same tasks, the same processes, nothing relaunched), and
//! when an instance's process is then killed it is replaced once.

mod processes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use processes::*;

const SERVICE: &str = "name: web\ntype: service\ncount: 2\ntask:\n  \
    command: \"echo $$ > pid; exec sleep 1000\"\n  resources: \"cpus:0.5;mem:64\"\n  \
    kill_grace: 1s\nrestart:\n  attempts: 5\n  delay: 100ms\n";

/// The `pid` file of the newest run of task `task` under the agent's work dir.
fn pid_of(work_dir: &Path, task: &str) -> Option<i32> {
    let sandboxes = work_dir.join("sandboxes");
    for fw in std::fs::read_dir(&sandboxes).ok()?.flatten() {
        let id = fw.file_name().to_string_lossy().into_owned();
        let run = ringmaster_agent::sandbox::latest_run_dir(work_dir, &id, task);
        if let Ok(text) = std::fs::read_to_string(run.join("pid")) {
            return text.trim().parse().ok();
        }
    }
    None
}

/// How many runs task `task` has had on the agent (a relaunch makes a second).
fn runs_of(work_dir: &Path, task: &str) -> usize {
    let sandboxes = work_dir.join("sandboxes");
    let Ok(frameworks) = std::fs::read_dir(&sandboxes) else {
        return 0;
    };
    frameworks
        .flatten()
        .map(|fw| {
            fw.path()
                .join(ringmaster_agent::sandbox::escape_component(task))
        })
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .map(|runs| runs.count())
        .sum()
}

/// The id of the master whose latest "leads" line is not followed by "no longer leads".
fn leader(logs: &mut BTreeMap<u64, MasterLog>) -> Option<u64> {
    for (rx, seen) in logs.values_mut() {
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
    }
    logs.iter()
        .filter_map(|(id, (_, seen))| {
            let at = seen
                .iter()
                .rposition(|l| l.contains("this master leads its group"))?;
            (!seen[at..].iter().any(|l| l.contains("no longer leads"))).then_some(*id)
        })
        .next()
}

#[test]
fn a_new_leader_takes_the_jobs_over_without_relaunching_and_replaces_a_dead_instance_once() {
    let dir = tempfile::tempdir().unwrap();
    // HTTP on the protocol port: the job CLI gets the same list as the agent.
    let (list, mut masters, mut logs) = start_group(dir.path(), 3, &[]);
    let agent_dir: PathBuf = dir.path().join("a1");
    let _agent = start_agent(&list, "a1", "cpus:4;mem:2048", &agent_dir);

    let spec = dir.path().join("web.yaml");
    std::fs::write(&spec, SERVICE).unwrap();
    let (code, out, err) = job(&list, &["run", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let status = status_when(&list, "web", "two instances running", |s| {
        running_tasks(s).len() == 2
    });
    let before = running_tasks(&status);
    let pids: Vec<i32> = before
        .iter()
        .map(|t| pid_of(&agent_dir, t).expect("a pid file"))
        .collect();

    // kill -9 the leader: another master leads, and its jobs framework takes over.
    let old = leader(&mut logs).expect("a master leads");
    drop(masters.remove(&old));
    logs.remove(&old);
    let after = status_when(&list, "web", "the new leader reports the jobs", |s| {
        running_tasks(s) == before
    });
    let new = leader(&mut logs).expect("another master leads");
    assert_ne!(new, old);
    // The same tasks and processes: nothing was relaunched.
    assert_eq!(running_tasks(&after), before);
    for (task, pid) in before.iter().zip(&pids) {
        assert_eq!(
            pid_of(&agent_dir, task),
            Some(*pid),
            "{task} kept its process"
        );
        assert_eq!(runs_of(&agent_dir, task), 1, "{task} ran once");
        assert!(ringmaster_agent::process::process_is_alive(*pid as u32));
    }

    // An instance whose process dies under the new leader is replaced once.
    let killed = std::process::Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let replaced = status_when(&list, "web", "the dead instance replaced", |s| {
        let now = running_tasks(s);
        now.len() == 2 && !now.contains(&before[0]) && now.contains(&before[1])
    });
    let now = running_tasks(&replaced);
    let fresh: Vec<&String> = now.iter().filter(|t| !before.contains(t)).collect();
    assert_eq!(fresh.len(), 1, "{replaced:#}");
    let restarts: u64 = replaced["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["restarts"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(restarts, 1, "one replacement: {replaced:#}");

    let (code, _, err) = job(&list, &["stop", "web"]);
    assert_eq!(code, 0, "{err}");
}
