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
//!   [`Allocator::remove_framework`]);
//! - an agent kept for a preempting framework ([`Holds`]) is kept by the core's rules: the
//!   cycle's outcome is applied by [`apply_outcome`] ([`Allocator::apply`]), holds end at their
//!   deadline ([`Allocator::expire_holds`]) and with their agent or framework;
//! - disk withheld from an agent (it reported less free disk than the books,
//!   [`Allocator::bound_free_disk`]) is taken from its free and charged to no framework; it is
//!   never more than the agent's total less its free, so giving it back cannot fail, and it
//!   leaves with the agent.
//!
//! The handlers (`agents`, `frameworks`, `tasks`, `offers`, `batch`, `durability`) keep the
//! conversation (messages, records, timers, logs) and call these methods for the books.

use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

use ringmaster_core::placement::devices::DeviceBook;
use ringmaster_core::placement::fragmentation::{
    CpuMemFree, DeviceFragmentScore, ShapeWindow, TaskShape,
};
use ringmaster_core::placement::{
    apply_outcome, run_cycle, AgentKey, Cluster, CycleInput, DrfSorter, Filter, FrameworkKey,
    Grant, Holds, Outcome, PlacementContext, PlacementError, QuotaLedger, Quotas, RunningTask,
    TieredRequest,
};
use ringmaster_proto::devices::{Device, DeviceBinding, DeviceError, ShareFill, GPU_MILLI};
use ringmaster_proto::resources::{Resources, MILLI};

use crate::config::Config;

/// What the master knows at cycle time and the allocator does not: the feasibility rules over
/// agent and framework records, running tasks and their device bindings. Ids are the master's
/// (the allocator maps its keys back to them).
pub(crate) struct CycleFacts<'a, T> {
    /// The cycle's time: which holds are in force.
    pub now: Instant,
    /// May the framework (by id) be given the agent (by id, `None` when the key maps to no
    /// agent)? The third argument tells whether the agent is kept for another framework at
    /// `now` (the allocator's [`Holds`]), the fourth whether a demand fits its devices.
    #[allow(clippy::type_complexity)]
    pub feasible:
        &'a dyn Fn(&str, Option<&str>, bool, &dyn Fn(&Resources) -> bool) -> Result<(), Filter>,
    /// The running tasks preemption may evict.
    pub running: &'a dyn Fn() -> Vec<RunningTask<T>>,
    /// A running task's device binding (for the per-device preemption check).
    pub binding: &'a dyn Fn(&T) -> Option<&'a DeviceBinding>,
    /// Each request's (user, partition), by index: the cycle serves every copy at the priority
    /// it runs at then, within its user's quota or not (SPEC seed 003).
    pub owners: &'a [(String, String)],
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
    /// Each agent with devices: its free cpu and memory, kept as agents change (never within a
    /// run), for the fragment score, so that a run does not list every agent to build it.
    device_free: HashMap<AgentKey, CpuMemFree>,
    /// The shapes of recent launches: the target workload of the ring's fragmentation
    /// tie-break (docs/placement.md).
    launched_shapes: ShapeWindow,
    /// The popular slice sizes of the last cycle's target: which GPU a slice is bound to under
    /// `devices.selection: most-used-that-fits` (docs/devices.md).
    share_fill: Arc<ShareFill>,
    /// Per agent, the `disk` (milli) taken from its free because it reported less free disk
    /// than the books ([`bound_free_disk`](Self::bound_free_disk)); absent when none.
    withheld: HashMap<AgentKey, u64>,
    /// The sum of `withheld`.
    withheld_total: u64,
    /// Agents kept for a preempting framework (docs/priorities.md).
    holds: Holds<Instant>,
    agent_by_key: HashMap<AgentKey, String>,
    framework_by_key: HashMap<FrameworkKey, String>,
    next_framework_key: FrameworkKey,
}

/// The dimension an agent's report bounds (docs/protocol.md, "Agents").
pub(crate) const DISK: &str = "disk";

impl Allocator {
    pub fn new(config: &Config) -> Self {
        Allocator {
            cluster: Cluster::new(config.rings.clone(), config.placer),
            drf: DrfSorter::default(),
            ledger: QuotaLedger::default(),
            devices: DeviceBook::default(),
            device_free: HashMap::new(),
            launched_shapes: ShapeWindow::default(),
            share_fill: Arc::default(),
            withheld: HashMap::new(),
            withheld_total: 0,
            holds: Holds::new(),
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
        self.changed(key);
        self.agent_by_key.insert(key, id.to_string());
        (key, devices)
    }

    /// After the agent's free resources or devices changed: files it in the `gpu_milli` ring
    /// under its devices' grade ([`DeviceBook::grade`]; a slice's ring walk then passes no more
    /// than a few agents whose free share is spread over devices too small for it), and keeps
    /// `device_free`.
    fn changed(&mut self, key: AgentKey) {
        self.cluster
            .set_grade(key, GPU_MILLI, self.devices.grade(key));
        note_free_in(&mut self.device_free, &self.cluster, &self.devices, key);
    }

    /// Drops an agent from the cluster, the device book and the key map, with what was
    /// withheld from it.
    pub fn remove_agent(&mut self, key: AgentKey) {
        if let Some(withheld) = self.withheld.remove(&key) {
            self.withheld_total -= withheld;
        }
        self.cluster.remove_agent(key);
        self.devices.remove_agent(key);
        self.device_free.remove(&key);
        self.holds.release(key);
        self.agent_by_key.remove(&key);
    }

    /// The agent reported `reported` (milli) free `disk`: that bounds what may be offered
    /// there. Withholds what the books have free beyond it (free plus what is withheld already,
    /// less the report), taking more from its free or giving back what it has room for again.
    /// Touches this agent only; returns what was withheld before and what is now.
    pub fn bound_free_disk(&mut self, key: AgentKey, reported: u64) -> (u64, u64) {
        let Some(agent) = self.cluster.agent(key) else {
            return (0, 0);
        };
        let (free, total) = (agent.free.milli(DISK), agent.total.milli(DISK));
        let was = self.withheld.get(&key).copied().unwrap_or(0);
        let now = free.saturating_add(was).saturating_sub(reported);
        if now == was {
            return (was, now);
        }
        let moved = if now > was {
            // Within its free: `now - was` is at most `free`.
            self.cluster.take(key, &disk(now - was))
        } else {
            // Never above its total, whatever else clamped its books.
            match (was - now).min(total.saturating_sub(free)) {
                0 => Ok(()),
                back => self.cluster.give_back(key, &disk(back)),
            }
        };
        if moved.is_err() {
            return (was, was);
        }
        // Free and withheld together stay within the total: what has no room is dropped.
        let free = self.cluster.agent(key).map_or(0, |a| a.free.milli(DISK));
        let now = now.min(total.saturating_sub(free));
        self.withheld_total = self.withheld_total - was + now;
        if now == 0 {
            self.withheld.remove(&key);
        } else {
            self.withheld.insert(key, now);
        }
        self.changed(key);
        (was, now)
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

    /// Drops a framework from DRF, the key map and the holds kept for it.
    pub fn remove_framework(&mut self, key: FrameworkKey) {
        self.drf.remove(key);
        self.holds.forget_framework(key);
        self.framework_by_key.remove(&key);
    }

    // --- holds ---

    /// Applies a cycle's outcome to the holds ([`apply_outcome`]): each preemption keeps its
    /// agent for the preempting framework until `until`, a grant to the holder ends its hold.
    pub fn apply<T>(&mut self, outcome: &Outcome<T>, until: Instant) {
        apply_outcome(outcome, &mut self.holds, until);
    }

    /// Ends the holds whose deadline is not after `now`; true when one did.
    pub fn expire_holds(&mut self, now: Instant) -> bool {
        !self.holds.expire(now).is_empty()
    }

    /// Keeps `agent` for `framework` until `until` (what a preemption does; tests set it
    /// directly).
    #[cfg(test)]
    pub fn hold_agent(&mut self, agent: AgentKey, framework: FrameworkKey, until: Instant) {
        self.holds.hold(agent, framework, until);
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
        self.changed(agent);
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
            self.changed(agent);
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
        self.changed(agent);
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
            self.changed(agent);
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
            device_free,
            launched_shapes,
            share_fill,
            holds,
            agent_by_key,
            framework_by_key,
            ..
        } = self;
        let now = facts.now;
        let target = launched_shapes.target(requests.iter().filter_map(|r| {
            Some((
                TaskShape::of_demand(&r.request.demand)?,
                u64::from(r.request.count),
            ))
        }));
        let fill = target.as_ref().map(|t| t.share_fill());
        if fill != Some(&**share_fill) {
            *share_fill = Arc::new(fill.cloned().unwrap_or_default());
        }
        let devices: &DeviceBook = devices;
        let agent_by_key: &HashMap<AgentKey, String> = agent_by_key;
        let framework_by_key: &HashMap<FrameworkKey, String> = framework_by_key;
        let holds: &Holds<Instant> = holds;
        let feasible = |fw_key: FrameworkKey, agent: AgentKey| -> Result<(), Filter> {
            let Some(fw) = framework_by_key.get(&fw_key) else {
                return Err(Filter::Disconnected);
            };
            let agent_id = agent_by_key.get(&agent).map(String::as_str);
            let held = holds.held_for_other(agent, fw_key, now);
            // A GPU demand fits only an agent with a device that can hold it (docs/devices.md).
            (facts.feasible)(fw, agent_id, held, &|demand| devices.fits(agent, demand))
        };
        // Already waiting for victims to end somewhere.
        let waiting = |fw: FrameworkKey| holds.waiting(fw, now).is_some();
        // Preemption checks the devices per device: the victims' bindings released on a copy of
        // the agent's device state, the demand's request fitted there (docs/priorities.md).
        let device_check = |agent: AgentKey, demand: &Resources, victims: &[&T]| {
            let bindings = victims.iter().filter_map(|t| (facts.binding)(t));
            devices.fits_after_release(agent, demand, bindings)
        };
        // The free cpu and memory of every agent with devices, kept as they change: checked
        // against the cluster in debug builds, never rebuilt here (no pass over every agent).
        debug_assert_eq!(*device_free, device_free_of(cluster, devices));
        let fragment_growth = target.as_ref().map(|target| {
            DeviceFragmentScore::new(target, devices, device_free, config.devices.selection)
        });
        // The requests are the real pending demands; the balance placer weighs what blocks them.
        let demand_grade = DeviceBook::demand_grade;
        let mut context = PlacementContext::new(config.balance.clone()).with_grade(&demand_grade);
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
            // Without any user priority every copy runs at base: nothing to count.
            quotas: config.priorities.has_grants().then_some(Quotas {
                config: &config.priorities,
                ledger: &self.ledger,
                owners: facts.owners,
            }),
        };
        let outcome = run_cycle(cluster, drf, requests, &input, &mut context);
        drop(context);
        // The granted agents were taken from.
        for grant in &outcome.grants {
            note_free_in(device_free, cluster, devices, grant.agent);
        }
        outcome
    }

    // --- reads ---

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn holds(&self) -> &Holds<Instant> {
        &self.holds
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

    /// Which GPU a slice is bound to when devices are packed: the last cycle's target's
    /// [`ShareFill`] (the one its ring score assumed); each offer keeps the one it was made with.
    pub fn share_fill(&self) -> Arc<ShareFill> {
        Arc::clone(&self.share_fill)
    }

    /// The `disk` (milli) withheld from the agent ([`bound_free_disk`](Self::bound_free_disk)).
    pub fn withheld(&self, key: AgentKey) -> u64 {
        self.withheld.get(&key).copied().unwrap_or(0)
    }

    /// The `disk` (milli) withheld from every agent.
    pub fn withheld_total(&self) -> u64 {
        self.withheld_total
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

/// `milli` of `disk` as a bundle (empty when 0).
pub(crate) fn disk(milli: u64) -> Resources {
    let mut r = Resources::new();
    r.set_milli(DISK, milli);
    r
}

/// An agent's free cpu and memory as the fragment score reads them.
fn cpu_mem_free(free: &Resources) -> CpuMemFree {
    CpuMemFree {
        cpu_milli: free.milli("cpus"),
        memory_mib: free.milli("mem") / MILLI,
    }
}

/// Records the agent's free cpu and memory in `device_free` if it has devices, else forgets it.
fn note_free_in(
    device_free: &mut HashMap<AgentKey, CpuMemFree>,
    cluster: &Cluster,
    devices: &DeviceBook,
    key: AgentKey,
) {
    match (devices.state(key), cluster.agent(key)) {
        (Some(_), Some(agent)) => {
            device_free.insert(key, cpu_mem_free(&agent.free));
        }
        _ => {
            device_free.remove(&key);
        }
    }
}

/// `device_free` rebuilt from the cluster: what it must equal between runs (checked in debug
/// builds).
fn device_free_of(cluster: &Cluster, devices: &DeviceBook) -> HashMap<AgentKey, CpuMemFree> {
    devices
        .agents()
        .filter_map(|key| Some((key, cpu_mem_free(&cluster.agent(key)?.free))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_core::devices::BoundDevice;
    use ringmaster_core::placement::ring_set::UNGRADED;
    use ringmaster_core::placement::Request;
    use ringmaster_proto::devices::{parse_agent_resources, DeviceRequest};

    fn res(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    fn allocator() -> Allocator {
        Allocator::new(&Config::default())
    }

    /// An allocator with agent `a1` (two 16 GiB GPUs) and framework `f1`.
    fn with_gpu_agent() -> (Allocator, AgentKey, FrameworkKey) {
        let mut alloc = allocator();
        let (total, devices) = parse_agent_resources("cpus:8;mem:4096;gpus:2x16384").unwrap();
        let (agent, refused) = alloc.add_agent("a1", total, devices);
        refused.unwrap();
        let fw = alloc.add_framework("f1", 1.0);
        (alloc, agent, fw)
    }

    fn allocation(alloc: &Allocator, fw: FrameworkKey) -> Resources {
        alloc.drf().allocation(fw).cloned().unwrap_or_default()
    }

    /// The free cpu and memory the fragment score reads are kept through every change of an
    /// agent with devices, equal to what a pass over the cluster would find.
    #[test]
    fn the_kept_free_cpu_and_memory_follow_every_change() {
        let (mut alloc, agent, fw) = with_gpu_agent();
        let (plain, _) = alloc.add_agent("a2", res("cpus:4;mem:1024"), Vec::new());
        let kept = |alloc: &Allocator| {
            assert_eq!(
                alloc.device_free,
                device_free_of(&alloc.cluster, &alloc.devices)
            );
            alloc.device_free.get(&agent).copied()
        };
        assert_eq!(kept(&alloc).map(|f| f.cpu_milli), Some(8000));
        let slice = res("cpus:2;mem:512;gpu_milli:500");
        alloc.offer_taken(agent, fw, &slice).unwrap();
        assert_eq!(
            kept(&alloc).map(|f| (f.cpu_milli, f.memory_mib)),
            Some((6000, 3584))
        );
        alloc.offer_returned(Some(agent), Some(fw), &slice);
        alloc.hold(agent, Some(fw), &slice, None);
        assert_eq!(kept(&alloc).map(|f| f.cpu_milli), Some(6000));
        alloc.release(Some(agent), Some(fw), &slice, &DeviceBinding::default());
        assert_eq!(kept(&alloc).map(|f| f.cpu_milli), Some(8000));
        // A cycle's whole-agent grant empties the agent.
        let mut requests = vec![request(fw, "cpus:1;mem:128;gpu_milli:200")];
        let facts = CycleFacts::<u32> {
            now: Instant::now(),
            feasible: &|_, _, _, fits: &dyn Fn(&Resources) -> bool| {
                fits(&res("gpu_milli:200"))
                    .then_some(())
                    .ok_or(Filter::Devices)
            },
            running: &Vec::new,
            binding: &|_| None,
            owners: &[],
        };
        alloc.launched(TaskShape::of_demand(&res("cpus:1;gpu_milli:200")).unwrap());
        let outcome = alloc.run(&mut requests, &Config::default(), &facts);
        assert_eq!(outcome.grants.first().map(|g| g.agent), Some(agent));
        assert_eq!(kept(&alloc).map(|f| f.cpu_milli), Some(0));
        assert!(
            !alloc.device_free.contains_key(&plain),
            "an agent without devices is not kept"
        );
        alloc.remove_agent(agent);
        assert_eq!(kept(&alloc), None);
    }

    /// The agent's grade in the `gpu_milli` ring follows its devices: 4 while a device is
    /// entirely free, else the quarter of a GPU its emptiest device has free.
    #[test]
    fn holding_and_releasing_devices_regrades_the_agent() {
        let (mut alloc, agent, fw) = with_gpu_agent();
        let grade = |alloc: &Allocator| alloc.cluster().ring(GPU_MILLI).unwrap().grade(agent);
        assert_eq!(grade(&alloc), 4);
        let bound = |index: u32, share: u32| DeviceBinding {
            devices: vec![BoundDevice {
                index,
                share,
                memory_mib: 1024,
            }],
        };
        let slice = res("cpus:1;mem:128;gpu_milli:700;gpu_mem:1024");
        alloc.hold(agent, Some(fw), &slice, Some(&bound(0, 700)));
        assert_eq!(grade(&alloc), 4, "device 1 is still entirely free");
        let whole = res("cpus:1;mem:128;gpu_milli:1000;gpu_mem:1024");
        alloc.hold(agent, Some(fw), &whole, Some(&bound(1, 1000)));
        assert_eq!(grade(&alloc), 1, "300 milli left on device 0");
        alloc.release(Some(agent), Some(fw), &slice, &bound(0, 700));
        assert_eq!(grade(&alloc), 4);
        // A slice bigger than a quarter is asked at grade 2: the walk skips agents graded 0–1.
        assert_eq!(DeviceBook::demand_grade(&res("gpu_milli:600")), 2);
        alloc.remove_agent(agent);
        assert_eq!(
            alloc.cluster().ring(GPU_MILLI).unwrap().grade(agent),
            UNGRADED
        );
    }

    #[test]
    fn holding_then_releasing_a_task_restores_free_share_and_devices() {
        let (mut alloc, agent, fw) = with_gpu_agent();
        let free = alloc.cluster().agent(agent).unwrap().free.clone();
        let cluster_free = alloc.cluster().free().clone();
        let devices = alloc.devices().state(agent).unwrap().clone();
        let resources = res("cpus:1;mem:128;gpu_milli:500");
        let request = DeviceRequest::from_scalars(&resources, Vec::new())
            .unwrap()
            .unwrap();
        let binding = devices
            .select(&request, Config::default().devices.selection)
            .unwrap();

        let problems = alloc.hold(agent, Some(fw), &resources, Some(&binding));
        assert!(problems.clamped.is_none() && problems.devices.is_none());
        assert_eq!(
            alloc.cluster().agent(agent).unwrap().free,
            free.saturating_sub(&resources)
        );
        assert_eq!(allocation(&alloc, fw), resources);
        assert!(alloc.drf().share(fw, alloc.cluster().total()) > 0.0);
        assert_ne!(alloc.devices().state(agent).unwrap(), &devices);

        alloc.release(Some(agent), Some(fw), &resources, &binding);
        assert_eq!(alloc.cluster().agent(agent).unwrap().free, free);
        assert_eq!(alloc.cluster().free(), &cluster_free);
        assert!(allocation(&alloc, fw).is_empty());
        assert_eq!(alloc.drf().share(fw, alloc.cluster().total()), 0.0);
        assert_eq!(alloc.devices().state(agent).unwrap(), &devices);
    }

    #[test]
    fn a_hold_beyond_the_agents_free_clamps_it_to_zero() {
        let mut alloc = allocator();
        let (agent, _) = alloc.add_agent("a1", res("cpus:2;mem:1024"), Vec::new());
        let fw = alloc.add_framework("f1", 1.0);
        let problems = alloc.hold(agent, Some(fw), &res("cpus:4;mem:512"), None);
        assert!(problems.clamped.is_some());
        assert!(alloc.cluster().agent(agent).unwrap().free.is_empty());
        assert!(alloc.cluster().free().is_empty());
    }

    #[test]
    fn a_hold_of_a_gone_framework_touches_only_the_agent() {
        let mut alloc = allocator();
        let (agent, _) = alloc.add_agent("a1", res("cpus:2;mem:1024"), Vec::new());
        let resources = res("cpus:1;mem:256");
        alloc.hold(agent, None, &resources, None);
        assert_eq!(alloc.cluster().free(), &res("cpus:1;mem:768"));
        alloc.release(Some(agent), None, &resources, &DeviceBinding::default());
        assert_eq!(alloc.cluster().free(), &res("cpus:2;mem:1024"));
    }

    #[test]
    fn removing_an_agent_drops_it_from_every_book() {
        let (mut alloc, agent, _) = with_gpu_agent();
        assert_eq!(alloc.agent_id(agent), Some("a1"));
        assert!(alloc.devices().state(agent).is_some());
        alloc.remove_agent(agent);
        assert!(alloc.cluster().agent(agent).is_none());
        assert!(alloc.devices().state(agent).is_none());
        assert_eq!(alloc.devices().agents().count(), 0);
        assert_eq!(alloc.agent_id(agent), None);
        assert!(alloc.cluster().total().is_empty());
        assert!(alloc.cluster().free().is_empty());
    }

    #[test]
    fn an_agent_whose_devices_are_refused_is_still_admitted_without_devices() {
        let mut alloc = allocator();
        let bad = vec![
            Device {
                index: 0,
                model: "V100M16".into(),
                memory_mib: 16384,
            };
            2
        ];
        let (agent, refused) = alloc.add_agent("a1", res("cpus:2;mem:1024"), bad);
        assert!(refused.is_err());
        assert_eq!(alloc.agent_id(agent), Some("a1"));
        assert!(alloc.cluster().agent(agent).is_some());
        assert!(alloc.devices().state(agent).is_none());
    }

    #[test]
    fn an_offer_taken_then_returned_restores_the_cluster_and_drf() {
        let mut alloc = allocator();
        let (agent, _) = alloc.add_agent("a1", res("cpus:4;mem:2048"), Vec::new());
        let fw = alloc.add_framework("f1", 1.0);
        let offered = res("cpus:3;mem:1024");
        alloc.offer_taken(agent, fw, &offered).unwrap();
        assert_eq!(alloc.cluster().free(), &res("cpus:1;mem:1024"));
        assert_eq!(allocation(&alloc, fw), offered);
        // Too much: neither book moves.
        assert!(alloc.offer_taken(agent, fw, &res("cpus:2")).is_err());
        assert_eq!(alloc.cluster().free(), &res("cpus:1;mem:1024"));
        assert_eq!(allocation(&alloc, fw), offered);
        alloc.offer_returned(Some(agent), Some(fw), &offered);
        assert_eq!(alloc.cluster().free(), &res("cpus:4;mem:2048"));
        assert!(allocation(&alloc, fw).is_empty());
    }

    /// Reported free disk bounds the agent's free: the rest is withheld (charged to nobody),
    /// given back as room is reported, never above the total even after a clamped hold, and
    /// gone with the agent.
    #[test]
    fn reported_free_disk_withholds_and_gives_back_within_the_total() {
        let mut alloc = allocator();
        let (agent, _) = alloc.add_agent("a1", res("cpus:2;disk:1000"), Vec::new());
        let free = |alloc: &Allocator| alloc.cluster().agent(agent).unwrap().free.clone();
        assert_eq!(alloc.bound_free_disk(agent, 0), (0, 1_000_000));
        assert_eq!(free(&alloc), res("cpus:2"));
        assert_eq!(alloc.withheld_total(), 1_000_000);
        assert_eq!(alloc.bound_free_disk(agent, 0), (1_000_000, 1_000_000));
        assert_eq!(alloc.bound_free_disk(agent, 400_000), (1_000_000, 600_000));
        assert_eq!(free(&alloc), res("cpus:2;disk:400"));
        // A clamped hold (more disk than is free) overcounts the books by 400.
        let fw = alloc.add_framework("f1", 1.0);
        let task = res("cpus:2;disk:800");
        assert!(alloc.hold(agent, Some(fw), &task, None).clamped.is_some());
        alloc.release(Some(agent), Some(fw), &task, &DeviceBinding::default());
        assert_eq!(free(&alloc), res("cpus:2;disk:800"));
        // Free 800 and withheld 600 exceed the total: giving back stops at the total.
        assert_eq!(alloc.bound_free_disk(agent, 1_000_000), (600_000, 0));
        assert_eq!(free(&alloc), res("cpus:2;disk:1000"));
        assert_eq!(alloc.withheld_total(), 0);
        assert!(allocation(&alloc, fw).is_empty());
        // Withheld disk leaves with the agent; the next agent under its key starts clean.
        assert_eq!(alloc.bound_free_disk(agent, 100_000), (0, 900_000));
        alloc.remove_agent(agent);
        assert_eq!((alloc.withheld(agent), alloc.withheld_total()), (0, 0));
        let (next, _) = alloc.add_agent("a2", res("cpus:1;disk:10"), Vec::new());
        assert_eq!(next, agent);
        assert_eq!(alloc.withheld(next), 0);
        assert_eq!(alloc.cluster().free(), &res("cpus:1;disk:10"));
        // An agent without disk withholds nothing.
        let (plain, _) = alloc.add_agent("a3", res("cpus:1"), Vec::new());
        assert_eq!(alloc.bound_free_disk(plain, 0), (0, 0));
    }

    #[test]
    fn frameworks_get_fresh_keys_and_leave_drf_with_their_key() {
        let mut alloc = allocator();
        let a = alloc.add_framework("fa", 1.0);
        let b = alloc.add_framework("fb", 2.0);
        assert_ne!(a, b);
        assert_eq!(alloc.framework_id(a), Some("fa"));
        assert_eq!(alloc.drf().weight(b), Some(2.0));
        alloc.set_weight(b, 3.0);
        assert_eq!(alloc.drf().weight(b), Some(3.0));
        alloc.suppress(a);
        assert!(alloc.drf().is_suppressed(a));
        alloc.revive(a);
        assert!(!alloc.drf().is_suppressed(a));
        alloc.remove_framework(a);
        assert!(!alloc.drf().contains(a));
        assert_eq!(alloc.framework_id(a), None);
        // Keys are never reused.
        let c = alloc.add_framework("fa", 1.0);
        assert!(c != a && c != b);
    }

    #[test]
    fn quota_starts_and_ends_in_the_ledger() {
        let mut alloc = allocator();
        let r = res("cpus:2;mem:512");
        alloc.start_quota("alice", "default", &r);
        assert_eq!(alloc.ledger().used("alice", "default"), r);
        alloc.end_quota("alice", "default", &r);
        assert!(alloc.ledger().used("alice", "default").is_empty());
    }

    fn request(fw: FrameworkKey, demand: &str) -> TieredRequest {
        TieredRequest {
            priority: Config::default().priorities.base(),
            request: Request {
                framework: fw,
                demand: res(demand),
                count: 1,
            },
        }
    }

    #[test]
    fn a_run_grants_a_feasible_agent_and_books_the_grant() {
        let mut alloc = allocator();
        let (a1, _) = alloc.add_agent("a1", res("cpus:4;mem:2048"), Vec::new());
        let (a2, _) = alloc.add_agent("a2", res("cpus:4;mem:2048"), Vec::new());
        let fw = alloc.add_framework("f1", 1.0);
        let asked = std::cell::RefCell::new(Vec::new());
        // Only a2 is allowed; the facts see the master's ids.
        let feasible = |f: &str, agent: Option<&str>, _: bool, _: &dyn Fn(&Resources) -> bool| {
            asked
                .borrow_mut()
                .push((f.to_string(), agent.map(str::to_string)));
            match agent {
                Some("a2") => Ok(()),
                _ => Err(Filter::Disconnected),
            }
        };
        let facts = CycleFacts::<u32> {
            now: Instant::now(),
            feasible: &feasible,
            running: &Vec::new,
            binding: &|_| None,
            owners: &[],
        };
        let mut requests = vec![request(fw, "cpus:1;mem:128")];
        let outcome = alloc.run(&mut requests, &Config::default(), &facts);
        assert_eq!(outcome.grants.len(), 1);
        let grant = &outcome.grants[0];
        assert_eq!((grant.framework, grant.agent), (fw, a2));
        assert!(asked.borrow().iter().all(|(f, _)| f == "f1"));
        // Whole-agent grants: a2's free is all taken and on f1's allocation.
        assert!(alloc.cluster().agent(a2).unwrap().free.is_empty());
        assert_eq!(
            alloc.cluster().agent(a1).unwrap().free,
            res("cpus:4;mem:2048")
        );
        assert_eq!(allocation(&alloc, fw), res("cpus:4;mem:2048"));
        assert_eq!(grant.resources, res("cpus:4;mem:2048"));
    }
}
