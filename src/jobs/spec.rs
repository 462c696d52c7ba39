//! Job spec files (`ringmaster job run FILE`): YAML read strictly, with errors that name the
//! file, the line and the key, checked into a [`JobSpec`] that the CLI sends to the master as
//! JSON and the master keeps in its registry.
//!
//! ```yaml
//! name: web
//! type: service          # service: kept running; batch: runs to completion
//! count: 2
//! task:
//!   command: "python3 -m http.server 8000"   # run with sh -c
//!   resources: "cpus:0.5;mem:128"
//!   user: nobody
//!   env: {KEY: value}
//!   kill_grace: 5s
//!   priority_class: base
//!   gpu_models: [A100]
//!   health:              # service only: the agent runs it; N failures in a row kill the instance
//!     command: "curl -fsS localhost:8000/"
//!     interval: 10s      # 1s..=1h
//!     timeout: 2s        # 100ms..=interval
//!     failures: 3        # 1..=100
//!     grace: 10s         # before the first check, 0s..=1h (default: interval)
//! restart:
//!   attempts: 3          # batch: retries per instance; service: restarts within `interval`
//!   delay: 1s            # doubled after each restart of an instance, up to 5 min
//!   interval: 10m
//! partition: default     # the agents (attribute `partition`) its instances run on
//! constraints:           # every one must hold on the agent of an instance
//!   - {attribute: rack, operator: "=", value: r1}   # =, !=, regexp, is_set, is_not_set
//!   - {operator: distinct_hosts}                    # no two live instances on one agent
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use ringmaster_core::resources::{check_known_names, Resources};
use serde::{Deserialize, Serialize};

use super::constraints::{self, Constraint, Operator, OPERATORS};
use crate::yaml::{ConfigError, Seg, YamlSource};

/// The most instances one job may ask for.
pub const MAX_COUNT: u32 = 10_000;
/// The longest kill grace a job may set.
pub const MAX_KILL_GRACE: Duration = Duration::from_secs(600);
/// The longest first restart delay a job may set (the backoff is capped at [`MAX_RESTART_DELAY`]).
pub const MAX_DELAY: Duration = Duration::from_secs(3600);
/// The longest a restart backoff grows to.
pub const MAX_RESTART_DELAY: Duration = Duration::from_secs(300);
/// The most restart attempts a job may set.
pub const MAX_ATTEMPTS: u32 = 1000;
/// Health check bounds (`task.health`).
pub const MIN_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_HEALTH_INTERVAL: Duration = Duration::from_secs(3600);
pub const MIN_HEALTH_TIMEOUT: Duration = Duration::from_millis(100);
pub const MAX_HEALTH_FAILURES: u32 = 100;
/// Resource names a job may ask for (docs/devices.md for the GPU ones).
pub use ringmaster_core::resources::STANDARD_NAMES as KNOWN_RESOURCES;

/// Whether a job is kept running or runs to completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Kept running: an instance that ends (or whose agent is lost) is started again.
    Service,
    /// Runs to completion: an instance that succeeds is done; one that fails is retried.
    Batch,
}

/// A checked job: what the CLI sends and the master keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: JobKind,
    pub count: u32,
    pub task: TaskTemplate,
    pub restart: RestartPolicy,
    /// The partition its instances run in (the jobs framework subscribes once per partition).
    #[serde(
        default = "default_partition",
        skip_serializing_if = "is_default_partition"
    )]
    pub partition: String,
    /// What an agent must satisfy to run an instance ([`constraints`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
}

/// The partition of agents without a `partition` attribute, and of jobs without one.
pub const DEFAULT_PARTITION: &str = ringmaster_core::placement::DEFAULT_PARTITION;

fn default_partition() -> String {
    DEFAULT_PARTITION.to_string()
}

fn is_default_partition(partition: &String) -> bool {
    partition == DEFAULT_PARTITION
}

/// What every instance of a job runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskTemplate {
    pub command: String,
    /// Canonical resource text (`cpus:0.5;mem:128`).
    pub resources: String,
    /// The Unix user on the agent; `None`: the agent's `--task-user`.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub kill_grace_ms: u64,
    /// `""`/`user` or `base` (docs/priorities.md).
    #[serde(default)]
    pub priority_class: String,
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Services only: a command health check the agent runs (docs/jobs.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheckSpec>,
}

/// `task.health`: `sh -c COMMAND` after `grace`, every `interval`; exit 0 within `timeout`
/// passes; `failures` failures in a row kill the instance (it is then replaced).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HealthCheckSpec {
    pub command: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub failures: u32,
    pub grace_ms: u64,
}

impl HealthCheckSpec {
    /// The bounds of docs/jobs.md; `Err((key, message))`.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.command.trim().is_empty() {
            return Err(("command", "must not be empty".into()));
        }
        let ms = |d: Duration| d.as_millis() as u64;
        if !(ms(MIN_HEALTH_INTERVAL)..=ms(MAX_HEALTH_INTERVAL)).contains(&self.interval_ms) {
            return Err((
                "interval",
                format!("{} is out of range 1s..=1h", show_ms(self.interval_ms)),
            ));
        }
        if !(ms(MIN_HEALTH_TIMEOUT)..=self.interval_ms).contains(&self.timeout_ms) {
            return Err((
                "timeout",
                format!(
                    "{} is out of range 100ms..=interval ({})",
                    show_ms(self.timeout_ms),
                    show_ms(self.interval_ms)
                ),
            ));
        }
        if !(1..=MAX_HEALTH_FAILURES).contains(&self.failures) {
            return Err((
                "failures",
                format!(
                    "{} is out of range 1..={MAX_HEALTH_FAILURES}",
                    self.failures
                ),
            ));
        }
        if self.grace_ms > ms(MAX_HEALTH_INTERVAL) {
            return Err((
                "grace",
                format!("{} is out of range 0s..=1h", show_ms(self.grace_ms)),
            ));
        }
        Ok(())
    }

    /// What the master sends the agent (`TaskInfo.health`).
    pub fn to_wire(&self) -> ringmaster_proto::v1::HealthCheck {
        ringmaster_proto::v1::HealthCheck {
            command: self.command.clone(),
            interval_ms: self.interval_ms,
            timeout_ms: self.timeout_ms,
            failures: self.failures,
            grace_ms: self.grace_ms,
        }
    }

    /// One line for `job plan`: `curl … every 10s, timeout 2s, 3 failures, first after 10s`.
    pub fn describe(&self) -> String {
        format!(
            "`{}` every {}, timeout {}, unhealthy after {} failure{} in a row, first check after {}",
            self.command,
            show_ms(self.interval_ms),
            show_ms(self.timeout_ms),
            self.failures,
            if self.failures == 1 { "" } else { "s" },
            show_ms(self.grace_ms)
        )
    }
}

/// `10s`, `1m 30s`, `250ms`.
fn show_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// How ended instances are started again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub attempts: u32,
    pub delay_ms: u64,
    pub interval_ms: u64,
}

impl JobSpec {
    /// The resources of one instance.
    pub fn resources(&self) -> Resources {
        self.task
            .resources
            .parse()
            .expect("checked when the spec was read")
    }

    /// Checks a spec that arrived as JSON (the master's API): the same rules as the file.
    pub fn check(&self) -> Result<(), String> {
        check_name(&self.name)?;
        if self.count > MAX_COUNT {
            return Err(format!("count: {} is above {MAX_COUNT}", self.count));
        }
        if self.task.command.trim().is_empty() {
            return Err("task.command: empty".into());
        }
        check_resources(&self.task.resources).map_err(|e| format!("task.resources: {e}"))?;
        if self.task.kill_grace_ms > MAX_KILL_GRACE.as_millis() as u64 {
            return Err("task.kill_grace: above 10m".into());
        }
        if self.restart.attempts > MAX_ATTEMPTS {
            return Err(format!("restart.attempts: above {MAX_ATTEMPTS}"));
        }
        if self.restart.delay_ms > MAX_DELAY.as_millis() as u64 {
            return Err("restart.delay: above 1h".into());
        }
        check_priority_class(&self.task.priority_class)?;
        check_partition(&self.partition).map_err(|e| format!("partition: {e}"))?;
        constraints::check_all(&self.constraints)
            .map_err(|(i, key, e)| format!("constraints[{i}].{key}: {e}"))?;
        if let Some(health) = &self.task.health {
            if self.kind != JobKind::Service {
                return Err(format!("task.health: {}", SERVICE_ONLY));
            }
            health
                .check()
                .map_err(|(key, e)| format!("task.health.{key}: {e}"))?;
        }
        Ok(())
    }
}

const SERVICE_ONLY: &str = "only a service may have a health check (this job is `type: batch`)";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    #[serde(rename = "type")]
    kind: JobKind,
    #[serde(default = "one")]
    count: u32,
    task: RawTask,
    #[serde(default)]
    restart: RawRestart,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    constraints: Vec<RawConstraint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConstraint {
    #[serde(default)]
    attribute: Option<String>,
    #[serde(default)]
    operator: Option<String>,
    #[serde(default)]
    value: Option<serde_yaml::Value>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    command: String,
    resources: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    kill_grace: Option<String>,
    #[serde(default)]
    priority_class: Option<String>,
    #[serde(default)]
    gpu_models: Vec<String>,
    #[serde(default)]
    health: Option<RawHealth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    command: String,
    interval: Option<String>,
    timeout: Option<String>,
    failures: Option<u32>,
    grace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRestart {
    attempts: Option<u32>,
    delay: Option<String>,
    interval: Option<String>,
}

/// Reads a job spec file's text; `file` names it in errors.
pub fn parse_job_spec(text: &str, file: &str) -> Result<JobSpec, ConfigError> {
    let source = YamlSource { text, file };
    let raw: RawSpec = source.parse()?;
    let at = |path: &[&str], message: String| {
        let path: Vec<Seg> = path.iter().map(|k| Seg::from(*k)).collect();
        source.error(&path, message)
    };
    check_name(&raw.name).map_err(|e| at(&["name"], e))?;
    if raw.count > MAX_COUNT {
        return Err(at(
            &["count"],
            format!("{} is out of range 0..={MAX_COUNT}", raw.count),
        ));
    }
    if raw.task.command.trim().is_empty() {
        return Err(at(&["task", "command"], "must not be empty".into()));
    }
    let resources =
        check_resources(&raw.task.resources).map_err(|e| at(&["task", "resources"], e))?;
    let duration = |path: &[&str], text: &Option<String>, default: Duration, max: Duration| {
        let Some(text) = text else {
            return Ok(default);
        };
        let value = humantime::parse_duration(text).map_err(|e| {
            at(
                path,
                format!("`{text}` is not a duration like 5s or 1m: {e}"),
            )
        })?;
        if value > max {
            return Err(at(
                path,
                format!(
                    "{text} is out of range 0s..={}",
                    humantime::format_duration(max)
                ),
            ));
        }
        Ok(value)
    };
    let kill_grace = duration(
        &["task", "kill_grace"],
        &raw.task.kill_grace,
        Duration::from_secs(5),
        MAX_KILL_GRACE,
    )?;
    let delay = duration(
        &["restart", "delay"],
        &raw.restart.delay,
        Duration::from_secs(1),
        MAX_DELAY,
    )?;
    let interval = duration(
        &["restart", "interval"],
        &raw.restart.interval,
        Duration::from_secs(600),
        Duration::from_secs(7 * 24 * 3600),
    )?;
    let attempts = raw.restart.attempts.unwrap_or(3);
    if attempts > MAX_ATTEMPTS {
        return Err(at(
            &["restart", "attempts"],
            format!("{attempts} is out of range 0..={MAX_ATTEMPTS}"),
        ));
    }
    let health = match &raw.task.health {
        None => None,
        Some(_) if raw.kind != JobKind::Service => {
            return Err(at(&["task", "health"], SERVICE_ONLY.into()))
        }
        Some(h) => Some(read_health(h, &at)?),
    };
    let priority_class = raw.task.priority_class.unwrap_or_default();
    check_priority_class(&priority_class).map_err(|e| at(&["task", "priority_class"], e))?;
    if let Some(user) = &raw.task.user {
        if user.is_empty() || user.contains(|c: char| c.is_whitespace() || c == ':') {
            return Err(at(
                &["task", "user"],
                format!("`{user}` is not a user name"),
            ));
        }
    }
    let partition = raw.partition.unwrap_or_else(default_partition);
    check_partition(&partition).map_err(|e| at(&["partition"], e))?;
    let constraints = read_constraints(&raw.constraints, &source)?;
    Ok(JobSpec {
        name: raw.name,
        kind: raw.kind,
        count: raw.count,
        task: TaskTemplate {
            command: raw.task.command,
            resources: resources.to_string(),
            user: raw.task.user,
            env: raw.task.env,
            kill_grace_ms: kill_grace.as_millis() as u64,
            priority_class,
            gpu_models: raw.task.gpu_models,
            health,
        },
        restart: RestartPolicy {
            attempts,
            delay_ms: delay.as_millis() as u64,
            interval_ms: interval.as_millis() as u64,
        },
        partition,
        constraints,
    })
}

/// `constraints:` from the file: each item's operator read (`=` when left out), its
/// attribute and value checked against the operator, errors at the item's key.
fn read_constraints(
    raw: &[RawConstraint],
    source: &YamlSource<'_>,
) -> Result<Vec<Constraint>, ConfigError> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, item) in raw.iter().enumerate() {
        let at = |key: &str, message: String| {
            source.error(
                &[Seg::from("constraints"), Seg::from(i), Seg::from(key)],
                message,
            )
        };
        let operator = match item.operator.as_deref() {
            None => Operator::Eq,
            Some(text) => Operator::parse(text).ok_or_else(|| {
                at(
                    "operator",
                    format!("`{text}` is not an operator: one of {OPERATORS}"),
                )
            })?,
        };
        let value = match &item.value {
            None => None,
            Some(serde_yaml::Value::String(s)) => Some(s.clone()),
            Some(serde_yaml::Value::Number(n)) => Some(n.to_string()),
            Some(serde_yaml::Value::Bool(b)) => Some(b.to_string()),
            Some(_) => {
                return Err(at(
                    "value",
                    "must be a string, a number or a boolean".into(),
                ))
            }
        };
        let constraint = Constraint {
            attribute: item.attribute.clone().unwrap_or_default(),
            operator,
            value,
        };
        constraint.check().map_err(|(key, e)| {
            let present = match key {
                "attribute" => item.attribute.is_some(),
                "value" => item.value.is_some(),
                _ => true,
            };
            let mut error = at(key, e);
            if !present {
                // A missing key has no line of its own: the item's.
                error.line = source
                    .error(&[Seg::from("constraints"), Seg::from(i)], "")
                    .line;
            }
            error
        })?;
        out.push(constraint);
    }
    Ok(out)
}

/// Partition names: what the master accepts in a subscription (no spaces or control
/// characters), not empty, and usable in a framework name.
fn check_partition(partition: &str) -> Result<(), String> {
    if partition.is_empty()
        || partition.len() > 63
        || partition
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(format!(
            "`{partition}` is not a partition name: 1-63 characters, no spaces, control characters or /"
        ));
    }
    Ok(())
}

/// `task.health` from the file: durations read, defaults filled, bounds checked.
fn read_health(
    raw: &RawHealth,
    at: &dyn Fn(&[&str], String) -> ConfigError,
) -> Result<HealthCheckSpec, ConfigError> {
    let duration = |key: &str, text: &Option<String>, default: Duration| {
        let Some(text) = text else {
            return Ok(default);
        };
        humantime::parse_duration(text).map_err(|e| {
            at(
                &["task", "health", key],
                format!("`{text}` is not a duration like 5s or 1m: {e}"),
            )
        })
    };
    let interval = duration("interval", &raw.interval, Duration::from_secs(10))?;
    let spec = HealthCheckSpec {
        command: raw.command.clone(),
        interval_ms: interval.as_millis() as u64,
        timeout_ms: duration("timeout", &raw.timeout, Duration::from_secs(2))?.as_millis() as u64,
        failures: raw.failures.unwrap_or(3),
        grace_ms: duration("grace", &raw.grace, interval)?.as_millis() as u64,
    };
    spec.check()
        .map_err(|(key, message)| at(&["task", "health", key], message))?;
    Ok(spec)
}

/// Job names: 1–63 of `a-z`, `0-9` and `-`, starting with a letter (they become task ids).
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a job name: 1-63 of a-z, 0-9 and -, starting with a letter"
        ))
    }
}

fn check_priority_class(class: &str) -> Result<(), String> {
    match class {
        "" | "user" | "base" => Ok(()),
        other => Err(format!("`{other}` is not a priority class: user or base")),
    }
}

/// Parses resource text and refuses names outside [`KNOWN_RESOURCES`], suggesting the nearest.
fn check_resources(text: &str) -> Result<Resources, String> {
    let resources: Resources = text.parse().map_err(|e| format!("{e}"))?;
    check_known_names(&resources, &KNOWN_RESOURCES)?;
    if resources.milli("cpus") == 0 && resources.milli("mem") == 0 {
        return Err(format!("`{text}` asks for no cpus and no mem"));
    }
    Ok(resources)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = r#"name: web
type: service
count: 2
task:
  command: "python3 -m http.server 8000"
  resources: "cpus:0.5;mem:128"
  user: nobody
  env: {KEY: value}
  kill_grace: 5s
restart:
  attempts: 3
  delay: 1s
"#;

    #[test]
    fn the_issue_example_reads() {
        let spec = parse_job_spec(WEB, "web.yaml").unwrap();
        assert_eq!(spec.name, "web");
        assert_eq!(spec.kind, JobKind::Service);
        assert_eq!(spec.count, 2);
        assert_eq!(spec.task.resources, "cpus:0.5;mem:128");
        assert_eq!(spec.task.user.as_deref(), Some("nobody"));
        assert_eq!(spec.task.env["KEY"], "value");
        assert_eq!(spec.task.kill_grace_ms, 5000);
        assert_eq!(spec.restart.attempts, 3);
        assert_eq!(spec.restart.delay_ms, 1000);
        assert!(spec.check().is_ok());
        // The JSON the CLI sends reads back the same.
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<JobSpec>(&json).unwrap(), spec);
    }

    fn error(text: &str) -> String {
        parse_job_spec(text, "job.yaml").unwrap_err().to_string()
    }

    #[test]
    fn an_unknown_key_names_file_line_and_key() {
        let text = WEB.replace("  user: nobody\n", "  usr: nobody\n");
        let e = error(&text);
        assert!(e.starts_with("job.yaml:7: task: "), "{e}");
        assert!(e.contains("unknown field `usr`"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_the_range() {
        let e = error(&WEB.replace("count: 2", "count: 20000"));
        assert_eq!(e, "job.yaml:3: count: 20000 is out of range 0..=10000");
        let e = error(&WEB.replace("kill_grace: 5s", "kill_grace: 1h"));
        assert!(
            e.starts_with("job.yaml:9: task.kill_grace: 1h is out of range"),
            "{e}"
        );
        let e = error(&WEB.replace("delay: 1s", "delay: soon"));
        assert!(
            e.starts_with("job.yaml:12: restart.delay: `soon` is not a duration"),
            "{e}"
        );
        let e = error(&WEB.replace("name: web", "name: Web_1"));
        assert!(
            e.starts_with("job.yaml:1: name: `Web_1` is not a job name"),
            "{e}"
        );
        let e = error(&WEB.replace("type: service", "type: daemon"));
        assert!(e.contains("daemon"), "{e}");
    }

    #[test]
    fn a_resource_typo_is_refused_with_a_suggestion() {
        let e = error(&WEB.replace("cpus:0.5;mem:128", "cpu:0.5;mem:128"));
        assert!(
            e.starts_with(
                "job.yaml:6: task.resources: unknown resource `cpu` (did you mean `cpus`?)"
            ),
            "{e}"
        );
        let e = error(&WEB.replace("cpus:0.5;mem:128", "gpus:1"));
        assert!(e.contains("no cpus and no mem"), "{e}");
    }

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let spec = parse_job_spec(
            "name: once\ntype: batch\ntask:\n  command: true\n  resources: cpus:1\n",
            "once.yaml",
        )
        .unwrap();
        assert_eq!(spec.count, 1);
        assert_eq!(spec.task.kill_grace_ms, 5000);
        assert_eq!(spec.restart.attempts, 3);
        assert_eq!(spec.restart.delay_ms, 1000);
        assert_eq!(spec.restart.interval_ms, 600_000);
        assert_eq!(spec.task.user, None);
    }

    #[test]
    fn a_json_spec_is_checked_like_a_file() {
        let mut spec = parse_job_spec(WEB, "web.yaml").unwrap();
        spec.task.resources = "cpu:1".into();
        assert!(spec.check().unwrap_err().contains("did you mean `cpus`"));
        spec.task.resources = "cpus:1".into();
        spec.name = "../etc".into();
        assert!(spec.check().is_err());
    }

    const HEALTHY: &str = r#"name: web
type: service
task:
  command: "sleep 1000"
  resources: "cpus:0.5"
  health:
    command: "test -e ok"
    interval: 5s
    timeout: 1s
    failures: 2
restart:
  attempts: 3
"#;

    #[test]
    fn a_health_check_reads_with_its_defaults() {
        let spec = parse_job_spec(HEALTHY, "web.yaml").unwrap();
        let h = spec.task.health.clone().unwrap();
        assert_eq!(
            (h.command.as_str(), h.interval_ms, h.timeout_ms, h.failures),
            ("test -e ok", 5000, 1000, 2)
        );
        assert_eq!(h.grace_ms, 5000, "grace defaults to the interval");
        assert!(spec.check().is_ok());
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<JobSpec>(&json).unwrap(), spec);
        let wire = h.to_wire();
        assert_eq!((wire.interval_ms, wire.grace_ms), (5000, 5000));
        assert!(
            h.describe().contains("every 5s, timeout 1s"),
            "{}",
            h.describe()
        );

        let minimal = "name: web\ntype: service\ntask:\n  command: x\n  resources: cpus:1\n  health:\n    command: true\n    grace: 0s\n";
        let h = parse_job_spec(minimal, "w.yaml")
            .unwrap()
            .task
            .health
            .unwrap();
        assert_eq!(
            (h.interval_ms, h.timeout_ms, h.failures, h.grace_ms),
            (10_000, 2000, 3, 0)
        );
        // A spec without health has no `health` key in its JSON (jobs.json stays as it was).
        let plain = parse_job_spec(WEB, "web.yaml").unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("health"));
    }

    #[test]
    fn bad_health_values_name_the_key_and_the_range() {
        let e = error(&HEALTHY.replace("interval: 5s", "interval: 500ms"));
        assert_eq!(
            e,
            "job.yaml:8: task.health.interval: 500ms is out of range 1s..=1h"
        );
        let e = error(&HEALTHY.replace("interval: 5s", "interval: 2h"));
        assert_eq!(
            e,
            "job.yaml:8: task.health.interval: 2h is out of range 1s..=1h"
        );
        let e = error(&HEALTHY.replace("timeout: 1s", "timeout: 6s"));
        assert_eq!(
            e,
            "job.yaml:9: task.health.timeout: 6s is out of range 100ms..=interval (5s)"
        );
        let e = error(&HEALTHY.replace("timeout: 1s", "timeout: 50ms"));
        assert!(
            e.starts_with("job.yaml:9: task.health.timeout: 50ms is out of range"),
            "{e}"
        );
        let e = error(&HEALTHY.replace("failures: 2", "failures: 0"));
        assert_eq!(
            e,
            "job.yaml:10: task.health.failures: 0 is out of range 1..=100"
        );
        let e = error(&HEALTHY.replace("failures: 2", "failures: 101"));
        assert_eq!(
            e,
            "job.yaml:10: task.health.failures: 101 is out of range 1..=100"
        );
        let e = error(&HEALTHY.replace("failures: 2", "failures: -1"));
        assert!(e.starts_with("job.yaml:10: task.health.failures: "), "{e}");
        let e = error(&HEALTHY.replace("timeout: 1s", "timeout: soon"));
        assert!(
            e.starts_with("job.yaml:9: task.health.timeout: `soon` is not a duration"),
            "{e}"
        );
        let e = error(&HEALTHY.replace("failures: 2", "failures: 2\n    grace: 2h"));
        assert_eq!(
            e,
            "job.yaml:11: task.health.grace: 2h is out of range 0s..=1h"
        );
        let e = error(&HEALTHY.replace("command: \"test -e ok\"", "command: \" \""));
        assert_eq!(e, "job.yaml:7: task.health.command: must not be empty");
    }

    #[test]
    fn unknown_health_keys_and_batch_jobs_with_health_are_refused() {
        let e = error(&HEALTHY.replace("failures: 2", "retries: 2"));
        assert!(e.starts_with("job.yaml:10: task.health: "), "{e}");
        assert!(e.contains("unknown field `retries`"), "{e}");
        let e = error(&HEALTHY.replace("    command: \"test -e ok\"\n", ""));
        assert!(e.contains("missing field `command`"), "{e}");
        let e = error(&HEALTHY.replace("type: service", "type: batch"));
        assert_eq!(
            e,
            "job.yaml:6: task.health: only a service may have a health check (this job is `type: batch`)"
        );
    }

    #[test]
    fn a_json_spec_with_health_is_checked_like_a_file() {
        let mut spec = parse_job_spec(HEALTHY, "web.yaml").unwrap();
        spec.task.health.as_mut().unwrap().timeout_ms = 10_000;
        assert!(spec
            .check()
            .unwrap_err()
            .starts_with("task.health.timeout: "));
        spec.task.health.as_mut().unwrap().timeout_ms = 1000;
        spec.kind = JobKind::Batch;
        assert!(spec.check().unwrap_err().contains("only a service"));
    }

    const PLACED: &str = r#"name: web
type: service
count: 2
task:
  command: "sleep 1000"
  resources: "cpus:0.5"
partition: gpu
constraints:
  - attribute: rack
    value: r1
  - attribute: zone
    operator: regexp
    value: "eu-.*"
  - {attribute: ssd, operator: is_set}
  - {attribute: hostname, operator: "!=", value: node1}
  - {attribute: version, value: 2}
  - operator: distinct_hosts
"#;

    #[test]
    fn constraints_and_partition_read_with_their_defaults() {
        let spec = parse_job_spec(PLACED, "web.yaml").unwrap();
        assert_eq!(spec.partition, "gpu");
        let shown: Vec<String> = spec.constraints.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            [
                "rack = r1",
                "zone regexp eu-.*",
                "ssd is_set",
                "hostname != node1",
                "version = 2",
                "distinct_hosts"
            ]
        );
        assert!(spec.check().is_ok());
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<JobSpec>(&json).unwrap(), spec);
        // Without them: the default partition, no constraints, and JSON as before.
        let plain = parse_job_spec(WEB, "web.yaml").unwrap();
        assert_eq!(plain.partition, "default");
        assert!(plain.constraints.is_empty());
        let json = serde_json::to_string(&plain).unwrap();
        assert!(
            !json.contains("partition") && !json.contains("constraints"),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<JobSpec>(&json).unwrap(), plain);
    }

    #[test]
    fn bad_constraints_name_file_line_and_key() {
        let e = error(&PLACED.replace("operator: regexp", "operator: like"));
        assert_eq!(
            e,
            "job.yaml:12: constraints[1].operator: `like` is not an operator: one of =, !=, regexp, is_set, is_not_set, distinct_hosts"
        );
        let e = error(&PLACED.replace("    value: r1\n", ""));
        assert_eq!(
            e,
            "job.yaml:9: constraints[0].value: operator = needs a value"
        );
        let e = error(&PLACED.replace(
            "{attribute: ssd, operator: is_set}",
            "{attribute: ssd, operator: is_set, value: x}",
        ));
        assert_eq!(
            e,
            "job.yaml:14: constraints[2].value: operator is_set takes no value"
        );
        let e = error(&PLACED.replace("value: \"eu-.*\"", "value: \"eu-(\""));
        assert!(
            e.starts_with("job.yaml:13: constraints[1].value: `eu-(` is not a regular expression"),
            "{e}"
        );
        let e = error(&PLACED.replace(
            "  - operator: distinct_hosts",
            "  - {operator: distinct_hosts, attribute: rack}",
        ));
        assert_eq!(
            e,
            "job.yaml:17: constraints[5].attribute: operator distinct_hosts takes no attribute"
        );
        let e = error(&PLACED.replace("  - attribute: rack\n    value: r1", "  - value: r1"));
        assert_eq!(
            e,
            "job.yaml:9: constraints[0].attribute: operator = needs an attribute"
        );
        let e = error(&PLACED.replace("    value: r1\n", "    valeu: r1\n"));
        assert!(e.starts_with("job.yaml:10: constraints[0]: "), "{e}");
        assert!(e.contains("unknown field `valeu`"), "{e}");
        let e = error(&PLACED.replace("partition: gpu", "partition: \"a b\""));
        assert!(
            e.starts_with("job.yaml:7: partition: `a b` is not a partition name"),
            "{e}"
        );
        let e = error(&PLACED.replace("partition: gpu", "partiton: gpu"));
        assert!(e.contains("unknown field `partiton`"), "{e}");
    }

    #[test]
    fn a_json_spec_with_bad_constraints_is_refused() {
        let mut spec = parse_job_spec(PLACED, "web.yaml").unwrap();
        spec.constraints[0].value = None;
        assert_eq!(
            spec.check().unwrap_err(),
            "constraints[0].value: operator = needs a value"
        );
        let mut spec = parse_job_spec(PLACED, "web.yaml").unwrap();
        spec.partition = String::new();
        assert!(spec.check().unwrap_err().starts_with("partition: "));
    }
}
