//! The master: accepts agent and framework connections and runs the offer cycle.
//!
//! Shape (functional core, imperative shell): one actor task ([`state::MasterState`]) owns all
//! state and drives the pure placement library; each TCP connection is its own task
//! ([`connection`]) that only translates frames into [`Event`]s and writes what the actor
//! sends back. Nothing but the actor touches the state, so no locks are needed and every
//! decision happens in one deterministic order.

mod agents;
mod batch;
mod connection;
mod frameworks;
mod ids;
mod offers;
mod state;
mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::config::Config;
pub use state::Snapshot;

/// Identifies one connection for the actor's lifetime.
pub type ConnId = u64;

/// What a connection task tells the actor.
#[derive(Debug)]
pub(crate) enum Event {
    /// A connection finished its handshake and sent RegisterAgent or Subscribe.
    Opened {
        conn: ConnId,
        peer: SocketAddr,
        outbound: mpsc::UnboundedSender<Outbound>,
        first: ringmaster_proto::Message,
    },
    /// A later message on an opened connection.
    Inbound {
        conn: ConnId,
        message: ringmaster_proto::Message,
    },
    /// The connection ended (peer closed, error, or the actor asked to close it).
    Closed { conn: ConnId },
    /// A snapshot of the state was asked for (tests, local mode, operators).
    Snapshot(tokio::sync::oneshot::Sender<Snapshot>),
}

/// What the actor asks a connection task to do.
#[derive(Debug)]
pub(crate) enum Outbound {
    Send(ringmaster_proto::Message),
    /// Send this error, then close the connection.
    Close(ringmaster_proto::Error),
}

/// A running master: its address and a handle to ask for state or shut it down.
pub struct Master {
    addr: SocketAddr,
    events: mpsc::Sender<Event>,
    shutdown: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
}

impl Master {
    /// Binds `listen` and starts the actor and the accept loop on the current runtime.
    pub async fn start(listen: &str, config: Config) -> anyhow::Result<Master> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
        let addr = listener.local_addr()?;
        let config = Arc::new(config);
        let (events_tx, events_rx) = mpsc::channel(4096);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let actor = state::MasterState::new(config.clone());
        let actor_task = tokio::spawn(actor.run(events_rx, shutdown_rx.clone()));
        let accept_task = tokio::spawn(connection::accept_loop(
            listener,
            events_tx.clone(),
            config,
            shutdown_rx,
        ));
        let join = tokio::spawn(async move {
            let _ = accept_task.await;
            let _ = actor_task.await;
        });
        tracing::info!(%addr, "master listening");
        Ok(Master {
            addr,
            events: events_tx,
            shutdown: shutdown_tx,
            join,
        })
    }

    /// The address the master listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A consistent copy of the master's state.
    pub async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.events
            .send(Event::Snapshot(tx))
            .await
            .map_err(|_| anyhow::anyhow!("master has stopped"))?;
        Ok(rx.await?)
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
