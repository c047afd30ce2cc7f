//! How recently each remote origin progressed, as one member of a DC group knows it.

use std::collections::BTreeMap;
use std::time::Duration;

/// When each remote origin's copies last progressed (a batch or snapshot applied, or, on
/// the leader's gateway, a ping that found this DC caught up), on this node's clock. A
/// follower keeps it from its own applies and from the leader's answers, so that its
/// `stale` flag turns when the leader's does (within a round trip for progress only the
/// leader's gateway saw, at once for applies and for the lack of progress).
#[derive(Debug, Default)]
pub struct RemoteProgress(parking_lot::Mutex<BTreeMap<String, std::time::Instant>>);

impl RemoteProgress {
    /// `origin` progressed at `at` (kept if later than what is known).
    pub fn note(&self, origin: &str, at: std::time::Instant) {
        let mut m = self.0.lock();
        match m.get_mut(origin) {
            Some(t) => *t = (*t).max(at),
            None => {
                m.insert(origin.to_owned(), at);
            }
        }
    }

    /// No progress of `origin` known within `stale_after_ms`.
    pub fn stale(&self, origin: &str, stale_after_ms: u64) -> bool {
        self.0.lock().get(origin).is_none_or(|t| t.elapsed() > Duration::from_millis(stale_after_ms))
    }
}
