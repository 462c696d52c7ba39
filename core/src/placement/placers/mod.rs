//! Placers: the functions that pick one agent for one demand, each in its own module behind the
//! one [`Placer`] trait.
//!
//! - [`ring`]: the ring search of SPEC seed 001 step 3 with its options beyond the seed (sparing,
//!   a caller-scored tie-break: [`ring::RingSearch`]);
//! - [`baselines`]: [`FirstFit`](baselines::FirstFit) and
//!   [`LinearBestFit`](baselines::LinearBestFit), what the ring is measured against;
//! - [`balance`]: balance degree with dynamic weights (SPEC seed 000);
//! - [`node_preference`]: least-requested and most-balanced (SPEC seed 004);
//! - [`kind`]: [`PlacerKind`](kind::PlacerKind), the selectable placers by name;
//! - [`context`]: [`PlacementContext`], what a placer may know beyond the cluster.
//!
//! Dependencies run one way: every placer module uses this one (the trait, [`Decision`], the
//! shared helpers) and [`context`]; [`kind`] uses every placer; this module and [`context`] use
//! no placer. A placer's explanation of its choice is a [`PlacerNote`] variant defined here, so
//! the generic [`Decision`] names no placer's module.
//!
//! Tie rules, all deterministic:
//! - dominant dimension: the largest demand ÷ cluster total, compared exactly in integers; equal
//!   ratios go to the dimension whose name sorts first;
//! - best fit: smallest leftover in the dominant dimension, then the lowest [`AgentKey`];
//! - largest (downward phase): largest free amount in the dominant dimension, then lowest key;
//! - first fit: lowest key.

pub mod balance;
pub mod baselines;
pub mod context;
pub mod kind;
pub mod memo;
pub mod node_preference;
pub mod ring;

use compact_str::CompactString;
use std::cmp::Ordering;
use std::fmt;

use self::context::PlacementContext;
use super::{AgentEntry, AgentKey, Cluster, Resources};

/// The phase of the ring search that found the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Bucket K, the one holding the demand's amount.
    Bucket,
    /// Buckets K+1 … K+search_up, best fit in the first with a fitting agent.
    Up,
    /// From the top bucket down to K+search_up+1, the largest agent of the first with one.
    Down,
    /// The ring search's leftover pass: a demand asking for none of a spared dimension, among
    /// the agents with the least of it free ([`ring::RingSearch::spare`]).
    Leftover,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Bucket => "bucket",
            Phase::Up => "up",
            Phase::Down => "down",
            Phase::Leftover => "leftover",
        })
    }
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

/// A placer's own explanation of a decision, beyond agent, phase, bucket and dimension.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PlacerNote {
    /// Nothing more to say (every placer but balance).
    #[default]
    None,
    /// The balance placer's weights and the agent's y before and after.
    Balance(BalanceNote),
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
    pub dimension: Option<CompactString>,
    /// The placer's own explanation, if it gives one.
    pub note: PlacerNote,
}

impl Decision {
    /// A decision with only the agent (no phase, bucket, dimension or note).
    pub fn plain(agent: AgentKey) -> Self {
        Decision {
            agent,
            phase: None,
            bucket: None,
            dimension: None,
            note: PlacerNote::None,
        }
    }

    /// The balance placer's explanation, if this is its decision.
    pub fn balance(&self) -> Option<&BalanceNote> {
        match &self.note {
            PlacerNote::Balance(note) => Some(note),
            PlacerNote::None => None,
        }
    }
}

/// Picks an agent for a demand. "Fits" always means every dimension of the demand is at most the
/// agent's free amount; only agents `eligible` accepts may be chosen. An empty demand is never
/// placed (there is nothing to rank agents by).
pub trait Placer {
    /// The name used in config files and on the command line.
    fn name(&self) -> &'static str;

    /// The one entry point. `context` carries what the cluster does not: the balance settings
    /// and pending demands, the caller's score for the ring's tie-break; placers that need none
    /// of it ignore it, and [`PlacementContext::default`] means "nothing known".
    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision>;
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

/// The eligible agents that fit `demand`, in best-fit order of its dominant dimension (smallest
/// free amount there first, then lowest key). Walks that dimension's ring from the bucket holding
/// the demand upward, so agents with too little of it are not visited (except the rest of that
/// first bucket). Empty for an empty demand or one naming a dimension the cluster lacks.
pub fn fitting_agents<'a>(
    cluster: &'a Cluster,
    demand: &'a Resources,
    eligible: &'a dyn Fn(AgentKey) -> bool,
) -> impl Iterator<Item = (AgentKey, &'a AgentEntry)> + 'a {
    let walk = dominant_dimension(demand, cluster.total()).and_then(|dimension| {
        let ring = cluster.ring(dimension)?;
        let need = demand.milli(dimension);
        Some((ring, need, ring.bucket_of(need)))
    });
    walk.into_iter()
        .flat_map(|(ring, need, first)| {
            (first..ring.len()).flat_map(move |bucket| {
                ring.members(bucket)
                    .skip_while(move |(free, _)| *free < need)
                    .map(|(_, key)| key)
            })
        })
        .filter_map(move |key| {
            let agent = cluster.agent(key)?;
            (agent.free.contains(demand) && eligible(key)).then_some((key, agent))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
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

    #[test]
    fn fitting_agents_walks_the_dominant_ring_in_best_fit_order() {
        let mut cluster = Cluster::new(super::super::RingsConfig::default(), Default::default());
        for total in [
            "cpus:8;mem:1000",
            "cpus:3;mem:1000",
            "cpus:1;mem:1000",
            "cpus:5;mem:10",
            "cpus:3;mem:1000",
        ] {
            cluster.add_agent(r(total));
        }
        let demand = r("cpus:2;mem:100");
        let keys: Vec<AgentKey> = fitting_agents(&cluster, &demand, &|k| k != 4)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, [1, 0]);
        assert_eq!(fitting_agents(&cluster, &r(""), &|_| true).count(), 0);
        assert_eq!(fitting_agents(&cluster, &r("gpus:1"), &|_| true).count(), 0);
    }

    #[test]
    fn decision_balance_reads_the_note() {
        let mut d = Decision::plain(3);
        assert_eq!(d.balance(), None);
        let note = BalanceNote {
            weights: vec![0.5, 0.5],
            y_before: 0.25,
            y_after: 0.0,
        };
        d.note = PlacerNote::Balance(note.clone());
        assert_eq!(d.balance(), Some(&note));
    }
}
