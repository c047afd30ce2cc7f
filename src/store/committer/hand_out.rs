//! A round of local appends written: its events told to `on_commit` and then handed to
//! the requests that made them, moved each time, and each request's waits timed.

use std::ops::Range;

use tandem_replicator::log::StateChange;
use tandem_schemas::ChangeEvent;

use super::recovery::InDoubt;
#[cfg(doc)]
use super::CommitStats;
use super::{
    clone_log_error, group_bucket, CommitError, CommitLog, CommitNotice, Committed, Committer, Group,
    WriteStart,
};

impl<L: CommitLog + Send + 'static> Committer<L> {
    /// Writes the staged round of local appends with one synced write, then answers its
    /// callers (each with its own events), timing each one's wait before the write and
    /// after it ([`CommitStats::local_queued`], [`CommitStats::local_answered`]).
    pub(super) fn flush_local(&mut self, group: &mut Group) {
        if group.members.is_empty() {
            return;
        }
        let events = std::mem::take(&mut group.events);
        let owners = std::mem::take(&mut group.owners);
        let members = std::mem::take(&mut group.members);
        let before = self.begin_write();
        match self.log.append_local_owned(&events, &owners) {
            Ok(changes) => {
                let written = std::time::Instant::now();
                let events = self.after_local_write(before, events, changes);
                {
                    // Counted before any caller is answered: a caller never sees its write
                    // answered and not counted.
                    let mut stats = self.stats.lock();
                    stats.local_fsyncs += 1;
                    stats.requests += members.len() as u64;
                    stats.local_requests += members.len() as u64;
                    stats.local_events += events.len() as u64;
                    stats.local_group_requests[group_bucket(members.len())] += 1;
                    for (_, r) in &members {
                        stats.local_queued.record(before.at.saturating_duration_since(r.queued));
                    }
                }
                let mut answered = super::Durations::default();
                for (reply, mine) in hand_out(events, members) {
                    reply.finish(Ok(mine));
                    answered.record(written.elapsed());
                }
                self.stats.lock().local_answered.add(&answered);
            }
            Err(e) if !self.log.writable() => {
                // The outcome on disk is unknown: the callers wait for the recovery to
                // tell whether the group landed.
                self.enter_unwritable(&e, InDoubt::Local { events, members });
            }
            Err(e) => {
                for (_, reply) in members {
                    self.answer_local(reply, Err(CommitError::Log(clone_log_error(&e))));
                }
            }
        }
    }

    /// [`after_write`](Self::after_write) of a written round of local appends: its events go
    /// to `on_commit` in the notice and come back for their callers, moved rather than
    /// copied (a registration's record is a dozen allocations, and the committer's round is
    /// the batched write path's bound: issue 21).
    pub(super) fn after_local_write(
        &mut self,
        start: WriteStart,
        events: Vec<ChangeEvent>,
        changes: Vec<StateChange>,
    ) -> Vec<ChangeEvent> {
        if !self.publish_since(start) {
            return events;
        }
        let notice = CommitNotice {
            index: self.log.index(),
            own_mark: self.log.own_mark(),
            committed: Committed::Local { events, changes },
        };
        (self.on_commit)(&notice);
        match notice.committed {
            Committed::Local { events, .. } => events,
            _ => unreachable!("the notice was made just above as Committed::Local"),
        }
    }
}

/// Each member's own events of a written round, in the members' order, moved out of the
/// round rather than copied (a registration's record is a dozen allocations). The committer
/// stages the members' events as consecutive ranges in order, so each range, taken from the
/// back, is the round's tail; a range that is not (never staged so) gets a copy.
pub(super) fn hand_out<R>(
    mut events: Vec<ChangeEvent>,
    members: Vec<(Range<usize>, R)>,
) -> Vec<(R, Vec<ChangeEvent>)> {
    let mut out: Vec<(R, Vec<ChangeEvent>)> = members
        .into_iter()
        .rev()
        .map(|(range, reply)| {
            let mine = if range.start <= range.end && range.end == events.len() {
                events.split_off(range.start)
            } else {
                events.get(range).map(<[ChangeEvent]>::to_vec).unwrap_or_default()
            };
            (reply, mine)
        })
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use tandem_replicator::log::conformance::reg;

    use super::*;

    fn round(n: u64) -> Vec<ChangeEvent> {
        (1..=n).map(|seq| reg("dc-a", 1, seq, &format!("i{seq}"))).collect()
    }

    fn seqs(events: &[ChangeEvent]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn each_member_gets_its_own_events_in_order() {
        let members = vec![(0..2, 'a'), (2..2, 'b'), (2..5, 'c'), (5..6, 'd')];
        let out = hand_out(round(6), members);
        let got: Vec<(char, Vec<u64>)> = out.iter().map(|(r, e)| (*r, seqs(e))).collect();
        assert_eq!(got, vec![('a', vec![1, 2]), ('b', vec![]), ('c', vec![3, 4, 5]), ('d', vec![6])]);
    }

    #[test]
    fn ranges_out_of_order_or_out_of_bounds_get_copies() {
        let members = vec![(3..4, 'x'), (0..2, 'y'), (5..9, 'z')];
        let got: Vec<(char, Vec<u64>)> =
            hand_out(round(4), members).iter().map(|(r, e)| (*r, seqs(e))).collect();
        assert_eq!(got, vec![('x', vec![4]), ('y', vec![1, 2]), ('z', vec![])]);
    }
}
