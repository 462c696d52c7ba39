//! How the jobs framework's state is kept in the master's registry: one record per job (its
//! spec, whether it is stopped, and the outcomes of its batch instances that ended for good,
//! which reconciliation cannot tell a restarted master) and the framework's own record
//! ([`JobsMeta`]: framework id, start count). Also the one-time import of the `jobs.json` an
//! older master kept next to its registry.
//!
//! The registry stores the records as JSON without knowing their schema; this module is the
//! one place that maps the [`Engine`] to them and back.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::engine::{Engine, Outcome};
use super::spec::JobSpec;
use super::store::{JobsMeta, JobsStore, LoadedJobs};

/// The file an older master kept the jobs in, in its work dir.
pub const JOBS_FILE: &str = "jobs.json";
/// What [`JOBS_FILE`] is renamed to once imported.
pub const IMPORTED_FILE: &str = "jobs.json.imported";

/// One job as the registry keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    #[serde(default)]
    pub stopped: bool,
    /// Instances that ended for good (batch: succeeded or failed; service: the one whose
    /// end made the job give up).
    #[serde(default)]
    pub outcomes: Vec<Outcome>,
    /// Why a service gave up (restarted too often), if it did: it stays failed after a
    /// restart until it is run again. Absent in records of older masters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Each instance's restarts, `[index, count]` where not zero (`job status` RESTARTS after
    /// a master restart or a leader change). Absent in records of older masters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<(u32, u32)>,
}

impl JobRecord {
    /// The record of job `name` as the engine has it now; `None` once it is gone (purged).
    pub fn of(engine: &Engine, name: &str) -> Option<JobRecord> {
        let job = engine.job(name)?;
        Some(JobRecord {
            spec: job.spec.clone(),
            stopped: job.stopped,
            outcomes: engine.outcomes().remove(name).unwrap_or_default(),
            failed: job.failed.clone(),
            restarts: engine.restarts(name),
        })
    }

    /// The record as the registry stores it.
    pub fn encode(engine: &Engine, name: &str) -> Result<Option<serde_json::Value>, String> {
        JobRecord::of(engine, name)
            .map(|record| serde_json::to_value(record).map_err(|e| e.to_string()))
            .transpose()
    }

    /// Reads a stored record; the error names the job.
    pub fn decode(name: &str, value: serde_json::Value) -> Result<JobRecord, String> {
        serde_json::from_value(value).map_err(|e| format!("registry: bad job record `{name}`: {e}"))
    }

    /// Puts the job back into a new engine, its ended batch instances ended.
    pub fn restore(self, engine: &mut Engine) {
        let name = self.spec.name.clone();
        engine.put(self.spec);
        engine.restore_outcomes(&name, &self.outcomes);
        engine.restore_restarts(&name, &self.restarts);
        if let Some(why) = &self.failed {
            engine.restore_failed(&name, why);
        }
        if self.stopped {
            engine.stop(&name, false);
        }
    }
}

/// `jobs.json` as older masters wrote it.
#[derive(Default, Deserialize)]
struct LegacyFile {
    framework_id: Option<String>,
    #[serde(default)]
    generation: u32,
    jobs: Vec<JobSpec>,
    #[serde(default)]
    outcomes: BTreeMap<String, Vec<Outcome>>,
}

/// When `<work_dir>/jobs.json` exists and the registry holds no jobs framework yet, imports
/// it once: every job and the framework's record go into the registry in one commit, then the
/// file is renamed to `jobs.json.imported` and `loaded` holds what was imported. A registry
/// that already has the jobs framework's record wins: the file is left alone.
pub async fn import_jobs_file(
    work_dir: &Path,
    loaded: &mut LoadedJobs,
    store: &dyn JobsStore,
) -> anyhow::Result<()> {
    let path = work_dir.join(JOBS_FILE);
    if !path.exists() {
        return Ok(());
    }
    if loaded.meta.is_some() || !loaded.jobs.is_empty() {
        tracing::warn!(file = %path.display(),
            "the registry already holds the jobs: the old jobs file is ignored");
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    let file: LegacyFile = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a jobs file: {e}", path.display()))?;
    let mut outcomes = file.outcomes;
    let mut jobs = Vec::new();
    for spec in file.jobs {
        let record = JobRecord {
            outcomes: outcomes.remove(&spec.name).unwrap_or_default(),
            stopped: false,
            failed: None,
            restarts: Vec::new(),
            spec,
        };
        jobs.push((record.spec.name.clone(), serde_json::to_value(&record)?));
    }
    let meta = JobsMeta {
        framework_id: file.framework_id,
        generation: file.generation,
        ..JobsMeta::default()
    };
    store
        .save(
            jobs.iter()
                .map(|(n, v)| (n.clone(), Some(v.clone())))
                .collect(),
            Some(meta.clone()),
        )
        .await
        .map_err(|e| anyhow::anyhow!("importing {}: {e}", path.display()))?;
    let imported = work_dir.join(IMPORTED_FILE);
    std::fs::rename(&path, &imported)
        .map_err(|e| anyhow::anyhow!("{}: cannot rename: {e}", path.display()))?;
    tracing::info!(jobs = jobs.len(), from = %path.display(), to = %imported.display(),
        "imported the jobs file into the registry");
    loaded.jobs = jobs;
    loaded.meta = Some(meta);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::engine::InstanceState;
    use crate::jobs::spec::parse_job_spec;

    fn spec(name: &str, kind: &str, count: u32) -> JobSpec {
        parse_job_spec(
            &format!(
                "name: {name}\ntype: {kind}\ncount: {count}\ntask:\n  command: run\n  \
                 resources: cpus:1\n"
            ),
            "t.yaml",
        )
        .unwrap()
    }

    fn states(engine: &Engine, name: &str) -> Vec<InstanceState> {
        engine
            .job(name)
            .unwrap()
            .instances
            .iter()
            .map(|i| i.state)
            .collect()
    }

    #[test]
    fn a_record_round_trips_outcomes_scale_and_stop_into_a_new_engine() {
        let mut engine = Engine::with_generation(1);
        engine.put(spec("once", "batch", 2));
        engine.put(spec("web", "service", 1));
        engine.scale("web", 3);
        engine.stop("web", false);
        engine.restore_outcomes(
            "once",
            &[Outcome {
                index: 1,
                succeeded: false,
                exit_code: Some(3),
            }],
        );
        let stored: Vec<(String, serde_json::Value)> = ["once", "web"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    JobRecord::encode(&engine, n).unwrap().unwrap(),
                )
            })
            .collect();

        let mut again = Engine::with_generation(2);
        for (name, value) in stored {
            JobRecord::decode(&name, value).unwrap().restore(&mut again);
        }
        assert_eq!(
            states(&again, "once"),
            [InstanceState::Pending, InstanceState::Failed]
        );
        let once = again.job("once").unwrap();
        assert_eq!(once.instances[1].last_exit_code, Some(3));
        let web = again.job("web").unwrap();
        assert_eq!(web.spec.count, 3, "the scaled count is kept");
        assert!(web.stopped, "a stopped job stays stopped");
        assert_eq!(states(&again, "web"), [InstanceState::Stopped; 3]);
        assert_eq!(JobRecord::encode(&again, "gone").unwrap(), None);
    }

    #[test]
    fn a_failed_service_is_kept_failed_and_older_records_read() {
        let mut engine = Engine::with_generation(1);
        engine.put(spec("web", "service", 1));
        engine.restore_failed("web", "more than 3 restarts within 10m");
        let value = JobRecord::encode(&engine, "web").unwrap().unwrap();
        assert_eq!(value["failed"], "more than 3 restarts within 10m");
        let mut again = Engine::with_generation(2);
        JobRecord::decode("web", value).unwrap().restore(&mut again);
        let web = again.job("web").unwrap();
        assert_eq!(
            web.failed.as_deref(),
            Some("more than 3 restarts within 10m")
        );
        assert!(web.done());
        assert_eq!(again.demand("default", tokio::time::Instant::now()), None);
        // A record without `failed` (an older master's, or a job that did not fail).
        let old = serde_json::json!({"spec": spec("web", "service", 1)});
        let record = JobRecord::decode("web", old).unwrap();
        assert_eq!(record.failed, None);
        engine.put(spec("web", "service", 1));
        let value = JobRecord::encode(&engine, "web").unwrap().unwrap();
        assert!(value.get("failed").is_none(), "{value}");
    }

    #[test]
    fn an_older_jobs_meta_reads_as_the_default_partitions_framework() {
        let old: JobsMeta =
            serde_json::from_str(r#"{"framework_id": "1-F1", "generation": 4}"#).unwrap();
        assert_eq!(old.framework_id.as_deref(), Some("1-F1"));
        assert!(old.partitions.is_empty());
        let mut meta = old.clone();
        meta.partitions.insert("gpu".into(), "1-F2".into());
        let json = serde_json::to_value(&meta).unwrap();
        assert_eq!(json["partitions"]["gpu"], "1-F2");
        assert_eq!(serde_json::from_value::<JobsMeta>(json).unwrap(), meta);
        // Without other partitions it is written as before.
        assert!(serde_json::to_value(&old)
            .unwrap()
            .get("partitions")
            .is_none());
    }

    #[test]
    fn a_bad_record_is_an_error_naming_the_job() {
        let error = JobRecord::decode("web", serde_json::json!({"spec": 7})).unwrap_err();
        assert!(error.contains("`web`"), "{error}");
    }
}
