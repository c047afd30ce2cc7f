//! Snapshots larger than one frame, step by step with the real [`Sender`] / [`Receiver`]
//! over [`MemLog`], through the real wire codec and a frame limit that the receiver
//! enforces as the gateway does: a frame over the limit is refused and the stream dies.
//!
//! The limit is lowered (a few records per frame) so that a state of a few hundred
//! instances needs over a hundred chunks. Covered: the transfer survives reconnects
//! (it resumes after the last staged chunk, with the sender's kept cut or with a new cut
//! of the same state), a receiver crash mid-transfer (its old state stays whole until the
//! last chunk installs everything at once), writes at the origin during the transfer (the
//! cut is consistent; the tail follows as batches), batches cut by bytes, and the
//! single-frame path of a peer that takes no chunks.

use std::collections::BTreeMap;

use tandem_replicator::log::conformance::{ev, key, record};
use tandem_replicator::log::{ApplyReport, ChunkOutcome, EventLog, LogError, MemLog, SharedReader};
use tandem_replicator::merge::Held;
use tandem_replicator::protocol::{Receiver, ReceiverAction, Sender, SenderEvent, StreamError, StreamTuning};
use tandem_schemas::{
    decode_frame, encode_frame, DeregisterReason, Frame, InstanceRecord, Mark, Op, StagedSnapshot, Tombstone,
    FRAME_BYTES_MAX, FRAME_HEADROOM_BYTES,
};

/// Room for about two of this test's records per frame.
const FRAME_LIMIT: usize = FRAME_HEADROOM_BYTES + 2_500;

/// dc-a's epoch: a settled one (generation 1), so the handshake continues it.
const A_EPOCH: u64 = (1 << 20) | 4;

fn tuning() -> StreamTuning {
    StreamTuning {
        batch_events_max: 64,
        window_batches_max: 4,
        frame_bytes_max: FRAME_LIMIT,
        ..StreamTuning::default()
    }
}

/// A record with about 1 KB of metadata.
fn big_record(owner: &str, id: &str, seq: u64) -> InstanceRecord {
    let mut r = record(owner, id);
    r.metadata = (0..4).map(|i| (format!("k{i}"), format!("{seq}-{}", "x".repeat(250)))).collect();
    r
}

/// dc-a's log: `n` instances, every tenth deregistered, purged so that a peer needs a
/// snapshot.
fn origin(n: u64) -> MemLog {
    let mut a = MemLog::new("dc-a", A_EPOCH);
    let regs: Vec<_> = (1..=n)
        .map(|s| ev("dc-a", A_EPOCH, s, Op::Register(big_record("dc-a", &format!("i{s:04}"), s))))
        .collect();
    a.append_local(&regs).unwrap();
    let deregs: Vec<_> = (1..=n / 10)
        .map(|i| {
            let k = key("dc-a", &format!("i{:04}", i * 10));
            ev("dc-a", A_EPOCH, n + i, Op::Deregister { key: k, reason: DeregisterReason::Explicit })
        })
        .collect();
    a.append_local(&deregs).unwrap();
    a.purge_own(a.own_mark().seq).unwrap();
    a
}

/// dc-b, holding a zombie of an older epoch of dc-a and an instance of dc-c.
fn peer() -> MemLog {
    let mut b = MemLog::new("dc-b", (1 << 20) | 8);
    b.apply_remote("dc-a", &[ev("dc-a", 1, 1, Op::Register(record("dc-a", "zombie")))]).unwrap();
    b.apply_remote("dc-c", &[ev("dc-c", 1, 1, Op::Register(record("dc-c", "other")))]).unwrap();
    b
}

type View = (Vec<(u64, InstanceRecord)>, Vec<Tombstone>, BTreeMap<String, Mark>);

fn view(log: &MemLog) -> View {
    (log.instances().unwrap(), log.tombstones().unwrap(), log.marks())
}

/// What a run of a stream saw.
#[derive(Debug, Default)]
struct Seen {
    chunks_sent: Vec<u64>,
    resumed_at: Option<u64>,
    snapshots_sent: u64,
}

/// One connection: the origin's sender and the peer's receiver, frames through the codec.
struct Link {
    sender: Sender,
    receiver: Receiver,
    seen: Seen,
}

impl Link {
    /// Connects and completes the handshake; `chunked`: the receiver takes chunks.
    fn open(a: &MemLog, b: &mut MemLog, reader: Option<SharedReader>, chunked: bool) -> Link {
        let (mut sender, hello) = Sender::new(a, "dc-b", tuning(), 0);
        sender.offer_reader(reader);
        let receiver = if chunked {
            Receiver::chunked("dc-b", "dc-a", b.staged_snapshot("dc-a").unwrap())
        } else {
            Receiver::new("dc-b", "dc-a")
        };
        let mut link = Link { sender, receiver, seen: Seen::default() };
        for answer in link.deliver_to_peer(b, hello).unwrap() {
            link.deliver_to_origin(a, answer).unwrap();
        }
        link
    }

    /// A frame crosses to the peer: refused when over the limit (as the gateway's reader
    /// does), else handled and applied; returns the answers.
    fn deliver_to_peer(&mut self, b: &mut MemLog, frame: Frame) -> Result<Vec<Frame>, String> {
        let bytes = encode_frame(&frame);
        if bytes.len() > FRAME_LIMIT {
            return Err(format!("frame of {} bytes exceeds {FRAME_LIMIT}", bytes.len()));
        }
        let frame = decode_frame(&bytes, FRAME_BYTES_MAX).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let err = |e: StreamError| e.to_string();
        for action in
            self.receiver.handle_frame(b.mark_of("dc-a"), b.mark_event_id("dc-a"), frame).map_err(err)?
        {
            match action {
                ReceiverAction::Send(f) => out.push(f),
                ReceiverAction::Apply { batch_id, events } => {
                    let report = b.apply_remote("dc-a", &events).unwrap();
                    out.push(self.receiver.applied(batch_id, &report).map_err(err)?);
                }
                ReceiverAction::Install { batch_id, snapshot } => {
                    let report = b.install_snapshot("dc-a", &snapshot).unwrap();
                    out.push(self.receiver.applied(batch_id, &report).map_err(err)?);
                }
                ReceiverAction::StageChunk { batch_id, chunk } => {
                    let report = match b.stage_snapshot_chunk("dc-a", &chunk) {
                        Ok(ChunkOutcome::Staged(_)) => {
                            out.push(self.receiver.chunk_staged(batch_id, chunk.snapshot_id, chunk.index));
                            continue;
                        }
                        Ok(ChunkOutcome::Installed(report)) => report,
                        Err(LogError::Refused(r)) => ApplyReport { refusal: Some(r), ..Default::default() },
                        Err(e) => panic!("storage: {e}"),
                    };
                    out.push(self.receiver.applied(batch_id, &report).map_err(err)?);
                }
                ReceiverAction::PurgeTombstones { upto_seq } => {
                    b.purge_remote_tombstones("dc-a", upto_seq).unwrap()
                }
                ReceiverAction::Contact { .. } => {}
            }
        }
        Ok(out)
    }

    fn deliver_to_origin(&mut self, a: &MemLog, frame: Frame) -> Result<(), String> {
        let frame = decode_frame(&encode_frame(&frame), FRAME_BYTES_MAX).map_err(|e| e.to_string())?;
        self.sender.handle_frame(a, frame).map(drop).map_err(|e| e.to_string())
    }

    /// Runs the stream in lock step until the sender has nothing to send or `frames` frames
    /// went to the peer. A refused frame ends the stream with the error.
    fn run(&mut self, a: &MemLog, b: &mut MemLog, frames: usize) -> Result<usize, String> {
        let mut sent = 0;
        while sent < frames {
            let polled = match self.sender.poll_transmit(a, 0).map_err(|e| e.to_string())? {
                Some(f) => Some(f),
                None => self.sender.poll_snapshot().map_err(|e| e.to_string())?,
            };
            let Some((frame, events)) = polled else { break };
            for e in events {
                match e {
                    SenderEvent::ChunkSent { index, resumed, .. } => {
                        self.seen.chunks_sent.push(index);
                        if resumed {
                            self.seen.resumed_at = Some(index);
                        }
                    }
                    SenderEvent::SnapshotSent(_) => self.seen.snapshots_sent += 1,
                    SenderEvent::PeerAcked(_) | SenderEvent::ChunkAcked { .. } => {}
                    other @ (SenderEvent::LogUnreadable { .. }
                    | SenderEvent::NewEpoch { .. }
                    | SenderEvent::Fenced { .. }) => return Err(format!("unexpected {other:?}")),
                }
            }
            sent += 1;
            for answer in self.deliver_to_peer(b, frame)? {
                self.deliver_to_origin(a, answer)?;
            }
        }
        Ok(sent)
    }
}

/// dc-b holds exactly dc-a's state (and its own other origins' untouched).
fn assert_converged(a: &MemLog, b: &MemLog) {
    assert_eq!(b.mark_of("dc-a"), Some(a.own_mark()));
    let held: Vec<_> =
        b.instances().unwrap().into_iter().filter(|(_, r)| &*r.key.owner_dc == "dc-a").collect();
    assert_eq!(held, a.instances().unwrap());
    let tombs: Vec<_> = b.tombstones().unwrap().into_iter().filter(|t| &*t.key.owner_dc == "dc-a").collect();
    assert_eq!(tombs, a.tombstones().unwrap());
    assert_eq!(b.held(&key("dc-a", "zombie")), Held::Absent);
    assert_eq!(b.held(&key("dc-c", "other")), Held::Live { seq: 1 });
    assert_eq!(b.staged_snapshot("dc-a").unwrap(), None);
}

/// The regression test of issue 13 §2: a snapshot of over a hundred chunks arrives
/// through two reconnects and a receiver crash, resuming each time; the peer's old state
/// stays whole until the last chunk installs everything at once.
#[test]
fn snapshot_of_many_chunks_arrives_through_reconnects_and_a_receiver_crash() {
    let mut a = origin(300);
    let mut b = peer();
    let old = view(&b);

    // First connection: 60 chunks, then the connection dies.
    let mut link = Link::open(&a, &mut b, None, true);
    assert_eq!(link.run(&a, &mut b, 60).unwrap(), 60);
    let id = b.staged_snapshot("dc-a").unwrap().expect("chunks are staged").snapshot_id;
    assert_eq!(b.staged_snapshot("dc-a").unwrap(), Some(StagedSnapshot { snapshot_id: id, chunks: 60 }));
    assert_eq!(view(&b), old, "staging must not touch the state");
    drop(link);

    // Second connection, with no kept cut (the origin restarted): the state did not change,
    // so a new cut is the same snapshot and the transfer resumes after chunk 59.
    let mut link = Link::open(&a, &mut b, None, true);
    assert_eq!(link.run(&a, &mut b, 40).unwrap(), 40);
    assert_eq!(link.seen.resumed_at, Some(60), "{:?}", link.seen);
    assert_eq!(link.seen.chunks_sent.first(), Some(&60));
    let kept = link.sender.reader();
    assert!(kept.is_some());
    drop(link);

    // The origin writes meanwhile: a register, an update and a deregister.
    let s = a.own_mark().seq;
    a.append_local(&[
        ev("dc-a", A_EPOCH, s + 1, Op::Register(big_record("dc-a", "late", s + 1))),
        ev("dc-a", A_EPOCH, s + 2, Op::Update(big_record("dc-a", "i0001", s + 2))),
        ev(
            "dc-a",
            A_EPOCH,
            s + 3,
            Op::Deregister { key: key("dc-a", "i0002"), reason: DeregisterReason::Evicted },
        ),
    ])
    .unwrap();

    // The receiver crashes mid-transfer (its durable log stays: for the model, all of it).
    // The third connection gets the cut the origin kept and resumes it after chunk 99.
    assert_eq!(view(&b), old);
    let mut link = Link::open(&a, &mut b, kept, true);
    link.run(&a, &mut b, usize::MAX).unwrap();
    assert_eq!(link.seen.resumed_at, Some(100), "{:?}", link.seen);
    assert_eq!(link.seen.snapshots_sent, 1);
    let total = 100 + link.seen.chunks_sent.len();
    assert!(total >= 120, "only {total} chunks");
    // Installed at the cut, then the writes after it arrived as batches.
    assert_converged(&a, &b);
    assert_eq!(b.held(&key("dc-a", "late")), Held::Live { seq: s + 1 });
    assert_eq!(b.held(&key("dc-a", "i0002")), Held::Tombstone { seq: s + 3 });
}

/// Without a kept cut, a transfer whose state changed starts over (a new snapshot id);
/// the staging of the old one is replaced, never mixed in.
#[test]
fn a_changed_state_without_the_kept_cut_starts_the_snapshot_over() {
    let mut a = origin(100);
    let mut b = peer();
    let mut link = Link::open(&a, &mut b, None, true);
    link.run(&a, &mut b, 20).unwrap();
    let first = b.staged_snapshot("dc-a").unwrap().unwrap();
    drop(link);
    let s = a.own_mark().seq;
    a.append_local(&[ev("dc-a", A_EPOCH, s + 1, Op::Register(big_record("dc-a", "late", s + 1)))]).unwrap();
    let mut link = Link::open(&a, &mut b, None, true);
    link.run(&a, &mut b, 1).unwrap();
    let second = b.staged_snapshot("dc-a").unwrap().unwrap();
    assert_ne!(second.snapshot_id, first.snapshot_id);
    assert_eq!(second.chunks, 1);
    assert_eq!(link.seen.chunks_sent, vec![0]);
    link.run(&a, &mut b, usize::MAX).unwrap();
    assert_converged(&a, &b);
}

/// The single-frame path, for a peer that takes no chunks: a snapshot that fits one frame
/// still arrives; one that does not is refused at the peer, which is why the chunks exist.
#[test]
fn single_frame_snapshots_still_work_when_they_fit() {
    let a = origin(1);
    let mut b = peer();
    let mut link = Link::open(&a, &mut b, None, false);
    link.run(&a, &mut b, usize::MAX).unwrap();
    assert!(link.seen.chunks_sent.is_empty());
    assert_eq!(link.seen.snapshots_sent, 1);
    assert_converged(&a, &b);

    let a = origin(300);
    let mut b = peer();
    let mut link = Link::open(&a, &mut b, None, false);
    let err = link.run(&a, &mut b, usize::MAX).expect_err("one frame of 300 records is over the limit");
    assert!(err.contains("exceeds"), "{err}");
}

/// Batches are cut by bytes as well as by count: 512 events of records with 16 KB of
/// metadata and 32 tags each are more than one 8 MiB frame, and go as several batches,
/// each within the frame limit.
#[test]
fn batches_are_cut_by_bytes() {
    let mut a = MemLog::new("dc-a", A_EPOCH);
    let big = |s: u64| {
        let mut r = record("dc-a", &format!("i{s:04}"));
        r.metadata = (0..15).map(|i| (format!("k{i:02}"), format!("{s:04}{}", "m".repeat(996)))).collect();
        r.tags = (0..32).map(|i| format!("t{i:02}{}", "g".repeat(60))).collect();
        tandem_schemas::validate_record(&r).unwrap();
        r
    };
    let regs: Vec<_> = (1..=512).map(|s| ev("dc-a", A_EPOCH, s, Op::Register(big(s)))).collect();
    let total: usize = regs.iter().map(|e| tandem_schemas::encode_event(e).len()).sum();
    assert!(total > FRAME_BYTES_MAX, "the workload must exceed a frame ({total} bytes)");
    a.append_local(&regs).unwrap();
    let mut b = MemLog::new("dc-b", (1 << 20) | 8);
    let (mut sender, hello) = Sender::new(&a, "dc-b", StreamTuning::default(), 0);
    let mut receiver = Receiver::chunked("dc-b", "dc-a", None);
    let mut batches = 0;
    let mut answers: Vec<Frame> = receiver
        .handle_frame(None, None, hello)
        .unwrap()
        .into_iter()
        .filter_map(|x| if let ReceiverAction::Send(f) = x { Some(f) } else { None })
        .collect();
    loop {
        for f in answers.drain(..) {
            sender.handle_frame(&a, f).unwrap();
        }
        let Some((frame, _)) = sender.poll_transmit(&a, 0).unwrap() else { break };
        let bytes = encode_frame(&frame);
        assert!(bytes.len() <= FRAME_BYTES_MAX, "a batch of {} bytes", bytes.len());
        let Frame::Batch { batch_id, events } = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap() else {
            continue;
        };
        batches += 1;
        let report = b.apply_remote("dc-a", &events).unwrap();
        answers.push(receiver.applied(batch_id, &report).unwrap());
    }
    assert!(batches >= 2, "{batches} batches");
    assert_eq!(b.mark_of("dc-a"), Some(Mark { epoch: A_EPOCH, seq: 512 }));
}
