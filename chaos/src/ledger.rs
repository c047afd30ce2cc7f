//! The fault ledger: which faults a drill's plan has in force, step by step (pure).
//!
//! A drill applies its plan's [`Action`]s in order. For every step the ledger answers what
//! the drill must do around it, without I/O or a clock (times come in as arguments):
//! - whether the step starts a fault while none is in force, which ends the recovery budget
//!   of the previous recovery point ([`FaultLedger::breaks_quiet`]);
//! - what the checker must be told about the DCs' processes before and after the step
//!   ([`FaultLedger::process_events`]);
//! - the step's label for the progress lines and the recovery points ([`FaultLedger::label`]);
//! - whether the step ended a fault and whether none is left in force afterwards, which is
//!   a recovery point ([`FaultLedger::record`], [`StepEffect`]);
//! - the faults still in force, which must be healed ([`FaultLedger::active`]), and the
//!   fault windows of the report ([`FaultLedger::windows`]).
//!
//! Sides: 0 is the first DC ("a"), 1 the second ("b"), as in [`crate::plan`].

use crate::checker::{Ms, ProcessEvent};
use crate::plan::{Action, Planned, Stop};
use crate::report::FaultWindow;

/// A kind of fault; at most one window of each kind is open at a time, except that a
/// process may be killed or paused again while down (each opens its own window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A partition of the replication link (either or both directions).
    Cut,
    /// Packet faults on the replication link (loss, delay, duplication, reordering).
    Packets,
    /// The process of this side is down: killed (until its restart) or paused (until its
    /// resume).
    Down(usize),
    /// An old process of this side runs next to its replacement (until it is killed).
    Split(usize),
    /// The leader of this side's group was killed or cut off from the group (until the
    /// member is back).
    Leader(usize),
    /// A follower of this side's group was cut off from the group (until it rejoined).
    Member(usize),
}

/// What the checker must be told about the DCs' processes for one step: (side, event).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvents {
    /// At the step's start, before the action is applied.
    pub before: Vec<(usize, ProcessEvent)>,
    /// Once the action is done (the process answers again).
    pub after: Vec<(usize, ProcessEvent)>,
}

/// What a step did to the faults in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEffect {
    /// It started a fault (a cut or packet faults replace the ones in force).
    Started,
    /// It ended a fault (heal, clear packets, restart, resume). `quiet`: no fault is left in
    /// force, so this step is a recovery point.
    Ended { quiet: bool },
    /// It was done inside a fault and changed none (a data dir copied while its DC is down).
    Within,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct OpenFault {
    kind: FaultKind,
    label: String,
    start_ms: Ms,
}

/// The faults in force and the fault windows so far. Feed it every step of a plan, in
/// order, with [`FaultLedger::record`].
#[derive(Clone, Debug)]
pub struct FaultLedger {
    names: [String; 2],
    open: Vec<OpenFault>,
    closed: Vec<FaultWindow>,
    cut: bool,
    packets: bool,
    down: [bool; 2],
    split: [bool; 2],
    /// A member of the side's group is out (killed or cut off).
    member_out: [bool; 2],
}

impl FaultLedger {
    /// An empty ledger for the DCs named `names` (side 0, side 1).
    pub fn new(names: [String; 2]) -> FaultLedger {
        FaultLedger {
            names,
            open: Vec::new(),
            closed: Vec::new(),
            cut: false,
            packets: false,
            down: [false; 2],
            split: [false; 2],
            member_out: [false; 2],
        }
    }

    /// A ledger that has recorded every step of `steps`, each done at its planned time.
    pub fn replay(names: [String; 2], steps: &[Planned]) -> FaultLedger {
        let mut ledger = FaultLedger::new(names);
        for step in steps {
            ledger.record(step.action, step.at_ms, step.at_ms);
        }
        ledger
    }

    /// No fault in force: no cut, no packet faults, every process up.
    pub fn is_quiet(&self) -> bool {
        !self.cut
            && !self.packets
            && self.down == [false; 2]
            && self.split == [false; 2]
            && self.member_out == [false; 2]
    }

    /// The faults in force (which must be healed), in the order they started.
    pub fn active(&self) -> Vec<FaultKind> {
        self.open.iter().map(|o| o.kind).collect()
    }

    /// `action` starts a fault while none is in force: the previous recovery's budget ends.
    pub fn breaks_quiet(&self, action: Action) -> bool {
        action.starts_fault() && self.is_quiet()
    }

    /// What the checker must hear about processes when `action` is applied (only when the
    /// drill controls the processes: otherwise nothing happened to them).
    pub fn process_events(action: Action) -> ProcessEvents {
        let mut events = ProcessEvents::default();
        match action {
            Action::Kill { side, wipe } => {
                events.before.push((side, ProcessEvent::Killed));
                if wipe {
                    events.before.push((side, ProcessEvent::HistoryLost));
                }
            }
            Action::Restart { side } => {
                events.before.push((side, ProcessEvent::Spawned));
                events.after.push((side, ProcessEvent::Ready));
            }
            Action::Pause { side } => events.before.push((side, ProcessEvent::Paused)),
            Action::Resume { side } => events.after.push((side, ProcessEvent::Resumed)),
            // The DC is down; the history after its save is gone once it is copied back.
            Action::Restore { side } => events.after.push((side, ProcessEvent::HistoryRewound)),
            // The replacement starts from nothing and answers for the DC once it is ready;
            // the old process is out of the clients' sight from then on.
            Action::Split { side } => events.after.extend([
                (side, ProcessEvent::HistoryLost),
                (side, ProcessEvent::Spawned),
                (side, ProcessEvent::Ready),
            ]),
            // The DC keeps answering; its writes and lease checks stop until another member
            // serves (the step is done then), which starts every lease over.
            Action::KillLeader { side }
            | Action::IsolateMember { side, leader: true }
            | Action::StopMember { side, leader: true, .. } => {
                events.before.push((side, ProcessEvent::LeaderLost));
                events.after.push((side, ProcessEvent::LeaderServing));
            }
            // The clients move off the follower first; its group keeps its leader.
            Action::IsolateMember { leader: false, .. }
            | Action::RejoinMember { .. }
            | Action::StopMember { leader: false, .. }
            | Action::StartMember { .. } => {}
            Action::RestartMember { .. }
            | Action::Save { .. }
            | Action::Backup { .. }
            | Action::EndSplit { .. }
            | Action::Cut(_)
            | Action::Heal
            | Action::Packets(_)
            | Action::ClearPackets => {}
        }
        events
    }

    /// The step's label, for progress lines and recovery points.
    pub fn label(&self, action: Action) -> String {
        let [a, b] = &self.names;
        match action {
            Action::Cut(c) => format!("partition {}", c.label(a, b)),
            Action::Heal => "heal".into(),
            Action::Packets(p) => format!("packets: {p}"),
            Action::ClearPackets => "packets cleared".into(),
            Action::Kill { side, wipe: false } => format!("kill -9 {}", self.names[side]),
            Action::Kill { side, wipe: true } => {
                format!("kill -9 {} and wipe its data dir", self.names[side])
            }
            Action::Restart { side } => format!("restart {} (ready)", self.names[side]),
            Action::Pause { side } => format!("SIGSTOP {}", self.names[side]),
            Action::Resume { side } => format!("SIGCONT {}", self.names[side]),
            Action::Save { side } => format!("copy {}'s data dir aside", self.names[side]),
            Action::Restore { side } => format!("restore {}'s older data dir (or backup)", self.names[side]),
            Action::Backup { side } => {
                format!("back {} up from its leader (tandem backup)", self.names[side])
            }
            Action::Split { side } => {
                format!(
                    "start a replacement of {} on an empty data dir; the old process keeps running",
                    self.names[side]
                )
            }
            Action::EndSplit { side } => format!("kill the old process of {}", self.names[side]),
            Action::KillLeader { side } => format!("kill -9 the leader of {}", self.names[side]),
            Action::RestartMember { side } => {
                format!("restart {}'s killed member (follower)", self.names[side])
            }
            Action::IsolateMember { side, leader } => format!(
                "cut {}'s {} off from its group",
                self.names[side],
                if leader { "leader" } else { "follower" }
            ),
            Action::RejoinMember { side } => {
                format!("join {}'s cut-off member to its group", self.names[side])
            }
            Action::StopMember { side, leader, how } => format!(
                "{} {}'s {}",
                match how {
                    Stop::Upgrade => "stop (SIGTERM) for an upgrade",
                    Stop::DiskLoss => "kill -9 + disk loss of",
                    Stop::Replace => "lose the machine of (then replace under a new id)",
                },
                self.names[side],
                if leader { "leader" } else { "next follower" }
            ),
            Action::StartMember { side } => {
                format!("start {}'s stopped member (caught up)", self.names[side])
            }
        }
    }

    /// Records `action`, applied from `started` until `done`. Link faults open and close
    /// their windows at `started`; a process is back (its window closes) at `done`.
    pub fn record(&mut self, action: Action, started: Ms, done: Ms) -> StepEffect {
        let [a, b] = &self.names;
        match action {
            Action::Cut(c) => {
                let label = format!("partition {}", c.label(a, b));
                self.close(FaultKind::Cut, started);
                self.open(FaultKind::Cut, label, started);
                self.cut = true;
            }
            Action::Heal => {
                self.close(FaultKind::Cut, started);
                self.cut = false;
            }
            Action::Packets(p) => {
                self.close(FaultKind::Packets, started);
                self.open(FaultKind::Packets, format!("packets: {p}"), started);
                self.packets = true;
            }
            Action::ClearPackets => {
                self.close(FaultKind::Packets, started);
                self.packets = false;
            }
            Action::Kill { side, wipe } => {
                let what = if wipe { "kill -9 + disk loss" } else { "kill -9" };
                let label = format!("{what} {}", self.names[side]);
                self.open(FaultKind::Down(side), label, started);
                self.down[side] = true;
            }
            Action::Pause { side } => {
                let label = format!("SIGSTOP {}", self.names[side]);
                self.open(FaultKind::Down(side), label, started);
                self.down[side] = true;
            }
            Action::Restart { side } | Action::Resume { side } => {
                self.close(FaultKind::Down(side), done);
                self.down[side] = false;
            }
            Action::Save { .. } | Action::Restore { .. } | Action::Backup { .. } => {}
            Action::Split { side } => {
                let label = format!("old process of {} next to its replacement", self.names[side]);
                self.open(FaultKind::Split(side), label, started);
                self.split[side] = true;
            }
            Action::EndSplit { side } => {
                self.close(FaultKind::Split(side), done);
                self.split[side] = false;
            }
            Action::KillLeader { side } => {
                let label = format!("kill -9 {}'s leader", self.names[side]);
                self.open(FaultKind::Leader(side), label, started);
                self.member_out[side] = true;
            }
            Action::IsolateMember { side, leader } => {
                let (kind, who) = if leader {
                    (FaultKind::Leader(side), "leader")
                } else {
                    (FaultKind::Member(side), "follower")
                };
                self.open(kind, format!("{}'s {who} cut off from its group", self.names[side]), started);
                self.member_out[side] = true;
            }
            Action::StopMember { side, leader, how } => {
                let kind = if leader { FaultKind::Leader(side) } else { FaultKind::Member(side) };
                let what = match how {
                    Stop::Upgrade => "stopped for an upgrade",
                    Stop::DiskLoss => "lost its disk",
                    Stop::Replace => "lost its machine",
                };
                let who = if leader { "leader" } else { "follower" };
                self.open(kind, format!("{}'s {who} {what}", self.names[side]), started);
                self.member_out[side] = true;
            }
            Action::RestartMember { side } | Action::RejoinMember { side } | Action::StartMember { side } => {
                self.close(FaultKind::Leader(side), done);
                self.close(FaultKind::Member(side), done);
                self.member_out[side] = false;
            }
        }
        if action.starts_fault() {
            StepEffect::Started
        } else if action.within_fault() {
            StepEffect::Within
        } else {
            StepEffect::Ended { quiet: self.is_quiet() }
        }
    }

    /// The fault windows by start time; faults still in force end at `end`.
    pub fn windows(mut self, end: Ms) -> Vec<FaultWindow> {
        for o in self.open.drain(..) {
            self.closed.push(FaultWindow { label: o.label, start_ms: o.start_ms, end_ms: end });
        }
        self.closed.sort_by_key(|f| f.start_ms);
        self.closed
    }

    fn open(&mut self, kind: FaultKind, label: String, start_ms: Ms) {
        self.open.push(OpenFault { kind, label, start_ms });
    }

    /// Closes the oldest open window of `kind`, if any, at `end_ms`.
    fn close(&mut self, kind: FaultKind, end_ms: Ms) {
        if let Some(p) = self.open.iter().position(|o| o.kind == kind) {
            let o = self.open.remove(p);
            self.closed.push(FaultWindow { label: o.label, start_ms: o.start_ms, end_ms });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, Capabilities, Cut, DrillKind, PacketFaults};

    fn ledger() -> FaultLedger {
        FaultLedger::new(["dc-a".to_owned(), "dc-b".to_owned()])
    }

    fn windows(l: FaultLedger, end: Ms) -> Vec<(String, Ms, Ms)> {
        l.windows(end).into_iter().map(|w| (w.label, w.start_ms, w.end_ms)).collect()
    }

    const PACKETS: PacketFaults = PacketFaults {
        loss_pct: 5,
        delay_ms: 10,
        jitter_ms: 2,
        duplicate_pct: 1,
        reorder_pct: 3,
        reorder_hold_ms: 4,
    };

    #[test]
    fn a_cut_and_its_heal_make_one_window_and_a_recovery_point() {
        let mut l = ledger();
        assert!(l.is_quiet());
        assert!(l.breaks_quiet(Action::Cut(Cut::Both)));
        assert_eq!(l.record(Action::Cut(Cut::Both), 100, 105), StepEffect::Started);
        assert!(!l.is_quiet());
        assert_eq!(l.active(), vec![FaultKind::Cut]);
        assert!(!l.breaks_quiet(Action::Pause { side: 0 }), "a fault is already in force");
        assert_eq!(l.record(Action::Heal, 500, 510), StepEffect::Ended { quiet: true });
        assert!(l.is_quiet());
        assert!(l.active().is_empty());
        assert_eq!(windows(l, 9_999), vec![("partition dc-a <-/-> dc-b".to_owned(), 100, 500)]);
    }

    #[test]
    fn a_new_cut_or_packet_fault_replaces_the_one_in_force() {
        let mut l = ledger();
        l.record(Action::Cut(Cut::AToB), 0, 1);
        l.record(Action::Cut(Cut::BToA), 50, 51);
        l.record(Action::Packets(PACKETS), 60, 61);
        l.record(Action::Packets(PacketFaults { loss_pct: 50, ..PACKETS }), 70, 71);
        assert_eq!(l.active(), vec![FaultKind::Cut, FaultKind::Packets]);
        assert_eq!(l.record(Action::ClearPackets, 80, 81), StepEffect::Ended { quiet: false });
        assert_eq!(l.record(Action::Heal, 90, 91), StepEffect::Ended { quiet: true });
        let w = windows(l, 1_000);
        let spans: Vec<(Ms, Ms)> = w.iter().map(|(_, s, e)| (*s, *e)).collect();
        assert_eq!(spans, vec![(0, 50), (50, 90), (60, 70), (70, 80)]);
        assert_eq!(w[0].0, "partition dc-a -/-> dc-b");
        assert_eq!(w[1].0, "partition dc-b -/-> dc-a");
        assert!(w[2].0.starts_with("packets: loss 5%"), "{}", w[2].0);
    }

    #[test]
    fn a_process_is_down_until_it_is_back_and_its_window_ends_when_it_is() {
        let mut l = ledger();
        assert_eq!(l.record(Action::Kill { side: 0, wipe: true }, 10, 12), StepEffect::Started);
        assert_eq!(l.record(Action::Pause { side: 1 }, 20, 21), StepEffect::Started);
        assert_eq!(l.active(), vec![FaultKind::Down(0), FaultKind::Down(1)]);
        // The restart takes until 40: the process is back then, not when it was asked.
        assert_eq!(l.record(Action::Restart { side: 0 }, 30, 40), StepEffect::Ended { quiet: false });
        assert_eq!(l.active(), vec![FaultKind::Down(1)]);
        assert_eq!(l.record(Action::Resume { side: 1 }, 50, 55), StepEffect::Ended { quiet: true });
        assert_eq!(
            windows(l, 1_000),
            vec![("kill -9 + disk loss dc-a".to_owned(), 10, 40), ("SIGSTOP dc-b".to_owned(), 20, 55)]
        );
    }

    #[test]
    fn an_end_without_a_fault_is_still_a_recovery_point() {
        let mut l = ledger();
        assert_eq!(l.record(Action::Heal, 5, 6), StepEffect::Ended { quiet: true });
        assert!(windows(l, 100).is_empty());
    }

    #[test]
    fn faults_still_in_force_end_with_the_drill() {
        let mut l = ledger();
        l.record(Action::Cut(Cut::Both), 100, 100);
        l.record(Action::Kill { side: 1, wipe: false }, 50, 50);
        assert_eq!(l.active(), vec![FaultKind::Cut, FaultKind::Down(1)]);
        assert_eq!(
            windows(l, 700),
            vec![("kill -9 dc-b".to_owned(), 50, 700), ("partition dc-a <-/-> dc-b".to_owned(), 100, 700)]
        );
    }

    #[test]
    fn the_checker_hears_of_process_events_before_and_after_a_step() {
        let events = FaultLedger::process_events;
        let before = |b: Vec<(usize, ProcessEvent)>| ProcessEvents { before: b, after: Vec::new() };
        assert_eq!(events(Action::Kill { side: 1, wipe: false }), before(vec![(1, ProcessEvent::Killed)]));
        assert_eq!(
            events(Action::Kill { side: 0, wipe: true }),
            before(vec![(0, ProcessEvent::Killed), (0, ProcessEvent::HistoryLost)])
        );
        assert_eq!(
            events(Action::Restart { side: 0 }),
            ProcessEvents { before: vec![(0, ProcessEvent::Spawned)], after: vec![(0, ProcessEvent::Ready)] }
        );
        assert_eq!(events(Action::Pause { side: 1 }), before(vec![(1, ProcessEvent::Paused)]));
        assert_eq!(
            events(Action::Resume { side: 1 }),
            ProcessEvents { before: Vec::new(), after: vec![(1, ProcessEvent::Resumed)] }
        );
        assert_eq!(
            events(Action::KillLeader { side: 0 }),
            ProcessEvents {
                before: vec![(0, ProcessEvent::LeaderLost)],
                after: vec![(0, ProcessEvent::LeaderServing)]
            }
        );
        assert_eq!(events(Action::RestartMember { side: 0 }), ProcessEvents::default());
        // A leader cut off is a leader lost as a kill is; a follower cut off loses none.
        assert_eq!(
            events(Action::IsolateMember { side: 1, leader: true }),
            ProcessEvents {
                before: vec![(1, ProcessEvent::LeaderLost)],
                after: vec![(1, ProcessEvent::LeaderServing)]
            }
        );
        assert_eq!(events(Action::IsolateMember { side: 1, leader: false }), ProcessEvents::default());
        assert_eq!(events(Action::RejoinMember { side: 1 }), ProcessEvents::default());
        for link in [Action::Cut(Cut::Both), Action::Heal, Action::Packets(PACKETS), Action::ClearPackets] {
            assert_eq!(events(link), ProcessEvents::default(), "{link:?}");
        }
    }

    #[test]
    fn labels_name_the_fault_and_the_dc() {
        let l = ledger();
        assert_eq!(l.label(Action::Cut(Cut::BToA)), "partition dc-b -/-> dc-a");
        assert_eq!(l.label(Action::Heal), "heal");
        assert!(l.label(Action::Packets(PACKETS)).starts_with("packets: loss 5%"));
        assert_eq!(l.label(Action::ClearPackets), "packets cleared");
        assert_eq!(l.label(Action::Kill { side: 0, wipe: false }), "kill -9 dc-a");
        assert_eq!(l.label(Action::Kill { side: 1, wipe: true }), "kill -9 dc-b and wipe its data dir");
        assert_eq!(l.label(Action::Restart { side: 1 }), "restart dc-b (ready)");
        assert_eq!(l.label(Action::Pause { side: 0 }), "SIGSTOP dc-a");
        assert_eq!(l.label(Action::Resume { side: 0 }), "SIGCONT dc-a");
    }

    #[test]
    fn every_planned_fault_is_healed_by_the_end_of_its_plan() {
        let caps = Capabilities { one_way: true, packets: true };
        for kind in DrillKind::ALL {
            for seed in 0..5 {
                let p = plan(kind, seed, None, caps);
                let l = FaultLedger::replay(["a".into(), "b".into()], &p.actions);
                assert!(l.is_quiet() && l.active().is_empty(), "{kind} seed {seed}: {:?}", l.active());
                let starts = p.actions.iter().filter(|s| s.action.starts_fault()).count();
                let w = l.windows(p.span_ms);
                assert_eq!(w.len(), starts, "{kind} seed {seed}: one window per fault");
                assert!(
                    w.iter().all(|w| w.start_ms <= w.end_ms && w.end_ms < p.span_ms),
                    "{kind} seed {seed}"
                );
            }
        }
    }
}
