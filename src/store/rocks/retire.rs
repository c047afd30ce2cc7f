//! Retiring a lost DC in the RocksDB log: its live copies, its tombstones, its mark and
//! its acknowledgement go in one synced write together with a durable `retired/<dc>`
//! marker; while the marker stays, the committer refuses the DC's frames.

use std::collections::BTreeMap;

use rocksdb::WriteBatch;
use tandem_replicator::log::{EventLog, LogError, StateChange};
use tandem_schemas::validate_dc;

use super::{
    decode_key, decode_u64, meta_name, prefix_end, RocksLog, CF_INSTANCES, CF_META, CF_TOMBSTONES,
    META_ACK_PREFIX, META_MARK_ID_PREFIX, META_MARK_PREFIX,
};
use crate::store::Retirement;

/// `retired/<dc>` -> the wall-clock ms the DC was retired at (8 bytes, big-endian).
pub(super) const META_RETIRED_PREFIX: &[u8] = b"retired/";

impl RocksLog {
    /// The DCs retired here, with the wall-clock ms each was retired at.
    pub fn retired(&self) -> BTreeMap<String, u64> {
        self.retired.clone()
    }

    /// See [`CommitLog::retire_origin`](crate::store::CommitLog::retire_origin).
    pub fn retire_origin(&mut self, dc: &str, at_ms: u64) -> Result<Retirement, LogError> {
        self.check_writable()?;
        validate_dc("dc", dc).map_err(|e| LogError::Storage(format!("cannot retire: {e}")))?;
        if dc == self.dc {
            return Err(LogError::Storage(format!("cannot retire {dc}: it is this log's own DC")));
        }
        if let Some(at) = self.retired.get(dc) {
            return Ok(Retirement { at_ms: *at, newly: false, ..Default::default() });
        }
        let (inst_cf, tomb_cf, meta) = (self.cf(CF_INSTANCES)?, self.cf(CF_TOMBSTONES)?, self.cf(CF_META)?);
        let mut batch = WriteBatch::default();
        let mut changes = Vec::new();
        for item in self.scan_owner(CF_INSTANCES, dc)? {
            let (k, _) = item?;
            changes.push(StateChange::Remove { key: decode_key(&k)? });
            batch.delete_cf(inst_cf, &k);
        }
        let mut tombstones_removed = 0;
        for item in self.scan_owner(CF_TOMBSTONES, dc)? {
            let (k, _) = item?;
            tombstones_removed += 1;
            batch.delete_cf(tomb_cf, &k);
        }
        batch.delete_cf(meta, meta_name(META_MARK_PREFIX, dc));
        batch.delete_cf(meta, meta_name(META_MARK_ID_PREFIX, dc));
        batch.delete_cf(meta, meta_name(META_ACK_PREFIX, dc));
        batch.put_cf(meta, meta_name(META_RETIRED_PREFIX, dc), at_ms.to_be_bytes());
        self.drop_staging(&mut batch, dc)?;
        self.commit(batch)?;
        let mark = self.marks.remove(dc);
        self.mark_ids.remove(dc);
        self.peer_acks.remove(dc);
        self.retired.insert(dc.to_owned(), at_ms);
        tracing::warn!(
            retired = %dc,
            copies_removed = changes.len(),
            tombstones_removed,
            ?mark,
            "DC retired: its copies are gone and its frames are refused"
        );
        Ok(Retirement { at_ms, newly: true, changes, tombstones_removed, mark })
    }

    /// See [`CommitLog::unretire_origin`](crate::store::CommitLog::unretire_origin).
    pub fn unretire_origin(&mut self, dc: &str) -> Result<bool, LogError> {
        self.check_writable()?;
        if !self.retired.contains_key(dc) {
            return Ok(false);
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_META)?, meta_name(META_RETIRED_PREFIX, dc));
        self.commit(batch)?;
        self.retired.remove(dc);
        tracing::warn!(dc = %dc, "DC unretired: it replicates again, from scratch");
        Ok(true)
    }

    /// Reads the retirement markers (at open).
    pub(super) fn load_retired(&self) -> Result<BTreeMap<String, u64>, LogError> {
        let prefix = META_RETIRED_PREFIX;
        let mut out = BTreeMap::new();
        for item in self.scan(CF_META, prefix, prefix_end(prefix))? {
            let (k, v) = item?;
            let name = std::str::from_utf8(&k[prefix.len()..])
                .map_err(|_| LogError::Corrupt("meta retired name is not UTF-8".into()))?;
            out.insert(name.to_owned(), decode_u64("meta retired", &v)?);
        }
        // A retired DC holds nothing here; a mark would mean a write half-seen.
        if let Some(dc) = out.keys().find(|dc| self.mark_of(dc).is_some()) {
            return Err(LogError::Corrupt(format!("DC {dc} is retired but a mark of it is stored")));
        }
        Ok(out)
    }
}
