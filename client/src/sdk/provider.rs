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
//! [`Provider::register_all`] registers the instances one process holds together: one
//! `POST /v1/registrations` (one durable write on the registry) per chunk of at most
//! [`REGISTER_BATCH_MAX`] entries and [`REQUEST_BODY_BYTES_MAX`] bytes, all or nothing. The
//! batcher registers the instances one round found unknown together in the same way.
//!
//! [`Provider::shutdown`] is the graceful way out: status draining (heartbeats go on), wait
//! until a discovery read shows the draining status (bounded) and a linger time so that
//! consumers' caches update, stop heartbeats, deregister.
//!
//! Dropping a `Provider` without `shutdown` stops the heartbeats only; the lease then
//! expires on the registry.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{watch, Mutex};

use super::beats::{self, Membership};
use super::model::{Answer, Status};
use super::{Backoff, ClientConfig, SdkError};
use crate::api::{
    RegisterAnswer, RegisterBatch, RegisterRequest, StatusName, REGISTER_BATCH_MAX, REQUEST_BODY_BYTES_MAX,
};
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

    /// The names checked before anything is sent (the registry would refuse them).
    fn check_names(&self) -> Result<(), String> {
        tandem_schemas::validate_name("service", &self.service).map_err(|e| e.to_string())?;
        tandem_schemas::validate_name("namespace", self.ns()).map_err(|e| e.to_string())
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
        spec.check_names().map_err(SdkError::Config)?;
        let client = cfg.client();
        let req = spec.request(spec.instance_id.as_deref(), StatusName::Up);
        let answer = with_attempts(&cfg, || client.register_instance(&req)).await?;
        Provider::start(&cfg, spec, answer)
    }

    /// Registers every spec of `specs` together and starts heartbeating them: one
    /// `POST /v1/registrations` per chunk of at most [`REGISTER_BATCH_MAX`] entries and
    /// [`REQUEST_BODY_BYTES_MAX`] bytes, each chunk one durable write on the registry,
    /// instead of a request and a write per instance. Each chunk is retried as
    /// [`Provider::register`] retries.
    ///
    /// All or nothing: a spec the SDK can tell is wrong (a bad name, an instance id given
    /// twice) fails the call before anything is sent, naming its place (`specs[3]`); when
    /// the registry refuses a chunk, or a chunk runs out of attempts, the instances of the
    /// chunks before it are deregistered again (best effort) and the error is returned.
    /// The providers come back in the order of `specs`, each as `register` makes it.
    pub async fn register_all(
        cfg: ClientConfig,
        specs: Vec<InstanceSpec>,
    ) -> Result<Vec<Provider>, SdkError> {
        cfg.validate()?;
        let mut given: HashMap<(&str, &str, &str), usize> = HashMap::new();
        for (i, spec) in specs.iter().enumerate() {
            spec.check_names().map_err(|e| SdkError::Config(format!("specs[{i}]: {e}")))?;
            if let Some(id) = spec.instance_id.as_deref() {
                if let Some(first) = given.insert((spec.ns(), &spec.service, id), i) {
                    return Err(SdkError::Config(format!(
                        "specs[{i}]: instance id {id:?} of service {:?} is already given by specs[{first}]",
                        spec.service
                    )));
                }
            }
        }
        let client = cfg.client();
        let reqs: Vec<RegisterRequest> =
            specs.iter().map(|s| s.request(s.instance_id.as_deref(), StatusName::Up)).collect();
        let mut answers: Vec<RegisterAnswer> = Vec::with_capacity(specs.len());
        for range in chunks(&reqs) {
            let batch = RegisterBatch { instances: reqs[range.clone()].to_vec() };
            let sent = with_attempts(&cfg, || register_chunk(&client, &batch)).await;
            match sent {
                Ok(a) => answers.extend(a),
                Err(e) => {
                    undo(&client, &specs, &answers).await;
                    return Err(e);
                }
            }
        }
        let mut providers = Vec::with_capacity(specs.len());
        for (spec, answer) in specs.into_iter().zip(answers) {
            providers.push(Provider::start(&cfg, spec, answer)?);
        }
        tracing::info!(instances = providers.len(), "registered together");
        Ok(providers)
    }

    /// The provider of a registration the registry answered: its state, and its place in
    /// the heartbeat batcher (none for persistent instances).
    fn start(cfg: &ClientConfig, spec: InstanceSpec, a: RegisterAnswer) -> Result<Provider, SdkError> {
        let (instance_id, owner_dc, lease_ttl) = parse_registered(a)?;
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
            client: cfg.client(),
            cfg: cfg.clone(),
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

/// Runs `send` until it succeeds, fails for good (an error that is not retryable), or
/// `provider.register_attempts_max` attempts are spent, with backoff between attempts.
async fn with_attempts<T, F, Fut>(cfg: &ClientConfig, mut send: F) -> Result<T, SdkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut backoff = Backoff::new(cfg.retry);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match send().await {
            Ok(r) => return Ok(r),
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
    }
}

/// One chunk of a registration together: its answers, one per entry and each usable, or
/// the error (an answer of another length or with an empty id is a decode error).
async fn register_chunk(client: &Client, batch: &RegisterBatch) -> Result<Vec<RegisterAnswer>, ClientError> {
    let a = client.register_batch(batch).await?;
    if a.instances.len() != batch.instances.len()
        || a.instances.iter().any(|r| r.instance_id.is_empty() || r.owner_dc.is_empty())
    {
        return Err(ClientError::Decode(format!(
            "{} answers to a batch of {} registrations, or one without an id",
            a.instances.len(),
            batch.instances.len()
        )));
    }
    Ok(a.instances)
}

/// The chunks `reqs` go out in, in order: at most [`REGISTER_BATCH_MAX`] entries each, and
/// a body within [`REQUEST_BODY_BYTES_MAX`] (an entry larger than that alone goes alone,
/// and the registry refuses it).
fn chunks(reqs: &[RegisterRequest]) -> Vec<Range<usize>> {
    // `{"instances":[` and `]}`, and a comma after every entry (one more than needed).
    const ENVELOPE: usize = r#"{"instances":[]}"#.len();
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, ENVELOPE);
    for (i, r) in reqs.iter().enumerate() {
        let len = serde_json::to_vec(r).map_or(0, |v| v.len()) + 1;
        if i > start && (i - start == REGISTER_BATCH_MAX || bytes + len > REQUEST_BODY_BYTES_MAX) {
            out.push(start..i);
            (start, bytes) = (i, ENVELOPE);
        }
        bytes += len;
    }
    if start < reqs.len() {
        out.push(start..reqs.len());
    }
    out
}

/// Whether a refusal of a batch may be about one of its entries, not the request as a
/// whole (a bad token, a rate limit, a registry that cannot write): invalid, forbidden,
/// another DC's, too large, over a namespace's quota.
fn refuses_an_entry(status: u16) -> bool {
    matches!(status, 400 | 403 | 409 | 413 | 422 | 507)
}

/// A registration together that failed part way: deregisters what its first chunks
/// registered (`answers`, in the order of `specs`), best effort.
async fn undo(client: &Client, specs: &[InstanceSpec], answers: &[RegisterAnswer]) {
    if answers.is_empty() {
        return;
    }
    tracing::warn!(
        instances = answers.len(),
        "registration together failed; deregistering what it registered"
    );
    for (spec, a) in specs.iter().zip(answers) {
        match client.deregister(spec.ns(), &spec.service, &a.instance_id).await {
            Ok(_) | Err(ClientError::Api { status: 404, .. }) => {}
            Err(e) => tracing::warn!(instance = %a.instance_id, error = %e, "could not deregister"),
        }
    }
}

/// Registers `ps` again together (each with its spec and current status), in chunks as
/// [`Provider::register_all`] sends them; one outcome per provider, in order. Every
/// provider of `ps` shares the client settings of the first (the batcher groups them so).
/// The callers hold each one's `write`.
///
/// A chunk the registry refuses for what an entry holds ([`refuses_an_entry`]) is sent
/// again one registration at a time, so that an instance it refuses (its namespace's
/// quota, say) keeps none of the others unregistered.
pub(crate) async fn reregister_together(ps: &[&Shared]) -> Vec<Result<(), SdkError>> {
    let Some(first) = ps.first() else { return Vec::new() };
    let reqs: Vec<RegisterRequest> = ps.iter().map(|p| p.current_request()).collect();
    let mut out = Vec::with_capacity(ps.len());
    for range in chunks(&reqs) {
        let batch = RegisterBatch { instances: reqs[range.clone()].to_vec() };
        match register_chunk(&first.client, &batch).await {
            Ok(answers) => {
                for (p, a) in ps[range].iter().zip(answers) {
                    out.push(p.registered_again(a));
                }
            }
            Err(ClientError::Api { status, .. }) if refuses_an_entry(status) => {
                for p in &ps[range] {
                    out.push(p.reregister().await);
                }
            }
            Err(e) => out.extend(range.map(|_| Err(SdkError::Registry(e.clone())))),
        }
    }
    out
}

impl Shared {
    pub(crate) fn ids(&self) -> (String, String, String) {
        (self.spec.ns().to_owned(), self.spec.service.clone(), self.state.borrow().instance_id.clone())
    }

    /// The body of a registration again: the same spec, the current status.
    fn current_request(&self) -> RegisterRequest {
        let status = StatusName::try_from(self.state.borrow().status).unwrap_or(StatusName::Up);
        self.spec.request(self.spec.instance_id.as_deref(), status)
    }

    /// Registers again with the same spec and the current status. The caller holds `write`.
    pub(crate) async fn reregister(&self) -> Result<(), SdkError> {
        let resp = self.client.register_instance(&self.current_request()).await?;
        self.registered_again(resp)
    }

    /// The registry's answer to a registration again.
    fn registered_again(&self, a: RegisterAnswer) -> Result<(), SdkError> {
        let (id, dc, ttl) = parse_registered(a)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(i: usize, meta_bytes: usize) -> RegisterRequest {
        InstanceSpec::new("svc", "10.0.0.1", 1)
            .meta("m", "x".repeat(meta_bytes))
            .request(Some(&format!("i-{i}")), StatusName::Up)
    }

    fn body_bytes(reqs: &[RegisterRequest]) -> usize {
        serde_json::to_vec(&RegisterBatch { instances: reqs.to_vec() }).unwrap().len()
    }

    #[test]
    fn chunks_cover_every_entry_in_order_within_both_bounds_and_are_no_more_than_needed() {
        let sizes = [(0, 0), (1, 0), (256, 0), (257, 0), (600, 0), (100, 3_000), (40, 1_500), (3, 70_000)];
        for (n, meta) in sizes {
            let reqs: Vec<RegisterRequest> = (0..n).map(|i| req(i, meta)).collect();
            let cs = chunks(&reqs);
            let mut next = 0;
            for c in &cs {
                assert_eq!(c.start, next, "{n} x {meta}: {cs:?}");
                assert!(!c.is_empty() && c.len() <= REGISTER_BATCH_MAX, "{n} x {meta}: {cs:?}");
                assert!(
                    c.len() == 1 || body_bytes(&reqs[c.clone()]) <= REQUEST_BODY_BYTES_MAX,
                    "{n} x {meta}: {c:?} holds {} bytes",
                    body_bytes(&reqs[c.clone()])
                );
                next = c.end;
            }
            assert_eq!(next, n, "{n} x {meta}: {cs:?}");
            // Each chunk but the last ends where one more entry would break a bound.
            for c in cs.iter().take(cs.len().saturating_sub(1)) {
                let more = &reqs[c.start..c.end + 1];
                assert!(
                    more.len() > REGISTER_BATCH_MAX || body_bytes(more) > REQUEST_BODY_BYTES_MAX,
                    "{n} x {meta}: {c:?} could have taken one more"
                );
            }
        }
    }
}
