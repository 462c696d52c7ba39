//! The accept loop, with a global cap on connections open at once and a tracker of every
//! connection task.
//!
//! - **Connection cap** (`limits.max_connections`, [`ConnectionCap`]): each connection holds a
//!   semaphore permit from accept to the end of its task. When none is left, a new connection
//!   is closed at once (before TLS or any frame), counted in
//!   `ringmaster_connections_refused_total`, and logged at most once per second
//!   ([`RefusalLog`]) so a connection storm cannot flood the log. `ringmaster_connections_open`
//!   is the number of permits held.
//! - **Drain on shutdown**: connection tasks are spawned on a [`TaskTracker`]; after the
//!   shutdown signal the listener stops accepting and waits until every task has ended (each
//!   watches the same signal and says `SHUTTING_DOWN` to its peer, bounded by a timeout).
//! - **Partial frames**: one [`FrameBudget`] for all the listener's connections bounds the
//!   bytes held for large frames not yet read whole (see [`super::limits`]).
//! - **HTTP on the protocol port**: only on the addresses the `--http` server serves too
//!   ([`Listener::with_http_addr`], [`super::task::http_served_at`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringmaster_proto::transport::BoxedStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use super::limits::FrameBudget;
use super::task::ConnectionTask;
use crate::config::Config;
use crate::master::events::{ConnId, Event};
use crate::master::metrics::Metrics;
use crate::master::replication::transport::RaftHandler;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// How often at most a refused connection is logged.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// At most `max` connections at once: a slot is a semaphore permit, released when dropped.
pub(crate) struct ConnectionCap {
    slots: Arc<Semaphore>,
    max: usize,
}

impl ConnectionCap {
    pub(crate) fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        ConnectionCap {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A slot for one more connection, or `None` when `max` are open.
    pub(crate) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Connections holding a slot now.
    pub(crate) fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Rate-limits the "connection refused" log line: the first refusal is logged, then at most
/// one line per `every`, saying how many refusals it stands for.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    every: Duration,
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    pub(crate) fn new(every: Duration) -> Self {
        RefusalLog {
            every,
            last: None,
            unlogged: 0,
        }
    }

    /// Records a refusal at `now`. `Some(n)`: log a line now, for `n` refusals (this one and
    /// those not logged since the last line); `None`: stay quiet.
    pub(crate) fn refused(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }
}

/// A connection's slot and its share of the open-connections gauge, given back on drop (also
/// when its task panics).
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Self {
        metrics.connections_open_add(1);
        OpenConnection {
            _slot: slot,
            metrics,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connections_open_add(-1);
    }
}

/// The protocol listener: accepts until shutdown, then drains its connection tasks.
pub(crate) struct Listener {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    events: mpsc::Sender<Event>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    cap: ConnectionCap,
    refusals: RefusalLog,
    tasks: TaskTracker,
    http: Option<super::task::HttpHandoff>,
    /// Where the `--http` server listens (see [`Listener::with_http_addr`]).
    http_addr: Option<SocketAddr>,
    /// Bytes of large partial frames, all connections together.
    frames: FrameBudget,
    /// This master's Raft node in cluster mode (see [`Listener::with_raft`]).
    raft: Option<Arc<RaftHandler>>,
    /// Streams opened from inside the process (see [`super::super::Master::start_jobs`]).
    in_process: Option<mpsc::Receiver<BoxedStream>>,
}

/// The peer address logged for an in-process connection.
const IN_PROCESS_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

impl Listener {
    pub(crate) fn new(
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        events: mpsc::Sender<Event>,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let cap = ConnectionCap::new(config.limits.max_connections);
        let frames = FrameBudget::for_config(&config);
        Listener {
            listener,
            tls,
            events,
            config,
            metrics,
            shutdown,
            cap,
            refusals: RefusalLog::new(REFUSAL_LOG_EVERY),
            tasks: TaskTracker::new(),
            http: None,
            http_addr: None,
            frames,
            raft: None,
            in_process: None,
        }
    }

    /// Also serves the streams sent on `streams` (in-process clients), as if accepted, after
    /// the same connection cap but without TLS (they never left the process) or HTTP.
    pub(crate) fn with_in_process(mut self, streams: mpsc::Receiver<BoxedStream>) -> Self {
        self.in_process = Some(streams);
        self
    }

    /// Serves HTTP on the protocol port too: connections that open with an HTTP request go
    /// to `http` (the operator HTTP server).
    pub(crate) fn with_http(mut self, http: Option<super::task::HttpHandoff>) -> Self {
        self.http = http;
        self
    }

    /// The address the `--http` server listens on: the protocol port hands an HTTP request
    /// over only when it reached an address that server serves too (the same IP, or `--http`
    /// on a wildcard address), and answers 404 on the others. Without it (`None`) every
    /// address hands over. The master wires it as `.with_http_addr(http_addr)`.
    // Unused only until src/master/mod.rs adds that line.
    pub(crate) fn with_http_addr(mut self, http_addr: Option<SocketAddr>) -> Self {
        self.http_addr = http_addr;
        self
    }

    /// Replaces the budget for large partial frames (by default
    /// [`super::limits::PARTIAL_FRAME_BUDGET_BYTES`]; tests use a small one).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn with_frame_budget(mut self, frames: FrameBudget) -> Self {
        self.frames = frames;
        self
    }

    /// Cluster mode: serves other masters' Raft RPCs (`RaftRequest` as a connection's first
    /// message after the handshake) with `raft`, directly, not through the actor. `None` (the
    /// default) refuses them with `UNEXPECTED_MESSAGE`. The master wires it as
    /// `Listener::new(..).with_raft(Some(RaftHandler::new(&replicator)))`, with `replicator`
    /// started on a `replication::transport::TcpNetwork` (`config.cluster`).
    // Only the tests call it until the master starts replication from `cluster:`.
    pub(crate) fn with_raft(mut self, raft: Option<Arc<RaftHandler>>) -> Self {
        self.raft = raft;
        self
    }

    /// Accepts until the shutdown signal, then waits for every connection task to end.
    pub(crate) async fn run(mut self) {
        let mut shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => self.admit(stream, peer),
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(stream) = next_stream(&mut self.in_process) => self.admit_in_process(stream),
                _ = super::stopping(&mut shutdown) => break,
            }
        }
        let Listener {
            listener, tasks, ..
        } = self;
        drop(listener);
        tasks.close();
        tracing::debug!(open = tasks.len(), "draining connection tasks");
        tasks.wait().await;
    }

    /// Starts a task for a new connection, or closes it when the cap is reached.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let Some(open) = self.open_slot(peer) else {
            drop(stream);
            return;
        };
        let _ = stream.set_nodelay(true);
        let task = self
            .task(peer)
            .with_http(self.http.clone())
            .with_http_addr(self.http_addr);
        let tls = self.tls.clone();
        self.tasks.spawn(async move {
            task.run(stream, tls).await;
            drop(open);
        });
    }

    /// Starts a task for a stream opened inside the process.
    fn admit_in_process(&mut self, stream: BoxedStream) {
        let Some(open) = self.open_slot(IN_PROCESS_PEER) else {
            return;
        };
        let task = self.task(IN_PROCESS_PEER);
        self.tasks.spawn(async move {
            task.run_in_process(stream).await;
            drop(open);
        });
    }

    fn task(&self, peer: SocketAddr) -> ConnectionTask {
        let conn: ConnId = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(%peer, conn, open = self.cap.open(), "connection accepted");
        ConnectionTask::new(
            conn,
            peer,
            self.events.clone(),
            self.config.clone(),
            self.metrics.clone(),
            self.shutdown.clone(),
        )
        .with_raft(self.raft.clone())
        .with_frame_budget(self.frames.clone())
    }

    /// A slot under the connection cap, or `None` (counted and logged) when the cap is reached.
    fn open_slot(&mut self, peer: SocketAddr) -> Option<OpenConnection> {
        let Some(slot) = self.cap.try_admit() else {
            self.metrics.connection_refused();
            if let Some(refused) = self.refusals.refused(Instant::now()) {
                tracing::warn!(
                    %peer,
                    max_connections = self.cap.max(),
                    refused,
                    "connection limit reached: closing new connections (limits.max_connections)"
                );
            }
            return None;
        };
        Some(OpenConnection::new(slot, self.metrics.clone()))
    }
}

/// The next in-process stream; pending forever without a channel or after it closed.
async fn next_stream(streams: &mut Option<mpsc::Receiver<BoxedStream>>) -> Option<BoxedStream> {
    match streams {
        Some(rx) => match rx.recv().await {
            Some(stream) => Some(stream),
            None => {
                *streams = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_admits_up_to_max_and_frees_a_slot_on_drop() {
        let cap = ConnectionCap::new(2);
        let a = cap.try_admit().expect("first");
        let b = cap.try_admit().expect("second");
        assert_eq!(cap.open(), 2);
        assert!(cap.try_admit().is_none(), "a third is refused");
        drop(a);
        assert_eq!(cap.open(), 1);
        let c = cap.try_admit().expect("a freed slot admits again");
        assert!(cap.try_admit().is_none());
        drop((b, c));
        assert_eq!(cap.open(), 0);
        assert_eq!(
            ConnectionCap::new(0).max(),
            1,
            "a zero cap would refuse everything"
        );
    }

    #[test]
    fn refusals_are_logged_at_most_once_per_interval_with_a_count() {
        let start = Instant::now();
        let mut log = RefusalLog::new(Duration::from_secs(1));
        assert_eq!(log.refused(start), Some(1), "the first is logged");
        for ms in [1, 200, 999] {
            assert_eq!(log.refused(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(
            log.refused(start + Duration::from_millis(1000)),
            Some(4),
            "the next line counts the quiet ones"
        );
        assert_eq!(log.refused(start + Duration::from_millis(1500)), None);
        assert_eq!(log.refused(start + Duration::from_secs(5)), Some(2));
    }
}
