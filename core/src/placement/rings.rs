//! Ring layouts: how one resource dimension's free amounts are cut into ordered buckets.
//!
//! A layout is only arithmetic (which bucket holds an amount, what a bucket's range is); the
//! agents in the buckets live in [`super::ring_set::RingSet`]. Amounts are thousandths of the
//! dimension's unit, the same fixed point as [`Resources::milli`](super::Resources::milli), so
//! `cpus` rings may have fractional boundaries.

use std::collections::BTreeMap;
use std::fmt;

use crate::resources::{format_milli, MILLI};

use super::ring_search::RingSearch;

/// The most buckets one ring may have: each bucket is a small ordered set, and a ring with more
/// buckets than agents only slows the downward search.
pub const MAX_BUCKETS: usize = 65_536;

/// How a dimension is cut into buckets. Amounts are in thousandths of the dimension's unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingLayout {
    /// `[base, base+step), [base+step, base+2·step), …`, `buckets` of them, the last one open-ended.
    /// Amounts below `base` fall into bucket 0.
    EqualSpans {
        base: u64,
        step: u64,
        buckets: usize,
    },
    /// Explicit lower bounds, strictly increasing: bucket i is `[bounds[i], bounds[i+1])`, the last
    /// one open-ended. Amounts below `bounds[0]` fall into bucket 0.
    Bounds(Vec<u64>),
}

/// Why a layout was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingLayoutError {
    #[error("step must be greater than 0")]
    ZeroStep,
    #[error("buckets must be at least 1")]
    NoBuckets,
    #[error("bounds must not be empty")]
    NoBounds,
    #[error("at most {MAX_BUCKETS} buckets are allowed, not {0}")]
    TooManyBuckets(usize),
    #[error("bounds must be strictly increasing ({after} after {before})")]
    NotIncreasing {
        /// Index of the offending bound.
        index: usize,
        before: String,
        after: String,
    },
}

impl RingLayout {
    /// Checks the layout can be used.
    pub fn validate(&self) -> Result<(), RingLayoutError> {
        match self {
            RingLayout::EqualSpans { step, buckets, .. } => {
                if *step == 0 {
                    return Err(RingLayoutError::ZeroStep);
                }
                if *buckets == 0 {
                    return Err(RingLayoutError::NoBuckets);
                }
                if *buckets > MAX_BUCKETS {
                    return Err(RingLayoutError::TooManyBuckets(*buckets));
                }
            }
            RingLayout::Bounds(bounds) => {
                if bounds.is_empty() {
                    return Err(RingLayoutError::NoBounds);
                }
                if bounds.len() > MAX_BUCKETS {
                    return Err(RingLayoutError::TooManyBuckets(bounds.len()));
                }
                if let Some(i) = bounds.windows(2).position(|w| w[1] <= w[0]) {
                    return Err(RingLayoutError::NotIncreasing {
                        index: i + 1,
                        before: format_milli(bounds[i]),
                        after: format_milli(bounds[i + 1]),
                    });
                }
            }
        }
        Ok(())
    }

    /// Number of buckets (at least 1 for a valid layout).
    pub fn len(&self) -> usize {
        match self {
            RingLayout::EqualSpans { buckets, .. } => *buckets,
            RingLayout::Bounds(bounds) => bounds.len(),
        }
    }

    /// True for a layout without buckets (never valid).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bucket holding `amount`: O(1) for equal spans, a binary search for explicit bounds.
    pub fn bucket_of(&self, amount: u64) -> usize {
        match self {
            RingLayout::EqualSpans {
                base,
                step,
                buckets,
            } => {
                let offset = amount.saturating_sub(*base) / (*step).max(1);
                let last = buckets.saturating_sub(1) as u64;
                offset.min(last) as usize
            }
            RingLayout::Bounds(bounds) => {
                bounds.partition_point(|b| *b <= amount).saturating_sub(1)
            }
        }
    }

    /// The range `[lower, upper)` of bucket `index` (`upper` is `None` for the top bucket).
    /// Bucket 0 also holds amounts below its lower bound.
    pub fn range(&self, index: usize) -> (u64, Option<u64>) {
        match self {
            RingLayout::EqualSpans {
                base,
                step,
                buckets,
            } => {
                let at = |i: usize| base.saturating_add(step.saturating_mul(i as u64));
                let upper = (index + 1 < *buckets).then(|| at(index + 1));
                (at(index), upper)
            }
            RingLayout::Bounds(bounds) => {
                let lower = bounds.get(index).copied().unwrap_or(u64::MAX);
                (lower, bounds.get(index + 1).copied())
            }
        }
    }
}

/// A validated layout plus how far the upward phase of the search may climb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingSpec {
    layout: RingLayout,
    search_up: usize,
}

impl RingSpec {
    /// A spec whose layout has been checked.
    pub fn new(layout: RingLayout, search_up: usize) -> Result<Self, RingLayoutError> {
        layout.validate()?;
        Ok(RingSpec { layout, search_up })
    }

    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// How many buckets above the demand's bucket the upward phase visits.
    pub fn search_up(&self) -> usize {
        self.search_up
    }
}

/// Per-dimension ring layouts, with one fallback for dimensions not named, and the search
/// options ([`RingSearch`]) of the ring placer.
///
/// Defaults (amounts in units):
/// - `cpus`: equal spans, base 0, step 1, 64 buckets, search_up 2;
/// - `mem` and `disk` (MiB): bounds 0, 256, 512, 1024, 2048, …, 1048576 (doubling), search_up 1;
/// - `gpus`: equal spans, base 0, step 1, 16 buckets, search_up 16 (upward only: a GPU demand
///   never breaks into the emptiest GPU agent while a fuller one fits);
/// - any other name: bounds 0, 1, 2, 4, …, 2^30 (doubling), search_up 1;
/// - search: spare `gpus`, 40 scored candidates ([`RingSearch::default`]).
///
/// [`RingsConfig::seed_001`] is the same with SPEC seed 001's plain search (gpus search_up 1,
/// no sparing, no tie-break).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingsConfig {
    dimensions: BTreeMap<String, RingSpec>,
    fallback: RingSpec,
    search: RingSearch,
}

/// `search_up` of the default `gpus` ring: at least its bucket count, so never a downward phase.
pub const DEFAULT_GPUS_SEARCH_UP: usize = 16;

fn doubling(first: u64, last: u64) -> Vec<u64> {
    let mut bounds = vec![0];
    let mut b = first;
    while b <= last {
        bounds.push(b * MILLI);
        b *= 2;
    }
    bounds
}

fn checked(layout: RingLayout, search_up: usize) -> RingSpec {
    // The defaults are constants known to be valid; keep them unchecked rather than unwrap.
    RingSpec { layout, search_up }
}

impl Default for RingsConfig {
    fn default() -> Self {
        let mut dimensions = BTreeMap::new();
        dimensions.insert(
            "cpus".to_string(),
            checked(
                RingLayout::EqualSpans {
                    base: 0,
                    step: MILLI,
                    buckets: 64,
                },
                2,
            ),
        );
        let mib = checked(RingLayout::Bounds(doubling(256, 1 << 20)), 1);
        dimensions.insert("mem".to_string(), mib.clone());
        dimensions.insert("disk".to_string(), mib);
        dimensions.insert(
            "gpus".to_string(),
            checked(
                RingLayout::EqualSpans {
                    base: 0,
                    step: MILLI,
                    buckets: 16,
                },
                DEFAULT_GPUS_SEARCH_UP,
            ),
        );
        // GPU devices (docs/devices.md): free milli-GPU share in tenths of a GPU up to 8 GPUs,
        // free GPU memory in doubling MiB buckets, so GPU demands keep the ring search.
        dimensions.insert(
            crate::devices::GPU_MILLI.to_string(),
            checked(
                RingLayout::EqualSpans {
                    base: 0,
                    step: 100 * MILLI,
                    buckets: 81,
                },
                2,
            ),
        );
        dimensions.insert(
            crate::devices::GPU_MEM.to_string(),
            checked(RingLayout::Bounds(doubling(1024, 1 << 20)), 1),
        );
        RingsConfig {
            dimensions,
            fallback: checked(RingLayout::Bounds(doubling(1, 1 << 30)), 1),
            search: RingSearch::default(),
        }
    }
}

impl RingsConfig {
    /// The layouts and search of SPEC seed 001 as first shipped: the default layouts with
    /// `gpus` search_up 1, no sparing and no tie-break.
    pub fn seed_001() -> Self {
        let mut rings = RingsConfig::default();
        if let Some(gpus) = rings.dimensions.get_mut("gpus") {
            gpus.search_up = 1;
        }
        rings.search = RingSearch::seed_001();
        rings
    }

    /// The ring placer's search options.
    pub fn search(&self) -> &RingSearch {
        &self.search
    }

    /// Replaces the ring placer's search options.
    pub fn set_search(&mut self, search: RingSearch) {
        self.search = search;
    }

    /// The spec used for `dimension` (its own, else the fallback).
    pub fn spec_for(&self, dimension: &str) -> &RingSpec {
        self.dimensions.get(dimension).unwrap_or(&self.fallback)
    }

    /// Sets one dimension's spec, replacing the default.
    pub fn set(&mut self, dimension: impl Into<String>, spec: RingSpec) {
        self.dimensions.insert(dimension.into(), spec);
    }

    /// Sets the spec for dimensions not named.
    pub fn set_fallback(&mut self, spec: RingSpec) {
        self.fallback = spec;
    }

    pub fn fallback(&self) -> &RingSpec {
        &self.fallback
    }

    /// The named dimensions and their specs, sorted by name.
    pub fn dimensions(&self) -> impl Iterator<Item = (&str, &RingSpec)> {
        self.dimensions.iter().map(|(n, s)| (n.as_str(), s))
    }
}

impl fmt::Display for RingLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingLayout::EqualSpans {
                base,
                step,
                buckets,
            } => write!(
                f,
                "{buckets} buckets of {} from {}",
                format_milli(*step),
                format_milli(*base)
            ),
            RingLayout::Bounds(bounds) => {
                let parts: Vec<String> = bounds.iter().map(|b| format_milli(*b)).collect();
                write!(f, "bounds [{}]", parts.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_spans_lookup_is_arithmetic_and_last_bucket_open() {
        let layout = RingLayout::EqualSpans {
            base: 2000,
            step: 1000,
            buckets: 4,
        };
        let cases = [
            (0, 0),
            (1999, 0),
            (2000, 0),
            (2999, 0),
            (3000, 1),
            (4500, 2),
            (5000, 3),
            (1_000_000, 3),
        ];
        for (amount, bucket) in cases {
            assert_eq!(layout.bucket_of(amount), bucket, "amount {amount}");
        }
        assert_eq!(layout.range(0), (2000, Some(3000)));
        assert_eq!(layout.range(3), (5000, None));
    }

    #[test]
    fn bounds_lookup_is_a_binary_search() {
        let layout = RingLayout::Bounds(vec![1000, 4000, 16000]);
        let cases = [
            (0, 0),
            (999, 0),
            (1000, 0),
            (3999, 0),
            (4000, 1),
            (16000, 2),
            (u64::MAX, 2),
        ];
        for (amount, bucket) in cases {
            assert_eq!(layout.bucket_of(amount), bucket, "amount {amount}");
        }
        assert_eq!(layout.range(1), (4000, Some(16000)));
        assert_eq!(layout.range(2), (16000, None));
    }

    #[test]
    fn invalid_layouts_are_refused() {
        let cases = [
            (
                RingLayout::EqualSpans {
                    base: 0,
                    step: 0,
                    buckets: 3,
                },
                "step must be greater than 0",
            ),
            (
                RingLayout::EqualSpans {
                    base: 0,
                    step: 1,
                    buckets: 0,
                },
                "buckets must be at least 1",
            ),
            (RingLayout::Bounds(vec![]), "bounds must not be empty"),
            (
                RingLayout::Bounds(vec![0, 1_024_000, 16_384_000, 4_096_000]),
                "bounds must be strictly increasing (4096 after 16384)",
            ),
            (
                RingLayout::Bounds(vec![0, 0]),
                "bounds must be strictly increasing (0 after 0)",
            ),
        ];
        for (layout, message) in cases {
            assert_eq!(layout.validate().unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn defaults_are_valid() {
        let rings = RingsConfig::default();
        for (_, spec) in rings.dimensions() {
            spec.layout().validate().unwrap();
        }
        rings.fallback().layout().validate().unwrap();
        assert_eq!(rings.spec_for("cpus").search_up(), 2);
        assert_eq!(rings.spec_for("mem").layout().bucket_of(4_096_000), 5);
        assert_eq!(rings.spec_for("fpgas"), rings.fallback());
        // Half a GPU free is bucket 5 of the share ring; 16 GiB free is a memory bucket.
        assert_eq!(rings.spec_for("gpu_milli").layout().bucket_of(500_000), 5);
        assert_eq!(rings.spec_for("gpu_mem").layout().bucket_of(16_384_000), 5);
    }
}
