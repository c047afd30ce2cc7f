//! Snapshots in chunks on RocksDB: the own origin's cut read off the committer thread, and
//! a remote origin's chunks staged durably until the last one installs them.
//!
//! Reading: [`RocksLog::open_snapshot_reader`] starts a reader thread that takes a RocksDB
//! snapshot (a consistent cut at the current own mark) before it returns, so the cut is
//! exactly the log's state at that point, while the committer goes on writing. Chunks are
//! then read by that thread, from the snapshot, on the caller's demand; the cut and the
//! thread live as long as the reader.
//!
//! Staging: the meta column family holds the chunks of a remote origin's snapshot under
//! `stage/` and the origin's key prefix (section byte 0: instances, 1: tombstones, then
//! the instance key), and meta `staged/<origin>` says which snapshot and how many chunks. Each chunk is
//! one synced write; the last chunk's write installs the whole snapshot (the same plan as a
//! single-frame install), drops the staging and moves the mark, atomically. A crash in
//! between leaves the old state and the staging; the next stream resumes after it.

use std::sync::mpsc;
use std::sync::Arc;

use rocksdb::{IteratorMode, ReadOptions, WriteBatch};
use tandem_replicator::log::snapshot::{self, Budget, ChunkEntries, ChunkStep, ChunkedReader, CutSource};
use tandem_replicator::log::{ChunkOutcome, LogError, SnapshotReader};
use tandem_schemas::{
    validate_key, validate_record, Mark, Snapshot, SnapshotChunk, SnapshotInstance, StagedSnapshot, Tombstone,
};

use super::{
    check_stored_key, decode_instance, decode_tombstone, meta_name, storage, Db, InvalidRecords, RocksLog,
    CF_INSTANCES, CF_META, CF_TOMBSTONES,
};
use crate::store::keys::{
    decode_key, decode_mark, decode_u64, encode_key, encode_mark, owner_prefix, prefix_end,
};

/// `staged/<origin dc>` -> snapshot id, chunks staged (u64 big-endian each), cut mark.
const META_STAGED_PREFIX: &[u8] = b"staged/";
/// Staged entries live in the meta column family under `stage/` + the origin's key
/// prefix, not in a column family of their own: a data dir stays readable by a build
/// from before chunked snapshots (a downgrade), which ignores meta keys it does not know.
const STAGE_ENTRIES_PREFIX: &[u8] = b"stage/";

fn staging_prefix(origin: &str) -> Vec<u8> {
    [STAGE_ENTRIES_PREFIX, &owner_prefix(origin)[..]].concat()
}
const SECTION_INSTANCES: u8 = 0;
const SECTION_TOMBSTONES: u8 = 1;

/// A position in the cut: the section (instances, tombstones) and the first key to read.
type Pos = (u8, Vec<u8>);
type ReadRequest = (Pos, usize, mpsc::SyncSender<Result<ChunkEntries<Pos>, LogError>>);

/// The cut as seen from the reader: requests to the thread that holds the RocksDB snapshot.
struct RocksCut {
    prefix: Vec<u8>,
    tx: mpsc::Sender<ReadRequest>,
}

impl CutSource for RocksCut {
    type Pos = Pos;
    fn start(&self) -> Pos {
        (SECTION_INSTANCES, self.prefix.clone())
    }
    fn read_from(&mut self, pos: &Pos, bytes_max: usize) -> Result<ChunkEntries<Pos>, LogError> {
        let gone = || LogError::Storage("the snapshot reader thread is gone".into());
        let (reply, answer) = mpsc::sync_channel(1);
        self.tx.send((pos.clone(), bytes_max, reply)).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

/// How long closing a log waits for its snapshot readers to let go of the database.
const READERS_CLOSE_WAIT_MS: u64 = 2_000;

impl Drop for RocksLog {
    /// Snapshot readers share the database; a reader still finishing a chunk would keep it
    /// open (and locked) after the log closed. Wait for them, bounded: a node restarting
    /// on the same data dir must find it free.
    fn drop(&mut self) {
        if let Some(db) = self.db.take() {
            let _ = close_when_released(db);
        }
    }
}

/// Closes `db` once no snapshot reader shares it, waiting at most
/// `READERS_CLOSE_WAIT_MS`; gives it back if a reader still holds it then.
pub(super) fn close_when_released(db: Arc<Db>) -> Result<(), Arc<Db>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(READERS_CLOSE_WAIT_MS);
    while Arc::strong_count(&db) > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Arc::try_unwrap(db).map(drop)
}

impl RocksLog {
    /// [`EventLog::open_snapshot`](tandem_replicator::log::EventLog::open_snapshot): the cut
    /// is taken before this returns; reading happens on the reader's own thread.
    pub(super) fn open_snapshot_reader(&self, bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError> {
        let db: Arc<Db> = Arc::clone(self.db.as_ref().ok_or_else(|| self.closed())?);
        let prefix = owner_prefix(&self.dc);
        let thread_prefix = prefix.clone();
        let invalid = Arc::clone(&self.invalid);
        let (tx, rx) = mpsc::channel::<ReadRequest>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("tandem-snapshot".into())
            .spawn(move || {
                let snap = db.snapshot();
                let _ = ready_tx.send(());
                while let Ok((pos, max, reply)) = rx.recv() {
                    let _ = reply.send(read_cut(&db, &snap, &invalid, &thread_prefix, &pos, max));
                }
            })
            .map_err(|e| LogError::Storage(format!("cannot start a snapshot reader: {e}")))?;
        ready_rx.recv().map_err(|_| LogError::Storage("the snapshot reader died before its cut".into()))?;
        Ok(Box::new(ChunkedReader::new(RocksCut { prefix, tx }, self.own, self.floor, bytes_max)))
    }

    /// Adds to `batch` the removal of what is staged of `origin` (a retirement).
    pub(super) fn drop_staging(&self, batch: &mut WriteBatch, origin: &str) -> Result<(), LogError> {
        let prefix = staging_prefix(origin);
        batch.delete_range_cf(self.cf(CF_META)?, &prefix, &prefix_end(&prefix));
        batch.delete_cf(self.cf(CF_META)?, meta_name(META_STAGED_PREFIX, origin));
        Ok(())
    }

    /// The staged snapshot of `origin` and its cut.
    pub(super) fn staged_of(&self, origin: &str) -> Result<Option<(StagedSnapshot, Mark)>, LogError> {
        let Some(v) = self.meta_get(&meta_name(META_STAGED_PREFIX, origin))? else { return Ok(None) };
        if v.len() != 32 {
            return Err(LogError::Corrupt(format!("meta staged/{origin}: {} bytes, expected 32", v.len())));
        }
        let staged = StagedSnapshot {
            snapshot_id: decode_u64("staged id", &v[..8])?,
            chunks: decode_u64("staged chunks", &v[8..16])?,
        };
        Ok(Some((staged, decode_mark("staged mark", &v[16..])?)))
    }

    /// [`EventLog::stage_snapshot_chunk`](tandem_replicator::log::EventLog::stage_snapshot_chunk).
    pub(super) fn stage_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        self.check_writable()?;
        if channel_dc == self.dc {
            return Err(self.wrong_own_channel(channel_dc));
        }
        let staged = self.staged_of(channel_dc)?.map(|(s, _)| s);
        let step = snapshot::check_chunk(channel_dc, staged, chunk)?;
        if let (ChunkStep::Duplicate, Some(s)) = (step, staged) {
            return Ok(ChunkOutcome::Staged(s));
        }
        let meta_cf = self.cf(CF_META)?;
        let prefix = staging_prefix(channel_dc);
        let end = prefix_end(&prefix);
        let meta_key = meta_name(META_STAGED_PREFIX, channel_dc);
        let mut batch = WriteBatch::default();
        if chunk.last {
            let mut snap = Snapshot {
                origin_dc: channel_dc.to_owned(),
                mark: chunk.mark,
                instances: vec![],
                tombstones: vec![],
            };
            if step == ChunkStep::Continue {
                self.read_staged(&prefix, &end, &mut snap)?;
            }
            snap.instances.extend(chunk.instances.iter().cloned());
            snap.tombstones.extend(chunk.tombstones.iter().cloned());
            let report = self.stage_install(&mut batch, channel_dc, &snap)?;
            batch.delete_range_cf(meta_cf, &prefix, &end);
            batch.delete_cf(meta_cf, &meta_key);
            self.commit(batch)?;
            self.marks.insert(channel_dc.to_owned(), report.mark.unwrap_or(chunk.mark));
            self.mark_ids.remove(channel_dc);
            return Ok(ChunkOutcome::Installed(report));
        }
        if step == ChunkStep::Restart {
            batch.delete_range_cf(meta_cf, &prefix, &end);
        }
        for SnapshotInstance { seq, record } in &chunk.instances {
            let k = [&prefix[..], &[SECTION_INSTANCES], &encode_key(&record.key)].concat();
            batch.put_cf(meta_cf, k, tandem_schemas::encode(&(*seq, record)));
        }
        for t in &chunk.tombstones {
            let k = [&prefix[..], &[SECTION_TOMBSTONES], &encode_key(&t.key)].concat();
            batch.put_cf(meta_cf, k, tandem_schemas::encode(&(t.seq, t.reason)));
        }
        let now = StagedSnapshot { snapshot_id: chunk.snapshot_id, chunks: chunk.index + 1 };
        let mut v = Vec::with_capacity(32);
        v.extend_from_slice(&now.snapshot_id.to_be_bytes());
        v.extend_from_slice(&now.chunks.to_be_bytes());
        v.extend_from_slice(&encode_mark(chunk.mark));
        batch.put_cf(meta_cf, &meta_key, v);
        self.commit(batch)?;
        Ok(ChunkOutcome::Staged(now))
    }

    /// Reads every staged entry under `prefix` into `snap`, instances then tombstones.
    fn read_staged(&self, prefix: &[u8], end: &[u8], snap: &mut Snapshot) -> Result<(), LogError> {
        for item in self.scan(CF_META, prefix, end.to_vec())? {
            let (k, v) = item?;
            let rest = &k[prefix.len()..];
            match rest.split_first() {
                Some((&SECTION_INSTANCES, key)) => {
                    let (seq, record) = decode_instance(&v)?;
                    check_stored_key(key, &record.key)?;
                    snap.instances.push(SnapshotInstance { seq, record });
                }
                Some((&SECTION_TOMBSTONES, key)) => {
                    let (seq, reason) = decode_tombstone(&v)?;
                    snap.tombstones.push(Tombstone { key: decode_key(key)?, seq, reason });
                }
                _ => return Err(LogError::Corrupt("staging key without a known section".into())),
            }
        }
        Ok(())
    }
}

/// Reads entries of the own origin from the RocksDB snapshot, from `pos`, under a budget.
fn read_cut(
    db: &Db,
    snap: &rocksdb::SnapshotWithThreadMode<'_, Db>,
    invalid: &InvalidRecords,
    prefix: &[u8],
    pos: &Pos,
    bytes_max: usize,
) -> Result<ChunkEntries<Pos>, LogError> {
    let mut budget = Budget::new(bytes_max);
    let mut out = ChunkEntries { instances: vec![], tombstones: vec![], next: None };
    let end = prefix_end(prefix);
    for section in pos.0..=SECTION_TOMBSTONES {
        let name = if section == SECTION_INSTANCES { CF_INSTANCES } else { CF_TOMBSTONES };
        let cf = db
            .cf_handle(name)
            .ok_or_else(|| LogError::Storage(format!("column family {name} is missing")))?;
        let lower = if section == pos.0 { pos.1.clone() } else { prefix.to_vec() };
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(lower);
        ro.set_iterate_upper_bound(end.clone());
        for item in snap.iterator_cf_opt(cf, ro, IteratorMode::Start) {
            let (k, v) = item.map_err(storage)?;
            // The stored value is the entry's encoding (instances), or close above it with
            // the key (tombstones): a bound that never underestimates.
            let len = if section == SECTION_INSTANCES { v.len() } else { v.len() + k.len() };
            if !budget.take(len) {
                out.next = Some((section, k.to_vec()));
                return Ok(out);
            }
            if section == SECTION_INSTANCES {
                let (seq, record) = decode_instance(&v)?;
                check_stored_key(&k, &record.key)?;
                // A stored record that breaks the schema's rules is sent to no peer (it
                // would refuse the chunk, and the snapshot would never arrive).
                match validate_record(&record) {
                    Ok(()) => out.instances.push(SnapshotInstance { seq, record }),
                    Err(e) => invalid.note(format!("instance {:?}: {e}", record.key)),
                }
            } else {
                let (seq, reason) = decode_tombstone(&v)?;
                let key = decode_key(&k)?;
                match validate_key(&key) {
                    Ok(()) => out.tombstones.push(Tombstone { key, seq, reason }),
                    Err(e) => invalid.note(format!("tombstone {key:?}: {e}")),
                }
            }
        }
    }
    Ok(out)
}
