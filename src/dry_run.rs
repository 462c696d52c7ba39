//! `ringmaster place`: run the placement library over a scenario file, with no master.
//!
//! It answers "where would these requests go, and why do some not fit?" with the very code the
//! master runs, the core's allocation cycle ([`run_cycle`]): the scenario's requests are
//! allocated as if each placed task were launched at once ([`Grant::Demand`]), frameworks served
//! in DRF order, cycle after cycle until one places nothing more. The output is one JSON object per line (placements, then the unplaced, then final state).
//!
//! Requests are tried in file order within a framework. With the balance placer each placement
//! line also says why (`"balance":{"weights":[…],"y_before":…,"y_after":…}`, weights in balance
//! dimension order).
//!
//! ```yaml
//! balance:                    # optional, on top of the config's (see src/config.rs)
//!   initial_weights: { cpus: 0.3333, mem: 0.3333, gpus: 0.3333 }
//!   require_improvement: true
//! rings:                      # optional, per dimension, on top of the config's
//!   cpus: { base: 0, step: 1, buckets: 16, search_up: 2 }
//! agents:
//!   - { id: a1, resources: "cpus:9;mem:18432" }
//! frameworks:
//!   - { name: A, weight: 1 }  # weight optional, default 1
//! requests:
//!   - { framework: A, resources: "cpus:1;mem:4096", count: 10 }
//! ```
//!
//! With a `priorities:` section (same shape as the config's, replacing it) or `running:` tasks,
//! the run follows SPEC seed 003 instead (docs/priorities.md): agents may name a `partition`,
//! frameworks a `user` and a `partition`; `running:` tasks (`{ id, agent, resources, user,
//! partition, priority, started }`, priority computed from the user's quota when omitted,
//! `started` defaulting to file order) hold their agents first. Then cycles run as the master
//! runs them: requests tiered by the priority their next task would get, tiers served highest
//! first and in DRF order within, then unserved demands above base preempt lower-priority tasks
//! on one agent (a `{"preempted":[…]}` line per plan, before the cycle's placements); victims end
//! at once and the agent is held for the preemptor, placed there by the next cycle. Placed copies
//! launch between cycles, in grant order, at the priority the quota ledger then gives; placement
//! lines carry the task's `id` and that `priority`.

use std::collections::HashMap;
use std::path::Path;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::config::{
    apply_balance, apply_priorities, apply_rings, whole_number, ConfigError, RawBalance,
    RawPriorities, RawRings, Seg, YamlSource,
};
use ringmaster_core::placement::feasible::{self, AgentFacts};
use ringmaster_core::placement::{
    apply_outcome, no_devices, run_cycle, task_priority, AgentKey, Allocation, BalanceSettings,
    Cluster, CycleInput, DrfSorter, Filter, FrameworkKey, Grant, Holds, PlacementContext,
    PlacerKind, Priority, PriorityConfig, QuotaLedger, Quotas, Request, Resources, RingsConfig,
    RunningTask, TieredRequest, Unserved, WhyUnplaced, DEFAULT_PARTITION,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    rings: Option<RawRings>,
    balance: Option<RawBalance>,
    priorities: Option<RawPriorities>,
    #[serde(default)]
    running: Vec<RawRunning>,
    #[serde(default)]
    agents: Vec<RawAgent>,
    #[serde(default)]
    frameworks: Vec<RawFramework>,
    #[serde(default)]
    requests: Vec<RawRequest>,
    batch: Option<crate::dry_run_batch::RawBatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    id: String,
    resources: String,
    // Batch matching scores (see dry_run_batch).
    cpu_speed: Option<serde_yaml::Value>,
    net_rate: Option<serde_yaml::Value>,
    unit_cost: Option<serde_yaml::Value>,
    partition: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunning {
    id: String,
    agent: String,
    resources: String,
    user: Option<String>,
    partition: Option<String>,
    priority: Option<i64>,
    started: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFramework {
    name: String,
    weight: Option<serde_yaml::Value>,
    user: Option<String>,
    partition: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    framework: String,
    resources: String,
    count: Option<serde_yaml::Value>,
}

/// A checked scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub rings: RingsConfig,
    pub balance: BalanceSettings,
    /// (id, total resources), in file order.
    pub agents: Vec<(String, Resources)>,
    /// (name, weight), in file order.
    pub frameworks: Vec<(String, f64)>,
    /// (index into `frameworks`, demand, count), in file order.
    pub requests: Vec<(usize, Resources, u32)>,
    /// The `batch:` section and every agent's matching profile (in `agents` order).
    pub batch: Option<(
        crate::dry_run_batch::BatchSection,
        Vec<ringmaster_core::placement::matching::AgentProfile>,
    )>,
    /// Set when the scenario uses priorities (a `priorities:` section or `running:` tasks).
    pub priorities: Option<PriorityScenario>,
}

/// The seed-003 parts of a scenario.
#[derive(Clone, Debug, Default)]
pub struct PriorityScenario {
    pub config: PriorityConfig,
    /// Partition of each agent, in `agents` order.
    pub agent_partitions: Vec<String>,
    /// (user, partition) of each framework, in `frameworks` order.
    pub framework_users: Vec<(String, String)>,
    pub running: Vec<ScenarioTask>,
    /// The master's `allocation_interval` and `offer_timeout` (how long a preemption keeps its
    /// agent): the dry-run's cycles are this far apart and its holds end by the master's rule.
    pub timing: Timing,
}

/// The master's timers the dry-run replays, in milliseconds of a logical clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub allocation_interval_ms: u64,
    pub offer_timeout_ms: u64,
}

impl Timing {
    pub fn of(master: &crate::config::MasterConfig) -> Self {
        let ms = |d: std::time::Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
        Timing {
            allocation_interval_ms: ms(master.allocation_interval).max(1),
            offer_timeout_ms: ms(master.offer_timeout),
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing::of(&crate::config::MasterConfig::default())
    }
}

/// A task already running when the scenario starts.
#[derive(Clone, Debug)]
pub struct ScenarioTask {
    pub id: String,
    /// Index into `agents`.
    pub agent: usize,
    pub resources: Resources,
    pub user: String,
    pub partition: String,
    /// `None`: computed from the user's quota, in `started` order.
    pub priority: Option<Priority>,
    pub started: u64,
}

impl Scenario {
    /// Reads a scenario; its `rings` and `balance` apply on top of the given ones.
    pub fn load(
        path: &Path,
        rings: RingsConfig,
        balance: BalanceSettings,
    ) -> Result<Scenario, ConfigError> {
        Self::load_with(path, rings, balance, &PriorityConfig::default())
    }

    /// [`load`](Scenario::load) with the config's priorities (used when the scenario has
    /// `running:` tasks but no `priorities:` section of its own).
    pub fn load_with(
        path: &Path,
        rings: RingsConfig,
        balance: BalanceSettings,
        priority_config: &PriorityConfig,
    ) -> Result<Scenario, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Scenario::from_yaml_with(&text, &file, rings, balance, priority_config)
    }

    pub fn from_yaml(
        text: &str,
        file: &str,
        rings: RingsConfig,
        balance: BalanceSettings,
    ) -> Result<Scenario, ConfigError> {
        Self::from_yaml_with(text, file, rings, balance, &PriorityConfig::default())
    }

    pub fn from_yaml_with(
        text: &str,
        file: &str,
        mut rings: RingsConfig,
        mut balance: BalanceSettings,
        priority_config: &PriorityConfig,
    ) -> Result<Scenario, ConfigError> {
        let source = YamlSource { text, file };
        let raw: RawScenario = source.parse()?;
        if let Some(raw_rings) = &raw.rings {
            apply_rings(&source, &["rings".into()], raw_rings, &mut rings)?;
        }
        if let Some(raw_balance) = &raw.balance {
            apply_balance(&source, &["balance".into()], raw_balance, &mut balance)?;
        }
        let at = |list: &str, i: usize, field: &str| -> Vec<Seg> {
            vec![list.into(), i.into(), field.into()]
        };
        let resources = |path: &[Seg], text: &str| -> Result<Resources, ConfigError> {
            Resources::parse(text).map_err(|e| source.error(path, e.to_string()))
        };

        let mut agents = Vec::with_capacity(raw.agents.len());
        let mut agent_ids: HashMap<&str, usize> = HashMap::new();
        for (i, a) in raw.agents.iter().enumerate() {
            if let Some(first) = agent_ids.insert(&a.id, i) {
                let line = crate::config::locate(text, &at("agents", first, "id"))
                    .map_or(String::new(), |l| format!(" (first on line {l})"));
                return Err(source.error(
                    &at("agents", i, "id"),
                    format!("duplicate agent id `{}`{line}", a.id),
                ));
            }
            agents.push((
                a.id.clone(),
                resources(&at("agents", i, "resources"), &a.resources)?,
            ));
        }

        let mut frameworks = Vec::with_capacity(raw.frameworks.len());
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, f) in raw.frameworks.iter().enumerate() {
            if names.insert(&f.name, i).is_some() {
                return Err(source.error(
                    &at("frameworks", i, "name"),
                    format!("duplicate framework `{}`", f.name),
                ));
            }
            let weight = match &f.weight {
                None => 1.0,
                Some(v) => match v.as_f64() {
                    Some(w) if w.is_finite() && w > 0.0 => w,
                    _ => {
                        return Err(source.error(
                            &at("frameworks", i, "weight"),
                            "weight must be a number greater than 0",
                        ))
                    }
                },
            };
            frameworks.push((f.name.clone(), weight));
        }

        let mut requests = Vec::with_capacity(raw.requests.len());
        for (i, r) in raw.requests.iter().enumerate() {
            let Some(&fw) = names.get(r.framework.as_str()) else {
                return Err(source.error(
                    &at("requests", i, "framework"),
                    format!(
                        "unknown framework `{}` (not under `frameworks`)",
                        r.framework
                    ),
                ));
            };
            let demand = resources(&at("requests", i, "resources"), &r.resources)?;
            if demand.is_empty() {
                return Err(source.error(
                    &at("requests", i, "resources"),
                    "a request must ask for something",
                ));
            }
            let count = match &r.count {
                None => 1,
                Some(v) => {
                    let path = at("requests", i, "count");
                    let n = whole_number(v).map_err(|e| source.error(&path, e))?;
                    u32::try_from(n).map_err(|_| {
                        source.error(&path, format!("{n} is more than {}", u32::MAX))
                    })?
                }
            };
            requests.push((fw, demand, count));
        }
        let batch = match &raw.batch {
            Some(b) => {
                let mut profiles = Vec::with_capacity(raw.agents.len());
                for (i, a) in raw.agents.iter().enumerate() {
                    let scores = crate::dry_run_batch::RawAgentScores {
                        cpu_speed: a.cpu_speed.clone(),
                        net_rate: a.net_rate.clone(),
                        unit_cost: a.unit_cost.clone(),
                    };
                    profiles.push(crate::dry_run_batch::agent_profile(&source, i, &scores)?);
                }
                Some((
                    crate::dry_run_batch::BatchSection::from_raw(&source, b)?,
                    profiles,
                ))
            }
            None => None,
        };
        let priorities = if raw.priorities.is_some() || !raw.running.is_empty() {
            let config = match &raw.priorities {
                Some(p) => apply_priorities(&source, &["priorities".into()], p)?,
                None => priority_config.clone(),
            };
            let partition_of =
                |path: Vec<Seg>, p: &Option<String>| -> Result<String, ConfigError> {
                    let p = p.clone().unwrap_or_else(|| DEFAULT_PARTITION.to_string());
                    if config.partitions().contains(&p) {
                        Ok(p)
                    } else {
                        Err(source.error(
                            &path,
                            format!("partition `{p}` is not among {:?}", config.partitions()),
                        ))
                    }
                };
            let mut agent_partitions = Vec::new();
            for (i, a) in raw.agents.iter().enumerate() {
                agent_partitions.push(partition_of(at("agents", i, "partition"), &a.partition)?);
            }
            let mut framework_users = Vec::new();
            for (i, f) in raw.frameworks.iter().enumerate() {
                let partition = partition_of(at("frameworks", i, "partition"), &f.partition)?;
                framework_users.push((f.user.clone().unwrap_or_else(|| f.name.clone()), partition));
            }
            let mut running = Vec::new();
            for (i, t) in raw.running.iter().enumerate() {
                let Some(&agent) = agent_ids.get(t.agent.as_str()) else {
                    return Err(source.error(
                        &at("running", i, "agent"),
                        format!("unknown agent `{}` (not under `agents`)", t.agent),
                    ));
                };
                running.push(ScenarioTask {
                    id: t.id.clone(),
                    agent,
                    resources: resources(&at("running", i, "resources"), &t.resources)?,
                    user: t.user.clone().unwrap_or_default(),
                    partition: partition_of(at("running", i, "partition"), &t.partition)?,
                    priority: t.priority,
                    started: t.started.unwrap_or(i as u64 + 1),
                });
            }
            Some(PriorityScenario {
                config,
                agent_partitions,
                framework_users,
                running,
                timing: Timing::default(),
            })
        } else {
            None
        };
        Ok(Scenario {
            rings,
            balance,
            agents,
            frameworks,
            requests,
            batch,
            priorities,
        })
    }
}

/// One placement line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placed {
    pub step: usize,
    pub framework: String,
    pub agent: String,
    pub phase: Option<String>,
    pub bucket: Option<usize>,
    pub resources: String,
    /// Only with priorities: the placed task's id (`framework/n`) and priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Only for the balance placer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceLine>,
}

/// A balance decision's explanation, rounded to 4 decimals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceLine {
    pub weights: Vec<f64>,
    pub y_before: f64,
    pub y_after: f64,
}

/// A request left with copies unplaced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unplaced {
    pub framework: String,
    pub resources: String,
    pub count: u32,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentFree {
    pub id: String,
    pub free: String,
}

/// Shares in the scenario's framework order, rounded to 4 decimals.
#[derive(Clone, Debug, PartialEq)]
pub struct Shares(pub Vec<(String, f64)>);

impl Serialize for Shares {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, share) in &self.0 {
            map.serialize_entry(name, share)?;
        }
        map.end()
    }
}

/// One evicted task.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Victim {
    pub id: String,
    pub agent: String,
    pub priority: Priority,
    pub resources: String,
}

/// One preemption: the victims (all on one agent, in eviction order) and who evicted them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Preempted {
    pub preempted: Vec<Victim>,
    pub by: String,
    pub priority: Priority,
}

/// A placement or a preemption, in the order they happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Placed(Placed),
    Preempted(Preempted),
}

/// The outcome of a dry run.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRun {
    pub placed: Vec<Placed>,
    /// With priorities: placements and preemptions interleaved (`placed` holds the same
    /// placements); empty otherwise.
    pub events: Vec<Event>,
    pub unplaced: Vec<Unplaced>,
    pub agents: Vec<AgentFree>,
    pub shares: Shares,
}

impl DryRun {
    /// The output, one JSON object per line.
    pub fn json_lines(&self) -> Vec<String> {
        #[derive(Serialize)]
        struct UnplacedLine<'a> {
            unplaced: &'a [Unplaced],
        }
        #[derive(Serialize)]
        struct FinalLine<'a> {
            agents: &'a [AgentFree],
            shares: &'a Shares,
        }
        let json = |v: &dyn erased::Json| v.to_json();
        let mut lines: Vec<String> = if self.events.is_empty() {
            self.placed.iter().map(|p| json(p)).collect()
        } else {
            self.events
                .iter()
                .map(|e| match e {
                    Event::Placed(p) => json(p),
                    Event::Preempted(p) => json(p),
                })
                .collect()
        };
        lines.push(json(&UnplacedLine {
            unplaced: &self.unplaced,
        }));
        lines.push(json(&FinalLine {
            agents: &self.agents,
            shares: &self.shares,
        }));
        lines
    }
}

mod erased {
    /// Serializes plain data structs; they cannot fail (string keys, finite numbers).
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        }
    }
}

fn four_decimals(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The placement line of one grant.
fn placed_line(
    step: usize,
    framework: String,
    agent: String,
    grant: &Allocation,
    task: Option<(String, Priority)>,
) -> Placed {
    let (id, priority) = task.unzip();
    Placed {
        step,
        framework,
        agent,
        phase: grant.decision.phase.map(|p| p.to_string()),
        bucket: grant.decision.bucket,
        resources: grant.resources.to_string(),
        balance: grant.decision.balance().map(|note| BalanceLine {
            weights: note.weights.iter().copied().map(four_decimals).collect(),
            y_before: four_decimals(note.y_before),
            y_after: four_decimals(note.y_after),
        }),
        id,
        priority,
    }
}

/// The cycle input of a caller without priorities, holds or running tasks (the dry-run without
/// a `priorities:` section, the simulator): every demand at the base priority, so none preempts;
/// each grant exactly the demand, as if its task were launched at once ([`Grant::Demand`]); no
/// GPU devices tracked, so the scalars decide ([`no_devices`]). `feasible` is the caller's
/// per-agent verdict.
pub fn exact_cycle_input<'a, T>(
    feasible: &'a dyn Fn(FrameworkKey, AgentKey) -> Result<(), Filter>,
) -> CycleInput<'a, T> {
    CycleInput {
        base: PriorityConfig::DEFAULT_BASE,
        grant: Grant::Demand,
        feasible,
        waiting: &|_| false,
        running: &Vec::new,
        devices: &no_devices,
        quotas: None,
    }
}

/// Places the scenario's requests with `placer`: allocation cycles as the master runs them
/// (ringmaster_core::placement::cycle), each grant taken as if its task were launched at once,
/// until a cycle makes no progress. Without priorities every request is at base priority, so
/// the first cycle places all that fits and the second finds nothing more.
pub fn run(scenario: &Scenario, placer: PlacerKind) -> DryRun {
    if let Some(priorities) = &scenario.priorities {
        return run_with_priorities(scenario, priorities, placer);
    }
    let mut cluster = Cluster::new(scenario.rings.clone(), placer);
    let mut agent_ids: HashMap<usize, &str> = HashMap::new();
    for (id, total) in &scenario.agents {
        agent_ids.insert(cluster.add_agent(total.clone()), id);
    }
    let mut drf = DrfSorter::new();
    for (fw, (_, weight)) in scenario.frameworks.iter().enumerate() {
        drf.add(fw, *weight);
    }
    let input = exact_cycle_input::<usize>(&|_, _| Ok(()));
    let mut requests: Vec<TieredRequest> = scenario
        .requests
        .iter()
        .map(|(fw, demand, count)| TieredRequest {
            request: Request {
                framework: *fw,
                demand: demand.clone(),
                count: *count,
            },
            priority: input.base,
        })
        .collect();
    let mut context = PlacementContext::new(scenario.balance.clone());
    let name = |fw: usize| scenario.frameworks[fw].0.clone();
    let mut placed = Vec::new();
    loop {
        let outcome = run_cycle(&mut cluster, &mut drf, &mut requests, &input, &mut context);
        if outcome.grants.is_empty() {
            break;
        }
        for grant in &outcome.grants {
            let agent = agent_ids.get(&grant.agent).copied().unwrap_or("?");
            let line = placed_line(
                placed.len() + 1,
                name(grant.framework),
                agent.to_string(),
                grant,
                None,
            );
            placed.push(line);
        }
    }
    let unplaced = requests
        .iter()
        .map(|r| &r.request)
        .filter(|r| r.count > 0)
        .map(|r| Unplaced {
            framework: name(r.framework),
            resources: r.demand.to_string(),
            count: r.count,
            why: cluster.why_unplaced(&r.demand, &|_| true).to_string(),
        })
        .collect();
    let agents = cluster
        .agents()
        .map(|(key, a)| AgentFree {
            id: agent_ids.get(&key).copied().unwrap_or("?").to_string(),
            free: a.free.to_string(),
        })
        .collect();
    let shares = final_shares(scenario, &drf, &cluster);
    DryRun {
        placed,
        events: Vec::new(),
        unplaced,
        agents,
        shares,
    }
}

/// A task the priority run knows: running from the start or placed by it.
struct LiveTask {
    id: String,
    framework: Option<usize>,
    user: String,
    partition: String,
    at_user_priority: bool,
}

/// The seed-003 run; see the module doc. It replays the master's loop: each allocation cycle
/// tiers the requests by the priority their next task would get (from the quota ledger as it
/// stands), serves tiers in DRF order, then lets unserved demands above base preempt. Victims
/// end at once (their resources, quota and DRF share return) and their agent is held for the
/// preemptor ([`apply_outcome`], as the master does), which the next cycle places there.
/// Placed copies launch between cycles, in grant order, at the priority the ledger gives them
/// then (as the master does on Accept). Cycles are `allocation_interval` apart on a logical
/// clock; a hold ends at its deadline ([`Holds::expire`], the master's rule), and when a cycle
/// changes nothing the clock jumps to the next deadline.
fn run_with_priorities(scenario: &Scenario, p: &PriorityScenario, placer: PlacerKind) -> DryRun {
    let config = &p.config;
    let mut cluster = Cluster::new(scenario.rings.clone(), placer);
    let keys: Vec<usize> = scenario
        .agents
        .iter()
        .map(|(_, total)| cluster.add_agent(total.clone()))
        .collect();
    let agent_index = |key: usize| keys.iter().position(|k| *k == key).unwrap_or(0);
    let agent_name = |key: usize| scenario.agents[agent_index(key)].0.clone();
    let mut drf = DrfSorter::new();
    for (fw, (_, weight)) in scenario.frameworks.iter().enumerate() {
        drf.add(fw, *weight);
    }
    let mut ledger = QuotaLedger::default();
    let mut live: Vec<LiveTask> = Vec::new();
    let mut running: Vec<RunningTask<usize>> = Vec::new();
    let mut initial: Vec<&ScenarioTask> = p.running.iter().collect();
    initial.sort_by_key(|t| t.started);
    let mut last_start = 0;
    for t in initial {
        let key = keys[t.agent];
        // A running task that does not fit its agent is clamped like the master does.
        if cluster.take(key, &t.resources).is_err() {
            let free = cluster
                .agent(key)
                .map(|a| a.free.clone())
                .unwrap_or_default();
            let _ = cluster.take(key, &free);
        }
        let computed = task_priority(config, &ledger, &t.user, &t.partition, &t.resources);
        let (priority, at_user) = match t.priority {
            Some(given) => (given, given != config.base() && given == computed.priority),
            None => (computed.priority, computed.at_user_priority),
        };
        if at_user {
            ledger.start(&t.user, &t.partition, &t.resources);
        }
        running.push(RunningTask {
            id: live.len(),
            agent: key,
            priority,
            started: t.started,
            resources: t.resources.clone(),
        });
        live.push(LiveTask {
            id: t.id.clone(),
            framework: None,
            user: t.user.clone(),
            partition: t.partition.clone(),
            at_user_priority: at_user,
        });
        last_start = last_start.max(t.started);
    }
    let mut left: Vec<u32> = scenario.requests.iter().map(|r| r.2).collect();
    let mut placed_count = vec![0usize; scenario.frameworks.len()];
    let mut events = Vec::new();
    let mut placed = Vec::new();
    // Agents kept for a preempting framework until it is placed there or the hold runs out.
    let mut holds: Holds<u64> = Holds::new();
    let timing = p.timing;
    let mut now: u64 = 0;
    let mut context = PlacementContext::new(scenario.balance.clone());
    let facts = |holds: &Holds<u64>, now: u64, fw: usize, key: usize| {
        let held = holds.held_for_other(key, fw, now);
        let agent = AgentFacts {
            partition: &p.agent_partitions[agent_index(key)],
            held_for_other: held,
            ..AgentFacts::default()
        };
        feasible::check(&agent, &p.framework_users[fw].1)
    };
    let mut last: Vec<Unserved>;
    loop {
        holds.expire(now);
        let mut requests: Vec<TieredRequest> = scenario
            .requests
            .iter()
            .zip(&left)
            .map(|((fw, demand, _), &count)| {
                let (user, partition) = &p.framework_users[*fw];
                TieredRequest {
                    request: Request {
                        framework: *fw,
                        demand: demand.clone(),
                        count,
                    },
                    priority: task_priority(config, &ledger, user, partition, demand).priority,
                }
            })
            .collect();
        let tasks = running.clone();
        let held = holds.clone();
        let owners: Vec<(String, String)> = scenario
            .requests
            .iter()
            .map(|(fw, _, _)| p.framework_users[*fw].clone())
            .collect();
        let input = CycleInput {
            base: config.base(),
            grant: Grant::Demand,
            feasible: &|fw, key| facts(&held, now, fw, key),
            waiting: &|fw| held.waiting(fw, now).is_some(),
            running: &|| tasks.clone(),
            devices: &no_devices,
            quotas: Some(Quotas {
                config,
                ledger: &ledger,
                owners: &owners,
            }),
        };
        let outcome = run_cycle(&mut cluster, &mut drf, &mut requests, &input, &mut context);
        let progress = !outcome.grants.is_empty() || !outcome.preemptions.is_empty();
        apply_outcome(&outcome, &mut holds, now + timing.offer_timeout_ms);
        // The master kills victims before it sends the cycle's offers.
        for preemption in &outcome.preemptions {
            let mut victims = Vec::new();
            for v in &preemption.plan.victims {
                let Some(at) = running.iter().position(|t| t.id == *v) else {
                    continue;
                };
                let task = running.remove(at);
                let _ = cluster.give_back(task.agent, &task.resources);
                let info = &live[task.id];
                if info.at_user_priority {
                    ledger.end(&info.user, &info.partition, &task.resources);
                }
                if let Some(owner) = info.framework {
                    drf.unallocated(owner, &task.resources);
                }
                victims.push(Victim {
                    id: info.id.clone(),
                    agent: agent_name(task.agent),
                    priority: task.priority,
                    resources: task.resources.to_string(),
                });
            }
            events.push(Event::Preempted(Preempted {
                preempted: victims,
                by: scenario.frameworks[preemption.framework].0.clone(),
                priority: preemption.priority,
            }));
        }
        // The grants launch, in order, at the priority the ledger gives each task then.
        for grant in &outcome.grants {
            let fw = grant.framework;
            let (user, partition) = &p.framework_users[fw];
            let launched = task_priority(config, &ledger, user, partition, &grant.resources);
            if launched.at_user_priority {
                ledger.start(user, partition, &grant.resources);
            }
            left[grant.request] -= 1;
            placed_count[fw] += 1;
            last_start += 1;
            let id = format!("{}/{}", scenario.frameworks[fw].0, placed_count[fw]);
            running.push(RunningTask {
                id: live.len(),
                agent: grant.agent,
                priority: launched.priority,
                started: last_start,
                resources: grant.resources.clone(),
            });
            live.push(LiveTask {
                id: id.clone(),
                framework: Some(fw),
                user: user.clone(),
                partition: partition.clone(),
                at_user_priority: launched.at_user_priority,
            });
            let line = placed_line(
                placed.len() + 1,
                scenario.frameworks[fw].0.clone(),
                agent_name(grant.agent),
                grant,
                Some((id, launched.priority)),
            );
            placed.push(line.clone());
            events.push(Event::Placed(line));
        }
        last = outcome.unserved;
        now += timing.allocation_interval_ms;
        if !progress {
            // Nothing changes until a hold runs out (at its deadline, as the master's do).
            match holds.next_expiry() {
                Some(deadline) => now = now.max(deadline),
                None => break,
            }
        }
    }
    let unplaced = last
        .iter()
        .map(|u| {
            let (fw, demand, _) = &scenario.requests[u.request];
            let (user, partition) = &p.framework_users[*fw];
            let rules = |key: usize| facts(&holds, now, *fw, key);
            let fit = WhyUnplaced::explain_rules(&cluster, demand, &rules).to_string();
            let prio = task_priority(config, &ledger, user, partition, demand);
            Unplaced {
                framework: scenario.frameworks[*fw].0.clone(),
                resources: demand.to_string(),
                count: u.count,
                why: format!("{fit}; {}; {}", prio.reason, u.reason),
            }
        })
        .collect();
    let agents = keys
        .iter()
        .enumerate()
        .map(|(i, key)| AgentFree {
            id: scenario.agents[i].0.clone(),
            free: cluster
                .agent(*key)
                .map(|a| a.free.to_string())
                .unwrap_or_default(),
        })
        .collect();
    let shares = final_shares(scenario, &drf, &cluster);
    DryRun {
        placed,
        events,
        unplaced,
        agents,
        shares,
    }
}

/// `ringmaster place`: config (optional), scenario, placer override → output lines.
pub fn place(
    scenario: &Path,
    config: Option<&Path>,
    placer: Option<PlacerKind>,
) -> Result<Vec<String>, ConfigError> {
    let config = match config {
        Some(path) => crate::config::Config::load(path)?,
        None => crate::config::Config::default(),
    };
    let mut scenario =
        Scenario::load_with(scenario, config.rings, config.balance, &config.priorities)?;
    if let Some(p) = scenario.priorities.as_mut() {
        p.timing = Timing::of(&config.master);
    }
    let outcome = run(&scenario, placer.unwrap_or(config.placer));
    let mut lines = outcome.json_lines();
    if let Some((batch, profiles)) = &scenario.batch {
        // Matched against what the requests left.
        let agents: Vec<_> = scenario
            .agents
            .iter()
            .zip(&outcome.agents)
            .zip(profiles)
            .map(|(((id, total), left), profile)| {
                let free = Resources::parse(&left.free).unwrap_or_else(|_| total.clone());
                (id.clone(), total.clone(), free, *profile)
            })
            .collect();
        lines.extend(crate::dry_run_batch::run(batch, &config.matching, &agents));
    }
    Ok(lines)
}

/// Each framework's weighted dominant share at the end, to four decimals.
fn final_shares(scenario: &Scenario, drf: &DrfSorter, cluster: &Cluster) -> Shares {
    let total = cluster.total();
    Shares(
        scenario
            .frameworks
            .iter()
            .enumerate()
            .map(|(fw, (name, _))| (name.clone(), four_decimals(drf.share(fw, total))))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The places of a scenario's run as `(framework, priority)`, and whether it preempted.
    fn order(yaml: &str) -> (Vec<(String, Priority)>, bool) {
        let scenario = Scenario::from_yaml(
            yaml,
            "s.yaml",
            RingsConfig::default(),
            BalanceSettings::default(),
        )
        .unwrap();
        let run = run(&scenario, PlacerKind::Ring);
        let preempted = run.events.iter().any(|e| matches!(e, Event::Preempted(_)));
        let placed = run
            .placed
            .iter()
            .map(|p| (p.resources.clone(), p.priority.unwrap_or_default()))
            .collect();
        (placed, preempted)
    }

    fn seed_003_order(gpus: u32) -> String {
        format!(
            "priorities:
  base: 0
  users:
    user1: {{ default: {{ priority: 30, quota: \"gpus:4\" }} }}
    user2: {{ default: {{ priority: 15, quota: \"gpus:8\" }} }}
agents:
  - {{ id: a1, resources: \"cpus:16;gpus:{gpus}\" }}
frameworks:
  - {{ name: U1, user: user1 }}
  - {{ name: U2, user: user2 }}
requests:
  - {{ framework: U1, resources: \"gpus:2\" }}
  - {{ framework: U1, resources: \"gpus:4\" }}
  - {{ framework: U2, resources: \"gpus:4\" }}
  - {{ framework: U2, resources: \"gpus:6\" }}
"
        )
    }

    /// SPEC seed 003's first example, by hand: t1 (user1, 2 GPUs) runs at 30; t2 (user1, 4)
    /// is over user1's quota once t1 runs, so base; t3 (user2, 4) at 15; t4 (user2, 6) over
    /// user2's quota once t3 runs, so base. Served by the priority each has when it is served:
    /// t1, t3, then t2 and t4 at base as room allows. With 8 GPUs t2 and t4 wait and nothing
    /// is preempted (before, t2 was placed at base before t3 and then preempted by it: a task
    /// launched only to be killed); with 16 the order is t1, t3, t2, t4 (was t1, t2, t3, t4).
    #[test]
    fn seed_003_demands_are_served_by_the_priority_they_have_when_served() {
        let at = |r: &str, p: Priority| (r.to_string(), p);
        assert_eq!(
            order(&seed_003_order(8)),
            (vec![at("gpus:2", 30), at("gpus:4", 15)], false)
        );
        assert_eq!(
            order(&seed_003_order(16)),
            (
                vec![
                    at("gpus:2", 30),
                    at("gpus:4", 15),
                    at("gpus:4", 0),
                    at("gpus:6", 0)
                ],
                false
            )
        );
    }

    mod serve_order {
        use super::*;
        use proptest::prelude::*;

        /// A scenario of two or three users with priorities and GPU quotas, a few agents, and
        /// requests of random sizes and counts, nothing running at the start.
        fn scenario() -> impl Strategy<Value = String> {
            (
                proptest::collection::vec((1u32..40, 1u32..9), 2..4),
                proptest::collection::vec(1u32..9, 1..4),
                proptest::collection::vec((0usize..3, 1u32..6, 1u32..3), 1..8),
            )
                .prop_map(|(users, agents, requests)| {
                    let mut yaml = String::from("priorities:\n  base: 0\n  users:\n");
                    for (i, (priority, quota)) in users.iter().enumerate() {
                        yaml.push_str(&format!(
                            "    u{i}: {{ default: {{ priority: {priority}, quota: \"gpus:{quota}\" }} }}\n"
                        ));
                    }
                    yaml.push_str("agents:\n");
                    for (i, gpus) in agents.iter().enumerate() {
                        yaml.push_str(&format!(
                            "  - {{ id: a{i}, resources: \"cpus:64;gpus:{gpus}\" }}\n"
                        ));
                    }
                    yaml.push_str("frameworks:\n");
                    for i in 0..users.len() {
                        yaml.push_str(&format!("  - {{ name: F{i}, user: u{i} }}\n"));
                    }
                    yaml.push_str("requests:\n");
                    for (user, gpus, count) in requests {
                        let user = user % users.len();
                        yaml.push_str(&format!(
                            "  - {{ framework: F{user}, resources: \"gpus:{gpus}\", count: {count} }}\n"
                        ));
                    }
                    yaml
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

            /// Nothing runs at the start, so every task is one this run placed: served by the
            /// priority each copy has when it is served, none is ever preempted (a higher
            /// demand that did not fit when its tier was served fits no better once lower
            /// ones took what it could not use).
            #[test]
            fn no_task_placed_by_a_run_is_preempted_by_it(yaml in scenario()) {
                let (_, preempted) = order(&yaml);
                prop_assert!(!preempted, "{yaml}");
            }
        }
    }

    const DRF_PAPER: &str = "\
agents:
  - { id: a1, resources: \"cpus:9;mem:18432\" }
frameworks:
  - { name: A, weight: 1 }
  - { name: B }
requests:
  - { framework: A, resources: \"cpus:1;mem:4096\", count: 10 }
  - { framework: B, resources: \"cpus:3;mem:1024\", count: 10 }
";

    #[test]
    fn drf_paper_example_lines() {
        let scenario = Scenario::from_yaml(
            DRF_PAPER,
            "s.yaml",
            RingsConfig::default(),
            BalanceSettings::default(),
        )
        .unwrap();
        let lines = run(&scenario, PlacerKind::Ring).json_lines();
        assert_eq!(
            lines,
            [
                r#"{"step":1,"framework":"A","agent":"a1","phase":"down","bucket":7,"resources":"cpus:1;mem:4096"}"#,
                r#"{"step":2,"framework":"B","agent":"a1","phase":"down","bucket":8,"resources":"cpus:3;mem:1024"}"#,
                r#"{"step":3,"framework":"A","agent":"a1","phase":"up","bucket":6,"resources":"cpus:1;mem:4096"}"#,
                r#"{"step":4,"framework":"B","agent":"a1","phase":"up","bucket":4,"resources":"cpus:3;mem:1024"}"#,
                r#"{"step":5,"framework":"A","agent":"a1","phase":"up","bucket":6,"resources":"cpus:1;mem:4096"}"#,
                r#"{"unplaced":[{"framework":"A","resources":"cpus:1;mem:4096","count":7,"why":"no agent fits cpus:1;mem:4096: 1 agent short of cpus"},{"framework":"B","resources":"cpus:3;mem:1024","count":8,"why":"no agent fits cpus:3;mem:1024: 1 agent short of cpus"}]}"#,
                r#"{"agents":[{"id":"a1","free":"mem:4096"}],"shares":{"A":0.6667,"B":0.6667}}"#,
            ]
        );
        let lines = run(&scenario, PlacerKind::FirstFit).json_lines();
        assert_eq!(
            lines[0],
            r#"{"step":1,"framework":"A","agent":"a1","phase":null,"bucket":null,"resources":"cpus:1;mem:4096"}"#
        );
    }

    /// The master's cycle, derived by hand: a1 has cpus:4; alice (p5, quota cpus:2) asks for 3
    /// copies, bob (no grant: base) for 2. Alice's copies are served at p5 first, even though
    /// DRF would alternate, while her quota lasts: A/1 and A/2. Her third copy would run at
    /// base, so it is served with bob's at base, in DRF order: bob holds nothing and alice 2
    /// cpus, so B/1, then B/2 (bob 1 < alice 2), and A's third waits. (Before issue 44 the whole
    /// request was served at p5: A/3 was placed ahead of bob at base priority.)
    #[test]
    fn priority_tiers_come_before_drf_and_copies_launch_between_cycles() {
        let text = "\
priorities:
  base: 0
  users:
    alice: { default: { priority: 5, quota: \"cpus:2\" } }
agents:
  - { id: a1, resources: \"cpus:4\" }
frameworks:
  - { name: B, user: bob }
  - { name: A, user: alice }
requests:
  - { framework: B, resources: \"cpus:1\", count: 2 }
  - { framework: A, resources: \"cpus:1\", count: 3 }
";
        let scenario = Scenario::from_yaml(
            text,
            "s.yaml",
            RingsConfig::default(),
            BalanceSettings::default(),
        )
        .unwrap();
        let lines = run(&scenario, PlacerKind::FirstFit).json_lines();
        let placed = |step: usize, fw: &str, n: usize, priority: i64| {
            format!(
                r#"{{"step":{step},"framework":"{fw}","agent":"a1","phase":null,"bucket":null,"resources":"cpus:1","id":"{fw}/{n}","priority":{priority}}}"#
            )
        };
        assert_eq!(
            lines[..4],
            [
                placed(1, "A", 1, 5),
                placed(2, "A", 2, 5),
                placed(3, "B", 1, 0),
                placed(4, "B", 2, 0),
            ]
        );
        assert!(
            lines[4].starts_with(r#"{"unplaced":[{"framework":"A","resources":"cpus:1","count":1,"why":"no agent fits cpus:1: 1 agent short of cpus; "#),
            "{}",
            lines[4]
        );
        assert!(
            lines[4].ends_with(r#"; base-priority demands never preempt"}]}"#),
            "{}",
            lines[4]
        );
        assert_eq!(
            lines[5],
            r#"{"agents":[{"id":"a1","free":""}],"shares":{"B":0.5,"A":0.5}}"#
        );
        assert_eq!(lines.len(), 6);
    }

    #[test]
    fn bad_scenarios_are_located() {
        let cases = [
            (
                "agents:\n  - { id: a1, resources: \"cpus:1\" }\n  - { id: a1, resources: \"cpus:2\" }\n",
                "s.yaml:3: agents[1].id: duplicate agent id `a1` (first on line 2)",
            ),
            (
                "agents:\n  - id: a1\n    resources: \"cpus:x\"\n",
                "s.yaml:3: agents[0].resources: `cpus:x`: amount `x` is not",
            ),
            (
                "frameworks: [{ name: A }]\nrequests:\n  - { framework: C, resources: \"cpus:1\" }\n",
                "s.yaml:3: requests[0].framework: unknown framework `C` (not under `frameworks`)",
            ),
            (
                "frameworks: [{ name: A }]\nrequests:\n  - framework: A\n    resources: \"cpus:1\"\n    count: -3\n",
                "s.yaml:5: requests[0].count: -3 is negative",
            ),
            (
                "frameworks: [{ name: A, weight: 0 }]\n",
                "s.yaml:1: frameworks[0].weight: weight must be a number greater than 0",
            ),
            (
                "rings:\n  mem: { bounds: [0, 4096, 1024] }\n",
                "s.yaml:2: rings.mem.bounds: bounds must be strictly increasing (1024 after 4096)",
            ),
            (
                "agents: []\nnodes: []\n",
                "s.yaml:2: unknown field `nodes`, expected one of `rings`, `balance`, `priorities`, `running`, `agents`, `frameworks`, `requests`, `batch`",
            ),
            (
                "agents:\n  - { id: a1, resources: \"cpus:1\", zone: z }\n",
                "s.yaml:2: agents[0]: unknown field `zone`, expected one of `id`, `resources`, `cpu_speed`, `net_rate`, `unit_cost`, `partition`",
            ),
        ];
        for (text, expected) in cases {
            let err = Scenario::from_yaml(
                text,
                "s.yaml",
                RingsConfig::default(),
                BalanceSettings::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.starts_with(expected),
                "{text:?}\n got: {err}\nwant: {expected}"
            );
        }
    }
}
