//! Fine-grained devices (SPEC seed 004): GPUs shared by milli-share or by memory.
//!
//! Scalars (`cpus`, `mem`) say how much of a machine is free; a GPU demand also needs to know
//! *which* device has room, because two half-free GPUs cannot run a task that needs 0.6 of one.
//! So a device class is two-level: a list of devices, each with its own free share (0–1000
//! milli-GPU) and free memory (MiB). This module is the one model every component uses — the
//! agent to account and bind, the master and the placement library to filter and select — and
//! is pure: no I/O, no clock.
//!
//! Pieces:
//! - [`Device`], [`DeviceState`]: the devices of one agent and what each has free;
//! - [`DeviceRequest`]: what one task asks for (`gpus:2` whole, `gpu_milli:500` a share of one
//!   GPU, `gpu_mem:8192` memory on one GPU, `gpu_model:V100M16|V100M32`), parsed from the
//!   extended text syntax by [`parse_task_resources`] and [`parse_agent_resources`];
//! - [`LaneLayout`], [`PackedLanes`]: the packed encoding of the seed (`b` bits per device in one
//!   integer) and a fit test over all lanes at once; [`PackedGpus`] joins them for one agent;
//! - [`DeviceState::select`]: which devices a task gets, `least-used` (spread) or
//!   `most-used-that-fits` (pack), and [`DeviceBinding`], the exact answer sent to the task.
//!
//! The scalar side of a device demand is kept as aggregate dimensions so rings, DRF, quotas and
//! offers keep working unchanged: [`GPUS`] (entirely free devices; whole-device tasks ask it, as
//! a plain `gpus` scalar always did), [`GPU_MILLI`] (sum of shares) and [`GPU_MEM`] (sum of
//! memory). They are necessary, not sufficient: the per-device fit here is the exact test. On an
//! agent without a device list, `gpus` stays the plain scalar it was before this module.

use std::fmt;
use std::str::FromStr;

use crate::resources::{format_milli, ResourceError, Resources, MILLI};

/// The only device class so far.
pub const GPU_CLASS: &str = "gpu";
/// Milli-shares of one whole device.
pub const SHARE_CAPACITY: u32 = 1000;
/// Aggregate scalar: the sum of free (agent) or requested (task) milli-GPU shares.
pub const GPU_MILLI: &str = "gpu_milli";
/// Aggregate scalar: the sum of free (agent) or requested (task) GPU memory, MiB.
pub const GPU_MEM: &str = "gpu_mem";
/// Task text: whole GPUs.
pub const GPUS: &str = "gpus";
/// Task text: allowed models, `|`-separated.
pub const GPU_MODEL: &str = "gpu_model";

/// One physical device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// The index the runtime knows it by (`CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// Model name, e.g. `V100M16`; empty when unknown.
    pub model: String,
    /// Device memory, MiB (0 when unknown: then no memory request fits it).
    pub memory_mib: u64,
}

/// Why device text, a request, a binding or a packed layout was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Resources(#[from] ResourceError),
    #[error("`{part}`: {why}")]
    Syntax { part: String, why: String },
    #[error("ambiguous device request: {0}")]
    Ambiguous(String),
    #[error("packed layout: {0}")]
    Layout(String),
    #[error("value {value} of lane {lane} needs more than {bits} bits")]
    ValueTooWide { lane: usize, value: u64, bits: u32 },
    #[error("device binding: {0}")]
    Binding(String),
}

// ------------------------------------------------------------------ requests

/// How much GPU a task needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// `count` whole devices (all of their share and memory).
    Whole { count: u32 },
    /// Part of one device: `share` milli-GPU (0–1000) and `memory_mib` of its memory, at least
    /// one of them non-zero.
    Slice { share: u32, memory_mib: u64 },
}

/// A task's device request: an amount and, optionally, the models it may run on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRequest {
    pub demand: GpuDemand,
    /// Allowed models; empty = any.
    pub models: Vec<String>,
}

impl DeviceRequest {
    /// The request a task's scalars make, with its model list: `gpus:N` is N whole devices,
    /// `gpu_milli:S` (1–1000) and/or `gpu_mem:M` a slice of one device. `None` without any of
    /// them. Refused as ambiguous: `gpus` with `gpu_milli` / `gpu_mem`, a fractional `gpus`,
    /// `gpu_milli` above 1000 (a share is of one device), fractional `gpu_milli` / `gpu_mem`,
    /// models without an amount.
    pub fn from_scalars(
        scalars: &Resources,
        models: Vec<String>,
    ) -> Result<Option<DeviceRequest>, DeviceError> {
        let whole = scalars.milli(GPUS);
        let milli = scalars.milli(GPU_MILLI);
        let mem = scalars.milli(GPU_MEM);
        if whole == 0 && milli == 0 && mem == 0 {
            if !models.is_empty() {
                return Err(DeviceError::Ambiguous(format!(
                    "`{GPU_MODEL}` without any GPU amount (add `gpus`, `gpu_milli` or `gpu_mem`)"
                )));
            }
            return Ok(None);
        }
        if whole > 0 && (milli > 0 || mem > 0) {
            return Err(DeviceError::Ambiguous(
                "`gpus` (whole devices) with `gpu_milli` or `gpu_mem` (part of one device): ask \
                 either whole GPUs or a slice of one"
                    .into(),
            ));
        }
        if whole % MILLI != 0 {
            return Err(DeviceError::Ambiguous(format!(
                "`gpus:{}` is not a whole number of devices; ask a share of one device with \
                 `gpu_milli` (e.g. `gpu_milli:500`)",
                format_milli(whole)
            )));
        }
        if milli % MILLI != 0 || mem % MILLI != 0 {
            return Err(DeviceError::Ambiguous(format!(
                "`{GPU_MILLI}` and `{GPU_MEM}` are whole numbers (milli-GPU, MiB)"
            )));
        }
        if milli > u64::from(SHARE_CAPACITY) * MILLI {
            return Err(DeviceError::Ambiguous(format!(
                "`{GPU_MILLI}:{}` is a share of one device, at most 1000; ask `gpus:N` for whole \
                 devices",
                format_milli(milli)
            )));
        }
        let demand = if whole > 0 {
            let count = u32::try_from(whole / MILLI).map_err(|_| {
                DeviceError::Ambiguous(format!("`gpus:{}` is too many", whole / MILLI))
            })?;
            GpuDemand::Whole { count }
        } else {
            GpuDemand::Slice {
                share: (milli / MILLI) as u32,
                memory_mib: mem / MILLI,
            }
        };
        Ok(Some(DeviceRequest { demand, models }))
    }

    /// The canonical scalars of this request: `gpus:N`, or `gpu_milli` / `gpu_mem`.
    pub fn scalars(&self) -> Resources {
        let mut out = Resources::new();
        match self.demand {
            GpuDemand::Whole { count } => {
                out.set_milli(GPUS, u64::from(count) * MILLI);
            }
            GpuDemand::Slice { share, memory_mib } => {
                out.set_milli(GPU_MILLI, u64::from(share) * MILLI);
                out.set_milli(GPU_MEM, memory_mib.saturating_mul(MILLI));
            }
        }
        out
    }

    /// How many devices must fit.
    pub fn device_count(&self) -> u32 {
        match self.demand {
            GpuDemand::Whole { count } => count,
            GpuDemand::Slice { .. } => 1,
        }
    }

    fn allows(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// Splits task text (`cpus:1;mem:64;gpu_milli:500;gpu_model:V100M16|V100M32`) into scalars
/// (everything but `gpu_model`) and the device request. Rules (anything else is refused as
/// ambiguous, see [`DeviceRequest::from_scalars`]):
/// - `gpus:N`: N whole devices, N a whole number; not with `gpu_milli` or `gpu_mem` (a whole
///   device has all its memory; pick bigger devices with `gpu_model`);
/// - `gpu_milli:S`: S milli-GPU of one device, 1 ≤ S ≤ 1000;
/// - `gpu_mem:M`: M MiB of one device's memory (with or without `gpu_milli`);
/// - `gpu_model:A|B`: only devices of these models; needs one of the amounts above.
pub fn parse_task_resources(text: &str) -> Result<(Resources, Option<DeviceRequest>), DeviceError> {
    let mut models: Vec<String> = Vec::new();
    let mut plain: Vec<&str> = Vec::new();
    for raw in text.split(';') {
        let part = raw.trim();
        match part.split_once(':') {
            Some((name, value)) if name.trim() == GPU_MODEL => {
                if !models.is_empty() {
                    return Err(ResourceError::Duplicate {
                        name: GPU_MODEL.into(),
                    }
                    .into());
                }
                models = parse_models(part, value)?;
            }
            _ => plain.push(raw),
        }
    }
    let scalars = Resources::parse(&plain.join(";"))?;
    let request = DeviceRequest::from_scalars(&scalars, models)?;
    Ok((scalars, request))
}

fn parse_models(part: &str, value: &str) -> Result<Vec<String>, DeviceError> {
    let mut models = Vec::new();
    for m in value.split('|') {
        let m = m.trim();
        if m.is_empty()
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(DeviceError::Syntax {
                part: part.into(),
                why: format!("`{m}` is not a model name (letters, digits, `-`, `_`, `.`)"),
            });
        }
        models.push(m.to_string());
    }
    Ok(models)
}

/// Splits agent text into scalars and devices. `gpus:COUNTxMEMORY[@MODEL]` declares COUNT
/// devices of MEMORY MiB each (several kinds joined by `+`: `gpus:2x16384@V100M16+1x32768`);
/// indices count from 0 in that order. The aggregate [`GPU_MILLI`] and [`GPU_MEM`] totals are
/// added to the scalars. A plain `gpus:N` stays a plain scalar (no devices), as before this
/// module; `gpu_milli` / `gpu_mem` beside a device list are refused (they are derived).
pub fn parse_agent_resources(text: &str) -> Result<(Resources, Vec<Device>), DeviceError> {
    let mut devices: Option<Vec<Device>> = None;
    let mut plain: Vec<&str> = Vec::new();
    for raw in text.split(';') {
        let part = raw.trim();
        match part.split_once(':') {
            Some((name, value)) if name.trim() == GPUS && value.contains('x') => {
                if devices.is_some() {
                    return Err(ResourceError::Duplicate { name: GPUS.into() }.into());
                }
                devices = Some(parse_device_list(part, value.trim())?);
            }
            _ => plain.push(raw),
        }
    }
    let mut scalars = Resources::parse(&plain.join(";"))?;
    let devices = devices.unwrap_or_default();
    if !devices.is_empty() {
        for name in [GPUS, GPU_MILLI, GPU_MEM] {
            if scalars.milli(name) > 0 {
                return Err(DeviceError::Ambiguous(format!(
                    "`{name}` beside the device list `gpus:NxMEM`: the device list says it all"
                )));
            }
        }
        scalars = scalars.checked_add(&DeviceState::new(devices.clone())?.free_scalars())?;
    }
    Ok((scalars, devices))
}

fn parse_device_list(part: &str, value: &str) -> Result<Vec<Device>, DeviceError> {
    let bad = |why: String| DeviceError::Syntax {
        part: part.to_string(),
        why,
    };
    let mut devices = Vec::new();
    for kind in value.split('+') {
        let kind = kind.trim();
        let (amounts, model) = match kind.split_once('@') {
            Some((a, m)) => (a, m.trim()),
            None => (kind, ""),
        };
        if !model.is_empty() {
            parse_models(part, model)?;
        } else if kind.contains('@') {
            return Err(bad("an empty model after `@`".into()));
        }
        let (count, memory) = amounts
            .split_once('x')
            .ok_or_else(|| bad(format!("`{kind}` is not COUNTxMEMORY[@MODEL]")))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("`{count}` is not a whole device count")))?;
        let memory_mib: u64 = memory
            .trim()
            .parse()
            .map_err(|_| bad(format!("`{memory}` is not a whole number of MiB")))?;
        if count == 0 {
            return Err(bad("a device count of 0".into()));
        }
        if devices.len() + count as usize > MAX_DEVICES {
            return Err(bad(format!("more than {MAX_DEVICES} devices")));
        }
        for _ in 0..count {
            devices.push(Device {
                index: devices.len() as u32,
                model: model.to_string(),
                memory_mib,
            });
        }
    }
    Ok(devices)
}

/// The most devices of one class an agent may have (a device mask is one `u128`).
pub const MAX_DEVICES: usize = 128;

// ------------------------------------------------------------------ per-agent state

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

/// What one task holds of one device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BoundDevice {
    pub index: u32,
    /// Milli-GPU held (1000 for a whole device).
    pub share: u32,
    /// Memory held, MiB.
    pub memory_mib: u64,
}

/// The exact devices a task runs on. Text form (`RINGMASTER_DEVICES`):
/// `gpu:INDEX:SHARE:MEMORY` per device, comma-separated, e.g. `gpu:0:500:8192`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceBinding {
    pub devices: Vec<BoundDevice>,
}

impl DeviceBinding {
    /// `CUDA_VISIBLE_DEVICES`: the indices, comma-separated.
    pub fn cuda_visible_devices(&self) -> String {
        self.devices
            .iter()
            .map(|d| d.index.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Parses the text form.
    pub fn parse(text: &str) -> Result<Self, DeviceError> {
        let mut devices = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let fields: Vec<&str> = part.split(':').collect();
            let parsed = match fields.as_slice() {
                [class, index, share, mem] if *class == GPU_CLASS => {
                    match (index.parse(), share.parse(), mem.parse()) {
                        (Ok(index), Ok(share), Ok(memory_mib)) => Some(BoundDevice {
                            index,
                            share,
                            memory_mib,
                        }),
                        _ => None,
                    }
                }
                _ => None,
            };
            devices.push(parsed.ok_or_else(|| {
                DeviceError::Binding(format!("`{part}` is not gpu:INDEX:SHARE:MEMORY"))
            })?);
        }
        Ok(DeviceBinding { devices })
    }
}

impl fmt::Display for DeviceBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.devices.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{GPU_CLASS}:{}:{}:{}", d.index, d.share, d.memory_mib)?;
        }
        Ok(())
    }
}

/// One agent's devices of the GPU class and what each has free: the plain (`Vec`) form, the
/// reference for the packed one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceState {
    devices: Vec<Device>,
    free_share: Vec<u32>,
    free_memory: Vec<u64>,
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

    /// Whether device `i` (position, not index) can hold one unit of `request`.
    fn device_fits(&self, i: usize, request: &DeviceRequest) -> bool {
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

// ------------------------------------------------------------------ packed encoding

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

// ------------------------------------------------------------------ nvidia-smi

/// Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader` output
/// (`0, Tesla V100-SXM2-16GB, 16160 MiB`). Model names keep letters and digits and turn
/// anything else into `-`, so they can be written in `gpu_model`.
pub fn parse_nvidia_smi(output: &str) -> Result<Vec<Device>, DeviceError> {
    let mut devices = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = |why: &str| DeviceError::Syntax {
            part: line.to_string(),
            why: why.to_string(),
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, name, memory] = fields.as_slice() else {
            return Err(bad("expected `index, name, memory.total`"));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| bad("the index is not a number"))?;
        let memory = memory
            .strip_suffix("MiB")
            .map(str::trim)
            .ok_or_else(|| bad("memory.total is not `N MiB`"))?;
        let memory_mib: u64 = memory
            .parse()
            .map_err(|_| bad("memory.total is not `N MiB`"))?;
        let model: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        devices.push(Device {
            index,
            model,
            memory_mib,
        });
    }
    DeviceState::new(devices.clone())?;
    Ok(devices)
}

// ------------------------------------------------------------------ wire

impl From<&Device> for crate::v1::Device {
    fn from(d: &Device) -> Self {
        crate::v1::Device {
            class: GPU_CLASS.into(),
            index: d.index,
            model: d.model.clone(),
            memory_mib: d.memory_mib,
        }
    }
}

/// The devices of a wire message; refuses classes other than `gpu` and repeated indices.
pub fn devices_from_wire(wire: &[crate::v1::Device]) -> Result<Vec<Device>, DeviceError> {
    let devices: Vec<Device> = wire
        .iter()
        .map(|d| {
            if d.class != GPU_CLASS {
                return Err(DeviceError::Syntax {
                    part: format!("device class `{}`", d.class),
                    why: format!("only `{GPU_CLASS}` is known"),
                });
            }
            Ok(Device {
                index: d.index,
                model: d.model.clone(),
                memory_mib: d.memory_mib,
            })
        })
        .collect::<Result<_, _>>()?;
    DeviceState::new(devices.clone())?;
    Ok(devices)
}

impl DeviceBinding {
    /// The wire form.
    pub fn to_wire(&self) -> Vec<crate::v1::DeviceShare> {
        self.devices
            .iter()
            .map(|d| crate::v1::DeviceShare {
                class: GPU_CLASS.into(),
                index: d.index,
                milli: d.share,
                memory_mib: d.memory_mib,
            })
            .collect()
    }

    /// From the wire; refuses classes other than `gpu` and shares above a whole device.
    pub fn from_wire(wire: &[crate::v1::DeviceShare]) -> Result<Self, DeviceError> {
        let devices = wire
            .iter()
            .map(|d| {
                if d.class != GPU_CLASS {
                    return Err(DeviceError::Binding(format!(
                        "device class `{}`: only `{GPU_CLASS}` is known",
                        d.class
                    )));
                }
                if d.milli > SHARE_CAPACITY {
                    return Err(DeviceError::Binding(format!(
                        "{GPU_CLASS} {}: share {} above {SHARE_CAPACITY}",
                        d.index, d.milli
                    )));
                }
                Ok(BoundDevice {
                    index: d.index,
                    share: d.milli,
                    memory_mib: d.memory_mib,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(DeviceBinding { devices })
    }
}

impl DeviceState {
    /// Devices and their free amounts from the wire (an offer); a device without a free entry
    /// is taken as fully used.
    pub fn from_wire(
        devices: &[crate::v1::Device],
        free: &[crate::v1::DeviceShare],
    ) -> Result<Self, DeviceError> {
        let devices = devices_from_wire(devices)?;
        let lookup = |index: u32| {
            free.iter()
                .find(|f| f.index == index && f.class == GPU_CLASS)
        };
        let share = devices
            .iter()
            .map(|d| lookup(d.index).map_or(0, |f| f.milli))
            .collect();
        let memory = devices
            .iter()
            .map(|d| lookup(d.index).map_or(0, |f| f.memory_mib))
            .collect();
        DeviceState::with_free(devices, share, memory)
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

    /// Each device's free share and memory, in wire form (heartbeats).
    pub fn free_to_wire(&self) -> Vec<crate::v1::DeviceShare> {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| crate::v1::DeviceShare {
                class: GPU_CLASS.into(),
                index: d.index,
                milli: self.free_share[i],
                memory_mib: self.free_memory[i],
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(spec: &[(u64, &str)]) -> Vec<Device> {
        spec.iter()
            .enumerate()
            .map(|(i, (mem, model))| Device {
                index: i as u32,
                model: model.to_string(),
                memory_mib: *mem,
            })
            .collect()
    }

    fn slice(share: u32, memory_mib: u64) -> DeviceRequest {
        DeviceRequest {
            demand: GpuDemand::Slice { share, memory_mib },
            models: vec![],
        }
    }

    #[test]
    fn parses_task_text_into_canonical_scalars() {
        let (s, r) = parse_task_resources("cpus:1;mem:64;gpu_milli:500").unwrap();
        assert_eq!(s.to_string(), "cpus:1;gpu_milli:500;mem:64");
        assert_eq!(
            r.unwrap().demand,
            GpuDemand::Slice {
                share: 500,
                memory_mib: 0
            }
        );
        let (s, r) = parse_task_resources("gpus:2;gpu_model:V100M16|V100M32").unwrap();
        assert_eq!(s.to_string(), "gpus:2");
        let r = r.unwrap();
        assert_eq!(r.demand, GpuDemand::Whole { count: 2 });
        assert_eq!(r.models, ["V100M16", "V100M32"]);
        assert_eq!(
            DeviceRequest::from_scalars(&s, r.models.clone()).unwrap(),
            Some(r)
        );
        let (s, r) = parse_task_resources("gpu_mem:8192").unwrap();
        assert_eq!(s.to_string(), "gpu_mem:8192");
        assert_eq!(DeviceRequest::from_scalars(&s, vec![]).unwrap(), r);
        assert_eq!(parse_task_resources("cpus:1").unwrap().1, None);
    }

    #[test]
    fn refuses_ambiguous_task_text_saying_why() {
        let cases = [
            ("gpus:1;gpu_milli:500", "either whole GPUs or a slice"),
            ("gpus:1.5", "not a whole number of devices"),
            ("gpu_milli:1500", "at most 1000"),
            ("gpu_milli:0.5", "whole numbers"),
            ("gpu_model:V100", "without any GPU amount"),
            ("gpu_milli:1;gpu_model:a b", "not a model name"),
            ("gpus:1;gpu_mem:100", "either whole GPUs"),
        ];
        for (text, expected) in cases {
            let err = parse_task_resources(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn parses_agent_devices() {
        let (s, d) = parse_agent_resources("cpus:8;gpus:2x16384@V100M16+1x32768").unwrap();
        assert_eq!(s.to_string(), "cpus:8;gpu_mem:65536;gpu_milli:3000;gpus:3");
        assert_eq!(d.len(), 3);
        assert_eq!(
            (d[2].index, d[2].memory_mib, d[2].model.as_str()),
            (2, 32768, "")
        );
        assert_eq!(d[0].model, "V100M16");
        let (s, d) = parse_agent_resources("cpus:1;gpus:2").unwrap();
        assert!(d.is_empty());
        assert_eq!(s.milli("gpus"), 2000);
        for (text, expected) in [
            ("gpus:2x", "not a whole number of MiB"),
            ("gpus:0x10", "count of 0"),
            ("gpus:ax10", "whole device count"),
            ("gpus:1x10;gpu_milli:5", "device list says it all"),
            ("gpus:1x10@", "empty model"),
            ("gpus:200x1", "more than 128"),
        ] {
            let err = parse_agent_resources(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn selection_spreads_or_packs_with_exact_indices() {
        let devices = gpus(&[(16384, "A"), (16384, "A"), (16384, "A"), (32768, "B")]);
        let state = DeviceState::with_free(
            devices,
            vec![300, 700, 1000, 600],
            vec![16384; 3].into_iter().chain([32768]).collect(),
        )
        .unwrap();
        let pick = |r: &DeviceRequest, p| {
            state
                .select(r, p)
                .map(|b| b.devices.iter().map(|d| d.index).collect::<Vec<_>>())
        };
        use DeviceSelection::*;
        assert_eq!(pick(&slice(250, 0), LeastUsed), Some(vec![2]));
        assert_eq!(pick(&slice(250, 0), MostUsedThatFits), Some(vec![0]));
        assert_eq!(pick(&slice(500, 0), MostUsedThatFits), Some(vec![3]));
        assert_eq!(pick(&slice(800, 0), MostUsedThatFits), Some(vec![2]));
        assert_eq!(pick(&slice(100, 20000), LeastUsed), Some(vec![3]));
        let whole = |count, models: &[&str]| DeviceRequest {
            demand: GpuDemand::Whole { count },
            models: models.iter().map(|m| m.to_string()).collect(),
        };
        assert_eq!(pick(&whole(1, &[]), LeastUsed), Some(vec![2]));
        assert_eq!(pick(&whole(2, &[]), LeastUsed), None);
        assert_eq!(pick(&whole(1, &["B"]), LeastUsed), None);
        let mut b_only = slice(500, 0);
        b_only.models = vec!["B".into()];
        assert_eq!(pick(&b_only, LeastUsed), Some(vec![3]));
    }

    #[test]
    fn two_half_gpu_tasks_share_a_device_and_a_third_goes_elsewhere() {
        let mut state = DeviceState::new(gpus(&[(16384, ""), (16384, "")])).unwrap();
        let half = slice(500, 0);
        let mut indices = Vec::new();
        for _ in 0..3 {
            let b = state
                .select(&half, DeviceSelection::MostUsedThatFits)
                .unwrap();
            state.check_binding(&half, &b).unwrap();
            state.bind(&b).unwrap();
            indices.push(b.devices[0].index);
        }
        assert_eq!(indices, [0, 0, 1]);
        assert_eq!(state.free_share(), [0, 500]);
        let b = DeviceBinding::parse("gpu:0:500:0").unwrap();
        assert!(state
            .bind(&b)
            .unwrap_err()
            .to_string()
            .contains("has 0 milli-GPU"));
        state.release(&b);
        assert_eq!(state.free_share(), [500, 500]);
        assert_eq!(
            state.free_scalars().to_string(),
            "gpu_mem:32768;gpu_milli:1000"
        );
        state.release(&DeviceBinding::parse("gpu:0:500:0").unwrap());
        assert_eq!(
            state.free_scalars().to_string(),
            "gpu_mem:32768;gpu_milli:1500;gpus:1"
        );
    }

    #[test]
    fn binding_text_round_trips_and_bad_text_is_refused() {
        let b = DeviceBinding {
            devices: vec![
                BoundDevice {
                    index: 0,
                    share: 1000,
                    memory_mib: 16384,
                },
                BoundDevice {
                    index: 3,
                    share: 1000,
                    memory_mib: 16384,
                },
            ],
        };
        assert_eq!(b.to_string(), "gpu:0:1000:16384,gpu:3:1000:16384");
        assert_eq!(b.cuda_visible_devices(), "0,3");
        assert_eq!(DeviceBinding::parse(&b.to_string()).unwrap(), b);
        assert!(DeviceBinding::parse("gpu:x:1:1").is_err());
        assert!(DeviceBinding::parse("fpga:0:1:1").is_err());
    }

    #[test]
    fn packed_word_is_the_seed_sum_and_refuses_what_does_not_fit() {
        let layout = LaneLayout::new(10, 4, 64).unwrap();
        let packed = PackedLanes::encode(layout, &[1000, 500, 0, 1]).unwrap();
        assert_eq!(packed.word(), 1000 | 500 << 10 | 1 << 30);
        assert_eq!(packed.decode(), [1000, 500, 0, 1]);
        assert_eq!(packed.count_at_least(500), 2);
        assert_eq!(packed.lanes_at_least(1), 0b1011);
        assert!(LaneLayout::new(10, 7, 64)
            .unwrap_err()
            .to_string()
            .contains("70 bits"));
        assert!(LaneLayout::new(0, 1, 64).is_err());
        assert!(LaneLayout::new(8, 1, 32).is_err());
        let err = PackedLanes::encode(layout, &[1024]).unwrap_err();
        assert_eq!(
            err,
            DeviceError::ValueTooWide {
                lane: 0,
                value: 1024,
                bits: 10
            }
        );
        assert!(PackedLanes::encode(layout, &[0; 5]).is_err());
        // Eight 80 GiB devices need 17-bit memory lanes: 136 bits do not fit.
        let big = DeviceState::new(gpus(&[(81920, ""); 8])).unwrap();
        assert!(big.packed().unwrap_err().to_string().contains("136 bits"));
    }

    #[test]
    fn parses_nvidia_smi_samples() {
        let sample = "0, Tesla V100-SXM2-16GB, 16160 MiB\n1, NVIDIA A100-SXM4-80GB, 81920 MiB\n";
        let d = parse_nvidia_smi(sample).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].index, d[0].model.as_str(), d[0].memory_mib),
            (0, "Tesla-V100-SXM2-16GB", 16160)
        );
        assert_eq!(d[1].memory_mib, 81920);
        assert!(parse_nvidia_smi("").unwrap().is_empty());
        assert!(parse_nvidia_smi("0, X, 16 GB").is_err());
        assert!(parse_nvidia_smi("zero, X, 16 MiB").is_err());
        assert!(parse_nvidia_smi("0, X, 1 MiB\n0, Y, 1 MiB").is_err());
        assert!(parse_nvidia_smi("NVIDIA-SMI has failed").is_err());
    }
}
