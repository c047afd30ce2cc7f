//! One registry node: opens the event log, starts the committer, the registry, the lease
//! checker, the purge task, the replication gateway (when configured) and the HTTP API,
//! and stops them in order.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tandem_replicator::gateway::{self, Gateway, GatewayConfig, GatewayStats, PeerConfig, ReplicaStore};
use tandem_replicator::log::{ApplyReport, EventLog, LogError};
use tandem_replicator::protocol::StreamTuning;
use tandem_replicator::purge;
use tandem_replicator::tls::{ReloadableTls, TlsPaths};
use tandem_schemas::{ChangeEvent, Mark, Snapshot};
use tokio::sync::watch;

use crate::config::Config;
use crate::registry::{Counters, Registry, ViewCell};
use crate::store::{CommitError, CommitLog, CommitNotice, Committed, Committer, CommitterHandle, RocksLog};

fn log_err(e: CommitError) -> LogError {
    match e {
        CommitError::Log(e) => e,
        other => LogError::Storage(other.to_string()),
    }
}

/// Marks and floors as of the last durable write, readable without the committer.
#[derive(Debug)]
pub struct LiveMarks {
    pub own: Mark,
    pub floor: u64,
    pub remote: BTreeMap<String, Mark>,
}

/// Encoded discovery answers: (namespace, service, filter) -> (index, JSON bytes).
pub type AnswerCache = std::collections::HashMap<(String, String, String), (u64, axum::body::Bytes)>;

/// What the HTTP handlers and the background tasks share.
pub struct NodeShared {
    pub registry: Arc<Registry>,
    pub committer: CommitterHandle,
    pub live: Arc<parking_lot::RwLock<LiveMarks>>,
    pub gateway_stats: Option<Arc<GatewayStats>>,
    /// Encoded discovery answers by (namespace, service, filter), with their index.
    pub answers: Mutex<AnswerCache>,
    /// Turns true when the node shuts down (streaming watches end).
    pub closing: watch::Receiver<bool>,
    gateway: Mutex<Option<Gateway>>,
    gateway_clock: tokio::time::Instant,
    config_path: Option<PathBuf>,
    started: std::time::Instant,
}

/// A running node.
pub struct Node {
    pub shared: Arc<NodeShared>,
    http_addr: SocketAddr,
    repl_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The gateway's view of the committer.
#[derive(Clone)]
struct NodeStore {
    committer: CommitterHandle,
}

impl ReplicaStore for NodeStore {
    async fn with_log<R: Send + 'static>(
        &self,
        f: Box<dyn FnOnce(&dyn EventLog) -> R + Send>,
    ) -> Result<R, LogError> {
        self.committer.with_log(move |log: &mut RocksLog| f(&*log)).await.map_err(log_err)
    }
    async fn apply_remote(
        &self,
        channel_dc: String,
        events: Vec<ChangeEvent>,
    ) -> Result<ApplyReport, LogError> {
        self.committer.apply_remote(channel_dc, events).await.map_err(log_err)
    }
    async fn install_snapshot(
        &self,
        channel_dc: String,
        snapshot: Snapshot,
    ) -> Result<ApplyReport, LogError> {
        self.committer.install_snapshot(channel_dc, snapshot).await.map_err(log_err)
    }
    async fn purge_remote_tombstones(&self, origin: String, upto_seq: u64) -> Result<(), LogError> {
        self.committer.purge_remote_tombstones(origin, upto_seq).await.map_err(log_err)
    }
    async fn peer_acked(&self, peer_dc: String, mark: Mark) -> Result<(), LogError> {
        self.committer.record_peer_ack(peer_dc, mark).await.map_err(log_err)
    }
    async fn mark_of(&self, origin: String) -> Result<Option<Mark>, LogError> {
        self.committer.with_log(move |log: &mut RocksLog| log.mark_of(&origin)).await.map_err(log_err)
    }
    fn own_progress(&self) -> watch::Receiver<u64> {
        self.committer.own_seq()
    }
}

impl Node {
    /// Starts a node. `config_path` is re-read on reload (SIGHUP or POST /v1/admin/reload).
    pub async fn start(cfg: Config, config_path: Option<PathBuf>) -> anyhow::Result<Node> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.data_dir)
            .with_context(|| format!("cannot create data_dir {}", cfg.data_dir.display()))?;
        let mut log = RocksLog::open_with_write_buffer(&cfg.data_dir, &cfg.dc, cfg.store.write_buffer_mib)
            .with_context(|| format!("cannot open the event log in {}", cfg.data_dir.display()))?;
        // A restart is a durable write of the watch index, so the index moves past anything
        // an earlier run showed (see registry::ViewIndex).
        log.bump_index().context("cannot write to the event log")?;
        let own = log.own_mark();
        tracing::info!(dc = %cfg.dc, epoch = own.epoch, seq = own.seq, dir = %cfg.data_dir.display(), "event log open");
        let counters = Arc::new(Counters::default());
        let view = ViewCell::new(&cfg.dc, log.index(), counters.clone());
        view.load(log.instances()?);
        let live = Arc::new(parking_lot::RwLock::new(LiveMarks {
            own: log.own_mark(),
            floor: log.purge_floor(),
            remote: log.marks(),
        }));
        let cb_view = view.clone();
        let cb_live = live.clone();
        let committer = Committer::spawn_with_limits(
            log,
            Box::new(move |n: &CommitNotice| {
                {
                    let mut l = cb_live.write();
                    l.own = n.own_mark;
                    match &n.committed {
                        Committed::Remote { origin, report } | Committed::Snapshot { origin, report } => {
                            if let Some(m) = report.mark {
                                l.remote.insert(origin.clone(), m);
                            }
                        }
                        Committed::PurgedOwn { floor, .. } => l.floor = *floor,
                        Committed::Local { .. } | Committed::PurgedRemoteTombstones { .. } => {}
                    }
                }
                cb_view.apply(n.index, n.changes());
            }),
            cfg.store.committer_limits(),
        )
        .context("cannot start the committer thread")?;
        let cfg = Arc::new(cfg);
        let registry = Registry::new(
            cfg.clone(),
            Arc::new(committer.clone()),
            view,
            counters,
            Arc::new(crate::clock::SystemClock::new()),
        );

        let (shutdown, shut_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Replication.
        let gateway_clock = tokio::time::Instant::now();
        let (gw, repl_addr) = match &cfg.replication {
            Some(r) => {
                let tls = ReloadableTls::load(TlsPaths {
                    ca_cert: r.ca_cert.clone(),
                    cert: r.cert.clone(),
                    key: r.key.clone(),
                })
                .context("cannot load the replication certificates")?;
                let gcfg = GatewayConfig {
                    local_dc: cfg.dc.clone(),
                    listen: r.listen,
                    peers: r.peers.iter().map(|p| PeerConfig { dc: p.dc.clone(), addr: p.addr }).collect(),
                    stream: StreamTuning {
                        batch_events_max: r.batch_events_max,
                        window_batches_max: r.window_batches_max,
                        ping_interval_ms: r.ping_interval_ms,
                    },
                    backoff_initial_ms: r.backoff_initial_ms,
                    backoff_max_ms: r.backoff_max_ms,
                };
                let gw = Gateway::start(gcfg, Arc::new(tls), NodeStore { committer: committer.clone() })
                    .context("cannot start the replication gateway")?;
                let addr = gw.local_addr().ok();
                (Some(gw), addr)
            }
            None => (None, None),
        };
        let gateway_stats = gw.as_ref().map(|g| g.stats());
        if let (Some(stats), Some(r)) = (gateway_stats.clone(), cfg.replication.clone()) {
            let peers: Vec<String> = r.peers.iter().map(|p| p.dc.clone()).collect();
            let stale_after = r.stale_after_ms;
            let started = gateway_clock;
            registry.set_stale_fn(Arc::new(move |origin: &str| {
                if !peers.iter().any(|p| p == origin) {
                    return true;
                }
                let now = started.elapsed().as_millis() as u64;
                let last = stats.peers.lock().get(origin).map_or(0, |p| p.in_last_contact_mono_ms);
                now.saturating_sub(last) > stale_after
            }));
        }

        let shared = Arc::new(NodeShared {
            registry: registry.clone(),
            committer: committer.clone(),
            live,
            gateway_stats,
            answers: Mutex::new(Default::default()),
            closing: shut_rx.clone(),
            gateway: Mutex::new(gw),
            gateway_clock,
            config_path,
            started: std::time::Instant::now(),
        });

        // Lease checker.
        {
            let reg = registry.clone();
            let mut shut = shut_rx.clone();
            let every = Duration::from_millis(cfg.health.check_interval_ms);
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => reg.check_leases().await,
                        _ = shut.changed() => return,
                    }
                }
            }));
        }
        // Purge: own log entries and tombstones every peer acked and older than the grace.
        {
            let committer = committer.clone();
            let peers: Vec<String> = cfg
                .replication
                .as_ref()
                .map(|r| r.peers.iter().map(|p| p.dc.clone()).collect())
                .unwrap_or_default();
            let grace_ms = cfg.replication.as_ref().map_or(3_600_000, |r| r.purge_grace_ms);
            let mut shut = shut_rx.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_millis((grace_ms / 4).clamp(200, 60_000)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            if let Err(e) = purge_once(&committer, &peers, grace_ms, gateway::wall_ms()).await {
                                tracing::warn!(error = %e, "purge pass failed");
                            }
                        }
                        _ = shut.changed() => return,
                    }
                }
            }));
        }

        // HTTP.
        let listener = tokio::net::TcpListener::bind(cfg.http_addr)
            .await
            .with_context(|| format!("cannot bind the HTTP API on {}", cfg.http_addr))?;
        let http_addr = listener.local_addr()?;
        let app = crate::http::router(shared.clone());
        {
            let mut shut = shut_rx.clone();
            tasks.push(tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    let _ = shut.changed().await;
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "HTTP server failed");
                }
            }));
        }
        tracing::info!(dc = %cfg.dc, http = %http_addr, replication = ?repl_addr, "tandem node started");
        Ok(Node { shared, http_addr, repl_addr, shutdown, tasks })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn repl_addr(&self) -> Option<SocketAddr> {
        self.repl_addr
    }

    /// Stops every task, the gateway and the committer (which syncs and closes RocksDB).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        // Bounded: blocking queries in flight get a second to finish, then are cut.
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(1), t).await.is_err() {
                abort.abort();
            }
        }
        let gw = self.shared.gateway.lock().take();
        if let Some(gw) = gw {
            gw.shutdown().await;
        }
        self.shared.committer.shutdown().await;
    }
}

/// One pass of the purge task: own log entries and tombstones every peer acknowledged and
/// older than `grace_ms` go (the rule is [`tandem_replicator::purge`]). `now_wall_ms` is the
/// wall clock the events' commit times are compared with.
pub async fn purge_once<L: CommitLog + Send + 'static>(
    committer: &CommitterHandle<L>,
    peers: &[String],
    grace_ms: u64,
    now_wall_ms: u64,
) -> Result<(), LogError> {
    let peers = peers.to_vec();
    let cutoff = now_wall_ms.saturating_sub(grace_ms);
    let upto = committer
        .with_log(move |log: &mut L| -> Result<u64, LogError> {
            let own = log.own_mark();
            let acks = log.peer_acks();
            let acked = purge::acked_floor(own, peers.iter().map(|p| acks.get(p).copied()));
            purge::purge_upto(log.purge_floor(), acked, cutoff, |after, max| log.read_own(after, max))
        })
        .await
        .map_err(log_err)??;
    if upto > 0 {
        committer.purge_own(upto).await.map_err(log_err)?;
    }
    Ok(())
}

impl NodeShared {
    /// Re-reads the config file: failover policy and protection settings take effect at
    /// once; replication certificates are reloaded. An invalid file changes nothing.
    pub fn reload(&self) -> Result<(), String> {
        let Some(path) = &self.config_path else {
            return Err("this node was started without a config file; nothing to reload".into());
        };
        let new = Config::load(path).map_err(|e| e.to_string())?;
        let old = self.registry.config();
        if new.dc != old.dc || new.data_dir != old.data_dir {
            return Err("dc and data_dir cannot change at runtime".into());
        }
        if let Some(gw) = self.gateway.lock().as_ref() {
            gw.reload_tls().map_err(|e| format!("certificates: {e}"))?;
        }
        self.registry.set_config(Arc::new(new));
        tracing::info!(path = %path.display(), "configuration reloaded");
        Ok(())
    }

    fn peer_json(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        let Some(stats) = &self.gateway_stats else { return out };
        let now_mono = self.gateway_clock.elapsed().as_millis() as u64;
        let now_wall = gateway::wall_ms();
        let marks = self.live.read().remote.clone();
        let cfg = self.registry.config();
        let stale_after = cfg.replication.as_ref().map_or(30_000, |r| r.stale_after_ms);
        for (dc, p) in stats.peers.lock().iter() {
            let applied = marks.get(dc).copied();
            let lag_events = p.in_origin_last_seq.saturating_sub(applied.map_or(0, |m| m.seq));
            let silent_ms = now_mono.saturating_sub(p.in_last_contact_mono_ms);
            out.insert(
                dc.clone(),
                json!({
                    "outbound": {
                        // "stalled": connected, but the oldest batch waits for its ack
                        // longer than the stale threshold's tenth (at least 2 s).
                        "state": match (p.out_connected, p.out_oldest_unacked_wall_ms) {
                            (false, _) => "down",
                            (true, 0) => "up",
                            (true, t) if now_wall.saturating_sub(t) > (stale_after / 10).max(2_000) => "stalled",
                            (true, _) => "up",
                        },
                        "inflight_batches": p.out_inflight_batches,
                        "acked_seq": p.out_acked_seq,
                        "last_ack_ms_ago": (p.out_last_ack_wall_ms > 0).then(|| now_wall.saturating_sub(p.out_last_ack_wall_ms)),
                        "connects": p.out_connects,
                        "failures": p.out_failures,
                        "last_error": p.out_last_error,
                        "snapshots_sent": p.snapshots_sent,
                    },
                    "inbound": {
                        "state": if p.in_connected { "up" } else { "down" },
                        "last_contact_ms_ago": (p.in_last_contact_wall_ms > 0).then_some(silent_ms),
                        "applied": applied.map(|m| json!({"epoch": m.epoch, "seq": m.seq})),
                        "origin_last_seq": p.in_origin_last_seq,
                        "lag_events": lag_events,
                        "lag_ms_p50": p.lag_ms_recent.quantile(0.5),
                        "lag_ms_p99": p.lag_ms_recent.quantile(0.99),
                        "events_applied": p.events_applied,
                        "snapshots_installed": p.snapshots_installed,
                        "stale": silent_ms > stale_after,
                    },
                }),
            );
        }
        out
    }

    /// GET /v1/status.
    pub fn status(&self) -> Value {
        let reg = &self.registry;
        let (own, floor) = {
            let l = self.live.read();
            (l.own, l.floor)
        };
        let (renewals, expected) = reg.preservation_figures();
        let applied: BTreeMap<String, Value> = self
            .live
            .read()
            .remote
            .clone()
            .into_iter()
            .map(|(dc, m)| (dc, json!({"epoch": m.epoch, "seq": m.seq})))
            .collect();
        json!({
            "dc": reg.dc,
            "node": "node-1",
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "index": reg.view().index(),
            "log": {"epoch": own.epoch, "first_seq": floor + 1, "last_seq": own.seq, "purge_floor": floor},
            "applied": applied,
            "peers": self.peer_json(),
            "self_preservation": {
                "active": reg.self_preservation_active(),
                "renewals_last_window": renewals,
                "expected_last_window": expected,
            },
            "instances": reg.counts_by_owner(),
            "leases": reg.lease_count(),
            "watch_streams": reg.counters.watch_streams.load(Ordering::Relaxed),
            "disk_writes": self.committer.stats().fsyncs,
            "heartbeats": reg.counters.heartbeats.load(Ordering::Relaxed),
        })
    }

    /// GET /metrics, Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let reg = &self.registry;
        let c = &reg.counters;
        let mut m = Metrics::default();
        let dc: &str = &reg.dc;
        m.counter(
            "tandem_heartbeats_total",
            "Heartbeats accepted",
            &[("dc", dc)],
            c.heartbeats.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_heartbeats_unknown_total",
            "Heartbeats for unknown or foreign instances",
            &[("dc", dc)],
            c.heartbeats_unknown.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_disk_writes_total",
            "Synced RocksDB write batches (heartbeats never add to this)",
            &[("dc", dc)],
            self.committer.stats().fsyncs,
        );
        m.counter(
            "tandem_registrations_total",
            "Registrations accepted",
            &[("dc", dc)],
            c.registrations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_deregistrations_total",
            "Explicit deregistrations",
            &[("dc", dc)],
            c.deregistrations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_lease_expirations_total",
            "Leases expired",
            &[("dc", dc)],
            c.expirations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_health_events_total",
            "Health change events minted",
            &[("dc", dc)],
            c.health_events.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_events_applied_total",
            "State changes applied",
            &[("dc", dc), ("origin", "local")],
            c.events_local.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_events_applied_total",
            "State changes applied",
            &[("dc", dc), ("origin", "remote")],
            c.events_remote.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_discover_requests_total",
            "Discovery requests",
            &[("dc", dc)],
            c.discover_requests.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_heartbeat_batches_total",
            "POST /v1/heartbeats requests (their entries count in tandem_heartbeats_total)",
            &[("dc", dc)],
            c.heartbeat_batches.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_watch_wakeups_total",
            "Watch answers sent after a change (blocking queries and streams)",
            &[("dc", dc)],
            c.watch_wakeups.load(Ordering::Relaxed),
        );
        m.gauge(
            "tandem_watch_streams",
            "Streaming watches open now",
            &[("dc", dc)],
            c.watch_streams.load(Ordering::Relaxed) as f64,
        );
        let st = self.committer.stats();
        m.counter(
            "tandem_group_commit_fsyncs_total",
            "Synced writes that carried local appends",
            &[("dc", dc)],
            st.local_fsyncs,
        );
        m.counter(
            "tandem_group_commit_requests_total",
            "Local appends carried by those writes",
            &[("dc", dc)],
            st.local_requests,
        );
        m.counter(
            "tandem_group_commit_events_total",
            "Events carried by those writes",
            &[("dc", dc)],
            st.local_events,
        );
        m.gauge(
            "tandem_self_preservation_active",
            "1 while lease expiry is paused",
            &[("dc", dc)],
            u64::from(reg.self_preservation_active()) as f64,
        );
        m.gauge("tandem_leases", "Ephemeral leases held", &[("dc", dc)], reg.lease_count() as f64);
        m.gauge("tandem_index", "Watch index", &[("dc", dc)], reg.view().index() as f64);
        let (own, floor, marks) = {
            let l = self.live.read();
            (l.own, l.floor, l.remote.clone())
        };
        m.gauge("tandem_log_last_seq", "Own origin's last seq", &[("dc", dc)], own.seq as f64);
        m.gauge("tandem_log_purge_floor", "Own origin's purge floor", &[("dc", dc)], floor as f64);
        for (owner, n) in reg.counts_by_owner() {
            m.gauge(
                "tandem_instances",
                "Instances held, by owner DC",
                &[("dc", dc), ("owner_dc", &owner)],
                n as f64,
            );
        }
        for (origin, mk) in &marks {
            m.gauge(
                "tandem_applied_seq",
                "Applied high-water mark per origin",
                &[("dc", dc), ("origin", origin)],
                mk.seq as f64,
            );
        }
        if let Some(stats) = &self.gateway_stats {
            let now_mono = self.gateway_clock.elapsed().as_millis() as u64;
            for (peer, p) in stats.peers.lock().iter() {
                let l = [("dc", dc), ("peer", peer.as_str())];
                m.gauge(
                    "tandem_peer_outbound_up",
                    "1 while our stream to the peer is up",
                    &l,
                    u64::from(p.out_connected) as f64,
                );
                m.gauge(
                    "tandem_peer_inbound_up",
                    "1 while the peer's stream to us is up",
                    &l,
                    u64::from(p.in_connected) as f64,
                );
                m.gauge("tandem_peer_acked_seq", "Own seq the peer acknowledged", &l, p.out_acked_seq as f64);
                m.gauge(
                    "tandem_peer_last_contact_seconds",
                    "Seconds since the peer's last frame",
                    &l,
                    now_mono.saturating_sub(p.in_last_contact_mono_ms) as f64 / 1000.0,
                );
                let applied = marks.get(peer).map_or(0, |m| m.seq);
                m.gauge(
                    "tandem_peer_lag_events",
                    "Peer's events not yet applied here",
                    &l,
                    p.in_origin_last_seq.saturating_sub(applied) as f64,
                );
                if let Some(v) = p.lag_ms_recent.quantile(0.5) {
                    m.gauge("tandem_peer_lag_ms_p50", "Commit-to-apply lag, recent p50", &l, v as f64);
                }
                if let Some(v) = p.lag_ms_recent.quantile(0.99) {
                    m.gauge("tandem_peer_lag_ms_p99", "Commit-to-apply lag, recent p99", &l, v as f64);
                }
                m.counter(
                    "tandem_peer_snapshots_sent_total",
                    "Snapshots sent to the peer",
                    &l,
                    p.snapshots_sent,
                );
                m.counter(
                    "tandem_peer_snapshots_installed_total",
                    "Snapshots installed from the peer",
                    &l,
                    p.snapshots_installed,
                );
            }
            m.counter(
                "tandem_replication_refused_connections_total",
                "Replication connections refused",
                &[("dc", dc)],
                stats.refused_connections.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_protocol_errors_total",
                "Replication protocol errors",
                &[("dc", dc)],
                stats.protocol_errors.load(Ordering::Relaxed),
            );
        }
        m.render()
    }
}

/// A tiny Prometheus text writer: samples are grouped by family, each family's HELP and
/// TYPE written once, in first-seen order.
#[derive(Default)]
struct Metrics {
    families: Vec<(&'static str, String, &'static str, Vec<String>)>,
}

impl Metrics {
    fn sample(
        &mut self,
        name: &'static str,
        help: &str,
        kind: &'static str,
        labels: &[(&str, &str)],
        v: f64,
    ) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| {
                format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
            })
            .collect();
        let line = format!("{name}{{{}}} {v}", l.join(","));
        match self.families.iter_mut().find(|f| f.0 == name) {
            Some(f) => f.3.push(line),
            None => self.families.push((name, help.to_owned(), kind, vec![line])),
        }
    }
    fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: u64) {
        self.sample(name, help, "counter", labels, v as f64);
    }
    fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.sample(name, help, "gauge", labels, v);
    }
    fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, kind, lines) in &self.families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for l in lines {
                let _ = writeln!(out, "{l}");
            }
        }
        out
    }
}
