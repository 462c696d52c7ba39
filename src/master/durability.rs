//! How the master actor uses its registry: which records a turn changed, the group commit that
//! writes them before the turn's messages go out, and the recovery of the state at start.
//!
//! Why a separate module: the registry ([`super::registry`]) only stores records; this module
//! is the one place that knows how `MasterState` maps to them, so the handlers only say
//! "this framework / agent / task changed" and never build records themselves.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ringmaster_proto::devices::DeviceBinding;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{TaskState, TaskStatus};
use tokio::time::{Duration, Instant};

use super::ids::IdMint;
use super::registry::{
    AgentEntry, FrameworkEntry, Recovered, Registry, RegistryBatch, RegistryError, TaskEntry,
};
use super::state::{
    make_task_key, AgentRecord, Detail, Durable, FrameworkRecord, MasterState, Peer, TaskKey,
    TaskRecord, Tenant,
};

impl MasterState {
    /// The attached registry, if any (tests read it back).
    #[cfg(test)]
    pub(crate) fn registry(&self) -> Option<&Registry> {
        self.durable.as_ref().map(|d| &*d.registry)
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl MasterState {
    /// A framework's persisted fields changed (or it was removed).
    pub(crate) fn framework_changed(&mut self, framework_id: &str) {
        if let Some(d) = &mut self.durable {
            d.frameworks.insert(framework_id.to_string());
        }
    }

    /// The framework may never subscribe again.
    pub(crate) fn framework_removed_for_good(&mut self, framework_id: &str) {
        if let Some(d) = &mut self.durable {
            d.frameworks.insert(framework_id.to_string());
            d.removed.push(framework_id.to_string());
        }
    }

    /// A removed framework left the bounded history: its id is no longer refused.
    pub(crate) fn framework_forgotten(&mut self, framework_id: &str) {
        if let Some(d) = &mut self.durable {
            d.forgotten.push(framework_id.to_string());
        }
    }

    /// An agent's persisted fields changed.
    pub(crate) fn agent_changed(&mut self, agent_id: &str) {
        if let Some(d) = &mut self.durable {
            d.agents.insert(agent_id.to_string());
        }
    }

    /// A task's persisted fields changed, or it was forgotten.
    pub(crate) fn task_changed(&mut self, task_key: &TaskKey) {
        if let Some(d) = &mut self.durable {
            if !d.tasks.contains(task_key) {
                d.tasks.insert(task_key.clone());
            }
        }
    }

    /// The jobs framework's records changed: they join this turn's commit and `reply` is
    /// answered after it. Without a registry the jobs live in the jobs framework's memory
    /// only, so there is nothing to write: answered at once.
    pub(crate) fn save_jobs(
        &mut self,
        jobs: Vec<(String, Option<serde_json::Value>)>,
        meta: Option<super::registry::JobsMeta>,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    ) {
        let Some(d) = &mut self.durable else {
            let _ = reply.send(Ok(()));
            return;
        };
        d.jobs.extend(jobs);
        if meta.is_some() {
            d.jobs_meta = meta;
        }
        d.job_replies.push(reply);
    }

    /// Ends the actor turn: writes what changed in one transaction, then sends the turn's
    /// messages. Without a registry there is nothing to do (messages went out at once).
    pub(crate) fn commit_turn(&mut self) -> Result<(), RegistryError> {
        let Some(mut durable) = self.durable.take() else {
            return Ok(());
        };
        let batch = self.turn_batch(&mut durable);
        let result = match batch {
            Some(batch) => {
                let started = std::time::Instant::now();
                let records = batch.len();
                let result = durable.registry.commit(batch);
                self.metrics
                    .registry_commit_took(started.elapsed().as_secs_f64());
                tracing::trace!(
                    records,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "registry commit"
                );
                result
            }
            None => Ok(()),
        };
        let answer = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
        self.finish_turn(&mut durable, answer);
        self.durable = Some(durable);
        result
    }

    /// Answers the jobs framework's writes with `answer` and, when the turn is recorded, sends
    /// its messages (an unrecorded turn's messages are dropped: nothing may act on them).
    fn finish_turn(&mut self, durable: &mut Durable, answer: Result<(), String>) {
        let released = super::pipeline::Released {
            outbox: std::mem::take(&mut durable.outbox),
            job_replies: std::mem::take(&mut durable.job_replies),
            snapshots: std::mem::take(&mut durable.snapshots),
        };
        self.release(released, answer);
    }

    /// What this turn changed, as one registry batch; `None` when nothing did.
    pub(crate) fn turn_batch(&mut self, durable: &mut Durable) -> Option<RegistryBatch> {
        let mut batch = RegistryBatch {
            id_epoch: durable.id_epoch.take(),
            removed_frameworks: std::mem::take(&mut durable.removed),
            forgotten_frameworks: std::mem::take(&mut durable.forgotten),
            jobs: std::mem::take(&mut durable.jobs),
            jobs_meta: durable.jobs_meta.take(),
            ..Default::default()
        };
        for id in durable.frameworks.drain() {
            let entry = self
                .frameworks
                .get(&id)
                .map(|f| framework_entry(f, self.owners.framework(&f.id)));
            batch.frameworks.push((id, entry));
        }
        for id in durable.agents.drain() {
            let entry = self
                .agents
                .get(&id)
                .map(|a| agent_entry(a, self.owners.agent(&a.id)));
            batch.agents.push((id, entry));
        }
        for key in durable.tasks.drain() {
            let entry = self.tasks.get(&key).map(|t| task_entry(&key, t));
            batch
                .tasks
                .push(((key.0.to_string(), key.1.to_string()), entry));
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Attaches a registry and rebuilds the state from what it holds: frameworks (disconnected,
    /// their failover timeout counting from now), agents (waiting to re-register within
    /// `agent_reregister_timeout`), tasks and quota usage. Terminal updates a framework never
    /// acknowledged are queued for it again. Call before any connection is accepted.
    pub(crate) fn recover(
        &mut self,
        registry: impl Into<Arc<Registry>>,
        recovered: Recovered,
        now: Instant,
    ) {
        let registry = registry.into();
        let epoch = unix_secs().max(recovered.id_epoch + 1);
        self.ids = IdMint::with_epoch(epoch);
        let mut durable = Durable::new(registry);
        durable.id_epoch = Some(epoch);
        self.durable = Some(durable);
        if recovered.is_empty() {
            return;
        }
        tracing::info!(
            frameworks = recovered.frameworks.len(),
            agents = recovered.agents.len(),
            tasks = recovered.tasks.len(),
            "recovering the master's state from the registry"
        );
        for id in &recovered.removed_frameworks {
            self.removed_frameworks.insert(id, usize::MAX);
        }
        for f in recovered.frameworks {
            self.owners
                .restore(&Peer::Framework(f.id.clone()), &f.principal);
            let weight = if f.weight.is_finite() && f.weight > 0.0 {
                f.weight
            } else {
                1.0
            };
            let key = self.alloc.add_framework(&f.id, weight);
            let failover_timeout =
                Duration::try_from_secs_f64(f.failover_timeout_secs).unwrap_or(Duration::ZERO);
            self.frameworks.insert(
                f.id.clone(),
                FrameworkRecord {
                    id: f.id,
                    key,
                    name: f.name,
                    tenant: Tenant::new(&f.user, &f.partition),
                    weight,
                    failover_timeout,
                    conn: None,
                    disconnected_at: Some(now),
                    demand: Resources::new(),
                    demand_count: 0,
                    suppressed: false,
                    offers: HashSet::new(),
                    tasks: Default::default(),
                    last_resources: None,
                    filters: HashMap::new(),
                    unacked: BTreeMap::new(),
                },
            );
        }
        let deadline = now + self.config.master.agent_reregister_timeout;
        for a in recovered.agents {
            self.owners
                .restore(&Peer::Agent(a.id.clone()), &a.principal);
            let total = match Resources::parse(&a.total) {
                Ok(total) => total,
                Err(e) => {
                    tracing::error!(agent = %a.id, total = %a.total, error = %e,
                        "registry: bad agent resources; the agent starts with none until it re-registers");
                    Resources::new()
                }
            };
            self.agents.insert(
                a.id.clone(),
                AgentRecord {
                    id: a.id,
                    hostname: a.hostname,
                    attributes: a.attributes,
                    reported_free: total.clone(),
                    total,
                    key: None,
                    conn: None,
                    last_heartbeat: now,
                    tasks: Default::default(),
                    lost: a.lost,
                    reregister_by: (!a.lost).then_some(deadline),
                },
            );
        }
        let mut tasks = recovered.tasks;
        // Oldest first, so the finished-task memory keeps its order.
        tasks.sort_by_key(|t| t.started);
        let mut orphans = Vec::new();
        let mut to_retell = Vec::new();
        let mut completed = Vec::new();
        for t in tasks {
            let key: TaskKey = make_task_key(&t.framework_id, &t.task_id);
            let state = TaskState::try_from(t.state).unwrap_or(TaskState::TaskLost);
            let resources = Resources::parse(&t.resources).unwrap_or_else(|e| {
                tracing::error!(task = %t.task_id, error = %e, "registry: bad task resources");
                Resources::new()
            });
            let devices = DeviceBinding::parse(&t.devices).unwrap_or_else(|e| {
                tracing::error!(task = %t.task_id, error = %e, "registry: bad task devices");
                DeviceBinding::default()
            });
            self.launches = self.launches.max(t.started);
            // A terminal update nobody is left to acknowledge is done with.
            let terminal_unacked =
                t.terminal_unacked && self.frameworks.contains_key(&t.framework_id);
            let record = TaskRecord {
                agent: t.agent_id.as_str().into(),
                name: t.name.into(),
                resources: Arc::new(resources.clone()),
                state,
                detail: Detail::new(&t.reason, &t.message),
                holds_resources: false,
                priority: t.priority,
                at_user_priority: t.at_user_priority,
                tenant: shared_tenant(&self.frameworks, &key.0, &t.user, &t.partition),
                started: t.started,
                preempted: t.preempted,
                exit_code: t.exit_code,
                terminal_unacked,
                devices,
                pending_update: None,
                health: Default::default(),
            };
            self.tasks.insert(key.clone(), record);
            if state.is_terminal() {
                if terminal_unacked {
                    to_retell.push(key);
                } else {
                    if t.terminal_unacked {
                        self.task_changed(&key);
                    }
                    completed.push(key);
                }
                continue;
            }
            if t.at_user_priority {
                self.alloc.start_quota(&t.user, &t.partition, &resources);
            }
            let hash = self.tasks.hash_of(&key);
            if let Some(fw) = self.frameworks.get_mut(&t.framework_id) {
                fw.tasks.insert(hash);
            }
            match self.agents.get_mut(&t.agent_id) {
                Some(agent) if !agent.lost => {
                    agent.tasks.insert(hash);
                }
                _ => orphans.push(key),
            }
        }
        // Oldest first, so the bound forgets the oldest.
        for key in completed {
            self.remember_completed(&key);
        }
        let bound = self.config.master.max_removed_frameworks;
        for id in self.removed_frameworks.trim(bound) {
            self.forget_completed_of(&id);
            self.framework_forgotten(&id);
        }
        self.forget_old_lost_agents();
        for key in to_retell {
            let exit_code = self.tasks[&key].exit_code;
            let status: TaskStatus = self.status_of(&key, exit_code, now);
            self.deliver_update(&key.0, status, now);
        }
        for key in orphans {
            self.finish_task(
                &key,
                TaskState::TaskLost,
                "agent_lost",
                "the task's agent is not in the registry",
                None,
                now,
            );
        }
    }
}

fn framework_entry(f: &FrameworkRecord, principal: String) -> FrameworkEntry {
    FrameworkEntry {
        id: f.id.clone(),
        name: f.name.clone(),
        user: f.tenant.user.to_string(),
        weight: f.weight,
        partition: f.tenant.partition.to_string(),
        failover_timeout_secs: f.failover_timeout.as_secs_f64(),
        principal,
    }
}

fn agent_entry(a: &AgentRecord, principal: String) -> AgentEntry {
    AgentEntry {
        id: a.id.clone(),
        hostname: a.hostname.clone(),
        total: a.total.to_string(),
        attributes: a.attributes.clone(),
        lost: a.lost,
        principal,
    }
}

fn task_entry(key: &TaskKey, t: &TaskRecord) -> TaskEntry {
    TaskEntry {
        framework_id: key.0.to_string(),
        task_id: key.1.to_string(),
        agent_id: t.agent.to_string(),
        name: t.name.to_string(),
        resources: t.resources.to_string(),
        devices: t.devices.to_string(),
        state: t.state as i32,
        reason: t.detail.reason().to_string(),
        message: t.detail.message().to_string(),
        exit_code: t.exit_code,
        priority: t.priority,
        at_user_priority: t.at_user_priority,
        user: t.tenant.user.to_string(),
        partition: t.tenant.partition.to_string(),
        started: t.started,
        preempted: t.preempted,
        terminal_unacked: t.terminal_unacked,
    }
}

/// A recovered task's user or partition: its framework's shared copy when they match, so the
/// tasks of a framework do not hold one allocation each.
fn shared_tenant(
    frameworks: &HashMap<String, FrameworkRecord>,
    framework_id: &str,
    user: &str,
    partition: &str,
) -> Arc<Tenant> {
    match frameworks.get(framework_id).map(|f| &f.tenant) {
        Some(own) if *own.user == *user && *own.partition == *partition => own.clone(),
        _ => Tenant::new(user, partition),
    }
}
