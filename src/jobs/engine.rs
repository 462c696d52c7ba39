//! The jobs framework's decisions, without I/O: which instances to launch on which offer,
//! which tasks to kill, when an ended instance starts again. Time enters as an argument, so
//! every rule is unit-tested synchronously; the framework shell (`super::runner`) only feeds it
//! offers and status updates and carries out what it returns.
//!
//! An instance's task id is `JOB.INDEX.GENERATION-ATTEMPT` (`web.0.2-3`): the generation
//! counts the framework's starts (kept with the jobs), so ids are never reused across master
//! restarts, and after one the framework learns from reconciliation which instances still run
//! and adopts them.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use ringmaster_core::resources::Resources;
use serde::Serialize;
use tokio::time::Instant;

use super::constraints::{AgentFacts, Matcher};
use super::spec::{JobKind, JobSpec, MAX_RESTART_DELAY};

/// Where an instance is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Waiting for an offer (or for its restart delay).
    Pending,
    /// Launched, not yet running.
    Starting,
    Running,
    /// Being killed (the job was stopped, scaled down or updated).
    Stopping,
    /// Batch: ended successfully.
    Succeeded,
    /// Ended and not started again (attempts used up, or the job failed).
    Failed,
    /// Stopped by the user.
    Stopped,
}

impl InstanceState {
    fn has_task(self) -> bool {
        matches!(
            self,
            InstanceState::Starting | InstanceState::Running | InstanceState::Stopping
        )
    }
}

/// What the health check of an instance's task last said (services with `task.health`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceHealth {
    Healthy,
    Unhealthy,
}

/// One instance of a job.
#[derive(Clone, Debug, Serialize)]
pub struct Instance {
    pub index: u32,
    /// Incremented at each launch; part of the task id.
    pub attempt: u32,
    /// The engine generation of its current or last task.
    #[serde(skip)]
    generation: u32,
    pub state: InstanceState,
    pub task_id: Option<String>,
    /// The task it ran last (its current one while it has one): where its logs are.
    #[serde(skip)]
    pub last_task_id: Option<String>,
    pub agent: Option<String>,
    /// Launches after the first.
    pub restarts: u32,
    pub last_exit_code: Option<i32>,
    pub last_message: String,
    /// Its current task's health (`null`: unknown, no check, or no task); the last task's
    /// health is kept while the instance waits to be replaced.
    pub health: Option<InstanceHealth>,
    /// Launched from an older version of the spec: replaced, one at a time.
    #[serde(skip)]
    outdated: bool,
    #[serde(skip)]
    not_before: Option<Instant>,
    /// Restarts in a row without running for `restart.interval` (the backoff's exponent).
    #[serde(skip)]
    streak: u32,
    #[serde(skip)]
    running_since: Option<Instant>,
}

/// One job: its spec and its instances.
#[derive(Clone, Debug, Serialize)]
pub struct Job {
    pub spec: JobSpec,
    pub instances: Vec<Instance>,
    /// Stopped by the user (`job stop`).
    pub stopped: bool,
    /// Why the job gave up (a service restarted too often), if it did.
    pub failed: Option<String>,
    #[serde(skip)]
    service_restarts: VecDeque<Instant>,
}

impl Job {
    /// Batch: every instance ended (succeeded or failed for good). Service: stopped or failed.
    pub fn done(&self) -> bool {
        match self.spec.kind {
            JobKind::Batch => self.instances.iter().all(|i| {
                matches!(
                    i.state,
                    InstanceState::Succeeded | InstanceState::Failed | InstanceState::Stopped
                )
            }),
            JobKind::Service => {
                (self.stopped || self.failed.is_some())
                    && self.instances.iter().all(|i| !i.state.has_task())
            }
        }
    }

    /// Batch jobs: every instance succeeded.
    pub fn succeeded(&self) -> bool {
        self.instances
            .iter()
            .all(|i| i.state == InstanceState::Succeeded)
    }

    /// The job as the API reports it: with [`Job::done`] and [`Job::succeeded`], so clients
    /// do not derive them again.
    pub fn report(self) -> JobReport {
        JobReport {
            done: self.done(),
            succeeded: self.succeeded(),
            job: self,
        }
    }
}

/// A job with what follows from its instances (`GET /jobs`).
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    #[serde(flatten)]
    pub job: Job,
    pub done: bool,
    pub succeeded: bool,
}

/// How a batch instance ended for good.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Outcome {
    pub index: u32,
    pub succeeded: bool,
    pub exit_code: Option<i32>,
}

/// A task to start on an offer.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub job: String,
    pub task_id: String,
}

/// An offer as the engine sees it.
pub struct OfferView<'a> {
    pub id: &'a str,
    pub agent: &'a str,
    pub resources: &'a Resources,
    /// The agent's hostname and attributes, for the jobs' constraints.
    pub hostname: &'a str,
    pub attributes: &'a [(String, String)],
}

impl OfferView<'_> {
    fn facts(&self) -> AgentFacts<'_> {
        AgentFacts {
            hostname: self.hostname,
            attributes: self.attributes,
        }
    }
}

/// The jobs framework's books.
#[derive(Default)]
pub struct Engine {
    jobs: BTreeMap<String, Job>,
    generation: u32,
}

/// Splits `web.0.2-3` into ("web", 0, 2, 3).
pub fn parse_task_id(task_id: &str) -> Option<(&str, u32, u32, u32)> {
    let (rest, run) = task_id.rsplit_once('.')?;
    let (job, index) = rest.rsplit_once('.')?;
    let (generation, attempt) = run.split_once('-')?;
    Some((
        job,
        index.parse().ok()?,
        generation.parse().ok()?,
        attempt.parse().ok()?,
    ))
}

impl Engine {
    /// An engine whose task ids carry `generation` (one more than the last start's).
    pub fn with_generation(generation: u32) -> Self {
        Engine {
            jobs: BTreeMap::new(),
            generation,
        }
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn job(&self, name: &str) -> Option<&Job> {
        self.jobs.get(name)
    }

    /// The partitions the jobs run in (each has a framework of its own).
    pub fn partitions(&self) -> BTreeSet<String> {
        self.jobs
            .values()
            .map(|j| j.spec.partition.clone())
            .collect()
    }

    /// Creates a job or updates it. An update with another task template replaces the
    /// instances one at a time (see [`Engine::tick`]); a new count scales. Returns tasks to kill.
    pub fn put(&mut self, spec: JobSpec) -> Vec<String> {
        let name = spec.name.clone();
        let count = spec.count;
        match self.jobs.get_mut(&name) {
            None => {
                let instances = (0..count).map(new_instance).collect();
                self.jobs.insert(
                    name,
                    Job {
                        spec,
                        instances,
                        stopped: false,
                        failed: None,
                        service_restarts: VecDeque::new(),
                    },
                );
                Vec::new()
            }
            Some(job) => {
                // Another partition or other constraints replace the instances too: they may
                // run where the new spec does not allow.
                let template_changed = job.spec.task != spec.task
                    || job.spec.kind != spec.kind
                    || job.spec.partition != spec.partition
                    || job.spec.constraints != spec.constraints;
                job.spec = spec;
                job.stopped = false;
                job.failed = None;
                for instance in &mut job.instances {
                    if template_changed && instance.state.has_task() {
                        instance.outdated = true;
                    }
                    if matches!(
                        instance.state,
                        InstanceState::Stopped | InstanceState::Failed
                    ) || (template_changed && instance.state == InstanceState::Succeeded)
                    {
                        instance.state = InstanceState::Pending;
                        instance.not_before = None;
                        instance.streak = 0;
                    }
                }
                self.scale(&name, count).unwrap_or_default()
            }
        }
    }

    /// Sets a job's instance count; the highest-numbered instances go first. Returns tasks to
    /// kill, or `None` for an unknown job.
    pub fn scale(&mut self, name: &str, count: u32) -> Option<Vec<String>> {
        let job = self.jobs.get_mut(name)?;
        job.spec.count = count;
        let mut kill = Vec::new();
        let have = job.instances.len() as u32;
        for index in have..count {
            job.instances.push(new_instance(index));
        }
        for instance in job.instances.iter_mut().filter(|i| i.index >= count) {
            stop_instance(instance, &mut kill);
        }
        job.instances
            .retain(|i| i.index < count || i.state == InstanceState::Stopping);
        Some(kill)
    }

    /// Stops a job: its tasks are killed. With `purge` it is forgotten once they ended.
    /// Returns tasks to kill, or `None` for an unknown job.
    pub fn stop(&mut self, name: &str, purge: bool) -> Option<Vec<String>> {
        let job = self.jobs.get_mut(name)?;
        job.stopped = true;
        let mut kill = Vec::new();
        for instance in &mut job.instances {
            stop_instance(instance, &mut kill);
        }
        if purge {
            self.jobs.remove(name);
        }
        Some(kill)
    }

    /// The batch instances that ended for good, by job: what a restarted framework cannot
    /// learn by reconciliation (the master reports live tasks), so the caller keeps it.
    pub fn outcomes(&self) -> BTreeMap<String, Vec<Outcome>> {
        let mut out = BTreeMap::new();
        for (name, job) in &self.jobs {
            let ended: Vec<Outcome> = job
                .instances
                .iter()
                .filter(|i| matches!(i.state, InstanceState::Succeeded | InstanceState::Failed))
                .map(|i| Outcome {
                    index: i.index,
                    succeeded: i.state == InstanceState::Succeeded,
                    exit_code: i.last_exit_code,
                })
                .collect();
            if !ended.is_empty() {
                out.insert(name.clone(), ended);
            }
        }
        out
    }

    /// Restores what [`Engine::outcomes`] returned (after [`Engine::put`] of the job).
    pub fn restore_outcomes(&mut self, name: &str, outcomes: &[Outcome]) {
        let Some(job) = self.jobs.get_mut(name) else {
            return;
        };
        for outcome in outcomes {
            if let Some(instance) = job.instances.iter_mut().find(|i| i.index == outcome.index) {
                instance.state = if outcome.succeeded {
                    InstanceState::Succeeded
                } else {
                    InstanceState::Failed
                };
                instance.last_exit_code = outcome.exit_code;
            }
        }
    }

    /// Each instance's restarts (launches after its first), by index, where not zero: kept in
    /// the job's record so a restarted master or a new leader shows the same counts.
    pub fn restarts(&self, name: &str) -> Vec<(u32, u32)> {
        self.jobs
            .get(name)
            .map(|job| {
                job.instances
                    .iter()
                    .filter(|i| i.restarts > 0)
                    .map(|i| (i.index, i.restarts))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Restores what [`Engine::restarts`] returned (after [`Engine::put`] of the job).
    pub fn restore_restarts(&mut self, name: &str, restarts: &[(u32, u32)]) {
        let Some(job) = self.jobs.get_mut(name) else {
            return;
        };
        for &(index, count) in restarts {
            if let Some(instance) = job.instances.iter_mut().find(|i| i.index == index) {
                instance.restarts = count;
            }
        }
    }

    /// Restores that a job gave up (a service restarted too often, kept with the job): it is
    /// not launched again until it is run again (`job run` of its spec, [`Engine::put`]).
    /// Its instances stay as they are: one that still runs is adopted, and left running.
    pub fn restore_failed(&mut self, name: &str, why: &str) {
        if let Some(job) = self.jobs.get_mut(name) {
            job.failed = Some(why.to_string());
        }
    }

    /// Forgets a job at once (after a purge, its tasks' updates are ignored).
    pub fn remove(&mut self, name: &str) {
        self.jobs.remove(name);
    }

    /// Rolling updates: when no instance of a job is starting or waiting, kill one instance
    /// launched from an older spec (it is launched again from the new one when it ends).
    pub fn tick(&mut self) -> Vec<String> {
        let mut kill = Vec::new();
        for job in self.jobs.values_mut() {
            if job.stopped {
                continue;
            }
            let busy = job.instances.iter().any(|i| {
                matches!(
                    i.state,
                    InstanceState::Pending | InstanceState::Starting | InstanceState::Stopping
                )
            });
            if busy {
                continue;
            }
            if let Some(instance) = job
                .instances
                .iter_mut()
                .find(|i| i.outdated && i.state == InstanceState::Running)
            {
                instance.state = InstanceState::Stopping;
                kill.extend(instance.task_id.clone());
            }
        }
        kill
    }

    /// What the framework of `partition` asks the master for: the shape of the partition's
    /// first job with instances due, and how many of that shape are due at `now`. `None`:
    /// nothing to launch there.
    pub fn demand(&self, partition: &str, now: Instant) -> Option<(Resources, u32)> {
        let mut shape: Option<Resources> = None;
        let mut count = 0;
        for job in self
            .jobs
            .values()
            .filter(|j| !j.stopped && j.failed.is_none() && j.spec.partition == partition)
        {
            let due = job.instances.iter().filter(|i| due(i, now)).count() as u32;
            if due == 0 {
                continue;
            }
            let resources = job.spec.resources();
            match &shape {
                None => {
                    shape = Some(resources);
                    count = due;
                }
                Some(s) if *s == resources => count += due,
                Some(_) => {}
            }
        }
        shape.map(|s| (s, count))
    }

    /// The earliest instant a waiting instance becomes due (to wake up then).
    pub fn next_due(&self) -> Option<Instant> {
        self.jobs
            .values()
            .flat_map(|j| j.instances.iter())
            .filter(|i| i.state == InstanceState::Pending)
            .filter_map(|i| i.not_before)
            .min()
    }

    /// Places due instances of the jobs of `partition` on offers (made to that partition's
    /// framework), first fit, jobs in name order, each instance only on an agent that
    /// satisfies its job's constraints (with `distinct_hosts`: on none that holds a live
    /// instance of the job or got one in this round). An instance no offer suits stays
    /// pending. Returns the tasks to launch per offer (offers with none are declined by the
    /// caller).
    pub fn place(
        &mut self,
        partition: &str,
        offers: &[OfferView<'_>],
        now: Instant,
    ) -> Vec<(String, Vec<Launch>)> {
        let mut free: Vec<Resources> = offers.iter().map(|o| o.resources.clone()).collect();
        let mut out: Vec<(String, Vec<Launch>)> = offers
            .iter()
            .map(|o| (o.id.to_string(), Vec::new()))
            .collect();
        let generation = self.generation;
        for (name, job) in self.jobs.iter_mut() {
            if job.stopped || job.failed.is_some() || job.spec.partition != partition {
                continue;
            }
            if !job.instances.iter().any(|i| due(i, now)) {
                continue;
            }
            let resources = job.spec.resources();
            let matcher = Matcher::new(&job.spec.constraints);
            let suits: Vec<bool> = offers.iter().map(|o| matcher.matches(&o.facts())).collect();
            // distinct_hosts: the agents that hold a live instance of the job.
            let mut taken: HashSet<String> = if matcher.distinct_hosts() {
                job.instances
                    .iter()
                    .filter(|i| i.state.has_task())
                    .filter_map(|i| i.agent.clone())
                    .collect()
            } else {
                HashSet::new()
            };
            for instance in job.instances.iter_mut().filter(|i| due(i, now)) {
                let slot = (0..offers.len()).find(|&s| {
                    suits[s] && !taken.contains(offers[s].agent) && free[s].contains(&resources)
                });
                let Some(slot) = slot else {
                    break;
                };
                if matcher.distinct_hosts() {
                    taken.insert(offers[slot].agent.to_string());
                }
                free[slot] = free[slot].saturating_sub(&resources);
                if instance.generation != generation {
                    instance.generation = generation;
                    instance.attempt = 0;
                }
                instance.attempt += 1;
                let task_id = format!(
                    "{name}.{}.{}-{}",
                    instance.index, generation, instance.attempt
                );
                instance.state = InstanceState::Starting;
                instance.task_id = Some(task_id.clone());
                instance.last_task_id = Some(task_id.clone());
                instance.agent = Some(offers[slot].agent.to_string());
                instance.health = None;
                instance.outdated = false;
                instance.not_before = None;
                out[slot].1.push(Launch {
                    job: name.clone(),
                    task_id,
                });
            }
        }
        out
    }

    /// What a task's status says of its health (`None`: unknown); recorded on the instance
    /// whose current or last task it is. An unhealthy task's end comes as a FAILED update and
    /// is handled by [`Engine::update`] like any failure (replaced, with the restart backoff).
    pub fn set_health(&mut self, task_id: &str, health: Option<InstanceHealth>) {
        let Some((name, index, _, _)) = parse_task_id(task_id) else {
            return;
        };
        let instance = self
            .jobs
            .get_mut(name)
            .and_then(|job| job.instances.iter_mut().find(|i| i.index == index))
            .filter(|i| i.last_task_id.as_deref() == Some(task_id));
        if let Some(instance) = instance {
            instance.health = health;
        }
    }

    /// A task's new state. `terminal` with `success` (FINISHED, exit 0) or not. Returns
    /// tasks to kill (an unknown or stale task of ours that still runs).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        task_id: &str,
        running: bool,
        terminal: bool,
        success: bool,
        exit_code: Option<i32>,
        message: &str,
        agent: &str,
        now: Instant,
    ) -> Vec<String> {
        let Some((name, index, generation, attempt)) = parse_task_id(task_id) else {
            return Vec::new();
        };
        let live = !terminal;
        let Some(job) = self.jobs.get_mut(name) else {
            // A purged or unknown job's task: kill it if it still runs.
            return if live {
                vec![task_id.to_string()]
            } else {
                Vec::new()
            };
        };
        let Some(instance) = job.instances.iter_mut().find(|i| i.index == index) else {
            return if live {
                vec![task_id.to_string()]
            } else {
                Vec::new()
            };
        };
        let current = instance.task_id.as_deref() == Some(task_id);
        if !current {
            // After a master restart the books start empty: adopt a live task of this instance
            // (the newest attempt wins); a stale one is killed.
            let adoptable = live
                && !job.stopped
                && matches!(instance.state, InstanceState::Pending)
                && (generation, attempt) >= (instance.generation, instance.attempt);
            if adoptable {
                instance.generation = generation;
                instance.attempt = attempt;
                instance.task_id = Some(task_id.to_string());
                instance.last_task_id = Some(task_id.to_string());
                instance.agent = Some(agent.to_string());
                instance.state = if running {
                    InstanceState::Running
                } else {
                    InstanceState::Starting
                };
                instance.running_since = running.then_some(now);
                return Vec::new();
            }
            // A batch instance that already succeeded before the restart is done.
            if terminal
                && success
                && job.spec.kind == JobKind::Batch
                && instance.state == InstanceState::Pending
                && instance.attempt == 0
            {
                instance.state = InstanceState::Succeeded;
                instance.last_exit_code = exit_code;
                instance.agent = Some(agent.to_string());
            }
            return if live {
                vec![task_id.to_string()]
            } else {
                Vec::new()
            };
        }
        instance.agent = Some(agent.to_string());
        if live {
            if running && instance.state == InstanceState::Starting {
                instance.state = InstanceState::Running;
                instance.running_since = Some(now);
            }
            return Vec::new();
        }
        instance.last_exit_code = exit_code;
        instance.last_message = message.to_string();
        instance.task_id = None;
        let delay = Duration::from_millis(job.spec.restart.delay_ms);
        let interval = Duration::from_millis(job.spec.restart.interval_ms);
        // A run that lasted the whole interval starts the backoff over.
        if instance
            .running_since
            .is_some_and(|since| now.duration_since(since) >= interval)
        {
            instance.streak = 0;
        }
        instance.running_since = None;
        if instance.state == InstanceState::Stopping
            && (job.stopped || instance.index >= job.spec.count)
        {
            instance.state = InstanceState::Stopped;
            job.instances
                .retain(|i| i.index < job.spec.count || i.state == InstanceState::Stopping);
            return Vec::new();
        }
        if instance.state == InstanceState::Stopping {
            // Replaced by a rolling update: start again from the new spec at once.
            instance.state = InstanceState::Pending;
            instance.streak = 0;
            return Vec::new();
        }
        match job.spec.kind {
            JobKind::Batch if success => instance.state = InstanceState::Succeeded,
            JobKind::Batch => {
                if instance.attempt <= job.spec.restart.attempts {
                    restart_later(instance, delay, now);
                } else {
                    instance.state = InstanceState::Failed;
                }
            }
            JobKind::Service => {
                while job
                    .service_restarts
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > interval)
                {
                    job.service_restarts.pop_front();
                }
                if job.service_restarts.len() as u32 >= job.spec.restart.attempts {
                    instance.state = InstanceState::Failed;
                    job.failed = Some(format!(
                        "more than {} restarts within {}",
                        job.spec.restart.attempts,
                        humantime::format_duration(interval)
                    ));
                } else {
                    job.service_restarts.push_back(now);
                    restart_later(instance, delay, now);
                }
            }
        }
        Vec::new()
    }
}

fn new_instance(index: u32) -> Instance {
    Instance {
        index,
        attempt: 0,
        generation: 0,
        state: InstanceState::Pending,
        task_id: None,
        last_task_id: None,
        agent: None,
        restarts: 0,
        last_exit_code: None,
        last_message: String::new(),
        health: None,
        outdated: false,
        not_before: None,
        streak: 0,
        running_since: None,
    }
}

fn due(instance: &Instance, now: Instant) -> bool {
    instance.state == InstanceState::Pending && instance.not_before.is_none_or(|t| t <= now)
}

fn stop_instance(instance: &mut Instance, kill: &mut Vec<String>) {
    if instance.state.has_task() {
        instance.state = InstanceState::Stopping;
        kill.extend(instance.task_id.clone());
    } else if !matches!(
        instance.state,
        InstanceState::Succeeded | InstanceState::Failed
    ) {
        instance.state = InstanceState::Stopped;
    }
}

/// Pending again after `delay × 2^streak` (at most [`MAX_RESTART_DELAY`]).
fn restart_later(instance: &mut Instance, delay: Duration, now: Instant) {
    let backoff = delay
        .saturating_mul(1u32 << instance.streak.min(16))
        .min(MAX_RESTART_DELAY.max(delay));
    instance.streak += 1;
    instance.restarts += 1;
    instance.state = InstanceState::Pending;
    instance.not_before = Some(now + backoff);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::spec::parse_job_spec;

    fn spec(kind: &str, count: u32, attempts: u32) -> JobSpec {
        parse_job_spec(
            &format!(
                "name: web\ntype: {kind}\ncount: {count}\ntask:\n  command: run\n  \
                 resources: cpus:1;mem:100\nrestart:\n  attempts: {attempts}\n  delay: 1s\n  \
                 interval: 1m\n"
            ),
            "t.yaml",
        )
        .unwrap()
    }

    fn offer(resources: &Resources) -> OfferView<'_> {
        OfferView {
            id: "o1",
            agent: "a1",
            resources,
            hostname: "h1",
            attributes: &[],
        }
    }

    /// Launches every due instance on one big offer; returns the task ids.
    fn launch_all(e: &mut Engine, now: Instant) -> Vec<String> {
        let big: Resources = "cpus:100;mem:10000".parse().unwrap();
        let placed = e.place("default", &[offer(&big)], now);
        placed[0].1.iter().map(|l| l.task_id.clone()).collect()
    }

    fn running(e: &mut Engine, task: &str, now: Instant) {
        assert!(e
            .update(task, true, false, false, None, "", "a1", now)
            .is_empty());
    }

    fn ended(e: &mut Engine, task: &str, success: bool, now: Instant) -> Vec<String> {
        let code = if success { 0 } else { 1 };
        e.update(task, false, true, success, Some(code), "", "a1", now)
    }

    fn states(e: &Engine) -> Vec<InstanceState> {
        e.job("web")
            .unwrap()
            .instances
            .iter()
            .map(|i| i.state)
            .collect()
    }

    #[test]
    fn a_service_is_launched_and_an_ended_instance_restarts_after_its_delay() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 2, 3));
        let shape: Resources = "cpus:1;mem:100".parse().unwrap();
        assert_eq!(e.demand("default", t0), Some((shape.clone(), 2)));
        let tasks = launch_all(&mut e, t0);
        assert_eq!(tasks, ["web.0.0-1", "web.1.0-1"]);
        assert_eq!(e.demand("default", t0), None);
        running(&mut e, "web.0.0-1", t0);
        running(&mut e, "web.1.0-1", t0);
        assert_eq!(states(&e), [InstanceState::Running, InstanceState::Running]);
        ended(&mut e, "web.1.0-1", false, t0);
        assert_eq!(states(&e)[1], InstanceState::Pending);
        assert_eq!(e.demand("default", t0), None, "not before its delay");
        assert_eq!(e.next_due(), Some(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(e.demand("default", t1), Some((shape, 1)));
        assert_eq!(launch_all(&mut e, t1), ["web.1.0-2"]);
        let instance = &e.job("web").unwrap().instances[1];
        assert_eq!((instance.restarts, instance.last_exit_code), (1, Some(1)));
        // A second end in a row doubles the delay.
        ended(&mut e, "web.1.0-2", true, t1);
        assert_eq!(e.next_due(), Some(t1 + Duration::from_secs(2)));
    }

    #[test]
    fn an_instance_failed_by_its_health_is_replaced_with_backoff_and_health_is_per_task() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 1, 3));
        launch_all(&mut e, t0);
        running(&mut e, "web.0.0-1", t0);
        let health = |e: &Engine| e.job("web").unwrap().instances[0].health;
        assert_eq!(health(&e), None);
        e.set_health("web.0.0-1", Some(InstanceHealth::Healthy));
        assert_eq!(health(&e), Some(InstanceHealth::Healthy));
        // Another instance's or an unknown task's health changes nothing.
        e.set_health("web.0.0-9", Some(InstanceHealth::Unhealthy));
        e.set_health("other.0.0-1", Some(InstanceHealth::Unhealthy));
        assert_eq!(health(&e), Some(InstanceHealth::Healthy));
        // Unhealthy (a RUNNING update), then the agent's kill ends it FAILED.
        e.set_health("web.0.0-1", Some(InstanceHealth::Unhealthy));
        let failed = "health check failed 3 times: connection refused";
        e.update("web.0.0-1", false, true, false, None, failed, "a1", t0);
        e.set_health("web.0.0-1", Some(InstanceHealth::Unhealthy));
        let i = &e.job("web").unwrap().instances[0];
        assert_eq!(i.state, InstanceState::Pending);
        assert_eq!((i.restarts, i.last_message.as_str()), (1, failed));
        assert_eq!(
            i.health,
            Some(InstanceHealth::Unhealthy),
            "kept until replaced"
        );
        let value = serde_json::to_value(i).unwrap();
        assert_eq!(value["health"], "unhealthy");
        assert_eq!(e.next_due(), Some(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(launch_all(&mut e, t1), ["web.0.0-2"]);
        assert_eq!(health(&e), None, "the replacement starts unknown");
        running(&mut e, "web.0.0-2", t1);
        e.set_health("web.0.0-2", Some(InstanceHealth::Healthy));
        assert_eq!(health(&e), Some(InstanceHealth::Healthy));
        // Failing again at once doubles the delay, as any failure in a row does.
        e.update("web.0.0-2", false, true, false, None, failed, "a1", t1);
        assert_eq!(e.next_due(), Some(t1 + Duration::from_secs(2)));
    }

    #[test]
    fn a_service_that_restarts_too_often_fails() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 1, 2));
        let mut now = t0;
        for attempt in 1..=3 {
            now += Duration::from_secs(5);
            assert_eq!(launch_all(&mut e, now), [format!("web.0.0-{attempt}")]);
            ended(&mut e, &format!("web.0.0-{attempt}"), false, now);
        }
        let job = e.job("web").unwrap();
        assert_eq!(states(&e), [InstanceState::Failed]);
        assert!(job
            .failed
            .as_deref()
            .unwrap()
            .contains("more than 2 restarts"));
        assert!(job.done());
        assert_eq!(e.demand("default", now + Duration::from_secs(600)), None);
    }

    #[test]
    fn a_batch_instance_is_retried_up_to_its_attempts() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("batch", 2, 1));
        launch_all(&mut e, t0);
        ended(&mut e, "web.0.0-1", true, t0);
        ended(&mut e, "web.1.0-1", false, t0);
        assert_eq!(
            states(&e),
            [InstanceState::Succeeded, InstanceState::Pending]
        );
        assert!(!e.job("web").unwrap().done());
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(launch_all(&mut e, t1), ["web.1.0-2"]);
        ended(&mut e, "web.1.0-2", false, t1);
        assert_eq!(
            states(&e),
            [InstanceState::Succeeded, InstanceState::Failed]
        );
        let job = e.job("web").unwrap();
        assert!(job.done() && !job.succeeded());
    }

    #[test]
    fn stop_kills_the_tasks_and_nothing_starts_again() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 2, 3));
        launch_all(&mut e, t0);
        running(&mut e, "web.0.0-1", t0);
        assert_eq!(e.stop("web", false).unwrap(), ["web.0.0-1", "web.1.0-1"]);
        assert_eq!(
            states(&e),
            [InstanceState::Stopping, InstanceState::Stopping]
        );
        ended(&mut e, "web.0.0-1", false, t0);
        ended(&mut e, "web.1.0-1", false, t0);
        assert_eq!(states(&e), [InstanceState::Stopped, InstanceState::Stopped]);
        assert_eq!(e.demand("default", t0 + Duration::from_secs(60)), None);
        assert!(e.job("web").unwrap().done());
        assert!(e.stop("nope", false).is_none());
    }

    #[test]
    fn scaling_down_kills_the_highest_instances_and_up_adds_pending_ones() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 3, 3));
        launch_all(&mut e, t0);
        assert_eq!(e.scale("web", 1).unwrap(), ["web.1.0-1", "web.2.0-1"]);
        ended(&mut e, "web.1.0-1", false, t0);
        ended(&mut e, "web.2.0-1", false, t0);
        assert_eq!(states(&e), [InstanceState::Starting]);
        assert!(e.scale("web", 2).unwrap().is_empty());
        assert_eq!(launch_all(&mut e, t0), ["web.1.0-1"]);
    }

    #[test]
    fn an_update_replaces_instances_one_at_a_time() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 2, 3));
        launch_all(&mut e, t0);
        running(&mut e, "web.0.0-1", t0);
        running(&mut e, "web.1.0-1", t0);
        let mut new = spec("service", 2, 3);
        new.task.command = "run --v2".into();
        assert!(e.put(new).is_empty());
        assert_eq!(e.tick(), ["web.0.0-1"], "one at a time");
        assert!(e.tick().is_empty(), "the next waits for the first");
        ended(&mut e, "web.0.0-1", false, t0);
        assert_eq!(launch_all(&mut e, t0), ["web.0.0-2"]);
        assert!(e.tick().is_empty(), "still starting");
        running(&mut e, "web.0.0-2", t0);
        assert_eq!(e.tick(), ["web.1.0-1"]);
        assert_eq!(e.job("web").unwrap().instances[0].restarts, 0);
    }

    #[test]
    fn after_a_restart_running_tasks_are_adopted_not_relaunched() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 2, 3));
        running(&mut e, "web.1.0-4", t0);
        assert_eq!(states(&e), [InstanceState::Pending, InstanceState::Running]);
        assert_eq!(launch_all(&mut e, t0), ["web.0.0-1"]);
        // A stale attempt of an instance that has a task, or a purged job's task, is killed.
        assert_eq!(
            e.update("web.1.0-3", true, false, false, None, "", "a1", t0),
            ["web.1.0-3"]
        );
        assert_eq!(
            e.update("gone.0.0-1", true, false, false, None, "", "a1", t0),
            ["gone.0.0-1"]
        );
        assert!(e
            .update("gone.0.0-1", false, true, true, Some(0), "", "a1", t0)
            .is_empty());
        assert!(e
            .update("garbage", true, false, false, None, "", "a1", t0)
            .is_empty());
    }

    #[test]
    fn an_offer_too_small_launches_nothing() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("service", 1, 3));
        let small: Resources = "cpus:0.5;mem:100".parse().unwrap();
        let placed = e.place("default", &[offer(&small)], t0);
        assert!(placed[0].1.is_empty());
        assert_eq!(states(&e), [InstanceState::Pending]);
    }

    #[test]
    fn a_new_generation_never_reuses_a_task_id() {
        let t0 = Instant::now();
        let mut e = Engine::with_generation(2);
        e.put(spec("service", 1, 3));
        // An instance of the previous start still runs: adopted.
        running(&mut e, "web.0.1-7", t0);
        ended(&mut e, "web.0.1-7", false, t0);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(launch_all(&mut e, t1), ["web.0.2-1"]);
    }

    #[test]
    fn a_batch_instance_that_succeeded_before_a_restart_is_not_run_again() {
        let t0 = Instant::now();
        let mut e = Engine::with_generation(3);
        e.put(spec("batch", 2, 1));
        ended(&mut e, "web.0.2-1", true, t0);
        assert_eq!(
            states(&e),
            [InstanceState::Succeeded, InstanceState::Pending]
        );
        assert_eq!(launch_all(&mut e, t0), ["web.1.3-1"]);
    }

    #[test]
    fn batch_outcomes_survive_a_restart() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(spec("batch", 3, 0));
        launch_all(&mut e, t0);
        ended(&mut e, "web.0.0-1", true, t0);
        ended(&mut e, "web.1.0-1", false, t0);
        let outcomes = e.outcomes();
        let mut again = Engine::with_generation(1);
        again.put(spec("batch", 3, 0));
        again.restore_outcomes("web", &outcomes["web"]);
        assert_eq!(
            states(&again),
            [
                InstanceState::Succeeded,
                InstanceState::Failed,
                InstanceState::Pending
            ]
        );
        assert_eq!(launch_all(&mut again, t0), ["web.2.1-1"]);
    }

    /// A job `name` with `count` instances of cpus:1 in `partition` under `constraints`
    /// (YAML list items, one a line).
    fn placed_spec(name: &str, count: u32, partition: &str, constraints: &[&str]) -> JobSpec {
        let mut text = format!(
            "name: {name}\ntype: service\ncount: {count}\ntask:\n  command: run\n  \
             resources: cpus:1\npartition: {partition}\n"
        );
        if !constraints.is_empty() {
            text.push_str("constraints:\n");
            for c in constraints {
                text.push_str(&format!("  - {c}\n"));
            }
        }
        parse_job_spec(&text, "t.yaml").unwrap()
    }

    fn attrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `(offer id, agent, hostname, attributes)`.
    type TestOffer<'a> = (&'a str, &'a str, &'a str, Vec<(String, String)>);

    /// Places what is due on offers `(id, agent, hostname, attributes)` of 4 cpus each;
    /// returns (offer id, task ids) of the offers that got tasks.
    fn place_on(
        e: &mut Engine,
        partition: &str,
        offers: &[TestOffer<'_>],
        now: Instant,
    ) -> Vec<(String, Vec<String>)> {
        let four: Resources = "cpus:4;mem:1000".parse().unwrap();
        let views: Vec<OfferView<'_>> = offers
            .iter()
            .map(|(id, agent, hostname, attributes)| OfferView {
                id,
                agent,
                resources: &four,
                hostname,
                attributes,
            })
            .collect();
        e.place(partition, &views, now)
            .into_iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(o, l)| (o, l.into_iter().map(|l| l.task_id).collect()))
            .collect()
    }

    #[test]
    fn each_operator_keeps_instances_to_the_agents_that_satisfy_it() {
        let t0 = Instant::now();
        let offers = [
            (
                "o1",
                "a1",
                "node1",
                attrs(&[("rack", "r1"), ("zone", "eu-1")]),
            ),
            (
                "o2",
                "a2",
                "node2",
                attrs(&[("rack", "r2"), ("ssd", "yes")]),
            ),
        ];
        let cases: [(&str, &[&str]); 9] = [
            ("{attribute: rack, value: r2}", &["o2"]),
            ("{attribute: rack, operator: \"=\", value: r1}", &["o1"]),
            ("{attribute: rack, operator: \"!=\", value: r1}", &["o2"]),
            (
                "{attribute: zone, operator: regexp, value: \"eu-[0-9]\"}",
                &["o1"],
            ),
            ("{attribute: ssd, operator: is_set}", &["o2"]),
            ("{attribute: ssd, operator: is_not_set}", &["o1"]),
            ("{attribute: hostname, value: node2}", &["o2"]),
            (
                "{attribute: hostname, operator: regexp, value: \"node.*\"}",
                &["o1"],
            ),
            ("{attribute: rack, value: r9}", &[]),
        ];
        for (constraint, expected) in cases {
            let mut e = Engine::default();
            e.put(placed_spec("web", 1, "default", &[constraint]));
            let placed = place_on(&mut e, "default", &offers, t0);
            let on: Vec<&str> = placed.iter().map(|(o, _)| o.as_str()).collect();
            assert_eq!(on, expected, "{constraint}");
            if expected.is_empty() {
                // Nothing suits: the instance waits, still asking.
                assert_eq!(states(&e), [InstanceState::Pending]);
                assert!(e.demand("default", t0).is_some());
            }
        }
        // Every constraint must hold.
        let mut e = Engine::default();
        e.put(placed_spec(
            "web",
            1,
            "default",
            &[
                "{attribute: rack, value: r2}",
                "{attribute: ssd, operator: is_not_set}",
            ],
        ));
        assert!(place_on(&mut e, "default", &offers, t0).is_empty());
    }

    #[test]
    fn distinct_hosts_puts_no_two_live_instances_on_one_agent() {
        let t0 = Instant::now();
        let offers = [
            ("o1", "a1", "node1", attrs(&[])),
            ("o2", "a2", "node2", attrs(&[])),
        ];
        let mut e = Engine::default();
        e.put(placed_spec(
            "web",
            3,
            "default",
            &["{operator: distinct_hosts}"],
        ));
        // Two agents, three instances: one each, the third waits.
        let placed = place_on(&mut e, "default", &offers, t0);
        assert_eq!(
            placed,
            [
                ("o1".to_string(), vec!["web.0.0-1".to_string()]),
                ("o2".to_string(), vec!["web.1.0-1".to_string()])
            ]
        );
        assert_eq!(states(&e)[2], InstanceState::Pending);
        // Later offers of the same agents: they hold live instances.
        assert!(place_on(&mut e, "default", &offers, t0).is_empty());
        // An instance ends on a1: the third may go there.
        ended(&mut e, "web.0.0-1", false, t0);
        let t1 = t0 + Duration::from_secs(1);
        let placed = place_on(&mut e, "default", &offers, t1);
        assert_eq!(placed.len(), 1, "{placed:?}");
        assert_eq!(placed[0].0, "o1");
        // Without the constraint, one agent takes them all.
        let mut e = Engine::default();
        e.put(placed_spec("web", 3, "default", &[]));
        let placed = place_on(&mut e, "default", &offers, t0);
        assert_eq!(
            placed,
            [(
                "o1".to_string(),
                vec![
                    "web.0.0-1".to_string(),
                    "web.1.0-1".to_string(),
                    "web.2.0-1".to_string()
                ]
            )]
        );
    }

    #[test]
    fn offers_of_a_partition_go_to_its_jobs_and_demand_is_per_partition() {
        let t0 = Instant::now();
        let mut e = Engine::default();
        e.put(placed_spec("web", 1, "default", &[]));
        e.put(placed_spec("train", 2, "gpu", &[]));
        assert_eq!(
            e.partitions().into_iter().collect::<Vec<_>>(),
            ["default", "gpu"]
        );
        let cpus = |n| Some(("cpus:1".parse::<Resources>().unwrap(), n));
        assert_eq!(e.demand("default", t0), cpus(1));
        assert_eq!(e.demand("gpu", t0), cpus(2));
        assert_eq!(e.demand("other", t0), None);
        let offers = [("o1", "g1", "gpu1", attrs(&[("partition", "gpu")]))];
        let placed = place_on(&mut e, "gpu", &offers, t0);
        assert_eq!(
            placed,
            [(
                "o1".to_string(),
                vec!["train.0.0-1".to_string(), "train.1.0-1".to_string()]
            )]
        );
        assert_eq!(e.demand("gpu", t0), None);
        assert_eq!(e.demand("default", t0), cpus(1), "web still waits");
        let offers = [("o2", "d1", "cpu1", attrs(&[]))];
        let placed = place_on(&mut e, "default", &offers, t0);
        assert_eq!(placed, [("o2".to_string(), vec!["web.0.0-1".to_string()])]);
        // Moving a job to another partition replaces its instances there.
        running(&mut e, "web.0.0-1", t0);
        e.put(placed_spec("web", 1, "gpu", &[]));
        assert_eq!(e.tick(), ["web.0.0-1"]);
        ended(&mut e, "web.0.0-1", false, t0);
        assert_eq!(e.demand("default", t0), None);
        assert_eq!(e.demand("gpu", t0), cpus(1));
    }

    #[test]
    fn a_failed_service_restored_stays_failed_and_a_new_run_retries_it() {
        let t0 = Instant::now();
        let mut e = Engine::with_generation(2);
        e.put(spec("service", 2, 1));
        e.restore_failed("web", "more than 1 restarts within 1m");
        // A live instance is adopted, nothing is launched.
        running(&mut e, "web.1.1-3", t0);
        assert_eq!(launch_all(&mut e, t0), Vec::<String>::new());
        assert_eq!(e.demand("default", t0), None);
        let job = e.job("web").unwrap();
        assert_eq!(
            job.failed.as_deref(),
            Some("more than 1 restarts within 1m")
        );
        assert_eq!(states(&e), [InstanceState::Pending, InstanceState::Running]);
        // Run again: tried again.
        e.put(spec("service", 2, 1));
        assert!(e.job("web").unwrap().failed.is_none());
        assert_eq!(launch_all(&mut e, t0), ["web.0.2-1"]);
    }

    #[test]
    fn task_ids_parse() {
        assert_eq!(parse_task_id("web.0.2-3"), Some(("web", 0, 2, 3)));
        assert_eq!(parse_task_id("a-b.12.0-1"), Some(("a-b", 12, 0, 1)));
        assert_eq!(parse_task_id("web.0.3"), None);
        assert_eq!(parse_task_id("web.x.0-1"), None);
        assert_eq!(parse_task_id("web"), None);
    }
}
