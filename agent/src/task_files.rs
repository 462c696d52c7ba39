//! The agent's durable memory of its tasks: one small file per task in its sandbox
//! (`<sandbox>/.ringmaster-task`), so an agent that restarts with the same `--work-dir` finds
//! the tasks it was running (pid and process start time, to adopt them safely) and the ones
//! that ended but whose terminal update the master never acknowledged.
//!
//! Why files and not a database: a task's file lives and dies with its sandbox, writes are a
//! rename (atomic), and an operator can read them. The format is `key=value` lines with
//! values percent-escaped, so any id survives the round trip.

use std::path::{Path, PathBuf};

use std::time::Duration;

use ringmaster_proto::{TaskState, TaskStatus};

use crate::health::HealthSpec;

/// The record file's name inside a task's sandbox.
pub const TASK_FILE: &str = ".ringmaster-task";

/// What the agent must know about a task after a restart.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskFile {
    pub framework_id: String,
    pub task_id: String,
    /// Mesos text syntax.
    pub resources: String,
    /// The GPU devices it holds, in binding text (`gpu:0:500:0,…`; empty without GPUs).
    pub devices: String,
    /// The group leader (the task's wrapper); 0 when no process was started.
    pub pid: u32,
    /// The leader's start time, from `/proc/PID/stat`.
    pub start_ticks: u64,
    /// Set once a kill was requested.
    pub kill_reason: Option<String>,
    /// `TaskInfo.kill_grace_ms` (0: the agent's default grace).
    pub kill_grace_ms: u64,
    /// The terminal status, once the task ended (until the master acknowledges it).
    pub ended: Option<TaskStatus>,
    /// Its health check, so a restarted agent keeps checking an adopted task.
    pub health: Option<HealthSpec>,
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
            format!("resources={}", escape(&self.resources)),
            format!("devices={}", escape(&self.devices)),
            format!("pid={}", self.pid),
            format!("start_ticks={}", self.start_ticks),
        ];
        if let Some(reason) = &self.kill_reason {
            lines.push(format!("kill_reason={}", escape(reason)));
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
            // Held to the agent's bounds again: the file is in the task's own sandbox.
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

    /// Writes the file into `sandbox` atomically (temporary file, then rename).
    pub fn save(&self, sandbox: &Path) -> std::io::Result<()> {
        let tmp = sandbox.join(format!("{TASK_FILE}.tmp"));
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, sandbox.join(TASK_FILE))
    }
}

fn millis(value: &str) -> Option<Duration> {
    value.parse().ok().map(Duration::from_millis)
}

/// Removes a task's file (the master acknowledged its end); a missing file is fine.
pub fn remove(sandbox: &Path) {
    if let Err(e) = std::fs::remove_file(sandbox.join(TASK_FILE)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(sandbox = %sandbox.display(), "cannot remove the task file: {e}");
        }
    }
}

/// Every task file under `<work_dir>/sandboxes/*/*/`, with its sandbox. Unreadable or
/// malformed files are logged and skipped (the rest still recovers).
pub fn scan(work_dir: &Path) -> Vec<(PathBuf, TaskFile)> {
    let mut found = Vec::new();
    let Ok(frameworks) = std::fs::read_dir(work_dir.join("sandboxes")) else {
        return found;
    };
    for framework in frameworks.flatten() {
        let Ok(tasks) = std::fs::read_dir(framework.path()) else {
            continue;
        };
        for task in tasks.flatten() {
            let sandbox = task.path();
            let path = sandbox.join(TASK_FILE);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!(file = %path.display(), "cannot read a task file: {e}");
                    continue;
                }
            };
            match TaskFile::parse(&text) {
                Ok(file) => found.push((sandbox, file)),
                Err(e) => tracing::warn!(file = %path.display(), "ignoring a bad task file: {e}"),
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
    fn scan_finds_saved_files_and_skips_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("sandboxes/fw/t1");
        let bad = dir.path().join("sandboxes/fw/t2");
        std::fs::create_dir_all(&good).unwrap();
        std::fs::create_dir_all(&bad).unwrap();
        sample().save(&good).unwrap();
        std::fs::write(bad.join(TASK_FILE), "garbage").unwrap();
        let found = scan(dir.path());
        assert_eq!(found, vec![(good.clone(), sample())]);
        remove(&good);
        assert!(scan(dir.path()).is_empty());
    }
}
