//! A fake master for the SDK's tests: real TCP on 127.0.0.1, one scripted connection at a time,
//! and a scheduler that reports every callback on a channel so tests wait on events, not sleeps.
#![allow(dead_code)]

use std::time::Duration;

use async_trait::async_trait;
use ringmaster_proto::{Connection, HelloAck, Message, Subscribe, Subscribed, Update};
use ringmaster_sdk::{
    Driver, ErrorCode, FrameworkConfig, Offer, Scheduler, TaskInfo, TaskState, TaskStatus,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::time::timeout;

/// How long a test waits for anything before failing.
pub const PATIENCE: Duration = Duration::from_secs(5);

pub struct FakeMaster {
    listener: TcpListener,
    pub addr: String,
}

impl FakeMaster {
    pub async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        FakeMaster { listener, addr }
    }

    /// A framework config pointing here, reconnecting quickly.
    pub fn config(&self, name: &str) -> FrameworkConfig {
        let mut config = FrameworkConfig::new(self.addr.clone(), name);
        config.user = "tester".into();
        config.weight = 2.0;
        config.failover_timeout = Duration::from_secs(30);
        config.reconnect_max_backoff = Duration::from_millis(200);
        config
    }

    pub async fn accept(&self) -> MasterSide {
        let (stream, _) = timeout(PATIENCE, self.listener.accept())
            .await
            .expect("the framework did not connect in time")
            .unwrap();
        MasterSide {
            connection: Connection::new(stream),
        }
    }

    /// Accepts a connection and completes Hello and Subscribe, assigning `framework_id`.
    pub async fn accept_subscribed(&self, framework_id: &str) -> (MasterSide, Subscribe) {
        let mut side = self.accept().await;
        side.handshake().await;
        let subscribe = side.expect_subscribe().await;
        side.send(Message::Subscribed(Subscribed {
            framework_id: framework_id.into(),
            heartbeat_interval_ms: 0,
        }))
        .await;
        (side, subscribe)
    }
}

/// A status update from the master for `task` on `agent` (empty `update_id`: a
/// reconciliation answer).
pub fn update(task: &str, agent: &str, state: TaskState, reason: &str, update_id: &str) -> Message {
    Message::Update(Update {
        status: Some(TaskStatus {
            task_id: task.into(),
            agent_id: agent.into(),
            state: state as i32,
            reason: reason.into(),
            update_id: update_id.into(),
            ..TaskStatus::default()
        }),
    })
}

pub struct MasterSide {
    pub connection: Connection<TcpStream>,
}

impl MasterSide {
    pub async fn recv(&mut self) -> Message {
        timeout(PATIENCE, self.connection.recv())
            .await
            .expect("no message from the framework in time")
            .unwrap()
            .expect("the framework closed the connection")
    }

    pub async fn send(&mut self, message: Message) {
        self.connection.send(message).await.unwrap();
    }

    pub async fn handshake(&mut self) {
        match self.recv().await {
            Message::Hello(hello) => {
                assert_eq!(hello.protocol_version, ringmaster_proto::PROTOCOL_VERSION);
                assert!(hello.client.contains("ringmaster-sdk"), "{}", hello.client);
            }
            other => panic!("expected Hello, got {other:?}"),
        }
        self.send(Message::HelloAck(HelloAck {
            protocol_version: ringmaster_proto::PROTOCOL_VERSION,
            master: "fake".into(),
            ..Default::default()
        }))
        .await;
    }

    pub async fn expect_subscribe(&mut self) -> Subscribe {
        match self.recv().await {
            Message::Subscribe(subscribe) => subscribe,
            other => panic!("expected Subscribe, got {other:?}"),
        }
    }

    /// Sends a Ping and expects its Pong next: proves nothing else was sent before it.
    pub async fn barrier(&mut self, nonce: u64) {
        self.send(Message::Ping(ringmaster_proto::Ping { nonce }))
            .await;
        match self.recv().await {
            Message::Pong(pong) => assert_eq!(pong.nonce, nonce),
            other => panic!("expected Pong {nonce}, got {other:?}"),
        }
    }
}

/// Every scheduler callback, as seen by the test.
#[derive(Debug)]
pub enum Event {
    Registered(String, Driver),
    Reregistered(String),
    Offers(Vec<Offer>),
    Rescinded(String),
    Status(TaskStatus),
    Error(ErrorCode, String),
    Disconnected,
}

/// Reports callbacks; optionally accepts every offer with `accept_with`, and holds status
/// callbacks until `status_gate` is notified.
pub struct RecordingScheduler {
    pub events: mpsc::UnboundedSender<Event>,
    pub accept_with: Option<Vec<TaskInfo>>,
    pub status_gate: Option<std::sync::Arc<Notify>>,
}

impl RecordingScheduler {
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (events, receiver) = mpsc::unbounded_channel();
        (
            RecordingScheduler {
                events,
                accept_with: None,
                status_gate: None,
            },
            receiver,
        )
    }
}

#[async_trait]
impl Scheduler for RecordingScheduler {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        let _ = self
            .events
            .send(Event::Registered(framework_id.into(), driver.clone()));
    }
    async fn reregistered(&mut self, _driver: &Driver, framework_id: &str) {
        let _ = self.events.send(Event::Reregistered(framework_id.into()));
    }
    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        if let Some(tasks) = &self.accept_with {
            for offer in &offers {
                driver.accept(&offer.offer_id, tasks.clone()).unwrap();
            }
        }
        let _ = self.events.send(Event::Offers(offers));
    }
    async fn offer_rescinded(&mut self, _driver: &Driver, offer_id: &str) {
        let _ = self.events.send(Event::Rescinded(offer_id.into()));
    }
    async fn status_update(&mut self, _driver: &Driver, status: TaskStatus) {
        let _ = self.events.send(Event::Status(status));
        if let Some(gate) = &self.status_gate {
            gate.notified().await;
        }
    }
    async fn error(&mut self, _driver: &Driver, code: ErrorCode, message: &str) {
        let _ = self.events.send(Event::Error(code, message.into()));
    }
    async fn disconnected(&mut self, _driver: &Driver) {
        let _ = self.events.send(Event::Disconnected);
    }
}

pub async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    timeout(PATIENCE, events.recv())
        .await
        .expect("no scheduler callback in time")
        .expect("the scheduler was dropped")
}

/// Waits for `registered` and returns the id and the driver.
pub async fn registered(events: &mut mpsc::UnboundedReceiver<Event>) -> (String, Driver) {
    match next_event(events).await {
        Event::Registered(id, driver) => (id, driver),
        other => panic!("expected registered, got {other:?}"),
    }
}
