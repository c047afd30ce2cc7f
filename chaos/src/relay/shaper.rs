//! The sans-IO core: a [`Shaper`] turns the faults of one direction and a seeded RNG into a
//! [`Verdict`] for each datagram. No clock, no I/O.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{LinkFaults, DELAY_MS_MAX, DRAWS_PER_DATAGRAM};

/// What happens to one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not delivered.
    Drop(DropCause),
    /// Delivered after `delay` (zero: immediately); `held_back` says whether `delay` includes
    /// a reorder hold; `duplicate` is the delay of a second copy, if any.
    Deliver { delay: Duration, held_back: bool, duplicate: Option<Duration> },
}

/// Why a [`Verdict`] dropped a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCause {
    /// The direction is partitioned.
    Partition,
    /// Random loss.
    Loss,
}

/// The decision maker for one direction: a seeded RNG and nothing else. No clock, no I/O.
#[derive(Debug)]
pub struct Shaper {
    rng: StdRng,
}

impl Shaper {
    /// A shaper whose decisions are fixed by `seed`.
    pub fn new(seed: u64) -> Shaper {
        Shaper { rng: StdRng::seed_from_u64(seed) }
    }

    /// The verdict for the next datagram under `faults`. Consumes exactly
    /// [`DRAWS_PER_DATAGRAM`] draws, so the n-th verdict does not depend on earlier outcomes.
    pub fn decide(&mut self, faults: &LinkFaults) -> Verdict {
        let draws: [f64; DRAWS_PER_DATAGRAM] = std::array::from_fn(|_| self.rng.gen::<f64>());
        let [loss, jitter, reorder, duplicate, duplicate_jitter] = draws;
        if faults.partitioned {
            return Verdict::Drop(DropCause::Partition);
        }
        if faults.loss.hit(loss) {
            return Verdict::Drop(DropCause::Loss);
        }
        let base = ms(faults.delay_ms);
        let jitter_max = ms(faults.jitter_ms);
        let hold = ms(faults.reorder_hold_ms);
        let held_back = !hold.is_zero() && faults.reorder.hit(reorder);
        let delay = base + jitter_max.mul_f64(jitter) + if held_back { hold } else { Duration::ZERO };
        let duplicate = faults.duplicate.hit(duplicate).then(|| base + jitter_max.mul_f64(duplicate_jitter));
        Verdict::Deliver { delay, held_back, duplicate }
    }
}

fn ms(value_ms: u32) -> Duration {
    Duration::from_millis(u64::from(value_ms.min(DELAY_MS_MAX)))
}
