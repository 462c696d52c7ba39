//! The plain mode of `ringmaster-exec`: run one shell command as N tasks, the analogue of
//! `mesos-execute`.
//!
//! The scheduler states its demand (`--resources` × instances not yet launched), fills each
//! offer with as many tasks as fit, declines offers it cannot use, suppresses once everything is
//! launched, prints one line per task state change, and stops when every task is terminal.
//! While tasks wait for an offer that fits, it says why on stderr ([`crate::waiting`]). On
//! SIGINT/SIGTERM it tears the framework down so the master kills its tasks
//! ([`crate::interrupt`]). With `--state-file` it saves its framework id and launched tasks
//! ([`crate::state_file`]); a restarted exec (or `--framework-id`) takes the framework over,
//! reconciles those tasks, and launches only the ones the master does not know.
//! Exit codes: 0 when every task FINISHED, 1 otherwise (or when the master cannot be reached),
//! 2 for usage errors (including resource names outside the standard set, unless
//! `--allow-custom-resources`), 130 after SIGINT, 143 after SIGTERM.

use ringmaster_proto::convert::{DeviceStateWire, ResourcesWire};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::warn;

use ringmaster_sdk::{
    task, with_kill_grace, Driver, ErrorCode, FrameworkConfig, Offer, Resources, Scheduler,
    SecurityFlags, TaskState, TaskStatus,
};

use crate::batch::{BatchExecScheduler, BatchFile};
use crate::interrupt::{run_interruptible, Outcome};
use crate::report::{
    exit_code, status_line, Progress, Stopper, TaskBook, EXIT_FAILURE, EXIT_USAGE,
};
use crate::state_file::{self, ExecState};
use crate::waiting::{spawn_ticker, SharedWaiting, Waiting};
use ringmaster_proto::resources::{check_known_names, STANDARD_NAMES};

/// Command line of `ringmaster-exec`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "ringmaster-exec",
    version,
    about = "Run a shell command as N tasks on a Ringmaster cluster and wait for them",
    after_help = "Prints `TASK <task-id> <STATE> agent=<agent-id> [reason=<reason>]` per state change;\n\
                  a task that ended other than FINISHED adds `exit_code=<n>` (or `signal=<SIG>`) and\n\
                  `message=<text>`, the message's further lines (stderr) indented with `    | `;\n\
                  with --batch also `UNMATCHED <task-id> reason=<code> (<text>)` and a `BATCH` summary.\n\
                  While tasks wait for an offer that fits, says why on stderr.\n\
                  Ctrl-C or SIGTERM tears the framework down: the master kills its tasks.\n\
                  With --state-file, a restarted exec takes its framework over and waits for the\n\
                  tasks already launched instead of running them again.\n\
                  Exit code: 0 if every task FINISHED, 1 otherwise, 2 for usage errors,\n\
                  130 after SIGINT, 143 after SIGTERM."
)]
pub struct ExecArgs {
    /// The master's address, host:port, or every master of a replicated cluster,
    /// `a:5050,b:5050,c:5050` (or `RINGMASTER_MASTER`): the leader is found and followed.
    #[arg(long, env = "RINGMASTER_MASTER", value_parser = ringmaster_sdk::master_list)]
    pub master: String,
    /// Framework name; tasks are named NAME-0, NAME-1, ...
    #[arg(long)]
    pub name: String,
    /// Resources of one task, e.g. 'cpus:1;mem:128' (required without --batch). Names are
    /// cpus, mem, disk, gpus, gpu_milli, gpu_mem and gpu_model (docs/devices.md); others are
    /// refused as typos unless --allow-custom-resources.
    #[arg(long, default_value = "")]
    pub resources: String,
    /// Accept resource names outside the standard set, for custom resources agents declare
    /// (e.g. `licenses:1`).
    #[arg(long)]
    pub allow_custom_resources: bool,
    /// How many copies of the command to run.
    #[arg(long, default_value_t = 1)]
    pub instances: u32,
    /// The Unix user every task runs as on its agent, and the framework's user (priorities).
    /// Without it, tasks run as each agent's `--task-user` and the framework user is $USER,
    /// else root.
    #[arg(long)]
    pub user: Option<String>,
    /// The partition to run in: agents whose `partition` attribute is PARTITION (default:
    /// `default`, the agents without the attribute).
    #[arg(long)]
    pub partition: Option<String>,
    /// `user` (default): the user's priority while within the user's priority quota, else base;
    /// `base`: base priority, never counted against the quota (see docs/priorities.md).
    #[arg(long, value_name = "CLASS")]
    pub priority_class: Option<String>,
    /// DRF weight of the framework, > 0.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// Seconds the master keeps the tasks if this process disconnects.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub failover_timeout: f64,
    /// Give up (exit 1) when the master cannot be reached for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub connect_timeout: f64,
    /// When every task has ended but some are LOST with their agent (reason `agent_lost`), wait
    /// this many seconds for the agent to come back with them (they then report RUNNING
    /// again) before exiting 1; 0 exits at once.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub lost_grace: f64,
    /// When a task is killed (Ctrl-C, preemption, a kill), the time between its SIGTERM and its
    /// SIGKILL, e.g. `5s` or `1m30s`, from 0s to 10m; without it, each agent's `--kill-grace`
    /// (3 s by default).
    #[arg(long, value_name = "DURATION")]
    pub kill_grace: Option<String>,
    /// Take over this running framework (failover of an exec that died): its tasks are
    /// reconciled, the ones the master knows are waited for, not launched again.
    #[arg(long, value_name = "ID")]
    pub framework_id: Option<String>,
    /// Keep the framework id and the launched task ids in this JSON file (written atomically as
    /// soon as they are known, removed when exec ends normally): an exec restarted with the
    /// same file takes the framework over, reports the tasks that already exist and launches
    /// only those never launched.
    #[arg(long, value_name = "PATH")]
    pub state_file: Option<std::path::PathBuf>,
    /// Submit the tasks of this YAML file as one batch to be matched at once (see
    /// docs/batch.md); then no --resources, --instances or command.
    #[arg(long, value_name = "FILE")]
    pub batch: Option<std::path::PathBuf>,
    /// Print each task's stdout, every line prefixed `[TASK_ID] `, once the task has ended
    /// (read through the master's HTTP `/files/read` on the --master address).
    #[arg(long, conflicts_with = "batch")]
    pub logs: bool,
    /// TLS and authentication (docs/security.md).
    #[command(flatten)]
    pub security: SecurityFlags,
    /// The command, run with `sh -c` (words joined with spaces).
    #[arg(last = true, required_unless_present = "batch", value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// A command line that parsed but cannot be run; the message names the bad part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A validated `ringmaster-exec` run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecPlan {
    /// How the framework subscribes.
    pub config: FrameworkConfig,
    /// Resources of one task.
    pub unit: Resources,
    /// Number of tasks, ≥ 1.
    pub instances: u32,
    /// The `sh -c` command line.
    pub command: String,
    /// With `--batch`: the batch (then `unit`, `instances` and `command` are unused).
    pub batch: Option<BatchFile>,
    /// `TaskInfo::priority_class` of every task (`""`: the user's priority within quota).
    pub priority_class: String,
    /// `TaskInfo::gpu_models` of every task: `gpu_model:A|B` of `--resources` (docs/devices.md).
    pub gpu_models: Vec<String>,
    /// `TaskInfo::user` of every task: `--user`, else empty (the agent's `--task-user`).
    pub task_user: String,
    /// How long tasks LOST with their agent may take to come back (`--lost-grace`).
    pub lost_grace: Duration,
    /// `--kill-grace`, set on every task (`None`: the agent's default).
    pub kill_grace: Option<Duration>,
    /// `--state-file`.
    pub state_file: Option<std::path::PathBuf>,
    /// The framework to take over (`--framework-id`, or the state file's), if any.
    pub takeover: Option<Takeover>,
    /// `--logs`: where ended tasks' stdout is read from.
    pub logs: Option<crate::logs::LogsReader>,
}

/// A framework a restarted exec takes over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    /// Its id (also in [`FrameworkConfig::framework_id`]).
    pub framework_id: String,
    /// The indices of the tasks the previous run launched (from the state file); `None` when
    /// unknown (`--framework-id` alone): every task is reconciled.
    pub launched: Option<Vec<usize>>,
}

/// The takeover that `--framework-id` and the state file ask for; errors name the flag.
fn takeover_of(
    framework_id: Option<&str>,
    state_file: Option<&std::path::Path>,
    name: &str,
    instances: u32,
) -> Result<Option<Takeover>, UsageError> {
    if let Some(id) = framework_id {
        if id.trim().is_empty() || id.chars().any(char::is_whitespace) {
            return Err(UsageError(format!(
                "--framework-id must be a framework id without spaces, got {id:?}"
            )));
        }
    }
    let saved = match state_file {
        Some(path) => ExecState::load(path).map_err(|e| UsageError(format!("--state-file {e}")))?,
        None => None,
    };
    let Some(saved) = saved else {
        return Ok(framework_id.map(|id| Takeover {
            framework_id: id.to_string(),
            launched: None,
        }));
    };
    let path = state_file
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if let Some(id) = framework_id.filter(|id| *id != saved.framework_id) {
        return Err(UsageError(format!(
            "--framework-id {id} differs from framework {} in --state-file {path}",
            saved.framework_id
        )));
    }
    if saved.name != name {
        return Err(UsageError(format!(
            "--state-file {path} belongs to --name {:?}, not {name:?}",
            saved.name
        )));
    }
    let mut launched = Vec::new();
    for task_id in &saved.tasks {
        let index = task_id
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|&i| i < instances as usize && format!("{name}-{i}") == *task_id);
        match index {
            Some(i) if !launched.contains(&i) => launched.push(i),
            Some(_) => {}
            None => {
                return Err(UsageError(format!(
                    "--state-file {path} lists task {task_id:?}, not one of {name}-0 .. {name}-{} (--instances {instances})",
                    instances.saturating_sub(1)
                )))
            }
        }
    }
    Ok(Some(Takeover {
        framework_id: saved.framework_id,
        launched: Some(launched),
    }))
}

/// The largest `--kill-grace`.
pub const MAX_KILL_GRACE: Duration = Duration::from_secs(600);

/// Parses `--kill-grace`: a humantime duration from 0s to 10m.
fn parse_kill_grace(text: &str) -> Result<Duration, UsageError> {
    match humantime::parse_duration(text.trim()) {
        Ok(grace) if grace <= MAX_KILL_GRACE => Ok(grace),
        Ok(_) => Err(UsageError(format!(
            "--kill-grace must be from 0s to 10m, got {text:?}"
        ))),
        Err(e) => Err(UsageError(format!(
            "--kill-grace must be a duration from 0s to 10m such as 5s or 1m30s, got {text:?}: {e}"
        ))),
    }
}

impl ExecArgs {
    /// Validates the arguments clap cannot check.
    pub fn plan(&self) -> Result<ExecPlan, UsageError> {
        let usage = |text: String| Err(UsageError(text));
        if self.name.trim().is_empty() {
            return usage("--name must not be empty".into());
        }
        if let Some(path) = &self.batch {
            if self.framework_id.is_some() || self.state_file.is_some() {
                return usage(
                    "--batch does not fail over: drop --framework-id and --state-file".into(),
                );
            }
            if !self.resources.is_empty() || !self.command.is_empty() || self.instances != 1 {
                return usage(
                    "--batch takes tasks, resources and commands from the file: drop --resources, --instances and the command".into(),
                );
            }
            let batch = BatchFile::load(path).map_err(|e| UsageError(format!("--batch {e}")))?;
            if !self.allow_custom_resources {
                for info in batch.tasks.iter().filter_map(|t| t.task.as_ref()) {
                    let resources =
                        Resources::from_wire(info.resources.as_ref()).unwrap_or_default();
                    if let Err(e) = check_known_names(&resources, &STANDARD_NAMES) {
                        return usage(format!(
                            "--batch {}: task {}: {e} (--allow-custom-resources accepts other names)",
                            path.display(),
                            info.task_id
                        ));
                    }
                }
            }
            let mut plan = ExecArgs {
                batch: None,
                resources: "cpus:1".into(),
                command: vec!["true".into()],
                ..self.clone()
            }
            .plan()?;
            plan.unit = Resources::new();
            plan.command = String::new();
            plan.instances = batch.tasks.len() as u32;
            let mut batch = batch;
            for info in batch.tasks.iter_mut().filter_map(|t| t.task.as_mut()) {
                info.user = plan.task_user.clone();
                if let Some(grace) = plan.kill_grace {
                    *info = with_kill_grace(std::mem::take(info), grace);
                }
            }
            plan.batch = Some(batch);
            return Ok(plan);
        }
        // GPU text (`gpus:2`, `gpu_milli:500`, `gpu_model:A|B`) becomes canonical scalars.
        let (unit, gpu_models) =
            match ringmaster_proto::devices::parse_task_resources(&self.resources) {
                Ok((unit, _)) if unit.is_empty() => {
                    return usage(
                        "--resources must name at least one resource, e.g. 'cpus:1;mem:128'".into(),
                    )
                }
                Ok((unit, request)) => (unit, request.map(|r| r.models).unwrap_or_default()),
                Err(e) => return usage(format!("--resources: {e}")),
            };
        if !self.allow_custom_resources {
            if let Err(e) = check_known_names(&unit, &STANDARD_NAMES) {
                return usage(format!(
                    "--resources: {e} (--allow-custom-resources accepts other names)"
                ));
            }
        }
        if self.instances == 0 {
            return usage("--instances must be at least 1".into());
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return usage(format!(
                "--weight must be a number > 0, got {}",
                self.weight
            ));
        }
        let Ok(failover_timeout) = Duration::try_from_secs_f64(self.failover_timeout) else {
            return usage(format!(
                "--failover-timeout must be a number of seconds ≥ 0, got {}",
                self.failover_timeout
            ));
        };
        let connect_timeout = match Duration::try_from_secs_f64(self.connect_timeout) {
            Ok(t) if !t.is_zero() => t,
            _ => {
                return usage(format!(
                    "--connect-timeout must be a number of seconds > 0, got {}",
                    self.connect_timeout
                ))
            }
        };
        let lost_grace = match Duration::try_from_secs_f64(self.lost_grace) {
            Ok(t) if t <= Duration::from_secs(86_400) => t,
            _ => {
                return usage(format!(
                    "--lost-grace must be a number of seconds from 0 to 86400, got {}",
                    self.lost_grace
                ))
            }
        };
        let kill_grace = self
            .kill_grace
            .as_deref()
            .map(parse_kill_grace)
            .transpose()?;
        let command = self.command.join(" ");
        if command.trim().is_empty() {
            return usage("the command after `--` is empty".into());
        }
        let mut config = FrameworkConfig::new(self.master.clone(), self.name.clone());
        if let Some(user) = &self.user {
            if user.trim().is_empty() {
                return usage("--user must not be empty".into());
            }
            config.user = user.clone();
        }
        if let Some(partition) = &self.partition {
            if partition.trim().is_empty() || partition.chars().any(char::is_whitespace) {
                return usage(format!(
                    "--partition must be a name without spaces, got {partition:?}"
                ));
            }
            config.partition = partition.clone();
        }
        let priority_class = match self.priority_class.as_deref() {
            None | Some("user") => String::new(),
            Some("base") => "base".to_string(),
            Some(other) => {
                return usage(format!(
                    "--priority-class must be `user` or `base`, got {other:?}"
                ))
            }
        };
        let takeover = takeover_of(
            self.framework_id.as_deref(),
            self.state_file.as_deref(),
            &self.name,
            self.instances,
        )?;
        config.framework_id = takeover.as_ref().map(|t| t.framework_id.clone());
        config.weight = self.weight;
        config.failover_timeout = failover_timeout;
        config.give_up_after = Some(connect_timeout);
        config.security = self.security.load().map_err(UsageError)?;
        if let Err(e) = config.validate() {
            return usage(e.to_string());
        }
        Ok(ExecPlan {
            config,
            unit,
            instances: self.instances,
            command,
            batch: None,
            priority_class,
            gpu_models,
            task_user: self.user.clone().unwrap_or_default(),
            lost_grace,
            kill_grace,
            state_file: self.state_file.clone(),
            takeover,
            logs: self
                .logs
                .then(|| crate::logs::LogsReader::new(&self.master)),
        })
    }
}

/// For GPU tasks, how many of at most `count` tasks of size `unit` the offer's devices hold: the
/// `gpu_milli` sum cannot tell (two devices with 400 free each hold no 600 slice, see
/// docs/devices.md). `count` unchanged for tasks without GPUs.
pub fn gpu_tasks_fitting(
    offer: &Offer,
    unit: &Resources,
    gpu_models: &[String],
    count: u32,
) -> u32 {
    use ringmaster_proto::devices::{DeviceRequest, DeviceState, GpuDemand};
    match DeviceRequest::from_scalars(unit, gpu_models.to_vec()) {
        // An agent without a device list: `gpus` is a plain scalar, already counted.
        Ok(Some(request))
            if offer.devices.is_empty() && matches!(request.demand, GpuDemand::Whole { .. }) =>
        {
            count
        }
        Ok(Some(request)) => DeviceState::from_wire(&offer.devices, &offer.free_devices)
            .map_or(0, |devices| devices.copies_of(&request, count)),
        Ok(None) => count,
        Err(_) => 0,
    }
}

/// How many tasks of size `unit` to launch on an offer of `offered`, at most `remaining`.
pub fn tasks_fitting(offered: &Resources, unit: &Resources, remaining: u32) -> u32 {
    offered.copies_of(unit).min(u64::from(remaining)) as u32
}

/// The scheduler behind `ringmaster-exec`; `out` receives the state lines.
pub struct ExecScheduler<W> {
    /// `--logs`: prints each ended task's stdout.
    logs: Option<crate::logs::LogsReader>,
    /// The master's HTTP was found unreachable (said once).
    logs_warned: bool,
    name: String,
    unit: Resources,
    command: String,
    priority_class: String,
    gpu_models: Vec<String>,
    task_user: String,
    kill_grace: Option<Duration>,
    /// The last state of each task by index.
    book: TaskBook,
    index_of: HashMap<String, usize>,
    /// The tasks whose launch was sent (by this run, or by the run taken over).
    launched: BTreeSet<usize>,
    /// Launched tasks of a run taken over whose existence the master has not confirmed yet.
    reconciling: BTreeSet<usize>,
    /// The framework to take over, until the first subscription.
    takeover: Option<Takeover>,
    state_file: Option<std::path::PathBuf>,
    /// A failed state file write was reported (once is enough).
    state_file_warned: bool,
    stopper: Stopper,
    /// Why tasks are still waiting, printed on stderr by `ticker`.
    waiting: SharedWaiting,
    ticker: Option<tokio::task::AbortHandle>,
    out: W,
}

impl<W> Drop for ExecScheduler<W> {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
    }
}

impl<W: Write + Send + 'static> ExecScheduler<W> {
    /// A scheduler for `plan` writing its lines to `out`.
    pub fn new(plan: &ExecPlan, out: W) -> Self {
        let name = plan.config.name.clone();
        let index_of = (0..plan.instances as usize)
            .map(|i| (format!("{name}-{i}"), i))
            .collect();
        ExecScheduler {
            name,
            unit: plan.unit.clone(),
            command: plan.command.clone(),
            priority_class: plan.priority_class.clone(),
            gpu_models: plan.gpu_models.clone(),
            task_user: plan.task_user.clone(),
            kill_grace: plan.kill_grace,
            book: TaskBook::new(plan.instances as usize),
            index_of,
            launched: plan
                .takeover
                .as_ref()
                .map(|t| match &t.launched {
                    Some(launched) => launched.iter().copied().collect(),
                    None => (0..plan.instances as usize).collect(),
                })
                .unwrap_or_default(),
            reconciling: BTreeSet::new(),
            takeover: plan.takeover.clone(),
            state_file: plan.state_file.clone(),
            state_file_warned: false,
            stopper: Stopper::new(plan.lost_grace),
            waiting: Arc::new(Mutex::new(Waiting::new(
                plan.unit.clone(),
                plan.instances,
                Instant::now(),
            ))),
            ticker: None,
            logs: plan.logs.clone(),
            logs_warned: false,
            out,
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The exit code for the states seen so far.
    pub fn exit_code(&self) -> i32 {
        exit_code(self.book.states())
    }

    fn remaining(&self) -> u32 {
        (self.book.states().len() - self.launched.len()) as u32
    }

    /// The ids of the tasks at `indices`.
    fn task_ids<'a>(&self, indices: impl IntoIterator<Item = &'a usize>) -> Vec<String> {
        indices
            .into_iter()
            .map(|i| format!("{}-{i}", self.name))
            .collect()
    }

    /// Writes the state file (if any) with `framework_id` and the launched tasks.
    fn save_state(&mut self, framework_id: &str) {
        let Some(path) = &self.state_file else {
            return;
        };
        let state = ExecState {
            name: self.name.clone(),
            framework_id: framework_id.to_string(),
            tasks: self.task_ids(&self.launched),
        };
        if let Err(e) = state.save(path) {
            if !self.state_file_warned {
                eprintln!(
                    "ringmaster-exec: cannot write the state file {}: {e} (a restarted exec could not take over)",
                    path.display()
                );
                self.state_file_warned = true;
            }
        }
    }

    /// States the demand for the tasks not launched yet.
    fn request_remaining(&mut self, driver: &Driver) {
        let remaining = self.remaining();
        self.waiting().launched(remaining, Instant::now());
        let _ = driver.request(&self.unit, remaining);
    }

    /// A reconciliation answer for a task of the run taken over: true when it was one (and was
    /// handled). A task the master does not know was never launched: it is launched now.
    fn reconciled(&mut self, driver: &Driver, status: &TaskStatus) -> bool {
        let Some(&index) = self.index_of.get(&status.task_id) else {
            return false;
        };
        if !self.reconciling.remove(&index) {
            return false;
        }
        let unknown = status.state() == TaskState::TaskLost
            && matches!(status.reason.as_str(), "reconciliation" | "unknown_task");
        if !unknown {
            return false;
        }
        self.launched.remove(&index);
        if let Some(framework_id) = driver.framework_id() {
            self.save_state(&framework_id);
        }
        self.request_remaining(driver);
        let _ = driver.revive();
        true
    }

    /// Records a state; prints a line when it changed (see [`TaskBook`]).
    /// Records and prints a task's state; true when it was new.
    fn record(&mut self, status: &TaskStatus) -> bool {
        let Some(&index) = self.index_of.get(&status.task_id) else {
            warn!(task_id = %status.task_id, "status of a task this run did not launch ignored");
            return false;
        };
        if !self.book.record(index, status) {
            return false;
        }
        if let Err(e) =
            writeln!(self.out, "{}", status_line(status)).and_then(|()| self.out.flush())
        {
            warn!(error = %e, "could not print a task state");
        }
        true
    }

    /// `--logs`: prints the stdout of a task that ended, read through the master's HTTP.
    async fn print_logs(&mut self, driver: &Driver, task_id: &str) {
        let Some(reader) = self.logs.clone() else {
            return;
        };
        if self.logs_warned {
            return;
        }
        let Some(framework_id) = driver.framework_id() else {
            return;
        };
        let task = task_id.to_string();
        let read = tokio::task::spawn_blocking(move || reader.stdout(&framework_id, &task)).await;
        match read {
            Ok(Ok(text)) => {
                let text = crate::logs::prefixed(task_id, &text);
                if let Err(e) = self
                    .out
                    .write_all(text.as_bytes())
                    .and_then(|()| self.out.flush())
                {
                    warn!(error = %e, "could not print a task's output");
                }
            }
            Ok(Err(crate::logs::LogsError::Refused(why))) => {
                eprintln!("ringmaster-exec: no output of task {task_id}: {why}");
            }
            Ok(Err(crate::logs::LogsError::Unreachable(why))) => {
                self.logs_warned = true;
                eprintln!(
                    "ringmaster-exec: --logs: the master's HTTP is not reachable ({why}); \
                     going on without task output"
                );
            }
            Err(e) => warn!(error = %e, "reading a task's output failed"),
        }
    }

    /// Asks for the state of every launched task not yet terminal.
    fn reconcile_open(&self, driver: &Driver) {
        let open: Vec<usize> = self
            .launched
            .iter()
            .copied()
            .filter(|&i| !self.book.ended(i))
            .collect();
        let open = self.task_ids(&open);
        if !open.is_empty() {
            let _ = driver.reconcile(&open);
        }
    }

    /// Stops when every task ended for good, or after the lost grace (see [`Stopper`]).
    fn stop_when_done(&mut self, driver: &Driver) {
        let progress =
            if self.launched.len() == self.book.states().len() && self.reconciling.is_empty() {
                self.book.progress(0..self.book.states().len())
            } else {
                Progress::Open
            };
        self.stopper.update(progress, driver);
    }
}

#[async_trait]
impl<W: Write + Send + 'static> Scheduler for ExecScheduler<W> {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        let takeover = self.takeover.take();
        let took_over = takeover
            .as_ref()
            .is_some_and(|t| t.framework_id == framework_id);
        if let Some(old) = takeover.as_ref().filter(|_| !took_over) {
            eprintln!(
                "ringmaster-exec: framework {} is gone (past its failover timeout?), its tasks with it; subscribed anew as {framework_id}",
                old.framework_id
            );
            if old.launched.is_none() {
                // Which tasks it had is unknown: start over.
                self.launched.clear();
            }
        }
        self.save_state(framework_id);
        if took_over {
            self.reconciling = self.launched.clone();
            let ids = self.task_ids(&self.reconciling);
            eprintln!(
                "ringmaster-exec: took over framework {framework_id}; reconciling {} task(s), launching {}",
                ids.len(),
                self.remaining()
            );
            if !ids.is_empty() {
                let _ = driver.reconcile(&ids);
            }
        } else if !self.launched.is_empty() {
            // A new framework id: the old framework expired with its tasks.
            for index in self.launched.clone() {
                let status = TaskStatus {
                    task_id: format!("{}-{index}", self.name),
                    framework_id: framework_id.to_string(),
                    state: TaskState::TaskLost as i32,
                    reason: "framework_expired".into(),
                    ..TaskStatus::default()
                };
                self.record(&status);
            }
            self.stop_when_done(driver);
            if self.remaining() == 0 {
                return;
            }
        }
        if self.ticker.is_none() {
            self.ticker = Some(spawn_ticker(self.waiting.clone()));
        }
        self.request_remaining(driver);
    }

    async fn reregistered(&mut self, driver: &Driver, _framework_id: &str) {
        self.reconcile_open(driver);
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        let before = self.launched.len();
        let mut declined = Vec::new();
        for offer in offers {
            let offered = match Resources::from_wire(offer.resources.as_ref()) {
                Ok(offered) => offered,
                Err(e) => {
                    warn!(offer_id = %offer.offer_id, error = %e, "offer with unreadable resources declined");
                    declined.push(offer.offer_id);
                    continue;
                }
            };
            let fitting = tasks_fitting(&offered, &self.unit, self.remaining());
            let count = gpu_tasks_fitting(&offer, &self.unit, &self.gpu_models, fitting);
            if count == 0 {
                self.waiting()
                    .declined(&offer.agent_id, &offered, fitting > 0);
                declined.push(offer.offer_id);
                continue;
            }
            let indices: Vec<usize> = (0..self.book.states().len())
                .filter(|i| !self.launched.contains(i))
                .take(count as usize)
                .collect();
            let tasks = indices
                .iter()
                .map(|i| {
                    let mut info = task(&format!("{}-{i}", self.name), &self.command, &self.unit);
                    info.priority_class = self.priority_class.clone();
                    info.gpu_models = self.gpu_models.clone();
                    info.user = self.task_user.clone();
                    match self.kill_grace {
                        Some(grace) => with_kill_grace(info, grace),
                        None => info,
                    }
                })
                .collect();
            self.launched.extend(&indices);
            // Saved before the launch is sent: a restarted exec then asks about these tasks.
            if let Some(framework_id) = driver.framework_id() {
                self.save_state(&framework_id);
            }
            let _ = driver.accept(&offer.offer_id, tasks);
        }
        if !declined.is_empty() {
            let _ = driver.decline(&declined, Duration::ZERO);
        }
        if self.launched.len() != before {
            let remaining = self.remaining();
            self.waiting().launched(remaining, Instant::now());
            let _ = driver.request(&self.unit, self.remaining());
            if self.remaining() == 0 {
                let _ = driver.suppress();
            }
        }
    }

    async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
        if self.reconciled(driver, &status) {
            eprintln!(
                "ringmaster-exec: task {} of the framework taken over was never launched; launching it",
                status.task_id
            );
            return;
        }
        if self.record(&status) && status.state().is_terminal() {
            self.print_logs(driver, &status.task_id).await;
        }
        self.stop_when_done(driver);
    }

    async fn error(&mut self, driver: &Driver, code: ErrorCode, message: &str) {
        warn!(code = code.as_str_name(), %message, "the master reported an error");
        if matches!(code, ErrorCode::InvalidOffer | ErrorCode::InvalidTask) {
            // An accept was refused: learn which of our tasks the master does not know
            // (answered LOST) instead of waiting for them forever.
            self.reconcile_open(driver);
        }
    }
}

/// Runs `ringmaster-exec` with parsed arguments, printing state lines to `out`; returns the
/// process exit code. Usage and connection errors are reported on stderr.
pub async fn run_exec<W: Write + Send + 'static>(args: ExecArgs, out: W) -> i32 {
    let plan = match args.plan() {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("ringmaster-exec: {e}");
            return EXIT_USAGE;
        }
    };
    if let Some(batch) = plan.batch {
        let batch_id = batch.batch_id.unwrap_or_else(|| plan.config.name.clone());
        let scheduler = BatchExecScheduler::new(batch_id, batch.tasks, plan.lost_grace, out);
        return match run_interruptible(plan.config, scheduler).await {
            Outcome::Finished(result) => finished(result.map(|s| s.exit_code())),
            Outcome::Interrupted { signal, .. } => signal.exit_code(),
        };
    }
    let scheduler = ExecScheduler::new(&plan, out);
    let state_file = plan.state_file.clone();
    let outcome = run_interruptible(plan.config, scheduler).await;
    if let Some(path) = &state_file {
        match &outcome {
            // Ended normally: every task ended, or torn down after a signal.
            Outcome::Finished(Ok(_))
            | Outcome::Interrupted {
                torn_down: true, ..
            } => state_file::remove(path),
            _ if path.exists() => eprintln!(
                "ringmaster-exec: kept {}: run again with --state-file {} to take the framework over",
                path.display(),
                path.display()
            ),
            _ => {}
        }
    }
    match outcome {
        Outcome::Finished(result) => finished(result.map(|s| s.exit_code())),
        Outcome::Interrupted { signal, .. } => signal.exit_code(),
    }
}

/// The exit code of a run that ended by itself; errors are reported on stderr.
fn finished(result: Result<i32, ringmaster_sdk::SdkError>) -> i32 {
    result.unwrap_or_else(|e| {
        eprintln!("ringmaster-exec: {e}");
        EXIT_FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Result<ExecArgs, clap::Error> {
        let mut argv = vec![
            "ringmaster-exec",
            "--master",
            "127.0.0.1:1",
            "--name",
            "job",
        ];
        argv.extend_from_slice(extra);
        ExecArgs::try_parse_from(argv)
    }

    #[test]
    fn fitting_is_bounded_by_every_dimension_and_the_remaining_count() {
        let unit = Resources::parse("cpus:1;mem:128").unwrap();
        let table = [
            ("cpus:4;mem:1024", 10, 4),
            ("cpus:4;mem:300", 10, 2),
            ("cpus:4;mem:1024", 3, 3),
            ("cpus:0.5;mem:1024", 10, 0),
            ("mem:1024", 10, 0),
            ("cpus:2;mem:256;gpus:1", 10, 2),
            ("cpus:8;mem:1024", 0, 0),
        ];
        for (offered, remaining, want) in table {
            let offered = Resources::parse(offered).unwrap();
            assert_eq!(
                tasks_fitting(&offered, &unit, remaining),
                want,
                "{offered} / {remaining}"
            );
        }
    }

    #[test]
    fn gpu_tasks_are_counted_on_the_offers_devices() {
        use ringmaster_proto::devices::{Device, DeviceState};
        let devices: Vec<Device> = (0..2)
            .map(|index| Device {
                index,
                model: "V100M16".into(),
                memory_mib: 16384,
            })
            .collect();
        let state = DeviceState::with_free(devices, vec![400, 1000], vec![16384, 16384]).unwrap();
        let offer = Offer {
            devices: state.devices().iter().map(Into::into).collect(),
            free_devices: state.free_to_wire(),
            ..Offer::default()
        };
        let unit = |text: &str| Resources::parse(text).unwrap();
        // 1400 milli-GPU in sum, but only device 1 holds a 600 slice.
        assert_eq!(
            gpu_tasks_fitting(&offer, &unit("gpu_milli:600"), &[], 10),
            1
        );
        assert_eq!(
            gpu_tasks_fitting(&offer, &unit("gpu_milli:200"), &[], 10),
            7
        );
        assert_eq!(gpu_tasks_fitting(&offer, &unit("gpu_milli:200"), &[], 3), 3);
        assert_eq!(
            gpu_tasks_fitting(&offer, &unit("gpu_milli:1000"), &[], 10),
            1
        );
        assert_eq!(gpu_tasks_fitting(&offer, &unit("gpus:1"), &[], 10), 1);
        assert_eq!(
            gpu_tasks_fitting(&Offer::default(), &unit("gpus:1"), &[], 4),
            4
        );
        let other = ["A100".to_string()];
        assert_eq!(
            gpu_tasks_fitting(&offer, &unit("gpu_milli:100"), &other, 10),
            0
        );
        assert_eq!(gpu_tasks_fitting(&offer, &unit("cpus:1"), &[], 4), 4);
        assert_eq!(
            gpu_tasks_fitting(&Offer::default(), &unit("gpu_milli:1"), &[], 4),
            0
        );
    }

    #[test]
    fn gpu_resources_text_is_canonical_in_the_plan() {
        let plan = args(&["--resources", "cpus:1;gpus:2;gpu_model:V100M32", "--", "x"])
            .unwrap()
            .plan()
            .unwrap();
        assert_eq!(plan.unit.to_string(), "cpus:1;gpus:2");
        assert_eq!(plan.gpu_models, ["V100M32"]);
        let err = args(&["--resources", "gpus:1;gpu_milli:5", "--", "x"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(err.0.contains("--resources: ambiguous"), "{}", err.0);
    }

    #[test]
    fn plan_joins_the_command_and_applies_options() {
        let plan = args(&[
            "--resources",
            "cpus:1;mem:128",
            "--instances",
            "3",
            "--user",
            "ann",
            "--weight",
            "2",
            "--failover-timeout",
            "5",
            "--partition",
            "gpu",
            "--priority-class",
            "base",
            "--",
            "echo",
            "hi",
            "there",
        ])
        .unwrap()
        .plan()
        .unwrap();
        assert_eq!(plan.command, "echo hi there");
        assert_eq!(plan.instances, 3);
        assert_eq!(plan.unit, Resources::parse("mem:128;cpus:1").unwrap());
        assert_eq!(plan.config.user, "ann");
        assert_eq!(plan.task_user, "ann");
        assert_eq!(plan.config.weight, 2.0);
        assert_eq!(plan.config.failover_timeout, Duration::from_secs(5));
        assert_eq!(plan.config.name, "job");
        assert_eq!(plan.config.partition, "gpu");
        assert_eq!(plan.priority_class, "base");
    }

    #[test]
    fn tasks_carry_a_user_only_when_one_is_given() {
        let plan = args(&["--resources", "cpus:1", "--", "true"])
            .unwrap()
            .plan()
            .unwrap();
        assert_eq!(plan.task_user, "", "no --user: the agent's --task-user");
    }

    #[test]
    fn usage_errors_name_the_bad_part() {
        let table: [(&[&str], &str); 8] = [
            (
                &["--resources", "cpus:1", "--partition", " ", "--", "true"],
                "--partition",
            ),
            (
                &[
                    "--resources",
                    "cpus:1",
                    "--priority-class",
                    "high",
                    "--",
                    "true",
                ],
                "--priority-class",
            ),
            (&["--resources", "cpus:x", "--", "true"], "--resources"),
            (&["--resources", "", "--", "true"], "--resources"),
            (
                &["--resources", "cpus:1", "--instances", "0", "--", "true"],
                "--instances",
            ),
            (&["--resources", "cpus:1", "--", ""], "command"),
            (
                &["--resources", "cpus:1", "--weight", "0", "--", "true"],
                "--weight",
            ),
            (
                &[
                    "--resources",
                    "cpus:1",
                    "--failover-timeout=-1",
                    "--",
                    "true",
                ],
                "--failover-timeout",
            ),
        ];
        for (extra, word) in table {
            let err = args(extra).unwrap().plan().unwrap_err();
            assert!(
                err.0.contains(word),
                "{extra:?}: `{}` should mention {word}",
                err.0
            );
        }
    }

    #[test]
    fn resource_name_typos_are_usage_errors_unless_custom_resources_are_allowed() {
        let err = args(&["--resources", "cpu:4;mem:64", "--", "true"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(
            err.0
                .starts_with("--resources: unknown resource `cpu` (did you mean `cpus`?)"),
            "{}",
            err.0
        );
        assert!(err.0.contains("--allow-custom-resources"), "{}", err.0);
        let err = args(&["--resources", "cpus:1;licenses:2", "--", "true"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(err.0.contains("unknown resource `licenses`"), "{}", err.0);
        let plan = args(&[
            "--resources",
            "cpus:1;licenses:2",
            "--allow-custom-resources",
            "--",
            "true",
        ])
        .unwrap()
        .plan()
        .unwrap();
        assert_eq!(plan.unit.to_string(), "cpus:1;licenses:2");
        // Every standard name, GPU text included, passes.
        for text in [
            "cpus:1;mem:64;disk:10",
            "cpus:1;gpus:1;gpu_model:V100M16",
            "gpu_milli:500;gpu_mem:1024",
        ] {
            assert!(
                args(&["--resources", text, "--", "true"])
                    .unwrap()
                    .plan()
                    .is_ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn resource_name_typos_in_a_batch_file_are_usage_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.yaml");
        std::fs::write(
            &path,
            "tasks:\n  - { id: a, command: x, resources: 'cpus:1;memory:64', deadline: 5, work: 1 }\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let err = args(&["--batch", file]).unwrap().plan().unwrap_err();
        assert!(
            err.0
                .contains("task a: unknown resource `memory` (did you mean `mem`?)"),
            "{}",
            err.0
        );
        assert!(args(&["--batch", file, "--allow-custom-resources"])
            .unwrap()
            .plan()
            .is_ok());
    }

    #[test]
    fn kill_grace_is_a_duration_up_to_ten_minutes() {
        let grace = |text: &str| {
            let flag = format!("--kill-grace={text}");
            args(&["--resources", "cpus:1", &flag, "--", "true"])
                .unwrap()
                .plan()
        };
        assert_eq!(
            grace("5s").unwrap().kill_grace,
            Some(Duration::from_secs(5))
        );
        assert_eq!(grace("0s").unwrap().kill_grace, Some(Duration::ZERO));
        assert_eq!(grace("10m").unwrap().kill_grace, Some(MAX_KILL_GRACE));
        assert_eq!(
            grace("1m30s").unwrap().kill_grace,
            Some(Duration::from_secs(90))
        );
        let plan = args(&["--resources", "cpus:1", "--", "true"])
            .unwrap()
            .plan();
        assert_eq!(plan.unwrap().kill_grace, None);
        for bad in ["11m", "5", "five", "-1s", "", "99999999999999999999h"] {
            let err = grace(bad).unwrap_err();
            assert!(
                err.0.starts_with("--kill-grace must be") && err.0.contains("0s to 10m"),
                "{bad:?}: {}",
                err.0
            );
        }
    }

    #[test]
    fn kill_grace_is_set_on_batch_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.yaml");
        std::fs::write(
            &path,
            "tasks:\n  - { id: a, command: x, resources: 'cpus:1', deadline: 5, work: 1 }\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let plan = args(&["--batch", file, "--kill-grace", "2s"])
            .unwrap()
            .plan()
            .unwrap();
        let info = plan.batch.unwrap().tasks[0].task.clone().unwrap();
        assert_eq!(info.kill_grace_ms, 2000);
    }

    #[test]
    fn takeover_comes_from_the_state_file_or_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        // No file, no flag: a fresh run; the flag alone: every task is reconciled.
        assert_eq!(takeover_of(None, Some(&path), "job", 3), Ok(None));
        let flag_only = takeover_of(Some("fw-1"), Some(&path), "job", 3).unwrap();
        assert_eq!(
            flag_only,
            Some(Takeover {
                framework_id: "fw-1".into(),
                launched: None
            })
        );
        let save = |name: &str, id: &str, tasks: &[&str]| {
            ExecState {
                name: name.into(),
                framework_id: id.into(),
                tasks: tasks.iter().map(|t| t.to_string()).collect(),
            }
            .save(&path)
            .unwrap()
        };
        save("job", "fw-2", &["job-2", "job-0", "job-2"]);
        let from_file = takeover_of(None, Some(&path), "job", 3).unwrap().unwrap();
        assert_eq!(from_file.framework_id, "fw-2");
        assert_eq!(from_file.launched, Some(vec![2, 0]));
        assert!(takeover_of(Some("fw-2"), Some(&path), "job", 3).is_ok());
        let bad: [(Option<&str>, &str, u32, &str); 4] = [
            (Some("fw-9"), "job", 3, "differs from framework fw-2"),
            (None, "other", 3, "belongs to --name \"job\""),
            (None, "job", 2, "lists task \"job-2\""),
            (Some(" "), "job", 3, "--framework-id must be"),
        ];
        for (flag, name, instances, want) in bad {
            let err = takeover_of(flag, Some(&path), name, instances).unwrap_err();
            assert!(err.0.contains(want), "{}", err.0);
        }
        save("job", "fw-2", &["job-x"]);
        let err = takeover_of(None, Some(&path), "job", 3).unwrap_err();
        assert!(err.0.contains("lists task \"job-x\""), "{}", err.0);
        save("job", "fw-2", &["job-01"]);
        assert!(takeover_of(None, Some(&path), "job", 3).is_err());
    }

    #[test]
    fn the_plan_takes_over_the_saved_framework() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let file = path.to_str().unwrap();
        let plan = args(&["--resources", "cpus:1", "--state-file", file, "--", "true"])
            .unwrap()
            .plan()
            .unwrap();
        assert_eq!(plan.config.framework_id, None);
        assert_eq!(plan.state_file.as_deref(), Some(path.as_path()));
        let plan = args(&[
            "--resources",
            "cpus:1",
            "--framework-id",
            "fw-3",
            "--",
            "true",
        ])
        .unwrap()
        .plan()
        .unwrap();
        assert_eq!(plan.config.framework_id.as_deref(), Some("fw-3"));
        let err = args(&["--batch", file, "--state-file", file])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(err.0.contains("--batch does not fail over"), "{}", err.0);
    }

    #[test]
    fn a_missing_command_is_a_clap_error() {
        assert!(args(&["--resources", "cpus:1"]).is_err());
    }
}
