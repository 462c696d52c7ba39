//! What a placer may know beyond the cluster: [`PlacementContext`] — the balance placer's
//! settings, the pending demands and the weights derived from them (SPEC seed 000), and the
//! caller's per-agent score for the ring search's tie-break ([`AgentScore`]).
//!
//! Owned by whoever drives placement ([`crate::placement::allocate_in`] builds one from the
//! step's requests) and handed to [`Placer::place`](super::Placer::place). This module uses no
//! placer: the placers use it.
//!
//! Balance weights (k balance dimensions, in the order of the configured initial weights, else
//! the cluster's dimension names sorted): `w_i = (w0_i + w1_i + w2_i) / 3`, `w0` configured,
//! `w1` the [`priority_chart`] of `r_i` = pending copies that no agent can hold because of
//! dimension i (the demand's amount of i exceeds every agent's free amount of i), `w2` the chart
//! of cluster utilisation per dimension. They are cached here and recomputed only when an input
//! changed: a placement (utilisation), a change of the pending set, or a change of some
//! dimension's largest free amount (what "blocked" is measured against).

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::memo::WalkMemo;
use crate::placement::ring_set::{Reach, ALL_CLASSES};
use crate::placement::{AgentKey, Cluster, Resources};

/// How far the configured initial weights may sum from 1 (they are then scaled to exactly 1).
pub const WEIGHT_SUM_TOLERANCE: f64 = 1e-3;

/// The balance placer's settings (config section `balance:`).
#[derive(Clone, Debug, PartialEq)]
pub struct BalanceSettings {
    initial_weights: Option<Vec<(String, f64)>>,
    threshold: f64,
    require_improvement: bool,
}

// Every f64 here is checked finite by `new`, so equality is reflexive.
impl Eq for BalanceSettings {}

impl Default for BalanceSettings {
    fn default() -> Self {
        BalanceSettings {
            initial_weights: None,
            threshold: 0.5,
            require_improvement: false,
        }
    }
}

/// Why balance settings were refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BalanceSettingsError {
    #[error(
        "`{0}` is not a valid resource name (letters, digits, `_` and `-`, starting with a letter)"
    )]
    BadName(String),
    #[error("`{name}` appears more than once")]
    Duplicate { name: String },
    #[error("weight of `{name}` must be a finite number ≥ 0, not {value}")]
    BadWeight { name: String, value: f64 },
    #[error("balance needs at least two dimensions, {0} given")]
    TooFewDimensions(usize),
    #[error("initial weights must sum to 1, they sum to {0}")]
    Sum(f64),
    #[error("threshold must be a number from 0 to 1, not {0}")]
    Threshold(f64),
}

impl BalanceSettings {
    /// Checks and builds settings. `initial_weights`: (dimension, weight) in output order, each
    /// ≥ 0, summing to 1 within [`WEIGHT_SUM_TOLERANCE`] (then scaled to exactly 1); `None`
    /// means equal weights over the cluster's dimensions. `threshold`: 0 to 1.
    pub fn new(
        initial_weights: Option<Vec<(String, f64)>>,
        threshold: f64,
        require_improvement: bool,
    ) -> Result<Self, BalanceSettingsError> {
        let initial_weights = match initial_weights {
            None => None,
            Some(weights) => Some(Self::check_weights(weights)?),
        };
        if !(threshold.is_finite() && (0.0..=1.0).contains(&threshold)) {
            return Err(BalanceSettingsError::Threshold(threshold));
        }
        Ok(BalanceSettings {
            initial_weights,
            threshold,
            require_improvement,
        })
    }

    fn check_weights(
        mut weights: Vec<(String, f64)>,
    ) -> Result<Vec<(String, f64)>, BalanceSettingsError> {
        for (i, (name, value)) in weights.iter().enumerate() {
            if Resources::from_milli([(name.as_str(), 1)]).is_err() {
                return Err(BalanceSettingsError::BadName(name.clone()));
            }
            if weights[..i].iter().any(|(n, _)| n == name) {
                return Err(BalanceSettingsError::Duplicate { name: name.clone() });
            }
            if !(value.is_finite() && *value >= 0.0) {
                return Err(BalanceSettingsError::BadWeight {
                    name: name.clone(),
                    value: *value,
                });
            }
        }
        if weights.len() < 2 {
            return Err(BalanceSettingsError::TooFewDimensions(weights.len()));
        }
        let sum: f64 = weights.iter().map(|(_, w)| w).sum();
        if (sum - 1.0).abs() > WEIGHT_SUM_TOLERANCE {
            return Err(BalanceSettingsError::Sum(sum));
        }
        for (_, w) in &mut weights {
            *w /= sum;
        }
        Ok(weights)
    }

    /// The configured (dimension, weight) pairs, scaled to sum 1; `None` = equal weights.
    pub fn initial_weights(&self) -> Option<&[(String, f64)]> {
        self.initial_weights.as_deref()
    }

    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    pub fn require_improvement(&self) -> bool {
        self.require_improvement
    }
}

/// Priority-chart weights of values `x` (SPEC seed 000): `a_ij` = 1 if x_i > x_j, 0 if less,
/// 0.5 if equal (diagonal 0.5); weight_i = Σ_j a_ij ÷ (k²/2). E.g. (0.2, 0.5, 0.1) →
/// (1/3, 5/9, 1/9). Non-negative, summing to 1 (empty for no values).
pub fn priority_chart(x: &[f64]) -> Vec<f64> {
    priority_chart_by(x.len(), |i, j| x[i].total_cmp(&x[j]))
}

/// [`priority_chart`] with the comparison given (so ratios can be compared exactly).
pub fn priority_chart_by(k: usize, cmp: impl Fn(usize, usize) -> Ordering) -> Vec<f64> {
    let all = (k * k) as f64 / 2.0;
    (0..k)
        .map(|i| {
            let score: f64 = (0..k)
                .map(|j| match cmp(i, j) {
                    Ordering::Greater => 1.0,
                    Ordering::Equal => 0.5,
                    Ordering::Less => 0.0,
                })
                .sum();
            score / all
        })
        .collect()
}
/// The weights and their inputs, as of the last refresh.
#[derive(Clone, Debug)]
struct WeightCache {
    dims: Vec<String>,
    /// Largest free amount of each dimension over all agents.
    max_free: Vec<u64>,
    /// Pending copies blocked by each dimension (`r_i`).
    blocked: Vec<u64>,
    used: Vec<u64>,
    total: Vec<u64>,
    weights: Vec<f64>,
    utilisation: f64,
    stale: bool,
}

/// The balance weights as the balance placer reads them ([`PlacementContext::balance_view`]).
pub(super) struct BalanceView<'c> {
    pub settings: &'c BalanceSettings,
    /// The balance dimensions, in weight order.
    pub dims: &'c [String],
    pub weights: &'c [f64],
    /// Cluster utilisation U: mean over dimensions of used ÷ total.
    pub utilisation: f64,
}

/// What a placer may know beyond the cluster: the balance settings, the pending demands, and
/// the caller's per-agent score for the ring search's tie-break ([`AgentScore`]).
///
/// The pending set is a multiset of demands with copy counts, indexed per dimension by amount so
/// that "how many pending copies ask for more of i than any agent has free" is a range sum, and
/// a change to the set adjusts the blocked counts directly.
#[derive(Clone, Default)]
pub struct PlacementContext<'s> {
    settings: BalanceSettings,
    /// Dimension → amount asked (thousandths) → pending copies.
    pending: BTreeMap<String, BTreeMap<u64, u64>>,
    cache: Option<WeightCache>,
    score: Option<&'s dyn AgentScore>,
    grade: Option<&'s dyn Fn(&Resources) -> u8>,
    classes: Option<&'s dyn Fn(&Resources) -> u64>,
    memo: Option<&'s RefCell<WalkMemo>>,
}

impl std::fmt::Debug for PlacementContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementContext")
            .field("settings", &self.settings)
            .field("pending", &self.pending)
            .field("cache", &self.cache)
            .field("score", &self.score.map(|_| "caller's"))
            .field("grade", &self.grade.map(|_| "caller's"))
            .field("classes", &self.classes.map(|_| "caller's"))
            .field("memo", &self.memo.map(|_| "caller's"))
            .finish()
    }
}

impl<'s> PlacementContext<'s> {
    pub fn new(settings: BalanceSettings) -> Self {
        PlacementContext {
            settings,
            ..PlacementContext::default()
        }
    }

    pub fn settings(&self) -> &BalanceSettings {
        &self.settings
    }

    /// Lets the ring search rank its best candidates by `score` ([`super::ring::RingSearch`]).
    pub fn with_score(mut self, score: &'s dyn AgentScore) -> Self {
        self.score = Some(score);
        self
    }

    /// The caller's per-agent score, if it gave one.
    pub fn score(&self) -> Option<&'s dyn AgentScore> {
        self.score
    }

    /// The grade a demand needs ([`Cluster::set_grade`]): the ring search then walks only the
    /// agents the caller graded that high or higher in a graded ring. `grade` must not exceed
    /// what any agent able to take the demand was graded, or the search misses that agent.
    ///
    /// [`Cluster::set_grade`]: crate::placement::Cluster::set_grade
    pub fn with_grade(mut self, grade: &'s dyn Fn(&Resources) -> u8) -> Self {
        self.grade = Some(grade);
        self
    }

    /// The grade `demand` needs: the caller's ([`with_grade`](Self::with_grade)), else 0 (every
    /// agent).
    pub fn grade_of(&self, demand: &Resources) -> u8 {
        self.grade.map_or(0, |grade| grade(demand))
    }

    /// The classes whose agents may take a demand ([`Cluster::set_class`]), bit `c` for class
    /// `c`: the ring search then walks only those classes' agents (and the unclassed) in a
    /// classed ring. `classes` must keep every class of an agent able to take the demand, or
    /// the search misses that agent.
    ///
    /// [`Cluster::set_class`]: crate::placement::Cluster::set_class
    pub fn with_classes(mut self, classes: &'s dyn Fn(&Resources) -> u64) -> Self {
        self.classes = Some(classes);
        self
    }

    /// Lets the scored ring search remember its candidates in `memo` and, next time, re-check
    /// only the agents that changed since ([`WalkMemo`]): the same placements, fewer agents
    /// walked and ranked. The caller promises, for as long as it hands this memo to searches:
    /// that every search through it is for one demand (checked: another demand starts over)
    /// in one cluster, and that the eligibility and score it gives for an agent change only
    /// when the cluster records a change of that agent ([`Cluster::changes`]: a take, a
    /// give-back, a grade or a class given). The simulator keeps one per task shape: its
    /// verdicts and scores are functions of the node's state, which changes exactly then.
    pub fn with_memo(mut self, memo: &'s RefCell<WalkMemo>) -> Self {
        self.memo = Some(memo);
        self
    }

    /// The caller's memo ([`with_memo`](Self::with_memo)), if it gave one.
    pub fn memo(&self) -> Option<&'s RefCell<WalkMemo>> {
        self.memo
    }

    /// Which agents the ring search may leave out for `demand`: those graded below its grade
    /// ([`with_grade`](Self::with_grade)) and those of a class it leaves out
    /// ([`with_classes`](Self::with_classes)); without either, none.
    pub fn reach_of(&self, demand: &Resources) -> Reach {
        Reach {
            grade: self.grade_of(demand),
            classes: self.classes.map_or(ALL_CLASSES, |classes| classes(demand)),
        }
    }

    /// Replaces the pending set.
    pub fn set_pending<'a>(&mut self, pending: impl IntoIterator<Item = (&'a Resources, u64)>) {
        // Each dimension's map is kept (emptied) for the next cycle, so a cycle over the same
        // dimensions allocates nothing here; only while few names were ever seen, so that
        // demands naming ever new dimensions cannot grow it without bound.
        if self.pending.len() <= KEPT_PENDING_DIMENSIONS {
            // (A map emptied by removals keeps its node; `clear` would free it.)
            self.pending
                .values_mut()
                .filter(|by_amount| !by_amount.is_empty())
                .for_each(BTreeMap::clear);
        } else {
            self.pending.clear();
        }
        self.cache = None;
        for (demand, copies) in pending {
            self.add_pending(demand, copies);
        }
    }

    /// `copies` more of `demand` are pending.
    pub fn add_pending(&mut self, demand: &Resources, copies: u64) {
        if copies == 0 {
            return;
        }
        for (name, amount) in demand.iter() {
            let by_amount = match self.pending.get_mut(name) {
                Some(by_amount) => by_amount,
                None => self.pending.entry(name.to_string()).or_default(),
            };
            let slot = by_amount.entry(amount).or_default();
            *slot = slot.saturating_add(copies);
        }
        self.adjust_blocked(demand, |b| b.saturating_add(copies));
    }

    /// `copies` of `demand` are no longer pending (placed, or given up for this step).
    pub fn remove_pending(&mut self, demand: &Resources, copies: u64) {
        if copies == 0 {
            return;
        }
        // Only what was added can leave: the smallest pending count over the demand's dimensions.
        let mut removed = copies;
        for (name, amount) in demand.iter() {
            let pending = self
                .pending
                .get(name)
                .and_then(|by_amount| by_amount.get(&amount));
            removed = removed.min(pending.copied().unwrap_or(0));
        }
        if removed == 0 {
            return;
        }
        for (name, amount) in demand.iter() {
            if let Some(by_amount) = self.pending.get_mut(name) {
                if let Some(slot) = by_amount.get_mut(&amount) {
                    *slot -= removed;
                    if *slot == 0 {
                        by_amount.remove(&amount);
                    }
                }
            }
        }
        self.adjust_blocked(demand, |b| b.saturating_sub(removed));
    }

    /// `r_i` per balance dimension: pending copies asking for more of it than any agent has free.
    pub fn blocked_counts(&mut self, cluster: &Cluster) -> Vec<(String, u64)> {
        self.refresh(cluster);
        let cache = self.cache.as_ref().expect("refreshed");
        cache
            .dims
            .iter()
            .cloned()
            .zip(cache.blocked.clone())
            .collect()
    }

    /// The current weights, in balance dimension order, recomputed if an input changed.
    pub fn weights(&mut self, cluster: &Cluster) -> Vec<(String, f64)> {
        self.refresh(cluster);
        let cache = self.cache.as_ref().expect("refreshed");
        cache
            .dims
            .iter()
            .cloned()
            .zip(cache.weights.clone())
            .collect()
    }

    /// The balance weights, brought up to date with the cluster (for the balance placer).
    pub(super) fn balance_view(&mut self, cluster: &Cluster) -> Option<BalanceView<'_>> {
        self.refresh(cluster);
        let cache = self.cache.as_ref()?;
        Some(BalanceView {
            settings: &self.settings,
            dims: &cache.dims,
            weights: &cache.weights,
            utilisation: cache.utilisation,
        })
    }

    fn adjust_blocked(&mut self, demand: &Resources, change: impl Fn(u64) -> u64) {
        if let Some(cache) = &mut self.cache {
            for (i, dim) in cache.dims.iter().enumerate() {
                if demand.milli(dim) > cache.max_free[i] {
                    cache.blocked[i] = change(cache.blocked[i]);
                    cache.stale = true;
                }
            }
        }
    }

    /// Pending copies asking for more than `max_free` of `dim`.
    fn blocked_above(&self, dim: &str, max_free: u64) -> u64 {
        self.pending.get(dim).map_or(0, |by_amount| {
            by_amount
                .range(max_free.saturating_add(1)..)
                .map(|(_, c)| *c)
                .fold(0u64, u64::saturating_add)
        })
    }

    fn dims_match(&self, cluster: &Cluster, cache: &WeightCache) -> bool {
        match &self.settings.initial_weights {
            Some(w) => w.iter().map(|(n, _)| n).eq(cache.dims.iter()),
            None => cluster
                .total()
                .names()
                .eq(cache.dims.iter().map(String::as_str)),
        }
    }

    /// Brings the cache up to date with the cluster; O(k · buckets) when nothing changed.
    fn refresh(&mut self, cluster: &Cluster) {
        let usable = self
            .cache
            .take()
            .filter(|cache| self.dims_match(cluster, cache));
        let mut cache = match usable {
            Some(cache) => cache,
            None => {
                let dims: Vec<String> = match &self.settings.initial_weights {
                    Some(w) => w.iter().map(|(n, _)| n.clone()).collect(),
                    None => cluster.total().names().map(str::to_string).collect(),
                };
                let k = dims.len();
                WeightCache {
                    dims,
                    // Forces the blocked counts below to be summed afresh.
                    max_free: vec![u64::MAX; k],
                    blocked: vec![u64::MAX; k],
                    used: vec![0; k],
                    total: vec![0; k],
                    weights: Vec::new(),
                    utilisation: 0.0,
                    stale: true,
                }
            }
        };
        for i in 0..cache.dims.len() {
            let dim = cache.dims[i].as_str();
            let max = max_free(cluster, dim);
            if max != cache.max_free[i] || cache.blocked[i] == u64::MAX {
                cache.max_free[i] = max;
                cache.blocked[i] = self.blocked_above(dim, max);
                cache.stale = true;
            }
            let total = cluster.total().milli(dim);
            let used = total.saturating_sub(cluster.free().milli(dim));
            if (used, total) != (cache.used[i], cache.total[i]) {
                cache.used[i] = used;
                cache.total[i] = total;
                cache.stale = true;
            }
        }
        if cache.stale {
            cache.weights = self.compute_weights(&cache);
            cache.utilisation = utilisation(&cache.used, &cache.total);
            cache.stale = false;
        }
        self.cache = Some(cache);
    }

    fn compute_weights(&self, cache: &WeightCache) -> Vec<f64> {
        let k = cache.dims.len();
        let w0: Vec<f64> = match &self.settings.initial_weights {
            Some(w) => w.iter().map(|(_, w)| *w).collect(),
            None => vec![1.0 / k as f64; k],
        };
        let w1 = priority_chart_by(k, |i, j| cache.blocked[i].cmp(&cache.blocked[j]));
        // used_i/total_i against used_j/total_j exactly; a dimension with no total is unused.
        let fraction = |i: usize| match cache.total[i] {
            0 => (0u128, 1u128),
            t => (cache.used[i] as u128, t as u128),
        };
        let w2 = priority_chart_by(k, |i, j| {
            let ((ui, ti), (uj, tj)) = (fraction(i), fraction(j));
            (ui * tj).cmp(&(uj * ti))
        });
        (0..k).map(|i| (w0[i] + w1[i] + w2[i]) / 3.0).collect()
    }
}

/// Mean over dimensions with a total of used ÷ total (0 when there is none).
fn utilisation(used: &[u64], total: &[u64]) -> f64 {
    let shares: Vec<f64> = used
        .iter()
        .zip(total)
        .filter(|(_, t)| **t > 0)
        .map(|(u, t)| *u as f64 / *t as f64)
        .collect();
    if shares.is_empty() {
        0.0
    } else {
        shares.iter().sum::<f64>() / shares.len() as f64
    }
}

/// The largest free amount of `dim` over all agents: the last member of the highest non-empty
/// bucket of its ring (O(buckets)).
fn max_free(cluster: &Cluster, dim: &str) -> u64 {
    cluster.ring(dim).map_or(0, |ring| {
        (0..ring.len())
            .rev()
            .find_map(|b| ring.members(b).next_back())
            .map_or(0, |(free, _)| free)
    })
}

/// [`PlacementContext::set_pending`] keeps the emptied per-dimension maps of at most this many
/// dimension names for the next cycle.
const KEPT_PENDING_DIMENSIONS: usize = 16;

/// The caller's cost of placing `demand` on an agent (lower is better), for the scored tie-break
/// of the ring search ([`super::ring::RingSearch`]). It is only asked about agents that fit and
/// are eligible. Closures `Fn(AgentKey, &Resources) -> i64` implement it.
pub trait AgentScore {
    fn score(&self, agent: AgentKey, demand: &Resources) -> i64;

    /// Whether the search also ranks the largest fitting agents beside the best fits
    /// ([`super::ring::RingSearch::largest`]). They are there to offer the score agents of
    /// another kind than the best fits (on openb, nodes of a GPU model few tasks need); a score
    /// that tells no such kinds apart says no and saves their cost. Yes unless said.
    fn ranks_largest(&self) -> bool {
        true
    }
}

impl<F: Fn(AgentKey, &Resources) -> i64> AgentScore for F {
    fn score(&self, agent: AgentKey, demand: &Resources) -> i64 {
        self(agent, demand)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_chart_of_the_spec() {
        let w = priority_chart(&[0.2, 0.5, 0.1]);
        let want = [1.0 / 3.0, 5.0 / 9.0, 1.0 / 9.0];
        for (got, want) in w.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{w:?}");
        }
        assert_eq!(priority_chart(&[7.0, 7.0]), [0.5, 0.5]);
        assert_eq!(priority_chart(&[]), Vec::<f64>::new());
    }

    #[test]
    fn settings_are_checked() {
        let w =
            |pairs: &[(&str, f64)]| Some(pairs.iter().map(|(n, w)| (n.to_string(), *w)).collect());
        let err = |weights, threshold| {
            BalanceSettings::new(weights, threshold, false)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(w(&[("cpus", 0.5), ("mem", 0.6)]), 0.5),
            "initial weights must sum to 1, they sum to 1.1"
        );
        assert_eq!(
            err(w(&[("cpus", -0.5), ("mem", 1.5)]), 0.5),
            "weight of `cpus` must be a finite number ≥ 0, not -0.5"
        );
        assert_eq!(
            err(w(&[("cpus", 1.0)]), 0.5),
            "balance needs at least two dimensions, 1 given"
        );
        assert_eq!(
            err(w(&[("cpus", 0.5), ("cpus", 0.5)]), 0.5),
            "`cpus` appears more than once"
        );
        assert_eq!(
            err(None, 1.5),
            "threshold must be a number from 0 to 1, not 1.5"
        );
        assert_eq!(err(w(&[("9x", 0.5), ("mem", 0.5)]), 0.5), "`9x` is not a valid resource name (letters, digits, `_` and `-`, starting with a letter)");
        let ok = BalanceSettings::new(
            w(&[("cpus", 0.3333), ("mem", 0.3333), ("gpus", 0.3333)]),
            0.5,
            true,
        )
        .unwrap();
        let sum: f64 = ok.initial_weights().unwrap().iter().map(|(_, w)| w).sum();
        assert!((sum - 1.0).abs() < 1e-15);
    }

    /// Replacing the pending set keeps its per-dimension maps for the next cycle, emptied: the
    /// blocked counts are the new set's only, whether the old demands were served (removed) or
    /// not, and a set over ever new names stays bounded.
    #[test]
    fn a_replaced_pending_set_counts_only_its_own_demands() {
        use crate::placement::{Cluster, PlacerKind, RingsConfig};
        let r = |text: &str| Resources::parse(text).unwrap();
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        cluster.add_agent(r("cpus:4;mem:1024"));
        let blocked = |context: &mut PlacementContext, cluster: &Cluster| -> Vec<u64> {
            let counts = context.blocked_counts(cluster);
            counts.into_iter().map(|(_, c)| c).collect()
        };
        let mut context = PlacementContext::default();
        let (big_cpu, big_mem) = (r("cpus:8;mem:10"), r("cpus:1;mem:2048"));
        context.set_pending([(&big_cpu, 3), (&big_mem, 2)]);
        assert_eq!(blocked(&mut context, &cluster), [3, 2]);
        // One copy served: removed; the rest are replaced by a set without them.
        context.remove_pending(&big_cpu, 1);
        assert_eq!(blocked(&mut context, &cluster), [2, 2]);
        context.set_pending([(&big_mem, 1)]);
        assert_eq!(blocked(&mut context, &cluster), [0, 1]);
        context.set_pending([]);
        assert_eq!(blocked(&mut context, &cluster), [0, 0]);
        // Demands naming ever new dimensions: the kept maps stay bounded.
        for i in 0..100 {
            let odd = r(&format!("cpus:1;extra{i}:1"));
            context.set_pending([(&odd, 1)]);
        }
        assert!(context.pending.len() <= KEPT_PENDING_DIMENSIONS + 2);
        assert_eq!(blocked(&mut context, &cluster), [0, 0]);
    }
}
