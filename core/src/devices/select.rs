//! Which devices a task gets on the chosen agent: the one GPU-in-node choice, used by the
//! master, the simulator and the agent's re-check alike.

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
                let key = |&i: &usize| (self.free_share[i], self.free_memory[i]);
                let best = match policy {
                    DeviceSelection::LeastUsed => fitting.iter().copied().min_by(|a, b| {
                        key(b)
                            .cmp(&key(a))
                            .then(self.devices[*a].index.cmp(&self.devices[*b].index))
                    }),
                    DeviceSelection::MostUsedThatFits => fitting.iter().copied().min_by(|a, b| {
                        key(a)
                            .cmp(&key(b))
                            .then(self.devices[*a].index.cmp(&self.devices[*b].index))
                    }),
                }?;
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
