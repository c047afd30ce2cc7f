//! The event-log conformance suite run against [`RocksLog`], plus the checks only the
//! durable log has: epochs of new and wiped data dirs, the one-DC-per-dir rule, the
//! persisted extras (watch index, peer acks) and group commit through the [`Committer`].

use std::collections::BTreeSet;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use tandem::store::{
    CommitError, CommitLog, CommitNotice, Committed, Committer, CommitterHandle, CommitterLimits, OpenError,
    RocksLog,
};
use tandem_replicator::log::conformance::{dereg, reg, Harness};
use tandem_replicator::log::{EventLog, LogError, StateChange};
use tandem_replicator::merge::Held;
use tandem_schemas::Mark;
use tempfile::TempDir;

/// Fresh logs in their own temp dirs; reopen = drop (no orderly shutdown) and open again.
#[derive(Default)]
struct Rocks {
    dirs: Vec<TempDir>,
}

impl Harness for Rocks {
    type Log = RocksLog;

    fn fresh(&mut self, dc: &str, epoch: u64) -> RocksLog {
        let dir = TempDir::new().unwrap();
        let epoch = NonZeroU64::new(epoch).expect("the suite uses non-zero epochs");
        let log = RocksLog::create_with_epoch(dir.path(), dc, epoch).unwrap();
        self.dirs.push(dir);
        log
    }

    fn reopen(&mut self, log: RocksLog) -> RocksLog {
        let dir = log.dir().to_owned();
        let dc = log.local_dc().to_owned();
        drop(log);
        RocksLog::open(&dir, &dc).unwrap()
    }
}

tandem_replicator::conformance_tests!(Rocks::default);

fn reopen(log: RocksLog) -> RocksLog {
    Rocks::default().reopen(log)
}

#[test]
fn a_new_dir_gets_a_random_epoch_that_survives_reopen() {
    let dir = TempDir::new().unwrap();
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    let epoch = log.own_mark().epoch;
    assert_ne!(epoch, 0);
    assert_eq!(log.own_mark().seq, 0);
    let log = reopen(log);
    assert_eq!(log.own_mark(), Mark { epoch, seq: 0 });
}

#[test]
fn a_wiped_dir_starts_a_new_epoch() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let mut log = RocksLog::open(&data, "dc-a").unwrap();
    let old = log.own_mark().epoch;
    log.append_local(&[reg("dc-a", old, 1, "i1")]).unwrap();
    drop(log);
    std::fs::remove_dir_all(&data).unwrap();
    let log = RocksLog::open(&data, "dc-a").unwrap();
    assert_ne!(log.own_mark().epoch, old, "a lost history must not reuse the epoch");
    assert_eq!(log.own_mark().seq, 0);
    assert_eq!(log.instances().unwrap(), vec![]);
}

#[test]
fn a_dir_of_another_dc_is_refused_and_left_alone() {
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::open(dir.path(), "dc-a").unwrap();
    let epoch = log.own_mark().epoch;
    log.append_local(&[reg("dc-a", epoch, 1, "i1")]).unwrap();
    drop(log);
    let err = RocksLog::open(dir.path(), "dc-b").unwrap_err();
    assert!(
        matches!(&err, OpenError::WrongDc { stored, requested, .. } if stored == "dc-a" && requested == "dc-b"),
        "{err}"
    );
    assert!(err.to_string().contains("belongs to DC"), "{err}");
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert_eq!(log.own_mark(), Mark { epoch, seq: 1 });
}

#[test]
fn an_invalid_dc_name_or_a_second_create_is_refused() {
    let dir = TempDir::new().unwrap();
    assert!(matches!(RocksLog::open(dir.path(), "DC A"), Err(OpenError::InvalidDc(_))));
    let epoch = NonZeroU64::new(7).unwrap();
    drop(RocksLog::create_with_epoch(dir.path(), "dc-a", epoch).unwrap());
    let err = RocksLog::create_with_epoch(dir.path(), "dc-a", epoch).unwrap_err();
    assert!(matches!(err, OpenError::AlreadyInitialized { epoch: 7, .. }), "{err}");
    // Usable where a LogError is expected.
    let as_log_error: LogError = err.into();
    assert!(matches!(as_log_error, LogError::Storage(_)));
}

#[test]
fn watch_index_is_written_with_the_next_batch_and_never_goes_back() {
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(3).unwrap()).unwrap();
    log.set_next_index(5);
    assert_eq!(log.index(), 0, "staged, not yet durable");
    // A call that writes nothing leaves the index staged.
    log.append_local(&[]).unwrap();
    assert_eq!(log.index(), 0);
    log.append_local(&[reg("dc-a", 3, 1, "i1")]).unwrap();
    assert_eq!(log.index(), 5);
    log.set_next_index(2);
    log.append_local(&[reg("dc-a", 3, 2, "i2")]).unwrap();
    assert_eq!(log.index(), 5);
    let log = reopen(log);
    assert_eq!(log.index(), 5);
}

#[test]
fn peer_acks_and_own_event_times_persist() {
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(3).unwrap()).unwrap();
    log.append_local(&[reg("dc-a", 3, 1, "i1"), reg("dc-a", 3, 2, "i2")]).unwrap();
    let syncs = log.sync_writes();
    log.record_peer_ack("dc-b", Mark { epoch: 3, seq: 2 }).unwrap();
    log.record_peer_ack("dc-c", Mark { epoch: 3, seq: 1 }).unwrap();
    assert_eq!(log.sync_writes(), syncs, "acks ride without an fsync of their own");
    // The conformance events carry commit_time_ms = 1000 + seq.
    assert_eq!(log.own_event_time_ms(2).unwrap(), Some(1_002));
    assert_eq!(log.own_event_time_ms(3).unwrap(), None);
    log.purge_own(1).unwrap();
    assert_eq!(log.own_event_time_ms(1).unwrap(), None);
    let log = reopen(log);
    let acks = log.peer_acks();
    assert_eq!(acks.get("dc-b"), Some(&Mark { epoch: 3, seq: 2 }));
    assert_eq!(acks.get("dc-c"), Some(&Mark { epoch: 3, seq: 1 }));
    assert_eq!(log.own_event_time_ms(2).unwrap(), Some(1_002));
}

#[test]
fn remote_events_change_state_but_never_enter_the_own_log() {
    let dir = TempDir::new().unwrap();
    let mut log = RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(3).unwrap()).unwrap();
    log.apply_remote("dc-b", &[reg("dc-b", 9, 1, "r1")]).unwrap();
    assert_eq!(log.own_mark().seq, 0);
    assert_eq!(log.read_own(0, 10).unwrap(), vec![]);
    assert_eq!(log.held(&tandem_replicator::log::conformance::key("dc-b", "r1")), Held::Live { seq: 1 });
}

fn open_committer(dir: &Path, epoch: u64) -> (CommitterHandle, Arc<Mutex<Vec<CommitNotice>>>) {
    let log = RocksLog::create_with_epoch(dir, "dc-a", NonZeroU64::new(epoch).unwrap()).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let handle =
        Committer::spawn(log, Box::new(move |n: &CommitNotice| sink.lock().push(n.clone()))).unwrap();
    (handle, seen)
}

/// Parks the committer thread inside a `with_log` call until the returned gate is opened,
/// so that requests sent meanwhile wait in its queue.
async fn hold_committer(
    handle: &CommitterHandle,
) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<Result<(), CommitError>>) {
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let h = handle.clone();
    let held = tokio::spawn(async move {
        h.with_log(move |_log| {
            let _ = entered_tx.send(());
            let _ = gate_rx.recv();
        })
        .await
    });
    entered_rx.await.unwrap();
    (gate_tx, held)
}

/// Waits (bounded) until `n` requests are queued behind the gate of [`hold_committer`],
/// then opens the gate and waits for the held call to return.
async fn release_when_queued(
    handle: &CommitterHandle,
    n: usize,
    gate_tx: std::sync::mpsc::Sender<()>,
    held: tokio::task::JoinHandle<Result<(), CommitError>>,
) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while handle.queued_requests() < n {
        assert!(tokio::time::Instant::now() < deadline, "appends never queued");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    gate_tx.send(()).unwrap();
    held.await.unwrap().unwrap();
}

/// 64 tasks append concurrently. The committer is held busy until all 64 requests wait in
/// its queue, so the first round is one group behind one fsync; later rounds run free.
/// Every acknowledged event is readable after a reopen, and `on_commit` saw them in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_fsyncs_among_concurrent_appends() {
    const TASKS: u64 = 64;
    const APPENDS_PER_TASK: u64 = 8;
    let dir = TempDir::new().unwrap();
    let (handle, seen) = open_committer(dir.path(), 21);

    let (gate_tx, held) = hold_committer(&handle).await;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let h = handle.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..APPENDS_PER_TASK {
                let id = format!("t{t}-{i}");
                let evs = h.append_local(move |m| vec![reg("dc-a", m.epoch, m.seq + 1, &id)]).await.unwrap();
                assert_eq!(evs.len(), 1);
                acked.push(evs[0].seq);
            }
            acked
        }));
    }
    // The first append of every task waits behind the gate; then the gate opens.
    release_when_queued(&handle, TASKS as usize, gate_tx, held).await;

    let mut acked = BTreeSet::new();
    for t in tasks {
        for seq in t.await.unwrap() {
            assert!(acked.insert(seq), "seq {seq} acked twice");
        }
    }
    let appends = TASKS * APPENDS_PER_TASK;
    assert_eq!(acked, (1..=appends).collect::<BTreeSet<u64>>());

    let stats = handle.stats();
    assert_eq!(stats.local_requests, appends);
    assert_eq!(stats.local_events, appends);
    assert!(stats.local_fsyncs < appends, "{stats:?}");
    assert!(stats.fsyncs <= stats.local_fsyncs, "{stats:?}");
    // The gated first round was one group of all 64 first appends.
    assert!(stats.local_group_requests[6] >= 1, "{stats:?}");
    assert_eq!(*handle.own_seq().borrow(), appends);

    // on_commit saw every event once, in seq order, with a growing watch index.
    {
        let notices = seen.lock();
        let mut next_seq = 1;
        let mut last_index = 0;
        for n in notices.iter() {
            assert!(n.index > last_index);
            last_index = n.index;
            let Committed::Local { events, changes } = &n.committed else { panic!("{n:?}") };
            assert_eq!(events.len(), changes.len());
            for (ev, ch) in events.iter().zip(changes) {
                assert_eq!(ev.seq, next_seq);
                assert!(matches!(ch, StateChange::Put { seq, .. } if *seq == ev.seq));
                next_seq += 1;
            }
        }
        assert_eq!(next_seq, appends + 1);
        assert_eq!(notices.len() as u64, stats.local_fsyncs);
    }

    handle.shutdown().await;
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert_eq!(log.own_mark(), Mark { epoch: 21, seq: appends });
    let logged: BTreeSet<u64> = log.read_own(0, usize::MAX).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(logged, acked);
    assert_eq!(log.instances().unwrap().len() as u64, appends);
    assert_eq!(log.index(), seen.lock().last().map_or(0, |n| n.index));
}

/// A builder that mints the wrong seq or panics fails alone; its group neighbours commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_builder_fails_only_its_own_request() {
    let dir = TempDir::new().unwrap();
    let (handle, _seen) = open_committer(dir.path(), 5);
    let (gate_tx, held) = hold_committer(&handle).await;
    let h = handle.clone();
    let good1 =
        tokio::spawn(async move { h.append_local(|m| vec![reg("dc-a", m.epoch, m.seq + 1, "a")]).await });
    while handle.queued_requests() < 1 {
        tokio::task::yield_now().await;
    }
    let h = handle.clone();
    let gap =
        tokio::spawn(async move { h.append_local(|m| vec![reg("dc-a", m.epoch, m.seq + 2, "b")]).await });
    while handle.queued_requests() < 2 {
        tokio::task::yield_now().await;
    }
    let h = handle.clone();
    let panics = tokio::spawn(async move { h.append_local(|_| panic!("builder bug")).await });
    while handle.queued_requests() < 3 {
        tokio::task::yield_now().await;
    }
    let h = handle.clone();
    let good2 =
        tokio::spawn(async move { h.append_local(|m| vec![dereg("dc-a", m.epoch, m.seq + 1, "a")]).await });
    while handle.queued_requests() < 4 {
        tokio::task::yield_now().await;
    }
    gate_tx.send(()).unwrap();
    held.await.unwrap().unwrap();

    assert_eq!(good1.await.unwrap().unwrap()[0].seq, 1);
    assert!(matches!(
        gap.await.unwrap(),
        Err(CommitError::Log(LogError::OutOfSequence { expected: 2, got: 3 }))
    ));
    assert!(matches!(panics.await.unwrap(), Err(CommitError::BuilderPanicked)));
    assert_eq!(good2.await.unwrap().unwrap()[0].seq, 2);
    assert_eq!(handle.stats().local_fsyncs, 1);

    let held_a = handle
        .with_log(|log| log.held(&tandem_replicator::log::conformance::key("dc-a", "a")))
        .await
        .unwrap();
    assert_eq!(held_a, Held::Tombstone { seq: 2 });
    handle.shutdown().await;
    assert!(matches!(handle.purge_own(1).await, Err(CommitError::Stopped)));
}

/// The replication gateway reads the log (the own events to ship, the marks it checks)
/// while the DC's writers keep the committer busy. A read queued among local appends is
/// served where it stands: the appends around it still go out in one synced write, and
/// the read sees the log as of the last durable write. A `with_log`, which may write,
/// still goes between two writes (it split the group, an fsync more per batch shipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_among_local_appends_does_not_split_their_synced_write() {
    let dir = TempDir::new().unwrap();
    let (handle, _seen) = open_committer(dir.path(), 5);
    let (gate_tx, held) = hold_committer(&handle).await;
    let h = handle.clone();
    let first =
        tokio::spawn(async move { h.append_local(|m| vec![reg("dc-a", m.epoch, m.seq + 1, "a")]).await });
    while handle.queued_requests() < 1 {
        tokio::task::yield_now().await;
    }
    let h = handle.clone();
    let read = tokio::spawn(async move { h.read_log(|log| log.own_mark().seq).await });
    while handle.queued_requests() < 2 {
        tokio::task::yield_now().await;
    }
    let h = handle.clone();
    let second =
        tokio::spawn(async move { h.append_local(|m| vec![reg("dc-a", m.epoch, m.seq + 1, "b")]).await });
    release_when_queued(&handle, 3, gate_tx, held).await;

    assert_eq!(first.await.unwrap().unwrap()[0].seq, 1);
    assert_eq!(second.await.unwrap().unwrap()[0].seq, 2);
    assert_eq!(read.await.unwrap().unwrap(), 0, "the read saw a write before it was durable");
    assert_eq!(handle.stats().local_fsyncs, 1, "the read split the appends' group");
    assert_eq!(handle.read_log(|log| log.own_mark().seq).await.unwrap(), 2);
    handle.shutdown().await;
}

/// Remote batches, snapshots and purges through the committer are reported in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committer_reports_every_kind_of_write() {
    let dir = TempDir::new().unwrap();
    let (handle, seen) = open_committer(dir.path(), 5);
    handle
        .append_local(|m| vec![reg("dc-a", m.epoch, m.seq + 1, "a"), dereg("dc-a", m.epoch, m.seq + 2, "a")])
        .await
        .unwrap();
    let rep = handle
        .apply_remote("dc-b".into(), vec![reg("dc-b", 9, 1, "r1"), reg("dc-b", 9, 2, "r2")])
        .await
        .unwrap();
    assert_eq!(rep.applied, 2);
    // A pure duplicate writes nothing and is not reported.
    let rep = handle.apply_remote("dc-b".into(), vec![reg("dc-b", 9, 1, "r1")]).await.unwrap();
    assert_eq!(rep.duplicates, 1);
    handle.record_peer_ack("dc-b".into(), Mark { epoch: 5, seq: 2 }).await.unwrap();
    assert_eq!(handle.purge_own(2).await.unwrap(), 2);
    handle.apply_remote("dc-b".into(), vec![dereg("dc-b", 9, 3, "r1")]).await.unwrap();
    handle.purge_remote_tombstones("dc-b".into(), 3).await.unwrap();
    let snap = handle.with_log(|log| log.snapshot_own()).await.unwrap().unwrap();
    assert_eq!(snap.mark, Mark { epoch: 5, seq: 2 });
    assert!(snap.tombstones.is_empty());

    let notices = seen.lock().clone();
    let kinds: Vec<&str> = notices
        .iter()
        .map(|n| match &n.committed {
            Committed::Local { .. } => "local",
            Committed::Remote { .. } => "remote",
            Committed::Snapshot { .. } => "snapshot",
            Committed::PurgedOwn { .. } => "purged-own",
            Committed::PurgedRemoteTombstones { .. } => "purged-remote",
            Committed::Retired { .. } => "retired",
            Committed::Unretired { .. } => "unretired",
            Committed::Replaced { .. } => "replaced",
            Committed::Rescoped { .. } => "rescoped",
        })
        .collect();
    assert_eq!(kinds, ["local", "remote", "purged-own", "remote", "purged-remote"]);
    let indexes: Vec<u64> = notices.iter().map(|n| n.index).collect();
    assert_eq!(indexes, [1, 2, 3, 4, 5]);
    let Committed::PurgedOwn { tombstones_removed, .. } = &notices[2].committed else { unreachable!() };
    assert_eq!(tombstones_removed, &[tandem_replicator::log::conformance::key("dc-a", "a")]);
    let Committed::PurgedRemoteTombstones { tombstones_removed, .. } = &notices[4].committed else {
        unreachable!()
    };
    assert_eq!(tombstones_removed, &[tandem_replicator::log::conformance::key("dc-b", "r1")]);
    assert_eq!(notices[1].changes().len(), 2);

    handle.shutdown().await;
    let log = RocksLog::open(dir.path(), "dc-a").unwrap();
    assert_eq!(log.index(), 5);
    assert_eq!(log.peer_acks().get("dc-b"), Some(&Mark { epoch: 5, seq: 2 }));
    assert_eq!(log.mark_of("dc-b"), Some(Mark { epoch: 9, seq: 3 }));
}

mod model {
    //! Differential check: random histories give RocksLog and the reference model MemLog
    //! the same answers and the same state, across reopens.

    use super::*;
    use proptest::prelude::*;
    use tandem_replicator::log::conformance::{ev, key, record};
    use tandem_replicator::log::MemLog;
    use tandem_schemas::{ChangeEvent, DeregisterReason, Op, Snapshot, SnapshotInstance, Tombstone};

    const IDS: u8 = 4;

    #[derive(Clone, Debug)]
    enum Kind {
        Register,
        Update,
        Deregister,
    }

    #[derive(Clone, Debug)]
    enum Step {
        Local(Vec<(Kind, u8)>),
        /// Events of dc-b relative to the receiver's mark: (seq offset, epoch, kind, id).
        Remote {
            channel: &'static str,
            events: Vec<(i8, u64, Kind, u8)>,
        },
        Snapshot {
            epoch: u64,
            seq: u64,
            live: Vec<(u8, u64)>,
            dead: Vec<(u8, u64)>,
        },
        PurgeOwn(u64),
        PurgeRemote(u64),
        Reopen,
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![Just(Kind::Register), Just(Kind::Update), Just(Kind::Deregister)]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => proptest::collection::vec((kind(), 0..IDS), 0..4).prop_map(Step::Local),
            4 => (
                prop_oneof![6 => Just("dc-b"), 1 => Just("dc-c"), 1 => Just("dc-a")],
                proptest::collection::vec((-2i8..3, prop_oneof![8 => Just(9u64), 1 => Just(10u64)], kind(), 0..IDS), 0..5),
            )
                .prop_map(|(channel, events)| Step::Remote { channel, events }),
            1 => (prop_oneof![Just(9u64), Just(10u64)], 0u64..12, proptest::collection::vec((0..IDS, 1u64..12), 0..3),
                  proptest::collection::vec((0..IDS, 1u64..12), 0..3))
                .prop_map(|(epoch, seq, live, dead)| Step::Snapshot { epoch, seq, live, dead }),
            1 => (0u64..12).prop_map(Step::PurgeOwn),
            1 => (0u64..12).prop_map(Step::PurgeRemote),
            1 => Just(Step::Reopen),
        ]
    }

    fn op(origin: &str, kind: &Kind, id: u8) -> Op {
        let id = format!("i{id}");
        match kind {
            Kind::Register => Op::Register(record(origin, &id)),
            Kind::Update => {
                let mut r = record(origin, &id);
                r.weight = 7;
                Op::Update(r)
            }
            Kind::Deregister => Op::Deregister { key: key(origin, &id), reason: DeregisterReason::Evicted },
        }
    }

    fn answers<L: EventLog>(log: &mut L, step: &Step) -> String {
        match step {
            Step::Local(evs) => {
                let own = log.own_mark();
                let events: Vec<ChangeEvent> = evs
                    .iter()
                    .enumerate()
                    .map(|(i, (k, id))| ev("dc-a", own.epoch, own.seq + 1 + i as u64, op("dc-a", k, *id)))
                    .collect();
                format!("{:?}", log.append_local(&events))
            }
            Step::Remote { channel, events } => {
                let base = log.mark_of("dc-b").map_or(0, |m| m.seq) as i64;
                let events: Vec<ChangeEvent> = events
                    .iter()
                    .enumerate()
                    .map(|(i, (off, epoch, k, id))| {
                        let seq = (base + 1 + i as i64 + i64::from(*off)).max(1) as u64;
                        ev("dc-b", *epoch, seq, op("dc-b", k, *id))
                    })
                    .collect();
                format!("{:?}", log.apply_remote(channel, &events))
            }
            Step::Snapshot { epoch, seq, live, dead } => {
                let live: BTreeSet<(u8, u64)> = live.iter().copied().collect();
                let dead: BTreeSet<(u8, u64)> =
                    dead.iter().copied().filter(|(id, _)| !live.iter().any(|(l, _)| l == id)).collect();
                let snap = Snapshot {
                    origin_dc: "dc-b".into(),
                    mark: Mark { epoch: *epoch, seq: *seq },
                    instances: live
                        .iter()
                        .map(|(id, s)| SnapshotInstance {
                            seq: (*s).min(*seq).max(1),
                            record: record("dc-b", &format!("i{id}")),
                        })
                        .collect(),
                    tombstones: dead
                        .iter()
                        .map(|(id, s)| Tombstone {
                            key: key("dc-b", &format!("i{id}")),
                            seq: (*s).min(*seq).max(1),
                            reason: DeregisterReason::Explicit,
                        })
                        .collect(),
                };
                format!("{:?}", log.install_snapshot("dc-b", &snap))
            }
            Step::PurgeOwn(upto) => format!("{:?}", log.purge_own(*upto)),
            Step::PurgeRemote(upto) => format!("{:?}", log.purge_remote_tombstones("dc-b", *upto)),
            Step::Reopen => String::new(),
        }
    }

    fn state<L: EventLog>(log: &L) -> String {
        let held: Vec<_> = ["dc-a", "dc-b"]
            .iter()
            .flat_map(|o| (0..IDS).map(move |id| key(o, &format!("i{id}"))))
            .map(|k| log.held(&k))
            .collect();
        format!(
            "own {:?} floor {} marks {:?}\ninstances {:?}\ntombstones {:?}\nheld {:?}\nlog {:?}\nsnapshot {:?}",
            log.own_mark(),
            log.purge_floor(),
            log.marks(),
            log.instances().unwrap(),
            log.tombstones().unwrap(),
            held,
            log.read_own(log.purge_floor(), 1000).unwrap(),
            log.snapshot_own().unwrap(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn rocks_log_matches_the_model_on_random_histories(steps in proptest::collection::vec(step(), 1..25)) {
            let mut h = Rocks::default();
            let mut rocks = h.fresh("dc-a", 1);
            let mut mem = MemLog::new("dc-a", 1);
            for (i, step) in steps.iter().enumerate() {
                if let Step::Reopen = step {
                    rocks = h.reopen(rocks);
                }
                let (got, want) = (answers(&mut rocks, step), answers(&mut mem, step));
                prop_assert_eq!(got, want, "answer to step {} {:?}", i, step);
                prop_assert_eq!(state(&rocks), state(&mem), "state after step {} {:?}", i, step);
            }
        }
    }
}

fn open_committer_lingering(dir: &Path, epoch: u64, linger: std::time::Duration) -> CommitterHandle {
    let log = RocksLog::create_with_epoch(dir, "dc-a", NonZeroU64::new(epoch).unwrap()).unwrap();
    let limits = CommitterLimits { linger_max: linger, linger_target: 1024, ..Default::default() };
    Committer::spawn_with_limits(log, Box::new(|_| {}), limits).unwrap()
}

/// A lone writer never waits for company: with a linger budget of a minute, sequential
/// appends are each answered (a linger would hold every one of them for the full minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_linger_never_holds_a_lone_writer() {
    let dir = TempDir::new().unwrap();
    let handle = open_committer_lingering(dir.path(), 22, std::time::Duration::from_secs(60));
    for i in 0..5u64 {
        let id = format!("lone-{i}");
        let append = handle.append_local(move |m| vec![reg("dc-a", m.epoch, m.seq + 1, &id)]);
        let evs = tokio::time::timeout(std::time::Duration::from_secs(20), append)
            .await
            .expect("a lone writer was held by the group-commit linger")
            .unwrap();
        assert_eq!(evs[0].seq, i + 1);
    }
    assert_eq!(handle.stats().local_fsyncs, 5);
    handle.shutdown().await;
}

/// With lingering, 64 writers that each append 8 times in a row share about one fsync per
/// wave: after the first (gated) round of 64, each round waits until the writers answered
/// by the previous one are back, instead of writing whatever few arrived first.
///
/// A busy machine can delay a writer's return past the linger once in a while, so the run
/// is made up to three times and the best one counts: lingering reaches the bound in one
/// of them, while a committer that does not linger (about 14 fsyncs on the development
/// machine) misses it in all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_linger_gathers_the_writers_of_the_previous_round() {
    const TASKS: u64 = 64;
    const APPENDS_PER_TASK: u64 = 8;
    const RUNS_MAX: usize = 3;
    let mut seen = Vec::new();
    for run in 0..RUNS_MAX {
        let dir = TempDir::new().unwrap();
        let handle =
            open_committer_lingering(dir.path(), 23 + run as u64, std::time::Duration::from_millis(500));
        let (gate_tx, held) = hold_committer(&handle).await;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let h = handle.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..APPENDS_PER_TASK {
                    let id = format!("t{t}-{i}");
                    h.append_local(move |m| vec![reg("dc-a", m.epoch, m.seq + 1, &id)]).await.unwrap();
                }
            }));
        }
        release_when_queued(&handle, TASKS as usize, gate_tx, held).await;
        for t in tasks {
            t.await.unwrap();
        }
        let stats = handle.stats();
        handle.shutdown().await;
        assert_eq!(stats.local_requests, TASKS * APPENDS_PER_TASK);
        // 8 waves, one fsync each; a little slack for a writer slow to come back.
        let met = stats.local_fsyncs <= APPENDS_PER_TASK + 3;
        seen.push(stats);
        if met {
            return;
        }
    }
    panic!("no run of {RUNS_MAX} shared one fsync per wave: {seen:?}");
}

/// Retiring a DC, checked alike on RocksLog and on the in-memory MemStore: the DC's copies,
/// tombstones, mark and ack go, nothing else does, and the committer refuses its frames
/// until it is unretired; then it replicates again from scratch.
async fn retire_conformance<L: CommitLog + Send + 'static>(log: L, reopen: impl FnOnce(L) -> L) {
    let mut log = log;
    log.append_local(&[reg("dc-a", 3, 1, "a1")]).unwrap();
    log.apply_remote("dc-b", &[reg("dc-b", 9, 1, "b1")]).unwrap();
    log.apply_remote("dc-c", &[reg("dc-c", 5, 1, "c1"), reg("dc-c", 5, 2, "c2"), dereg("dc-c", 5, 3, "c1")])
        .unwrap();
    log.record_peer_ack("dc-c", Mark { epoch: 3, seq: 1 }).unwrap();
    assert!(log.retire_origin("dc-a", 1).is_err(), "the own DC cannot be retired");
    let r = log.retire_origin("dc-c", 1_000).unwrap();
    assert!(r.newly);
    assert_eq!(
        r.changes,
        vec![StateChange::Remove { key: tandem_replicator::log::conformance::key("dc-c", "c2") }]
    );
    assert_eq!(r.tombstones_removed, 1);
    assert_eq!(r.mark, Some(Mark { epoch: 5, seq: 3 }));
    let again = log.retire_origin("dc-c", 2_000).unwrap();
    assert!(!again.newly && again.at_ms == 1_000, "retiring twice changes nothing: {again:?}");
    let log = reopen(log);
    assert_eq!(log.retired().into_iter().collect::<Vec<_>>(), vec![("dc-c".to_owned(), 1_000)]);
    assert_eq!(log.mark_of("dc-c"), None);
    assert!(!log.peer_acks().contains_key("dc-c"));
    let owners: BTreeSet<String> =
        log.instances().unwrap().into_iter().map(|(_, r)| r.key.owner_dc.to_string()).collect();
    assert_eq!(owners, BTreeSet::from(["dc-a".to_owned(), "dc-b".to_owned()]));
    assert!(log.tombstones().unwrap().iter().all(|t| *t.key.owner_dc != *"dc-c"));

    // Through the committer: late frames of the retired DC change nothing.
    let (mut committer, handle) =
        Committer::inline(log, Box::new(|_: &CommitNotice| {}), CommitterLimits::default());
    let late = drive(&mut committer, handle.apply_remote("dc-c".into(), vec![reg("dc-c", 5, 4, "c4")])).await;
    let late = late.unwrap();
    assert_eq!(late.refusal, Some(tandem_replicator::merge::Refusal::Retired { dc: "dc-c".into() }));
    assert_eq!((late.applied, late.mark), (0, None));
    assert!(drive(&mut committer, handle.unretire("dc-c".into())).await.unwrap());
    let fresh =
        drive(&mut committer, handle.apply_remote("dc-c".into(), vec![reg("dc-c", 6, 1, "c9")])).await;
    assert_eq!(fresh.unwrap().applied, 1, "an unretired DC replicates again from scratch");
    let log = committer.into_log();
    assert!(log.retired().is_empty());
    assert_eq!(log.mark_of("dc-c"), Some(Mark { epoch: 6, seq: 1 }));
}

/// Runs an inline committer until `fut` (a request to it) is answered.
async fn drive<L: CommitLog + Send + 'static, T>(
    committer: &mut tandem::store::InlineCommitter<L>,
    fut: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            v = &mut fut => return v,
            _ = tokio::task::yield_now() => { committer.run_until_idle(); }
        }
    }
}

#[tokio::test]
async fn retiring_a_dc_on_rocksdb() {
    let dir = TempDir::new().unwrap();
    let log = RocksLog::create_with_epoch(dir.path(), "dc-a", NonZeroU64::new(3).unwrap()).unwrap();
    retire_conformance(log, reopen).await;
}

#[tokio::test]
async fn retiring_a_dc_in_memory() {
    retire_conformance(tandem::store::MemStore::new("dc-a", 3), |l| l).await;
}
