//! Reports the actor builds for operators: "why is this demand pending?", where the cluster's
//! resources are (used by tasks, on offer, free), and a cheap health answer.
//!
//! These read the state and never change it; `/state`, `/metrics` and `/health` ask for them
//! through the event channel like any other event.

use std::collections::HashMap;

use ringmaster_proto::resources::Resources;
use tokio::time::Instant;

use super::allocator::disk;
pub use super::ops::model::{Excluded, Health, PendingView};
use super::state::{AgentRecord, FrameworkRecord, MasterState};
use ringmaster_core::placement::feasible::{self, AgentFacts, Filter};
use ringmaster_core::placement::{task_priority, AgentKey, UnservedReason, WhyUnplaced};

/// Where the cluster's resources are, beyond the free amounts placement keeps.
pub(crate) struct Usage {
    /// Sum of outstanding offers.
    pub offered: Resources,
    /// Held by tasks: total − free − offered − withheld.
    pub used: Resources,
    /// Disk withheld from agents that reported less free than the books.
    pub withheld: Resources,
    /// Outstanding offers per agent id.
    pub offered_on: HashMap<String, Resources>,
}

/// The allocator's feasibility rules for one agent and one framework, as named filters
/// (ringmaster_core::placement::feasible), resource fit aside: the agent is connected, in the
/// framework's partition, not held for another framework after a preemption, the framework has
/// no live decline filter on it, and its devices can hold the demand's GPU request. One
/// function, so "why pending" counts exactly the agents allocation would try.
pub(crate) fn agent_feasible(
    agent: Option<&AgentRecord>,
    framework: &FrameworkRecord,
    devices_fit: bool,
    held_for_other: bool,
    now: Instant,
) -> Result<(), Filter> {
    let Some(agent) = agent else {
        return Err(Filter::Disconnected);
    };
    let facts = AgentFacts {
        connected: agent.conn.is_some(),
        partition: agent.partition(),
        held_for_other,
        declined: framework
            .filters
            .get(&agent.id)
            .is_some_and(|until| *until > now),
        devices_fit,
    };
    feasible::check(&facts, &framework.tenant.partition)
}

impl MasterState {
    pub(crate) fn cluster_usage(&self) -> Usage {
        let mut offered = Resources::new();
        let mut offered_on: HashMap<String, Resources> = HashMap::new();
        for o in self.offers.values() {
            offered.saturating_add_assign(&o.resources);
            offered_on
                .entry(o.agent.clone())
                .or_default()
                .saturating_add_assign(&o.resources);
        }
        let used = self
            .alloc
            .cluster()
            .total()
            .saturating_sub(self.alloc.cluster().free())
            .saturating_sub(&offered);
        let withheld = disk(self.alloc.withheld_total());
        let used = used.saturating_sub(&withheld);
        Usage {
            offered,
            used,
            withheld,
            offered_on,
        }
    }

    /// Demands of connected, unsuppressed frameworks not covered by outstanding offers that
    /// the last allocation run could not serve, or that no agent could hold right now.
    /// Sorted by framework id. Walks every agent once per such framework.
    pub(crate) fn pending_frameworks(&self, now: Instant) -> Vec<PendingView> {
        let mut out: Vec<PendingView> = Vec::new();
        for f in self.frameworks.values() {
            if f.conn.is_none() || f.suppressed || f.demand_count == 0 || f.demand.is_empty() {
                continue;
            }
            let count = self.uncovered(f);
            if count == 0 {
                continue;
            }
            let rules = |key: AgentKey| {
                let agent = self.alloc.agent_id(key).and_then(|id| self.agents.get(id));
                let held = self.alloc.holds().held_for_other(key, f.key, now);
                agent_feasible(
                    agent,
                    f,
                    self.alloc.devices().fits(key, &f.demand),
                    held,
                    now,
                )
            };
            let why = WhyUnplaced::explain_rules(self.alloc.cluster(), &f.demand, &rules);
            let unserved_last_run = self.unserved.contains_key(&f.key);
            let backlogged = self.backlogged(f);
            if !unserved_last_run && !backlogged && why.fitting > 0 {
                // Not tried yet (the next run is at most `allocation_interval` away).
                continue;
            }
            let excluded = why
                .excluded
                .iter()
                .map(|&(filter, agents)| Excluded {
                    filter: filter.name().to_string(),
                    agents,
                })
                .collect();
            let mut text = why.to_string();
            if backlogged {
                text = format!(
                    "not offered: {} status updates sent to the framework are not acknowledged \
                     (master.max_unacked_updates); {text}",
                    f.unacked.len()
                );
            }
            if let Some(priority) = self.priority_why(f, now) {
                text = format!("{text}; {priority}");
            }
            out.push(PendingView {
                framework: f.id.clone(),
                name: f.name.clone(),
                demand: f.demand.to_string(),
                count,
                unserved_last_run,
                why: text,
                agents: why.agents,
                short: why.short.clone(),
                not_eligible: why.not_eligible,
                fitting: why.fitting,
                excluded,
            });
        }
        out.sort_by(|a, b| a.framework.cmp(&b.framework));
        out
    }

    /// The priority side of "why pending", when priorities concern the framework (its user
    /// has a priority in its partition, or it waits for preempted tasks): e.g. `over priority
    /// quota in partition gpu: running gpus:6 of gpus:8, task needs gpus:4 → base priority;
    /// base-priority demands never preempt`. What follows the quota's verdict is the last
    /// allocation cycle's own reason ([`UnservedReason`]), not words of its own.
    fn priority_why(&self, f: &FrameworkRecord, now: Instant) -> Option<String> {
        let held = self.alloc.holds().waiting(f.key, now);
        if let Some(agent) = held.and_then(|key| self.alloc.agent_id(key)) {
            return Some(format!("{} on agent {agent}", UnservedReason::Waiting));
        }
        let config = &self.config.priorities;
        config.grant(&f.tenant.user, &f.tenant.partition)?;
        let p = task_priority(
            config,
            self.alloc.ledger(),
            &f.tenant.user,
            &f.tenant.partition,
            &f.demand,
        );
        match self.unserved.get(&f.key) {
            Some(reason) => Some(format!("{}; {reason}", p.reason)),
            // Not tried by a cycle yet: the quota's verdict alone.
            None => Some(p.reason),
        }
    }

    pub(crate) fn health(&self, now: Instant) -> Health {
        Health {
            status: "ok".into(),
            agents_connected: self.agents.values().filter(|a| a.conn.is_some()).count(),
            frameworks_connected: self
                .frameworks
                .values()
                .filter(|f| f.conn.is_some())
                .count(),
            uptime_secs: now.duration_since(self.started).as_secs_f64(),
        }
    }
}
