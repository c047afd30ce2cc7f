//! What the checker remembers: per instance (its operations, lease and per-DC sightings) and
//! per DC (process events, marks, latest views), and the lease-expiry arithmetic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Mark, Ms, OpId, ProcessEvent, ServiceView, StatusView};

const NOTES_PER_DC_MAX: usize = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    Unseen,
    Present,
    /// Observed present, then absent.
    Gone,
}

#[derive(Debug)]
pub(super) struct DcInst {
    pub(super) seen: Seen,
    pub(super) last_seq: Option<(Ms, u64)>,
    /// When this DC's mark (or own log) was observed past the acked tombstone.
    pub(super) tomb_passed: Option<(Ms, String)>,
    /// When this DC's mark of the owner was observed in another epoch than the instance's.
    pub(super) epoch_moved: Option<(Ms, String)>,
    pub(super) notes: Vec<String>,
}

impl DcInst {
    pub(super) fn new() -> DcInst {
        DcInst { seen: Seen::Unseen, last_seq: None, tomb_passed: None, epoch_moved: None, notes: Vec::new() }
    }
    pub(super) fn note(&mut self, s: String) {
        if self.notes.len() < NOTES_PER_DC_MAX {
            self.notes.push(s);
        } else {
            // Keep the first notes (how it appeared) and the latest one.
            self.notes[NOTES_PER_DC_MAX - 1] = s;
        }
    }
}

#[derive(Debug)]
pub(super) struct Inst {
    pub(super) owner: String,
    pub(super) persistent: bool,
    pub(super) ttl_ms: u64,
    pub(super) epoch: Option<u64>,
    /// Which history of its owner acknowledged it: the owner's losses of history before
    /// (a provisional epoch number comes back after each loss).
    pub(super) history: usize,
    pub(super) reg_invoked: Ms,
    pub(super) reg_acked: Option<Ms>,
    pub(super) reg_failed: bool,
    /// Non-heartbeat operations and notable heartbeats, in invocation order.
    pub(super) ops: Vec<OpId>,
    pub(super) removal_invoked: Option<Ms>,
    pub(super) dereg_acked: Option<(Ms, u64)>,
    pub(super) stop_hb: Option<Ms>,
    /// A heartbeat was answered 404: (invoked, completed).
    pub(super) forgotten: Option<(Ms, Ms)>,
    /// Invocation time of the latest acknowledged renewal (the registration counts).
    pub(super) last_renewal: Option<Ms>,
    /// Earliest time at which the server may have expired the lease.
    pub(super) expiry_possible_from: Option<Ms>,
    /// Latest acked status: (invoked, status). Registration sets "up".
    pub(super) status_acked: Option<(Ms, String)>,
    pub(super) status_unknown: Vec<String>,
    pub(super) per_dc: BTreeMap<String, DcInst>,
    /// Renewals and quiet periods, for lease-health.
    pub(super) life: super::health::Life,
    /// Its owner's data dir was restored to an older copy at this time: its state since the
    /// copy is legitimately undone, so it is no longer judged on its own.
    pub(super) rewound: Option<Ms>,
}

impl Inst {
    pub(super) fn dc(&mut self, dc: &str) -> &mut DcInst {
        self.per_dc.entry(dc.to_owned()).or_insert_with(DcInst::new)
    }
}

#[derive(Debug, Default)]
pub(super) struct DcState {
    /// Process events in time order.
    pub(super) events: Vec<(Ms, ProcessEvent)>,
    pub(super) index: HashMap<String, (Ms, u64)>,
    pub(super) log: Option<(Ms, Mark)>,
    pub(super) applied: BTreeMap<String, (Ms, Mark)>,
    /// Ids currently believed present here, per service.
    pub(super) present: HashMap<String, BTreeSet<String>>,
    /// Latest successful `All` view per service, and latest successful status.
    pub(super) latest_views: BTreeMap<String, (Ms, ServiceView)>,
    pub(super) latest_status: Option<(Ms, StatusView)>,
    pub(super) history_lost: Vec<Ms>,
    /// The DC's own epochs, in the order first observed.
    pub(super) epochs: Vec<u64>,
    /// Epochs the DC was in when an older copy of its data dir was restored: a seq of such
    /// an epoch may name an event of either history (the restored copy reuses seqs until it
    /// moves to a new epoch), so its tombstones are not matched against marks.
    pub(super) rewound_epochs: Vec<u64>,
    pub(super) polls_ok: u64,
    pub(super) polls_failed_excused: u64,
    pub(super) polls_failed: u64,
    pub(super) status_failed: u64,
}

impl DcState {
    /// Down (killed or paused, plus grace after coming back) at some point in [from, to]?
    pub(super) fn down_during(&self, from: Ms, to: Ms, grace: Ms) -> bool {
        let mut down_since: Option<Ms> = None;
        for &(at, ev) in &self.events {
            match ev {
                ProcessEvent::Killed
                | ProcessEvent::Paused
                | ProcessEvent::HistoryLost
                | ProcessEvent::HistoryRewound => {
                    down_since.get_or_insert(at);
                }
                ProcessEvent::Ready | ProcessEvent::Resumed => {
                    if let Some(s) = down_since.take() {
                        if s <= to && at + grace >= from {
                            return true;
                        }
                    }
                }
                ProcessEvent::Spawned | ProcessEvent::LeaderLost | ProcessEvent::LeaderServing => {}
            }
        }
        matches!(down_since, Some(s) if s <= to)
    }

    /// Without a serving leader (from `LeaderLost` until `LeaderServing`, plus grace after
    /// it) at some point in [from, to]? The DC answers then, but checks no lease.
    pub(super) fn leaderless_during(&self, from: Ms, to: Ms, grace: Ms) -> bool {
        let mut since: Option<Ms> = None;
        for &(at, ev) in &self.events {
            match ev {
                ProcessEvent::LeaderLost => {
                    since.get_or_insert(at);
                }
                ProcessEvent::LeaderServing => {
                    if let Some(s) = since.take() {
                        if s <= to && at + grace >= from {
                            return true;
                        }
                    }
                }
                _ => {}
            }
        }
        matches!(since, Some(s) if s <= to)
    }

    /// Intervals in which the process was dead (killed until spawned again) or the group
    /// had no serving leader (a lease's TTL starts over after either), as (start, end or
    /// None while it lasts).
    pub(super) fn dead_windows(&self) -> Vec<(Ms, Option<Ms>)> {
        let mut out = Vec::new();
        let mut dead: Option<Ms> = None;
        for &(at, ev) in &self.events {
            match ev {
                ProcessEvent::Killed | ProcessEvent::LeaderLost => {
                    dead.get_or_insert(at);
                }
                ProcessEvent::Spawned | ProcessEvent::LeaderServing => {
                    if let Some(k) = dead.take() {
                        out.push((k, Some(at)));
                    }
                }
                ProcessEvent::Ready
                | ProcessEvent::Paused
                | ProcessEvent::Resumed
                | ProcessEvent::HistoryLost
                | ProcessEvent::HistoryRewound => {}
            }
        }
        if let Some(k) = dead {
            out.push((k, None));
        }
        out
    }

    pub(super) fn history_lost_between(&self, from: Ms, to: Ms) -> Option<Ms> {
        self.history_lost.iter().copied().find(|t| *t > from && *t <= to)
    }

    /// A read invoked at `invoked` may have been answered by the process before a loss of
    /// the DC's history or by the one after it: the loss was declared at or before the read
    /// (as its step started, before the kill landed) and the DC was not ready again in an
    /// earlier millisecond. Such a read is no baseline for the reads after it.
    pub(super) fn history_in_doubt(&self, invoked: Ms) -> bool {
        self.history_lost.iter().any(|&h| {
            h <= invoked
                && !self.events.iter().any(|&(at, ev)| ev == ProcessEvent::Ready && at >= h && at < invoked)
        })
    }

    /// A loss of the DC's history after `from` that a read invoked at `read` followed: the
    /// DC was ready again after the loss before the read was invoked (in an earlier
    /// millisecond). A loss is declared as its step starts, before the kill lands, and an
    /// answered read invoked before the DC was ready again was answered by the process
    /// that still held the old history.
    pub(super) fn history_lost_before_read(&self, from: Ms, read: Ms) -> Option<Ms> {
        self.history_lost.iter().copied().find(|&h| {
            h > from && self.events.iter().any(|&(at, ev)| ev == ProcessEvent::Ready && at >= h && at < read)
        })
    }
}

/// Earliest time within [from, to] at which a lease renewed at `from` may have expired,
/// given the owner's dead windows (a dead process expires nothing, and a restart renews
/// every lease).
pub(super) fn expiry_within(dead: &[(Ms, Option<Ms>)], from: Ms, to: Ms, ttl: Ms) -> Option<Ms> {
    let mut start = from;
    for &(k, s) in dead {
        let s_end = s.unwrap_or(Ms::MAX);
        if s_end <= start || k >= to {
            continue;
        }
        // Segment [start, k) ran before the kill.
        if k > start && k - start >= ttl {
            return Some(start + ttl);
        }
        start = start.max(s_end);
        if start >= to {
            return None;
        }
    }
    (to > start && to - start >= ttl).then_some(start + ttl)
}
