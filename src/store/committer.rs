//! [`Committer`]: the single sequencer of a DC's writes, with group commit.
//!
//! The committer owns the log, a [`CommitLog`]: the [`RocksLog`] in production, or the
//! in-memory [`MemStore`](super::MemStore) in the node simulation. It runs in one of two
//! modes with the same rounds: on its own OS thread ([`Committer::spawn`]), or inline
//! ([`Committer::inline`]), where the owner runs each round when it chooses
//! ([`InlineCommitter::run_round`]), so a simulation decides every interleaving.
//!
//! One OS thread owns the log. Requests arrive over a bounded channel; the thread
//! takes every request already waiting (up to [`CommitterLimits::group_requests_max`]) and
//! serves them in arrival order. Consecutive local appends are combined: each request's
//! builder is called with the own mark so far (the thread assigns the seqs), and the
//! group's events are written with one `WriteBatch` and one fsync. Every other request is
//! one batch of its own, in order. After each durable write the `on_commit` callback sees
//! what changed, then the callers get their answers: an in-memory view fed by `on_commit`
//! is never behind an acknowledged write.
//!
//! This is the one boundary that sequences a DC's writes. On a DC's Raft group, the
//! leader's committer runs over a `cluster::GroupLog`: each of its writes becomes one Raft
//! entry, applied on every member by the state machine (docs/cluster.md).
//!
//! A failed write (a full disk, an I/O error, too few descriptors) leaves the log not
//! writable: its outcome on disk is unknown. From then on every write is refused at once
//! with [`CommitError::Unwritable`] (nothing of it is written; reads still run), and the
//! committer retries [`CommitLog::recover`] with backoff (RocksDB: reopen and one probe
//! write) until it succeeds; no restart is needed. The failed write is settled only then:
//! the recovered log says whether it landed, and its callers get that answer (a local
//! append that landed is acknowledged, and `on_commit` sees it like any write). The state
//! is shared through [`LogHealth`] (`log_writable` in status and metrics, readiness).
//! `recovery.rs` holds this part.
//!
//! Must never: reply before the write is durable, reorder requests, or block on async
//! code (the thread is not a tokio worker; it only uses `blocking_recv` and `try_recv`).

use std::io;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tandem_replicator::log::{check_local_sequence, ApplyReport, ChunkOutcome, LogError, StateChange};
use tandem_replicator::merge::Refusal;
use tandem_schemas::{ChangeEvent, InstanceKey, Mark, Snapshot, SnapshotChunk};
use tokio::sync::{mpsc, oneshot, watch};

use super::{CommitLog, Retirement, RocksLog};

mod durations;
mod hand_out;
mod handle;
mod linger;
mod recovery;

pub use durations::{Durations, SyncBreakdown, DURATION_BUCKETS_US};
pub use handle::{AppendLocal, CommitterHandle, InlineCommitter};
use recovery::{InDoubt, Recovery};
pub use recovery::{LogHealth, LogHealthReport};

/// Builds the events of one local append. Called on the committer thread with the own mark
/// as it will stand before these events (earlier requests of the same group included); the
/// events must continue it: seqs `mark.seq + 1, mark.seq + 2, …` of `mark.epoch`.
///
/// Builders of one group run one after the other before the group's write; a builder does
/// not see the effects of earlier builders of its group in the `on_commit` view (they are
/// not durable yet), so a caller that derives an event from current state must account for
/// its own in-flight writes.
pub type BuildEvents = Box<dyn FnOnce(Mark) -> Built + Send>;

/// What a builder returns: its events and, for registrations among them, the principal
/// that owns the instance from then on (by the event's seq). The owners are written in the
/// same durable batch as the events and stay in this DC (see [`CommitLog::append_local_owned`]).
#[derive(Clone, Debug, Default)]
pub struct Built {
    pub events: Vec<ChangeEvent>,
    pub owners: Vec<(u64, Arc<str>)>,
}

/// Runs on the committer thread once the outcome of a local append is known, before its
/// caller is answered and whether or not the caller still waits (it may have gone away):
/// `true` when its events are durable (and `on_commit` has seen them), `false` when
/// nothing of it was written. `ran`: whether the builder was called. This is where a
/// writer undoes what its builder did besides building events (overlay entries, leases):
/// a caller dropped mid-write cannot do it.
pub type Settle = Box<dyn FnOnce(Settled) + Send>;

/// The outcome a [`Settle`] hook is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The events are durable.
    pub written: bool,
    /// The builder was called (a request refused before its turn was not built).
    pub ran: bool,
}

/// Runs on the committer thread with the log, between two writes. Meant for reads that
/// must see a consistent log (`snapshot_own`, `read_own`, …); a mutation made here is
/// durable but is not reported to `on_commit`.
pub type WithLogFn<L = RocksLog> = Box<dyn FnOnce(&mut L) + Send>;

/// Runs on the committer thread with the log, read only. It sees the log as of the last
/// durable write, as every reader does, so it is served where it stands in a round of
/// local appends without splitting their group into two synced writes, and while a
/// linger gathers writers without ending it (see [`Request::ReadLog`]).
pub type ReadLogFn<L = RocksLog> = Box<dyn FnOnce(&L) + Send>;

/// Called on the committer thread after every durable write, in commit order, before any
/// caller of that write is answered. It must be quick and must not wait for the committer.
pub type OnCommit = Box<dyn FnMut(&CommitNotice) + Send>;

/// Answer channel of one request.
pub type Reply<T> = oneshot::Sender<Result<T, CommitError>>;

/// Number of buckets of [`CommitStats::local_group_requests`].
pub const GROUP_SIZE_BUCKETS: usize = 11;

/// A request to the committer thread. [`CommitterHandle`] has one method per variant.
pub enum Request<L = RocksLog> {
    /// Append own events; answered with the events as written. `settle` runs once the
    /// outcome is known (see [`Settle`]). `queued`: when the request was made (its wait
    /// for the committer is timed from there, [`CommitStats::local_queued`]).
    LocalAppend {
        build: BuildEvents,
        settle: Option<Settle>,
        reply: Reply<Vec<ChangeEvent>>,
        queued: std::time::Instant,
    },
    /// [`EventLog::apply_remote`](tandem_replicator::log::EventLog::apply_remote) of a batch received over the channel of `channel_dc`.
    RemoteApply { channel_dc: String, events: Vec<ChangeEvent>, reply: Reply<ApplyReport> },
    /// [`EventLog::install_snapshot`](tandem_replicator::log::EventLog::install_snapshot).
    InstallSnapshot { channel_dc: String, snapshot: Snapshot, reply: Reply<ApplyReport> },
    /// [`EventLog::stage_snapshot_chunk`](tandem_replicator::log::EventLog::stage_snapshot_chunk):
    /// the last chunk installs the snapshot (reported to `on_commit` as one).
    StageChunk { channel_dc: String, chunk: SnapshotChunk, reply: Reply<ChunkOutcome> },
    /// [`EventLog::purge_own`](tandem_replicator::log::EventLog::purge_own); answered with the purge floor after it.
    PurgeOwn { upto_seq: u64, reply: Reply<u64> },
    /// [`EventLog::purge_remote_tombstones`](tandem_replicator::log::EventLog::purge_remote_tombstones).
    PurgeRemoteTombstones { origin: String, upto_seq: u64, reply: Reply<()> },
    /// [`RocksLog::record_peer_ack`].
    PeerAck { peer: String, mark: Mark, reply: Reply<()> },
    /// [`CommitLog::retire_origin`].
    Retire { dc: String, at_ms: u64, reply: Reply<Retirement> },
    /// [`CommitLog::unretire_origin`].
    Unretire { dc: String, reply: Reply<bool> },
    /// Run a function with the log (see [`WithLogFn`]).
    WithLog(WithLogFn<L>),
    /// Run a read-only function with the log (see [`ReadLogFn`]): the replication
    /// gateway's reads of the own events to ship and of the marks it checks, which come
    /// while the DC's writers keep the committer busy.
    ReadLog(ReadLogFn<L>),
    /// Serve what came before, close the log, then answer. Requests after it are dropped
    /// unanswered: their callers get [`CommitError::Stopped`].
    Shutdown { reply: oneshot::Sender<()> },
}

impl<L> Request<L> {
    /// A local append made now (its wait for the committer is timed from here).
    pub fn local_append(build: BuildEvents, settle: Option<Settle>, reply: Reply<Vec<ChangeEvent>>) -> Self {
        Request::LocalAppend { build, settle, reply, queued: std::time::Instant::now() }
    }
}

/// Errors of a committer request.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The log refused or failed the request; see [`LogError`] for whether state changed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The committer thread has stopped (shut down, or died) before answering. The
    /// request may or may not have been written.
    #[error("the committer has stopped; the request may or may not have been written")]
    Stopped,
    /// The builder of a local append panicked. Nothing of this request was written.
    #[error("the event builder panicked; nothing of the request was written")]
    BuilderPanicked,
    /// The log cannot be written now (a write failed; recovery is retried with backoff).
    /// Nothing of this request was written; retry later.
    #[error("the event log cannot be written now ({reason}); nothing was written, retry later")]
    Unwritable { reason: String },
}

/// Default longest group-commit linger, in microseconds.
pub const LINGER_MAX_US_DEFAULT: u64 = 2_000;
/// Default sleep between two looks for new requests while lingering, in microseconds.
pub const LINGER_GAP_US_DEFAULT: u64 = 50;
/// A linger ends once this many gaps (`linger_gap`) pass with no new request: the writers
/// that were coming are in.
pub const LINGER_QUIET_GAPS: u32 = 3;
/// Default largest round a linger waits for.
pub const LINGER_TARGET_DEFAULT: usize = 64;
/// Default first wait before a recovery attempt after a failed write, in milliseconds.
pub const RECOVERY_BACKOFF_INITIAL_MS_DEFAULT: u64 = 100;
/// Default longest wait between two recovery attempts, in milliseconds.
pub const RECOVERY_BACKOFF_MAX_MS_DEFAULT: u64 = 5_000;

/// Bounds of the committer's queue and groups.
#[derive(Clone, Copy, Debug)]
pub struct CommitterLimits {
    /// Requests that may wait in the channel; senders wait when it is full.
    pub queue_requests_max: NonZeroUsize,
    /// Requests taken from the channel per round.
    pub group_requests_max: NonZeroUsize,
    /// A local group is written as soon as it holds this many events.
    pub group_events_max: NonZeroUsize,
    /// Group-commit linger: when a round already holds at least two requests (writers
    /// are concurrent), the thread keeps collecting for at most this long before it
    /// writes, so that one fsync carries more requests. Zero turns lingering off.
    pub linger_max: std::time::Duration,
    /// How long each sleep of a linger lasts before the thread looks for new requests.
    /// A linger also ends once [`LINGER_QUIET_GAPS`] of these pass with none.
    pub linger_gap: std::time::Duration,
    /// A linger never waits for a round larger than this.
    pub linger_target: usize,
    /// After a failed write, the first recovery attempt waits this long; each failed
    /// attempt doubles the wait, up to `recovery_backoff_max`.
    pub recovery_backoff_initial: Duration,
    pub recovery_backoff_max: Duration,
}

impl Default for CommitterLimits {
    fn default() -> Self {
        CommitterLimits {
            queue_requests_max: NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN),
            group_requests_max: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            group_events_max: NonZeroUsize::new(8192).unwrap_or(NonZeroUsize::MIN),
            linger_max: std::time::Duration::from_micros(LINGER_MAX_US_DEFAULT),
            linger_gap: std::time::Duration::from_micros(LINGER_GAP_US_DEFAULT),
            linger_target: LINGER_TARGET_DEFAULT,
            recovery_backoff_initial: Duration::from_millis(RECOVERY_BACKOFF_INITIAL_MS_DEFAULT),
            recovery_backoff_max: Duration::from_millis(RECOVERY_BACKOFF_MAX_MS_DEFAULT),
        }
    }
}

/// What a replaced state holds besides its instances (see [`Committed::Replaced`]): what
/// the node's readers of marks follow without the log (status, metrics, the gateway's
/// retired DCs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateMarks {
    /// The own log's purge floor.
    pub floor: u64,
    /// Each remote origin's applied mark.
    pub remote: std::collections::BTreeMap<String, Mark>,
    /// The DCs retired here, with when (wall-clock ms).
    pub retired: std::collections::BTreeMap<String, u64>,
}

/// What one durable write did, reported to `on_commit` in commit order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitNotice {
    /// The watch index persisted with this write: the log's index before it, plus one.
    pub index: u64,
    /// The own mark after this write.
    pub own_mark: Mark,
    pub committed: Committed,
}

/// The content of a durable write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Committed {
    /// A group of local appends: the events and their changes to state, in seq order.
    Local { events: Vec<ChangeEvent>, changes: Vec<StateChange> },
    /// A remote batch (the report's `changes` are the changes to state, in order).
    Remote { origin: String, report: ApplyReport },
    /// A remote snapshot.
    Snapshot { origin: String, report: ApplyReport },
    /// Own log entries and own tombstones at or below `floor` were purged.
    PurgedOwn { floor: u64, tombstones_removed: Vec<InstanceKey> },
    /// Tombstones of a remote origin were purged.
    PurgedRemoteTombstones { origin: String, tombstones_removed: Vec<InstanceKey> },
    /// A DC was retired: `changes` remove its live copies.
    Retired { origin: String, at_ms: u64, changes: Vec<StateChange> },
    /// A retirement was lifted.
    Unretired { origin: String },
    /// The whole state was replaced (a Raft snapshot installed on a member of a DC's
    /// group): `changes` turn the state before into the state after, and `marks` are what
    /// the state after holds besides its instances.
    Replaced { changes: Vec<StateChange>, marks: StateMarks },
    /// A peer's replication scope was recorded (on a member of a DC's group): `changes`
    /// remove its live copies outside the new scope.
    Rescoped { origin: String, changes: Vec<StateChange> },
}

impl CommitNotice {
    /// The changes to live state this write made, in order (empty for purges).
    pub fn changes(&self) -> &[StateChange] {
        match &self.committed {
            Committed::Local { changes, .. } => changes,
            Committed::Remote { report, .. } | Committed::Snapshot { report, .. } => &report.changes,
            Committed::Retired { changes, .. }
            | Committed::Replaced { changes, .. }
            | Committed::Rescoped { changes, .. } => changes,
            Committed::PurgedOwn { .. }
            | Committed::PurgedRemoteTombstones { .. }
            | Committed::Unretired { .. } => &[],
        }
    }
}

/// Running totals of the committer, for metrics and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Synced writes (fsyncs) made by the committer, of every kind.
    pub fsyncs: u64,
    /// Requests answered.
    pub requests: u64,
    /// Synced writes that carried a group of local appends.
    pub local_fsyncs: u64,
    /// Local appends made durable.
    pub local_requests: u64,
    /// Own events made durable by local appends: `local_events / local_fsyncs` is the
    /// number of events per group-commit fsync.
    pub local_events: u64,
    /// Histogram of local group sizes: bucket `i` counts groups of `2^i ..= 2^(i+1) - 1`
    /// requests; the last bucket holds every larger group.
    pub local_group_requests: [u64; GROUP_SIZE_BUCKETS],
    /// How long the committer's successful synced writes took, of every kind.
    pub sync_durations: Durations,
    /// The same synced writes split by where their time went, when the log times them.
    pub sync_parts: SyncBreakdown,
    /// Local appends written, by the time from their request to the start of their
    /// round's synced write: the channel, the round in progress, the linger, the staging
    /// of the requests before them in the round.
    pub local_queued: Durations,
    /// Local appends written, by the time from the end of their round's synced write to
    /// their answer: `on_commit` (the view's apply) and the answers before theirs.
    pub local_answered: Durations,
    /// Quiet spells that handed memtables to table files
    /// ([`CommitterHandle::flush_idle_memtables`]), and the bytes those memtables held.
    pub idle_flushes: u64,
    pub idle_flushed_bytes: u64,
}

/// Where a mutating call of the log began: its synced-write count, and when.
#[derive(Clone, Copy)]
struct WriteStart {
    syncs: u64,
    at: std::time::Instant,
}

/// The committer thread's state. Fields drop in order: the log closes before the channel.
pub struct Committer<L = RocksLog> {
    log: L,
    rx: mpsc::Receiver<Request<L>>,
    on_commit: OnCommit,
    own_seq: watch::Sender<u64>,
    stats: Arc<Mutex<CommitStats>>,
    limits: CommitterLimits,
    sync_writes_at_start: u64,
    /// Requests in the previous round, lingering included (see `linger`).
    last_round: usize,
    /// Shared with the handles: whether the log is writable, failures, recoveries.
    health: Arc<LogHealth>,
    /// Set while the log is not writable: the write whose outcome is unknown and the
    /// schedule of recovery attempts.
    recovery: Option<Recovery>,
    /// Inline mode: recovery is attempted at every round, without waiting.
    inline: bool,
}

/// Local appends taken so far in this round, not yet written.
#[derive(Default)]
struct Group {
    events: Vec<ChangeEvent>,
    owners: Vec<(u64, Arc<str>)>,
    members: Vec<(Range<usize>, LocalReply)>,
}

/// The answer of one local append: its reply channel and its settle hook.
struct LocalReply {
    reply: Reply<Vec<ChangeEvent>>,
    settle: Option<Settle>,
    ran: bool,
    queued: std::time::Instant,
}

impl LocalReply {
    /// Settles (always, caller or not), then answers.
    fn finish(self, result: Result<Vec<ChangeEvent>, CommitError>) {
        if let Some(settle) = self.settle {
            let settled = Settled { written: result.is_ok(), ran: self.ran };
            if catch_unwind(AssertUnwindSafe(|| settle(settled))).is_err() {
                tracing::error!("a local append's settle hook panicked");
            }
        }
        let _ = self.reply.send(result);
    }
}

impl<L: CommitLog + Send + 'static> Committer<L> {
    /// Starts the committer thread with default limits. It serves requests until
    /// [`CommitterHandle::shutdown`] or until every handle is dropped.
    pub fn spawn(log: L, on_commit: OnCommit) -> io::Result<CommitterHandle<L>> {
        Self::spawn_with_limits(log, on_commit, CommitterLimits::default())
    }

    /// Starts the committer thread with the given bounds.
    pub fn spawn_with_limits(
        log: L,
        on_commit: OnCommit,
        limits: CommitterLimits,
    ) -> io::Result<CommitterHandle<L>> {
        let (committer, handle) = Self::new(log, on_commit, limits);
        std::thread::Builder::new().name("tandem-committer".into()).spawn(move || committer.run())?;
        Ok(handle)
    }

    /// A committer that runs no thread: its rounds run when the owner of the returned
    /// [`InlineCommitter`] calls [`InlineCommitter::run_round`], on the owner's schedule
    /// (the node simulation). Same requests, same rounds, same group commit; no linger.
    pub fn inline(
        log: L,
        on_commit: OnCommit,
        limits: CommitterLimits,
    ) -> (InlineCommitter<L>, CommitterHandle<L>) {
        let limits = CommitterLimits { linger_max: std::time::Duration::ZERO, ..limits };
        let (mut committer, handle) = Self::new(log, on_commit, limits);
        committer.inline = true;
        (InlineCommitter { committer, stopped: false }, handle)
    }

    fn new(log: L, on_commit: OnCommit, limits: CommitterLimits) -> (Self, CommitterHandle<L>) {
        let (tx, rx) = mpsc::channel(limits.queue_requests_max.get());
        let (own_seq_tx, own_seq_rx) = watch::channel(log.own_mark().seq);
        let stats = Arc::new(Mutex::new(CommitStats::default()));
        let health = Arc::new(LogHealth::new());
        let committer = Committer {
            sync_writes_at_start: log.sync_writes(),
            last_round: 0,
            log,
            rx,
            on_commit,
            own_seq: own_seq_tx,
            stats: Arc::clone(&stats),
            limits,
            health: Arc::clone(&health),
            recovery: None,
            inline: false,
        };
        (committer, CommitterHandle { tx, own_seq: own_seq_rx, stats, health })
    }

    fn run(mut self) {
        let mut round: Vec<Request<L>> = Vec::with_capacity(self.limits.group_requests_max.get());
        let mut shutdown_replies = Vec::new();
        while shutdown_replies.is_empty() {
            let Some(first) = self.next_request() else {
                break;
            };
            round.push(first);
            self.take_waiting(&mut round);
            self.linger(&mut round);
            self.last_round = round.len();
            self.serve_round(&mut round, &mut shutdown_replies);
        }
        let Committer { log, mut rx, .. } = self;
        rx.close();
        // Requests behind a shutdown are dropped unanswered: their callers get `Stopped`.
        while rx.try_recv().is_ok() {}
        drop(log);
        for reply in shutdown_replies {
            let _ = reply.send(());
        }
    }

    /// Moves the requests already waiting into `round`, up to the round limit.
    fn take_waiting(&mut self, round: &mut Vec<Request<L>>) {
        while round.len() < self.limits.group_requests_max.get() {
            match self.rx.try_recv() {
                Ok(req) => round.push(req),
                Err(_) => break,
            }
        }
    }

    fn serve_round(&mut self, round: &mut Vec<Request<L>>, shutdown_replies: &mut Vec<oneshot::Sender<()>>) {
        let mut group = Group::default();
        for req in round.drain(..) {
            if !shutdown_replies.is_empty() {
                match req {
                    Request::Shutdown { reply } => shutdown_replies.push(reply),
                    // Dropped unanswered: the caller sees `Stopped`.
                    other => drop(other),
                }
                continue;
            }
            if !matches!(req, Request::LocalAppend { .. } | Request::ReadLog(_)) {
                // Keep commit order: the local appends taken before this request go first.
                self.flush_local(&mut group);
            }
            let Some(req) = self.refuse_if_unwritable(req) else {
                continue;
            };
            match req {
                Request::LocalAppend { build, settle, reply, queued } => {
                    self.stage_local(&mut group, build, LocalReply { reply, settle, ran: false, queued });
                    if group.events.len() >= self.limits.group_events_max.get() {
                        self.flush_local(&mut group);
                    }
                }
                Request::RemoteApply { channel_dc, reply, .. }
                    if self.log.retired().contains_key(&channel_dc) =>
                {
                    // A retired DC's frames change nothing; the refusal goes back to it.
                    let refusal = Some(Refusal::Retired { dc: channel_dc });
                    self.answer(reply, Ok(ApplyReport { refusal, ..Default::default() }));
                }
                Request::InstallSnapshot { channel_dc, reply, .. }
                    if self.log.retired().contains_key(&channel_dc) =>
                {
                    self.answer(reply, Err(LogError::Refused(Refusal::Retired { dc: channel_dc }).into()));
                }
                Request::StageChunk { channel_dc, reply, .. }
                    if self.log.retired().contains_key(&channel_dc) =>
                {
                    self.answer(reply, Err(LogError::Refused(Refusal::Retired { dc: channel_dc }).into()));
                }
                Request::PurgeRemoteTombstones { origin, reply, .. }
                    if self.log.retired().contains_key(&origin) =>
                {
                    self.answer(reply, Ok(()));
                }
                Request::PeerAck { peer, reply, .. } if self.log.retired().contains_key(&peer) => {
                    self.answer(reply, Ok(()));
                }
                Request::Retire { dc, at_ms, reply } => {
                    let before = self.begin_write();
                    let result = self.log.retire_origin(&dc, at_ms);
                    let result = self.check_failure(result, |_| InDoubt::Nothing);
                    if let Ok(r) = &result {
                        if r.newly {
                            self.after_write(before, || Committed::Retired {
                                origin: dc,
                                at_ms: r.at_ms,
                                changes: r.changes.clone(),
                            });
                        }
                    }
                    self.answer(reply, result);
                }
                Request::Unretire { dc, reply } => {
                    let before = self.begin_write();
                    let result = self.log.unretire_origin(&dc);
                    let result = self.check_failure(result, |_| InDoubt::Nothing);
                    if let Ok(true) = &result {
                        self.after_write(before, || Committed::Unretired { origin: dc });
                    }
                    self.answer(reply, result);
                }
                Request::RemoteApply { channel_dc, events, reply } => {
                    let before = self.begin_write();
                    let mark_before = self.log.mark_of(&channel_dc);
                    let result = self.log.apply_remote(&channel_dc, &events);
                    let result =
                        self.check_failure(result, |_| InDoubt::remote(&channel_dc, mark_before, &events));
                    if let Ok(report) = &result {
                        self.after_write(before, || Committed::Remote {
                            origin: channel_dc,
                            report: report.clone(),
                        });
                    }
                    self.answer(reply, result);
                }
                Request::InstallSnapshot { channel_dc, snapshot, reply } => {
                    let before = self.begin_write();
                    let mark_before = self.log.mark_of(&channel_dc);
                    let result = self.log.install_snapshot(&channel_dc, &snapshot);
                    let result = self.check_failure(result, |log| {
                        InDoubt::snapshot(log, &channel_dc, mark_before, &snapshot)
                    });
                    if let Ok(report) = &result {
                        self.after_write(before, || Committed::Snapshot {
                            origin: channel_dc,
                            report: report.clone(),
                        });
                    }
                    self.answer(reply, result);
                }
                Request::StageChunk { channel_dc, chunk, reply } => {
                    // Only the last chunk changes state (it installs the snapshot): only it
                    // takes a watch index and is reported.
                    let before = if chunk.last { self.begin_write() } else { self.write_start() };
                    let mark_before = self.log.mark_of(&channel_dc);
                    let result = self.log.stage_snapshot_chunk(&channel_dc, &chunk);
                    let result = self.check_failure(result, |log| {
                        if chunk.last {
                            InDoubt::install(log, &channel_dc, mark_before)
                        } else {
                            // Staging changes no state; the sender sends the chunk again.
                            InDoubt::Nothing
                        }
                    });
                    match &result {
                        Ok(ChunkOutcome::Installed(report)) => {
                            self.after_write(before, || Committed::Snapshot {
                                origin: channel_dc,
                                report: report.clone(),
                            });
                        }
                        Ok(ChunkOutcome::Staged(_)) => {
                            // Nothing to report, but its synced write is timed like any other.
                            self.publish_since(before);
                        }
                        Err(_) => self.publish(),
                    }
                    self.answer(reply, result);
                }
                Request::PurgeOwn { upto_seq, reply } => {
                    let before = self.begin_write();
                    let floor_before = self.log.purge_floor();
                    let result = self.log.purge_own_reporting(upto_seq);
                    let result = self.check_failure(result, |_| InDoubt::PurgeOwn { floor_before });
                    let result = result.map(|tombstones_removed| {
                        let floor = self.log.purge_floor();
                        self.after_write(before, || Committed::PurgedOwn { floor, tombstones_removed });
                        floor
                    });
                    self.answer(reply, result);
                }
                Request::PurgeRemoteTombstones { origin, upto_seq, reply } => {
                    let before = self.begin_write();
                    let result = self.log.purge_remote_tombstones_reporting(&origin, upto_seq);
                    let result = self.check_failure(result, |_| InDoubt::Nothing).map(|removed| {
                        self.after_write(before, || Committed::PurgedRemoteTombstones {
                            origin,
                            tombstones_removed: removed,
                        });
                    });
                    self.answer(reply, result);
                }
                Request::PeerAck { peer, mark, reply } => {
                    let start = self.write_start();
                    let result = self.log.record_peer_ack(&peer, mark);
                    let result = self.check_failure(result, |_| InDoubt::Nothing);
                    if result.is_ok() {
                        self.publish_since(start);
                    } else {
                        self.publish();
                    }
                    self.answer(reply, result);
                }
                Request::WithLog(f) => {
                    // A panicking function must not take the sequencer down; its caller
                    // sees its reply channel dropped.
                    let start = self.write_start();
                    if catch_unwind(AssertUnwindSafe(|| f(&mut self.log))).is_err() {
                        tracing::error!("a with_log function panicked on the committer thread");
                        self.publish();
                    } else {
                        self.publish_since(start);
                    }
                    self.stats.lock().requests += 1;
                }
                Request::ReadLog(f) => self.serve_read(f),
                Request::Shutdown { reply } => shutdown_replies.push(reply),
            }
        }
        self.flush_local(&mut group);
    }

    fn stage_local(&mut self, group: &mut Group, build: BuildEvents, mut reply: LocalReply) {
        let own = self.log.own_mark();
        let base = Mark { epoch: own.epoch, seq: own.seq + group.events.len() as u64 };
        reply.ran = true;
        let Built { events, owners } = match catch_unwind(AssertUnwindSafe(|| build(base))) {
            Ok(built) => built,
            Err(_) => {
                tracing::error!("a local append's event builder panicked; request refused");
                self.answer_local(reply, Err(CommitError::BuilderPanicked));
                return;
            }
        };
        // Checked per request (sequence, field limits, key ownership) so that one bad
        // builder fails only its own request.
        if let Err(e) = check_local_sequence(base, self.log.local_dc(), &events) {
            tracing::error!(error = %e, "a local append was refused");
            self.answer_local(reply, Err(e.into()));
            return;
        }
        if events.is_empty() {
            self.answer_local(reply, Ok(Vec::new()));
            return;
        }
        let start = group.events.len();
        group.events.extend(events);
        group.owners.extend(owners);
        group.members.push((start..group.events.len(), reply));
    }

    fn answer_local(&self, reply: LocalReply, result: Result<Vec<ChangeEvent>, CommitError>) {
        self.stats.lock().requests += 1;
        reply.finish(result);
    }

    /// Stages the next watch index for the coming write; returns the sync count before it,
    /// and when it began.
    fn begin_write(&mut self) -> WriteStart {
        self.log.set_next_index(self.log.index() + 1);
        self.write_start()
    }

    fn write_start(&self) -> WriteStart {
        WriteStart { syncs: self.log.sync_writes(), at: std::time::Instant::now() }
    }

    /// After a successful mutating call: publish the own seq and, if it wrote, count how
    /// long that took and tell `on_commit` what it did. Runs before the callers are
    /// answered.
    fn after_write(&mut self, start: WriteStart, what: impl FnOnce() -> Committed) {
        if !self.publish_since(start) {
            return;
        }
        let notice =
            CommitNotice { index: self.log.index(), own_mark: self.log.own_mark(), committed: what() };
        (self.on_commit)(&notice);
    }

    /// After a successful call of the log: [`publish`](Self::publish), with the synced
    /// write's duration (to the log's return) when the call made one; returns whether it did.
    fn publish_since(&self, start: WriteStart) -> bool {
        let took = start.at.elapsed();
        let wrote = self.log.sync_writes() != start.syncs;
        self.publish_timed(wrote.then_some(took));
        wrote
    }

    /// Publishes the own seq and the fsync count to the handles.
    fn publish(&self) {
        self.publish_timed(None);
    }

    /// [`publish`](Self::publish), and the synced write's duration in the same update of the
    /// stats (a reader never sees the fsync counted without its duration).
    fn publish_timed(&self, synced_write: Option<std::time::Duration>) {
        let seq = self.log.own_mark().seq;
        {
            let mut stats = self.stats.lock();
            stats.fsyncs = self.log.sync_writes() - self.sync_writes_at_start;
            if let Some(took) = synced_write {
                stats.sync_durations.record(took);
                if let Some(parts) = self.log.last_sync_parts() {
                    stats.sync_parts.record(took, parts);
                }
            }
        }
        self.own_seq.send_if_modified(|held| {
            let changed = *held != seq;
            *held = seq;
            changed
        });
    }

    fn answer<T>(&self, reply: Reply<T>, result: Result<T, CommitError>) {
        self.stats.lock().requests += 1;
        // The caller may have gone away; the write stands either way.
        let _ = reply.send(result);
    }
}

fn group_bucket(requests: usize) -> usize {
    let log2 = usize::BITS - 1 - requests.max(1).leading_zeros();
    (log2 as usize).min(GROUP_SIZE_BUCKETS - 1)
}

/// `LogError` is not `Clone`; one failed group write answers each of its callers.
pub(crate) fn clone_log_error(e: &LogError) -> LogError {
    match e {
        LogError::Refused(r) => LogError::Refused(r.clone()),
        LogError::Purged { floor } => LogError::Purged { floor: *floor },
        LogError::OutOfSequence { expected, got } => {
            LogError::OutOfSequence { expected: *expected, got: *got }
        }
        LogError::EpochNotAbove { current, requested } => {
            LogError::EpochNotAbove { current: *current, requested: *requested }
        }
        LogError::Storage(s) => LogError::Storage(s.clone()),
        LogError::Corrupt(s) => LogError::Corrupt(s.clone()),
        LogError::Invalid(s) => LogError::Invalid(s.clone()),
    }
}
