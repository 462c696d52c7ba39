//! Task cgroups on the agent's real launch path (docs/security.md, "Isolation"): memory, cpu
//! and process limits from the task's resources, a kill that reaches processes which left the
//! task's process group, cgroups removed when tasks end, stale cgroups of an earlier run
//! removed at startup, and task users still switched inside a cgroup; the agent's cgroup capped
//! at what the agent offers, and the default limits of a task that names no cpus or mem.
//! Needs root and a writable cgroup hierarchy (v1 or v2): skipped otherwise.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringmaster_agent::isolation::{
    limited_resources, GpuAccess, Isolation, IsolationConfig, IsolationMode, TaskCgroup,
};
use ringmaster_agent::process::process_is_alive;
use ringmaster_agent::state::{AgentState, ExitReceiver};
use ringmaster_agent::users::lookup_user;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{KillTask, Message, RunTasks, TaskInfo, TaskState, TaskStatus};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

mod common;

fn config(work_dir: &Path) -> AgentConfig {
    AgentConfig {
        resources: Resources::parse("cpus:2;mem:1024;disk:1024").unwrap(),
        kill_grace: Duration::from_secs(3),
        ..common::config(work_dir, "isolation-host")
    }
}

/// Cgroup isolation for an agent on `work_dir`, or `None` (test skipped) when not root or the
/// cgroup hierarchy is not usable.
fn cgroups(work_dir: &Path, pids_per_task: u64) -> Option<Isolation> {
    if !is_root() {
        println!("skipped: needs root");
        return None;
    }
    let config = IsolationConfig {
        mode: IsolationMode::Cgroups,
        pids_per_task,
        ..IsolationConfig::default()
    };
    match Isolation::setup(&config, work_dir) {
        Ok(isolation) => Some(isolation),
        Err(e) => {
            println!("skipped: needs root (and writable cgroups: {e:#})");
            None
        }
    }
}

/// A work dir the task user can traverse (tempdirs are 0700).
fn work_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

fn task(id: &str, resources: &str, command: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: command.into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        framework_id: "fw".into(),
        ..Default::default()
    }
}

fn statuses(out: &[Message]) -> Vec<TaskStatus> {
    out.iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect()
}

fn start(state: &mut AgentState, info: TaskInfo) {
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let s = statuses(&out);
    assert_eq!(s.len(), 1, "{out:?}");
    assert_eq!(s[0].state, TaskState::TaskRunning as i32, "{:?}", s[0]);
}

/// Waits for the next task end and returns its final status.
async fn next_end(state: &mut AgentState, exits: &mut ExitReceiver, id: &str) -> TaskStatus {
    let (key, outcome) = timeout(WAIT, exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    assert_eq!(key.task_id, id);
    let out = state.process_exited(key, outcome);
    statuses(&out).last().cloned().expect("a final status")
}

/// The task's newest run directory (its working directory, with its output).
fn sandbox(work_dir: &Path, id: &str) -> std::path::PathBuf {
    ringmaster_agent::sandbox::latest_run_dir(work_dir, "fw", id)
}

/// The agent's record of the task's newest run (in its own meta dir).
fn record(work_dir: &Path, id: &str) -> std::path::PathBuf {
    let run = ringmaster_agent::sandbox::latest_run(work_dir, "fw", id).expect("a run");
    ringmaster_agent::task_files::meta_dir(work_dir, "fw", id, &run)
        .join(ringmaster_agent::task_files::TASK_FILE)
}

fn sandbox_file(work_dir: &Path, id: &str, name: &str) -> String {
    std::fs::read_to_string(sandbox(work_dir, id).join(name)).unwrap_or_default()
}

/// Waits until the task wrote `name` in its sandbox (a condition, not a fixed sleep).
async fn wait_for_file(work_dir: &Path, id: &str, name: &str) -> String {
    let path = sandbox(work_dir, id).join(name);
    timeout(WAIT, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                if text.ends_with('\n') {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never written", path.display()))
}

fn cgroup_exists(isolation: &Isolation, id: &str) -> bool {
    let r = Resources::parse("cpus:1").unwrap();
    isolation.existing_task_cgroup("fw", id, &r).is_some()
}

/// Removes the agent's cgroup once the test is done, so test runs leave nothing behind.
struct Cleanup(Isolation);

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.0.clean_stale(&[]);
        self.0.remove_agent_cgroup();
    }
}

/// One agent with cgroup isolation on a fresh work dir.
struct Agent {
    dir: tempfile::TempDir,
    isolation: Isolation,
    state: AgentState,
    exits: ExitReceiver,
    _cleanup: Cleanup,
}

impl Agent {
    /// `None` (the test is skipped) when not root or cgroups are not usable.
    fn new(pids_per_task: u64) -> Option<Agent> {
        let dir = work_dir();
        let isolation = cgroups(dir.path(), pids_per_task)?;
        let (state, exits) =
            AgentState::with_isolation(config(dir.path()), isolation.clone(), "a1".into());
        Some(Agent {
            _cleanup: Cleanup(isolation.clone()),
            dir,
            isolation,
            state,
            exits,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn start(&mut self, info: TaskInfo) {
        start(&mut self.state, info);
    }

    async fn end(&mut self, id: &str) -> TaskStatus {
        next_end(&mut self.state, &mut self.exits, id).await
    }

    fn kill(&mut self, id: &str) {
        kill(&mut self.state, id);
    }
}

fn kill(state: &mut AgentState, id: &str) {
    state.kill_task(KillTask {
        leader_term: 0,
        task_id: id.into(),
        framework_id: "fw".into(),
        reason: String::new(),
    });
}

#[tokio::test]
async fn a_task_over_its_memory_limit_fails_with_memory_limit() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    // `tail` keeps the whole line it is reading: 200 MB of zeros without a newline.
    agent.start(task(
        "hog",
        "cpus:1;mem:32",
        "echo eating memory >&2; head -c 200M /dev/zero | tail > /dev/null",
    ));
    let end = agent.end("hog").await;
    assert_eq!(end.state, TaskState::TaskFailed as i32, "{end:?}");
    assert_eq!(end.reason, "memory_limit", "{end:?}");
    // The limit first, then how the task ended and the last lines of its stderr.
    assert!(
        end.message.starts_with("memory limit 32 MiB exceeded"),
        "{end:?}"
    );
    assert!(end.message.contains("; stderr: eating memory"), "{end:?}");
    assert!(
        !cgroup_exists(&agent.isolation, "hog"),
        "the cgroup outlived the task"
    );

    // The same command within its limit finishes.
    agent.start(task(
        "fits",
        "cpus:1;mem:512",
        "head -c 20M /dev/zero | tail > /dev/null",
    ));
    let end = agent.end("fits").await;
    assert_eq!(end.state, TaskState::TaskFinished as i32, "{end:?}");
}

/// A task that names only `disk` is held to the agent's default limits (`cpus:0.1;mem:32`),
/// end to end through the launch path: 200 MB of memory gets it OOM-killed at 32 MiB (before,
/// such a task ran with no limits at all). With `--default-task-resources none` it is refused.
#[tokio::test]
async fn a_task_naming_only_disk_is_held_to_the_default_limits() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    agent.start(task(
        "disk-only",
        "disk:1",
        "head -c 200M /dev/zero | tail > /dev/null",
    ));
    let end = agent.end("disk-only").await;
    assert_eq!(end.reason, "memory_limit", "{end:?}");
    assert!(
        end.message.starts_with("memory limit 32 MiB exceeded"),
        "{end:?}"
    );

    let dir = work_dir();
    let Some(isolation) = cgroups(dir.path(), 4096) else {
        return;
    };
    let _cleanup = Cleanup(isolation.clone());
    let mut strict = config(dir.path());
    strict.safeguards.default_task_resources = None;
    let (mut state, _exits) = AgentState::with_isolation(strict, isolation, "a1".into());
    let out = state.run_tasks(ringmaster_proto::RunTasks {
        tasks: vec![task("disk-only", "disk:1", "true")],
        leader_term: 0,
    });
    let refused = &statuses(&out)[0];
    assert_eq!(refused.reason, "launch_failed", "{refused:?}");
    assert!(
        refused.message.contains("--default-task-resources none"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_busy_task_with_half_a_cpu_gets_about_half_a_core() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    agent.start(task(
        "busy",
        "cpus:0.5;mem:64",
        "echo started > started; while :; do :; done",
    ));
    wait_for_file(agent.path(), "busy", "started").await;
    let resources = Resources::parse("cpus:0.5;mem:64").unwrap();
    let cgroup = agent
        .isolation
        .existing_task_cgroup("fw", "busy", &resources)
        .expect("the task's cgroup");
    let usage = || cgroup.cpu_usage().expect("cpu usage of the cgroup");
    // Waits until the task has used one second of CPU, then divides by the wall time it took
    // (the assertion is on the rate, with a wide band).
    let (u0, t0) = (usage(), Instant::now());
    let u1 = timeout(WAIT, async {
        loop {
            let u = usage();
            if u - u0 >= Duration::from_secs(1) {
                return u;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the busy task used a second of CPU");
    let t1 = Instant::now();
    let cores = (u1 - u0).as_secs_f64() / (t1 - t0).as_secs_f64();
    println!("cpus:0.5 task used {cores:.3} cores");
    assert!((0.3..=0.7).contains(&cores), "used {cores:.3} cores");
    agent.kill("busy");
    let end = agent.end("busy").await;
    assert_eq!(end.state, TaskState::TaskKilled as i32, "{end:?}");
    assert!(!cgroup.exists(), "the cgroup outlived the task");
}

#[tokio::test]
async fn a_task_cannot_fork_past_its_process_limit() {
    let Some(mut agent) = Agent::new(16) else {
        return;
    };
    // 40 background sleeps; each one that started is recorded. The wrapper and the shell
    // count against the limit of 16 too.
    agent.start(task(
        "forky",
        "cpus:1;mem:128",
        "for i in $(seq 1 40); do sleep 60 & echo $! >> started; done; echo done > done",
    ));
    let end = agent.end("forky").await;
    let started = sandbox_file(agent.path(), "forky", "started")
        .lines()
        .count();
    let stderr = sandbox_file(agent.path(), "forky", "stderr");
    println!("started {started} of 40 under a limit of 16; {end:?}; stderr: {stderr}");
    assert!(
        started < 16,
        "{started} processes started under a limit of 16"
    );
    assert!(started > 0, "nothing started at all: {stderr}");
    assert!(
        stderr.to_lowercase().contains("fork")
            || stderr.contains("Resource temporarily unavailable"),
        "{stderr}"
    );
    assert_ne!(end.state, TaskState::TaskRunning as i32);
    // What it left running was killed with it.
    assert!(!cgroup_exists(&agent.isolation, "forky"));
}

#[tokio::test]
async fn a_process_that_leaves_its_group_is_killed_with_the_task() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    // A new session (so a new process group) that ignores SIGTERM, and a per-task kill grace
    // far shorter than the agent's 3 s.
    let mut info = task(
        "escapee",
        "cpus:1;mem:64",
        "setsid sh -c 'trap \"\" TERM; echo $$ > bg.pid; while :; do sleep 1; done' & \
         sleep 1000",
    );
    info.kill_grace_ms = 300;
    agent.start(info);
    let bg: u32 = wait_for_file(agent.path(), "escapee", "bg.pid")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(process_is_alive(bg));
    // It really left the task's process group.
    let stat = std::fs::read_to_string(format!("/proc/{bg}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    assert_eq!(fields[2], bg.to_string(), "the escapee leads its own group");

    let killed_at = Instant::now();
    agent.kill("escapee");
    let end = agent.end("escapee").await;
    let took = killed_at.elapsed();
    assert_eq!(end.state, TaskState::TaskKilled as i32, "{end:?}");
    assert!(
        !process_is_alive(bg),
        "the process that left its group survived"
    );
    assert!(
        !cgroup_exists(&agent.isolation, "escapee"),
        "cgroup not removed"
    );
    // SIGKILL came after the task's own grace, not the agent's 3 s.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
}

#[tokio::test]
async fn a_task_user_cannot_read_an_agent_secret_inside_its_cgroup() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    let nobody = lookup_user("nobody").expect("the nobody user exists");
    let secret = agent.path().join("secret");
    std::fs::write(&secret, "top secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let command = format!(
        "cat /proc/self/cgroup > cgroup; id -u > uid; cat {}",
        secret.display()
    );
    agent.start(task("peek", "cpus:0.5;mem:64", &command));
    let end = agent.end("peek").await;
    assert_eq!(end.state, TaskState::TaskFailed as i32, "{end:?}");
    assert_eq!(sandbox_file(agent.path(), "peek", "stdout"), "");
    let stderr = sandbox_file(agent.path(), "peek", "stderr");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    // It ran as nobody, inside its own cgroup (joined before exec, as root).
    assert_eq!(
        sandbox_file(agent.path(), "peek", "uid").trim(),
        nobody.uid.to_string()
    );
    let path = agent.isolation.task_cgroup_path("fw", "peek").unwrap();
    let cgroups = sandbox_file(agent.path(), "peek", "cgroup");
    assert!(
        cgroups.lines().any(|l| l.ends_with(&format!("/{path}"))),
        "not in {path}: {cgroups}"
    );
}

#[tokio::test]
async fn stale_cgroups_of_an_earlier_run_are_removed_and_recovered_ones_kept() {
    // The earlier run: one task it launched (and recorded in its task file)...
    let Some(mut first) = Agent::new(4096) else {
        return;
    };
    first.start(task(
        "kept",
        "cpus:0.5;mem:64",
        "echo $$ > me.pid; sleep 1000",
    ));
    let (dir, isolation) = (first.path().to_path_buf(), first.isolation.clone());
    let kept_pid: u32 = wait_for_file(&dir, "kept", "me.pid")
        .await
        .trim()
        .parse()
        .unwrap();
    // ... and cgroups it left without a task file: one with a process still in it, one empty.
    let r = Resources::parse("cpus:1;mem:64").unwrap();
    let stale = isolation
        .create_task_cgroup("fw", "stale", &r)
        .unwrap()
        .unwrap();
    let mut orphan = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    for file in stale.procs_files() {
        std::fs::write(file.to_str().unwrap(), orphan.id().to_string()).unwrap();
    }
    assert_eq!(stale.pids(), vec![orphan.id()]);
    isolation
        .create_task_cgroup("fw", "empty", &r)
        .unwrap()
        .unwrap();

    // The agent restarts on the same work dir: it recovers "kept" and re-attaches its cgroup,
    // and removes the others (killing the orphan).
    let again = cgroups(&dir, 4096).unwrap();
    let (mut second, mut exits) =
        AgentState::with_isolation(config(&dir), again.clone(), "a1".into());
    assert_eq!(second.recover_tasks(), 1);
    let keep = second.cgroups_in_use();
    assert_eq!(keep, vec!["fw+kept".to_string()]);
    assert_eq!(again.clean_stale(&keep), 2);
    assert!(!cgroup_exists(&again, "stale"));
    assert!(!cgroup_exists(&again, "empty"));
    let status = timeout(WAIT, tokio::task::spawn_blocking(move || orphan.wait()))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!status.success(), "the orphan was killed: {status:?}");
    assert!(cgroup_exists(&again, "kept"));
    assert!(process_is_alive(kept_pid));

    // The recovered task is killed through its cgroup, which then goes away.
    kill(&mut second, "kept");
    let end = next_end(&mut second, &mut exits, "kept").await;
    assert_eq!(end.state, TaskState::TaskKilled as i32, "{end:?}");
    assert!(!process_is_alive(kept_pid));
    assert!(!cgroup_exists(&again, "kept"));
}

#[tokio::test]
async fn a_health_check_runs_in_the_tasks_cgroup_as_the_task_user() {
    let Some(mut agent) = Agent::new(4096) else {
        return;
    };
    let nobody = lookup_user("nobody").expect("the nobody user exists");
    let mut health = agent.state.take_health_events().unwrap();
    let mut info = task("checked", "cpus:0.5;mem:64", "exec sleep 300");
    info.health = Some(ringmaster_proto::HealthCheck {
        command: "cat /proc/self/cgroup > check-cgroup; id -u > check-uid".into(),
        interval_ms: 100,
        timeout_ms: 1000,
        failures: 1,
        grace_ms: 10,
    });
    agent.start(info);
    let (key, event) = timeout(WAIT, health.recv()).await.unwrap().unwrap();
    assert_eq!(event, ringmaster_agent::health::HealthEvent::Healthy);
    agent.state.health_changed(key, event);
    assert_eq!(
        sandbox_file(agent.path(), "checked", "check-uid").trim(),
        nobody.uid.to_string()
    );
    let path = agent.isolation.task_cgroup_path("fw", "checked").unwrap();
    let cgroups = sandbox_file(agent.path(), "checked", "check-cgroup");
    assert!(
        cgroups.lines().any(|l| l.ends_with(&format!("/{path}"))),
        "the check is not in {path}: {cgroups}"
    );
    agent.kill("checked");
    let end = agent.end("checked").await;
    assert_eq!(end.state, TaskState::TaskKilled as i32, "{end:?}");
}

/// A task recorded only as starting (no supervisor or task pid: the agent stopped before it
/// opened the task's launch gate) never ran, whatever its cgroup holds: the restarted agent does
/// not adopt it, and what is left in its cgroup is killed and the cgroup removed with the other
/// leftovers of the earlier run. (Before the per-task supervisor such a task was adopted by its
/// cgroup; now the supervisor kills what it started when the gate never opens, so processes
/// found there are leftovers.)
#[tokio::test]
async fn a_task_recorded_only_as_starting_is_not_adopted_and_its_cgroup_is_cleaned() {
    let Some(mut first) = Agent::new(4096) else {
        return;
    };
    first.start(task(
        "midway",
        "cpus:0.5;mem:64",
        "echo $$ > me.pid; sleep 1000",
    ));
    let dir = first.path().to_path_buf();
    let shell: u32 = wait_for_file(&dir, "midway", "me.pid")
        .await
        .trim()
        .parse()
        .unwrap();
    // As the record was before the process started: no pids yet.
    let file = record(&dir, "midway");
    let starting: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| match l.split_once('=') {
            Some((key, _))
                if ["pid", "start_ticks", "supervisor_pid", "supervisor_ticks"].contains(&key) =>
            {
                format!("{key}=0")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&file, starting + "\n").unwrap();

    let again = cgroups(&dir, 4096).unwrap();
    let (mut second, _exits) = AgentState::with_isolation(config(&dir), again.clone(), "a1".into());
    assert_eq!(
        second.recover_tasks(),
        0,
        "a task that never ran is not adopted"
    );
    assert!(second.cgroups_in_use().is_empty());
    assert_eq!(again.clean_stale(&second.cgroups_in_use()), 1);
    assert!(!cgroup_exists(&again, "midway"));
    timeout(WAIT, async {
        while process_is_alive(shell) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the leftover process was killed");
}

/// Cgroup isolation whose agent cgroup is capped at `offered` and `max_task_pids`, or `None`
/// (test skipped).
fn capped(work_dir: &Path, offered: Option<&Resources>, max_task_pids: u64) -> Option<Isolation> {
    if !is_root() {
        println!("skipped: needs root");
        return None;
    }
    let config = IsolationConfig {
        mode: IsolationMode::Cgroups,
        pids_per_task: 4096,
        max_task_pids,
    };
    match Isolation::setup_with_caps(&config, work_dir, offered) {
        Ok(isolation) => Some(isolation),
        Err(e) => {
            println!("skipped: needs root (and writable cgroups: {e:#})");
            None
        }
    }
}

/// The content of the first of `files` found in one of `dirs` (a cgroup's directories, one per
/// hierarchy), trimmed; v1 and v2 name the same limit differently.
fn read_limit(dirs: &[PathBuf], files: &[&str]) -> String {
    for dir in dirs {
        for file in files {
            if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                return text.trim().to_string();
            }
        }
    }
    panic!("none of {files:?} in {dirs:?}");
}

fn task_dirs(cgroup: &TaskCgroup) -> Vec<PathBuf> {
    cgroup
        .procs_files()
        .iter()
        .map(|f| {
            PathBuf::from(f.to_str().unwrap())
                .parent()
                .unwrap()
                .to_path_buf()
        })
        .collect()
}

fn v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The memory limit, CPU quota (µs per 100 ms, `None`: no quota) and pids limit of a cgroup.
fn limits_of(dirs: &[PathBuf]) -> (Option<u64>, Option<u64>, String) {
    let number = |text: String| match text.as_str() {
        "max" | "-1" => None,
        n => Some(n.parse::<u64>().unwrap()),
    };
    let memory = number(read_limit(dirs, &["memory.max", "memory.limit_in_bytes"]));
    let quota = if v2() {
        let max = read_limit(dirs, &["cpu.max"]);
        let (quota, period) = max.split_once(' ').unwrap();
        assert_eq!(period, "100000", "{max}");
        number(quota.to_string())
    } else {
        assert_eq!(read_limit(dirs, &["cpu.cfs_period_us"]), "100000");
        number(read_limit(dirs, &["cpu.cfs_quota_us"]))
    };
    // v1 reports "no memory limit" as a huge page-aligned number.
    let memory = memory.filter(|&m| m < 1 << 60);
    (memory, quota, read_limit(dirs, &["pids.max"]))
}

const MIB: u64 = 1024 * 1024;

#[test]
fn the_agent_cgroup_is_capped_at_what_the_agent_offers() {
    let dir = work_dir();
    let offered = Resources::parse("cpus:1.5;mem:256;disk:1000").unwrap();
    let Some(isolation) = capped(dir.path(), Some(&offered), 500) else {
        return;
    };
    let _cleanup = Cleanup(isolation.clone());
    let agent = isolation.agent_cgroup_dirs();
    println!("agent cgroup: {agent:?}");
    assert!(!agent.is_empty());
    assert!(agent.iter().all(|d| d.is_dir()), "{agent:?}");
    assert_eq!(
        limits_of(&agent),
        (Some(256 * MIB), Some(150_000), "500".to_string())
    );
    if !v2() {
        // v1: children are charged to the parent (the kernel's default since 5.x; older
        // kernels may say 0 at the top).
        assert_eq!(read_limit(&agent, &["memory.use_hierarchy"]), "1");
    }

    // A task asking for more than the agent offers is held to the agent's caps; its pids limit
    // (4096 per task) to the agent's 500 in all.
    let r = Resources::parse("cpus:4;mem:1024").unwrap();
    let big = isolation
        .create_task_cgroup_with_gpus("fw", "big", &r, GpuAccess::Devices(&[]))
        .unwrap()
        .unwrap();
    let dirs = task_dirs(&big);
    assert!(
        dirs.iter()
            .all(|d| agent.contains(&d.parent().unwrap().to_path_buf())),
        "task cgroups are children of the agent's: {dirs:?}"
    );
    assert_eq!(
        limits_of(&dirs),
        (Some(256 * MIB), Some(150_000), "500".to_string())
    );
    // The agent's cgroup goes with its last task, and comes back with its caps with the next.
    big.remove().unwrap();
    assert!(agent.iter().all(|d| !d.exists()), "{agent:?}");
    let r = Resources::parse("cpus:0.5;mem:64").unwrap();
    let next = isolation
        .create_task_cgroup_with_gpus("fw", "next", &r, GpuAccess::Devices(&[]))
        .unwrap()
        .unwrap();
    assert_eq!(
        limits_of(&agent),
        (Some(256 * MIB), Some(150_000), "500".to_string())
    );
    assert_eq!(
        limits_of(&task_dirs(&next)),
        (Some(64 * MIB), Some(50_000), "500".to_string())
    );

    // An agent restarted on the same work dir with other caps (here: none for cpu and memory)
    // replaces them, even with a task cgroup still there.
    let again = capped(dir.path(), None, 64).unwrap();
    assert_eq!(again.agent_cgroup_dirs(), agent);
    assert_eq!(limits_of(&agent), (None, None, "64".to_string()));
    let raised = capped(
        dir.path(),
        Some(&Resources::parse("cpus:2;mem:512").unwrap()),
        1000,
    )
    .unwrap();
    assert_eq!(
        limits_of(&raised.agent_cgroup_dirs()),
        (Some(512 * MIB), Some(200_000), "1000".to_string())
    );
    next.remove().unwrap();
}

/// A task that names only `disk:1` is limited to the default `cpus:0.1;mem:32`. (The agent's
/// launch path passes [`limited_resources`] to its cgroup; this checks that pair directly.)
#[test]
fn a_task_with_disk_only_gets_the_default_limits() {
    let dir = work_dir();
    let Some(isolation) = cgroups(dir.path(), 4096) else {
        return;
    };
    let _cleanup = Cleanup(isolation.clone());
    let defaults = ringmaster_agent::Safeguards::default()
        .default_task_resources
        .unwrap();
    let task = Resources::parse("disk:1").unwrap();
    let limited = limited_resources(&task, Some(&defaults)).unwrap();
    assert_eq!(limited, Resources::parse("cpus:0.1;mem:32;disk:1").unwrap());
    let cgroup = isolation
        .create_task_cgroup_with_gpus("fw", "disk-only", &limited, GpuAccess::Devices(&[]))
        .unwrap()
        .unwrap();
    let (memory, quota, _) = limits_of(&task_dirs(&cgroup));
    assert_eq!(memory, Some(32 * MIB));
    assert_eq!(quota, Some(10_000), "0.1 cpu: 10 ms per 100 ms");
    // A process in it runs under those limits.
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    for file in cgroup.procs_files() {
        std::fs::write(file.to_str().unwrap(), child.id().to_string()).unwrap();
    }
    assert_eq!(cgroup.pids(), vec![child.id()]);
    child.kill().unwrap();
    child.wait().unwrap();
    // Without defaults (`--default-task-resources none`) such a task is refused.
    assert_eq!(
        limited_resources(&task, None).unwrap_err(),
        "the task names no cpus or mem and this agent gives no default \
         (--default-task-resources none)"
    );
    timeout_until_empty(&cgroup);
    cgroup.remove().unwrap();
}

/// Waits (up to [`WAIT`]) until the killed process has left the cgroup.
fn timeout_until_empty(cgroup: &TaskCgroup) {
    let deadline = Instant::now() + WAIT;
    while !cgroup.is_empty() {
        assert!(Instant::now() < deadline, "the cgroup never emptied");
        std::thread::sleep(Duration::from_millis(10));
    }
}
