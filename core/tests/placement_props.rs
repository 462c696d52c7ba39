//! Property tests of the placement core: fits, ring bookkeeping, agreement with linear best fit,
//! and DRF order in the allocation step.

use proptest::prelude::*;
use ringmaster_core::placement::{
    allocate, AgentKey, Cluster, DrfSorter, Grant, LinearBestFit, Phase, PlacerKind, Request,
    Resources, RingLayout, RingSpec, RingsConfig,
};

/// Small rings so that every phase is exercised: 6 one-cpu buckets (search_up 1), 4 mem buckets.
/// The seed-001 search (no sparing): these properties compare it with a linear best fit.
fn rings() -> RingsConfig {
    let mut rings = RingsConfig::seed_001();
    rings.set(
        "cpus",
        RingSpec::new(
            RingLayout::EqualSpans {
                base: 0,
                step: 1000,
                buckets: 6,
            },
            1,
        )
        .unwrap(),
    );
    rings.set(
        "mem",
        RingSpec::new(
            RingLayout::Bounds(vec![0, 1_000_000, 2_000_000, 4_000_000]),
            1,
        )
        .unwrap(),
    );
    rings
}

fn bundle(cpus: u64, mem: u64, gpus: u64) -> Resources {
    Resources::from_milli([("cpus", cpus), ("mem", mem), ("gpus", gpus)]).unwrap()
}

fn agent_total() -> impl Strategy<Value = Resources> {
    (
        0u64..=32,
        0u64..=14,
        prop_oneof![3 => Just(0u64), 1 => 1u64..=4],
    )
        .prop_map(|(c, m, g)| bundle(c * 250, m * 500_000, g * 1000))
}

fn demand() -> impl Strategy<Value = Resources> {
    (
        1u64..=24,
        0u64..=10,
        prop_oneof![5 => Just(0u64), 1 => Just(1u64)],
    )
        .prop_map(|(c, m, g)| bundle(c * 250, m * 500_000, g * 1000))
}

#[derive(Clone, Debug)]
enum Op {
    Add(Resources),
    Remove(usize),
    Take(usize, Resources),
    GiveBack(usize, Resources),
    Place(Resources, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => agent_total().prop_map(Op::Add),
        1 => any::<usize>().prop_map(Op::Remove),
        3 => (any::<usize>(), demand()).prop_map(|(i, r)| Op::Take(i, r)),
        2 => (any::<usize>(), demand()).prop_map(|(i, r)| Op::GiveBack(i, r)),
        4 => (demand(), 0u8..4).prop_map(|(d, f)| Op::Place(d, f)),
    ]
}

fn nth_key(cluster: &Cluster, i: usize) -> Option<AgentKey> {
    let keys: Vec<AgentKey> = cluster.agents().map(|(k, _)| k).collect();
    (!keys.is_empty()).then(|| keys[i % keys.len()])
}

/// Every agent is filed in exactly the bucket of its free amount, in every dimension of its
/// total, and nowhere else; the cluster sums match the agents.
fn check_bookkeeping(cluster: &Cluster) -> Result<(), TestCaseError> {
    let mut total = Resources::new();
    let mut free = Resources::new();
    for (key, agent) in cluster.agents() {
        prop_assert!(agent.total.contains(&agent.free));
        total = total.checked_add(&agent.total).unwrap();
        free = free.checked_add(&agent.free).unwrap();
        for (name, _) in agent.total.iter() {
            let ring = cluster.ring(name).expect("ring for every dimension");
            let expected = ring.bucket_of(agent.free.milli(name));
            prop_assert_eq!(cluster.bucket_of(key, name), Some(expected));
        }
    }
    prop_assert_eq!(cluster.total(), &total);
    prop_assert_eq!(cluster.free(), &free);
    for view in cluster.rings() {
        let ring = cluster.ring(&view.name).unwrap();
        let filed: usize = view.buckets.iter().map(|b| b.agents).sum();
        let having = cluster
            .agents()
            .filter(|(_, a)| a.total.milli(&view.name) > 0)
            .count();
        prop_assert_eq!(filed, having, "ring {}", view.name);
        for (b, _) in view.buckets.iter().enumerate() {
            for (free, key) in ring.members(b) {
                let agent = cluster.agent(key).expect("filed agent exists");
                prop_assert_eq!(agent.free.milli(&view.name), free);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ring_bookkeeping_and_decisions(ops in prop::collection::vec(op(), 1..60)) {
        let mut cluster = Cluster::new(rings(), PlacerKind::Ring);
        for op in ops {
            match op {
                Op::Add(total) => { cluster.add_agent(total); }
                Op::Remove(i) => { if let Some(k) = nth_key(&cluster, i) { cluster.remove_agent(k); } }
                Op::Take(i, r) => { if let Some(k) = nth_key(&cluster, i) { let _ = cluster.take(k, &r); } }
                Op::GiveBack(i, r) => { if let Some(k) = nth_key(&cluster, i) { let _ = cluster.give_back(k, &r); } }
                Op::Place(demand, filter) => {
                    let eligible = |k: AgentKey| filter == 0 || k % 4 != filter as usize;
                    let ring = cluster.place(&demand, &eligible);
                    let linear = cluster.place_with(&LinearBestFit, &demand, &eligible);
                    // Ring finds an agent exactly when one fits.
                    prop_assert_eq!(ring.is_some(), linear.is_some());
                    if let (Some(ring), Some(linear)) = (ring, linear) {
                        let chosen = cluster.agent(ring.agent).unwrap();
                        prop_assert!(chosen.free.contains(&demand));
                        prop_assert!(eligible(ring.agent));
                        let dim = ring.dimension.clone().unwrap();
                        prop_assert_eq!(Some(&dim), linear.dimension.as_ref());
                        let leftover = |k: AgentKey| cluster.agent(k).unwrap().free.milli(&dim) - demand.milli(&dim);
                        match ring.phase.unwrap() {
                            Phase::Bucket | Phase::Up => prop_assert_eq!(leftover(ring.agent), leftover(linear.agent)),
                            Phase::Down => prop_assert!(leftover(ring.agent) >= leftover(linear.agent)),
                            Phase::Leftover => prop_assert!(false, "no leftover pass without a score"),
                        }
                        let ring_set = cluster.ring(&dim).unwrap();
                        let k = ring_set.bucket_of(demand.milli(&dim));
                        let n = (k + ring_set.search_up()).min(ring_set.len() - 1);
                        let bucket = ring.bucket.unwrap();
                        let in_window = match ring.phase.unwrap() {
                            Phase::Bucket => bucket == k,
                            Phase::Up => bucket > k && bucket <= n,
                            Phase::Down => bucket > n,
                            Phase::Leftover => false,
                        };
                        prop_assert!(in_window, "phase {:?} bucket {} k {} n {}", ring.phase, bucket, k, n);
                    }
                }
            }
            check_bookkeeping(&cluster)?;
        }
    }

    #[test]
    fn drf_serves_the_lowest_share_that_can_be_served(
        agents in prop::collection::vec(agent_total(), 1..8),
        weights in prop::collection::vec(1u32..=3, 1..5),
        reqs in prop::collection::vec((any::<usize>(), demand(), 1u32..5), 1..10),
    ) {
        let mut cluster = Cluster::new(rings(), PlacerKind::Ring);
        for a in &agents { cluster.add_agent(a.clone()); }
        let mut drf = DrfSorter::new();
        for (fw, w) in weights.iter().enumerate() { drf.add(fw, f64::from(*w)); }
        let initial: Vec<Request> = reqs.iter().map(|(f, d, c)| Request {
            framework: f % weights.len(), demand: d.clone(), count: *c,
        }).collect();
        let (before_cluster, before_drf) = (cluster.clone(), drf.clone());
        let mut requests = initial.clone();
        let out = allocate(&mut cluster, &mut drf, &mut requests, Grant::Demand, &|_, _| true);

        // Replay step by step and check each choice against the state it was made in.
        let (mut replay, mut books, mut pending) = (before_cluster, before_drf, initial);
        let total = replay.total().clone();
        for a in &out {
            let can_serve = |fw: usize, pending: &[Request], replay: &Cluster| pending.iter().any(|r| {
                r.framework == fw && r.count > 0 && replay.place(&r.demand, &|_| true).is_some()
            });
            prop_assert!(can_serve(a.framework, &pending, &replay));
            let served = books.share(a.framework, &total);
            for fw in 0..weights.len() {
                if fw != a.framework && can_serve(fw, &pending, &replay) {
                    prop_assert!(served <= books.share(fw, &total) + 1e-12,
                        "served {} at {} while {} waits at {}", a.framework, served, fw, books.share(fw, &total));
                }
            }
            let chosen = replay.agent(a.agent).unwrap();
            prop_assert!(chosen.free.contains(&a.resources));
            replay.take(a.agent, &a.resources).unwrap();
            books.allocated(a.framework, &a.resources);
            let r = pending.iter_mut()
                .find(|r| r.framework == a.framework && r.count > 0 && r.demand == a.resources)
                .expect("a pending request was served");
            r.count -= 1;
        }
        // The step ends only when nothing outstanding fits.
        for r in &requests {
            prop_assert!(r.count == 0 || cluster.place(&r.demand, &|_| true).is_none());
        }
        prop_assert_eq!(requests.iter().map(|r| r.count).collect::<Vec<_>>(),
                        pending.iter().map(|r| r.count).collect::<Vec<_>>());
    }
}
