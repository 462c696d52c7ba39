//! A synchronous test harness for the master's state machine, after Nomad's scheduler
//! `Harness`: one [`MasterState`] driven by hand, a fake clock, fake connections whose
//! outbound queues are drained synchronously, and helpers to assert on the exact messages
//! each connection received.
//!
//! No tokio runtime is needed: the state only reads time through the `now` it is given, the
//! outbound queues are unbounded tokio channels whose `try_recv` works without a runtime, and
//! nothing in the state spawns or awaits. The registry (durability) is off, so every message
//! is delivered at once, as in a master started without `--work-dir`.
//!
//! Ids are deterministic: the id mint runs under epoch 0 (`0-A1`, `0-F2`, `0-O3`, updates
//! `0-U1`), and status timestamps are [`Harness::UNIX_MS_AT_START`] plus the fake time elapsed.
//!
//! ```ignore
//! let mut h = Harness::new();
//! let agent = h.agent("a1", "cpus:4;mem:1024");
//! let fw = h.framework("web");
//! h.demand(&fw, "cpus:1;mem:128", 1);
//! h.settle();
//! let offers = h.expect_offers(&fw);
//! ```

use ringmaster_proto::convert::ResourcesWire;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    Accept, AgentRegistered, Decline, Demand, Error as ProtoError, ErrorCode, Message, Offer,
    RegisterAgent, StatusAck, StatusUpdate, Subscribe, Subscribed, TaskInfo, TaskState, TaskStatus,
    Update,
};
use tokio::time::{Duration, Instant};

use super::events::{ConnId, Event, Outbound};
use super::ids::IdMint;
use super::metrics::Metrics;
use super::server::limits::{outbound_queue, OutboundReceiver};
use super::state::MasterState;
use super::Snapshot;
use crate::config::Config;

/// What a fake connection received: a message, or the error it was closed with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Out {
    Msg(Message),
    Close(ProtoError),
}

/// A framework the harness subscribed: its connection and id.
#[derive(Clone, Debug)]
pub(crate) struct Fw {
    pub conn: ConnId,
    pub id: String,
}

struct FakeConn {
    rx: OutboundReceiver,
    /// Everything received, in order.
    log: Vec<Out>,
    /// How much of `log` [`Harness::sent`] has already returned.
    seen: usize,
}

/// The harness: a master state, a fake clock and fake connections.
pub(crate) struct Harness {
    pub state: MasterState,
    base: Instant,
    now: Instant,
    next_conn: ConnId,
    conns: BTreeMap<ConnId, FakeConn>,
    /// The next instant [`Harness::run_for`] fires a tick at (the actor's interval timer).
    next_tick: Instant,
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Harness {
    /// The unix milliseconds status timestamps count from.
    pub const UNIX_MS_AT_START: u64 = 1_700_000_000_000;

    /// A master with the default configuration.
    pub fn new() -> Self {
        Harness::with_config(Config::default())
    }

    /// A master with the default configuration, changed by `change`.
    pub fn configured(change: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        change(&mut config);
        Harness::with_config(config)
    }

    /// A master with the configuration a YAML file would give.
    pub fn from_yaml(yaml: &str) -> Self {
        Harness::with_config(Config::from_yaml(yaml, "harness.yaml").expect("valid config"))
    }

    pub fn with_config(config: Config) -> Self {
        let base = Instant::now();
        let mut state = MasterState::new(Arc::new(config), Arc::new(Metrics::new()), base);
        state.ids = IdMint::with_epoch(0);
        state.started_unix_ms = Self::UNIX_MS_AT_START;
        let next_tick = base + state.tick_interval();
        Harness {
            state,
            base,
            now: base,
            next_conn: 1,
            conns: BTreeMap::new(),
            next_tick,
        }
    }

    pub fn config(&self) -> &Config {
        &self.state.config
    }

    // ------------------------------------------------------------------ the clock

    /// The fake clock's current instant.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Keeps agent `agent` for framework `framework` (ids) until `until`, as a preemption does.
    pub fn hold(&mut self, agent: &str, framework: &str, until: Instant) {
        let agent = self.state.agents[agent].key.expect("an admitted agent");
        let framework = self.state.frameworks[framework].key;
        self.state.alloc.hold_agent(agent, framework, until);
    }

    /// The framework (id) agent `agent` is kept for now, if any.
    pub fn held_for(&self, agent: &str) -> Option<String> {
        let key = self.state.agents[agent].key?;
        let hold = self.state.alloc.holds().on(key, self.now)?;
        self.state
            .alloc
            .framework_id(hold.framework)
            .map(str::to_string)
    }

    /// Time elapsed on the fake clock since the harness started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }

    /// The `timestamp_ms` a status made now carries.
    pub fn unix_ms(&self) -> u64 {
        Self::UNIX_MS_AT_START + self.elapsed().as_millis() as u64
    }

    /// Moves the clock forward; nothing runs.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Moves the clock forward, then runs the timers once (one actor tick) at the new instant.
    pub fn advance_and_tick(&mut self, by: Duration) {
        self.advance(by);
        self.tick();
    }

    /// Runs the timers (agent, offer and failover timeouts, update retries, filters) now.
    pub fn tick(&mut self) {
        self.state.tick(self.now);
        self.commit();
    }

    /// What the actor does when its ticker fires now: `ticks` (one per actor, see
    /// `liveness::PauseDetector`) first sees whether the master stalled since the last tick.
    pub fn timer_fired(&mut self, ticks: &mut super::liveness::PauseDetector) {
        self.state.timer_fired(ticks, self.now);
        self.commit();
    }

    /// With a registry attached ([`Harness::attach_registry`]): ends the actor turn as the actor
    /// does, writing its changes and then delivering its messages. Without one, nothing to do.
    fn commit(&mut self) {
        self.state.commit_turn().expect("registry commit");
    }

    /// Attaches a registry and recovers what it holds, as `serve --work-dir` does at start
    /// (ids then carry the registry's epoch, not 0).
    pub fn attach_registry(&mut self, registry: super::registry::Registry) {
        let recovered = registry.load().expect("registry load");
        self.state.recover(registry, recovered, self.now);
        self.commit();
    }

    /// Runs an allocation now, as the actor does when `allocation_due` fires.
    pub fn allocate(&mut self) {
        self.state.allocation_due = None;
        self.state.allocate(self.now);
        self.commit();
    }

    /// When an allocation is due (`None`: none is requested).
    pub fn allocation_due(&self) -> Option<Instant> {
        self.state.allocation_due
    }

    /// If an allocation is due, moves the clock to its instant (when later) and runs it;
    /// repeats while runs request more (at most a few times). Returns how many ran.
    pub fn settle(&mut self) -> usize {
        let mut runs = 0;
        while let Some(due) = self.state.allocation_due {
            assert!(runs < 8, "allocation keeps requesting itself");
            if due > self.now {
                self.now = due;
            }
            self.allocate();
            runs += 1;
        }
        runs
    }

    /// Plays the actor loop for `span` of fake time: its interval ticks (every
    /// `tick_interval` from the start) and due allocation runs, in time order (a tick first
    /// when both fall on one instant). The clock ends at `now + span`.
    pub fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        let every = self.state.tick_interval();
        loop {
            let alloc = self.state.allocation_due.filter(|due| *due <= end);
            let tick = Some(self.next_tick).filter(|t| *t <= end);
            match (tick, alloc) {
                (Some(t), a) if a.is_none_or(|a| t <= a) => {
                    self.now = self.now.max(t);
                    self.next_tick = t + every;
                    self.tick();
                }
                (_, Some(a)) => {
                    self.now = self.now.max(a);
                    self.allocate();
                }
                (None, None) => break,
                (Some(_), None) => unreachable!("handled by the first arm"),
            }
        }
        self.now = end;
        // Ticks the loop would have fired already, had we been running since an `advance`.
        while self.next_tick <= self.now {
            self.next_tick += every;
        }
    }

    // ------------------------------------------------------------------ connections

    /// Opens a fake connection whose first message is `first` (anonymous principal).
    pub fn connect(&mut self, first: Message) -> ConnId {
        self.connect_as(first, None)
    }

    /// Opens a fake connection authenticated as `principal`.
    pub fn connect_as(&mut self, first: Message, principal: Option<&str>) -> ConnId {
        let conn = self.next_conn;
        self.next_conn += 1;
        let (outbound, rx) = outbound_queue(
            self.state.config.limits.outbound_queue,
            self.state.config.limits.outbound_queue_bytes,
        );
        self.conns.insert(
            conn,
            FakeConn {
                rx,
                log: Vec::new(),
                seen: 0,
            },
        );
        let peer = SocketAddr::from(([127, 0, 0, 1], 40_000 + conn as u16));
        self.state.handle(
            Event::Opened {
                conn,
                peer,
                outbound,
                first,
                principal: principal.map(str::to_string),
            },
            self.now,
        );
        self.commit();
        conn
    }

    /// Sends `message` on an open connection.
    pub fn send(&mut self, conn: ConnId, message: Message) {
        self.state
            .handle(Event::Inbound { conn, message }, self.now);
        self.commit();
    }

    /// Asks, as `GET /files/read` does, for a window of a task's output; the answer arrives on
    /// the receiver (at once when the master can tell without the agent).
    pub fn read_file(
        &mut self,
        framework_id: &str,
        task_id: &str,
        file: ringmaster_proto::FileKind,
        offset: u64,
        length: u32,
    ) -> tokio::sync::oneshot::Receiver<super::files::FileReadResult> {
        self.read_file_as(framework_id, task_id, file, offset, length, None)
    }

    /// [`Harness::read_file`] by a principal who may read only its own frameworks' tasks
    /// (`owner`), as `GET /files/read` asks for a non-operator.
    pub fn read_file_as(
        &mut self,
        framework_id: &str,
        task_id: &str,
        file: ringmaster_proto::FileKind,
        offset: u64,
        length: u32,
        owner: Option<&str>,
    ) -> tokio::sync::oneshot::Receiver<super::files::FileReadResult> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = super::files::FileRequest {
            framework_id: framework_id.to_string(),
            task_id: task_id.to_string(),
            owner: owner.map(str::to_string),
            file,
            offset,
            length,
        };
        self.state
            .handle(Event::ReadFile { request, reply }, self.now);
        self.commit();
        answer
    }

    /// The connection ends (peer closed, error or the master closed it).
    pub fn disconnect(&mut self, conn: ConnId) {
        self.state.handle(Event::Closed { conn }, self.now);
        self.commit();
    }

    /// Registers an agent (id `id`, hostname `id`, total `resources`) on a new connection,
    /// checks the `AgentRegistered` answer and returns the connection.
    pub fn agent(&mut self, id: &str, resources: &str) -> ConnId {
        self.agent_with(register(id, resources))
    }

    /// Registers an agent with a full `RegisterAgent`; checks and consumes `AgentRegistered`.
    pub fn agent_with(&mut self, register: RegisterAgent) -> ConnId {
        let id = register.agent_id.clone();
        let conn = self.connect(Message::RegisterAgent(register));
        match self.sent(conn).first() {
            Some(Out::Msg(Message::AgentRegistered(AgentRegistered { agent_id, .. })))
                if id.is_empty() || *agent_id == id => {}
            other => panic!("agent {id} not registered: {other:?}"),
        }
        conn
    }

    /// Subscribes a new framework named `name` (user `name`, failover timeout 60 s).
    pub fn framework(&mut self, name: &str) -> Fw {
        self.framework_with(subscribe(name))
    }

    /// Subscribes with a full `Subscribe`; checks and consumes `Subscribed`.
    pub fn framework_with(&mut self, subscribe: Subscribe) -> Fw {
        self.framework_as(subscribe, None)
    }

    /// Subscribes on a connection authenticated as `principal` (`None`: anonymous); checks
    /// and consumes `Subscribed`. The handshake's own checks (the principal's roles and
    /// users) are the connection task's, not modelled here.
    pub fn framework_as(&mut self, subscribe: Subscribe, principal: Option<&str>) -> Fw {
        let conn = self.connect_as(Message::Subscribe(subscribe), principal);
        match self.sent(conn).as_slice() {
            [Out::Msg(Message::Subscribed(Subscribed { framework_id, .. }))] => Fw {
                conn,
                id: framework_id.clone(),
            },
            other => panic!("not subscribed: {other:?}"),
        }
    }

    // ------------------------------------------------------------------ conversations

    pub fn demand(&mut self, fw: &Fw, resources: &str, count: u32) {
        self.send(
            fw.conn,
            Message::Demand(Demand {
                resources: Some(res(resources).to_wire()),
                count,
            }),
        );
    }

    pub fn accept(&mut self, fw: &Fw, offer_id: &str, tasks: Vec<TaskInfo>) {
        self.send(
            fw.conn,
            Message::Accept(Accept {
                offer_id: offer_id.to_string(),
                tasks,
            }),
        );
    }

    pub fn decline(&mut self, fw: &Fw, offer_id: &str, refuse_seconds: f64) {
        self.send(
            fw.conn,
            Message::Decline(Decline {
                offer_ids: vec![offer_id.to_string()],
                refuse_seconds,
            }),
        );
    }

    /// Demands `resources` once, lets the allocation run and returns the single offer made.
    pub fn offer_for(&mut self, fw: &Fw, resources: &str) -> Offer {
        self.demand(fw, resources, 1);
        self.settle();
        let mut offers = self.expect_offers(fw);
        assert_eq!(offers.len(), 1, "one offer expected: {offers:?}");
        offers.remove(0)
    }

    /// Gets an offer and launches one task `task_id` of `resources` on it; consumes the
    /// framework's STAGING update (acknowledging it) and the agent's `RunTasks`. Returns the
    /// agent id it runs on.
    pub fn launch(&mut self, fw: &Fw, task_id: &str, resources: &str) -> String {
        let offer = self.offer_for(fw, resources);
        self.demand(fw, resources, 0);
        self.accept(fw, &offer.offer_id, vec![task(task_id, resources)]);
        let update = self.expect_update(fw);
        assert_eq!(update.state(), TaskState::TaskStaging, "{update:?}");
        self.ack(fw, &update);
        let agent_conn = self
            .state
            .agents
            .get(&offer.agent_id)
            .and_then(|a| a.conn)
            .expect("agent connected");
        match self.sent(agent_conn).as_slice() {
            [Out::Msg(Message::RunTasks(run))] if run.tasks.len() == 1 => {}
            other => panic!("RunTasks expected: {other:?}"),
        }
        offer.agent_id
    }

    /// The agent on `conn` reports a task state (with an update id); returns that update id.
    /// The agent's `StatusAck` is left to be read.
    pub fn status(&mut self, agent: ConnId, fw: &Fw, task_id: &str, state: TaskState) -> String {
        let update_id = format!("agent-update-{}-{}", task_id, state.short_name());
        self.send(
            agent,
            Message::StatusUpdate(StatusUpdate {
                status: Some(TaskStatus {
                    task_id: task_id.to_string(),
                    framework_id: fw.id.clone(),
                    state: state as i32,
                    update_id: update_id.clone(),
                    ..Default::default()
                }),
            }),
        );
        update_id
    }

    /// The framework acknowledges an update it received.
    pub fn ack(&mut self, fw: &Fw, status: &TaskStatus) {
        self.send(
            fw.conn,
            Message::StatusAck(StatusAck {
                task_id: status.task_id.clone(),
                update_id: status.update_id.clone(),
            }),
        );
    }

    // ------------------------------------------------------------------ what was sent

    fn drain(&mut self, conn: ConnId) -> &mut FakeConn {
        let c = self
            .conns
            .get_mut(&conn)
            .unwrap_or_else(|| panic!("no connection {conn}"));
        while let Some(out) = c.rx.try_recv() {
            c.log.push(match out {
                Outbound::Send(m) => Out::Msg(m),
                Outbound::Close(e) => Out::Close(e),
            });
        }
        c
    }

    /// What `conn` received since the last call, in order.
    pub fn sent(&mut self, conn: ConnId) -> Vec<Out> {
        let c = self.drain(conn);
        let new = c.log[c.seen..].to_vec();
        c.seen = c.log.len();
        new
    }

    /// Everything `conn` ever received.
    pub fn history(&mut self, conn: ConnId) -> Vec<Out> {
        self.drain(conn).log.clone()
    }

    /// What `conn` received since the last call, all of which must be messages.
    pub fn messages(&mut self, conn: ConnId) -> Vec<Message> {
        self.sent(conn)
            .into_iter()
            .map(|out| match out {
                Out::Msg(m) => m,
                Out::Close(e) => panic!("connection {conn} was closed: {e:?}"),
            })
            .collect()
    }

    /// Exactly one new message on `conn`.
    pub fn expect_one(&mut self, conn: ConnId) -> Message {
        let mut messages = self.messages(conn);
        assert_eq!(messages.len(), 1, "one message expected: {messages:?}");
        messages.remove(0)
    }

    /// Nothing new on `conn`.
    pub fn expect_nothing(&mut self, conn: ConnId) {
        let sent = self.sent(conn);
        assert!(sent.is_empty(), "nothing expected on {conn}: {sent:?}");
    }

    /// Exactly one new `Offers` message to the framework; its offers.
    pub fn expect_offers(&mut self, fw: &Fw) -> Vec<Offer> {
        match self.expect_one(fw.conn) {
            Message::Offers(offers) => offers.offers,
            other => panic!("Offers expected: {other:?}"),
        }
    }

    /// Exactly one new `Update` to the framework; its status.
    pub fn expect_update(&mut self, fw: &Fw) -> TaskStatus {
        match self.expect_one(fw.conn) {
            Message::Update(Update { status: Some(s) }) => s,
            other => panic!("Update expected: {other:?}"),
        }
    }

    /// Every new message to the framework, all `Update`s; their statuses.
    pub fn expect_updates(&mut self, fw: &Fw) -> Vec<TaskStatus> {
        self.messages(fw.conn)
            .into_iter()
            .map(|m| match m {
                Message::Update(Update { status: Some(s) }) => s,
                other => panic!("Update expected: {other:?}"),
            })
            .collect()
    }

    /// Exactly one new `Error` (the connection stays open); the error.
    pub fn expect_error(&mut self, conn: ConnId) -> ProtoError {
        match self.expect_one(conn) {
            Message::Error(e) => e,
            other => panic!("Error expected: {other:?}"),
        }
    }

    /// The connection's new output ends with a close; the error it was closed with.
    pub fn expect_closed(&mut self, conn: ConnId) -> ProtoError {
        match self.sent(conn).pop() {
            Some(Out::Close(e)) => e,
            other => panic!("close expected on {conn}: {other:?}"),
        }
    }

    /// The state as `GET /state` would show it now.
    pub fn snapshot(&self) -> Snapshot {
        self.state.snapshot(self.now)
    }

    /// The resources bundle a task's record holds (shared with its framework's other tasks of
    /// the same resources).
    pub fn task_resources(&self, fw: &Fw, task_id: &str) -> Option<std::sync::Arc<Resources>> {
        self.state
            .tasks
            .get(&crate::master::state::make_task_key(&fw.id, task_id))
            .map(|t| std::sync::Arc::clone(&t.resources))
    }

    /// The state of a task the master knows.
    pub fn task_state(&self, fw: &Fw, task_id: &str) -> Option<TaskState> {
        self.state
            .tasks
            .get(&crate::master::state::make_task_key(&fw.id, task_id))
            .map(|t| t.state)
    }
}

// ---------------------------------------------------------------------- builders

/// Parses resources in the Mesos text syntax (`cpus:4;mem:1024`).
pub(crate) fn res(text: &str) -> Resources {
    Resources::parse(text).unwrap_or_else(|e| panic!("bad resources {text:?}: {e}"))
}

/// A `RegisterAgent` with id and hostname `id`.
pub(crate) fn register(id: &str, resources: &str) -> RegisterAgent {
    RegisterAgent {
        agent_id: id.to_string(),
        hostname: id.to_string(),
        total: Some(res(resources).to_wire()),
        ..Default::default()
    }
}

/// A `Subscribe` named and run as user `name`, weight 1, failover timeout 60 s.
pub(crate) fn subscribe(name: &str) -> Subscribe {
    Subscribe {
        name: name.to_string(),
        user: name.to_string(),
        failover_timeout_secs: 60.0,
        ..Default::default()
    }
}

/// A task running `true` with the given resources.
pub(crate) fn task(id: &str, resources: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.to_string(),
        name: id.to_string(),
        command: "true".to_string(),
        resources: Some(res(resources).to_wire()),
        ..Default::default()
    }
}

/// An error with a code and message, as the master sends it.
pub(crate) fn error(code: ErrorCode, message: &str) -> ProtoError {
    ProtoError::new(code, message)
}
