//! A scored ring search's memo: the candidates the last search for one demand ranked, with
//! their ranks, kept so that the next search for the same demand re-checks only the agents
//! that changed since ([`Cluster::changes`](crate::placement::Cluster::changes)) instead of
//! walking and ranking all `k` again.
//!
//! The scored tie-break ([`super::ring`]) ranks the first `k` fitting agents in the ring's
//! (free, key) order. An agent that did not change has the same free amount, so the same place
//! in that order, and — on the caller's promise ([`PlacementContext::with_memo`]) — still fits
//! or not and scores as it did. A search remembers the first `k` + [`SPARES`] fitting agents
//! and the last place it looked at (its frontier), so the first fitting agents now are: the
//! remembered ones that did not change, the changed agents that fit now at or before the
//! frontier, and, when fewer than `k` remain, the walk continued past it. That is what
//! [`WalkMemo`] keeps; only the first `k` are ranked (a spare when it moves up, a changed agent
//! again), so the winner is the same agent the full search picks. A property test holds the two
//! equal and the memo's list equal to the ring's fitting agents up to the frontier (`ring.rs`,
//! `a_remembered_walk_places_as_the_plain_walk`).
//!
//! Only the best fits of a window that reaches the ring's top bucket are remembered (a shorter
//! window short of `k` fitting agents goes on into the downward phase, which the memo does not
//! follow); a walk that reached the window's end has no frontier, and a change anywhere in it
//! is re-checked. Where the score asks for the largest candidates too, those are walked afresh
//! each time, beside the remembered best fits.
//!
//! [`PlacementContext::with_memo`]: super::context::PlacementContext::with_memo

use smallvec::SmallVec;

use crate::placement::changes::ChangeLog;
use crate::placement::ring_set::Reach;
use crate::placement::{AgentKey, Resources};

/// More changed agents than this since the last search: walking again costs less than
/// re-checking them one by one.
pub const REPAIR_AT_MOST: usize = 32;

/// More recorded changes than this since the last search (an agent's take and its new grade
/// are two): not counted one by one, walked again.
const RECORDS_AT_MOST: usize = 4 * REPAIR_AT_MOST;

/// Past the `k` candidates a search ranks, this many more fitting agents are remembered
/// (unranked until one of the first `k` leaves): a recalled search whose winner no longer fits
/// takes the next from them instead of walking the ring again.
pub const SPARES: usize = 8;

/// One remembered candidate: its free amount in the searched dimension and key (its place in
/// the walk), its score and cpu left (its rank) once `ranked`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remembered {
    pub free: u64,
    pub key: AgentKey,
    pub score: i64,
    pub cpu_left: u64,
    pub ranked: bool,
}

impl Remembered {
    /// A candidate at `place`, not ranked yet.
    pub fn unranked((free, key): (u64, AgentKey)) -> Self {
        Remembered {
            free,
            key,
            score: 0,
            cpu_left: 0,
            ranked: false,
        }
    }

    pub fn place(&self) -> (u64, AgentKey) {
        (self.free, self.key)
    }

    /// The scored tie-break's order: score, then least cpu left, then lowest key.
    pub fn rank(&self) -> (i64, u64, AgentKey) {
        (self.score, self.cpu_left, self.key)
    }
}

/// What one search asked: the same answers hold only for the same question.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Question<'d> {
    pub demand: &'d Resources,
    pub reach: Reach,
    pub k: usize,
    /// The searched dimension's index, and whether the plain ring was searched.
    pub dimension: usize,
    pub plain: bool,
}

/// A remembered search recalled for repair ([`WalkMemo::recall`]).
pub(crate) struct Recalled<'m> {
    /// Its candidates, to repair in place.
    pub candidates: &'m mut Vec<Remembered>,
    /// The last place its walk looked at, to keep up to date; `None` when it looked at the
    /// whole window (every fitting agent of it is a candidate).
    pub frontier: &'m mut Option<(u64, AgentKey)>,
    /// The agents changed since, each once.
    pub changed: SmallVec<[AgentKey; REPAIR_AT_MOST]>,
    /// The change number it was remembered at.
    pub then: u64,
}

/// One remembered search.
#[derive(Clone, Debug)]
struct Search {
    demand: Resources,
    reach: Reach,
    k: usize,
    dimension: usize,
    /// [`ChangeLog::now`] when the search began.
    then: u64,
    /// The candidates in walk order: the first fitting agents up to `frontier`, at most `k` +
    /// [`SPARES`].
    candidates: Vec<Remembered>,
    /// The last place the walk looked at (every fitting agent up to it is a candidate); `None`
    /// when it looked at the whole window.
    frontier: Option<(u64, AgentKey)>,
}

impl Search {
    fn answers(&self, question: &Question) -> bool {
        self.k == question.k
            && self.dimension == question.dimension
            && self.reach == question.reach
            && self.demand == *question.demand
    }
}

/// The memo of a caller's searches for one demand (the simulator keeps one per task shape);
/// see the module doc. One per cluster: the change numbers it keeps are that cluster's.
#[derive(Clone, Debug, Default)]
pub struct WalkMemo {
    /// The search of all agents and the sparing search of the plain ones (a demand asking for
    /// no GPU may make both).
    searches: [Option<Search>; 2],
    /// Searches answered by re-checking the changed agents.
    recalled: u64,
}

impl WalkMemo {
    /// How many searches this memo answered by re-checking only the agents that changed.
    pub fn recalled(&self) -> u64 {
        self.recalled
    }

    /// The remembered search for `question`, if its change number is still in `changes` and
    /// at most [`REPAIR_AT_MOST`] agents changed since: its candidates (to repair in place),
    /// the agents changed since (each once) and the change number it was remembered at. The
    /// search is then taken as begun at `changes`' present number.
    pub(crate) fn recall(
        &mut self,
        question: &Question,
        changes: &ChangeLog,
    ) -> Option<Recalled<'_>> {
        let search = self.searches[usize::from(question.plain)].as_mut()?;
        if changes.count_since(search.then)? > RECORDS_AT_MOST as u64 || !search.answers(question) {
            return None;
        }
        let mut changed: SmallVec<[AgentKey; REPAIR_AT_MOST]> = SmallVec::new();
        for key in changes.distinct_since(search.then)? {
            if changed.len() == REPAIR_AT_MOST {
                return None;
            }
            changed.push(key);
        }
        let then = std::mem::replace(&mut search.then, changes.now());
        self.recalled += 1;
        Some(Recalled {
            candidates: &mut search.candidates,
            frontier: &mut search.frontier,
            changed,
            then,
        })
    }

    /// Remembers the `candidates` (in walk order, unranked) of a search for `question` begun
    /// at change number `then`, whose walk looked up to `frontier` (`None`: the whole window).
    pub(crate) fn keep(
        &mut self,
        question: &Question,
        then: u64,
        candidates: &[(u64, AgentKey)],
        frontier: Option<(u64, AgentKey)>,
    ) {
        let slot = &mut self.searches[usize::from(question.plain)];
        let unranked = candidates.iter().map(|&place| Remembered::unranked(place));
        match slot {
            Some(search) if search.answers(question) => {
                search.then = then;
                search.frontier = frontier;
                search.candidates.clear();
                search.candidates.extend(unranked);
            }
            _ => {
                *slot = Some(Search {
                    demand: question.demand.clone(),
                    reach: question.reach,
                    k: question.k,
                    dimension: question.dimension,
                    then,
                    candidates: unranked.collect(),
                    frontier,
                })
            }
        }
    }

    /// The candidates remembered for `question`'s ring, to rank in place.
    pub(crate) fn candidates(&mut self, question: &Question) -> Option<&mut [Remembered]> {
        let search = self.searches[usize::from(question.plain)].as_mut()?;
        Some(&mut search.candidates)
    }
}

/// A memo's remembered search of the full rings, for tests: its change number, candidates'
/// places and frontier.
#[cfg(test)]
pub(crate) type Snapshot = (u64, Vec<(u64, AgentKey)>, Option<(u64, AgentKey)>);

#[cfg(test)]
impl WalkMemo {
    /// The remembered search of the full rings: the change number it is current at, its
    /// candidates' places in walk order and its frontier.
    pub(crate) fn snapshot(&self) -> Option<Snapshot> {
        let search = self.searches[0].as_ref()?;
        let places = search.candidates.iter().map(Remembered::place).collect();
        Some((search.then, places, search.frontier))
    }
}

/// The frontier of a walk that asked for `wanted` agents and found `found` (the last one):
/// that one when it found them all, else `None` (it walked to the window's end).
pub(crate) fn frontier_of(found: &[(u64, AgentKey)], wanted: usize) -> Option<(u64, AgentKey)> {
    found.last().copied().filter(|_| found.len() >= wanted)
}
