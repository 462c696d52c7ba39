//! The actor's loop, the imperative shell around [`MasterState`]: it feeds events, timer ticks
//! and allocation runs to the state's handlers with the clock's time, and commits each turn
//! (to the registry, or through the replication group's [`Pipeline`]) before its messages leave.

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::events::Event;
use super::liveness::PauseDetector;
use super::pipeline::Pipeline;
use super::replication::ReplicationError;
use super::state::{MasterState, RunEnd};

impl MasterState {
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
        let mut ticks = PauseDetector::new(tick_every);
        // Cluster mode: turns submitted to the group and not yet committed.
        let mut pipeline = Pipeline::default();
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
    fn replication_failed(&self, error: ReplicationError) -> RunEnd {
        match error {
            ReplicationError::NotLeader { leader, .. } => {
                tracing::warn!(?leader, "no longer the leader: this master steps down");
                RunEnd::NotLeader
            }
            e => {
                tracing::error!("{e}; the master stops rather than act on unrecorded decisions");
                RunEnd::Failed
            }
        }
    }
}

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
