//! Ordered origin epochs (docs/replication.md, "Epochs").
//!
//! An epoch names one history of an origin's events. Epochs are ordered: a `u64` whose
//! high bits are a *generation* and whose low [`TIEBREAK_BITS`] bits are random, compared
//! as numbers. A new history takes a generation above every epoch of that origin its peers
//! have seen ([`above`]); a receiver never goes back to an older epoch; an origin that
//! learns of a newer epoch of itself is an older incarnation and is fenced.
//!
//! - A brand-new data dir starts *provisional*: generation 0 ([`provisional`]). It takes
//!   writes at once; at its first handshake with a peer that holds an epoch of it, it takes
//!   a generation above that epoch (and the peer gets a snapshot with those writes).
//! - Epochs minted before epochs were ordered are random numbers below 2^53: read the
//!   same way they are valid ordered epochs (generation `epoch >> TIEBREAK_BITS`), so
//!   existing data dirs keep their epoch and only new histories are minted above them.
//!
//! Architecture invariant: pure functions; the caller supplies the randomness.

/// Bits of an epoch that are random, below the generation.
pub const TIEBREAK_BITS: u32 = 20;

const TIEBREAK_MASK: u64 = (1 << TIEBREAK_BITS) - 1;

/// The generation of an epoch (0: provisional).
pub fn generation(epoch: u64) -> u64 {
    epoch >> TIEBREAK_BITS
}

/// True for the epoch of a data dir that has not yet learned, from a peer, which epochs of
/// its origin exist: it re-epochs above a newer one instead of being fenced by it.
pub fn is_provisional(epoch: u64) -> bool {
    generation(epoch) == 0
}

/// The epoch of a brand-new data dir: generation 0, non-zero, from `random`.
pub fn provisional(random: u64) -> u64 {
    (random & TIEBREAK_MASK).max(1)
}

/// An epoch of the next generation above `seen` (the highest epoch of the origin known),
/// with a random tiebreak. Saturates at the last generation (2^44 of them: unreachable).
pub fn above(seen: u64, random: u64) -> u64 {
    let gen = generation(seen).saturating_add(1).min(u64::MAX >> TIEBREAK_BITS);
    (gen << TIEBREAK_BITS) | (random & TIEBREAK_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_histories_are_ordered_above_what_was_seen() {
        let fresh = provisional(0xdead_beef);
        assert!(is_provisional(fresh) && fresh != 0);
        assert_eq!(provisional(0), 1);
        let first = above(fresh, 7);
        assert!(first > fresh && !is_provisional(first));
        // Whatever the tiebreaks, the next generation is above.
        assert!(above(first, 0) > first && above(first, u64::MAX) > first);
        // A random epoch of the time before ordering (below 2^53) is an ordered epoch too.
        let legacy = 0x1f_ffff_ffff_ffff;
        assert!(above(legacy, 0) > legacy);
        assert_eq!(above(u64::MAX, 0), !TIEBREAK_MASK);
    }
}
