//! The offer cycle: batched allocation runs through the placement library, offers,
//! accept (with validation) and decline (with refuse filters), rescinds and timeouts.

use ringmaster_proto::convert::{BindingWire, DeviceStateWire, ResourcesWire};
use std::collections::HashSet;
use std::sync::Arc;

use ringmaster_proto::devices::{
    DeviceBinding, DeviceRequest, DeviceSelection, GpuDemand, ShareFill, GPU_MEM, GPU_MILLI,
};
use ringmaster_proto::resources::{Resources, MILLI};
use ringmaster_proto::{
    Accept, Decline, ErrorCode, KillTask, Message, Offer, Offers, Placement, Rescind, RunTasks,
    TaskInfo, TaskState,
};
use tokio::time::{Duration, Instant};

use super::allocator::CycleFacts;
use super::pending::agent_feasible;
use super::state::{
    make_task_key, Detail, FrameworkRecord, MasterState, OfferRecord, TaskKey, TaskRecord, Tenant,
};
use super::ConnId;
use crate::security::AllowedUsers;
use ringmaster_core::placement::fragmentation::TaskShape;
use ringmaster_core::placement::FrameworkKey;
use ringmaster_core::placement::{
    task_priority, Allocation, Filter, PreemptionPlan, Priority, Request, RunningTask,
    TieredRequest,
};

/// The reason KillTask and the victim's final status carry.
pub(crate) const PREEMPTED: &str = "preempted";

/// The reason of a task that ends FAILED because its framework's principal may not run it as
/// its user.
pub(crate) const NOT_AUTHORIZED: &str = "not_authorized";

/// The users a framework's tasks may run as: the bound of its principal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskUsers {
    pub principal: String,
    /// Sorted; empty: no user at all.
    pub users: Vec<String>,
}

impl TaskUsers {
    /// May a task name `user` (`TaskInfo.user`; empty: the agent's --task-user, which the
    /// agent checks against [`TaskUsers::users`])?
    pub fn allow(&self, user: &str) -> bool {
        if user.is_empty() {
            !self.users.is_empty()
        } else {
            self.users.iter().any(|u| u == user)
        }
    }

    /// Why a task naming `user` is refused.
    pub fn refusal(&self, user: &str) -> String {
        if self.users.is_empty() {
            return format!(
                "principal {:?} may not run tasks as any user",
                self.principal
            );
        }
        format!(
            "principal {:?} may not run tasks as user {user:?} (its users: {})",
            self.principal,
            self.users.join(", ")
        )
    }
}

impl MasterState {
    /// One allocation run: the placement core's cycle (ringmaster_core::placement::cycle) over
    /// every framework with outstanding demand — priority tiers highest first, DRF within a
    /// tier, the feasibility rules of [`agent_feasible`], then preemption for demands above base
    /// that fit nowhere (docs/priorities.md). Its grants become offers, its preemptions kills
    /// and holds.
    /// The framework has `max_unacked_updates` status updates unacknowledged: it gets no new
    /// offers until it catches up, so a framework slower to acknowledge than its tasks end
    /// cannot pile up updates (and ended tasks) in the master.
    pub(crate) fn backlogged(&self, f: &FrameworkRecord) -> bool {
        let max = self.config.master.max_unacked_updates;
        max > 0 && f.unacked.len() >= max
    }

    pub(crate) fn allocate(&mut self, now: Instant) {
        self.counters.allocation_runs += 1;
        let mut requests: Vec<TieredRequest> = self
            .frameworks
            .values()
            .filter(|f| f.conn.is_some() && !f.suppressed && f.demand_count > 0)
            .filter(|f| !self.backlogged(f))
            .filter_map(|f| {
                // Outstanding offers already cover part of the demand.
                let count = self.uncovered(f);
                (count > 0).then(|| TieredRequest {
                    priority: self.demand_priority(f.key, &f.demand),
                    request: Request {
                        framework: f.key,
                        demand: f.demand.clone(),
                        count,
                    },
                })
            })
            .collect();
        if requests.is_empty() {
            self.unserved.clear();
            return;
        }
        requests.sort_by_key(|r| r.request.framework);
        let agents = &self.agents;
        let frameworks = &self.frameworks;
        let tasks = &self.tasks;
        let feasible = |fw: &str,
                        agent: Option<&str>,
                        held_for_other: bool,
                        devices_fit: &dyn Fn(&Resources) -> bool| {
            let Some(fw) = frameworks.get(fw) else {
                return Err(Filter::Disconnected);
            };
            let record = agent.and_then(|id| agents.get(id));
            agent_feasible(record, fw, devices_fit(&fw.demand), held_for_other, now)
        };
        let running = || -> Vec<RunningTask<TaskKey>> {
            tasks
                .iter()
                .filter(|(_, t)| !t.state.is_terminal() && t.holds_resources && !t.preempted)
                .filter_map(|(key, t)| {
                    Some(RunningTask {
                        id: key.clone(),
                        agent: agents.get(t.agent.as_str())?.key?,
                        priority: t.priority,
                        started: t.started,
                        resources: Resources::clone(&t.resources),
                    })
                })
                .collect()
        };
        let binding = |key: &TaskKey| tasks.get(key).map(|t| &t.devices);
        // Whose quota each request's copies count against (none without priorities).
        let with_quotas = self.config.priorities.has_grants();
        let owners: Vec<(String, String)> = requests
            .iter()
            .filter(|_| with_quotas)
            .map(|r| {
                self.alloc
                    .framework_id(r.request.framework)
                    .and_then(|id| frameworks.get(id))
                    .map(|f| (f.tenant.user.to_string(), f.tenant.partition.to_string()))
                    .unwrap_or_default()
            })
            .collect();
        let facts = CycleFacts {
            now,
            feasible: &feasible,
            running: &running,
            binding: &binding,
            owners: &owners,
        };
        let outcome = self.alloc.run(&mut requests, &self.config, &facts);
        // Holds: each preemption keeps its agent for `offer_timeout`; a grant to the holder
        // ends its hold (the core's rule, shared with the dry-run).
        self.alloc
            .apply(&outcome, now + self.config.master.offer_timeout);
        // Whatever is still asked for after the run could not be placed in it.
        self.unserved = outcome
            .unserved
            .iter()
            .map(|u| (u.framework, u.reason))
            .collect();
        for p in outcome.preemptions {
            self.preempt(p.framework, p.priority, p.plan);
        }
        self.offer_grants(outcome.grants, now);
    }

    /// Turns a cycle's grants into offers, one `Offers` message per framework connection.
    fn offer_grants(&mut self, grants: Vec<Allocation>, now: Instant) {
        let placer = self.alloc.cluster().placer().to_string();
        let mut batches: Vec<(ConnId, Vec<Offer>)> = Vec::new();
        for allocation in grants {
            let framework_id = self
                .alloc
                .framework_id(allocation.framework)
                .expect("grants go to registered frameworks")
                .to_string();
            let agent_id = self
                .alloc
                .agent_id(allocation.agent)
                .expect("grants are on admitted agents")
                .to_string();
            let placement = Placement {
                placer: placer.clone(),
                phase: allocation
                    .decision
                    .phase
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                bucket: allocation.decision.bucket.unwrap_or(0) as u32,
                dimension: allocation
                    .decision
                    .dimension
                    .as_deref()
                    .unwrap_or_default()
                    .to_string(),
            };
            let mut offer = self.book_offer(
                &framework_id,
                &agent_id,
                allocation.resources.clone(),
                placement,
                now,
            );
            if let Some(state) = self.alloc.devices().state(allocation.agent) {
                offer.devices = state.devices().iter().map(Into::into).collect();
                offer.free_devices = state.free_to_wire();
            }
            tracing::info!(offer = %offer.offer_id, framework = %framework_id, agent = %agent_id,
                resources = %allocation.resources, phase = %offer.placement.as_ref().map(|p| p.phase.as_str()).unwrap_or(""),
                "offer");
            self.metrics.placed(allocation.decision.phase);
            let conn = self.frameworks[&framework_id]
                .conn
                .expect("only connected frameworks are allocated to");
            match batches.iter_mut().find(|(c, _)| *c == conn) {
                Some((_, offers)) => offers.push(offer),
                None => batches.push((conn, vec![offer])),
            }
        }
        for (conn, offers) in batches {
            self.send(conn, Message::Offers(Offers { offers }));
        }
    }

    /// Books an offer of `resources` on `agent_id` to `framework_id` (offer record with its
    /// expiry, the framework's offer set, the counter) and returns its message with the agent's
    /// hostname and attributes filled in; callers add devices or suggested tasks and send it.
    /// The resources must already be taken from the cluster and recorded in DRF.
    pub(crate) fn book_offer(
        &mut self,
        framework_id: &str,
        agent_id: &str,
        resources: Resources,
        placement: Placement,
        now: Instant,
    ) -> Offer {
        let offer_id = self.ids.offer();
        let (hostname, attributes) = self
            .agents
            .get(agent_id)
            .map(|a| {
                let attributes = a
                    .attributes
                    .iter()
                    .map(|(k, v)| ringmaster_proto::Attribute {
                        key: k.clone(),
                        value: v.clone(),
                    })
                    .collect();
                (a.hostname.clone(), attributes)
            })
            .unwrap_or_default();
        let offer = Offer {
            offer_id: offer_id.clone(),
            framework_id: framework_id.to_string(),
            agent_id: agent_id.to_string(),
            hostname,
            resources: Some(resources.to_wire()),
            attributes,
            placement: Some(placement),
            ..Offer::default()
        };
        self.counters.offers_made += 1;
        self.offers.insert(
            offer_id.clone(),
            OfferRecord {
                id: offer_id.clone(),
                framework: framework_id.to_string(),
                agent: agent_id.to_string(),
                resources,
                expires: now + self.config.master.offer_timeout,
                fill: self.alloc.share_fill(),
            },
        );
        if let Some(fw) = self.frameworks.get_mut(framework_id) {
            fw.offers.insert(offer_id);
        }
        offer
    }

    /// Copies of one offer's resources that hold `demand`: its scalars' count, but for a GPU
    /// demand no more than the agent's devices hold (the summed scalars cannot tell two
    /// half-used GPUs from a free one, docs/devices.md).
    pub(crate) fn offer_copies(&self, offer: &OfferRecord, demand: &Resources) -> u64 {
        let scalars = offer.resources.copies_of(demand);
        match self.agents.get(&offer.agent).and_then(|a| a.key) {
            Some(key) => self.alloc.devices().copies_of(key, demand, scalars),
            None => scalars,
        }
    }

    /// The framework's demand copies its outstanding offers do not cover.
    pub(crate) fn uncovered(&self, f: &FrameworkRecord) -> u32 {
        let covered: u64 = f
            .offers
            .iter()
            .filter_map(|id| self.offers.get(id))
            .map(|o| self.offer_copies(o, &f.demand))
            .fold(0, u64::saturating_add);
        u64::from(f.demand_count).saturating_sub(covered) as u32
    }

    /// The priority a framework's next task would get now (its user's, within quota).
    pub(crate) fn demand_priority(&self, framework: FrameworkKey, demand: &Resources) -> Priority {
        self.alloc
            .framework_id(framework)
            .and_then(|id| self.frameworks.get(id))
            .map(|f| {
                task_priority(
                    &self.config.priorities,
                    self.alloc.ledger(),
                    &f.tenant.user,
                    &f.tenant.partition,
                    demand,
                )
                .priority
            })
            .unwrap_or(self.config.priorities.base())
    }

    /// Kills a plan's victims with reason `preempted` (the allocator already keeps their agent
    /// for the preempting framework, [`Allocator::apply`](super::allocator::Allocator::apply)).
    fn preempt(
        &mut self,
        framework: FrameworkKey,
        priority: Priority,
        plan: PreemptionPlan<TaskKey>,
    ) {
        let Some(framework_id) = self.alloc.framework_id(framework).map(str::to_string) else {
            return;
        };
        let Some(agent_id) = self.alloc.agent_id(plan.agent).map(str::to_string) else {
            return;
        };
        let Some(agent) = self.agents.get(&agent_id) else {
            return;
        };
        let agent_conn = agent.conn;
        for victim in &plan.victims {
            let Some(task) = self.tasks.get_mut(victim) else {
                continue;
            };
            task.preempted = true;
            tracing::info!(framework = %framework_id, priority, victim_framework = %victim.0,
                victim = %victim.1, victim_priority = task.priority, agent = %agent_id, "preempting");
            if let Some(conn) = agent_conn {
                self.send(
                    conn,
                    Message::KillTask(KillTask {
                        leader_term: self.leader_term,
                        task_id: victim.1.to_string(),
                        framework_id: victim.0.to_string(),
                        reason: PREEMPTED.into(),
                    }),
                );
            }
        }
        for victim in &plan.victims {
            self.task_changed(victim);
        }
        self.counters.preemptions += plan.victims.len() as u64;
        self.metrics.preempted(plan.victims.len());
    }

    /// Takes an offer out of the books and returns its resources to the pool.
    fn recover_offer(&mut self, offer_id: &str) -> Option<OfferRecord> {
        let offer = self.offers.remove(offer_id)?;
        let framework = self.frameworks.get_mut(&offer.framework).map(|fw| {
            fw.offers.remove(offer_id);
            fw.key
        });
        let agent = self.agents.get(&offer.agent).and_then(|a| a.key);
        self.alloc
            .offer_returned(agent, framework, &offer.resources);
        Some(offer)
    }

    /// Rescinds one offer: its resources return and the framework is told.
    fn rescind(&mut self, offer_id: &str, reason: &str) {
        let Some(offer) = self.recover_offer(offer_id) else {
            return;
        };
        self.counters.offers_rescinded += 1;
        tracing::info!(offer = %offer_id, framework = %offer.framework, reason, "offer rescinded");
        if let Some(conn) = self.frameworks.get(&offer.framework).and_then(|f| f.conn) {
            self.send(
                conn,
                Message::Rescind(Rescind {
                    offer_id: offer_id.to_string(),
                    reason: reason.to_string(),
                }),
            );
        }
    }

    pub(crate) fn rescind_offers_on_agent(&mut self, agent_id: &str, reason: &str) {
        let ids: Vec<String> = self
            .offers
            .values()
            .filter(|o| o.agent == agent_id)
            .map(|o| o.id.clone())
            .collect();
        for id in ids {
            self.rescind(&id, reason);
        }
    }

    pub(crate) fn rescind_offers_of_framework(&mut self, framework_id: &str, reason: &str) {
        let ids: Vec<String> = self
            .frameworks
            .get(framework_id)
            .map(|f| f.offers.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            self.rescind(&id, reason);
        }
    }

    pub(crate) fn expire_offers(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .offers
            .values()
            .filter(|o| o.expires <= now)
            .map(|o| o.id.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        for id in expired {
            self.rescind(&id, "offer_timeout");
        }
        self.request_allocation(now);
    }

    /// True when some decline filter ran out since the last check (so an agent may be
    /// offered again). Expired filters are dropped.
    pub(crate) fn filters_expired(&mut self, now: Instant) -> bool {
        let mut any = false;
        for fw in self.frameworks.values_mut() {
            let before = fw.filters.len();
            fw.filters.retain(|_, until| *until > now);
            any |= fw.filters.len() != before && fw.demand_count > 0;
        }
        any
    }

    pub(crate) fn decline(
        &mut self,
        conn: ConnId,
        framework_id: &str,
        decline: Decline,
        now: Instant,
    ) {
        let refuse = if decline.refuse_seconds.is_finite() && decline.refuse_seconds > 0.0 {
            Duration::from_secs_f64(decline.refuse_seconds.min(365.0 * 24.0 * 3600.0))
        } else {
            self.config.master.default_refuse
        };
        for offer_id in decline.offer_ids {
            match self.offers.get(&offer_id) {
                Some(o) if o.framework == framework_id => {
                    let offer = self.recover_offer(&offer_id).expect("present");
                    self.counters.offers_declined += 1;
                    tracing::info!(offer = %offer_id, framework = %framework_id, agent = %offer.agent, ?refuse, "offer declined");
                    if let Some(fw) = self.frameworks.get_mut(framework_id) {
                        fw.filters.insert(offer.agent, now + refuse);
                    }
                }
                Some(_) => self.send_error(
                    conn,
                    ErrorCode::InvalidOffer,
                    format!("Decline: offer {offer_id} belongs to another framework"),
                ),
                None => self.send_error(
                    conn,
                    ErrorCode::InvalidOffer,
                    format!("Decline: unknown or expired offer {offer_id}"),
                ),
            }
        }
        self.request_allocation(now);
    }

    pub(crate) fn accept(
        &mut self,
        conn: ConnId,
        framework_id: &str,
        accept: Accept,
        now: Instant,
    ) {
        let offer_id = accept.offer_id.clone();
        match self.offers.get(&offer_id) {
            None => {
                return self.send_error(
                    conn,
                    ErrorCode::InvalidOffer,
                    format!("Accept: unknown or expired offer {offer_id}; nothing launched"),
                )
            }
            Some(o) if o.framework != framework_id => {
                return self.send_error(
                    conn,
                    ErrorCode::InvalidOffer,
                    format!(
                        "Accept: offer {offer_id} belongs to another framework; nothing launched"
                    ),
                )
            }
            Some(_) => {}
        }
        // The offer is used up either way: whatever is not launched goes back to the pool.
        let offer = self.recover_offer(&offer_id).expect("present");
        let tasks = match self.validate_tasks(framework_id, &offer.resources, accept.tasks) {
            Ok(tasks) => tasks,
            Err(problem) => {
                self.request_allocation(now);
                return self.send_error(
                    conn,
                    ErrorCode::InvalidTask,
                    format!("Accept of offer {offer_id}: {problem}; nothing launched"),
                );
            }
        };
        self.counters.offers_accepted += 1;
        let agent_id = offer.agent.clone();
        let Some(agent_conn) = self.agents.get(&agent_id).and_then(|a| a.conn) else {
            // The agent vanished between offer and accept (its offers are rescinded then,
            // so this is a race with the rescind in flight).
            self.request_allocation(now);
            return self.send_error(
                conn,
                ErrorCode::InvalidOffer,
                format!("Accept: agent {agent_id} of offer {offer_id} is gone; nothing launched"),
            );
        };
        // A task whose user its framework's principal may not use fails alone; the others go
        // ahead (docs/security.md, "Task users").
        let users = self.task_users(framework_id);
        let (tasks, refused): (Vec<_>, Vec<_>) = tasks
            .into_iter()
            .partition(|(info, _)| users.as_ref().is_none_or(|u| u.allow(&info.user)));
        for (info, resources) in refused {
            let message = users
                .as_ref()
                .map_or_else(String::new, |u| u.refusal(&info.user));
            self.refuse_task(framework_id, &agent_id, info, &resources, &message, now);
        }
        let shapes: Vec<TaskShape> = tasks
            .iter()
            .filter_map(|(_, resources)| TaskShape::of_demand(resources))
            .collect();
        let tasks = match self.bind_task_devices(&agent_id, tasks, &offer.fill) {
            Ok(tasks) => tasks,
            Err(problem) => {
                self.request_allocation(now);
                return self.send_error(
                    conn,
                    ErrorCode::InvalidTask,
                    format!("Accept of offer {offer_id}: {problem}; nothing launched"),
                );
            }
        };
        for shape in shapes {
            self.alloc.launched(shape);
        }
        let tenant = self
            .frameworks
            .get(framework_id)
            .map(|f| f.tenant.clone())
            .unwrap_or_else(|| Tenant::new("", ringmaster_core::placement::DEFAULT_PARTITION));
        let (user, partition) = (&*tenant.user, &*tenant.partition);
        let mut launch = Vec::with_capacity(tasks.len());
        for (mut info, resources, devices) in tasks {
            let (priority, at_user_priority) = if info.priority_class == "base" {
                (self.config.priorities.base(), false)
            } else {
                let p = task_priority(
                    &self.config.priorities,
                    self.alloc.ledger(),
                    user,
                    partition,
                    &resources,
                );
                (p.priority, p.at_user_priority)
            };
            if at_user_priority {
                self.alloc.start_quota(user, partition, &resources);
            }
            self.launches += 1;
            let task_key: TaskKey = make_task_key(framework_id, &info.task_id);
            info.framework_id = framework_id.to_string();
            info.agent_id = agent_id.clone();
            // Whatever the framework sent: the agent checks the user it resolves against this.
            info.allowed_users = users.as_ref().map(|u| u.users.clone()).unwrap_or_default();
            let shared = self.shared_resources(framework_id, &resources);
            self.tasks.insert(
                task_key.clone(),
                TaskRecord {
                    agent: agent_id.as_str().into(),
                    name: info.name.as_str().into(),
                    resources: shared,
                    state: TaskState::TaskStaging,
                    detail: Detail::default(),
                    holds_resources: false,
                    priority,
                    at_user_priority,
                    tenant: tenant.clone(),
                    started: self.launches,
                    preempted: false,
                    exit_code: None,
                    terminal_unacked: false,
                    devices,
                    pending_update: None,
                    health: Default::default(),
                },
            );
            self.hold_task_resources(&task_key, &agent_id, &resources);
            let hash = self.tasks.hash_of(&task_key);
            if let Some(agent) = self.agents.get_mut(&agent_id) {
                agent.tasks.insert(hash);
            }
            if let Some(fw) = self.frameworks.get_mut(framework_id) {
                fw.tasks.insert(hash);
            }
            self.counters.tasks_launched += 1;
            tracing::info!(framework = %framework_id, task = %info.task_id, agent = %agent_id,
                resources = %resources, priority, "launch");
            self.set_task_state(&task_key, TaskState::TaskStaging, "", "", now);
            launch.push(info);
        }
        if !launch.is_empty() {
            self.send(
                agent_conn,
                Message::RunTasks(RunTasks {
                    tasks: launch,
                    leader_term: self.leader_term,
                }),
            );
        }
        self.request_allocation(now);
    }

    /// The users the tasks of `framework_id` may run as, from the principal it authenticated
    /// as (docs/security.md, "Task users"); `None`: any user (an anonymous framework, or a
    /// principal allowed any). A principal the configuration does not grant anything (it was
    /// removed) may run tasks as no user.
    pub(crate) fn task_users(&self, framework_id: &str) -> Option<TaskUsers> {
        let principal = self.owners.framework(framework_id);
        if principal.is_empty() {
            return None;
        }
        let users = match self.config.auth.principals.get(&principal) {
            Some(grant) => match grant.task_users() {
                AllowedUsers::Any => return None,
                AllowedUsers::Only(users) => users.iter().cloned().collect(),
            },
            None => Vec::new(),
        };
        Some(TaskUsers { principal, users })
    }

    /// Ends a task of an Accept before it reaches its agent: FAILED with reason
    /// `not_authorized` and `message`, told to its framework like any task's end; it never
    /// holds resources, so its share of the offer goes back to the pool.
    fn refuse_task(
        &mut self,
        framework_id: &str,
        agent_id: &str,
        info: TaskInfo,
        resources: &Resources,
        message: &str,
        now: Instant,
    ) {
        let tenant = self
            .frameworks
            .get(framework_id)
            .map(|f| f.tenant.clone())
            .unwrap_or_else(|| Tenant::new("", ringmaster_core::placement::DEFAULT_PARTITION));
        let task_key: TaskKey = make_task_key(framework_id, &info.task_id);
        let shared = self.shared_resources(framework_id, resources);
        self.tasks.insert(
            task_key.clone(),
            TaskRecord {
                agent: agent_id.into(),
                name: info.name.as_str().into(),
                resources: shared,
                state: TaskState::TaskStaging,
                detail: Detail::default(),
                holds_resources: false,
                priority: self.config.priorities.base(),
                at_user_priority: false,
                tenant,
                started: self.launches,
                preempted: false,
                exit_code: None,
                terminal_unacked: false,
                devices: DeviceBinding::default(),
                pending_update: None,
                health: Default::default(),
            },
        );
        // In its agent's and framework's sets as any live task, so its end leaves them alike.
        let hash = self.tasks.hash_of(&task_key);
        if let Some(agent) = self.agents.get_mut(agent_id) {
            agent.tasks.insert(hash);
        }
        if let Some(fw) = self.frameworks.get_mut(framework_id) {
            fw.tasks.insert(hash);
        }
        tracing::warn!(framework = %framework_id, task = %info.task_id, user = %info.user,
            message, "task refused");
        self.finish_task(
            &task_key,
            TaskState::TaskFailed,
            NOT_AUTHORIZED,
            message,
            None,
            now,
        );
    }

    /// Chooses the GPU devices of every task of an Accept on its agent, with the configured
    /// policy and the same library function the agent uses; the binding goes to the agent in
    /// `TaskInfo.devices`. A task's held resources then count the memory of whole devices too.
    /// Any task that fits no device refuses the whole Accept (nothing is taken).
    #[allow(clippy::type_complexity)]
    fn bind_task_devices(
        &self,
        agent_id: &str,
        tasks: Vec<(TaskInfo, Resources)>,
        fill: &ShareFill,
    ) -> Result<Vec<(TaskInfo, Resources, DeviceBinding)>, String> {
        let key = self.agents.get(agent_id).and_then(|a| a.key);
        let mut state = key.and_then(|k| self.alloc.devices().state(k)).cloned();
        let policy = self.config.devices.selection;
        // Packed, a slice takes the GPU the expected slices leave least unfillable, as the
        // ring's score assumed (docs/devices.md).
        let fill = (policy == DeviceSelection::MostUsedThatFits).then_some(fill);
        let mut out = Vec::with_capacity(tasks.len());
        for (mut info, mut resources) in tasks {
            let id = info.task_id.clone();
            let request = DeviceRequest::from_scalars(&resources, info.gpu_models.clone())
                .map_err(|e| format!("task {id}: {e}"))?;
            let legacy = state.is_none()
                && request
                    .as_ref()
                    .is_some_and(|r| matches!(r.demand, GpuDemand::Whole { .. }));
            let Some(request) = request.filter(|_| !legacy) else {
                // No GPU, or whole GPUs on an agent without a device list (plain scalar `gpus`).
                if !info.devices.is_empty() {
                    return Err(format!("task {id} names devices the master did not bind"));
                }
                out.push((info, resources, DeviceBinding::default()));
                continue;
            };
            let state = state.as_mut().ok_or_else(|| {
                format!("task {id} asks for a GPU slice but agent {agent_id} has no devices")
            })?;
            let binding = state
                .select_filling(&request, policy, fill)
                .ok_or_else(|| {
                    format!("task {id}: no GPU of agent {agent_id} can hold {request:?}")
                })?;
            state
                .bind(&binding)
                .map_err(|e| format!("task {id}: {e}"))?;
            // Held: what the devices really give (a whole device's share and memory too).
            let share: u64 = binding.devices.iter().map(|d| u64::from(d.share)).sum();
            let memory: u64 = binding.devices.iter().map(|d| d.memory_mib).sum();
            resources.set_milli(GPU_MILLI, share * MILLI);
            resources.set_milli(GPU_MEM, memory.saturating_mul(MILLI));
            info.devices = binding.to_wire();
            out.push((info, resources, binding));
        }
        Ok(out)
    }

    /// Checks every task of an Accept; any problem refuses the whole Accept.
    fn validate_tasks(
        &self,
        framework_id: &str,
        offered: &Resources,
        tasks: Vec<TaskInfo>,
    ) -> Result<Vec<(TaskInfo, Resources)>, String> {
        let mut seen = HashSet::new();
        let mut sum = Resources::new();
        let mut out = Vec::with_capacity(tasks.len());
        for info in tasks {
            let resources = self.check_task(framework_id, &info, &mut seen)?;
            sum = sum
                .checked_add(&resources)
                .map_err(|e| format!("task resources overflow: {e}"))?;
            out.push((info, resources));
        }
        if !offered.contains(&sum) {
            let short: Vec<&str> = offered.shortfalls(&sum).collect();
            return Err(format!(
                "tasks need {sum} but the offer has {offered} (short of {})",
                short.join(", ")
            ));
        }
        Ok(out)
    }

    /// `resources` as an `Arc` shared with the framework's previous task when they are equal
    /// (its `last_resources`), else a new one that becomes the framework's last.
    fn shared_resources(&mut self, framework_id: &str, resources: &Resources) -> Arc<Resources> {
        let Some(fw) = self.frameworks.get_mut(framework_id) else {
            return Arc::new(resources.clone());
        };
        match &fw.last_resources {
            Some(last) if **last == *resources => Arc::clone(last),
            _ => {
                let shared = Arc::new(resources.clone());
                fw.last_resources = Some(Arc::clone(&shared));
                shared
            }
        }
    }

    /// The checks every task to be launched must pass (from an Accept or a batch): a usable,
    /// unique id, a known priority class, a command, and non-empty resources, which it returns.
    pub(crate) fn check_task(
        &self,
        framework_id: &str,
        info: &TaskInfo,
        seen: &mut HashSet<String>,
    ) -> Result<Resources, String> {
        let id = &info.task_id;
        if id.is_empty() {
            return Err("a task has an empty task_id".into());
        }
        if id.len() > 256
            || id.contains('/')
            || id.chars().any(char::is_control)
            || id == "."
            || id == ".."
        {
            return Err(format!("task id {id:?} is not allowed (at most 256 characters, no `/` or control characters)"));
        }
        if !seen.insert(id.clone()) {
            return Err(format!("task id {id} appears twice"));
        }
        if self
            .tasks
            .get(&make_task_key(framework_id, id))
            .is_some_and(|t| !t.state.is_terminal())
        {
            return Err(format!("task id {id} is already in use by this framework"));
        }
        if !matches!(info.priority_class.as_str(), "" | "user" | "base") {
            return Err(format!(
                "task {id} has priority_class {:?} (expected \"user\", \"base\" or empty)",
                info.priority_class
            ));
        }
        if info.command.trim().is_empty() {
            return Err(format!("task {id} has an empty command"));
        }
        let resources = Resources::from_wire(info.resources.as_ref())
            .map_err(|e| format!("task {id} has bad resources: {e}"))?;
        if resources.is_empty() {
            return Err(format!("task {id} asks for no resources"));
        }
        Ok(resources)
    }
}
