//! Local mode (`ringmaster local`): a master and N agents in one process on loopback, like
//! `mesos-local`, and with `--demo` two example frameworks run to completion, after which it
//! ends (or, with `--hold`, stays up for the dashboard until Ctrl-C).
//! Ctrl-C (SIGINT) and SIGTERM both shut it down cleanly: the agents kill their tasks and the
//! temporary work directory is removed.
//!
//! Everything here goes through the real protocol over real TCP; local mode only saves
//! starting several processes by hand.

use ringmaster_proto::convert::ResourcesWire;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use ringmaster_proto::resources::Resources;
use ringmaster_sdk::{Driver, FrameworkConfig, Offer, Scheduler, TaskState, TaskStatus};
use tokio::sync::watch;

use crate::config::Config;
use crate::master::Master;

/// Options of `ringmaster local`.
pub struct LocalOptions {
    pub listen: String,
    /// Where to serve the operator HTTP surface (`None`: no HTTP).
    pub http: Option<String>,
    pub agents: usize,
    pub agent_resources: Resources,
    pub demo: bool,
    pub config: Config,
    pub work_dir: Option<PathBuf>,
}

/// A master with its in-process agents.
pub struct LocalCluster {
    pub master: Master,
    agents: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    stop_agents: watch::Sender<bool>,
    _work_dir: Option<tempfile::TempDir>,
}

impl LocalCluster {
    /// Starts the master and `agents` agents, and waits until every agent has registered.
    pub async fn start(options: &LocalOptions) -> anyhow::Result<LocalCluster> {
        if options.config.tls.is_some() || options.config.auth.required {
            anyhow::bail!(
                "local mode runs its agents and demo frameworks in-process without TLS or \
                 credentials: drop the tls: section and auth.required from its config"
            );
        }
        // With a work dir given, the master keeps its registry in `<dir>/master` (0700) and the
        // agents theirs in `<dir>/agent-N` (0711); the dir itself is 0711 so task users reach
        // their sandboxes by path (docs/security.md, "Files").
        if let Some(dir) = &options.work_dir {
            ringmaster_proto::files::create_work_dir(
                dir,
                ringmaster_proto::files::TRAVERSABLE_DIR_MODE,
            )
            .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let master = Master::start_durable(
            &options.listen,
            options.http.as_deref(),
            options.config.clone(),
            options.work_dir.as_ref().map(|dir| dir.join("master")),
        )
        .await?;
        // `ringmaster job run` works against a local cluster too (docs/jobs.md).
        master.start_jobs().await?;
        let (work_root, temp) = match &options.work_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("ringmaster-local-")
                    .tempdir()
                    .context("cannot create a work directory for the local agents")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut agents = Vec::new();
        for i in 0..options.agents {
            let work_dir = work_root.join(format!("agent-{i}"));
            // The agent tightens it at start; created with its mode (docs/security.md, "Files").
            ringmaster_proto::files::create_work_dir(
                &work_dir,
                ringmaster_proto::files::TRAVERSABLE_DIR_MODE,
            )
            .with_context(|| format!("cannot create {}", work_dir.display()))?;
            let config = ringmaster_agent::AgentConfig {
                master: master.addr().to_string(),
                id: Some(format!("local-agent-{i}")),
                hostname: format!("local-agent-{i}"),
                resources: options.agent_resources.clone(),
                devices: Vec::new(),
                device_selection: Default::default(),
                attributes: Vec::new(),
                work_dir,
                kill_grace: Duration::from_secs(3),
                reconnect_max_backoff: Duration::from_secs(2),
                security: Default::default(),
                task_user: ringmaster_agent::users::default_task_user(),
                allow_root_tasks: false,
                gpu_sharing: Default::default(),
                usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
                safeguards: Default::default(),
            };
            let mut stop = stop_rx.clone();
            agents.push(tokio::spawn(async move {
                ringmaster_agent::run(config, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
            }));
        }
        let cluster = LocalCluster {
            master,
            agents,
            stop_agents: stop_tx,
            _work_dir: temp,
        };
        cluster.wait_for_agents(options.agents).await?;
        Ok(cluster)
    }

    async fn wait_for_agents(&self, n: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let snapshot = self.master.snapshot().await?;
            if snapshot.agents.iter().filter(|a| a.connected).count() >= n {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "only {} of {n} local agents registered within 20 s",
                    snapshot.agents.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the agents (killing their tasks) and then the master.
    pub async fn shutdown(self) {
        let _ = self.stop_agents.send(true);
        for agent in self.agents {
            let _ = agent.await;
        }
        self.master.shutdown().await;
    }
}

/// What `ringmaster local --demo` does once its frameworks have finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterDemo {
    /// Keep the cluster up (the dashboard stays open) until SIGINT or SIGTERM (`--hold`).
    Hold,
    /// Shut down at once (the default).
    Exit,
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM, naming the signal.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGTERM; only Ctrl-C stops local mode cleanly");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// Runs `ringmaster local`: until SIGINT or SIGTERM; with `--demo` the demo frameworks first,
/// then, per `after_demo`, until a signal or at once. A signal always stops the agents (killing
/// their tasks) and the master, and removes the temporary work directory.
pub async fn run(options: LocalOptions, after_demo: AfterDemo) -> anyhow::Result<()> {
    // Handlers first, so a signal during start-up is not the default (immediate) exit.
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let cluster = tokio::select! {
        cluster = LocalCluster::start(&options) => cluster?,
        name = &mut signal => {
            eprintln!("ringmaster local: {name} while starting; stopped");
            return Ok(());
        }
    };
    let addr = cluster.master.addr();
    if !options.demo {
        println!(
            "ringmaster local: master on {addr} with {} agents of {}. Try:\n  ringmaster-exec --master {addr} --name hello --resources 'cpus:0.5;mem:64' --instances 4 -- echo hello",
            options.agents, options.agent_resources
        );
        if let Some(http) = cluster.master.http_addr() {
            println!("Dashboard: http://{http}/   Status: ringmaster status --master {http}");
        }
        println!("Ctrl-C stops.");
        let name = signal.await;
        stop(cluster, name).await;
        return Ok(());
    }
    let result = tokio::select! {
        result = demo(&cluster) => result,
        name = &mut signal => {
            stop(cluster, name).await;
            return Ok(());
        }
    };
    // A failed demo ends with its error at once; a good one holds the dashboard if asked.
    if after_demo == AfterDemo::Hold && result.is_ok() {
        println!();
        match cluster.master.http_addr() {
            Some(http) => println!("demo done; dashboard at http://{http}/ — Ctrl-C to stop"),
            None => println!("demo done; master on {addr} — Ctrl-C to stop"),
        }
        let name = signal.await;
        stop(cluster, name).await;
    } else {
        cluster.shutdown().await;
    }
    result
}

/// Shuts the cluster down after signal `name`, saying so.
async fn stop(cluster: LocalCluster, name: &str) {
    eprintln!("ringmaster local: {name}: stopping the agents and the master");
    cluster.shutdown().await;
}

/// One demo framework's plan.
struct DemoPlan {
    name: &'static str,
    resources: &'static str,
    tasks: u32,
    command: &'static str,
}

const DEMO: [DemoPlan; 2] = [
    DemoPlan {
        name: "web",
        resources: "cpus:0.5;mem:256",
        tasks: 12,
        command: "sleep 0.3",
    },
    DemoPlan {
        name: "batch",
        resources: "cpus:2;mem:1024",
        tasks: 6,
        command: "sleep 0.5",
    },
];

async fn demo(cluster: &LocalCluster) -> anyhow::Result<()> {
    let addr = cluster.master.addr().to_string();
    println!("ringmaster local --demo: master on {addr}");
    if let Some(http) = cluster.master.http_addr() {
        println!("dashboard on http://{http}/");
    }
    let mut runs = Vec::new();
    for plan in DEMO.iter() {
        let config = FrameworkConfig {
            master: addr.clone(),
            name: plan.name.to_string(),
            user: "demo".into(),
            partition: String::new(),
            weight: 1.0,
            failover_timeout: Duration::from_secs(10),
            framework_id: None,
            reconnect_max_backoff: Duration::from_secs(2),
            give_up_after: Some(Duration::from_secs(30)),
            security: Default::default(),
        };
        let scheduler = DemoScheduler {
            resources: Resources::parse(plan.resources)?,
            command: plan.command.to_string(),
            name: plan.name.to_string(),
            total: plan.tasks,
            launched: 0,
            states: HashMap::new(),
        };
        runs.push(tokio::spawn(ringmaster_sdk::run(config, scheduler)));
    }
    // Watch the shares while the frameworks run.
    let mut peak: HashMap<String, f64> = HashMap::new();
    let watch = async {
        loop {
            if let Ok(snapshot) = cluster.master.snapshot().await {
                for f in snapshot.frameworks {
                    let p = peak.entry(f.name).or_default();
                    *p = p.max(f.share);
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            results = futures::future::join_all(runs) => results,
            _ = watch => unreachable!("the watch loop never ends"),
        }
    })
    .await
    .context("the demo frameworks did not finish within 120 s")?;
    println!();
    println!(
        "{:<10} {:>6} {:>9} {:>7} {:>12}",
        "FRAMEWORK", "TASKS", "FINISHED", "FAILED", "PEAK SHARE"
    );
    let mut ok = true;
    for result in finished {
        let scheduler = result.context("demo framework panicked")??;
        let done = scheduler
            .states
            .values()
            .filter(|s| **s == TaskState::TaskFinished)
            .count();
        let failed = scheduler.states.len() - done;
        ok &= done as u32 == scheduler.total;
        println!(
            "{:<10} {:>6} {:>9} {:>7} {:>12.4}",
            scheduler.name,
            scheduler.total,
            done,
            failed,
            peak.get(&scheduler.name).copied().unwrap_or(0.0)
        );
    }
    let snapshot = cluster.master.snapshot().await?;
    println!();
    println!("{:<16} {:<28} {:<28}", "AGENT", "TOTAL", "FREE");
    for a in &snapshot.agents {
        println!("{:<16} {:<28} {:<28}", a.id, a.total, a.free);
    }
    if !ok {
        anyhow::bail!("some demo tasks did not finish");
    }
    Ok(())
}

/// Launches `total` copies of one task shape and stops when all have ended.
struct DemoScheduler {
    name: String,
    resources: Resources,
    command: String,
    total: u32,
    launched: u32,
    states: HashMap<String, TaskState>,
}

#[async_trait]
impl Scheduler for DemoScheduler {
    async fn registered(&mut self, driver: &Driver, _framework_id: &str) {
        let _ = driver.request(&self.resources, self.total);
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        for offer in offers {
            let offered = Resources::from_wire(offer.resources.as_ref()).unwrap_or_default();
            let room = offered.copies_of(&self.resources);
            let n = room.min(u64::from(self.total - self.launched)) as u32;
            if n == 0 {
                let _ = driver.decline(
                    std::slice::from_ref(&offer.offer_id),
                    Duration::from_secs(1),
                );
                continue;
            }
            let tasks = (self.launched..self.launched + n)
                .map(|i| {
                    ringmaster_sdk::task(
                        &format!("{}-{i}", self.name),
                        &self.command,
                        &self.resources,
                    )
                })
                .collect();
            self.launched += n;
            let _ = driver.accept(&offer.offer_id, tasks);
            let _ = driver.request(&self.resources, self.total - self.launched);
        }
    }

    async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
        self.states.insert(status.task_id.clone(), state);
        let ended = self.states.values().filter(|s| s.is_terminal()).count();
        if ended as u32 == self.total {
            let _ = driver.stop();
        }
    }
}
