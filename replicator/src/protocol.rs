//! The replication stream as two sans-IO state machines.
//!
//! One stream carries one origin's events from its own DC (the [`Sender`]) to one peer
//! (the [`Receiver`]). The sender dials; the receiver answers. Frames:
//!
//! ```text
//! sender                                   receiver
//!   Hello{dc, epoch, last_seq}  ------->  (Refuse Fenced: the receiver follows a newer epoch)
//!                               <-------  HelloAck{dc, mark of sender's origin, its event id}
//!   (the sender takes a new epoch and reconnects if its history went back, or if it is a
//!    new data dir and the peer knows a newer epoch; it is fenced if it is an older one)
//!   Snapshot{..}  (only if the receiver's mark is of another epoch or below the purge floor)
//!   ... or, to a receiver that sent SnapshotResume before its HelloAck, in chunks:
//!   SnapshotChunk{id, chunk 0..n} ----->  stage durably, then
//!                               <-------  ChunkAck{id, index}   (the last chunk: install
//!                               <-------  Ack{id, mark}          everything staged, atomically)
//!   Batch{id, events after the mark} --->  apply durably with the mark, then
//!                               <-------  Ack{id, mark}
//!   ... at most `window` unacknowledged batches ...
//!   Ping{last_seq, floor_seq, now} ----->  (when idle: liveness, lag, purge floor)
//! ```
//!
//! Architecture invariant: no sockets, no clocks, no tasks here. Time comes in as
//! `now_ms`; the log is read through [`EventLog`]; outputs are frames to send and
//! [`SenderEvent`]s / [`ReceiverAction`]s the driver performs. This is what lets the
//! deterministic simulation run the exact code the QUIC gateway runs.

use std::collections::VecDeque;

use std::sync::Arc;

use parking_lot::Mutex;
use tandem_schemas::{
    encode, Frame, Mark, RefuseCode, SnapshotChunk, StagedSnapshot, FRAME_BYTES_MAX, FRAME_HEADROOM_BYTES,
};
use uuid::Uuid;

use crate::epoch;
use crate::log::{snapshot, EventLog, LogError, SharedReader};
use crate::merge::Refusal;

mod receiver;

pub use receiver::{Receiver, ReceiverAction};

/// Tuning of the stream. All bounds, all with units.
#[derive(Clone, Debug)]
pub struct StreamTuning {
    /// Most events per batch frame.
    pub batch_events_max: usize,
    /// Most unacknowledged batches in flight (backpressure).
    pub window_batches_max: usize,
    /// Send a ping when nothing was sent for this long.
    pub ping_interval_ms: u64,
    /// Largest frame this sender produces, bytes: batches are cut by encoded size as well
    /// as by count, and snapshot chunks by size, to stay under it with
    /// [`FRAME_HEADROOM_BYTES`] to spare. At most [`FRAME_BYTES_MAX`] (what a peer accepts);
    /// tests lower it to make many chunks of a small state.
    pub frame_bytes_max: usize,
}

impl Default for StreamTuning {
    fn default() -> Self {
        StreamTuning {
            batch_events_max: 512,
            window_batches_max: 8,
            ping_interval_ms: 1_000,
            frame_bytes_max: FRAME_BYTES_MAX,
        }
    }
}

impl StreamTuning {
    /// Encoded entry bytes one batch or chunk may carry.
    pub fn entry_bytes_max(&self) -> usize {
        self.frame_bytes_max.min(FRAME_BYTES_MAX).saturating_sub(FRAME_HEADROOM_BYTES).max(1)
    }
}

/// A protocol violation that ends the stream. The driver sends the `Refuse` frame (when
/// there is one) and closes; nothing was applied because of the offending frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct StreamError {
    pub code: RefuseCode,
    pub message: String,
}

impl StreamError {
    fn new(code: RefuseCode, message: impl Into<String>) -> Self {
        StreamError { code, message: message.into() }
    }

    /// The frame that tells the other side why.
    pub fn to_frame(&self) -> Frame {
        Frame::Refuse { code: self.code, message: self.message.clone() }
    }
}

/// What the sender wants the driver to know about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderEvent {
    /// The peer durably holds the origin up to `mark`: record it (purge floor input).
    PeerAcked(Mark),
    /// The peer needed a snapshot and one was sent (its last chunk, when in chunks).
    SnapshotSent(Mark),
    /// The own log entries after `after_seq` could not be read (a corrupt or invalid
    /// stored event): a snapshot replaced them, so one bad entry cannot stall the stream.
    /// The driver makes it visible (a log line, a counter).
    LogUnreadable { after_seq: u64, error: String },
    /// The origin must start a new history ([`EventLog::begin_epoch`]) with an epoch above
    /// `above` ([`epoch::above`]) and reconnect: its history went back (the peer holds
    /// events of this epoch the log does not), or it is a new data dir and the peer follows
    /// a newer epoch of it. The stream is over.
    NewEpoch { above: u64, reason: String },
    /// The peer follows a newer epoch of this origin: this process is an older incarnation
    /// of its DC and must stop shipping (to every peer). The stream is over.
    Fenced { reason: String },
    /// A snapshot chunk went out: `bytes` of entries; `resumed` when the stream starts the
    /// snapshot at this chunk after an earlier stream staged the chunks before it.
    ChunkSent { snapshot_id: u64, index: u64, bytes: u64, last: bool, resumed: bool },
    /// The peer staged a chunk durably.
    ChunkAcked { snapshot_id: u64, index: u64 },
}

/// What a frame in flight carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InFlight {
    /// A batch (or a whole snapshot) that ends at this seq; answered by an `Ack`.
    Upto(u64),
    /// A snapshot chunk that is not the last; answered by a `ChunkAck`.
    Chunk { snapshot_id: u64, index: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SenderPhase {
    AwaitHelloAck,
    Streaming,
    Closed,
}

/// The origin side of one stream.
#[derive(Debug)]
pub struct Sender {
    local_dc: String,
    peer_dc: String,
    tuning: StreamTuning,
    phase: SenderPhase,
    next_batch_id: u64,
    /// Highest seq handed to the wire.
    sent_seq: u64,
    /// Highest seq the peer acknowledged on this stream.
    acked_seq: u64,
    /// (batch id, what it carries), oldest first.
    inflight: VecDeque<(u64, InFlight)>,
    /// The peer needs a snapshot, and its last chunk has not gone out yet.
    pending_snapshot: bool,
    /// The peer takes snapshots in chunks (it sent `SnapshotResume`).
    chunked: bool,
    /// What the peer has staged, from its `SnapshotResume`.
    resume: Option<StagedSnapshot>,
    /// The snapshot being sent: kept until its last chunk is acknowledged.
    reader: Option<SharedReader>,
    /// A reader an earlier stream of the driver left, offered for a resume.
    cached: Option<SharedReader>,
    /// The next chunk of `reader` to send.
    next_chunk: u64,
    /// The batch id of the final frame of the snapshot in flight, and the snapshot's id.
    snapshot_final: Option<(u64, u64)>,
    /// When the last ping went out.
    last_ping_ms: u64,
    /// Events to report with the next snapshot frame (why that snapshot is sent).
    notes: Vec<SenderEvent>,
}

impl Sender {
    /// Starts a stream to `peer_dc`; returns the sender and the Hello to send first.
    pub fn new<L: EventLog + ?Sized>(
        log: &L,
        peer_dc: &str,
        tuning: StreamTuning,
        now_ms: u64,
    ) -> (Self, Frame) {
        let own = log.own_mark();
        let s = Sender {
            local_dc: log.local_dc().to_owned(),
            peer_dc: peer_dc.to_owned(),
            tuning,
            phase: SenderPhase::AwaitHelloAck,
            next_batch_id: 1,
            sent_seq: 0,
            acked_seq: 0,
            inflight: VecDeque::new(),
            pending_snapshot: false,
            chunked: false,
            resume: None,
            reader: None,
            cached: None,
            next_chunk: 0,
            snapshot_final: None,
            last_ping_ms: now_ms,
            notes: Vec::new(),
        };
        let hello = Frame::Hello { dc: s.local_dc.clone(), epoch: own.epoch, last_seq: own.seq };
        (s, hello)
    }

    pub fn peer_dc(&self) -> &str {
        &self.peer_dc
    }

    /// Seq the peer acknowledged on this stream.
    pub fn acked_seq(&self) -> u64 {
        self.acked_seq
    }

    /// Number of batches awaiting acknowledgement.
    pub fn inflight_batches(&self) -> usize {
        self.inflight.len()
    }

    /// Offers the reader of a snapshot an earlier stream was sending: if the peer staged
    /// part of that very snapshot, this stream resumes it instead of starting over.
    pub fn offer_reader(&mut self, reader: Option<SharedReader>) {
        self.cached = reader;
    }

    /// The reader of the snapshot being sent (to keep for the next stream), if any.
    pub fn reader(&self) -> Option<SharedReader> {
        self.reader.clone()
    }

    /// True while snapshot chunks wait to be read and sent with [`Sender::poll_snapshot`].
    pub fn wants_snapshot_read(&self) -> bool {
        self.phase == SenderPhase::Streaming
            && self.pending_snapshot
            && self.reader.is_some()
            && self.inflight.len() < self.tuning.window_batches_max
    }

    /// Handles a frame from the receiver.
    pub fn handle_frame<L: EventLog + ?Sized>(
        &mut self,
        log: &L,
        frame: Frame,
    ) -> Result<Vec<SenderEvent>, StreamError> {
        match (self.phase, frame) {
            (SenderPhase::AwaitHelloAck, Frame::SnapshotResume { staged }) => {
                self.chunked = true;
                self.resume = staged;
                Ok(vec![])
            }
            (SenderPhase::AwaitHelloAck, Frame::HelloAck { dc, mark, mark_event_id }) => {
                if dc != self.peer_dc {
                    return Err(StreamError::new(
                        RefuseCode::UnknownDc,
                        format!("expected peer {}, it says it is {dc}", self.peer_dc),
                    ));
                }
                let own = log.own_mark();
                let floor = log.purge_floor();
                if epoch::is_provisional(own.epoch) {
                    // A new data dir learns here which epochs of its DC exist: it takes its
                    // first ordered epoch above the one this peer follows (its writes so far
                    // reach the peers in the snapshot of that epoch).
                    self.phase = SenderPhase::Closed;
                    let seen = mark.map_or(0, |m| m.epoch);
                    return Ok(vec![SenderEvent::NewEpoch {
                        above: seen.max(own.epoch),
                        reason: format!(
                            "this data dir is new (provisional epoch {}); peer {} follows epoch {seen} of this DC",
                            own.epoch, self.peer_dc
                        ),
                    }]);
                }
                match mark {
                    Some(m) if m.epoch > own.epoch => {
                        self.phase = SenderPhase::Closed;
                        return Ok(vec![SenderEvent::Fenced {
                            reason: format!(
                                "peer {} follows epoch {} of this DC, newer than this process's epoch {}: \
                                 this is an older incarnation of the DC",
                                self.peer_dc, m.epoch, own.epoch
                            ),
                        }]);
                    }
                    Some(m) if m.epoch == own.epoch => {
                        if let Some(reason) = self.went_back(log, m, mark_event_id)? {
                            self.phase = SenderPhase::Closed;
                            return Ok(vec![SenderEvent::NewEpoch { above: own.epoch, reason }]);
                        }
                        if m.seq >= floor {
                            self.sent_seq = m.seq;
                            self.acked_seq = m.seq;
                        } else {
                            self.pending_snapshot = true;
                        }
                    }
                    None if floor == 0 => {
                        self.sent_seq = 0;
                        self.acked_seq = 0;
                    }
                    Some(_) | None => self.pending_snapshot = true,
                }
                self.phase = SenderPhase::Streaming;
                Ok(vec![])
            }
            (SenderPhase::Streaming, Frame::ChunkAck { batch_id, snapshot_id, index }) => {
                match self.inflight.front() {
                    Some(&(id, InFlight::Chunk { snapshot_id: s, index: i }))
                        if id == batch_id && s == snapshot_id && i == index =>
                    {
                        self.inflight.pop_front();
                        Ok(vec![SenderEvent::ChunkAcked { snapshot_id, index }])
                    }
                    other => Err(StreamError::new(
                        RefuseCode::Invalid,
                        format!("chunk ack {batch_id} ({snapshot_id}, {index}) but in flight: {other:?}"),
                    )),
                }
            }
            (SenderPhase::Streaming, Frame::Ack { batch_id, mark }) => {
                self.on_ack(batch_id, mark, log.own_mark().epoch)
            }
            (SenderPhase::Closed, _) => Err(StreamError::new(RefuseCode::Invalid, "stream closed")),
            (_, Frame::Refuse { code: RefuseCode::Fenced, message }) => {
                self.phase = SenderPhase::Closed;
                Ok(vec![SenderEvent::Fenced { reason: format!("peer {} refused: {message}", self.peer_dc) }])
            }
            (_, Frame::Refuse { code, message }) => {
                self.phase = SenderPhase::Closed;
                Err(StreamError { code, message: format!("peer refused: {message}") })
            }
            (phase, other) => Err(StreamError::new(
                RefuseCode::Invalid,
                format!("unexpected {} in phase {phase:?}", frame_name(&other)),
            )),
        }
    }

    /// [`Sender::handle_frame`] for an `Ack`, given the epoch the own log holds now: the
    /// one frame a driver can handle without reading the log, so that an ack does not
    /// queue behind the writes the log is busy with.
    pub fn handle_ack(
        &mut self,
        batch_id: u64,
        mark: Mark,
        own_epoch: u64,
    ) -> Result<Vec<SenderEvent>, StreamError> {
        match self.phase {
            SenderPhase::Streaming => self.on_ack(batch_id, mark, own_epoch),
            SenderPhase::Closed => Err(StreamError::new(RefuseCode::Invalid, "stream closed")),
            phase => Err(StreamError::new(RefuseCode::Invalid, format!("unexpected Ack in phase {phase:?}"))),
        }
    }

    fn on_ack(&mut self, batch_id: u64, mark: Mark, own_epoch: u64) -> Result<Vec<SenderEvent>, StreamError> {
        let Some(&(front_id, InFlight::Upto(front_seq))) = self.inflight.front() else {
            return Err(StreamError::new(
                RefuseCode::Invalid,
                format!("ack {batch_id} but in flight: {:?}", self.inflight.front()),
            ));
        };
        if batch_id != front_id {
            return Err(StreamError::new(
                RefuseCode::Invalid,
                format!("ack for batch {batch_id}, expected {front_id}"),
            ));
        }
        if mark.seq < self.acked_seq || mark.epoch != own_epoch {
            return Err(StreamError::new(
                RefuseCode::CursorRegressed,
                format!("ack at {}:{} after {}", mark.epoch, mark.seq, self.acked_seq),
            ));
        }
        if mark.seq < front_seq {
            return Err(StreamError::new(
                RefuseCode::Invalid,
                format!("ack at seq {} does not cover batch end {front_seq}", mark.seq),
            ));
        }
        self.inflight.pop_front();
        self.acked_seq = mark.seq;
        if let Some((_, snapshot_id)) = self.snapshot_final.filter(|(b, _)| *b == batch_id) {
            // Installed: the snapshot is done, its cut may go (unless a newer one
            // replaced it meanwhile).
            self.snapshot_final = None;
            if self.reader.as_ref().is_some_and(|r| r.lock().snapshot_id() == snapshot_id) {
                self.reader = None;
            }
        }
        Ok(vec![SenderEvent::PeerAcked(mark)])
    }

    /// Whether the peer's mark `m` (of the own epoch) shows that this origin's history went
    /// back: the peer holds a seq the log never reached, or the event the peer holds at its
    /// mark is not the one the log holds at that seq (the log went back and was written
    /// again). An unknown id on either side is no evidence (a mark set by a snapshot, or a
    /// seq purged below the floor: the snapshot path replaces the peer's copy anyway).
    fn went_back<L: EventLog + ?Sized>(
        &self,
        log: &L,
        m: Mark,
        peer_id: Option<Uuid>,
    ) -> Result<Option<String>, StreamError> {
        let own = log.own_mark();
        if m.seq > own.seq {
            return Ok(Some(format!(
                "peer {} holds seq {} of epoch {} but this DC's log ends at {}: its history went back",
                self.peer_dc, m.seq, m.epoch, own.seq
            )));
        }
        let Some(peer_id) = peer_id else { return Ok(None) };
        let mine =
            log.own_event_id(m.seq).map_err(|e| StreamError::new(RefuseCode::Internal, e.to_string()))?;
        Ok(match mine {
            Some(mine) if mine != peer_id => Some(format!(
                "peer {} holds event {peer_id} at seq {} of epoch {}, this DC's log holds {mine} there: \
                 its history went back and was written again",
                self.peer_dc, m.seq, m.epoch
            )),
            Some(_) | None => None,
        })
    }

    /// The next frame to send, if any: a snapshot, a batch within the window, or a ping
    /// when idle. Call until it returns `Ok(None)`.
    pub fn poll_transmit<L: EventLog + ?Sized>(
        &mut self,
        log: &L,
        now_ms: u64,
    ) -> Result<Option<(Frame, Vec<SenderEvent>)>, StreamError> {
        if self.phase != SenderPhase::Streaming {
            return Ok(None);
        }
        let own = log.own_mark();
        // A ping every interval, busy or idle (never ahead of a pending snapshot, which
        // must reach the receiver first): liveness, the origin's last seq for lag, and the
        // purge floor for the receiver's tombstones.
        if !self.pending_snapshot && now_ms.saturating_sub(self.last_ping_ms) >= self.tuning.ping_interval_ms
        {
            self.last_ping_ms = now_ms;
            let ping = Frame::Ping { last_seq: own.seq, floor_seq: log.purge_floor(), now_ms };
            return Ok(Some((ping, vec![])));
        }
        if self.inflight.len() >= self.tuning.window_batches_max {
            return Ok(None);
        }
        if self.pending_snapshot {
            self.open_snapshot(log)?;
            return Ok(None);
        }
        if self.sent_seq < own.seq {
            match log.read_own(self.sent_seq, self.tuning.batch_events_max) {
                Ok(mut events) if !events.is_empty() => {
                    // Cut by bytes too: a batch of large records must fit a frame.
                    let mut budget = snapshot::Budget::new(self.tuning.entry_bytes_max());
                    let keep = events.iter().take_while(|e| budget.take(encode(*e).len())).count();
                    events.truncate(keep);
                    let last = events.last().map_or(self.sent_seq, |e| e.seq);
                    let id = self.next_batch_id;
                    self.next_batch_id += 1;
                    self.inflight.push_back((id, InFlight::Upto(last)));
                    self.sent_seq = last;
                    return Ok(Some((Frame::Batch { batch_id: id, events }, vec![])));
                }
                Ok(_) => {}
                Err(LogError::Purged { .. }) => {
                    // Purged under our feet (the peer was not counted in the floor): only
                    // a new snapshot can bring it up to date (not one sent before, whose
                    // cut is below the floor too).
                    self.pending_snapshot = true;
                    self.reader = None;
                    self.resume = None;
                    self.open_snapshot(log)?;
                    return Ok(None);
                }
                Err(e @ (LogError::Corrupt(_) | LogError::Invalid(_))) => {
                    // A stored event the peer would refuse (or that does not decode) would
                    // stall the stream at the same seq forever: the state, which the
                    // snapshot carries, moves the peer past it.
                    let after_seq = self.sent_seq;
                    self.pending_snapshot = true;
                    self.reader = None;
                    self.resume = None;
                    self.open_snapshot(log)?;
                    self.notes.push(SenderEvent::LogUnreadable { after_seq, error: e.to_string() });
                    return Ok(None);
                }
                Err(e) => return Err(StreamError::new(RefuseCode::Internal, e.to_string())),
            }
        }
        Ok(None)
    }

    /// Picks the cut to send (cheap: the reading happens in [`Sender::poll_snapshot`]): the
    /// offered reader when the peer staged part of it, else a new cut of the log at its
    /// current mark; then where to start: after what the peer staged of that cut.
    fn open_snapshot<L: EventLog + ?Sized>(&mut self, log: &L) -> Result<(), StreamError> {
        if self.reader.is_some() {
            return Ok(());
        }
        let bytes_max = if self.chunked { self.tuning.entry_bytes_max() } else { usize::MAX };
        let staged = self.resume.filter(|_| self.chunked);
        let own_epoch = log.own_mark().epoch;
        let cached = self.cached.take().filter(|r| {
            let r = r.lock();
            r.mark().epoch == own_epoch && staged.is_some_and(|s| s.snapshot_id == r.snapshot_id())
        });
        let reader = match cached {
            Some(r) => r,
            None => Arc::new(Mutex::new(
                log.open_snapshot(bytes_max)
                    .map_err(|e| StreamError::new(RefuseCode::Internal, e.to_string()))?,
            )),
        };
        let id = reader.lock().snapshot_id();
        self.next_chunk = staged.filter(|s| s.snapshot_id == id).map_or(0, |s| s.chunks);
        self.reader = Some(reader);
        Ok(())
    }

    /// The next frame of the snapshot being sent, read from its cut without the log (a
    /// driver runs this off the log's thread): a chunk within the window, or the whole
    /// snapshot in one frame for a peer that does not take chunks. Call until `Ok(None)`.
    pub fn poll_snapshot(&mut self) -> Result<Option<(Frame, Vec<SenderEvent>)>, StreamError> {
        if !self.wants_snapshot_read() {
            return Ok(None);
        }
        let Some(reader) = self.reader.clone() else { return Ok(None) };
        let internal = |e: LogError| StreamError::new(RefuseCode::Internal, e.to_string());
        let mut r = reader.lock();
        let id = self.next_batch_id;
        if !self.chunked {
            let snapshot = snapshot::read_whole(&mut **r, &self.local_dc).map_err(internal)?;
            let mark = snapshot.mark;
            self.next_batch_id += 1;
            self.inflight.push_back((id, InFlight::Upto(mark.seq)));
            let snapshot_id = r.snapshot_id();
            drop(r);
            self.finish_snapshot(id, snapshot_id, mark);
            let mut events = std::mem::take(&mut self.notes);
            events.push(SenderEvent::SnapshotSent(mark));
            return Ok(Some((Frame::Snapshot { batch_id: id, snapshot }, events)));
        }
        let index = self.next_chunk;
        let chunk: SnapshotChunk = r.read_chunk(index).map_err(internal)?;
        drop(r);
        let bytes = (encode(&chunk.instances).len() + encode(&chunk.tombstones).len()) as u64;
        let resumed =
            index > 0 && self.resume.is_some_and(|s| s.snapshot_id == chunk.snapshot_id && s.chunks == index);
        let mut events = std::mem::take(&mut self.notes);
        events.push(SenderEvent::ChunkSent {
            snapshot_id: chunk.snapshot_id,
            index,
            bytes,
            last: chunk.last,
            resumed,
        });
        self.next_batch_id += 1;
        self.next_chunk += 1;
        if chunk.last {
            let mark = chunk.mark;
            self.inflight.push_back((id, InFlight::Upto(mark.seq)));
            self.finish_snapshot(id, chunk.snapshot_id, mark);
            events.push(SenderEvent::SnapshotSent(mark));
        } else {
            self.inflight.push_back((id, InFlight::Chunk { snapshot_id: chunk.snapshot_id, index }));
        }
        Ok(Some((Frame::SnapshotChunk { batch_id: id, chunk }, events)))
    }

    /// The snapshot's last frame is out: batches continue after its cut.
    fn finish_snapshot(&mut self, batch_id: u64, snapshot_id: u64, mark: Mark) {
        self.sent_seq = mark.seq;
        self.pending_snapshot = false;
        self.snapshot_final = Some((batch_id, snapshot_id));
        if !self.chunked {
            self.reader = None;
        }
    }
}

/// Maps a merge refusal to the code sent to the peer.
pub fn refusal_error(r: &Refusal) -> StreamError {
    let code = match r {
        Refusal::WrongChannel { .. } | Refusal::NotOwner { .. } => RefuseCode::WrongOrigin,
        Refusal::EpochMismatch { .. } | Refusal::Gap { .. } => RefuseCode::Gap,
        Refusal::CursorRegressed { .. } => RefuseCode::CursorRegressed,
        Refusal::Retired { .. } => RefuseCode::UnknownDc,
        Refusal::EpochRegressed { .. } => RefuseCode::Fenced,
    };
    StreamError::new(code, r.to_string())
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "Hello",
        Frame::HelloAck { .. } => "HelloAck",
        Frame::Batch { .. } => "Batch",
        Frame::Snapshot { .. } => "Snapshot",
        Frame::Ack { .. } => "Ack",
        Frame::Ping { .. } => "Ping",
        Frame::Refuse { .. } => "Refuse",
        Frame::SnapshotChunk { .. } => "SnapshotChunk",
        Frame::ChunkAck { .. } => "ChunkAck",
        Frame::SnapshotResume { .. } => "SnapshotResume",
    }
}
