//! Snapshots in chunks: reading one consistent cut of the own origin in bounded chunks
//! ([`SnapshotReader`]), and staging a remote origin's chunks until the last one installs
//! the whole snapshot atomically ([`check_chunk`], [`ChunkOutcome`]).
//!
//! A reader's chunks are a pure function of the cut and the chunk budget: the cut is named
//! by [`snapshot_id`] (own epoch, own seq, purge floor, budget), so two readers of one id
//! produce the same chunks, and a receiver may stage chunks of one id across streams (the
//! resume after a reconnect). [`ChunkedReader`] does the chunking over any [`CutSource`]:
//! the in-memory model's copy of its state, or a RocksDB snapshot read off the committer
//! thread.

use std::sync::Arc;

use parking_lot::Mutex;
use tandem_schemas::{Mark, Snapshot, SnapshotChunk, SnapshotInstance, StagedSnapshot, Tombstone};

use super::{ApplyReport, LogError};
use crate::merge::Refusal;

/// Reads a snapshot of the own origin, chunk by chunk, from one consistent cut. Safe to use
/// from any thread; holding it holds the cut.
pub trait SnapshotReader: Send {
    /// Names the cut and the chunking (see [`snapshot_id`]).
    fn snapshot_id(&self) -> u64;
    /// The own mark the cut was taken at.
    fn mark(&self) -> Mark;
    /// Chunk `index` (0, 1, …; a chunk may be read again, or first read after a skip).
    fn read_chunk(&mut self, index: u64) -> Result<SnapshotChunk, LogError>;
}

impl std::fmt::Debug for dyn SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotReader {{ id: {:#x}, mark: {:?} }}", self.snapshot_id(), self.mark())
    }
}

/// A reader shared between a stream's sender and its driver, which keeps it across
/// reconnects so that a new stream can resume the snapshot.
pub type SharedReader = Arc<Mutex<Box<dyn SnapshotReader>>>;

/// Where a cut's entries are read from: instances, then tombstones, each in key order.
pub trait CutSource: Send {
    type Pos: Clone + Send;
    /// The position of the first entry.
    fn start(&self) -> Self::Pos;
    /// Entries from `pos` on, whose encoded sizes sum to at most `bytes_max` (at least one
    /// entry when any is left), and the position after them (`None`: the cut is done).
    fn read_from(&mut self, pos: &Self::Pos, bytes_max: usize) -> Result<ChunkEntries<Self::Pos>, LogError>;
}

/// What [`CutSource::read_from`] returns.
pub struct ChunkEntries<P> {
    pub instances: Vec<SnapshotInstance>,
    pub tombstones: Vec<Tombstone>,
    pub next: Option<P>,
}

/// Accumulates entries under a byte budget: `take(len)` says whether an entry of `len`
/// encoded bytes still fits (the first entry always does, so every chunk makes progress).
#[derive(Debug, Default)]
pub struct Budget {
    used: usize,
    entries: usize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Self {
        Budget { used: 0, entries: 0, max }
    }
    pub fn take(&mut self, len: usize) -> bool {
        if self.entries > 0 && self.used.saturating_add(len) > self.max {
            return false;
        }
        self.used = self.used.saturating_add(len);
        self.entries += 1;
        true
    }
}

/// The id of a cut: a mix of the own mark, the purge floor (a purge drops tombstones
/// without moving the mark) and the chunk budget (which decides the chunk boundaries).
/// Never 0.
pub fn snapshot_id(mark: Mark, floor: u64, chunk_bytes_max: usize) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for v in [mark.epoch, mark.seq, floor, chunk_bytes_max as u64] {
        h ^= v;
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 31;
        h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 29;
    }
    h.max(1)
}

/// The chunking of a [`CutSource`]: remembers where each chunk read so far starts.
pub struct ChunkedReader<S: CutSource> {
    src: S,
    id: u64,
    mark: Mark,
    bytes_max: usize,
    /// `starts[i]`: where chunk `i` starts, for every chunk reached so far.
    starts: Vec<S::Pos>,
    /// The index of the last chunk, once reached.
    last: Option<u64>,
}

impl<S: CutSource> ChunkedReader<S> {
    pub fn new(src: S, mark: Mark, floor: u64, bytes_max: usize) -> Self {
        let start = src.start();
        ChunkedReader {
            src,
            id: snapshot_id(mark, floor, bytes_max),
            mark,
            bytes_max,
            starts: vec![start],
            last: None,
        }
    }

    fn read_at(&mut self, index: u64) -> Result<SnapshotChunk, LogError> {
        let pos = self.starts[index as usize].clone();
        let got = self.src.read_from(&pos, self.bytes_max)?;
        match got.next {
            Some(next) if index as usize + 1 == self.starts.len() => self.starts.push(next),
            Some(_) => {}
            None => self.last = Some(index),
        }
        Ok(SnapshotChunk {
            snapshot_id: self.id,
            index,
            mark: self.mark,
            instances: got.instances,
            tombstones: got.tombstones,
            last: self.last == Some(index),
        })
    }
}

impl<S: CutSource> SnapshotReader for ChunkedReader<S> {
    fn snapshot_id(&self) -> u64 {
        self.id
    }
    fn mark(&self) -> Mark {
        self.mark
    }
    fn read_chunk(&mut self, index: u64) -> Result<SnapshotChunk, LogError> {
        if let Some(last) = self.last.filter(|l| index > *l) {
            return Err(LogError::Storage(format!("snapshot has {} chunks, chunk {index} asked", last + 1)));
        }
        // Reach the chunk's start by reading the chunks before it (a resume of a new reader).
        while self.starts.len() <= index as usize {
            let i = self.starts.len() as u64 - 1;
            self.read_at(i)?;
            if self.last == Some(i) {
                return Err(LogError::Storage(format!("snapshot has {} chunks, chunk {index} asked", i + 1)));
            }
        }
        self.read_at(index)
    }
}

/// Reads a whole snapshot from a reader in one piece (the single-frame path for peers that
/// do not take chunks). The reader should have an unbounded budget.
pub fn read_whole(reader: &mut dyn SnapshotReader, origin_dc: &str) -> Result<Snapshot, LogError> {
    let mut snap = Snapshot {
        origin_dc: origin_dc.to_owned(),
        mark: reader.mark(),
        instances: vec![],
        tombstones: vec![],
    };
    for index in 0.. {
        let chunk = reader.read_chunk(index)?;
        snap.instances.extend(chunk.instances);
        snap.tombstones.extend(chunk.tombstones);
        if chunk.last {
            break;
        }
    }
    Ok(snap)
}

/// What staging a chunk did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ChunkOutcome {
    /// The chunk is durably staged (or was already): the staging now holds this.
    Staged(StagedSnapshot),
    /// It was the last chunk: the whole snapshot is installed, the staging is gone.
    Installed(ApplyReport),
}

/// How a chunk relates to what is staged of its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkStep {
    /// Already staged (a redelivery): nothing to write.
    Duplicate,
    /// Chunk 0 of another snapshot: drop the staging, then stage it.
    Restart,
    /// The next chunk of the staged snapshot.
    Continue,
}

/// The staging rule, shared by every log. A chunk that does not continue the staging (a
/// gap, or a later chunk of a snapshot not staged) is refused as a gap; nothing changes.
pub fn check_chunk(
    channel_dc: &str,
    staged: Option<StagedSnapshot>,
    chunk: &SnapshotChunk,
) -> Result<ChunkStep, Refusal> {
    let owners = chunk
        .instances
        .iter()
        .map(|i| &i.record.key.owner_dc)
        .chain(chunk.tombstones.iter().map(|t| &t.key.owner_dc));
    for owner in owners {
        if **owner != *channel_dc {
            return Err(Refusal::WrongChannel { channel: channel_dc.to_owned(), origin: owner.to_string() });
        }
    }
    match staged {
        Some(s) if s.snapshot_id == chunk.snapshot_id => {
            if chunk.index < s.chunks {
                Ok(ChunkStep::Duplicate)
            } else if chunk.index == s.chunks {
                Ok(ChunkStep::Continue)
            } else {
                Err(Refusal::Gap { expected: s.chunks, got: chunk.index })
            }
        }
        Some(_) | None if chunk.index == 0 => Ok(ChunkStep::Restart),
        Some(_) | None => Err(Refusal::Gap { expected: 0, got: chunk.index }),
    }
}

/// The in-memory cut of the reference model: a copy of the own state at the mark.
pub struct MemCut {
    pub instances: Vec<SnapshotInstance>,
    pub tombstones: Vec<Tombstone>,
}

impl CutSource for MemCut {
    /// Index into instances followed by tombstones.
    type Pos = usize;
    fn start(&self) -> usize {
        0
    }
    fn read_from(&mut self, pos: &usize, bytes_max: usize) -> Result<ChunkEntries<usize>, LogError> {
        let mut budget = Budget::new(bytes_max);
        let mut out = ChunkEntries { instances: vec![], tombstones: vec![], next: None };
        let total = self.instances.len() + self.tombstones.len();
        let mut at = *pos;
        while at < total {
            if at < self.instances.len() {
                let i = &self.instances[at];
                if !budget.take(tandem_schemas::encode(i).len()) {
                    break;
                }
                out.instances.push(i.clone());
            } else {
                let t = &self.tombstones[at - self.instances.len()];
                if !budget.take(tandem_schemas::encode(t).len()) {
                    break;
                }
                out.tombstones.push(t.clone());
            }
            at += 1;
        }
        out.next = (at < total).then_some(at);
        Ok(out)
    }
}
