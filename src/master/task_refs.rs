//! The tasks of one agent or one framework as a multiset of the task table's hashes.

use hashbrown::hash_table::HashTable;

/// The tasks of one agent or one framework, as the hashes the [`TaskTable`](super::task_table::TaskTable) files them under: 8
/// bytes a task instead of a copy of its key (48 bytes), in a table per agent and per
/// framework (10,000 agents' sets were about 16 MB under load: docs/benchmarks.md, "Memory at
/// scale"). A multiset: two tasks whose keys share a hash are each counted;
/// [`TaskTable::resolve`](super::task_table::TaskTable::resolve) turns it back into keys.
#[derive(Default)]
pub(crate) struct TaskRefs {
    table: HashTable<u64>,
}

impl TaskRefs {
    pub fn insert(&mut self, hash: u64) {
        self.table.insert_unique(hash, hash, |&h| h);
    }

    /// Removes one occurrence of `hash`; `false` when there was none.
    pub fn remove(&mut self, hash: u64) -> bool {
        match self.table.find_entry(hash, |&h| h == hash) {
            Ok(occupied) => {
                occupied.remove();
                true
            }
            Err(_) => false,
        }
    }

    #[cfg(test)]
    pub fn contains(&self, hash: u64) -> bool {
        self.table.find(hash, |&h| h == hash).is_some()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Every hash held, once per task.
    pub fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.table.iter().copied()
    }
}
