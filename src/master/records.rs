//! The master's records: what it keeps per agent, framework, offer, task and connection. Data
//! and the methods that keep each record's own invariants; the actor's state
//! ([`super::state::MasterState`]) owns them and its handlers change them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use compact_str::CompactString;
use ringmaster_core::placement::{AgentKey, FrameworkKey, Priority, DEFAULT_PARTITION};
use ringmaster_proto::devices::ShareFill;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{TaskState, TaskStatus};
use tokio::time::{Duration, Instant};

use super::events::ConnId;
use super::server::limits::OutboundSender;
use super::task_refs::TaskRefs;

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

pub(crate) use super::owners::Peer;

pub(crate) struct ConnRecord {
    /// Bounded: see [`super::limits`].
    pub outbound: OutboundSender,
    pub peer: Option<Peer>,
}
