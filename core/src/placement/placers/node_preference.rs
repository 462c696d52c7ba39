//! Node preference among fitting agents (SPEC seed 004, after Kubernetes' noderesources scorers):
//! **least-requested** and **most-balanced**.
//!
//! For an agent and a demand, the *requested ratio* of dimension i is
//! `(total_i − free_i + demand_i) ÷ total_i`: what the agent would have in use, demand included,
//! over its capacity. Every dimension of the agent's total counts (a dimension it does not have is
//! left out, as Kubernetes skips resources a node has none of):
//! - least-requested picks the agent with the smallest **mean** of the ratios (spreads load);
//! - most-balanced picks the agent with the smallest **variance** of the ratios (population
//!   variance, `mean((r_i − mean r)²)`): the one whose dimensions stay most evenly used.
//!
//! Ties, both: the lowest [`AgentKey`]. Neither can be answered from the rings alone (the score
//! mixes every dimension), so both visit every fitting agent; [`fitting_agents`] at least skips
//! the agents that lack the demand's dominant dimension, through that dimension's ring.

use super::context::PlacementContext;
use super::{Decision, Placer};
use crate::placement::{AgentEntry, AgentKey, Cluster, Resources};

/// Shared with the balance placer; defined with the trait, named here as before.
pub use super::fitting_agents;

/// The requested ratio of every dimension the agent has, in name order (see the module doc).
pub fn requested_ratios(agent: &AgentEntry, demand: &Resources) -> Vec<f64> {
    ratios(agent, demand).collect()
}

/// One requested ratio per dimension the agent has, without collecting them.
fn ratios<'a>(agent: &'a AgentEntry, demand: &'a Resources) -> impl Iterator<Item = f64> + 'a {
    agent.total.iter().map(move |(name, total)| {
        let used = total.saturating_sub(agent.free.milli(name));
        (used.saturating_add(demand.milli(name))) as f64 / total as f64
    })
}

fn mean_of(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Mean of the requested ratios (0 for an agent with nothing).
pub fn least_requested_score(agent: &AgentEntry, demand: &Resources) -> f64 {
    mean_of(ratios(agent, demand))
}

/// Population variance of the requested ratios (0 for an agent with nothing): two passes, so
/// equal ratios give exactly 0.
pub fn most_balanced_score(agent: &AgentEntry, demand: &Resources) -> f64 {
    let m = mean_of(ratios(agent, demand));
    mean_of(ratios(agent, demand).map(|r| (r - m) * (r - m)))
}

/// The fitting agent with the smallest `score`, ties to the lowest key.
fn smallest(
    cluster: &Cluster,
    demand: &Resources,
    eligible: &dyn Fn(AgentKey) -> bool,
    score: fn(&AgentEntry, &Resources) -> f64,
) -> Option<Decision> {
    let mut best: Option<(f64, AgentKey)> = None;
    for (key, agent) in fitting_agents(cluster, demand, eligible) {
        let s = score(agent, demand);
        let better = best.is_none_or(|(bs, bk)| s.total_cmp(&bs).then(key.cmp(&bk)).is_lt());
        if better {
            best = Some((s, key));
        }
    }
    best.map(|(_, agent)| Decision::plain(agent))
}

/// Smallest mean requested ratio among fitting agents: spread the load.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastRequested;

impl Placer for LeastRequested {
    fn name(&self) -> &'static str {
        "least-requested"
    }

    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        _context: &mut PlacementContext,
    ) -> Option<Decision> {
        smallest(cluster, demand, eligible, least_requested_score)
    }
}

/// Smallest variance of the requested ratios among fitting agents: keep dimensions even.
#[derive(Clone, Copy, Debug, Default)]
pub struct MostBalanced;

impl Placer for MostBalanced {
    fn name(&self) -> &'static str {
        "most-balanced"
    }

    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        _context: &mut PlacementContext,
    ) -> Option<Decision> {
        smallest(cluster, demand, eligible, most_balanced_score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::RingsConfig;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// (total, already used) per agent.
    fn cluster(agents: &[(&str, &str)]) -> Cluster {
        let mut cluster = Cluster::new(RingsConfig::default(), Default::default());
        for (total, used) in agents {
            let key = cluster.add_agent(r(total));
            cluster.take(key, &r(used)).unwrap();
        }
        cluster
    }

    fn place(placer: &dyn Placer, cluster: &Cluster, demand: &Resources) -> Option<Decision> {
        placer.place(cluster, demand, &|_| true, &mut PlacementContext::default())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// In the manner of Kubernetes' least_allocated_test.go: exact scores and the winner.
    #[test]
    fn least_requested_table() {
        struct Case {
            what: &'static str,
            agents: &'static [(&'static str, &'static str)],
            demand: &'static str,
            scores: &'static [f64],
            expected: Option<AgentKey>,
        }
        let cases = [
            Case {
                what: "idle agents: the bigger one is less requested",
                agents: &[("cpus:4;mem:10000", ""), ("cpus:6;mem:10000", "")],
                demand: "cpus:3;mem:5000",
                // (3/4 + 5000/10000)/2 = 0.625; (3/6 + 0.5)/2 = 0.5
                scores: &[0.625, 0.5],
                expected: Some(1),
            },
            Case {
                what: "same size, different use",
                agents: &[
                    ("cpus:10;mem:20000", "cpus:6;mem:0"),
                    ("cpus:10;mem:20000", "cpus:2;mem:10000"),
                ],
                demand: "cpus:2;mem:5000",
                // (8/10 + 5/20)/2 = 0.525; (4/10 + 15/20)/2 = 0.575
                scores: &[0.525, 0.575],
                expected: Some(0),
            },
            Case {
                what: "a dimension the agent lacks is left out of its mean",
                agents: &[("cpus:8;mem:8000;gpus:4", ""), ("cpus:8;mem:8000", "")],
                demand: "cpus:4;mem:2000",
                // (0.5 + 0 + 0.25)/3 = 0.25 against (0.5 + 0.25)/2 = 0.375
                scores: &[0.25, 0.375],
                expected: Some(0),
            },
            Case {
                what: "a tie goes to the lowest key",
                agents: &[("cpus:4;mem:4000", ""), ("cpus:4;mem:4000", "")],
                demand: "cpus:1;mem:1000",
                scores: &[0.25, 0.25],
                expected: Some(0),
            },
            Case {
                what: "the better score does not fit: skipped",
                agents: &[
                    ("cpus:2;mem:1000", ""),
                    ("cpus:100;mem:100000", "mem:99500"),
                ],
                demand: "cpus:1;mem:1000",
                // agent 1 would score (1/100 + 100500/100000)/2 but lacks 500 mem
                scores: &[0.75, 0.5075],
                expected: Some(0),
            },
        ];
        for case in cases {
            let cluster = cluster(case.agents);
            let demand = r(case.demand);
            for (key, want) in case.scores.iter().enumerate() {
                let got = least_requested_score(cluster.agent(key).unwrap(), &demand);
                assert!(
                    close(got, *want),
                    "{}: agent {key}: {got} != {want}",
                    case.what
                );
            }
            let got = place(&LeastRequested, &cluster, &demand).map(|d| d.agent);
            assert_eq!(got, case.expected, "{}", case.what);
        }
    }

    /// In the manner of Kubernetes' balanced_allocation_test.go: exact variances and the winner.
    #[test]
    fn most_balanced_table() {
        struct Case {
            what: &'static str,
            agents: &'static [(&'static str, &'static str)],
            demand: &'static str,
            scores: &'static [f64],
            expected: Option<AgentKey>,
        }
        let cases = [
            Case {
                what: "the demand evens out the used agent",
                agents: &[
                    ("cpus:10;mem:10000", ""),
                    ("cpus:10;mem:10000", "cpus:0;mem:4000"),
                ],
                demand: "cpus:4",
                // agent 0: ratios (0.4, 0) → mean 0.2, variance 0.04; agent 1: (0.4, 0.4) → 0
                scores: &[0.04, 0.0],
                expected: Some(1),
            },
            Case {
                what: "proportional to capacity: variance 0 on every agent, lowest key",
                agents: &[("cpus:4;mem:4000", ""), ("cpus:8;mem:8000", "")],
                demand: "cpus:2;mem:2000",
                scores: &[0.0, 0.0],
                expected: Some(0),
            },
            Case {
                what: "three dimensions",
                agents: &[
                    ("cpus:10;mem:1000;gpus:4", "gpus:2"),
                    ("cpus:10;mem:1000;gpus:4", "cpus:5"),
                ],
                demand: "cpus:5;mem:500",
                // agent 0: (0.5, 0.5, 0.5) → 0; agent 1: (1, 0.5, 0) → mean 0.5, variance 1/6
                scores: &[0.0, 1.0 / 6.0],
                expected: Some(0),
            },
            Case {
                what: "more balanced but does not fit: skipped",
                agents: &[("cpus:10;mem:1000", ""), ("cpus:1;mem:100", "")],
                demand: "cpus:1;mem:500",
                // agent 0: (0.1, 0.5) → 0.04; agent 1 would be (1, 5) but lacks mem
                scores: &[0.04, 4.0],
                expected: Some(0),
            },
            Case {
                what: "nothing fits",
                agents: &[("cpus:1;mem:100", "")],
                demand: "cpus:2",
                // ratios (2, 0): mean 1, variance 1
                scores: &[1.0],
                expected: None,
            },
        ];
        for case in cases {
            let cluster = cluster(case.agents);
            let demand = r(case.demand);
            for (key, want) in case.scores.iter().enumerate() {
                let got = most_balanced_score(cluster.agent(key).unwrap(), &demand);
                assert!(
                    close(got, *want),
                    "{}: agent {key}: {got} != {want}",
                    case.what
                );
            }
            let got = place(&MostBalanced, &cluster, &demand).map(|d| d.agent);
            assert_eq!(got, case.expected, "{}", case.what);
        }
    }
}
