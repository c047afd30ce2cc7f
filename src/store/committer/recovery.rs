//! The committer after a failed write. The log is then not writable and the outcome of
//! the failed write on disk is unknown. Every write is refused at once with
//! [`CommitError::Unwritable`] (nothing of it is written) while the committer retries
//! [`CommitLog::recover`] with backoff. Once a recovery succeeds, the failed write is
//! settled against what the recovered log holds: if it landed, `on_commit` sees it (and a
//! local append's callers get their acknowledgement: it is durable); if not, its callers
//! get `Unwritable` and nothing of it stands. Only one write can be in doubt: every later
//! one is refused before it is tried.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tandem_replicator::log::{ApplyReport, LogError, StateChange};
use tandem_schemas::{ChangeEvent, InstanceKey, Mark, Snapshot};

use super::{CommitError, CommitLog, CommitNotice, Committed, Committer, LocalReply, Request};
use crate::store::commit_log::local_changes;

/// How often the committer thread looks for requests while it waits for the next recovery
/// attempt (it cannot block on the channel then).
const RECOVERY_POLL: Duration = Duration::from_millis(10);

/// Whether the committer's log can be written, shared with the handles (status, metrics,
/// readiness).
#[derive(Debug)]
pub struct LogHealth {
    writable: AtomicBool,
    write_failures: AtomicU64,
    recoveries: AtomicU64,
    attempts_failed: AtomicU64,
    /// The error that made the log unwritable (or the last failed recovery's), and since when.
    problem: Mutex<Option<(String, Instant)>>,
}

/// A copy of [`LogHealth`] at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogHealthReport {
    pub writable: bool,
    /// Writes that failed and made the log unwritable, since the start.
    pub write_failures: u64,
    /// Recoveries that made it writable again.
    pub recoveries: u64,
    /// Recovery attempts that failed (each waits longer, up to the backoff's cap).
    pub recovery_attempts_failed: u64,
    /// While not writable: why (the latest error).
    pub reason: Option<String>,
    /// While not writable: for how long.
    pub unwritable_for_ms: Option<u64>,
}

impl LogHealth {
    pub(super) fn new() -> Self {
        LogHealth {
            writable: AtomicBool::new(true),
            write_failures: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            attempts_failed: AtomicU64::new(0),
            problem: Mutex::new(None),
        }
    }

    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    pub fn report(&self) -> LogHealthReport {
        let problem = self.problem.lock().clone();
        LogHealthReport {
            writable: self.writable(),
            write_failures: self.write_failures.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            recovery_attempts_failed: self.attempts_failed.load(Ordering::Relaxed),
            unwritable_for_ms: problem.as_ref().map(|(_, t)| t.elapsed().as_millis() as u64),
            reason: problem.map(|(r, _)| r),
        }
    }

    fn failed(&self, reason: &str) {
        self.write_failures.fetch_add(1, Ordering::Relaxed);
        *self.problem.lock() = Some((reason.to_owned(), Instant::now()));
        self.writable.store(false, Ordering::Release);
    }

    fn attempt_failed(&self, reason: &str) {
        self.attempts_failed.fetch_add(1, Ordering::Relaxed);
        if let Some((r, _)) = self.problem.lock().as_mut() {
            *r = reason.to_owned();
        }
    }

    fn recovered(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        *self.problem.lock() = None;
        self.writable.store(true, Ordering::Release);
    }
}

/// The write whose outcome is unknown, with what settling it needs.
pub(super) enum InDoubt {
    /// Nothing to settle (a tombstone purge or a peer ack: no view change, no caller waits).
    Nothing,
    /// A group of local appends; its callers wait for the outcome.
    Local {
        events: Vec<ChangeEvent>,
        members: Vec<(Range<usize>, LocalReply)>,
    },
    /// A remote batch or snapshot (its caller was answered with the failure; the sender
    /// sends it again). `keys`: every key it may have changed.
    Apply {
        origin: String,
        mark_before: Option<Mark>,
        keys: BTreeSet<InstanceKey>,
        snapshot: bool,
    },
    PurgeOwn {
        floor_before: u64,
    },
}

impl InDoubt {
    /// A remote batch: the keys of its events.
    pub(super) fn remote(origin: &str, mark_before: Option<Mark>, events: &[ChangeEvent]) -> InDoubt {
        let keys = events.iter().map(|e| e.op.key().clone()).collect();
        InDoubt::Apply { origin: origin.to_owned(), mark_before, keys, snapshot: false }
    }

    /// A snapshot: its keys and the origin's keys the log holds. Called after the failed
    /// write, while the log still reads the state from before it.
    pub(super) fn snapshot<L: CommitLog>(
        log: &L,
        origin: &str,
        mark_before: Option<Mark>,
        snap: &Snapshot,
    ) -> InDoubt {
        let mut keys: BTreeSet<InstanceKey> = snap.instances.iter().map(|i| i.record.key.clone()).collect();
        keys.extend(snap.tombstones.iter().map(|t| t.key.clone()));
        match log.instances() {
            Ok(held) => keys.extend(held.into_iter().map(|(_, r)| r.key).filter(|k| *k.owner_dc == *origin)),
            Err(e) => {
                tracing::error!(%origin, error = %e, "cannot list the origin's instances of a snapshot in doubt")
            }
        }
        InDoubt::Apply { origin: origin.to_owned(), mark_before, keys, snapshot: true }
    }

    /// The install of a staged snapshot (its last chunk): the origin's keys the log holds
    /// now; the keys it installed are added when it is settled.
    pub(super) fn install<L: CommitLog>(log: &L, origin: &str, mark_before: Option<Mark>) -> InDoubt {
        let empty = Snapshot {
            origin_dc: origin.to_owned(),
            mark: Mark { epoch: 0, seq: 0 },
            instances: vec![],
            tombstones: vec![],
        };
        InDoubt::snapshot(log, origin, mark_before, &empty)
    }
}

/// The log is not writable: the write in doubt and the schedule of recovery attempts.
pub(super) struct Recovery {
    doubt: InDoubt,
    reason: String,
    attempts: u32,
    next_at: Instant,
}

impl<L: CommitLog + Send + 'static> Committer<L> {
    /// After a mutating call: a failure that left the log unwritable starts the recovery;
    /// `doubt` says what the failed write may have changed (it reads the log as it was).
    pub(super) fn check_failure<T>(
        &mut self,
        result: Result<T, LogError>,
        doubt: impl FnOnce(&L) -> InDoubt,
    ) -> Result<T, CommitError> {
        match result {
            Ok(v) => Ok(v),
            Err(e) if !self.log.writable() => {
                let doubt = doubt(&self.log);
                self.enter_unwritable(&e, doubt);
                Err(CommitError::Unwritable { reason: e.to_string() })
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn enter_unwritable(&mut self, e: &LogError, doubt: InDoubt) {
        let reason = e.to_string();
        tracing::error!(error = %reason, "event log write failed; refusing writes until a recovery succeeds");
        self.health.failed(&reason);
        if self.recovery.is_some() {
            // Cannot happen (writes are refused before they are tried); keep the first.
            tracing::error!("a second write failed while one was in doubt");
            return;
        }
        let next_at = Instant::now() + self.limits.recovery_backoff_initial;
        self.recovery = Some(Recovery { doubt, reason, attempts: 0, next_at });
    }

    fn unwritable(&self) -> CommitError {
        let reason = self.recovery.as_ref().map_or_else(String::new, |r| r.reason.clone());
        CommitError::Unwritable { reason }
    }

    /// While the log is not writable, answers a write at once (nothing of it is written);
    /// reads and shutdown go through.
    pub(super) fn refuse_if_unwritable(&mut self, req: Request<L>) -> Option<Request<L>> {
        if self.recovery.is_none() {
            return Some(req);
        }
        let e = self.unwritable();
        match req {
            Request::LocalAppend { settle, reply, queued, .. } => {
                self.answer_local(LocalReply { reply, settle, ran: false, queued }, Err(e));
            }
            Request::RemoteApply { reply, .. } | Request::InstallSnapshot { reply, .. } => {
                self.answer(reply, Err(e))
            }
            Request::StageChunk { reply, .. } => self.answer(reply, Err(e)),
            Request::PurgeOwn { reply, .. } => self.answer(reply, Err(e)),
            Request::Retire { reply, .. } => self.answer(reply, Err(e)),
            Request::Unretire { reply, .. } => self.answer(reply, Err(e)),
            Request::PurgeRemoteTombstones { reply, .. } | Request::PeerAck { reply, .. } => {
                self.answer(reply, Err(e));
            }
            other @ (Request::WithLog(_) | Request::ReadLog(_) | Request::Shutdown { .. }) => {
                return Some(other)
            }
        }
        None
    }

    /// Thread mode: the next request; while the log is not writable, recovery attempts
    /// run when due between looks at the channel.
    pub(super) fn next_request(&mut self) -> Option<Request<L>> {
        loop {
            let Some(due) = self.recovery.as_ref().map(|r| r.next_at) else {
                return self.rx.blocking_recv();
            };
            if Instant::now() >= due {
                self.attempt_recovery();
                continue;
            }
            match self.rx.try_recv() {
                Ok(req) => return Some(req),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return None,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => std::thread::sleep(RECOVERY_POLL),
            }
        }
    }

    /// One recovery attempt, if the log is not writable. On success the write in doubt is
    /// settled; on failure the next attempt waits twice as long (up to the cap).
    pub(super) fn attempt_recovery(&mut self) {
        let Some(mut rec) = self.recovery.take() else {
            return;
        };
        match self.log.recover() {
            Ok(()) => {
                tracing::warn!(after_attempts = rec.attempts + 1, "event log writable again");
                self.health.recovered();
                self.publish();
                self.settle_doubt(rec.doubt, &rec.reason);
            }
            Err(e) => {
                rec.attempts = rec.attempts.saturating_add(1);
                let l = &self.limits;
                let wait = l
                    .recovery_backoff_initial
                    .saturating_mul(1u32 << rec.attempts.min(16))
                    .min(l.recovery_backoff_max.max(l.recovery_backoff_initial));
                rec.next_at = Instant::now() + wait;
                tracing::warn!(error = %e, attempts = rec.attempts, next_in_ms = wait.as_millis() as u64,
                    "event log still not writable");
                self.health.attempt_failed(&e.to_string());
                self.recovery = Some(rec);
            }
        }
    }

    /// Tells `on_commit` and the callers what the write in doubt did, as the recovered log
    /// says.
    fn settle_doubt(&mut self, doubt: InDoubt, reason: &str) {
        let committed = match doubt {
            InDoubt::Nothing => None,
            InDoubt::Local { events, members } => {
                let own = self.log.own_mark();
                // Landed: its last event is the log's at its seq. By event id, not by seq
                // alone: on a DC's group another leader's entries may have taken the seqs
                // of an entry that was never committed. (Purged since: the seq says it.)
                let landed = events.last().is_some_and(|last| {
                    own.epoch == last.origin_epoch
                        && own.seq >= last.seq
                        && match self.log.own_event_id(last.seq) {
                            Ok(Some(id)) => id == last.event_id,
                            Ok(None) | Err(_) => last.seq <= self.log.purge_floor(),
                        }
                });
                tracing::warn!(events = events.len(), landed, "settled the local write that failed");
                if !landed {
                    for (_, reply) in members {
                        let e = CommitError::Unwritable { reason: reason.to_owned() };
                        self.answer_local(reply, Err(e));
                    }
                    return;
                }
                let changes = local_changes(&events);
                self.notify(Committed::Local { events: events.clone(), changes });
                for (range, reply) in members {
                    let mine = events.get(range).map(<[ChangeEvent]>::to_vec).unwrap_or_default();
                    self.answer_local(reply, Ok(mine));
                }
                return;
            }
            InDoubt::Apply { origin, mark_before, mut keys, snapshot } => {
                let mark = self.log.mark_of(&origin);
                if snapshot && mark != mark_before {
                    // What the snapshot installed: the origin's keys held now.
                    match self.log.instances() {
                        Ok(held) => keys
                            .extend(held.into_iter().map(|(_, r)| r.key).filter(|k| *k.owner_dc == *origin)),
                        Err(e) => {
                            tracing::error!(%origin, error = %e, "cannot list the origin's instances after a recovery")
                        }
                    }
                }
                (mark != mark_before).then(|| {
                    let changes = self.state_of(&keys);
                    let report = ApplyReport { applied: changes.len(), mark, changes, ..Default::default() };
                    if snapshot {
                        Committed::Snapshot { origin, report }
                    } else {
                        Committed::Remote { origin, report }
                    }
                })
            }
            InDoubt::PurgeOwn { floor_before } => {
                let floor = self.log.purge_floor();
                (floor != floor_before)
                    .then_some(Committed::PurgedOwn { floor, tombstones_removed: Vec::new() })
            }
        };
        if let Some(committed) = committed {
            tracing::warn!("the write that failed had landed; the view follows it");
            self.notify(committed);
        }
    }

    /// The log's state of `keys`, as changes that bring a view to it.
    fn state_of(&self, keys: &BTreeSet<InstanceKey>) -> Vec<StateChange> {
        let held: HashMap<InstanceKey, (u64, tandem_schemas::InstanceRecord)> = match self.log.instances() {
            Ok(all) => all
                .into_iter()
                .filter(|(_, r)| keys.contains(&r.key))
                .map(|(s, r)| (r.key.clone(), (s, r)))
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the state after a recovery");
                HashMap::new()
            }
        };
        keys.iter()
            .map(|k| match held.get(k) {
                Some((seq, record)) => StateChange::Put { seq: *seq, record: record.clone() },
                None => StateChange::Remove { key: k.clone() },
            })
            .collect()
    }

    fn notify(&mut self, committed: Committed) {
        let notice = CommitNotice { index: self.log.index(), own_mark: self.log.own_mark(), committed };
        (self.on_commit)(&notice);
    }
}
