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

use tandem_schemas::{ChangeEvent, Frame, Mark, RefuseCode, Snapshot};
use uuid::Uuid;

use crate::epoch;
use crate::log::{ApplyReport, EventLog, LogError};
use crate::merge::Refusal;

/// Tuning of the stream. All bounds, all with units.
#[derive(Clone, Debug)]
pub struct StreamTuning {
    /// Most events per batch frame.
    pub batch_events_max: usize,
    /// Most unacknowledged batches in flight (backpressure).
    pub window_batches_max: usize,
    /// Send a ping when nothing was sent for this long.
    pub ping_interval_ms: u64,
}

impl Default for StreamTuning {
    fn default() -> Self {
        StreamTuning { batch_events_max: 512, window_batches_max: 8, ping_interval_ms: 1_000 }
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
    /// The peer needed a snapshot and one was sent.
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
    /// (batch id, last seq of the batch), oldest first.
    inflight: VecDeque<(u64, u64)>,
    pending_snapshot: bool,
    /// When the last ping went out.
    last_ping_ms: u64,
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
            last_ping_ms: now_ms,
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

    /// Handles a frame from the receiver.
    pub fn handle_frame<L: EventLog + ?Sized>(
        &mut self,
        log: &L,
        frame: Frame,
    ) -> Result<Vec<SenderEvent>, StreamError> {
        match (self.phase, frame) {
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
            (SenderPhase::Streaming, Frame::Ack { batch_id, mark }) => {
                let Some(&(front_id, front_seq)) = self.inflight.front() else {
                    return Err(StreamError::new(RefuseCode::Invalid, "ack with nothing in flight"));
                };
                if batch_id != front_id {
                    return Err(StreamError::new(
                        RefuseCode::Invalid,
                        format!("ack for batch {batch_id}, expected {front_id}"),
                    ));
                }
                if mark.seq < self.acked_seq || mark.epoch != log.own_mark().epoch {
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
                Ok(vec![SenderEvent::PeerAcked(mark)])
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
            return self.snapshot_frame(log).map(Some);
        }
        if self.sent_seq < own.seq {
            match log.read_own(self.sent_seq, self.tuning.batch_events_max) {
                Ok(events) if !events.is_empty() => {
                    let last = events.last().map_or(self.sent_seq, |e| e.seq);
                    let id = self.next_batch_id;
                    self.next_batch_id += 1;
                    self.inflight.push_back((id, last));
                    self.sent_seq = last;
                    return Ok(Some((Frame::Batch { batch_id: id, events }, vec![])));
                }
                Ok(_) => {}
                Err(LogError::Purged { .. }) => {
                    // Purged under our feet (the peer was not counted in the floor): only
                    // a snapshot can bring it up to date.
                    self.pending_snapshot = true;
                    return self.snapshot_frame(log).map(Some);
                }
                Err(e @ (LogError::Corrupt(_) | LogError::Invalid(_))) => {
                    // A stored event the peer would refuse (or that does not decode) would
                    // stall the stream at the same seq forever: the state, which the
                    // snapshot carries, moves the peer past it.
                    let after_seq = self.sent_seq;
                    self.pending_snapshot = true;
                    let (frame, mut events) = self.snapshot_frame(log)?;
                    events.push(SenderEvent::LogUnreadable { after_seq, error: e.to_string() });
                    return Ok(Some((frame, events)));
                }
                Err(e) => return Err(StreamError::new(RefuseCode::Internal, e.to_string())),
            }
        }
        Ok(None)
    }

    fn snapshot_frame<L: EventLog + ?Sized>(
        &mut self,
        log: &L,
    ) -> Result<(Frame, Vec<SenderEvent>), StreamError> {
        // A snapshot must not overtake batches in flight of the old cursor; wait for them.
        let snapshot: Snapshot =
            log.snapshot_own().map_err(|e| StreamError::new(RefuseCode::Internal, e.to_string()))?;
        let mark = snapshot.mark;
        let id = self.next_batch_id;
        self.next_batch_id += 1;
        self.inflight.push_back((id, mark.seq));
        self.sent_seq = mark.seq;
        self.pending_snapshot = false;
        Ok((Frame::Snapshot { batch_id: id, snapshot }, vec![SenderEvent::SnapshotSent(mark)]))
    }
}

/// What the receiver asks the driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiverAction {
    /// Send this frame.
    Send(Frame),
    /// Apply these events durably (merge rules, atomically with the mark), then call
    /// [`Receiver::applied`] with the report.
    Apply { batch_id: u64, events: Vec<ChangeEvent> },
    /// Install this snapshot durably, then call [`Receiver::applied`].
    Install { batch_id: u64, snapshot: Snapshot },
    /// The origin purged up to `upto_seq`: drop its tombstones at or below.
    PurgeTombstones { upto_seq: u64 },
    /// Liveness and lag: the origin is at `last_seq` of `epoch`, its clock read
    /// `origin_now_ms` (0 in a handshake). `caught_up`: a ping found the receiver holding
    /// everything the origin has, so the link is progressing although no batch came. A
    /// handshake is never progress (a link that reconnects and is refused over and over
    /// must turn stale).
    Contact { epoch: u64, last_seq: u64, origin_now_ms: u64, caught_up: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReceiverPhase {
    AwaitHello,
    Streaming,
}

/// The peer side of one stream: receives one origin's events.
#[derive(Debug)]
pub struct Receiver {
    local_dc: String,
    /// The DC the channel is authenticated as (from its certificate).
    channel_dc: String,
    phase: ReceiverPhase,
    /// The batch being applied, if any: applies are strictly one at a time, in order.
    applying: Option<u64>,
    /// The origin epoch named in the Hello and the mark sent back in the HelloAck: the view
    /// of this receiver that the sender acts on.
    handshake: Option<(u64, Option<Mark>)>,
}

impl Receiver {
    pub fn new(local_dc: &str, channel_dc: &str) -> Self {
        Receiver {
            local_dc: local_dc.to_owned(),
            channel_dc: channel_dc.to_owned(),
            phase: ReceiverPhase::AwaitHello,
            applying: None,
            handshake: None,
        }
    }

    pub fn channel_dc(&self) -> &str {
        &self.channel_dc
    }

    /// Handles a frame from the sender. `mark` is the receiver's current mark of the
    /// channel's origin and `mark_event_id` the id of the event at it, when known.
    pub fn handle_frame(
        &mut self,
        mark: Option<Mark>,
        mark_event_id: Option<Uuid>,
        frame: Frame,
    ) -> Result<Vec<ReceiverAction>, StreamError> {
        match (self.phase, frame) {
            (ReceiverPhase::AwaitHello, Frame::Hello { dc, epoch, last_seq }) => {
                if dc != self.channel_dc {
                    return Err(StreamError::new(
                        RefuseCode::WrongOrigin,
                        format!("certificate says {}, hello says {dc}", self.channel_dc),
                    ));
                }
                let held = mark.map_or(0, |m| m.epoch);
                // A receiver never goes back to an older epoch. An older settled epoch is an
                // older incarnation of the origin: fenced. A provisional one (a new data dir)
                // gets the HelloAck and takes an epoch above the one held.
                if epoch < held && !crate::epoch::is_provisional(epoch) {
                    return Err(StreamError::new(
                        RefuseCode::Fenced,
                        format!(
                            "{} follows epoch {held} of {dc}; epoch {epoch} is an older incarnation",
                            self.local_dc
                        ),
                    ));
                }
                self.phase = ReceiverPhase::Streaming;
                self.handshake = Some((epoch, mark));
                let ack = Frame::HelloAck { dc: self.local_dc.clone(), mark, mark_event_id };
                let mut actions = vec![ReceiverAction::Send(ack)];
                if epoch >= held {
                    actions.push(ReceiverAction::Contact {
                        epoch,
                        last_seq,
                        origin_now_ms: 0,
                        caught_up: false,
                    });
                }
                Ok(actions)
            }
            (ReceiverPhase::Streaming, Frame::Batch { batch_id, events }) => {
                self.begin_apply(batch_id)?;
                Ok(vec![ReceiverAction::Apply { batch_id, events }])
            }
            (ReceiverPhase::Streaming, Frame::Snapshot { batch_id, snapshot }) => {
                // A snapshot of another epoch replaces whatever the receiver holds, so it
                // must answer the view the sender saw: the mark is still in the epoch the
                // HelloAck reported (or already in the snapshot's, where the merge refuses
                // a regression). Else a session the peer has not yet noticed is dead (a
                // half-open connection of an earlier incarnation of the origin) could put
                // a replaced epoch back over the one a newer session installed.
                let held = mark.map(|m| m.epoch);
                let seen = self.handshake.and_then(|(_, m)| m).map(|m| m.epoch);
                if held != Some(snapshot.mark.epoch) && held != seen {
                    return Err(StreamError::new(
                        RefuseCode::Gap,
                        format!(
                            "the mark moved from epoch {seen:?} to {held:?} under this stream; \
                             reconnect to see it"
                        ),
                    ));
                }
                self.begin_apply(batch_id)?;
                Ok(vec![ReceiverAction::Install { batch_id, snapshot }])
            }
            (ReceiverPhase::Streaming, Frame::Ping { last_seq, floor_seq, now_ms }) => {
                // Once the handshake is done the receiver holds nothing of the origin or
                // the stream's epoch (a snapshot of it goes before any ping). Another epoch
                // means another session moved the mark: the sender's cursor is stale, and
                // an idle sender would otherwise never find out. The floor is of the
                // stream's epoch too, so it must not purge another epoch's tombstones.
                let epoch = self.handshake.map(|(e, _)| e);
                if let Some(m) = mark.filter(|m| Some(m.epoch) != epoch) {
                    return Err(StreamError::new(
                        RefuseCode::Gap,
                        format!(
                            "the mark is of epoch {} but this stream ships epoch {epoch:?}; reconnect",
                            m.epoch
                        ),
                    ));
                }
                let caught_up = match mark {
                    Some(m) => m.seq >= last_seq,
                    None => last_seq == 0,
                };
                Ok(vec![
                    ReceiverAction::Contact {
                        epoch: epoch.unwrap_or_default(),
                        last_seq,
                        origin_now_ms: now_ms,
                        caught_up,
                    },
                    ReceiverAction::PurgeTombstones { upto_seq: floor_seq },
                ])
            }
            (_, Frame::Refuse { code, message }) => {
                Err(StreamError { code, message: format!("peer refused: {message}") })
            }
            (phase, other) => Err(StreamError::new(
                RefuseCode::Invalid,
                format!("unexpected {} in phase {phase:?}", frame_name(&other)),
            )),
        }
    }

    fn begin_apply(&mut self, batch_id: u64) -> Result<(), StreamError> {
        if let Some(busy) = self.applying {
            return Err(StreamError::new(
                RefuseCode::Internal,
                format!("batch {batch_id} arrived while {busy} is being applied"),
            ));
        }
        self.applying = Some(batch_id);
        Ok(())
    }

    /// The durable apply of `batch_id` finished with `report`: the Ack to send, or the
    /// refusal that ends the stream (the sender reconnects and resumes from the mark).
    pub fn applied(&mut self, batch_id: u64, report: &ApplyReport) -> Result<Frame, StreamError> {
        self.applying = None;
        if let Some(r) = &report.refusal {
            return Err(refusal_error(r));
        }
        match report.mark {
            Some(mark) => Ok(Frame::Ack { batch_id, mark }),
            None => Err(StreamError::new(RefuseCode::Invalid, "batch applied nothing and no mark is held")),
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
    }
}
