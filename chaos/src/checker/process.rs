//! Process events of each DC (kill, spawn, ready, pause, resume, declared history loss, a
//! group's leader lost and another serving),
//! fault starts and recovery points, and the per-recovery catch-up state.

use std::collections::BTreeMap;

use super::state::Seen;
use super::{Checker, Mark, Ms, Timed};

/// What happened to a DC's process (or its disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEvent {
    /// The process was started (its leases are fresh from about now).
    Spawned,
    /// It answers its API.
    Ready,
    /// Killed (SIGKILL): down until the next `Ready`.
    Killed,
    /// Stopped (SIGSTOP): unresponsive until `Resumed`.
    Paused,
    Resumed,
    /// Its data dir was lost: its own history before now is legitimately gone, and it
    /// will take a new origin epoch.
    HistoryLost,
    /// An older copy of its data dir was restored: its history since that copy is
    /// legitimately gone (a deregistration may be undone, a registration lost), and its
    /// instances from before now are no longer judged one by one; the DCs must still
    /// converge.
    HistoryRewound,
    /// The leader of the DC's group was killed: the DC keeps answering (its other members
    /// serve reads), but nothing checks its leases and it takes no writes until
    /// `LeaderServing`.
    LeaderLost,
    /// Another member leads and serves writes (told once the drill saw it, so no earlier
    /// than the take-over): every lease starts over from its published health with a full
    /// TTL, as after a restart, and the DC's replication links start over.
    LeaderServing,
}

#[derive(Debug)]
pub(super) struct PairState {
    pub(super) target: Option<(Ms, Mark)>,
    pub(super) done: Option<Ms>,
}

#[derive(Debug)]
pub(super) struct Recovery {
    pub(super) label: String,
    pub(super) at: Ms,
    pub(super) pairs: BTreeMap<(String, String), PairState>,
    pub(super) interrupted: Option<Ms>,
}

impl Recovery {
    pub(super) fn done_at(&self) -> Option<Ms> {
        let mut max = self.at;
        for p in self.pairs.values() {
            max = max.max(p.done?);
        }
        Some(max)
    }
}

impl Checker {
    /// A process event of `dc`.
    pub fn process(&mut self, dc: &str, at: Ms, ev: ProcessEvent) {
        let st = self.dcs.entry(dc.to_owned()).or_default();
        st.events.push((at, ev));
        st.events.sort_by_key(|(t, _)| *t);
        if matches!(ev, ProcessEvent::HistoryLost | ProcessEvent::HistoryRewound) {
            st.history_lost.push(at);
            st.history_lost.sort_unstable();
        }
        self.push(Timed::Process { dc: dc.to_owned(), at, ev });
    }

    /// A fault starts (ends a pending recovery's budget).
    pub fn fault_started(&mut self, at: Ms) {
        self.push(Timed::FaultStart { at });
    }

    /// The clients of `dc` read another member of its group from `at` on: the watch index
    /// they see starts over there.
    pub fn client_moved(&mut self, dc: &str, at: Ms) {
        self.push(Timed::ClientMoved { dc: dc.to_owned(), at });
    }

    /// A recovery point: a heal, a restart, a resume.
    pub fn recovery_point(&mut self, at: Ms, label: &str) {
        self.push(Timed::Recovery { at, label: label.to_owned() });
    }

    pub(super) fn judge_process(&mut self, dc: &str, at: Ms, ev: ProcessEvent) {
        if !matches!(ev, ProcessEvent::HistoryLost | ProcessEvent::HistoryRewound) {
            return;
        }
        // The DC starts from nothing (or from an older copy): its baselines and its view of
        // every instance restart.
        if let Some(st) = self.dcs.get_mut(dc) {
            if ev == ProcessEvent::HistoryRewound {
                if let Some((_, m)) = st.log {
                    st.rewound_epochs.push(m.epoch);
                }
            }
            st.index.clear();
            st.log = None;
            st.applied.clear();
            st.present.clear();
            if ev == ProcessEvent::HistoryLost {
                // A history restarted from nothing: instances of its earlier epochs must go
                // at the peers once they follow a later one (a provisional epoch in between,
                // whether or not a status ever showed it).
                st.epochs.push(0);
            }
        }
        if ev == ProcessEvent::HistoryRewound {
            for inst in self.insts.values_mut() {
                if inst.owner == dc && inst.reg_invoked < at && inst.rewound.is_none() {
                    inst.rewound = Some(at);
                    self.rewound_excused += 1;
                }
            }
        }
        for inst in self.insts.values_mut() {
            if let Some(d) = inst.per_dc.get_mut(dc) {
                d.seen = Seen::Unseen;
                d.last_seq = None;
                d.tomb_passed = None;
                d.epoch_moved = None;
                d.note(format!("{at}ms: {dc} lost its history (declared)"));
            }
        }
    }
}
