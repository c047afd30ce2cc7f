//! The provider side: keeps one instance registered with its DC's registry.
//!
//! [`Provider::register`] registers and starts a heartbeat task: one heartbeat per period
//! (the configured one, or an eighth of the granted lease) with jitter; after a failed
//! request it retries with capped, jittered backoff (never later than one period); on a 404
//! (the registry no longer knows the instance: it expired, was deleted, or the registry lost
//! its data) it registers again with the same spec and the current status. An instance id
//! the registry generated is not reused then: the re-registration gets a new one, since the
//! old instance is gone (see PRODUCT.md: a new process life is a new instance).
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

use serde_json::{json, Value};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use super::model::{Instance, Status};
use super::{jittered, Backoff, ClientConfig, SdkError};
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
    fn body(&self, instance_id: Option<&str>, status: Status) -> Value {
        let mut b = json!({
            "namespace": self.ns(),
            "service": self.service,
            "address": self.address,
            "port": self.port,
            "tags": self.tags,
            "metadata": self.metadata,
            "status": status.as_str(),
        });
        let mut put = |k: &str, v: Value| {
            b[k] = v;
        };
        if let Some(id) = instance_id {
            put("instance_id", json!(id));
        }
        if let Some(z) = &self.zone {
            put("zone", json!(z));
        }
        if let Some(w) = self.weight {
            put("weight", json!(w));
        }
        if let Some(v) = &self.version {
            put("version", json!(v));
        }
        if let Some(t) = self.ttl {
            put("ttl_ms", json!(t.as_millis() as u64));
        }
        if self.persistent {
            put("persistent", json!(true));
        }
        b
    }
}

/// The provider's state, as its heartbeat task sees it.
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

struct Shared {
    client: Client,
    cfg: ClientConfig,
    spec: InstanceSpec,
    state: watch::Sender<ProviderState>,
    /// Serializes writes (register, status, deregister) of this instance.
    write: Mutex<()>,
}

/// One registered instance and its heartbeat task.
pub struct Provider {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
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
            match client.register(&spec.body(spec.instance_id.as_deref(), Status::Up)).await {
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
        let (instance_id, owner_dc, lease_ttl) = parse_registered(&resp)?;
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
        let shared =
            Arc::new(Shared { client, cfg, spec, state: watch::channel(state).0, write: Mutex::new(()) });
        let (stop, stop_rx) = watch::channel(false);
        let task = if shared.spec.persistent || lease_ttl.is_zero() {
            None
        } else {
            Some(tokio::spawn(heartbeat_loop(shared.clone(), stop_rx)))
        };
        Ok(Provider { shared, stop, task })
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
        if status == Status::Unknown {
            return Err(SdkError::Config("status must be up, draining or out_of_service".into()));
        }
        let _w = self.shared.write.lock().await;
        let (ns, svc, id) = self.shared.ids();
        let res = self.shared.client.set_status(&ns, &svc, &id, status.as_str()).await;
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
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let _w = self.shared.write.lock().await;
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
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn parse_registered(v: &Value) -> Result<(String, String, Duration), SdkError> {
    let bad = || SdkError::Registry(ClientError::Decode(format!("unexpected register answer: {v}")));
    let id = v["instance_id"].as_str().filter(|s| !s.is_empty()).ok_or_else(bad)?.to_owned();
    let dc = v["owner_dc"].as_str().filter(|s| !s.is_empty()).ok_or_else(bad)?.to_owned();
    let ttl = v["lease_ttl_ms"].as_u64().ok_or_else(bad)?;
    Ok((id, dc, Duration::from_millis(ttl)))
}

impl Shared {
    fn ids(&self) -> (String, String, String) {
        (self.spec.ns().to_owned(), self.spec.service.clone(), self.state.borrow().instance_id.clone())
    }

    /// Registers again with the same spec and the current status. The caller holds `write`.
    async fn reregister(&self) -> Result<(), SdkError> {
        let status = self.state.borrow().status;
        let resp = self.client.register(&self.spec.body(self.spec.instance_id.as_deref(), status)).await?;
        let (id, dc, ttl) = parse_registered(&resp)?;
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
                    let shown = v["instances"].as_array().and_then(|a| {
                        a.iter()
                            .filter_map(|i| serde_json::from_value::<Instance>(i.clone()).ok())
                            .find(|i| i.instance_id == id && i.owner_dc == dc)
                    });
                    match shown {
                        Some(i) if i.status != status => {}
                        Some(_) | None => return,
                    }
                    index = v["index"].as_u64().unwrap_or(0);
                }
                Err(_) => {
                    tokio::time::sleep(left.min(Duration::from_millis(100))).await;
                }
            }
        }
    }
}

async fn heartbeat_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let interval = shared.state.borrow().heartbeat_interval;
    let jitter_pct = shared.cfg.provider.heartbeat_jitter_pct;
    let retry = super::RetryConfig {
        initial: shared.cfg.retry.initial.min(interval),
        max: shared.cfg.retry.max.min(interval),
    };
    let mut backoff = Backoff::new(retry);
    let mut delay = jittered(interval, jitter_pct, &mut rand::thread_rng());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let (ns, svc, id) = shared.ids();
        let res = shared.client.heartbeat(&ns, &svc, &id).await;
        let ok = match res {
            Ok(_) => true,
            Err(ClientError::Api { status: 404, .. }) => {
                tracing::warn!(instance = %id, "registry does not know this instance; registering again");
                let _w = shared.write.lock().await;
                // A status change or shutdown may have run meanwhile; only re-register if
                // the id is still the one that got the 404.
                if shared.state.borrow().instance_id != id || *stop.borrow() {
                    true
                } else {
                    match shared.reregister().await {
                        Ok(()) => true,
                        Err(e) => {
                            shared.state.send_modify(|s| s.last_error = Some(e.to_string()));
                            false
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "heartbeat failed");
                shared.state.send_modify(|s| s.last_error = Some(e.to_string()));
                false
            }
        };
        if ok {
            shared.state.send_modify(|s| {
                s.heartbeats_ok += 1;
                s.consecutive_failures = 0;
            });
            backoff.reset();
            delay = jittered(interval, jitter_pct, &mut rand::thread_rng());
        } else {
            shared.state.send_modify(|s| {
                s.heartbeats_failed += 1;
                s.consecutive_failures = s.consecutive_failures.saturating_add(1);
            });
            delay = backoff.next_delay(&mut rand::thread_rng());
        }
    }
}
