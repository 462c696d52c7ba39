//! The master's per-device view of every agent's GPUs (SPEC seed 004).
//!
//! The scalar rings bucket agents by their free `gpu_milli` / `gpu_mem` sums, which keeps GPU
//! demands on the fast ring search; but a sum cannot tell two half-free GPUs from one free GPU.
//! This book keeps each agent's devices with what each has free, so the master can filter ("an
//! agent fits only if every class fits") and choose the exact devices of a task with the same
//! library function the agent uses ([`DeviceState::select`]), then send that binding in
//! `TaskInfo.devices` for the agent to check and apply. The fit test runs on the packed form
//! ([`PackedGpus`]) when the agent's devices fit one 128-bit word, on the plain form otherwise.
//!
//! Also here: how the openb GPU trace's nodes and tasks map onto these resources
//! ([`openb_node`], [`openb_task`]), so every user of the trace reads it the same way.

use std::collections::HashMap;

use crate::devices::{
    Device, DeviceBinding, DeviceError, DeviceRequest, DeviceSelection, DeviceState, GpuDemand,
    PackedGpus,
};
use crate::resources::Resources;

use super::AgentKey;

/// One agent's devices, with the packed copy kept in step.
#[derive(Clone, Debug)]
struct AgentDevices {
    state: DeviceState,
    packed: Option<PackedGpus>,
}

impl AgentDevices {
    fn new(state: DeviceState) -> Self {
        let packed = state.packed().ok();
        AgentDevices { state, packed }
    }

    fn refresh(&mut self) {
        self.packed = self.state.packed().ok();
    }

    fn fits(&self, request: &DeviceRequest) -> bool {
        match &self.packed {
            Some(packed) => packed.fits(request),
            None => self.state.fits(request),
        }
    }
}

/// A share's grade for a graded GPU ring: its quarter of a GPU (0–3), 4 for a whole GPU's
/// share (1000 milli). Nondecreasing in the share, so a device's free share graded below a
/// slice's cannot hold the slice. The master's device book and the simulator grade by it.
pub fn share_grade(share: u32) -> u8 {
    match share {
        1000.. => 4,
        share => (share / 250) as u8,
    }
}

/// Every agent's devices by agent key; agents without devices are absent.
#[derive(Clone, Debug, Default)]
pub struct DeviceBook {
    agents: HashMap<AgentKey, AgentDevices>,
}

impl DeviceBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an agent's devices, all free (an empty list forgets it).
    pub fn set_agent(&mut self, agent: AgentKey, devices: Vec<Device>) -> Result<(), DeviceError> {
        if devices.is_empty() {
            self.agents.remove(&agent);
            return Ok(());
        }
        let state = DeviceState::new(devices)?;
        self.agents.insert(agent, AgentDevices::new(state));
        Ok(())
    }

    pub fn remove_agent(&mut self, agent: AgentKey) {
        self.agents.remove(&agent);
    }

    /// The agents with devices, in no particular order.
    pub fn agents(&self) -> impl Iterator<Item = AgentKey> + '_ {
        self.agents.keys().copied()
    }

    /// The agent's devices and what each has free.
    pub fn state(&self, agent: AgentKey) -> Option<&DeviceState> {
        self.agents.get(&agent).map(|a| &a.state)
    }

    /// The agent's grade in the graded `gpu_milli` ring ([`Cluster::set_grade`]): the quarter of
    /// a GPU share its emptiest device has free, 4 with a device entirely free; ungraded (every
    /// walk sees it) without devices. An agent that fits a slice is graded at least as high as
    /// the slice ([`DeviceBook::demand_grade`]): the slice needs that much share on one device.
    ///
    /// [`Cluster::set_grade`]: super::Cluster::set_grade
    pub fn grade(&self, agent: AgentKey) -> u8 {
        self.agents
            .get(&agent)
            .map_or(super::ring_set::UNGRADED, |a| {
                share_grade(a.state.free_share().iter().copied().max().unwrap_or(0))
            })
    }

    /// The grade an agent needs to take `demand` ([`grade`](DeviceBook::grade)): a slice's
    /// share by quarters of a GPU (4 for a whole one); 0, every agent, for whole GPUs, a slice
    /// of memory only and demands without GPU scalars.
    pub fn demand_grade(demand: &Resources) -> u8 {
        match DeviceRequest::from_scalars(demand, Vec::new()) {
            Ok(Some(DeviceRequest {
                demand: GpuDemand::Slice { share, .. },
                ..
            })) => share_grade(share),
            _ => 0,
        }
    }

    /// The device side of "does this demand fit this agent": true for a demand without GPU
    /// scalars, false for a GPU demand on an agent without devices or an ambiguous one.
    /// Demands carry no model list, so models are checked at accept time only.
    pub fn fits(&self, agent: AgentKey, demand: &Resources) -> bool {
        match DeviceRequest::from_scalars(demand, Vec::new()) {
            Ok(None) => true,
            Ok(Some(request)) => self.fits_request(agent, &request),
            Err(_) => false,
        }
    }

    /// On an agent without devices only whole GPUs fit: there `gpus` is a plain scalar, which
    /// the scalar check decides.
    pub fn fits_request(&self, agent: AgentKey, request: &DeviceRequest) -> bool {
        match self.agents.get(&agent) {
            Some(a) => a.fits(request),
            None => matches!(request.demand, GpuDemand::Whole { .. }),
        }
    }

    /// [`fits`](DeviceBook::fits) as it would be once `released` (bindings of tasks on the
    /// agent, e.g. preemption victims) were given back; the book itself is not changed.
    pub fn fits_after_release<'b>(
        &self,
        agent: AgentKey,
        demand: &Resources,
        released: impl IntoIterator<Item = &'b DeviceBinding>,
    ) -> bool {
        let request = match DeviceRequest::from_scalars(demand, Vec::new()) {
            Ok(None) => return true,
            Ok(Some(request)) => request,
            Err(_) => return false,
        };
        let Some(entry) = self.agents.get(&agent) else {
            return matches!(request.demand, GpuDemand::Whole { .. });
        };
        let mut released = released.into_iter().filter(|b| !b.is_empty()).peekable();
        if released.peek().is_none() {
            return entry.fits(&request);
        }
        let mut state = entry.state.clone();
        for binding in released {
            state.release(binding);
        }
        state.fits(&request)
    }

    /// How many copies of `demand` the agent's devices hold now, at most `limit`: `limit` for a
    /// demand without GPU scalars or whole GPUs on an agent without devices (the scalars
    /// decide), 0 for an ambiguous demand or a slice on an agent without devices. An offer of
    /// the agent covers no more copies of a GPU demand than this, whatever its summed scalars
    /// say.
    pub fn copies_of(&self, agent: AgentKey, demand: &Resources, limit: u64) -> u64 {
        let request = match DeviceRequest::from_scalars(demand, Vec::new()) {
            Ok(None) => return limit,
            Ok(Some(request)) => request,
            Err(_) => return 0,
        };
        match self.agents.get(&agent) {
            Some(entry) => {
                let limit32 = u32::try_from(limit).unwrap_or(u32::MAX);
                u64::from(entry.state.copies_of(&request, limit32))
            }
            None if matches!(request.demand, GpuDemand::Whole { .. }) => limit,
            None => 0,
        }
    }

    /// Chooses devices for `request` by `policy` and takes them; `None` when nothing fits.
    pub fn bind(
        &mut self,
        agent: AgentKey,
        request: &DeviceRequest,
        policy: DeviceSelection,
    ) -> Option<DeviceBinding> {
        let entry = self.agents.get_mut(&agent)?;
        let binding = entry.state.select(request, policy)?;
        entry.state.bind(&binding).ok()?;
        entry.refresh();
        Some(binding)
    }

    /// Takes a known binding again (an agent re-registering with running tasks).
    pub fn take(&mut self, agent: AgentKey, binding: &DeviceBinding) -> Result<(), DeviceError> {
        if binding.is_empty() {
            return Ok(());
        }
        let entry = self
            .agents
            .get_mut(&agent)
            .ok_or_else(|| DeviceError::Binding(format!("agent {agent} has no devices")))?;
        entry.state.bind(binding)?;
        entry.refresh();
        Ok(())
    }

    /// Gives a task's devices back.
    pub fn release(&mut self, agent: AgentKey, binding: &DeviceBinding) {
        if let Some(entry) = self.agents.get_mut(&agent) {
            entry.state.release(binding);
            entry.refresh();
        }
    }
}

// ------------------------------------------------------------------ openb trace mapping

/// The memory of a GPU model of the openb trace, MiB, when its name says it (`V100M16` → 16 GiB,
/// `V100M32` → 32 GiB); 0 (unknown) otherwise, as the trace has no GPU memory column.
pub fn openb_model_memory_mib(model: &str) -> u64 {
    match model.rsplit_once('M') {
        Some((_, gib)) if !gib.is_empty() && gib.bytes().all(|b| b.is_ascii_digit()) => {
            gib.parse::<u64>().map(|g| g * 1024).unwrap_or(0)
        }
        _ => 0,
    }
}

/// One openb node (`cpu_milli,memory_mib,gpu,model`) as agent resources: `cpus` in
/// thousandths exactly as `cpu_milli`, `mem` = `memory_mib`, and `gpu` devices of `model`
/// (indices 0..gpu) with their `gpu_milli` / `gpu_mem` sums.
pub fn openb_node(
    cpu_milli: u64,
    memory_mib: u64,
    gpu: u32,
    model: &str,
) -> Result<(Resources, Vec<Device>), DeviceError> {
    let mut resources = Resources::from_milli([
        ("cpus", cpu_milli),
        (
            "mem",
            memory_mib
                .checked_mul(1000)
                .ok_or_else(|| DeviceError::Syntax {
                    part: format!("memory_mib {memory_mib}"),
                    why: "too large".into(),
                })?,
        ),
    ])?;
    let memory = openb_model_memory_mib(model);
    let devices: Vec<Device> = (0..gpu)
        .map(|index| Device {
            index,
            model: model.to_string(),
            memory_mib: memory,
        })
        .collect();
    let state = DeviceState::new(devices.clone())?;
    if !devices.is_empty() {
        resources = resources.checked_add(&state.free_scalars())?;
    }
    Ok((resources, devices))
}

/// One openb task (`cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec`) as task resources and a
/// device request: `num_gpu` 1 with `gpu_milli` below 1000 is a slice of one GPU, `num_gpu` N
/// with `gpu_milli` 1000 is N whole GPUs, `gpu_spec` (`A|B`) the allowed models. Any other
/// combination is refused (none occurs in the trace).
pub fn openb_task(
    cpu_milli: u64,
    memory_mib: u64,
    num_gpu: u32,
    gpu_milli: u32,
    gpu_spec: &str,
) -> Result<(Resources, Option<DeviceRequest>), DeviceError> {
    let mut resources = Resources::from_milli([
        ("cpus", cpu_milli),
        ("mem", memory_mib.saturating_mul(1000)),
    ])?;
    let models: Vec<String> = gpu_spec
        .split('|')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    let demand = match (num_gpu, gpu_milli) {
        (0, 0) => None,
        (1, share) if share > 0 && share < 1000 => Some(GpuDemand::Slice {
            share,
            memory_mib: 0,
        }),
        (count, 1000) if count > 0 => Some(GpuDemand::Whole { count }),
        (n, m) => {
            return Err(DeviceError::Ambiguous(format!(
                "openb task with num_gpu {n} and gpu_milli {m}"
            )))
        }
    };
    let request = match demand {
        Some(demand) => Some(DeviceRequest { demand, models }),
        None if models.is_empty() => None,
        None => {
            return Err(DeviceError::Ambiguous(format!(
                "openb task without GPU but with gpu_spec `{gpu_spec}`"
            )))
        }
    };
    if let Some(request) = &request {
        resources = resources.checked_add(&request.scalars())?;
    }
    Ok((resources, request))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::parse_agent_resources;

    #[test]
    fn filters_by_device_and_binds_like_the_agent() {
        let (_, devices) = parse_agent_resources("gpus:2x16384").unwrap();
        let mut book = DeviceBook::new();
        book.set_agent(7, devices).unwrap();
        let half = Resources::parse("cpus:1;gpu_milli:500").unwrap();
        let six = Resources::parse("gpu_milli:600").unwrap();
        assert!(book.fits(7, &half));
        assert!(!book.fits(8, &half), "no devices: no GPU slice fits");
        assert!(
            book.fits(8, &Resources::parse("gpus:2").unwrap()),
            "plain scalar gpus"
        );
        assert!(book.fits(8, &Resources::parse("cpus:1").unwrap()));
        let request = DeviceRequest::from_scalars(&half, vec![]).unwrap().unwrap();
        let pack = DeviceSelection::MostUsedThatFits;
        let got: Vec<String> = (0..4)
            .map(|_| {
                book.bind(7, &request, pack)
                    .map(|b| b.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            got,
            ["gpu:0:500:0", "gpu:0:500:0", "gpu:1:500:0", "gpu:1:500:0"]
        );
        assert!(!book.fits(7, &half));
        book.release(7, &DeviceBinding::parse("gpu:1:500:0").unwrap());
        assert!(book.fits(7, &half) && !book.fits(7, &six));
        book.take(7, &DeviceBinding::parse("gpu:1:500:0").unwrap())
            .unwrap();
        assert!(book
            .take(7, &DeviceBinding::parse("gpu:1:1:0").unwrap())
            .is_err());
        assert!(!book.fits(7, &Resources::parse("gpu_milli:1500").unwrap()));
        assert!(
            !book.fits(7, &Resources::parse("gpus:1").unwrap()),
            "both devices are used"
        );
        book.release(7, &DeviceBinding::parse("gpu:1:500:0,gpu:0:500:0").unwrap());
        book.release(7, &DeviceBinding::parse("gpu:0:500:0").unwrap());
        assert!(book.fits(7, &Resources::parse("gpus:1").unwrap()));
    }
}
