//! Placement core: which agent gets a demand, and which framework is served next.
//!
//! Pure, synchronous and deterministic: no I/O, no async, no clock, so the master, the dry-run
//! CLI, tests and benchmarks all drive the same code and get the same answers. Pieces:
//! - [`rings`]: how a dimension is cut into buckets; [`ring_set`]: the agents in those buckets;
//! - [`Cluster`] (here): agents in a slab, one ring set per dimension, running totals;
//! - [`placer`]: the [`Placer`] interface and the ring search of SPEC seed 001, plus baselines;
//! - [`balance`]: balance-degree placement with dynamic weights (seed 000) and the
//!   [`PlacementContext`] it needs; [`node_preference`]: least-requested, most-balanced (seed 004);
//! - [`drf`]: the weighted dominant-resource-fairness order of frameworks;
//! - [`allocation`]: one allocation step joining the two;
//! - [`priority`]: user priorities, priority quotas and preemption plans (seed 003);
//! - [`why`]: a readable reason when nothing fits.

pub mod allocation;
pub mod balance;
pub mod drf;
pub mod node_preference;
pub mod placer;
pub mod priority;
pub mod ring_set;
pub mod rings;
pub mod why;

use std::collections::BTreeMap;

use ringmaster_proto::resources::format_milli;
use slab::Slab;

pub use allocation::{allocate, allocate_in, Allocation, Grant, Request};
pub use balance::{BalanceNote, BalancePlacer, BalanceSettings, PlacementContext};
pub use drf::DrfSorter;
pub use node_preference::{LeastRequested, MostBalanced};
pub use placer::{Decision, FirstFit, LinearBestFit, Phase, Placer, PlacerKind, RingPlacer};
pub use priority::{
    plan_preemption, task_priority, PreemptionPlan, Priority, PriorityConfig, QuotaLedger,
    RunningTask, TaskPriority, UserGrant, DEFAULT_PARTITION,
};
pub use ring_set::RingSet;
pub use ringmaster_proto::resources::{ResourceError, Resources};
pub use rings::{RingLayout, RingLayoutError, RingSpec, RingsConfig};
pub use why::WhyUnplaced;

/// An agent's slab key: compact, stable while the agent is present, reused after removal.
pub type AgentKey = usize;
/// A framework's key, chosen by the caller.
pub type FrameworkKey = usize;

/// An agent as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEntry {
    pub total: Resources,
    pub free: Resources,
}

/// Why a change to an agent's free resources was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("no agent with key {0}")]
    UnknownAgent(AgentKey),
    #[error("agent {agent}: {source}")]
    Insufficient {
        agent: AgentKey,
        source: ResourceError,
    },
    #[error("agent {agent}: giving back {given} would raise free `{name}` above its total")]
    AboveTotal {
        agent: AgentKey,
        name: String,
        given: Resources,
    },
}

/// One bucket of a [`RingView`], amounts in the dimension's units.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BucketView {
    pub lower: f64,
    /// `None` for the open-ended top bucket.
    pub upper: Option<f64>,
    pub agents: usize,
}

/// A read-only picture of one dimension's ring, for state pages.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RingView {
    pub name: String,
    pub search_up: usize,
    pub buckets: Vec<BucketView>,
}

/// The agents, one ring set per dimension they have, and running cluster totals.
///
/// An agent is filed in the ring of every dimension its *total* has (an agent without GPUs is in
/// no `gpus` bucket: no GPU demand can fit it), in the bucket of its current *free* amount, and
/// is refiled in every dimension that changes on each [`take`](Cluster::take) /
/// [`give_back`](Cluster::give_back).
#[derive(Clone, Debug)]
pub struct Cluster {
    config: RingsConfig,
    placer: PlacerKind,
    agents: Slab<AgentEntry>,
    rings: BTreeMap<String, RingSet>,
    total: Resources,
    free: Resources,
}

/// Adds per dimension, saturating at the largest amount instead of failing (cluster sums only).
fn saturating_add(into: &mut Resources, add: &Resources) {
    for (name, m) in add.iter() {
        let sum = into.milli(name).saturating_add(m);
        into.set_milli(name, sum);
    }
}

impl Cluster {
    pub fn new(rings: RingsConfig, placer: PlacerKind) -> Self {
        Cluster {
            config: rings,
            placer,
            agents: Slab::new(),
            rings: BTreeMap::new(),
            total: Resources::new(),
            free: Resources::new(),
        }
    }

    /// Registers an agent with everything free.
    pub fn add_agent(&mut self, total: Resources) -> AgentKey {
        let key = self.agents.insert(AgentEntry {
            total: total.clone(),
            free: total.clone(),
        });
        for (name, amount) in total.iter() {
            let config = &self.config;
            self.rings
                .entry(name.to_string())
                .or_insert_with(|| RingSet::new(name, config.spec_for(name).clone()))
                .insert(key, amount);
        }
        saturating_add(&mut self.total, &total);
        saturating_add(&mut self.free, &total);
        key
    }

    /// Unregisters an agent, taking it out of every ring.
    pub fn remove_agent(&mut self, key: AgentKey) -> Option<AgentEntry> {
        let entry = self.agents.try_remove(key)?;
        for (name, _) in entry.total.iter() {
            if let Some(ring) = self.rings.get_mut(name) {
                ring.remove(key, entry.free.milli(name));
            }
        }
        self.total = self.total.saturating_sub(&entry.total);
        self.free = self.free.saturating_sub(&entry.free);
        Some(entry)
    }

    pub fn agent(&self, key: AgentKey) -> Option<&AgentEntry> {
        self.agents.get(key)
    }

    /// Agents in key order.
    pub fn agents(&self) -> impl Iterator<Item = (AgentKey, &AgentEntry)> {
        self.agents.iter()
    }

    /// Takes `r` out of the agent's free resources (refused if any dimension would go below 0).
    pub fn take(&mut self, key: AgentKey, r: &Resources) -> Result<(), PlacementError> {
        let entry = self
            .agents
            .get_mut(key)
            .ok_or(PlacementError::UnknownAgent(key))?;
        // Check every dimension first, then change in place: no copy of the bundle.
        for (name, need) in r.iter() {
            let have = entry.free.milli(name);
            if have < need {
                return Err(PlacementError::Insufficient {
                    agent: key,
                    source: ResourceError::Insufficient {
                        name: name.to_string(),
                        have: format_milli(have),
                        need: format_milli(need),
                    },
                });
            }
        }
        for (name, m) in r.iter() {
            let old = entry.free.milli(name);
            entry.free.set_milli(name, old - m);
            if let Some(ring) = self.rings.get_mut(name) {
                ring.relocate(key, old, old - m);
            }
            let sum = self.free.milli(name);
            self.free.set_milli(name, sum.saturating_sub(m));
        }
        Ok(())
    }

    /// Returns `r` to the agent's free resources (refused if any dimension would exceed total).
    pub fn give_back(&mut self, key: AgentKey, r: &Resources) -> Result<(), PlacementError> {
        let entry = self
            .agents
            .get_mut(key)
            .ok_or(PlacementError::UnknownAgent(key))?;
        for (name, m) in r.iter() {
            let sum = entry.free.milli(name).checked_add(m);
            if sum.is_none_or(|s| s > entry.total.milli(name)) {
                return Err(PlacementError::AboveTotal {
                    agent: key,
                    name: name.to_string(),
                    given: r.clone(),
                });
            }
        }
        for (name, m) in r.iter() {
            let old = entry.free.milli(name);
            entry.free.set_milli(name, old + m);
            if let Some(ring) = self.rings.get_mut(name) {
                ring.relocate(key, old, old + m);
            }
            let sum = self.free.milli(name);
            self.free.set_milli(name, sum.saturating_add(m));
        }
        Ok(())
    }

    /// Sum of every agent's total.
    pub fn total(&self) -> &Resources {
        &self.total
    }

    /// Sum of every agent's free resources.
    pub fn free(&self) -> &Resources {
        &self.free
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    pub fn placer(&self) -> PlacerKind {
        self.placer
    }

    /// The ring set of one dimension, if any agent has had that dimension.
    pub fn ring(&self, dimension: &str) -> Option<&RingSet> {
        self.rings.get(dimension)
    }

    /// Picks an agent for `demand` with the cluster's placer, among agents `eligible` accepts.
    pub fn place(
        &self,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        self.place_with(self.placer.placer(), demand, eligible)
    }

    /// Same as [`place`](Cluster::place), telling the placer what `context` knows (the balance
    /// placer's settings and the pending demands).
    pub fn place_in(
        &self,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        self.placer
            .placer()
            .place_in(self, demand, eligible, context)
    }

    /// Same as [`place`](Cluster::place) with another placer (for comparisons).
    pub fn place_with(
        &self,
        placer: &dyn Placer,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        placer.place(self, demand, eligible)
    }

    /// Why no eligible agent fits `demand`, per dimension.
    pub fn why_unplaced(
        &self,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> WhyUnplaced {
        WhyUnplaced::explain(self, demand, eligible)
    }

    /// Every ring with its bucket ranges and occupancy, dimensions sorted by name.
    pub fn rings(&self) -> Vec<RingView> {
        let units = |m: u64| m as f64 / ringmaster_proto::resources::MILLI as f64;
        self.rings
            .values()
            .map(|ring| RingView {
                name: ring.name().to_string(),
                search_up: ring.search_up(),
                buckets: (0..ring.len())
                    .map(|i| {
                        let (lower, upper) = ring.layout().range(i);
                        BucketView {
                            lower: units(lower),
                            upper: upper.map(units),
                            agents: ring.count(i),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// The bucket the agent is actually filed in for `dimension` (`None` if it is not filed
    /// there, e.g. its total lacks the dimension).
    pub fn bucket_of(&self, key: AgentKey, dimension: &str) -> Option<usize> {
        let entry = self.agents.get(key)?;
        let ring = self.rings.get(dimension)?;
        let free = entry.free.milli(dimension);
        let bucket = ring.bucket_of(free);
        ring.holds(bucket, key, free).then_some(bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    #[test]
    fn agents_move_buckets_in_every_dimension() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(r("cpus:4;mem:8192"));
        assert_eq!(cluster.bucket_of(a, "cpus"), Some(4));
        assert_eq!(cluster.bucket_of(a, "mem"), Some(6));
        assert_eq!(cluster.bucket_of(a, "gpus"), None);
        cluster.take(a, &r("cpus:2;mem:1024")).unwrap();
        cluster.take(a, &r("cpus:2;mem:2048")).unwrap();
        // SPEC seed 001: 4 CPU / 8 GB minus (2, 1 GB) and (2, 2 GB) leaves 0 CPU and 5 GB.
        assert_eq!(cluster.agent(a).unwrap().free, r("mem:5120"));
        assert_eq!(cluster.bucket_of(a, "cpus"), Some(0));
        assert_eq!(cluster.bucket_of(a, "mem"), Some(5));
        assert_eq!(cluster.free(), &r("mem:5120"));
        assert_eq!(cluster.total(), &r("cpus:4;mem:8192"));
        let err = cluster.take(a, &r("cpus:1")).unwrap_err();
        assert_eq!(err.to_string(), "agent 0: not enough `cpus`: 0 < 1");
        let err = cluster.give_back(a, &r("mem:4096")).unwrap_err();
        assert!(err.to_string().contains("above its total"), "{err}");
        cluster.give_back(a, &r("cpus:4;mem:3072")).unwrap();
        assert_eq!(cluster.agent(a).unwrap().free, r("cpus:4;mem:8192"));
        assert_eq!(cluster.bucket_of(a, "cpus"), Some(4));
        assert_eq!(cluster.remove_agent(a).unwrap().total, r("cpus:4;mem:8192"));
        assert!(cluster.total().is_empty() && cluster.free().is_empty());
        assert_eq!(
            cluster.rings()[0]
                .buckets
                .iter()
                .map(|b| b.agents)
                .sum::<usize>(),
            0
        );
        assert_eq!(
            cluster.take(a, &r("cpus:1")),
            Err(PlacementError::UnknownAgent(a))
        );
    }

    #[test]
    fn ring_views_show_ranges_in_units() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        cluster.add_agent(r("cpus:1.5;mem:300"));
        let views = cluster.rings();
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].name, "cpus");
        assert_eq!(views[0].search_up, 2);
        assert_eq!(
            views[0].buckets[1],
            BucketView {
                lower: 1.0,
                upper: Some(2.0),
                agents: 1
            }
        );
        assert_eq!(views[0].buckets[63].upper, None);
        assert_eq!(
            views[1].buckets[1],
            BucketView {
                lower: 256.0,
                upper: Some(512.0),
                agents: 1
            }
        );
    }
}
