//! The handle a scheduler uses to act: each call queues one command for the session.
//!
//! Commands travel over an unbounded channel to the task that owns the connection, so a call
//! never blocks, works from inside a callback (the command is sent after the callback returns)
//! and from any other task, and commands are sent in the order they were made.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use crate::{BatchTask, DriverStopped, Resources, TaskInfo};

/// One queued request from the scheduler to the session.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    Accept {
        offer_id: String,
        tasks: Vec<TaskInfo>,
    },
    Decline {
        offer_ids: Vec<String>,
        refuse: Duration,
    },
    Kill {
        task_id: String,
    },
    Revive,
    Suppress,
    Request {
        demand: Resources,
        count: u32,
    },
    Reconcile {
        task_ids: Vec<String>,
    },
    SubmitBatch {
        batch_id: String,
        tasks: Vec<BatchTask>,
    },
    Stop,
}

/// A cheap, cloneable handle to a running framework. Every method queues a message and returns at
/// once; it fails only with [`DriverStopped`] once [`crate::run`] has returned.
#[derive(Clone, Debug)]
pub struct Driver {
    commands: UnboundedSender<Command>,
    framework_id: Arc<Mutex<Option<String>>>,
}

impl Driver {
    pub(crate) fn new(
        commands: UnboundedSender<Command>,
        framework_id: Arc<Mutex<Option<String>>>,
    ) -> Self {
        Driver {
            commands,
            framework_id,
        }
    }

    fn queue(&self, command: Command) -> Result<(), DriverStopped> {
        self.commands.send(command).map_err(|_| DriverStopped)
    }

    /// Launches `tasks` on one offer; whatever they leave unused returns to the pool at once.
    ///
    /// If the offer is not outstanding on the current connection (rescinded, already answered,
    /// received before a reconnect) or the driver is disconnected, nothing is sent and every task
    /// is reported back through [`crate::Scheduler::status_update`] as `TASK_LOST` with reason
    /// `launch_dropped` (no acknowledgement involved).
    pub fn accept(&self, offer_id: &str, tasks: Vec<TaskInfo>) -> Result<(), DriverStopped> {
        self.queue(Command::Accept {
            offer_id: offer_id.to_string(),
            tasks,
        })
    }

    /// Same as [`Driver::accept`] (the Mesos name).
    pub fn launch(&self, offer_id: &str, tasks: Vec<TaskInfo>) -> Result<(), DriverStopped> {
        self.accept(offer_id, tasks)
    }

    /// Declines offers; their agents are not offered to this framework again for `refuse`
    /// (zero: the master's default). Offers not outstanding on the current connection are
    /// silently dropped from the message; nothing is sent when none remains.
    pub fn decline(&self, offer_ids: &[String], refuse: Duration) -> Result<(), DriverStopped> {
        self.queue(Command::Decline {
            offer_ids: offer_ids.to_vec(),
            refuse,
        })
    }

    /// Asks the master to kill a task. Queued while disconnected and sent after the reconnect.
    pub fn kill(&self, task_id: &str) -> Result<(), DriverStopped> {
        self.queue(Command::Kill {
            task_id: task_id.to_string(),
        })
    }

    /// Asks for offers again (clears suppression and decline filters). Remembered across
    /// reconnects.
    pub fn revive(&self) -> Result<(), DriverStopped> {
        self.queue(Command::Revive)
    }

    /// Stops offers until [`Driver::revive`]. Remembered and restated after a reconnect.
    pub fn suppress(&self) -> Result<(), DriverStopped> {
        self.queue(Command::Suppress)
    }

    /// States the demand: the smallest resources the next task needs and how many such tasks are
    /// outstanding (`count` 0 withdraws it). The last demand is restated after every reconnect.
    pub fn request(&self, demand: &Resources, count: u32) -> Result<(), DriverStopped> {
        self.queue(Command::Request {
            demand: demand.clone(),
            count,
        })
    }

    /// Asks for the current state of these tasks (empty: of every task the master knows for this
    /// framework). Answers arrive as status updates with an empty `update_id`. Queued while
    /// disconnected.
    pub fn reconcile(&self, task_ids: &[String]) -> Result<(), DriverStopped> {
        self.queue(Command::Reconcile {
            task_ids: task_ids.to_vec(),
        })
    }

    /// Submits a burst of one-shot, deadline-bound tasks to be matched at once (docs/batch.md).
    ///
    /// The master answers with one offer per matched agent carrying the tasks it suggests
    /// (`Offer.suggested`, `Offer.batch_id`), handed to [`crate::Scheduler::batch_offers`] — whose
    /// default accepts each offer with exactly its suggested tasks — and then a
    /// [`crate::BatchResult`] (unmatched tasks with reasons, number of proposals) handed to
    /// [`crate::Scheduler::batch_result`]. Queued while disconnected and sent after the reconnect.
    pub fn submit_batch(&self, batch_id: &str, tasks: Vec<BatchTask>) -> Result<(), DriverStopped> {
        self.queue(Command::SubmitBatch {
            batch_id: batch_id.to_string(),
            tasks,
        })
    }

    /// Tears the framework down (the master kills its tasks and forgets it) and makes
    /// [`crate::run`] return `Ok`. If the driver is disconnected at that moment no `Teardown` can
    /// be sent; the master then removes the framework after its failover timeout.
    pub fn stop(&self) -> Result<(), DriverStopped> {
        self.queue(Command::Stop)
    }

    /// The framework id, once the master has assigned one (or the configured one to take over).
    pub fn framework_id(&self) -> Option<String> {
        self.framework_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn set_framework_id(&self, id: &str) {
        *self
            .framework_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id.to_string());
    }
}
