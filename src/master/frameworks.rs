//! The framework conversation: subscribe and failover, demand, revive and suppress,
//! kill, reconciliation, teardown, and removal after the failover timeout.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::{BTreeMap, HashMap, HashSet};

use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    ErrorCode, KillTask, Message, Pong, Subscribe, Subscribed, TaskState, TaskStatus, Update,
};
use tokio::time::{Duration, Instant};

use super::events::ConnId;
use super::state::{make_task_key, FrameworkRecord, MasterState, Peer, TaskKey, Tenant};
use ringmaster_core::placement::DEFAULT_PARTITION;

/// The longest failover timeout a framework may ask for: one week.
const MAX_FAILOVER: f64 = 7.0 * 24.0 * 3600.0;

impl MasterState {
    pub(crate) fn subscribe(&mut self, conn: ConnId, subscribe: Subscribe, now: Instant) {
        let weight = if subscribe.weight == 0.0 {
            1.0
        } else {
            subscribe.weight
        };
        if !weight.is_finite() || weight <= 0.0 {
            return self.close(
                conn,
                ErrorCode::InvalidRequest,
                format!(
                    "Subscribe: weight must be a positive number, got {}",
                    subscribe.weight
                ),
            );
        }
        let failover = subscribe.failover_timeout_secs;
        if !failover.is_finite() || !(0.0..=MAX_FAILOVER).contains(&failover) {
            return self.close(
                conn,
                ErrorCode::InvalidRequest,
                format!("Subscribe: failover_timeout_secs must be within 0..={MAX_FAILOVER}, got {failover}"),
            );
        }
        if subscribe.name.trim().is_empty() {
            return self.close(
                conn,
                ErrorCode::InvalidRequest,
                "Subscribe: name is empty".into(),
            );
        }
        let partition = if subscribe.partition.is_empty() {
            DEFAULT_PARTITION.to_string()
        } else {
            subscribe.partition.clone()
        };
        if partition
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return self.close(
                conn,
                ErrorCode::InvalidRequest,
                format!("Subscribe: partition {partition:?} has spaces or control characters"),
            );
        }
        let id = if subscribe.framework_id.is_empty() {
            self.ids.framework()
        } else {
            subscribe.framework_id.clone()
        };
        if self.removed_frameworks.contains(&id) {
            return self.close(
                conn,
                ErrorCode::InvalidRequest,
                format!("framework {id} was removed (torn down or failover timeout expired); subscribe without an id"),
            );
        }
        let failover_timeout = Duration::from_secs_f64(failover);
        let resubscribing = match self.frameworks.get_mut(&id) {
            Some(fw) => {
                if fw.conn.is_some_and(|c| c != conn) {
                    return self.close(
                        conn,
                        ErrorCode::FrameworkConflict,
                        format!("framework {id} is connected on another connection"),
                    );
                }
                fw.conn = Some(conn);
                fw.disconnected_at = None;
                fw.name = subscribe.name.clone();
                if fw.tenant.user.as_ref() != subscribe.user || *fw.tenant.partition != *partition {
                    fw.tenant = Tenant::new(&subscribe.user, &partition);
                }
                fw.failover_timeout = failover_timeout;
                if fw.weight != weight {
                    fw.weight = weight;
                    let key = fw.key;
                    self.alloc.set_weight(key, weight);
                }
                true
            }
            None => {
                let key = self.alloc.add_framework(&id, weight);
                self.frameworks.insert(
                    id.clone(),
                    FrameworkRecord {
                        id: id.clone(),
                        key,
                        name: subscribe.name.clone(),
                        tenant: Tenant::new(&subscribe.user, &partition),
                        weight,
                        failover_timeout,
                        conn: Some(conn),
                        disconnected_at: None,
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
                false
            }
        };
        self.framework_changed(&id);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.peer = Some(Peer::Framework(id.clone()));
        }
        tracing::info!(framework = %id, name = %subscribe.name, user = %subscribe.user, weight,
            resubscribed = resubscribing, "framework subscribed");
        self.send(
            conn,
            Message::Subscribed(Subscribed {
                framework_id: id.clone(),
                heartbeat_interval_ms: self.config.master.heartbeat_interval.as_millis() as u64,
            }),
        );
        if resubscribing {
            self.resend_all_updates(&id, now);
        }
        self.request_allocation(now);
    }

    pub(crate) fn framework_message(
        &mut self,
        conn: ConnId,
        framework_id: &str,
        message: Message,
        now: Instant,
    ) {
        match message {
            Message::Demand(demand) => {
                let resources = match Resources::from_wire(demand.resources.as_ref()) {
                    Ok(r) => r,
                    Err(e) => {
                        return self.send_error(
                            conn,
                            ErrorCode::InvalidRequest,
                            format!("Demand: bad resources: {e}"),
                        )
                    }
                };
                if resources.is_empty() && demand.count > 0 {
                    return self.send_error(
                        conn,
                        ErrorCode::InvalidRequest,
                        "Demand: resources are empty".into(),
                    );
                }
                let fw = self.frameworks.get_mut(framework_id).expect("subscribed");
                fw.demand = resources;
                fw.demand_count = demand.count;
                self.request_allocation(now);
            }
            Message::Revive(_) => {
                let fw = self.frameworks.get_mut(framework_id).expect("subscribed");
                fw.suppressed = false;
                fw.filters.clear();
                let key = fw.key;
                self.alloc.revive(key);
                self.request_allocation(now);
            }
            Message::Suppress(_) => {
                let fw = self.frameworks.get_mut(framework_id).expect("subscribed");
                fw.suppressed = true;
                let key = fw.key;
                self.alloc.suppress(key);
            }
            Message::Accept(accept) => self.accept(conn, framework_id, accept, now),
            Message::Decline(decline) => self.decline(conn, framework_id, decline, now),
            Message::SubmitBatch(batch) => self.submit_batch(conn, framework_id, batch, now),
            Message::StatusAck(ack) => self.acknowledge(framework_id, &ack.update_id, now),
            Message::Kill(kill) => self.kill_task(framework_id, &kill.task_id, now),
            Message::Reconcile(reconcile) => {
                self.reconcile(conn, framework_id, reconcile.task_ids, now)
            }
            Message::Teardown(_) => {
                tracing::info!(framework = %framework_id, "framework teardown");
                self.remove_framework(framework_id, "framework_teardown", now);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.peer = None;
                }
            }
            Message::Ping(ping) => self.send(conn, Message::Pong(Pong { nonce: ping.nonce })),
            Message::Pong(_) => {}
            Message::Error(error) => {
                tracing::warn!(framework = %framework_id, message = %error.message, "framework reported an error")
            }
            other => self.close(
                conn,
                ErrorCode::UnexpectedMessage,
                format!("{} is not valid from a framework", other.kind()),
            ),
        }
    }

    fn kill_task(&mut self, framework_id: &str, task_id: &str, now: Instant) {
        let task_key: TaskKey = make_task_key(framework_id, task_id);
        let Some(task) = self.tasks.get(&task_key) else {
            let status = TaskStatus {
                task_id: task_id.to_string(),
                framework_id: framework_id.to_string(),
                state: TaskState::TaskLost as i32,
                reason: "unknown_task".into(),
                message: "no such task".into(),
                ..Default::default()
            };
            return self.deliver_update(framework_id, status, now);
        };
        if task.state.is_terminal() {
            let status = self.status_of(&task_key, None, now);
            return self.deliver_update(framework_id, status, now);
        }
        let agent_conn = self.agents.get(task.agent.as_str()).and_then(|a| a.conn);
        match agent_conn {
            Some(conn) => {
                tracing::info!(framework = %framework_id, task = %task_id, "kill requested");
                self.send(
                    conn,
                    Message::KillTask(KillTask {
                        leader_term: self.leader_term,
                        task_id: task_id.to_string(),
                        framework_id: framework_id.to_string(),
                        reason: "killed_by_framework".into(),
                    }),
                );
            }
            // The agent is away: the task cannot be reached; it ends as LOST when the
            // agent is declared lost, or is killed on re-registration if asked again.
            None => {
                let _ = now;
                tracing::warn!(task = %task_id, "kill requested while the task's agent is disconnected");
            }
        }
    }

    fn reconcile(&mut self, conn: ConnId, framework_id: &str, task_ids: Vec<String>, now: Instant) {
        let ids: Vec<String> = if task_ids.is_empty() {
            let mut ids: Vec<String> = self
                .framework_tasks(framework_id)
                .into_iter()
                .map(|(_, id)| id.to_string())
                .collect();
            ids.sort();
            ids
        } else {
            task_ids
        };
        for task_id in ids {
            let task_key: TaskKey = make_task_key(framework_id, &task_id);
            let status = if self.tasks.contains_key(&task_key) {
                self.status_of(&task_key, None, now)
            } else {
                TaskStatus {
                    task_id,
                    framework_id: framework_id.to_string(),
                    state: TaskState::TaskLost as i32,
                    reason: "reconciliation".into(),
                    message: "the master does not know this task".into(),
                    ..Default::default()
                }
            };
            self.send(
                conn,
                Message::Update(Update {
                    status: Some(status),
                }),
            );
        }
    }

    pub(crate) fn framework_disconnected(
        &mut self,
        framework_id: &str,
        conn: ConnId,
        now: Instant,
    ) {
        let Some(fw) = self.frameworks.get_mut(framework_id) else {
            return;
        };
        if fw.conn != Some(conn) {
            return;
        }
        fw.conn = None;
        fw.disconnected_at = Some(now);
        tracing::warn!(framework = %framework_id, failover_timeout = ?fw.failover_timeout,
            "framework disconnected; its tasks keep running until the failover timeout");
        self.rescind_offers_of_framework(framework_id, "framework_disconnected");
        self.request_allocation(now);
    }

    pub(crate) fn expire_frameworks(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .frameworks
            .values()
            .filter(|f| {
                f.disconnected_at
                    .is_some_and(|at| now.duration_since(at) >= f.failover_timeout)
            })
            .map(|f| f.id.clone())
            .collect();
        for id in expired {
            tracing::warn!(framework = %id, "failover timeout expired; removing the framework");
            self.remove_framework(&id, "framework_failover_timeout", now);
        }
    }

    /// Kills a framework's tasks, recovers its offers and forgets it.
    pub(crate) fn remove_framework(&mut self, framework_id: &str, reason: &str, now: Instant) {
        self.rescind_offers_of_framework(framework_id, reason);
        if !self.frameworks.contains_key(framework_id) {
            return;
        }
        for task_key in self.framework_tasks(framework_id) {
            let agent_conn = self
                .tasks
                .get(&task_key)
                .and_then(|t| self.agents.get(t.agent.as_str()))
                .and_then(|a| a.conn);
            if let Some(conn) = agent_conn {
                self.send(
                    conn,
                    Message::KillTask(KillTask {
                        leader_term: self.leader_term,
                        task_id: task_key.1.to_string(),
                        framework_id: framework_id.to_string(),
                        reason: reason.to_string(),
                    }),
                );
            }
            // The master stops counting the task now; the agent frees the process.
            self.finish_task(
                &task_key,
                TaskState::TaskKilled,
                reason,
                "the framework was removed",
                None,
                now,
            );
        }
        if let Some(fw) = self.frameworks.remove(framework_id) {
            self.alloc.remove_framework(fw.key);
            // Terminal updates nobody is left to acknowledge: those tasks are completed.
            for pending in fw.unacked.into_values() {
                let key: TaskKey = make_task_key(framework_id, &pending.task_id);
                if let Some(task) = self.tasks.get_mut(&key) {
                    task.pending_update = None;
                    if task.state.is_terminal() && task.terminal_unacked {
                        task.terminal_unacked = false;
                        self.task_changed(&key);
                        self.remember_completed(&key);
                    }
                }
            }
        }
        self.framework_removed_for_good(framework_id);
        // A bounded history: the oldest removed frameworks (and their completed tasks) go.
        let bound = self.config.master.max_removed_frameworks;
        for forgotten in self.removed_frameworks.insert(framework_id, bound) {
            self.forget_completed_of(&forgotten);
            self.framework_forgotten(&forgotten);
        }
        self.counters.frameworks_removed += 1;
        self.request_allocation(now);
    }
}
