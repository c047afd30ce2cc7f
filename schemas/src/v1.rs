//! Schema version 1 of the replication frames, kept so that a node reads (and, during an
//! upgrade, writes) the frames of peers that do not speak version 2 yet.
//!
//! Differences from version 2: `HelloAck` has no `mark_event_id`, and `RefuseCode` has
//! no `Fenced` (written as `CursorRegressed`, whose message says why), and there are no
//! chunked-snapshot frames (`SnapshotChunk`, `ChunkAck`, `SnapshotResume`): a version 1
//! peer gets whole `Snapshot` frames. Every other type is byte-identical in both versions
//! and is shared.

use serde::{Deserialize, Serialize};

use crate::{ChangeEvent, DecodeError, EncodeError, Frame, Mark, RefuseCode, Snapshot};

const VERSION: u16 = 1;

/// The frames of schema 1, variant for variant in their version 1 order.
#[derive(Serialize, Deserialize)]
enum FrameV1 {
    Hello {
        dc: String,
        epoch: u64,
        last_seq: u64,
    },
    HelloAck {
        dc: String,
        mark: Option<Mark>,
    },
    Batch {
        batch_id: u64,
        #[serde(deserialize_with = "crate::bounded::batch_events")]
        events: Vec<ChangeEvent>,
    },
    Snapshot {
        batch_id: u64,
        snapshot: Snapshot,
    },
    Ack {
        batch_id: u64,
        mark: Mark,
    },
    Ping {
        last_seq: u64,
        floor_seq: u64,
        now_ms: u64,
    },
    Refuse {
        code: RefuseCode,
        message: String,
    },
}

#[derive(Serialize, Deserialize)]
struct EnvelopeV1 {
    schema_version: u16,
    frame: FrameV1,
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Frame, DecodeError> {
    let env: EnvelopeV1 = postcard::from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok(match env.frame {
        FrameV1::Hello { dc, epoch, last_seq } => Frame::Hello { dc, epoch, last_seq },
        FrameV1::HelloAck { dc, mark } => Frame::HelloAck { dc, mark, mark_event_id: None },
        FrameV1::Batch { batch_id, events } => Frame::Batch { batch_id, events },
        FrameV1::Snapshot { batch_id, snapshot } => Frame::Snapshot { batch_id, snapshot },
        FrameV1::Ack { batch_id, mark } => Frame::Ack { batch_id, mark },
        FrameV1::Ping { last_seq, floor_seq, now_ms } => Frame::Ping { last_seq, floor_seq, now_ms },
        // A version 1 peer never sends `Fenced`; if one did, it reads as what it says.
        FrameV1::Refuse { code, message } => Frame::Refuse { code, message },
    })
}

pub(crate) fn encode(frame: &Frame) -> Result<Vec<u8>, EncodeError> {
    let frame = match frame.clone() {
        Frame::Hello { dc, epoch, last_seq } => FrameV1::Hello { dc, epoch, last_seq },
        Frame::HelloAck { dc, mark, mark_event_id: _ } => FrameV1::HelloAck { dc, mark },
        Frame::Batch { batch_id, events } => FrameV1::Batch { batch_id, events },
        Frame::Snapshot { batch_id, snapshot } => FrameV1::Snapshot { batch_id, snapshot },
        Frame::Ack { batch_id, mark } => FrameV1::Ack { batch_id, mark },
        Frame::Ping { last_seq, floor_seq, now_ms } => FrameV1::Ping { last_seq, floor_seq, now_ms },
        Frame::Refuse { code, message } => {
            let code = match code {
                RefuseCode::Fenced => RefuseCode::CursorRegressed,
                c @ (RefuseCode::SchemaVersion
                | RefuseCode::UnknownDc
                | RefuseCode::WrongOrigin
                | RefuseCode::CursorRegressed
                | RefuseCode::Gap
                | RefuseCode::Invalid
                | RefuseCode::Internal) => c,
            };
            FrameV1::Refuse { code, message }
        }
        Frame::SnapshotChunk { .. } => {
            return Err(EncodeError::NoSuchFrame { version: VERSION, frame: "SnapshotChunk" })
        }
        Frame::ChunkAck { .. } => {
            return Err(EncodeError::NoSuchFrame { version: VERSION, frame: "ChunkAck" })
        }
        Frame::SnapshotResume { .. } => {
            return Err(EncodeError::NoSuchFrame { version: VERSION, frame: "SnapshotResume" })
        }
    };
    let env = EnvelopeV1 { schema_version: VERSION, frame };
    Ok(postcard::to_allocvec(&env).expect("postcard encoding into a Vec is infallible"))
}
