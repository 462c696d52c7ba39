//! Balance-degree placement with dynamic weights (SPEC seed 000).
//!
//! The placer keeps each agent's per-dimension utilisation even, so more tasks fit. It needs
//! what a plain [`Placer`] does not see: which demands are pending and which dimension blocks
//! them. That lives in a [`PlacementContext`], owned by whoever drives placement
//! ([`super::allocate_in`] builds it from the step's requests) and handed to
//! [`Placer::place_in`].
//!
//! Definitions (k balance dimensions, in the order of the configured initial weights, else the
//! cluster's dimension names sorted):
//! - weights `w_i = (w0_i + w1_i + w2_i) / 3`: `w0` configured, `w1` the [`priority_chart`] of
//!   `r_i` = pending copies that no agent can hold because of dimension i (the demand's amount of
//!   i exceeds every agent's free amount of i), `w2` the chart of cluster utilisation per
//!   dimension;
//! - balance of an agent with demand a placed: `d_i = (used_i + a_i) / total_i` over the balance
//!   dimensions the agent has, `m = mean(d)`, `y = sqrt(Σ w_i (d_i − m)²)`; smaller is better;
//! - cluster utilisation `U = mean_i(Σ used_i / Σ total_i)`; at or above the threshold: the
//!   fitting agent with the smallest y after; below: the first fitting agent whose y improves,
//!   else the smallest y after. `require_improvement`: a non-idle agent must improve.
//!
//! Weights are cached in the context and recomputed only when an input changed: a placement
//! (utilisation), a change of the pending set, or a change of some dimension's largest free
//! amount (what "blocked" is measured against).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::node_preference::fitting_agents;
use super::placer::{dominant_dimension, Decision, Placer};
use super::ring_search::AgentScore;
use super::{AgentEntry, AgentKey, Cluster, Resources};

/// `y after` must be below `y before` by more than this to count as an improvement (float noise).
pub const IMPROVEMENT_EPSILON: f64 = 1e-12;

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

/// How a balance decision was reached: the weights used (balance dimension order) and the
/// chosen agent's balance before and after the demand.
#[derive(Clone, Debug, PartialEq)]
pub struct BalanceNote {
    pub weights: Vec<f64>,
    pub y_before: f64,
    pub y_after: f64,
}

// Weights and balances are finite (sums and square roots of finite non-negative numbers).
impl Eq for BalanceNote {}

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
}

impl std::fmt::Debug for PlacementContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementContext")
            .field("settings", &self.settings)
            .field("pending", &self.pending)
            .field("cache", &self.cache)
            .field("score", &self.score.map(|_| "caller's"))
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

    /// Lets the ring search rank its best candidates by `score` ([`super::RingSearch`]).
    pub fn with_score(mut self, score: &'s dyn AgentScore) -> Self {
        self.score = Some(score);
        self
    }

    /// The caller's per-agent score, if it gave one.
    pub fn score(&self) -> Option<&'s dyn AgentScore> {
        self.score
    }

    /// Replaces the pending set.
    pub fn set_pending<'a>(&mut self, pending: impl IntoIterator<Item = (&'a Resources, u64)>) {
        self.pending.clear();
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
            let slot = self
                .pending
                .entry(name.to_string())
                .or_default()
                .entry(amount)
                .or_default();
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

/// Balance y of `agent` with `demand` placed on it (an empty demand gives the balance now).
/// Dimensions the agent does not have are left out of d, m and the sum.
pub fn balance_y(dims: &[String], weights: &[f64], agent: &AgentEntry, demand: &Resources) -> f64 {
    balance_before_after(dims, weights, agent, demand).1
}

/// (y before, y after) in one pass over the dimensions: each amount is looked up once.
fn balance_before_after(
    dims: &[String],
    weights: &[f64],
    agent: &AgentEntry,
    demand: &Resources,
) -> (f64, f64) {
    const INLINE: usize = 8;
    // (weight, d before, d after) per dimension the agent has; on the stack for up to 8.
    let mut inline = [(0.0, 0.0, 0.0); INLINE];
    let mut spill = Vec::new();
    let mut count = 0usize;
    let (mut sum_before, mut sum_after) = (0.0, 0.0);
    for (dim, w) in dims.iter().zip(weights) {
        let total = agent.total.milli(dim);
        if total == 0 {
            continue;
        }
        let used = total.saturating_sub(agent.free.milli(dim));
        let before = used as f64 / total as f64;
        let after = used.saturating_add(demand.milli(dim)) as f64 / total as f64;
        sum_before += before;
        sum_after += after;
        if count < INLINE {
            inline[count] = (*w, before, after);
        } else {
            spill.push((*w, before, after));
        }
        count += 1;
    }
    if count == 0 {
        return (0.0, 0.0);
    }
    let (m_before, m_after) = (sum_before / count as f64, sum_after / count as f64);
    let (mut y_before, mut y_after) = (0.0, 0.0);
    for (w, before, after) in inline[..count.min(INLINE)].iter().chain(&spill) {
        y_before += w * (before - m_before) * (before - m_before);
        y_after += w * (after - m_after) * (after - m_after);
    }
    (y_before.sqrt(), y_after.sqrt())
}

fn idle(agent: &AgentEntry) -> bool {
    agent
        .total
        .iter()
        .all(|(name, total)| agent.free.milli(name) == total)
}

/// The balance-degree placer of SPEC seed 000; see the module doc. Fitting agents are visited in
/// best-fit order of the demand's dominant dimension ([`fitting_agents`]); "first improving" is
/// the first in that order; "smallest y" ties go to the lowest key.
#[derive(Clone, Copy, Debug, Default)]
pub struct BalancePlacer;

impl Placer for BalancePlacer {
    fn name(&self) -> &'static str {
        "balance"
    }

    /// Without a context: default settings and no pending demands.
    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        self.place_in(cluster, demand, eligible, &mut PlacementContext::default())
    }

    fn place_in(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        dominant_dimension(demand, cluster.total())?;
        context.refresh(cluster);
        let cache = context.cache.as_ref()?;
        let settings = &context.settings;
        let at_threshold = cache.utilisation >= settings.threshold;
        // (y after, key, y before) of the best so far.
        let mut best: Option<(f64, AgentKey, f64)> = None;
        let mut chosen = None;
        for (key, agent) in fitting_agents(cluster, demand, eligible) {
            let (before, after) = balance_before_after(&cache.dims, &cache.weights, agent, demand);
            let improves = after < before - IMPROVEMENT_EPSILON;
            if settings.require_improvement && !improves && !idle(agent) {
                continue;
            }
            if improves && !at_threshold {
                chosen = Some((after, key, before));
                break;
            }
            let better =
                best.is_none_or(|(by, bk, _)| after.total_cmp(&by).then(key.cmp(&bk)).is_lt());
            if better {
                best = Some((after, key, before));
            }
        }
        chosen.or(best).map(|(y_after, agent, y_before)| Decision {
            agent,
            phase: None,
            bucket: None,
            dimension: None,
            balance: Some(BalanceNote {
                weights: cache.weights.clone(),
                y_before,
                y_after,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{PlacerKind, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    fn round4(x: f64) -> f64 {
        (x * 10_000.0).round() / 10_000.0
    }

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

    fn equal_settings(require_improvement: bool) -> BalanceSettings {
        let w = ["cpus", "mem", "gpus"].map(|n| (n.to_string(), 1.0 / 3.0));
        BalanceSettings::new(Some(w.to_vec()), 0.5, require_improvement).unwrap()
    }

    /// SPEC seed 000, golden example, driven by hand (the dry-run test drives it end to end).
    #[test]
    fn golden_example_step_by_step() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        let a = cluster.add_agent(r("cpus:100;mem:1000;gpus:10"));
        let jobs = [
            ("job5", "cpus:20;mem:500;gpus:4"),
            ("job2", "cpus:30;mem:400;gpus:2"),
            ("job1", "cpus:40;mem:200;gpus:2"),
            ("job4", "cpus:40;mem:300;gpus:4"),
            ("job3", "cpus:30;mem:300;gpus:1"),
            ("job6", "cpus:30;mem:200;gpus:1"),
        ];
        let demands: Vec<Resources> = jobs.iter().map(|(_, d)| r(d)).collect();
        let mut context = PlacementContext::new(equal_settings(true));
        context.set_pending(demands.iter().map(|d| (d, 1)));
        let mut notes = Vec::new();
        for (i, demand) in demands.iter().enumerate() {
            let decision = cluster.place_in(demand, &|_| true, &mut context);
            context.remove_pending(demand, 1);
            if let Some(d) = decision {
                cluster.take(d.agent, demand).unwrap();
                let note = d.balance.unwrap();
                notes.push((
                    jobs[i].0,
                    note.weights.iter().map(|w| round4(*w)).collect::<Vec<_>>(),
                    round4(note.y_before),
                    round4(note.y_after),
                ));
            }
        }
        assert_eq!(
            notes,
            [
                ("job5", vec![0.3333, 0.3333, 0.3333], 0.0, 0.1247),
                ("job1", vec![0.2593, 0.4074, 0.3333], 0.1217, 0.0497),
                ("job4", vec![0.2963, 0.4074, 0.2963], 0.0497, 0.0),
            ]
        );
        assert!(cluster.agent(a).unwrap().free.is_empty());
        // job2's refusal, with the weights it saw (after job5).
        let mut after_job5 = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        let b = after_job5.add_agent(r("cpus:100;mem:1000;gpus:10"));
        after_job5.take(b, &demands[0]).unwrap();
        let mut context = PlacementContext::new(equal_settings(true));
        context.set_pending(demands[1..].iter().map(|d| (d, 1)));
        let weights: Vec<f64> = context
            .weights(&after_job5)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        let dims = ["cpus", "mem", "gpus"].map(String::from);
        let agent = after_job5.agent(b).unwrap();
        assert_eq!(
            round4(balance_y(&dims, &weights, agent, &Resources::new())),
            0.1217
        );
        assert_eq!(
            round4(balance_y(&dims, &weights, agent, &demands[1])),
            0.1757
        );
        assert_eq!(
            after_job5.place_in(&demands[1], &|_| true, &mut context),
            None
        );
        // Without require_improvement job2 goes to the only agent (smallest y after).
        let mut lenient = PlacementContext::new(equal_settings(false));
        let d = after_job5
            .place_in(&demands[1], &|_| true, &mut lenient)
            .unwrap();
        assert_eq!(d.agent, b);
    }

    #[test]
    fn blocked_demands_raise_their_dimension() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        cluster.add_agent(r("cpus:8;mem:1000;gpus:1"));
        let big = cluster.add_agent(r("cpus:4;mem:4000"));
        let mut context = PlacementContext::new(equal_settings(false));
        let gpu_heavy = r("cpus:1;gpus:2");
        let mem_heavy = r("cpus:1;mem:5000");
        context.set_pending([(&gpu_heavy, 3), (&mem_heavy, 1)]);
        let blocked = |context: &mut PlacementContext, cluster: &Cluster| -> Vec<u64> {
            context
                .blocked_counts(cluster)
                .into_iter()
                .map(|(_, n)| n)
                .collect()
        };
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 3]);
        // r = (0, 1, 3) → chart (1/9, 1/3, 5/9); utilisation all 0 → (1/3, 1/3, 1/3).
        let w: Vec<f64> = context
            .weights(&cluster)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        let third = 1.0 / 3.0;
        let want = [
            (third + 1.0 / 9.0 + third) / 3.0,
            (third + third + third) / 3.0,
            (third + 5.0 / 9.0 + third) / 3.0,
        ];
        for (got, want) in w.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{w:?}");
        }
        // A change of the pending set adjusts the counts directly.
        context.remove_pending(&gpu_heavy, 2);
        let mid_mem = r("mem:3000");
        context.add_pending(&mid_mem, 2);
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
        // The largest free mem falls from 4000 to 1000: the mid-size demands are blocked now.
        cluster.take(big, &r("mem:3500")).unwrap();
        assert_eq!(blocked(&mut context, &cluster), [0, 3, 1]);
        cluster.give_back(big, &r("mem:3500")).unwrap();
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
        cluster.remove_agent(big);
        assert_eq!(blocked(&mut context, &cluster), [0, 3, 1]);
        context.remove_pending(&mid_mem, 5);
        context.remove_pending(&r("disk:1"), 1);
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
    }

    #[test]
    fn threshold_decides_between_first_improving_and_smallest() {
        // Visiting order is by free cpus: agent 1 (8) before agent 0 (10).
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        let a = cluster.add_agent(r("cpus:10;mem:1000"));
        cluster.take(a, &r("mem:500")).unwrap();
        let b = cluster.add_agent(r("cpus:8;mem:1000"));
        cluster.take(b, &r("mem:800")).unwrap();
        let w = vec![("cpus".to_string(), 0.5), ("mem".to_string(), 0.5)];
        let context = |threshold: f64| {
            PlacementContext::new(BalanceSettings::new(Some(w.clone()), threshold, false).unwrap())
        };
        // Utilisation: cpus 0, mem 1300/2000 → U = 0.325.
        // cpus:5 improves both: agent 1 (0, 0.8) → (0.625, 0.8), y 0.4 → 0.0875;
        // agent 0 (0, 0.5) → (0.5, 0.5), y 0.25 → 0.
        let demand = r("cpus:5");
        let below = cluster
            .place_in(&demand, &|_| true, &mut context(0.4))
            .unwrap();
        let note = below.balance.unwrap();
        assert_eq!(
            below.agent, b,
            "below the threshold: the first that improves"
        );
        assert_eq!((round4(note.y_before), round4(note.y_after)), (0.4, 0.0875));
        let at = cluster
            .place_in(&demand, &|_| true, &mut context(0.3))
            .unwrap();
        assert_eq!(at.agent, a, "at or above: the smallest y after");
        assert_eq!(at.balance.unwrap().y_after, 0.0);
        // mem:100 worsens both (agent 1: 0.4 → 0.45, agent 0: 0.25 → 0.3): smallest y after.
        let worse = cluster
            .place_in(&r("mem:100"), &|_| true, &mut context(1.0))
            .unwrap();
        assert_eq!(worse.agent, a);
        assert_eq!(round4(worse.balance.unwrap().y_after), 0.3);
        // With require_improvement nothing is eligible (neither agent is idle).
        let strict = BalanceSettings::new(Some(w.clone()), 1.0, true).unwrap();
        let mut strict = PlacementContext::new(strict);
        assert_eq!(
            cluster.place_in(&r("mem:100"), &|_| true, &mut strict),
            None
        );
        // An idle agent always is.
        let idle = cluster.add_agent(r("cpus:1;mem:1000"));
        let d = cluster
            .place_in(&r("mem:100"), &|_| true, &mut strict)
            .unwrap();
        assert_eq!(d.agent, idle);
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
}
