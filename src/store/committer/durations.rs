//! Histograms of the committer's durations (see [`Durations`]): its synced writes, and
//! the two waits of a local append around its round's write.

/// Upper bounds of [`Durations`]' buckets, in microseconds: 64 us to about 1 s by
/// powers of two. A last bucket holds every longer write.
pub const DURATION_BUCKETS_US: [u64; 15] = {
    let mut b = [0u64; 15];
    let mut i = 0;
    while i < b.len() {
        b[i] = 64 << i;
        i += 1;
    }
    b
};

/// A histogram of durations, kept by the committer for three things ([`CommitStats`]):
/// its successful synced writes, from its call into the log to its return (encoding,
/// memtable, WAL write and its fsync: the disk's own latency as the writers meet it, which
/// an isolated probe of the disk may not show; `/metrics`:
/// `tandem_disk_sync_duration_seconds`), and for each local append the wait before its
/// round's write and the wait after it until its answer.
///
/// [`CommitStats`]: super::CommitStats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations {
    /// Bucket `i` counts writes of at most [`DURATION_BUCKETS_US`]`[i]` (and more than the bound
    /// before it); the last counts the longer ones.
    pub buckets: [u64; DURATION_BUCKETS_US.len() + 1],
    pub sum_us: u64,
}

impl Durations {
    pub(crate) fn record(&mut self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = DURATION_BUCKETS_US.partition_point(|b| *b < us);
        self.buckets[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Adds what `other` recorded to this histogram.
    pub(super) fn add(&mut self, other: &Durations) {
        for (b, o) in self.buckets.iter_mut().zip(other.buckets) {
            *b += o;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The writes recorded since `before` (a copy taken earlier).
    pub fn since(&self, before: &Durations) -> Durations {
        let mut d = *self;
        for (b, a) in d.buckets.iter_mut().zip(before.buckets) {
            *b = b.saturating_sub(a);
        }
        d.sum_us = d.sum_us.saturating_sub(before.sum_us);
        d
    }

    /// The `q` quantile in microseconds, interpolated within its bucket (the last bucket
    /// reads as its lower bound); `None` without writes.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * n as f64).max(1.0);
        let mut seen = 0.0;
        for (i, c) in self.buckets.iter().enumerate() {
            let c = *c as f64;
            if c > 0.0 && seen + c >= rank {
                let lo = if i == 0 { 0.0 } else { DURATION_BUCKETS_US[i - 1] as f64 };
                let Some(hi) = DURATION_BUCKETS_US.get(i) else { return Some(lo) };
                return Some(lo + (*hi as f64 - lo) * (rank - seen) / c);
            }
            seen += c;
        }
        None
    }
}

/// The committer's synced writes split by where their time went ([`CommitStats`]): the
/// staging in the log before and around RocksDB's write call (encoding the events and the
/// state's records), the WAL append with its fsync, and the memtable inserts. The three
/// count the same writes as `sync_durations`, when the log times its writes (RocksDB's perf
/// context; `/metrics`: `tandem_disk_sync_part_duration_seconds`).
///
/// [`CommitStats`]: super::CommitStats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncBreakdown {
    pub staged: Durations,
    pub wal: Durations,
    pub memtable: Durations,
}

impl SyncBreakdown {
    /// One synced write of `took` in all, `parts` of it inside RocksDB's write call.
    pub(super) fn record(&mut self, took: std::time::Duration, parts: crate::store::SyncParts) {
        self.staged.record(took.saturating_sub(parts.call));
        self.wal.record(parts.wal);
        self.memtable.record(parts.memtable);
    }

    /// The writes recorded since `before` (a copy taken earlier).
    pub fn since(&self, before: &SyncBreakdown) -> SyncBreakdown {
        SyncBreakdown {
            staged: self.staged.since(&before.staged),
            wal: self.wal.since(&before.wal),
            memtable: self.memtable.since(&before.memtable),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_write_lands_in_the_first_bucket_whose_bound_holds_it() {
        let mut d = Durations::default();
        d.record(Duration::from_micros(64));
        d.record(Duration::from_micros(65));
        d.record(Duration::from_secs(5));
        assert_eq!(d.buckets[0], 1);
        assert_eq!(d.buckets[1], 1);
        assert_eq!(d.buckets[DURATION_BUCKETS_US.len()], 1, "longer than every bound: the last bucket");
        assert_eq!(d.count(), 3);
        assert_eq!(d.sum_us, 64 + 65 + 5_000_000);
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket_and_count_only_what_came_since() {
        let mut d = Durations::default();
        assert_eq!(d.quantile_us(0.99), None);
        // 100 writes in (128, 256] us: the median half way through that bucket.
        for _ in 0..100 {
            d.record(Duration::from_micros(200));
        }
        assert_eq!(d.quantile_us(0.5), Some(192.0));
        assert_eq!(d.quantile_us(1.0), Some(256.0));
        let before = d;
        for _ in 0..10 {
            d.record(Duration::from_millis(3));
        }
        let since = d.since(&before);
        assert_eq!(since.count(), 10);
        // (2048, 4096] us.
        assert!(since.quantile_us(0.99).is_some_and(|q| q > 2048.0 && q <= 4096.0));
        assert_eq!(since.sum_us, 30_000);
    }
}
