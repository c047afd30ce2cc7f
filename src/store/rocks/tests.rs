//! Corruption: stored bytes that do not decode, or decode to something other than what
//! their key says, are `LogError::Corrupt` and never a panic.

use super::*;
use proptest::prelude::*;
use rocksdb::Options;
use tandem_replicator::log::conformance::{dereg, key, reg};
use tandem_schemas::Snapshot;
use tempfile::TempDir;

/// A settled epoch (generation 1): these logs act as an established DC, which never re-epochs
/// at its first handshake (`tandem_replicator::epoch`).
const EPOCH: u64 = (1 << 20) | 3;

fn fresh(dir: &TempDir) -> RocksLog {
    RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(EPOCH).unwrap()).unwrap()
}

fn poke(log: &RocksLog, cf: &str, k: &[u8], v: &[u8]) {
    log.db().unwrap().put_cf(log.cf(cf).unwrap(), k, v).unwrap();
}

fn is_corrupt<T: fmt::Debug>(r: Result<T, LogError>) -> bool {
    matches!(r, Err(LogError::Corrupt(_)))
}

#[test]
fn a_corrupt_instance_value_is_reported_not_panicked_on() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
    poke(
        &log,
        CF_INSTANCES,
        &encode_key(&key("dc-a", "i1")),
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    );
    assert!(is_corrupt(log.instances()));
    assert!(is_corrupt(log.try_held(&key("dc-a", "i1"))));
    assert!(is_corrupt(log.snapshot_own()));
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Absent);
    // Survives a reopen the same way.
    drop(log);
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert!(is_corrupt(log.instances()));
}

#[test]
fn a_record_under_another_key_is_corrupt() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
    let record = tandem_replicator::log::conformance::record("dc-a", "i1");
    poke(&log, CF_INSTANCES, &encode_key(&key("dc-a", "i2")), &tandem_schemas::encode(&(1u64, &record)));
    assert!(is_corrupt(log.instances()));
    assert!(is_corrupt(log.try_held(&key("dc-a", "i2"))));
    poke(&log, CF_INSTANCES, b"not a key", &tandem_schemas::encode(&(1u64, &record)));
    assert!(is_corrupt(log.instances()));
}

#[test]
fn corrupt_tombstones_are_reported() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1"), dereg("dc-a", EPOCH, 2, "i1")]).unwrap();
    poke(&log, CF_TOMBSTONES, &encode_key(&key("dc-a", "i1")), b"\x01\x09");
    assert!(is_corrupt(log.tombstones()));
    assert!(is_corrupt(log.try_held(&key("dc-a", "i1"))));
    assert!(is_corrupt(log.purge_own(2)));
    assert_eq!(log.purge_floor(), 0, "a failed purge changes nothing");
    poke(&log, CF_TOMBSTONES, b"\x00\x07", &tandem_schemas::encode(&(2u64, DeregisterReason::Explicit)));
    assert!(is_corrupt(log.tombstones()));
}

#[test]
fn corrupt_log_entries_are_reported() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[
        reg("dc-a", EPOCH, 1, "i1"),
        reg("dc-a", EPOCH, 2, "i2"),
        reg("dc-a", EPOCH, 3, "i3"),
    ])
    .unwrap();
    poke(&log, CF_LOG, &seq_key(1), b"\x00");
    assert!(is_corrupt(log.read_own(0, 10)));
    assert!(is_corrupt(log.own_event_time_ms(1)));
    assert_eq!(log.read_own(1, 10).unwrap().len(), 2);
    // An event stored under another seq.
    poke(&log, CF_LOG, &seq_key(2), &tandem_schemas::encode_event(&reg("dc-a", EPOCH, 3, "i3")));
    assert!(is_corrupt(log.read_own(1, 10)));
    // A hole in the log.
    log.db().unwrap().delete_cf(log.cf(CF_LOG).unwrap(), seq_key(2)).unwrap();
    assert!(is_corrupt(log.read_own(1, 10)));
}

#[test]
fn remote_apply_over_corrupt_state_fails_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.apply_remote("dc-b", &[reg("dc-b", 9, 1, "r1")]).unwrap();
    poke(&log, CF_INSTANCES, &encode_key(&key("dc-b", "r1")), b"\x05");
    let syncs = log.sync_writes();
    assert!(is_corrupt(log.apply_remote("dc-b", &[dereg("dc-b", 9, 2, "r1")])));
    assert_eq!(log.mark_of("dc-b"), Some(Mark { epoch: 9, seq: 1 }));
    assert_eq!(log.sync_writes(), syncs);
    // A snapshot of the origin replaces its state wholesale, the corrupt record too.
    let empty = Snapshot {
        origin_dc: "dc-b".into(),
        mark: Mark { epoch: 9, seq: 5 },
        instances: vec![],
        tombstones: vec![],
    };
    log.install_snapshot("dc-b", &empty).unwrap();
    assert_eq!(log.instances().unwrap(), vec![]);
    assert_eq!(log.held(&key("dc-b", "r1")), Held::Absent);
}

#[test]
fn corrupt_or_inconsistent_meta_refuses_to_open() {
    type Damage = fn(&RocksLog);
    let cases: [(&str, Damage); 5] = [
        ("short epoch", |log| poke(log, CF_META, META_EPOCH, b"\x01\x02")),
        ("zero epoch", |log| poke(log, CF_META, META_EPOCH, &0u64.to_be_bytes())),
        ("missing own seq", |log| {
            log.db().unwrap().delete_cf(log.cf(CF_META).unwrap(), META_OWN_SEQ).unwrap()
        }),
        ("log past own seq", |log| {
            poke(log, CF_LOG, &seq_key(9), &tandem_schemas::encode_event(&reg("dc-a", EPOCH, 9, "x")))
        }),
        ("bad mark", |log| poke(log, CF_META, b"mark/dc-b", b"\x01")),
    ];
    for (what, damage) in cases {
        let dir = TempDir::new().unwrap();
        let mut log = fresh(&dir);
        log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
        damage(&log);
        drop(log);
        let err = RocksLog::open(dir.path(), "dc-a").unwrap_err();
        assert!(matches!(err, OpenError::Log(LogError::Corrupt(_))), "{what}: {err}");
    }
}

#[test]
fn data_without_an_identity_is_not_mistaken_for_a_new_log() {
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
    log.db().unwrap().delete_cf(log.cf(CF_META).unwrap(), META_DC).unwrap();
    drop(log);
    let err = RocksLog::open(dir.path(), "dc-a").unwrap_err();
    assert!(matches!(err, OpenError::Log(LogError::Corrupt(_))), "{err}");
}

proptest! {
    #[test]
    fn decoding_arbitrary_stored_values_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_instance(&bytes);
        let _ = decode_tombstone(&bytes);
        let _ = decode_mark("m", &bytes);
    }
}

/// Stores own event 3, an update of `i2` that breaks today's limits, as an older version
/// or a bug could have: the log entry, the record and the own seq.
fn store_poison(dir: &TempDir) -> RocksLog {
    let mut log = fresh(dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1"), reg("dc-a", EPOCH, 2, "i2")]).unwrap();
    let mut bad = tandem_replicator::log::conformance::record("dc-a", "i2");
    bad.weight = u32::MAX;
    let ev = tandem_replicator::log::conformance::ev("dc-a", EPOCH, 3, Op::Update(bad.clone()));
    poke(&log, CF_LOG, &seq_key(3), &tandem_schemas::encode_event(&ev));
    poke(&log, CF_INSTANCES, &encode_key(&bad.key), &tandem_schemas::encode(&(3u64, &bad)));
    poke(&log, CF_META, META_OWN_SEQ, &3u64.to_be_bytes());
    drop(log);
    RocksLog::open(dir.path(), "dc-a").unwrap()
}

#[test]
fn an_invalid_stored_record_is_skipped_by_reads_and_counted() {
    // Issue 12 §4: records read back are validated, not only decoded.
    let dir = TempDir::new().unwrap();
    let log = store_poison(&dir);
    assert_eq!(log.own_mark().seq, 3);
    assert!(matches!(log.read_own(0, 10), Err(LogError::Invalid(_))), "{:?}", log.read_own(0, 10));
    assert_eq!(log.read_own(0, 2).unwrap().len(), 2, "the entries before it read as usual");
    let ids =
        |v: Vec<InstanceRecord>| v.into_iter().map(|r| r.key.instance_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(log.instances().unwrap().into_iter().map(|(_, r)| r).collect()), ["i1"]);
    let snap = log.snapshot_own().unwrap();
    assert_eq!(ids(snap.instances.into_iter().map(|i| i.record).collect()), ["i1"]);
    assert_eq!(snap.mark.seq, 3);
    let invalid = log.invalid_records();
    assert_eq!(invalid.count(), 3);
    assert!(invalid.last().is_some_and(|l| l.contains("i2") && l.contains("weight")), "{:?}", invalid.last());
}

#[test]
fn a_poison_event_does_not_stall_the_stream() {
    // The sender meets the invalid event and sends a snapshot in its place, which a peer
    // accepts (it passes the wire's validation); the peer ends at the origin's mark.
    use tandem_replicator::log::MemLog;
    use tandem_replicator::protocol::{Receiver, ReceiverAction, Sender, SenderEvent, StreamTuning};
    use tandem_schemas::Frame;
    let dir = TempDir::new().unwrap();
    let log = store_poison(&dir);
    let mut peer = MemLog::new("dc-b", 9);
    let (mut sender, hello) = Sender::new(&log, "dc-b", StreamTuning::default(), 0);
    let mut receiver = Receiver::new("dc-b", "dc-a");
    let mut to_receiver = vec![hello];
    let mut unreadable = 0;
    for _ in 0..10 {
        let mut to_sender = Vec::new();
        for frame in to_receiver.drain(..) {
            // Through the wire's codec, which validates what it decodes.
            let frame = tandem_schemas::decode_frame(&tandem_schemas::encode_frame(&frame), FRAME_BYTES_MAX)
                .expect("a frame the peer accepts");
            for action in
                receiver.handle_frame(peer.mark_of("dc-a"), peer.mark_event_id("dc-a"), frame).unwrap()
            {
                match action {
                    ReceiverAction::Send(f) => to_sender.push(f),
                    ReceiverAction::Apply { batch_id, events } => {
                        let report = peer.apply_remote("dc-a", &events).unwrap();
                        to_sender.push(receiver.applied(batch_id, &report).unwrap());
                    }
                    ReceiverAction::Install { batch_id, snapshot } => {
                        let report = peer.install_snapshot("dc-a", &snapshot).unwrap();
                        to_sender.push(receiver.applied(batch_id, &report).unwrap());
                    }
                    _ => {}
                }
            }
        }
        for f in to_sender {
            sender.handle_frame(&log, f).unwrap();
        }
        while let Some((frame, events)) = sender.poll_transmit(&log, 0).unwrap() {
            unreadable += events.iter().filter(|e| matches!(e, SenderEvent::LogUnreadable { .. })).count();
            to_receiver.push(frame);
            if matches!(to_receiver.last(), Some(Frame::Ping { .. })) {
                break;
            }
        }
        // The snapshot is read from its cut, off the log (as the gateway does).
        while let Some((frame, events)) = sender.poll_snapshot().unwrap() {
            unreadable += events.iter().filter(|e| matches!(e, SenderEvent::LogUnreadable { .. })).count();
            to_receiver.push(frame);
        }
    }
    assert_eq!(peer.mark_of("dc-a").map(|m| m.seq), Some(3), "the stream moved past the poison event");
    assert_eq!(unreadable, 1);
    let held: Vec<String> =
        peer.instances().unwrap().into_iter().map(|(_, r)| r.key.instance_id.to_string()).collect();
    assert_eq!(held, ["i1"]);
}

#[test]
fn a_data_dir_with_a_column_family_of_a_newer_build_still_opens() {
    // A downgrade: a newer build added a column family. RocksDB refuses to open a database
    // without all of its column families, so the log opens every one it finds.
    let dir = TempDir::new().unwrap();
    let mut log = fresh(&dir);
    log.append_local(&[reg("dc-a", EPOCH, 1, "i1")]).unwrap();
    drop(log);
    let mut opts = Options::default();
    opts.create_missing_column_families(true);
    let mut db = Db::open_cf(&opts, dir.path(), COLUMN_FAMILIES).unwrap();
    db.create_cf("from-the-future", &Options::default()).unwrap();
    drop(db);
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert_eq!(log.own_mark(), Mark { epoch: EPOCH, seq: 1 });
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Live { seq: 1 });
}

#[test]
fn a_fresh_log_writes_its_wal_over_a_file_it_prefilled_and_reads_it_back_after_a_restart() {
    // The log's first synced writes go to a WAL file RocksDB reused (its blocks written,
    // its size kept: the writes overwrite, and the fsync seldom writes metadata), and a start
    // replays such a file up to its last record of this life, not into the old records
    // beyond.
    let dir = TempDir::new().unwrap();
    if !prefill_has_room(&dir) {
        return;
    }
    let mib = super::open::wal_prefill_mib(1);
    let mut log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    let live = super::open::live_wal_bytes(dir.path());
    assert!(live >= (mib as u64) << 20, "the live WAL file holds {live} B: not a prefilled one");
    let epoch = log.own_mark().epoch;
    log.append_local(&[
        reg("dc-a", epoch, 1, "i1"),
        reg("dc-a", epoch, 2, "i2"),
        dereg("dc-a", epoch, 3, "i1"),
    ])
    .unwrap();
    drop(log);
    assert_no_prefill_column_family(dir.path());
    let log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    assert_eq!(log.own_mark(), Mark { epoch, seq: 3 });
    assert_eq!(log.held(&key("dc-a", "i2")), Held::Live { seq: 2 });
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Tombstone { seq: 3 });
}

#[test]
fn a_reopen_after_a_failed_write_does_not_prefill_and_a_start_prefills_only_with_room() {
    // The recovery from a failed write (a full disk, say) reopens the database: the space
    // it finds is for the log, not for WAL files written full.
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    let epoch = log.own_mark().epoch;
    log.append_local(&[reg("dc-a", epoch, 1, "i1")]).unwrap();
    log.recover().unwrap();
    let live = super::open::live_wal_bytes(dir.path());
    assert!(live < 1 << 20, "the reopen wrote a WAL file of {live} B: a prefill");
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Live { seq: 1 });
    // A start prefills only on a filesystem with the room named for it.
    let available = super::open::available_bytes(dir.path());
    assert!(available.is_some_and(|b| b > 0), "statvfs of the data dir: {available:?}");
    let min = super::open::WAL_PREFILL_MIN_FREE_MIB << 20;
    assert!(super::open::wal_prefill_fits(Some(min)));
    assert!(!super::open::wal_prefill_fits(Some(min - 1)));
    assert!(!super::open::wal_prefill_fits(None));
}

#[test]
fn a_start_after_a_crash_inside_the_prefill_drops_its_column_family_and_keeps_the_log() {
    // A node killed while `open_db` prefilled its WAL leaves the scratch column family, with
    // unflushed writes in the WAL. The next start replays them, prefills again, drops the
    // column family and serves the log as it was.
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    let epoch = log.own_mark().epoch;
    log.append_local(&[reg("dc-a", epoch, 1, "i1"), reg("dc-a", epoch, 2, "i2")]).unwrap();
    drop(log);
    let mut opts = Options::default();
    opts.create_missing_column_families(true);
    let mut db = Db::open_cf(&opts, dir.path(), COLUMN_FAMILIES).unwrap();
    db.create_cf(super::open::PREFILL_CF, &Options::default()).unwrap();
    let cf = db.cf_handle(super::open::PREFILL_CF).unwrap();
    db.put_cf(cf, b"fill", vec![0u8; 1 << 20]).unwrap();
    db.flush_wal(true).unwrap();
    drop(db);
    let log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    assert_eq!(log.own_mark(), Mark { epoch, seq: 2 });
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Live { seq: 1 });
    assert_eq!(log.instances().unwrap().len(), 2);
    drop(log);
    assert_no_prefill_column_family(dir.path());
}

#[test]
fn a_rarely_written_column_family_does_not_keep_every_wal_file() {
    // One deregistration is the tombstones' only write: its memtable holds the WAL file it
    // went to until a flush, so without a WAL bound every WAL file since would be kept (up
    // to RocksDB's own budget, four times every memtable) and replayed by the next start.
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    let epoch = log.own_mark().epoch;
    log.append_local(&[reg("dc-a", epoch, 1, "gone"), dereg("dc-a", epoch, 2, "gone")]).unwrap();
    let bound = WAL_MAX_WRITE_BUFFERS << 20;
    // About 1 KiB of WAL per registration (its event and its instance record, padded).
    let events = 4 * bound / 1024;
    let mut seq = 2;
    while seq < events + 2 {
        let chunk = padded_registrations(epoch, seq + 1..=(seq + 500).min(events + 2));
        seq += chunk.len() as u64;
        log.append_local(&chunk).unwrap();
    }
    // The flushes the bound started run in RocksDB's background; their WAL files go after.
    // Files RocksDB keeps to write over (numbered below the oldest it must keep) are not
    // replayed by a start, so they are not under the bound. RocksDB checks the bound
    // against the bytes it wrote, at a write: the files may hold one memtable more (the
    // writes since the last check; a reused file's tail from its earlier life).
    let bound = bound + (1 << 20);
    let live_wal = || {
        let db = log.db.as_ref().unwrap();
        let keep = db.property_int_value("rocksdb.min-log-number-to-keep").unwrap().unwrap();
        super::open::wal_file_sizes(dir.path())
            .filter(|(number, _)| *number >= keep)
            .fold((0, 0), |(bytes, files), (_, len)| (bytes + len, files + 1))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while live_wal().0 > bound {
        let (bytes, files) = live_wal();
        assert!(
            std::time::Instant::now() < deadline,
            "{bytes} B of WAL in {files} files kept after {events} registrations, past the bound of {bound} B"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(log);
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert_eq!(log.instances().unwrap().len() as u64, events);
    assert_eq!(log.tombstones().unwrap().len(), 1);
}

#[test]
fn under_load_the_wal_goes_round_the_files_it_keeps_and_makes_no_new_ones() {
    // A WAL file is reused only once every column family has flushed what it holds of it.
    // The log's column families fill their memtables at different rates: flushed one by
    // one, each flush started a WAL file while the others still held the older ones, so
    // most WAL files were new and every synced write appended (the filesystem then writes
    // the file's inode with it). See `open_db`'s `atomic_flush`.
    let dir = TempDir::new().unwrap();
    if !prefill_has_room(&dir) {
        return;
    }
    let mut log = RocksLog::open_with_write_buffer(dir.path(), "dc-a", 1).unwrap();
    let epoch = log.own_mark().epoch;
    // Each WAL file present: its number and its inode (a reused file keeps its inode).
    let wal_inodes = || -> std::collections::BTreeSet<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        super::open::wal_file_sizes(dir.path())
            .filter_map(|(n, _)| {
                Some((n, std::fs::metadata(dir.path().join(format!("{n:06}.log"))).ok()?.ino()))
            })
            .collect()
    };
    let mut seen = wal_inodes();
    let inodes = |seen: &std::collections::BTreeSet<(u64, u64)>| {
        seen.iter().map(|(_, ino)| *ino).collect::<std::collections::BTreeSet<_>>().len()
    };
    let at_start = inodes(&seen);
    let first = seen.iter().map(|(n, _)| *n).max().unwrap_or(0);
    // About 1 KiB of WAL per registration: 16 MiB, a dozen WAL files' worth at 1 MiB
    // memtables.
    let events = 16 * 1024;
    let mut seq = 0;
    while seq < events {
        let chunk = padded_registrations(epoch, seq + 1..=(seq + 250).min(events));
        seq += chunk.len() as u64;
        log.append_local(&chunk).unwrap();
        // The flushes the writes started are done before the next chunk (a flush that lags
        // on a loaded machine would otherwise make a new file too).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while COLUMN_FAMILIES.iter().any(|name| {
            let db = log.db().unwrap();
            db.property_int_value_cf(log.cf(name).unwrap(), "rocksdb.num-immutable-mem-table").unwrap()
                != Some(0)
        }) {
            assert!(std::time::Instant::now() < deadline, "the memtables were not flushed in 20 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        seen.extend(wal_inodes());
    }
    let new = inodes(&seen) - at_start;
    let wals = seen.iter().filter(|(n, _)| *n > first).count();
    eprintln!("WAL files at the start {at_start}; while {events} registrations were written: {wals} WALs, {new} of them in new files");
    assert!(wals >= 6, "only {wals} WALs for {events} registrations: the test wrote too little");
    assert_eq!(
        new, 0,
        "{new} new WAL files for {events} registrations: the WAL does not go round the kept ones"
    );
}

/// Whether a start in `dir` prefills its WAL (prints why a test is skipped when not).
fn prefill_has_room(dir: &TempDir) -> bool {
    let room = super::open::wal_prefill_fits(super::open::available_bytes(dir.path()));
    if !room {
        eprintln!("SKIPPED: the temp dir's filesystem has too little room for a start to prefill its WAL");
    }
    room
}

/// Registrations of `dc-a` at `seqs`, each padded to about 1 KiB of WAL (its event and its
/// instance record).
fn padded_registrations(epoch: u64, seqs: std::ops::RangeInclusive<u64>) -> Vec<tandem_schemas::ChangeEvent> {
    seqs.map(|s| {
        let mut ev = reg("dc-a", epoch, s, &format!("i{s}"));
        if let tandem_schemas::Op::Register(r) = &mut ev.op {
            r.metadata.insert("pad".into(), "x".repeat(400));
        }
        ev
    })
    .collect()
}

/// The prefill's scratch column family is gone from the RocksDB at `dir`.
fn assert_no_prefill_column_family(dir: &std::path::Path) {
    let names = Db::list_cf(&Options::default(), dir).unwrap();
    assert!(
        !names.iter().any(|n| n == super::open::PREFILL_CF),
        "the prefill's column family stays: {names:?}"
    );
}
