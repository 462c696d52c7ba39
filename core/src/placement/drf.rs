//! Weighted dominant resource fairness: which framework is served next.
//!
//! A framework's dominant share is the largest, over dimensions, of what it holds ÷ the cluster
//! total; divided by its weight it orders the frameworks, lowest first. Ties go to the framework
//! allocated to fewer times, then to the one registered first. This module only keeps the books;
//! [`super::allocation`] drives it.

use std::collections::BTreeMap;

use super::{FrameworkKey, Resources};

#[derive(Clone, Debug)]
struct FrameworkShare {
    weight: f64,
    allocation: Resources,
    /// How many times it has been allocated to (never decreases, as in Mesos' sorter).
    allocations: u64,
    registration: u64,
    suppressed: bool,
}

/// The position of a framework in DRF order; smaller is served first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SortKey {
    /// Bits of a non-negative f64 share: their integer order is the numeric order.
    share_bits: u64,
    allocations: u64,
    registration: u64,
    pub framework: FrameworkKey,
}

impl SortKey {
    pub fn share(&self) -> f64 {
        f64::from_bits(self.share_bits)
    }

    /// A key from its fields, for tests of what orders keys.
    #[cfg(test)]
    pub(crate) fn of(
        share: f64,
        allocations: u64,
        registration: u64,
        framework: FrameworkKey,
    ) -> Self {
        SortKey {
            share_bits: share.to_bits(),
            allocations,
            registration,
            framework,
        }
    }
}

/// The DRF books: weight, allocation and registration order of every framework.
#[derive(Clone, Debug, Default)]
pub struct DrfSorter {
    frameworks: BTreeMap<FrameworkKey, FrameworkShare>,
    next_registration: u64,
}

/// Weights must be finite and positive; anything else counts as 1 (callers validate input).
fn sane_weight(weight: f64) -> f64 {
    if weight.is_finite() && weight > 0.0 {
        weight
    } else {
        1.0
    }
}

/// max over dimensions the cluster has of allocation ÷ total.
pub fn dominant_share(allocation: &Resources, total: &Resources) -> f64 {
    allocation
        .iter()
        .filter_map(|(name, held)| {
            let have = total.milli(name);
            (have > 0).then(|| held as f64 / have as f64)
        })
        .fold(0.0, f64::max)
}

impl DrfSorter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a framework (re-adding an existing one keeps its books and sets the weight).
    pub fn add(&mut self, fw: FrameworkKey, weight: f64) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.weight = sane_weight(weight);
            return;
        }
        let registration = self.next_registration;
        self.next_registration += 1;
        self.frameworks.insert(
            fw,
            FrameworkShare {
                weight: sane_weight(weight),
                allocation: Resources::new(),
                allocations: 0,
                registration,
                suppressed: false,
            },
        );
    }

    pub fn remove(&mut self, fw: FrameworkKey) {
        self.frameworks.remove(&fw);
    }

    pub fn contains(&self, fw: FrameworkKey) -> bool {
        self.frameworks.contains_key(&fw)
    }

    pub fn len(&self) -> usize {
        self.frameworks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frameworks.is_empty()
    }

    pub fn set_weight(&mut self, fw: FrameworkKey, weight: f64) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.weight = sane_weight(weight);
        }
    }

    pub fn weight(&self, fw: FrameworkKey) -> Option<f64> {
        self.frameworks.get(&fw).map(|f| f.weight)
    }

    /// Takes the framework out of the order until [`revive`](DrfSorter::revive).
    pub fn suppress(&mut self, fw: FrameworkKey) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.suppressed = true;
        }
    }

    pub fn revive(&mut self, fw: FrameworkKey) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.suppressed = false;
        }
    }

    pub fn is_suppressed(&self, fw: FrameworkKey) -> bool {
        self.frameworks.get(&fw).is_some_and(|f| f.suppressed)
    }

    /// Records that `fw` now also holds `r`.
    pub fn allocated(&mut self, fw: FrameworkKey, r: &Resources) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            for (name, m) in r.iter() {
                let sum = f.allocation.milli(name).saturating_add(m);
                f.allocation.set_milli(name, sum);
            }
            f.allocations += 1;
        }
    }

    /// [`allocated`](DrfSorter::allocated) of the `(name, amount)` pairs `r`, then
    /// [`sort_key`](DrfSorter::sort_key), finding the framework once (the allocation step does
    /// both for every serve).
    /// With `total` `None` (a framework served alone, with no other to be ordered against)
    /// the key's share is not computed: it is [`alone_key`](DrfSorter::alone_key).
    pub(crate) fn allocated_and_sort_key<'a>(
        &mut self,
        fw: FrameworkKey,
        r: impl IntoIterator<Item = (&'a str, u64)>,
        total: Option<&Resources>,
    ) -> Option<SortKey> {
        let f = self.frameworks.get_mut(&fw)?;
        f.allocation.saturating_add_each(r);
        f.allocations += 1;
        let Some(total) = total else {
            return self.alone_key(fw);
        };
        (!f.suppressed).then(|| SortKey {
            share_bits: (dominant_share(&f.allocation, total) / f.weight).to_bits(),
            allocations: f.allocations,
            registration: f.registration,
            framework: fw,
        })
    }

    /// The key of a framework served alone in a step (no other framework to order it
    /// against): `None` exactly when [`sort_key`](DrfSorter::sort_key) is (unknown or
    /// suppressed), without computing the share.
    pub(crate) fn alone_key(&self, fw: FrameworkKey) -> Option<SortKey> {
        self.frameworks
            .get(&fw)
            .filter(|f| !f.suppressed)
            .map(|_| SortKey {
                share_bits: 0,
                allocations: 0,
                registration: 0,
                framework: fw,
            })
    }

    /// Records that `fw` released `r` (never below zero).
    pub fn unallocated(&mut self, fw: FrameworkKey, r: &Resources) {
        if let Some(f) = self.frameworks.get_mut(&fw) {
            f.allocation = f.allocation.saturating_sub(r);
        }
    }

    pub fn allocation(&self, fw: FrameworkKey) -> Option<&Resources> {
        self.frameworks.get(&fw).map(|f| &f.allocation)
    }

    /// Weighted dominant share: max_i(allocation_i ÷ total_i) ÷ weight (0 for an unknown framework).
    pub fn share(&self, fw: FrameworkKey, total: &Resources) -> f64 {
        self.frameworks
            .get(&fw)
            .map_or(0.0, |f| dominant_share(&f.allocation, total) / f.weight)
    }

    /// The framework's place in the order (`None` if unknown or suppressed).
    pub fn sort_key(&self, fw: FrameworkKey, total: &Resources) -> Option<SortKey> {
        let f = self.frameworks.get(&fw).filter(|f| !f.suppressed)?;
        Some(SortKey {
            share_bits: (dominant_share(&f.allocation, total) / f.weight).to_bits(),
            allocations: f.allocations,
            registration: f.registration,
            framework: fw,
        })
    }

    /// Non-suppressed frameworks, lowest weighted share first.
    pub fn order(&self, total: &Resources) -> Vec<FrameworkKey> {
        let mut keys: Vec<SortKey> = self
            .frameworks
            .keys()
            .filter_map(|fw| self.sort_key(*fw, total))
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|k| k.framework).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    #[test]
    fn weighted_shares_and_order() {
        let total = r("cpus:10;mem:10000");
        let mut drf = DrfSorter::new();
        drf.add(7, 1.0);
        drf.add(3, 2.0);
        drf.add(5, 1.0);
        assert_eq!(drf.order(&total), [7, 3, 5]); // all 0: registration order
        drf.allocated(7, &r("cpus:2;mem:1000")); // 0.2
        drf.allocated(3, &r("cpus:1;mem:6000")); // 0.6 / 2 = 0.3
        assert_eq!(drf.share(7, &total), 0.2);
        assert_eq!(drf.share(3, &total), 0.3);
        assert_eq!(drf.order(&total), [5, 7, 3]);
        drf.allocated(5, &r("cpus:1"));
        drf.allocated(5, &r("cpus:1")); // 0.2 with 2 allocations: after 7
        assert_eq!(drf.order(&total), [7, 5, 3]);
        drf.suppress(7);
        assert!(drf.is_suppressed(7));
        assert_eq!(drf.order(&total), [5, 3]);
        drf.revive(7);
        drf.unallocated(3, &r("cpus:5;mem:5000"));
        assert_eq!(drf.allocation(3), Some(&r("mem:1000")));
        assert_eq!(drf.order(&total), [3, 7, 5]);
        drf.set_weight(7, 4.0);
        assert_eq!(drf.share(7, &total), 0.05);
        drf.remove(3);
        assert_eq!(drf.order(&total), [7, 5]);
        assert_eq!(drf.share(3, &total), 0.0);
        drf.add(9, f64::NAN);
        assert_eq!(drf.weight(9), Some(1.0));
    }
}
