//! RocksLog as the state machine of a DC's Raft group (issue 17, docs/cluster.md): the
//! applied Raft state written in the same batch as a round's events, point reads of live
//! records for minting at apply, and the export and atomic replacement of the whole state
//! for Raft snapshots.
//!
//! - `meta` `raft_applied`: the state machine's applied log id and membership, encoded by
//!   the cluster module (opaque here, bounded by [`RAFT_APPLIED_BYTES_MAX`]). Written in the
//!   same synced `WriteBatch` as the events, state and owner records of the entries it
//!   covers, so a crash never leaves the state ahead of or behind its applied id.
//! - A state export is the whole of RocksLog's four column families, in key order:
//!   a format byte ([`STATE_FORMAT_V1`]), then per stored pair the column family's
//!   position, the key's length (u32 big-endian), the key, the value's length and the
//!   value. Raw pairs rather than events: the install is then byte for byte the builder's
//!   state (marks, owners, tombstones, purge floor, peer acks), with no merge to redo.
//! - A replacement checks the export before it writes (format, bounds, the DC, the meta
//!   the log needs to open, the own log's seqs against the own seq and purge floor, the
//!   applied state it must carry) and then deletes every stored pair and writes the
//!   export's in one synced batch: all of it or nothing.

use std::sync::Arc;

use rocksdb::WriteBatch;
use tandem_replicator::log::{LogError, StateChange};
use tandem_schemas::{ChangeEvent, InstanceKey, InstanceRecord};

use super::{
    decode_instance, storage, RocksLog, CF_INSTANCES, CF_LOG, CF_META, COLUMN_FAMILIES, META_DC, META_EPOCH,
    META_OWN_SEQ, META_PURGE_FLOOR, VALUE_BYTES_MAX,
};
use crate::store::keys::{decode_u64, encode_key, KEY_BYTES_MAX};

/// The meta key of the Raft state machine's applied state.
pub(super) const META_RAFT_APPLIED: &[u8] = b"raft_applied";

/// Largest applied state (log id and membership) stored or read back; a membership of five
/// members with their addresses is well under 1 KiB.
pub const RAFT_APPLIED_BYTES_MAX: usize = 64 * 1024;

/// The format byte of a state export.
pub const STATE_FORMAT_V1: u8 = 1;

/// Longest key in an export (meta keys add a short prefix to an encoded instance key).
const STATE_KEY_BYTES_MAX: usize = 2 * KEY_BYTES_MAX;

/// Bytes an export spends per pair besides key and value.
const PAIR_HEADER_BYTES: usize = 1 + 4 + 4;

impl RocksLog {
    /// The live record of `key` and its seq, if the state holds one.
    pub fn instance(&self, key: &InstanceKey) -> Result<Option<(u64, InstanceRecord)>, LogError> {
        let Some(bytes) =
            self.db()?.get_pinned_cf(self.cf(CF_INSTANCES)?, encode_key(key)).map_err(storage)?
        else {
            return Ok(None);
        };
        let (seq, record) = decode_instance(&bytes)?;
        if record.key != *key {
            return Err(LogError::Corrupt(format!("instance stored under {key:?} is {:?}", record.key)));
        }
        Ok(Some((seq, record)))
    }

    /// The applied Raft state last written with [`append_local_applied`](Self::append_local_applied)
    /// (or installed with a snapshot), as stored.
    pub fn raft_applied(&self) -> Result<Option<Vec<u8>>, LogError> {
        let value = self.meta_get(META_RAFT_APPLIED)?;
        if let Some(v) = &value {
            if v.len() > RAFT_APPLIED_BYTES_MAX {
                return Err(LogError::Corrupt(format!(
                    "meta raft_applied of {} bytes, at most {RAFT_APPLIED_BYTES_MAX}",
                    v.len()
                )));
            }
        }
        Ok(value)
    }

    /// Runs `op`, one of this log's writes (each makes at most one synced batch: a remote
    /// batch, a snapshot or one of its chunks, a purge, a peer ack, a retirement), with the
    /// Raft state machine's applied state `applied` in that same batch, so the write and
    /// its applied id never part; when `op` made no synced batch (it changed nothing, or
    /// its write is not synced), `applied` is then written alone, synced.
    ///
    /// `op`'s error comes back as the inner result. A refusal (`Refused`, `Invalid`,
    /// `Purged`, `OutOfSequence`, `EpochNotAbove`: the same on every member) still writes
    /// `applied`, the entry having been applied as a refusal; a storage or corruption error
    /// is the outer error, and nothing of `applied` is written by this call then.
    pub fn with_applied<R>(
        &mut self,
        applied: &[u8],
        op: impl FnOnce(&mut RocksLog) -> Result<R, LogError>,
    ) -> Result<Result<R, LogError>, LogError> {
        self.check_writable()?;
        if applied.len() > RAFT_APPLIED_BYTES_MAX {
            return Err(LogError::Invalid(format!(
                "applied state of {} bytes, at most {RAFT_APPLIED_BYTES_MAX}",
                applied.len()
            )));
        }
        self.pending_applied = Some(applied.to_vec());
        let result = op(self);
        let left = self.pending_applied.take();
        match result {
            Err(e @ (LogError::Storage(_) | LogError::Corrupt(_))) => Err(e),
            result => {
                if let Some(applied) = left {
                    let mut batch = WriteBatch::default();
                    batch.put_cf(self.cf(CF_META)?, META_RAFT_APPLIED, applied);
                    self.commit(batch)?;
                }
                Ok(result)
            }
        }
    }

    /// [`append_local_owned`](Self::append_local_owned) that also writes `applied` (the Raft
    /// state machine's applied state) in the same synced batch, even with no events (a blank
    /// or membership entry advances the applied id and nothing else).
    pub fn append_local_applied(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
        applied: &[u8],
    ) -> Result<Vec<StateChange>, LogError> {
        self.check_writable()?;
        if applied.len() > RAFT_APPLIED_BYTES_MAX {
            return Err(LogError::Invalid(format!(
                "applied state of {} bytes, at most {RAFT_APPLIED_BYTES_MAX}",
                applied.len()
            )));
        }
        let mut batch = WriteBatch::default();
        let changes = self.stage_local_owned(&mut batch, events, owners)?;
        batch.put_cf(self.cf(CF_META)?, META_RAFT_APPLIED, applied);
        self.commit(batch)?;
        if let Some(last) = events.last() {
            self.own.seq = last.seq;
        }
        Ok(changes)
    }

    /// The whole state as an export (see the module docs); refused once it would pass
    /// `bytes_max`.
    pub fn export_state(&self, bytes_max: usize) -> Result<Vec<u8>, LogError> {
        let mut out = vec![STATE_FORMAT_V1];
        for (position, name) in COLUMN_FAMILIES.iter().enumerate() {
            for item in self.scan_all(name)? {
                let (k, v) = item?;
                let add = PAIR_HEADER_BYTES + k.len() + v.len();
                if out.len().saturating_add(add) > bytes_max {
                    return Err(LogError::Storage(format!(
                        "the state passes {bytes_max} bytes; it cannot be exported in one snapshot"
                    )));
                }
                out.push(position as u8);
                out.extend_from_slice(&(k.len() as u32).to_be_bytes());
                out.extend_from_slice(&k);
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(&v);
            }
        }
        Ok(out)
    }

    /// Replaces the whole state with an export, atomically: checked first (nothing is
    /// written when a check fails), then one synced batch. `applied`: the applied state the
    /// export must carry (the snapshot's meta, encoded as the cluster module stores it).
    pub fn replace_state(&mut self, export: &[u8], applied: &[u8]) -> Result<(), LogError> {
        self.check_writable()?;
        let pairs = parse_export(export)?;
        self.write_pairs(&pairs, Some(applied), "event log replaced by a Raft snapshot")
    }

    /// Seeds this log, which must be new (no own event, no instance), with a backup's
    /// export (`tandem restore`, docs/operations.md): the export's state with its own
    /// epoch made `epoch` (a restore passes a provisional one, so the DC takes a new epoch
    /// above what its peers saw at its first handshake: a restored history is one that
    /// went back) and its Raft applied state made `applied` (a group's first member: a
    /// one-member group at the backup's index; a single node: none).
    pub fn restore_state(
        &mut self,
        export: &[u8],
        applied: Option<&[u8]>,
        epoch: std::num::NonZeroU64,
    ) -> Result<(), LogError> {
        self.check_writable()?;
        if self.own.seq != 0 || self.scan_all(CF_INSTANCES)?.next().is_some() {
            return Err(LogError::Invalid(format!(
                "the log in {} is not new (own seq {}): a restore seeds an empty data dir",
                self.dir.display(),
                self.own.seq
            )));
        }
        let parsed = parse_export(export)?;
        let meta = COLUMN_FAMILIES.iter().position(|n| *n == CF_META).map(|p| p as u8);
        let epoch_bytes = epoch.get().to_be_bytes();
        let mut pairs: Vec<Pair<'_>> = parsed
            .into_iter()
            .filter(|(p, k, _)| !(Some(*p) == meta && (*k == META_EPOCH || *k == META_RAFT_APPLIED)))
            .collect();
        let meta = meta.ok_or_else(|| bad("no meta column family".into()))?;
        pairs.push((meta, META_EPOCH, &epoch_bytes));
        if let Some(applied) = applied {
            pairs.push((meta, META_RAFT_APPLIED, applied));
        }
        pairs.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        self.write_pairs(&pairs, applied, "event log seeded from a backup")
    }

    /// Checks `pairs` (see [`check_export`](Self::check_export)), then replaces every
    /// stored pair by them in one synced batch and reloads.
    fn write_pairs(
        &mut self,
        pairs: &[Pair<'_>],
        applied: Option<&[u8]>,
        what: &str,
    ) -> Result<(), LogError> {
        self.check_export(pairs, applied)?;
        let mut batch = WriteBatch::default();
        for name in COLUMN_FAMILIES {
            let cf = self.cf(name)?;
            for item in self.scan_all(name)? {
                batch.delete_cf(cf, item?.0);
            }
        }
        for (position, k, v) in pairs {
            batch.put_cf(self.cf(COLUMN_FAMILIES[usize::from(*position)])?, k, v);
        }
        self.pending_index = None;
        self.write(batch, true)?;
        if let Err(e) = self.load() {
            // Checked before the write, so this is a storage failure: refuse writes until a
            // recovery reloads what is durable.
            self.poisoned = true;
            return Err(e);
        }
        tracing::warn!(dc = %self.dc, own = ?self.own, pairs = pairs.len(), "{what}");
        Ok(())
    }

    /// What [`load`](Self::load) will need of the export, checked before anything is written.
    fn check_export(&self, pairs: &[Pair<'_>], applied: Option<&[u8]>) -> Result<(), LogError> {
        let position = |name: &str| COLUMN_FAMILIES.iter().position(|n| *n == name).map(|p| p as u8);
        let (meta, log) = (position(CF_META), position(CF_LOG));
        let meta_of =
            |key: &[u8]| pairs.iter().find(|(p, k, _)| Some(*p) == meta && *k == key).map(|(_, _, v)| *v);
        if meta_of(META_DC) != Some(self.dc.as_bytes()) {
            return Err(bad(format!("not a state of DC {}", self.dc)));
        }
        if meta_of(META_RAFT_APPLIED) != applied {
            return Err(bad("its applied state is not the one its meta names".into()));
        }
        let u64_of = |key: &[u8]| -> Result<u64, LogError> {
            let name = String::from_utf8_lossy(key);
            match meta_of(key) {
                Some(v) => decode_u64(&format!("snapshot meta {name}"), v),
                None => Err(LogError::Invalid(format!("snapshot: no meta {name}"))),
            }
        };
        if u64_of(META_EPOCH)? == 0 {
            return Err(bad("epoch 0".into()));
        }
        let (own_seq, floor) = (u64_of(META_OWN_SEQ)?, u64_of(META_PURGE_FLOOR)?);
        let mut expected = floor.checked_add(1);
        for (_, k, _) in pairs.iter().filter(|(p, _, _)| Some(*p) == log) {
            let seq = decode_u64("snapshot log key", k)?;
            if Some(seq) != expected || seq > own_seq {
                return Err(bad(format!("own log holds seq {seq}, expected {expected:?} up to {own_seq}")));
            }
            expected = seq.checked_add(1);
        }
        if floor > own_seq || expected != own_seq.checked_add(1) {
            return Err(bad(format!("own log ends before seq {own_seq} (purge floor {floor})")));
        }
        Ok(())
    }
}

/// One stored pair of an export: (column family's index, key, value).
type Pair<'a> = (u8, &'a [u8], &'a [u8]);

/// The pairs of an export, checked against its format and bounds.
fn parse_export(export: &[u8]) -> Result<Vec<Pair<'_>>, LogError> {
    let (&format, mut rest) = export.split_first().ok_or_else(|| bad("empty".into()))?;
    if format != STATE_FORMAT_V1 {
        return Err(bad(format!("format {format}, this build reads {STATE_FORMAT_V1}")));
    }
    let mut pairs: Vec<Pair<'_>> = Vec::new();
    while let Some((&position, tail)) = rest.split_first() {
        rest = tail;
        if usize::from(position) >= COLUMN_FAMILIES.len() {
            return Err(bad(format!("column family {position}")));
        }
        let key_len = take_len(&mut rest)?;
        if key_len > STATE_KEY_BYTES_MAX {
            return Err(bad(format!("key of {key_len} bytes, at most {STATE_KEY_BYTES_MAX}")));
        }
        let key = take(&mut rest, key_len)?;
        let value_len = take_len(&mut rest)?;
        if value_len > VALUE_BYTES_MAX {
            return Err(bad(format!("value of {value_len} bytes, at most {VALUE_BYTES_MAX}")));
        }
        let value = take(&mut rest, value_len)?;
        // In column family then key order, each pair once: as an export writes them.
        if pairs.last().is_some_and(|(p, k, _)| (*p, *k) >= (position, key)) {
            return Err(bad("pairs out of order".into()));
        }
        pairs.push((position, key, value));
    }
    Ok(pairs)
}

fn bad(what: String) -> LogError {
    LogError::Invalid(format!("snapshot: {what}"))
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], LogError> {
    if rest.len() < n {
        return Err(bad(format!("cut short ({} bytes left, {n} wanted)", rest.len())));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_len(rest: &mut &[u8]) -> Result<usize, LogError> {
    let bytes: [u8; 4] = take(rest, 4)?.try_into().map_err(|_| bad("length".into()))?;
    Ok(u32::from_be_bytes(bytes) as usize)
}
