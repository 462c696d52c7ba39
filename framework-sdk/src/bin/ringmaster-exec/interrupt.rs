//! Ctrl-C (SIGINT) and SIGTERM: exec tears its framework down so the master kills the tasks it
//! started, instead of leaving them running for the failover timeout.
//!
//! [`Tracked`] wraps either scheduler and keeps the [`Driver`] once the framework is
//! registered; [`run_interruptible`] races the framework against the signals and, on one, stops
//! the driver (a `Teardown`: the master kills every task of the framework and forgets it) and
//! waits briefly for the `Teardown` to be sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use ringmaster_sdk::{
    BatchResult, Driver, ErrorCode, FrameworkConfig, Offer, Scheduler, SdkError, TaskStatus,
};

/// Exit code after SIGINT (128 + 2, the shell's convention).
pub const EXIT_SIGINT: i32 = 130;
/// Exit code after SIGTERM (128 + 15).
pub const EXIT_SIGTERM: i32 = 143;

/// How long exec waits for the `Teardown` to go out after a signal.
const TEARDOWN_WAIT: Duration = Duration::from_secs(5);

/// The signal that ended the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Ctrl-C.
    Int,
    /// `kill`, a service manager stopping exec.
    Term,
}

impl Interrupt {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
        }
    }

    /// The process exit code after this signal.
    pub fn exit_code(self) -> i32 {
        match self {
            Interrupt::Int => EXIT_SIGINT,
            Interrupt::Term => EXIT_SIGTERM,
        }
    }
}

/// The driver of the running framework, once registered.
type DriverSlot = Arc<Mutex<Option<Driver>>>;

/// A scheduler that remembers its [`Driver`]; every callback goes to `inner`.
pub struct Tracked<S> {
    /// The wrapped scheduler.
    pub inner: S,
    slot: DriverSlot,
}

impl<S> Tracked<S> {
    fn keep(&self, driver: &Driver) {
        *self
            .slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(driver.clone());
    }
}

#[async_trait]
impl<S: Scheduler> Scheduler for Tracked<S> {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        self.keep(driver);
        self.inner.registered(driver, framework_id).await;
    }
    async fn reregistered(&mut self, driver: &Driver, framework_id: &str) {
        self.keep(driver);
        self.inner.reregistered(driver, framework_id).await;
    }
    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        self.inner.offers(driver, offers).await;
    }
    async fn batch_offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        self.inner.batch_offers(driver, offers).await;
    }
    async fn batch_result(&mut self, driver: &Driver, result: BatchResult) {
        self.inner.batch_result(driver, result).await;
    }
    async fn offer_rescinded(&mut self, driver: &Driver, offer_id: &str) {
        self.inner.offer_rescinded(driver, offer_id).await;
    }
    async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
        self.inner.status_update(driver, status).await;
    }
    async fn error(&mut self, driver: &Driver, code: ErrorCode, message: &str) {
        self.inner.error(driver, code, message).await;
    }
    async fn disconnected(&mut self, driver: &Driver) {
        self.inner.disconnected(driver).await;
    }
}

/// How a run ended.
pub enum Outcome<S> {
    /// The framework stopped by itself (or failed).
    Finished(Result<S, SdkError>),
    /// A signal arrived; the framework was torn down if it had registered (`torn_down`).
    Interrupted {
        /// The signal.
        signal: Interrupt,
        /// Whether a teardown was sent (false: exec had not registered yet).
        torn_down: bool,
    },
}

/// Waits for SIGINT or SIGTERM. Installed before the framework starts, so a signal during the
/// connection attempt is handled too. `None` when the handlers cannot be installed (then the
/// default action, ending the process, stays).
fn install_signals() -> Option<impl std::future::Future<Output = Interrupt>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).ok()?;
    let mut term = signal(SignalKind::terminate()).ok()?;
    Some(async move {
        tokio::select! {
            _ = int.recv() => Interrupt::Int,
            _ = term.recv() => Interrupt::Term,
        }
    })
}

/// Runs `scheduler` as a framework until it stops or a signal arrives; on a signal, tears the
/// framework down (printing what it did on stderr) and reports [`Outcome::Interrupted`].
pub async fn run_interruptible<S: Scheduler>(config: FrameworkConfig, scheduler: S) -> Outcome<S> {
    let slot = DriverSlot::default();
    let tracked = Tracked {
        inner: scheduler,
        slot: slot.clone(),
    };
    let takeover = config.framework_id.clone();
    let run = ringmaster_sdk::run(config, tracked);
    tokio::pin!(run);
    let Some(signals) = install_signals() else {
        return Outcome::Finished(run.await.map(|t| t.inner));
    };
    let interrupt = tokio::select! {
        result = &mut run => return Outcome::Finished(result.map(|t| t.inner)),
        interrupt = signals => interrupt,
    };
    let driver = slot
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let Some(driver) = driver else {
        match takeover {
            Some(id) => eprintln!(
                "ringmaster-exec: {}: not registered with the master yet; framework {id} keeps its tasks until its failover timeout; exiting",
                interrupt.name()
            ),
            None => eprintln!(
                "ringmaster-exec: {}: not registered with the master yet, so no task was launched; exiting",
                interrupt.name()
            ),
        }
        return Outcome::Interrupted {
            signal: interrupt,
            torn_down: false,
        };
    };
    let framework = driver.framework_id().unwrap_or_default();
    eprintln!(
        "ringmaster-exec: {}: tearing down framework {framework}; the master kills its tasks",
        interrupt.name()
    );
    if driver.stop().is_ok() {
        match tokio::time::timeout(TEARDOWN_WAIT, &mut run).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("ringmaster-exec: {e}"),
            Err(_) => eprintln!(
                "ringmaster-exec: the teardown did not go out within {}s; the master removes framework {framework} and its tasks after the failover timeout",
                TEARDOWN_WAIT.as_secs()
            ),
        }
    }
    Outcome::Interrupted {
        signal: interrupt,
        torn_down: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(Interrupt::Int.exit_code(), 130);
        assert_eq!(Interrupt::Term.exit_code(), 143);
        assert_eq!(Interrupt::Int.name(), "SIGINT");
    }
}
