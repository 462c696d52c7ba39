//! Dev-only measurement: how many short tasks (`true`) one agent launches and finishes per
//! second with `--isolation none` against `--isolation cgroups` (docs/benchmarks.md, "Launch
//! overhead of cgroups").
//!
//! ```sh
//! cargo run --release -p ringmaster-agent --example launch_overhead -- [TASKS] [RUNS]
//! ```
//!
//! Each run gives one fresh agent state (its own work dir) a single `RunTasks` of TASKS tasks
//! (default 200, `cpus:0.1;mem:32` each), and times from the launch until every task's end
//! has been handled (process gone, cgroup removed, FINISHED issued). It goes through the same
//! code as the agent daemon (`AgentState::run_tasks`: sandbox, task user, cgroup, spawn), only
//! without a master connection. The cgroup runs need root and usable cgroups; they are
//! skipped with a note otherwise.

use std::path::Path;
use std::time::{Duration, Instant};

use ringmaster_agent::isolation::{Isolation, IsolationConfig, IsolationMode};
use ringmaster_agent::state::AgentState;
use ringmaster_agent::users::default_task_user;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{RunTasks, TaskInfo, TaskState};

fn config(work_dir: &Path) -> AgentConfig {
    AgentConfig {
        master: "127.0.0.1:1".into(),
        id: None,
        hostname: "bench".into(),
        resources: Resources::parse("cpus:100000;mem:100000000").unwrap(),
        devices: Vec::new(),
        device_selection: Default::default(),
        attributes: Vec::new(),
        work_dir: work_dir.to_path_buf(),
        kill_grace: Duration::from_secs(3),
        reconnect_max_backoff: Duration::from_secs(1),
        security: Default::default(),
        task_user: default_task_user(),
        allow_root_tasks: false,
        gpu_sharing: Default::default(),
        usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
        safeguards: Default::default(),
    }
}

/// Tasks per second of one run and the share of the time spent launching (the rest is waiting
/// for the ends), or why it could not run.
async fn one_run(mode: IsolationMode, tasks: usize) -> Result<(f64, f64), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| e.to_string())?;
    }
    let isolation = Isolation::setup(
        &IsolationConfig {
            mode,
            ..Default::default()
        },
        dir.path(),
    )
    .map_err(|e| format!("{e:#}"))?;
    let (mut state, mut exits) =
        AgentState::with_isolation(config(dir.path()), isolation.clone(), "bench".into());
    let resources = Resources::parse("cpus:0.1;mem:32").unwrap().to_wire();
    let batch: Vec<TaskInfo> = (0..tasks)
        .map(|i| TaskInfo {
            task_id: format!("t{i}"),
            name: "true".into(),
            command: "true".into(),
            resources: Some(resources.clone()),
            framework_id: "bench".into(),
            ..Default::default()
        })
        .collect();
    let started = Instant::now();
    state.run_tasks(RunTasks {
        tasks: batch,
        leader_term: 0,
    });
    let launched = started.elapsed();
    let mut finished = 0;
    for _ in 0..tasks {
        let (key, outcome) = exits.recv().await.ok_or("exit channel closed")?;
        let out = state.process_exited(key, outcome);
        let ok = out.iter().any(|m| match m {
            ringmaster_proto::Message::StatusUpdate(u) => u
                .status
                .as_ref()
                .is_some_and(|s| s.state == TaskState::TaskFinished as i32),
            _ => false,
        });
        finished += usize::from(ok);
    }
    let elapsed = started.elapsed();
    if finished != tasks {
        return Err(format!("only {finished} of {tasks} tasks finished"));
    }
    isolation.remove_agent_cgroup();
    Ok((
        tasks as f64 / elapsed.as_secs_f64(),
        launched.as_secs_f64() / elapsed.as_secs_f64(),
    ))
}

/// Mean time to make and limit one task cgroup, and to remove it again, without processes.
fn cgroup_cost(tasks: usize) -> Result<(Duration, Duration), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let isolation = Isolation::setup(
        &IsolationConfig {
            mode: IsolationMode::Cgroups,
            ..Default::default()
        },
        dir.path(),
    )
    .map_err(|e| format!("{e:#}"))?;
    let resources = Resources::parse("cpus:0.1;mem:32").unwrap();
    let started = Instant::now();
    let cgroups = (0..tasks)
        .map(|i| isolation.create_task_cgroup("bench", &format!("t{i}"), &resources))
        .collect::<Result<Vec<_>, _>>()?;
    let created = started.elapsed();
    let started = Instant::now();
    for cgroup in cgroups.into_iter().flatten() {
        cgroup.remove()?;
    }
    let removed = started.elapsed();
    let n = u32::try_from(tasks.max(1)).unwrap_or(u32::MAX);
    Ok((created / n, removed / n))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    println!("{tasks} tasks of `true` per run, {runs} runs per isolation level (interleaved)");
    let modes = [IsolationMode::None, IsolationMode::Cgroups];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut skipped = vec![false; modes.len()];
    for run in 1..=runs {
        for (i, mode) in modes.iter().enumerate() {
            if skipped[i] {
                continue;
            }
            match one_run(*mode, tasks).await {
                Ok((rate, launching)) => {
                    println!(
                        "isolation {mode}: run {run}: {rate:.0} tasks/s ({:.0}% of the time \
                         launching)",
                        launching * 100.0
                    );
                    rates[i].push(rate);
                }
                Err(e) => {
                    println!("isolation {mode}: skipped ({e})");
                    skipped[i] = true;
                }
            }
        }
    }
    match cgroup_cost(tasks) {
        Ok((create, remove)) => println!(
            "one task cgroup alone: {:.0} µs to make and limit, {:.0} µs to remove",
            create.as_secs_f64() * 1e6,
            remove.as_secs_f64() * 1e6
        ),
        Err(e) => println!("cgroup cost: skipped ({e})"),
    }
    for (mode, rates) in modes.iter().zip(rates) {
        if !rates.is_empty() {
            println!(
                "isolation {mode}: median {:.0} tasks/s over {} runs",
                median(rates.clone()),
                rates.len()
            );
        }
    }
}
