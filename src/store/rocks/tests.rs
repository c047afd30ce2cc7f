//! Corruption: stored bytes that do not decode, or decode to something other than what
//! their key says, are `LogError::Corrupt` and never a panic.

use super::*;
use proptest::prelude::*;
use tandem_replicator::log::conformance::{dereg, key, reg};
use tandem_schemas::Snapshot;
use tempfile::TempDir;

const EPOCH: u64 = 3;

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
        ("missing own seq", |log| log.db().unwrap().delete_cf(log.cf(CF_META).unwrap(), META_OWN_SEQ).unwrap()),
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
