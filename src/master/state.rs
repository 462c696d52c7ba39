//! The master's state and its actor loop.
//!
//! `MasterState` is owned by exactly one task. Connection tasks send it [`Event`]s; it answers
//! through each connection's outbound channel. Timers (agent, offer and failover timeouts,
//! status-update retries, batched allocation) run inside the same loop, so the state is
//! only ever changed in one place, one event at a time.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use compact_str::CompactString;

use ringmaster_proto::devices::ShareFill;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Error as ProtoError, ErrorCode, Message, TaskState, TaskStatus};
use tokio::sync::{mpsc, watch};
use tokio::time::{Duration, Instant};

use super::allocator::Allocator;
use super::events::{ConnId, Event, Outbound};
use super::ids::IdMint;
use super::metrics::Metrics;
use super::owners::IdOwners;
use super::registry::Registry;
use super::server::limits::{OutboundSender, SendRefused};
use super::task_table::TaskRefs;
use crate::config::Config;
use ringmaster_core::placement::{
    AgentKey, FrameworkKey, Priority, UnservedReason, DEFAULT_PARTITION,
};

/// A task is named by its framework and its framework-chosen id. Both are short (a framework
/// id is about 12 bytes) and kept inline: a key costs no allocation, and a task's key is held
/// by its record, its agent's and its framework's sets.
pub(crate) type TaskKey = (CompactString, CompactString);

/// The key of a framework's task.
pub(crate) fn make_task_key(framework_id: &str, task_id: &str) -> TaskKey {
    (framework_id.into(), task_id.into())
}

pub(crate) struct AgentRecord {
    pub id: String,
    pub hostname: String,
    pub attributes: Vec<(String, String)>,
    pub total: Resources,
    /// Free resources as the agent last reported them: informational, but for its `disk`, which
    /// bounds what is offered there (`Allocator::bound_free_disk`).
    pub reported_free: Resources,
    /// Present while the agent is admitted (not lost).
    pub key: Option<AgentKey>,
    pub conn: Option<ConnId>,
    pub last_heartbeat: Instant,
    /// Its live (not ended) tasks: [`MasterState::agent_tasks`] lists them.
    pub tasks: TaskRefs,
    pub lost: bool,
    /// After a preemption: the framework the freed room is kept for, until the instant.
    pub held_for: Option<(String, Instant)>,
    /// Recovered from the registry and not re-registered yet: lost at this instant
    /// (`agent_reregister_timeout` after the master's start) unless it comes back.
    pub reregister_by: Option<Instant>,
}

impl AgentRecord {
    /// The agent's partition: its `partition` attribute, else `default`.
    pub fn partition(&self) -> &str {
        self.attributes
            .iter()
            .find(|(k, _)| k == "partition")
            .map(|(_, v)| v.as_str())
            .unwrap_or(DEFAULT_PARTITION)
    }
}

pub(crate) struct FrameworkRecord {
    pub id: String,
    pub key: FrameworkKey,
    pub name: String,
    /// Its user and partition (`default` when the Subscribe named none), shared with its tasks.
    pub tenant: Arc<Tenant>,
    pub weight: f64,
    pub failover_timeout: Duration,
    pub conn: Option<ConnId>,
    pub disconnected_at: Option<Instant>,
    pub demand: Resources,
    pub demand_count: u32,
    pub suppressed: bool,
    pub offers: HashSet<String>,
    /// Its live (not ended) tasks: [`MasterState::framework_tasks`] lists them.
    pub tasks: TaskRefs,
    /// The resources of its latest launched task, shared by its next tasks of the same
    /// resources (a framework mostly launches one shape).
    pub last_resources: Option<Arc<Resources>>,
    /// Agents declined by this framework, not offered to it again before the instant.
    pub filters: HashMap<String, Instant>,
    /// Status updates sent and not yet acknowledged, by update id, in send order.
    pub unacked: BTreeMap<u64, Box<PendingUpdate>>,
}

/// An update sent to a framework and not acknowledged yet. It holds what the task record
/// cannot rebuild (the update's time and state); a resend rebuilds the rest from the record,
/// so custody costs a few dozen bytes per task, not a second copy of its status. An update
/// that no record backs (about an unknown task) is held whole. A task has at most one
/// pending update: a newer one supersedes it (see `deliver_update`).
pub(crate) struct PendingUpdate {
    pub task_id: CompactString,
    pub state: TaskState,
    pub timestamp_ms: u64,
    /// The whole update, when no task record backs it.
    pub whole: Option<Box<TaskStatus>>,
    pub last_sent: Instant,
    /// Time from `last_sent` to the next resend: `status_retry_interval`, doubled after each
    /// resend up to [`MAX_RETRY_BACKOFF`] times it, back to the start when the framework
    /// re-subscribes.
    pub backoff: Duration,
}

/// An unacknowledged update is resent after `status_retry_interval`, then after twice that,
/// and so on up to this many times the interval (64 s by default), as Mesos backs off its
/// status-update retries: a framework that is slow to read is not buried under copies of the
/// updates it has not yet reached.
pub(crate) const MAX_RETRY_BACKOFF: u32 = 32;

pub(crate) struct OfferRecord {
    pub id: String,
    pub framework: String,
    pub agent: String,
    pub resources: Resources,
    pub expires: Instant,
    /// The share fill of the cycle that made the offer: how its Accept binds GPU slices when
    /// devices are packed (the binding the cycle's score assumed).
    pub fill: Arc<ShareFill>,
}

/// Who a framework's tasks run for, and where: one allocation per framework, shared by its
/// tasks (a pointer in each task record instead of two).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Tenant {
    pub user: Box<str>,
    pub partition: Box<str>,
}

impl Tenant {
    pub fn new(user: &str, partition: &str) -> Arc<Self> {
        Arc::new(Tenant {
            user: user.into(),
            partition: partition.into(),
        })
    }
}

/// Why a task is in its state and what its agent said: one pointer, null while both are empty
/// (most running tasks), instead of two boxed strings in every record.
#[derive(Default)]
pub(crate) struct Detail(Option<Box<(Box<str>, Box<str>)>>);

impl Detail {
    pub fn new(reason: &str, message: &str) -> Self {
        if reason.is_empty() && message.is_empty() {
            Detail(None)
        } else {
            Detail(Some(Box::new((reason.into(), message.into()))))
        }
    }

    pub fn reason(&self) -> &str {
        self.0.as_ref().map_or("", |d| &d.0)
    }

    pub fn message(&self) -> &str {
        self.0.as_ref().map_or("", |d| &d.1)
    }
}

pub(crate) struct TaskRecord {
    pub agent: CompactString,
    pub name: CompactString,
    /// Shared with the framework's other tasks of the same resources (`FrameworkRecord::
    /// last_resources`): one bundle per framework and shape, not per task.
    pub resources: Arc<Resources>,
    pub state: TaskState,
    /// Its reason and message.
    pub detail: Detail,
    /// Whether the task's resources are currently counted as used on its agent.
    pub holds_resources: bool,
    /// The priority set at accept time (docs/priorities.md).
    pub priority: Priority,
    /// Runs at its user's priority, so it counts against the quota of (user, partition).
    pub at_user_priority: bool,
    /// Shared with its framework's record (one allocation per framework, not per task).
    pub tenant: Arc<Tenant>,
    /// Launch order, for choosing preemption victims (most recent first).
    pub started: u64,
    /// Killed to make room for a higher-priority demand: ends KILLED with reason `preempted`.
    pub preempted: bool,
    /// The exit status of an ended task, when it has one.
    pub exit_code: Option<i32>,
    /// Ended, and the framework has not acknowledged the terminal update yet (persisted, so
    /// the update is sent again after a master restart).
    pub terminal_unacked: bool,
    /// The GPU devices the master bound it to (docs/devices.md); empty without a GPU request.
    pub devices: ringmaster_proto::devices::DeviceBinding,
    /// The sequence number of its update awaiting acknowledgement, if any (sequence numbers
    /// start at 1: the niche keeps this at 8 bytes, which makes room for `health`).
    pub pending_update: Option<std::num::NonZeroU64>,
    /// The last health its agent reported (one byte; not kept in the registry: an agent
    /// re-registering reports it again).
    pub health: super::health::Health,
}

#[cfg(test)]
impl TaskRecord {
    /// A running task on `agent`, for tests of the structures that hold records.
    pub fn for_tests(agent: &str) -> Self {
        TaskRecord {
            agent: agent.into(),
            name: CompactString::default(),
            resources: Arc::default(),
            state: TaskState::TaskRunning,
            detail: Detail::default(),
            holds_resources: false,
            priority: 0,
            at_user_priority: false,
            tenant: Tenant::new("u", DEFAULT_PARTITION),
            started: 0,
            preempted: false,
            exit_code: None,
            terminal_unacked: false,
            devices: Default::default(),
            pending_update: None,
            health: Default::default(),
        }
    }
}

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

pub(crate) use super::owners::Peer;

pub(crate) struct ConnRecord {
    /// Bounded: see [`super::limits`].
    pub outbound: OutboundSender,
    pub peer: Option<Peer>,
}

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
    pub(crate) usage: super::usage::UsageBook,
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

    /// The actor loop: events, timers and batched allocation, until shutdown.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        self.serve(&mut events, &mut shutdown).await;
    }

    /// The actor loop: handles events, timers and allocation runs until `stop` turns true, the
    /// event channel closes, or a turn cannot be recorded (then nothing more may be decided).
    /// With a replicator each turn is recorded by the replication group; a master that turns
    /// out not to lead any more stops ([`RunEnd::NotLeader`]).
    pub(crate) async fn serve(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        stop: &mut watch::Receiver<bool>,
    ) -> RunEnd {
        let tick_every = self.tick_interval();
        let mut ticker = tokio::time::interval(tick_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A tick far later than due means the master itself stalled (docs/reliability.md).
        let mut ticks = super::liveness::PauseDetector::new(tick_every);
        // Cluster mode: turns submitted to the group and not yet committed.
        let mut pipeline = super::pipeline::Pipeline::default();
        let end = loop {
            let due = self.allocation_due;
            let room = pipeline.has_room();
            tokio::select! {
                event = events.recv(), if room => {
                    let Some(event) = event else { break RunEnd::Stopped };
                    self.handle(event, Instant::now());
                    // Handle what is already queued before timers: bursts stay cheap.
                    while let Ok(event) = events.try_recv() {
                        self.handle(event, Instant::now());
                    }
                }
                _ = ticker.tick() => self.timer_fired(&mut ticks, Instant::now()),
                _ = sleep_until_opt(due), if room => {
                    self.allocation_due = None;
                    let started = std::time::Instant::now();
                    self.allocate(Instant::now());
                    self.metrics.allocation_took(started.elapsed().as_secs_f64());
                }
                (released, submitted, committed) = pipeline.next() => {
                    let answer = committed.as_ref().map(|_| ()).map_err(|e| e.to_string());
                    self.release(released, answer);
                    match committed {
                        Ok(()) => self
                            .metrics
                            .replication_commit_took(submitted.elapsed().as_secs_f64()),
                        Err(e) => break self.replication_failed(e),
                    }
                    continue;
                }
                _ = stop.wait_for(|stop| *stop) => break RunEnd::Stopped,
            }
            // Group commit: the turn's registry changes go to disk, then its messages out;
            // with replication the turn joins the pipeline and its messages leave once a
            // quorum of masters holds it (super::pipeline).
            match self.replicator.clone() {
                None => {
                    if let Err(e) = self.commit_turn() {
                        tracing::error!(
                            "{e}; the master stops rather than act on unrecorded decisions"
                        );
                        break RunEnd::Failed;
                    }
                }
                Some(replicator) => {
                    if let Err(e) = self.submit_turn(&*replicator, &mut pipeline).await {
                        break self.replication_failed(e);
                    }
                }
            }
        };
        // Turns already committed still go out: the group holds them, so their messages are
        // as good as the ones sent before (agents fence a deposed leader by its term).
        if end == RunEnd::Stopped {
            use futures::FutureExt as _;
            while let Some((released, _, Ok(()))) = pipeline.next().now_or_never() {
                self.release(released, Ok(()));
            }
        }
        tracing::info!(?end, "master actor stopped");
        end
    }

    /// Why serving ends when a turn could not be replicated.
    fn replication_failed(&self, error: super::replication::ReplicationError) -> RunEnd {
        match error {
            super::replication::ReplicationError::NotLeader { leader, .. } => {
                tracing::warn!(?leader, "no longer the leader: this master steps down");
                RunEnd::NotLeader
            }
            e => {
                tracing::error!("{e}; the master stops rather than act on unrecorded decisions");
                RunEnd::Failed
            }
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

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
