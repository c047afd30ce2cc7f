//! One registry node: opens the event log, starts the committer, the registry, the lease
//! checker, the purge task, the replication gateway (when configured) and the HTTP API,
//! and stops them in order.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;
use tandem_replicator::gateway::{self, Gateway, GatewayConfig, GatewayStats, PeerBook, ReplicaStore};
use tandem_replicator::log::{ApplyReport, ChunkOutcome, EventLog, LogError};
use tandem_replicator::protocol::StreamTuning;
use tandem_replicator::purge;
use tandem_replicator::tls::{ReloadableTls, TlsPaths};
use tandem_schemas::{ChangeEvent, Mark, Snapshot, SnapshotChunk};
use tokio::sync::watch;

use crate::cluster::GroupLog;
use crate::config::{ClusterSection, Config};
use crate::http::listener::{self, ListenerLimits};
use crate::registry::{Counters, Registry, ViewCell};
pub use crate::shared::{AnswerCache, LiveMarks, NodeShared};
use crate::store::{CommitError, CommitLog, CommitNotice, Committed, Committer, CommitterHandle, RocksLog};
use committer::NodeCommitter;
use group::Group;

pub mod committer;
pub mod data_dir;
pub mod forward_batch;
pub mod group;
mod idle;
pub mod lateness;
mod metrics;
mod prom;
pub mod status;

fn log_err(e: CommitError) -> LogError {
    match e {
        CommitError::Log(e) => e,
        other => LogError::Storage(other.to_string()),
    }
}

/// A running node.
pub struct Node {
    pub shared: Arc<NodeShared>,
    http_addr: SocketAddr,
    repl_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The gateway's view of the committer (over either kind of log).
struct NodeStore<L: CommitLog + Send + 'static = RocksLog> {
    committer: CommitterHandle<L>,
    /// Updated by commit notices; a new epoch (no commit notice) updates it here.
    live: Arc<parking_lot::RwLock<LiveMarks>>,
}

impl<L: CommitLog + Send + 'static> Clone for NodeStore<L> {
    fn clone(&self) -> Self {
        NodeStore { committer: self.committer.clone(), live: self.live.clone() }
    }
}

impl<L: CommitLog + Send + 'static> ReplicaStore for NodeStore<L> {
    async fn with_log<R: Send + 'static>(
        &self,
        f: Box<dyn FnOnce(&dyn EventLog) -> R + Send>,
    ) -> Result<R, LogError> {
        self.committer.read_log(move |log: &L| f(log)).await.map_err(log_err)
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
    async fn stage_snapshot_chunk(
        &self,
        channel_dc: String,
        chunk: SnapshotChunk,
    ) -> Result<ChunkOutcome, LogError> {
        self.committer.stage_snapshot_chunk(channel_dc, chunk).await.map_err(log_err)
    }
    async fn purge_remote_tombstones(&self, origin: String, upto_seq: u64) -> Result<(), LogError> {
        self.committer.purge_remote_tombstones(origin, upto_seq).await.map_err(log_err)
    }
    async fn peer_acked(&self, peer_dc: String, mark: Mark) -> Result<(), LogError> {
        self.committer.record_peer_ack(peer_dc, mark).await.map_err(log_err)
    }
    async fn mark_of(&self, origin: String) -> Result<(Option<Mark>, Option<uuid::Uuid>), LogError> {
        self.committer
            .read_log(move |log: &L| (log.mark_of(&origin), log.mark_event_id(&origin)))
            .await
            .map_err(log_err)
    }
    async fn begin_epoch(&self, above: u64, tiebreak: u64) -> Result<Mark, LogError> {
        let own = self
            .committer
            .with_log(move |log: &mut L| log.begin_epoch_above(above, tiebreak))
            .await
            .map_err(log_err)??;
        let mut l = self.live.write();
        l.own = own;
        l.floor = own.seq;
        Ok(own)
    }
    fn own_progress(&self) -> watch::Receiver<u64> {
        self.committer.own_seq()
    }
    fn own_epoch(&self) -> Option<u64> {
        Some(self.live.read().own.epoch)
    }
    fn retired(&self, dc: &str) -> bool {
        self.live.read().retired.contains_key(dc)
    }
}

/// Follows one durable write in the marks every reader sees without the committer.
fn note_marks(l: &mut LiveMarks, n: &CommitNotice) {
    l.own = n.own_mark;
    match &n.committed {
        Committed::Remote { origin, report } | Committed::Snapshot { origin, report } => {
            if let Some(m) = report.mark {
                l.remote.insert(origin.clone(), m);
            }
        }
        Committed::PurgedOwn { floor, .. } => l.floor = *floor,
        Committed::Retired { origin, at_ms, .. } => {
            l.remote.remove(origin);
            l.retired.insert(origin.clone(), *at_ms);
        }
        Committed::Unretired { origin } => {
            l.retired.remove(origin);
        }
        // A member that installed a Raft snapshot holds the leader's marks from now on.
        Committed::Replaced { marks, .. } => {
            l.floor = marks.floor;
            l.remote.clone_from(&marks.remote);
            l.retired.clone_from(&marks.retired);
        }
        Committed::Local { .. } | Committed::PurgedRemoteTombstones { .. } | Committed::Rescoped { .. } => {}
    }
}

/// What opening the node's state gives the rest of its start.
struct Opened {
    committer: NodeCommitter,
    view: Arc<ViewCell>,
    live: Arc<parking_lot::RwLock<LiveMarks>>,
    owners: Vec<(tandem_schemas::InstanceKey, Arc<str>)>,
    invalid_records: Arc<crate::store::InvalidRecords>,
    group: Option<Arc<Group>>,
}

fn live_marks(log: &RocksLog) -> Arc<parking_lot::RwLock<LiveMarks>> {
    Arc::new(parking_lot::RwLock::new(LiveMarks {
        own: log.own_mark(),
        floor: log.purge_floor(),
        remote: log.marks(),
        retired: log.retired(),
    }))
}

/// A single node's state: its RocksLog in the data dir, its committer over it.
fn open_single(cfg: &Config, counters: &Arc<Counters>) -> anyhow::Result<Opened> {
    let mut log =
        RocksLog::open_tuned(&cfg.data_dir, &cfg.dc, cfg.store.write_buffer_mib, cfg.store.max_open_files)
            .with_context(|| format!("cannot open the event log in {}", cfg.data_dir.display()))?;
    // A restart is a durable write of the watch index, so the index moves past anything
    // an earlier run showed (see registry::ViewIndex).
    log.bump_index().context("cannot write to the event log")?;
    // Before anything reads the state: each peer's replication scope as configured
    // (copies outside it go; a wider one resyncs the peer).
    for peer in cfg.replication.iter().flat_map(|r| &r.peers) {
        log.rescope(&peer.dc, &peer.scope())
            .with_context(|| format!("cannot record the replication scope of {}", peer.dc))?;
    }
    let own = log.own_mark();
    let invalid_records = log.invalid_records();
    tracing::info!(dc = %cfg.dc, epoch = own.epoch, seq = own.seq, dir = %cfg.data_dir.display(), "event log open");
    let view = ViewCell::new(&cfg.dc, log.index(), counters.clone());
    view.try_load(log.instance_records()?)?;
    view.show_own(own.seq);
    let owners = log.owners().context("cannot read the instance owners")?;
    let live = live_marks(&log);
    let (cb_view, cb_live) = (view.clone(), live.clone());
    let committer = Committer::spawn_with_limits(
        log,
        Box::new(move |n: &CommitNotice| {
            note_marks(&mut cb_live.write(), n);
            cb_view.follow(n);
        }),
        cfg.store.committer_limits(),
    )
    .context("cannot start the committer thread")?;
    Ok(Opened {
        committer: NodeCommitter::Single(committer),
        view,
        live,
        owners,
        invalid_records,
        group: None,
    })
}

/// A group member's state: the state machine, fed to the view and the marks by every
/// apply (leader or not), the member's Raft, and a committer over the group's log (its
/// writes succeed only while this node leads).
async fn open_group(
    cfg: &Config,
    section: &ClusterSection,
    counters: &Arc<Counters>,
) -> anyhow::Result<Opened> {
    let sm = group::open_state(cfg)?;
    // The watch index is the applied Raft index: the same on every member.
    let applied = sm.applied_index();
    let (view, live, owners, invalid_records) = sm.with_log(|log| -> anyhow::Result<_> {
        let own = log.own_mark();
        tracing::info!(dc = %cfg.dc, epoch = own.epoch, seq = own.seq, dir = %cfg.data_dir.display(), "group state open");
        let view = ViewCell::new(&cfg.dc, applied, counters.clone());
        view.try_load(log.instance_records()?)?;
        view.show_own(own.seq);
        let owners = log.owners().context("cannot read the instance owners")?;
        Ok((view, live_marks(log), owners, log.invalid_records()))
    })?;
    let (cb_view, cb_live) = (view.clone(), live.clone());
    let progress = Arc::new(group::RemoteProgress::default());
    let cb_progress = progress.clone();
    sm.on_apply(Box::new(move |n: &CommitNotice| {
        note_marks(&mut cb_live.write(), n);
        // A peer's batch or snapshot applied here is progress of its copies (a follower's
        // stale flag turns fresh with it, as the leader's gateway's does).
        if let Committed::Remote { origin, report } | Committed::Snapshot { origin, report } = &n.committed {
            if report.mark.is_some() {
                cb_progress.note(origin, std::time::Instant::now());
            }
        }
        match n.changes() {
            [] => cb_view.advance(n.index),
            changes => cb_view.apply(n.index, changes),
        }
        cb_view.show_own(n.own_mark.seq);
    }));
    let secret = data_dir::reset_secret(&cfg.data_dir).context("cannot load the stateless-reset secret")?;
    let group = Arc::new(Group::start(cfg, section, sm.clone(), secret, progress).await?);
    let log = GroupLog::new(group.raft.clone(), sm, tokio::runtime::Handle::current())
        .with_raft_store(group.store.clone());
    let mut limits = cfg.store.committer_limits();
    // Recovery here is "lead again": look often.
    limits.recovery_backoff_max = limits.recovery_backoff_max.min(GROUP_RECOVERY_BACKOFF_MAX);
    limits.recovery_backoff_initial = limits.recovery_backoff_initial.min(limits.recovery_backoff_max);
    // The state machine's hook told the view and the marks; the committer's notices
    // carry no changes and tell nothing new.
    let committer = Committer::spawn_with_limits(log, Box::new(|_: &CommitNotice| {}), limits)
        .context("cannot start the committer thread")?;
    Ok(Opened {
        committer: NodeCommitter::Group(committer),
        view,
        live,
        owners,
        invalid_records,
        group: Some(group),
    })
}

/// Starts the node's replication gateway (a group's leader calls it at each take-over).
type StartGateway = Arc<dyn Fn() -> anyhow::Result<Gateway> + Send + Sync>;

/// What the node does when it starts and stops leading its DC's group, besides the
/// leases (see `group::lead`): records each peer's replication scope through the log and
/// starts the gateway; stops the gateway.
fn lead_hooks(shared: Arc<NodeShared>, start_gateway: Option<StartGateway>) -> group::LeadHooks {
    let on_follow = {
        let shared = shared.clone();
        Arc::new(move || {
            let shared = shared.clone();
            Box::pin(async move {
                let gw = shared.gateway.lock().take();
                if let Some(gw) = gw {
                    gw.shutdown().await;
                    tracing::info!("replication gateway stopped: this node no longer serves writes");
                }
            }) as futures::future::BoxFuture<'static, ()>
        })
    };
    let on_lead = Arc::new(move || {
        let (shared, start_gateway) = (shared.clone(), start_gateway.clone());
        Box::pin(async move {
            let cfg = shared.registry.config();
            if let NodeCommitter::Group(c) = &shared.committer {
                for peer in cfg.replication.iter().flat_map(|r| &r.peers) {
                    let (dc, scope) = (peer.dc.clone(), peer.scope());
                    c.with_log(move |log: &mut GroupLog| log.take_over_write(|l| l.rescope(&dc, &scope)))
                        .await
                        .map_err(log_err)?
                        .with_context(|| format!("cannot record the replication scope of {}", peer.dc))?;
                }
            }
            if let Some(start) = start_gateway {
                if shared.gateway.lock().is_none() {
                    let gw = start()?;
                    tracing::info!(addr = ?gw.local_addr().ok(), "replication gateway started: this node leads");
                    *shared.gateway.lock() = Some(gw);
                }
            }
            Ok(())
        }) as futures::future::BoxFuture<'static, anyhow::Result<()>>
    });
    group::LeadHooks { on_lead, on_follow }
}

/// Longest wait between two attempts of a group member's committer to write again after
/// it lost the lead (each attempt asks whether this node leads).
pub const GROUP_RECOVERY_BACKOFF_MAX: Duration = Duration::from_millis(200);

impl Node {
    /// Starts a node. `config_path` is re-read on reload (SIGHUP or POST /v1/admin/reload).
    pub async fn start(cfg: Config, config_path: Option<PathBuf>) -> anyhow::Result<Node> {
        cfg.validate()?;
        // Before anything is opened: an exposed node without an ACL decision refuses to start.
        crate::acl::check_exposure(&cfg)?;
        data_dir::prepare(&cfg.data_dir)?;
        let acl = crate::acl::start(&cfg)?;
        let audit = Arc::new(crate::audit::Audit::start(&cfg)?);
        // Before RocksDB opens: a descriptor budget too small for clients refuses the start.
        let limits = ListenerLimits::new(&cfg, listener::open_files_limit())?;
        // Before RocksDB opens too: HTTPS material that does not load refuses the start.
        let https = match &cfg.http.tls {
            Some(section) => Some(Arc::new(
                crate::http::tls::HttpsTls::load(section)
                    .context("cannot load the [http.tls] certificates")?,
            )),
            None => None,
        };
        let counters = Arc::new(Counters::default());
        let Opened { committer, view, live, owners, invalid_records, group } = match &cfg.cluster {
            Some(section) => open_group(&cfg, section, &counters).await?,
            None => open_single(&cfg, &counters)?,
        };
        let cfg = Arc::new(cfg);
        let registry = Registry::new(
            cfg.clone(),
            match &committer {
                NodeCommitter::Single(c) => Arc::new(c.clone()) as Arc<dyn crate::store::AppendLocal>,
                NodeCommitter::Group(c) => Arc::new(c.clone()),
            },
            view,
            counters,
            Arc::new(crate::clock::SystemClock::new()),
        );
        registry.load_owners(owners);

        let (shutdown, shut_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Replication: a single node runs its gateway from the start; a group's member
        // only while it leads (the lead task starts and stops it).
        let gateway_clock = tokio::time::Instant::now();
        let gateway_stats: Option<Arc<GatewayStats>> = cfg.replication.as_ref().map(|_| Arc::default());
        let mut peer_book = None;
        let start_gateway: Option<StartGateway> = match (&cfg.replication, &gateway_stats) {
            (Some(r), Some(stats)) => {
                let tls = ReloadableTls::load(TlsPaths {
                    ca_cert: r.ca_cert.clone(),
                    cert: r.cert.clone(),
                    key: r.key.clone(),
                })
                .context("cannot load the replication certificates")?;
                let (peers, admission) = crate::shared::peers_of(r);
                let gcfg = GatewayConfig {
                    local_dc: cfg.dc.clone(),
                    listen: r.listen,
                    peers: PeerBook::new(peers, admission),
                    stream: StreamTuning {
                        batch_events_max: r.batch_events_max,
                        window_batches_max: r.window_batches_max,
                        ping_interval_ms: r.ping_interval_ms,
                        frame_bytes_max: r.frame_bytes_max,
                    },
                    backoff_initial_ms: r.backoff_initial_ms,
                    backoff_max_ms: r.backoff_max_ms,
                    schema_version_write: r.schema_version,
                    reset_secret: data_dir::reset_secret(&cfg.data_dir)
                        .context("cannot load the stateless-reset secret")?,
                };
                peer_book = Some(gcfg.peers.clone());
                let (tls, live, committer, stats, clock) =
                    (Arc::new(tls), live.clone(), committer.clone(), stats.clone(), gateway_clock);
                Some(Arc::new(move || {
                    let (gcfg, tls, live, stats) = (gcfg.clone(), tls.clone(), live.clone(), stats.clone());
                    match &committer {
                        NodeCommitter::Single(c) => Gateway::start_with_stats(
                            gcfg,
                            tls,
                            NodeStore { committer: c.clone(), live },
                            stats,
                            clock,
                        ),
                        NodeCommitter::Group(c) => Gateway::start_with_stats(
                            gcfg,
                            tls,
                            NodeStore { committer: c.clone(), live },
                            stats,
                            clock,
                        ),
                    }
                    .context("cannot start the replication gateway")
                }))
            }
            _ => None,
        };
        let (gw, repl_addr) = match (&start_gateway, &group) {
            (Some(start), None) => {
                let gw = start()?;
                let addr = gw.local_addr().ok();
                (Some(gw), addr)
            }
            _ => (None, cfg.replication.as_ref().map(|r| r.listen)),
        };
        if let (Some(stats), Some(r)) = (gateway_stats.clone(), cfg.replication.clone()) {
            let peers: Vec<String> = r.peers.iter().map(|p| p.dc.clone()).collect();
            let stale_after = r.stale_after_ms;
            let started = gateway_clock;
            let group = group.clone();
            registry.set_stale_fn(Arc::new(move |origin: &str| {
                if !peers.iter().any(|p| p == origin) {
                    return true;
                }
                // A group's follower runs no gateway: the leader says.
                if let Some(stale) = group.as_ref().and_then(|g| g.remote_stale(origin, stale_after)) {
                    return stale;
                }
                // A leader: what it applied itself (also before it led) is progress too.
                if group.as_ref().is_some_and(|g| !g.progress_stale(origin, stale_after)) {
                    return false;
                }
                let now = started.elapsed().as_millis() as u64;
                // Stale means "not progressing": handshakes alone do not keep copies fresh.
                stats.peers.lock().get(origin).map_or(now > stale_after, |p| p.stale(now, stale_after))
            }));
        }

        let shared = Arc::new(NodeShared {
            registry: registry.clone(),
            committer: committer.clone(),
            group: group.clone(),
            forward_stats: Default::default(),
            live,
            gateway_stats: gateway_stats.clone(),
            peer_book,
            answers: Mutex::new(Default::default()),
            closing: shut_rx.clone(),
            gateway: Mutex::new(gw),
            gateway_clock,
            config_path,
            data_dir: cfg.data_dir.clone(),
            started: std::time::Instant::now(),
            http: Default::default(),
            acl: Arc::new(crate::acl::AclState::new(acl)),
            audit,
            invalid_records,
            https: https.clone(),
            reloading: Mutex::new(()),
            compat: Default::default(),
            runtime_lateness: Default::default(),
        });
        tasks.push(tokio::spawn(lateness::watch_lateness(shared.runtime_lateness.clone(), shut_rx.clone())));

        // Consul's TTL checks (timed on the node serving the DC's writes).
        tasks.push(tokio::spawn(crate::compat::run_ttl(shared.clone(), shut_rx.clone())));
        // Lease checker (in a group: on the leader that took over, only).
        {
            let reg = registry.clone();
            let mut shut = shut_rx.clone();
            let every = Duration::from_millis(cfg.health.check_interval_ms);
            let group = group.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            if group.as_ref().is_none_or(|g| g.serving()) {
                                reg.check_leases().await;
                            } else {
                                reg.refresh_without_leases();
                            }
                        }
                        _ = shut.changed() => return,
                    }
                }
            }));
        }
        // Taking over as the group's leader (and giving up when another leads): the
        // leases and owners, each peer's scope, then the gateway.
        if let (Some(g), Some(r), Some(stats)) = (&group, &cfg.replication, &gateway_stats) {
            let (stats, clock, reg) = (stats.clone(), gateway_clock, registry.clone());
            let peers = r.peers.iter().map(|p| p.dc.clone()).collect::<Vec<_>>();
            // How long ago the gateway saw each peer progress (a follower asks).
            g.serve_staleness(Arc::new(move || {
                let now = clock.elapsed().as_millis() as u64;
                let ages: Vec<Option<u64>> = {
                    let seen = stats.peers.lock();
                    peers
                        .iter()
                        .map(|p| seen.get(p).map(|s| now.saturating_sub(s.in_last_progress_mono_ms)))
                        .collect()
                };
                peers
                    .iter()
                    .zip(ages)
                    .map(|(p, age_ms)| {
                        (p.clone(), crate::cluster::OriginProgress { age_ms, stale: reg.origin_stale(p) })
                    })
                    .collect()
            }));
            tasks.push(tokio::spawn(group::follow_leader(
                g.clone(),
                group::LeaderPoll::Staleness,
                shut_rx.clone(),
            )));
        }
        if let Some(g) = &group {
            // Followers show the leader's peer links and self-preservation in their status,
            // and compare its policy digest with their own.
            let weak = Arc::downgrade(&shared);
            g.serve_status(Arc::new(move || {
                weak.upgrade().and_then(|s| serde_json::to_vec(&s.status()).ok()).unwrap_or_default()
            }));
            tasks.push(tokio::spawn(group::follow_leader(
                g.clone(),
                group::LeaderPoll::Policy,
                shut_rx.clone(),
            )));
            let hooks = lead_hooks(shared.clone(), start_gateway.clone());
            tasks.push(tokio::spawn(group::lead(g.clone(), registry.clone(), hooks, shut_rx.clone())));
        }
        // Purge: own log entries and tombstones every peer acked and older than the grace.
        {
            let peers: Vec<String> = cfg
                .replication
                .as_ref()
                .map(|r| r.peers.iter().map(|p| p.dc.clone()).collect())
                .unwrap_or_default();
            let grace_ms = cfg.replication.as_ref().map_or(3_600_000, |r| r.purge_grace_ms);
            let every = Duration::from_millis((grace_ms / 4).clamp(200, 60_000));
            let shut = shut_rx.clone();
            tasks.push(match &committer {
                NodeCommitter::Single(c) => {
                    tokio::spawn(purge_task(c.clone(), None, peers, grace_ms, every, shut))
                }
                NodeCommitter::Group(c) => {
                    tokio::spawn(purge_task(c.clone(), group.clone(), peers, grace_ms, every, shut))
                }
            });
        }

        // Memtables of a quiet log to table files. A group's member counts what it applied
        // (a follower's committer writes nothing), and flushes its Raft log's too.
        match (&committer, &group) {
            (NodeCommitter::Single(c), _) => {
                let writes = {
                    let c = c.clone();
                    move || c.stats().fsyncs
                };
                tasks.push(tokio::spawn(idle::flush_when_quiet(c.clone(), writes, shut_rx.clone())));
            }
            (NodeCommitter::Group(c), Some(g)) => {
                let writes = {
                    let sm = g.sm.clone();
                    move || sm.applied_index()
                };
                tasks.push(tokio::spawn(idle::flush_when_quiet(c.clone(), writes, shut_rx.clone())));
            }
            (NodeCommitter::Group(_), None) => {}
        }
        // Freed heap back to the OS after bursts of connections, and now and then.
        crate::heap::start();
        // HTTP.
        let tcp = tokio::net::TcpListener::bind(cfg.http_addr)
            .await
            .with_context(|| format!("cannot bind the HTTP API on {}", cfg.http_addr))?;
        let http_addr = tcp.local_addr()?;
        let app = crate::http::app(shared.clone());
        if let Some(g) = &group {
            let (app, shared) = (app.clone(), shared.clone());
            g.serve_forwarded(Arc::new(move |write| {
                Box::pin(crate::http::forward::serve(app.clone(), shared.clone(), write))
            }));
        }
        tracing::info!(
            connections_max = limits.connections,
            per_address = limits.per_address,
            open_files = ?listener::open_files_limit(),
            rocksdb_max_open_files = cfg.store.max_open_files,
            "HTTP connection caps"
        );
        tasks.push(tokio::spawn(listener::serve(
            tcp,
            app,
            shared.http.clone(),
            limits,
            https,
            shut_rx.clone(),
        )));
        let scheme = if cfg.http.tls.is_some() { "https" } else { "http" };
        tracing::info!(dc = %cfg.dc, http = %http_addr, scheme, replication = ?repl_addr, "tandem node started");
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
        if let Some(g) = &self.shared.group {
            g.shutdown().await;
        }
    }
}

/// The purge task: a pass every `every` (in a group: on the leader that took over, only).
async fn purge_task<L: CommitLog + Send + 'static>(
    committer: CommitterHandle<L>,
    group: Option<Arc<Group>>,
    peers: Vec<String>,
    grace_ms: u64,
    every: Duration,
    mut shut: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if group.as_ref().is_some_and(|g| !g.serving()) {
                    continue;
                }
                if let Err(e) = purge_once(&committer, &peers, grace_ms, gateway::wall_ms()).await {
                    tracing::warn!(error = %e, "purge pass failed");
                }
            }
            _ = shut.changed() => return,
        }
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
            // A retired DC no longer holds the floor.
            let retired = log.retired();
            let counted = peers.iter().filter(|p| !retired.contains_key(*p));
            let acked = purge::acked_floor(own, counted.map(|p| acks.get(p).copied()));
            purge::purge_upto(log.purge_floor(), acked, cutoff, |after, max| log.read_own(after, max))
        })
        .await
        .map_err(log_err)??;
    if upto > 0 {
        committer.purge_own(upto).await.map_err(log_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that installed a Raft snapshot follows the installed state's marks: the
    /// remote marks, the purge floor and the retired DCs it held before are gone.
    #[test]
    fn a_replaced_state_replaces_the_live_marks() {
        let mark = |epoch, seq| Mark { epoch, seq };
        let mut l = LiveMarks {
            own: mark(1, 3),
            floor: 1,
            remote: [("dc-old".to_owned(), mark(1, 9))].into(),
            retired: [("dc-x".to_owned(), 5)].into(),
        };
        let marks = crate::store::StateMarks {
            floor: 4,
            remote: [("dc-b".to_owned(), mark(2, 7))].into(),
            retired: [("dc-c".to_owned(), 8)].into(),
        };
        let committed = Committed::Replaced { changes: Vec::new(), marks: marks.clone() };
        note_marks(&mut l, &CommitNotice { index: 10, own_mark: mark(1, 12), committed });
        assert_eq!((l.own, l.floor), (mark(1, 12), 4));
        assert_eq!((&l.remote, &l.retired), (&marks.remote, &marks.retired));
    }
}
