//! The allocator: the placement core's books, kept together so they move together.
//!
//! [`Allocator`] owns what the master used to keep as loose fields: the [`Cluster`] (every
//! agent's total and free resources in the rings), the [`DrfSorter`] (each framework's
//! allocation, weight and suppression), the [`QuotaLedger`] (what runs at user priority per
//! (user, partition)), the [`DeviceBook`] (every agent's GPUs, device by device), the window of
//! launched task shapes (the fragmentation tie-break's target) and the maps from the core's
//! keys back to agent and framework ids.
//!
//! Its invariants live here and nowhere else:
//! - an admitted agent is in the cluster, the device book (when it has devices) and the key map
//!   together, and leaves all three together ([`Allocator::add_agent`],
//!   [`Allocator::remove_agent`]);
//! - resources taken from an agent's free (an offer, a held task) are recorded on the
//!   framework's DRF allocation, and given back to both together ([`Allocator::offer_taken`],
//!   [`Allocator::offer_returned`], [`Allocator::hold`], [`Allocator::release`]); a held task's
//!   device binding is taken from and released to the device book with them;
//! - a framework is in the DRF sorter and the key map together ([`Allocator::add_framework`],
//!   [`Allocator::remove_framework`]).
//!
//! The handlers (`agents`, `frameworks`, `tasks`, `offers`, `batch`, `durability`) keep the
//! conversation (messages, records, timers, logs) and call these methods for the books.

use std::collections::HashMap;

use ringmaster_core::placement::devices::DeviceBook;
use ringmaster_core::placement::fragmentation::{DeviceFragmentScore, ShapeWindow, TaskShape};
use ringmaster_core::placement::{
    run_cycle, AgentKey, Cluster, CycleInput, DrfSorter, Filter, FrameworkKey, Grant, Outcome,
    PlacementContext, PlacementError, QuotaLedger, RunningTask, TieredRequest,
};
use ringmaster_proto::devices::{Device, DeviceBinding, DeviceError};
use ringmaster_proto::resources::Resources;

use crate::config::Config;

/// What the master knows at cycle time and the allocator does not: the feasibility rules over
/// agent and framework records, holds after preemption, running tasks and their device bindings.
/// Ids are the master's (the allocator maps its keys back to them).
pub(crate) struct CycleFacts<'a, T> {
    /// May the framework (by id) be given the agent (by id, `None` when the key maps to no
    /// agent)? The third argument tells whether a demand fits the agent's devices.
    #[allow(clippy::type_complexity)]
    pub feasible: &'a dyn Fn(&str, Option<&str>, &dyn Fn(&Resources) -> bool) -> Result<(), Filter>,
    /// The framework (by id) waits for preempted tasks to end somewhere.
    pub waiting: &'a dyn Fn(&str) -> bool,
    /// The running tasks preemption may evict.
    pub running: &'a dyn Fn() -> Vec<RunningTask<T>>,
    /// A running task's device binding (for the per-device preemption check).
    pub binding: &'a dyn Fn(&T) -> Option<&'a DeviceBinding>,
}

/// What went wrong while holding a task's resources; the books stay consistent either way
/// (an over-large hold clamps the agent's free to zero; a binding that is not free is skipped).
#[derive(Debug, Default)]
pub(crate) struct HoldProblems {
    pub clamped: Option<PlacementError>,
    pub devices: Option<DeviceError>,
}

pub(crate) struct Allocator {
    cluster: Cluster,
    drf: DrfSorter,
    /// Resources held at user priority per (user, partition): what counts against quotas.
    ledger: QuotaLedger,
    /// Every agent's GPUs, device by device (docs/devices.md).
    devices: DeviceBook,
    /// The shapes of recent launches: the target workload of the ring's fragmentation
    /// tie-break (docs/placement.md).
    launched_shapes: ShapeWindow,
    agent_by_key: HashMap<AgentKey, String>,
    framework_by_key: HashMap<FrameworkKey, String>,
    next_framework_key: FrameworkKey,
}

impl Allocator {
    pub fn new(config: &Config) -> Self {
        Allocator {
            cluster: Cluster::new(config.rings.clone(), config.placer),
            drf: DrfSorter::default(),
            ledger: QuotaLedger::default(),
            devices: DeviceBook::default(),
            launched_shapes: ShapeWindow::default(),
            agent_by_key: HashMap::new(),
            framework_by_key: HashMap::new(),
            next_framework_key: 0,
        }
    }

    // --- agents ---

    /// Admits agent `id` with all of `total` free and its devices all free. The agent keeps its
    /// key even if the devices are refused (then it has none); the error is returned.
    pub fn add_agent(
        &mut self,
        id: &str,
        total: Resources,
        devices: Vec<Device>,
    ) -> (AgentKey, Result<(), DeviceError>) {
        let key = self.cluster.add_agent(total);
        let devices = self.devices.set_agent(key, devices);
        self.agent_by_key.insert(key, id.to_string());
        (key, devices)
    }

    /// Drops an agent from the cluster, the device book and the key map.
    pub fn remove_agent(&mut self, key: AgentKey) {
        self.cluster.remove_agent(key);
        self.devices.remove_agent(key);
        self.agent_by_key.remove(&key);
    }

    // --- frameworks ---

    /// Registers framework `id` with DRF under a fresh key, which it returns.
    pub fn add_framework(&mut self, id: &str, weight: f64) -> FrameworkKey {
        let key = self.next_framework_key;
        self.next_framework_key += 1;
        self.drf.add(key, weight);
        self.framework_by_key.insert(key, id.to_string());
        key
    }

    pub fn set_weight(&mut self, key: FrameworkKey, weight: f64) {
        self.drf.set_weight(key, weight);
    }

    pub fn suppress(&mut self, key: FrameworkKey) {
        self.drf.suppress(key);
    }

    pub fn revive(&mut self, key: FrameworkKey) {
        self.drf.revive(key);
    }

    /// Drops a framework from DRF and the key map.
    pub fn remove_framework(&mut self, key: FrameworkKey) {
        self.drf.remove(key);
        self.framework_by_key.remove(&key);
    }

    // --- offers ---

    /// An offer of `resources` on `agent` to `framework` outside the cycle (a batch match):
    /// taken from the agent's free and recorded on the framework's allocation, or neither.
    pub fn offer_taken(
        &mut self,
        agent: AgentKey,
        framework: FrameworkKey,
        resources: &Resources,
    ) -> Result<(), PlacementError> {
        self.cluster.take(agent, resources)?;
        self.drf.allocated(framework, resources);
        Ok(())
    }

    /// An offer's resources come back (declined, rescinded, expired, or accepted: the tasks
    /// then hold their share again): off the framework's allocation, back to the agent's free.
    /// Either side may be gone already.
    pub fn offer_returned(
        &mut self,
        agent: Option<AgentKey>,
        framework: Option<FrameworkKey>,
        resources: &Resources,
    ) {
        if let Some(framework) = framework {
            self.drf.unallocated(framework, resources);
        }
        if let Some(agent) = agent {
            let _ = self.cluster.give_back(agent, resources);
        }
    }

    // --- tasks ---

    /// A task's resources count as used on `agent` and allocated to `framework` (when it is
    /// still known), and its device binding (when given) as taken. Resources beyond the agent's
    /// free clamp its free to zero.
    pub fn hold(
        &mut self,
        agent: AgentKey,
        framework: Option<FrameworkKey>,
        resources: &Resources,
        binding: Option<&DeviceBinding>,
    ) -> HoldProblems {
        let mut problems = HoldProblems::default();
        if let Err(e) = self.cluster.take(agent, resources) {
            problems.clamped = Some(e);
            let free = self
                .cluster
                .agent(agent)
                .map(|a| a.free.clone())
                .unwrap_or_default();
            let _ = self.cluster.take(agent, &free);
        }
        if let Some(framework) = framework {
            self.drf.allocated(framework, resources);
        }
        if let Some(binding) = binding {
            if let Err(e) = self.devices.take(agent, binding) {
                problems.devices = Some(e);
            }
        }
        problems
    }

    /// The reverse of [`hold`](Self::hold): back to the agent (when still admitted) with the
    /// binding, off the framework's allocation (when still known).
    pub fn release(
        &mut self,
        agent: Option<AgentKey>,
        framework: Option<FrameworkKey>,
        resources: &Resources,
        binding: &DeviceBinding,
    ) {
        if let Some(agent) = agent {
            let _ = self.cluster.give_back(agent, resources);
            self.devices.release(agent, binding);
        }
        if let Some(framework) = framework {
            self.drf.unallocated(framework, resources);
        }
    }

    /// A task starts running at its user's priority: it counts against the quota.
    pub fn start_quota(&mut self, user: &str, partition: &str, resources: &Resources) {
        self.ledger.start(user, partition, resources);
    }

    /// A task at user priority ended.
    pub fn end_quota(&mut self, user: &str, partition: &str, resources: &Resources) {
        self.ledger.end(user, partition, resources);
    }

    /// A task of this shape was launched (the fragmentation tie-break's recent workload).
    pub fn launched(&mut self, shape: TaskShape) {
        self.launched_shapes.record(shape);
    }

    // --- the cycle ---

    /// One allocation cycle over `requests` (sorted by the caller): the core's
    /// [`run_cycle`] with the fragmentation tie-break against recent launches and these
    /// demands, the devices checked per device. Grants come back already taken from the
    /// cluster and recorded in DRF.
    pub fn run<T: Clone>(
        &mut self,
        requests: &mut [TieredRequest],
        config: &Config,
        facts: &CycleFacts<'_, T>,
    ) -> Outcome<T> {
        let Allocator {
            cluster,
            drf,
            devices,
            launched_shapes,
            agent_by_key,
            framework_by_key,
            ..
        } = self;
        let target = launched_shapes.target(requests.iter().filter_map(|r| {
            Some((
                TaskShape::of_demand(&r.request.demand)?,
                u64::from(r.request.count),
            ))
        }));
        let devices: &DeviceBook = devices;
        let agent_by_key: &HashMap<AgentKey, String> = agent_by_key;
        let framework_by_key: &HashMap<FrameworkKey, String> = framework_by_key;
        let feasible = |fw: FrameworkKey, agent: AgentKey| -> Result<(), Filter> {
            let Some(fw) = framework_by_key.get(&fw) else {
                return Err(Filter::Disconnected);
            };
            let agent_id = agent_by_key.get(&agent).map(String::as_str);
            // A GPU demand fits only an agent with a device that can hold it (docs/devices.md).
            (facts.feasible)(fw, agent_id, &|demand| devices.fits(agent, demand))
        };
        let waiting = |fw: FrameworkKey| {
            framework_by_key
                .get(&fw)
                .is_some_and(|id| (facts.waiting)(id))
        };
        // Preemption checks the devices per device: the victims' bindings released on a copy of
        // the agent's device state, the demand's request fitted there (docs/priorities.md).
        let device_check = |agent: AgentKey, demand: &Resources, victims: &[&T]| {
            let bindings = victims.iter().filter_map(|t| (facts.binding)(t));
            devices.fits_after_release(agent, demand, bindings)
        };
        let fragment_growth = target.as_ref().map(|target| {
            let cpu_free = devices
                .agents()
                .filter_map(|key| Some((key, cluster.agent(key)?.free.milli("cpus"))))
                .collect();
            DeviceFragmentScore::new(target, devices, cpu_free, config.devices.selection)
        });
        // The requests are the real pending demands; the balance placer weighs what blocks them.
        let mut context = PlacementContext::new(config.balance.clone());
        if let Some(score) = &fragment_growth {
            context = context.with_score(score);
        }
        let input = CycleInput {
            base: config.priorities.base(),
            grant: Grant::WholeAgent,
            feasible: &feasible,
            waiting: &waiting,
            running: facts.running,
            devices: &device_check,
        };
        run_cycle(cluster, drf, requests, &input, &mut context)
    }

    // --- reads ---

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn drf(&self) -> &DrfSorter {
        &self.drf
    }

    pub fn ledger(&self) -> &QuotaLedger {
        &self.ledger
    }

    pub fn devices(&self) -> &DeviceBook {
        &self.devices
    }

    /// The id of the agent admitted under `key`.
    pub fn agent_id(&self, key: AgentKey) -> Option<&str> {
        self.agent_by_key.get(&key).map(String::as_str)
    }

    /// The id of the framework registered under `key`.
    pub fn framework_id(&self, key: FrameworkKey) -> Option<&str> {
        self.framework_by_key.get(&key).map(String::as_str)
    }
}
