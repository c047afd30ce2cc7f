//! Status observations (`GET /v1/status`): the DC's own log position and its applied marks
//! (watermarks) of every other origin: monotonicity, tombstones and epochs passed, and the
//! catch-up of each recovery.

use std::collections::BTreeMap;
use std::fmt;

use super::{Checker, InstanceRef, Invariant, Ms, Timed};

/// An origin position: (epoch, seq).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Mark {
    pub epoch: u64,
    pub seq: u64,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}:{}", self.epoch, self.seq)
    }
}

/// The parts of `/v1/status` the invariants use.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StatusView {
    /// The DC's own log: epoch and last seq.
    pub log: Mark,
    /// Applied high-water mark per remote origin.
    pub applied: BTreeMap<String, Mark>,
    /// The inbound link of each peer (`peers.*.inbound`).
    pub peers: BTreeMap<String, PeerLinkView>,
    /// `self_preservation.active`: lease expiry is paused in some namespace.
    pub preservation_active: Option<bool>,
}

/// A peer's inbound link as `/v1/status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerLinkView {
    /// The peer's copies are stale (no progress for `stale_after_ms`).
    pub stale: bool,
    /// The peer's epoch and last seq, as it last said.
    pub origin: Mark,
}

#[derive(Clone, Debug)]
pub struct StatusObservation {
    pub dc: String,
    pub invoked: Ms,
    pub completed: Ms,
    pub result: Result<StatusView, String>,
}

impl Checker {
    pub fn observe_status(&mut self, obs: StatusObservation) {
        if let Ok(StatusView { preservation_active: Some(active), .. }) = &obs.result {
            self.preservation_sample(&obs.dc, obs.invoked, obs.completed, *active);
        }
        self.push(Timed::Status(obs));
    }

    pub(super) fn judge_status(&mut self, o: StatusObservation) {
        let dc = o.dc.clone();
        let Some(st) = self.dcs.get_mut(&dc) else { return };
        let s = match &o.result {
            Ok(s) => s.clone(),
            Err(_) => {
                st.status_failed += 1;
                return;
            }
        };
        self.statuses_judged += 1;
        st.latest_status = Some((o.invoked, s.clone()));
        self.judge_status_staleness(&o, &s);
        let Some(st) = self.dcs.get_mut(&dc) else { return };
        let tag = format!("{}..{}ms {} status", o.invoked, o.completed, dc);
        // A read that either side of a loss of history may have answered sets no baseline.
        let baseline = !st.history_in_doubt(o.invoked);
        let mut problems: Vec<(String, Vec<String>)> = Vec::new();

        // Own log.
        if let Some((pt, prev)) = st.log {
            if pt <= o.invoked {
                if prev.epoch == s.log.epoch && s.log.seq < prev.seq {
                    problems.push((
                        format!("own log went back from {prev} to {}", s.log),
                        vec![format!("{pt}ms: log {prev}"), format!("{tag}: log {}", s.log)],
                    ));
                }
                // A move to a newer settled epoch is the DC's own doing, carrying its state (a
                // new data dir's first ordered epoch, a history that went back:
                // docs/replication.md, "Epochs"); a silent loss of the log shows a
                // provisional epoch instead.
                let ordered_move = settled_epoch(s.log.epoch) && s.log.epoch > prev.epoch;
                if prev.epoch != s.log.epoch
                    && !ordered_move
                    && st.history_lost_between(pt, o.completed).is_none()
                {
                    problems.push((
                        format!(
                            "own origin epoch changed from {:x} to {:x} without a declared history loss (the DC lost its log?)",
                            prev.epoch, s.log.epoch
                        ),
                        vec![format!("{pt}ms: log {prev}"), format!("{tag}: log {}", s.log)],
                    ));
                }
            }
        }
        if baseline {
            st.log = Some((o.completed, s.log));
            // Each history since the last loss (the 0 marker) lists its epochs once: a
            // provisional epoch reused by the history after a loss is that history's.
            let since_loss = st.epochs.iter().rposition(|e| *e == 0).map_or(0, |p| p + 1);
            if !st.epochs[since_loss..].contains(&s.log.epoch) {
                st.epochs.push(s.log.epoch);
            }
        }
        // Applied marks.
        for (origin, m) in &s.applied {
            if let Some(&(pt, prev)) = st.applied.get(origin) {
                if pt <= o.invoked && prev.epoch == m.epoch && m.seq < prev.seq {
                    problems.push((
                        format!("applied mark of {origin} went back from {prev} to {m}"),
                        vec![
                            format!("{pt}ms: applied[{origin}] {prev}"),
                            format!("{tag}: applied[{origin}] {m}"),
                        ],
                    ));
                }
            }
            if baseline {
                st.applied.insert(origin.clone(), (o.completed, *m));
            }
        }
        self.bump_check(Invariant::MonotonicApply);
        for (why, obs) in problems {
            self.violate(Invariant::MonotonicApply, o.completed, Some(&dc), None, why, obs);
        }

        // Tombstones passed and epochs moved: what this DC must no longer show.
        let mut marks: Vec<(String, Mark)> = s.applied.iter().map(|(k, v)| (k.clone(), *v)).collect();
        marks.push((dc.clone(), s.log));
        for (origin, m) in marks {
            let ambiguous = self.dcs.get(&origin).is_some_and(|s| s.rewound_epochs.contains(&m.epoch));
            if let Some(tombs) = self.tombstones.get(&origin).filter(|_| !ambiguous) {
                let hit: Vec<InstanceRef> =
                    tombs.range((m.epoch, 0)..=(m.epoch, m.seq)).map(|(_, r)| r.clone()).collect();
                // A deregistration acknowledged after the origin lost or rewound its history
                // (after this status) is of another history, even in the same epoch.
                let lost: Vec<Ms> = self.dcs.get(&origin).map(|s| s.history_lost.clone()).unwrap_or_default();
                for r in hit {
                    let acked = self.insts.get(&r).and_then(|i| i.dereg_acked).map(|(a, _)| a);
                    if acked.is_some_and(|a| lost.iter().any(|h| *h > o.completed && *h <= a)) {
                        continue;
                    }
                    if let Some(d) = self.insts.get_mut(&r).map(|i| i.dc(&dc)) {
                        if d.tomb_passed.is_none() {
                            let what = if origin == dc {
                                "own log".to_owned()
                            } else {
                                format!("applied mark of {origin}")
                            };
                            d.tomb_passed = Some((
                                o.completed,
                                format!("{dc}'s {what} reached {m}, past the acknowledged deregistration"),
                            ));
                        }
                    }
                }
            }
            if origin != dc {
                // Instances of `origin` from an epoch older than the mark's must be gone here.
                let epochs = self.dcs.get(&origin).map(|s| s.epochs.clone()).unwrap_or_default();
                let Some(mark_pos) = epochs.iter().position(|e| *e == m.epoch) else { continue };
                if mark_pos == 0 {
                    // The origin's first epoch: nothing older to be gone.
                    continue;
                }
                for inst in self.insts.values_mut() {
                    if inst.owner != origin {
                        continue;
                    }
                    let Some(pos) = inst.epoch.map(|e| epoch_position(&epochs, inst.history, e)) else {
                        continue;
                    };
                    // Only a history restarted from nothing (a provisional epoch in between)
                    // drops the older epoch's instances; a move to a newer epoch that
                    // carries the state (a provisional epoch settling) keeps them.
                    if pos < mark_pos && epochs[pos + 1..=mark_pos].iter().any(|e| !settled_epoch(*e)) {
                        let d = inst.dc(&dc);
                        if d.epoch_moved.is_none() {
                            d.epoch_moved = Some((
                                o.completed,
                                format!(
                                    "{dc}'s applied mark of {origin} moved to the newer epoch {:x}",
                                    m.epoch
                                ),
                            ));
                        }
                    }
                }
            }
        }

        // Recoveries.
        let budget = self.cfg.recovery_budget_ms;
        let _ = budget;
        let dcs = self.cfg.dcs.clone();
        for r in &mut self.recoveries {
            if r.interrupted.is_some() || o.invoked < r.at {
                continue;
            }
            for p in &dcs {
                if p == &dc {
                    continue;
                }
                // This DC is the target provider for pairs (d, dc).
                if let Some(ps) = r.pairs.get_mut(&(p.clone(), dc.clone())) {
                    if ps.target.is_none() {
                        ps.target = Some((o.invoked, s.log));
                    }
                }
                // And the follower for pairs (dc, p).
                if let Some(ps) = r.pairs.get_mut(&(dc.clone(), p.clone())) {
                    if let (Some((tt, target)), None) = (ps.target, ps.done) {
                        if o.invoked >= tt {
                            if let Some(m) = s.applied.get(p) {
                                // Or past it in a newer settled epoch: the provider took one
                                // carrying its state (a new data dir settling at the heal).
                                let newer = settled_epoch(m.epoch) && m.epoch > target.epoch;
                                if (m.epoch == target.epoch || newer) && m.seq >= target.seq {
                                    ps.done = Some(o.completed);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A deregistration of `r` at (epoch, version) was acknowledged: every DC whose mark
    /// already passed it must no longer show `r`.
    pub(super) fn tombstone_known(&mut self, r: &InstanceRef, epoch: u64, version: u64) {
        let Some(owner) = self.insts.get(r).map(|i| i.owner.clone()) else { return };
        // A mark seen before the owner lost or rewound its history names events of that
        // other history, even in the same epoch (a restored copy reuses its seqs until it
        // moves to a new epoch).
        let lost: Vec<Ms> = self.dcs.get(&owner).map(|s| s.history_lost.clone()).unwrap_or_default();
        if self.dcs.get(&owner).is_some_and(|s| s.rewound_epochs.contains(&epoch)) {
            return;
        }
        let mut passed: Vec<(String, Ms, Mark)> = Vec::new();
        for (dc, st) in &self.dcs {
            let m = if dc == &owner { st.log } else { st.applied.get(&owner).copied() };
            if let Some((t, m)) = m {
                if lost.iter().any(|h| *h > t) {
                    continue;
                }
                if m.epoch == epoch && m.seq >= version {
                    passed.push((dc.clone(), t, m));
                }
            }
        }
        for (dc, t, m) in passed {
            if let Some(d) = self.insts.get_mut(r).map(|i| i.dc(&dc)) {
                if d.tomb_passed.is_none() {
                    d.tomb_passed = Some((
                        t,
                        format!("{dc}'s mark of {owner} reached {m}, past the acknowledged deregistration"),
                    ));
                }
            }
        }
    }
}

/// An epoch of generation >= 1 (docs/replication.md, "Epochs"): one a DC took knowing its
/// peers' epochs; generation 0 is a new data dir's provisional epoch.
/// Where epoch `e` of the owner's `history`-th history (after that many losses, each a 0
/// in `epochs`) stands in `epochs`: a provisional epoch number comes back after each loss,
/// and an instance is of the history that acknowledged it. Not listed (no status showed
/// it): the end of that history's epochs.
fn epoch_position(epochs: &[u64], history: usize, e: u64) -> usize {
    let start = match history {
        0 => 0,
        h => epochs
            .iter()
            .enumerate()
            .filter(|(_, x)| **x == 0)
            .nth(h - 1)
            .map_or(epochs.len(), |(i, _)| i + 1),
    };
    let end =
        epochs[start.min(epochs.len())..].iter().position(|x| *x == 0).map_or(epochs.len(), |p| start + p);
    epochs[start.min(end)..end].iter().position(|x| *x == e).map_or(end.saturating_sub(1), |p| start + p)
}

fn settled_epoch(epoch: u64) -> bool {
    epoch >> 20 != 0
}
