//! `replay` mode: the trace as it happened, in virtual time.
//!
//! Each task arrives at its creation time and is placed at once if anything fits, else it
//! waits. At its deletion time a running task leaves and a waiting one gives up. Waiting tasks
//! are retried, oldest first, whenever a task leaves: since every other node only filled up
//! since they last failed, a waiting task can fit only on the node just freed, so the retry
//! checks that node alone before asking the policy (the policy still makes the decision, and
//! its latency is measured). Later arrivals do not wait behind the queue (backfill). Events at
//! the same time: departures first, then arrivals in trace order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use serde::Serialize;

use super::engine::{Placement, SimCluster, SimError, SimPolicy, Ties, Workload};
use super::policies::TargetWorkload;
use ringmaster_core::placement::RingsConfig;

/// Samples in the utilisation timeline.
pub const TIMELINE_POINTS: usize = 400;
const PLACEMENT_SEED: u64 = 42;

/// The cluster at one instant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Seconds from the trace's start.
    pub time: u64,
    pub cpu_pct: f64,
    pub memory_pct: f64,
    pub gpu_pct: f64,
    /// Expected fragmented GPU ÷ GPU capacity, in percent.
    pub fragmented_pct: f64,
    /// Tasks waiting.
    pub pending: usize,
}

/// One policy over the whole trace.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayRun {
    pub policy: String,
    pub tasks: usize,
    /// Placed on arrival.
    pub placed_at_once: usize,
    /// Placed after waiting.
    pub placed_after_wait: usize,
    /// Gave up at their deletion time, or still waiting when the trace ended.
    pub never_placed: usize,
    /// Over placed tasks (0 for those placed at once), seconds.
    pub wait_mean_s: f64,
    pub wait_p99_s: f64,
    pub timeline: Vec<TimelinePoint>,
    /// Per task (trace order): where and when it started, if it did.
    #[serde(skip)]
    pub outcomes: Vec<Outcome>,
    #[serde(skip)]
    pub decision_ns: Vec<u32>,
}

/// Where and when one task ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Index into the trace's nodes; `None` if it never ran.
    pub node: Option<usize>,
    pub start: Option<u64>,
}

enum Running {
    Waiting,
    On(Placement),
    Done,
}

/// Replays the whole trace on all nodes with one policy.
pub fn run_replay(
    workload: &Workload,
    target: &TargetWorkload,
    policy: SimPolicy,
    rings: &RingsConfig,
    ties: Ties,
) -> Result<ReplayRun, SimError> {
    let all: Vec<usize> = (0..workload.nodes.len()).collect();
    let mut cluster = SimCluster::new(workload, target, &all, policy, rings, ties, PLACEMENT_SEED);
    let tasks = &workload.tasks;
    let mut arrivals: Vec<usize> = (0..tasks.len()).collect();
    arrivals.sort_by_key(|&i| (tasks[i].creation, i));
    let end = tasks
        .iter()
        .map(|t| t.deletion.unwrap_or(t.creation).max(t.creation))
        .max()
        .unwrap_or(0);
    let step = (end / TIMELINE_POINTS as u64).max(1);
    let mut next_sample = 0u64;
    let mut timeline = Vec::with_capacity(TIMELINE_POINTS + 1);

    let mut state: Vec<Running> = tasks.iter().map(|_| Running::Waiting).collect();
    let mut leaving: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut waiting: BTreeMap<usize, usize> = BTreeMap::new(); // arrival seq → task
    let mut waits: Vec<u64> = Vec::with_capacity(tasks.len());
    let mut outcomes = vec![Outcome::default(); tasks.len()];
    let mut decision_ns = Vec::with_capacity(tasks.len());
    let (mut at_once, mut after_wait, mut gave_up) = (0, 0, 0);

    let place = |cluster: &mut SimCluster, task: usize, decision_ns: &mut Vec<u32>| {
        let shape = workload.task_shape[task];
        let start = Instant::now();
        let p = cluster.decide(shape);
        decision_ns.push(start.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        p
    };
    let mut next_arrival = 0;
    loop {
        let arrival_time = arrivals.get(next_arrival).map(|&i| tasks[i].creation);
        let departure_time = leaving.peek().map(|Reverse((t, _))| *t);
        let now = match (arrival_time, departure_time) {
            (None, None) => break,
            (Some(a), Some(d)) => a.min(d),
            (Some(a), None) => a,
            (None, Some(d)) => d,
        };
        while next_sample < now && next_sample <= end {
            timeline.push(sample(&cluster, next_sample, waiting.len()));
            next_sample += step;
        }
        if departure_time.is_some_and(|d| d <= now) {
            let Some(Reverse((_, task))) = leaving.pop() else {
                continue;
            };
            match std::mem::replace(&mut state[task], Running::Done) {
                Running::Waiting => {
                    waiting.retain(|_, t| *t != task);
                    gave_up += 1;
                }
                Running::On(p) => {
                    cluster.release(workload.task_shape[task], p)?;
                    // Retry the waiting tasks that fit the freed node, oldest first.
                    let mut placed = Vec::new();
                    for (&seq, &w) in &waiting {
                        if !cluster.fits(p.node, workload.task_shape[w]) {
                            continue;
                        }
                        if let Some(q) = place(&mut cluster, w, &mut decision_ns)? {
                            cluster.commit(workload.task_shape[w], q)?;
                            state[w] = Running::On(q);
                            outcomes[w] = Outcome {
                                node: Some(q.node),
                                start: Some(now),
                            };
                            waits.push(now - tasks[w].creation);
                            after_wait += 1;
                            placed.push(seq);
                        }
                    }
                    for seq in placed {
                        waiting.remove(&seq);
                    }
                }
                Running::Done => {}
            }
            continue;
        }
        let task = arrivals[next_arrival];
        next_arrival += 1;
        if let Some(d) = tasks[task].deletion {
            leaving.push(Reverse((d, task)));
        }
        match place(&mut cluster, task, &mut decision_ns)? {
            Some(p) => {
                cluster.commit(workload.task_shape[task], p)?;
                state[task] = Running::On(p);
                outcomes[task] = Outcome {
                    node: Some(p.node),
                    start: Some(now),
                };
                waits.push(0);
                at_once += 1;
            }
            None => {
                waiting.insert(next_arrival, task);
            }
        }
    }
    while next_sample <= end {
        timeline.push(sample(&cluster, next_sample, waiting.len()));
        next_sample += step;
    }
    waits.sort_unstable();
    let wait_mean_s = if waits.is_empty() {
        0.0
    } else {
        waits.iter().sum::<u64>() as f64 / waits.len() as f64
    };
    Ok(ReplayRun {
        policy: policy.name(),
        tasks: tasks.len(),
        placed_at_once: at_once,
        placed_after_wait: after_wait,
        never_placed: gave_up + waiting.len(),
        wait_mean_s,
        wait_p99_s: percentile(&waits, 0.99) as f64,
        timeline,
        outcomes,
        decision_ns,
    })
}

fn sample(cluster: &SimCluster, time: u64, pending: usize) -> TimelinePoint {
    let u = cluster.usage();
    let pct = |used: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * used as f64 / total as f64
        }
    };
    TimelinePoint {
        time,
        cpu_pct: pct(u.cpu_used, u.cpu_total),
        memory_pct: pct(u.memory_used, u.memory_total),
        gpu_pct: pct(u.gpu_used, u.gpu_total),
        fragmented_pct: if u.gpu_total == 0 {
            0.0
        } else {
            100.0 * cluster.fragmented_milli() / u.gpu_total as f64
        },
        pending,
    }
}

/// The nearest-rank percentile of sorted values (0 for none).
pub fn percentile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
