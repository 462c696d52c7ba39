//! A scored ring search's memo: the candidates the last search for one demand ranked, with
//! their ranks, kept so that the next search for the same demand re-checks only the agents
//! that changed since ([`Cluster::changes`](crate::placement::Cluster::changes)) instead of
//! walking and ranking all `k` again.
//!
//! The scored tie-break ([`super::ring`]) ranks the first `k` fitting agents in the ring's
//! (free, key) order. An agent that did not change has the same free amount, so the same place
//! in that order, and — on the caller's promise ([`PlacementContext::with_memo`]) — still fits
//! or not and scores as it did. So the first `k` fitting agents now are the first `k` of: the
//! remembered candidates that did not change, the changed agents that fit now at or before the
//! last remembered candidate, and, when fewer than `k` remain, the walk continued past that
//! last candidate. That is what [`WalkMemo`] computes; the winner is the same agent the full
//! search picks, and a property test holds the two equal (`ring.rs`,
//! `a_remembered_walk_places_as_the_plain_walk`).
//!
//! Only the best fits of a window that reaches the ring's top bucket are remembered (a shorter
//! window short of `k` fitting agents goes on into the downward phase, which the memo does not
//! follow); fewer than `k` then means every fitting agent of the window, and a change anywhere
//! in it is re-checked. Where the score asks for the largest candidates too, those are walked
//! afresh each time, beside the remembered best fits.
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

/// One remembered candidate: its free amount in the searched dimension and key (its place in
/// the walk), its score and cpu left (its rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remembered {
    pub free: u64,
    pub key: AgentKey,
    pub score: i64,
    pub cpu_left: u64,
}

impl Remembered {
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
    /// The candidates in walk order: the first `k` fitting agents, or fewer when those are
    /// every fitting agent of the search's window.
    candidates: Vec<Remembered>,
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
            changed,
            then,
        })
    }

    /// Remembers the `candidates` (in walk order) of a search for `question` begun at change
    /// number `then`.
    pub(crate) fn keep(
        &mut self,
        question: &Question,
        then: u64,
        candidates: impl Iterator<Item = Remembered>,
    ) {
        let slot = &mut self.searches[usize::from(question.plain)];
        match slot {
            Some(search) if search.answers(question) => {
                search.then = then;
                search.candidates.clear();
                search.candidates.extend(candidates);
            }
            _ => {
                *slot = Some(Search {
                    demand: question.demand.clone(),
                    reach: question.reach,
                    k: question.k,
                    dimension: question.dimension,
                    then,
                    candidates: candidates.collect(),
                })
            }
        }
    }

    /// The candidates remembered for `question`'s ring.
    pub(crate) fn candidates(&self, question: &Question) -> Option<&[Remembered]> {
        let search = self.searches[usize::from(question.plain)].as_ref()?;
        Some(&search.candidates)
    }
}

/// The last place of a remembered search of `k` candidates, past which it did not look;
/// `None` when it holds fewer (it looked at the whole window).
pub(crate) fn frontier(remembered: &[Remembered], k: usize) -> Option<(u64, AgentKey)> {
    remembered
        .last()
        .filter(|_| remembered.len() >= k)
        .map(Remembered::place)
}
