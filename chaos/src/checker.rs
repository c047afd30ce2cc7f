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

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::fmt;

/// Milliseconds since the history began, on the caller's one clock.
pub type Ms = u64;

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
    fn line(&self) -> String {
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
}

/// One instance in a `?dc=all` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedInstance {
    pub id: String,
    pub owner_dc: String,
    pub seq: u64,
    pub status: String,
    pub health: String,
    pub stale: bool,
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

/// An origin position: (epoch, seq).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Mark {
    pub epoch: u64,
    pub seq: u64,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}:{}", self.epoch, self.seq)
    }
}

/// The parts of `/v1/status` the invariants use.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StatusView {
    /// The DC's own log: epoch and last seq.
    pub log: Mark,
    /// Applied high-water mark per remote origin.
    pub applied: BTreeMap<String, Mark>,
}

#[derive(Clone, Debug)]
pub struct StatusObservation {
    pub dc: String,
    pub invoked: Ms,
    pub completed: Ms,
    pub result: Result<StatusView, String>,
}

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
        }
    }
}

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
}

impl Invariant {
    pub const ALL: [Invariant; 7] = [
        Invariant::NoResurrection,
        Invariant::Convergence,
        Invariant::NoLostAck,
        Invariant::MonotonicApply,
        Invariant::Ownership,
        Invariant::Availability,
        Invariant::BoundedRecovery,
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

// ---------------------------------------------------------------------------------------------
// Convergence of two final views (pure, also used by drills to decide when to stop waiting).
// ---------------------------------------------------------------------------------------------

/// (service, owner, id, seq, status, health): what must be equal in every DC at the end.
pub type ViewEntry = (String, String, String, u64, String, String);

/// The replicated view of a DC across services, as a set.
pub fn view_set<'a>(views: impl IntoIterator<Item = (&'a String, &'a ServiceView)>) -> BTreeSet<ViewEntry> {
    let mut out = BTreeSet::new();
    for (svc, v) in views {
        for i in &v.instances {
            out.insert((
                svc.clone(),
                i.owner_dc.clone(),
                i.id.clone(),
                i.seq,
                i.status.clone(),
                i.health.clone(),
            ));
        }
    }
    out
}

/// FNV-1a over the sorted entries: equal sets have equal digests.
pub fn digest(set: &BTreeSet<ViewEntry>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (svc, owner, id, seq, status, health) in set {
        for part in [
            svc.as_bytes(),
            owner.as_bytes(),
            id.as_bytes(),
            &seq.to_be_bytes(),
            status.as_bytes(),
            health.as_bytes(),
        ] {
            eat(part);
            eat(&[0xff]);
        }
    }
    h
}

/// Why two DCs have not converged, or `None` when they have: differing entries (at most
/// `limit` of each side) and marks that have not caught up.
pub fn divergence(
    a: (&str, &BTreeSet<ViewEntry>, &StatusView),
    b: (&str, &BTreeSet<ViewEntry>, &StatusView),
    limit: usize,
) -> Option<Vec<String>> {
    let mut out = Vec::new();
    if digest(a.1) != digest(b.1) || a.1 != b.1 {
        for e in a.1.difference(b.1).take(limit) {
            out.push(format!("only in {}: {}", a.0, entry_line(e)));
        }
        for e in b.1.difference(a.1).take(limit) {
            out.push(format!("only in {}: {}", b.0, entry_line(e)));
        }
    }
    for (x, y) in [(&a, &b), (&b, &a)] {
        let held = x.2.applied.get(y.0).copied();
        if held != Some(y.2.log) {
            out.push(format!(
                "{} has applied {} up to {}, but {}'s log is at {}",
                x.0,
                y.0,
                held.map_or("nothing".to_owned(), |m| m.to_string()),
                y.0,
                y.2.log
            ));
        }
    }
    (!out.is_empty()).then_some(out)
}

fn entry_line(e: &ViewEntry) -> String {
    format!("{}/{} owner {} seq {} {} {}", e.0, e.2, e.1, e.3, e.4, e.5)
}

// ---------------------------------------------------------------------------------------------
// The checker.
// ---------------------------------------------------------------------------------------------

const NOTES_PER_DC_MAX: usize = 6;
const UNKNOWN_STATUSES_MAX: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Unseen,
    Present,
    /// Observed present, then absent.
    Gone,
}

#[derive(Debug)]
struct DcInst {
    seen: Seen,
    last_seq: Option<(Ms, u64)>,
    /// When this DC's mark (or own log) was observed past the acked tombstone.
    tomb_passed: Option<(Ms, String)>,
    /// When this DC's mark of the owner was observed in another epoch than the instance's.
    epoch_moved: Option<(Ms, String)>,
    notes: Vec<String>,
}

impl DcInst {
    fn new() -> DcInst {
        DcInst { seen: Seen::Unseen, last_seq: None, tomb_passed: None, epoch_moved: None, notes: Vec::new() }
    }
    fn note(&mut self, s: String) {
        if self.notes.len() < NOTES_PER_DC_MAX {
            self.notes.push(s);
        } else {
            // Keep the first notes (how it appeared) and the latest one.
            self.notes[NOTES_PER_DC_MAX - 1] = s;
        }
    }
}

#[derive(Debug)]
struct Inst {
    owner: String,
    persistent: bool,
    ttl_ms: u64,
    epoch: Option<u64>,
    reg_invoked: Ms,
    reg_acked: Option<Ms>,
    reg_failed: bool,
    /// Non-heartbeat operations and notable heartbeats, in invocation order.
    ops: Vec<OpId>,
    removal_invoked: Option<Ms>,
    dereg_acked: Option<(Ms, u64)>,
    stop_hb: Option<Ms>,
    /// A heartbeat was answered 404: (invoked, completed).
    forgotten: Option<(Ms, Ms)>,
    /// Invocation time of the latest acknowledged renewal (the registration counts).
    last_renewal: Option<Ms>,
    /// Earliest time at which the server may have expired the lease.
    expiry_possible_from: Option<Ms>,
    /// Latest acked status: (invoked, status). Registration sets "up".
    status_acked: Option<(Ms, String)>,
    status_unknown: Vec<String>,
    per_dc: BTreeMap<String, DcInst>,
}

impl Inst {
    fn dc(&mut self, dc: &str) -> &mut DcInst {
        self.per_dc.entry(dc.to_owned()).or_insert_with(DcInst::new)
    }
}

#[derive(Debug, Default)]
struct DcState {
    /// Process events in time order.
    events: Vec<(Ms, ProcessEvent)>,
    index: HashMap<String, (Ms, u64)>,
    log: Option<(Ms, Mark)>,
    applied: BTreeMap<String, (Ms, Mark)>,
    /// Ids currently believed present here, per service.
    present: HashMap<String, BTreeSet<String>>,
    /// Latest successful `All` view per service, and latest successful status.
    latest_views: BTreeMap<String, (Ms, ServiceView)>,
    latest_status: Option<(Ms, StatusView)>,
    history_lost: Vec<Ms>,
    /// The DC's own epochs, in the order first observed.
    epochs: Vec<u64>,
    polls_ok: u64,
    polls_failed_excused: u64,
    polls_failed: u64,
    status_failed: u64,
}

impl DcState {
    /// Down (killed or paused, plus grace after coming back) at some point in [from, to]?
    fn down_during(&self, from: Ms, to: Ms, grace: Ms) -> bool {
        let mut down_since: Option<Ms> = None;
        for &(at, ev) in &self.events {
            match ev {
                ProcessEvent::Killed | ProcessEvent::Paused | ProcessEvent::HistoryLost => {
                    down_since.get_or_insert(at);
                }
                ProcessEvent::Ready | ProcessEvent::Resumed => {
                    if let Some(s) = down_since.take() {
                        if s <= to && at + grace >= from {
                            return true;
                        }
                    }
                }
                ProcessEvent::Spawned => {}
            }
        }
        matches!(down_since, Some(s) if s <= to)
    }

    /// Intervals in which the process was dead (killed until spawned again), as
    /// (killed_at, spawned_at or None while still dead).
    fn dead_windows(&self) -> Vec<(Ms, Option<Ms>)> {
        let mut out = Vec::new();
        let mut dead: Option<Ms> = None;
        for &(at, ev) in &self.events {
            match ev {
                ProcessEvent::Killed => {
                    dead.get_or_insert(at);
                }
                ProcessEvent::Spawned => {
                    if let Some(k) = dead.take() {
                        out.push((k, Some(at)));
                    }
                }
                ProcessEvent::Ready
                | ProcessEvent::Paused
                | ProcessEvent::Resumed
                | ProcessEvent::HistoryLost => {}
            }
        }
        if let Some(k) = dead {
            out.push((k, None));
        }
        out
    }

    fn history_lost_between(&self, from: Ms, to: Ms) -> Option<Ms> {
        self.history_lost.iter().copied().find(|t| *t > from && *t <= to)
    }
}

/// Earliest time within [from, to] at which a lease renewed at `from` may have expired,
/// given the owner's dead windows (a dead process expires nothing, and a restart renews
/// every lease).
fn expiry_within(dead: &[(Ms, Option<Ms>)], from: Ms, to: Ms, ttl: Ms) -> Option<Ms> {
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

#[derive(Debug)]
enum Timed {
    View(ViewObservation),
    Status(StatusObservation),
    Process { dc: String, at: Ms, ev: ProcessEvent },
    FaultStart { at: Ms },
    Recovery { at: Ms, label: String },
}

impl Timed {
    fn key(&self) -> Ms {
        match self {
            Timed::View(o) => o.invoked,
            Timed::Status(o) => o.invoked,
            Timed::Process { at, .. } | Timed::FaultStart { at, .. } | Timed::Recovery { at, .. } => *at,
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

#[derive(Debug)]
struct PairState {
    target: Option<(Ms, Mark)>,
    done: Option<Ms>,
}

#[derive(Debug)]
struct Recovery {
    label: String,
    at: Ms,
    pairs: BTreeMap<(String, String), PairState>,
    interrupted: Option<Ms>,
}

impl Recovery {
    fn done_at(&self) -> Option<Ms> {
        let mut max = self.at;
        for p in self.pairs.values() {
            max = max.max(p.done?);
        }
        Some(max)
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
}

#[derive(Debug, Default)]
struct FinalFacts {
    digests: BTreeMap<String, (u64, usize)>,
    instances_final: usize,
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
        }
    }

    pub fn config(&self) -> &CheckerConfig {
        &self.cfg
    }

    // -- recording ------------------------------------------------------------------------

    /// Records an operation at invocation, before its request is sent.
    pub fn invoke(&mut self, dc: &str, instance: &InstanceRef, kind: OpKind, at: Ms) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        match &kind {
            OpKind::Heartbeat => {
                self.counts.heartbeats += 1;
                self.hb_inflight.insert(id, (instance.clone(), at));
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
        let Some(inst) = self.insts.get_mut(&inst_ref) else { return };
        match (kind, outcome) {
            (OpKind::Register { .. }, Outcome::Acked { epoch, .. }) => {
                inst.reg_acked.get_or_insert(at);
                if inst.epoch.is_none() {
                    inst.epoch = epoch;
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
        if let Some(i) = self.insts.get_mut(instance) {
            i.stop_hb.get_or_insert(at);
        }
    }

    /// A process event of `dc`.
    pub fn process(&mut self, dc: &str, at: Ms, ev: ProcessEvent) {
        let st = self.dcs.entry(dc.to_owned()).or_default();
        st.events.push((at, ev));
        st.events.sort_by_key(|(t, _)| *t);
        if ev == ProcessEvent::HistoryLost {
            st.history_lost.push(at);
            st.history_lost.sort_unstable();
        }
        self.push(Timed::Process { dc: dc.to_owned(), at, ev });
    }

    /// A fault starts (ends a pending recovery's budget).
    pub fn fault_started(&mut self, at: Ms) {
        self.push(Timed::FaultStart { at });
    }

    /// A recovery point: a heal, a restart, a resume.
    pub fn recovery_point(&mut self, at: Ms, label: &str) {
        self.push(Timed::Recovery { at, label: label.to_owned() });
    }

    pub fn observe_view(&mut self, obs: ViewObservation) {
        self.push(Timed::View(obs));
    }

    pub fn observe_status(&mut self, obs: StatusObservation) {
        self.push(Timed::Status(obs));
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

    // -- judging ---------------------------------------------------------------------------

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

    fn judge_process(&mut self, dc: &str, at: Ms, ev: ProcessEvent) {
        if ev != ProcessEvent::HistoryLost {
            return;
        }
        // The DC starts from nothing: its baselines and its view of every instance restart.
        if let Some(st) = self.dcs.get_mut(dc) {
            st.index.clear();
            st.log = None;
            st.applied.clear();
            st.present.clear();
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

    /// Why an instance may be absent from its owner's view at `t`, if it may.
    fn legitimately_absent_at_owner(&self, r: &InstanceRef, t: Ms) -> Option<String> {
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

    fn judge_view(&mut self, o: ViewObservation) {
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

        // Watch index.
        let prev_index = st.index.get(&o.service).copied();
        st.index.insert(o.service.clone(), (o.completed, view.index));
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
            if let Some(h) = self.dcs.get(dc).and_then(|s| s.history_lost_between(reg_invoked, t)) {
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

    fn judge_status(&mut self, o: StatusObservation) {
        let dc = o.dc.clone();
        let Some(st) = self.dcs.get_mut(&dc) else { return };
        let s = match &o.result {
            Ok(s) => s.clone(),
            Err(_) => {
                st.status_failed += 1;
                return;
            }
        };
        self.statuses_judged += 1;
        st.latest_status = Some((o.invoked, s.clone()));
        let tag = format!("{}..{}ms {} status", o.invoked, o.completed, dc);
        let mut problems: Vec<(String, Vec<String>)> = Vec::new();

        // Own log.
        if let Some((pt, prev)) = st.log {
            if pt <= o.invoked {
                if prev.epoch == s.log.epoch && s.log.seq < prev.seq {
                    problems.push((
                        format!("own log went back from {prev} to {}", s.log),
                        vec![format!("{pt}ms: log {prev}"), format!("{tag}: log {}", s.log)],
                    ));
                }
                if prev.epoch != s.log.epoch && st.history_lost_between(pt, o.completed).is_none() {
                    problems.push((
                        format!(
                            "own origin epoch changed from {:x} to {:x} without a declared history loss (the DC lost its log?)",
                            prev.epoch, s.log.epoch
                        ),
                        vec![format!("{pt}ms: log {prev}"), format!("{tag}: log {}", s.log)],
                    ));
                }
            }
        }
        st.log = Some((o.completed, s.log));
        if !st.epochs.contains(&s.log.epoch) {
            st.epochs.push(s.log.epoch);
        }
        // Applied marks.
        for (origin, m) in &s.applied {
            if let Some(&(pt, prev)) = st.applied.get(origin) {
                if pt <= o.invoked && prev.epoch == m.epoch && m.seq < prev.seq {
                    problems.push((
                        format!("applied mark of {origin} went back from {prev} to {m}"),
                        vec![
                            format!("{pt}ms: applied[{origin}] {prev}"),
                            format!("{tag}: applied[{origin}] {m}"),
                        ],
                    ));
                }
            }
            st.applied.insert(origin.clone(), (o.completed, *m));
        }
        self.bump_check(Invariant::MonotonicApply);
        for (why, obs) in problems {
            self.violate(Invariant::MonotonicApply, o.completed, Some(&dc), None, why, obs);
        }

        // Tombstones passed and epochs moved: what this DC must no longer show.
        let mut marks: Vec<(String, Mark)> = s.applied.iter().map(|(k, v)| (k.clone(), *v)).collect();
        marks.push((dc.clone(), s.log));
        for (origin, m) in marks {
            if let Some(tombs) = self.tombstones.get(&origin) {
                let hit: Vec<InstanceRef> =
                    tombs.range((m.epoch, 0)..=(m.epoch, m.seq)).map(|(_, r)| r.clone()).collect();
                for r in hit {
                    if let Some(d) = self.insts.get_mut(&r).map(|i| i.dc(&dc)) {
                        if d.tomb_passed.is_none() {
                            let what = if origin == dc {
                                "own log".to_owned()
                            } else {
                                format!("applied mark of {origin}")
                            };
                            d.tomb_passed = Some((
                                o.completed,
                                format!("{dc}'s {what} reached {m}, past the acknowledged deregistration"),
                            ));
                        }
                    }
                }
            }
            if origin != dc {
                // Instances of `origin` from an epoch older than the mark's must be gone here.
                let epochs = self.dcs.get(&origin).map(|s| s.epochs.clone()).unwrap_or_default();
                let Some(mark_pos) = epochs.iter().position(|e| *e == m.epoch) else { continue };
                if mark_pos == 0 {
                    // The origin's first epoch: nothing older to be gone.
                    continue;
                }
                for inst in self.insts.values_mut() {
                    if inst.owner != origin {
                        continue;
                    }
                    let Some(pos) = inst.epoch.and_then(|e| epochs.iter().position(|x| *x == e)) else {
                        continue;
                    };
                    if pos < mark_pos {
                        let d = inst.dc(&dc);
                        if d.epoch_moved.is_none() {
                            d.epoch_moved = Some((
                                o.completed,
                                format!(
                                    "{dc}'s applied mark of {origin} moved to the newer epoch {:x}",
                                    m.epoch
                                ),
                            ));
                        }
                    }
                }
            }
        }

        // Recoveries.
        let budget = self.cfg.recovery_budget_ms;
        let _ = budget;
        let dcs = self.cfg.dcs.clone();
        for r in &mut self.recoveries {
            if r.interrupted.is_some() || o.invoked < r.at {
                continue;
            }
            for p in &dcs {
                if p == &dc {
                    continue;
                }
                // This DC is the target provider for pairs (d, dc).
                if let Some(ps) = r.pairs.get_mut(&(p.clone(), dc.clone())) {
                    if ps.target.is_none() {
                        ps.target = Some((o.invoked, s.log));
                    }
                }
                // And the follower for pairs (dc, p).
                if let Some(ps) = r.pairs.get_mut(&(dc.clone(), p.clone())) {
                    if let (Some((tt, target)), None) = (ps.target, ps.done) {
                        if o.invoked >= tt {
                            if let Some(m) = s.applied.get(p) {
                                if m.epoch == target.epoch && m.seq >= target.seq {
                                    ps.done = Some(o.completed);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A deregistration of `r` at (epoch, version) was acknowledged: every DC whose mark
    /// already passed it must no longer show `r`.
    fn tombstone_known(&mut self, r: &InstanceRef, epoch: u64, version: u64) {
        let Some(owner) = self.insts.get(r).map(|i| i.owner.clone()) else { return };
        let mut passed: Vec<(String, Ms, Mark)> = Vec::new();
        for (dc, st) in &self.dcs {
            let m = if dc == &owner { st.log } else { st.applied.get(&owner).copied() };
            if let Some((t, m)) = m {
                if m.epoch == epoch && m.seq >= version {
                    passed.push((dc.clone(), t, m));
                }
            }
        }
        for (dc, t, m) in passed {
            if let Some(d) = self.insts.get_mut(r).map(|i| i.dc(&dc)) {
                if d.tomb_passed.is_none() {
                    d.tomb_passed = Some((
                        t,
                        format!("{dc}'s mark of {owner} reached {m}, past the acknowledged deregistration"),
                    ));
                }
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

    // -- the end ---------------------------------------------------------------------------

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
            let Some(inst) = self.insts.get(r) else { continue };
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
                format!(
                    "{} instances, {deregs} acked deregistrations, {checks} presence checks",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_needs_a_gap_of_a_ttl_while_the_owner_ran() {
        assert_eq!(expiry_within(&[], 0, 999, 1000), None);
        assert_eq!(expiry_within(&[], 0, 1000, 1000), Some(1000));
        // Killed at 500, respawned at 3000: no segment of 1000 until 4000.
        assert_eq!(expiry_within(&[(500, Some(3000))], 0, 3999, 1000), None);
        assert_eq!(expiry_within(&[(500, Some(3000))], 0, 4000, 1000), Some(4000));
        // Still dead: nothing expires.
        assert_eq!(expiry_within(&[(500, None)], 0, 99_999, 1000), None);
        // A gap before the kill counts.
        assert_eq!(expiry_within(&[(1500, Some(3000))], 0, 3100, 1000), Some(1000));
    }

    #[test]
    fn digest_is_order_free_and_content_sensitive() {
        let v1 = ServiceView {
            index: 1,
            instances: vec![
                ObservedInstance {
                    id: "x".into(),
                    owner_dc: "a".into(),
                    seq: 1,
                    status: "up".into(),
                    health: "healthy".into(),
                    stale: false,
                },
                ObservedInstance {
                    id: "y".into(),
                    owner_dc: "b".into(),
                    seq: 2,
                    status: "up".into(),
                    health: "healthy".into(),
                    stale: true,
                },
            ],
        };
        let mut v2 = v1.clone();
        v2.instances.reverse();
        v2.instances[0].stale = false;
        let s = "svc".to_owned();
        assert_eq!(digest(&view_set([(&s, &v1)])), digest(&view_set([(&s, &v2)])));
        v2.instances[0].seq = 3;
        assert_ne!(digest(&view_set([(&s, &v1)])), digest(&view_set([(&s, &v2)])));
    }
}
