//! One allocation step: DRF decides who is next, the placer decides where.
//!
//! Frameworks with outstanding requests sit in a queue keyed by their DRF position (share,
//! allocations, registration): a `BTreeSet`, so each decision costs O(log frameworks) plus one
//! placement, never a walk over all frameworks; with only a few frameworks in the step, a
//! short list on the stack instead (a step allocates nothing to order them). Resources only
//! leave agents during a step, so a
//! request that fits nowhere cannot fit later in the same step and is not tried again in it; it
//! stays in the placement context's pending set, where it counts as blocked (SPEC seed 000).

use std::collections::BTreeSet;

use smallvec::SmallVec;

use super::drf::SortKey;
use super::placers::fitting_agents;
use super::{AgentKey, Cluster, Decision, DrfSorter, FrameworkKey, PlacementContext, Resources};

/// Outstanding demand: `count` more copies of `demand` for `framework`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub framework: FrameworkKey,
    pub demand: Resources,
    pub count: u32,
}

/// What a served framework receives from the chosen agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The agent's whole free resources, as a Mesos offer.
    WholeAgent,
    /// Exactly the demand (the dry-run: as if the task were launched at once).
    Demand,
}

/// One served demand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub framework: FrameworkKey,
    /// Index of the served request in the slice given to the step.
    pub request: usize,
    pub agent: AgentKey,
    /// What was taken from the agent and recorded against the framework.
    pub resources: Resources,
    pub decision: Decision,
}

/// How many copies of `demand` the amounts `taken` (by dimension index) hold: the same as
/// `Resources::copies_of` on the bundle they came from.
fn copies_of(cluster: &Cluster, taken: &[(usize, u64)], demand: &Resources) -> u64 {
    demand
        .iter()
        .map(|(name, need)| {
            let have = taken
                .iter()
                .find(|&&(d, _)| cluster.dimension_name(d) == name)
                .map_or(0, |&(_, m)| m);
            have / need
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// Up to this many frameworks in a step are queued in a list on the stack.
const FEW_FRAMEWORKS: usize = 8;

/// The step's frameworks by DRF position (see the module doc): the least first.
// One per step, on the stack: the short list's size is the point (no allocation).
#[allow(clippy::large_enum_variant)]
enum Queue {
    /// At most [`FEW_FRAMEWORKS`]: the least found by a pass over them.
    Few(SmallVec<[(SortKey, usize); FEW_FRAMEWORKS]>),
    Many(BTreeSet<(SortKey, usize)>),
}

impl Queue {
    /// The queue of a step's first entries, one per framework.
    fn of(entries: SmallVec<[(SortKey, usize); FEW_FRAMEWORKS]>) -> Self {
        match entries.len() <= FEW_FRAMEWORKS {
            true => Queue::Few(entries),
            false => Queue::Many(entries.into_iter().collect()),
        }
    }

    /// Queues an entry (no entry is queued twice: the second field, a framework's slot,
    /// differs).
    fn insert(&mut self, entry: (SortKey, usize)) {
        match self {
            Queue::Few(few) => few.push(entry),
            Queue::Many(many) => {
                many.insert(entry);
            }
        }
    }

    /// Takes the least entry out.
    fn pop_first(&mut self) -> Option<(SortKey, usize)> {
        match self {
            Queue::Few(few) => {
                let least = (0..few.len()).min_by(|&a, &b| few[a].cmp(&few[b]))?;
                Some(few.swap_remove(least))
            }
            Queue::Many(many) => many.pop_first(),
        }
    }
}

/// Serves requests until none of them can be placed; see the module doc.
///
/// Per framework, its requests are tried in slice order. Each serve places one demand with the
/// cluster's placer among agents `eligible(framework, agent)` accepts, takes the grant from the
/// agent, records it in `drf` and lowers the request's count (by 1 for [`Grant::Demand`]; by the
/// number of copies of the demand the grant holds, at least 1, for [`Grant::WholeAgent`]).
/// Frameworks unknown to `drf` or suppressed are not served.
pub fn allocate(
    cluster: &mut Cluster,
    drf: &mut DrfSorter,
    requests: &mut [Request],
    grant: Grant,
    eligible: &dyn Fn(FrameworkKey, AgentKey) -> bool,
) -> Vec<Allocation> {
    let mut context = PlacementContext::default();
    allocate_in(cluster, drf, requests, grant, eligible, &mut context)
}

/// [`allocate`] with a [`PlacementContext`] (placer settings), whose pending set this step keeps
/// up to date when the cluster's placer reads it ([`PlacerKind::reads_pending`], the balance
/// placer; for the others the set is left empty): at the start every request's remaining
/// copies; a served copy leaves it, and so does a request the placer declined although an
/// eligible agent had room, until the next step. A request no eligible agent has room for stays
/// in it: it is what the balance weights count as blocked (SPEC seed 000: `r_i`, pending demands
/// no agent can satisfy because of dimension i).
///
/// [`PlacerKind::reads_pending`]: crate::placement::PlacerKind::reads_pending
pub fn allocate_in(
    cluster: &mut Cluster,
    drf: &mut DrfSorter,
    requests: &mut [Request],
    grant: Grant,
    eligible: &dyn Fn(FrameworkKey, AgentKey) -> bool,
    context: &mut PlacementContext,
) -> Vec<Allocation> {
    let tracked = match cluster.placer().reads_pending() {
        true => requests,
        false => &[][..],
    };
    context.set_pending(
        tracked
            .iter()
            .filter(|r| r.count > 0)
            .map(|r| (&r.demand, u64::from(r.count))),
    );
    allocate_pending(
        cluster,
        drf,
        requests,
        None,
        grant,
        eligible,
        context,
        &mut Hooks::none(),
    )
}

/// What a cycle step asks besides the placement: may request `i` be served one more copy
/// now (its priority may have dropped below the tier being served, as copies served before it
/// used up its user's quota), and what a grant of `copies` of request `i` changes for the
/// next ones.
pub(crate) struct Hooks<'h> {
    pub admit: Option<&'h Admit<'h>>,
    pub granted: Option<&'h mut Granted<'h>>,
}

/// May request `i` (its demand) be served one more copy in this step?
pub(crate) type Admit<'a> = dyn Fn(usize, &Resources) -> bool + 'a;
/// Request `i` (its demand) was granted this many copies.
pub(crate) type Granted<'a> = dyn FnMut(usize, &Resources, u32) + 'a;

impl Hooks<'_> {
    pub fn none() -> Self {
        Hooks {
            admit: None,
            granted: None,
        }
    }
}

/// Where a step finds its requests: plain [`Request`]s, or the cycle's tiered ones.
pub(crate) trait HasRequest {
    fn request(&self) -> &Request;
    fn request_mut(&mut self) -> &mut Request;
}

impl HasRequest for Request {
    fn request(&self) -> &Request {
        self
    }
    fn request_mut(&mut self) -> &mut Request {
        self
    }
}

/// [`allocate_in`] on a context whose pending set the caller already filled (with these
/// requests' remaining copies among others, e.g. every priority tier's of a cycle), serving
/// only `requests[i]` for `i` in `serve` (in that order per framework; all when `None`), each
/// copy only while `hooks.admit` allows it. Allocations index `requests`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn allocate_pending<R: HasRequest, E: Fn(FrameworkKey, AgentKey) -> bool + ?Sized>(
    cluster: &mut Cluster,
    drf: &mut DrfSorter,
    requests: &mut [R],
    serve: Option<&[usize]>,
    grant: Grant,
    eligible: &E,
    context: &mut PlacementContext,
    hooks: &mut Hooks<'_>,
) -> Vec<Allocation> {
    // Each framework's requests with copies left, in order: (framework, index) pairs sorted by
    // framework (stable, so request order holds within one). On the stack for a short step.
    let mut by_framework: SmallVec<[(FrameworkKey, usize); 8]> = match serve {
        Some(serve) => serve
            .iter()
            .map(|&i| (requests[i].request().framework, i))
            .collect(),
        None => requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.request().framework, i))
            .collect(),
    };
    by_framework.retain(|&mut (_, i)| requests[i].request().count > 0);
    by_framework.sort_by_key(|&(fw, _)| fw);
    // Per framework: the range of its requests in `by_framework` and the position of the one
    // being served. The queue carries the position in this list, so no map is searched per
    // serve. The cluster total does not change during a step (only free amounts do).
    let mut pending: SmallVec<[(usize, usize); FEW_FRAMEWORKS]> = SmallVec::new();
    // One framework alone has no other to be ordered against: its shares are not computed.
    // (`by_framework` is sorted: one framework when the first and last are the same.)
    let alone = by_framework.first().map(|f| f.0) == by_framework.last().map(|l| l.0);
    let mut first: SmallVec<[(SortKey, usize); FEW_FRAMEWORKS]> = SmallVec::new();
    let mut start = 0;
    while start < by_framework.len() {
        let fw = by_framework[start].0;
        let end = start + by_framework[start..].partition_point(|&(f, _)| f == fw);
        let key = match alone {
            true => drf.alone_key(fw),
            false => drf.sort_key(fw, cluster.total()),
        };
        if let Some(key) = key {
            first.push((key, pending.len()));
            pending.push((start, end));
        }
        start = end;
    }
    let mut queue = Queue::of(first);
    // A whole-agent grant empties its agent, so there are at most as many as agents.
    let mut out = match grant {
        Grant::WholeAgent => {
            let asked = by_framework.iter().fold(0usize, |sum, &(_, i)| {
                sum.saturating_add(requests[i].request().count as usize)
            });
            Vec::with_capacity(asked.min(cluster.len()))
        }
        Grant::Demand => Vec::new(),
    };

    let mut taken = Vec::new();
    let tracks_pending = cluster.placer().reads_pending();
    while let Some((next, slot)) = queue.pop_first() {
        let fw = next.framework;
        let (at, end) = &mut pending[slot];
        while *at < *end {
            let i = by_framework[*at].1;
            let req = requests[i].request();
            if req.count == 0 || hooks.admit.is_some_and(|admit| !admit(i, &req.demand)) {
                // Served out, or no longer of this step's priority: its next copies wait.
                *at += 1;
                continue;
            }
            let fits = |agent| eligible(fw, agent);
            let Some(decision) = cluster.place_in(&req.demand, &fits, context) else {
                // Declined although an agent had room: given up for this step. Room on no
                // agent: still pending, and blocked (the balance weights count it).
                // Only a placer that may decline needs the (linear) scan to tell the two apart.
                if tracks_pending
                    && cluster.placer().may_decline()
                    && fitting_agents(cluster, &req.demand, &fits).next().is_some()
                {
                    context.remove_pending(&req.demand, u64::from(req.count));
                }
                *at += 1;
                continue;
            };
            let (granted, copies, key) = match grant {
                Grant::Demand => {
                    if cluster.take(decision.agent, &req.demand).is_err() {
                        // A placer chose an agent that cannot hold the grant: never serve this
                        // request.
                        if tracks_pending {
                            context.remove_pending(&req.demand, u64::from(req.count));
                        }
                        *at += 1;
                        continue;
                    }
                    let total = (!alone).then(|| cluster.total());
                    let key = drf.allocated_and_sort_key(fw, req.demand.iter(), total);
                    (req.demand.clone(), 1, key)
                }
                Grant::WholeAgent => {
                    // Moves the agent's free bundle out: the grant is never copied, and its
                    // amounts are read by dimension index (see `Cluster::take_all`).
                    let Ok(free) = cluster.take_all(decision.agent, &mut taken) else {
                        break;
                    };
                    let copies = copies_of(cluster, &taken, &req.demand);
                    let copies = copies.clamp(1, u32::MAX as u64) as u32;
                    let names = taken.iter().map(|&(d, m)| (cluster.dimension_name(d), m));
                    let total = (!alone).then(|| cluster.total());
                    let key = drf.allocated_and_sort_key(fw, names, total);
                    (free, copies, key)
                }
            };
            if let Some(key) = key {
                queue.insert((key, slot));
            }
            let req = requests[i].request_mut();
            let before = req.count;
            req.count = req.count.saturating_sub(copies);
            if tracks_pending {
                context.remove_pending(&req.demand, u64::from(before - req.count));
            }
            if let Some(granted) = hooks.granted.as_mut() {
                granted(i, &req.demand, before - req.count);
            }
            out.push(Allocation {
                framework: fw,
                request: i,
                agent: decision.agent,
                resources: granted,
                decision,
            });
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Phase, PlacerKind, RingsConfig};

    mod queue {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// The short list pops in the ordered set's order, whatever the inserts and pops.
            #[test]
            fn the_short_list_pops_like_the_ordered_set(
                ops in proptest::collection::vec(prop_oneof![
                    (0u64..3, 0u64..3, 0usize..4).prop_map(Some),
                    Just(None),
                ], 0..40),
            ) {
                let mut few = Queue::Few(SmallVec::new());
                let mut many = Queue::Many(BTreeSet::new());
                for (slot, op) in ops.into_iter().enumerate() {
                    match op {
                        Some((share, allocations, framework)) => {
                            let key = SortKey::of(share as f64 / 4.0, allocations, 0, framework);
                            few.insert((key, slot));
                            many.insert((key, slot));
                        }
                        None => prop_assert_eq!(few.pop_first(), many.pop_first()),
                    }
                }
                loop {
                    let (a, b) = (few.pop_first(), many.pop_first());
                    prop_assert_eq!(a, b);
                    if a.is_none() {
                        break;
                    }
                }
            }
        }
    }

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// The DRF paper's example: 9 CPUs and 18 GB; A's tasks are <1 CPU, 4 GB>, B's <3 CPU, 1 GB>.
    #[test]
    fn drf_paper_example() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let agent = cluster.add_agent(r("cpus:9;mem:18432"));
        let mut drf = DrfSorter::new();
        let (a, b) = (10, 20);
        drf.add(a, 1.0);
        drf.add(b, 1.0);
        let mut requests = [
            Request {
                framework: a,
                demand: r("cpus:1;mem:4096"),
                count: 10,
            },
            Request {
                framework: b,
                demand: r("cpus:3;mem:1024"),
                count: 10,
            },
        ];
        let out = allocate(
            &mut cluster,
            &mut drf,
            &mut requests,
            Grant::Demand,
            &|_, _| true,
        );
        let order: Vec<FrameworkKey> = out.iter().map(|x| x.framework).collect();
        assert_eq!(order, [a, b, a, b, a]);
        assert!(out.iter().all(|x| x.agent == agent));
        assert_eq!(requests[0].count, 7);
        assert_eq!(requests[1].count, 8);
        let total = cluster.total().clone();
        assert_eq!(drf.share(a, &total), 2.0 / 3.0);
        assert_eq!(drf.share(b, &total), 2.0 / 3.0);
        assert_eq!(drf.allocation(a), Some(&r("cpus:3;mem:12288")));
        assert_eq!(drf.allocation(b), Some(&r("cpus:6;mem:2048")));
        assert_eq!(cluster.agent(agent).unwrap().free, r("mem:4096"));
        assert_eq!(out[0].decision.phase, Some(Phase::Down));
    }

    #[test]
    fn whole_agent_grants_count_copies() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let small = cluster.add_agent(r("cpus:2;mem:2048"));
        let big = cluster.add_agent(r("cpus:8;mem:8192"));
        let mut drf = DrfSorter::new();
        drf.add(1, 1.0);
        drf.add(2, 1.0);
        drf.add(3, 1.0);
        drf.suppress(3);
        let mut requests = [
            Request {
                framework: 1,
                demand: r("cpus:1;mem:1024"),
                count: 5,
            },
            Request {
                framework: 2,
                demand: r("cpus:4;mem:1024"),
                count: 1,
            },
            Request {
                framework: 3,
                demand: r("cpus:1"),
                count: 1,
            },
            Request {
                framework: 4, // unknown to the sorter
                demand: r("cpus:1"),
                count: 1,
            },
        ];
        let out = allocate(
            &mut cluster,
            &mut drf,
            &mut requests,
            Grant::WholeAgent,
            &|_, _| true,
        );
        // Framework 1 first (registration): best fit is the small agent, 2 copies of its demand.
        // Framework 2 then gets the big agent; framework 1 finds nothing left.
        let got: Vec<(FrameworkKey, AgentKey, String)> = out
            .iter()
            .map(|x| (x.framework, x.agent, x.resources.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (1, small, "cpus:2;mem:2048".to_string()),
                (2, big, "cpus:8;mem:8192".to_string())
            ]
        );
        assert_eq!(
            requests.iter().map(|r| r.count).collect::<Vec<_>>(),
            [3, 0, 1, 1]
        );
        assert!(cluster.free().is_empty());
    }

    /// SPEC seed 000: a demand no agent has room for stays pending and blocks its dimension, so
    /// the balance weights the next placement sees (and the context after the step) count it.
    #[test]
    fn a_demand_that_fits_nowhere_stays_pending_and_raises_its_weight() {
        use crate::placement::BalanceSettings;
        let round4 = |x: f64| (x * 10_000.0).round() / 10_000.0;
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Balance);
        cluster.add_agent(r("cpus:4;mem:4000"));
        let mut drf = DrfSorter::new();
        drf.add(1, 1.0);
        drf.add(2, 1.0);
        // Framework 1 (served first: registration order) asks for more cpus than any agent has.
        let mut requests = [
            Request {
                framework: 1,
                demand: r("cpus:8;mem:100"),
                count: 2,
            },
            Request {
                framework: 2,
                demand: r("cpus:1;mem:100"),
                count: 1,
            },
        ];
        let mut context = PlacementContext::new(BalanceSettings::default());
        let out = allocate_in(
            &mut cluster,
            &mut drf,
            &mut requests,
            Grant::Demand,
            &|_, _| true,
            &mut context,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].framework, 2);
        // Weights (cpus, mem): w0 (1/2, 1/2); w1 the chart of r = (2, 0): (3/4, 1/4); w2 the
        // chart of utilisation (0, 0): (1/2, 1/2) → (7/12, 5/12).
        let seen: Vec<f64> = out[0]
            .decision
            .balance()
            .unwrap()
            .weights
            .iter()
            .map(|w| round4(*w))
            .collect();
        assert_eq!(seen, [0.5833, 0.4167]);
        assert_eq!(
            context.blocked_counts(&cluster),
            [("cpus".to_string(), 2), ("mem".to_string(), 0)]
        );
        assert_eq!(requests[0].count, 2);
        // After the step (utilisation cpus 1/4, mem 1/40): w2 (3/4, 1/4) → (2/3, 1/3).
        let after: Vec<f64> = context
            .weights(&cluster)
            .iter()
            .map(|(_, w)| round4(*w))
            .collect();
        assert_eq!(after, [0.6667, 0.3333]);
    }

    #[test]
    fn skips_a_request_that_fits_nowhere_and_tries_the_next() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::FirstFit);
        cluster.add_agent(r("cpus:4;mem:4096"));
        let mut drf = DrfSorter::new();
        drf.add(1, 1.0);
        let mut requests = [
            Request {
                framework: 1,
                demand: r("cpus:8"),
                count: 1,
            },
            Request {
                framework: 1,
                demand: r("cpus:1"),
                count: 2,
            },
        ];
        let out = allocate(
            &mut cluster,
            &mut drf,
            &mut requests,
            Grant::Demand,
            &|_, a| a != 99,
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].decision.phase, None);
        assert_eq!(requests[0].count, 1);
        assert_eq!(requests[1].count, 0);
        // Not eligible anywhere: nothing served.
        let mut requests = [Request {
            framework: 1,
            demand: r("cpus:1"),
            count: 1,
        }];
        assert!(allocate(
            &mut cluster,
            &mut drf,
            &mut requests,
            Grant::Demand,
            &|_, _| false
        )
        .is_empty());
    }

    /// A framework served alone (no other to be ordered against) is served without its share
    /// being computed, and only while it is not suppressed, as when others are pending.
    #[test]
    fn a_framework_alone_is_served_until_suppressed() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        cluster.add_agent(r("cpus:4;mem:4096"));
        let mut drf = DrfSorter::new();
        drf.add(1, 1.0);
        let request = || Request {
            framework: 1,
            demand: r("cpus:1;mem:512"),
            count: 3,
        };
        // (allocations, copies left)
        let step = |cluster: &mut Cluster, drf: &mut DrfSorter| {
            let mut requests = [request()];
            let out = allocate(cluster, drf, &mut requests, Grant::Demand, &|_, _| true);
            (out.len(), requests[0].count)
        };
        assert_eq!(step(&mut cluster, &mut drf), (3, 0));
        // Its books are kept all the same: DRF's share is 3/4 of the cpus.
        let share = drf.sort_key(1, cluster.total()).unwrap().share();
        assert_eq!(share, 0.75);
        drf.suppress(1);
        assert_eq!(step(&mut cluster, &mut drf), (0, 3));
    }

    /// Only a placer that reads the pending set (balance) gets it: after a ring step the set is
    /// empty, after a balance step it holds the demand that fits nowhere.
    #[test]
    fn the_pending_set_is_kept_for_the_placer_that_reads_it() {
        for kind in [PlacerKind::Ring, PlacerKind::Balance] {
            let mut cluster = Cluster::new(RingsConfig::default(), kind);
            cluster.add_agent(r("cpus:4;mem:4096"));
            let mut drf = DrfSorter::new();
            drf.add(1, 1.0);
            let mut requests = [Request {
                framework: 1,
                demand: r("cpus:8;mem:512"),
                count: 2,
            }];
            let mut context = PlacementContext::default();
            let out = allocate_in(
                &mut cluster,
                &mut drf,
                &mut requests,
                Grant::Demand,
                &|_, _| true,
                &mut context,
            );
            assert!(out.is_empty());
            let blocked = if kind.reads_pending() { 2 } else { 0 };
            assert_eq!(
                context.blocked_counts(&cluster),
                [("cpus".to_string(), blocked), ("mem".to_string(), 0)],
                "{kind}"
            );
        }
    }
}
