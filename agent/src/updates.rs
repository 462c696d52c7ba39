//! The reliable status queue: every status update is kept until the master acknowledges it.
//!
//! A task's end must reach the master even across dropped connections, so each update gets a
//! unique id and stays queued, in issue order, until a `StatusAck` with that id arrives. The
//! session resends what is due every retry interval and everything right after registering.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringmaster_proto::TaskStatus;
use tokio::time::Instant;

/// How long an unacknowledged update waits before it is sent again.
pub const STATUS_RETRY: Duration = Duration::from_secs(2);

/// Updates waiting for acknowledgement, oldest first.
#[derive(Debug)]
pub struct StatusQueue {
    /// Distinguishes this process's update ids from an earlier run's with the same agent id.
    incarnation: u64,
    counter: u64,
    pending: VecDeque<Pending>,
}

#[derive(Debug)]
struct Pending {
    status: TaskStatus,
    last_sent: Option<Instant>,
}

impl StatusQueue {
    /// An empty queue whose update ids carry `incarnation` (e.g. the start time in ms).
    pub fn new(incarnation: u64) -> Self {
        StatusQueue {
            incarnation,
            counter: 0,
            pending: VecDeque::new(),
        }
    }

    /// Queues a status under a fresh update id `<agent_id>-<incarnation>-<counter>` and the
    /// current time (when `timestamp_ms` is unset), returning the queued copy. The caller sends
    /// it at once, so its first resend is due one retry interval from now.
    pub fn issue(&mut self, mut status: TaskStatus) -> TaskStatus {
        self.counter += 1;
        status.update_id = format!("{}-{}-{}", status.agent_id, self.incarnation, self.counter);
        if status.timestamp_ms == 0 {
            status.timestamp_ms = unix_ms();
        }
        self.pending.push_back(Pending {
            status: status.clone(),
            last_sent: Some(Instant::now()),
        });
        status
    }

    /// Removes an acknowledged update; `None` for an unknown (e.g. already acked) id.
    pub fn ack(&mut self, update_id: &str) -> Option<TaskStatus> {
        let index = self
            .pending
            .iter()
            .position(|p| p.status.update_id == update_id)?;
        self.pending.remove(index).map(|p| p.status)
    }

    /// True while an update of this task waits for its ack.
    pub fn has_pending_for(&self, framework_id: &str, task_id: &str) -> bool {
        self.pending
            .iter()
            .any(|p| p.status.task_id == task_id && p.status.framework_id == framework_id)
    }

    /// The pending updates of one task, oldest first, marked as sent now.
    pub fn take_for_task(&mut self, framework_id: &str, task_id: &str) -> Vec<TaskStatus> {
        let now = Instant::now();
        self.pending
            .iter_mut()
            .filter(|p| p.status.task_id == task_id && p.status.framework_id == framework_id)
            .map(|p| {
                p.last_sent = Some(now);
                p.status.clone()
            })
            .collect()
    }

    /// Every pending update, oldest first, marked as sent now (after (re-)registering).
    pub fn take_all(&mut self) -> Vec<TaskStatus> {
        let now = Instant::now();
        self.pending
            .iter_mut()
            .map(|p| {
                p.last_sent = Some(now);
                p.status.clone()
            })
            .collect()
    }

    /// The updates never sent or last sent at least `retry` ago, oldest first, marked as sent.
    pub fn take_due(&mut self, now: Instant, retry: Duration) -> Vec<TaskStatus> {
        self.pending
            .iter_mut()
            .filter(|p| p.last_sent.is_none_or(|at| now.duration_since(at) >= retry))
            .map(|p| {
                p.last_sent = Some(now);
                p.status.clone()
            })
            .collect()
    }

    /// Forgets when anything was sent: after a disconnect nothing sent is known to have arrived.
    pub fn mark_unsent(&mut self) {
        for p in &mut self.pending {
            p.last_sent = None;
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(task: &str) -> TaskStatus {
        TaskStatus {
            task_id: task.into(),
            framework_id: "fw".into(),
            agent_id: "a1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn ids_are_unique_and_acks_remove_exactly_one() {
        let mut queue = StatusQueue::new(42);
        let first = queue.issue(status("t1"));
        let second = queue.issue(status("t1"));
        assert_eq!(first.update_id, "a1-42-1");
        assert_eq!(second.update_id, "a1-42-2");
        assert!(first.timestamp_ms > 0);
        assert_eq!(queue.ack("a1-42-1").unwrap().update_id, "a1-42-1");
        assert!(queue.ack("a1-42-1").is_none(), "a second ack is ignored");
        assert!(queue.has_pending_for("fw", "t1"));
        queue.ack("a1-42-2");
        assert!(!queue.has_pending_for("fw", "t1"));
        assert!(queue.is_empty());
    }

    #[test]
    fn resends_in_order_only_what_is_due() {
        let mut queue = StatusQueue::new(1);
        queue.issue(status("t1"));
        queue.issue(status("t2"));
        let start = Instant::now();
        let ids = |v: Vec<TaskStatus>| v.into_iter().map(|s| s.task_id).collect::<Vec<_>>();
        assert!(queue.take_due(start, STATUS_RETRY).is_empty(), "just sent");
        let later = start + STATUS_RETRY;
        assert_eq!(ids(queue.take_due(later, STATUS_RETRY)), ["t1", "t2"]);
        let soon = later + Duration::from_secs(1);
        assert!(queue.take_due(soon, STATUS_RETRY).is_empty());
        queue.issue(status("t3"));
        let t3_due = Instant::now() + STATUS_RETRY;
        assert_eq!(ids(queue.take_due(t3_due, STATUS_RETRY)), ["t3"]);
        let all_due = later + STATUS_RETRY;
        assert_eq!(ids(queue.take_due(all_due, STATUS_RETRY)), ["t1", "t2"]);
        queue.mark_unsent();
        assert_eq!(ids(queue.take_all()), ["t1", "t2", "t3"]);
        assert_eq!(ids(queue.take_for_task("fw", "t2")), ["t2"]);
    }
}
