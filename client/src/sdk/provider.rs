//! The provider side: keeps one instance registered with its DC's registry.
//!
//! [`Provider::register`] registers and hands the instance to the process's heartbeat
//! batcher (`sdk/beats.rs`): one heartbeat per period (the configured one, or an eighth of
//! the granted lease) with jitter, sent together with the other instances this process
//! holds in one `POST /v1/heartbeats`; after a failed beat it retries with capped, jittered
//! backoff (never later than one period); when the registry reports the instance unknown
//! (it expired, was deleted, or the registry lost its data) it registers again with the
//! same spec and the current status. An instance id the registry generated is not reused
//! then: the re-registration gets a new one, since the old instance is gone (a new process
//! life is a new instance).
//!
//! [`Provider::shutdown`] is the graceful way out: status draining (heartbeats go on), wait
//! until a discovery read shows the draining status (bounded) and a linger time so that
//! consumers' caches update, stop heartbeats, deregister.
//!
//! Dropping a `Provider` without `shutdown` stops the heartbeats only; the lease then
//! expires on the registry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{watch, Mutex};

use super::beats::{self, Membership};
use super::model::{Answer, Status};
use super::{Backoff, ClientConfig, SdkError};
use crate::api::{RegisterAnswer, RegisterRequest, StatusName};
use crate::client::{Client, ClientError};

/// What to register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    /// `None`: "default".
    pub namespace: Option<String>,
    pub service: String,
    /// `None`: the registry generates `service#address:port#uuid`.
    pub instance_id: Option<String>,
    pub address: String,
    pub port: u16,
    pub zone: Option<String>,
    pub weight: Option<u32>,
    pub version: Option<String>,
    pub tags: Vec<String>,
    pub metadata: BTreeMap<String, String>,
    /// Lease length; `None`: the registry's default.
    pub ttl: Option<Duration>,
    /// No lease and no heartbeats; only deregistration removes it.
    pub persistent: bool,
}

impl InstanceSpec {
    pub fn new(service: impl Into<String>, address: impl Into<String>, port: u16) -> InstanceSpec {
        InstanceSpec {
            namespace: None,
            service: service.into(),
            instance_id: None,
            address: address.into(),
            port,
            zone: None,
            weight: None,
            version: None,
            tags: Vec::new(),
            metadata: BTreeMap::new(),
            ttl: None,
            persistent: false,
        }
    }
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = Some(weight);
        self
    }
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }
    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }

    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }

    /// The body of POST /v1/register.
    fn request(&self, instance_id: Option<&str>, status: StatusName) -> RegisterRequest {
        RegisterRequest {
            namespace: Some(self.ns().to_owned()),
            service: self.service.clone(),
            instance_id: instance_id.map(str::to_owned),
            address: self.address.clone(),
            port: u32::from(self.port),
            zone: self.zone.clone(),
            weight: self.weight,
            version: self.version.clone(),
            tags: Some(self.tags.clone()),
            metadata: Some(self.metadata.clone()),
            ttl_ms: self.ttl.map(|t| t.as_millis() as u64),
            persistent: self.persistent.then_some(true),
            status: Some(status),
        }
    }
}

/// The provider's state, as its heartbeats see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderState {
    /// Current instance id (a generated one changes on re-registration).
    pub instance_id: String,
    pub owner_dc: String,
    pub status: Status,
    /// Lease the registry granted (zero for persistent instances).
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeats_ok: u64,
    pub heartbeats_failed: u64,
    /// Failed heartbeats since the last good one.
    pub consecutive_failures: u32,
    pub reregistrations: u64,
    pub last_error: Option<String>,
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) cfg: ClientConfig,
    spec: InstanceSpec,
    pub(crate) state: watch::Sender<ProviderState>,
    /// Serializes writes (register, status, deregister) of this instance.
    pub(crate) write: Mutex<()>,
    /// Set (under `write`) when shutdown deregisters: no re-registration after that.
    pub(crate) stopped: AtomicBool,
}

/// One registered instance; its heartbeats go with the process's other instances'.
pub struct Provider {
    shared: Arc<Shared>,
    /// Membership in the heartbeat batcher (none for persistent instances).
    beats: Option<Membership>,
}

impl Provider {
    /// Registers `spec` and starts heartbeating. Retryable failures of the first
    /// registration are retried up to `provider.register_attempts_max` times with backoff.
    pub async fn register(cfg: ClientConfig, spec: InstanceSpec) -> Result<Provider, SdkError> {
        cfg.validate()?;
        tandem_schemas::validate_name("service", &spec.service)
            .map_err(|e| SdkError::Config(e.to_string()))?;
        tandem_schemas::validate_name("namespace", spec.ns()).map_err(|e| SdkError::Config(e.to_string()))?;
        let client = cfg.client();
        let mut backoff = Backoff::new(cfg.retry);
        let mut attempt = 0;
        let resp = loop {
            attempt += 1;
            match client.register_instance(&spec.request(spec.instance_id.as_deref(), StatusName::Up)).await {
                Ok(r) => break r,
                Err(e) => {
                    let e = SdkError::from(e);
                    if !e.is_retryable() || attempt >= cfg.provider.register_attempts_max {
                        return Err(e);
                    }
                    let d = backoff.next_delay(&mut rand::thread_rng());
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "registration failed");
                    tokio::time::sleep(d).await;
                }
            }
        };
        let (instance_id, owner_dc, lease_ttl) = parse_registered(resp)?;
        let interval =
            cfg.provider.heartbeat_interval.unwrap_or_else(|| (lease_ttl / 8).max(Duration::from_millis(10)));
        let state = ProviderState {
            instance_id,
            owner_dc,
            status: Status::Up,
            lease_ttl,
            heartbeat_interval: interval,
            heartbeats_ok: 0,
            heartbeats_failed: 0,
            consecutive_failures: 0,
            reregistrations: 0,
            last_error: None,
        };
        tracing::info!(instance = %state.instance_id, dc = %state.owner_dc, lease_ms = lease_ttl.as_millis() as u64,
            "registered");
        let shared = Arc::new(Shared {
            client,
            cfg,
            spec,
            state: watch::channel(state).0,
            write: Mutex::new(()),
            stopped: AtomicBool::new(false),
        });
        let beats = if shared.spec.persistent || lease_ttl.is_zero() {
            None
        } else {
            Some(beats::join(shared.clone(), interval))
        };
        Ok(Provider { shared, beats })
    }

    pub fn instance_id(&self) -> String {
        self.shared.state.borrow().instance_id.clone()
    }

    pub fn state(&self) -> ProviderState {
        self.shared.state.borrow().clone()
    }

    /// Every change of [`ProviderState`] (each heartbeat counts).
    pub fn state_changes(&self) -> watch::Receiver<ProviderState> {
        self.shared.state.subscribe()
    }

    /// Sets the instance's status (up, draining, out_of_service); a later re-registration
    /// carries it.
    pub async fn set_status(&self, status: Status) -> Result<(), SdkError> {
        let Ok(name) = StatusName::try_from(status) else {
            return Err(SdkError::Config("status must be up, draining or out_of_service".into()));
        };
        let _w = self.shared.write.lock().await;
        let (ns, svc, id) = self.shared.ids();
        let res = self.shared.client.set_status(&ns, &svc, &id, name).await;
        match res {
            Ok(_) => {
                self.shared.state.send_modify(|s| s.status = status);
                Ok(())
            }
            // Unknown: register again with the new status.
            Err(ClientError::Api { status: 404, .. }) => {
                self.shared.state.send_modify(|s| s.status = status);
                self.shared.reregister().await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Graceful shutdown: draining, wait for propagation, stop heartbeats, deregister. The
    /// instance is deregistered even when the draining step fails; the first error is
    /// returned.
    pub async fn shutdown(mut self) -> Result<(), SdkError> {
        let drain = self.shared.cfg.provider.drain;
        let mut first_err = None;
        match self.set_status(Status::Draining).await {
            Ok(()) => {
                if !drain.confirm_within.is_zero() {
                    self.shared.wait_visible(Status::Draining, drain.confirm_within).await;
                }
                tokio::time::sleep(drain.linger).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not set status draining; deregistering at once");
                first_err = Some(e);
            }
        }
        // Out of the batcher; a beat in flight may still answer "unknown", but its
        // re-registration checks `stopped` under the write lock.
        drop(self.beats.take());
        let _w = self.shared.write.lock().await;
        self.shared.stopped.store(true, Ordering::Relaxed);
        let (ns, svc, id) = self.shared.ids();
        match self.shared.client.deregister(&ns, &svc, &id).await {
            Ok(_) | Err(ClientError::Api { status: 404, .. }) => {
                tracing::info!(instance = %id, "deregistered");
            }
            Err(e) => {
                first_err.get_or_insert(e.into());
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        // Dropping the membership stops the heartbeats; the lease then expires.
        self.shared.stopped.store(true, Ordering::Relaxed);
    }
}

fn parse_registered(a: RegisterAnswer) -> Result<(String, String, Duration), SdkError> {
    if a.instance_id.is_empty() || a.owner_dc.is_empty() {
        return Err(SdkError::Registry(ClientError::Decode(format!("unexpected register answer: {a:?}"))));
    }
    Ok((a.instance_id, a.owner_dc, Duration::from_millis(a.lease_ttl_ms)))
}

impl Shared {
    pub(crate) fn ids(&self) -> (String, String, String) {
        (self.spec.ns().to_owned(), self.spec.service.clone(), self.state.borrow().instance_id.clone())
    }

    /// Registers again with the same spec and the current status. The caller holds `write`.
    pub(crate) async fn reregister(&self) -> Result<(), SdkError> {
        let status = StatusName::try_from(self.state.borrow().status).unwrap_or(StatusName::Up);
        let req = self.spec.request(self.spec.instance_id.as_deref(), status);
        let resp = self.client.register_instance(&req).await?;
        let (id, dc, ttl) = parse_registered(resp)?;
        tracing::info!(instance = %id, "registered again");
        self.state.send_modify(|s| {
            s.instance_id = id;
            s.owner_dc = dc;
            s.lease_ttl = ttl;
            s.reregistrations += 1;
        });
        Ok(())
    }

    /// Waits (at most `within`) until a discovery read of the owner DC's instances shows
    /// this instance with `status`, or without it.
    async fn wait_visible(&self, status: Status, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let (ns, svc, id) = self.ids();
        let dc = self.state.borrow().owner_dc.clone();
        let mut index = 0u64;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                tracing::warn!(instance = %id, "draining not visible in time; going on");
                return;
            }
            let res = if index == 0 {
                self.client.discover(&ns, &svc, &format!("dc={dc}")).await
            } else {
                self.client.watch(&ns, &svc, index, left.max(Duration::from_millis(10))).await
            };
            match res {
                Ok(v) => {
                    let Ok(answer) = Answer::parse(v, &ns, &svc, usize::MAX) else {
                        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
                        continue;
                    };
                    let shown = answer.instances.iter().find(|i| *i.instance_id == *id && *i.owner_dc == *dc);
                    match shown {
                        Some(i) if i.status != status => {}
                        Some(_) | None => return,
                    }
                    index = answer.index;
                }
                Err(_) => {
                    tokio::time::sleep(left.min(Duration::from_millis(100))).await;
                }
            }
        }
    }
}
