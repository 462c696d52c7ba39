//! Options of the ring search beyond SPEC seed 001, and the caller's per-agent score hook.
//!
//! Measured on the openb GPU trace (docs/results.md), the seed's search as written strands about
//! twice as much GPU as the best published policy (FGD), for two reasons the ring cannot see:
//! tasks that ask for no GPU use up the cpu beside free GPUs, and among agents with the same
//! free amount in the dominant dimension it cannot tell *which* are left usable. Two bounded
//! additions close the gap while keeping the search a few ordered-set range queries:
//! - **sparing** ([`RingSearch::spare`]): a demand that asks for none of a scarce dimension
//!   (`gpus` by default) is first searched among agents with none of it free, then among all;
//! - **scored tie-break** ([`RingSearch::candidates`]): in the bucket where the search finds its
//!   first fitting agent, the first K fitting agents in the phase's order (best fit, or largest
//!   in the downward phase) are ranked by an [`AgentScore`] the caller supplies through the
//!   [`PlacementContext`](super::PlacementContext) — the simulator and the master supply FGD's
//!   fragmentation growth from per-GPU state ([`super::fragmentation`]); without a score, or with K ≤ 1, the first is chosen, which
//!   is exactly the seed's search. The cost is O(K log n) for a fixed, small K.

use super::{AgentKey, Resources};

/// The most candidates a scored tie-break may rank (keeps a decision O(K log n) with small K).
pub const MAX_CANDIDATES: usize = 64;

/// Default number of candidates the caller's score ranks (measured: docs/results.md).
pub const DEFAULT_CANDIDATES: usize = 16;

/// How the ring placer searches, beyond each dimension's layout and `search_up`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingSearch {
    spare: Vec<String>,
    candidates: usize,
}

/// Why ring search options were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingSearchError {
    #[error("at most {MAX_CANDIDATES} candidates are allowed, not {0}")]
    TooManyCandidates(usize),
    #[error("`{0}` is listed twice")]
    DuplicateSpare(String),
}

impl Default for RingSearch {
    /// Spare `gpus`, rank 16 candidates (when the caller supplies a score).
    fn default() -> Self {
        RingSearch {
            spare: vec!["gpus".to_string()],
            candidates: DEFAULT_CANDIDATES,
        }
    }
}

impl RingSearch {
    /// Checked options: `spare` without repeats, `candidates` ≤ [`MAX_CANDIDATES`] (0 and 1 both
    /// mean "no tie-break").
    pub fn new(spare: Vec<String>, candidates: usize) -> Result<Self, RingSearchError> {
        if candidates > MAX_CANDIDATES {
            return Err(RingSearchError::TooManyCandidates(candidates));
        }
        for (i, name) in spare.iter().enumerate() {
            if spare[..i].contains(name) {
                return Err(RingSearchError::DuplicateSpare(name.clone()));
            }
        }
        Ok(RingSearch { spare, candidates })
    }

    /// The search exactly as SPEC seed 001 states it: no sparing, no tie-break.
    pub fn seed_001() -> Self {
        RingSearch {
            spare: Vec::new(),
            candidates: 1,
        }
    }

    /// Dimensions kept for the demands that ask for them.
    pub fn spare(&self) -> &[String] {
        &self.spare
    }

    /// How many fitting agents, in the search's order, the caller's score ranks.
    pub fn candidates(&self) -> usize {
        self.candidates
    }
}

/// The caller's cost of placing `demand` on an agent (lower is better), for the scored tie-break
/// of the ring search. It is only asked about agents that fit and are eligible. Closures
/// `Fn(AgentKey, &Resources) -> i64` implement it.
pub trait AgentScore {
    fn score(&self, agent: AgentKey, demand: &Resources) -> i64;
}

impl<F: Fn(AgentKey, &Resources) -> i64> AgentScore for F {
    fn score(&self, agent: AgentKey, demand: &Resources) -> i64 {
        self(agent, demand)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
