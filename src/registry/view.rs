//! The in-memory view of one DC's registry: every held instance by service (records shared,
//! their repeated names interned per service), the watch index that blocking queries wait
//! on, and [`ViewCell`], which the commit callback folds every durable write into.
//!
//! A service exists while it holds an instance: its first instance creates it, the removal
//! of its last one drops it. A service the view does not hold (never registered, or
//! emptied) has the index of its *absence bucket*: one of [`ABSENT_BUCKETS`] indexes, chosen
//! by a hash of its names, moved only when a service of that bucket is created or dropped
//! (or on a reload that changes answers). So reading or watching an absent service stores
//! nothing, its index does not move with other services' writes, and its watchers wake
//! when it appears; and a service's index never goes backwards across a drop (the bucket
//! takes the dropping write's index).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;
use tandem_replicator::log::StateChange;
use tandem_schemas::{InstanceKey, InstanceRecord, Name};
use tokio::sync::watch;

use super::instances::Instances;
use super::Counters;

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
    pub(super) fn bumped(self) -> Self {
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

pub(super) struct Service {
    /// This service's names; every record held here shares them.
    pub(super) names: ServiceId,
    pub(super) index: u64,
    pub(super) instances: Instances,
    pub(super) notify: watch::Sender<u64>,
    /// The most recently removed instances, newest last (bounded), for `explain`.
    pub(super) removed: std::collections::VecDeque<InstanceKey>,
    /// Owner DCs that ever held an instance of this service (a handful).
    pub(super) owners: Vec<Name>,
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
            instances: Instances::default(),
            notify: watch::channel(index).0,
            removed: Default::default(),
            owners: Vec::new(),
            zones: Vec::new(),
            versions: Vec::new(),
        }
    }

    /// Holds `record`, with its names interned: the namespace, service and owner DC are
    /// the ones every instance of the service shares, and a replaced instance keeps its id
    /// allocation, so a record costs its own fields only. Returns the record it replaced.
    fn put(&mut self, seq: u64, mut record: InstanceRecord) -> Option<Arc<InstanceRecord>> {
        let key = &mut record.key;
        key.namespace = self.names.0.clone();
        key.service = self.names.1.clone();
        match self.owners.iter().find(|o| **o == key.owner_dc) {
            Some(owner) => key.owner_dc = owner.clone(),
            None => self.owners.push(key.owner_dc.clone()),
        }
        if let Some(held) = self.instances.get(key) {
            key.instance_id = held.record.key.instance_id.clone();
        }
        record.zone = intern(&mut self.zones, &record.zone);
        record.app_version = intern(&mut self.versions, &record.app_version);
        self.removed.retain(|k| k != &record.key);
        self.instances.insert(Held { seq, record: Arc::new(record) }).map(|old| old.record)
    }
}

/// How many removed instances a service remembers for `explain`.
const REMOVED_REMEMBERED_MAX: usize = 32;

pub(super) type ServiceId = (Name, Name);

/// Looks a [`ServiceId`] up by borrowed names, without building one. Hashes exactly as
/// the tuple does (field by field, each as a `str`).
#[derive(Hash)]
pub(super) struct SvcRef<'a>(pub(super) &'a str, pub(super) &'a str);

impl hashbrown::Equivalent<ServiceId> for SvcRef<'_> {
    fn equivalent(&self, key: &ServiceId) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

#[derive(Default)]
pub(super) struct View {
    pub(super) index: u64,
    pub(super) services: hashbrown::HashMap<ServiceId, Service>,
    /// What each namespace holds (namespaces holding no service are not listed).
    pub(super) namespaces: HashMap<Name, NsUsage>,
}

/// What one namespace holds: its services (every DC's), and this DC's own instances and
/// the bytes of their metadata (keys and values), which its quota bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsUsage {
    pub services: u64,
    pub instances: u64,
    pub metadata_bytes: u64,
}

/// What refuses a local registration: a node's cap (`services_max`, `namespaces_max`), or
/// its namespace's quota (the key and its value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Cap(&'static str),
    Quota(&'static str, u64),
}

/// The bytes of a record's metadata, as a namespace's quota counts them.
pub fn metadata_bytes(metadata: &std::collections::BTreeMap<String, String>) -> u64 {
    metadata.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

/// How many absence buckets (see the module's header) the view keeps: an absent service's
/// watchers wake for the creation or drop of about one service in this many.
pub const ABSENT_BUCKETS: usize = 1024;

impl View {
    /// The service `sid`, created (counted in its namespace) when absent; true when created.
    fn create(&mut self, sid: &ServiceId, idx: u64) -> (&mut Service, bool) {
        let created = !self.services.contains_key(sid);
        if created {
            self.namespaces.entry(sid.0.clone()).or_default().services += 1;
        }
        (self.services.entry(sid.clone()).or_insert_with(|| Service::new(idx, sid.clone())), created)
    }

    /// Holds `record` in its service (created when absent; true then) and moves the
    /// service's index to `idx`, counting an own record (`local`) in its namespace's usage.
    fn put_record(&mut self, idx: u64, seq: u64, record: InstanceRecord, local: bool) -> bool {
        let sid = (record.key.namespace.clone(), record.key.service.clone());
        let new = metadata_bytes(&record.metadata);
        let (svc, created) = self.create(&sid, idx);
        svc.index = idx;
        let old = svc.put(seq, record).map(|r| metadata_bytes(&r.metadata));
        if local {
            if let Some(u) = self.namespaces.get_mut(&sid.0) {
                if old.is_none() {
                    u.instances += 1;
                }
                u.metadata_bytes = (u.metadata_bytes + new).saturating_sub(old.unwrap_or(0));
            }
        }
        created
    }

    /// Uncounts a removed own record from its namespace's usage.
    fn uncount(&mut self, ns: &str, record: &InstanceRecord) {
        if let Some(u) = self.namespaces.get_mut(ns) {
            u.instances = u.instances.saturating_sub(1);
            u.metadata_bytes = u.metadata_bytes.saturating_sub(metadata_bytes(&record.metadata));
        }
    }

    /// Drops `sid` (which holds no instance any more) and uncounts it.
    fn drop_service(&mut self, sid: &ServiceId) {
        if self.services.remove(sid).is_some() {
            if let Some(n) = self.namespaces.get_mut(&sid.0) {
                n.services -= 1;
                if n.services == 0 {
                    self.namespaces.remove(&sid.0);
                }
            }
        }
    }
}

/// State shared with the commit callback.
pub struct ViewCell {
    pub(super) view: RwLock<View>,
    pub(super) global: watch::Sender<u64>,
    /// The absence buckets' indexes (see the module's header), and their hash.
    absent: Box<[watch::Sender<u64>]>,
    absent_hash: foldhash::fast::RandomState,
    counters: Arc<Counters>,
    local_dc: Name,
    /// The own log's seq up to which this view shows every event (see
    /// [`ViewCell::own_shown`]).
    own_shown: std::sync::atomic::AtomicU64,
}

impl ViewCell {
    pub fn new(local_dc: &str, durable_writes: u64, counters: Arc<Counters>) -> Arc<Self> {
        let idx = ViewIndex::from_durable(durable_writes).0;
        Arc::new(ViewCell {
            view: RwLock::new(View { index: idx, ..View::default() }),
            global: watch::channel(idx).0,
            absent: (0..ABSENT_BUCKETS).map(|_| watch::channel(idx).0).collect(),
            absent_hash: Default::default(),
            counters,
            local_dc: local_dc.into(),
            own_shown: Default::default(),
        })
    }

    /// Folds a commit notice into the view: its changes ([`ViewCell::apply`]), and the own
    /// seq it brings the view to ([`ViewCell::show_own`]).
    pub fn follow(&self, n: &crate::store::CommitNotice) {
        self.apply(n.index, n.changes());
        self.show_own(n.own_mark.seq);
    }

    /// The view shows every event of the own log up to `seq` (at start, once loaded; then
    /// after each durable write is applied).
    pub fn show_own(&self, seq: u64) {
        self.own_shown.store(seq, std::sync::atomic::Ordering::Release);
    }

    /// The own log's seq up to which this view shows every event: a registration minted
    /// at or below it is in the view (or was replaced or removed since, by later events
    /// also shown). 0 until told.
    pub fn own_shown(&self) -> u64 {
        self.own_shown.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Loads the durable state at start.
    pub fn load(&self, instances: impl IntoIterator<Item = (u64, InstanceRecord)>) {
        let loaded: Result<(), std::convert::Infallible> = self.try_load(instances.into_iter().map(Ok));
        let Ok(()) = loaded;
    }

    /// [`Self::load`] from records read one at a time: the first error ends the load
    /// (and the start: a view without every durable record must not serve).
    pub fn try_load<E>(
        &self,
        instances: impl IntoIterator<Item = Result<(u64, InstanceRecord), E>>,
    ) -> Result<(), E> {
        let mut v = self.view.write();
        let idx = v.index;
        for item in instances {
            let (seq, record) = item?;
            let local = *record.key.owner_dc == *self.local_dc;
            v.put_record(idx, seq, record, local);
        }
        Ok(())
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
        // Services created or dropped: their absence buckets move.
        let mut appeared: Vec<ServiceId> = Vec::new();
        for ch in changes {
            match ch {
                StateChange::Put { seq, record } => {
                    if *record.key.owner_dc == *self.local_dc {
                        self.counters.events_local.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.counters.events_remote.fetch_add(1, Ordering::Relaxed);
                    }
                    let sid = (record.key.namespace.clone(), record.key.service.clone());
                    let local = *record.key.owner_dc == *self.local_dc;
                    let created = v.put_record(idx, *seq, record.clone(), local);
                    if created {
                        appeared.push(sid.clone());
                    }
                    // A round's registrations are mostly of one service: one entry for a run.
                    if touched.last() != Some(&sid) {
                        touched.push(sid);
                    }
                }
                StateChange::Remove { key } => {
                    let sid = (key.namespace.clone(), key.service.clone());
                    let mut gone = None;
                    if let Some(svc) = v.services.get_mut(&SvcRef(&key.namespace, &key.service)) {
                        if let Some(h) = svc.instances.remove(key) {
                            svc.removed.retain(|k| k != key);
                            if svc.removed.len() >= REMOVED_REMEMBERED_MAX {
                                svc.removed.pop_front();
                            }
                            svc.removed.push_back(key.clone());
                            gone = Some(h.record);
                        }
                        svc.index = idx;
                        touched.push(sid);
                    }
                    if let Some(r) = gone.filter(|r| *r.key.owner_dc == *self.local_dc) {
                        v.uncount(&key.namespace, &r);
                    }
                }
            }
        }
        touched.sort();
        touched.dedup();
        for sid in touched {
            let Some(svc) = v.services.get(&sid) else { continue };
            svc.notify.send_replace(idx);
            if svc.instances.is_empty() {
                // Its last instance went: the service goes too (its watchers, woken above,
                // find it absent and wait on its bucket, whose index is now this one).
                v.drop_service(&sid);
                appeared.push(sid);
            }
        }
        for sid in appeared {
            self.bucket(&sid.0, &sid.1).send_replace(idx);
        }
        drop(v);
        self.global.send_replace(idx);
    }

    /// Moves the global index to `durable_writes`'s (if that is ahead) for a durable write
    /// that changed no instance (a Raft entry that minted nothing: an election's blank
    /// entry, a membership change), so that every member of a DC's group stands at the
    /// same index for the same applied entries. No service's index moves, no service
    /// watcher wakes.
    pub fn advance(&self, durable_writes: u64) {
        let mut v = self.view.write();
        let idx = ViewIndex::from_durable(durable_writes).0;
        if idx <= v.index {
            return;
        }
        v.index = idx;
        drop(v);
        self.global.send_replace(idx);
    }

    /// Every live record the view holds, by key, with its seq (tests compare views).
    #[cfg(test)]
    pub(crate) fn records(&self) -> std::collections::BTreeMap<InstanceKey, (u64, InstanceRecord)> {
        let v = self.view.read();
        v.services
            .values()
            .flat_map(|svc| {
                svc.instances.values().map(|h| (h.record.key.clone(), (h.seq, (*h.record).clone())))
            })
            .collect()
    }

    /// Bumps a service's index without a durable write (failover switched) and wakes
    /// its watchers.
    pub(super) fn bump(&self, sid: &ServiceId) {
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

    /// Bumps `svc`'s index as [`ViewCell::bump`] does, only while it is still `seen` (so
    /// that many readers finding the same thing move it once). Whether it did.
    pub(super) fn bump_if_at(&self, svc: &SvcRef<'_>, seen: u64) -> bool {
        let mut v = self.view.write();
        let idx = ViewIndex(v.index).bumped().0;
        let Some(s) = v.services.get_mut(svc).filter(|s| s.index == seen) else { return false };
        s.index = idx;
        s.notify.send_replace(idx);
        v.index = idx;
        drop(v);
        self.global.send_replace(idx);
        true
    }

    /// Bumps every service's index at once without a durable write (a reload changed how
    /// answers are computed) and wakes every watcher: cached answers are keyed by index, so
    /// none of them is served again.
    pub(super) fn bump_all(&self) {
        let mut v = self.view.write();
        let idx = ViewIndex(v.index).bumped().0;
        v.index = idx;
        for svc in v.services.values_mut() {
            svc.index = idx;
            svc.notify.send_replace(idx);
        }
        for b in self.absent.iter() {
            b.send_replace(idx);
        }
        drop(v);
        self.global.send_replace(idx);
    }

    pub fn index(&self) -> u64 {
        self.view.read().index
    }

    /// The absence bucket of (ns, svc).
    fn bucket(&self, ns: &str, svc: &str) -> &watch::Sender<u64> {
        let h = self.absent_hash.hash_one(SvcRef(ns, svc));
        &self.absent[(h % ABSENT_BUCKETS as u64) as usize]
    }

    /// The index of a service the view does not hold.
    pub(super) fn absent_index(&self, ns: &str, svc: &str) -> u64 {
        *self.bucket(ns, svc).borrow()
    }

    /// A receiver of the index of a service the view does not hold.
    pub(super) fn absent_subscribe(&self, ns: &str, svc: &str) -> watch::Receiver<u64> {
        self.bucket(ns, svc).subscribe()
    }

    /// Services held now.
    pub fn service_count(&self) -> usize {
        self.view.read().services.len()
    }

    /// Namespaces holding a service now.
    pub fn namespace_count(&self) -> usize {
        self.view.read().namespaces.len()
    }

    /// Whether the caps (`services_max`, `namespaces_max`) and the namespaces' quotas have
    /// room for own registrations `entries` (namespace, service, id, metadata bytes), counted
    /// together: each replaces what its instance holds now, if anything. Else the position
    /// of the first that does not fit, and what refuses it.
    pub(super) fn room<'a>(
        &self,
        entries: impl Iterator<Item = (&'a str, &'a str, &'a str, u64)>,
        limits: &crate::config::LimitsSection,
    ) -> Result<(), (usize, Refusal)> {
        let v = self.view.read();
        // What the entries before add: services and namespaces new to the view, and the
        // usage they add per namespace.
        let mut new_services: HashSet<(&str, &str)> = HashSet::new();
        let mut new_namespaces: HashSet<&str> = HashSet::new();
        // (services, instances, metadata bytes) per namespace; the bytes may go down.
        let mut added: HashMap<&str, (u64, u64, i128)> = HashMap::new();
        for (i, (ns, svc, id, bytes)) in entries.enumerate() {
            let service_known =
                v.services.contains_key(&SvcRef(ns, svc)) || new_services.contains(&(ns, svc));
            let namespace_known = v.namespaces.contains_key(ns) || new_namespaces.contains(ns);
            if !service_known {
                if !namespace_known
                    && (v.namespaces.len() + new_namespaces.len()) as u64 >= limits.namespaces_max
                {
                    return Err((i, Refusal::Cap("namespaces_max")));
                }
                if (v.services.len() + new_services.len()) as u64 >= limits.services_max {
                    return Err((i, Refusal::Cap("services_max")));
                }
            }
            let q = limits.quota(ns);
            let held = v.namespaces.get(ns).copied().unwrap_or_default();
            let more = added.entry(ns).or_default();
            let old = self
                .find_in(&v, ns, svc, id)
                .filter(|h| *h.record.key.owner_dc == *self.local_dc)
                .map(|h| metadata_bytes(&h.record.metadata));
            if !service_known && held.services + more.0 >= q.services_max {
                return Err((i, Refusal::Quota("services_max", q.services_max)));
            }
            if old.is_none() && held.instances + more.1 >= q.instances_max {
                return Err((i, Refusal::Quota("instances_max", q.instances_max)));
            }
            more.2 += i128::from(bytes) - i128::from(old.unwrap_or(0));
            if i128::from(held.metadata_bytes) + more.2 > i128::from(q.metadata_bytes_max) {
                return Err((i, Refusal::Quota("metadata_bytes_max", q.metadata_bytes_max)));
            }
            // Counted for the entries after this one.
            if !service_known {
                new_services.insert((ns, svc));
                more.0 += 1;
                if !namespace_known {
                    new_namespaces.insert(ns);
                }
            }
            if old.is_none() {
                more.1 += 1;
            }
        }
        Ok(())
    }

    /// What each namespace holds now.
    pub fn namespace_usage(&self) -> Vec<(Name, NsUsage)> {
        let v = self.view.read();
        let mut out: Vec<_> = v.namespaces.iter().map(|(k, u)| (k.clone(), *u)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    pub fn instance_count(&self) -> usize {
        self.view.read().services.values().map(|s| s.instances.len()).sum()
    }

    /// The instance held under `key`. The search goes down the service's tree with the
    /// service's shared names and its owner's (every held key shares them, see
    /// [`Service::put`]), so each comparison reads instance ids only, whatever allocations
    /// `key`'s own names are (a request's are its own).
    pub(super) fn get(&self, key: &InstanceKey) -> Option<Held> {
        let v = self.view.read();
        let s = v.services.get(&SvcRef(&key.namespace, &key.service))?;
        let owner = s.owners.iter().find(|o| **o == key.owner_dc)?;
        let shared = InstanceKey {
            owner_dc: owner.clone(),
            namespace: s.names.0.clone(),
            service: s.names.1.clone(),
            instance_id: key.instance_id.clone(),
        };
        s.instances.get(&shared).cloned()
    }

    /// The shared names of a service the view holds.
    pub(super) fn names(&self, ns: &str, svc: &str) -> Option<ServiceId> {
        self.view.read().services.get(&SvcRef(ns, svc)).map(|s| s.names.clone())
    }

    /// Finds an instance by (namespace, service, id) whatever its owner.
    /// O(owners x log n): a heartbeat must not scan the service.
    pub(super) fn find(&self, ns: &str, svc: &str, id: &str) -> Option<Held> {
        let v = self.view.read();
        self.find_in(&v, ns, svc, id).cloned()
    }

    pub(super) fn find_in<'v>(&self, v: &'v View, ns: &str, svc: &str, id: &str) -> Option<&'v Held> {
        let s = v.services.get(&SvcRef(ns, svc))?;
        // The service's own copy of this DC's name when it has one: the held keys share it,
        // so the search compares instance ids only (see `InstanceKey`'s order).
        let local = s.owners.iter().find(|o| **o == self.local_dc).unwrap_or(&self.local_dc);
        let mut key = InstanceKey {
            owner_dc: local.clone(),
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
