//! Opening the RocksDB of a data dir with the log's options: bounded memtables, one shared
//! block cache, background work at a lower CPU priority, point-in-time WAL recovery, and every
//! column family the dir holds (a newer build's too).

use std::path::Path;

use rocksdb::{ColumnFamilyDescriptor, DBRecoveryMode, Options};
use tandem_replicator::log::LogError;

use super::{storage, Db, BLOCK_CACHE_BYTES};

/// Opens (or creates) the RocksDB of a data dir with the log's options and (at least) the
/// given column families: RocksLog's, or the Raft log store's.
pub(in crate::store) fn open_db(
    dir: &Path,
    column_families: &[&str],
    write_buffer_mib: usize,
    max_open_files: u32,
) -> Result<Db, LogError> {
    let mut opts = Options::default();
    opts.set_max_open_files(i32::try_from(max_open_files.max(16)).unwrap_or(i32::MAX));
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Replay the WAL up to the first torn or corrupt record: a crash mid-write loses
    // only writes that were never acknowledged.
    opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
    opts.set_keep_log_file_num(4);
    // Flushes and compactions run at a lower CPU priority than the request path: on a
    // small machine a compaction must not stall writes and heartbeats for whole
    // scheduler slices (it catches up whenever the node is idle).
    if let Ok(mut env) = rocksdb::Env::new() {
        env.lower_thread_pool_cpu_priority();
        env.lower_high_priority_thread_pool_cpu_priority();
        opts.set_env(&env);
    }
    // One small block cache for every column family: reads are rare (start, catch-up
    // of a peer, tombstone lookups), and RocksDB's default 32 MiB per table factory
    // would only hold memory.
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    // Column families this build does not use (a newer build's) are opened too and left
    // alone: RocksDB refuses to open a database without all of its column families, and a
    // downgrade must not lock the operator out of the data dir.
    let mut names: Vec<String> = column_families.iter().map(|n| (*n).to_owned()).collect();
    if let Ok(existing) = Db::list_cf(&opts, dir) {
        for name in existing {
            if name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME && !names.contains(&name) {
                tracing::info!(column_family = %name, "opening a column family this build does not use");
                names.push(name);
            }
        }
    }
    let cfs = names.into_iter().map(|name| {
        let mut cf = Options::default();
        cf.set_write_buffer_size(write_buffer_mib.clamp(1, 1024) << 20);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&cache);
        cf.set_block_based_table_factory(&table);
        ColumnFamilyDescriptor::new(name, cf)
    });
    Db::open_cf_descriptors(&opts, dir, cfs).map_err(storage)
}
