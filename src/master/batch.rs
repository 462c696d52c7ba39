//! Batches: a framework's burst of one-shot, deadline-bound tasks matched at once.
//!
//! On `SubmitBatch` the master checks every task, matches the batch (pure
//! [`ringmaster_core::placement::matching`]) against the free resources of the connected agents that have no
//! outstanding offer, and sends one offer per matched agent holding exactly the suggested tasks'
//! resources, with the tasks in `Offer.suggested`; then a `BatchResult` with the unmatched tasks
//! and their reasons. From there the offers live the ordinary offer life: accept, decline,
//! timeout, rescind.

use std::collections::HashSet;

use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    BatchResult, ErrorCode, Message, Offers, Placement, SubmitBatch, TaskInfo, UnmatchedTask,
};
use tokio::time::Instant;

use super::events::ConnId;
use super::pending::agent_feasible;
use super::state::MasterState;
use ringmaster_core::placement::matching::{match_batch, AgentProfile, BatchTask, MatchAgent};

/// The most tasks one batch may hold.
pub(crate) const MAX_BATCH_TASKS: usize = 100_000;

impl MasterState {
    pub(crate) fn submit_batch(
        &mut self,
        conn: ConnId,
        framework_id: &str,
        batch: SubmitBatch,
        now: Instant,
    ) {
        let batch_id = batch.batch_id.clone();
        let (infos, tasks) = match self.check_batch(framework_id, batch) {
            Ok(checked) => checked,
            Err(problem) => {
                return self.send_error(
                    conn,
                    ErrorCode::InvalidRequest,
                    format!("SubmitBatch {batch_id:?}: {problem}; nothing matched"),
                )
            }
        };

        // Agents the batch may use: admitted, not under an offer, and feasible for the
        // framework by the same rules as the allocation cycle (connected, its partition, not
        // held for another framework, not declined by it; `feasible::check`). Sorted by id so
        // the result does not depend on hash order.
        let busy: HashSet<&str> = self.offers.values().map(|o| o.agent.as_str()).collect();
        let framework = &self.frameworks[framework_id];
        let mut usable: Vec<(&str, usize)> = self
            .agents
            .values()
            .filter(|a| !a.lost && !busy.contains(a.id.as_str()))
            .filter(|a| {
                let held = a
                    .key
                    .is_some_and(|k| self.alloc.holds().held_for_other(k, framework.key, now));
                agent_feasible(Some(a), framework, true, held, now).is_ok()
            })
            .filter_map(|a| a.key.map(|k| (a.id.as_str(), k)))
            .collect();
        usable.sort_unstable();
        let mut agents = Vec::with_capacity(usable.len());
        for (id, key) in &usable {
            let Some(entry) = self.alloc.cluster().agent(*key) else {
                continue;
            };
            let (profile, problems) = AgentProfile::from_attributes(&self.agents[*id].attributes);
            for problem in problems {
                tracing::warn!(agent = %id, %problem, "agent attribute ignored for matching");
            }
            agents.push(MatchAgent {
                id: id.to_string(),
                total: entry.total.clone(),
                free: entry.free.clone(),
                profile,
            });
        }
        let keys: Vec<usize> = usable.iter().map(|(_, k)| *k).collect();
        drop(busy);

        let result = match_batch(&tasks, &agents, &self.config.matching);
        tracing::info!(framework = %framework_id, batch = %batch_id, tasks = tasks.len(),
            agents = agents.len(), matched = result.matches.len(), proposals = result.proposals,
            "batch matched");

        // One offer per matched agent, in agent order.
        let mut per_agent: Vec<Vec<usize>> = vec![Vec::new(); agents.len()];
        for m in &result.matches {
            per_agent[m.agent].push(m.task);
        }
        let fw_key = self.frameworks[framework_id].key;
        let mut offers = Vec::new();
        let mut offer_ids = Vec::new();
        let mut matched = 0u32;
        for (a, task_indices) in per_agent.iter().enumerate() {
            if task_indices.is_empty() {
                continue;
            }
            let mut sum = Resources::new();
            for &t in task_indices {
                // Within the agent's free resources (the matcher never over-commits), so no overflow.
                sum = sum.checked_add(&tasks[t].resources).unwrap_or(sum);
            }
            if let Err(e) = self.alloc.offer_taken(keys[a], fw_key, &sum) {
                tracing::error!(agent = %agents[a].id, error = %e, "batch offer refused by the cluster books; tasks left unmatched");
                continue;
            }
            let agent_id = agents[a].id.clone();
            let suggested: Vec<TaskInfo> = task_indices
                .iter()
                .map(|&t| {
                    let mut info = infos[t].clone();
                    info.agent_id = agent_id.clone();
                    info
                })
                .collect();
            matched += suggested.len() as u32;
            let placement = Placement {
                placer: "matching".into(),
                ..Placement::default()
            };
            let mut offer = self.book_offer(framework_id, &agent_id, sum.clone(), placement, now);
            offer.suggested = suggested;
            offer.batch_id = batch_id.clone();
            let offer_id = offer.offer_id.clone();
            offers.push(offer);
            tracing::info!(offer = %offer_id, framework = %framework_id, agent = %agent_id,
                resources = %sum, batch = %batch_id, tasks = task_indices.len(), "batch offer");
            offer_ids.push(offer_id);
        }
        let placed: HashSet<&str> = offers
            .iter()
            .flat_map(|o| o.suggested.iter().map(|t| t.task_id.as_str()))
            .collect();
        let mut unmatched: Vec<UnmatchedTask> = result
            .unmatched
            .iter()
            .map(|&(t, reason)| UnmatchedTask {
                task_id: tasks[t].id.clone(),
                reason: reason.code().into(),
                message: reason.to_string(),
            })
            .collect();
        // Matched but refused by the books (should not happen): report, never drop silently.
        for m in &result.matches {
            if !placed.contains(tasks[m.task].id.as_str()) {
                unmatched.push(UnmatchedTask {
                    task_id: tasks[m.task].id.clone(),
                    reason: "internal".into(),
                    message: "the agent's resources changed while matching".into(),
                });
            }
        }
        if !offers.is_empty() {
            self.send(conn, Message::Offers(Offers { offers }));
        }
        self.send(
            conn,
            Message::BatchResult(BatchResult {
                batch_id,
                unmatched,
                proposals: result.proposals,
                matched,
                offer_ids,
            }),
        );
    }

    /// Checks every task of a batch; any problem refuses the whole batch.
    fn check_batch(
        &self,
        framework_id: &str,
        batch: SubmitBatch,
    ) -> Result<(Vec<TaskInfo>, Vec<BatchTask>), String> {
        if batch.tasks.is_empty() {
            return Err("the batch has no tasks".into());
        }
        if batch.tasks.len() > MAX_BATCH_TASKS {
            return Err(format!(
                "{} tasks is more than the {MAX_BATCH_TASKS} a batch may hold",
                batch.tasks.len()
            ));
        }
        let mut seen = HashSet::new();
        let mut infos = Vec::with_capacity(batch.tasks.len());
        let mut tasks = Vec::with_capacity(batch.tasks.len());
        for (i, task) in batch.tasks.into_iter().enumerate() {
            let Some(info) = task.task else {
                return Err(format!("task #{i} has no TaskInfo"));
            };
            let resources = self
                .check_task(framework_id, &info, &mut seen)
                .map_err(|e| format!("task #{i}: {e}"))?;
            let id = info.task_id.clone();
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !positive(task.deadline_secs) {
                return Err(format!(
                    "task {id}: deadline_secs must be a number > 0, got {}",
                    task.deadline_secs
                ));
            }
            if !positive(task.work) {
                return Err(format!(
                    "task {id}: work must be a number > 0, got {}",
                    task.work
                ));
            }
            if !(task.price.is_finite() && task.price >= 0.0) {
                return Err(format!(
                    "task {id}: price must be a number ≥ 0, got {}",
                    task.price
                ));
            }
            tasks.push(BatchTask {
                id,
                resources,
                deadline_secs: task.deadline_secs,
                work: task.work,
                price: task.price,
            });
            infos.push(info);
        }
        Ok((infos, tasks))
    }
}
