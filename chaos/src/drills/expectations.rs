//! What each drill expects beyond the checker's invariants (the report's expectation
//! rows): the snapshot path of `long-partition`, the fencing of `split-incarnation`, the
//! failovers of `leader-kill`, the leases of `failover-leases` and the cut-off member of
//! `leader-isolated` and `follower-partition`. Judged only where the drill controlled
//! the processes (a target without a fault hook was only marked).

use std::collections::BTreeSet;

use super::leases::{self, LeaseStats};
use crate::cluster::{Failover, Isolation, Restore, Roll, SplitCheck};
use crate::plan::{Action, DrillKind, Plan};
use crate::report::{Expectation, Figures};

/// What the drill saw that its expectations judge.
pub(super) struct Seen<'a> {
    pub kind: DrillKind,
    pub names: &'a [String; 2],
    pub plan: &'a Plan,
    pub purge_floor_before_heal: [u64; 2],
    pub figures: &'a Figures,
    /// Snapshots sent and installed, summed from both DCs' `/metrics` at the end.
    pub metrics_snapshots: Option<(u64, u64)>,
    pub split_checks: &'a [SplitCheck],
    pub failovers: &'a [Failover],
    pub isolations: &'a [Isolation],
    pub rolls: &'a [Roll],
    /// Every backup restored (`backup-restore`).
    pub restores: &'a [Restore],
    /// The probe instances each DC showed at the end (`leader-isolated`,
    /// `follower-partition`).
    pub probes_visible: &'a Result<[BTreeSet<String>; 2], String>,
    pub leases: &'a LeaseStats,
}

/// The expectation rows of `s.kind` (none for the drills that have none).
pub(super) fn expectations(s: &Seen<'_>) -> Vec<Expectation> {
    let mut out = Vec::new();
    if s.kind == DrillKind::LongPartition {
        let purged = s.purge_floor_before_heal[0] > 0;
        out.push(Expectation {
            name: "purge".into(),
            passed: purged,
            detail: format!(
                "{}'s purge floor reached {} before the heal ({} {}): once {} lost its disk, its empty cursor was below the floor and only a snapshot could catch it up",
                s.names[0], s.purge_floor_before_heal[0], s.names[1], s.purge_floor_before_heal[1], s.names[1]
            ),
        });
        let ab = s.figures.snapshots_sent[0] >= 1 && s.figures.snapshots_installed[1] >= 1;
        let ba = s.figures.snapshots_sent[1] >= 1 && s.figures.snapshots_installed[0] >= 1;
        out.push(Expectation {
            name: "snapshot-path".into(),
            passed: ab && ba,
            detail: format!(
                "{a}->{b}: {} sent / {} installed (cursor below purge floor); {b}->{a}: {} sent / {} installed (new epoch){}",
                s.figures.snapshots_sent[0],
                s.figures.snapshots_installed[1],
                s.figures.snapshots_sent[1],
                s.figures.snapshots_installed[0],
                s.metrics_snapshots.map(|(sent, inst)| format!("; /metrics at the end: sent {sent}, installed {inst}")).unwrap_or_default(),
                a = s.names[0],
                b = s.names[1]
            ),
        });
    }
    if s.kind == DrillKind::SplitIncarnation {
        let fenced = s.split_checks.iter().filter(|c| c.fenced).count();
        out.push(Expectation {
            name: "fenced".into(),
            passed: !s.split_checks.is_empty() && fenced == s.split_checks.len(),
            detail: if s.split_checks.is_empty() {
                "no split was ended".into()
            } else {
                s.split_checks
                    .iter()
                    .map(|c| format!("{}: {}", c.dc, c.detail))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        });
    }
    if s.kind == DrillKind::LeaderKill {
        let kills = s.plan.actions.iter().filter(|a| matches!(a.action, Action::KillLeader { .. })).count();
        let mut gaps: Vec<u64> = s.failovers.iter().map(|f| f.gap_ms).collect();
        gaps.sort_unstable();
        out.push(Expectation {
            name: "leader-failover".into(),
            passed: kills > 0 && s.failovers.len() == kills,
            detail: format!(
                "{} of {kills} leader kills answered by another member serving writes (kill to a status poll seeing it: max {}ms): {}",
                s.failovers.len(),
                gaps.last().copied().unwrap_or(0),
                s.failovers
                    .iter()
                    .map(|f| format!("{} n{}->n{} {}ms", f.dc, f.killed, f.next, f.gap_ms))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    if s.kind == DrillKind::FailoverLeases {
        let kills = s.plan.actions.iter().filter(|a| matches!(a.action, Action::KillLeader { .. })).count();
        let done = s.failovers.len();
        let mut e = leases::expectation(s.leases, kills, s.names);
        e.passed &= done == kills;
        e.detail.push_str(&format!("; {done} of {kills} kills answered by another member serving writes"));
        out.push(e);
    }
    if matches!(s.kind, DrillKind::RollingUpgrade | DrillKind::NodeDiskLoss | DrillKind::AddRemoveNode) {
        out.extend(roll_expectations(s));
    }
    if s.kind == DrillKind::BackupRestore {
        out.push(restore_expectation(s));
    }
    if s.kind.cuts_members() {
        let cuts = s.plan.actions.iter().filter(|a| matches!(a.action, Action::IsolateMember { .. })).count();
        out.extend(isolation_expectations(cuts, s.isolations, s.probes_visible, s.names));
    }
    out
}

/// What `rolling-upgrade`, `node-disk-loss` and `add-remove-node` expect of every member
/// they took down: it (or its replacement) came back and caught up, a leader's DC served writes again (`Roll`), the DC kept its
/// epoch; an upgrade's leaders of this release handed their lead over.
fn roll_expectations(s: &Seen<'_>) -> Vec<Expectation> {
    let stops = s.plan.actions.iter().filter(|a| matches!(a.action, Action::StopMember { .. })).count();
    let rolls = s.rolls;
    let mut out = Vec::new();
    let all_back = stops > 0 && rolls.len() == stops;
    let mut catch: Vec<u64> = rolls.iter().map(|r| r.catch_up_ms).collect();
    catch.sort_unstable();
    out.push(Expectation {
        name: "members-back".into(),
        passed: all_back,
        detail: format!(
            "{} of {stops} members taken down came back, followed the leader and caught up (max {}ms): {}",
            rolls.len(),
            catch.last().copied().unwrap_or(0),
            rolls
                .iter()
                .map(|r| format!("{} n{} {} {}ms", r.dc, r.member, r.how, r.catch_up_ms))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    if s.kind == DrillKind::AddRemoveNode {
        out.push(replaced_expectation(rolls, all_back));
    } else {
        out.push(handover_expectation(s, rolls, all_back));
    }
    let moved: Vec<String> = rolls
        .iter()
        .filter(|r| r.epoch.0.is_none() || r.epoch.0 != r.epoch.1)
        .map(|r| format!("{} n{}: {:?} -> {:?}", r.dc, r.member, r.epoch.0, r.epoch.1))
        .collect();
    out.push(Expectation {
        name: "epoch-kept".into(),
        passed: all_back && moved.is_empty(),
        detail: if moved.is_empty() {
            format!("every DC kept its epoch across its {} member restarts", rolls.len())
        } else {
            format!("the DC's epoch moved (or was not read): {}", moved.join("; "))
        },
    });
    out
}

/// `leader-handover`: every leader taken down was followed by another member serving
/// writes; an upgrade's leaders of this release handed over by transfer.
fn handover_expectation(s: &Seen<'_>, rolls: &[Roll], all_back: bool) -> Expectation {
    let leaders: Vec<&Roll> = rolls.iter().filter(|r| r.was_leader).collect();
    let transfers: Vec<&Roll> = leaders.iter().copied().filter(|r| r.transfer.is_some()).collect();
    let mut gaps: Vec<u64> = leaders.iter().filter_map(|r| r.gap_ms).collect();
    gaps.sort_unstable();
    Expectation {
        name: "leader-handover".into(),
        passed: all_back
            && !leaders.is_empty()
            && leaders.iter().all(|r| r.next.is_some())
            && transfers.iter().all(|r| matches!(r.transfer, Some(Ok(_))))
            && (s.kind != DrillKind::RollingUpgrade || !transfers.is_empty()),
        detail: format!(
            "{} leaders taken down, another member served writes after each (max {}ms from the step's start); {} handed over by transfer-leader: {}",
            leaders.len(),
            gaps.last().copied().unwrap_or(0),
            transfers.len(),
            leaders
                .iter()
                .map(|r| format!(
                    "{} n{}->n{} {}ms{}",
                    r.dc,
                    r.member,
                    r.next.unwrap_or(0),
                    r.gap_ms.unwrap_or(0),
                    match &r.transfer {
                        Some(Ok(ms)) => format!(" (transfer {ms}ms)"),
                        Some(Err(e)) => format!(" (transfer failed: {e})"),
                        None => " (election)".into(),
                    }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `replaced` (`add-remove-node`): each lost member was removed from its group and a node
/// under a new id was added in its place.
fn replaced_expectation(rolls: &[Roll], all_back: bool) -> Expectation {
    let done = |r: &&Roll| r.removed_ms.is_some() && r.replaced_by.is_some() && r.added_ms.is_some();
    let mut added: Vec<u64> = rolls.iter().filter_map(|r| r.added_ms).collect();
    added.sort_unstable();
    Expectation {
        name: "replaced".into(),
        passed: all_back && rolls.iter().all(|r| done(&r)),
        detail: format!(
            "{} of {} lost members removed and replaced by a new id (add: learner, catch-up, promotion; max {}ms): {}",
            rolls.iter().filter(done).count(),
            rolls.len(),
            added.last().copied().unwrap_or(0),
            rolls
                .iter()
                .map(|r| format!(
                    "{} n{}->n{} removed {}ms added {}ms",
                    r.dc,
                    r.member,
                    r.replaced_by.unwrap_or(0),
                    r.removed_ms.unwrap_or(0),
                    r.added_ms.unwrap_or(0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What `leader-isolated` and `follower-partition` expect of every member they cut off
/// (besides the checker's invariants): see `Isolation`.
fn isolation_expectations(
    cuts: usize,
    isolations: &[Isolation],
    visible: &Result<[BTreeSet<String>; 2], String>,
    names: &[String; 2],
) -> Vec<Expectation> {
    let mut out = Vec::new();
    let each = |what: &dyn Fn(&Isolation) -> String| {
        isolations
            .iter()
            .map(|i| format!("{} n{}: {}", i.dc, i.member, what(i)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let all_back = cuts > 0 && isolations.len() == cuts;
    if isolations.iter().any(|i| i.was_leader) {
        out.push(Expectation {
            name: "leader-cut-off".into(),
            passed: all_back && isolations.iter().all(|i| i.next.is_some() && i.stepped_down_ms.is_some()),
            detail: format!(
                "{} of {cuts} cuts rejoined; the majority served writes, the cut-off leader stopped serving: {}",
                isolations.len(),
                each(&|i| format!(
                    "n{} served {}, it stopped {}",
                    i.next.map_or(0, |n| n.0),
                    i.next.map_or("never".into(), |n| format!("{}ms after the cut", n.1)),
                    i.stepped_down_ms.map_or("never".into(), |ms| format!("{ms}ms after the cut"))
                ))
            ),
        });
    }
    // An acknowledged write is in both DCs; a refused one in neither.
    let mut wrong = Vec::new();
    match visible {
        Ok(seen) => {
            for (side, ids) in seen.iter().enumerate() {
                for i in isolations {
                    let lost = i.probes.acked_ids.iter().filter(|id| !ids.contains(*id));
                    wrong.extend(lost.map(|id| format!("acknowledged {id} missing at {}", names[side])));
                    let made = i.probes.refused_ids.iter().filter(|id| ids.contains(*id));
                    wrong.extend(made.map(|id| format!("refused {id} present at {}", names[side])));
                }
            }
        }
        Err(e) => wrong.push(e.clone()),
    }
    let visible_n = visible.as_ref().map_or(0, |v| v[0].len().max(v[1].len()));
    out.push(Expectation {
        name: "cut-off-writes".into(),
        passed: all_back && wrong.is_empty(),
        detail: format!(
            "writes to the cut-off member: {} acknowledged (each must be in both DCs), {} refused (in neither), {} unknown; {visible_n} probe instances at the end{}",
            isolations.iter().map(|i| i.probes.writes_acked).sum::<u64>(),
            isolations.iter().map(|i| i.probes.writes_refused).sum::<u64>(),
            isolations.iter().map(|i| i.probes.writes_unknown).sum::<u64>(),
            if wrong.is_empty() { String::new() } else { format!(": {}", wrong.join(", ")) }
        ),
    });
    out.push(Expectation {
        name: "cut-off-reads".into(),
        passed: all_back
            && isolations.iter().all(|i| {
                i.probes.reads_answered > 0 && i.probes.reads_failed == 0 && i.probes.last_contact_max_ms >= Some(1_000)
            }),
        detail: format!(
            "plain reads of the cut-off member answered, flagged with its last contact (at least 1000ms once cut off): {}",
            each(&|i| format!(
                "{} answered, {} failed, last contact up to {}ms",
                i.probes.reads_answered,
                i.probes.reads_failed,
                i.probes.last_contact_max_ms.map_or("-".into(), |ms| ms.to_string())
            ))
        ),
    });
    out.push(Expectation {
        name: "index-never-back".into(),
        passed: all_back
            && isolations.iter().all(|i| i.probes.backwards == 0 && i.probes.alternate_reads > 0),
        detail: format!(
            "a client alternating members with blocking queries at its highest index: {}",
            each(&|i| format!(
                "{} answered, {} refused, {} went back{}",
                i.probes.alternate_reads,
                i.probes.alternate_refused,
                i.probes.backwards,
                if i.probes.details.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", i.probes.details.join("; "))
                }
            ))
        ),
    });
    out
}

/// `restored`: every restore of a backup brought the DC's group back whole (the first
/// member serving alone, each other one added and caught up), and the restored DC took an
/// epoch above the one it had when backed up.
fn restore_expectation(s: &Seen<'_>) -> Expectation {
    let planned = s.plan.actions.iter().filter(|a| matches!(a.action, Action::Restore { .. })).count();
    let nodes = s.restores.iter().map(|r| r.members).max().unwrap_or(0);
    let bad: Vec<String> = s
        .restores
        .iter()
        .filter(|r| r.members != nodes || r.epoch.1.is_none_or(|e| e <= r.epoch.0))
        .map(|r| format!("{}: {} members, epoch {} -> {:?}", r.dc, r.members, r.epoch.0, r.epoch.1))
        .collect();
    Expectation {
        name: "restored".into(),
        passed: planned > 0 && s.restores.len() == planned && bad.is_empty(),
        detail: format!(
            "{} of {planned} restores brought the DC back whole in a new epoch{}: {}",
            s.restores.len(),
            if bad.is_empty() { String::new() } else { format!(" (not: {})", bad.join("; ")) },
            s.restores
                .iter()
                .map(|r| format!(
                    "{} backup {}ms {}B, restore {}ms, serving {}ms, joined {}ms",
                    r.dc, r.backup_ms, r.bytes, r.restore_ms, r.serving_ms, r.joined_ms
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
