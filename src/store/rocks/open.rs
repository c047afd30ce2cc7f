//! Opening the RocksDB of a data dir with the log's options: bounded memtables, a bounded
//! WAL, one shared block cache, background work at a lower CPU priority, point-in-time WAL
//! recovery, and every column family the dir holds (a newer build's too).

use std::path::Path;

use rocksdb::{ColumnFamilyDescriptor, DBRecoveryMode, Options};
use tandem_replicator::log::LogError;

use super::{storage, Db, BLOCK_CACHE_BYTES};

/// The WAL files a RocksDB keeps are bounded at this many memtables of its column families
/// (64 MiB for the event log at the default `[store] write_buffer_mib` of 8, 128 MiB for a
/// member's Raft log). A WAL file can go only once every column family has flushed what it
/// holds of it, so one written rarely (the tombstones', which only a deregistration, an
/// expiry or a replicated tombstone writes; the Raft log's vote and purge mark) would keep
/// every WAL since its last write, up to RocksDB's own budget: four times every column
/// family's memtables, 768 MiB for the event log with the defaults. A full memtable's
/// flush flushes them all (`atomic_flush`, set in `open_db`), so under load no column
/// family keeps WAL files past the next one; this bound holds when the writes fill no
/// memtable (and the idle flush leaves small ones). Past it RocksDB flushes the column
/// families that hold the oldest WAL file, so a start replays at most about this much.
pub const WAL_MAX_WRITE_BUFFERS: u64 = 8;

/// WAL files RocksDB keeps, once obsolete, to write the next WALs over
/// (`recycle_log_file_num`).
///
/// A synced write that appends to a file makes the filesystem write the file's metadata
/// too (its new size, its newly allocated blocks) and wait for it: two writes to the disk
/// per fsync. One that overwrites blocks already written makes one. A recycled WAL file
/// keeps its blocks, and the size its last life wrote (RocksDB cuts a WAL file to that
/// when it closes it), so the WAL's synced writes are overwrites until the new WAL
/// outgrows the old one. RocksDB recycles a WAL file only once it is obsolete, and a
/// start begins with fresh ones, so [`open_db`] writes WAL files full (two, at most
/// [`WAL_PREFILL_ROUNDS`]; see [`wal_prefill_mib`]) and lets them go before the log's
/// first write. Under load the WAL goes round these files only because every flush
/// flushes every column family (`atomic_flush`, see [`open_db`]).
pub const WAL_RECYCLED_FILES: usize = 2;

/// The most rounds [`open_db`] writes a WAL file full and switches to the next one: the
/// second round's switch is the first that can reuse a file (the first round's), and a
/// round whose file RocksDB did not set aside in time (it does so after the flush returns)
/// is made again.
pub const WAL_PREFILL_ROUNDS: usize = 4;

/// The most MiB [`open_db`] writes into each WAL file it prefills.
pub const WAL_PREFILL_MAX_MIB: usize = 16;

/// MiB written into each prefilled WAL file: two memtables of a column family, at most
/// [`WAL_PREFILL_MAX_MIB`] (16 MiB for the event log at the default `[store]
/// write_buffer_mib` of 8, and for a member's Raft log). A WAL file is switched when the
/// first column family's memtable is full, and holds the others' writes too by then: 12.8
/// to 13.5 MB with 8 MiB memtables in the `register` benchmark, where a registration
/// writes its event and its instance record. One memtable's worth left the first two WAL
/// files appending their last third (into the step at half of saturation). A start's
/// first WAL writes overwrite this much; after, a WAL file is reused at the size its last
/// life wrote.
pub fn wal_prefill_mib(write_buffer_mib: usize) -> usize {
    (2 * write_buffer_mib).clamp(1, WAL_PREFILL_MAX_MIB)
}

/// A start prefills its WAL files only when the data dir's filesystem has at least this
/// many MiB available (`statvfs`); below it the node starts without (its WAL appends as
/// before) and logs why. A reopen after a failed write never prefills: the failure may be
/// a full disk, and the space a recovery finds is for the log.
pub const WAL_PREFILL_MIN_FREE_MIB: u64 = 1024;

/// Whether a start prefills its WAL files, given the bytes available on the data dir's
/// filesystem (`None`: not known, so not).
pub fn wal_prefill_fits(available_bytes: Option<u64>) -> bool {
    available_bytes.is_some_and(|bytes| bytes >= WAL_PREFILL_MIN_FREE_MIB << 20)
}

/// What [`open_db`] does about the WAL files it will write over (see [`WAL_RECYCLED_FILES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::store) enum Prefill {
    /// A start: prefill them when the disk has room ([`wal_prefill_fits`]).
    AtStart,
    /// A reopen after a failed write: do not.
    Never,
}

/// The column family that holds the prefill's writes while [`open_db`] runs (dropped
/// before it returns; a start after a crash in between drops it then).
pub(super) const PREFILL_CF: &str = "wal-prefill";

/// The WAL files (`NNNNNN.log`) in the RocksDB at `dir`: each one's number and bytes.
pub(super) fn wal_file_sizes(dir: &Path) -> impl Iterator<Item = (u64, u64)> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| {
        let name = e.file_name();
        let stem = name.to_str()?.strip_suffix(".log")?;
        if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((stem.parse().ok()?, e.metadata().ok()?.len()))
    })
}

/// Bytes and count of the WAL files (`NNNNNN.log`) in the RocksDB at `dir`.
pub fn wal_files(dir: &Path) -> (u64, usize) {
    wal_file_sizes(dir).fold((0, 0), |(bytes, files), (_, len)| (bytes + len, files + 1))
}

/// Opens (or creates) the RocksDB of a data dir with the log's options and (at least) the
/// given column families: RocksLog's, or the Raft log store's.
pub(in crate::store) fn open_db(
    dir: &Path,
    column_families: &[&str],
    write_buffer_mib: usize,
    max_open_files: u32,
    prefill: Prefill,
) -> Result<Db, LogError> {
    let mut opts = Options::default();
    opts.set_max_open_files(i32::try_from(max_open_files.max(16)).unwrap_or(i32::MAX));
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Replay the WAL up to the first torn or corrupt record: a crash mid-write loses
    // only writes that were never acknowledged.
    opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
    opts.set_keep_log_file_num(4);
    opts.set_recycle_log_file_num(WAL_RECYCLED_FILES);
    // Every flush flushes every column family that holds writes. Each flush starts a new
    // WAL file, and a WAL file is obsolete (so can be reused) only once every column family
    // has flushed what it holds of it. Flushed one by one, as their memtables filled at their
    // own rates, the log's column families started a WAL file at each flush while the
    // others still held the older ones: in a `register` benchmark most WAL files were new,
    // or cut short, and every synced write of the step at half of saturation appended (the
    // filesystem wrote the file's inode with each). Flushed together, the WAL files come
    // free at each flush and the WAL goes round the ones it keeps.
    opts.set_atomic_flush(true);
    let write_buffer = write_buffer_mib.clamp(1, 1024) << 20;
    opts.set_max_total_wal_size(WAL_MAX_WRITE_BUFFERS * write_buffer as u64);
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
                if name != PREFILL_CF {
                    tracing::info!(column_family = %name, "opening a column family this build does not use");
                }
                names.push(name);
            }
        }
    }
    let cfs = names.into_iter().map(|name| {
        let mut cf = Options::default();
        cf.set_write_buffer_size(write_buffer);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&cache);
        cf.set_block_based_table_factory(&table);
        ColumnFamilyDescriptor::new(name, cf)
    });
    let mut db = Db::open_cf_descriptors(&opts, dir, cfs).map_err(storage)?;
    let room = prefill == Prefill::AtStart && {
        let available = available_bytes(dir);
        let fits = wal_prefill_fits(available);
        if !fits {
            tracing::info!(
                dir = %dir.display(),
                available_mib = available.map(|b| b >> 20),
                needed_mib = WAL_PREFILL_MIN_FREE_MIB,
                "WAL files not prefilled: too little space on the data dir's filesystem (the WAL appends)"
            );
        }
        fits
    };
    if room {
        let started = std::time::Instant::now();
        let mib = wal_prefill_mib(write_buffer_mib);
        let rounds = prefill_wal(&mut db, dir, mib)?;
        tracing::debug!(rounds, mib, took_ms = started.elapsed().as_millis() as u64, "WAL files prefilled");
    } else if db.cf_handle(PREFILL_CF).is_some() {
        // A prefill a crash cut short leaves its column family, and its writes in the WAL.
        db.drop_cf(PREFILL_CF).map_err(storage)?;
    }
    Ok(db)
}

/// The bytes an unprivileged writer may still put on the filesystem of `dir` (`statvfs`'s
/// available blocks), or `None` when it cannot be read.
pub fn available_bytes(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Writes WAL files full and lets them go, until the live WAL is one RocksDB reused (see
/// [`WAL_RECYCLED_FILES`]): each round puts `mib` MiB into [`PREFILL_CF`] and deletes it,
/// syncs the WAL and flushes the column family, which switches to the next WAL file (the
/// flush writes a tombstone only). Nothing else is written meanwhile, so the file is
/// obsolete once the flush is done. Answers how many rounds it made.
fn prefill_wal(db: &mut Db, dir: &Path, mib: usize) -> Result<usize, LogError> {
    if db.cf_handle(PREFILL_CF).is_none() {
        let mut cf = Options::default();
        cf.set_write_buffer_size((mib + 4) << 20);
        db.create_cf(PREFILL_CF, &cf).map_err(storage)?;
    }
    let value = vec![0u8; 1 << 20];
    let mut rounds = 0;
    while rounds < WAL_PREFILL_ROUNDS && (rounds < 2 || live_wal_bytes(dir) < (mib as u64) << 20) {
        let cf =
            db.cf_handle(PREFILL_CF).ok_or_else(|| LogError::Storage("no prefill column family".into()))?;
        for _ in 0..mib {
            db.put_cf(cf, b"fill", &value).map_err(storage)?;
        }
        db.delete_cf(cf, b"fill").map_err(storage)?;
        db.flush_wal(true).map_err(storage)?;
        db.flush_cf(cf).map_err(storage)?;
        rounds += 1;
    }
    db.drop_cf(PREFILL_CF).map_err(storage)?;
    Ok(rounds)
}

/// The size of the newest WAL file (`NNNNNN.log`, the highest number) in `dir`: a reused
/// file keeps the size its last life wrote.
pub(super) fn live_wal_bytes(dir: &Path) -> u64 {
    wal_file_sizes(dir).max().map_or(0, |(_, bytes)| bytes)
}
