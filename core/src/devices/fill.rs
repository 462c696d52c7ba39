//! Which GPU a slice goes to, looking ahead at the slices expected next (issue 18's "look-ahead
//! over the typical shapes").
//!
//! A GPU's free share is lost for good when no combination of the slices that keep arriving can
//! fill it: 190 milli-GPU beside a 0.81 slice stays free in openb, where almost no slice is that
//! small. [`ShareFill`] knows the *popular* slice sizes of the expected workload (each at least
//! [`POPULAR_SLICE_PER_MILLE`] ‰ of the slices counted) and, for every free share `v` of one GPU,
//! its **unfillable part**: `v` minus the largest sum of popular sizes (each any number of times)
//! that is ≤ `v`. A fully free GPU counts 0 (whole-GPU tasks use it). Placing a slice of `s` on a
//! GPU with `g` free changes that GPU's unfillable part by `waste(g − s) − waste(g)`; the GPU
//! with the least change goes first ([`ShareFill::growth`]; the choice itself is
//! [`DeviceState::select_filling`](super::DeviceState::select_filling) and its free-share form
//! [`select_shares_filling`](super::select_shares_filling)).
//!
//! Only popular sizes count because a size that arrives rarely does not fill the gaps it could
//! fill in theory (openb has 74 slices of 0.16 for about 1,100 gaps of 0.19): counting every
//! size calls nearly every free share fillable and the rule stops telling GPUs apart
//! (docs/results.md, "Stop 30"). Pure: no clock, no I/O.

use super::SHARE_CAPACITY;

/// A slice size is popular when at least this many per mille of the slices counted ask for it.
pub const POPULAR_SLICE_PER_MILLE: u64 = 30;

/// The unfillable part of each free share of one GPU (0–1000 milli-GPU), from the popular slice
/// sizes of an expected workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareFill {
    /// The popular sizes, ascending.
    sizes: Vec<u32>,
    /// `waste[v]`: the unfillable part of `v` milli-GPU free, for v in 0..=1000.
    waste: Vec<u16>,
}

impl Default for ShareFill {
    /// No slice expected: every free share short of a whole GPU is unfillable.
    fn default() -> Self {
        ShareFill::from_sizes(std::iter::empty())
    }
}

impl ShareFill {
    /// From slice sizes with their counts (sizes of 0 or of a whole GPU and more are ignored; a
    /// size may repeat, counts add up): the popular ones are kept.
    pub fn from_counts(counts: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let mut merged: Vec<(u32, u64)> = Vec::new();
        for (size, count) in counts {
            if size == 0 || size >= SHARE_CAPACITY || count == 0 {
                continue;
            }
            match merged.iter_mut().find(|(s, _)| *s == size) {
                Some((_, c)) => *c = c.saturating_add(count),
                None => merged.push((size, count)),
            }
        }
        let all: u128 = merged.iter().map(|&(_, c)| u128::from(c)).sum();
        ShareFill::from_sizes(merged.into_iter().filter_map(|(size, count)| {
            (u128::from(count) * 1000 >= u128::from(POPULAR_SLICE_PER_MILLE) * all).then_some(size)
        }))
    }

    /// From the popular sizes themselves (any order; out-of-range sizes are ignored).
    pub fn from_sizes(sizes: impl IntoIterator<Item = u32>) -> Self {
        let mut sizes: Vec<u32> = sizes
            .into_iter()
            .filter(|&s| s > 0 && s < SHARE_CAPACITY)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let capacity = SHARE_CAPACITY as usize;
        // reachable[v]: v is a sum of popular sizes (unbounded knapsack over 0..=1000).
        let mut reachable = vec![false; capacity + 1];
        reachable[0] = true;
        for v in 1..=capacity {
            reachable[v] = sizes
                .iter()
                .any(|&s| s as usize <= v && reachable[v - s as usize]);
        }
        let mut waste = vec![0u16; capacity + 1];
        let mut largest = 0usize;
        for (v, w) in waste.iter_mut().enumerate() {
            if reachable[v] {
                largest = v;
            }
            *w = (v - largest) as u16;
        }
        waste[capacity] = 0;
        ShareFill { sizes, waste }
    }

    /// The popular sizes, ascending.
    pub fn sizes(&self) -> &[u32] {
        &self.sizes
    }

    /// The unfillable part of `free` milli-GPU free on one GPU (0 for a whole free GPU; a share
    /// over a whole GPU counts as whole).
    pub fn waste(&self, free: u32) -> u32 {
        u32::from(self.waste[free.min(SHARE_CAPACITY) as usize])
    }

    /// How much the GPU's unfillable part grows (negative: shrinks) when a slice of `share`
    /// takes it from `free`; `None` when it does not fit.
    pub fn growth(&self, free: u32, share: u32) -> Option<i64> {
        let after = free.checked_sub(share)?;
        Some(i64::from(self.waste(after)) - i64::from(self.waste(free)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// openb's popular slice sizes (each ≥ 3 % of its slices).
    fn openb() -> ShareFill {
        ShareFill::from_sizes([230, 320, 460, 470, 650, 810])
    }

    #[test]
    fn waste_by_hand() {
        let f = openb();
        // 190 beside a 0.81: no popular size fits.
        assert_eq!(f.waste(190), 190);
        assert_eq!(f.waste(229), 229);
        assert_eq!(f.waste(230), 0);
        // 530: the largest sum ≤ 530 is 470 (230 + 230 = 460, 230 + 320 = 550 is over).
        assert_eq!(f.waste(530), 60);
        // 350: 320 fits, 30 left.
        assert_eq!(f.waste(350), 30);
        // 1000 free is a whole GPU: nothing lost.
        assert_eq!(f.waste(1000), 0);
        // 999: 320 + 650 = 970, 230 + 230 + 470 = 930, 470 + 460 = 930, 810 ...: 29 left.
        assert_eq!(f.waste(999), 29);
        assert_eq!(f.waste(0), 0);
        assert_eq!(f.waste(5000), 0);
    }

    #[test]
    fn growth_prefers_the_gpu_a_slice_leaves_fillable() {
        let f = openb();
        // A 0.47 on a whole GPU leaves 530 (60 unfillable): grows by 60.
        assert_eq!(f.growth(1000, 470), Some(60));
        // On a GPU with 530 free (a 0.47 there already) it leaves 60: 60 → 60, no growth.
        assert_eq!(f.growth(530, 470), Some(0));
        // A 0.32 on a GPU with 350 free (a 0.65 there): 30 → 30.
        assert_eq!(f.growth(350, 320), Some(0));
        // A 0.23 on the 350: leaves 120, all unfillable: 30 → 120.
        assert_eq!(f.growth(350, 230), Some(90));
        assert_eq!(f.growth(100, 230), None);
        // A 0.23 on a whole GPU leaves 770, of which 70 no popular sum fills (230 + 470 = 700).
        assert_eq!(f.waste(770), 70);
        assert_eq!(f.growth(1000, 230), Some(70));
    }

    fn pick(fill: &ShareFill, free: &[u32], share: u32) -> Option<u64> {
        super::super::select_shares_filling(
            free,
            1,
            share,
            super::super::DeviceSelection::MostUsedThatFits,
            Some(fill),
        )
    }

    #[test]
    fn pick_takes_least_growth_then_best_fit_then_lowest() {
        let f = openb();
        // A 0.47: the whole GPU grows by 60; the 530 and the 940 by 0 (60 → 60, 0 → 0), and of
        // those the 530 fits best.
        assert_eq!(pick(&f, &[1000, 530, 940], 470), Some(0b010));
        // Equal growth and equal fit: the lowest position.
        assert_eq!(pick(&f, &[530, 530], 470), Some(0b01));
        // Nothing fits.
        assert_eq!(pick(&f, &[100, 200], 470), None);
        assert_eq!(pick(&f, &[], 470), None);
    }

    #[test]
    fn only_popular_sizes_count() {
        // 160 is 2 % of the slices: not popular; 470 and 810 are.
        let f = ShareFill::from_counts([(470, 49), (810, 49), (160, 2), (1000, 500), (0, 9)]);
        assert_eq!(f.sizes(), &[470, 810]);
        assert_eq!(f.waste(190), 190);
        let g = ShareFill::from_counts([(470, 48), (810, 49), (160, 3)]);
        assert_eq!(g.sizes(), &[160, 470, 810]);
        assert_eq!(g.waste(190), 30);
        // Counts of one size add up.
        let h = ShareFill::from_counts([(160, 2), (160, 2), (470, 96)]);
        assert_eq!(h.sizes(), &[160, 470]);
    }

    /// Whether `v` is a sum of `sizes` (each any number of times), by search.
    fn sum_of(v: u32, sizes: &[u32]) -> bool {
        v == 0
            || sizes
                .iter()
                .any(|&s| s > 0 && s <= v && sum_of(v - s, sizes))
    }

    proptest::proptest! {
        /// waste(v) is v minus the largest sum of popular sizes ≤ v (0 for a whole GPU), and a
        /// popular slice never shrinks the unfillable part of the GPU it takes.
        #[test]
        fn waste_is_what_no_popular_sum_fills(
            sizes in proptest::collection::vec(150u32..1000, 0..4),
            v in 0u32..1000,
        ) {
            let f = ShareFill::from_sizes(sizes.clone());
            let w = f.waste(v);
            proptest::prop_assert!(w <= v);
            proptest::prop_assert!(sum_of(v - w, &sizes));
            for gap in 0..w {
                proptest::prop_assert!(!sum_of(v - gap, &sizes));
            }
            for &s in &sizes {
                if let Some(g) = f.growth(v, s) {
                    proptest::prop_assert!(g >= 0, "size {} on {} free: {}", s, v, g);
                }
            }
            proptest::prop_assert_eq!(f.waste(1000), 0);
        }
    }

    #[test]
    fn no_sizes_every_partial_share_is_unfillable() {
        let f = ShareFill::default();
        assert!(f.sizes().is_empty());
        assert_eq!(f.waste(999), 999);
        assert_eq!(f.waste(1000), 0);
        // Then a partly used GPU goes before a whole one (its share shrinks the waste).
        assert_eq!(pick(&f, &[1000, 600], 300), Some(0b10));
    }
}
