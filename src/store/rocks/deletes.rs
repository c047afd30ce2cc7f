//! Deletes staged only where something is stored. A registration must clear its key's
//! tombstone and owner record, but a fresh key has neither, and a delete of an absent key
//! still costs an entry in its column family's memtable (about 100 B each, held until the
//! memtable flushes) and bytes in the synced WAL write: staged for every registration,
//! the two would be 40% of what a fresh registration's memtables hold.
//!
//! Whether a key is stored is read from the database, which only holds what earlier batches
//! wrote. A key that more than one event of the batch touches is therefore never read: its
//! deletes are always staged, since an earlier event of the same batch may have staged the
//! very record they remove. A failed read stages the delete too: skipping one is only ever
//! an optimization. The merge of remote events has already read each key's state to plan
//! the batch ([`Held`](tandem_replicator::merge::Held)): what it read says whether a
//! tombstone is stored, without a second read.

use std::collections::HashSet;

use rocksdb::WriteBatch;
use tandem_replicator::log::LogError;
use tandem_schemas::InstanceKey;

use super::RocksLog;

/// The keys that more than one event of a batch touches.
pub(super) struct Repeated<'a>(HashSet<&'a InstanceKey>);

impl<'a> Repeated<'a> {
    /// The keys of `keys` (one per event, in the batch's order) that occur more than once.
    pub(super) fn of(keys: impl Iterator<Item = &'a InstanceKey>) -> Self {
        let mut seen = HashSet::new();
        let repeated = keys.filter(|k| !seen.insert(*k)).collect();
        Repeated(repeated)
    }

    /// What is known before reading of whether `key`'s records are stored: nothing when
    /// only this event touches it (the database says), else [`Stored::Yes`].
    pub(super) fn stored(&self, key: &InstanceKey) -> Stored {
        if self.0.contains(key) {
            Stored::Yes
        } else {
            Stored::Read
        }
    }
}

/// Whether a record is stored under a key before the batch, as far as the batch knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stored {
    /// Not known: read the database.
    Read,
    /// Stored, or maybe staged by an earlier event of the batch: stage the delete.
    Yes,
    /// Read already, and absent.
    No,
}

impl RocksLog {
    /// Stages the delete of `key` in column family `cf` unless it is known, or read now
    /// ([`Stored::Read`]), that nothing is stored under it.
    pub(super) fn stage_delete_if_stored(
        &self,
        batch: &mut WriteBatch,
        cf: &str,
        key: &[u8],
        stored: Stored,
    ) -> Result<(), LogError> {
        let handle = self.cf(cf)?;
        let stored = match stored {
            Stored::Yes => true,
            Stored::No => false,
            Stored::Read => self.db()?.get_pinned_cf(handle, key).map_or(true, |v| v.is_some()),
        };
        if stored {
            batch.delete_cf(handle, key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::sync::Arc;

    use tandem_replicator::log::conformance::{dereg, key, reg};
    use tandem_replicator::log::EventLog;
    use tandem_replicator::merge::Held;
    use tempfile::TempDir;

    use super::super::{RocksLog, CF_META, CF_TOMBSTONES};

    /// A settled epoch, as in the log's other tests.
    const EPOCH: u64 = (1 << 20) | 3;

    fn fresh(dir: &TempDir) -> RocksLog {
        RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(EPOCH).unwrap()).unwrap()
    }

    /// Deletes in the active memtable of column family `cf`.
    fn deletes_in(log: &RocksLog, cf: &str) -> u64 {
        let db = log.db().unwrap();
        db.property_int_value_cf(log.cf(cf).unwrap(), "rocksdb.num-deletes-active-mem-table")
            .unwrap()
            .unwrap()
    }

    fn regs(origin: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<tandem_schemas::ChangeEvent> {
        seqs.map(|s| reg(origin, EPOCH, s, &format!("i{s}"))).collect()
    }

    #[test]
    fn a_fresh_registration_stages_no_deletes() {
        let dir = TempDir::new().unwrap();
        let mut log = fresh(&dir);
        log.append_local(&regs("dc-a", 1..=50)).unwrap();
        log.apply_remote("dc-b", &regs("dc-b", 1..=50)).unwrap();
        assert_eq!(deletes_in(&log, CF_TOMBSTONES), 0, "no tombstone to delete");
        assert_eq!(deletes_in(&log, CF_META), 0, "no owner record to delete");
        // A stored tombstone is still deleted by the registration that revives its key.
        log.append_local(&[dereg("dc-a", EPOCH, 51, "i1")]).unwrap();
        log.append_local(&[reg("dc-a", EPOCH, 52, "i1")]).unwrap();
        assert_eq!(deletes_in(&log, CF_TOMBSTONES), 1);
        assert_eq!(log.tombstones().unwrap(), vec![]);
        assert!(matches!(log.held(&key("dc-a", "i1")), Held::Live { seq: 52 }));
        // And by a remote one, which knows of the tombstone from the merge's own read.
        log.apply_remote("dc-b", &[dereg("dc-b", EPOCH, 51, "i1")]).unwrap();
        log.apply_remote("dc-b", &[reg("dc-b", EPOCH, 52, "i1")]).unwrap();
        assert_eq!(deletes_in(&log, CF_TOMBSTONES), 2);
        assert_eq!(log.tombstones().unwrap(), vec![]);
        assert!(matches!(log.held(&key("dc-b", "i1")), Held::Live { seq: 52 }));
    }

    #[test]
    fn a_key_tombstoned_and_registered_in_one_batch_keeps_no_tombstone() {
        let dir = TempDir::new().unwrap();
        let mut log = fresh(&dir);
        log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
        log.append_local(&[dereg("dc-a", EPOCH, 2, "i1"), reg("dc-a", EPOCH, 3, "i1")]).unwrap();
        log.apply_remote("dc-b", &[reg("dc-b", EPOCH, 1, "r1")]).unwrap();
        log.apply_remote("dc-b", &[dereg("dc-b", EPOCH, 2, "r1"), reg("dc-b", EPOCH, 3, "r1")]).unwrap();
        assert_eq!(log.tombstones().unwrap(), vec![]);
        assert!(matches!(log.held(&key("dc-a", "i1")), Held::Live { seq: 3 }));
        assert!(matches!(log.held(&key("dc-b", "r1")), Held::Live { seq: 3 }));
        drop(log);
        let log = RocksLog::open(dir.path(), "dc-a").unwrap();
        assert_eq!(log.tombstones().unwrap(), vec![], "nor after a reopen");
    }

    #[test]
    fn an_owner_record_is_removed_by_what_replaces_it() {
        let dir = TempDir::new().unwrap();
        let mut log = fresh(&dir);
        let alice: Arc<str> = Arc::from("alice");
        // An anonymous registration in a later batch, and a deregistration.
        log.append_local_owned(
            &[reg("dc-a", EPOCH, 1, "i1"), reg("dc-a", EPOCH, 2, "i2")],
            &[(1, alice.clone()), (2, alice.clone())],
        )
        .unwrap();
        assert_eq!(log.owners().unwrap().len(), 2);
        log.append_local_owned(&[reg("dc-a", EPOCH, 3, "i1"), dereg("dc-a", EPOCH, 4, "i2")], &[]).unwrap();
        assert_eq!(log.owners().unwrap(), vec![]);
        // An anonymous registration later in the same batch.
        log.append_local_owned(&[reg("dc-a", EPOCH, 5, "i3"), reg("dc-a", EPOCH, 6, "i3")], &[(5, alice)])
            .unwrap();
        assert_eq!(log.owners().unwrap(), vec![]);
    }

    /// A log that holds no owner record skips the read (and the delete) of one, which a
    /// restart must not take for granted: the records a reopened log finds are still
    /// removed by what replaces them.
    #[test]
    fn owner_records_found_at_a_reopen_are_removed_by_what_replaces_them() {
        let dir = TempDir::new().unwrap();
        let mut log = fresh(&dir);
        // With no owner record anywhere, an ownerless registration reads and deletes nothing.
        log.append_local_owned(&regs("dc-a", 1..=3), &[]).unwrap();
        assert_eq!(deletes_in(&log, CF_META), 0);
        let alice: Arc<str> = Arc::from("alice");
        log.append_local_owned(
            &[reg("dc-a", EPOCH, 4, "i4"), reg("dc-a", EPOCH, 5, "i5")],
            &[(4, alice.clone()), (5, alice)],
        )
        .unwrap();
        drop(log);
        let mut log = RocksLog::open(dir.path(), "dc-a").unwrap();
        assert_eq!(log.owners().unwrap().len(), 2);
        // An ownerless registration (ACLs off) and a deregistration, after the reopen.
        log.append_local_owned(&[reg("dc-a", EPOCH, 6, "i4"), dereg("dc-a", EPOCH, 7, "i5")], &[]).unwrap();
        assert_eq!(log.owners().unwrap(), vec![]);
    }
}
