//! The runtime's lateness: a task asks to wake every [`LATENESS_TICK`] and notes how late
//! it woke. A late wake is time in which no worker of the node's runtime could run it:
//! every worker busy (a handler or task that runs long without yielding), blocked (a
//! synchronous lock or system call on a worker), or waiting for a CPU that other threads
//! hold (the committer, RocksDB's background threads, another process). A request that
//! arrives then waits as long. In `/metrics` as `tandem_runtime_lateness_seconds`.
//!
//! The timer's own resolution is a millisecond: lateness under 1 ms is the timer rounding
//! its deadline up, not a stall. A stall longer than a tick always shows (as at least its
//! length less one tick); a shorter one shows when a wake falls due within it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::store::Durations;

/// How often the task asks to wake: a hundred small wake-ups a second.
pub const LATENESS_TICK: Duration = Duration::from_millis(10);

/// The lateness of the task's wakes, by duration, and the longest.
#[derive(Debug, Default)]
pub struct RuntimeLateness {
    inner: Mutex<LatenessStats>,
}

/// A copy of [`RuntimeLateness`]' figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatenessStats {
    /// Each wake by how late it came.
    pub wakes: Durations,
    /// The latest wake so far.
    pub max: Duration,
}

impl RuntimeLateness {
    pub fn stats(&self) -> LatenessStats {
        *self.inner.lock()
    }

    fn record(&self, late: Duration) {
        let mut s = self.inner.lock();
        s.wakes.record(late);
        s.max = s.max.max(late);
    }
}

/// Runs until `shut` changes: wakes every [`LATENESS_TICK`] and records how late.
pub(crate) async fn watch_lateness(lateness: Arc<RuntimeLateness>, mut shut: watch::Receiver<bool>) {
    loop {
        let due = Instant::now() + LATENESS_TICK;
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = shut.changed() => return,
        }
        lateness.record(Instant::now().saturating_duration_since(due));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker held for 60 ms shows as a wake at least 32 ms late (a tick is 10 ms), and
    /// the wakes before and after it as on time.
    #[test]
    fn a_blocked_worker_shows_as_a_late_wake() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let lateness = Arc::new(RuntimeLateness::default());
        let (shut_tx, shut) = watch::channel(false);
        rt.block_on(async {
            let task = tokio::spawn(watch_lateness(lateness.clone(), shut));
            tokio::time::sleep(Duration::from_millis(55)).await;
            // A synchronous wait on the runtime's only worker.
            std::thread::sleep(Duration::from_millis(60));
            tokio::time::sleep(Duration::from_millis(55)).await;
            shut_tx.send(true).unwrap();
            task.await.unwrap();
        });
        let s = lateness.stats();
        assert!(s.wakes.count() >= 5, "{s:?}");
        assert!(s.max >= Duration::from_millis(32), "held 60 ms, latest wake {:?}", s.max);
        let over_32ms: u64 = crate::store::DURATION_BUCKETS_US
            .iter()
            .zip(s.wakes.buckets)
            .filter(|(bound, _)| **bound > 32_768)
            .map(|(_, n)| n)
            .sum::<u64>()
            + s.wakes.buckets[crate::store::DURATION_BUCKETS_US.len()];
        assert!(over_32ms >= 1, "{s:?}");
    }
}
