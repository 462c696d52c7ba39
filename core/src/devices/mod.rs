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

mod fill;
mod model;
mod packed;
mod request;
mod select;
mod state;
#[cfg(test)]
mod tests;

pub use fill::*;
pub use model::*;
pub use packed::*;
pub use request::*;
pub use select::*;
pub use state::*;
