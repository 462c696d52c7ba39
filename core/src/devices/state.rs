//! One agent's devices and what each has free; binding and releasing shares.

use super::*;
use crate::resources::{Resources, MILLI};

/// One agent's devices of the GPU class and what each has free: the plain (`Vec`) form, the
/// reference for the packed one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceState {
    pub(super) devices: Vec<Device>,
    pub(super) free_share: Vec<u32>,
    pub(super) free_memory: Vec<u64>,
}

impl DeviceState {
    /// All devices free. Indices must be distinct.
    pub fn new(devices: Vec<Device>) -> Result<Self, DeviceError> {
        if devices.len() > MAX_DEVICES {
            return Err(DeviceError::Layout(format!(
                "{} devices: at most {MAX_DEVICES}",
                devices.len()
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.index == d.index) {
                return Err(DeviceError::Syntax {
                    part: format!("device {}", d.index),
                    why: "the index appears twice".into(),
                });
            }
        }
        Ok(DeviceState {
            free_share: vec![SHARE_CAPACITY; devices.len()],
            free_memory: devices.iter().map(|d| d.memory_mib).collect(),
            devices,
        })
    }

    /// A state with given free amounts (for tests and the master's copy of an agent).
    pub fn with_free(
        devices: Vec<Device>,
        free_share: Vec<u32>,
        free_memory: Vec<u64>,
    ) -> Result<Self, DeviceError> {
        let mut state = DeviceState::new(devices)?;
        if free_share.len() != state.devices.len() || free_memory.len() != state.devices.len() {
            return Err(DeviceError::Layout("one free amount per device".into()));
        }
        for (i, d) in state.devices.iter().enumerate() {
            if free_share[i] > SHARE_CAPACITY || free_memory[i] > d.memory_mib {
                return Err(DeviceError::Layout(format!(
                    "device {}: free above its capacity",
                    d.index
                )));
            }
        }
        state.free_share = free_share;
        state.free_memory = free_memory;
        Ok(state)
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    pub fn free_share(&self) -> &[u32] {
        &self.free_share
    }

    pub fn free_memory(&self) -> &[u64] {
        &self.free_memory
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The aggregate free scalars: [`GPUS`] (entirely free devices), [`GPU_MILLI`], [`GPU_MEM`].
    pub fn free_scalars(&self) -> Resources {
        let mut out = Resources::new();
        let whole = (0..self.devices.len())
            .filter(|&i| {
                self.free_share[i] == SHARE_CAPACITY
                    && self.free_memory[i] == self.devices[i].memory_mib
            })
            .count() as u64;
        out.set_milli(GPUS, whole * MILLI);
        let share: u64 = self.free_share.iter().map(|&s| u64::from(s)).sum();
        let mem: u64 = self.free_memory.iter().sum();
        out.set_milli(GPU_MILLI, share * MILLI);
        out.set_milli(GPU_MEM, mem.saturating_mul(MILLI));
        out
    }

    fn position(&self, index: u32) -> Option<usize> {
        self.devices.iter().position(|d| d.index == index)
    }

    /// Takes a binding's shares and memory, checking every device first (all or nothing).
    pub fn bind(&mut self, binding: &DeviceBinding) -> Result<(), DeviceError> {
        let mut positions = Vec::with_capacity(binding.devices.len());
        for b in &binding.devices {
            let i = self.position(b.index).ok_or_else(|| {
                DeviceError::Binding(format!("no {GPU_CLASS} with index {}", b.index))
            })?;
            if positions.contains(&i) {
                return Err(DeviceError::Binding(format!(
                    "{GPU_CLASS} {} appears twice",
                    b.index
                )));
            }
            if self.free_share[i] < b.share || self.free_memory[i] < b.memory_mib {
                return Err(DeviceError::Binding(format!(
                    "{GPU_CLASS} {} has {} milli-GPU and {} MiB free, the binding needs {} and {}",
                    b.index, self.free_share[i], self.free_memory[i], b.share, b.memory_mib
                )));
            }
            positions.push(i);
        }
        for (b, &i) in binding.devices.iter().zip(&positions) {
            self.free_share[i] -= b.share;
            self.free_memory[i] -= b.memory_mib;
        }
        Ok(())
    }

    /// Gives a binding back (clamped at each device's capacity).
    pub fn release(&mut self, binding: &DeviceBinding) {
        for b in &binding.devices {
            if let Some(i) = self.position(b.index) {
                self.free_share[i] = (self.free_share[i] + b.share).min(SHARE_CAPACITY);
                self.free_memory[i] =
                    (self.free_memory[i] + b.memory_mib).min(self.devices[i].memory_mib);
            }
        }
    }

    /// Whether `binding` is a valid answer to `request` on these devices as they are now.
    pub fn check_binding(
        &self,
        request: &DeviceRequest,
        binding: &DeviceBinding,
    ) -> Result<(), DeviceError> {
        if binding.devices.len() != request.device_count() as usize {
            return Err(DeviceError::Binding(format!(
                "{} devices bound, the request needs {}",
                binding.devices.len(),
                request.device_count()
            )));
        }
        for b in &binding.devices {
            let i = self.position(b.index).ok_or_else(|| {
                DeviceError::Binding(format!("no {GPU_CLASS} with index {}", b.index))
            })?;
            if !self.device_fits(i, request) {
                return Err(DeviceError::Binding(format!(
                    "{GPU_CLASS} {} cannot hold the request (model `{}`, {} milli-GPU and {} MiB free)",
                    b.index, self.devices[i].model, self.free_share[i], self.free_memory[i]
                )));
            }
            let expected = match request.demand {
                GpuDemand::Whole { .. } => (SHARE_CAPACITY, self.devices[i].memory_mib),
                GpuDemand::Slice { share, memory_mib } => (share, memory_mib),
            };
            if (b.share, b.memory_mib) != expected {
                return Err(DeviceError::Binding(format!(
                    "{GPU_CLASS} {}: bound {} milli-GPU and {} MiB, the request is {} and {}",
                    b.index, b.share, b.memory_mib, expected.0, expected.1
                )));
            }
        }
        Ok(())
    }

    /// The packed form of the free amounts, or why it does not fit the word.
    pub fn packed(&self) -> Result<PackedGpus, DeviceError> {
        PackedGpus::new(self)
    }
}
