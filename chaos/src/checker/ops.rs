//! Client operations as the checker records them: at invocation and at completion with an
//! [`Outcome`] (acked, failed, unknown), heartbeats and their lease renewals, and why an
//! instance may legitimately be absent from its owner's view.

use std::collections::BTreeMap;
use std::fmt;

use super::state::{expiry_within, DcState, Inst};
use super::{Checker, Invariant, Ms};

/// Instance ids are unique within a drill's namespace, so (service, id) names an instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceRef {
    pub service: String,
    pub id: String,
}

impl InstanceRef {
    pub fn new(service: &str, id: &str) -> InstanceRef {
        InstanceRef { service: service.to_owned(), id: id.to_owned() }
    }
}

impl fmt::Display for InstanceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.service, self.id)
    }
}

/// Identifies one recorded operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// A client operation, sent to the registry of the DC that owns the instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `ttl_ms` is the lease TTL the server applies (0 for persistent instances).
    Register {
        persistent: bool,
        ttl_ms: u64,
    },
    Heartbeat,
    Deregister,
    SetStatus {
        status: String,
    },
}

impl OpKind {
    fn name(&self) -> String {
        match self {
            OpKind::Register { persistent: true, .. } => "register(persistent)".into(),
            OpKind::Register { persistent: false, ttl_ms } => format!("register(ttl {ttl_ms}ms)"),
            OpKind::Heartbeat => "heartbeat".into(),
            OpKind::Deregister => "deregister".into(),
            OpKind::SetStatus { status } => format!("status={status}"),
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Invoked, not completed (yet). At [`Checker::finish`] it counts as unknown.
    Pending,
    /// The registry acknowledged it. `version` is the seq it returned (register, deregister,
    /// status), `epoch` the owner's epoch (register).
    Acked { version: Option<u64>, epoch: Option<u64> },
    /// It certainly did not take effect: a 4xx answer, or the request was never sent
    /// (connection refused). `http_status` is `None` when nothing answered.
    Failed { http_status: Option<u16>, message: String },
    /// It may or may not have taken effect: timeout, connection lost mid-request, 5xx.
    Unknown { message: String },
}

impl Outcome {
    fn short(&self) -> String {
        match self {
            Outcome::Pending => "pending".into(),
            Outcome::Acked { version: Some(v), .. } => format!("acked v{v}"),
            Outcome::Acked { version: None, .. } => "acked".into(),
            Outcome::Failed { http_status: Some(s), message } => format!("failed {s} ({message})"),
            Outcome::Failed { http_status: None, message } => format!("failed, not sent ({message})"),
            Outcome::Unknown { message } => format!("unknown ({message})"),
        }
    }
}

/// One operation as recorded.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub id: OpId,
    pub dc: String,
    pub instance: InstanceRef,
    pub kind: OpKind,
    pub invoked: Ms,
    pub completed: Option<Ms>,
    pub outcome: Outcome,
}

impl OpRecord {
    pub(super) fn line(&self) -> String {
        let done = self.completed.map_or("-".to_owned(), |c| format!("{c}ms"));
        format!(
            "op#{} {} at {}: {} invoked {}ms, completed {}: {}",
            self.id.0,
            self.instance,
            self.dc,
            self.kind.name(),
            self.invoked,
            done,
            self.outcome.short()
        )
    }
}

const UNKNOWN_STATUSES_MAX: usize = 16;

impl Checker {
    /// Records an operation at invocation, before its request is sent.
    pub fn invoke(&mut self, dc: &str, instance: &InstanceRef, kind: OpKind, at: Ms) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        match &kind {
            OpKind::Heartbeat => {
                self.counts.heartbeats += 1;
                self.hb_inflight.insert(id, (instance.clone(), at));
                if let Some(i) = self.insts.get_mut(instance) {
                    i.life.on_invoke(&kind, at);
                }
                return id;
            }
            OpKind::Register { persistent, ttl_ms } => {
                self.counts.registers += 1;
                if !self.insts.contains_key(instance) {
                    self.by_service.entry(instance.service.clone()).or_default().insert(instance.id.clone());
                    self.insts.insert(
                        instance.clone(),
                        Inst {
                            owner: dc.to_owned(),
                            persistent: *persistent,
                            ttl_ms: *ttl_ms,
                            epoch: None,
                            history: 0,
                            reg_invoked: at,
                            reg_acked: None,
                            reg_failed: false,
                            ops: Vec::new(),
                            removal_invoked: None,
                            dereg_acked: None,
                            stop_hb: None,
                            forgotten: None,
                            last_renewal: None,
                            expiry_possible_from: None,
                            status_acked: None,
                            status_unknown: Vec::new(),
                            per_dc: BTreeMap::new(),
                            life: Default::default(),
                            rewound: None,
                        },
                    );
                }
            }
            OpKind::Deregister => {
                self.counts.deregisters += 1;
                if let Some(i) = self.insts.get_mut(instance) {
                    i.removal_invoked.get_or_insert(at);
                }
            }
            OpKind::SetStatus { .. } => self.counts.status_changes += 1,
        }
        if let Some(i) = self.insts.get_mut(instance) {
            i.ops.push(id);
            i.life.on_invoke(&kind, at);
        }
        self.ops.push(OpRecord {
            id,
            dc: dc.to_owned(),
            instance: instance.clone(),
            kind,
            invoked: at,
            completed: None,
            outcome: Outcome::Pending,
        });
        id
    }

    /// Records how an operation ended.
    pub fn complete(&mut self, id: OpId, at: Ms, outcome: Outcome) {
        if let Some((inst, invoked)) = self.hb_inflight.remove(&id) {
            if let Some(i) = self.insts.get_mut(&inst) {
                i.life.on_complete(&OpKind::Heartbeat, invoked, at, &outcome);
            }
            match &outcome {
                Outcome::Acked { .. } => {}
                Outcome::Failed { .. } => self.counts.heartbeats_failed += 1,
                Outcome::Unknown { .. } | Outcome::Pending => self.counts.heartbeats_unknown += 1,
            }
            self.heartbeat_done(id, &inst, invoked, at, outcome);
            return;
        }
        match &outcome {
            Outcome::Acked { .. } => self.counts.acked += 1,
            Outcome::Failed { .. } => self.counts.failed += 1,
            Outcome::Unknown { .. } | Outcome::Pending => self.counts.unknown += 1,
        }
        let Ok(pos) = self.ops.binary_search_by_key(&id, |o| o.id) else { return };
        self.ops[pos].completed = Some(at);
        self.ops[pos].outcome = outcome.clone();
        let (kind, inst_ref, invoked) =
            (self.ops[pos].kind.clone(), self.ops[pos].instance.clone(), self.ops[pos].invoked);
        let reused = self.cfg.reused_services.contains(&inst_ref.service);
        // The owner's losses of history before the operation (each a 0 in its epochs once
        // judged; process events are known at once, statuses only once judged).
        let history = self.insts.get(&inst_ref).and_then(|i| self.dcs.get(&i.owner)).map_or(0, |d| {
            d.events.iter().filter(|(t, ev)| *ev == super::ProcessEvent::HistoryLost && *t <= invoked).count()
        });
        let Some(inst) = self.insts.get_mut(&inst_ref) else { return };
        inst.life.on_complete(&kind, invoked, at, &outcome);
        if reused {
            // Reused ids are judged by lease-health only (their registrations and
            // deregistrations interleave; tombstones and lost acks assume one life).
            if let (OpKind::Register { .. }, Outcome::Acked { .. }) = (&kind, &outcome) {
                inst.reg_acked.get_or_insert(at);
            }
            return;
        }
        match (kind, outcome) {
            (OpKind::Register { .. }, Outcome::Acked { epoch, .. }) => {
                inst.reg_acked.get_or_insert(at);
                if inst.epoch.is_none() {
                    inst.epoch = epoch;
                    inst.history = history;
                }
                inst.last_renewal = Some(inst.last_renewal.map_or(invoked, |r| r.max(invoked)));
                inst.status_acked.get_or_insert((invoked, "up".into()));
            }
            (OpKind::Register { .. }, Outcome::Failed { .. }) => {
                if inst.reg_acked.is_none() {
                    inst.reg_failed = true;
                }
            }
            (OpKind::Register { .. }, Outcome::Unknown { .. } | Outcome::Pending) => {}
            (OpKind::Deregister, Outcome::Acked { version, .. }) => {
                if let Some(v) = version {
                    inst.dereg_acked = Some((at, v));
                    if let Some(e) = inst.epoch {
                        self.tombstones
                            .entry(inst.owner.clone())
                            .or_default()
                            .insert((e, v), inst_ref.clone());
                        self.tombstone_known(&inst_ref, e, v);
                    }
                } else {
                    inst.dereg_acked = Some((at, 0));
                }
            }
            (OpKind::Deregister, Outcome::Failed { http_status: Some(404), .. }) => {
                self.owner_forgot(&inst_ref, invoked, at, pos);
            }
            (OpKind::Deregister, _) => {}
            (OpKind::SetStatus { status }, Outcome::Acked { .. }) => {
                if inst.status_acked.as_ref().is_none_or(|(t, _)| *t <= invoked) {
                    inst.status_acked = Some((invoked, status));
                }
            }
            (OpKind::SetStatus { status }, Outcome::Unknown { .. } | Outcome::Pending) => {
                if inst.status_unknown.len() < UNKNOWN_STATUSES_MAX && !inst.status_unknown.contains(&status)
                {
                    inst.status_unknown.push(status);
                }
            }
            (OpKind::SetStatus { .. }, Outcome::Failed { http_status: Some(404), .. }) => {
                self.owner_forgot(&inst_ref, invoked, at, pos);
            }
            (OpKind::SetStatus { .. }, Outcome::Failed { .. }) => {}
            (OpKind::Heartbeat, _) => {}
        }
    }

    fn heartbeat_done(&mut self, id: OpId, inst_ref: &InstanceRef, invoked: Ms, at: Ms, outcome: Outcome) {
        let owner = match self.insts.get(inst_ref) {
            Some(i) => i.owner.clone(),
            None => return,
        };
        let dead = self.dcs.get(&owner).map(DcState::dead_windows).unwrap_or_default();
        let margin = self.cfg.expiry_margin_ms;
        let Some(inst) = self.insts.get_mut(inst_ref) else { return };
        match &outcome {
            Outcome::Acked { .. } => {
                self.counts.heartbeats_acked += 1;
                if let Some(prev) = inst.last_renewal {
                    let ttl = inst.ttl_ms.saturating_sub(margin).max(1);
                    if let Some(t) = expiry_within(&dead, prev, at, ttl) {
                        inst.expiry_possible_from = Some(inst.expiry_possible_from.map_or(t, |e| e.min(t)));
                    }
                    inst.last_renewal = Some(prev.max(invoked));
                }
            }
            Outcome::Failed { http_status: Some(404), .. }
                if self.cfg.reused_services.contains(&inst_ref.service) =>
            {
                self.counts.heartbeats_unknown_instance += 1;
            }
            Outcome::Failed { http_status: Some(404), .. } => {
                self.counts.heartbeats_unknown_instance += 1;
                // Keep the heartbeat: it is evidence.
                let kind = OpKind::Heartbeat;
                let rec = OpRecord {
                    id,
                    dc: owner,
                    instance: inst_ref.clone(),
                    kind,
                    invoked,
                    completed: Some(at),
                    outcome: outcome.clone(),
                };
                inst.ops.push(id);
                let pos = self.ops.partition_point(|o| o.id < id);
                self.ops.insert(pos, rec);
                self.owner_forgot(inst_ref, invoked, at, pos);
            }
            Outcome::Failed { .. } | Outcome::Unknown { .. } | Outcome::Pending => {}
        }
    }

    /// The owner answered "unknown instance" (404) to an operation on `inst` that it ran
    /// between `invoked` and `at`.
    fn owner_forgot(&mut self, inst_ref: &InstanceRef, invoked: Ms, at: Ms, op_pos: usize) {
        let Some(inst) = self.insts.get(inst_ref) else { return };
        let owner = inst.owner.clone();
        if inst.forgotten.is_none() {
            if let Some(i) = self.insts.get_mut(inst_ref) {
                i.forgotten = Some((invoked, at));
            }
        }
        let Some(inst) = self.insts.get(inst_ref) else { return };
        let Some(acked) = inst.reg_acked else { return };
        if acked >= invoked {
            return;
        }
        self.bump_check(Invariant::NoLostAck);
        if let Some(why) = self.legitimately_absent_at_owner(inst_ref, at) {
            let _ = why;
            return;
        }
        let op_line = self.ops[op_pos].line();
        self.violate(
            Invariant::NoLostAck,
            at,
            Some(&owner),
            Some(inst_ref),
            format!("the owner answered \"unknown instance\" to {op_line}, although it had acknowledged the registration and nothing removed it"),
            Vec::new(),
        );
    }

    /// The workload stopped heartbeating `instance` at `at`: its lease may expire from now.
    pub fn stop_heartbeats(&mut self, instance: &InstanceRef, at: Ms) {
        self.counts.lease_stops += 1;
        let reused = self.cfg.reused_services.contains(&instance.service);
        if let Some(i) = self.insts.get_mut(instance) {
            if !reused {
                i.stop_hb.get_or_insert(at);
            }
            i.life.stop(at);
        }
    }

    /// Why an instance may be absent from its owner's view at `t`, if it may.
    pub(super) fn legitimately_absent_at_owner(&self, r: &InstanceRef, t: Ms) -> Option<String> {
        let inst = self.insts.get(r)?;
        match inst.reg_acked {
            None => return Some("registration not acknowledged".into()),
            Some(a) if a >= t => return Some("registration not yet acknowledged".into()),
            Some(_) => {}
        }
        if let Some(x) = inst.removal_invoked.filter(|x| *x <= t) {
            return Some(format!("deregistration invoked at {x}ms"));
        }
        if let Some(x) = inst.stop_hb.filter(|x| *x <= t) {
            return Some(format!("heartbeats stopped at {x}ms"));
        }
        let st = self.dcs.get(&inst.owner)?;
        if let Some(h) = st.history_lost_between(inst.reg_invoked.saturating_sub(1), t) {
            return Some(format!("owner lost its history at {h}ms"));
        }
        if !inst.persistent {
            if let Some(e) = inst.expiry_possible_from.filter(|e| *e <= t) {
                return Some(format!("lease may have expired from {e}ms (gap in acknowledged renewals)"));
            }
            let ttl = inst.ttl_ms.saturating_sub(self.cfg.expiry_margin_ms).max(1);
            if let Some(last) = inst.last_renewal {
                if let Some(e) = expiry_within(&st.dead_windows(), last, t, ttl) {
                    return Some(format!(
                        "lease may have expired from {e}ms (no acknowledged renewal since {last}ms)"
                    ));
                }
            }
        }
        None
    }
}
