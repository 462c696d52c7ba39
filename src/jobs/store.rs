//! What the jobs framework needs of a store for its records, and the records' own types.
//!
//! The framework keeps its jobs (one JSON record per job, [`super::records`]) and its own
//! record ([`JobsMeta`]) in a store it is given: [`start`](super::runner::start) takes a
//! [`JobsStore`] and what the store held at start ([`LoadedJobs`]). The master that runs the
//! framework provides the implementation (it writes the records in its registry, in an actor
//! turn's group commit); the framework knows only this interface, so it depends on the master
//! for nothing but what the master hands it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The built-in jobs framework's own record: its framework ids and how many times it started
/// (task ids carry the count, so none is reused).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobsMeta {
    /// The framework of the default partition (`ringmaster-jobs`).
    #[serde(default)]
    pub framework_id: Option<String>,
    #[serde(default)]
    pub generation: u32,
    /// The frameworks of the other partitions (`ringmaster-jobs/<partition>`), by partition.
    /// Absent in records of older masters (they had the default partition's only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<String, String>,
}

/// What the store held for the jobs framework when it started.
#[derive(Debug, Default)]
pub struct LoadedJobs {
    /// Job name -> its record.
    pub jobs: Vec<(String, serde_json::Value)>,
    /// `None`: the jobs framework never started on this store (or there is none).
    pub meta: Option<JobsMeta>,
}

/// Where the jobs framework writes its records.
#[async_trait::async_trait]
pub trait JobsStore: Send + Sync {
    /// Whether the records outlive the process: without a durable store, saves are answered
    /// at once and the jobs live in the jobs framework's memory only.
    fn is_durable(&self) -> bool;

    /// Writes job records (`None`: delete) and, when given, the framework's own record. `Ok`
    /// once they are recorded; `Err` with why not.
    async fn save(
        &self,
        jobs: Vec<(String, Option<serde_json::Value>)>,
        meta: Option<JobsMeta>,
    ) -> Result<(), String>;
}
