//! The Raft log, vote, committed log id and purge point, durable in `<work-dir>/raft.redb`.
//!
//! Why a file of its own: the log is written on every entry a follower receives (before it is
//! committed, so before the registry may see it) and is truncated and purged by Raft's rules,
//! which have nothing to do with the registry's records. Keeping it out of `registry.redb`
//! keeps the registry's format unchanged and lets each file be compacted on its own.
//!
//! Every write but the committed id's is a durable (`Durability::Immediate`) redb
//! transaction, run on a blocking thread so the Raft core's task never waits on an fsync. `append` acknowledges entries to
//! Raft only after their transaction committed: a vote or an acknowledged entry survives a
//! crash, as Raft's safety requires. Entries are JSON (the payload holds JSON job records, so
//! the encoding must be self-describing); a record that does not decode is an error, never a
//! panic.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{NodeId, TypeConfig};

/// The file name of the Raft log inside the work dir.
pub(crate) const RAFT_FILE: &str = "raft.redb";

/// Log index -> the entry (JSON).
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Small values under the keys below (JSON).
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const PURGED_KEY: &str = "last_purged";

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The log store. Clones share the database: one is Raft's writer, the others its readers.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
    path: Arc<PathBuf>,
}

impl LogStore {
    /// Opens (or creates) `<work_dir>/raft.redb`, creating `work_dir` when missing.
    pub(crate) fn open(work_dir: &Path) -> io::Result<LogStore> {
        let path = work_dir.join(RAFT_FILE);
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            io::Error::other(format!("raft log {}: {what}: {e}", path.display()))
        };
        std::fs::create_dir_all(work_dir).map_err(|e| fail("cannot create the work dir", &e))?;
        let db = Database::create(&path).map_err(|e| fail("cannot open", &e))?;
        let write = db
            .begin_write()
            .map_err(|e| fail("cannot begin a write", &e))?;
        write
            .open_table(LOG)
            .map_err(|e| fail("cannot create table log", &e))?;
        write
            .open_table(STATE)
            .map_err(|e| fail("cannot create table state", &e))?;
        write.commit().map_err(|e| fail("cannot commit", &e))?;
        Ok(LogStore {
            db: Arc::new(db),
            path: Arc::new(path),
        })
    }

    fn read_state<T: DeserializeOwned>(
        &self,
        key: &str,
        subject: ErrorSubject<NodeId>,
    ) -> StorageResult<Option<T>> {
        let err = |e: AnyError| StorageIOError::new(subject.clone(), ErrorVerb::Read, e);
        let read = self.db.begin_read().map_err(|e| err(AnyError::new(&e)))?;
        let table = read.open_table(STATE).map_err(|e| err(AnyError::new(&e)))?;
        let Some(value) = table.get(key).map_err(|e| err(AnyError::new(&e)))? else {
            return Ok(None);
        };
        let decoded = serde_json::from_slice(value.value())
            .map_err(|e| err(AnyError::error(format!("bad {key} record: {e}"))))?;
        Ok(Some(decoded))
    }

    /// Runs one write transaction on a blocking thread, durable unless `durability` says
    /// otherwise.
    async fn write<F>(
        &self,
        subject: ErrorSubject<NodeId>,
        durability: Durability,
        body: F,
    ) -> StorageResult<()>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), String> + Send + 'static,
    {
        let db = self.db.clone();
        let result = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let mut write = db.begin_write().map_err(|e| e.to_string())?;
            write
                .set_durability(durability)
                .map_err(|e| e.to_string())?;
            body(&write)?;
            write.commit().map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        result.map_err(|e| {
            StorageIOError::new(
                subject,
                ErrorVerb::Write,
                AnyError::error(format!("{}: {e}", self.path.display())),
            )
            .into()
        })
    }

    async fn write_state<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        subject: ErrorSubject<NodeId>,
        durability: Durability,
    ) -> StorageResult<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| {
            StorageIOError::new(subject.clone(), ErrorVerb::Write, AnyError::new(&e))
        })?;
        self.write(subject, durability, move |write| {
            let mut table = write.open_table(STATE).map_err(|e| e.to_string())?;
            table
                .insert(key, bytes.as_slice())
                .map_err(|e| e.to_string())?;
            Ok(())
        })
        .await
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId<NodeId>>> {
        let err = |e: AnyError| StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Read, e);
        let read = self.db.begin_read().map_err(|e| err(AnyError::new(&e)))?;
        let table = read.open_table(LOG).map_err(|e| err(AnyError::new(&e)))?;
        let Some((key, value)) = table.last().map_err(|e| err(AnyError::new(&e)))? else {
            return Ok(None);
        };
        Ok(Some(decode_entry(key.value(), value.value())?.log_id))
    }
}

/// Decodes the entry stored under `index`, checking it is the entry for that index.
fn decode_entry(index: u64, bytes: &[u8]) -> StorageResult<Entry<TypeConfig>> {
    let entry: Entry<TypeConfig> = serde_json::from_slice(bytes).map_err(|e| {
        StorageIOError::read_log_at_index(index, AnyError::error(format!("bad entry: {e}")))
    })?;
    if entry.log_id.index != index {
        return Err(StorageIOError::read_log_at_index(
            index,
            AnyError::error(format!(
                "the entry stored under index {index} has index {}",
                entry.log_id.index
            )),
        )
        .into());
    }
    Ok(entry)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let err = |e: AnyError| StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Read, e);
        let read = self.db.begin_read().map_err(|e| err(AnyError::new(&e)))?;
        let table = read.open_table(LOG).map_err(|e| err(AnyError::new(&e)))?;
        let bounds: (Bound<u64>, Bound<u64>) =
            (range.start_bound().cloned(), range.end_bound().cloned());
        let mut entries = Vec::new();
        for row in table.range(bounds).map_err(|e| err(AnyError::new(&e)))? {
            let (key, value) = row.map_err(|e| err(AnyError::new(&e)))?;
            entries.push(decode_entry(key.value(), value.value())?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> =
            self.read_state(PURGED_KEY, ErrorSubject::Logs)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        self.write_state(VOTE_KEY, vote, ErrorSubject::Vote, Durability::Immediate)
            .await
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        self.read_state(VOTE_KEY, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not fsynced on its own: the committed id only saves re-learning it from the leader
        // after a restart (the applied point lives in the registry), and the next durable
        // append or vote makes it durable anyway.
        self.write_state(
            COMMITTED_KEY,
            &committed,
            ErrorSubject::Store,
            Durability::None,
        )
        .await
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self
            .read_state::<Option<LogId<NodeId>>>(COMMITTED_KEY, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut rows = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry)
                .map_err(|e| StorageIOError::write_log_entry(entry.log_id, AnyError::new(&e)))?;
            rows.push((entry.log_id.index, bytes));
        }
        let result = self
            .write(ErrorSubject::Logs, Durability::Immediate, move |write| {
                let mut table = write.open_table(LOG).map_err(|e| e.to_string())?;
                for (index, bytes) in &rows {
                    table
                        .insert(*index, bytes.as_slice())
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
            .await;
        // Only now, with the transaction durable (or failed), may Raft count the entries.
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| io::Error::other(e.to_string())),
        );
        result
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.write(ErrorSubject::Logs, Durability::Immediate, move |write| {
            let mut table = write.open_table(LOG).map_err(|e| e.to_string())?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let bytes = serde_json::to_vec(&log_id).map_err(|e| {
            StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Write, AnyError::new(&e))
        })?;
        // The purge point and the removal are one transaction: the log state never claims a
        // purge point above entries still present, nor loses entries without a purge point.
        self.write(ErrorSubject::Logs, Durability::Immediate, move |write| {
            let mut state = write.open_table(STATE).map_err(|e| e.to_string())?;
            state
                .insert(PURGED_KEY, bytes.as_slice())
                .map_err(|e| e.to_string())?;
            let mut table = write.open_table(LOG).map_err(|e| e.to_string())?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(|e| e.to_string())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores `bytes` under `index` behind the log store's back, as a damaged disk might.
    fn plant(store: &LogStore, index: u64, bytes: &[u8]) {
        let write = store.db.begin_write().unwrap();
        write.open_table(LOG).unwrap().insert(index, bytes).unwrap();
        write.commit().unwrap();
    }

    #[tokio::test]
    async fn a_damaged_entry_is_an_error_naming_its_index_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        plant(&store, 3, b"{not json");
        let error = store.try_get_log_entries(3..4).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("bad entry") && message.contains('3'),
            "{message}"
        );
        assert!(store.get_log_state().await.is_err());
    }

    #[tokio::test]
    async fn an_entry_under_the_wrong_index_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 5),
            payload: openraft::EntryPayload::Blank,
        };
        plant(&store, 6, &serde_json::to_vec(&entry).unwrap());
        let error = store.try_get_log_entries(..).await.unwrap_err();
        assert!(error.to_string().contains("has index 5"), "{error}");
    }

    #[tokio::test]
    async fn a_damaged_vote_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        let write = store.db.begin_write().unwrap();
        write
            .open_table(STATE)
            .unwrap()
            .insert(VOTE_KEY, b"nope".as_slice())
            .unwrap();
        write.commit().unwrap();
        let error = store.read_vote().await.unwrap_err();
        assert!(error.to_string().contains("bad vote record"), "{error}");
    }
}
