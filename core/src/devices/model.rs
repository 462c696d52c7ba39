//! The device model: what a device is, what a task is bound to, and what can go wrong.

use std::fmt;

use crate::resources::ResourceError;

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
