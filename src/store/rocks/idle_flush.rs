//! Memtables flushed when the log goes quiet. A column family's memtable holds what was
//! written to it since its last flush, up to `[store] write_buffer_mib`, and RocksDB flushes
//! it only when it is full: after a burst of registrations a node that then only serves
//! heartbeats and reads would keep up to that much per column family resident for good,
//! in memory the data dir already holds (the WAL). [`RocksLog::flush_idle_memtables`]
//! flushes, in the background, every memtable holding at least [`IDLE_FLUSH_MIN_BYTES`];
//! the node calls it once a quiet spell of [`IDLE_FLUSH_AFTER`] follows a durable write
//! (`node/idle.rs`), never under load, so flushes still come only from full memtables
//! while writes keep coming. At most one table file per [`IDLE_FLUSH_MIN_BYTES`] written is
//! added this way, and RocksDB compacts them as it does the others.

use std::time::Duration;

use rocksdb::{ColumnFamily, FlushOptions};
use tandem_replicator::log::LogError;

use super::{storage, Db, RocksLog, COLUMN_FAMILIES};

/// A memtable is flushed when the log has had no durable write for this long.
pub const IDLE_FLUSH_AFTER: Duration = Duration::from_secs(1);
/// Memtables smaller than this stay (their flush would add a tiny table file for little).
pub const IDLE_FLUSH_MIN_BYTES: u64 = 512 << 10;

impl RocksLog {
    /// Starts a flush (without waiting for it) of every column family whose memtable holds
    /// at least [`IDLE_FLUSH_MIN_BYTES`]; returns the bytes those memtables held (0: none).
    pub fn flush_idle_memtables(&self) -> Result<u64, LogError> {
        let db = self.db()?;
        let cfs = COLUMN_FAMILIES.iter().map(|name| self.cf(name)).collect::<Result<Vec<_>, _>>()?;
        flush_idle(db, &cfs).map_err(storage)
    }
}

/// Starts a flush (without waiting for it) of those of `cfs` whose active memtable holds at
/// least [`IDLE_FLUSH_MIN_BYTES`]; returns the bytes those memtables held (0: none). Shared
/// by RocksLog and a group's Raft log (`store/raft_log`), which has a RocksDB of its own.
pub(crate) fn flush_idle(db: &Db, cfs: &[&ColumnFamily]) -> Result<u64, rocksdb::Error> {
    let mut due = Vec::new();
    let mut bytes = 0;
    for &cf in cfs {
        let held = db.property_int_value_cf(cf, "rocksdb.cur-size-active-mem-table")?.unwrap_or(0);
        if held >= IDLE_FLUSH_MIN_BYTES {
            due.push(cf);
            bytes += held;
        }
    }
    if due.is_empty() {
        return Ok(0);
    }
    let mut opts = FlushOptions::default();
    opts.set_wait(false);
    db.flush_cfs_opt(&due, &opts)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::time::Instant;

    use tandem_replicator::log::conformance::reg;
    use tandem_replicator::log::EventLog;
    use tempfile::TempDir;

    use super::super::{CF_INSTANCES, CF_LOG};
    use super::*;

    const EPOCH: u64 = (1 << 20) | 3;

    fn memtables(log: &RocksLog) -> u64 {
        let db = log.db().unwrap();
        [CF_LOG, CF_INSTANCES]
            .iter()
            .map(|cf| {
                db.property_int_value_cf(log.cf(cf).unwrap(), "rocksdb.cur-size-all-mem-tables")
                    .unwrap()
                    .unwrap()
            })
            .sum()
    }

    #[test]
    fn a_quiet_log_hands_its_memtables_to_table_files() {
        let dir = TempDir::new().unwrap();
        let mut log =
            RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(EPOCH).unwrap()).unwrap();
        // Below the minimum nothing is flushed.
        log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
        assert_eq!(log.flush_idle_memtables().unwrap(), 0);
        let events: Vec<_> = (2..=6_000).map(|s| reg("dc-a", EPOCH, s, &format!("i{s}"))).collect();
        for chunk in events.chunks(500) {
            log.append_local(chunk).unwrap();
        }
        let held = memtables(&log);
        assert!(held >= 2 * IDLE_FLUSH_MIN_BYTES, "{held} B in the log's and instances' memtables");
        assert!(log.flush_idle_memtables().unwrap() >= 2 * IDLE_FLUSH_MIN_BYTES);
        let deadline = Instant::now() + Duration::from_secs(20);
        while memtables(&log) * 4 > held {
            assert!(Instant::now() < deadline, "the flush did not free the memtables: {} B", memtables(&log));
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(log.flush_idle_memtables().unwrap(), 0, "flushed already");
        // Nothing was lost, and the table files hold it across a reopen.
        drop(log);
        let log = RocksLog::open(dir.path(), "dc-a").unwrap();
        assert_eq!(log.instances().unwrap().len(), 6_000);
        assert_eq!(log.read_own(0, 10_000).unwrap().len(), 6_000);
    }
}
