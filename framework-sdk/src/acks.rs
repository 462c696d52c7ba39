//! Remembers which status updates were already acknowledged, so a resent update is acked again
//! but delivered to the scheduler only once.
//!
//! The master resends an update until it sees the ack; an ack lost with a dropped connection
//! means the same `update_id` arrives again. The memory is bounded (oldest forgotten first),
//! since a long-running framework sees an unbounded number of updates.

use std::collections::{HashSet, VecDeque};

/// How many acknowledged update ids are remembered by default.
pub(crate) const DEFAULT_ACK_MEMORY: usize = 4096;

/// A bounded set of acknowledged update ids, forgetting the oldest first.
#[derive(Debug)]
pub(crate) struct AckedUpdates {
    capacity: usize,
    order: VecDeque<String>,
    ids: HashSet<String>,
}

impl AckedUpdates {
    pub(crate) fn new(capacity: usize) -> Self {
        AckedUpdates {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            ids: HashSet::new(),
        }
    }

    pub(crate) fn contains(&self, update_id: &str) -> bool {
        self.ids.contains(update_id)
    }

    /// Records an acknowledged id; forgets the oldest when full.
    pub(crate) fn insert(&mut self, update_id: &str) {
        if !self.ids.insert(update_id.to_string()) {
            return;
        }
        self.order.push_back(update_id.to_string());
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_forgets_the_oldest() {
        let mut acked = AckedUpdates::new(2);
        acked.insert("a");
        acked.insert("b");
        acked.insert("a"); // no effect: already known, not refreshed
        assert!(acked.contains("a") && acked.contains("b"));
        acked.insert("c");
        assert!(!acked.contains("a"));
        assert!(acked.contains("b") && acked.contains("c"));
        assert_eq!(acked.order.len(), 2);
        assert_eq!(acked.ids.len(), 2);
    }
}
