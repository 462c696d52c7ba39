//! Placement core: which agent gets a demand, and which framework is served next.
//!
//! Pure, synchronous and deterministic: no I/O, no async, no clock, so the master, the dry-run
//! CLI, tests and benchmarks all drive the same code and get the same answers. Pieces:
//! - [`rings`]: how a dimension is cut into buckets; [`ring_set`]: the agents in those buckets;
//! - [`Cluster`] (here): agents in a slab, one ring set per dimension, running totals;
//! - [`placers`]: the [`Placer`] trait (one entry point) and each placer in its own module —
//!   the ring search of SPEC seed 001 with its options (sparing, a caller-scored tie-break),
//!   the baselines, balance degree with dynamic weights (seed 000), least-requested and
//!   most-balanced (seed 004) — with [`PlacerKind`] to choose one by name and the
//!   [`PlacementContext`] they may read;
//! - [`drf`]: the weighted dominant-resource-fairness order of frameworks;
//! - [`allocation`]: one allocation step joining the two;
//! - [`cycle`]: the whole allocation cycle (priority tiers, DRF, feasibility, placement,
//!   preemption) the master runs and the dry-run replays; [`feasible`]: its named filters;
//! - [`priority`]: user priorities, priority quotas and preemption plans (seed 003);
//! - [`why`]: a readable reason when nothing fits;
//! - [`matching`]: a whole burst of deadline-bound tasks matched at once (SPEC seed 002);
//! - [`devices`]: every agent's GPUs device by device, for the device fit and binding (seed 004);
//! - [`fragmentation`]: FGD's expected GPU fragment, the ring's tie-break score.
//!
//! The modules `placer`, `balance`, `node_preference` and `ring_search` of earlier versions are
//! kept as paths to the same items.

pub mod allocation;
pub mod changes;
pub mod cycle;
pub mod devices;
pub mod drf;
pub mod feasible;
pub mod fragmentation;
pub mod holds;
pub mod keys;
pub mod matching;
pub mod placers;
pub mod priority;
pub mod ring_search;
pub mod ring_set;
pub mod rings;
pub mod why;

/// The balance placer and its settings (old path of [`placers::balance`]).
pub use placers::balance;
/// Least-requested and most-balanced (old path of [`placers::node_preference`]).
pub use placers::node_preference;

/// The placer interface, kinds, the ring placer and the baselines (old path).
pub mod placer {
    pub use super::placers::baselines::{FirstFit, LinearBestFit};
    pub use super::placers::kind::{PlacerKind, UnknownPlacer};
    pub use super::placers::ring::RingPlacer;
    pub use super::placers::{dominant_dimension, Decision, Phase, Placer, PlacerNote};
}

use std::sync::OnceLock;

use crate::resources::find_name;
use compact_str::CompactString;
use slab::Slab;

pub use crate::resources::{ResourceError, Resources};
pub use allocation::{allocate, allocate_in, Allocation, Grant, Request};
pub use cycle::{
    run_cycle, CycleInput, Outcome, Preemption, Quotas, TieredRequest, Unserved, UnservedReason,
};
pub use drf::DrfSorter;
pub use feasible::{AgentFacts, Filter};
pub use holds::{apply_outcome, Hold, Holds};
pub use keys::{AgentKey, FrameworkKey};
pub use placers::balance::BalancePlacer;
pub use placers::baselines::{FirstFit, LinearBestFit};
pub use placers::context::{AgentScore, BalanceSettings, PlacementContext};
pub use placers::kind::PlacerKind;
pub use placers::node_preference::{LeastRequested, MostBalanced};
pub use placers::ring::RingPlacer;
pub use placers::{BalanceNote, Decision, Phase, Placer, PlacerNote};
pub use priority::{
    no_devices, plan_preemption, plan_preemption_with, task_priority, DeviceCheck, PreemptionPlan,
    Priority, PriorityConfig, QuotaLedger, RunningTask, TaskPriority, UserGrant, DEFAULT_PARTITION,
};
pub use ring_search::{RingSearch, RingSearchError};
pub use ring_set::RingSet;
pub use rings::{RingLayout, RingLayoutError, RingSpec, RingsConfig};
pub use why::WhyUnplaced;

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
///
/// Inside, dimension names are interned to dense indices in order of first appearance, and every
/// agent's free amounts sit side by side in one table row indexed by agent key ([`FreeTable`]),
/// so the hot paths (fits checks during a ring search, emptying an agent for a whole-agent
/// offer) read numbers from one place in memory per agent instead of comparing names. The public [`AgentEntry`] bundles are
/// kept in step; the cluster's free sum is kept by index and turned into a [`Resources`] only
/// when [`free`](Cluster::free) is asked for.
#[derive(Clone, Debug)]
pub struct Cluster {
    config: RingsConfig,
    placer: PlacerKind,
    agents: Slab<AgentEntry>,
    /// By dimension index.
    dimensions: Vec<Dimension>,
    /// Every agent's free amount of every dimension.
    free_table: FreeTable,
    /// Dimension name → index, sorted by name.
    index: NameIndex,
    /// The sum of every agent's total, clamped to `u64::MAX` per dimension for display and
    /// shares; the exact sums are [`Dimension::total`], so removing an agent never leaves a
    /// wrong (saturated-then-subtracted) total behind.
    total: Resources,
    /// The sum of free amounts as a bundle, built from `dimensions` on first use after a change.
    free: OnceLock<Resources>,
    /// Indices of the ring search's spared dimensions ([`RingSearch::spare`]) some agent has had.
    ///
    /// [`RingSearch::spare`]: placers::ring::RingSearch::spare
    spare: Vec<usize>,
    /// Which agents changed lately, numbered ([`Cluster::changes`]).
    changes: changes::ChangeLog,
}

/// One dimension some agent has had: its ring set, every agent's free amount and their sum.
#[derive(Clone, Debug)]
struct Dimension {
    ring: RingSet,
    /// The same ring restricted to the *plain* agents, those with none of any spared dimension
    /// free (e.g. no free GPU), kept only when the ring search spares something: its sparing
    /// search walks this ring instead of walking past every agent it spares, and fails at once
    /// (by [`RingSet::max_free`]) when no plain agent has the demand's dominant amount free.
    plain: Option<RingSet>,
    /// Exact sum of every agent's free amount: `u128` cannot overflow (it would take 2^64
    /// agents at `u64::MAX` each), so adding and removing agents keeps it exact.
    free: u128,
    /// Exact sum of every agent's total amount.
    total: u128,
}

/// A cluster sum as a `u64` amount: clamped at the largest amount.
fn clamp_sum(sum: u128) -> u64 {
    u64::try_from(sum).unwrap_or(u64::MAX)
}

/// Free amounts by (agent key, dimension index), agent-major: an agent's amounts of every
/// dimension are one row, so checking an agent against a demand of several dimensions reads one
/// place in memory. 0 past the end, for absent agents and dimensions they lack.
#[derive(Clone, Debug, Default)]
struct FreeTable {
    /// Dimensions per row.
    stride: usize,
    amounts: Vec<u64>,
}

impl FreeTable {
    fn get(&self, key: AgentKey, d: usize) -> u64 {
        self.amounts
            .get(key * self.stride + d)
            .copied()
            .unwrap_or(0)
    }

    /// One agent's amounts by dimension index; `None` past the end (an absent agent, or one
    /// whose amounts are all 0 and never set).
    fn row(&self, key: AgentKey) -> Option<&[u64]> {
        let start = key * self.stride;
        self.amounts.get(start..start + self.stride)
    }

    fn set(&mut self, key: AgentKey, d: usize, amount: u64) {
        let at = key * self.stride + d;
        if at >= self.amounts.len() {
            if amount == 0 {
                return;
            }
            self.amounts.resize((key + 1) * self.stride, 0);
        }
        self.amounts[at] = amount;
    }

    /// Room for one more dimension (index `stride`) in every row, at 0.
    fn add_dimension(&mut self) {
        let stride = self.stride + 1;
        let rows = self.amounts.len() / self.stride.max(1);
        let mut amounts = vec![0; rows * stride];
        for (row, old) in self.amounts.chunks(self.stride.max(1)).enumerate() {
            amounts[row * stride..row * stride + old.len()].copy_from_slice(old);
        }
        self.stride = stride;
        self.amounts = amounts;
    }
}

/// Whether a free-table row is short of `need` (a demand's row, 0 past its dimensions) in any
/// dimension. Rows of up to four dimensions are compared as that many numbers with one test at
/// the end (no loop, no branch per dimension); wider ones amount by amount.
#[inline]
fn short_of(free: &[u64], need: &[u64; INLINE_DIMENSIONS]) -> bool {
    match *free {
        [a] => a < need[0],
        [a, b] => (a < need[0]) | (b < need[1]),
        [a, b, c] => (a < need[0]) | (b < need[1]) | (c < need[2]),
        [a, b, c, d] => (a < need[0]) | (b < need[1]) | (c < need[2]) | (d < need[3]),
        _ => free.iter().zip(need).any(|(f, n)| f < n),
    }
}

/// Dimension names and their indices, sorted by name: a binary search with the short-name
/// comparison of bundles (`find_name`), no `memcmp` call per probe; and each name of up to 16
/// bytes also as one 128-bit key (its bytes, zero-padded), so that a cluster of a few
/// dimensions finds a short name by comparing numbers in one pass. A cluster has a few
/// dimensions, named on every placement.
#[derive(Clone, Debug, Default)]
struct NameIndex {
    entries: Vec<(CompactString, usize)>,
    /// `entries`' names as [`short_key`]s, in the same order (`None` for longer names).
    keys: Vec<Option<(u128, usize)>>,
}

/// The most dimensions [`NameIndex::get`] compares by key in one pass before searching.
const KEYED_NAMES: usize = 16;

/// A name of up to 16 bytes as a number and its length: equal exactly when the names are.
#[inline]
fn short_key(name: &str) -> Option<(u128, usize)> {
    let bytes = name.as_bytes();
    let mut key = [0u8; 16];
    key.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some((u128::from_le_bytes(key), bytes.len()))
}

impl NameIndex {
    #[inline]
    fn get(&self, name: &str) -> Option<&usize> {
        if self.entries.len() <= KEYED_NAMES {
            if let Some(key) = short_key(name) {
                let at = self.keys.iter().position(|&k| k == Some(key))?;
                return self.entries.get(at).map(|(_, i)| i);
            }
        }
        find_name(&self.entries, name)
            .ok()
            .map(|i| &self.entries[i].1)
    }

    fn insert(&mut self, name: &str, index: usize) {
        match find_name(&self.entries, name) {
            Ok(i) => self.entries[i].1 = index,
            Err(i) => {
                self.entries.insert(i, (CompactString::from(name), index));
                self.keys.insert(i, short_key(name));
            }
        }
    }

    /// Names and indices, by name.
    fn iter(&self) -> impl Iterator<Item = (&str, &usize)> + '_ {
        self.entries.iter().map(|(n, i)| (n.as_str(), i))
    }

    fn values(&self) -> impl Iterator<Item = &usize> + '_ {
        self.entries.iter().map(|(_, i)| i)
    }
}

/// The most dimensions a demand may have for [`ResolvedDemand`] to hold it inline.
const INLINE_DIMENSIONS: usize = 8;

/// A demand with its dimension names resolved to the cluster's indices once, so that checking
/// each candidate agent compares numbers (see [`Cluster::resolve`]).
pub(crate) struct ResolvedDemand<'a> {
    demand: &'a Resources,
    needs: [(usize, u64); INLINE_DIMENSIONS],
    /// How many of `needs` are used; `None` when the demand has more dimensions than fit inline
    /// (fits checks then compare names).
    len: Option<usize>,
    /// The demand names a dimension no agent has ever had: nothing fits.
    unknown: bool,
    /// The needs as one free-table row (0 for dimensions not asked for) when the cluster has
    /// at most [`INLINE_DIMENSIONS`] dimensions and the demand some known ones: a check
    /// compares an agent's row with it in one pass.
    row: Option<[u64; INLINE_DIMENSIONS]>,
}

impl Cluster {
    pub fn new(rings: RingsConfig, placer: PlacerKind) -> Self {
        Cluster {
            config: rings,
            placer,
            agents: Slab::new(),
            dimensions: Vec::new(),
            free_table: FreeTable::default(),
            index: NameIndex::default(),
            total: Resources::new(),
            free: OnceLock::new(),
            spare: Vec::new(),
            changes: changes::ChangeLog::default(),
        }
    }

    /// The agents that changed lately, in order: every agent added or removed, every take and
    /// give-back, every grade and class given (even the one it had), so a caller may tie what
    /// it knows of an agent to these.
    pub fn changes(&self) -> &changes::ChangeLog {
        &self.changes
    }

    /// The index of a dimension, creating its (empty) ring on first sight.
    fn dimension_index(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.dimensions.len();
        let spec = self.config.spec_for(name);
        let spared = self.config.search().spare();
        self.dimensions.push(Dimension {
            ring: RingSet::new(name, spec.clone()),
            plain: (!spared.is_empty()).then(|| RingSet::new(name, spec.clone())),
            free: 0,
            total: 0,
        });
        self.free_table.add_dimension();
        if spared.iter().any(|s| s == name) {
            self.spare.push(i);
        }
        self.index.insert(name, i);
        i
    }

    /// The agent has none of any spared dimension free (true for absent agents).
    fn is_plain(&self, key: AgentKey) -> bool {
        self.spare.iter().all(|&d| self.free_table.get(key, d) == 0)
    }

    /// Files the agent in (`file`) or takes it out of the plain ring of every dimension of its
    /// total, at its current free amounts.
    fn refile_plain(&mut self, key: AgentKey, file: bool) {
        let Some(entry) = self.agents.get(key) else {
            return;
        };
        for (name, _) in entry.total.iter() {
            if let Some(&d) = self.index.get(name) {
                let free = self.free_table.get(key, d);
                let dimension = &mut self.dimensions[d];
                if let Some(plain) = &mut dimension.plain {
                    if file {
                        plain.insert(key, free);
                    } else {
                        plain.remove(key, free);
                    }
                }
            }
        }
    }

    /// Registers an agent with everything free.
    pub fn add_agent(&mut self, total: Resources) -> AgentKey {
        let key = self.agents.vacant_key();
        let plain = self
            .config
            .search()
            .spare()
            .iter()
            .all(|s| total.milli(s) == 0);
        for (name, amount) in total.iter() {
            let d = self.dimension_index(name);
            self.free_table.set(key, d, amount);
            let dimension = &mut self.dimensions[d];
            dimension.ring.insert(key, amount);
            if let Some(ring) = dimension.plain.as_mut().filter(|_| plain) {
                ring.insert(key, amount);
            }
            dimension.free += u128::from(amount);
            dimension.total += u128::from(amount);
            self.total.set_milli(name, clamp_sum(dimension.total));
        }
        self.free.take();
        let inserted = self.agents.insert(AgentEntry {
            total: total.clone(),
            free: total,
        });
        debug_assert_eq!(inserted, key);
        self.changes.record(key);
        key
    }

    /// Unregisters an agent, taking it out of every ring.
    pub fn remove_agent(&mut self, key: AgentKey) -> Option<AgentEntry> {
        let plain = self.is_plain(key);
        let entry = self.agents.try_remove(key)?;
        self.changes.record(key);
        for (name, _) in entry.total.iter() {
            if let Some(&d) = self.index.get(name) {
                let free = self.free_table.get(key, d);
                let dimension = &mut self.dimensions[d];
                dimension.ring.remove(key, free);
                if let Some(ring) = dimension.plain.as_mut().filter(|_| plain) {
                    ring.remove(key, free);
                }
                dimension.free = dimension.free.saturating_sub(u128::from(free));
                dimension.total = dimension
                    .total
                    .saturating_sub(u128::from(entry.total.milli(name)));
                // The key will be reused: the next agent starts from 0 here, ungraded.
                self.free_table.set(key, d, 0);
                dimension.ring.set_grade(key, 0, ring_set::UNGRADED);
                dimension.ring.set_class(key, 0, ring_set::UNCLASSED);
                if let Some(plain) = &mut dimension.plain {
                    plain.set_grade(key, 0, ring_set::UNGRADED);
                    plain.set_class(key, 0, ring_set::UNCLASSED);
                }
                self.total.set_milli(name, clamp_sum(dimension.total));
            }
        }
        self.free.take();
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
        self.changes.record(key);
        // Taking never gives a spared dimension free amount: a plain agent stays plain.
        let was_plain = self.is_plain(key);
        let entry = self
            .agents
            .get_mut(key)
            .ok_or(PlacementError::UnknownAgent(key))?;
        // Checks every dimension first, then changes in place: no copy of the bundle.
        let (index, free_table, dimensions) =
            (&self.index, &mut self.free_table, &mut self.dimensions);
        entry
            .free
            .checked_sub_assign_with(r, |name, old, new| {
                // A dimension of `r` the agent has free is one of its total's: it has an index.
                if let Some(&d) = index.get(name) {
                    free_table.set(key, d, new);
                    let dimension = &mut dimensions[d];
                    dimension.ring.relocate(key, old, new);
                    if let Some(ring) = dimension.plain.as_mut().filter(|_| was_plain) {
                        ring.relocate(key, old, new);
                    }
                    dimension.free = dimension.free.saturating_sub(u128::from(old - new));
                }
            })
            .map_err(|source| PlacementError::Insufficient { agent: key, source })?;
        if !was_plain && self.is_plain(key) {
            self.refile_plain(key, true);
        }
        self.free.take();
        Ok(())
    }

    /// Takes everything the agent has free and returns it (the grant of a whole-agent offer):
    /// the same as [`take`](Cluster::take) of a copy of its free resources, without the copy.
    /// `taken` receives the same amounts by dimension index, for callers that would otherwise
    /// read the returned bundle's names (the agent's own, likely out of cache).
    pub(crate) fn take_all(
        &mut self,
        key: AgentKey,
        taken: &mut Vec<(usize, u64)>,
    ) -> Result<Resources, PlacementError> {
        taken.clear();
        if !self.agents.contains(key) {
            return Err(PlacementError::UnknownAgent(key));
        }
        self.changes.record(key);
        // Everything goes to 0: a plain agent stays plain, any other becomes plain.
        let was_plain = self.is_plain(key);
        for (d, dimension) in self.dimensions.iter_mut().enumerate() {
            let free = self.free_table.get(key, d);
            if free > 0 {
                taken.push((d, free));
                dimension.ring.relocate(key, free, 0);
                if let Some(ring) = dimension.plain.as_mut().filter(|_| was_plain) {
                    ring.relocate(key, free, 0);
                }
                dimension.free = dimension.free.saturating_sub(u128::from(free));
                self.free_table.set(key, d, 0);
            }
        }
        if !was_plain {
            self.refile_plain(key, true);
        }
        self.free.take();
        let entry = &mut self.agents[key];
        Ok(std::mem::take(&mut entry.free))
    }

    /// Returns `r` to the agent's free resources (refused if any dimension would exceed total).
    pub fn give_back(&mut self, key: AgentKey, r: &Resources) -> Result<(), PlacementError> {
        self.changes.record(key);
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
        // Giving back never empties a spared dimension: a plain agent stays plain unless `r`
        // holds some spared dimension, and no other agent becomes plain.
        let was_plain = self.is_plain(key);
        let stays_plain = was_plain && self.config.search().spare().iter().all(|s| r.milli(s) == 0);
        if was_plain && !stays_plain {
            self.refile_plain(key, false);
        }
        let entry = &mut self.agents[key];
        for (name, m) in r.iter() {
            let old = entry.free.milli(name);
            entry.free.set_milli(name, old + m);
            // Within the agent's total, so a dimension of its total: it has an index.
            if let Some(&d) = self.index.get(name) {
                self.free_table.set(key, d, old + m);
                let dimension = &mut self.dimensions[d];
                dimension.ring.relocate(key, old, old + m);
                if let Some(ring) = dimension.plain.as_mut().filter(|_| stays_plain) {
                    ring.relocate(key, old, old + m);
                }
                dimension.free += u128::from(m);
            }
        }
        self.free.take();
        Ok(())
    }

    /// Sum of every agent's total.
    pub fn total(&self) -> &Resources {
        &self.total
    }

    /// Sum of every agent's free resources.
    pub fn free(&self) -> &Resources {
        self.free.get_or_init(|| {
            let mut free = Resources::new();
            for (name, &d) in self.index.iter() {
                free.set_milli(name, clamp_sum(self.dimensions[d].free));
            }
            free
        })
    }

    /// The rings' layouts and the ring placer's search options.
    pub fn rings_config(&self) -> &RingsConfig {
        &self.config
    }

    /// The index of a dimension some agent has had.
    pub(crate) fn dimension_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The agent's free amount of dimension index `d` (0 for absent agents).
    pub(crate) fn free_in(&self, key: AgentKey, d: usize) -> u64 {
        self.free_table.get(key, d)
    }

    /// Whether the agent, if it has some of a dimension free, is filed in that dimension's ring
    /// (`plain`: its plain ring): it is registered and, for a plain ring, plain. O(1), for a
    /// walk that re-checks a changed agent without looking it up in the ring's tree.
    pub(crate) fn files(&self, plain: bool, key: AgentKey) -> bool {
        self.agents.contains(key) && (!plain || self.is_plain(key))
    }

    /// Some agent has none of dimension index `d` free (or lacks it).
    pub(crate) fn some_agent_without(&self, d: usize) -> bool {
        self.dimensions[d].ring.positive() < self.agents.len()
    }

    /// The name of dimension index `d`.
    pub(crate) fn dimension_name(&self, d: usize) -> &str {
        self.dimensions[d].ring.name()
    }

    /// Resolves `demand`'s dimension names to indices for [`fits`](Cluster::fits).
    pub(crate) fn resolve<'a>(&self, demand: &'a Resources) -> ResolvedDemand<'a> {
        let mut resolved = ResolvedDemand {
            demand,
            needs: [(0, 0); INLINE_DIMENSIONS],
            len: Some(0),
            unknown: false,
            row: None,
        };
        for (i, (name, need)) in demand.iter().enumerate() {
            let Some(&d) = self.index.get(name) else {
                resolved.unknown = true;
                break;
            };
            if i >= INLINE_DIMENSIONS {
                resolved.len = None;
                break;
            }
            resolved.needs[i] = (d, need);
            resolved.len = Some(i + 1);
        }
        if let (false, Some(len @ 1..)) = (resolved.unknown, resolved.len) {
            if self.free_table.stride <= INLINE_DIMENSIONS {
                let mut row = [0; INLINE_DIMENSIONS];
                for &(d, need) in &resolved.needs[..len] {
                    row[d] = need;
                }
                resolved.row = Some(row);
            }
        }
        resolved
    }

    /// The agent exists and has at least the resolved demand free in every dimension.
    #[inline]
    pub(crate) fn fits(&self, key: AgentKey, demand: &ResolvedDemand) -> bool {
        match &demand.row {
            // Absent agents have no row; a demand with a row is not empty.
            Some(need) => self
                .free_table
                .row(key)
                .is_some_and(|free| !short_of(free, need)),
            None => self.fits_by_needs(key, demand),
        }
    }

    /// [`fits`](Self::fits) for a demand without a free-table row (more dimensions than fit
    /// inline, or names no agent has): out of line, so the common check stays small enough to
    /// inline into the search.
    #[cold]
    #[inline(never)]
    fn fits_by_needs(&self, key: AgentKey, demand: &ResolvedDemand) -> bool {
        match demand.len {
            _ if demand.unknown => false,
            // Amounts are 0 for absent agents, so a non-empty demand needs no other check.
            Some(len) if len > 0 => demand.needs[..len]
                .iter()
                .all(|&(d, need)| self.free_table.get(key, d) >= need),
            _ => self
                .agents
                .get(key)
                .is_some_and(|entry| entry.free.contains(demand.demand)),
        }
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

    /// Files the agent under `grade` in the ring of `dimension` ([`RingSet::set_grade`]): the
    /// caller promises that the agent cannot take a demand whose grade
    /// ([`PlacementContext::with_grade`]) is higher, so the ring search need not walk past it.
    /// Nothing happens for an unknown agent or a dimension no agent has had. A removed agent's
    /// grade is forgotten.
    pub fn set_grade(&mut self, key: AgentKey, dimension: &str, grade: u8) {
        self.label(key, dimension, |ring, free| {
            ring.set_grade(key, free, grade)
        });
    }

    /// Files the agent under `class` in the ring of `dimension` ([`RingSet::set_class`]): the
    /// caller promises that the agent cannot take a demand whose classes
    /// ([`PlacementContext::with_classes`]) leave `class` out, so the ring search need not walk
    /// past it. A class is the agent's for as long as it is there (the simulator files each
    /// node under its GPU model). Nothing happens for an unknown agent or a dimension no agent
    /// has had. A removed agent's class is forgotten.
    pub fn set_class(&mut self, key: AgentKey, dimension: &str, class: u8) {
        self.label(key, dimension, |ring, free| {
            ring.set_class(key, free, class)
        });
    }

    /// Applies `label` to the rings of `dimension` (the plain one too, for when the agent is,
    /// or is filed, there) with the agent's free amount there.
    fn label(&mut self, key: AgentKey, dimension: &str, label: impl Fn(&mut RingSet, u64)) {
        if !self.agents.contains(key) {
            return;
        }
        self.changes.record(key);
        if let Some(&d) = self.index.get(dimension) {
            let free = self.free_table.get(key, d);
            let dimension = &mut self.dimensions[d];
            label(&mut dimension.ring, free);
            if let Some(plain) = &mut dimension.plain {
                label(plain, free);
            }
        }
    }

    /// The ring set of one dimension, if any agent has had that dimension.
    pub fn ring(&self, dimension: &str) -> Option<&RingSet> {
        self.index.get(dimension).map(|&d| &self.dimensions[d].ring)
    }

    /// The ring set of one dimension restricted to the plain agents, those with none of any
    /// spared dimension ([`RingSearch::spare`]) free; `None` when the search spares nothing or
    /// no agent has had the dimension.
    ///
    /// [`RingSearch::spare`]: placers::ring::RingSearch::spare
    pub fn plain_ring(&self, dimension: &str) -> Option<&RingSet> {
        let &d = self.index.get(dimension)?;
        self.dimensions[d].plain.as_ref()
    }

    /// The plain rings hold exactly the agents with none of the dimensions `spared` (indices)
    /// free: `spared` is every spared dimension some agent has had, and the rings are kept.
    pub(crate) fn plain_rings_spare(&self, spared: &[usize]) -> bool {
        !self.config.search().spare().is_empty()
            && spared.len() == self.spare.len()
            && self.spare.iter().all(|d| spared.contains(d))
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
        self.placer.placer().place(self, demand, eligible, context)
    }

    /// [`place`](Cluster::place), but a demand that asks for none of `spare` (e.g. `gpus`) first
    /// goes only to agents with none of it free, so tasks that do not need a scarce device do not
    /// use up the cpu and memory beside it; if no such agent fits, any eligible agent. Two ring
    /// searches at most, so still no scan.
    pub fn place_sparing(
        &self,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        spare: &str,
    ) -> Option<Decision> {
        if demand.milli(spare) == 0 {
            let without = |key: AgentKey| {
                self.agents
                    .get(key)
                    .is_some_and(|a| a.free.milli(spare) == 0)
                    && eligible(key)
            };
            if let Some(d) = self.place(demand, &without) {
                return Some(d);
            }
        }
        self.place(demand, eligible)
    }

    /// Same as [`place`](Cluster::place) with another placer (for comparisons).
    pub fn place_with(
        &self,
        placer: &dyn Placer,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        placer.place(self, demand, eligible, &mut PlacementContext::default())
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
        let units = |m: u64| m as f64 / crate::resources::MILLI as f64;
        self.index
            .values()
            .map(|&d| &self.dimensions[d].ring)
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
        self.agents.get(key)?;
        let d = *self.index.get(dimension)?;
        let ring = &self.dimensions[d].ring;
        let free = self.free_table.get(key, d);
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

    /// A dimension seen later widens every row and keeps what the rows held.
    #[test]
    fn free_table_rows_keep_their_amounts_as_dimensions_come() {
        let mut t = FreeTable::default();
        t.add_dimension();
        t.set(2, 0, 7);
        t.set(0, 0, 0);
        assert_eq!((t.get(2, 0), t.get(0, 0), t.get(9, 0)), (7, 0, 0));
        t.add_dimension();
        t.set(1, 1, 5);
        assert_eq!(
            (t.get(2, 0), t.get(2, 1), t.get(1, 1), t.get(1, 0)),
            (7, 0, 5, 0)
        );
        t.add_dimension();
        assert_eq!((t.get(2, 0), t.get(1, 1), t.get(1, 2)), (7, 5, 0));
        assert_eq!(t.amounts.len(), 3 * 3);
    }

    proptest::proptest! {
        /// The index finds exactly the names inserted, with their latest index, by key (up to
        /// `KEYED_NAMES` names) or by search beyond, names short and long (past 16 bytes),
        /// prefixes of each other included.
        #[test]
        fn the_name_index_finds_what_was_inserted(
            names in proptest::collection::vec("[a-c_]{1,20}", 0..24),
            queries in proptest::collection::vec("[a-c_]{1,20}", 0..16),
        ) {
            let mut index = NameIndex::default();
            let mut reference = std::collections::BTreeMap::new();
            for (i, name) in names.iter().enumerate() {
                index.insert(name, i);
                reference.insert(name.clone(), i);
                for (known, at) in &reference {
                    proptest::prop_assert_eq!(index.get(known), Some(at));
                }
            }
            for q in names.iter().chain(&queries) {
                proptest::prop_assert_eq!(index.get(q), reference.get(q));
            }
        }

        /// The check by resolved demand (one free-table row, or by names past
        /// `INLINE_DIMENSIONS`) says what the agent's free bundle says, for agents taken from,
        /// absent agents, and demands naming dimensions no agent has.
        #[test]
        fn a_resolved_check_is_the_bundle_check(
            agents in proptest::collection::vec(proptest::collection::vec(0u64..4, 10), 1..5),
            taken in proptest::collection::vec(proptest::collection::vec(0u64..3, 10), 5),
            demand in proptest::collection::vec(0u64..4, 11),
            dims in 1usize..=10,
        ) {
            // Dimensions d0 up to d9 (past 8, more than fit a row; rows of 1 to 4 are compared
            // as fixed numbers, see `short_of`), d10 never on an agent.
            let wide = dims > INLINE_DIMENSIONS;
            let bundle = |amounts: &[u64]| {
                let mut out = Resources::new();
                for (d, &m) in amounts.iter().enumerate().take(dims) {
                    out.set_milli(&format!("d{d}"), m * 1000);
                }
                out
            };
            let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
            let keys: Vec<AgentKey> = agents.iter().map(|a| cluster.add_agent(bundle(a))).collect();
            for (&key, t) in keys.iter().zip(&taken) {
                let t = bundle(t);
                if cluster.agent(key).unwrap().free.contains(&t) {
                    cluster.take(key, &t).unwrap();
                }
            }
            let mut want = bundle(&demand);
            if demand[10] > 0 && !wide {
                want.set_milli("d10", demand[10]);
            }
            let resolved = cluster.resolve(&want);
            for key in keys.iter().copied().chain([keys.len() + 3]) {
                let expected = cluster.agent(key).is_some_and(|a| a.free.contains(&want));
                proptest::prop_assert_eq!(cluster.fits(key, &resolved), expected, "agent {}", key);
            }
        }
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

    /// An agent at the largest amount cannot saturate the cluster sums: when it leaves, the
    /// other agents' totals and free amounts are exactly what they were.
    #[test]
    fn cluster_sums_survive_a_huge_agent_coming_and_going() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::default());
        let small = cluster.add_agent(r("cpus:4;mem:8192"));
        let huge_total = Resources::from_milli([("cpus", u64::MAX), ("mem", u64::MAX)]).unwrap();
        let huge = cluster.add_agent(huge_total.clone());
        assert_eq!(
            cluster.total().milli("cpus"),
            u64::MAX,
            "clamped while present"
        );
        assert_eq!(cluster.free().milli("mem"), u64::MAX);
        cluster.take(small, &r("cpus:1")).unwrap();
        cluster.take(huge, &r("cpus:1")).unwrap();
        cluster.give_back(huge, &r("cpus:1")).unwrap();
        assert_eq!(cluster.remove_agent(huge).unwrap().total, huge_total);
        assert_eq!(cluster.total(), &r("cpus:4;mem:8192"));
        assert_eq!(cluster.free(), &r("cpus:3;mem:8192"));
        // Twice the largest amount, then both gone.
        let a = cluster.add_agent(huge_total.clone());
        let b = cluster.add_agent(huge_total);
        cluster.remove_agent(a);
        assert_eq!(cluster.total().milli("cpus"), u64::MAX);
        cluster.remove_agent(b);
        assert_eq!(cluster.total(), &r("cpus:4;mem:8192"));
        cluster.remove_agent(small);
        assert!(cluster.total().is_empty() && cluster.free().is_empty());
    }

    #[test]
    fn take_all_is_take_of_everything_free() {
        let mut by_take = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        for total in [
            "cpus:4;mem:8192",
            "cpus:2;mem:512;gpus:1",
            "mem:100;disk:10",
        ] {
            by_take.add_agent(r(total));
        }
        by_take.take(1, &r("cpus:0.5;gpus:1")).unwrap();
        let removed = by_take.remove_agent(2).unwrap();
        assert_eq!(by_take.add_agent(removed.total), 2);
        let mut by_take_all = by_take.clone();
        let mut taken = Vec::new();
        for key in [1, 0, 2] {
            let free = by_take.agent(key).unwrap().free.clone();
            by_take.take(key, &free).unwrap();
            let granted = by_take_all.take_all(key, &mut taken).unwrap();
            assert_eq!(granted, free);
            let mut named: Vec<(&str, u64)> = taken
                .iter()
                .map(|&(d, m)| (by_take_all.dimension_name(d), m))
                .collect();
            named.sort();
            assert_eq!(named, free.iter().collect::<Vec<_>>());
            assert_eq!(by_take_all.agent(key), by_take.agent(key));
            assert_eq!(by_take_all.free(), by_take.free());
            assert_eq!(by_take_all.rings(), by_take.rings());
            for name in ["cpus", "mem", "gpus", "disk"] {
                assert_eq!(
                    by_take_all.bucket_of(key, name),
                    by_take.bucket_of(key, name)
                );
            }
        }
        assert!(by_take_all.free().is_empty());
        assert_eq!(
            by_take_all.take_all(7, &mut taken),
            Err(PlacementError::UnknownAgent(7))
        );
    }

    #[test]
    fn sparing_keeps_gpu_agents_for_gpu_demands() {
        // The seed's plain search, so `place` shows what sparing changes.
        let mut cluster = Cluster::new(RingsConfig::seed_001(), PlacerKind::Ring);
        let gpu = cluster.add_agent(r("cpus:4;mem:1024;gpus:1"));
        let plain = cluster.add_agent(r("cpus:8;mem:1024"));
        let cpu_task = r("cpus:3;mem:10");
        // Plain best fit takes the GPU agent (least cpu left); sparing takes the other.
        assert_eq!(cluster.place(&cpu_task, &|_| true).unwrap().agent, gpu);
        assert_eq!(
            cluster
                .place_sparing(&cpu_task, &|_| true, "gpus")
                .unwrap()
                .agent,
            plain
        );
        // Nothing without free GPUs fits: fall back to any agent.
        assert_eq!(
            cluster
                .place_sparing(&r("cpus:3;mem:10"), &|k| k == gpu, "gpus")
                .unwrap()
                .agent,
            gpu
        );
        // A GPU demand is placed as usual.
        let d = cluster.place_sparing(&r("cpus:1;gpus:1"), &|_| true, "gpus");
        assert_eq!(d.unwrap().agent, gpu);
        // The default ring search spares `gpus` by itself.
        let mut default = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        default.add_agent(r("cpus:4;mem:1024;gpus:1"));
        let plain = default.add_agent(r("cpus:8;mem:1024"));
        assert_eq!(default.place(&cpu_task, &|_| true).unwrap().agent, plain);
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
