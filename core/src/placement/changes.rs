//! The cluster's recent changes: which agents changed, in order, numbered, so that a caller who
//! remembered something about the agents at change number `n` can ask which agents changed
//! since (a ring search's memo, [`crate::placement::placers::memo`]).
//!
//! Bounded: only the last [`KEPT`] changes are kept; asking about an older number answers
//! "unknown" and the caller starts over. Recording is a push onto a ring buffer.

use std::collections::VecDeque;

use super::AgentKey;

/// How many of the latest changes are kept.
pub const KEPT: usize = 256;

/// [`ChangeLog::latest`] of an agent never recorded.
const NEVER: u64 = u64::MAX;

/// The latest changes of a cluster's agents; see the module doc.
#[derive(Clone, Debug, Default)]
pub struct ChangeLog {
    /// How many changes were ever recorded: the number the next one gets.
    next: u64,
    /// The agents of changes `next − recent.len()` … `next − 1`.
    recent: VecDeque<AgentKey>,
    /// By agent key: the number of the agent's latest change ([`NEVER`] for a key never
    /// recorded). Kept for every key, so "did it change since n" is one read.
    latest: Vec<u64>,
}

impl ChangeLog {
    /// Records that `key` changed (its free amounts, its labels, its presence).
    pub fn record(&mut self, key: AgentKey) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(key);
        if self.latest.len() <= key {
            self.latest.resize(key + 1, NEVER);
        }
        self.latest[key] = self.next;
        self.next += 1;
    }

    /// Whether `key` changed at or after change number `then`: O(1).
    pub fn changed_since(&self, key: AgentKey, then: u64) -> bool {
        self.latest
            .get(key)
            .is_some_and(|&at| at != NEVER && at >= then)
    }

    /// The agents that changed since `then`, each once (at its latest change), in the order of
    /// those changes; `None` as for [`since`](Self::since).
    pub fn distinct_since(&self, then: u64) -> Option<impl Iterator<Item = AgentKey> + '_> {
        Some(
            self.since(then)?
                .zip(then..)
                .filter(|&(key, at)| self.latest.get(key) == Some(&at))
                .map(|(key, _)| key),
        )
    }

    /// The number the next change will get: what a caller remembers.
    pub fn now(&self) -> u64 {
        self.next
    }

    /// The agents that changed since `then` ([`now`](Self::now) at the time), in the order of
    /// the changes, repeats included; `None` when changes since then are no longer kept, or
    /// `then` is in the future.
    pub fn since(&self, then: u64) -> Option<impl Iterator<Item = AgentKey> + '_> {
        let skip = self
            .count_since(then)
            .map(|count| self.recent.len() - count as usize)?;
        Some(self.recent.range(skip..).copied())
    }

    /// How many changes there were since `then`, if they are still kept.
    pub fn count_since(&self, then: u64) -> Option<u64> {
        let oldest = self.next - self.recent.len() as u64;
        (oldest..=self.next)
            .contains(&then)
            .then(|| self.next - then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_since_a_number_in_order_until_they_are_dropped() {
        let mut log = ChangeLog::default();
        let start = log.now();
        assert_eq!(log.since(start).unwrap().count(), 0);
        log.record(3);
        log.record(5);
        log.record(3);
        assert_eq!(log.since(start).unwrap().collect::<Vec<_>>(), [3, 5, 3]);
        assert_eq!(log.since(start + 2).unwrap().collect::<Vec<_>>(), [3]);
        assert_eq!(log.count_since(start + 1), Some(2));
        // Each agent once, at its latest change.
        assert_eq!(
            log.distinct_since(start).unwrap().collect::<Vec<_>>(),
            [5, 3]
        );
        assert!(log.changed_since(3, start + 2) && !log.changed_since(5, start + 2));
        assert!(log.changed_since(5, start) && !log.changed_since(4, start));
        assert!(log.since(log.now() + 1).is_none());
        let mark = log.now();
        for key in 0..KEPT {
            log.record(key);
        }
        // The changes before `mark` are dropped, those since are all kept.
        assert!(log.since(start).is_none());
        assert_eq!(log.count_since(start), None);
        assert_eq!(log.since(mark).unwrap().count(), KEPT);
        log.record(7);
        assert!(log.since(mark).is_none());
        assert_eq!(log.since(mark + 1).unwrap().last(), Some(7));
    }
}
