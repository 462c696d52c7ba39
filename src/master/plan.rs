//! `ringmaster job plan`: where a job's instances would go now, or why they cannot be placed,
//! with nothing launched. The master's own placer runs on a copy of its cluster, one instance
//! after another (each takes its resources on the copy), with the allocation step's agent
//! rules (`feasible::check`, as the cycle and batches ask it: connected, in the job's
//! partition, not held for a preempting framework, devices that fit) and the jobs framework's
//! placement rules (the job's attribute constraints, `distinct_hosts`: the same matching as
//! the jobs framework's, `crate::jobs::constraints`); the first instance that fits nowhere
//! is explained like a pending demand ("why pending"), or by the constraints that no agent
//! satisfies.

use std::collections::HashSet;

use ringmaster_core::placement::feasible;
use ringmaster_core::placement::{AgentKey, Filter, WhyUnplaced};
use ringmaster_proto::resources::Resources;
use tokio::time::Instant;

use super::state::MasterState;
use crate::jobs::constraints::{AgentFacts, Matcher};
/// The question and answer of a plan: the jobs framework's types (`job plan` renders it).
pub use crate::jobs::plan::{Placement, Plan};

impl MasterState {
    /// Places `count` instances of `demand` on a copy of the cluster (see the module docs).
    pub(crate) fn plan(
        &self,
        demand: &Resources,
        count: u32,
        placement: &Placement,
        now: Instant,
    ) -> Plan {
        let mut cluster = self.alloc.cluster().clone();
        let matcher = Matcher::new(&placement.constraints);
        // The agents the allocation step would offer the partition's framework: the cycle's
        // own rules (`feasible::check`), devices first asked of the cluster's books. A live hold
        // keeps an agent for a preempting framework, which the plan's instances are not.
        let in_partition = |key: AgentKey| -> Result<&super::state::AgentRecord, Filter> {
            let agent = self.alloc.agent_id(key).and_then(|id| self.agents.get(id));
            let Some(agent) = agent else {
                return Err(Filter::Disconnected);
            };
            let facts = feasible::AgentFacts {
                connected: agent.conn.is_some(),
                partition: agent.partition(),
                held_for_other: self.alloc.holds().on(key, now).is_some(),
                declined: false,
                devices_fit: self.alloc.devices().fits(key, demand),
            };
            feasible::check(&facts, &placement.partition)?;
            Ok(agent)
        };
        let facts = |agent: &super::state::AgentRecord| {
            matcher.matches(&AgentFacts {
                hostname: &agent.hostname,
                attributes: &agent.attributes,
            })
        };
        let mut taken: HashSet<AgentKey> = HashSet::new();
        let mut placed = Vec::new();
        for done in 0..count {
            let rules = |key: AgentKey| -> Result<(), Filter> {
                let agent = in_partition(key)?;
                // Not a master rule: counted as not eligible.
                if !facts(agent) || taken.contains(&key) {
                    return Err(Filter::Held);
                }
                Ok(())
            };
            let decision = cluster.place(demand, &|key| rules(key).is_ok());
            let Some(key) = decision.map(|d| d.agent) else {
                let why = self.why_unplaced(&cluster, demand, &matcher, &taken, &rules);
                return Plan {
                    placed,
                    unplaced: count - done,
                    why: Some(why),
                };
            };
            if cluster.take(key, demand).is_err() {
                break;
            }
            if matcher.distinct_hosts() {
                taken.insert(key);
            }
            placed.push(self.alloc.agent_id(key).unwrap_or("?").to_string());
        }
        Plan {
            placed,
            unplaced: 0,
            why: None,
        }
    }

    /// Why no agent takes the next instance: no agent of the partition satisfies the
    /// constraints (naming the one none satisfies), each that does already holds an instance
    /// (`distinct_hosts`), or the allocation step's account.
    fn why_unplaced(
        &self,
        cluster: &ringmaster_core::placement::Cluster,
        demand: &Resources,
        matcher: &Matcher<'_>,
        taken: &HashSet<AgentKey>,
        rules: &dyn Fn(AgentKey) -> Result<(), Filter>,
    ) -> String {
        let mut members: Vec<(AgentKey, &super::state::AgentRecord)> = Vec::new();
        for (key, _) in cluster.agents() {
            let agent = self.alloc.agent_id(key).and_then(|id| self.agents.get(id));
            if let Some(agent) = agent.filter(|a| a.conn.is_some()) {
                members.push((key, agent));
            }
        }
        let in_partition: Vec<(AgentKey, AgentFacts<'_>)> = members
            .iter()
            .filter(|(key, _)| {
                !matches!(rules(*key), Err(Filter::Disconnected | Filter::Partition))
            })
            .map(|(key, a)| {
                (
                    *key,
                    AgentFacts {
                        hostname: &a.hostname,
                        attributes: &a.attributes,
                    },
                )
            })
            .collect();
        if let Some(why) = matcher.why_none(in_partition.iter().map(|(_, f)| *f)) {
            return why;
        }
        if matcher.distinct_hosts()
            && in_partition
                .iter()
                .filter(|(_, f)| matcher.matches(f))
                .all(|(key, _)| taken.contains(key))
        {
            return "distinct_hosts: every agent that satisfies the constraints has an instance"
                .into();
        }
        WhyUnplaced::explain_rules(cluster, demand, rules).to_string()
    }
}
