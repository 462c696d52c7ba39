//! What one task asks of devices, parsed from the extended text syntax.

use super::*;
use crate::resources::{format_milli, ResourceError, Resources, MILLI};

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

    pub(super) fn allows(&self, model: &str) -> bool {
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
