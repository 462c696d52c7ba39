//! The agent's config file (`--config FILE`): YAML whose keys are the flags in snake_case.
//!
//! ```yaml
//! master: master.example.com:5050   # or a list: [m1:5050, m2:5050, m3:5050]
//! resources: cpus:16;mem:65536;gpus:4x81920@H100
//! attributes: { partition: gpu, rack: r1 }
//! isolation: cgroups
//! kill_grace: 10s
//! gpu_sharing: mps
//! ```
//!
//! Every key is checked here, on its own, with an error placed at its line
//! (`agent.yaml:4: pids_per_task: 8 is out of range (16 - 4194304)`, using
//! [`ringmaster_proto::yaml`], the located errors the master's config uses too); an unknown key
//! is refused the same way. The result is an [`AgentArgs`] holding only what the file sets,
//! which [`AgentArgs::over`] puts under the command line's flags. Relative paths are relative
//! to the file's directory. Checks that need several keys (`tls_cert` with `tls_key`) are made
//! once, on the merged flags, by [`crate::AgentConfig::from_args`].

use std::path::{Path, PathBuf};

use ringmaster_proto::devices::{parse_agent_resources, DeviceSelection};
use ringmaster_proto::yaml::{ConfigError, Seg, YamlSource};
use serde_yaml::Value;

use crate::args::AgentArgs;
use crate::flag_checks::{
    check_agent_id, check_custom_resources, check_default_task_resources, check_disk_watermark,
    check_kill_grace, check_master_address, check_max_task_pids, check_pids_per_task,
    check_pipe_dir, check_resource_names, check_sandbox_gc_delay, parse_attributes,
    zero_dimensions,
};
use crate::isolation_config::IsolationMode;
use crate::mps::GpuSharingMode;

/// Every key the file may hold.
pub const KEYS: &[&str] = &[
    "master",
    "id",
    "resources",
    "custom_resources",
    "device_selection",
    "attributes",
    "work_dir",
    "hostname",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "principal",
    "secret_file",
    "task_user",
    "allow_root_tasks",
    "isolation",
    "pids_per_task",
    "max_task_pids",
    "default_task_resources",
    "sandbox_gc_delay",
    "disk_watermark",
    "kill_grace",
    "usage_interval",
    "gpu_sharing",
    "mps_pipe_dir",
    "mps_start",
];

impl AgentArgs {
    /// The flags merged with the `--config` file, when one is given: every flag given on the
    /// command line (or `RINGMASTER_MASTER`) wins over the file's key. A file that cannot be
    /// read, has an unknown key or a bad value is an error naming `FILE:LINE: KEY`.
    pub fn load(self) -> anyhow::Result<AgentArgs> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let file = read(&path)?;
        Ok(self.over(file))
    }
}

/// Reads and checks the file at `path`.
pub fn read(path: &Path) -> anyhow::Result<AgentArgs> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--config {name}: cannot read it: {e}"))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let base = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(dir))
            .unwrap_or_else(|_| dir.to_path_buf())
    };
    Ok(parse(&text, &name, &base)?)
}

/// Checks the YAML `text` (named `file` in errors); relative paths are joined to `base`.
pub fn parse(text: &str, file: &str, base: &Path) -> Result<AgentArgs, ConfigError> {
    let source = YamlSource { text, file };
    let doc: Value = source.parse()?;
    let mapping = match doc {
        Value::Mapping(m) => m,
        // An empty file (or one of comments only) sets nothing.
        Value::Null => return Ok(AgentArgs::default()),
        other => {
            return Err(source.error(
                &[],
                format!("expected a mapping of keys, found {}", describe(&other)),
            ))
        }
    };
    let mut args = AgentArgs::default();
    for (key, value) in &mapping {
        let Value::String(key) = key else {
            return Err(source.error(&[], format!("a key must be text, found {}", describe(key))));
        };
        let at = [Seg::Key(key.clone())];
        let fail = |message: String| source.error(&at, message);
        if !KEYS.contains(&key.as_str()) {
            return Err(fail(unknown_key_message(key)));
        }
        read_key(key, value, base, &mut args).map_err(fail)?;
    }
    // Names in `resources` against the standard ones and the file's `custom_resources`.
    if let Some(spec) = &args.resources {
        let known = check_custom_resources(&args.custom_resources).unwrap_or_default();
        if let Ok((given, _)) = parse_agent_resources(spec) {
            check_resource_names(&given, &zero_dimensions(spec), &known).map_err(|m| {
                source.error(
                    &[Seg::Key("resources".into())],
                    format!(
                        "`{spec}`: {}",
                        m.replace("--custom-resources NAME,NAME", "custom_resources")
                    ),
                )
            })?;
        }
    }
    Ok(args)
}

/// Checks one known key's value and stores it in `args`.
fn read_key(key: &str, value: &Value, base: &Path, args: &mut AgentArgs) -> Result<(), String> {
    let quoted = |text: &str, m: String| format!("`{text}`: {m}");
    match key {
        "master" => {
            // One address, `a:1,b:1`, or a YAML list of addresses.
            let v = match value {
                Value::Sequence(items) => items
                    .iter()
                    .map(string)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
                other => string(other)?,
            };
            check_master_address(&v).map_err(|m| quoted(&v, m))?;
            args.master = Some(v);
        }
        "id" => {
            let v = string(value)?;
            check_agent_id(&v).map_err(|e| quoted(&v, e.to_string()))?;
            args.id = Some(v);
        }
        "resources" => {
            let v = string(value)?;
            parse_agent_resources(&v).map_err(|e| quoted(&v, e.to_string()))?;
            args.resources = Some(v);
        }
        "custom_resources" => {
            let names = string_list(value)?;
            check_custom_resources(&names)?;
            args.custom_resources = names;
        }
        "device_selection" => {
            let v = string(value)?;
            v.parse::<DeviceSelection>()
                .map_err(|e| quoted(&v, e.to_string()))?;
            args.device_selection = Some(v);
        }
        "attributes" => {
            let spec = attributes(value)?;
            parse_attributes(&spec).map_err(|e| e.to_string())?;
            args.attributes = Some(spec);
        }
        "work_dir" => args.work_dir = Some(path(value, base)?),
        "tls_ca" => args.tls_ca = Some(path(value, base)?),
        "tls_cert" => args.tls_cert = Some(path(value, base)?),
        "tls_key" => args.tls_key = Some(path(value, base)?),
        "secret_file" => args.secret_file = Some(path(value, base)?),
        "mps_pipe_dir" => {
            let dir = path(value, base)?;
            check_pipe_dir(&dir)?;
            args.mps_pipe_dir = Some(dir);
        }
        "hostname" => args.hostname = Some(non_empty(value)?),
        "principal" => args.principal = Some(non_empty(value)?),
        "task_user" => args.task_user = Some(non_empty(value)?),
        "allow_root_tasks" => args.allow_root_tasks = boolean(value)?,
        "mps_start" => args.mps_start = boolean(value)?,
        "isolation" => {
            let v = string(value)?;
            v.parse::<IsolationMode>()?;
            args.isolation = Some(v);
        }
        "gpu_sharing" => {
            let v = string(value)?;
            v.parse::<GpuSharingMode>()?;
            args.gpu_sharing = Some(v);
        }
        "pids_per_task" => {
            let n = whole_number(value)?;
            args.pids_per_task = Some(check_pids_per_task(n)?);
        }
        "max_task_pids" => {
            let n = whole_number(value)?;
            args.max_task_pids = Some(check_max_task_pids(n)?);
        }
        "default_task_resources" => {
            let v = string(value)?;
            check_default_task_resources(&v).map_err(|m| quoted(&v, m))?;
            args.default_task_resources = Some(v);
        }
        "sandbox_gc_delay" => {
            let v = duration(value, "1h")?;
            check_sandbox_gc_delay(&v).map_err(|m| quoted(&v, m))?;
            args.sandbox_gc_delay = Some(v);
        }
        "disk_watermark" => {
            let fraction = match value {
                Value::Number(n) => n.as_f64().ok_or_else(|| format!("`{n}` is not a number"))?,
                other => return Err(format!("expected a number, found {}", describe(other))),
            };
            args.disk_watermark = Some(check_disk_watermark(fraction)?);
        }
        "kill_grace" => {
            let v = duration(value, "3s")?;
            check_kill_grace(&v).map_err(|m| quoted(&v, m))?;
            args.kill_grace = Some(v);
        }
        "usage_interval" => {
            let v = duration(value, "10s")?;
            crate::usage::check_usage_interval(&v).map_err(|m| quoted(&v, m))?;
            args.usage_interval = Some(v);
        }
        _ => return Err(unknown_key_message(key)),
    }
    Ok(())
}

/// "unknown key", with the closest known key when one is near (`kill_grace_ms` →
/// `kill_grace`), else every known key.
fn unknown_key_message(key: &str) -> String {
    let near = KEYS
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 2 || k.starts_with(key) || key.starts_with(k))
        .min();
    match near {
        Some((_, k)) => format!("unknown key (did you mean `{k}`?)"),
        None => format!("unknown key (known keys: {})", KEYS.join(", ")),
    }
}

/// Levenshtein distance, for the "did you mean" hint.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("`{n}`"),
        Value::String(s) => format!("the string `{s}`"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(_) => "a tagged value".into(),
    }
}

/// Text; a number is taken as its text (`id: 7`).
fn string(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("expected text, found {}", describe(other))),
    }
}

/// A duration's text (`3s`); a bare number is refused, naming `example`.
fn duration(value: &Value, example: &str) -> Result<String, String> {
    match value {
        Value::Number(_) => Err(format!(
            "expected a duration with a unit (ms, s, m, h), e.g. `{example}`, found {}",
            describe(value)
        )),
        _ => string(value),
    }
}

fn non_empty(value: &Value) -> Result<String, String> {
    let v = string(value)?;
    if v.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(v)
}

fn path(value: &Value, base: &Path) -> Result<PathBuf, String> {
    let v = non_empty(value)?;
    Ok(base.join(v))
}

fn boolean(value: &Value) -> Result<bool, String> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(format!("expected true or false, found {}", describe(other))),
    }
}

fn whole_number(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(v), _) => Ok(v),
            (None, Some(v)) => Err(format!("{v} is negative")),
            _ => Err(format!("expected a whole number, found `{n}`")),
        },
        other => Err(format!(
            "expected a whole number, found {}",
            describe(other)
        )),
    }
}

/// A list of names, or one comma-separated text (as the flag takes).
fn string_list(value: &Value) -> Result<Vec<String>, String> {
    match value {
        Value::Sequence(items) => items.iter().map(string).collect(),
        Value::String(s) => Ok(s.split(',').map(|n| n.trim().to_string()).collect()),
        other => Err(format!(
            "expected a list of names, found {}",
            describe(other)
        )),
    }
}

/// `key:value;key:value` text, or a mapping `{ key: value }` (turned into that text).
fn attributes(value: &Value) -> Result<String, String> {
    match value {
        Value::Mapping(map) => {
            let mut parts = Vec::new();
            for (k, v) in map {
                let (k, v) = (string(k)?, string(v)?);
                if k.contains([':', ';']) || v.contains(';') {
                    return Err(format!(
                        "`{k}: {v}`: keys hold no `:` or `;` and values no `;`"
                    ));
                }
                parts.push(format!("{k}:{v}"));
            }
            Ok(parts.join(";"))
        }
        other => string(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    const BASE: &str = "/etc/ringmaster";

    fn parsed(text: &str) -> Result<AgentArgs, String> {
        parse(text, "agent.yaml", Path::new(BASE)).map_err(|e| e.to_string())
    }

    fn error(text: &str) -> String {
        parsed(text).unwrap_err()
    }

    const FULL: &str = "\
master: m.example:5050
id: gpu-7
resources: cpus:8;mem:4096;fpgas:2
custom_resources: [fpgas]
device_selection: most-used-that-fits
attributes: { partition: gpu, rack: r1 }
work_dir: work
hostname: node7
tls_ca: /pki/ca.pem
tls_cert: client.pem
tls_key: client.key
principal: agents
secret_file: secret
task_user: runner
allow_root_tasks: true
isolation: cgroups
pids_per_task: 512
max_task_pids: 2048
default_task_resources: cpus:0.25;mem:64
sandbox_gc_delay: 30m
disk_watermark: 0.8
kill_grace: 10s
usage_interval: 30s
gpu_sharing: mps
mps_pipe_dir: /run/mps
mps_start: true
";

    #[test]
    fn every_key_is_read() {
        let a = parsed(FULL).unwrap();
        assert_eq!(a.master.as_deref(), Some("m.example:5050"));
        assert_eq!(a.id.as_deref(), Some("gpu-7"));
        assert_eq!(a.resources.as_deref(), Some("cpus:8;mem:4096;fpgas:2"));
        assert_eq!(a.custom_resources, vec!["fpgas".to_string()]);
        assert_eq!(a.device_selection.as_deref(), Some("most-used-that-fits"));
        assert_eq!(a.attributes.as_deref(), Some("partition:gpu;rack:r1"));
        // Relative paths are the file's directory's.
        assert_eq!(a.work_dir, Some(PathBuf::from("/etc/ringmaster/work")));
        assert_eq!(a.tls_ca, Some(PathBuf::from("/pki/ca.pem")));
        assert_eq!(
            a.tls_cert,
            Some(PathBuf::from("/etc/ringmaster/client.pem"))
        );
        assert_eq!(a.secret_file, Some(PathBuf::from("/etc/ringmaster/secret")));
        assert_eq!(a.hostname.as_deref(), Some("node7"));
        assert_eq!(a.principal.as_deref(), Some("agents"));
        assert_eq!(a.task_user.as_deref(), Some("runner"));
        assert!(a.allow_root_tasks && a.mps_start);
        assert_eq!(a.isolation.as_deref(), Some("cgroups"));
        assert_eq!(a.pids_per_task, Some(512));
        assert_eq!(a.max_task_pids, Some(2048));
        assert_eq!(
            a.default_task_resources.as_deref(),
            Some("cpus:0.25;mem:64")
        );
        assert_eq!(a.sandbox_gc_delay.as_deref(), Some("30m"));
        assert_eq!(a.disk_watermark, Some(0.8));
        assert_eq!(a.kill_grace.as_deref(), Some("10s"));
        assert_eq!(a.usage_interval.as_deref(), Some("30s"));
        assert_eq!(a.gpu_sharing.as_deref(), Some("mps"));
        assert_eq!(a.mps_pipe_dir, Some(PathBuf::from("/run/mps")));
        // Every key of KEYS appears in FULL, so this test covers them all.
        for key in KEYS {
            assert!(
                FULL.contains(&format!("\n{key}:")) || FULL.starts_with(key),
                "{key}"
            );
        }
    }

    #[test]
    fn every_flag_is_a_key() {
        use clap::CommandFactory as _;
        let flags: Vec<String> = AgentArgs::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| l.replace('-', "_")))
            .filter(|l| l != "config" && l != "help" && l != "version")
            .collect();
        for flag in &flags {
            assert!(KEYS.contains(&flag.as_str()), "--{flag} has no config key");
        }
        assert_eq!(flags.len(), KEYS.len());
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        let a = parsed("# nothing yet\n").unwrap();
        assert!(a.master.is_none() && a.resources.is_none() && !a.mps_start);
        let err = error("- master\n");
        assert_eq!(
            err,
            "agent.yaml:1: expected a mapping of keys, found a list"
        );
    }

    #[test]
    fn an_unknown_key_is_refused_at_its_line() {
        assert_eq!(
            error("master: h:1\nkill_grace_ms: 500\n"),
            "agent.yaml:2: kill_grace_ms: unknown key (did you mean `kill_grace`?)"
        );
        let err = error("master: h:1\n\nfrobnicate: yes\n");
        assert!(
            err.starts_with("agent.yaml:3: frobnicate: unknown key (known keys: master, id,"),
            "{err}"
        );
        assert_eq!(
            error("isolaton: none\n"),
            "agent.yaml:1: isolaton: unknown key (did you mean `isolation`?)"
        );
    }

    #[test]
    fn ranges_are_named_at_the_line() {
        for (text, expected) in [
            (
                "master: h:1\npids_per_task: 15\n",
                "agent.yaml:2: pids_per_task: 15 is out of range (16 - 4194304)",
            ),
            (
                "pids_per_task: 4194305\n",
                "agent.yaml:1: pids_per_task: 4194305 is out of range (16 - 4194304)",
            ),
            (
                "pids_per_task: -1\n",
                "agent.yaml:1: pids_per_task: -1 is negative",
            ),
            (
                "pids_per_task: many\n",
                "agent.yaml:1: pids_per_task: expected a whole number, found the string `many`",
            ),
            (
                "kill_grace: 50ms\n",
                "agent.yaml:1: kill_grace: `50ms`: out of range (100ms - 1 day)",
            ),
            (
                "\nkill_grace: 25h\n",
                "agent.yaml:2: kill_grace: `25h`: out of range (100ms - 1 day)",
            ),
            (
                "kill_grace: 3\n",
                "agent.yaml:1: kill_grace: expected a duration with a unit (ms, s, m, h), e.g. `3s`, found `3`",
            ),
            (
                "kill_grace: 2d\n",
                "agent.yaml:1: kill_grace: `2d`: unknown unit `d` (expected ms, s, m or h, e.g. `3s`)",
            ),
            (
                "usage_interval: 500ms\n",
                "agent.yaml:1: usage_interval: `500ms`: out of range (1s - 1h)",
            ),
            (
                "usage_interval: 10\n",
                "agent.yaml:1: usage_interval: expected a duration with a unit (ms, s, m, h), e.g. `10s`, found `10`",
            ),
            (
                "max_task_pids: 63\n",
                "agent.yaml:1: max_task_pids: 63 is out of range (64 - 4194304)",
            ),
            (
                "master: h:1\nmax_task_pids: 4194305\n",
                "agent.yaml:2: max_task_pids: 4194305 is out of range (64 - 4194304)",
            ),
            (
                "max_task_pids: lots\n",
                "agent.yaml:1: max_task_pids: expected a whole number, found the string `lots`",
            ),
            (
                "default_task_resources: cpus:0.1;mem:32;disk:100\n",
                "agent.yaml:1: default_task_resources: `cpus:0.1;mem:32;disk:100`: `disk` cannot be given (both cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
            ),
            (
                "default_task_resources: cpus:0;mem:32\n",
                "agent.yaml:1: default_task_resources: `cpus:0;mem:32`: `cpus` must be more than 0 (both cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
            ),
            (
                "default_task_resources: mem:32\n",
                "agent.yaml:1: default_task_resources: `mem:32`: names no `cpus` (both cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)",
            ),
            (
                "sandbox_gc_delay: 721h\n",
                "agent.yaml:1: sandbox_gc_delay: `721h`: out of range (0s - 720h, i.e. 30 days)",
            ),
            (
                "sandbox_gc_delay: 0\n",
                "agent.yaml:1: sandbox_gc_delay: expected a duration with a unit (ms, s, m, h), e.g. `1h`, found `0`",
            ),
            (
                "sandbox_gc_delay: 2d\n",
                "agent.yaml:1: sandbox_gc_delay: `2d`: unknown unit `d` (expected ms, s, m or h, e.g. `3s`)",
            ),
            (
                "disk_watermark: 0\n",
                "agent.yaml:1: disk_watermark: 0 is out of range (more than 0, at most 1)",
            ),
            (
                "\ndisk_watermark: 1.5\n",
                "agent.yaml:2: disk_watermark: 1.5 is out of range (more than 0, at most 1)",
            ),
            (
                "disk_watermark: .nan\n",
                "agent.yaml:1: disk_watermark: NaN is out of range (more than 0, at most 1)",
            ),
            (
                "disk_watermark: 90%\n",
                "agent.yaml:1: disk_watermark: expected a number, found the string `90%`",
            ),
        ] {
            assert_eq!(error(text), expected, "{text}");
        }
    }

    #[test]
    fn safeguard_keys_make_the_config() {
        let file = parsed(
            "master: m:5050\ndefault_task_resources: none\nsandbox_gc_delay: 0s\n\
             disk_watermark: 1\nmax_task_pids: 64\npids_per_task: 128\n",
        )
        .unwrap();
        let args = cli(&["--work-dir", "/tmp/x", "--resources", "cpus:1;mem:64"]).over(file);
        let isolation = crate::config::isolation_from_args(&args).unwrap();
        assert_eq!((isolation.pids_per_task, isolation.max_task_pids), (64, 64));
        let config = crate::AgentConfig::from_args(args).unwrap();
        assert_eq!(config.safeguards.default_task_resources, None);
        assert_eq!(
            config.safeguards.sandbox_gc_delay,
            std::time::Duration::ZERO
        );
        assert_eq!(config.safeguards.disk_watermark, 1.0);
        // The command line wins over the file.
        let file =
            parsed("master: m:5050\ndefault_task_resources: none\ndisk_watermark: 0.5\n").unwrap();
        let args = cli(&[
            "--default-task-resources",
            "cpus:1;mem:128",
            "--disk-watermark",
            "0.75",
            "--sandbox-gc-delay",
            "2h",
        ])
        .over(file);
        let config = crate::AgentConfig::from_args(args).unwrap();
        assert_eq!(
            config.safeguards.default_task_resources,
            Some(ringmaster_proto::resources::Resources::parse("cpus:1;mem:128").unwrap())
        );
        assert_eq!(config.safeguards.disk_watermark, 0.75);
        assert_eq!(
            config.safeguards.sandbox_gc_delay,
            std::time::Duration::from_secs(7200)
        );
    }

    #[test]
    fn master_may_be_a_list_of_masters() {
        let one = parsed("master: m:5050\n").unwrap();
        assert_eq!(one.master.as_deref(), Some("m:5050"));
        let commas = parsed("master: a:5050, b:5050,c:5050\n").unwrap();
        assert_eq!(commas.master.as_deref(), Some("a:5050, b:5050,c:5050"));
        let yaml_list = parsed("master: [a:5050, b:5050]\n").unwrap();
        assert_eq!(yaml_list.master.as_deref(), Some("a:5050,b:5050"));
        let block = parsed("master:\n  - a:5050\n  - b:5050\n  - c:5050\n").unwrap();
        assert_eq!(block.master.as_deref(), Some("a:5050,b:5050,c:5050"));
        let merged = crate::AgentConfig::from_args(AgentArgs {
            resources: Some("cpus:1;mem:64;disk:0".into()),
            work_dir: Some(PathBuf::from("/tmp/w")),
            hostname: Some("h".into()),
            ..commas
        })
        .unwrap();
        assert_eq!(merged.master, "a:5050,b:5050,c:5050");
        let err = error("master: [a:5050, nope]\n");
        assert!(
            err.starts_with(
                "agent.yaml:1: master: `a:5050,nope`: entry `nope`: expected HOST:PORT"
            ),
            "{err}"
        );
        let err = error("master: [a:5050, [b]]\n");
        assert!(err.contains("expected text, found a list"), "{err}");
    }

    #[test]
    fn bad_values_are_named_at_their_line() {
        for (text, expected) in [
            ("master: localhost\n", "agent.yaml:1: master: `localhost`: expected HOST:PORT"),
            ("id: ../x\n", "agent.yaml:1: id: `../x`: character '/' is not allowed"),
            ("isolation: strict\n", "agent.yaml:1: isolation: `strict` is not an isolation level (expected auto, cgroups or none)"),
            ("gpu_sharing: mig\n", "agent.yaml:1: gpu_sharing: `mig` is not a GPU sharing mode (expected none or mps)"),
            ("allow_root_tasks: yes please\n", "agent.yaml:1: allow_root_tasks: expected true or false"),
            ("mps_start: 1\n", "agent.yaml:1: mps_start: expected true or false, found `1`"),
            ("device_selection: random\n", "agent.yaml:1: device_selection: `random`"),
            ("resources: cpus:4;mem:lots\n", "agent.yaml:1: resources: `cpus:4;mem:lots`"),
            ("resources: cpu:4\n", "agent.yaml:1: resources: `cpu:4`: unknown resource `cpu` (did you mean `cpus`?)"),
            ("custom_resources: [cpus]\n", "agent.yaml:1: custom_resources: `cpus` is a standard resource"),
            ("attributes: rack\n", "agent.yaml:1: attributes: `rack` is not `key:value`"),
            ("attributes: { rack: 'a;b' }\n", "agent.yaml:1: attributes: `rack: a;b`"),
            ("hostname: ''\n", "agent.yaml:1: hostname: must not be empty"),
            ("work_dir: [a]\n", "agent.yaml:1: work_dir: expected text, found a list"),
            ("master: [\n", "agent.yaml:2"),
        ] {
            let err = error(text);
            assert!(err.starts_with(expected), "{text}: {err}");
        }
        // Custom resource names of the file are known to its resources.
        assert!(parsed("custom_resources: fpgas\nresources: fpgas:1\n").is_ok());
    }

    fn cli(argv: &[&str]) -> AgentArgs {
        let mut all = vec!["ringmaster-agent"];
        all.extend_from_slice(argv);
        AgentArgs::try_parse_from(all).unwrap()
    }

    #[test]
    fn flags_override_the_file() {
        let file = parsed(FULL).unwrap();
        let merged = cli(&[
            "--master",
            "flag:1",
            "--kill-grace",
            "1s",
            "--custom-resources",
            "tpus",
            "--isolation",
            "none",
        ])
        .over(file.clone());
        assert_eq!(merged.master.as_deref(), Some("flag:1"));
        assert_eq!(merged.kill_grace.as_deref(), Some("1s"));
        assert_eq!(merged.custom_resources, vec!["tpus".to_string()]);
        assert_eq!(merged.isolation.as_deref(), Some("none"));
        // What the command line leaves out comes from the file.
        assert_eq!(merged.pids_per_task, Some(512));
        assert_eq!(merged.gpu_sharing.as_deref(), Some("mps"));
        assert_eq!(merged.hostname.as_deref(), Some("node7"));
        assert!(merged.allow_root_tasks);
        // Nothing on the command line: the file as it is.
        let only_file = cli(&[]).over(file);
        assert_eq!(only_file.master.as_deref(), Some("m.example:5050"));
        assert_eq!(only_file.kill_grace.as_deref(), Some("10s"));
        assert_eq!(only_file.custom_resources, vec!["fpgas".to_string()]);
    }

    #[test]
    fn the_merged_flags_make_a_config() {
        let file = parsed(
            "master: m:5050\nresources: cpus:2;mem:128;gpus:2x16384\nkill_grace: 5s\n\
             gpu_sharing: mps\nmps_start: true\npids_per_task: 64\n",
        )
        .unwrap();
        let args = cli(&["--kill-grace", "750ms", "--work-dir", "/tmp/x"]).over(file);
        let isolation = crate::config::isolation_from_args(&args).unwrap();
        assert_eq!(isolation.pids_per_task, 64);
        let config = crate::AgentConfig::from_args(args).unwrap();
        assert_eq!(config.master, "m:5050");
        assert_eq!(config.kill_grace, std::time::Duration::from_millis(750));
        assert_eq!(config.devices.len(), 2);
        assert_eq!(config.gpu_sharing.mode, GpuSharingMode::Mps);
        assert!(config.gpu_sharing.start);
        assert_eq!(
            config.gpu_sharing.pipe_dir,
            Path::new(crate::mps::DEFAULT_PIPE_DIR)
        );
        // Without a master anywhere, the merged flags are refused.
        let err = format!(
            "{:#}",
            crate::AgentConfig::from_args(cli(&[]).over(parsed("kill_grace: 5s\n").unwrap()))
                .unwrap_err()
        );
        assert!(err.contains("the master's address is required"), "{err}");
    }

    #[test]
    fn read_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.yaml");
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(err.contains("cannot read it"), "{err}");
        std::fs::write(&path, "master: h:1\nwork_dir: w\npids_per_task: 8\n").unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert_eq!(
            err,
            format!(
                "{}:3: pids_per_task: 8 is out of range (16 - 4194304)",
                path.display()
            )
        );
        std::fs::write(&path, "master: h:1\nwork_dir: w\n").unwrap();
        let args = read(&path).unwrap();
        assert_eq!(args.work_dir, Some(dir.path().join("w")));
    }
}
