//! One member of a DC's group cut off from the others (`leader-isolated`,
//! `follower-partition`): every member link to and from it runs through a relay
//! ([`super::group::relay_members`]), and the cut drops both directions of each. The member
//! keeps running, keeps answering HTTP and keeps its link to the other DC.
//!
//! While it is cut off, three probes run against the DC (bounded: each request has a
//! timeout, each loop stops at the rejoin):
//! - **writes** to the cut-off member (persistent registrations of a service no workload
//!   uses): one acknowledged must be in both DCs at the end (a follower's forwarded write
//!   may complete once the link heals), one refused (`no_leader`, `not_leader`, 4xx) in
//!   neither; a cut-off leader's own log commits nothing (its entries are replaced);
//! - **plain reads** of the cut-off member: answered (it keeps serving discovery), and
//!   flagged: its `X-Tandem-Last-Contact` grows past the election timeout;
//! - **a client that alternates members** (the cut-off one included) with blocking queries
//!   carrying the highest index it saw: no answer may carry a lower index.
//!
//! At the end of the drill the probe service is read in both DCs
//! ([`Cluster::probe_visible`]) and judged against what the writes were told.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Cluster;
use crate::api::Api;
use crate::checker::{Outcome, ViewScope};
use crate::relay::Direction;

/// The service the write probes register in (the drill's namespace; no workload uses it).
pub const PROBE_SERVICE: &str = "probe-cut-off";
/// Longest wait for the rejoined member to follow the leader and apply what it had.
const REJOIN_WAIT: Duration = Duration::from_secs(20);
/// Longest wait for the majority to serve writes after the leader was cut off.
const FAILOVER_WAIT: Duration = Duration::from_secs(20);
/// A probe request's timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait, from the cut, for a cut-off leader to stop serving writes (its quorum's
/// last acknowledgement ages past the election timeout's maximum, 600 ms by default).
const STEP_DOWN_WAIT: Duration = Duration::from_secs(5);
/// The alternating client's `wait` on a blocking query.
const ALTERNATE_WAIT_MS: u64 = 1_000;
/// Pause between two probes of one kind.
const PROBE_PAUSE: Duration = Duration::from_millis(100);
/// Most violations kept per isolation (the counts stay exact).
const DETAILS_MAX: usize = 5;

/// One member cut off, as the drill saw it.
#[derive(Clone, Debug, Default)]
pub struct Isolation {
    pub dc: String,
    /// The member cut off (node id), and whether it led when it was.
    pub member: u64,
    pub was_leader: bool,
    /// The leader cut off: the member that served writes next and how long after the cut a
    /// status poll saw it.
    pub next: Option<(u64, u64)>,
    /// The leader cut off: how long after the cut a status poll of it saw it no longer
    /// serving writes (None: not before it rejoined).
    pub stepped_down_ms: Option<u64>,
    pub probes: Probes,
}

/// What the probes saw while the member was cut off.
#[derive(Clone, Debug, Default)]
pub struct Probes {
    pub writes_acked: u64,
    pub writes_refused: u64,
    /// The ids of the writes acknowledged, and of those refused.
    pub acked_ids: Vec<String>,
    pub refused_ids: Vec<String>,
    pub writes_unknown: u64,
    pub reads_answered: u64,
    pub reads_failed: u64,
    /// The largest `X-Tandem-Last-Contact` a plain read of the cut-off member showed.
    pub last_contact_max_ms: Option<u64>,
    pub alternate_reads: u64,
    /// Alternating reads refused (a member behind the client's index says so).
    pub alternate_refused: u64,
    pub backwards: u64,
    pub details: Vec<String>,
}

impl Probes {
    fn note(&mut self, s: String) {
        if self.details.len() < DETAILS_MAX {
            self.details.push(s);
        }
    }

    fn merge(&mut self, o: Probes) {
        self.writes_acked += o.writes_acked;
        self.writes_refused += o.writes_refused;
        self.acked_ids.extend(o.acked_ids);
        self.refused_ids.extend(o.refused_ids);
        self.writes_unknown += o.writes_unknown;
        self.reads_answered += o.reads_answered;
        self.reads_failed += o.reads_failed;
        self.last_contact_max_ms = self.last_contact_max_ms.max(o.last_contact_max_ms);
        self.alternate_reads += o.alternate_reads;
        self.alternate_refused += o.alternate_refused;
        self.backwards += o.backwards;
        for d in o.details {
            self.note(d);
        }
    }
}

/// A cut in force: the member, when it was cut, the record so far, the probes' tasks.
pub(super) struct MemberCut {
    member: usize,
    record: Isolation,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Probes>>,
    /// A cut-off leader: polls it until it stops serving writes; how long after the cut.
    step_down: Option<JoinHandle<Option<u64>>>,
}

/// A member's `/v1/status` `cluster` part: (serving writes, leader, applied index).
fn cluster_of(raw: &Value) -> Option<(bool, Option<u64>, u64)> {
    let c = raw.get("cluster")?;
    Some((
        c.get("serving_writes")?.as_bool()?,
        c.get("leader").and_then(Value::as_u64),
        c.get("applied_index").and_then(Value::as_u64).unwrap_or(0),
    ))
}

impl Cluster {
    /// Sets where the probes read (the namespace and a service the workload changes).
    pub fn set_probe_target(&mut self, ns: &str, svc: &str) {
        self.probe_target = Some((ns.to_owned(), svc.to_owned()));
    }

    /// Before an `IsolateMember`: picks the member (the leader, or a follower) and moves
    /// the clients' base off it. Returns whether the base moved.
    pub(super) async fn prepare_isolation(&mut self, side: usize, leader: bool) -> anyhow::Result<bool> {
        if self.member_relays[side].is_empty() {
            bail!("{}'s member links run without relays: no member can be cut off", self.dcs[side].name);
        }
        let serving = self.serving_member(side, None, Instant::now() + FAILOVER_WAIT).await?;
        let dc = &mut self.dcs[side];
        // The leader, or the member after it.
        let pick = if leader { serving } else { (serving + 1) % dc.nodes.len() };
        dc.doomed = Some(pick);
        if dc.base != dc.nodes[pick].base {
            return Ok(false);
        }
        let next = (pick + 1) % dc.nodes.len();
        dc.base = dc.nodes[next].base.clone();
        Ok(true)
    }

    /// Cuts the member [`Cluster::prepare_isolation`] picked off its group, starts the
    /// probes and, when it led, waits until another member serves writes. Returns the
    /// progress note.
    pub(super) async fn isolate(&mut self, side: usize, leader: bool) -> anyhow::Result<String> {
        let Some(k) = self.dcs[side].doomed.take() else { bail!("isolate without prepare") };
        let at = Instant::now();
        for r in self.member_relays[side].iter().filter(|r| r.from == k || r.to == k) {
            r.relay.handle().partition(Direction::Both);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let member = self.dcs[side].nodes[k].base.clone();
        if let Some((ns, svc)) = self.probe_target.clone() {
            tasks.push(tokio::spawn(probe_writes(
                self.api.clone(),
                member.clone(),
                ns.clone(),
                side,
                stop.clone(),
            )));
            tasks.push(tokio::spawn(probe_reads(
                self.api.clone(),
                member,
                ns.clone(),
                svc.clone(),
                stop.clone(),
            )));
            let all = self.dcs[side].node_bases();
            tasks.push(tokio::spawn(alternate(self.api.clone(), all, ns, svc, stop.clone())));
        }
        let mut record = Isolation {
            dc: self.dcs[side].name.clone(),
            member: k as u64 + 1,
            was_leader: leader,
            ..Isolation::default()
        };
        let step_down = leader.then(|| {
            let (api, base) = (self.api.clone(), self.dcs[side].nodes[k].base.clone());
            tokio::spawn(watch_step_down(api, base, at, stop.clone()))
        });
        let mut note = format!("n{} cut off", k + 1);
        let next =
            if leader { Some(self.serving_member(side, Some(k), at + FAILOVER_WAIT).await?) } else { None };
        if let Some(next) = next {
            let gap = at.elapsed().as_millis() as u64;
            record.next = Some((next as u64 + 1, gap));
            note.push_str(&format!("; n{} served writes {gap}ms later", next + 1));
        }
        self.dcs[side].cut = Some(MemberCut { member: k, record, stop, tasks, step_down });
        Ok(note)
    }

    /// Joins the cut-off member to its group again: heals its links, stops the probes and
    /// waits until it follows the serving leader and applied what that leader had.
    pub(super) async fn rejoin(&mut self, side: usize) -> anyhow::Result<String> {
        let Some(cut) = self.dcs[side].cut.take() else { bail!("rejoin without a member cut off") };
        for r in self.member_relays[side].iter().filter(|r| r.from == cut.member || r.to == cut.member) {
            r.relay.handle().heal();
        }
        cut.stop.store(true, Ordering::Relaxed);
        let mut record = cut.record;
        if let Some(t) = cut.step_down {
            record.stepped_down_ms = t.await.ok().flatten();
        }
        for t in cut.tasks {
            if let Ok(p) = t.await {
                record.probes.merge(p);
            }
        }
        let leader = self.wait_follows(side, cut.member, Instant::now() + REJOIN_WAIT).await?;
        let stepped = match (record.was_leader, record.stepped_down_ms) {
            (false, _) => String::new(),
            (true, Some(ms)) => format!("; it had stopped serving {ms}ms after the cut"),
            (true, None) => "; it never stopped serving while cut off".to_owned(),
        };
        let note = format!(
            "n{} follows n{} again ({} probe writes acked, {} refused, {} unknown{stepped})",
            cut.member + 1,
            leader + 1,
            record.probes.writes_acked,
            record.probes.writes_refused,
            record.probes.writes_unknown
        );
        self.isolations.push(record);
        Ok(note)
    }

    /// Waits (until `deadline`) until `member` follows the member serving writes and applied
    /// what that one had applied when asked; returns the leader (index).
    pub(super) async fn wait_follows(
        &self,
        side: usize,
        member: usize,
        deadline: Instant,
    ) -> anyhow::Result<usize> {
        // Not `member`: a leader cut off that never stepped down still says it serves.
        let leader = self.serving_member(side, Some(member), deadline).await?;
        let (lb, mb) = (self.dcs[side].nodes[leader].base.clone(), self.dcs[side].nodes[member].base.clone());
        loop {
            let l = self.api.status(&lb, Duration::from_secs(1)).await.ok().and_then(|(_, r)| cluster_of(&r));
            let m = self.api.status(&mb, Duration::from_secs(1)).await.ok().and_then(|(_, r)| cluster_of(&r));
            if let (Some((_, _, la)), Some((false, Some(ml), ma))) = (l, m) {
                if ml == self.dcs[side].nodes[leader].id && ma >= la {
                    return Ok(leader);
                }
            }
            if Instant::now() > deadline {
                let ids = (self.dcs[side].nodes[member].id, self.dcs[side].nodes[leader].id);
                bail!("n{} did not follow n{} and catch up in time", ids.0, ids.1);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every member cut off so far (once it rejoined).
    pub fn isolations(&self) -> &[Isolation] {
        &self.isolations
    }

    /// The probe instances each DC shows (`ns`, [`PROBE_SERVICE`]), or why not.
    pub async fn probe_visible(&self, ns: &str) -> Result<[BTreeSet<String>; 2], String> {
        let mut out: [BTreeSet<String>; 2] = Default::default();
        for (side, dc) in self.dcs.iter().enumerate() {
            let v = self
                .api
                .view(&dc.base, ns, PROBE_SERVICE, ViewScope::All, Duration::from_secs(3))
                .await
                .map_err(|e| format!("{}: cannot read {PROBE_SERVICE}: {e}", dc.name))?;
            out[side] = v.instances.into_iter().map(|i| i.id).collect();
        }
        Ok(out)
    }
}

/// Polls a cut-off leader's status until it no longer serves writes (how long after `at`)
/// or `stop` (None). Not stopping within [`STEP_DOWN_WAIT`] is an answer too (None).
async fn watch_step_down(api: Api, base: String, at: Instant, stop: Arc<AtomicBool>) -> Option<u64> {
    while !stop.load(Ordering::Relaxed) && at.elapsed() < STEP_DOWN_WAIT {
        if let Ok((_, raw)) = api.status(&base, Duration::from_millis(1_500)).await {
            if cluster_of(&raw).is_some_and(|(serving, _, _)| !serving) {
                return Some(at.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// Registrations sent to the cut-off member until `stop`.
async fn probe_writes(api: Api, base: String, ns: String, side: usize, stop: Arc<AtomicBool>) -> Probes {
    let mut p = Probes::default();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = format!("probe-{side}-{n}-{:08x}", rand::random::<u32>());
        match api.register(&base, &ns, PROBE_SERVICE, &id, "10.9.9.9", 9, true, 0, PROBE_TIMEOUT).await {
            Outcome::Acked { .. } => {
                p.writes_acked += 1;
                p.acked_ids.push(id);
            }
            Outcome::Failed { .. } => {
                p.writes_refused += 1;
                p.refused_ids.push(id);
            }
            Outcome::Pending => p.writes_unknown += 1,
            Outcome::Unknown { message } => {
                // `no_leader` and `not_leader` wrote nothing; `leader_unreachable` and a
                // timeout leave the write in doubt.
                if message.starts_with("503 no_leader") || message.starts_with("503 not_leader") {
                    p.writes_refused += 1;
                    p.refused_ids.push(id);
                } else {
                    p.writes_unknown += 1;
                }
            }
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    p
}

/// Plain reads of the cut-off member until `stop`.
async fn probe_reads(api: Api, base: String, ns: String, svc: String, stop: Arc<AtomicBool>) -> Probes {
    let mut p = Probes::default();
    while !stop.load(Ordering::Relaxed) {
        match api.read_member(&base, &ns, &svc, None, PROBE_TIMEOUT).await {
            Ok(r) if r.status == 200 => {
                p.reads_answered += 1;
                p.last_contact_max_ms = p.last_contact_max_ms.max(r.last_contact_ms);
            }
            Ok(r) => {
                p.reads_failed += 1;
                p.note(format!("a plain read of the cut-off member answered {} {}", r.status, r.code));
            }
            Err(e) => {
                p.reads_failed += 1;
                p.note(format!("a plain read of the cut-off member failed: {e}"));
            }
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    p
}

/// A client that reads each member in turn with a blocking query at the highest index it
/// saw, until `stop`.
async fn alternate(api: Api, members: Vec<String>, ns: String, svc: String, stop: Arc<AtomicBool>) -> Probes {
    let mut p = Probes::default();
    let mut seen = 0u64;
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let k = turn % members.len();
        turn += 1;
        let at = (seen > 0).then_some((seen, ALTERNATE_WAIT_MS));
        let timeout = PROBE_TIMEOUT + Duration::from_millis(ALTERNATE_WAIT_MS);
        match api.read_member(&members[k], &ns, &svc, at, timeout).await {
            Ok(r) if r.status == 200 => {
                p.alternate_reads += 1;
                match r.index {
                    Some(i) if i < seen => {
                        p.backwards += 1;
                        p.note(format!("n{} answered index {i} to a client that had seen {seen}", k + 1));
                    }
                    Some(i) => seen = i,
                    None => p.note(format!("n{} answered without an index", k + 1)),
                }
            }
            Ok(_) => p.alternate_refused += 1,
            Err(_) => p.alternate_refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p
}
