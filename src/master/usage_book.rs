//! The latest usage sample of every sampled running task, and the sanity rules an agent's
//! entry must pass to be kept (see [`super::usage`] for the report handler and the rules).

use std::collections::HashMap;

use ringmaster_proto::TaskUsage;
use tokio::time::{Duration, Instant};

use super::ops::model::TaskUsageView;
use super::records::TaskKey;

/// CPU seconds above this (about 31,700 core-years) are a bogus report.
const MAX_CPU_SECONDS: f64 = 1e12;
/// Cores above this are a bogus rate (clock or counter trouble).
const MAX_CORES: f64 = 1e6;
pub(crate) const MIB: f64 = 1024.0 * 1024.0;
/// A sample time further than this from the master's clock (either way) is refused: one day.
pub(crate) const MAX_CLOCK_SKEW_MS: u64 = 24 * 3600 * 1000;
/// At most one warning about refused entries per agent in this time; the rest go to debug.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why an entry of a report was not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
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
    pub fn label(self) -> Option<&'static str> {
        match self {
            Refusal::Unusable => None,
            Refusal::TimeOutOfRange => Some("time_out_of_range"),
            Refusal::MemoryAboveTotal => Some("memory_above_total"),
            Refusal::CpuWentBackwards => Some("cpu_went_backwards"),
        }
    }
}

/// What bounds an agent's entries: the master's clock and the agent's total memory.
pub(crate) struct Bounds {
    /// The master's clock, unix ms.
    pub now_ms: u64,
    /// The agent's total `mem` in bytes; `None`: it declares no `mem`, so nothing bounds it.
    pub mem_bytes: Option<u64>,
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
    pub fn record(
        &mut self,
        key: TaskKey,
        usage: &TaskUsage,
        bounds: &Bounds,
    ) -> Result<(), Refusal> {
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
    pub fn warn_now(&mut self, agent_id: &str, now: Instant) -> bool {
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
