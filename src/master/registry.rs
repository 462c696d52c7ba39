//! The master's durable registry: what it must not forget across a restart.
//!
//! Why: a master that dies (cleanly or `kill -9`) must come back knowing every framework it
//! admitted, every agent it admitted and every task it launched, or it would double-launch,
//! forget tasks, or fail to tell a framework that a task was lost. The registry is an embedded
//! `redb` database (`<work-dir>/registry.redb`). The actor writes it *before* it acts: every
//! message an actor turn produces is held back until that turn's changes are committed in one
//! transaction (group commit, see [`super::state`]), so anything a peer was told is on disk.
//!
//! Quota usage is not a table of its own: it is the sum of the resources of the persisted
//! tasks that run at their user's priority, recomputed on load, so it cannot drift from the
//! tasks it counts. Offers are not persisted: they are void after a restart.
//!
//! Records are JSON values (resources in the Mesos text syntax), so an operator can read a
//! registry with any redb tool and records can gain fields without a migration.

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize};

/// The jobs framework's own record: its type is the jobs framework's, the registry only keeps
/// it (table `jobs_meta`).
pub use crate::jobs::store::JobsMeta;

const FRAMEWORKS: TableDefinition<&str, &[u8]> = TableDefinition::new("frameworks");
const AGENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("agents");
/// Keyed by (framework id, task id).
const TASKS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("tasks");
/// Frameworks torn down or failed over for good: they may not subscribe again.
const REMOVED: TableDefinition<&str, ()> = TableDefinition::new("removed_frameworks");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The largest id epoch (unix seconds) a master running on this registry used.
const META_EPOCH: &str = "id_epoch";
/// The built-in jobs framework's jobs: job name -> the jobs framework's record (JSON; its
/// schema belongs to `crate::jobs::runner`, the registry only keeps it).
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
/// The jobs framework's own record ([`JobsMeta`]), under [`JOBS_META_KEY`].
const JOBS_META: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs_meta");
const JOBS_META_KEY: &str = "framework";
/// Replication's own bookkeeping (`super::replication`): under [`REPLICATION_APPLIED_KEY`], the
/// last applied Raft log id and membership (opaque bytes to the registry). Written in the same
/// transaction as the batches it covers, so after a crash an entry is neither applied twice
/// nor lost. [`Registry::load`] does not read it: it is not the master's state.
const REPLICATION: TableDefinition<&str, &[u8]> = TableDefinition::new("replication");
const REPLICATION_APPLIED_KEY: &str = "applied";
/// The version of [`RegistryImage`]; an image of another version is refused, not guessed at.
const IMAGE_FORMAT: u32 = 1;

/// The file name of the registry inside the work dir.
pub const REGISTRY_FILE: &str = "registry.redb";

/// A registry operation failed; the message names the file and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("registry {path}: {what}: {detail}")]
pub struct RegistryError {
    path: PathBuf,
    what: &'static str,
    detail: String,
}

/// A subscribed framework, as persisted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameworkEntry {
    pub id: String,
    pub name: String,
    pub user: String,
    pub weight: f64,
    pub partition: String,
    pub failover_timeout_secs: f64,
    /// The authenticated principal, when authentication is on (empty otherwise).
    #[serde(default)]
    pub principal: String,
}

/// An admitted agent, as persisted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentEntry {
    pub id: String,
    pub hostname: String,
    /// Mesos text syntax, e.g. `cpus:4;mem:8192`.
    pub total: String,
    pub attributes: Vec<(String, String)>,
    /// Declared lost (its tasks were LOST); it may still re-register.
    pub lost: bool,
    /// The authenticated principal that registered it (empty: anonymous).
    #[serde(default)]
    pub principal: String,
}

/// A launched task and its last known state, as persisted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub framework_id: String,
    pub task_id: String,
    pub agent_id: String,
    pub name: String,
    /// Mesos text syntax.
    pub resources: String,
    /// The GPU devices the master bound it to, in binding text (docs/devices.md; empty
    /// without GPUs).
    #[serde(default)]
    pub devices: String,
    /// `TaskState` as its protobuf number.
    pub state: i32,
    pub reason: String,
    pub message: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
    pub priority: i64,
    /// Counts against the quota of (user, partition) while not ended.
    pub at_user_priority: bool,
    pub user: String,
    pub partition: String,
    pub started: u64,
    pub preempted: bool,
    /// Ended, and the framework has not yet acknowledged the terminal update: it is sent
    /// again after a restart.
    #[serde(default)]
    pub terminal_unacked: bool,
}

/// Everything read back from a registry at start.
#[derive(Debug, Default)]
pub struct Recovered {
    pub frameworks: Vec<FrameworkEntry>,
    pub agents: Vec<AgentEntry>,
    pub tasks: Vec<TaskEntry>,
    pub removed_frameworks: Vec<String>,
    /// The largest id epoch used before (0 for a new registry).
    pub id_epoch: u64,
    /// The jobs framework's jobs by name, each its JSON record.
    pub jobs: Vec<(String, serde_json::Value)>,
    /// The jobs framework's own record, once it started on this registry.
    pub jobs_meta: Option<JobsMeta>,
}

impl Recovered {
    /// Nothing was recovered: a fresh registry.
    pub fn is_empty(&self) -> bool {
        self.frameworks.is_empty()
            && self.agents.is_empty()
            && self.tasks.is_empty()
            && self.removed_frameworks.is_empty()
    }
}

/// One actor turn's changes: upserts (`Some`) and deletions (`None`), applied atomically.
///
/// Serializable because with replication a batch is one Raft log entry's payload
/// (`super::replication`): the leader's turn ships it, every master applies it. The encoding
/// (JSON, like the records) is the log's, not the registry's: the registry still stores each
/// record on its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegistryBatch {
    pub frameworks: Vec<(String, Option<FrameworkEntry>)>,
    pub agents: Vec<(String, Option<AgentEntry>)>,
    pub tasks: Vec<((String, String), Option<TaskEntry>)>,
    pub removed_frameworks: Vec<String>,
    /// Removed frameworks dropped from the bounded history (`master.max_removed_frameworks`).
    pub forgotten_frameworks: Vec<String>,
    pub id_epoch: Option<u64>,
    /// The jobs framework's job records (`None`: the job was purged).
    pub jobs: Vec<(String, Option<serde_json::Value>)>,
    pub jobs_meta: Option<JobsMeta>,
}

impl RegistryBatch {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.jobs_meta.is_none()
            && self.frameworks.is_empty()
            && self.agents.is_empty()
            && self.tasks.is_empty()
            && self.removed_frameworks.is_empty()
            && self.forgotten_frameworks.is_empty()
            && self.id_epoch.is_none()
    }

    /// The batch as consecutive batches whose encoding (its length as `encoded_len` measures
    /// it: the replicated log's encoding) is at most `max_bytes` each, so each fits one frame
    /// between masters: halves,
    /// recursively, of every list. Applied in order, the parts write what the whole would
    /// (a record is in exactly one part; the id epoch and the jobs meta go with the first).
    /// A single record larger than `max_bytes` stays one part (the transport refuses it).
    pub fn into_parts(
        self,
        max_bytes: usize,
        encoded_len: &dyn Fn(&RegistryBatch) -> usize,
    ) -> Vec<RegistryBatch> {
        // Small batches are not measured: a record is far below a frame.
        if self.len() <= 16 || encoded_len(&self) <= max_bytes {
            return vec![self];
        }
        if self.len() <= 1 {
            return vec![self];
        }
        fn halve<T>(list: &mut Vec<T>) -> Vec<T> {
            list.split_off(list.len() / 2)
        }
        let mut first = self;
        let second = RegistryBatch {
            frameworks: halve(&mut first.frameworks),
            agents: halve(&mut first.agents),
            tasks: halve(&mut first.tasks),
            removed_frameworks: halve(&mut first.removed_frameworks),
            forgotten_frameworks: halve(&mut first.forgotten_frameworks),
            id_epoch: None,
            jobs: halve(&mut first.jobs),
            jobs_meta: None,
        };
        let mut parts = first.into_parts(max_bytes, encoded_len);
        parts.extend(second.into_parts(max_bytes, encoded_len));
        parts.retain(|p| !p.is_empty());
        parts
    }

    /// How many records the batch writes or deletes.
    pub fn len(&self) -> usize {
        self.frameworks.len()
            + self.agents.len()
            + self.tasks.len()
            + self.removed_frameworks.len()
            + self.forgotten_frameworks.len()
            + usize::from(self.id_epoch.is_some())
            + self.jobs.len()
            + usize::from(self.jobs_meta.is_some())
    }
}

/// The open registry database.
pub struct Registry {
    db: Database,
    path: PathBuf,
    /// Tests: every commit fails (nothing is written) while set.
    #[cfg(test)]
    pub(crate) fail_commits: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// Opens (or creates) `<work_dir>/registry.redb`, creating `work_dir` when missing.
    ///
    /// The work dir is the master's alone (docs/security.md, "Files"): created 0700, and what
    /// an earlier run left open to group or others is tightened here (one warning per path),
    /// before the registry (job specs with their environments) is opened; the registry file,
    /// which redb creates with the umask's mode, is then made 0600.
    pub fn open(work_dir: &Path) -> Result<Registry, RegistryError> {
        let path = work_dir.join(REGISTRY_FILE);
        let fail = |what, detail: String| RegistryError {
            path: path.clone(),
            what,
            detail,
        };
        let changes = ringmaster_proto::files::prepare_work_dir(
            work_dir,
            ringmaster_proto::files::PRIVATE_DIR_MODE,
            &[],
        )
        .map_err(|e| fail("cannot create the work dir", e.to_string()))?;
        for change in changes {
            tracing::warn!(work_dir = %work_dir.display(), "work dir: {change}");
        }
        let db = Database::create(&path).map_err(|e| match e {
            // Another process (a master on this work dir) has it open: redb's lock.
            redb::DatabaseError::DatabaseAlreadyOpen => fail(
                "in use by another process (a master running on this work dir?)",
                e.to_string(),
            ),
            e => fail("cannot open", e.to_string()),
        })?;
        ringmaster_proto::files::restrict_file(&path)
            .map_err(|e| fail("cannot make the registry private (0600)", e.to_string()))?;
        let registry = Registry {
            db,
            path,
            #[cfg(test)]
            fail_commits: Default::default(),
        };
        // Create every table, so reads of a new registry find them.
        registry.commit(RegistryBatch::default())?;
        let write = registry
            .db
            .begin_write()
            .map_err(|e| registry.error("cannot begin a write", e))?;
        write
            .open_table(REPLICATION)
            .map_err(|e| registry.error("cannot open table replication", e))?;
        write
            .commit()
            .map_err(|e| registry.error("cannot commit", e))?;
        Ok(registry)
    }

    /// Where the registry lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, what: &'static str, detail: impl ToString) -> RegistryError {
        RegistryError {
            path: self.path.clone(),
            what,
            detail: detail.to_string(),
        }
    }

    /// Reads everything back.
    pub fn load(&self) -> Result<Recovered, RegistryError> {
        let read = self
            .db
            .begin_read()
            .map_err(|e| self.error("cannot read", e))?;
        let mut out = Recovered::default();
        let table = read
            .open_table(FRAMEWORKS)
            .map_err(|e| self.error("cannot open table frameworks", e))?;
        for row in table
            .iter()
            .map_err(|e| self.error("reading frameworks", e))?
        {
            let (key, value) = row.map_err(|e| self.error("reading frameworks", e))?;
            out.frameworks
                .push(serde_json::from_slice(value.value()).map_err(|e| {
                    self.error("bad framework record", format!("{}: {e}", key.value()))
                })?);
        }
        let table = read
            .open_table(AGENTS)
            .map_err(|e| self.error("cannot open table agents", e))?;
        for row in table.iter().map_err(|e| self.error("reading agents", e))? {
            let (key, value) = row.map_err(|e| self.error("reading agents", e))?;
            out.agents
                .push(serde_json::from_slice(value.value()).map_err(|e| {
                    self.error("bad agent record", format!("{}: {e}", key.value()))
                })?);
        }
        let table = read
            .open_table(TASKS)
            .map_err(|e| self.error("cannot open table tasks", e))?;
        for row in table.iter().map_err(|e| self.error("reading tasks", e))? {
            let (key, value) = row.map_err(|e| self.error("reading tasks", e))?;
            out.tasks
                .push(serde_json::from_slice(value.value()).map_err(|e| {
                    let (fw, task) = key.value();
                    self.error("bad task record", format!("{fw}/{task}: {e}"))
                })?);
        }
        let table = read
            .open_table(REMOVED)
            .map_err(|e| self.error("cannot open table removed_frameworks", e))?;
        for row in table
            .iter()
            .map_err(|e| self.error("reading removed_frameworks", e))?
        {
            let (key, _) = row.map_err(|e| self.error("reading removed_frameworks", e))?;
            out.removed_frameworks.push(key.value().to_string());
        }
        let table = read
            .open_table(META)
            .map_err(|e| self.error("cannot open table meta", e))?;
        out.id_epoch = table
            .get(META_EPOCH)
            .map_err(|e| self.error("reading meta", e))?
            .map(|v| v.value())
            .unwrap_or(0);
        let table = read
            .open_table(JOBS)
            .map_err(|e| self.error("cannot open table jobs", e))?;
        for row in table.iter().map_err(|e| self.error("reading jobs", e))? {
            let (key, value) = row.map_err(|e| self.error("reading jobs", e))?;
            let record = serde_json::from_slice(value.value())
                .map_err(|e| self.error("bad job record", format!("{}: {e}", key.value())))?;
            out.jobs.push((key.value().to_string(), record));
        }
        let table = read
            .open_table(JOBS_META)
            .map_err(|e| self.error("cannot open table jobs_meta", e))?;
        if let Some(value) = table
            .get(JOBS_META_KEY)
            .map_err(|e| self.error("reading jobs_meta", e))?
        {
            out.jobs_meta = Some(serde_json::from_slice(value.value()).map_err(|e| {
                self.error("bad jobs_meta record", format!("{JOBS_META_KEY}: {e}"))
            })?);
        }
        Ok(out)
    }

    /// Applies one batch in one durable transaction: when this returns `Ok`, it is on disk.
    pub fn commit(&self, batch: RegistryBatch) -> Result<(), RegistryError> {
        let write = self.begin_durable_write()?;
        self.write_batch(&write, &batch)?;
        self.finish(write)
    }

    /// Applies replicated batches and records `applied` (replication's last applied log id and
    /// membership) in ONE durable transaction: either all of it is on disk or none of it.
    pub fn commit_replicated(
        &self,
        batches: &[RegistryBatch],
        applied: &[u8],
    ) -> Result<(), RegistryError> {
        let write = self.begin_durable_write()?;
        for batch in batches {
            self.write_batch(&write, batch)?;
        }
        self.write_applied(&write, applied)?;
        self.finish(write)
    }

    /// Replication's last applied state as [`Registry::commit_replicated`] or
    /// [`Registry::replace`] recorded it (`None`: nothing was ever replicated here).
    pub fn replication_applied(&self) -> Result<Option<Vec<u8>>, RegistryError> {
        let read = self
            .db
            .begin_read()
            .map_err(|e| self.error("cannot read", e))?;
        self.read_applied(&read)
    }

    /// The registry's full contents as one image (replication's snapshot data), with the
    /// replication state it reflects, both read in one transaction so they agree.
    pub fn export(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), RegistryError> {
        let read = self
            .db
            .begin_read()
            .map_err(|e| self.error("cannot read", e))?;
        let mut image = RegistryImage {
            format: IMAGE_FORMAT,
            ..Default::default()
        };
        self.export_records(&read, FRAMEWORKS, "frameworks", &mut image.frameworks)?;
        self.export_records(&read, AGENTS, "agents", &mut image.agents)?;
        self.export_records(&read, JOBS, "jobs", &mut image.jobs)?;
        self.export_records(&read, JOBS_META, "jobs_meta", &mut image.jobs_meta)?;
        let table = read
            .open_table(TASKS)
            .map_err(|e| self.error("cannot open table tasks", e))?;
        for row in table.iter().map_err(|e| self.error("reading tasks", e))? {
            let (key, value) = row.map_err(|e| self.error("reading tasks", e))?;
            let (fw, task) = key.value();
            let record = std::str::from_utf8(value.value())
                .map_err(|e| self.error("bad task record", format!("{fw}/{task}: {e}")))?;
            image
                .tasks
                .push((fw.to_string(), task.to_string(), record.to_string()));
        }
        let table = read
            .open_table(REMOVED)
            .map_err(|e| self.error("cannot open table removed_frameworks", e))?;
        for row in table
            .iter()
            .map_err(|e| self.error("reading removed_frameworks", e))?
        {
            let (key, _) = row.map_err(|e| self.error("reading removed_frameworks", e))?;
            image.removed_frameworks.push(key.value().to_string());
        }
        let table = read
            .open_table(META)
            .map_err(|e| self.error("cannot open table meta", e))?;
        for row in table.iter().map_err(|e| self.error("reading meta", e))? {
            let (key, value) = row.map_err(|e| self.error("reading meta", e))?;
            image.meta.push((key.value().to_string(), value.value()));
        }
        let bytes = serde_json::to_vec(&image).map_err(|e| self.error("encoding an image", e))?;
        Ok((bytes, self.read_applied(&read)?))
    }

    /// Replaces the registry's full contents with an image from [`Registry::export`] (a
    /// replication snapshot) and records `applied`, in one durable transaction. A bad image is
    /// an error and changes nothing.
    pub fn replace(&self, image: &[u8], applied: &[u8]) -> Result<(), RegistryError> {
        // The format first: an image of another version is named as such, not as whatever
        // field it happens to lack.
        #[derive(Deserialize)]
        struct Header {
            format: u32,
        }
        let header: Header =
            serde_json::from_slice(image).map_err(|e| self.error("bad registry image", e))?;
        if header.format != IMAGE_FORMAT {
            return Err(self.error(
                "bad registry image",
                format!(
                    "format {} (this master reads format {IMAGE_FORMAT})",
                    header.format
                ),
            ));
        }
        let image: RegistryImage =
            serde_json::from_slice(image).map_err(|e| self.error("bad registry image", e))?;
        let write = self.begin_durable_write()?;
        for definition in [FRAMEWORKS, AGENTS, JOBS, JOBS_META] {
            write.delete_table(definition).map_err(|e| {
                self.error(
                    "cannot clear a table",
                    format!("{}: {e}", definition.name()),
                )
            })?;
        }
        write
            .delete_table(TASKS)
            .map_err(|e| self.error("cannot clear a table", format!("tasks: {e}")))?;
        write
            .delete_table(REMOVED)
            .map_err(|e| self.error("cannot clear a table", format!("removed_frameworks: {e}")))?;
        write
            .delete_table(META)
            .map_err(|e| self.error("cannot clear a table", format!("meta: {e}")))?;
        {
            for (definition, rows) in [
                (FRAMEWORKS, &image.frameworks),
                (AGENTS, &image.agents),
                (JOBS, &image.jobs),
                (JOBS_META, &image.jobs_meta),
            ] {
                let mut table = write
                    .open_table(definition)
                    .map_err(|e| self.error("cannot open a table", e))?;
                for (key, record) in rows {
                    table
                        .insert(key.as_str(), record.as_bytes())
                        .map_err(|e| self.error("writing an image", e))?;
                }
            }
            let mut table = write
                .open_table(TASKS)
                .map_err(|e| self.error("cannot open table tasks", e))?;
            for (fw, task, record) in &image.tasks {
                table
                    .insert((fw.as_str(), task.as_str()), record.as_bytes())
                    .map_err(|e| self.error("writing an image", e))?;
            }
            let mut table = write
                .open_table(REMOVED)
                .map_err(|e| self.error("cannot open table removed_frameworks", e))?;
            for id in &image.removed_frameworks {
                table
                    .insert(id.as_str(), ())
                    .map_err(|e| self.error("writing an image", e))?;
            }
            let mut table = write
                .open_table(META)
                .map_err(|e| self.error("cannot open table meta", e))?;
            for (key, value) in &image.meta {
                table
                    .insert(key.as_str(), *value)
                    .map_err(|e| self.error("writing an image", e))?;
            }
        }
        self.write_applied(&write, applied)?;
        self.finish(write)
    }

    fn export_records(
        &self,
        read: &redb::ReadTransaction,
        definition: TableDefinition<&str, &[u8]>,
        what: &'static str,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), RegistryError> {
        let table = read
            .open_table(definition)
            .map_err(|e| self.error("cannot open a table", format!("{what}: {e}")))?;
        for row in table
            .iter()
            .map_err(|e| self.error("reading a table", format!("{what}: {e}")))?
        {
            let (key, value) =
                row.map_err(|e| self.error("reading a table", format!("{what}: {e}")))?;
            // Records are JSON, so UTF-8: anything else is a corrupt record, named.
            let record = std::str::from_utf8(value.value())
                .map_err(|e| self.error("bad record", format!("{what} {}: {e}", key.value())))?;
            out.push((key.value().to_string(), record.to_string()));
        }
        Ok(())
    }

    fn read_applied(&self, read: &redb::ReadTransaction) -> Result<Option<Vec<u8>>, RegistryError> {
        let table = read
            .open_table(REPLICATION)
            .map_err(|e| self.error("cannot open table replication", e))?;
        Ok(table
            .get(REPLICATION_APPLIED_KEY)
            .map_err(|e| self.error("reading replication", e))?
            .map(|v| v.value().to_vec()))
    }

    fn write_applied(
        &self,
        write: &redb::WriteTransaction,
        applied: &[u8],
    ) -> Result<(), RegistryError> {
        let mut table = write
            .open_table(REPLICATION)
            .map_err(|e| self.error("cannot open table replication", e))?;
        table
            .insert(REPLICATION_APPLIED_KEY, applied)
            .map_err(|e| self.error("writing replication", e))?;
        Ok(())
    }

    fn begin_durable_write(&self) -> Result<redb::WriteTransaction, RegistryError> {
        let mut write = self
            .db
            .begin_write()
            .map_err(|e| self.error("cannot begin a write", e))?;
        write
            .set_durability(Durability::Immediate)
            .map_err(|e| self.error("cannot set durability", e))?;
        Ok(write)
    }

    fn finish(&self, write: redb::WriteTransaction) -> Result<(), RegistryError> {
        #[cfg(test)]
        if self.fail_commits.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(self.error("cannot commit", "failure injected by a test"));
        }
        write.commit().map_err(|e| self.error("cannot commit", e))
    }

    /// Writes one batch's records inside `write` (not committed here).
    fn write_batch(
        &self,
        write: &redb::WriteTransaction,
        batch: &RegistryBatch,
    ) -> Result<(), RegistryError> {
        {
            let mut table = write
                .open_table(FRAMEWORKS)
                .map_err(|e| self.error("cannot open table frameworks", e))?;
            for (id, entry) in &batch.frameworks {
                match entry {
                    Some(entry) => {
                        let bytes = serde_json::to_vec(entry)
                            .map_err(|e| self.error("encoding a framework", e))?;
                        table.insert(id.as_str(), bytes.as_slice())
                    }
                    None => table.remove(id.as_str()),
                }
                .map_err(|e| self.error("writing frameworks", e))?;
            }
            let mut table = write
                .open_table(AGENTS)
                .map_err(|e| self.error("cannot open table agents", e))?;
            for (id, entry) in &batch.agents {
                match entry {
                    Some(entry) => {
                        let bytes = serde_json::to_vec(entry)
                            .map_err(|e| self.error("encoding an agent", e))?;
                        table.insert(id.as_str(), bytes.as_slice())
                    }
                    None => table.remove(id.as_str()),
                }
                .map_err(|e| self.error("writing agents", e))?;
            }
            let mut table = write
                .open_table(TASKS)
                .map_err(|e| self.error("cannot open table tasks", e))?;
            for ((fw, task), entry) in &batch.tasks {
                let key = (fw.as_str(), task.as_str());
                match entry {
                    Some(entry) => {
                        let bytes = serde_json::to_vec(entry)
                            .map_err(|e| self.error("encoding a task", e))?;
                        table.insert(key, bytes.as_slice())
                    }
                    None => table.remove(key),
                }
                .map_err(|e| self.error("writing tasks", e))?;
            }
            let mut table = write
                .open_table(REMOVED)
                .map_err(|e| self.error("cannot open table removed_frameworks", e))?;
            for id in &batch.removed_frameworks {
                table
                    .insert(id.as_str(), ())
                    .map_err(|e| self.error("writing removed_frameworks", e))?;
            }
            for id in &batch.forgotten_frameworks {
                table
                    .remove(id.as_str())
                    .map_err(|e| self.error("writing removed_frameworks", e))?;
            }
            let mut table = write
                .open_table(META)
                .map_err(|e| self.error("cannot open table meta", e))?;
            if let Some(epoch) = batch.id_epoch {
                table
                    .insert(META_EPOCH, epoch)
                    .map_err(|e| self.error("writing meta", e))?;
            }
            let mut table = write
                .open_table(JOBS)
                .map_err(|e| self.error("cannot open table jobs", e))?;
            for (name, record) in &batch.jobs {
                match record {
                    Some(record) => {
                        let bytes = serde_json::to_vec(record)
                            .map_err(|e| self.error("encoding a job", e))?;
                        table.insert(name.as_str(), bytes.as_slice())
                    }
                    None => table.remove(name.as_str()),
                }
                .map_err(|e| self.error("writing jobs", e))?;
            }
            let mut table = write
                .open_table(JOBS_META)
                .map_err(|e| self.error("cannot open table jobs_meta", e))?;
            if let Some(meta) = &batch.jobs_meta {
                let bytes =
                    serde_json::to_vec(meta).map_err(|e| self.error("encoding jobs_meta", e))?;
                table
                    .insert(JOBS_META_KEY, bytes.as_slice())
                    .map_err(|e| self.error("writing jobs_meta", e))?;
            }
        }
        Ok(())
    }
}

/// A registry's full contents, table by table, as [`Registry::export`] writes it and
/// [`Registry::replace`] reads it. Records stay their stored JSON text, byte for byte, so an
/// image neither drops fields this master does not know nor re-encodes anything.
#[derive(Debug, Default, Serialize, Deserialize)]
struct RegistryImage {
    format: u32,
    frameworks: Vec<(String, String)>,
    agents: Vec<(String, String)>,
    /// (framework id, task id, record).
    tasks: Vec<(String, String, String)>,
    removed_frameworks: Vec<String>,
    meta: Vec<(String, u64)>,
    jobs: Vec<(String, String)>,
    jobs_meta: Vec<(String, String)>,
}

#[cfg(test)]
mod split_tests {
    use super::*;

    fn agent(i: usize) -> (String, Option<AgentEntry>) {
        (format!("agent-{i:04}"), None)
    }

    #[test]
    fn a_large_batch_splits_into_parts_under_the_limit_that_keep_every_record_once() {
        let batch = RegistryBatch {
            agents: (0..1000).map(agent).collect(),
            tasks: (0..500)
                .map(|i| (("f".to_string(), format!("t{i}")), None))
                .collect(),
            id_epoch: Some(7),
            ..Default::default()
        };
        let json = |b: &RegistryBatch| serde_json::to_vec(b).unwrap().len();
        let whole = json(&batch);
        let limit = whole / 5;
        let parts = batch.clone().into_parts(limit, &json);
        assert!(parts.len() >= 5, "{}", parts.len());
        for part in &parts {
            assert!(serde_json::to_vec(part).unwrap().len() <= limit);
        }
        let agents: Vec<_> = parts.iter().flat_map(|p| p.agents.clone()).collect();
        let tasks: Vec<_> = parts.iter().flat_map(|p| p.tasks.clone()).collect();
        assert_eq!(agents, batch.agents, "every agent once, in order");
        assert_eq!(tasks, batch.tasks);
        assert_eq!(parts[0].id_epoch, Some(7));
        assert!(parts[1..].iter().all(|p| p.id_epoch.is_none()));
        // Under the limit: one part, untouched.
        assert_eq!(batch.clone().into_parts(whole, &json), vec![batch]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framework(id: &str) -> FrameworkEntry {
        FrameworkEntry {
            id: id.into(),
            name: "exec".into(),
            user: "alice".into(),
            weight: 2.0,
            partition: "default".into(),
            failover_timeout_secs: 30.0,
            principal: String::new(),
        }
    }

    fn task(fw: &str, id: &str, state: i32) -> TaskEntry {
        TaskEntry {
            framework_id: fw.into(),
            task_id: id.into(),
            agent_id: "a1".into(),
            name: id.into(),
            resources: "cpus:1;mem:128".into(),
            devices: "gpu:0:500:0".into(),
            state,
            reason: String::new(),
            message: String::new(),
            exit_code: None,
            priority: 0,
            at_user_priority: true,
            user: "alice".into(),
            partition: "default".into(),
            started: 1,
            preempted: false,
            terminal_unacked: false,
        }
    }

    #[test]
    fn a_new_registry_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let recovered = registry.load().unwrap();
        assert!(recovered.is_empty());
        assert_eq!(recovered.id_epoch, 0);
    }

    #[test]
    fn committed_records_survive_a_reopen_and_deletions_stick() {
        let dir = tempfile::tempdir().unwrap();
        {
            let registry = Registry::open(dir.path()).unwrap();
            registry
                .commit(RegistryBatch {
                    frameworks: vec![
                        ("f1".into(), Some(framework("f1"))),
                        ("f2".into(), Some(framework("f2"))),
                    ],
                    agents: vec![(
                        "a1".into(),
                        Some(AgentEntry {
                            id: "a1".into(),
                            hostname: "h1".into(),
                            total: "cpus:4;mem:8192".into(),
                            attributes: vec![("rack".into(), "r1".into())],
                            lost: false,
                            principal: "ops".into(),
                        }),
                    )],
                    tasks: vec![
                        (("f1".into(), "t1".into()), Some(task("f1", "t1", 2))),
                        (("f1".into(), "t2".into()), Some(task("f1", "t2", 1))),
                    ],
                    removed_frameworks: vec![],
                    forgotten_frameworks: vec![],
                    id_epoch: Some(77),
                    ..Default::default()
                })
                .unwrap();
            registry
                .commit(RegistryBatch {
                    frameworks: vec![("f2".into(), None)],
                    tasks: vec![
                        (("f1".into(), "t2".into()), None),
                        (("f1".into(), "t1".into()), Some(task("f1", "t1", 3))),
                    ],
                    removed_frameworks: vec!["f2".into()],
                    ..Default::default()
                })
                .unwrap();
        }
        let registry = Registry::open(dir.path()).unwrap();
        let recovered = registry.load().unwrap();
        assert_eq!(recovered.frameworks, vec![framework("f1")]);
        assert_eq!(recovered.agents.len(), 1);
        assert_eq!(recovered.agents[0].attributes[0].1, "r1");
        assert_eq!(recovered.tasks, vec![task("f1", "t1", 3)]);
        assert_eq!(recovered.removed_frameworks, vec!["f2".to_string()]);
        assert_eq!(recovered.id_epoch, 77);
    }

    #[test]
    fn a_corrupt_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let write = registry.db.begin_write().unwrap();
        {
            let mut table = write.open_table(FRAMEWORKS).unwrap();
            table.insert("f9", b"not json".as_slice()).unwrap();
        }
        write.commit().unwrap();
        let error = registry.load().unwrap_err().to_string();
        assert!(error.contains("bad framework record"), "{error}");
        assert!(error.contains("f9"), "{error}");
    }

    #[test]
    fn an_unusable_work_dir_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let error = Registry::open(&file).err().unwrap().to_string();
        assert!(error.contains("plain-file"), "{error}");
    }

    #[test]
    fn jobs_and_the_jobs_framework_record_survive_a_reopen_and_a_purge_sticks() {
        let dir = tempfile::tempdir().unwrap();
        let web = serde_json::json!({"spec": {"name": "web", "count": 2}, "stopped": false});
        let meta = JobsMeta {
            framework_id: Some("5f-F1".into()),
            generation: 3,
            partitions: [("gpu".to_string(), "5f-F2".to_string())].into(),
        };
        {
            let registry = Registry::open(dir.path()).unwrap();
            assert!(registry.load().unwrap().jobs_meta.is_none());
            registry
                .commit(RegistryBatch {
                    jobs: vec![
                        ("web".into(), Some(web.clone())),
                        ("once".into(), Some(serde_json::json!({"spec": {}}))),
                    ],
                    jobs_meta: Some(meta.clone()),
                    ..Default::default()
                })
                .unwrap();
            registry
                .commit(RegistryBatch {
                    jobs: vec![("once".into(), None)],
                    ..Default::default()
                })
                .unwrap();
        }
        let recovered = Registry::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(recovered.jobs, vec![("web".to_string(), web)]);
        assert_eq!(recovered.jobs_meta, Some(meta));
    }

    #[test]
    fn a_corrupt_job_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        let write = registry.db.begin_write().unwrap();
        {
            let mut table = write.open_table(JOBS).unwrap();
            table.insert("web", b"{not json".as_slice()).unwrap();
        }
        write.commit().unwrap();
        let error = registry.load().unwrap_err().to_string();
        assert!(
            error.contains("bad job record") && error.contains("web"),
            "{error}"
        );
    }

    #[test]
    fn an_exported_image_replaces_another_registry_whole() {
        let source_dir = tempfile::tempdir().unwrap();
        let source = Registry::open(source_dir.path()).unwrap();
        source
            .commit_replicated(
                &[RegistryBatch {
                    frameworks: vec![("f1".into(), Some(framework("f1")))],
                    tasks: vec![(("f1".into(), "t1".into()), Some(task("f1", "t1", 1)))],
                    removed_frameworks: vec!["f0".into()],
                    id_epoch: Some(42),
                    jobs: vec![("web".into(), Some(serde_json::json!({"spec": {}})))],
                    jobs_meta: Some(JobsMeta {
                        framework_id: Some("j".into()),
                        generation: 2,
                        partitions: [("gpu".to_string(), "jg".to_string())].into(),
                    }),
                    ..Default::default()
                }],
                b"applied-1",
            )
            .unwrap();
        let (image, applied) = source.export().unwrap();
        assert_eq!(applied.as_deref(), Some(b"applied-1".as_slice()));

        let target_dir = tempfile::tempdir().unwrap();
        let target = Registry::open(target_dir.path()).unwrap();
        assert_eq!(target.replication_applied().unwrap(), None);
        target
            .commit(RegistryBatch {
                frameworks: vec![("stale".into(), Some(framework("stale")))],
                tasks: vec![(("stale".into(), "t".into()), Some(task("stale", "t", 1)))],
                ..Default::default()
            })
            .unwrap();
        target.replace(&image, b"applied-2").unwrap();
        let (a, b) = (source.load().unwrap(), target.load().unwrap());
        assert_eq!(b.frameworks, a.frameworks);
        assert_eq!(b.tasks, a.tasks);
        assert_eq!(b.removed_frameworks, vec!["f0".to_string()]);
        assert_eq!(b.id_epoch, 42);
        assert_eq!(b.jobs, a.jobs);
        assert_eq!(b.jobs_meta, a.jobs_meta);
        assert_eq!(
            target.replication_applied().unwrap().as_deref(),
            Some(b"applied-2".as_slice())
        );
    }

    #[test]
    fn a_bad_image_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        registry
            .commit(RegistryBatch {
                frameworks: vec![("f1".into(), Some(framework("f1")))],
                ..Default::default()
            })
            .unwrap();
        let error = registry
            .replace(b"{not json", b"x")
            .unwrap_err()
            .to_string();
        assert!(error.contains("bad registry image"), "{error}");
        let error = registry
            .replace(br#"{"format": 99}"#, b"x")
            .unwrap_err()
            .to_string();
        assert!(error.contains("format 99"), "{error}");
        assert_eq!(registry.load().unwrap().frameworks, vec![framework("f1")]);
        assert_eq!(registry.replication_applied().unwrap(), None);
    }

    #[test]
    fn a_batch_round_trips_through_its_log_encoding() {
        let batch = RegistryBatch {
            frameworks: vec![("f1".into(), Some(framework("f1"))), ("f2".into(), None)],
            tasks: vec![(("f1".into(), "t1".into()), Some(task("f1", "t1", 2)))],
            jobs: vec![(
                "web".into(),
                Some(serde_json::json!({"spec": {"count": 1}})),
            )],
            id_epoch: Some(7),
            ..Default::default()
        };
        let bytes = crate::master::replication::codec::encode(&batch).unwrap();
        assert_eq!(
            crate::master::replication::codec::decode::<RegistryBatch>(&bytes).unwrap(),
            batch
        );
    }

    #[test]
    fn a_failed_commit_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path()).unwrap();
        registry
            .fail_commits
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let batch = RegistryBatch {
            jobs: vec![("web".into(), Some(serde_json::json!({})))],
            ..Default::default()
        };
        assert!(registry.commit(batch).is_err());
        registry
            .fail_commits
            .store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(registry.load().unwrap().jobs.is_empty());
    }
}
