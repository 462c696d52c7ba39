//! The answers the operator surface asks the actor for, as plain data: the body of
//! `GET /state` ([`Snapshot`] and its views), `GET /health` ([`Health`]) and the pending report
//! ([`PendingView`]). Data only: this module imports no other master module but the metrics
//! leaf, so the actor's vocabulary (`events`) can name these types without pointing back at the
//! code that reads the state (`views`, `pending`). Every field is documented in
//! `docs/operations.md`.

use std::collections::BTreeMap;

use ringmaster_core::placement::Priority;
use serde::{Deserialize, Serialize};

/// A consistent, serializable copy of the master's state: the body of `GET /state`.
///
/// Resource bundles are strings in the Mesos text syntax (`cpus:4;mem:8192`); every field is
/// documented in `docs/operations.md`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// `ringmaster <version>`.
    pub master: String,
    pub placer: String,
    pub uptime_secs: f64,
    pub agents: Vec<AgentView>,
    pub frameworks: Vec<FrameworkView>,
    pub tasks: Vec<TaskView>,
    pub offers: Vec<OfferView>,
    /// One ring set per dimension any agent has had, sorted by dimension.
    pub rings: Vec<RingSetView>,
    /// Demands the master cannot serve right now, each with why.
    pub pending: Vec<PendingView>,
    pub counters: Counters,
    /// Tasks held by the master per state (`RUNNING`, …), ended ones included.
    pub tasks_by_state: BTreeMap<String, usize>,
    pub total: String,
    /// Held by tasks.
    pub used: String,
    /// In outstanding offers.
    pub offered: String,
    /// Disk withheld from offers: agents reported less free disk than the books (a full disk;
    /// docs/protocol.md, "Agents"). Neither used, offered nor free.
    #[serde(default)]
    pub withheld: String,
    pub free: String,
    /// This master's replication group, in cluster mode (docs/operations.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
}

/// `/state`'s `cluster`: which master this is, its role, the leader it knows and the term.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterView {
    pub id: u64,
    /// `leader`, `follower`, `candidate` (or `other`: not a voter, shutting down).
    pub role: String,
    pub leader: Option<u64>,
    pub term: u64,
    /// Every master of the group: id -> protocol address (from the group's current
    /// membership, voters and learners; the config's `cluster.peers` until one is known).
    pub peers: std::collections::BTreeMap<u64, String>,
    /// The voters of the membership this master knows (empty until it knows one).
    #[serde(default)]
    pub voters: Vec<u64>,
    /// The last log index applied to this master's registry.
    #[serde(default)]
    pub applied_index: Option<u64>,
    /// The last log index in this master's newest snapshot (built here or installed).
    #[serde(default)]
    pub snapshot_index: Option<u64>,
    /// The last log index removed from this master's log (compacted behind a snapshot).
    #[serde(default)]
    pub purged_index: Option<u64>,
    /// Snapshots this master installed from a leader since it started (a master far behind,
    /// or with a wiped work directory, catches up this way).
    #[serde(default)]
    pub snapshots_installed: u64,
}

/// `GET /cluster/members`: the group's membership as the leader knows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MembersView {
    /// The leader's id, when one is known.
    pub leader: Option<u64>,
    /// Masters that vote (elect the leader, count for a quorum).
    pub voters: Vec<MemberView>,
    /// Masters that receive the log but do not vote (being added, not yet caught up).
    pub learners: Vec<MemberView>,
    /// The answering master's last log index applied to its registry.
    #[serde(default)]
    pub applied_index: Option<u64>,
    /// The last index in the answering master's newest snapshot.
    #[serde(default)]
    pub snapshot_index: Option<u64>,
    /// The last index the answering master removed from its log (behind a snapshot): a master
    /// that lacks entries up to here catches up from a snapshot.
    #[serde(default)]
    pub purged_index: Option<u64>,
}

/// One master of the group.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    /// Its protocol address, `host:port`.
    pub address: String,
    /// On the leader: the last log index this master is known to hold (none yet: unknown).
    #[serde(default)]
    pub matched: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentView {
    pub id: String,
    pub hostname: String,
    pub attributes: Vec<(String, String)>,
    pub total: String,
    pub free: String,
    pub used: String,
    pub offered: String,
    /// Its disk withheld from offers: the books' free disk beyond what it last reported free
    /// (a full disk). Not in `free` nor `used`.
    #[serde(default)]
    pub withheld: String,
    pub reported_free: String,
    /// `connected`, `disconnected` (may come back within `agent_timeout`) or `lost`.
    pub state: String,
    pub connected: bool,
    pub lost: bool,
    pub tasks: usize,
    /// The ring bucket the agent is filed in, per dimension of its total.
    pub buckets: BTreeMap<String, usize>,
    /// Seconds since its last heartbeat or status update.
    pub last_heartbeat_secs: f64,
    /// What its sampled tasks use (agents' `UsageReport`s); absent when none has a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<AgentUsageView>,
}

/// An agent's used resources: the sums over its tasks' latest samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentUsageView {
    /// Cores, from each task's last two samples.
    pub cpus: f64,
    /// Memory in use (RSS), MiB.
    pub mem_mib: f64,
}

/// A running task's latest usage sample (docs/operations.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskUsageView {
    /// CPU time used since it started.
    pub cpu_seconds: f64,
    /// Cores used between its last two samples (absent after the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_used: Option<f64>,
    pub mem_rss_mib: f64,
    pub mem_peak_mib: f64,
    /// Unix ms when its agent read the figures.
    pub sampled_at_ms: u64,
}

/// One dimension's ring: its buckets with bounds (in the dimension's units) and agent counts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RingSetView {
    pub dimension: String,
    pub search_up: usize,
    pub buckets: Vec<RingBucketView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RingBucketView {
    pub index: usize,
    pub lower: f64,
    /// `null` for the open-ended top bucket.
    pub upper: Option<f64>,
    pub agents: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FrameworkView {
    pub id: String,
    pub name: String,
    pub user: String,
    pub weight: f64,
    pub connected: bool,
    pub share: f64,
    pub allocated: String,
    pub demand: String,
    pub demand_count: u32,
    pub suppressed: bool,
    pub offers: usize,
    /// Tasks not yet ended.
    pub tasks: usize,
    /// Tasks held by the master per state, ended ones included.
    pub tasks_by_state: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskView {
    pub id: String,
    pub framework: String,
    pub agent: String,
    pub name: String,
    pub resources: String,
    pub state: String,
    pub reason: String,
    /// The priority the master gave the task at launch (docs/priorities.md).
    pub priority: Option<Priority>,
    /// The task's GPU devices, `gpu:INDEX:SHARE:MEMORY` each (docs/devices.md).
    pub devices: Vec<String>,
    /// Its latest usage sample, while it runs; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TaskUsageView>,
    /// What its health check last decided (docs/jobs.md, "Health checks"); absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OfferView {
    pub id: String,
    pub framework: String,
    pub agent: String,
    pub resources: String,
}

/// Monotonic counters, reported in snapshots.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counters {
    pub offers_made: u64,
    pub offers_accepted: u64,
    pub offers_declined: u64,
    pub offers_rescinded: u64,
    pub tasks_launched: u64,
    pub allocation_runs: u64,
    pub agents_lost: u64,
    pub frameworks_removed: u64,
    pub errors_sent: u64,
    /// Tasks killed to make room for a higher-priority demand.
    pub preemptions: u64,
}

/// A framework's demand the master cannot serve now, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PendingView {
    pub framework: String,
    pub name: String,
    /// One copy of the demand (Mesos text syntax).
    pub demand: String,
    /// Copies wanted beyond what outstanding offers already cover.
    pub count: u32,
    /// The last allocation run tried this demand and served none or only part of it.
    pub unserved_last_run: bool,
    /// The explanation, e.g. `no agent fits cpus:8: 3 agents short of cpus`.
    pub why: String,
    /// Agents placement knows (connected or disconnected, not lost).
    pub agents: usize,
    /// Per dimension of the demand: how many agents have less of it free.
    pub short: Vec<(String, usize)>,
    /// Agents with room that this framework may not be offered now (agent disconnected, or
    /// declined by the framework and still filtered).
    pub not_eligible: usize,
    /// Eligible agents with room (non-zero only when the demand waits for the next run).
    pub fitting: usize,
    /// Per feasibility rule, in the order rules apply, how many agents it excluded (each agent
    /// counted against the first rule it fails; rules excluding none are left out).
    #[serde(default)]
    pub excluded: Vec<Excluded>,
}

/// `GET /health`: the actor answered, with a few counts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub agents_connected: usize,
    pub frameworks_connected: usize,
    pub uptime_secs: f64,
}

/// One rule that excluded agents from a pending demand, and how many (`/state`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Excluded {
    /// `disconnected`, `partition`, `held`, `declined`, `resources` or `devices`.
    pub filter: String,
    pub agents: usize,
}
