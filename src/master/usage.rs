//! Task usage as agents report it (`UsageReport`, docs/protocol.md "Task usage"): the latest
//! sample per running task, and the per-agent sums `/state` shows next to what is allocated.
//!
//! In memory only (never persisted: a restarted master waits for the next report), and only
//! for tasks that run and have been sampled: a side map keyed by the task, not a field of every
//! task record (docs/benchmarks.md, "Memory at scale"), whose entry goes when the task ends
//! ([`MasterState::finish_task`] calls
//! [`UsageBook::forget`](super::usage_book::UsageBook::forget)).
//!
//! An agent is not trusted with more than its own running tasks: entries about other tasks
//! are ignored, a report holds at most as many entries as the agent runs tasks (the rest is
//! ignored), and figures that are not finite or out of range are dropped or clamped.
//!
//! Nor with its figures: an entry whose memory (rss or peak) is above the agent's total `mem`,
//! whose CPU seconds are below the task's held sample, or whose sample time is more than
//! [`MAX_CLOCK_SKEW_MS`](super::usage_book::MAX_CLOCK_SKEW_MS) from the master's clock (the handler's `now`) is refused, counted in
//! `ringmaster_usage_reports_refused_total{reason}` and logged at most once a minute per agent
//! ([`WARN_EVERY`](super::usage_book::WARN_EVERY); debug otherwise), so one bad agent cannot flood the log.

use ringmaster_proto::UsageReport;
use tokio::time::Instant;

use super::ops::model::AgentUsageView;
use super::records::make_task_key;
use super::state::MasterState;
use super::usage_book::{Bounds, MIB};

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
