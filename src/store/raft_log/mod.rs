//! [`RaftLogStore`]: the Raft log of a DC's group (docs/cluster.md) on RocksDB, openraft's
//! v2 storage API ([`RaftLogStorage`] and [`RaftLogReader`]) for
//! [`cluster::TypeConfig`](crate::cluster::TypeConfig).
//!
//! What lives where (two column families of their own, so that the group's log can share
//! the node's RocksDB with RocksLog, see below):
//! - `raft_log`: one entry per key, the Raft index as u64 big-endian (so that key order is
//!   log order); value: a format byte ([`FORMAT_V1`]) and the postcard-encoded
//!   `openraft::Entry`.
//! - `raft_meta`: `vote`, `committed` and `last_purged`, each a format byte and postcard.
//!
//! Durability: the vote and appended entries are written with `sync = true` (the WAL is
//! fsynced) before `save_vote` returns and before `append` calls its flush callback;
//! truncation too. `committed` is written without a sync (openraft only uses it to apply
//! sooner at start; a lost one is re-learnt from the leader) and so is a purge (a lost
//! purge leaves entries that are already in a snapshot). RocksDB's WAL is one ordered
//! stream for every column family, so a later synced write makes every earlier one durable.
//! The synced writes run on a blocking thread, never on the async runtime's workers.
//!
//! Why column families and not key prefixes in RocksLog's: the Raft log is appended at the
//! tail and cut at both ends by range deletions, a pattern unlike the event log's; its own
//! column family keeps those range tombstones, its memtable and its compactions apart, and
//! a batch can still write both (an entry and what applying it changed) atomically, since
//! column families share one WAL. `open_db` already opens column families a build does not
//! know, so a data dir with a Raft log stays openable by a build without one.
//!
//! Why postcard and not JSON: an entry carries a committer round of opaque encoded writes;
//! JSON would write every byte as a decimal number (about 3.5 times the size) and cost
//! more CPU per entry, and postcard is the project's wire encoding already. Every stored
//! value starts with a format byte, so a future encoding (or an openraft upgrade that
//! changes its types) is recognised instead of misread.
//!
//! Stored bytes are untrusted: every value is bounded ([`ENTRY_BYTES_MAX`],
//! [`META_BYTES_MAX`]) and checked (format byte, no trailing bytes, the entry's index equal
//! to its key's) before use; a bad one is a storage error, counted, never a panic.

// The helpers return what openraft's traits return: its `StorageError` and `RPCError` are
// hundreds of bytes, and the traits fix them.
#![allow(clippy::result_large_err)]

#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use rocksdb::{ColumnFamily, Direction, IteratorMode, WriteBatch, WriteOptions};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tandem_replicator::log::LogError;

use super::rocks::flush_idle;
use super::rocks::open::{open_db, Prefill};
use super::rocks::Db;
use crate::cluster::{NodeId, RaftEntry, TypeConfig, ENTRY_BYTES_MAX};

const CF_RAFT_LOG: &str = "raft_log";
const CF_RAFT_META: &str = "raft_meta";
/// The column families of the Raft log.
pub const RAFT_COLUMN_FAMILIES: [&str; 2] = [CF_RAFT_LOG, CF_RAFT_META];

const META_VOTE: &[u8] = b"vote";
const META_COMMITTED: &[u8] = b"committed";
const META_LAST_PURGED: &[u8] = b"last_purged";

/// The format byte of every stored value of this version: postcard of openraft 0.9's types.
pub const FORMAT_V1: u8 = 1;
/// Largest stored vote, committed or last-purged value (they are tens of bytes).
pub const META_BYTES_MAX: usize = 4096;
/// Most stored bytes one replication read returns (`limited_get_log_entries`, what one
/// `append_entries` to a follower carries): one entry at the largest, else several. Without
/// it, openraft's `max_payload_entries` (300) entries of up to [`ENTRY_BYTES_MAX`] could make
/// one message of gigabytes.
pub const READ_BYTES_MAX: usize = ENTRY_BYTES_MAX;
/// The memtable of each Raft column family when the store opens its own RocksDB.
const WRITE_BUFFER_MIB: usize = 16;
/// Open files of the store's own RocksDB.
const MAX_OPEN_FILES: u32 = 256;

/// What the store did, for the node's metrics and the spike's figures. Shared by every
/// clone of one store (the readers too).
#[derive(Debug, Default)]
pub struct RaftLogCounters {
    /// Writes with `sync = true` (appends, votes, truncations): fsyncs of the WAL.
    pub synced_writes: AtomicU64,
    /// Calls of `append`, and the entries and encoded bytes they wrote.
    pub appends: AtomicU64,
    pub entries_appended: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub votes_saved: AtomicU64,
    pub truncations: AtomicU64,
    pub purges: AtomicU64,
    /// Entries refused because their encoding is over [`ENTRY_BYTES_MAX`].
    pub oversize_refused: AtomicU64,
    /// Stored values that failed their checks when read back.
    pub corrupt_reads: AtomicU64,
    /// Replication reads cut short by [`READ_BYTES_MAX`].
    pub reads_cut: AtomicU64,
}

impl RaftLogCounters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The Raft log of one member on RocksDB. Clones share the database and the counters (a
/// clone is the log reader openraft's replication tasks use).
#[derive(Clone)]
pub struct RaftLogStore {
    db: Arc<Db>,
    counters: Arc<RaftLogCounters>,
}

impl Debug for RaftLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLogStore").field("dir", &self.db.path()).finish_non_exhaustive()
    }
}

type StoreResult<T> = Result<T, StorageError<NodeId>>;

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, msg: impl ToString) -> StorageError<NodeId> {
    StorageIOError::new(subject, verb, AnyError::error(msg)).into()
}

impl RaftLogStore {
    /// Opens (or creates) a Raft log in its own RocksDB at `dir` (a member's `raft/`).
    pub fn open(dir: &Path) -> Result<RaftLogStore, LogError> {
        let db = open_db(dir, &RAFT_COLUMN_FAMILIES, WRITE_BUFFER_MIB, MAX_OPEN_FILES, Prefill::AtStart)?;
        Ok(RaftLogStore { db: Arc::new(db), counters: Arc::default() })
    }

    /// The store's counters (shared by its clones).
    pub fn counters(&self) -> Arc<RaftLogCounters> {
        self.counters.clone()
    }

    /// Starts a flush (without waiting for it) of each Raft column family whose memtable
    /// holds at least [`IDLE_FLUSH_MIN_BYTES`](super::IDLE_FLUSH_MIN_BYTES), as RocksLog's
    /// (`store/rocks/idle_flush.rs`): the group's node calls both once its log is quiet.
    /// Returns the bytes those memtables held (0: none).
    pub fn flush_idle_memtables(&self) -> Result<u64, LogError> {
        let storage = |e: String| LogError::Storage(format!("raft log: {e}"));
        let cfs = RAFT_COLUMN_FAMILIES
            .iter()
            .map(|name| self.db.cf_handle(name).ok_or_else(|| storage(format!("no column family {name}"))))
            .collect::<Result<Vec<_>, _>>()?;
        flush_idle(&self.db, &cfs).map_err(|e| storage(e.into_string()))
    }

    fn cf(&self, name: &str) -> StoreResult<&ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| io_err(ErrorSubject::Store, ErrorVerb::Read, format!("no column family {name}")))
    }

    /// Writes `batch` on a blocking thread; with `sync`, returns once the WAL is fsynced.
    async fn write(&self, batch: WriteBatch, sync: bool, subject: ErrorSubject<NodeId>) -> StoreResult<()> {
        let db = self.db.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut opts = WriteOptions::default();
            opts.set_sync(sync);
            db.write_opt(batch, &opts).map_err(|e| e.into_string())
        })
        .await;
        match written {
            Ok(Ok(())) => {
                if sync {
                    RaftLogCounters::add(&self.counters.synced_writes, 1);
                }
                Ok(())
            }
            Ok(Err(e)) => Err(io_err(subject, ErrorVerb::Write, e)),
            Err(e) => Err(io_err(subject, ErrorVerb::Write, format!("write task: {e}"))),
        }
    }

    fn get_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
        subject: ErrorSubject<NodeId>,
    ) -> StoreResult<Option<T>> {
        let cf = self.cf(CF_RAFT_META)?;
        let Some(bytes) =
            self.db.get_pinned_cf(cf, key).map_err(|e| io_err(subject.clone(), ErrorVerb::Read, e))?
        else {
            return Ok(None);
        };
        self.decode(&bytes, META_BYTES_MAX)
            .map(Some)
            .map_err(|e| io_err(subject, ErrorVerb::Read, format!("{}: {e}", String::from_utf8_lossy(key))))
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &[u8],
        value: &T,
        sync: bool,
        subject: ErrorSubject<NodeId>,
    ) -> StoreResult<()> {
        let bytes = encode(value).map_err(|e| io_err(subject.clone(), ErrorVerb::Write, e))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_RAFT_META)?, key, bytes);
        self.write(batch, sync, subject).await
    }

    /// Decodes a stored value: at most `max` bytes after the format byte, the format this
    /// build writes, and nothing after the value. Counts a failure.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8], max: usize) -> Result<T, String> {
        let out = decode(bytes, max);
        if out.is_err() {
            RaftLogCounters::add(&self.counters.corrupt_reads, 1);
        }
        out
    }

    /// Reads the entry stored under `key`, checking that it is the entry of that index.
    fn decode_entry(&self, key: &[u8], value: &[u8]) -> StoreResult<RaftEntry> {
        let index = decode_index(key).ok_or_else(|| {
            RaftLogCounters::add(&self.counters.corrupt_reads, 1);
            io_err(ErrorSubject::Logs, ErrorVerb::Read, format!("raft_log key of {} bytes", key.len()))
        })?;
        let entry: RaftEntry = self
            .decode(value, ENTRY_BYTES_MAX)
            .map_err(|e| io_err(ErrorSubject::LogIndex(index), ErrorVerb::Read, e))?;
        if entry.log_id.index != index {
            RaftLogCounters::add(&self.counters.corrupt_reads, 1);
            return Err(io_err(
                ErrorSubject::LogIndex(index),
                ErrorVerb::Read,
                format!("entry {} stored under index {index}", entry.log_id.index),
            ));
        }
        Ok(entry)
    }
}

/// `[FORMAT_V1] ++ postcard(value)`.
fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    postcard::to_extend(value, vec![FORMAT_V1]).map_err(|e| e.to_string())
}

fn decode<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, String> {
    let (&format, body) = bytes.split_first().ok_or("empty value")?;
    if format != FORMAT_V1 {
        return Err(format!("format {format}, this build reads {FORMAT_V1}"));
    }
    if body.len() > max {
        return Err(format!("{} bytes, at most {max}", body.len()));
    }
    let (value, rest) = postcard::take_from_bytes(body).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the value", rest.len()));
    }
    Ok(value)
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn decode_index(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

impl RaftLogStore {
    /// The entries of `range` in log order; with a budget, stops before the entry that
    /// would take the stored bytes read past it (the first entry is always returned).
    fn read_range<RB: RangeBounds<u64>>(
        &self,
        range: &RB,
        bytes_max: Option<usize>,
    ) -> StoreResult<Vec<RaftEntry>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => match i.checked_add(1) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let cf = self.cf(CF_RAFT_LOG)?;
        let from = index_key(start);
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        for item in self.db.iterator_cf(cf, IteratorMode::From(&from, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            if decode_index(&key).is_some_and(|i| !range.contains(&i)) {
                break;
            }
            bytes = bytes.saturating_add(value.len());
            if bytes_max.is_some_and(|max| bytes > max) && !out.is_empty() {
                RaftLogCounters::add(&self.counters.reads_cut, 1);
                break;
            }
            out.push(self.decode_entry(&key, &value)?);
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for RaftLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<RaftEntry>> {
        self.read_range(&range, None)
    }

    /// What replication sends in one `append_entries`: at most [`READ_BYTES_MAX`] of
    /// stored entries (at least one), whatever `max_payload_entries` allows.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StoreResult<Vec<RaftEntry>> {
        self.read_range(&(start..end), Some(READ_BYTES_MAX))
    }
}

impl RaftLogStorage<TypeConfig> for RaftLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> =
            self.get_meta(META_LAST_PURGED, ErrorSubject::Store)?;
        let cf = self.cf(CF_RAFT_LOG)?;
        let last = match self.db.iterator_cf(cf, IteratorMode::End).next() {
            None => None,
            Some(item) => {
                let (key, value) = item.map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                Some(self.decode_entry(&key, &value)?.log_id)
            }
        };
        Ok(LogState { last_purged_log_id, last_log_id: last.or(last_purged_log_id) })
    }

    async fn get_log_reader(&mut self) -> Self {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.put_meta(META_VOTE, vote, true, ErrorSubject::Vote).await?;
        RaftLogCounters::add(&self.counters.votes_saved, 1);
        Ok(())
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.get_meta(META_VOTE, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        self.put_meta(META_COMMITTED, &committed, false, ErrorSubject::Store).await
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(META_COMMITTED, ErrorSubject::Store)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = RaftEntry> + Send,
        I::IntoIter: Send,
    {
        let mut batch = WriteBatch::default();
        let (mut n, mut bytes) = (0u64, 0u64);
        for entry in entries {
            let cf = self.cf(CF_RAFT_LOG)?;
            let value =
                encode(&entry).map_err(|e| io_err(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, e))?;
            if value.len() > ENTRY_BYTES_MAX + 1 {
                RaftLogCounters::add(&self.counters.oversize_refused, 1);
                return Err(io_err(
                    ErrorSubject::Log(entry.log_id),
                    ErrorVerb::Write,
                    format!("entry of {} bytes, at most {ENTRY_BYTES_MAX}", value.len() - 1),
                ));
            }
            n += 1;
            bytes += value.len() as u64;
            batch.put_cf(cf, index_key(entry.log_id.index), value);
        }
        if n == 0 {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.write(batch, true, ErrorSubject::Logs).await?;
        let c = &self.counters;
        RaftLogCounters::add(&c.appends, 1);
        RaftLogCounters::add(&c.entries_appended, n);
        RaftLogCounters::add(&c.bytes_appended, bytes);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let mut batch = WriteBatch::default();
        {
            let cf = self.cf(CF_RAFT_LOG)?;
            batch.delete_range_cf(cf, index_key(log_id.index), index_key(u64::MAX));
            batch.delete_cf(cf, index_key(u64::MAX));
        }
        self.write(batch, true, ErrorSubject::Logs).await?;
        RaftLogCounters::add(&self.counters.truncations, 1);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // The last purged id and the deletion in one batch: both or neither.
        let bytes = encode(&log_id).map_err(|e| io_err(ErrorSubject::Store, ErrorVerb::Write, e))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_RAFT_META)?, META_LAST_PURGED, bytes);
        {
            let cf = self.cf(CF_RAFT_LOG)?;
            match log_id.index.checked_add(1) {
                Some(end) => batch.delete_range_cf(cf, index_key(0), index_key(end)),
                None => {
                    batch.delete_range_cf(cf, index_key(0), index_key(u64::MAX));
                    batch.delete_cf(cf, index_key(u64::MAX));
                }
            }
        }
        self.write(batch, false, ErrorSubject::Logs).await?;
        RaftLogCounters::add(&self.counters.purges, 1);
        Ok(())
    }
}
