//! Placement benchmarks: one decision and one full allocation step, ring against linear best fit.
//!
//! Agents are a seeded, deterministic mix of sizes (1–64 cpus, 1–256 GiB, some with GPUs), partly
//! used for the single-decision benchmark so they spread over the buckets. Run with
//! `cargo bench --bench placement`; figures are recorded in docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use ringmaster::placement::{
    allocate, Cluster, DrfSorter, Grant, PlacerKind, Request, Resources, RingsConfig,
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
    let mut rng = Rng(0x5eed_0001 + n as u64);
    let mut cluster = Cluster::new(RingsConfig::default(), placer);
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

criterion_group!(benches, one_decision, allocation_step);
criterion_main!(benches);
