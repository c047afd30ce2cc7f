//! Discovery: the answer to a service query (local tier with the protect threshold, remote
//! tiers as the failover policy says, or a DC filter), its explanation, failover evaluation
//! and remote staleness (both wake blocking queries), and the blocking-query waits.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tandem_schemas::{Health, InstanceRecord, Name, Status};
use tokio::sync::watch;

use super::instances::Instances;
use super::view::{Held, ServiceId, SvcRef};
use super::{DcFilter, DiscoverAnswer, ExplainLine, Failover, InstanceView, Registry, Threshold};
use crate::error::ApiError;
use crate::failover::{self, Decision, LocalCounts, Policy};

/// Most remote owners of one service whose stale flags [`Registry::answer_state`] packs; a
/// service whose instances come from more DCs has no answer kept encoded.
pub const STALE_FLAGS_MAX: usize = 64;

/// The stale flags of a service's remote owners at one moment, one bit per owner in the
/// order the view keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleFlags(u64);

/// The API's name of a status (as discovery and explain spell it).
fn status_name(s: Status) -> &'static str {
    tandem_client::api::Status::from(s).as_str()
}

/// The API's name of a health (as discovery and explain spell it).
fn health_name(h: Health) -> &'static str {
    tandem_client::api::Health::from(h).as_str()
}

impl Registry {
    /// A remote origin turning stale (or fresh again) changes the `stale` flags and maybe
    /// the policy's answer without any event: bump the services holding its instances so
    /// that blocking queries return.
    /// What the lease checker's pass does besides the leases, for a node that holds none
    /// (a DC group's follower): services whose failover may switch with time, and origins
    /// whose staleness flipped, wake their watchers.
    pub fn refresh_without_leases(&self) {
        self.refresh_failover(self.now_ms());
        self.refresh_staleness();
    }

    /// Whether remote origin `origin`'s copies are stale here now.
    pub fn origin_stale(&self, origin: &str) -> bool {
        let stale_fn = self.stale.read().clone();
        stale_fn(origin)
    }

    pub(super) fn refresh_staleness(&self) {
        let stale_fn = self.stale.read().clone();
        let by_origin: BTreeMap<Name, Vec<ServiceId>> = {
            let v = self.view.view.read();
            let mut m: BTreeMap<Name, Vec<ServiceId>> = BTreeMap::new();
            for (sid, svc) in &v.services {
                for owner in svc.owners.iter().filter(|o| **o != self.dc) {
                    if svc.instances.keys().any(|k| &k.owner_dc == owner) {
                        m.entry(owner.clone()).or_default().push(sid.clone());
                    }
                }
            }
            m
        };
        for (origin, sids) in by_origin {
            let now_stale = stale_fn(&origin);
            let was = self.staleness.lock().insert(origin.to_string(), now_stale);
            if was.is_some_and(|w| w != now_stale) {
                tracing::info!(origin = %origin, stale = now_stale, "remote origin staleness changed");
                for sid in &sids {
                    self.view.bump(sid);
                }
            }
        }
    }

    pub(super) fn refresh_failover(&self, now: u64) {
        // The state of services the view dropped goes with them.
        {
            let v = self.view.view.read();
            self.failover.lock().retain(|sid, _| v.services.contains_key(sid));
        }
        let sids: Vec<ServiceId> = self.failover.lock().keys().cloned().collect();
        for sid in sids {
            // evaluate_failover bumps the service's index itself when the decision flips.
            let _ = self.evaluate_failover(&sid, now);
        }
    }

    fn local_counts(&self, instances: &Instances) -> LocalCounts {
        let mut c = LocalCounts { healthy: 0, total: 0 };
        for h in instances.values().filter(|h| *h.record.key.owner_dc == *self.dc) {
            c.total += 1;
            if is_serving(&h.record) {
                c.healthy += 1;
            }
        }
        c
    }

    /// The failover decision for `sid`, kept (and switches bumping its index) only for a
    /// service the view holds: an absent one is judged from the initial state, and nothing
    /// is stored for it, so reads of made-up names leave nothing behind.
    fn evaluate_failover(&self, sid: &ServiceId, now: u64) -> (Policy, LocalCounts, Decision) {
        let policy = self.config().failover.policy_for(&sid.0, &sid.1);
        let counts = {
            let v = self.view.view.read();
            v.services.get(sid).map(|s| self.local_counts(&s.instances))
        };
        let Some(counts) = counts else {
            let none = LocalCounts { healthy: 0, total: 0 };
            self.failover.lock().remove(sid);
            let (_, decision) = failover::evaluate(&policy, &Default::default(), none, now);
            return (policy, none, decision);
        };
        let mut states = self.failover.lock();
        let state = states.get(sid).cloned().unwrap_or_default();
        let (next, decision) = failover::evaluate(&policy, &state, counts, now);
        let was = state.active;
        states.insert(sid.clone(), next);
        drop(states);
        if was != decision.active {
            tracing::info!(namespace = %sid.0, service = %sid.1, active = decision.active, reason = %decision.reason, "failover switched");
            self.view.bump(sid);
        }
        (policy, counts, decision)
    }

    /// The service's current index, and the stale flags of its remote owners now
    /// ([`StaleFlags`]): what an answer kept encoded must still match to be served again.
    /// A remote origin turning stale (or fresh) moves no index until the lease checker's
    /// next pass ([`Registry::refresh_without_leases`]), so the index alone does not say
    /// that a kept answer's `stale` flags are still true. No flags: no answer is kept (the
    /// view does not hold the service, or it has more than [`STALE_FLAGS_MAX`] remote owners).
    pub fn answer_state(&self, ns: &str, svc: &str) -> (u64, Option<StaleFlags>) {
        let stale_fn = self.stale.read().clone();
        let v = self.view.view.read();
        let Some(s) = v.services.get(&SvcRef(ns, svc)) else {
            return (self.view.absent_index(ns, svc), None);
        };
        let mut flags = 0u64;
        for (i, owner) in s.owners.iter().filter(|o| **o != self.dc).enumerate() {
            if i == STALE_FLAGS_MAX {
                return (s.index, None);
            }
            flags |= u64::from(stale_fn(owner)) << i;
        }
        (s.index, Some(StaleFlags(flags)))
    }

    /// A reader found an answer kept at index `seen` whose stale flags are no longer true:
    /// the flip moves the service's index (once, however many readers found it), so that its
    /// watchers learn it now rather than at the lease checker's next pass.
    pub fn staleness_moved(&self, ns: &str, svc: &str, seen: u64) {
        if self.view.bump_if_at(&SvcRef(ns, svc), seen) {
            self.counters.stale_flips_at_read.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The service's current index (for blocking queries).
    pub fn service_index(&self, ns: &str, svc: &str) -> u64 {
        let v = self.view.view.read();
        v.services.get(&SvcRef(ns, svc)).map_or_else(|| self.view.absent_index(ns, svc), |s| s.index)
    }

    /// A receiver of the service's index, when the view holds the service (a streaming
    /// watch keeps one for its whole life instead of subscribing per change).
    pub fn subscribe(&self, ns: &str, svc: &str) -> Option<watch::Receiver<u64>> {
        self.view.view.read().services.get(&SvcRef(ns, svc)).map(|s| s.notify.subscribe())
    }

    /// Waits until the service's index passes `index` or `wait` elapses.
    pub async fn wait_for(&self, ns: &str, svc: &str, index: u64, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (cur, mut rx) = {
                let v = self.view.view.read();
                match v.services.get(&SvcRef(ns, svc)) {
                    Some(s) => (s.index, s.notify.subscribe()),
                    // Absent services wait on their absence bucket and look again.
                    None => (self.view.absent_index(ns, svc), self.view.absent_subscribe(ns, svc)),
                }
            };
            if cur > index {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {
                    self.counters.watch_wakeups.fetch_add(1, Ordering::Relaxed);
                }
                // The service was dropped (emptied): look again, now at its bucket.
                Ok(Err(_)) => {}
                Err(_) => return,
            }
        }
    }

    /// GET /v1/services/{ns}/{svc}.
    pub fn discover(
        &self,
        ns: &str,
        svc: &str,
        filter: &DcFilter,
        explain: bool,
    ) -> Result<DiscoverAnswer, ApiError> {
        validate_query(ns, svc, filter)?;
        self.counters.discover_requests.fetch_add(1, Ordering::Relaxed);
        let sid: ServiceId = (ns.into(), svc.into());
        let now = self.now_ms();
        let (policy, counts, decision) = match filter {
            DcFilter::Policy => self.evaluate_failover(&sid, now),
            DcFilter::Only(_) | DcFilter::All => {
                let p = self.config().failover.policy_for(ns, svc);
                let c = {
                    let v = self.view.view.read();
                    v.services
                        .get(&sid)
                        .map(|s| self.local_counts(&s.instances))
                        .unwrap_or(LocalCounts { healthy: 0, total: 0 })
                };
                (p, c, Decision { active: false, reason: "dc filter given: no policy applied".into() })
            }
        };
        let stale_fn = self.stale.read().clone();
        let protect = self.config().protect_threshold(ns, svc);
        let v = self.view.view.read();
        let index = v.services.get(&sid).map_or_else(|| self.view.absent_index(ns, svc), |s| s.index);
        let empty = Instances::default();
        let instances = v.services.get(&sid).map_or(&empty, |s| &s.instances);

        let mut out = Vec::new();
        let mut lines = Vec::new();
        let mut protected = false;
        let mut offered_dcs: Vec<String> = Vec::new();
        let view_of = |h: &Held, stale: bool, weight: u32| InstanceView {
            instance_id: h.record.key.instance_id.clone(),
            owner_dc: h.record.key.owner_dc.clone(),
            address: h.record.address.clone(),
            port: h.record.port,
            zone: h.record.zone.clone(),
            weight,
            version: h.record.app_version.clone(),
            tags: h.record.tags.clone(),
            metadata: h.record.metadata.clone(),
            health: h.record.health.into(),
            status: h.record.status.into(),
            stale,
            persistent: h.record.persistent,
            damped: h.record.damped,
            seq: h.seq,
        };
        match filter {
            DcFilter::Only(_) | DcFilter::All => {
                for h in instances.values() {
                    let owner = &h.record.key.owner_dc;
                    let wanted = match filter {
                        DcFilter::Only(dc) => **owner == **dc,
                        DcFilter::All | DcFilter::Policy => true,
                    };
                    let stale = owner != &self.dc && stale_fn(owner);
                    if wanted {
                        out.push(view_of(h, stale, h.record.weight));
                    }
                    lines.push(ExplainLine {
                        instance_id: h.record.key.instance_id.to_string(),
                        owner_dc: owner.to_string(),
                        included: wanted,
                        reason: if wanted {
                            "dc filter matches".into()
                        } else {
                            "dc filter excludes its owner".into()
                        },
                    });
                }
            }
            DcFilter::Policy => {
                // Local tier, with the protect threshold.
                let share =
                    if counts.total == 0 { 1.0 } else { f64::from(counts.healthy) / f64::from(counts.total) };
                protected = counts.total > 0 && protect > 0.0 && share < protect;
                for h in instances.values().filter(|h| *h.record.key.owner_dc == *self.dc) {
                    let (included, reason) = local_verdict(&h.record, protected, protect);
                    if included {
                        out.push(view_of(h, false, h.record.weight));
                    }
                    lines.push(ExplainLine {
                        instance_id: h.record.key.instance_id.to_string(),
                        owner_dc: self.dc.to_string(),
                        included,
                        reason,
                    });
                }
                // Remote tiers, in priority order.
                let mut remote_dcs: Vec<String> = if policy.remote_dcs.is_empty() {
                    let mut d: Vec<String> = instances
                        .values()
                        .map(|h| h.record.key.owner_dc.to_string())
                        .filter(|d| **d != *self.dc)
                        .collect();
                    d.sort();
                    d.dedup();
                    d
                } else {
                    policy.remote_dcs.clone()
                };
                remote_dcs.retain(|d| **d != *self.dc);
                let global = policy.mode == failover::Mode::Global;
                let mut tier_taken = false;
                for dc in &remote_dcs {
                    let stale = stale_fn(dc);
                    let members: Vec<&Held> =
                        instances.values().filter(|h| *h.record.key.owner_dc == **dc).collect();
                    let eligible = |h: &Held| is_serving(&h.record) || h.record.status == Status::Draining;
                    let usable =
                        (!stale || policy.offer_stale) && members.iter().any(|h| is_serving(&h.record));
                    let take = decision.active && usable && (global || !tier_taken);
                    if take {
                        tier_taken = true;
                        offered_dcs.push(dc.clone());
                    }
                    for h in members {
                        let (included, reason) = if !decision.active {
                            (false, format!("remote DC {dc}: failover not active ({})", decision.reason))
                        } else if stale && !policy.offer_stale {
                            (
                                false,
                                format!("remote DC {dc} is stale and the policy does not offer stale copies"),
                            )
                        } else if !take && !usable {
                            (false, format!("remote DC {dc} has no healthy, up instance to offer"))
                        } else if !take {
                            (false, format!("remote DC {dc}: a higher-priority DC already serves"))
                        } else if !eligible(h) {
                            (
                                false,
                                format!(
                                    "remote instance is {} / {}",
                                    health_name(h.record.health),
                                    status_name(h.record.status)
                                ),
                            )
                        } else {
                            (true, format!("failover to remote DC {dc}"))
                        };
                        if included {
                            let w = (u64::from(h.record.weight) * u64::from(policy.remote_weight_pct) / 100)
                                as u32;
                            out.push(view_of(h, stale, w));
                        }
                        lines.push(ExplainLine {
                            instance_id: h.record.key.instance_id.to_string(),
                            owner_dc: dc.clone(),
                            included,
                            reason,
                        });
                    }
                }
                // Instances of DCs the policy does not list are explained too.
                for h in instances.values() {
                    let owner = &h.record.key.owner_dc;
                    if owner != &self.dc && !remote_dcs.iter().any(|d| **d == **owner) {
                        lines.push(ExplainLine {
                            instance_id: h.record.key.instance_id.to_string(),
                            owner_dc: owner.to_string(),
                            included: false,
                            reason: format!("remote DC {owner} is not in the policy's remote_dcs"),
                        });
                    }
                }
            }
        }
        if explain {
            // Recently removed instances: their tombstones keep them out for good.
            if let Some(s) = v.services.get(&sid) {
                for k in &s.removed {
                    lines.push(ExplainLine {
                        instance_id: k.instance_id.to_string(),
                        owner_dc: k.owner_dc.to_string(),
                        included: false,
                        reason:
                            "deregistered: a tombstone holds it out; an older registration never revives it"
                                .into(),
                    });
                }
            }
        }
        Ok(DiscoverAnswer {
            namespace: ns.to_owned(),
            service: svc.to_owned(),
            index,
            instances: out,
            failover: Some(Failover {
                active: decision.active,
                reason: decision.reason,
                mode: policy.mode.into(),
                local_healthy: counts.healthy,
                local_total: counts.total,
                threshold: Threshold {
                    min_healthy: policy.min_healthy,
                    min_healthy_pct: policy.min_healthy_pct,
                },
                dcs: offered_dcs,
            }),
            protected,
            explain: explain.then_some(lines),
        })
    }

    /// GET /v1/services: (service, instance count) of a namespace.
    pub fn list_services(&self, ns: &str) -> Result<Vec<(String, usize)>, ApiError> {
        tandem_schemas::validate_name("namespace", ns).map_err(ApiError::invalid)?;
        let v = self.view.view.read();
        let mut out: Vec<(String, usize)> = v
            .services
            .iter()
            .filter(|((n, _), s)| **n == *ns && !s.instances.is_empty())
            .map(|((_, s), svc)| (s.to_string(), svc.instances.len()))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Instance counts per owner DC (status and metrics).
    pub fn counts_by_owner(&self) -> BTreeMap<String, usize> {
        // Counted by name, not by a copy of it: a metrics scrape of a node holding a million
        // instances would otherwise allocate a million strings.
        let v = self.view.view.read();
        let mut m: BTreeMap<&str, usize> = BTreeMap::new();
        for s in v.services.values() {
            for h in s.instances.values() {
                *m.entry(&h.record.key.owner_dc).or_insert(0) += 1;
            }
        }
        m.into_iter().map(|(dc, n)| (dc.to_owned(), n)).collect()
    }
}

/// Checks the names of a discovery request.
pub fn validate_query(ns: &str, svc: &str, filter: &DcFilter) -> Result<(), ApiError> {
    tandem_schemas::validate_name("namespace", ns).map_err(ApiError::invalid)?;
    tandem_schemas::validate_name("service", svc).map_err(ApiError::invalid)?;
    match filter {
        DcFilter::Only(dc) => tandem_schemas::validate_dc("dc", dc).map_err(ApiError::invalid),
        DcFilter::Policy | DcFilter::All => Ok(()),
    }
}

/// Healthy or merely suspect, and up: counts as serving.
fn is_serving(r: &InstanceRecord) -> bool {
    matches!(r.health, Health::Healthy | Health::Suspect) && r.status == Status::Up
}

fn local_verdict(r: &InstanceRecord, protected: bool, protect: f64) -> (bool, String) {
    match (r.status, r.health) {
        (Status::OutOfService, _) => (false, "status out_of_service".into()),
        (Status::Up | Status::Draining, Health::Unhealthy) => {
            if protected {
                (true, format!("unhealthy, but included: healthy share below protect threshold {protect}"))
            } else {
                (false, "unhealthy".into())
            }
        }
        (Status::Draining, Health::Healthy | Health::Suspect) => {
            (true, "draining: listed but flagged".into())
        }
        (Status::Up, Health::Healthy) => (true, "local, healthy, up".into()),
        (Status::Up, Health::Suspect) => (true, "local, suspect (missed a heartbeat), up".into()),
    }
}
