//! Tests of the registry's state machine on RocksLog, one member at a time: the write
//! format, seqs assigned at apply, the applied id in the same batch as the events, a
//! reopen, undecodable writes, snapshots, and a property test against today's single-node
//! committer path (the reference model).

// openraft's StorageError is large, and its traits fix it.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{BasicNode, Entry, EntryPayload, Membership, RaftSnapshotBuilder, StorageError};
use parking_lot::Mutex;
use proptest::prelude::*;
use serde_bytes::ByteBuf;
use tandem_replicator::log::{ApplyReport, EventLog, LogError, StateChange};
use tandem_replicator::scope::Scope;
use tandem_schemas::{
    ChangeEvent, DeregisterReason, Health, InstanceKey, InstanceRecord, Mark, Op, Status, Tombstone,
};
use tempfile::TempDir;
use uuid::Uuid;

use super::*;
use crate::registry::{Minted, Overlay};
use crate::store::{BuildEvents, Built, CommitNotice, Committer, CommitterLimits, Request, RocksLog};

pub(super) const DC: &str = "dc1";
pub(super) const EPOCH: NonZeroU64 = NonZeroU64::new(7).unwrap();

pub(super) fn key(i: u8) -> InstanceKey {
    InstanceKey {
        owner_dc: DC.into(),
        namespace: "default".into(),
        service: "svc".into(),
        instance_id: format!("i{i}").into(),
    }
}

pub(super) fn record(i: u8, port: u16) -> InstanceRecord {
    InstanceRecord {
        key: key(i),
        address: "10.0.0.1".into(),
        port,
        zone: "".into(),
        weight: 100,
        app_version: "".into(),
        tags: vec![],
        metadata: BTreeMap::new(),
        persistent: false,
        lease_ttl_ms: 10_000,
        status: Status::Up,
        health: Health::Healthy,
        damped: false,
    }
}

/// Write `n` of a small vocabulary: `kind` picks the change, `k` the instance, `p` a value.
pub(super) fn write_of(n: u64, kind: u8, k: u8, p: u8) -> LocalWrite {
    let pick = |n: usize| usize::from(p) % n;
    let change = match kind % 6 {
        0 => {
            Change::Register { record: record(k, 1000 + u16::from(p)), owner: Some(format!("p{}", pick(3))) }
        }
        1 => Change::Deregister { key: key(k), reason: DeregisterReason::Explicit },
        2 => Change::Status {
            key: key(k),
            status: [Status::Up, Status::Draining, Status::OutOfService][pick(3)],
        },
        3 => Change::Health {
            key: key(k),
            health: [Health::Healthy, Health::Suspect, Health::Unhealthy][pick(3)],
            damped: p % 2 == 1,
        },
        4 => Change::Damped { key: key(k), damped: p % 2 == 0 },
        _ => Change::Register { record: record(k, 2000 + u16::from(p)), owner: None },
    };
    LocalWrite { event_id: Uuid::from_u128(u128::from(n) + 1), time_ms: 1_000_000 + n, change }
}

pub(super) fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> RaftEntry {
    Entry { log_id: openraft::testing::log_id(1, 1, index), payload }
}

fn normal(index: u64, writes: &[LocalWrite]) -> RaftEntry {
    entry(index, EntryPayload::Normal(Round::of_writes(writes).unwrap()))
}

/// What the state holds, as replication and the registry read it.
#[derive(Debug, PartialEq, Clone)]
pub(super) struct Dump {
    pub(super) own: Mark,
    pub(super) events: Vec<ChangeEvent>,
    instances: Vec<(u64, InstanceRecord)>,
    tombstones: Vec<Tombstone>,
    owners: Vec<(InstanceKey, Arc<str>)>,
    floor: u64,
    marks: BTreeMap<String, Mark>,
    peer_acks: BTreeMap<String, Mark>,
    retired: BTreeMap<String, u64>,
    peer_scope: Scope,
}

pub(super) fn dump(log: &RocksLog) -> Dump {
    Dump {
        own: log.own_mark(),
        events: log.read_own(log.purge_floor(), usize::MAX).unwrap(),
        instances: log.instances().unwrap(),
        tombstones: log.tombstones().unwrap(),
        owners: log.owners().unwrap(),
        floor: log.purge_floor(),
        marks: log.marks(),
        peer_acks: log.peer_acks(),
        retired: log.retired(),
        peer_scope: log.scope_of(PEER),
    }
}

/// The peer DC of the group-write tests.
const PEER: &str = "dc2";

/// Event `seq` of the peer's origin: a registration of its instance `k`, or its
/// deregistration.
pub(super) fn peer_event(seq: u64, k: u8, deregister: bool) -> ChangeEvent {
    let key = InstanceKey { owner_dc: PEER.into(), ..key(k) };
    let op = if deregister {
        Op::Deregister { key, reason: DeregisterReason::Explicit }
    } else {
        Op::Register(InstanceRecord { key, ..record(k, 3000 + u16::from(k)) })
    };
    ChangeEvent {
        event_id: Uuid::from_u128(0xdc2 << 64 | u128::from(seq)),
        origin_dc: PEER.into(),
        origin_epoch: 5,
        seq,
        commit_time_ms: 2_000_000 + seq,
        op,
    }
}

/// One step of a group-write history: a round of local writes or one group write.
#[derive(Clone, Debug)]
pub(super) enum Step {
    Local(Vec<LocalWrite>),
    Group(GroupWrite),
}

/// A history from random tuples: local rounds, the peer's batches (seqs continuing, so
/// some after a retirement or a purge are refused or superseded), acknowledgements,
/// purges, retirements and their lifting.
pub(super) fn history(picks: &[(u8, u8, u8)]) -> Vec<Step> {
    let (mut n, mut peer_seq) = (0u64, 0u64);
    picks
        .iter()
        .map(|&(kind, a, b)| match kind % 10 {
            0..=3 => Step::Local(
                (0..=a % 3)
                    .map(|i| {
                        n += 1;
                        write_of(n, a.wrapping_add(i), b % 5, b)
                    })
                    .collect(),
            ),
            // Retirements are rare: after one, the peer's later batches are refused.
            4 | 8 if kind % 10 == 4 || a % 4 != 0 => {
                let events = (0..=a % 2)
                    .map(|i| {
                        peer_seq += 1;
                        peer_event(peer_seq, b.wrapping_add(i) % 4, a.wrapping_add(i) % 3 == 2)
                    })
                    .collect();
                Step::Group(GroupWrite::Remote { channel_dc: PEER.into(), events })
            }
            5 => Step::Group(GroupWrite::PeerAck {
                peer: PEER.into(),
                mark: Mark { epoch: EPOCH.get(), seq: u64::from(a % 10) },
            }),
            6 => Step::Group(GroupWrite::PurgeOwn { upto_seq: u64::from(a % 8) }),
            7 => Step::Group(GroupWrite::PurgeRemoteTombstones {
                origin: PEER.into(),
                upto_seq: u64::from(b % 8),
            }),
            8 => Step::Group(GroupWrite::Retire { dc: PEER.into(), at_ms: 1_000 + u64::from(a) }),
            9 if a % 3 == 0 => {
                Step::Group(GroupWrite::BeginEpoch { above: u64::from(b % 12), tiebreak: u64::from(a) })
            }
            9 if a % 3 == 1 => Step::Group(GroupWrite::Rescope {
                origin: PEER.into(),
                scope: if b % 2 == 0 { Scope::All } else { Scope::only(["other"]) },
            }),
            _ => Step::Group(GroupWrite::Unretire { dc: PEER.into() }),
        })
        .collect()
}

/// Every stored byte of the state (the snapshot export).
pub(super) fn export(sm: &RegistryStateMachine) -> Vec<u8> {
    sm.with_log(|log| log.export_state(SNAPSHOT_BYTES_MAX).unwrap())
}

fn block<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn open(dir: &Path) -> RegistryStateMachine {
    RegistryStateMachine::open(dir, DC, EPOCH).unwrap()
}

fn apply(sm: &RegistryStateMachine, entries: Vec<RaftEntry>) -> Result<Vec<Applied>, StorageError<NodeId>> {
    block(sm.clone().apply(entries))
}

/// `entries` applied on two state machines in `dirs[0]` and `dirs[1]`: one entry per call
/// on the first, all in one call on the second.
fn apply_on_two(dirs: &[TempDir], entries: &[RaftEntry]) -> (RegistryStateMachine, RegistryStateMachine) {
    let (a, b) = (open(dirs[0].path()), open(dirs[1].path()));
    for e in entries {
        apply(&a, vec![e.clone()]).unwrap();
    }
    apply(&b, entries.to_vec()).unwrap();
    (a, b)
}

fn sync_writes(sm: &RegistryStateMachine) -> u64 {
    sm.with_log(RocksLog::sync_writes)
}

fn membership(index: u64) -> RaftEntry {
    let nodes: BTreeMap<NodeId, BasicNode> = (1..=3).map(|id| (id, BasicNode::new(id))).collect();
    let voters = nodes.keys().copied().collect();
    entry(index, EntryPayload::Membership(Membership::new(vec![voters], nodes)))
}

#[test]
fn writes_round_trip_and_foreign_bytes_are_refused() {
    let w = write_of(3, 0, 1, 2);
    let bytes = w.encode();
    assert_eq!(bytes[0], WRITE_FORMAT_V1);
    assert_eq!(LocalWrite::decode(&bytes).unwrap(), w);
    let mut newer = bytes.clone();
    newer[0] = WRITE_FORMAT_V1 + 1;
    assert!(LocalWrite::decode(&newer).unwrap_err().contains("format"));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(LocalWrite::decode(&longer).unwrap_err().contains("after"));
    assert!(LocalWrite::decode(&bytes[..bytes.len() - 1]).is_err());
    assert!(LocalWrite::decode(&[]).is_err());
}

/// Seqs are minted at apply, one per event, gapless from the state's own seq; blank and
/// membership entries take none. One apply call is one synced batch, with the applied id.
#[test]
fn seqs_are_minted_at_apply_and_the_applied_id_is_in_the_same_batch() {
    let dir = TempDir::new().unwrap();
    let sm = open(dir.path());
    let before = sync_writes(&sm);
    let entries = vec![
        membership(1),
        entry(2, EntryPayload::Blank),
        normal(3, &[write_of(1, 0, 0, 0), write_of(2, 0, 1, 0)]),
        // A status change, a deregistration, the same again (gone), a change of nothing.
        normal(4, &[write_of(3, 2, 0, 1), write_of(4, 1, 1, 0), write_of(5, 1, 1, 0), write_of(6, 2, 0, 1)]),
    ];
    let answers = apply(&sm, entries).unwrap();
    assert_eq!(sync_writes(&sm), before + 1, "one apply call, one synced batch");
    let outcomes: Vec<Vec<WriteOutcome>> = answers.iter().map(|a| a.outcomes.clone()).collect();
    use WriteOutcome::*;
    assert_eq!(
        outcomes,
        vec![
            vec![],
            vec![],
            vec![Written { seq: 1 }, Written { seq: 2 }],
            vec![Written { seq: 3 }, Written { seq: 4 }, Gone, Unchanged]
        ]
    );
    assert_eq!(answers.iter().map(|a| a.index).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let state = sm.with_log(dump);
    assert_eq!(state.own, Mark { epoch: EPOCH.get(), seq: 4 });
    let ids: Vec<u128> = state.events.iter().map(|e| e.event_id.as_u128()).collect();
    assert_eq!(ids, [2, 3, 4, 5], "each event carries its write's id");
    assert!(state.events.iter().all(|e| e.commit_time_ms == 1_000_000 + e.event_id.as_u128() as u64 - 1));
    let (applied, members) = block(sm.clone().applied_state()).unwrap();
    assert_eq!(applied.map(|l| l.index), Some(4));
    assert_eq!(members.log_id().map(|l| l.index), Some(1));

    // A blank entry alone: a batch with the applied id, no seq.
    apply(&sm, vec![entry(5, EntryPayload::Blank)]).unwrap();
    assert_eq!(sync_writes(&sm), before + 2);
    assert_eq!(sm.with_log(|l| l.own_mark().seq), 4);
    assert_eq!(block(sm.clone().applied_state()).unwrap().0.map(|l| l.index), Some(5));
}

/// What was applied survives a reopen, with its applied id (written in the same batch);
/// the next entries continue the seqs, so nothing is applied twice.
#[test]
fn applied_state_survives_a_reopen_and_seqs_continue() {
    let dir = TempDir::new().unwrap();
    let sm = open(dir.path());
    apply(&sm, vec![membership(1), normal(2, &[write_of(1, 0, 0, 0), write_of(2, 0, 1, 1)])]).unwrap();
    let (state, applied) = (sm.with_log(dump), block(sm.clone().applied_state()).unwrap());
    drop(sm);
    let sm = open(dir.path());
    assert_eq!(block(sm.clone().applied_state()).unwrap(), applied);
    assert_eq!(sm.with_log(dump), state);
    let answers = apply(&sm, vec![normal(3, &[write_of(3, 1, 0, 0)])]).unwrap();
    assert_eq!(answers[0].outcomes, [WriteOutcome::Written { seq: 3 }]);
}

/// A write that does not decode fails the whole apply call (openraft stops the member):
/// nothing of the call is written, not even the entries before it.
#[test]
fn a_write_that_does_not_decode_fails_the_apply_and_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let sm = open(dir.path());
    let good = normal(1, &[write_of(1, 0, 0, 0)]);
    let mut newer = write_of(2, 0, 1, 0).encode();
    newer[0] = WRITE_FORMAT_V1 + 1;
    for bad in [vec![0xFFu8; 9], newer, Vec::new()] {
        let round = Round { writes: vec![ByteBuf::from(bad)] };
        let before = sm.with_log(dump);
        let err = apply(&sm, vec![good.clone(), entry(2, EntryPayload::Normal(round))]).unwrap_err();
        assert!(err.to_string().contains("write"), "{err}");
        assert_eq!(sm.with_log(dump), before);
        assert_eq!(block(sm.clone().applied_state()).unwrap().0, None);
    }
    assert_eq!(sm.counters().writes_corrupt.load(std::sync::atomic::Ordering::Relaxed), 3);
}

/// A write whose event would break the rules (or names another DC's instance) is refused
/// alike everywhere, and takes no seq.
#[test]
fn a_refused_write_takes_no_seq() {
    let dir = TempDir::new().unwrap();
    let sm = open(dir.path());
    let mut other = write_of(1, 0, 0, 0);
    let mut zero_port = write_of(2, 0, 1, 0);
    if let Change::Register { record, .. } = &mut other.change {
        record.key.owner_dc = "dc2".into();
    }
    if let Change::Register { record, .. } = &mut zero_port.change {
        record.port = 0;
    }
    let answers =
        apply(&sm, vec![normal(1, &[other, zero_port, write_of(3, 0, 2, 0), write_of(4, 2, 1, 1)])]).unwrap();
    let o = &answers[0].outcomes;
    assert!(
        matches!(o[0], WriteOutcome::Refused { .. }) && matches!(o[1], WriteOutcome::Refused { .. }),
        "{o:?}"
    );
    assert_eq!(o[2..], [WriteOutcome::Written { seq: 1 }, WriteOutcome::Gone]);
    assert_eq!(sm.with_log(|l| l.instances().unwrap().len()), 1);
}

/// A snapshot built on one member, installed on a fresh one (created with another epoch),
/// gives the same state byte for byte, and both go on alike. A snapshot of another DC, a
/// cut one, or one whose meta names another applied id is refused and changes nothing.
#[test]
fn a_snapshot_installs_identical_state_and_bad_ones_change_nothing() {
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let a = open(dirs[0].path());
    let writes: Vec<LocalWrite> =
        (0..12).map(|n| write_of(n, (n % 5) as u8, (n % 4) as u8, n as u8)).collect();
    apply(&a, vec![membership(1), normal(2, &writes[..6]), normal(3, &writes[6..])]).unwrap();
    let snap = block(a.clone().build_snapshot()).unwrap();
    assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(3));
    let data = snap.snapshot.into_inner();

    let b = RegistryStateMachine::open(dirs[1].path(), DC, NonZeroU64::new(99).unwrap()).unwrap();
    block(b.clone().install_snapshot(&snap.meta, Box::new(std::io::Cursor::new(data.clone())))).unwrap();
    assert_eq!(export(&b), export(&a));
    assert_eq!(block(b.clone().applied_state()).unwrap(), block(a.clone().applied_state()).unwrap());
    let next = vec![normal(4, &[write_of(20, 0, 5, 0), write_of(21, 1, 0, 0)])];
    assert_eq!(apply(&a, next.clone()).unwrap(), apply(&b, next).unwrap());
    assert_eq!(export(&b), export(&a));

    let other = RegistryStateMachine::open(dirs[2].path(), "dc2", EPOCH).unwrap();
    let mut moved = snap.meta.clone();
    moved.last_log_id = Some(openraft::testing::log_id(1, 1, 9));
    let cases = [
        (&other, snap.meta.clone(), data.clone()),
        (&b, snap.meta.clone(), data[..data.len() - 3].to_vec()),
        (&b, moved, data.clone()),
    ];
    for (sm, meta, bytes) in cases {
        let before = export(sm);
        let err =
            block(sm.clone().install_snapshot(&meta, Box::new(std::io::Cursor::new(bytes)))).unwrap_err();
        assert!(err.to_string().contains("snapshot"), "{err}");
        assert_eq!(export(sm), before);
    }
}

/// A snapshot install tells the hook what the installed state holds besides its instances
/// (each remote origin's mark, the purge floor, the retired DCs): a member that caught up by
/// snapshot shows them in its status and its gateway refuses the retired DCs, without a
/// read of its log.
#[test]
fn an_installed_snapshot_tells_the_hook_its_marks() {
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let a = open(dirs[0].path());
    let remote = GroupWrite::Remote { channel_dc: PEER.into(), events: vec![peer_event(1, 0, false)] };
    let group = |index, w: &GroupWrite| entry(index, EntryPayload::Normal(Round::of_group_write(w).unwrap()));
    apply(
        &a,
        vec![
            membership(1),
            normal(2, &[write_of(1, 0, 0, 0)]),
            group(3, &remote),
            group(4, &GroupWrite::Retire { dc: "dc3".into(), at_ms: 7 }),
        ],
    )
    .unwrap();
    let snap = block(a.clone().build_snapshot()).unwrap();
    let want = a.with_log(dump);
    assert!(want.marks.contains_key(PEER) && want.retired.contains_key("dc3"), "{want:?}");

    let b = open(dirs[1].path());
    let heard: Arc<Mutex<Vec<crate::store::StateMarks>>> = Arc::default();
    let ear = heard.clone();
    b.on_apply(Box::new(move |n: &CommitNotice| {
        if let crate::store::Committed::Replaced { marks, .. } = &n.committed {
            ear.lock().push(marks.clone());
        }
    }));
    let data = snap.snapshot.into_inner();
    block(b.clone().install_snapshot(&snap.meta, Box::new(std::io::Cursor::new(data)))).unwrap();
    let marks = heard.lock().clone();
    assert_eq!(
        marks,
        vec![crate::store::StateMarks {
            floor: want.floor,
            remote: want.marks.clone(),
            retired: want.retired.clone()
        }]
    );
}

/// A builder of one round of writes as the registry's (`src/registry/write.rs`, without
/// leases and ACLs): each write's patch minted against `base` (the view) and the round's
/// own overlay.
pub(super) fn builder(
    round: Vec<LocalWrite>,
    base: impl Fn(&InstanceKey) -> Option<InstanceRecord> + Send + 'static,
) -> BuildEvents {
    Box::new(move |mark: Mark| {
        let mut overlay = Overlay::default();
        let (mut built, mut seq) = (Built::default(), mark.seq);
        for w in round {
            let (event_id, commit_time_ms) = (w.event_id, w.time_ms);
            let (key, patch, owner) = w.into_patch();
            let judged = patch.judged();
            if let Minted::Op(op) =
                patch.apply(&key, &mut overlay, seq + 1, |k| base(k).map(Arc::new), judged)
            {
                seq += 1;
                if let Some(o) = owner {
                    built.owners.push((seq, o.into()));
                }
                let origin_dc = DC.to_owned();
                let origin_epoch = mark.epoch;
                built.events.push(ChangeEvent { event_id, origin_dc, origin_epoch, seq, commit_time_ms, op });
            }
        }
        built
    })
}

/// Today's single-node path for the same rounds: one committer round per Raft round, its
/// builder minting like the registry's (`src/registry/write.rs`, without leases and ACLs)
/// against a view that `on_commit` feeds.
fn reference(dir: &Path, rounds: &[Vec<LocalWrite>]) -> Dump {
    let steps: Vec<Step> = rounds.iter().cloned().map(Step::Local).collect();
    reference_steps(dir, &steps)
}

/// [`reference`] with group writes: each one the committer's request of the same kind.
pub(super) fn reference_steps(dir: &Path, steps: &[Step]) -> Dump {
    let log = RocksLog::create_with_epoch(dir, DC, EPOCH).unwrap();
    let view: Arc<Mutex<HashMap<InstanceKey, InstanceRecord>>> = Arc::default();
    let fed = view.clone();
    let on_commit = Box::new(move |n: &CommitNotice| {
        let mut v = fed.lock();
        for c in n.changes() {
            match c {
                StateChange::Put { record, .. } => v.insert(record.key.clone(), record.clone()),
                StateChange::Remove { key } => v.remove(key),
            };
        }
    });
    let (mut inline, handle) = Committer::inline(log, on_commit, CommitterLimits::default());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for step in steps {
        let round = match step {
            Step::Local(round) => round,
            Step::Group(write) => {
                // The answer is ignored: refusals change nothing on either side.
                let request = group_request(write.clone());
                rt.block_on(handle.send(request)).unwrap();
                inline.run_until_idle();
                continue;
            }
        };
        let view = view.clone();
        let build = builder(round.clone(), move |k: &InstanceKey| view.lock().get(k).cloned());
        let (reply, answer) = tokio::sync::oneshot::channel();
        rt.block_on(handle.send(Request::local_append(build, None, reply))).unwrap();
        inline.run_until_idle();
        answer.blocking_recv().unwrap().unwrap();
    }
    dump(&inline.into_log())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random rounds (with blank entries between some) applied on two state machines, one
    /// entry per call on one and all in one call on the other, give byte-identical state,
    /// with gapless seqs; and the same events, state and owners as today's committer.
    #[test]
    fn random_rounds_give_the_same_state_everywhere_and_match_the_committer(
        rounds in prop::collection::vec(prop::collection::vec((0u8..6, 0u8..4, 0u8..6), 0..6), 1..7),
        blanks in prop::collection::vec(any::<bool>(), 7),
    ) {
        let mut n = 0;
        let mut writes = Vec::new();
        for round in &rounds {
            let mut ws = Vec::new();
            for &(kind, k, p) in round {
                n += 1;
                ws.push(write_of(n, kind, k, p));
            }
            writes.push(ws);
        }
        let mut entries = vec![membership(1)];
        for (round, blank) in writes.iter().zip(&blanks) {
            if *blank {
                entries.push(entry(entries.len() as u64 + 1, EntryPayload::Blank));
            }
            entries.push(normal(entries.len() as u64 + 1, round));
        }
        let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
        let (a, b) = apply_on_two(&dirs, &entries);
        prop_assert_eq!(export(&a), export(&b));
        let state = a.with_log(dump);
        let seqs: Vec<u64> = state.events.iter().map(|e| e.seq).collect();
        prop_assert_eq!(seqs, (1..=state.own.seq).collect::<Vec<_>>());
        prop_assert_eq!(state, reference(dirs[2].path(), &writes));
    }
}

/// The committer's request for a group write, its answer dropped.
pub(super) fn group_request<L: crate::store::CommitLog + 'static>(write: GroupWrite) -> Request<L> {
    fn reply<T>() -> crate::store::Reply<T> {
        tokio::sync::oneshot::channel().0
    }
    match write {
        GroupWrite::Remote { channel_dc, events } => {
            Request::RemoteApply { channel_dc, events, reply: reply() }
        }
        GroupWrite::RemoteSnapshot { channel_dc, snapshot } => {
            Request::InstallSnapshot { channel_dc, snapshot, reply: reply() }
        }
        GroupWrite::StageChunk { channel_dc, chunk } => {
            Request::StageChunk { channel_dc, chunk, reply: reply() }
        }
        GroupWrite::PurgeOwn { upto_seq } => Request::PurgeOwn { upto_seq, reply: reply() },
        GroupWrite::PurgeRemoteTombstones { origin, upto_seq } => {
            Request::PurgeRemoteTombstones { origin, upto_seq, reply: reply() }
        }
        GroupWrite::PeerAck { peer, mark } => Request::PeerAck { peer, mark, reply: reply() },
        GroupWrite::Retire { dc, at_ms } => Request::Retire { dc, at_ms, reply: reply() },
        GroupWrite::Unretire { dc } => Request::Unretire { dc, reply: reply() },
        // What the node asks of its committer for these (its `begin_epoch`, and the
        // rescope at start, which runs on the log before the committer).
        GroupWrite::BeginEpoch { above, tiebreak } => Request::WithLog(Box::new(move |log: &mut L| {
            let own = log.own_mark();
            if own.epoch <= above {
                let _ = log.begin_epoch(tandem_replicator::epoch::above(above.max(own.epoch), tiebreak));
            }
        })),
        GroupWrite::Rescope { origin, scope } => Request::WithLog(Box::new(move |log: &mut L| {
            let _ = log.rescope(&origin, &scope);
        })),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Histories of local rounds and group writes (the peer's batches, acknowledgements,
    /// purges, retirements, epoch changes, scopes) applied on two state machines, one entry per call and all in
    /// one call, give byte-identical state; the same state (events, instances, tombstones,
    /// owners, purge floor, marks, acknowledgements, retirements) as the committer serving
    /// the same requests; and after a reopen the applied id of the last entry, so nothing
    /// is applied twice.
    #[test]
    fn group_writes_apply_as_the_committer_serves_them(
        picks in prop::collection::vec((0u8..10, any::<u8>(), any::<u8>()), 1..24),
    ) {
        let steps = history(&picks);
        let mut entries = vec![membership(1)];
        for step in &steps {
            let index = entries.len() as u64 + 1;
            entries.push(match step {
                Step::Local(writes) => normal(index, writes),
                Step::Group(write) => entry(index, EntryPayload::Normal(Round::of_group_write(write).unwrap())),
            });
        }
        let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
        let (a, b) = apply_on_two(&dirs, &entries);
        prop_assert_eq!(export(&a), export(&b));
        prop_assert_eq!(a.with_log(dump), reference_steps(dirs[2].path(), &steps));
        drop(a);
        let reopened = open(dirs[0].path());
        let (applied, _) = block(reopened.clone().applied_state()).unwrap();
        prop_assert_eq!(applied.map(|l| l.index), Some(entries.len() as u64));
    }
}

/// A group write in a round with others is refused whole, the same on every member; a
/// refused group write (a peer batch on the own channel) still advances the applied id,
/// and the hook hears of every applied group write.
#[test]
fn a_group_write_is_alone_in_its_round_and_a_refused_one_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let sm = open(dir.path());
    let heard: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let ear = heard.clone();
    sm.on_apply(Box::new(move |n: &CommitNotice| {
        let kind = match &n.committed {
            crate::store::Committed::Local { .. } => "local",
            crate::store::Committed::Remote { .. } => "remote",
            crate::store::Committed::Retired { .. } => "retired",
            _ => "other",
        };
        ear.lock().push((n.index, kind.to_owned()));
    }));
    let remote = GroupWrite::Remote { channel_dc: PEER.into(), events: vec![peer_event(1, 0, false)] };
    let mixed = Round::new([write_of(1, 0, 0, 0).encode(), remote.encode()]);
    let own_channel = GroupWrite::Remote { channel_dc: DC.into(), events: vec![peer_event(1, 0, false)] };
    let group = |index, w: &GroupWrite| entry(index, EntryPayload::Normal(Round::of_group_write(w).unwrap()));
    let answers = apply(
        &sm,
        vec![
            entry(1, EntryPayload::Normal(mixed)),
            group(2, &own_channel),
            group(3, &remote),
            group(4, &GroupWrite::Retire { dc: PEER.into(), at_ms: 5 }),
        ],
    )
    .unwrap();
    let outcomes: Vec<Vec<WriteOutcome>> = answers.into_iter().map(|a| a.outcomes).collect();
    assert!(
        matches!(&outcomes[0][..], [WriteOutcome::Refused { reason }, WriteOutcome::Refused { .. }] if reason.contains("alone"))
    );
    // The committer's own answers: the log's error, the report (its changes left out).
    assert!(
        matches!(
            &outcomes[1][..],
            [WriteOutcome::GroupRefused(LogError::Refused(
                tandem_replicator::merge::Refusal::WrongChannel { .. }
            ))]
        ),
        "{outcomes:?}"
    );
    let merged = ApplyReport { applied: 1, mark: Some(Mark { epoch: 5, seq: 1 }), ..ApplyReport::default() };
    assert_eq!(outcomes[2], vec![WriteOutcome::Group(GroupOutcome::Merged(merged))]);
    assert!(
        matches!(&outcomes[3][..], [WriteOutcome::Group(GroupOutcome::Retired(r))] if r.newly && r.at_ms == 5 && r.changes.is_empty()),
        "{outcomes:?}"
    );
    let state = sm.with_log(dump);
    assert_eq!(state.own.seq, 0, "the refused round minted nothing");
    assert!(state.instances.is_empty(), "the retirement removed the peer's copy");
    assert_eq!(state.retired.get(PEER), Some(&5));
    assert_eq!(sm.applied_index(), 4);
    let heard = heard.lock().clone();
    assert_eq!(
        heard,
        vec![(1, "local".into()), (2, "local".into()), (3, "remote".into()), (4, "retired".into())]
    );
}

proptest! {
    /// The changes a snapshot install reports turn the view of the state before into the
    /// state after, whatever both hold.
    #[test]
    fn a_replaced_state_is_reported_as_its_difference(
        before in proptest::collection::btree_map(0u8..12, (1u64..5, 1u16..4), 0..12),
        after in proptest::collection::btree_map(0u8..12, (1u64..5, 1u16..4), 0..12),
    ) {
        let live = |m: &std::collections::BTreeMap<u8, (u64, u16)>| -> Vec<(u64, InstanceRecord)> {
            m.iter().map(|(k, (seq, port))| (*seq, record(*k, *port))).collect()
        };
        let mut view: std::collections::BTreeMap<InstanceKey, (u64, InstanceRecord)> =
            live(&before).into_iter().map(|(seq, r)| (r.key.clone(), (seq, r))).collect();
        for change in super::state_machine::difference(live(&before), live(&after)) {
            match change {
                StateChange::Put { seq, record } => view.insert(record.key.clone(), (seq, record)),
                StateChange::Remove { key } => view.remove(&key),
            };
        }
        let want: std::collections::BTreeMap<_, _> =
            live(&after).into_iter().map(|(seq, r)| (r.key.clone(), (seq, r))).collect();
        // Same seq means same record in a log (a seq is minted once); the difference
        // relies on it, so the check compares keys and seqs.
        let seqs = |m: &std::collections::BTreeMap<InstanceKey, (u64, InstanceRecord)>| -> Vec<(InstanceKey, u64)> {
            m.iter().map(|(k, (s, _))| (k.clone(), *s)).collect()
        };
        prop_assert_eq!(seqs(&view), seqs(&want));
    }
}
