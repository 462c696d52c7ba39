//! The callbacks a framework implements.
//!
//! The SDK calls them one at a time, in the order the master's messages arrive, on the task
//! that runs [`crate::run`]; a slow callback delays the next message (and the acknowledgement of
//! the status update it is handling), so hand long work to another task with a cloned
//! [`Driver`].

use async_trait::async_trait;

use crate::{BatchResult, Driver, ErrorCode, Offer, TaskStatus};

/// A framework's scheduler: reacts to offers and task states by calling the [`Driver`].
#[async_trait]
pub trait Scheduler: Send + 'static {
    /// The first subscription of this `run` succeeded; `framework_id` is the id the master
    /// assigned (or the configured one it accepted). Also called if, after a reconnect, the master
    /// assigned a *different* id (the old one had expired): the framework starts over.
    async fn registered(&mut self, _driver: &Driver, _framework_id: &str) {}

    /// A transparent reconnect succeeded with the same framework id. The SDK has already restated
    /// the last demand and suppress state; outstanding offers of the old connection are gone.
    async fn reregistered(&mut self, _driver: &Driver, _framework_id: &str) {}

    /// New offers. Answer each with [`Driver::accept`] or [`Driver::decline`]; an offer left
    /// unanswered is held until the master times it out.
    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>);

    /// Offers made for a batch ([`Driver::submit_batch`]): each carries the tasks the matcher
    /// placed on its agent in `suggested`, and its resources are exactly their sum.
    ///
    /// The default accepts every offer with exactly its suggested tasks. Override it to change
    /// the tasks (for example their commands or environment) or to decline; an override that
    /// wants the default for some offers calls [`accept_suggested`](crate::accept_suggested).
    async fn batch_offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        for offer in &offers {
            let _ = crate::accept_suggested(driver, offer);
        }
    }

    /// The outcome of a batch: the tasks left unmatched with their reasons, the number of
    /// proposals, the offers sent. Arrives after the batch's offers.
    async fn batch_result(&mut self, _driver: &Driver, _result: BatchResult) {}

    /// The master withdrew an offer (timeout, agent lost); accepting it now would fail.
    async fn offer_rescinded(&mut self, _driver: &Driver, _offer_id: &str) {}

    /// A task changed state. When this returns, the SDK acknowledges the update (if it carries an
    /// `update_id`); an update the master resends after an ack was lost is not delivered again.
    /// Reconciliation answers have an empty `update_id` and are always delivered.
    async fn status_update(&mut self, driver: &Driver, status: TaskStatus);

    /// The master reported an error. Codes that close the connection are followed by a reconnect,
    /// except `VERSION_MISMATCH` and `FRAMEWORK_CONFLICT`, after which [`crate::run`] returns an
    /// error.
    async fn error(&mut self, _driver: &Driver, _code: ErrorCode, _message: &str) {}

    /// The connection was lost; the SDK is reconnecting. Offers received so far are void.
    async fn disconnected(&mut self, _driver: &Driver) {}
}
