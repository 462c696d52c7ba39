//! Property tests of the balance, least-requested and most-balanced placers: the chosen agent
//! always fits and is eligible, an agent is found whenever one may be, and the balance weights
//! are non-negative and sum to 1.

use proptest::prelude::*;
use ringmaster_core::placement::{
    allocate_in, BalanceSettings, Cluster, DrfSorter, Grant, PlacementContext, PlacerKind, Request,
    Resources, RingsConfig,
};

fn bundle(cpus: u64, mem: u64, gpus: u64) -> Resources {
    Resources::from_milli([("cpus", cpus), ("mem", mem), ("gpus", gpus)]).unwrap()
}

/// (total, share of each dimension already used, in percent).
fn agent() -> impl Strategy<Value = (Resources, [u64; 3])> {
    (
        1u64..=32,
        1u64..=16,
        prop_oneof![3 => Just(0u64), 1 => 1u64..=8],
        [0u64..=100, 0u64..=100, 0u64..=100],
    )
        .prop_map(|(c, m, g, used)| (bundle(c * 500, m * 512_000, g * 1000), used))
}

fn demand() -> impl Strategy<Value = Resources> {
    (
        1u64..=24,
        0u64..=12,
        prop_oneof![4 => Just(0u64), 1 => 1u64..=3],
    )
        .prop_map(|(c, m, g)| bundle(c * 500, m * 256_000, g * 1000))
}

fn settings() -> impl Strategy<Value = BalanceSettings> {
    (
        prop::option::of([0u32..=10, 0u32..=10, 1u32..=10]),
        0u32..=10,
        any::<bool>(),
    )
        .prop_map(|(weights, threshold, strict)| {
            let weights = weights.map(|w| {
                let sum: u32 = w.iter().sum();
                ["cpus", "mem", "gpus"]
                    .iter()
                    .zip(w)
                    .map(|(n, x)| (n.to_string(), f64::from(x) / f64::from(sum)))
                    .collect()
            });
            BalanceSettings::new(weights, f64::from(threshold) / 10.0, strict).unwrap()
        })
}

fn build(placer: PlacerKind, agents: &[(Resources, [u64; 3])]) -> Cluster {
    let mut cluster = Cluster::new(RingsConfig::default(), placer);
    for (total, used) in agents {
        let key = cluster.add_agent(total.clone());
        let take = Resources::from_milli(
            ["cpus", "mem", "gpus"]
                .iter()
                .zip(used)
                .map(|(n, pct)| (*n, total.milli(n) * pct / 100)),
        )
        .unwrap();
        cluster.take(key, &take).unwrap();
    }
    cluster
}

const NEW_PLACERS: [PlacerKind; 3] = [
    PlacerKind::Balance,
    PlacerKind::LeastRequested,
    PlacerKind::MostBalanced,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn chosen_agent_fits_and_is_eligible(
        agents in prop::collection::vec(agent(), 0..24),
        demands in prop::collection::vec(demand(), 1..6),
        mask in any::<u32>(),
        settings in settings(),
    ) {
        let eligible = |key: usize| mask & (1 << (key % 32)) != 0;
        for placer in NEW_PLACERS {
            let cluster = build(placer, &agents);
            let mut context = PlacementContext::new(settings.clone());
            context.set_pending(demands.iter().map(|d| (d, 2)));
            for demand in &demands {
                let any_fits = cluster
                    .agents()
                    .any(|(k, a)| a.free.contains(demand) && eligible(k));
                match cluster.place_in(demand, &eligible, &mut context) {
                    Some(d) => {
                        let agent = cluster.agent(d.agent).unwrap();
                        prop_assert!(agent.free.contains(demand), "{placer}: {demand} on {:?}", agent);
                        prop_assert!(eligible(d.agent));
                        prop_assert_eq!(d.balance().is_some(), placer == PlacerKind::Balance);
                    }
                    // Only require_improvement may leave a fitting demand pending.
                    None => prop_assert!(
                        !any_fits || (placer == PlacerKind::Balance && settings.require_improvement()),
                        "{placer} found nothing for {demand}"
                    ),
                }
            }
        }
    }

    #[test]
    fn weights_are_non_negative_and_sum_to_one(
        agents in prop::collection::vec(agent(), 0..16),
        pending in prop::collection::vec((demand(), 1u64..5), 0..10),
        settings in settings(),
        removals in prop::collection::vec(any::<prop::sample::Index>(), 0..5),
    ) {
        let cluster = build(PlacerKind::Balance, &agents);
        let mut context = PlacementContext::new(settings);
        context.set_pending(pending.iter().map(|(d, n)| (d, *n)));
        let check = |context: &mut PlacementContext| -> Result<(), TestCaseError> {
            let weights = context.weights(&cluster);
            let sum: f64 = weights.iter().map(|(_, w)| w).sum();
            prop_assert!(weights.iter().all(|(_, w)| *w >= 0.0), "{weights:?}");
            if !weights.is_empty() {
                prop_assert!((sum - 1.0).abs() < 1e-9, "{weights:?} sum {sum}");
            }
            Ok(())
        };
        check(&mut context)?;
        for index in removals {
            if pending.is_empty() {
                break;
            }
            let (demand, copies) = index.get(&pending);
            context.remove_pending(demand, *copies);
            check(&mut context)?;
        }
    }

    /// A whole allocation step with the balance placer: every grant fits the agent it was taken
    /// from (replayed on a copy of the cluster) and nothing more can be placed afterwards unless
    /// require_improvement declined it.
    #[test]
    fn balance_allocation_steps_only_take_what_fits(
        agents in prop::collection::vec(agent(), 1..12),
        requests in prop::collection::vec((0usize..3, demand(), 1u32..4), 1..8),
        settings in settings(),
    ) {
        let mut cluster = build(PlacerKind::Balance, &agents);
        let mut replay = cluster.clone();
        let mut drf = DrfSorter::new();
        for fw in 0..3 {
            drf.add(fw, 1.0);
        }
        let mut requests: Vec<Request> = requests
            .into_iter()
            .map(|(framework, demand, count)| Request { framework, demand, count })
            .collect();
        let mut context = PlacementContext::new(settings.clone());
        let out = allocate_in(&mut cluster, &mut drf, &mut requests, Grant::Demand, &|_, _| true, &mut context);
        for a in &out {
            prop_assert!(replay.take(a.agent, &a.resources).is_ok());
            let note = a.decision.balance().expect("balance explains itself");
            prop_assert!(note.y_before >= 0.0 && note.y_after >= 0.0);
        }
        if !settings.require_improvement() {
            for r in &requests {
                prop_assert!(r.count == 0 || cluster.place(&r.demand, &|_| true).is_none());
            }
        }
    }
}
