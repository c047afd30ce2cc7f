//! The oracle of the node simulation: what the clients were told and what each DC shows,
//! checked after every step and at the end. Each check counts how often it actually judged
//! something, so a run in which a check never fired fails (see `Counts::zero_checks`).

use std::collections::BTreeMap;

use tandem::store::{CommitNotice, Committed, MemStore};
use tandem_replicator::log::EventLog;
use tandem_replicator::merge::Held;
use tandem_schemas::{DeregisterReason, InstanceKey, Op};

use super::world::{unhealthy_after_ms, Client, OpResult, CHECK_INTERVAL_MS, DC_NAMES, NS, STEP_MS, SVC};

/// One instance as a DC's registry shows it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub seq: u64,
    pub served: bool,
    pub health: &'static str,
    pub damped: bool,
}

/// How often each check judged something, and what the faults did.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub no_resurrection: u64,
    pub no_lost_ack: u64,
    pub no_lost_ack_across_restart: u64,
    pub expiry_justified: u64,
    pub convergence: u64,
    pub health_heartbeating_healthy: u64,
    pub health_silent_not_served: u64,
    pub lease_invariant: u64,
    // What the world did (not checks).
    pub races: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub duplicate_batches: u64,
    pub snapshots: u64,
    pub acked_writes: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.no_resurrection += o.no_resurrection;
        self.no_lost_ack += o.no_lost_ack;
        self.no_lost_ack_across_restart += o.no_lost_ack_across_restart;
        self.expiry_justified += o.expiry_justified;
        self.convergence += o.convergence;
        self.health_heartbeating_healthy += o.health_heartbeating_healthy;
        self.health_silent_not_served += o.health_silent_not_served;
        self.lease_invariant += o.lease_invariant;
        self.races += o.races;
        self.crashes += o.crashes;
        self.partitions += o.partitions;
        self.duplicate_batches += o.duplicate_batches;
        self.snapshots += o.snapshots;
        self.acked_writes += o.acked_writes;
    }

    /// The checks that never fired.
    pub fn zero_checks(&self) -> Vec<&'static str> {
        [
            ("no_resurrection", self.no_resurrection),
            ("no_lost_ack", self.no_lost_ack),
            ("no_lost_ack_across_restart", self.no_lost_ack_across_restart),
            ("expiry_justified", self.expiry_justified),
            ("convergence", self.convergence),
            ("health_heartbeating_healthy", self.health_heartbeating_healthy),
            ("health_silent_not_served", self.health_silent_not_served),
            ("lease_invariant", self.lease_invariant),
        ]
        .into_iter()
        .filter(|(_, n)| *n == 0)
        .map(|(name, _)| name)
        .collect()
    }
}

/// An acknowledged write of a client.
#[derive(Clone, Debug)]
struct Acked {
    seq: u64,
    register: bool,
    started_ms: u64,
    acked_ms: u64,
}

/// A lease expiry a DC committed.
#[derive(Clone, Debug)]
struct Expiry {
    client: usize,
    seq: u64,
    at_ms: u64,
}

pub struct Oracle {
    pub counts: Counts,
    pub violations: Vec<String>,
    /// (dc, id) -> client index.
    by_key: BTreeMap<(usize, String), usize>,
    acked: Vec<Vec<Acked>>,
    /// Last time each client started an operation (a sign of life).
    life_ms: Vec<u64>,
    /// Per DC: the highest tombstone seq ever seen per key (survives purges).
    tombstoned: Vec<BTreeMap<InstanceKey, u64>>,
    /// Per DC: whether each own instance is live, as the DC's own events say.
    own_live: Vec<BTreeMap<String, bool>>,
    restarts: Vec<Vec<u64>>,
    expiries: Vec<Expiry>,
}

impl Oracle {
    pub fn new(dcs: usize, clients: &[Client]) -> Oracle {
        Oracle {
            counts: Counts::default(),
            violations: Vec::new(),
            by_key: clients.iter().enumerate().map(|(i, c)| ((c.dc, c.id.clone()), i)).collect(),
            acked: vec![Vec::new(); clients.len()],
            life_ms: vec![0; clients.len()],
            tombstoned: vec![BTreeMap::new(); dcs],
            own_live: vec![BTreeMap::new(); dcs],
            restarts: vec![Vec::new(); dcs],
            expiries: Vec::new(),
        }
    }

    /// Records a violation: the first of each check.
    fn fail(&mut self, now: u64, check: &str, what: String) {
        let tag = format!("] {check}:");
        if !self.violations.iter().any(|v| v.contains(&tag)) {
            self.violations.push(format!("[{now} ms] {check}: {what}"));
        }
    }

    pub fn life_sign(&mut self, client: usize, now: u64) {
        self.life_ms[client] = self.life_ms[client].max(now);
    }

    pub fn restarted(&mut self, dc: usize, now: u64) {
        self.restarts[dc].push(now);
    }

    pub fn op_finished(&mut self, client: usize, started_ms: u64, now: u64, r: &OpResult) {
        if let OpResult::Registered(_) = r {
            // A registration's lease starts when it is written, by its answer at the latest.
            self.life_sign(client, now);
        }
        let (seq, register) = match r {
            OpResult::Registered(Ok(seq)) => (*seq, true),
            OpResult::Deregistered(Ok(seq)) => (*seq, false),
            _ => return,
        };
        self.counts.acked_writes += 1;
        self.acked[client].push(Acked { seq, register, started_ms, acked_ms: now });
    }

    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        now: u64,
        clients: &[Client],
        started: &[u64],
        notices: &[Vec<CommitNotice>],
        logs: &[Option<&MemStore>],
        views: &[Option<BTreeMap<(String, String), Seen>>],
        invariant: &[(usize, Result<usize, String>)],
        quiet: &[bool],
    ) {
        self.own_events(now, notices);
        self.tombstones(now, logs, views);
        self.acks(now, clients, logs);
        self.silent_not_served(now, clients, started, views, quiet);
        for (dc, r) in invariant {
            match r {
                Ok(0) => {}
                Ok(_) => self.counts.lease_invariant += 1,
                Err(e) => self.fail(now, "lease_invariant", format!("{}: {e}", DC_NAMES[*dc])),
            }
        }
    }

    /// No resurrection at the origin: after a deregistration, only a registration makes
    /// the instance live again (an update of a deregistered instance revives it).
    fn own_events(&mut self, now: u64, notices: &[Vec<CommitNotice>]) {
        for (dc, ns) in notices.iter().enumerate() {
            for n in ns {
                let Committed::Local { events, .. } = &n.committed else { continue };
                for ev in events {
                    let id = ev.op.key().instance_id.to_string();
                    let was = self.own_live[dc].get(&id).copied();
                    match &ev.op {
                        Op::Register(_) => {
                            self.own_live[dc].insert(id, true);
                        }
                        Op::Update(_) => {
                            if was == Some(false) {
                                self.counts.no_resurrection += 1;
                                self.fail(
                                    now,
                                    "no_resurrection",
                                    format!(
                                        "{}: update seq {} revived deregistered {id}",
                                        DC_NAMES[dc], ev.seq
                                    ),
                                );
                            }
                            self.own_live[dc].insert(id, true);
                        }
                        Op::Deregister { reason, .. } => {
                            if was == Some(false) {
                                self.fail(
                                    now,
                                    "no_resurrection",
                                    format!("{}: second deregistration seq {} of {id}", DC_NAMES[dc], ev.seq),
                                );
                            }
                            self.own_live[dc].insert(id.clone(), false);
                            if *reason == DeregisterReason::LeaseExpired {
                                if let Some(&client) = self.by_key.get(&(dc, id)) {
                                    self.expiries.push(Expiry { client, seq: ev.seq, at_ms: now });
                                }
                            }
                        }
                    }
                }
                // Every own event after a deregistration was judged.
                self.counts.no_resurrection +=
                    events.iter().filter(|e| matches!(e.op, Op::Register(_))).count() as u64;
            }
        }
    }

    /// No resurrection anywhere: once a DC held a tombstone of a key at seq t, neither its
    /// log nor its registry shows that key live at a seq at or below t.
    fn tombstones(
        &mut self,
        now: u64,
        logs: &[Option<&MemStore>],
        views: &[Option<BTreeMap<(String, String), Seen>>],
    ) {
        for (dc, log) in logs.iter().enumerate() {
            let Some(log) = log else { continue };
            for t in log.tombstones().unwrap_or_default() {
                let e = self.tombstoned[dc].entry(t.key.clone()).or_insert(0);
                *e = (*e).max(t.seq);
            }
            let mut bad = Vec::new();
            let mut judged = 0;
            for (seq, r) in log.instances().unwrap_or_default() {
                if let Some(t) = self.tombstoned[dc].get(&r.key) {
                    judged += 1;
                    if seq <= *t {
                        bad.push(format!(
                            "{}: {} live at seq {seq} under its tombstone {t}",
                            DC_NAMES[dc], r.key.instance_id
                        ));
                    }
                }
            }
            if let Some(Some(view)) = views.get(dc) {
                for ((owner, id), seen) in view {
                    let key = InstanceKey {
                        owner_dc: owner.as_str().into(),
                        namespace: NS.into(),
                        service: SVC.into(),
                        instance_id: id.as_str().into(),
                    };
                    if let Some(t) = self.tombstoned[dc].get(&key) {
                        judged += 1;
                        if seen.seq <= *t {
                            bad.push(format!(
                                "{}: registry shows {id} at seq {} under its tombstone {t}",
                                DC_NAMES[dc], seen.seq
                            ));
                        }
                    }
                }
            }
            self.counts.no_resurrection += judged;
            for b in bad {
                self.fail(now, "no_resurrection", b);
            }
        }
    }

    /// No lost ack: every acknowledged write is in its DC's log (or superseded by a later
    /// event of the key, or its tombstone purged), also across crashes.
    fn acks(&mut self, now: u64, clients: &[Client], logs: &[Option<&MemStore>]) {
        for (c, client) in clients.iter().enumerate() {
            let Some(log) = logs[client.dc] else { continue };
            let Some(last) = self.acked[c].iter().max_by_key(|a| a.seq).cloned() else { continue };
            let key = InstanceKey {
                owner_dc: DC_NAMES[client.dc].into(),
                namespace: NS.into(),
                service: SVC.into(),
                instance_id: client.id.as_str().into(),
            };
            let ok = match log.held(&key) {
                Held::Live { seq } => seq > last.seq || (seq == last.seq && last.register),
                Held::Tombstone { seq } => seq > last.seq || (seq == last.seq && !last.register),
                Held::Absent => log.purge_floor() >= last.seq,
            } && log.own_mark().seq >= last.seq;
            self.counts.no_lost_ack += 1;
            if self.restarts[client.dc].iter().any(|r| *r > last.acked_ms) {
                self.counts.no_lost_ack_across_restart += 1;
            }
            if !ok {
                self.fail(
                    now,
                    "no_lost_ack",
                    format!(
                        "{} {}: acked {:?} but the log holds {:?}",
                        DC_NAMES[client.dc],
                        client.id,
                        last,
                        log.held(&key)
                    ),
                );
            }
        }
    }

    /// Health truth, while running: an instance silent for its unhealthy time (counted
    /// from its last sign of life or its node's restart, whichever is later) is not served
    /// by its own DC. A sign of life: a heartbeat sent, a registration sent or answered.
    fn silent_not_served(
        &mut self,
        now: u64,
        clients: &[Client],
        started: &[u64],
        views: &[Option<BTreeMap<(String, String), Seen>>],
        quiet: &[bool],
    ) {
        for (c, client) in clients.iter().enumerate() {
            // Judged when every operation of the DC has been answered (its health events
            // are written).
            if !quiet[client.dc] {
                continue;
            }
            let Some(Some(view)) = views.get(client.dc) else { continue };
            let Some(seen) = view.get(&(DC_NAMES[client.dc].to_owned(), client.id.clone())) else { continue };
            let since = self.life_ms[c].max(started[client.dc]);
            let limit = since + unhealthy_after_ms(client.ttl_ms) + 2 * CHECK_INTERVAL_MS + STEP_MS;
            if now <= limit || seen.damped {
                continue;
            }
            self.counts.health_silent_not_served += 1;
            if seen.served {
                self.fail(
                    now,
                    "health_silent_not_served",
                    format!(
                        "{} {} is {} and served, silent since {} (restart {})",
                        DC_NAMES[client.dc], client.id, seen.health, self.life_ms[c], started[client.dc]
                    ),
                );
            }
        }
    }

    /// After healing and quiescence.
    pub fn finish(
        &mut self,
        now: u64,
        replicated: bool,
        clients: &[Client],
        started: &[u64],
        logs: &[&MemStore],
        views: &[Option<BTreeMap<(String, String), Seen>>],
    ) {
        if !replicated {
            self.fail(now, "convergence", "replication did not catch up after healing".into());
        }
        // Convergence: every DC holds each origin's live instances exactly.
        for (o, origin) in logs.iter().enumerate() {
            let own: Vec<_> = origin
                .instances()
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, r)| *r.key.owner_dc == *DC_NAMES[o])
                .collect();
            for (p, peer) in logs.iter().enumerate() {
                let held: Vec<_> = peer
                    .instances()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, r)| *r.key.owner_dc == *DC_NAMES[o])
                    .collect();
                self.counts.convergence += 1;
                if held != own {
                    self.fail(
                        now,
                        "convergence",
                        format!(
                            "{} holds {} of {}'s instances unlike the origin",
                            DC_NAMES[p],
                            held.len(),
                            DC_NAMES[o]
                        ),
                    );
                }
                let view_seqs: Vec<(String, u64)> = views[p]
                    .as_ref()
                    .map(|v| {
                        v.iter()
                            .filter(|((owner, _), _)| owner == DC_NAMES[o])
                            .map(|((_, id), s)| (id.clone(), s.seq))
                            .collect()
                    })
                    .unwrap_or_default();
                let log_seqs: Vec<(String, u64)> =
                    held.iter().map(|(s, r)| (r.key.instance_id.to_string(), *s)).collect();
                if view_seqs != log_seqs {
                    self.fail(
                        now,
                        "convergence",
                        format!("{}'s registry differs from its log for origin {}", DC_NAMES[p], DC_NAMES[o]),
                    );
                }
            }
        }
        // Health truth: a heartbeating instance ends healthy everywhere; a silent one is
        // served nowhere.
        for (c, client) in clients.iter().enumerate() {
            let key = (DC_NAMES[client.dc].to_owned(), client.id.clone());
            for (dc, view) in views.iter().enumerate() {
                let Some(view) = view else { continue };
                let seen = view.get(&key);
                if client.alive {
                    self.counts.health_heartbeating_healthy += 1;
                    if seen.map(|s| s.health) != Some("healthy") {
                        self.fail(
                            now,
                            "health_heartbeating_healthy",
                            format!(
                                "{} heartbeats but {} shows it {:?}",
                                client.id,
                                DC_NAMES[dc],
                                seen.map(|s| s.health)
                            ),
                        );
                    }
                } else if let Some(seen) = seen {
                    let since = self.life_ms[c].max(started[client.dc]);
                    if now > since + unhealthy_after_ms(client.ttl_ms) + 2 * CHECK_INTERVAL_MS + STEP_MS
                        && !seen.damped
                    {
                        self.counts.health_silent_not_served += 1;
                        if seen.served {
                            self.fail(
                                now,
                                "health_silent_not_served",
                                format!("{} is silent but {} serves it", client.id, DC_NAMES[dc]),
                            );
                        }
                    }
                }
            }
        }
        // Expiries: an expiry removes the registration it judged, which had been silent for
        // its TTL: no registration acknowledged (or restart) within the TTL before it.
        let expiries = std::mem::take(&mut self.expiries);
        for e in &expiries {
            let client = &clients[e.client];
            let Some(reg) = self.acked[e.client]
                .iter()
                .filter(|a| a.register && a.seq < e.seq)
                .max_by_key(|a| a.seq)
                .cloned()
            else {
                continue;
            };
            let restart = self.restarts[client.dc]
                .iter()
                .filter(|r| **r >= reg.started_ms && **r <= e.at_ms)
                .max()
                .copied();
            let since = reg.started_ms.max(restart.unwrap_or(0));
            self.counts.expiry_justified += 1;
            if e.at_ms < since + client.ttl_ms {
                self.fail(
                    now,
                    "expiry_justified",
                    format!(
                        "{} {}: expiry seq {} at {} ms removed registration seq {} started at {} ms (ttl {})",
                        DC_NAMES[client.dc],
                        client.id,
                        e.seq,
                        e.at_ms,
                        reg.seq,
                        reg.started_ms,
                        client.ttl_ms
                    ),
                );
            }
        }
    }
}
