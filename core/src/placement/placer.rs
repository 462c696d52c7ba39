//! Placers: the functions that pick one agent for one demand.
//!
//! [`Placer`] is the one interface a policy implements; the cluster hands it its agents and rings.
//! [`RingPlacer`] is the search of SPEC seed 001 step 3; [`LinearBestFit`] and [`FirstFit`] are
//! the baselines it is measured against. Other policies live in their own modules
//! ([`super::balance`], [`super::node_preference`]); each is one type plus one [`PlacerKind`]
//! variant.
//!
//! Tie rules, all deterministic:
//! - dominant dimension: the largest demand ÷ cluster total, compared exactly in integers; equal
//!   ratios go to the dimension whose name sorts first;
//! - best fit: smallest leftover in the dominant dimension, then the lowest [`AgentKey`];
//! - largest (downward phase): largest free amount in the dominant dimension, then lowest key;
//! - first fit: lowest key.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use super::balance::{BalanceNote, BalancePlacer, PlacementContext};
use super::node_preference::{LeastRequested, MostBalanced};
use super::ring_search::AgentScore;
use super::{AgentKey, Cluster, Resources, RingSet};

/// The phase of the ring search that found the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Bucket K, the one holding the demand's amount.
    Bucket,
    /// Buckets K+1 … K+search_up, best fit in the first with a fitting agent.
    Up,
    /// From the top bucket down to K+search_up+1, the largest agent of the first with one.
    Down,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Bucket => "bucket",
            Phase::Up => "up",
            Phase::Down => "down",
        })
    }
}

/// The chosen agent and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub agent: AgentKey,
    /// Ring search phase (`None` for placers without rings).
    pub phase: Option<Phase>,
    /// Bucket index in the dominant dimension's ring (`None` for placers without rings).
    pub bucket: Option<usize>,
    /// The dominant dimension the placer ranked by, if it uses one.
    pub dimension: Option<String>,
    /// The balance placer's explanation (weights, y before and after).
    pub balance: Option<BalanceNote>,
}

/// Picks an agent for a demand. "Fits" always means every dimension of the demand is at most the
/// agent's free amount; only agents `eligible` accepts may be chosen. An empty demand is never
/// placed (there is nothing to rank agents by).
pub trait Placer {
    /// The name used in config files and on the command line.
    fn name(&self) -> &'static str;
    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision>;

    /// Places knowing what [`PlacementContext`] carries (settings, the pending demands). Only
    /// placers that need it override this; the others ignore the context.
    fn place_in(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        let _ = context;
        self.place(cluster, demand, eligible)
    }
}

/// The selectable placers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacerKind {
    #[default]
    Ring,
    LinearBestFit,
    FirstFit,
    /// Balance degree with dynamic weights (SPEC seed 000).
    Balance,
    /// Smallest mean requested ÷ capacity (SPEC seed 004).
    LeastRequested,
    /// Smallest variance of requested ÷ capacity (SPEC seed 004).
    MostBalanced,
}

impl PlacerKind {
    pub const ALL: [PlacerKind; 6] = [
        PlacerKind::Ring,
        PlacerKind::LinearBestFit,
        PlacerKind::FirstFit,
        PlacerKind::Balance,
        PlacerKind::LeastRequested,
        PlacerKind::MostBalanced,
    ];

    /// The implementation of this kind.
    pub fn placer(self) -> &'static dyn Placer {
        match self {
            PlacerKind::Ring => &RingPlacer,
            PlacerKind::LinearBestFit => &LinearBestFit,
            PlacerKind::FirstFit => &FirstFit,
            PlacerKind::Balance => &BalancePlacer,
            PlacerKind::LeastRequested => &LeastRequested,
            PlacerKind::MostBalanced => &MostBalanced,
        }
    }
}

impl fmt::Display for PlacerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.placer().name())
    }
}

/// An unknown placer name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown placer `{0}` (expected ring, linear-best-fit, first-fit, balance, least-requested or most-balanced)")]
pub struct UnknownPlacer(pub String);

impl FromStr for PlacerKind {
    type Err = UnknownPlacer;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PlacerKind::ALL
            .into_iter()
            .find(|k| k.placer().name() == s)
            .ok_or_else(|| UnknownPlacer(s.to_string()))
    }
}

/// The dimension of `demand` with the largest demand ÷ cluster total. `None` when the demand is
/// empty or asks for a dimension the cluster has none of (then nothing can fit).
pub fn dominant_dimension<'a>(demand: &'a Resources, total: &Resources) -> Option<&'a str> {
    let mut best: Option<(&str, u64, u64)> = None;
    for (name, need) in demand.iter() {
        let have = total.milli(name);
        if have == 0 {
            return None;
        }
        let larger = match best {
            None => true,
            // need/have > best_need/best_have, exactly.
            Some((_, bn, bh)) => {
                (need as u128 * bh as u128).cmp(&(bn as u128 * have as u128)) == Ordering::Greater
            }
        };
        if larger {
            best = Some((name, need, have));
        }
    }
    best.map(|(name, _, _)| name)
}

/// Every dimension of `demand` is at most `free`'s.
fn fits(free: &Resources, demand: &Resources) -> bool {
    free.contains(demand)
}

/// The ring search of SPEC seed 001 step 3, with the options of [`RingSearch`].
///
/// With D the dominant dimension, d the demand's amount in D and K the bucket holding d:
/// 1. bucket K: best fit (least free − d among fitting agents);
/// 2. buckets K+1 … N, N = min(K + search_up, top): best fit in the first with a fitting agent;
/// 3. buckets top … N+1, downward: the agent with the largest free amount in the first with one.
///
/// Beyond the seed ([`RingsConfig::search`](super::RingsConfig::search)): a demand asking for
/// none of a spared dimension is first searched among agents with none of it free; and when the
/// [`PlacementContext`] carries an [`AgentScore`], the first `candidates` fitting agents in the
/// search's order (across buckets) are ranked by it (equal scores: the search's order). [`RingsConfig::seed_001`](super::RingsConfig::seed_001) turns both off.
///
/// [`RingSearch`]: super::RingSearch
#[derive(Clone, Copy, Debug, Default)]
pub struct RingPlacer;

impl Placer for RingPlacer {
    fn name(&self) -> &'static str {
        "ring"
    }

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
        let search = cluster.rings_config().search();
        let score = context.score().filter(|_| search.candidates() > 1);
        let k = if score.is_some() {
            search.candidates()
        } else {
            1
        };
        // Spared dimensions this demand does not ask for, which some agent has none of free.
        let mut spared: [usize; 4] = [0; 4];
        let mut n_spared = 0;
        for name in search.spare() {
            if n_spared == spared.len() || demand.milli(name) > 0 {
                continue;
            }
            if let Some(d) = cluster.dimension_of(name) {
                if cluster.some_agent_without(d) {
                    spared[n_spared] = d;
                    n_spared += 1;
                }
            }
        }
        if n_spared > 0 {
            let spared = &spared[..n_spared];
            let without = |key: AgentKey| {
                spared.iter().all(|&d| cluster.free_in(key, d) == 0) && eligible(key)
            };
            if let Some(found) = ring_search(cluster, demand, &without, k, score) {
                return Some(found);
            }
        }
        ring_search(cluster, demand, eligible, k, score)
    }
}

/// One ring search (the three phases) among `eligible` agents; with a score and `k` > 1, the
/// first `k` fitting agents in the search's order are ranked by the score ([`scored_search`]).
fn ring_search(
    cluster: &Cluster,
    demand: &Resources,
    eligible: &dyn Fn(AgentKey) -> bool,
    k: usize,
    score: Option<&dyn AgentScore>,
) -> Option<Decision> {
    let dimension = dominant_dimension(demand, cluster.total())?;
    let ring = cluster.ring(dimension)?;
    let need = demand.milli(dimension);
    let resolved = cluster.resolve(demand);
    let fitting = |key: AgentKey| cluster.fits(key, &resolved) && eligible(key);
    let decided = |agent: AgentKey, phase: Phase, bucket: usize| Decision {
        agent,
        phase: Some(phase),
        bucket: Some(bucket),
        dimension: Some(dimension.to_string()),
        balance: None,
    };
    if let Some(score) = score.filter(|_| k > 1) {
        return scored_search(ring, need, &fitting, k, demand, score)
            .map(|(agent, phase, bucket)| decided(agent, phase, bucket));
    }
    let k = ring.bucket_of(need);
    let top = ring.len() - 1;
    if let Some((_, agent)) = ring.best_fit(k, need, &fitting) {
        return Some(decided(agent, Phase::Bucket, k));
    }
    let n = k.saturating_add(ring.search_up()).min(top);
    for bucket in k + 1..=n {
        if let Some((_, agent)) = ring.best_fit(bucket, need, &fitting) {
            return Some(decided(agent, Phase::Up, bucket));
        }
    }
    for bucket in (n + 1..=top).rev() {
        if let Some((_, agent)) = ring.largest_fit(bucket, need, &fitting) {
            return Some(decided(agent, Phase::Down, bucket));
        }
    }
    None
}

/// The scored tie-break: the first `k` fitting agents in the seed search's order — bucket K and
/// the upward window in best-fit order, then the downward buckets largest first — continuing
/// into the next buckets until `k` are found, and the lowest `score` among them (equal scores:
/// the earlier). The first candidate is the seed search's answer. O(k log n) ordered-set steps
/// plus the buckets visited, and `k` calls of `score`.
fn scored_search(
    ring: &RingSet,
    need: u64,
    fitting: &dyn Fn(AgentKey) -> bool,
    k: usize,
    demand: &Resources,
    score: &dyn AgentScore,
) -> Option<(AgentKey, Phase, usize)> {
    let kf = ring.bucket_of(need);
    let top = ring.len() - 1;
    let n = kf.saturating_add(ring.search_up()).min(top);
    let mut all: Vec<(AgentKey, Phase, usize)> = Vec::with_capacity(k);
    let mut some = Vec::with_capacity(k);
    for bucket in kf..=n {
        ring.best_fits(bucket, need, fitting, k - all.len(), &mut some);
        let phase = if bucket == kf {
            Phase::Bucket
        } else {
            Phase::Up
        };
        all.extend(some.iter().map(|&(_, a)| (a, phase, bucket)));
        if all.len() >= k {
            break;
        }
    }
    if all.len() < k {
        for bucket in (n + 1..=top).rev() {
            ring.largest_fits(bucket, need, fitting, k - all.len(), &mut some);
            all.extend(some.iter().map(|&(_, a)| (a, Phase::Down, bucket)));
            if all.len() >= k {
                break;
            }
        }
    }
    let mut best: Option<(i64, (AgentKey, Phase, usize))> = None;
    for c in all {
        let s = score.score(c.0, demand);
        if best.is_none_or(|(b, _)| s < b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Baseline: scan every agent, least leftover in the dominant dimension (ties: lowest key).
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearBestFit;

impl Placer for LinearBestFit {
    fn name(&self) -> &'static str {
        "linear-best-fit"
    }

    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        let dimension = dominant_dimension(demand, cluster.total())?;
        let need = demand.milli(dimension);
        let mut best: Option<(u64, AgentKey)> = None;
        for (key, agent) in cluster.agents() {
            if !fits(&agent.free, demand) || !eligible(key) {
                continue;
            }
            let leftover = agent.free.milli(dimension) - need;
            if best.is_none_or(|(b, _)| leftover < b) {
                best = Some((leftover, key));
            }
        }
        best.map(|(_, agent)| Decision {
            agent,
            phase: None,
            bucket: None,
            dimension: Some(dimension.to_string()),
            balance: None,
        })
    }
}

/// Baseline: the first agent in key (slab) order that fits.
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstFit;

impl Placer for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }

    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Option<Decision> {
        // Same refusals as the others: an empty demand, or one the cluster has none of.
        dominant_dimension(demand, cluster.total())?;
        cluster
            .agents()
            .find(|(key, agent)| fits(&agent.free, demand) && eligible(*key))
            .map(|(agent, _)| Decision {
                agent,
                phase: None,
                bucket: None,
                dimension: None,
                balance: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{RingLayout, RingSpec, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// cpus: 8 equal buckets of 1 cpu, search_up 2; mem: one big bucket so it never matters.
    fn cluster(agents: &[&str]) -> Cluster {
        let mut rings = RingsConfig::default();
        rings.set(
            "cpus",
            RingSpec::new(
                RingLayout::EqualSpans {
                    base: 0,
                    step: 1000,
                    buckets: 8,
                },
                2,
            )
            .unwrap(),
        );
        let mut cluster = Cluster::new(rings, PlacerKind::Ring);
        for a in agents {
            cluster.add_agent(r(a));
        }
        cluster
    }

    #[test]
    fn placer_names_round_trip() {
        for kind in PlacerKind::ALL {
            assert_eq!(kind.to_string().parse::<PlacerKind>().unwrap(), kind);
        }
        assert_eq!(
            "best".parse::<PlacerKind>().unwrap_err().to_string(),
            "unknown placer `best` (expected ring, linear-best-fit, first-fit, balance, least-requested or most-balanced)"
        );
        assert_eq!(PlacerKind::default(), PlacerKind::Ring);
    }

    #[test]
    fn dominant_dimension_is_the_largest_share_of_the_cluster() {
        let total = r("cpus:9;mem:18432;gpus:2");
        let cases = [
            ("cpus:1;mem:4096", Some("mem")),  // 1/9 < 4096/18432 = 2/9
            ("cpus:3;mem:1024", Some("cpus")), // 3/9 > 1/18
            ("cpus:1;mem:2048", Some("cpus")), // 1/9 = 2048/18432: tie goes to the first name
            ("cpus:1;gpus:1", Some("gpus")),
            ("fpgas:1", None),
            ("", None),
        ];
        for (demand, expected) in cases {
            assert_eq!(dominant_dimension(&r(demand), &total), expected, "{demand}");
        }
    }

    /// Each case: agents (keys 0, 1, …), demand, then (agent, phase, bucket) for the ring placer.
    /// Cluster totals are large in mem, so cpus is dominant unless stated.
    #[test]
    fn every_phase_of_the_ring_search() {
        struct Case {
            what: &'static str,
            agents: &'static [&'static str],
            demand: &'static str,
            expected: Option<(AgentKey, Phase, usize)>,
        }
        let cases = [
            Case {
                what: "best fit inside bucket K",
                agents: &["cpus:2.9;mem:100", "cpus:2.2;mem:100", "cpus:2.5;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Bucket, 2)),
            },
            Case {
                what: "bucket K holds only agents below the demand: go up",
                agents: &[
                    "cpus:2.4;mem:100",
                    "cpus:2.1;mem:100",
                    "cpus:3.7;mem:100",
                    "cpus:3.2;mem:100",
                ],
                demand: "cpus:2.5;mem:10",
                expected: Some((3, Phase::Up, 3)),
            },
            Case {
                what: "upward window: first bucket with a fit wins, best fit inside it",
                agents: &["cpus:4.9;mem:100", "cpus:4.1;mem:100", "cpus:5.5;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Up, 4)),
            },
            Case {
                what: "boundary of the upward window: K+search_up is still up",
                agents: &["cpus:7.5;mem:100", "cpus:4.9;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Up, 4)),
            },
            Case {
                what: "just past the window: downward phase from the top",
                agents: &["cpus:5.1;mem:100", "cpus:6.9;mem:100", "cpus:6.2;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Down, 6)),
            },
            Case {
                what: "downward phase picks the largest agent in the first bucket with a fit",
                agents: &[
                    "cpus:7.1;mem:100",
                    "cpus:9;mem:100",
                    "cpus:30;mem:100",
                    "cpus:5;mem:100",
                ],
                demand: "cpus:1;mem:1",
                expected: Some((2, Phase::Down, 7)),
            },
            Case {
                what: "fits the dominant dimension but not another: skipped",
                agents: &["cpus:2.1;mem:5", "cpus:2.6;mem:100", "cpus:2.3;mem:9"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Bucket, 2)),
            },
            Case {
                what: "largest agent lacks another dimension: next largest",
                agents: &["cpus:30;mem:5", "cpus:20;mem:100", "cpus:1;mem:100"],
                demand: "cpus:3;mem:10",
                expected: Some((1, Phase::Down, 7)),
            },
            Case {
                what: "search_up capped at the top bucket",
                agents: &["cpus:7;mem:100", "cpus:12;mem:100", "cpus:9;mem:100"],
                demand: "cpus:6.5;mem:10",
                expected: Some((0, Phase::Up, 7)),
            },
            Case {
                what: "equal free amounts: lowest key",
                agents: &["cpus:3.5;mem:100", "cpus:3.5;mem:100"],
                demand: "cpus:3;mem:10",
                expected: Some((0, Phase::Bucket, 3)),
            },
            Case {
                what: "nothing fits",
                agents: &["cpus:1;mem:100", "cpus:4;mem:1"],
                demand: "cpus:2;mem:10",
                expected: None,
            },
            Case {
                what: "a dimension the cluster has none of",
                agents: &["cpus:8;mem:100"],
                demand: "cpus:1;gpus:1",
                expected: None,
            },
        ];
        for case in cases {
            let cluster = cluster(case.agents);
            let got = cluster.place(&r(case.demand), &|_| true).map(|d| {
                assert_eq!(d.dimension.as_deref(), Some("cpus"), "{}", case.what);
                (d.agent, d.phase.unwrap(), d.bucket.unwrap())
            });
            assert_eq!(got, case.expected, "{}", case.what);
        }
    }

    #[test]
    fn eligibility_filters_like_a_misfit() {
        let cluster = cluster(&["cpus:2.1;mem:100", "cpus:2.6;mem:100", "cpus:6;mem:100"]);
        let d = cluster.place(&r("cpus:2;mem:1"), &|k| k != 0).unwrap();
        assert_eq!((d.agent, d.phase), (1, Some(Phase::Bucket)));
        let d = cluster.place(&r("cpus:2;mem:1"), &|k| k == 2).unwrap();
        assert_eq!(
            (d.agent, d.phase, d.bucket),
            (2, Some(Phase::Down), Some(6))
        );
        assert_eq!(cluster.place(&r("cpus:2;mem:1"), &|_| false), None);
    }

    #[test]
    fn baselines() {
        let cluster = cluster(&[
            "cpus:6;mem:100",
            "cpus:2.6;mem:100",
            "cpus:2.1;mem:5",
            "cpus:2.3;mem:100",
        ]);
        let demand = r("cpus:2;mem:10");
        let lbf = cluster
            .place_with(&LinearBestFit, &demand, &|_| true)
            .unwrap();
        assert_eq!(
            lbf,
            Decision {
                agent: 3,
                phase: None,
                bucket: None,
                dimension: Some("cpus".into()),
                balance: None,
            }
        );
        let ff = cluster.place_with(&FirstFit, &demand, &|k| k != 0).unwrap();
        assert_eq!(ff.agent, 1);
        assert_eq!(ff.dimension, None);
        assert_eq!(cluster.place_with(&FirstFit, &r(""), &|_| true), None);
    }

    /// The scored tie-break on a hand-made case: gpus dominant, four agents. Best-fit order is
    /// 1 (1.5 free), 3 (2 free), 0 (4 free), 2 (8 free); the caller's score prefers 0, then 2.
    #[test]
    fn scored_tie_break_picks_the_lowest_score_among_the_first_k() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        for total in [
            "cpus:8;mem:100;gpus:4",
            "cpus:8;mem:100;gpus:1.5",
            "cpus:8;mem:100;gpus:8",
            "cpus:8;mem:100;gpus:2",
        ] {
            cluster.add_agent(r(total));
        }
        let demand = r("cpus:1;mem:1;gpus:1");
        let score = |agent: AgentKey, _: &Resources| match agent {
            0 => 1,
            2 => 2,
            _ => 5,
        };
        let place = |cluster: &Cluster, candidates: usize| {
            let mut rings = cluster.rings_config().clone();
            let spare = rings.search().spare().to_vec();
            rings.set_search(crate::placement::RingSearch::new(spare, candidates).unwrap());
            let mut c = Cluster::new(rings, PlacerKind::Ring);
            for (_, a) in cluster.agents() {
                c.add_agent(a.total.clone());
            }
            let mut context = PlacementContext::default().with_score(&score);
            let d = c.place_in(&demand, &|_| true, &mut context).unwrap();
            (d.agent, d.phase.unwrap(), d.bucket.unwrap())
        };
        // K = 1: no tie-break, the seed's best fit (bucket 1 holds 1.5).
        assert_eq!(place(&cluster, 1), (1, Phase::Bucket, 1));
        // K = 2: candidates 1, 3 (both score 5): the earlier, 1.
        assert_eq!(place(&cluster, 2), (1, Phase::Bucket, 1));
        // K = 3: candidates spill into bucket 4 and take 0 (score 1).
        assert_eq!(place(&cluster, 3), (0, Phase::Up, 4));
        // The same with agent 0 not eligible: 2 (score 2) once K reaches it.
        let mut context = PlacementContext::default().with_score(&score);
        let d = cluster
            .place_in(&demand, &|k| k != 0, &mut context)
            .unwrap();
        assert_eq!((d.agent, d.bucket), (2, Some(8)));
        // Without a score the default search is the seed's, whatever K.
        assert_eq!(cluster.place(&demand, &|_| true).unwrap().agent, 1);
    }

    /// SPEC seed 001 example: one 4 CPU / 8 GB agent takes (2, 1 GB) then (2, 2 GB).
    #[test]
    fn seed_001_example() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(r("cpus:4;mem:8192"));
        for task in ["cpus:2;mem:1024", "cpus:2;mem:2048"] {
            let d = cluster.place(&r(task), &|_| true).unwrap();
            assert_eq!(d.agent, a);
            cluster.take(d.agent, &r(task)).unwrap();
        }
        assert_eq!(cluster.agent(a).unwrap().free, r("mem:5120"));
        assert_eq!(cluster.place(&r("cpus:1;mem:1"), &|_| true), None);
    }
}
