//! Parsers and range checks of single flag values, shared by the command line
//! ([`crate::config`]) and the config file ([`crate::config_file`]).

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use ringmaster_proto::resources::{check_known_names, Resources, STANDARD_NAMES};

use crate::isolation_config::{MAX_TASK_PIDS_RANGE, PIDS_PER_TASK_RANGE};

/// The values `--kill-grace` accepts.
pub const KILL_GRACE_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(100)..=Duration::from_secs(24 * 3600);
/// The values `--sandbox-gc-delay` accepts: 0s (collect at once) to 30 days.
pub const SANDBOX_GC_DELAY_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::ZERO..=Duration::from_secs(30 * 24 * 3600);
/// The resources `--default-task-resources` may name.
pub const DEFAULT_TASK_RESOURCE_NAMES: [&str; 2] = ["cpus", "mem"];

/// The MPS pipe directory travels to tasks (whose working directory is their sandbox), so it
/// must be absolute.
pub(crate) fn check_pipe_dir(dir: &Path) -> Result<(), String> {
    if dir.is_absolute() {
        Ok(())
    } else {
        Err(format!("`{}` is not an absolute path", dir.display()))
    }
}

/// Parses a kill grace and checks its range (100ms - 1 day).
pub(crate) fn check_kill_grace(text: &str) -> Result<Duration, String> {
    let grace = parse_duration(text).map_err(|e| e.to_string())?;
    if !KILL_GRACE_RANGE.contains(&grace) {
        return Err("out of range (100ms - 1 day)".into());
    }
    Ok(grace)
}

/// Checks `--pids-per-task` against its range.
pub(crate) fn check_pids_per_task(n: u64) -> Result<u64, String> {
    if PIDS_PER_TASK_RANGE.contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} is out of range ({} - {})",
            PIDS_PER_TASK_RANGE.start(),
            PIDS_PER_TASK_RANGE.end()
        ))
    }
}

/// Checks `--max-task-pids` against its range.
pub(crate) fn check_max_task_pids(n: u64) -> Result<u64, String> {
    if MAX_TASK_PIDS_RANGE.contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} is out of range ({} - {})",
            MAX_TASK_PIDS_RANGE.start(),
            MAX_TASK_PIDS_RANGE.end()
        ))
    }
}

/// Parses `--default-task-resources`: `none` (`Ok(None)`), or `cpus` and `mem` (both, each more
/// than 0, nothing else).
pub(crate) fn check_default_task_resources(text: &str) -> Result<Option<Resources>, String> {
    const ALLOWED: &str = "both cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`";
    let spec = text.trim();
    if spec == "none" {
        return Ok(None);
    }
    let resources = Resources::parse(spec).map_err(|e| e.to_string())?;
    let zeros = zero_dimensions(spec);
    for name in resources.names().chain(zeros.iter().map(String::as_str)) {
        if !DEFAULT_TASK_RESOURCE_NAMES.contains(&name) {
            return Err(format!("`{name}` cannot be given ({ALLOWED})"));
        }
    }
    if let Some(name) = zeros.first() {
        return Err(format!("`{name}` must be more than 0 ({ALLOWED})"));
    }
    for name in DEFAULT_TASK_RESOURCE_NAMES {
        if resources.milli(name) == 0 {
            return Err(format!("names no `{name}` ({ALLOWED})"));
        }
    }
    Ok(Some(resources))
}

/// Parses `--sandbox-gc-delay` and checks its range (0s - 30 days).
pub(crate) fn check_sandbox_gc_delay(text: &str) -> Result<Duration, String> {
    let delay = parse_duration(text).map_err(|e| e.to_string())?;
    if !SANDBOX_GC_DELAY_RANGE.contains(&delay) {
        return Err("out of range (0s - 720h, i.e. 30 days)".into());
    }
    Ok(delay)
}

/// Checks `--disk-watermark`: more than 0, at most 1.
pub(crate) fn check_disk_watermark(fraction: f64) -> Result<f64, String> {
    // Written so that NaN fails too.
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(fraction)
    } else {
        Err(format!(
            "{fraction} is out of range (more than 0, at most 1)"
        ))
    }
}

/// Checks the names of `--custom-resources`: resource-name syntax (a letter, then letters,
/// digits, `_` and `-`), not a standard name, none twice. Returns every name `--resources`
/// may use (the standard ones and these).
pub(crate) fn check_custom_resources(names: &[String]) -> Result<Vec<String>, String> {
    let mut known: Vec<String> = STANDARD_NAMES.iter().map(|n| n.to_string()).collect();
    for raw in names {
        let name = raw.trim();
        let mut chars = name.chars();
        let valid = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(format!(
                "`{name}` is not a valid resource name (letters, digits, `_` and `-`, starting \
                 with a letter)"
            ));
        }
        if STANDARD_NAMES.contains(&name) {
            return Err(format!(
                "`{name}` is a standard resource; declare only other names"
            ));
        }
        if known.iter().any(|k| k == name) {
            return Err(format!("`{name}` appears more than once"));
        }
        known.push(name.to_string());
    }
    Ok(known)
}

/// Refuses a name of `--resources` (with an amount, or given as zero) outside `known`, with
/// the core's "did you mean" hint.
pub(crate) fn check_resource_names(
    given: &Resources,
    zeros: &[String],
    known: &[String],
) -> Result<(), String> {
    let mut named = given.clone();
    for name in zeros {
        // A zero amount is not kept in a bundle; count it so `cpu:0` is caught too.
        named.set_milli(name, 1);
    }
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    if let Err(message) = check_known_names(&named, &known) {
        return Err(format!(
            "{message} (declare other names with --custom-resources NAME,NAME)"
        ));
    }
    Ok(())
}

/// `500ms`, `3s`, `2m`, `1h`: a whole number and a unit.
pub(crate) fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let Ok(number) = number.parse::<u64>() else {
        bail!("expected a whole number and a unit (ms, s, m, h), e.g. `3s`");
    };
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => bail!("unknown unit `{unit}` (expected ms, s, m or h, e.g. `3s`)"),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .context("too long")
}

/// A master list, `HOST:PORT[,HOST:PORT...]` ([`ringmaster_proto::masters::parse_master_list`]).
pub(crate) fn check_master_address(master: &str) -> Result<(), String> {
    ringmaster_proto::masters::parse_master_list(master).map(|_| ())
}

/// Agent ids travel in file names and update ids, so they stay plain.
pub(crate) fn check_agent_id(id: &str) -> anyhow::Result<()> {
    if id.is_empty() {
        bail!("the agent id is empty");
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        bail!("character {c:?} is not allowed in an agent id (letters, digits, `-`, `_`, `.`)");
    }
    Ok(())
}

/// Names whose amount is written as zero (`disk:0`, `gpus:0.0`) in a spec that parsed.
pub(crate) fn zero_dimensions(spec: &str) -> Vec<String> {
    spec.split(';')
        .filter_map(|part| part.split_once(':'))
        .filter(|(_, amount)| {
            let amount = amount.trim();
            !amount.is_empty() && amount.chars().all(|c| c == '0' || c == '.')
        })
        .map(|(name, _)| name.trim().to_string())
        .collect()
}

/// Parses `key:value;key:value`. Keys are letters, digits, `_`, `-`, `.`; values are any
/// non-empty text without `;`. An empty spec is no attributes.
pub fn parse_attributes(spec: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    if spec.trim().is_empty() {
        return Ok(out);
    }
    for raw in spec.split(';') {
        let part = raw.trim();
        let Some((key, value)) = part.split_once(':') else {
            bail!("`{part}` is not `key:value`");
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            bail!("`{part}`: the key is empty");
        }
        if let Some(c) = key
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            bail!("`{part}`: character {c:?} is not allowed in a key (letters, digits, `_`, `-`, `.`)");
        }
        if value.is_empty() {
            bail!("`{part}`: the value is empty");
        }
        if out.iter().any(|(k, _)| k == key) {
            bail!("`{key}` appears more than once");
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}
