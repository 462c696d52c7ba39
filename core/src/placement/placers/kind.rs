//! The selectable placers by name: [`PlacerKind`], the one place that knows every placer.

use std::fmt;
use std::str::FromStr;

use super::balance::BalancePlacer;
use super::baselines::{FirstFit, LinearBestFit};
use super::node_preference::{LeastRequested, MostBalanced};
use super::ring::RingPlacer;
use super::Placer;

/// The selectable placers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacerKind {
    #[default]
    Ring,
    LinearBestFit,
    FirstFit,
    /// Balance degree with dynamic weights (SPEC seed 000).
    Balance,
    /// Smallest mean requested ÷ capacity (SPEC seed 004).
    LeastRequested,
    /// Smallest variance of requested ÷ capacity (SPEC seed 004).
    MostBalanced,
}

impl PlacerKind {
    pub const ALL: [PlacerKind; 6] = [
        PlacerKind::Ring,
        PlacerKind::LinearBestFit,
        PlacerKind::FirstFit,
        PlacerKind::Balance,
        PlacerKind::LeastRequested,
        PlacerKind::MostBalanced,
    ];

    /// Whether the placer may find no agent although an eligible one has room (balance: only
    /// agents that improve the balance degree, with `require_improvement`). The others search
    /// exhaustively, so their "none" means no eligible agent fits, with no scan to tell.
    pub fn may_decline(self) -> bool {
        matches!(self, PlacerKind::Balance)
    }

    /// Whether the placer reads the pending set of its [`PlacementContext`](super::PlacementContext)
    /// (the balance weights count blocked pending demands). An allocation step keeps that set
    /// only for such a placer and leaves it empty for the others, which never read it.
    pub fn reads_pending(self) -> bool {
        matches!(self, PlacerKind::Balance)
    }

    /// The implementation of this kind.
    pub fn placer(self) -> &'static dyn Placer {
        match self {
            PlacerKind::Ring => &RingPlacer,
            PlacerKind::LinearBestFit => &LinearBestFit,
            PlacerKind::FirstFit => &FirstFit,
            PlacerKind::Balance => &BalancePlacer,
            PlacerKind::LeastRequested => &LeastRequested,
            PlacerKind::MostBalanced => &MostBalanced,
        }
    }
}

impl fmt::Display for PlacerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.placer().name())
    }
}

/// An unknown placer name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown placer `{0}` (expected ring, linear-best-fit, first-fit, balance, least-requested or most-balanced)")]
pub struct UnknownPlacer(pub String);

impl FromStr for PlacerKind {
    type Err = UnknownPlacer;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PlacerKind::ALL
            .into_iter()
            .find(|k| k.placer().name() == s)
            .ok_or_else(|| UnknownPlacer(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placer_names_round_trip() {
        for kind in PlacerKind::ALL {
            assert_eq!(kind.to_string().parse::<PlacerKind>().unwrap(), kind);
        }
        assert_eq!(
            "best".parse::<PlacerKind>().unwrap_err().to_string(),
            "unknown placer `best` (expected ring, linear-best-fit, first-fit, balance, least-requested or most-balanced)"
        );
        assert_eq!(PlacerKind::default(), PlacerKind::Ring);
    }
}
