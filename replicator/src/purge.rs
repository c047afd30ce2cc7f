//! The purge rule: how far a DC may purge its own log (entries and tombstones), as one
//! pure function that the node's purge task and the simulations call.
//!
//! An own entry may go once every peer that counts has acknowledged it in the current
//! epoch and it is older than the grace period. A peer without an acknowledgement of the
//! current epoch holds the floor at 0 (nothing is purged). Which peers count is the
//! caller's policy (the product counts every configured peer; a simulation may leave out
//! silent ones to force snapshots).
//!
//! Architecture invariant: no clock, no storage. The caller passes the cutoff time and a
//! reader of its own log.

use tandem_schemas::{ChangeEvent, Mark};

/// Most own entries one purge pass looks at (the pass resumes where it stopped next time).
pub const PURGE_SCAN_MAX: usize = 65_536;
/// Entries read per call of the reader.
const READ_BATCH: usize = 1_024;

/// The highest own seq every counted peer acknowledged in the epoch of `own`: `acks` has
/// one entry per counted peer (`None`: no acknowledgement recorded).
pub fn acked_floor(own: Mark, acks: impl IntoIterator<Item = Option<Mark>>) -> u64 {
    let mut floor = own.seq;
    for ack in acks {
        match ack {
            Some(m) if m.epoch == own.epoch => floor = floor.min(m.seq),
            Some(_) | None => floor = 0,
        }
    }
    floor
}

/// The seq up to which the own log may be purged: walks forward from `purge_floor` while
/// entries are at or below `acked` (see [`acked_floor`]) and committed at or before
/// `cutoff_ms` (now minus the grace), looking at most at [`PURGE_SCAN_MAX`] entries.
/// `read_own(after_seq, max)` reads the own log. Returns `purge_floor` when nothing more
/// may go.
pub fn purge_upto<E>(
    purge_floor: u64,
    acked: u64,
    cutoff_ms: u64,
    mut read_own: impl FnMut(u64, usize) -> Result<Vec<ChangeEvent>, E>,
) -> Result<u64, E> {
    let mut upto = purge_floor;
    let mut scanned = 0usize;
    while upto < acked && scanned < PURGE_SCAN_MAX {
        let batch = read_own(upto, READ_BATCH)?;
        if batch.is_empty() {
            break;
        }
        for ev in &batch {
            if ev.seq > acked || ev.commit_time_ms > cutoff_ms {
                return Ok(upto);
            }
            upto = ev.seq;
        }
        scanned += batch.len();
    }
    Ok(upto)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::conformance::{ev, record};
    use tandem_schemas::Op;

    fn log(times: &[u64]) -> Vec<ChangeEvent> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut e = ev("dc-a", 1, i as u64 + 1, Op::Register(record("dc-a", "i")));
                e.commit_time_ms = *t;
                e
            })
            .collect()
    }

    fn read(events: &[ChangeEvent]) -> impl FnMut(u64, usize) -> Result<Vec<ChangeEvent>, ()> + '_ {
        move |after, max| Ok(events.iter().filter(|e| e.seq > after).take(max).cloned().collect())
    }

    #[test]
    fn every_counted_peer_must_have_acked_in_this_epoch() {
        let own = Mark { epoch: 2, seq: 10 };
        assert_eq!(acked_floor(own, []), 10);
        assert_eq!(acked_floor(own, [Some(Mark { epoch: 2, seq: 4 }), Some(Mark { epoch: 2, seq: 7 })]), 4);
        assert_eq!(acked_floor(own, [Some(Mark { epoch: 2, seq: 4 }), None]), 0);
        assert_eq!(acked_floor(own, [Some(Mark { epoch: 1, seq: 9 })]), 0);
    }

    #[test]
    fn purges_only_acked_entries_older_than_the_grace() {
        let events = log(&[10, 20, 30, 40, 50]);
        assert_eq!(purge_upto(0, 5, 35, read(&events)), Ok(3));
        assert_eq!(purge_upto(0, 2, 100, read(&events)), Ok(2));
        assert_eq!(purge_upto(3, 5, 100, read(&events)), Ok(5));
        assert_eq!(purge_upto(0, 0, 100, read(&events)), Ok(0));
        assert_eq!(purge_upto(0, 5, 5, read(&events)), Ok(0));
    }
}
