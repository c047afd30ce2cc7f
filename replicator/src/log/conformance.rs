//! Conformance checks every [`EventLog`] implementation must pass.
//!
//! Each check is a named function over a [`Harness`] that opens fresh logs and reopens
//! them as after a crash. Use [`conformance_tests!`](crate::conformance_tests) to turn the
//! whole suite into `#[test]` functions for an implementation.

use tandem_schemas::{
    ChangeEvent, DeregisterReason, Health, InstanceKey, InstanceRecord, Mark, Op, Snapshot, SnapshotChunk,
    StagedSnapshot, Status,
};

use super::{ChunkOutcome, EventLog, LogError, Rescope};
use crate::merge::{Held, Refusal};
use crate::scope::Scope;

/// Opens logs for the checks.
pub trait Harness {
    type Log: EventLog;
    /// A fresh, empty log for `dc` with the given epoch.
    fn fresh(&mut self, dc: &str, epoch: u64) -> Self::Log;
    /// Closes `log` without any orderly shutdown and opens it again from its storage.
    fn reopen(&mut self, log: Self::Log) -> Self::Log;
}

pub fn key(owner: &str, id: &str) -> InstanceKey {
    InstanceKey {
        owner_dc: owner.into(),
        namespace: "default".into(),
        service: "svc".into(),
        instance_id: id.into(),
    }
}

pub fn record(owner: &str, id: &str) -> InstanceRecord {
    InstanceRecord {
        key: key(owner, id),
        address: "10.0.0.1".into(),
        port: 8080,
        zone: "z1".into(),
        weight: 100,
        app_version: "1.0".into(),
        tags: vec!["t".into()],
        metadata: [("k".to_string(), "v".to_string())].into_iter().collect(),
        persistent: false,
        lease_ttl_ms: 30_000,
        status: Status::Up,
        health: Health::Healthy,
        damped: false,
    }
}

pub fn ev(origin: &str, epoch: u64, seq: u64, op: Op) -> ChangeEvent {
    ChangeEvent {
        event_id: uuid::Uuid::from_u128(u128::from(seq)),
        origin_dc: origin.into(),
        origin_epoch: epoch,
        seq,
        commit_time_ms: 1_000 + seq,
        op,
    }
}

pub fn reg(origin: &str, epoch: u64, seq: u64, id: &str) -> ChangeEvent {
    ev(origin, epoch, seq, Op::Register(record(origin, id)))
}

pub fn dereg(origin: &str, epoch: u64, seq: u64, id: &str) -> ChangeEvent {
    ev(origin, epoch, seq, Op::Deregister { key: key(origin, id), reason: DeregisterReason::Explicit })
}

/// Appending own events advances the own mark and materializes their effects.
pub fn append<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-a", 11);
    assert_eq!(log.own_mark(), Mark { epoch: 11, seq: 0 });
    log.append_local(&[reg("dc-a", 11, 1, "i1"), reg("dc-a", 11, 2, "i2")]).unwrap();
    log.append_local(&[dereg("dc-a", 11, 3, "i1")]).unwrap();
    assert_eq!(log.own_mark(), Mark { epoch: 11, seq: 3 });
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Tombstone { seq: 3 });
    assert_eq!(log.held(&key("dc-a", "i2")), Held::Live { seq: 2 });
    // A gap, a repeat or another epoch is refused and changes nothing.
    for bad in [reg("dc-a", 11, 5, "x"), reg("dc-a", 11, 3, "x"), reg("dc-a", 12, 4, "x")] {
        assert!(matches!(log.append_local(&[bad]), Err(LogError::OutOfSequence { .. })));
    }
    assert_eq!(log.own_mark(), Mark { epoch: 11, seq: 3 });
    assert_eq!(log.held(&key("dc-a", "x")), Held::Absent);
    // An event a peer would refuse is never written: a key another DC owns, a record
    // over a field limit. The whole append is refused, the valid events with it.
    let mut heavy = record("dc-a", "x");
    heavy.weight = u32::MAX;
    let foreign = ev("dc-a", 11, 5, Op::Register(record("dc-b", "y")));
    for bad in [foreign, ev("dc-a", 11, 5, Op::Update(heavy))] {
        let r = log.append_local(&[reg("dc-a", 11, 4, "x"), bad]);
        assert!(matches!(r, Err(LogError::Invalid(_))), "{r:?}");
    }
    assert_eq!(log.own_mark(), Mark { epoch: 11, seq: 3 });
    assert_eq!(log.held(&key("dc-a", "x")), Held::Absent);
    assert_eq!(log.read_own(3, 10).unwrap(), vec![]);
}

/// Reading a range returns exactly the requested consecutive events.
pub fn range_read<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-a", 1);
    let evs: Vec<_> = (1..=20).map(|s| reg("dc-a", 1, s, &format!("i{s}"))).collect();
    log.append_local(&evs).unwrap();
    let got = log.read_own(5, 4).unwrap();
    assert_eq!(got, evs[5..9].to_vec());
    assert_eq!(log.read_own(20, 10).unwrap(), vec![]);
    assert_eq!(log.read_own(0, 100).unwrap().len(), 20);
}

/// A remote batch changes state and the origin's mark together; a refused event stops the
/// batch and leaves state and mark exactly at the last accepted event.
pub fn atomicity_with_state<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-b", 2);
    let rep = log.apply_remote("dc-a", &[reg("dc-a", 7, 1, "i1"), reg("dc-a", 7, 2, "i2")]).unwrap();
    assert_eq!(rep.applied, 2);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 2 }));
    // Gap at seq 5: seq 3 applies, the rest does not.
    let rep = log
        .apply_remote("dc-a", &[dereg("dc-a", 7, 3, "i1"), reg("dc-a", 7, 5, "i5"), reg("dc-a", 7, 6, "i6")])
        .unwrap();
    assert_eq!(rep.applied, 1);
    assert_eq!(rep.refusal, Some(Refusal::Gap { expected: 4, got: 5 }));
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 3 }));
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Tombstone { seq: 3 });
    assert_eq!(log.held(&key("dc-a", "i5")), Held::Absent);
    // Duplicates change nothing, even the stale register of a tombstoned key.
    let rep = log.apply_remote("dc-a", &[reg("dc-a", 7, 1, "i1")]).unwrap();
    assert_eq!(rep.duplicates, 1);
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Tombstone { seq: 3 });
    // Wrong channel: refused, nothing changes.
    let rep = log.apply_remote("dc-c", &[reg("dc-a", 7, 4, "i4")]).unwrap();
    assert!(matches!(rep.refusal, Some(Refusal::WrongChannel { .. })));
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 3 }));
    assert_eq!(log.mark_of("dc-c"), None);
    // The own origin can never be applied as remote.
    assert!(log.apply_remote("dc-b", &[reg("dc-b", 2, 1, "x")]).is_err());
    let n = log.instances().unwrap().len();
    assert_eq!(n, 1);
}

/// Everything acknowledged survives a crash and a reopen, byte for byte.
pub fn crash_reopen<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-a", 5);
    log.append_local(&[reg("dc-a", 5, 1, "i1"), reg("dc-a", 5, 2, "i2"), dereg("dc-a", 5, 3, "i1")]).unwrap();
    log.apply_remote("dc-b", &[reg("dc-b", 9, 1, "r1"), dereg("dc-b", 9, 2, "r1"), reg("dc-b", 9, 3, "r2")])
        .unwrap();
    let before_inst = log.instances().unwrap();
    let before_tomb = log.tombstones().unwrap();
    let before_events = log.read_own(0, 100).unwrap();
    let log = h.reopen(log);
    assert_eq!(log.own_mark(), Mark { epoch: 5, seq: 3 });
    assert_eq!(log.mark_of("dc-b"), Some(Mark { epoch: 9, seq: 3 }));
    assert_eq!(log.instances().unwrap(), before_inst);
    assert_eq!(log.tombstones().unwrap(), before_tomb);
    assert_eq!(log.read_own(0, 100).unwrap(), before_events);
    assert_eq!(log.held(&key("dc-b", "r1")), Held::Tombstone { seq: 2 });
}

/// Purging removes own entries and tombstones at or below the floor, nothing above it;
/// reads below the floor report `Purged`; a snapshot still describes the whole state.
pub fn purge_floor<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-a", 3);
    log.append_local(&[
        reg("dc-a", 3, 1, "i1"),
        dereg("dc-a", 3, 2, "i1"),
        reg("dc-a", 3, 3, "i3"),
        dereg("dc-a", 3, 4, "i3"),
        reg("dc-a", 3, 5, "i5"),
    ])
    .unwrap();
    log.purge_own(2).unwrap();
    assert_eq!(log.purge_floor(), 2);
    assert!(matches!(log.read_own(1, 10), Err(LogError::Purged { floor: 2 })));
    assert_eq!(log.read_own(2, 10).unwrap().len(), 3);
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Absent);
    assert_eq!(log.held(&key("dc-a", "i3")), Held::Tombstone { seq: 4 });
    // The floor never moves back and survives a reopen.
    log.purge_own(1).unwrap();
    assert_eq!(log.purge_floor(), 2);
    let log = h.reopen(log);
    assert_eq!(log.purge_floor(), 2);
    let snap = log.snapshot_own().unwrap();
    assert_eq!(snap.mark, Mark { epoch: 3, seq: 5 });
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.tombstones.len(), 1);
}

/// A snapshot replaces everything of its origin it does not hold, and a regressing one is
/// refused.
pub fn snapshot_install<H: Harness>(h: &mut H) {
    let mut src = h.fresh("dc-a", 4);
    src.append_local(&[reg("dc-a", 4, 1, "keep"), reg("dc-a", 4, 2, "gone"), dereg("dc-a", 4, 3, "gone")])
        .unwrap();
    let mut dst = h.fresh("dc-b", 8);
    // The receiver holds a zombie of an older epoch and an unrelated origin's instance.
    dst.apply_remote("dc-a", &[reg("dc-a", 1, 1, "zombie")]).unwrap();
    dst.apply_remote("dc-c", &[reg("dc-c", 1, 1, "other")]).unwrap();
    src.purge_own(3).unwrap();
    let snap = src.snapshot_own().unwrap();
    let rep = dst.install_snapshot("dc-a", &snap).unwrap();
    assert_eq!(rep.mark, Some(Mark { epoch: 4, seq: 3 }));
    assert_eq!(dst.held(&key("dc-a", "zombie")), Held::Absent);
    assert_eq!(dst.held(&key("dc-a", "keep")), Held::Live { seq: 1 });
    assert_eq!(dst.held(&key("dc-c", "other")), Held::Live { seq: 1 });
    // The tail continues after the snapshot.
    src.append_local(&[dereg("dc-a", 4, 4, "keep")]).unwrap();
    dst.apply_remote("dc-a", &src.read_own(3, 10).unwrap()).unwrap();
    assert_eq!(dst.held(&key("dc-a", "keep")), Held::Tombstone { seq: 4 });
    // An older snapshot of the same epoch is refused.
    assert!(matches!(
        dst.install_snapshot("dc-a", &snap),
        Err(LogError::Refused(Refusal::CursorRegressed { .. }))
    ));
    let dst = h.reopen(dst);
    assert_eq!(dst.mark_of("dc-a"), Some(Mark { epoch: 4, seq: 4 }));
}

/// Merge rule 6: an origin's events outside its replication scope consume their seqs and
/// write nothing; a snapshot installs only its in-scope part; the scope survives a reopen;
/// narrowing it removes the copies outside it, widening it moves the mark to seq 0 of its
/// epoch so the origin resends, and the resent events fill in what was skipped.
pub fn replication_scope<H: Harness>(h: &mut H) {
    let in_ns = |mut e: ChangeEvent, ns: &str| {
        match &mut e.op {
            Op::Register(r) | Op::Update(r) => r.key.namespace = ns.into(),
            Op::Deregister { key, .. } => key.namespace = ns.into(),
        }
        e
    };
    let key_in = |id: &str, ns: &str| InstanceKey { namespace: ns.into(), ..key("dc-a", id) };
    let mut log = h.fresh("dc-b", 8);
    assert_eq!(log.scope_of("dc-a"), Scope::All);
    let only_default = Scope::only(["default"]);
    let r = log.rescope("dc-a", &only_default).unwrap();
    assert!(!r.mark_reset && r.changes.is_empty());
    let events = vec![
        reg("dc-a", 7, 1, "i1"),
        in_ns(reg("dc-a", 7, 2, "j1"), "b"),
        in_ns(reg("dc-a", 7, 3, "j2"), "b"),
        in_ns(dereg("dc-a", 7, 4, "j2"), "b"),
    ];
    let rep = log.apply_remote("dc-a", &events).unwrap();
    assert_eq!((rep.applied, rep.out_of_scope, rep.refusal.clone()), (1, 3, None));
    assert_eq!(rep.out_of_scope_namespace.as_deref(), Some("b"));
    assert_eq!(rep.mark, Some(Mark { epoch: 7, seq: 4 }));
    assert_eq!(log.held(&key_in("j1", "b")), Held::Absent);
    assert_eq!(log.held(&key_in("j2", "b")), Held::Absent);
    let mut log = h.reopen(log);
    assert_eq!(log.scope_of("dc-a"), only_default);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 4 }));
    // After a reopen the scope still holds; the same scope again changes nothing.
    let tail = [in_ns(reg("dc-a", 7, 5, "j3"), "b")];
    assert_eq!(log.apply_remote("dc-a", &tail).unwrap().out_of_scope, 1);
    assert_eq!(log.held(&key_in("j3", "b")), Held::Absent);
    assert_eq!(
        log.rescope("dc-a", &only_default).unwrap(),
        Rescope { was: only_default.clone(), ..Default::default() }
    );
    // Widening: the mark goes back to seq 0 of its epoch, the in-scope copy stays, and the
    // origin's resent history fills in what was skipped.
    let r = log.rescope("dc-a", &Scope::All).unwrap();
    assert!(r.mark_reset && r.changes.is_empty());
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 0 }));
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Live { seq: 1 });
    let mut log = h.reopen(log);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 0 }));
    let mut all = events.clone();
    all.extend(tail.iter().cloned());
    let rep = log.apply_remote("dc-a", &all).unwrap();
    assert_eq!((rep.applied, rep.superseded, rep.out_of_scope), (4, 1, 0));
    assert_eq!(log.held(&key_in("j1", "b")), Held::Live { seq: 2 });
    assert_eq!(log.held(&key_in("j2", "b")), Held::Tombstone { seq: 4 });
    assert_eq!(log.held(&key_in("j3", "b")), Held::Live { seq: 5 });
    // Narrowing: copies and tombstones outside the scope go, the mark stays.
    let r = log.rescope("dc-a", &only_default).unwrap();
    assert!(!r.mark_reset);
    assert_eq!(r.changes.len(), 2);
    assert_eq!(r.tombstones_removed, 1);
    assert_eq!(log.held(&key_in("j1", "b")), Held::Absent);
    assert_eq!(log.held(&key_in("j2", "b")), Held::Absent);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 7, seq: 5 }));
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Live { seq: 1 });
    // A snapshot installs only its in-scope part.
    let mut src = h.fresh("dc-a", 9);
    src.append_local(&[reg("dc-a", 9, 1, "s1"), in_ns(reg("dc-a", 9, 2, "s2"), "b")]).unwrap();
    let rep = log.install_snapshot("dc-a", &src.snapshot_own().unwrap()).unwrap();
    assert_eq!((rep.applied, rep.out_of_scope), (1, 1));
    assert_eq!(log.held(&key("dc-a", "s1")), Held::Live { seq: 1 });
    assert_eq!(log.held(&key_in("s2", "b")), Held::Absent);
    assert_eq!(log.held(&key("dc-a", "i1")), Held::Absent);
    let log = h.reopen(log);
    assert_eq!(log.scope_of("dc-a"), only_default);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 9, seq: 2 }));
}

/// Event ids at marks and at the floor, and a new epoch, survive a reopen; a new epoch
/// keeps the state, continues the seqs, purges the log and only moves up.
pub fn epochs_and_event_ids<H: Harness>(h: &mut H) {
    let mut log = h.fresh("dc-b", 3);
    // The receiver remembers the id of the event at its mark; a snapshot forgets it.
    let batch = [reg("dc-a", 7, 1, "i1"), reg("dc-a", 7, 2, "i2")];
    log.apply_remote("dc-a", &batch).unwrap();
    assert_eq!(log.mark_event_id("dc-a"), Some(batch[1].event_id));
    // The own log answers ids by seq, and remembers the one at the purge floor.
    log.append_local(&[reg("dc-b", 3, 1, "o1"), reg("dc-b", 3, 2, "o2"), reg("dc-b", 3, 3, "o3")]).unwrap();
    let id_at = |seq| ev("dc-b", 3, seq, Op::Register(record("dc-b", "x"))).event_id;
    assert_eq!(log.own_event_id(2).unwrap(), Some(id_at(2)));
    log.purge_own(2).unwrap();
    assert_eq!(log.own_event_id(2).unwrap(), Some(id_at(2)));
    assert_eq!(log.own_event_id(1).unwrap(), None);
    let mut log = h.reopen(log);
    assert_eq!(log.mark_event_id("dc-a"), Some(batch[1].event_id));
    assert_eq!(log.own_event_id(2).unwrap(), Some(id_at(2)));
    assert_eq!(log.own_event_id(3).unwrap(), Some(id_at(3)));
    // A new epoch: only upwards; state kept, log purged to the own seq, seqs continue.
    assert!(matches!(log.begin_epoch(3), Err(LogError::EpochNotAbove { current: 3, requested: 3 })));
    log.begin_epoch(1 << 30).unwrap();
    assert_eq!(log.own_mark(), Mark { epoch: 1 << 30, seq: 3 });
    assert_eq!(log.purge_floor(), 3);
    assert_eq!(log.held(&key("dc-b", "o3")), Held::Live { seq: 3 });
    assert!(matches!(log.read_own(0, 10), Err(LogError::Purged { floor: 3 })));
    log.append_local(&[reg("dc-b", 1 << 30, 4, "o4")]).unwrap();
    let mut log = h.reopen(log);
    assert_eq!(log.own_mark(), Mark { epoch: 1 << 30, seq: 4 });
    assert_eq!(log.read_own(3, 10).unwrap().len(), 1);
    assert_eq!(log.snapshot_own().unwrap().mark, Mark { epoch: 1 << 30, seq: 4 });
    let snap = Snapshot {
        origin_dc: "dc-a".into(),
        mark: Mark { epoch: 9, seq: 2 },
        instances: vec![],
        tombstones: vec![],
    };
    log.install_snapshot("dc-a", &snap).unwrap();
    assert_eq!(log.mark_event_id("dc-a"), None);
    // A snapshot of an older epoch than the one followed is refused.
    let old = Snapshot { mark: Mark { epoch: 8, seq: 50 }, ..snap };
    assert!(matches!(
        log.install_snapshot("dc-a", &old),
        Err(LogError::Refused(Refusal::EpochRegressed { .. }))
    ));
    let log = h.reopen(log);
    assert_eq!(log.mark_event_id("dc-a"), None);
    assert_eq!(log.mark_of("dc-a"), Some(Mark { epoch: 9, seq: 2 }));
}

/// A snapshot read in chunks and staged chunk by chunk: staging survives a crash and leaves
/// the state alone; redeliveries are no-ops, gaps are refused, chunk 0 of another snapshot
/// starts over; the last chunk installs exactly what a single-frame install would.
pub fn snapshot_chunks<H: Harness>(h: &mut H) {
    let mut src = h.fresh("dc-a", 4);
    let evs: Vec<_> = (1..=30).map(|s| reg("dc-a", 4, s, &format!("i{s:02}"))).collect();
    src.append_local(&evs).unwrap();
    src.append_local(&[dereg("dc-a", 4, 31, "i03"), dereg("dc-a", 4, 32, "i07")]).unwrap();
    src.purge_own(30).unwrap();
    // A budget of about two records per chunk.
    let budget = 2 * tandem_schemas::encode(&src.instances().unwrap()[0]).len() + 1;
    let mut reader = src.open_snapshot(budget).unwrap();
    assert_eq!(reader.mark(), Mark { epoch: 4, seq: 32 });
    // The cut holds while the log goes on.
    src.append_local(&[reg("dc-a", 4, 33, "late")]).unwrap();
    let mut chunks: Vec<SnapshotChunk> = Vec::new();
    for index in 0.. {
        let c = reader.read_chunk(index).unwrap();
        let bytes: usize = c.instances.iter().map(|i| tandem_schemas::encode(i).len()).sum::<usize>()
            + c.tombstones.iter().map(|t| tandem_schemas::encode(t).len()).sum::<usize>();
        assert!(
            bytes <= budget || c.instances.len() + c.tombstones.len() == 1,
            "chunk {index} is over budget"
        );
        assert!(!c.instances.is_empty() || !c.tombstones.is_empty(), "chunk {index} is empty");
        let last = c.last;
        chunks.push(c);
        if last {
            break;
        }
    }
    assert!(chunks.len() >= 10, "{} chunks", chunks.len());
    let staged_ids: Vec<_> =
        chunks.iter().flat_map(|c| c.instances.iter().map(|i| i.record.key.clone())).collect();
    assert!(!staged_ids.contains(&key("dc-a", "late")), "the cut must not see later writes");
    // A chunk read again (a resume) is the same chunk; a new reader of the same cut too.
    assert_eq!(reader.read_chunk(3).unwrap(), chunks[3]);

    let mut dst = h.fresh("dc-b", 8);
    dst.apply_remote("dc-a", &[reg("dc-a", 1, 1, "zombie")]).unwrap();
    dst.apply_remote("dc-c", &[reg("dc-c", 1, 1, "other")]).unwrap();
    let before = (dst.instances().unwrap(), dst.tombstones().unwrap(), dst.marks());
    let id = chunks[0].snapshot_id;
    for c in &chunks[..5] {
        assert!(matches!(dst.stage_snapshot_chunk("dc-a", c).unwrap(), ChunkOutcome::Staged(_)));
    }
    let dst_after_crash = h.reopen(dst);
    let mut dst = dst_after_crash;
    assert_eq!(dst.staged_snapshot("dc-a").unwrap(), Some(StagedSnapshot { snapshot_id: id, chunks: 5 }));
    assert_eq!(
        (dst.instances().unwrap(), dst.tombstones().unwrap(), dst.marks()),
        before,
        "staging changed state"
    );
    // A redelivered chunk changes nothing; a gap is refused.
    assert_eq!(
        dst.stage_snapshot_chunk("dc-a", &chunks[2]).unwrap(),
        ChunkOutcome::Staged(StagedSnapshot { snapshot_id: id, chunks: 5 })
    );
    assert!(matches!(
        dst.stage_snapshot_chunk("dc-a", &chunks[7]),
        Err(LogError::Refused(Refusal::Gap { .. }))
    ));
    // Chunk 0 of another snapshot starts the staging over; a later chunk of it is a gap.
    let other = SnapshotChunk { snapshot_id: id ^ 1, ..chunks[0].clone() };
    assert!(matches!(dst.stage_snapshot_chunk("dc-a", &other).unwrap(), ChunkOutcome::Staged(_)));
    assert_eq!(dst.staged_snapshot("dc-a").unwrap(), Some(StagedSnapshot { snapshot_id: id ^ 1, chunks: 1 }));
    assert!(dst.stage_snapshot_chunk("dc-a", &chunks[1]).is_err());
    // Chunks of the own origin or of another owner are refused.
    assert!(dst.stage_snapshot_chunk("dc-b", &chunks[0]).is_err());
    assert!(dst.stage_snapshot_chunk("dc-c", &chunks[0]).is_err());
    // Stage the real one from the start, crash once more before the end, then finish.
    let mut outcome = None;
    for (i, c) in chunks.iter().enumerate() {
        if i == chunks.len() - 1 {
            dst = h.reopen(dst);
            assert_eq!((dst.instances().unwrap(), dst.tombstones().unwrap(), dst.marks()), before);
        }
        outcome = Some(dst.stage_snapshot_chunk("dc-a", c).unwrap());
    }
    let Some(ChunkOutcome::Installed(report)) = outcome else { panic!("the last chunk must install") };
    assert_eq!(report.mark, Some(Mark { epoch: 4, seq: 32 }));
    assert_eq!(dst.staged_snapshot("dc-a").unwrap(), None);
    // Exactly what a whole install of the same cut gives.
    let mut whole = h.fresh("dc-b", 8);
    whole.apply_remote("dc-a", &[reg("dc-a", 1, 1, "zombie")]).unwrap();
    whole.apply_remote("dc-c", &[reg("dc-c", 1, 1, "other")]).unwrap();
    let mut snap = tandem_schemas::Snapshot {
        origin_dc: "dc-a".into(),
        mark: chunks[0].mark,
        instances: vec![],
        tombstones: vec![],
    };
    for c in &chunks {
        snap.instances.extend(c.instances.iter().cloned());
        snap.tombstones.extend(c.tombstones.iter().cloned());
    }
    let whole_report = whole.install_snapshot("dc-a", &snap).unwrap();
    assert_eq!(report, whole_report);
    assert_eq!(dst.instances().unwrap(), whole.instances().unwrap());
    assert_eq!(dst.tombstones().unwrap(), whole.tombstones().unwrap());
    assert_eq!(dst.held(&key("dc-a", "zombie")), Held::Absent);
    assert_eq!(dst.held(&key("dc-c", "other")), Held::Live { seq: 1 });
    assert_eq!(dst.held(&key("dc-a", "i07")), Held::Tombstone { seq: 32 });
    let dst = h.reopen(dst);
    assert_eq!(dst.mark_of("dc-a"), Some(Mark { epoch: 4, seq: 32 }));
    assert_eq!(dst.staged_snapshot("dc-a").unwrap(), None);
}

/// Turns the suite into `#[test]` functions: `conformance_tests!(|| MyHarness::new());`
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        #[test]
        fn conformance_append() {
            $crate::log::conformance::append(&mut ($make)());
        }
        #[test]
        fn conformance_range_read() {
            $crate::log::conformance::range_read(&mut ($make)());
        }
        #[test]
        fn conformance_atomicity_with_state() {
            $crate::log::conformance::atomicity_with_state(&mut ($make)());
        }
        #[test]
        fn conformance_crash_reopen() {
            $crate::log::conformance::crash_reopen(&mut ($make)());
        }
        #[test]
        fn conformance_purge_floor() {
            $crate::log::conformance::purge_floor(&mut ($make)());
        }
        #[test]
        fn conformance_snapshot_install() {
            $crate::log::conformance::snapshot_install(&mut ($make)());
        }
        #[test]
        fn conformance_epochs_and_event_ids() {
            $crate::log::conformance::epochs_and_event_ids(&mut ($make)());
        }
        #[test]
        fn conformance_replication_scope() {
            $crate::log::conformance::replication_scope(&mut ($make)());
        }
        #[test]
        fn conformance_snapshot_chunks() {
            $crate::log::conformance::snapshot_chunks(&mut ($make)());
        }
    };
}

#[cfg(test)]
mod memlog {
    use super::Harness;
    use crate::log::MemLog;

    struct Mem;
    impl Harness for Mem {
        type Log = MemLog;
        fn fresh(&mut self, dc: &str, epoch: u64) -> MemLog {
            MemLog::new(dc, epoch)
        }
        fn reopen(&mut self, log: MemLog) -> MemLog {
            // The model has no volatile part: everything it holds is "durable".
            log
        }
    }

    crate::conformance_tests!(|| Mem);
}
