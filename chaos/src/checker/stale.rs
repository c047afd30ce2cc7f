//! The **staleness** invariant: a DC's `stale` flag for a peer's copies (in `/v1/status`
//! `peers.*.inbound.stale` and on every copy in a `?dc=all` answer) compared with the
//! progress the checker itself can see. tandem's rule: the copies are stale when no batch
//! or snapshot was applied, and no ping found the DC caught up, for `stale_after_ms` (SA);
//! handshakes do not count.
//!
//! Reads are judged against intervals where the flag is known:
//! - **fresh required**: two consecutive status samples `b`, `a` of DC d show d's applied
//!   mark of peer p rising (same epoch), so something was applied between `b`'s invocation
//!   and `a`'s completion. Every later read invoked at least `FRESH_TOLERANCE_MS` after `a`
//!   completed, and completed before `b.invoked + SA - FRESH_TOLERANCE_MS`, must say fresh.
//! - **stale required**, no progress possible: p's packets to d are cut (a partition, a
//!   one-way cut from p to d), p is killed (until it is spawned again) or paused (until
//!   resumed), from `start`: every read invoked after `start + SA + STALE_TOLERANCE_MS` and
//!   completed before the window ends must say stale.
//! - **stale required**, no progress made: d's status samples `j` .. `k` show the same mark
//!   of p while d knew p to be ahead at `j` (`origin_last_seq` above the mark, same epoch:
//!   no ping can find d caught up, and no batch moved the mark): every read invoked after
//!   `j.completed + SA + STALE_TOLERANCE_MS` and completed before `k.invoked` must say
//!   stale. This is what catches a handshake (a flapping or refusing link) passing for
//!   progress.
//!
//! A restart of d resets its link state, so a rule never spans one (no Spawned of d between
//! the rule's first evidence and the read); a new leader of d's group (`LeaderServing`)
//! does the same (its gateway is another one).

use std::collections::{BTreeMap, VecDeque};

use super::{
    Checker, Invariant, Mark, Ms, ObservedInstance, ProcessEvent, StatusObservation, StatusView,
    ViewObservation,
};

/// Slack on the fresh rule: the mark is updated just before the progress time.
pub const FRESH_TOLERANCE_MS: Ms = 100;
/// Slack on the stale rules: frames already received when a fault starts may still be
/// applied, and the flag is computed at the read.
pub const STALE_TOLERANCE_MS: Ms = 300;
/// How far back reads are kept for the no-progress rule.
const READS_KEPT_MS: Ms = 20_000;

#[derive(Clone, Copy, Debug)]
struct Sample {
    invoked: Ms,
    completed: Ms,
    mark: Option<Mark>,
    origin: Mark,
}

#[derive(Clone, Debug)]
struct Read {
    invoked: Ms,
    completed: Ms,
    stale: bool,
    what: String,
    judged_static: bool,
}

#[derive(Debug, Default)]
struct Pair {
    prev: Option<Sample>,
    /// First sample of the current run of equal marks, when d was behind at it.
    run_start: Option<Sample>,
    /// Fresh-required windows: (from, to, origin, why).
    fresh: VecDeque<(Ms, Ms, Ms, String)>,
    reads: VecDeque<Read>,
    reported: u32,
}

/// Windows of a cut link: (down, up or `None` while down).
type Windows = Vec<(Ms, Option<Ms>)>;

/// Per (DC, peer): samples, reads and the windows where the flag is known.
#[derive(Debug, Default)]
pub(super) struct Staleness {
    pairs: BTreeMap<(String, String), Pair>,
    /// Packets from .0 to .1 cut: windows (down, up).
    links: BTreeMap<(String, String), Windows>,
    /// Per DC, when a SIGCONT was about to be sent. `Resumed` comes once the signal was
    /// sent (the rules that excuse a paused process need the later time); the process may
    /// run, and ship, from the moment before.
    resuming: BTreeMap<String, Vec<Ms>>,
    pub(super) required_fresh: u64,
    pub(super) required_stale: u64,
}

/// Violations reported per (DC, peer) in detail; the rest are counted.
const REPORTED_PER_PAIR_MAX: u32 = 3;

impl Checker {
    /// The packets from `from` to `to` are cut (`down`) or flow again, from `at`.
    pub fn link(&mut self, at: Ms, from: &str, to: &str, down: bool) {
        let w = self.stale.links.entry((from.to_owned(), to.to_owned())).or_default();
        match (down, w.last_mut()) {
            (true, Some((_, None))) => {}
            (true, _) => w.push((at, None)),
            (false, Some((_, end @ None))) => *end = Some(at),
            (false, _) => {}
        }
    }

    /// A SIGCONT is about to be sent to `dc` (its `Resumed` follows once it was sent): a
    /// pause's silence ends here, not at the `Resumed`.
    pub fn resuming(&mut self, at: Ms, dc: &str) {
        self.stale.resuming.entry(dc.to_owned()).or_default().push(at);
    }

    /// `dc`'s link state started over in [from, to]: a restart, or a new leader (its
    /// gateway is a new one).
    fn spawned_between(&self, dc: &str, from: Ms, to: Ms) -> bool {
        self.dcs.get(dc).is_some_and(|st| {
            st.events.iter().any(|(t, e)| {
                matches!(e, ProcessEvent::Spawned | ProcessEvent::LeaderServing) && *t >= from && *t <= to
            })
        })
    }

    /// Windows in which nothing from `peer` can reach `dc`: (start, end or None).
    fn silent_windows(&self, peer: &str, dc: &str) -> Vec<(Ms, Option<Ms>, String)> {
        let mut out = Vec::new();
        if let Some(w) = self.stale.links.get(&(peer.to_owned(), dc.to_owned())) {
            out.extend(w.iter().map(|(a, b)| (*a, *b, format!("{peer}'s packets to {dc} cut from {a}ms"))));
        }
        if let Some(st) = self.dcs.get(peer) {
            let mut down: Option<(Ms, &str)> = None;
            for (t, e) in &st.events {
                match e {
                    ProcessEvent::Killed => {
                        down.get_or_insert((*t, "killed"));
                    }
                    ProcessEvent::Paused => {
                        down.get_or_insert((*t, "paused"));
                    }
                    ProcessEvent::Spawned | ProcessEvent::Resumed => {
                        if let Some((s, what)) = down.take() {
                            // Silent until the signal that ended the pause was sent.
                            let sent = self.stale.resuming.get(peer).into_iter().flatten();
                            let end = sent.filter(|r| **r >= s && **r <= *t).max().copied().unwrap_or(*t);
                            out.push((s, Some(end), format!("{peer} {what} at {s}ms")));
                        }
                    }
                    // A group without a leader ships nothing for a while, but when another
                    // member started shipping is known only as an upper bound: not judged.
                    ProcessEvent::Ready
                    | ProcessEvent::HistoryLost
                    | ProcessEvent::HistoryRewound
                    | ProcessEvent::LeaderLost
                    | ProcessEvent::LeaderServing => {}
                }
            }
            if let Some((s, what)) = down {
                out.push((s, None, format!("{peer} {what} at {s}ms")));
            }
        }
        out
    }

    /// Judges one read of `dc`'s flag for `peer`'s copies against the windows known now,
    /// and keeps it for the no-progress rule.
    fn stale_read(&mut self, dc: &str, peer: &str, invoked: Ms, completed: Ms, stale: bool, what: String) {
        let Some(sa) = self.cfg.stale_after_ms else { return };
        let mut problems: Vec<String> = Vec::new();
        for (start, end, why) in self.silent_windows(peer, dc) {
            if invoked >= start + sa + STALE_TOLERANCE_MS
                && end.is_none_or(|e| completed <= e)
                && !self.spawned_between(dc, start, completed)
            {
                self.stale.required_stale += 1;
                self.bump_check(Invariant::Staleness);
                if !stale {
                    problems.push(format!(
                        "{what} says {peer}'s copies are fresh, but nothing from {peer} could reach {dc} ({why}) for over {sa}ms"
                    ));
                }
            }
        }
        let fresh: Vec<(Ms, Ms, Ms, String)> = self
            .stale
            .pairs
            .get(&(dc.to_owned(), peer.to_owned()))
            .map(|p| p.fresh.iter().cloned().collect())
            .unwrap_or_default();
        for (from, to, origin, why) in fresh {
            if invoked >= from && completed <= to && !self.spawned_between(dc, origin, completed) {
                self.stale.required_fresh += 1;
                self.bump_check(Invariant::Staleness);
                if stale {
                    problems.push(format!("{what} says {peer}'s copies are stale, but {why}"));
                }
            }
        }
        let pair = self.stale.pairs.entry((dc.to_owned(), peer.to_owned())).or_default();
        pair.reads.push_back(Read { invoked, completed, stale, what: what.clone(), judged_static: false });
        while pair.reads.front().is_some_and(|r| r.completed + READS_KEPT_MS < completed) {
            pair.reads.pop_front();
        }
        for why in problems {
            self.stale_violation(dc, peer, completed, why);
        }
    }

    fn stale_violation(&mut self, dc: &str, peer: &str, at: Ms, why: String) {
        let pair = self.stale.pairs.entry((dc.to_owned(), peer.to_owned())).or_default();
        pair.reported += 1;
        if pair.reported > REPORTED_PER_PAIR_MAX {
            // Counted, not detailed.
            let e = self.violations.entry(Invariant::Staleness).or_insert((0, Vec::new()));
            e.0 += 1;
            return;
        }
        self.violate(Invariant::Staleness, at, Some(dc), None, why, Vec::new());
    }

    pub(super) fn judge_status_staleness(&mut self, o: &StatusObservation, s: &StatusView) {
        let Some(sa) = self.cfg.stale_after_ms else { return };
        let dc = o.dc.clone();
        for (peer, link) in &s.peers {
            let sample = Sample {
                invoked: o.invoked,
                completed: o.completed,
                mark: s.applied.get(peer).copied(),
                origin: link.origin,
            };
            let what = format!("{}..{}ms {dc} status", o.invoked, o.completed);
            self.stale_read(&dc, peer, o.invoked, o.completed, link.stale, what);
            let pair = self.stale.pairs.entry((dc.clone(), peer.clone())).or_default();
            let prev = pair.prev.replace(sample);
            // Progress seen: the mark rose between the previous sample and this one.
            if let (Some(b), Some(m)) = (prev, sample.mark) {
                if b.mark.is_some_and(|bm| bm.epoch == m.epoch && bm.seq < m.seq) {
                    let to = (b.invoked + sa).saturating_sub(FRESH_TOLERANCE_MS);
                    let from = o.completed + FRESH_TOLERANCE_MS;
                    if from <= to {
                        pair.fresh.push_back((
                            from,
                            to,
                            b.invoked,
                            format!(
                                "its applied mark of {peer} rose to {m} between {}ms and {}ms",
                                b.invoked, o.completed
                            ),
                        ));
                        if pair.fresh.len() > 8 {
                            pair.fresh.pop_front();
                        }
                    }
                }
            }
            // No progress made: the same mark while the peer is known to be ahead.
            let same_run = pair.run_start.is_some_and(|j| j.mark == sample.mark);
            if !same_run {
                let behind =
                    sample.mark.is_some_and(|m| m.epoch == link.origin.epoch && link.origin.seq > m.seq);
                pair.run_start = behind.then_some(sample);
                continue;
            }
            let Some(j) = pair.run_start else { continue };
            let (from, to) = (j.completed + sa + STALE_TOLERANCE_MS, o.invoked);
            if self.spawned_between(&dc, j.invoked, o.completed) {
                continue;
            }
            let mut problems = Vec::new();
            let mut judged = 0;
            if let Some(pair) = self.stale.pairs.get_mut(&(dc.clone(), peer.clone())) {
                for r in pair
                    .reads
                    .iter_mut()
                    .filter(|r| !r.judged_static && r.invoked >= from && r.completed <= to)
                {
                    r.judged_static = true;
                    judged += 1;
                    if !r.stale {
                        problems.push(format!(
                            "{} says {peer}'s copies are fresh, but its applied mark of {peer} stayed at {} from {}ms to {}ms while {peer} was known to be at {} (no batch applied, no ping could find it caught up)",
                            r.what,
                            j.mark.unwrap_or_default(),
                            j.invoked,
                            o.completed,
                            j.origin
                        ));
                    }
                }
            }
            self.stale.required_stale += judged;
            for _ in 0..judged {
                self.bump_check(Invariant::Staleness);
            }
            for why in problems {
                self.stale_violation(&dc, peer, o.completed, why);
            }
        }
    }

    pub(super) fn judge_view_staleness(&mut self, o: &ViewObservation, shown: &[ObservedInstance]) {
        if self.cfg.stale_after_ms.is_none() {
            return;
        }
        let mut by_owner: BTreeMap<&str, Option<bool>> = BTreeMap::new();
        for i in shown.iter().filter(|i| i.owner_dc != o.dc) {
            let e = by_owner.entry(&i.owner_dc).or_insert(Some(i.stale));
            if *e != Some(i.stale) {
                // Mixed flags within one answer: the flag changed while it was built.
                *e = None;
            }
        }
        for (owner, flag) in by_owner {
            if let Some(stale) = flag {
                let what = format!("{}..{}ms {} view of {}", o.invoked, o.completed, o.dc, o.service);
                self.stale_read(&o.dc, owner, o.invoked, o.completed, stale, what);
            }
        }
    }
}
