//! The log's one way to RocksDB's write: a batch written, synced or not, with the staged
//! watch index and applied state riding on a synced one. A synced write is timed by
//! RocksDB's own perf context, switched on for the write's span on the writing thread
//! only: how long the call took, its WAL append with the fsync, and its memtable inserts
//! ([`SyncParts`]; issue 21 asked why a synced write inside the register step takes longer
//! than an isolated probe of the disk).

use std::time::{Duration, Instant};

use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
use rocksdb::{WriteBatch, WriteOptions};
use tandem_replicator::log::LogError;

use super::{raft_state, storage, Db, RocksLog, CF_META, META_INDEX};
use crate::store::commit_log::SyncParts;

impl RocksLog {
    pub(super) fn write(&mut self, mut batch: WriteBatch, sync: bool) -> Result<(), LogError> {
        let index = if sync { self.pending_index } else { None };
        if let Some(idx) = index {
            batch.put_cf(self.cf(CF_META)?, META_INDEX, idx.to_be_bytes());
        }
        if sync {
            if let Some(applied) = self.pending_applied.take() {
                batch.put_cf(self.cf(CF_META)?, raft_state::META_RAFT_APPLIED, applied);
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        let db = self.db()?;
        let written = if sync {
            let (written, parts) = write_timed(db, batch, &opts);
            self.last_sync = Some(parts);
            written
        } else {
            db.write_opt(batch, &opts)
        };
        if let Err(e) = written {
            self.poisoned = true;
            tracing::error!(dir = %self.dir.display(), error = %e, "event log write failed; refusing writes until recovered");
            return Err(storage(e));
        }
        if sync {
            self.sync_writes += 1;
        }
        if let Some(idx) = index {
            self.index = idx;
            self.pending_index = None;
        }
        Ok(())
    }

    /// Where the last synced write's time went inside RocksDB; `None` before the first.
    pub fn last_sync_parts(&self) -> Option<SyncParts> {
        self.last_sync
    }
}

/// RocksDB's perf level that times every step of the write path (`kEnableTimeExceptForMutex`,
/// 4 since RocksDB 9 added `kEnableWait` at 3). The `rocksdb` crate's enum predates
/// `kEnableWait`, so from 3 on its names are one level off: its `EnableTimeExceptForMutex`
/// is RocksDB's `kEnableWait`, which times the memtable inserts but not the WAL append and
/// its fsync. Its next name is the level meant here (checked by the test below: the WAL
/// part must be timed).
const TIMED: PerfStatsLevel = PerfStatsLevel::EnableTimeAndCPUTimeExceptForMutex;

/// One write with RocksDB's perf context timing it (its level is per thread: set for this
/// write, off again after it, so nothing else the thread does pays for the clock reads).
fn write_timed(db: &Db, batch: WriteBatch, opts: &WriteOptions) -> (Result<(), rocksdb::Error>, SyncParts) {
    let mut perf = PerfContext::default();
    perf.reset();
    set_perf_stats(TIMED);
    let began = Instant::now();
    let written = db.write_opt(batch, opts);
    let call = began.elapsed();
    set_perf_stats(PerfStatsLevel::Disable);
    let parts = SyncParts {
        call,
        wal: Duration::from_nanos(perf.metric(PerfMetric::WriteWalTime)),
        memtable: Duration::from_nanos(perf.metric(PerfMetric::WriteMemtableTime)),
    };
    (written, parts)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use tandem_replicator::log::conformance::reg;
    use tandem_replicator::log::EventLog;
    use tempfile::TempDir;

    use super::*;

    const EPOCH: u64 = (1 << 20) | 3;

    #[test]
    fn a_synced_write_is_split_into_its_wal_and_memtable_parts_and_the_perf_level_is_off_after() {
        let dir = TempDir::new().unwrap();
        let mut log =
            RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(EPOCH).unwrap()).unwrap();
        let events: Vec<_> = (1..=64).map(|seq| reg("dc-a", EPOCH, seq, &format!("i{seq}"))).collect();
        log.append_local(&events).unwrap();
        let parts = log.last_sync_parts().expect("a synced write was timed");
        assert!(parts.wal > Duration::ZERO, "the WAL append and its fsync were timed: {parts:?}");
        assert!(parts.memtable > Duration::ZERO, "64 registrations' inserts were timed: {parts:?}");
        assert!(parts.wal + parts.memtable <= parts.call, "both parts lie inside the call: {parts:?}");
        // The level was the write's only: a read after it on this thread is not timed.
        let mut perf = PerfContext::default();
        perf.reset();
        log.db().unwrap().get_cf(log.cf(CF_META).unwrap(), META_INDEX).unwrap();
        assert_eq!(perf.metric(PerfMetric::GetFromMemtableTime), 0, "perf timing left on after the write");
    }
}
