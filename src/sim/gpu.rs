//! One node's free resources with per-GPU detail, and task shapes as the simulator sees them.
//!
//! The allocator's scalar view (`gpus` = the node's total free milli-GPU) cannot tell a node with
//! one free GPU from one with two half-used GPUs; a task asking for a whole GPU fits only the
//! first. [`NodeState`] keeps the free milli of each GPU, so "fits" can be checked per GPU and
//! the GPUs inside the chosen node picked by best fit (the least free GPU that still holds the
//! request), the in-node rule of the paper's BestFit and of Kubernetes GPU-share schedulers.
//!
//! That pick is the master's: [`ringmaster_core::devices::select_shares`] with
//! [`SIM_SELECTION`], the free-share form of [`DeviceState::select`] (the master's binding with
//! `devices.selection: most-used-that-fits`). FGD's per-GPU choice is the core's too
//! ([`TargetWorkload::least_growth`](ringmaster_core::placement::fragmentation::TargetWorkload::least_growth),
//! over [`ringmaster_core::devices::select_shares_by_cost`]).
//!
//! [`DeviceState::select`]: ringmaster_core::devices::DeviceState::select

use super::trace::GPU_MILLI;
use ringmaster_core::devices::{select_shares, DeviceSelection};
use ringmaster_core::placement::devices::share_grade;
use ringmaster_core::placement::fragmentation::TaskShape;
use ringmaster_core::placement::ring_set::{ALL_CLASSES, UNCLASSED};

/// The device selection the simulator binds GPUs by when no score chose them: best fit
/// (`most-used-that-fits`, "pack"), as the paper's policies do. The master's default is
/// `least-used`; configured with `devices.selection: most-used-that-fits` it binds as simulated.
pub const SIM_SELECTION: DeviceSelection = DeviceSelection::MostUsedThatFits;

/// What one task needs, in the units the simulator compares. Tasks with equal shapes are
/// interchangeable for placement, so scores are cached per shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Milli-GPU wanted on each GPU (0 for CPU-only tasks).
    pub gpu_milli: u32,
    /// Bit i set = may run on GPU model i; 0 = any model.
    pub models: u64,
}

impl Shape {
    /// Total milli-GPU asked for.
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// A share of one GPU (less than a whole one).
    pub fn is_shared(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < GPU_MILLI
    }

    /// The GPU grade a node needs to take this task ([`NodeState::grade`]): a slice's quarter
    /// of a GPU, or how many idle GPUs; 0 (every node) for CPU-only tasks and for shares of
    /// several GPUs.
    pub fn grade(&self) -> u8 {
        if self.gpu_milli == GPU_MILLI {
            idle_grade(self.num_gpu)
        } else if self.num_gpu == 1 {
            share_grade(self.gpu_milli)
        } else {
            0
        }
    }

    /// The ring classes whose nodes may take this task ([`NodeState::class`], bit `c` for
    /// class `c`): the models it allows when it asks for GPUs and names some, else every
    /// class (a CPU-only task runs on a node of any model).
    pub fn classes(&self) -> u64 {
        match (self.num_gpu, self.models) {
            (0, _) | (_, 0) => ALL_CLASSES,
            (_, models) => models,
        }
    }
}

/// The grade of a count of idle GPUs: 4 for 1 (the grade of a whole GPU's share,
/// [`share_grade`]), 5 for 2–3, 6 for 4–7, 7 for 8 or more
/// (nondecreasing in the count, so a node's grade below a task's means fewer idle GPUs than
/// the task asks for).
fn idle_grade(idle: u32) -> u8 {
    match idle {
        0 => 0,
        1 => 4,
        2..=3 => 5,
        4..=7 => 6,
        _ => 7,
    }
}

/// What the fragment measure sees of a task (memory only for the target's `GpuFeed`).
impl From<&Shape> for TaskShape {
    fn from(s: &Shape) -> Self {
        TaskShape {
            cpu_milli: s.cpu_milli,
            num_gpu: s.num_gpu,
            gpu_milli: s.gpu_milli,
            models: s.models,
            memory_mib: s.memory_mib,
        }
    }
}

/// The GPUs a task got on its node: bit i = GPU i.
pub type GpuPick = u64;

/// One node: totals, free amounts, the free milli of each GPU, and its GPU model.
///
/// Beside the per-GPU amounts it keeps how many GPUs are wholly free and the most any one GPU
/// has free, so [`fits`](Self::fits) answers the trace's shapes (whole GPUs, or a share of one)
/// without reading the per-GPU amounts: the ring's search checks about 60 candidates per
/// decision, and that read was a memory access apiece (docs/results.md, "Stop 33").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_total: u64,
    pub memory_total: u64,
    pub cpu_free: u64,
    pub memory_free: u64,
    /// Free milli-GPU of each GPU (0..=1000).
    gpu_free: Vec<u32>,
    /// GPUs with all their milli free.
    idle_gpus: u32,
    /// The most milli-GPU free on one GPU (0 without GPUs).
    max_gpu_free: u32,
    /// Index of the GPU model (`None` without a known model).
    pub model: Option<u32>,
}

/// A change that would over-commit a node or give back more than it has (a simulator bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node over-committed or over-released: {0}")]
pub struct NodeAccountingError(pub &'static str);

impl NodeState {
    /// The node's GPU grade for the ring's graded walk (`Cluster::set_grade` on `gpus`): with
    /// an idle GPU, the grade of the idle count; else the quarter of a GPU its fullest GPU has
    /// free. Never below the grade of a task the node can take ([`Shape::grade`]): a task of
    /// whole GPUs needs that many idle, a slice one GPU with that much free.
    pub fn grade(&self) -> u8 {
        match self.idle_gpus {
            0 => share_grade(self.max_gpu_free),
            idle => idle_grade(idle),
        }
    }

    /// The node's class in the ring's classed walk (`Cluster::set_class` on `gpus`): its GPU
    /// model's index, [`UNCLASSED`] (walked for every task) without a model or for an index
    /// past the classes. A task naming models can take a node only of one of them
    /// ([`NodeState::model_allowed`]), so it never needs the other classes ([`Shape::classes`]).
    pub fn class(&self) -> u8 {
        self.model
            .filter(|&m| m < u32::from(UNCLASSED))
            .map_or(UNCLASSED, |m| m as u8)
    }

    pub fn new(cpu_milli: u64, memory_mib: u64, gpus: u32, model: Option<u32>) -> Self {
        NodeState {
            cpu_total: cpu_milli,
            memory_total: memory_mib,
            cpu_free: cpu_milli,
            memory_free: memory_mib,
            gpu_free: vec![GPU_MILLI; gpus as usize],
            idle_gpus: gpus,
            max_gpu_free: if gpus > 0 { GPU_MILLI } else { 0 },
            model,
        }
    }

    /// Free milli-GPU of each GPU (0..=1000).
    pub fn gpu_free(&self) -> &[u32] {
        &self.gpu_free
    }

    /// Sets every GPU's free milli at once (each at most [`GPU_MILLI`]).
    #[cfg(test)]
    pub fn set_gpu_free(&mut self, free: &[u32]) {
        self.gpu_free = free.to_vec();
        self.summarise();
    }

    /// Recounts the summary [`fits`](Self::fits) reads after the per-GPU amounts changed.
    fn summarise(&mut self) {
        self.idle_gpus = self.gpu_free.iter().filter(|&&g| g == GPU_MILLI).count() as u32;
        self.max_gpu_free = self.gpu_free.iter().copied().max().unwrap_or(0);
    }

    pub fn gpu_total(&self) -> u64 {
        self.gpu_free.len() as u64 * u64::from(GPU_MILLI)
    }

    pub fn gpu_free_total(&self) -> u64 {
        self.gpu_free.iter().map(|&g| u64::from(g)).sum()
    }

    /// No GPU has anything allocated.
    pub fn gpus_idle(&self) -> bool {
        self.gpu_free.iter().all(|&g| g == GPU_MILLI)
    }

    /// The model constraint allows this node.
    pub fn model_allowed(&self, shape: &Shape) -> bool {
        shape.models == 0
            || self
                .model
                .is_some_and(|m| m < 64 && shape.models & (1 << m) != 0)
    }

    /// CPU, memory, model, and `num_gpu` GPUs each with at least `gpu_milli` free.
    pub fn fits(&self, shape: &Shape) -> bool {
        if self.cpu_free < shape.cpu_milli || self.memory_free < shape.memory_mib {
            return false;
        }
        if shape.num_gpu == 0 {
            return true;
        }
        if !self.model_allowed(shape) || (self.gpu_free.len() as u64) < u64::from(shape.num_gpu) {
            return false;
        }
        if shape.gpu_milli == GPU_MILLI {
            self.idle_gpus >= shape.num_gpu
        } else if shape.num_gpu == 1 {
            self.max_gpu_free >= shape.gpu_milli
        } else {
            // Several shares of GPUs: not in the trace family, counted.
            self.gpu_free
                .iter()
                .filter(|&&g| g >= shape.gpu_milli)
                .count()
                >= shape.num_gpu as usize
        }
    }

    /// Best fit inside the node: the `num_gpu` GPUs with the least free milli that still hold
    /// `gpu_milli` (ties: lowest index). `None` when the node does not fit the shape.
    pub fn best_fit_gpus(&self, shape: &Shape) -> Option<GpuPick> {
        if !self.fits(shape) {
            return None;
        }
        Some(self.best_fit_gpus_unchecked(shape))
    }

    /// [`best_fit_gpus`](Self::best_fit_gpus) for a shape known to fit (0 if it does not).
    pub fn best_fit_gpus_unchecked(&self, shape: &Shape) -> GpuPick {
        select_shares(
            &self.gpu_free,
            shape.num_gpu,
            shape.gpu_milli,
            SIM_SELECTION,
        )
        .unwrap_or(0)
    }

    /// Takes the shape off the node, `gpu_milli` from each GPU in `pick`.
    pub fn take(&mut self, shape: &Shape, pick: GpuPick) -> Result<(), NodeAccountingError> {
        if pick.count_ones() != shape.num_gpu {
            return Err(NodeAccountingError("GPU pick does not match the task"));
        }
        if self.cpu_free < shape.cpu_milli || self.memory_free < shape.memory_mib {
            return Err(NodeAccountingError("cpu or memory"));
        }
        for i in bits(pick) {
            if self.gpu_free.get(i).is_none_or(|&g| g < shape.gpu_milli) {
                return Err(NodeAccountingError("GPU"));
            }
        }
        self.cpu_free -= shape.cpu_milli;
        self.memory_free -= shape.memory_mib;
        for i in bits(pick) {
            self.gpu_free[i] -= shape.gpu_milli;
        }
        self.summarise();
        Ok(())
    }

    /// Gives back what [`take`](Self::take) took.
    pub fn give_back(&mut self, shape: &Shape, pick: GpuPick) -> Result<(), NodeAccountingError> {
        if self.cpu_free + shape.cpu_milli > self.cpu_total
            || self.memory_free + shape.memory_mib > self.memory_total
        {
            return Err(NodeAccountingError("cpu or memory above total"));
        }
        for i in bits(pick) {
            if self
                .gpu_free
                .get(i)
                .is_none_or(|&g| g + shape.gpu_milli > GPU_MILLI)
            {
                return Err(NodeAccountingError("GPU above total"));
            }
        }
        self.cpu_free += shape.cpu_milli;
        self.memory_free += shape.memory_mib;
        for i in bits(pick) {
            self.gpu_free[i] += shape.gpu_milli;
        }
        self.summarise();
        Ok(())
    }
}

/// The indices of the set bits, lowest first.
pub fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: u64, num_gpu: u32, gpu_milli: u32) -> Shape {
        Shape {
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu,
            gpu_milli,
            models: 0,
        }
    }

    #[test]
    fn whole_gpus_need_wholly_free_gpus() {
        let mut node = NodeState::new(8000, 1000, 2, None);
        node.take(&shape(1000, 1, 500), 0b01).unwrap();
        node.take(&shape(1000, 1, 500), 0b10).unwrap();
        // 1000 milli free in total, but on two GPUs: a whole GPU does not fit.
        assert_eq!(node.gpu_free_total(), 1000);
        assert!(!node.fits(&shape(1000, 1, 1000)));
        assert!(node.fits(&shape(1000, 1, 500)));
        assert!(!node.fits(&shape(1000, 2, 600)));
    }

    #[test]
    fn best_fit_picks_the_least_free_gpu_that_holds_the_share() {
        let mut node = NodeState::new(8000, 1000, 4, None);
        node.take(&shape(0, 1, 300), 0b0001).unwrap(); // 700
        node.take(&shape(0, 1, 600), 0b0010).unwrap(); // 400
        node.take(&shape(0, 1, 900), 0b0100).unwrap(); // 100
        assert_eq!(node.best_fit_gpus(&shape(0, 1, 350)), Some(0b0010));
        assert_eq!(node.best_fit_gpus(&shape(0, 1, 500)), Some(0b0001));
        assert_eq!(node.best_fit_gpus(&shape(0, 1, 1000)), Some(0b1000));
        assert_eq!(node.best_fit_gpus(&shape(0, 2, 400)), Some(0b0011));
        assert_eq!(node.best_fit_gpus(&shape(0, 0, 0)), Some(0));
        assert_eq!(node.best_fit_gpus(&shape(9000, 0, 0)), None);
    }

    #[test]
    fn take_and_give_back_refuse_over_commit() {
        let mut node = NodeState::new(2000, 10, 1, Some(0));
        let s = shape(1500, 1, 800);
        node.take(&s, 1).unwrap();
        assert!(node.take(&s, 1).is_err());
        assert!(node.take(&shape(100, 1, 300), 1).is_err());
        assert!(node.take(&shape(100, 1, 100), 0b10).is_err());
        node.give_back(&s, 1).unwrap();
        assert!(node.give_back(&s, 1).is_err());
        assert_eq!(node, NodeState::new(2000, 10, 1, Some(0)));
    }

    #[test]
    fn model_constraint() {
        let node = NodeState::new(2000, 10, 1, Some(2));
        let mut s = shape(1, 1, 100);
        s.models = 0b100;
        assert!(node.fits(&s));
        s.models = 0b011;
        assert!(!node.fits(&s));
        s.num_gpu = 0;
        s.gpu_milli = 0;
        assert!(node.fits(&s), "CPU-only tasks ignore the GPU model");
        assert_eq!(bits(0b1010).collect::<Vec<_>>(), [1, 3]);
    }

    /// The definition `fits` answers without reading every GPU: cpu, memory, model, and
    /// `num_gpu` GPUs each with `gpu_milli` free.
    fn fits_by_counting(node: &NodeState, s: &Shape) -> bool {
        node.cpu_free >= s.cpu_milli
            && node.memory_free >= s.memory_mib
            && (s.num_gpu == 0
                || node.model_allowed(s)
                    && node
                        .gpu_free()
                        .iter()
                        .filter(|&&g| g >= s.gpu_milli)
                        .count()
                        >= s.num_gpu as usize)
    }

    proptest::proptest! {
        /// After any takes and gives back, `fits` (from the node's summary of its GPUs) agrees
        /// with counting the GPUs, for whole GPUs, shares of one and shares of several; and a
        /// node that fits a task is graded at least as high as the task and is of a class the
        /// task allows (the ring's graded and classed walks rely on both), whatever its model.
        #[test]
        fn fits_agrees_with_counting_the_gpus(
            gpus in 0u32..=8,
            model in proptest::option::of(proptest::prop_oneof![0u32..3, 60u32..70]),
            steps in proptest::collection::vec((0u32..=3, 1u32..=1000, 0u64..256, proptest::bool::ANY), 0..40),
        ) {
            let mut node = NodeState::new(64_000, 1000, gpus, model);
            let mut running: Vec<(Shape, GpuPick)> = Vec::new();
            for (num_gpu, milli, pick, give) in steps {
                if give && !running.is_empty() {
                    let (s, pick) = running.remove(0);
                    node.give_back(&s, pick).unwrap();
                } else {
                    let milli = if num_gpu > 1 { 1000 } else { milli };
                    let s = shape(100, num_gpu, if num_gpu == 0 { 0 } else { milli });
                    let pick = (0..gpus as usize)
                        .filter(|&i| pick & (1 << i) != 0)
                        .take(num_gpu as usize)
                        .fold(0u64, |p, i| p | 1 << i);
                    if node.take(&s, pick).is_ok() {
                        running.push((s, pick));
                    }
                }
                for num_gpu in 0..=4 {
                    for milli in [1, 250, 500, 999, 1000, 1001] {
                        for models in [0, 0b10, 0b01, 0b110, 1 << 63 | 1 << 62] {
                            let mut s = shape(100, num_gpu, milli);
                            s.models = models;
                            proptest::prop_assert_eq!(
                                node.fits(&s),
                                fits_by_counting(&node, &s),
                                "{:?} on {:?}", s, node
                            );
                            if node.fits(&s) {
                                proptest::prop_assert!(
                                    node.grade() >= s.grade(),
                                    "{:?} graded {} on {:?} graded {}", s, s.grade(), node, node.grade()
                                );
                                proptest::prop_assert!(
                                    s.classes() & (1 << node.class() | 1 << UNCLASSED) != 0,
                                    "{:?} allows {:b}, {:?} is of class {}", s, s.classes(), node, node.class()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
