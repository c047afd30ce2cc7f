//! The invariant checker: one history of client operations and observations of every DC's
//! view, checked against what tandem promises.
//!
//! Drills feed it from real processes, tests feed it synthetic histories, a simulation can
//! feed it from a virtual world: it only sees plain records with millisecond timestamps
//! measured on one clock by the caller (`Ms`, since the history began).
//!
//! Architecture invariant: this module does no I/O, reads no clock and spawns nothing. Time
//! comes in with every record; [`Checker::advance`] says how far the caller's clock has gone.
//!
//! # What is recorded
//!
//! - Client operations, at invocation ([`Checker::invoke`]) and at completion
//!   ([`Checker::complete`]) with an [`Outcome`]: acked, failed (the registry answered no,
//!   or the request never left), or unknown (timeout, connection lost, 5xx: it may or may
//!   not have taken effect).
//! - What the workload decided without a request: it stopped heartbeating an instance
//!   ([`Checker::stop_heartbeats`]), so that instance's lease may now expire.
//! - Process events of each DC ([`ProcessEvent`]): kill, spawn, ready, pause, resume, and a
//!   declared loss of a DC's history (its data dir wiped).
//! - Observations: `GET /v1/services/{ns}/{svc}?dc=all` answers ([`ViewObservation`]) and
//!   `GET /v1/status` answers ([`StatusObservation`]), each with its invocation and
//!   completion time.
//! - Fault windows and recovery points (heal, restart, resume) for the recovery budget.
//!
//! Observations and process events are processed in invocation order after a hold
//! ([`CheckerConfig::hold_ms`]), so that every operation invoked before an observation has
//! completed and been recorded by the time the observation is judged. Memory is bounded by
//! the number of instances and operations, not by the number of observations.
//!
//! # The invariants
//!
//! Workload assumption: instance ids are never reused, and nothing re-registers an instance
//! after the workload deregistered it, stopped heartbeating it, or saw its owner forget it.
//!
//! - **no-resurrection**: in a DC, an instance that was observed present and then absent is
//!   never observed present again; an instance is never observed in a DC whose applied mark
//!   of the owner (or, at the owner, whose log) has passed the instance's acknowledged
//!   DEREGISTER, or whose mark of the owner is of another epoch than the instance's; the
//!   owner never shows an instance after acknowledging its deregistration; an instance
//!   from before its owner's declared history loss never comes back at the owner.
//! - **convergence**: after the final heal and quiescence both DCs hold the same replicated
//!   view (digest, then the sets of (owner, id, seq, status, health)) and each DC's applied
//!   mark of the other equals the other's log position.
//! - **no-lost-ack**: an acknowledged registration is shown by its owner in every later
//!   observation, and by every DC at the end, until the workload removed it or its lease
//!   may have expired (a gap in acknowledged renewals of at least its TTL while the owner
//!   ran); a heartbeat is never answered "unknown instance" for such an instance; an
//!   acknowledged deregistration is absent everywhere at the end; the final status is one
//!   the workload set.
//! - **monotonic-apply**: per DC, per-origin applied marks, the own log position and every
//!   service's watch index never go backwards within an epoch (a declared history loss
//!   resets the DC's baselines); an instance's seq in a DC never goes backwards; a DC's own
//!   epoch changes only after a declared history loss.
//! - **ownership**: every observed instance carries the owner DC whose client registered
//!   it, and nothing appears that no accepted or pending registration could have made.
//! - **availability**: every discovery poll of a DC whose process is up succeeds.
//! - **bounded-recovery**: after each recovery point (heal, restart, resume) every DC's
//!   applied mark of every other DC reaches the position that DC had at the recovery point,
//!   within the budget, unless the next fault starts first.
//!
//! # Where things are
//!
//! - `ops`: client operations and their outcomes (acks, failures, unknowns), heartbeats and
//!   the lease arithmetic that says when an instance may legitimately be gone.
//! - `process`: process events, fault starts and recovery points.
//! - `views`: discovery observations (`?dc=all` and policy answers): presence and absence.
//! - `status`: status observations: log positions, applied marks, tombstones passed.
//! - `convergence`: comparing final views (pure; drills use it to decide when to stop).
//! - `state`: what the checker remembers per instance and per DC.
//! - `verdict`: the invariants, violations, the report, and [`Checker::finish`].

mod convergence;
mod health;
mod ops;
mod process;
mod stale;
mod state;
mod status;
mod verdict;
mod views;

#[cfg(test)]
mod tests;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

pub use convergence::{digest, divergence, view_set, ViewEntry};
pub use health::HealthRules;
pub use ops::{InstanceRef, OpId, OpKind, OpRecord, Outcome};
pub use process::ProcessEvent;
pub use status::{Mark, PeerLinkView, StatusObservation, StatusView};
pub use verdict::{CheckReport, Invariant, InvariantResult, OpCounts, RecoveryResult, Violation};
pub use views::{ObservedInstance, ServiceView, ViewObservation, ViewScope};

use process::{PairState, Recovery};
use state::{DcState, Inst};

/// Milliseconds since the history began, on the caller's one clock.
pub type Ms = u64;

/// Settings of the checker.
#[derive(Clone, Debug)]
pub struct CheckerConfig {
    /// The DCs of the drill.
    pub dcs: Vec<String>,
    /// Observations are judged once the caller's clock is this far past their invocation.
    /// Must exceed the longest operation timeout.
    pub hold_ms: Ms,
    /// Slack on lease arithmetic.
    pub expiry_margin_ms: Ms,
    /// After `Ready` or `Resumed`, failed polls are still excused this long.
    pub availability_grace_ms: Ms,
    /// Each recovery must complete within this.
    pub recovery_budget_ms: Ms,
    /// Violations kept in detail per invariant (all are counted).
    pub violations_kept_max: usize,
    /// The owners' lease rules (`None`: lease-health is not judged).
    pub health: Option<HealthRules>,
    /// The nodes' `stale_after_ms` (`None`: staleness is not judged).
    pub stale_after_ms: Option<Ms>,
    /// Services whose instance ids the workload reuses: judged by lease-health (and
    /// ownership) only, since the other invariants follow one life per id.
    pub reused_services: BTreeSet<String>,
}

impl CheckerConfig {
    pub fn new(dcs: &[&str]) -> CheckerConfig {
        CheckerConfig {
            dcs: dcs.iter().map(|d| (*d).to_owned()).collect(),
            hold_ms: 5_000,
            expiry_margin_ms: 100,
            availability_grace_ms: 1_000,
            recovery_budget_ms: 20_000,
            violations_kept_max: 20,
            health: None,
            stale_after_ms: None,
            reused_services: BTreeSet::new(),
        }
    }
}

#[derive(Debug)]
enum Timed {
    View(ViewObservation),
    Status(StatusObservation),
    Process {
        dc: String,
        at: Ms,
        ev: ProcessEvent,
    },
    FaultStart {
        at: Ms,
    },
    Recovery {
        at: Ms,
        label: String,
    },
    /// The drill's clients of `dc` moved to another member of its group.
    ClientMoved {
        dc: String,
        at: Ms,
    },
}

impl Timed {
    fn key(&self) -> Ms {
        match self {
            Timed::View(o) => o.invoked,
            Timed::Status(o) => o.invoked,
            Timed::Process { at, .. }
            | Timed::FaultStart { at, .. }
            | Timed::Recovery { at, .. }
            | Timed::ClientMoved { at, .. } => *at,
        }
    }
}

struct Queued {
    key: Ms,
    seqno: u64,
    item: Timed,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.key, self.seqno) == (o.key, o.seqno)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.key, self.seqno).cmp(&(o.key, o.seqno))
    }
}

/// The checker. Feed it, [`advance`](Checker::advance) it, then [`finish`](Checker::finish).
pub struct Checker {
    cfg: CheckerConfig,
    ops: Vec<OpRecord>,
    /// Heartbeats in flight: id -> (instance, invoked). Completed ones are not kept.
    hb_inflight: HashMap<OpId, (InstanceRef, Ms)>,
    next_op: u64,
    insts: HashMap<InstanceRef, Inst>,
    by_service: BTreeMap<String, BTreeSet<String>>,
    /// Acked deregistrations per owner: (epoch, version) -> instance.
    tombstones: HashMap<String, BTreeMap<(u64, u64), InstanceRef>>,
    dcs: BTreeMap<String, DcState>,
    queue: BinaryHeap<Reverse<Queued>>,
    seqno: u64,
    processed_key: Ms,
    late: u64,
    recoveries: Vec<Recovery>,
    violations: BTreeMap<Invariant, (u64, Vec<Violation>)>,
    checks: BTreeMap<Invariant, u64>,
    counts: OpCounts,
    views_judged: u64,
    statuses_judged: u64,
    /// (invariant, instance, dc) already reported: one violation per instance and DC.
    reported: std::collections::HashSet<(Invariant, InstanceRef, String)>,
    /// Self-preservation samples per DC: (invoked, completed, expiry paused somewhere).
    preservation: HashMap<String, std::collections::VecDeque<(Ms, Ms, bool)>>,
    damped_excused: u64,
    /// Instances no longer judged on their own because their owner's data dir was restored
    /// to an older copy.
    rewound_excused: u64,
    stale: stale::Staleness,
}

impl Checker {
    pub fn new(cfg: CheckerConfig) -> Checker {
        let dcs = cfg.dcs.iter().map(|d| (d.clone(), DcState::default())).collect();
        Checker {
            cfg,
            ops: Vec::new(),
            hb_inflight: HashMap::new(),
            next_op: 0,
            insts: HashMap::new(),
            by_service: BTreeMap::new(),
            tombstones: HashMap::new(),
            dcs,
            queue: BinaryHeap::new(),
            seqno: 0,
            processed_key: 0,
            late: 0,
            recoveries: Vec::new(),
            violations: BTreeMap::new(),
            checks: BTreeMap::new(),
            counts: OpCounts::default(),
            views_judged: 0,
            statuses_judged: 0,
            reported: std::collections::HashSet::new(),
            preservation: HashMap::new(),
            damped_excused: 0,
            rewound_excused: 0,
            stale: Default::default(),
        }
    }

    pub fn config(&self) -> &CheckerConfig {
        &self.cfg
    }

    fn push(&mut self, item: Timed) {
        let key = item.key();
        self.seqno += 1;
        self.queue.push(Reverse(Queued { key, seqno: self.seqno, item }));
    }

    /// Judges every queued observation invoked at or before `now - hold`.
    pub fn advance(&mut self, now: Ms) {
        let until = now.saturating_sub(self.cfg.hold_ms);
        while self.queue.peek().is_some_and(|Reverse(q)| q.key <= until) {
            let Some(Reverse(q)) = self.queue.pop() else { break };
            self.judge(q.item);
        }
    }

    /// Counts of operations so far.
    pub fn op_counts(&self) -> &OpCounts {
        &self.counts
    }

    /// Violations found so far (judged observations only).
    pub fn violations_so_far(&self) -> u64 {
        self.violations.values().map(|(n, _)| *n).sum()
    }

    /// The latest successful `?dc=all` view of each service in `dc`, and its latest status.
    pub fn latest(&self, dc: &str) -> Option<(BTreeMap<String, ServiceView>, Option<StatusView>)> {
        let st = self.dcs.get(dc)?;
        Some((
            st.latest_views.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect(),
            st.latest_status.as_ref().map(|(_, s)| s.clone()),
        ))
    }

    fn judge(&mut self, item: Timed) {
        let key = item.key();
        if key < self.processed_key {
            self.late += 1;
        }
        self.processed_key = self.processed_key.max(key);
        match item {
            Timed::View(o) => self.judge_view(o),
            Timed::Status(o) => self.judge_status(o),
            Timed::Process { dc, at, ev } => self.judge_process(&dc, at, ev),
            Timed::ClientMoved { dc, .. } => {
                // Plain reads of two members are not ordered: the index a client sees
                // starts over at the member it moved to (blocking queries are ordered
                // across members; the isolation drills' `index-never-back` checks that).
                if let Some(st) = self.dcs.get_mut(&dc) {
                    st.index.clear();
                }
            }
            Timed::FaultStart { at } => {
                for r in &mut self.recoveries {
                    if r.interrupted.is_none() && r.done_at().is_none() {
                        r.interrupted = Some(at);
                    }
                }
            }
            Timed::Recovery { at, label } => {
                let mut pairs = BTreeMap::new();
                for d in &self.cfg.dcs {
                    for p in &self.cfg.dcs {
                        if d != p {
                            pairs.insert((d.clone(), p.clone()), PairState { target: None, done: None });
                        }
                    }
                }
                self.recoveries.push(Recovery { label, at, pairs, interrupted: None });
            }
        }
    }

    fn bump_check(&mut self, inv: Invariant) {
        *self.checks.entry(inv).or_insert(0) += 1;
    }

    fn violate(
        &mut self,
        inv: Invariant,
        at: Ms,
        dc: Option<&str>,
        instance: Option<&InstanceRef>,
        summary: String,
        observations: Vec<String>,
    ) {
        if let Some(r) = instance {
            if !self.reported.insert((inv, r.clone(), dc.unwrap_or_default().to_owned())) {
                return;
            }
        }
        let ops: Vec<String> = instance
            .and_then(|r| self.insts.get(r))
            .map(|i| {
                let mut lines: Vec<String> = i
                    .ops
                    .iter()
                    .filter_map(|id| {
                        self.ops.binary_search_by_key(id, |o| o.id).ok().map(|p| self.ops[p].line())
                    })
                    .collect();
                if let Some(s) = i.stop_hb {
                    lines.push(format!("heartbeats stopped by the workload at {s}ms"));
                }
                if let Some(e) = i.expiry_possible_from {
                    lines.push(format!("lease may have expired from {e}ms (gap in acknowledged renewals)"));
                }
                lines
            })
            .unwrap_or_default();
        let keep = self.cfg.violations_kept_max;
        let entry = self.violations.entry(inv).or_insert((0, Vec::new()));
        entry.0 += 1;
        if entry.1.len() < keep {
            entry.1.push(Violation {
                invariant: inv,
                at,
                dc: dc.map(str::to_owned),
                instance: instance.cloned(),
                summary,
                ops,
                observations,
            });
        }
    }
}
