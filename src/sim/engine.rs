//! The simulated cluster: per-GPU node state, the real allocator for Ringmaster's placers, and
//! one placement decision at a time for any policy.
//!
//! Ringmaster's placers (`ring`, `first-fit`, `linear-best-fit`, every other [`PlacerKind`],
//! and `ring-seed001`) place each task with one run of the core's allocation cycle
//! ([`run_cycle`]) — the step the master and `ringmaster place` run — over a scalar view of each
//! node (`cpus`, `mem`, and `gpus` = its total free milli-GPU, exact in milli fixed point): one
//! framework, one request of count 1 at the base priority, granted exactly its demand (the
//! dry-run's input, [`exact_cycle_input`]), nothing running. The per-GPU check (enough GPUs with
//! enough free milli, the GPU model) is the cycle's feasibility verdict ([`Filter::Devices`]
//! when it fails), and the GPUs inside the granted node are picked by best fit. The ring's
//! scored tie-break gets FGD's quantised score per node through the [`PlacementContext`] given
//! to the cycle (then the node's GPUs are the ones that score assumed). `PLACER+spare-gpus` is
//! the exception: a direct [`Cluster::place_sparing`] call, since the cycle has no such
//! two-pass step (see [`SimPolicy::SparingGpus`]). The paper's
//! policies ([`PaperPolicy`]) score nodes from the same state; their scores, and the ring's, are
//! cached per (node, task shape) and recomputed only when the node changed ([`ScoreCache`]; the
//! ring's idle nodes share one entry per node type).
//!
//! The cluster also keeps, per node, its expected GPU fragment against the target workload
//! ([`TargetWorkload::node_fragment`]), updated on every change, so the fragmented share of the
//! cluster is always at hand.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ringmaster_core::resources::{Resources, MILLI};

use super::cache::{CacheRow, NodeType, ScoreCache, Scored};
use super::gpu::{GpuPick, NodeAccountingError, NodeState, Shape, SIM_SELECTION};
use super::policies::{kind, score, NodeView, PaperPolicy, TargetWorkload};
use super::trace::{Node, Task, GPU_MILLI};
use crate::dry_run::exact_cycle_input;
use ringmaster_core::devices::select_shares_filling;
use ringmaster_core::placement::fragmentation::{fgd_rank, slice_rank};
use ringmaster_core::placement::placers::context::AgentScore;
use ringmaster_core::placement::placers::memo::WalkMemo;
use ringmaster_core::placement::ring_set::ALL_CLASSES;
use ringmaster_core::placement::{
    run_cycle, AgentKey, Cluster, DrfSorter, Filter, FrameworkKey, Outcome, PlacementContext,
    PlacementError, PlacerKind, PriorityConfig, Request, RingsConfig, TieredRequest,
};

/// Above this many (node, shape) pairs the paper's policies score without a cache.
const MAX_CACHE_ENTRIES: usize = 32 << 20;

/// How the paper's policies choose among nodes with equal scores. `random` always picks
/// uniformly among all fitting nodes, whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ties {
    /// The lowest node index (trace order), the tie rule of Ringmaster's own placers and of
    /// the paper's simulator (it takes the smallest node name; openb's names are zero-padded,
    /// so that is the lowest trace index).
    #[default]
    First,
    /// Uniformly at random (seeded), as the stock Kubernetes scheduler's host selection does
    /// (the paper's simulator does not).
    Random,
}

/// A policy the simulator can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimPolicy {
    /// One of Ringmaster's placers, through the core's allocation cycle ([`run_cycle`]).
    Allocator(PlacerKind),
    /// The same placer, through [`Cluster::place_sparing`] on `gpus`: tasks without GPUs first
    /// go to nodes without free GPUs. Named `PLACER+spare-gpus`.
    ///
    /// Not through the cycle: its allocation step always places with `Cluster::place_in`, so
    /// it cannot express this two-pass search without a change to the core, and the master has
    /// no such step (its ring spares `gpus` by itself, `RingSearch::spare`). A direct call, as
    /// before, with no scored tie-break.
    SparingGpus(PlacerKind),
    /// The `ring` placer with [`RingsConfig::seed_001`] whatever the configuration says: the
    /// search exactly as SPEC seed 001 states it and as first shipped, for comparison. Named
    /// `ring-seed001`.
    Seed001Ring,
    /// A policy of the ATC'23 paper (or `random`).
    Paper(PaperPolicy),
}

impl SimPolicy {
    /// Every policy: Ringmaster's placers first, then the paper's.
    pub fn all() -> Vec<SimPolicy> {
        PlacerKind::ALL
            .iter()
            .map(|&k| SimPolicy::Allocator(k))
            .chain([SimPolicy::Seed001Ring])
            .chain(PaperPolicy::ALL.iter().map(|&p| SimPolicy::Paper(p)))
            .collect()
    }

    pub fn name(&self) -> String {
        match self {
            SimPolicy::Allocator(k) => k.to_string(),
            SimPolicy::SparingGpus(k) => format!("{k}{SPARE_SUFFIX}"),
            SimPolicy::Seed001Ring => SEED_001_RING.to_string(),
            SimPolicy::Paper(p) => p.name().to_string(),
        }
    }
}

impl fmt::Display for SimPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

const SPARE_SUFFIX: &str = "+spare-gpus";
const SEED_001_RING: &str = "ring-seed001";

/// A policy name that is neither a placer nor a paper policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (expected `all` or one of: {names})", names = policy_names().join(", "))]
pub struct UnknownPolicy(pub String);

/// Every policy name, in [`SimPolicy::all`] order (`PLACER+spare-gpus` is accepted too).
pub fn policy_names() -> Vec<String> {
    SimPolicy::all().iter().map(SimPolicy::name).collect()
}

impl FromStr for SimPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        if let Ok(kind) = s.parse::<PlacerKind>() {
            return Ok(SimPolicy::Allocator(kind));
        }
        if s == SEED_001_RING {
            return Ok(SimPolicy::Seed001Ring);
        }
        if let Some(kind) = s
            .strip_suffix(SPARE_SUFFIX)
            .and_then(|k| k.parse::<PlacerKind>().ok())
        {
            return Ok(SimPolicy::SparingGpus(kind));
        }
        s.parse::<PaperPolicy>()
            .map(SimPolicy::Paper)
            .map_err(|()| UnknownPolicy(s.to_string()))
    }
}

/// `p1,p2,…` or `all`, without repeats.
pub fn parse_policies(list: &str) -> Result<Vec<SimPolicy>, UnknownPolicy> {
    let mut out: Vec<SimPolicy> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let add = if name == "all" {
            SimPolicy::all()
        } else {
            vec![name.parse()?]
        };
        for p in add {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        return Err(UnknownPolicy(list.to_string()));
    }
    Ok(out)
}

/// The trace with task shapes interned and GPU models numbered.
#[derive(Clone, Debug)]
pub struct Workload {
    pub nodes: Vec<Node>,
    pub tasks: Vec<Task>,
    /// Distinct shapes of the tasks.
    pub shapes: Vec<Shape>,
    /// Shape index of each task.
    pub task_shape: Vec<usize>,
    /// GPU model names; a node's or shape's model index points here.
    pub models: Vec<String>,
}

/// More distinct GPU models than a 64-bit mask can name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the trace names {0} GPU models; at most 64 are supported")]
pub struct TooManyModels(pub usize);

impl Workload {
    pub fn new(nodes: Vec<Node>, tasks: Vec<Task>) -> Result<Self, TooManyModels> {
        let mut models: Vec<String> = Vec::new();
        let model_index = |name: &str, models: &mut Vec<String>| -> usize {
            match models.iter().position(|m| m == name) {
                Some(i) => i,
                None => {
                    models.push(name.to_string());
                    models.len() - 1
                }
            }
        };
        for n in &nodes {
            if !n.model.is_empty() {
                model_index(&n.model, &mut models);
            }
        }
        let mut shapes: Vec<Shape> = Vec::new();
        let mut index: std::collections::HashMap<Shape, usize> = Default::default();
        let mut task_shape = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let mut mask = 0u64;
            if t.num_gpu > 0 {
                for m in &t.gpu_spec {
                    let i = model_index(m, &mut models);
                    if i < 64 {
                        mask |= 1 << i;
                    }
                }
            }
            let shape = Shape {
                cpu_milli: t.cpu_milli,
                memory_mib: t.memory_mib,
                num_gpu: t.num_gpu,
                gpu_milli: t.gpu_milli,
                models: mask,
            };
            let id = *index.entry(shape.clone()).or_insert_with(|| {
                shapes.push(shape);
                shapes.len() - 1
            });
            task_shape.push(id);
        }
        if models.len() > 64 {
            return Err(TooManyModels(models.len()));
        }
        Ok(Workload {
            nodes,
            tasks,
            shapes,
            task_shape,
            models,
        })
    }

    /// The target workload of FGD and of the fragmentation metric: the trace's task shapes.
    pub fn target(&self) -> TargetWorkload {
        TargetWorkload::from_tasks(self.task_shape.iter().map(|&s| &self.shapes[s]))
    }

    /// The model index of a node.
    pub fn node_model(&self, node: &Node) -> Option<u32> {
        self.models
            .iter()
            .position(|m| *m == node.model && !node.model.is_empty())
            .map(|i| i as u32)
    }
}

/// Where a task went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Index into the simulated nodes.
    pub node: usize,
    pub gpus: GpuPick,
}

/// The simulator's own accounting disagreed with itself (a bug, never bad input).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Node(#[from] NodeAccountingError),
    #[error("allocator: {0}")]
    Allocator(#[from] PlacementError),
}

/// Used and total amounts, for utilisation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_used: u64,
    pub cpu_total: u64,
    pub memory_used: u64,
    pub memory_total: u64,
    pub gpu_used: u64,
    pub gpu_total: u64,
}

/// The score on `node` from one shape's cache row (see [`ScoreCache`]), or computed every time
/// without a cache.
fn cached(
    row: Option<&mut CacheRow>,
    node: usize,
    generation: &[u32],
    compute: impl FnOnce() -> Scored,
) -> Scored {
    match row {
        Some(row) => row.get(node, generation[node], compute),
        None => compute(),
    }
}

/// A simulated cluster running one policy.
pub struct SimCluster<'w> {
    workload: &'w Workload,
    target: &'w TargetWorkload,
    policy: SimPolicy,
    nodes: Vec<NodeState>,
    kinds: Vec<Vec<u32>>,
    generation: Vec<u32>,
    /// Tasks running on each node.
    running: Vec<u32>,
    cache: Option<ScoreCache>,
    allocator: Option<Allocator>,
    node_fragment: Vec<u64>,
    fragment_total: u64,
    usage: Usage,
    rng: ChaCha8Rng,
    random_ties: bool,
    /// The grant (shape, agent) the last decision's cycle took from the allocator, held until
    /// the task starts there ([`commit`](Self::commit)) or the next decision gives it back: the
    /// master's offer likewise holds what its cycle granted until the framework launches on it
    /// or declines.
    held: Option<(usize, AgentKey)>,
    /// Per shape, the ring search's memo of its last search for that shape
    /// ([`PlacementContext::with_memo`]): a node's eligibility and score are functions of its
    /// state, which changes only with a take, give-back or grade of its agent.
    memos: Vec<RefCell<WalkMemo>>,
}

impl<'w> SimCluster<'w> {
    /// A cluster of `nodes` (indices into the workload's nodes) running `policy`; `rings` lays
    /// out the allocator's rings; `ties` is the paper's policies' tie rule; `seed` drives random
    /// choices (random ties, `random`).
    pub fn new(
        workload: &'w Workload,
        target: &'w TargetWorkload,
        nodes: &[usize],
        policy: SimPolicy,
        rings: &RingsConfig,
        ties: Ties,
        seed: u64,
    ) -> Self {
        let states: Vec<NodeState> = nodes
            .iter()
            .map(|&i| {
                let n = &workload.nodes[i];
                NodeState::new(n.cpu_milli, n.memory_mib, n.gpus, workload.node_model(n))
            })
            .collect();
        let max_gpus = workload.shapes.iter().map(|s| s.num_gpu).max().unwrap_or(0);
        let kinds = vec![vec![0u32; 2 + max_gpus as usize]; states.len()];
        let allocator = match policy {
            SimPolicy::Allocator(_) | SimPolicy::SparingGpus(_) | SimPolicy::Seed001Ring => {
                let (rings, kind) = match policy {
                    SimPolicy::Allocator(kind) | SimPolicy::SparingGpus(kind) => {
                        (rings.clone(), kind)
                    }
                    _ => (RingsConfig::seed_001(), PlacerKind::Ring),
                };
                let mut cluster = Cluster::new(rings, kind);
                // Nodes are classed by model only when some task names a model: the class
                // index costs an ordered-set update per placement.
                let classed = workload.shapes.iter().any(|s| s.classes() != ALL_CLASSES);
                for (i, s) in states.iter().enumerate() {
                    let key = cluster.add_agent(scalar(s.cpu_total, s.memory_total, s.gpu_total()));
                    debug_assert_eq!(key, i, "agent keys follow node order");
                    cluster.set_grade(key, "gpus", s.grade());
                    if classed {
                        cluster.set_class(key, "gpus", s.class());
                    }
                }
                let requests = workload
                    .shapes
                    .iter()
                    .map(|s| TieredRequest {
                        request: Request {
                            framework: FRAMEWORK,
                            demand: scalar(s.cpu_milli, s.memory_mib, s.gpu_total()),
                            count: 0,
                        },
                        priority: PriorityConfig::DEFAULT_BASE,
                    })
                    .collect();
                let mut drf = DrfSorter::new();
                drf.add(FRAMEWORK, 1.0);
                Some(Allocator {
                    cluster,
                    drf,
                    requests,
                })
            }
            SimPolicy::Paper(_) => None,
        };
        let entries = ScoreCache::entries(workload.shapes.len(), states.len());
        // The paper's policies cache their scores; the ring caches the FGD growth it ranks its
        // candidates by (see `decide`).
        let scored = matches!(policy, SimPolicy::Paper(_) | SimPolicy::Allocator(_));
        let cache = (scored && entries <= MAX_CACHE_ENTRIES).then(|| {
            let types: Vec<NodeType> = states
                .iter()
                .map(|s| (s.cpu_total, s.memory_total, s.gpu_free().len(), s.model))
                .collect();
            // The ring ranks a few nodes, often idle ones: the idle table serves those from
            // the processor's cache. A paper policy scans every node: the per-node table alone.
            let by_type = matches!(policy, SimPolicy::Allocator(_));
            ScoreCache::new(workload.shapes.len(), &types, by_type)
        });
        let node_fragment: Vec<u64> = states
            .iter()
            .map(|s| target.node_fragment(s.cpu_free, s.gpu_free(), s.model))
            .collect();
        let usage = Usage {
            cpu_total: states.iter().map(|s| s.cpu_total).sum(),
            memory_total: states.iter().map(|s| s.memory_total).sum(),
            gpu_total: states.iter().map(|s| s.gpu_total()).sum(),
            ..Usage::default()
        };
        let allocator_memos = allocator.is_some();
        SimCluster {
            workload,
            target,
            policy,
            generation: vec![1; states.len()],
            running: vec![0; states.len()],
            nodes: states,
            kinds,
            cache,
            allocator,
            fragment_total: node_fragment.iter().sum(),
            node_fragment,
            usage,
            rng: ChaCha8Rng::seed_from_u64(seed),
            random_ties: ties == Ties::Random || policy == SimPolicy::Paper(PaperPolicy::Random),
            held: None,
            // Only the allocator's ring search reads them.
            memos: match allocator_memos {
                true => (0..workload.shapes.len())
                    .map(|_| RefCell::default())
                    .collect(),
                false => Vec::new(),
            },
        }
    }

    pub fn policy(&self) -> SimPolicy {
        self.policy
    }

    /// The same cluster with every node's scores cached per node, idle or not (no idle table).
    #[cfg(test)]
    fn without_idle_table(mut self) -> Self {
        let types: Vec<NodeType> = self.nodes.iter().map(|_| (0, 0, 0, None)).collect();
        self.cache = Some(ScoreCache::new(self.workload.shapes.len(), &types, false));
        self
    }

    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Expected fragmented GPU (milli) over the whole cluster against the target workload.
    pub fn fragmented_milli(&self) -> f64 {
        match self.target.total_weight() {
            0 => 0.0,
            w => self.fragment_total as f64 / w as f64,
        }
    }

    /// Whether one node could take a task of this shape now.
    pub fn fits(&self, node: usize, shape: usize) -> bool {
        self.nodes[node].fits(&self.workload.shapes[shape])
    }

    /// Picks a node and GPUs for a task of shape `shape`, changing nothing but the random
    /// generator, the score cache and the grant Ringmaster's allocator holds (its cycle takes
    /// the grant, as the master's does for an offer; the next decision gives it back unless
    /// [`commit`](Self::commit) starts the task there). `None` when nothing fits; an error
    /// only if the allocator's accounting disagrees with itself (a bug).
    pub fn decide(&mut self, shape: usize) -> Result<Option<Placement>, SimError> {
        let workload = self.workload;
        let s = &workload.shapes[shape];
        let SimCluster {
            target,
            policy,
            nodes,
            kinds,
            generation,
            cache,
            allocator,
            node_fragment,
            rng,
            random_ties,
            held,
            memos,
            ..
        } = self;
        match *policy {
            SimPolicy::Allocator(_) | SimPolicy::SparingGpus(_) | SimPolicy::Seed001Ring => {
                let Some(allocator) = allocator.as_mut() else {
                    return Ok(None);
                };
                if let Some((shape, agent)) = held.take() {
                    allocator.give_back(shape, agent)?;
                }
                // The ring's tie-break score (`RingScore`), cached per (node, shape) like the
                // paper's.
                let row = RefCell::new(cache.as_mut().map(|c| c.row(shape)));
                let ring_score = RingScore {
                    shape: s,
                    target,
                    nodes,
                    kinds,
                    node_fragment,
                };
                let fgd = |node: usize| -> Scored {
                    let mut row = row.borrow_mut();
                    cached(row.as_mut(), node, generation, || ring_score.compute(node))
                };
                let ranked = Cell::new(false);
                let fragment_score = TieBreak {
                    score: |agent: usize| {
                        ranked.set(true);
                        fgd(agent).map_or(i64::MAX, |(score, _)| score)
                    },
                    largest: target.names_models(),
                };
                // The ring walks only nodes whose GPU grade can take the task (`changed`), of
                // the models it allows (`NodeState::class`).
                let grade = s.grade();
                let shape_grade = move |_: &Resources| grade;
                let classes = s.classes();
                let shape_classes = move |_: &Resources| classes;
                let memo = &memos[shape];
                let recalled = memo.borrow().recalled();
                let mut context = PlacementContext::default()
                    .with_score(&fragment_score)
                    .with_grade(&shape_grade)
                    .with_classes(&shape_classes)
                    .with_memo(memo);
                let agent = match policy {
                    // Not a cycle: the master has no such step (its ring spares `gpus` by
                    // itself, RingSearch::spare), and a cycle's allocation step always places
                    // with `Cluster::place_in`, so the two-pass search stays a direct call.
                    SimPolicy::SparingGpus(_) => allocator
                        .cluster
                        .place_sparing(allocator.demand(shape), &|key| nodes[key].fits(s), "gpus")
                        .map(|decision| decision.agent),
                    _ => {
                        let feasible = |_: FrameworkKey, key: AgentKey| feasibility(&nodes[key], s);
                        let agent = allocator.decide(shape, &feasible, &mut context)?;
                        *held = agent.map(|agent| (shape, agent));
                        agent
                    }
                };
                let Some((agent, node)) = agent.and_then(|a| Some((a, nodes.get(a)?))) else {
                    return Ok(None);
                };
                // A node chosen by FGD's score gets the GPUs that score assumed (a search the
                // memo answered ranked by it too, though it may have scored nothing new).
                let ranked = ranked.get() || memo.borrow().recalled() > recalled;
                let gpus = match ranked {
                    true => fgd(agent).map(|(_, pick)| pick),
                    // Unranked, the master's placers bind a slice by the target's ShareFill
                    // too; the historical ring variants keep the best fit.
                    false if s.is_shared() && matches!(policy, SimPolicy::Allocator(_)) => node
                        .fits(s)
                        .then(|| {
                            select_shares_filling(
                                node.gpu_free(),
                                1,
                                s.gpu_milli,
                                SIM_SELECTION,
                                Some(target.share_fill()),
                            )
                        })
                        .flatten(),
                    false => node.best_fit_gpus(s),
                };
                if gpus.is_none() {
                    if let Some((shape, agent)) = held.take() {
                        allocator.give_back(shape, agent)?;
                    }
                }
                Ok(gpus.map(|gpus| Placement { node: agent, gpus }))
            }
            SimPolicy::Paper(policy) => Ok(PaperScan {
                policy,
                shape: s,
                target,
                nodes,
                kinds,
                node_fragment,
                generation,
                random_ties: *random_ties,
            }
            .run(cache.as_mut().map(|c| c.row(shape)), rng)),
        }
    }

    /// Runs a task of `shape` at `placement`.
    pub fn commit(&mut self, shape: usize, placement: Placement) -> Result<(), SimError> {
        let workload = self.workload;
        let s = &workload.shapes[shape];
        self.nodes[placement.node].take(s, placement.gpus)?;
        if let Some(allocator) = self.allocator.as_mut() {
            match self.held.take() {
                // The decision's cycle took it already.
                Some(held) if held == (shape, placement.node) => {}
                other => {
                    if let Some((shape, agent)) = other {
                        allocator.give_back(shape, agent)?;
                    }
                    allocator.take(shape, placement.node)?;
                }
            }
        }
        self.kinds[placement.node][kind(s)] += 1;
        self.running[placement.node] += 1;
        self.usage.cpu_used += s.cpu_milli;
        self.usage.memory_used += s.memory_mib;
        self.usage.gpu_used += s.gpu_total();
        self.changed(placement.node);
        Ok(())
    }

    /// Ends a task of `shape` that ran at `placement`.
    pub fn release(&mut self, shape: usize, placement: Placement) -> Result<(), SimError> {
        let workload = self.workload;
        let s = &workload.shapes[shape];
        self.nodes[placement.node].give_back(s, placement.gpus)?;
        if let Some(allocator) = self.allocator.as_mut() {
            allocator.give_back(shape, placement.node)?;
        }
        let count = &mut self.kinds[placement.node][kind(s)];
        *count = count.saturating_sub(1);
        let running = &mut self.running[placement.node];
        *running = running.saturating_sub(1);
        self.usage.cpu_used -= s.cpu_milli;
        self.usage.memory_used -= s.memory_mib;
        self.usage.gpu_used -= s.gpu_total();
        self.changed(placement.node);
        Ok(())
    }

    fn changed(&mut self, node: usize) {
        self.generation[node] = self.generation[node].wrapping_add(1).max(1);
        if let Some(allocator) = self.allocator.as_mut() {
            allocator
                .cluster
                .set_grade(node, "gpus", self.nodes[node].grade());
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.set_idle(node, self.running[node] == 0);
        }
        let n = &self.nodes[node];
        let fragment = self.target.node_fragment(n.cpu_free, n.gpu_free(), n.model);
        self.fragment_total = self.fragment_total - self.node_fragment[node] + fragment;
        self.node_fragment[node] = fragment;
    }
}

/// The ring's tie-break as the core asks for it: `score` per agent, and the largest candidates
/// only when the target workload names GPU models (as the master's `DeviceFragmentScore`).
struct TieBreak<F> {
    score: F,
    largest: bool,
}

impl<F: Fn(AgentKey) -> i64> AgentScore for TieBreak<F> {
    fn score(&self, agent: AgentKey, _: &Resources) -> i64 {
        (self.score)(agent)
    }

    fn ranks_largest(&self) -> bool {
        self.largest
    }
}

/// What the ring's tie-break score reads: FGD's score as the paper's simulator quantises it
/// (the growth of the node's expected GPU fragment, `fgd_quantised_score`), then the growth of
/// the node's unfed GPU (`GpuFeed`), ranked by `fgd_rank`; for a slice of one GPU first the
/// growth of what the expected slices cannot fill (`ShareFill`, `slice_rank`). With the GPUs
/// that score assumes. The master's score is the same (`DeviceFragmentScore`).
struct RingScore<'a> {
    shape: &'a Shape,
    target: &'a TargetWorkload,
    nodes: &'a [NodeState],
    kinds: &'a [Vec<u32>],
    node_fragment: &'a [u64],
}

impl RingScore<'_> {
    /// The score on `node`, computed (out of line: the cache's hits stay small).
    #[inline(never)]
    fn compute(&self, node: usize) -> Scored {
        let (s, target) = (self.shape, self.target);
        let state = &self.nodes[node];
        let view = NodeView {
            state,
            kinds: &self.kinds[node],
            fragment: self.node_fragment[node],
        };
        let unfed = target
            .feed()
            .unfed_growth(
                state.cpu_free,
                state.memory_free,
                state.gpu_free_total(),
                &s.into(),
            )
            .unwrap_or(0);
        if !s.is_shared() {
            let (negated, pick) = score(PaperPolicy::Fgd, &view, s, target)?;
            return Some((fgd_rank(-negated, unfed), pick));
        }
        // A slice takes the GPU the target's popular slices leave least unfillable
        // (`ShareFill`, as the master binds it), and the node is ranked by that growth, the
        // unfed growth, then FGD's score there.
        let fill = target.share_fill();
        let pick =
            select_shares_filling(state.gpu_free(), 1, s.gpu_milli, SIM_SELECTION, Some(fill))?;
        let gpu = pick.trailing_zeros() as usize;
        let fill_growth = fill.growth(state.gpu_free()[gpu], s.gpu_milli)?;
        let growth = target.growth(
            state.cpu_free,
            state.gpu_free(),
            state.model,
            &s.into(),
            &[gpu],
            view.fragment,
        )?;
        let score = target.quantised_score(growth);
        Some((slice_rank(fill_growth, unfed, score), pick))
    }
}

/// What a paper policy's scan reads.
struct PaperScan<'a> {
    policy: PaperPolicy,
    shape: &'a Shape,
    target: &'a TargetWorkload,
    nodes: &'a [NodeState],
    kinds: &'a [Vec<u32>],
    node_fragment: &'a [u64],
    generation: &'a [u32],
    random_ties: bool,
}

impl PaperScan<'_> {
    /// A paper policy's decision: every node's score (from the cache row when it holds it),
    /// the lowest (every score here is lower-is-better) wins; equal scores go to the first node
    /// or, with random ties, to one of them uniformly. A function of its own, never inlined,
    /// so that its loop is laid out the same whatever the rest of `decide` is (measured: the
    /// same scan's median moved by 10 % with changes to the ring's code beside it).
    #[inline(never)]
    fn run(self, mut row: Option<CacheRow>, rng: &mut ChaCha8Rng) -> Option<Placement> {
        let mut best: Option<(i64, Placement)> = None;
        let mut ties = 0u32;
        for node in 0..self.nodes.len() {
            let compute = || {
                score(
                    self.policy,
                    &NodeView {
                        state: &self.nodes[node],
                        kinds: &self.kinds[node],
                        fragment: self.node_fragment[node],
                    },
                    self.shape,
                    self.target,
                )
            };
            let value = cached(row.as_mut(), node, self.generation, compute);
            let Some((value, gpus)) = value else { continue };
            let here = Placement { node, gpus };
            match best {
                Some((b, _)) if value > b => {}
                Some((b, _)) if value == b => {
                    if !self.random_ties {
                        continue;
                    }
                    ties += 1;
                    if rng.random_range(0..ties) == 0 {
                        best = Some((value, here));
                    }
                }
                _ => {
                    best = Some((value, here));
                    ties = 1;
                }
            }
        }
        best.map(|(_, p)| p)
    }
}

/// The one framework the simulated allocator serves.
const FRAMEWORK: FrameworkKey = 0;

/// Ringmaster's allocator as the master runs it: the core's cluster over the nodes' scalar
/// view (agent key = node index), a DRF sorter with one framework, and each shape's request.
struct Allocator {
    cluster: Cluster,
    drf: DrfSorter,
    /// Each shape's request (its demand, count 0 between cycles), kept so that a cycle copies
    /// no demand.
    requests: Vec<TieredRequest>,
}

impl Allocator {
    /// The demand of a task of `shape`.
    fn demand(&self, shape: usize) -> &Resources {
        &self.requests[shape].request.demand
    }

    /// One allocation cycle of the core ([`run_cycle`]) for one task of `shape`: one request of
    /// count 1 at the base priority, granted exactly its demand, `feasible` the per-agent
    /// verdict, nothing running (no priorities in a trace, so nothing preempts). The cycle takes
    /// the grant from the cluster and records it in DRF, and the grant stays taken: the caller
    /// holds it ([`SimCluster::held`]) until the task starts or [`give_back`](Self::give_back).
    fn cycle(
        &mut self,
        shape: usize,
        feasible: &dyn Fn(FrameworkKey, AgentKey) -> Result<(), Filter>,
        context: &mut PlacementContext,
    ) -> Result<Outcome<()>, SimError> {
        let input = exact_cycle_input::<()>(feasible);
        let request = &mut self.requests[shape];
        request.request.count = 1;
        request.priority = input.base;
        let outcome = run_cycle(
            &mut self.cluster,
            &mut self.drf,
            std::slice::from_mut(request),
            &input,
            context,
        );
        Ok(outcome)
    }

    /// A task of `shape` starts on `agent` without a cycle's grant: taken from the cluster and
    /// recorded in DRF, as the cycle does.
    fn take(&mut self, shape: usize, agent: AgentKey) -> Result<(), SimError> {
        let demand = &self.requests[shape].request.demand;
        self.cluster.take(agent, demand)?;
        self.drf.allocated(FRAMEWORK, demand);
        Ok(())
    }

    /// A task of `shape` ended on `agent`, or a held grant was not used.
    fn give_back(&mut self, shape: usize, agent: AgentKey) -> Result<(), SimError> {
        let demand = &self.requests[shape].request.demand;
        self.cluster.give_back(agent, demand)?;
        self.drf.unallocated(FRAMEWORK, demand);
        Ok(())
    }

    /// The agent [`cycle`](Self::cycle) grants a task of `shape`, if any.
    fn decide(
        &mut self,
        shape: usize,
        feasible: &dyn Fn(FrameworkKey, AgentKey) -> Result<(), Filter>,
        context: &mut PlacementContext,
    ) -> Result<Option<AgentKey>, SimError> {
        let outcome = self.cycle(shape, feasible, context)?;
        Ok(outcome.grants.first().map(|grant| grant.agent))
    }
}

/// The cycle's feasibility verdict for a task of shape `s` on a node: cpu or memory short is
/// [`Filter::Resources`] (the allocator's scalars say so too); a GPU model not allowed, or too
/// few GPUs with `gpu_milli` free each although the node's total may be enough, is
/// [`Filter::Devices`].
fn feasibility(node: &NodeState, s: &Shape) -> Result<(), Filter> {
    if node.cpu_free < s.cpu_milli || node.memory_free < s.memory_mib {
        Err(Filter::Resources)
    } else if node.fits(s) {
        Ok(())
    } else {
        Err(Filter::Devices)
    }
}

/// The allocator's scalar view: `cpus`, `mem` (MiB) and `gpus` (milli-GPU as GPU units).
fn scalar(cpu_milli: u64, memory_mib: u64, gpu_milli: u64) -> Resources {
    debug_assert_eq!(u64::from(GPU_MILLI), MILLI);
    Resources::from_milli([
        ("cpus", cpu_milli),
        ("mem", memory_mib.saturating_mul(MILLI)),
        ("gpus", gpu_milli),
    ])
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_core::placement::fragmentation::TaskShape;
    use ringmaster_core::placement::UnservedReason;

    fn gpu_node(name: &str) -> Node {
        Node {
            name: name.into(),
            cpu_milli: 8000,
            memory_mib: 1024,
            gpus: 1,
            model: String::new(),
        }
    }

    fn task(name: &str, gpu_milli: u32) -> Task {
        Task {
            name: name.into(),
            cpu_milli: 1000,
            memory_mib: 10,
            num_gpu: 1,
            gpu_milli,
            gpu_spec: Vec::new(),
            priority: 0,
            creation: 0,
            deletion: None,
        }
    }

    /// Ringmaster's placers decide through the core's cycle, whose feasibility verdict is the
    /// per-GPU check. Node 0 has two GPUs with 500 free each (1.0 GPU free in the scalars, so
    /// first-fit's scalars alone would take it); node 1 one idle GPU. A whole-GPU task fails the
    /// cycle's filter on node 0 for device reasons ([`Filter::Devices`]) and goes to node 1; the
    /// cycle grants exactly its demand, at base priority (a demand nothing holds stays unserved
    /// `AtBase`, never preempting), and deciding holds exactly that grant, once however often
    /// it decides.
    #[test]
    fn allocator_places_through_the_cycle() {
        let two_gpus = Node {
            gpus: 2,
            ..gpu_node("node-0000")
        };
        let w = Workload::new(
            vec![two_gpus, gpu_node("node-0001")],
            vec![task("half", 500), task("whole", 1000)],
        )
        .unwrap();
        let (half, whole) = (w.task_shape[0], w.task_shape[1]);
        let target = w.target();
        let rings = RingsConfig::default();
        let policies = [
            SimPolicy::Allocator(PlacerKind::FirstFit),
            SimPolicy::Allocator(PlacerKind::Ring),
            SimPolicy::Allocator(PlacerKind::LinearBestFit),
            SimPolicy::Seed001Ring,
        ];
        for policy in policies {
            let mut c = SimCluster::new(&w, &target, &[0, 1], policy, &rings, Ties::First, 7);
            c.commit(
                half,
                Placement {
                    node: 0,
                    gpus: 0b01,
                },
            )
            .unwrap();
            c.commit(
                half,
                Placement {
                    node: 0,
                    gpus: 0b10,
                },
            )
            .unwrap();
            let shape = &w.shapes[whole];
            assert_eq!(feasibility(&c.nodes[0], shape), Err(Filter::Devices));
            assert_eq!(feasibility(&c.nodes[1], shape), Ok(()));
            let allocator = c.allocator.as_ref().unwrap();
            let demand = allocator.demand(whole).clone();
            let free = |c: &SimCluster, key| {
                c.allocator
                    .as_ref()
                    .unwrap()
                    .cluster
                    .agent(key)
                    .unwrap()
                    .free
                    .clone()
            };
            let before = (free(&c, 0), free(&c, 1));
            if policy == SimPolicy::Allocator(PlacerKind::FirstFit) {
                // The scalars alone would take node 0.
                let plain = allocator.cluster.place(&demand, &|_| true).unwrap();
                assert_eq!(plain.agent, 0);
            }
            let granted = before.1.checked_sub(&demand).unwrap();
            // Deciding twice holds one grant: the second decision gives the first back.
            for _ in 0..2 {
                assert_eq!(
                    c.decide(whole).unwrap(),
                    Some(Placement { node: 1, gpus: 1 }),
                    "{policy}"
                );
                assert_eq!(
                    (free(&c, 0), free(&c, 1)),
                    (before.0.clone(), granted.clone()),
                    "{policy}: decide holds exactly the grant"
                );
            }
            // Giving the held grant back restores the allocator.
            let (held_shape, held_agent) = c.held.take().unwrap();
            c.allocator
                .as_mut()
                .unwrap()
                .give_back(held_shape, held_agent)
                .unwrap();
            assert_eq!((free(&c, 0), free(&c, 1)), before, "{policy}");
            // The cycle itself: one grant of exactly the demand on node 1, nothing unserved.
            let nodes = &c.nodes;
            let feasible = |_: FrameworkKey, key: AgentKey| feasibility(&nodes[key], shape);
            let allocator = c.allocator.as_mut().unwrap();
            let mut context = PlacementContext::default();
            let out = allocator.cycle(whole, &feasible, &mut context).unwrap();
            let granted: Vec<_> = out
                .grants
                .iter()
                .map(|g| (g.framework, g.agent, &g.resources))
                .collect();
            assert_eq!(granted, [(FRAMEWORK, 1, &demand)], "{policy}");
            assert!(out.unserved.is_empty() && out.preemptions.is_empty());
            // No agent feasible: unserved at base, no preemption.
            let out = allocator
                .cycle(whole, &|_, _| Err(Filter::Devices), &mut context)
                .unwrap();
            assert!(out.grants.is_empty() && out.preemptions.is_empty());
            let reasons: Vec<_> = out.unserved.iter().map(|u| (u.count, u.reason)).collect();
            assert_eq!(reasons, [(1, UnservedReason::AtBase)], "{policy}");
        }
    }

    /// The grant a decision holds is the one its task starts with: committing there takes the
    /// demand once, committing elsewhere gives the held grant back first, and releasing
    /// restores the allocator. Two one-GPU nodes, whole-GPU tasks, the default ring.
    #[test]
    fn commit_starts_the_task_with_the_held_grant() {
        let w = Workload::new(
            vec![gpu_node("node-0000"), gpu_node("node-0001")],
            vec![task("whole", 1000)],
        )
        .unwrap();
        let whole = w.task_shape[0];
        let target = w.target();
        let rings = RingsConfig::default();
        let policy = SimPolicy::Allocator(PlacerKind::Ring);
        let mut c = SimCluster::new(&w, &target, &[0, 1], policy, &rings, Ties::First, 7);
        let free = |c: &SimCluster| -> Vec<Resources> {
            let cluster = &c.allocator.as_ref().unwrap().cluster;
            (0..2)
                .map(|key| cluster.agent(key).unwrap().free.clone())
                .collect()
        };
        let idle = free(&c);
        let demand = c.allocator.as_ref().unwrap().demand(whole).clone();
        let taken = idle[0].checked_sub(&demand).unwrap();

        let first = c.decide(whole).unwrap().unwrap();
        assert_eq!(first.node, 0);
        c.commit(whole, first).unwrap();
        assert_eq!(free(&c), [taken.clone(), idle[1].clone()], "taken once");

        // After a release, held on node 0 but started on node 1: node 0 gets the grant back.
        c.release(whole, first).unwrap();
        let held = c.decide(whole).unwrap().unwrap();
        assert_eq!(held.node, 0);
        c.commit(whole, Placement { node: 1, gpus: 1 }).unwrap();
        assert_eq!(free(&c), [idle[0].clone(), taken.clone()]);
        c.release(whole, Placement { node: 1, gpus: 1 }).unwrap();
        assert_eq!(free(&c), idle);
    }

    /// Equal node scores go to the lowest node index (the smallest node name). Target: 0.1-GPU
    /// tasks (weight 9), 0.5-GPU tasks (weight 1). Node 0 free [1000], node 1 free [300] after
    /// a 0.7 task. A 0.2 task: node 0 grows by 0 (score 50), node 1 shrinks its fragment from
    /// 300 to 100 weighted, ΔF = +20 milli-GPU (score 50): `fgd` ties and takes node 0,
    /// `fgd-exact` takes node 1 (growth −200).
    #[test]
    fn fgd_ties_go_to_the_smallest_node_name() {
        let w = Workload::new(
            vec![gpu_node("node-0000"), gpu_node("node-0001")],
            vec![task("big", 700), task("fifth", 200)],
        )
        .unwrap();
        let (big, fifth) = (w.task_shape[0], w.task_shape[1]);
        let shape = |gpu_milli| TaskShape {
            cpu_milli: 1000,
            num_gpu: 1,
            gpu_milli,
            models: 0,
            memory_mib: 0,
        };
        let target = TargetWorkload::from_counts([(shape(100), 9), (shape(500), 1)]);
        let rings = RingsConfig::default();
        let decide = |policy: PaperPolicy, ties: Ties| {
            let mut c = SimCluster::new(
                &w,
                &target,
                &[0, 1],
                SimPolicy::Paper(policy),
                &rings,
                ties,
                7,
            );
            let fresh = c.decide(fifth).unwrap().unwrap();
            c.commit(big, Placement { node: 1, gpus: 1 }).unwrap();
            (fresh, c.decide(fifth).unwrap().unwrap())
        };
        let first = |node| Placement { node, gpus: 1 };
        // Two idle nodes tie under both; node 0.
        assert_eq!(decide(PaperPolicy::Fgd, Ties::First), (first(0), first(0)));
        assert_eq!(
            decide(PaperPolicy::FgdExact, Ties::First),
            (first(0), first(1))
        );
    }

    /// The ring ranks equal FGD scores by the growth of unfed GPU. Target: whole-GPU tasks with
    /// 10 cpus each (the feed: 10 cpus per GPU) and 5-cpu CPU-only tasks. Node 0 has 2 GPUs
    /// and 20 cpus, node 1 2 GPUs and 40 cpus; neither fragment grows by a CPU-only task (the
    /// GPU shape still fits both), so FGD's quantised scores tie. On node 0 it leaves 15 cpus
    /// for 2 GPUs (500 milli-GPU unfed), on node 1 35 cpus (none): the ring takes node 1,
    /// although the lowest key and the least cpu left would both take node 0.
    #[test]
    fn ring_breaks_equal_fgd_scores_by_unfed_gpu() {
        let node = |name: &str, cpu_milli| Node {
            cpu_milli,
            gpus: 2,
            ..gpu_node(name)
        };
        let cpu_only = Task {
            cpu_milli: 5000,
            num_gpu: 0,
            gpu_milli: 0,
            ..task("cpu", 0)
        };
        let whole = Task {
            cpu_milli: 10_000,
            ..task("whole", 1000)
        };
        let w = Workload::new(
            vec![node("node-0000", 20_000), node("node-0001", 40_000)],
            vec![whole, cpu_only],
        )
        .unwrap();
        let target = w.target();
        assert_eq!(target.feed().cpu_milli_per_gpu, 10_000);
        let rings = RingsConfig::default();
        let ring = SimPolicy::Allocator(PlacerKind::Ring);
        let mut c = SimCluster::new(&w, &target, &[0, 1], ring, &rings, Ties::First, 7);
        let cpu = w.task_shape[1];
        assert_eq!(c.decide(cpu).unwrap(), Some(Placement { node: 1, gpus: 0 }));
        // FGD itself ties and takes the lowest index.
        let fgd = SimPolicy::Paper(PaperPolicy::Fgd);
        let mut f = SimCluster::new(&w, &target, &[0, 1], fgd, &rings, Ties::First, 7);
        assert_eq!(f.decide(cpu).unwrap(), Some(Placement { node: 0, gpus: 0 }));
    }

    /// The idle table is exact: the ring places a mixed workload (node types differing in cpu,
    /// GPU count or GPU model only; slices, whole and multi-GPU tasks, CPU-only tasks, tasks
    /// constrained to a model; nodes going idle again as tasks end) exactly as with every
    /// score cached per node.
    #[test]
    fn the_idle_table_places_as_the_per_node_cache() {
        let node = |name: String, cpu_milli, gpus, model: &str| Node {
            name,
            cpu_milli,
            memory_mib: 64 * 1024,
            gpus,
            model: model.into(),
        };
        let mut nodes = Vec::new();
        for i in 0..24 {
            let (cpu, gpus, model) = match i % 4 {
                0 => (32_000, 2, "A"),
                1 => (32_000, 2, "B"),
                2 => (64_000, 2, "A"),
                _ => (32_000, 4, "A"),
            };
            nodes.push(node(format!("node-{i:04}"), cpu, gpus, model));
        }
        let mut tasks = Vec::new();
        for i in 0..160u32 {
            let (num_gpu, gpu_milli) =
                [(1, 250), (1, 500), (1, 1000), (2, 1000), (0, 0)][i as usize % 5];
            tasks.push(Task {
                name: format!("task-{i}"),
                cpu_milli: 1000 + u64::from(i % 7) * 6000,
                memory_mib: 512 * u64::from(1 + i % 3),
                num_gpu,
                gpu_milli,
                gpu_spec: match i % 6 {
                    0 if num_gpu > 0 => vec!["B".to_string()],
                    _ => Vec::new(),
                },
                priority: 0,
                creation: 0,
                deletion: None,
            });
        }
        let w = Workload::new(nodes, tasks).unwrap();
        let target = w.target();
        let rings = RingsConfig::default();
        let all: Vec<usize> = (0..w.nodes.len()).collect();
        let ring = SimPolicy::Allocator(PlacerKind::Ring);
        let run = |mut c: SimCluster| {
            let mut placed = Vec::new();
            let mut running: std::collections::VecDeque<(usize, Placement)> = Default::default();
            for &shape in &w.task_shape {
                let decision = c.decide(shape).unwrap();
                if let Some(p) = decision {
                    c.commit(shape, p).unwrap();
                    running.push_back((shape, p));
                }
                placed.push(decision);
                // Tasks end too, so nodes go idle again and are read from the idle table.
                if running.len() > 40 {
                    let (shape, p) = running.pop_front().unwrap();
                    c.release(shape, p).unwrap();
                }
            }
            placed
        };
        let with_table = run(SimCluster::new(
            &w,
            &target,
            &all,
            ring,
            &rings,
            Ties::First,
            7,
        ));
        let per_node = run(
            SimCluster::new(&w, &target, &all, ring, &rings, Ties::First, 7).without_idle_table(),
        );
        assert!(with_table.iter().filter(|p| p.is_some()).count() > 100);
        assert_eq!(with_table, per_node);
    }
}
