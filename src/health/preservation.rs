//! [`SelfPreservation`]: renewal accounting that pauses expiry when renewals collapse.

use super::*;

/// Cluster-wide renewal accounting that decides whether expiry is paused. Fixed memory:
/// [`SELF_PRESERVATION_BUCKETS`] counters.
#[derive(Clone, Debug)]
pub struct SelfPreservation {
    started_ms: u64,
    window_ms: u64,
    bucket_ms: u64,
    /// `now_ms / bucket_ms` of the newest bucket.
    head_bucket: u64,
    renewals: [u64; SELF_PRESERVATION_BUCKETS],
    renewals_last_window: u64,
    expected_last_window: u64,
    paused: bool,
}

impl SelfPreservation {
    /// Starts the warm-up, with the window of `cfg`.
    pub fn new(now_ms: u64, cfg: &HealthConfig) -> SelfPreservation {
        let window_ms = cfg.self_preservation_window_ms.max(1);
        let bucket_ms = window_ms.div_ceil(SELF_PRESERVATION_BUCKETS as u64);
        SelfPreservation {
            started_ms: now_ms,
            window_ms,
            bucket_ms,
            head_bucket: now_ms / bucket_ms,
            renewals: [0; SELF_PRESERVATION_BUCKETS],
            renewals_last_window: 0,
            expected_last_window: 0,
            paused: false,
        }
    }

    /// Counts one heartbeat (or registration). Renewals older than the window are dropped.
    pub fn record_renewal(&mut self, now_ms: u64) {
        self.record_renewals(now_ms, 1);
    }

    /// Counts `count` heartbeats at once (a batch).
    pub fn record_renewals(&mut self, now_ms: u64, count: u64) {
        let bucket = now_ms / self.bucket_ms;
        self.advance(bucket);
        if self.head_bucket - bucket < SELF_PRESERVATION_BUCKETS as u64 {
            let slot = (bucket % SELF_PRESERVATION_BUCKETS as u64) as usize;
            self.renewals[slot] = self.renewals[slot].saturating_add(count);
        }
    }

    /// Whether expiry is paused at `now_ms` for `lease_count` leases; see the module docs
    /// for the rules. If `cfg` has a different window than this counter, the counter starts
    /// over with the new window, warm-up included (counts in buckets of another size cannot
    /// be carried over, and pausing while they are missing is the safe side).
    pub fn evaluate(&mut self, now_ms: u64, lease_count: usize, cfg: &HealthConfig) -> bool {
        if cfg.self_preservation_window_ms.max(1) != self.window_ms {
            *self = SelfPreservation::new(now_ms, cfg);
        }
        self.advance(now_ms / self.bucket_ms);
        let oldest_bucket = self.head_bucket.saturating_sub(SELF_PRESERVATION_BUCKETS as u64 - 1);
        let span_start_ms = (oldest_bucket * self.bucket_ms).max(self.started_ms);
        let span_ms = now_ms.saturating_sub(span_start_ms);
        let expected =
            lease_count as u128 * u128::from(span_ms) / u128::from(cfg.heartbeat_interval_ms.max(1));
        self.expected_last_window = u64::try_from(expected).unwrap_or(u64::MAX);
        self.renewals_last_window = self.renewals.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
        self.paused = if !cfg.self_preservation_enabled || lease_count < cfg.self_preservation_min_leases {
            false
        } else if now_ms.saturating_sub(self.started_ms) < self.window_ms {
            true
        } else {
            (self.renewals_last_window as f64)
                < cfg.self_preservation_threshold * self.expected_last_window as f64
        };
        self.paused
    }

    /// Renewals counted in the window, as of the last [`SelfPreservation::evaluate`].
    pub fn renewals_last_window(&self) -> u64 {
        self.renewals_last_window
    }

    /// Renewals expected in the window, as of the last [`SelfPreservation::evaluate`]. The
    /// window is measured from the start of its oldest bucket to `now_ms`, so it is between
    /// 59 and 60 buckets long.
    pub fn expected_last_window(&self) -> u64 {
        self.expected_last_window
    }

    /// The answer of the last [`SelfPreservation::evaluate`].
    pub fn paused(&self) -> bool {
        self.paused
    }

    fn advance(&mut self, bucket: u64) {
        if bucket <= self.head_bucket {
            return;
        }
        if bucket - self.head_bucket >= SELF_PRESERVATION_BUCKETS as u64 {
            self.renewals = [0; SELF_PRESERVATION_BUCKETS];
        } else {
            for b in self.head_bucket + 1..=bucket {
                self.renewals[(b % SELF_PRESERVATION_BUCKETS as u64) as usize] = 0;
            }
        }
        self.head_bucket = bucket;
    }
}
