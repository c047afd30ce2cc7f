//! One DC's registry: the in-memory view every discovery reads, the leases every heartbeat
//! renews, and the write path that turns client requests into durable change events. This
//! file holds the [`Registry`] struct, its construction and settings, the counters, and the
//! re-exports; the work is split by job:
//! - `view`: [`ViewCell`], the view of every held instance, the watch index;
//! - `write`: patches, the overlay of writes in flight, commit, register, deregister, status;
//! - `leases`: heartbeats (single and batched), lease transitions, the lease checker,
//!   self-preservation (the lease lifecycle itself is [`crate::leases`]);
//! - `discovery`: discover and explain, protect threshold, failover, blocking-query waits;
//! - `compat`: what the Consul and Nacos front ends need besides (edits, namespace reads).
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
//!
//! [`ChangeEvent`]: tandem_schemas::ChangeEvent

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::Context as _;
use parking_lot::{Mutex, RwLock};
use tandem_schemas::Name;

use crate::clock::Clock;
use crate::config::Config;
use crate::failover::FailoverState;
use crate::health::HealthConfig;
use crate::leases::LeaseBook;
use crate::store::AppendLocal;

mod compat;
mod discovery;
mod instances;
mod leases;
mod owners;
mod view;
mod write;

#[cfg(test)]
mod tests;

pub use compat::Edited;
pub use discovery::{validate_query, StaleFlags, STALE_FLAGS_MAX};
pub use owners::{Writer, ANONYMOUS};
pub use view::{metadata_bytes, Held, NsUsage, ViewCell, ViewIndex};

use view::ServiceId;
/// The registry's local changes and how one is minted into an event: the Raft state
/// machine (`crate::cluster`) mints a round's writes with the same rules at apply.
pub(crate) use write::{Minted, Overlay, Patch};

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
    /// Reads that found a remote origin's staleness flipped since the service's answer was
    /// kept, and moved its index ([`Registry::staleness_moved`]).
    pub stale_flips_at_read: AtomicU64,
    /// POST /v1/heartbeats requests (their entries count in `heartbeats`).
    pub heartbeat_batches: AtomicU64,
    /// POST /v1/registrations requests within the entry bound (their written entries count
    /// in `registrations`).
    pub register_batches: AtomicU64,
    /// Local registrations of a new service refused by `[limits] services_max`.
    pub refused_services_max: AtomicU64,
    /// Local registrations in a new namespace refused by `[limits] namespaces_max`.
    pub refused_namespaces_max: AtomicU64,
    /// Local registrations refused by their namespace's quota, per quota.
    pub refused_quota_instances: AtomicU64,
    pub refused_quota_services: AtomicU64,
    pub refused_quota_metadata: AtomicU64,
    /// Passes of the lease checker, the microseconds they spent ticking leases (the scan
    /// under the lease table's lock, not the durable write of what it found), and the
    /// longest one.
    pub lease_checks: AtomicU64,
    pub lease_check_us: AtomicU64,
    pub lease_check_us_max: AtomicU64,
}

/// Tells whether a remote origin's copies are stale (its link silent too long).
pub type StaleFn = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub use tandem_client::api::{
    DiscoverAnswer, ExplainLine, Failover, HeartbeatBatchAnswer, HeartbeatItem, Instance as InstanceView,
    RegisterAnswer, RegisterRequest, StatusName, Threshold, HEARTBEAT_BATCH_MAX, REGISTER_BATCH_MAX,
};

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
    /// Latest minted state of the local instances with writes in flight (see
    /// [`Pending`](write::Pending)): event builders (one at a time, on the committer
    /// thread) read and extend it; callers drop their entries once answered.
    minted: Arc<Mutex<Overlay>>,
    /// The leases of the local ephemeral instances, changed as their events are minted
    /// (see [`crate::leases`]).
    leases: Arc<LeaseBook>,
    /// Who owns each own instance (see [`owners`]): changed as registrations and
    /// deregistrations are minted, durable with them.
    owners: Arc<Mutex<owners::Owners>>,
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
            owners: Arc::default(),
            failover: Mutex::new(HashMap::new()),
            staleness: Mutex::new(BTreeMap::new()),
            counters,
            clock,
            stale: RwLock::new(Arc::new(|_| false)),
            cfg: RwLock::new(cfg),
        });
        reg.restart_leases();
        reg
    }

    /// Every local ephemeral instance of the view gets its lease back, at the health its
    /// record published, with a full TTL of grace: a restart, or a leader change in the
    /// DC's group, must never expire instances that kept heartbeating elsewhere
    /// meanwhile, nor revive dead ones. One code path for both.
    fn restart_leases(&self) {
        let v = self.view.view.read();
        self.leases
            .rebuild(|| v.services.values().flat_map(|s| s.instances.values()).map(|h| (h.seq, &*h.record)));
    }

    /// This node now leads its DC's group (and has applied every earlier entry): it takes
    /// over the leases (as at a restart, see `restart_leases`) and the owners of the own
    /// instances as `owners` reads them from the group's state. Answers how many leases it
    /// holds then.
    ///
    /// Both run on a blocking thread: at a million instances the owners' scan and the
    /// leases' rebuild take about half a second, which would hold a runtime worker (and
    /// every request queued on it) meanwhile.
    pub async fn take_lead<E>(
        self: &Arc<Self>,
        owners: impl FnOnce() -> Result<Vec<(tandem_schemas::InstanceKey, Arc<str>)>, E> + Send + 'static,
    ) -> anyhow::Result<usize>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let reg = self.clone();
        tokio::task::spawn_blocking(move || {
            let owners = owners().context("cannot read the instance owners")?;
            reg.restart_leases();
            reg.owners.lock().load(owners);
            Ok(reg.lease_count())
        })
        .await
        .context("the take-over's blocking task")?
    }

    /// The owners of the own instances as the log holds them (at start, before any write).
    pub fn load_owners(&self, owners: Vec<(tandem_schemas::InstanceKey, Arc<str>)>) {
        self.owners.lock().load(owners);
    }

    /// What each namespace holds (see [`NsUsage`]).
    pub fn namespace_usage(&self) -> Vec<(Name, NsUsage)> {
        self.view.namespace_usage()
    }

    /// Own instances owned by a named principal (an `anonymous` owner restricts nothing).
    pub fn owned_instances(&self) -> usize {
        self.owners.lock().len()
    }

    /// Whether `by` may renew (or change) own instance `ns/svc/id`: its owner or an admin,
    /// or anyone with the scope when it has no owner. An unknown instance passes (the
    /// heartbeat itself answers 404).
    pub fn check_owner(
        &self,
        ns: &str,
        svc: &str,
        id: &str,
        by: &Writer,
    ) -> Result<(), crate::error::ApiError> {
        if by.admin {
            return Ok(());
        }
        // The held key when the view has it (its names are shared, not copied).
        let key = match self.view.find(ns, svc, id).filter(|h| *h.record.key.owner_dc == *self.dc) {
            Some(h) => h.record.key.clone(),
            None => tandem_schemas::InstanceKey {
                owner_dc: self.dc.clone(),
                namespace: ns.into(),
                service: svc.into(),
                instance_id: id.into(),
            },
        };
        let owner = self.owners.lock().current(&key);
        owners::judge(owner.as_deref(), by, &key)
    }

    pub fn set_stale_fn(&self, f: StaleFn) {
        *self.stale.write() = f;
    }

    pub fn config(&self) -> Arc<Config> {
        self.cfg.read().clone()
    }

    /// Replaces the failover policy (and other reloadable settings) at runtime.
    /// A change of the settings answers depend on (protection, failover) moves every
    /// service's index, so watchers wake and no answer cached under the old settings is
    /// served again.
    pub fn set_config(&self, cfg: Arc<Config>) {
        let old = std::mem::replace(&mut *self.cfg.write(), cfg.clone());
        if old.protection != cfg.protection || old.failover != cfg.failover {
            self.view.bump_all();
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn view(&self) -> &Arc<ViewCell> {
        &self.view
    }
}
