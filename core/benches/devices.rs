//! Device fit benchmark (SPEC seed 004): filtering many agents for a GPU request with the packed
//! fit test (bit tricks over all lanes of one integer) against the plain per-device `Vec` test.
//!
//! Agents are a seeded mix of 8-GPU machines (16 or 32 GiB devices, models `V100M16` /
//! `V100M32`) with random free shares and memory, like a busy openb-style cluster. Each
//! iteration counts the agents that fit one request, as the master's filter would. Run with
//! `cargo bench -p ringmaster-core --bench devices`; figures are recorded in docs/benchmarks.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ringmaster_core::devices::{
    Device, DeviceRequest, DeviceState, GpuDemand, PackedGpus, SHARE_CAPACITY,
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

fn agents(n: usize) -> Vec<DeviceState> {
    let mut rng = Rng(0x5eed_0004);
    (0..n)
        .map(|_| {
            let (memory_mib, model) = if rng.below(2) == 0 {
                (16384, "V100M16")
            } else {
                (32768, "V100M32")
            };
            let devices: Vec<Device> = (0..8)
                .map(|index| Device {
                    index,
                    model: model.to_string(),
                    memory_mib,
                })
                .collect();
            // Busy: a third of the devices whole and free, the rest partly used.
            let share: Vec<u32> = (0..8)
                .map(|_| match rng.below(3) {
                    0 => SHARE_CAPACITY,
                    _ => rng.below(u64::from(SHARE_CAPACITY)) as u32,
                })
                .collect();
            let memory = share
                .iter()
                .map(|&s| {
                    if s == SHARE_CAPACITY {
                        memory_mib
                    } else {
                        memory_mib * u64::from(s) / u64::from(SHARE_CAPACITY)
                    }
                })
                .collect();
            DeviceState::with_free(devices, share, memory).expect("valid bench devices")
        })
        .collect()
}

fn requests() -> Vec<(&'static str, DeviceRequest)> {
    let req = |demand, models: &[&str]| DeviceRequest {
        demand,
        models: models.iter().map(|m| m.to_string()).collect(),
    };
    vec![
        (
            "slice_500",
            req(
                GpuDemand::Slice {
                    share: 500,
                    memory_mib: 0,
                },
                &[],
            ),
        ),
        (
            "slice_300_8GiB",
            req(
                GpuDemand::Slice {
                    share: 300,
                    memory_mib: 8192,
                },
                &[],
            ),
        ),
        ("whole_4", req(GpuDemand::Whole { count: 4 }, &[])),
        (
            "whole_2_V100M32",
            req(GpuDemand::Whole { count: 2 }, &["V100M32"]),
        ),
    ]
}

fn bench_fit(c: &mut Criterion) {
    let mut group = c.benchmark_group("device_fit_10k_agents");
    let states = agents(10_000);
    let packed: Vec<PackedGpus> = states
        .iter()
        .map(|s| s.packed().expect("8 devices of 32 GiB fit a 128-bit word"))
        .collect();
    for (name, request) in requests() {
        let plain_count = states.iter().filter(|s| s.fits(&request)).count();
        let packed_count = packed.iter().filter(|p| p.fits(&request)).count();
        assert_eq!(
            plain_count, packed_count,
            "{name}: packed and plain disagree"
        );
        group.bench_with_input(BenchmarkId::new("vec", name), &request, |b, r| {
            b.iter(|| black_box(&states).iter().filter(|s| s.fits(r)).count())
        });
        group.bench_with_input(BenchmarkId::new("packed", name), &request, |b, r| {
            b.iter(|| black_box(&packed).iter().filter(|p| p.fits(r)).count())
        });
    }
    group.finish();
}

criterion_group!(benches, bench_fit);
criterion_main!(benches);
