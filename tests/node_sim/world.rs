//! The simulated world: DCs running real registries over inline committers and in-memory
//! logs, the replication streams between them carried frame by frame, clients, faults,
//! and a virtual clock. Everything random comes from one seeded `StdRng`.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tandem::clock::ManualClock;
use tandem::config::Config;
use tandem::node::purge_once;
use tandem::registry::{Counters, DcFilter, RegisterRequest, Registry, ViewCell};
use tandem::store::{
    CommitLog, CommitNotice, Committer, CommitterHandle, CommitterLimits, InlineCommitter, MemStore,
};
use tandem_client::api::{Health, Status};
use tandem_replicator::log::{ChunkOutcome, EventLog};
use tandem_replicator::protocol::{Receiver, ReceiverAction, Sender, SenderEvent, StreamTuning};
use tandem_schemas::{decode_frame, encode_frame, ChangeEvent, Frame, SNAPSHOT_FRAME_BYTES_MAX};

use super::oracle::{Oracle, Seen};

#[path = "network.rs"]
mod network;

pub const DC_NAMES: [&str; 3] = ["dc-a", "dc-b", "dc-c"];
pub const NS: &str = "default";
pub const SVC: &str = "svc";
/// One step of virtual time.
pub const STEP_MS: u64 = 50;
pub const CHECK_INTERVAL_MS: u64 = 100;
const PURGE_EVERY_MS: u64 = 1_000;
const PURGE_GRACE_MS: u64 = 2_000;
const BACKOFF_MS: u64 = 200;
/// The TTLs clients ask for (the config's default lease is the first).
pub const TTLS_MS: [u64; 2] = [8_000, 4_000];
/// Silence after which an instance is Unhealthy, for a TTL (the registry's proportions).
pub fn unhealthy_after_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 2
}

/// What a seed decides up front.
#[derive(Clone, Debug)]
pub struct Params {
    pub dcs: usize,
    pub ids_per_dc: usize,
    /// Length of the phase with faults and workload.
    pub chaos_ms: u64,
    pub delay_ms: u64,
    pub jitter_ms: u64,
    /// Per-step probabilities.
    pub p_crash: f64,
    pub p_partition: f64,
    pub p_reset: f64,
    pub p_client: f64,
    /// Probability that a committer round runs in a step (else writes pile up).
    pub p_round: f64,
}

impl Params {
    pub fn from_seed(seed: u64) -> Params {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_5eed);
        Params {
            dcs: if rng.gen_bool(0.5) { 2 } else { 3 },
            ids_per_dc: rng.gen_range(1..=3),
            chaos_ms: rng.gen_range(20_000..=40_000),
            delay_ms: rng.gen_range(1..=40),
            jitter_ms: rng.gen_range(0..=30),
            p_crash: [0.0, 0.004, 0.01][rng.gen_range(0..3)],
            p_partition: [0.0, 0.005, 0.02][rng.gen_range(0..3)],
            p_reset: [0.0, 0.01, 0.03][rng.gen_range(0..3)],
            p_client: rng.gen_range(0.02..0.08),
            p_round: rng.gen_range(0.5..1.0),
        }
    }
}

type OpFuture = Pin<Box<dyn Future<Output = OpResult>>>;

/// What a finished operation answered.
#[derive(Clone, Debug)]
pub enum OpResult {
    /// Register: the version (seq) written, or the error code.
    Registered(Result<u64, &'static str>),
    Deregistered(Result<u64, &'static str>),
    Heartbeat(Result<(), &'static str>),
    Background,
}

/// A client operation or a background pass in flight.
pub struct PendingOp {
    pub client: Option<usize>,
    pub started_ms: u64,
    fut: OpFuture,
}

/// One DC's node while it runs.
pub struct Node {
    pub reg: Arc<Registry>,
    pub handle: CommitterHandle<MemStore>,
    pub inline: InlineCommitter<MemStore>,
    pub notices: Arc<Mutex<Vec<CommitNotice>>>,
    pub ops: Vec<PendingOp>,
}

pub struct Dc {
    pub name: &'static str,
    pub node: Option<Node>,
    /// The durable state while the node is down.
    pub stored: Option<MemStore>,
    pub restart_at_ms: u64,
    /// Last time the node (re)started.
    pub started_ms: u64,
}

/// A simulated client: one instance id at one DC.
#[derive(Clone, Debug)]
pub struct Client {
    pub dc: usize,
    pub id: String,
    pub ttl_ms: u64,
    /// The client wants to be registered and heartbeats (unless silent).
    pub alive: bool,
    /// No heartbeat before this time (a pause: GC, network, overload).
    pub silent_until_ms: u64,
    pub next_beat_ms: u64,
    /// A register of this client is in flight (no second automatic one).
    pub registering: bool,
}

/// One connection of a stream (origin -> peer).
struct Conn {
    sender: Sender,
    receiver: Receiver,
    to_peer: VecDeque<(u64, Frame)>,
    to_origin: VecDeque<(u64, Frame)>,
}

pub struct World {
    pub p: Params,
    pub rng: StdRng,
    pub now: u64,
    pub clock: Arc<ManualClock>,
    pub dcs: Vec<Dc>,
    pub clients: Vec<Client>,
    conns: BTreeMap<(usize, usize), Conn>,
    dial_at: BTreeMap<(usize, usize), u64>,
    /// Unordered DC pairs cut until a time.
    cut_until: BTreeMap<(usize, usize), u64>,
    /// Batches of dead connections still to be applied by a lingering receiver (peer,
    /// origin, events): duplicates, and reordered behind newer connections' batches.
    lingering: Vec<(u64, usize, usize, Vec<ChangeEvent>)>,
    pub oracle: Oracle,
    pub trace: bool,
    faults: bool,
}

fn config(dc: &str) -> Arc<Config> {
    let text = format!(
        r#"
dc = "{dc}"
data_dir = "/nonexistent/node-sim"
[health]
heartbeat_interval_ms = 1000
suspect_after_ms = 2000
unhealthy_after_ms = 4000
expire_after_ms = {ttl}
recovery_heartbeats = 2
flap_window_ms = 60000
flap_transitions_max = 64
check_interval_ms = {CHECK_INTERVAL_MS}
[protection]
protect_threshold = 0.0
"#,
        ttl = TTLS_MS[0]
    );
    Arc::new(toml::from_str(&text).expect("sim config"))
}

fn poll_once<T>(fut: &mut Pin<Box<dyn Future<Output = T>>>) -> Poll<T> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    fut.as_mut().poll(&mut cx)
}

impl Node {
    /// Starts a node over its durable state, as `Node::start` does: a restart is one
    /// durable index bump, the view is loaded from the log, the registry recreates leases.
    fn boot(name: &str, mut store: MemStore, clock: Arc<ManualClock>) -> Node {
        store.bump_index();
        let counters = Arc::new(Counters::default());
        let view = ViewCell::new(name, store.index(), counters.clone());
        view.load(store.instances().expect("instances"));
        view.show_own(store.own_mark().seq);
        let notices = Arc::new(Mutex::new(Vec::new()));
        let (cb_view, sink) = (view.clone(), notices.clone());
        let (inline, handle) = Committer::inline(
            store,
            Box::new(move |n: &CommitNotice| {
                cb_view.follow(n);
                sink.lock().push(n.clone());
            }),
            CommitterLimits::default(),
        );
        let reg = Registry::new(config(name), Arc::new(handle.clone()), view, counters, clock);
        Node { reg, handle, inline, notices, ops: Vec::new() }
    }

    /// Runs `fut` to completion, running committer rounds as it needs them.
    fn drive<T: 'static>(&mut self, fut: impl Future<Output = T> + 'static) -> T {
        let mut fut: Pin<Box<dyn Future<Output = T>>> = Box::pin(fut);
        loop {
            if let Poll::Ready(v) = poll_once(&mut fut) {
                return v;
            }
            assert!(self.inline.run_round() > 0, "an operation waits for a committer with nothing queued");
        }
    }

    pub fn log(&self) -> &MemStore {
        self.inline.log()
    }
}

impl World {
    pub fn new(seed: u64) -> World {
        let p = Params::from_seed(seed);
        let mut rng = StdRng::seed_from_u64(seed);
        let clock = Arc::new(ManualClock::new(0, 1_700_000_000_000));
        let dcs = (0..p.dcs)
            .map(|i| {
                let name = DC_NAMES[i];
                // A settled (ordered) epoch: a provisional one would take a new epoch at its
                // first handshake, which this model does not drive (replicator/tests/epochs.rs does).
                let store = MemStore::new(name, rng.gen_range(1 << 20..1 << 40));
                Dc {
                    name,
                    node: Some(Node::boot(name, store, clock.clone())),
                    stored: None,
                    restart_at_ms: 0,
                    started_ms: 0,
                }
            })
            .collect();
        let mut clients = Vec::new();
        for (dc, name) in DC_NAMES.iter().enumerate().take(p.dcs) {
            for i in 0..p.ids_per_dc {
                clients.push(Client {
                    dc,
                    id: format!("{}{}", &name[3..], i),
                    ttl_ms: TTLS_MS[rng.gen_range(0..TTLS_MS.len())],
                    alive: false,
                    silent_until_ms: 0,
                    next_beat_ms: 0,
                    registering: false,
                });
            }
        }
        let oracle = Oracle::new(p.dcs, &clients);
        World {
            p,
            rng,
            now: 0,
            clock,
            dcs,
            clients,
            conns: BTreeMap::new(),
            dial_at: BTreeMap::new(),
            cut_until: BTreeMap::new(),
            lingering: Vec::new(),
            oracle,
            trace: std::env::var("TANDEM_SIM_TRACE").is_ok(),
            faults: true,
        }
    }

    pub fn log_trace(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("[{:>6}] {}", self.now, what());
        }
    }

    /// Runs the whole seed: chaos, then healing and quiescence, then the final checks.
    pub fn run(&mut self) {
        while self.now < self.p.chaos_ms {
            self.step();
        }
        self.faults = false;
        self.heal();
        // Every client still wanted comes back and heartbeats; long enough to recover
        // from Unhealthy and for every silent lease to expire everywhere.
        for c in &mut self.clients {
            c.silent_until_ms = c.silent_until_ms.min(self.now);
        }
        let settle_until = self.now + 2 * TTLS_MS[0] + 2_000;
        while self.now < settle_until {
            self.step();
        }
        self.finish();
    }

    fn heal(&mut self) {
        self.cut_until.clear();
        for dc in 0..self.dcs.len() {
            if self.dcs[dc].node.is_none() {
                self.restart(dc);
            }
        }
    }

    fn step(&mut self) {
        self.now += STEP_MS;
        self.clock.set(self.now);
        if self.faults {
            self.inject_faults();
        }
        for dc in 0..self.dcs.len() {
            if self.dcs[dc].node.is_none() && self.now >= self.dcs[dc].restart_at_ms {
                self.restart(dc);
            }
        }
        if self.faults {
            self.client_actions();
        }
        self.heartbeats();
        if self.now % CHECK_INTERVAL_MS == 0 {
            for dc in 0..self.dcs.len() {
                self.start_background(dc, |reg, _| {
                    Box::pin(async move {
                        reg.check_leases().await;
                        OpResult::Background
                    })
                });
            }
        }
        if self.now % PURGE_EVERY_MS == 0 {
            let wall = self.now + 1_700_000_000_000;
            for dc in 0..self.dcs.len() {
                let peers: Vec<String> =
                    (0..self.dcs.len()).filter(|p| *p != dc).map(|p| DC_NAMES[p].to_owned()).collect();
                self.start_background(dc, move |_, handle| {
                    Box::pin(async move {
                        let _ = purge_once(&handle, &peers, PURGE_GRACE_MS, wall).await;
                        OpResult::Background
                    })
                });
            }
        }
        self.network();
        // Committer rounds: sometimes skipped, so that writes of several steps share one.
        for dc in 0..self.dcs.len() {
            let run = !self.faults || self.rng.gen_bool(self.p.p_round);
            if let Some(node) = self.dcs[dc].node.as_mut() {
                if run {
                    node.inline.run_until_idle();
                }
            }
            self.poll_ops(dc);
        }
        self.observe();
    }

    fn start_background(
        &mut self,
        dc: usize,
        make: impl FnOnce(Arc<Registry>, CommitterHandle<MemStore>) -> OpFuture,
    ) {
        let now = self.now;
        if let Some(node) = self.dcs[dc].node.as_mut() {
            let mut fut = make(node.reg.clone(), node.handle.clone());
            if poll_once(&mut fut).is_pending() {
                node.ops.push(PendingOp { client: None, started_ms: now, fut });
            }
        }
    }

    /// Starts a client operation: its synchronous part runs now (first poll).
    fn start_client_op(&mut self, client: usize, make: impl FnOnce(Arc<Registry>, String, u64) -> OpFuture) {
        let (dc, id, ttl) = {
            let c = &self.clients[client];
            (c.dc, c.id.clone(), c.ttl_ms)
        };
        let now = self.now;
        let Some(node) = self.dcs[dc].node.as_mut() else { return };
        self.oracle.life_sign(client, now);
        let mut fut = make(node.reg.clone(), id, ttl);
        match poll_once(&mut fut) {
            Poll::Ready(r) => self.finished(dc, client, now, r),
            Poll::Pending => node.ops.push(PendingOp { client: Some(client), started_ms: now, fut }),
        }
    }

    pub fn register(&mut self, client: usize) {
        self.clients[client].registering = self.dcs[self.clients[client].dc].node.is_some();
        self.log_trace(|| format!("{} register {}", self.clients[client].dc, self.clients[client].id));
        self.start_client_op(client, |reg, id, ttl| {
            Box::pin(async move {
                let req = RegisterRequest {
                    service: SVC.into(),
                    instance_id: Some(id),
                    address: "10.0.0.1".into(),
                    port: 8080,
                    ttl_ms: Some(ttl),
                    ..Default::default()
                };
                OpResult::Registered(reg.register(req).await.map(|r| r.version).map_err(|e| e.code))
            })
        });
    }

    pub fn deregister(&mut self, client: usize) {
        self.log_trace(|| format!("{} deregister {}", self.clients[client].dc, self.clients[client].id));
        self.start_client_op(client, |reg, id, _| {
            Box::pin(
                async move { OpResult::Deregistered(reg.deregister(NS, SVC, &id).await.map_err(|e| e.code)) },
            )
        });
    }

    fn heartbeat(&mut self, client: usize) {
        self.start_client_op(client, |reg, id, _| {
            Box::pin(
                async move { OpResult::Heartbeat(reg.heartbeat(NS, SVC, &id).await.map_err(|e| e.code)) },
            )
        });
    }

    fn client_actions(&mut self) {
        for c in 0..self.clients.len() {
            if !self.rng.gen_bool(self.p.p_client) {
                continue;
            }
            let ttl = self.clients[c].ttl_ms;
            match self.rng.gen_range(0..100) {
                // Register (or re-register) and start heartbeating.
                0..=29 => {
                    self.clients[c].alive = true;
                    self.register(c);
                }
                // Deregister and stop.
                30..=44 => {
                    self.clients[c].alive = false;
                    self.deregister(c);
                }
                // Id races on one instance: register / deregister / register interleaved.
                45..=64 => {
                    let mut ops: Vec<bool> = vec![true, false];
                    if self.rng.gen_bool(0.5) {
                        ops.push(true);
                    }
                    ops.shuffle(&mut self.rng);
                    self.oracle.counts.races += 1;
                    self.log_trace(|| format!("race on {}: {ops:?}", self.clients[c].id));
                    self.clients[c].alive = *ops.last().unwrap_or(&true);
                    for is_register in ops {
                        if is_register {
                            self.register(c);
                        } else {
                            self.deregister(c);
                        }
                    }
                }
                // A pause: silent past Suspect, maybe past Unhealthy, rarely past expiry.
                65..=89 => {
                    let pause = self.rng.gen_range(ttl / 4..=ttl + ttl / 4);
                    self.clients[c].silent_until_ms = self.now + pause;
                }
                // The client dies without deregistering.
                _ => self.clients[c].alive = false,
            }
        }
    }

    fn heartbeats(&mut self) {
        for c in 0..self.clients.len() {
            let cl = &self.clients[c];
            if !cl.alive || self.now < cl.silent_until_ms || self.now < cl.next_beat_ms {
                continue;
            }
            let every = cl.ttl_ms / 8;
            let next = self.now + every - self.rng.gen_range(0..every / 4);
            self.clients[c].next_beat_ms = next;
            self.heartbeat(c);
        }
    }

    fn poll_ops(&mut self, dc: usize) {
        let Some(node) = self.dcs[dc].node.as_mut() else { return };
        let mut ops = std::mem::take(&mut node.ops);
        ops.shuffle(&mut self.rng);
        let mut left = Vec::new();
        let mut done = Vec::new();
        for mut op in ops {
            match poll_once(&mut op.fut) {
                Poll::Ready(r) => done.push((op.client, op.started_ms, r)),
                Poll::Pending => left.push(op),
            }
        }
        if let Some(node) = self.dcs[dc].node.as_mut() {
            node.ops = left;
        }
        for (client, started, r) in done {
            if let Some(c) = client {
                self.finished(dc, c, started, r);
            }
        }
    }

    fn finished(&mut self, dc: usize, client: usize, started_ms: u64, r: OpResult) {
        let now = self.now;
        self.log_trace(|| format!("{dc} {} done: {r:?}", self.clients[client].id));
        match &r {
            OpResult::Registered(_) => self.clients[client].registering = false,
            // The SDK's answer to an unknown instance: register again.
            OpResult::Heartbeat(Err("not_found"))
                if self.clients[client].alive && !self.clients[client].registering =>
            {
                self.register(client);
            }
            _ => {}
        }
        self.oracle.op_finished(client, started_ms, now, &r);
    }

    fn inject_faults(&mut self) {
        let n = self.dcs.len();
        if self.rng.gen_bool(self.p.p_crash) {
            let dc = self.rng.gen_range(0..n);
            let down = self.rng.gen_range(0..=TTLS_MS[0]);
            self.crash(dc, down);
        }
        if self.rng.gen_bool(self.p.p_partition) {
            let a = self.rng.gen_range(0..n);
            let b = (a + self.rng.gen_range(1..n)) % n;
            let until = self.now + self.rng.gen_range(500..=15_000);
            self.log_trace(|| format!("partition {a}-{b} until {until}"));
            self.cut_until.insert((a.min(b), a.max(b)), until);
            self.oracle.counts.partitions += 1;
            self.drop_conn(a, b);
            self.drop_conn(b, a);
        }
        if self.rng.gen_bool(self.p.p_reset) && n > 1 {
            let a = self.rng.gen_range(0..n);
            let b = (a + self.rng.gen_range(1..n)) % n;
            self.drop_conn(a, b);
        }
    }

    fn crash(&mut self, dc: usize, down_ms: u64) {
        let Some(node) = self.dcs[dc].node.take() else { return };
        self.log_trace(|| format!("{dc} crashes for {down_ms} ms"));
        self.oracle.counts.crashes += 1;
        let Node { inline, ops, .. } = node;
        // The durable state survives; requests not yet served are lost (never acked).
        let store = inline.into_log();
        let mut ops = ops;
        for op in &mut ops {
            if let (Poll::Ready(r), Some(c)) = (poll_once(&mut op.fut), op.client) {
                self.clients[c].registering = false;
                self.oracle.op_finished(c, op.started_ms, self.now, &r);
            }
        }
        for c in &mut self.clients {
            if c.dc == dc {
                c.registering = false;
            }
        }
        self.dcs[dc].stored = Some(store);
        self.dcs[dc].restart_at_ms = self.now + down_ms;
        for p in 0..self.dcs.len() {
            self.drop_conn(dc, p);
            self.drop_conn(p, dc);
        }
    }

    fn restart(&mut self, dc: usize) {
        let Some(store) = self.dcs[dc].stored.take() else { return };
        self.log_trace(|| format!("{dc} restarts"));
        self.dcs[dc].node = Some(Node::boot(self.dcs[dc].name, store, self.clock.clone()));
        self.dcs[dc].started_ms = self.now;
        self.oracle.restarted(dc, self.now);
    }

    /// Replication has caught up everywhere: every DC holds every origin's own mark.
    pub fn replicated(&self) -> bool {
        (0..self.dcs.len()).all(|o| {
            let Some(own) = self.dcs[o].node.as_ref().map(|n| n.log().own_mark()) else { return false };
            (0..self.dcs.len()).filter(|p| *p != o).all(|p| {
                let held = self.dcs[p].node.as_ref().map(|n| n.log().mark_of(DC_NAMES[o]));
                // An origin that never wrote has nothing to ship.
                held == Some(Some(own)) || (held == Some(None) && own.seq == 0)
            })
        })
    }

    /// What each DC's registry shows now: (dc, instance id) -> seen.
    pub fn views(&self) -> Vec<Option<BTreeMap<(String, String), Seen>>> {
        self.dcs
            .iter()
            .map(|d| {
                let node = d.node.as_ref()?;
                let answer = node.reg.discover(NS, SVC, &DcFilter::All, false).ok()?;
                Some(
                    answer
                        .instances
                        .iter()
                        .map(|i| {
                            (
                                (i.owner_dc.to_string(), i.instance_id.to_string()),
                                Seen {
                                    seq: i.seq,
                                    served: matches!(i.health, Health::Healthy | Health::Suspect)
                                        && i.status == Status::Up,
                                    health: i.health.as_str(),
                                    damped: i.damped,
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    }

    fn observe(&mut self) {
        let views = self.views();
        let mut notices: Vec<Vec<CommitNotice>> = Vec::new();
        for d in &self.dcs {
            notices.push(d.node.as_ref().map(|n| std::mem::take(&mut *n.notices.lock())).unwrap_or_default());
        }
        let quiet: Vec<bool> =
            self.dcs.iter().map(|d| d.node.as_ref().is_some_and(|n| n.ops.is_empty())).collect();
        let mut invariant = Vec::new();
        for (i, d) in self.dcs.iter().enumerate() {
            if let (Some(node), true) = (d.node.as_ref(), quiet[i]) {
                invariant.push((i, node.reg.check_lease_invariant()));
            }
        }
        let logs: Vec<Option<&MemStore>> =
            self.dcs.iter().map(|d| d.node.as_ref().map(|n| n.log())).collect();
        let started: Vec<u64> = self.dcs.iter().map(|d| d.started_ms).collect();
        self.oracle.observe(self.now, &self.clients, &started, &notices, &logs, &views, &invariant, &quiet);
    }

    fn finish(&mut self) {
        // Quiescence: all writes served, replication caught up.
        let mut guard = 0;
        while !self.replicated() && guard < 400 {
            self.step();
            guard += 1;
        }
        let replicated = self.replicated();
        let views = self.views();
        let logs: Vec<&MemStore> = self.dcs.iter().map(|d| d.node.as_ref().expect("up").log()).collect();
        let started: Vec<u64> = self.dcs.iter().map(|d| d.started_ms).collect();
        self.oracle.finish(self.now, replicated, &self.clients, &started, &logs, &views);
    }
}
