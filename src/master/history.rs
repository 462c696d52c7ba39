//! A bounded, insertion-ordered set of ids: the history of removed frameworks. Ids past the
//! bound are forgotten oldest first (`master.max_removed_frameworks`), so a long-running
//! master does not remember every framework it ever removed.

use std::collections::{HashSet, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct History {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl History {
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// Records `id` (again: it becomes the newest) and returns the ids forgotten to keep at
    /// most `bound`, oldest first.
    pub fn insert(&mut self, id: &str, bound: usize) -> Vec<String> {
        if self.ids.contains(id) {
            self.order.retain(|o| o != id);
        } else {
            self.ids.insert(id.to_string());
        }
        self.order.push_back(id.to_string());
        self.trim(bound)
    }

    /// Forgets the oldest ids beyond `bound`; returns them, oldest first.
    pub fn trim(&mut self, bound: usize) -> Vec<String> {
        let mut forgotten = Vec::new();
        while self.order.len() > bound {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.ids.remove(&old);
            forgotten.push(old);
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::History;

    #[test]
    fn keeps_the_newest_ids_up_to_the_bound() {
        let mut h = History::default();
        assert!(h.insert("a", 2).is_empty());
        assert!(h.insert("b", 2).is_empty());
        assert!(h.insert("a", 2).is_empty(), "a again: now the newest");
        assert_eq!(h.insert("c", 2), vec!["b".to_string()]);
        assert!(h.contains("a") && h.contains("c") && !h.contains("b"));
        assert_eq!(
            h.insert("d", 0),
            vec!["a".to_string(), "c".to_string(), "d".to_string()]
        );
        assert!(!h.contains("a") && !h.contains("c") && !h.contains("d"));
    }
}
