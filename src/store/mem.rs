//! [`MemStore`]: the replicator's reference log [`MemLog`] with what a committer needs on
//! top of it ([`CommitLog`]): the watch index, a count of durable writes and the peers'
//! acknowledgements. The node simulation runs real registries on it; a simulated crash
//! keeps the `MemStore` (it is the durable state) and drops everything else. A write
//! fault can be injected ([`MemFault`]) to test what the committer does when the disk fails.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use tandem_replicator::log::{
    ApplyReport, ChunkOutcome, EventLog, LogError, MemLog, Rescope, SnapshotReader, StateChange,
};
use tandem_replicator::merge::Held;
use tandem_replicator::scope::Scope;
use tandem_schemas::{
    ChangeEvent, InstanceKey, InstanceRecord, Mark, Snapshot, SnapshotChunk, StagedSnapshot, Tombstone,
};

use super::commit_log::{local_changes, owner_changes};
use super::{CommitLog, Retirement};

/// A write fault injected into a [`MemStore`], as a disk would fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemFault {
    #[default]
    None,
    /// Every write fails and writes nothing, and recovery fails too (a full disk).
    Refuse,
    /// The next write lands but reports a failure (an fsync whose answer was lost); then
    /// the fault clears itself.
    LandThenFail,
}

/// An in-memory [`CommitLog`]. Every successful mutation counts as one durable write.
#[derive(Clone, Debug)]
pub struct MemStore {
    log: MemLog,
    index: u64,
    pending_index: Option<u64>,
    sync_writes: u64,
    peer_acks: BTreeMap<String, Mark>,
    retired: BTreeMap<String, u64>,
    /// Who owns each own live instance (see [`CommitLog::append_local_owned`]).
    owners: BTreeMap<InstanceKey, Arc<str>>,
    /// Shared by clones, so a test can set it while a committer owns the store.
    fault: Arc<Mutex<MemFault>>,
    /// A write failed: writes are refused until `recover`.
    poisoned: bool,
}

impl MemStore {
    pub fn new(dc: &str, epoch: u64) -> Self {
        MemStore {
            log: MemLog::new(dc, epoch),
            index: 0,
            pending_index: None,
            sync_writes: 0,
            peer_acks: BTreeMap::new(),
            retired: BTreeMap::new(),
            owners: BTreeMap::new(),
            fault: Arc::default(),
            poisoned: false,
        }
    }

    /// The fault switch of this store and its clones.
    pub fn fault(&self) -> Arc<Mutex<MemFault>> {
        Arc::clone(&self.fault)
    }

    /// Runs a mutation under the injected fault.
    fn write<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, LogError>) -> Result<T, LogError> {
        if self.poisoned {
            return Err(LogError::Storage("refusing writes after a failed write; recover first".into()));
        }
        let fault = *self.fault.lock();
        if fault == MemFault::Refuse {
            self.poisoned = true;
            return Err(LogError::Storage("injected write failure (no space left); nothing written".into()));
        }
        let out = f(self)?;
        if fault == MemFault::LandThenFail {
            *self.fault.lock() = MemFault::None;
            self.poisoned = true;
            return Err(LogError::Storage("injected write failure after the write landed".into()));
        }
        Ok(out)
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
    fn mark_event_id(&self, origin: &str) -> Option<uuid::Uuid> {
        self.log.mark_event_id(origin)
    }
    fn own_event_id(&self, seq: u64) -> Result<Option<uuid::Uuid>, LogError> {
        self.log.own_event_id(seq)
    }
    fn begin_epoch(&mut self, epoch: u64) -> Result<(), LogError> {
        self.log.begin_epoch(epoch)?;
        self.wrote();
        Ok(())
    }
    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError> {
        self.append_local_with_changes(events).map(|_| ())
    }
    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError> {
        self.log.read_own(after_seq, max)
    }
    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError> {
        self.write(|s| {
            let report = s.log.apply_remote(channel_dc, events)?;
            s.wrote();
            Ok(report)
        })
    }
    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError> {
        self.write(|s| {
            let report = s.log.install_snapshot(channel_dc, snap)?;
            s.wrote();
            Ok(report)
        })
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
        self.write(|s| {
            let outcome = s.log.stage_snapshot_chunk(channel_dc, chunk)?;
            s.wrote();
            Ok(outcome)
        })
    }
    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError> {
        self.purge_own_reporting(upto_seq).map(|_| ())
    }
    fn scope_of(&self, origin: &str) -> Scope {
        self.log.scope_of(origin)
    }
    fn rescope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError> {
        self.write(|s| {
            let r = s.log.rescope(origin, scope)?;
            s.wrote();
            Ok(r)
        })
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
        self.write(|s| {
            s.peer_acks.insert(peer.to_owned(), mark);
            Ok(())
        })
    }
    fn append_local_with_changes(&mut self, events: &[ChangeEvent]) -> Result<Vec<StateChange>, LogError> {
        self.append_local_owned(events, &[])
    }
    fn append_local_owned(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError> {
        self.write(|s| {
            s.log.append_local(events)?;
            if events.is_empty() {
                return Ok(Vec::new());
            }
            for (key, owner) in owner_changes(events, owners) {
                match owner {
                    Some(o) => s.owners.insert(key, o),
                    None => s.owners.remove(&key),
                };
            }
            s.wrote();
            Ok(local_changes(events))
        })
    }
    fn owners(&self) -> Result<Vec<(InstanceKey, Arc<str>)>, LogError> {
        Ok(self.owners.iter().map(|(k, o)| (k.clone(), o.clone())).collect())
    }
    fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError> {
        if upto_seq.min(self.own_mark().seq) <= self.purge_floor() {
            return Ok(Vec::new());
        }
        self.write(|s| {
            let dc = s.local_dc().to_owned();
            let before = s.tombstone_keys(&dc);
            s.log.purge_own(upto_seq)?;
            s.wrote();
            Ok(s.removed_tombstones(before, &dc))
        })
    }
    fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        if origin == self.local_dc() {
            return Ok(Vec::new());
        }
        self.write(|s| {
            let before = s.tombstone_keys(origin);
            s.log.purge_remote_tombstones(origin, upto_seq)?;
            s.wrote();
            Ok(s.removed_tombstones(before, origin))
        })
    }
    fn writable(&self) -> bool {
        !self.poisoned
    }
    /// Fails while the fault is [`MemFault::Refuse`]; else one probe write (an index bump).
    fn recover(&mut self) -> Result<(), LogError> {
        if *self.fault.lock() == MemFault::Refuse {
            return Err(LogError::Storage("injected write failure (no space left); still failing".into()));
        }
        self.poisoned = false;
        self.bump_index();
        Ok(())
    }
    fn retired(&self) -> BTreeMap<String, u64> {
        self.retired.clone()
    }
    fn retire_origin(&mut self, dc: &str, at_ms: u64) -> Result<Retirement, LogError> {
        tandem_schemas::validate_dc("dc", dc)
            .map_err(|e| LogError::Storage(format!("cannot retire: {e}")))?;
        if dc == self.local_dc() {
            return Err(LogError::Storage(format!("cannot retire {dc}: it is this log's own DC")));
        }
        if let Some(at) = self.retired.get(dc) {
            return Ok(Retirement { at_ms: *at, newly: false, ..Default::default() });
        }
        self.write(|s| {
            let mark = s.log.mark_of(dc);
            let (changes, tombstones_removed) = s.log.forget_origin(dc);
            s.peer_acks.remove(dc);
            s.retired.insert(dc.to_owned(), at_ms);
            s.wrote();
            Ok(Retirement { at_ms, newly: true, changes, tombstones_removed, mark })
        })
    }
    fn unretire_origin(&mut self, dc: &str) -> Result<bool, LogError> {
        if !self.retired.contains_key(dc) {
            return Ok(false);
        }
        self.write(|s| {
            s.retired.remove(dc);
            s.wrote();
            Ok(true)
        })
    }
}
