//! The agent against a fake master over real TCP, running real processes.
//!
//! The fake master is a `TcpListener` plus `ringmaster_proto::Connection`: it handshakes,
//! registers the agent and then drives it message by message. Every wait is bounded.

use ringmaster_proto::convert::ResourcesWire;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringmaster_agent::{run, AgentConfig};
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    AgentHeartbeat, AgentRegistered, Attribute, Connection, Error, ErrorCode, HelloAck, KillTask,
    Message, Ping, RegisterAgent, RunTasks, StatusAck, TaskInfo, TaskState, TaskStatus,
    PROTOCOL_VERSION,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(15);

struct FakeMaster {
    listener: TcpListener,
    addr: String,
}

impl FakeMaster {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        FakeMaster { listener, addr }
    }

    async fn accept_connection(&self) -> Connection<TcpStream> {
        let (stream, _) = timeout(WAIT, self.listener.accept())
            .await
            .expect("the agent connects")
            .unwrap();
        Connection::new(stream)
    }

    /// Accepts the agent, answers its Hello and registers it under `assign`.
    async fn accept(&self, assign: &str, heartbeat_ms: u64) -> (MasterLink, RegisterAgent) {
        let mut link = MasterLink {
            conn: self.accept_connection().await,
        };
        match link.recv().await {
            Message::Hello(hello) => {
                assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
                assert!(
                    hello.client.starts_with("ringmaster-agent "),
                    "{}",
                    hello.client
                );
            }
            other => panic!("expected Hello, got {other:?}"),
        }
        link.send(Message::HelloAck(HelloAck {
            protocol_version: PROTOCOL_VERSION,
            master: "fake".into(),
            ..Default::default()
        }))
        .await;
        let register = match link.recv().await {
            Message::RegisterAgent(register) => register,
            other => panic!("expected RegisterAgent, got {other:?}"),
        };
        link.send(Message::AgentRegistered(AgentRegistered {
            agent_id: assign.into(),
            heartbeat_interval_ms: heartbeat_ms,
        }))
        .await;
        (link, register)
    }
}

struct MasterLink {
    conn: Connection<TcpStream>,
}

impl MasterLink {
    async fn send(&mut self, message: Message) {
        self.conn.send(message).await.unwrap();
    }

    async fn recv(&mut self) -> Message {
        timeout(WAIT, self.conn.recv())
            .await
            .expect("a message from the agent in time")
            .unwrap()
            .expect("the agent keeps the connection open")
    }

    /// The next status update, skipping heartbeats and pongs.
    async fn next_update(&mut self) -> TaskStatus {
        loop {
            match self.recv().await {
                Message::StatusUpdate(update) => return update.status.unwrap(),
                Message::AgentHeartbeat(_) | Message::Pong(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn ack(&mut self, status: &TaskStatus) {
        self.send(Message::StatusAck(StatusAck {
            task_id: status.task_id.clone(),
            update_id: status.update_id.clone(),
        }))
        .await;
    }

    async fn next_update_acked(&mut self) -> TaskStatus {
        let status = self.next_update().await;
        self.ack(&status).await;
        status
    }

    /// The next heartbeat satisfying `wanted`, skipping everything else but updates.
    async fn heartbeat_where(
        &mut self,
        wanted: impl Fn(&AgentHeartbeat) -> bool,
    ) -> AgentHeartbeat {
        loop {
            match self.recv().await {
                Message::AgentHeartbeat(hb) if wanted(&hb) => return hb,
                Message::AgentHeartbeat(_) | Message::Pong(_) => {}
                Message::StatusUpdate(update) => {
                    let status = update.status.unwrap();
                    self.ack(&status).await;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Ping and wait for the Pong: everything sent before has been handled by the agent.
    async fn sync(&mut self) {
        self.send(Message::Ping(Ping { nonce: 77 })).await;
        loop {
            match self.recv().await {
                Message::Pong(pong) if pong.nonce == 77 => return,
                Message::AgentHeartbeat(_) | Message::Pong(_) => {}
                other => panic!("unexpected {other:?} while syncing"),
            }
        }
    }

    async fn run(&mut self, tasks: Vec<TaskInfo>) {
        self.send(Message::RunTasks(RunTasks {
            tasks,
            leader_term: 0,
        }))
        .await;
    }

    async fn kill(&mut self, task_id: &str, reason: &str) {
        self.send(Message::KillTask(KillTask {
            leader_term: 0,
            task_id: task_id.into(),
            framework_id: "fw".into(),
            reason: reason.into(),
        }))
        .await;
    }
}

struct RunningAgent {
    handle: JoinHandle<anyhow::Result<()>>,
    stop: Option<oneshot::Sender<()>>,
}

impl RunningAgent {
    fn start(config: AgentConfig) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, async {
            let _ = stopped.await;
        }));
        RunningAgent {
            handle,
            stop: Some(stop),
        }
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        timeout(WAIT, &mut self.handle)
            .await
            .expect("the agent stops in time")
            .unwrap()
    }
}

fn config(master: &str, work_dir: &Path, resources: &str) -> AgentConfig {
    AgentConfig {
        master: master.to_string(),
        id: None,
        hostname: "test-host".into(),
        resources: Resources::parse(resources).unwrap(),
        devices: Vec::new(),
        device_selection: Default::default(),
        attributes: vec![("rack".into(), "r1".into())],
        work_dir: work_dir.to_path_buf(),
        kill_grace: Duration::from_millis(500),
        reconnect_max_backoff: Duration::from_millis(200),
        security: Default::default(),
        task_user: ringmaster_agent::users::default_task_user(),
        allow_root_tasks: false,
        gpu_sharing: Default::default(),
        usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
        safeguards: Default::default(),
    }
}

fn task(id: &str, command: &str, resources: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: command.into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        framework_id: "fw".into(),
        agent_id: String::new(),
        env: vec![Attribute {
            key: "CUSTOM".into(),
            value: "custom value".into(),
        }],
        ..Default::default()
    }
}

fn state(status: &TaskStatus) -> TaskState {
    TaskState::try_from(status.state).unwrap()
}

fn sandbox(work_dir: &Path, task_id: &str) -> PathBuf {
    ringmaster_agent::sandbox::latest_run_dir(work_dir, "fw", task_id)
}

async fn wait_for_file(path: &Path) -> String {
    timeout(WAIT, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                if text.ends_with('\n') {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} appears in time", path.display()))
}

fn process_is_alive(pid: u32) -> bool {
    ringmaster_agent::process::process_is_alive(pid)
}

#[tokio::test]
async fn runs_a_task_to_completion_and_saves_its_id() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, register) = master.accept("agent-7", 60_000).await;
    assert_eq!(register.agent_id, "", "a fresh agent asks for an id");
    assert_eq!(register.hostname, "test-host");
    assert_eq!(
        Resources::from_wire(register.total.as_ref()).unwrap(),
        Resources::parse("cpus:4;mem:1024").unwrap()
    );
    assert_eq!(register.attributes[0].key, "rack");
    assert!(register.tasks.is_empty());

    let command = "echo \"$RINGMASTER_TASK_ID|$RINGMASTER_FRAMEWORK_ID|$RINGMASTER_AGENT_ID|\
                   $RINGMASTER_RESOURCES|$CUSTOM\"; pwd; echo \"$RINGMASTER_SANDBOX\"";
    link.run(vec![task("t1", command, "cpus:1;mem:128")]).await;
    let running = link.next_update_acked().await;
    assert_eq!(state(&running), TaskState::TaskRunning);
    assert_eq!(running.task_id, "t1");
    assert_eq!(running.framework_id, "fw");
    assert_eq!(running.agent_id, "agent-7");
    assert!(
        running.update_id.starts_with("agent-7-"),
        "{}",
        running.update_id
    );
    assert!(running.timestamp_ms > 0);
    let finished = link.next_update_acked().await;
    assert_eq!(state(&finished), TaskState::TaskFinished);
    assert_eq!(finished.exit_code, Some(0));
    assert_ne!(finished.update_id, running.update_id);

    let sandbox = sandbox(dir.path(), "t1");
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    let real = sandbox.canonicalize().unwrap();
    assert_eq!(
        stdout,
        format!(
            "t1|fw|agent-7|cpus:1;mem:128|custom value\n{}\n{}\n",
            real.display(),
            sandbox.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("agent_id")).unwrap(),
        "agent-7\n"
    );
    agent.stop().await.unwrap();

    // A restarted agent re-registers under the saved id.
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (_link, register) = master.accept("agent-7", 60_000).await;
    assert_eq!(register.agent_id, "agent-7");
    agent.stop().await.unwrap();
}

/// Runs one task with `command` and returns its terminal status (after RUNNING).
async fn run_to_end(link: &mut MasterLink, id: &str, command: &str) -> TaskStatus {
    link.run(vec![task(id, command, "cpus:1")]).await;
    assert_eq!(
        state(&link.next_update_acked().await),
        TaskState::TaskRunning
    );
    link.next_update_acked().await
}

#[tokio::test]
async fn non_zero_exit_fails_with_the_exit_code() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    let failed = run_to_end(&mut link, "bad", "echo early >&2; echo failing >&2; exit 3").await;
    assert_eq!(state(&failed), TaskState::TaskFailed);
    assert_eq!(failed.exit_code, Some(3));
    assert_eq!(failed.reason, "exit_status");
    // How it ended, then the last lines of its stderr.
    assert_eq!(
        failed.message, "exited with status 3; stderr: early\nfailing",
        "{failed:?}"
    );
    let stderr = std::fs::read_to_string(sandbox(dir.path(), "bad").join("stderr")).unwrap();
    assert_eq!(stderr, "early\nfailing\n");

    let crashed = run_to_end(&mut link, "segv", "echo about to crash >&2; kill -SEGV $$").await;
    assert_eq!(state(&crashed), TaskState::TaskFailed);
    assert_eq!(crashed.reason, "signal");
    assert!(crashed.message.contains("SIGSEGV"), "{}", crashed.message);
    assert!(
        // (The shell may add its own "Segmentation fault" line after it.)
        crashed.message.contains("; stderr: about to crash"),
        "{}",
        crashed.message
    );
    assert_eq!(crashed.exit_code, None);

    // A task that succeeds gets no stderr in its message; one with an empty stderr neither.
    let finished = run_to_end(&mut link, "ok", "echo chatty >&2").await;
    assert_eq!(state(&finished), TaskState::TaskFinished);
    assert!(!finished.message.contains("stderr"), "{}", finished.message);
    let quiet = run_to_end(&mut link, "quiet", "exit 4").await;
    assert_eq!(quiet.message, "exited with status 4");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn kill_ends_the_whole_process_group() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    link.run(vec![task(
        "long",
        "sleep 100 & echo $! > bg.pid; sleep 100",
        "cpus:1",
    )])
    .await;
    assert_eq!(
        state(&link.next_update_acked().await),
        TaskState::TaskRunning
    );
    let pid_text = wait_for_file(&sandbox(dir.path(), "long").join("bg.pid")).await;
    let background: u32 = pid_text.trim().parse().unwrap();
    assert!(process_is_alive(background));

    link.kill("long", "preempted").await;
    let killed = link.next_update_acked().await;
    assert_eq!(state(&killed), TaskState::TaskKilled);
    assert_eq!(killed.reason, "preempted");
    assert!(
        !process_is_alive(background),
        "the background child {background} survived the kill"
    );

    link.kill("nope", "").await;
    let lost = link.next_update_acked().await;
    assert_eq!(state(&lost), TaskState::TaskLost);
    assert_eq!(lost.reason, "unknown_task");
    assert_eq!(lost.task_id, "nope");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn updates_are_resent_until_acknowledged_and_run_tasks_is_idempotent() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    let once = task("once", "echo ran >> once.runs", "cpus:1");
    link.run(vec![once.clone()]).await;
    let running = link.next_update().await;
    let finished = link.next_update().await;
    assert_eq!(state(&running), TaskState::TaskRunning);
    assert_eq!(state(&finished), TaskState::TaskFinished);

    // Not acknowledged: both come again, in order, with the same ids.
    let again = link.next_update().await;
    assert_eq!(again.update_id, running.update_id);
    let again = link.next_update().await;
    assert_eq!(again.update_id, finished.update_id);

    // A repeated RunTasks for a known task resends its pending updates, runs nothing.
    link.run(vec![once]).await;
    let resent = link.next_update().await;
    assert_eq!(resent.update_id, running.update_id);
    let resent = link.next_update().await;
    assert_eq!(resent.update_id, finished.update_id);
    let runs = std::fs::read_to_string(sandbox(dir.path(), "once").join("once.runs")).unwrap();
    assert_eq!(runs, "ran\n", "the task ran once");

    link.ack(&running).await;
    link.ack(&finished).await;
    // Ping/Pong orders the check: once the Pong is back, the acks were processed.
    link.send(Message::Ping(Ping { nonce: 9 })).await;
    loop {
        match link.recv().await {
            Message::Pong(pong) => {
                assert_eq!(pong.nonce, 9);
                break;
            }
            Message::StatusUpdate(_) | Message::AgentHeartbeat(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // Nothing more is resent after the acks (a resend would come within 2.25 s).
    let quiet = timeout(Duration::from_secs(3), async {
        loop {
            if let Message::StatusUpdate(update) = link.recv().await {
                return update;
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "acknowledged update resent: {quiet:?}");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn reconnects_and_reregisters_with_running_tasks() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("agent-r", 60_000).await;
    link.run(vec![task("svc", "sleep 100", "cpus:2;mem:512")])
        .await;
    let running = link.next_update_acked().await;
    assert_eq!(state(&running), TaskState::TaskRunning);
    link.sync().await; // the ack is handled before the connection drops
    drop(link);

    let (mut link, register) = master.accept("agent-r", 60_000).await;
    assert_eq!(register.agent_id, "agent-r");
    assert_eq!(register.tasks.len(), 1);
    assert_eq!(register.tasks[0].task_id, "svc");
    assert_eq!(state(&register.tasks[0]), TaskState::TaskRunning);
    assert_eq!(
        register.tasks[0].update_id, "",
        "reconciliation needs no ack"
    );
    let hb = link.heartbeat_where(|_| true).await;
    assert_eq!(hb.tasks.len(), 1);
    assert_eq!(
        Resources::from_wire(hb.free.as_ref()).unwrap(),
        Resources::parse("cpus:2;mem:512").unwrap()
    );

    // Updates issued while disconnected are delivered after re-registering.
    link.kill("svc", "").await;
    let killed = link.next_update().await;
    assert_eq!(state(&killed), TaskState::TaskKilled);
    assert_eq!(killed.reason, "killed");
    drop(link);
    let (mut link, register) = master.accept("agent-r", 60_000).await;
    // The ended task is reported with its real terminal state until its update is acked.
    assert_eq!(register.tasks.len(), 1);
    assert_eq!(state(&register.tasks[0]), TaskState::TaskKilled);
    assert_eq!(register.tasks[0].update_id, "");
    let resent = link.next_update_acked().await;
    assert_eq!(resent.update_id, killed.update_id);
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn heartbeats_report_free_resources() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 100).await;
    let total = Resources::parse("cpus:4;mem:1024").unwrap();
    let first = link.heartbeat_where(|_| true).await;
    assert_eq!(first.agent_id, "a1");
    assert_eq!(Resources::from_wire(first.free.as_ref()).unwrap(), total);

    link.run(vec![task("hog", "sleep 100", "cpus:1.5;mem:1000")])
        .await;
    let busy = link.heartbeat_where(|hb| !hb.tasks.is_empty()).await;
    assert_eq!(
        Resources::from_wire(busy.free.as_ref()).unwrap(),
        Resources::parse("cpus:2.5;mem:24").unwrap()
    );
    assert_eq!(busy.tasks[0].task_id, "hog");

    // Does not fit any more: refused, the running task untouched.
    link.run(vec![task("big", "true", "cpus:1;mem:100")]).await;
    let refused = link.next_update_acked().await;
    assert_eq!(state(&refused), TaskState::TaskFailed);
    assert_eq!(refused.reason, "insufficient_resources");
    assert!(refused.message.contains("mem"), "{}", refused.message);

    // Periodic heartbeats keep coming with the task in them.
    for _ in 0..3 {
        let hb = link.heartbeat_where(|_| true).await;
        assert_eq!(hb.tasks.len(), 1);
    }
    link.kill("hog", "").await;
    let idle = link.heartbeat_where(|hb| hb.tasks.is_empty()).await;
    assert_eq!(Resources::from_wire(idle.free.as_ref()).unwrap(), total);
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn insufficient_resources_fail_the_task() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    link.run(vec![task("huge", "true", "cpus:8;gpus:1")]).await;
    let failed = link.next_update_acked().await;
    assert_eq!(state(&failed), TaskState::TaskFailed);
    assert_eq!(failed.reason, "insufficient_resources");
    assert!(
        failed.message.contains("cpus: need 8, free 4"),
        "{}",
        failed.message
    );
    assert!(
        failed.message.contains("gpus: need 1, free 0"),
        "{}",
        failed.message
    );
    assert!(!sandbox(dir.path(), "huge").exists(), "nothing was started");

    link.run(vec![task("empty", "  ", "cpus:1")]).await;
    let failed = link.next_update_acked().await;
    assert_eq!(failed.reason, "launch_failed");
    assert!(
        failed.message.contains("command is empty"),
        "{}",
        failed.message
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_kills_tasks_and_reports_them() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    link.run(vec![task("svc", "echo $$ > pid; exec sleep 100", "cpus:1")])
        .await;
    assert_eq!(
        state(&link.next_update_acked().await),
        TaskState::TaskRunning
    );
    let pid: u32 = wait_for_file(&sandbox(dir.path(), "svc").join("pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    link.sync().await;
    agent.stop().await.unwrap();
    assert!(!process_is_alive(pid), "the task outlived the agent");
    let killed = link.next_update().await;
    assert_eq!(state(&killed), TaskState::TaskKilled);
    assert_eq!(killed.reason, "agent_shutdown");
}

#[tokio::test]
async fn version_mismatch_is_fatal() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:1"));
    let mut conn = master.accept_connection().await;
    assert!(matches!(
        timeout(WAIT, conn.recv()).await.unwrap().unwrap(),
        Some(Message::Hello(_))
    ));
    let mut error = Error::new(ErrorCode::VersionMismatch, "this master speaks 2");
    error.supported_versions = vec![2];
    conn.send(Message::Error(error)).await.unwrap();
    let result = timeout(WAIT, agent.handle)
        .await
        .expect("run returns without retrying")
        .unwrap();
    let message = format!("{:#}", result.unwrap_err());
    assert!(message.contains("protocol version"), "{message}");
    assert!(message.contains("[2]"), "{message}");
}

/// A master that will not take an agent this large (`master.max_agent_resources`) answers
/// `AGENT_REFUSED`: the agent stops with the master's reason instead of retrying forever.
#[tokio::test]
async fn a_refusal_of_the_agents_resources_is_fatal() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:8"));
    let mut conn = master.accept_connection().await;
    assert!(matches!(
        timeout(WAIT, conn.recv()).await.unwrap().unwrap(),
        Some(Message::Hello(_))
    ));
    conn.send(Message::HelloAck(HelloAck {
        protocol_version: PROTOCOL_VERSION,
        master: "fake".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert!(matches!(
        timeout(WAIT, conn.recv()).await.unwrap().unwrap(),
        Some(Message::RegisterAgent(_))
    ));
    let reason = "RegisterAgent: `cpus` 8 is above the limit 4 of master.max_agent_resources";
    conn.send(Message::Error(Error::new(ErrorCode::AgentRefused, reason)))
        .await
        .unwrap();
    drop(conn);
    let result = timeout(WAIT, agent.handle)
        .await
        .expect("run returns without retrying")
        .unwrap();
    let message = format!("{:#}", result.unwrap_err());
    assert_eq!(
        message,
        format!("master refused us with AGENT_REFUSED: {reason}")
    );
}

#[tokio::test]
async fn garbage_from_the_master_does_not_take_the_agent_down() {
    use tokio::io::AsyncWriteExt as _;
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:1"));
    // First connection: the answer to Hello is bytes that are no Envelope; the agent drops
    // the connection and comes back.
    let (mut raw, _) = timeout(WAIT, master.listener.accept())
        .await
        .unwrap()
        .unwrap();
    raw.write_all(&4u32.to_be_bytes()).await.unwrap();
    raw.write_all(&[0xff, 0xff, 0xff, 0xff]).await.unwrap();
    drop(raw);
    // Then a well-behaved master: registration works as usual.
    let (mut link, register) = master.accept("a1", 60_000).await;
    assert_eq!(register.agent_id, "");
    link.run(vec![task("ok", "true", "cpus:1")]).await;
    assert_eq!(
        state(&link.next_update_acked().await),
        TaskState::TaskRunning
    );
    agent.stop().await.unwrap();
}

fn not_leader(leader: &str) -> Message {
    let mut error = Error::new(ErrorCode::NotLeader, "this master is a follower");
    error.leader = leader.to_string();
    Message::Error(error)
}

#[tokio::test]
async fn not_leader_sends_the_agent_to_the_named_leader_with_its_tasks() {
    let follower = FakeMaster::start().await;
    let leader = FakeMaster::start().await;
    let next_leader = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Only the follower is configured: the leaders it names are followed all the same.
    let agent = RunningAgent::start(config(&follower.addr, dir.path(), "cpus:4;mem:1024"));
    let mut conn = follower.accept_connection().await;
    assert!(matches!(
        timeout(WAIT, conn.recv()).await.unwrap().unwrap(),
        Some(Message::Hello(_))
    ));
    conn.send(not_leader(&leader.addr)).await.unwrap();
    drop(conn);

    let (mut link, register) = leader.accept("agent-l", 60_000).await;
    assert_eq!(register.agent_id, "");
    link.send(Message::RunTasks(RunTasks {
        tasks: vec![task("svc", "sleep 100", "cpus:1;mem:64")],
        leader_term: 3,
    }))
    .await;
    let running = link.next_update_acked().await;
    assert_eq!(state(&running), TaskState::TaskRunning);
    link.sync().await;

    // Deposed while serving: NOT_LEADER names the new leader; the agent re-registers there
    // with the same id and its running task.
    link.send(not_leader(&next_leader.addr)).await;
    let (mut link, register) = next_leader.accept("agent-l", 60_000).await;
    assert_eq!(register.agent_id, "agent-l");
    assert_eq!(register.tasks.len(), 1);
    assert_eq!(register.tasks[0].task_id, "svc");
    assert_eq!(state(&register.tasks[0]), TaskState::TaskRunning);

    // Fencing: a RunTasks from the older term launches nothing; the newer term is kept.
    link.send(Message::RunTasks(RunTasks {
        tasks: vec![task("stale", "sleep 100", "cpus:1;mem:64")],
        leader_term: 2,
    }))
    .await;
    let lost = link.next_update_acked().await;
    assert_eq!(lost.task_id, "stale");
    assert_eq!(state(&lost), TaskState::TaskLost);
    assert_eq!(lost.reason, "stale_leader");
    assert!(
        !sandbox(dir.path(), "stale").exists(),
        "nothing was launched"
    );
    let saved = std::fs::read_to_string(dir.path().join(ringmaster_agent::LEADER_TERM_FILE));
    assert_eq!(saved.unwrap(), "3\n");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_connection_and_an_unknown_leader_move_to_the_next_master() {
    let closed = {
        let gone = FakeMaster::start().await;
        gone.addr.clone()
    };
    let follower = FakeMaster::start().await;
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let list = format!("{closed},{},{}", follower.addr, master.addr);
    let agent = RunningAgent::start(config(&list, dir.path(), "cpus:1"));
    // The first master refuses the connection: the follower is next, and knows no leader.
    let mut conn = follower.accept_connection().await;
    assert!(matches!(
        timeout(WAIT, conn.recv()).await.unwrap().unwrap(),
        Some(Message::Hello(_))
    ));
    conn.send(not_leader("")).await.unwrap();
    drop(conn);
    // So the third master of the list is tried, and it leads.
    let (mut link, register) = master.accept("a-next", 60_000).await;
    assert_eq!(register.agent_id, "");
    link.run(vec![task("ok", "true", "cpus:1")]).await;
    assert_eq!(
        state(&link.next_update_acked().await),
        TaskState::TaskRunning
    );
    agent.stop().await.unwrap();
}

/// Sandboxes are collected through the running agent: with `--sandbox-gc-delay 0s`, a task's
/// run directory and the agent's record of it are gone once the master acknowledged its end;
/// with the default delay they stay (the output can still be read).
#[tokio::test]
async fn an_acknowledged_tasks_sandbox_is_collected_after_the_delay() {
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&master.addr, dir.path(), "cpus:4;mem:1024");
    cfg.safeguards.sandbox_gc_delay = Duration::ZERO;
    let agent = RunningAgent::start(cfg);
    let (mut link, _) = master.accept("a1", 60_000).await;
    link.run(vec![task("brief", "echo done", "cpus:1")]).await;
    let running = link.next_update().await;
    let finished = link.next_update().await;
    assert_eq!(state(&finished), TaskState::TaskFinished);
    let run = sandbox(dir.path(), "brief");
    assert!(run.join("stdout").exists());
    link.ack(&running).await;
    link.ack(&finished).await;
    timeout(WAIT, async {
        while run.exists() || dir.path().join("meta/tasks/fw").exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the sandbox and its record are collected");
    assert!(!dir.path().join("sandboxes/fw").exists());
    agent.stop().await.unwrap();

    // The default delay keeps it.
    let master = FakeMaster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = RunningAgent::start(config(&master.addr, dir.path(), "cpus:4;mem:1024"));
    let (mut link, _) = master.accept("a1", 60_000).await;
    link.run(vec![task("kept", "echo done", "cpus:1")]).await;
    let running = link.next_update().await;
    let finished = link.next_update().await;
    link.ack(&running).await;
    link.ack(&finished).await;
    link.send(Message::Ping(Ping { nonce: 1 })).await;
    while !matches!(link.recv().await, Message::Pong(_)) {}
    assert!(sandbox(dir.path(), "kept").join("stdout").exists());
    agent.stop().await.unwrap();
}
