//! The simulator end to end: the openb trace loads whole, a tiny hand-checked trace gives exact
//! placements and metrics, runs are reproducible, and no policy ever over-commits a node.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use ringmaster::sim::engine::{Placement, SimCluster};
use ringmaster::sim::fill::{self, run_fill, FillSetup};
use ringmaster::sim::replay::{run_replay, Outcome};
use ringmaster::sim::trace::{load_nodes, load_tasks, Node, Task};
use ringmaster::sim::{SimPolicy, Ties, Workload};
use ringmaster_core::placement::RingsConfig;

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn openb() -> Workload {
    let nodes = load_nodes(&data("testdata/openb/openb_node_list_all_node.csv")).unwrap();
    let tasks = load_tasks(&data("testdata/openb/openb_pod_list_default.csv")).unwrap();
    Workload::new(nodes, tasks).unwrap()
}

fn tiny() -> Workload {
    let nodes = load_nodes(&data("tests/sim_data/tiny_nodes.csv")).unwrap();
    let tasks = load_tasks(&data("tests/sim_data/tiny_tasks.csv")).unwrap();
    Workload::new(nodes, tasks).unwrap()
}

#[test]
fn openb_loads_whole() {
    let w = openb();
    assert_eq!(w.nodes.len(), 1523);
    assert_eq!(w.tasks.len(), 8152);
    let gpu = fill::gpu_nodes(&w);
    assert_eq!(gpu.len(), 1213);
    assert_eq!(gpu.iter().map(|&i| w.nodes[i].gpus).sum::<u32>(), 6212);
    let shared = w
        .tasks
        .iter()
        .filter(|t| t.num_gpu == 1 && t.gpu_milli < 1000)
        .count();
    assert_eq!(shared, 3078);
    // The trace's GPU requests are about 98 % of the GPU nodes' capacity (SPEC).
    let asked: u64 = w.tasks.iter().map(Task::gpu_total_milli).sum();
    assert_eq!(asked, 6_086_800);
}

fn starts(outcomes: &[Outcome]) -> Vec<(Option<usize>, Option<u64>)> {
    outcomes.iter().map(|o| (o.node, o.start)).collect()
}

/// Worked by hand in docs/simulator.md ("A worked example").
#[test]
fn tiny_trace_by_hand() {
    let w = tiny();
    let target = w.target();
    let rings = RingsConfig::default();
    // Empty cluster: node a strands all 2000 milli for the V100-only shape and for the
    // CPU-only shape, node b its 1000 for the CPU-only shape: (4000 + 1000) / 5 shapes.
    let cluster = SimCluster::new(
        &w,
        &target,
        &[0, 1],
        "fgd".parse().unwrap(),
        &rings,
        Ties::First,
        1,
    );
    assert_eq!(cluster.fragmented_milli(), 1000.0);

    let best_fit = run_replay(
        &w,
        &target,
        "best-fit".parse().unwrap(),
        &rings,
        Ties::First,
    )
    .unwrap();
    assert_eq!(
        starts(&best_fit.outcomes),
        [
            (Some(1), Some(0)),
            (Some(0), Some(1)),
            (Some(0), Some(2)),
            (Some(1), Some(10)),
            (Some(1), Some(4)),
        ]
    );
    assert_eq!(
        (
            best_fit.placed_at_once,
            best_fit.placed_after_wait,
            best_fit.never_placed
        ),
        (4, 1, 0)
    );
    assert_eq!((best_fit.wait_mean_s, best_fit.wait_p99_s), (1.4, 7.0));

    // SPEC seed 001's plain search: t0 → a (cpus dominant by name on a tie, best fit upward),
    // t1 → b, so t3 waits for t1 to leave at 20.
    let seed = "ring-seed001".parse().unwrap();
    let ring = run_replay(&w, &target, seed, &rings, Ties::First).unwrap();
    assert_eq!(
        starts(&ring.outcomes),
        [
            (Some(0), Some(0)),
            (Some(1), Some(1)),
            (Some(0), Some(2)),
            (Some(1), Some(20)),
            (Some(1), Some(4)),
        ]
    );
    assert_eq!((ring.wait_mean_s, ring.wait_p99_s), (3.4, 17.0));
    let last = ring.timeline.last().unwrap();
    assert_eq!((last.cpu_pct, last.gpu_pct, last.pending), (0.0, 0.0, 0));

    // The default ring ranks a slice's candidates by the share fill first (t0's 0.5 leaves 0.5
    // on either node, a popular size: no growth), then by unfed GPU: on a, 2 cpus would be left
    // for 1.5 free GPUs, which at the trace's 7 cpus per 3.1 GPUs feed 0.88 (+0.39 unfed), on b
    // 6 cpus for 0.5 GPU (none). FGD's score, which sees that t3 needs b's V100 whole, only
    // comes third: t0 → b, t1 and t2 → a, and t3 waits until t0 leaves at 10 (as under
    // best-fit). Before the share fill (FGD's score first) t0 went to a and t3 waited 2 s.
    let ring = run_replay(&w, &target, "ring".parse().unwrap(), &rings, Ties::First).unwrap();
    assert_eq!(
        starts(&ring.outcomes),
        [
            (Some(1), Some(0)),
            (Some(0), Some(1)),
            (Some(0), Some(2)),
            (Some(1), Some(10)),
            (Some(1), Some(4)),
        ]
    );
    assert_eq!((ring.wait_mean_s, ring.wait_p99_s), (1.4, 7.0));
}

/// A slice of openb small enough for a debug-build test.
fn openb_slice() -> Workload {
    let w = openb();
    let nodes: Vec<Node> = fill::gpu_nodes(&w)
        .into_iter()
        .step_by(20)
        .map(|i| w.nodes[i].clone())
        .collect();
    let tasks: Vec<Task> = w.tasks.iter().step_by(20).cloned().collect();
    Workload::new(nodes, tasks).unwrap()
}

#[test]
fn fill_is_reproducible_and_seeds_matter() {
    let w = openb_slice();
    let target = w.target();
    let nodes = fill::gpu_nodes(&w);
    let rings = RingsConfig::default();
    for policy in SimPolicy::all() {
        for ties in [Ties::First, Ties::Random] {
            let setup = FillSetup {
                workload: &w,
                target: &target,
                nodes: &nodes,
                rings: &rings,
                ties,
                inflation_pct: 130,
            };
            let run = |seed| run_fill(&setup, policy, seed).unwrap();
            let (a, b) = (run(42), run(42));
            assert_eq!(a.curve, b.curve, "{policy}");
            assert_eq!(a.tasks_failed, b.tasks_failed, "{policy}");
            assert_eq!(a.curve.len(), 131, "{policy}");
            assert_eq!(a.curve[0].unallocated_pct, 100.0);
            let at100 = a.at(100).unwrap();
            assert!(at100.unallocated_pct >= 0.0 && at100.unallocated_pct < 100.0);
            assert_ne!(
                a.curve,
                run(43).curve,
                "{policy}: another seed, another order"
            );
        }
    }
}

fn node_strategy() -> impl Strategy<Value = Node> {
    (
        1u64..=16,
        1u64..=8,
        prop::sample::select(vec![0u32, 1, 2, 4, 8]),
        0usize..3,
    )
        .prop_map(|(cpus, mem, gpus, model)| Node {
            name: String::new(),
            cpu_milli: cpus * 1000,
            memory_mib: mem * 1024,
            gpus,
            model: ["", "A", "B"][model].to_string(),
        })
}

fn task_strategy() -> impl Strategy<Value = Task> {
    (
        1u64..=8000,
        0u64..=4096,
        prop::sample::select(vec![0u32, 1, 1, 1, 2, 4]),
        prop::sample::select(vec![100u32, 250, 460, 500, 810, 1000, 1000]),
        0usize..3,
    )
        .prop_map(|(cpu, mem, num_gpu, gpu_milli, spec)| Task {
            name: String::new(),
            cpu_milli: cpu,
            memory_mib: mem,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
            gpu_spec: [vec![], vec!["A".to_string()], vec!["A".into(), "B".into()]][spec].clone(),
            priority: 0,
            creation: 0,
            deletion: None,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every policy, on random small clusters and tasks, with tasks leaving at random: what it
    /// placed on each node never exceeds the node's cpu, memory, or any GPU's 1000 milli, and it
    /// refuses a task only when no node fits it.
    #[test]
    fn no_policy_over_commits(
        mut nodes in prop::collection::vec(node_strategy(), 1..6),
        tasks in prop::collection::vec(task_strategy(), 1..40),
        leave in prop::collection::vec(any::<bool>(), 40),
        seed in 0u64..1000,
    ) {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
        }
        let w = Workload::new(nodes, tasks).unwrap();
        let target = w.target();
        let all: Vec<usize> = (0..w.nodes.len()).collect();
        for policy in SimPolicy::all() {
            let mut cluster = SimCluster::new(&w, &target, &all, policy, &RingsConfig::default(), Ties::Random, seed);
            let mut running: Vec<(usize, Placement)> = Vec::new();
            for (t, &shape) in w.task_shape.iter().enumerate() {
                match cluster.decide(shape).unwrap() {
                    Some(p) => {
                        prop_assert!(cluster.fits(p.node, shape), "{policy} chose a node that does not fit");
                        cluster.commit(shape, p).unwrap();
                        running.push((t, p));
                    }
                    None => prop_assert!(
                        (0..all.len()).all(|n| !cluster.fits(n, shape)),
                        "{policy} refused a task that fits"
                    ),
                }
                if leave[t] && !running.is_empty() {
                    let (gone, p) = running.remove(seed as usize % running.len());
                    cluster.release(w.task_shape[gone], p).unwrap();
                }
                // Independent accounting from the placements alone.
                for (n, node) in w.nodes.iter().enumerate() {
                    let here: Vec<&(usize, Placement)> = running.iter().filter(|(_, p)| p.node == n).collect();
                    let cpu: u64 = here.iter().map(|(t, _)| w.tasks[*t].cpu_milli).sum();
                    let mem: u64 = here.iter().map(|(t, _)| w.tasks[*t].memory_mib).sum();
                    prop_assert!(cpu <= node.cpu_milli && mem <= node.memory_mib, "{policy}");
                    for g in 0..node.gpus as usize {
                        let used: u32 = here
                            .iter()
                            .filter(|(_, p)| p.gpus & (1 << g) != 0)
                            .map(|(t, _)| w.tasks[*t].gpu_milli)
                            .sum();
                        prop_assert!(used <= 1000, "{policy}: GPU {g} of node {n} holds {used}");
                    }
                    let model_ok = here.iter().all(|(t, _)| {
                        let spec = &w.tasks[*t].gpu_spec;
                        w.tasks[*t].num_gpu == 0 || spec.is_empty() || spec.contains(&node.model)
                    });
                    prop_assert!(model_ok, "{policy}: GPU model");
                    prop_assert_eq!(cluster.nodes()[n].cpu_free, node.cpu_milli - cpu);
                }
            }
        }
    }
}

/// Regression for issue 10: on a fixed slice of openb, the default `ring` (sparing, upward-only
/// gpus ring, FGD-scored tie-break) leaves no more GPU unallocated at 100 % arrived than the
/// paper's best-fit, summed over seeds 42–51; the seed's plain search is kept reachable as
/// `ring-seed001` and is worse. Deterministic: no timing.
#[test]
fn default_ring_strands_no_more_than_best_fit_on_an_openb_slice() {
    let w = openb_slice();
    let target = w.target();
    let nodes = fill::gpu_nodes(&w);
    let rings = RingsConfig::default();
    let setup = FillSetup {
        workload: &w,
        target: &target,
        nodes: &nodes,
        rings: &rings,
        ties: Ties::First,
        inflation_pct: 100,
    };
    let stranded = |policy: &str| -> f64 {
        (42..52)
            .map(|seed| {
                let run = run_fill(&setup, policy.parse().unwrap(), seed).unwrap();
                run.at(100).unwrap().unallocated_pct
            })
            .sum()
    };
    let (ring, best_fit, seed) = (
        stranded("ring"),
        stranded("best-fit"),
        stranded("ring-seed001"),
    );
    assert!(ring <= best_fit, "ring {ring:.2} vs best-fit {best_fit:.2}");
    assert!(ring < seed, "ring {ring:.2} vs ring-seed001 {seed:.2}");
}
