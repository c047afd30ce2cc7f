//! The write path of the registry: patches (a change to one local instance) minted into
//! events on the committer thread against the overlay of writes still in flight (else the
//! view), and the requests that write: register, deregister, set status.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use tandem_schemas::{
    ChangeEvent, DeregisterReason, Health, InstanceKey, InstanceRecord, Mark, Op, Status, LIMITS,
};
use uuid::Uuid;

use tandem_replicator::log::LogError;

use super::owners::{OwnerChange, Writer};
use super::view::{Held, Refusal};
use super::{RegisterAnswer, RegisterRequest, Registry, REGISTER_BATCH_MAX};
use crate::error::ApiError;
use crate::store::{Built, CommitError, Settled};

/// A registration checked on its own and built, before the checks of its whole request.
pub(super) struct Prepared {
    record: InstanceRecord,
    /// As the request named it, or as generated.
    instance_id: String,
    ttl_ms: u64,
}

/// A change to one local instance, turned into an event against the latest minted state.
#[derive(Clone, Debug)]
pub(crate) enum Patch {
    /// Register or replace the whole record (client-set fields; health starts Healthy).
    Register(Box<InstanceRecord>),
    Status(Status),
    /// A health change judged on the lease of registration `version`.
    Health {
        health: Health,
        damped: bool,
        version: u64,
    },
    Damped(bool, u64),
    /// A change of a live record's fields decided against its latest minted state (the
    /// Consul front end's check results, `crate::compat`); never its key or lease.
    Edit(Edit),
    /// `Some(version)`: removes that registration only (a lease expiry); `None`: whatever
    /// registration is current (an explicit deregistration).
    Deregister(DeregisterReason, Option<u64>),
}

/// The change of [`Patch::Edit`]: returns whether it changed the record.
#[derive(Clone)]
pub(crate) struct Edit(pub(crate) Arc<dyn Fn(&mut InstanceRecord) -> bool + Send + Sync>);

impl std::fmt::Debug for Edit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Edit(..)")
    }
}

/// What a committed patch did, as its caller sees it. Short-lived and rare: size is fine.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
    Written(ChangeEvent),
    Unchanged,
    Gone,
    /// Another principal owns the instance (the 403 says which).
    Forbidden(ApiError),
}

/// What the builder decided for one patch.
enum Slot {
    Gone,
    Unchanged,
    Seq(u64),
    Forbidden(ApiError),
}

/// What a patch did.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Minted {
    Op(Op),
    /// The instance exists and already has the value.
    Unchanged,
    /// The instance is not (or no longer) live.
    Gone,
}

/// The latest minted state of a local instance whose write is still in flight: its seq
/// and its record (`None`: deregistered). Entries leave the overlay once their write has
/// been answered, by then the view holds the same state; so the overlay holds only the
/// instances with writes in flight, not a second copy of every record.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(super) seq: u64,
    pub(super) record: Option<InstanceRecord>,
}

pub(crate) type Overlay = HashMap<InstanceKey, Pending, foldhash::fast::RandomState>;

impl Patch {
    /// The registration this patch was judged on, if it names one.
    pub(crate) fn judged(&self) -> Option<u64> {
        match self {
            Patch::Health { version, .. } | Patch::Damped(_, version) => Some(*version),
            Patch::Deregister(_, version) => *version,
            Patch::Register(_) | Patch::Status(_) | Patch::Edit(_) => None,
        }
    }

    /// The event this patch mints given the latest state of its key, which is the
    /// overlay's in-flight state if there is one, else `base` (the view's shared record:
    /// copied only by the patches that may change a field of it, never by a registration
    /// or a deregistration). On `Op`, the overlay records the new state under `seq`. `lease`:
    /// the registration the key's lease belongs to now; a patch judged on another
    /// registration is `Gone` (it was about an instance that has been replaced or removed
    /// since).
    pub(crate) fn apply(
        self,
        key: &InstanceKey,
        overlay: &mut Overlay,
        seq: u64,
        base: impl FnOnce(&InstanceKey) -> Option<Arc<InstanceRecord>>,
        lease: Option<u64>,
    ) -> Minted {
        if self.judged().is_some_and(|v| lease != Some(v)) {
            return Minted::Gone;
        }
        let current = match overlay.get(key) {
            Some(p) => p.record.clone().map(Arc::new),
            None => base(key),
        };
        let (minted, after) = match self {
            Patch::Register(r) => {
                let op =
                    if current.is_some() { Op::Update((*r).clone()) } else { Op::Register((*r).clone()) };
                (Minted::Op(op), Some(*r))
            }
            Patch::Deregister(reason, _) => match current {
                Some(_) => (Minted::Op(Op::Deregister { key: key.clone(), reason }), None),
                None => return Minted::Gone,
            },
            Patch::Status(status) => Self::modify(current, |r| {
                let changed = r.status != status;
                r.status = status;
                changed
            }),
            Patch::Health { health, damped, .. } => Self::modify(current, |r| {
                let changed = r.health != health || r.damped != damped;
                r.health = health;
                r.damped = damped;
                changed
            }),
            Patch::Damped(damped, _) => Self::modify(current, |r| {
                let changed = r.damped != damped;
                r.damped = damped;
                changed
            }),
            Patch::Edit(edit) => Self::modify(current, |r| {
                let (key, ttl, persistent) = (r.key.clone(), r.lease_ttl_ms, r.persistent);
                let changed = (edit.0)(r);
                // What identifies the record and its lease is not the edit's to change.
                (r.key, r.lease_ttl_ms, r.persistent) = (key, ttl, persistent);
                changed
            }),
        };
        if matches!(minted, Minted::Op(_)) {
            overlay.insert(key.clone(), Pending { seq, record: after });
        }
        minted
    }

    fn modify(
        current: Option<Arc<InstanceRecord>>,
        f: impl FnOnce(&mut InstanceRecord) -> bool,
    ) -> (Minted, Option<InstanceRecord>) {
        match current {
            None => (Minted::Gone, None),
            Some(r) => {
                let mut r = Arc::unwrap_or_clone(r);
                if f(&mut r) {
                    (Minted::Op(Op::Update(r.clone())), Some(r))
                } else {
                    (Minted::Unchanged, None)
                }
            }
        }
    }
}

/// Drops the overlay entries that `settled` (key, seq) pairs left, unless a later write
/// of the same key has been minted since.
pub(super) fn settle(overlay: &mut Overlay, settled: &[(InstanceKey, u64)]) {
    for (key, seq) in settled {
        if overlay.get(key).is_some_and(|p| p.seq == *seq) {
            overlay.remove(key);
        }
    }
}

impl Registry {
    /// Makes `patches` durable as events, in order. Each patch is turned into an event on
    /// the committer thread against the latest minted state of its key, so concurrent
    /// writers of one instance (a status change racing a health change) never overwrite
    /// each other's fields. Returns one entry per patch: `Written(event)`, `Unchanged`, or
    /// `Gone` when the instance is not live any more.
    pub(super) async fn commit(&self, patches: Vec<(InstanceKey, Patch)>) -> Result<Vec<Outcome>, ApiError> {
        self.commit_as(patches, None).await
    }

    /// [`commit`](Self::commit) on behalf of `by`: each patch is first judged against the
    /// instance's latest minted owner (see [`super::owners`]), and a registration records
    /// `by` as the owner, in the same durable write. `None`: the node's own decisions
    /// (lease transitions), which no owner refuses.
    pub(super) async fn commit_as(
        &self,
        patches: Vec<(InstanceKey, Patch)>,
        by: Option<Writer>,
    ) -> Result<Vec<Outcome>, ApiError> {
        let dc = self.dc.clone();
        let minted = self.minted.clone();
        let view = self.view.clone();
        let clock = self.clock.clone();
        let leases = self.leases.clone();
        let owners = self.owners.clone();
        let outcome: Arc<Mutex<Vec<Slot>>> = Arc::new(Mutex::new(Vec::new()));
        let out = outcome.clone();
        let mine: Arc<Mutex<Vec<(InstanceKey, u64)>>> = Arc::new(Mutex::new(Vec::new()));
        let mine_in = mine.clone();
        let owned: Arc<Mutex<Vec<OwnerChange>>> = Arc::new(Mutex::new(Vec::new()));
        let owned_in = owned.clone();
        // Once the outcome is known, the view holds what was written (or, on failure, the
        // durable state stands), so this call's in-flight entries leave the overlay, and
        // on failure the durable state decides the leases of the keys it minted. This
        // runs on the committer, whether or not this call still waits: a caller that went
        // away (before or after its builder ran) leaves nothing behind.
        let (overlay, in_view, in_leases) = (self.minted.clone(), self.view.clone(), self.leases.clone());
        let settle_owners = self.owners.clone();
        let settle = Box::new(move |settled: Settled| {
            let mine = std::mem::take(&mut *mine.lock());
            settle(&mut overlay.lock(), &mine);
            settle_owners.lock().settle(&std::mem::take(&mut *owned.lock()), settled.written);
            if !settled.written {
                for (key, _) in &mine {
                    in_leases.reconcile(key, in_view.get(key).as_ref().map(|h| (h.seq, &*h.record)));
                }
            }
        });
        let written = self
            .committer
            .append_local_boxed(
                Box::new(move |mark: Mark| {
                    let now = clock.wall_ms();
                    let mut minted = minted.lock();
                    let mut owners = owners.lock();
                    let mut seq = mark.seq;
                    let mut built = Built::default();
                    let mut outcome = out.lock();
                    let mut mine = mine_in.lock();
                    let mut owned = owned_in.lock();
                    for (key, patch) in patches {
                        if let Some(w) = &by {
                            if let Err(e) = super::owners::judge(owners.current(&key).as_deref(), w, &key) {
                                outcome.push(Slot::Forbidden(e));
                                continue;
                            }
                        }
                        let registration = matches!(patch, Patch::Register(_));
                        let judged = patch.judged();
                        let lease = leases.version_of(&key);
                        let base = |k: &InstanceKey| view.get(k).map(|h| h.record);
                        let op = match patch.apply(&key, &mut minted, seq + 1, base, lease) {
                            Minted::Op(op) => op,
                            Minted::Unchanged => {
                                outcome.push(Slot::Unchanged);
                                continue;
                            }
                            Minted::Gone => {
                                // A decision about a registration that is gone: its lease too.
                                if let Some(v) = judged {
                                    leases.forget(&key, v);
                                }
                                outcome.push(Slot::Gone);
                                continue;
                            }
                        };
                        seq += 1;
                        // The leases follow the minted sequence: a registration's lease starts
                        // with its event, a deregistration's removal with its tombstone.
                        leases.minted(&key, registration, &op, seq);
                        // So do the owners: a registration records who made it, a
                        // deregistration removes the record.
                        let owner_change = match (&op, &by) {
                            (Op::Deregister { .. }, _) => Some(None),
                            (_, Some(w)) if registration => Some(Some(w.principal.clone())),
                            _ => None,
                        };
                        if let Some(owner) = owner_change {
                            if let Some(o) = &owner {
                                built.owners.push((seq, o.clone()));
                            }
                            let change = (key.clone(), seq, owner);
                            owners.mint(&change);
                            owned.push(change);
                        }
                        outcome.push(Slot::Seq(seq));
                        mine.push((key, seq));
                        built.events.push(ChangeEvent {
                            event_id: Uuid::now_v7(),
                            origin_dc: dc.to_string(),
                            origin_epoch: mark.epoch,
                            seq,
                            commit_time_ms: now,
                            op,
                        });
                    }
                    built
                }),
                settle,
            )
            .await;
        let events = match written {
            Ok(events) => events,
            Err(e @ CommitError::Unwritable { .. }) => return Err(ApiError::log_unwritable(e.to_string())),
            Err(CommitError::Log(LogError::Invalid(e))) => {
                return Err(ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    format!("the change would break the schema's rules: {e}"),
                ))
            }
            Err(e) => return Err(ApiError::unavailable(format!("the event log refused the write: {e}"))),
        };
        let outcome = std::mem::take(&mut *outcome.lock());
        Ok(outcome
            .into_iter()
            .map(|o| match o {
                Slot::Gone => Outcome::Gone,
                Slot::Unchanged => Outcome::Unchanged,
                Slot::Forbidden(e) => Outcome::Forbidden(e),
                Slot::Seq(seq) => {
                    events.iter().find(|e| e.seq == seq).cloned().map_or(Outcome::Gone, Outcome::Written)
                }
            })
            .collect())
    }

    /// POST /v1/register, as the anonymous principal (ACLs off).
    pub async fn register(&self, req: RegisterRequest) -> Result<RegisterAnswer, ApiError> {
        self.register_as(req, &Writer::anonymous()).await
    }

    /// POST /v1/register on behalf of `by`, who becomes the instance's owner; refused (403)
    /// when another principal owns it and `by` is not an admin.
    pub async fn register_as(&self, req: RegisterRequest, by: &Writer) -> Result<RegisterAnswer, ApiError> {
        self.register_with(req, by, Health::Healthy).await
    }

    /// [`register_as`](Self::register_as) with the health the record starts with (a
    /// Consul TTL check starts critical).
    pub(crate) async fn register_with(
        &self,
        req: RegisterRequest,
        by: &Writer,
        health: Health,
    ) -> Result<RegisterAnswer, ApiError> {
        let one = self.prepare(req, health)?;
        self.room(std::slice::from_ref(&one)).map_err(|(_, e)| e)?;
        let mut answers = self.write_registrations(vec![one], by).await.map_err(|(_, e)| e)?;
        answers.pop().ok_or_else(|| ApiError::unavailable("the registration was not written"))
    }

    /// POST /v1/registrations on behalf of `by`: many registrations in one durable write,
    /// one answer per entry in order. Each entry follows the rules of
    /// [`register_as`](Self::register_as), and the caps and quotas count the entries
    /// together; an entry that breaks a rule refuses the whole batch before anything is
    /// written, its position named (`instances[i]: ...`). Two entries naming one instance
    /// refuse it too. One exception: an entry another principal registered after the
    /// batch's ownership check (checked again on the committer) is refused (403) while the
    /// other entries are written; sending the batch again is safe.
    pub async fn register_batch_as(
        &self,
        reqs: Vec<RegisterRequest>,
        by: &Writer,
    ) -> Result<Vec<RegisterAnswer>, ApiError> {
        if reqs.len() > REGISTER_BATCH_MAX {
            return Err(ApiError::invalid_field(
                "instances",
                format!("at most {REGISTER_BATCH_MAX} per request, got {}", reqs.len()),
            ));
        }
        self.counters.register_batches.fetch_add(1, Ordering::Relaxed);
        let at = |i: usize, e: ApiError| e.at(&format!("instances[{i}]"));
        let mut batch = Vec::with_capacity(reqs.len());
        let mut seen: HashMap<(&str, &str, &str), usize> = HashMap::with_capacity(reqs.len());
        for (i, req) in reqs.into_iter().enumerate() {
            batch.push(self.prepare(req, Health::Healthy).map_err(|e| at(i, e))?);
        }
        for (i, p) in batch.iter().enumerate() {
            let k = &p.record.key;
            if let Some(first) = seen.insert((&k.namespace, &k.service, &k.instance_id), i) {
                return Err(at(
                    i,
                    ApiError::invalid_field(
                        "instance_id",
                        format!("names the same instance as instances[{first}] (one entry per instance)"),
                    ),
                ));
            }
        }
        drop(seen);
        self.room(&batch).map_err(|(i, e)| at(i, e))?;
        self.write_registrations(batch, by).await.map_err(|(i, e)| match i {
            Some(i) => at(i, e),
            None => e,
        })
    }

    /// A registration's checks that need no other entry of its request, and its record.
    fn prepare(&self, req: RegisterRequest, health: Health) -> Result<Prepared, ApiError> {
        let namespace = req.namespace.unwrap_or_else(|| "default".into());
        tandem_schemas::validate_name("namespace", &namespace).map_err(ApiError::invalid)?;
        tandem_schemas::validate_name("service", &req.service).map_err(ApiError::invalid)?;
        tandem_schemas::validate_address(&req.address).map_err(ApiError::invalid)?;
        let port = u16::try_from(req.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ApiError::invalid_field("port", "must be 1 to 65535"))?;
        let persistent = req.persistent.unwrap_or(false);
        let ttl_ms = match (persistent, req.ttl_ms) {
            (true, Some(_)) => {
                return Err(ApiError::invalid_field("ttl_ms", "persistent instances have no lease"))
            }
            (true, None) => 0,
            (false, None) => self.health.expire_after_ms,
            (false, Some(t)) => {
                let min = crate::health::LEASE_TTL_MS_MIN;
                if t < min || t > u64::from(LIMITS.lease_ttl_ms_max) {
                    return Err(ApiError::invalid_field(
                        "ttl_ms",
                        format!("must be {min} to {}", LIMITS.lease_ttl_ms_max),
                    ));
                }
                t
            }
        };
        let instance_id = match req.instance_id {
            Some(id) => id,
            None => {
                let host = if req.address.contains(':') {
                    format!("[{}]", req.address)
                } else {
                    req.address.clone()
                };
                format!("{}#{}:{}#{}", req.service, host, port, Uuid::new_v4())
            }
        };
        // The service's shared names when it exists, so the lease shares them too.
        let (ns_name, svc_name) = self
            .view
            .names(&namespace, &req.service)
            .unwrap_or_else(|| (namespace.as_str().into(), req.service.as_str().into()));
        let key = InstanceKey {
            owner_dc: self.dc.clone(),
            namespace: ns_name,
            service: svc_name,
            instance_id: instance_id.as_str().into(),
        };
        if let Some(other) = self.view.find(&namespace, &req.service, &instance_id) {
            if *other.record.key.owner_dc != *self.dc {
                return Err(ApiError::conflict(format!(
                    "instance {instance_id} is owned by DC {}; deregister it there first",
                    other.record.key.owner_dc
                )));
            }
        }
        let record = InstanceRecord {
            key,
            address: req.address.into(),
            port,
            zone: req.zone.unwrap_or_default().into(),
            weight: req.weight.unwrap_or(100),
            app_version: req.version.unwrap_or_default().into(),
            tags: req.tags.unwrap_or_default(),
            metadata: req.metadata.unwrap_or_default(),
            persistent,
            lease_ttl_ms: u32::try_from(ttl_ms).unwrap_or(u32::MAX),
            status: req.status.map(Status::from).unwrap_or(Status::Up),
            health,
            damped: false,
        };
        tandem_schemas::validate_record(&record).map_err(ApiError::invalid)?;
        Ok(Prepared { record, instance_id, ttl_ms })
    }

    /// Whether the node's caps and the namespaces' quotas have room for `batch`, its
    /// entries counted together: a new service (or namespace) must fit the caps
    /// (replicated ones never are refused), and own instances, services and metadata bytes
    /// their namespace's quota. Checked against the view: registrations in flight may pass
    /// together (at most the committer's queue of them). Else the position of the first
    /// entry that does not fit, and its refusal (counted).
    fn room(&self, batch: &[Prepared]) -> Result<(), (usize, ApiError)> {
        let limits = self.config().limits.clone();
        let entries = batch.iter().map(|p| {
            let k = &p.record.key;
            (&*k.namespace, &*k.service, &*k.instance_id, super::view::metadata_bytes(&p.record.metadata))
        });
        let (i, refusal) = match self.view.room(entries, &limits) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let namespace = &batch[i].record.key.namespace;
        let e = match refusal {
            Refusal::Cap(key) => {
                let (counter, code, cap) = if key == "services_max" {
                    (&self.counters.refused_services_max, "too_many_services", limits.services_max)
                } else {
                    (&self.counters.refused_namespaces_max, "too_many_namespaces", limits.namespaces_max)
                };
                counter.fetch_add(1, Ordering::Relaxed);
                ApiError::new(
                    axum::http::StatusCode::INSUFFICIENT_STORAGE,
                    code,
                    format!(
                        "this node holds {cap} {} ([limits] {key}); register within an existing one or \
                         raise the cap",
                        if key == "services_max" { "services" } else { "namespaces" }
                    ),
                )
            }
            Refusal::Quota(key, cap) => {
                let counter = match key {
                    "instances_max" => &self.counters.refused_quota_instances,
                    "services_max" => &self.counters.refused_quota_services,
                    _ => &self.counters.refused_quota_metadata,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                ApiError::new(
                    axum::http::StatusCode::INSUFFICIENT_STORAGE,
                    "quota_exceeded",
                    format!(
                        "namespace {namespace} is at its quota: {key} = {cap} ([limits] namespace_{key}, or \
                         [limits.namespace.{namespace}] {key}); deregister instances or raise it"
                    ),
                )
            }
        };
        Err((i, e))
    }

    /// Writes checked registrations as one commit; the answers in order. The lease starts
    /// when a registration is minted (before the ack, so a heartbeat racing the ack is
    /// kept), in the order of the events. An error names the entry it is about, if one.
    async fn write_registrations(
        &self,
        batch: Vec<Prepared>,
        by: &Writer,
    ) -> Result<Vec<RegisterAnswer>, (Option<usize>, ApiError)> {
        let mut answers: Vec<RegisterAnswer> = Vec::with_capacity(batch.len());
        let mut patches = Vec::with_capacity(batch.len());
        for p in batch {
            answers.push(RegisterAnswer {
                instance_id: p.instance_id,
                owner_dc: self.dc.to_string(),
                version: 0,
                epoch: 0,
                lease_ttl_ms: p.ttl_ms,
            });
            patches.push((p.record.key.clone(), Patch::Register(Box::new(p.record))));
        }
        let outcomes = self.commit_as(patches, Some(by.clone())).await.map_err(|e| (None, e))?;
        let mut refused = None;
        for (i, (answer, outcome)) in answers.iter_mut().zip(outcomes).enumerate() {
            match outcome {
                Outcome::Written(ev) => {
                    self.counters.registrations.fetch_add(1, Ordering::Relaxed);
                    answer.version = ev.seq;
                    answer.epoch = ev.origin_epoch;
                }
                Outcome::Forbidden(e) => refused = refused.or(Some((Some(i), e))),
                _ => {
                    refused =
                        refused.or(Some((Some(i), ApiError::unavailable("the registration was not written"))))
                }
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(answers),
        }
    }

    pub(super) fn local_key(&self, ns: &str, svc: &str, id: &str) -> Result<(InstanceKey, Held), ApiError> {
        tandem_schemas::validate_name("namespace", ns).map_err(ApiError::invalid)?;
        tandem_schemas::validate_name("service", svc).map_err(ApiError::invalid)?;
        tandem_schemas::validate_instance_id(id).map_err(ApiError::invalid)?;
        let held = self
            .view
            .find(ns, svc, id)
            .ok_or_else(|| ApiError::not_found(format!("no instance {id} of {ns}/{svc}")))?;
        if *held.record.key.owner_dc != *self.dc {
            return Err(ApiError::conflict(format!(
                "instance {id} is owned by DC {}; only its owner may change it",
                held.record.key.owner_dc
            )));
        }
        Ok((held.record.key.clone(), held))
    }

    /// DELETE /v1/instances: explicit deregistration; returns the tombstone's seq.
    pub async fn deregister(&self, ns: &str, svc: &str, id: &str) -> Result<u64, ApiError> {
        self.deregister_as(ns, svc, id, &Writer::anonymous()).await
    }

    /// [`deregister`](Self::deregister) on behalf of `by` (its owner or an admin).
    pub async fn deregister_as(&self, ns: &str, svc: &str, id: &str, by: &Writer) -> Result<u64, ApiError> {
        let (key, _) = self.local_key(ns, svc, id)?;
        // The lease goes when the deregistration is minted, not when this call resumes: a
        // registration minted after it (a racing re-registration) keeps its own lease.
        let events = self
            .commit_as(vec![(key, Patch::Deregister(DeregisterReason::Explicit, None))], Some(by.clone()))
            .await?;
        match events.into_iter().next() {
            Some(Outcome::Forbidden(e)) => Err(e),
            Some(Outcome::Written(ev)) => {
                self.counters.deregistrations.fetch_add(1, Ordering::Relaxed);
                Ok(ev.seq)
            }
            Some(Outcome::Unchanged | Outcome::Gone) | None => {
                Err(ApiError::not_found(format!("instance {id} of {ns}/{svc} is already gone")))
            }
        }
    }

    /// PUT /v1/instances/../status.
    pub async fn set_status(&self, ns: &str, svc: &str, id: &str, status: Status) -> Result<u64, ApiError> {
        self.set_status_as(ns, svc, id, status, &Writer::anonymous()).await
    }

    /// [`set_status`](Self::set_status) on behalf of `by` (its owner or an admin).
    pub async fn set_status_as(
        &self,
        ns: &str,
        svc: &str,
        id: &str,
        status: Status,
        by: &Writer,
    ) -> Result<u64, ApiError> {
        let (key, held) = self.local_key(ns, svc, id)?;
        match self.commit_as(vec![(key, Patch::Status(status))], Some(by.clone())).await?.into_iter().next() {
            Some(Outcome::Forbidden(e)) => Err(e),
            Some(Outcome::Written(ev)) => Ok(ev.seq),
            Some(Outcome::Unchanged) => Ok(held.seq),
            Some(Outcome::Gone) | None => {
                Err(ApiError::not_found(format!("instance {id} of {ns}/{svc} is already gone")))
            }
        }
    }
}
