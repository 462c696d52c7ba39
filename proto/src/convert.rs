//! Conversions between the core's types and their wire form.
//!
//! The core crate knows nothing of protobuf, so the conversions live here, as `From`/`TryFrom`
//! impls where the orphan rule allows and as extension traits otherwise: bring them into scope
//! with `use ringmaster_proto::convert::*` and call `Resources::from_wire(..)`,
//! `binding.to_wire()` and so on as before.

use ringmaster_core::devices::{
    BoundDevice, Device, DeviceBinding, DeviceError, DeviceState, GPU_CLASS, SHARE_CAPACITY,
};
use ringmaster_core::resources::{ResourceError, Resources};

use crate::v1;

impl From<&Resources> for v1::Resources {
    fn from(r: &Resources) -> Self {
        v1::Resources {
            scalars: r
                .iter()
                .map(|(name, milli)| v1::Scalar {
                    name: name.to_string(),
                    milli,
                })
                .collect(),
        }
    }
}

impl TryFrom<&v1::Resources> for Resources {
    type Error = ResourceError;
    fn try_from(wire: &v1::Resources) -> Result<Self, Self::Error> {
        Resources::from_milli(wire.scalars.iter().map(|s| (s.name.clone(), s.milli)))
    }
}

/// [`Resources`] to and from the wire.
pub trait ResourcesWire: Sized {
    /// Converts an optional wire bundle (absent = empty).
    fn from_wire(wire: Option<&v1::Resources>) -> Result<Self, ResourceError>;
    /// The wire form.
    fn to_wire(&self) -> v1::Resources;
}

impl ResourcesWire for Resources {
    fn from_wire(wire: Option<&v1::Resources>) -> Result<Self, ResourceError> {
        wire.map(Resources::try_from)
            .unwrap_or(Ok(Resources::new()))
    }

    fn to_wire(&self) -> v1::Resources {
        self.into()
    }
}

impl From<&Device> for v1::Device {
    fn from(d: &Device) -> Self {
        v1::Device {
            class: GPU_CLASS.into(),
            index: d.index,
            model: d.model.clone(),
            memory_mib: d.memory_mib,
        }
    }
}

/// The devices of a wire message; refuses classes other than `gpu` and repeated indices.
pub fn devices_from_wire(wire: &[v1::Device]) -> Result<Vec<Device>, DeviceError> {
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

/// [`DeviceBinding`] to and from the wire.
pub trait BindingWire: Sized {
    /// The wire form.
    fn to_wire(&self) -> Vec<v1::DeviceShare>;
    /// From the wire; refuses classes other than `gpu` and shares above a whole device.
    fn from_wire(wire: &[v1::DeviceShare]) -> Result<Self, DeviceError>;
}

impl BindingWire for DeviceBinding {
    fn to_wire(&self) -> Vec<v1::DeviceShare> {
        self.devices
            .iter()
            .map(|d| v1::DeviceShare {
                class: GPU_CLASS.into(),
                index: d.index,
                milli: d.share,
                memory_mib: d.memory_mib,
            })
            .collect()
    }

    fn from_wire(wire: &[v1::DeviceShare]) -> Result<Self, DeviceError> {
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

/// [`DeviceState`] to and from the wire (offers, heartbeats).
pub trait DeviceStateWire: Sized {
    /// Devices and their free amounts from the wire (an offer); a device without a free entry
    /// is taken as fully used.
    fn from_wire(devices: &[v1::Device], free: &[v1::DeviceShare]) -> Result<Self, DeviceError>;
    /// Each device's free share and memory, in wire form (heartbeats).
    fn free_to_wire(&self) -> Vec<v1::DeviceShare>;
}

impl DeviceStateWire for DeviceState {
    fn from_wire(devices: &[v1::Device], free: &[v1::DeviceShare]) -> Result<Self, DeviceError> {
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

    fn free_to_wire(&self) -> Vec<v1::DeviceShare> {
        self.devices()
            .iter()
            .zip(self.free_share().iter().zip(self.free_memory()))
            .map(|(d, (&milli, &memory_mib))| v1::DeviceShare {
                class: GPU_CLASS.into(),
                index: d.index,
                milli,
                memory_mib,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Resources {
        s.parse().unwrap()
    }

    #[test]
    fn wire_round_trip() {
        let a = r("cpus:0.5;mem:100;gpus:2");
        assert_eq!(Resources::try_from(&a.to_wire()).unwrap(), a);
        let dup = v1::Resources {
            scalars: vec![
                v1::Scalar {
                    name: "cpus".into(),
                    milli: 1,
                },
                v1::Scalar {
                    name: "cpus".into(),
                    milli: 2,
                },
            ],
        };
        assert!(Resources::try_from(&dup).is_err());
    }
}
