//! Running one task as a real process: sandbox, spawn, watch, kill.
//!
//! Each task is `sh -c COMMAND` in its own process group, so a kill reaches everything the
//! command started (pipelines, background jobs), not just the shell. With cgroups
//! ([`crate::isolation`]) the task also runs in its own cgroup, joined before the command is
//! exec'd, and a kill reaches every process in it, also those that left the process group
//! (`setsid`). A watcher (one tokio task per process) owns the child; it reports the exit on a
//! channel only once the whole group (and cgroup) is empty, so "task ended" also means "its
//! processes are gone"; it then removes the cgroup. Nothing here knows about the master, which
//! keeps this part testable on its own.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::isolation::TaskCgroup;
use crate::users::TaskUser;

/// How often a killed group is checked for survivors during the grace period.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How often a task adopted after an agent restart (not our child) is checked for its end.
const ADOPTED_POLL: Duration = Duration::from_millis(100);
/// How long after the SIGKILL deadline survivors are waited for before they are given up on.
const GIVE_UP_AFTER_SIGKILL: Duration = Duration::from_secs(5);

/// The file in the sandbox where the task's wrapper records the command's exit status, so an
/// agent that restarted (and so cannot wait for the process) still learns how it ended.
pub const EXIT_STATUS_FILE: &str = ".ringmaster-exit";

/// Every task runs under this small `sh` wrapper (the group leader): it runs the command as
/// `sh -c COMMAND`, writes its exit status to [`EXIT_STATUS_FILE`] (atomically, by rename),
/// then ends the same way the command did (re-raising a signal), so a waiting parent sees
/// exactly what the command did. The wrapper outlives a SIGTERM sent to the group (the trap
/// has a handler, so the command itself gets the default action), so a killed task's status
/// is recorded too; only SIGKILL ends the wrapper without a record. When its launch gate
/// closes without opening (the agent stopped before starting the task) it records
/// [`NOT_STARTED_MARK`] instead and exits 125 without running the command.
const WRAPPER: &str = r#"IFS= read -r gate <&3; exec 3<&-; [ "$gate" = go ] || { printf 'not-started\n' > .ringmaster-exit.tmp && mv -f .ringmaster-exit.tmp .ringmaster-exit; exit 125; }; trap : TERM INT HUP; sh -c "$1"; c=$?; printf '%s\n' "$c" > .ringmaster-exit.tmp && mv -f .ringmaster-exit.tmp .ringmaster-exit; if [ "$c" -gt 128 ] && [ "$c" -lt 193 ]; then trap - TERM INT HUP; kill -$((c - 128)) $$ 2>/dev/null; fi; exit "$c""#;

/// What the wrapper writes to [`EXIT_STATUS_FILE`] when its command never ran.
pub const NOT_STARTED_MARK: &str = "not-started";

/// Everything needed to start one task.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub command: String,
    /// Working directory; created if missing. `stdout` and `stderr` files are written in it.
    pub sandbox: PathBuf,
    /// Environment added to the agent's own.
    pub env: Vec<(String, String)>,
    /// SIGTERM-to-SIGKILL grace when the task is killed.
    pub kill_grace: Duration,
    /// The user to run as (`None`: the agent's own). The sandbox is then owned by this user and
    /// made 0700; the process gets the user's uid, gid and supplementary groups.
    pub user: Option<TaskUser>,
    /// The task's cgroup (`None`: no cgroup isolation). The process joins it before exec; the
    /// watcher removes it once it is empty.
    pub cgroup: Option<Arc<TaskCgroup>>,
}

/// How a task's main process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    /// Exited with this status.
    Code(i32),
    /// Terminated by this signal.
    Signal(i32),
    /// Waiting for the process failed; it is not known how it ended.
    WaitFailed(String),
    /// The command never ran: the launch gate closed before the agent started the task (it
    /// stopped in between), so the wrapper exited without running it. Read from the
    /// sandbox ([`NOT_STARTED_MARK`]) for a task adopted after a restart.
    NotStarted,
    /// The kernel killed a process of the task for exceeding the task's memory limit (its
    /// cgroup counted an OOM kill); the task then ended as `then` says.
    MemoryLimit(Box<ExitOutcome>),
}

impl ExitOutcome {
    fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitOutcome::Code(code),
            (None, Some(signal)) => ExitOutcome::Signal(signal),
            (None, None) => ExitOutcome::WaitFailed(format!("unrecognised exit status {status}")),
        }
    }
}

/// A handle on a running task's process group.
#[derive(Debug)]
pub struct ProcessHandle {
    pid: u32,
    /// A kill request: `None` uses the task's grace, `Some(d)` at most `d`.
    kill: mpsc::UnboundedSender<Option<Duration>>,
    /// The write end of the launch gate ([`launch_gated`]) until [`start`](Self::start).
    gate: Option<File>,
}

impl ProcessHandle {
    /// Lets a gated task run its command ([`launch_gated`]). Harmless when it already runs,
    /// ended or was not gated.
    pub fn start(&mut self) {
        if let Some(mut gate) = self.gate.take() {
            if let Err(e) = gate.write_all(b"go\n") {
                tracing::warn!(pid = self.pid, "cannot open the launch gate: {e}");
            }
        }
    }

    /// The main process id, which is also the process group id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Asks the watcher to end the whole group: SIGTERM now, SIGKILL after the grace period.
    /// Harmless when the process already ended or was already asked.
    pub fn kill(&self) {
        let _ = self.kill.send(None);
    }

    /// As [`ProcessHandle::kill`], with SIGKILL at most `grace` from now even when the task's
    /// own grace is longer (or a kill with a longer grace is under way): the agent's shutdown
    /// is bounded by its own `--kill-grace`.
    pub fn kill_within(&self, grace: Duration) {
        let _ = self.kill.send(Some(grace));
    }
}

/// Why a task could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot create sandbox {path}: {source}")]
    Sandbox { path: PathBuf, source: io::Error },
    #[error("cannot create {path}: {source}")]
    OutputFile { path: PathBuf, source: io::Error },
    #[error("invalid environment variable name {name:?}")]
    BadEnv { name: String },
    #[error("cannot hand sandbox {path} to user {user}: {source}")]
    SandboxOwner {
        path: PathBuf,
        user: String,
        source: io::Error,
    },
    #[error("cannot spawn `sh -c`: {0}")]
    Spawn(io::Error),
    #[error(
        "cannot start the task in cgroup {cgroup} (join the cgroup, then switch user): {source}"
    )]
    SpawnInCgroup { cgroup: String, source: io::Error },
}

/// The agent's own variables a task (and its health checks) inherits; everything else of the
/// agent's environment (credentials of the operator's shell, `RINGMASTER_*` settings of the
/// agent) stays out of tasks, as Mesos and Kubernetes start containers from their spec alone.
const INHERITED_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ"];
/// `PATH` when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Clears `command`'s environment down to [`INHERITED_ENV`] of the agent's, then sets `env`
/// (the task's: what the agent sets, the framework's, the devices').
pub fn set_environment(command: &mut Command, env: &[(String, String)]) {
    command.env_clear();
    for name in INHERITED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        } else if *name == "PATH" {
            command.env(name, DEFAULT_PATH);
        }
    }
    command.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
}

/// The real uid a process runs as (`/proc/PID/status`).
pub fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The environment a process was started with (`/proc/PID/environ`): for a task, the one
/// [`set_environment`] gave it.
pub fn process_environment(pid: u32) -> Option<Vec<(String, String)>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter_map(|entry| {
                let entry = std::str::from_utf8(entry).ok()?;
                let (k, v) = entry.split_once('=')?;
                (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
            })
            .collect(),
    )
}

/// Starts `sh -c COMMAND` in its own process group inside the sandbox. When the group is gone,
/// `(tag, outcome)` is sent on `exits`. Must be called within a tokio runtime.
pub fn launch<T: Send + 'static>(
    spec: &LaunchSpec,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) -> Result<ProcessHandle, LaunchError> {
    let mut handle = launch_gated(spec, tag, exits)?;
    handle.start();
    Ok(handle)
}

/// The file descriptor on which a task's wrapper waits for its launch gate.
const GATE_FD: i32 = 3;

/// A close-on-exec pipe: (read end, write end).
fn gate_pipe() -> io::Result<(OwnedFd, File)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are open descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((read, File::from(write)))
}

/// As [`launch`], but the task's command does not run until [`ProcessHandle::start`]: its
/// wrapper waits for the word `go` on a pipe whose write end only the handle holds. If the
/// agent dies before starting it, the pipe closes and the wrapper exits (125) without running
/// the command. So the agent can record the pid first and then start the task: a task that ran
/// is always one whose pid the agent recorded (and adopts after a restart), never one it would
/// take for "never ran" (found by tests/ha_history.rs: a short task killed the agent's record
/// race, ran, and was reported LOST).
pub fn launch_gated<T: Send + 'static>(
    spec: &LaunchSpec,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) -> Result<ProcessHandle, LaunchError> {
    for (name, _) in &spec.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(LaunchError::BadEnv { name: name.clone() });
        }
    }
    std::fs::create_dir_all(&spec.sandbox).map_err(|source| LaunchError::Sandbox {
        path: spec.sandbox.clone(),
        source,
    })?;
    let stdout = create_output(&spec.sandbox, "stdout")?;
    let stderr = create_output(&spec.sandbox, "stderr")?;
    // Only root switches users. A non-root agent runs tasks as itself (user resolution refuses
    // any other user there): setgroups needs CAP_SETGID even for the groups it already has.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let switch_user = spec
        .user
        .as_ref()
        .filter(|_| unsafe { libc::geteuid() } == 0);
    if let Some(user) = switch_user {
        hand_sandbox_to(&spec.sandbox, user).map_err(|source| LaunchError::SandboxOwner {
            path: spec.sandbox.clone(),
            user: user.name.clone(),
            source,
        })?;
    }
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(WRAPPER)
        .arg("ringmaster-task")
        .arg(&spec.command)
        .current_dir(&spec.sandbox)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(false);
    set_environment(&mut command, &spec.env);
    // Both ends are close-on-exec; the child gets the read end as GATE_FD, which is not.
    let (gate_read, gate_write) = gate_pipe().map_err(LaunchError::Spawn)?;
    let gate_fd = gate_read.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls dup2 or fcntl
    // (async-signal-safe) on a descriptor number it owns; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let done = if gate_fd == GATE_FD {
                libc::fcntl(GATE_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(gate_fd, GATE_FD)
            };
            if done < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    confine(&mut command, switch_user, spec.cgroup.as_deref());
    let child = command.spawn().map_err(|source| match &spec.cgroup {
        Some(cgroup) => LaunchError::SpawnInCgroup {
            cgroup: cgroup.path().to_string(),
            source,
        },
        None => LaunchError::Spawn(source),
    })?;
    let pid = child.id().ok_or_else(|| {
        LaunchError::Spawn(io::Error::other("child exited before its pid was read"))
    })?;
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let tree = Tree {
        pgid: pid,
        cgroup: spec.cgroup.clone(),
    };
    drop(gate_read);
    tokio::spawn(watch(child, tree, spec.kill_grace, kill_rx, tag, exits));
    Ok(ProcessHandle {
        pid,
        kill: kill_tx,
        gate: Some(gate_write),
    })
}

/// Makes `command` start where a task's processes run: in the task's cgroup (joined first,
/// while still root) and then as the task's user (only when the agent runs as root; a
/// non-root agent runs everything as itself). The task itself and its health checks
/// ([`crate::health`]) both start this way.
pub fn confine(command: &mut Command, user: Option<&TaskUser>, cgroup: Option<&TaskCgroup>) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let ids = user
        .filter(|_| unsafe { libc::geteuid() } == 0)
        .map(|user| (user.uid, user.gid, user.groups.clone()));
    let procs_files: Vec<std::ffi::CString> =
        cgroup.map(|c| c.procs_files().to_vec()).unwrap_or_default();
    if ids.is_some() || !procs_files.is_empty() {
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (open, write, close, setgroups, setgid, setuid) on data the
        // closure owns, prepared before the fork; it allocates nothing.
        // Order: join the cgroup first, while still root (writing `0` to `cgroup.procs` moves
        // the writing process); then groups, gid, uid (after setuid the others are refused).
        unsafe {
            command.pre_exec(move || {
                for file in &procs_files {
                    join_cgroup(file)?;
                }
                if let Some((uid, gid, groups)) = &ids {
                    if libc::setgroups(groups.len() as _, groups.as_ptr()) != 0
                        || libc::setgid(*gid) != 0
                        || libc::setuid(*uid) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
}

/// In the forked child: moves the calling process into the cgroup whose `cgroup.procs` file is
/// `file` (writing `0` means "me"). Async-signal-safe and allocation-free.
fn join_cgroup(file: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `file` is a valid NUL-terminated path; open, write and close are
    // async-signal-safe; the buffer is a static byte string.
    unsafe {
        let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = (written != 1).then(io::Error::last_os_error);
        libc::close(fd);
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Everything a task runs: its process group and, with cgroups, its cgroup.
struct Tree {
    pgid: u32,
    cgroup: Option<Arc<TaskCgroup>>,
}

impl Tree {
    /// Signals the whole group and every process in the cgroup (which includes processes that
    /// left the group).
    fn signal(&self, signal: libc::c_int) {
        signal_group(self.pgid, signal);
        if let Some(cgroup) = &self.cgroup {
            cgroup.signal_all(signal);
        }
    }

    /// True while any process is in the cgroup or, without one, a live process is in the
    /// group. (Every member of the group descends from the task's first process, so it is in
    /// the cgroup too; the cgroup is the cheaper check, no scan of `/proc`.)
    fn alive(&self) -> bool {
        match &self.cgroup {
            Some(cgroup) => !cgroup.is_empty(),
            None => self.pgid > 1 && group_has_live_members(self.pgid),
        }
    }

    /// Once everything is gone: reads whether the memory limit killed the task, then removes
    /// the cgroup (off the async threads: the crate retries with short sleeps).
    async fn finish(self, outcome: ExitOutcome) -> ExitOutcome {
        let Some(cgroup) = self.cgroup else {
            return outcome;
        };
        let result = tokio::task::spawn_blocking(move || {
            let oom = cgroup.hit_memory_limit(&outcome);
            if let Err(e) = cgroup.remove() {
                tracing::warn!(cgroup = %cgroup.path(), "{e}");
            }
            if oom {
                ExitOutcome::MemoryLimit(Box::new(outcome))
            } else {
                outcome
            }
        })
        .await;
        result.unwrap_or_else(|e| ExitOutcome::WaitFailed(format!("cgroup cleanup failed: {e}")))
    }
}

/// Takes over a task started by an earlier run of the agent (the process is not our child):
/// `pid` is its group leader, trusted only while its start time (from `/proc`) is
/// `start_ticks`, so a reused pid is never signalled. Its end is found by polling, its exit
/// status read from the sandbox's [`EXIT_STATUS_FILE`]; `(tag, outcome)` is sent on `exits`
/// once the group is gone. With `cgroup` (the task's cgroup, re-attached after the restart),
/// kill and the end of the task work as for [`launch`]. Must be called within a runtime.
#[allow(clippy::too_many_arguments)]
pub fn adopt<T: Send + 'static>(
    pid: u32,
    start_ticks: u64,
    sandbox: PathBuf,
    cgroup: Option<Arc<TaskCgroup>>,
    kill_grace: Duration,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) -> ProcessHandle {
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    tokio::spawn(watch_adopted(
        pid,
        start_ticks,
        sandbox,
        cgroup,
        kill_grace,
        kill_rx,
        tag,
        exits,
    ));
    ProcessHandle {
        pid,
        kill: kill_tx,
        gate: None,
    }
}

#[allow(clippy::too_many_arguments)]
async fn watch_adopted<T>(
    pid: u32,
    start_ticks: u64,
    sandbox: PathBuf,
    cgroup: Option<Arc<TaskCgroup>>,
    grace: Duration,
    mut kill_rx: mpsc::UnboundedReceiver<Option<Duration>>,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) {
    let ours = || process_start_ticks(pid) == Some(start_ticks) && process_is_alive(pid);
    let mut poll = tokio::time::interval(ADOPTED_POLL);
    let mut kill_deadline: Option<Instant> = None;
    let mut sigkilled = false;
    // The group is only ours while the leader is; the cgroup is ours regardless.
    let tree = Tree { pgid: pid, cgroup };
    while ours() {
        tokio::select! {
            _ = poll.tick() => {}
            Some(limit) = kill_rx.recv(), if !sigkilled => {
                kill_deadline = Some(next_deadline(&tree, kill_deadline, grace, limit));
            }
            _ = sleep_until_opt(kill_deadline), if !sigkilled && kill_deadline.is_some() => {
                tree.signal(libc::SIGKILL);
                sigkilled = true;
            }
        }
    }
    // The leader is gone. Whatever is left in its group goes with it, unless the pid now
    // belongs to another process (then the group, which held the pid, is gone too).
    let reused = process_start_ticks(pid).is_some_and(|t| t != start_ticks);
    let tree = Tree {
        pgid: if reused { 0 } else { pid },
        ..tree
    };
    if tree.alive() {
        tree.signal(libc::SIGKILL);
        drain(&tree, Instant::now() + grace).await;
    }
    let outcome = tree.finish(recorded_outcome(&sandbox)).await;
    let _ = exits.send((tag, outcome));
}

/// How the task ended, from the exit status its wrapper wrote in the sandbox.
pub fn recorded_outcome(sandbox: &Path) -> ExitOutcome {
    let path = sandbox.join(EXIT_STATUS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim() == NOT_STARTED_MARK => ExitOutcome::NotStarted,
        Ok(text) => match text.trim().parse::<i32>() {
            Ok(code) if (129..193).contains(&code) => ExitOutcome::Signal(code - 128),
            Ok(code) => ExitOutcome::Code(code),
            Err(_) => ExitOutcome::WaitFailed(format!(
                "{} holds {:?}, not an exit status",
                path.display(),
                text.trim()
            )),
        },
        Err(_) => ExitOutcome::WaitFailed(
            "the task ended while the agent was not running it and left no exit status \
             (killed with its wrapper?)"
                .into(),
        ),
    }
}

/// The start time of a process (clock ticks since boot, `/proc/PID/stat` field 22): with the
/// pid, it identifies one process even when pids are reused.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields after the comm start at field 3 (state); starttime is field 22.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Makes the sandbox and its output files the task user's, and the sandbox 0700 so other
/// tasks (other users) cannot read it.
fn hand_sandbox_to(sandbox: &Path, user: &TaskUser) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for path in [
        sandbox.to_path_buf(),
        sandbox.join("stdout"),
        sandbox.join("stderr"),
    ] {
        std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
    }
    std::fs::set_permissions(sandbox, std::fs::Permissions::from_mode(0o700))
}

fn create_output(sandbox: &Path, name: &str) -> Result<File, LaunchError> {
    let path = sandbox.join(name);
    File::create(&path).map_err(|source| LaunchError::OutputFile { path, source })
}

async fn watch<T>(
    mut child: Child,
    tree: Tree,
    grace: Duration,
    mut kill_rx: mpsc::UnboundedReceiver<Option<Duration>>,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) {
    let mut kill_deadline: Option<Instant> = None;
    let mut sigkilled = false;
    let outcome = loop {
        tokio::select! {
            status = child.wait() => {
                break match status {
                    Ok(status) => ExitOutcome::from_status(status),
                    Err(e) => ExitOutcome::WaitFailed(e.to_string()),
                };
            }
            Some(limit) = kill_rx.recv(), if !sigkilled => {
                kill_deadline = Some(next_deadline(&tree, kill_deadline, grace, limit));
            }
            _ = sleep_until_opt(kill_deadline), if !sigkilled => {
                tree.signal(libc::SIGKILL);
                sigkilled = true;
            }
        }
    };
    match kill_deadline {
        // Killed: the rest of the tree got SIGTERM too; give it the rest of the grace.
        Some(deadline) if !sigkilled => drain(&tree, deadline).await,
        Some(_) => drain(&tree, Instant::now()).await,
        // Ended on its own: whatever it left behind goes with it.
        None => {
            if tree.alive() {
                tree.signal(libc::SIGKILL);
                drain(&tree, Instant::now() + grace).await;
            }
        }
    }
    let outcome = tree.finish(outcome).await;
    let _ = exits.send((tag, outcome));
}

/// A kill request arrived: the first one sends SIGTERM; the SIGKILL deadline is the grace (at
/// most `limit`) from now, or an earlier deadline already set.
fn next_deadline(
    tree: &Tree,
    current: Option<Instant>,
    grace: Duration,
    limit: Option<Duration>,
) -> Instant {
    let grace = limit.map_or(grace, |limit| limit.min(grace));
    let deadline = Instant::now() + grace;
    match current {
        Some(current) => current.min(deadline),
        None => {
            tree.signal(libc::SIGTERM);
            deadline
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Waits until no live process is left in the group and the cgroup is empty, SIGKILLing
/// everything at `deadline`.
async fn drain(tree: &Tree, deadline: Instant) {
    let mut killed = false;
    while tree.alive() {
        if Instant::now() >= deadline {
            if killed {
                // Give processes stuck in the kernel (D state) a little longer before giving
                // up on them; SIGKILL is resent meanwhile.
                if Instant::now() >= deadline + GIVE_UP_AFTER_SIGKILL {
                    tracing::warn!(
                        pgid = tree.pgid,
                        "processes survive SIGKILL; giving up on them"
                    );
                    return;
                }
            }
            tree.signal(libc::SIGKILL);
            killed = true;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

/// Sends a signal to a whole process group; a group that is already gone is fine.
pub fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return; // never signal "every process" or init
    }
    // SAFETY: killpg has no memory-safety preconditions.
    let rc = unsafe { libc::killpg(pgid, signal) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, signal, "killpg failed: {err}");
        }
    }
}

/// True when some process of the group is alive (zombies do not count: in a container the
/// orphaned children of a task may never be reaped by pid 1).
pub fn group_has_live_members(pgid: u32) -> bool {
    match std::fs::read_dir("/proc") {
        Ok(entries) => entries.flatten().any(|entry| {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
                return false;
            };
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Ok(stat) => matches!(parse_stat(&stat), Some((state, group)) if group == pgid && state != 'Z' && state != 'X'),
                Err(_) => false,
            }
        }),
        Err(_) => {
            let Ok(pgid) = libc::pid_t::try_from(pgid) else {
                return false;
            };
            // SAFETY: signal 0 only checks for existence.
            unsafe { libc::killpg(pgid, 0) == 0 }
        }
    }
}

/// True when the process exists and is not a zombie.
pub fn process_is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => matches!(parse_stat(&stat), Some((state, _)) if state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// (state, process group) from `/proc/PID/stat`: `pid (comm) S ppid pgrp ...`; comm may
/// contain spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// `SIGTERM`, `SIGSEGV`, ... for messages; `signal N` for the rest.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::timeout;

    const WAIT: Duration = Duration::from_secs(20);

    fn spec(dir: &Path, command: &str) -> LaunchSpec {
        LaunchSpec {
            command: command.to_string(),
            sandbox: dir.join("box"),
            env: vec![("GREETING".into(), "hello there".into())],
            kill_grace: Duration::from_millis(500),
            user: None,
            cgroup: None,
        }
    }

    async fn run_to_end(spec: &LaunchSpec) -> ExitOutcome {
        let (tx, mut rx) = mpsc::unbounded_channel();
        launch(spec, 7u32, tx).unwrap();
        let (tag, outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(tag, 7);
        outcome
    }

    /// A gated task runs its command only once started; when the handle goes without starting
    /// it (the agent stopped first), the wrapper records that it never ran, exits 125 and the
    /// command never ran. The command writes a file; the task's fd 3 (the gate) is closed for the command.
    #[tokio::test]
    async fn a_gated_task_runs_only_once_started() {
        let dir = tempfile::tempdir().unwrap();
        let command = "touch ran; if true >&3; then echo fd3-open; fi 2>/dev/null";
        let (tx, mut rx) = mpsc::unbounded_channel();
        let never = spec(dir.path(), command);
        drop(launch_gated(&never, 1u32, tx.clone()).unwrap());
        let (_, outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Code(125));
        assert!(!never.sandbox.join("ran").exists(), "ran without the gate");
        // An agent that restarts and adopts it learns from the sandbox that it never ran.
        assert_eq!(recorded_outcome(&never.sandbox), ExitOutcome::NotStarted);

        let started = LaunchSpec {
            sandbox: dir.path().join("started"),
            ..spec(dir.path(), command)
        };
        let mut handle = launch_gated(&started, 2u32, tx).unwrap();
        assert!(!started.sandbox.join("ran").exists());
        handle.start();
        handle.start();
        let (_, outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Code(0));
        assert!(started.sandbox.join("ran").exists());
        let stdout = std::fs::read_to_string(started.sandbox.join("stdout")).unwrap();
        assert_eq!(stdout, "", "the gate leaked into the command");
    }

    #[tokio::test]
    async fn runs_in_the_sandbox_with_env_and_output_files() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), "echo \"$GREETING\" from $(pwd); echo oops >&2");
        assert_eq!(run_to_end(&spec).await, ExitOutcome::Code(0));
        let stdout = std::fs::read_to_string(spec.sandbox.join("stdout")).unwrap();
        let sandbox = spec.sandbox.canonicalize().unwrap();
        assert_eq!(stdout, format!("hello there from {}\n", sandbox.display()));
        let stderr = std::fs::read_to_string(spec.sandbox.join("stderr")).unwrap();
        assert_eq!(stderr, "oops\n");
    }

    #[tokio::test]
    async fn a_task_sees_its_own_environment_not_the_agents() {
        // Cargo runs tests with variables of its own (CARGO_MANIFEST_DIR, ...): the agent's
        // environment beyond what tasks may inherit.
        let (leak, _) = std::env::vars()
            .find(|(k, _)| !INHERITED_ENV.contains(&k.as_str()) && k != "GREETING")
            .expect("the test process has variables a task must not see");
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), "env");
        assert_eq!(run_to_end(&spec).await, ExitOutcome::Code(0));
        let stdout = std::fs::read_to_string(spec.sandbox.join("stdout")).unwrap();
        let names: Vec<&str> = stdout.lines().filter_map(|l| l.split('=').next()).collect();
        assert!(!names.contains(&leak.as_str()), "{leak} leaked: {stdout}");
        assert!(
            names.contains(&"GREETING") && names.contains(&"PATH"),
            "{stdout}"
        );
    }

    #[tokio::test]
    async fn reports_exit_codes_and_signals() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            run_to_end(&spec(dir.path(), "exit 3")).await,
            ExitOutcome::Code(3)
        );
        assert_eq!(
            run_to_end(&spec(dir.path(), "kill -SEGV $$")).await,
            ExitOutcome::Signal(libc::SIGSEGV)
        );
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(200), "signal 200");
    }

    #[tokio::test]
    async fn an_adopted_pid_with_another_start_time_is_never_signalled() {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::process::CommandExt as _;
        let mut other = std::process::Command::new("sleep")
            .arg("100")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = other.id();
        let real = process_start_ticks(pid).expect("a live process has a start time");
        let (tx, mut rx) = mpsc::unbounded_channel();
        // As if the task's pid had been reused by `other`.
        let handle = adopt(pid, real + 1, dir.path().to_path_buf(), None, WAIT, (), tx);
        handle.kill();
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert!(matches!(outcome, ExitOutcome::WaitFailed(_)), "{outcome:?}");
        assert!(process_is_alive(pid), "a reused pid was signalled");
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[tokio::test]
    async fn the_wrapper_records_exit_codes_and_signals_in_the_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path(), "exit 5");
        assert_eq!(run_to_end(&s).await, ExitOutcome::Code(5));
        assert_eq!(recorded_outcome(&s.sandbox), ExitOutcome::Code(5));
        let s = spec(dir.path(), "kill -USR1 $$");
        assert_eq!(run_to_end(&s).await, ExitOutcome::Signal(libc::SIGUSR1));
        assert_eq!(
            recorded_outcome(&s.sandbox),
            ExitOutcome::Signal(libc::SIGUSR1)
        );
        std::fs::remove_file(s.sandbox.join(EXIT_STATUS_FILE)).unwrap();
        assert!(matches!(
            recorded_outcome(&s.sandbox),
            ExitOutcome::WaitFailed(_)
        ));
    }

    #[tokio::test]
    async fn kill_ends_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), "sleep 100 & echo $! > bg.pid; sleep 100");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let handle = launch(&spec, (), tx).unwrap();
        let pid_file = spec.sandbox.join("bg.pid");
        let background: u32 = timeout(WAIT, async {
            loop {
                if let Some(pid) = std::fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                {
                    break pid;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        assert!(process_is_alive(background));
        assert!(group_has_live_members(handle.pid()));
        handle.kill();
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Signal(libc::SIGTERM));
        assert!(!process_is_alive(background), "background child survived");
        assert!(!group_has_live_members(handle.pid()));
    }

    /// Launches a task that ignores SIGTERM (with `grace`) and waits until it says so.
    async fn launch_term_ignorer(
        dir: &Path,
        grace: Duration,
    ) -> (
        LaunchSpec,
        ProcessHandle,
        mpsc::UnboundedReceiver<((), ExitOutcome)>,
    ) {
        let mut spec = spec(
            dir,
            "trap '' TERM; echo ready > ready; while :; do sleep 0.05; done",
        );
        spec.kill_grace = grace;
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = launch(&spec, (), tx).unwrap();
        let ready = spec.sandbox.join("ready");
        timeout(WAIT, async {
            while !ready.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        (spec, handle, rx)
    }

    #[tokio::test]
    async fn sigterm_ignorers_get_sigkill_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, handle, mut rx) =
            launch_term_ignorer(dir.path(), Duration::from_millis(500)).await;
        let started = std::time::Instant::now();
        handle.kill();
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Signal(libc::SIGKILL));
        assert!(started.elapsed() >= spec.kill_grace);
        assert!(!group_has_live_members(handle.pid()));
    }

    #[tokio::test]
    async fn kill_within_shortens_a_long_task_grace() {
        let dir = tempfile::tempdir().unwrap();
        let (_spec, handle, mut rx) =
            launch_term_ignorer(dir.path(), Duration::from_secs(60)).await;
        let started = std::time::Instant::now();
        handle.kill(); // the task's own 60 s grace...
        handle.kill_within(Duration::from_millis(200)); // ... cut short, as at shutdown
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Signal(libc::SIGKILL));
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn leftovers_of_a_finished_task_are_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), "sleep 100 & echo $! > bg.pid; exit 0");
        assert_eq!(run_to_end(&spec).await, ExitOutcome::Code(0));
        let pid: u32 = std::fs::read_to_string(spec.sandbox.join("bg.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!process_is_alive(pid));
    }

    #[tokio::test]
    async fn bad_env_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(dir.path(), "true");
        spec.env.push(("A=B".into(), "x".into()));
        let (tx, _rx) = mpsc::unbounded_channel::<((), ExitOutcome)>();
        let err = launch(&spec, (), tx).unwrap_err();
        assert!(err.to_string().contains("\"A=B\""), "{err}");
    }

    #[test]
    fn parses_proc_stat_with_odd_names() {
        let stat = "1234 (we (ir) d) S 1 1200 1200 0 -1 4194560";
        assert_eq!(parse_stat(stat), Some(('S', 1200)));
    }
}
