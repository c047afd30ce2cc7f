//! [`CommitLog`]: what the [`Committer`](super::Committer) needs of the log it owns, on top
//! of the [`EventLog`] contract: the watch index written with each durable write, a count of
//! durable writes, the peers' acknowledgements, and mutations that report what they changed.
//!
//! Implemented by [`RocksLog`] (production) and by [`MemStore`](super::MemStore), the
//! in-memory reference log of the node simulation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tandem_replicator::log::{EventLog, LogError, StateChange};
use tandem_schemas::{ChangeEvent, InstanceKey, Mark, Op};

use super::RocksLog;
use crate::registry::ANONYMOUS;

/// The log a committer owns. Every mutation is atomic and durable when it returns `Ok`.
pub trait CommitLog: EventLog {
    /// The watch index persisted by the last durable write.
    fn index(&self) -> u64;
    /// Stages a watch index for the next durable write (never moves backwards).
    fn set_next_index(&mut self, idx: u64);
    /// Durable (synced) writes since the log was opened.
    fn sync_writes(&self) -> u64;
    /// The own marks the peers acknowledged, as last recorded.
    fn peer_acks(&self) -> BTreeMap<String, Mark>;
    /// Records that `peer` durably holds the own origin up to `mark`.
    fn record_peer_ack(&mut self, peer: &str, mark: Mark) -> Result<(), LogError>;
    /// [`EventLog::append_local`], returning the changes to state in order.
    fn append_local_with_changes(&mut self, events: &[ChangeEvent]) -> Result<Vec<StateChange>, LogError>;
    /// [`append_local_with_changes`](Self::append_local_with_changes) that also records, in
    /// the same durable write, who owns each own instance: a registration whose seq is in
    /// `owners` records that principal (one without: none), a deregistration removes the
    /// record. Owners are local to this DC: they never replicate.
    fn append_local_owned(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError>;
    /// The principals that own the own live instances, as durable.
    fn owners(&self) -> Result<Vec<(InstanceKey, Arc<str>)>, LogError>;
    /// [`EventLog::purge_own`], returning the keys of the own tombstones it removed.
    fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError>;
    /// [`EventLog::purge_remote_tombstones`], returning the keys it removed.
    fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError>;
    /// False once a write failed in a way that leaves its outcome unknown: every write is
    /// refused until [`recover`](Self::recover) succeeds. Reads keep working where they can.
    fn writable(&self) -> bool;
    /// Makes the log writable again after a failed write, with its in-memory marks
    /// reloaded from what is durable (the failed write may or may not be among it); `Ok`
    /// only once a durable write has succeeded again. On error the log stays unwritable.
    fn recover(&mut self) -> Result<(), LogError>;
    /// The DCs retired here, with the wall-clock ms each was retired at.
    fn retired(&self) -> BTreeMap<String, u64>;
    /// Retires `dc` (never the own DC): in one durable write, forgets its live copies, its
    /// tombstones, its mark and its acknowledgement, and records it as retired so that its
    /// frames are refused from now on. Retiring a retired DC changes nothing.
    fn retire_origin(&mut self, dc: &str, at_ms: u64) -> Result<Retirement, LogError>;
    /// Lifts a retirement: `dc` may replicate again, from scratch (its mark was forgotten).
    /// Returns false when `dc` was not retired.
    fn unretire_origin(&mut self, dc: &str) -> Result<bool, LogError>;
    /// Starts handing the memtables of a quiet log to table files (in the background);
    /// returns the bytes they held, 0 when there was nothing worth a flush or nothing to
    /// flush. The node calls it after a quiet spell (`node/idle.rs`).
    fn flush_idle_memtables(&mut self) -> Result<u64, LogError> {
        Ok(0)
    }
    /// Where the last synced write's time went inside the store, when the store times it
    /// (RocksDB does: its perf context); `None` otherwise.
    fn last_sync_parts(&self) -> Option<SyncParts> {
        None
    }
    /// Begins an epoch of the next generation above `above` (with `tiebreak`) unless the
    /// own epoch already is above it; answers the own mark after. What the replication
    /// gateway asks when a peer holds a newer epoch of this DC (docs/replication.md).
    fn begin_epoch_above(&mut self, above: u64, tiebreak: u64) -> Result<Mark, LogError> {
        let own = self.own_mark();
        if own.epoch > above {
            return Ok(own);
        }
        self.begin_epoch(tandem_replicator::epoch::above(above.max(own.epoch), tiebreak))?;
        Ok(self.own_mark())
    }
}

/// Where a synced write's time went inside RocksDB, by its perf context. What the call took
/// beyond the two parts is RocksDB's own bookkeeping around them and its writer queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncParts {
    /// The write call, whole.
    pub call: Duration,
    /// The WAL append and its fsync.
    pub wal: Duration,
    /// The inserts into the memtables.
    pub memtable: Duration,
}

/// What retiring a DC did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Retirement {
    /// When the DC was retired (the earlier time when it already was).
    pub at_ms: u64,
    /// False when the DC was already retired (nothing changed).
    pub newly: bool,
    /// The removals of its live copies, in key order.
    pub changes: Vec<StateChange>,
    pub tombstones_removed: usize,
    /// Its mark before it was forgotten.
    pub mark: Option<Mark>,
}

/// The changes to state of own events, in order (a local event always applies).
pub(crate) fn local_changes(events: &[ChangeEvent]) -> Vec<StateChange> {
    events
        .iter()
        .map(|ev| match &ev.op {
            Op::Register(r) | Op::Update(r) => StateChange::Put { seq: ev.seq, record: r.clone() },
            Op::Deregister { key, .. } => StateChange::Remove { key: key.clone() },
        })
        .collect()
}

/// What own events do to the owner records: a registration with an owner records it, one
/// without removes any record; an update with an owner (a re-registration) records it, one
/// without (status, health) leaves it; a deregistration removes it. In event order.
///
/// The owner [`ANONYMOUS`] (ACLs off) restricts nothing, so it is recorded as no owner:
/// its registration removes any record and writes none (with ACLs off, no registration
/// writes an owner record, and a start reads none back).
pub(crate) fn owner_changes(
    events: &[ChangeEvent],
    owners: &[(u64, Arc<str>)],
) -> Vec<(InstanceKey, Option<Arc<str>>)> {
    let owner_of = |seq: u64| owners.iter().find(|(s, _)| *s == seq).map(|(_, o)| o.clone());
    let named = |o: Arc<str>| Some(o).filter(|o| **o != *ANONYMOUS);
    events
        .iter()
        .filter_map(|ev| match &ev.op {
            Op::Register(r) => Some((r.key.clone(), owner_of(ev.seq).and_then(named))),
            Op::Update(r) => owner_of(ev.seq).map(|o| (r.key.clone(), named(o))),
            Op::Deregister { key, .. } => Some((key.clone(), None)),
        })
        .collect()
}

impl CommitLog for RocksLog {
    fn index(&self) -> u64 {
        RocksLog::index(self)
    }
    fn set_next_index(&mut self, idx: u64) {
        RocksLog::set_next_index(self, idx);
    }
    fn sync_writes(&self) -> u64 {
        RocksLog::sync_writes(self)
    }
    fn peer_acks(&self) -> BTreeMap<String, Mark> {
        RocksLog::peer_acks(self)
    }
    fn record_peer_ack(&mut self, peer: &str, mark: Mark) -> Result<(), LogError> {
        RocksLog::record_peer_ack(self, peer, mark)
    }
    fn append_local_with_changes(&mut self, events: &[ChangeEvent]) -> Result<Vec<StateChange>, LogError> {
        RocksLog::append_local_with_changes(self, events)
    }
    fn append_local_owned(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError> {
        RocksLog::append_local_owned(self, events, owners)
    }
    fn owners(&self) -> Result<Vec<(InstanceKey, Arc<str>)>, LogError> {
        RocksLog::owners(self)
    }
    fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError> {
        RocksLog::purge_own_reporting(self, upto_seq)
    }
    fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        RocksLog::purge_remote_tombstones_reporting(self, origin, upto_seq)
    }
    fn retired(&self) -> BTreeMap<String, u64> {
        RocksLog::retired(self)
    }
    fn retire_origin(&mut self, dc: &str, at_ms: u64) -> Result<Retirement, LogError> {
        RocksLog::retire_origin(self, dc, at_ms)
    }
    fn unretire_origin(&mut self, dc: &str) -> Result<bool, LogError> {
        RocksLog::unretire_origin(self, dc)
    }
    fn writable(&self) -> bool {
        !RocksLog::is_poisoned(self)
    }
    fn recover(&mut self) -> Result<(), LogError> {
        RocksLog::recover(self)
    }
    fn flush_idle_memtables(&mut self) -> Result<u64, LogError> {
        RocksLog::flush_idle_memtables(self)
    }
    fn last_sync_parts(&self) -> Option<SyncParts> {
        RocksLog::last_sync_parts(self)
    }
}
