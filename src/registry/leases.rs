//! The registry's side of leases: heartbeats (one, or a batch) renewing them in memory,
//! the transitions a lease judges (health, damping, expiry) turned into patches, the lease
//! checker's pass with self-preservation, and the lease figures. Which registration a lease
//! belongs to is [`crate::leases`]; the state machine is [`crate::health`].

use std::sync::atomic::Ordering;

use tandem_schemas::{DeregisterReason, InstanceKey, InstanceNames};

use super::write::Patch;
use super::{HeartbeatBatchAnswer, HeartbeatItem, Registry, Writer, HEARTBEAT_BATCH_MAX};
use crate::error::ApiError;
use crate::health::{NamespacePreservation, Transition};

impl Registry {
    pub fn lease_count(&self) -> usize {
        self.leases.table().len()
    }

    /// Checks the lease invariant (see [`crate::leases::check_invariant`]) against the
    /// latest minted state: the view, overlaid with the writes in flight. Returns the
    /// number of leases.
    pub fn check_lease_invariant(&self) -> Result<usize, String> {
        let minted = self.minted.lock();
        let leases = self.leases.table();
        let v = self.view.view.read();
        let in_view = v.services.values().flat_map(|s| s.instances.values()).map(|h| &*h.record);
        let in_flight = minted.iter().map(|(k, p)| (k, p.record.as_ref()));
        crate::leases::check_invariant(&self.dc, in_view, in_flight, &leases)
    }

    /// Self-preservation per namespace, and the pauses the cap ended.
    pub fn preservation(&self) -> (Vec<NamespacePreservation>, u64) {
        self.leases.preservation()
    }

    /// POST /v1/heartbeats: renews many leases in one call (an agent or SDK that holds
    /// many instances). Same rules as [`Registry::heartbeat`] for each entry; one
    /// lease-table pass by name for the whole batch, then one view lookup pass and one
    /// lease-table pass for the entries the first did not renew. Entries that are unknown
    /// (the client re-registers them) or owned by another DC are reported by position;
    /// a malformed entry refuses the whole batch.
    pub async fn heartbeat_batch(&self, items: &[HeartbeatItem]) -> Result<HeartbeatBatchAnswer, ApiError> {
        if items.len() > HEARTBEAT_BATCH_MAX {
            return Err(ApiError::invalid_field(
                "instances",
                format!("at most {HEARTBEAT_BATCH_MAX} per request, got {}", items.len()),
            ));
        }
        for (i, it) in items.iter().enumerate() {
            let at =
                |e: tandem_schemas::ValidationError| ApiError::invalid_field(&format!("instances[{i}]"), e);
            tandem_schemas::validate_name("namespace", it.namespace()).map_err(at)?;
            tandem_schemas::validate_name("service", &it.service).map_err(at)?;
            tandem_schemas::validate_instance_id(&it.instance_id).map_err(at)?;
        }
        self.counters.heartbeat_batches.fetch_add(1, Ordering::Relaxed);
        let mut answer = HeartbeatBatchAnswer::default();
        let now = self.now_ms();
        let mut transitions = Vec::new();
        // First by name, as a single renewal does (see `renew_as`): the leases whose
        // registration the view shows. The rest take the view's steps.
        let names = items.iter().map(|it| InstanceNames {
            owner_dc: &self.dc,
            namespace: it.namespace(),
            service: &it.service,
            instance_id: &it.instance_id,
        });
        let mut rest = Vec::new();
        for (i, renewal) in
            self.leases.heartbeat_many_named(names, self.view.own_shown(), now).into_iter().enumerate()
        {
            match renewal {
                Some((version, transition)) => {
                    answer.renewed += 1;
                    if let Some((key, t)) = transition {
                        transitions.push((key, version, t));
                    }
                }
                None => rest.push(i),
            }
        }
        // (position, key) of the ephemeral instances to renew.
        let mut renew: Vec<(usize, InstanceKey)> = Vec::with_capacity(rest.len());
        if !rest.is_empty() {
            let v = self.view.view.read();
            for i in rest {
                let it = &items[i];
                match self.view.find_in(&v, it.namespace(), &it.service, &it.instance_id) {
                    None => answer.unknown.push(i),
                    Some(h) if h.record.key.owner_dc != self.dc => answer.conflict.push(i),
                    Some(h) => {
                        answer.renewed += 1;
                        if !h.record.persistent {
                            renew.push((i, h.record.key.clone()));
                        }
                    }
                }
            }
        }
        let renewed = self.leases.heartbeat_many(renew.iter().map(|(_, k)| k), now);
        for ((i, key), renewal) in renew.into_iter().zip(renewed) {
            match renewal {
                Some((version, Some(t))) => transitions.push((key, version, t)),
                Some((_, None)) => {}
                // No lease: its deregistration is in flight. Unknown: register again.
                None => {
                    answer.renewed -= 1;
                    answer.unknown.push(i);
                }
            }
        }
        answer.unknown.sort_unstable();
        self.counters.heartbeats.fetch_add(answer.renewed as u64, Ordering::Relaxed);
        self.counters.heartbeats_unknown.fetch_add(answer.unknown.len() as u64, Ordering::Relaxed);
        self.apply_transitions(transitions).await?;
        Ok(answer)
    }

    /// PUT /v1/heartbeat: renews the lease in memory. Never writes to disk, except when
    /// the renewal moves the instance's health (recovery), which is a visible change.
    pub async fn heartbeat(&self, ns: &str, svc: &str, id: &str) -> Result<(), ApiError> {
        self.renew_as(ns, svc, id, None).await
    }

    /// [`heartbeat`](Self::heartbeat) on behalf of `by`: its owner or an admin, or anyone
    /// with the scope when it has no owner (403 else). The instance is looked up once, for
    /// the owner check and the renewal.
    pub async fn heartbeat_as(&self, ns: &str, svc: &str, id: &str, by: &Writer) -> Result<(), ApiError> {
        self.renew_as(ns, svc, id, Some(by)).await
    }

    async fn renew_as(&self, ns: &str, svc: &str, id: &str, by: Option<&Writer>) -> Result<(), ApiError> {
        // The common case first: a writer that needs no owner check, renewing a lease whose
        // registration the view shows (so the view holds the instance, and it is this DC's
        // and ephemeral), found by its names with no key built and no view read. Any other
        // case (no such lease: unknown, persistent, another DC's, being deregistered, not
        // yet shown) takes the steps below and their answers.
        if by.is_none_or(|w| w.admin) {
            let names = InstanceNames { owner_dc: &self.dc, namespace: ns, service: svc, instance_id: id };
            let now = self.now_ms();
            if let Some((version, transition)) =
                self.leases.heartbeat_named(&names, self.view.own_shown(), now)
            {
                self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                if let Some((key, t)) = transition {
                    self.apply_transitions(vec![(key, version, t)]).await?;
                }
                return Ok(());
            }
        }
        let (key, held) = match self.local_key(ns, svc, id) {
            Ok(k) => k,
            Err(e) => {
                self.counters.heartbeats_unknown.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if let Some(by) = by.filter(|w| !w.admin) {
            let owner = self.owners.lock().current(&key);
            super::owners::judge(owner.as_deref(), by, &key)?;
        }
        let now = self.now_ms();
        if held.record.persistent {
            self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let Some((version, transition)) = self.leases.heartbeat(&key, now) else {
            // The view still shows it, but its deregistration is minted: it is gone.
            self.counters.heartbeats_unknown.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::not_found(format!("instance {id} of {ns}/{svc} is being deregistered")));
        };
        self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = transition {
            self.apply_transitions(vec![(key, version, t)]).await?;
        }
        Ok(())
    }

    /// Makes the transitions of heartbeats durable as events (none: nothing to write).
    async fn apply_transitions(
        &self,
        transitions: Vec<(InstanceKey, u64, Transition)>,
    ) -> Result<(), ApiError> {
        if transitions.is_empty() {
            return Ok(());
        }
        self.counters.health_events.fetch_add(transitions.len() as u64, Ordering::Relaxed);
        let patches = transitions
            .into_iter()
            .map(|(key, version, t)| {
                let patch = self.transition_patch(&key, version, t);
                (key, patch)
            })
            .collect();
        self.commit(patches).await.map(|_| ())
    }

    /// The patch of a lease transition judged on registration `version`; the lease itself
    /// changes only when the patch is minted (see
    /// [`LeaseBook::minted`](crate::leases::LeaseBook::minted)).
    fn transition_patch(&self, key: &InstanceKey, version: u64, t: Transition) -> Patch {
        match t {
            Transition::Health { to, damped } => Patch::Health { health: to, damped, version },
            Transition::Damped(damped) => Patch::Damped(damped, version),
            Transition::Expire => {
                self.counters.expirations.fetch_add(1, Ordering::Relaxed);
                tracing::info!(instance = %key.instance_id, service = %key.service, "lease expired");
                Patch::Deregister(DeregisterReason::LeaseExpired, Some(version))
            }
        }
    }

    /// One pass of the lease checker: ticks every lease, turns transitions into events
    /// (one durable batch), and re-evaluates failover of services whose state may switch
    /// with time. Called every `check_interval_ms`.
    pub async fn check_leases(&self) {
        let now = self.now_ms();
        let scan = std::time::Instant::now();
        self.leases.evaluate_preservation(now);
        let transitions = self.leases.check(now, false);
        let us = u64::try_from(scan.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.counters.lease_checks.fetch_add(1, Ordering::Relaxed);
        self.counters.lease_check_us.fetch_add(us, Ordering::Relaxed);
        self.counters.lease_check_us_max.fetch_max(us, Ordering::Relaxed);
        let mut patches = Vec::new();
        for (key, version, t) in transitions {
            let patch = self.transition_patch(&key, version, t);
            patches.push((key, patch));
        }
        if !patches.is_empty() {
            self.counters.health_events.fetch_add(patches.len() as u64, Ordering::Relaxed);
            // Bounded: at most BATCH_EVENTS_MAX events per durable write.
            while !patches.is_empty() {
                let rest = patches.split_off(patches.len().min(tandem_schemas::BATCH_EVENTS_MAX));
                if let Err(e) = self.commit(std::mem::replace(&mut patches, rest)).await {
                    tracing::error!(error = %e.message, "lease checker could not write health events");
                }
            }
        }
        self.refresh_failover(now);
        self.refresh_staleness();
    }
}
