//! The master's state and its actor loop.
//!
//! `MasterState` is owned by exactly one task. Connection tasks send it [`Event`]s; it answers
//! through each connection's outbound channel. Timers (agent, offer and failover timeouts,
//! status-update retries, batched allocation) run inside the same loop, so the state is
//! only ever changed in one place, one event at a time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use compact_str::CompactString;

use ringmaster_proto::{Error as ProtoError, ErrorCode, Message};
use tokio::time::{Duration, Instant};

use super::allocator::Allocator;
use super::events::{ConnId, Event, Outbound};
use super::ids::IdMint;
use super::metrics::Metrics;
use super::owners::IdOwners;
use super::registry::Registry;
use super::server::limits::SendRefused;
use crate::config::Config;
use ringmaster_core::placement::{FrameworkKey, UnservedReason};

/// The durable registry (`--work-dir`) and what the current actor turn changed in it. Held by
/// the state; `super::durability` fills and commits it.
pub(crate) struct Durable {
    /// Shared with the replication state machine in cluster mode (one open database).
    pub registry: Arc<Registry>,
    pub frameworks: HashSet<String>,
    pub agents: HashSet<String>,
    pub tasks: HashSet<TaskKey>,
    pub removed: Vec<String>,
    /// Removed frameworks dropped from the bounded history this turn.
    pub forgotten: Vec<String>,
    pub id_epoch: Option<u64>,
    /// Messages of this turn, sent once its changes are committed.
    pub outbox: Vec<(ConnId, Outbound)>,
    /// The jobs framework's record changes of this turn, and who waits for their commit.
    pub jobs: Vec<(String, Option<serde_json::Value>)>,
    pub jobs_meta: Option<super::registry::JobsMeta>,
    pub job_replies: Vec<tokio::sync::oneshot::Sender<Result<(), String>>>,
    /// `/state` answers of this turn, held with its messages in cluster mode (see
    /// [`super::pipeline`]).
    pub snapshots: Vec<(
        tokio::sync::oneshot::Sender<super::ops::model::Snapshot>,
        super::ops::model::Snapshot,
    )>,
}

impl Durable {
    pub fn new(registry: Arc<Registry>) -> Self {
        Durable {
            registry,
            frameworks: HashSet::new(),
            agents: HashSet::new(),
            tasks: HashSet::new(),
            removed: Vec::new(),
            forgotten: Vec::new(),
            id_epoch: None,
            outbox: Vec::new(),
            jobs: Vec::new(),
            jobs_meta: None,
            job_replies: Vec::new(),
            snapshots: Vec::new(),
        }
    }
}

pub(crate) use super::records::*;

/// Why [`MasterState::serve`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// Asked to stop, or every event sender is gone.
    Stopped,
    /// A turn could not be recorded.
    Failed,
    /// The replication group has another leader.
    NotLeader,
}

pub struct MasterState {
    pub(crate) config: Arc<Config>,
    /// This master's group, shown in `/state` (cluster mode).
    pub(crate) cluster: Option<super::ops::model::ClusterView>,
    /// The leader's live view of its group (cluster mode): `/state` asks it each time, so an
    /// added master shows at once. Takes precedence over `cluster`.
    pub(crate) cluster_view: Option<Arc<dyn Fn() -> super::ops::model::ClusterView + Send + Sync>>,
    /// Records each turn in the replication group (cluster mode); `None`: the registry alone.
    pub(crate) replicator: Option<Arc<dyn super::replication::Replicator>>,
    /// The Raft term this master leads in (0 without replication): stamped on every RunTasks
    /// and KillTask so agents can refuse a deposed leader's commands.
    pub(crate) leader_term: u64,
    pub(crate) ids: IdMint,
    /// The placement core's books: cluster, DRF, quota ledger, devices, launched shapes and
    /// the key maps (see [`super::allocator`]).
    pub(crate) alloc: Allocator,
    pub(crate) agents: HashMap<String, AgentRecord>,
    pub(crate) frameworks: HashMap<String, FrameworkRecord>,
    /// Frameworks removed after their failover timeout or teardown; they may not come back.
    /// The newest `max_removed_frameworks` are remembered.
    pub(crate) removed_frameworks: super::history::History,
    pub(crate) offers: HashMap<String, OfferRecord>,
    pub(crate) tasks: super::task_table::TaskTable,
    /// Ended tasks whose terminal update was acknowledged, by framework, oldest first: kept
    /// for reconciliation and state, up to `max_completed_tasks_per_framework` each.
    pub(crate) finished: HashMap<String, VecDeque<CompactString>>,
    pub(crate) conns: HashMap<ConnId, ConnRecord>,
    pub(crate) next_update: u64,
    /// When set, an allocation run is due at this instant (events are batched).
    pub(crate) allocation_due: Option<Instant>,
    pub(crate) counters: Counters,
    /// Frameworks the last allocation run left with demand it could not serve, with the
    /// cycle's own reason (shown by "why pending").
    pub(crate) unserved: HashMap<FrameworkKey, UnservedReason>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) started: Instant,
    /// Unix milliseconds at `started`: status timestamps are `started_unix_ms` plus the
    /// injected `now` since `started`, so the state machine reads no clock itself.
    pub(crate) started_unix_ms: u64,
    /// Launch counter: the next task's start order.
    pub(crate) launches: u64,
    /// Which principal holds each framework and agent id (docs/security.md).
    pub(crate) owners: IdOwners,
    /// The durable registry (`--work-dir`) and this turn's changes to it; `None` keeps
    /// everything in memory only.
    pub(crate) durable: Option<Durable>,
    /// Reads of task output sent to agents and not answered yet (bounded).
    pub(crate) reads: super::files::PendingReads,
    /// The latest usage sample of each running task (in memory only, see `usage`).
    pub(crate) usage: super::usage_book::UsageBook,
}

pub use super::ops::model::Counters;

impl MasterState {
    /// The live tasks on `agent_id` (its [`AgentRecord::tasks`]), in no particular order.
    pub(crate) fn agent_tasks(&self, agent_id: &str) -> Vec<TaskKey> {
        self.agents.get(agent_id).map_or_else(Vec::new, |agent| {
            self.tasks.resolve(&agent.tasks, |_, t| {
                t.agent == agent_id && !t.state.is_terminal()
            })
        })
    }

    /// The live tasks of `framework_id` (its [`FrameworkRecord::tasks`]), in no particular
    /// order.
    pub(crate) fn framework_tasks(&self, framework_id: &str) -> Vec<TaskKey> {
        self.frameworks
            .get(framework_id)
            .map_or_else(Vec::new, |fw| {
                self.tasks.resolve(&fw.tasks, |key, t| {
                    key.0 == framework_id && !t.state.is_terminal()
                })
            })
    }

    /// A state started at `now` (the caller's clock: the actor passes `Instant::now()`).
    pub fn new(config: Arc<Config>, metrics: Arc<Metrics>, now: Instant) -> Self {
        MasterState {
            replicator: None,
            cluster: None,
            cluster_view: None,
            leader_term: 0,
            alloc: Allocator::new(&config),
            config,
            ids: IdMint::new(),
            agents: HashMap::new(),
            frameworks: HashMap::new(),
            removed_frameworks: Default::default(),
            offers: HashMap::new(),
            tasks: Default::default(),
            finished: HashMap::new(),
            conns: HashMap::new(),
            next_update: 0,
            allocation_due: None,
            counters: Counters::default(),
            unserved: HashMap::new(),
            metrics,
            started: now,
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            launches: 0,
            owners: IdOwners::default(),
            durable: None,
            reads: Default::default(),
            usage: Default::default(),
        }
    }

    pub(crate) fn tick_interval(&self) -> Duration {
        let m = &self.config.master;
        let shortest = [
            m.agent_timeout,
            m.offer_timeout,
            m.status_retry_interval,
            m.heartbeat_interval,
        ]
        .into_iter()
        .min()
        .unwrap_or(Duration::from_secs(1));
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }

    pub(crate) fn handle(&mut self, event: Event, now: Instant) {
        match event {
            Event::Opened {
                conn,
                peer,
                outbound,
                first,
                principal,
            } => {
                self.conns.insert(
                    conn,
                    ConnRecord {
                        outbound,
                        peer: None,
                    },
                );
                if let Err(refusal) = self.owners.check(&first, principal.as_deref()) {
                    self.metrics.auth_failed("not_owner");
                    return self.close(conn, ErrorCode::NotAuthorized, refusal);
                }
                match first {
                    Message::RegisterAgent(register) => {
                        self.register_agent(conn, peer, register, now)
                    }
                    Message::Subscribe(subscribe) => self.subscribe(conn, subscribe, now),
                    other => self.close(
                        conn,
                        ErrorCode::NotRegistered,
                        format!("{} before RegisterAgent or Subscribe", other.kind()),
                    ),
                }
                if let Some(peer) = self.conns.get(&conn).and_then(|c| c.peer.as_ref()) {
                    self.owners.record(peer, principal);
                }
            }
            Event::Inbound { conn, message } => {
                let Some(peer) = self.conns.get(&conn).and_then(|c| c.peer.clone()) else {
                    // Refused at registration; the connection is closing.
                    return;
                };
                match peer {
                    Peer::Agent(id) => self.agent_message(conn, &id, message, now),
                    Peer::Framework(id) => self.framework_message(conn, &id, message, now),
                }
            }
            Event::Closed { conn } => {
                if let Some(record) = self.conns.remove(&conn) {
                    match record.peer {
                        Some(Peer::Agent(id)) => self.agent_disconnected(&id, conn, now),
                        Some(Peer::Framework(id)) => self.framework_disconnected(&id, conn, now),
                        None => {}
                    }
                }
            }
            Event::Snapshot(reply) => {
                let snapshot = self.snapshot(now);
                match (&self.replicator, &mut self.durable) {
                    // A leader's answer shows decisions still on their way to a quorum: it
                    // leaves with them (super::pipeline).
                    (Some(_), Some(durable)) => durable.snapshots.push((reply, snapshot)),
                    _ => {
                        let _ = reply.send(snapshot);
                    }
                }
            }
            Event::PublishMetrics(reply) => {
                self.publish_metrics(now);
                let _ = reply.send(());
            }
            Event::Plan {
                demand,
                count,
                placement,
                reply,
            } => {
                let _ = reply.send(self.plan(&demand, count, &placement, now));
            }
            Event::ReadFile { request, reply } => self.read_file(request, reply, now),
            Event::Health(reply) => {
                let _ = reply.send(self.health(now));
            }
            Event::SaveJobs { jobs, meta, reply } => self.save_jobs(jobs, meta, reply),
        }
    }

    /// Timers: lost agents, expired offers, failed-over frameworks, update retries, filters.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.expire_agents(now);
        self.expire_offers(now);
        self.expire_frameworks(now);
        self.retry_updates(now);
        self.reads.expire(now);
        // Either may free agents for other frameworks: both run, then one allocation request.
        let filters = self.filters_expired(now);
        let holds = self.holds_expired(now);
        if filters || holds {
            self.request_allocation(now);
        }
    }

    /// Schedules an allocation run within `allocation_interval` (batching bursts of events).
    pub(crate) fn request_allocation(&mut self, now: Instant) {
        if self.allocation_due.is_none() {
            self.allocation_due = Some(now + self.config.master.allocation_interval);
        }
    }

    pub(crate) fn send(&mut self, conn: ConnId, message: Message) {
        self.send_outbound(conn, Outbound::Send(message));
    }

    /// Sends now, or, with a registry, after this turn's changes are committed.
    pub(crate) fn send_outbound(&mut self, conn: ConnId, outbound: Outbound) {
        if let Some(durable) = &mut self.durable {
            durable.outbox.push((conn, outbound));
        } else {
            self.deliver(conn, outbound);
        }
    }

    /// Puts a message in the connection's bounded outbound queue (see `limits`).
    pub(crate) fn deliver(&mut self, conn: ConnId, outbound: Outbound) {
        if let Some(c) = self.conns.get(&conn) {
            if c.outbound.send(outbound) == Err(SendRefused::Overflowed) {
                // The connection task closes it with SLOW_CONSUMER (and counts it); its peer
                // is then disconnected the usual way when its Closed event arrives.
                tracing::warn!(
                    conn,
                    "outbound queue full: closing a connection that does not read"
                );
                self.counters.errors_sent += 1;
            }
        }
    }

    /// Sends an error that does not end the conversation.
    pub(crate) fn send_error(&mut self, conn: ConnId, code: ErrorCode, message: String) {
        tracing::info!(conn, code = ?code, %message, "error sent");
        self.counters.errors_sent += 1;
        self.send(conn, Message::Error(ProtoError::new(code, message)));
    }

    /// Sends an error and closes the connection.
    pub(crate) fn close(&mut self, conn: ConnId, code: ErrorCode, message: String) {
        tracing::warn!(conn, code = ?code, %message, "closing connection");
        self.counters.errors_sent += 1;
        if let Some(c) = self.conns.get_mut(&conn) {
            // Whatever it sends from now on is ignored.
            c.peer = None;
            self.send_outbound(conn, Outbound::Close(ProtoError::new(code, message)));
        }
    }

    pub(crate) fn fresh_update_id(&mut self) -> (u64, String) {
        self.next_update += 1;
        (self.next_update, self.ids.update(self.next_update))
    }
}
