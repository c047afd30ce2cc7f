//! The verdict: the invariants, violations with their counterexamples, the report, and
//! [`Checker::finish`], which judges the end state (convergence, acked writes at the end,
//! bounded recovery) and assembles the report.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{
    digest, divergence, view_set, Checker, InstanceRef, Ms, Outcome, ServiceView, StatusView, ViewEntry,
};

/// The invariants, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    NoResurrection,
    Convergence,
    NoLostAck,
    MonotonicApply,
    Ownership,
    Availability,
    BoundedRecovery,
    LeaseHealth,
    Staleness,
}

impl Invariant {
    pub const ALL: [Invariant; 9] = [
        Invariant::NoResurrection,
        Invariant::Convergence,
        Invariant::NoLostAck,
        Invariant::MonotonicApply,
        Invariant::Ownership,
        Invariant::Availability,
        Invariant::BoundedRecovery,
        Invariant::LeaseHealth,
        Invariant::Staleness,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Invariant::NoResurrection => "no-resurrection",
            Invariant::Convergence => "convergence",
            Invariant::NoLostAck => "no-lost-ack",
            Invariant::MonotonicApply => "monotonic-apply",
            Invariant::Ownership => "ownership",
            Invariant::Availability => "availability",
            Invariant::BoundedRecovery => "bounded-recovery",
            Invariant::LeaseHealth => "lease-health",
            Invariant::Staleness => "staleness",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A broken invariant with its counterexample: the instance, the operations on it and the
/// observations that show the violation, with times.
#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: Invariant,
    /// When it was observed.
    pub at: Ms,
    pub dc: Option<String>,
    pub instance: Option<InstanceRef>,
    pub summary: String,
    pub ops: Vec<String>,
    pub observations: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] at {}ms", self.invariant, self.at)?;
        if let Some(dc) = &self.dc {
            write!(f, " in {dc}")?;
        }
        if let Some(i) = &self.instance {
            write!(f, ", instance {i}")?;
        }
        writeln!(f, ": {}", self.summary)?;
        if !self.ops.is_empty() {
            writeln!(f, "  operations:")?;
            for o in &self.ops {
                writeln!(f, "    {o}")?;
            }
        }
        if !self.observations.is_empty() {
            writeln!(f, "  observations:")?;
            for o in &self.observations {
                writeln!(f, "    {o}")?;
            }
        }
        Ok(())
    }
}

/// The verdict on one invariant.
#[derive(Clone, Debug)]
pub struct InvariantResult {
    pub invariant: Invariant,
    pub passed: bool,
    /// How many individual checks ran (observations, instances, marks judged).
    pub checks: u64,
    /// One line on what was checked.
    pub detail: String,
    pub violations_total: u64,
    /// The first violations, in detail.
    pub violations: Vec<Violation>,
}

/// One recovery point and how long the DCs took to catch up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryResult {
    pub label: String,
    pub at: Ms,
    /// Time from the recovery point until every DC's applied mark of every other DC reached
    /// that DC's position at the recovery point.
    pub catch_up_ms: Option<Ms>,
    /// The next fault started first (after this many ms), so the budget did not apply.
    pub interrupted_after_ms: Option<Ms>,
}

/// Counts of operations by kind and outcome (`acked`, `failed`, `unknown`: all but heartbeats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub registers: u64,
    pub deregisters: u64,
    pub status_changes: u64,
    pub heartbeats: u64,
    pub acked: u64,
    pub failed: u64,
    pub unknown: u64,
    pub heartbeats_acked: u64,
    /// Heartbeats answered with an error (404 included) or never sent.
    pub heartbeats_failed: u64,
    /// Heartbeats that timed out or lost their connection.
    pub heartbeats_unknown: u64,
    /// Heartbeats answered 404 (the owner does not know the instance).
    pub heartbeats_unknown_instance: u64,
    pub lease_stops: u64,
}

/// The result of [`Checker::finish`].
#[derive(Clone, Debug)]
pub struct CheckReport {
    pub invariants: Vec<InvariantResult>,
    pub recoveries: Vec<RecoveryResult>,
    pub ops: OpCounts,
    /// Per DC: the digest and size of its final replicated view.
    pub final_digests: BTreeMap<String, (u64, usize)>,
    /// Observations judged: (views, statuses); and observations that arrived later than the
    /// hold allowed (judged anyway, out of order).
    pub observations: (u64, u64),
    pub observations_late: u64,
    /// Instances created by the workload, and those still present in every DC at the end.
    pub instances: u64,
    pub instances_final: usize,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.invariants.iter().all(|r| r.passed)
    }

    pub fn result(&self, inv: Invariant) -> Option<&InvariantResult> {
        self.invariants.iter().find(|r| r.invariant == inv)
    }

    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.invariants.iter().flat_map(|r| r.violations.iter())
    }
}

#[derive(Debug, Default)]
struct FinalFacts {
    digests: BTreeMap<String, (u64, usize)>,
    instances_final: usize,
}

impl Checker {
    /// Judges everything still queued, then the end-state invariants on the latest views
    /// and statuses, which must have been invoked at or after `final_from` (after the final
    /// heal and quiescence).
    pub fn finish(mut self, final_from: Ms) -> CheckReport {
        while let Some(Reverse(q)) = self.queue.pop() {
            self.judge(q.item);
        }
        for op in &mut self.ops {
            if op.outcome == Outcome::Pending {
                op.outcome = Outcome::Unknown { message: "never completed".into() };
            }
        }
        let dcs = self.cfg.dcs.clone();
        let mut facts = FinalFacts::default();

        // Convergence.
        let mut finals: Vec<(String, BTreeSet<ViewEntry>, StatusView, BTreeSet<InstanceRef>)> = Vec::new();
        let mut missing: Vec<String> = Vec::new();
        for dc in &dcs {
            let Some(st) = self.dcs.get(dc) else { continue };
            let fresh: Vec<(&String, &ServiceView)> = st
                .latest_views
                .iter()
                .filter(|(_, (t, _))| *t >= final_from)
                .map(|(k, (_, v))| (k, v))
                .collect();
            let services_known: Vec<&String> = self.by_service.keys().collect();
            let fresh_names: BTreeSet<&String> = fresh.iter().map(|(k, _)| *k).collect();
            for s in services_known {
                if !fresh_names.contains(s) {
                    missing.push(format!("{dc}: no view of service {s} taken after {final_from}ms"));
                }
            }
            let status = match &st.latest_status {
                Some((t, s)) if *t >= final_from => s.clone(),
                _ => {
                    missing.push(format!("{dc}: no status taken after {final_from}ms"));
                    StatusView::default()
                }
            };
            let set = view_set(fresh.iter().copied());
            let refs: BTreeSet<InstanceRef> = set.iter().map(|e| InstanceRef::new(&e.0, &e.2)).collect();
            facts.digests.insert(dc.clone(), (digest(&set), set.len()));
            finals.push((dc.clone(), set, status, refs));
        }
        self.bump_check(Invariant::Convergence);
        if !missing.is_empty() {
            self.violate(
                Invariant::Convergence,
                final_from,
                None,
                None,
                "the final views were not all observed, so convergence cannot be shown".into(),
                missing,
            );
        } else {
            for i in 0..finals.len() {
                for j in (i + 1)..finals.len() {
                    let (a, b) = (&finals[i], &finals[j]);
                    if let Some(diff) = divergence((&a.0, &a.1, &a.2), (&b.0, &b.1, &b.2), 10) {
                        let summary = format!(
                            "{} and {} did not converge: digests {:016x} ({} entries) vs {:016x} ({} entries)",
                            a.0,
                            b.0,
                            digest(&a.1),
                            a.1.len(),
                            digest(&b.1),
                            b.1.len()
                        );
                        self.violate(Invariant::Convergence, final_from, None, None, summary, diff);
                    }
                }
            }
        }
        facts.instances_final = finals.iter().map(|f| f.1.len()).min().unwrap_or(0);

        // Acked writes at the end.
        let refs: Vec<InstanceRef> = self.insts.keys().cloned().collect();
        let mut sorted = refs;
        sorted.sort();
        for r in &sorted {
            if self.cfg.reused_services.contains(&r.service) {
                continue;
            }
            let Some(inst) = self.insts.get(r) else { continue };
            if inst.rewound.is_some() {
                // Its owner went back to an older copy: only convergence judges it.
                continue;
            }
            let owner = inst.owner.clone();
            let dereg = inst.dereg_acked;
            for (dc, set, _, present) in &finals {
                let Some(st) = self.dcs.get(dc) else { continue };
                let t = st.latest_views.get(&r.service).map_or(final_from, |(t, _)| *t);
                self.checks.entry(Invariant::NoLostAck).and_modify(|c| *c += 1).or_insert(1);
                let here = present.contains(r);
                if let Some((a, v)) = dereg {
                    if here && a < t {
                        self.violate(
                            Invariant::NoLostAck,
                            t,
                            Some(dc),
                            Some(r),
                            format!("its deregistration (v{v}) was acknowledged at {a}ms, yet it is present at the end"),
                            vec![format!("final view of {dc}: present")],
                        );
                    }
                    continue;
                }
                let why = self.legitimately_absent_at_owner(r, t);
                if !here {
                    if why.is_none() {
                        self.violate(
                            Invariant::NoLostAck,
                            t,
                            Some(dc),
                            Some(r),
                            format!("acknowledged registration at {owner}, never removed and its lease could not have expired, but absent at the end"),
                            vec![format!("final view of {dc}: absent")],
                        );
                    }
                    continue;
                }
                if why.is_none() {
                    let Some(inst) = self.insts.get(r) else { continue };
                    let status = set.iter().find(|e| e.0 == r.service && e.2 == r.id).map(|e| e.4.clone());
                    let mut allowed: Vec<String> = inst.status_unknown.clone();
                    if let Some((_, s)) = &inst.status_acked {
                        allowed.push(s.clone());
                    }
                    if let Some(s) = status {
                        if !allowed.is_empty() && !allowed.contains(&s) {
                            self.violate(
                                Invariant::NoLostAck,
                                t,
                                Some(dc),
                                Some(r),
                                format!("final status {s} is none the workload set (acked or unknown: {allowed:?})"),
                                vec![format!("final view of {dc}: status {s}")],
                            );
                        }
                    }
                }
            }
        }

        // Recoveries.
        let budget = self.cfg.recovery_budget_ms;
        let mut recs = Vec::new();
        let recoveries = std::mem::take(&mut self.recoveries);
        for r in &recoveries {
            self.bump_check(Invariant::BoundedRecovery);
            let done = r.done_at();
            let res = RecoveryResult {
                label: r.label.clone(),
                at: r.at,
                catch_up_ms: done.map(|d| d - r.at),
                interrupted_after_ms: if done.is_none() {
                    r.interrupted.map(|i| i.saturating_sub(r.at))
                } else {
                    None
                },
            };
            match (done, r.interrupted) {
                (Some(d), _) if d - r.at > budget => self.violate(
                    Invariant::BoundedRecovery,
                    d,
                    None,
                    None,
                    format!(
                        "{} at {}ms: caught up after {}ms, over the budget of {budget}ms",
                        r.label,
                        r.at,
                        d - r.at
                    ),
                    Vec::new(),
                ),
                (Some(_), _) => {}
                (None, Some(_)) => {}
                (None, None) => {
                    let lagging: Vec<String> = r
                        .pairs
                        .iter()
                        .filter(|(_, p)| p.done.is_none())
                        .map(|((d, p), s)| match s.target {
                            Some((t, m)) => {
                                format!("{d} never applied {p} up to {m} (its position at {t}ms)")
                            }
                            None => format!("{p}'s position was never observed after the recovery point"),
                        })
                        .collect();
                    self.violate(
                        Invariant::BoundedRecovery,
                        r.at,
                        None,
                        None,
                        format!("{} at {}ms: the DCs never caught up (budget {budget}ms)", r.label, r.at),
                        lagging,
                    );
                }
            }
            recs.push(res);
        }

        // Verdicts.
        let mut results = Vec::new();
        for inv in Invariant::ALL {
            let (total, list) = self.violations.remove(&inv).unwrap_or((0, Vec::new()));
            let checks = self.checks.get(&inv).copied().unwrap_or(0);
            let detail = self.detail(inv, checks, &facts, &recs);
            results.push(InvariantResult {
                invariant: inv,
                passed: total == 0,
                checks,
                detail,
                violations_total: total,
                violations: list,
            });
        }
        CheckReport {
            invariants: results,
            recoveries: recs,
            ops: self.counts.clone(),
            final_digests: facts.digests.clone(),
            observations: (self.views_judged, self.statuses_judged),
            observations_late: self.late,
            instances: self.insts.len() as u64,
            instances_final: facts.instances_final,
        }
    }

    fn detail(&self, inv: Invariant, checks: u64, facts: &FinalFacts, recs: &[RecoveryResult]) -> String {
        match inv {
            Invariant::NoResurrection => {
                let deregs = self.insts.values().filter(|i| i.dereg_acked.is_some()).count();
                let rewound = if self.rewound_excused > 0 {
                    format!("; {} instances of a DC restored to an older data dir judged only by convergence", self.rewound_excused)
                } else {
                    String::new()
                };
                format!(
                    "{} instances, {deregs} acked deregistrations, {checks} presence checks{rewound}",
                    self.insts.len()
                )
            }
            Invariant::Convergence => {
                let d: Vec<String> =
                    facts.digests.iter().map(|(dc, (h, n))| format!("{dc} {h:016x}/{n}")).collect();
                format!("final digests: {}", d.join(", "))
            }
            Invariant::NoLostAck => {
                let acked = self.insts.values().filter(|i| i.reg_acked.is_some()).count();
                format!("{acked} acked registrations, {checks} checks")
            }
            Invariant::MonotonicApply => format!("{checks} index/mark checks"),
            Invariant::Ownership => format!("{checks} instance observations"),
            Invariant::Availability => {
                let (ok, excused, failed) = self.dcs.values().fold((0, 0, 0), |a, s| {
                    (a.0 + s.polls_ok, a.1 + s.polls_failed_excused, a.2 + s.polls_failed)
                });
                format!("{ok} discovery polls answered, {failed} failed while up, {excused} failed while down (excused)")
            }
            Invariant::LeaseHealth => match &self.cfg.health {
                None => "not judged (the owners' lease rules are not known)".into(),
                Some(h) => format!(
                    "{checks} owner reads judged (healthy after a chain of renewals {}ms apart, {} heartbeats or a registration; silent: suspect {}ms, unhealthy {}ms, gone {}ms after the last renewal, never better); {} damped reads excused",
                    h.suspect_ms, 2 * h.recovery_heartbeats, h.suspect_ms, h.unhealthy_ms, h.expire_ms, self.damped_excused
                ),
            },
            Invariant::Staleness => match self.cfg.stale_after_ms {
                None => "not judged (stale_after_ms is not known)".into(),
                Some(sa) => format!(
                    "{checks} reads of a peer's copies judged against stale_after_ms {sa}: {} required fresh (progress seen), {} required stale (no progress possible)",
                    self.stale.required_fresh, self.stale.required_stale
                ),
            },
            Invariant::BoundedRecovery => {
                let done: Vec<String> = recs
                    .iter()
                    .map(|r| match (r.catch_up_ms, r.interrupted_after_ms) {
                        (Some(c), _) => format!("{} {}ms", r.label, c),
                        (None, Some(i)) => format!("{} interrupted after {}ms", r.label, i),
                        (None, None) => format!("{} never", r.label),
                    })
                    .collect();
                format!(
                    "budget {}ms; {}",
                    self.cfg.recovery_budget_ms,
                    if done.is_empty() { "no recovery points".into() } else { done.join(", ") }
                )
            }
        }
    }
}
