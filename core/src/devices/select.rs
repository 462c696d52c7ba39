//! Which devices a task gets on the chosen agent: the one GPU-in-node choice, used by the
//! master, the simulator and the agent's re-check alike.
//!
//! Two forms of the same rule: [`DeviceState::select`] on an agent's devices (share and
//! memory, the master's and the agent's form), and [`select_shares`] on bare free shares (the
//! simulator's per-GPU node state, which has no device memory). Both rank fitting devices with
//! [`DeviceSelection::prefer`] and take whole devices in index order. [`select_shares_by_cost`]
//! is the choice for a caller that scores each distinct placement (FGD's least fragment growth).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use super::*;

/// How devices are picked on the chosen agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceSelection {
    /// The fitting device with the most free share (spread load).
    #[default]
    LeastUsed,
    /// The fitting device with the least free share (pack, keep whole devices free).
    MostUsedThatFits,
}

impl DeviceSelection {
    /// Which of two fitting devices, keyed by (free share, free memory), goes first:
    /// `Less` = `a`. Equal keys are for the caller to break (lowest index or position).
    pub fn prefer(self, a: (u32, u64), b: (u32, u64)) -> Ordering {
        match self {
            DeviceSelection::LeastUsed => b.cmp(&a),
            DeviceSelection::MostUsedThatFits => a.cmp(&b),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceSelection::LeastUsed => "least-used",
            DeviceSelection::MostUsedThatFits => "most-used-that-fits",
        }
    }
}

impl FromStr for DeviceSelection {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "least-used" | "spread" => Ok(DeviceSelection::LeastUsed),
            "most-used-that-fits" | "pack" => Ok(DeviceSelection::MostUsedThatFits),
            other => Err(DeviceError::Syntax {
                part: other.into(),
                why: "device selection is `least-used` (spread) or `most-used-that-fits` (pack)"
                    .into(),
            }),
        }
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl DeviceState {
    /// Whether device `i` (position, not index) can hold one unit of `request`.
    pub(super) fn device_fits(&self, i: usize, request: &DeviceRequest) -> bool {
        let d = &self.devices[i];
        if !request.allows(&d.model) {
            return false;
        }
        match request.demand {
            GpuDemand::Whole { .. } => {
                self.free_share[i] == SHARE_CAPACITY && self.free_memory[i] == d.memory_mib
            }
            GpuDemand::Slice { share, memory_mib } => {
                self.free_share[i] >= share && self.free_memory[i] >= memory_mib
            }
        }
    }

    /// The plain fit test: enough devices with enough free share and memory.
    pub fn fits(&self, request: &DeviceRequest) -> bool {
        let need = request.device_count() as usize;
        (0..self.devices.len())
            .filter(|&i| self.device_fits(i, request))
            .take(need)
            .count()
            == need
    }

    /// Picks the devices for `request` by `policy`, or `None` when it does not fit. Ties go to
    /// the lowest index. Whole devices: the fully free devices with the lowest indices (all are
    /// equally used); a slice: the fitting device with the most free share (`least-used`) or the
    /// least (`most-used-that-fits`), then the most / least free memory.
    pub fn select(
        &self,
        request: &DeviceRequest,
        policy: DeviceSelection,
    ) -> Option<DeviceBinding> {
        self.select_filling(request, policy, None)
    }

    /// [`select`](Self::select) looking ahead at the expected slices: with `fill`, a slice goes to
    /// the fitting device whose unfillable share grows least ([`ShareFill::growth`]), then by
    /// `policy`, then the lowest index. Whole devices are taken as `select` takes them.
    pub fn select_filling(
        &self,
        request: &DeviceRequest,
        policy: DeviceSelection,
        fill: Option<&ShareFill>,
    ) -> Option<DeviceBinding> {
        let mut fitting: Vec<usize> = (0..self.devices.len())
            .filter(|&i| self.device_fits(i, request))
            .collect();
        match request.demand {
            GpuDemand::Whole { count } => {
                if fitting.len() < count as usize {
                    return None;
                }
                fitting.sort_by_key(|&i| self.devices[i].index);
                let devices = fitting[..count as usize]
                    .iter()
                    .map(|&i| BoundDevice {
                        index: self.devices[i].index,
                        share: SHARE_CAPACITY,
                        memory_mib: self.devices[i].memory_mib,
                    })
                    .collect();
                Some(DeviceBinding { devices })
            }
            GpuDemand::Slice { share, memory_mib } => {
                let key = |i: usize| (self.free_share[i], self.free_memory[i]);
                let growth = |i: usize| fill.and_then(|f| f.growth(self.free_share[i], share));
                let best = fitting.iter().copied().min_by(|&a, &b| {
                    growth(a)
                        .cmp(&growth(b))
                        .then(policy.prefer(key(a), key(b)))
                        .then(self.devices[a].index.cmp(&self.devices[b].index))
                })?;
                Some(DeviceBinding {
                    devices: vec![BoundDevice {
                        index: self.devices[best].index,
                        share,
                        memory_mib,
                    }],
                })
            }
        }
    }

    /// How many copies of `request` these devices hold, at most `limit`. For identical requests
    /// the count does not depend on the selection policy (each device takes as many as fit), so
    /// a framework counting here agrees with the master binding them one by one.
    pub fn copies_of(&self, request: &DeviceRequest, limit: u32) -> u32 {
        let mut state = self.clone();
        let mut count = 0;
        while count < limit {
            let Some(binding) = state.select(request, DeviceSelection::MostUsedThatFits) else {
                break;
            };
            if state.bind(&binding).is_err() {
                break;
            }
            count += 1;
        }
        count
    }
}

/// Devices a pick mask can name (bit i = the device at position i).
pub const MAX_PICK_DEVICES: usize = 64;

/// [`DeviceState::select`] on bare free shares, devices at positions 0, 1, … in index order, of
/// one model, without device memory: `count` devices each giving `share` milli-GPU.
/// - Whole devices (`share` = [`SHARE_CAPACITY`]): the fully free devices at the lowest
///   positions, whatever the policy (all are equally used), as `select` binds `gpus:N`;
/// - otherwise: the `count` devices with at least `share` free, ranked by
///   [`DeviceSelection::prefer`] (ties: lowest position) — for one device, `select`'s slice.
///
/// Returns a mask (bit i = position i; positions from [`MAX_PICK_DEVICES`] on are not
/// considered), `Some(0)` for `count` 0, `None` when fewer than `count` devices fit.
pub fn select_shares(
    free_share: &[u32],
    count: u32,
    share: u32,
    policy: DeviceSelection,
) -> Option<u64> {
    select_shares_filling(free_share, count, share, policy, None)
}

/// [`select_shares`] looking ahead at the expected slices, the free-share form of
/// [`DeviceState::select_filling`]: with `fill`, slices are ranked by [`ShareFill::growth`]
/// first, then by `policy`, then by position.
pub fn select_shares_filling(
    free_share: &[u32],
    count: u32,
    share: u32,
    policy: DeviceSelection,
    fill: Option<&ShareFill>,
) -> Option<u64> {
    let need = count as usize;
    if need == 0 {
        return Some(0);
    }
    // The two common cases in one pass, without a list (this runs for every candidate a score
    // ranks). Whole devices: every fitting device is fully free, so the order is by position
    // alone: the first `count` that fit.
    if share >= SHARE_CAPACITY {
        let mut mask = 0u64;
        let mut found = 0;
        for (i, &g) in free_share.iter().take(MAX_PICK_DEVICES).enumerate() {
            if g >= share {
                mask |= 1 << i;
                found += 1;
                if found == need {
                    return Some(mask);
                }
            }
        }
        return None;
    }
    let growth = |g: u32| fill.and_then(|f| f.growth(g, share));
    let order = |a: &(u32, usize), b: &(u32, usize)| {
        growth(a.0)
            .cmp(&growth(b.0))
            .then(policy.prefer((a.0, 0), (b.0, 0)))
            .then(a.1.cmp(&b.1))
    };
    // One slice: the least fitting device in that order (positions differ, so it is unique).
    if need == 1 {
        let mut best: Option<(u32, usize)> = None;
        for (i, &g) in free_share.iter().take(MAX_PICK_DEVICES).enumerate() {
            if g >= share && best.is_none_or(|b| order(&(g, i), &b).is_lt()) {
                best = Some((g, i));
            }
        }
        return best.map(|(_, i)| 1 << i);
    }
    // Several slices: the fitting devices sorted in that order. On the stack (no allocation).
    let mut buffer = [(0u32, 0usize); MAX_PICK_DEVICES];
    let mut len = 0;
    for (i, &g) in free_share.iter().take(MAX_PICK_DEVICES).enumerate() {
        if g >= share {
            buffer[len] = (g, i);
            len += 1;
        }
    }
    if len < need {
        return None;
    }
    let fitting = &mut buffer[..len];
    fitting.sort_unstable_by(order);
    Some(
        fitting[..need]
            .iter()
            .fold(0, |mask, &(_, i)| mask | (1u64 << i)),
    )
}

/// The placement of `count` × `share` with the least `cost`, for a caller that scores each
/// distinct way (FGD: the growth of the node's fragment). Candidates, in order:
/// - a slice of one device (`count` 1, `share` below [`SHARE_CAPACITY`]): the lowest position of
///   each distinct free share that holds it (devices with equal free shares are interchangeable);
/// - otherwise the one pick of [`select_shares`] with `most-used-that-fits` (whole devices are
///   interchangeable, and for several slices it is the best fit).
///
/// `cost` sees a mask (bit i = position i) and may refuse it with `None`. Returns the least cost
/// with its mask; equal costs: the earlier candidate. `None` when no candidate is accepted.
pub fn select_shares_by_cost(
    free_share: &[u32],
    count: u32,
    share: u32,
    mut cost: impl FnMut(u64) -> Option<i64>,
) -> Option<(i64, u64)> {
    let mut best: Option<(i64, u64)> = None;
    let mut consider = |pick: u64| {
        if let Some(c) = cost(pick) {
            if best.is_none_or(|(b, _)| c < b) {
                best = Some((c, pick));
            }
        }
    };
    if count == 1 && share < SHARE_CAPACITY {
        let mut seen = [0u32; MAX_PICK_DEVICES];
        let mut len = 0;
        for (i, &g) in free_share.iter().take(MAX_PICK_DEVICES).enumerate() {
            if g >= share && !seen[..len].contains(&g) {
                seen[len] = g;
                len += 1;
                consider(1 << i);
            }
        }
    } else if let Some(pick) =
        select_shares(free_share, count, share, DeviceSelection::MostUsedThatFits)
    {
        consider(pick);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(free_share: &[u32]) -> DeviceState {
        let devices = (0..free_share.len() as u32)
            .map(|index| Device {
                index,
                model: String::new(),
                memory_mib: 16_384,
            })
            .collect();
        DeviceState::with_free(devices, free_share.to_vec(), vec![16_384; free_share.len()])
            .unwrap()
    }

    fn mask(binding: &DeviceBinding) -> u64 {
        binding.devices.iter().fold(0, |m, d| m | 1 << d.index)
    }

    /// Every state of three devices with free shares from {0, 250, 500, 750, 1000}: the
    /// free-share form picks what `DeviceState::select` binds, for both policies, with and
    /// without a share fill.
    #[test]
    fn select_shares_is_select_on_free_shares() {
        let fill = ShareFill::from_sizes([250, 300]);
        let steps = [0, 250, 500, 750, 1000];
        let requests = [
            GpuDemand::Slice {
                share: 200,
                memory_mib: 0,
            },
            GpuDemand::Slice {
                share: 500,
                memory_mib: 0,
            },
            GpuDemand::Whole { count: 1 },
            GpuDemand::Whole { count: 2 },
        ];
        for a in steps {
            for b in steps {
                for c in steps {
                    let free = [a, b, c];
                    let state = state(&free);
                    for demand in &requests {
                        let (count, share) = match *demand {
                            GpuDemand::Whole { count } => (count, SHARE_CAPACITY),
                            GpuDemand::Slice { share, .. } => (1, share),
                        };
                        let request = DeviceRequest {
                            demand: demand.clone(),
                            models: vec![],
                        };
                        for policy in [
                            DeviceSelection::LeastUsed,
                            DeviceSelection::MostUsedThatFits,
                        ] {
                            assert_eq!(
                                select_shares(&free, count, share, policy),
                                state.select(&request, policy).as_ref().map(mask),
                                "{free:?} {demand:?} {policy}"
                            );
                            assert_eq!(
                                select_shares_filling(&free, count, share, policy, Some(&fill)),
                                state
                                    .select_filling(&request, policy, Some(&fill))
                                    .as_ref()
                                    .map(mask),
                                "{free:?} {demand:?} {policy} filled"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `select_shares` with `most-used-that-fits` is the simulator's former in-node best fit
    /// (sort fitting GPUs by (free, position), take the first `count`) wherever enough GPUs fit.
    #[test]
    fn pack_is_the_former_best_fit() {
        let steps = [0, 100, 300, 500, 1000];
        for a in steps {
            for b in steps {
                for c in steps {
                    for d in steps {
                        let free = [a, b, c, d];
                        for (count, share) in [
                            (1, 100),
                            (1, 300),
                            (1, 1000),
                            (2, 300),
                            (2, 1000),
                            (3, 1000),
                        ] {
                            let mut fitting: Vec<(u32, usize)> = free
                                .iter()
                                .enumerate()
                                .filter(|(_, &g)| g >= share)
                                .map(|(i, &g)| (g, i))
                                .collect();
                            fitting.sort_unstable();
                            let former = (fitting.len() >= count as usize).then(|| {
                                fitting[..count as usize]
                                    .iter()
                                    .fold(0u64, |m, &(_, i)| m | 1 << i)
                            });
                            assert_eq!(
                                select_shares(
                                    &free,
                                    count,
                                    share,
                                    DeviceSelection::MostUsedThatFits
                                ),
                                former,
                                "{free:?} {count} x {share}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn select_shares_by_hand() {
        let pack = DeviceSelection::MostUsedThatFits;
        let spread = DeviceSelection::LeastUsed;
        // Best fit: the least free GPU that holds the share, ties lowest position.
        assert_eq!(
            select_shares(&[700, 400, 100, 1000], 1, 350, pack),
            Some(0b0010)
        );
        assert_eq!(
            select_shares(&[700, 400, 100, 1000], 1, 500, pack),
            Some(0b0001)
        );
        assert_eq!(
            select_shares(&[700, 400, 100, 1000], 2, 400, pack),
            Some(0b0011)
        );
        assert_eq!(
            select_shares(&[700, 400, 100, 1000], 2, 400, spread),
            Some(0b1001)
        );
        assert_eq!(
            select_shares(&[1000, 400, 1000, 1000], 2, 1000, pack),
            Some(0b0101)
        );
        assert_eq!(select_shares(&[200], 1, 300, pack), None);
        assert_eq!(select_shares(&[200], 0, 0, pack), Some(0));
    }

    #[test]
    fn select_shares_by_cost_tries_each_distinct_free_share() {
        let mut seen = Vec::new();
        let best = select_shares_by_cost(&[600, 1000, 600, 300], 1, 500, |pick| {
            seen.push(pick);
            Some(if pick == 0b0010 { 1 } else { 5 })
        });
        // 600 at position 0 stands for position 2 too; 300 does not hold 500.
        assert_eq!(seen, [0b0001, 0b0010]);
        assert_eq!(best, Some((1, 0b0010)));
        // Equal costs: the earlier candidate; refused candidates are skipped.
        assert_eq!(
            select_shares_by_cost(&[600, 1000], 1, 500, |_| Some(0)),
            Some((0, 0b01))
        );
        assert_eq!(
            select_shares_by_cost(&[600, 1000], 1, 500, |p| (p == 0b10).then_some(3)),
            Some((3, 0b10))
        );
        // Whole GPUs: one candidate, the best fit.
        let mut seen = Vec::new();
        select_shares_by_cost(&[1000, 400, 1000], 2, 1000, |pick| {
            seen.push(pick);
            Some(0)
        });
        assert_eq!(seen, [0b101]);
        assert_eq!(select_shares_by_cost(&[1000], 2, 1000, |_| Some(0)), None);
    }
}
