//! The framework's side of the conversation with the master, across reconnects.
//!
//! [`run`] owns the TCP connection. Each attempt does the handshake (`Hello` → `HelloAck`) and
//! subscribes (`Subscribe` → `Subscribed`); once subscribed it restates the demand and suppress
//! state, flushes commands queued while disconnected, calls `registered`/`reregistered`, and then
//! serves: master messages become callbacks, driver commands become messages, in order. A lost
//! connection calls `disconnected` and starts the next attempt after an exponential backoff.
//! Only what retrying cannot fix (version mismatch, a refused subscription, a stop) ends the loop.
//!
//! With several masters (`FrameworkConfig.master` = `a:5050,b:5050,c:5050`) a failed attempt
//! moves on to the next master at once, and `Error{NOT_LEADER}` (answering the handshake or
//! closing a subscribed connection) straight to the leader it names ([`MasterRotation`]); the
//! backoff is waited after a full pass over the list without success and after a lost
//! subscribed connection. The framework id, the demand and everything queued are kept across
//! the switch exactly as across a reconnect.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringmaster_proto::masters::MasterRotation;
use ringmaster_proto::security::AuthRole;
use ringmaster_proto::transport::BoxedStream;
use ringmaster_proto::{
    Accept, Connection, Decline, Demand, Hello, Kill, Message, Ping, Pong, Reconcile, StatusAck,
    SubmitBatch, Subscribe, Subscribed, Suppress, Teardown, PROTOCOL_VERSION,
};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::time::{sleep_until, timeout};
use tracing::{debug, info, warn};

use crate::acks::{AckedUpdates, DEFAULT_ACK_MEMORY};
use crate::backoff::Backoff;
use crate::driver::Command;
use crate::{
    Driver, ErrorCode, FrameworkConfig, ProtoError, Scheduler, SdkError, TaskInfo, TaskState,
    TaskStatus,
};

/// How long a TCP connect may take before the attempt counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the master may take to answer `Hello` or `Subscribe`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// With heartbeats on, the connection is declared dead after this many silent intervals.
const MISSED_HEARTBEATS: u32 = 3;
/// The reason on the `TASK_LOST` the SDK reports itself for the tasks of an accept it could not
/// send (disconnected, or the offer is no longer outstanding).
pub const LAUNCH_DROPPED: &str = "launch_dropped";

/// Runs a framework until [`Driver::stop`] (→ `Ok(scheduler)`) or an error retrying cannot fix.
///
/// Connection losses are handled inside: the scheduler sees `disconnected`, then
/// `reregistered` once the SDK has re-subscribed with the same framework id.
pub async fn run<S: Scheduler>(config: FrameworkConfig, mut scheduler: S) -> Result<S, SdkError> {
    config.validate()?;
    let (sender, commands) = mpsc::unbounded_channel();
    let framework_id = Arc::new(Mutex::new(config.framework_id.clone()));
    let driver = Driver::new(sender, framework_id);
    let mut session = Session {
        config,
        driver,
        commands,
        demand: None,
        suppressed: false,
        revive_pending: false,
        queued: VecDeque::new(),
        acked: AckedUpdates::new(DEFAULT_ACK_MEMORY),
        offers: HashSet::new(),
        subscribed_once: false,
    };
    session.run_loop(&mut scheduler).await?;
    Ok(scheduler)
}

/// Why serving one connection ended.
enum Ended {
    /// `stop()` was called and `Teardown` sent (or could not be).
    Stopped,
    /// The connection is gone; reconnect.
    Lost(String),
    /// The master was deposed (`Error{NOT_LEADER}`); go to `leader` (empty: unknown).
    NotLeader { leader: String, reason: String },
}

/// Why one connection attempt failed.
enum AttemptError {
    /// Worth retrying after the backoff.
    Transient(String),
    /// Retrying cannot help.
    Fatal(SdkError),
    /// The master is not the leader; `leader` is the one it names (empty: unknown).
    NotLeader { leader: String, reason: String },
}

type MasterConnection = Connection<BoxedStream>;

struct Session {
    config: FrameworkConfig,
    driver: Driver,
    commands: UnboundedReceiver<Command>,
    /// The last demand stated, restated after each reconnect.
    demand: Option<Demand>,
    suppressed: bool,
    /// A revive asked for while disconnected, sent after the reconnect.
    revive_pending: bool,
    /// Kills and reconciliations asked for while disconnected.
    queued: VecDeque<Command>,
    acked: AckedUpdates,
    /// Offers outstanding on the current connection.
    offers: HashSet<String>,
    subscribed_once: bool,
}

impl Session {
    async fn run_loop<S: Scheduler>(&mut self, scheduler: &mut S) -> Result<(), SdkError> {
        let mut backoff = Backoff::new(self.config.reconnect_max_backoff);
        let mut unreachable_since = Instant::now();
        let mut failed_attempts = 0u32;
        let mut masters = MasterRotation::parse(&self.config.master).map_err(|e| {
            SdkError::InvalidConfig(format!("master `{}`: {e}", self.config.master))
        })?;
        // Since when the group has been without a leader for this framework, and whether a
        // master of this pass answered "not the leader" (the group is electing one, or still
        // names a dead one): then the next pass comes soon, for a while.
        let mut no_leader_since: Option<Instant> = None;
        let mut electing = false;
        loop {
            let master = masters.current().to_string();
            // Whether the backoff is waited before the next attempt.
            let mut wait = true;
            let reason = match self.attempt(&master).await {
                Ok((connection, subscribed)) => {
                    backoff.reset();
                    no_leader_since = None;
                    failed_attempts = 0;
                    masters.succeeded();
                    match self.serve(connection, subscribed, scheduler).await? {
                        Ended::Stopped => return Ok(()),
                        Ended::Lost(reason) => {
                            warn!(%master, %reason, "lost the connection to the master; reconnecting");
                            self.offers.clear();
                            scheduler.disconnected(&self.driver).await;
                            unreachable_since = Instant::now();
                            reason
                        }
                        Ended::NotLeader { leader, reason } => {
                            warn!(%master, %leader, %reason, "the master is no longer the leader; reconnecting");
                            self.offers.clear();
                            scheduler.disconnected(&self.driver).await;
                            unreachable_since = Instant::now();
                            wait = masters.not_leader(&leader);
                            electing = true;
                            reason
                        }
                    }
                }
                Err(AttemptError::Fatal(error)) => return Err(error),
                Err(AttemptError::Transient(reason)) => {
                    failed_attempts += 1;
                    wait = masters.failed();
                    if failed_attempts == 1 {
                        warn!(%master, %reason, "could not subscribe; retrying with backoff");
                    } else {
                        info!(%master, %reason, failed_attempts, "could not subscribe; will retry");
                    }
                    reason
                }
                Err(AttemptError::NotLeader { leader, reason }) => {
                    failed_attempts += 1;
                    wait = masters.not_leader(&leader);
                    electing = true;
                    info!(%master, %leader, next = %masters.current(), %reason,
                        "the master is not the leader");
                    reason
                }
            };
            if let Some(limit) = self.config.give_up_after {
                if unreachable_since.elapsed() >= limit {
                    return Err(SdkError::Connect {
                        master: self.config.master.clone(),
                        reason: format!(
                            "gave up after {limit:?} without a connection; last error: {reason}"
                        ),
                    });
                }
            }
            if !wait {
                // On to the next master (or the named leader) at once; the backoff is for a
                // full pass without success.
                continue;
            }
            let fast = electing
                && no_leader_since.get_or_insert_with(Instant::now).elapsed()
                    < ringmaster_proto::masters::NO_LEADER_FAST_FOR;
            if !electing {
                no_leader_since = None;
            }
            let delay = match fast {
                true => ringmaster_proto::masters::NO_LEADER_RETRY,
                false => backoff.next_delay(),
            };
            electing = false;
            if self.wait_offline(delay, scheduler).await {
                return Ok(());
            }
        }
    }

    /// Waits out a backoff delay while taking commands; true when `stop()` was called.
    async fn wait_offline<S: Scheduler>(&mut self, delay: Duration, scheduler: &mut S) -> bool {
        let deadline = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                _ = sleep_until(deadline) => return false,
                command = self.commands.recv() => {
                    // The session holds a sender itself, so the channel never closes.
                    let Some(command) = command else { return false };
                    if self.take_offline(command, scheduler).await {
                        return true;
                    }
                }
            }
        }
    }

    /// Handles a command while disconnected; true for `stop()`.
    async fn take_offline<S: Scheduler>(&mut self, command: Command, scheduler: &mut S) -> bool {
        match command {
            Command::Accept { offer_id, tasks } => {
                self.drop_launch(&offer_id, tasks, "the driver is disconnected", scheduler)
                    .await;
            }
            Command::Decline { offer_ids, .. } => {
                debug!(
                    ?offer_ids,
                    "decline while disconnected dropped: the offers are void"
                );
            }
            Command::Revive => {
                self.suppressed = false;
                self.revive_pending = true;
            }
            Command::Suppress => {
                self.suppressed = true;
                self.revive_pending = false;
            }
            Command::Request { demand, count } => {
                self.demand = Some(Demand {
                    resources: Some(demand.to_wire()),
                    count,
                });
            }
            command @ (Command::Kill { .. }
            | Command::Reconcile { .. }
            | Command::SubmitBatch { .. }) => {
                self.queued.push_back(command);
            }
            Command::Stop => {
                warn!("stopped while disconnected: no Teardown sent; the master removes the framework after its failover timeout");
                return true;
            }
        }
        false
    }

    /// Connects, shakes hands and subscribes.
    async fn attempt(
        &mut self,
        master: &str,
    ) -> Result<(MasterConnection, Subscribed), AttemptError> {
        let security = &self.config.security;
        let stream = security
            .connect(master, CONNECT_TIMEOUT)
            .await
            .map_err(|e| AttemptError::Transient(e.to_string()))?;
        let mut connection = Connection::new(stream);
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            client: format!(
                "ringmaster-sdk {} ({})",
                env!("CARGO_PKG_VERSION"),
                self.config.name
            ),
        };
        send_or_transient(&mut connection, Message::Hello(hello)).await?;
        match recv_handshake(&mut connection, "HelloAck").await? {
            Message::HelloAck(ack) => {
                debug!(master = %ack.master, version = ack.protocol_version, "handshake done");
                let answer = security
                    .authenticate(&ack, AuthRole::Framework)
                    .map_err(|e| AttemptError::Fatal(SdkError::Refused(e)))?;
                if let Some(answer) = answer {
                    send_or_transient(&mut connection, Message::Authenticate(answer)).await?;
                    match recv_handshake(&mut connection, "Authenticated").await? {
                        Message::Authenticated(done) => {
                            debug!(principal = %done.principal, "authenticated with the master");
                        }
                        Message::Error(error) => return Err(refusal(&error, "Authenticate")),
                        other => {
                            return Err(AttemptError::Transient(format!(
                                "expected Authenticated, got {}",
                                other.kind()
                            )))
                        }
                    }
                }
            }
            Message::Error(error) => return Err(refusal(&error, "Hello")),
            other => {
                return Err(AttemptError::Transient(format!(
                    "expected HelloAck, got {}",
                    other.kind()
                )))
            }
        }

        let subscribe = Subscribe {
            framework_id: self.driver.framework_id().unwrap_or_default(),
            name: self.config.name.clone(),
            user: self.config.user.clone(),
            weight: self.config.weight,
            failover_timeout_secs: self.config.failover_timeout.as_secs_f64(),
            partition: self.config.partition.clone(),
        };
        send_or_transient(&mut connection, Message::Subscribe(subscribe)).await?;
        loop {
            match recv_handshake(&mut connection, "Subscribed").await? {
                Message::Subscribed(subscribed) if !subscribed.framework_id.is_empty() => {
                    return Ok((connection, subscribed));
                }
                Message::Subscribed(_) => {
                    return Err(AttemptError::Transient(
                        "Subscribed carries an empty framework id".into(),
                    ))
                }
                Message::Ping(Ping { nonce }) => {
                    send_or_transient(&mut connection, Message::Pong(Pong { nonce })).await?;
                }
                Message::Error(error) => return Err(refusal(&error, "Subscribe")),
                other => {
                    return Err(AttemptError::Transient(format!(
                        "expected Subscribed, got {}",
                        other.kind()
                    )))
                }
            }
        }
    }

    /// Serves one subscribed connection until it is lost or the framework stops.
    async fn serve<S: Scheduler>(
        &mut self,
        mut connection: MasterConnection,
        subscribed: Subscribed,
        scheduler: &mut S,
    ) -> Result<Ended, SdkError> {
        let previous = self.driver.framework_id();
        let id = subscribed.framework_id;
        self.driver.set_framework_id(&id);
        let resumed = self.subscribed_once && previous.as_deref() == Some(id.as_str());
        if let Some(old) = previous.filter(|old| *old != id) {
            warn!(old = %old, new = %id, "the master assigned a new framework id; the old one expired");
        }
        info!(framework_id = %id, resumed, "subscribed");

        // Restate what the master must know before anything else happens on this connection.
        if let Err(reason) = self.restate(&mut connection, scheduler).await {
            return Ok(Ended::Lost(reason));
        }
        if resumed {
            scheduler.reregistered(&self.driver, &id).await;
        } else {
            scheduler.registered(&self.driver, &id).await;
        }
        self.subscribed_once = true;

        let heartbeat = Duration::from_millis(subscribed.heartbeat_interval_ms);
        let heartbeats_on = !heartbeat.is_zero();
        let mut ticker = tokio::time::interval(if heartbeats_on {
            heartbeat
        } else {
            Duration::from_secs(3600)
        });
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate
        let mut last_heard = Instant::now();
        let mut nonce = 0u64;

        loop {
            tokio::select! {
                received = connection.recv() => {
                    let message = match received {
                        Ok(Some(message)) => message,
                        Ok(None) => return Ok(Ended::Lost("the master closed the connection".into())),
                        Err(e) => {
                            if e.is_protocol_violation() {
                                let error = ProtoError::new(ErrorCode::BadFrame, e.to_string());
                                let _ = connection.send(Message::Error(error)).await;
                            }
                            return Ok(Ended::Lost(format!("reading from the master: {e}")));
                        }
                    };
                    last_heard = Instant::now();
                    if let Some(ended) = self.handle_message(&mut connection, message, scheduler).await? {
                        return Ok(ended);
                    }
                }
                command = self.commands.recv() => {
                    let Some(command) = command else { continue };
                    match self.take_online(&mut connection, command, scheduler).await {
                        Ok(None) => {}
                        Ok(Some(ended)) => return Ok(ended),
                        Err(reason) => return Ok(Ended::Lost(reason)),
                    }
                }
                _ = ticker.tick(), if heartbeats_on => {
                    let silent = last_heard.elapsed();
                    if silent >= heartbeat * MISSED_HEARTBEATS {
                        return Ok(Ended::Lost(format!("no message from the master for {silent:?}")));
                    }
                    nonce += 1;
                    if let Err(e) = connection.send(Message::Ping(Ping { nonce })).await {
                        return Ok(Ended::Lost(format!("sending Ping: {e}")));
                    }
                }
            }
        }
    }

    /// After a subscription: the demand, the suppress state, then the commands queued offline.
    async fn restate<S: Scheduler>(
        &mut self,
        connection: &mut MasterConnection,
        scheduler: &mut S,
    ) -> Result<(), String> {
        if let Some(demand) = &self.demand {
            send(connection, Message::Demand(demand.clone())).await?;
        }
        if self.suppressed {
            send(connection, Message::Suppress(Suppress {})).await?;
        } else if self.revive_pending {
            send(connection, Message::Revive(ringmaster_proto::Revive {})).await?;
        }
        self.revive_pending = false;
        while let Some(command) = self.queued.pop_front() {
            if let Err(reason) = self
                .take_online(connection, command.clone(), scheduler)
                .await
            {
                self.queued.push_front(command);
                return Err(reason);
            }
        }
        Ok(())
    }

    /// Handles a command while connected. `Err` is a lost connection.
    async fn take_online<S: Scheduler>(
        &mut self,
        connection: &mut MasterConnection,
        command: Command,
        scheduler: &mut S,
    ) -> Result<Option<Ended>, String> {
        match command {
            Command::Accept { offer_id, tasks } => {
                if self.offers.remove(&offer_id) {
                    send(connection, Message::Accept(Accept { offer_id, tasks })).await?;
                } else {
                    self.drop_launch(
                        &offer_id,
                        tasks,
                        "the offer is not outstanding (rescinded, already answered, or from an earlier connection)",
                        scheduler,
                    )
                    .await;
                }
            }
            Command::Decline { offer_ids, refuse } => {
                let offer_ids: Vec<String> = offer_ids
                    .into_iter()
                    .filter(|id| self.offers.remove(id))
                    .collect();
                if !offer_ids.is_empty() {
                    let decline = Decline {
                        offer_ids,
                        refuse_seconds: refuse.as_secs_f64(),
                    };
                    send(connection, Message::Decline(decline)).await?;
                }
            }
            Command::Kill { task_id } => send(connection, Message::Kill(Kill { task_id })).await?,
            Command::Revive => {
                self.suppressed = false;
                send(connection, Message::Revive(ringmaster_proto::Revive {})).await?;
            }
            Command::Suppress => {
                self.suppressed = true;
                send(connection, Message::Suppress(Suppress {})).await?;
            }
            Command::Request { demand, count } => {
                let demand = Demand {
                    resources: Some(demand.to_wire()),
                    count,
                };
                self.demand = Some(demand.clone());
                send(connection, Message::Demand(demand)).await?;
            }
            Command::Reconcile { task_ids } => {
                send(connection, Message::Reconcile(Reconcile { task_ids })).await?;
            }
            Command::SubmitBatch { batch_id, tasks } => {
                send(
                    connection,
                    Message::SubmitBatch(SubmitBatch { batch_id, tasks }),
                )
                .await?;
            }
            Command::Stop => {
                info!("stopping: tearing the framework down");
                if let Err(reason) = send(connection, Message::Teardown(Teardown {})).await {
                    warn!(%reason, "could not send Teardown; the master removes the framework after its failover timeout");
                }
                return Ok(Some(Ended::Stopped));
            }
        }
        Ok(None)
    }

    /// Dispatches one message from the master. `Ok(Some)` ends this connection.
    async fn handle_message<S: Scheduler>(
        &mut self,
        connection: &mut MasterConnection,
        message: Message,
        scheduler: &mut S,
    ) -> Result<Option<Ended>, SdkError> {
        match message {
            Message::Offers(offers) => {
                for offer in &offers.offers {
                    self.offers.insert(offer.offer_id.clone());
                }
                let (batch, plain): (Vec<_>, Vec<_>) = offers
                    .offers
                    .into_iter()
                    .partition(|o| !o.suggested.is_empty());
                if !batch.is_empty() {
                    scheduler.batch_offers(&self.driver, batch).await;
                }
                if !plain.is_empty() {
                    scheduler.offers(&self.driver, plain).await;
                }
            }
            Message::BatchResult(result) => {
                scheduler.batch_result(&self.driver, result).await;
            }
            Message::Rescind(rescind) => {
                self.offers.remove(&rescind.offer_id);
                debug!(offer_id = %rescind.offer_id, reason = %rescind.reason, "offer rescinded");
                scheduler
                    .offer_rescinded(&self.driver, &rescind.offer_id)
                    .await;
            }
            Message::Update(update) => {
                let Some(status) = update.status else {
                    warn!("Update without a status ignored");
                    return Ok(None);
                };
                let update_id = status.update_id.clone();
                let task_id = status.task_id.clone();
                let duplicate = !update_id.is_empty() && self.acked.contains(&update_id);
                if duplicate {
                    debug!(%task_id, %update_id, "resent update acknowledged again, not delivered");
                } else {
                    scheduler.status_update(&self.driver, status).await;
                }
                if !update_id.is_empty() {
                    self.acked.insert(&update_id);
                    let ack = StatusAck { task_id, update_id };
                    if let Err(reason) = send(connection, Message::StatusAck(ack)).await {
                        return Ok(Some(Ended::Lost(reason)));
                    }
                }
            }
            Message::Error(error) => {
                let code = ErrorCode::try_from(error.code).unwrap_or(ErrorCode::Unspecified);
                warn!(code = code.as_str_name(), message = %error.message, "error from the master");
                scheduler.error(&self.driver, code, &error.message).await;
                match code {
                    ErrorCode::VersionMismatch => {
                        return Err(SdkError::VersionMismatch(error.message));
                    }
                    ErrorCode::FrameworkConflict => return Err(SdkError::Refused(error.message)),
                    ErrorCode::NotLeader => {
                        return Ok(Some(Ended::NotLeader {
                            leader: error.leader,
                            reason: format!("NOT_LEADER: {}", error.message),
                        }));
                    }
                    ErrorCode::BadFrame
                    | ErrorCode::UnknownMessage
                    | ErrorCode::NotRegistered
                    | ErrorCode::UnexpectedMessage => {
                        return Ok(Some(Ended::Lost(format!(
                            "the master closed the connection with {}: {}",
                            code.as_str_name(),
                            error.message
                        ))));
                    }
                    _ => {}
                }
            }
            Message::Ping(Ping { nonce }) => {
                if let Err(reason) = send(connection, Message::Pong(Pong { nonce })).await {
                    return Ok(Some(Ended::Lost(reason)));
                }
            }
            Message::Pong(_) => {}
            other => warn!(
                kind = other.kind(),
                "unexpected message from the master ignored"
            ),
        }
        Ok(None)
    }

    /// Reports every task of an accept that was not sent as `TASK_LOST`.
    async fn drop_launch<S: Scheduler>(
        &mut self,
        offer_id: &str,
        tasks: Vec<TaskInfo>,
        why: &str,
        scheduler: &mut S,
    ) {
        warn!(%offer_id, tasks = tasks.len(), why, "accept not sent; its tasks are reported lost");
        let framework_id = self.driver.framework_id().unwrap_or_default();
        for task in tasks {
            let status = TaskStatus {
                task_id: task.task_id,
                framework_id: framework_id.clone(),
                state: TaskState::TaskLost as i32,
                reason: LAUNCH_DROPPED.to_string(),
                message: format!("accept of offer {offer_id} not sent: {why}"),
                timestamp_ms: unix_millis(),
                ..TaskStatus::default()
            };
            scheduler.status_update(&self.driver, status).await;
        }
    }
}

/// The error a handshake `Error` means for the attempt.
fn refusal(error: &ProtoError, during: &str) -> AttemptError {
    let code = ErrorCode::try_from(error.code).unwrap_or(ErrorCode::Unspecified);
    match code {
        ErrorCode::VersionMismatch => AttemptError::Fatal(SdkError::VersionMismatch(format!(
            "this SDK speaks version {PROTOCOL_VERSION}, the master speaks {:?}: {}",
            error.supported_versions, error.message
        ))),
        // A follower: on to the leader it names, or the next master. Not a refusal.
        ErrorCode::NotLeader => AttemptError::NotLeader {
            leader: error.leader.clone(),
            reason: format!("NOT_LEADER in answer to {during}: {}", error.message),
        },
        ErrorCode::FrameworkConflict
        | ErrorCode::InvalidRequest
        | ErrorCode::AuthenticationRequired
        | ErrorCode::AuthenticationFailed
        | ErrorCode::NotAuthorized
        | ErrorCode::TlsRequired => AttemptError::Fatal(SdkError::Refused(format!(
            "{} in answer to {during}: {}",
            code.as_str_name(),
            error.message
        ))),
        _ => AttemptError::Transient(format!(
            "{} in answer to {during}: {}",
            code.as_str_name(),
            error.message
        )),
    }
}

async fn send(connection: &mut MasterConnection, message: Message) -> Result<(), String> {
    let kind = message.kind();
    connection
        .send(message)
        .await
        .map_err(|e| format!("sending {kind}: {e}"))
}

async fn send_or_transient(
    connection: &mut MasterConnection,
    message: Message,
) -> Result<(), AttemptError> {
    send(connection, message)
        .await
        .map_err(AttemptError::Transient)
}

async fn recv_handshake(
    connection: &mut MasterConnection,
    expected: &str,
) -> Result<Message, AttemptError> {
    match timeout(HANDSHAKE_TIMEOUT, connection.recv()).await {
        Err(_) => Err(AttemptError::Transient(format!(
            "no {expected} within {HANDSHAKE_TIMEOUT:?}"
        ))),
        Ok(Err(e)) => Err(AttemptError::Transient(format!(
            "waiting for {expected}: {e}"
        ))),
        Ok(Ok(None)) => Err(AttemptError::Transient(format!(
            "the master closed the connection before {expected}"
        ))),
        Ok(Ok(Some(message))) => Ok(message),
    }
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
