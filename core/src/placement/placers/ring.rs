//! The ring search of SPEC seed 001 step 3 ([`RingPlacer`]) and its options beyond the seed
//! ([`RingSearch`]).
//!
//! Measured on the openb GPU trace (docs/results.md), the seed's search as written strands about
//! twice as much GPU as the best published policy (FGD), for two reasons the ring cannot see:
//! tasks that ask for no GPU use up the cpu beside free GPUs, and among agents with the same
//! free amount in the dominant dimension it cannot tell *which* are left usable. Two bounded
//! additions close the gap while keeping the search a few ordered-set range queries:
//! - **sparing** ([`RingSearch::spare`]): a demand that asks for none of a scarce dimension
//!   (`gpus` by default) is first searched among agents with none of it free; with a score,
//!   then among the agents with the least of it free (the *leftover pass*: what is left there
//!   is mostly leftovers), then among all;
//! - **scored tie-break** ([`RingSearch::candidates`]): in the bucket where the search finds its
//!   first fitting agent, the first K fitting agents in the phase's order (best fit, or largest
//!   in the downward phase) are ranked by an [`AgentScore`] the caller supplies through the
//!   [`PlacementContext`] (equal scores: the least cpu left, then the lowest agent key) — the
//!   simulator and the master supply FGD's score as the paper's simulator quantises it, from
//!   per-GPU state, with equal quantised scores ranked by how much GPU the placement leaves
//!   without the cpu and memory to use it ([`crate::placement::fragmentation::GpuFeed`],
//!   [`crate::placement::fragmentation::fgd_rank`]); without a score, or with K ≤ 1, the first is
//!   chosen, which is exactly the seed's search. The cost is O(K log n) for a fixed, small K;
//! - **largest candidates** ([`RingSearch::largest`]): beside the K, the score also ranks the
//!   largest fitting agents of the topmost buckets, so it can choose an agent of another kind
//!   than the best fits (on openb, a larger node of a GPU model few tasks need) — when the
//!   score asks for them ([`AgentScore::ranks_largest`]; the fragment score does when its
//!   target workload names GPU models).

use std::cell::RefCell;

use super::context::{AgentScore, PlacementContext};

use super::memo::{frontier_of, Question, Recalled, Remembered, WalkMemo, SPARES};
use super::{dominant_dimension, Decision, Phase, Placer, PlacerNote};
pub use crate::placement::ring_search::{
    RingSearch, RingSearchError, DEFAULT_CANDIDATES, DEFAULT_LARGEST, MAX_CANDIDATES,
};
use crate::placement::ring_set::{Candidates, Reach};
use crate::placement::{AgentKey, Cluster, Resources, RingSet};

/// The dimension whose leftover breaks equal scores of the scored tie-break.
const CPUS: &str = "cpus";

/// The leftover pass examines at most this many agents per candidate it ranks (640 for the
/// default 40), so a decision stays O(K log n) however many agents hold a little of the spared
/// dimension without room for the demand (measured: docs/results.md, "Stop 29": 160 stranded
/// more on the CPU-heavy traces, 640 as little as an unbounded walk).
pub const LEFTOVER_SCAN_PER_CANDIDATE: usize = 16;

/// A recalled walk with at most this many changed agents finds each in its list by a scan of
/// the list; with more, it asks each candidate whether it changed (one read each).
const FEW_CHANGED: usize = 4;

/// The largest candidates come from at most this many buckets (the topmost with fitting
/// agents).
const LARGEST_BUCKETS: usize = 2;

/// The leftover pass takes only agents with less than one whole unit (1000 milli) of the spared
/// dimension free: less than one GPU, all of it on GPUs partly in use.
const LEFTOVER_BELOW: u64 = 1000;

/// The ring search of SPEC seed 001 step 3, with the options of [`RingSearch`].
///
/// With D the dominant dimension, d the demand's amount in D and K the bucket holding d:
/// 1. bucket K: best fit (least free − d among fitting agents);
/// 2. buckets K+1 … N, N = min(K + search_up, top): best fit in the first with a fitting agent;
/// 3. buckets top … N+1, downward: the agent with the largest free amount in the first with one.
///
/// Beyond the seed ([`RingsConfig::search`]): a demand asking for
/// none of a spared dimension is first searched among agents with none of it free; and when the
/// [`PlacementContext`] carries an [`AgentScore`], the first `candidates` fitting agents in the
/// search's order (across buckets) and up to `largest` of the largest are ranked by it (equal
/// scores: the least cpu left, then the lowest agent key), and a demand asking for none of a
/// spared dimension that no agent without it fits gets the leftover pass before the search of
/// all agents. [`RingsConfig::seed_001`] turns all of them off.
///
/// [`RingsConfig::search`]: crate::placement::RingsConfig::search
/// [`RingsConfig::seed_001`]: crate::placement::RingsConfig::seed_001
#[derive(Clone, Copy, Debug, Default)]
pub struct RingPlacer;

impl Placer for RingPlacer {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        let search = cluster.rings_config().search();
        let (k, score) = tie_break(search, context);
        let walk = Walk {
            k,
            score,
            reach: context.reach_of(demand),
            memo: context.memo(),
        };
        // Spared dimensions this demand does not ask for, which some agent has none of free.
        let mut spared: [usize; 4] = [0; 4];
        let mut n_spared = 0;
        for name in search.spare() {
            if n_spared == spared.len() || demand.milli(name) > 0 {
                continue;
            }
            if let Some(d) = cluster.dimension_of(name) {
                if cluster.some_agent_without(d) {
                    spared[n_spared] = d;
                    n_spared += 1;
                }
            }
        }
        if n_spared > 0 {
            let spared = &spared[..n_spared];
            // The sparing search: among agents with none of the spared dimensions free. The
            // cluster's plain rings hold exactly those when every spared dimension is spared
            // (the usual case); otherwise the full rings, walking past the others.
            let found = if cluster.plain_rings_spare(spared) {
                ring_search(cluster, Rings::Plain, demand, eligible, walk)
            } else {
                let without = |key: AgentKey| {
                    spared.iter().all(|&d| cluster.free_in(key, d) == 0) && eligible(key)
                };
                ring_search(cluster, Rings::All, demand, &without, walk)
            };
            if found.is_some() {
                return found;
            }
            if let Some(score) = score.filter(|_| k > 1) {
                let found = leftover_search(cluster, spared[0], demand, eligible, k, score);
                if found.is_some() {
                    return found;
                }
            }
        }
        ring_search(cluster, Rings::All, demand, eligible, walk)
    }
}

/// How many candidates the search ranks, and by which score: the caller's score and
/// [`RingSearch::candidates`] when it gives one and more than one candidate, else 1 and none.
fn tie_break<'s>(
    search: &RingSearch,
    context: &PlacementContext<'s>,
) -> (usize, Option<&'s dyn AgentScore>) {
    match context.score().filter(|_| search.candidates() > 1) {
        Some(score) => (search.candidates(), Some(score)),
        None => (1, None),
    }
}

/// The dimension whose ring a demand is searched in: the first spared dimension
/// ([`RingSearch::spare`]) the demand asks for and the cluster has, else the dominant one. A
/// spared dimension is the scarce one: a demand asking for a little of it and a lot of cpu is
/// still placed by where that dimension is free (measured: docs/results.md, "Closing the gap
/// to FGD").
fn searched_dimension<'d>(cluster: &Cluster, demand: &'d Resources) -> Option<&'d str> {
    let spare = cluster.rings_config().search().spare();
    demand
        .iter()
        .filter(|&(_, amount)| amount > 0)
        .map(|(name, _)| name)
        .filter(|name| spare.iter().any(|s| s == name) && cluster.ring(name).is_some())
        .min_by_key(|name| spare.iter().position(|s| s == name))
        .or_else(|| dominant_dimension(demand, cluster.total()))
}

/// Which ring sets a search walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rings {
    /// Every agent ([`Cluster::ring`]).
    All,
    /// The agents with none of any spared dimension free ([`Cluster::plain_ring`]).
    Plain,
}

/// How one search walks: how many candidates its score ranks (1 and none: the first fitting),
/// and which agents it may leave out unchecked ([`PlacementContext::reach_of`]: the demand's
/// grade and classes).
#[derive(Clone, Copy)]
struct Walk<'s> {
    k: usize,
    score: Option<&'s dyn AgentScore>,
    reach: Reach,
    /// The caller's memo of this demand's searches ([`PlacementContext::with_memo`]).
    memo: Option<&'s RefCell<WalkMemo>>,
}

/// One ring search (the three phases) among `eligible` agents of `rings`; with a score and
/// `k` > 1, the first `k` fitting agents in the search's order are ranked by the score
/// ([`scored_search`]). In a graded ring the best-fit phases walk only agents of the demand's
/// grade or more once the walk has passed a few that do not fit
/// ([`RingSet::best_fits_across`]): the same answer, fewer agents checked.
fn ring_search(
    cluster: &Cluster,
    rings: Rings,
    demand: &Resources,
    eligible: &dyn Fn(AgentKey) -> bool,
    Walk {
        k,
        score,
        reach,
        memo,
    }: Walk,
) -> Option<Decision> {
    let dimension = searched_dimension(cluster, demand)?;
    let ring = match rings {
        Rings::All => cluster.ring(dimension)?,
        Rings::Plain => cluster.plain_ring(dimension)?,
    };
    let need = demand.milli(dimension);
    // No agent has that much free in the dominant dimension: nothing to search (the common
    // case at the end of an allocation step, when most agents are taken).
    if need > ring.max_free() {
        return None;
    }
    let resolved = cluster.resolve(demand);
    let fitting = |key: AgentKey| cluster.fits(key, &resolved) && eligible(key);
    let decided = |agent: AgentKey, phase: Phase, bucket: usize| Decision {
        agent,
        phase: Some(phase),
        bucket: Some(bucket),
        dimension: Some(dimension.into()),
        note: PlacerNote::None,
    };
    if let Some(score) = score.filter(|_| k > 1) {
        let cpu_left = cpu_left(cluster, demand);
        let largest = match score.ranks_largest() {
            true => cluster.rings_config().search().largest(),
            false => 0,
        };
        let walk = (k, largest, reach);
        // Remembered: the best fits of a window reaching the top bucket (else a window short
        // of k fitting agents goes on into the downward phase).
        let reaches_top = ring.bucket_of(need).saturating_add(ring.search_up()) >= ring.len() - 1;
        let remembered = memo
            .filter(|_| reaches_top)
            .and_then(|memo| Some((memo, cluster.dimension_of(dimension)?)));
        let found = match remembered {
            Some((memo, d)) => {
                let question = Question {
                    demand,
                    reach,
                    k,
                    dimension: d,
                    plain: rings == Rings::Plain,
                };
                let ranks = (score, &cpu_left as &dyn Fn(AgentKey) -> u64);
                let walk = (&fitting, largest);
                remembered_search(cluster, ring, need, walk, ranks, question, memo)
            }
            None => scored_search(ring, need, &fitting, walk, demand, score, &cpu_left),
        };
        return found.map(|(agent, phase, bucket)| decided(agent, phase, bucket));
    }
    let k = ring.bucket_of(need);
    let top = ring.len() - 1;
    let n = k.saturating_add(ring.search_up()).min(top);
    let mut first = Candidates::new();
    ring.best_fits_across(k..=n, need, reach, &fitting, 1, &mut first);
    if let Some(&(free, agent)) = first.first() {
        let bucket = ring.bucket_of(free);
        return Some(decided(agent, phase_of(bucket, k), bucket));
    }
    for bucket in (n + 1..=top).rev() {
        ring.largest_fits(bucket, need, reach, &fitting, 1, &mut first);
        if let Some(&(_, agent)) = first.first() {
            return Some(decided(agent, Phase::Down, bucket));
        }
    }
    None
}

/// An agent's free cpu after `demand`, the scored tie-break's rule for equal scores: by the cpus
/// ring's per-agent index when there is one (O(1)); by name otherwise.
fn cpu_left<'c>(cluster: &'c Cluster, demand: &Resources) -> impl Fn(AgentKey) -> u64 + 'c {
    let cpus = cluster.dimension_of(CPUS);
    let cpu_need = demand.milli(CPUS);
    move |key: AgentKey| match cpus {
        Some(d) => cluster.free_in(key, d).saturating_sub(cpu_need),
        None => cluster.agent(key).map_or(u64::MAX, |agent| {
            agent.free.milli(CPUS).saturating_sub(cpu_need)
        }),
    }
}

/// The leftover pass, for a demand asking for none of the spared dimension `spared` when no
/// agent with none of it free fits: the agents with some but less than one whole unit of it
/// free ([`LEFTOVER_BELOW`]), least first — there, what
/// is left of it is mostly leftovers no demand can use, so taking the other dimensions beside
/// it strands little (FGD puts its CPU-only tasks there too) — the first `k` that fit, ranked
/// like the scored tie-break (score, then least cpu left, then lowest key). Examines at most
/// [`LEFTOVER_SCAN_PER_CANDIDATE`] × `k` agents; `None` when none of those fits.
///
/// Measured on the openb trace family (docs/results.md, "Stop 29"): without it, CPU-only tasks
/// took the cpu beside idle GPUs and `ring` lost to FGD on every file with 20 % or more CPU-only
/// tasks or 40 % or more GPU-sharing tasks.
fn leftover_search(
    cluster: &Cluster,
    spared: usize,
    demand: &Resources,
    eligible: &dyn Fn(AgentKey) -> bool,
    k: usize,
    score: &dyn AgentScore,
) -> Option<Decision> {
    let name = cluster.dimension_name(spared);
    let ring = cluster.ring(name)?;
    let resolved = cluster.resolve(demand);
    let cpu_left = cpu_left(cluster, demand);
    // Plain loops: no iterator adapters between the tree and the checks.
    let limit = LEFTOVER_SCAN_PER_CANDIDATE.saturating_mul(k);
    let (mut examined, mut ranked) = (0, 0);
    let mut best: Option<((i64, u64, AgentKey), u64)> = None;
    for (free, key) in ring.ascending_positive() {
        if free >= LEFTOVER_BELOW || examined == limit || ranked == k {
            break;
        }
        examined += 1;
        if !(cluster.fits(key, &resolved) && eligible(key)) {
            continue;
        }
        ranked += 1;
        let here = rank(score, demand, &cpu_left, key);
        if best.is_none_or(|(b, _)| here < b) {
            best = Some((here, free));
        }
    }
    let ((_, _, agent), free) = best?;
    Some(Decision {
        agent,
        phase: Some(Phase::Leftover),
        bucket: Some(ring.bucket_of(free)),
        dimension: Some(name.into()),
        note: PlacerNote::None,
    })
}

/// The scored tie-break: the first `k` fitting agents in the seed search's order — bucket K and
/// the upward window in best-fit order, then the downward buckets largest first — continuing
/// into the next buckets until `k` are found, and the lowest `score` among them. Equal scores
/// go to the least `cpu_left` (the agent's free cpu after the demand: best fit on cpu keeps
/// cpu where GPUs are idle), then to the lowest agent key (the rule of the FGD
/// paper's simulator, whose quantised score ties often). The first candidate is the seed
/// search's answer. When the `k` were found within the upward window, up to `largest` more:
/// the largest fitting agents of at most [`LARGEST_BUCKETS`] buckets from the top down, all
/// above the last bucket taken. O((k + largest) log n) ordered-set steps plus the buckets
/// visited, and `k + largest` calls of `score` and `cpu_left`.
fn scored_search<F: Fn(AgentKey) -> bool>(
    ring: &RingSet,
    need: u64,
    fitting: &F,
    (k, largest, reach): (usize, usize, Reach),
    demand: &Resources,
    score: &dyn AgentScore,
    cpu_left: &dyn Fn(AgentKey) -> u64,
) -> Option<(AgentKey, Phase, usize)> {
    let kf = ring.bucket_of(need);
    let top = ring.len() - 1;
    let n = kf.saturating_add(ring.search_up()).min(top);
    let mut best = Best::new(score, demand, cpu_left);
    let mut some = Candidates::new();
    // The best-fit buckets in one walk; the candidates come in increasing free amount, so
    // each one's bucket is found by stepping past the bounds below it (no lookup each).
    ring.best_fits_across(kf..=n, need, reach, fitting, k, &mut some);
    let mut bucket = kf;
    let mut upper = ring.layout().range(bucket).1;
    for &(free, key) in &some {
        while upper.is_some_and(|u| free >= u) && bucket < n {
            bucket += 1;
            upper = ring.layout().range(bucket).1;
        }
        best.offer(key, phase_of(bucket, kf), bucket);
    }
    let last = match best.seen >= k {
        true => bucket,
        false => n,
    };
    if best.seen < k {
        for bucket in (n + 1..=top).rev() {
            ring.largest_fits(bucket, need, reach, fitting, k - best.seen, &mut some);
            best.offer_all(&some, Phase::Down, bucket);
            if best.seen >= k {
                break;
            }
        }
    } else {
        // The largest: best fit alone never offers the score an agent of another kind (on the
        // openb trace with GPU-model constraints, the small T4 nodes fill every candidate
        // place while larger nodes of models few tasks need stay idle). From the top bucket
        // down to the one above the last the search took, so no agent is ranked twice.
        // At most LARGEST_BUCKETS buckets with fitting agents are taken, so rings of many
        // buckets stay as cheap as rings of few.
        let wanted = k + largest;
        let mut taken = 0;
        for bucket in (last + 1..=top).rev() {
            if best.seen >= wanted || taken == LARGEST_BUCKETS {
                break;
            }
            ring.largest_fits(bucket, need, reach, fitting, wanted - best.seen, &mut some);
            taken += usize::from(!some.is_empty());
            best.offer_all(&some, Phase::Down, bucket);
        }
    }
    best.found
}

/// The scored tie-break of [`scored_search`] without the largest candidates, in a window that
/// reaches the top bucket (so no downward phase), through the caller's memo ([`super::memo`]):
/// when the memo holds this demand's last search and few agents changed since, only those are
/// checked and ranked (and the walk continued past the last remembered place if candidates
/// left); otherwise the best fits are walked, ranked and remembered. The same candidates as
/// [`scored_search`], so the same answer.
fn remembered_search<F: Fn(AgentKey) -> bool>(
    cluster: &Cluster,
    ring: &RingSet,
    need: u64,
    (fitting, largest): (&F, usize),
    (score, cpu_left): (&dyn AgentScore, &dyn Fn(AgentKey) -> u64),
    question: Question,
    memo: &RefCell<WalkMemo>,
) -> Option<(AgentKey, Phase, usize)> {
    let (k, reach) = (question.k, question.reach);
    let kf = ring.bucket_of(need);
    let top = ring.len() - 1;
    let n = kf.saturating_add(ring.search_up()).min(top);
    let then = cluster.changes().now();
    // The first k are ranked, the spares behind them kept unranked for when some leave.
    let kept = k.saturating_add(SPARES);
    let mut memo = memo.borrow_mut();
    let mut more = Candidates::new();
    let changes = cluster.changes();
    if let Some(recalled) = memo.recall(&question, changes) {
        let Recalled {
            candidates,
            frontier,
            changed,
            then: remembered_at,
        } = recalled;
        // Without a frontier the memo held every fitting agent of the window.
        let last = *frontier;
        // The changed agents out: looked up one by one when few (the list is contiguous),
        // else each candidate asked whether it changed.
        if changed.len() <= FEW_CHANGED {
            for key in &changed {
                if let Some(at) = candidates.iter().position(|r| r.key == *key) {
                    candidates.remove(at);
                }
            }
        } else {
            candidates.retain(|r| !changes.changed_since(r.key, remembered_at));
        }
        // Back in, unranked (their scores are likely out of date), those that fit now at or
        // before the frontier.
        for &key in &changed {
            let free = cluster.free_in(key, question.dimension);
            let within = free >= need && last.is_none_or(|last| (free, key) <= last);
            if within && cluster.files(question.plain, key) && fitting(key) {
                debug_assert!(ring.holds(ring.bucket_of(free), key, free));
                let at = candidates.partition_point(|r| r.place() < (free, key));
                candidates.insert(at, Remembered::unranked((free, key)));
            }
        }
        if candidates.len() > kept {
            candidates.truncate(kept);
            *frontier = candidates.last().map(Remembered::place);
        }
        if let Some(last) = last.filter(|_| candidates.len() < k) {
            let wanted = kept - candidates.len();
            ring.best_fits_after(kf..=n, need, last, reach, fitting, wanted, &mut more);
            *frontier = frontier_of(&more, wanted);
            candidates.extend(more.iter().map(|&place| Remembered::unranked(place)));
        }
    } else {
        ring.best_fits_across(kf..=n, need, reach, fitting, kept, &mut more);
        memo.keep(&question, then, &more, frontier_of(&more, kept));
    }
    let all = memo.candidates(&question)?;
    let ranked = k.min(all.len());
    let now = &mut all[..ranked];
    for r in now.iter_mut().filter(|r| !r.ranked) {
        r.score = score.score(r.key, question.demand);
        r.cpu_left = cpu_left(r.key);
        r.ranked = true;
    }
    let best = best_ranked(now);
    let mut found = best.map(|best| {
        let bucket = ring.bucket_of(best.free);
        (best.rank(), (best.key, phase_of(bucket, kf), bucket))
    });
    // The largest, walked afresh as `scored_search` walks them: from the top bucket down to the
    // one above the k-th best fit's, at most LARGEST_BUCKETS buckets with fitting agents.
    if let Some(kth) = now.get(k - 1).filter(|_| largest > 0) {
        let last = ring.bucket_of(kth.free);
        let (mut seen, mut taken) = (0, 0);
        for bucket in (last + 1..=top).rev() {
            if seen >= largest || taken == LARGEST_BUCKETS {
                break;
            }
            ring.largest_fits(bucket, need, reach, fitting, largest - seen, &mut more);
            taken += usize::from(!more.is_empty());
            seen += more.len();
            for &(_, key) in &more {
                let here = (score.score(key, question.demand), cpu_left(key), key);
                if found.as_ref().is_none_or(|(best, _)| here < *best) {
                    found = Some((here, (key, Phase::Down, bucket)));
                }
            }
        }
    }
    found.map(|(_, decision)| decision)
}

/// The remembered candidate of least [`Remembered::rank`]: a plain loop comparing the score
/// first (the rest only on equal scores), since the walk order holds no rank order.
fn best_ranked(candidates: &[Remembered]) -> Option<&Remembered> {
    let (mut best, rest) = candidates.split_first()?;
    for r in rest {
        if r.score < best.score
            || (r.score == best.score && (r.cpu_left, r.key) < (best.cpu_left, best.key))
        {
            best = r;
        }
    }
    Some(best)
}

/// The lowest-ranked candidate so far of a scored tie-break ([`rank`]'s order: the score, then
/// the least cpu left, then the lowest key), ranking each as it is found. The cpu rule is
/// measured on the openb trace (docs/results.md, "Stop 25": the `sharing40` mix 5.27 → 5.08 %
/// unallocated, median of seeds 42–71, the default mix unchanged); it is read only for a
/// candidate whose score equals the best so far, since a lower score wins without it.
struct Best<'a> {
    score: &'a dyn AgentScore,
    demand: &'a Resources,
    cpu_left: &'a dyn Fn(AgentKey) -> u64,
    /// Candidates ranked so far.
    seen: usize,
    /// The best's score, cpu left and key.
    rank: (i64, u64, AgentKey),
    found: Option<(AgentKey, Phase, usize)>,
}

impl<'a> Best<'a> {
    fn new(
        score: &'a dyn AgentScore,
        demand: &'a Resources,
        cpu_left: &'a dyn Fn(AgentKey) -> u64,
    ) -> Self {
        Best {
            score,
            demand,
            cpu_left,
            seen: 0,
            rank: (i64::MAX, u64::MAX, AgentKey::MAX),
            found: None,
        }
    }

    /// Ranks the candidates one bucket gave, found in `phase` in `bucket`.
    fn offer_all(&mut self, candidates: &[(u64, AgentKey)], phase: Phase, bucket: usize) {
        for &(_, key) in candidates {
            self.offer(key, phase, bucket);
        }
    }

    /// Ranks one candidate, found in `phase` in `bucket`.
    fn offer(&mut self, key: AgentKey, phase: Phase, bucket: usize) {
        self.seen += 1;
        let score = self.score.score(key, self.demand);
        if self.found.is_some() && score > self.rank.0 {
            return;
        }
        let rank = (score, (self.cpu_left)(key), key);
        if self.found.is_none() || rank < self.rank {
            self.rank = rank;
            self.found = Some((key, phase, bucket));
        }
    }
}

/// The phase of a best fit found in `bucket` when the demand's bucket is `first`.
fn phase_of(bucket: usize, first: usize) -> Phase {
    match bucket == first {
        true => Phase::Bucket,
        false => Phase::Up,
    }
}

/// A candidate's rank in the scored tie-break and the leftover pass (lower first): the score,
/// then the least cpu left, then the lowest key.
fn rank(
    score: &dyn AgentScore,
    demand: &Resources,
    cpu_left: &dyn Fn(AgentKey) -> u64,
    key: AgentKey,
) -> (i64, u64, AgentKey) {
    (score.score(key, demand), cpu_left(key), key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{RingLayout, RingSpec, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// A cluster whose own placer is the ring (the default kind), so `Cluster::place` runs it.
    fn ring_cluster(rings: RingsConfig) -> Cluster {
        Cluster::new(rings, Default::default())
    }

    /// cpus: 8 equal buckets of 1 cpu, search_up 2; mem: one big bucket so it never matters.
    fn cluster(agents: &[&str]) -> Cluster {
        let mut rings = RingsConfig::default();
        rings.set(
            "cpus",
            RingSpec::new(
                RingLayout::EqualSpans {
                    base: 0,
                    step: 1000,
                    buckets: 8,
                },
                2,
            )
            .unwrap(),
        );
        let mut cluster = ring_cluster(rings);
        for a in agents {
            cluster.add_agent(r(a));
        }
        cluster
    }

    #[test]
    fn every_phase_of_the_ring_search() {
        struct Case {
            what: &'static str,
            agents: &'static [&'static str],
            demand: &'static str,
            expected: Option<(AgentKey, Phase, usize)>,
        }
        let cases = [
            Case {
                what: "best fit inside bucket K",
                agents: &["cpus:2.9;mem:100", "cpus:2.2;mem:100", "cpus:2.5;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Bucket, 2)),
            },
            Case {
                what: "bucket K holds only agents below the demand: go up",
                agents: &[
                    "cpus:2.4;mem:100",
                    "cpus:2.1;mem:100",
                    "cpus:3.7;mem:100",
                    "cpus:3.2;mem:100",
                ],
                demand: "cpus:2.5;mem:10",
                expected: Some((3, Phase::Up, 3)),
            },
            Case {
                what: "upward window: first bucket with a fit wins, best fit inside it",
                agents: &["cpus:4.9;mem:100", "cpus:4.1;mem:100", "cpus:5.5;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Up, 4)),
            },
            Case {
                what: "boundary of the upward window: K+search_up is still up",
                agents: &["cpus:7.5;mem:100", "cpus:4.9;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Up, 4)),
            },
            Case {
                what: "just past the window: downward phase from the top",
                agents: &["cpus:5.1;mem:100", "cpus:6.9;mem:100", "cpus:6.2;mem:100"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Down, 6)),
            },
            Case {
                what: "downward phase picks the largest agent in the first bucket with a fit",
                agents: &[
                    "cpus:7.1;mem:100",
                    "cpus:9;mem:100",
                    "cpus:30;mem:100",
                    "cpus:5;mem:100",
                ],
                demand: "cpus:1;mem:1",
                expected: Some((2, Phase::Down, 7)),
            },
            Case {
                what: "fits the dominant dimension but not another: skipped",
                agents: &["cpus:2.1;mem:5", "cpus:2.6;mem:100", "cpus:2.3;mem:9"],
                demand: "cpus:2;mem:10",
                expected: Some((1, Phase::Bucket, 2)),
            },
            Case {
                what: "largest agent lacks another dimension: next largest",
                agents: &["cpus:30;mem:5", "cpus:20;mem:100", "cpus:1;mem:100"],
                demand: "cpus:3;mem:10",
                expected: Some((1, Phase::Down, 7)),
            },
            Case {
                what: "search_up capped at the top bucket",
                agents: &["cpus:7;mem:100", "cpus:12;mem:100", "cpus:9;mem:100"],
                demand: "cpus:6.5;mem:10",
                expected: Some((0, Phase::Up, 7)),
            },
            Case {
                what: "equal free amounts: lowest key",
                agents: &["cpus:3.5;mem:100", "cpus:3.5;mem:100"],
                demand: "cpus:3;mem:10",
                expected: Some((0, Phase::Bucket, 3)),
            },
            Case {
                what: "nothing fits",
                agents: &["cpus:1;mem:100", "cpus:4;mem:1"],
                demand: "cpus:2;mem:10",
                expected: None,
            },
            Case {
                what: "a dimension the cluster has none of",
                agents: &["cpus:8;mem:100"],
                demand: "cpus:1;gpus:1",
                expected: None,
            },
        ];
        for case in cases {
            let cluster = cluster(case.agents);
            let got = cluster.place(&r(case.demand), &|_| true).map(|d| {
                assert_eq!(d.dimension.as_deref(), Some("cpus"), "{}", case.what);
                (d.agent, d.phase.unwrap(), d.bucket.unwrap())
            });
            assert_eq!(got, case.expected, "{}", case.what);
        }
    }

    #[test]
    fn eligibility_filters_like_a_misfit() {
        let cluster = cluster(&["cpus:2.1;mem:100", "cpus:2.6;mem:100", "cpus:6;mem:100"]);
        let d = cluster.place(&r("cpus:2;mem:1"), &|k| k != 0).unwrap();
        assert_eq!((d.agent, d.phase), (1, Some(Phase::Bucket)));
        let d = cluster.place(&r("cpus:2;mem:1"), &|k| k == 2).unwrap();
        assert_eq!(
            (d.agent, d.phase, d.bucket),
            (2, Some(Phase::Down), Some(6))
        );
        assert_eq!(cluster.place(&r("cpus:2;mem:1"), &|_| false), None);
    }

    /// The scored tie-break on a hand-made case: gpus dominant, four agents. Best-fit order is
    /// 1 (1.5 free), 3 (2 free), 0 (4 free), 2 (8 free); the caller's score prefers 0, then 2.
    #[test]
    fn scored_tie_break_picks_the_lowest_score_among_the_first_k() {
        let mut cluster = ring_cluster(RingsConfig::default());
        for total in [
            "cpus:8;mem:100;gpus:4",
            "cpus:8;mem:100;gpus:1.5",
            "cpus:8;mem:100;gpus:8",
            "cpus:8;mem:100;gpus:2",
        ] {
            cluster.add_agent(r(total));
        }
        let demand = r("cpus:1;mem:1;gpus:1");
        let score = |agent: AgentKey, _: &Resources| match agent {
            0 => 1,
            2 => 2,
            _ => 5,
        };
        let place = |cluster: &Cluster, candidates: usize| {
            let mut rings = cluster.rings_config().clone();
            let spare = rings.search().spare().to_vec();
            rings.set_search(RingSearch::new(spare, candidates).unwrap());
            let mut c = ring_cluster(rings);
            for (_, a) in cluster.agents() {
                c.add_agent(a.total.clone());
            }
            let mut context = PlacementContext::default().with_score(&score);
            let d = c.place_in(&demand, &|_| true, &mut context).unwrap();
            (d.agent, d.phase.unwrap(), d.bucket.unwrap())
        };
        // K = 1: no tie-break, the seed's best fit (bucket 1 holds 1.5).
        assert_eq!(place(&cluster, 1), (1, Phase::Bucket, 1));
        // K = 2: candidates 1, 3 (both score 5): the earlier, 1.
        assert_eq!(place(&cluster, 2), (1, Phase::Bucket, 1));
        // K = 3: candidates spill into bucket 4 and take 0 (score 1).
        assert_eq!(place(&cluster, 3), (0, Phase::Up, 4));
        // The same with agent 0 not eligible: 2 (score 2) once K reaches it.
        let mut context = PlacementContext::default().with_score(&score);
        let d = cluster
            .place_in(&demand, &|k| k != 0, &mut context)
            .unwrap();
        assert_eq!((d.agent, d.bucket), (2, Some(8)));
        // Without a score the default search is the seed's, whatever K.
        assert_eq!(cluster.place(&demand, &|_| true).unwrap().agent, 1);
        // Equal scores go to the lowest key, not the search's first candidate: with every
        // score equal, K = 2 ranks 1 and 3 and takes 1; K = 3 reaches 0 and takes it.
        let flat = |_: AgentKey, _: &Resources| 7;
        let place_flat = |candidates: usize| {
            let mut rings = RingsConfig::default();
            rings.set_search(RingSearch::new(vec!["gpus".into()], candidates).unwrap());
            let mut c = ring_cluster(rings);
            for (_, a) in cluster.agents() {
                c.add_agent(a.total.clone());
            }
            let mut context = PlacementContext::default().with_score(&flat);
            c.place_in(&demand, &|_| true, &mut context).unwrap().agent
        };
        assert_eq!((place_flat(2), place_flat(3), place_flat(4)), (1, 0, 0));
    }

    /// Where a scored search with `candidates` and `largest` places one GPU among five 2-GPU
    /// agents (keys 0–4) and one 8-GPU agent (key 5), and in which phase.
    fn five_small_one_large(
        candidates: usize,
        largest: usize,
        score: &dyn AgentScore,
    ) -> Option<(AgentKey, Phase)> {
        let mut rings = RingsConfig::default();
        let search = RingSearch::new(vec!["gpus".into()], candidates)
            .and_then(|s| s.with_largest(largest))
            .unwrap();
        rings.set_search(search);
        let mut cluster = ring_cluster(rings);
        for _ in 0..5 {
            cluster.add_agent(r("cpus:8;mem:100;gpus:2"));
        }
        cluster.add_agent(r("cpus:8;mem:100;gpus:8"));
        let mut context = PlacementContext::default().with_score(score);
        let d = cluster.place_in(&r("cpus:1;mem:1;gpus:1"), &|_| true, &mut context);
        d.map(|d| (d.agent, d.phase.unwrap()))
    }

    /// The largest candidates: beside the first K in best-fit order, the score also ranks up
    /// to `largest` of the largest fitting agents from the top bucket down (above the last
    /// bucket the search took, so none twice). Five 2-GPU agents fill K = 2; the 8-GPU agent 5,
    /// which the score prefers, is ranked only with `largest` ≥ 1.
    #[test]
    fn largest_candidates_reach_past_the_best_fits() {
        let score = |agent: AgentKey, _: &Resources| if agent == 5 { -1 } else { 0 };
        let place = |largest: usize, candidates: usize| {
            five_small_one_large(candidates, largest, &score).unwrap()
        };
        assert_eq!(place(0, 2), (0, Phase::Up));
        assert_eq!(place(1, 2), (5, Phase::Down));
        assert_eq!(RingSearch::default().largest(), DEFAULT_LARGEST);
        assert_eq!(
            RingSearch::default()
                .with_largest(65)
                .unwrap_err()
                .to_string(),
            "at most 64 largest candidates are allowed, not 65"
        );
        // K = 8 runs out of the five and reaches agent 5 in the upward window itself.
        assert_eq!(place(0, 8), (5, Phase::Up));
    }

    /// A score that does not rank the largest ([`AgentScore::ranks_largest`] false: the
    /// fragment score of a target that names no GPU model) is offered the best fits alone,
    /// whatever `largest` says.
    #[test]
    fn a_score_may_decline_the_largest_candidates() {
        struct Score(bool);
        impl AgentScore for Score {
            fn score(&self, agent: AgentKey, _: &Resources) -> i64 {
                if agent == 5 {
                    -1
                } else {
                    0
                }
            }
            fn ranks_largest(&self) -> bool {
                self.0
            }
        }
        let place = |score: &Score| five_small_one_large(2, 4, score);
        assert_eq!(place(&Score(true)), Some((5, Phase::Down)));
        assert_eq!(place(&Score(false)), Some((0, Phase::Up)));
    }

    /// Equal scores go to the candidate with the least cpu left after the placement, before the
    /// lowest key; a better score still wins whatever the cpu.
    #[test]
    fn equal_scores_go_to_the_least_cpu_left() {
        let place = |cpus: [&str; 3], score: &dyn AgentScore| {
            let mut rings = RingsConfig::default();
            rings.set_search(RingSearch::new(vec!["gpus".into()], 8).unwrap());
            let mut cluster = ring_cluster(rings);
            for c in cpus {
                cluster.add_agent(r(&format!("cpus:{c};mem:100;gpus:2")));
            }
            let mut context = PlacementContext::default().with_score(score);
            let demand = r("cpus:2;mem:1;gpus:1");
            cluster
                .place_in(&demand, &|_| true, &mut context)
                .unwrap()
                .agent
        };
        let flat = |_: AgentKey, _: &Resources| 0;
        // 16, 4, 8 cpus: 4 leaves 2 after the demand, the least.
        assert_eq!(place(["16", "4", "8"], &flat), 1);
        assert_eq!(place(["4", "16", "3"], &flat), 2);
        // Equal cpu too: the lowest key.
        assert_eq!(place(["8", "4", "4"], &flat), 1);
        // A better score beats less cpu.
        let prefers_0 = |agent: AgentKey, _: &Resources| if agent == 0 { -1 } else { 0 };
        assert_eq!(place(["16", "4", "8"], &prefers_0), 0);
    }

    /// The leftover pass: a CPU-only demand no agent without free GPU can hold goes, with a
    /// score, to the first K fitting agents by least GPU free, below one whole GPU (their free
    /// GPU is leftovers),
    /// ranked like the tie-break, not to the best fit on cpu beside idle GPUs; past the scan
    /// bound, or without a score, to the best fit on cpu as before.
    #[test]
    fn leftover_pass_ranks_the_least_spared_free_that_fit() {
        let flat = |_: AgentKey, _: &Resources| 0;
        let demand = r("cpus:4;mem:1");
        let place = |agents: &[&str], candidates: usize, score: Option<&dyn AgentScore>| {
            let mut rings = RingsConfig::default();
            rings.set_search(RingSearch::new(vec!["gpus".into()], candidates).unwrap());
            let mut cluster = ring_cluster(rings);
            for a in agents {
                cluster.add_agent(r(a));
            }
            let mut context = PlacementContext::default();
            if let Some(score) = score {
                context = context.with_score(score);
            }
            let d = cluster.place_in(&demand, &|_| true, &mut context).unwrap();
            (d.agent, d.phase.unwrap())
        };
        let agents = [
            "cpus:2;mem:100",           // 0: no GPU, too little cpu
            "cpus:4;mem:100;gpus:2",    // 1: idle GPUs, the best fit on cpu
            "cpus:16;mem:100;gpus:0.2", // 2: a little GPU left
            "cpus:1;mem:100;gpus:0.1",  // 3: less GPU left, no room
            "cpus:8;mem:100;gpus:0.5",  // 4: more GPU left
        ];
        // K = 2: candidates 2 and 4 (least GPU free that fit); equal scores, least cpu left.
        assert_eq!(place(&agents, 2, Some(&flat)), (4, Phase::Leftover));
        let prefers_2 = |agent: AgentKey, _: &Resources| if agent == 2 { -1 } else { 0 };
        assert_eq!(place(&agents, 2, Some(&prefers_2)), (2, Phase::Leftover));
        // Agent 1's two whole GPUs free are no leftovers: K = 8 still ranks only 2 and 4.
        assert_eq!(place(&agents, 8, Some(&flat)), (4, Phase::Leftover));
        // Without a score, or with K = 1, the full rings' best fit on cpu.
        assert_eq!(place(&agents, 2, None), (1, Phase::Bucket));
        assert_eq!(place(&agents, 1, Some(&flat)), (1, Phase::Bucket));
        // The pass examines 16 × K agents: with K = 2, 32 agents holding less GPU and no room
        // fill the scan, so the full search takes agent 1; with 30, the scan reaches agent 3
        // and agent 2, the one candidate.
        let crowded: Vec<&str> = agents
            .iter()
            .copied()
            .chain(std::iter::repeat_n("cpus:1;mem:100;gpus:0.05", 32))
            .collect();
        assert_eq!(place(&crowded, 2, Some(&flat)), (1, Phase::Bucket));
        assert_eq!(place(&crowded[..35], 2, Some(&flat)), (2, Phase::Leftover));
    }

    /// A demand asking for a spared dimension is searched in that dimension's ring even when
    /// another dimension dominates it; without sparing (the seed's search), in the dominant one.
    #[test]
    fn a_spared_dimension_asked_for_is_the_one_searched() {
        let agents = ["cpus:8;mem:100;gpus:4", "cpus:64;mem:100;gpus:1"];
        // cpus 6/72 of the cluster against gpus 0.1/5: cpus dominates.
        let demand = r("cpus:6;mem:1;gpus:0.1");
        let place = |rings: RingsConfig| {
            let mut cluster = ring_cluster(rings);
            for a in agents {
                cluster.add_agent(r(a));
            }
            let d = cluster.place(&demand, &|_| true).unwrap();
            (d.agent, d.dimension.unwrap())
        };
        // The gpus ring's best fit is the agent with 1 GPU free; the cpus ring's the 8 cpus one.
        assert_eq!(place(RingsConfig::default()), (1, "gpus".into()));
        assert_eq!(place(RingsConfig::seed_001()), (0, "cpus".into()));
    }

    /// SPEC seed 001 example: one 4 CPU / 8 GB agent takes (2, 1 GB) then (2, 2 GB).
    #[test]
    fn seed_001_example() {
        let mut cluster = ring_cluster(RingsConfig::default());
        let a = cluster.add_agent(r("cpus:4;mem:8192"));
        for task in ["cpus:2;mem:1024", "cpus:2;mem:2048"] {
            let d = cluster.place(&r(task), &|_| true).unwrap();
            assert_eq!(d.agent, a);
            cluster.take(d.agent, &r(task)).unwrap();
        }
        assert_eq!(cluster.agent(a).unwrap().free, r("mem:5120"));
        assert_eq!(cluster.place(&r("cpus:1;mem:1"), &|_| true), None);
    }

    /// The ring placer as it was before the plain rings: the sparing search walks the full
    /// rings and skips every agent with a spared dimension free. The reference for
    /// `sparing_search_equals_filtering_the_full_rings`.
    fn place_filtered(
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        let search = cluster.rings_config().search();
        let (k, score) = tie_break(search, context);
        let walk = Walk {
            k,
            score,
            reach: Reach::ALL,
            memo: None,
        };
        let spared: Vec<usize> = search
            .spare()
            .iter()
            .filter(|name| demand.milli(name) == 0)
            .filter_map(|name| cluster.dimension_of(name))
            .filter(|&d| cluster.some_agent_without(d))
            .take(4)
            .collect();
        if !spared.is_empty() {
            let without = |key: AgentKey| {
                spared.iter().all(|&d| cluster.free_in(key, d) == 0) && eligible(key)
            };
            if let Some(found) = ring_search(cluster, Rings::All, demand, &without, walk) {
                return Some(found);
            }
            // The leftover pass, by a sort of every agent instead of the ring.
            if let Some(score) = score.filter(|_| k > 1) {
                let name = cluster.dimension_name(spared[0]);
                let mut holding: Vec<(u64, AgentKey)> = cluster
                    .agents()
                    .map(|(key, agent)| (agent.free.milli(name), key))
                    .filter(|&(free, _)| free > 0 && free < LEFTOVER_BELOW)
                    .collect();
                holding.sort_unstable();
                let cpu_left = |key: AgentKey| {
                    let free = cluster.agent(key).unwrap().free.milli(CPUS);
                    free.saturating_sub(demand.milli(CPUS))
                };
                let best = holding
                    .into_iter()
                    .take(LEFTOVER_SCAN_PER_CANDIDATE * k)
                    .filter(|&(_, key)| {
                        cluster.agent(key).unwrap().free.contains(demand) && eligible(key)
                    })
                    .take(k)
                    .min_by_key(|&(_, key)| (score.score(key, demand), cpu_left(key), key));
                if let Some((free, agent)) = best {
                    return Some(Decision {
                        agent,
                        phase: Some(Phase::Leftover),
                        bucket: Some(cluster.ring(name).unwrap().bucket_of(free)),
                        dimension: Some(name.into()),
                        note: PlacerNote::None,
                    });
                }
            }
        }
        ring_search(cluster, Rings::All, demand, eligible, walk)
    }

    mod best {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Ranking each candidate as it is found, reading the cpu rule only on an equal
            /// score, picks what the minimum of the full rank over all of them picks.
            #[test]
            fn streaming_rank_is_the_minimum_of_the_full_rank(
                found in proptest::collection::vec(
                    proptest::collection::vec((0i64..4, 0u64..3), 0..6),
                    0..5,
                ),
            ) {
                // Candidate i of the flattened list has key 100 - i: keys unique, not ordered.
                let flat: Vec<(i64, u64)> = found.iter().flatten().copied().collect();
                let key_of = |i: usize| 100 - i;
                let score = |key: AgentKey, _: &Resources| flat[100 - key].0;
                let cpu = |key: AgentKey| flat[100 - key].1;
                let demand = Resources::new();
                let mut best = Best::new(&score, &demand, &cpu);
                let mut i = 0;
                for (bucket, group) in found.iter().enumerate() {
                    let candidates: Vec<(u64, AgentKey)> =
                        group.iter().map(|_| { i += 1; (0, key_of(i - 1)) }).collect();
                    best.offer_all(&candidates, Phase::Up, bucket);
                }
                let expected = (0..flat.len())
                    .min_by_key(|&i| (flat[i].0, flat[i].1, key_of(i)))
                    .map(key_of);
                prop_assert_eq!(best.found.map(|f| f.0), expected);
                prop_assert_eq!(best.seen, flat.len());
            }
        }
    }

    mod sparing {
        use super::*;
        use proptest::prelude::*;

        const NAMES: [&str; 4] = ["cpus", "mem", "gpus", "fpgas"];

        fn bundle(amounts: [u64; 4]) -> Resources {
            Resources::from_milli(NAMES.into_iter().zip(amounts).filter(|&(_, m)| m > 0)).unwrap()
        }

        fn agent_total() -> impl Strategy<Value = Resources> {
            (
                1u64..=40,
                1u64..=16,
                prop_oneof![3 => Just(0u64), 1 => 1u64..=4],
                prop_oneof![4 => Just(0u64), 1 => 1u64..=2],
            )
                .prop_map(|(c, m, g, f)| bundle([c * 250, m * 256_000, g * 1000, f * 1000]))
        }

        fn demand() -> impl Strategy<Value = Resources> {
            (
                0u64..=24,
                0u64..=12,
                prop_oneof![4 => Just(0u64), 1 => 1u64..=2],
                prop_oneof![6 => Just(0u64), 1 => Just(1u64)],
            )
                .prop_map(|(c, m, g, f)| bundle([c * 250, m * 256_000, g * 1000, f * 1000]))
        }

        #[derive(Clone, Debug)]
        enum Op {
            Add(Resources),
            Remove(usize),
            Take(usize, Resources),
            TakeAll(usize),
            /// Gives back this many quarters of what is taken in every dimension.
            GiveBack(usize, u64),
            /// Demand, eligibility (none, key % 3 != 0, key even), with the score.
            Place(Resources, u8, bool),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => agent_total().prop_map(Op::Add),
                1 => any::<usize>().prop_map(Op::Remove),
                3 => (any::<usize>(), demand()).prop_map(|(i, r)| Op::Take(i, r)),
                2 => any::<usize>().prop_map(Op::TakeAll),
                2 => (any::<usize>(), 1u64..=4).prop_map(|(i, q)| Op::GiveBack(i, q)),
                6 => (demand(), 0u8..3, any::<bool>()).prop_map(|(d, e, s)| Op::Place(d, e, s)),
            ]
        }

        /// Search options: default (spare gpus), gpus and fpgas, fpgas only, and the default
        /// layouts or small cpus buckets (every phase, the downward one included).
        fn rings(spare: u8, small: bool, candidates: usize) -> RingsConfig {
            let mut rings = RingsConfig::default();
            let spare: Vec<String> = match spare {
                0 => vec!["gpus".into()],
                1 => vec!["gpus".into(), "fpgas".into()],
                _ => vec!["fpgas".into()],
            };
            rings.set_search(RingSearch::new(spare, candidates).unwrap());
            if small {
                let layout = RingLayout::EqualSpans {
                    base: 0,
                    step: 1000,
                    buckets: 6,
                };
                rings.set("cpus", RingSpec::new(layout, 1).unwrap());
            }
            rings
        }

        fn nth_key(cluster: &Cluster, i: usize) -> Option<AgentKey> {
            let keys: Vec<AgentKey> = cluster.agents().map(|(k, _)| k).collect();
            (!keys.is_empty()).then(|| keys[i % keys.len()])
        }

        /// Each plain ring holds exactly the agents with none of a spared dimension free, in
        /// the bucket of their free amount, like the full ring.
        fn check_plain_rings(cluster: &Cluster) -> Result<(), TestCaseError> {
            let spare = cluster.rings_config().search().spare();
            for name in NAMES {
                let (Some(ring), Some(plain)) = (cluster.ring(name), cluster.plain_ring(name))
                else {
                    continue;
                };
                for bucket in 0..ring.len() {
                    let expected: Vec<(u64, AgentKey)> = ring
                        .members(bucket)
                        .filter(|&(_, key)| {
                            let free = &cluster.agent(key).unwrap().free;
                            spare.iter().all(|s| free.milli(s) == 0)
                        })
                        .collect();
                    let got: Vec<(u64, AgentKey)> = plain.members(bucket).collect();
                    prop_assert_eq!(got, expected, "{} bucket {}", name, bucket);
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn sparing_search_equals_filtering_the_full_rings(
                spare in 0u8..3,
                small in any::<bool>(),
                candidates in prop_oneof![Just(1usize), Just(2), Just(16)],
                agents in prop::collection::vec(agent_total(), 0..24),
                ops in prop::collection::vec(op(), 1..80),
            ) {
                let mut cluster = ring_cluster(rings(spare, small, candidates));
                for total in agents {
                    cluster.add_agent(total);
                }
                let score = |agent: AgentKey, demand: &Resources| {
                    ((agent as u64 * 7919 + demand.milli("cpus") / 250) % 4) as i64
                };
                let mut taken = Vec::new();
                for op in ops {
                    match op {
                        Op::Add(total) => {
                            cluster.add_agent(total);
                        }
                        Op::Remove(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                cluster.remove_agent(key);
                            }
                        }
                        Op::Take(i, r) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let _ = cluster.take(key, &r);
                            }
                        }
                        Op::TakeAll(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                cluster.take_all(key, &mut taken).unwrap();
                            }
                        }
                        Op::GiveBack(i, quarters) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let agent = cluster.agent(key).unwrap();
                                let used = agent.total.saturating_sub(&agent.free);
                                let back = Resources::from_milli(
                                    used.iter().map(|(n, m)| (n, m / 4 * quarters)),
                                )
                                .unwrap();
                                cluster.give_back(key, &back).unwrap();
                            }
                        }
                        Op::Place(demand, eligible, scored) => {
                            let eligible = move |key: AgentKey| match eligible {
                                0 => true,
                                1 => key % 3 != 0,
                                _ => key % 2 == 0,
                            };
                            let context = || {
                                let context = PlacementContext::default();
                                if scored {
                                    context.with_score(&score)
                                } else {
                                    context
                                }
                            };
                            let got = cluster.place_in(&demand, &eligible, &mut context());
                            let expected =
                                place_filtered(&cluster, &demand, &eligible, &mut context());
                            prop_assert_eq!(got, expected, "demand {}", demand);
                        }
                    }
                    check_plain_rings(&cluster)?;
                }
            }
        }
    }

    mod graded {
        use super::*;
        use crate::placement::ring_set::{ALL_CLASSES, UNCLASSED, UNGRADED};
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            /// cpus (quarters), whole GPUs.
            Add(u64, u64),
            Remove(usize),
            /// cpus (quarters) and milli-GPU taken.
            Take(usize, u64, u64),
            GiveBack(usize),
            /// The agent can now take demands up to grade `cap`; graded `cap + over`.
            Capable(usize, u8, u8),
            /// The agent is of class `c` (0..4), or unclassed.
            Classify(usize, Option<u8>),
            /// cpus (quarters), milli-GPU, the demand's grade, with the score, the classes it
            /// allows (bits 0..4).
            Place(u64, u64, u8, bool, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                2 => (1u64..=64, 1u64..=8).prop_map(|(c, g)| Op::Add(c, g)),
                1 => any::<usize>().prop_map(Op::Remove),
                4 => (any::<usize>(), 0u64..=8, prop::sample::select(vec![250u64, 500, 1000, 2000]))
                    .prop_map(|(i, c, g)| Op::Take(i, c, g)),
                1 => any::<usize>().prop_map(Op::GiveBack),
                4 => (any::<usize>(), 0u8..8, prop_oneof![3 => Just(0u8), 1 => 1u8..4])
                    .prop_map(|(i, c, o)| Op::Capable(i, c, o)),
                2 => (any::<usize>(), prop::option::of(0u8..4)).prop_map(|(i, c)| Op::Classify(i, c)),
                4 => (0u64..=8, prop::sample::select(vec![250u64, 500, 1000, 3000]), 0u8..8, any::<bool>(), prop_oneof![Just(ALL_CLASSES), 0u64..16])
                    .prop_map(|(c, g, d, s, m)| Op::Place(c, g, d, s, m)),
            ]
        }

        pub(super) fn bundle(cpu_quarters: u64, gpu_milli: u64) -> Resources {
            Resources::from_milli(
                [("cpus", cpu_quarters * 250), ("gpus", gpu_milli)]
                    .into_iter()
                    .filter(|&(_, m)| m > 0),
            )
            .unwrap()
        }

        pub(super) fn nth_key(cluster: &Cluster, i: usize) -> Option<AgentKey> {
            let keys: Vec<AgentKey> = cluster.agents().map(|(k, _)| k).collect();
            (!keys.is_empty()).then(|| keys[i % keys.len()])
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// A graded and classed ring walk finds what the plain walk finds whenever the
            /// grades and classes keep their promise (an agent graded below a demand's grade,
            /// or of a class the demand leaves out, cannot take it; here each agent can take
            /// demands up to a hidden capability, and is graded at or above it, and of its
            /// class only those allowing it), however the agents' free amounts, grades and
            /// classes change, with and without the largest candidates.
            #[test]
            fn a_graded_walk_places_as_the_plain_walk(
                candidates in prop_oneof![Just(1usize), Just(4), Just(40)],
                largest in prop_oneof![Just(0usize), Just(3)],
                agents in prop::collection::vec((1u64..=64, 1u64..=8), 0..40),
                ops in prop::collection::vec(op(), 1..120),
            ) {
                let mut rings = RingsConfig::default();
                let search = RingSearch::new(vec!["gpus".into()], candidates).unwrap();
                rings.set_search(search.with_largest(largest).unwrap());
                let mut cluster = ring_cluster(rings);
                // Each agent's hidden capability by key (7, any demand, until said).
                let mut capable: Vec<u8> = Vec::new();
                let set_capable = |cluster: &mut Cluster, capable: &mut Vec<u8>, key: AgentKey, cap: u8, over: u8| {
                    if capable.len() <= key {
                        capable.resize(key + 1, 7);
                    }
                    capable[key] = cap;
                    cluster.set_grade(key, "gpus", cap.saturating_add(over));
                };
                // Each agent's hidden class by key (none: any demand).
                let mut class_of: Vec<Option<u8>> = Vec::new();
                let set_class = |cluster: &mut Cluster, class_of: &mut Vec<Option<u8>>, key: AgentKey, class: Option<u8>| {
                    if class_of.len() <= key {
                        class_of.resize(key + 1, None);
                    }
                    class_of[key] = class;
                    cluster.set_class(key, "gpus", class.unwrap_or(UNCLASSED));
                };
                for (c, g) in agents {
                    let key = cluster.add_agent(bundle(c, g * 1000));
                    set_capable(&mut cluster, &mut capable, key, 7, 0);
                }
                let score = |agent: AgentKey, demand: &Resources| {
                    ((agent as u64 * 7919 + demand.milli("gpus") / 250) % 3) as i64
                };
                for op in ops {
                    match op {
                        Op::Add(c, g) => {
                            let key = cluster.add_agent(bundle(c, g * 1000));
                            // A new agent under a reused key starts ungraded: capable of all.
                            prop_assert_eq!(cluster.ring("gpus").unwrap().grade(key), UNGRADED);
                            prop_assert_eq!(cluster.ring("gpus").unwrap().class(key), UNCLASSED);
                            set_capable(&mut cluster, &mut capable, key, 7, 0);
                            set_class(&mut cluster, &mut class_of, key, None);
                        }
                        Op::Remove(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                cluster.remove_agent(key);
                            }
                        }
                        Op::Take(i, c, g) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let _ = cluster.take(key, &bundle(c, g));
                            }
                        }
                        Op::GiveBack(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let agent = cluster.agent(key).unwrap();
                                let used = agent.total.saturating_sub(&agent.free);
                                cluster.give_back(key, &used).unwrap();
                            }
                        }
                        Op::Capable(i, cap, over) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                set_capable(&mut cluster, &mut capable, key, cap, over);
                            }
                        }
                        Op::Classify(i, class) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                set_class(&mut cluster, &mut class_of, key, class);
                            }
                        }
                        Op::Place(c, g, grade, scored, classes) => {
                            let demand = bundle(c, g);
                            let caps = &capable;
                            let class_of = &class_of;
                            let eligible = |key: AgentKey| {
                                caps.get(key).is_none_or(|&cap| cap >= grade)
                                    && class_of
                                        .get(key)
                                        .copied()
                                        .flatten()
                                        .is_none_or(|class| classes & 1 << class != 0)
                            };
                            let demand_grade = move |_: &Resources| grade;
                            let demand_classes = move |_: &Resources| classes;
                            let context = |graded: bool| {
                                let mut context = PlacementContext::default();
                                if scored {
                                    context = context.with_score(&score);
                                }
                                if graded {
                                    context = context
                                        .with_grade(&demand_grade)
                                        .with_classes(&demand_classes);
                                }
                                context
                            };
                            let got = cluster.place_in(&demand, &eligible, &mut context(true));
                            let plain = cluster.place_in(&demand, &eligible, &mut context(false));
                            prop_assert_eq!(got, plain, "demand {} grade {} classes {:b}", demand, grade, classes);
                        }
                    }
                }
            }
        }
    }

    mod remembered {
        use super::graded::{bundle, nth_key};
        use super::*;
        use crate::placement::changes::KEPT;
        use crate::placement::placers::memo::{WalkMemo, REPAIR_AT_MOST};
        use proptest::prelude::*;
        use std::cell::RefCell;

        #[derive(Clone, Debug)]
        enum Op {
            /// cpus (quarters), whole GPUs.
            Add(u64, u64),
            Remove(usize),
            /// cpus (quarters) and milli-GPU taken.
            Take(usize, u64, u64),
            GiveBack(usize),
            /// The agent can now take demands up to grade `cap` (graded so).
            Capable(usize, u8),
            /// Many takes at once: more changes than a memo re-checks.
            Burst(usize),
            /// One of the few demands.
            Place(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                1 => (1u64..=64, 1u64..=8).prop_map(|(c, g)| Op::Add(c, g)),
                1 => any::<usize>().prop_map(Op::Remove),
                6 => (any::<usize>(), 0u64..=4, prop::sample::select(vec![250u64, 500, 1000, 2000]))
                    .prop_map(|(i, c, g)| Op::Take(i, c, g)),
                2 => any::<usize>().prop_map(Op::GiveBack),
                1 => (any::<usize>(), 0u8..8).prop_map(|(i, c)| Op::Capable(i, c)),
                1 => any::<usize>().prop_map(Op::Burst),
                8 => (0usize..4).prop_map(Op::Place),
            ]
        }

        /// A memo answers the next search of its demand after a take by re-checking the one
        /// agent taken from, with the plain search's answer; a burst of changes and another
        /// demand make it walk again.
        #[test]
        fn a_memo_answers_the_next_search_of_its_demand() {
            let mut rings = RingsConfig::default();
            rings.set_search(RingSearch::new(vec!["gpus".into()], 4).unwrap());
            let mut cluster = ring_cluster(rings);
            for g in [1, 2, 2, 4, 8, 8] {
                cluster.add_agent(bundle(32, g * 1000));
            }
            let score = |agent: AgentKey, _: &Resources| (agent % 3) as i64;
            let memo = RefCell::new(WalkMemo::default());
            let demand = bundle(1, 1000);
            let eligible = |_: AgentKey| true;
            let place = |cluster: &Cluster, memo: Option<&RefCell<WalkMemo>>| {
                let mut context = PlacementContext::default().with_score(&score);
                if let Some(memo) = memo {
                    context = context.with_memo(memo);
                }
                cluster
                    .place_in(&demand, &eligible, &mut context)
                    .map(|d| d.agent)
            };
            assert_eq!(place(&cluster, Some(&memo)), place(&cluster, None));
            assert_eq!(memo.borrow().recalled(), 0);
            let mut recalled = 0;
            for _ in 0..6 {
                let Some(agent) = place(&cluster, Some(&memo)) else {
                    break;
                };
                recalled += 1;
                assert_eq!(memo.borrow().recalled(), recalled);
                assert_eq!(Some(agent), place(&cluster, None));
                cluster.take(agent, &demand).unwrap();
            }
            assert!(recalled >= 4, "{recalled}");
            // Many changes of two agents: each re-checked once, recalled.
            let before = memo.borrow().recalled();
            for _ in 0..REPAIR_AT_MOST / 2 {
                for key in [4, 5] {
                    cluster.take(key, &bundle(1, 0)).unwrap();
                    cluster.give_back(key, &bundle(1, 0)).unwrap();
                }
            }
            assert_eq!(place(&cluster, Some(&memo)), place(&cluster, None));
            assert_eq!(memo.borrow().recalled(), before + 1, "two agents changed");
            // Far more changes than that: walked again, not recalled.
            for _ in 0..KEPT {
                cluster.take(5, &bundle(1, 0)).unwrap();
                cluster.give_back(5, &bundle(1, 0)).unwrap();
            }
            assert_eq!(place(&cluster, Some(&memo)), place(&cluster, None));
            assert_eq!(memo.borrow().recalled(), before + 1, "walked");
            // Another demand through the same memo: walked, and remembered for that demand.
            let other = bundle(2, 500);
            let mut context = PlacementContext::default()
                .with_score(&score)
                .with_memo(&memo);
            let got = cluster
                .place_in(&other, &eligible, &mut context)
                .map(|d| d.agent);
            let mut context = PlacementContext::default().with_score(&score);
            assert_eq!(
                got,
                cluster
                    .place_in(&other, &eligible, &mut context)
                    .map(|d| d.agent)
            );
            assert_eq!(memo.borrow().recalled(), before + 1);
        }

        /// A score that asks for the largest candidates too.
        struct Largest<F>(F);

        impl<F: Fn(AgentKey) -> i64> AgentScore for Largest<F> {
            fn score(&self, agent: AgentKey, _: &Resources) -> i64 {
                (self.0)(agent)
            }

            fn ranks_largest(&self) -> bool {
                true
            }
        }

        /// The few demands (cpu quarters, milli-GPU, grade), each searched again and again.
        const DEMANDS: [(u64, u64, u8); 4] = [(1, 250, 1), (2, 1000, 4), (0, 500, 2), (4, 2000, 5)];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// A search through a memo places as a search without one, however the agents
            /// change between searches of the same demand (free amounts, grades, presence,
            /// bursts of more changes than a memo re-checks), with a score and an eligibility
            /// that follow the agents' state, with and without the largest candidates, and a
            /// search window that does or does not reach the top bucket.
            #[test]
            fn a_remembered_walk_places_as_the_plain_walk(
                candidates in prop_oneof![Just(2usize), Just(5), Just(40)],
                largest in prop_oneof![Just(0usize), Just(3)],
                search_up in prop_oneof![Just(1usize), Just(16)],
                agents in prop::collection::vec((1u64..=64, 1u64..=8), 0..40),
                ops in prop::collection::vec(op(), 1..150),
            ) {
                let mut rings = RingsConfig::default();
                let search = RingSearch::new(vec!["gpus".into()], candidates).unwrap();
                rings.set_search(search.with_largest(largest).unwrap());
                let gpus = RingSpec::new(RingLayout::Bounds((0..=8).map(|g| g * 1000).collect()), search_up).unwrap();
                rings.set("gpus", gpus);
                let mut cluster = ring_cluster(rings);
                let mut capable: Vec<u8> = Vec::new();
                let set_capable = |cluster: &mut Cluster, capable: &mut Vec<u8>, key: AgentKey, cap: u8| {
                    if capable.len() <= key {
                        capable.resize(key + 1, 7);
                    }
                    capable[key] = cap;
                    cluster.set_grade(key, "gpus", cap);
                };
                for (c, g) in agents {
                    let key = cluster.add_agent(bundle(c, g * 1000));
                    set_capable(&mut cluster, &mut capable, key, 7);
                }
                let memos: Vec<RefCell<WalkMemo>> = (0..DEMANDS.len()).map(|_| RefCell::default()).collect();
                for op in ops {
                    match op {
                        Op::Add(c, g) => {
                            let key = cluster.add_agent(bundle(c, g * 1000));
                            set_capable(&mut cluster, &mut capable, key, 7);
                        }
                        Op::Remove(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                cluster.remove_agent(key);
                            }
                        }
                        Op::Take(i, c, g) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let _ = cluster.take(key, &bundle(c, g));
                            }
                        }
                        Op::GiveBack(i) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                let agent = cluster.agent(key).unwrap();
                                let used = agent.total.saturating_sub(&agent.free);
                                cluster.give_back(key, &used).unwrap();
                            }
                        }
                        Op::Capable(i, cap) => {
                            if let Some(key) = nth_key(&cluster, i) {
                                set_capable(&mut cluster, &mut capable, key, cap);
                            }
                        }
                        Op::Burst(i) => {
                            for j in 0..=REPAIR_AT_MOST {
                                if let Some(key) = nth_key(&cluster, i + j) {
                                    let _ = cluster.take(key, &bundle(0, 250));
                                }
                            }
                        }
                        Op::Place(d) => {
                            let (c, g, grade) = DEMANDS[d];
                            let demand = bundle(c, g);
                            // Score and eligibility follow the agents' state (free GPU, grade).
                            let free: Vec<u64> = (0..capable.len())
                                .map(|key| cluster.agent(key).map_or(0, |a| a.free.milli("gpus")))
                                .collect();
                            let score = Largest(|agent: AgentKey| {
                                ((agent as u64 * 7919 + free.get(agent).copied().unwrap_or(0) / 250) % 5) as i64
                            });
                            let caps = &capable;
                            let eligible = |key: AgentKey| caps.get(key).is_none_or(|&cap| cap >= grade);
                            let demand_grade = move |_: &Resources| grade;
                            let context = || PlacementContext::default()
                                .with_score(&score)
                                .with_grade(&demand_grade);
                            let remembered = cluster.place_in(&demand, &eligible, &mut context().with_memo(&memos[d]));
                            let plain = cluster.place_in(&demand, &eligible, &mut context());
                            prop_assert_eq!(remembered, plain, "demand {}", demand);
                            // The memo, if this search used it, holds the first fitting agents
                            // in walk order, every one up to its frontier (all without one).
                            if let Some((then, places, frontier)) = memos[d].borrow().snapshot() {
                                if then == cluster.changes().now() {
                                    let ring = cluster.ring("gpus").unwrap();
                                    let kf = ring.bucket_of(g);
                                    let resolved = cluster.resolve(&demand);
                                    let fitting = |key: AgentKey| cluster.fits(key, &resolved) && eligible(key);
                                    let reach = context().reach_of(&demand);
                                    let mut all = Candidates::new();
                                    ring.best_fits_across(kf..=ring.len() - 1, g, reach, &fitting, usize::MAX, &mut all);
                                    let expected: Vec<_> = match frontier {
                                        Some(last) => all.iter().copied().filter(|&p| p <= last).collect(),
                                        None => all.to_vec(),
                                    };
                                    prop_assert_eq!(places, expected, "demand {}", demand);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn options_are_checked() {
        assert_eq!(
            RingSearch::new(vec![], 65).unwrap_err().to_string(),
            "at most 64 candidates are allowed, not 65"
        );
        assert_eq!(
            RingSearch::new(vec!["gpus".into(), "gpus".into()], 4)
                .unwrap_err()
                .to_string(),
            "`gpus` is listed twice"
        );
        let s = RingSearch::new(vec!["fpgas".into()], 0).unwrap();
        assert_eq!((s.spare(), s.candidates()), (&["fpgas".to_string()][..], 0));
        assert_eq!(RingSearch::default().spare(), ["gpus"]);
    }
}
