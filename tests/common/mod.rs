//! Test helpers: an in-process master on an ephemeral loopback port, and raw protocol
//! clients that play agent or framework exactly as a test needs. Every wait has a timeout.
#![allow(dead_code)]

use ringmaster_proto::convert::ResourcesWire;
use std::time::Duration;

use ringmaster::config::Config;
use ringmaster::master::Master;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    Accept, AgentHeartbeat, Connection, Decline, Demand, Hello, Message, RegisterAgent, StatusAck,
    StatusUpdate, Subscribe, TaskInfo, TaskState, TaskStatus, PROTOCOL_VERSION,
};
use tokio::net::TcpStream;

pub const WAIT: Duration = Duration::from_secs(10);

/// Fast timers so tests finish quickly; `overrides` (lines `  key: value` of the `master:`
/// section) replace the defaults they name.
pub fn test_config(overrides: &str) -> Config {
    let mut settings: Vec<(String, String)> = [
        ("agent_timeout", "5s"),
        ("offer_timeout", "30s"),
        ("allocation_interval", "5ms"),
        ("heartbeat_interval", "100ms"),
        ("status_retry_interval", "5s"),
        ("default_refuse", "5s"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for line in overrides.lines().filter(|l| !l.trim().is_empty()) {
        let (key, value) = line.trim().split_once(':').expect("key: value");
        let (key, value) = (key.trim().to_string(), value.trim().to_string());
        match settings.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => settings.push((key, value)),
        }
    }
    let mut yaml = String::from("master:\n");
    for (k, v) in settings {
        yaml.push_str(&format!("  {k}: {v}\n"));
    }
    Config::from_yaml(&yaml, "test.yaml").expect("valid test config")
}

pub async fn start_master(config: Config) -> Master {
    Master::start("127.0.0.1:0", config)
        .await
        .expect("master starts")
}

/// A raw protocol client.
pub struct Client {
    pub conn: Connection<TcpStream>,
    pub id: String,
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let mut conn = Connection::new(stream);
        conn.send(Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "test".into(),
        }))
        .await
        .unwrap();
        match tokio::time::timeout(WAIT, conn.recv()).await {
            Ok(Ok(Some(Message::HelloAck(_)))) => {}
            other => panic!("expected HelloAck, got {other:?}"),
        }
        Client {
            conn,
            id: String::new(),
        }
    }

    pub async fn send(&mut self, message: Message) {
        self.conn.send(message).await.expect("send");
    }

    /// The next message that satisfies `want`, skipping others (heartbeat noise, etc.).
    pub async fn expect<T>(
        &mut self,
        what: &str,
        mut want: impl FnMut(&Message) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.conn.recv()).await {
                Ok(Ok(Some(message))) => {
                    if let Some(t) = want(&message) {
                        return t;
                    }
                }
                Ok(Ok(None)) => panic!("connection closed while waiting for {what}"),
                Ok(Err(e)) => panic!("connection error while waiting for {what}: {e}"),
                Err(_) => panic!("timed out waiting for {what}"),
            }
        }
    }

    /// Waits for the master to close the connection; returns the Error it sent, if any.
    pub async fn expect_closed(&mut self) -> Option<ringmaster_proto::Error> {
        let mut error = None;
        loop {
            match tokio::time::timeout(WAIT, self.conn.recv()).await {
                Ok(Ok(Some(Message::Error(e)))) => error = Some(e),
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) | Ok(Err(_)) => return error,
                Err(_) => panic!("connection not closed within {WAIT:?}"),
            }
        }
    }

    pub async fn expect_error(&mut self) -> ringmaster_proto::Error {
        self.expect("Error", |m| match m {
            Message::Error(e) => Some(e.clone()),
            _ => None,
        })
        .await
    }

    pub async fn expect_offers(&mut self) -> Vec<ringmaster_proto::Offer> {
        self.expect("Offers", |m| match m {
            Message::Offers(o) => Some(o.offers.clone()),
            _ => None,
        })
        .await
    }

    /// The next Update for `task_id`, acknowledged.
    pub async fn expect_update(&mut self, task_id: &str) -> TaskStatus {
        let status = self
            .expect(&format!("Update for {task_id}"), |m| match m {
                Message::Update(u) => u.status.clone().filter(|s| s.task_id == task_id),
                _ => None,
            })
            .await;
        self.ack(&status).await;
        status
    }

    /// Waits until `task_id` reaches `state` (acknowledging every update on the way).
    pub async fn expect_state(&mut self, task_id: &str, state: TaskState) -> TaskStatus {
        loop {
            let status = self.expect_update(task_id).await;
            if status.state == state as i32 {
                return status;
            }
        }
    }

    pub async fn ack(&mut self, status: &TaskStatus) {
        if !status.update_id.is_empty() {
            self.send(Message::StatusAck(StatusAck {
                task_id: status.task_id.clone(),
                update_id: status.update_id.clone(),
            }))
            .await;
        }
    }

    // ---- framework side

    pub async fn framework(addr: std::net::SocketAddr, name: &str) -> Client {
        Self::framework_with(addr, name, "", 1.0, 60.0).await
    }

    pub async fn framework_with(
        addr: std::net::SocketAddr,
        name: &str,
        id: &str,
        weight: f64,
        failover_secs: f64,
    ) -> Client {
        let mut c = Client::connect(addr).await;
        c.send(Message::Subscribe(Subscribe {
            framework_id: id.into(),
            name: name.into(),
            user: "tester".into(),
            weight,
            failover_timeout_secs: failover_secs,
            ..Default::default()
        }))
        .await;
        c.id = c
            .expect("Subscribed", |m| match m {
                Message::Subscribed(s) => Some(s.framework_id.clone()),
                Message::Error(e) => panic!("subscribe refused: {}", e.message),
                _ => None,
            })
            .await;
        c
    }

    pub async fn demand(&mut self, resources: &str, count: u32) {
        self.send(Message::Demand(Demand {
            resources: Some(Resources::parse(resources).unwrap().to_wire()),
            count,
        }))
        .await;
    }

    pub async fn accept(&mut self, offer_id: &str, tasks: Vec<TaskInfo>) {
        self.send(Message::Accept(Accept {
            offer_id: offer_id.into(),
            tasks,
        }))
        .await;
    }

    pub async fn decline(&mut self, offer_id: &str, refuse_seconds: f64) {
        self.send(Message::Decline(Decline {
            offer_ids: vec![offer_id.into()],
            refuse_seconds,
        }))
        .await;
    }

    // ---- agent side

    pub async fn agent(addr: std::net::SocketAddr, id: &str, resources: &str) -> Client {
        Self::agent_with_tasks(addr, id, resources, vec![]).await
    }

    pub async fn agent_with_tasks(
        addr: std::net::SocketAddr,
        id: &str,
        resources: &str,
        tasks: Vec<TaskStatus>,
    ) -> Client {
        // Agent text may declare GPU devices (`gpus:2x16384`, docs/devices.md).
        let (total, devices) = ringmaster_proto::devices::parse_agent_resources(resources).unwrap();
        Self::register(
            addr,
            RegisterAgent {
                agent_id: id.into(),
                hostname: format!("host-{id}"),
                total: Some(total.to_wire()),
                attributes: vec![],
                tasks,
                devices: devices.iter().map(Into::into).collect(),
            },
        )
        .await
    }

    /// Registers an agent with a full `RegisterAgent`; returns once `AgentRegistered` came.
    pub async fn register(addr: std::net::SocketAddr, register: RegisterAgent) -> Client {
        let mut c = Client::connect(addr).await;
        c.send(Message::RegisterAgent(register)).await;
        c.id = c
            .expect("AgentRegistered", |m| match m {
                Message::AgentRegistered(r) => Some(r.agent_id.clone()),
                Message::Error(e) => panic!("registration refused: {}", e.message),
                _ => None,
            })
            .await;
        c
    }

    pub async fn heartbeat(&mut self) {
        let id = self.id.clone();
        self.send(Message::AgentHeartbeat(AgentHeartbeat {
            agent_id: id,
            free: None,
            tasks: vec![],
            free_devices: vec![],
        }))
        .await;
    }

    /// As an agent: waits for RunTasks and returns the tasks.
    pub async fn expect_run(&mut self) -> Vec<TaskInfo> {
        self.expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.tasks.clone()),
            _ => None,
        })
        .await
    }

    /// As an agent: reports a task state.
    pub async fn report(&mut self, task: &TaskInfo, state: TaskState, update_id: &str) {
        self.send(Message::StatusUpdate(StatusUpdate {
            status: Some(TaskStatus {
                task_id: task.task_id.clone(),
                framework_id: task.framework_id.clone(),
                agent_id: self.id.clone(),
                state: state as i32,
                update_id: update_id.into(),
                ..Default::default()
            }),
        }))
        .await;
    }
}

pub fn task(id: &str, resources: &str, command: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: command.into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        ..Default::default()
    }
}

pub fn offered(offer: &ringmaster_proto::Offer) -> Resources {
    Resources::from_wire(offer.resources.as_ref()).unwrap()
}

/// Polls the master's snapshot until `cond` holds.
pub async fn wait_for_state(
    master: &Master,
    what: &str,
    mut cond: impl FnMut(&ringmaster::master::Snapshot) -> bool,
) -> ringmaster::master::Snapshot {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let snapshot = master.snapshot().await.unwrap();
        if cond(&snapshot) {
            return snapshot;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {snapshot:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Launches one task of `cpus:1;mem:128` (`sleep 100`) on `agent` for `fw`, sees it RUNNING,
/// and returns what the agent was told to run and the framework's RUNNING update (not acked).
pub async fn run_one_status(
    fw: &mut Client,
    agent: &mut Client,
    id: &str,
) -> (ringmaster_proto::TaskInfo, ringmaster_proto::TaskStatus) {
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.demand("cpus:1;mem:128", 0).await;
    fw.accept(
        &offer.offer_id,
        vec![task(id, "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let run = agent.expect_run().await.remove(0);
    agent
        .report(
            &run,
            ringmaster_proto::TaskState::TaskRunning,
            &format!("{id}-running"),
        )
        .await;
    let running = fw
        .expect_state(id, ringmaster_proto::TaskState::TaskRunning)
        .await;
    (run, running)
}

/// The value of one `/metrics` series of the master serving HTTP on `http`: `series` is the
/// line up to the value without the `ringmaster_` prefix, e.g.
/// `connections_limited_total{limit="message_rate"}`.
pub async fn metric_value(http: std::net::SocketAddr, series: &str) -> f64 {
    let url = format!("http://{http}/metrics");
    let body = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(WAIT))
            .build()
            .into();
        agent
            .get(&url)
            .call()
            .expect("GET /metrics")
            .body_mut()
            .read_to_string()
            .expect("body")
    })
    .await
    .unwrap();
    let wanted = format!("ringmaster_{series} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .unwrap_or_else(|| panic!("no series {series} in\n{body}"))
        .trim()
        .parse()
        .expect("a number")
}

/// Waits (with a timeout) until `path` exists.
pub async fn wait_for_file(path: &std::path::Path) {
    tokio::time::timeout(WAIT, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} did not appear", path.display()));
}
