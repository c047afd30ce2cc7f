//! The group-commit linger: how long a round waits for more writers before its fsync.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::{CommitLog, Committer, ReadLogFn, Request, LINGER_QUIET_GAPS};

impl<L: CommitLog + Send + 'static> Committer<L> {
    /// Group-commit linger. Only when writers are evidently concurrent (the round already
    /// holds two or more requests): the thread waits, in short sleeps, while writers keep
    /// coming, until the round is as large as the previous round ended up (the number of
    /// writers that were active then), capped by the target, or the linger budget is spent.
    /// It stops as soon as [`LINGER_QUIET_GAPS`] gaps pass with no new request: the
    /// writers answered by the previous round are back by then, and a round waiting for
    /// writers that are not coming (arrivals at a moderate rate, not a burst of returning
    /// writers) would only add its wait to every caller's latency. A lone writer never
    /// waits; a few writers wait only until all of them are in; many writers fill the
    /// round up to the target. The thread sleeps (it does not spin), which leaves the core
    /// to the request handlers producing the next writes.
    ///
    /// Reads ([`Request::ReadLog`]) taken while it lingers are served at once rather than
    /// ending it: they neither wait for the round's fsync nor cost the writers their group.
    pub(super) fn linger(&mut self, round: &mut Vec<Request<L>>) {
        let l = self.limits;
        let want = self.last_round.min(l.linger_target).min(l.group_requests_max.get());
        if l.linger_max.is_zero() {
            return;
        }
        self.serve_reads_among_appends(round);
        if round.len() < 2 {
            return;
        }
        let quiet = l.linger_gap * LINGER_QUIET_GAPS;
        let started = Instant::now();
        let deadline = started + l.linger_max;
        let mut last_arrival = started;
        while round.len() < want {
            if round.iter().any(|r| !matches!(r, Request::LocalAppend { .. })) {
                return;
            }
            std::thread::sleep(l.linger_gap);
            let before = round.len();
            self.take_waiting(round);
            self.serve_reads_among_appends(round);
            let now = Instant::now();
            if round.len() > before {
                last_arrival = now;
            } else if now.duration_since(last_arrival) >= quiet {
                return;
            }
            if now >= deadline {
                return;
            }
        }
    }
}

impl<L: CommitLog + Send + 'static> Committer<L> {
    /// Runs a read with the log. A panicking function must not take the sequencer down;
    /// its caller sees its reply channel dropped.
    pub(super) fn serve_read(&mut self, f: ReadLogFn<L>) {
        if catch_unwind(AssertUnwindSafe(|| f(&self.log))).is_err() {
            tracing::error!("a read_log function panicked on the committer thread");
        }
        self.stats.lock().requests += 1;
    }

    /// Serves the reads of `round` that only local appends precede (an append is not
    /// written before its round's fsync, so a read sees the same log before or after it),
    /// and takes them out of the round. A read behind any other request waits for it.
    fn serve_reads_among_appends(&mut self, round: &mut Vec<Request<L>>) {
        let mut i = 0;
        while i < round.len() {
            match &round[i] {
                Request::LocalAppend { .. } => i += 1,
                Request::ReadLog(_) => {
                    if let Request::ReadLog(f) = round.remove(i) {
                        self.serve_read(f);
                    }
                }
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::super::{BuildEvents, Built, CommitterHandle, CommitterLimits};
    use super::*;
    use crate::store::MemStore;

    fn append() -> Request<MemStore> {
        let (reply, _answer) = oneshot::channel();
        let build: BuildEvents = Box::new(|_| Built { events: Vec::new(), owners: Vec::new() });
        Request::local_append(build, None, reply)
    }

    fn committer(linger_max: Duration) -> (Committer<MemStore>, CommitterHandle<MemStore>) {
        let limits = CommitterLimits { linger_max, linger_target: 1024, ..Default::default() };
        Committer::new(MemStore::new("dc-a", 1), Box::new(|_| {}), limits)
    }

    /// After a round of 64, two writers and then no more: the round is written once the
    /// writers stop coming, not after the whole budget spent waiting for 62 that are not
    /// on their way (which held every registration at a moderate rate for the budget).
    #[test]
    fn a_linger_ends_when_writers_stop_coming() {
        let (mut c, _handle) = committer(Duration::from_secs(5));
        c.last_round = 64;
        let mut round = vec![append(), append()];
        let t = Instant::now();
        c.linger(&mut round);
        let waited = t.elapsed();
        assert_eq!(round.len(), 2);
        assert!(
            waited < Duration::from_secs(1),
            "the linger waited {waited:?} for writers that were not coming"
        );
        assert!(
            waited >= c.limits.linger_gap * LINGER_QUIET_GAPS,
            "it ended before a quiet window: {waited:?}"
        );
    }

    /// A read taken while the round lingers (the gateway reading what to ship) is answered
    /// at once, and the linger goes on gathering the writers. It used to end the linger:
    /// the writers lost their group to a read that changes nothing.
    #[test]
    fn a_read_taken_while_lingering_is_served_and_the_linger_goes_on() {
        use tandem_replicator::log::EventLog;
        let (mut c, handle) = committer(Duration::from_secs(5));
        c.last_round = 64;
        let (tx, mut answered) = oneshot::channel();
        let read = Request::ReadLog(Box::new(move |log: &MemStore| {
            let _ = tx.send(log.own_mark().seq);
        }));
        handle.tx.blocking_send(read).unwrap();
        let mut round = vec![append(), append()];
        let t = Instant::now();
        c.linger(&mut round);
        let waited = t.elapsed();
        assert_eq!(answered.try_recv().ok(), Some(0), "the read was not served while lingering");
        assert_eq!(round.len(), 2);
        assert!(round.iter().all(|r| matches!(r, Request::LocalAppend { .. })));
        assert!(
            waited >= c.limits.linger_gap * LINGER_QUIET_GAPS,
            "the read ended the linger after {waited:?}"
        );
    }

    /// Writers that keep coming are gathered, and the linger still ends at its budget.
    #[test]
    fn a_linger_gathers_writers_that_keep_coming_within_its_budget() {
        let (mut c, handle) = committer(Duration::from_millis(20));
        c.last_round = 1024;
        let tx = handle.tx.clone();
        let feeder = std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until && tx.blocking_send(append()).is_ok() {
                std::thread::sleep(Duration::from_micros(20));
            }
        });
        let started = Instant::now();
        while handle.queued_requests() == 0 {
            assert!(started.elapsed() < Duration::from_secs(10), "the feeder never sent");
            std::thread::yield_now();
        }
        let mut round = vec![append(), append()];
        let t = Instant::now();
        c.linger(&mut round);
        let waited = t.elapsed();
        drop(c);
        feeder.join().unwrap();
        assert!(round.len() > 2, "no writer was gathered");
        assert!(waited < Duration::from_millis(500), "the linger outlived its budget: {waited:?}");
    }
}
