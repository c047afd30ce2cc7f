//! The node's quiet-spell task: once the event log has made no durable write for
//! [`IDLE_FLUSH_AFTER`] after making one, its memtables are handed to table files
//! (`store/rocks/idle_flush.rs`) and, when that flushed something, the freed heap is given
//! back to the OS a tick later ([`crate::heap::Reason::Memtables`]). Counted in `/metrics`
//! (`tandem_store_idle_flushes_total`, `tandem_store_idle_flushed_bytes_total`).
//!
//! What counts as a write: a single node's committer fsyncs; a group's member, the entries
//! its state machine applied (a follower's committer writes nothing, and every member holds
//! the state in its memtables). A member flushes its Raft log's memtables too
//! (`GroupLog`'s [`CommitLog::flush_idle_memtables`]).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::store::{CommitLog, CommitterHandle, IDLE_FLUSH_AFTER};

/// How often the task looks at the log's durable-write count.
const TICK: Duration = Duration::from_millis(250);

/// Tracks the durable-write count for quiet spells.
#[derive(Debug)]
struct Quiet {
    /// The count last seen, and when it was first seen.
    seen: u64,
    since: Instant,
    /// The count at the last flush: a spell without a write since then needs none.
    flushed: u64,
}

impl Quiet {
    fn new(writes: u64, now: Instant) -> Self {
        Quiet { seen: writes, since: now, flushed: writes }
    }

    /// Whether a flush is due with `writes` durable writes so far at `now`: the count moved
    /// since the last flush and has not moved for [`IDLE_FLUSH_AFTER`]. Once per spell.
    fn due(&mut self, writes: u64, now: Instant) -> bool {
        if writes != self.seen {
            (self.seen, self.since) = (writes, now);
            return false;
        }
        if writes == self.flushed || now.duration_since(self.since) < IDLE_FLUSH_AFTER {
            return false;
        }
        self.flushed = writes;
        true
    }
}

/// Runs until `shut` changes: flushes the memtables of a quiet log, then trims the heap.
/// `writes` counts the log's durable writes so far.
pub(crate) async fn flush_when_quiet<L: CommitLog + Send + 'static>(
    committer: CommitterHandle<L>,
    writes: impl Fn() -> u64 + Send + 'static,
    mut shut: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = Quiet::new(writes(), Instant::now());
    let mut trim_next_tick = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if std::mem::take(&mut trim_next_tick) {
                    // The flush ran in RocksDB's background; its memtables are freed by now
                    // (a slower one is left to the heap's periodic trim).
                    let _ = tokio::task::spawn_blocking(|| crate::heap::trim(crate::heap::Reason::Memtables)).await;
                }
                if !quiet.due(writes(), Instant::now()) {
                    continue;
                }
                match committer.flush_idle_memtables().await {
                    Ok(bytes) => trim_next_tick = bytes > 0 && crate::heap::TRIMS_HEAP,
                    Err(e) => tracing::warn!(error = %e, "flushing the memtables of a quiet log failed"),
                }
            }
            _ = shut.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_is_due_once_per_quiet_spell_after_a_write() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let after = IDLE_FLUSH_AFTER.as_millis() as u64;
        let mut q = Quiet::new(5, t0);
        assert!(!q.due(5, at(10 * after)), "no write since the start: nothing to flush");
        assert!(!q.due(6, at(10 * after)), "a write just now");
        assert!(!q.due(6, at(11 * after - 1)), "not quiet long enough");
        assert!(q.due(6, at(11 * after)));
        assert!(!q.due(6, at(20 * after)), "once per spell");
        assert!(!q.due(7, at(21 * after)));
        assert!(!q.due(8, at(22 * after - 1)), "writes keep coming");
        assert!(q.due(8, at(23 * after - 1)));
    }
}
