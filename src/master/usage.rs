//! Task usage as agents report it (`UsageReport`, docs/protocol.md "Task usage"): the latest
//! sample per running task, and the per-agent sums `/state` shows next to what is allocated.
//!
//! In memory only (never persisted: a restarted master waits for the next report), and only
//! for tasks that run and have been sampled: a side map keyed by the task, not a field of every
//! task record (docs/benchmarks.md, "Memory at scale"), whose entry goes when the task ends
//! ([`MasterState::finish_task`] calls [`UsageBook::forget`]).
//!
//! An agent is not trusted with more than its own running tasks: entries about other tasks
//! are ignored, a report holds at most as many entries as the agent runs tasks (the rest is
//! ignored), and figures that are not finite or out of range are dropped or clamped.
//!
//! Nor with its figures: an entry whose memory (rss or peak) is above the agent's total `mem`,
//! whose CPU seconds are below the task's held sample, or whose sample time is more than
//! [`MAX_CLOCK_SKEW_MS`] from the master's clock (the handler's `now`) is refused, counted in
//! `ringmaster_usage_reports_refused_total{reason}` and logged at most once a minute per agent
//! ([`WARN_EVERY`]; debug otherwise), so one bad agent cannot flood the log.

use std::collections::HashMap;

use ringmaster_proto::{TaskUsage, UsageReport};
use tokio::time::{Duration, Instant};

use super::ops::model::{AgentUsageView, TaskUsageView};
use super::state::{make_task_key, MasterState, TaskKey};

/// CPU seconds above this (about 31,700 core-years) are a bogus report.
const MAX_CPU_SECONDS: f64 = 1e12;
/// Cores above this are a bogus rate (clock or counter trouble).
const MAX_CORES: f64 = 1e6;
const MIB: f64 = 1024.0 * 1024.0;
/// A sample time further than this from the master's clock (either way) is refused: one day.
pub(crate) const MAX_CLOCK_SKEW_MS: u64 = 24 * 3600 * 1000;
/// At most one warning about refused entries per agent in this time; the rest go to debug.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why an entry of a report was not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Not counted: not finite or negative CPU seconds, or not newer than the held sample (a
    /// report overtaken by a later one).
    Unusable,
    /// Its sample time is more than [`MAX_CLOCK_SKEW_MS`] from the master's clock.
    TimeOutOfRange,
    /// Its rss or peak is above the agent's total `mem`.
    MemoryAboveTotal,
    /// Its CPU seconds are below the held sample's.
    CpuWentBackwards,
}

impl Refusal {
    /// The `reason` label of `usage_reports_refused_total`; `None`: not counted.
    fn label(self) -> Option<&'static str> {
        match self {
            Refusal::Unusable => None,
            Refusal::TimeOutOfRange => Some("time_out_of_range"),
            Refusal::MemoryAboveTotal => Some("memory_above_total"),
            Refusal::CpuWentBackwards => Some("cpu_went_backwards"),
        }
    }
}

/// What bounds an agent's entries: the master's clock and the agent's total memory.
struct Bounds {
    /// The master's clock, unix ms.
    now_ms: u64,
    /// The agent's total `mem` in bytes; `None`: it declares no `mem`, so nothing bounds it.
    mem_bytes: Option<u64>,
}

/// The latest sample of one task: 40 bytes, plus the map's key (48) and slot overhead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sample {
    pub cpu_seconds: f64,
    /// Cores used between the previous sample and this one; NaN until there are two.
    pub cpu_used: f32,
    pub rss_bytes: u64,
    pub peak_bytes: u64,
    pub sampled_at_ms: u64,
}

/// The latest sample of every sampled running task.
#[derive(Default)]
pub(crate) struct UsageBook {
    samples: HashMap<TaskKey, Sample>,
    /// When each agent was last warned about (only those warned within [`WARN_EVERY`]).
    warned: HashMap<String, Instant>,
}

impl UsageBook {
    pub fn get(&self, key: &TaskKey) -> Option<&Sample> {
        self.samples.get(key)
    }

    /// Drops a task's sample (it ended).
    pub fn forget(&mut self, key: &TaskKey) {
        self.samples.remove(key);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Records one entry of a report, or says why it is refused: non-finite or negative cpu,
    /// not newer than the sample held (both [`Refusal::Unusable`]), or one of the sanity
    /// rules of the module docs.
    fn record(&mut self, key: TaskKey, usage: &TaskUsage, bounds: &Bounds) -> Result<(), Refusal> {
        let cpu = usage.cpu_seconds;
        if !cpu.is_finite() || cpu < 0.0 {
            return Err(Refusal::Unusable);
        }
        if usage.sampled_at_ms.abs_diff(bounds.now_ms) > MAX_CLOCK_SKEW_MS {
            return Err(Refusal::TimeOutOfRange);
        }
        if bounds
            .mem_bytes
            .is_some_and(|total| usage.mem_rss_bytes.max(usage.mem_peak_bytes) > total)
        {
            return Err(Refusal::MemoryAboveTotal);
        }
        let cpu = cpu.min(MAX_CPU_SECONDS);
        let previous = self.samples.get(&key);
        if previous.is_some_and(|p| usage.sampled_at_ms <= p.sampled_at_ms) {
            return Err(Refusal::Unusable);
        }
        if previous.is_some_and(|p| cpu < p.cpu_seconds) {
            return Err(Refusal::CpuWentBackwards);
        }
        let cpu_used = match previous {
            Some(p) => {
                let secs = (usage.sampled_at_ms - p.sampled_at_ms) as f64 / 1000.0;
                ((cpu - p.cpu_seconds) / secs).min(MAX_CORES) as f32
            }
            None => f32::NAN,
        };
        self.samples.insert(
            key,
            Sample {
                cpu_seconds: cpu,
                cpu_used,
                rss_bytes: usage.mem_rss_bytes,
                peak_bytes: usage.mem_peak_bytes.max(usage.mem_rss_bytes),
                sampled_at_ms: usage.sampled_at_ms,
            },
        );
        Ok(())
    }

    /// Whether refused entries of `agent_id` are worth a warning at `now` (at most one per
    /// [`WARN_EVERY`] per agent); remembers it when so.
    fn warn_now(&mut self, agent_id: &str, now: Instant) -> bool {
        if self
            .warned
            .get(agent_id)
            .is_some_and(|at| now.saturating_duration_since(*at) < WARN_EVERY)
        {
            return false;
        }
        // Only agents warned about within the interval are remembered.
        self.warned
            .retain(|_, at| now.saturating_duration_since(*at) < WARN_EVERY);
        self.warned.insert(agent_id.to_string(), now);
        true
    }
}

impl Sample {
    pub fn view(&self) -> TaskUsageView {
        TaskUsageView {
            cpu_seconds: self.cpu_seconds,
            cpu_used: (!self.cpu_used.is_nan()).then_some(f64::from(self.cpu_used)),
            mem_rss_mib: self.rss_bytes as f64 / MIB,
            mem_peak_mib: self.peak_bytes as f64 / MIB,
            sampled_at_ms: self.sampled_at_ms,
        }
    }
}

impl MasterState {
    /// A `UsageReport` from the registered agent `agent_id` at `now`: keeps the entries about
    /// tasks it runs (not ended), at most as many as it runs, that pass the sanity rules of
    /// the module docs; counts the refused ones by reason and ignores the rest.
    pub(crate) fn usage_report(&mut self, agent_id: &str, report: UsageReport, now: Instant) {
        let Some(agent) = self.agents.get(agent_id).filter(|a| !a.lost) else {
            return;
        };
        let bound = agent.tasks.len();
        let mem_milli = agent.total.milli("mem");
        let bounds = Bounds {
            now_ms: self.started_unix_ms
                + now.saturating_duration_since(self.started).as_millis() as u64,
            mem_bytes: (mem_milli > 0).then(|| {
                let bytes = u128::from(mem_milli) * (1024 * 1024) / 1000;
                u64::try_from(bytes).unwrap_or(u64::MAX)
            }),
        };
        let mut ignored = report.tasks.len().saturating_sub(bound);
        // How many entries were refused, and the first one's reason and task (for the log).
        let mut refused = 0usize;
        let mut first: Option<(&'static str, &str)> = None;
        for usage in report.tasks.iter().take(bound) {
            let key = make_task_key(&usage.framework_id, &usage.task_id);
            // The membership rule of the agent's task set (`MasterState::agent_tasks`).
            let runs_it = self
                .tasks
                .get(&key)
                .is_some_and(|t| t.agent == agent_id && !t.state.is_terminal());
            if !runs_it {
                ignored += 1;
                continue;
            }
            match self.usage.record(key, usage, &bounds) {
                Ok(()) => {}
                Err(why) => match why.label() {
                    Some(reason) => {
                        self.metrics.usage_refused(reason);
                        refused += 1;
                        first.get_or_insert((reason, usage.task_id.as_str()));
                    }
                    None => ignored += 1,
                },
            }
        }
        if ignored > 0 {
            tracing::debug!(agent = %agent_id, ignored, "usage entries ignored");
        }
        if let Some((reason, task)) = first {
            if self.usage.warn_now(agent_id, now) {
                tracing::warn!(agent = %agent_id, refused, first_reason = reason,
                    first_task = task, "usage entries refused as implausible \
                    (ringmaster_usage_reports_refused_total; further warnings about this agent \
                    wait a minute)");
            } else {
                tracing::debug!(agent = %agent_id, refused, first_reason = reason,
                    first_task = task, "usage entries refused as implausible");
            }
        }
    }

    /// What the agent's sampled tasks use: the sum of their cores (over their last two samples)
    /// and of their memory; `None` when none of its tasks has a sample.
    pub(crate) fn agent_usage(&self, agent_id: &str) -> Option<AgentUsageView> {
        let mut sum: Option<AgentUsageView> = None;
        for key in self.agent_tasks(agent_id) {
            let Some(sample) = self.usage.get(&key) else {
                continue;
            };
            let view = sum.get_or_insert(AgentUsageView {
                cpus: 0.0,
                mem_mib: 0.0,
            });
            if !sample.cpu_used.is_nan() {
                view.cpus += f64::from(sample.cpu_used);
            }
            view.mem_mib += sample.rss_bytes as f64 / MIB;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_warned_about_once_a_minute_per_agent() {
        let mut book = UsageBook::default();
        let start = Instant::now();
        assert!(book.warn_now("a1", start));
        assert!(!book.warn_now("a1", start + Duration::from_secs(59)));
        assert!(book.warn_now("a2", start + Duration::from_secs(59)));
        assert!(book.warn_now("a1", start + WARN_EVERY));
        // Only agents warned about within the minute are remembered.
        assert!(book.warn_now("a3", start + Duration::from_secs(200)));
        assert_eq!(book.warned.len(), 1);
    }

    #[test]
    fn a_sample_stays_small() {
        // Kept per sampled running task; see the module docs before growing it.
        assert!(
            std::mem::size_of::<Sample>() <= 40,
            "{}",
            std::mem::size_of::<Sample>()
        );
    }
}
