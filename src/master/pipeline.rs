//! Pipelined replication of actor turns (cluster mode): the leader goes on deciding while
//! earlier turns are on their way to a quorum, and releases each turn's messages, in order,
//! once its entries are committed.
//!
//! Why: waiting for each turn's quorum before the next event made a replicated master a
//! quarter as fast as a single one (docs/benchmarks.md, "Replicated masters"). The outbox rule
//! still holds: no message leaves before its turn is committed, and turns are released in log
//! order, so nothing a peer hears depends on a decision the group may lose. A turn that changed
//! nothing in the registry still waits behind the turns before it, so per-connection message
//! order is kept. If a commit fails the master steps down and every later turn's messages are
//! dropped with it; the next leader recovers from the registry, as after a crash.

use std::collections::VecDeque;
use std::time::Instant as WallClock;

use tokio::sync::oneshot;

use super::events::{ConnId, Outbound};
use super::ops::model::Snapshot;
use super::registry::RegistryBatch;
use super::replication::{codec, Commit, ReplicationError, Replicator};
use super::state::MasterState;

/// At most this many turns wait for their commit; past it the actor stops taking events until
/// the oldest commits (a stalled quorum must not grow the leader's memory without bound).
pub(crate) const MAX_IN_FLIGHT: usize = 32;

/// What one turn releases once its entries are committed.
pub(crate) struct Released {
    pub outbox: Vec<(ConnId, Outbound)>,
    pub job_replies: Vec<oneshot::Sender<Result<(), String>>>,
    /// `/state` answers computed in this turn: they show its decisions, so they wait for them.
    pub snapshots: Vec<(oneshot::Sender<Snapshot>, Snapshot)>,
}

/// One turn on its way to a quorum.
struct InFlight {
    /// Its entries, oldest first (a large turn is split into several).
    commits: VecDeque<Commit>,
    released: Released,
    submitted: WallClock,
}

/// The turns submitted and not yet committed, oldest first.
#[derive(Default)]
pub(crate) struct Pipeline {
    turns: VecDeque<InFlight>,
}

impl Pipeline {
    pub(crate) fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Whether the actor may take more events.
    pub(crate) fn has_room(&self) -> bool {
        self.turns.len() < MAX_IN_FLIGHT
    }

    /// Waits until the oldest turn is committed (or fails) and hands it back. Never resolves
    /// while empty. Cancel-safe: a commit that resolved is removed in the same poll, and the
    /// turn only when all of its commits have.
    pub(crate) async fn next(&mut self) -> (Released, WallClock, Result<(), ReplicationError>) {
        let Some(front) = self.turns.front_mut() else {
            return std::future::pending().await;
        };
        let mut result = Ok(());
        while let Some(commit) = front.commits.front_mut() {
            let outcome = commit.await;
            front.commits.pop_front();
            if let Err(e) = outcome {
                result = Err(e);
                break;
            }
        }
        let turn = self.turns.pop_front().expect("the front turn");
        (turn.released, turn.submitted, result)
    }
}

impl MasterState {
    /// Ends an actor turn in cluster mode: its batch is submitted to the group (split into
    /// entries small enough for a frame between masters) and its messages wait in `pipeline`
    /// for the commit. A turn with nothing to write and nothing before it is released at once.
    pub(crate) async fn submit_turn(
        &mut self,
        replicator: &dyn Replicator,
        pipeline: &mut Pipeline,
    ) -> Result<(), ReplicationError> {
        let Some(mut durable) = self.durable.take() else {
            return Ok(());
        };
        let batch = self.turn_batch(&mut durable);
        let released = Released {
            outbox: std::mem::take(&mut durable.outbox),
            job_replies: std::mem::take(&mut durable.job_replies),
            snapshots: std::mem::take(&mut durable.snapshots),
        };
        self.durable = Some(durable);
        let mut commits = VecDeque::new();
        if let Some(batch) = batch {
            // A crash between a turn's parts leaves decisions that were never announced, which
            // recovery reconciles like any unsent message.
            let encoded_len = |b: &RegistryBatch| codec::encode(b).map_or(0, |bytes| bytes.len());
            for part in batch.into_parts(self.config.master.max_frame_bytes / 2, &encoded_len) {
                match replicator.submit(part).await {
                    Ok(commit) => commits.push_back(commit),
                    Err(e) => {
                        self.release(released, Err(e.to_string()));
                        return Err(e);
                    }
                }
            }
        } else if pipeline.is_empty() {
            self.release(released, Ok(()));
            return Ok(());
        }
        pipeline.turns.push_back(InFlight {
            commits,
            released,
            submitted: WallClock::now(),
        });
        Ok(())
    }

    /// Releases a committed turn (its messages go, the jobs framework hears `Ok`), or drops
    /// an uncommitted one's messages and tells the jobs framework why.
    pub(crate) fn release(&mut self, released: Released, answer: Result<(), String>) {
        for reply in released.job_replies {
            let _ = reply.send(answer.clone());
        }
        if answer.is_ok() {
            for (conn, outbound) in released.outbox {
                self.deliver(conn, outbound);
            }
            for (reply, snapshot) in released.snapshots {
                let _ = reply.send(snapshot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use ringmaster_proto::{Message, Subscribe};
    use tokio::sync::oneshot;
    use tokio::time::Instant;

    use super::*;
    use crate::config::Config;
    use crate::master::events::Event;
    use crate::master::metrics::Metrics;
    use crate::master::registry::Registry;
    use crate::master::replication::{ReplicationStatus, Role};
    use crate::master::server::limits::{outbound_queue, OutboundReceiver};

    /// A replicator whose commits the test resolves by hand, in any order.
    #[derive(Default)]
    struct Hand {
        pending: Mutex<VecDeque<oneshot::Sender<Result<u64, ReplicationError>>>>,
    }

    impl Hand {
        fn submitted(&self) -> usize {
            self.pending.lock().unwrap().len()
        }

        /// Resolves the `nth` commit still pending (0: the oldest).
        fn resolve(&self, nth: usize, result: Result<u64, ReplicationError>) {
            let tx = self.pending.lock().unwrap().remove(nth).expect("a commit");
            tx.send(result).unwrap();
        }
    }

    #[async_trait::async_trait]
    impl Replicator for Hand {
        async fn submit(&self, _batch: RegistryBatch) -> Result<Commit, ReplicationError> {
            let (tx, rx) = oneshot::channel();
            self.pending.lock().unwrap().push_back(tx);
            Ok(Box::pin(async move {
                rx.await
                    .unwrap_or(Err(ReplicationError::Stopped("dropped".into())))
            }))
        }

        fn status(&self) -> ReplicationStatus {
            ReplicationStatus {
                role: Role::Leader,
                leader: Some(1),
                term: 1,
                applied_index: None,
            }
        }
    }

    struct Leader {
        state: MasterState,
        hand: Arc<Hand>,
        pipeline: Pipeline,
        _dir: tempfile::TempDir,
    }

    impl Leader {
        fn new() -> Leader {
            let dir = tempfile::tempdir().unwrap();
            let registry = Registry::open(dir.path()).unwrap();
            let recovered = registry.load().unwrap();
            let now = Instant::now();
            let mut state =
                MasterState::new(Arc::new(Config::default()), Arc::new(Metrics::new()), now);
            state.recover(Arc::new(registry), recovered, now);
            let hand = Arc::new(Hand::default());
            state.replicator = Some(hand.clone());
            Leader {
                state,
                hand,
                pipeline: Pipeline::default(),
                _dir: dir,
            }
        }

        /// One actor turn: `event`, then the turn is submitted.
        async fn turn(&mut self, event: Event) {
            self.state.handle(event, Instant::now());
            let hand = self.hand.clone();
            self.state
                .submit_turn(&*hand, &mut self.pipeline)
                .await
                .unwrap();
        }

        /// A framework subscribes on connection `conn`.
        async fn subscribe(&mut self, conn: u64, name: &str) -> OutboundReceiver {
            let (outbound, rx) = outbound_queue(64, 1 << 20);
            let first = Message::Subscribe(Subscribe {
                name: name.into(),
                user: "u".into(),
                ..Default::default()
            });
            self.turn(Event::Opened {
                conn,
                peer: ([127, 0, 0, 1], 40_000).into(),
                outbound,
                first,
                principal: None,
            })
            .await;
            rx
        }

        /// Releases the oldest turn if its commits resolved; `None` when it still waits.
        fn release_ready(&mut self) -> Option<Result<(), String>> {
            use futures::FutureExt;
            let (released, _, committed) = self.pipeline.next().now_or_never()?;
            let answer = committed.map_err(|e| e.to_string());
            self.state.release(released, answer.clone());
            Some(answer)
        }
    }

    fn subscribed(rx: &mut OutboundReceiver) -> bool {
        matches!(rx.try_recv(), Some(Outbound::Send(Message::Subscribed(_))))
    }

    #[tokio::test]
    async fn a_turn_s_messages_wait_for_its_commit_and_turns_are_released_in_order() {
        let mut leader = Leader::new();
        let mut first = leader.subscribe(1, "first").await;
        let mut second = leader.subscribe(2, "second").await;
        assert_eq!(
            leader.hand.submitted(),
            2,
            "each turn went to the group at once"
        );
        assert!(!subscribed(&mut first) && !subscribed(&mut second));

        // The second turn's commit resolves first: nothing leaves before the first's.
        leader.hand.resolve(1, Ok(2));
        assert_eq!(leader.release_ready(), None);
        assert!(!subscribed(&mut second));

        leader.hand.resolve(0, Ok(1));
        assert_eq!(leader.release_ready(), Some(Ok(())));
        assert!(subscribed(&mut first));
        assert!(!subscribed(&mut second), "one turn at a time");
        assert_eq!(leader.release_ready(), Some(Ok(())));
        assert!(subscribed(&mut second));
        assert!(leader.pipeline.is_empty());
    }

    #[tokio::test]
    async fn a_read_waits_behind_the_turns_before_it_and_shows_their_decisions() {
        let mut leader = Leader::new();
        let _fw = leader.subscribe(1, "web").await;
        let (tx, mut rx) = oneshot::channel();
        leader.turn(Event::Snapshot(tx)).await;
        assert_eq!(leader.hand.submitted(), 1, "the read wrote nothing");
        assert!(
            rx.try_recv().is_err(),
            "answered before the subscription committed"
        );
        leader.hand.resolve(0, Ok(1));
        assert_eq!(leader.release_ready(), Some(Ok(())));
        assert_eq!(leader.release_ready(), Some(Ok(())));
        let snapshot = rx.try_recv().expect("answered once committed");
        assert_eq!(snapshot.frameworks.len(), 1);

        // With nothing in flight a read is answered in its own turn.
        let (tx, mut rx) = oneshot::channel();
        leader.turn(Event::Snapshot(tx)).await;
        assert!(rx.try_recv().is_ok());
    }

    #[tokio::test]
    async fn a_failed_commit_drops_its_turn_and_the_turns_after_it() {
        let mut leader = Leader::new();
        let mut first = leader.subscribe(1, "first").await;
        let mut second = leader.subscribe(2, "second").await;
        leader.hand.resolve(
            0,
            Err(ReplicationError::NotLeader {
                leader: Some(2),
                address: None,
            }),
        );
        let answer = leader.release_ready().expect("resolved");
        assert!(answer.unwrap_err().contains("not the leader"));
        assert!(!subscribed(&mut first));
        // The caller steps down here; the later turn's messages never leave either.
        drop(leader);
        assert!(!subscribed(&mut second));
    }

    #[tokio::test]
    async fn the_pipeline_has_a_bound() {
        let mut leader = Leader::new();
        let mut conns = Vec::new();
        for conn in 0..MAX_IN_FLIGHT as u64 {
            assert!(leader.pipeline.has_room());
            conns.push(leader.subscribe(conn, &format!("f{conn}")).await);
        }
        assert!(!leader.pipeline.has_room());
        leader.hand.resolve(0, Ok(1));
        assert!(leader.release_ready().is_some());
        assert!(leader.pipeline.has_room());
    }
}
