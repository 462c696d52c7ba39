//! The jobs framework: a framework built into the master process. It subscribes to its own
//! master like any framework (the same offer cycle, DRF and priorities; it appears in `/state`
//! as `ringmaster-jobs`), feeds the [`Engine`] offers and status updates, and carries out what
//! the engine decides. The master's HTTP API reaches it through a [`JobsHandle`].
//!
//! With a `--work-dir`, the jobs and the framework id are kept in the master's registry
//! ([`super::records`], written through the actor's group commit by a [`JobsStore`]): a change
//! is reported accepted only once it is committed, and nothing it starts is launched before.
//! A restarted master resubscribes with the same id, learns by reconciliation which instances
//! still run, and adopts them instead of launching them again.
//!
//! Partitions: the master keeps a framework to one partition, so the jobs framework is one
//! framework per partition that has jobs (the default partition's is always there, named
//! `ringmaster-jobs`; another's is `ringmaster-jobs/<partition>`), each subscribed with its
//! own id (kept in [`JobsMeta`]), offered only its partition's agents, asking for and placing
//! only its partition's jobs. They share one [`Engine`] and one registry record.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ringmaster_core::resources::Resources;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::v1::{Attribute, Offer, TaskHealth, TaskInfo, TaskState, TaskStatus};
use ringmaster_sdk::{Driver, FrameworkConfig, Scheduler};
use tokio::sync::watch;
use tokio::time::Instant;

use super::engine::{Engine, InstanceHealth, Job, JobReport, OfferView};
use super::records::JobRecord;
use super::spec::{JobSpec, DEFAULT_PARTITION};
use super::store::{JobsMeta, JobsStore, LoadedJobs};

/// The jobs framework's name in `/state`.
pub const FRAMEWORK_NAME: &str = "ringmaster-jobs";
/// The user the jobs framework subscribes as.
pub const JOBS_USER: &str = "jobs";
/// How long the master keeps the jobs framework's tasks while it is away (a master restart).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often restart delays and rolling updates are looked at.
const TICK: Duration = Duration::from_millis(250);

/// After (re)subscribing, offers are declined this long so that reconciliation answers (which
/// instances still run) arrive before anything is launched again.
const RECONCILE_GRACE: Duration = Duration::from_secs(2);

struct Shared {
    engine: Engine,
    generation: u32,
    /// The framework of each partition (started or only known from the registry).
    frameworks: BTreeMap<String, PartitionFramework>,
    /// Live tasks -> the partition whose framework launched or reported them: where a kill
    /// goes.
    tasks: HashMap<String, String>,
    /// A job change is being committed: no launches until it is (offers are declined).
    writing: bool,
}

/// The jobs framework of one partition.
#[derive(Default)]
struct PartitionFramework {
    /// Subscribing (its session task runs).
    started: bool,
    /// No launches before this instant (see [`RECONCILE_GRACE`]).
    hold_until: Option<Instant>,
    driver: Option<Driver>,
    framework_id: Option<String>,
    demand: Option<(Resources, u32)>,
}

/// What a partition's framework subscribes with: the shared configuration (master, user,
/// security, failover timeout) and the end of the master.
struct Launcher {
    template: FrameworkConfig,
    shutdown: watch::Receiver<bool>,
}

/// The name of the jobs framework of `partition` in `/state`.
pub fn framework_name(partition: &str) -> String {
    if partition == DEFAULT_PARTITION {
        FRAMEWORK_NAME.to_string()
    } else {
        format!("{FRAMEWORK_NAME}/{partition}")
    }
}

/// A handle on the jobs framework for the HTTP API: create, stop, scale, read.
#[derive(Clone)]
pub struct JobsHandle {
    shared: Arc<Mutex<Shared>>,
    store: Arc<dyn JobsStore>,
    /// One write at a time, each from the state after the previous one: the registry sees
    /// the changes in the order they were made.
    gate: Arc<tokio::sync::Mutex<()>>,
    starter: Starter,
}

/// Why a job change was not made.
#[derive(Debug, PartialEq)]
pub enum ChangeError {
    /// A bad spec or count (the client's fault).
    Refused(String),
    /// The registry did not record it (the master is stopping).
    NotRecorded(String),
}

/// A handle's way to start the framework of a partition that gets its first job.
#[derive(Clone)]
struct Starter(Arc<Launcher>);

impl JobsHandle {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates or updates a job. `Ok(true)`: created. Answers once the job is committed.
    pub async fn put(&self, spec: JobSpec) -> Result<bool, ChangeError> {
        spec.check().map_err(ChangeError::Refused)?;
        let name = spec.name.clone();
        let created = self
            .change(name, move |engine| {
                let created = engine.job(&spec.name).is_none();
                Some((created, engine.put(spec)))
            })
            .await?;
        Ok(created.unwrap_or(false))
    }

    /// Stops a job (`purge`: and forgets it). `Ok(false)`: no such job.
    pub async fn stop(&self, name: &str, purge: bool) -> Result<bool, ChangeError> {
        let job = name.to_string();
        let stopped = self
            .change(job.clone(), move |engine| {
                engine.stop(&job, purge).map(|kill| ((), kill))
            })
            .await?;
        Ok(stopped.is_some())
    }

    /// Sets a job's instance count. `Ok(false)`: no such job.
    pub async fn scale(&self, name: &str, count: u32) -> Result<bool, ChangeError> {
        if count > super::spec::MAX_COUNT {
            return Err(ChangeError::Refused(format!(
                "count {count} is above {}",
                super::spec::MAX_COUNT
            )));
        }
        let job = name.to_string();
        let scaled = self
            .change(job.clone(), move |engine| {
                engine.scale(&job, count).map(|kill| ((), kill))
            })
            .await?;
        Ok(scaled.is_some())
    }

    /// Applies `change` to job `name` (`None`: no such job), commits the job's record, and
    /// only then kills what the change stopped and restates the demand; no launch happens
    /// before the commit either. Runs on its own task, so a caller that goes away (an HTTP
    /// client that hangs up) cannot leave a change half done.
    async fn change<T: Send + 'static>(
        &self,
        name: String,
        change: impl FnOnce(&mut Engine) -> Option<(T, Vec<String>)> + Send + 'static,
    ) -> Result<Option<T>, ChangeError> {
        let handle = self.clone();
        tokio::spawn(async move {
            let _gate = handle.gate.lock().await;
            let (out, kill, record) = {
                let mut shared = handle.lock();
                let Some((out, kill)) = change(&mut shared.engine) else {
                    return Ok(None);
                };
                let record =
                    JobRecord::encode(&shared.engine, &name).map_err(ChangeError::NotRecorded)?;
                shared.writing = true;
                (out, kill, record)
            };
            let saved = handle.store.save(vec![(name, record)], None).await;
            let mut shared = handle.lock();
            shared.writing = false;
            saved.map_err(ChangeError::NotRecorded)?;
            shared.kill(kill);
            shared.sync_demand(Instant::now());
            drop(shared);
            // A job in a partition without a framework yet: subscribe one.
            handle.start_frameworks();
            Ok(Some(out))
        })
        .await
        .map_err(|e| ChangeError::NotRecorded(e.to_string()))?
    }

    /// Commits the current record of job `name` (after a batch instance ended for good). The
    /// caller holds the gate.
    async fn save_job(&self, name: &str) -> Result<(), String> {
        let record = JobRecord::encode(&self.lock().engine, name)?;
        if record.is_none() {
            // Purged: its deletion was committed with the purge.
            return Ok(());
        }
        self.store
            .save(vec![(name.to_string(), record)], None)
            .await
    }

    /// Commits the framework's own record (its ids, its start count).
    async fn save_meta(&self) -> Result<(), String> {
        let _gate = self.gate.lock().await;
        let meta = {
            let shared = self.lock();
            let id = |p: &PartitionFramework| p.framework_id.clone();
            JobsMeta {
                framework_id: shared.frameworks.get(DEFAULT_PARTITION).and_then(id),
                generation: shared.generation,
                partitions: shared
                    .frameworks
                    .iter()
                    .filter(|(p, _)| p.as_str() != DEFAULT_PARTITION)
                    .filter_map(|(p, f)| Some((p.clone(), id(f)?)))
                    .collect(),
            }
        };
        self.store.save(Vec::new(), Some(meta)).await
    }

    /// Starts the framework of every partition that has jobs, and of the default partition,
    /// that is not started yet.
    fn start_frameworks(&self) {
        let mut shared = self.lock();
        let mut partitions = shared.engine.partitions();
        partitions.insert(DEFAULT_PARTITION.to_string());
        for partition in partitions {
            let framework = shared.frameworks.entry(partition.clone()).or_default();
            if framework.started {
                continue;
            }
            framework.started = true;
            let mut config = self.starter.0.template.clone();
            config.name = framework_name(&partition);
            config.partition = partition.clone();
            config.framework_id = framework.framework_id.clone();
            tracing::info!(%partition, framework = %config.name, "starting a jobs framework");
            let scheduler = JobsScheduler {
                handle: self.clone(),
                partition,
            };
            let mut shutdown = self.starter.0.shutdown.clone();
            tokio::spawn(async move {
                let name = config.name.clone();
                tokio::select! {
                    result = ringmaster_sdk::run(config, scheduler) => {
                        if let Err(e) = result {
                            tracing::error!(framework = %name, error = %e, "a jobs framework stopped");
                        }
                    }
                    _ = shutdown.wait_for(|stop| *stop) => {}
                }
            });
        }
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
        let partition = shared.tasks.get(&task).unwrap_or(&job.spec.partition);
        let framework = shared
            .frameworks
            .get(partition)
            .and_then(|f| f.framework_id.clone())
            .ok_or(LogsLookup::NoTaskYet)?;
        Ok((framework, task))
    }

    /// Every job with its instances, as the API reports them. Waits for a change being
    /// committed, so what it shows (a job created, a batch instance ended) is on disk.
    pub async fn jobs(&self) -> Vec<JobReport> {
        let _gate = self.gate.lock().await;
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
    /// Kills tasks, each through the framework of its partition (where it was launched or
    /// reported from; else its job's).
    fn kill(&self, tasks: Vec<String>) {
        for task in tasks {
            let partition = self.tasks.get(&task).map(String::as_str).or_else(|| {
                let job = super::engine::parse_task_id(&task)?.0;
                Some(self.engine.job(job)?.spec.partition.as_str())
            });
            let driver = self
                .frameworks
                .get(partition.unwrap_or(DEFAULT_PARTITION))
                .and_then(|f| f.driver.as_ref());
            if let Some(driver) = driver {
                let _ = driver.kill(&task);
            }
        }
    }

    /// Restates each connected partition framework's demand when it changed.
    fn sync_demand(&mut self, now: Instant) {
        for (partition, framework) in self.frameworks.iter_mut() {
            let demand = self.engine.demand(partition, now);
            if demand == framework.demand {
                continue;
            }
            let Some(driver) = &framework.driver else {
                continue;
            };
            let _ = match &demand {
                Some((shape, count)) => driver.request(shape, *count),
                None => driver.request(&Resources::new(), 0),
            };
            framework.demand = demand;
        }
    }
}

/// Starts the jobs framework against the master at `master` (its own protocol address,
/// reached as `security` says: in the master, through an in-process dialer, with a credential
/// when the master requires authentication), with the jobs `loaded` from the registry, keeping them through `store` (see the module docs).
/// Ends at `shutdown`.
pub async fn start(
    master: String,
    security: ringmaster_proto::transport::ClientSecurity,
    store: Arc<dyn JobsStore>,
    loaded: LoadedJobs,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<JobsHandle> {
    let meta = loaded.meta.unwrap_or_default();
    let generation = meta.generation + 1;
    let mut engine = Engine::with_generation(generation);
    for (name, value) in loaded.jobs {
        JobRecord::decode(&name, value)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .restore(&mut engine);
    }
    // The ids of the partitions' frameworks (an older registry has the default one only).
    let mut frameworks: BTreeMap<String, PartitionFramework> = BTreeMap::new();
    let ids = meta
        .partitions
        .iter()
        .map(|(p, id)| (p.clone(), Some(id.clone())))
        .chain([(DEFAULT_PARTITION.to_string(), meta.framework_id.clone())]);
    for (partition, framework_id) in ids {
        frameworks.insert(
            partition,
            PartitionFramework {
                framework_id,
                ..PartitionFramework::default()
            },
        );
    }
    let shared = Arc::new(Mutex::new(Shared {
        engine,
        generation,
        frameworks,
        tasks: HashMap::new(),
        writing: false,
    }));
    let mut template = FrameworkConfig::new(master, FRAMEWORK_NAME);
    template.user = JOBS_USER.into();
    template.security = security;
    template.failover_timeout = FAILOVER_TIMEOUT;
    let handle = JobsHandle {
        shared: shared.clone(),
        store,
        gate: Arc::default(),
        starter: Starter(Arc::new(Launcher {
            template,
            shutdown: shutdown.clone(),
        })),
    };
    // The new generation is on disk before any task carries it.
    handle
        .save_meta()
        .await
        .map_err(|e| anyhow::anyhow!("jobs: {e}"))?;
    // The default partition's framework, and one for every partition with jobs.
    handle.start_frameworks();
    let ticker = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
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

/// The framework of one partition.
struct JobsScheduler {
    handle: JobsHandle,
    partition: String,
}

impl JobsScheduler {
    /// Feeds a status update to the engine; returns the job whose batch outcomes it changed.
    fn apply_update(&self, status: &TaskStatus) -> Option<String> {
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::Unspecified);
        let terminal = state.is_terminal();
        let success = state == TaskState::TaskFinished && status.exit_code.unwrap_or(0) == 0;
        let mut shared = self.handle.lock();
        if !terminal {
            // Its kill goes through this partition's framework.
            shared
                .tasks
                .insert(status.task_id.clone(), self.partition.clone());
        }
        let ended_before = terminal.then(|| shared.engine.outcomes());
        let failed_before = terminal.then(|| failed_of(&shared.engine, &status.task_id));
        let job_name =
            super::engine::parse_task_id(&status.task_id).map(|(job, ..)| job.to_string());
        let restarts_before = job_name.as_deref().map(|job| shared.engine.restarts(job));
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
            shared.tasks.remove(&status.task_id);
        }
        shared.sync_demand(Instant::now());
        let job = job_name?;
        // A restart is committed too (its count survives a restart or a leader change).
        if restarts_before.as_ref() != Some(&shared.engine.restarts(&job)) {
            return Some(job);
        }
        let before = ended_before?;
        let gave_up = failed_before? != failed_of(&shared.engine, &status.task_id);
        (gave_up || before.get(job.as_str()) != shared.engine.outcomes().get(job.as_str()))
            .then_some(job)
    }

    async fn subscribed(&self, driver: &Driver, framework_id: &str) {
        let new_id = {
            let mut shared = self.handle.lock();
            let framework = shared.frameworks.entry(self.partition.clone()).or_default();
            framework.driver = Some(driver.clone());
            framework.demand = None;
            framework.hold_until = Some(Instant::now() + RECONCILE_GRACE);
            let new_id = framework.framework_id.as_deref() != Some(framework_id);
            framework.framework_id = Some(framework_id.to_string());
            new_id
        };
        if new_id {
            if let Err(e) = self.handle.save_meta().await {
                tracing::error!("jobs: the framework id: {e}");
            }
        }
        // Every task the master knows of ours: running instances are adopted.
        let _ = driver.reconcile(&[]);
        self.handle.lock().sync_demand(Instant::now());
    }
}

#[async_trait::async_trait]
impl Scheduler for JobsScheduler {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        tracing::info!(framework = %framework_id, partition = %self.partition,
            "jobs framework subscribed");
        self.subscribed(driver, framework_id).await;
    }

    async fn reregistered(&mut self, driver: &Driver, framework_id: &str) {
        self.subscribed(driver, framework_id).await;
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        let now = Instant::now();
        let resources: Vec<Resources> = offers
            .iter()
            .map(|o| Resources::from_wire(o.resources.as_ref()).unwrap_or_default())
            .collect();
        let attributes: Vec<Vec<(String, String)>> = offers
            .iter()
            .map(|o| {
                o.attributes
                    .iter()
                    .map(|a| (a.key.clone(), a.value.clone()))
                    .collect()
            })
            .collect();
        let views: Vec<OfferView<'_>> = offers
            .iter()
            .zip(&resources)
            .zip(&attributes)
            .map(|((o, r), a)| OfferView {
                id: &o.offer_id,
                agent: &o.agent_id,
                resources: r,
                hostname: &o.hostname,
                attributes: a,
            })
            .collect();
        let mut shared = self.handle.lock();
        if shared.writing {
            // A job change is not committed yet: launch nothing it may have asked for.
            let ids: Vec<String> = offers.iter().map(|o| o.offer_id.clone()).collect();
            let _ = driver.decline(&ids, Duration::from_millis(100));
            return;
        }
        let held = shared
            .frameworks
            .get(&self.partition)
            .and_then(|f| f.hold_until)
            .is_some_and(|until| now < until);
        if held {
            let ids: Vec<String> = offers.iter().map(|o| o.offer_id.clone()).collect();
            let _ = driver.decline(&ids, Duration::from_millis(500));
            return;
        }
        let placed = shared.engine.place(&self.partition, &views, now);
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
                tracing::info!(job = %launch.job, task = %launch.task_id,
                    partition = %self.partition, "launching instance");
                shared
                    .tasks
                    .insert(launch.task_id.clone(), self.partition.clone());
            }
            let _ = driver.accept(&offer_id, tasks);
        }
        if !decline.is_empty() {
            let _ = driver.decline(&decline, Duration::from_secs(1));
        }
        shared.sync_demand(now);
    }

    async fn status_update(&mut self, _driver: &Driver, status: TaskStatus) {
        // A batch instance that ended for good is committed before the update is
        // acknowledged (reconciliation will not tell a restarted master about it), and is
        // shown (`GET /jobs`, `job run --wait`) only once committed: the gate is held throughout.
        let _gate = self.handle.gate.lock().await;
        if let Some(job) = self.apply_update(&status) {
            if let Err(e) = self.handle.save_job(&job).await {
                tracing::error!(%job, "jobs: {e}");
            }
        }
    }

    async fn disconnected(&mut self, _driver: &Driver) {
        if let Some(framework) = self.handle.lock().frameworks.get_mut(&self.partition) {
            framework.demand = None;
        }
    }
}

/// Whether the job of `task_id` has given up: a change of it is committed (the job's
/// `failed` is kept in its record).
fn failed_of(engine: &Engine, task_id: &str) -> bool {
    super::engine::parse_task_id(task_id)
        .and_then(|(job, ..)| engine.job(job))
        .is_some_and(|job| job.failed.is_some())
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
