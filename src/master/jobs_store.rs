//! The built-in jobs framework's way to the registry: it keeps its jobs in the master's
//! registry (tables `jobs` and `jobs_meta`, docs/reliability.md) by asking the actor, so a
//! job change is written in an actor turn's group commit like any framework or task, and the
//! framework hears back only once it is on disk.
//!
//! Why through the actor and not a file of its own: one durable store, written in one order,
//! is what a restarted (and later a replicated) master recovers from. The records' schema
//! and the store's interface ([`JobsStore`]) belong to the jobs framework
//! (`crate::jobs::store`, `crate::jobs::records`); the master only implements the interface
//! ([`ActorJobsStore`]) and stores the records.

use tokio::sync::{mpsc, oneshot};

use super::events::Event;
pub use crate::jobs::store::{JobsMeta, JobsStore, LoadedJobs};

/// Writes the jobs framework's records through the master's actor.
#[derive(Clone)]
pub struct ActorJobsStore {
    events: mpsc::Sender<Event>,
    durable: bool,
}

impl ActorJobsStore {
    pub(crate) fn new(events: mpsc::Sender<Event>, durable: bool) -> Self {
        ActorJobsStore { events, durable }
    }
}

#[async_trait::async_trait]
impl JobsStore for ActorJobsStore {
    /// Whether the master has a registry (`--work-dir`): without one, saves are answered at
    /// once and the jobs live in the jobs framework's memory only.
    fn is_durable(&self) -> bool {
        self.durable
    }

    /// Writes job records (`None`: delete) and, when given, the framework's own record, in
    /// the actor's next commit. `Ok` once committed; `Err` with why not (the registry failed,
    /// and the master stops, or the master has stopped).
    async fn save(
        &self,
        jobs: Vec<(String, Option<serde_json::Value>)>,
        meta: Option<JobsMeta>,
    ) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.events
            .send(Event::SaveJobs { jobs, meta, reply })
            .await
            .map_err(|_| "the master has stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the master stopped before recording the change".to_string())?
            .map_err(|e| format!("the change was not recorded: {e}"))
    }
}
