//! One allocation cycle, as the master runs it and the dry-run replays it.
//!
//! Priority tiers, highest first → DRF order within each tier ([`super::allocate_in`]) → feasibility
//! (the caller's [`Filter`] verdict per agent) → place → preempt ([`plan_preemption`]) → an
//! [`Outcome`]: the grants, the preemptions to carry out, and every demand left unserved with
//! its reason. With the callers' [`Quotas`], a copy's tier is the priority it runs at when it is
//! served (the copies served before it in the cycle count against its user's quota), so a copy
//! whose priority dropped is served with its lower tier, never ahead of a higher demand that
//! would then preempt it.
//!
//! Preemption comes after every tier was served: each unserved demand above the base priority,
//! highest tier first and in request order within a tier, may evict strictly lower-priority
//! tasks on one agent. An agent is claimed by at most one plan per cycle, a framework gets at
//! most one plan per cycle, and a framework already waiting for preempted tasks to end (a live
//! hold) does not preempt again. The preemptor is not placed in this cycle: its victims must
//! end first; the caller keeps the agent for it (a hold, which [`Filter::Held`] reports to
//! others) and the next cycle places it there.
//!
//! Pure like the rest of the crate: agent facts, holds and running tasks come in as closures.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashSet};
use std::fmt;

use smallvec::SmallVec;

use super::allocation::{allocate_pending, Allocation, Grant, HasRequest, Hooks, Request};
use super::feasible::Filter;
use super::priority::{
    copies_at_user_priority, plan_preemption_with, DeviceCheck, PreemptionPlan, Priority,
    PriorityConfig, QuotaLedger, RunningTask,
};
use super::{AgentKey, Cluster, DrfSorter, FrameworkKey, PlacementContext, Resources};

/// What a cycle needs besides the cluster, the DRF sorter and the requests.
pub struct CycleInput<'a, T> {
    /// The base priority: demands at or below it never preempt.
    pub base: Priority,
    /// Whole-agent offers (the master) or exactly the demand (the dry-run).
    pub grant: Grant,
    /// May `framework` be given `agent`? Every rule but resource fit, first failing rule named
    /// (see [`super::feasible`]). Asked only for agents the placer or the preemption planner
    /// looks at.
    pub feasible: &'a dyn Fn(FrameworkKey, AgentKey) -> Result<(), Filter>,
    /// The framework waits for preempted tasks to end on some agent (a live hold).
    pub waiting: &'a dyn Fn(FrameworkKey) -> bool,
    /// The running tasks preemption may evict; called at most once per cycle, and only when an
    /// unserved demand above base may preempt.
    pub running: &'a dyn Fn() -> Vec<RunningTask<T>>,
    /// Does a demand fit an agent's devices once these victims' device bindings are released?
    /// Preemption plans are checked per device with it (summed GPU counters cannot tell two
    /// half-used GPUs from a free one); a caller without devices passes
    /// [`super::priority::no_devices`].
    pub devices: DeviceCheck<'a, T>,
    /// The priority quotas, for a caller that has them ([`Quotas`]); `None` keeps each
    /// request at the priority it came with.
    pub quotas: Option<Quotas<'a>>,
}

/// The priority quotas of a cycle's requests: with them, each copy is served at the priority
/// it runs at when it is served (SPEC seed 003), counting the copies served before it in this
/// cycle against its user's quota, not at the priority its request had when the cycle began.
pub struct Quotas<'a> {
    pub config: &'a PriorityConfig,
    /// What runs at user priority when the cycle begins.
    pub ledger: &'a QuotaLedger,
    /// Each request's (user, partition), by index in the cycle's requests (a request beyond
    /// the list has no priority: base).
    pub owners: &'a [(String, String)],
}

/// A request and the priority its next task would run at (its tier).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredRequest {
    pub request: Request,
    pub priority: Priority,
}

impl HasRequest for TieredRequest {
    fn request(&self) -> &Request {
        &self.request
    }
    fn request_mut(&mut self) -> &mut Request {
        &mut self.request
    }
}

/// Evict `plan.victims` so that `framework`'s demand at `priority` fits `plan.agent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption<T> {
    pub framework: FrameworkKey,
    /// Index of the preempting request in the cycle's requests.
    pub request: usize,
    pub priority: Priority,
    pub plan: PreemptionPlan<T>,
}

/// Why a demand is still (partly) unserved after the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnservedReason {
    /// At or below the base priority: it waits for room and never preempts.
    AtBase,
    /// Above base, but no agent has enough strictly lower-priority tasks to evict.
    NoVictims,
    /// An agent fits it but the placer declined this cycle (e.g. balance would not improve).
    Declined,
    /// Its framework already waits for preempted tasks to end (a live hold, or a plan for
    /// another of its requests in this cycle).
    Waiting,
    /// This cycle's preemption frees `agent` for it; the next cycle places it there.
    Preempting { agent: AgentKey },
}

impl fmt::Display for UnservedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnservedReason::AtBase => f.write_str("base-priority demands never preempt"),
            UnservedReason::NoVictims => f.write_str("no lower-priority victims on any agent"),
            UnservedReason::Declined => f.write_str("the placer declined every fitting agent"),
            UnservedReason::Waiting => f.write_str("waiting for preempted tasks to end"),
            UnservedReason::Preempting { .. } => {
                f.write_str("preempting lower-priority tasks to make room")
            }
        }
    }
}

/// A request with copies left after the cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unserved {
    /// Index in the cycle's requests.
    pub request: usize,
    pub framework: FrameworkKey,
    pub demand: Resources,
    /// Copies not served.
    pub count: u32,
    pub priority: Priority,
    pub reason: UnservedReason,
}

/// What one cycle decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome<T> {
    /// In the order they were made: tiers highest first, DRF order within a tier. Each is
    /// already taken from the cluster and recorded in the DRF sorter; `request` indexes the
    /// cycle's requests.
    pub grants: Vec<Allocation>,
    /// For the caller to carry out (kill the victims, keep the agent for the framework).
    pub preemptions: Vec<Preemption<T>>,
    /// In request order.
    pub unserved: Vec<Unserved>,
}

/// Runs one cycle over `requests`; their counts are lowered by what is served. See the module
/// doc.
pub fn run_cycle<T: Clone>(
    cluster: &mut Cluster,
    drf: &mut DrfSorter,
    requests: &mut [TieredRequest],
    input: &CycleInput<T>,
    context: &mut PlacementContext,
) -> Outcome<T> {
    let eligible = |fw: FrameworkKey, agent: AgentKey| (input.feasible)(fw, agent).is_ok();
    // Every tier's demands are pending while any tier is served: a lower tier's demand that
    // fits no agent blocks its dimension for the balance weights too (SPEC seed 000).
    let tracked = match cluster.placer().reads_pending() {
        true => &requests[..],
        false => &[][..],
    };
    context.set_pending(
        tracked
            .iter()
            .filter(|r| r.request.count > 0)
            .map(|r| (&r.request.demand, u64::from(r.request.count))),
    );
    // With quotas, what the copies served so far this cycle hold at user priority.
    let ledger = input
        .quotas
        .as_ref()
        .map(|q| RefCell::new(q.ledger.clone()));
    let at_user = |i: usize, demand: &Resources, copies: u64| -> u64 {
        match (&input.quotas, &ledger) {
            (Some(q), Some(ledger)) => match q.owners.get(i) {
                Some((user, partition)) => copies_at_user_priority(
                    q.config,
                    &ledger.borrow(),
                    user,
                    partition,
                    demand,
                    copies,
                ),
                None => 0,
            },
            _ => copies,
        }
    };
    // The priority request `i`'s next copy runs at now.
    let now = |i: usize, demand: &Resources| -> Option<Priority> {
        let q = input.quotas.as_ref()?;
        let grant = q
            .owners
            .get(i)
            .and_then(|(user, partition)| q.config.grant(user, partition));
        match (grant, at_user(i, demand, 1)) {
            (Some(grant), 1) => Some(grant.priority),
            _ => Some(q.config.base()),
        }
    };
    // Tiers highest first; each served in DRF order. With quotas, a tier is what the requests'
    // next copies run at when the tier begins, and a copy whose priority has dropped since
    // (the copies served before it used up its user's quota) waits for its lower tier: a
    // request is never placed in a step where a higher one then preempts it.
    let mut grants = Vec::new();
    let mut below: Option<Priority> = None;
    loop {
        if input.quotas.is_some() {
            for (i, r) in requests.iter_mut().enumerate() {
                if r.request.count > 0 {
                    r.priority = now(i, &r.request.demand).unwrap_or(r.priority);
                }
            }
        }
        let tier = requests
            .iter()
            .filter(|r| r.request.count > 0 && below.is_none_or(|b| r.priority < b))
            .map(|r| r.priority)
            .max();
        let Some(tier) = tier else {
            break;
        };
        below = Some(tier);
        let serve: SmallVec<[usize; 8]> = (0..requests.len())
            .filter(|&i| requests[i].request.count > 0 && requests[i].priority == tier)
            .collect();
        let admit = |i: usize, demand: &Resources| now(i, demand).is_none_or(|p| p >= tier);
        let mut granted = |i: usize, demand: &Resources, copies: u32| {
            let (Some(q), Some(ledger)) = (&input.quotas, &ledger) else {
                return;
            };
            let n = at_user(i, demand, u64::from(copies));
            if let (true, Some((user, partition))) = (n > 0, q.owners.get(i)) {
                let held = Resources::from_milli(
                    demand.iter().map(|(name, m)| (name, m.saturating_mul(n))),
                )
                .unwrap_or_default();
                ledger.borrow_mut().start(user, partition, &held);
            }
        };
        let mut hooks = match input.quotas {
            Some(_) => Hooks {
                admit: Some(&admit),
                granted: Some(&mut granted),
            },
            None => Hooks::none(),
        };
        let served = allocate_pending(
            cluster,
            drf,
            requests,
            Some(&serve),
            input.grant,
            &eligible,
            context,
            &mut hooks,
        );
        match grants.is_empty() {
            true => grants = served,
            false => grants.extend(served),
        }
    }
    // The requests with copies left, highest priority (as they end the cycle) first and in
    // request order within a priority (a stable sort), and the tiers as (priority, start,
    // end) runs of that order.
    let mut order: SmallVec<[usize; 8]> = (0..requests.len())
        .filter(|&i| requests[i].request.count > 0)
        .collect();
    order.sort_by_key(|&i| Reverse(requests[i].priority));
    let mut tiers: SmallVec<[(Priority, usize, usize); 4]> = SmallVec::new();
    for (at, &i) in order.iter().enumerate() {
        let priority = requests[i].priority;
        match tiers.last_mut() {
            Some(tier) if tier.0 == priority => tier.2 = at + 1,
            _ => tiers.push((priority, at, at + 1)),
        }
    }
    // Every request served (the common case): nothing to preempt for or explain.
    if order.is_empty() {
        return Outcome {
            grants,
            preemptions: Vec::new(),
            unserved: Vec::new(),
        };
    }
    // Preemption, highest tier first, in request order within a tier.
    let mut running: Option<Vec<RunningTask<T>>> = None;
    let mut claimed: HashSet<AgentKey> = HashSet::new();
    let mut planned: HashSet<FrameworkKey> = HashSet::new();
    let mut preemptions = Vec::new();
    let mut reasons: BTreeMap<usize, UnservedReason> = BTreeMap::new();
    for &(priority, start, end) in &tiers {
        for &i in &order[start..end] {
            let r = &requests[i].request;
            if r.count == 0 {
                continue;
            }
            let fw = r.framework;
            let reason = if priority <= input.base {
                UnservedReason::AtBase
            } else if planned.contains(&fw) || (input.waiting)(fw) {
                UnservedReason::Waiting
            } else {
                let running = running.get_or_insert_with(|| (input.running)());
                // The device rule is the plan's own check, with the victims' devices released.
                let may_preempt_on = |agent: AgentKey| {
                    !claimed.contains(&agent)
                        && matches!((input.feasible)(fw, agent), Ok(()) | Err(Filter::Devices))
                };
                let plan = plan_preemption_with(
                    cluster,
                    &r.demand,
                    priority,
                    running,
                    &may_preempt_on,
                    input.devices,
                );
                match plan {
                    Some(plan) if !plan.victims.is_empty() => {
                        claimed.insert(plan.agent);
                        planned.insert(fw);
                        let agent = plan.agent;
                        preemptions.push(Preemption {
                            framework: fw,
                            request: i,
                            priority,
                            plan,
                        });
                        UnservedReason::Preempting { agent }
                    }
                    Some(_) => UnservedReason::Declined,
                    None => UnservedReason::NoVictims,
                }
            };
            reasons.insert(i, reason);
        }
    }
    let unserved = reasons
        .into_iter()
        .map(|(i, reason)| {
            let r = &requests[i];
            Unserved {
                request: i,
                framework: r.request.framework,
                demand: r.request.demand.clone(),
                count: r.request.count,
                priority: r.priority,
                reason,
            }
        })
        .collect();
    Outcome {
        grants,
        preemptions,
        unserved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{no_devices, PlacerKind, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    fn req(framework: FrameworkKey, demand: &str, count: u32, priority: Priority) -> TieredRequest {
        TieredRequest {
            request: Request {
                framework,
                demand: r(demand),
                count,
            },
            priority,
        }
    }

    fn task(
        id: &'static str,
        agent: AgentKey,
        priority: Priority,
        res: &str,
    ) -> RunningTask<&'static str> {
        RunningTask {
            id,
            agent,
            priority,
            started: 1,
            resources: r(res),
        }
    }

    struct Setup {
        cluster: Cluster,
        drf: DrfSorter,
        agents: Vec<AgentKey>,
    }

    /// Agents with these (total, taken) and frameworks 1..=n of weight 1.
    fn setup(agents: &[(&str, &str)], frameworks: usize) -> Setup {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::FirstFit);
        let agents = agents
            .iter()
            .map(|(total, taken)| {
                let k = cluster.add_agent(r(total));
                if !taken.is_empty() {
                    cluster.take(k, &r(taken)).unwrap();
                }
                k
            })
            .collect();
        let mut drf = DrfSorter::new();
        for fw in 1..=frameworks {
            drf.add(fw, 1.0);
        }
        Setup {
            cluster,
            drf,
            agents,
        }
    }

    fn run(
        s: &mut Setup,
        requests: &mut [TieredRequest],
        running: &[RunningTask<&'static str>],
        feasible: &dyn Fn(FrameworkKey, AgentKey) -> Result<(), Filter>,
        waiting: &dyn Fn(FrameworkKey) -> bool,
    ) -> Outcome<&'static str> {
        let running = running.to_vec();
        let input = CycleInput {
            base: 0,
            grant: Grant::Demand,
            feasible,
            waiting,
            running: &|| running.clone(),
            devices: &no_devices,
            quotas: None,
        };
        let mut context = PlacementContext::default();
        run_cycle(&mut s.cluster, &mut s.drf, requests, &input, &mut context)
    }

    /// The higher tier is served first even though DRF alone would pick the other framework
    /// (framework 1 already holds a large share); within a tier DRF orders.
    #[test]
    fn tiers_before_drf() {
        // Cases: (priorities of framework 1's and 2's requests, expected grant order).
        let cases: [((Priority, Priority), [FrameworkKey; 3]); 3] = [
            ((5, 0), [1, 1, 2]),
            ((0, 5), [2, 2, 1]),
            // One tier: DRF picks 2 (no share) first, then alternates by share.
            ((0, 0), [2, 1, 2]),
        ];
        for ((p1, p2), want) in cases {
            let mut s = setup(&[("cpus:3", "")], 2);
            s.drf.allocated(1, &r("cpus:1"));
            let mut requests = [req(1, "cpus:1", 2, p1), req(2, "cpus:1", 2, p2)];
            let out = run(&mut s, &mut requests, &[], &|_, _| Ok(()), &|_| false);
            let order: Vec<FrameworkKey> = out.grants.iter().map(|g| g.framework).collect();
            assert_eq!(order, want, "priorities {p1}, {p2}");
            let served: Vec<usize> = out.grants.iter().map(|g| g.request).collect();
            assert_eq!(
                served,
                want.iter().map(|f| f - 1).collect::<Vec<_>>(),
                "grants name their request"
            );
            assert!(out.preemptions.is_empty());
            assert_eq!(out.unserved.len(), 1);
            assert_eq!(out.unserved[0].count, 1);
        }
    }

    /// Only demands above base preempt, and only strictly lower-priority tasks; the reasons say
    /// why the others wait.
    #[test]
    fn preemption_only_above_base_with_reasons() {
        // One full agent running a base task; (request priority, expected reason, victims).
        let cases: [(Priority, UnservedReason, Vec<&str>); 3] = [
            (0, UnservedReason::AtBase, vec![]),
            (-3, UnservedReason::AtBase, vec![]),
            (5, UnservedReason::Preempting { agent: 0 }, vec!["low"]),
        ];
        for (priority, reason, victims) in cases {
            let mut s = setup(&[("cpus:4", "cpus:4")], 1);
            let mut requests = [req(1, "cpus:2", 1, priority)];
            let running = [task("low", s.agents[0], -5, "cpus:4")];
            let out = run(&mut s, &mut requests, &running, &|_, _| Ok(()), &|_| false);
            assert!(out.grants.is_empty());
            assert_eq!(out.unserved.len(), 1);
            assert_eq!(out.unserved[0].reason, reason, "priority {priority}");
            let got: Vec<&str> = out
                .preemptions
                .iter()
                .flat_map(|p| p.plan.victims.clone())
                .collect();
            assert_eq!(got, victims);
        }
        // Equal priority is no victim: above base but nothing to evict.
        let mut s = setup(&[("cpus:4", "cpus:4")], 1);
        let mut requests = [req(1, "cpus:2", 1, 5)];
        let running = [task("peer", s.agents[0], 5, "cpus:4")];
        let out = run(&mut s, &mut requests, &running, &|_, _| Ok(()), &|_| false);
        assert_eq!(out.unserved[0].reason, UnservedReason::NoVictims);
        assert!(out.preemptions.is_empty());
        // A framework already waiting on a hold does not preempt again.
        let running = [task("low", s.agents[0], 0, "cpus:4")];
        let out = run(&mut s, &mut requests, &running, &|_, _| Ok(()), &|fw| {
            fw == 1
        });
        assert_eq!(out.unserved[0].reason, UnservedReason::Waiting);
        assert!(out.preemptions.is_empty());
    }

    /// Two preemptors, two full agents: each plan claims its own agent, the higher tier first;
    /// a third preemptor finds both claimed. A framework gets one plan per cycle.
    #[test]
    fn one_claimed_agent_per_plan() {
        let mut s = setup(&[("cpus:4", "cpus:4"), ("cpus:4", "cpus:4")], 4);
        let (a, b) = (s.agents[0], s.agents[1]);
        let running = [task("a-low", a, 0, "cpus:4"), task("b-low", b, 1, "cpus:4")];
        let mut requests = [
            req(1, "cpus:4", 1, 5),
            req(2, "cpus:4", 1, 9),
            req(3, "cpus:4", 1, 5),
            req(4, "cpus:1", 1, 7),
            req(4, "cpus:1", 1, 7),
        ];
        let out = run(&mut s, &mut requests, &running, &|_, _| Ok(()), &|_| false);
        let plans: Vec<(FrameworkKey, usize, AgentKey, Vec<&str>)> = out
            .preemptions
            .iter()
            .map(|p| (p.framework, p.request, p.plan.agent, p.plan.victims.clone()))
            .collect();
        // Framework 2 (p9) first: the cheapest victim set is a's p0 task. Framework 4 (p7)
        // then gets b. Frameworks 1 and 3 (p5) find both agents claimed.
        assert_eq!(plans, [(2, 1, a, vec!["a-low"]), (4, 3, b, vec!["b-low"]),]);
        let reasons: Vec<(usize, UnservedReason)> =
            out.unserved.iter().map(|u| (u.request, u.reason)).collect();
        assert_eq!(
            reasons,
            [
                (0, UnservedReason::NoVictims),
                (1, UnservedReason::Preempting { agent: a }),
                (2, UnservedReason::NoVictims),
                (3, UnservedReason::Preempting { agent: b }),
                (4, UnservedReason::Waiting),
            ]
        );
    }

    /// A higher tier's demand that fits no agent stays pending while the lower tiers are
    /// served: the balance weights a lower tier's placement sees count it as blocked.
    #[test]
    fn blocked_demands_of_every_tier_weigh_on_balance() {
        let mut s = setup(&[], 2);
        s.cluster = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        s.cluster.add_agent(r("cpus:4;mem:4000"));
        let mut requests = [
            req(1, "cpus:8;mem:100", 1, 5),
            req(2, "cpus:1;mem:100", 1, 0),
        ];
        let out = run(&mut s, &mut requests, &[], &|_, _| Ok(()), &|_| false);
        assert_eq!(out.grants.len(), 1);
        // (cpus, mem): w0 (1/2, 1/2), w1 of r = (1, 0): (3/4, 1/4), w2 (1/2, 1/2).
        let weights: Vec<f64> = out.grants[0]
            .decision
            .balance()
            .unwrap()
            .weights
            .iter()
            .map(|w| (w * 1e4).round() / 1e4)
            .collect();
        assert_eq!(weights, [0.5833, 0.4167]);
    }

    /// Infeasible agents are neither placed on nor preempted on.
    #[test]
    fn feasibility_applies_to_placement_and_preemption() {
        let mut s = setup(&[("cpus:4", ""), ("cpus:4", "cpus:4")], 1);
        let (a, b) = (s.agents[0], s.agents[1]);
        let running = [task("b-low", b, 0, "cpus:4")];
        let only_b = move |_: FrameworkKey, k: AgentKey| {
            if k == a {
                Err(Filter::Partition)
            } else {
                Ok(())
            }
        };
        let mut requests = [req(1, "cpus:4", 1, 5)];
        let out = run(&mut s, &mut requests, &running, &only_b, &|_| false);
        assert!(out.grants.is_empty());
        assert_eq!(out.preemptions.len(), 1);
        assert_eq!(out.preemptions[0].plan.agent, b);
        let none = |_: FrameworkKey, _: AgentKey| Err(Filter::Held);
        let out = run(&mut s, &mut requests, &running, &none, &|_| false);
        assert!(out.preemptions.is_empty());
        assert_eq!(out.unserved[0].reason, UnservedReason::NoVictims);
        // Feasible and free: placed, nothing unserved, the running list never asked for.
        let input = CycleInput::<&str> {
            base: 0,
            grant: Grant::Demand,
            feasible: &|_, _| Ok(()),
            waiting: &|_| false,
            running: &|| panic!("no preemption needed"),
            devices: &no_devices,
            quotas: None,
        };
        let out = run_cycle(
            &mut s.cluster,
            &mut s.drf,
            &mut requests,
            &input,
            &mut PlacementContext::default(),
        );
        assert_eq!(out.grants.len(), 1);
        assert_eq!(out.grants[0].agent, a);
        assert!(out.unserved.is_empty());
        assert_eq!(requests[0].request.count, 0);
    }
}
