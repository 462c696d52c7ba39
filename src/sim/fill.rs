//! `fill` mode: the protocol of the ATC'23 "Beware of Fragmentation" paper.
//!
//! Only the GPU nodes take part. The trace's tasks arrive in a seeded random order, then tasks
//! drawn at random with replacement from the same list follow until the GPU asked for reaches
//! `inflation` (130 %) of the cluster's GPU capacity. Tasks are placed one at a time and never
//! leave; a task that fits nowhere fails and is not retried. Arrived, allocated and fragmented
//! GPU are recorded, as shares of capacity, each time arrived GPU crosses a whole percent.

use std::time::Instant;

use rand::seq::SliceRandom;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::engine::{SimCluster, SimError, SimPolicy, Ties, Workload};
use super::policies::TargetWorkload;
use ringmaster_core::placement::RingsConfig;

/// Arrived GPU at which `fill` stops, in percent of capacity (the paper's inflation 1.3).
pub const DEFAULT_INFLATION_PCT: u32 = 130;
/// The paper's first seed; `--seeds N` runs seeds 42 … 42+N−1.
pub const FIRST_SEED: u64 = 42;
/// Mixed into the seed for the placement generator (ties, `random`), so it is a different
/// stream from the arrival order's.
const PLACEMENT_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;

/// The cluster when arrived GPU first reached `arrived_pct` % of capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FillPoint {
    pub arrived_pct: u32,
    /// GPU placed ÷ capacity, in percent.
    pub allocated_pct: f64,
    /// 100 − allocated.
    pub unallocated_pct: f64,
    /// Expected fragmented GPU (against the trace's task shapes) ÷ capacity, in percent.
    pub fragmented_pct: f64,
}

/// One policy, one seed.
#[derive(Clone, Debug, Serialize)]
pub struct FillRun {
    pub policy: String,
    pub seed: u64,
    pub tasks_arrived: usize,
    pub tasks_failed: usize,
    /// Capacity of the GPU nodes, in milli-GPU.
    pub gpu_capacity_milli: u64,
    /// One point per whole percent of arrived GPU, 0 … inflation.
    pub curve: Vec<FillPoint>,
    /// Wall time of each placement decision, nanoseconds.
    #[serde(skip)]
    pub decision_ns: Vec<u32>,
}

impl FillRun {
    /// The point at `arrived_pct`, if the run got there.
    pub fn at(&self, arrived_pct: u32) -> Option<&FillPoint> {
        self.curve.iter().find(|p| p.arrived_pct == arrived_pct)
    }
}

/// Indices of the nodes with GPUs.
pub fn gpu_nodes(workload: &Workload) -> Vec<usize> {
    (0..workload.nodes.len())
        .filter(|&i| workload.nodes[i].gpus > 0)
        .collect()
}

/// The arrival order for one seed: every task once, shuffled, then draws with replacement until
/// the GPU asked for reaches `inflation_pct` % of `capacity_milli`. Empty when no task asks for
/// a GPU (the target could never be reached).
pub fn arrival_order(
    workload: &Workload,
    seed: u64,
    capacity_milli: u64,
    inflation_pct: u32,
) -> Vec<usize> {
    let tasks = &workload.tasks;
    if tasks.iter().all(|t| t.gpu_total_milli() == 0) {
        return Vec::new();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.shuffle(&mut rng);
    let goal = u128::from(capacity_milli) * u128::from(inflation_pct);
    let mut asked: u128 = order
        .iter()
        .map(|&i| u128::from(tasks[i].gpu_total_milli()) * 100)
        .sum();
    while asked < goal {
        let i = rng.random_range(0..tasks.len());
        asked += u128::from(tasks[i].gpu_total_milli()) * 100;
        order.push(i);
    }
    order
}

/// What every `fill` run of a comparison shares.
#[derive(Clone, Copy, Debug)]
pub struct FillSetup<'a> {
    pub workload: &'a Workload,
    pub target: &'a TargetWorkload,
    /// The GPU nodes ([`gpu_nodes`]).
    pub nodes: &'a [usize],
    pub rings: &'a RingsConfig,
    pub ties: Ties,
    pub inflation_pct: u32,
}

/// Runs one policy for one seed.
pub fn run_fill(setup: &FillSetup, policy: SimPolicy, seed: u64) -> Result<FillRun, SimError> {
    let FillSetup {
        workload,
        target,
        nodes,
        rings,
        ties,
        inflation_pct,
    } = *setup;
    let mut cluster = SimCluster::new(
        workload,
        target,
        nodes,
        policy,
        rings,
        ties,
        seed ^ PLACEMENT_STREAM,
    );
    let capacity = cluster.usage().gpu_total;
    let order = arrival_order(workload, seed, capacity, inflation_pct);
    let pct = |milli: f64| 100.0 * milli / capacity.max(1) as f64;
    let point = |cluster: &SimCluster, arrived_pct: u32| {
        let allocated_pct = pct(cluster.usage().gpu_used as f64);
        FillPoint {
            arrived_pct,
            allocated_pct,
            unallocated_pct: 100.0 - allocated_pct,
            fragmented_pct: pct(cluster.fragmented_milli()),
        }
    };
    let mut curve = vec![point(&cluster, 0)];
    let mut decision_ns = Vec::with_capacity(order.len());
    let mut arrived: u128 = 0;
    let mut failed = 0;
    for &task in &order {
        let shape = workload.task_shape[task];
        let start = Instant::now();
        let placement = cluster.decide(shape)?;
        decision_ns.push(start.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        match placement {
            Some(p) => cluster.commit(shape, p)?,
            None => failed += 1,
        }
        arrived += u128::from(workload.tasks[task].gpu_total_milli());
        loop {
            let next = curve.len() as u32;
            if next > inflation_pct || arrived * 100 < u128::from(next) * u128::from(capacity) {
                break;
            }
            curve.push(point(&cluster, next));
        }
    }
    Ok(FillRun {
        policy: policy.name(),
        seed,
        tasks_arrived: order.len(),
        tasks_failed: failed,
        gpu_capacity_milli: capacity,
        curve,
        decision_ns,
    })
}
