//! The master's task table: every task it knows, by (framework, task id).
//!
//! A table of boxed entries that carry their own key, not a `HashMap<TaskKey, Box<_>>`: a slot
//! is one pointer (8 bytes) instead of the key and the pointer (56), and a table sized for a
//! few hundred thousand tasks has twice as many slots as entries right after it grows. At
//! 10,000 agents under load that is tens of megabytes (docs/benchmarks.md, "Memory at scale").

use std::hash::{BuildHasher, RandomState};
use std::ops::Index;

use hashbrown::hash_table::{Entry, HashTable};

use super::records::{TaskKey, TaskRecord};
use super::task_refs::TaskRefs;

/// 192 bytes, a jemalloc size class: see the test below before growing [`TaskRecord`].
struct Slot {
    key: TaskKey,
    record: TaskRecord,
}

/// Tasks by key; the subset of `HashMap`'s interface the master uses. The hasher is a
/// parameter only so tests can make keys' hashes share what the table's probing looks at.
pub(crate) struct TaskTable<S = RandomState> {
    table: HashTable<Box<Slot>>,
    hasher: S,
}

impl Default for TaskTable {
    fn default() -> Self {
        TaskTable {
            table: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

impl<S: BuildHasher> TaskTable<S> {
    fn hash(&self, key: &TaskKey) -> u64 {
        self.hasher.hash_one(key)
    }

    pub fn get(&self, key: &TaskKey) -> Option<&TaskRecord> {
        self.table
            .find(self.hash(key), |slot| slot.key == *key)
            .map(|slot| &slot.record)
    }

    pub fn get_mut(&mut self, key: &TaskKey) -> Option<&mut TaskRecord> {
        let hash = self.hash(key);
        self.table
            .find_mut(hash, |slot| slot.key == *key)
            .map(|slot| &mut slot.record)
    }

    pub fn contains_key(&self, key: &TaskKey) -> bool {
        self.get(key).is_some()
    }

    /// Adds or replaces the task under `key`; returns the record it replaced.
    pub fn insert(&mut self, key: TaskKey, record: TaskRecord) -> Option<TaskRecord> {
        let hash = self.hash(&key);
        let hasher = &self.hasher;
        match self.table.entry(
            hash,
            |slot| slot.key == key,
            |slot| hasher.hash_one(&slot.key),
        ) {
            Entry::Occupied(mut occupied) => {
                Some(std::mem::replace(&mut occupied.get_mut().record, record))
            }
            Entry::Vacant(vacant) => {
                vacant.insert(Box::new(Slot { key, record }));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &TaskKey) -> Option<TaskRecord> {
        let hash = self.hash(key);
        match self.table.find_entry(hash, |slot| slot.key == *key) {
            Ok(occupied) => Some(occupied.remove().0.record),
            Err(_) => None,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// The hash the table files `key` under: what a [`TaskRefs`] holds for it.
    pub fn hash_of(&self, key: &TaskKey) -> u64 {
        self.hash(key)
    }

    /// The tasks `refs` names that satisfy `member` (the rule that put them there: an agent's
    /// live tasks, a framework's live tasks), each once, in no particular order. `member`
    /// decides, so two tasks whose keys share a hash are told apart exactly.
    pub fn resolve(
        &self,
        refs: &TaskRefs,
        member: impl Fn(&TaskKey, &TaskRecord) -> bool,
    ) -> Vec<TaskKey> {
        let mut hashes: Vec<u64> = refs.hashes().collect();
        hashes.sort_unstable();
        hashes.dedup();
        let mut keys = Vec::with_capacity(refs.len());
        for hash in hashes {
            // `iter_hash` yields every slot whose hash probes like this one (the same start
            // and 7-bit tag), not only those of this hash: a slot of another hash in `refs`
            // would come back once per hash. Each task only under its own hash.
            keys.extend(
                self.table
                    .iter_hash(hash)
                    .filter(|slot| self.hash(&slot.key) == hash && member(&slot.key, &slot.record))
                    .map(|slot| slot.key.clone()),
            );
        }
        keys
    }

    /// Every task, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&TaskKey, &TaskRecord)> + '_ {
        self.table.iter().map(|slot| (&slot.key, &slot.record))
    }

    pub fn values(&self) -> impl Iterator<Item = &TaskRecord> + '_ {
        self.table.iter().map(|slot| &slot.record)
    }
}

impl Index<&TaskKey> for TaskTable {
    type Output = TaskRecord;

    fn index(&self, key: &TaskKey) -> &TaskRecord {
        self.get(key).expect("no task under this key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::state::make_task_key;

    #[test]
    fn a_slot_fills_an_allocator_size_class() {
        // jemalloc rounds 193..=224 bytes up to 224: a field more costs 32 bytes per task.
        assert!(
            std::mem::size_of::<Slot>() <= 192,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }

    #[test]
    fn refs_resolve_to_the_members_each_once() {
        let mut table = TaskTable::default();
        let mut refs = TaskRefs::default();
        for (task, agent) in [("t1", "a1"), ("t2", "a1"), ("t3", "a2")] {
            let key = make_task_key("f", task);
            refs.insert(table.hash_of(&key));
            table.insert(key, TaskRecord::for_tests(agent));
        }
        let on = |agent: &'static str| move |_: &TaskKey, t: &TaskRecord| t.agent == agent;
        let mut keys = table.resolve(&refs, on("a1"));
        keys.sort();
        assert_eq!(
            keys,
            vec![make_task_key("f", "t1"), make_task_key("f", "t2")]
        );
        assert_eq!(refs.len(), 3);
        // A hash held twice (two tasks whose keys collide) still resolves each task once.
        let t1 = table.hash_of(&make_task_key("f", "t1"));
        refs.insert(t1);
        assert_eq!(table.resolve(&refs, on("a1")).len(), 2);
        assert!(refs.remove(t1) && refs.remove(t1) && !refs.remove(t1));
        assert!(!refs.contains(t1));
        assert_eq!(
            table.resolve(&refs, on("a1")),
            vec![make_task_key("f", "t2")]
        );
    }

    /// Hashes that differ only in bits the table's probing ignores for a small table (above
    /// its position bits, below the 7-bit tag of the top): a table's `iter_hash` of one of
    /// them meets the others' slots too.
    struct Colliding;

    impl BuildHasher for Colliding {
        type Hasher = CollidingHasher;

        fn build_hasher(&self) -> CollidingHasher {
            CollidingHasher(0)
        }
    }

    struct CollidingHasher(u64);

    impl std::hash::Hasher for CollidingHasher {
        fn finish(&self) -> u64 {
            (self.0 % 1_000_003) << 24
        }

        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = self.0.wrapping_mul(31).wrapping_add(u64::from(b));
            }
        }
    }

    /// Found by a usage test that summed an agent's memory twice about once in a hundred runs
    /// (the hasher is random): two tasks whose hashes probe alike each came back twice.
    #[test]
    fn refs_resolve_each_task_once_when_hashes_probe_alike() {
        let mut table = TaskTable {
            table: HashTable::new(),
            hasher: Colliding,
        };
        let mut refs = TaskRefs::default();
        let keys: Vec<TaskKey> = (0..6)
            .map(|i| make_task_key("f", &format!("t{i}")))
            .collect();
        let hashes: Vec<u64> = keys.iter().map(|k| table.hash_of(k)).collect();
        let mut distinct = hashes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), keys.len(), "the test needs distinct hashes");
        for (key, hash) in keys.iter().zip(&hashes) {
            refs.insert(*hash);
            table.insert(key.clone(), TaskRecord::for_tests("a1"));
        }
        let mut resolved = table.resolve(&refs, |_, t| t.agent == "a1");
        resolved.sort();
        assert_eq!(resolved, keys);
    }

    #[test]
    fn insert_get_replace_remove() {
        let mut table = TaskTable::default();
        let record = |agent: &str| TaskRecord::for_tests(agent);
        assert!(table
            .insert(make_task_key("f", "t1"), record("a1"))
            .is_none());
        assert!(table
            .insert(make_task_key("f", "t2"), record("a2"))
            .is_none());
        assert_eq!(table[&make_task_key("f", "t1")].agent, "a1");
        let old = table.insert(make_task_key("f", "t1"), record("a3"));
        assert_eq!(old.map(|r| r.agent), Some("a1".into()));
        assert_eq!(table.get(&make_task_key("f", "t1")).unwrap().agent, "a3");
        table.get_mut(&make_task_key("f", "t2")).unwrap().agent = "a4".into();
        assert_eq!(table.len(), 2);
        assert_eq!(table.remove(&make_task_key("f", "t2")).unwrap().agent, "a4");
        assert!(!table.contains_key(&make_task_key("f", "t2")));
        assert!(table.remove(&make_task_key("f", "t2")).is_none());
        let keys: Vec<_> = table.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, vec![make_task_key("f", "t1")]);
    }
}
