//! [`RegistryStateMachine`]: the Raft state machine of a DC's group on RocksLog (issue 17,
//! docs/cluster.md). Applying an entry mints the events of its round's writes
//! ([`LocalWrite`]) and writes them, their state and owner records and the applied log id
//! and membership in one synced RocksDB batch (`RocksLog::append_local_applied`), so the
//! state and its applied id never part, across a crash too.
//!
//! Determinism: minting reads only the state as applied so far (RocksLog, plus the writes
//! of the same apply call not written yet) and the write itself. Seqs continue the own seq
//! of RocksLog, one per event minted (blank and membership entries mint none); the epoch
//! is RocksLog's, set when the group's first member was created (the same on every
//! member) or installed with a snapshot. A write whose event breaks the schema's rules,
//! or names another DC's instance, is refused the same way on every member (no event, no
//! seq, [`WriteOutcome::Refused`], counted). A write that does not decode fails the apply
//! with a `StorageError`: openraft then stops the member (the entry is the same bytes on
//! every member, so that is corruption or a version skew, never input to skip).
//!
//! Batches: one apply call is one synced batch, cut at an entry's end once it holds
//! [`APPLY_EVENTS_PER_BATCH_MAX`] events; each batch carries the applied id of its last
//! entry.
//!
//! Snapshots: an export of RocksLog's column families (`RocksLog::export_state`), bounded
//! by [`SNAPSHOT_BYTES_MAX`], built from the state when openraft asks for one and not
//! kept (no copy of the state sits in memory or on disk between two requests). An install
//! replaces the whole state in one synced batch after checking it
//! (`RocksLog::replace_state`): all of it or nothing. Export rather than a RocksDB
//! checkpoint: the snapshot type is a byte buffer today (the transport between members
//! comes next), and an export is exactly RocksLog's data, not its table files, WAL and
//! the Raft log's column families.
//!
//! RocksDB work runs on blocking threads; the state sits behind one mutex (openraft calls
//! one method at a time, and a snapshot build holds the state still while it exports).

// The helpers return what openraft's traits return: its `StorageError` is hundreds of
// bytes, and the traits fix it.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::io::Cursor;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use tandem_replicator::log::{
    check_local_sequence, ApplyReport, ChunkOutcome, EventLog, LogError, Rescope, StateChange,
};
use tandem_replicator::merge::Refusal;
use tandem_schemas::{ChangeEvent, InstanceKey, InstanceRecord, Mark};

use super::write::{GroupWrite, LocalWrite, Write};
use super::{Applied, GroupOutcome, NodeId, RaftEntry, TypeConfig, WriteOutcome};
use crate::registry::{Minted, Overlay};
use crate::store::{CommitNotice, Committed, OnCommit, OpenError, RocksLog, StateMarks};

/// Largest snapshot built or installed (its export of the state): about a million
/// instances of ~300 bytes with their tombstones and log. Building past it fails (the
/// member cannot send a snapshot; it still replicates by log), installing past it is
/// refused.
pub const SNAPSHOT_BYTES_MAX: usize = 512 << 20;

/// Most events one batch of an apply call holds before it is written (the committer's
/// own group bound): an apply call after a restart may carry thousands of entries.
pub const APPLY_EVENTS_PER_BATCH_MAX: usize = 8192;

/// The format byte of the stored applied state.
pub const APPLIED_FORMAT_V1: u8 = 1;

type Membership = StoredMembership<NodeId, BasicNode>;
type Meta = SnapshotMeta<NodeId, BasicNode>;
type SmResult<T> = Result<T, StorageError<NodeId>>;

/// What the state machine did, for metrics. Shared by its clones.
#[derive(Debug, Default)]
pub struct StateMachineCounters {
    /// Entries applied (blank and membership ones too), and the synced batches that
    /// wrote them.
    pub entries_applied: AtomicU64,
    pub batches: AtomicU64,
    /// Writes applied, by outcome.
    pub writes_written: AtomicU64,
    pub writes_unchanged: AtomicU64,
    pub writes_gone: AtomicU64,
    pub writes_refused: AtomicU64,
    /// Group writes applied (remote batches and snapshots, purges, acknowledgements,
    /// retirements); refused ones count in `writes_refused`.
    pub writes_group: AtomicU64,
    /// Writes that did not decode (each stopped the member).
    pub writes_corrupt: AtomicU64,
    pub snapshots_built: AtomicU64,
    pub snapshots_installed: AtomicU64,
    /// Snapshots refused at install (too large, not decodable, another DC's, ...).
    pub snapshots_refused: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Inner {
    log: RocksLog,
    /// Told every synced batch, in order (see [`RegistryStateMachine::on_apply`]).
    on_apply: Option<OnCommit>,
    applied: Option<LogId<NodeId>>,
    membership: Membership,
    /// A snapshot was built or installed since the state was opened: openraft has one to
    /// ask for (see `get_current_snapshot`).
    snapshot_made: bool,
}

/// The registry's Raft state machine: RocksLog. Clones share one state (the snapshot
/// builder is a clone).
#[derive(Clone)]
pub struct RegistryStateMachine {
    inner: Arc<Mutex<Inner>>,
    counters: Arc<StateMachineCounters>,
}

impl RegistryStateMachine {
    /// Opens the state of `dc` in `dir`. A new dir starts with `epoch`: the group's epoch,
    /// the same for every member (a member's own random one would mint other events). An
    /// existing dir keeps what it holds.
    pub fn open(dir: &Path, dc: &str, epoch: NonZeroU64) -> Result<RegistryStateMachine, OpenError> {
        let log = match RocksLog::create_with_epoch(dir, dc, epoch) {
            Err(OpenError::AlreadyInitialized { .. }) => RocksLog::open(dir, dc)?,
            other => other?,
        };
        let (applied, membership) = match log.raft_applied()? {
            Some(bytes) => decode_applied(&bytes).map_err(|e| OpenError::Log(LogError::Corrupt(e)))?,
            None => (None, Membership::default()),
        };
        let inner = Inner { log, on_apply: None, applied, membership, snapshot_made: false };
        Ok(RegistryStateMachine { inner: Arc::new(Mutex::new(inner)), counters: Arc::default() })
    }

    /// Calls `hook` after every synced batch of an apply or a snapshot install, in order,
    /// before openraft learns the entries are applied (so before a write's caller is
    /// answered): what the node's in-memory view follows on every member, leader or not.
    /// The notice's `index` is the applied Raft index of the batch's last entry, the same
    /// on every member for the same entries; its changes are `Committed::Local` for
    /// applied entries and `Committed::Replaced` for an installed snapshot (the difference
    /// between the state before and after). It runs under the state's lock, on a blocking
    /// thread: it must be quick and must not wait for the state machine. Replaces an
    /// earlier hook.
    pub fn on_apply(&self, hook: OnCommit) {
        self.inner.lock().on_apply = Some(hook);
    }

    /// The applied Raft index (0 before anything was applied): the watch index a view
    /// loaded from this state starts at.
    pub fn applied_index(&self) -> u64 {
        self.inner.lock().applied.map_or(0, |l| l.index)
    }

    /// The state machine's counters (shared by its clones).
    pub fn counters(&self) -> Arc<StateMachineCounters> {
        self.counters.clone()
    }

    /// Runs `f` with the state (reads; between two applies).
    pub fn with_log<R>(&self, f: impl FnOnce(&RocksLog) -> R) -> R {
        f(&self.inner.lock().log)
    }

    /// The whole state as a backup (`tandem backup`, docs/operations.md): its export (the
    /// format of a Raft snapshot, bounded by [`SNAPSHOT_BYTES_MAX`]), the applied index it
    /// is consistent with and the own mark, taken under the state's lock on a blocking
    /// thread (applies wait meanwhile).
    pub async fn backup(&self) -> Result<(Vec<u8>, u64, Mark), LogError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let inner = inner.lock();
            let export = inner.log.export_state(SNAPSHOT_BYTES_MAX)?;
            Ok((export, inner.applied.map_or(0, |l| l.index), inner.log.own_mark()))
        })
        .await
        .map_err(|e| LogError::Storage(format!("backup task: {e}")))?
    }

    /// Seeds a new member's state in `dir` from a backup's export (`tandem restore`): the
    /// backup's state, in the provisional epoch `epoch`, applied up to `index` by a group
    /// whose one member is `me` (at `node`). The member then starts as that group's only
    /// voter with its log purged up to `index`, so every member added later gets a Raft
    /// snapshot of the restored state, never the log entries of another history. Refuses a
    /// dir that already holds a state.
    pub fn restore(
        dir: &Path,
        dc: &str,
        export: &[u8],
        (me, node): (NodeId, BasicNode),
        index: u64,
        epoch: NonZeroU64,
    ) -> Result<(), String> {
        let mut log = RocksLog::create_with_epoch(dir, dc, epoch).map_err(|e| e.to_string())?;
        let id = LogId::new(openraft::CommittedLeaderId::new(0, me), index);
        let members = openraft::Membership::new(
            vec![std::collections::BTreeSet::from([me])],
            BTreeMap::from([(me, node)]),
        );
        let applied = encode_applied(&Some(id), &Membership::new(Some(id), members))?;
        log.restore_state(export, Some(&applied), epoch).map_err(|e| e.to_string())
    }

    /// Runs `f` with the state locked on a blocking thread.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner, &StateMachineCounters) -> SmResult<R> + Send + 'static,
    ) -> SmResult<R> {
        let (inner, counters) = (self.inner.clone(), self.counters.clone());
        tokio::task::spawn_blocking(move || f(&mut inner.lock(), &counters)).await.map_err(|e| {
            StorageIOError::write_state_machine(AnyError::error(format!("state machine task: {e}")))
        })?
    }
}

/// `[APPLIED_FORMAT_V1] ++ postcard((applied, membership))`.
fn encode_applied(applied: &Option<LogId<NodeId>>, membership: &Membership) -> Result<Vec<u8>, String> {
    postcard::to_extend(&(applied, membership), vec![APPLIED_FORMAT_V1]).map_err(|e| e.to_string())
}

fn decode_applied(bytes: &[u8]) -> Result<(Option<LogId<NodeId>>, Membership), String> {
    let (&format, body) = bytes.split_first().ok_or("empty applied state")?;
    if format != APPLIED_FORMAT_V1 {
        return Err(format!("applied state of format {format}, this build reads {APPLIED_FORMAT_V1}"));
    }
    let (value, rest) = postcard::take_from_bytes(body).map_err(|e| format!("applied state: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the applied state", rest.len()));
    }
    Ok(value)
}

/// The events of one batch being minted, not written yet.
#[derive(Default)]
struct Minting {
    events: Vec<ChangeEvent>,
    owners: Vec<(u64, Arc<str>)>,
    /// Minted state of the keys the batch changed (the registry's overlay).
    overlay: Overlay,
}

impl Inner {
    fn apply(&mut self, counters: &StateMachineCounters, entries: Vec<RaftEntry>) -> SmResult<Vec<Applied>> {
        let mut out = Vec::with_capacity(entries.len());
        let mut pending = Minting::default();
        let (mut applied, mut membership) = (self.applied, self.membership.clone());
        let mut unwritten = 0u64;
        for entry in entries {
            let log_id = entry.log_id;
            let mut answer = Applied { index: log_id.index, ..Applied::default() };
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => membership = StoredMembership::new(Some(log_id), m),
                EntryPayload::Normal(round) => {
                    answer.writes = round.writes.len() as u64;
                    let writes = round
                        .writes
                        .iter()
                        .map(|bytes| Write::decode(bytes))
                        .collect::<Result<Vec<Write>, String>>()
                        .map_err(|e| {
                            add(&counters.writes_corrupt, 1);
                            tracing::error!(?log_id, error = %e, "a Raft entry's write does not decode; stopping");
                            StorageIOError::apply(log_id, AnyError::error(e))
                        })?;
                    let groups = writes.iter().filter(|w| matches!(w, Write::Group(_))).count();
                    if groups > 0 && writes.len() > 1 {
                        // Refused whole, the same on every member: nothing of it applies.
                        add(&counters.writes_refused, writes.len() as u64);
                        let reason =
                            format!("a group write is alone in its round, this one holds {}", writes.len());
                        answer.outcomes = vec![WriteOutcome::Refused { reason }; writes.len()];
                    }
                    if groups == 1 && writes.len() == 1 {
                        let Some(Write::Group(write)) = writes.into_iter().next() else { unreachable!() };
                        // What the earlier entries of this call minted goes first, with
                        // their applied id; this write then carries its own.
                        if unwritten > 0 {
                            self.write(counters, &mut pending, applied, &membership)?;
                            add(&counters.entries_applied, std::mem::take(&mut unwritten));
                        }
                        answer.outcomes.push(self.apply_group(counters, log_id, &membership, write)?);
                        applied = Some(log_id);
                        add(&counters.entries_applied, 1);
                        out.push(answer);
                        continue;
                    }
                    let locals = if groups == 0 { writes } else { Vec::new() };
                    for write in locals {
                        let Write::Local(write) = write else { continue };
                        let outcome = self
                            .mint(&mut pending, write)
                            .map_err(|e| StorageIOError::apply(log_id, AnyError::new(&e)))?;
                        let c = match outcome {
                            WriteOutcome::Written { .. } => &counters.writes_written,
                            WriteOutcome::Unchanged => &counters.writes_unchanged,
                            WriteOutcome::Gone => &counters.writes_gone,
                            WriteOutcome::Refused { .. } | WriteOutcome::GroupRefused(_) => {
                                &counters.writes_refused
                            }
                            WriteOutcome::Group(_) => &counters.writes_group,
                        };
                        add(c, 1);
                        answer.outcomes.push(outcome);
                    }
                }
            }
            applied = Some(log_id);
            unwritten += 1;
            out.push(answer);
            if pending.events.len() >= APPLY_EVENTS_PER_BATCH_MAX {
                self.write(counters, &mut pending, applied, &membership)?;
                add(&counters.entries_applied, std::mem::take(&mut unwritten));
            }
        }
        if unwritten > 0 {
            self.write(counters, &mut pending, applied, &membership)?;
            add(&counters.entries_applied, unwritten);
        }
        Ok(out)
    }

    /// Writes the pending events with the applied state, in one synced batch.
    fn write(
        &mut self,
        counters: &StateMachineCounters,
        pending: &mut Minting,
        applied: Option<LogId<NodeId>>,
        membership: &Membership,
    ) -> SmResult<()> {
        let fail = |e: String| StorageIOError::write_state_machine(AnyError::error(e));
        let bytes = encode_applied(&applied, membership).map_err(fail)?;
        let Minting { events, owners, .. } = std::mem::take(pending);
        let changes =
            self.log.append_local_applied(&events, &owners, &bytes).map_err(|e| fail(e.to_string()))?;
        self.applied = applied;
        self.membership = membership.clone();
        add(&counters.batches, 1);
        let own_mark = self.log.own_mark();
        if let Some(hook) = self.on_apply.as_mut() {
            let index = applied.map_or(0, |l| l.index);
            hook(&CommitNotice { index, own_mark, committed: Committed::Local { events, changes } });
        }
        Ok(())
    }

    /// Applies one group write with `log_id` as the applied id in its own synced batch,
    /// as the committer serves the same request (the retired-DC guards included), and
    /// tells the hook what it changed.
    fn apply_group(
        &mut self,
        counters: &StateMachineCounters,
        log_id: LogId<NodeId>,
        membership: &Membership,
        write: GroupWrite,
    ) -> SmResult<WriteOutcome> {
        let bytes = encode_applied(&Some(log_id), membership)
            .map_err(|e| StorageIOError::write_state_machine(AnyError::error(e)))?;
        let result = self
            .log
            .with_applied(&bytes, |log| group_op(log, write))
            .map_err(|e| StorageIOError::apply(log_id, AnyError::new(&e)))?;
        self.applied = Some(log_id);
        self.membership = membership.clone();
        add(&counters.batches, 1);
        let (outcome, committed) = match result {
            Ok((outcome, committed)) => {
                add(&counters.writes_group, 1);
                (WriteOutcome::Group(outcome), committed)
            }
            Err(e) => {
                add(&counters.writes_refused, 1);
                (WriteOutcome::GroupRefused(e), None)
            }
        };
        let own_mark = self.log.own_mark();
        if let Some(hook) = self.on_apply.as_mut() {
            // Nothing to report still moves the index (an empty local notice).
            let committed = committed.unwrap_or(Committed::Local { events: Vec::new(), changes: Vec::new() });
            hook(&CommitNotice { index: log_id.index, own_mark, committed });
        }
        Ok(outcome)
    }

    /// Mints one write's event against the state applied so far and the pending batch.
    fn mint(&self, pending: &mut Minting, write: LocalWrite) -> Result<WriteOutcome, LogError> {
        let (event_id, time_ms) = (write.event_id, write.time_ms);
        let dc = self.log.local_dc();
        let (key, patch, owner) = write.into_patch();
        if *key.owner_dc != *dc {
            return Ok(WriteOutcome::Refused {
                reason: format!("instance {key:?} belongs to DC {}, this group is DC {dc}", key.owner_dc),
            });
        }
        let own = self.log.own_mark();
        let base = Mark { epoch: own.epoch, seq: own.seq + pending.events.len() as u64 };
        let held = if pending.overlay.contains_key(&key) {
            None
        } else {
            self.log.instance(&key)?.map(|(_, record)| record)
        };
        let before = pending.overlay.get(&key).cloned();
        let judged = patch.judged();
        let op = match patch.apply(&key, &mut pending.overlay, base.seq + 1, |_| held.map(Arc::new), judged) {
            Minted::Op(op) => op,
            Minted::Unchanged => return Ok(WriteOutcome::Unchanged),
            Minted::Gone => return Ok(WriteOutcome::Gone),
        };
        let event = ChangeEvent {
            event_id,
            origin_dc: dc.to_owned(),
            origin_epoch: base.epoch,
            seq: base.seq + 1,
            commit_time_ms: time_ms,
            op,
        };
        if let Err(e) = check_local_sequence(base, dc, std::slice::from_ref(&event)) {
            // The same on every member: no event, no seq; the overlay as it was.
            match before {
                Some(p) => pending.overlay.insert(key, p),
                None => pending.overlay.remove(&key),
            };
            tracing::error!(error = %e, "a Raft entry's write was refused at apply");
            return Ok(WriteOutcome::Refused { reason: e.to_string() });
        }
        if let Some(owner) = owner {
            pending.owners.push((event.seq, Arc::from(owner)));
        }
        let seq = event.seq;
        pending.events.push(event);
        Ok(WriteOutcome::Written { seq })
    }

    fn build_snapshot(&mut self, counters: &StateMachineCounters) -> SmResult<Snapshot<TypeConfig>> {
        let data = self
            .log
            .export_state(SNAPSHOT_BYTES_MAX)
            .map_err(|e| StorageIOError::read_state_machine(AnyError::new(&e)))?;
        let built = counters.snapshots_built.fetch_add(1, Ordering::Relaxed) + 1;
        self.snapshot_made = true;
        let meta = Meta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id: format!(
                "{}-{}-{built}",
                self.applied.map_or(0, |l| l.leader_id.term),
                self.applied.map_or(0, |l| l.index)
            ),
        };
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }

    fn install_snapshot(
        &mut self,
        counters: &StateMachineCounters,
        meta: &Meta,
        data: &[u8],
    ) -> SmResult<()> {
        let refuse = |e: String| {
            add(&counters.snapshots_refused, 1);
            tracing::error!(snapshot = %meta.snapshot_id, error = %e, "Raft snapshot refused");
            StorageError::from(StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(e)))
        };
        if data.len() > SNAPSHOT_BYTES_MAX {
            return Err(refuse(format!("{} bytes, at most {SNAPSHOT_BYTES_MAX}", data.len())));
        }
        let applied = encode_applied(&meta.last_log_id, &meta.last_membership).map_err(&refuse)?;
        // What the view held before, to tell it what changed (only when one follows).
        let before = match self.on_apply {
            Some(_) => Some(self.log.instances().map_err(|e| refuse(e.to_string()))?),
            None => None,
        };
        self.log.replace_state(data, &applied).map_err(|e| refuse(e.to_string()))?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.snapshot_made = true;
        add(&counters.snapshots_installed, 1);
        if let Some(before) = before {
            let after = self.log.instances().map_err(|e| {
                StorageIOError::read_state_machine(AnyError::error(format!("the installed state: {e}")))
            })?;
            let own_mark = self.log.own_mark();
            let index = self.applied.map_or(0, |l| l.index);
            let changes = difference(before, after);
            let marks = StateMarks {
                floor: self.log.purge_floor(),
                remote: self.log.marks(),
                retired: self.log.retired(),
            };
            if let Some(hook) = self.on_apply.as_mut() {
                hook(&CommitNotice { index, own_mark, committed: Committed::Replaced { changes, marks } });
            }
        }
        Ok(())
    }
}

/// One group write on the log, with the committer's guards: a retired DC's batches,
/// tombstone purges and acknowledgements change nothing, its snapshots are refused. The
/// outcome, and what to tell the view (`None`: nothing changed in it).
fn group_op(log: &mut RocksLog, write: GroupWrite) -> Result<(GroupOutcome, Option<Committed>), LogError> {
    let retired = |log: &RocksLog, dc: &str| log.retired().contains_key(dc);
    // The answer leaves the changes out: the view hears them through the notice.
    let lean = |report: &ApplyReport| ApplyReport { changes: Vec::new(), ..report.clone() };
    Ok(match write {
        GroupWrite::Remote { channel_dc, .. } if retired(log, &channel_dc) => {
            let refusal = Some(Refusal::Retired { dc: channel_dc });
            (GroupOutcome::Merged(ApplyReport { refusal, ..ApplyReport::default() }), None)
        }
        GroupWrite::RemoteSnapshot { channel_dc, .. } | GroupWrite::StageChunk { channel_dc, .. }
            if retired(log, &channel_dc) =>
        {
            return Err(LogError::Refused(Refusal::Retired { dc: channel_dc }));
        }
        GroupWrite::PurgeRemoteTombstones { origin: dc, .. } | GroupWrite::PeerAck { peer: dc, .. }
            if retired(log, &dc) =>
        {
            (GroupOutcome::Done, None)
        }
        GroupWrite::Remote { channel_dc, events } => {
            let report = log.apply_remote(&channel_dc, &events)?;
            (GroupOutcome::Merged(lean(&report)), Some(Committed::Remote { origin: channel_dc, report }))
        }
        GroupWrite::RemoteSnapshot { channel_dc, snapshot } => {
            let report = log.install_snapshot(&channel_dc, &snapshot)?;
            (GroupOutcome::Merged(lean(&report)), Some(Committed::Snapshot { origin: channel_dc, report }))
        }
        GroupWrite::StageChunk { channel_dc, chunk } => {
            match log.stage_snapshot_chunk(&channel_dc, &chunk)? {
                ChunkOutcome::Staged(staged) => (GroupOutcome::Chunk(ChunkOutcome::Staged(staged)), None),
                ChunkOutcome::Installed(report) => (
                    GroupOutcome::Chunk(ChunkOutcome::Installed(lean(&report))),
                    Some(Committed::Snapshot { origin: channel_dc, report }),
                ),
            }
        }
        GroupWrite::PurgeOwn { upto_seq } => {
            let tombstones_removed = log.purge_own_reporting(upto_seq)?;
            let floor = log.purge_floor();
            (GroupOutcome::PurgedOwn { floor }, Some(Committed::PurgedOwn { floor, tombstones_removed }))
        }
        GroupWrite::PurgeRemoteTombstones { origin, upto_seq } => {
            let tombstones_removed = log.purge_remote_tombstones_reporting(&origin, upto_seq)?;
            (GroupOutcome::Done, Some(Committed::PurgedRemoteTombstones { origin, tombstones_removed }))
        }
        GroupWrite::PeerAck { peer, mark } => {
            log.record_peer_ack(&peer, mark)?;
            (GroupOutcome::Done, None)
        }
        GroupWrite::Retire { dc, at_ms } => {
            let r = log.retire_origin(&dc, at_ms)?;
            let committed = r.newly.then(|| Committed::Retired {
                origin: dc,
                at_ms: r.at_ms,
                changes: r.changes.clone(),
            });
            (GroupOutcome::Retired(crate::store::Retirement { changes: Vec::new(), ..r }), committed)
        }
        GroupWrite::Unretire { dc } => {
            let lifted = log.unretire_origin(&dc)?;
            (GroupOutcome::Unretired { lifted }, lifted.then_some(Committed::Unretired { origin: dc }))
        }
        GroupWrite::BeginEpoch { above, tiebreak } => {
            let own = log.own_mark();
            if own.epoch <= above {
                log.begin_epoch(tandem_replicator::epoch::above(above.max(own.epoch), tiebreak))?;
            }
            (GroupOutcome::Epoch { own: log.own_mark() }, None)
        }
        GroupWrite::Rescope { origin, scope } => {
            let r = log.rescope(&origin, &scope)?;
            let committed = (!r.changes.is_empty())
                .then(|| Committed::Rescoped { origin: origin.clone(), changes: r.changes.clone() });
            (GroupOutcome::Rescoped(Rescope { changes: Vec::new(), ..r }), committed)
        }
    })
}

/// The changes that turn the live records `before` into `after`: a removal for each key
/// gone, a put for each key new or held at another seq; by key.
pub(super) fn difference(
    before: Vec<(u64, InstanceRecord)>,
    after: Vec<(u64, InstanceRecord)>,
) -> Vec<StateChange> {
    let mut gone: BTreeMap<InstanceKey, u64> = before.into_iter().map(|(seq, r)| (r.key, seq)).collect();
    let mut changes = Vec::new();
    for (seq, record) in after {
        if gone.remove(&record.key) != Some(seq) {
            changes.push(StateChange::Put { seq, record });
        }
    }
    changes.extend(gone.into_keys().map(|key| StateChange::Remove { key }));
    changes
}

impl RaftSnapshotBuilder<TypeConfig> for RegistryStateMachine {
    async fn build_snapshot(&mut self) -> SmResult<Snapshot<TypeConfig>> {
        self.blocking(|inner, counters| inner.build_snapshot(counters)).await
    }
}

impl RaftStateMachine<TypeConfig> for RegistryStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> SmResult<(Option<LogId<NodeId>>, Membership)> {
        let inner = self.inner.lock();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> SmResult<Vec<Applied>>
    where
        I: IntoIterator<Item = RaftEntry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<RaftEntry> = entries.into_iter().collect();
        self.blocking(move |inner, counters| inner.apply(counters, entries)).await
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> SmResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<Cursor<Vec<u8>>>) -> SmResult<()> {
        let meta = meta.clone();
        let data = snapshot.into_inner();
        self.blocking(move |inner, counters| inner.install_snapshot(counters, &meta, &data)).await
    }

    /// Built from the state now (snapshots are not kept; see the module docs): never older
    /// than the last one built or installed. None before the first one since the state was
    /// opened: openraft builds one at start when it purged logs, and purges only behind a
    /// snapshot, so a start does not export the whole state for nothing.
    async fn get_current_snapshot(&mut self) -> SmResult<Option<Snapshot<TypeConfig>>> {
        let none_yet = !self.inner.lock().snapshot_made;
        if none_yet {
            return Ok(None);
        }
        self.blocking(|inner, counters| inner.build_snapshot(counters)).await.map(Some)
    }
}
