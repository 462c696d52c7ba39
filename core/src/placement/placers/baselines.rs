//! Baselines the ring search is measured against: [`LinearBestFit`] (scan every agent, best fit
//! in the dominant dimension) and [`FirstFit`] (the first agent in key order that fits).

use super::context::PlacementContext;
use super::{dominant_dimension, Decision, Placer, PlacerNote};
use crate::placement::{AgentKey, Cluster, Resources};

/// Every dimension of `demand` is at most `free`'s.
fn fits(free: &Resources, demand: &Resources) -> bool {
    free.contains(demand)
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
        _context: &mut PlacementContext,
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
            dimension: Some(dimension.into()),
            note: PlacerNote::None,
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
        _context: &mut PlacementContext,
    ) -> Option<Decision> {
        // Same refusals as the others: an empty demand, or one the cluster has none of.
        dominant_dimension(demand, cluster.total())?;
        cluster
            .agents()
            .find(|(key, agent)| fits(&agent.free, demand) && eligible(*key))
            .map(|(agent, _)| Decision::plain(agent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::RingsConfig;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// Ring layout does not matter to the baselines.
    fn cluster(agents: &[&str]) -> Cluster {
        let mut cluster = Cluster::new(RingsConfig::default(), Default::default());
        for a in agents {
            cluster.add_agent(r(a));
        }
        cluster
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
                note: PlacerNote::None,
            }
        );
        let ff = cluster.place_with(&FirstFit, &demand, &|k| k != 0).unwrap();
        assert_eq!(ff.agent, 1);
        assert_eq!(ff.dimension, None);
        assert_eq!(cluster.place_with(&FirstFit, &r(""), &|_| true), None);
    }
}
