//! "Why is my task pending?": a per-dimension account of the agents that could not take a demand.
//!
//! This walks every agent once; it is for people and for the end of a step, not the hot path.

use std::fmt;

use super::feasible::{resources_fit, Filter};
use super::{AgentKey, Cluster, Resources};

/// Why no eligible agent fits a demand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhyUnplaced {
    pub demand: Resources,
    /// Number of agents in the cluster.
    pub agents: usize,
    /// For each dimension of the demand (sorted by name), how many agents have less free.
    pub short: Vec<(String, usize)>,
    /// Agents that fit but the eligibility filter excluded.
    pub not_eligible: usize,
    /// Agents that fit and are eligible (0 whenever placement failed for lack of room).
    pub fitting: usize,
    /// With named rules ([`WhyUnplaced::explain_rules`]): per rule, in [`Filter`] order, the
    /// agents it excluded (each against the first rule it fails; zero counts left out). Empty
    /// when eligibility was a plain yes/no.
    pub excluded: Vec<(Filter, usize)>,
}

impl WhyUnplaced {
    pub(crate) fn explain(
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
    ) -> Self {
        Self::walk(cluster, demand, &mut |key, _| eligible(key))
    }

    /// [`Cluster::why_unplaced`] with named rules: `rules` is the caller's verdict for an agent
    /// (every rule but resource fit, first failing one named, as
    /// [`feasible::check`](super::feasible::check) gives), and `excluded` counts per rule, with
    /// resource fit at its place in [`Filter`] order. One walk over the agents.
    pub fn explain_rules(
        cluster: &Cluster,
        demand: &Resources,
        rules: &dyn Fn(AgentKey) -> Result<(), Filter>,
    ) -> Self {
        let mut counts = [0usize; Filter::ALL.len()];
        let mut why = Self::walk(cluster, demand, &mut |key, free| {
            let rule = rules(key);
            let verdict = match rule {
                Err(f) if f < Filter::Resources => Err(f),
                other => resources_fit(free, demand).and(other),
            };
            if let Err(f) = verdict {
                counts[f as usize] += 1;
            }
            // Eligibility as placement sees it: every rule but resource fit.
            rule.is_ok()
        });
        why.excluded = Filter::ALL
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|(f, n)| (*f, n))
            .collect();
        why
    }

    /// `eligible(key, free)` is asked once for every agent.
    fn walk(
        cluster: &Cluster,
        demand: &Resources,
        eligible: &mut dyn FnMut(AgentKey, &Resources) -> bool,
    ) -> Self {
        let mut short: Vec<(String, usize)> = demand.names().map(|n| (n.to_string(), 0)).collect();
        let mut not_eligible = 0;
        let mut fitting = 0;
        for (key, agent) in cluster.agents() {
            let ok = eligible(key, &agent.free);
            let mut fits = true;
            for (i, (name, need)) in demand.iter().enumerate() {
                if agent.free.milli(name) < need {
                    short[i].1 += 1;
                    fits = false;
                }
            }
            if fits {
                if ok {
                    fitting += 1;
                } else {
                    not_eligible += 1;
                }
            }
        }
        WhyUnplaced {
            demand: demand.clone(),
            agents: cluster.len(),
            short,
            not_eligible,
            fitting,
            excluded: Vec::new(),
        }
    }
}

fn agents(n: usize) -> &'static str {
    if n == 1 {
        "agent"
    } else {
        "agents"
    }
}

impl fmt::Display for WhyUnplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.demand.is_empty() {
            return f.write_str("the demand is empty: nothing to place");
        }
        if self.fitting > 0 {
            let n = self.fitting;
            return write!(
                f,
                "{n} eligible {} fit{} {}",
                agents(n),
                if n == 1 { "s" } else { "" },
                self.demand
            );
        }
        write!(f, "no agent fits {}: ", self.demand)?;
        if self.agents == 0 {
            return f.write_str("the cluster has no agents");
        }
        let mut first = true;
        for (name, n) in self.short.iter().filter(|(_, n)| *n > 0) {
            if first {
                write!(f, "{n} {} short of {name}", agents(*n))?;
            } else {
                write!(f, ", {n} short of {name}")?;
            }
            first = false;
        }
        if self.not_eligible > 0 {
            let sep = if first { "" } else { ", " };
            write!(f, "{sep}{} not eligible", self.not_eligible)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::placement::{Cluster, PlacerKind, Resources, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    #[test]
    fn explains_per_dimension_shortfalls() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        for a in [
            "cpus:4;mem:8192",
            "cpus:16;mem:1024",
            "cpus:2;mem:2048",
            "cpus:8;mem:4096",
            "cpus:8;mem:4096",
        ] {
            cluster.add_agent(r(a));
        }
        let all = |_| true;
        type Eligible<'a> = &'a dyn Fn(usize) -> bool;
        let cases: [(&str, Eligible, &str); 6] = [
            ("cpus:8;mem:4096", &|k| k < 3, "no agent fits cpus:8;mem:4096: 2 agents short of cpus, 2 short of mem, 2 not eligible"),
            ("cpus:32", &all, "no agent fits cpus:32: 5 agents short of cpus"),
            ("cpus:1;gpus:1", &all, "no agent fits cpus:1;gpus:1: 5 agents short of gpus"),
            ("cpus:8;mem:4096", &|k| k != 3, "1 eligible agent fits cpus:8;mem:4096"),
            ("cpus:8", &|_| false, "no agent fits cpus:8: 2 agents short of cpus, 3 not eligible"),
            ("", &all, "the demand is empty: nothing to place"),
        ];
        for (demand, eligible, expected) in cases {
            assert_eq!(
                cluster.why_unplaced(&r(demand), eligible).to_string(),
                expected
            );
        }
        let empty = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        assert_eq!(
            empty.why_unplaced(&r("cpus:1"), &all).to_string(),
            "no agent fits cpus:1: the cluster has no agents"
        );
    }
}
