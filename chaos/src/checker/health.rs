//! The **lease-health** invariant: what the owner DC publishes about an ephemeral instance's
//! health and lease, judged from the client's own renewals.
//!
//! Each instance has a *life*: the renewals the owner acknowledged (registrations and
//! heartbeats, with their invocation and completion times) and its *quiet periods*, when
//! the client had stopped heartbeating it (a StopHeartbeat, a deregistration, the end of an
//! id race) and no request on it was in flight. The owner's lease rules (`src/health/`,
//! with the lease times `ttl/4`, `ttl/2`, `ttl`: S, U, E) then bound what its `?dc=all`
//! view may show. All bounds are conservative: a renewal is placed anywhere in its
//! request's [invocation, completion], a read anywhere in its poll's.
//!
//! Live (client heartbeating), the instance must be **healthy** at a read when the acked
//! renewals before the read form a *chain*: each renewal was processed by the owner's
//! current process (invoked after its last spawn), consecutive ones are less than
//! `S - tolerance` apart (completion of the later minus invocation of the earlier), the
//! read ends less than `S - tolerance` after the last one was invoked, and the chain either
//! reaches back to a registration (a new lease starts Healthy) or holds `2 x
//! recovery_heartbeats` renewals (the slow way back: Unhealthy needs `recovery_heartbeats`
//! consecutive heartbeats to become Suspect and as many again to become Healthy), the one
//! that completes it acknowledged `commit_slack_ms` before the read. A damped instance
//! (flap damping holds its published health) is excused and counted.
//!
//! A new leader of the owner's group (`LeaderServing`) counts as a spawn and a Ready: it
//! starts every lease over from its published health with a full TTL of grace, and checks
//! no lease between `LeaderLost` and then.
//!
//! Dead (in a quiet period that began at `from`): the lease's last renewal was at most at
//! `renew = max(from, the last Ready of the owner (a restart gives a full TTL of grace),
//! the end of a pause that began before from + 200 ms (a request held by a paused process
//! is served when it resumes))`. At a read from an owner that ran (neither killed nor
//! paused) for the last lease check interval plus tolerance before it:
//! - silence `>= S` (as of the previous lease check, less `commit_slack_ms`): not healthy;
//!   silence `>= U`: unhealthy (a damped instance is excused: damping holds the health);
//! - its health never improves within the quiet period (nothing renewed it), also across a
//!   kill -9 and restart of the owner (a lease resumes at the stored health), and a reused
//!   id observed gone does not come back without a registration;
//! - it is absent once a status sample of the owner shows self-preservation inactive at a
//!   lease check past `renew + E` (then that check expired it), plus `commit_slack_ms`.
//!   Self-preservation may pause expiry: the checker only judges expiry through such a
//!   sample, so a paused namespace is never blamed.

use std::collections::VecDeque;

use super::ops::OpKind;
use super::state::DcState;
use super::{Checker, InstanceRef, Invariant, Ms, ObservedInstance, Outcome, ProcessEvent, ViewObservation};

/// Renewals kept per instance (at 5 per second, the last 12 s: more than the checker's
/// hold plus a chain).
const RENEWALS_KEPT: usize = 64;
/// Renewals of unknown outcome kept per instance.
const UNCERTAIN_KEPT: usize = 8;
/// Quiet periods kept per instance.
const QUIET_KEPT: usize = 8;
/// Self-preservation samples kept per DC (at 10 per second, a minute).
const PRESERVATION_SAMPLES_KEPT: usize = 600;

/// The owners' lease rules, as the drill configured them.
#[derive(Clone, Debug)]
pub struct HealthRules {
    /// The config's lease times; a TTL other than `expire_ms` uses `ttl/4`, `ttl/2`, `ttl`.
    pub suspect_ms: Ms,
    pub unhealthy_ms: Ms,
    pub expire_ms: Ms,
    pub recovery_heartbeats: u32,
    /// The owner's lease check interval.
    pub check_interval_ms: Ms,
    /// Clock granularity and scheduling slack on the chain's gaps.
    pub tolerance_ms: Ms,
    /// Time for a decided change (health, expiry) to be committed and shown.
    pub commit_slack_ms: Ms,
}

impl HealthRules {
    /// The drills' settings (docs/chaos.md, node settings in the sandbox).
    pub fn sandbox() -> HealthRules {
        HealthRules {
            suspect_ms: 600,
            unhealthy_ms: 1_200,
            expire_ms: 2_400,
            recovery_heartbeats: 2,
            check_interval_ms: 100,
            tolerance_ms: 50,
            commit_slack_ms: 500,
        }
    }

    fn times(&self, ttl_ms: Ms) -> (Ms, Ms, Ms) {
        if ttl_ms == self.expire_ms || ttl_ms == 0 {
            (self.suspect_ms, self.unhealthy_ms, self.expire_ms)
        } else {
            let ttl = ttl_ms.max(600);
            (ttl / 4, ttl / 2, ttl)
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Renewal {
    invoked: Ms,
    completed: Ms,
    /// A registration: the lease starts Healthy.
    base: bool,
}

#[derive(Clone, Debug)]
struct Quiet {
    from: Ms,
    until: Option<Ms>,
    /// Worst health shown by the owner in this period: (completed, rank, line).
    worst: Option<(Ms, u8, String)>,
}

/// What the checker knows of one instance's renewals and silences.
#[derive(Debug, Default)]
pub(super) struct Life {
    heartbeated: bool,
    inflight: u32,
    busy_until: Ms,
    renewals: VecDeque<Renewal>,
    /// Renewals whose outcome is unknown (a timeout, a lost connection): each may have
    /// landed at any time until its request could no longer be served.
    uncertain: VecDeque<Renewal>,
    quiet: VecDeque<Quiet>,
}

impl Life {
    pub(super) fn on_invoke(&mut self, kind: &OpKind, at: Ms) {
        self.inflight += 1;
        if let Some(q) = self.quiet.back_mut() {
            if q.until.is_none() {
                q.until = Some(at);
            }
        }
        match kind {
            OpKind::Register { persistent: false, .. } => self.heartbeated = true,
            OpKind::Deregister => self.heartbeated = false,
            _ => {}
        }
    }

    pub(super) fn on_complete(&mut self, kind: &OpKind, invoked: Ms, at: Ms, outcome: &Outcome) {
        self.inflight = self.inflight.saturating_sub(1);
        self.busy_until = self.busy_until.max(at);
        let base = matches!(kind, OpKind::Register { persistent: false, .. });
        if base || *kind == OpKind::Heartbeat {
            let renewal = Renewal { invoked, completed: at, base };
            match outcome {
                Outcome::Acked { .. } => {
                    let pos = self.renewals.partition_point(|r| r.invoked <= invoked);
                    self.renewals.insert(pos, renewal);
                    if self.renewals.len() > RENEWALS_KEPT {
                        self.renewals.pop_front();
                    }
                }
                Outcome::Unknown { .. } | Outcome::Pending => {
                    self.uncertain.push_back(renewal);
                    if self.uncertain.len() > UNCERTAIN_KEPT {
                        self.uncertain.pop_front();
                    }
                }
                Outcome::Failed { .. } => {}
            }
        }
        self.maybe_quiet();
    }

    /// The client stopped heartbeating at `at`.
    pub(super) fn stop(&mut self, at: Ms) {
        self.heartbeated = false;
        self.busy_until = self.busy_until.max(at);
        self.maybe_quiet();
    }

    fn maybe_quiet(&mut self) {
        if self.heartbeated || self.inflight > 0 || self.quiet.back().is_some_and(|q| q.until.is_none()) {
            return;
        }
        self.quiet.push_back(Quiet { from: self.busy_until, until: None, worst: None });
        if self.quiet.len() > QUIET_KEPT {
            self.quiet.pop_front();
        }
    }

    fn quiet_at(&mut self, from: Ms, to: Ms) -> Option<&mut Quiet> {
        self.quiet.iter_mut().rev().find(|q| q.covers(from, to))
    }

    fn quiet_covering(&self, from: Ms, to: Ms) -> Option<&Quiet> {
        self.quiet.iter().rev().find(|q| q.covers(from, to))
    }
}

impl Quiet {
    /// Whether a read invoked at `from` and completed at `to` falls in this silence. A read
    /// invoked in the millisecond the silence began is not known to follow the operation
    /// that ended at that millisecond (a registration acknowledged then may land after the
    /// read was served), so it is not judged as a read of the silence.
    fn covers(&self, from: Ms, to: Ms) -> bool {
        self.from < from && self.until.is_none_or(|u| u >= to)
    }
}

fn rank(health: &str) -> u8 {
    match health {
        "healthy" => 0,
        "suspect" => 1,
        _ => 2,
    }
}

const GONE: u8 = 3;

fn rank_name(r: u8) -> &'static str {
    ["healthy", "suspect", "unhealthy", "gone"][usize::from(r.min(GONE))]
}

impl DcState {
    fn last_event_before(&self, ev: ProcessEvent, t: Ms) -> Option<Ms> {
        self.events.iter().rev().find(|(at, e)| *e == ev && *at <= t).map(|(at, _)| *at)
    }

    fn first_resume_after(&self, t: Ms) -> Option<Ms> {
        self.events.iter().find(|(at, e)| *e == ProcessEvent::Resumed && *at >= t).map(|(at, _)| *at)
    }

    fn resumed_after(&self, t: Ms) -> Option<Ms> {
        self.events.iter().filter(|(at, e)| *e == ProcessEvent::Resumed && *at >= t).map(|(at, _)| *at).max()
    }
}

impl Checker {
    /// Records a self-preservation sample of `dc` (from a status answer, at observation).
    pub(super) fn preservation_sample(&mut self, dc: &str, invoked: Ms, completed: Ms, active: bool) {
        let q = self.preservation.entry(dc.to_owned()).or_default();
        q.push_back((invoked, completed, active));
        if q.len() > PRESERVATION_SAMPLES_KEPT {
            q.pop_front();
        }
    }

    /// The client of `instance` stopped heartbeating it without telling the workload's
    /// schedule (its owner answered 404, or an id race ended).
    pub fn heartbeats_ended(&mut self, instance: &InstanceRef, at: Ms) {
        if let Some(i) = self.insts.get_mut(instance) {
            i.life.stop(at);
        }
    }

    /// Judges the health and lease of the owner's instances in an `?dc=all` view.
    pub(super) fn judge_health(&mut self, o: &ViewObservation, present: &[ObservedInstance]) {
        let Some(rules) = self.cfg.health.clone() else { return };
        let reused = self.cfg.reused_services.contains(&o.service);
        let mut refs: Vec<(InstanceRef, Option<ObservedInstance>)> = present
            .iter()
            .filter(|i| i.owner_dc == o.dc)
            .map(|i| (InstanceRef::new(&o.service, &i.id), Some(i.clone())))
            .collect();
        if reused {
            let ids = self.by_service.get(&o.service).cloned().unwrap_or_default();
            for id in ids {
                if !present.iter().any(|i| i.id == id) {
                    refs.push((InstanceRef::new(&o.service, &id), None));
                }
            }
        }
        for (r, shown) in refs {
            self.judge_one(&rules, o, &r, shown.as_ref(), reused);
        }
    }

    fn judge_one(
        &mut self,
        rules: &HealthRules,
        o: &ViewObservation,
        r: &InstanceRef,
        shown: Option<&ObservedInstance>,
        reused: bool,
    ) {
        let Some(st) = self.dcs.get(&o.dc) else { return };
        let Some(inst) = self.insts.get(r) else { return };
        if inst.persistent || inst.owner != o.dc || inst.rewound.is_some() {
            return;
        }
        let (s_ms, u_ms, e_ms) = rules.times(inst.ttl_ms);
        let check = rules.check_interval_ms;
        let slack = rules.commit_slack_ms;
        // The owner ran its lease checks up to the read (else only the never-better rule).
        let (from, grace) =
            (o.invoked.saturating_sub(check + rules.tolerance_ms), check + rules.tolerance_ms);
        let ran =
            !st.down_during(from, o.completed, grace) && !st.leaderless_during(from, o.completed, grace);
        // A new leader starts every lease over, as a restart does.
        let took_over = |t: Ms| st.last_event_before(ProcessEvent::LeaderServing, t).unwrap_or(0);
        let spawned =
            st.last_event_before(ProcessEvent::Spawned, o.invoked).unwrap_or(0).max(took_over(o.invoked));
        let ready =
            st.last_event_before(ProcessEvent::Ready, o.completed).unwrap_or(0).max(took_over(o.completed));
        let tag = format!("{}..{}ms {} view of {}", o.invoked, o.completed, o.dc, o.service);
        let line = shown.map_or(format!("{tag}: absent"), |i| {
            format!(
                "{tag}: present, seq {} health {}{}",
                i.seq,
                i.health,
                if i.damped { " (damped)" } else { "" }
            )
        });
        let mut problems: Vec<String> = Vec::new();
        let resumed = |from: Ms| st.resumed_after(from.saturating_sub(2_000)).map_or(0, |t| t + 200);
        let quiet_from = self.insts.get(r).and_then(|i| i.life.quiet_covering(o.invoked, o.completed));
        // The latest moment a renewal of unknown outcome invoked before the read may have
        // landed: a request held by a paused owner is served when it resumes.
        let uncertain = self.insts.get(r).map_or(0, |i| {
            i.life
                .uncertain
                .iter()
                .filter(|u| u.invoked <= o.invoked)
                .map(|u| {
                    let held = st.down_during(u.invoked, u.completed, 0);
                    let resume =
                        if held { st.first_resume_after(u.invoked).map_or(0, |t| t + 200) } else { 0 };
                    let by = resume.max(u.completed);
                    (by + slack).min(o.completed)
                })
                .max()
                .unwrap_or(0)
        });
        let mut restart_worst = false;
        if let Some(q) = quiet_from {
            let renew = q.from.max(ready).max(resumed(q.from)).max(uncertain);
            let due_at = o.invoked.saturating_sub(check + slack);
            let silence = due_at.saturating_sub(renew);
            let worst = q.worst.clone();
            // Expiry: a status sample showing expiry not paused at a check past the deadline.
            let deadline = renew + e_ms;
            let unpaused = self.preservation.get(&o.dc).and_then(|samples| {
                samples
                    .iter()
                    .find(|(inv, comp, active)| {
                        !*active
                            && inv.saturating_sub(check + rules.tolerance_ms) > deadline
                            && comp + slack <= o.invoked
                    })
                    .copied()
            });
            if let Some(i) = shown {
                {
                    let now = rank(&i.health);
                    if let Some((wt, wr, wline)) = &worst {
                        if *wt <= o.invoked && now < *wr && *wt < uncertain {
                            // A renewal of unknown outcome may have landed after that read.
                            restart_worst = true;
                        } else if *wt <= o.invoked && now < *wr {
                            problems.push(format!(
                                "its health improved from {} to {} while nothing renewed its lease (quiet since {}ms; earlier: {wline})",
                                rank_name(*wr),
                                i.health,
                                q.from
                            ));
                        }
                    }
                    if !ran {
                        // Silence and expiry need the lease checks to have run.
                    } else if !i.damped && silence >= u_ms && now < 2 {
                        problems.push(format!(
                            "still {} {silence}ms after its last possible renewal at {renew}ms (unhealthy after {u_ms}ms of silence)",
                            i.health
                        ));
                    } else if !i.damped && silence >= s_ms && now == 0 {
                        problems.push(format!(
                            "still healthy {silence}ms after its last possible renewal at {renew}ms (suspect after {s_ms}ms of silence)"
                        ));
                    }
                    if let Some((inv, comp, _)) = unpaused.filter(|_| ran) {
                        problems.push(format!(
                            "outlived its lease: no renewal since {renew}ms, TTL {e_ms}ms, and the owner's status at {inv}..{comp}ms shows lease expiry not paused"
                        ));
                    }
                }
            }
            let new_rank = shown.map_or(GONE, |i| rank(&i.health));
            if let Some(q) = self.insts.get_mut(r).and_then(|i| i.life.quiet_at(o.invoked, o.completed)) {
                if restart_worst || q.worst.as_ref().is_none_or(|w| w.1 < new_rank) {
                    q.worst = Some((o.completed, new_rank, line.clone()));
                }
            }
            self.bump_check(Invariant::LeaseHealth);
            if let (Some(_), Some((wt, GONE, wline))) = (shown, &worst) {
                if *wt <= o.invoked && reused && *wt >= uncertain {
                    problems.push(format!(
                        "back after its owner's view had lost it ({wline}), with no registration since"
                    ));
                }
            }
        } else if let Some(i) = shown {
            // Live: a chain of renewals proves it Healthy.
            let Some(inst) = self.insts.get(r) else { return };
            let tol = rules.tolerance_ms;
            let chain: Vec<Renewal> = {
                let mut out: Vec<Renewal> = Vec::new();
                for rn in inst.life.renewals.iter().rev() {
                    if rn.completed > o.invoked {
                        continue;
                    }
                    if rn.invoked < spawned {
                        break;
                    }
                    let gap_ok = match out.last() {
                        None => o.completed.saturating_sub(rn.invoked) + tol < s_ms,
                        Some(later) => later.completed.saturating_sub(rn.invoked) + tol < s_ms,
                    };
                    if !gap_ok {
                        break;
                    }
                    out.push(*rn);
                    if rn.base {
                        break;
                    }
                }
                out
            };
            let need = 2 * rules.recovery_heartbeats as usize;
            let proven = match chain.last() {
                Some(first) if first.base => Some(first.completed),
                _ if chain.len() >= need => Some(chain[chain.len() - need].completed + slack),
                _ => None,
            };
            if let Some(p) = proven.filter(|p| *p <= o.invoked && ran) {
                self.bump_check(Invariant::LeaseHealth);
                if i.damped {
                    self.damped_excused += 1;
                } else if i.health != "healthy" {
                    let renewals: Vec<String> = chain
                        .iter()
                        .rev()
                        .map(|rn| {
                            format!(
                                "{} {}..{}ms",
                                if rn.base { "registration" } else { "heartbeat" },
                                rn.invoked,
                                rn.completed
                            )
                        })
                        .collect();
                    problems.push(format!(
                        "{} although its client renewed it without a gap of {s_ms}ms since {}ms (healthy from {p}ms at the latest): {}",
                        i.health,
                        chain.last().map_or(0, |x| x.invoked),
                        renewals.join(", ")
                    ));
                }
            }
        }
        for why in problems {
            self.violate(Invariant::LeaseHealth, o.completed, Some(&o.dc), Some(r), why, vec![line.clone()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drill's false violation (rolling-upgrade, seed 1): a read invoked in the
    /// millisecond a registration was acknowledged saw the instance absent (served before
    /// the registration landed) and was judged as a read of the silence after it; the next
    /// read, healthy, then counted as an improvement "while nothing renewed its lease".
    #[test]
    fn a_read_in_the_millisecond_a_silence_began_is_not_a_read_of_it() {
        let acked = Outcome::Acked { version: Some(1), epoch: Some(1) };
        let mut life = Life::default();
        let register = OpKind::Register { persistent: false, ttl_ms: 2_400 };
        life.on_invoke(&register, 10);
        life.on_invoke(&OpKind::Deregister, 11);
        life.on_complete(&OpKind::Deregister, 11, 15, &acked);
        life.on_complete(&register, 10, 20, &acked);
        assert!(life.quiet_covering(20, 20).is_none(), "a read at the silence's first millisecond");
        assert!(life.quiet_at(20, 25).is_none());
        assert!(life.quiet_covering(21, 25).is_some(), "a read after it is a read of the silence");
        assert!(life.quiet_at(21, 25).is_some());
    }
}
