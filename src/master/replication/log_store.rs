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
//! crash, as Raft's safety requires. Entries and records are encoded by [`super::codec`]; a
//! record that does not decode is an error, never a panic. The newest entries are also kept
//! decoded in memory (a bounded tail), since the leader reads each entry back once per
//! follower right after appending it.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{codec, NodeId, TypeConfig};

/// The file name of the Raft log inside the work dir.
pub(crate) const RAFT_FILE: &str = "raft.redb";

/// Log index -> the entry.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Small values under the keys below.
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const PURGED_KEY: &str = "last_purged";

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// How many bytes (encoded) of the newest entries the log store keeps decoded in memory.
const TAIL_BYTES: usize = 32 << 20;

/// The log store. Clones share the database and the tail: one is Raft's writer, the others
/// its readers.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
    path: Arc<PathBuf>,
    tail: Arc<Mutex<Tail>>,
}

/// The newest entries, decoded, at consecutive indices: what the leader sends its followers
/// right after appending, read without decoding. Bounded by [`TAIL_BYTES`]; never the only
/// copy (an entry is added once its append is durable, removed when truncated or purged).
#[derive(Default)]
struct Tail {
    entries: VecDeque<(Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl Tail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index)
    }

    fn push(&mut self, entry: Entry<TypeConfig>, size: usize) {
        if self
            .last_index()
            .is_some_and(|last| last + 1 != entry.log_id.index)
        {
            self.clear();
        }
        self.bytes += size;
        self.entries.push_back((entry, size));
        while self.bytes > TAIL_BYTES {
            let Some((_, size)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= size;
        }
    }

    /// Drops the entries at `index` and after.
    fn truncate(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            let (_, size) = self.entries.pop_back().expect("an entry");
            self.bytes -= size;
        }
    }

    /// Drops the entries up to `index`.
    fn purge(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            let (_, size) = self.entries.pop_front().expect("an entry");
            self.bytes -= size;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The entries in `start..end` (`end` exclusive, `None`: through the newest), when the
    /// tail holds every one of them and at least one.
    fn get(&self, start: u64, end: Option<u64>) -> Option<Vec<Entry<TypeConfig>>> {
        let (first, last) = (self.first_index()?, self.last_index()?);
        let end = end.unwrap_or(last + 1);
        if start < first || end > last + 1 || start >= end {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(
            self.entries
                .range(from..to)
                .map(|(e, _)| e.clone())
                .collect(),
        )
    }
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
        // redb creates it with the umask's mode; the log holds job specs (docs/security.md).
        ringmaster_proto::files::restrict_file(&path)
            .map_err(|e| fail("cannot make it 0600", &e))?;
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
            tail: Arc::default(),
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
        let decoded = codec::decode(value.value())
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
        let bytes = codec::encode(value).map_err(|e| {
            StorageIOError::new(subject.clone(), ErrorVerb::Write, AnyError::error(e))
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
    let entry: Entry<TypeConfig> = codec::decode(bytes).map_err(|e| {
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
        let start = match bounds.0 {
            Bound::Included(i) => Some(i),
            Bound::Excluded(i) => i.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match bounds.1 {
            Bound::Included(i) => i.checked_add(1).map(Some),
            Bound::Excluded(i) => Some(Some(i)),
            Bound::Unbounded => Some(None),
        };
        if let (Some(start), Some(end)) = (start, end) {
            if let Some(entries) = self.tail.lock().expect("log tail").get(start, end) {
                return Ok(entries);
            }
        }
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
        let mut appended = Vec::new();
        for entry in entries {
            let bytes = codec::encode(&entry)
                .map_err(|e| StorageIOError::write_log_entry(entry.log_id, AnyError::error(e)))?;
            rows.push((entry.log_id.index, bytes));
            appended.push(entry);
        }
        let sizes: Vec<usize> = rows.iter().map(|(_, bytes)| bytes.len()).collect();
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
        {
            let mut tail = self.tail.lock().expect("log tail");
            if result.is_ok() {
                for (entry, size) in appended.into_iter().zip(sizes) {
                    tail.push(entry, size);
                }
            } else {
                tail.clear();
            }
        }
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
        self.tail.lock().expect("log tail").truncate(log_id.index);
        self.write(ErrorSubject::Logs, Durability::Immediate, move |write| {
            let mut table = write.open_table(LOG).map_err(|e| e.to_string())?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let bytes = codec::encode(&log_id).map_err(|e| {
            StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Write, AnyError::error(e))
        })?;
        self.tail.lock().expect("log tail").purge(log_id.index);
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
        plant(&store, 6, &codec::encode(&entry).unwrap());
        let error = store.try_get_log_entries(..).await.unwrap_err();
        assert!(error.to_string().contains("has index 5"), "{error}");
    }

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    fn indices(entries: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<u64>> {
        entries.map(|e| e.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn the_tail_answers_only_ranges_it_holds_whole() {
        let mut tail = Tail::default();
        for i in 3..=7 {
            tail.push(blank(i), 10);
        }
        assert_eq!(indices(tail.get(4, Some(6))), Some(vec![4, 5]));
        assert_eq!(indices(tail.get(5, None)), Some(vec![5, 6, 7]));
        assert_eq!(tail.get(2, Some(5)), None, "2 is not held");
        assert_eq!(tail.get(6, Some(9)), None, "8 is not held");
        assert_eq!(tail.get(5, Some(5)), None, "empty");
        tail.truncate(6);
        assert_eq!(indices(tail.get(3, None)), Some(vec![3, 4, 5]));
        tail.purge(3);
        assert_eq!(indices(tail.get(4, None)), Some(vec![4, 5]));
        assert_eq!(tail.bytes, 20);
        // A gap (not the next index) starts over rather than mixing runs.
        tail.push(blank(9), 10);
        assert_eq!(indices(tail.get(9, None)), Some(vec![9]));
        assert_eq!(tail.get(4, None), None);
        // Bounded: the oldest go first.
        tail.push(blank(10), TAIL_BYTES);
        assert_eq!(indices(tail.get(10, None)), Some(vec![10]));
        assert_eq!(tail.get(9, None), None);
    }

    #[tokio::test]
    async fn reads_after_a_truncation_come_from_the_disk_or_the_tail_alike() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        for i in 1..=4 {
            let bytes = codec::encode(&blank(i)).unwrap();
            plant(&store, i, &bytes);
            store.tail.lock().unwrap().push(blank(i), bytes.len());
        }
        store
            .truncate(LogId::new(openraft::CommittedLeaderId::new(1, 1), 3))
            .await
            .unwrap();
        let all = store.try_get_log_entries(..).await.unwrap();
        assert_eq!(indices(Some(all)), Some(vec![1, 2]));
        store.tail.lock().unwrap().clear();
        let all = store.try_get_log_entries(..).await.unwrap();
        assert_eq!(indices(Some(all)), Some(vec![1, 2]));
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
