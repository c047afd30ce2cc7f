//! Instance ownership in the RocksDB log: the principal that registered each own live
//! instance, in the meta column family under `owner/` + the instance key (no column family
//! of its own, so a build from before ownership still opens the data dir, ignoring these
//! keys), written in the same synced batch as the events
//! that register or remove it (so after a crash an instance and its owner record are both
//! there or both not). Local to this DC: owners never replicate (only the owner DC takes
//! writes for an instance). Never a secret: a token id or a principal name.
//!
//! The anonymous principal (ACLs off) is recorded as no owner (`owner_changes`), so a node
//! with ACLs off holds no owner record at all. It knows so (`RocksLog::owner_records`,
//! read at every load, set by any owner record staged): its registrations then neither
//! write an owner record nor read for one to delete. A read per registration on `meta`,
//! whose small table files carry no filters, cost more than the record it replaced.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rocksdb::WriteBatch;
use tandem_replicator::log::{check_local_sequence, local_effect, LogError, StateChange};
use tandem_schemas::{ChangeEvent, InstanceKey};

use super::deletes::Repeated;
use super::{decode_key, encode_key, prefix_end, seq_key, RocksLog, CF_LOG, CF_META, META_OWN_SEQ};
use crate::store::commit_log::owner_changes;

/// Meta key prefix of the owner records.
const OWNER_PREFIX: &[u8] = b"owner/";

fn owner_key(key: &InstanceKey) -> Vec<u8> {
    [OWNER_PREFIX, &encode_key(key)[..]].concat()
}

/// Longest owner name read back (a token id or principal name is far shorter).
const OWNER_BYTES_MAX: usize = 256;

impl RocksLog {
    /// See [`CommitLog::append_local_owned`](crate::store::CommitLog::append_local_owned).
    pub fn append_local_owned(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError> {
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        let changes = self.stage_local_owned(&mut batch, events, owners)?;
        let Some(last) = events.last() else {
            return Ok(changes);
        };
        let last_seq = last.seq;
        self.commit(batch)?;
        self.own.seq = last_seq;
        Ok(changes)
    }

    /// Stages own events (checked against the own mark), their effects on state and their
    /// owner records into `batch`; the caller commits it and then moves `own.seq` to the
    /// last event's seq. No events: nothing staged.
    pub(super) fn stage_local_owned(
        &self,
        batch: &mut WriteBatch,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError> {
        check_local_sequence(self.own, &self.dc, events)?;
        let Some(last) = events.last() else {
            return Ok(Vec::new());
        };
        let log_cf = self.cf(CF_LOG)?;
        let repeated = Repeated::of(events.iter().map(|ev| ev.op.key()));
        let mut changes = Vec::with_capacity(events.len());
        let mut buf = Vec::new();
        for ev in events {
            let tombstone = repeated.stored(ev.op.key());
            changes.push(self.stage_effect(batch, ev, local_effect(ev), tombstone, &mut buf)?);
            tandem_schemas::encode_into(ev, &mut buf);
            batch.put_cf(log_cf, seq_key(ev.seq), &buf[..]);
        }
        let meta_cf = self.cf(CF_META)?;
        for (key, owner) in owner_changes(events, owners) {
            match owner {
                Some(o) => {
                    // Before the write: a failed one leaves the flag set, which costs only reads.
                    self.owner_records.store(true, Ordering::Relaxed);
                    batch.put_cf(meta_cf, owner_key(&key), o.as_bytes())
                }
                // No owner record anywhere (none at the last load, none staged since):
                // nothing to remove, nothing to read.
                None if !self.owner_records.load(Ordering::Relaxed) => {}
                None => {
                    self.stage_delete_if_stored(batch, CF_META, &owner_key(&key), repeated.stored(&key))?
                }
            }
        }
        batch.put_cf(meta_cf, META_OWN_SEQ, last.seq.to_be_bytes());
        Ok(changes)
    }

    /// The owners of the own live instances, as durable.
    /// Whether any owner record is stored (read at every load; see `owner_records`).
    pub(super) fn holds_owner_records(&self) -> Result<bool, LogError> {
        Ok(self.scan(CF_META, OWNER_PREFIX, prefix_end(OWNER_PREFIX))?.next().is_some())
    }

    pub fn owners(&self) -> Result<Vec<(InstanceKey, Arc<str>)>, LogError> {
        let mut out = Vec::new();
        for item in self.scan(CF_META, OWNER_PREFIX, prefix_end(OWNER_PREFIX))? {
            let (k, v) = item?;
            let k = &k[OWNER_PREFIX.len()..];
            if v.len() > OWNER_BYTES_MAX {
                return Err(LogError::Corrupt(format!("owner record of {} bytes", v.len())));
            }
            let owner =
                std::str::from_utf8(&v).map_err(|_| LogError::Corrupt("owner record is not UTF-8".into()))?;
            out.push((decode_key(k)?, Arc::from(owner)));
        }
        Ok(out)
    }
}
