//! The protocol server: accepting TCP (and TLS) connections and running one task per
//! connection.
//!
//! - [`listener`]: the accept loop. Caps the connections open at once (`limits.max_connections`,
//!   a semaphore; more are closed at accept, counted and logged at most once a second) and
//!   tracks every connection task, so shutdown drains them all before the master reports
//!   stopped.
//! - [`task`]: [`task::ConnectionTask`], one accepted connection: TLS, the handshake
//!   (authentication, the role check, a small frame limit until registration), then the serve
//!   loop that turns frames into [`Event`](super::Event)s and writes what the actor sends back.
//! - [`limits`]: the per-connection limits (message rate, outbound queue) and the budget for
//!   large partial frames shared by all connections.
//!
//! The server knows the actor only through [`Event`](super::Event) and
//! [`Outbound`](super::Outbound); it never touches the state.

pub(crate) mod limits;
pub(crate) mod listener;
pub(crate) mod task;
#[cfg(test)]
mod tests;

pub(crate) use listener::Listener;

/// Resolves once the master's shutdown signal is true (at once if it already is; also if the
/// signal's sender is gone).
pub(crate) async fn stopping(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
