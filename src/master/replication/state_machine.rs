//! The Raft state machine: the master's existing registry (`registry.redb`).
//!
//! Why the registry itself: every master already recovers from its registry at start; if
//! committed entries land there, a master that restarts (or takes over as leader) recovers
//! exactly as a single master does today. Each `apply` call writes its batches and the new
//! last applied log id and membership in ONE registry transaction
//! ([`Registry::commit_replicated`]), so after a crash the registry and its applied point
//! always agree: no entry is applied twice, none is lost.
//!
//! A snapshot is the registry's full contents ([`Registry::export`]); installing one replaces
//! them ([`Registry::replace`]) and sets the applied point from the snapshot's metadata, again
//! in one transaction. The current snapshot is kept in memory only: after a restart openraft
//! builds a fresh one when the log was purged, and the registry is the durable state anyway.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::super::registry::{Registry, RegistryBatch, RegistryError};
use super::{NodeAddr, NodeId, TypeConfig};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The replication state recorded in the registry next to the records it covers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, NodeAddr>,
}

impl Applied {
    fn encode(&self) -> StorageResult<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| {
            StorageIOError::new(
                ErrorSubject::StateMachine,
                ErrorVerb::Write,
                AnyError::new(&e),
            )
            .into()
        })
    }

    fn decode(bytes: Option<Vec<u8>>) -> StorageResult<Applied> {
        match bytes {
            None => Ok(Applied::default()),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                StorageIOError::read_state_machine(AnyError::error(format!(
                    "bad replication record in the registry: {e}"
                )))
                .into()
            }),
        }
    }
}

/// The replication record [`Registry::commit_replicated`] takes for a registry applied up to
/// `last_applied` with `last_membership`: how `super::seed` makes a single master's registry a
/// group's state machine.
pub(crate) fn applied_record(
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, NodeAddr>,
) -> StorageResult<Vec<u8>> {
    Applied {
        last_applied,
        last_membership,
    }
    .encode()
}

/// The snapshot last built or installed.
#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, NodeAddr>,
    data: Arc<Vec<u8>>,
}

/// The state machine over one registry.
pub(crate) struct StateMachine {
    registry: Arc<Registry>,
    /// What the registry records, cached: only this state machine writes it.
    applied: Applied,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    /// Makes snapshot ids unique among snapshots of the same log id.
    builds: Arc<AtomicU64>,
    /// Snapshots received from a leader and installed (a master catching up from far behind).
    installed: Arc<AtomicU64>,
}

impl StateMachine {
    /// A state machine over `registry`, resuming from the applied point the registry records.
    pub(crate) fn new(registry: Arc<Registry>) -> StorageResult<StateMachine> {
        let applied = Applied::decode(registry.replication_applied().map_err(read_error)?)?;
        Ok(StateMachine {
            registry,
            applied,
            current: Default::default(),
            builds: Default::default(),
            installed: Default::default(),
        })
    }

    /// How many snapshots this state machine installed from a leader since it was opened
    /// (shared: it goes on counting once openraft owns the state machine).
    pub(crate) fn installed_snapshots(&self) -> Arc<AtomicU64> {
        self.installed.clone()
    }

    /// The registry the entries are applied to.
    #[cfg(test)]
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

fn read_error(e: RegistryError) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn write_error(e: RegistryError) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

/// Runs a registry call on a blocking thread: a durable commit waits on an fsync.
async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> StorageResult<T> + Send + 'static,
) -> StorageResult<T> {
    tokio::task::spawn_blocking(job).await.map_err(|e| {
        StorageIOError::new(
            ErrorSubject::StateMachine,
            ErrorVerb::Write,
            AnyError::error(e.to_string()),
        )
    })?
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, NodeAddr>)> {
        Ok((
            self.applied.last_applied,
            self.applied.last_membership.clone(),
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<()>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = self.applied.clone();
        let mut batches: Vec<RegistryBatch> = Vec::new();
        let mut count = 0;
        for entry in entries {
            count += 1;
            applied.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => batches.push(batch),
                EntryPayload::Membership(membership) => {
                    applied.last_membership = StoredMembership::new(Some(entry.log_id), membership)
                }
            }
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        let bytes = applied.encode()?;
        let registry = self.registry.clone();
        blocking(move || {
            registry
                .commit_replicated(&batches, &bytes)
                .map_err(write_error)
        })
        .await?;
        self.applied = applied;
        Ok(vec![(); count])
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            registry: self.registry.clone(),
            current: self.current.clone(),
            builds: self.builds.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeAddr>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let applied = Applied {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
        };
        let bytes = applied.encode()?;
        let data = Arc::new(snapshot.into_inner());
        let registry = self.registry.clone();
        let image = data.clone();
        let signature = meta.signature();
        blocking(move || {
            registry.replace(&image, &bytes).map_err(|e| {
                StorageIOError::write_snapshot(Some(signature), AnyError::new(&e)).into()
            })
        })
        .await?;
        self.applied = applied;
        *lock(&self.current) = Some(StoredSnapshot {
            meta: meta.clone(),
            data,
        });
        self.installed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        Ok(lock(&self.current).clone().map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data.as_ref().clone())),
        }))
    }
}

/// A poisoned lock only means another thread panicked while holding it; the snapshot slot
/// itself is always whole (it is replaced in one assignment), so keep using it.
fn lock(slot: &Mutex<Option<StoredSnapshot>>) -> std::sync::MutexGuard<'_, Option<StoredSnapshot>> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Builds snapshots from the registry, off the state machine's task.
pub(crate) struct SnapshotBuilder {
    registry: Arc<Registry>,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    builds: Arc<AtomicU64>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let registry = self.registry.clone();
        // The image and the applied point come from one read transaction, so they agree even
        // while entries keep being applied.
        let (data, applied) = blocking(move || registry.export().map_err(read_error)).await?;
        let applied = Applied::decode(applied)?;
        let build = self.builds.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match &applied.last_applied {
            Some(id) => format!("{}-{}-{build}", id.leader_id, id.index),
            None => format!("none-{build}"),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.last_membership,
            snapshot_id,
        };
        let data = Arc::new(data);
        {
            // A snapshot installed meanwhile may be newer than this build: keep the newest.
            let mut current = lock(&self.current);
            let newer = current
                .as_ref()
                .is_none_or(|c| c.meta.last_log_id <= meta.last_log_id);
            if newer {
                *current = Some(StoredSnapshot {
                    meta: meta.clone(),
                    data: data.clone(),
                });
            }
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data.as_ref().clone())),
        })
    }
}
