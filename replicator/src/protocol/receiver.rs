//! The peer side of a stream: [`Receiver`] takes one origin's frames and says what to
//! apply, stage or install ([`ReceiverAction`]); the driver does it durably and reports back.

use tandem_schemas::{ChangeEvent, Frame, Mark, RefuseCode, SnapshotChunk, StagedSnapshot};
use uuid::Uuid;

use super::{frame_name, refusal_error, StreamError};
use crate::log::ApplyReport;

/// What the receiver asks the driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiverAction {
    /// Send this frame.
    Send(Frame),
    /// Apply these events durably (merge rules, atomically with the mark), then call
    /// [`Receiver::applied`] with the report.
    Apply { batch_id: u64, events: Vec<ChangeEvent> },
    /// Install this snapshot durably, then call [`Receiver::applied`].
    Install { batch_id: u64, snapshot: tandem_schemas::Snapshot },
    /// Stage this chunk durably ([`EventLog::stage_snapshot_chunk`](crate::log::EventLog::stage_snapshot_chunk)), then call
    /// [`Receiver::chunk_staged`] (staged) or [`Receiver::applied`] (the last chunk
    /// installed the snapshot, or the log refused it).
    StageChunk { batch_id: u64, chunk: SnapshotChunk },
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
    /// `Some` when this receiver takes chunked snapshots: what it has staged of the
    /// origin, announced in a `SnapshotResume` before the `HelloAck`.
    chunks: Option<Option<StagedSnapshot>>,
}

impl Receiver {
    /// A receiver that takes snapshots in one frame only (the schema-1 peer's view).
    pub fn new(local_dc: &str, channel_dc: &str) -> Self {
        Receiver {
            local_dc: local_dc.to_owned(),
            channel_dc: channel_dc.to_owned(),
            phase: ReceiverPhase::AwaitHello,
            applying: None,
            handshake: None,
            chunks: None,
        }
    }

    /// A receiver that takes snapshots in chunks, and has `staged` of the origin (from
    /// [`EventLog::staged_snapshot`](crate::log::EventLog::staged_snapshot) at the start of the stream).
    pub fn chunked(local_dc: &str, channel_dc: &str, staged: Option<StagedSnapshot>) -> Self {
        Receiver { chunks: Some(staged), ..Receiver::new(local_dc, channel_dc) }
    }

    pub fn channel_dc(&self) -> &str {
        &self.channel_dc
    }

    /// Takes snapshots in one frame only: the sender's Hello was of a schema version
    /// without chunked snapshots. Call before handing the Hello to [`Receiver::handle_frame`].
    pub fn whole_snapshots_only(&mut self) {
        self.chunks = None;
    }

    /// Whether [`Receiver::handle_frame`] reads the mark for `frame`. A batch's does not
    /// (its apply checks the events against the mark where it writes them), so a driver
    /// need not read the mark for each batch: `None` stands in for it.
    pub fn needs_mark(frame: &Frame) -> bool {
        !matches!(frame, Frame::Batch { .. })
    }

    /// Handles a frame from the sender. `mark` is the receiver's current mark of the
    /// channel's origin and `mark_event_id` the id of the event at it, when known (for a
    /// frame that [`Receiver::needs_mark`] says does not need it, anything may be given).
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
                let mut out = Vec::with_capacity(3);
                if let Some(staged) = self.chunks {
                    out.push(ReceiverAction::Send(Frame::SnapshotResume { staged }));
                }
                out.push(ReceiverAction::Send(Frame::HelloAck {
                    dc: self.local_dc.clone(),
                    mark,
                    mark_event_id,
                }));
                if epoch >= held {
                    out.push(ReceiverAction::Contact { epoch, last_seq, origin_now_ms: 0, caught_up: false });
                }
                Ok(out)
            }
            (ReceiverPhase::Streaming, Frame::Batch { batch_id, events }) => {
                self.begin_apply(batch_id)?;
                Ok(vec![ReceiverAction::Apply { batch_id, events }])
            }
            (ReceiverPhase::Streaming, Frame::Snapshot { batch_id, snapshot }) => {
                self.check_snapshot_epoch(mark, snapshot.mark)?;
                self.begin_apply(batch_id)?;
                Ok(vec![ReceiverAction::Install { batch_id, snapshot }])
            }
            (ReceiverPhase::Streaming, Frame::SnapshotChunk { batch_id, chunk }) => {
                self.check_snapshot_epoch(mark, chunk.mark)?;
                self.begin_apply(batch_id)?;
                Ok(vec![ReceiverAction::StageChunk { batch_id, chunk }])
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

    /// A snapshot of another epoch replaces whatever the receiver holds, so it must answer
    /// the view the sender saw: the mark is still in the epoch the HelloAck reported (or
    /// already in the snapshot's, where the merge refuses a regression). Else a session the
    /// peer has not yet noticed is dead (a half-open connection of an earlier incarnation
    /// of the origin) could put a replaced epoch back over the one a newer session
    /// installed.
    fn check_snapshot_epoch(&self, mark: Option<Mark>, cut: Mark) -> Result<(), StreamError> {
        let held = mark.map(|m| m.epoch);
        let seen = self.handshake.and_then(|(_, m)| m).map(|m| m.epoch);
        if held != Some(cut.epoch) && held != seen {
            return Err(StreamError::new(
                RefuseCode::Gap,
                format!(
                    "the mark moved from epoch {seen:?} to {held:?} under this stream; reconnect to see it"
                ),
            ));
        }
        Ok(())
    }

    /// Chunk `index` of `snapshot_id` (batch `batch_id`) is durably staged: the ack to send.
    pub fn chunk_staged(&mut self, batch_id: u64, snapshot_id: u64, index: u64) -> Frame {
        self.applying = None;
        Frame::ChunkAck { batch_id, snapshot_id, index }
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
