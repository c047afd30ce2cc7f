//! [`GroupLog`]: the committer's log on the leader of a DC's group (docs/cluster.md).
//!
//! The committer stays the one sequencer and the batcher: it runs its rounds exactly as on
//! a single node, and each write it makes reaches this log, which proposes it as one Raft
//! entry (`client_write`) and returns once the entry is applied here. A round of local
//! appends is one entry of [`LocalWrite`]s (each event back to the change that minted
//! it); every other request is one [`GroupWrite`]. Reads come from the state machine's
//! RocksLog. The node's view is fed by the state machine's hook on every member, so the
//! changes this log returns to the committer are empty (the committer's own notices then
//! carry none, and the view is not told twice).
//!
//! Seqs: the committer's builders mint against the leader's view, which is the applied
//! state (one round in flight, applied before the next is built), and the state machine
//! mints again at apply with the same rules: the same events. The log checks it (every
//! write answered `Written` at the seq the builder gave); a difference is an error.
//!
//! Not leading, or an entry whose outcome is unknown (a timeout, a leader change while
//! it was in flight): the log turns unwritable, the committer refuses writes and calls
//! [`CommitLog::recover`], which succeeds once this node leads with every earlier entry
//! applied (`ensure_linearizable`); the write in doubt is then settled from the state.
//! A refusal by the log's rules is the state machine's answer, the same as the
//! committer's on a single node.

// openraft's error types are large, and its API fixes them.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::Raft;
use tandem_replicator::log::{
    ApplyReport, ChunkOutcome, EventLog, LogError, Rescope, SnapshotReader, StateChange,
};
use tandem_replicator::merge::Held;
use tandem_replicator::scope::Scope;
use tandem_schemas::{
    ChangeEvent, InstanceKey, InstanceRecord, Mark, Op, Snapshot, SnapshotChunk, StagedSnapshot, Tombstone,
};
use uuid::Uuid;

use super::write::{Change, GroupWrite, LocalWrite};
use super::{GroupOutcome, RegistryStateMachine, Round, TypeConfig, WriteOutcome};
use crate::store::{CommitLog, RaftLogStore, Retirement};

/// How long one proposal may take before its outcome counts as unknown.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The committer's log on a group's leader. See the module docs.
pub struct GroupLog {
    raft: Raft<TypeConfig>,
    sm: RegistryStateMachine,
    rt: tokio::runtime::Handle,
    dc: String,
    /// Cleared when an entry's outcome is unknown or this node does not lead.
    writable: bool,
    /// The term in which this node, leading, had applied every earlier entry.
    ready_term: Option<u64>,
    /// Entries proposed and applied (this log's synced writes: each is fsynced on a quorum).
    proposals: u64,
    /// How long one proposal (or the wait to lead) may take.
    timeout: Duration,
    /// The member's Raft log, whose memtables a quiet spell flushes with the state's.
    raft_store: Option<RaftLogStore>,
}

impl GroupLog {
    /// The log over `raft` and its state machine `sm`, proposing on `rt` (the committer's
    /// thread is no runtime thread and blocks on it).
    pub fn new(raft: Raft<TypeConfig>, sm: RegistryStateMachine, rt: tokio::runtime::Handle) -> GroupLog {
        let dc = sm.with_log(|log| log.local_dc().to_owned());
        GroupLog {
            raft,
            sm,
            rt,
            dc,
            writable: true,
            ready_term: None,
            proposals: 0,
            timeout: PROPOSE_TIMEOUT,
            raft_store: None,
        }
    }

    /// The same log with another proposal timeout (tests use a short one).
    pub fn with_timeout(mut self, timeout: Duration) -> GroupLog {
        self.timeout = timeout;
        self
    }

    /// The same log, flushing the memtables of the member's Raft log too when quiet
    /// ([`CommitLog::flush_idle_memtables`]).
    pub fn with_raft_store(mut self, store: RaftLogStore) -> GroupLog {
        self.raft_store = Some(store);
        self
    }

    /// Waits (bounded) until this node leads with every entry of earlier terms applied.
    fn ready(&mut self) -> Result<(), LogError> {
        let term = self.raft.metrics().borrow().current_term;
        if self.ready_term == Some(term) {
            return Ok(());
        }
        let (raft, timeout) = (self.raft.clone(), self.timeout);
        // The timer is made inside the runtime: this thread is none of its own.
        match self.rt.block_on(async move { tokio::time::timeout(timeout, raft.ensure_linearizable()).await })
        {
            Ok(Ok(_)) => {
                self.ready_term = Some(term);
                Ok(())
            }
            Ok(Err(e)) => Err(LogError::Storage(format!("this node does not lead the group: {e}"))),
            Err(_) => Err(LogError::Storage(format!("no quorum within {:?}", self.timeout))),
        }
    }

    /// Proposes `round` and returns what applying it answered; unknown outcomes make the
    /// log unwritable.
    fn propose(&mut self, round: Round) -> Result<Vec<WriteOutcome>, LogError> {
        if !self.writable {
            return Err(LogError::Storage("the group's log is not writable here".into()));
        }
        if let Err(e) = self.ready() {
            self.writable = false;
            return Err(e);
        }
        let (raft, timeout) = (self.raft.clone(), self.timeout);
        match self.rt.block_on(async move { tokio::time::timeout(timeout, raft.client_write(round)).await }) {
            Ok(Ok(answer)) => {
                self.proposals += 1;
                Ok(answer.data.outcomes)
            }
            Ok(Err(e)) => {
                self.writable = false;
                Err(LogError::Storage(format!("the group did not commit the entry: {e}")))
            }
            Err(_) => {
                self.writable = false;
                Err(LogError::Storage(format!("the entry was not applied within {:?}", self.timeout)))
            }
        }
    }

    /// Proposes one group write and returns its outcome (or the log's refusal).
    fn group(&mut self, write: GroupWrite) -> Result<GroupOutcome, LogError> {
        let round = Round::of_group_write(&write).map_err(|e| LogError::Invalid(e.to_string()))?;
        match self.propose(round)?.pop() {
            Some(WriteOutcome::Group(outcome)) => Ok(outcome),
            Some(WriteOutcome::GroupRefused(e)) => Err(e),
            other => Err(self.differs(format!("a group write answered {other:?}"))),
        }
    }

    /// Whether a write would change nothing, judged by `unchanged` on the applied state
    /// once this node leads with every earlier entry applied (the state a proposal would
    /// meet). Such a write is not proposed.
    fn changes_nothing(
        &mut self,
        unchanged: impl FnOnce(&crate::store::RocksLog) -> Result<bool, LogError>,
    ) -> Result<bool, LogError> {
        if !self.writable {
            return Ok(false);
        }
        if let Err(e) = self.ready() {
            self.writable = false;
            return Err(e);
        }
        self.read(unchanged)
    }

    /// A write of the take-over (outside the committer's rounds: a peer's replication
    /// scope): when an earlier one left the log unwritable (the lead lost while it was in
    /// flight), the log recovers first (once this node leads with every earlier entry
    /// applied). Only the committer's own failed writes start its recovery: without this,
    /// a take-over interrupted once would fail on every retry until a client's write came,
    /// which never comes while no member serves writes.
    pub fn take_over_write<R>(
        &mut self,
        write: impl FnOnce(&mut Self) -> Result<R, LogError>,
    ) -> Result<R, LogError> {
        if !self.writable {
            CommitLog::recover(self)?;
        }
        write(self)
    }

    /// The state machine answered other than the committer built: an error, and the log
    /// is unwritable until a recovery (the state says what happened).
    fn differs(&mut self, what: String) -> LogError {
        self.writable = false;
        tracing::error!(%what, "the group applied a write otherwise than the leader built it");
        LogError::Corrupt(what)
    }

    fn read<R>(&self, f: impl FnOnce(&crate::store::RocksLog) -> R) -> R {
        self.sm.with_log(f)
    }
}

/// The change that minted `event`, with the owner it records.
fn change_of(event: &ChangeEvent, owners: &[(u64, Arc<str>)]) -> Change {
    let owner = owners.iter().find(|(seq, _)| *seq == event.seq).map(|(_, o)| o.to_string());
    match &event.op {
        // A registration, or a change of a live record's fields: the whole record, which
        // the apply mints as a registration or an update, as the builder did.
        Op::Register(r) | Op::Update(r) => Change::Register { record: r.clone(), owner },
        Op::Deregister { key, reason } => Change::Deregister { key: key.clone(), reason: *reason },
    }
}

impl EventLog for GroupLog {
    fn local_dc(&self) -> &str {
        &self.dc
    }
    fn own_mark(&self) -> Mark {
        self.read(|log| log.own_mark())
    }
    fn mark_of(&self, origin: &str) -> Option<Mark> {
        self.read(|log| log.mark_of(origin))
    }
    fn marks(&self) -> BTreeMap<String, Mark> {
        self.read(|log| log.marks())
    }
    fn purge_floor(&self) -> u64 {
        self.read(|log| log.purge_floor())
    }
    fn mark_event_id(&self, origin: &str) -> Option<Uuid> {
        self.read(|log| log.mark_event_id(origin))
    }
    fn own_event_id(&self, seq: u64) -> Result<Option<Uuid>, LogError> {
        self.read(|log| log.own_event_id(seq))
    }
    /// Refused: a group changes its epoch with [`GroupWrite::BeginEpoch`] (above a given
    /// epoch, with a tiebreak, decided at apply), never to an exact epoch chosen by one
    /// member. Nothing is written.
    fn begin_epoch(&mut self, epoch: u64) -> Result<(), LogError> {
        Err(LogError::Invalid(format!(
            "a group begins a new epoch through the log (above the current one), not at {epoch}"
        )))
    }
    fn append_local(&mut self, events: &[ChangeEvent]) -> Result<(), LogError> {
        self.append_local_owned(events, &[]).map(drop)
    }
    fn read_own(&self, after_seq: u64, max: usize) -> Result<Vec<ChangeEvent>, LogError> {
        self.read(|log| log.read_own(after_seq, max))
    }
    fn apply_remote(&mut self, channel_dc: &str, events: &[ChangeEvent]) -> Result<ApplyReport, LogError> {
        let write = GroupWrite::Remote { channel_dc: channel_dc.to_owned(), events: events.to_vec() };
        match self.group(write)? {
            GroupOutcome::Merged(report) => Ok(report),
            other => Err(self.differs(format!("a remote batch answered {other:?}"))),
        }
    }
    fn install_snapshot(&mut self, channel_dc: &str, snap: &Snapshot) -> Result<ApplyReport, LogError> {
        let write = GroupWrite::RemoteSnapshot { channel_dc: channel_dc.to_owned(), snapshot: snap.clone() };
        match self.group(write)? {
            GroupOutcome::Merged(report) => Ok(report),
            other => Err(self.differs(format!("a remote snapshot answered {other:?}"))),
        }
    }
    fn snapshot_own(&self) -> Result<Snapshot, LogError> {
        self.read(|log| log.snapshot_own())
    }
    fn open_snapshot(&self, chunk_bytes_max: usize) -> Result<Box<dyn SnapshotReader>, LogError> {
        self.read(|log| log.open_snapshot(chunk_bytes_max))
    }
    fn staged_snapshot(&self, origin: &str) -> Result<Option<StagedSnapshot>, LogError> {
        self.read(|log| log.staged_snapshot(origin))
    }
    fn stage_snapshot_chunk(
        &mut self,
        channel_dc: &str,
        chunk: &SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        let write = GroupWrite::StageChunk { channel_dc: channel_dc.to_owned(), chunk: chunk.clone() };
        match self.group(write)? {
            GroupOutcome::Chunk(outcome) => Ok(outcome),
            other => Err(self.differs(format!("a snapshot chunk answered {other:?}"))),
        }
    }
    fn purge_own(&mut self, upto_seq: u64) -> Result<(), LogError> {
        self.purge_own_reporting(upto_seq).map(drop)
    }
    fn purge_remote_tombstones(&mut self, origin: &str, upto_seq: u64) -> Result<(), LogError> {
        self.purge_remote_tombstones_reporting(origin, upto_seq).map(drop)
    }
    fn scope_of(&self, origin: &str) -> Scope {
        self.read(|log| log.scope_of(origin))
    }
    fn rescope(&mut self, origin: &str, scope: &Scope) -> Result<Rescope, LogError> {
        match self.group(GroupWrite::Rescope { origin: origin.to_owned(), scope: scope.clone() })? {
            GroupOutcome::Rescoped(r) => Ok(r),
            other => Err(self.differs(format!("a rescope answered {other:?}"))),
        }
    }
    fn held(&self, key: &InstanceKey) -> Held {
        self.read(|log| log.held(key))
    }
    fn instances(&self) -> Result<Vec<(u64, InstanceRecord)>, LogError> {
        self.read(|log| log.instances())
    }
    fn tombstones(&self) -> Result<Vec<Tombstone>, LogError> {
        self.read(|log| log.tombstones())
    }
}

impl CommitLog for GroupLog {
    /// The applied Raft index (the watch index of every member's view).
    fn index(&self) -> u64 {
        self.sm.applied_index()
    }
    /// The index follows the applied Raft index; a restart moves it by itself.
    fn set_next_index(&mut self, _idx: u64) {}
    fn sync_writes(&self) -> u64 {
        self.proposals
    }
    /// The state's memtables and the Raft log's (a local matter of each member: nothing
    /// is proposed).
    fn flush_idle_memtables(&mut self) -> Result<u64, LogError> {
        let state = self.sm.with_log(|log| log.flush_idle_memtables())?;
        let raft = self.raft_store.as_ref().map_or(Ok(0), |store| store.flush_idle_memtables())?;
        Ok(state + raft)
    }
    fn peer_acks(&self) -> BTreeMap<String, Mark> {
        self.read(|log| log.peer_acks())
    }
    /// An acknowledgement that moves nothing is not proposed (as RocksLog writes none): a
    /// peer acknowledges now and then while nothing is written, and each would be an entry,
    /// a synced write on a quorum, that also keeps the members from going quiet.
    fn record_peer_ack(&mut self, peer: &str, mark: Mark) -> Result<(), LogError> {
        if self.changes_nothing(|log| Ok(log.peer_acks().get(peer) == Some(&mark)))? {
            return Ok(());
        }
        match self.group(GroupWrite::PeerAck { peer: peer.to_owned(), mark })? {
            GroupOutcome::Done => Ok(()),
            other => Err(self.differs(format!("a peer acknowledgement answered {other:?}"))),
        }
    }
    fn append_local_with_changes(&mut self, events: &[ChangeEvent]) -> Result<Vec<StateChange>, LogError> {
        self.append_local_owned(events, &[])
    }
    fn append_local_owned(
        &mut self,
        events: &[ChangeEvent],
        owners: &[(u64, Arc<str>)],
    ) -> Result<Vec<StateChange>, LogError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let writes: Vec<LocalWrite> = events
            .iter()
            .map(|e| LocalWrite {
                event_id: e.event_id,
                time_ms: e.commit_time_ms,
                change: change_of(e, owners),
            })
            .collect();
        let round = Round::of_writes(&writes).map_err(|e| LogError::Invalid(e.to_string()))?;
        let outcomes = self.propose(round)?;
        for (event, outcome) in events.iter().zip(&outcomes) {
            if *outcome != (WriteOutcome::Written { seq: event.seq }) {
                return Err(self.differs(format!(
                    "event {} built at seq {} was applied as {outcome:?}",
                    event.event_id, event.seq
                )));
            }
        }
        if outcomes.len() != events.len() {
            return Err(self.differs(format!(
                "{} events answered {} outcomes",
                events.len(),
                outcomes.len()
            )));
        }
        // The view hears of them through the state machine's hook.
        Ok(Vec::new())
    }
    fn owners(&self) -> Result<Vec<(InstanceKey, Arc<str>)>, LogError> {
        self.read(|log| log.owners())
    }
    fn purge_own_reporting(&mut self, upto_seq: u64) -> Result<Vec<InstanceKey>, LogError> {
        match self.group(GroupWrite::PurgeOwn { upto_seq })? {
            GroupOutcome::PurgedOwn { .. } => Ok(Vec::new()),
            other => Err(self.differs(format!("a purge answered {other:?}"))),
        }
    }
    fn purge_remote_tombstones_reporting(
        &mut self,
        origin: &str,
        upto_seq: u64,
    ) -> Result<Vec<InstanceKey>, LogError> {
        // A peer names its purge floor now and then while nothing is written: a purge that
        // removes nothing is not proposed (RocksLog writes none either).
        if self.changes_nothing(|log| Ok(log.purgeable_remote_tombstones(origin, upto_seq)? == 0))? {
            return Ok(Vec::new());
        }
        match self.group(GroupWrite::PurgeRemoteTombstones { origin: origin.to_owned(), upto_seq })? {
            GroupOutcome::Done => Ok(Vec::new()),
            other => Err(self.differs(format!("a tombstone purge answered {other:?}"))),
        }
    }
    fn writable(&self) -> bool {
        self.writable
    }
    /// Succeeds once this node leads with every earlier entry applied.
    fn recover(&mut self) -> Result<(), LogError> {
        self.ready_term = None;
        self.ready()?;
        self.writable = true;
        Ok(())
    }
    fn retired(&self) -> BTreeMap<String, u64> {
        self.read(|log| log.retired())
    }
    fn retire_origin(&mut self, dc: &str, at_ms: u64) -> Result<Retirement, LogError> {
        match self.group(GroupWrite::Retire { dc: dc.to_owned(), at_ms })? {
            GroupOutcome::Retired(r) => Ok(r),
            other => Err(self.differs(format!("a retirement answered {other:?}"))),
        }
    }
    fn unretire_origin(&mut self, dc: &str) -> Result<bool, LogError> {
        match self.group(GroupWrite::Unretire { dc: dc.to_owned() })? {
            GroupOutcome::Unretired { lifted } => Ok(lifted),
            other => Err(self.differs(format!("lifting a retirement answered {other:?}"))),
        }
    }
    /// Through the log: every member begins the same epoch at the same entry.
    fn begin_epoch_above(&mut self, above: u64, tiebreak: u64) -> Result<Mark, LogError> {
        match self.group(GroupWrite::BeginEpoch { above, tiebreak })? {
            GroupOutcome::Epoch { own } => Ok(own),
            other => Err(self.differs(format!("an epoch request answered {other:?}"))),
        }
    }
}
