//! The jobs framework: a framework built into the master process. It subscribes to its own
//! master like any framework (the same offer cycle, DRF and priorities; it appears in `/state`
//! as `ringmaster-jobs`), feeds the [`Engine`] offers and status updates, and carries out what
//! the engine decides. The master's HTTP API reaches it through a [`JobsHandle`].
//!
//! With a `--work-dir`, the job specs and the framework id are kept in `<work-dir>/jobs.json`
//! (written atomically at each change): a restarted master resubscribes with the same id, learns
//! by reconciliation which instances still run, and adopts them instead of launching them again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ringmaster_core::resources::Resources;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::v1::{Attribute, Offer, TaskHealth, TaskInfo, TaskState, TaskStatus};
use ringmaster_sdk::{Driver, FrameworkConfig, Scheduler};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::engine::{Engine, InstanceHealth, Job, JobReport, OfferView, Outcome};
use super::spec::JobSpec;

/// The jobs framework's name in `/state`.
pub const FRAMEWORK_NAME: &str = "ringmaster-jobs";
/// How long the master keeps the jobs framework's tasks while it is away (a master restart).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often restart delays and rolling updates are looked at.
const TICK: Duration = Duration::from_millis(250);
/// The file of jobs and framework id in the master's work dir.
pub const JOBS_FILE: &str = "jobs.json";

#[derive(Default, Serialize, Deserialize)]
struct Stored {
    framework_id: Option<String>,
    /// Starts of the jobs framework so far: task ids carry it, so none is reused.
    #[serde(default)]
    generation: u32,
    jobs: Vec<JobSpec>,
    /// Batch instances that ended for good, by job (reconciliation reports only live tasks).
    #[serde(default)]
    outcomes: BTreeMap<String, Vec<Outcome>>,
}

/// After (re)subscribing, offers are declined this long so that reconciliation answers (which
/// instances still run) arrive before anything is launched again.
const RECONCILE_GRACE: Duration = Duration::from_secs(2);

struct Shared {
    engine: Engine,
    generation: u32,
    /// No launches before this instant (see [`RECONCILE_GRACE`]).
    hold_until: Option<Instant>,
    driver: Option<Driver>,
    framework_id: Option<String>,
    store: Option<PathBuf>,
    demand: Option<(Resources, u32)>,
}

/// A handle on the jobs framework for the HTTP API: create, stop, scale, read.
#[derive(Clone)]
pub struct JobsHandle {
    shared: Arc<Mutex<Shared>>,
}

impl JobsHandle {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates or updates a job. `Ok(true)`: created.
    pub fn put(&self, spec: JobSpec) -> Result<bool, String> {
        spec.check()?;
        let mut shared = self.lock();
        let created = shared.engine.job(&spec.name).is_none();
        let kill = shared.engine.put(spec);
        shared.after_change(kill)?;
        Ok(created)
    }

    /// Stops a job (`purge`: and forgets it). `Ok(false)`: no such job.
    pub fn stop(&self, name: &str, purge: bool) -> Result<bool, String> {
        let mut shared = self.lock();
        let Some(kill) = shared.engine.stop(name, purge) else {
            return Ok(false);
        };
        shared.after_change(kill)?;
        Ok(true)
    }

    /// Sets a job's instance count. `Ok(false)`: no such job.
    pub fn scale(&self, name: &str, count: u32) -> Result<bool, String> {
        if count > super::spec::MAX_COUNT {
            return Err(format!("count {count} is above {}", super::spec::MAX_COUNT));
        }
        let mut shared = self.lock();
        let Some(kill) = shared.engine.scale(name, count) else {
            return Ok(false);
        };
        shared.after_change(kill)?;
        Ok(true)
    }

    /// The jobs framework's id and the task of instance `index` of job `name` whose output
    /// `job logs` reads: its current task, else the one it ran last.
    pub fn instance_task(&self, name: &str, index: u32) -> Result<(String, String), LogsLookup> {
        let shared = self.lock();
        let job = shared.engine.job(name).ok_or(LogsLookup::NoJob)?;
        let instance = job
            .instances
            .iter()
            .find(|i| i.index == index)
            .ok_or(LogsLookup::NoInstance(job.instances.len()))?;
        let task = instance
            .task_id
            .clone()
            .or_else(|| instance.last_task_id.clone())
            .ok_or(LogsLookup::NoTaskYet)?;
        let framework = shared.framework_id.clone().ok_or(LogsLookup::NoTaskYet)?;
        Ok((framework, task))
    }

    /// Every job with its instances, as the API reports them.
    pub fn jobs(&self) -> Vec<JobReport> {
        self.lock()
            .engine
            .jobs()
            .cloned()
            .map(Job::report)
            .collect()
    }
}

/// Why [`JobsHandle::instance_task`] found no task.
#[derive(Debug, PartialEq)]
pub enum LogsLookup {
    NoJob,
    /// The job has this many instances, none with the index asked for.
    NoInstance(usize),
    /// The instance has not been launched yet (or not since a master restart).
    NoTaskYet,
}

impl Shared {
    /// Persists the specs, kills what the change stopped, restates the demand.
    fn after_change(&mut self, kill: Vec<String>) -> Result<(), String> {
        self.save()?;
        self.kill(kill);
        self.sync_demand(Instant::now());
        Ok(())
    }

    fn kill(&self, tasks: Vec<String>) {
        if let Some(driver) = &self.driver {
            for task in tasks {
                let _ = driver.kill(&task);
            }
        }
    }

    fn sync_demand(&mut self, now: Instant) {
        let demand = self.engine.demand(now);
        if demand == self.demand {
            return;
        }
        let Some(driver) = &self.driver else { return };
        let _ = match &demand {
            Some((shape, count)) => driver.request(shape, *count),
            None => driver.request(&Resources::new(), 0),
        };
        self.demand = demand;
    }

    fn save(&self) -> Result<(), String> {
        let Some(path) = &self.store else {
            return Ok(());
        };
        let stored = Stored {
            framework_id: self.framework_id.clone(),
            generation: self.generation,
            jobs: self.engine.jobs().map(|j| j.spec.clone()).collect(),
            outcomes: self.engine.outcomes(),
        };
        let text = serde_json::to_string_pretty(&stored).map_err(|e| e.to_string())?;
        write_atomically(path, &text)
            .map_err(|e| format!("cannot save the jobs to {}: {e}", path.display()))
    }
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Starts the jobs framework against the master at `master` (its own protocol address).
/// With `work_dir`, jobs survive a restart (see the module docs). Ends at `shutdown`.
pub fn start(
    master: String,
    work_dir: Option<&Path>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<JobsHandle> {
    let store = work_dir.map(|dir| dir.join(JOBS_FILE));
    let stored: Stored = match &store {
        Some(path) if path.exists() => {
            let text = std::fs::read_to_string(path)?;
            serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not a jobs file: {e}", path.display()))?
        }
        _ => Stored::default(),
    };
    let generation = stored.generation + 1;
    let mut engine = Engine::with_generation(generation);
    for spec in stored.jobs {
        engine.put(spec);
    }
    for (name, outcomes) in &stored.outcomes {
        engine.restore_outcomes(name, outcomes);
    }
    let shared = Arc::new(Mutex::new(Shared {
        engine,
        generation,
        hold_until: None,
        driver: None,
        framework_id: stored.framework_id.clone(),
        store,
        demand: None,
    }));
    let handle = JobsHandle {
        shared: shared.clone(),
    };
    // The new generation is on disk before any task carries it.
    handle.lock().save().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut config = FrameworkConfig::new(master, FRAMEWORK_NAME);
    config.user = "jobs".into();
    config.failover_timeout = FAILOVER_TIMEOUT;
    config.framework_id = stored.framework_id;
    let scheduler = JobsScheduler {
        handle: handle.clone(),
    };
    let ticker = handle.clone();
    tokio::spawn(async move {
        let run = ringmaster_sdk::run(config, scheduler);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                result = &mut run => {
                    if let Err(e) = result {
                        tracing::error!(error = %e, "the jobs framework stopped");
                    }
                    return;
                }
                _ = tick.tick() => {
                    let mut shared = ticker.lock();
                    let kill = shared.engine.tick();
                    shared.kill(kill);
                    shared.sync_demand(Instant::now());
                }
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    });
    Ok(handle)
}

struct JobsScheduler {
    handle: JobsHandle,
}

impl JobsScheduler {
    fn subscribed(&self, driver: &Driver, framework_id: &str) {
        let mut shared = self.handle.lock();
        shared.driver = Some(driver.clone());
        shared.demand = None;
        shared.hold_until = Some(Instant::now() + RECONCILE_GRACE);
        if shared.framework_id.as_deref() != Some(framework_id) {
            shared.framework_id = Some(framework_id.to_string());
            if let Err(e) = shared.save() {
                tracing::error!("{e}");
            }
        }
        // Every task the master knows of ours: running instances are adopted.
        let _ = driver.reconcile(&[]);
        shared.sync_demand(Instant::now());
    }
}

#[async_trait::async_trait]
impl Scheduler for JobsScheduler {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        tracing::info!(framework = %framework_id, "jobs framework subscribed");
        self.subscribed(driver, framework_id);
    }

    async fn reregistered(&mut self, driver: &Driver, framework_id: &str) {
        self.subscribed(driver, framework_id);
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        let now = Instant::now();
        let resources: Vec<Resources> = offers
            .iter()
            .map(|o| Resources::from_wire(o.resources.as_ref()).unwrap_or_default())
            .collect();
        let views: Vec<OfferView<'_>> = offers
            .iter()
            .zip(&resources)
            .map(|(o, r)| OfferView {
                id: &o.offer_id,
                agent: &o.agent_id,
                resources: r,
            })
            .collect();
        let mut shared = self.handle.lock();
        if shared.hold_until.is_some_and(|until| now < until) {
            let ids: Vec<String> = offers.iter().map(|o| o.offer_id.clone()).collect();
            let _ = driver.decline(&ids, Duration::from_millis(500));
            return;
        }
        let placed = shared.engine.place(&views, now);
        let mut decline = Vec::new();
        for (offer_id, launches) in placed {
            if launches.is_empty() {
                decline.push(offer_id);
                continue;
            }
            let tasks: Vec<TaskInfo> = launches
                .iter()
                .filter_map(|l| {
                    let job = shared.engine.job(&l.job)?;
                    Some(task_info(&job.spec, &l.task_id))
                })
                .collect();
            for launch in &launches {
                tracing::info!(job = %launch.job, task = %launch.task_id, "launching instance");
            }
            let _ = driver.accept(&offer_id, tasks);
        }
        if !decline.is_empty() {
            let _ = driver.decline(&decline, Duration::from_secs(1));
        }
        shared.sync_demand(now);
    }

    async fn status_update(&mut self, _driver: &Driver, status: TaskStatus) {
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
        let terminal = state.is_terminal();
        let success = state == TaskState::TaskFinished && status.exit_code.unwrap_or(0) == 0;
        let mut shared = self.handle.lock();
        let kill = shared.engine.update(
            &status.task_id,
            state == TaskState::TaskRunning,
            terminal,
            success,
            status.exit_code,
            &status.message,
            &status.agent_id,
            Instant::now(),
        );
        let health = match TaskHealth::try_from(status.health) {
            Ok(TaskHealth::Healthy) => Some(InstanceHealth::Healthy),
            Ok(TaskHealth::Unhealthy) => Some(InstanceHealth::Unhealthy),
            _ => None,
        };
        shared.engine.set_health(&status.task_id, health);
        shared.kill(kill);
        if terminal {
            if let Err(e) = shared.save() {
                tracing::error!("{e}");
            }
        }
        shared.sync_demand(Instant::now());
    }

    async fn disconnected(&mut self, _driver: &Driver) {
        self.handle.lock().demand = None;
    }
}

/// The task an instance runs.
fn task_info(spec: &JobSpec, task_id: &str) -> TaskInfo {
    let mut info = ringmaster_sdk::task(task_id, &spec.task.command, &spec.resources());
    info.name = format!("{} ({})", spec.name, task_id);
    info.user = spec.task.user.clone().unwrap_or_default();
    info.priority_class = spec.task.priority_class.clone();
    info.kill_grace_ms = spec.task.kill_grace_ms;
    info.gpu_models = spec.task.gpu_models.clone();
    info.health = spec.task.health.as_ref().map(|h| h.to_wire());
    info.env = spec
        .task
        .env
        .iter()
        .map(|(k, v)| Attribute {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    info
}
