//! Time as an input: the [`Clock`] the registry, its leases, failover and the commit path
//! read, instead of reading the system clocks themselves.
//!
//! Production runs on [`SystemClock`]; the node simulation (`tests/node_sim.rs`) runs on a
//! [`ManualClock`] it moves by hand, so a seed replays exactly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of time.
pub trait Clock: Send + Sync {
    /// Monotonic milliseconds (leases, failover hysteresis, self-preservation). Never goes
    /// backwards; its origin is arbitrary but fixed for the clock's life.
    fn now_ms(&self) -> u64;
    /// Wall-clock milliseconds since the Unix epoch (event commit times, which the purge
    /// grace and the replication lag compare).
    fn wall_ms(&self) -> u64;
}

/// The system's clocks: monotonic time since the clock was made, and the wall clock.
#[derive(Debug)]
pub struct SystemClock {
    started: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock { started: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
    fn wall_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to (simulations and tests). The wall clock is the
/// monotonic one plus a fixed offset.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
    wall_offset_ms: u64,
}

impl ManualClock {
    /// A clock at `now_ms`, whose wall clock reads `now_ms + wall_offset_ms`.
    pub fn new(now_ms: u64, wall_offset_ms: u64) -> Self {
        ManualClock { now_ms: AtomicU64::new(now_ms), wall_offset_ms }
    }

    /// Moves the clock to `now_ms` (never backwards).
    pub fn set(&self, now_ms: u64) {
        self.now_ms.fetch_max(now_ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
    fn wall_ms(&self) -> u64 {
        self.now_ms() + self.wall_offset_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_forward() {
        let c = ManualClock::new(10, 1_000);
        c.advance(5);
        assert_eq!((c.now_ms(), c.wall_ms()), (15, 1_015));
        c.set(3);
        assert_eq!(c.now_ms(), 15);
        c.set(20);
        assert_eq!(c.now_ms(), 20);
    }
}
