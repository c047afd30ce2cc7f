//! The drills and their fault plans, generated up front from the seed (pure: no I/O, no
//! clock). A plan is a list of timed [`Action`]s inside a span: a warm-up without faults,
//! fault cycles, and a cool-down without faults before the workload stops.

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::workload::sub_seed;

/// The drills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DrillKind {
    PartitionHeal,
    OneWayPartition,
    FlappingLink,
    CrashRestart,
    Pause,
    PacketChaos,
    LongPartition,
    RestoreRollback,
    SplitIncarnation,
    LeaderKill,
    LeaderIsolated,
    FollowerPartition,
    FailoverLeases,
    RollingUpgrade,
    NodeDiskLoss,
    AddRemoveNode,
    BackupRestore,
}

impl DrillKind {
    pub const ALL: [DrillKind; 17] = [
        DrillKind::PartitionHeal,
        DrillKind::OneWayPartition,
        DrillKind::FlappingLink,
        DrillKind::CrashRestart,
        DrillKind::Pause,
        DrillKind::PacketChaos,
        DrillKind::LongPartition,
        DrillKind::RestoreRollback,
        DrillKind::SplitIncarnation,
        DrillKind::LeaderKill,
        DrillKind::LeaderIsolated,
        DrillKind::FollowerPartition,
        DrillKind::FailoverLeases,
        DrillKind::RollingUpgrade,
        DrillKind::NodeDiskLoss,
        DrillKind::AddRemoveNode,
        DrillKind::BackupRestore,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DrillKind::PartitionHeal => "partition-heal",
            DrillKind::OneWayPartition => "one-way-partition",
            DrillKind::FlappingLink => "flapping-link",
            DrillKind::CrashRestart => "crash-restart",
            DrillKind::Pause => "pause",
            DrillKind::PacketChaos => "packet-chaos",
            DrillKind::LongPartition => "long-partition",
            DrillKind::RestoreRollback => "restore-rollback",
            DrillKind::SplitIncarnation => "split-incarnation",
            DrillKind::LeaderKill => "leader-kill",
            DrillKind::LeaderIsolated => "leader-isolated",
            DrillKind::FollowerPartition => "follower-partition",
            DrillKind::FailoverLeases => "failover-leases",
            DrillKind::RollingUpgrade => "rolling-upgrade",
            DrillKind::NodeDiskLoss => "node-disk-loss",
            DrillKind::AddRemoveNode => "add-remove-node",
            DrillKind::BackupRestore => "backup-restore",
        }
    }

    pub fn about(self) -> &'static str {
        match self {
            DrillKind::PartitionHeal => "cut the link both ways under churn, heal, converge",
            DrillKind::OneWayPartition => "drop the packets of one direction only (each way in turn)",
            DrillKind::FlappingLink => "cut and heal the link in short seeded bursts",
            DrillKind::CrashRestart => "kill -9 a DC (sometimes both) mid-traffic and restart it on the same data dir",
            DrillKind::Pause => "SIGSTOP a DC for longer than the staleness and lease times, then SIGCONT",
            DrillKind::PacketChaos => "loss, delay with jitter, duplication and reordering on the link",
            DrillKind::LongPartition => {
                "partition long enough to purge; the second DC loses its disk meanwhile, so healing takes the snapshot path"
            }
            DrillKind::RestoreRollback => {
                "restore an older copy of a DC's data dir (kill -9, copy back, restart): once on a healthy link, once partitioned while the restored DC writes past its peer's mark"
            }
            DrillKind::SplitIncarnation => {
                "start a DC's replacement on an empty data dir while the old process keeps running; clients and the peer move to the replacement; the old one must be fenced"
            }
            DrillKind::LeaderKill => {
                "kill -9 the leader of a DC's Raft group under writes (each DC in turn), restart it as a follower; nothing acked is lost, no lease that kept beating expires"
            }
            DrillKind::LeaderIsolated => {
                "cut the leader of a DC's group off from its other members (it keeps running and keeps its link to the other DC); the majority elects another, the old one stops serving, commits and ships nothing"
            }
            DrillKind::FollowerPartition => {
                "cut a follower off from its group: it keeps serving discovery flagged with its last contact, refuses writes, and a client that alternates members never sees the index go back"
            }
            DrillKind::FailoverLeases => {
                "10,000 leases beating in batches through the followers of one DC while its leader is killed three times: not one expires or turns unhealthy"
            }
            DrillKind::RollingUpgrade => {
                "upgrade every member of each DC in turn from the previous release (emulated) to this one, leader last, then restart each again with the lead handed over first; each member catches up before the next"
            }
            DrillKind::NodeDiskLoss => {
                "kill -9 one member of a DC's group and wipe its data dir, then restart it empty (each DC in turn, a follower and later the leader): it rejoins from a Raft snapshot, the DC keeps its epoch and the other DC sees nothing"
            }
            DrillKind::AddRemoveNode => {
                "a follower's machine is lost (kill -9, data dir wiped; each DC in turn): it is removed from its group, and a node under a new id on the same addresses is started to join and added (a learner caught up by snapshot, then a voter)"
            }
            DrillKind::BackupRestore => {
                "back a DC up from its leader while it serves (tandem backup), write on, then lose the DC whole (kill -9 of every member, data dirs wiped) and restore it (tandem restore into one member, the others join); each DC in turn. The restored DC takes a new epoch; nothing written after the backup comes back at the peer"
            }
        }
    }

    /// The span of the short (CI) version, in ms.
    pub fn short_span_ms(self) -> u64 {
        match self {
            DrillKind::PartitionHeal => 14_000,
            DrillKind::OneWayPartition => 18_000,
            DrillKind::FlappingLink => 16_000,
            DrillKind::CrashRestart => 20_000,
            DrillKind::Pause => 16_000,
            DrillKind::PacketChaos => 16_000,
            DrillKind::LongPartition => 22_000,
            DrillKind::RestoreRollback => 24_000,
            DrillKind::SplitIncarnation => 18_000,
            DrillKind::LeaderKill => 20_000,
            DrillKind::LeaderIsolated => 20_000,
            DrillKind::FollowerPartition => 18_000,
            DrillKind::FailoverLeases => 30_000,
            DrillKind::RollingUpgrade => 40_000,
            DrillKind::NodeDiskLoss => 24_000,
            DrillKind::AddRemoveNode => 30_000,
            DrillKind::BackupRestore => 30_000,
        }
    }

    /// Nodes per DC when the command line does not say (`--nodes`): a group of three for
    /// the drills about a group, one node otherwise.
    pub fn nodes_default(self) -> usize {
        match self {
            DrillKind::LeaderKill
            | DrillKind::LeaderIsolated
            | DrillKind::FollowerPartition
            | DrillKind::FailoverLeases
            | DrillKind::RollingUpgrade
            | DrillKind::NodeDiskLoss
            | DrillKind::AddRemoveNode
            | DrillKind::BackupRestore => 3,
            _ => 1,
        }
    }

    /// Why this drill cannot run with `nodes` per DC, if it cannot.
    pub fn refuses_nodes(self, nodes: usize) -> Option<String> {
        match self {
            DrillKind::LeaderKill
            | DrillKind::LeaderIsolated
            | DrillKind::FollowerPartition
            | DrillKind::FailoverLeases
            | DrillKind::RollingUpgrade
            | DrillKind::NodeDiskLoss
            | DrillKind::AddRemoveNode
            | DrillKind::BackupRestore
                if nodes < 3 =>
            {
                Some(format!("{self} needs a group of at least three nodes per DC (--nodes 3), not {nodes}"))
            }
            // A DC's data dir copied back, or a replacement next to the old process: one
            // process per DC.
            DrillKind::RestoreRollback | DrillKind::SplitIncarnation if nodes > 1 => {
                Some(format!("{self} drills a DC of one node (--nodes 1), not {nodes}"))
            }
            _ => None,
        }
    }

    /// Purge grace for the drill's nodes: short in long-partition so that purging happens.
    pub fn purge_grace_ms(self) -> u64 {
        match self {
            DrillKind::LongPartition => 1_000,
            _ => 600_000,
        }
    }

    /// Needs one-way cuts or packet faults (only the user-space relay provides them).
    /// (split-incarnation: the peer's dials move to the replacement by moving the relay's
    /// upstream; in network namespaces both processes would need the one address.)
    pub fn needs_relay(self) -> bool {
        matches!(self, DrillKind::OneWayPartition | DrillKind::PacketChaos | DrillKind::SplitIncarnation)
    }

    /// Cuts one member off from its group: the members' links run through relays.
    pub fn cuts_members(self) -> bool {
        matches!(self, DrillKind::LeaderIsolated | DrillKind::FollowerPartition)
    }

    pub fn needs_processes(self) -> bool {
        matches!(
            self,
            DrillKind::CrashRestart
                | DrillKind::Pause
                | DrillKind::LongPartition
                | DrillKind::RestoreRollback
                | DrillKind::SplitIncarnation
                | DrillKind::LeaderKill
                | DrillKind::FailoverLeases
                | DrillKind::RollingUpgrade
                | DrillKind::NodeDiskLoss
                | DrillKind::AddRemoveNode
                | DrillKind::BackupRestore
        )
    }
}

impl fmt::Display for DrillKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DrillKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DrillKind::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            format!("unknown drill {s:?}; drills: {}", DrillKind::ALL.map(|d| d.name()).join(", "))
        })
    }
}

/// Which packets a cut drops. Sides: 0 = first DC ("a"), 1 = second ("b").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    Both,
    /// Packets from a to b are dropped; b to a pass.
    AToB,
    /// Packets from b to a are dropped.
    BToA,
}

impl Cut {
    pub fn label(self, a: &str, b: &str) -> String {
        match self {
            Cut::Both => format!("{a} <-/-> {b}"),
            Cut::AToB => format!("{a} -/-> {b}"),
            Cut::BToA => format!("{b} -/-> {a}"),
        }
    }
}

/// Packet faults on every direction of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketFaults {
    pub loss_pct: u8,
    pub delay_ms: u32,
    pub jitter_ms: u32,
    pub duplicate_pct: u8,
    pub reorder_pct: u8,
    pub reorder_hold_ms: u32,
}

impl fmt::Display for PacketFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss {}%, delay {}ms +/- {}ms, dup {}%, reorder {}% (hold {}ms)",
            self.loss_pct,
            self.delay_ms,
            self.jitter_ms,
            self.duplicate_pct,
            self.reorder_pct,
            self.reorder_hold_ms
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Cut(Cut),
    Heal,
    Packets(PacketFaults),
    ClearPackets,
    /// SIGKILL; with `wipe`, the data dir is deleted before the restart (disk loss).
    Kill {
        side: usize,
        wipe: bool,
    },
    Restart {
        side: usize,
    },
    Pause {
        side: usize,
    },
    Resume {
        side: usize,
    },
    /// While the DC is killed: a crash-consistent copy of its data dir is kept aside.
    Save {
        side: usize,
    },
    /// While the DC is killed: its data dir is replaced by the copy `Save` kept (a VM or
    /// disk snapshot rolled back). Its history after the save is legitimately gone.
    Restore {
        side: usize,
    },
    /// While the DC serves: a backup of it is taken from its leader (`tandem backup`). A
    /// later `Restore` of a group DC restores it (`tandem restore` into its first member)
    /// and the `Restart` after that starts the first member alone, then has the others
    /// join.
    Backup {
        side: usize,
    },
    /// A replacement process of the DC starts on an empty data dir (new ports); once it
    /// answers, clients and the peer's dials move to it. The old process keeps running.
    Split {
        side: usize,
    },
    /// The old process of a split is checked (it must report itself fenced) and killed.
    EndSplit {
        side: usize,
    },
    /// SIGKILL of the node leading the DC's Raft group; done once another member serves
    /// writes. The DC stays up: its other members keep answering.
    KillLeader {
        side: usize,
    },
    /// The members a `KillLeader` killed start again on their data dirs (as followers).
    RestartMember {
        side: usize,
    },
    /// One member of the DC's group is cut off from the others (every member link to and
    /// from it drops), the leader when `leader`, else a follower. It keeps running, keeps
    /// answering HTTP and keeps its link to the other DC.
    IsolateMember {
        side: usize,
        leader: bool,
    },
    /// The member an `IsolateMember` cut off is joined to its group again; done once it
    /// follows the leader and applied what the leader had.
    RejoinMember {
        side: usize,
    },
    /// One member of the DC's group goes down: the next one of the round (a follower not
    /// yet stopped in it), or the leader when `leader`. `Stop::Upgrade`: SIGTERM, as a
    /// rolling upgrade does; a leader of this release first hands its lead to a member
    /// already restarted (`tandem cluster transfer-leader`), one of the previous release
    /// cannot, so the group elects another. `Stop::DiskLoss`: SIGKILL, and its data dir
    /// is wiped. The clients move off it first.
    StopMember {
        side: usize,
        leader: bool,
        how: Stop,
    },
    /// The member a `StopMember` took down starts again (of this release, on what is left
    /// of its data dir); done once it follows the serving leader and applied what the
    /// leader had.
    StartMember {
        side: usize,
    },
}

/// `add-remove-node`: replacements per DC at most. A replacement takes the next unused
/// node id, and the sandbox makes certificates for ids 1..=9 (`tandem certs --nodes 9`):
/// three members and six replacements.
pub const REPLACEMENTS_PER_DC_MAX: u64 = 6;

/// How a `StopMember` takes its member down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Upgrade,
    DiskLoss,
    /// The member's machine is lost: killed, its data dir wiped, removed from the group;
    /// a node under a new id on its addresses joins in its place.
    Replace,
}

impl Action {
    /// Starts a fault (as opposed to ending one).
    pub fn starts_fault(self) -> bool {
        matches!(
            self,
            Action::Cut(_)
                | Action::Packets(_)
                | Action::Kill { .. }
                | Action::Pause { .. }
                | Action::Split { .. }
                | Action::KillLeader { .. }
                | Action::IsolateMember { .. }
                | Action::StopMember { .. }
        )
    }

    /// Neither starts nor ends a fault: done to a DC that is down (`Save`, `Restore`), or
    /// to one that serves without a fault (`Backup`).
    pub fn within_fault(self) -> bool {
        matches!(self, Action::Save { .. } | Action::Restore { .. } | Action::Backup { .. })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub at_ms: u64,
    pub action: Action,
}

/// A drill's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kind: DrillKind,
    /// The workload runs in [0, span_ms); every fault ends before it stops.
    pub span_ms: u64,
    pub actions: Vec<Planned>,
}

/// What the environment can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub one_way: bool,
    pub packets: bool,
}

/// The plan of `kind` for `seed`. `span_ms` of `None` is the short version.
pub fn plan(kind: DrillKind, seed: u64, span_ms: Option<u64>, caps: Capabilities) -> Plan {
    let short = span_ms.is_none();
    let span = span_ms.unwrap_or(kind.short_span_ms()).max(10_000);
    let warm = if short { 3_000 } else { (span / 10).clamp(3_000, 15_000) };
    let cool = if short { 3_000 } else { (span / 10).clamp(3_000, 15_000) };
    let (start, end) = (warm, span - cool);
    let mut rng = StdRng::seed_from_u64(sub_seed(seed, 100 + kind as u64));
    let mut a: Vec<Planned> = Vec::new();
    let mut at = |t: u64, action: Action| a.push(Planned { at_ms: t, action });
    let mut t = start;
    match kind {
        DrillKind::PartitionHeal => {
            while t + 3_000 <= end {
                let d = rng.gen_range(5_000..8_000).min(end - t);
                at(t, Action::Cut(Cut::Both));
                at(t + d, Action::Heal);
                t += d + rng.gen_range(3_000..6_000);
            }
        }
        DrillKind::OneWayPartition => {
            let mut dir = if rng.gen_bool(0.5) { Cut::AToB } else { Cut::BToA };
            while t + 2_000 <= end {
                let d = rng.gen_range(3_500..5_500).min(end - t);
                at(t, Action::Cut(if caps.one_way { dir } else { Cut::Both }));
                at(t + d, Action::Heal);
                dir = if dir == Cut::AToB { Cut::BToA } else { Cut::AToB };
                t += d + rng.gen_range(2_000..3_500);
            }
        }
        DrillKind::FlappingLink => {
            while t + 600 <= end {
                let d = rng.gen_range(300..1_500).min(end - t);
                let cut = match (caps.one_way, rng.gen_range(0..3)) {
                    (true, 1) => Cut::AToB,
                    (true, 2) => Cut::BToA,
                    _ => Cut::Both,
                };
                at(t, Action::Cut(cut));
                at(t + d, Action::Heal);
                t += d + rng.gen_range(300..1_500);
            }
        }
        DrillKind::CrashRestart => {
            let mut side = rng.gen_range(0..2usize);
            let mut cycle = 0;
            while t + 3_000 <= end {
                let down = rng.gen_range(500..2_500);
                // Every third cycle kills both DCs at once.
                if cycle % 3 == 2 {
                    at(t, Action::Kill { side: 0, wipe: false });
                    at(t + 1, Action::Kill { side: 1, wipe: false });
                    at(t + down, Action::Restart { side: 0 });
                    at(t + down + 1, Action::Restart { side: 1 });
                } else {
                    at(t, Action::Kill { side, wipe: false });
                    at(t + down, Action::Restart { side });
                    side = 1 - side;
                }
                cycle += 1;
                t += down + rng.gen_range(2_500..4_000);
            }
        }
        DrillKind::Pause => {
            let mut side = rng.gen_range(0..2usize);
            while t + 3_000 <= end {
                let d = rng.gen_range(1_800..4_000).min(end - t);
                at(t, Action::Pause { side });
                at(t + d, Action::Resume { side });
                side = 1 - side;
                t += d + rng.gen_range(2_000..3_500);
            }
        }
        DrillKind::PacketChaos => {
            if caps.packets {
                while t + 1_000 <= end {
                    at(
                        t,
                        Action::Packets(PacketFaults {
                            loss_pct: rng.gen_range(5..16),
                            delay_ms: rng.gen_range(5..30),
                            jitter_ms: rng.gen_range(0..40),
                            duplicate_pct: rng.gen_range(2..9),
                            reorder_pct: rng.gen_range(5..16),
                            reorder_hold_ms: rng.gen_range(20..60),
                        }),
                    );
                    t += rng.gen_range(3_000..6_000);
                }
                at(end, Action::ClearPackets);
            }
        }
        DrillKind::LongPartition => {
            let len = end - start;
            at(start, Action::Cut(Cut::Both));
            let wipe_at = start + len * 6 / 10;
            at(wipe_at, Action::Kill { side: 1, wipe: true });
            at(wipe_at + 1_000, Action::Restart { side: 1 });
            at(end, Action::Heal);
        }
        DrillKind::RestoreRollback => {
            // Each cycle: a crash-consistent copy of one DC's data dir (kill -9, copy,
            // restart), a few seconds of writes, then that copy restored (kill -9, copy back,
            // restart). Every other cycle the restore happens under a partition, so the
            // restored DC writes past its peer's mark before the heal.
            let mut side = rng.gen_range(0..2usize);
            let mut partitioned = false;
            while t + if partitioned { 9_500 } else { 6_500 } <= end {
                at(t, Action::Kill { side, wipe: false });
                at(t + 1, Action::Save { side });
                at(t + 300, Action::Restart { side });
                let r = t + 300 + rng.gen_range(3_000..4_000);
                if partitioned {
                    at(r - 200, Action::Cut(Cut::Both));
                }
                at(r, Action::Kill { side, wipe: false });
                at(r + 1, Action::Restore { side });
                at(r + 500, Action::Restart { side });
                t = r + 500;
                if partitioned {
                    let heal = t + rng.gen_range(2_500..3_500);
                    at(heal, Action::Heal);
                    t = heal;
                }
                t += rng.gen_range(2_000..2_500);
                partitioned = !partitioned;
                side = 1 - side;
            }
        }
        DrillKind::BackupRestore => {
            // Each cycle, one DC (each in turn): a backup while it serves, a few seconds of
            // writes, then the DC lost whole and restored from that backup.
            let mut side = rng.gen_range(0..2usize);
            while t + 9_000 <= end {
                at(t, Action::Backup { side });
                let r = t + rng.gen_range(2_500..3_500);
                at(r, Action::Kill { side, wipe: false });
                at(r + 1, Action::Restore { side });
                at(r + 300, Action::Restart { side });
                t = r + 300 + rng.gen_range(4_000..5_000);
                side = 1 - side;
            }
        }
        DrillKind::SplitIncarnation => {
            let mut side = rng.gen_range(0..2usize);
            while t + 7_000 <= end {
                let d = rng.gen_range(5_000..7_000).min(end - t);
                at(t, Action::Split { side });
                at(t + d, Action::EndSplit { side });
                t += d + rng.gen_range(2_000..3_000);
                side = 1 - side;
            }
        }
        DrillKind::LeaderIsolated | DrillKind::FollowerPartition => {
            let leader = kind == DrillKind::LeaderIsolated;
            let mut side = rng.gen_range(0..2usize);
            while t + 3_500 <= end {
                let cut = rng.gen_range(2_000..3_500);
                at(t, Action::IsolateMember { side, leader });
                at(t + cut, Action::RejoinMember { side });
                side = 1 - side;
                t += cut + rng.gen_range(3_000..4_500);
            }
        }
        DrillKind::FailoverLeases => {
            // The leases beat at the first DC: its leader dies three times.
            for _ in 0..3 {
                if t + 3_000 > end {
                    break;
                }
                let down = rng.gen_range(1_500..3_000);
                at(t, Action::KillLeader { side: 0 });
                at(t + down, Action::RestartMember { side: 0 });
                t += down + rng.gen_range(3_000..4_500);
            }
        }
        DrillKind::RollingUpgrade => {
            // Rounds while the span lasts: the upgrade (the members start as the previous
            // release), then rolling restarts of this release. Each DC in turn, its followers first and
            // its leader last, one member down at a time.
            let first = rng.gen_range(0..2usize);
            'rounds: loop {
                for side in [first, 1 - first] {
                    // A DC's round is whole: three steps of at most 2.6 s each.
                    if t + 3 * 2_600 > end {
                        break 'rounds;
                    }
                    for k in 0..3 {
                        let down = rng.gen_range(600..1_200);
                        at(t, Action::StopMember { side, leader: k == 2, how: Stop::Upgrade });
                        at(t + down, Action::StartMember { side });
                        t += down + rng.gen_range(800..1_400);
                    }
                }
            }
        }
        DrillKind::NodeDiskLoss => {
            // Each DC in turn loses one member's disk: a follower, then the leader.
            let first = rng.gen_range(0..2usize);
            let mut i = 0;
            while t + 3_000 <= end {
                let (side, leader) = (if i % 2 == 0 { first } else { 1 - first }, i / 2 % 2 == 1);
                let down = rng.gen_range(800..1_800);
                at(t, Action::StopMember { side, leader, how: Stop::DiskLoss });
                at(t + down, Action::StartMember { side });
                t += down + rng.gen_range(2_000..3_000);
                i += 1;
            }
        }
        DrillKind::AddRemoveNode => {
            // Each DC in turn loses a follower's machine, replaced under a new id: at most
            // REPLACEMENTS_PER_DC_MAX per DC, spread over the span (a long run spaces them).
            let mut side = rng.gen_range(0..2usize);
            let spacing = (end - t) / (2 * REPLACEMENTS_PER_DC_MAX);
            let mut done = 0;
            while t + 4_000 <= end && done < 2 * REPLACEMENTS_PER_DC_MAX {
                let down = rng.gen_range(800..1_500);
                at(t, Action::StopMember { side, leader: false, how: Stop::Replace });
                at(t + down, Action::StartMember { side });
                t += (down + rng.gen_range(2_500..3_500)).max(spacing);
                side = 1 - side;
                done += 1;
            }
        }
        DrillKind::LeaderKill => {
            let mut side = rng.gen_range(0..2usize);
            while t + 3_000 <= end {
                let down = rng.gen_range(1_500..3_000);
                at(t, Action::KillLeader { side });
                at(t + down, Action::RestartMember { side });
                side = 1 - side;
                t += down + rng.gen_range(3_000..4_500);
            }
        }
    }
    a.sort_by_key(|p| p.at_ms);
    Plan { kind, span_ms: span, actions: a }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CAPS: Capabilities = Capabilities { one_way: true, packets: true };

    #[test]
    fn plans_are_seeded_and_end_their_faults_before_the_span_ends() {
        for kind in DrillKind::ALL {
            for span in [None, Some(60_000), Some(600_000)] {
                let p = plan(kind, 9, span, ALL_CAPS);
                assert_eq!(p, plan(kind, 9, span, ALL_CAPS));
                assert!(!p.actions.is_empty(), "{kind} has faults");
                let (mut cut, mut killed, mut paused, mut packets) = (false, [false; 2], [false; 2], false);
                let (mut split, mut leaderless) = ([false; 2], [false; 2]);
                for x in &p.actions {
                    assert!(x.at_ms < p.span_ms);
                    match x.action {
                        Action::Cut(_) => cut = true,
                        Action::Heal => cut = false,
                        Action::Packets(_) => packets = true,
                        Action::ClearPackets => packets = false,
                        Action::Kill { side, .. } => killed[side] = true,
                        Action::Restart { side } => killed[side] = false,
                        Action::Pause { side } => paused[side] = true,
                        Action::Resume { side } => paused[side] = false,
                        Action::Save { side } | Action::Restore { side } => {
                            assert!(killed[side], "{kind}: the data dir is copied while the DC is down")
                        }
                        Action::Backup { side } => {
                            assert!(!killed[side], "{kind}: a backup is taken while the DC serves")
                        }
                        Action::Split { side } => split[side] = true,
                        Action::EndSplit { side } => split[side] = false,
                        Action::KillLeader { side } => leaderless[side] = true,
                        Action::RestartMember { side }
                        | Action::RejoinMember { side }
                        | Action::StartMember { side } => leaderless[side] = false,
                        Action::IsolateMember { side, .. } | Action::StopMember { side, .. } => {
                            assert!(!leaderless[side], "{kind}: one member of a group down at a time");
                            leaderless[side] = true
                        }
                    }
                }
                assert!(
                    !cut && !packets
                        && killed == [false; 2]
                        && paused == [false; 2]
                        && split == [false; 2]
                        && leaderless == [false; 2],
                    "{kind}: every fault ends"
                );
            }
        }
    }

    #[test]
    fn a_rolling_upgrade_takes_each_dcs_followers_then_its_leader() {
        let p = plan(DrillKind::RollingUpgrade, 3, None, ALL_CAPS);
        let stops: Vec<(usize, bool)> = p
            .actions
            .iter()
            .filter_map(|x| match x.action {
                Action::StopMember { side, leader, how: Stop::Upgrade } => Some((side, leader)),
                _ => None,
            })
            .collect();
        assert!(stops.len() >= 12 && stops.len() % 3 == 0, "whole rounds, two of both DCs: {stops:?}");
        for (i, round) in stops.chunks(3).enumerate() {
            assert!(round.iter().all(|s| s.0 == round[0].0), "one DC at a time: {stops:?}");
            assert_eq!(round.iter().map(|s| s.1).collect::<Vec<_>>(), [false, false, true], "round {i}");
        }
        let d = plan(DrillKind::NodeDiskLoss, 3, None, ALL_CAPS);
        let lost: Vec<(usize, bool)> = d
            .actions
            .iter()
            .filter_map(|x| match x.action {
                Action::StopMember { side, leader, how: Stop::DiskLoss } => Some((side, leader)),
                _ => None,
            })
            .collect();
        assert!(lost.len() >= 4 && lost[..4].iter().filter(|l| l.1).count() == 2, "{lost:?}");
        assert!(lost[..2].iter().all(|l| !l.1) && lost[0].0 != lost[1].0, "{lost:?}");
        let r = plan(DrillKind::AddRemoveNode, 3, None, ALL_CAPS);
        let replaced: Vec<(usize, bool)> = r
            .actions
            .iter()
            .filter_map(|x| match x.action {
                Action::StopMember { side, leader, how: Stop::Replace } => Some((side, leader)),
                _ => None,
            })
            .collect();
        assert!(replaced.len() >= 4 && replaced.iter().all(|l| !l.1), "followers only: {replaced:?}");
        assert!(replaced.windows(2).all(|w| w[0].0 != w[1].0), "each DC in turn: {replaced:?}");
        let long = plan(DrillKind::AddRemoveNode, 3, Some(600_000), ALL_CAPS);
        let steps = long.actions.iter().filter(|x| matches!(x.action, Action::StopMember { .. })).count();
        assert_eq!(steps as u64, 2 * REPLACEMENTS_PER_DC_MAX, "a long run spaces them, within the ids");
    }
}
