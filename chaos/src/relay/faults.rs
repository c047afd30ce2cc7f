//! What the relay does to datagrams: [`Faults`] per direction ([`LinkFaults`]), validated
//! probabilities ([`Probability`]), and the bounds on everything it holds ([`RelayLimits`]).

use std::num::{NonZeroU64, NonZeroUsize};

/// Faults for both directions of a relay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Client → upstream.
    pub forward: LinkFaults,
    /// Upstream → client.
    pub backward: LinkFaults,
}

impl Faults {
    /// No faults: a transparent relay.
    pub const NONE: Faults = Faults { forward: LinkFaults::NONE, backward: LinkFaults::NONE };

    /// The same faults in both directions.
    pub const fn symmetric(link: LinkFaults) -> Faults {
        Faults { forward: link, backward: link }
    }
}

/// Faults for one direction. Applied in this order to each datagram: partition, loss, then
/// the survivor is delivered after `delay_ms` + uniform `[0, jitter_ms]`, possibly held back
/// another `reorder_hold_ms` (so later datagrams overtake it), possibly with one duplicate
/// (delivered after its own `delay_ms` + jitter, never held back).
///
/// Millisecond fields above [`DELAY_MS_MAX`](super::DELAY_MS_MAX) are treated as
/// [`DELAY_MS_MAX`](super::DELAY_MS_MAX). Jitter alone can reorder datagrams too, as it does
/// on a real network.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Drop everything.
    pub partitioned: bool,
    /// Probability that a datagram is dropped.
    pub loss: Probability,
    /// Base delay added to every datagram, in milliseconds.
    pub delay_ms: u32,
    /// Upper bound of the uniform extra delay, in milliseconds.
    pub jitter_ms: u32,
    /// Probability that a datagram is delivered twice.
    pub duplicate: Probability,
    /// Probability that a datagram is held back by `reorder_hold_ms`.
    pub reorder: Probability,
    /// How long a datagram chosen for reordering is held back, in milliseconds. With 0,
    /// reordering is off.
    pub reorder_hold_ms: u32,
}

impl LinkFaults {
    /// No faults.
    pub const NONE: LinkFaults = LinkFaults {
        partitioned: false,
        loss: Probability::ZERO,
        delay_ms: 0,
        jitter_ms: 0,
        duplicate: Probability::ZERO,
        reorder: Probability::ZERO,
        reorder_hold_ms: 0,
    };

    /// Drops everything.
    pub const PARTITIONED: LinkFaults = LinkFaults { partitioned: true, ..LinkFaults::NONE };
}

/// A probability in `[0.0, 1.0]`; constructing one is the only validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Probability(f64);

impl Probability {
    /// Never.
    pub const ZERO: Probability = Probability(0.0);
    /// Always.
    pub const ONE: Probability = Probability(1.0);

    /// `None` unless `0.0 <= p <= 1.0` (NaN is rejected).
    pub fn new(p: f64) -> Option<Probability> {
        (0.0..=1.0).contains(&p).then_some(Probability(p))
    }

    /// `pct` percent; values above 100 mean 100 %.
    pub const fn percent(pct: u8) -> Probability {
        let pct = if pct > 100 { 100 } else { pct };
        Probability(pct as f64 / 100.0)
    }

    /// The probability as a number in `[0.0, 1.0]`.
    pub const fn value(self) -> f64 {
        self.0
    }

    /// True with this probability, given a uniform draw in `[0, 1)`.
    pub(super) fn hit(self, draw: f64) -> bool {
        draw < self.0
    }
}

/// Bounds on everything the relay holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Most client mappings (one upstream socket and task each). When full, the least recently
    /// active mapping is evicted to admit a new client.
    pub mappings_max: NonZeroUsize,
    /// A mapping with no traffic either way for this long is removed, in milliseconds.
    pub mapping_idle_ms: NonZeroU64,
    /// Most datagrams waiting in the timer queue (delayed, held back or duplicated).
    pub delay_queue_datagrams_max: NonZeroUsize,
    /// Most payload bytes waiting in the timer queue.
    pub delay_queue_bytes_max: NonZeroUsize,
}

impl Default for RelayLimits {
    fn default() -> Self {
        RelayLimits {
            mappings_max: NonZeroUsize::new(64).unwrap(),
            mapping_idle_ms: NonZeroU64::new(30_000).unwrap(),
            delay_queue_datagrams_max: NonZeroUsize::new(8_192).unwrap(),
            delay_queue_bytes_max: NonZeroUsize::new(32 * 1024 * 1024).unwrap(),
        }
    }
}
