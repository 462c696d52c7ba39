//! The connection loop: reach the master, register, serve, and start over when the link drops.
//!
//! Tasks keep running while the master is unreachable; their exits are recorded and their
//! updates wait in the status queue until the next registration. Only what retrying cannot fix
//! ends the loop with an error: a protocol version mismatch, a refused credential or
//! permission, and `AGENT_REFUSED` (the master will not take an agent this large,
//! `master.max_agent_resources`).
//!
//! With several masters (`--master a,b,c`) a failed attempt moves on to the next one at once,
//! and `Error{NOT_LEADER}` (during the handshake or later) straight to the leader it names
//! ([`MasterRotation`]); the backoff is waited only after a full pass without success, and
//! after a lost registered connection. The agent's state is kept across the switch exactly as
//! across a reconnect.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use ringmaster_proto::masters::MasterRotation;
use ringmaster_proto::security::AuthRole;
use ringmaster_proto::transport::BoxedStream;
use ringmaster_proto::{
    Connection, ConnectionError, ErrorCode, Hello, Message, Pong, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::state::{AgentState, ExitReceiver, HealthReceiver};
use crate::updates::STATUS_RETRY;
use crate::work_files::AGENT_ID_FILE;

/// First wait before reconnecting; it doubles up to the configured cap.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait for the TCP connection, the `HelloAck` and the `AgentRegistered`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Heartbeat interval when the master's `AgentRegistered` leaves it at 0.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// Extra time, beyond the kill grace, that shutdown waits for killed groups to be gone.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);
/// How often due status updates are looked for.
const RETRY_CHECK: Duration = Duration::from_millis(250);
/// How often ended sandboxes are looked at for collection ([`crate::gc`]).
const GC_CHECK: Duration = Duration::from_secs(10);

type MasterConnection = Connection<BoxedStream>;

/// Why a connection attempt or a served connection ended.
enum Ended {
    /// The shutdown future completed (with the connection, if one was open).
    Shutdown(Option<MasterConnection>),
    /// Worth another try after the backoff.
    Retry(anyhow::Error),
    /// The master is not the leader (`Error{NOT_LEADER}`); `leader` is the one it names
    /// (empty when it knows none).
    NotLeader { leader: String, message: String },
    /// Trying again cannot help.
    Fatal(anyhow::Error),
}

/// Runs the agent until `shutdown` completes; see the crate docs for the protocol.
pub async fn run_sessions<F: Future<Output = ()>>(
    mut state: AgentState,
    mut exits: ExitReceiver,
    mut shutdown: Pin<&mut F>,
) -> anyhow::Result<()> {
    let mut backoff = INITIAL_BACKOFF;
    // A master answered "not the leader" during this pass (the group is electing one), and
    // since when the group has been without a leader for this agent.
    let mut electing = false;
    let mut no_leader_since: Option<Instant> = None;
    let mut attempt: u64 = 0;
    let mut masters = MasterRotation::parse(&state.config().master)
        .map_err(|e| anyhow!("--master `{}`: {e}", state.config().master))?;
    // Health changes of tasks with a health check (crate::health); a closed channel when
    // taken before, which disables the select arms below.
    let mut health = state
        .take_health_events()
        .unwrap_or_else(|| tokio::sync::mpsc::unbounded_channel().1);
    loop {
        attempt += 1;
        let master = masters.current().to_string();
        let mut registered = false;
        let ended = tokio::select! {
            _ = shutdown.as_mut() => Ended::Shutdown(None),
            r = establish(&state, &master) => match r {
                Ok((conn, assigned_id, heartbeat)) => {
                    let previous = state.agent_id().to_string();
                    if !previous.is_empty() && previous != assigned_id {
                        tracing::warn!(requested = %previous, assigned = %assigned_id,
                            "master assigned a different agent id");
                    }
                    state.set_agent_id(assigned_id.clone());
                    save_agent_id(&state);
                    tracing::info!(agent_id = %assigned_id, master = %master,
                        heartbeat_ms = heartbeat.as_millis() as u64,
                        running = state.running_processes(), unacknowledged = state.unacknowledged(),
                        "registered with the master");
                    backoff = INITIAL_BACKOFF;
                    no_leader_since = None;
                    attempt = 0;
                    masters.succeeded();
                    registered = true;
                    serve(conn, &mut state, &mut exits, &mut health, heartbeat, &mut shutdown).await
                }
                Err(ended) => ended,
            },
        };
        match ended {
            Ended::Shutdown(conn) => return shut_down(state, exits, conn).await,
            Ended::Fatal(error) => {
                tracing::error!("giving up: {error:#}");
                state.kill_all_for_shutdown();
                let _ = drain_exits(&mut state, &mut exits).await;
                return Err(error);
            }
            Ended::Retry(error) if registered => {
                // The registered connection was lost: the same master first, after the backoff.
                state.connection_lost();
                tracing::warn!(retry_in_ms = backoff.as_millis() as u64, master = %master,
                    "connection to the master lost: {error:#}");
            }
            Ended::Retry(error) => {
                state.connection_lost();
                let pass_over = masters.failed();
                if !pass_over {
                    tracing::warn!(attempt, master = %master, next = %masters.current(),
                        "master unreachable: {error:#}; trying the next one");
                    continue;
                }
                tracing::warn!(attempt, retry_in_ms = backoff.as_millis() as u64,
                    master = %master, "master unreachable: {error:#}");
            }
            Ended::NotLeader { leader, message } => {
                state.connection_lost();
                let pass_over = masters.not_leader(&leader);
                // A follower answered: the group is there, its leader is being elected (or a
                // dead one is still named).
                electing = true;
                tracing::info!(master = %master, leader = %leader, next = %masters.current(),
                    "the master is not the leader: {message}");
                if !pass_over {
                    continue;
                }
                tracing::warn!(
                    attempt,
                    retry_in_ms = backoff.as_millis() as u64,
                    "no master of {} is the leader yet",
                    masters.list().join(",")
                );
            }
        }
        // While the group elects a leader, ask again soon (for a while); else wait out the
        // backoff, still recording task exits.
        let fast = electing
            && no_leader_since.get_or_insert_with(Instant::now).elapsed()
                < ringmaster_proto::masters::NO_LEADER_FAST_FOR;
        if !electing {
            no_leader_since = None;
        }
        let wait = match fast {
            true => backoff.min(ringmaster_proto::masters::NO_LEADER_RETRY),
            false => backoff,
        };
        electing = false;
        let wake = Instant::now() + wait;
        collect_sandboxes(&mut state);
        loop {
            tokio::select! {
                _ = shutdown.as_mut() => return shut_down(state, exits, None).await,
                _ = tokio::time::sleep_until(wake) => break,
                Some((key, outcome)) = exits.recv() => {
                    // Nobody to tell now; the updates wait in the queue.
                    let _ = state.process_exited(key, outcome);
                }
                Some((key, event)) = health.recv() => {
                    // An unhealthy task is killed even while the master is away.
                    let _ = state.health_changed(key, event);
                }
            }
        }
        if !fast {
            backoff = (backoff * 2).min(state.config().reconnect_max_backoff.max(INITIAL_BACKOFF));
        }
        tracing::debug!(master = %masters.current(), "reconnecting to the master");
    }
}

/// Connects, says Hello and registers. Returns the connection, the agent id and the heartbeat
/// interval the master chose.
async fn establish(
    state: &AgentState,
    master: &str,
) -> Result<(MasterConnection, String, Duration), Ended> {
    let security = &state.config().security;
    let stream = security
        .connect(master, HANDSHAKE_TIMEOUT)
        .await
        .map_err(|e| Ended::Retry(anyhow!("{e}")))?;
    let mut conn = Connection::new(stream);
    let retry = |e: ConnectionError| Ended::Retry(anyhow!("{e}"));
    conn.send(Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: format!("ringmaster-agent {}", env!("CARGO_PKG_VERSION")),
    }))
    .await
    .map_err(retry)?;
    match recv_handshake(&mut conn, "HelloAck").await? {
        Message::HelloAck(ack) => {
            tracing::debug!(master = %ack.master, version = ack.protocol_version, "handshake done");
            let answer = security
                .authenticate(&ack, AuthRole::Agent)
                .map_err(|e| Ended::Fatal(anyhow!("{e}")))?;
            if let Some(answer) = answer {
                let principal = answer.principal.clone();
                conn.send(Message::Authenticate(answer))
                    .await
                    .map_err(retry)?;
                match recv_handshake(&mut conn, "Authenticated").await? {
                    Message::Authenticated(_) => {
                        tracing::debug!(%principal, "authenticated with the master");
                    }
                    other => return Err(unexpected(other, "Authenticated")),
                }
            }
        }
        other => return Err(unexpected(other, "HelloAck")),
    }
    conn.send(Message::RegisterAgent(state.register_message()))
        .await
        .map_err(retry)?;
    match recv_handshake(&mut conn, "AgentRegistered").await? {
        Message::AgentRegistered(registered) => {
            if let Err(e) = crate::flag_checks::check_agent_id(&registered.agent_id) {
                return Err(Ended::Retry(anyhow!(
                    "master assigned an unusable agent id {:?}: {e}",
                    registered.agent_id
                )));
            }
            let heartbeat = match registered.heartbeat_interval_ms {
                0 => DEFAULT_HEARTBEAT,
                ms => Duration::from_millis(ms.max(10)),
            };
            Ok((conn, registered.agent_id, heartbeat))
        }
        other => Err(unexpected(other, "AgentRegistered")),
    }
}

/// Waits for the master's next handshake answer, answering pings on the way.
async fn recv_handshake(conn: &mut MasterConnection, expected: &str) -> Result<Message, Ended> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    loop {
        let received = tokio::time::timeout_at(deadline, conn.recv())
            .await
            .map_err(|_| Ended::Retry(anyhow!("no {expected} from the master in time")))?;
        match received {
            Ok(Some(Message::Ping(ping))) => {
                let _ = conn.send(Message::Pong(Pong { nonce: ping.nonce })).await;
            }
            Ok(Some(message)) => return Ok(message),
            Ok(None) => {
                return Err(Ended::Retry(anyhow!(
                    "master closed the connection before {expected}"
                )))
            }
            Err(e) => return Err(Ended::Retry(anyhow!("waiting for {expected}: {e}"))),
        }
    }
}

fn unexpected(message: Message, expected: &str) -> Ended {
    match message {
        Message::Error(error) if error.code == ErrorCode::VersionMismatch as i32 => {
            Ended::Fatal(anyhow!(
                "the master does not speak protocol version {PROTOCOL_VERSION} \
                 (it supports {:?}): {}",
                error.supported_versions,
                error.message
            ))
        }
        // A follower: the session goes on to the leader it names (or the next master).
        Message::Error(error) if error.code == ErrorCode::NotLeader as i32 => Ended::NotLeader {
            leader: error.leader,
            message: error.message,
        },
        // Credentials, permissions and the agent's own resources do not change by retrying.
        Message::Error(error)
            if matches!(
                ErrorCode::try_from(error.code),
                Ok(ErrorCode::AuthenticationRequired
                    | ErrorCode::AuthenticationFailed
                    | ErrorCode::NotAuthorized
                    | ErrorCode::TlsRequired
                    | ErrorCode::AgentRefused)
            ) =>
        {
            Ended::Fatal(anyhow!(
                "master refused us with {}: {}",
                error_code_name(error.code),
                error.message
            ))
        }
        Message::Error(error) => Ended::Retry(anyhow!(
            "master refused us with {}: {}",
            error_code_name(error.code),
            error.message
        )),
        other => Ended::Retry(anyhow!(
            "expected {expected} from the master, got {}",
            other.kind()
        )),
    }
}

fn error_code_name(code: i32) -> String {
    ErrorCode::try_from(code)
        .map(|c| c.as_str_name().to_string())
        .unwrap_or_else(|_| format!("error code {code}"))
}

/// Serves one registered connection until it fails or shutdown is asked.
async fn serve<F: Future<Output = ()>>(
    mut conn: MasterConnection,
    state: &mut AgentState,
    exits: &mut ExitReceiver,
    health: &mut HealthReceiver,
    heartbeat_every: Duration,
    shutdown: &mut Pin<&mut F>,
) -> Ended {
    let mut outbox = state.all_pending_updates();
    outbox.push(state.heartbeat());
    if let Err(e) = send_all(&mut conn, outbox).await {
        return Ended::Retry(e);
    }
    let mut heartbeat = tokio::time::interval_at(Instant::now() + heartbeat_every, heartbeat_every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval(RETRY_CHECK);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Answers to ReadFile, read on the blocking pool (crate::files) and sent from this loop.
    let (files_tx, mut files_rx) = tokio::sync::mpsc::unbounded_channel();
    // Usage samples, read on the blocking pool (crate::usage); one at a time.
    let usage_every = state.config().usage_interval;
    let mut usage_tick = tokio::time::interval_at(Instant::now() + usage_every, usage_every);
    usage_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (usage_tx, mut usage_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sampling = false;
    let mut gc = tokio::time::interval(GC_CHECK);
    gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let outbox = tokio::select! {
            _ = shutdown.as_mut() => return Ended::Shutdown(Some(conn)),
            received = conn.recv() => match received {
                Ok(Some(Message::ReadFile(request))) => {
                    read_file(state, request, &files_tx);
                    Vec::new()
                }
                Ok(Some(Message::Error(error))) if error.code == ErrorCode::NotLeader as i32 => {
                    // Deposed while serving us: the master closes the connection.
                    return Ended::NotLeader { leader: error.leader, message: error.message };
                }
                Ok(Some(message)) => handle_master_message(state, message),
                Ok(None) => return Ended::Retry(anyhow!("the master closed the connection")),
                Err(ConnectionError::UnknownMessage) => {
                    tracing::warn!("ignoring a message of a kind this agent does not know");
                    Vec::new()
                }
                Err(e) => return Ended::Retry(anyhow!("connection to the master failed: {e}")),
            },
            Some((key, outcome)) = exits.recv() => state.process_exited(key, outcome),
            Some((key, event)) = health.recv() => state.health_changed(key, event),
            _ = heartbeat.tick() => vec![state.heartbeat()],
            _ = retry.tick() => state.due_updates(STATUS_RETRY),
            Some(data) = files_rx.recv() => vec![Message::FileData(data)],
            _ = usage_tick.tick() => {
                sampling = sampling || start_usage_sample(state, &usage_tx);
                Vec::new()
            }
            Some(report) = usage_rx.recv() => {
                sampling = false;
                crate::usage::report_message(report)
            }
            _ = gc.tick() => {
                collect_sandboxes(state);
                Vec::new()
            }
        };
        if let Err(e) = send_all(&mut conn, outbox).await {
            return Ended::Retry(e);
        }
    }
}

/// Reads the window a `ReadFile` asks for off the session loop; the answer comes back on
/// `answers`. The master bounds how many reads it has outstanding (docs/protocol.md).
fn read_file(
    state: &AgentState,
    request: ringmaster_proto::ReadFile,
    answers: &tokio::sync::mpsc::UnboundedSender<ringmaster_proto::FileData>,
) {
    let work_dir = state.config().work_dir.clone();
    let answers = answers.clone();
    tokio::task::spawn_blocking(move || {
        // The session may have ended meanwhile; the master fails the read on its own then.
        let _ = answers.send(crate::files::read(&work_dir, &request));
    });
}

/// Starts sampling the agent's RUNNING tasks off the session loop
/// ([`crate::usage::spawn_sample`]); `false` when there is none (nothing started, nothing will
/// arrive on `reports`).
fn start_usage_sample(
    state: &AgentState,
    reports: &tokio::sync::mpsc::UnboundedSender<ringmaster_proto::UsageReport>,
) -> bool {
    let targets = state.usage_targets();
    if targets.is_empty() {
        return false;
    }
    crate::usage::spawn_sample(state.isolation().clone(), targets, reports.clone());
    true
}

/// Removes the ended sandboxes that are due ([`crate::gc`]) off the session loop.
fn collect_sandboxes(state: &mut AgentState) {
    let due = state.sandboxes_to_collect(crate::updates::unix_ms());
    if due.is_empty() {
        return;
    }
    tokio::task::spawn_blocking(move || {
        for entry in &due {
            if let Err(e) = crate::gc::remove(entry) {
                tracing::warn!("cannot collect a sandbox: {e}");
            }
        }
    });
}

/// What one message from the master asks of the agent, as messages to send back.
fn handle_master_message(state: &mut AgentState, message: Message) -> Vec<Message> {
    match message {
        Message::Ping(ping) => vec![Message::Pong(Pong { nonce: ping.nonce })],
        Message::Pong(_) => Vec::new(),
        Message::RunTasks(run) => state.run_tasks(run),
        Message::KillTask(kill) => state.kill_task(kill),
        Message::StatusAck(ack) => {
            let waiting = state.sandboxes_waiting();
            state.acknowledged(&ack.update_id);
            if state.sandboxes_waiting() > waiting {
                // A run just ended for good: collected now if due (a zero delay, a full disk).
                collect_sandboxes(state);
            }
            Vec::new()
        }
        Message::Error(error) => {
            tracing::warn!(code = %error_code_name(error.code), "master reported an error: {}",
                error.message);
            Vec::new()
        }
        other => {
            tracing::warn!(
                kind = other.kind(),
                "unexpected message from the master; ignored"
            );
            Vec::new()
        }
    }
}

async fn send_all(conn: &mut MasterConnection, messages: Vec<Message>) -> anyhow::Result<()> {
    if messages.is_empty() {
        return Ok(());
    }
    for message in messages {
        conn.feed(message)
            .await
            .context("sending to the master failed")?;
    }
    conn.flush().await.context("sending to the master failed")
}

/// Kills every task, reports the KILLED updates if a connection is open, and returns.
async fn shut_down(
    mut state: AgentState,
    mut exits: ExitReceiver,
    conn: Option<MasterConnection>,
) -> anyhow::Result<()> {
    let killing = state.kill_all_for_shutdown();
    tracing::info!(tasks = killing, "shutting down");
    let outbox = drain_exits(&mut state, &mut exits).await;
    if let Some(mut conn) = conn {
        let mut messages = state.all_pending_updates();
        if !outbox.is_empty() {
            messages.push(state.heartbeat());
        }
        if let Err(e) = send_all(&mut conn, messages).await {
            tracing::warn!("could not report the final updates: {e:#}");
        }
    }
    Ok(())
}

/// Waits (bounded) until every killed task's group is gone, recording the exits.
async fn drain_exits(state: &mut AgentState, exits: &mut ExitReceiver) -> Vec<Message> {
    let deadline = Instant::now() + state.config().kill_grace + SHUTDOWN_SLACK;
    let mut out = Vec::new();
    while state.running_processes() > 0 {
        match tokio::time::timeout_at(deadline, exits.recv()).await {
            Ok(Some((key, outcome))) => out.extend(state.process_exited(key, outcome)),
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    tasks = state.running_processes(),
                    "tasks still running after the kill grace; leaving them"
                );
                break;
            }
        }
    }
    out
}

fn save_agent_id(state: &AgentState) {
    let path = state.config().work_dir.join(AGENT_ID_FILE);
    if let Err(e) = ringmaster_proto::files::write_private(&path, format!("{}\n", state.agent_id()))
    {
        tracing::warn!(path = %path.display(), "cannot save the agent id: {e}");
    }
}
