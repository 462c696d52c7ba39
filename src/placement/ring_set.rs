//! One dimension's ring set: the agents sorted into buckets by their free amount.
//!
//! Each bucket is a `BTreeSet<(free, AgentKey)>`, so "the agent with the least free amount that
//! still holds the demand" is a range query from the demand upward, and "the largest agent" is
//! the set's last element; neither is a scan of the bucket.

use std::collections::BTreeSet;

use super::rings::{RingLayout, RingSpec};
use super::AgentKey;

/// The buckets of one dimension. Holds every agent whose total has this dimension.
#[derive(Clone, Debug)]
pub struct RingSet {
    name: String,
    spec: RingSpec,
    buckets: Vec<BTreeSet<(u64, AgentKey)>>,
}

impl RingSet {
    pub fn new(name: impl Into<String>, spec: RingSpec) -> Self {
        let buckets = vec![BTreeSet::new(); spec.layout().len()];
        RingSet {
            name: name.into(),
            spec,
            buckets,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> &RingLayout {
        self.spec.layout()
    }

    pub fn search_up(&self) -> usize {
        self.spec.search_up()
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The bucket an amount (thousandths) belongs to.
    pub fn bucket_of(&self, free: u64) -> usize {
        self.layout().bucket_of(free)
    }

    pub fn insert(&mut self, key: AgentKey, free: u64) {
        let b = self.bucket_of(free);
        self.buckets[b].insert((free, key));
    }

    /// Removes the agent filed under `free`; true if it was there.
    pub fn remove(&mut self, key: AgentKey, free: u64) -> bool {
        let b = self.bucket_of(free);
        self.buckets[b].remove(&(free, key))
    }

    /// Refiles an agent whose free amount changed from `old` to `new`.
    pub fn relocate(&mut self, key: AgentKey, old: u64, new: u64) {
        if old != new {
            self.remove(key, old);
            self.insert(key, new);
        }
    }

    /// True when the agent is filed in `bucket` under `free`.
    pub fn holds(&self, bucket: usize, key: AgentKey, free: u64) -> bool {
        self.buckets
            .get(bucket)
            .is_some_and(|b| b.contains(&(free, key)))
    }

    /// The (free, agent) pairs of one bucket, smallest free first.
    pub fn members(&self, bucket: usize) -> impl DoubleEndedIterator<Item = (u64, AgentKey)> + '_ {
        self.buckets.get(bucket).into_iter().flatten().copied()
    }

    /// Number of agents in one bucket.
    pub fn count(&self, bucket: usize) -> usize {
        self.buckets.get(bucket).map_or(0, BTreeSet::len)
    }

    /// Best fit in one bucket: the agent with the smallest free amount ≥ `need` for which `fits`
    /// holds (ties: lowest key). Starts at `need` and walks up only past agents that hold the
    /// dimension but fail another check.
    pub fn best_fit(
        &self,
        bucket: usize,
        need: u64,
        fits: &dyn Fn(AgentKey) -> bool,
    ) -> Option<(u64, AgentKey)> {
        let set = self.buckets.get(bucket).filter(|b| !b.is_empty())?;
        set.range((need, 0)..).copied().find(|(_, key)| fits(*key))
    }

    /// Worst fit in one bucket: the agent with the largest free amount for which `fits` holds
    /// (ties: lowest key). The largest fitting amount comes from the end of the bucket; the lowest
    /// key with that amount from a forward range query, so many agents of equal size are not
    /// walked one by one.
    pub fn largest_fit(
        &self,
        bucket: usize,
        need: u64,
        fits: &dyn Fn(AgentKey) -> bool,
    ) -> Option<(u64, AgentKey)> {
        let set = self.buckets.get(bucket).filter(|b| !b.is_empty())?;
        let (free, highest) = set
            .range((need, 0)..)
            .rev()
            .copied()
            .find(|(_, key)| fits(*key))?;
        set.range((free, 0)..=(free, highest))
            .copied()
            .find(|(_, key)| fits(*key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> RingSet {
        let spec = RingSpec::new(
            RingLayout::EqualSpans {
                base: 0,
                step: 1000,
                buckets: 4,
            },
            1,
        )
        .unwrap();
        let mut ring = RingSet::new("cpus", spec);
        for (key, free) in [
            (0, 500),
            (1, 1500),
            (2, 1200),
            (3, 1800),
            (4, 1800),
            (5, 9000),
        ] {
            ring.insert(key, free);
        }
        ring
    }

    #[test]
    fn best_fit_is_a_range_query_from_the_demand() {
        let ring = ring();
        let all = |_: AgentKey| true;
        assert_eq!(ring.best_fit(1, 1000, &all), Some((1200, 2)));
        assert_eq!(ring.best_fit(1, 1300, &all), Some((1500, 1)));
        assert_eq!(ring.best_fit(1, 1800, &all), Some((1800, 3)));
        assert_eq!(ring.best_fit(1, 1801, &all), None);
        assert_eq!(ring.best_fit(1, 1000, &|k| k != 2), Some((1500, 1)));
        assert_eq!(ring.best_fit(0, 600, &all), None);
    }

    #[test]
    fn largest_fit_prefers_the_lowest_key_among_equals() {
        let ring = ring();
        assert_eq!(ring.largest_fit(1, 0, &|_| true), Some((1800, 3)));
        assert_eq!(ring.largest_fit(1, 0, &|k| k != 3), Some((1800, 4)));
        assert_eq!(ring.largest_fit(1, 0, &|k| k == 2), Some((1200, 2)));
        assert_eq!(ring.largest_fit(3, 0, &|_| true), Some((9000, 5)));
    }

    #[test]
    fn relocate_moves_between_buckets() {
        let mut ring = ring();
        ring.relocate(5, 9000, 200);
        assert_eq!(ring.count(3), 0);
        assert!(ring.holds(0, 5, 200));
        assert_eq!(ring.members(0).collect::<Vec<_>>(), [(200, 5), (500, 0)]);
    }
}
