//! [`MemStore`]: the replicator's reference log [`MemLog`] with what a committer needs on
//! top of it ([`CommitLog`]): the watch index, a count of durable writes and the peers'
//! acknowledgements. The node simulation runs real registries on it; a simulated crash
//! keeps the `MemStore` (it is the durable state) and drops everything else.

use std::collections::{BTreeMap, BTreeSet};

use tandem_replicator::log::{
    ApplyReport, ChunkOutcome, EventLog, LogError, MemLog, SnapshotReader, StateChange,
};
use tandem_replicator::merge::Held;
use tandem_schemas::{
    ChangeEvent, InstanceKey, InstanceRecord, Mark, Op, Snapshot, SnapshotChunk, StagedSnapshot, Tombstone,
};

use super::CommitLog;

/// An in-memory [`CommitLog`]. Every successful mutation counts as one durable write.
#[derive(Clone, Debug)]
pub struct MemStore {
    log: MemLog,
    index: u64,
    pending_index: Option<u64>,
    sync_writes: u64,
    peer_acks: BTreeMap<String, Mark>,
}

impl MemStore {
    pub fn new(dc: &str, epoch: u64) -> Self {
        MemStore {
            log: MemLog::new(dc, epoch),
            index: 0,
            pending_index: None,
            sync_writes: 0,
            peer_acks: BTreeMap::new(),
        }
    }

    /// The reference log inside.
    pub fn mem_log(&self) -> &MemLog {
        &self.log
    }

    /// Persists `index() + 1` in a write of its own, as a node does at every start (see
    /// `RocksLog::bump_index`).
    pub fn bump_index(&mut self) -> u64 {
        self.set_next_index(self.index + 1);
        self.wrote();
        self.index
    }

    fn wrote(&mut self) {
        self.sync_writes += 1;
        if let Some(i) = self.pending_index.take() {
            self.index = self.index.max(i);
        }
    }

    fn tombstone_keys(&self, origin: &str) -> BTreeSet<InstanceKey> {
        self.log
            .tombstones()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| *t.key.owner_dc == *origin)
            .map(|t| t.key)
            .collect()
    }

    fn removed_tombstones(&self, before: BTreeSet<InstanceKey>, origin: &str) -> Vec<InstanceKey> {
        let after = self.tombstone_keys(origin);
        before.into_iter().filter(|k| !after.contains(k)).collect()
    }
}

impl EventLog for MemStore {
    fn local_dc(&self) -> &str {
        self.log.local_dc()
    }
    fn own_mark(&self) -> Mark {
        self.log.own_mark()
    }
    fn mark_of(&self, origin: &str) -> Option<Mark> {
        self.log.mark_of(origin)
    }
    fn marks(&self) -> BTreeMap<String, Mark> {
        self.log.marks()
    }
    fn purge_floor(&self) -> u64 {
        self.log.purge_floor()
    }
    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError> {
        self.append_local_with_changes(events).map(|_| ())
    }
    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError> {
        self.log.read_own(after_seq, max)
    }
    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError> {
        let report = self.log.apply_remote(channel_dc, events)?;
        self.wrote();
        Ok(report)
    }
    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError> {
        let report = self.log.install_snapshot(channel_dc, snap)?;
        self.wrote();
        Ok(report)
    }
    fn snapshot_own(&self) -> Result<Snapshot, LogError> {
        self.log.snapshot_own()
    }
    fn open_snapshot(&self, chunk_bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError> {
        self.log.open_snapshot(chunk_bytes_max)
    }
    fn staged_snapshot(&self, origin: &str) -> Result<Option<StagedSnapshot>, LogError> {
        self.log.staged_snapshot(origin)
    }
    fn stage_snapshot_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        let outcome = self.log.stage_snapshot_chunk(channel_dc, chunk)?;
        self.wrote();
        Ok(outcome)
    }
    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError> {
        self.purge_own_reporting(upto_seq).map(|_| ())
    }
    fn purge_remote_tombstones(&mut self, origin: &str, upto_seq: u64) -> Result<(), LogError> {
        self.purge_remote_tombstones_reporting(origin, upto_seq).map(|_| ())
    }
    fn held(&self, key: &InstanceKey) -> Held {
        self.log.held(key)
    }
    fn instances(&self) -> Result<Vec<(u64, InstanceRecord)>, LogError> {
        self.log.instances()
    }
    fn tombstones(&self) -> Result<Vec<Tombstone>, LogError> {
        self.log.tombstones()
    }
}

impl CommitLog for MemStore {
    fn index(&self) -> u64 {
        self.index
    }
    fn set_next_index(&mut self, idx: u64) {
        let floor = self.pending_index.unwrap_or(self.index);
        self.pending_index = Some(idx.max(floor));
    }
    fn sync_writes(&self) -> u64 {
        self.sync_writes
    }
    fn peer_acks(&self) -> BTreeMap<String, Mark> {
        self.peer_acks.clone()
    }
    fn record_peer_ack(&mut self, peer: &str, mark: Mark) -> Result<(), LogError> {
        // Not a synced write of its own, as in RocksLog.
        self.peer_acks.insert(peer.to_owned(), mark);
        Ok(())
    }
    fn append_local_with_changes(&mut self, events: &[ChangeEvent]) -> Result<Vec<StateChange>, LogError> {
        self.log.append_local(events)?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.wrote();
        Ok(events
            .iter()
            .map(|ev| match &ev.op {
                Op::Register(r) | Op::Update(r) => StateChange::Put { seq: ev.seq, record: r.clone() },
                Op::Deregister { key, .. } => StateChange::Remove { key: key.clone() },
            })
            .collect())
    }
    fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError> {
        if upto_seq.min(self.own_mark().seq) <= self.purge_floor() {
            return Ok(Vec::new());
        }
        let dc = self.local_dc().to_owned();
        let before = self.tombstone_keys(&dc);
        self.log.purge_own(upto_seq)?;
        self.wrote();
        Ok(self.removed_tombstones(before, &dc))
    }
    fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        if origin == self.local_dc() {
            return Ok(Vec::new());
        }
        let before = self.tombstone_keys(origin);
        self.log.purge_remote_tombstones(origin, upto_seq)?;
        self.wrote();
        Ok(self.removed_tombstones(before, origin))
    }
}
