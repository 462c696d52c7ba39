//! A master in a replicated group (`cluster:` in its config): leads, or points at the leader.
//!
//! Why a supervisor around the actor: only the leader may decide (offer, launch, kill), and a
//! new leader must start from what the group committed, exactly as a restarted single master
//! starts from its registry. So the actor's state exists only while this master leads: on
//! becoming leader the supervisor waits until its registry holds everything committed
//! (`ensure_linearizable`), rebuilds a [`MasterState`] from it ([`MasterState::recover`]) and
//! serves; on losing the lead it closes every connection with `NOT_LEADER` and drops that
//! state. Meanwhile a follower answers each agent or framework that registers with
//! `NOT_LEADER` and the leader's address, and serves `/state` (empty, with its `cluster` view)
//! and `/health` from an empty state.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringmaster_proto::{ErrorCode, Message};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::events::{Event, Outbound};
use super::ops::metrics::Metrics;
use super::ops::model::ClusterView;
use super::registry::Registry;
use super::replication::raft::RaftReplicator;
use super::replication::{NodeId, Replicator, Role};
use super::state::{MasterState, RunEnd};
use crate::config::Config;

/// The wait before trying again to confirm a lead that could not be confirmed.
const CONFIRM_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// This master's place in its group.
#[derive(Clone)]
pub(crate) struct ClusterNode {
    pub id: NodeId,
    /// Every master of the config (`cluster.peers`), this one included: id -> protocol
    /// address. Only a fallback: the group's current membership ([`ClusterNode::peers`]) knows
    /// masters added or removed since.
    pub peers: BTreeMap<NodeId, String>,
    pub replicator: RaftReplicator,
}

impl ClusterNode {
    /// The `cluster` view of `/state` now.
    pub(crate) fn view(&self) -> ClusterView {
        let status = self.replicator.status();
        let (snapshot_index, purged_index) = self.replicator.log_positions();
        ClusterView {
            id: self.id,
            role: match status.role {
                Role::Leader => "leader",
                Role::Follower => "follower",
                Role::Candidate => "candidate",
                Role::Other => "other",
            }
            .to_string(),
            leader: status.leader,
            term: status.term,
            peers: self.peers(),
            voters: self.replicator.voter_ids(),
            applied_index: status.applied_index,
            snapshot_index,
            purged_index,
            snapshots_installed: self.replicator.snapshots_installed(),
        }
    }

    /// Every master of the group, this one included: id -> protocol address. From the
    /// membership this master knows (voters and learners, so a master added since the config
    /// was written is there and a removed one is not); the config's `cluster.peers` until it
    /// knows one (a joining master before the leader reaches it).
    pub(crate) fn peers(&self) -> BTreeMap<NodeId, String> {
        let members = self.replicator.member_addresses();
        if members.is_empty() {
            self.peers.clone()
        } else {
            members
        }
    }

    /// The protocol address of master `id`: the membership's, else the config's.
    fn address_of(&self, id: NodeId) -> Option<String> {
        self.replicator
            .member_addresses()
            .remove(&id)
            .or_else(|| self.peers.get(&id).cloned())
    }

    /// The view while this master does not serve: elected but still taking over (waiting for
    /// its registry to hold everything committed) shows as `candidate`, so `leader` in
    /// `/state` always means a master that serves.
    pub(crate) fn view_not_serving(&self) -> ClusterView {
        let mut view = self.view();
        if view.role == "leader" {
            view.role = "candidate".into();
        }
        view
    }

    /// Whether this master leads now (its API answers; a follower's sends clients on).
    pub(crate) fn serves(&self) -> bool {
        self.leads().is_some()
    }

    /// The leader's protocol address, when one is known and it is not this master.
    pub(crate) fn leader_address(&self) -> Option<String> {
        let leader = self.replicator.status().leader?;
        (leader != self.id)
            .then(|| self.address_of(leader))
            .flatten()
    }

    /// Whether this master leads now, and in which term.
    fn leads(&self) -> Option<u64> {
        let status = self.replicator.status();
        (status.role == Role::Leader && status.leader == Some(self.id)).then_some(status.term)
    }
}

/// Runs the master of a group until `shutdown`: follows, leads when elected, follows again
/// when deposed.
pub(crate) async fn supervise(
    node: ClusterNode,
    registry: Arc<Registry>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    jobs: Option<super::jobs_launch::JobsStarter>,
    mut events: mpsc::Receiver<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut raft_metrics = node.replicator.raft().metrics();
    // The group's view goes to the metrics on every change, leading or not.
    let publisher = {
        let node = node.clone();
        let metrics = metrics.clone();
        let mut raft_metrics = node.replicator.raft().metrics();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut last_leader = None;
            loop {
                publish(&node, &metrics, &mut last_leader);
                tokio::select! {
                    changed = raft_metrics.changed() => if changed.is_err() { break },
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
            }
        })
    };
    let _publisher = AbortOnDrop(publisher);
    // How long a leader may go without confirming its lead with a quorum before it stops
    // serving: the election timeout, after which the others may have elected another.
    let lease = config
        .cluster
        .as_ref()
        .map_or(crate::config::DEFAULT_ELECTION_TIMEOUT, |c| {
            c.election_timeout
        });
    loop {
        // Follow until this master leads and has confirmed it: until then (also while an
        // elected master cannot reach a quorum, e.g. cut off from the others) it keeps
        // answering, so its clients are sent on at once.
        let mut follower = MasterState::new(config.clone(), metrics.clone(), Instant::now());
        let mut confirming: Option<
            std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>,
        > = None;
        // Whether an unconfirmed lead was reported (once per spell, not every retry).
        let mut unconfirmed = false;
        let term = loop {
            let leads = node.leads();
            if leads.is_none() {
                confirming = None;
            } else if confirming.is_none() {
                let node = node.clone();
                confirming = Some(Box::pin(async move {
                    if confirm_lead(&node, lease).await {
                        true
                    } else {
                        // Not at once: a lead that cannot be confirmed (no quorum) would
                        // otherwise be retried in a tight loop.
                        tokio::time::sleep(CONFIRM_RETRY).await;
                        false
                    }
                }));
            }
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { return };
                    follower.cluster = Some(node.view_not_serving());
                    refuse_or_answer(&mut follower, &node, event);
                }
                changed = raft_metrics.changed() => {
                    if changed.is_err() {
                        tracing::error!("the replication group stopped; the master stops");
                        return;
                    }
                }
                confirmed = async { confirming.as_mut().expect("a confirmation").await },
                    if confirming.is_some() =>
                {
                    confirming = None;
                    match (confirmed, node.leads()) {
                        (true, Some(term)) if Some(term) == leads => break term,
                        (true, _) => {}
                        (false, _) if !unconfirmed => {
                            unconfirmed = true;
                            tracing::warn!(
                                "elected, but cannot confirm the lead with a quorum; not serving \
                                 until it can"
                            );
                        }
                        (false, _) => {}
                    }
                }
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        };
        drop(confirming);
        drop(follower);
        let mut recovered = match registry.load() {
            Ok(recovered) => recovered,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the registry to lead; the master stops");
                return;
            }
        };
        tracing::info!(id = node.id, term, "this master leads its group");
        let now = Instant::now();
        // The jobs framework's records as the group committed them: it starts from them once
        // this master serves, and takes its running instances over (docs/jobs.md).
        let jobs_loaded = super::jobs_store::LoadedJobs {
            jobs: std::mem::take(&mut recovered.jobs),
            meta: recovered.jobs_meta.take(),
        };
        let mut state = MasterState::new(config.clone(), metrics.clone(), now);
        state.recover(registry.clone(), recovered, now);
        state.leader_term = term;
        state.replicator = Some(Arc::new(node.replicator.clone()));
        state.cluster = Some(node.view());
        state.cluster_view = Some({
            let node = node.clone();
            Arc::new(move || node.view())
        });
        // Stop serving when the lead is lost or the master shuts down.
        let (stop_tx, mut stop) = watch::channel(false);
        let watcher = {
            let node = node.clone();
            let mut raft_metrics = node.replicator.raft().metrics();
            let mut shutdown = shutdown.clone();
            // Raft alone keeps a leader cut off from the others believing it leads until it
            // hears a newer term; it must not go on deciding (nothing it decides can commit,
            // and its clients wait for it). So the lead is confirmed with a quorum twice per
            // election timeout, and serving stops once it has gone unconfirmed for two
            // election timeouts (the longest a follower waits before standing for election).
            // Not at the first failure: under load a quorum's answer can take longer than one
            // confirmation allows, and a needless step-down costs every client a reconnect.
            let mut confirm = tokio::time::interval(lease / 2);
            confirm.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut confirmed = std::time::Instant::now();
            tokio::spawn(async move {
                loop {
                    if node.leads() != Some(term) {
                        break;
                    }
                    let mut due = false;
                    tokio::select! {
                        changed = raft_metrics.changed() => if changed.is_err() { break },
                        _ = confirm.tick() => due = true,
                        _ = shutdown.wait_for(|stop| *stop) => break,
                    }
                    if !due {
                        continue;
                    }
                    if still_leads(&node, lease).await {
                        confirmed = std::time::Instant::now();
                    } else if confirmed.elapsed() > 2 * lease {
                        tracing::warn!(
                            id = node.id,
                            term,
                            "cannot confirm the lead with a quorum; this master stops serving"
                        );
                        break;
                    }
                }
                let _ = stop_tx.send(true);
            })
        };
        // The jobs framework runs for this lead only: it writes through the actor, so it starts
        // beside the serving actor and stops when the lead ends (before another can start).
        let (jobs_stop, jobs_stopped) = watch::channel(false);
        let jobs_task = jobs.clone().map(|jobs| {
            tokio::spawn(async move {
                if let Err(e) = jobs.start(jobs_loaded, jobs_stopped).await {
                    tracing::warn!("the jobs framework did not start on this leader: {e}");
                }
            })
        });
        let end = state.serve(&mut events, &mut stop).await;
        let _ = jobs_stop.send(true);
        if let Some(task) = jobs_task {
            task.abort();
        }
        watcher.abort();
        if *shutdown.borrow() || end == RunEnd::Failed {
            return;
        }
        tracing::warn!(
            id = node.id,
            term,
            ?end,
            "this master no longer leads; following"
        );
        let leader = node.leader_address().unwrap_or_default().to_string();
        for conn in state.conns.keys().copied().collect::<Vec<_>>() {
            let mut error = ringmaster_proto::Error::new(
                ErrorCode::NotLeader,
                "this master no longer leads its group",
            );
            error.leader = leader.clone();
            // At once, not through the outbox: no turn will commit it any more.
            state.deliver(conn, Outbound::Close(error));
        }
    }
}

/// Whether a quorum of the group confirms, within `lease`, that this master leads (and its
/// registry holds everything committed before now): what taking the lead needs.
async fn confirm_lead(node: &ClusterNode, lease: std::time::Duration) -> bool {
    confirmed(lease, node.replicator.raft().ensure_linearizable()).await
}

/// Whether a quorum of the group confirms, within `lease`, that this master still leads. Unlike
/// [`confirm_lead`] it does not wait for this master to apply what is committed: under load the
/// leader's own apply can trail by seconds, which says nothing about whether it leads.
async fn still_leads(node: &ClusterNode, lease: std::time::Duration) -> bool {
    confirmed(lease, node.replicator.raft().get_read_log_id()).await
}

/// Whether `check` (a quorum confirmation) succeeds within `lease`.
async fn confirmed<T, E: std::fmt::Display>(
    lease: std::time::Duration,
    check: impl std::future::Future<Output = Result<T, E>>,
) -> bool {
    match tokio::time::timeout(lease, check).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the lead is not confirmed");
            false
        }
        Err(_) => {
            tracing::debug!(?lease, "the lead is not confirmed in time");
            false
        }
    }
}

/// A follower's answer to one event: agents and frameworks that register are sent to the
/// leader; state, health and metrics come from the (empty) follower state; writes are refused.
fn refuse_or_answer(follower: &mut MasterState, node: &ClusterNode, event: Event) {
    match event {
        Event::Opened {
            outbound, first, ..
        } => {
            let leader = node.leader_address().unwrap_or_default().to_string();
            let what = match first {
                Message::RegisterAgent(_) => "agents register with",
                _ => "frameworks subscribe to",
            };
            let mut error = ringmaster_proto::Error::new(
                ErrorCode::NotLeader,
                if leader.is_empty() {
                    format!("this master does not lead its group and no leader is known yet; {what} the leader")
                } else {
                    format!("this master does not lead its group; {what} the leader at {leader}")
                },
            );
            error.leader = leader;
            let _ = outbound.send(Outbound::Close(error));
        }
        Event::Inbound { .. } | Event::Closed { .. } => {}
        Event::SaveJobs { reply, .. } => {
            let _ = reply.send(Err("this master does not lead its group".into()));
        }
        other => follower.handle(other, Instant::now()),
    }
}

/// Aborts a task when dropped (the supervisor's helpers end with it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copies the group's view into the metrics (term, applied index, role and, on the leader,
/// how many entries each follower lacks); counts a change of leader.
fn publish(node: &ClusterNode, metrics: &Metrics, last_leader: &mut Option<NodeId>) {
    let status = node.replicator.status();
    metrics.raft_status(
        status.term,
        status.applied_index.unwrap_or(0),
        status.role == Role::Leader,
    );
    let lag = {
        let watch = node.replicator.raft().metrics();
        let raft = watch.borrow();
        raft.replication.as_ref().map(|matched| {
            let last = raft.last_log_index.unwrap_or(0);
            matched
                .iter()
                .filter(|(peer, _)| **peer != node.id)
                .map(|(peer, at)| {
                    let have = at.map_or(0, |id| id.index + 1);
                    (*peer, (last + 1).saturating_sub(have))
                })
                .collect::<Vec<_>>()
        })
    };
    metrics.raft_replication_lag(lag.as_deref());
    if status.leader.is_some() && status.leader != *last_leader {
        if last_leader.is_some() {
            metrics.raft_leader_changed();
        }
        *last_leader = status.leader;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ringmaster_proto::{Message, Subscribe};

    use super::*;
    use crate::master::replication::network::Router;
    use crate::master::replication::tests::{elected_leader, start_cluster, PATIENCE};
    use crate::master::server::limits::{outbound_queue, OutboundReceiver};

    struct Master {
        events: mpsc::Sender<Event>,
        shutdown: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    fn peers() -> BTreeMap<NodeId, String> {
        (1..=3)
            .map(|id| (id, format!("127.0.0.1:{}", 5050 + id)))
            .collect()
    }

    /// Subscribes a framework (`id` empty: a new one) through `master`; returns what came back.
    async fn subscribe(master: &Master, conn: u64, id: &str) -> Outbound {
        let (outbound, mut rx): (_, OutboundReceiver) = outbound_queue(64, 1 << 20);
        let first = Message::Subscribe(Subscribe {
            framework_id: id.into(),
            name: "f".into(),
            user: "u".into(),
            failover_timeout_secs: 600.0,
            ..Default::default()
        });
        master
            .events
            .send(Event::Opened {
                conn,
                peer: ([127, 0, 0, 1], 40_000).into(),
                outbound,
                first,
                principal: None,
            })
            .await
            .unwrap();
        tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("an answer in time")
            .expect("an answer")
    }

    /// [`subscribe`] until the master has taken its lead (until then, it answers NOT_LEADER);
    /// returns the framework id.
    async fn subscribe_at_leader(master: &Master, conn: u64, id: &str) -> String {
        loop {
            match subscribe(master, conn, id).await {
                Outbound::Close(e) if e.code() == ErrorCode::NotLeader => {
                    tokio::task::yield_now().await;
                }
                other => return subscribed(other),
            }
        }
    }

    fn subscribed(out: Outbound) -> String {
        match out {
            Outbound::Send(Message::Subscribed(s)) => s.framework_id,
            other => panic!("expected Subscribed, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn followers_point_at_the_leader_and_a_new_leader_recovers_what_was_committed() {
        let router = Router::default();
        let mut nodes = start_cluster(&router).await;
        let config = Arc::new(Config::default());
        let mut masters: BTreeMap<NodeId, Master> = BTreeMap::new();
        for (id, node) in &nodes {
            let (events, events_rx) = mpsc::channel(64);
            let (shutdown, shutdown_rx) = watch::channel(false);
            let cluster = ClusterNode {
                id: *id,
                peers: peers(),
                replicator: node.replicator.clone(),
            };
            let task = tokio::spawn(supervise(
                cluster,
                node.registry.clone(),
                config.clone(),
                Arc::new(Metrics::new()),
                None,
                events_rx,
                shutdown_rx,
            ));
            masters.insert(
                *id,
                Master {
                    events,
                    shutdown,
                    task,
                },
            );
        }
        let leader = elected_leader(&nodes, None).await;

        // A follower sends a framework to the leader's address.
        let follower = *masters.keys().find(|id| **id != leader).unwrap();
        nodes[&follower]
            .replicator
            .raft()
            .wait(Some(PATIENCE))
            .metrics(
                |m| m.current_leader == Some(leader),
                "the follower knows the leader",
            )
            .await
            .unwrap();
        match subscribe(&masters[&follower], 1, "").await {
            Outbound::Close(e) => {
                assert_eq!(e.code(), ErrorCode::NotLeader);
                assert_eq!(e.leader, peers()[&leader], "{e:?}");
            }
            other => panic!("a follower answered {other:?}"),
        }

        // The leader subscribes it; the framework is in every master's registry once
        // committed (the Subscribed left only after the quorum).
        let id = subscribe_at_leader(&masters[&leader], 2, "").await;
        let index = nodes[&leader].replicator.status().applied_index.unwrap();
        for node in nodes.values() {
            node.replicator
                .raft()
                .wait(Some(PATIENCE))
                .applied_index_at_least(Some(index), "the subscription is applied")
                .await
                .unwrap();
            let frameworks = node.registry.load().unwrap().frameworks;
            assert!(frameworks.iter().any(|f| f.id == id), "{frameworks:?}");
        }

        // The leader dies; the new leader knows the framework, which fails over to it.
        router.remove(leader);
        let dead = masters.remove(&leader).unwrap();
        let _ = dead.shutdown.send(true);
        dead.task.await.unwrap();
        let dead_node = nodes.remove(&leader).unwrap();
        dead_node.replicator.raft().shutdown().await.unwrap();
        let new_leader = elected_leader(&nodes, Some(leader)).await;
        let again = subscribe_at_leader(&masters[&new_leader], 3, &id).await;
        assert_eq!(again, id, "the framework kept its id across the new leader");
        for master in masters.values() {
            let _ = master.shutdown.send(true);
        }
        for (_, master) in masters {
            master.task.await.unwrap();
        }
        for node in nodes.values() {
            node.replicator.raft().shutdown().await.unwrap();
        }
    }
}
