//! Tests of [`RaftLogStore`]: openraft's storage conformance suite against RocksDB in a
//! tempdir (with [`CountingStateMachine`]), what survives a reopen, the synced writes per
//! append, the entry limit, and stored values that fail their checks.

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError, Vote};
use tempfile::TempDir;

use super::*;
use crate::cluster::{CountingStateMachine, Round};

struct Builder;

impl StoreBuilder<TypeConfig, RaftLogStore, CountingStateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, RaftLogStore, CountingStateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RaftLogStore::open(dir.path()).expect("open the raft log");
        Ok((dir, store, CountingStateMachine::default()))
    }
}

/// The proof that the store keeps openraft's contract: every check of the suite, each on a
/// fresh RocksDB.
#[test]
fn openraft_storage_suite_passes_on_rocksdb() {
    Suite::test_all(Builder).unwrap();
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn round_entry(term: u64, index: u64, writes: usize, bytes: usize) -> RaftEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Round::new(vec![vec![7u8; bytes]; writes])),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

#[test]
fn entries_vote_and_purge_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        let vote = Vote::new_committed(3, 2);
        store.save_vote(&vote).await.unwrap();
        store.blocking_append((1..=10).map(|i| round_entry(3, i, 41, 200))).await.unwrap();
        store.save_committed(Some(log_id(3, 8))).await.unwrap();
        store.purge(log_id(3, 4)).await.unwrap();
        // Each synced write is one fsync: the vote and the one append of ten entries.
        let c = store.counters();
        assert_eq!(c.synced_writes.load(Ordering::Relaxed), 2);
        assert_eq!(c.appends.load(Ordering::Relaxed), 1);
        assert_eq!(c.entries_appended.load(Ordering::Relaxed), 10);
        drop(store);

        let mut store = RaftLogStore::open(dir.path()).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(3, 8)));
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(3, 4)));
        assert_eq!(state.last_log_id, Some(log_id(3, 10)));
        let entries = store.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (5..=10).collect::<Vec<_>>());
        assert_eq!(entries[0], round_entry(3, 5, 41, 200));

        // A truncation is synced and survives too.
        store.truncate(log_id(3, 8)).await.unwrap();
        drop(store);
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        assert_eq!(store.get_log_state().await.unwrap().last_log_id, Some(log_id(3, 7)));
        assert!(store.try_get_log_entries(8..).await.unwrap().is_empty());
    });
}

#[test]
fn an_entry_over_the_limit_is_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        store.blocking_append([round_entry(1, 1, 1, 100)]).await.unwrap();
        // One write as large as the limit: the entry's header makes it larger.
        let huge = round_entry(1, 2, 1, ENTRY_BYTES_MAX);
        let err = store.blocking_append([huge]).await.unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        let c = store.counters();
        assert_eq!(c.oversize_refused.load(Ordering::Relaxed), 1);
        // Nothing of the refused append was written.
        assert_eq!(store.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 1)));
        assert_eq!(c.entries_appended.load(Ordering::Relaxed), 1);
    });
}

#[test]
fn bad_stored_values_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        store.blocking_append((1..=3).map(|i| round_entry(1, i, 2, 10))).await.unwrap();
        let cf = store.db.cf_handle(CF_RAFT_LOG).unwrap();
        let good = store.db.get_cf(cf, index_key(2)).unwrap().unwrap();
        let mut cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            ("unknown format", index_key(2).to_vec(), [&[9u8][..], &good[1..]].concat()),
            ("trailing bytes", index_key(2).to_vec(), [&good[..], &[0u8][..]].concat()),
            ("truncated", index_key(2).to_vec(), good[..good.len() - 3].to_vec()),
            ("empty", index_key(2).to_vec(), Vec::new()),
            (
                "under another index",
                index_key(2).to_vec(),
                store.db.get_cf(cf, index_key(3)).unwrap().unwrap(),
            ),
            ("key of 9 bytes", [&index_key(1)[..], &[0u8][..]].concat(), good.clone()),
        ];
        for (what, key, value) in cases.drain(..) {
            let dir = tempfile::tempdir().unwrap();
            let mut store = RaftLogStore::open(dir.path()).unwrap();
            store.blocking_append((1..=3).map(|i| round_entry(1, i, 2, 10))).await.unwrap();
            let cf = store.db.cf_handle(CF_RAFT_LOG).unwrap();
            store.db.put_cf(cf, &key, &value).unwrap();
            let res = store.try_get_log_entries(0..10).await;
            assert!(res.is_err(), "{what}: read as {res:?}");
            assert!(store.counters().corrupt_reads.load(Ordering::Relaxed) >= 1, "{what}: not counted");
        }
        // A bad vote is an error too.
        let meta = store.db.cf_handle(CF_RAFT_META).unwrap();
        store.db.put_cf(meta, META_VOTE, [FORMAT_V1, 0xff, 0xff]).unwrap();
        assert!(store.read_vote().await.is_err());
    });
}

#[test]
fn an_empty_append_writes_nothing_and_still_calls_back() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        store.blocking_append(Vec::<RaftEntry>::new()).await.unwrap();
        assert_eq!(store.counters().synced_writes.load(Ordering::Relaxed), 0);
        assert_eq!(store.get_log_state().await.unwrap().last_log_id, None);
    });
}

#[test]
fn a_replication_read_stops_at_its_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        // Five entries of 3 MiB: two fit the 8 MiB budget, a third would not.
        let big = 3 << 20;
        store.blocking_append((1..=5).map(|i| round_entry(1, i, 1, big))).await.unwrap();
        let got = store.limited_get_log_entries(1, 6).await.unwrap();
        assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(store.counters().reads_cut.load(Ordering::Relaxed), 1);
        // A range of one entry returns it; a read never returns nothing when entries exist.
        let got = store.limited_get_log_entries(3, 4).await.unwrap();
        assert_eq!(got.len(), 1);
        // The unlimited read returns the whole range.
        assert_eq!(store.try_get_log_entries(1..6).await.unwrap().len(), 5);
    });
}

#[test]
fn a_quiet_raft_log_hands_its_memtables_to_table_files() {
    let dir = tempfile::tempdir().unwrap();
    let memtable = |store: &RaftLogStore| {
        let cf = store.db.cf_handle(CF_RAFT_LOG).unwrap();
        store.db.property_int_value_cf(cf, "rocksdb.cur-size-all-mem-tables").unwrap().unwrap()
    };
    rt().block_on(async {
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        // Below the minimum nothing is flushed.
        store.blocking_append([round_entry(1, 1, 4, 100)]).await.unwrap();
        assert_eq!(store.flush_idle_memtables().unwrap(), 0);
        // About 2 MiB of entries.
        store.blocking_append((2..=100).map(|i| round_entry(1, i, 41, 500))).await.unwrap();
        let held = memtable(&store);
        assert!(held >= 2 * crate::store::IDLE_FLUSH_MIN_BYTES, "{held} B in the raft log's memtable");
        assert!(store.flush_idle_memtables().unwrap() >= 2 * crate::store::IDLE_FLUSH_MIN_BYTES);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while memtable(&store) * 4 > held {
            assert!(std::time::Instant::now() < deadline, "not flushed: {} B", memtable(&store));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(store.flush_idle_memtables().unwrap(), 0, "flushed already");
        // Nothing was lost, and the table files hold it across a reopen.
        drop(store);
        let mut store = RaftLogStore::open(dir.path()).unwrap();
        let entries = store.try_get_log_entries(1..=100).await.unwrap();
        assert_eq!(entries.len(), 100);
        assert_eq!(entries[99], round_entry(1, 100, 41, 500));
    });
}
