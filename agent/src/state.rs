//! The agent's tasks and what each master request or process exit does to them.
//!
//! This is the agent's memory that outlives connections: which tasks run, what they hold, the
//! status updates not yet acknowledged. Every method answers with the messages to send, so the
//! session only moves bytes and this module can be reasoned about without a socket.

use ringmaster_proto::convert::{BindingWire, DeviceStateWire, ResourcesWire};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ringmaster_proto::devices::{
    DeviceBinding, DeviceRequest, DeviceState, GpuDemand, GPUS, GPU_MEM, GPU_MILLI,
};
use ringmaster_proto::resources::{format_milli, Resources};
use ringmaster_proto::{
    AgentHeartbeat, Attribute, KillTask, Message, RegisterAgent, RunTasks, StatusUpdate,
    TaskHealth, TaskInfo, TaskState, TaskStatus,
};
use tokio::sync::mpsc;

use crate::config::AgentConfig;
use crate::exit_outcome::ExitOutcome;
use crate::gc::{self, DiskSpace};
use crate::health::{self, CheckContext, Checker, HealthEvent, HealthSpec};
use crate::isolation::{self, Isolation};
use crate::mps;
use crate::process::{self, LaunchSpec, ProcessHandle};
use crate::sandbox;
use crate::task_files::{self, TaskFile};
use crate::updates::{unix_ms, StatusQueue};
use crate::users::{self, UserPolicy};
use crate::work_files::LEADER_TERM_FILE;

/// Status reasons the agent sends (machine-readable, see docs/protocol.md).
pub mod reason {
    /// The task's resources do not fit in the agent's free resources.
    pub const INSUFFICIENT_RESOURCES: &str = "insufficient_resources";
    /// The task could not be started (bad fields, sandbox or spawn failure); see the message.
    pub const LAUNCH_FAILED: &str = "launch_failed";
    /// The command exited with a non-zero status (`exit_code` is set).
    pub const EXIT_STATUS: &str = "exit_status";
    /// The command was ended by a signal the agent did not send; the message names it.
    pub const SIGNAL: &str = "signal";
    /// The agent lost track of the process (waiting for it failed).
    pub const WAIT_FAILED: &str = "wait_failed";
    /// The agent stopped after recording the task and before starting its command, which
    /// never ran: the task is reported LOST (launching it again is safe).
    pub const NOT_STARTED: &str = "not_started";
    /// KillTask without a reason.
    pub const KILLED: &str = "killed";
    /// The agent itself is shutting down.
    pub const AGENT_SHUTDOWN: &str = "agent_shutdown";
    /// KillTask for a task this agent does not know.
    pub const UNKNOWN_TASK: &str = "unknown_task";
    /// The kernel killed the task for exceeding its memory limit (`mem`, with cgroups); the
    /// message starts with "memory limit N MiB exceeded".
    pub const MEMORY_LIMIT: &str = "memory_limit";
    /// The task's health check failed `failures` times in a row ([`crate::health`]): it was
    /// reported unhealthy and killed; the message is "health check failed N times: …".
    pub const HEALTH_CHECK_FAILED: &str = "health_check_failed";
    /// `RunTasks` from a deposed leader: its `leader_term` is older than the newest term the
    /// agent has seen (docs/protocol.md, "Leaders and terms"). The task was not launched.
    pub const STALE_LEADER: &str = "stale_leader";
    /// The agent's disk is full: the task was not launched; the message names the free space.
    pub const AGENT_DISK_FULL: &str = "agent_disk_full";
    /// The task's user is not one its framework's principal may use (`TaskInfo.allowed_users`).
    pub const NOT_AUTHORIZED: &str = "not_authorized";
}

/// Below this much free space on the work dir's file system the agent's disk counts as full:
/// new tasks fail `agent_disk_full` and no disk is offered.
pub const DISK_FULL_BELOW: u64 = 16 << 20;

/// The longest kill grace a task may ask for (`TaskInfo.kill_grace_ms`); more counts as this.
pub const MAX_KILL_GRACE: Duration = Duration::from_secs(24 * 3600);

/// The SIGTERM-to-SIGKILL grace of a task: its own `kill_grace_ms` (at most
/// [`MAX_KILL_GRACE`]), or the agent's default when it asks for 0.
pub fn kill_grace_for(kill_grace_ms: u64, agent_default: Duration) -> Duration {
    if kill_grace_ms == 0 {
        agent_default
    } else {
        Duration::from_millis(kill_grace_ms).min(MAX_KILL_GRACE)
    }
}

/// A task is identified by its framework and its id within the framework.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskKey {
    pub framework_id: String,
    pub task_id: String,
}

/// What the agent knows about one task.
#[derive(Debug)]
struct TaskRecord {
    resources: Resources,
    /// The devices it holds (empty without a GPU request).
    devices: DeviceBinding,
    /// The latest status (as last issued).
    status: TaskStatus,
    /// Set once a kill was requested: the reason to report.
    kill_reason: Option<String>,
    process: Option<ProcessHandle>,
    /// The process group leader and its start time (0 when nothing was started), kept in
    /// the task file so a restarted agent can adopt the process.
    pid: u32,
    start_ticks: u64,
    /// `TaskInfo.kill_grace_ms` (0: the agent's default), kept for a restarted agent.
    kill_grace_ms: u64,
    /// Its health checker while the task runs (dropping it stops the checks).
    health_checker: Option<Checker>,
    /// Set when the health check failed: the message the FAILED status carries.
    health_failure: Option<String>,
    /// Its health check, kept in the task file for a restarted agent.
    health_spec: Option<HealthSpec>,
    /// Its run ([`crate::sandbox::create_run`]); empty for a task that never got one.
    run: String,
    /// Its supervisor ([`crate::supervisor`]) and the supervisor's start time.
    supervisor: u32,
    supervisor_ticks: u64,
    /// The task's user (empty: the agent's own) and environment, for its record.
    user: String,
    env: Vec<(String, String)>,
}

impl TaskRecord {
    fn is_active(&self) -> bool {
        !state_of(&self.status).is_terminal()
    }
}

fn state_of(status: &TaskStatus) -> TaskState {
    TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified)
}

/// Process exits, tagged with their task.
pub type ExitReceiver = mpsc::UnboundedReceiver<(TaskKey, ExitOutcome)>;
/// Health changes of tasks with a health check ([`crate::health`]).
pub type HealthReceiver = mpsc::UnboundedReceiver<(TaskKey, HealthEvent)>;

/// The agent's tasks, resources and unacknowledged updates.
#[derive(Debug)]
pub struct AgentState {
    config: AgentConfig,
    agent_id: String,
    tasks: BTreeMap<TaskKey, TaskRecord>,
    updates: StatusQueue,
    exits_tx: mpsc::UnboundedSender<(TaskKey, ExitOutcome)>,
    isolation: Isolation,
    health_tx: mpsc::UnboundedSender<(TaskKey, HealthEvent)>,
    health_rx: Option<HealthReceiver>,
    /// The newest `leader_term` received in a `RunTasks` or `KillTask` (0: none yet), kept in
    /// `<work_dir>/leader_term` so it outlives a restart.
    leader_term: u64,
    /// Ended runs' sandboxes waiting for collection ([`crate::gc`]).
    gc: gc::Collector,
    /// How full the work dir's file system is ([`gc::disk_space`]; replaced in tests).
    disk: fn(&std::path::Path) -> Option<DiskSpace>,
}

impl AgentState {
    /// A state with no tasks and no cgroup isolation; exits of launched processes arrive on
    /// the returned receiver and must be fed back through [`AgentState::process_exited`].
    pub fn new(config: AgentConfig, agent_id: String) -> (Self, ExitReceiver) {
        Self::with_isolation(config, Isolation::disabled(), agent_id)
    }

    /// As [`AgentState::new`], with tasks isolated as `isolation` says (see
    /// [`Isolation::setup`]).
    pub fn with_isolation(
        config: AgentConfig,
        isolation: Isolation,
        agent_id: String,
    ) -> (Self, ExitReceiver) {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let (health_tx, health_rx) = mpsc::unbounded_channel();
        let leader_term = load_leader_term(&config.work_dir);
        let state = AgentState {
            leader_term,
            config,
            agent_id,
            tasks: BTreeMap::new(),
            updates: StatusQueue::new(unix_ms()),
            exits_tx,
            isolation,
            health_tx,
            health_rx: Some(health_rx),
            gc: gc::Collector::default(),
            disk: gc::disk_space,
        };
        (state, exits_rx)
    }

    /// The health changes of checked tasks, to be fed back through
    /// [`AgentState::health_changed`]; `None` once taken.
    pub fn take_health_events(&mut self) -> Option<HealthReceiver> {
        self.health_rx.take()
    }

    /// How tasks are isolated.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// The cgroup names (under the agent's cgroup) of the tasks whose processes this agent
    /// runs or adopted: every other cgroup there was left by an earlier run.
    pub fn cgroups_in_use(&self) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.process.is_some())
            .map(|(k, _)| isolation::task_cgroup_name(&k.framework_id, &k.task_id))
            .collect()
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Replaces how the work dir's free space is measured (tests: a full disk on demand).
    pub fn set_disk_probe(&mut self, probe: fn(&std::path::Path) -> Option<DiskSpace>) {
        self.disk = probe;
    }

    /// The work dir's file system's free space, when it can be measured.
    fn disk_space(&self) -> Option<DiskSpace> {
        (self.disk)(&self.config.work_dir)
    }

    /// Sandboxes of ended runs that are due for collection now (their delay passed, or the
    /// disk is above the watermark), taken off the schedule; the caller removes them
    /// ([`gc::remove`], blocking work).
    pub fn sandboxes_to_collect(&mut self, now_ms: u64) -> Vec<gc::Entry> {
        let safeguards = &self.config.safeguards;
        let disk = self.disk_space();
        let due = self.gc.due(
            now_ms,
            safeguards.sandbox_gc_delay,
            safeguards.disk_watermark,
            // The space the removals will free is not known before they run: above the
            // watermark, the oldest is taken and the next pass measures again.
            |taken| match (disk, taken.is_empty()) {
                (Some(d), true) => Some(d.used()),
                _ => None,
            },
        );
        for entry in &due {
            tracing::info!(sandbox = %entry.run_dir.display(), "collecting an ended task's sandbox");
        }
        due
    }

    /// Sandboxes waiting for collection.
    pub fn sandboxes_waiting(&self) -> usize {
        self.gc.len()
    }

    /// The current agent id (empty until the master assigned one).
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    pub fn set_agent_id(&mut self, id: String) {
        self.agent_id = id;
    }

    /// Total minus what non-terminal tasks hold; the GPU sums come from the devices, since a
    /// whole device also takes its memory.
    pub fn free(&self) -> Resources {
        let mut free = self
            .tasks
            .values()
            .filter(|t| t.is_active())
            .fold(self.config.resources.clone(), |free, t| {
                free.saturating_sub(&t.resources)
            });
        if !self.config.devices.is_empty() {
            let sums = self.device_state().free_scalars();
            for name in [GPUS, GPU_MILLI, GPU_MEM] {
                free.set_milli(name, sums.milli(name));
            }
        }
        // A full disk offers no disk until there is room again.
        if free.milli("disk") > 0 && self.disk_full().is_some() {
            free.set_milli("disk", 0);
        }
        free
    }

    /// `Some(available bytes)` when the work dir's file system is below [`DISK_FULL_BELOW`].
    fn disk_full(&self) -> Option<u64> {
        self.disk_space()
            .map(|d| d.available)
            .filter(|&available| available < DISK_FULL_BELOW)
    }

    /// Each device's free share and memory: all devices minus the bindings of active tasks.
    pub fn device_state(&self) -> DeviceState {
        let mut state = DeviceState::new(self.config.devices.clone())
            .unwrap_or_else(|_| DeviceState::new(Vec::new()).expect("no devices"));
        for t in self.tasks.values().filter(|t| t.is_active()) {
            if state.bind(&t.devices).is_err() {
                // Bindings are checked before launch, so this cannot happen; keep going.
                tracing::error!(devices = %t.devices, "a running task's devices do not fit");
            }
        }
        state
    }

    /// The devices for a task: the master's binding checked against this agent's own
    /// accounting, or one chosen here by the configured policy. `Err((reason, message))`.
    fn bind_devices(
        &self,
        info: &TaskInfo,
        resources: &Resources,
    ) -> Result<DeviceBinding, (&'static str, String)> {
        let request =
            DeviceRequest::from_scalars(resources, info.gpu_models.clone()).map_err(|e| {
                (
                    reason::LAUNCH_FAILED,
                    format!("invalid device request: {e}"),
                )
            })?;
        let Some(request) = request else {
            if info.devices.is_empty() {
                return Ok(DeviceBinding::default());
            }
            return Err((
                reason::LAUNCH_FAILED,
                "devices are bound but the task asks for no GPU".into(),
            ));
        };
        if self.config.devices.is_empty() && matches!(request.demand, GpuDemand::Whole { .. }) {
            // No device list: `gpus` is the plain scalar it always was, checked above.
            return Ok(DeviceBinding::default());
        }
        let state = self.device_state();
        if info.devices.is_empty() {
            return state
                .select(&request, self.config.device_selection)
                .ok_or_else(|| {
                    let free: Vec<String> = state
                        .devices()
                        .iter()
                        .enumerate()
                        .map(|(i, d)| {
                            format!(
                                "gpu {} {}: {} milli, {} MiB",
                                d.index,
                                d.model,
                                state.free_share()[i],
                                state.free_memory()[i]
                            )
                        })
                        .collect();
                    (
                        reason::INSUFFICIENT_RESOURCES,
                        format!("no GPU can hold {request:?} (free: {})", free.join("; ")),
                    )
                });
        }
        let binding = DeviceBinding::from_wire(&info.devices)
            .map_err(|e| (reason::LAUNCH_FAILED, e.to_string()))?;
        state
            .check_binding(&request, &binding)
            .map_err(|e| (reason::INSUFFICIENT_RESOURCES, e.to_string()))?;
        Ok(binding)
    }

    /// Number of tasks whose process still runs.
    pub fn running_processes(&self) -> usize {
        self.tasks.values().filter(|t| t.process.is_some()).count()
    }

    /// The running tasks whose usage is sampled ([`crate::usage`]): those whose process runs
    /// and whose last status is RUNNING.
    pub fn usage_targets(&self) -> Vec<crate::usage::Target> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.process.is_some() && state_of(&t.status) == TaskState::TaskRunning)
            .map(|(k, t)| crate::usage::Target {
                framework_id: k.framework_id.clone(),
                task_id: k.task_id.clone(),
                pgid: t.pid,
            })
            .collect()
    }

    /// Number of status updates waiting for an ack.
    pub fn unacknowledged(&self) -> usize {
        self.updates.len()
    }

    /// Statuses of non-terminal tasks, without update ids (they need no ack).
    fn active_statuses(&self) -> Vec<TaskStatus> {
        self.tasks
            .values()
            .filter(|t| t.is_active())
            .map(|t| TaskStatus {
                update_id: String::new(),
                ..t.status.clone()
            })
            .collect()
    }

    /// The registration message: who we are, what we have, what still runs, and what ended
    /// without the master acknowledging it (so the master learns the real terminal state
    /// instead of declaring the task lost).
    pub fn register_message(&self) -> RegisterAgent {
        RegisterAgent {
            agent_id: self.agent_id.clone(),
            hostname: self.config.hostname.clone(),
            total: Some(self.config.resources.to_wire()),
            attributes: self
                .config
                .attributes
                .iter()
                .map(|(key, value)| Attribute {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            tasks: self
                .tasks
                .values()
                .map(|t| TaskStatus {
                    update_id: String::new(),
                    ..t.status.clone()
                })
                .collect(),
            devices: self.config.devices.iter().map(Into::into).collect(),
        }
    }

    pub fn heartbeat(&self) -> Message {
        Message::AgentHeartbeat(AgentHeartbeat {
            agent_id: self.agent_id.clone(),
            free: Some(self.free().to_wire()),
            tasks: self.active_statuses(),
            free_devices: self.device_state().free_to_wire(),
        })
    }

    /// Every unacknowledged update, oldest first (sent right after registering).
    pub fn all_pending_updates(&mut self) -> Vec<Message> {
        self.updates.take_all().into_iter().map(update).collect()
    }

    /// Unacknowledged updates due for a resend.
    pub fn due_updates(&mut self, retry: Duration) -> Vec<Message> {
        self.updates
            .take_due(tokio::time::Instant::now(), retry)
            .into_iter()
            .map(update)
            .collect()
    }

    /// After a disconnect: everything unacknowledged goes out again on the next connection.
    pub fn connection_lost(&mut self) {
        self.updates.mark_unsent();
    }

    /// The newest leader term seen (0: none, or only masters without replication).
    pub fn leader_term(&self) -> u64 {
        self.leader_term
    }

    /// Fencing: false for a nonzero `term` older than the newest seen (a deposed leader's
    /// request); a newer term is remembered, in memory and in the work dir. Term 0 (a master
    /// without replication) is always accepted and changes nothing.
    fn accept_term(&mut self, term: u64) -> bool {
        if term == 0 || term == self.leader_term {
            return true;
        }
        if term < self.leader_term {
            return false;
        }
        tracing::info!(
            term,
            previous = self.leader_term,
            "a newer leader term; older ones are refused from now on"
        );
        self.leader_term = term;
        if let Err(e) = save_leader_term(&self.config.work_dir, term) {
            tracing::warn!(work_dir = %self.config.work_dir.display(),
                "cannot save the leader term: {e}");
        }
        true
    }

    /// Launches each task (or reports why not), then one heartbeat. A batch from a deposed
    /// leader (`leader_term` older than the newest seen) launches nothing: its new tasks are
    /// answered `LOST` `stale_leader`, known ones with their current status.
    pub fn run_tasks(&mut self, run: RunTasks) -> Vec<Message> {
        let mut out = Vec::new();
        if !self.accept_term(run.leader_term) {
            tracing::warn!(
                term = run.leader_term,
                newest = self.leader_term,
                tasks = run.tasks.len(),
                "RunTasks from a deposed leader refused"
            );
            for info in run.tasks {
                self.refuse_stale(info, run.leader_term, &mut out);
            }
            out.push(self.heartbeat());
            return out;
        }
        for info in run.tasks {
            self.run_task(info, &mut out);
        }
        out.push(self.heartbeat());
        out
    }

    fn run_task(&mut self, info: TaskInfo, out: &mut Vec<Message>) {
        let key = TaskKey {
            framework_id: info.framework_id.clone(),
            task_id: info.task_id.clone(),
        };
        if self.tasks.contains_key(&key) {
            tracing::info!(task = %key.task_id, framework = %key.framework_id,
                "task already known; resending its status");
            self.resend_status(&key, out);
            return;
        }
        let blank = TaskStatus {
            task_id: key.task_id.clone(),
            framework_id: key.framework_id.clone(),
            agent_id: self.agent_id.clone(),
            ..Default::default()
        };
        let resources = match Resources::from_wire(info.resources.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                let message = format!("invalid resources: {e}");
                return self.refuse(
                    key,
                    Resources::new(),
                    blank,
                    reason::LAUNCH_FAILED,
                    message,
                    out,
                );
            }
        };
        if key.task_id.is_empty() {
            let message = "the task id is empty".to_string();
            return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out);
        }
        if info.command.trim().is_empty() {
            let message = "the command is empty".to_string();
            return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out);
        }
        // What the task is held to: its own cpus and mem, the agent's defaults for what it
        // leaves out (never unlimited).
        let limited = match isolation::limited_resources(
            &resources,
            self.config.safeguards.default_task_resources.as_ref(),
        ) {
            Ok(limited) => limited,
            Err(message) => {
                return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out)
            }
        };
        if let Some(available) = self.disk_full() {
            let message = format!(
                "the agent's disk is full: {} free in {} (needs {} MiB)",
                format_bytes(available),
                self.config.work_dir.display(),
                DISK_FULL_BELOW >> 20
            );
            return self.refuse(key, resources, blank, reason::AGENT_DISK_FULL, message, out);
        }
        let free = self.free();
        if !free.contains(&resources) {
            let short: Vec<String> = free
                .shortfalls(&resources)
                .map(|name| {
                    format!(
                        "{name}: need {}, free {}",
                        format_milli(resources.milli(name)),
                        format_milli(free.milli(name))
                    )
                })
                .collect();
            let message = format!("not enough free resources ({})", short.join(", "));
            return self.refuse(
                key,
                resources,
                blank,
                reason::INSUFFICIENT_RESOURCES,
                message,
                out,
            );
        }
        let health_spec = match info.health.as_ref().map(HealthSpec::from_wire).transpose() {
            Ok(spec) => spec,
            Err(message) => {
                return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out)
            }
        };
        let devices = match self.bind_devices(&info, &resources) {
            Ok(devices) => devices,
            Err((why, message)) => return self.refuse(key, resources, blank, why, message, out),
        };
        let policy = UserPolicy {
            default_user: self.config.task_user.clone(),
            allow_root: self.config.allow_root_tasks,
            agent_uid: users::agent_uid(),
        };
        let user = match users::resolve_task_user(&info.user, &policy, users::lookup_user) {
            Ok(user) => user,
            Err(message) => {
                return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out)
            }
        };
        // The user finally resolved (the agent's default too) is one the framework's principal
        // may use (the master checked `TaskInfo.user`; this holds on the agent again).
        if let Err(message) = users::check_allowed(&user.name, &info.allowed_users) {
            return self.refuse(key, resources, blank, reason::NOT_AUTHORIZED, message, out);
        }
        // A GPU slice under `gpu_sharing: mps` runs as an MPS client: the daemon must be up.
        let mps = self.config.gpu_sharing.applies_to(&devices);
        if mps {
            if let Err(message) = mps::ensure_daemon(&self.config.gpu_sharing, mps::start_daemon) {
                return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out);
            }
        }
        // A fresh run directory every launch, handed to the task's user; the agent's record
        // of the run in its own meta directory.
        // SAFETY: geteuid has no preconditions.
        let owner = (unsafe { libc::geteuid() } == 0).then_some((user.uid, user.gid));
        let now_ms = unix_ms();
        let (run, sandbox) = match sandbox::create_run(
            &self.config.work_dir,
            &key.framework_id,
            &key.task_id,
            owner,
            now_ms,
        ) {
            Ok(run) => run,
            Err(e) => {
                let (why, message) = self.storage_failure("create the task's sandbox", &e);
                return self.refuse(key, resources, blank, why, message, out);
            }
        };
        let meta_dir =
            task_files::meta_dir(&self.config.work_dir, &key.framework_id, &key.task_id, &run);
        let agent_env = vec![
            ("RINGMASTER_TASK_ID".to_string(), key.task_id.clone()),
            (
                "RINGMASTER_FRAMEWORK_ID".to_string(),
                key.framework_id.clone(),
            ),
            ("RINGMASTER_AGENT_ID".to_string(), self.agent_id.clone()),
            ("RINGMASTER_RESOURCES".to_string(), resources.to_string()),
            (
                "RINGMASTER_SANDBOX".to_string(),
                sandbox.to_string_lossy().into_owned(),
            ),
            ("HOME".to_string(), user.home.to_string_lossy().into_owned()),
            ("USER".to_string(), user.name.clone()),
            ("LOGNAME".to_string(), user.name.clone()),
        ];
        let mut device_env = Vec::new();
        if !self.config.devices.is_empty() || !devices.is_empty() {
            // Empty for a task without GPUs: it sees none of this agent's devices.
            device_env.push((
                "CUDA_VISIBLE_DEVICES".to_string(),
                devices.cuda_visible_devices(),
            ));
            device_env.push(("RINGMASTER_DEVICES".to_string(), devices.to_string()));
        }
        if mps {
            device_env.extend(mps::mps_env(&devices, &self.config.gpu_sharing.pipe_dir));
        }
        let task_env: Vec<(String, String)> = info
            .env
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect();
        // The devices rule (cgroup v1): its own GPUs only; none without GPUs; no rule for a
        // plain `gpus` scalar, whose devices the agent cannot name.
        let gpu_indices: Vec<u32> = devices.devices.iter().map(|d| d.index).collect();
        let gpu_access = if gpu_indices.is_empty() && resources.milli(GPUS) > 0 {
            isolation::GpuAccess::Unrestricted
        } else {
            isolation::GpuAccess::Devices(&gpu_indices)
        };
        let cgroup = match self.isolation.create_task_cgroup_with_gpus(
            &key.framework_id,
            &key.task_id,
            &limited,
            gpu_access,
        ) {
            Ok(cgroup) => cgroup.map(Arc::new),
            Err(message) => {
                self.discard_run(&key, &sandbox, &meta_dir, None);
                return self.refuse(key, resources, blank, reason::LAUNCH_FAILED, message, out);
            }
        };
        let spec = LaunchSpec {
            command: info.command.clone(),
            sandbox: sandbox.clone(),
            meta_dir: meta_dir.clone(),
            env: task_environment(agent_env, task_env, device_env),
            kill_grace: kill_grace_for(info.kill_grace_ms, self.config.kill_grace),
            user: Some(user.clone()),
            cgroup: cgroup.clone(),
        };
        // A task the agent cannot record is not started.
        let mut record = TaskFile {
            framework_id: key.framework_id.clone(),
            task_id: key.task_id.clone(),
            run: run.clone(),
            user: user.name.clone(),
            env: spec.env.clone(),
            supervisor_pid: 0,
            supervisor_ticks: 0,
            resources: resources.to_string(),
            devices: devices.to_string(),
            pid: 0,
            start_ticks: 0,
            kill_reason: None,
            kill_grace_ms: info.kill_grace_ms,
            ended: None,
            health: health_spec.clone(),
            acked_ms: None,
        };
        // The meta directory first (the supervisor records the task's end there); the record
        // with the pids, before the gate opens. A meta directory without a record is a run
        // that never started (the agent stopped in between): collected at restart.
        if let Err(e) = task_files::create_meta_dir(&meta_dir, &self.config.work_dir) {
            let (why, message) = self.storage_failure("record the task", &e);
            self.discard_run(&key, &sandbox, &meta_dir, cgroup.as_deref());
            return self.refuse(key, resources, blank, why, message, out);
        }
        // Gated: the command runs only once the pids are recorded below (`launch_gated`).
        let launched = process::launch_gated(&spec, key.clone(), self.exits_tx.clone())
            .map_err(|e| (reason::LAUNCH_FAILED, e.to_string()))
            .and_then(|handle| {
                // The pids in the record before the command may run.
                record.supervisor_pid = handle.supervisor_pid();
                record.supervisor_ticks =
                    process::process_start_ticks(handle.supervisor_pid()).unwrap_or(0);
                record.pid = handle.pid();
                record.start_ticks = process::process_start_ticks(handle.pid()).unwrap_or(0);
                match record.save(&meta_dir) {
                    Ok(()) => Ok(handle),
                    // Dropping the handle closes the gate: the command never runs.
                    Err(e) => Err(self.storage_failure("record the task", &e)),
                }
            });
        match launched {
            Ok(handle) => {
                tracing::info!(task = %key.task_id, framework = %key.framework_id,
                    pid = handle.pid(), resources = %resources, devices = %devices, sandbox = %sandbox.display(),
                    "launched task");
                let status = TaskStatus {
                    state: TaskState::TaskRunning as i32,
                    message: format!("pid {}", handle.pid()),
                    devices: devices.to_wire(),
                    ..blank
                };
                let status = self.issue(status, out);
                let pid = handle.pid();
                // Checks run where the task runs: sandbox, user, environment, cgroup.
                let health_checker = health_spec.clone().map(|check| {
                    let context = CheckContext {
                        sandbox: spec.sandbox.clone(),
                        env: spec.env.clone(),
                        user: spec.user.clone(),
                        cgroup: spec.cgroup.clone(),
                    };
                    health::start(check, context, key.clone(), self.health_tx.clone())
                });
                self.tasks.insert(
                    key.clone(),
                    TaskRecord {
                        resources,
                        devices,
                        status,
                        kill_reason: None,
                        process: Some(handle),
                        pid,
                        start_ticks: record.start_ticks,
                        kill_grace_ms: info.kill_grace_ms,
                        health_checker,
                        health_failure: None,
                        health_spec,
                        run,
                        supervisor: record.supervisor_pid,
                        supervisor_ticks: record.supervisor_ticks,
                        user: user.name.clone(),
                        env: spec.env.clone(),
                    },
                );
                if let Some(process) = self
                    .tasks
                    .get_mut(&key)
                    .and_then(|record| record.process.as_mut())
                {
                    process.start();
                }
            }
            Err((why, message)) => {
                self.discard_run(&key, &sandbox, &meta_dir, cgroup.as_deref());
                self.refuse(key, resources, blank, why, message, out);
            }
        }
    }

    /// A run that did not start: its cgroup, record and sandbox go (the sandbox is empty but
    /// for what the task's setup created).
    fn discard_run(
        &mut self,
        key: &TaskKey,
        sandbox: &std::path::Path,
        meta_dir: &std::path::Path,
        cgroup: Option<&isolation::TaskCgroup>,
    ) {
        if let Some(cgroup) = cgroup {
            if let Err(e) = cgroup.remove() {
                tracing::warn!(task = %key.task_id, "{e}");
            }
        }
        let entry = gc::Entry {
            acked_ms: 0,
            run_dir: sandbox.to_path_buf(),
            meta_dir: Some(meta_dir.to_path_buf()),
        };
        if let Err(e) = gc::remove(&entry) {
            tracing::warn!(task = %key.task_id, "cannot remove a run that did not start: {e}");
        }
    }

    /// Why the agent could not write what it needs for a task: `agent_disk_full` when the
    /// disk is full (with the free space), else `launch_failed`.
    fn storage_failure(&self, what: &str, e: &std::io::Error) -> (&'static str, String) {
        let full = e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT);
        if full {
            let free = self
                .disk_space()
                .map_or_else(|| "unknown".to_string(), |d| format_bytes(d.available));
            (
                reason::AGENT_DISK_FULL,
                format!(
                    "the agent's disk is full: cannot {what} ({e}); {free} free in {}",
                    self.config.work_dir.display()
                ),
            )
        } else {
            (reason::LAUNCH_FAILED, format!("cannot {what}: {e}"))
        }
    }

    /// Records a task that never ran as FAILED, so a repeated RunTasks gets the same answer.
    fn refuse(
        &mut self,
        key: TaskKey,
        resources: Resources,
        blank: TaskStatus,
        why: &str,
        message: String,
        out: &mut Vec<Message>,
    ) {
        tracing::warn!(task = %key.task_id, framework = %key.framework_id, reason = why,
            "task not launched: {message}");
        let status = TaskStatus {
            state: TaskState::TaskFailed as i32,
            reason: why.to_string(),
            message,
            ..blank
        };
        let status = self.issue(status, out);
        self.tasks.insert(
            key,
            TaskRecord {
                resources,
                devices: DeviceBinding::default(),
                status,
                kill_reason: None,
                process: None,
                pid: 0,
                start_ticks: 0,
                kill_grace_ms: 0,
                health_checker: None,
                health_failure: None,
                health_spec: None,
                run: String::new(),
                supervisor: 0,
                supervisor_ticks: 0,
                user: String::new(),
                env: Vec::new(),
            },
        );
    }

    /// Re-sends what is pending for a task, or, when everything was acked, its current status
    /// under a fresh update id.
    fn resend_status(&mut self, key: &TaskKey, out: &mut Vec<Message>) {
        let pending = self.updates.take_for_task(&key.framework_id, &key.task_id);
        if !pending.is_empty() {
            out.extend(pending.into_iter().map(update));
            return;
        }
        if let Some(record) = self.tasks.get(key) {
            let status = TaskStatus {
                timestamp_ms: 0,
                ..record.status.clone()
            };
            let issued = self.issue(status, out);
            if let Some(record) = self.tasks.get_mut(key) {
                record.status = issued;
            }
        }
    }

    /// A task of a stale `RunTasks`: not launched and not recorded (the current leader may
    /// still launch it), reported `LOST` `stale_leader`; a task already known keeps running
    /// and its status is sent again.
    fn refuse_stale(&mut self, info: TaskInfo, term: u64, out: &mut Vec<Message>) {
        let key = TaskKey {
            framework_id: info.framework_id.clone(),
            task_id: info.task_id.clone(),
        };
        if self.tasks.contains_key(&key) {
            self.resend_status(&key, out);
            return;
        }
        let status = TaskStatus {
            task_id: info.task_id,
            framework_id: info.framework_id,
            agent_id: self.agent_id.clone(),
            state: TaskState::TaskLost as i32,
            reason: reason::STALE_LEADER.to_string(),
            message: format!(
                "not launched: sent by a deposed leader (term {term}; the agent has seen term {})",
                self.leader_term
            ),
            ..Default::default()
        };
        self.issue(status, out);
    }

    /// Starts killing a task's process group; KILLED is reported when the group is gone. A
    /// kill from a deposed leader (`leader_term` older than the newest seen) is ignored.
    pub fn kill_task(&mut self, kill: KillTask) -> Vec<Message> {
        let mut out = Vec::new();
        if !self.accept_term(kill.leader_term) {
            tracing::warn!(task = %kill.task_id, framework = %kill.framework_id,
                term = kill.leader_term, newest = self.leader_term,
                "KillTask from a deposed leader ignored");
            return out;
        }
        let reason = if kill.reason.is_empty() {
            reason::KILLED.to_string()
        } else {
            kill.reason
        };
        let key = self.find_task(&kill.framework_id, &kill.task_id);
        let Some(key) = key else {
            tracing::warn!(task = %kill.task_id, framework = %kill.framework_id,
                "kill for an unknown task; reporting it LOST");
            let status = TaskStatus {
                task_id: kill.task_id.clone(),
                framework_id: kill.framework_id.clone(),
                agent_id: self.agent_id.clone(),
                state: TaskState::TaskLost as i32,
                reason: reason::UNKNOWN_TASK.to_string(),
                message: format!("no task `{}` on this agent", kill.task_id),
                ..Default::default()
            };
            self.issue(status, &mut out);
            return out;
        };
        let Some(record) = self.tasks.get_mut(&key) else {
            return out;
        };
        match &record.process {
            Some(process) if record.kill_reason.is_none() => {
                tracing::info!(task = %key.task_id, framework = %key.framework_id,
                    pid = process.pid(), reason = %reason, "killing task");
                record.kill_reason = Some(reason);
                record.health_checker = None; // no more checks while it dies
                process.kill();
                self.save_task_file(&key);
            }
            Some(_) => tracing::info!(task = %key.task_id, "task is already being killed"),
            None => self.resend_status(&key, &mut out),
        }
        out
    }

    /// The task a KillTask names; an empty framework id matches any framework.
    fn find_task(&self, framework_id: &str, task_id: &str) -> Option<TaskKey> {
        let exact = TaskKey {
            framework_id: framework_id.to_string(),
            task_id: task_id.to_string(),
        };
        if self.tasks.contains_key(&exact) {
            return Some(exact);
        }
        if framework_id.is_empty() {
            return self.tasks.keys().find(|k| k.task_id == task_id).cloned();
        }
        None
    }

    /// A task's health check changed its mind ([`crate::health`]): a RUNNING update with the
    /// new health (only changes are sent). Unhealthy also kills the task with its kill grace;
    /// it then ends FAILED with reason `health_check_failed` and the check's message.
    pub fn health_changed(&mut self, key: TaskKey, event: HealthEvent) -> Vec<Message> {
        let mut out = Vec::new();
        let Some(record) = self.tasks.get_mut(&key) else {
            return out;
        };
        if record.process.is_none() || record.kill_reason.is_some() || !record.is_active() {
            return out; // ending anyway: its end says how
        }
        if matches!(event, HealthEvent::Unhealthy { .. }) && !process::process_is_alive(record.pid)
        {
            // The task ended on its own (its checks fail because it is gone): its exit, on
            // its way, says how it ended, not the checks.
            record.health_checker = None;
            return out;
        }
        let mut status = TaskStatus {
            update_id: String::new(),
            timestamp_ms: 0,
            ..record.status.clone()
        };
        match &event {
            HealthEvent::Healthy => {
                status.health = TaskHealth::Healthy as i32;
            }
            HealthEvent::Unhealthy { message } => {
                status.health = TaskHealth::Unhealthy as i32;
                status.reason = reason::HEALTH_CHECK_FAILED.to_string();
                status.message = message.clone();
                record.kill_reason = Some(reason::HEALTH_CHECK_FAILED.to_string());
                record.health_failure = Some(message.clone());
                record.health_checker = None;
                if let Some(process) = &record.process {
                    tracing::warn!(task = %key.task_id, framework = %key.framework_id,
                        pid = process.pid(), "task unhealthy, killing it: {message}");
                    process.kill();
                }
            }
        }
        let status = self.issue(status, &mut out);
        if let Some(record) = self.tasks.get_mut(&key) {
            record.status = status;
        }
        if matches!(event, HealthEvent::Unhealthy { .. }) {
            self.save_task_file(&key);
        }
        out
    }

    /// A task's process group is gone: report its terminal state, then one heartbeat. Unless
    /// the task exited 0, its message ends with the last lines of its stderr
    /// ([`crate::sandbox::stderr_tail`]): "exited with status 3; stderr: …".
    pub fn process_exited(&mut self, key: TaskKey, outcome: ExitOutcome) -> Vec<Message> {
        let mut out = Vec::new();
        let Some(record) = self.tasks.get_mut(&key) else {
            tracing::warn!(task = %key.task_id, "exit of a task no longer tracked");
            return out;
        };
        record.process = None;
        record.health_checker = None;
        let health_failure = record.health_failure.take();
        let mut status = TaskStatus {
            reason: String::new(),
            message: String::new(),
            exit_code: None,
            update_id: String::new(),
            timestamp_ms: 0,
            ..record.status.clone()
        };
        let how = match &outcome {
            // The limit it was held to: its own mem, or the agent's default.
            ExitOutcome::MemoryLimit(_) => format!(
                "memory limit {} MiB exceeded ({})",
                format_milli(held_to(&record.resources, &self.config).milli("mem")),
                describe(&outcome)
            ),
            _ => describe(&outcome),
        };
        let mut ended = &outcome;
        if let ExitOutcome::MemoryLimit(then) = ended {
            ended = then;
        }
        if let ExitOutcome::Code(code) = ended {
            status.exit_code = Some(*code);
        }
        let state = match (&record.kill_reason, &outcome) {
            (Some(why), _) if why == reason::HEALTH_CHECK_FAILED => {
                status.reason = why.clone();
                TaskState::TaskFailed
            }
            (Some(why), _) => {
                status.reason = why.clone();
                TaskState::TaskKilled
            }
            (None, ExitOutcome::Code(0)) => TaskState::TaskFinished,
            (None, ExitOutcome::Code(_)) => {
                status.reason = reason::EXIT_STATUS.to_string();
                TaskState::TaskFailed
            }
            (None, ExitOutcome::Signal(_)) => {
                status.reason = reason::SIGNAL.to_string();
                TaskState::TaskFailed
            }
            (None, ExitOutcome::WaitFailed(_)) => {
                status.reason = reason::WAIT_FAILED.to_string();
                TaskState::TaskFailed
            }
            (None, ExitOutcome::NotStarted) => {
                status.reason = reason::NOT_STARTED.to_string();
                TaskState::TaskLost
            }
            (None, ExitOutcome::MemoryLimit(_)) => {
                status.reason = reason::MEMORY_LIMIT.to_string();
                TaskState::TaskFailed
            }
        };
        status.state = state as i32;
        status.message = how;
        if let Some(failure) = health_failure {
            // Killed for its health: why is what the check said, not how the kill went.
            status.message = failure;
        } else if outcome != ExitOutcome::Code(0) {
            // How an unsuccessful end looked from inside: the last lines of the task's stderr.
            let run = self
                .tasks
                .get(&key)
                .map(|r| r.run.clone())
                .unwrap_or_default();
            let sandbox =
                sandbox::run_dir(&self.config.work_dir, &key.framework_id, &key.task_id, &run);
            if let Some(tail) = (!run.is_empty())
                .then(|| sandbox::stderr_tail(&sandbox))
                .flatten()
            {
                status.message.push_str("; stderr: ");
                status.message.push_str(&tail);
            }
        }
        tracing::info!(task = %key.task_id, framework = %key.framework_id,
            state = state.short_name(), reason = %status.reason, "task {}", status.message);
        let status = self.issue(status, &mut out);
        if let Some(record) = self.tasks.get_mut(&key) {
            record.status = status;
        }
        self.save_task_file(&key);
        out.push(self.heartbeat());
        out
    }

    /// The master received an update: forget it, and forget a terminal task with nothing
    /// left to deliver.
    pub fn acknowledged(&mut self, update_id: &str) {
        let Some(status) = self.updates.ack(update_id) else {
            tracing::debug!(update_id, "ack for an update not pending (already acked?)");
            return;
        };
        let key = TaskKey {
            framework_id: status.framework_id,
            task_id: status.task_id,
        };
        let done = self.tasks.get(&key).is_some_and(|t| !t.is_active())
            && !self
                .updates
                .has_pending_for(&key.framework_id, &key.task_id);
        if done {
            tracing::debug!(task = %key.task_id, "terminal update acknowledged; task forgotten");
            let Some(record) = self.tasks.remove(&key) else {
                return;
            };
            if record.run.is_empty() {
                return; // refused: it never had a sandbox
            }
            // The run waits for the collector; its record says since when.
            let acked_ms = unix_ms();
            let meta_dir = task_files::meta_dir(
                &self.config.work_dir,
                &key.framework_id,
                &key.task_id,
                &record.run,
            );
            let mut file = self.task_file(&key, &record);
            file.acked_ms = Some(acked_ms);
            if let Err(e) = file.save(&meta_dir) {
                tracing::warn!(task = %key.task_id, "cannot record the acknowledgement: {e}");
            }
            self.gc.schedule(gc::Entry {
                acked_ms,
                run_dir: sandbox::run_dir(
                    &self.config.work_dir,
                    &key.framework_id,
                    &key.task_id,
                    &record.run,
                ),
                meta_dir: Some(meta_dir),
            });
        }
    }

    /// Starts killing every running task for shutdown; returns how many were asked to die.
    pub fn kill_all_for_shutdown(&mut self) -> usize {
        let mut count = 0;
        for (key, record) in &mut self.tasks {
            if let Some(process) = &record.process {
                if record.kill_reason.is_none() {
                    record.kill_reason = Some(reason::AGENT_SHUTDOWN.to_string());
                }
                record.health_checker = None;
                tracing::info!(task = %key.task_id, pid = process.pid(), "killing task for shutdown");
                // Within the agent's grace, whatever the task's own: shutdown is bounded.
                process.kill_within(self.config.kill_grace);
                count += 1;
            }
        }
        count
    }

    /// The record of a task's run, as [`crate::task_files`] keeps it.
    fn task_file(&self, key: &TaskKey, record: &TaskRecord) -> TaskFile {
        TaskFile {
            framework_id: key.framework_id.clone(),
            task_id: key.task_id.clone(),
            run: record.run.clone(),
            user: record.user.clone(),
            env: record.env.clone(),
            supervisor_pid: record.supervisor,
            supervisor_ticks: record.supervisor_ticks,
            resources: record.resources.to_string(),
            devices: record.devices.to_string(),
            pid: record.pid,
            start_ticks: record.start_ticks,
            kill_reason: record.kill_reason.clone(),
            kill_grace_ms: record.kill_grace_ms,
            ended: (!record.is_active()).then(|| record.status.clone()),
            health: record.health_spec.clone(),
            acked_ms: None,
        }
    }

    /// Records a started task's state in its meta directory (see [`crate::task_files`]).
    fn save_task_file(&self, key: &TaskKey) {
        let Some(record) = self.tasks.get(key) else {
            return;
        };
        if record.pid == 0 || record.run.is_empty() {
            return;
        }
        let file = self.task_file(key, record);
        let meta_dir = task_files::meta_dir(
            &self.config.work_dir,
            &key.framework_id,
            &key.task_id,
            &record.run,
        );
        if let Err(e) = file.save(&meta_dir) {
            tracing::warn!(task = %key.task_id, dir = %meta_dir.display(),
                "cannot write the task record; a restarted agent will not find this task: {e}");
        }
    }

    /// After a restart: takes back the tasks an earlier run of the agent left, from its records
    /// in the meta directory (never from anything in a sandbox). A task whose supervisor still
    /// runs (same pid and start time) is adopted and reported RUNNING at registration; one
    /// that ended is reported with the exit status its supervisor recorded (its end arrives on
    /// the exit channel); one whose end was recorded but never acknowledged is reported again;
    /// an acknowledged one's sandbox waits for the collector. Runs without a usable record, and
    /// sandboxes without a run, are scheduled for collection. Returns how many tasks were
    /// recovered.
    pub fn recover_tasks(&mut self) -> usize {
        let found = task_files::scan(&self.config.work_dir);
        let now_ms = unix_ms();
        let mut known_runs = std::collections::BTreeSet::new();
        let mut recovered = 0;
        for (meta_dir, file) in found {
            // The sandbox of the run: the same escaped names under `sandboxes`.
            let run_dir = meta_dir
                .strip_prefix(self.config.work_dir.join(task_files::META).join("tasks"))
                .map(|rel| self.config.work_dir.join(sandbox::SANDBOXES).join(rel))
                .unwrap_or_default();
            known_runs.insert(run_dir.clone());
            let collect = |gc: &mut gc::Collector, acked_ms: u64| {
                gc.schedule(gc::Entry {
                    acked_ms,
                    run_dir: run_dir.clone(),
                    meta_dir: Some(meta_dir.clone()),
                })
            };
            let Some(file) = file else {
                collect(&mut self.gc, now_ms);
                continue;
            };
            if let Some(acked_ms) = file.acked_ms {
                collect(&mut self.gc, acked_ms);
                continue;
            }
            let resources = match Resources::parse(&file.resources) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(dir = %meta_dir.display(),
                        "ignoring a task record with bad resources: {e}");
                    collect(&mut self.gc, now_ms);
                    continue;
                }
            };
            let key = TaskKey {
                framework_id: file.framework_id.clone(),
                task_id: file.task_id.clone(),
            };
            if self.tasks.contains_key(&key) {
                // Two unacknowledged runs of one task cannot be: the older is stale.
                collect(&mut self.gc, now_ms);
                continue;
            }
            let devices = DeviceBinding::parse(&file.devices).unwrap_or_else(|e| {
                tracing::warn!(task = %key.task_id, "unreadable device binding in the task record: {e}");
                DeviceBinding::default()
            });
            let blank = TaskStatus {
                task_id: key.task_id.clone(),
                framework_id: key.framework_id.clone(),
                agent_id: self.agent_id.clone(),
                ..Default::default()
            };
            let mut record = TaskRecord {
                resources,
                devices,
                status: blank.clone(),
                kill_reason: file.kill_reason.clone(),
                process: None,
                pid: file.pid,
                start_ticks: file.start_ticks,
                kill_grace_ms: file.kill_grace_ms,
                health_checker: None,
                health_failure: None,
                health_spec: file.health.clone(),
                run: file.run.clone(),
                supervisor: file.supervisor_pid,
                supervisor_ticks: file.supervisor_ticks,
                user: file.user.clone(),
                env: file.env.clone(),
            };
            if let Some(ended) = file.ended {
                tracing::info!(task = %key.task_id, framework = %key.framework_id,
                    "recovered an ended task whose update was not acknowledged");
                let mut out = Vec::new();
                record.status = self.issue(
                    TaskStatus {
                        update_id: String::new(),
                        timestamp_ms: 0,
                        ..ended
                    },
                    &mut out,
                );
                self.tasks.insert(key, record);
                recovered += 1;
                continue;
            }
            if file.supervisor_pid == 0 || file.pid == 0 {
                // The agent stopped while starting it, before opening its gate: its command
                // never ran (the supervisor recorded so and killed what it had started).
                tracing::info!(task = %key.task_id, framework = %key.framework_id,
                    "a task the agent was starting when it stopped never ran");
                collect(&mut self.gc, 0);
                continue;
            }
            recovered += 1;
            // Its cgroup, when it has one: kill and end-of-task go through it again (with the
            // limits it was created with, for `memory_limit`).
            let limited = held_to(&record.resources, &self.config);
            let cgroup = self
                .isolation
                .existing_task_cgroup(&key.framework_id, &key.task_id, &limited)
                .map(Arc::new);
            record.health_checker = file.health.clone().and_then(|check| {
                self.adopted_checker(&key, &record, &run_dir, cgroup.clone(), check)
            });
            let adoptee = process::Adoptee {
                supervisor: file.supervisor_pid,
                supervisor_ticks: file.supervisor_ticks,
                task: file.pid,
                task_ticks: file.start_ticks,
                meta_dir: meta_dir.clone(),
            };
            record.process = Some(process::adopt(
                adoptee,
                cgroup,
                kill_grace_for(file.kill_grace_ms, self.config.kill_grace),
                key.clone(),
                self.exits_tx.clone(),
            ));
            tracing::info!(task = %key.task_id, framework = %key.framework_id, pid = file.pid,
                supervisor = file.supervisor_pid,
                "recovered a task started before the agent restarted");
            // Reported RUNNING at registration; if it already ended, its end follows on the
            // exit channel with the status its supervisor recorded.
            record.status = TaskStatus {
                state: TaskState::TaskRunning as i32,
                message: format!("pid {} (adopted after an agent restart)", file.pid),
                ..blank
            };
            self.tasks.insert(key, record);
        }
        for orphan in gc::orphans(&self.config.work_dir, &known_runs) {
            tracing::info!(sandbox = %orphan.display(),
                "a sandbox without a task record; it will be collected");
            self.gc.schedule(gc::Entry {
                acked_ms: now_ms,
                run_dir: orphan,
                meta_dir: None,
            });
        }
        recovered
    }

    /// The health checker of a task adopted after a restart: checks run as the user and with
    /// the environment the agent recorded for it (in its own directory, which no task can
    /// write), under the same user policy as a launch, in its run directory and cgroup.
    /// `None` (logged) when that cannot be established.
    fn adopted_checker(
        &self,
        key: &TaskKey,
        record: &TaskRecord,
        run_dir: &std::path::Path,
        cgroup: Option<Arc<isolation::TaskCgroup>>,
        check: HealthSpec,
    ) -> Option<Checker> {
        let policy = UserPolicy {
            default_user: self.config.task_user.clone(),
            allow_root: self.config.allow_root_tasks,
            agent_uid: users::agent_uid(),
        };
        match users::resolve_task_user(&record.user, &policy, users::lookup_user) {
            Ok(user) => Some(health::start(
                check,
                CheckContext {
                    sandbox: run_dir.to_path_buf(),
                    env: record.env.clone(),
                    user: Some(user),
                    cgroup,
                },
                key.clone(),
                self.health_tx.clone(),
            )),
            Err(e) => {
                tracing::warn!(task = %key.task_id, framework = %key.framework_id,
                    "not checking the health of an adopted task: {e}");
                None
            }
        }
    }

    fn issue(&mut self, mut status: TaskStatus, out: &mut Vec<Message>) -> TaskStatus {
        status.agent_id = self.agent_id.clone();
        let issued = self.updates.issue(status);
        out.push(update(issued.clone()));
        issued
    }
}

/// The leader term saved in `work_dir` by an earlier run; 0 when there is none or it is
/// unreadable (then the next term received is taken as the newest).
pub fn load_leader_term(work_dir: &std::path::Path) -> u64 {
    let path = work_dir.join(LEADER_TERM_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(path = %path.display(), "ignoring an unreadable leader term");
            0
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read the leader term: {e}");
            0
        }
    }
}

/// Writes the term to `<work_dir>/leader_term` atomically: a temporary file, synced, then
/// renamed over the old one, so a crash leaves the old term or the new one, never half.
pub fn save_leader_term(work_dir: &std::path::Path, term: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let path = work_dir.join(LEADER_TERM_FILE);
    let temp = work_dir.join(format!("{}.tmp", LEADER_TERM_FILE));
    let mut file = ringmaster_proto::files::create_private(&temp)?;
    file.write_all(format!("{term}\n").as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, &path)
}

/// "exited with status 1", "killed by SIGKILL (9)": how a process ended, for messages.
/// What a task with `resources` is held to: its own `cpus` and `mem`, the agent's defaults
/// for what it omits ([`isolation::limited_resources`]); its own resources when the agent has
/// no defaults (a task recorded before they were turned off).
fn held_to(resources: &Resources, config: &AgentConfig) -> Resources {
    isolation::limited_resources(resources, config.safeguards.default_task_resources.as_ref())
        .unwrap_or_else(|_| resources.clone())
}

/// Bytes for people: `512 KiB`, `3.2 MiB`, `1.5 GiB`.
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn describe(outcome: &ExitOutcome) -> String {
    match outcome {
        ExitOutcome::Code(code) => format!("exited with status {code}"),
        ExitOutcome::Signal(signal) => {
            format!("killed by {} ({signal})", process::signal_name(*signal))
        }
        ExitOutcome::WaitFailed(e) => format!("waiting for the process failed: {e}"),
        ExitOutcome::NotStarted => {
            "the command never ran: the agent stopped before starting it".to_string()
        }
        ExitOutcome::MemoryLimit(then) => describe(then),
    }
}

fn update(status: TaskStatus) -> Message {
    Message::StatusUpdate(StatusUpdate {
        status: Some(status),
    })
}

/// A task's environment, in the order it is applied (a later entry wins): what the agent sets
/// (ids, sandbox, HOME/USER/LOGNAME), then the task's own `TaskInfo.env`, then the device
/// variables (CUDA_VISIBLE_DEVICES, RINGMASTER_DEVICES and, for a GPU slice under
/// `gpu_sharing: mps`, the `CUDA_MPS_*` limits of [`crate::mps::mps_env`]). The device
/// variables come last and the task's entries for them are dropped, so a task cannot widen the
/// devices it sees nor lift its MPS limits through `TaskInfo.env`.
pub fn task_environment(
    agent: Vec<(String, String)>,
    task: Vec<(String, String)>,
    devices: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut env = agent;
    env.extend(
        task.into_iter()
            .filter(|(name, _)| !devices.iter().any(|(d, _)| d == name)),
    );
    env.extend(devices);
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What a process started with `envs(list)` sees for `name`: the last entry wins.
    fn seen<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_task_cannot_widen_its_devices() {
        let env = task_environment(
            pairs(&[("RINGMASTER_TASK_ID", "t1"), ("HOME", "/nonexistent")]),
            pairs(&[
                ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
                ("RINGMASTER_DEVICES", "all"),
                ("HOME", "/tmp"),
                ("MINE", "x"),
            ]),
            pairs(&[
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("RINGMASTER_DEVICES", "1:500"),
            ]),
        );
        assert_eq!(seen(&env, "CUDA_VISIBLE_DEVICES"), Some("1"));
        assert_eq!(seen(&env, "RINGMASTER_DEVICES"), Some("1:500"));
        assert_eq!(
            env.iter()
                .filter(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
                .count(),
            1
        );
        // The task's own variables still apply, and may override the agent's other ones.
        assert_eq!(seen(&env, "MINE"), Some("x"));
        assert_eq!(seen(&env, "HOME"), Some("/tmp"));
        assert_eq!(seen(&env, "RINGMASTER_TASK_ID"), Some("t1"));
        assert_eq!(env.last().unwrap().0, "RINGMASTER_DEVICES");
    }

    #[test]
    fn a_task_cannot_lift_its_mps_limits() {
        let binding = ringmaster_proto::devices::DeviceBinding::parse("gpu:2:250:8192").unwrap();
        let mut devices = pairs(&[
            ("CUDA_VISIBLE_DEVICES", "2"),
            ("RINGMASTER_DEVICES", "gpu:2:250:8192"),
        ]);
        devices.extend(mps::mps_env(&binding, std::path::Path::new("/run/mps")));
        let env = task_environment(
            pairs(&[("RINGMASTER_TASK_ID", "t1")]),
            pairs(&[
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=81920M"),
                ("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent"),
                ("MINE", "x"),
            ]),
            devices,
        );
        assert_eq!(seen(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
        assert_eq!(
            seen(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            Some("0=8192M")
        );
        assert_eq!(seen(&env, "CUDA_MPS_PIPE_DIRECTORY"), Some("/run/mps"));
        assert_eq!(seen(&env, "MINE"), Some("x"));
        for name in [
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_PIPE_DIRECTORY",
        ] {
            assert_eq!(env.iter().filter(|(k, _)| k == name).count(), 1, "{name}");
        }
        // The MPS variables come after the task's own, with the device variables.
        let task_pos = env.iter().position(|(k, _)| k == "MINE").unwrap();
        let mps_pos = env
            .iter()
            .position(|(k, _)| k == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .unwrap();
        assert!(mps_pos > task_pos);
    }

    #[test]
    fn without_devices_the_task_env_is_kept() {
        let env = task_environment(
            pairs(&[("A", "1")]),
            pairs(&[("CUDA_VISIBLE_DEVICES", "0")]),
            Vec::new(),
        );
        assert_eq!(env, pairs(&[("A", "1"), ("CUDA_VISIBLE_DEVICES", "0")]));
    }

    mod fencing {
        use super::super::*;

        fn config(work_dir: &std::path::Path) -> AgentConfig {
            AgentConfig {
                master: "127.0.0.1:1".into(),
                id: None,
                hostname: "fence-host".into(),
                resources: Resources::parse("cpus:1;mem:64").unwrap(),
                devices: Vec::new(),
                device_selection: Default::default(),
                attributes: Vec::new(),
                work_dir: work_dir.to_path_buf(),
                kill_grace: Duration::from_millis(500),
                reconnect_max_backoff: Duration::from_millis(200),
                security: Default::default(),
                task_user: users::default_task_user(),
                allow_root_tasks: false,
                gpu_sharing: Default::default(),
                usage_interval: crate::usage::DEFAULT_USAGE_INTERVAL,
                safeguards: Default::default(),
            }
        }

        fn state(work_dir: &std::path::Path) -> AgentState {
            AgentState::new(config(work_dir), "a1".into()).0
        }

        /// A task too big for the agent: a RunTasks that passes the fence answers it FAILED
        /// `insufficient_resources` without starting a process.
        fn too_big(id: &str) -> TaskInfo {
            TaskInfo {
                task_id: id.into(),
                name: id.into(),
                command: "true".into(),
                framework_id: "fw".into(),
                resources: Some(Resources::parse("cpus:64").unwrap().to_wire()),
                ..Default::default()
            }
        }

        fn run(state: &mut AgentState, term: u64, ids: &[&str]) -> Vec<TaskStatus> {
            let tasks = ids.iter().map(|id| too_big(id)).collect();
            statuses(&state.run_tasks(RunTasks {
                tasks,
                leader_term: term,
            }))
        }

        fn kill(state: &mut AgentState, term: u64, id: &str) -> Vec<TaskStatus> {
            statuses(&state.kill_task(KillTask {
                task_id: id.into(),
                framework_id: "fw".into(),
                reason: String::new(),
                leader_term: term,
            }))
        }

        fn statuses(out: &[Message]) -> Vec<TaskStatus> {
            out.iter()
                .filter_map(|m| match m {
                    Message::StatusUpdate(u) => u.status.clone(),
                    _ => None,
                })
                .collect()
        }

        fn saved(work_dir: &std::path::Path) -> Option<String> {
            std::fs::read_to_string(work_dir.join(LEADER_TERM_FILE)).ok()
        }

        #[test]
        fn an_older_term_is_refused_and_the_newest_is_saved() {
            let dir = tempfile::tempdir().unwrap();
            let mut state = state(dir.path());
            assert_eq!(state.leader_term(), 0);
            let out = run(&mut state, 5, &["t1"]);
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].reason, reason::INSUFFICIENT_RESOURCES);
            assert_eq!(state.leader_term(), 5);
            assert_eq!(saved(dir.path()).as_deref(), Some("5\n"));

            let out = run(&mut state, 4, &["t2", "t3"]);
            assert_eq!(out.len(), 2);
            for status in &out {
                assert_eq!(status.state, TaskState::TaskLost as i32);
                assert_eq!(status.reason, reason::STALE_LEADER);
                assert!(status.message.contains("term 4"), "{}", status.message);
                assert_eq!(status.agent_id, "a1");
                assert!(!status.update_id.is_empty(), "a reliable update");
            }
            assert_eq!(state.leader_term(), 5, "an old term does not lower it");
            // Not recorded: the current leader may still launch the task.
            let out = run(&mut state, 6, &["t2"]);
            assert_eq!(out[0].reason, reason::INSUFFICIENT_RESOURCES);
            assert_eq!(state.leader_term(), 6);
            assert_eq!(saved(dir.path()).as_deref(), Some("6\n"));
            assert!(!dir.path().join("leader_term.tmp").exists());
        }

        #[test]
        fn term_zero_is_always_accepted() {
            let dir = tempfile::tempdir().unwrap();
            let mut state = state(dir.path());
            assert_eq!(
                run(&mut state, 0, &["t1"])[0].reason,
                reason::INSUFFICIENT_RESOURCES
            );
            assert_eq!(saved(dir.path()), None, "term 0 is not saved");
            run(&mut state, 3, &["t2"]);
            assert_eq!(
                run(&mut state, 0, &["t3"])[0].reason,
                reason::INSUFFICIENT_RESOURCES
            );
            assert_eq!(kill(&mut state, 0, "nope")[0].reason, reason::UNKNOWN_TASK);
            assert_eq!(state.leader_term(), 3);
        }

        #[test]
        fn a_stale_kill_is_ignored() {
            let dir = tempfile::tempdir().unwrap();
            let mut state = state(dir.path());
            assert_eq!(kill(&mut state, 7, "nope")[0].reason, reason::UNKNOWN_TASK);
            assert_eq!(state.leader_term(), 7, "a KillTask's term counts too");
            assert!(
                kill(&mut state, 6, "nope").is_empty(),
                "no answer to a stale kill"
            );
            assert!(state
                .kill_task(KillTask {
                    task_id: "nope".into(),
                    framework_id: "fw".into(),
                    reason: String::new(),
                    leader_term: 2,
                })
                .is_empty());
            // The task a stale RunTasks names, once known, keeps its state.
            run(&mut state, 7, &["known"]);
            let again = run(&mut state, 1, &["known"]);
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].reason, reason::INSUFFICIENT_RESOURCES);
            assert_eq!(again[0].state, TaskState::TaskFailed as i32);
        }

        #[test]
        fn the_term_survives_a_restart() {
            let dir = tempfile::tempdir().unwrap();
            let mut first = state(dir.path());
            run(&mut first, 9, &["t1"]);
            drop(first);
            let mut second = state(dir.path());
            assert_eq!(second.leader_term(), 9);
            assert_eq!(run(&mut second, 8, &["t2"])[0].reason, reason::STALE_LEADER);
            // An unreadable file counts as no term.
            std::fs::write(dir.path().join(LEADER_TERM_FILE), "garbage").unwrap();
            assert_eq!(load_leader_term(dir.path()), 0);
        }
    }
}
