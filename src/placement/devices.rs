//! The master's per-device view of every agent's GPUs (SPEC seed 004).
//!
//! The scalar rings bucket agents by their free `gpu_milli` / `gpu_mem` sums, which keeps GPU
//! demands on the fast ring search; but a sum cannot tell two half-free GPUs from one free GPU.
//! This book keeps each agent's devices with what each has free, so the master can filter ("an
//! agent fits only if every class fits") and choose the exact devices of a task with the same
//! library function the agent uses ([`DeviceState::select`]), then send that binding in
//! `TaskInfo.devices` for the agent to check and apply. The fit test runs on the packed form
//! ([`PackedGpus`]) when the agent's devices fit one 128-bit word, on the plain form otherwise.

use std::collections::HashMap;

use ringmaster_proto::devices::{
    Device, DeviceBinding, DeviceError, DeviceRequest, DeviceSelection, DeviceState, PackedGpus,
};
use ringmaster_proto::resources::Resources;

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

    /// The agent's devices and what each has free.
    pub fn state(&self, agent: AgentKey) -> Option<&DeviceState> {
        self.agents.get(&agent).map(|a| &a.state)
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

    pub fn fits_request(&self, agent: AgentKey, request: &DeviceRequest) -> bool {
        self.agents.get(&agent).is_some_and(|a| a.fits(request))
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::devices::parse_agent_resources;

    #[test]
    fn filters_by_device_and_binds_like_the_agent() {
        let (_, devices) = parse_agent_resources("gpus:2x16384").unwrap();
        let mut book = DeviceBook::new();
        book.set_agent(7, devices).unwrap();
        let half = Resources::parse("cpus:1;gpu_milli:500").unwrap();
        let six = Resources::parse("gpu_milli:600").unwrap();
        assert!(book.fits(7, &half));
        assert!(
            !book.fits(8, &half),
            "an agent without devices fits no GPU demand"
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
    }
}
