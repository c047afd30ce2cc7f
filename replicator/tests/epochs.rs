//! Directed scenarios of an origin whose history went back (a data dir restored from an
//! old copy, a VM rolled back) and of two incarnations of one DC alive at once, run with
//! the real [`Sender`] / [`Receiver`] over [`MemLog`] (issue 13 §1; docs/replication.md,
//! "Epochs").
//!
//! Each scenario drives the streams the way the gateway does: handshake, then frames until
//! the sender has nothing more to send.

use std::collections::BTreeMap;

use tandem_replicator::epoch;
use tandem_replicator::log::conformance::{ev, record};
use tandem_replicator::log::{ApplyReport, ChunkOutcome, EventLog, LogError, MemLog};
use tandem_replicator::protocol::{Receiver, ReceiverAction, Sender, SenderEvent, StreamError, StreamTuning};
use tandem_schemas::{DeregisterReason, Frame, InstanceRecord, Op};

/// Appends one own event of `origin` with an event id unique to (`tag`, seq): two
/// histories that reuse a seq mint different event ids, as UUIDv7s do.
fn write(log: &mut MemLog, tag: u128, op: Op) {
    let own = log.own_mark();
    let mut e = ev(log.local_dc(), own.epoch, own.seq + 1, op);
    e.event_id = uuid::Uuid::from_u128((tag << 64) | u128::from(own.seq + 1));
    log.append_local(&[e]).unwrap();
}

fn register(log: &mut MemLog, tag: u128, id: &str) {
    let dc = log.local_dc().to_owned();
    write(log, tag, Op::Register(record(&dc, id)));
}

fn deregister(log: &mut MemLog, tag: u128, id: &str) {
    let dc = log.local_dc().to_owned();
    write(log, tag, Op::Deregister { key: record(&dc, id).key, reason: DeregisterReason::Explicit });
}

/// Performs the receiver's actions for one frame on `log`; returns the frames it answers.
fn receive(log: &mut MemLog, receiver: &mut Receiver, frame: Frame) -> Result<Vec<Frame>, StreamError> {
    let origin = receiver.channel_dc().to_owned();
    let mut out = Vec::new();
    let actions = receiver.handle_frame(log.mark_of(&origin), log.mark_event_id(&origin), frame)?;
    for action in actions {
        match action {
            ReceiverAction::Send(f) => out.push(f),
            ReceiverAction::Apply { batch_id, events } => {
                let report = log.apply_remote(&origin, &events).unwrap();
                out.push(receiver.applied(batch_id, &report)?);
            }
            ReceiverAction::Install { batch_id, snapshot } => {
                let report = match log.install_snapshot(&origin, &snapshot) {
                    Ok(r) => r,
                    Err(LogError::Refused(r)) => ApplyReport { refusal: Some(r), ..Default::default() },
                    Err(e) => panic!("storage: {e}"),
                };
                out.push(receiver.applied(batch_id, &report)?);
            }
            ReceiverAction::StageChunk { batch_id, chunk } => match log.stage_snapshot_chunk(&origin, &chunk)
            {
                Ok(ChunkOutcome::Staged(_)) => {
                    out.push(receiver.chunk_staged(batch_id, chunk.snapshot_id, chunk.index))
                }
                Ok(ChunkOutcome::Installed(report)) => out.push(receiver.applied(batch_id, &report)?),
                Err(LogError::Refused(r)) => out.push(
                    receiver.applied(batch_id, &ApplyReport { refusal: Some(r), ..Default::default() })?,
                ),
                Err(e) => panic!("storage: {e}"),
            },
            ReceiverAction::PurgeTombstones { upto_seq } => {
                log.purge_remote_tombstones(&origin, upto_seq).unwrap()
            }
            ReceiverAction::Contact { .. } => {}
        }
    }
    Ok(out)
}

/// How one session of `origin` to `peer` ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The sender had nothing more to send.
    Idle,
    /// A side refused; the gateway would reconnect after a backoff.
    Refused(String),
    /// The origin took this new epoch (the gateway reconnects at once).
    NewEpoch(u64),
    /// The origin is fenced: it ships nothing more.
    Fenced(String),
}

/// One session: handshake, then every frame the sender has at `now_ms`.
fn session(origin: &mut MemLog, peer: &mut MemLog, now_ms: u64) -> Outcome {
    let (mut sender, hello) = Sender::new(&*origin, peer.local_dc(), StreamTuning::default(), now_ms);
    // A schema 2 peer: snapshots in chunks, resumed from what it staged.
    let staged = peer.staged_snapshot(origin.local_dc()).unwrap();
    let mut receiver = Receiver::chunked(peer.local_dc(), origin.local_dc(), staged);
    let mut inbox = vec![hello];
    loop {
        let mut answers = Vec::new();
        for f in inbox.drain(..) {
            match receive(peer, &mut receiver, f) {
                Ok(a) => answers.extend(a),
                // The receiver's refusal reaches the sender, as the gateway sends it.
                Err(e) => answers.push(e.to_frame()),
            }
        }
        for a in answers {
            match sender.handle_frame(&*origin, a) {
                Err(e) => return Outcome::Refused(e.to_string()),
                Ok(events) => {
                    for e in events {
                        match e {
                            SenderEvent::NewEpoch { above, .. } => {
                                // What the gateway's store does (NodeStore::begin_epoch).
                                let own = origin.own_mark().epoch;
                                if own <= above {
                                    origin.begin_epoch(epoch::above(above.max(own), now_ms)).unwrap();
                                }
                                return Outcome::NewEpoch(origin.own_mark().epoch);
                            }
                            SenderEvent::Fenced { reason } => return Outcome::Fenced(reason),
                            SenderEvent::PeerAcked(_)
                            | SenderEvent::SnapshotSent(_)
                            | SenderEvent::ChunkSent { .. }
                            | SenderEvent::ChunkAcked { .. }
                            | SenderEvent::LogUnreadable { .. } => {}
                        }
                    }
                }
            }
        }
        match sender.poll_transmit(&*origin, now_ms) {
            Ok(Some((f, _))) => inbox.push(f),
            // Snapshot chunks are read from their cut, off the log (as the gateway does).
            Ok(None) => match sender.poll_snapshot() {
                Ok(Some((f, _))) => inbox.push(f),
                Ok(None) => return Outcome::Idle,
                Err(e) => return Outcome::Refused(e.to_string()),
            },
            Err(e) => return Outcome::Refused(e.to_string()),
        }
    }
}

/// Reconnects (as the gateway's dial loop does) until a session ends idle, at most a few
/// times.
fn sync(origin: &mut MemLog, peer: &mut MemLog, now_ms: u64) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for attempt in 0..4 {
        let o = session(origin, peer, now_ms + attempt);
        let idle = matches!(o, Outcome::Idle | Outcome::Fenced(_));
        outcomes.push(o);
        if idle {
            break;
        }
    }
    outcomes
}

/// What `log` holds of `origin`: live instance ids.
fn live_of(log: &MemLog, origin: &str) -> Vec<String> {
    log.instances()
        .unwrap()
        .into_iter()
        .filter(|(_, r)| *r.key.owner_dc == *origin)
        .map(|(_, r)| r.key.instance_id.to_string())
        .collect()
}

fn records_of(log: &MemLog, origin: &str) -> BTreeMap<String, InstanceRecord> {
    log.instances()
        .unwrap()
        .into_iter()
        .filter(|(_, r)| *r.key.owner_dc == *origin)
        .map(|(_, r)| (r.key.instance_id.to_string(), r))
        .collect()
}

/// The peer holds exactly what dc-a holds of itself.
fn assert_same(peer: &MemLog, a: &MemLog) {
    assert_eq!(live_of(peer, "dc-a"), live_of(a, "dc-a"), "live instances of dc-a at the peer");
    assert_eq!(records_of(peer, "dc-a"), records_of(a, "dc-a"));
}

/// dc-a registers p1-p3; a copy of its data dir is taken; it registers q1-q5 and
/// deregisters p1, and dc-b applies all of it (seq 9). The copy is restored.
fn restored_world() -> (MemLog, MemLog) {
    let mut a = MemLog::new("dc-a", 5 << 20 | 77);
    for id in ["p1", "p2", "p3"] {
        register(&mut a, 1, id);
    }
    let copy = a.clone();
    for id in ["q1", "q2", "q3", "q4", "q5"] {
        register(&mut a, 1, id);
    }
    deregister(&mut a, 1, "p1");
    let mut b = MemLog::new("dc-b", 9 << 20 | 3);
    assert_eq!(sync(&mut a, &mut b, 0).last(), Some(&Outcome::Idle));
    assert_eq!(b.mark_of("dc-a").map(|m| m.seq), Some(9));
    (copy, b)
}

/// The restored dc-a meets dc-b before it writes (its seq 3 is below dc-b's mark 9), then
/// registers r1-r7 and meets dc-b again. dc-b must end with exactly dc-a's instances: no
/// q1-q5 (dc-a has no record of them: they would be permanent zombies) and all of r1-r7.
#[test]
fn restored_origin_meets_the_peer_before_passing_its_mark() {
    let (mut a, mut b) = restored_world();
    let before = a.own_mark().epoch;
    let outcomes = sync(&mut a, &mut b, 1_000);
    assert!(matches!(outcomes[0], Outcome::NewEpoch(e) if e > before), "{outcomes:?}");
    assert_eq!(outcomes.last(), Some(&Outcome::Idle));
    assert_same(&b, &a);
    for id in ["r1", "r2", "r3", "r4", "r5", "r6", "r7"] {
        register(&mut a, 2, id);
    }
    sync(&mut a, &mut b, 2_000);
    assert_same(&b, &a);
}

/// The restored dc-a is partitioned from dc-b while it registers r1-r7 (its seq 10 passes
/// dc-b's mark 9 in the same epoch), then the partition heals. The event at dc-b's mark
/// (seq 9, "deregister p1") is not the restored log's seq 9 ("register r6").
#[test]
fn restored_origin_meets_the_peer_after_passing_its_mark() {
    let (mut a, mut b) = restored_world();
    for id in ["r1", "r2", "r3", "r4", "r5", "r6", "r7"] {
        register(&mut a, 2, id);
    }
    assert_eq!(a.own_mark().seq, 10);
    let outcomes = sync(&mut a, &mut b, 2_000);
    assert!(matches!(outcomes[0], Outcome::NewEpoch(_)), "{outcomes:?}");
    assert_same(&b, &a);
}

/// Restored to exactly the mark: same seq, other event. The restored dc-a wrote r1-r6 up
/// to seq 9 = dc-b's mark; nothing is ahead, yet the histories differ.
#[test]
fn restored_origin_at_exactly_the_peers_mark() {
    let (mut a, mut b) = restored_world();
    for id in ["r1", "r2", "r3", "r4", "r5", "r6"] {
        register(&mut a, 2, id);
    }
    assert_eq!(a.own_mark().seq, 9);
    sync(&mut a, &mut b, 2_000);
    assert_same(&b, &a);
}

/// The old process of dc-a (its old data dir) keeps running next to its replacement,
/// started on an empty data dir. They reconnect to dc-b in turns. dc-b must follow the
/// replacement from its first session on and never go back to the old epoch.
#[test]
fn old_incarnation_next_to_its_replacement_cannot_flip_the_peer() {
    let mut old = MemLog::new("dc-a", 5 << 20 | 77);
    register(&mut old, 1, "old1");
    let mut b = MemLog::new("dc-b", 9 << 20 | 3);
    assert_eq!(sync(&mut old, &mut b, 0).last(), Some(&Outcome::Idle));
    // A fresh data dir: a provisional epoch (no generation yet), below the old one.
    let mut new = MemLog::new("dc-a", 123);
    register(&mut new, 2, "new1");
    sync(&mut new, &mut b, 1_000);
    assert_eq!(live_of(&b, "dc-a"), vec!["new1".to_owned()]);
    let followed = b.mark_of("dc-a").unwrap().epoch;
    for round in 0..3u64 {
        register(&mut old, 1, &format!("old-late{round}"));
        let outcomes = sync(&mut old, &mut b, 2_000 + round * 100);
        assert!(matches!(outcomes.as_slice(), [Outcome::Fenced(_)]), "round {round}: {outcomes:?}");
        assert_eq!(
            b.mark_of("dc-a").unwrap().epoch,
            followed,
            "round {round}: dc-b went back to the old epoch"
        );
        assert_eq!(live_of(&b, "dc-a"), vec!["new1".to_owned()], "round {round}");
        sync(&mut new, &mut b, 2_050 + round * 100);
    }
    register(&mut new, 2, "new2");
    sync(&mut new, &mut b, 3_000);
    assert_same(&b, &new);
}

/// A fresh data dir accepts writes before it ever heard from a peer; dc-b still holds the
/// old history of dc-a. The writes survive: dc-b ends with exactly the new dir's instances.
#[test]
fn writes_of_a_fresh_dir_before_its_first_handshake_reach_the_peer() {
    let mut old = MemLog::new("dc-a", 5 << 20 | 77);
    register(&mut old, 1, "old1");
    let mut b = MemLog::new("dc-b", 9 << 20 | 3);
    sync(&mut old, &mut b, 0);
    let mut new = MemLog::new("dc-a", 9);
    register(&mut new, 2, "early1");
    register(&mut new, 2, "early2");
    sync(&mut new, &mut b, 1_000);
    assert_same(&b, &new);
    register(&mut new, 2, "late");
    sync(&mut new, &mut b, 2_000);
    assert_same(&b, &new);
}

/// The gateway checks a peer's ack against the own epoch it holds where the ack arrives
/// (`Sender::handle_ack`), not with the log. An ack of an epoch the origin has left since
/// it shipped the batch is refused as a cursor that went back, exactly as with the log; an
/// ack before the handshake is refused too, and the one of the current epoch is taken.
#[test]
fn an_ack_checked_without_the_log_refuses_an_epoch_the_origin_left() {
    let setup = || {
        let mut a = MemLog::new("dc-a", 5 << 20 | 77);
        let mut b = MemLog::new("dc-b", 9 << 20 | 3);
        let (mut sender, hello) = Sender::new(&a, "dc-b", StreamTuning::default(), 0);
        let mut receiver = Receiver::new("dc-b", "dc-a");
        for f in receive(&mut b, &mut receiver, hello).unwrap() {
            assert!(sender.handle_frame(&a, f).unwrap().is_empty());
        }
        register(&mut a, 1, "p1");
        let (batch, _) = sender.poll_transmit(&a, 0).unwrap().expect("a batch to ship");
        let ack = receive(&mut b, &mut receiver, batch).unwrap().pop().expect("an ack");
        let Frame::Ack { batch_id, mark } = ack else { panic!("not an ack: {ack:?}") };
        (a, sender, batch_id, mark)
    };

    let (a, mut sender, batch_id, mark) = setup();
    let events = sender.handle_ack(batch_id, mark, a.own_mark().epoch).unwrap();
    assert_eq!(events, vec![SenderEvent::PeerAcked(mark)]);
    assert_eq!(sender.inflight_batches(), 0);

    let (mut a, mut sender, batch_id, mark) = setup();
    a.begin_epoch(epoch::above(a.own_mark().epoch, 1)).unwrap();
    let err = sender.handle_ack(batch_id, mark, a.own_mark().epoch).unwrap_err();
    assert_eq!(err.code, tandem_schemas::RefuseCode::CursorRegressed, "{err}");
    assert_eq!(sender.inflight_batches(), 1, "a refused ack released its batch");

    let a = MemLog::new("dc-a", 5 << 20 | 77);
    let (mut fresh, _hello) = Sender::new(&a, "dc-b", StreamTuning::default(), 0);
    let err = fresh.handle_ack(1, mark, a.own_mark().epoch).unwrap_err();
    assert!(err.to_string().contains("unexpected Ack"), "{err}");
}

/// The gateway reads its mark of the origin only for the frames that need it
/// (`Receiver::needs_mark`): a batch is handled without, so it costs the receiver one trip
/// to its log (the apply), not two. Its handling must then be the same whatever mark is
/// given, and every other frame must still ask for the mark.
#[test]
fn a_batch_is_handled_the_same_without_the_mark() {
    let mut a = MemLog::new("dc-a", 5 << 20 | 77);
    let mut b = MemLog::new("dc-b", 9 << 20 | 3);
    register(&mut a, 1, "p1");
    assert_eq!(sync(&mut a, &mut b, 0).last(), Some(&Outcome::Idle));
    register(&mut a, 1, "p2");
    let held = b.mark_of("dc-a");
    assert!(held.is_some());
    let batch = Frame::Batch { batch_id: 7, events: a.read_own(1, 16).unwrap() };
    assert!(!Receiver::needs_mark(&batch));
    let hello = Frame::Hello { dc: "dc-a".into(), epoch: a.own_mark().epoch, last_seq: a.own_mark().seq };
    let streaming = || {
        let mut r = Receiver::new("dc-b", "dc-a");
        r.handle_frame(held, b.mark_event_id("dc-a"), hello.clone()).unwrap();
        r
    };
    let with = streaming().handle_frame(held, b.mark_event_id("dc-a"), batch.clone()).unwrap();
    let without = streaming().handle_frame(None, None, batch).unwrap();
    assert_eq!(with, without);
    let ping = Frame::Ping { last_seq: 2, floor_seq: 0, now_ms: 0 };
    assert!(Receiver::needs_mark(&hello) && Receiver::needs_mark(&ping));
}
