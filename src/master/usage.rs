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

use std::collections::HashMap;

use ringmaster_proto::{TaskUsage, UsageReport};

use super::ops::model::{AgentUsageView, TaskUsageView};
use super::state::{make_task_key, MasterState, TaskKey};

/// CPU seconds above this (about 31,700 core-years) are a bogus report.
const MAX_CPU_SECONDS: f64 = 1e12;
/// Cores above this are a bogus rate (clock or counter trouble).
const MAX_CORES: f64 = 1e6;
const MIB: f64 = 1024.0 * 1024.0;

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

    /// Records one entry of a report; `false` when it is unusable (non-finite or negative cpu,
    /// or not newer than the sample already held).
    fn record(&mut self, key: TaskKey, usage: &TaskUsage) -> bool {
        let cpu = usage.cpu_seconds;
        if !cpu.is_finite() || cpu < 0.0 {
            return false;
        }
        let cpu = cpu.min(MAX_CPU_SECONDS);
        let previous = self.samples.get(&key);
        if previous.is_some_and(|p| usage.sampled_at_ms <= p.sampled_at_ms) {
            return false;
        }
        let cpu_used = match previous {
            Some(p) if cpu >= p.cpu_seconds => {
                let secs = (usage.sampled_at_ms - p.sampled_at_ms) as f64 / 1000.0;
                ((cpu - p.cpu_seconds) / secs).min(MAX_CORES) as f32
            }
            // The counter went back (a restarted cgroup?): no rate from these two.
            Some(_) => f32::NAN,
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
    /// A `UsageReport` from the registered agent `agent_id`: keeps the entries about tasks it
    /// runs (not ended), at most as many as it runs; ignores the rest.
    pub(crate) fn usage_report(&mut self, agent_id: &str, report: UsageReport) {
        let Some(agent) = self.agents.get(agent_id).filter(|a| !a.lost) else {
            return;
        };
        let bound = agent.tasks.len();
        let mut ignored = report.tasks.len().saturating_sub(bound);
        for usage in report.tasks.iter().take(bound) {
            let key = make_task_key(&usage.framework_id, &usage.task_id);
            // The membership rule of the agent's task set (`MasterState::agent_tasks`).
            let runs_it = self
                .tasks
                .get(&key)
                .is_some_and(|t| t.agent == agent_id && !t.state.is_terminal());
            if !runs_it || !self.usage.record(key, usage) {
                ignored += 1;
            }
        }
        if ignored > 0 {
            tracing::debug!(agent = %agent_id, ignored, "usage entries ignored");
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
    fn a_sample_stays_small() {
        // Kept per sampled running task; see the module docs before growing it.
        assert!(
            std::mem::size_of::<Sample>() <= 40,
            "{}",
            std::mem::size_of::<Sample>()
        );
    }
}
