//! `ringmaster-stress`: bad input at scale, load, and faults against a real master process.
//!
//! Why a separate tool: `ringmaster-loadgen` measures raw throughput with instant tasks; this one
//! measures what an operator needs to trust the master (docs/reliability.md):
//! - `fuzz`: millions of random, mutated and wild frames ([`ringmaster_tools::fuzz`]) over many
//!   connections, while a well-behaved agent and framework must keep being answered; checks
//!   the master's stderr for panics and its RSS for growth.
//! - `load`: thousands of simulated agents with real heartbeats at the configured interval and
//!   frameworks running short tasks; reports agents and tasks held, heartbeats handled per
//!   second, p99 offer latency (demand to offer) and the master's RSS.
//! - `faults`: the same load while agents and frameworks are killed and restarted at random
//!   (and the master too, with `--kill-master`, which needs `serve --work-dir`); prints the
//!   ledger of every task launched and how it ended. Unaccounted must be 0.
//!
//! The master is a child `ringmaster serve` (next to this binary unless `--master-bin`), with
//! its HTTP surface on the next port for `/metrics`.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::{BinaryHeap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{
    Accept, AgentHeartbeat, Connection, Decline, Demand, Hello, Message, Ping, Pong, Reconcile,
    RegisterAgent, StatusAck, StatusUpdate, Subscribe, TaskInfo, TaskState, TaskStatus,
    PROTOCOL_VERSION,
};
use ringmaster_tools::fuzz::{fuzz_master, FuzzStats};
use tokio::net::TcpStream;

#[derive(Parser)]
#[command(
    name = "ringmaster-stress",
    about = "Fuzz, load and fault runs against a ringmaster master"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Random and mutated frames against a live master; bystanders must stay answered.
    Fuzz(FuzzArgs),
    /// Simulated agents and frameworks with real heartbeats and short tasks.
    Load(LoadArgs),
    /// The load, while agents and frameworks (and optionally the master) are killed and restarted.
    Faults(FaultArgs),
}

#[derive(Args, Clone)]
struct MasterArgs {
    /// The `ringmaster` binary to run as the master (default: next to this one).
    #[arg(long)]
    master_bin: Option<PathBuf>,
    /// Protocol port of the child master (HTTP on the next port).
    #[arg(long, default_value_t = 5170)]
    port: u16,
    /// Extra YAML appended to the child master's config file.
    #[arg(long, default_value = "")]
    config_extra: String,
}

#[derive(Args)]
struct FuzzArgs {
    #[command(flatten)]
    master: MasterArgs,
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Fuzz connections open at once.
    #[arg(long, default_value_t = 64)]
    connections: u64,
    /// Frames per connection at most (many end sooner: the master closes them).
    #[arg(long, default_value_t = 64)]
    per_connection: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A bystander round (ping, pong, demand, offer) slower than this fails the run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    stall: Duration,
}

#[derive(Args, Clone)]
struct LoadArgs {
    #[command(flatten)]
    master: MasterArgs,
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    #[arg(long, default_value_t = 100)]
    frameworks: usize,
    #[arg(long, default_value = "cpus:8;mem:16384")]
    agent_resources: String,
    #[arg(long, default_value = "cpus:1;mem:512")]
    task_resources: String,
    /// Tasks each framework keeps running.
    #[arg(long, default_value_t = 200)]
    tasks_per_framework: u32,
    /// Task lifetimes are uniform in [min, 2 × min].
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    task_lifetime: Duration,
    /// The master's `heartbeat_interval` (agents heartbeat at what the master tells them).
    #[arg(long, default_value = "1s")]
    heartbeat_interval: String,
    /// How long to measure once everyone is connected.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct FaultArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Time between faults.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    fault_every: Duration,
    /// How long a killed agent or framework stays down.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    down_for: Duration,
    /// Also kill -9 and restart the master now and then (needs `serve --work-dir`).
    #[arg(long)]
    kill_master: bool,
    /// With `--kill-master`: the share of faults that kill the master, in percent.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    master_kill_percent: u32,
    /// The master's work dir for `--kill-master`.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// After the faults stop: how long frameworks have to see every task end.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    drain: Duration,
}

// ------------------------------------------------------------------------------------ master

struct MasterProcess {
    child: Child,
    addr: String,
    http: String,
    stderr: PathBuf,
}

impl MasterProcess {
    fn spawn(
        args: &MasterArgs,
        heartbeat: &str,
        work_dir: Option<&PathBuf>,
    ) -> anyhow::Result<Self> {
        let bin = match &args.master_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe()?
                .parent()
                .context("binary directory")?
                .join("ringmaster"),
        };
        let dir = std::env::temp_dir().join(format!("ringmaster-stress-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("master.yaml");
        std::fs::write(
            &config,
            format!(
                "master:\n  heartbeat_interval: {heartbeat}\n  agent_timeout: 15s\n  offer_timeout: 10s\n{}\n",
                args.config_extra
            ),
        )?;
        let stderr = dir.join("master.stderr");
        let addr = format!("127.0.0.1:{}", args.port);
        let http = format!("127.0.0.1:{}", args.port + 1);
        let mut cmd = Command::new(&bin);
        cmd.args(["serve", "--listen", &addr, "--http", &http, "--config"])
            .arg(&config)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&stderr)?,
            );
        if let Some(w) = work_dir {
            cmd.arg("--work-dir").arg(w);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        Ok(MasterProcess {
            child,
            addr,
            http,
            stderr,
        })
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the master exited at start: {status}; see {}",
                    self.stderr.display()
                );
            }
            if TcpStream::connect(&self.addr).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the master did not listen on {} within 20 s", self.addr);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn rss_mib(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<f64>().ok())
            })
            .map(|kib| kib / 1024.0)
            .unwrap_or(f64::NAN)
    }

    fn panics(&self) -> usize {
        std::fs::read_to_string(&self.stderr)
            .map(|s| s.matches("panicked").count())
            .unwrap_or(0)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// One `/metrics` series summed over the lines that start with `prefix`.
    async fn metric(&self, prefix: &str) -> anyhow::Result<f64> {
        let url = format!("http://{}/metrics", self.http);
        let prefix = format!("ringmaster_{prefix}");
        tokio::task::spawn_blocking(move || -> anyhow::Result<f64> {
            let body = ureq::get(&url).call()?.body_mut().read_to_string()?;
            Ok(body
                .lines()
                .filter(|l| l.starts_with(&prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum())
        })
        .await?
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn connect(addr: &str) -> anyhow::Result<Connection<TcpStream>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    let mut conn = Connection::new(stream);
    conn.send(Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "ringmaster-stress".into(),
    }))
    .await?;
    match conn.recv().await? {
        Some(Message::HelloAck(_)) => Ok(conn),
        other => bail!("handshake failed: {other:?}"),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

// -------------------------------------------------------------------------------------- fuzz

/// A well-behaved agent and framework that must keep being answered during the fuzzing.
async fn bystanders(
    addr: String,
    stall: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(u64, Duration)> {
    let mut agent = connect(&addr).await?;
    agent
        .send(Message::RegisterAgent(RegisterAgent {
            agent_id: "bystander".into(),
            hostname: "bystander".into(),
            total: Some(Resources::parse("cpus:4;mem:4096")?.to_wire()),
            ..Default::default()
        }))
        .await?;
    let mut fw = connect(&addr).await?;
    fw.send(Message::Subscribe(Subscribe {
        name: "bystander".into(),
        user: "stress".into(),
        weight: 1.0,
        failover_timeout_secs: 60.0,
        ..Default::default()
    }))
    .await?;
    let unit = Resources::parse("cpus:1;mem:128")?;
    let (mut rounds, mut worst) = (0u64, Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        rounds += 1;
        let started = Instant::now();
        let round = async {
            agent
                .send(Message::AgentHeartbeat(AgentHeartbeat {
                    agent_id: "bystander".into(),
                    ..Default::default()
                }))
                .await?;
            agent.send(Message::Ping(Ping { nonce: rounds })).await?;
            loop {
                match agent.recv().await? {
                    Some(Message::Pong(p)) if p.nonce == rounds => break,
                    Some(_) => {}
                    None => bail!("the master closed the bystander agent"),
                }
            }
            fw.send(Message::Demand(Demand {
                resources: Some(unit.to_wire()),
                count: 1,
            }))
            .await?;
            loop {
                match fw.recv().await? {
                    Some(Message::Offers(o)) => {
                        fw.send(Message::Decline(Decline {
                            offer_ids: o.offers.into_iter().map(|o| o.offer_id).collect(),
                            refuse_seconds: 0.001,
                        }))
                        .await?;
                        break;
                    }
                    Some(_) => {}
                    None => bail!("the master closed the bystander framework"),
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(stall, round)
            .await
            .map_err(|_| anyhow::anyhow!("bystander round {rounds} stalled for {stall:?}"))??;
        worst = worst.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((rounds, worst))
}

async fn run_fuzz(args: FuzzArgs) -> anyhow::Result<()> {
    let mut master = MasterProcess::spawn(&args.master, "1s", None)?;
    master.wait_ready().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let watch = tokio::spawn(bystanders(master.addr.clone(), args.stall, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_start = master.rss_mib();
    println!(
        "master pid {}, RSS at start {rss_start:.1} MiB",
        master.pid()
    );
    let started = Instant::now();
    let mut total = FuzzStats::default();
    // Four quarters, RSS after each: a leak shows as steady growth.
    for quarter in 0..4u64 {
        let per_task = args.frames / 4 / args.connections;
        let tasks: Vec<_> = (0..args.connections)
            .map(|i| {
                tokio::spawn(fuzz_master(
                    master.addr.parse().expect("an address"),
                    args.seed
                        .wrapping_mul(1_000_003)
                        .wrapping_add(quarter * args.connections + i),
                    per_task,
                    args.per_connection,
                    args.stall,
                ))
            })
            .collect();
        for t in tasks {
            total.add(&t.await??);
        }
        if watch.is_finished() {
            break;
        }
        println!(
            "after {:>9} frames ({:.0} s): master RSS {:.1} MiB",
            total.frames,
            started.elapsed().as_secs_f64(),
            master.rss_mib()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (rounds, worst) = watch.await??;
    let elapsed = started.elapsed().as_secs_f64();
    let rejected = master.metric("frames_rejected_total").await?;
    println!(
        "frames {} on {} connections in {elapsed:.1} s ({:.0} frames/s); {} closed by the master \
         mid-script, {} replies; frames_rejected_total {rejected}",
        total.frames,
        total.connections,
        total.frames as f64 / elapsed,
        total.closed_by_master,
        total.replies
    );
    println!(
        "state the fuzzing left in the master: {} agents, {} frameworks, {} tasks",
        master.metric("agents{").await?,
        master.metric("frameworks{").await?,
        master.metric("tasks{").await?
    );
    println!(
        "bystanders: {rounds} rounds, slowest {:.1} ms; master RSS start {rss_start:.1} MiB, end {:.1} MiB; panics in master stderr: {}",
        worst.as_secs_f64() * 1000.0,
        master.rss_mib(),
        master.panics()
    );
    if master.panics() > 0 {
        bail!("the master panicked: see {}", master.stderr.display());
    }
    if let Some(status) = master.child.try_wait()? {
        bail!("the master exited: {status}");
    }
    Ok(())
}

// ------------------------------------------------------------------------------- load, faults

/// What every framework saw of every task it accepted; survives framework restarts.
#[derive(Default)]
struct FrameworkLedger {
    framework_id: String,
    next_task: u64,
    tasks: HashMap<String, TaskRecord>,
}

#[derive(Default, Clone)]
struct TaskRecord {
    /// Some update other than "the master does not know this task" was seen.
    launched: bool,
    terminal: Option<TaskState>,
    /// Two different terminal states were seen.
    conflicting: bool,
    /// The master said it does not know the task (reconciliation).
    unknown: bool,
}

#[derive(Default)]
struct Shared {
    latencies: Mutex<Vec<f64>>,
    measuring: AtomicBool,
    stopping: AtomicBool,
    heartbeats_sent: AtomicU64,
    agents_registered: AtomicU64,
    frameworks_subscribed: AtomicU64,
    errors: Mutex<HashMap<String, u64>>,
}

fn note_error(shared: &Shared, what: String) {
    let key: String = what.chars().take(60).collect();
    *shared.errors.lock().unwrap().entry(key).or_default() += 1;
}

/// A simulated agent: real heartbeats, tasks that run for their lifetime then finish. Keeps its
/// running tasks across reconnects (a master restart); loses them when killed (abort).
async fn sim_agent(
    addr: String,
    id: String,
    resources: Resources,
    lifetime: Duration,
    seed: u64,
    shared: Arc<Shared>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut running: HashMap<(String, String), Instant> = HashMap::new();
    let mut counter = 0u64;
    let incarnation: u64 = rng.random();
    let mut first = true;
    loop {
        let session = agent_session(
            &addr,
            &id,
            &resources,
            lifetime,
            &mut rng,
            &mut running,
            &mut counter,
            incarnation,
            &shared,
            first,
        )
        .await;
        first = false;
        if let Err(e) = session {
            note_error(&shared, format!("agent: {e}"));
        }
        if shared.stopping.load(Ordering::Relaxed) && running.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200 + rng.random_range(0..300))).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn agent_session(
    addr: &str,
    id: &str,
    resources: &Resources,
    lifetime: Duration,
    rng: &mut ChaCha8Rng,
    running: &mut HashMap<(String, String), Instant>,
    counter: &mut u64,
    incarnation: u64,
    shared: &Shared,
    first: bool,
) -> anyhow::Result<()> {
    let mut conn = connect(addr).await?;
    let status = |task: &(String, String), state: TaskState, counter: &mut u64| {
        *counter += 1;
        TaskStatus {
            task_id: task.1.clone(),
            framework_id: task.0.clone(),
            agent_id: id.to_string(),
            state: state as i32,
            update_id: format!("{id}-{incarnation}-{counter}"),
            ..Default::default()
        }
    };
    let reported: Vec<TaskStatus> = running
        .keys()
        .map(|k| status(k, TaskState::TaskRunning, counter))
        .collect();
    conn.send(Message::RegisterAgent(RegisterAgent {
        agent_id: id.to_string(),
        hostname: id.to_string(),
        total: Some(resources.to_wire()),
        attributes: vec![],
        tasks: reported,
        ..Default::default()
    }))
    .await?;
    let heartbeat = match conn.recv().await? {
        Some(Message::AgentRegistered(r)) => Duration::from_millis(r.heartbeat_interval_ms.max(10)),
        other => bail!("registration refused: {other:?}"),
    };
    if first {
        shared.agents_registered.fetch_add(1, Ordering::Relaxed);
    }
    let mut ticker = tokio::time::interval(heartbeat);
    ticker.tick().await;
    let mut due: BinaryHeap<std::cmp::Reverse<(Instant, (String, String))>> = running
        .iter()
        .map(|(k, at)| std::cmp::Reverse((*at, k.clone())))
        .collect();
    loop {
        let next = due.peek().map(|r| r.0 .0);
        tokio::select! {
            message = conn.recv() => match message? {
                None => bail!("master closed the agent connection"),
                Some(Message::RunTasks(run)) => {
                    for task in run.tasks {
                        let key = (task.framework_id.clone(), task.task_id.clone());
                        let span = lifetime.mul_f64(1.0 + rng.random::<f64>());
                        let at = Instant::now() + span;
                        running.insert(key.clone(), at);
                        due.push(std::cmp::Reverse((at, key.clone())));
                        conn.feed(Message::StatusUpdate(StatusUpdate {
                            status: Some(status(&key, TaskState::TaskRunning, counter)),
                        })).await?;
                    }
                    conn.flush().await?;
                }
                Some(Message::KillTask(kill)) => {
                    let key = (kill.framework_id.clone(), kill.task_id.clone());
                    if running.remove(&key).is_some() {
                        conn.send(Message::StatusUpdate(StatusUpdate {
                            status: Some(status(&key, TaskState::TaskKilled, counter)),
                        })).await?;
                    }
                }
                Some(Message::Ping(p)) => conn.send(Message::Pong(Pong { nonce: p.nonce })).await?,
                Some(_) => {}
            },
            _ = ticker.tick() => {
                conn.send(Message::AgentHeartbeat(AgentHeartbeat {
                    agent_id: id.to_string(),
                    free: None,
                    tasks: vec![],
                    ..Default::default()
                })).await?;
                shared.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
            }
            _ = sleep_until_opt(next) => {
                let now = Instant::now();
                while due.peek().is_some_and(|r| r.0 .0 <= now) {
                    let std::cmp::Reverse((_, key)) = due.pop().expect("peeked");
                    if running.remove(&key).is_some() {
                        conn.feed(Message::StatusUpdate(StatusUpdate {
                            status: Some(status(&key, TaskState::TaskFinished, counter)),
                        })).await?;
                    }
                }
                conn.flush().await?;
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A simulated framework keeping `target` tasks running; resubscribes with its id after a
/// restart or a lost connection. Returns when stopping and every accepted task is resolved.
async fn sim_framework(
    addr: String,
    index: usize,
    target: u32,
    unit: Resources,
    ledger: Arc<Mutex<FrameworkLedger>>,
    shared: Arc<Shared>,
) {
    loop {
        match framework_session(&addr, index, target, &unit, &ledger, &shared).await {
            Ok(()) => return,
            Err(e) => note_error(&shared, format!("framework: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn framework_session(
    addr: &str,
    index: usize,
    target: u32,
    unit: &Resources,
    ledger: &Mutex<FrameworkLedger>,
    shared: &Shared,
) -> anyhow::Result<()> {
    let mut conn = connect(addr).await?;
    let known_id = ledger.lock().unwrap().framework_id.clone();
    conn.send(Message::Subscribe(Subscribe {
        framework_id: known_id.clone(),
        name: format!("load-{index}"),
        user: "load".into(),
        weight: 1.0,
        failover_timeout_secs: 600.0,
        ..Default::default()
    }))
    .await?;
    match conn.recv().await? {
        Some(Message::Subscribed(s)) => {
            if known_id.is_empty() {
                shared.frameworks_subscribed.fetch_add(1, Ordering::Relaxed);
            }
            ledger.lock().unwrap().framework_id = s.framework_id;
        }
        other => bail!("subscribe refused: {other:?}"),
    }
    let unresolved = |l: &FrameworkLedger| {
        l.tasks
            .values()
            .filter(|t| t.terminal.is_none() && !t.unknown)
            .count() as u32
    };
    let mut waiting_since: Option<Instant> = None;
    let mut reconciled_at: Option<Instant> = None;
    let mut last_demand = u32::MAX;
    loop {
        let stopping = shared.stopping.load(Ordering::Relaxed);
        let open = unresolved(&ledger.lock().unwrap());
        if stopping && open == 0 {
            let _ = conn
                .send(Message::Demand(Demand {
                    resources: Some(unit.to_wire()),
                    count: 0,
                }))
                .await;
            return Ok(());
        }
        let want = if stopping {
            0
        } else {
            target.saturating_sub(open)
        };
        if want != last_demand {
            conn.send(Message::Demand(Demand {
                resources: Some(unit.to_wire()),
                count: want,
            }))
            .await?;
            last_demand = want;
            if want > 0 && waiting_since.is_none() {
                waiting_since = Some(Instant::now());
            }
        }
        if stopping && reconciled_at.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
            // Ask about every task not yet seen to end (answers arrive as updates).
            let ids: Vec<String> = ledger
                .lock()
                .unwrap()
                .tasks
                .iter()
                .filter(|(_, t)| t.terminal.is_none() && !t.unknown)
                .map(|(id, _)| id.clone())
                .collect();
            conn.send(Message::Reconcile(Reconcile { task_ids: ids }))
                .await?;
            reconciled_at = Some(Instant::now());
        }
        let message = match tokio::time::timeout(Duration::from_secs(1), conn.recv()).await {
            Err(_) => continue,
            Ok(m) => m?,
        };
        match message {
            None => bail!("master closed the framework connection"),
            Some(Message::Offers(offers)) => {
                if let Some(since) = waiting_since.take() {
                    if shared.measuring.load(Ordering::Relaxed) {
                        shared
                            .latencies
                            .lock()
                            .unwrap()
                            .push(since.elapsed().as_secs_f64());
                    }
                }
                let mut want = if stopping {
                    0
                } else {
                    target.saturating_sub(unresolved(&ledger.lock().unwrap()))
                };
                let mut decline = Vec::new();
                for offer in offers.offers {
                    let offered = Resources::from_wire(offer.resources.as_ref())?;
                    let n = offered.copies_of(unit).min(u64::from(want));
                    if n == 0 {
                        decline.push(offer.offer_id);
                        continue;
                    }
                    want -= n as u32;
                    let infos: Vec<TaskInfo> = {
                        let mut l = ledger.lock().unwrap();
                        (0..n)
                            .map(|_| {
                                l.next_task += 1;
                                let task_id = format!("f{index}-t{}", l.next_task);
                                l.tasks.insert(task_id.clone(), TaskRecord::default());
                                TaskInfo {
                                    task_id,
                                    command: "true".into(),
                                    resources: Some(unit.to_wire()),
                                    ..Default::default()
                                }
                            })
                            .collect()
                    };
                    conn.feed(Message::Accept(Accept {
                        offer_id: offer.offer_id,
                        tasks: infos,
                    }))
                    .await?;
                }
                if !decline.is_empty() {
                    conn.feed(Message::Decline(Decline {
                        offer_ids: decline,
                        refuse_seconds: 0.001,
                    }))
                    .await?;
                }
                conn.flush().await?;
                last_demand = u32::MAX;
            }
            Some(Message::Update(update)) => {
                let Some(status) = update.status else {
                    continue;
                };
                let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
                {
                    let mut l = ledger.lock().unwrap();
                    let t = l.tasks.entry(status.task_id.clone()).or_default();
                    if status.reason == "reconciliation" {
                        t.unknown = !t.launched;
                    } else {
                        t.launched = true;
                        if state.is_terminal() {
                            match t.terminal {
                                Some(seen) if seen != state => t.conflicting = true,
                                _ => t.terminal = Some(state),
                            }
                        }
                    }
                }
                if !status.update_id.is_empty() {
                    conn.send(Message::StatusAck(StatusAck {
                        task_id: status.task_id,
                        update_id: status.update_id,
                    }))
                    .await?;
                }
                if state.is_terminal() {
                    last_demand = u32::MAX;
                }
            }
            Some(Message::Error(e)) => note_error(
                shared,
                format!(
                    "master error: {}",
                    e.message.split(' ').take(3).collect::<Vec<_>>().join(" ")
                ),
            ),
            Some(Message::Ping(p)) => conn.send(Message::Pong(Pong { nonce: p.nonce })).await?,
            Some(_) => {}
        }
    }
}

struct Fleet {
    agents: Vec<tokio::task::JoinHandle<()>>,
    frameworks: Vec<tokio::task::JoinHandle<()>>,
    ledgers: Vec<Arc<Mutex<FrameworkLedger>>>,
}

fn spawn_agent(
    args: &LoadArgs,
    addr: &str,
    i: usize,
    shared: &Arc<Shared>,
    res: &Resources,
    salt: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(sim_agent(
        addr.to_string(),
        format!("sim-{i}"),
        res.clone(),
        args.task_lifetime,
        args.seed
            .wrapping_mul(31)
            .wrapping_add(i as u64)
            .wrapping_add(salt << 32),
        shared.clone(),
    ))
}

async fn start_fleet(
    args: &LoadArgs,
    master: &MasterProcess,
    shared: &Arc<Shared>,
) -> anyhow::Result<Fleet> {
    let res = Resources::parse(&args.agent_resources)?;
    let unit = Resources::parse(&args.task_resources)?;
    let started = Instant::now();
    let mut agents = Vec::with_capacity(args.agents);
    for i in 0..args.agents {
        agents.push(spawn_agent(args, &master.addr, i, shared, &res, 0));
        if i % 500 == 499 {
            tokio::task::yield_now().await;
        }
    }
    while shared.agents_registered.load(Ordering::Relaxed) < args.agents as u64 {
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "only {} agents registered in 120 s",
                shared.agents_registered.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{} agents registered in {:.2} s",
        args.agents,
        started.elapsed().as_secs_f64()
    );
    let ledgers: Vec<_> = (0..args.frameworks)
        .map(|_| Arc::new(Mutex::new(FrameworkLedger::default())))
        .collect();
    let frameworks = ledgers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            tokio::spawn(sim_framework(
                master.addr.clone(),
                i,
                args.tasks_per_framework,
                unit.clone(),
                l.clone(),
                shared.clone(),
            ))
        })
        .collect();
    Ok(Fleet {
        agents,
        frameworks,
        ledgers,
    })
}

struct Sample {
    at: Instant,
    heartbeats: f64,
}

async fn sample(master: &MasterProcess) -> anyhow::Result<Sample> {
    Ok(Sample {
        at: Instant::now(),
        heartbeats: master
            .metric("messages_received_total{kind=\"AgentHeartbeat\"}")
            .await?,
    })
}

async fn report_load(
    master: &MasterProcess,
    shared: &Shared,
    from: &Sample,
    label: &str,
) -> anyhow::Result<()> {
    let to = sample(master).await?;
    let secs = to.at.duration_since(from.at).as_secs_f64();
    let agents = master.metric("agents{state=\"connected\"}").await?;
    let running = master.metric("tasks{state=\"running\"}").await?;
    let staging = master.metric("tasks{state=\"staging\"}").await?;
    let launched = master.metric("tasks_launched_total").await?;
    let mut lat = shared.latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    let heartbeats = to.heartbeats - from.heartbeats;
    let heartbeats = if heartbeats >= 0.0 {
        format!("{:.0}/s", heartbeats / secs)
    } else {
        "n/a (the master restarted)".to_string()
    };
    println!(
        "{label}: {agents} agents connected, {running} tasks running (+{staging} staging), {launched} launched in all; \
         heartbeats handled {heartbeats} (sent {}); offer latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} offers; master RSS {:.1} MiB",
        shared.heartbeats_sent.load(Ordering::Relaxed),
        percentile(&lat, 0.5) * 1000.0,
        percentile(&lat, 0.99) * 1000.0,
        lat.last().copied().unwrap_or(f64::NAN) * 1000.0,
        lat.len(),
        master.rss_mib()
    );
    Ok(())
}

async fn run_load(args: LoadArgs) -> anyhow::Result<()> {
    let mut master = MasterProcess::spawn(&args.master, &args.heartbeat_interval, None)?;
    master.wait_ready().await?;
    let shared = Arc::new(Shared::default());
    let fleet = start_fleet(&args, &master, &shared).await?;
    // Warm up: every framework subscribed and a few heartbeat intervals passed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    shared.measuring.store(true, Ordering::Relaxed);
    let from = sample(&master).await?;
    tokio::time::sleep(args.duration).await;
    report_load(
        &master,
        &shared,
        &from,
        &format!("load ({} s)", args.duration.as_secs()),
    )
    .await?;
    print_errors(&shared);
    println!("panics in master stderr: {}", master.panics());
    drop(fleet);
    master.kill();
    Ok(())
}

fn print_errors(shared: &Shared) {
    let errors = shared.errors.lock().unwrap();
    let mut list: Vec<_> = errors.iter().collect();
    list.sort_by(|a, b| b.1.cmp(a.1));
    for (what, n) in list.iter().take(8) {
        println!("  {n:>6} × {what}");
    }
}

async fn run_faults(args: FaultArgs) -> anyhow::Result<()> {
    let load = args.load.clone();
    if args.kill_master && args.work_dir.is_none() {
        bail!("--kill-master needs --work-dir DIR (the master's durable registry)");
    }
    let mut master = MasterProcess::spawn(
        &load.master,
        &load.heartbeat_interval,
        args.work_dir.as_ref(),
    )?;
    master.wait_ready().await?;
    let shared = Arc::new(Shared::default());
    let mut fleet = start_fleet(&load, &master, &shared).await?;
    let res = Resources::parse(&load.agent_resources)?;
    let unit = Resources::parse(&load.task_resources)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    shared.measuring.store(true, Ordering::Relaxed);
    let from = sample(&master).await?;
    let mut rng = ChaCha8Rng::seed_from_u64(load.seed ^ 0xfa17);
    let (mut agent_kills, mut framework_kills, mut master_kills) = (0u64, 0u64, 0u64);
    let mut down: Vec<(Instant, bool, usize)> = Vec::new();
    let end = Instant::now() + load.duration;
    let mut salt = 1u64;
    while Instant::now() < end {
        tokio::time::sleep(args.fault_every).await;
        let now = Instant::now();
        // Bring back what has been down long enough.
        let mut i = 0;
        while i < down.len() {
            if now >= down[i].0 {
                let (_, is_agent, idx) = down.remove(i);
                salt += 1;
                if is_agent {
                    fleet.agents[idx] = spawn_agent(&load, &master.addr, idx, &shared, &res, salt);
                } else {
                    fleet.frameworks[idx] = tokio::spawn(sim_framework(
                        master.addr.clone(),
                        idx,
                        load.tasks_per_framework,
                        unit.clone(),
                        fleet.ledgers[idx].clone(),
                        shared.clone(),
                    ));
                }
            } else {
                i += 1;
            }
        }
        let roll = rng.random_range(0..100);
        if args.kill_master && roll < args.master_kill_percent {
            master.kill();
            master_kills += 1;
            master = MasterProcess::spawn(
                &load.master,
                &load.heartbeat_interval,
                args.work_dir.as_ref(),
            )?;
            master.wait_ready().await?;
        } else if roll < 60 {
            let idx = rng.random_range(0..fleet.agents.len());
            if !down.iter().any(|d| d.1 && d.2 == idx) {
                fleet.agents[idx].abort();
                down.push((now + args.down_for, true, idx));
                agent_kills += 1;
            }
        } else {
            let idx = rng.random_range(0..fleet.frameworks.len());
            if !down.iter().any(|d| !d.1 && d.2 == idx) {
                fleet.frameworks[idx].abort();
                down.push((now + args.down_for, false, idx));
                framework_kills += 1;
            }
        }
    }
    report_load(&master, &shared, &from, "under faults").await?;
    // Everything comes back; frameworks stop asking and wait to see every task end.
    salt += 1;
    for (_, is_agent, idx) in down.drain(..) {
        if is_agent {
            fleet.agents[idx] = spawn_agent(&load, &master.addr, idx, &shared, &res, salt);
        } else {
            fleet.frameworks[idx] = tokio::spawn(sim_framework(
                master.addr.clone(),
                idx,
                load.tasks_per_framework,
                unit.clone(),
                fleet.ledgers[idx].clone(),
                shared.clone(),
            ));
        }
    }
    shared.stopping.store(true, Ordering::Relaxed);
    let drain_end = Instant::now() + args.drain;
    while fleet.frameworks.iter().any(|f| !f.is_finished()) && Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut accepted, mut launched, mut never_launched) = (0u64, 0u64, 0u64);
    let mut ended: HashMap<&'static str, u64> = HashMap::new();
    let (mut unaccounted, mut conflicting) = (0u64, 0u64);
    for l in &fleet.ledgers {
        for t in l.lock().unwrap().tasks.values() {
            accepted += 1;
            if t.conflicting {
                conflicting += 1;
            }
            match (t.launched, t.terminal) {
                (false, _) if t.unknown => never_launched += 1,
                (true, Some(state)) => {
                    launched += 1;
                    *ended.entry(state.short_name()).or_default() += 1;
                }
                (true, None) => {
                    launched += 1;
                    unaccounted += 1;
                }
                (false, _) => unaccounted += 1,
            }
        }
    }
    println!(
        "faults: {agent_kills} agent kills, {framework_kills} framework kills, {master_kills} master kills over {} s",
        load.duration.as_secs()
    );
    println!(
        "ledger: accepted {accepted}, launched {launched}, finished {}, failed {}, killed {}, lost {}, \
         never launched (offer gone) {never_launched}, conflicting {conflicting}, unaccounted {unaccounted}",
        ended.get("FINISHED").copied().unwrap_or(0),
        ended.get("FAILED").copied().unwrap_or(0),
        ended.get("KILLED").copied().unwrap_or(0),
        ended.get("LOST").copied().unwrap_or(0),
    );
    print_errors(&shared);
    println!("panics in master stderr: {}", master.panics());
    for a in &fleet.agents {
        a.abort();
    }
    if unaccounted > 0 || conflicting > 0 {
        bail!("{unaccounted} tasks unaccounted, {conflicting} with conflicting ends");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Fuzz(args) => run_fuzz(args).await,
        Cmd::Load(args) => run_load(args).await,
        Cmd::Faults(args) => run_faults(args).await,
    }
}
