//! The packed encoding of SPEC seed 004: `b` bits per device in one integer, and a fit test
//! over all lanes at once.

use super::*;

/// The seed's packed layout: `lanes` values of `bits` bits each in one word of `word_bits`
/// (64 or 128) bits; lane i holds bits `[i·b, (i+1)·b)`, so the word is `Σ vᵢ << (i·b)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaneLayout {
    bits: u32,
    lanes: u32,
    word_bits: u32,
}

impl LaneLayout {
    /// Refuses a layout whose lanes do not fit the word (`lanes·bits > word_bits`), a word other
    /// than 64 or 128 bits, and lanes of 0 or more than 63 bits (the fit test needs a spare bit
    /// per pair of lanes, see [`PackedLanes::count_at_least`]).
    pub fn new(bits: u32, lanes: u32, word_bits: u32) -> Result<Self, DeviceError> {
        if word_bits != 64 && word_bits != 128 {
            return Err(DeviceError::Layout(format!(
                "a word is 64 or 128 bits, not {word_bits}"
            )));
        }
        if bits == 0 || bits > 63 {
            return Err(DeviceError::Layout(format!(
                "{bits} bits per lane: between 1 and 63"
            )));
        }
        if u64::from(bits) * u64::from(lanes) > u64::from(word_bits) {
            return Err(DeviceError::Layout(format!(
                "{lanes} lanes of {bits} bits need {} bits, more than the {word_bits}-bit word",
                u64::from(bits) * u64::from(lanes)
            )));
        }
        Ok(LaneLayout {
            bits,
            lanes,
            word_bits,
        })
    }

    /// The smallest layout for `lanes` values up to `max` in a 128-bit word (refused when it
    /// does not fit).
    pub fn for_values(lanes: usize, max: u64) -> Result<Self, DeviceError> {
        let bits = (64 - max.leading_zeros()).max(1);
        let lanes = u32::try_from(lanes)
            .map_err(|_| DeviceError::Layout(format!("{lanes} lanes do not fit")))?;
        LaneLayout::new(bits, lanes, 128)
    }

    pub fn bits(&self) -> u32 {
        self.bits
    }

    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    fn lane_mask(&self) -> u128 {
        (1u128 << self.bits) - 1
    }

    /// A word with `value` in every lane of the given parity (0 = even lanes, 1 = odd), shifted
    /// so that the lanes of that parity sit at even positions.
    fn broadcast_pairs(&self, value: u64, parity: u32) -> u128 {
        let mut word = 0u128;
        let mut i = parity;
        while i < self.lanes {
            word |= u128::from(value) << ((i - parity) * self.bits);
            i += 2;
        }
        word
    }
}

/// Values packed as the seed says: one integer, `b` bits per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PackedLanes {
    word: u128,
    layout: LaneLayout,
    /// Even lanes (0, 2, …) at their places, as a mask; built once.
    even: u128,
    /// Bit `b` of every even lane: the guard that catches a lane's borrow.
    guards: u128,
    /// The same for the odd lanes once shifted down by one lane (no phantom last lane).
    guards_odd: u128,
    /// 1 in every even lane, and in every odd lane shifted down: `need · ones` broadcasts a need.
    ones_even: u128,
    ones_odd: u128,
}

impl PackedLanes {
    /// `Σ vᵢ << (i·b)`; refuses more values than lanes and any value needing more than `b` bits.
    pub fn encode(layout: LaneLayout, values: &[u64]) -> Result<Self, DeviceError> {
        if values.len() > layout.lanes as usize {
            return Err(DeviceError::Layout(format!(
                "{} values for {} lanes",
                values.len(),
                layout.lanes
            )));
        }
        let mut word = 0u128;
        for (lane, &value) in values.iter().enumerate() {
            if u128::from(value) > layout.lane_mask() {
                return Err(DeviceError::ValueTooWide {
                    lane,
                    value,
                    bits: layout.bits,
                });
            }
            word |= u128::from(value) << (lane as u32 * layout.bits);
        }
        let even = layout.broadcast_pairs(layout.lane_mask() as u64, 0);
        // A guard is bit `i·b + b`: below 128 because `lanes·b ≤ 128` and `b ≤ 63` keeps it
        // in u64 for `broadcast_pairs`.
        let guards = layout.broadcast_pairs(1u64 << layout.bits, 0);
        let guards_odd = layout.broadcast_pairs(1u64 << layout.bits, 1);
        Ok(PackedLanes {
            word,
            layout,
            even,
            guards,
            guards_odd,
            ones_even: layout.broadcast_pairs(1, 0),
            ones_odd: layout.broadcast_pairs(1, 1),
        })
    }

    pub fn word(&self) -> u128 {
        self.word
    }

    pub fn layout(&self) -> LaneLayout {
        self.layout
    }

    /// Lane i: `(K >> (i·b)) & (2^b − 1)`.
    pub fn get(&self, lane: usize) -> u64 {
        ((self.word >> (lane as u32 * self.layout.bits)) & self.layout.lane_mask()) as u64
    }

    /// Every lane's value.
    pub fn decode(&self) -> Vec<u64> {
        (0..self.layout.lanes as usize)
            .map(|i| self.get(i))
            .collect()
    }

    /// Guard bits of the lanes `≥ need`, for even lanes and odd lanes (odd lanes shifted down by
    /// one lane). Each lane of a parity sits in a window of 2·b bits whose upper half is empty;
    /// setting the window's bit b and subtracting `need` leaves bit b set exactly when
    /// `value ≥ need`, and since `2^b + value − need > 0` no borrow leaves the window. Two
    /// subtractions test every lane at once.
    fn ge_guards(&self, need_even: u128, need_odd: u128) -> (u128, u128) {
        let b = self.layout.bits;
        let even = self.word & self.even;
        let odd = (self.word >> b) & self.even;
        let ge_even = ((even | self.guards) - need_even) & self.guards;
        let ge_odd = ((odd | self.guards_odd) - need_odd) & self.guards_odd;
        (ge_even, ge_odd)
    }

    /// How many lanes hold at least `need`.
    pub fn count_at_least(&self, need: u64) -> u32 {
        if u128::from(need) > self.layout.lane_mask() {
            return 0;
        }
        // need < 2^b and lanes of a parity are 2b apart: the product carries nothing across.
        let need = u128::from(need);
        let (e, o) = self.ge_guards(need * self.ones_even, need * self.ones_odd);
        e.count_ones() + o.count_ones()
    }

    /// Lanes holding at least `need`, one bit per lane (bit i = lane i).
    pub fn lanes_at_least(&self, need: u64) -> u128 {
        if u128::from(need) > self.layout.lane_mask() {
            return 0;
        }
        let need = u128::from(need);
        let (e, o) = self.ge_guards(need * self.ones_even, need * self.ones_odd);
        self.guards_to_lanes(e, o)
    }

    /// Visits the lanes holding at least `need` (even lanes first) until `visit` says stop;
    /// returns how many lanes `visit` accepted. Only fitting lanes are visited, so a check of a
    /// second quantity per candidate costs as many lookups as there are candidates.
    pub fn count_lanes_at_least_where(
        &self,
        need: u64,
        stop_at: u32,
        mut accept: impl FnMut(usize) -> bool,
    ) -> u32 {
        if u128::from(need) > self.layout.lane_mask() || stop_at == 0 {
            return 0;
        }
        let b = self.layout.bits;
        let need = u128::from(need);
        let (even, odd) = self.ge_guards(need * self.ones_even, need * self.ones_odd);
        let mut accepted = 0;
        for (mut guards, first) in [(even, 0usize), (odd, 1usize)] {
            while guards != 0 {
                let lane = ((guards.trailing_zeros() - b) / b) as usize + first;
                if accept(lane) {
                    accepted += 1;
                    if accepted == stop_at {
                        return accepted;
                    }
                }
                guards &= guards - 1;
            }
        }
        accepted
    }

    /// Lanes whose value is at least the same lane of `other` (same layout), bit i = lane i.
    pub fn lanes_at_least_each(&self, other: &PackedLanes) -> u128 {
        let b = self.layout.bits;
        let (e, o) = self.ge_guards(other.word & self.even, (other.word >> b) & self.even);
        self.guards_to_lanes(e, o)
    }

    /// Compacts guard bits (at bit `(2j)·b + b` of each parity word) into one bit per lane.
    fn guards_to_lanes(&self, mut even: u128, mut odd: u128) -> u128 {
        let b = self.layout.bits;
        let mut lanes = 0u128;
        while even != 0 {
            let bit = even.trailing_zeros();
            lanes |= 1u128 << ((bit - b) / b);
            even &= even - 1;
        }
        while odd != 0 {
            let bit = odd.trailing_zeros();
            lanes |= 1u128 << ((bit - b) / b + 1);
            odd &= odd - 1;
        }
        lanes
    }
}

/// One agent's GPU free state in packed form: free shares (10-bit lanes), free memory and
/// memory capacity (lanes as wide as the largest device needs), and a device mask per model.
/// Built when the layout fits a 128-bit word (up to 12 devices by share; memory lanes of 17
/// bits, enough for 80 GiB devices, fit 7); [`DeviceState::packed`] says why otherwise, and
/// callers then use the plain test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedGpus {
    share: PackedLanes,
    memory: PackedLanes,
    capacity: PackedLanes,
    all: u128,
    models: Vec<(String, u128)>,
}

impl PackedGpus {
    pub fn new(state: &DeviceState) -> Result<Self, DeviceError> {
        let n = state.devices.len();
        let share_layout = LaneLayout::for_values(n, u64::from(SHARE_CAPACITY))?;
        let max_mem = state
            .devices
            .iter()
            .map(|d| d.memory_mib)
            .max()
            .unwrap_or(0);
        let mem_layout = LaneLayout::for_values(n, max_mem)?;
        let shares: Vec<u64> = state.free_share.iter().map(|&s| u64::from(s)).collect();
        let caps: Vec<u64> = state.devices.iter().map(|d| d.memory_mib).collect();
        let mut models: Vec<(String, u128)> = Vec::new();
        for (i, d) in state.devices.iter().enumerate() {
            match models.iter_mut().find(|(m, _)| *m == d.model) {
                Some((_, mask)) => *mask |= 1 << i,
                None => models.push((d.model.clone(), 1 << i)),
            }
        }
        Ok(PackedGpus {
            share: PackedLanes::encode(share_layout, &shares)?,
            memory: PackedLanes::encode(mem_layout, &state.free_memory)?,
            capacity: PackedLanes::encode(mem_layout, &caps)?,
            all: if n == 128 {
                u128::MAX
            } else {
                (1u128 << n) - 1
            },
            models,
        })
    }

    fn model_mask(&self, request: &DeviceRequest) -> u128 {
        if request.models.is_empty() {
            return self.all;
        }
        self.models
            .iter()
            .filter(|(m, _)| request.models.contains(m))
            .fold(0, |acc, (_, mask)| acc | mask)
    }

    /// The packed fit test; always agrees with [`DeviceState::fits`]. The common requests (a
    /// share, whole devices) are popcounts over all lanes at once; a second condition (memory,
    /// model) is checked only on the lanes that passed the share test.
    pub fn fits(&self, request: &DeviceRequest) -> bool {
        let need = request.device_count();
        match request.demand {
            GpuDemand::Whole { .. } => {
                let full = u64::from(SHARE_CAPACITY);
                if self.share.count_at_least(full) < need {
                    return false;
                }
                let memory_full =
                    self.memory.lanes_at_least_each(&self.capacity) & self.model_mask(request);
                self.share
                    .count_lanes_at_least_where(full, need, |i| memory_full >> i & 1 == 1)
                    >= need
            }
            GpuDemand::Slice { share, memory_mib } => {
                if memory_mib == 0 && request.models.is_empty() {
                    return self.share.count_at_least(u64::from(share)) >= 1;
                }
                let models = self.model_mask(request);
                self.share
                    .count_lanes_at_least_where(u64::from(share), 1, |i| {
                        models >> i & 1 == 1 && self.memory.get(i) >= memory_mib
                    })
                    >= 1
            }
        }
    }
}
