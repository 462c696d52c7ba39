//! One task per TCP connection ([`ConnectionTask`]): the handshake, the role check, and
//! shuttling frames between the socket and the actor. A connection that breaks the protocol gets an `Error` and is
//! closed; it can never disturb another connection or the actor's state.
//!
//! Per-connection limits (message rate, unread outbound messages; see [`super::limits`]) are
//! enforced here too.
//!
//! Messages in and out and refused frames are counted here, in shared atomic [`Metrics`], so
//! counting never waits on the actor.
//!
//! With `tls:` configured each socket is wrapped in TLS before the first frame; the
//! authentication handshake (`Authenticate` answering the `HelloAck` challenge) and the
//! role/user checks of `auth:` also happen here, before the actor hears of the connection.
//! See docs/security.md.
//!
//! Before its RegisterAgent or Subscribe a connection may send frames of at most
//! `limits.max_handshake_frame_bytes` (64 KiB by default): `Hello`, and on a master that
//! requires authentication also `Authenticate`. So a peer that has not said (or, where
//! required, proven) who it is cannot make the master buffer a `master.max_frame_bytes`
//! (4 MiB) frame. The role message itself may be full-size (an agent re-registering with many
//! tasks); see `handshake`.
//!
//! In cluster mode ([`ConnectionTask::with_raft`]) a connection whose first message is a
//! `RaftRequest` belongs to another master of the replication group (authenticated as role
//! `master` where `auth.required`): `serve_raft` answers its RPCs from the Raft node and the
//! actor never hears of it. Without cluster mode such a connection gets `UNEXPECTED_MESSAGE`.

use std::net::SocketAddr;
use std::sync::Arc;

use ringmaster_proto::security::{new_challenge, AuthRole};
use ringmaster_proto::transport::{BoxedStream, TLS_HANDSHAKE_RECORD};
use ringmaster_proto::{
    answer_hello, Authenticated, Connection, ConnectionError, ConnectionReader, ConnectionWriter,
    Envelope, ErrorCode, Message,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use super::limits::{outbound_queue, Budgeted, FrameBudget, OutboundReceiver, TokenBucket};
use crate::config::{Config, LimitsConfig};
use crate::master::events::{ConnId, Event, Outbound};
use crate::master::metrics::{Limit, Metrics, Rejection};
use crate::master::replication::transport::RaftHandler;
use crate::security::AuthConfig;

/// How long a client has to send `Hello` and its first message.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the closing `Error` may take to write: a peer that does not read does not get to
/// hold its connection task.
const FAREWELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Which conversation a connection is in after its first message.
type Role = AuthRole;

fn role_of(message: &Message) -> Option<Role> {
    match message {
        Message::RegisterAgent(_) => Some(Role::Agent),
        Message::Subscribe(_) => Some(Role::Framework),
        // Another master of the replication group; served without the actor (`serve_raft`).
        Message::RaftRequest(_) => Some(Role::Master),
        _ => None,
    }
}

/// One accepted connection and what it needs to talk to the actor: the handshake, then the
/// serve loop, until the peer leaves, breaks the protocol or a limit, or the master stops.
/// Where a connection that turns out to speak HTTP is handed (the operator HTTP server).
pub(crate) type HttpHandoff = mpsc::Sender<(TcpStream, SocketAddr)>;

pub(crate) struct ConnectionTask {
    http: Option<HttpHandoff>,
    /// The address the `--http` server listens on: HTTP requests are handed off only when they
    /// reached the protocol port on an address that server serves too (`None`: not told, every
    /// address).
    http_addr: Option<SocketAddr>,
    /// The listener's budget for large partial frames (`None`: one of this connection's own).
    frames: Option<FrameBudget>,
    /// This master's Raft node, in cluster mode: peers' `RaftRequest`s are served here.
    raft: Option<Arc<RaftHandler>>,
    conn: ConnId,
    peer: SocketAddr,
    events: mpsc::Sender<Event>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
}

impl ConnectionTask {
    pub(crate) fn new(
        conn: ConnId,
        peer: SocketAddr,
        events: mpsc::Sender<Event>,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        ConnectionTask {
            http: None,
            http_addr: None,
            frames: None,
            raft: None,
            conn,
            peer,
            events,
            config,
            metrics,
            shutdown,
        }
    }

    /// Runs the connection to its end. Before registration (TLS and protocol handshakes) the
    /// master's shutdown ends it at once; after, the serve loop says goodbye with
    /// `SHUTTING_DOWN`.
    /// Hands connections whose first bytes are an HTTP request to `http` (the protocol port
    /// then serves the operator HTTP surface too, as Mesos serves both on 5050).
    pub(crate) fn with_http(mut self, http: Option<HttpHandoff>) -> Self {
        self.http = http;
        self
    }

    /// Hands HTTP requests off only when they reached an address the `--http` server at
    /// `http_addr` serves too (see [`http_served_at`]); others get a plain 404.
    pub(crate) fn with_http_addr(mut self, http_addr: Option<SocketAddr>) -> Self {
        self.http_addr = http_addr;
        self
    }

    /// Reads large frames within `budget`, shared with the listener's other connections (see
    /// [`super::limits::FrameBudget`]).
    pub(crate) fn with_frame_budget(mut self, budget: FrameBudget) -> Self {
        self.frames = Some(budget);
        self
    }

    /// Serves other masters' Raft RPCs with `raft` (cluster mode; `None`, the default: a
    /// `RaftRequest` is refused with `UNEXPECTED_MESSAGE`). A connection whose first message
    /// after the handshake is a `RaftRequest`, from a peer authenticated as `master` (or from
    /// anyone when `auth.required` is off), is then answered by `raft` directly, never through
    /// the actor.
    pub(crate) fn with_raft(mut self, raft: Option<Arc<RaftHandler>>) -> Self {
        self.raft = raft;
        self
    }

    pub(crate) async fn run(self, stream: TcpStream, tls: Option<TlsAcceptor>) {
        if let Some(http) = &self.http {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, speaks_http(&stream)).await {
                Ok(Some(true)) => {
                    let local = stream.local_addr().ok();
                    if local.is_some_and(|local| http_served_at(local, self.http_addr)) {
                        let _ = http.send((stream, self.peer)).await;
                    } else {
                        tracing::debug!(peer = %self.peer, ?local, "HTTP on an address --http does not serve: 404");
                        refuse_http(stream).await;
                    }
                    return;
                }
                Ok(Some(false)) => {}
                // Left, or said nothing in time.
                Ok(None) | Err(_) => return,
            }
        }
        let mut stopping = self.shutdown.clone();
        let secured = tokio::select! {
            secured = Box::pin(self.secure(stream, tls)) => secured,
            _ = super::stopping(&mut stopping) => None,
        };
        if let Some(stream) = secured {
            self.handle(stream).await;
        }
    }

    /// Runs a connection opened inside the process: already private, so no TLS and no HTTP;
    /// the protocol handshake (and authentication) as for any client.
    pub(crate) async fn run_in_process(self, stream: BoxedStream) {
        self.handle(stream).await;
    }

    /// Wraps the socket in TLS when the master serves TLS. A client that sends plain protocol
    /// bytes to a TLS master gets a plain `Error` with `TLS_REQUIRED` (it could not read
    /// anything else) and is closed; a failed handshake is logged and counted.
    async fn secure(&self, stream: TcpStream, tls: Option<TlsAcceptor>) -> Option<BoxedStream> {
        let (peer, metrics) = (self.peer, &self.metrics);
        let Some(acceptor) = tls else {
            return Some(Box::new(stream));
        };
        match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            accept_tls(acceptor, stream, peer, metrics),
        )
        .await
        {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(Some(reason))) => {
                metrics.tls_failed(reason);
                None
            }
            Ok(Err(None)) => None,
            Err(_) => {
                tracing::warn!(%peer, "no TLS handshake within 10 s");
                metrics.tls_failed("timeout");
                None
            }
        }
    }
}

/// The TLS handshake. `Err(Some(reason))`: a failure to count; `Err(None)`: the peer left
/// before sending anything, or was refused and counted already.
async fn accept_tls(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    metrics: &Metrics,
) -> Result<BoxedStream, Option<&'static str>> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => return Err(None),
        Ok(_) => {}
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        tracing::warn!(%peer, "plain bytes on the TLS port: refused with TLS_REQUIRED");
        // Counted before the (bounded) graceful close, which waits for the client to go.
        metrics.tls_failed("plaintext");
        refuse_plaintext(stream).await;
        return Err(None);
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Ok(Box::new(tls)),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "TLS handshake failed");
            Err(Some("handshake"))
        }
    }
}

/// Answers a plain-TCP client with one plain `Error` frame, then closes gracefully: the
/// client's unread `Hello` is drained first so the close is a FIN, not a reset that could
/// destroy the error before it is read.
async fn refuse_plaintext(mut stream: TcpStream) {
    let error = ringmaster_proto::Error::new(
        ErrorCode::TlsRequired,
        "this master only accepts TLS connections: connect with TLS (--tls-ca FILE)",
    );
    let body = prost::Message::encode_to_vec(&Envelope::new(Message::Error(error)));
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let close = async {
        stream.write_all(&frame).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0usize;
        while drained < 64 * 1024 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), close).await;
}

/// Whether an HTTP request that reached the protocol port at `local` (the address the client
/// connected to) may be handed to the `--http` server listening on `http`: only when that
/// server serves `local`'s address too (the same IP, or `--http` is a wildcard address of the
/// same family; `[::]` also serves IPv4). So `--listen 0.0.0.0 --http 10.0.0.5:8080` serves
/// HTTP on the protocol port at 10.0.0.5 only, not on every interface. `None` (the listener
/// was not told the `--http` address): every address, as before.
pub(crate) fn http_served_at(local: SocketAddr, http: Option<SocketAddr>) -> bool {
    let Some(http) = http else {
        return true;
    };
    let (local, http) = (local.ip().to_canonical(), http.ip().to_canonical());
    if http.is_unspecified() {
        return http.is_ipv6() || local.is_ipv4();
    }
    local == http
}

/// Answers an HTTP request that may not be served here with a plain 404, then closes
/// gracefully (the unread request is drained first, so the close is not a reset).
async fn refuse_http(mut stream: TcpStream) {
    const NOT_HERE: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n\
        Content-Length: 38\r\nConnection: close\r\n\r\nno HTTP on this address of the master\n";
    let close = async {
        // The request line and headers, at most 64 KiB, before answering.
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        while seen.len() < 64 * 1024 && !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await? {
                0 => break,
                n => seen.extend_from_slice(&chunk[..n]),
            }
        }
        stream.write_all(NOT_HERE).await?;
        stream.shutdown().await?;
        let mut drained = 0usize;
        while drained < 64 * 1024 {
            match stream.read(&mut chunk).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), close).await;
}

/// Messages a peer in `role` may send after its first message.
fn allowed(role: Role, message: &Message) -> bool {
    match role {
        // Masters exchange Raft RPCs only (not through the actor; docs/architecture.md).
        Role::Master => matches!(
            message,
            Message::RaftRequest(_) | Message::Ping(_) | Message::Pong(_) | Message::Error(_)
        ),
        Role::Agent => matches!(
            message,
            Message::AgentHeartbeat(_)
                | Message::StatusUpdate(_)
                | Message::FileData(_)
                | Message::UsageReport(_)
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

impl ConnectionTask {
    async fn handle(self, stream: BoxedStream) {
        let ConnectionTask {
            conn,
            peer,
            events,
            config,
            metrics,
            shutdown,
            http: _,
            http_addr: _,
            frames,
            raft,
        } = self;
        let stopping = shutdown.clone();
        let max_frame = config.master.max_frame_bytes;
        let handshake_max = config.limits.max_handshake_frame_bytes.min(max_frame);
        // Large frames are read only within the listener's budget, before registration and
        // after (the handshake limit keeps frames small before it anyway).
        let frames = frames.unwrap_or_else(|| FrameBudget::for_config(&config));
        let stream = frames.guard(stream, handshake_max);
        let mut connection = Connection::with_max_frame(stream, handshake_max);
        // Boxed, like `secure` above: the handshake's futures are large and live only until
        // registration; inline they would size every connection's task for its whole life.
        let opening = Box::pin(open(
            &mut connection,
            &config.auth,
            raft.is_some(),
            max_frame,
            &metrics,
            peer,
            shutdown.clone(),
        ));
        let Some((opened, principal)) = opening.await else {
            return;
        };
        let role = role_of(&opened).expect("handshake returns a role message");
        let opened = match (opened, &raft) {
            (Message::RaftRequest(first), Some(raft)) => {
                // Another master: its RPCs go to the Raft node, not to the actor.
                set_frame_limit(&mut connection, max_frame);
                Box::pin(serve_raft(
                    connection, raft, first, &metrics, peer, shutdown,
                ))
                .await;
                return;
            }
            (opened, _) => opened,
        };
        // Registered: full-size frames from now on (the handshake raised the limit before
        // the role message already; this only makes it plain).
        set_frame_limit(&mut connection, max_frame);
        let limits: &LimitsConfig = &config.limits;
        let (outbound_tx, mut outbound_rx) =
            outbound_queue(limits.outbound_queue, limits.outbound_queue_bytes);
        if !forward(
            &events,
            Event::Opened {
                conn,
                peer,
                outbound: outbound_tx,
                first: opened,
                principal,
            },
        )
        .delivered()
        .await
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
            limits,
            &metrics,
            shutdown,
        )
        .await;
        // The actor also stops on shutdown, which closes the outbound queue: whichever this
        // task noticed first, a peer of a stopping master hears why.
        let close_reason = close_reason.or_else(|| {
            stopping.borrow().then(|| {
                ringmaster_proto::Error::new(ErrorCode::ShuttingDown, "master is shutting down")
            })
        });
        if let Some(error) = close_reason {
            tracing::warn!(%peer, conn, message = %error.message, "closing connection");
            metrics.message_sent("Error");
            let _ = tokio::time::timeout(
                FAREWELL_TIMEOUT,
                Box::pin(writer.send(Message::Error(error))),
            )
            .await;
        }
        forward(&events, Event::Closed { conn }).delivered().await;
    }
}

/// Sets the frame limit of the codec and of the budget's frame scan together.
fn set_frame_limit<S>(connection: &mut Connection<Budgeted<S>>, limit: usize)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    connection.set_max_frame(limit);
    connection.get_ref().set_frame_limit(limit);
}

/// HTTP request lines start with a method; a protocol frame starts with its length (a first
/// byte of 0 below 16 MiB) and TLS with 0x16, so four bytes tell them apart.
const HTTP_METHODS: [&[u8; 4]; 7] = [
    b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC",
];

/// `Some(true)`: these first bytes start an HTTP request; `Some(false)`: they cannot;
/// `None`: too few bytes to tell.
fn http_request_start(first: &[u8]) -> Option<bool> {
    let n = first.len().min(4);
    let could = HTTP_METHODS.iter().any(|m| m[..n] == first[..n]);
    match (could, n == 4) {
        (false, _) => Some(false),
        (true, true) => Some(true),
        (true, false) => None,
    }
}

/// Waits for the connection's first bytes (without consuming them) and says whether they
/// are an HTTP request. `None`: the peer left.
async fn speaks_http(stream: &TcpStream) -> Option<bool> {
    let mut first = [0u8; 4];
    loop {
        let n = stream.peek(&mut first).await.ok()?;
        if n == 0 {
            return None;
        }
        if let Some(answer) = http_request_start(&first[..n]) {
            return Some(answer);
        }
        // A prefix of a method: the rest is on its way.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Hands an event to the actor: at once when its queue has room (the common case), else
/// through a boxed wait. `Sender::send`'s future holds the event and a semaphore wait (about
/// 750 bytes); awaited inline, it and the event would size every connection's task for its
/// whole life. `false`: the actor is gone.
fn forward(events: &mpsc::Sender<Event>, event: Event) -> Forward<'_> {
    match events.try_send(event) {
        Ok(()) => Forward::Done(true),
        Err(mpsc::error::TrySendError::Closed(_)) => Forward::Done(false),
        Err(mpsc::error::TrySendError::Full(event)) => {
            let send = events.send(event);
            Forward::Wait(Box::pin(async move { send.await.is_ok() }))
        }
    }
}

enum Forward<'a> {
    Done(bool),
    Wait(std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>),
}

impl Forward<'_> {
    async fn delivered(self) -> bool {
        match self {
            Forward::Done(delivered) => delivered,
            Forward::Wait(wait) => wait.await,
        }
    }
}

/// The handshake phase of a connection: `Hello`, authentication and the role message within
/// [`HANDSHAKE_TIMEOUT`], or the error that refuses the peer. `None`: the connection ends.
async fn open<S>(
    connection: &mut Connection<Budgeted<S>>,
    auth: &AuthConfig,
    cluster: bool,
    max_frame: usize,
    metrics: &Metrics,
    peer: SocketAddr,
    mut stopping: watch::Receiver<bool>,
) -> Option<(Message, Option<String>)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let handshake = handshake(connection, auth, cluster, max_frame, metrics, peer);
    let handshake = tokio::select! {
        done = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => done,
        _ = super::stopping(&mut stopping) => return None,
    };
    let error = match handshake {
        Ok(Ok(opened)) => return opened,
        Ok(Err(error)) => {
            tracing::warn!(%peer, message = %error.message, "handshake refused");
            error
        }
        Err(_) => ringmaster_proto::Error::new(
            ErrorCode::NotRegistered,
            "no Hello and RegisterAgent/Subscribe within 10 s",
        ),
    };
    metrics.message_sent("Error");
    let _ = tokio::time::timeout(
        FAREWELL_TIMEOUT,
        Box::pin(connection.send(Message::Error(error))),
    )
    .await;
    None
}

/// Raft requests of one peer being answered at once; more wait unread.
const RAFT_IN_FLIGHT: usize = 16;

/// Answers a peer master's Raft RPCs until it leaves, breaks the protocol, or this master
/// stops. Requests are answered concurrently (a vote is not held up by a snapshot chunk);
/// responses carry their request's id.
async fn serve_raft(
    connection: Connection<Budgeted<BoxedStream>>,
    raft: &RaftHandler,
    first: ringmaster_proto::RaftRequest,
    metrics: &Metrics,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    use futures::stream::{FuturesUnordered, StreamExt as _};
    let (mut reader, mut writer) = connection.split();
    let (replies, mut outgoing) = mpsc::channel::<Message>(RAFT_IN_FLIGHT);
    let read_side = async {
        let mut in_flight = FuturesUnordered::new();
        in_flight.push(raft.handle(first));
        loop {
            tokio::select! {
                Some(response) = in_flight.next(), if !in_flight.is_empty() => {
                    if replies.send(Message::RaftResponse(response)).await.is_err() {
                        return None;
                    }
                }
                message = reader.recv(), if in_flight.len() < RAFT_IN_FLIGHT => {
                    let message = match message {
                        Ok(None) | Err(ConnectionError::Io(_)) => return None,
                        Ok(Some(message)) => message,
                        Err(e) => return Some(protocol_error(&e, metrics)),
                    };
                    metrics.message_received(message.kind());
                    match message {
                        Message::RaftRequest(request) => in_flight.push(raft.handle(request)),
                        Message::Ping(ping) => {
                            let pong = Message::Pong(ringmaster_proto::Pong { nonce: ping.nonce });
                            if replies.send(pong).await.is_err() {
                                return None;
                            }
                        }
                        Message::Pong(_) => {}
                        Message::Error(_) => return None,
                        other => {
                            metrics.frame_rejected(Rejection::UnexpectedMessage);
                            return Some(ringmaster_proto::Error::new(
                                ErrorCode::UnexpectedMessage,
                                format!("{}: not valid from a master", other.kind()),
                            ));
                        }
                    }
                }
            }
        }
    };
    let write_side = async {
        while let Some(message) = outgoing.recv().await {
            metrics.message_sent(message.kind());
            if writer.send(message).await.is_err() {
                return;
            }
        }
    };
    let close_reason = tokio::select! {
        closed = read_side => closed,
        () = write_side => None,
        _ = shutdown.changed() => Some(ringmaster_proto::Error::new(
            ErrorCode::ShuttingDown,
            "master is shutting down",
        )),
    };
    if let Some(error) = close_reason {
        tracing::warn!(%peer, message = %error.message, "closing master connection");
        metrics.message_sent("Error");
        let _ = tokio::time::timeout(
            FAREWELL_TIMEOUT,
            Box::pin(writer.send(Message::Error(error))),
        )
        .await;
    }
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

/// Counts an authentication or authorization failure and builds the error that closes the
/// connection.
fn auth_failure(
    metrics: &Metrics,
    reason: &'static str,
    code: ErrorCode,
    message: String,
) -> ringmaster_proto::Error {
    metrics.auth_failed(reason);
    ringmaster_proto::Error::new(code, message)
}

/// Reads `Hello`, an optional `Authenticate`, and the role message. Returns the role message
/// and the authenticated principal (`None`: anonymous, allowed only when auth is not
/// required). `Ok(None)`: the peer left quietly.
///
/// Frame limits: the connection starts at the small handshake limit. It is raised to
/// `max_frame` for the role message: right after `HelloAck` when authentication is optional
/// (anyone may register and send full-size frames then anyway), after a successful
/// `Authenticate` when it is required. So on a master requiring authentication nothing larger
/// than the handshake limit is read from a peer that has not proven who it is.
async fn handshake<S>(
    connection: &mut Connection<Budgeted<S>>,
    auth: &AuthConfig,
    cluster: bool,
    max_frame: usize,
    metrics: &Metrics,
    peer: SocketAddr,
) -> Result<Option<(Message, Option<String>)>, ringmaster_proto::Error>
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
    let mut ack = answer_hello(&hello, concat!("ringmaster ", env!("CARGO_PKG_VERSION")))?;
    let challenge = new_challenge().map_err(|_| {
        ringmaster_proto::Error::new(
            ErrorCode::ShuttingDown,
            "the master cannot draw a random challenge",
        )
    })?;
    ack.challenge = challenge.to_vec();
    ack.auth_required = auth.required;
    metrics.message_sent("HelloAck");
    if connection.send(Message::HelloAck(ack)).await.is_err() {
        return Ok(None);
    }
    if !auth.required {
        set_frame_limit(connection, max_frame);
    }
    let mut next = connection.recv().await;
    let mut authenticated: Option<(String, Role)> = None;
    if let Ok(Some(Message::Authenticate(answer))) = &next {
        metrics.message_received("Authenticate");
        let Some(role) = AuthRole::parse(&answer.role) else {
            return Err(auth_failure(
                metrics,
                "malformed",
                ErrorCode::AuthenticationFailed,
                format!(
                    "Authenticate: role must be agent, framework or master, got {:?}",
                    answer.role
                ),
            ));
        };
        let principal = answer.principal.as_str();
        let grant = auth.principals.get(principal);
        let verified = match grant {
            Some(g) => g.verify(&challenge, principal, role, &answer.mac),
            None => {
                // Spend the same HMAC work as for a known principal, so the answer's timing
                // does not tell which principals exist.
                let _ = ringmaster_proto::security::verify_mac(
                    &challenge,
                    &challenge,
                    principal,
                    role.as_str(),
                    &answer.mac,
                );
                false
            }
        };
        if !verified {
            // The same answer for an unknown principal and a wrong secret: a client cannot
            // probe which principals exist. The log and the metric tell them apart.
            let reason = if grant.is_none() {
                "unknown_principal"
            } else {
                "bad_secret"
            };
            tracing::warn!(%peer, principal, reason, "authentication failed");
            return Err(auth_failure(
                metrics,
                reason,
                ErrorCode::AuthenticationFailed,
                format!(
                    "authentication failed for principal {principal:?}: unknown principal or wrong secret"
                ),
            ));
        }
        if !grant.is_some_and(|g| g.allows_role(role)) {
            tracing::warn!(%peer, principal, %role, "principal may not take this role");
            return Err(auth_failure(
                metrics,
                "role_not_allowed",
                ErrorCode::NotAuthorized,
                format!("principal {principal:?} may not connect as {role}"),
            ));
        }
        metrics.message_sent("Authenticated");
        let done = Authenticated {
            principal: principal.to_string(),
            role: role.as_str().to_string(),
        };
        if connection.send(Message::Authenticated(done)).await.is_err() {
            return Ok(None);
        }
        set_frame_limit(connection, max_frame);
        tracing::debug!(%peer, principal, %role, "authenticated");
        authenticated = Some((principal.to_string(), role));
        next = connection.recv().await;
    }
    let message = match next {
        Ok(None) | Err(ConnectionError::Io(_)) => {
            if authenticated.is_none() && auth.required {
                // Told that authentication is required (HelloAck) and left without a
                // credential: as much a missing credential as a refused registration.
                tracing::debug!(%peer, "left after learning authentication is required");
                metrics.auth_failed("missing");
            }
            return Ok(None);
        }
        Ok(Some(message)) if role_of(&message).is_some() => {
            metrics.message_received(message.kind());
            message
        }
        Ok(Some(other)) => {
            metrics.message_received(other.kind());
            metrics.frame_rejected(Rejection::UnexpectedMessage);
            if authenticated.is_none() && auth.required {
                // Refused without the credential this master requires: counted by reason like
                // every other authentication refusal.
                metrics.auth_failed("missing");
            }
            let what = if authenticated.is_some() {
                "after Authenticated"
            } else {
                "before RegisterAgent or Subscribe"
            };
            return Err(ringmaster_proto::Error::new(
                ErrorCode::NotRegistered,
                format!("{} {what}: register or subscribe first", other.kind()),
            ));
        }
        Err(e) => return Err(protocol_error(&e, metrics)),
    };
    let role = role_of(&message).expect("checked above");
    if role == Role::Master && !cluster {
        metrics.frame_rejected(Rejection::UnexpectedMessage);
        return Err(ringmaster_proto::Error::new(
            ErrorCode::UnexpectedMessage,
            "RaftRequest: this master is not in cluster mode (no cluster: section)",
        ));
    }
    let Some((principal, authenticated_role)) = authenticated else {
        if auth.required {
            tracing::warn!(%peer, kind = message.kind(), "unauthenticated client refused");
            return Err(auth_failure(
                metrics,
                "missing",
                ErrorCode::AuthenticationRequired,
                format!(
                    "this master requires authentication: send Authenticate before {} \
                     (agent and ringmaster-exec flags --principal NAME --secret-file FILE)",
                    message.kind()
                ),
            ));
        }
        return Ok(Some((message, None)));
    };
    if role != authenticated_role {
        return Err(auth_failure(
            metrics,
            "role_not_allowed",
            ErrorCode::NotAuthorized,
            format!(
                "authenticated as {authenticated_role} but sent {}",
                message.kind()
            ),
        ));
    }
    if let Message::Subscribe(subscribe) = &message {
        let allowed = auth
            .principals
            .get(&principal)
            .is_some_and(|g| g.allows_user(&subscribe.user));
        if !allowed {
            tracing::warn!(%peer, %principal, user = %subscribe.user, "framework user not allowed");
            return Err(auth_failure(
                metrics,
                "user_not_allowed",
                ErrorCode::NotAuthorized,
                format!(
                    "principal {principal:?} may not run frameworks as user {:?}",
                    subscribe.user
                ),
            ));
        }
    }
    Ok(Some((message, Some(principal))))
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
    let (capacity, capacity_bytes) = (outbound.capacity(), outbound.capacity_bytes());
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
                            Role::Master => "a master",
                        }
                    )
                };
                return Some(ringmaster_proto::Error::new(
                    ErrorCode::UnexpectedMessage,
                    format!("{}: {what}", message.kind()),
                ));
            }
            if !forward(events, Event::Inbound { conn, message })
                .delivered()
                .await
            {
                return None;
            }
        }
    };
    let write_side = async {
        loop {
            let first = outbound.recv().await?;
            // Boxed: a burst's futures (a message being fed, the next one waiting) are large
            // and live only while it is written; inline they would size every connection's
            // task for its whole life. One allocation per burst, not per message.
            match Box::pin(write_burst(writer, first, outbound, metrics)).await {
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
                    "more than {capacity} messages or {capacity_bytes} bytes queued to this \
                     connection and not read: read faster (limits.outbound_queue, \
                     limits.outbound_queue_bytes)"
                ),
            ))
        }
        _ = shutdown.changed() => Some(ringmaster_proto::Error::new(
            ErrorCode::ShuttingDown,
            "master is shutting down",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ringmaster_auth_failures_total{reason="<reason>"}` in the metrics text (0 if absent).
    fn auth_failures(metrics: &Metrics, reason: &str) -> u64 {
        let series = format!("ringmaster_auth_failures_total{{reason=\"{reason}\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|line| {
                line.strip_prefix(&series)
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0)
    }

    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// Runs one connection's handshake (`open`) against a client over an in-memory stream;
    /// `client` plays the peer. Returns what the handshake opened with.
    async fn handshake_with<F, Fut>(
        yaml: &str,
        metrics: &Arc<Metrics>,
        client: F,
    ) -> Option<(Message, Option<String>)>
    where
        F: FnOnce(Connection<tokio::io::DuplexStream>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let config = Config::from_yaml(yaml, "test.yaml").unwrap();
        let (near, far) = tokio::io::duplex(64 * 1024);
        let budget = FrameBudget::for_config(&config);
        let max_frame = config.master.max_frame_bytes;
        let handshake_max = config.limits.max_handshake_frame_bytes;
        let mut server =
            Connection::with_max_frame(budget.guard(far, handshake_max), handshake_max);
        let (_stop, stopping) = watch::channel(false);
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let server = open(
            &mut server,
            &config.auth,
            false,
            max_frame,
            metrics,
            peer,
            stopping,
        );
        let (opened, ()) = tokio::time::timeout(WAIT, async {
            tokio::join!(server, client(Connection::new(near)))
        })
        .await
        .expect("the handshake ends");
        opened
    }

    async fn say_hello(
        conn: &mut Connection<tokio::io::DuplexStream>,
    ) -> ringmaster_proto::HelloAck {
        conn.send(Message::Hello(ringmaster_proto::Hello {
            protocol_version: ringmaster_proto::PROTOCOL_VERSION,
            client: "test".into(),
        }))
        .await
        .unwrap();
        match conn.recv().await {
            Ok(Some(Message::HelloAck(ack))) => ack,
            other => panic!("expected HelloAck, got {other:?}"),
        }
    }

    const AUTH_REQUIRED: &str = "auth:
  required: true
  principals:
    rack: { secret: rack-secret, roles: [agent] }
";

    /// Issue 45: a client that says Hello, learns authentication is required and closes counts
    /// as `missing`, once; one that then sends an unauthenticated Subscribe is counted once too.
    #[tokio::test]
    async fn leaving_after_learning_auth_is_required_counts_as_missing() {
        let metrics = Arc::new(Metrics::new());
        let opened = handshake_with(AUTH_REQUIRED, &metrics, |mut conn| async move {
            assert!(say_hello(&mut conn).await.auth_required);
            drop(conn);
        })
        .await;
        assert!(opened.is_none());
        assert_eq!(auth_failures(&metrics, "missing"), 1);

        let opened = handshake_with(AUTH_REQUIRED, &metrics, |mut conn| async move {
            say_hello(&mut conn).await;
            conn.send(Message::Subscribe(Default::default()))
                .await
                .unwrap();
            let answer = conn.recv().await;
            assert!(
                matches!(&answer, Ok(Some(Message::Error(e)))
                    if e.code == ErrorCode::AuthenticationRequired as i32),
                "{answer:?}"
            );
            drop(conn);
        })
        .await;
        assert!(opened.is_none());
        assert_eq!(
            auth_failures(&metrics, "missing"),
            2,
            "counted once, not twice"
        );

        // A peer that proves who it is and then leaves is no failure.
        let opened = handshake_with(AUTH_REQUIRED, &metrics, |mut conn| async move {
            let ack = say_hello(&mut conn).await;
            let credential =
                ringmaster_proto::security::Credential::new("rack", b"rack-secret".to_vec())
                    .unwrap();
            conn.send(Message::Authenticate(
                credential.answer(&ack, AuthRole::Agent),
            ))
            .await
            .unwrap();
            assert!(matches!(
                conn.recv().await,
                Ok(Some(Message::Authenticated(_)))
            ));
        })
        .await;
        assert!(opened.is_none());
        assert_eq!(auth_failures(&metrics, "missing"), 2);
    }

    /// Without required authentication, leaving after Hello is no authentication failure.
    #[tokio::test]
    async fn leaving_after_hello_is_no_failure_when_auth_is_optional() {
        let metrics = Arc::new(Metrics::new());
        let opened = handshake_with("", &metrics, |mut conn| async move {
            assert!(!say_hello(&mut conn).await.auth_required);
        })
        .await;
        assert!(opened.is_none());
        assert_eq!(auth_failures(&metrics, "missing"), 0);
    }

    #[test]
    fn four_bytes_tell_http_from_the_protocol_and_tls() {
        assert_eq!(http_request_start(b"GET /state HTTP/1.1"), Some(true));
        assert_eq!(http_request_start(b"POST"), Some(true));
        assert_eq!(http_request_start(b"GE"), None);
        assert_eq!(http_request_start(b""), None);
        // A protocol frame's length prefix, TLS's ClientHello, junk.
        assert_eq!(http_request_start(&[0, 0, 0, 12]), Some(false));
        assert_eq!(http_request_start(&[0x16, 3, 1, 0]), Some(false));
        assert_eq!(http_request_start(b"GEX "), Some(false));
        assert_eq!(http_request_start(b"get "), Some(false));
    }
}
