//! The consumer side: one service's instances, kept fresh in memory.
//!
//! [`Consumer::watch`] reads the service once (or, when no registry node answers, loads the
//! disk snapshot) and starts a task that keeps the cache fresh:
//! - blocking queries (`?index=N&wait=...`): the registry answers as soon as the service
//!   changes (or failover switches), else after the wait with the same answer;
//! - every `full_pull_interval`, a plain read instead, which reconciles the cache even if
//!   blocking queries stopped waking up; every answer is a full list, so each one replaces
//!   the cache as a whole (subject to push-empty protection, see [`super::cache`]);
//! - an index that goes backwards (a registry that lost its data, or another node) is
//!   adopted as is, so the next blocking query waits on the new numbering;
//! - failed requests back off (capped, jittered) and leave the cache as it is, so a
//!   restarting or unreachable registry never empties the view;
//! - each material change is published on [`Consumer::changes`] and written to the disk
//!   snapshot (when a directory is configured).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::balance::{Balancer, Reported};
use super::cache::{Cache, Outcome, PendingEmpty};
use super::model::{Answer, Instance, ServiceView};
use super::{snapshot, Backoff, ClientConfig, SdkError};
use crate::client::{Client, ClientError};

/// How the consumer's link to the registry is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// The last request got a usable answer.
    pub connected: bool,
    /// Failed requests since the last usable answer.
    pub consecutive_errors: u32,
    pub last_error: Option<String>,
    /// Usable answers received.
    pub answers: u64,
    /// An empty answer held back by push-empty protection.
    pub empty_held: Option<PendingEmpty>,
    /// Empty answers that protection held back, in total.
    pub empty_answers_held: u64,
    /// Why the disk snapshot was not read or written, if it was not.
    pub snapshot_error: Option<String>,
}

struct Inner {
    cache: Cache,
    balancer: Balancer,
    /// Index to send with the next blocking query: the latest the registry reported.
    watch_index: u64,
    status: ConsumerStatus,
}

struct Shared {
    namespace: String,
    service: String,
    cfg: ClientConfig,
    client: Client,
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<ServiceView>>,
    /// Origin of the monotonic `now_ms` handed to the pure cache and balancer.
    epoch: Instant,
}

/// A watched service.
pub struct Consumer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Consumer {
    /// Starts watching `namespace/service`. Returns once the first read answered or failed:
    /// on failure the view comes from the disk snapshot if there is one (else it is empty)
    /// and the background task keeps trying. Errors only on an invalid configuration or a
    /// request the registry refuses (4xx).
    pub async fn watch(cfg: ClientConfig, namespace: &str, service: &str) -> Result<Consumer, SdkError> {
        cfg.validate()?;
        tandem_schemas::validate_name("namespace", namespace).map_err(|e| SdkError::Config(e.to_string()))?;
        tandem_schemas::validate_name("service", service).map_err(|e| SdkError::Config(e.to_string()))?;
        let c = &cfg.consumer;
        let inner = Inner {
            cache: Cache::new(namespace, service, c.empty_rule),
            balancer: Balancer::new(c.strategy, c.ejection),
            watch_index: 0,
            status: ConsumerStatus::default(),
        };
        let shared = Arc::new(Shared {
            namespace: namespace.to_owned(),
            service: service.to_owned(),
            client: cfg.client(),
            tx: watch::channel(Arc::new(ServiceView::empty(namespace, service))).0,
            inner: Mutex::new(inner),
            epoch: Instant::now(),
            cfg,
        });
        match shared.read(None).await {
            Ok(answer) => shared.fold(answer).await,
            Err(e @ SdkError::Registry(ClientError::Api { status: 400..=499, .. })) => return Err(e),
            Err(e) => {
                tracing::warn!(service, error = %e, "no registry answered; trying the disk snapshot");
                shared.failed(&e);
                shared.restore_snapshot().await;
            }
        }
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(shared.clone(), stop_rx));
        Ok(Consumer { shared, stop, task: Some(task) })
    }

    /// The current view.
    pub fn view(&self) -> Arc<ServiceView> {
        self.shared.tx.borrow().clone()
    }

    /// The current instances, sorted by (owner DC, instance id).
    pub fn instances(&self) -> Vec<Instance> {
        self.view().instances.clone()
    }

    /// Registry index of the view (0: none yet).
    pub fn last_index(&self) -> u64 {
        self.view().index
    }

    /// Every material change of the view (see [`ServiceView::differs_materially`]).
    pub fn changes(&self) -> watch::Receiver<Arc<ServiceView>> {
        self.shared.tx.subscribe()
    }

    /// One instance to call, by the configured strategy, skipping draining and ejected
    /// instances (see [`super::balance`]); `None` when no instance is up.
    pub fn pick(&self) -> Option<Instance> {
        let now = self.shared.now_ms();
        let mut inner = self.shared.inner.lock();
        let view = inner.cache.view().clone();
        inner.balancer.pick(&view.instances, now, &mut rand::thread_rng()).cloned()
    }

    /// A call to `inst` failed; enough failures in a row eject it for a while.
    pub fn report_failure(&self, inst: &Instance) -> Reported {
        let now = self.shared.now_ms();
        let mut inner = self.shared.inner.lock();
        let view = inner.cache.view().clone();
        let r = inner.balancer.report_failure(inst, &view.instances, now);
        if let Reported::Ejected { until_ms } = r {
            tracing::info!(instance = %inst.instance_id, dc = %inst.owner_dc,
                for_ms = until_ms.saturating_sub(now), "instance ejected after consecutive failures");
        }
        r
    }

    /// A call to `inst` succeeded.
    pub fn report_success(&self, inst: &Instance) {
        self.shared.inner.lock().balancer.report_success(inst);
    }

    /// (owner DC, instance id) of the instances ejected now.
    pub fn ejected(&self) -> Vec<(String, String)> {
        let now = self.shared.now_ms();
        self.shared.inner.lock().balancer.ejected(now)
    }

    pub fn status(&self) -> ConsumerStatus {
        self.shared.inner.lock().status.clone()
    }

    /// Stops the background task.
    pub async fn close(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// One read: a blocking query when `watch` is `Some((index, wait))`, else a plain one.
    async fn read(&self, watch: Option<(u64, Duration)>) -> Result<Answer, SdkError> {
        let v = match watch {
            Some((index, wait)) => self.client.watch(&self.namespace, &self.service, index, wait).await?,
            None => self.client.discover(&self.namespace, &self.service, "").await?,
        };
        Answer::parse(v, &self.namespace, &self.service, self.cfg.consumer.instances_max)
            .map_err(|e| SdkError::Registry(ClientError::Decode(e)))
    }

    /// Folds a usable answer in, publishes a material change and snapshots it.
    async fn fold(&self, answer: Answer) {
        let now = self.now_ms();
        let (outcome, view) = {
            let mut inner = self.inner.lock();
            inner.watch_index = answer.index;
            let outcome = inner.cache.handle_answer(answer, now);
            let view = inner.cache.view().clone();
            inner.balancer.retain(&view.instances);
            let st = &mut inner.status;
            st.connected = true;
            st.consecutive_errors = 0;
            st.answers += 1;
            st.empty_held = match outcome {
                Outcome::EmptyHeld(p) => Some(p),
                Outcome::Applied { .. } | Outcome::EmptyConfirmed => None,
            };
            (outcome, view)
        };
        let changed = match outcome {
            Outcome::Applied { changed } => changed,
            Outcome::EmptyConfirmed => {
                tracing::warn!(service = %self.service, "empty answer confirmed; the cache is now empty");
                true
            }
            Outcome::EmptyHeld(p) => {
                if p.seen == 1 {
                    self.inner.lock().status.empty_answers_held += 1;
                    tracing::warn!(service = %self.service, index = p.index,
                        "empty answer held back by push-empty protection; keeping the cached instances");
                }
                false
            }
        };
        self.tx.send_if_modified(|cur| {
            *cur = view.clone();
            changed
        });
        if changed {
            self.save_snapshot(&view).await;
        }
    }

    fn failed(&self, e: &SdkError) {
        let mut inner = self.inner.lock();
        let st = &mut inner.status;
        st.connected = false;
        st.consecutive_errors = st.consecutive_errors.saturating_add(1);
        st.last_error = Some(e.to_string());
    }

    async fn restore_snapshot(&self) {
        let Some(dir) = self.cfg.consumer.snapshot_dir.clone() else { return };
        let (ns, svc) = (self.namespace.clone(), self.service.clone());
        let (bytes_max, instances_max) =
            (self.cfg.consumer.snapshot_bytes_max, self.cfg.consumer.instances_max);
        let res =
            tokio::task::spawn_blocking(move || snapshot::read(&dir, &ns, &svc, bytes_max, instances_max))
                .await
                .unwrap_or_else(|e| {
                    Err(snapshot::SnapshotError::Invalid { path: Default::default(), reason: e.to_string() })
                });
        match res {
            Ok(Some(view)) => {
                tracing::info!(service = %self.service, instances = view.instances.len(), "serving the disk snapshot");
                let view = {
                    let mut inner = self.inner.lock();
                    inner.cache.restore(view);
                    inner.cache.view().clone()
                };
                self.tx.send_replace(view);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "disk snapshot not used");
                self.inner.lock().status.snapshot_error = Some(e.to_string());
            }
        }
    }

    async fn save_snapshot(&self, view: &Arc<ServiceView>) {
        let Some(dir) = self.cfg.consumer.snapshot_dir.clone() else { return };
        let view = view.clone();
        let saved_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let res = tokio::task::spawn_blocking(move || snapshot::write(&dir, &view, saved_at)).await;
        let err = match res {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = &err {
            tracing::warn!(error = %e, "could not write the disk snapshot");
        }
        self.inner.lock().status.snapshot_error = err;
    }
}

/// The background task: blocking queries, periodic full reads, backoff on failures.
async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let c = shared.cfg.consumer.clone();
    let mut backoff = Backoff::new(shared.cfg.retry);
    let mut next_full = tokio::time::Instant::now() + c.full_pull_interval;
    loop {
        if *stop.borrow() {
            return;
        }
        let started = tokio::time::Instant::now();
        let (index, recheck) = {
            let inner = shared.inner.lock();
            (inner.watch_index, inner.cache.recheck_in(shared.now_ms()))
        };
        let full_due = index == 0 || started >= next_full;
        let request = if full_due {
            None
        } else {
            let wait = recheck.unwrap_or(c.watch_wait).min(c.watch_wait).min(next_full - started);
            Some((index, wait.max(Duration::from_millis(10))))
        };
        let res = tokio::select! {
            r = shared.read(request) => r,
            _ = stop.changed() => return,
        };
        let pause = match res {
            Ok(answer) => {
                if full_due {
                    next_full = tokio::time::Instant::now() + c.full_pull_interval;
                }
                shared.fold(answer).await;
                backoff.reset();
                c.request_interval_min.saturating_sub(started.elapsed())
            }
            Err(e) => {
                let d = backoff.next_delay(&mut rand::thread_rng());
                tracing::debug!(service = %shared.service, error = %e, retry_in_ms = d.as_millis() as u64,
                    "registry read failed; keeping the cache");
                shared.failed(&e);
                d
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }
}
