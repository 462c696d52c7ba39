//! Prometheus metrics of the master, served as text by `GET /metrics`.
//!
//! Two kinds of numbers share one `prometheus-client` registry behind an `Arc`:
//! - counted where they happen: messages in and out and rejected frames (in the connection
//!   tasks), allocation latency and placement phases (in the actor). They are atomics, so a
//!   connection task never waits on the actor to count.
//! - read off the actor's state when scraped: agents, frameworks, offers, tasks, resources and
//!   the actor's own monotonic counters. The actor remains the one owner of that state; when
//!   the HTTP handler asks through the event channel, the actor (`super::views`) reads the
//!   numbers off its state and hands them to the `set_*` methods here as plain values.
//!
//! This module knows nothing of the master's state types: it depends on the placement phase
//! and proto's resources and task states only.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use ringmaster_proto::resources::Resources;
use ringmaster_proto::TaskState;

use ringmaster_core::placement::Phase;

/// One fixed label, e.g. `[("state", "connected")]`.
type Label = [(&'static str, &'static str); 1];
/// A resource series: `[("dimension", "cpus"), ("kind", "total")]`.
type ResourceLabel = [(&'static str, String); 2];
type PeerLabel = [(&'static str, String); 1];

/// Why a connection's bytes or messages were refused (label `reason` of `frames_rejected`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rejection {
    /// Not a frame: too large, truncated, or not a valid envelope.
    BadFrame,
    /// A well-formed frame with a message type this master does not know.
    UnknownMessage,
    /// A valid message at the wrong time or from the wrong role (including a handshake out
    /// of order).
    UnexpectedMessage,
}

impl Rejection {
    fn label(self) -> &'static str {
        match self {
            Rejection::BadFrame => "bad_frame",
            Rejection::UnknownMessage => "unknown_message",
            Rejection::UnexpectedMessage => "unexpected_message",
        }
    }
}

/// Which per-connection limit closed a connection (label `limit` of `connections_limited`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    /// More messages per second than `limits.messages_per_sec` / `burst`.
    MessageRate,
    /// More unread messages queued to the peer than `limits.outbound_queue`.
    OutboundQueue,
}

impl Limit {
    fn label(self) -> &'static str {
        match self {
            Limit::MessageRate => "message_rate",
            Limit::OutboundQueue => "outbound_queue",
        }
    }
}

/// Labels of `auth_failures_total`: no Authenticate where one is required, a malformed one,
/// an unknown principal, a wrong answer, a role, user or id the principal may not take.
pub(crate) const AUTH_FAILURE_REASONS: [&str; 7] = [
    "missing",
    "malformed",
    "unknown_principal",
    "bad_secret",
    "role_not_allowed",
    "user_not_allowed",
    "not_owner",
];

/// Labels of `http_auth_failures_total`: HTTP requests refused for no credentials, wrong ones,
/// an expired token, or a principal without the route's role (docs/security.md, "HTTP API").
pub(crate) const HTTP_AUTH_FAILURE_REASONS: [&str; 4] =
    ["missing", "bad_credentials", "expired", "forbidden"];

/// Labels of `tls_handshake_failures_total`: plain protocol bytes sent to the TLS port, a failed
/// handshake (bad certificate, wrong CA, garbage), or no handshake in time.
pub(crate) const TLS_FAILURE_REASONS: [&str; 3] = ["plaintext", "handshake", "timeout"];

/// Labels of `usage_reports_refused_total`: usage entries an agent reported that the master
/// dropped as implausible (docs/protocol.md, "Task usage").
pub(crate) const USAGE_REFUSAL_REASONS: [&str; 3] = [
    "memory_above_total",
    "cpu_went_backwards",
    "time_out_of_range",
];

/// Every task state a series exists for, so series do not appear and vanish.
const TASK_STATES: [TaskState; 6] = [
    TaskState::TaskStaging,
    TaskState::TaskRunning,
    TaskState::TaskFinished,
    TaskState::TaskFailed,
    TaskState::TaskKilled,
    TaskState::TaskLost,
];

/// The master's metrics. See `docs/operations.md` for every series.
pub struct Metrics {
    registry: Registry,
    messages_received: Family<Label, Counter>,
    messages_sent: Family<Label, Counter>,
    frames_rejected: Family<Label, Counter>,
    connections_limited: Family<Label, Counter>,
    connections_refused: Counter,
    connections_open: Gauge,
    allocation_seconds: Histogram,
    placements: Family<Label, Counter>,
    preemptions: Counter,
    agents: Family<Label, Gauge>,
    frameworks: Family<Label, Gauge>,
    tasks: Family<Label, Gauge>,
    offers_outstanding: Gauge,
    pending_demands: Gauge,
    resources: Family<ResourceLabel, Gauge<f64, AtomicU64>>,
    offers_made: Counter,
    offers_accepted: Counter,
    offers_declined: Counter,
    offers_rescinded: Counter,
    tasks_launched: Counter,
    allocation_runs: Counter,
    agents_lost: Counter,
    frameworks_removed: Counter,
    errors_sent: Counter,
    auth_failures: Family<Label, Counter>,
    http_auth_failures: Family<Label, Counter>,
    tls_handshake_failures: Family<Label, Counter>,
    usage_refused: Family<Label, Counter>,
    /// Replication (cluster mode; docs/architecture.md, "Replication").
    replication_commit_seconds: Histogram,
    /// A single master's registry commit (`--work-dir`, no cluster).
    registry_commit_seconds: Histogram,
    /// Entries each follower lacks, as the leader sees it (label `peer`: its id).
    raft_replication_lag: Family<PeerLabel, Gauge>,
    raft_term: Gauge,
    raft_applied_index: Gauge,
    raft_is_leader: Gauge,
    raft_leader_changes: Counter,
    /// Dimensions with a `resources` series, so one that disappears is set to 0.
    dimensions: Mutex<BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ringmaster");
        let m = Metrics {
            registry: Registry::default(),
            messages_received: Family::default(),
            messages_sent: Family::default(),
            frames_rejected: Family::default(),
            connections_limited: Family::default(),
            connections_refused: Counter::default(),
            connections_open: Gauge::default(),
            // 10 µs … ~5 s.
            allocation_seconds: Histogram::new(exponential_buckets(1e-5, 4.0, 10)),
            placements: Family::default(),
            preemptions: Counter::default(),
            agents: Family::default(),
            frameworks: Family::default(),
            tasks: Family::default(),
            offers_outstanding: Gauge::default(),
            pending_demands: Gauge::default(),
            resources: Family::default(),
            offers_made: Counter::default(),
            offers_accepted: Counter::default(),
            offers_declined: Counter::default(),
            offers_rescinded: Counter::default(),
            tasks_launched: Counter::default(),
            allocation_runs: Counter::default(),
            agents_lost: Counter::default(),
            frameworks_removed: Counter::default(),
            errors_sent: Counter::default(),
            auth_failures: Family::default(),
            http_auth_failures: Family::default(),
            tls_handshake_failures: Family::default(),
            usage_refused: Family::default(),
            // 10 µs … ~10 s, each bucket 1.5 times the one before: fine enough to read a
            // p50 and a p99 from (docs/benchmarks.md, "Replicated masters").
            replication_commit_seconds: Histogram::new(exponential_buckets(1e-5, 1.5, 35)),
            registry_commit_seconds: Histogram::new(exponential_buckets(1e-5, 1.5, 35)),
            raft_replication_lag: Family::default(),
            raft_term: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_leader_changes: Counter::default(),
            dimensions: Mutex::new(BTreeSet::new()),
        };
        let r = &mut registry;
        r.register(
            "messages_received",
            "Protocol messages received from agents and frameworks, by message kind",
            m.messages_received.clone(),
        );
        r.register(
            "messages_sent",
            "Protocol messages sent to agents and frameworks, by message kind",
            m.messages_sent.clone(),
        );
        r.register(
            "frames_rejected",
            "Frames or messages refused on a connection (which is then closed), by reason",
            m.frames_rejected.clone(),
        );
        r.register(
            "connections_limited",
            "Connections closed for exceeding a per-connection limit, by limit",
            m.connections_limited.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed at accept because limits.max_connections were open",
            m.connections_refused.clone(),
        );
        r.register(
            "connections_open",
            "Protocol connections open (handshakes included; not HTTP)",
            m.connections_open.clone(),
        );
        r.register_with_unit(
            "allocation_duration",
            "Wall time of one allocation run in the master's actor",
            Unit::Seconds,
            m.allocation_seconds.clone(),
        );
        r.register(
            "placements",
            "Offers made, by ring search phase (bucket, up, down; none for placers without rings)",
            m.placements.clone(),
        );
        r.register(
            "preemptions",
            "Tasks killed to make room for a higher-priority demand (docs/priorities.md)",
            m.preemptions.clone(),
        );
        r.register_with_unit(
            "replication_commit_duration",
            "Wall time of one actor turn's replicated commit (quorum and local apply; cluster mode)",
            Unit::Seconds,
            m.replication_commit_seconds.clone(),
        );
        r.register_with_unit(
            "registry_commit_duration",
            "Wall time of one actor turn's registry commit (single master with --work-dir)",
            Unit::Seconds,
            m.registry_commit_seconds.clone(),
        );
        r.register(
            "raft_replication_lag",
            "Log entries a follower lacks, as its leader sees it (cluster mode; on the leader)",
            m.raft_replication_lag.clone(),
        );
        r.register(
            "raft_term",
            "The Raft term this master is in (cluster mode)",
            m.raft_term.clone(),
        );
        r.register(
            "raft_applied_index",
            "The last replicated log index applied to this master's registry (cluster mode)",
            m.raft_applied_index.clone(),
        );
        r.register(
            "raft_is_leader",
            "1 while this master leads its group, else 0 (cluster mode)",
            m.raft_is_leader.clone(),
        );
        r.register(
            "raft_leader_changes",
            "Times this master saw the group's leader change (cluster mode)",
            m.raft_leader_changes.clone(),
        );
        r.register("agents", "Known agents by state", m.agents.clone());
        r.register(
            "frameworks",
            "Known frameworks by state",
            m.frameworks.clone(),
        );
        r.register(
            "tasks",
            "Tasks the master holds by state (ended tasks are kept up to a bound)",
            m.tasks.clone(),
        );
        r.register(
            "offers_outstanding",
            "Offers made and not yet accepted, declined or rescinded",
            m.offers_outstanding.clone(),
        );
        r.register(
            "pending_demands",
            "Frameworks whose demand the last allocation run could not serve",
            m.pending_demands.clone(),
        );
        r.register(
            "resources",
            "Cluster resources per dimension: total, used (by tasks), offered, free",
            m.resources.clone(),
        );
        r.register("offers_made", "Offers made", m.offers_made.clone());
        r.register(
            "offers_accepted",
            "Offers accepted",
            m.offers_accepted.clone(),
        );
        r.register(
            "offers_declined",
            "Offers declined",
            m.offers_declined.clone(),
        );
        r.register(
            "offers_rescinded",
            "Offers rescinded (timeout, agent or framework gone)",
            m.offers_rescinded.clone(),
        );
        r.register("tasks_launched", "Tasks launched", m.tasks_launched.clone());
        r.register(
            "allocation_runs",
            "Allocation runs",
            m.allocation_runs.clone(),
        );
        r.register("agents_lost", "Agents declared lost", m.agents_lost.clone());
        r.register(
            "frameworks_removed",
            "Frameworks removed (teardown or failover timeout)",
            m.frameworks_removed.clone(),
        );
        r.register(
            "errors_sent",
            "Protocol errors sent to peers",
            m.errors_sent.clone(),
        );
        r.register(
            "auth_failures",
            "Connections refused by authentication or authorization, by reason (docs/security.md)",
            m.auth_failures.clone(),
        );
        r.register(
            "http_auth_failures",
            "HTTP API requests refused by authentication or authorization, by reason (docs/security.md)",
            m.http_auth_failures.clone(),
        );
        r.register(
            "tls_handshake_failures",
            "Connections closed before or during the TLS handshake, by reason",
            m.tls_handshake_failures.clone(),
        );
        r.register(
            "usage_reports_refused",
            "Task usage entries agents reported and the master refused as implausible, by reason",
            m.usage_refused.clone(),
        );
        // Series that exist from the start read 0 instead of being absent.
        for reason in USAGE_REFUSAL_REASONS {
            let _ = m.usage_refused.get_or_create(&[("reason", reason)]);
        }
        for reason in AUTH_FAILURE_REASONS {
            let _ = m.auth_failures.get_or_create(&[("reason", reason)]);
        }
        for reason in HTTP_AUTH_FAILURE_REASONS {
            let _ = m.http_auth_failures.get_or_create(&[("reason", reason)]);
        }
        for reason in TLS_FAILURE_REASONS {
            let _ = m
                .tls_handshake_failures
                .get_or_create(&[("reason", reason)]);
        }
        for phase in ["bucket", "up", "down", "leftover"] {
            let _ = m.placements.get_or_create(&[("phase", phase)]);
        }
        for why in [
            Rejection::BadFrame,
            Rejection::UnknownMessage,
            Rejection::UnexpectedMessage,
        ] {
            let _ = m.frames_rejected.get_or_create(&[("reason", why.label())]);
        }
        for limit in [Limit::MessageRate, Limit::OutboundQueue] {
            let _ = m
                .connections_limited
                .get_or_create(&[("limit", limit.label())]);
        }
        Metrics { registry, ..m }
    }

    /// The registry in the text exposition format (OpenMetrics, which Prometheus scrapes).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    pub(crate) fn message_received(&self, kind: &'static str) {
        self.messages_received
            .get_or_create(&[("kind", kind)])
            .inc();
    }

    pub(crate) fn message_sent(&self, kind: &'static str) {
        self.messages_sent.get_or_create(&[("kind", kind)]).inc();
    }

    pub(crate) fn frame_rejected(&self, why: Rejection) {
        self.frames_rejected
            .get_or_create(&[("reason", why.label())])
            .inc();
    }

    pub(crate) fn connection_limited(&self, limit: Limit) {
        self.connections_limited
            .get_or_create(&[("limit", limit.label())])
            .inc();
    }

    /// A connection closed at accept: the connection cap was reached.
    pub(crate) fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// A protocol connection was accepted (`+1`) or has ended (`-1`).
    pub(crate) fn connections_open_add(&self, delta: i64) {
        self.connections_open.inc_by(delta);
    }

    /// A connection refused by authentication or authorization; `reason` is one of
    /// [`AUTH_FAILURE_REASONS`].
    pub(crate) fn auth_failed(&self, reason: &'static str) {
        self.auth_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// An HTTP request refused; `reason` is one of [`HTTP_AUTH_FAILURE_REASONS`].
    pub(crate) fn http_auth_failed(&self, reason: &'static str) {
        self.http_auth_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// A usage entry refused as implausible; `reason` is one of [`USAGE_REFUSAL_REASONS`].
    pub(crate) fn usage_refused(&self, reason: &'static str) {
        self.usage_refused
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// A connection lost before or during the TLS handshake; `reason` is one of
    /// [`TLS_FAILURE_REASONS`].
    pub(crate) fn tls_failed(&self, reason: &'static str) {
        self.tls_handshake_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    pub(crate) fn replication_commit_took(&self, seconds: f64) {
        self.replication_commit_seconds.observe(seconds);
    }

    /// This master's view of its replication group.
    pub(crate) fn raft_status(&self, term: u64, applied: u64, leader: bool) {
        self.raft_term.set(term as i64);
        self.raft_applied_index.set(applied as i64);
        self.raft_is_leader.set(i64::from(leader));
    }

    pub(crate) fn registry_commit_took(&self, seconds: f64) {
        self.registry_commit_seconds.observe(seconds);
    }

    /// Entries each follower lacks (`None`: this master does not lead; the series are
    /// cleared).
    pub(crate) fn raft_replication_lag(&self, lag: Option<&[(u64, u64)]>) {
        self.raft_replication_lag.clear();
        for (peer, behind) in lag.unwrap_or_default() {
            self.raft_replication_lag
                .get_or_create(&[("peer", peer.to_string())])
                .set(*behind as i64);
        }
    }

    pub(crate) fn raft_leader_changed(&self) {
        self.raft_leader_changes.inc();
    }

    pub(crate) fn allocation_took(&self, seconds: f64) {
        self.allocation_seconds.observe(seconds);
    }

    pub(crate) fn preempted(&self, victims: usize) {
        self.preemptions.inc_by(victims as u64);
    }

    pub(crate) fn placed(&self, phase: Option<Phase>) {
        let label = match phase {
            Some(Phase::Bucket) => "bucket",
            Some(Phase::Up) => "up",
            Some(Phase::Down) => "down",
            Some(Phase::Leftover) => "leftover",
            None => "none",
        };
        self.placements.get_or_create(&[("phase", label)]).inc();
    }
}

fn task_state_label(state: TaskState) -> &'static str {
    match state {
        TaskState::Unspecified => "unspecified",
        TaskState::TaskStaging => "staging",
        TaskState::TaskRunning => "running",
        TaskState::TaskFinished => "finished",
        TaskState::TaskFailed => "failed",
        TaskState::TaskKilled => "killed",
        TaskState::TaskLost => "lost",
    }
}

/// Raises a counter to `value` (the actor's counters only grow, and only the actor calls this).
fn catch_up(counter: &Counter, value: u64) {
    let seen = counter.get();
    if value > seen {
        counter.inc_by(value - seen);
    }
}

fn gauge(family: &Family<Label, Gauge>, key: &'static str, value: &'static str, n: usize) {
    family
        .get_or_create(&[(key, value)])
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// One of the actor's monotonic counters, mirrored by a Prometheus counter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Total {
    OffersMade,
    OffersAccepted,
    OffersDeclined,
    OffersRescinded,
    TasksLaunched,
    AllocationRuns,
    AgentsLost,
    FrameworksRemoved,
    ErrorsSent,
}

/// Setters for the numbers read off the actor's state (see the module doc).
impl Metrics {
    pub(crate) fn set_agents(&self, connected: usize, disconnected: usize, lost: usize) {
        gauge(&self.agents, "state", "connected", connected);
        gauge(&self.agents, "state", "disconnected", disconnected);
        gauge(&self.agents, "state", "lost", lost);
    }

    pub(crate) fn set_frameworks(&self, connected: usize, disconnected: usize) {
        gauge(&self.frameworks, "state", "connected", connected);
        gauge(&self.frameworks, "state", "disconnected", disconnected);
    }

    /// Tasks per state; `count` is asked for every state a series exists for.
    pub(crate) fn set_tasks(&self, count: impl Fn(TaskState) -> usize) {
        for state in TASK_STATES {
            gauge(&self.tasks, "state", task_state_label(state), count(state));
        }
    }

    pub(crate) fn set_offers_outstanding(&self, n: usize) {
        self.offers_outstanding
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_pending_demands(&self, n: usize) {
        self.pending_demands
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The cluster's resources per dimension; a dimension no agent has any more reads 0
    /// rather than its last value.
    pub(crate) fn set_resources(
        &self,
        total: &Resources,
        used: &Resources,
        offered: &Resources,
        free: &Resources,
    ) {
        for name in total.names() {
            for (kind, bundle) in [
                ("total", total),
                ("used", used),
                ("offered", offered),
                ("free", free),
            ] {
                self.resources
                    .get_or_create(&[("dimension", name.to_string()), ("kind", kind.to_string())])
                    .set(bundle.amount(name));
            }
        }
        let mut seen = self
            .dimensions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in seen.iter().filter(|n| total.milli(n) == 0) {
            for kind in ["total", "used", "offered", "free"] {
                self.resources
                    .get_or_create(&[("dimension", name.clone()), ("kind", kind.to_string())])
                    .set(0.0);
            }
        }
        seen.extend(total.names().map(str::to_string));
    }

    /// Raises the Prometheus counter of `which` to the actor's `value`.
    pub(crate) fn set_total(&self, which: Total, value: u64) {
        let counter = match which {
            Total::OffersMade => &self.offers_made,
            Total::OffersAccepted => &self.offers_accepted,
            Total::OffersDeclined => &self.offers_declined,
            Total::OffersRescinded => &self.offers_rescinded,
            Total::TasksLaunched => &self.tasks_launched,
            Total::AllocationRuns => &self.allocation_runs,
            Total::AgentsLost => &self.agents_lost,
            Total::FrameworksRemoved => &self.frameworks_removed,
            Total::ErrorsSent => &self.errors_sent,
        };
        catch_up(counter, value);
    }
}
