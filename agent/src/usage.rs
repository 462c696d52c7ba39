//! Task usage (`--usage-interval`): every interval the agent samples what each running task
//! uses and sends one `UsageReport` to the master (docs/protocol.md, "Task usage").
//!
//! With cgroups the figures are the task cgroup's, read from the files of the hierarchies
//! `cgroups-rs` finds ([`crate::isolation::Isolation::task_usage_dirs`]): CPU time from
//! `cpuacct.usage` (v1) or `usage_usec` of `cpu.stat` (v2); memory in use from
//! `memory.usage_in_bytes` minus the page cache of `memory.stat` (v1) or `memory.current` (v2);
//! the peak from `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2, kernels from 5.19).
//! Without cgroups they come from `/proc`, summed over the processes of the task's process
//! group (the leader is the agent's small `sh` wrapper, which uses next to nothing itself):
//! `utime + stime + cutime + cstime` of each member (so children already reaped count), the sum
//! of their `VmRSS`, and the sum of their `VmHWM` as the peak (an upper bound: each member's
//! own peak). A process that left the group (`setsid`) is not counted without cgroups.
//!
//! The parsers are pure functions over file contents; reading runs on the blocking pool, off
//! the session loop ([`spawn_sample`]).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use ringmaster_proto::{TaskUsage, UsageReport};

use crate::flag_checks::parse_duration;
use crate::isolation::{CgroupDirs, Isolation};

/// Default of `--usage-interval`.
pub const DEFAULT_USAGE_INTERVAL: Duration = Duration::from_secs(10);
/// The values `--usage-interval` accepts.
pub const USAGE_INTERVAL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

/// One running task to sample: its key and its process group (leader pid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub framework_id: String,
    pub task_id: String,
    pub pgid: u32,
}

/// What one sample found (all figures since the task started, memory in bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub peak_bytes: u64,
}

/// A whole number file (`cpuacct.usage`, `memory.current`, …); `None` for anything else
/// (`max` included).
pub fn parse_number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The value of `key` in a flat-keyed file (`cpu.stat`, `memory.stat`): lines `KEY VALUE`.
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key))
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

/// CPU seconds of a v1 `cpuacct.usage` (nanoseconds).
pub fn cpu_seconds_v1(cpuacct_usage: &str) -> Option<f64> {
    parse_number(cpuacct_usage).map(|ns| ns as f64 / 1e9)
}

/// CPU seconds of a v2 `cpu.stat` (`usage_usec`).
pub fn cpu_seconds_v2(cpu_stat: &str) -> Option<f64> {
    parse_keyed(cpu_stat, "usage_usec").map(|us| us as f64 / 1e6)
}

/// Memory in use on v1: `memory.usage_in_bytes` minus the page cache (`total_cache`, else
/// `cache`, of `memory.stat`), never below 0.
pub fn memory_v1(usage_in_bytes: &str, memory_stat: Option<&str>) -> Option<u64> {
    let usage = parse_number(usage_in_bytes)?;
    let cache = memory_stat
        .and_then(|s| parse_keyed(s, "total_cache").or_else(|| parse_keyed(s, "cache")))
        .unwrap_or(0);
    Some(usage.saturating_sub(cache))
}

/// One process of `/proc/PID/stat`: its process group and its CPU ticks (own and reaped
/// children's: `utime + stime + cutime + cstime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pgrp: u32,
    pub ticks: u64,
}

/// Parses `/proc/PID/stat`. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
pub fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): field N is fields[N - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let pgrp = u32::try_from(field(5)?).ok()?;
    let ticks = [14, 15, 16, 17]
        .into_iter()
        .map(field)
        .try_fold(0u64, |sum, t| Some(sum.saturating_add(t?)))?;
    Some(ProcStat { pgrp, ticks })
}

/// A `kB` line of `/proc/PID/status` (`VmRSS:  1234 kB`) in bytes; `None` when absent (kernel
/// threads, zombies).
pub fn parse_status_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = value.split_whitespace().next()?.parse().ok()?;
        Some(kb.saturating_mul(1024))
    })
}

/// Clock ticks per second (`/proc` CPU times are in ticks).
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file)).ok()
}

/// One task's figures from its cgroup's files; `None` when nothing could be read (the cgroup
/// is gone).
pub fn sample_cgroup(dirs: &CgroupDirs) -> Option<Sample> {
    let cpu = dirs.cpu.as_deref().and_then(|dir| {
        if dirs.v2 {
            cpu_seconds_v2(&read(dir, "cpu.stat")?)
        } else {
            cpu_seconds_v1(&read(dir, "cpuacct.usage")?)
        }
    });
    let (rss, peak) = match dirs.memory.as_deref() {
        Some(dir) if dirs.v2 => (
            read(dir, "memory.current").and_then(|t| parse_number(&t)),
            read(dir, "memory.peak").and_then(|t| parse_number(&t)),
        ),
        Some(dir) => (
            read(dir, "memory.usage_in_bytes")
                .and_then(|u| memory_v1(&u, read(dir, "memory.stat").as_deref())),
            read(dir, "memory.max_usage_in_bytes").and_then(|t| parse_number(&t)),
        ),
        None => (None, None),
    };
    if cpu.is_none() && rss.is_none() {
        return None;
    }
    Some(Sample {
        cpu_seconds: cpu.unwrap_or(0.0),
        rss_bytes: rss.unwrap_or(0),
        peak_bytes: peak.unwrap_or(0),
    })
}

/// Figures per process group, from one pass over `/proc`, for the groups in `wanted`.
pub fn sample_process_groups(proc_dir: &Path, wanted: &[u32]) -> HashMap<u32, Sample> {
    let mut out: HashMap<u32, Sample> = HashMap::new();
    if wanted.is_empty() {
        return out;
    }
    let hz = clock_ticks();
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Some(stat) = read(&entry.path(), "stat").and_then(|t| parse_proc_stat(&t)) else {
            continue;
        };
        if !wanted.contains(&stat.pgrp) {
            continue;
        }
        let status = read(&entry.path(), "status").unwrap_or_default();
        let sample = out.entry(stat.pgrp).or_default();
        sample.cpu_seconds += stat.ticks as f64 / hz;
        let rss = parse_status_kb(&status, "VmRSS").unwrap_or(0);
        sample.rss_bytes = sample.rss_bytes.saturating_add(rss);
        let peak = parse_status_kb(&status, "VmHWM").unwrap_or(rss);
        sample.peak_bytes = sample.peak_bytes.saturating_add(peak);
    }
    out
}

/// Samples every target: by its cgroup when isolation is on, else by its process group.
/// Tasks with nothing to read (already gone) are left out.
pub fn sample_all(isolation: &Isolation, targets: &[Target], now_ms: u64) -> UsageReport {
    let mut tasks = Vec::with_capacity(targets.len());
    let mut by_group = Vec::new();
    for target in targets {
        let dirs = isolation.task_usage_dirs(&target.framework_id, &target.task_id);
        match dirs.and_then(|d| sample_cgroup(&d)) {
            Some(sample) => tasks.push(usage(target, sample, now_ms)),
            None if !isolation.enabled() && target.pgid > 1 => by_group.push(target),
            None => {}
        }
    }
    if !by_group.is_empty() {
        let groups: Vec<u32> = by_group.iter().map(|t| t.pgid).collect();
        let samples = sample_process_groups(Path::new("/proc"), &groups);
        for target in by_group {
            if let Some(sample) = samples.get(&target.pgid) {
                tasks.push(usage(target, *sample, now_ms));
            }
        }
    }
    UsageReport { tasks }
}

fn usage(target: &Target, sample: Sample, now_ms: u64) -> TaskUsage {
    TaskUsage {
        framework_id: target.framework_id.clone(),
        task_id: target.task_id.clone(),
        cpu_seconds: sample.cpu_seconds,
        mem_rss_bytes: sample.rss_bytes,
        mem_peak_bytes: sample.peak_bytes.max(sample.rss_bytes),
        sampled_at_ms: now_ms,
    }
}

/// Samples `targets` on the blocking pool and sends the report on `reports` (an empty report
/// too, so the caller knows the sample is done). The session loop is never blocked.
pub fn spawn_sample(
    isolation: Isolation,
    targets: Vec<Target>,
    reports: tokio::sync::mpsc::UnboundedSender<UsageReport>,
) {
    tokio::task::spawn_blocking(move || {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        // The session may have ended meanwhile: nobody to send to then.
        let _ = reports.send(sample_all(&isolation, &targets, now_ms));
    });
}

/// What a finished sample sends to the master: one `UsageReport`, none when it is empty (every
/// task ended meanwhile).
pub fn report_message(report: UsageReport) -> Vec<ringmaster_proto::Message> {
    if report.tasks.is_empty() {
        Vec::new()
    } else {
        vec![ringmaster_proto::Message::UsageReport(report)]
    }
}

/// Parses `--usage-interval` / `usage_interval` and checks its range (1s - 1h).
pub fn check_usage_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text).map_err(|e| e.to_string())?;
    if !USAGE_INTERVAL_RANGE.contains(&interval) {
        return Err("out of range (1s - 1h)".into());
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_cpu_and_memory_files() {
        assert_eq!(cpu_seconds_v1("2500000000\n"), Some(2.5));
        assert_eq!(cpu_seconds_v1("garbage"), None);
        let stat = "cache 4096\nrss 1048576\nmapped_file 0\ntotal_cache 8192\ntotal_rss 1048576\n";
        assert_eq!(memory_v1("1060864\n", Some(stat)), Some(1060864 - 8192));
        // Without hierarchical totals, `cache`.
        assert_eq!(
            memory_v1("10000\n", Some("cache 4000\nrss 6000\n")),
            Some(6000)
        );
        // Never below zero, and the cache is optional.
        assert_eq!(memory_v1("100", Some("total_cache 4096\n")), Some(0));
        assert_eq!(memory_v1("100", None), Some(100));
        assert_eq!(parse_number("3145728\n"), Some(3145728));
    }

    #[test]
    fn v2_cpu_stat_and_memory_files() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n\
                    nr_periods 10\nnr_throttled 2\nthrottled_usec 5000\n";
        assert_eq!(cpu_seconds_v2(stat), Some(1.234567));
        assert_eq!(cpu_seconds_v2("user_usec 5\n"), None);
        // `usage_usec` must be the whole key, not a prefix of another.
        assert_eq!(
            parse_keyed("usage_usec_total 9\nusage_usec 7\n", "usage_usec"),
            Some(7)
        );
        assert_eq!(parse_number("max\n"), None);
        assert_eq!(parse_number("52428800\n"), Some(52428800));
    }

    #[test]
    fn proc_stat_fields_are_counted_after_the_command_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime ...
        let text = "4242 (my (odd) cmd) R 1 4240 4240 0 -1 4194304 100 0 0 0 \
                    150 50 7 3 20 0 1 0 12345 1000000 250 18446744073709551615\n";
        assert_eq!(
            parse_proc_stat(text),
            Some(ProcStat {
                pgrp: 4240,
                ticks: 150 + 50 + 7 + 3
            })
        );
        assert_eq!(parse_proc_stat("4242 (truncated) R 1 4240"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    #[test]
    fn proc_status_memory_lines() {
        let status = "Name:\tsh\nVmPeak:\t    8000 kB\nVmHWM:\t    3000 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(2048 * 1024));
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(3000 * 1024));
        // A zombie or kernel thread has none.
        assert_eq!(parse_status_kb("Name:\tkworker\n", "VmRSS"), None);
        // `VmRSS` is not matched by a longer key starting the same way.
        assert_eq!(parse_status_kb("VmRSSx:\t1 kB\n", "VmRSS"), None);
    }

    #[test]
    fn cgroup_files_in_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("cpu.stat"), "usage_usec 2000000\n").unwrap();
        std::fs::write(d.join("memory.current"), "1048576\n").unwrap();
        let v2 = CgroupDirs {
            v2: true,
            cpu: Some(d.to_path_buf()),
            memory: Some(d.to_path_buf()),
        };
        // No memory.peak (kernels before 5.19): the peak is unknown, reported as the current.
        assert_eq!(
            sample_cgroup(&v2),
            Some(Sample {
                cpu_seconds: 2.0,
                rss_bytes: 1048576,
                peak_bytes: 0
            })
        );
        std::fs::write(d.join("cpuacct.usage"), "500000000\n").unwrap();
        std::fs::write(d.join("memory.usage_in_bytes"), "3000\n").unwrap();
        std::fs::write(d.join("memory.stat"), "total_cache 1000\n").unwrap();
        std::fs::write(d.join("memory.max_usage_in_bytes"), "5000\n").unwrap();
        let v1 = CgroupDirs { v2: false, ..v2 };
        assert_eq!(
            sample_cgroup(&v1),
            Some(Sample {
                cpu_seconds: 0.5,
                rss_bytes: 2000,
                peak_bytes: 5000
            })
        );
        let gone = CgroupDirs {
            v2: true,
            cpu: Some(d.join("gone")),
            memory: Some(d.join("gone")),
        };
        assert_eq!(sample_cgroup(&gone), None);
    }

    #[test]
    fn process_groups_sum_their_members() {
        let dir = tempfile::tempdir().unwrap();
        let proc_dir = dir.path();
        let hz = clock_ticks() as u64;
        let member = |pid: u32, pgrp: u32, ticks: u64, rss_kb: u64| {
            let p = proc_dir.join(pid.to_string());
            std::fs::create_dir(&p).unwrap();
            std::fs::write(
                p.join("stat"),
                format!("{pid} (sh) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 1\n"),
            )
            .unwrap();
            std::fs::write(
                p.join("status"),
                format!(
                    "Name:\tsh\nVmHWM:\t{} kB\nVmRSS:\t{rss_kb} kB\n",
                    rss_kb * 2
                ),
            )
            .unwrap();
        };
        member(100, 100, hz, 1000);
        member(101, 100, 2 * hz, 500);
        member(200, 200, hz, 1);
        std::fs::create_dir(proc_dir.join("self")).unwrap();
        let samples = sample_process_groups(proc_dir, &[100]);
        assert_eq!(samples.len(), 1);
        let s = samples[&100];
        assert!((s.cpu_seconds - 3.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s.rss_bytes, 1500 * 1024);
        assert_eq!(s.peak_bytes, 3000 * 1024);
        assert!(sample_process_groups(proc_dir, &[]).is_empty());
    }

    #[test]
    fn the_interval_range() {
        assert_eq!(check_usage_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(check_usage_interval("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(check_usage_interval("10s"), Ok(DEFAULT_USAGE_INTERVAL));
        assert!(check_usage_interval("500ms")
            .unwrap_err()
            .contains("out of range"));
        assert!(check_usage_interval("61m")
            .unwrap_err()
            .contains("out of range"));
        assert!(check_usage_interval("10").is_err());
    }
}
