//! Expected GPU fragmentation against a target workload (FGD's measure), for the ring search's
//! scored tie-break in the simulator and in the master.
//!
//! Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
//! Fragmentation Gradient Descent", USENIX ATC 2023, section 4, as restated in SPEC.md
//! ("Comparing with the ATC'23 paper"). A node's fragment is the free GPU share that the tasks
//! expected to arrive (the target workload, weighted by frequency) could not use; placing a task
//! is better the less it grows that fragment. The ring search finds K equally good candidates
//! by its buckets but cannot see per-GPU free shares; this score can, so it is the tie-break the
//! caller hands the ring ([`AgentScore`]). The simulator's FGD policy and its ring both use the
//! code here; the master scores with [`DeviceFragmentScore`], learning its target workload from
//! recent launches ([`ShapeWindow`]). Pure and deterministic: no clock, no I/O.

use std::collections::{HashMap, VecDeque};

use crate::devices::{
    select_shares_by_cost, DeviceRequest, DeviceSelection, DeviceState, GpuDemand, ShareFill,
    MAX_PICK_DEVICES,
};
use crate::resources::Resources;

use super::devices::DeviceBook;
use super::placers::context::AgentScore;
use super::AgentKey;

/// A whole GPU, in milli-GPU.
pub const WHOLE_GPU_MILLI: u32 = 1000;
/// FGD keeps the most frequent task shapes that together cover this share of the tasks.
pub const TARGET_COVERAGE: f64 = 0.95;
/// How many recent launches the master learns its target workload from.
pub const LAUNCH_WINDOW: usize = 1000;
/// GPUs a pick mask can name (bit i = GPU i).
const MAX_PICK_GPUS: usize = MAX_PICK_DEVICES;

/// Nodes of up to this many GPUs get their fragment from small sorted arrays on the stack (the
/// simulator's and the scored tie-break's hot path); larger ones by a pass per shape.
const SORTED_GPUS: usize = 16;

/// A task as the fragment measure sees it: cpu, GPU count, share per GPU and allowed models
/// (memory is not part of the fragment, as in the paper: a target workload groups shapes
/// without it), and memory, for the [`GpuFeed`] the target learns. Field order is the tie order
/// of equally frequent shapes in a target workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskShape {
    pub cpu_milli: u64,
    /// GPUs asked for (0: none).
    pub num_gpu: u32,
    /// Milli-GPU wanted on each of them (1000 for whole GPUs).
    pub gpu_milli: u32,
    /// Bit i set = may run on GPU model i; 0 = any model.
    pub models: u64,
    /// Memory asked for, MiB (only the [`GpuFeed`] reads it).
    pub memory_mib: u64,
}

impl TaskShape {
    /// Total milli-GPU asked for.
    pub fn gpu_total_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// The shape of a demand in task scalars (`cpus`, `gpus` / `gpu_milli` / `gpu_mem`), any
    /// model; `None` when its GPU part is ambiguous ([`DeviceRequest::from_scalars`]).
    pub fn of_demand(demand: &Resources) -> Option<TaskShape> {
        let request = DeviceRequest::from_scalars(demand, Vec::new()).ok()?;
        let (num_gpu, gpu_milli) = match request.map(|r| r.demand) {
            None => (0, 0),
            Some(GpuDemand::Whole { count }) => (count, WHOLE_GPU_MILLI),
            Some(GpuDemand::Slice { share, .. }) => (1, share),
        };
        Some(TaskShape {
            cpu_milli: demand.milli("cpus"),
            num_gpu,
            gpu_milli,
            models: 0,
            memory_mib: demand.milli("mem") / crate::resources::MILLI,
        })
    }

    /// Whether `model` (an index, `None` = unknown) is allowed.
    fn model_allowed(&self, model: Option<u32>) -> bool {
        self.models == 0 || model.is_some_and(|m| m < 64 && self.models & (1 << m) != 0)
    }
}

/// One shape of the target workload with how many tasks have it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TargetShape {
    shape: TaskShape,
    weight: u64,
}

/// The target workload of FGD: the most frequent task shapes covering ≥ 95 % of the tasks
/// counted, each weighted by its frequency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetWorkload {
    shapes: Vec<TargetShape>,
    total_weight: u64,
    feed: GpuFeed,
    fill: ShareFill,
    /// The GPU shapes a node of a model no kept shape names may run (those naming no model),
    /// grouped for [`node_fragment`](Self::node_fragment).
    groups: Vec<FragmentGroup>,
    /// Bit m: some kept GPU shape names model m (below 64).
    named_models: u64,
    /// For each model m of `named_models`, at index m: the GPU shapes a node of model m may
    /// run, grouped with their model lists left out (for that node they are alike), so a
    /// node's fragment passes only the groups that count for it. Empty when no shape names a
    /// model.
    model_groups: Vec<Vec<FragmentGroup>>,
}

/// The kept GPU shapes that ask for the same GPUs (count, per-GPU share, models), by cpu: a
/// node either holds that GPU request or not, and then each of them that also gets its cpu
/// strands the same free GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FragmentGroup {
    /// The GPU request (cpu 0, memory 0).
    gpus: TaskShape,
    /// (cpu milli, the summed weight of the group's shapes asking for at most that much cpu),
    /// cpu ascending.
    by_cpu: Vec<(u64, u64)>,
}

impl FragmentGroup {
    /// Groups the GPU shapes among `shapes` that a node of `model` may run, in a fixed order;
    /// with `model`, their model lists are left out of the groups.
    fn of(shapes: &[TargetShape], model: Option<u32>) -> Vec<FragmentGroup> {
        let mut gpu: Vec<(TaskShape, u64, u64)> = shapes
            .iter()
            .filter(|t| t.shape.num_gpu > 0 && t.shape.model_allowed(model))
            .map(|t| {
                let gpus = TaskShape {
                    cpu_milli: 0,
                    memory_mib: 0,
                    models: if model.is_some() { 0 } else { t.shape.models },
                    ..t.shape
                };
                (gpus, t.shape.cpu_milli, t.weight)
            })
            .collect();
        gpu.sort();
        let mut groups: Vec<FragmentGroup> = Vec::new();
        for (gpus, cpu, weight) in gpu {
            match groups.last_mut() {
                Some(g) if g.gpus == gpus => {
                    let sum = g.by_cpu.last().map_or(0, |&(_, w)| w) + weight;
                    match g.by_cpu.last_mut() {
                        Some(last) if last.0 == cpu => last.1 = sum,
                        _ => g.by_cpu.push((cpu, sum)),
                    }
                }
                _ => groups.push(FragmentGroup {
                    gpus,
                    by_cpu: vec![(cpu, weight)],
                }),
            }
        }
        groups
    }
}

impl TargetWorkload {
    /// From the shapes of every task (one entry per task).
    pub fn from_tasks<T: Into<TaskShape>>(tasks: impl IntoIterator<Item = T>) -> Self {
        let mut counts: HashMap<TaskShape, u64> = HashMap::new();
        for t in tasks {
            *counts.entry(t.into()).or_default() += 1;
        }
        Self::from_counts(counts)
    }

    /// From shapes with their task counts (a shape may repeat; counts add up). Shapes that
    /// differ only in memory are one shape of the fragment measure; every counted task, kept
    /// shape or not, goes into the [`GpuFeed`] and, if it is a slice of one GPU, the
    /// [`ShareFill`].
    pub fn from_counts(counts: impl IntoIterator<Item = (TaskShape, u64)>) -> Self {
        let mut merged: HashMap<TaskShape, u64> = HashMap::new();
        let mut feed = FeedSums::default();
        let mut slices: Vec<(u32, u64)> = Vec::new();
        for (shape, count) in counts {
            feed.add(&shape, count);
            if shape.num_gpu == 1 && shape.gpu_milli < WHOLE_GPU_MILLI {
                slices.push((shape.gpu_milli, count));
            }
            let shape = TaskShape {
                memory_mib: 0,
                ..shape
            };
            *merged.entry(shape).or_default() += count;
        }
        let all: u64 = merged.values().sum();
        let mut sorted: Vec<(TaskShape, u64)> =
            merged.into_iter().filter(|(_, c)| *c > 0).collect();
        // Most frequent first; equal counts in a fixed order so the target is deterministic.
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut shapes = Vec::new();
        let mut covered = 0u64;
        for (shape, weight) in sorted {
            if covered as f64 >= TARGET_COVERAGE * all as f64 {
                break;
            }
            covered += weight;
            shapes.push(TargetShape { shape, weight });
        }
        let named_models = shapes
            .iter()
            .filter(|t| t.shape.num_gpu > 0)
            .fold(0, |named, t| named | t.shape.models);
        let model_groups = match named_models {
            0 => Vec::new(),
            _ => (0..64u32)
                .map(|m| match named_models & 1 << m {
                    0 => Vec::new(),
                    _ => FragmentGroup::of(&shapes, Some(m)),
                })
                .collect(),
        };
        TargetWorkload {
            groups: FragmentGroup::of(&shapes, None),
            named_models,
            model_groups,
            shapes,
            total_weight: covered,
            feed: feed.ratio(),
            fill: ShareFill::from_counts(slices),
        }
    }

    /// Whether some of the target's GPU shapes may run on some GPU models only: then the
    /// fragment of a node depends on its model, and nodes of a model few shapes need are worth
    /// offering to the score beside the best fits ([`AgentScore::ranks_largest`]).
    pub fn names_models(&self) -> bool {
        self.named_models != 0
    }

    /// The groups that count for a node of `model` ([`TargetWorkload::model_groups`]).
    fn groups_for(&self, model: Option<u32>) -> &[FragmentGroup] {
        match model.filter(|&m| m < 64 && self.named_models & 1 << m != 0) {
            Some(m) => &self.model_groups[m as usize],
            None => &self.groups,
        }
    }

    /// Which GPU a slice should take, from the target's popular slice sizes ([`ShareFill`]).
    pub fn share_fill(&self) -> &ShareFill {
        &self.fill
    }

    /// What the target's GPU tasks bring per GPU ([`GpuFeed`]).
    pub fn feed(&self) -> GpuFeed {
        self.feed
    }

    /// Number of shapes kept.
    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// Whether any kept shape asks for a GPU (without one, every fragment growth is 0).
    pub fn has_gpu_shape(&self) -> bool {
        self.shapes.iter().any(|s| s.shape.num_gpu > 0)
    }

    /// Sum of the kept shapes' weights (the divisor of [`node_fragment`](Self::node_fragment)).
    pub fn total_weight(&self) -> u64 {
        self.total_weight
    }

    /// The node's expected GPU fragment, weighted: Σ over target shapes of weight × fragment,
    /// where a shape's fragment is
    /// - all free GPU milli when the shape asks for no GPU (it can use none of it), or does not
    ///   fit the node (cpu, GPU model, or too few GPUs with its per-GPU share free);
    /// - else the free milli on GPUs with less free than its per-GPU share.
    ///
    /// Divide by [`total_weight`](Self::total_weight) for milli-GPU.
    pub fn node_fragment(&self, cpu_free: u64, gpu_free: &[u32], model: Option<u32>) -> u64 {
        if gpu_free.len() > SORTED_GPUS {
            return self.node_fragment_scan(cpu_free, gpu_free, model);
        }
        // The free amounts largest first, with running sums: the GPUs that hold a per-GPU
        // share are a prefix, found by a binary search instead of a pass over the GPUs.
        let mut sorted = [0u32; SORTED_GPUS];
        let sorted = &mut sorted[..gpu_free.len()];
        sorted.copy_from_slice(gpu_free);
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut prefix = [0u64; SORTED_GPUS + 1];
        for (i, &g) in sorted.iter().enumerate() {
            prefix[i + 1] = prefix[i] + u64::from(g);
        }
        let total = prefix[sorted.len()];
        if total == 0 {
            return 0;
        }
        // Every shape strands all free GPU but those that fit, which strand all but the free
        // GPU on the GPUs holding their share: subtract that part, by group.
        let mut kept = 0u64;
        for FragmentGroup { gpus, by_cpu } in self.groups_for(model) {
            let usable = sorted.partition_point(|&g| g >= gpus.gpu_milli);
            if usable < gpus.num_gpu as usize {
                continue;
            }
            let fed = by_cpu.partition_point(|&(cpu, _)| cpu <= cpu_free);
            if let Some(&(_, weight)) = fed.checked_sub(1).and_then(|i| by_cpu.get(i)) {
                kept += weight * prefix[usable];
            }
        }
        self.total_weight * total - kept
    }

    /// [`node_fragment`](Self::node_fragment) by a pass over the GPUs per shape: for nodes of
    /// more than [`SORTED_GPUS`] GPUs, and the reference the fast form is tested against.
    fn node_fragment_scan(&self, cpu_free: u64, gpu_free: &[u32], model: Option<u32>) -> u64 {
        let total: u64 = gpu_free.iter().map(|&g| u64::from(g)).sum();
        if total == 0 {
            return 0;
        }
        let mut weighted = 0u64;
        for TargetShape { shape: s, weight } in &self.shapes {
            let fragment = if s.num_gpu == 0 || cpu_free < s.cpu_milli || !s.model_allowed(model) {
                total
            } else {
                let mut usable = 0u32;
                let mut stranded = 0u64;
                for &g in gpu_free {
                    if g >= s.gpu_milli {
                        usable += 1;
                    } else {
                        stranded += u64::from(g);
                    }
                }
                if usable >= s.num_gpu {
                    stranded
                } else {
                    total
                }
            };
            weighted += weight * fragment;
        }
        weighted
    }

    /// [`node_fragment`](Self::node_fragment) of a node without a known GPU model.
    pub fn fragment(&self, cpu_free: u64, gpu_free: &[u32]) -> u64 {
        self.node_fragment(cpu_free, gpu_free, None)
    }

    /// How much the fragment grows (negative: shrinks) when `shape` takes its cpu and its
    /// per-GPU share from each GPU at `positions`; `before` is the node's current fragment.
    /// `None` when it does not fit there (cpu, model, a GPU short or out of range, or not
    /// `num_gpu` positions).
    pub fn growth(
        &self,
        cpu_free: u64,
        gpu_free: &[u32],
        model: Option<u32>,
        shape: &TaskShape,
        positions: &[usize],
        before: u64,
    ) -> Option<i64> {
        let cpu_after = cpu_free.checked_sub(shape.cpu_milli)?;
        if positions.len() != shape.num_gpu as usize
            || (shape.num_gpu > 0 && !shape.model_allowed(model))
        {
            return None;
        }
        // On the stack for nodes of up to 64 GPUs (the simulator's hot path).
        let mut stack = [0u32; MAX_PICK_GPUS];
        let mut heap = Vec::new();
        let after: &mut [u32] = if gpu_free.len() <= MAX_PICK_GPUS {
            &mut stack[..gpu_free.len()]
        } else {
            heap.resize(gpu_free.len(), 0);
            &mut heap
        };
        after.copy_from_slice(gpu_free);
        for &i in positions {
            let g = after.get_mut(i)?;
            *g = g.checked_sub(shape.gpu_milli)?;
        }
        let fragment = self.node_fragment(cpu_after, after, model);
        Some(fragment as i64 - before as i64)
    }

    /// FGD for one node: the least growth of the fragment over every distinct way to place
    /// `shape` on its GPUs, with those GPUs (bit i = GPU i). The ways are the core's
    /// [`select_shares_by_cost`]: for a shared GPU each distinct free amount that holds it,
    /// otherwise the best fit (whole GPUs are interchangeable). `None` when the shape does not
    /// fit or the node has more than 64 GPUs.
    pub fn least_growth(
        &self,
        cpu_free: u64,
        gpu_free: &[u32],
        model: Option<u32>,
        shape: &TaskShape,
        before: u64,
    ) -> Option<(i64, u64)> {
        self.least_cost(cpu_free, gpu_free, model, shape, before, |growth| growth)
    }

    /// The way to place `shape` on the node's GPUs ([`select_shares_by_cost`]'s ways, equal
    /// costs keep the earlier) with the least `cost` of its growth: that cost and the GPUs.
    fn least_cost(
        &self,
        cpu_free: u64,
        gpu_free: &[u32],
        model: Option<u32>,
        shape: &TaskShape,
        before: u64,
        cost: impl Fn(i64) -> i64,
    ) -> Option<(i64, u64)> {
        if gpu_free.len() > MAX_PICK_GPUS {
            return None;
        }
        let mut positions = [0usize; MAX_PICK_GPUS];
        select_shares_by_cost(gpu_free, shape.num_gpu, shape.gpu_milli, |pick| {
            // The set bits, lowest first (a pick holds at most MAX_PICK_GPUS bits).
            let mut len = 0;
            let mut bits = pick;
            while bits != 0 && len < MAX_PICK_GPUS {
                positions[len] = bits.trailing_zeros() as usize;
                len += 1;
                bits &= bits - 1;
            }
            self.growth(cpu_free, gpu_free, model, shape, &positions[..len], before)
                .map(&cost)
        })
    }
}

/// The node score of the FGD paper's simulator for a fragment change of `delta_milli` =
/// F_before − F_after (expected fragment in milli-GPU; positive when placing the task shrinks
/// it): `int64(100 · sigmoid(delta_milli / 1000))` with sigmoid(x) = 1 / (1 + e^−x), an integer
/// 0–99 truncated toward zero, higher is better. ΔF in [0, 40.005) scores 50, [−40.005, 0) 49;
/// the buckets widen away from 0 (any ΔF over ≈ 4,595 scores 99, below ≈ −4,595 scores 0).
pub fn fgd_quantised_score(delta_milli: f64) -> i64 {
    let sigmoid = 1.0 / (1.0 + (-delta_milli / 1000.0).exp());
    (100.0 * sigmoid) as i64
}

impl TargetWorkload {
    /// [`fgd_quantised_score`] of a weighted growth from [`growth`](Self::growth) (the
    /// fragment after minus before, weighted; divided here by the total weight for milli-GPU).
    pub fn quantised_score(&self, growth: i64) -> i64 {
        let weight = self.total_weight.max(1) as f64;
        fgd_quantised_score(-(growth as f64) / weight)
    }

    /// FGD as the paper's simulator scores one node: the highest [`quantised_score`]
    /// (Self::quantised_score) over the ways to place `shape` on its GPUs, with those GPUs
    /// (bit i = GPU i). The ways are [`select_shares_by_cost`]'s in index order and equal scores
    /// keep the earlier: a shared GPU is the lowest index with the maximum score, whole GPUs
    /// the lowest-index free ones. `None` when the shape does not fit or the node has more than
    /// 64 GPUs.
    pub fn best_quantised(
        &self,
        cpu_free: u64,
        gpu_free: &[u32],
        model: Option<u32>,
        shape: &TaskShape,
        before: u64,
    ) -> Option<(i64, u64)> {
        self.least_cost(cpu_free, gpu_free, model, shape, before, |growth| {
            -self.quantised_score(growth)
        })
        .map(|(cost, pick)| (-cost, pick))
    }
}

// ------------------------------------------------------------------ GPUs left unfed

/// The cpu and memory the expected GPU tasks bring with each whole GPU they ask for (Σ cpu ÷
/// Σ GPU and Σ memory ÷ Σ GPU over the target's GPU tasks, weighted by count): how much of each
/// a node must keep per free GPU for those GPUs to stay usable. A node whose free GPU outruns
/// its free cpu or memory at these rates has GPUs nothing expected can use; placing a task is
/// better the less it grows that unfed share ([`unfed_growth`](Self::unfed_growth)). The
/// ring's scored tie-break ranks equal FGD scores by it (docs/placement.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFeed {
    /// Milli-cpu per whole GPU (0: no GPU task counted, cpu never limits).
    pub cpu_milli_per_gpu: u64,
    /// MiB per whole GPU (0: memory never limits).
    pub memory_mib_per_gpu: u64,
}

impl GpuFeed {
    /// Milli-GPU of `gpu_free_milli` that `cpu_free` (milli-cpu) and `memory_free` (MiB) cannot
    /// feed at these rates: free GPU minus the GPU the scarcer of the two can feed, at least 0.
    pub fn unfed(&self, cpu_free: u64, memory_free: u64, gpu_free_milli: u64) -> u64 {
        let fed = |free: u64, per_gpu: u64| match per_gpu {
            0 => u64::MAX,
            // In u64 when the product fits (a 128-bit division is a library call), else in u128.
            per => match free.checked_mul(u64::from(WHOLE_GPU_MILLI)) {
                Some(product) => product / per,
                None => {
                    u64::try_from(u128::from(free) * u128::from(WHOLE_GPU_MILLI) / u128::from(per))
                        .unwrap_or(u64::MAX)
                }
            },
        };
        let fed =
            fed(cpu_free, self.cpu_milli_per_gpu).min(fed(memory_free, self.memory_mib_per_gpu));
        gpu_free_milli.saturating_sub(fed)
    }

    /// How much [`unfed`](Self::unfed) grows (negative: shrinks) when `shape` takes its cpu,
    /// memory and GPU from a node with these free amounts; `None` when it does not fit them.
    pub fn unfed_growth(
        &self,
        cpu_free: u64,
        memory_free: u64,
        gpu_free_milli: u64,
        shape: &TaskShape,
    ) -> Option<i64> {
        let before = self.unfed(cpu_free, memory_free, gpu_free_milli);
        let after = self.unfed(
            cpu_free.checked_sub(shape.cpu_milli)?,
            memory_free.checked_sub(shape.memory_mib)?,
            gpu_free_milli.checked_sub(shape.gpu_total_milli())?,
        );
        Some(after as i64 - before as i64)
    }
}

/// Running sums of the GPU tasks' cpu, memory and GPU, for [`GpuFeed`].
#[derive(Default)]
struct FeedSums {
    cpu: u128,
    memory: u128,
    gpu: u128,
}

impl FeedSums {
    fn add(&mut self, shape: &TaskShape, count: u64) {
        let gpu = shape.gpu_total_milli();
        if gpu == 0 {
            return;
        }
        let count = u128::from(count);
        self.cpu += count * u128::from(shape.cpu_milli);
        self.memory += count * u128::from(shape.memory_mib);
        self.gpu += count * u128::from(gpu);
    }

    fn ratio(&self) -> GpuFeed {
        let per_gpu = |sum: u128| match self.gpu {
            0 => 0,
            gpu => u64::try_from(sum * u128::from(WHOLE_GPU_MILLI) / gpu).unwrap_or(u64::MAX),
        };
        GpuFeed {
            cpu_milli_per_gpu: per_gpu(self.cpu),
            memory_mib_per_gpu: per_gpu(self.memory),
        }
    }
}

/// The ring's ranking of one candidate from FGD's [`fgd_quantised_score`] (higher better) and
/// the [`GpuFeed::unfed_growth`] of placing there: lower is better, the score first, the unfed
/// growth only between equal scores.
pub fn fgd_rank(quantised_score: i64, unfed_growth: i64) -> i64 {
    rank(-quantised_score, unfed_growth, 0)
}

/// The ring's ranking of one candidate for a slice of one GPU: the [`ShareFill::growth`] of the
/// GPU the slice would take there (milli-GPU), then the [`GpuFeed::unfed_growth`], then FGD's
/// [`fgd_quantised_score`] (higher better); lower is better. FGD's score does not come first
/// for slices: its 40 milli-GPU steps call most slice placements equal, and it prefers the slice
/// that shrinks the fragment now (a 0.23 into a 0.35 gap) over the one that leaves a gap the
/// expected slices can fill (docs/placement.md).
pub fn slice_rank(fill_growth: i64, unfed_growth: i64, quantised_score: i64) -> i64 {
    rank(fill_growth, unfed_growth, -quantised_score)
}

/// `first`, then `second`, then `third`, lower better, in one integer: `second` and `third`
/// clamped to ±(2¹⁹ − 1), `first` to ±2²².
fn rank(first: i64, second: i64, third: i64) -> i64 {
    const PART: i64 = 1 << 20;
    let part = |v: i64| v.clamp(-(PART / 2) + 1, PART / 2 - 1);
    let first = first.clamp(-(1 << 22), 1 << 22);
    first * PART * PART + part(second) * PART + part(third)
}

// ------------------------------------------------------------------ the master's view

/// The shapes of the last [`LAUNCH_WINDOW`] (or `capacity`) launched tasks, with their counts:
/// what the master expects to arrive next.
#[derive(Clone, Debug)]
pub struct ShapeWindow {
    capacity: usize,
    recent: VecDeque<TaskShape>,
    counts: HashMap<TaskShape, u64>,
}

impl Default for ShapeWindow {
    fn default() -> Self {
        ShapeWindow::new(LAUNCH_WINDOW)
    }
}

impl ShapeWindow {
    /// A window of at most `capacity` shapes (at least 1).
    pub fn new(capacity: usize) -> Self {
        ShapeWindow {
            capacity: capacity.max(1),
            recent: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// One more launch; the oldest drops out when the window is full.
    pub fn record(&mut self, shape: TaskShape) {
        if self.recent.len() == self.capacity {
            if let Some(old) = self.recent.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.recent.push_back(shape);
        *self.counts.entry(shape).or_default() += 1;
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The target workload of the window plus `pending` shapes (each count capped at the
    /// window's capacity, so one large demand cannot drown the history); `None` while no shape
    /// asks for a GPU (then no fragment can grow and there is nothing to score).
    pub fn target(
        &self,
        pending: impl IntoIterator<Item = (TaskShape, u64)>,
    ) -> Option<TargetWorkload> {
        let cap = self.capacity as u64;
        let counts = self
            .counts
            .iter()
            .map(|(s, c)| (*s, *c))
            .chain(pending.into_iter().map(|(s, c)| (s, c.min(cap))));
        let target = TargetWorkload::from_counts(counts);
        target.has_gpu_shape().then_some(target)
    }
}

/// An agent's free cpu (milli-cpu) and memory (MiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuMemFree {
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// The master's ring tie-break: the growth of an agent's fragment if the demand were placed on
/// it, with the devices the configured selection would bind ([`DeviceState::select`], the same
/// call the master makes at accept time), then the growth of its unfed GPU ([`GpuFeed`]).
/// Agents without devices, and agents whose free cpu is unknown, grow by 0; a demand the
/// agent's devices cannot hold scores `i64::MAX`. Models are not part of the master's shapes
/// (any model).
pub struct DeviceFragmentScore<'a> {
    target: &'a TargetWorkload,
    devices: &'a DeviceBook,
    free: &'a HashMap<AgentKey, CpuMemFree>,
    selection: DeviceSelection,
}

impl<'a> DeviceFragmentScore<'a> {
    /// `free`: each agent's free cpu and memory as before the allocation run (the caller keeps
    /// it as its agents change, not rebuilt each run); an agent is offered whole, so it is not
    /// placed on twice within a run.
    pub fn new(
        target: &'a TargetWorkload,
        devices: &'a DeviceBook,
        free: &'a HashMap<AgentKey, CpuMemFree>,
        selection: DeviceSelection,
    ) -> Self {
        DeviceFragmentScore {
            target,
            devices,
            free,
            selection,
        }
    }

    /// The growth for one agent's device state and free cpu.
    pub fn growth_on(&self, state: &DeviceState, cpu_free: u64, demand: &Resources) -> Option<i64> {
        self.placed_on(state, cpu_free, demand)
            .map(|(growth, _)| growth)
    }

    /// The growth for one agent's device state and free cpu, and for a slice of one GPU the
    /// [`ShareFill::growth`] of the device it would take ([`DeviceState::select_filling`] with
    /// the target's fill, the call the master makes at accept time).
    fn placed_on(
        &self,
        state: &DeviceState,
        cpu_free: u64,
        demand: &Resources,
    ) -> Option<(i64, Option<i64>)> {
        let shape = TaskShape::of_demand(demand)?;
        let gpu_free = state.free_share();
        let before = self.target.fragment(cpu_free, gpu_free);
        let request = DeviceRequest::from_scalars(demand, Vec::new()).ok()?;
        let Some(request) = request else {
            let growth = self
                .target
                .growth(cpu_free, gpu_free, None, &shape, &[], before)?;
            return Some((growth, None));
        };
        let fill =
            (self.selection == DeviceSelection::MostUsedThatFits).then(|| self.target.share_fill());
        let binding = state.select_filling(&request, self.selection, fill)?;
        let positions: Vec<usize> = binding
            .devices
            .iter()
            .map(|bound| state.devices().iter().position(|d| d.index == bound.index))
            .collect::<Option<_>>()?;
        let growth = self
            .target
            .growth(cpu_free, gpu_free, None, &shape, &positions, before)?;
        let fill_growth = match (request.demand, fill) {
            (GpuDemand::Slice { share, .. }, Some(fill)) => positions
                .first()
                .and_then(|&i| fill.growth(gpu_free[i], share)),
            _ => None,
        };
        Some((growth, fill_growth))
    }
}

impl DeviceFragmentScore<'_> {
    /// The weighted growth of one agent's fragment if `demand` were placed on it: 0 for agents
    /// without devices or without a known free cpu, `i64::MAX` when its devices cannot hold it.
    pub fn growth(&self, agent: AgentKey, demand: &Resources) -> i64 {
        let (Some(state), Some(free)) = (self.devices.state(agent), self.free.get(&agent)) else {
            return 0;
        };
        self.growth_on(state, free.cpu_milli, demand)
            .unwrap_or(i64::MAX)
    }

    /// The growth of one agent's unfed GPU ([`GpuFeed::unfed_growth`]) if `demand` were placed
    /// on it: 0 for agents without devices or without known free amounts, or when it does not fit.
    pub fn unfed_growth(&self, agent: AgentKey, demand: &Resources) -> i64 {
        let (Some(state), Some(free), Some(shape)) = (
            self.devices.state(agent),
            self.free.get(&agent),
            TaskShape::of_demand(demand),
        ) else {
            return 0;
        };
        self.unfed_on(state, free, &shape)
    }

    /// The unfed growth for one agent's device state and free amounts (0 when it does not fit).
    fn unfed_on(&self, state: &DeviceState, free: &CpuMemFree, shape: &TaskShape) -> i64 {
        let gpu_free: u64 = state.free_share().iter().map(|&g| u64::from(g)).sum();
        self.target
            .feed()
            .unfed_growth(free.cpu_milli, free.memory_mib, gpu_free, shape)
            .unwrap_or(0)
    }
}

/// The ring's tie-break score: the [`growth`](DeviceFragmentScore::growth) quantised as the FGD
/// paper's simulator does ([`TargetWorkload::quantised_score`]), then the
/// [`unfed_growth`](DeviceFragmentScore::unfed_growth), ranked by [`fgd_rank`] (lower is
/// better): the same score the simulator gives the ring; `i64::MAX` when the devices cannot hold
/// the demand.
impl AgentScore for DeviceFragmentScore<'_> {
    /// The largest candidates only when the target names GPU models
    /// ([`TargetWorkload::names_models`]).
    fn ranks_largest(&self) -> bool {
        self.target.names_models()
    }

    fn score(&self, agent: AgentKey, demand: &Resources) -> i64 {
        // The agent's state and free amounts looked up once for both parts (K calls a decision).
        let (Some(state), Some(free)) = (self.devices.state(agent), self.free.get(&agent)) else {
            return fgd_rank(self.target.quantised_score(0), 0);
        };
        let Some((growth, fill_growth)) = self.placed_on(state, free.cpu_milli, demand) else {
            return i64::MAX;
        };
        let unfed = TaskShape::of_demand(demand).map_or(0, |s| self.unfed_on(state, free, &s));
        let score = self.target.quantised_score(growth);
        match fill_growth {
            Some(fill_growth) => slice_rank(fill_growth, unfed, score),
            None => fgd_rank(score, unfed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{parse_agent_resources, DeviceBinding};

    fn gpu_shape(cpu_milli: u64, num_gpu: u32, gpu_milli: u32) -> TaskShape {
        TaskShape {
            cpu_milli,
            num_gpu,
            gpu_milli,
            models: 0,
            memory_mib: 0,
        }
    }

    /// A target names GPU models when one of its kept GPU shapes is bound to some; a bound
    /// CPU-only shape or a bound shape too rare to be kept does not count.
    #[test]
    fn a_target_names_models_through_its_kept_gpu_shapes() {
        let any = gpu_shape(1000, 1, 1000);
        let bound = TaskShape {
            models: 0b10,
            ..any
        };
        let cpu_bound = TaskShape {
            models: 0b10,
            ..gpu_shape(1000, 0, 0)
        };
        assert!(!TargetWorkload::from_counts([(any, 9), (cpu_bound, 3)]).names_models());
        assert!(TargetWorkload::from_counts([(any, 9), (bound, 3)]).names_models());
        // 1 in 101 falls outside the 95 % the target keeps.
        assert!(!TargetWorkload::from_counts([(any, 100), (bound, 1)]).names_models());
    }

    fn demand(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// Hand-computed: 100·sigmoid(ΔF/1000), truncated. σ(0.039) = 0.509749, σ(0.040) =
    /// 0.5099987 (the 50/51 edge is ΔF = 1000·ln(51/49) = 40.0053), σ(0.041) = 0.510249,
    /// σ(−0.001) = 0.49975, σ(−0.040) = 0.4900013, σ(−0.041) = 0.489751, σ(1) = 0.731059,
    /// σ(−1) = 0.268941, σ(8) = 0.999665, σ(−8) = 0.000335.
    #[test]
    fn quantised_score_at_bucket_edges() {
        let cases = [
            (0.0, 50),
            (39.0, 50),
            (40.0, 50),
            (40.01, 51),
            (41.0, 51),
            (-1.0, 49),
            (-40.0, 49),
            (-40.01, 48),
            (-41.0, 48),
            (1000.0, 73),
            (-1000.0, 26),
            (8000.0, 99),
            (-8000.0, 0),
            // Past ≈ 36,700 the float sigmoid is exactly 1 (no node of ≤ 36 GPUs gets there).
            (1e6, 100),
            (-1e6, 0),
        ];
        for (delta, want) in cases {
            assert_eq!(fgd_quantised_score(delta), want, "ΔF = {delta}");
        }
        // Weighted growth → milli-GPU: total weight 10, growth −400 is ΔF = +40.
        let target = TargetWorkload::from_counts([
            (gpu_shape(1000, 1, 100), 9),
            (gpu_shape(1000, 1, 500), 1),
        ]);
        assert_eq!(target.total_weight(), 10);
        assert_eq!(target.quantised_score(-400), 50);
        assert_eq!(target.quantised_score(-410), 51);
        assert_eq!(target.quantised_score(0), 50);
        assert_eq!(target.quantised_score(10), 49);
        assert_eq!(target.quantised_score(400), 49);
        assert_eq!(target.quantised_score(410), 48);
    }

    /// Target: 0.1-GPU tasks (weight 9) and 0.5-GPU tasks (weight 1). Node GPUs free 1000 and
    /// 300; fragment before = 1 × 300 (the 300 strands a 0.5 task) = 300.
    #[test]
    fn quantised_ties_take_the_lowest_gpu() {
        let tenth = gpu_shape(1000, 1, 100);
        let half = gpu_shape(1000, 1, 500);
        let target = TargetWorkload::from_counts([(tenth, 9), (half, 1)]);
        let gpus = [1000, 300];
        let before = target.fragment(8000, &gpus);
        assert_eq!(before, 300);
        // 0.2 on GPU 0 leaves [800, 300]: growth 0, ΔF 0 → 50. On GPU 1 leaves [1000, 100]:
        // the 0.5 task strands 100, the 0.1 task nothing: growth −200, ΔF +20 → 50. A tie:
        // the lowest index, where the exact growth takes GPU 1.
        let fifth = gpu_shape(1000, 1, 200);
        assert_eq!(
            target.best_quantised(8000, &gpus, None, &fifth, before),
            Some((50, 0b01))
        );
        assert_eq!(
            target.least_growth(8000, &gpus, None, &fifth, before),
            Some((-200, 0b10))
        );
        // 0.3 on GPU 1 leaves [1000, 0]: growth −300, ΔF +30 → still 50: GPU 0.
        let three = gpu_shape(1000, 1, 300);
        assert_eq!(
            target.best_quantised(8000, &gpus, None, &three, before),
            Some((50, 0b01))
        );
        // With total weight 5 the same growth is ΔF +60 → 51 against 50: GPU 1 wins.
        let target5 = TargetWorkload::from_counts([(tenth, 4), (half, 1)]);
        assert_eq!(
            target5.best_quantised(8000, &gpus, None, &three, before),
            Some((51, 0b10))
        );
        // Whole GPUs: the lowest-index free ones.
        let free = [300, 1000, 1000, 1000];
        let before = target.fragment(8000, &free);
        let one = gpu_shape(1000, 1, 1000);
        let two = gpu_shape(1000, 2, 1000);
        assert_eq!(
            target
                .best_quantised(8000, &free, None, &one, before)
                .map(|(_, p)| p),
            Some(0b0010)
        );
        assert_eq!(
            target
                .best_quantised(8000, &free, None, &two, before)
                .map(|(_, p)| p),
            Some(0b0110)
        );
        // Does not fit: no score.
        assert_eq!(target.best_quantised(500, &free, None, &one, before), None);
    }

    #[test]
    fn shapes_of_demands() {
        assert_eq!(
            TaskShape::of_demand(&demand("cpus:1.5;gpu_milli:300;mem:10")),
            Some(TaskShape {
                memory_mib: 10,
                ..gpu_shape(1500, 1, 300)
            })
        );
        assert_eq!(
            TaskShape::of_demand(&demand("cpus:2;gpus:2")),
            Some(gpu_shape(2000, 2, 1000))
        );
        assert_eq!(
            TaskShape::of_demand(&demand("cpus:2")),
            Some(gpu_shape(2000, 0, 0))
        );
        assert_eq!(TaskShape::of_demand(&demand("gpus:1;gpu_milli:5")), None);
    }

    #[test]
    fn window_forgets_the_oldest_and_needs_a_gpu_shape() {
        let cpu_only = gpu_shape(1000, 0, 0);
        let half = gpu_shape(1000, 1, 500);
        let mut window = ShapeWindow::new(3);
        window.record(cpu_only);
        assert_eq!(window.target([]), None, "no GPU shape: nothing to score");
        window.record(half);
        let target = window.target([]).unwrap();
        assert_eq!((target.len(), target.total_weight()), (2, 2));
        for _ in 0..3 {
            window.record(cpu_only);
        }
        assert_eq!(window.len(), 3);
        assert_eq!(window.target([]), None, "the GPU launch left the window");
        // A pending demand counts, capped at the window's size: 3 + 3 tasks, both shapes kept.
        let target = window.target([(half, 10)]).unwrap();
        assert_eq!((target.len(), target.total_weight()), (2, 6));
        assert_eq!(target.fragment(8000, &[1000, 300]), 3 * 300 + 3 * 1300);
    }

    #[test]
    fn growth_and_least_growth_by_hand() {
        // Target: half GPUs only.
        let half = gpu_shape(1000, 1, 500);
        let target = TargetWorkload::from_tasks([half]);
        assert_eq!(target.fragment(8000, &[1000, 600]), 0);
        // 0.3 on the 600 GPU strands 300; on the 1000 GPU nothing.
        let s3 = gpu_shape(1000, 1, 300);
        assert_eq!(
            target.growth(8000, &[1000, 600], None, &s3, &[1], 0),
            Some(300)
        );
        assert_eq!(
            target.growth(8000, &[1000, 600], None, &s3, &[0], 0),
            Some(0)
        );
        assert_eq!(
            target.least_growth(8000, &[1000, 600], None, &s3, 0),
            Some((0, 0b01))
        );
        // Does not fit: cpu, a GPU short, a position out of range, wrong count.
        assert_eq!(target.growth(500, &[1000], None, &s3, &[0], 0), None);
        assert_eq!(target.growth(8000, &[200], None, &s3, &[0], 0), None);
        assert_eq!(target.growth(8000, &[1000], None, &s3, &[1], 0), None);
        assert_eq!(target.growth(8000, &[1000], None, &s3, &[], 0), None);
        assert_eq!(target.least_growth(8000, &[200, 100], None, &s3, 0), None);
        // A model-bound shape on a node of another model does not fit.
        let bound = TaskShape { models: 0b10, ..s3 };
        assert_eq!(target.growth(8000, &[1000], Some(0), &bound, &[0], 0), None);
        // Whole GPUs: the fully free ones, lowest index first (one candidate); the 400 GPU
        // stays stranded for a half.
        let whole = gpu_shape(0, 2, 1000);
        assert_eq!(
            target.least_growth(8000, &[1000, 400, 1000, 1000], None, &whole, 0),
            Some((400, 0b0101))
        );
        assert_eq!(
            target.least_growth(8000, &[1000, 400, 700], None, &whole, 0),
            None
        );
    }

    /// The per-GPU choice as it was before it moved to `devices::select_shares_by_cost`: the
    /// reference the new code must match exactly (the simulator's results depend on it).
    fn least_growth_before(
        target: &TargetWorkload,
        cpu_free: u64,
        gpu_free: &[u32],
        shape: &TaskShape,
        before: u64,
    ) -> Option<(i64, u64)> {
        fn best_fit_pick(gpu_free: &[u32], num_gpu: u32, gpu_milli: u32) -> u64 {
            let mut candidates: Vec<(u32, usize)> = gpu_free
                .iter()
                .enumerate()
                .filter(|(_, &g)| g >= gpu_milli)
                .map(|(i, &g)| (g, i))
                .collect();
            candidates.sort_unstable();
            candidates
                .iter()
                .take(num_gpu as usize)
                .fold(0, |mask, &(_, i)| mask | (1u64 << i))
        }
        let mut candidates = Vec::new();
        if shape.num_gpu == 1 && shape.gpu_milli < WHOLE_GPU_MILLI {
            let mut seen = Vec::new();
            for (i, &g) in gpu_free.iter().enumerate() {
                if g >= shape.gpu_milli && !seen.contains(&g) {
                    seen.push(g);
                    candidates.push(1u64 << i);
                }
            }
        } else {
            candidates.push(best_fit_pick(gpu_free, shape.num_gpu, shape.gpu_milli));
        }
        let mut best: Option<(i64, u64)> = None;
        for pick in candidates {
            let positions: Vec<usize> = (0..64).filter(|&i| pick & (1 << i) != 0).collect();
            let Some(delta) = target.growth(cpu_free, gpu_free, None, shape, &positions, before)
            else {
                continue;
            };
            if best.is_none_or(|(b, _)| delta < b) {
                best = Some((delta, pick));
            }
        }
        best
    }

    /// Every node of four GPUs with free shares from {0, 200, 500, 700, 1000}, every shape of a
    /// mixed target: the same growth and the same GPUs as before the move.
    #[test]
    fn least_growth_matches_the_previous_choice() {
        let shapes = [
            gpu_shape(0, 0, 0),
            gpu_shape(1000, 1, 200),
            gpu_shape(1000, 1, 500),
            gpu_shape(2000, 1, 1000),
            gpu_shape(1000, 2, 1000),
            gpu_shape(1000, 2, 500),
            gpu_shape(1000, 4, 1000),
        ];
        let target = TargetWorkload::from_counts(
            shapes
                .iter()
                .zip([3, 5, 4, 2, 1, 1, 1])
                .map(|(s, c)| (*s, c)),
        );
        let steps = [0, 200, 500, 700, 1000];
        for a in steps {
            for b in steps {
                for c in steps {
                    for d in steps {
                        let free = [a, b, c, d];
                        let before = target.fragment(4000, &free);
                        for shape in &shapes {
                            assert_eq!(
                                target.least_growth(4000, &free, None, shape, before),
                                least_growth_before(&target, 4000, &free, shape, before),
                                "{free:?} {shape:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Three hand-made agents: 1 with GPUs free [1000, 700], 2 with [1000, 1000], 3 without
    /// devices; target = "1 cpu, half a GPU" ×1.
    #[test]
    fn device_score_on_hand_made_agents() {
        let target = TargetWorkload::from_tasks([gpu_shape(1000, 1, 500)]);
        let mut book = DeviceBook::new();
        for agent in [1, 2] {
            let (_, devices) = parse_agent_resources("gpus:2x16384").unwrap();
            book.set_agent(agent, devices).unwrap();
        }
        book.take(1, &DeviceBinding::parse("gpu:1:300:0").unwrap())
            .unwrap();
        let free = CpuMemFree {
            cpu_milli: 8000,
            memory_mib: 1 << 20,
        };
        let free: HashMap<AgentKey, CpuMemFree> = [(1, free), (2, free), (3, free)].into();
        let pack =
            DeviceFragmentScore::new(&target, &book, &free, DeviceSelection::MostUsedThatFits);
        let spread = DeviceFragmentScore::new(&target, &book, &free, DeviceSelection::LeastUsed);
        let d3 = demand("cpus:1;gpu_milli:300");
        // Packing puts 0.3 on the 700 GPU of agent 1: 400 left, stranded for a half GPU.
        assert_eq!(pack.growth(1, &d3), 400);
        // Spreading puts it on the free GPU: 700 and 700 both still hold a half.
        assert_eq!(spread.growth(1, &d3), 0);
        assert_eq!(pack.growth(2, &d3), 0);
        assert_eq!(pack.growth(3, &d3), 0, "no devices");
        assert_eq!(pack.growth(9, &d3), 0, "unknown agent");
        // 0.8 on agent 1: the 1000 GPU keeps 200, stranded.
        assert_eq!(pack.growth(1, &demand("gpu_milli:800")), 200);
        // cpu only: 4 cpus leave enough for a half-GPU task; 7.5 do not, and all 1700 free
        // milli-GPU become a fragment.
        assert_eq!(pack.growth(1, &demand("cpus:4")), 0);
        assert_eq!(pack.growth(1, &demand("cpus:7.5")), 1700);
        // A whole GPU of agent 1 leaves the 700 GPU, which still holds a half.
        assert_eq!(pack.growth(1, &demand("gpus:1")), 0);
        // Two whole GPUs do not fit agent 1; ambiguous demands are not scored as fitting.
        assert_eq!(pack.growth(1, &demand("gpus:2")), i64::MAX);
        assert_eq!(pack.growth(1, &demand("gpus:1;gpu_milli:5")), i64::MAX);
        // The ring's score is the growth quantised like the FGD paper's simulator (target
        // weight 1, so ΔF = −growth): 100·σ(−0.4) = 40.1, σ(0) = 50, 100·σ(−1.7) = 15.4; then
        // the unfed growth. The target brings 2 cpus per GPU (1 cpu per half GPU), no memory.
        assert_eq!(pack.target.feed().cpu_milli_per_gpu, 2000);
        // 0.3 GPU and 1 cpu off agent 1: 7 cpus feed 3.5 GPUs, 1.4 are free: nothing unfed.
        assert_eq!(pack.unfed_growth(1, &d3), 0);
        // Packed, a slice is ranked by its fill growth first: the target's one slice size is
        // 500, so 400 free leaves 400 − 0 unfillable against 700's 200: +200 (the whole GPU
        // would grow as much, 700 = 500 + 200, and the pack takes the 700).
        assert_eq!(pack.score(1, &d3), slice_rank(200, 0, 40));
        assert_eq!(spread.score(1, &d3), fgd_rank(50, 0));
        assert_eq!(pack.score(3, &d3), fgd_rank(50, 0), "no devices");
        // 7.5 cpus off agent 1: 0.5 cpu feeds 250 milli-GPU of the 1700 free.
        assert_eq!(pack.unfed_growth(1, &demand("cpus:7.5")), 1450);
        assert_eq!(pack.score(1, &demand("cpus:7.5")), fgd_rank(15, 1450));
        assert_eq!(pack.score(1, &demand("gpus:2")), i64::MAX);
    }

    /// Packed, a slice goes to the GPU the target's popular slices leave least unfillable, not
    /// the best fit, and the score ranks by that fill growth first.
    #[test]
    fn packed_slices_take_the_gpu_expected_slices_can_fill() {
        let sizes = [230, 320, 460, 470, 650, 810];
        let target = TargetWorkload::from_tasks(sizes.map(|m| gpu_shape(1000, 1, m)));
        assert_eq!(target.share_fill().sizes(), &sizes);
        let mut book = DeviceBook::new();
        let (_, devices) = parse_agent_resources("gpus:2x16384").unwrap();
        book.set_agent(1, devices).unwrap();
        // A 0.65 on GPU 0: free [350, 1000].
        book.take(1, &DeviceBinding::parse("gpu:0:650:0").unwrap())
            .unwrap();
        let free = CpuMemFree {
            cpu_milli: 64_000,
            memory_mib: 1 << 20,
        };
        let agents = [(1, free)].into();
        let pack =
            DeviceFragmentScore::new(&target, &book, &agents, DeviceSelection::MostUsedThatFits);
        let d = demand("cpus:1;gpu_milli:230");
        // 0.23 on the 350 leaves 120, none of it fillable (30 was: 350 = 320 + 30): +90; on
        // the whole GPU it leaves 770 = 230 + 470 + 70: +70. The best fit would take GPU 0.
        let fill = target.share_fill();
        assert_eq!(fill.growth(350, 230), Some(90));
        assert_eq!(fill.growth(1000, 230), Some(70));
        let state = book.state(1).unwrap();
        let request = DeviceRequest::from_scalars(&d, Vec::new())
            .unwrap()
            .unwrap();
        let bound = |fill| {
            state
                .select_filling(&request, DeviceSelection::MostUsedThatFits, fill)
                .unwrap()
                .devices[0]
                .index
        };
        assert_eq!(bound(Some(fill)), 1);
        assert_eq!(bound(None), 0);
        // The score assumes GPU 1 and ranks by +70 first.
        let gpu_free = state.free_share();
        let before = target.fragment(free.cpu_milli, gpu_free);
        let shape = TaskShape::of_demand(&d).unwrap();
        let growth = target
            .growth(free.cpu_milli, gpu_free, None, &shape, &[1], before)
            .unwrap();
        assert_eq!(pack.growth(1, &d), growth);
        let score = target.quantised_score(growth);
        assert_eq!(
            pack.score(1, &d),
            slice_rank(70, pack.unfed_growth(1, &d), score)
        );
        // A fill growth one milli-GPU lower outranks any unfed growth and score.
        assert!(slice_rank(69, 500_000, 0) < slice_rank(70, -500_000, 99));
        assert!(slice_rank(70, -1, 0) < slice_rank(70, 0, 99));
        assert!(slice_rank(70, 0, 51) < slice_rank(70, 0, 50));
    }

    /// The feed of a target: Σ cpu ÷ Σ GPU and Σ memory ÷ Σ GPU over its GPU tasks, weighted
    /// by count, every counted task (kept shape or not); CPU-only tasks do not count.
    #[test]
    fn feed_of_a_target() {
        let with_memory = |s: TaskShape, memory_mib| TaskShape { memory_mib, ..s };
        let target = TargetWorkload::from_counts([
            // 2 × (8 cpus, 32 GiB, 1 GPU) + 1 × (4 cpus, 8 GiB, half a GPU) + CPU-only.
            (with_memory(gpu_shape(8000, 1, 1000), 32_768), 2),
            (with_memory(gpu_shape(4000, 1, 500), 8_192), 1),
            (with_memory(gpu_shape(32_000, 0, 0), 65_536), 5),
        ]);
        // GPU 2.5, cpu 20, memory 73,728 MiB: 8 cpus and 29,491 MiB per GPU.
        assert_eq!(
            target.feed(),
            GpuFeed {
                cpu_milli_per_gpu: 8000,
                memory_mib_per_gpu: 29_491,
            }
        );
        // Shapes differing only in memory are one shape of the fragment measure.
        let merged = TargetWorkload::from_counts([
            (with_memory(gpu_shape(8000, 1, 1000), 1), 1),
            (with_memory(gpu_shape(8000, 1, 1000), 2), 1),
        ]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged.total_weight(), 2);
        // No GPU task: nothing limits.
        let cpu_only = TargetWorkload::from_tasks([gpu_shape(1000, 0, 0)]);
        assert_eq!(cpu_only.feed(), GpuFeed::default());
        assert_eq!(GpuFeed::default().unfed(0, 0, 8000), 0);
    }

    proptest::proptest! {
        /// Unfed GPU computed in u64 where the product fits is the 128-bit computation, up to
        /// amounts whose product does not fit.
        #[test]
        fn unfed_is_the_wide_computation(
            cpu in proptest::prop_oneof![0u64..200_000, proptest::num::u64::ANY],
            memory in proptest::prop_oneof![0u64..2_000_000, proptest::num::u64::ANY],
            gpu in 0u64..100_000,
            per_cpu in 0u64..50_000,
            per_memory in 0u64..500_000,
        ) {
            let feed = GpuFeed { cpu_milli_per_gpu: per_cpu, memory_mib_per_gpu: per_memory };
            let wide = |free: u64, per: u64| match per {
                0 => u64::MAX,
                per => u64::try_from(u128::from(free) * 1000 / u128::from(per)).unwrap_or(u64::MAX),
            };
            let fed = wide(cpu, per_cpu).min(wide(memory, per_memory));
            proptest::prop_assert_eq!(feed.unfed(cpu, memory, gpu), gpu.saturating_sub(fed));
        }
    }

    /// Unfed GPU by hand, at its edges, and its growth.
    #[test]
    fn unfed_gpu_by_hand() {
        let feed = GpuFeed {
            cpu_milli_per_gpu: 10_000,
            memory_mib_per_gpu: 40_000,
        };
        // 8 free GPUs need 80 cpus and 320,000 MiB.
        assert_eq!(feed.unfed(80_000, 320_000, 8000), 0);
        assert_eq!(feed.unfed(96_000, 384_000, 8000), 0, "more than enough");
        // 79 cpus feed 7.9 GPUs: 100 milli-GPU unfed; memory the scarcer: 7.5 GPUs fed.
        assert_eq!(feed.unfed(79_000, 320_000, 8000), 100);
        assert_eq!(feed.unfed(96_000, 300_000, 8000), 500);
        assert_eq!(feed.unfed(0, 0, 1500), 1500);
        assert_eq!(feed.unfed(0, 0, 0), 0);
        // A cpu-only task of 20 cpus on an idle 8-GPU node with 96 cpus: 76 cpus feed 7.6 of
        // the 8 GPUs, so 400 milli-GPU go unfed; the same on a node with no free GPU: nothing.
        let cpu_only = TaskShape {
            memory_mib: 1024,
            ..gpu_shape(20_000, 0, 0)
        };
        assert_eq!(
            feed.unfed_growth(96_000, 384_000, 8000, &cpu_only),
            Some(400)
        );
        assert_eq!(feed.unfed_growth(96_000, 384_000, 0, &cpu_only), Some(0));
        // A whole-GPU task with 12 cpus on a node whose 2 free GPUs had 15 cpus (500 unfed):
        // 3 cpus feed 0.3 of the last GPU, 700 unfed: the growth is 200.
        let whole = gpu_shape(12_000, 1, 1000);
        assert_eq!(feed.unfed(15_000, 80_000, 2000), 500);
        assert_eq!(feed.unfed_growth(15_000, 80_000, 2000, &whole), Some(200));
        // It shrinks when a light task takes GPU the node could not feed: 14 cpus feed the
        // one GPU left.
        let light = gpu_shape(1000, 1, 1000);
        assert_eq!(feed.unfed_growth(15_000, 80_000, 2000, &light), Some(-500));
        // Does not fit: None.
        assert_eq!(feed.unfed_growth(10_000, 80_000, 2000, &whole), None);
    }

    /// The rank orders by the score first (higher better), the unfed growth only between equal
    /// scores, and stays ordered at the extremes.
    #[test]
    fn rank_is_score_then_unfed() {
        assert!(fgd_rank(51, 1_000_000) < fgd_rank(50, -1_000_000));
        assert!(fgd_rank(50, -100) < fgd_rank(50, 0));
        assert!(fgd_rank(50, 0) < fgd_rank(50, 100));
        assert!(fgd_rank(99, i64::MAX) < fgd_rank(98, i64::MIN));
        assert!(
            fgd_rank(0, i64::MAX) < i64::MAX,
            "below the does-not-fit score"
        );
        assert!(fgd_rank(0, 0) > fgd_rank(1, 0));
    }

    proptest::proptest! {
        /// The sorted form of `node_fragment` equals the pass over the GPUs per shape, for any
        /// target (shared, whole, multi-GPU, model-bound, cpu-only shapes) and any node.
        #[test]
        fn node_fragment_equals_the_scan(
            shapes in proptest::collection::vec(
                // Few cpu amounts and shares, so shapes share a GPU request and a cpu.
                (0u64..9, 0u32..9, 0usize..5, 0u64..4, 1u64..50),
                1..40,
            ),
            gpus in proptest::collection::vec(0u32..1_001, 0..17),
            // On and between the shapes' cpu amounts.
            cpu_free in proptest::strategy::Strategy::prop_map(0u64..20, |c| c * 500),
            model in proptest::option::of(0u32..3),
        ) {
            let target = TargetWorkload::from_counts(shapes.iter().map(
                |&(cpu, num_gpu, share, models, count)| {
                    let gpu_milli = if num_gpu > 1 { 1000 } else { [0, 100, 250, 500, 1000][share] };
                    let shape = TaskShape {
                        models,
                        ..gpu_shape(cpu * 1000, num_gpu, gpu_milli)
                    };
                    (shape, count)
                },
            ));
            proptest::prop_assert_eq!(
                target.node_fragment(cpu_free, &gpus, model),
                target.node_fragment_scan(cpu_free, &gpus, model)
            );
        }
    }
}
