//! The isolation settings (`--isolation`, `--pids-per-task`, `--max-task-pids`): the mode and
//! the process limits, with their defaults and allowed ranges.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// Default of `--pids-per-task`.
pub const DEFAULT_PIDS_PER_TASK: u64 = 4096;
/// The values `--pids-per-task` accepts.
pub const PIDS_PER_TASK_RANGE: RangeInclusive<u64> = 16..=4_194_304;
/// The values `--max-task-pids` accepts.
pub const MAX_TASK_PIDS_RANGE: RangeInclusive<u64> = 64..=4_194_304;
/// The `pid_max` assumed when `/proc/sys/kernel/pid_max` cannot be read (the kernel's default).
pub const FALLBACK_PID_MAX: u64 = 32_768;
/// Where the kernel's `pid_max` is read.
const PID_MAX_FILE: &str = "/proc/sys/kernel/pid_max";

/// `--isolation`: how tasks are kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationMode {
    /// cgroups when the agent runs as root and the hierarchy is writable, else none (with one
    /// warning at startup).
    #[default]
    Auto,
    /// Every task in its own cgroup; the agent does not start when cgroups are unusable.
    Cgroups,
    /// Process groups only (the behaviour before cgroups).
    None,
}

impl FromStr for IsolationMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IsolationMode::Auto),
            "cgroups" => Ok(IsolationMode::Cgroups),
            "none" => Ok(IsolationMode::None),
            _ => Err(format!(
                "`{s}` is not an isolation level (expected auto, cgroups or none)"
            )),
        }
    }
}

impl fmt::Display for IsolationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IsolationMode::Auto => "auto",
            IsolationMode::Cgroups => "cgroups",
            IsolationMode::None => "none",
        })
    }
}

/// The isolation settings of one agent (`--isolation`, `--pids-per-task`, `--max-task-pids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationConfig {
    pub mode: IsolationMode,
    /// The most processes (and threads) one task may have at once (held to at most
    /// `max_task_pids`).
    pub pids_per_task: u64,
    /// The most processes (and threads) all tasks together may have at once: the pids limit
    /// of the agent's cgroup. Default: half of the kernel's `pid_max`
    /// ([`default_max_task_pids`]).
    pub max_task_pids: u64,
}

impl Default for IsolationConfig {
    /// `auto`, 4096 processes per task, half of `pid_max` in all (reads
    /// `/proc/sys/kernel/pid_max`).
    fn default() -> Self {
        let max_task_pids = default_max_task_pids();
        IsolationConfig {
            mode: IsolationMode::Auto,
            pids_per_task: DEFAULT_PIDS_PER_TASK.min(max_task_pids),
            max_task_pids,
        }
    }
}

/// The default of `--max-task-pids` given the text of `/proc/sys/kernel/pid_max` (`None`:
/// unreadable): half of it, half of [`FALLBACK_PID_MAX`] when it is unreadable or not a
/// number, kept within [`MAX_TASK_PIDS_RANGE`].
pub fn max_task_pids_for(pid_max: Option<&str>) -> u64 {
    let pid_max = pid_max
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(FALLBACK_PID_MAX);
    (pid_max / 2).clamp(*MAX_TASK_PIDS_RANGE.start(), *MAX_TASK_PIDS_RANGE.end())
}

/// The default of `--max-task-pids` on this machine: half of `/proc/sys/kernel/pid_max`
/// (16384 when it cannot be read).
pub fn default_max_task_pids() -> u64 {
    max_task_pids_for(std::fs::read_to_string(PID_MAX_FILE).ok().as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_task_pids_defaults_to_half_of_pid_max() {
        assert_eq!(max_task_pids_for(Some("32768\n")), 16_384);
        assert_eq!(max_task_pids_for(Some("4194304")), 2_097_152);
        assert_eq!(max_task_pids_for(Some("301")), 150);
        assert_eq!(max_task_pids_for(Some("100")), 64);
        assert_eq!(max_task_pids_for(None), 16_384);
        assert_eq!(max_task_pids_for(Some("lots")), 16_384);
        assert_eq!(max_task_pids_for(Some("0")), 16_384);
        assert!(MAX_TASK_PIDS_RANGE.contains(&default_max_task_pids()));
        let config = IsolationConfig::default();
        assert!(config.pids_per_task <= config.max_task_pids);
    }

    #[test]
    fn isolation_levels_parse_and_bad_ones_name_the_choices() {
        assert_eq!("auto".parse(), Ok(IsolationMode::Auto));
        assert_eq!("cgroups".parse(), Ok(IsolationMode::Cgroups));
        assert_eq!("none".parse(), Ok(IsolationMode::None));
        let err = "cgroup".parse::<IsolationMode>().unwrap_err();
        assert!(err.contains("auto, cgroups or none"), "{err}");
        for mode in [
            IsolationMode::Auto,
            IsolationMode::Cgroups,
            IsolationMode::None,
        ] {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
        assert_eq!(IsolationMode::default(), IsolationMode::Auto);
    }
}
