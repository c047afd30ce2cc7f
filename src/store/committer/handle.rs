//! [`CommitterHandle`], the cloneable way to the committer (one method per request);
//! [`InlineCommitter`], a committer run on its owner's schedule; and [`AppendLocal`], the
//! one request the registry makes.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tandem_replicator::log::{ApplyReport, ChunkOutcome};
use tandem_schemas::{ChangeEvent, Mark, Snapshot, SnapshotChunk};
use tokio::sync::{mpsc, oneshot, watch};

use super::{
    BuildEvents, Built, CommitError, CommitLog, CommitStats, Committer, LogHealth, LogHealthReport,
    ReadLogFn, Reply, Request, Settle, WithLogFn,
};
use crate::store::RocksLog;

/// A cloneable handle to the committer. When every handle is dropped the thread stops.
pub struct CommitterHandle<L = RocksLog> {
    pub(super) tx: mpsc::Sender<Request<L>>,
    pub(super) own_seq: watch::Receiver<u64>,
    pub(super) stats: Arc<Mutex<CommitStats>>,
    pub(super) health: Arc<LogHealth>,
}

impl<L> Clone for CommitterHandle<L> {
    fn clone(&self) -> Self {
        CommitterHandle {
            tx: self.tx.clone(),
            own_seq: self.own_seq.clone(),
            stats: self.stats.clone(),
            health: self.health.clone(),
        }
    }
}

impl<L: CommitLog + Send + 'static> CommitterHandle<L> {
    /// Appends own events built on the committer thread (see [`BuildEvents`]); returns them
    /// once durable and reported to `on_commit`.
    pub async fn append_local<F>(&self, build: F) -> Result<Vec<ChangeEvent>, CommitError>
    where
        F: FnOnce(Mark) -> Vec<ChangeEvent> + Send + 'static,
    {
        let build: BuildEvents = Box::new(move |mark| Built { events: build(mark), owners: Vec::new() });
        self.call(|reply| Request::local_append(build, None, reply)).await
    }

    /// Applies a remote batch received over the channel authenticated as `channel_dc`.
    pub async fn apply_remote(
        &self,
        channel_dc: String,
        events: Vec<ChangeEvent>,
    ) -> Result<ApplyReport, CommitError> {
        self.call(|reply| Request::RemoteApply { channel_dc, events, reply }).await
    }

    /// Installs a remote origin's snapshot received over `channel_dc`.
    pub async fn install_snapshot(
        &self,
        channel_dc: String,
        snapshot: Snapshot,
    ) -> Result<ApplyReport, CommitError> {
        self.call(|reply| Request::InstallSnapshot { channel_dc, snapshot, reply }).await
    }

    /// Stages a chunk of a remote origin's snapshot received over `channel_dc` (the last
    /// chunk installs the snapshot).
    pub async fn stage_snapshot_chunk(
        &self,
        channel_dc: String,
        chunk: SnapshotChunk,
    ) -> Result<ChunkOutcome, CommitError> {
        self.call(|reply| Request::StageChunk { channel_dc, chunk, reply }).await
    }

    /// Purges own log entries and own tombstones at or below `upto_seq`; returns the floor.
    pub async fn purge_own(&self, upto_seq: u64) -> Result<u64, CommitError> {
        self.call(|reply| Request::PurgeOwn { upto_seq, reply }).await
    }

    /// Drops a remote origin's tombstones at or below `upto_seq`.
    pub async fn purge_remote_tombstones(&self, origin: String, upto_seq: u64) -> Result<(), CommitError> {
        self.call(|reply| Request::PurgeRemoteTombstones { origin, upto_seq, reply }).await
    }

    /// Retires a DC (see [`CommitLog::retire_origin`](crate::store::CommitLog::retire_origin)).
    pub async fn retire(&self, dc: String, at_ms: u64) -> Result<crate::store::Retirement, CommitError> {
        self.call(|reply| Request::Retire { dc, at_ms, reply }).await
    }

    /// Lifts a DC's retirement (see [`CommitLog::unretire_origin`](crate::store::CommitLog::unretire_origin)).
    pub async fn unretire(&self, dc: String) -> Result<bool, CommitError> {
        self.call(|reply| Request::Unretire { dc, reply }).await
    }

    /// Records a peer's ack of the own origin.
    pub async fn record_peer_ack(&self, peer: String, mark: Mark) -> Result<(), CommitError> {
        self.call(|reply| Request::PeerAck { peer, mark, reply }).await
    }

    /// Runs `f` with the log on the committer thread, between two writes (see
    /// [`WithLogFn`]).
    pub async fn with_log<R, F>(&self, f: F) -> Result<R, CommitError>
    where
        R: Send + 'static,
        F: FnOnce(&mut L) -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let run: WithLogFn<L> = Box::new(move |log| {
            let _ = tx.send(f(log));
        });
        self.send(Request::WithLog(run)).await?;
        rx.await.map_err(|_| CommitError::Stopped)
    }

    /// Runs `f` with the log, read only, on the committer thread (see [`ReadLogFn`]): it
    /// does not split a group of local appends, nor end a linger.
    pub async fn read_log<R, F>(&self, f: F) -> Result<R, CommitError>
    where
        R: Send + 'static,
        F: FnOnce(&L) -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let run: ReadLogFn<L> = Box::new(move |log| {
            let _ = tx.send(f(log));
        });
        self.send(Request::ReadLog(run)).await?;
        rx.await.map_err(|_| CommitError::Stopped)
    }

    /// [`CommitLog::flush_idle_memtables`] on the committer thread, counted in
    /// [`CommitStats`] when it flushed something.
    pub async fn flush_idle_memtables(&self) -> Result<u64, CommitError>
    where
        L: CommitLog + Send + 'static,
    {
        let bytes = self.with_log(|log: &mut L| log.flush_idle_memtables()).await??;
        if bytes > 0 {
            let mut st = self.stats.lock();
            st.idle_flushes += 1;
            st.idle_flushed_bytes += bytes;
        }
        Ok(bytes)
    }

    /// Queues a raw request (waits while the queue is full).
    pub async fn send(&self, req: Request<L>) -> Result<(), CommitError> {
        self.tx.send(req).await.map_err(|_| CommitError::Stopped)
    }

    /// Serves every request queued before this one, closes the log and stops the thread.
    /// Returns once the log is closed (at once if the committer had already stopped).
    pub async fn shutdown(&self) {
        let (reply, done) = oneshot::channel();
        if self.tx.send(Request::Shutdown { reply }).await.is_ok() {
            let _ = done.await;
        }
    }

    /// The own origin's last durable seq; changes after every durable local write.
    pub fn own_seq(&self) -> watch::Receiver<u64> {
        self.own_seq.clone()
    }

    /// The committer's running totals.
    pub fn stats(&self) -> CommitStats {
        self.stats.lock().clone()
    }

    /// Whether the log can be written now, and its failures and recoveries so far.
    pub fn log_health(&self) -> LogHealthReport {
        self.health.report()
    }

    /// Whether the log can be written now (false from a failed write until a recovery).
    pub fn log_writable(&self) -> bool {
        self.health.writable()
    }

    /// Requests waiting in the channel (a gauge for metrics).
    pub fn queued_requests(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub(super) async fn call<R>(&self, make: impl FnOnce(Reply<R>) -> Request<L>) -> Result<R, CommitError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx)).await?;
        rx.await.map_err(|_| CommitError::Stopped)?
    }
}

/// A committer run on its owner's schedule (see [`Committer::inline`]): no thread; each
/// [`run_round`](Self::run_round) serves the requests waiting at that moment as one round,
/// exactly as the thread would (without lingering). Deterministic: what a round contains
/// depends only on what was queued before it.
pub struct InlineCommitter<L> {
    pub(super) committer: Committer<L>,
    pub(super) stopped: bool,
}

impl<L: CommitLog + Send + 'static> InlineCommitter<L> {
    /// Serves the requests waiting now (up to the round limit) as one round; returns how
    /// many it took. While the log is not writable, each round first attempts a recovery
    /// (no backoff: the owner's schedule is the backoff).
    pub fn run_round(&mut self) -> usize {
        if self.stopped {
            return 0;
        }
        self.committer.attempt_recovery();
        let mut round = Vec::new();
        self.committer.take_waiting(&mut round);
        let taken = round.len();
        let mut shutdown_replies = Vec::new();
        self.committer.serve_round(&mut round, &mut shutdown_replies);
        if !shutdown_replies.is_empty() {
            self.stopped = true;
            self.committer.rx.close();
            while self.committer.rx.try_recv().is_ok() {}
            for reply in shutdown_replies {
                let _ = reply.send(());
            }
        }
        taken
    }

    /// Runs rounds until no request waits; returns how many requests were served.
    pub fn run_until_idle(&mut self) -> usize {
        let mut served = 0;
        loop {
            let n = self.run_round();
            if n == 0 {
                return served;
            }
            served += n;
        }
    }

    /// The committer's stats, as [`CommitterHandle::stats`] reads them.
    pub fn stats(&self) -> CommitStats {
        self.committer.stats.lock().clone()
    }

    /// The log, between two rounds.
    pub fn log(&self) -> &L {
        &self.committer.log
    }

    /// The log, between two rounds, to change it (inject a fault, a test's corruption).
    pub fn log_mut(&mut self) -> &mut L {
        &mut self.committer.log
    }

    /// Stops as a crash would: requests still waiting are dropped unanswered (their
    /// callers get [`CommitError::Stopped`]); returns the log, which holds exactly what
    /// was made durable.
    pub fn into_log(self) -> L {
        let Committer { log, mut rx, .. } = self.committer;
        rx.close();
        while rx.try_recv().is_ok() {}
        log
    }
}

/// The one committer request the registry makes, whatever log stands behind the
/// committer (the registry is not generic over it).
pub trait AppendLocal: Send + Sync {
    /// [`CommitterHandle::append_local`], with a hook that runs on the committer once the
    /// outcome is known, whether or not the caller still waits (see [`Settle`]).
    fn append_local_boxed(
        &self,
        build: BuildEvents,
        settle: Settle,
    ) -> BoxFuture<'static, Result<Vec<ChangeEvent>, CommitError>>;
}

impl<L: CommitLog + Send + 'static> AppendLocal for CommitterHandle<L> {
    fn append_local_boxed(
        &self,
        build: BuildEvents,
        settle: Settle,
    ) -> BoxFuture<'static, Result<Vec<ChangeEvent>, CommitError>> {
        let handle = self.clone();
        Box::pin(async move { handle.call(|reply| Request::local_append(build, Some(settle), reply)).await })
    }
}
