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

/// The production configuration as one (issue 45): three masters requiring authentication
/// (each other as `master`, the agent as `agent`, the CLI as an `operator` over HTTP), a
/// service with a health check. An instance restarted before the leader is killed keeps its
/// restart count under the new leader, and both instances' health comes back.
#[test]
fn restart_counts_and_health_survive_a_leader_change_with_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let secret = |name: &str| {
        let path = dir.path().join(format!("{name}.secret"));
        ringmaster_proto::files::write_private(&path, format!("{name}-secret\n")).unwrap();
        path
    };
    let (masters_secret, agents_secret, ops_secret) =
        (secret("masters"), secret("agents"), secret("ops"));
    let yaml = format!(
        "auth:\n  required: true\n  principals:\n\
         \x20   masters: {{ secret_file: {}, roles: [master] }}\n\
         \x20   agents: {{ secret_file: {}, roles: [agent] }}\n\
         \x20   ops: {{ secret_file: {}, roles: [operator] }}\n",
        masters_secret.display(),
        agents_secret.display(),
        ops_secret.display()
    );
    // With required authentication the protocol port serves no HTTP: each master has its own.
    let http_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let http_list = http_ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let (list, mut masters, mut logs) = start_group_with(dir.path(), 3, &yaml, |id| {
        vec![
            "--http".to_string(),
            format!("127.0.0.1:{}", http_ports[id as usize - 1]),
        ]
    });
    let agent_dir: PathBuf = dir.path().join("a1");
    let _agent = start_agent_with(
        &list,
        "a1",
        "cpus:4;mem:2048",
        &agent_dir,
        &[
            "--principal",
            "agents",
            "--secret-file",
            agents_secret.to_str().unwrap(),
        ],
    );
    let ops = [
        ("RINGMASTER_PRINCIPAL", Path::new("ops")),
        ("RINGMASTER_SECRET_FILE", ops_secret.as_path()),
    ];
    let status = |what: &str, cond: &dyn Fn(&serde_json::Value) -> bool| {
        status_when_as(&http_list, "web", &ops, what, cond)
    };
    let healthy = |s: &serde_json::Value| {
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] == "running" && i["health"] == "healthy")
            .count()
    };
    let restarts = |s: &serde_json::Value| -> u64 {
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["restarts"].as_u64().unwrap_or(0))
            .sum()
    };

    let spec = dir.path().join("web.yaml");
    std::fs::write(
        &spec,
        "name: web\ntype: service\ncount: 2\ntask:\n  \
         command: \"echo $$ > pid; exec sleep 1000\"\n  resources: \"cpus:0.5;mem:64\"\n  \
         kill_grace: 1s\n  health:\n    command: \"true\"\n    interval: 1s\n    timeout: 1s\n    grace: 0s\n\
         restart:\n  attempts: 5\n  delay: 100ms\n",
    )
    .unwrap();
    // Without credentials the HTTP API refuses.
    let (code, _, err) = job(&http_list, &["run", spec.to_str().unwrap()]);
    assert_ne!(code, 0, "an anonymous job run was accepted");
    assert!(err.contains("401"), "{err}");
    let (code, out, err) = job_with_env(&http_list, &["run", spec.to_str().unwrap()], &ops);
    assert_eq!(code, 0, "{out}{err}");
    let first = status("two healthy instances", &|s| healthy(s) == 2);
    let first_tasks = running_tasks(&first);

    // One instance dies and is replaced: one restart.
    let pid = pid_of(&agent_dir, &first_tasks[0]).expect("a pid file");
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let restarted = status("the instance replaced and healthy", &|s| {
        restarts(s) == 1 && healthy(s) == 2 && !running_tasks(s).contains(&first_tasks[0])
    });
    let before = running_tasks(&restarted);

    // kill -9 the leader: the new one shows the same tasks, the restart and the health.
    let old = leader(&mut logs).expect("a master leads");
    drop(masters.remove(&old));
    logs.remove(&old);
    let after = status("the new leader keeps restarts and health", &|s| {
        running_tasks(s) == before && restarts(s) == 1 && healthy(s) == 2
    });
    assert_eq!(running_tasks(&after), before);
    for task in &before {
        assert_eq!(runs_of(&agent_dir, task), 1, "{task} ran once");
    }
    assert_ne!(leader(&mut logs), Some(old));
}
