//! The vocabulary between the actor and its clients: the connection tasks ([`super::server`])
//! and the operator surface ([`super::ops`]) send [`Event`]s to the actor, which answers a
//! connection with [`Outbound`]s on its bounded queue and a query on a oneshot channel.
//!
//! Plain types only. The query variants name the types of their answers ([`Snapshot`] and
//! [`Health`]), which are data in [`super::ops::model`].

use std::net::SocketAddr;

use tokio::sync::oneshot;

use super::ops::model::{Health, Snapshot};
pub(crate) use super::server::limits::Outbound;
use super::server::limits::OutboundSender;

/// Identifies one connection for the actor's lifetime.
pub type ConnId = u64;

/// What a connection task tells the actor.
#[derive(Debug)]
pub(crate) enum Event {
    /// A connection finished its handshake and sent RegisterAgent or Subscribe.
    Opened {
        conn: ConnId,
        peer: SocketAddr,
        outbound: OutboundSender,
        first: ringmaster_proto::Message,
        /// The principal the connection authenticated as (`None`: anonymous).
        principal: Option<String>,
    },
    /// A later message on an opened connection.
    Inbound {
        conn: ConnId,
        message: ringmaster_proto::Message,
    },
    /// The connection ended (peer closed, error, or the actor asked to close it).
    Closed { conn: ConnId },
    /// A snapshot of the state was asked for (tests, local mode, operators).
    Snapshot(oneshot::Sender<Snapshot>),
    /// Copy the state-derived metrics into the shared registry, then answer.
    PublishMetrics(oneshot::Sender<()>),
    /// Is the actor alive? (`GET /health`)
    Health(oneshot::Sender<Health>),
    /// A window of a task's stdout/stderr, read by its agent (`GET /files/read`). Answered
    /// when the agent answers, its connection ends, or after `files::READ_TIMEOUT`.
    ReadFile {
        request: super::files::FileRequest,
        reply: super::files::FileReply,
    },
    /// Where would `count` instances of `demand` go now, in the job's partition and under its
    /// constraints? (`POST /jobs/plan`)
    Plan {
        demand: ringmaster_proto::resources::Resources,
        count: u32,
        placement: crate::jobs::plan::Placement,
        reply: oneshot::Sender<crate::jobs::plan::Plan>,
    },
    /// The built-in jobs framework's records changed (`crate::jobs::runner`, through
    /// [`super::jobs_store::JobsStore`]): written in this turn's registry commit, and answered
    /// only once it is committed (at once without a registry), or with why it was not.
    SaveJobs {
        /// Job name -> its record (`None`: purged).
        jobs: Vec<(String, Option<serde_json::Value>)>,
        /// The jobs framework's own record, when it changed.
        meta: Option<super::registry::JobsMeta>,
        reply: oneshot::Sender<Result<(), String>>,
    },
}
