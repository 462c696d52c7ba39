//! User priorities, priority quotas, partitions and preemption (SPEC seed 003), as pure code.
//!
//! Operators give each user, per partition (a named group of agents), a priority and a priority
//! quota. A task runs at its user's priority while its resources fit what is left of that quota
//! in its partition (quota − resources of the user's tasks already running at that priority
//! there), else at the base priority, below every user's. A demand that fits nowhere may evict
//! running tasks of strictly lower priority — on one agent — chosen by [`plan_preemption`].
//!
//! No I/O and no clock: the master, the dry-run and tests feed the same functions, so "what
//! would happen if…" gives the answer the master would give. Start order is a caller-given
//! sequence number, not a time.

use std::collections::BTreeMap;

use super::{AgentKey, Cluster, Resources};

/// A priority: higher is more important.
pub type Priority = i64;

/// The partition of agents and frameworks that name none.
pub const DEFAULT_PARTITION: &str = "default";

/// One user's rights in one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserGrant {
    pub priority: Priority,
    /// Resources the user may hold at `priority` in the partition at once.
    pub quota: Resources,
}

/// Why a [`PriorityConfig`] was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PriorityConfigError {
    #[error("partition {partition:?} is not among the partitions {known:?}")]
    UnknownPartition {
        user: String,
        partition: String,
        known: Vec<String>,
    },
    #[error("priority {priority} must be above the base priority {base}")]
    NotAboveBase {
        user: String,
        partition: String,
        priority: Priority,
        base: Priority,
    },
    #[error("partition {0:?} is listed twice")]
    DuplicatePartition(String),
    #[error("partition names are non-empty, without spaces or control characters: {0:?}")]
    BadPartitionName(String),
}

/// The operator's priority settings. The default has no users: every task runs at base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityConfig {
    base: Priority,
    partitions: Vec<String>,
    users: BTreeMap<String, BTreeMap<String, UserGrant>>,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig {
            base: PriorityConfig::DEFAULT_BASE,
            partitions: vec![DEFAULT_PARTITION.to_string()],
            users: BTreeMap::new(),
        }
    }
}

impl PriorityConfig {
    /// The default's base priority, without building a default (which allocates its
    /// partition list): a cycle that needs only the base reads this.
    pub const DEFAULT_BASE: Priority = 0;

    /// Checks the settings: every user partition is listed (an empty list means only
    /// `default`), every user priority is above `base`.
    pub fn new(
        base: Priority,
        partitions: Vec<String>,
        users: BTreeMap<String, BTreeMap<String, UserGrant>>,
    ) -> Result<Self, PriorityConfigError> {
        let partitions = if partitions.is_empty() {
            vec![DEFAULT_PARTITION.to_string()]
        } else {
            partitions
        };
        for (i, p) in partitions.iter().enumerate() {
            if p.is_empty() || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(PriorityConfigError::BadPartitionName(p.clone()));
            }
            if partitions[..i].contains(p) {
                return Err(PriorityConfigError::DuplicatePartition(p.clone()));
            }
        }
        for (user, grants) in &users {
            for (partition, grant) in grants {
                if !partitions.contains(partition) {
                    return Err(PriorityConfigError::UnknownPartition {
                        user: user.clone(),
                        partition: partition.clone(),
                        known: partitions.clone(),
                    });
                }
                if grant.priority <= base {
                    return Err(PriorityConfigError::NotAboveBase {
                        user: user.clone(),
                        partition: partition.clone(),
                        priority: grant.priority,
                        base,
                    });
                }
            }
        }
        Ok(PriorityConfig {
            base,
            partitions,
            users,
        })
    }

    pub fn base(&self) -> Priority {
        self.base
    }

    pub fn partitions(&self) -> &[String] {
        &self.partitions
    }

    /// The user's priority and quota in the partition, if the operator gave any.
    /// True when some user has a priority somewhere (else every task runs at base).
    pub fn has_grants(&self) -> bool {
        self.users.values().any(|grants| !grants.is_empty())
    }

    pub fn grant(&self, user: &str, partition: &str) -> Option<&UserGrant> {
        self.users.get(user)?.get(partition)
    }
}

/// Resources each user holds at user priority, per partition: what counts against quotas.
///
/// Callers record a task with [`start`](QuotaLedger::start) when it is launched at user
/// priority and [`end`](QuotaLedger::end) when it ends; base-priority tasks are not recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaLedger {
    used: BTreeMap<(String, String), Resources>,
}

impl QuotaLedger {
    /// What the user holds at user priority in the partition.
    pub fn used(&self, user: &str, partition: &str) -> Resources {
        self.used
            .get(&(user.to_string(), partition.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    pub fn start(&mut self, user: &str, partition: &str, resources: &Resources) {
        let slot = self
            .used
            .entry((user.to_string(), partition.to_string()))
            .or_default();
        for (name, m) in resources.iter() {
            let sum = slot.milli(name).saturating_add(m);
            slot.set_milli(name, sum);
        }
    }

    /// Gives back what [`start`](QuotaLedger::start) took (clamped at zero).
    pub fn end(&mut self, user: &str, partition: &str, resources: &Resources) {
        let key = (user.to_string(), partition.to_string());
        if let Some(slot) = self.used.get_mut(&key) {
            *slot = slot.saturating_sub(resources);
            if slot.is_empty() {
                self.used.remove(&key);
            }
        }
    }
}

/// How many copies of `demand` still fit `user`'s remaining priority quota in `partition`
/// (at most `copies`), so they run at the user's priority: 0 when the user has no priority
/// there or the first copy is already over quota. Only the dimensions the quota names count.
/// [`task_priority`]'s rule for a run of copies, without its words.
pub fn copies_at_user_priority(
    config: &PriorityConfig,
    ledger: &QuotaLedger,
    user: &str,
    partition: &str,
    demand: &Resources,
    copies: u64,
) -> u64 {
    let Some(grant) = config.grant(user, partition) else {
        return 0;
    };
    let used = ledger.used(user, partition);
    demand
        .iter()
        .filter(|&(name, need)| need > 0 && grant.quota.milli(name) > 0)
        .map(|(name, need)| grant.quota.milli(name).saturating_sub(used.milli(name)) / need)
        .fold(copies, u64::min)
}

/// A task's priority and how it was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPriority {
    pub priority: Priority,
    /// True when the task runs at its user's priority (and so counts against the quota).
    pub at_user_priority: bool,
    /// Why, e.g. `over priority quota in partition gpu: running 6 of 8 gpus, task needs 4 → base priority`.
    pub reason: String,
}

/// The SPEC's rule: the user's priority if `resources` fit the user's remaining quota in
/// `partition` (quota − `ledger`'s usage there), else the base priority. Only the dimensions
/// the quota names count: a `gpus:4` quota does not limit cpus.
pub fn task_priority(
    config: &PriorityConfig,
    ledger: &QuotaLedger,
    user: &str,
    partition: &str,
    resources: &Resources,
) -> TaskPriority {
    let base = |reason: String| TaskPriority {
        priority: config.base,
        at_user_priority: false,
        reason,
    };
    let Some(grant) = config.grant(user, partition) else {
        return base(format!(
            "user {user:?} has no priority in partition {partition} → base priority"
        ));
    };
    let used = ledger.used(user, partition);
    let remaining = grant.quota.saturating_sub(&used);
    // Dimensions the quota does not name are not limited by it (`gpus:4` says nothing of cpus).
    let limited = |name: &str| grant.quota.milli(name) > 0;
    let short = resources
        .iter()
        .find(|(name, m)| limited(name) && remaining.milli(name) < *m)
        .map(|(name, _)| name.to_string());
    let Some(short) = short else {
        return TaskPriority {
            priority: grant.priority,
            at_user_priority: true,
            reason: format!(
                "within priority quota in partition {partition}: running {used} of {quota}, task needs {resources} → priority {p}",
                used = display(&used),
                quota = grant.quota,
                p = grant.priority
            ),
        };
    };
    // Name the first dimension that does not fit, as people read quotas per resource.
    let one = |r: &Resources| {
        let only = Resources::from_milli([(short.as_str(), r.milli(&short))]).unwrap_or_default();
        display(&only)
    };
    base(format!(
        "over priority quota in partition {partition}: running {} of {}, task needs {} → base priority",
        one(&used),
        one(&grant.quota),
        one(resources)
    ))
}

fn display(r: &Resources) -> String {
    if r.is_empty() {
        "nothing".to_string()
    } else {
        r.to_string()
    }
}

/// A running task as preemption sees it; `id` is the caller's handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningTask<T> {
    pub id: T,
    pub agent: AgentKey,
    pub priority: Priority,
    /// Start order: larger started later.
    pub started: u64,
    pub resources: Resources,
}

/// Which tasks to evict, all on one agent, so the demand fits there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreemptionPlan<T> {
    pub agent: AgentKey,
    /// In eviction order: lowest priority first, then most recently started first.
    pub victims: Vec<T>,
}

/// How a candidate agent's eviction set ranks; smaller is better. See [`plan_preemption`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    victims: usize,
    max_priority: Priority,
    sum_priority: i128,
    /// Negated earliest start among the victims: the set whose oldest victim started latest
    /// loses the least work.
    neg_earliest_start: i128,
    agent: AgentKey,
}

/// The device side of a preemption plan: does `demand` fit `agent`'s devices once the device
/// bindings of `victims` (ids of running tasks there) are given back? True for a demand without
/// GPU scalars; on an agent without a device list, whole GPUs are a plain scalar the resource
/// check decides (true) and a GPU slice never fits. The master answers from its device book
/// (simulating the release on a copy of the agent's [`DeviceState`](crate::devices::DeviceState));
/// a caller without devices passes [`no_devices`].
pub type DeviceCheck<'a, T> = &'a dyn Fn(AgentKey, &Resources, &[&T]) -> bool;

/// The [`DeviceCheck`] of a caller that tracks no devices: the scalars decide.
pub fn no_devices<T>(_: AgentKey, _: &Resources, _: &[&T]) -> bool {
    true
}

/// Picks the agent and victims that let `demand` at `priority` run, or `None`.
///
/// On every agent `eligible` accepts whose total can hold the demand, the candidates are the
/// running tasks there of strictly lower priority, taken lowest priority first and, among
/// equals, most recently started first, until the agent's free resources plus what they hold
/// contain the demand. Among agents where that succeeds, the plan with, in order, the fewest
/// victims, the lowest highest victim priority, the lowest sum of victim priorities, the latest
/// earliest victim start, then the lowest agent key wins. An agent where the demand already fits
/// needs no preemption: callers place there instead, so `None` is not returned for it but a
/// plan with no victims. Scalars only: see [`plan_preemption_with`] for devices.
pub fn plan_preemption<T: Clone>(
    cluster: &Cluster,
    demand: &Resources,
    priority: Priority,
    running: &[RunningTask<T>],
    eligible: &dyn Fn(AgentKey) -> bool,
) -> Option<PreemptionPlan<T>> {
    plan_preemption_with(cluster, demand, priority, running, eligible, &no_devices)
}

/// [`plan_preemption`] where the demand must also fit per device: candidates are taken in the
/// same order until the freed scalars contain the demand *and* `devices` says the agent's
/// devices, with the victims' bindings released, hold it (summed GPU counters cannot tell two
/// half-used GPUs from a free one). Victims taken only for the devices' sake are then pruned:
/// latest-taken first, a victim whose release the rest do not need is kept running, so the plan
/// is minimal (no victim can be spared) while still preferring low priority and late start.
pub fn plan_preemption_with<T: Clone>(
    cluster: &Cluster,
    demand: &Resources,
    priority: Priority,
    running: &[RunningTask<T>],
    eligible: &dyn Fn(AgentKey) -> bool,
    devices: DeviceCheck<'_, T>,
) -> Option<PreemptionPlan<T>> {
    let mut by_agent: BTreeMap<AgentKey, Vec<&RunningTask<T>>> = BTreeMap::new();
    for task in running {
        if task.priority < priority {
            by_agent.entry(task.agent).or_default().push(task);
        }
    }
    let mut best: Option<(Cost, PreemptionPlan<T>)> = None;
    for (key, entry) in cluster.agents() {
        if !eligible(key) || !entry.total.contains(demand) {
            continue;
        }
        let room_with = |victims: &[&RunningTask<T>]| {
            let mut room = entry.free.clone();
            for task in victims {
                for (name, m) in task.resources.iter() {
                    let sum = room.milli(name).saturating_add(m);
                    room.set_milli(name, sum);
                }
            }
            room
        };
        let devices_fit = |victims: &[&RunningTask<T>]| {
            let ids: Vec<&T> = victims.iter().map(|t| &t.id).collect();
            devices(key, demand, &ids)
        };
        let mut room = entry.free.clone();
        let mut victims: Vec<&RunningTask<T>> = Vec::new();
        // Victims taken while the scalars already fit: taken for the devices only.
        let mut scalars_fit_at: Option<usize> = None;
        let mut candidates = by_agent.remove(&key).unwrap_or_default();
        candidates.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.started.cmp(&a.started)));
        let mut candidates = candidates.into_iter();
        let fits = loop {
            if room.contains(demand) {
                scalars_fit_at.get_or_insert(victims.len());
                if devices_fit(&victims) {
                    break true;
                }
            }
            let Some(task) = candidates.next() else {
                break false;
            };
            for (name, m) in task.resources.iter() {
                let sum = room.milli(name).saturating_add(m);
                room.set_milli(name, sum);
            }
            victims.push(task);
        };
        if !fits {
            continue;
        }
        if scalars_fit_at.is_some_and(|at| at < victims.len()) {
            let mut i = victims.len();
            while i > 0 {
                i -= 1;
                let mut fewer = victims.clone();
                fewer.remove(i);
                if room_with(&fewer).contains(demand) && devices_fit(&fewer) {
                    victims = fewer;
                }
            }
        }
        let cost = Cost {
            victims: victims.len(),
            max_priority: victims
                .iter()
                .map(|t| t.priority)
                .max()
                .unwrap_or(Priority::MIN),
            sum_priority: victims.iter().map(|t| i128::from(t.priority)).sum(),
            neg_earliest_start: -victims
                .iter()
                .map(|t| i128::from(t.started))
                .min()
                .unwrap_or(i128::from(u64::MAX)),
            agent: key,
        };
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((
                cost,
                PreemptionPlan {
                    agent: key,
                    victims: victims.into_iter().map(|t| t.id.clone()).collect(),
                },
            ));
        }
    }
    best.map(|(_, plan)| plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{PlacerKind, RingsConfig};

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    fn config(users: &[(&str, &str, Priority, &str)]) -> PriorityConfig {
        let mut map: BTreeMap<String, BTreeMap<String, UserGrant>> = BTreeMap::new();
        for (user, partition, priority, quota) in users {
            map.entry(user.to_string()).or_default().insert(
                partition.to_string(),
                UserGrant {
                    priority: *priority,
                    quota: r(quota),
                },
            );
        }
        PriorityConfig::new(0, vec!["default".into(), "gpu".into()], map).unwrap()
    }

    /// SPEC seed 003, first example: t1(user1, 2), t2(user1, 4), t3(user2, 4), t4(user2, 6)
    /// with user1 p0 quota 4 and user2 p1 quota 8 get p0, base, p1, base.
    #[test]
    fn seed_example_priorities() {
        let (p0, p1) = (10, 20);
        let cfg = config(&[
            ("user1", "default", p0, "gpus:4"),
            ("user2", "default", p1, "gpus:8"),
        ]);
        let mut ledger = QuotaLedger::default();
        let mut got = Vec::new();
        for (user, gpus) in [("user1", 2), ("user1", 4), ("user2", 4), ("user2", 6)] {
            let need = r(&format!("gpus:{gpus}"));
            let p = task_priority(&cfg, &ledger, user, "default", &need);
            if p.at_user_priority {
                ledger.start(user, "default", &need);
            }
            got.push(p.priority);
        }
        assert_eq!(got, vec![p0, 0, p1, 0]);
        assert_eq!(ledger.used("user1", "default"), r("gpus:2"));
        assert_eq!(ledger.used("user2", "default"), r("gpus:4"));
    }

    /// Quota comes back when a task at user priority ends.
    #[test]
    fn quota_returns_when_tasks_end() {
        let cfg = config(&[("alice", "gpu", 5, "gpus:4")]);
        let mut ledger = QuotaLedger::default();
        let four = r("gpus:4");
        let first = task_priority(&cfg, &ledger, "alice", "gpu", &four);
        assert!(first.at_user_priority);
        ledger.start("alice", "gpu", &four);
        let second = task_priority(&cfg, &ledger, "alice", "gpu", &r("gpus:1"));
        assert_eq!(second.priority, 0);
        assert_eq!(
            second.reason,
            "over priority quota in partition gpu: running gpus:4 of gpus:4, task needs gpus:1 → base priority"
        );
        ledger.end("alice", "gpu", &four);
        assert_eq!(ledger.used("alice", "gpu"), Resources::new());
        assert_eq!(
            task_priority(&cfg, &ledger, "alice", "gpu", &four).priority,
            5
        );
        // Dimensions the quota does not name are not limited.
        let p = task_priority(&cfg, &ledger, "alice", "gpu", &r("cpus:64;gpus:4"));
        assert!(p.at_user_priority, "{}", p.reason);
        // Another partition, or another user, has its own quota (or none).
        assert_eq!(
            task_priority(&cfg, &ledger, "alice", "default", &four).priority,
            0
        );
        assert_eq!(
            task_priority(&cfg, &ledger, "bob", "gpu", &four).priority,
            0
        );
    }

    fn task(
        id: &'static str,
        agent: AgentKey,
        priority: Priority,
        started: u64,
        res: &str,
    ) -> RunningTask<&'static str> {
        RunningTask {
            id,
            agent,
            priority,
            started,
            resources: r(res),
        }
    }

    /// SPEC seed 003, second example: an 8-GPU partition runs t1(user1, 4, p0) and
    /// t2(user1, 4, base); user2 (p1, quota 8) submits t3 with 9, 4 or 6 GPUs.
    #[test]
    fn seed_example_gpu_partition() {
        // "only t2 is lower" than user2's p1: the SPEC's p0 ranks above p1.
        let (p0, p1) = (20, 10);
        let cfg = config(&[
            ("user1", "gpu", p0, "gpus:4"),
            ("user2", "gpu", p1, "gpus:8"),
        ]);
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(r("gpus:8"));
        let mut ledger = QuotaLedger::default();
        let t1 = r("gpus:4");
        assert_eq!(
            task_priority(&cfg, &ledger, "user1", "gpu", &t1).priority,
            p0
        );
        ledger.start("user1", "gpu", &t1);
        assert_eq!(
            task_priority(&cfg, &ledger, "user1", "gpu", &t1).priority,
            0
        );
        cluster.take(a, &r("gpus:8")).unwrap();
        let running = [
            task("t1", a, p0, 1, "gpus:4"),
            task("t2", a, 0, 2, "gpus:4"),
        ];
        let all = |_: AgentKey| true;
        // 9 GPUs: over user2's quota → base, and base never preempts: queued.
        let nine = r("gpus:9");
        let p = task_priority(&cfg, &ledger, "user2", "gpu", &nine);
        assert_eq!(p.priority, 0);
        assert!(plan_preemption(&cluster, &nine, p.priority, &running, &all).is_none());
        // 4 GPUs: p1, preempts t2 (base) only.
        let four = r("gpus:4");
        let p = task_priority(&cfg, &ledger, "user2", "gpu", &four);
        assert_eq!(p.priority, p1);
        let plan = plan_preemption(&cluster, &four, p.priority, &running, &all).unwrap();
        assert_eq!(
            plan,
            PreemptionPlan {
                agent: a,
                victims: vec!["t2"]
            }
        );
        // 6 GPUs: p1, but only t2 is lower and frees 4: queued.
        let six = r("gpus:6");
        let p = task_priority(&cfg, &ledger, "user2", "gpu", &six);
        assert_eq!(p.priority, p1);
        assert!(plan_preemption(&cluster, &six, p.priority, &running, &all).is_none());
    }

    #[test]
    fn victims_lowest_priority_then_latest_start() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(r("cpus:8"));
        cluster.take(a, &r("cpus:8")).unwrap();
        let running = [
            task("old-low", a, 1, 1, "cpus:2"),
            task("new-low", a, 1, 5, "cpus:2"),
            task("mid", a, 2, 9, "cpus:2"),
            task("high", a, 9, 10, "cpus:2"),
        ];
        let all = |_: AgentKey| true;
        let plan = plan_preemption(&cluster, &r("cpus:2"), 5, &running, &all).unwrap();
        assert_eq!(plan.victims, vec!["new-low"]);
        let plan = plan_preemption(&cluster, &r("cpus:5"), 5, &running, &all).unwrap();
        assert_eq!(plan.victims, vec!["new-low", "old-low", "mid"]);
        // Equal priority is never a victim.
        assert!(plan_preemption(&cluster, &r("cpus:7"), 9, &running, &all).is_none());
        assert!(plan_preemption(&cluster, &r("cpus:1"), 1, &running, &all).is_none());
    }

    /// Two agents each free 2 when preempted; a demand for 4 does not fit on either, even
    /// though the cluster-wide sum would.
    #[test]
    fn victims_on_one_agent_only_and_best_agent_wins() {
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(r("cpus:4"));
        let b = cluster.add_agent(r("cpus:4"));
        let c = cluster.add_agent(r("cpus:4"));
        for k in [a, b, c] {
            cluster.take(k, &r("cpus:4")).unwrap();
        }
        let running = [
            task("a-low", a, 1, 1, "cpus:2"),
            task("a-high", a, 9, 2, "cpus:2"),
            task("b-low", b, 1, 3, "cpus:2"),
            task("b-high", b, 9, 4, "cpus:2"),
        ];
        let all = |_: AgentKey| true;
        assert!(plan_preemption(&cluster, &r("cpus:4"), 5, &running, &all).is_none());
        // Fewest victims first: a's two p2 tasks lose to one p3 task on b or c.
        let running = [
            task("a1", a, 2, 1, "cpus:2"),
            task("a2", a, 2, 2, "cpus:2"),
            task("b1", b, 3, 3, "cpus:4"),
            task("c1", c, 3, 4, "cpus:4"),
        ];
        let plan = plan_preemption(&cluster, &r("cpus:4"), 5, &running, &all).unwrap();
        // b1 and c1 tie on count and priorities; the set whose earliest victim started
        // latest wins: c1 (4) over b1 (3).
        assert_eq!(
            plan,
            PreemptionPlan {
                agent: c,
                victims: vec!["c1"]
            }
        );
        let not_c = |k: AgentKey| k != c;
        let plan = plan_preemption(&cluster, &r("cpus:4"), 5, &running, &not_c).unwrap();
        assert_eq!(plan.victims, vec!["b1"]);
        let only_a = |k: AgentKey| k == a;
        let plan = plan_preemption(&cluster, &r("cpus:4"), 5, &running, &only_a).unwrap();
        assert_eq!(plan.victims, vec!["a2", "a1"]);
        // Lower victim priority wins over equal count.
        let running = [task("b1", b, 3, 3, "cpus:4"), task("c1", c, 2, 1, "cpus:4")];
        let plan = plan_preemption(&cluster, &r("cpus:4"), 5, &running, &all).unwrap();
        assert_eq!(plan.victims, vec!["c1"]);
    }

    /// Whole GPUs on an agent whose two GPUs hold base-priority slices: the summed scalars say
    /// the demand fits already (no victims), the devices say no GPU is free. Victims are taken
    /// latest-started first until a device is free, then the ones not needed are spared.
    #[test]
    fn gpu_victims_free_a_device_and_no_more() {
        use crate::devices::{parse_agent_resources, DeviceBinding};
        use crate::placement::devices::DeviceBook;
        let (total, devices) = parse_agent_resources("cpus:8;gpus:2x16384").unwrap();
        let mut cluster = Cluster::new(RingsConfig::default(), PlacerKind::Ring);
        let a = cluster.add_agent(total);
        let mut book = DeviceBook::new();
        book.set_agent(a, devices).unwrap();
        // (id, started, binding): v1 and v3 share GPU 0, v2 has half of GPU 1.
        let slices = [
            ("v1", 3, "gpu:0:500:0"),
            ("v2", 2, "gpu:1:500:0"),
            ("v3", 1, "gpu:0:500:0"),
        ];
        let mut running = Vec::new();
        let mut bindings = BTreeMap::new();
        for (id, started, binding) in slices {
            let binding = DeviceBinding::parse(binding).unwrap();
            book.take(a, &binding).unwrap();
            cluster.take(a, &r("cpus:1;gpu_milli:500")).unwrap();
            running.push(task(id, a, 0, started, "cpus:1;gpu_milli:500"));
            bindings.insert(id, binding);
        }
        let demand = r("cpus:1;gpus:1");
        let all = |_: AgentKey| true;
        let scalars_only = plan_preemption(&cluster, &demand, 5, &running, &all).unwrap();
        assert!(scalars_only.victims.is_empty(), "the sums say it fits");
        let check = |agent: AgentKey, demand: &Resources, victims: &[&&str]| {
            book.fits_after_release(agent, demand, victims.iter().map(|id| &bindings[**id]))
        };
        // Taken: v1 (latest; GPU 0 still half used by v3), then v2 (GPU 1 free): fits. v1 is
        // not needed once v2 goes, so it keeps running.
        let plan = plan_preemption_with(&cluster, &demand, 5, &running, &all, &check).unwrap();
        assert_eq!(plan.victims, vec!["v2"]);
        // Two GPUs: every slice must go.
        let plan = plan_preemption_with(&cluster, &r("gpus:2"), 5, &running, &all, &check).unwrap();
        assert_eq!(plan.victims, vec!["v1", "v2", "v3"]);
        // Slices at or above the demand's priority are no victims.
        assert!(plan_preemption_with(&cluster, &demand, 0, &running, &all, &check).is_none());
    }

    #[test]
    fn config_checks() {
        let grant = |p| {
            BTreeMap::from([(
                "u".to_string(),
                BTreeMap::from([(
                    "gpu".to_string(),
                    UserGrant {
                        priority: p,
                        quota: r("gpus:1"),
                    },
                )]),
            )])
        };
        assert!(matches!(
            PriorityConfig::new(0, vec![], grant(1)),
            Err(PriorityConfigError::UnknownPartition { .. })
        ));
        assert!(matches!(
            PriorityConfig::new(0, vec!["gpu".into()], grant(0)),
            Err(PriorityConfigError::NotAboveBase { .. })
        ));
        assert!(PriorityConfig::new(0, vec!["gpu".into(), "gpu".into()], BTreeMap::new()).is_err());
        assert!(PriorityConfig::new(0, vec!["gpu".into()], grant(1)).is_ok());
    }
}
