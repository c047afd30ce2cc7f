//! One DC's registry: the in-memory view every discovery reads, the leases every heartbeat
//! renews, and the write path that turns client requests into durable change events.
//!
//! Write path: a request is validated, turned into a [`ChangeEvent`] by a closure that the
//! committer runs with the current own mark (so seqs are assigned behind one boundary,
//! which a Raft group can later replace), made durable in one synced RocksDB batch shared
//! with concurrent writers, folded into the view by the commit callback, and only then
//! acknowledged. Replicated events from peers take the same callback, so the view always
//! equals the durable state.
//!
//! What this module must never do: write to disk on a heartbeat; decide the order of
//! events by wall-clock time; drop a remote DC's instances because its link broke.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tandem_replicator::log::StateChange;
use tandem_schemas::{
    ChangeEvent, DeregisterReason, Health, InstanceKey, InstanceRecord, Mark, Name, Op, Status, LIMITS,
};
use tokio::sync::watch;
use uuid::Uuid;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::ApiError;
use crate::failover::{self, Decision, FailoverState, LocalCounts, Policy};
use crate::health::{HealthConfig, NamespacePreservation, Transition};
use crate::leases::LeaseBook;
use crate::store::AppendLocal;

/// Bits of the watch index that count in-memory-only changes (failover switches) between
/// two durable writes; the higher bits count durable writes. See [`ViewIndex`].
const INDEX_BUMP_BITS: u32 = 20;

/// The watch index: `durable_writes << 20 | bumps`. Durable writes are counted in the
/// store (persisted in the same batch), and a restart counts as one, so the index never
/// goes backwards across restarts even though failover bumps are not persisted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ViewIndex(pub u64);

impl ViewIndex {
    pub fn from_durable(count: u64) -> Self {
        ViewIndex(count << INDEX_BUMP_BITS)
    }
    fn bumped(self) -> Self {
        let mask = (1u64 << INDEX_BUMP_BITS) - 1;
        if self.0 & mask == mask {
            self
        } else {
            ViewIndex(self.0 + 1)
        }
    }
}

/// One instance as held in the view. The record is shared: discovery and explain take
/// a reference count, not a copy.
#[derive(Clone, Debug)]
pub struct Held {
    pub seq: u64,
    pub record: Arc<InstanceRecord>,
}

struct Service {
    /// This service's names; every record held here shares them.
    names: ServiceId,
    index: u64,
    instances: BTreeMap<InstanceKey, Held>,
    notify: watch::Sender<u64>,
    /// The most recently removed instances, newest last (bounded), for `explain`.
    removed: std::collections::VecDeque<InstanceKey>,
    /// Owner DCs that ever held an instance of this service (a handful).
    owners: Vec<Name>,
    /// Zones and application versions seen in this service, shared by its records
    /// (at most `INTERNED_MAX` each; further values are kept per record).
    zones: Vec<Name>,
    versions: Vec<Name>,
}

/// Most distinct zones (and versions) a service shares among its records.
const INTERNED_MAX: usize = 16;

/// The shared copy of `name` from `seen`, adding it while there is room.
fn intern(seen: &mut Vec<Name>, name: &Name) -> Name {
    if let Some(shared) = seen.iter().find(|n| **n == *name) {
        return shared.clone();
    }
    if seen.len() < INTERNED_MAX {
        seen.push(name.clone());
    }
    name.clone()
}

impl Service {
    fn new(index: u64, names: ServiceId) -> Self {
        Service {
            names,
            index,
            instances: BTreeMap::new(),
            notify: watch::channel(index).0,
            removed: Default::default(),
            owners: Vec::new(),
            zones: Vec::new(),
            versions: Vec::new(),
        }
    }

    /// Holds `record`, with its names interned: the namespace, service and owner DC are
    /// the ones every instance of the service shares, and a replaced instance keeps its id
    /// allocation, so a record costs its own fields only.
    fn put(&mut self, seq: u64, mut record: InstanceRecord) {
        let key = &mut record.key;
        key.namespace = self.names.0.clone();
        key.service = self.names.1.clone();
        match self.owners.iter().find(|o| **o == key.owner_dc) {
            Some(owner) => key.owner_dc = owner.clone(),
            None => self.owners.push(key.owner_dc.clone()),
        }
        if let Some((held_key, _)) = self.instances.get_key_value(key) {
            key.instance_id = held_key.instance_id.clone();
        }
        record.zone = intern(&mut self.zones, &record.zone);
        record.app_version = intern(&mut self.versions, &record.app_version);
        self.removed.retain(|k| k != &record.key);
        self.instances.insert(record.key.clone(), Held { seq, record: Arc::new(record) });
    }
}

/// How many removed instances a service remembers for `explain`.
const REMOVED_REMEMBERED_MAX: usize = 32;

type ServiceId = (Name, Name);

/// Looks a [`ServiceId`] up by borrowed names, without building one. Hashes exactly as
/// the tuple does (field by field, each as a `str`).
#[derive(Hash)]
struct SvcRef<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<ServiceId> for SvcRef<'_> {
    fn equivalent(&self, key: &ServiceId) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

#[derive(Default)]
struct View {
    index: u64,
    services: hashbrown::HashMap<ServiceId, Service>,
}

/// Counters shown in /metrics and /v1/status.
#[derive(Debug, Default)]
pub struct Counters {
    pub heartbeats: AtomicU64,
    pub heartbeats_unknown: AtomicU64,
    pub registrations: AtomicU64,
    pub deregistrations: AtomicU64,
    pub expirations: AtomicU64,
    pub health_events: AtomicU64,
    pub events_local: AtomicU64,
    pub events_remote: AtomicU64,
    pub discover_requests: AtomicU64,
    pub watch_wakeups: AtomicU64,
    /// Streaming watches open now (a gauge).
    pub watch_streams: AtomicU64,
    /// POST /v1/heartbeats requests (their entries count in `heartbeats`).
    pub heartbeat_batches: AtomicU64,
}

/// A change to one local instance, turned into an event against the latest minted state.
#[derive(Clone, Debug)]
enum Patch {
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
    /// `Some(version)`: removes that registration only (a lease expiry); `None`: whatever
    /// registration is current (an explicit deregistration).
    Deregister(DeregisterReason, Option<u64>),
}

/// What a committed patch did, as its caller sees it. Short-lived and rare: size is fine.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
enum Outcome {
    Written(ChangeEvent),
    Unchanged,
    Gone,
}

/// What a patch did.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
enum Minted {
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
struct Pending {
    seq: u64,
    record: Option<InstanceRecord>,
}

type Overlay = HashMap<InstanceKey, Pending, foldhash::fast::RandomState>;

impl Patch {
    /// The registration this patch was judged on, if it names one.
    fn judged(&self) -> Option<u64> {
        match self {
            Patch::Health { version, .. } | Patch::Damped(_, version) => Some(*version),
            Patch::Deregister(_, version) => *version,
            Patch::Register(_) | Patch::Status(_) => None,
        }
    }

    /// The event this patch mints given the latest state of its key, which is the
    /// overlay's in-flight state if there is one, else `base` (the view). On `Op`, the
    /// overlay records the new state under `seq`. `lease`: the registration the key's
    /// lease belongs to now; a patch judged on another registration is `Gone` (it was about
    /// an instance that has been replaced or removed since).
    fn apply(
        self,
        key: &InstanceKey,
        overlay: &mut Overlay,
        seq: u64,
        base: impl FnOnce(&InstanceKey) -> Option<InstanceRecord>,
        lease: Option<u64>,
    ) -> Minted {
        if self.judged().is_some_and(|v| lease != Some(v)) {
            return Minted::Gone;
        }
        let current = match overlay.get(key) {
            Some(p) => p.record.clone(),
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
        };
        if matches!(minted, Minted::Op(_)) {
            overlay.insert(key.clone(), Pending { seq, record: after });
        }
        minted
    }

    fn modify(
        current: Option<InstanceRecord>,
        f: impl FnOnce(&mut InstanceRecord) -> bool,
    ) -> (Minted, Option<InstanceRecord>) {
        match current {
            None => (Minted::Gone, None),
            Some(mut r) => {
                if f(&mut r) {
                    (Minted::Op(Op::Update(r.clone())), Some(r))
                } else {
                    (Minted::Unchanged, None)
                }
            }
        }
    }
}

struct SettleOnDrop {
    overlay: Arc<Mutex<Overlay>>,
    mine: Arc<Mutex<Vec<(InstanceKey, u64)>>>,
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        let mine = std::mem::take(&mut *self.mine.lock());
        settle(&mut self.overlay.lock(), &mine);
    }
}

/// Drops the overlay entries that `settled` (key, seq) pairs left, unless a later write
/// of the same key has been minted since.
fn settle(overlay: &mut Overlay, settled: &[(InstanceKey, u64)]) {
    for (key, seq) in settled {
        if overlay.get(key).is_some_and(|p| p.seq == *seq) {
            overlay.remove(key);
        }
    }
}

/// Tells whether a remote origin's copies are stale (its link silent too long).
pub type StaleFn = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// State shared with the commit callback.
pub struct ViewCell {
    view: RwLock<View>,
    global: watch::Sender<u64>,
    counters: Arc<Counters>,
    local_dc: Name,
}

impl ViewCell {
    pub fn new(local_dc: &str, durable_writes: u64, counters: Arc<Counters>) -> Arc<Self> {
        let idx = ViewIndex::from_durable(durable_writes).0;
        Arc::new(ViewCell {
            view: RwLock::new(View { index: idx, services: Default::default() }),
            global: watch::channel(idx).0,
            counters,
            local_dc: local_dc.into(),
        })
    }

    /// Loads the durable state at start.
    pub fn load(&self, instances: Vec<(u64, InstanceRecord)>) {
        let mut v = self.view.write();
        let idx = v.index;
        for (seq, record) in instances {
            let sid = (record.key.namespace.clone(), record.key.service.clone());
            v.services.entry(sid.clone()).or_insert_with(|| Service::new(idx, sid)).put(seq, record);
        }
    }

    /// Folds one durable write into the view. `durable_writes` is the store's count of
    /// durable writes including this one.
    pub fn apply(&self, durable_writes: u64, changes: &[StateChange]) {
        if changes.is_empty() {
            return;
        }
        let mut v = self.view.write();
        let idx = ViewIndex::from_durable(durable_writes).0.max(v.index + 1);
        v.index = idx;
        let mut touched: Vec<ServiceId> = Vec::new();
        for ch in changes {
            match ch {
                StateChange::Put { seq, record } => {
                    if *record.key.owner_dc == *self.local_dc {
                        self.counters.events_local.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.counters.events_remote.fetch_add(1, Ordering::Relaxed);
                    }
                    let sid = (record.key.namespace.clone(), record.key.service.clone());
                    let svc = v.services.entry(sid.clone()).or_insert_with(|| Service::new(idx, sid.clone()));
                    svc.put(*seq, record.clone());
                    svc.index = idx;
                    touched.push(sid);
                }
                StateChange::Remove { key } => {
                    let sid = (key.namespace.clone(), key.service.clone());
                    if let Some(svc) = v.services.get_mut(&SvcRef(&key.namespace, &key.service)) {
                        if svc.instances.remove(key).is_some() {
                            svc.removed.retain(|k| k != key);
                            if svc.removed.len() >= REMOVED_REMEMBERED_MAX {
                                svc.removed.pop_front();
                            }
                            svc.removed.push_back(key.clone());
                        }
                        svc.index = idx;
                        touched.push(sid);
                    }
                }
            }
        }
        touched.sort();
        touched.dedup();
        for sid in touched {
            if let Some(svc) = v.services.get(&sid) {
                svc.notify.send_replace(idx);
            }
        }
        drop(v);
        self.global.send_replace(idx);
    }

    /// Bumps a service's index without a durable write (failover switched) and wakes
    /// its watchers.
    fn bump(&self, sid: &ServiceId) {
        let mut v = self.view.write();
        let idx = ViewIndex(v.index).bumped().0;
        v.index = idx;
        if let Some(svc) = v.services.get_mut(sid) {
            svc.index = idx;
            svc.notify.send_replace(idx);
        }
        drop(v);
        self.global.send_replace(idx);
    }

    pub fn index(&self) -> u64 {
        self.view.read().index
    }

    pub fn instance_count(&self) -> usize {
        self.view.read().services.values().map(|s| s.instances.len()).sum()
    }

    fn get(&self, key: &InstanceKey) -> Option<Held> {
        let v = self.view.read();
        v.services.get(&SvcRef(&key.namespace, &key.service))?.instances.get(key).cloned()
    }

    /// The shared names of a service the view holds.
    fn names(&self, ns: &str, svc: &str) -> Option<ServiceId> {
        self.view.read().services.get(&SvcRef(ns, svc)).map(|s| s.names.clone())
    }

    /// Finds an instance by (namespace, service, id) whatever its owner.
    /// O(owners x log n): a heartbeat must not scan the service.
    fn find(&self, ns: &str, svc: &str, id: &str) -> Option<Held> {
        let v = self.view.read();
        self.find_in(&v, ns, svc, id).cloned()
    }

    fn find_in<'v>(&self, v: &'v View, ns: &str, svc: &str, id: &str) -> Option<&'v Held> {
        let s = v.services.get(&SvcRef(ns, svc))?;
        let mut key = InstanceKey {
            owner_dc: self.local_dc.clone(),
            namespace: s.names.0.clone(),
            service: s.names.1.clone(),
            instance_id: id.into(),
        };
        if let Some(h) = s.instances.get(&key) {
            return Some(h);
        }
        for owner in &s.owners {
            if owner != &self.local_dc {
                key.owner_dc.clone_from(owner);
                if let Some(h) = s.instances.get(&key) {
                    return Some(h);
                }
            }
        }
        None
    }
}

pub use tandem_client::api::{
    DiscoverAnswer, ExplainLine, Failover, HeartbeatBatchAnswer, HeartbeatItem, Instance as InstanceView,
    RegisterAnswer, RegisterRequest, StatusName, Threshold, HEARTBEAT_BATCH_MAX,
};

/// The API's name of a status (as discovery and explain spell it).
fn status_name(s: Status) -> &'static str {
    tandem_client::api::Status::from(s).as_str()
}

/// The API's name of a health (as discovery and explain spell it).
fn health_name(h: Health) -> &'static str {
    tandem_client::api::Health::from(h).as_str()
}

/// How discovery selects instances.
#[derive(Clone, Debug, Default)]
pub enum DcFilter {
    /// Local instances plus remote ones as the failover policy says.
    #[default]
    Policy,
    /// Only this owner DC's instances, no policy.
    Only(String),
    /// Every DC's instances, no policy.
    All,
}

/// The registry of one DC node.
pub struct Registry {
    pub dc: Name,
    cfg: RwLock<Arc<Config>>,
    health: HealthConfig,
    committer: Arc<dyn AppendLocal>,
    view: Arc<ViewCell>,
    /// Latest minted state of the local instances with writes in flight (see [`Pending`]):
    /// event builders (one at a time, on the committer thread) read and extend it; callers
    /// drop their entries once answered.
    minted: Arc<Mutex<Overlay>>,
    /// The leases of the local ephemeral instances, changed as their events are minted
    /// (see [`crate::leases`]).
    leases: Arc<LeaseBook>,
    failover: Mutex<HashMap<ServiceId, FailoverState>>,
    /// Last known staleness of each remote origin, to wake watchers when it flips.
    staleness: Mutex<BTreeMap<String, bool>>,
    pub counters: Arc<Counters>,
    /// Every time the registry reads (leases, failover, commit times) comes from here.
    clock: Arc<dyn Clock>,
    stale: RwLock<StaleFn>,
}

impl Registry {
    pub fn new(
        cfg: Arc<Config>,
        committer: Arc<dyn AppendLocal>,
        view: Arc<ViewCell>,
        counters: Arc<Counters>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let health = cfg.health_config();
        let reg = Arc::new(Registry {
            dc: cfg.dc.as_str().into(),
            health: health.clone(),
            committer,
            minted: Arc::new(Mutex::new(Overlay::default())),
            view,
            leases: Arc::new(LeaseBook::new(cfg.dc.as_str(), health.clone(), clock.clone())),
            failover: Mutex::new(HashMap::new()),
            staleness: Mutex::new(BTreeMap::new()),
            counters,
            clock,
            stale: RwLock::new(Arc::new(|_| false)),
            cfg: RwLock::new(cfg),
        });
        // Every local ephemeral instance found at start gets its lease back, at the health
        // its record published, with a full TTL of grace: a restart must never expire
        // instances that kept heartbeating elsewhere meanwhile, nor revive dead ones.
        {
            let v = reg.view.view.read();
            reg.leases
                .rebuild(v.services.values().flat_map(|s| s.instances.values()).map(|h| (h.seq, &*h.record)));
        }
        reg
    }

    pub fn set_stale_fn(&self, f: StaleFn) {
        *self.stale.write() = f;
    }

    pub fn config(&self) -> Arc<Config> {
        self.cfg.read().clone()
    }

    /// Replaces the failover policy (and other reloadable settings) at runtime.
    pub fn set_config(&self, cfg: Arc<Config>) {
        *self.cfg.write() = cfg;
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn view(&self) -> &Arc<ViewCell> {
        &self.view
    }

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

    /// Makes `patches` durable as events, in order. Each patch is turned into an event on
    /// the committer thread against the latest minted state of its key, so concurrent
    /// writers of one instance (a status change racing a health change) never overwrite
    /// each other's fields. Returns one entry per patch: `Written(event)`, `Unchanged`, or
    /// `Gone` when the instance is not live any more.
    async fn commit(&self, patches: Vec<(InstanceKey, Patch)>) -> Result<Vec<Outcome>, ApiError> {
        let dc = self.dc.clone();
        let minted = self.minted.clone();
        let view = self.view.clone();
        let clock = self.clock.clone();
        let leases = self.leases.clone();
        let keys: Vec<InstanceKey> = patches.iter().map(|(k, _)| k.clone()).collect();
        let outcome: Arc<Mutex<Vec<Option<u64>>>> = Arc::new(Mutex::new(Vec::new()));
        let out = outcome.clone();
        let mine: Arc<Mutex<Vec<(InstanceKey, u64)>>> = Arc::new(Mutex::new(Vec::new()));
        let mine_in = mine.clone();
        // Once answered, the view holds what was written (or, on failure, the durable state
        // stands), so this call's in-flight entries leave the overlay; also when the caller
        // goes away mid-write.
        let _settle = SettleOnDrop { overlay: self.minted.clone(), mine: mine.clone() };
        let written = self
            .committer
            .append_local_boxed(Box::new(move |mark: Mark| {
                let now = clock.wall_ms();
                let mut minted = minted.lock();
                let mut seq = mark.seq;
                let mut events = Vec::new();
                let mut outcome = out.lock();
                let mut mine = mine_in.lock();
                for (key, patch) in patches {
                    let registration = matches!(patch, Patch::Register(_));
                    let judged = patch.judged();
                    let lease = leases.version_of(&key);
                    let base = |k: &InstanceKey| view.get(k).map(|h| Arc::unwrap_or_clone(h.record));
                    let op = match patch.apply(&key, &mut minted, seq + 1, base, lease) {
                        Minted::Op(op) => op,
                        Minted::Unchanged => {
                            outcome.push(Some(0));
                            continue;
                        }
                        Minted::Gone => {
                            // A decision about a registration that is gone: its lease too.
                            if let Some(v) = judged {
                                leases.forget(&key, v);
                            }
                            outcome.push(None);
                            continue;
                        }
                    };
                    seq += 1;
                    // The leases follow the minted sequence: a registration's lease starts
                    // with its event, a deregistration's removal with its tombstone.
                    leases.minted(&key, registration, &op, seq);
                    outcome.push(Some(seq));
                    mine.push((key, seq));
                    events.push(ChangeEvent {
                        event_id: Uuid::now_v7(),
                        origin_dc: dc.to_string(),
                        origin_epoch: mark.epoch,
                        seq,
                        commit_time_ms: now,
                        op,
                    });
                }
                events
            }))
            .await;
        let events = match written {
            Ok(events) => events,
            Err(e) => {
                // Nothing of this call is durable: the durable state decides the leases.
                for key in &keys {
                    self.leases.reconcile(key, self.view.get(key).as_ref().map(|h| (h.seq, &*h.record)));
                }
                return Err(ApiError::unavailable(format!("the event log refused the write: {e}")));
            }
        };
        let outcome = std::mem::take(&mut *outcome.lock());
        Ok(outcome
            .into_iter()
            .map(|o| match o {
                None => Outcome::Gone,
                Some(0) => Outcome::Unchanged,
                Some(seq) => {
                    events.iter().find(|e| e.seq == seq).cloned().map_or(Outcome::Gone, Outcome::Written)
                }
            })
            .collect())
    }

    /// POST /v1/register.
    pub async fn register(&self, req: RegisterRequest) -> Result<RegisterAnswer, ApiError> {
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
            key: key.clone(),
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
            health: Health::Healthy,
            damped: false,
        };
        tandem_schemas::validate_record(&record).map_err(ApiError::invalid)?;
        // The lease starts when the registration is minted (before the ack, so a heartbeat
        // racing the ack is kept), in the order of the events.
        let events = self.commit(vec![(key.clone(), Patch::Register(Box::new(record)))]).await?;
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        let Some(Outcome::Written(ev)) = events.into_iter().next() else {
            return Err(ApiError::unavailable("the registration was not written"));
        };
        Ok(RegisterAnswer {
            instance_id,
            owner_dc: self.dc.to_string(),
            version: ev.seq,
            epoch: ev.origin_epoch,
            lease_ttl_ms: ttl_ms,
        })
    }

    fn local_key(&self, ns: &str, svc: &str, id: &str) -> Result<(InstanceKey, Held), ApiError> {
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

    /// POST /v1/heartbeats: renews many leases in one call (an agent or SDK that holds
    /// many instances). Same rules as [`Registry::heartbeat`] for each entry; one view
    /// lookup pass and one lease-table pass for the whole batch. Entries that are unknown
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
        // (position, key) of the ephemeral instances to renew.
        let mut renew: Vec<(usize, InstanceKey)> = Vec::with_capacity(items.len());
        {
            let v = self.view.view.read();
            for (i, it) in items.iter().enumerate() {
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
        let now = self.now_ms();
        let mut transitions = Vec::new();
        for (i, key) in renew {
            match self.leases.heartbeat(&key, now) {
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
        let (key, held) = match self.local_key(ns, svc, id) {
            Ok(k) => k,
            Err(e) => {
                self.counters.heartbeats_unknown.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
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
    /// changes only when the patch is minted (see [`LeaseBook::minted`]).
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

    /// DELETE /v1/instances: explicit deregistration; returns the tombstone's seq.
    pub async fn deregister(&self, ns: &str, svc: &str, id: &str) -> Result<u64, ApiError> {
        let (key, _) = self.local_key(ns, svc, id)?;
        // The lease goes when the deregistration is minted, not when this call resumes: a
        // registration minted after it (a racing re-registration) keeps its own lease.
        let events = self.commit(vec![(key, Patch::Deregister(DeregisterReason::Explicit, None))]).await?;
        match events.into_iter().next() {
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
        let (key, held) = self.local_key(ns, svc, id)?;
        match self.commit(vec![(key, Patch::Status(status))]).await?.into_iter().next() {
            Some(Outcome::Written(ev)) => Ok(ev.seq),
            Some(Outcome::Unchanged) => Ok(held.seq),
            Some(Outcome::Gone) | None => {
                Err(ApiError::not_found(format!("instance {id} of {ns}/{svc} is already gone")))
            }
        }
    }

    /// One pass of the lease checker: ticks every lease, turns transitions into events
    /// (one durable batch), and re-evaluates failover of services whose state may switch
    /// with time. Called every `check_interval_ms`.
    pub async fn check_leases(&self) {
        let now = self.now_ms();
        self.leases.evaluate_preservation(now);
        let transitions = self.leases.check(now, false);
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

    /// A remote origin turning stale (or fresh again) changes the `stale` flags and maybe
    /// the policy's answer without any event: bump the services holding its instances so
    /// that blocking queries return.
    fn refresh_staleness(&self) {
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

    fn refresh_failover(&self, now: u64) {
        let sids: Vec<ServiceId> = self.failover.lock().keys().cloned().collect();
        for sid in sids {
            // evaluate_failover bumps the service's index itself when the decision flips.
            let _ = self.evaluate_failover(&sid, now);
        }
    }

    fn local_counts(&self, instances: &BTreeMap<InstanceKey, Held>) -> LocalCounts {
        let mut c = LocalCounts { healthy: 0, total: 0 };
        for h in instances.values().filter(|h| *h.record.key.owner_dc == *self.dc) {
            c.total += 1;
            if is_serving(&h.record) {
                c.healthy += 1;
            }
        }
        c
    }

    fn evaluate_failover(&self, sid: &ServiceId, now: u64) -> (Policy, LocalCounts, Decision) {
        let policy = self.config().failover.policy_for(&sid.0, &sid.1);
        let counts = {
            let v = self.view.view.read();
            v.services
                .get(sid)
                .map(|s| self.local_counts(&s.instances))
                .unwrap_or(LocalCounts { healthy: 0, total: 0 })
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

    /// The service's current index (for blocking queries).
    pub fn service_index(&self, ns: &str, svc: &str) -> u64 {
        let v = self.view.view.read();
        v.services.get(&SvcRef(ns, svc)).map_or(v.index, |s| s.index)
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
                    // Unknown services wait on the global index and look again.
                    None => (v.index, self.view.global.subscribe()),
                }
            };
            if cur > index {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {
                    self.counters.watch_wakeups.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(_)) => return,
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
        let index = v.services.get(&sid).map_or(v.index, |s| s.index);
        let empty = BTreeMap::new();
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
        let v = self.view.view.read();
        let mut m = BTreeMap::new();
        for s in v.services.values() {
            for h in s.instances.values() {
                *m.entry(h.record.key.owner_dc.to_string()).or_insert(0) += 1;
            }
        }
        m
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> InstanceRecord {
        tandem_replicator::log::conformance::record("dc-a", "i1")
    }

    #[test]
    fn concurrent_patches_of_one_instance_keep_each_others_fields() {
        // A status change and a health change minted back to back (as two requests of one
        // commit group would be) must both survive: each builds on the other.
        let key = rec().key;
        let mut minted = Overlay::default();
        let none = |_: &InstanceKey| None;
        assert!(matches!(
            Patch::Register(Box::new(rec())).apply(&key, &mut minted, 1, none, Some(1)),
            Minted::Op(Op::Register(_))
        ));
        let Minted::Op(Op::Update(a)) =
            Patch::Status(Status::Draining).apply(&key, &mut minted, 2, none, Some(1))
        else {
            panic!()
        };
        assert_eq!(a.status, Status::Draining);
        let Minted::Op(Op::Update(b)) = Patch::Health { health: Health::Suspect, damped: false, version: 1 }
            .apply(&key, &mut minted, 3, none, Some(1))
        else {
            panic!()
        };
        assert_eq!(
            (b.status, b.health),
            (Status::Draining, Health::Suspect),
            "status kept by the health update"
        );
        assert!(matches!(
            Patch::Status(Status::Draining).apply(&key, &mut minted, 4, none, Some(1)),
            Minted::Unchanged
        ));
        assert!(matches!(
            Patch::Deregister(DeregisterReason::Explicit, None).apply(&key, &mut minted, 4, none, Some(1)),
            Minted::Op(_)
        ));
        // A deregistration in flight hides what the (older) view still holds.
        let stale = |_: &InstanceKey| Some(rec());
        assert!(matches!(
            Patch::Status(Status::Up).apply(&key, &mut minted, 5, stale, Some(1)),
            Minted::Gone
        ));
        assert!(matches!(
            Patch::Deregister(DeregisterReason::Explicit, None).apply(&key, &mut minted, 5, stale, Some(1)),
            Minted::Gone
        ));
    }

    #[test]
    fn the_overlay_holds_only_writes_in_flight() {
        let key = rec().key;
        let mut minted = Overlay::default();
        let none = |_: &InstanceKey| None;
        assert!(matches!(
            Patch::Register(Box::new(rec())).apply(&key, &mut minted, 1, none, Some(1)),
            Minted::Op(_)
        ));
        assert!(matches!(
            Patch::Status(Status::Draining).apply(&key, &mut minted, 2, none, Some(1)),
            Minted::Op(_)
        ));
        // The first write is answered while the second is still in flight: the entry stays.
        settle(&mut minted, &[(key.clone(), 1)]);
        assert_eq!(minted.get(&key).map(|p| p.seq), Some(2));
        settle(&mut minted, &[(key.clone(), 2)]);
        assert!(minted.is_empty());
        // Settled: the next patch builds on the view's record.
        let mut in_view = rec();
        in_view.status = Status::Draining;
        in_view.weight = 7;
        let from_view = |_: &InstanceKey| Some(in_view.clone());
        let Minted::Op(Op::Update(r)) = Patch::Health { health: Health::Suspect, damped: false, version: 1 }
            .apply(&key, &mut minted, 3, from_view, Some(1))
        else {
            panic!()
        };
        assert_eq!((r.status, r.weight, r.health), (Status::Draining, 7, Health::Suspect));
    }

    #[test]
    fn decisions_about_another_registration_change_nothing() {
        // Issue 12 §2: an expiry (or a health change) judged on registration 1 must not
        // touch registration 2 of the same id, acknowledged in between.
        let key = rec().key;
        let mut minted = Overlay::default();
        let live = |_: &InstanceKey| Some(rec());
        let expire = Patch::Deregister(DeregisterReason::LeaseExpired, Some(1));
        assert!(matches!(expire.clone().apply(&key, &mut minted, 5, live, Some(2)), Minted::Gone));
        let health = Patch::Health { health: Health::Unhealthy, damped: false, version: 1 };
        assert!(matches!(health.apply(&key, &mut minted, 5, live, Some(2)), Minted::Gone));
        assert!(matches!(Patch::Damped(true, 1).apply(&key, &mut minted, 5, live, None), Minted::Gone));
        assert!(minted.is_empty());
        // On its own registration, the expiry writes the tombstone.
        assert!(matches!(
            expire.apply(&key, &mut minted, 5, live, Some(1)),
            Minted::Op(Op::Deregister { .. })
        ));
    }

    #[test]
    fn the_view_index_moves_past_every_bump_after_a_durable_write() {
        let base = ViewIndex::from_durable(7);
        let mut i = base;
        for _ in 0..1000 {
            i = i.bumped();
        }
        assert!(ViewIndex::from_durable(8) > i);
    }
}
