//! Snapshot streaming: a snapshot as a sequence of bounded chunks.
//!
//! An origin's whole state can be far larger than one frame. It travels as
//! [`Frame::SnapshotChunk`](crate::Frame::SnapshotChunk)s, each at most [`FRAME_BYTES_MAX`]
//! (the sender cuts them by encoded size), all read from one consistent cut of the origin
//! (`mark`). The receiver stages every chunk durably and installs the whole snapshot
//! atomically when it has staged the last one; a crash or a reconnect mid-transfer leaves
//! its old state intact, and [`Frame::SnapshotResume`](crate::Frame::SnapshotResume) tells
//! a new stream how far the staging got, so the sender resumes from there when it can
//! still serve that snapshot (same `snapshot_id`).
//!
//! [`FRAME_BYTES_MAX`]: crate::FRAME_BYTES_MAX

use serde::{Deserialize, Serialize};

use crate::{Mark, SnapshotInstance, Tombstone};

/// One chunk of a snapshot of the stream's origin.
///
/// `snapshot_id` names the cut: two chunks of one id come from the same state, so chunks of
/// one id may be staged across streams. Chunks go in `index` order from 0; the chunk with
/// `last` set completes the snapshot. Instances come before tombstones, each in key order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    pub snapshot_id: u64,
    pub index: u64,
    /// The cut the snapshot was read at (the same in every chunk of one id).
    pub mark: Mark,
    pub instances: Vec<SnapshotInstance>,
    pub tombstones: Vec<Tombstone>,
    pub last: bool,
}

/// A snapshot a receiver has staged and not installed yet: chunks `0..chunks` of
/// `snapshot_id` are durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedSnapshot {
    pub snapshot_id: u64,
    pub chunks: u64,
}

/// Bytes a chunk or batch frame keeps free for its envelope and headers, under the frame
/// limit: a sender fills at most `frame limit - FRAME_HEADROOM_BYTES` with entries.
pub const FRAME_HEADROOM_BYTES: usize = 4 * 1024;
