//! The master: accepts agent and framework connections and runs the offer cycle.
//!
//! Shape (functional core, imperative shell): one actor task ([`state::MasterState`]) owns all
//! state and drives the pure placement library through its [`allocator::Allocator`] (the
//! library's books: cluster, DRF, quota ledger, devices, launched shapes, key maps); each TCP
//! connection is its own task ([`server`]: the capped accept loop and `ConnectionTask`) that
//! only translates frames into [`Event`]s and writes what the actor sends back. Nothing but the actor touches the state, so
//! no locks are needed and every decision happens in one deterministic order.
//!
//! The operator surface ([`ops`]: `/state`, `/metrics`, `/health`, the dashboard, and the views
//! they show) is one more client of the actor: it asks through the same event channel and
//! never touches the state.
//!
//! # Layout
//!
//! ```text
//! master/
//!   mod.rs          Master: binds, starts the actor, the server and HTTP; re-exports
//!   events.rs       Event, Outbound, ConnId: what clients and the actor say to each other
//!   state.rs        MasterState (fields, dispatch), Counters, Durable
//!   records.rs      the records (agent, framework, offer, task, connection): data only
//!   task_table.rs task_refs.rs   the task table and the per-agent/framework task sets
//!   actor.rs        the actor loop (events, ticks, allocation runs, turn commits)
//!   cluster.rs      the leader/follower supervisor of a replicated master
//!   jobs_launch.rs  where the jobs framework runs (beside a single master, or the leader)
//!   allocator.rs    Allocator: the placement books (cluster, DRF, quota ledger, device book,
//!                   launched shapes, key↔id maps) and the one allocation cycle (`run`)
//!   agents.rs frameworks.rs tasks.rs offers.rs batch.rs pending.rs durability.rs
//!   read_file.rs    `impl MasterState` by conversation (handlers of the actor)
//!   usage.rs        agents' usage reports (a handler); usage_book.rs: the latest sample
//!                   per running task (a side map) and its sanity rules
//!   files.rs        reads of task output in flight (the bounded pending-read map)
//!   owners.rs       which principal owns each id (and `Peer`)
//!   ids.rs          id minting; registry.rs: the durable store (redb)
//!   jobs_store.rs   the jobs framework's client for its registry records (Event::SaveJobs)
//!   server/         listener.rs (accept loop, connection cap, task tracker),
//!                   task.rs (ConnectionTask: TLS, handshake, serve), limits.rs
//!   ops/            http.rs, logs.rs (task output over HTTP), metrics.rs, model.rs (answers
//!                   as data), views.rs, dashboard.html
//! ```
//!
//! # Dependency direction
//!
//! Imports point down this list, never up (`use` and paths alike):
//!
//! 1. leaves, which import no other master module: `ids`, `registry`, `owners`, `files`, `allocator`
//!    (the placement books; knows ids and keys, not the records, which it is told about),
//!    `ops::metrics` (fed plain numbers; knows no state type), `ops::model` (the answers to
//!    query events as plain data), `server::limits` (the bounded
//!    outbound queue and its item, `Outbound`).
//! 2. `records`, `task_table`, `usage_book` (data), `state` (the fields) and `events` (its
//!    vocabulary): `state` imports the leaves, the data and `events`, and none of the
//!    handlers, `ops::{http, views}` or `server::{listener, task}`; `actor` (the loop) sits
//!    above `state`, `liveness` and `pipeline`.
//! 3. handlers (`agents`, `frameworks`, `tasks`, `offers`, `batch`, `pending`, `durability`,
//!    `read_file`, `usage`):
//!    `impl MasterState` blocks importing `state` (and leaves); `state` calls their methods
//!    without importing them. `offers` also imports `pending`. They change the placement books
//!    only through `state.alloc`'s methods, so the books move together (see `allocator`).
//! 4. readers and clients: `ops::views` (reads `&MasterState` into views and metrics),
//!    `ops::http`, `ops::logs`, `jobs_store` and `server::{listener, task}` (speak only
//!    `events`, and the leaves' plain data; never touch the state).
//! 5. `mod.rs` (`Master`), which wires them together.
//!
//! No loop is left (`tests/layering.rs` fails on any module import circle in the workspace): the answers to the query events (`Snapshot` and its views, `Health`,
//! `PendingView`, and `Counters`) are plain data in `ops::model`, a leaf, so `events` names them
//! without pointing back at `ops::views` or `pending`, the code that reads the state.

mod actor;
mod agents;
mod allocator;
mod batch;
pub(crate) mod cluster;
mod durability;
mod events;
mod files;
mod frameworks;
#[cfg(test)]
mod harness;
#[cfg(test)]
mod harness_tests;
mod health;
mod history;
mod ids;
pub(crate) mod jobs_launch;
pub mod jobs_store;
mod liveness;
mod offers;
pub mod ops;
mod owners;
mod pending;
mod pipeline;
pub mod plan;
mod read_file;
mod records;
pub mod registry;
pub(crate) mod replication;
mod server;
mod state;
mod task_refs;
mod task_table;
mod tasks;
mod usage;
mod usage_book;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::config::Config;
pub use ops::metrics::Metrics;
pub use ops::model::{
    AgentUsageView, AgentView, Counters, Excluded, FrameworkView, Health, OfferView, PendingView,
    RingBucketView, RingSetView, Snapshot, TaskUsageView, TaskView,
};
pub use ops::{http, metrics};

pub use events::ConnId;
// Re-exported so code written against the old paths (`super::Event`, `super::Outbound`) keeps
// compiling.
#[allow(unused_imports)]
pub(crate) use events::{Event, Outbound};

/// A running master: its address and a handle to ask for state or shut it down.
pub struct Master {
    addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    events: mpsc::Sender<Event>,
    shutdown: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
    /// Becomes true when the master stops, asked to or not (e.g. its registry failed).
    stopping: watch::Receiver<bool>,
    /// In a replication group (`cluster:`): the jobs framework runs beside the leader,
    /// started and stopped with its lead (src/master/cluster.rs), not by [`Master::start_jobs`].
    replicated: bool,
    /// Starts the built-in jobs framework ([`jobs_launch`]).
    jobs: jobs_launch::JobsStarter,
    /// The jobs the registry held at start, until [`Master::start_jobs`] takes them.
    jobs_loaded: std::sync::Mutex<Option<jobs_store::LoadedJobs>>,
    shutdown_rx: watch::Receiver<bool>,
}

impl Master {
    /// Binds `listen` and starts the actor and the accept loop on the current runtime, without
    /// HTTP.
    pub async fn start(listen: &str, config: Config) -> anyhow::Result<Master> {
        Master::start_with_http(listen, None, config).await
    }

    /// As [`Master::start`], and serves the operator HTTP surface on `http` when given.
    pub async fn start_with_http(
        listen: &str,
        http: Option<&str>,
        config: Config,
    ) -> anyhow::Result<Master> {
        Master::start_durable(listen, http, config, None).await
    }

    /// As [`Master::start_with_http`]; with `work_dir`, the master keeps its registry
    /// (`<work_dir>/registry.redb`, docs/reliability.md) there and recovers from it first.
    /// Without one, nothing survives a restart (a warning says so).
    pub async fn start_durable(
        listen: &str,
        http: Option<&str>,
        mut config: Config,
        work_dir: Option<PathBuf>,
    ) -> anyhow::Result<Master> {
        if config.cluster.is_some() && work_dir.is_none() {
            anyhow::bail!(
                "cluster: a replicated master needs --work-dir (its registry and Raft log live there)"
            );
        }
        if let (Some(cluster), Some(_)) = (&config.cluster, &config.tls) {
            if cluster.ca.is_none() {
                anyhow::bail!(
                    "cluster.ca: with tls:, each master needs the CA that signed the other \
                     masters' certificates (docs/operations.md, \"Cluster\")"
                );
            }
        }
        let registry = match &work_dir {
            Some(dir) => {
                let registry = registry::Registry::open(dir)?;
                let recovered = registry.load()?;
                tracing::info!(registry = %registry.path().display(), "durable registry open");
                Some((registry, recovered))
            }
            None => {
                tracing::warn!(
                    "no --work-dir: the master keeps its state in memory only; nothing survives a restart"
                );
                None
            }
        };
        // Certificates are read before binding, so a bad file fails the start, naming it.
        let tls = config
            .tls
            .as_ref()
            .map(|files| files.acceptor())
            .transpose()?;
        let listener = bind_with_backlog(listen, config.limits.listen_backlog)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
        let addr = listener.local_addr()?;
        let http_listener = match http {
            Some(http) => Some(
                TcpListener::bind(http)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot serve HTTP on {http}: {e}"))?,
            ),
            None => None,
        };
        let http_addr = http_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        // With required authentication the built-in jobs framework gets a principal of its
        // own, whose secret never leaves this process (docs/jobs.md, docs/security.md).
        let jobs_credential = config
            .auth
            .required
            .then(|| jobs_principal(&mut config.auth))
            .transpose()?;
        let config = Arc::new(config);
        let metrics = Arc::new(Metrics::new());
        let (events_tx, events_rx) = mpsc::channel(4096);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shutdown_rx_for_actor = shutdown_rx.clone();
        let stopping = shutdown_rx.clone();
        let mut jobs_loaded = jobs_store::LoadedJobs::default();
        let (in_process, in_process_rx) = mpsc::channel(4);
        let jobs_slot = Arc::new(jobs_launch::JobsSlot::default());
        let jobs_starter = jobs_launch::JobsStarter {
            events: events_tx.clone(),
            durable: work_dir.is_some(),
            in_process: in_process.clone(),
            credential: jobs_credential,
            addr,
            work_dir: work_dir.clone(),
            slot: jobs_slot.clone(),
        };
        let mut cluster_node = None;
        let mut raft_handler = None;
        let stop_all = shutdown_tx.clone();
        let actor_task = match (config.cluster.clone(), registry) {
            (Some(cluster), Some((registry, recovered))) => {
                // A replicated master: the supervisor leads or follows (src/master/cluster.rs);
                // the registry is rebuilt from the group's log, so what it held is not
                // recovered here.
                let dir = work_dir.as_deref().expect("checked above");
                // Records without a replication point were written by a single master: the
                // group's log does not hold them, so the other masters would never have them
                // (lost at the first leader change). Refuse rather than lose them.
                let replicated = registry
                    .replication_applied()
                    .map_err(|e| anyhow::anyhow!("cannot read the registry: {e}"))?
                    .is_some();
                let single_records = !(recovered.is_empty() && recovered.jobs.is_empty());
                if single_records && !replicated {
                    anyhow::bail!(
                        "cluster: the registry in {} was written by a single master (it has \
                         records but no replication state); a replicated master starts from an \
                         empty work dir, or from a single master's work dir seeded offline with \
                         `ringmaster cluster init --from {} --config GROUP.yaml` \
                         (docs/operations.md, \"From one master to three\")",
                        dir.display(),
                        dir.display()
                    );
                }
                let registry = Arc::new(registry);
                let log = replication::log_store::LogStore::open(dir).map_err(|e| {
                    anyhow::anyhow!("cannot open the Raft log in {}: {e}", dir.display())
                })?;
                let machine = replication::state_machine::StateMachine::new(registry.clone())
                    .map_err(|e| anyhow::anyhow!("cannot open the replicated registry: {e}"))?;
                // Over TLS a master trusts `cluster.ca` for its peers and, when they require
                // client certificates (`tls.client_ca`), presents its own.
                let peer_tls = match (&config.tls, &cluster.ca) {
                    (Some(files), Some(ca)) => {
                        let identity = files
                            .client_ca
                            .as_ref()
                            .map(|_| (files.cert.as_path(), files.key.as_path()));
                        Some(ringmaster_proto::transport::TlsClient::load(ca, identity)?)
                    }
                    _ => None,
                };
                let peer_security = ringmaster_proto::transport::ClientSecurity {
                    tls: peer_tls,
                    credential: config.auth.peer_credential(),
                    ..Default::default()
                };
                let network = replication::transport::TcpNetwork::new(
                    cluster.id,
                    peer_security,
                    config.master.max_frame_bytes,
                )
                .with_addresses(cluster.peers.clone());
                let (replicator, handler) = replication::transport::start_cluster_node(
                    &cluster,
                    cluster.raft_config(config.master.max_frame_bytes),
                    network,
                    log,
                    machine,
                )
                .await
                .map_err(|e| anyhow::anyhow!("cluster: {e}"))?;
                tracing::info!(id = cluster.id, peers = ?cluster.peers, "master in a replication group");
                let node = cluster::ClusterNode {
                    id: cluster.id,
                    peers: cluster.peers.clone(),
                    replicator,
                };
                cluster_node = Some(node.clone());
                raft_handler = Some(handler);
                let (config, metrics) = (config.clone(), metrics.clone());
                // The jobs framework runs beside the leader: no `jobs.json` import there.
                let jobs = jobs_launch::JobsStarter {
                    work_dir: None,
                    ..jobs_starter.clone()
                };
                tokio::spawn(async move {
                    let raft = node.replicator.raft().clone();
                    cluster::supervise(
                        node,
                        registry,
                        config,
                        metrics,
                        Some(jobs),
                        events_rx,
                        shutdown_rx_for_actor,
                    )
                    .await;
                    let _ = raft.shutdown().await;
                    let _ = stop_all.send(true);
                })
            }
            (_, registry) => {
                let mut actor = state::MasterState::new(
                    config.clone(),
                    metrics.clone(),
                    tokio::time::Instant::now(),
                );
                if let Some((registry, mut recovered)) = registry {
                    jobs_loaded.jobs = std::mem::take(&mut recovered.jobs);
                    jobs_loaded.meta = recovered.jobs_meta.take();
                    actor.recover(registry, recovered, tokio::time::Instant::now());
                    actor.commit_turn()?;
                }
                tokio::spawn(async move {
                    actor.run(events_rx, shutdown_rx_for_actor).await;
                    // However the actor ended, the rest of the master stops with it.
                    let _ = stop_all.send(true);
                })
            }
        };
        // With HTTP on, the protocol port serves it too: one address for every client. Not with
        // TLS (the HTTP port then serves HTTPS only) or required authentication (its
        // credentials would cross a port clients take to be the protocol's), not from a
        // protocol port on a wider interface than a loopback-only HTTP port, and only on the
        // addresses `--http` serves (`with_http_addr`).
        let share_http = config.tls.is_none()
            && !config.auth.required
            && http_addr.is_some_and(|h| !h.ip().is_loopback() || addr.ip().is_loopback());
        let (http_handoff, handed) = match &http_listener {
            Some(_) if share_http => {
                let (tx, rx) = mpsc::channel(64);
                (Some(tx), Some(rx))
            }
            Some(_) => {
                // The HTTP server still needs a (never used) handoff channel.
                let (_tx, rx) = mpsc::channel(1);
                (None, Some(rx))
            }
            None => (None, None),
        };
        let http_task = http_listener.zip(handed).map(|(listener, handed)| {
            tokio::spawn(http::serve(
                listener,
                tls.clone(),
                handed,
                events_tx.clone(),
                metrics.clone(),
                jobs_slot.clone(),
                cluster_node.clone(),
                Arc::new(ops::auth::HttpAuth::from_config(&config)),
                shutdown_rx.clone(),
            ))
        });
        let jobs_shutdown = shutdown_rx.clone();
        let tls_on = tls.is_some();
        let accept_task = tokio::spawn(
            server::Listener::new(
                listener,
                tls,
                events_tx.clone(),
                config,
                metrics,
                shutdown_rx,
            )
            .with_http(http_handoff)
            .with_http_addr(http_addr)
            .with_in_process(in_process_rx)
            .with_raft(raft_handler)
            .run(),
        );
        let join = tokio::spawn(async move {
            let _ = accept_task.await;
            if let Some(task) = http_task {
                let _ = task.await;
            }
            let _ = actor_task.await;
        });
        tracing::info!(%addr, tls = tls_on, "master listening");
        if let Some(http) = http_addr {
            // With `tls:` the HTTP port serves HTTPS only, with the master's certificate.
            let scheme = if tls_on { "https" } else { "http" };
            tracing::info!(%http, "operator HTTP (state, metrics, dashboard) on {scheme}://{http}/");
        }
        Ok(Master {
            addr,
            http_addr,
            events: events_tx,
            shutdown: shutdown_tx,
            join,
            stopping,
            replicated: cluster_node.is_some(),
            jobs: jobs_starter,
            jobs_loaded: std::sync::Mutex::new(Some(jobs_loaded)),
            shutdown_rx: jobs_shutdown,
        })
    }

    /// Starts the built-in jobs framework (docs/jobs.md): it subscribes to this master through
    /// an in-process stream (no TCP, so no TLS either) and keeps its jobs in the master's
    /// registry (with `--work-dir`), so they survive a restart. A `<work-dir>/jobs.json` of an
    /// older master is imported once. With required authentication it authenticates as
    /// [`JOBS_PRINCIPAL`]. In a replication group it runs beside the leader instead, started
    /// with each lead from the group's records (src/master/cluster.rs): this does nothing.
    pub async fn start_jobs(&self) -> anyhow::Result<()> {
        if self.replicated {
            return Ok(());
        }
        let loaded = self
            .jobs_loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
            .unwrap_or_default();
        self.jobs.start(loaded, self.shutdown_rx.clone()).await
    }

    /// The address the master listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the operator HTTP surface, when it is served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// A consistent copy of the master's state. A leader of a replicated group answers once
    /// the decisions it shows are committed; if it stops leading first, this is an error (ask
    /// again, or ask the new leader).
    pub async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.events
            .send(Event::Snapshot(tx))
            .await
            .map_err(|_| anyhow::anyhow!("master has stopped"))?;
        rx.await.map_err(|_| {
            anyhow::anyhow!(
                "no answer: the master stopped, or stopped leading, before its state was committed"
            )
        })
    }

    /// Resolves once the master is stopping: after [`Master::shutdown`], or on its own when
    /// its actor ended (a registry write failed).
    pub async fn stopped(&self) {
        let mut stopping = self.stopping.clone();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// Stops accepting, closes every connection and ends the actor.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.join.await;
    }

    /// Waits until the master stops (after [`Master::shutdown`] from elsewhere, or a fatal error).
    pub async fn wait(self) {
        let _ = self.join.await;
    }
}

/// The principal the built-in jobs framework authenticates as when the master requires
/// authentication. Its secret is made at each start and known only to the master process.
pub const JOBS_PRINCIPAL: &str = "ringmaster-jobs.internal";

/// Adds [`JOBS_PRINCIPAL`] to `auth` (frameworks as user `jobs` only, tasks as any user) with a
/// fresh random secret, and returns the credential the jobs framework connects with.
fn jobs_principal(
    auth: &mut crate::security::AuthConfig,
) -> anyhow::Result<ringmaster_proto::security::Credential> {
    use std::collections::BTreeSet;
    if auth.principals.contains_key(JOBS_PRINCIPAL) {
        anyhow::bail!(
            "auth: principal {JOBS_PRINCIPAL:?} is reserved for the built-in jobs framework"
        );
    }
    let secret: [u8; 32] = rand::random();
    // Its tasks run as their job specs say (`task.user`, else the agent's --task-user): jobs
    // are the operator's, submitted over the master's HTTP (docs/jobs.md).
    let grant = crate::security::PrincipalGrant::new(
        secret.to_vec(),
        BTreeSet::from([ringmaster_proto::security::AuthRole::Framework]),
        crate::security::AllowedUsers::Only(BTreeSet::from([
            crate::jobs::runner::JOBS_USER.to_string()
        ])),
    )
    .with_task_users(crate::security::AllowedUsers::Any);
    auth.principals.insert(JOBS_PRINCIPAL.to_string(), grant);
    Ok(ringmaster_proto::security::Credential::new(
        JOBS_PRINCIPAL,
        secret.to_vec(),
    )?)
}

/// Binds `listen` (the first address it resolves to) with a `listen(2)` backlog of `backlog`
/// (`limits.listen_backlog`): the default of `TcpListener::bind`, 128, overflows when thousands
/// of agents connect at once after a master restart.
async fn bind_with_backlog(listen: &str, backlog: u32) -> std::io::Result<TcpListener> {
    let addr = tokio::net::lookup_host(listen)
        .await?
        .next()
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")
        })?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As TcpListener::bind does: a restarted master may rebind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
