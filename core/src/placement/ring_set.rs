//! One dimension's ring set: the agents sorted into buckets by their free amount.
//!
//! Each bucket is a `BTreeSet<(free, AgentKey)>`, so "the agent with the least free amount that
//! still holds the demand" is a range query from the demand upward, and "the largest agent" is
//! the set's last element; neither is a scan of the bucket.
//!
//! Agents with nothing free in the dimension are the exception: they are kept in a bit set by
//! key instead of the ordered set of bucket 0 (the bucket of amount 0). No non-empty demand can
//! use them, and a whole-agent offer leaves every dimension at 0, so this makes emptying an agent
//! a bit flip instead of an ordered-set insert per dimension. Every query below still sees them
//! exactly where an entry `(0, key)` of bucket 0 would be.
//!
//! A ring may also be *graded* ([`RingSet::set_grade`]): the caller files each agent under a
//! small number saying what one of its devices can hold (on a GPU ring: the most any one GPU
//! has free, or how many GPUs are idle), and a search for a demand that needs grade `g` walks
//! only the agents of grade `g` or more ([`RingSet::best_fits_across`]), in the very order of
//! the plain walk. The agents of lower grade are the ones a device check would refuse one by
//! one: on a GPU-sharing-heavy workload, nodes whose free GPU adds up to the slice while no
//! single GPU holds it.
//!
//! A ring may also be *classed* ([`RingSet::set_class`]): the caller files each agent under a
//! class that never changes while the agent is there (the simulator: its GPU model), and a
//! search for a demand that only agents of some classes can take ([`Reach::classes`]) walks
//! only those classes' agents, again in the plain walk's order: on a workload where a third of
//! the GPU tasks name a GPU model, the walk no longer passes the nodes of every other model.

use std::collections::BTreeSet;
use std::ops::Bound;

use smallvec::SmallVec;

use super::rings::{RingLayout, RingSpec};
use super::AgentKey;

/// Candidates of one bucket as `(free, key)`, on the stack up to the default search's count
/// (a search lists them on every placement).
pub type Candidates = SmallVec<[(u64, AgentKey); 64]>;

/// A ring's entry: an agent's free amount and its key, ordered by amount, then key.
type Entry = (u64, AgentKey);

/// How many grades a graded ring tells apart ([`RingSet::set_grade`]).
pub const GRADES: usize = 8;

/// A graded walk ([`RingSet::best_fits_across`]) turns to the grades after this many agents
/// that do not fit: before, walking on costs less than a tree descent per grade (measured on
/// the openb trace, docs/results.md "Stop 37": 8, 16 and 32 decide as fast on the default
/// trace, 8 fastest where every GPU task is a slice).
pub const GRADED_AFTER: usize = 8;

/// The grade of an agent the caller has not graded: the highest, so every graded search walks
/// it.
pub const UNGRADED: u8 = (GRADES - 1) as u8;

/// How many classes a classed ring tells apart ([`RingSet::set_class`]).
pub const CLASSES: usize = 64;

/// The class of an agent the caller has not classed: every classed search walks it.
pub const UNCLASSED: u8 = (CLASSES - 1) as u8;

/// Every class ([`Reach::classes`]): no agent is skipped for its class.
pub const ALL_CLASSES: u64 = u64::MAX;

/// Which agents a ring walk may leave out unchecked, on the caller's promise that they cannot
/// take the demand: those graded below `grade` ([`RingSet::set_grade`]) and those whose class
/// (bit `class` of `classes`, [`RingSet::set_class`]) is not set. [`Reach::ALL`] leaves out
/// none: the plain walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    pub grade: u8,
    pub classes: u64,
}

impl Reach {
    /// Every agent.
    pub const ALL: Reach = Reach {
        grade: 0,
        classes: ALL_CLASSES,
    };

    /// Every agent of grade `grade` or more.
    pub fn graded(grade: u8) -> Reach {
        Reach {
            grade,
            ..Reach::ALL
        }
    }

    /// The classes walked: the caller's and [`UNCLASSED`].
    fn walked_classes(&self) -> u64 {
        self.classes | 1 << UNCLASSED
    }
}

impl Default for Reach {
    fn default() -> Self {
        Reach::ALL
    }
}

/// The entries of several ordered sets within one range, merged in (free, key) order,
/// ascending or (`down`) descending: a walk of their union without building it.
struct Merged<'a> {
    heads: SmallVec<[(Entry, std::collections::btree_set::Range<'a, Entry>); 8]>,
    down: bool,
}

impl<'a> Merged<'a> {
    fn new(
        sets: impl Iterator<Item = &'a BTreeSet<Entry>>,
        range: (Bound<Entry>, Bound<Entry>),
        down: bool,
    ) -> Self {
        let mut heads = SmallVec::new();
        for set in sets {
            let mut range = set.range(range);
            let first = match down {
                false => range.next(),
                true => range.next_back(),
            };
            if let Some(&first) = first {
                heads.push((first, range));
            }
        }
        Merged { heads, down }
    }
}

impl Iterator for Merged<'_> {
    type Item = Entry;

    #[inline]
    fn next(&mut self) -> Option<Entry> {
        let heads = &mut self.heads;
        let mut next = 0;
        for i in 1..heads.len() {
            if (heads[i].0 < heads[next].0) != self.down {
                next = i;
            }
        }
        let (entry, range) = heads.get_mut(next)?;
        let found = *entry;
        let following = match self.down {
            false => range.next(),
            true => range.next_back(),
        };
        match following {
            Some(&following) => *entry = following,
            None => drop(heads.swap_remove(next)),
        }
        Some(found)
    }
}

/// A graded or classed ring's second index: its agents with more than 0 free by a small label
/// (a grade, [`RingSet::set_grade`], or a class, [`RingSet::set_class`]), each label's set in
/// the buckets' (free, key) order.
#[derive(Clone, Debug)]
struct Labels {
    /// Each agent's label by key (`unlabelled` past the end).
    of: Vec<u8>,
    /// The label of an agent never labelled: the one every restricted walk takes.
    unlabelled: u8,
    sets: Vec<BTreeSet<Entry>>,
}

impl Labels {
    /// `count` labels, every agent of `positive` (the ring's agents with more than 0 free)
    /// under `unlabelled`.
    fn new(count: usize, unlabelled: u8, positive: impl Iterator<Item = Entry>) -> Box<Labels> {
        let mut sets = vec![BTreeSet::new(); count];
        sets[usize::from(unlabelled)] = positive.collect();
        Box::new(Labels {
            of: Vec::new(),
            unlabelled,
            sets,
        })
    }

    fn of(&self, key: AgentKey) -> u8 {
        self.of.get(key).copied().unwrap_or(self.unlabelled)
    }

    fn insert(&mut self, (free, key): Entry) {
        let label = self.of(key);
        self.sets[usize::from(label)].insert((free, key));
    }

    fn remove(&mut self, (free, key): Entry) {
        let label = self.of(key);
        self.sets[usize::from(label)].remove(&(free, key));
    }

    /// Files the agent, `free` free, under `label`.
    fn relabel(&mut self, key: AgentKey, free: u64, label: u8) {
        let old = self.of(key);
        if old == label {
            return;
        }
        if key >= self.of.len() {
            self.of.resize(key + 1, self.unlabelled);
        }
        self.of[key] = label;
        if free > 0 && self.sets[usize::from(old)].remove(&(free, key)) {
            self.sets[usize::from(label)].insert((free, key));
        }
    }

    /// The entries of the labels in `labels` (bit l for label l) within `range`, merged.
    fn merged(&self, range: (Bound<Entry>, Bound<Entry>), labels: u64, down: bool) -> Merged<'_> {
        let sets = self
            .sets
            .iter()
            .enumerate()
            .filter(move |&(label, _)| labels & 1 << label != 0)
            .map(|(_, set)| set);
        Merged::new(sets, range, down)
    }

    /// Appends to `out`, up to `k` in all, the agents of grade `grade` or more with (free, key)
    /// in `range` that `fits` accepts, in (free, key) order: one range per grade, merged. The
    /// graded walk's own loop rather than [`Merged`]: on the hottest path (every slice of a
    /// GPU-sharing-heavy workload) it measured faster (docs/results.md, "Stop 38").
    fn graded<F: Fn(AgentKey) -> bool + ?Sized>(
        &self,
        range: (Bound<Entry>, Bound<Entry>),
        grade: u8,
        fits: &F,
        k: usize,
        out: &mut Candidates,
    ) {
        let mut heads: SmallVec<[_; GRADES]> = SmallVec::new();
        for set in &self.sets[usize::from(grade.min(UNGRADED))..] {
            let mut range = set.range(range);
            if let Some(&first) = range.next() {
                heads.push((first, range));
            }
        }
        // The least head next, its range's next element in its place.
        while out.len() < k && !heads.is_empty() {
            let mut least = 0;
            for i in 1..heads.len() {
                if heads[i].0 < heads[least].0 {
                    least = i;
                }
            }
            let (free, key) = heads[least].0;
            match heads[least].1.next() {
                Some(&next) => heads[least].0 = next,
                None => drop(heads.swap_remove(least)),
            }
            if fits(key) {
                out.push((free, key));
            }
        }
    }
}

/// Files the agent `key`, `free` free, under `label` (at most the kind's unlabelled one) in
/// `labels` of a kind of `count` labels: the first label other than the unlabelled one builds
/// the index from the ring's `buckets`, every agent in it unlabelled.
fn set_label(
    labels: &mut Option<Box<Labels>>,
    buckets: &[BTreeSet<Entry>],
    (count, unlabelled): (usize, u8),
    (key, free): (AgentKey, u64),
    label: u8,
) {
    let label = label.min(unlabelled);
    if labels.is_none() && label != unlabelled {
        let positive = buckets.iter().flatten().copied();
        *labels = Some(Labels::new(count, unlabelled, positive));
    }
    if let Some(labels) = labels {
        labels.relabel(key, free, label);
    }
}

/// Appends to `out` the entries `fitting` accepts until `out` holds `k`.
fn take_fitting<F: Fn(AgentKey) -> bool + ?Sized>(
    entries: impl Iterator<Item = Entry>,
    fits: &F,
    k: usize,
    out: &mut Candidates,
) {
    for (free, key) in entries {
        if out.len() >= k {
            return;
        }
        if fits(key) {
            out.push((free, key));
        }
    }
}

/// Agent keys as bits, for the agents with 0 free: O(1) insert, remove and lookup, key order.
#[derive(Clone, Debug, Default)]
struct KeyBits {
    words: Vec<u64>,
    len: usize,
}

impl KeyBits {
    fn contains(&self, key: AgentKey) -> bool {
        self.words
            .get(key / 64)
            .is_some_and(|w| w & (1 << (key % 64)) != 0)
    }

    /// True if the key was not there.
    fn insert(&mut self, key: AgentKey) -> bool {
        let word = key / 64;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let bit = 1 << (key % 64);
        let added = self.words[word] & bit == 0;
        self.words[word] |= bit;
        self.len += usize::from(added);
        added
    }

    /// True if the key was there.
    fn remove(&mut self, key: AgentKey) -> bool {
        let Some(w) = self.words.get_mut(key / 64) else {
            return false;
        };
        let bit = 1 << (key % 64);
        let had = *w & bit != 0;
        *w &= !bit;
        self.len -= usize::from(had);
        had
    }

    fn iter(&self) -> KeyBitsIter<'_> {
        KeyBitsIter {
            words: &self.words,
            front: 0,
            back: self.words.len() * 64,
        }
    }
}

/// Keys of a [`KeyBits`] in increasing order (and decreasing from the back); positions in
/// `front..back` are still to be visited.
struct KeyBitsIter<'a> {
    words: &'a [u64],
    front: usize,
    back: usize,
}

impl Iterator for KeyBitsIter<'_> {
    type Item = AgentKey;

    fn next(&mut self) -> Option<AgentKey> {
        while self.front < self.back {
            let (word, bit) = (self.front / 64, self.front % 64);
            let rest = self.words[word] >> bit;
            if rest == 0 {
                self.front = (word + 1) * 64;
                continue;
            }
            let key = self.front + rest.trailing_zeros() as usize;
            if key >= self.back {
                break;
            }
            self.front = key + 1;
            return Some(key);
        }
        self.front = self.back;
        None
    }
}

impl DoubleEndedIterator for KeyBitsIter<'_> {
    fn next_back(&mut self) -> Option<AgentKey> {
        while self.front < self.back {
            let last = self.back - 1;
            let (word, bit) = (last / 64, last % 64);
            // Bits 0..=bit of the word.
            let rest = self.words[word] & (u64::MAX >> (63 - bit));
            if rest == 0 {
                self.back = word * 64;
                continue;
            }
            let key = word * 64 + (63 - rest.leading_zeros() as usize);
            if key < self.front {
                break;
            }
            self.back = key;
            return Some(key);
        }
        self.back = self.front;
        None
    }
}

/// The buckets of one dimension. Holds every agent whose total has this dimension.
#[derive(Clone, Debug)]
pub struct RingSet {
    name: String,
    spec: RingSpec,
    /// Agents with a free amount above 0.
    buckets: Vec<BTreeSet<(u64, AgentKey)>>,
    /// Agents with 0 free, logically the first members of bucket `zero_bucket`.
    empty: KeyBits,
    /// The bucket of amount 0 (bucket 0 for every valid layout).
    zero_bucket: usize,
    /// Agents in `buckets` (those with more than 0 free).
    positive: usize,
    /// The grades, once the caller has graded some agent.
    grades: Option<Box<Labels>>,
    /// The classes, once the caller has classed some agent.
    classes: Option<Box<Labels>>,
}

impl RingSet {
    pub fn new(name: impl Into<String>, spec: RingSpec) -> Self {
        let buckets = vec![BTreeSet::new(); spec.layout().len()];
        let zero_bucket = spec.layout().bucket_of(0);
        RingSet {
            name: name.into(),
            spec,
            buckets,
            empty: KeyBits::default(),
            zero_bucket,
            positive: 0,
            grades: None,
            classes: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> &RingLayout {
        self.spec.layout()
    }

    pub fn search_up(&self) -> usize {
        self.spec.search_up()
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The bucket an amount (thousandths) belongs to.
    pub fn bucket_of(&self, free: u64) -> usize {
        self.layout().bucket_of(free)
    }

    pub fn insert(&mut self, key: AgentKey, free: u64) {
        if free == 0 {
            self.empty.insert(key);
            return;
        }
        let b = self.bucket_of(free);
        if self.buckets[b].insert((free, key)) {
            self.positive += 1;
        }
        for labels in [&mut self.grades, &mut self.classes].into_iter().flatten() {
            labels.insert((free, key));
        }
    }

    /// Removes the agent filed under `free`; true if it was there.
    pub fn remove(&mut self, key: AgentKey, free: u64) -> bool {
        if free == 0 {
            return self.empty.remove(key);
        }
        let b = self.bucket_of(free);
        let removed = self.buckets[b].remove(&(free, key));
        self.positive -= usize::from(removed);
        if removed {
            for labels in [&mut self.grades, &mut self.classes].into_iter().flatten() {
                labels.remove((free, key));
            }
        }
        removed
    }

    /// Files the agent, whose free amount here is `free`, under `class` (below [`CLASSES`];
    /// higher is taken as [`UNCLASSED`]). The first class given makes the ring classed, every
    /// agent not classed yet at [`UNCLASSED`]. The caller keeps the promise a classed search
    /// relies on: an agent whose class a demand's [`Reach::classes`] leaves out cannot take
    /// that demand.
    pub fn set_class(&mut self, key: AgentKey, free: u64, class: u8) {
        let kind = (CLASSES, UNCLASSED);
        set_label(&mut self.classes, &self.buckets, kind, (key, free), class);
    }

    /// The agent's class ([`UNCLASSED`] unless [`set_class`](RingSet::set_class) said).
    pub fn class(&self, key: AgentKey) -> u8 {
        self.classes.as_ref().map_or(UNCLASSED, |c| c.of(key))
    }

    /// The class index to walk for a demand of `need` reaching `reach`: only when some class
    /// is left out, and for a positive need (agents with 0 free are not in it).
    fn classed(&self, need: u64, reach: Reach) -> Option<&Labels> {
        let restricted = reach.walked_classes() != ALL_CLASSES;
        self.classes.as_deref().filter(|_| need > 0 && restricted)
    }

    /// The (free, key) range of buckets `first..=last` from `need` up.
    fn span(&self, first: usize, last: usize, need: u64) -> (Bound<Entry>, Bound<Entry>) {
        let lower = self.layout().range(first).0.max(need);
        let upper = self.layout().range(last).1;
        let to = upper.map_or(Bound::Unbounded, |u| Bound::Excluded((u, 0)));
        (Bound::Included((lower, 0)), to)
    }

    /// Files the agent, whose free amount here is `free`, under `grade` (at most [`UNGRADED`];
    /// higher is taken as [`UNGRADED`]). The first grade given makes the ring graded, every
    /// agent not graded yet at [`UNGRADED`]. The caller keeps the promise a graded search
    /// relies on: an agent of grade below a demand's cannot take that demand.
    pub fn set_grade(&mut self, key: AgentKey, free: u64, grade: u8) {
        let kind = (GRADES, UNGRADED);
        set_label(&mut self.grades, &self.buckets, kind, (key, free), grade);
    }

    /// The agent's grade ([`UNGRADED`] unless [`set_grade`](RingSet::set_grade) said).
    pub fn grade(&self, key: AgentKey) -> u8 {
        self.grades.as_ref().map_or(UNGRADED, |g| g.of(key))
    }

    /// Refiles an agent whose free amount changed from `old` to `new`.
    pub fn relocate(&mut self, key: AgentKey, old: u64, new: u64) {
        if old != new {
            self.remove(key, old);
            self.insert(key, new);
        }
    }

    /// True when the agent is filed in `bucket` under `free`.
    pub fn holds(&self, bucket: usize, key: AgentKey, free: u64) -> bool {
        if free == 0 {
            return bucket == self.zero_bucket && self.empty.contains(key);
        }
        self.buckets
            .get(bucket)
            .is_some_and(|b| b.contains(&(free, key)))
    }

    /// The agents with 0 free as `(0, key)` pairs if `bucket` is theirs (none otherwise).
    fn empty_members(
        &self,
        bucket: usize,
    ) -> impl DoubleEndedIterator<Item = (u64, AgentKey)> + '_ {
        let keys = (bucket == self.zero_bucket).then(|| self.empty.iter());
        keys.into_iter().flatten().map(|key| (0, key))
    }

    /// Every agent with more than 0 free, smallest free first (across buckets).
    pub fn ascending_positive(&self) -> impl Iterator<Item = (u64, AgentKey)> + '_ {
        self.buckets.iter().flatten().copied()
    }

    /// The (free, agent) pairs of one bucket, smallest free first.
    pub fn members(&self, bucket: usize) -> impl DoubleEndedIterator<Item = (u64, AgentKey)> + '_ {
        let filed = self.buckets.get(bucket).into_iter().flatten().copied();
        self.empty_members(bucket).chain(filed)
    }

    /// The largest free amount of any agent in this ring (0 when none has any): a search for
    /// more than that can stop before walking a bucket. O(buckets), never O(agents).
    pub fn max_free(&self) -> u64 {
        self.buckets
            .iter()
            .rev()
            .find_map(|bucket| bucket.last().map(|&(free, _)| free))
            .unwrap_or(0)
    }

    /// Number of agents with more than 0 free.
    pub fn positive(&self) -> usize {
        self.positive
    }

    /// Number of agents in one bucket.
    pub fn count(&self, bucket: usize) -> usize {
        let empty = if bucket == self.zero_bucket {
            self.empty.len
        } else {
            0
        };
        empty + self.buckets.get(bucket).map_or(0, BTreeSet::len)
    }

    /// Best fit in one bucket: the agent with the smallest free amount ≥ `need` for which `fits`
    /// holds (ties: lowest key). Starts at `need` and walks up only past agents that hold the
    /// dimension but fail another check.
    pub fn best_fit(
        &self,
        bucket: usize,
        need: u64,
        fits: &dyn Fn(AgentKey) -> bool,
    ) -> Option<(u64, AgentKey)> {
        if need == 0 {
            if let Some(found) = self.empty_members(bucket).find(|(_, key)| fits(*key)) {
                return Some(found);
            }
        }
        let set = self.buckets.get(bucket).filter(|b| !b.is_empty())?;
        set.range((need, 0)..).copied().find(|(_, key)| fits(*key))
    }

    /// Worst fit in one bucket: the agent with the largest free amount for which `fits` holds
    /// (ties: lowest key). The largest fitting amount comes from the end of the bucket; the lowest
    /// key with that amount from a forward range query, so many agents of equal size are not
    /// walked one by one.
    pub fn largest_fit(
        &self,
        bucket: usize,
        need: u64,
        fits: &dyn Fn(AgentKey) -> bool,
    ) -> Option<(u64, AgentKey)> {
        let filed = self
            .buckets
            .get(bucket)
            .filter(|b| !b.is_empty())
            .and_then(|set| {
                let (free, highest) = set
                    .range((need, 0)..)
                    .rev()
                    .copied()
                    .find(|(_, key)| fits(*key))?;
                set.range((free, 0)..=(free, highest))
                    .copied()
                    .find(|(_, key)| fits(*key))
            });
        if filed.is_some() || need > 0 {
            return filed;
        }
        // Only agents with 0 free are left; among equals the lowest key.
        self.empty_members(bucket).find(|(_, key)| fits(*key))
    }
}

impl RingSet {
    /// Up to `k` fitting agents of one bucket in best-fit order: the first is
    /// [`best_fit`](RingSet::best_fit)'s answer, the others follow in (free, key) order. `out` is
    /// cleared first. Walks past non-fitting agents like `best_fit`, and stops at `k`.
    pub fn best_fits(
        &self,
        bucket: usize,
        need: u64,
        fits: &dyn Fn(AgentKey) -> bool,
        k: usize,
        out: &mut Candidates,
    ) {
        self.best_fits_across(bucket..=bucket, need, Reach::ALL, fits, k, out);
    }

    /// Up to `k` fitting agents of the buckets `buckets` (in order) with at least `need` free,
    /// in best-fit order across the buckets: what [`best_fits`](RingSet::best_fits) finds
    /// bucket after bucket, appended to `out` (cleared first). In a graded ring, after
    /// [`GRADED_AFTER`] agents that do not fit, the rest of the walk takes only the agents of
    /// grade `reach.grade` or more: the same candidates whenever every agent of lower grade
    /// fails `fits` (the caller's promise, [`set_grade`](RingSet::set_grade)), without walking
    /// past those agents (one range per grade, merged in (free, key) order). A short walk stays
    /// plain: the merge costs a tree descent per grade. In a classed ring a demand that leaves
    /// out some class walks only the others' agents from the start (one range per class,
    /// merged), on the same promise ([`set_class`](RingSet::set_class)).
    pub fn best_fits_across<F: Fn(AgentKey) -> bool + ?Sized>(
        &self,
        buckets: std::ops::RangeInclusive<usize>,
        need: u64,
        reach: Reach,
        fits: &F,
        k: usize,
        out: &mut Candidates,
    ) {
        out.clear();
        let (first, last) = (*buckets.start(), *buckets.end());
        if k == 0 || first > last || last >= self.buckets.len() {
            return;
        }
        if let Some(classes) = self.classed(need, reach) {
            let range = self.span(first, last, need);
            let entries = classes.merged(range, reach.walked_classes(), false);
            return take_fitting(entries, fits, k, out);
        }
        let grade = reach.grade;
        if need == 0 {
            out.extend(
                self.empty_members(first)
                    .filter(|(_, key)| fits(*key))
                    .take(k),
            );
        }
        let graded = self.grades.as_ref().filter(|_| need > 0 && grade > 0);
        let mut failed = 0;
        for bucket in first..=last {
            // A plain loop: no iterator adapters between the tree and the check.
            if out.len() == k {
                return;
            }
            for &(free, key) in self.buckets[bucket].range((need, 0)..) {
                if fits(key) {
                    out.push((free, key));
                    if out.len() == k {
                        return;
                    }
                } else if let Some(grades) = graded {
                    failed += 1;
                    if failed == GRADED_AFTER {
                        let upper = self.layout().range(last).1;
                        let to = upper.map_or(Bound::Unbounded, |u| Bound::Excluded((u, 0)));
                        let from = Bound::Excluded((free, key));
                        return grades.graded((from, to), grade, fits, k, out);
                    }
                }
            }
        }
    }

    /// [`best_fits_across`](RingSet::best_fits_across) continued past `after`, a place the walk
    /// reached (at least `need` free, in `buckets`): the next up to `k` fitting agents in the
    /// same order, appended to `out` (cleared first). A graded walk takes the demand's grades
    /// from the start: it continues a walk that already passed agents that did not fit.
    #[allow(clippy::too_many_arguments)]
    pub fn best_fits_after<F: Fn(AgentKey) -> bool + ?Sized>(
        &self,
        buckets: std::ops::RangeInclusive<usize>,
        need: u64,
        after: (u64, AgentKey),
        reach: Reach,
        fits: &F,
        k: usize,
        out: &mut Candidates,
    ) {
        out.clear();
        let (first, last) = (*buckets.start(), *buckets.end());
        if k == 0 || first > last || last >= self.buckets.len() || after.0 < need {
            return;
        }
        let (_, upper) = self.span(first, last, need);
        let range = (Bound::Excluded(after), upper);
        if let Some(classes) = self.classed(need, reach) {
            let entries = classes.merged(range, reach.walked_classes(), false);
            return take_fitting(entries, fits, k, out);
        }
        if let Some(grades) = self.grades.as_ref().filter(|_| reach.grade > 0) {
            return grades.graded(range, reach.grade, fits, k, out);
        }
        for bucket in self.bucket_of(after.0).max(first)..=last {
            take_fitting(self.buckets[bucket].range(range).copied(), fits, k, out);
            if out.len() == k {
                return;
            }
        }
    }

    /// Up to `k` fitting agents of one bucket for the downward phase: the first is
    /// [`largest_fit`](RingSet::largest_fit)'s answer, the others the next largest. `out` is
    /// cleared first. In a classed ring, a demand whose `reach` leaves out some class walks
    /// only the other classes' agents ([`best_fits_across`](RingSet::best_fits_across)).
    pub fn largest_fits(
        &self,
        bucket: usize,
        need: u64,
        reach: Reach,
        fits: &dyn Fn(AgentKey) -> bool,
        k: usize,
        out: &mut Candidates,
    ) {
        out.clear();
        if k == 0 {
            return;
        }
        if let Some(classes) = self.classed(need, reach).filter(|_| bucket < self.len()) {
            return self.largest_fits_classed(classes, bucket, need, reach, fits, k, out);
        }
        let Some(first) = self.largest_fit(bucket, need, fits) else {
            return;
        };
        out.push(first);
        if out.len() == k {
            return;
        }
        // The rest from the largest fitting amount down (the agents above it fit nowhere in
        // this bucket: `largest_fit` passed them), in plain loops.
        if let Some(set) = self.buckets.get(bucket).filter(|_| first.0 > 0) {
            for &(free, key) in set.range((need, 0)..=(first.0, AgentKey::MAX)).rev() {
                if (free, key) != first && fits(key) {
                    out.push((free, key));
                    if out.len() == k {
                        return;
                    }
                }
            }
        }
        if need == 0 {
            for member in self.empty_members(bucket) {
                if member != first && fits(member.1) {
                    out.push(member);
                    if out.len() == k {
                        return;
                    }
                }
            }
        }
    }

    /// [`largest_fits`](RingSet::largest_fits) among the classes `reach` walks: the same
    /// steps over their sets merged, within the bucket's amounts.
    #[allow(clippy::too_many_arguments)]
    fn largest_fits_classed(
        &self,
        classes: &Labels,
        bucket: usize,
        need: u64,
        reach: Reach,
        fits: &dyn Fn(AgentKey) -> bool,
        k: usize,
        out: &mut Candidates,
    ) {
        let walked = reach.walked_classes();
        let (lower, upper) = self.span(bucket, bucket, need);
        // The largest fitting amount, then the lowest fitting key with it.
        let Some((free, highest)) = classes
            .merged((lower, upper), walked, true)
            .find(|&(_, key)| fits(key))
        else {
            return;
        };
        let same = (Bound::Included((free, 0)), Bound::Included((free, highest)));
        let first = classes
            .merged(same, walked, false)
            .find(|&(_, key)| fits(key))
            .unwrap_or((free, highest));
        out.push(first);
        let below = (lower, Bound::Included((free, AgentKey::MAX)));
        let rest = classes.merged(below, walked, true).filter(|&e| e != first);
        take_fitting(rest, fits, k, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty ring of 4 buckets of 1000.
    fn four_buckets(name: &str, search_up: usize) -> RingSet {
        let layout = RingLayout::EqualSpans {
            base: 0,
            step: 1000,
            buckets: 4,
        };
        RingSet::new(name, RingSpec::new(layout, search_up).unwrap())
    }

    fn ring() -> RingSet {
        let mut ring = four_buckets("cpus", 1);
        for (key, free) in [
            (0, 500),
            (1, 1500),
            (2, 1200),
            (3, 1800),
            (4, 1800),
            (5, 9000),
        ] {
            ring.insert(key, free);
        }
        ring
    }

    #[test]
    fn best_fit_is_a_range_query_from_the_demand() {
        let ring = ring();
        let all = |_: AgentKey| true;
        assert_eq!(ring.best_fit(1, 1000, &all), Some((1200, 2)));
        assert_eq!(ring.best_fit(1, 1300, &all), Some((1500, 1)));
        assert_eq!(ring.best_fit(1, 1800, &all), Some((1800, 3)));
        assert_eq!(ring.best_fit(1, 1801, &all), None);
        assert_eq!(ring.best_fit(1, 1000, &|k| k != 2), Some((1500, 1)));
        assert_eq!(ring.best_fit(0, 600, &all), None);
    }

    #[test]
    fn largest_fit_prefers_the_lowest_key_among_equals() {
        let ring = ring();
        assert_eq!(ring.largest_fit(1, 0, &|_| true), Some((1800, 3)));
        assert_eq!(ring.largest_fit(1, 0, &|k| k != 3), Some((1800, 4)));
        assert_eq!(ring.largest_fit(1, 0, &|k| k == 2), Some((1200, 2)));
        assert_eq!(ring.largest_fit(3, 0, &|_| true), Some((9000, 5)));
    }

    #[test]
    fn candidate_lists_start_with_the_single_answers() {
        let ring = ring();
        let all = |_: AgentKey| true;
        let mut out = Candidates::new();
        ring.best_fits(1, 1000, &all, 3, &mut out);
        assert_eq!(out[..], [(1200, 2), (1500, 1), (1800, 3)]);
        ring.best_fits(1, 1300, &|k| k != 3, 8, &mut out);
        assert_eq!(out[..], [(1500, 1), (1800, 4)]);
        ring.best_fits(1, 1000, &all, 0, &mut out);
        assert!(out.is_empty());
        ring.largest_fits(1, 0, Reach::ALL, &all, 3, &mut out);
        assert_eq!(out[..], [(1800, 3), (1800, 4), (1500, 1)]);
        ring.largest_fits(1, 1600, Reach::ALL, &|k| k != 3, 3, &mut out);
        assert_eq!(out[..], [(1800, 4)]);
        ring.largest_fits(2, 0, Reach::ALL, &all, 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn relocate_moves_between_buckets() {
        let mut ring = ring();
        assert_eq!(ring.positive(), 6);
        ring.relocate(5, 9000, 200);
        assert_eq!(ring.count(3), 0);
        assert!(ring.holds(0, 5, 200));
        assert_eq!(ring.members(0).collect::<Vec<_>>(), [(200, 5), (500, 0)]);
    }

    #[test]
    fn agents_with_nothing_free_are_first_in_bucket_zero() {
        let mut ring = ring();
        ring.relocate(3, 1800, 0);
        for key in [70, 130, 64] {
            ring.insert(key, 0);
        }
        assert_eq!(ring.count(0), 5);
        assert_eq!(ring.count(1), 3);
        assert!(ring.holds(0, 64, 0) && !ring.holds(1, 64, 0) && !ring.holds(0, 65, 0));
        let expected = [(0, 3), (0, 64), (0, 70), (0, 130), (500, 0)];
        assert_eq!(ring.members(0).collect::<Vec<_>>(), expected);
        let mut backwards = expected.to_vec();
        backwards.reverse();
        assert_eq!(ring.members(0).rev().collect::<Vec<_>>(), backwards);
        {
            let mut both = ring.members(0);
            assert_eq!(
                (both.next(), both.next_back(), both.next_back(), both.next()),
                (Some((0, 3)), Some((500, 0)), Some((0, 130)), Some((0, 64)))
            );
            assert_eq!((both.next(), both.next()), (Some((0, 70)), None));
        }
        let all = |_: AgentKey| true;
        assert_eq!(ring.best_fit(0, 0, &all), Some((0, 3)));
        assert_eq!(ring.best_fit(0, 0, &|k| k > 100), Some((0, 130)));
        assert_eq!(ring.best_fit(0, 0, &|k| k == 0), Some((500, 0)));
        assert_eq!(ring.best_fit(0, 1, &all), Some((500, 0)));
        assert_eq!(ring.largest_fit(0, 0, &all), Some((500, 0)));
        assert_eq!(ring.largest_fit(0, 0, &|k| k != 0), Some((0, 3)));
        assert_eq!(ring.largest_fit(0, 1, &|k| k != 0), None);
        assert!(ring.remove(64, 0) && !ring.remove(64, 0) && !ring.remove(9999, 0));
        assert_eq!(ring.positive(), 5);
        ring.relocate(130, 0, 2500);
        assert_eq!(ring.count(0), 3);
        assert!(ring.holds(2, 130, 2500));
        assert_eq!(
            ring.members(0).collect::<Vec<_>>(),
            [(0, 3), (0, 70), (500, 0)]
        );
    }

    /// 30 agents with 1.5 GPUs free (plus their key in milli), keys 0..30, in a `gpus` ring of
    /// 4 buckets of 1000.
    fn thirty_agents() -> RingSet {
        let mut ring = four_buckets("gpus", 3);
        for key in 0..30 {
            ring.insert(key, 1500 + key as u64);
        }
        ring
    }

    #[test]
    fn a_graded_walk_skips_the_agents_graded_below_the_demand() {
        // The even ones can take grade-2 demands.
        let mut ring = thirty_agents();
        assert_eq!(ring.grade(3), UNGRADED);
        for key in 0..30 {
            ring.set_grade(key, 1500 + key as u64, if key % 2 == 0 { 2 } else { 1 });
        }
        // Filed again at another amount, an agent keeps its grade.
        ring.relocate(29, 1529, 3500);
        assert_eq!(ring.grade(29), 1);
        let checked = std::cell::Cell::new(0);
        let even = |key: AgentKey| {
            checked.set(checked.get() + 1);
            key % 2 == 0
        };
        let mut out = Candidates::new();
        ring.best_fits_across(1..=3, 1000, Reach::graded(2), &even, 10, &mut out);
        let expected: Vec<(u64, AgentKey)> =
            (0..20).step_by(2).map(|k| (1500 + k as u64, k)).collect();
        assert_eq!(out[..], expected[..]);
        // Plain until GRADED_AFTER agents failed (keys 0..=15), then the even ones only.
        assert_eq!(checked.get(), 2 * GRADED_AFTER + 2);
        // Grade 0 is the plain walk: every agent up to the tenth even one.
        checked.set(0);
        ring.best_fits_across(1..=3, 1000, Reach::ALL, &even, 10, &mut out);
        assert_eq!((out[..] == expected[..], checked.get()), (true, 19));
        // Past the window's last bucket nothing is taken; agent 29 (3.5 free) is in bucket 3.
        ring.best_fits_across(1..=1, 1000, Reach::graded(1), &|_| true, 40, &mut out);
        assert_eq!(out.len(), 29);
        ring.best_fits_across(1..=3, 1000, Reach::graded(1), &|k| k == 29, 40, &mut out);
        assert_eq!(out[..], [(3500, 29)]);
    }

    #[test]
    fn a_classed_walk_checks_only_the_classes_the_demand_allows() {
        // Of class key % 3; agent 29 unclassed.
        let mut ring = thirty_agents();
        assert_eq!(ring.class(3), UNCLASSED);
        for key in 0..29 {
            ring.set_class(key, 1500 + key as u64, (key % 3) as u8);
        }
        // Filed again at another amount, an agent keeps its class.
        ring.relocate(27, 1527, 3500);
        assert_eq!(ring.class(27), 0);
        let checked = std::cell::Cell::new(0);
        let of_class_0 = |key: AgentKey| {
            checked.set(checked.get() + 1);
            key % 3 == 0
        };
        let class_0 = Reach {
            classes: 1,
            ..Reach::ALL
        };
        let mut out = Candidates::new();
        ring.best_fits_across(1..=3, 1000, class_0, &of_class_0, 40, &mut out);
        let expected: Vec<(u64, AgentKey)> = (0..27)
            .step_by(3)
            .map(|k| (1500 + k as u64, k))
            .chain([(3500, 27)])
            .collect();
        assert_eq!(out[..], expected[..]);
        // Only class 0 and the unclassed agent 29 were checked.
        assert_eq!(checked.get(), 11);
        // Every class is the plain walk: all 30 checked.
        checked.set(0);
        ring.best_fits_across(1..=3, 1000, Reach::ALL, &of_class_0, 40, &mut out);
        assert_eq!((out[..] == expected[..], checked.get()), (true, 30));
        // The downward phase: the largest of the class first, then down; the lowest key among
        // equals first.
        ring.relocate(24, 1524, 3500);
        checked.set(0);
        ring.largest_fits(3, 1000, class_0, &of_class_0, 2, &mut out);
        assert_eq!(
            (&out[..], checked.get()),
            (&[(3500, 24), (3500, 27)][..], 3)
        );
        ring.largest_fits(1, 1000, class_0, &of_class_0, 3, &mut out);
        assert_eq!(out[..], [(1521, 21), (1518, 18), (1515, 15)]);
        // A removed agent leaves its class's set; an unclassed ring walks plain.
        assert!(ring.remove(21, 1521));
        ring.largest_fits(1, 1000, class_0, &of_class_0, 1, &mut out);
        assert_eq!(out[..], [(1518, 18)]);
    }
}
