//! The simulator's score cache: a policy's score of each (task shape, node), kept until the
//! node changes.
//!
//! Two tables. Nodes running something have one entry per (shape, node), stamped with the node's
//! generation and recomputed when the node changed since (shape-major, entry `shape × nodes +
//! node`, so the scores one decision reads, all for one shape, lie together and a scan reads
//! them in order). An idle node (no task running) has all its capacity free, so its score is the
//! same as every other idle node's of its *type* (equal cpu, memory, GPU count and GPU model):
//! those come from a table per (shape, type), computed once per run and small enough to stay in
//! the processor's cache (on openb's 1,213 GPU nodes and 151 shapes the per-node table is
//! 2.9 MB at 16 bytes an entry; the idle one is a few kB). Exact: a score is a function of the node's free amounts,
//! its model, its running task kinds and its expected fragment, and for an idle node all four
//! follow from its type.

use std::collections::HashMap;

use super::gpu::GpuPick;

/// What a policy's score function returns for one node: the score and the GPUs it assumes,
/// `None` when the shape does not fit there.
pub type Scored = Option<(i64, GpuPick)>;

/// What makes idle nodes interchangeable: total cpu (milli), memory (MiB), GPU count, GPU
/// model.
pub type NodeType = (u64, u64, usize, Option<u32>);

/// One cached score for a busy node, in 16 bytes (four to a cache line: a decision of the
/// ring reads entries of a few dozen nodes scattered over its shape's row, and twice as many
/// of them stay in the processor's cache as at 32 bytes).
#[derive(Clone, Copy, Default)]
struct Entry {
    score: i64,
    /// The GPUs the score assumes; [`NO_FIT`] when the shape does not fit.
    pick: u32,
    /// The node's generation when computed (0: never; generations start at 1).
    generation: u32,
}

/// [`Entry::pick`] of a shape that does not fit. A pick that does not fit in 32 bits, or is
/// this value, is not cached (nodes of 32 GPUs or more: computed every time).
const NO_FIT: u32 = u32::MAX;

impl Entry {
    fn value(&self) -> Scored {
        (self.pick != NO_FIT).then_some((self.score, GpuPick::from(self.pick)))
    }

    /// The entry holding `value` at `generation`, if it can be held.
    fn of(value: Scored, generation: u32) -> Option<Entry> {
        let (score, pick) = match value {
            None => (0, NO_FIT),
            Some((score, pick)) => (score, u32::try_from(pick).ok().filter(|&p| p != NO_FIT)?),
        };
        Some(Entry {
            score,
            pick,
            generation,
        })
    }
}

/// [`ScoreCache::idle_type`] of a node running something.
const BUSY: u32 = u32::MAX;

/// The score cache of one simulated cluster; see the module doc.
pub struct ScoreCache {
    nodes: usize,
    busy: Vec<Entry>,
    /// Each node's type (index into the idle table's rows).
    node_type: Vec<u32>,
    /// Each node's type while it is idle, [`BUSY`] while it runs something: one read tells a
    /// lookup where the score is ([`set_idle`](Self::set_idle) keeps it).
    idle_type: Vec<u32>,
    types: usize,
    /// `shape × types + type`: an idle node's score, `None` until computed; empty when idle
    /// nodes are cached per node like the others.
    idle: Vec<Option<Scored>>,
}

impl ScoreCache {
    /// A cache for `shapes` task shapes over nodes of these types (one per node: total cpu,
    /// memory, GPU count, GPU model; nodes with equal types are interchangeable when idle).
    /// With `by_type` false idle nodes are cached per node like busy ones: a policy that scans
    /// every node in order reads the per-node table as one stream, which the idle table's
    /// branch per node slows down (`fgd`'s decision median on openb, 3.4 → 4.1 µs).
    pub fn new(shapes: usize, node_types: &[NodeType], by_type: bool) -> Self {
        let mut seen: HashMap<NodeType, u32> = HashMap::new();
        let node_type: Vec<u32> = node_types
            .iter()
            .map(|t| {
                let next = seen.len() as u32;
                *seen.entry(*t).or_insert(next)
            })
            .collect();
        let nodes = node_types.len();
        ScoreCache {
            nodes,
            busy: vec![Entry::default(); shapes.saturating_mul(nodes)],
            idle_type: node_type.clone(),
            node_type,
            types: seen.len(),
            idle: match by_type {
                true => vec![None; shapes.saturating_mul(seen.len())],
                false => Vec::new(),
            },
        }
    }

    /// How many entries a cache for `shapes` over `nodes` nodes holds (the per-node table).
    pub fn entries(shapes: usize, nodes: usize) -> usize {
        shapes.saturating_mul(nodes)
    }

    /// Whether `node` runs nothing (every node does at first): an idle node's scores come
    /// from its type's row of the idle table.
    pub fn set_idle(&mut self, node: usize, idle: bool) {
        if let (Some(slot), Some(&t)) = (self.idle_type.get_mut(node), self.node_type.get(node)) {
            *slot = if idle { t } else { BUSY };
        }
    }

    /// The scores of one shape: what one decision reads.
    pub fn row(&mut self, shape: usize) -> CacheRow<'_> {
        let idle = match self.idle.is_empty() {
            true => &mut [][..],
            false => &mut self.idle[shape * self.types..(shape + 1) * self.types],
        };
        CacheRow {
            busy: &mut self.busy[shape * self.nodes..(shape + 1) * self.nodes],
            idle,
            idle_type: &self.idle_type,
        }
    }
}

/// One shape's part of a [`ScoreCache`].
pub struct CacheRow<'c> {
    busy: &'c mut [Entry],
    /// By node type; empty without the idle table.
    idle: &'c mut [Option<Scored>],
    idle_type: &'c [u32],
}

impl CacheRow<'_> {
    /// The score on `node`, from the table when known: an idle node (see
    /// [`ScoreCache::set_idle`]) reads its type's, otherwise the node's own, recomputed by
    /// `compute` when its `generation` moved since.
    #[inline]
    pub fn get(
        &mut self,
        node: usize,
        generation: u32,
        compute: impl FnOnce() -> Scored,
    ) -> Scored {
        if !self.idle.is_empty() && self.idle_type[node] != BUSY {
            let slot = &mut self.idle[self.idle_type[node] as usize];
            return *slot.get_or_insert_with(compute);
        }
        let entry = &mut self.busy[node];
        if entry.generation == generation {
            return entry.value();
        }
        let value = compute();
        if let Some(fresh) = Entry::of(value, generation) {
            *entry = fresh;
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn idle_nodes_of_one_type_share_a_score_busy_nodes_keep_their_own() {
        let t = (8000, 1024, 2, Some(0));
        let other = (8000, 1024, 4, Some(0));
        let mut cache = ScoreCache::new(2, &[t, other, t], true);
        let calls = Cell::new(0);
        let compute = |v: i64| {
            calls.set(calls.get() + 1);
            Some((v, 1))
        };
        assert_eq!(cache.row(0).get(0, 1, || compute(5)), Some((5, 1)));
        // Node 2 is of node 0's type: no computation.
        assert_eq!(cache.row(0).get(2, 1, || compute(99)), Some((5, 1)));
        assert_eq!(calls.get(), 1);
        // Another type, another shape: their own.
        assert_eq!(cache.row(0).get(1, 1, || compute(7)), Some((7, 1)));
        assert_eq!(cache.row(1).get(0, 1, || compute(8)), Some((8, 1)));
        assert_eq!(calls.get(), 3);
        // Busy: per node, recomputed when the generation moves.
        cache.set_idle(2, false);
        assert_eq!(cache.row(0).get(2, 2, || compute(11)), Some((11, 1)));
        assert_eq!(cache.row(0).get(2, 2, || compute(12)), Some((11, 1)));
        assert_eq!(cache.row(0).get(2, 3, || compute(13)), Some((13, 1)));
        assert_eq!(calls.get(), 5);
        // Node 0 of the same type stays idle: the type's score.
        assert_eq!(cache.row(0).get(0, 3, || compute(14)), Some((5, 1)));
        // Idle again: the type's score, not the node's own.
        cache.set_idle(2, true);
        assert_eq!(cache.row(0).get(2, 4, || compute(15)), Some((5, 1)));
        assert_eq!(calls.get(), 5);
        // A shape that fits nowhere is remembered too.
        assert_eq!(cache.row(1).get(1, 1, || None), None);
        assert_eq!(cache.row(1).get(1, 1, || compute(1)), None);
    }

    #[test]
    fn a_pick_wider_than_an_entry_is_computed_every_time() {
        let t = (8000, 1024, 40, None);
        let mut cache = ScoreCache::new(1, &[t], false);
        let calls = Cell::new(0);
        let wide = || {
            calls.set(calls.get() + 1);
            Some((3, 1u64 << 35))
        };
        assert_eq!(cache.row(0).get(0, 1, wide), Some((3, 1 << 35)));
        assert_eq!(cache.row(0).get(0, 1, wide), Some((3, 1 << 35)));
        assert_eq!(calls.get(), 2);
        // All 32 low GPUs: the one 32-bit pick that means "does not fit" in an entry.
        let all = || Some((4, u64::from(u32::MAX)));
        assert_eq!(cache.row(0).get(0, 2, all), Some((4, u64::from(u32::MAX))));
        assert_eq!(cache.row(0).get(0, 2, || None), None);
        // Narrow picks and misfits are kept.
        assert_eq!(cache.row(0).get(0, 3, || Some((5, 6))), Some((5, 6)));
        assert_eq!(cache.row(0).get(0, 3, || Some((7, 8))), Some((5, 6)));
        assert_eq!(cache.row(0).get(0, 4, || None), None);
        assert_eq!(cache.row(0).get(0, 4, || Some((9, 9))), None);
    }

    #[test]
    fn without_the_idle_table_idle_nodes_are_cached_per_node() {
        let t = (8000, 1024, 2, None);
        let mut cache = ScoreCache::new(1, &[t, t], false);
        assert_eq!(cache.row(0).get(0, 1, || Some((5, 1))), Some((5, 1)));
        assert_eq!(cache.row(0).get(1, 1, || Some((6, 2))), Some((6, 2)));
        assert_eq!(cache.row(0).get(0, 1, || Some((7, 3))), Some((5, 1)));
    }
}
