//! Feasibility as named filters: which rule keeps a framework's demand off an agent.
//!
//! Each rule is a small function returning `Err(Filter)` naming itself, in the spirit of
//! Nomad's `FilterNode` reasons and kube-scheduler's per-plugin reasons. The caller (the master,
//! the dry-run) supplies per-agent facts as plain data ([`AgentFacts`]) and gets one verdict with
//! [`check`]; placement calls that verdict only for the agents the placer looks at, so the hot
//! path never walks all agents. Only "why pending" counts, per rule, how many agents each one
//! excluded ([`WhyUnplaced::explain_rules`]).
//!
//! Rules apply in [`Filter`] order and an agent is counted against the first one it fails.
//! Resource fit is the cluster's own check (the cluster keeps free amounts), slotted in at its
//! place in that order by [`WhyUnplaced::explain_rules`].
//!
//! There is no attribute-constraint rule: the master matches no attributes beyond the
//! `partition` one ([`Filter::Partition`]).

use std::fmt;

use super::Resources;
#[cfg(doc)]
use super::WhyUnplaced;

/// A rule that excluded an agent, in the order rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Filter {
    /// The agent is not connected (its offers would go nowhere).
    Disconnected,
    /// The agent is in another partition than the framework.
    Partition,
    /// The agent is kept for another framework whose preemption freed it.
    Held,
    /// The framework declined an offer of the agent and its refuse filter is still live.
    Declined,
    /// The agent has less of some dimension free than the demand.
    Resources,
    /// No GPU device of the agent can hold the demand's GPU request.
    Devices,
}

impl Filter {
    /// Every filter, in the order they apply.
    pub const ALL: [Filter; 6] = [
        Filter::Disconnected,
        Filter::Partition,
        Filter::Held,
        Filter::Declined,
        Filter::Resources,
        Filter::Devices,
    ];

    /// The filter's name in JSON and logs.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Disconnected => "disconnected",
            Filter::Partition => "partition",
            Filter::Held => "held",
            Filter::Declined => "declined",
            Filter::Resources => "resources",
            Filter::Devices => "devices",
        }
    }

    /// What the filter means, for people.
    pub fn reason(self) -> &'static str {
        match self {
            Filter::Disconnected => "agent not connected",
            Filter::Partition => "agent in another partition",
            Filter::Held => "agent held for a preempting framework",
            Filter::Declined => "agent declined by the framework (refuse filter live)",
            Filter::Resources => "not enough free resources",
            Filter::Devices => "no GPU device can hold the demand",
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the caller knows about one agent, as seen by one framework.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentFacts<'a> {
    pub connected: bool,
    /// The agent's partition.
    pub partition: &'a str,
    /// A live hold for a framework other than the asking one.
    pub held_for_other: bool,
    /// The asking framework's live decline filter on this agent.
    pub declined: bool,
    /// Whether the agent's devices can hold the demand's GPU request (true without one).
    pub devices_fit: bool,
}

impl Default for AgentFacts<'_> {
    /// A connected agent of the default partition with nothing against it.
    fn default() -> Self {
        AgentFacts {
            connected: true,
            partition: super::DEFAULT_PARTITION,
            held_for_other: false,
            declined: false,
            devices_fit: true,
        }
    }
}

/// [`Filter::Disconnected`].
pub fn connected(facts: &AgentFacts) -> Result<(), Filter> {
    facts.connected.then_some(()).ok_or(Filter::Disconnected)
}

/// [`Filter::Partition`]: the agent's partition is the framework's.
pub fn same_partition(facts: &AgentFacts, framework_partition: &str) -> Result<(), Filter> {
    (facts.partition == framework_partition)
        .then_some(())
        .ok_or(Filter::Partition)
}

/// [`Filter::Held`].
pub fn not_held(facts: &AgentFacts) -> Result<(), Filter> {
    (!facts.held_for_other).then_some(()).ok_or(Filter::Held)
}

/// [`Filter::Declined`].
pub fn not_declined(facts: &AgentFacts) -> Result<(), Filter> {
    (!facts.declined).then_some(()).ok_or(Filter::Declined)
}

/// [`Filter::Resources`]: the agent's free resources contain the demand.
pub fn resources_fit(free: &Resources, demand: &Resources) -> Result<(), Filter> {
    free.contains(demand).then_some(()).ok_or(Filter::Resources)
}

/// [`Filter::Devices`].
pub fn devices_fit(facts: &AgentFacts) -> Result<(), Filter> {
    facts.devices_fit.then_some(()).ok_or(Filter::Devices)
}

/// Every rule but resource fit (which placement checks itself), in [`Filter`] order: the
/// eligibility verdict placement asks for each agent it considers.
pub fn check(facts: &AgentFacts, framework_partition: &str) -> Result<(), Filter> {
    connected(facts)?;
    same_partition(facts, framework_partition)?;
    not_held(facts)?;
    not_declined(facts)?;
    devices_fit(facts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{AgentKey, Cluster, PlacerKind, RingsConfig, WhyUnplaced};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// Each rule alone, and the first failing rule when several fail.
    #[test]
    fn each_filter_names_itself() {
        let ok = AgentFacts::default();
        let cases: [(AgentFacts, &str, Result<(), Filter>); 8] = [
            (ok, "default", Ok(())),
            (
                AgentFacts {
                    connected: false,
                    ..ok
                },
                "default",
                Err(Filter::Disconnected),
            ),
            (ok, "gpu", Err(Filter::Partition)),
            (
                AgentFacts {
                    held_for_other: true,
                    ..ok
                },
                "default",
                Err(Filter::Held),
            ),
            (
                AgentFacts {
                    declined: true,
                    ..ok
                },
                "default",
                Err(Filter::Declined),
            ),
            (
                AgentFacts {
                    devices_fit: false,
                    ..ok
                },
                "default",
                Err(Filter::Devices),
            ),
            // Several fail: the first in Filter order is named.
            (
                AgentFacts {
                    connected: false,
                    declined: true,
                    ..ok
                },
                "gpu",
                Err(Filter::Disconnected),
            ),
            (
                AgentFacts {
                    held_for_other: true,
                    declined: true,
                    devices_fit: false,
                    ..ok
                },
                "default",
                Err(Filter::Held),
            ),
        ];
        for (facts, partition, want) in cases {
            assert_eq!(check(&facts, partition), want, "{facts:?} {partition}");
        }
        assert_eq!(resources_fit(&r("cpus:2;mem:10"), &r("cpus:2")), Ok(()));
        assert_eq!(
            resources_fit(&r("cpus:1;mem:10"), &r("cpus:2")),
            Err(Filter::Resources)
        );
        let names: Vec<&str> = Filter::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(
            names,
            [
                "disconnected",
                "partition",
                "held",
                "declined",
                "resources",
                "devices"
            ]
        );
    }

    /// Counting per rule: resource fit sits between the agent facts and the device fit.
    #[test]
    fn counts_first_failing_rule_per_agent() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::FirstFit);
        // (free, facts) per agent.
        let agents = [
            (
                "cpus:1",
                AgentFacts {
                    connected: false,
                    ..AgentFacts::default()
                },
            ),
            (
                "cpus:8",
                AgentFacts {
                    partition: "gpu",
                    ..AgentFacts::default()
                },
            ),
            (
                "cpus:8",
                AgentFacts {
                    held_for_other: true,
                    ..AgentFacts::default()
                },
            ),
            (
                "cpus:8",
                AgentFacts {
                    declined: true,
                    ..AgentFacts::default()
                },
            ),
            (
                "cpus:1",
                AgentFacts {
                    devices_fit: false,
                    ..AgentFacts::default()
                },
            ),
            ("cpus:1", AgentFacts::default()),
            (
                "cpus:8",
                AgentFacts {
                    devices_fit: false,
                    ..AgentFacts::default()
                },
            ),
            ("cpus:8", AgentFacts::default()),
            ("cpus:4", AgentFacts::default()),
        ];
        let keys: Vec<AgentKey> = agents
            .iter()
            .map(|(t, _)| cluster.add_agent(r(t)))
            .collect();
        let rules = |key: AgentKey| {
            let i = keys.iter().position(|k| *k == key).unwrap();
            check(&agents[i].1, "default")
        };
        let got = WhyUnplaced::explain_rules(&cluster, &r("cpus:4"), &rules);
        assert_eq!(
            got.excluded,
            [
                (Filter::Disconnected, 1),
                (Filter::Partition, 1),
                (Filter::Held, 1),
                (Filter::Declined, 1),
                // The short agent without device fit counts as short: resources come first.
                (Filter::Resources, 2),
                (Filter::Devices, 1),
            ]
        );
        // The yes/no view agrees: 2 feasible; 4 fit but fail a rule (partition, held,
        // declined, devices); 3 are short of cpus (the disconnected one among them).
        assert_eq!((got.fitting, got.not_eligible), (2, 4));
        assert_eq!(got.short, [("cpus".to_string(), 3)]);
        assert_eq!(got.to_string(), "2 eligible agents fit cpus:4");
        let none = WhyUnplaced::explain_rules(&cluster, &r("cpus:1"), &|_| Ok(()));
        assert_eq!((none.excluded.clone(), none.fitting), (vec![], 9));
    }
}
