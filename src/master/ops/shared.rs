//! What the operator surface's HTTP handlers share ([`super::http`] and [`super::logs`]): the
//! actor's event channel, the jobs framework's handle, the metrics and the replication group,
//! and how long a request waits for the actor. Its own module so the handler modules depend on
//! it, not on each other.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::metrics::Metrics;
use crate::master::events::Event;
use crate::master::jobs_launch::JobsSlot;

/// How long a request waits for the actor's answer.
pub const ACTOR_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub(super) struct HttpState {
    pub(super) events: mpsc::Sender<Event>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) jobs: Arc<JobsSlot>,
    /// This master's replication group, in cluster mode: a follower sends API clients to the
    /// leader.
    pub(super) cluster: Option<crate::master::cluster::ClusterNode>,
    /// Who may use which route ([`super::auth`]).
    pub(super) auth: Arc<super::auth::HttpAuth>,
    /// The listener is plain HTTP and not loopback: HTTP Basic is refused
    /// ([`super::auth::basic_refused`]).
    pub(super) basic_in_clear: bool,
}
