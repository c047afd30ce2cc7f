//! The event-log contract every storage implementation keeps, an in-memory model of it,
//! and the conformance suite that checks an implementation against the contract.
//!
//! The production implementation lives in the root crate (RocksDB); this crate must never
//! depend on RocksDB. [`MemLog`] is the reference model: the deterministic simulation and
//! the property tests run on it, and it passes the same [`conformance`] checks as RocksDB.
//!
//! Every mutating call is atomic: the log entries, the materialized instances, the
//! tombstones and the per-origin marks change together or not at all.

use std::collections::BTreeMap;

use tandem_schemas::{
    validate_event, ChangeEvent, DeregisterReason, InstanceKey, InstanceRecord, Mark, Op, Snapshot,
    SnapshotChunk, SnapshotInstance, StagedSnapshot, Tombstone,
};
use uuid::Uuid;

use crate::merge::{self, Effect, Held, Refusal};
use crate::scope::Scope;

pub mod snapshot;

pub use snapshot::{ChunkOutcome, SharedReader, SnapshotReader};

/// Errors of a log implementation. Serializable: a DC group's state machine answers a
/// refused write with the same error the committer would.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum LogError {
    /// The request was refused by the merge rules; nothing changed.
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// Events at or below the purge floor are gone; the reader needs a snapshot.
    #[error("events up to seq {floor} were purged")]
    Purged { floor: u64 },
    /// A local append that does not continue the own log; nothing changed.
    #[error("local append out of sequence: expected seq {expected}, got {got}")]
    OutOfSequence { expected: u64, got: u64 },
    /// [`EventLog::begin_epoch`] with an epoch that is not above the current one (epochs
    /// only move up); nothing changed.
    #[error("a new epoch must be above the current {current}, got {requested}")]
    EpochNotAbove { current: u64, requested: u64 },
    /// The storage failed; the write may or may not have happened (retry is safe: every
    /// apply is idempotent).
    #[error("storage: {0}")]
    Storage(String),
    /// Stored bytes could not be decoded: corruption. Nothing changed.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// An event breaks the schema's rules (a field limit, or a key its origin does not
    /// own). Refused before anything is written; nothing changed.
    #[error("invalid event: {0}")]
    Invalid(String),
}

/// What applying a remote batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApplyReport {
    pub applied: usize,
    pub superseded: usize,
    pub duplicates: usize,
    /// Events (or snapshot entries) outside the origin's replication scope here: nothing
    /// was written for them (a batch's still consumed their seqs).
    pub out_of_scope: usize,
    /// The namespace of one of them, for a sampled log line.
    pub out_of_scope_namespace: Option<String>,
    /// The origin's mark after the batch.
    pub mark: Option<Mark>,
    /// A refusal stopped the batch here; what came before it was applied.
    pub refusal: Option<Refusal>,
    /// Effects on state, in order, for the caller's in-memory view.
    pub changes: Vec<StateChange>,
}

/// A change to the materialized state, reported so that in-memory views follow the log.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StateChange {
    Put { seq: u64, record: InstanceRecord },
    Remove { key: InstanceKey },
}

/// The contract of a DC's event log and replicated state.
pub trait EventLog {
    fn local_dc(&self) -> &str;
    /// The own origin's epoch and last seq (seq 0: nothing written yet).
    fn own_mark(&self) -> Mark;
    /// The applied high-water mark of a remote origin.
    fn mark_of(&self, origin: &str) -> Option<Mark>;
    /// All remote origins' marks.
    fn marks(&self) -> BTreeMap<String, Mark>;
    /// Seqs of the own origin at or below this are purged.
    fn purge_floor(&self) -> u64;
    /// The id of the event at this DC's mark of a remote origin, when known: set by every
    /// applied batch that moves the mark, unknown after a snapshot (and for marks written
    /// before ids were kept).
    fn mark_event_id(&self, origin: &str) -> Option<Uuid>;
    /// The id of the own event at `seq`: from the log, or the one remembered for the purge
    /// floor. `None` when unknown: seq 0, purged below the floor, or not written yet.
    fn own_event_id(&self, seq: u64) -> Result<Option<Uuid>, LogError>;
    /// Starts a new history of the own origin under `epoch`, which must be above the
    /// current one ([`crate::epoch`]). The state is kept and own seqs continue; the log is
    /// purged up to the own seq (every peer holds another epoch, so it needs a snapshot
    /// anyway). Atomic and durable.
    fn begin_epoch(&mut self, epoch: u64) -> Result<(), LogError>;

    /// Appends own-origin events (consecutive seqs after `own_mark().seq`) and their
    /// effects on state, atomically and durably.
    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError>;
    /// Own-origin events after `after_seq`, at most `max`.
    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError>;
    /// Applies a batch of a remote origin received over `channel_dc`, with the merge rules,
    /// atomically with the origin's mark.
    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError>;
    /// Installs a remote origin's snapshot atomically.
    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError>;
    /// The own origin's whole state at the current own mark.
    fn snapshot_own(&self) -> Result<Snapshot, LogError>;
    /// A consistent cut of the own origin's state at the current own mark, read in chunks of
    /// at most `chunk_bytes_max` encoded entry bytes, from any thread, without this log.
    /// Opening it is cheap; the reading happens in [`SnapshotReader::read_chunk`].
    fn open_snapshot(&self, chunk_bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError>;
    /// The snapshot of a remote origin staged and not installed yet.
    fn staged_snapshot(&self, origin: &str) -> Result<Option<StagedSnapshot>, LogError>;
    /// Stages one chunk of a remote origin's snapshot received over `channel_dc`, durably
    /// (see [`snapshot::check_chunk`] for the order rules). The last chunk installs the
    /// staged snapshot with it in one atomic write, exactly as [`install_snapshot`] would
    /// install the whole, and drops the staging. A refusal changes nothing.
    ///
    /// [`install_snapshot`]: EventLog::install_snapshot
    fn stage_snapshot_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError>;
    /// Purges own log entries and own tombstones at or below `upto_seq`.
    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError>;
    /// Drops tombstones of a remote origin at or below `upto_seq` (the origin purged them).
    fn purge_remote_tombstones(&mut self, origin: &str, upto_seq: u64) -> Result<(), LogError>;
    /// The replication scope of a remote origin here, as recorded (its mark was acquired
    /// under it): [`apply_remote`](EventLog::apply_remote) applies the origin's events
    /// outside it as no-ops and snapshots are installed only in part (merge rule 6).
    fn scope_of(&self, origin: &str) -> Scope;
    /// Records `scope` as the origin's replication scope, atomically and durably: its
    /// live copies and tombstones outside it are removed, and a scope wider than the
    /// recorded one moves the mark to seq 0 of its epoch ([`widened_mark`]) so that the
    /// origin resends from its beginning or sends a snapshot. The same scope changes
    /// nothing.
    fn rescope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError>;

    /// What the state holds for a key.
    fn held(&self, key: &InstanceKey) -> Held;
    /// Every live instance with the seq of the event that produced it, in key order.
    fn instances(&self) -> Result<Vec<(u64, InstanceRecord)>, LogError>;
    /// Every tombstone, in key order.
    fn tombstones(&self) -> Result<Vec<Tombstone>, LogError>;
}

/// Effects of a local event on the state, as the owner applies them.
pub fn local_effect(ev: &ChangeEvent) -> Effect {
    match ev.op {
        Op::Register(_) | Op::Update(_) => Effect::Put,
        Op::Deregister { .. } => Effect::Tombstone,
    }
}

/// Checks that `events` continue the own log at `own` and that each is valid (field
/// limits, and a key the local DC owns: [`validate_event`]), so that no event a peer
/// would refuse is ever written. Shared by implementations and the committer.
pub fn check_local_sequence(own: Mark, local_dc: &str, events: &[ChangeEvent]) -> Result<(), LogError> {
    for (expected, ev) in (own.seq + 1..).zip(events) {
        if ev.seq != expected || ev.origin_epoch != own.epoch || ev.origin_dc != local_dc {
            return Err(LogError::OutOfSequence { expected, got: ev.seq });
        }
        validate_event(ev).map_err(|e| LogError::Invalid(format!("event {}: {e}", ev.seq)))?;
    }
    Ok(())
}

/// The id of the event of `events` that a batch's new mark points at. Shared by
/// implementations.
pub fn mark_event_id(events: &[ChangeEvent], mark: Mark) -> Option<Uuid> {
    events.iter().rev().find(|e| e.seq == mark.seq && e.origin_epoch == mark.epoch).map(|e| e.event_id)
}

/// The in-memory reference model of [`EventLog`].
#[derive(Clone, Debug)]
pub struct MemLog {
    dc: String,
    own: Mark,
    floor: u64,
    log: BTreeMap<u64, ChangeEvent>,
    /// The id of the event at the purge floor, when known.
    floor_id: Option<Uuid>,
    marks: BTreeMap<String, Mark>,
    mark_ids: BTreeMap<String, Uuid>,
    live: BTreeMap<InstanceKey, (u64, InstanceRecord)>,
    tombs: BTreeMap<InstanceKey, (u64, DeregisterReason)>,
    /// Per remote origin: the staged snapshot and its entries so far.
    staging: BTreeMap<String, (StagedSnapshot, Vec<SnapshotInstance>, Vec<Tombstone>)>,
    /// Per remote origin: the replication scope its mark was acquired under (absent: all).
    scopes: BTreeMap<String, Scope>,
}

/// What changing an origin's replication scope did ([`MemLog::rescope`], and the RocksDB
/// log's).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rescope {
    /// The removals of its live copies outside the new scope, in key order.
    pub changes: Vec<StateChange>,
    pub tombstones_removed: usize,
    /// The new scope is wider than the recorded one: the mark's seq went back to 0 (same
    /// epoch), so the origin resyncs (its whole log or a snapshot) on the next stream.
    pub mark_reset: bool,
    /// The scope recorded before.
    pub was: Scope,
}

/// The mark an origin's mark becomes when its scope widens: the same epoch (so an older
/// incarnation is still fenced) at seq 0, so the origin resends from its beginning or
/// sends a snapshot. `None` stays `None`.
pub fn widened_mark(mark: Option<Mark>) -> Option<Mark> {
    mark.map(|m| Mark { epoch: m.epoch, seq: 0 })
}

impl MemLog {
    pub fn new(dc: &str, epoch: u64) -> Self {
        MemLog {
            dc: dc.to_owned(),
            own: Mark { epoch, seq: 0 },
            floor: 0,
            log: BTreeMap::new(),
            floor_id: None,
            marks: BTreeMap::new(),
            mark_ids: BTreeMap::new(),
            live: BTreeMap::new(),
            tombs: BTreeMap::new(),
            staging: BTreeMap::new(),
            scopes: BTreeMap::new(),
        }
    }

    /// Forgets everything of `origin`: its live copies (returned as removals, in key
    /// order), its tombstones (counted) and its mark. What retiring a DC does to state.
    pub fn forget_origin(&mut self, origin: &str) -> (Vec<StateChange>, usize) {
        let live: Vec<InstanceKey> = self.live.keys().filter(|k| *k.owner_dc == *origin).cloned().collect();
        let before = self.tombs.len();
        self.tombs.retain(|k, _| *k.owner_dc != *origin);
        let tombstones = before - self.tombs.len();
        self.marks.remove(origin);
        self.mark_ids.remove(origin);
        self.staging.remove(origin);
        let changes = live
            .into_iter()
            .map(|key| {
                self.live.remove(&key);
                StateChange::Remove { key }
            })
            .collect();
        (changes, tombstones)
    }

    fn put_effect(&mut self, ev: &ChangeEvent, effect: Effect) -> StateChange {
        let key = ev.op.key().clone();
        match (effect, &ev.op) {
            (Effect::Put, Op::Register(r) | Op::Update(r)) => {
                self.tombs.remove(&key);
                self.live.insert(key, (ev.seq, r.clone()));
                StateChange::Put { seq: ev.seq, record: r.clone() }
            }
            (Effect::Tombstone, Op::Deregister { reason, .. }) => {
                self.live.remove(&key);
                self.tombs.insert(key.clone(), (ev.seq, *reason));
                StateChange::Remove { key }
            }
            // The merge never pairs these; treat as no change rather than panic.
            (Effect::Put, Op::Deregister { .. }) | (Effect::Tombstone, Op::Register(_) | Op::Update(_)) => {
                StateChange::Remove { key }
            }
        }
    }
}

impl EventLog for MemLog {
    fn local_dc(&self) -> &str {
        &self.dc
    }
    fn own_mark(&self) -> Mark {
        self.own
    }
    fn mark_of(&self, origin: &str) -> Option<Mark> {
        self.marks.get(origin).copied()
    }
    fn marks(&self) -> BTreeMap<String, Mark> {
        self.marks.clone()
    }
    fn purge_floor(&self) -> u64 {
        self.floor
    }
    fn mark_event_id(&self, origin: &str) -> Option<Uuid> {
        self.mark_ids.get(origin).copied()
    }
    fn own_event_id(&self, seq: u64) -> Result<Option<Uuid>, LogError> {
        Ok(match self.log.get(&seq) {
            Some(e) => Some(e.event_id),
            None if seq == self.floor && seq != 0 => self.floor_id,
            None => None,
        })
    }
    fn begin_epoch(&mut self, epoch: u64) -> Result<(), LogError> {
        if epoch <= self.own.epoch {
            return Err(LogError::EpochNotAbove { current: self.own.epoch, requested: epoch });
        }
        self.log.clear();
        self.floor = self.own.seq;
        self.floor_id = None;
        self.own.epoch = epoch;
        Ok(())
    }

    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError> {
        check_local_sequence(self.own, &self.dc, events)?;
        for ev in events {
            self.put_effect(ev, local_effect(ev));
            self.log.insert(ev.seq, ev.clone());
            self.own.seq = ev.seq;
        }
        Ok(())
    }

    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError> {
        if after_seq < self.floor {
            return Err(LogError::Purged { floor: self.floor });
        }
        Ok(self.log.range(after_seq + 1..).take(max).map(|(_, e)| e.clone()).collect())
    }

    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError> {
        if channel_dc == self.dc {
            return Err(LogError::Refused(Refusal::WrongChannel {
                channel: channel_dc.to_owned(),
                origin: self.dc.clone(),
            }));
        }
        let mark = self.marks.get(channel_dc).copied();
        let scope = self.scope_of(channel_dc);
        let plan = merge::plan_batch(channel_dc, mark, &scope, |k| self.held(k), events);
        let mut report = ApplyReport {
            applied: plan.changes.len(),
            superseded: plan.superseded,
            duplicates: plan.duplicates,
            out_of_scope: plan.out_of_scope,
            out_of_scope_namespace: plan.out_of_scope_namespace.map(str::to_owned),
            mark: plan.new_mark.or(mark),
            refusal: plan.refusal.clone(),
            changes: Vec::new(),
        };
        let changes: Vec<(ChangeEvent, Effect)> =
            plan.changes.iter().map(|c| (c.event.clone(), c.effect)).collect();
        for (ev, effect) in &changes {
            let ch = self.put_effect(ev, *effect);
            report.changes.push(ch);
        }
        if let Some(m) = plan.new_mark {
            self.marks.insert(channel_dc.to_owned(), m);
            match mark_event_id(events, m) {
                Some(id) => self.mark_ids.insert(channel_dc.to_owned(), id),
                None => self.mark_ids.remove(channel_dc),
            };
        }
        Ok(report)
    }

    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError> {
        if channel_dc == self.dc {
            return Err(LogError::Refused(Refusal::WrongChannel {
                channel: channel_dc.to_owned(),
                origin: self.dc.clone(),
            }));
        }
        let scope = self.scope_of(channel_dc);
        let (snap, out_of_scope, out_of_scope_namespace) = scope.filter_snapshot(snap);
        let snap = &*snap;
        let live: Vec<InstanceKey> =
            self.live.keys().filter(|k| *k.owner_dc == *channel_dc).cloned().collect();
        let tombs: Vec<InstanceKey> =
            self.tombs.keys().filter(|k| *k.owner_dc == *channel_dc).cloned().collect();
        let plan = merge::plan_snapshot(channel_dc, self.mark_of(channel_dc), &live, &tombs, snap)?;
        let mut report = ApplyReport {
            mark: Some(plan.new_mark),
            out_of_scope,
            out_of_scope_namespace,
            ..Default::default()
        };
        for k in plan.remove {
            self.live.remove(&k);
            report.changes.push(StateChange::Remove { key: k });
        }
        for k in plan.remove_tombstones {
            self.tombs.remove(&k);
        }
        for SnapshotInstance { seq, record } in &snap.instances {
            self.tombs.remove(&record.key);
            self.live.insert(record.key.clone(), (*seq, record.clone()));
            report.changes.push(StateChange::Put { seq: *seq, record: record.clone() });
        }
        for t in &snap.tombstones {
            if self.live.remove(&t.key).is_some() {
                report.changes.push(StateChange::Remove { key: t.key.clone() });
            }
            self.tombs.insert(t.key.clone(), (t.seq, t.reason));
        }
        report.applied = snap.instances.len() + snap.tombstones.len();
        self.marks.insert(channel_dc.to_owned(), plan.new_mark);
        self.mark_ids.remove(channel_dc);
        Ok(report)
    }

    fn snapshot_own(&self) -> Result<Snapshot, LogError> {
        Ok(Snapshot {
            origin_dc: self.dc.clone(),
            mark: self.own,
            instances: self
                .live
                .iter()
                .filter(|(k, _)| *k.owner_dc == *self.dc)
                .map(|(_, (seq, r))| SnapshotInstance { seq: *seq, record: r.clone() })
                .collect(),
            tombstones: self
                .tombs
                .iter()
                .filter(|(k, _)| *k.owner_dc == *self.dc)
                .map(|(k, (seq, reason))| Tombstone { key: k.clone(), seq: *seq, reason: *reason })
                .collect(),
        })
    }

    fn open_snapshot(&self, chunk_bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError> {
        let snap = self.snapshot_own()?;
        let cut = snapshot::MemCut { instances: snap.instances, tombstones: snap.tombstones };
        Ok(Box::new(snapshot::ChunkedReader::new(cut, self.own, self.floor, chunk_bytes_max)))
    }

    fn staged_snapshot(&self, origin: &str) -> Result<Option<StagedSnapshot>, LogError> {
        Ok(self.staging.get(origin).map(|(s, _, _)| *s))
    }

    fn stage_snapshot_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        if channel_dc == self.dc {
            return Err(LogError::Refused(Refusal::WrongChannel {
                channel: channel_dc.to_owned(),
                origin: self.dc.clone(),
            }));
        }
        let staged = self.staged_snapshot(channel_dc)?;
        let step = snapshot::check_chunk(channel_dc, staged, chunk)?;
        let (mut instances, mut tombstones) =
            match (step, self.staging.get(channel_dc)) {
                (snapshot::ChunkStep::Duplicate, _) => {
                    return Ok(ChunkOutcome::Staged(staged.unwrap_or(StagedSnapshot {
                        snapshot_id: chunk.snapshot_id,
                        chunks: chunk.index + 1,
                    })))
                }
                (snapshot::ChunkStep::Continue, Some((_, i, t))) => (i.clone(), t.clone()),
                (snapshot::ChunkStep::Continue | snapshot::ChunkStep::Restart, _) => (vec![], vec![]),
            };
        instances.extend(chunk.instances.iter().cloned());
        tombstones.extend(chunk.tombstones.iter().cloned());
        if chunk.last {
            let snap = Snapshot { origin_dc: channel_dc.to_owned(), mark: chunk.mark, instances, tombstones };
            let report = self.install_snapshot(channel_dc, &snap)?;
            self.staging.remove(channel_dc);
            return Ok(ChunkOutcome::Installed(report));
        }
        let now = StagedSnapshot { snapshot_id: chunk.snapshot_id, chunks: chunk.index + 1 };
        self.staging.insert(channel_dc.to_owned(), (now, instances, tombstones));
        Ok(ChunkOutcome::Staged(now))
    }

    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError> {
        let upto = upto_seq.min(self.own.seq);
        if upto <= self.floor {
            return Ok(());
        }
        self.floor_id = self.log.get(&upto).map(|e| e.event_id);
        self.log.retain(|s, _| *s > upto);
        let dc = self.dc.clone();
        self.tombs.retain(|k, (s, _)| *k.owner_dc != *dc || *s > upto);
        self.floor = upto;
        Ok(())
    }

    fn purge_remote_tombstones(&mut self, origin: &str, upto_seq: u64) -> Result<(), LogError> {
        if origin == self.dc {
            return Ok(());
        }
        let upto = upto_seq.min(self.mark_of(origin).map_or(0, |m| m.seq));
        self.tombs.retain(|k, (s, _)| *k.owner_dc != *origin || *s > upto);
        Ok(())
    }

    fn scope_of(&self, origin: &str) -> Scope {
        self.scopes.get(origin).cloned().unwrap_or_default()
    }

    fn rescope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError> {
        let was = self.scope_of(origin);
        if was == *scope {
            return Ok(Rescope { was, ..Default::default() });
        }
        let out = |k: &InstanceKey| *k.owner_dc == *origin && !scope.allows(&k.namespace);
        let gone: Vec<InstanceKey> = self.live.keys().filter(|k| out(k)).cloned().collect();
        let before = self.tombs.len();
        self.tombs.retain(|k, _| !out(k));
        let tombstones_removed = before - self.tombs.len();
        let changes = gone
            .into_iter()
            .map(|key| {
                self.live.remove(&key);
                StateChange::Remove { key }
            })
            .collect();
        let mark_reset = !was.covers(scope) && self.marks.contains_key(origin);
        if mark_reset {
            if let Some(m) = widened_mark(self.marks.get(origin).copied()) {
                self.marks.insert(origin.to_owned(), m);
            }
            self.mark_ids.remove(origin);
        }
        match scope {
            Scope::All => self.scopes.remove(origin),
            Scope::Only(_) => self.scopes.insert(origin.to_owned(), scope.clone()),
        };
        Ok(Rescope { changes, tombstones_removed, mark_reset, was })
    }

    fn held(&self, key: &InstanceKey) -> Held {
        if let Some((seq, _)) = self.live.get(key) {
            Held::Live { seq: *seq }
        } else if let Some((seq, _)) = self.tombs.get(key) {
            Held::Tombstone { seq: *seq }
        } else {
            Held::Absent
        }
    }

    fn instances(&self) -> Result<Vec<(u64, InstanceRecord)>, LogError> {
        Ok(self.live.values().cloned().collect())
    }

    fn tombstones(&self) -> Result<Vec<Tombstone>, LogError> {
        Ok(self
            .tombs
            .iter()
            .map(|(k, (seq, reason))| Tombstone { key: k.clone(), seq: *seq, reason: *reason })
            .collect())
    }
}

// The conformance suite is for tests: it is built only under `cfg(test)` or with the
// `conformance` feature, which the workspace's test builds turn on (dev-dependencies).
#[cfg(any(test, doc, feature = "conformance"))]
pub mod conformance;
