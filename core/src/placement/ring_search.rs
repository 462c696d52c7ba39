//! How the ring placer searches, beyond each dimension's layout and `search_up`: the options
//! ([`RingSearch`]) that the rings' configuration carries and the ring placer
//! ([`super::placers::ring`]) reads.

pub use super::placers::context::AgentScore;

/// The most candidates a scored tie-break may rank (keeps a decision O(K log n) with small K).
pub const MAX_CANDIDATES: usize = 64;

/// Default number of candidates the caller's score ranks (measured: docs/results.md, "Closing
/// the gap to FGD").
pub const DEFAULT_CANDIDATES: usize = 40;

/// How the ring placer searches, beyond each dimension's layout and `search_up`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingSearch {
    spare: Vec<String>,
    candidates: usize,
    largest: usize,
}

/// Default number of the largest fitting agents the caller's score ranks beside the
/// `candidates` (measured: docs/results.md, "Stop 29").
pub const DEFAULT_LARGEST: usize = 24;

/// Why ring search options were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingSearchError {
    #[error("at most {MAX_CANDIDATES} candidates are allowed, not {0}")]
    TooManyCandidates(usize),
    #[error("at most {MAX_CANDIDATES} largest candidates are allowed, not {0}")]
    TooManyLargest(usize),
    #[error("`{0}` is listed twice")]
    DuplicateSpare(String),
}

impl Default for RingSearch {
    /// Spare `gpus`, rank 40 candidates and the 24 largest (when the caller supplies a score
    /// that asks for the largest).
    fn default() -> Self {
        RingSearch {
            spare: vec!["gpus".to_string()],
            candidates: DEFAULT_CANDIDATES,
            largest: DEFAULT_LARGEST,
        }
    }
}

impl RingSearch {
    /// Checked options: `spare` without repeats, `candidates` ≤ [`MAX_CANDIDATES`] (0 and 1 both
    /// mean "no tie-break"); no largest candidates ([`with_largest`](Self::with_largest) adds
    /// them).
    pub fn new(spare: Vec<String>, candidates: usize) -> Result<Self, RingSearchError> {
        if candidates > MAX_CANDIDATES {
            return Err(RingSearchError::TooManyCandidates(candidates));
        }
        for (i, name) in spare.iter().enumerate() {
            if spare[..i].contains(name) {
                return Err(RingSearchError::DuplicateSpare(name.clone()));
            }
        }
        Ok(RingSearch {
            spare,
            candidates,
            largest: 0,
        })
    }

    /// The same search ranking also up to `largest` (≤ [`MAX_CANDIDATES`]) of the largest
    /// fitting agents, from the top bucket down, beside the `candidates` in the search's order
    /// (only when those stay within the upward window).
    pub fn with_largest(self, largest: usize) -> Result<Self, RingSearchError> {
        if largest > MAX_CANDIDATES {
            return Err(RingSearchError::TooManyLargest(largest));
        }
        Ok(RingSearch { largest, ..self })
    }

    /// The search exactly as SPEC seed 001 states it: no sparing, no tie-break.
    pub fn seed_001() -> Self {
        RingSearch {
            spare: Vec::new(),
            candidates: 1,
            largest: 0,
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

    /// How many of the largest fitting agents the caller's score ranks beside them.
    pub fn largest(&self) -> usize {
        self.largest
    }
}
