//! [`RocksLog`]: the event log, the materialized state and the marks of one DC in RocksDB.
//!
//! Every verdict comes from [`tandem_replicator::merge`]; this module only turns verdicts
//! into one synced `WriteBatch` per call and reads state back. The in-memory copies of the
//! marks, the purge floor and the watch index change only after their batch is durable.
//!
//! Must never: decide a merge on its own, log a remote event, panic on stored bytes, or
//! write without `sync = true` anything whose loss could lose an acknowledged change.
//!
//! A failed write makes the log refuse writes (its outcome on disk is unknown) until
//! [`RocksLog::recover`] closes and reopens the database and a probe write succeeds.
//!
//! What is read back is checked as well as decoded: an own event or a record that breaks
//! the schema's rules (written by an older version, or by a bug) is never shipped nor
//! served. `read_own` reports it ([`LogError::Invalid`], and the sender sends a snapshot in
//! its place); `instances`, `tombstones` and `snapshot_own` skip it. Each one is logged
//! with its key and counted in [`InvalidRecords`] (status and metrics).
//!
//! The [`EventLog`] contract is implemented in `event_log`; the corruption tests are in
//! `tests`; `raft_state` serves the Raft state machine (applied state, exports).

mod deletes;
mod event_log;
mod idle_flush;
pub(super) mod open;
mod owners;
mod raft_state;
mod retire;
mod scope;
mod snapshot;
#[cfg(test)]
mod tests;
mod write;

pub(super) use idle_flush::flush_idle;
pub use idle_flush::{IDLE_FLUSH_AFTER, IDLE_FLUSH_MIN_BYTES};
pub use open::{wal_files, WAL_MAX_WRITE_BUFFERS};
pub use raft_state::{RAFT_APPLIED_BYTES_MAX, STATE_FORMAT_V1};

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use open::{open_db, Prefill};

use parking_lot::Mutex;

use rocksdb::{ColumnFamily, DBWithThreadMode, IteratorMode, ReadOptions, SingleThreaded, WriteBatch};
use tandem_replicator::log::{EventLog, LogError, StateChange};
use tandem_replicator::merge::{Effect, Held, Refusal};
use tandem_schemas::{
    validate_dc, ChangeEvent, DeregisterReason, InstanceKey, InstanceRecord, Mark, Op, ValidationError,
    FRAME_BYTES_MAX,
};
use uuid::Uuid;

use super::keys::{
    decode_key, decode_mark, decode_u64, encode_key, encode_mark, owner_prefix, prefix_end, seq_key,
};

pub(super) type Db = DBWithThreadMode<SingleThreaded>;

const CF_LOG: &str = "log";
const CF_INSTANCES: &str = "instances";
const CF_TOMBSTONES: &str = "tombstones";
const CF_META: &str = "meta";
const COLUMN_FAMILIES: [&str; 4] = [CF_LOG, CF_INSTANCES, CF_TOMBSTONES, CF_META];

const META_DC: &[u8] = b"dc";
const META_EPOCH: &[u8] = b"epoch";
const META_OWN_SEQ: &[u8] = b"own_seq";
const META_PURGE_FLOOR: &[u8] = b"purge_floor";
const META_INDEX: &[u8] = b"index";
/// `mark/<origin dc>` -> the origin's applied mark (16 bytes: epoch, seq; big-endian).
const META_MARK_PREFIX: &[u8] = b"mark/";
/// `ack/<peer dc>` -> the own mark the peer has acknowledged (16 bytes).
const META_ACK_PREFIX: &[u8] = b"ack/";
/// `markid/<origin dc>` -> the id of the event at the origin's applied mark (16 bytes),
/// absent when unknown (after a snapshot, or written before ids were kept).
const META_MARK_ID_PREFIX: &[u8] = b"markid/";
/// The id of the own event at the purge floor (16 bytes), absent when unknown.
const META_FLOOR_ID: &[u8] = b"floor_id";

/// One stored key and value, as read by a scan.
type Entry = Result<(Box<[u8]>, Box<[u8]>), LogError>;

/// Largest stored value accepted when decoding: a stored event or record was at most one
/// frame's worth when it was written.
const VALUE_BYTES_MAX: usize = FRAME_BYTES_MAX;

/// Why a data dir could not be opened. Opening never changes a log it refuses.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data dir holds the log of another DC. Nothing was changed.
    #[error("data dir {dir} belongs to DC {stored:?}, not {requested:?}: a data dir belongs to one DC")]
    WrongDc { dir: PathBuf, stored: String, requested: String },
    /// The DC name breaks the naming rules. Nothing was opened.
    #[error("invalid DC name: {0}")]
    InvalidDc(#[from] ValidationError),
    /// [`RocksLog::create_with_epoch`] on a data dir that already holds a log. Nothing was
    /// changed.
    #[error("data dir {dir} already holds a log (epoch {epoch})")]
    AlreadyInitialized { dir: PathBuf, epoch: u64 },
    /// The storage failed or holds corrupt records.
    #[error(transparent)]
    Log(#[from] LogError),
}

impl From<OpenError> for LogError {
    fn from(e: OpenError) -> LogError {
        match e {
            OpenError::Log(e) => e,
            e @ (OpenError::WrongDc { .. }
            | OpenError::InvalidDc(_)
            | OpenError::AlreadyInitialized { .. }) => LogError::Storage(e.to_string()),
        }
    }
}

/// Stored records and own events that broke the schema's rules when read back, skipped
/// (or, for own events, replaced by a snapshot on the replication stream). Shared with the
/// node for status and metrics.
#[derive(Debug, Default)]
pub struct InvalidRecords {
    count: AtomicU64,
    last: Mutex<Option<String>>,
}

impl InvalidRecords {
    /// Times a read met an invalid record (one record read twice counts twice).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The latest one: what and where (its key or seq) and which rule it breaks.
    pub fn last(&self) -> Option<String> {
        self.last.lock().clone()
    }

    pub(crate) fn note(&self, what: String) {
        tracing::error!(record = %what, "stored record breaks the schema's rules; skipped (see docs/deploy.md)");
        self.count.fetch_add(1, Ordering::Relaxed);
        *self.last.lock() = Some(what);
    }
}

/// The production [`EventLog`]: one RocksDB per data dir, owned by one DC.
///
/// Not `Sync` and not meant to be shared: the [`Committer`](super::Committer) thread owns it
/// and is the single sequencer of writes.
pub struct RocksLog {
    /// `None` only while a recovery is reopening it (or failed to). Shared with the
    /// snapshot reader threads (each holds a RocksDB snapshot of it).
    db: Option<Arc<Db>>,
    write_buffer_mib: usize,
    max_open_files: u32,
    invalid: Arc<InvalidRecords>,
    dir: PathBuf,
    dc: String,
    own: Mark,
    floor: u64,
    marks: BTreeMap<String, Mark>,
    mark_ids: BTreeMap<String, Uuid>,
    floor_id: Option<Uuid>,
    peer_acks: BTreeMap<String, Mark>,
    /// DCs retired here -> when (wall-clock ms); see `retire`.
    retired: BTreeMap<String, u64>,
    /// Replication scopes recorded per peer DC (absent: all); see `scope`.
    scopes: BTreeMap<String, tandem_replicator::scope::Scope>,
    /// The watch index persisted by the last durable write (or found at open).
    index: u64,
    /// Written with the next synced batch, then becomes `index`.
    pending_index: Option<u64>,
    /// The Raft state machine's applied state, written with the next synced batch (see
    /// `RocksLog::with_applied`).
    pending_applied: Option<Vec<u8>>,
    sync_writes: u64,
    /// Where the last synced write's time went inside RocksDB (`write.rs`).
    last_sync: Option<crate::store::commit_log::SyncParts>,
    /// Set when a write failed: the outcome on disk is unknown, so the in-memory marks may
    /// be wrong and every later write is refused until the log is reopened.
    poisoned: bool,
    /// Whether the meta column family may hold an owner record: false only when the last
    /// [`load`](Self::load) found none and no owner record was staged since (see
    /// `owners.rs`). With ACLs off no owner record is ever written, and a registration
    /// then neither reads for one nor stages its delete.
    owner_records: AtomicBool,
}

impl fmt::Debug for RocksLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocksLog")
            .field("dir", &self.dir)
            .field("dc", &self.dc)
            .field("own", &self.own)
            .field("floor", &self.floor)
            .field("marks", &self.marks)
            .field("index", &self.index)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// Block cache shared by the log's column families.
const BLOCK_CACHE_BYTES: usize = 8 << 20;

/// Default memtable size per column family, MiB (RocksDB's own default is 64).
pub const WRITE_BUFFER_MIB_DEFAULT: usize = 8;
/// Default for the table files RocksDB keeps open (its own default is unlimited, which
/// lets a large store take every descriptor the process has).
pub const MAX_OPEN_FILES_DEFAULT: u32 = 256;

impl RocksLog {
    /// Opens the log of `dc` in `dir`. A new or wiped dir starts a new history: a fresh
    /// provisional origin epoch (see `random_epoch`), persisted before this returns. A dir that holds
    /// another DC's log is refused.
    pub fn open(dir: &Path, dc: &str) -> Result<RocksLog, OpenError> {
        Self::open_inner(dir, dc, None, WRITE_BUFFER_MIB_DEFAULT, MAX_OPEN_FILES_DEFAULT)
    }

    /// [`RocksLog::open`] with a memtable size per column family, in MiB: the most memory
    /// unflushed writes hold per column family before RocksDB flushes them to a table file.
    pub fn open_with_write_buffer(
        dir: &Path,
        dc: &str,
        write_buffer_mib: usize,
    ) -> Result<RocksLog, OpenError> {
        Self::open_inner(dir, dc, None, write_buffer_mib, MAX_OPEN_FILES_DEFAULT)
    }

    /// [`RocksLog::open_with_write_buffer`] that also bounds the table files RocksDB keeps
    /// open (its share of the process's descriptors).
    pub fn open_tuned(
        dir: &Path,
        dc: &str,
        write_buffer_mib: usize,
        max_open_files: u32,
    ) -> Result<RocksLog, OpenError> {
        Self::open_inner(dir, dc, None, write_buffer_mib, max_open_files)
    }

    /// Creates a new log with a chosen epoch (tests and tools). Refuses a dir that already
    /// holds a log.
    pub fn create_with_epoch(dir: &Path, dc: &str, epoch: NonZeroU64) -> Result<RocksLog, OpenError> {
        Self::open_inner(dir, dc, Some(epoch), WRITE_BUFFER_MIB_DEFAULT, MAX_OPEN_FILES_DEFAULT)
    }

    fn open_inner(
        dir: &Path,
        dc: &str,
        new_epoch: Option<NonZeroU64>,
        write_buffer_mib: usize,
        max_open_files: u32,
    ) -> Result<RocksLog, OpenError> {
        validate_dc("dc", dc)?;
        let db =
            Arc::new(open_db(dir, &COLUMN_FAMILIES, write_buffer_mib, max_open_files, Prefill::AtStart)?);
        let mut log = RocksLog {
            db: Some(db),
            write_buffer_mib,
            max_open_files,
            invalid: Arc::default(),
            dir: dir.to_owned(),
            dc: dc.to_owned(),
            own: Mark { epoch: 0, seq: 0 },
            floor: 0,
            marks: BTreeMap::new(),
            mark_ids: BTreeMap::new(),
            floor_id: None,
            peer_acks: BTreeMap::new(),
            retired: BTreeMap::new(),
            scopes: BTreeMap::new(),
            index: 0,
            pending_index: None,
            pending_applied: None,
            sync_writes: 0,
            last_sync: None,
            poisoned: false,
            owner_records: AtomicBool::new(false),
        };
        match log.meta_get(META_DC)? {
            None => {
                let epoch = new_epoch.unwrap_or_else(random_epoch);
                log.initialize(epoch)?;
            }
            Some(stored) => {
                let stored =
                    String::from_utf8(stored).map_err(|_| LogError::Corrupt("meta dc: not UTF-8".into()))?;
                if stored != dc {
                    return Err(OpenError::WrongDc { dir: dir.to_owned(), stored, requested: dc.to_owned() });
                }
                log.load()?;
                if new_epoch.is_some() {
                    return Err(OpenError::AlreadyInitialized { dir: dir.to_owned(), epoch: log.own.epoch });
                }
            }
        }
        Ok(log)
    }

    /// After a failed write: closes the database, opens it again, reloads the marks from
    /// what is durable (the failed write may or may not be among it) and makes one probe
    /// write (the watch index). `Ok` means the log is writable again; on error it stays
    /// unwritable (and, if the reopen failed, closed: reads fail too until a later
    /// attempt succeeds).
    pub fn recover(&mut self) -> Result<(), LogError> {
        // RocksDB locks its dir: the old handle must be closed before the new one opens,
        // and snapshot readers share it (they let go when their snapshot is done).
        if let Some(db) = self.db.take() {
            if let Err(db) = snapshot::close_when_released(db) {
                self.db = Some(db);
                return Err(LogError::Storage(format!(
                    "event log in {}: snapshot readers still hold the database; a later attempt reopens it",
                    self.dir.display()
                )));
            }
        }
        let reopened =
            open_db(&self.dir, &COLUMN_FAMILIES, self.write_buffer_mib, self.max_open_files, Prefill::Never)?;
        self.db = Some(Arc::new(reopened));
        let stored = self.meta_get(META_DC)?;
        if stored.as_deref() != Some(self.dc.as_bytes()) {
            return Err(LogError::Corrupt(format!(
                "meta dc of {} changed under the node",
                self.dir.display()
            )));
        }
        self.pending_index = None;
        self.load()?;
        self.poisoned = false;
        self.bump_index().map(drop)
    }

    /// The count of invalid records met by reads, shared.
    pub fn invalid_records(&self) -> Arc<InvalidRecords> {
        Arc::clone(&self.invalid)
    }
}

impl RocksLog {
    /// Writes the identity of a new log. Refuses a dir that holds data but no identity:
    /// that is a damaged log, not an empty one.
    fn initialize(&mut self, epoch: NonZeroU64) -> Result<(), LogError> {
        for name in COLUMN_FAMILIES {
            if self.db()?.iterator_cf(self.cf(name)?, IteratorMode::Start).next().is_some() {
                return Err(LogError::Corrupt(format!(
                    "column family {name} holds data but meta has no DC name"
                )));
            }
        }
        let meta = self.cf(CF_META)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(meta, META_DC, self.dc.as_bytes());
        batch.put_cf(meta, META_EPOCH, epoch.get().to_be_bytes());
        batch.put_cf(meta, META_OWN_SEQ, 0u64.to_be_bytes());
        batch.put_cf(meta, META_PURGE_FLOOR, 0u64.to_be_bytes());
        batch.put_cf(meta, META_INDEX, 0u64.to_be_bytes());
        self.commit(batch)?;
        self.own = Mark { epoch: epoch.get(), seq: 0 };
        tracing::info!(dc = %self.dc, epoch = epoch.get(), dir = %self.dir.display(), "new event log");
        Ok(())
    }

    /// Loads the cached meta values and checks them against the log.
    fn load(&mut self) -> Result<(), LogError> {
        self.owner_records.store(self.holds_owner_records()?, Ordering::Relaxed);
        let epoch = self.meta_u64(META_EPOCH)?;
        if epoch == 0 {
            return Err(LogError::Corrupt("meta epoch is 0".into()));
        }
        let own_seq = self.meta_u64(META_OWN_SEQ)?;
        let floor = self.meta_u64(META_PURGE_FLOOR)?;
        let index = self.meta_u64(META_INDEX)?;
        if floor > own_seq {
            return Err(LogError::Corrupt(format!("purge floor {floor} is above the own seq {own_seq}")));
        }
        // The log holds exactly floor+1..=own_seq; check its ends against meta.
        let log_cf = self.cf(CF_LOG)?;
        let end_seq = |mode: IteratorMode<'static>| -> Result<Option<u64>, LogError> {
            match self.db()?.iterator_cf(log_cf, mode).next().transpose().map_err(storage)? {
                Some((k, _)) => decode_u64("log key", &k).map(Some),
                None => Ok(None),
            }
        };
        let (first, last) = (end_seq(IteratorMode::Start)?, end_seq(IteratorMode::End)?);
        match (first, last) {
            (Some(first), Some(last)) if first <= floor || last != own_seq => {
                return Err(LogError::Corrupt(format!(
                    "log holds seqs {first}..={last}, meta says floor {floor} and own seq {own_seq}"
                )));
            }
            (None, None) if own_seq != floor => {
                return Err(LogError::Corrupt(format!(
                    "log is empty but meta says floor {floor} and own seq {own_seq}"
                )));
            }
            (Some(_), Some(_)) | (None, None) => {}
            (Some(_), None) | (None, Some(_)) => {
                return Err(LogError::Corrupt("log has only one end".into()));
            }
        }
        self.own = Mark { epoch, seq: own_seq };
        self.floor = floor;
        self.index = index;
        self.marks = self.meta_marks(META_MARK_PREFIX)?;
        self.peer_acks = self.meta_marks(META_ACK_PREFIX)?;
        self.retired = self.load_retired()?;
        self.scopes = self.load_scopes()?;
        self.floor_id = match self.meta_get(META_FLOOR_ID)? {
            Some(bytes) => Some(decode_uuid("meta floor_id", &bytes)?),
            None => None,
        };
        let mut ids = BTreeMap::new();
        for item in self.scan(CF_META, META_MARK_ID_PREFIX, prefix_end(META_MARK_ID_PREFIX))? {
            let (k, v) = item?;
            let name = std::str::from_utf8(&k[META_MARK_ID_PREFIX.len()..])
                .map_err(|_| LogError::Corrupt("meta mark id name is not UTF-8".into()))?;
            ids.insert(name.to_owned(), decode_uuid("meta mark id", &v)?);
        }
        self.mark_ids = ids;
        Ok(())
    }

    /// The data dir of this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The watch index persisted by the last durable write.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Stages a watch index to be written atomically with the next synced batch; it never
    /// moves backwards. [`index`](Self::index) reports it once that batch is durable.
    pub fn set_next_index(&mut self, idx: u64) {
        let floor = self.pending_index.unwrap_or(self.index);
        self.pending_index = Some(idx.max(floor));
    }

    /// Persists `index() + 1` (or a larger staged index) now, in a synced write of its own,
    /// and returns it. The node calls it once at start so that a restart counts as a
    /// durable write: a watch index shown by an earlier run is never shown again.
    pub fn bump_index(&mut self) -> Result<u64, LogError> {
        self.check_writable()?;
        self.set_next_index(self.index + 1);
        self.write(WriteBatch::default(), true)?;
        Ok(self.index)
    }

    /// Number of batches written with `sync = true` since open (one fsync each).
    pub fn sync_writes(&self) -> u64 {
        self.sync_writes
    }

    /// True after a failed write: every later write is refused until [`Self::recover`].
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The own marks the peers have acknowledged, as last recorded.
    pub fn peer_acks(&self) -> BTreeMap<String, Mark> {
        self.peer_acks.clone()
    }

    /// Records that `peer` has durably applied the own origin up to `mark`.
    ///
    /// Written without an fsync of its own: it reaches the disk with the next synced batch
    /// or the OS's writeback, and losing it in a power failure only makes a later purge
    /// wait for the peer's next ack — it never loses or resurrects anything.
    pub fn record_peer_ack(&mut self, peer: &str, mark: Mark) -> Result<(), LogError> {
        self.check_writable()?;
        if self.peer_acks.get(peer) == Some(&mark) {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META)?, meta_name(META_ACK_PREFIX, peer), encode_mark(mark));
        self.write(batch, false)?;
        self.peer_acks.insert(peer.to_owned(), mark);
        Ok(())
    }

    /// The `commit_time_ms` of a logged own event; `None` when `seq` is not in the log
    /// (purged or not written yet).
    pub fn own_event_time_ms(&self, seq: u64) -> Result<Option<u64>, LogError> {
        match self.db()?.get_pinned_cf(self.cf(CF_LOG)?, seq_key(seq)).map_err(storage)? {
            Some(bytes) => Ok(Some(self.decode_logged(seq, &bytes)?.commit_time_ms)),
            None => Ok(None),
        }
    }

    /// What the state holds for a key, reporting storage and decode errors.
    /// [`EventLog::held`] cannot report them; every merge path here uses this instead.
    pub fn try_held(&self, key: &InstanceKey) -> Result<Held, LogError> {
        let enc = encode_key(key);
        if let Some(bytes) = self.db()?.get_pinned_cf(self.cf(CF_INSTANCES)?, &enc).map_err(storage)? {
            let (seq, record) = decode_instance(&bytes)?;
            if record.key != *key {
                return Err(LogError::Corrupt(format!("instance stored under {key:?} is {:?}", record.key)));
            }
            return Ok(Held::Live { seq });
        }
        if let Some(bytes) = self.db()?.get_pinned_cf(self.cf(CF_TOMBSTONES)?, &enc).map_err(storage)? {
            let (seq, _reason) = decode_tombstone(&bytes)?;
            return Ok(Held::Tombstone { seq });
        }
        Ok(Held::Absent)
    }

    /// [`EventLog::append_local`], also returning the changes to state in order.
    pub fn append_local_with_changes(
        &mut self,
        events: &[ChangeEvent],
    ) -> Result<Vec<StateChange>, LogError> {
        self.append_local_owned(events, &[])
    }

    /// [`EventLog::purge_own`], also returning the keys of the own tombstones it removed.
    pub fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError> {
        self.check_writable()?;
        let upto = upto_seq.min(self.own.seq);
        if upto <= self.floor {
            return Ok(Vec::new());
        }
        let floor_id = self.logged_event_id(upto)?;
        let log_cf = self.cf(CF_LOG)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(log_cf, seq_key(0), seq_key(upto));
        batch.delete_cf(log_cf, seq_key(upto));
        let removed = self.stage_tombstone_purge(&mut batch, &self.dc, upto)?;
        let meta = self.cf(CF_META)?;
        batch.put_cf(meta, META_PURGE_FLOOR, upto.to_be_bytes());
        match floor_id {
            Some(id) => batch.put_cf(meta, META_FLOOR_ID, id.as_bytes()),
            None => batch.delete_cf(meta, META_FLOOR_ID),
        }
        self.commit(batch)?;
        self.floor = upto;
        self.floor_id = floor_id;
        Ok(removed)
    }

    /// The id of the logged own event at `seq`, if the log holds it.
    fn logged_event_id(&self, seq: u64) -> Result<Option<Uuid>, LogError> {
        match self.db()?.get_pinned_cf(self.cf(CF_LOG)?, seq_key(seq)).map_err(storage)? {
            Some(bytes) => Ok(Some(self.decode_logged(seq, &bytes)?.event_id)),
            None => Ok(None),
        }
    }

    /// [`EventLog::purge_remote_tombstones`], also returning the keys it removed.
    pub fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        self.check_writable()?;
        if origin == self.dc {
            return Ok(Vec::new());
        }
        let upto = upto_seq.min(self.mark_of(origin).map_or(0, |m| m.seq));
        let mut batch = WriteBatch::default();
        let removed = self.stage_tombstone_purge(&mut batch, origin, upto)?;
        self.commit(batch)?;
        Ok(removed)
    }

    /// How many of `origin`'s tombstones a purge up to `upto_seq` would remove (a DC
    /// group's leader proposes no purge that removes none: `GroupLog`).
    pub fn purgeable_remote_tombstones(&self, origin: &str, upto_seq: u64) -> Result<usize, LogError> {
        if origin == self.dc {
            return Ok(0);
        }
        let upto = upto_seq.min(self.mark_of(origin).map_or(0, |m| m.seq));
        Ok(self.stage_tombstone_purge(&mut WriteBatch::default(), origin, upto)?.len())
    }

    fn stage_tombstone_purge(
        &self,
        batch: &mut WriteBatch,
        owner_dc: &str,
        upto: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        let tombs_cf = self.cf(CF_TOMBSTONES)?;
        let mut removed = Vec::new();
        for item in self.scan_owner(CF_TOMBSTONES, owner_dc)? {
            let (k, v) = item?;
            let (seq, _reason) = decode_tombstone(&v)?;
            if seq <= upto {
                removed.push(decode_key(&k)?);
                batch.delete_cf(tombs_cf, &k);
            }
        }
        Ok(removed)
    }

    /// Stages one event's effect on state, exactly as the reference model applies it.
    /// `tombstone`: what is known of the key's stored tombstone ([`deletes::Stored`]).
    /// `buf`: scratch for the encoded value (the batch copies it), reused across a batch.
    fn stage_effect(
        &self,
        batch: &mut WriteBatch,
        ev: &ChangeEvent,
        effect: Effect,
        tombstone: deletes::Stored,
        buf: &mut Vec<u8>,
    ) -> Result<StateChange, LogError> {
        let key = ev.op.key();
        let enc = encode_key(key);
        match (effect, &ev.op) {
            (Effect::Put, Op::Register(r) | Op::Update(r)) => {
                self.stage_delete_if_stored(batch, CF_TOMBSTONES, &enc, tombstone)?;
                tandem_schemas::encode_into(&(ev.seq, r), buf);
                batch.put_cf(self.cf(CF_INSTANCES)?, &enc, &buf[..]);
                Ok(StateChange::Put { seq: ev.seq, record: r.clone() })
            }
            (Effect::Tombstone, Op::Deregister { reason, .. }) => {
                batch.delete_cf(self.cf(CF_INSTANCES)?, &enc);
                batch.put_cf(self.cf(CF_TOMBSTONES)?, &enc, tandem_schemas::encode(&(ev.seq, *reason)));
                Ok(StateChange::Remove { key: key.clone() })
            }
            // The merge never pairs these; like the model, change nothing rather than panic.
            (Effect::Put, Op::Deregister { .. }) | (Effect::Tombstone, Op::Register(_) | Op::Update(_)) => {
                Ok(StateChange::Remove { key: key.clone() })
            }
        }
    }

    fn check_writable(&self) -> Result<(), LogError> {
        if self.poisoned {
            return Err(LogError::Storage(format!(
                "event log in {} refuses writes after a failed write until it is recovered",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Writes a state-changing batch with an fsync, together with a staged watch index.
    /// An empty batch writes nothing (and keeps the index staged).
    fn commit(&mut self, batch: WriteBatch) -> Result<(), LogError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write(batch, true)
    }

    fn db(&self) -> Result<&Db, LogError> {
        self.db.as_deref().ok_or_else(|| self.closed())
    }

    fn closed(&self) -> LogError {
        LogError::Storage(format!(
            "event log in {} is closed until a recovery reopens it",
            self.dir.display()
        ))
    }

    fn cf(&self, name: &str) -> Result<&ColumnFamily, LogError> {
        self.db()?
            .cf_handle(name)
            .ok_or_else(|| LogError::Storage(format!("column family {name} is missing")))
    }

    fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, LogError> {
        self.db()?.get_cf(self.cf(CF_META)?, key).map_err(storage)
    }

    fn meta_u64(&self, key: &[u8]) -> Result<u64, LogError> {
        let what = String::from_utf8_lossy(key);
        match self.meta_get(key)? {
            Some(bytes) => decode_u64(&format!("meta {what}"), &bytes),
            None => Err(LogError::Corrupt(format!("meta {what} is missing"))),
        }
    }

    fn meta_marks(&self, prefix: &[u8]) -> Result<BTreeMap<String, Mark>, LogError> {
        let mut out = BTreeMap::new();
        for item in self.scan(CF_META, prefix, prefix_end(prefix))? {
            let (k, v) = item?;
            let name = std::str::from_utf8(&k[prefix.len()..])
                .map_err(|_| LogError::Corrupt("meta mark name is not UTF-8".into()))?;
            out.insert(name.to_owned(), decode_mark("meta mark", &v)?);
        }
        Ok(out)
    }

    /// Iterates `cf` over keys in `lower..upper`.
    fn scan(
        &self,
        cf: &str,
        lower: &[u8],
        upper: Vec<u8>,
    ) -> Result<impl Iterator<Item = Entry> + '_, LogError> {
        let cf = self.cf(cf)?;
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(lower.to_vec());
        ro.set_iterate_upper_bound(upper);
        Ok(self.db()?.iterator_cf_opt(cf, ro, IteratorMode::Start).map(|r| r.map_err(storage)))
    }

    fn scan_all(&self, cf: &str) -> Result<impl Iterator<Item = Entry> + '_, LogError> {
        Ok(self.db()?.iterator_cf(self.cf(cf)?, IteratorMode::Start).map(|r| r.map_err(storage)))
    }

    /// Iterates the keys of `owner_dc` in an instance-keyed column family.
    fn scan_owner(&self, cf: &str, owner_dc: &str) -> Result<impl Iterator<Item = Entry> + '_, LogError> {
        let prefix = owner_prefix(owner_dc);
        let end = prefix_end(&prefix);
        self.scan(cf, &prefix, end)
    }

    fn owner_keys(&self, cf: &str, owner_dc: &str) -> Result<Vec<InstanceKey>, LogError> {
        self.scan_owner(cf, owner_dc)?.map(|item| decode_key(&item?.0)).collect()
    }

    /// Decodes a logged own event and checks it against where it was stored.
    fn decode_logged(&self, seq: u64, bytes: &[u8]) -> Result<ChangeEvent, LogError> {
        let ev: ChangeEvent = tandem_schemas::decode(bytes, VALUE_BYTES_MAX)
            .map_err(|e| LogError::Corrupt(format!("log entry {seq}: {e}")))?;
        if ev.seq != seq || ev.origin_dc != self.dc || ev.origin_epoch != self.own.epoch {
            return Err(LogError::Corrupt(format!(
                "log entry {seq} holds event ({}, {}, {})",
                ev.origin_dc, ev.origin_epoch, ev.seq
            )));
        }
        Ok(ev)
    }

    fn wrong_own_channel(&self, channel_dc: &str) -> LogError {
        LogError::Refused(Refusal::WrongChannel { channel: channel_dc.to_owned(), origin: self.dc.clone() })
    }
}

/// A new data dir starts a provisional epoch (generation 0, a random tiebreak): it does
/// not know yet which epochs of its DC its peers have seen; its first handshake with a
/// peer that holds a newer one moves it above (`tandem_replicator::epoch`). Epochs of
/// earlier builds were random below 2^53 and stay valid ordered epochs.
fn random_epoch() -> NonZeroU64 {
    NonZeroU64::new(tandem_replicator::epoch::provisional(rand::random::<u64>())).unwrap_or(NonZeroU64::MIN)
}

fn decode_uuid(what: &str, bytes: &[u8]) -> Result<Uuid, LogError> {
    let raw: [u8; 16] = bytes.try_into().map_err(|_| LogError::Corrupt(format!("{what}: not 16 bytes")))?;
    Ok(Uuid::from_bytes(raw))
}

fn storage(e: rocksdb::Error) -> LogError {
    LogError::Storage(e.into_string())
}

fn meta_name(prefix: &[u8], name: &str) -> Vec<u8> {
    [prefix, name.as_bytes()].concat()
}

fn decode_instance(bytes: &[u8]) -> Result<(u64, InstanceRecord), LogError> {
    tandem_schemas::decode(bytes, VALUE_BYTES_MAX).map_err(|e| LogError::Corrupt(format!("instance: {e}")))
}

fn decode_tombstone(bytes: &[u8]) -> Result<(u64, DeregisterReason), LogError> {
    tandem_schemas::decode(bytes, VALUE_BYTES_MAX).map_err(|e| LogError::Corrupt(format!("tombstone: {e}")))
}

/// The record read back must be the one its key says: the pair of the encoding on write.
fn check_stored_key(stored: &[u8], key: &InstanceKey) -> Result<(), LogError> {
    if stored != encode_key(key).as_slice() {
        return Err(LogError::Corrupt(format!("instance {key:?} stored under another key")));
    }
    Ok(())
}
