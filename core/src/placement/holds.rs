//! Agents kept for a preempting framework (docs/priorities.md), and what a cycle's outcome does
//! to them: the one place the master and the dry-run apply an [`Outcome`]'s holds and end them.
//!
//! A cycle that preempts for a framework kills the victims on one agent; until the victims'
//! resources come back and the framework is placed there, the agent is kept for it: other
//! frameworks are not offered it ([`Filter::Held`](super::Filter::Held)) and the framework is
//! not allowed to preempt again elsewhere ([`UnservedReason::Waiting`](super::UnservedReason)).
//! The hold ends when the framework is granted that agent, or at its deadline — one rule,
//! [`Holds::expire`]: a hold whose `until` is not after `now` is over, whoever asks.
//!
//! Time is the caller's: the master's clock instant, the dry-run's logical milliseconds. The
//! books are indexed by agent and by framework, so no question here scans the agents.

use std::collections::{BTreeSet, HashMap};

use super::cycle::Outcome;
use super::keys::{AgentKey, FrameworkKey};

/// One kept agent: for whom, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold<Time> {
    pub framework: FrameworkKey,
    pub until: Time,
}

/// The holds in force; see the module doc.
#[derive(Clone, Debug)]
pub struct Holds<Time> {
    by_agent: HashMap<AgentKey, Hold<Time>>,
    by_framework: HashMap<FrameworkKey, BTreeSet<AgentKey>>,
}

impl<Time> Default for Holds<Time> {
    fn default() -> Self {
        Holds {
            by_agent: HashMap::new(),
            by_framework: HashMap::new(),
        }
    }
}

impl<Time: Copy + Ord> Holds<Time> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `agent` for `framework` until `until` (replacing another hold on it).
    pub fn hold(&mut self, agent: AgentKey, framework: FrameworkKey, until: Time) {
        self.release(agent);
        self.by_agent.insert(agent, Hold { framework, until });
        self.by_framework
            .entry(framework)
            .or_default()
            .insert(agent);
    }

    /// Ends the hold on `agent`, if any; returns it.
    pub fn release(&mut self, agent: AgentKey) -> Option<Hold<Time>> {
        let hold = self.by_agent.remove(&agent)?;
        if let Some(agents) = self.by_framework.get_mut(&hold.framework) {
            agents.remove(&agent);
            if agents.is_empty() {
                self.by_framework.remove(&hold.framework);
            }
        }
        Some(hold)
    }

    /// The hold on `agent` in force at `now`.
    pub fn on(&self, agent: AgentKey, now: Time) -> Option<Hold<Time>> {
        self.by_agent.get(&agent).filter(|h| h.until > now).copied()
    }

    /// Whether `agent` is kept for a framework other than `framework` at `now`.
    pub fn held_for_other(&self, agent: AgentKey, framework: FrameworkKey, now: Time) -> bool {
        self.on(agent, now)
            .is_some_and(|h| h.framework != framework)
    }

    /// An agent kept for `framework` at `now` (it waits for victims to end there), if any.
    pub fn waiting(&self, framework: FrameworkKey, now: Time) -> Option<AgentKey> {
        self.by_framework
            .get(&framework)?
            .iter()
            .copied()
            .find(|agent| self.on(*agent, now).is_some())
    }

    /// Ends every hold whose deadline is not after `now` (the one expiry rule); returns the
    /// agents given back to everyone, in key order.
    pub fn expire(&mut self, now: Time) -> Vec<AgentKey> {
        let mut over: Vec<AgentKey> = self
            .by_agent
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(agent, _)| *agent)
            .collect();
        over.sort_unstable();
        for agent in &over {
            self.release(*agent);
        }
        over
    }

    /// The earliest deadline of a hold, if any hold is kept.
    pub fn next_expiry(&self) -> Option<Time> {
        self.by_agent.values().map(|h| h.until).min()
    }

    /// Drops every hold of a framework that left.
    pub fn forget_framework(&mut self, framework: FrameworkKey) {
        for agent in self.by_framework.remove(&framework).unwrap_or_default() {
            self.by_agent.remove(&agent);
        }
    }

    pub fn len(&self) -> usize {
        self.by_agent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_agent.is_empty()
    }
}

/// Applies a cycle's outcome to the holds: each preemption keeps its agent for the preempting
/// framework until `until`; a grant of a kept agent to the framework it was kept for ends the
/// hold (the room reached it). Grants are already taken from the cluster and recorded in DRF
/// by [`run_cycle`](super::run_cycle); the victims are the caller's to end (the master kills
/// them and their resources return when the agent reports them ended; the dry-run ends them at
/// once).
pub fn apply_outcome<T, Time: Copy + Ord>(
    outcome: &Outcome<T>,
    holds: &mut Holds<Time>,
    until: Time,
) {
    for preemption in &outcome.preemptions {
        holds.hold(preemption.plan.agent, preemption.framework, until);
    }
    for grant in &outcome.grants {
        if holds
            .by_agent
            .get(&grant.agent)
            .is_some_and(|h| h.framework == grant.framework)
        {
            holds.release(grant.agent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Allocation, Decision, Preemption, PreemptionPlan, Resources};

    fn grant(framework: FrameworkKey, agent: AgentKey) -> Allocation {
        Allocation {
            framework,
            request: 0,
            agent,
            resources: Resources::new(),
            decision: Decision::plain(agent),
        }
    }

    fn preemption(framework: FrameworkKey, agent: AgentKey) -> Preemption<u32> {
        Preemption {
            framework,
            request: 0,
            priority: 30,
            plan: PreemptionPlan {
                agent,
                victims: vec![7],
            },
        }
    }

    #[test]
    fn a_preemption_keeps_its_agent_until_the_deadline_or_the_grant() {
        let mut holds: Holds<u64> = Holds::new();
        let outcome = Outcome {
            grants: vec![],
            preemptions: vec![preemption(1, 4)],
            unserved: vec![],
        };
        apply_outcome(&outcome, &mut holds, 100);
        assert!(holds.held_for_other(4, 2, 50));
        assert!(!holds.held_for_other(4, 1, 50));
        assert_eq!(holds.waiting(1, 50), Some(4));
        assert_eq!(holds.waiting(2, 50), None);
        // Another framework's grant there does not end it; the holder's does.
        let other = Outcome::<u32> {
            grants: vec![grant(2, 4)],
            preemptions: vec![],
            unserved: vec![],
        };
        apply_outcome(&other, &mut holds, 200);
        assert_eq!(holds.waiting(1, 50), Some(4));
        let own = Outcome::<u32> {
            grants: vec![grant(1, 4)],
            preemptions: vec![],
            unserved: vec![],
        };
        apply_outcome(&own, &mut holds, 200);
        assert!(holds.is_empty());
    }

    #[test]
    fn one_expiry_rule_a_hold_is_over_at_its_deadline() {
        let mut holds: Holds<u64> = Holds::new();
        holds.hold(1, 9, 100);
        holds.hold(2, 9, 150);
        // Not in force at its deadline, whether or not expire ran.
        assert!(holds.on(1, 99).is_some());
        assert!(holds.on(1, 100).is_none());
        assert_eq!(holds.next_expiry(), Some(100));
        assert_eq!(holds.expire(99), Vec::<AgentKey>::new());
        assert_eq!(holds.expire(100), vec![1]);
        assert_eq!(holds.waiting(9, 120), Some(2));
        assert_eq!(holds.expire(1_000), vec![2]);
        assert!(holds.is_empty() && holds.waiting(9, 0).is_none());
    }

    #[test]
    fn a_new_hold_replaces_the_old_and_a_gone_framework_leaves_none() {
        let mut holds: Holds<u64> = Holds::new();
        holds.hold(1, 9, 100);
        holds.hold(1, 8, 100);
        assert_eq!(holds.waiting(9, 0), None);
        assert_eq!(holds.waiting(8, 0), Some(1));
        holds.hold(2, 8, 100);
        holds.forget_framework(8);
        assert!(holds.is_empty());
        assert_eq!(holds.next_expiry(), None);
    }
}
