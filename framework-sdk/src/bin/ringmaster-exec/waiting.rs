//! Why the plain mode is still waiting: a task that fits no agent would otherwise wait in
//! silence. The protocol carries no pending reason to frameworks (the master's "why" is on its
//! HTTP `/state`, shown by `ringmaster status pending`), so exec says what it knows itself: after
//! [`WAIT_NOTICE_AFTER`] without a launch while tasks remain, one line on stderr naming the task
//! size and what the offers it had to decline lacked; the line is printed again only when it
//! changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringmaster_sdk::Resources;

/// How long exec waits without launching before it says why.
pub const WAIT_NOTICE_AFTER: Duration = Duration::from_secs(3);

/// What exec knows about its wait: how many tasks are not launched, and the offers declined
/// since the last launch.
#[derive(Debug, Clone)]
pub struct Waiting {
    unit: Resources,
    total: u32,
    remaining: u32,
    /// Since the start or the last launch.
    since: Instant,
    /// Declined offers since `since`: agent id → the dimensions its offers lacked.
    declined: BTreeMap<String, BTreeSet<String>>,
    /// The last line printed.
    printed: Option<String>,
}

impl Waiting {
    /// `total` tasks of size `unit`, none launched, waiting since `now`.
    pub fn new(unit: Resources, total: u32, now: Instant) -> Self {
        Waiting {
            unit,
            total,
            remaining: total,
            since: now,
            declined: BTreeMap::new(),
            printed: None,
        }
    }

    /// Tasks were launched: `remaining` are left; the wait starts over.
    pub fn launched(&mut self, remaining: u32, now: Instant) {
        self.remaining = remaining;
        self.since = now;
        self.declined.clear();
    }

    /// An offer of `offered` from `agent` was declined: nothing of it fits one more task.
    /// `gpu_short` is true when its scalars fit but its devices do not hold the GPU request.
    pub fn declined(&mut self, agent: &str, offered: &Resources, gpu_short: bool) {
        if self.remaining == 0 {
            return;
        }
        let mut short: BTreeSet<String> =
            offered.shortfalls(&self.unit).map(str::to_string).collect();
        if short.is_empty() && gpu_short {
            short.insert("GPU devices".into());
        }
        self.declined
            .entry(agent.to_string())
            .or_default()
            .extend(short);
    }

    /// The line to print now, if any: only when tasks remain, the wait is at least
    /// [`WAIT_NOTICE_AFTER`] old, and the line differs from the last one printed.
    pub fn notice(&mut self, now: Instant) -> Option<String> {
        if self.remaining == 0 || now.saturating_duration_since(self.since) < WAIT_NOTICE_AFTER {
            return None;
        }
        let line = self.line();
        if self.printed.as_deref() == Some(line.as_str()) {
            return None;
        }
        self.printed = Some(line.clone());
        Some(line)
    }

    /// The line describing the wait.
    pub fn line(&self) -> String {
        let what = if self.remaining == self.total {
            format!("waiting for an offer that fits {}", self.unit)
        } else {
            format!(
                "{} of {} tasks launched; waiting for an offer that fits {}",
                self.total - self.remaining,
                self.total,
                self.unit
            )
        };
        if self.declined.is_empty() {
            return format!(
                "ringmaster-exec: {what}: no agent offered one yet (`ringmaster status pending` on the master shows why)"
            );
        }
        let short: BTreeSet<&str> = self
            .declined
            .values()
            .flatten()
            .map(String::as_str)
            .collect();
        let agents = self.declined.len();
        let lacking = if short.is_empty() {
            String::new()
        } else {
            format!(
                ", lacking {}",
                short.into_iter().collect::<Vec<_>>().join(", ")
            )
        };
        format!(
            "ringmaster-exec: {what}: declined offers from {agents} agent{}{lacking} (`ringmaster status pending` on the master shows why)",
            if agents == 1 { "" } else { "s" }
        )
    }
}

/// A [`Waiting`] shared by the scheduler and the ticker that prints it.
pub type SharedWaiting = Arc<Mutex<Waiting>>;

/// Prints the notice on stderr whenever it is due, checking twice a second, until aborted.
pub fn spawn_ticker(waiting: SharedWaiting) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let line = waiting
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .notice(Instant::now());
            if let Some(line) = line {
                eprintln!("{line}");
            }
        }
    })
    .abort_handle()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    #[test]
    fn says_nothing_before_the_grace_and_once_per_distinct_line() {
        let t0 = Instant::now();
        let mut w = Waiting::new(r("cpus:64;mem:128"), 2, t0);
        assert_eq!(w.notice(t0 + Duration::from_secs(1)), None);
        let first = w.notice(t0 + WAIT_NOTICE_AFTER).unwrap();
        assert_eq!(
            first,
            "ringmaster-exec: waiting for an offer that fits cpus:64;mem:128: no agent offered one yet (`ringmaster status pending` on the master shows why)"
        );
        // Unchanged: not again.
        assert_eq!(w.notice(t0 + WAIT_NOTICE_AFTER * 5), None);
        // An offer that lacks cpus changes the line.
        w.declined("a1", &r("cpus:8;mem:8192"), false);
        let second = w.notice(t0 + WAIT_NOTICE_AFTER * 6).unwrap();
        assert!(
            second.ends_with(
                "fits cpus:64;mem:128: declined offers from 1 agent, lacking cpus (`ringmaster status pending` on the master shows why)"
            ),
            "{second}"
        );
        // The same agent again: same line, nothing printed.
        w.declined("a1", &r("cpus:8;mem:8192"), false);
        assert_eq!(w.notice(t0 + WAIT_NOTICE_AFTER * 7), None);
        w.declined("a2", &r("cpus:100;mem:64"), false);
        let third = w.notice(t0 + WAIT_NOTICE_AFTER * 8).unwrap();
        assert!(
            third.contains("declined offers from 2 agents, lacking cpus, mem"),
            "{third}"
        );
    }

    #[test]
    fn a_launch_restarts_the_wait_and_the_line_counts_launched_tasks() {
        let t0 = Instant::now();
        let mut w = Waiting::new(r("cpus:1"), 3, t0);
        w.declined("a1", &r("mem:1"), false);
        let t1 = t0 + Duration::from_secs(10);
        w.launched(1, t1);
        assert_eq!(w.notice(t1 + Duration::from_secs(1)), None);
        let line = w.notice(t1 + WAIT_NOTICE_AFTER).unwrap();
        assert!(
            line.starts_with("ringmaster-exec: 2 of 3 tasks launched; waiting for an offer that fits cpus:1: no agent offered one yet"),
            "{line}"
        );
        // Everything launched: silent.
        w.launched(0, t1);
        w.declined("a1", &r("mem:1"), false);
        assert_eq!(w.notice(t1 + WAIT_NOTICE_AFTER * 10), None);
    }

    #[test]
    fn offers_whose_devices_do_not_hold_the_gpu_request_say_so() {
        let t0 = Instant::now();
        let mut w = Waiting::new(r("cpus:1;gpu_milli:600"), 1, t0);
        w.declined("a1", &r("cpus:4;gpu_milli:800"), true);
        let line = w.notice(t0 + WAIT_NOTICE_AFTER).unwrap();
        assert!(line.contains("lacking GPU devices"), "{line}");
    }
}
