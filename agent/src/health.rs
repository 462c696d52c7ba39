//! Command health checks of running tasks (`TaskInfo.health`, docs/protocol.md).
//!
//! One tokio task per checked task: after the grace it runs `sh -c COMMAND` every interval
//! where the task's own processes run (its sandbox, user, environment and, with cgroups, its
//! cgroup, so a check counts against the task's limits), in a process group of its own that
//! is SIGKILLed when the check outlives its timeout. Exit 0 passes. [`Tracker`] turns results
//! into health changes (pure, unit-tested); only a change is reported, on a channel the agent's
//! session reads, and the checker ends after reporting the task unhealthy or when its
//! [`Checker`] handle is dropped (the task ended).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ringmaster_proto::{HealthCheck, TaskHealth};
use tokio::io::AsyncReadExt as _;
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};

use crate::isolation::TaskCgroup;
use crate::process;
use crate::users::TaskUser;

/// Defaults for the fields a `HealthCheck` leaves at 0.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_FAILURES: u32 = 3;
/// Bounds the agent holds a check to, whatever the framework asked (the jobs spec is
/// stricter: docs/jobs.md).
const MIN_INTERVAL: Duration = Duration::from_millis(50);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_FAILURES: u32 = 100;
/// How much of a check's output is kept (its end) for the failure message.
const OUTPUT_KEPT: usize = 4096;
/// The longest output line quoted in a message.
const LINE_KEPT: usize = 200;

/// A checked health check, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    pub command: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u32,
    pub grace: Duration,
}

impl HealthSpec {
    /// From the wire: 0 means the default; values are held to the agent's bounds. An empty
    /// command is refused (the task is then not launched).
    pub fn from_wire(check: &HealthCheck) -> Result<Self, String> {
        if check.command.trim().is_empty() {
            return Err("the health check's command is empty".into());
        }
        let or = |ms: u64, default: Duration| match ms {
            0 => default,
            ms => Duration::from_millis(ms),
        };
        let interval = or(check.interval_ms, DEFAULT_INTERVAL).clamp(MIN_INTERVAL, MAX_INTERVAL);
        let timeout = or(check.timeout_ms, DEFAULT_TIMEOUT).clamp(MIN_TIMEOUT, interval);
        let failures = match check.failures {
            0 => DEFAULT_FAILURES,
            n => n.min(MAX_FAILURES),
        };
        let grace = or(check.grace_ms, interval).min(MAX_INTERVAL);
        Ok(HealthSpec {
            command: check.command.clone(),
            interval,
            timeout,
            failures,
            grace,
        })
    }
}

/// A change of a task's health, as the checker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// A check passed and the task was not known healthy.
    Healthy,
    /// `failures` checks in a row failed: "health check failed N times: DETAIL". The checker
    /// has stopped; the task is to be killed.
    Unhealthy { message: String },
}

/// Consecutive results to health: unknown until the first pass or the `failures`-th failure
/// in a row; healthy after a pass; unhealthy (for good) after `failures` failures in a row.
#[derive(Debug, Clone)]
pub struct Tracker {
    failures: u32,
    consecutive: u32,
    health: TaskHealth,
}

impl Tracker {
    pub fn new(failures: u32) -> Self {
        Tracker {
            failures: failures.max(1),
            consecutive: 0,
            health: TaskHealth::Unknown,
        }
    }

    pub fn health(&self) -> TaskHealth {
        self.health
    }

    /// One check's result (`Err(detail)` for a failure); the change it makes, if any.
    pub fn record(&mut self, result: Result<(), String>) -> Option<HealthEvent> {
        if self.health == TaskHealth::Unhealthy {
            return None;
        }
        match result {
            Ok(()) => {
                self.consecutive = 0;
                (self.health != TaskHealth::Healthy).then(|| {
                    self.health = TaskHealth::Healthy;
                    HealthEvent::Healthy
                })
            }
            Err(detail) => {
                self.consecutive += 1;
                (self.consecutive >= self.failures).then(|| {
                    self.health = TaskHealth::Unhealthy;
                    HealthEvent::Unhealthy {
                        message: format!(
                            "health check failed {} times: {detail}",
                            self.consecutive
                        ),
                    }
                })
            }
        }
    }
}

/// Where a task's checks run: as its processes do.
#[derive(Debug, Clone)]
pub struct CheckContext {
    pub sandbox: PathBuf,
    pub env: Vec<(String, String)>,
    pub user: Option<TaskUser>,
    pub cgroup: Option<Arc<TaskCgroup>>,
}

/// A running checker; dropping it stops the checker (and SIGKILLs a check under way).
#[derive(Debug)]
pub struct Checker {
    _stop: oneshot::Sender<()>,
}

/// Starts checking: health changes arrive on `events` as `(tag, event)`. Must be called
/// within a tokio runtime.
pub fn start<T: Clone + Send + 'static>(
    spec: HealthSpec,
    context: CheckContext,
    tag: T,
    events: mpsc::UnboundedSender<(T, HealthEvent)>,
) -> Checker {
    let (stop_tx, stop_rx) = oneshot::channel();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop_rx => {}
            _ = check_loop(spec, context, tag, events) => {}
        }
    });
    Checker { _stop: stop_tx }
}

async fn check_loop<T: Clone>(
    spec: HealthSpec,
    context: CheckContext,
    tag: T,
    events: mpsc::UnboundedSender<(T, HealthEvent)>,
) {
    let mut tracker = Tracker::new(spec.failures);
    let first = tokio::time::Instant::now() + spec.grace;
    let mut ticks = tokio::time::interval_at(first, spec.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let result = run_check(&spec, &context).await;
        if let Err(detail) = &result {
            tracing::debug!(command = %spec.command, "health check failed: {detail}");
        }
        if let Some(event) = tracker.record(result) {
            let unhealthy = matches!(event, HealthEvent::Unhealthy { .. });
            if events.send((tag.clone(), event)).is_err() || unhealthy {
                return;
            }
        }
    }
}

/// Runs the check once: `Ok` when it exits 0 within the timeout, else what went wrong (the
/// last line of its output, its exit, or the timeout).
pub async fn run_check(spec: &HealthSpec, context: &CheckContext) -> Result<(), String> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("exec 2>&1; exec sh -c \"$1\"")
        .arg("ringmaster-health")
        .arg(&spec.command)
        .current_dir(&context.sandbox)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    process::set_environment(&mut command, &context.env);
    process::confine(
        &mut command,
        context.user.as_ref(),
        context.cgroup.as_deref(),
    );
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the check: {e}"))?;
    let Some(pgid) = child.id() else {
        return Err("the check ended before its pid was read".into());
    };
    // Until the check is reaped its group id cannot be reused: a check that is dropped or
    // times out takes its whole group with it.
    let mut group = GroupKill(Some(pgid));
    let mut stdout = child.stdout.take();
    let mut output = Vec::new();
    let finished = tokio::time::timeout(spec.timeout, async {
        if let Some(stdout) = stdout.as_mut() {
            let mut buf = [0u8; 1024];
            loop {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        output.extend_from_slice(&buf[..n]);
                        if output.len() > 2 * OUTPUT_KEPT {
                            output.drain(..output.len() - OUTPUT_KEPT);
                        }
                    }
                }
            }
        }
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(format!("waiting for the check failed: {e}")),
        Err(_) => {
            drop(group);
            let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
            return Err(format!("timed out after {}", short(spec.timeout)));
        }
    };
    group.0 = None; // reaped: the id may belong to someone else now
    if status.success() {
        return Ok(());
    }
    let how = {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => format!("killed by {}", process::signal_name(signal)),
            _ => format!("ended with {status}"),
        }
    };
    Err(last_line(&output).unwrap_or(how))
}

/// The last non-empty line of `output`, trimmed and at most 200 characters.
pub fn last_line(output: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(output);
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Some(line.chars().take(LINE_KEPT).collect())
}

/// `2s`, `1.5s`, `250ms`.
fn short(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms if ms > 1000 => format!("{}s", d.as_secs_f64()),
        ms => format!("{ms}ms"),
    }
}

/// SIGKILLs a check's process group when dropped.
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            process::signal_group(pgid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str) -> HealthSpec {
        HealthSpec::from_wire(&HealthCheck {
            command: command.into(),
            interval_ms: 50,
            timeout_ms: 0,
            failures: 2,
            grace_ms: 10,
        })
        .unwrap()
    }

    #[test]
    fn zeros_mean_defaults_and_values_are_bounded() {
        let s = HealthSpec::from_wire(&HealthCheck {
            command: "true".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (s.interval, s.timeout, s.failures, s.grace),
            (DEFAULT_INTERVAL, DEFAULT_TIMEOUT, 3, DEFAULT_INTERVAL)
        );
        let s = HealthSpec::from_wire(&HealthCheck {
            command: "true".into(),
            interval_ms: 1,
            timeout_ms: u64::MAX,
            failures: 5000,
            grace_ms: u64::MAX,
        })
        .unwrap();
        assert_eq!(s.interval, MIN_INTERVAL);
        assert_eq!(
            s.timeout, MIN_INTERVAL,
            "the timeout is at most the interval"
        );
        assert_eq!(s.failures, MAX_FAILURES);
        assert_eq!(s.grace, MAX_INTERVAL);
        let empty = HealthCheck {
            command: " ".into(),
            ..Default::default()
        };
        assert!(HealthSpec::from_wire(&empty).is_err());
    }

    #[test]
    fn health_changes_only_on_a_pass_after_unknown_and_at_the_failure_threshold() {
        let mut t = Tracker::new(3);
        assert_eq!(t.health(), TaskHealth::Unknown);
        // Failures below the threshold before the first pass: still unknown, nothing sent.
        assert_eq!(t.record(Err("no".into())), None);
        assert_eq!(t.record(Err("no".into())), None);
        assert_eq!(t.health(), TaskHealth::Unknown);
        assert_eq!(t.record(Ok(())), Some(HealthEvent::Healthy));
        assert_eq!(t.record(Ok(())), None, "no news: not sent again");
        // A pass resets the count: two failures, a pass, two failures is still healthy.
        assert_eq!(t.record(Err("a".into())), None);
        assert_eq!(t.record(Err("b".into())), None);
        assert_eq!(t.record(Ok(())), None);
        assert_eq!(t.record(Err("a".into())), None);
        assert_eq!(t.record(Err("b".into())), None);
        assert_eq!(t.health(), TaskHealth::Healthy);
        assert_eq!(
            t.record(Err("timed out after 2s".into())),
            Some(HealthEvent::Unhealthy {
                message: "health check failed 3 times: timed out after 2s".into()
            })
        );
        assert_eq!(t.health(), TaskHealth::Unhealthy);
        // Unhealthy is final.
        assert_eq!(t.record(Ok(())), None);
        assert_eq!(t.record(Err("x".into())), None);
    }

    #[test]
    fn one_failure_may_be_enough_even_before_any_pass() {
        let mut t = Tracker::new(1);
        assert!(matches!(
            t.record(Err("gone".into())),
            Some(HealthEvent::Unhealthy { message }) if message == "health check failed 1 times: gone"
        ));
        assert_eq!(Tracker::new(0).failures, 1);
    }

    #[test]
    fn the_last_output_line_is_the_detail() {
        assert_eq!(last_line(b"a\nb  \n\n"), Some("b".into()));
        assert_eq!(last_line(b"\n \n"), None);
        assert_eq!(last_line(&[b'x'; 500]).unwrap().len(), LINE_KEPT);
        assert_eq!(short(Duration::from_secs(2)), "2s");
        assert_eq!(short(Duration::from_millis(250)), "250ms");
    }

    fn context(dir: &std::path::Path) -> CheckContext {
        CheckContext {
            sandbox: dir.to_path_buf(),
            env: vec![("MARK".into(), "mark".into())],
            user: None,
            cgroup: None,
        }
    }

    #[tokio::test]
    async fn a_check_runs_in_the_sandbox_with_the_env_and_reports_its_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        assert_eq!(run_check(&spec("test -n \"$MARK\""), &ctx).await, Ok(()));
        assert_eq!(
            run_check(&spec("echo one; echo \"no $MARK\" >&2; exit 4"), &ctx).await,
            Err("no mark".into())
        );
        assert_eq!(
            run_check(&spec("exit 4"), &ctx).await,
            Err("exited with status 4".into())
        );
        std::fs::write(dir.path().join("here"), "").unwrap();
        assert_eq!(run_check(&spec("test -e here"), &ctx).await, Ok(()));
    }

    #[tokio::test]
    async fn a_check_past_its_timeout_is_killed_with_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec("sleep 30 & echo $! > bg.pid; wait");
        s.timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let result = run_check(&s, &context(dir.path())).await;
        assert_eq!(result, Err("timed out after 300ms".into()));
        assert!(started.elapsed() < Duration::from_secs(10));
        let pid: u32 = std::fs::read_to_string(dir.path().join("bg.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SIGKILL is delivered at once; the orphan may linger as a zombie for a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process::process_is_alive(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the check's child survived"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_checker_reports_healthy_then_unhealthy_when_a_marker_appears() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let checker = start(spec("test ! -e broken"), context(dir.path()), 7u8, tx);
        let wait = Duration::from_secs(20);
        let (tag, event) = tokio::time::timeout(wait, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((tag, event), (7, HealthEvent::Healthy));
        std::fs::write(dir.path().join("broken"), "").unwrap();
        let (_, event) = tokio::time::timeout(wait, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            event,
            HealthEvent::Unhealthy {
                message: "health check failed 2 times: exited with status 1".into()
            }
        );
        // The checker stops after unhealthy: the channel closes.
        assert_eq!(tokio::time::timeout(wait, rx.recv()).await.unwrap(), None);
        drop(checker);
    }

    #[tokio::test]
    async fn dropping_the_checker_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let checker = start(spec("true"), context(dir.path()), (), tx);
        let wait = Duration::from_secs(20);
        assert!(tokio::time::timeout(wait, rx.recv())
            .await
            .unwrap()
            .is_some());
        drop(checker);
        assert_eq!(tokio::time::timeout(wait, rx.recv()).await.unwrap(), None);
    }
}
