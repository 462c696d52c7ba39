//! Ringmaster framework SDK: write a scheduler, get offers, launch tasks.
//!
//! A framework implements [`Scheduler`] (callbacks for registration, offers, status updates and
//! errors) and hands it to [`run`]. The SDK owns the connection to the master: the handshake,
//! the subscription, acknowledging status updates after the callback returns, answering pings,
//! and reconnecting with exponential backoff when the connection drops, re-subscribing with the
//! same framework id and restating the demand. Callbacks act on the cluster through a cheap
//! [`Driver`] handle whose methods queue a message and return at once.
//!
//! ```no_run
//! use ringmaster_sdk::{run, task, Driver, FrameworkConfig, Offer, Resources, Scheduler, TaskStatus};
//!
//! struct Hello;
//!
//! #[async_trait::async_trait]
//! impl Scheduler for Hello {
//!     async fn registered(&mut self, driver: &Driver, _framework_id: &str) {
//!         let _ = driver.request(&Resources::scalar("cpus", 1.0), 1);
//!     }
//!     async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
//!         let unit = Resources::scalar("cpus", 1.0);
//!         for offer in offers {
//!             let _ = driver.accept(&offer.offer_id, vec![task("hello-0", "echo hello", &unit)]);
//!         }
//!     }
//!     async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
//!         // Final: terminal, and not a LOST its agent may still come back from.
//!         if status.is_final() {
//!             let _ = driver.stop();
//!         }
//!     }
//! }
//!
//! # async fn example() -> Result<(), ringmaster_sdk::SdkError> {
//! let config = FrameworkConfig::new("127.0.0.1:5050", "hello");
//! run(config, Hello).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Bursts of one-shot, deadline-bound tasks can be matched at once: [`Driver::submit_batch`],
//! with [`Scheduler::batch_offers`] (launches the suggested tasks by default) and
//! [`Scheduler::batch_result`] (unmatched tasks and why).
//!
//! The package also builds `ringmaster-exec`, a command-line framework on this API that runs one
//! command as N tasks (the analogue of `mesos-execute`); its TLS and authentication flags are
//! [`SecurityFlags`], shared with other command-line clients.

#![warn(missing_docs)]

mod acks;
mod backoff;
mod config;
mod driver;
mod error;
mod flags;
mod scheduler;
mod session;

use std::time::Duration;

use ringmaster_proto::convert::ResourcesWire;
pub use ringmaster_proto::{
    resources::Resources,
    v1::{
        BatchResult, BatchTask, Error as ProtoError, ErrorCode, Offer, TaskInfo, TaskState,
        TaskStatus, UnmatchedTask,
    },
};

pub use config::{FrameworkConfig, DEFAULT_FAILOVER_TIMEOUT, DEFAULT_RECONNECT_MAX_BACKOFF};
pub use driver::Driver;
pub use error::{DriverStopped, SdkError};
pub use flags::{master_list, SecurityFlags};
pub use scheduler::Scheduler;
pub use session::{run, LAUNCH_DROPPED};

/// Builds a [`TaskInfo`] that runs `command` with `sh -c` on the given resources.
///
/// The task's name is its id; the master fills in the framework and agent ids. Set
/// [`TaskInfo::env`] on the result for extra environment variables, and
/// [`TaskInfo::user`] to the Unix user it should run as on the agent (empty: the agent's
/// `--task-user`), [`TaskInfo::priority_class`] to `"base"` for a task that should run at base priority (never
/// counted against the user's priority quota); the partition is the framework's
/// ([`FrameworkConfig::partition`]).
pub fn task(id: &str, command: &str, resources: &Resources) -> TaskInfo {
    TaskInfo {
        task_id: id.to_string(),
        name: id.to_string(),
        command: command.to_string(),
        resources: Some(resources.to_wire()),
        ..TaskInfo::default()
    }
}

/// Sets how long the agent waits between the SIGTERM and the SIGKILL when `info`'s task is
/// killed ([`TaskInfo::kill_grace_ms`]); without it the agent's default (`--kill-grace`, 3 s)
/// applies.
///
/// On the wire 0 means "the agent's default", so a zero (or sub-millisecond) grace is sent as
/// 1 ms: SIGKILL at once. The agent caps the grace at one day.
///
/// ```
/// use std::time::Duration;
/// use ringmaster_sdk::{task, with_kill_grace, Resources};
///
/// let info = with_kill_grace(task("t-0", "sleep 60", &Resources::scalar("cpus", 1.0)), Duration::from_secs(5));
/// assert_eq!(info.kill_grace_ms, 5000);
/// ```
pub fn with_kill_grace(info: TaskInfo, grace: Duration) -> TaskInfo {
    let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX).max(1);
    TaskInfo {
        kill_grace_ms: ms,
        ..info
    }
}

/// Builds a [`BatchTask`] for [`Driver::submit_batch`]: `info` (see [`task`]) with its deadline
/// (seconds, > 0), its work (seconds on an agent of `cpu_speed` 1, > 0) and its price (≥ 0).
pub fn batch_task(info: TaskInfo, deadline_secs: f64, work: f64, price: f64) -> BatchTask {
    BatchTask {
        task: Some(info),
        deadline_secs,
        work,
        price,
    }
}

/// Accepts a batch offer with exactly its suggested tasks (what
/// [`Scheduler::batch_offers`] does by default).
pub fn accept_suggested(driver: &Driver, offer: &Offer) -> Result<(), DriverStopped> {
    driver.accept(&offer.offer_id, offer.suggested.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_carries_id_command_and_resources() {
        let unit = Resources::parse("cpus:0.5;mem:128").unwrap();
        let info = task("t-1", "echo hi", &unit);
        assert_eq!(info.task_id, "t-1");
        assert_eq!(info.name, "t-1");
        assert_eq!(info.command, "echo hi");
        assert_eq!(Resources::from_wire(info.resources.as_ref()).unwrap(), unit);
        assert!(info.framework_id.is_empty() && info.agent_id.is_empty());
        assert_eq!(info.kill_grace_ms, 0, "0: the agent's default grace");
    }

    #[test]
    fn kill_grace_is_set_in_ms_and_never_zero() {
        let unit = Resources::scalar("cpus", 1.0);
        let grace = |d: Duration| with_kill_grace(task("t", "x", &unit), d).kill_grace_ms;
        assert_eq!(grace(Duration::from_secs(5)), 5000);
        assert_eq!(grace(Duration::from_millis(1500)), 1500);
        assert_eq!(grace(Duration::ZERO), 1, "0 would mean the agent's default");
        assert_eq!(grace(Duration::from_micros(10)), 1);
        assert_eq!(grace(Duration::MAX), u64::MAX);
        let info = with_kill_grace(task("t", "x", &unit), Duration::from_secs(1));
        assert_eq!(info.command, "x", "the rest of the task is kept");
    }
}
