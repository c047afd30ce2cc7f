//! Sampled logging: [`LogSampler`] lets one log line through per period and counts the
//! ones held back, so a flood of refused peers or clients costs a line per period, not a
//! line each. Shared by the replication gateway and the node's HTTP side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lets one log line through per period and counts the ones held back, which the next
/// line reports.
#[derive(Debug, Default)]
pub struct LogSampler {
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl LogSampler {
    /// The period between two lines.
    pub const PERIOD: Duration = Duration::from_secs(10);

    /// `Some(lines held back since the last one)` when a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock();
        if last.is_some_and(|t| now.duration_since(t) < Self::PERIOD) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_lets_one_line_through_per_period() {
        let s = LogSampler::default();
        assert_eq!(s.admit(), Some(0));
        assert_eq!(s.admit(), None);
        assert_eq!(s.admit(), None);
        assert_eq!(s.held_back.load(Ordering::Relaxed), 2);
        // The next admitted line reports the two held back.
        *s.last.lock() = Some(Instant::now() - LogSampler::PERIOD);
        assert_eq!(s.admit(), Some(2));
    }
}
