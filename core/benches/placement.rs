//! Placement benchmarks: one decision and one full allocation step, ring against linear best fit;
//! and one decision of each placer (ring, balance, least-requested, most-balanced) side by side;
//! and one scored decision where most agents fail a device check, the plain walk against the
//! graded one; and one scored decision after one agent changed, walked afresh against
//! re-checked through the demand's memo.
//!
//! Agents are a seeded, deterministic mix of sizes (1–64 cpus, 1–256 GiB, some with GPUs), partly
//! used for the single-decision benchmark so they spread over the buckets. Run with
//! `cargo bench -p ringmaster-core --bench placement`; figures are recorded in docs/benchmarks.md.

use std::cell::RefCell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use ringmaster_core::placement::placers::memo::WalkMemo;
use ringmaster_core::placement::ring_set::ALL_CLASSES;
use ringmaster_core::placement::{
    allocate, BalanceSettings, Cluster, DrfSorter, Grant, PlacementContext, PlacerKind, Request,
    Resources, RingsConfig,
};

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn res(cpus_milli: u64, mem_mib: u64, gpus: u64) -> Resources {
    Resources::from_milli([
        ("cpus", cpus_milli),
        ("mem", mem_mib * 1000),
        ("gpus", gpus * 1000),
    ])
    .expect("valid bench resources")
}

/// `n` agents; with `used`, each has a random part of its resources taken.
fn cluster(n: usize, placer: PlacerKind, used: bool) -> Cluster {
    cluster_with(n, placer, used, RingsConfig::default())
}

/// [`cluster`] with other rings (the seed-001 search, for the ring's baseline).
fn cluster_with(n: usize, placer: PlacerKind, used: bool, rings: RingsConfig) -> Cluster {
    let mut rng = Rng(0x5eed_0001 + n as u64);
    let mut cluster = Cluster::new(rings, placer);
    for _ in 0..n {
        let cpus = (1 + rng.below(64)) * 1000;
        let mem = 1024 * (1 + rng.below(256));
        let gpus = if rng.below(8) == 0 {
            1 + rng.below(8)
        } else {
            0
        };
        let key = cluster.add_agent(res(cpus, mem, gpus));
        if used {
            let take = res(cpus * rng.below(100) / 100, mem * rng.below(100) / 100, 0);
            cluster.take(key, &take).expect("take less than total");
        }
    }
    cluster
}

fn demands() -> Vec<Resources> {
    vec![
        res(2000, 4096, 0),
        res(500, 16384, 0),
        res(8000, 2048, 0),
        res(1000, 1024, 1),
        res(16000, 65536, 0),
        res(250, 512, 0),
    ]
}

fn one_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("place");
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let demands = demands();
    for n in [1_000, 10_000, 100_000] {
        for placer in [PlacerKind::Ring, PlacerKind::LinearBestFit] {
            let cluster = cluster(n, placer, true);
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(placer.to_string(), n), &n, |b, _| {
                b.iter(|| {
                    i = (i + 1) % demands.len();
                    black_box(cluster.place(&demands[i], &|_| true))
                })
            });
        }
        // The ring's baselines and variants on the same agents: the seed's plain search, and
        // the default search with a caller's score (a cheap one: the cost measured is the
        // search's, with the default number of candidates).
        let seed = cluster_with(n, PlacerKind::Ring, true, RingsConfig::seed_001());
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("ring-seed001", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) % demands.len();
                black_box(seed.place(&demands[i], &|_| true))
            })
        });
        let scored = cluster(n, PlacerKind::Ring, true);
        let score = |agent: usize, _: &Resources| (agent % 7) as i64;
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("ring-scored", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) % demands.len();
                let mut context = PlacementContext::default().with_score(&score);
                black_box(scored.place_in(&demands[i], &|_| true, &mut context))
            })
        });
    }
    group.finish();
}

/// One allocation step making an offer of every agent (Grant::WholeAgent): demands are small
/// enough that every agent fits one, and counts large enough that nobody runs out.
fn allocation_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for n in [1_000, 10_000, 100_000] {
        for frameworks in [10usize, 1_000] {
            for placer in [PlacerKind::Ring, PlacerKind::LinearBestFit] {
                // A linear scan per offer is quadratic: 100k agents would take minutes per sample.
                if placer == PlacerKind::LinearBestFit && n > 10_000 {
                    continue;
                }
                let base = cluster(n, placer, false);
                let mut rng = Rng(0xd1f ^ frameworks as u64);
                let mut drf = DrfSorter::new();
                let requests: Vec<Request> = (0..frameworks)
                    .map(|fw| {
                        drf.add(fw, 1.0 + rng.below(3) as f64);
                        Request {
                            framework: fw,
                            demand: res(100 * (1 + rng.below(5)), 128 * (1 + rng.below(4)), 0),
                            count: u32::MAX,
                        }
                    })
                    .collect();
                let id = BenchmarkId::new(format!("{placer}/{frameworks}fw"), n);
                group.bench_with_input(id, &n, |b, _| {
                    b.iter_batched(
                        || (base.clone(), drf.clone(), requests.clone()),
                        |(mut cluster, mut drf, mut requests)| {
                            let out = allocate(
                                &mut cluster,
                                &mut drf,
                                &mut requests,
                                Grant::WholeAgent,
                                &|_, _| true,
                            );
                            assert_eq!(out.len(), n, "one offer per agent");
                            // Returned, so the state is dropped after the clock stops.
                            (out, cluster, drf, requests)
                        },
                        BatchSize::LargeInput,
                    )
                });
            }
        }
    }
    group.finish();
}

/// One decision of each placer on the same partly used agents. Balance runs twice: with
/// threshold 1 (below it: the first improving agent, usually found early) and threshold 0 (at or
/// above it: every fitting agent is visited); its context holds 100 pending demands.
fn placers(c: &mut Criterion) {
    let mut group = c.benchmark_group("placers");
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let demands = demands();
    let pending: Vec<Resources> = (0..100)
        .map(|i| demands[i % demands.len()].clone())
        .collect();
    let balance = |threshold: f64| {
        let settings = BalanceSettings::new(None, threshold, false).expect("valid settings");
        let mut context = PlacementContext::new(settings);
        context.set_pending(pending.iter().map(|d| (d, 1)));
        context
    };
    let runs: [(&str, PlacerKind, Option<f64>); 5] = [
        ("ring", PlacerKind::Ring, None),
        ("balance-below-threshold", PlacerKind::Balance, Some(1.0)),
        ("balance-at-threshold", PlacerKind::Balance, Some(0.0)),
        ("least-requested", PlacerKind::LeastRequested, None),
        ("most-balanced", PlacerKind::MostBalanced, None),
    ];
    for n in [1_000, 10_000] {
        for (name, placer, threshold) in runs {
            let cluster = cluster(n, placer, true);
            let mut context = balance(threshold.unwrap_or(0.5));
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    i = (i + 1) % demands.len();
                    black_box(cluster.place_in(&demands[i], &|_| true, &mut context))
                })
            });
        }
    }
    group.finish();
}

/// One scored decision for a slice of a GPU among GPU agents of which four in five cannot hold
/// it (their free GPU is spread over GPUs too small for the slice, which the eligibility check
/// says one agent at a time): the plain walk passes them one by one; the graded walk
/// ([`Cluster::set_grade`], the caller's grade of each agent) skips them after a few. The same
/// agents, demands and score in both, and the same answers (checked before timing).
/// A walk's restriction as the benches set it: each agent's label drawn from the seeded
/// generator, how the cluster files it, which labels the demands can take, and the context
/// that lets the walk skip the others (the demands' grade and classes).
struct Labelled<'a> {
    group: &'static str,
    draw: &'a dyn Fn(&mut Rng) -> u8,
    file: &'a dyn Fn(&mut Cluster, usize, u8),
    takes: &'a dyn Fn(u8) -> bool,
    /// The demands' grade and classes (`PlacementContext::with_grade`, `with_classes`).
    grade: u8,
    classes: u64,
    /// The demands' GPU milli (a slice or whole GPUs).
    gpu_milli: u64,
}

/// One scored ring decision (40 candidates, a cheap score) among agents filed under labels
/// (`Labelled`): `plain` walks them unlabelled, passing the agents the demand cannot take one
/// by one; the other benchmark files them and gives the demand's restriction. Both are
/// checked to decide alike first.
fn labelled_walk(c: &mut Criterion, labelled: Labelled, name: &str) {
    let mut group = c.benchmark_group(labelled.group);
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let gpus = labelled.gpu_milli;
    let demands = [res(2000, 4096, 0), res(4000, 8192, 0), res(1000, 2048, 0)]
        .map(|r| Resources::from_milli(r.iter().chain([("gpus", gpus)])).expect("valid demand"));
    let score = |agent: usize, _: &Resources| (agent % 7) as i64;
    let (grade, classes) = (labelled.grade, labelled.classes);
    let (grade, classes) = (move |_: &Resources| grade, move |_: &Resources| classes);
    for n in [1_000, 10_000, 100_000] {
        let mut rng = Rng(0x5eed_0002 + n as u64);
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let mut label = Vec::with_capacity(n);
        for _ in 0..n {
            let key = cluster.add_agent(res(64_000, 262_144, 1 + rng.below(8)));
            let take = res(rng.below(32_000), rng.below(131_072), 0);
            cluster.take(key, &take).expect("take less than total");
            label.push((labelled.draw)(&mut rng));
        }
        let eligible = |key: usize| (labelled.takes)(label[key]);
        let plain = cluster.clone();
        for (key, &l) in label.iter().enumerate() {
            (labelled.file)(&mut cluster, key, l);
        }
        for demand in &demands {
            let mut context = PlacementContext::default().with_score(&score);
            let expected = plain.place_in(demand, &eligible, &mut context);
            let mut context = context.with_grade(&grade).with_classes(&classes);
            let got = cluster.place_in(demand, &eligible, &mut context);
            assert_eq!(got, expected, "restricted and plain walks decide alike");
        }
        for (bench, cluster, restricted) in [("plain", &plain, false), (name, &cluster, true)] {
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(bench, n), &n, |b, _| {
                b.iter(|| {
                    i = (i + 1) % demands.len();
                    let mut context = PlacementContext::default().with_score(&score);
                    if restricted {
                        context = context.with_grade(&grade).with_classes(&classes);
                    }
                    black_box(cluster.place_in(&demands[i], &eligible, &mut context))
                })
            });
        }
    }
    group.finish();
}

/// A half-GPU slice among agents of which four in five hold at most a quarter GPU on any one
/// GPU (graded 0–1, the rest 2–7): the graded walk keeps to grade 2 and up.
fn graded_walk(c: &mut Criterion) {
    let labelled = Labelled {
        group: "place-graded",
        draw: &|rng| match rng.below(5) {
            0 => 2 + rng.below(6) as u8,
            _ => rng.below(2) as u8,
        },
        file: &|cluster, key, grade| cluster.set_grade(key, "gpus", grade),
        takes: &|grade| grade >= 2,
        grade: 2,
        classes: ALL_CLASSES,
        gpu_milli: 500,
    };
    labelled_walk(c, labelled, "graded");
}

/// A whole GPU of one model among agents of six models (the openb node list's mix: the one
/// asked for on one agent in nine): the classed walk keeps to that model's agents.
fn classed_walk(c: &mut Criterion) {
    let labelled = Labelled {
        group: "place-classed",
        draw: &|rng| match rng.below(9) {
            0 => 0,
            other => 1 + (other % 5) as u8,
        },
        file: &|cluster, key, class| cluster.set_class(key, "gpus", class),
        takes: &|class| class == 0,
        grade: 0,
        classes: 1,
        gpu_milli: 1000,
    };
    labelled_walk(c, labelled, "classed");
}

/// One scored decision for a whole GPU after one agent changed (a milli-cpu taken and given
/// back, as a placement changes one agent between two searches): `plain` walks and ranks its 40
/// candidates again; `remembered` re-checks the changed agent through the demand's memo
/// ([`PlacementContext::with_memo`]). The same agents, change sequence and score in both, and
/// the same answers (checked first); both iterations include the change, which `change` times
/// alone.
fn remembered_walk(c: &mut Criterion) {
    let mut group = c.benchmark_group("place-remembered");
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let demand = res(2000, 4096, 1);
    let tick = Resources::from_milli([("cpus", 1)]).expect("valid change");
    let score = |agent: usize, _: &Resources| (agent % 7) as i64;
    let change = |cluster: &mut Cluster, rng: &mut Rng, n: usize| {
        let key = rng.below(n as u64) as usize;
        if cluster.take(key, &tick).is_ok() {
            cluster
                .give_back(key, &tick)
                .expect("give back what was taken");
        }
    };
    for n in [1_000, 10_000, 100_000] {
        let mut rng = Rng(0x5eed_0003 + n as u64);
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        for _ in 0..n {
            let key = cluster.add_agent(res(64_000, 262_144, 1 + rng.below(8)));
            let take = res(rng.below(32_000), rng.below(131_072), rng.below(2));
            cluster.take(key, &take).expect("take less than total");
        }
        let memo = RefCell::new(WalkMemo::default());
        let mut check = cluster.clone();
        for _ in 0..200 {
            change(&mut check, &mut rng, n);
            let mut context = PlacementContext::default().with_score(&score);
            let expected = check.place_in(&demand, &|_| true, &mut context);
            let mut context = context.with_memo(&memo);
            let got = check.place_in(&demand, &|_| true, &mut context);
            assert_eq!(got, expected, "remembered and plain walks decide alike");
        }
        assert!(memo.borrow().recalled() > 0, "the memo answered");
        // `change`: the change alone, what both others include.
        for (bench, remembered) in [
            ("change", None),
            ("plain", Some(false)),
            ("remembered", Some(true)),
        ] {
            let mut cluster = cluster.clone();
            let memo = RefCell::new(WalkMemo::default());
            let mut rng = Rng(0x5eed_0004 + n as u64);
            group.bench_with_input(BenchmarkId::new(bench, n), &n, |b, _| {
                b.iter(|| {
                    change(&mut cluster, &mut rng, n);
                    let remembered = remembered?;
                    let mut context = PlacementContext::default().with_score(&score);
                    if remembered {
                        context = context.with_memo(&memo);
                    }
                    black_box(cluster.place_in(&demand, &|_| true, &mut context))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    one_decision,
    allocation_step,
    placers,
    graded_walk,
    classed_walk,
    remembered_walk
);
criterion_main!(benches);
