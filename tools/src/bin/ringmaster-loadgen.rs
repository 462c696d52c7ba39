//! `ringmaster-loadgen`: drives a running master over loopback with simulated agents and
//! frameworks speaking the real protocol, to measure end-to-end throughput and memory.
//!
//! Simulated agents "run" a task instantly: on RunTasks they report RUNNING and FINISHED at
//! once. Frameworks state a demand, accept every offer with as many tasks as fit, and count
//! FINISHED updates. The figure reported is tasks finished per second, from the first offer
//! to the last FINISHED update.
//!
//! With `--hold` the agents register, heartbeat, and stay until Ctrl-C (for measuring the
//! master's memory with many agents); `--master-pid` prints the master's VmRSS.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::security::AuthRole;
use ringmaster_proto::transport::{BoxedStream, ClientSecurity};
use ringmaster_proto::{
    Accept, AgentHeartbeat, Connection, Demand, ErrorCode, Hello, Message, RegisterAgent,
    StatusAck, StatusUpdate, Subscribe, TaskInfo, TaskState, TaskStatus, PROTOCOL_VERSION,
};
use ringmaster_sdk::SecurityFlags;

/// TLS and credential of every simulated agent and framework, set once from the flags.
static SECURITY: std::sync::OnceLock<ClientSecurity> = std::sync::OnceLock::new();

#[derive(Parser)]
#[command(
    name = "ringmaster-loadgen",
    about = "Load generator for a Ringmaster master"
)]
struct Args {
    /// The master's protocol address.
    #[arg(long, default_value = "127.0.0.1:5050")]
    master: String,
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    #[arg(long, default_value = "cpus:8;mem:16384")]
    agent_resources: String,
    #[arg(long, default_value_t = 10)]
    frameworks: usize,
    /// Tasks per framework.
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    #[arg(long, default_value = "cpus:0.1;mem:32")]
    task_resources: String,
    /// Register the agents and keep them until Ctrl-C instead of running tasks.
    #[arg(long)]
    hold: bool,
    /// Print this process's VmRSS (the master's pid) once the agents are registered.
    #[arg(long)]
    master_pid: Option<u32>,
    /// TLS and authentication; one principal for all (it needs both roles and user `load`).
    #[command(flatten)]
    security: SecurityFlags,
}

async fn connect(addr: &str, role: AuthRole) -> anyhow::Result<Connection<BoxedStream>> {
    let security = SECURITY.get_or_init(ClientSecurity::default);
    let stream = security
        .connect(addr, Duration::from_secs(30))
        .await
        .with_context(|| format!("connect {addr}"))?;
    let mut conn = Connection::new(stream);
    conn.send(Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "ringmaster-loadgen".into(),
    }))
    .await?;
    let ack = match conn.recv().await? {
        Some(Message::HelloAck(ack)) => ack,
        other => bail!("handshake failed: {other:?}"),
    };
    if let Some(answer) = security
        .authenticate(&ack, role)
        .map_err(anyhow::Error::msg)?
    {
        conn.send(Message::Authenticate(answer)).await?;
        match conn.recv().await? {
            Some(Message::Authenticated(_)) => {}
            other => bail!("authentication failed: {other:?}"),
        }
    }
    Ok(conn)
}

async fn sim_agent(
    addr: String,
    index: usize,
    resources: Resources,
    registered: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut conn = connect(&addr, AuthRole::Agent).await?;
    conn.send(Message::RegisterAgent(RegisterAgent {
        agent_id: format!("sim-{index}"),
        hostname: format!("sim-{index}"),
        total: Some(resources.to_wire()),
        attributes: vec![],
        tasks: vec![],
        ..Default::default()
    }))
    .await?;
    let (agent_id, heartbeat) = match conn.recv().await? {
        Some(Message::AgentRegistered(r)) => (r.agent_id, r.heartbeat_interval_ms),
        other => bail!("registration failed: {other:?}"),
    };
    registered.fetch_add(1, Ordering::Relaxed);
    let mut ticker = tokio::time::interval(Duration::from_millis(heartbeat.max(100)));
    let mut counter = 0u64;
    loop {
        tokio::select! {
            message = conn.recv() => match message? {
                None => return Ok(()),
                Some(Message::RunTasks(run)) => {
                    for task in run.tasks {
                        for state in [TaskState::TaskRunning, TaskState::TaskFinished] {
                            counter += 1;
                            conn.feed(Message::StatusUpdate(StatusUpdate {
                                status: Some(TaskStatus {
                                    task_id: task.task_id.clone(),
                                    framework_id: task.framework_id.clone(),
                                    agent_id: agent_id.clone(),
                                    state: state as i32,
                                    update_id: format!("{agent_id}-{counter}"),
                                    ..Default::default()
                                }),
                            }))
                            .await?;
                        }
                    }
                    conn.flush().await?;
                }
                Some(Message::Ping(p)) => conn.send(Message::Pong(ringmaster_proto::Pong { nonce: p.nonce })).await?,
                Some(_) => {}
            },
            _ = ticker.tick() => {
                conn.send(Message::AgentHeartbeat(AgentHeartbeat {
                    agent_id: agent_id.clone(),
                    free: None,
                    tasks: vec![],
                    ..Default::default()
                }))
                .await?;
            }
        }
    }
}

struct FrameworkResult {
    finished: u64,
    first_offer: Option<Instant>,
    last_finish: Option<Instant>,
}

async fn sim_framework(
    addr: String,
    index: usize,
    tasks: u64,
    unit: Resources,
) -> anyhow::Result<FrameworkResult> {
    let mut conn = connect(&addr, AuthRole::Framework).await?;
    conn.send(Message::Subscribe(Subscribe {
        framework_id: String::new(),
        name: format!("load-{index}"),
        user: "load".into(),
        weight: 1.0,
        failover_timeout_secs: 10.0,
        ..Default::default()
    }))
    .await?;
    match conn.recv().await? {
        Some(Message::Subscribed(_)) => {}
        other => bail!("subscribe failed: {other:?}"),
    }
    let demand = |count: u64| {
        Message::Demand(Demand {
            resources: Some(unit.to_wire()),
            count: count.min(u64::from(u32::MAX)) as u32,
        })
    };
    conn.send(demand(tasks)).await?;
    // Task indices handed out so far, and indices to launch again: an offer the master
    // rescinded (timed out, agent gone) while our Accept was on its way launches nothing, and
    // the master answers that Accept with INVALID_OFFER.
    let mut next = 0u64;
    let mut retry: Vec<u64> = Vec::new();
    let mut accepted: HashMap<String, Vec<u64>> = HashMap::new();
    // The master re-sends an update until it is acknowledged (and after a reconnect), so one
    // task's FINISHED can arrive more than once: count each task once.
    let mut finished_ids: HashSet<String> = HashSet::new();
    let mut result = FrameworkResult {
        finished: 0,
        first_offer: None,
        last_finish: None,
    };
    while result.finished < tasks {
        let Some(message) = conn.recv().await? else {
            bail!("master closed the connection")
        };
        match message {
            Message::Offers(offers) => {
                result.first_offer.get_or_insert_with(Instant::now);
                for offer in offers.offers {
                    let offered = Resources::from_wire(offer.resources.as_ref())?;
                    let room = offered.copies_of(&unit);
                    let mut indices = Vec::new();
                    while (indices.len() as u64) < room {
                        match retry.pop() {
                            Some(i) => indices.push(i),
                            None if next < tasks => {
                                indices.push(next);
                                next += 1;
                            }
                            None => break,
                        }
                    }
                    let infos: Vec<TaskInfo> = indices
                        .iter()
                        .map(|i| TaskInfo {
                            task_id: format!("t{i}"),
                            name: String::new(),
                            command: "true".into(),
                            resources: Some(unit.to_wire()),
                            ..Default::default()
                        })
                        .collect();
                    if !indices.is_empty() {
                        accepted.insert(offer.offer_id.clone(), indices);
                    }
                    conn.feed(Message::Accept(Accept {
                        offer_id: offer.offer_id,
                        tasks: infos,
                    }))
                    .await?;
                }
                conn.feed(demand(tasks - next + retry.len() as u64)).await?;
                conn.flush().await?;
            }
            Message::Rescind(rescind) => {
                if let Some(indices) = accepted.remove(&rescind.offer_id) {
                    retry.extend(indices);
                    conn.send(demand(tasks - next + retry.len() as u64)).await?;
                }
            }
            // The answer to the Accept of a rescinded offer: its tasks are queued again above.
            Message::Error(e) if e.code == ErrorCode::InvalidOffer as i32 => {}
            Message::Update(update) => {
                let Some(status) = update.status else {
                    continue;
                };
                if status.state == TaskState::TaskFinished as i32 {
                    if finished_ids.insert(status.task_id.clone()) {
                        result.finished += 1;
                        result.last_finish = Some(Instant::now());
                    }
                } else if TaskState::try_from(status.state).is_ok_and(|s| s.is_terminal()) {
                    bail!(
                        "task {} ended {:?}: {}",
                        status.task_id,
                        status.state,
                        status.message
                    );
                }
                if !status.update_id.is_empty() {
                    conn.feed(Message::StatusAck(StatusAck {
                        task_id: status.task_id,
                        update_id: status.update_id,
                    }))
                    .await?;
                }
                // Flush acks in batches: right away only when nothing else is queued.
                conn.flush().await?;
            }
            Message::Error(e) => bail!("master error: {}", e.message),
            _ => {}
        }
    }
    conn.send(Message::Teardown(ringmaster_proto::Teardown {}))
        .await?;
    Ok(result)
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let security = args.security.load().map_err(anyhow::Error::msg)?;
    let _ = SECURITY.set(security);
    let agent_resources = Resources::parse(&args.agent_resources)?;
    let unit = Resources::parse(&args.task_resources)?;
    let registered = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut agents = Vec::new();
    for i in 0..args.agents {
        agents.push(tokio::spawn(sim_agent(
            args.master.clone(),
            i,
            agent_resources.clone(),
            registered.clone(),
        )));
    }
    while registered.load(Ordering::Relaxed) < args.agents as u64 {
        if let Some(dead) = agents.iter().position(|a| a.is_finished()) {
            let handle = agents.remove(dead);
            bail!("a simulated agent stopped: {:?}", handle.await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{} agents registered in {:.2} s",
        args.agents,
        start.elapsed().as_secs_f64()
    );
    if let Some(pid) = args.master_pid {
        // Let a few heartbeats pass so the figure includes steady-state buffers.
        tokio::time::sleep(Duration::from_secs(3)).await;
        match vm_rss_kib(pid) {
            Some(kib) => println!("master VmRSS: {:.1} MiB", kib as f64 / 1024.0),
            None => println!("master VmRSS: unavailable for pid {pid}"),
        }
    }
    if args.hold {
        tokio::signal::ctrl_c().await?;
        return Ok(());
    }
    let mut frameworks = Vec::new();
    for i in 0..args.frameworks {
        frameworks.push(tokio::spawn(sim_framework(
            args.master.clone(),
            i,
            args.tasks,
            unit.clone(),
        )));
    }
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for f in frameworks {
        let r = f.await??;
        total += r.finished;
        first = match (first, r.first_offer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        last = match (last, r.last_finish) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let elapsed = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    println!(
        "{total} tasks finished by {} frameworks on {} agents in {elapsed:.3} s: {:.0} tasks/s",
        args.frameworks,
        args.agents,
        total as f64 / elapsed.max(1e-9)
    );
    Ok(())
}
