//! The state shared by the relay's tasks and handles: per direction the faults in force,
//! its shaper and its counters, and the mapping counters.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::stats::{bump, LinkCounters};
use super::{DropCause, Faults, LinkFaults, RelayStats, Shaper, Verdict};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Way {
    Forward,
    Backward,
}

pub(super) struct Link {
    pub(super) faults: LinkFaults,
    pub(super) shaper: Shaper,
}

pub(super) struct Shared {
    pub(super) forward: Mutex<Link>,
    pub(super) backward: Mutex<Link>,
    pub(super) forward_counters: LinkCounters,
    pub(super) backward_counters: LinkCounters,
    pub(super) mappings_open: AtomicU64,
    pub(super) mappings_expired: AtomicU64,
    pub(super) mappings_evicted: AtomicU64,
}

/// Separates the backward stream from the forward one (the golden-ratio constant).
const BACKWARD_SEED_OFFSET: u64 = 0x9E37_79B9_7F4A_7C15;

impl Shared {
    pub(super) fn new(faults: Faults, seed: u64) -> Shared {
        Shared {
            forward: Mutex::new(Link { faults: faults.forward, shaper: Shaper::new(seed) }),
            backward: Mutex::new(Link {
                faults: faults.backward,
                shaper: Shaper::new(seed.wrapping_add(BACKWARD_SEED_OFFSET)),
            }),
            forward_counters: LinkCounters::default(),
            backward_counters: LinkCounters::default(),
            mappings_open: AtomicU64::new(0),
            mappings_expired: AtomicU64::new(0),
            mappings_evicted: AtomicU64::new(0),
        }
    }

    pub(super) fn link(&self, way: Way) -> &Mutex<Link> {
        match way {
            Way::Forward => &self.forward,
            Way::Backward => &self.backward,
        }
    }

    pub(super) fn counters(&self, way: Way) -> &LinkCounters {
        match way {
            Way::Forward => &self.forward_counters,
            Way::Backward => &self.backward_counters,
        }
    }

    /// Counts the datagram and returns its verdict; one lock per datagram.
    pub(super) fn decide(&self, way: Way) -> Verdict {
        let counters = self.counters(way);
        bump(&counters.received);
        let verdict = {
            let mut link = self.link(way).lock();
            let faults = link.faults;
            link.shaper.decide(&faults)
        };
        match verdict {
            Verdict::Drop(DropCause::Partition) => bump(&counters.dropped_partition),
            Verdict::Drop(DropCause::Loss) => bump(&counters.dropped_loss),
            Verdict::Deliver { held_back, duplicate, .. } => {
                if held_back {
                    bump(&counters.reordered);
                }
                if duplicate.is_some() {
                    bump(&counters.duplicated);
                }
            }
        }
        verdict
    }

    pub(super) fn stats(&self) -> RelayStats {
        RelayStats {
            forward: self.forward_counters.snapshot(),
            backward: self.backward_counters.snapshot(),
            mappings_open: self.mappings_open.load(Ordering::Relaxed),
            mappings_expired: self.mappings_expired.load(Ordering::Relaxed),
            mappings_evicted: self.mappings_evicted.load(Ordering::Relaxed),
        }
    }
}
