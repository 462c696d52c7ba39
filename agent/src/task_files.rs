//! The agent's durable memory of its tasks: one small record per run of a task in the agent's
//! own directory, `<work_dir>/meta/tasks/<framework_id>/<task_id>/<run>/task` (escaped ids; the
//! `meta` tree is the agent's, 0700, its files 0600), so an agent that restarts with the same
//! `--work-dir` finds the tasks it was running (its supervisor's and the task's pids and start
//! times, to adopt them safely), the ones that ended but whose terminal update the master never
//! acknowledged, and the acknowledged ones whose sandboxes wait for the garbage collector.
//!
//! Nothing here is in a sandbox: a task can neither rewrite its record nor point the agent's
//! writes elsewhere with a symlink (as Mesos keeps its checkpoints in its meta directory). The
//! supervisor of a run records how the task ended next to the record
//! ([`crate::supervisor::EXIT_FILE`]).
//!
//! Why files and not a database: a run's record lives and dies with its run, writes are a
//! rename (atomic), and an operator can read them. The format is `key=value` lines with
//! values percent-escaped, so any id survives the round trip.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use std::time::Duration;

use ringmaster_proto::{TaskState, TaskStatus};

use crate::health::HealthSpec;

/// The record's file name inside a run's meta directory.
pub const TASK_FILE: &str = "task";
/// The agent's own directory under the work dir.
pub const META: &str = "meta";

/// The meta directory of one run of a task (not created).
pub fn meta_dir(work_dir: &Path, framework_id: &str, task_id: &str, run: &str) -> PathBuf {
    use crate::sandbox::escape_component;
    work_dir
        .join(META)
        .join("tasks")
        .join(escape_component(framework_id))
        .join(escape_component(task_id))
        .join(run)
}

/// Creates a run's meta directory (and the `meta` tree, 0700, the agent's alone).
pub fn create_meta_dir(dir: &Path, work_dir: &Path) -> std::io::Result<()> {
    let meta = work_dir.join(META);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)?;
    // A tree made by hand or an older agent with a wider mode is narrowed.
    let mode = std::fs::symlink_metadata(&meta)?.permissions().mode() & 0o777;
    if mode != 0o700 {
        std::fs::set_permissions(&meta, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// What the agent must know about a task after a restart.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskFile {
    pub framework_id: String,
    pub task_id: String,
    /// The run's name ([`crate::sandbox::create_run`]).
    pub run: String,
    /// The task's user (empty: the agent's own).
    pub user: String,
    /// The task's environment as the agent gave it (for its health checks after a restart).
    pub env: Vec<(String, String)>,
    /// The task's supervisor ([`crate::supervisor`]) and its start time; 0 before it started.
    pub supervisor_pid: u32,
    pub supervisor_ticks: u64,
    /// Mesos text syntax.
    pub resources: String,
    /// The GPU devices it holds, in binding text (`gpu:0:500:0,…`; empty without GPUs).
    pub devices: String,
    /// The task's main process (its group leader); 0 when no process was started.
    pub pid: u32,
    /// The task's start time, from `/proc/PID/stat`.
    pub start_ticks: u64,
    /// Set once a kill was requested.
    pub kill_reason: Option<String>,
    /// `TaskInfo.kill_grace_ms` (0: the agent's default grace).
    pub kill_grace_ms: u64,
    /// The terminal status, once the task ended (until the master acknowledges it).
    pub ended: Option<TaskStatus>,
    /// Its health check, so a restarted agent keeps checking an adopted task.
    pub health: Option<HealthSpec>,
    /// When the master acknowledged its terminal update (ms since the epoch): from then on the
    /// record only dates the run for the sandbox garbage collector.
    pub acked_ms: Option<u64>,
}

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' && byte != b'=' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl TaskFile {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut lines = vec![
            format!("framework_id={}", escape(&self.framework_id)),
            format!("task_id={}", escape(&self.task_id)),
            format!("run={}", escape(&self.run)),
            format!("user={}", escape(&self.user)),
            format!("supervisor_pid={}", self.supervisor_pid),
            format!("supervisor_ticks={}", self.supervisor_ticks),
            format!("resources={}", escape(&self.resources)),
            format!("devices={}", escape(&self.devices)),
            format!("pid={}", self.pid),
            format!("start_ticks={}", self.start_ticks),
        ];
        for (k, v) in &self.env {
            lines.push(format!("env={}", escape(&format!("{k}={v}"))));
        }
        if let Some(reason) = &self.kill_reason {
            lines.push(format!("kill_reason={}", escape(reason)));
        }
        if let Some(ms) = self.acked_ms {
            lines.push(format!("acked_ms={ms}"));
        }
        if self.kill_grace_ms != 0 {
            lines.push(format!("kill_grace_ms={}", self.kill_grace_ms));
        }
        if let Some(health) = &self.health {
            lines.push(format!("health_command={}", escape(&health.command)));
            lines.push(format!(
                "health_interval_ms={}",
                health.interval.as_millis()
            ));
            lines.push(format!("health_timeout_ms={}", health.timeout.as_millis()));
            lines.push(format!("health_failures={}", health.failures));
            lines.push(format!("health_grace_ms={}", health.grace.as_millis()));
        }
        if let Some(status) = &self.ended {
            lines.push(format!("ended_state={}", status.state));
            lines.push(format!("ended_reason={}", escape(&status.reason)));
            lines.push(format!("ended_message={}", escape(&status.message)));
            if let Some(code) = status.exit_code {
                lines.push(format!("ended_exit_code={code}"));
            }
        }
        lines.join("\n") + "\n"
    }

    /// Parses a file's text; the error names the first bad line.
    pub fn parse(text: &str) -> Result<TaskFile, String> {
        let mut file = TaskFile {
            framework_id: String::new(),
            task_id: String::new(),
            run: String::new(),
            user: String::new(),
            env: Vec::new(),
            supervisor_pid: 0,
            supervisor_ticks: 0,
            acked_ms: None,
            resources: String::new(),
            devices: String::new(),
            pid: 0,
            start_ticks: 0,
            kill_reason: None,
            kill_grace_ms: 0,
            ended: None,
            health: None,
        };
        let mut ended_state: Option<i32> = None;
        let mut health_command: Option<String> = None;
        let mut health = HealthSpec {
            command: String::new(),
            interval: crate::health::DEFAULT_INTERVAL,
            timeout: crate::health::DEFAULT_TIMEOUT,
            failures: crate::health::DEFAULT_FAILURES,
            grace: Duration::ZERO,
        };
        let mut ended = TaskStatus::default();
        let (mut has_fw, mut has_task) = (false, false);
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
            let bad = || format!("line {}: {line:?}", n + 1);
            let (key, raw) = line.split_once('=').ok_or_else(bad)?;
            let value = unescape(raw).ok_or_else(bad)?;
            match key {
                "framework_id" => (file.framework_id, has_fw) = (value, true),
                "task_id" => (file.task_id, has_task) = (value, true),
                "run" => file.run = value,
                "user" => file.user = value,
                "env" => {
                    let (k, v) = value.split_once('=').ok_or_else(bad)?;
                    file.env.push((k.to_string(), v.to_string()));
                }
                "supervisor_pid" => file.supervisor_pid = value.parse().map_err(|_| bad())?,
                "supervisor_ticks" => file.supervisor_ticks = value.parse().map_err(|_| bad())?,
                "acked_ms" => file.acked_ms = Some(value.parse().map_err(|_| bad())?),
                "resources" => file.resources = value,
                "devices" => file.devices = value,
                "pid" => file.pid = value.parse().map_err(|_| bad())?,
                "start_ticks" => file.start_ticks = value.parse().map_err(|_| bad())?,
                "kill_reason" => file.kill_reason = Some(value),
                "kill_grace_ms" => file.kill_grace_ms = value.parse().map_err(|_| bad())?,
                "health_command" => health_command = Some(value),
                "health_interval_ms" => health.interval = millis(&value).ok_or_else(bad)?,
                "health_timeout_ms" => health.timeout = millis(&value).ok_or_else(bad)?,
                "health_failures" => health.failures = value.parse().map_err(|_| bad())?,
                "health_grace_ms" => health.grace = millis(&value).ok_or_else(bad)?,
                "ended_state" => ended_state = Some(value.parse().map_err(|_| bad())?),
                "ended_reason" => ended.reason = value,
                "ended_message" => ended.message = value,
                "ended_exit_code" => ended.exit_code = Some(value.parse().map_err(|_| bad())?),
                // Unknown keys are from a newer agent: ignored.
                _ => {}
            }
        }
        if !has_fw || !has_task {
            return Err("framework_id or task_id missing".into());
        }
        if let Some(command) = health_command {
            // Held to the agent's bounds again, as any input.
            file.health = Some(
                HealthSpec::from_wire(&ringmaster_proto::HealthCheck {
                    command,
                    interval_ms: health.interval.as_millis() as u64,
                    timeout_ms: health.timeout.as_millis() as u64,
                    failures: health.failures,
                    grace_ms: health.grace.as_millis() as u64,
                })
                .map_err(|e| format!("health: {e}"))?,
            );
        }
        if let Some(state) = ended_state {
            let terminal = TaskState::try_from(state).is_ok_and(|s| s.is_terminal());
            if !terminal {
                return Err(format!("ended_state {state} is not a terminal state"));
            }
            ended.state = state;
            ended.task_id = file.task_id.clone();
            ended.framework_id = file.framework_id.clone();
            file.ended = Some(ended);
        }
        Ok(file)
    }

    /// Writes the record into its meta directory atomically (temporary file of mode 0600, then
    /// renamed). The directory is the agent's alone. Not flushed to the disk: what it protects
    /// against is the agent's crash, not the host's (a host that crashes takes its tasks
    /// with it, and a torn record is reported as a lost run).
    pub fn save(&self, meta_dir: &Path) -> std::io::Result<()> {
        let tmp = meta_dir.join(format!("{TASK_FILE}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(self.render().as_bytes())?;
        drop(file);
        std::fs::rename(&tmp, meta_dir.join(TASK_FILE))
    }
}

fn millis(value: &str) -> Option<Duration> {
    value.parse().ok().map(Duration::from_millis)
}

/// Every record under `<work_dir>/meta/tasks/*/*/*/`, with its meta directory. A run without
/// a record (the agent stopped while creating it) comes with `None`; unreadable or malformed
/// records are logged and come with `None` too (the rest still recovers; the run is
/// collected).
pub fn scan(work_dir: &Path) -> Vec<(PathBuf, Option<TaskFile>)> {
    let mut found = Vec::new();
    let subdirs = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    for framework in subdirs(&work_dir.join(META).join("tasks")) {
        for task in subdirs(&framework) {
            for run in subdirs(&task) {
                let path = run.join(TASK_FILE);
                let file = match std::fs::read_to_string(&path) {
                    Ok(text) => match TaskFile::parse(&text) {
                        Ok(file) => Some(file),
                        Err(e) => {
                            tracing::warn!(file = %path.display(), "ignoring a bad task record: {e}");
                            None
                        }
                    },
                    Err(e) => {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(file = %path.display(), "cannot read a task record: {e}");
                        }
                        None
                    }
                };
                found.push((run, file));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TaskFile {
        TaskFile {
            framework_id: "fw 1=%x".into(),
            task_id: "t\n1".into(),
            run: "0001700000000000-1".into(),
            user: "nobody".into(),
            env: vec![("A".into(), "b=c d".into()), ("E".into(), String::new())],
            supervisor_pid: 4241,
            supervisor_ticks: 987650,
            acked_ms: None,
            resources: "cpus:1;mem:128".into(),
            devices: "gpu:0:500:0,gpu:1:1000:0".into(),
            pid: 4242,
            start_ticks: 987654,
            kill_reason: Some("killed_by_framework".into()),
            kill_grace_ms: 15_000,
            ended: None,
            health: Some(HealthSpec {
                command: "test -f ready && echo 'ok=%'".into(),
                interval: Duration::from_millis(1500),
                timeout: Duration::from_millis(700),
                failures: 4,
                grace: Duration::from_secs(3),
            }),
        }
    }

    #[test]
    fn a_task_file_round_trips_any_id() {
        let file = sample();
        assert_eq!(TaskFile::parse(&file.render()).unwrap(), file);
        let ended = TaskFile {
            ended: Some(TaskStatus {
                task_id: file.task_id.clone(),
                framework_id: file.framework_id.clone(),
                state: TaskState::TaskFailed as i32,
                reason: "exit_status".into(),
                message: "exited with status 3".into(),
                exit_code: Some(3),
                ..Default::default()
            }),
            ..file
        };
        assert_eq!(TaskFile::parse(&ended.render()).unwrap(), ended);
        // Without a kill grace of its own the line is left out (files of older agents).
        let default_grace = TaskFile {
            kill_grace_ms: 0,
            ..sample()
        };
        assert!(!default_grace.render().contains("kill_grace_ms"));
        assert_eq!(
            TaskFile::parse(&default_grace.render()).unwrap(),
            default_grace
        );
        let unchecked = TaskFile {
            health: None,
            ..sample()
        };
        assert!(!unchecked.render().contains("health_"));
        assert_eq!(TaskFile::parse(&unchecked.render()).unwrap(), unchecked);
    }

    #[test]
    fn bad_files_are_errors_naming_the_line() {
        assert!(TaskFile::parse("task_id=t\n").is_err());
        let e = TaskFile::parse("framework_id=f\ntask_id=t\npid=x\n").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        let e = TaskFile::parse("framework_id=f\ntask_id=t\nended_state=2\n").unwrap_err();
        assert!(e.contains("not a terminal"), "{e}");
    }

    #[test]
    fn scan_finds_saved_files_and_reports_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let good = meta_dir(dir.path(), "fw", "t1", "1");
        let bad = meta_dir(dir.path(), "fw", "t2", "1");
        create_meta_dir(&good, dir.path()).unwrap();
        create_meta_dir(&bad, dir.path()).unwrap();
        sample().save(&good).unwrap();
        std::fs::write(bad.join(TASK_FILE), "garbage").unwrap();
        let found = scan(dir.path());
        assert_eq!(
            found,
            vec![(good.clone(), Some(sample())), (bad.clone(), None)]
        );
        use std::os::unix::fs::MetadataExt as _;
        let mode = std::fs::metadata(good.join(TASK_FILE)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mode = std::fs::metadata(dir.path().join(META)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::remove_dir_all(dir.path().join(META).join("tasks")).unwrap();
        assert!(scan(dir.path()).is_empty());
    }
}
