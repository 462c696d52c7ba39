//! The Ringmaster agent daemon: registers a machine with the master and runs its tasks as
//! real processes.
//!
//! The same library runs as the `ringmaster-agent` binary (one agent per process) and inside
//! `ringmaster local` (several agents in one process, each with its own work dir).
//!
//! # Agent-side protocol (version 1)
//!
//! 1. **Connect and handshake.** TCP to `--master` (with a list `a,b,c`, to the first that
//!    answers; `Error{NOT_LEADER}` sends the agent to the `leader` it names, else to the next
//!    master, see docs/protocol.md); send `Hello{protocol_version: 1, client:
//!    "ringmaster-agent <version>"}`; expect `HelloAck`. An `Error` with `VERSION_MISMATCH` ends
//!    the agent with an error (no retry). Any other answer, a timeout (10 s) or a closed
//!    connection is retried with backoff.
//! 2. **Register.** Send `RegisterAgent{agent_id, hostname, total, attributes, tasks}`. The id is
//!    `--id`, else the one saved in `<work_dir>/agent_id`, else empty (the master assigns one).
//!    `tasks` holds the status of every non-terminal task still running (reconciliation) and of
//!    every ended task whose terminal update is not acknowledged yet, with empty `update_id`. Expect `AgentRegistered{agent_id, heartbeat_interval_ms}` (0 means
//!    5 s); the id is saved to `<work_dir>/agent_id` and used from then on.
//! 3. **After registering**, send every unacknowledged `StatusUpdate` (oldest first), then an
//!    `AgentHeartbeat{agent_id, free, tasks}` (`free` = total − resources of non-terminal tasks,
//!    `tasks` = their statuses, empty `update_id`). Heartbeats follow every heartbeat interval
//!    and right after every change (a `RunTasks` batch handled, a task ended).
//! 4. **Serving.** `Ping` → `Pong` with the same nonce. `RunTasks` → per task:
//!    already known → its pending updates are resent (or its current status under a fresh
//!    update id); unusable (bad resources, empty id or command) → `FAILED` `launch_failed`;
//!    not fitting in free → `FAILED` `insufficient_resources`; the work dir's disk below 16 MiB
//!    free → `FAILED` `agent_disk_full`; else `sh -c COMMAND`, started by its own root
//!    supervisor ([`supervisor`], which waits for it and records its exit status in the agent's
//!    own `<work_dir>/meta/`), in its own process group in a fresh run directory
//!    `<work_dir>/sandboxes/<framework_id>/<task_id>/<run>` ([`sandbox`]; ids escaped) with
//!    `stdout`/`stderr` files (created by the task's user) and `RINGMASTER_{TASK_ID,FRAMEWORK_ID,AGENT_ID,RESOURCES,SANDBOX}`
//!    plus the task's env → `RUNNING`; on an agent with GPUs (docs/devices.md) a GPU task
//!    (`gpus`, or `gpu_milli` / `gpu_mem`, in its resources; `gpu_models`) gets the devices of the
//!    master's binding (`TaskInfo.devices`, checked against the agent's own per-device
//!    accounting) or, without one, devices picked by `--device-selection`; the task sees
//!    `CUDA_VISIBLE_DEVICES` and `RINGMASTER_DEVICES` (`gpu:INDEX:SHARE:MEMORY,…`; both empty
//!    for tasks without GPUs; with `--gpu-sharing mps` a slice also gets its `CUDA_MPS_*`
//!    limits, [`mps`], and fails `launch_failed` while the MPS daemon is down; with cgroup v1
//!    its cgroup opens only its own NVIDIA nodes, [`device_rules`]) and `RUNNING` carries the binding in `TaskStatus.devices`; no
//!    device with room → `FAILED` `insufficient_resources`. Registration sends `devices`,
//!    heartbeats `free_devices`; a spawn failure → `FAILED` `launch_failed`. When the
//!    process ends (and its whole group is gone): exit 0 → `FINISHED` (`exit_code` 0); non-zero
//!    → `FAILED` `exit_status` with `exit_code`; a signal the agent did not send → `FAILED`
//!    `signal` (message names it); unless the task exited 0 the message ends with `; stderr: `
//!    and the last lines of its `stderr` (at most 10 lines, 2 KiB). With cgroup isolation ([`isolation`], `--isolation`) each
//!    task runs in its own cgroup limited by its `cpus`, `mem` and `--pids-per-task`; a task
//!    the kernel OOM-killed that did not exit 0 → `FAILED` `memory_limit` ("memory limit N MiB
//!    exceeded"), and a task ends only once its cgroup is empty. `KillTask` → SIGTERM to the
//!    group (and every process of its cgroup), SIGKILL after the grace (`TaskInfo.kill_grace_ms`,
//!    else `--kill-grace`, 3 s), then `KILLED` with the kill's reason (`killed` when empty); an
//!    unknown task → `LOST` `unknown_task`. `StatusAck{update_id}` removes that update from the
//!    queue. `ReadFile{request_id, framework_id, task_id, file, offset, length}` →
//!    `FileData{request_id, data, offset, size, error}`: at most 64 KiB of the task's sandbox
//!    `stdout`/`stderr` from `offset`, read safely ([`files`]). A task with `TaskInfo.health`
//!    is checked while it runs ([`health`]: `sh -c COMMAND` as the task, in its sandbox and
//!    cgroup); a change of health is a `RUNNING` update with `TaskStatus.health`, and
//!    `failures` failed checks in a row kill it: `FAILED` `health_check_failed`.
//! 5. **Reliable updates.** Every `StatusUpdate` has a unique `update_id`
//!    (`<agent_id>-<incarnation ms>-<counter>`) and `timestamp_ms`; it is resent every 2 s
//!    until acknowledged. A terminal task is forgotten once no update of it awaits an ack.
//!    Every `--usage-interval` (10 s) the running tasks are sampled off the session loop
//!    ([`usage`]: the task cgroup's counters, else `/proc` summed over the process group) and
//!    one `UsageReport` with an entry per RUNNING task is sent.
//! 6. **Disconnects.** Tasks keep running; exits are recorded. Reconnect after 100 ms, doubling
//!    up to `reconnect_max_backoff` (5 s), reset after a successful registration. With several
//!    masters, a failed attempt goes on to the next at once; the backoff is waited after a
//!    full pass over the list without success.
//! 9. **Fencing.** The newest nonzero `leader_term` of a `RunTasks`/`KillTask` is kept (also in
//!    `<work_dir>/leader_term`); a `RunTasks` from an older term launches nothing (its new
//!    tasks → `LOST` `stale_leader`), a `KillTask` from one is ignored. Term 0 always passes.
//! 7. **Shutdown.** Every task is killed (reason `agent_shutdown`); once their groups are gone
//!    (bounded by grace + 2 s) the pending updates and a heartbeat are sent best-effort.
//! 8. **Restart.** Each run of a task has a record in the agent's own meta directory
//!    ([`task_files`]; never in the sandbox, which the task owns). An agent started on the same
//!    work dir (after a crash or `kill -9`) adopts the tasks whose supervisor still runs (pid
//!    plus process start time, so a reused pid is never taken for it) and reports the others
//!    with the exit status their supervisor recorded ([`process::adopt`], docs/reliability.md).
//!    Ended runs' sandboxes are collected `--sandbox-gc-delay` after the master acknowledged
//!    their end, sooner above `--disk-watermark` ([`gc`]).

mod args;
mod config;
pub mod config_file;
mod detect;
pub mod device_rules;
pub mod exit_outcome;
pub mod files;
mod flag_checks;
pub mod gc;
pub mod health;
pub mod isolation;
pub mod isolation_config;
pub mod mps;
pub mod process;
pub mod sandbox;
mod session;
pub mod state;
pub mod supervisor;
pub mod task_files;
pub mod updates;
pub mod usage;
pub mod users;
mod work_files;

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context as _;

pub use args::AgentArgs;
pub use config::{
    default_work_dir, isolation_from_args, AgentConfig, Safeguards, DEFAULT_KILL_GRACE,
    DEFAULT_RECONNECT_MAX_BACKOFF, WORK_DIR_NAME,
};
pub use detect::{detect_gpus, detect_hostname, detect_resources};
pub use flag_checks::parse_attributes;
pub use isolation_config::{IsolationConfig, IsolationMode};
pub use work_files::{AGENT_ID_FILE, LEADER_TERM_FILE};

/// Runs one agent with the default isolation (`auto`) until `shutdown` completes; see
/// [`run_with_isolation`].
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    run_with_isolation(config, IsolationConfig::default(), shutdown).await
}

/// Runs one agent until `shutdown` completes (then kills its tasks and returns `Ok`). Returns
/// an error only for what retrying cannot fix: an unusable work dir, `--isolation cgroups`
/// without usable cgroups, a protocol version the master does not speak, or a master that refuses
/// the agent itself (`AGENT_REFUSED`: its resources exceed `max_agent_resources`).
pub async fn run_with_isolation(
    config: AgentConfig,
    isolation: IsolationConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    ringmaster_proto::masters::parse_master_list(&config.master)
        .map_err(|e| anyhow::anyhow!("--master `{}`: {e}", config.master))?;
    prepare_work_dir(&config.work_dir)?;
    let isolation = isolation::Isolation::setup_with_caps(
        &isolation,
        &config.work_dir,
        Some(&config.resources),
    )?;
    let agent_id = match &config.id {
        Some(id) => id.clone(),
        None => saved_agent_id(&config)?,
    };
    tracing::info!(master = %config.master, hostname = %config.hostname,
        resources = %config.resources, work_dir = %config.work_dir.display(),
        agent_id = %agent_id, isolation = %isolation.describe(), "agent starting");
    if config.gpu_sharing.mode == mps::GpuSharingMode::Mps {
        let dir = &config.gpu_sharing.pipe_dir;
        if mps::daemon_running(dir) {
            tracing::info!(pipe_dir = %dir.display(), "gpu_sharing: mps; the MPS control daemon is up");
        } else {
            tracing::warn!(pipe_dir = %dir.display(), mps_start = config.gpu_sharing.start,
                "gpu_sharing: mps but the MPS control daemon is not running yet; GPU slice tasks \
                 {}", if config.gpu_sharing.start { "will start it" } else { "will fail until it runs" });
        }
    }
    let (mut state, exits) = state::AgentState::with_isolation(config, isolation, agent_id);
    let recovered = state.recover_tasks();
    if recovered > 0 {
        tracing::info!(
            recovered,
            "recovered tasks left by an earlier run in the work dir"
        );
    }
    // Cgroups of tasks not recovered were left by an earlier run: kill what is in them and
    // remove them (blocking file-system work, off the async threads).
    let keep = state.cgroups_in_use();
    let isolation = state.isolation().clone();
    let stale = tokio::task::spawn_blocking(move || isolation.clean_stale(&keep))
        .await
        .unwrap_or(0);
    if stale > 0 {
        tracing::info!(stale, "removed cgroups left by an earlier run");
    }
    let isolation = state.isolation().clone();
    let shutdown = std::pin::pin!(shutdown);
    let result = session::run_sessions(state, exits, shutdown).await;
    let _ = tokio::task::spawn_blocking(move || isolation.remove_agent_cgroup()).await;
    result
}

/// Creates the work dir (0711: task users reach their run directories by path, nobody else
/// lists it) and tightens what an earlier run left open to group or others: everything but
/// `sandboxes/` (whose modes the sandboxes set) becomes at most 0600 (files) or 0700
/// (directories), never following a link; one warning per path changed or left alone
/// (docs/security.md, "Files").
fn prepare_work_dir(work_dir: &std::path::Path) -> anyhow::Result<()> {
    use ringmaster_proto::files;
    let changes =
        files::prepare_work_dir(work_dir, files::TRAVERSABLE_DIR_MODE, &[sandbox::SANDBOXES])
            .with_context(|| format!("cannot create or tighten work dir {}", work_dir.display()))?;
    for change in changes {
        tracing::warn!(work_dir = %work_dir.display(), "work dir: {change}");
    }
    Ok(())
}

/// The id saved by an earlier registration, or empty.
fn saved_agent_id(config: &AgentConfig) -> anyhow::Result<String> {
    let path = config.work_dir.join(AGENT_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim().to_string();
            if id.is_empty() {
                return Ok(id);
            }
            flag_checks::check_agent_id(&id)
                .with_context(|| format!("{} holds an unusable agent id", path.display()))?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The binary's body: reads the `--config` file under the flags, validates them, runs until Ctrl-C or SIGTERM, and maps the result
/// to an exit code (2 for bad flags, 1 for a fatal error).
pub async fn main_with_args(args: AgentArgs) -> ExitCode {
    let flags = args.load().and_then(|args| {
        let isolation = isolation_from_args(&args)?;
        let config = AgentConfig::from_args(args)?;
        Ok((config, isolation))
    });
    let (config, isolation) = match flags {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("ringmaster-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run_with_isolation(config, isolation, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("agent stopped: {e:#}");
            eprintln!("ringmaster-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown requested");
}
