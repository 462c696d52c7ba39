//! Task bookkeeping: state changes, resource accounting, and reliable delivery of status
//! updates to frameworks (resent until acknowledged, across reconnects).

use ringmaster_proto::convert::BindingWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Message, TaskState, TaskStatus, Update};
use tokio::time::Instant;

use super::state::{make_task_key, Detail, MasterState, PendingUpdate, TaskKey, MAX_RETRY_BACKOFF};

impl MasterState {
    /// Counts a task's resources as used on its agent and allocated to its framework.
    pub(crate) fn hold_task_resources(
        &mut self,
        task_key: &TaskKey,
        agent_id: &str,
        resources: &Resources,
    ) {
        let Some(key) = self.agents.get(agent_id).and_then(|a| a.key) else {
            return;
        };
        let framework = self.frameworks.get(task_key.0.as_str()).map(|f| f.key);
        let binding = self.tasks.get(task_key).map(|t| &t.devices);
        let problems = self.alloc.hold(key, framework, resources, binding);
        if let Some(e) = problems.clamped {
            tracing::error!(agent = %agent_id, task = %task_key.1, error = %e,
                "task resources exceed the agent's free resources; accounting clamps");
        }
        if let Some(task) = self.tasks.get_mut(task_key) {
            task.holds_resources = true;
        }
        if let Some(e) = problems.devices {
            tracing::error!(agent = %agent_id, task = %task_key.1, error = %e,
                "the task's devices are not free on its agent; device accounting skips them");
        }
    }

    /// Returns a task's resources to its agent and takes them off its framework's share.
    pub(crate) fn release_task_resources(&mut self, task_key: &TaskKey) {
        let Some(task) = self.tasks.get_mut(task_key) else {
            return;
        };
        if !task.holds_resources {
            return;
        }
        task.holds_resources = false;
        let resources = task.resources.clone();
        let agent_id = task.agent.clone();
        let devices = task.devices.clone();
        let agent = self.agents.get(agent_id.as_str()).and_then(|a| a.key);
        let framework = self.frameworks.get(task_key.0.as_str()).map(|f| f.key);
        self.alloc.release(agent, framework, &resources, &devices);
    }

    /// A non-terminal state change; the framework is told.
    pub(crate) fn set_task_state(
        &mut self,
        task_key: &TaskKey,
        state: TaskState,
        reason: &str,
        message: &str,
        now: Instant,
    ) {
        let Some(task) = self.tasks.get_mut(task_key) else {
            return;
        };
        task.state = state;
        task.detail = Detail::new(reason, message);
        tracing::info!(framework = %task_key.0, task = %task_key.1, agent = %task.agent,
            state = state.short_name(), reason, "task state");
        self.task_changed(task_key);
        let status = self.status_of(task_key, None, now);
        self.deliver_update(&task_key.0, status, now);
    }

    /// A terminal state: resources go back to the pool and the framework is told.
    pub(crate) fn finish_task(
        &mut self,
        task_key: &TaskKey,
        state: TaskState,
        reason: &str,
        message: &str,
        exit_code: Option<i32>,
        now: Instant,
    ) {
        let Some(task) = self.tasks.get(task_key) else {
            return;
        };
        if task.state.is_terminal() {
            return;
        }
        self.usage.forget(task_key);
        let agent_id = task.agent.clone();
        // A preempted task ends KILLED with reason `preempted`, whatever the agent says
        // (the process may report a signal exit or another reason); LOST stays LOST.
        let (state, reason) = if task.preempted && state != TaskState::TaskLost {
            (TaskState::TaskKilled, "preempted")
        } else {
            (state, reason)
        };
        if task.at_user_priority {
            let (tenant, resources) = (task.tenant.clone(), task.resources.clone());
            self.alloc
                .end_quota(&tenant.user, &tenant.partition, &resources);
        }
        self.release_task_resources(task_key);
        let hash = self.tasks.hash_of(task_key);
        if let Some(agent) = self.agents.get_mut(agent_id.as_str()) {
            agent.tasks.remove(hash);
        }
        if let Some(fw) = self.frameworks.get_mut(task_key.0.as_str()) {
            fw.tasks.remove(hash);
        }
        let task = self.tasks.get_mut(task_key).expect("checked above");
        task.state = state;
        task.detail = Detail::new(reason, message);
        task.exit_code = exit_code;
        task.terminal_unacked = self.frameworks.contains_key(task_key.0.as_str());
        self.task_changed(task_key);
        tracing::info!(framework = %task_key.0, task = %task_key.1, agent = %agent_id,
            state = state.short_name(), reason, "task ended");
        let status = self.status_of(task_key, exit_code, now);
        self.deliver_update(&task_key.0, status, now);
        // Kept, and its update re-sent, until the framework acknowledges it; then it joins the
        // framework's completed list. Without a framework there is nobody to wait for.
        if !self.tasks[task_key].terminal_unacked {
            self.remember_completed(task_key);
        }
        self.request_allocation(now);
    }

    /// An ended task whose terminal update needs no more delivery (acknowledged, or its
    /// framework is gone) joins its framework's completed list; the oldest completed tasks
    /// beyond `max_completed_tasks_per_framework` are forgotten, in memory and in the registry.
    pub(crate) fn remember_completed(&mut self, task_key: &TaskKey) {
        let bound = self.config.master.max_completed_tasks_per_framework;
        let list = self.finished.entry(task_key.0.to_string()).or_default();
        // Every caller completes a task once (on its transition out of `terminal_unacked`, or at
        // its end when nobody is to be told), so no search for duplicates: a task id reused after
        // it ended is listed twice and forgotten when its older entry leaves the list.
        list.push_back(task_key.1.clone());
        let mut forgotten = Vec::new();
        while list.len() > bound {
            let Some(old) = list.pop_front() else { break };
            forgotten.push(old);
        }
        if list.is_empty() {
            self.finished.remove(task_key.0.as_str());
        }
        for task_id in forgotten {
            let old: TaskKey = make_task_key(&task_key.0, &task_id);
            // The id may have been reused by a live task since.
            if self
                .tasks
                .get(&old)
                .is_some_and(|t| t.state.is_terminal() && !t.terminal_unacked)
            {
                self.tasks.remove(&old);
                self.task_changed(&old);
            }
        }
    }

    /// Forgets every completed task of a framework (a removed framework dropped from history).
    pub(crate) fn forget_completed_of(&mut self, framework_id: &str) {
        let Some(list) = self.finished.remove(framework_id) else {
            return;
        };
        for task_id in list {
            let key: TaskKey = make_task_key(framework_id, &task_id);
            if self
                .tasks
                .get(&key)
                .is_some_and(|t| t.state.is_terminal() && !t.terminal_unacked)
            {
                self.tasks.remove(&key);
                self.task_changed(&key);
            }
        }
    }

    /// The current status of a task, without an update id, stamped at `now`.
    pub(crate) fn status_of(
        &self,
        task_key: &TaskKey,
        exit_code: Option<i32>,
        now: Instant,
    ) -> TaskStatus {
        let task = &self.tasks[task_key];
        TaskStatus {
            task_id: task_key.1.to_string(),
            framework_id: task_key.0.to_string(),
            agent_id: task.agent.to_string(),
            state: task.state as i32,
            reason: task.detail.reason().to_string(),
            message: task.detail.message().to_string(),
            exit_code,
            update_id: String::new(),
            timestamp_ms: self.started_unix_ms
                + now.saturating_duration_since(self.started).as_millis() as u64,
            devices: task.devices.to_wire(),
            health: task.health.to_wire(),
        }
    }

    /// Sends a status update to a framework and keeps it until acknowledged. A framework
    /// that is disconnected gets it when it re-subscribes.
    ///
    /// An update about a task supersedes the task's update still awaiting acknowledgement:
    /// that one is not sent again (it was sent once already, or the framework is away and
    /// hears the newer state when it comes back). So the master holds at most one update per
    /// task, and what it holds is rebuilt from the task's record when resent.
    pub(crate) fn deliver_update(
        &mut self,
        framework_id: &str,
        mut status: TaskStatus,
        now: Instant,
    ) {
        if !self.frameworks.contains_key(framework_id) {
            return;
        }
        let (seq, update_id) = self.fresh_update_id();
        status.update_id = update_id;
        let key: TaskKey = make_task_key(framework_id, &status.task_id);
        // Backed by the record when the record says what the update says; a completed task's
        // record may be forgotten while a re-told update is out, so that one is held whole.
        let backed = self.tasks.get_mut(&key).filter(|t| {
            t.state as i32 == status.state && (!t.state.is_terminal() || t.terminal_unacked)
        });
        let superseded = backed
            .and_then(|t| std::mem::replace(&mut t.pending_update, std::num::NonZeroU64::new(seq)));
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
        let whole = self
            .tasks
            .get(&key)
            .is_none_or(|t| t.pending_update.map(|s| s.get()) != Some(seq))
            .then(|| Box::new(status.clone()));
        let fw = self
            .frameworks
            .get_mut(framework_id)
            .expect("checked above");
        if let Some(old) = superseded {
            fw.unacked.remove(&old.get());
        }
        fw.unacked.insert(
            seq,
            Box::new(PendingUpdate {
                task_id: key.1,
                state,
                timestamp_ms: status.timestamp_ms,
                whole,
                last_sent: now,
                backoff: self.config.master.status_retry_interval,
            }),
        );
        if let Some(conn) = fw.conn {
            self.send(
                conn,
                Message::Update(Update {
                    status: Some(status),
                }),
            );
        }
    }

    /// The update held under `seq` as it was first sent, rebuilt from the task's record
    /// unless held whole; `None` when its record is gone.
    fn pending_status(
        &self,
        framework_id: &str,
        seq: u64,
        pending: &PendingUpdate,
    ) -> Option<TaskStatus> {
        if let Some(whole) = &pending.whole {
            return Some(TaskStatus::clone(whole));
        }
        let key: TaskKey = make_task_key(framework_id, &pending.task_id);
        let exit_code = self.tasks.get(&key)?.exit_code;
        let mut status = self.status_of(&key, exit_code, self.started);
        status.state = pending.state as i32;
        status.update_id = self.ids.update(seq);
        status.timestamp_ms = pending.timestamp_ms;
        Some(status)
    }

    /// The framework acknowledged an update.
    pub(crate) fn acknowledge(&mut self, framework_id: &str, update_id: &str, now: Instant) {
        let Some(fw) = self.frameworks.get_mut(framework_id) else {
            return;
        };
        // Only ids this incarnation minted: an older master's update id may carry the same
        // sequence number.
        let Some(seq) = self.ids.minted_update_seq(update_id) else {
            return;
        };
        let Some(acked) = fw.unacked.remove(&seq) else {
            return;
        };
        // Caught up below the backlog bound: its demand is offered to again.
        if fw.unacked.len() + 1 == self.config.master.max_unacked_updates {
            self.request_allocation(now);
        }
        let task_key: TaskKey = make_task_key(framework_id, &acked.task_id);
        let Some(task) = self.tasks.get_mut(&task_key) else {
            return;
        };
        if task.pending_update.map(|s| s.get()) == Some(seq) {
            task.pending_update = None;
        }
        if acked.state.is_terminal() && task.state.is_terminal() && task.terminal_unacked {
            task.terminal_unacked = false;
            self.task_changed(&task_key);
            self.remember_completed(&task_key);
        }
    }

    /// Resends every update whose backoff has passed since it was last sent (the first time
    /// after `status_retry_interval`, then doubling; see [`MAX_RETRY_BACKOFF`]).
    pub(crate) fn retry_updates(&mut self, now: Instant) {
        let cap = self.config.master.status_retry_interval * MAX_RETRY_BACKOFF;
        let mut due = Vec::new();
        for (id, fw) in self.frameworks.iter_mut() {
            let Some(conn) = fw.conn else { continue };
            for (seq, pending) in fw.unacked.iter_mut() {
                if now.duration_since(pending.last_sent) >= pending.backoff {
                    pending.last_sent = now;
                    pending.backoff = (pending.backoff * 2).min(cap);
                    due.push((conn, id.clone(), *seq));
                }
            }
        }
        for (conn, framework_id, seq) in due {
            self.resend(conn, &framework_id, seq);
        }
    }

    /// Sends the update held under `seq` again; one whose record is gone is dropped.
    fn resend(&mut self, conn: super::events::ConnId, framework_id: &str, seq: u64) {
        let Some(pending) = self
            .frameworks
            .get(framework_id)
            .and_then(|f| f.unacked.get(&seq))
        else {
            return;
        };
        match self.pending_status(framework_id, seq, pending) {
            Some(status) => self.send(
                conn,
                Message::Update(Update {
                    status: Some(status),
                }),
            ),
            None => {
                if let Some(fw) = self.frameworks.get_mut(framework_id) {
                    fw.unacked.remove(&seq);
                }
            }
        }
    }

    /// Resends every unacknowledged update of a framework, in order (after a re-subscribe).
    pub(crate) fn resend_all_updates(&mut self, framework_id: &str, now: Instant) {
        let retry = self.config.master.status_retry_interval;
        let Some(fw) = self.frameworks.get_mut(framework_id) else {
            return;
        };
        let Some(conn) = fw.conn else { return };
        let seqs: Vec<u64> = fw
            .unacked
            .iter_mut()
            .map(|(seq, p)| {
                p.last_sent = now;
                p.backoff = retry;
                *seq
            })
            .collect();
        for seq in seqs {
            self.resend(conn, framework_id, seq);
        }
    }
}
