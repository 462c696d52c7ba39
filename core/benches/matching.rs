//! Batch matching benchmark: a burst of 1,000 tasks over 1,000 agents (SPEC seed 002).
//!
//! Agents and tasks are a seeded, deterministic mix: agents of 4–64 cpus and 8–256 GiB with cpu
//! speed 0.5–4, network rate and unit cost varied; tasks of 0.5–4 cpus and 256 MiB–8 GiB with
//! deadlines from tight (met only on fast agents) to loose. The burst asks for about a third of
//! the cluster's cpus, so some agents are contested and some tasks re-propose. Run with
//! `cargo bench -p ringmaster-core --bench matching`; the proposal count is printed once before measuring, and the
//! figures are recorded in docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ringmaster_core::placement::matching::{
    match_batch, AgentProfile, BatchTask, MatchAgent, MatchingCoefficients,
};
use ringmaster_core::placement::Resources;

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

fn res(cpus_milli: u64, mem_mib: u64) -> Resources {
    Resources::from_milli([("cpus", cpus_milli), ("mem", mem_mib * 1000)])
        .expect("valid bench resources")
}

fn burst(agents: usize, tasks: usize) -> (Vec<MatchAgent>, Vec<BatchTask>) {
    let mut rng = Rng(0x5eed_0002);
    let agents = (0..agents)
        .map(|i| {
            let total = res(4000 * (1 + rng.below(16)), 8192 * (1 + rng.below(32)));
            MatchAgent {
                id: format!("a{i}"),
                free: total.clone(),
                total,
                profile: AgentProfile {
                    cpu_speed: 0.5 * (1 + rng.below(8)) as f64,
                    net_rate: 100.0 * (1 + rng.below(100)) as f64,
                    unit_cost: 0.25 * (1 + rng.below(8)) as f64,
                },
            }
        })
        .collect();
    let tasks = (0..tasks)
        .map(|i| {
            let work = 1.0 + rng.below(20) as f64;
            BatchTask {
                id: format!("t{i}"),
                resources: res(500 * (1 + rng.below(8)), 256 * (1 + rng.below(32))),
                deadline_secs: work * (0.3 + rng.below(30) as f64 / 10.0),
                work,
                price: (1 + rng.below(10)) as f64,
            }
        })
        .collect();
    (agents, tasks)
}

fn bench_matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_matching");
    group.measurement_time(Duration::from_secs(10));
    group.sample_size(30);
    let k = MatchingCoefficients::default();
    for (tasks, agents) in [(100, 100), (1000, 1000)] {
        let (a, t) = burst(agents, tasks);
        let result = match_batch(&t, &a, &k);
        println!(
            "{tasks} tasks × {agents} agents: {} matched, {} unmatched, {} proposals in {} rounds, {} fills",
            result.matches.len(),
            result.unmatched.len(),
            result.proposals,
            result.rounds,
            result.fills
        );
        group.bench_with_input(
            BenchmarkId::new("deferred_acceptance", format!("{tasks}x{agents}")),
            &(a, t),
            |b, (a, t)| b.iter(|| black_box(match_batch(black_box(t), black_box(a), &k))),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_matching);
criterion_main!(benches);
