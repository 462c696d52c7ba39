//! Running one task as a real process: sandbox, spawn, watch, kill.
//!
//! Each task is `sh -c COMMAND` in its own process group, so a kill reaches everything the
//! command started (pipelines, background jobs), not just the shell. With cgroups
//! ([`crate::isolation`]) the task also runs in its own cgroup, joined before the command is
//! exec'd, and a kill reaches every process in it, also those that left the process group
//! (`setsid`). The task is started by its supervisor ([`crate::supervisor`]), which waits for
//! it and records how it ended in the agent's own directory. A watcher (one tokio task per
//! task) waits for the supervisor; it reports the recorded exit on a channel only once the
//! whole group (and cgroup) is empty, so "task ended" also means "its processes are gone"; it
//! then removes the cgroup. Nothing here knows about the master, which keeps this part
//! testable on its own.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::exit_outcome::ExitOutcome;
use crate::isolation::TaskCgroup;
use crate::supervisor::{self, Recorded};
use crate::users::TaskUser;

/// How often a killed group is checked for survivors during the grace period.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How often a task adopted after an agent restart (not our child) is checked for its end.
const ADOPTED_POLL: Duration = Duration::from_millis(100);
/// How long after the SIGKILL deadline survivors are waited for before they are given up on.
const GIVE_UP_AFTER_SIGKILL: Duration = Duration::from_secs(5);

/// Everything needed to start one task.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub command: String,
    /// The task's run directory: exists, empty, owned by the task's user ([`crate::sandbox`]).
    /// The task creates its `stdout` and `stderr` there.
    pub sandbox: PathBuf,
    /// The task's meta directory (the agent's own, [`crate::task_files`]), where its
    /// supervisor records how it ended.
    pub meta_dir: PathBuf,
    /// Environment added to the agent's own.
    pub env: Vec<(String, String)>,
    /// SIGTERM-to-SIGKILL grace when the task is killed.
    pub kill_grace: Duration,
    /// The user to run as (`None`: the agent's own); the process gets the user's uid, gid and
    /// supplementary groups.
    pub user: Option<TaskUser>,
    /// The task's cgroup (`None`: no cgroup isolation). The process joins it before exec; the
    /// watcher removes it once it is empty.
    pub cgroup: Option<Arc<TaskCgroup>>,
}

/// How the task whose meta directory is `meta_dir` ended, from its supervisor's record.
pub fn recorded_outcome(meta_dir: &Path) -> ExitOutcome {
    match supervisor::recorded(meta_dir) {
        Some(Recorded::Exit(code)) => ExitOutcome::Code(code),
        Some(Recorded::Signal(signal)) => ExitOutcome::Signal(signal),
        Some(Recorded::NotStarted) => ExitOutcome::NotStarted,
        None => ExitOutcome::WaitFailed(
            "the task's supervisor ended without recording its exit status (killed?)".into(),
        ),
    }
}

/// A handle on a running task's process group.
#[derive(Debug)]
pub struct ProcessHandle {
    pid: u32,
    /// The task's supervisor ([`crate::supervisor`]).
    supervisor: u32,
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

    /// The pid of the task's supervisor, which waits for it and records how it ended.
    pub fn supervisor_pid(&self) -> u32 {
        self.supervisor
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
    #[error("invalid environment variable name {name:?}")]
    BadEnv { name: String },
    #[error("{0}")]
    Spawn(#[from] supervisor::SpawnError),
}

/// The agent's own variables a task (and its health checks) inherits; everything else of the
/// agent's environment (credentials of the operator's shell, `RINGMASTER_*` settings of the
/// agent) stays out of tasks, as Mesos and Kubernetes start containers from their spec alone.
const INHERITED_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ"];
/// `PATH` when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Clears `command`'s environment down to `PATH`, `LANG`, `LC_ALL` and `TZ` of the agent's, then sets `env`
/// (the task's: what the agent sets, the framework's, the devices').
pub fn set_environment(command: &mut Command, env: &[(String, String)]) {
    command.env_clear();
    command.envs(environment(env));
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

/// As [`launch`], but the task's command does not run until [`ProcessHandle::start`]: it waits
/// at a gate whose write end only the handle holds. If the agent dies before starting it, the
/// gate closes and the supervisor records that the command never ran. So the agent can record
/// the pids first and then start the task: a task that ran is always one whose pid the agent
/// recorded (and adopts after a restart), never one it would take for "never ran" (found by
/// tests/ha_history.rs: a short task killed the agent's record race, ran, and was reported
/// LOST).
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
    let env = environment(&spec.env);
    let started = supervisor::spawn(&supervisor::Spec {
        command: &spec.command,
        env: &env,
        run_dir: &spec.sandbox,
        meta_dir: &spec.meta_dir,
        user: spec.user.as_ref(),
        cgroup: spec.cgroup.as_deref(),
    })?;
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let tree = Tree {
        pgid: started.task,
        leader_ticks: process_start_ticks(started.task).unwrap_or(0),
        cgroup: spec.cgroup.clone(),
    };
    let waiter = Waiter::child(started.supervisor);
    tokio::spawn(watch(
        waiter,
        tree,
        spec.meta_dir.clone(),
        spec.kill_grace,
        kill_rx,
        tag,
        exits,
    ));
    Ok(ProcessHandle {
        pid: started.task,
        supervisor: started.supervisor,
        kill: kill_tx,
        gate: Some(started.gate),
    })
}

/// [`INHERITED_ENV`] of the agent's environment, then `env`, as one list (later names win).
fn environment(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = Vec::new();
    for name in INHERITED_ENV {
        match std::env::var(name) {
            Ok(value) => all.push((name.to_string(), value)),
            Err(_) if *name == "PATH" => all.push((name.to_string(), DEFAULT_PATH.to_string())),
            Err(_) => {}
        }
    }
    for (k, v) in env {
        all.retain(|(name, _)| name != k);
        all.push((k.clone(), v.clone()));
    }
    all
}

/// Waits for a task's supervisor to end: a pidfd where the kernel has them (5.3+), else
/// polling. A supervisor the agent started is its child and is reaped; one adopted after a
/// restart is identified by its start time, so a reused pid is never taken for it.
struct Waiter {
    pid: u32,
    /// `None`: our own child; `Some`: adopted, with its start time.
    start_ticks: Option<u64>,
    fd: Option<AsyncFd<OwnedFd>>,
}

/// A pidfd registered with the runtime's reactor.
fn register(fd: Option<OwnedFd>) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: the descriptor is owned by the AsyncFd from here on, so nothing else closes or
    // reuses it while it is registered.
    fd.and_then(|fd| unsafe { AsyncFd::register(fd) }.ok())
}

impl Waiter {
    fn child(pid: u32) -> Self {
        let fd = register(supervisor::pidfd(pid));
        Waiter {
            pid,
            start_ticks: None,
            fd,
        }
    }

    fn adopted(pid: u32, start_ticks: u64) -> Self {
        // Opened first, checked second: the pidfd then names the process that was checked.
        let fd = register(supervisor::pidfd(pid));
        Waiter {
            pid,
            start_ticks: Some(start_ticks),
            fd,
        }
    }

    /// True once the supervisor is gone (reaped, when it is our child).
    fn gone(&self) -> bool {
        match self.start_ticks {
            None => {
                let mut status = 0;
                // SAFETY: waiting for our own child without blocking.
                let r =
                    unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, libc::WNOHANG) };
                r != 0
            }
            Some(ticks) => {
                process_start_ticks(self.pid) != Some(ticks) || !process_is_alive(self.pid)
            }
        }
    }

    async fn exited(&self) {
        if self.gone() {
            return;
        }
        if let Some(fd) = &self.fd {
            while let Ok(mut guard) = fd.readable().await {
                if self.gone() {
                    return;
                }
                guard.clear_ready();
            }
        }
        while !self.gone() {
            tokio::time::sleep(ADOPTED_POLL).await;
        }
    }
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
    /// The group leader's start time (to tell it from a process that reused its pid).
    leader_ticks: u64,
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

/// A task started by an earlier run of the agent, as its record names it.
#[derive(Debug, Clone)]
pub struct Adoptee {
    /// Its supervisor and the supervisor's start time.
    pub supervisor: u32,
    pub supervisor_ticks: u64,
    /// The task's pid (its process group) and its start time.
    pub task: u32,
    pub task_ticks: u64,
    pub meta_dir: PathBuf,
}

/// Takes over a task started by an earlier run of the agent (its supervisor is no longer our
/// child). The supervisor is trusted only while its start time (from `/proc`) is the recorded
/// one, so a reused pid is never taken for it; while it lives, the task's pid is not reused
/// either (the supervisor has not reaped it), so the task's group may be signalled. Once the
/// supervisor is gone, the task's end is read from its record in the meta directory and
/// `(tag, outcome)` is sent on `exits`. With `cgroup` (the task's cgroup, re-attached after
/// the restart), kill and the end of the task work as for [`launch`]. Must be called within a
/// runtime.
pub fn adopt<T: Send + 'static>(
    adoptee: Adoptee,
    cgroup: Option<Arc<TaskCgroup>>,
    kill_grace: Duration,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) -> ProcessHandle {
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let waiter = Waiter::adopted(adoptee.supervisor, adoptee.supervisor_ticks);
    let tree = Tree {
        pgid: adoptee.task,
        leader_ticks: adoptee.task_ticks,
        cgroup,
    };
    tokio::spawn(watch(
        waiter,
        tree,
        adoptee.meta_dir,
        kill_grace,
        kill_rx,
        tag,
        exits,
    ));
    ProcessHandle {
        pid: adoptee.task,
        supervisor: adoptee.supervisor,
        kill: kill_tx,
        gate: None,
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

/// Watches one task: waits for its supervisor to end (which it does once the task's main
/// process ended), serving kill requests meanwhile; then ends whatever is left of the task's
/// group and cgroup, and reports the outcome its supervisor recorded.
async fn watch<T>(
    waiter: Waiter,
    tree: Tree,
    meta_dir: PathBuf,
    grace: Duration,
    mut kill_rx: mpsc::UnboundedReceiver<Option<Duration>>,
    tag: T,
    exits: mpsc::UnboundedSender<(T, ExitOutcome)>,
) {
    let mut kill_deadline: Option<Instant> = None;
    let mut sigkilled = false;
    {
        let exited = waiter.exited();
        tokio::pin!(exited);
        loop {
            tokio::select! {
                biased;
                () = &mut exited => break,
                Some(limit) = kill_rx.recv(), if !sigkilled => {
                    kill_deadline = Some(next_deadline(&tree, kill_deadline, grace, limit));
                }
                _ = sleep_until_opt(kill_deadline), if !sigkilled && kill_deadline.is_some() => {
                    tree.signal(libc::SIGKILL);
                    sigkilled = true;
                }
            }
        }
    }
    let outcome = recorded_outcome(&meta_dir);
    // The supervisor reaped the task's leader: its pid may have been reused since, and then
    // its old group is gone (a group keeps its number taken while it has members).
    let reused = process_start_ticks(tree.pgid).is_some_and(|t| t != tree.leader_ticks);
    let tree = Tree {
        pgid: if reused { 0 } else { tree.pgid },
        ..tree
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

    /// A spec with a fresh run directory and meta directory under `dir`.
    fn spec(dir: &Path, command: &str) -> LaunchSpec {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sandbox = dir.join(format!("box{n}"));
        let meta_dir = dir.join(format!("meta{n}"));
        std::fs::create_dir(&sandbox).unwrap();
        std::fs::create_dir(&meta_dir).unwrap();
        LaunchSpec {
            command: command.to_string(),
            sandbox,
            meta_dir,
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
        assert_eq!(outcome, ExitOutcome::NotStarted);
        assert!(!never.sandbox.join("ran").exists(), "ran without the gate");
        // An agent that restarts and adopts it learns from its record that it never ran.
        assert_eq!(recorded_outcome(&never.meta_dir), ExitOutcome::NotStarted);

        let started = spec(dir.path(), command);
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
        let adoptee = Adoptee {
            supervisor: pid,
            supervisor_ticks: real + 1,
            task: pid,
            task_ticks: real + 1,
            meta_dir: dir.path().to_path_buf(),
        };
        let handle = adopt(adoptee, None, WAIT, (), tx);
        handle.kill();
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert!(matches!(outcome, ExitOutcome::WaitFailed(_)), "{outcome:?}");
        assert!(process_is_alive(pid), "a reused pid was signalled");
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[tokio::test]
    async fn the_supervisor_records_exit_codes_and_signals_in_the_meta_dir() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path(), "exit 5");
        assert_eq!(run_to_end(&s).await, ExitOutcome::Code(5));
        assert_eq!(recorded_outcome(&s.meta_dir), ExitOutcome::Code(5));
        let s = spec(dir.path(), "kill -USR1 $$");
        assert_eq!(run_to_end(&s).await, ExitOutcome::Signal(libc::SIGUSR1));
        assert_eq!(
            recorded_outcome(&s.meta_dir),
            ExitOutcome::Signal(libc::SIGUSR1)
        );
        std::fs::remove_file(s.meta_dir.join(supervisor::EXIT_FILE)).unwrap();
        assert!(matches!(
            recorded_outcome(&s.meta_dir),
            ExitOutcome::WaitFailed(_)
        ));
    }

    /// What a task writes in its sandbox is never its result: a forged exit record there
    /// changes nothing, and the supervisor's record is out of the task's reach.
    #[tokio::test]
    async fn a_task_cannot_forge_its_result() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(
            dir.path(),
            "echo 0 > .ringmaster-exit; echo 'exit 0' > exit; ln -s ../x exit.tmp; exit 7",
        );
        assert_eq!(run_to_end(&s).await, ExitOutcome::Code(7));
        assert_eq!(recorded_outcome(&s.meta_dir), ExitOutcome::Code(7));
    }

    /// A task that is adopted after an agent restart (its supervisor no longer our child)
    /// still reports what it really did.
    #[tokio::test]
    async fn an_adopted_task_reports_its_recorded_exit() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path(), "read x < go; exit 4");
        // A FIFO the test opens to let the task end when it wants.
        let fifo =
            std::ffi::CString::new(s.sandbox.join("go").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let (tx, _rx) = mpsc::unbounded_channel();
        let handle = launch(&s, (), tx).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let adoptee = Adoptee {
            supervisor: handle.supervisor_pid(),
            supervisor_ticks: process_start_ticks(handle.supervisor_pid()).unwrap(),
            task: handle.pid(),
            task_ticks: process_start_ticks(handle.pid()).unwrap(),
            meta_dir: s.meta_dir.clone(),
        };
        let _adopted = adopt(adoptee, None, WAIT, (), tx);
        std::fs::write(s.sandbox.join("go"), "\n").unwrap();
        let ((), outcome) = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        assert_eq!(outcome, ExitOutcome::Code(4));
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
