//! The agent conversation: registration and re-registration with task reconciliation,
//! heartbeats, status updates, disconnection and loss.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::HashSet;
use std::net::SocketAddr;

use ringmaster_proto::resources::{format_milli, Resources};
use ringmaster_proto::{
    AgentRegistered, ErrorCode, KillTask, Message, Pong, RegisterAgent, StatusAck, TaskState,
    TaskStatus,
};
use tokio::time::Instant;

use super::allocator::DISK;
use super::events::ConnId;
use compact_str::CompactString;
use ringmaster_core::placement::AgentKey;

use super::health::Health;
use super::state::{make_task_key, AgentRecord, MasterState, Peer, TaskKey};

impl MasterState {
    pub(crate) fn register_agent(
        &mut self,
        conn: ConnId,
        peer: SocketAddr,
        register: RegisterAgent,
        now: Instant,
    ) {
        let total = match Resources::from_wire(register.total.as_ref()) {
            Ok(total) if !total.is_empty() => total,
            // What the agent is cannot change by retrying: AGENT_REFUSED stops it.
            Ok(_) => {
                return self.close(
                    conn,
                    ErrorCode::AgentRefused,
                    "RegisterAgent: total resources are empty".into(),
                )
            }
            Err(e) => {
                return self.close(
                    conn,
                    ErrorCode::AgentRefused,
                    format!("RegisterAgent: bad total resources: {e}"),
                )
            }
        };
        if let Some((name, have, max)) = total.first_above(&self.config.master.max_agent_resources)
        {
            tracing::warn!(agent = %register.agent_id, %peer, resource = name, amount = %format_milli(have),
                limit = %format_milli(max), "agent refused: above master.max_agent_resources");
            // AGENT_REFUSED: the agent stops instead of retrying what cannot succeed.
            return self.close(
                conn,
                ErrorCode::AgentRefused,
                format!(
                    "RegisterAgent: `{name}` {} is above the limit {} of master.max_agent_resources",
                    format_milli(have),
                    format_milli(max)
                ),
            );
        }
        let devices = match ringmaster_proto::devices::devices_from_wire(&register.devices) {
            Ok(devices) => devices,
            Err(e) => {
                return self.close(
                    conn,
                    ErrorCode::AgentRefused,
                    format!("RegisterAgent: bad devices: {e}"),
                )
            }
        };
        let attributes: Vec<(String, String)> = register
            .attributes
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect();
        let id = if register.agent_id.is_empty() {
            self.ids.agent()
        } else {
            register.agent_id.clone()
        };
        if let Some(existing) = self.agents.get(&id) {
            if existing.conn.is_some_and(|c| c != conn) {
                return self.close(
                    conn,
                    ErrorCode::FrameworkConflict,
                    format!("agent id {id} is already registered on a live connection"),
                );
            }
        }
        let reregistering = self.agents.contains_key(&id);
        // Start from a clean slate in the rings: offers on the agent are void, its total
        // may have changed, and its tasks are re-counted below from what it reports.
        if reregistering {
            self.rescind_offers_on_agent(&id, "agent_reregistered");
            // Its tasks are counted again as they are adopted below.
            let held: Vec<TaskKey> = self.agent_tasks(&id);
            for task_key in held {
                self.release_task_resources(&task_key);
            }
            if let Some(key) = self.agents.get_mut(&id).and_then(|a| a.key.take()) {
                self.alloc.remove_agent(key);
            }
        }
        let (key, devices) = self.alloc.add_agent(&id, total.clone(), devices);
        if let Err(e) = devices {
            // Checked by devices_from_wire above; keep the agent without devices.
            tracing::error!(agent = %id, error = %e, "agent devices refused");
        }
        let record = self
            .agents
            .entry(id.clone())
            .or_insert_with(|| AgentRecord {
                id: id.clone(),
                hostname: String::new(),
                attributes: Vec::new(),
                total: Resources::new(),
                reported_free: Resources::new(),
                key: None,
                conn: None,
                last_heartbeat: now,
                tasks: Default::default(),
                lost: false,
                reregister_by: None,
            });
        record.hostname = register.hostname.clone();
        record.attributes = attributes;
        record.total = total.clone();
        record.reported_free = total.clone();
        record.key = Some(key);
        record.conn = Some(conn);
        record.last_heartbeat = now;
        record.lost = false;
        record.reregister_by = None;
        self.agent_changed(&id);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.peer = Some(Peer::Agent(id.clone()));
        }
        tracing::info!(agent = %id, hostname = %register.hostname, %peer, resources = %total,
            reregistered = reregistering, "agent registered");
        self.send(
            conn,
            Message::AgentRegistered(AgentRegistered {
                agent_id: id.clone(),
                heartbeat_interval_ms: self.config.master.heartbeat_interval.as_millis() as u64,
            }),
        );
        self.reconcile_agent_tasks(&id, conn, &register.tasks, now);
        self.request_allocation(now);
    }

    /// Matches what a (re-)registering agent runs against what the master believes.
    fn reconcile_agent_tasks(
        &mut self,
        agent_id: &str,
        conn: ConnId,
        reported: &[TaskStatus],
        now: Instant,
    ) {
        let mut still_running: HashSet<TaskKey> = HashSet::new();
        for status in reported {
            let task_key = make_task_key(&status.framework_id, &status.task_id);
            let reported_state =
                TaskState::try_from(status.state).unwrap_or(TaskState::TaskRunning);
            if reported_state.is_terminal() {
                // It ended while the master was away (or down): its real terminal state.
                let ours = self
                    .tasks
                    .get(&task_key)
                    .is_some_and(|t| t.agent == agent_id && !t.state.is_terminal());
                if ours {
                    still_running.insert(task_key.clone());
                    self.finish_task(
                        &task_key,
                        reported_state,
                        &status.reason,
                        &status.message,
                        status.exit_code,
                        now,
                    );
                }
                continue;
            }
            let adoptable = self.frameworks.contains_key(&status.framework_id)
                && self.tasks.get(&task_key).is_some_and(|t| {
                    t.agent == agent_id
                        && (!t.state.is_terminal()
                            || (t.state == TaskState::TaskLost
                                && t.detail.reason() == "agent_lost"))
                });
            if !adoptable {
                tracing::warn!(agent = %agent_id, task = %status.task_id, framework = %status.framework_id,
                    "agent runs a task the master does not know; killing it");
                self.send(
                    conn,
                    Message::KillTask(KillTask {
                        leader_term: self.leader_term,
                        task_id: status.task_id.clone(),
                        framework_id: status.framework_id.clone(),
                        reason: "unknown_task".into(),
                    }),
                );
                continue;
            }
            still_running.insert(task_key.clone());
            let health = Health::from_wire(status.health);
            let health_changed = self.tasks[&task_key].health != health;
            if let Some(task) = self.tasks.get_mut(&task_key) {
                task.health = health;
            }
            let resources = self.tasks[&task_key].resources.clone();
            let was = self.tasks[&task_key].state;
            if !self.tasks[&task_key].holds_resources {
                self.hold_task_resources(&task_key, agent_id, &resources);
            }
            let hash = self.tasks.hash_of(&task_key);
            if was.is_terminal() {
                // A live task is in its agent's and framework's sets already; an ended one
                // left them when it ended.
                if let Some(agent) = self.agents.get_mut(agent_id) {
                    agent.tasks.insert(hash);
                }
                // Back from LOST: its framework owns it again (reconciliation, teardown and
                // failover see it) and it counts against its user's priority quota again.
                let task = self.tasks.get_mut(&task_key).expect("adoptable");
                task.terminal_unacked = false;
                if task.at_user_priority {
                    let tenant = task.tenant.clone();
                    self.alloc
                        .start_quota(&tenant.user, &tenant.partition, &resources);
                }
                if let Some(fw) = self.frameworks.get_mut(task_key.0.as_str()) {
                    fw.tasks.insert(hash);
                }
            }
            let new_state = if reported_state == TaskState::TaskStaging {
                TaskState::TaskStaging
            } else {
                TaskState::TaskRunning
            };
            // A health the master did not know (it restarted, or a new leader took over: health
            // is not in the registry) is passed on like a RUNNING update whose health changed,
            // so a framework that reconciled before the agent came back learns it.
            if was != new_state || health_changed {
                self.set_task_state(
                    &task_key,
                    new_state,
                    "agent_reregistered",
                    "the agent re-registered and still runs the task",
                    now,
                );
            }
        }
        // Tasks the master placed on this agent that the agent no longer runs.
        let known: Vec<TaskKey> = self.agent_tasks(agent_id);
        for task_key in known {
            if still_running.contains(&task_key) {
                continue;
            }
            let Some(task) = self.tasks.get(&task_key) else {
                continue;
            };
            if !task.state.is_terminal() {
                self.finish_task(
                    &task_key,
                    TaskState::TaskLost,
                    "agent_reregistered",
                    "the agent re-registered without this task",
                    None,
                    now,
                );
            }
        }
    }

    pub(crate) fn agent_message(
        &mut self,
        conn: ConnId,
        agent_id: &str,
        message: Message,
        now: Instant,
    ) {
        match message {
            Message::AgentHeartbeat(hb) => {
                let Some(agent) = self.agents.get_mut(agent_id) else {
                    return;
                };
                agent.last_heartbeat = now;
                let Ok(free) = Resources::from_wire(hb.free.as_ref()) else {
                    return;
                };
                // A heartbeat without `free` tells nothing about the disk.
                let disk = hb.free.is_some().then(|| free.milli(DISK));
                agent.reported_free = free;
                if let (Some(key), Some(disk)) = (agent.key, disk) {
                    self.bound_free_disk(agent_id, key, disk, now);
                }
            }
            Message::StatusUpdate(update) => {
                if let Some(agent) = self.agents.get_mut(agent_id) {
                    agent.last_heartbeat = now;
                }
                let Some(mut status) = update.status else {
                    return self.send_error(
                        conn,
                        ErrorCode::InvalidRequest,
                        "StatusUpdate without a status".into(),
                    );
                };
                status.agent_id = agent_id.to_string();
                if status.framework_id.is_empty() {
                    // Tasks are keyed by (framework, task): find the one framework this agent
                    // runs (or ran) the task for, or refuse. Never acknowledge an update that
                    // was not applied: the agent keeps it and sends it again.
                    match self.framework_of_agent_task(agent_id, &status.task_id) {
                        Some(framework_id) => status.framework_id = framework_id,
                        None => {
                            return self.send_error(
                                conn,
                                ErrorCode::InvalidRequest,
                                format!(
                                    "StatusUpdate for task {:?} has no framework_id and the task is not \
                                     one this agent runs for exactly one framework; not acknowledged",
                                    status.task_id
                                ),
                            )
                        }
                    }
                }
                let update_id = status.update_id.clone();
                let task_id = status.task_id.clone();
                self.agent_status(agent_id, status, now);
                if !update_id.is_empty() {
                    self.send(conn, Message::StatusAck(StatusAck { task_id, update_id }));
                }
            }
            Message::FileData(answer) => self.file_data(agent_id, answer),
            Message::UsageReport(report) => self.usage_report(agent_id, report, now),
            Message::Ping(ping) => self.send(conn, Message::Pong(Pong { nonce: ping.nonce })),
            Message::Pong(_) => {}
            Message::Error(error) => {
                tracing::warn!(agent = %agent_id, message = %error.message, "agent reported an error")
            }
            other => self.close(
                conn,
                ErrorCode::UnexpectedMessage,
                format!("{} is not valid from an agent", other.kind()),
            ),
        }
    }

    /// The agent's reported free `disk` (milli) bounds what is offered there (docs/protocol.md,
    /// "Agents"): the books' free disk beyond it is withheld until a heartbeat reports room. In
    /// flight, launches lower the books before the agent hears of them and the agent reports
    /// right after a task end, so a stale report errs neither way for long.
    fn bound_free_disk(&mut self, agent_id: &str, key: AgentKey, reported: u64, now: Instant) {
        let (was, withheld) = self.alloc.bound_free_disk(key, reported);
        if withheld == was {
            return;
        }
        if was == 0 {
            tracing::info!(agent = %agent_id, withheld = %format_milli(withheld),
                "the agent reports less free disk than the books: the rest is withheld from offers");
        } else if withheld == 0 {
            tracing::info!(agent = %agent_id, "the agent reports room on its disk: nothing withheld");
        }
        if withheld < was {
            // Disk to offer again.
            self.request_allocation(now);
        }
    }

    /// The framework of the task `task_id` placed on `agent_id`, when exactly one framework
    /// has a task of that id there.
    fn framework_of_agent_task(&self, agent_id: &str, task_id: &str) -> Option<String> {
        // The agent's live tasks first; only an update about an ended task (an old agent
        // repeating itself) searches every task.
        let live: Vec<CompactString> = self
            .agent_tasks(agent_id)
            .into_iter()
            .filter(|(_, t)| t == task_id)
            .map(|(f, _)| f)
            .collect();
        let mut frameworks: Box<dyn Iterator<Item = &CompactString>> = if live.is_empty() {
            Box::new(
                self.tasks
                    .iter()
                    .filter(|((_, t), task)| t == task_id && task.agent == agent_id)
                    .map(|((f, _), _)| f),
            )
        } else {
            Box::new(live.iter())
        };
        let first = frameworks.next()?;
        frameworks.next().is_none().then(|| first.to_string())
    }

    /// A status update from an agent: apply it and pass it on to the framework.
    fn agent_status(&mut self, agent_id: &str, status: TaskStatus, now: Instant) {
        let task_key = make_task_key(&status.framework_id, &status.task_id);
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
        let Some(task) = self.tasks.get(&task_key) else {
            tracing::debug!(task = %status.task_id, "status for an unknown task ignored");
            return;
        };
        if task.agent != agent_id || task.state.is_terminal() || state == TaskState::Unspecified {
            return;
        }
        let health = Health::from_wire(status.health);
        let health_changed = health != task.health;
        if let Some(task) = self.tasks.get_mut(&task_key) {
            task.health = health;
        }
        if state.is_terminal() {
            self.finish_task(
                &task_key,
                state,
                &status.reason,
                &status.message,
                status.exit_code,
                now,
            );
        } else if state != self.tasks[&task_key].state || health_changed {
            // A RUNNING update whose health changed is passed on too (docs/protocol.md).
            self.set_task_state(&task_key, state, &status.reason, &status.message, now);
        }
    }

    pub(crate) fn agent_disconnected(&mut self, agent_id: &str, conn: ConnId, now: Instant) {
        let Some(agent) = self.agents.get_mut(agent_id) else {
            return;
        };
        if agent.conn != Some(conn) {
            return;
        }
        agent.conn = None;
        tracing::warn!(agent = %agent_id, "agent disconnected; lost unless it returns within agent_timeout");
        self.reads.agent_gone(agent_id);
        // Nothing can be launched on it now: its offers are void.
        self.rescind_offers_on_agent(agent_id, "agent_disconnected");
        self.request_allocation(now);
    }

    /// Ends the holds (kept for a preempting framework, docs/priorities.md) that ran out by
    /// `now`; true when one did, so the agent is offered to everyone again.
    pub(crate) fn holds_expired(&mut self, now: Instant) -> bool {
        self.alloc.expire_holds(now)
    }

    pub(crate) fn expire_agents(&mut self, now: Instant) {
        let timeout = self.config.master.agent_timeout;
        let expired: Vec<String> = self
            .agents
            .values()
            .filter(|a| {
                !a.lost
                    && match a.reregister_by {
                        // Recovered after a master restart: its own, longer, deadline.
                        Some(deadline) => now >= deadline,
                        None => now.duration_since(a.last_heartbeat) >= timeout,
                    }
            })
            .map(|a| a.id.clone())
            .collect();
        for id in expired {
            self.lose_agent(&id, now);
        }
    }

    /// The agent missed its heartbeats: its tasks are LOST, its offers rescinded, its
    /// resources leave the rings. Its record stays so it can re-register under its id.
    fn lose_agent(&mut self, agent_id: &str, now: Instant) {
        let message = if self
            .agents
            .get(agent_id)
            .is_some_and(|a| a.reregister_by.is_some())
        {
            "the agent did not re-register within agent_reregister_timeout after a master restart"
        } else {
            "the agent stopped sending heartbeats"
        };
        tracing::warn!(agent = %agent_id, message, "agent lost");
        self.counters.agents_lost += 1;
        self.rescind_offers_on_agent(agent_id, "agent_lost");
        let tasks: Vec<TaskKey> = self.agent_tasks(agent_id);
        for task_key in tasks {
            self.finish_task(
                &task_key,
                TaskState::TaskLost,
                "agent_lost",
                message,
                None,
                now,
            );
        }
        self.agent_changed(agent_id);
        if let Some(agent) = self.agents.get_mut(agent_id) {
            agent.lost = true;
            agent.reregister_by = None;
            let conn = agent.conn.take();
            self.reads.agent_gone(agent_id);
            if let Some(key) = agent.key.take() {
                self.alloc.remove_agent(key);
            }
            // A half-open connection: make the agent reconnect and re-register.
            if let Some(conn) = conn {
                self.close(
                    conn,
                    ErrorCode::NotRegistered,
                    format!("agent {agent_id} was declared lost; re-register"),
                );
            }
        }
        self.forget_old_lost_agents();
    }

    /// Keeps at most `max_removed_agents` lost agents, forgetting those lost longest ago (by
    /// their last heartbeat), in memory and in the registry. A forgotten agent that comes back
    /// registers as a new one.
    pub(crate) fn forget_old_lost_agents(&mut self) {
        let bound = self.config.master.max_removed_agents;
        let mut lost: Vec<(Instant, String)> = self
            .agents
            .values()
            .filter(|a| a.lost && a.conn.is_none() && a.key.is_none())
            .map(|a| (a.last_heartbeat, a.id.clone()))
            .collect();
        if lost.len() <= bound {
            return;
        }
        lost.sort();
        let excess = lost.len() - bound;
        for (_, id) in lost.into_iter().take(excess) {
            tracing::info!(agent = %id, "lost agent forgotten (master.max_removed_agents)");
            self.agents.remove(&id);
            self.agent_changed(&id);
        }
    }
}
