//! Discovery observations (`GET /v1/services/{ns}/{svc}`, `?dc=all` or the policy answer):
//! availability, ownership, the watch index, and each instance's presence and absence.

use std::collections::BTreeSet;

use super::state::Seen;
use super::{Checker, InstanceRef, Invariant, Ms, Timed};

/// One instance in a `?dc=all` answer.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ObservedInstance {
    pub id: String,
    pub owner_dc: String,
    pub seq: u64,
    pub status: String,
    pub health: String,
    pub stale: bool,
    /// Flap damping holds its published health.
    pub damped: bool,
}

/// A discovery answer.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServiceView {
    pub index: u64,
    pub instances: Vec<ObservedInstance>,
}

/// Which discovery was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewScope {
    /// `?dc=all`: the raw replicated view, every owner, no policy.
    All,
    /// No filter: the failover policy's answer (checked for availability and ownership only).
    Policy,
}

#[derive(Clone, Debug)]
pub struct ViewObservation {
    pub dc: String,
    pub service: String,
    pub scope: ViewScope,
    pub invoked: Ms,
    pub completed: Ms,
    pub result: Result<ServiceView, String>,
}

impl Checker {
    pub fn observe_view(&mut self, obs: ViewObservation) {
        self.push(Timed::View(obs));
    }

    pub(super) fn judge_view(&mut self, o: ViewObservation) {
        let grace = self.cfg.availability_grace_ms;
        let Some(st) = self.dcs.get_mut(&o.dc) else { return };
        let view = match &o.result {
            Ok(v) => {
                st.polls_ok += 1;
                v.clone()
            }
            Err(e) => {
                if st.down_during(o.invoked, o.completed, grace) {
                    st.polls_failed_excused += 1;
                } else {
                    st.polls_failed += 1;
                    let summary = format!(
                        "discovery of {} ({:?}) failed while the process was up: {e}",
                        o.service, o.scope
                    );
                    let obs = vec![format!(
                        "{}..{}ms {} GET {} failed: {e}",
                        o.invoked, o.completed, o.dc, o.service
                    )];
                    self.violate(Invariant::Availability, o.completed, Some(&o.dc), None, summary, obs);
                }
                self.bump_check(Invariant::Availability);
                return;
            }
        };
        self.bump_check(Invariant::Availability);
        self.views_judged += 1;
        let dc = o.dc.clone();
        let t = o.invoked;
        let tag = format!("{}..{}ms {} view of {}", o.invoked, o.completed, dc, o.service);

        // Ownership and phantom instances (both scopes).
        for i in &view.instances {
            self.bump_check(Invariant::Ownership);
            let r = InstanceRef::new(&o.service, &i.id);
            match self.insts.get(&r) {
                None => {
                    self.violate(
                        Invariant::Ownership,
                        o.completed,
                        Some(&dc),
                        Some(&r),
                        format!(
                            "instance observed (owner_dc {}) that no client operation registered",
                            i.owner_dc
                        ),
                        vec![format!("{tag}: present, owner {} seq {}", i.owner_dc, i.seq)],
                    );
                }
                Some(inst) if inst.owner != i.owner_dc => {
                    let owner = inst.owner.clone();
                    self.violate(
                        Invariant::Ownership,
                        o.completed,
                        Some(&dc),
                        Some(&r),
                        format!("registered at {owner} but observed with owner_dc {}", i.owner_dc),
                        vec![format!("{tag}: present, owner {} seq {}", i.owner_dc, i.seq)],
                    );
                }
                Some(inst) if inst.reg_failed && inst.reg_acked.is_none() => {
                    self.violate(
                        Invariant::Ownership,
                        o.completed,
                        Some(&dc),
                        Some(&r),
                        "a registration the registry refused (or that was never sent) took effect".into(),
                        vec![format!("{tag}: present, seq {}", i.seq)],
                    );
                }
                Some(_) => {}
            }
        }
        if o.scope == ViewScope::Policy {
            return;
        }
        let Some(st) = self.dcs.get_mut(&dc) else { return };
        st.latest_views.insert(o.service.clone(), (o.invoked, view.clone()));

        // Watch index (a read that either history may have answered sets no baseline).
        let prev_index = st.index.get(&o.service).copied();
        if !st.history_in_doubt(o.invoked) {
            st.index.insert(o.service.clone(), (o.completed, view.index));
        }
        self.bump_check(Invariant::MonotonicApply);
        if let Some((pt, pi)) = prev_index {
            if pt <= o.invoked && view.index < pi {
                self.violate(
                    Invariant::MonotonicApply,
                    o.completed,
                    Some(&dc),
                    None,
                    format!("watch index of {} went back from {pi} to {}", o.service, view.index),
                    vec![format!("{pt}ms: index {pi}"), format!("{tag}: index {}", view.index)],
                );
            }
        }

        self.judge_health(&o, &view.instances);
        self.judge_view_staleness(&o, &view.instances);
        if self.cfg.reused_services.contains(&o.service) {
            return;
        }

        // Presence.
        let mut now_present: BTreeSet<String> = BTreeSet::new();
        for i in &view.instances {
            now_present.insert(i.id.clone());
            let r = InstanceRef::new(&o.service, &i.id);
            self.judge_present(&dc, &r, i, &tag, o.invoked, o.completed);
        }
        // Absence: instances believed present here, and acked ones the owner must show.
        let mut candidates: BTreeSet<String> =
            self.dcs.get(&dc).and_then(|s| s.present.get(&o.service)).cloned().unwrap_or_default();
        if let Some(ids) = self.by_service.get(&o.service) {
            for id in ids {
                let r = InstanceRef::new(&o.service, id);
                if let Some(inst) = self.insts.get(&r) {
                    if inst.owner == dc
                        && inst.reg_acked.is_some_and(|a| a < t)
                        && inst.removal_invoked.is_none_or(|x| x > t)
                    {
                        candidates.insert(id.clone());
                    }
                }
            }
        }
        for id in candidates.difference(&now_present) {
            let r = InstanceRef::new(&o.service, id);
            self.judge_absent(&dc, &r, &tag, t, o.completed);
        }
        if let Some(st) = self.dcs.get_mut(&dc) {
            st.present.insert(o.service.clone(), now_present);
        }
    }

    fn judge_present(
        &mut self,
        dc: &str,
        r: &InstanceRef,
        i: &ObservedInstance,
        tag: &str,
        t: Ms,
        completed: Ms,
    ) {
        let Some(inst) = self.insts.get_mut(r) else { return };
        if inst.rewound.is_some() {
            return;
        }
        let owner = inst.owner.clone();
        let reg_invoked = inst.reg_invoked;
        let dereg_acked = inst.dereg_acked;
        let line = format!("{tag}: present, seq {} status {} health {}", i.seq, i.status, i.health);
        let d = inst.dc(dc);
        let mut problems: Vec<(Invariant, String)> = Vec::new();
        if d.seen == Seen::Gone {
            problems
                .push((Invariant::NoResurrection, "observed again after it had been observed gone".into()));
        }
        if let Some((pt, why)) = d.tomb_passed.clone() {
            if pt <= t {
                problems.push((Invariant::NoResurrection, format!("observed after {why} (at {pt}ms)")));
            }
        }
        if let Some((pt, why)) = d.epoch_moved.clone() {
            if pt <= t {
                problems.push((Invariant::NoResurrection, format!("observed after {why} (at {pt}ms)")));
            }
        }
        if let Some((last_t, last)) = d.last_seq {
            if i.seq < last && last_t <= t {
                problems
                    .push((Invariant::MonotonicApply, format!("its seq went back from {last} to {}", i.seq)));
            }
        }
        if d.seen != Seen::Present {
            d.note(line.clone());
        }
        d.seen = if d.seen == Seen::Gone { Seen::Gone } else { Seen::Present };
        d.last_seq = Some((completed, d.last_seq.map_or(i.seq, |(_, s)| s.max(i.seq))));
        // At the owner: an acked deregistration is final.
        if dc == owner {
            if let Some((a, v)) = dereg_acked {
                if a < t {
                    problems.push((
                        Invariant::NoResurrection,
                        format!(
                            "its owner still shows it after acknowledging its deregistration (v{v}) at {a}ms"
                        ),
                    ));
                }
            }
            if let Some(h) = self.dcs.get(dc).and_then(|s| s.history_lost_before_read(reg_invoked, t)) {
                problems.push((
                    Invariant::NoResurrection,
                    format!("registered before its owner lost its history at {h}ms, yet back at the owner"),
                ));
            }
        }
        for _ in 0..problems.len().max(1) {
            self.bump_check(Invariant::NoResurrection);
        }
        for (inv, why) in problems {
            let mut obs =
                self.insts.get(r).and_then(|x| x.per_dc.get(dc)).map(|d| d.notes.clone()).unwrap_or_default();
            obs.push(line.clone());
            self.violate(inv, completed, Some(dc), Some(r), why, obs);
        }
    }

    fn judge_absent(&mut self, dc: &str, r: &InstanceRef, tag: &str, t: Ms, completed: Ms) {
        let Some(inst) = self.insts.get_mut(r) else { return };
        if inst.rewound.is_some() {
            return;
        }
        let owner = inst.owner.clone();
        let line = format!("{tag}: absent");
        let d = inst.dc(dc);
        if d.seen == Seen::Present {
            d.seen = Seen::Gone;
            d.note(line.clone());
        }
        if dc != owner {
            return;
        }
        self.bump_check(Invariant::NoLostAck);
        if self.legitimately_absent_at_owner(r, completed).is_some() {
            return;
        }
        let mut obs =
            self.insts.get(r).and_then(|x| x.per_dc.get(dc)).map(|d| d.notes.clone()).unwrap_or_default();
        if obs.last() != Some(&line) {
            obs.push(line);
        }
        let _ = t;
        self.violate(
            Invariant::NoLostAck,
            completed,
            Some(dc),
            Some(r),
            "its owner acknowledged the registration, nothing removed it and its lease could not have expired, yet the owner's view lacks it".into(),
            obs,
        );
    }
}
