//! One task per TCP connection: the handshake, the role check, and shuttling frames between
//! the socket and the actor. A connection that breaks the protocol gets an `Error` and is
//! closed; it can never disturb another connection or the actor's state.
//!
//! Per-connection limits (message rate, unread outbound messages; see [`super::limits`]) are
//! enforced here too.
//!
//! Messages in and out and refused frames are counted here, in shared atomic [`Metrics`], so
//! counting never waits on the actor.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ringmaster_proto::{
    answer_hello, Connection, ConnectionError, ConnectionReader, ConnectionWriter, ErrorCode,
    Message,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::limits::{outbound_queue, OutboundReceiver, TokenBucket};
use super::metrics::{Limit, Metrics, Rejection};
use super::{ConnId, Event, Outbound};
use crate::config::{Config, LimitsConfig};

/// How long a client has to send `Hello` and its first message.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the closing `Error` may take to write: a peer that does not read does not get to
/// hold its connection task.
const FAREWELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

pub(crate) async fn accept_loop(
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(handle(
                        conn,
                        stream,
                        peer,
                        events.clone(),
                        config.master.max_frame_bytes,
                        config.limits.clone(),
                        metrics.clone(),
                        shutdown.clone(),
                    ));
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Which conversation a connection is in after its first message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Agent,
    Framework,
}

fn role_of(message: &Message) -> Option<Role> {
    match message {
        Message::RegisterAgent(_) => Some(Role::Agent),
        Message::Subscribe(_) => Some(Role::Framework),
        _ => None,
    }
}

/// Messages a peer in `role` may send after its first message.
fn allowed(role: Role, message: &Message) -> bool {
    match role {
        Role::Agent => matches!(
            message,
            Message::AgentHeartbeat(_)
                | Message::StatusUpdate(_)
                | Message::Ping(_)
                | Message::Pong(_)
                | Message::Error(_)
        ),
        Role::Framework => matches!(
            message,
            Message::Demand(_)
                | Message::Revive(_)
                | Message::Suppress(_)
                | Message::Accept(_)
                | Message::Decline(_)
                | Message::StatusAck(_)
                | Message::Kill(_)
                | Message::Reconcile(_)
                | Message::Teardown(_)
                | Message::SubmitBatch(_)
                | Message::Ping(_)
                | Message::Pong(_)
                | Message::Error(_)
        ),
    }
}

fn protocol_error(e: &ConnectionError, metrics: &Metrics) -> ringmaster_proto::Error {
    let (code, rejection) = match e {
        ConnectionError::UnknownMessage => (ErrorCode::UnknownMessage, Rejection::UnknownMessage),
        _ => (ErrorCode::BadFrame, Rejection::BadFrame),
    };
    metrics.frame_rejected(rejection);
    ringmaster_proto::Error::new(code, e.to_string())
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    conn: ConnId,
    stream: TcpStream,
    peer: SocketAddr,
    events: mpsc::Sender<Event>,
    max_frame_bytes: usize,
    limits: LimitsConfig,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let mut connection = Connection::with_max_frame(stream, max_frame_bytes);
    let opened = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut connection, &metrics))
        .await
    {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            tracing::warn!(%peer, message = %error.message, "handshake refused");
            metrics.message_sent("Error");
            let _ = tokio::time::timeout(FAREWELL_TIMEOUT, connection.send(Message::Error(error)))
                .await;
            return;
        }
        Err(_) => {
            let error = ringmaster_proto::Error::new(
                ErrorCode::NotRegistered,
                "no Hello and RegisterAgent/Subscribe within 10 s",
            );
            metrics.message_sent("Error");
            let _ = tokio::time::timeout(FAREWELL_TIMEOUT, connection.send(Message::Error(error)))
                .await;
            return;
        }
    };
    let role = role_of(&opened).expect("handshake returns a role message");
    let (outbound_tx, mut outbound_rx) = outbound_queue(limits.outbound_queue);
    if events
        .send(Event::Opened {
            conn,
            peer,
            outbound: outbound_tx,
            first: opened,
        })
        .await
        .is_err()
    {
        return;
    }
    let (mut reader, mut writer) = connection.split();
    let close_reason = serve(
        &mut reader,
        &mut writer,
        conn,
        role,
        &events,
        &mut outbound_rx,
        &limits,
        &metrics,
        shutdown,
    )
    .await;
    if let Some(error) = close_reason {
        tracing::warn!(%peer, conn, message = %error.message, "closing connection");
        metrics.message_sent("Error");
        let _ = tokio::time::timeout(FAREWELL_TIMEOUT, writer.send(Message::Error(error))).await;
    }
    let _ = events.send(Event::Closed { conn }).await;
}

/// How a burst of outbound messages ended.
enum Burst {
    Written,
    /// The socket failed: the peer is gone.
    Broken,
    /// The actor asked to close with this error.
    Close(ringmaster_proto::Error),
}

/// Writes `first` and whatever else is queued, then flushes once: one syscall for a burst.
async fn write_burst<S>(
    connection: &mut ConnectionWriter<S>,
    first: Outbound,
    outbound: &mut OutboundReceiver,
    metrics: &Metrics,
) -> Burst
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut next = Some(first);
    while let Some(out) = next.take() {
        match out {
            Outbound::Send(message) => {
                metrics.message_sent(message.kind());
                if connection.feed(message).await.is_err() {
                    return Burst::Broken;
                }
            }
            Outbound::Close(error) => {
                let _ = connection.flush().await;
                return Burst::Close(error);
            }
        }
        next = outbound.try_recv();
    }
    match connection.flush().await {
        Ok(()) => Burst::Written,
        Err(_) => Burst::Broken,
    }
}

/// Reads `Hello` and the role message. `Ok(None)`: the peer left quietly.
async fn handshake<S>(
    connection: &mut Connection<S>,
    metrics: &Metrics,
) -> Result<Option<Message>, ringmaster_proto::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let hello = match connection.recv().await {
        Ok(None) => return Ok(None),
        Ok(Some(Message::Hello(hello))) => {
            metrics.message_received("Hello");
            hello
        }
        Ok(Some(other)) => {
            metrics.message_received(other.kind());
            metrics.frame_rejected(Rejection::UnexpectedMessage);
            return Err(ringmaster_proto::Error::new(
                ErrorCode::NotRegistered,
                format!("expected Hello as the first message, got {}", other.kind()),
            ));
        }
        Err(e) => return Err(protocol_error(&e, metrics)),
    };
    let ack = answer_hello(&hello, concat!("ringmaster ", env!("CARGO_PKG_VERSION")))?;
    metrics.message_sent("HelloAck");
    if connection.send(Message::HelloAck(ack)).await.is_err() {
        return Ok(None);
    }
    match connection.recv().await {
        Ok(None) => Ok(None),
        Ok(Some(message)) if role_of(&message).is_some() => {
            metrics.message_received(message.kind());
            Ok(Some(message))
        }
        Ok(Some(other)) => {
            metrics.message_received(other.kind());
            metrics.frame_rejected(Rejection::UnexpectedMessage);
            Err(ringmaster_proto::Error::new(
                ErrorCode::NotRegistered,
                format!(
                    "{} before RegisterAgent or Subscribe: register or subscribe first",
                    other.kind()
                ),
            ))
        }
        Err(e) => Err(protocol_error(&e, metrics)),
    }
}

/// Forwards frames until the peer leaves, breaks the protocol or a limit, or the actor closes
/// us. Reading and writing run side by side, so a peer that sends but does not read fills its
/// outbound queue (and is closed) instead of stalling its own requests unseen.
/// Returns the error to send before closing, if any.
#[allow(clippy::too_many_arguments)]
async fn serve<S>(
    reader: &mut ConnectionReader<S>,
    writer: &mut ConnectionWriter<S>,
    conn: ConnId,
    role: Role,
    events: &mpsc::Sender<Event>,
    outbound: &mut OutboundReceiver,
    limits: &LimitsConfig,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
) -> Option<ringmaster_proto::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let overflow = outbound.overflow_signal();
    let capacity = outbound.capacity();
    let read_side = async {
        let mut bucket = TokenBucket::new(limits, tokio::time::Instant::now());
        loop {
            let message = match reader.recv().await {
                Ok(None) | Err(ConnectionError::Io(_)) => return None,
                Ok(Some(message)) => message,
                Err(e) => return Some(protocol_error(&e, metrics)),
            };
            metrics.message_received(message.kind());
            if !bucket.take(tokio::time::Instant::now()) {
                metrics.connection_limited(Limit::MessageRate);
                return Some(ringmaster_proto::Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "more than {} messages per second (burst {}): slow down \
                         (limits.messages_per_sec, limits.burst)",
                        limits.messages_per_sec, limits.burst
                    ),
                ));
            }
            if !allowed(role, &message) {
                metrics.frame_rejected(Rejection::UnexpectedMessage);
                let what = if role_of(&message).is_some() {
                    "already registered on this connection".to_string()
                } else {
                    format!(
                        "not valid from {}",
                        match role {
                            Role::Agent => "an agent",
                            Role::Framework => "a framework",
                        }
                    )
                };
                return Some(ringmaster_proto::Error::new(
                    ErrorCode::UnexpectedMessage,
                    format!("{}: {what}", message.kind()),
                ));
            }
            if events.send(Event::Inbound { conn, message }).await.is_err() {
                return None;
            }
        }
    };
    let write_side = async {
        loop {
            let first = outbound.recv().await?;
            match write_burst(writer, first, outbound, metrics).await {
                Burst::Written => {}
                Burst::Broken => return None,
                Burst::Close(error) => return Some(error),
            }
        }
    };
    tokio::select! {
        closed = read_side => closed,
        closed = write_side => closed,
        _ = overflow.wait() => {
            metrics.connection_limited(Limit::OutboundQueue);
            Some(ringmaster_proto::Error::new(
                ErrorCode::SlowConsumer,
                format!(
                    "more than {capacity} messages queued to this connection and not read: \
                     read faster (limits.outbound_queue)"
                ),
            ))
        }
        _ = shutdown.changed() => Some(ringmaster_proto::Error::new(
            ErrorCode::ShuttingDown,
            "master is shutting down",
        )),
    }
}
