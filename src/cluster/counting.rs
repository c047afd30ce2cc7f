//! [`CountingStateMachine`]: a small in-memory Raft state machine that counts the rounds and
//! writes it applied. It serves openraft's storage suite (which checks a log store and a
//! state machine together) and the `tandem-bench raft` spike. It is not the registry's
//! state machine: that one is RocksLog (docs/cluster.md, "Next").
//!
//! Snapshots are its counters and the applied log id and membership, postcard-encoded and
//! kept in memory; a snapshot received is bounded by [`COUNTING_SNAPSHOT_BYTES_MAX`].

// The helpers return what openraft's traits return: its `StorageError` and `RPCError` are
// hundreds of bytes, and the traits fix them.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Applied, NodeId, RaftEntry, TypeConfig};

/// Largest snapshot [`CountingStateMachine`] installs (its snapshots are under 1 KiB).
pub const COUNTING_SNAPSHOT_BYTES_MAX: usize = 64 * 1024;

/// What the machine holds, and what its snapshot carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Counts {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, BasicNode>,
    /// Normal entries (rounds) applied.
    rounds: u64,
    /// Writes of those rounds.
    writes: u64,
}

#[derive(Debug, Default)]
struct Inner {
    counts: Counts,
    /// The current snapshot: its meta and its encoded [`Counts`].
    snapshot: Option<(SnapshotMeta<NodeId, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// An in-memory state machine that counts what it applied. Clones share one state (the
/// snapshot builder is a clone).
#[derive(Clone, Debug, Default)]
pub struct CountingStateMachine {
    inner: Arc<Mutex<Inner>>,
}

impl CountingStateMachine {
    /// (rounds, writes) applied so far.
    pub fn applied(&self) -> (u64, u64) {
        let inner = self.inner.lock();
        (inner.counts.rounds, inner.counts.writes)
    }
}

fn encode(counts: &Counts) -> Result<Vec<u8>, StorageError<NodeId>> {
    postcard::to_allocvec(counts).map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)).into())
}

impl RaftSnapshotBuilder<TypeConfig> for CountingStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let mut inner = self.inner.lock();
        let data = encode(&inner.counts)?;
        inner.snapshots_built += 1;
        let last = inner.counts.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.counts.last_membership.clone(),
            snapshot_id: format!("{}-{}", last.map_or(0, |l| l.index), inner.snapshots_built),
        };
        inner.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for CountingStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>> {
        let inner = self.inner.lock();
        Ok((inner.counts.last_applied, inner.counts.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = RaftEntry> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        for entry in entries {
            let c = &mut inner.counts;
            c.last_applied = Some(entry.log_id);
            let writes = match entry.payload {
                EntryPayload::Blank => 0,
                EntryPayload::Normal(round) => {
                    c.rounds += 1;
                    c.writes += round.writes.len() as u64;
                    round.writes.len() as u64
                }
                EntryPayload::Membership(m) => {
                    c.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    0
                }
            };
            out.push(Applied { index: entry.log_id.index, writes, outcomes: Vec::new() });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let read_err = |e: String| StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(e));
        if data.len() > COUNTING_SNAPSHOT_BYTES_MAX {
            return Err(read_err(format!(
                "snapshot of {} bytes, at most {COUNTING_SNAPSHOT_BYTES_MAX}",
                data.len()
            ))
            .into());
        }
        let counts: Counts = postcard::from_bytes(&data).map_err(|e| read_err(e.to_string()))?;
        if counts.last_applied != meta.last_log_id {
            return Err(read_err(format!(
                "snapshot data at {:?}, its meta at {:?}",
                counts.last_applied, meta.last_log_id
            ))
            .into());
        }
        let mut inner = self.inner.lock();
        inner.counts = counts;
        inner.snapshot = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let inner = self.inner.lock();
        Ok(inner.snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}
