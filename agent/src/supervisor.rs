//! The per-task supervisor: a small root process that starts a task, waits for it and records
//! how it ended in the agent's own directory, where nothing the task can write reaches.
//!
//! Mesos has its executor and containerd its shim for this; ours is a `fork` of the agent that
//! never `exec`s. The agent forks the supervisor (`S`), which leaves the agent's session
//! (`setsid`), ignores the signals a terminal or a stopping agent sends, and forks the task
//! (`T`). `T` makes itself a process group, joins its cgroup, takes the task's user, moves into
//! its run directory and creates its `stdout` and `stderr` there as that user, then waits at the
//! launch gate. The agent learns `T`'s pid from `S` and that `T` is ready (or why it is not),
//! records both pids, and only then opens the gate: a task whose command ran is always one the
//! agent recorded. `S` waits for `T` and writes `exit N`, `signal N` or `not-started` (the gate
//! closed without opening: the agent died first) to `exit` in the task's meta directory
//! (`<work_dir>/meta/…`, root's, 0700), then exits. `S` outlives the agent: a restarted agent
//! finds `S` by pid and start time, waits for it, and reads the same record.
//!
//! Between `fork` and `exec` (and for the whole life of `S`, which never `exec`s) the agent is a
//! multi-threaded process: only async-signal-safe system calls are made there, on data
//! prepared before the fork. Nothing allocates.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Duration;

use crate::isolation::TaskCgroup;
use crate::users::TaskUser;

/// The file in a task's meta directory where its supervisor records how the task ended.
pub const EXIT_FILE: &str = "exit";
/// What the supervisor records when the gate closed without opening (the command never ran).
pub const NOT_STARTED: &str = "not-started";
/// The shell every task runs under, `sh -c COMMAND`.
const SHELL: &std::ffi::CStr = c"/bin/sh";
/// How long the agent waits for the supervisor to report the task's pid and readiness.
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

// The supervisor's descriptors after it has moved them (see `Child::supervise`).
const FD_GATE: RawFd = 3;
const FD_REPORT: RawFd = 4;
const FD_META: RawFd = 5;
const FD_NULL: RawFd = 6;
const FD_RUN: RawFd = 7;
/// The first descriptor past the fixed ones: everything from here up is closed in `S`.
const FD_FIRST_FREE: RawFd = 8;

/// What one task needs to start.
pub struct Spec<'a> {
    pub command: &'a str,
    /// The complete environment of the command.
    pub env: &'a [(String, String)],
    /// The task's run directory (exists, owned by the task's user, empty).
    pub run_dir: &'a Path,
    /// The task's meta directory (exists, the agent's, 0700).
    pub meta_dir: &'a Path,
    /// The user to switch to (only when the agent is root).
    pub user: Option<&'a TaskUser>,
    pub cgroup: Option<&'a TaskCgroup>,
}

/// A task started under its supervisor, waiting at its gate.
#[derive(Debug)]
pub struct Started {
    /// The supervisor's pid.
    pub supervisor: u32,
    /// The task's pid, which is also its process group.
    pub task: u32,
    /// The write end of the gate; writing `go` lets the command run, dropping it cancels it.
    pub gate: File,
}

/// Why a task could not be started; the agent reports it as `launch_failed`.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("the command or the environment holds a NUL byte")]
    Nul,
    #[error("cannot open {what}: {source}")]
    Open { what: String, source: io::Error },
    #[error("cannot start the supervisor: {0}")]
    Fork(io::Error),
    #[error("cannot start the task: {stage}: {source}")]
    Task {
        stage: &'static str,
        source: io::Error,
    },
    #[error("the supervisor did not report the task ({0})")]
    Report(String),
}

fn cstring(bytes: impl Into<Vec<u8>>) -> Result<CString, SpawnError> {
    CString::new(bytes).map_err(|_| SpawnError::Nul)
}

fn open_dir(path: &Path, what: &str) -> Result<OwnedFd, SpawnError> {
    let c = cstring(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(SpawnError::Open {
            what: format!("{what} {}", path.display()),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: a descriptor just opened that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::Fork(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded: both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Everything the two forked processes use, prepared before the fork.
struct Child<'a> {
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    procs_files: &'a [CString],
    ids: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    /// Source descriptors, in the order of `FD_GATE`..`FD_RUN`.
    fds: [RawFd; 5],
}

/// Starts `spec`'s task under a supervisor, gated. Blocks for as long as the fork and the
/// task's setup take (bounded by ten seconds).
pub fn spawn(spec: &Spec<'_>) -> Result<Started, SpawnError> {
    let argv_c = [
        cstring("sh")?,
        cstring("-c")?,
        cstring(spec.command.as_bytes())?,
    ];
    let envp_c = spec
        .env
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let argv: Vec<*const libc::c_char> = argv_c
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const libc::c_char> = envp_c
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let procs_files: Vec<CString> = spec
        .cgroup
        .map(|c| c.procs_files().to_vec())
        .unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ids = spec
        .user
        .filter(|_| root)
        .map(|u| (u.uid, u.gid, u.groups.as_slice()));
    let null = {
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(SpawnError::Open {
                what: "/dev/null".into(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a descriptor just opened that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let run = open_dir(spec.run_dir, "run directory")?;
    let meta = open_dir(spec.meta_dir, "meta directory")?;
    let (gate_read, gate_write) = pipe()?;
    let (report_read, report_write) = pipe()?;
    let child = Child {
        argv: &argv,
        envp: &envp,
        procs_files: &procs_files,
        ids,
        fds: [
            gate_read.as_raw_fd(),
            report_write.as_raw_fd(),
            meta.as_raw_fd(),
            null.as_raw_fd(),
            run.as_raw_fd(),
        ],
    };
    // SAFETY: the child only runs `Child::supervise`, which makes async-signal-safe calls on
    // data prepared above and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnError::Fork(io::Error::last_os_error()));
    }
    if pid == 0 {
        child.supervise();
    }
    let supervisor = pid as u32;
    drop((gate_read, report_write, meta, run, null));
    let gate = File::from(gate_write);
    match read_report(report_read) {
        Ok(task) => Ok(Started {
            supervisor,
            task,
            gate,
        }),
        Err(e) => {
            // The supervisor sees the gate close, kills what it started and exits: reap it.
            drop(gate);
            reap_blocking(supervisor);
            Err(e)
        }
    }
}

/// Reads the supervisor's report: `P<pid>` (the task's pid) and `R` (ready at the gate) in any
/// order, or `E<stage>:<errno>` from a task whose setup failed.
fn read_report(fd: OwnedFd) -> Result<u32, SpawnError> {
    let deadline = std::time::Instant::now() + REPORT_TIMEOUT;
    let mut file = File::from(fd);
    let mut text = Vec::new();
    let mut buf = [0u8; 128];
    let (mut pid, mut ready) = (None, false);
    loop {
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match line[0] {
                b'P' => {
                    pid = std::str::from_utf8(&line[1..])
                        .ok()
                        .and_then(|s| s.parse().ok())
                }
                b'R' => ready = true,
                b'E' => {
                    let line = String::from_utf8_lossy(&line[1..]).into_owned();
                    let (stage, errno) = line.split_once(':').unwrap_or((&line, "0"));
                    let stage = match stage {
                        "cgroup" => "join the cgroup",
                        "user" => "switch to the task's user",
                        "chdir" => "enter the run directory",
                        "stdout" => "create stdout",
                        "stderr" => "create stderr",
                        "fork" => "fork",
                        _ => "set up",
                    };
                    return Err(SpawnError::Task {
                        stage,
                        source: io::Error::from_raw_os_error(errno.parse().unwrap_or(0)),
                    });
                }
                _ => {}
            }
        }
        if let (Some(pid), true) = (pid, ready) {
            return Ok(pid);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(SpawnError::Report("timed out".into()));
        }
        let mut poll = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(SpawnError::Report(e.to_string()));
        }
        if n == 0 {
            continue;
        }
        match file.read(&mut buf) {
            Ok(0) => return Err(SpawnError::Report("it exited".into())),
            Ok(n) if text.len() < 4096 => {
                text.extend_from_slice(&buf[..n]);
                // Keep only whole lines for the parse above; a partial one waits for the rest.
                if text.last() != Some(&b'\n') {
                    continue;
                }
            }
            Ok(_) => return Err(SpawnError::Report("too much".into())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SpawnError::Report(e.to_string())),
        }
    }
}

/// Waits for a child of ours that is about to exit.
fn reap_blocking(pid: u32) {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child; status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

// ---- after the fork: async-signal-safe only ------------------------------------------------

/// Writes all of `bytes` to `fd`, ignoring errors.
fn put(fd: RawFd, bytes: &[u8]) {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: a valid buffer of the given length.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n <= 0 {
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            return;
        }
        done += n as usize;
    }
}

fn errno() -> i32 {
    // SAFETY: reads the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// `value` in decimal into `buf`, returning the used part.
fn decimal(mut value: u64, buf: &mut [u8; 24]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buf[i..];
        }
    }
}

/// `prefix`, `value`, `suffix` as one line (one `write`, so lines from two processes on one
/// pipe never interleave).
fn line(fd: RawFd, prefix: &[u8], value: Option<i64>, suffix: &[u8]) {
    let mut out = [0u8; 96];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        let n = bytes.len().min(out.len() - len);
        out[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    push(prefix);
    if let Some(v) = value {
        let mut buf = [0u8; 24];
        if v < 0 {
            push(b"-");
        }
        push(decimal(v.unsigned_abs(), &mut buf));
    }
    push(suffix);
    put(fd, &out[..len]);
}

/// Waits at a gate: true when `go` comes through `fd`, false when it closes without it.
fn gate_opened(fd: RawFd) -> bool {
    let mut word = [0u8; 3];
    let mut got = 0;
    while got < word.len() {
        // SAFETY: reads into the rest of a stack buffer of the given length.
        let n = unsafe { libc::read(fd, word[got..].as_mut_ptr().cast(), word.len() - got) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    &word == b"go\n"
}

/// Closes every descriptor from `first` up.
fn close_from(first: RawFd) {
    // SAFETY: close_range only closes descriptors.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) };
    if r != 0 {
        // Kernels before 5.9: close one by one, up to a bound.
        // SAFETY: sysconf and close have no memory-safety preconditions.
        let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(1024, 65536) as RawFd;
        for fd in first..max {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }
}

fn set_signals(action: libc::sighandler_t) {
    for signal in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGPIPE,
    ] {
        // SAFETY: signal is async-signal-safe; the actions are SIG_IGN or SIG_DFL.
        unsafe { libc::signal(signal, action) };
    }
}

impl Child<'_> {
    /// The supervisor's body (in the forked child); never returns.
    fn supervise(&self) -> ! {
        // SAFETY: every call below is async-signal-safe and works on data prepared before the
        // fork or on the stack.
        unsafe {
            libc::setsid();
            // Named for `ps -o comm`, `top` and `pgrep` (its command line stays the agent's).
            libc::prctl(libc::PR_SET_NAME, c"ringmaster-sup".as_ptr());
            set_signals(libc::SIG_IGN);
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            // Move the five descriptors to FD_GATE..FD_RUN: first out of the way (above any
            // of the targets), then into place; then close everything else of the agent's.
            let mut moved = [0 as RawFd; 5];
            for (i, fd) in self.fds.iter().enumerate() {
                moved[i] = libc::fcntl(*fd, libc::F_DUPFD, 64);
                if moved[i] < 0 {
                    libc::_exit(120);
                }
            }
            for (i, fd) in moved.iter().enumerate() {
                if libc::dup2(*fd, FD_GATE + i as RawFd) < 0 {
                    libc::_exit(120);
                }
            }
            close_from(FD_FIRST_FREE);
            for fd in 0..3 {
                libc::dup2(FD_NULL, fd);
            }
            // The task's own gate, opened by the supervisor once the agent's opens.
            let mut go = [0 as libc::c_int; 2];
            if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                line(FD_REPORT, b"Efork:", Some(errno() as i64), b"\n");
                libc::_exit(121);
            }
            let task = libc::fork();
            if task < 0 {
                line(FD_REPORT, b"Efork:", Some(errno() as i64), b"\n");
                libc::_exit(121);
            }
            if task == 0 {
                libc::close(go[1]);
                self.task(go[0]);
            }
            libc::close(go[0]);
            line(FD_REPORT, b"P", Some(task as i64), b"\n");
            libc::close(FD_REPORT);
            let started = gate_opened(FD_GATE);
            if started {
                put(go[1], b"go\n");
            } else {
                libc::kill(task, libc::SIGKILL);
            }
            libc::close(go[1]);
            libc::close(FD_GATE);
            let mut status = 0;
            while libc::waitpid(task, &mut status, 0) < 0 {
                if errno() != libc::EINTR {
                    break;
                }
            }
            let tmp = c"exit.tmp";
            let fd = libc::openat(
                FD_META,
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            );
            if fd >= 0 {
                if !started {
                    line(fd, NOT_STARTED.as_bytes(), None, b"\n");
                } else if libc::WIFEXITED(status) {
                    line(fd, b"exit ", Some(libc::WEXITSTATUS(status) as i64), b"\n");
                } else if libc::WIFSIGNALED(status) {
                    line(fd, b"signal ", Some(libc::WTERMSIG(status) as i64), b"\n");
                }
                libc::close(fd);
                libc::renameat(FD_META, tmp.as_ptr(), FD_META, c"exit".as_ptr());
            }
            libc::_exit(0);
        }
    }

    /// The task's body (in the supervisor's child): set up, wait at the gate, exec.
    fn task(&self, go: RawFd) -> ! {
        // SAFETY: as in `supervise`: async-signal-safe calls on prepared data only.
        unsafe {
            let fail = |stage: &[u8]| -> ! {
                let e = errno() as i64;
                let mut prefix = [0u8; 16];
                let n = stage.len().min(14);
                prefix[0] = b'E';
                prefix[1..1 + n].copy_from_slice(&stage[..n]);
                prefix[1 + n] = b':';
                line(FD_REPORT, &prefix[..n + 2], Some(e), b"\n");
                libc::_exit(126);
            };
            libc::setpgid(0, 0);
            set_signals(libc::SIG_DFL);
            // Join the cgroup while still root (writing 0 moves the writer), then drop to the
            // task's user: groups, gid, uid (after setuid the others are refused).
            for file in self.procs_files {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    fail(b"cgroup");
                }
                libc::close(fd);
            }
            if let Some((uid, gid, groups)) = self.ids {
                if libc::setgroups(groups.len() as _, groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    fail(b"user");
                }
            }
            if libc::fchdir(FD_RUN) != 0 {
                fail(b"chdir");
            }
            // Created by the task's user, in its own fresh directory: never an existing file.
            let flags = libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOFOLLOW
                | libc::O_CLOEXEC
                | libc::O_APPEND;
            let out = libc::openat(FD_RUN, c"stdout".as_ptr(), flags, 0o640);
            if out < 0 {
                fail(b"stdout");
            }
            let err = libc::openat(FD_RUN, c"stderr".as_ptr(), flags, 0o640);
            if err < 0 {
                fail(b"stderr");
            }
            line(FD_REPORT, b"R", None, b"\n");
            if !gate_opened(go) {
                libc::_exit(125);
            }
            if libc::dup2(FD_NULL, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(err, 2) < 0 {
                libc::_exit(126);
            }
            close_from(3);
            libc::execve(SHELL.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr());
            put(2, b"ringmaster: cannot run /bin/sh\n");
            libc::_exit(127);
        }
    }
}

/// How a task ended, as its supervisor recorded it in `meta_dir` (`None`: no record, the
/// supervisor was killed, or the record is not one it writes).
pub fn recorded(meta_dir: &Path) -> Option<Recorded> {
    let mut text = String::new();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(meta_dir.join(EXIT_FILE))
        .ok()?;
    file.take(64).read_to_string(&mut text).ok()?;
    let text = text.trim();
    if text == NOT_STARTED {
        return Some(Recorded::NotStarted);
    }
    let (kind, value) = text.split_once(' ')?;
    let value: i32 = value.parse().ok()?;
    match kind {
        "exit" => Some(Recorded::Exit(value)),
        "signal" => Some(Recorded::Signal(value)),
        _ => None,
    }
}

/// What [`recorded`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Exit(i32),
    Signal(i32),
    NotStarted,
}

/// A supervisor's pid as a pidfd, to wait for its end without polling (Linux 5.3+; `None`
/// where the kernel has none, and then the caller polls).
pub fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_lines() {
        let mut buf = [0u8; 24];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }

    #[test]
    fn records_are_read_strictly() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded(dir.path()), None);
        for (text, want) in [
            ("exit 3\n", Some(Recorded::Exit(3))),
            ("signal 9\n", Some(Recorded::Signal(9))),
            ("not-started\n", Some(Recorded::NotStarted)),
            ("exit x\n", None),
            ("FINISHED\n", None),
        ] {
            std::fs::write(dir.path().join(EXIT_FILE), text).unwrap();
            assert_eq!(recorded(dir.path()), want, "{text:?}");
        }
    }
}
