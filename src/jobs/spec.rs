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
//! restart:
//!   attempts: 3          # batch: retries per instance; service: restarts within `interval`
//!   delay: 1s            # doubled after each restart of an instance, up to 5 min
//!   interval: 10m
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use ringmaster_core::resources::{check_known_names, Resources};
use serde::{Deserialize, Serialize};

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
        Ok(())
    }
}

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
        },
        restart: RestartPolicy {
            attempts,
            delay_ms: delay.as_millis() as u64,
            interval_ms: interval.as_millis() as u64,
        },
    })
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
}
