//! Deterministic simulation of two- and three-DC worlds running the real replication
//! protocol ([`Sender`] / [`Receiver`]) over the reference event log ([`MemLog`]).
//!
//! # The model
//!
//! - **Time** is virtual (`u64` ms). Everything that happens is an event in one priority
//!   queue ordered by (time, insertion number); every random choice comes from one
//!   `StdRng` seeded with the run's seed. A seed therefore replays exactly.
//! - **A DC** is a [`MemLog`] (its durable state: own log, replicas, tombstones, marks) with
//!   a random epoch, a workload that appends REGISTER / UPDATE / DEREGISTER events of its own
//!   instances at random times (over five instance ids, so keys are reused a lot), and the
//!   record of which own seq each peer acknowledged (durable, like the RocksDB log's).
//!   Every tick it polls its senders (pings) and runs the purge: own log entries and
//!   tombstones at or below the floor the peers acknowledged and older than a grace period.
//!   Some seeds purge aggressively: peers silent for a while are left out of the floor, as
//!   a retention limit would do; they then fall below the floor and need a snapshot. This
//!   goes beyond the product's purge rule on purpose: safety must not depend on the purge
//!   policy.
//! - **A stream** exists for every ordered pair (origin, peer): a [`Sender`] at the origin
//!   and a [`Receiver`] at the peer. Frames cross a simulated QUIC stream, which is reliable
//!   and ordered: each frame is encoded and decoded with the real wire codec, delayed by the
//!   link's delay plus jitter (plus a retransmission timeout when the link "loses" it:
//!   loss inside QUIC shows up as delay, never as a gap or a duplicate) and delivered in
//!   order. Faults are therefore connection faults: a connection dies and the origin redials
//!   after a jittered exponential backoff with a fresh `Sender::new` / `Receiver::new`
//!   handshake; a new connection's frames are not ordered with a dead one's. Usually both
//!   ends drop their state machines and frames in flight vanish. When only the origin's
//!   side died (its crash, half the resets) the connection is half open: the peer's
//!   receiver lingers and still applies what was in flight (its acks go nowhere), next to
//!   the origin's new connection, as the gateway's concurrent receive sessions would. This
//!   is where the at-least-once redelivery produces duplicates.
//! - **Faults** (safety phase only): partitions between two DCs (some seeds get a long
//!   one), connection resets, slow links, crashes (the DC stops; its log keeps everything
//!   acknowledged; all its streams die) and data-loss crashes (the log is wiped and the DC
//!   restarts with a new epoch; the peers must converge to it through a snapshot, so its old
//!   instances vanish everywhere). A quarter of the seeds are storms: up to 30 faults, and
//!   restarts after as little as a millisecond, while frames of the dead incarnation are
//!   still in flight.
//! - **Phases**: a safety phase with faults and workload, then a liveness phase without
//!   either, in which every DC must converge within a budget of virtual time.
//!
//! # What is checked
//!
//! After every change to a DC's log:
//! - *prefix consistency*: what DC d holds of origin X (X = d included) is exactly X's
//!   history at d's mark of X, in the epoch of that mark (tombstones may be missing only at
//!   or below a purge floor X reached in that epoch). This implies ownership: no key of X
//!   changes but through X's events, and nothing of an unknown origin or epoch is held;
//! - *no resurrection*: an observer per DC remembers, per key, the highest DEREGISTER it
//!   has consumed; the key never becomes live again with that seq or a lower one (the
//!   memory resets only when that origin's epoch changes at d, or d itself loses its data);
//! - *marks* never go backwards, except to a later epoch of that origin;
//! - *no protocol errors*: no `StreamError` ever happens on a live connection, since
//!   nothing in this model is a legitimate reason for one (a stream death is a connection
//!   fault, not an error), except the refusal that ends a stream whose cursor a lingering
//!   receiver moved; a lingering receiver may only refuse a stale frame (a snapshot behind
//!   its mark, a frame of a replaced epoch);
//! - every applied batch and installed snapshot touches only its channel's origin's keys.
//!
//! After the liveness phase: every DC's mark of X equals X's own mark, every DC holds
//! exactly X's live instances (records and seqs) and at least X's current tombstones.
//!
//! # Running
//!
//! `cargo test -p tandem-replicator --test sim` runs `DEFAULT_SEEDS` seeds (0, 1, ...) and
//! the pinned `regression_seeds`. `TANDEM_SIM_SEEDS=2000` (or `=5000..6000`) runs other
//! seeds; `TANDEM_SIM_SEED=1234` replays one, and `TANDEM_SIM_TRACE=1` with it prints every
//! step; `TANDEM_SIM_STATS=1` prints what each seed did. A failing seed prints its replay
//! command and becomes an entry of `regression_seeds`.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_replicator::log::conformance::{ev, key, record};
use tandem_replicator::log::{
    ApplyReport, ChunkOutcome, EventLog, LogError, MemLog, SharedReader, StateChange,
};
use tandem_replicator::merge::{Held, Refusal};
use tandem_replicator::protocol::{Receiver, ReceiverAction, Sender, SenderEvent, StreamError, StreamTuning};
use tandem_replicator::purge;
use tandem_schemas::{
    decode_frame, encode_frame, ChangeEvent, DeregisterReason, Frame, InstanceRecord, Mark, Op, RefuseCode,
    FRAME_BYTES_MAX, FRAME_HEADROOM_BYTES, SNAPSHOT_FRAME_BYTES_MAX,
};

const DC_NAMES: [&str; 3] = ["dc-a", "dc-b", "dc-c"];
const IDS: [&str; 5] = ["i0", "i1", "i2", "i3", "i4"];
/// Seeds run by the default test.
const DEFAULT_SEEDS: u64 = 256;
const TICK_MS: u64 = 100;
const PURGE_EVERY_TICKS: u64 = 5;
const BACKOFF_INITIAL_MS: u64 = 20;
const BACKOFF_MAX_MS: u64 = 1_000;
/// Virtual time the world gets to converge once faults stop, on top of the time the
/// backlog needs at the stream's throughput (see [`World::liveness_budget_ms`]).
const LIVENESS_SLACK_MS: u64 = 10_000;
/// Most frames one poll round may emit (the gateway's bound too).
const POLL_FRAMES_MAX: usize = 64;

/// Which own seqs a DC may purge.
#[derive(Clone, Copy, Debug)]
enum PurgePolicy {
    /// The product rule: every peer acknowledged them.
    AllPeersAcked,
    /// Stress: peers silent for `silent_ms` are left out of the floor.
    DropSilentPeers { silent_ms: u64 },
}

/// One direction of the network between two DCs.
#[derive(Clone, Copy, Debug)]
struct Link {
    delay_ms: u64,
    jitter_ms: u64,
    /// Probability that a frame needs a retransmission (QUIC hides the loss as delay).
    loss: f64,
    rto_ms: u64,
}

/// Everything a seed decides up front.
#[derive(Clone, Debug)]
struct Params {
    dcs: usize,
    safety_ms: u64,
    tuning: StreamTuning,
    purge: PurgePolicy,
    grace_ms: u64,
    append_gap_ms_max: u64,
    links: Vec<Vec<Link>>,
    /// A fault storm: many more faults, and DCs that come back from data loss at once,
    /// while frames of their dead incarnation are still in flight.
    storm: bool,
    /// Receivers take snapshots in chunks (else in one frame, as a schema-1 peer).
    chunked: bool,
}

impl Params {
    fn draw(rng: &mut StdRng) -> Params {
        let dcs = if rng.gen_bool(0.5) { 2 } else { 3 };
        let links = (0..dcs)
            .map(|_| {
                (0..dcs)
                    .map(|_| Link {
                        delay_ms: rng.gen_range(1..=80),
                        jitter_ms: rng.gen_range(0..=30),
                        loss: if rng.gen_bool(0.5) { rng.gen_range(0.0..0.15) } else { 0.0 },
                        rto_ms: rng.gen_range(50..=300),
                    })
                    .collect()
            })
            .collect();
        Params {
            dcs,
            safety_ms: rng.gen_range(6_000..=12_000),
            tuning: StreamTuning {
                batch_events_max: rng.gen_range(1..=8),
                window_batches_max: rng.gen_range(1..=4),
                ping_interval_ms: rng.gen_range(100..=1_000),
                ..StreamTuning::default()
            },
            purge: if rng.gen_bool(0.4) {
                PurgePolicy::DropSilentPeers { silent_ms: rng.gen_range(500..=3_000) }
            } else {
                PurgePolicy::AllPeersAcked
            },
            grace_ms: rng.gen_range(0..=1_000),
            append_gap_ms_max: rng.gen_range(100..=400),
            links,
            storm: rng.gen_bool(0.25),
            chunked: true,
        }
    }

    /// Decided by the seed without drawing from the run's generator, so that adding these
    /// knobs kept every seed's other draws: three seeds in four stream snapshots in chunks,
    /// under a frame limit of a few records (so a snapshot takes several chunks and batches
    /// are cut by bytes); the fourth runs the single-frame path of a schema-1 peer.
    fn set_framing(&mut self, seed: u64) {
        self.chunked = seed % 4 != 3;
        self.tuning.frame_bytes_max = FRAME_HEADROOM_BYTES + 120 * (1 + (seed / 4) % 4) as usize;
    }
}

/// How a run frames snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// As [`Params::set_framing`] decides from the seed.
    BySeed,
    /// Snapshots in one frame and the full frame limit: the framing the seeds pinned in
    /// `regression_seeds` were found with (before snapshots went in chunks).
    SingleFrame,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Origin to peer: Hello, batches, snapshots, pings.
    ToPeer,
    /// Peer to origin: HelloAck, acks.
    ToOrigin,
}

#[derive(Debug)]
enum Ev {
    Deliver { stream: usize, gen: u64, dir: Dir, bytes: Vec<u8> },
    Connect { stream: usize, gen: u64 },
    Append { dc: usize },
    Tick { dc: usize },
    Partition { a: usize, b: usize, until_ms: u64 },
    Reset { stream: usize },
    SlowLink { from: usize, to: usize, extra_ms: u64, until_ms: u64 },
    Crash { dc: usize, down_ms: u64, data_loss: bool },
    Restart { dc: usize, incarnation: u64 },
    EndSafety,
}

struct Dc {
    name: &'static str,
    log: MemLog,
    /// `Some(data_loss)` while crashed.
    down: Option<bool>,
    /// Bumped by every crash and restart, so that stale restart timers do nothing.
    incarnation: u64,
    /// Durable: the own mark each peer acknowledged.
    acks: BTreeMap<usize, Mark>,
    /// When each peer last acknowledged (for the aggressive purge policy).
    last_ack_ms: BTreeMap<usize, u64>,
    started_ms: u64,
}

/// Why a receiver could not go on.
enum Fail {
    /// The merge rules refused a batch or snapshot (nothing of it was applied).
    Refused(Refusal),
    /// The receiver state machine refused a frame.
    Stream(StreamError),
    /// A storage error.
    Other(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Refused(r) => write!(f, "refused: {r}"),
            Fail::Stream(e) => write!(f, "{e}"),
            Fail::Other(e) => write!(f, "storage: {e}"),
        }
    }
}

impl Fail {
    /// A refusal that is right when another session moved the receiver's mark of the
    /// origin since this one's handshake: the stream ends and resumes from the new mark.
    fn is_stale_cursor(&self) -> bool {
        match self {
            Fail::Refused(
                Refusal::Gap { .. }
                | Refusal::EpochMismatch { .. }
                | Refusal::CursorRegressed { .. }
                | Refusal::EpochRegressed { .. },
            ) => true,
            Fail::Stream(e) => {
                matches!(e.code, RefuseCode::Gap | RefuseCode::CursorRegressed | RefuseCode::Fenced)
            }
            Fail::Refused(
                Refusal::WrongChannel { .. } | Refusal::NotOwner { .. } | Refusal::Retired { .. },
            )
            | Fail::Other(_) => false,
        }
    }
}

struct Conn {
    sender: Sender,
    receiver: Receiver,
}

struct Stream {
    origin: usize,
    peer: usize,
    /// Bumped whenever the connection changes: frames and timers of another generation
    /// belong to a dead connection and are dropped.
    gen: u64,
    conn: Option<Conn>,
    failures: u32,
    /// Delivery time of the last frame per direction: the stream is FIFO.
    last_arrival_ms: [u64; 2],
    acked_seq: u64,
    /// Frames the origin sent on the current connection.
    frames_sent: u64,
    /// Receivers of dead connections whose origin side died first: the peer's side has not
    /// noticed yet and still applies what was in flight (by connection generation).
    lingering: Vec<(u64, Receiver)>,
    /// A lingering receiver changed the peer's mark of the origin while the current
    /// connection was up: its cursor may be stale.
    interfered: bool,
    /// The snapshot reader the origin keeps across this stream's connections (the
    /// gateway's per-peer cache), for resumes.
    reader: Option<SharedReader>,
    /// What the peer had staged of the origin when the current connection opened.
    staged_at_connect: Option<tandem_schemas::StagedSnapshot>,
}

/// One epoch of one origin's history, as the oracle remembers it (never purged).
struct EpochHistory {
    epoch: u64,
    events: Vec<ChangeEvent>,
    /// Per instance id: the seqs of its events, ascending.
    seqs: BTreeMap<&'static str, Vec<u64>>,
    /// The highest purge floor the origin reached in this epoch.
    floor_max: u64,
}

impl EpochHistory {
    fn new(epoch: u64) -> Self {
        EpochHistory { epoch, events: Vec::new(), seqs: BTreeMap::new(), floor_max: 0 }
    }

    /// The last event of `id` at or below `seq`.
    fn at(&self, id: &str, seq: u64) -> Option<&ChangeEvent> {
        let seqs = self.seqs.get(id)?;
        let n = seqs.partition_point(|s| *s <= seq);
        (n > 0).then(|| &self.events[seqs[n - 1] as usize - 1])
    }

    /// The seq of the last DEREGISTER of `id` at or below `seq`.
    fn last_dereg(&self, id: &str, seq: u64) -> Option<u64> {
        let seqs = self.seqs.get(id)?;
        let n = seqs.partition_point(|s| *s <= seq);
        seqs[..n]
            .iter()
            .rev()
            .copied()
            .find(|s| matches!(self.events[*s as usize - 1].op, Op::Deregister { .. }))
    }
}

/// What one DC has observed of one origin, for the monotonicity and resurrection checks.
#[derive(Default)]
struct Observer {
    mark: Option<Mark>,
    /// Per id: (epoch, seq) of the highest DEREGISTER consumed.
    dead: BTreeMap<&'static str, (u64, u64)>,
}

/// What a run did, to show that the interesting paths were taken.
#[derive(Clone, Debug, Default)]
struct Stats {
    dcs: u64,
    events_appended: u64,
    frames: u64,
    stream_deaths: u64,
    connects: u64,
    snapshots_sent: u64,
    /// Snapshots a sender sent mid-stream, because its log was purged under its cursor.
    snapshots_mid_stream: u64,
    /// Snapshots installed at a receiver that held another epoch of the origin.
    snapshots_new_epoch: u64,
    /// Snapshots installed at a receiver below the origin's purge floor (same epoch or none).
    snapshots_behind_floor: u64,
    purges: u64,
    tombstone_purges: u64,
    crashes: u64,
    data_losses: u64,
    /// Events a receiver dropped as already applied (the at-least-once redelivery).
    duplicates: u64,
    /// Frames a lingering receiver handled after its connection died at the origin.
    lingering_frames: u64,
    /// Stale frames a lingering receiver refused (a regressing snapshot, an old epoch).
    lingering_refusals: u64,
    /// Live connections that ended because a lingering receiver moved the mark under them.
    interference_refusals: u64,
    partitions: u64,
    /// Snapshot chunks staged at receivers (the last chunk of each snapshot included).
    snapshot_chunks: u64,
    /// Snapshots installed from chunks whose staging spanned more than one connection.
    snapshots_resumed: u64,
    converged_after_ms: u64,
}

struct World {
    p: Params,
    rng: StdRng,
    now: u64,
    next_id: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    dcs: Vec<Dc>,
    streams: Vec<Stream>,
    cut_until: BTreeMap<(usize, usize), u64>,
    slow: BTreeMap<(usize, usize), (u64, u64)>,
    /// Per DC: every epoch it ever had, in order.
    oracle: Vec<Vec<EpochHistory>>,
    /// Per (observing DC, origin).
    obs: BTreeMap<(usize, usize), Observer>,
    stats: Stats,
    safety: bool,
    trace: bool,
    /// Protocol errors seen; any fails the run.
    errors: Vec<String>,
}

fn record_at(owner: &str, id: &str, epoch: u64, seq: u64) -> InstanceRecord {
    let mut r = record(owner, id);
    r.port = 1_000 + (seq % 60_000) as u16;
    r.metadata.insert("written-at".into(), format!("{epoch}:{seq}"));
    r
}

impl World {
    fn with_framing(seed: u64, trace: bool, framing: Framing) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut p = Params::draw(&mut rng);
        match framing {
            Framing::BySeed => p.set_framing(seed),
            Framing::SingleFrame => p.tuning.frame_bytes_max = FRAME_BYTES_MAX,
        }
        if matches!(framing, Framing::SingleFrame) {
            p.chunked = false;
        }
        let mut oracle = Vec::new();
        let mut dcs = Vec::new();
        for name in &DC_NAMES[..p.dcs] {
            // Settled epochs (generation >= 1): a provisional one is a new data dir that takes
            // its first ordered epoch at its first handshake (tests/epochs.rs).
            let epoch = rng.gen_range(1 << 20..=u64::from(u32::MAX));
            oracle.push(vec![EpochHistory::new(epoch)]);
            dcs.push(Dc {
                name,
                log: MemLog::new(name, epoch),
                down: None,
                incarnation: 0,
                acks: BTreeMap::new(),
                last_ack_ms: BTreeMap::new(),
                started_ms: 0,
            });
        }
        let mut streams = Vec::new();
        for origin in 0..p.dcs {
            for peer in 0..p.dcs {
                if origin != peer {
                    streams.push(Stream {
                        origin,
                        peer,
                        gen: 0,
                        conn: None,
                        failures: 0,
                        last_arrival_ms: [0; 2],
                        acked_seq: 0,
                        frames_sent: 0,
                        lingering: Vec::new(),
                        interfered: false,
                        reader: None,
                        staged_at_connect: None,
                    });
                }
            }
        }
        let mut w = World {
            p,
            rng,
            now: 0,
            next_id: 0,
            queue: BTreeMap::new(),
            dcs,
            streams,
            cut_until: BTreeMap::new(),
            slow: BTreeMap::new(),
            oracle,
            obs: BTreeMap::new(),
            stats: Stats::default(),
            safety: true,
            trace,
            errors: Vec::new(),
        };
        w.stats.dcs = w.p.dcs as u64;
        w.plan();
        w
    }

    /// Schedules the first timers and the faults of the safety phase.
    fn plan(&mut self) {
        let n = self.p.dcs;
        let safety = self.p.safety_ms;
        for dc in 0..n {
            let t = self.rng.gen_range(0..TICK_MS);
            self.at(t, Ev::Tick { dc });
            let t = self.rng.gen_range(0..self.p.append_gap_ms_max);
            self.at(t, Ev::Append { dc });
        }
        for stream in 0..self.streams.len() {
            let t = self.rng.gen_range(0..50);
            self.at(t, Ev::Connect { stream, gen: 0 });
        }
        let (faults, restart_ms_min) =
            if self.p.storm { (self.rng.gen_range(10..=30), 1) } else { (self.rng.gen_range(0..=8), 50) };
        for _ in 0..faults {
            let t = self.rng.gen_range(0..safety);
            let (a, b) = self.pair();
            let fault = match self.rng.gen_range(0..100) {
                0..=29 => Ev::Partition { a, b, until_ms: t + self.rng.gen_range(50..=2_000) },
                30..=54 => Ev::Reset { stream: self.rng.gen_range(0..self.streams.len()) },
                55..=64 => Ev::SlowLink {
                    from: a,
                    to: b,
                    extra_ms: self.rng.gen_range(100..=3_000),
                    until_ms: t + 3_000,
                },
                65..=84 => {
                    Ev::Crash { dc: a, down_ms: self.rng.gen_range(restart_ms_min..=3_000), data_loss: false }
                }
                _ => {
                    Ev::Crash { dc: a, down_ms: self.rng.gen_range(restart_ms_min..=2_000), data_loss: true }
                }
            };
            self.at(t, fault);
        }
        if self.rng.gen_bool(0.3) {
            // A long partition: long enough for the aggressive purge to leave a peer behind.
            let (a, b) = self.pair();
            let t = self.rng.gen_range(0..safety / 3);
            let until_ms = t + self.rng.gen_range(safety / 3..=safety);
            self.at(t, Ev::Partition { a, b, until_ms });
        }
        self.at(safety, Ev::EndSafety);
    }

    fn pair(&mut self) -> (usize, usize) {
        let a = self.rng.gen_range(0..self.p.dcs);
        let b = (a + self.rng.gen_range(1..self.p.dcs)) % self.p.dcs;
        (a, b)
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.next_id += 1;
        self.queue.insert((t, self.next_id), ev);
    }

    fn trace(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("{:>7} {}", self.now, what());
        }
    }

    /// Runs the seed to the end; panics on any violated invariant.
    fn run(mut self) -> Stats {
        let mut budget_ms = u64::MAX;
        while let Some(((t, _), ev)) = self.queue.pop_first() {
            self.now = t;
            let converge_check = !self.safety && matches!(ev, Ev::Tick { dc: 0 });
            let end_safety = matches!(ev, Ev::EndSafety);
            self.handle(ev);
            if end_safety {
                budget_ms = self.liveness_budget_ms();
            }
            if let Some(e) = self.errors.first() {
                panic!("protocol error {e}");
            }
            if converge_check {
                match self.converged() {
                    Ok(()) => {
                        self.stats.converged_after_ms = self.now - self.p.safety_ms;
                        return self.stats;
                    }
                    Err(why) if self.now >= self.p.safety_ms + budget_ms => {
                        panic!("not converged {budget_ms} ms after the faults stopped: {why}")
                    }
                    Err(_) => {}
                }
            }
        }
        unreachable!("the ticks never stop")
    }

    /// How long convergence may take once the faults stop: the slack plus three times what
    /// the largest backlog needs at one window of batches per worst-case round trip.
    fn liveness_budget_ms(&self) -> u64 {
        let mut backlog = 0;
        for x in 0..self.p.dcs {
            let own = self.dcs[x].log.own_mark();
            for d in (0..self.p.dcs).filter(|d| *d != x) {
                let held = self.dcs[d].log.mark_of(self.dcs[x].name).filter(|m| m.epoch == own.epoch);
                backlog = backlog.max(own.seq - held.map_or(0, |m| m.seq.min(own.seq)));
            }
        }
        // Batches are cut by bytes too: a sim event encodes to under 300 bytes.
        let batch = self.p.tuning.batch_events_max.min((self.p.tuning.entry_bytes_max() / 300).max(1));
        let per_round = (batch * self.p.tuning.window_batches_max) as u64;
        let links = self.p.links.iter().flatten();
        let rtt_ms = 2 * links.clone().map(|l| l.delay_ms + l.jitter_ms).max().unwrap_or(0)
            + 2 * links.map(|l| if l.loss > 0.0 { l.rto_ms } else { 0 }).max().unwrap_or(0);
        LIVENESS_SLACK_MS + 3 * backlog.div_ceil(per_round) * rtt_ms
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { stream, gen, dir, bytes } => self.deliver(stream, gen, dir, &bytes),
            Ev::Connect { stream, gen } => self.connect(stream, gen),
            Ev::Append { dc } => self.append(dc),
            Ev::Tick { dc } => self.tick(dc),
            Ev::Partition { a, b, until_ms } => {
                self.trace(|| format!("partition {a}-{b} until {until_ms}"));
                self.stats.partitions += 1;
                let k = (a.min(b), a.max(b));
                let until = self.cut_until.get(&k).copied().unwrap_or(0).max(until_ms);
                self.cut_until.insert(k, until);
                for s in 0..self.streams.len() {
                    let st = &self.streams[s];
                    if (st.origin == a && st.peer == b) || (st.origin == b && st.peer == a) {
                        self.kill(s, "partition", false);
                    }
                }
            }
            Ev::Reset { stream } => {
                if self.streams[stream].conn.is_some() {
                    // Half the resets are seen by the origin only: the peer's side keeps
                    // draining what is in flight.
                    let half_open = self.rng.gen_bool(0.5);
                    self.kill(stream, "connection reset", half_open);
                }
            }
            Ev::SlowLink { from, to, extra_ms, until_ms } => {
                self.slow.insert((from, to), (extra_ms, until_ms));
            }
            Ev::Crash { dc, down_ms, data_loss } => self.crash(dc, down_ms, data_loss),
            Ev::Restart { dc, incarnation } => {
                if self.dcs[dc].incarnation == incarnation && self.dcs[dc].down.is_some() {
                    self.restart(dc);
                }
            }
            Ev::EndSafety => {
                self.trace(|| "faults stop".into());
                self.safety = false;
                self.cut_until.clear();
                self.slow.clear();
                for dc in 0..self.p.dcs {
                    if self.dcs[dc].down.is_some() {
                        self.restart(dc);
                    }
                }
            }
        }
    }

    // ---- the network ----

    fn reachable(&self, a: usize, b: usize) -> bool {
        let cut = self.cut_until.get(&(a.min(b), a.max(b))).is_some_and(|until| self.now < *until);
        !cut && self.dcs[a].down.is_none() && self.dcs[b].down.is_none()
    }

    fn send(&mut self, stream: usize, dir: Dir, frame: &Frame) {
        let st = &self.streams[stream];
        let (from, to) = match dir {
            Dir::ToPeer => (st.origin, st.peer),
            Dir::ToOrigin => (st.peer, st.origin),
        };
        let link = self.p.links[from][to];
        let mut delay = link.delay_ms + self.rng.gen_range(0..=link.jitter_ms);
        while self.rng.gen_bool(link.loss) {
            delay += link.rto_ms;
        }
        if let Some((extra, until)) = self.slow.get(&(from, to)) {
            if self.now < *until {
                delay += extra;
            }
        }
        if dir == Dir::ToPeer {
            self.streams[stream].frames_sent += 1;
        }
        let bytes = encode_frame(frame);
        // The frame limit holds for every frame but a single-frame snapshot (the schema-1
        // path, which has its own limit).
        if !matches!(frame, Frame::Snapshot { .. }) {
            assert!(
                bytes.len() <= self.p.tuning.frame_bytes_max,
                "a frame of {} bytes exceeds the limit of {}: {}",
                bytes.len(),
                self.p.tuning.frame_bytes_max,
                describe(frame)
            );
        }
        let lane = dir as usize;
        let arrival = (self.now + delay).max(self.streams[stream].last_arrival_ms[lane]);
        self.streams[stream].last_arrival_ms[lane] = arrival;
        let gen = self.streams[stream].gen;
        self.stats.frames += 1;
        self.at(arrival, Ev::Deliver { stream, gen, dir, bytes });
    }

    /// The connection dies and the origin redials after a backoff (once it is up). The
    /// origin's side is gone at once; the peer's side is too, unless `half_open`: then it
    /// lingers and applies the frames still in flight (their acks go nowhere).
    fn kill(&mut self, stream: usize, why: &str, half_open: bool) {
        let st = &mut self.streams[stream];
        if let Some(conn) = st.conn.take() {
            self.stats.stream_deaths += 1;
            if half_open {
                st.lingering.push((st.gen, conn.receiver));
            }
        }
        st.gen += 1;
        st.failures += 1;
        let (origin, peer, gen) = (st.origin, st.peer, st.gen);
        self.trace(|| format!("stream {origin}->{peer} dies: {why}"));
        if self.dcs[origin].down.is_none() {
            let t = self.now + self.backoff(stream);
            self.at(t, Ev::Connect { stream, gen });
        }
    }

    fn backoff(&mut self, stream: usize) -> u64 {
        let f = self.streams[stream].failures.min(10);
        let b = (BACKOFF_INITIAL_MS << f).min(BACKOFF_MAX_MS);
        b / 2 + self.rng.gen_range(0..=b / 2)
    }

    fn connect(&mut self, stream: usize, gen: u64) {
        let st = &self.streams[stream];
        let (origin, peer) = (st.origin, st.peer);
        if st.gen != gen || st.conn.is_some() || self.dcs[origin].down.is_some() {
            return;
        }
        if !self.reachable(origin, peer) {
            self.streams[stream].failures += 1;
            let t = self.now + self.backoff(stream);
            self.at(t, Ev::Connect { stream, gen });
            return;
        }
        self.stats.connects += 1;
        let (mut sender, hello) =
            Sender::new(&self.dcs[origin].log, self.dcs[peer].name, self.p.tuning.clone(), self.now);
        sender.offer_reader(self.streams[stream].reader.take());
        let (pname, oname) = (self.dcs[peer].name, self.dcs[origin].name);
        self.streams[stream].staged_at_connect = self.dcs[peer].log.staged_snapshot(oname).unwrap();
        let receiver = if self.p.chunked {
            Receiver::chunked(pname, oname, self.dcs[peer].log.staged_snapshot(oname).unwrap())
        } else {
            Receiver::new(pname, oname)
        };
        let st = &mut self.streams[stream];
        st.gen += 1;
        st.acked_seq = 0;
        st.frames_sent = 0;
        // A new connection: its frames are not ordered with those of dead ones.
        st.last_arrival_ms = [0; 2];
        st.interfered = false;
        st.conn = Some(Conn { sender, receiver });
        self.trace(|| format!("stream {origin}->{peer} connects"));
        self.send(stream, Dir::ToPeer, &hello);
    }

    fn deliver(&mut self, stream: usize, gen: u64, dir: Dir, bytes: &[u8]) {
        if self.streams[stream].gen != gen {
            if dir == Dir::ToPeer {
                self.deliver_lingering(stream, gen, bytes);
            }
            return;
        }
        let Some(mut conn) = self.streams[stream].conn.take() else { return };
        let res = match dir {
            Dir::ToPeer => {
                let frame =
                    decode_frame(bytes, SNAPSHOT_FRAME_BYTES_MAX).expect("the codec round-trips our frames");
                self.at_receiver(stream, &mut conn.receiver, frame, true)
            }
            Dir::ToOrigin => {
                let frame = decode_frame(bytes, FRAME_BYTES_MAX).expect("the codec round-trips our frames");
                self.at_sender(stream, &mut conn, frame).map_err(Fail::Stream)
            }
        };
        match res {
            Ok(()) => {
                self.streams[stream].conn = Some(conn);
                if dir == Dir::ToOrigin {
                    self.poll(stream);
                }
            }
            Err(f) if f.is_stale_cursor() && self.streams[stream].interfered => {
                self.stats.interference_refusals += 1;
                self.kill(stream, &format!("refused after interference: {f}"), false);
            }
            Err(f) => self.protocol_error(stream, &format!("{f}")),
        }
    }

    /// A frame of a dead connection reaches its lingering receiver, if the peer's side of
    /// that connection is still there. Refusing a stale frame is then the right outcome.
    fn deliver_lingering(&mut self, stream: usize, gen: u64, bytes: &[u8]) {
        let Some(i) = self.streams[stream].lingering.iter().position(|(g, _)| *g == gen) else { return };
        let (_, mut receiver) = self.streams[stream].lingering.remove(i);
        let frame = decode_frame(bytes, SNAPSHOT_FRAME_BYTES_MAX).expect("the codec round-trips our frames");
        self.stats.lingering_frames += 1;
        let (origin, peer) = (self.streams[stream].origin, self.streams[stream].peer);
        let oname = self.dcs[origin].name;
        let peer_view =
            |w: &World| (w.dcs[peer].log.mark_of(oname), w.dcs[peer].log.staged_snapshot(oname).unwrap());
        let before = peer_view(self);
        let res = self.at_receiver(stream, &mut receiver, frame, false);
        if peer_view(self) != before && self.streams[stream].conn.is_some() {
            self.streams[stream].interfered = true;
        }
        match res {
            Ok(()) => self.streams[stream].lingering.push((gen, receiver)),
            Err(f) if f.is_stale_cursor() => {
                self.trace(|| format!("lingering receiver of stream {stream} refuses a stale frame: {f}"));
                self.stats.lingering_refusals += 1;
            }
            Err(f) => self.errors.push(format!("at {} ms, lingering: {f}", self.now)),
        }
    }

    /// The peer's side: handle the frame, perform the actions durably, answer (unless the
    /// origin's side of the connection is gone).
    fn at_receiver(
        &mut self,
        stream: usize,
        receiver: &mut Receiver,
        frame: Frame,
        answer: bool,
    ) -> Result<(), Fail> {
        let (origin, peer) = (self.streams[stream].origin, self.streams[stream].peer);
        let oname = self.dcs[origin].name;
        self.trace(|| format!("{peer} <- {origin}: {}", describe(&frame)));
        // As the gateway drives it: the mark is read only for a frame that needs it.
        let (mark, mark_id) = if Receiver::needs_mark(&frame) {
            (self.dcs[peer].log.mark_of(oname), self.dcs[peer].log.mark_event_id(oname))
        } else {
            (None, None)
        };
        let actions = receiver.handle_frame(mark, mark_id, frame).map_err(Fail::Stream)?;
        for action in actions {
            match action {
                ReceiverAction::Send(f) => {
                    if answer {
                        self.send(stream, Dir::ToOrigin, &f);
                    }
                }
                ReceiverAction::Apply { batch_id, events } => {
                    for e in &events {
                        assert!(
                            e.origin_dc == oname && *e.op.key().owner_dc == *oname,
                            "foreign event {e:?}"
                        );
                    }
                    let report = self.dcs[peer]
                        .log
                        .apply_remote(oname, &events)
                        .map_err(|e| Fail::Other(e.to_string()))?;
                    self.stats.duplicates += report.duplicates as u64;
                    self.check_report(oname, &report);
                    self.check_dc(peer);
                    self.answer(stream, receiver, batch_id, &report, answer)?;
                }
                ReceiverAction::Install { batch_id, snapshot } => {
                    assert!(snapshot.instances.iter().all(|i| *i.record.key.owner_dc == *oname));
                    assert!(snapshot.tombstones.iter().all(|t| *t.key.owner_dc == *oname));
                    match mark {
                        Some(m) if m.epoch != snapshot.mark.epoch => self.stats.snapshots_new_epoch += 1,
                        Some(_) | None => self.stats.snapshots_behind_floor += 1,
                    }
                    let report = match self.dcs[peer].log.install_snapshot(oname, &snapshot) {
                        Ok(r) => r,
                        Err(LogError::Refused(r)) => ApplyReport { refusal: Some(r), ..Default::default() },
                        Err(e) => return Err(Fail::Other(e.to_string())),
                    };
                    self.check_report(oname, &report);
                    self.check_dc(peer);
                    self.answer(stream, receiver, batch_id, &report, answer)?;
                }
                ReceiverAction::StageChunk { batch_id, chunk } => {
                    assert!(chunk.instances.iter().all(|i| *i.record.key.owner_dc == *oname));
                    assert!(chunk.tombstones.iter().all(|t| *t.key.owner_dc == *oname));
                    let (id, index, cut) = (chunk.snapshot_id, chunk.index, chunk.mark);
                    let staged_before = self.dcs[peer].log.staged_snapshot(oname).unwrap();
                    let view_before =
                        (self.dcs[peer].log.instances().unwrap(), self.dcs[peer].log.tombstones().unwrap());
                    let outcome = match self.dcs[peer].log.stage_snapshot_chunk(oname, &chunk) {
                        Ok(o) => o,
                        Err(LogError::Refused(r)) => {
                            ChunkOutcome::Installed(ApplyReport { refusal: Some(r), ..Default::default() })
                        }
                        Err(e) => return Err(Fail::Other(e.to_string())),
                    };
                    match outcome {
                        ChunkOutcome::Staged(_) => {
                            // Staging never touches the state: the old state stays whole.
                            let view_after = (
                                self.dcs[peer].log.instances().unwrap(),
                                self.dcs[peer].log.tombstones().unwrap(),
                            );
                            assert_eq!(view_before, view_after, "staging a chunk changed the state");
                            assert_eq!(
                                self.dcs[peer].log.mark_of(oname),
                                mark,
                                "staging a chunk moved the mark"
                            );
                            self.stats.snapshot_chunks += 1;
                            let ack = receiver.chunk_staged(batch_id, id, index);
                            if answer {
                                self.send(stream, Dir::ToOrigin, &ack);
                            }
                        }
                        ChunkOutcome::Installed(report) => {
                            if report.refusal.is_none() {
                                self.stats.snapshot_chunks += 1;
                                match mark {
                                    Some(m) if m.epoch != cut.epoch => self.stats.snapshots_new_epoch += 1,
                                    Some(_) | None => self.stats.snapshots_behind_floor += 1,
                                }
                                // Staged by an earlier connection: the transfer was resumed.
                                let at_connect = self.streams[stream].staged_at_connect;
                                if staged_before.is_some_and(|s| s.snapshot_id == id)
                                    && at_connect.is_some_and(|s| s.snapshot_id == id && s.chunks > 0)
                                {
                                    self.stats.snapshots_resumed += 1;
                                }
                                assert_eq!(self.dcs[peer].log.staged_snapshot(oname).unwrap(), None);
                            }
                            self.check_report(oname, &report);
                            self.check_dc(peer);
                            self.answer(stream, receiver, batch_id, &report, answer)?;
                        }
                    }
                }
                ReceiverAction::PurgeTombstones { upto_seq } => {
                    let before = self.dcs[peer].log.tombstones().unwrap().len();
                    self.dcs[peer]
                        .log
                        .purge_remote_tombstones(oname, upto_seq)
                        .map_err(|e| Fail::Other(e.to_string()))?;
                    if self.dcs[peer].log.tombstones().unwrap().len() < before {
                        self.stats.tombstone_purges += 1;
                        self.check_dc(peer);
                    }
                }
                ReceiverAction::Contact { .. } => {}
            }
        }
        Ok(())
    }

    /// Tells the receiver the apply is durable and sends its ack (a refusal ends the stream).
    fn answer(
        &mut self,
        stream: usize,
        receiver: &mut Receiver,
        batch_id: u64,
        report: &ApplyReport,
        answer: bool,
    ) -> Result<(), Fail> {
        match receiver.applied(batch_id, report) {
            Ok(ack) => {
                assert!(matches!(ack, Frame::Ack { .. }), "applied answers with an ack");
                if answer {
                    self.send(stream, Dir::ToOrigin, &ack);
                }
                Ok(())
            }
            Err(e) => Err(match &report.refusal {
                Some(r) => Fail::Refused(r.clone()),
                None => Fail::Stream(e),
            }),
        }
    }

    /// The origin's side: handle an answer from the peer.
    fn at_sender(&mut self, stream: usize, conn: &mut Conn, frame: Frame) -> Result<(), StreamError> {
        let (origin, peer) = (self.streams[stream].origin, self.streams[stream].peer);
        self.trace(|| format!("{origin} <- {peer}: {}", describe(&frame)));
        // As the gateway drives it: an ack is checked against the own epoch where it
        // arrives, without the log; every other answer is handled with the log.
        let events = match frame {
            Frame::Ack { batch_id, mark } => {
                conn.sender.handle_ack(batch_id, mark, self.dcs[origin].log.own_mark().epoch)?
            }
            frame => conn.sender.handle_frame(&self.dcs[origin].log, frame)?,
        };
        self.streams[stream].failures = 0;
        for e in events {
            match e {
                SenderEvent::PeerAcked(m) => {
                    let own = self.dcs[origin].log.own_mark();
                    assert_eq!(m.epoch, own.epoch, "ack of another epoch");
                    assert!(m.seq <= own.seq, "ack past the own log");
                    let st = &mut self.streams[stream];
                    assert!(m.seq >= st.acked_seq, "acks went backwards on one stream");
                    st.acked_seq = m.seq;
                    assert_eq!(conn.sender.acked_seq(), m.seq);
                    let dc = &mut self.dcs[origin];
                    dc.acks.insert(peer, m);
                    dc.last_ack_ms.insert(peer, self.now);
                }
                SenderEvent::ChunkAcked { .. } => {}
                SenderEvent::SnapshotSent(_) | SenderEvent::ChunkSent { .. } => {
                    unreachable!("only poll_snapshot sends snapshots")
                }
                SenderEvent::LogUnreadable { .. } => unreachable!("the simulation logs hold valid events"),
                // Histories never go back in this model and every new one is minted above
                // all earlier ones (tests/epochs.rs drives these paths).
                SenderEvent::NewEpoch { reason, .. } | SenderEvent::Fenced { reason } => {
                    panic!("{origin}: no history goes back in this model: {reason}")
                }
            }
        }
        Ok(())
    }

    /// Lets the sender of `stream` send what its window allows.
    fn poll(&mut self, stream: usize) {
        let Some(mut conn) = self.streams[stream].conn.take() else { return };
        let origin = self.streams[stream].origin;
        for _ in 0..POLL_FRAMES_MAX {
            let polled = match conn.sender.poll_transmit(&self.dcs[origin].log, self.now) {
                Ok(None) => conn.sender.poll_snapshot(),
                other => other,
            };
            match polled {
                Ok(Some((frame, events))) => {
                    for e in events {
                        match e {
                            SenderEvent::SnapshotSent(_) => {
                                self.stats.snapshots_sent += 1;
                                // Hello is the first frame; a snapshot after a batch was
                                // not asked for by the HelloAck.
                                if self.streams[stream].frames_sent > 1 {
                                    self.stats.snapshots_mid_stream += 1;
                                }
                            }
                            SenderEvent::ChunkSent { .. } => {}
                            SenderEvent::PeerAcked(_)
                            | SenderEvent::ChunkAcked { .. }
                            | SenderEvent::NewEpoch { .. }
                            | SenderEvent::Fenced { .. } => unreachable!("these come from handle_frame"),
                            SenderEvent::LogUnreadable { .. } => {
                                unreachable!("the simulation logs hold valid events")
                            }
                        }
                    }
                    self.send(stream, Dir::ToPeer, &frame);
                }
                Ok(None) => break,
                Err(e) => {
                    self.streams[stream].conn = Some(conn);
                    self.protocol_error(stream, &e.to_string());
                    return;
                }
            }
        }
        assert!(conn.sender.inflight_batches() <= self.p.tuning.window_batches_max);
        self.streams[stream].reader = conn.sender.reader();
        self.streams[stream].conn = Some(conn);
    }

    /// A `StreamError` closes the stream on both sides and the origin redials, as the
    /// gateway does. Nothing in this model is a legitimate cause of one (but a lingering
    /// receiver moving the mark, handled in `deliver`), so the run fails after the close.
    fn protocol_error(&mut self, stream: usize, e: &str) {
        let (origin, peer) = (self.streams[stream].origin, self.streams[stream].peer);
        self.errors.push(format!("at {} ms on stream {origin}->{peer}: {e}", self.now));
        self.kill(stream, "protocol error", false);
    }

    fn poll_from(&mut self, dc: usize) {
        for s in 0..self.streams.len() {
            if self.streams[s].origin == dc {
                self.poll(s);
            }
        }
    }

    // ---- the DCs ----

    /// The workload: the owner registers, updates and deregisters its own instances.
    fn append(&mut self, dc: usize) {
        if !self.safety {
            return;
        }
        let gap = self.rng.gen_range(1..=self.p.append_gap_ms_max);
        self.at(self.now + gap, Ev::Append { dc });
        if self.dcs[dc].down.is_some() {
            return;
        }
        let name = self.dcs[dc].name;
        let own = self.dcs[dc].log.own_mark();
        let mut batch: Vec<ChangeEvent> = Vec::new();
        for i in 0..self.rng.gen_range(1..=3u64) {
            let seq = own.seq + 1 + i;
            let id = IDS[self.rng.gen_range(0..IDS.len())];
            let k = key(name, id);
            let mut live = matches!(self.dcs[dc].log.held(&k), Held::Live { .. });
            for e in batch.iter().filter(|e| e.op.key() == &k) {
                live = !matches!(e.op, Op::Deregister { .. });
            }
            let op = if !live {
                Op::Register(record_at(name, id, own.epoch, seq))
            } else if self.rng.gen_bool(0.55) {
                Op::Update(record_at(name, id, own.epoch, seq))
            } else {
                let reason =
                    [DeregisterReason::Explicit, DeregisterReason::LeaseExpired, DeregisterReason::Evicted]
                        [self.rng.gen_range(0..3)];
                Op::Deregister { key: k, reason }
            };
            let mut e = ev(name, own.epoch, seq, op);
            e.commit_time_ms = self.now;
            batch.push(e);
        }
        self.dcs[dc].log.append_local(&batch).unwrap();
        let hist = self.oracle[dc].last_mut().unwrap();
        assert_eq!(hist.epoch, own.epoch);
        for e in batch {
            let id = IDS.iter().copied().find(|id| **id == *e.op.key().instance_id).unwrap();
            hist.seqs.entry(id).or_default().push(e.seq);
            hist.events.push(e);
        }
        self.stats.events_appended = self.oracle.iter().flatten().map(|h| h.events.len() as u64).sum();
        self.check_dc(dc);
        self.poll_from(dc);
    }

    fn tick(&mut self, dc: usize) {
        self.at(self.now + TICK_MS, Ev::Tick { dc });
        if self.dcs[dc].down.is_some() {
            return;
        }
        self.poll_from(dc);
        if (self.now / TICK_MS) % PURGE_EVERY_TICKS == 0 {
            self.purge(dc);
        }
    }

    /// Purges own entries and tombstones the peers no longer need (by the seed's policy)
    /// and that are older than the grace period.
    fn purge(&mut self, dc: usize) {
        let d = &self.dcs[dc];
        let own = d.log.own_mark();
        // The peers that count: all of them, or (stress) those heard from lately.
        let counted = (0..self.p.dcs).filter(|p| *p != dc).filter(|peer| match self.p.purge {
            PurgePolicy::AllPeersAcked => true,
            PurgePolicy::DropSilentPeers { silent_ms } => {
                let last = d.last_ack_ms.get(peer).copied().unwrap_or(d.started_ms).max(d.started_ms);
                self.now.saturating_sub(last) <= silent_ms
            }
        });
        let acked = purge::acked_floor(own, counted.map(|peer| d.acks.get(&peer).copied()));
        let cutoff = self.now.saturating_sub(self.p.grace_ms);
        let upto =
            purge::purge_upto(d.log.purge_floor(), acked, cutoff, |after, max| d.log.read_own(after, max))
                .unwrap();
        if upto > d.log.purge_floor() {
            self.trace(|| format!("{dc} purges up to {upto}"));
            self.stats.purges += 1;
            self.dcs[dc].log.purge_own(upto).unwrap();
            assert_eq!(self.dcs[dc].log.purge_floor(), upto);
            let hist = self.oracle[dc].last_mut().unwrap();
            hist.floor_max = hist.floor_max.max(upto);
            self.check_dc(dc);
        }
    }

    fn crash(&mut self, dc: usize, down_ms: u64, data_loss: bool) {
        if self.dcs[dc].down.is_some() {
            return;
        }
        self.trace(|| format!("{dc} crashes (data loss: {data_loss})"));
        self.stats.crashes += 1;
        self.dcs[dc].down = Some(data_loss);
        self.dcs[dc].incarnation += 1;
        for s in 0..self.streams.len() {
            if self.streams[s].peer == dc {
                // The peer's process is gone, with every session it had.
                self.streams[s].lingering.clear();
                self.kill(s, "crash", false);
            } else if self.streams[s].origin == dc {
                // What the origin sent before it died may still arrive; the snapshot
                // readers it held are gone with the process.
                self.kill(s, "crash", true);
                self.streams[s].reader = None;
            }
        }
        let incarnation = self.dcs[dc].incarnation;
        self.at(self.now + down_ms, Ev::Restart { dc, incarnation });
    }

    fn restart(&mut self, dc: usize) {
        let data_loss = self.dcs[dc].down == Some(true);
        self.trace(|| format!("{dc} restarts (data loss: {data_loss})"));
        if data_loss {
            self.stats.data_losses += 1;
            // Epochs are ordered: the new history is minted above every epoch the DC had,
            // as a new data dir's first handshake makes it (tests/epochs.rs).
            let seen = self.oracle[dc].iter().map(|h| h.epoch).max().unwrap_or(0);
            let epoch = tandem_replicator::epoch::above(seen, self.rng.gen());
            let d = &mut self.dcs[dc];
            d.log = MemLog::new(d.name, epoch);
            d.acks.clear();
            d.last_ack_ms.clear();
            d.started_ms = self.now;
            self.oracle[dc].push(EpochHistory::new(epoch));
            // Everything this DC observed is gone with its data.
            self.obs.retain(|(observer, _), _| *observer != dc);
        }
        self.dcs[dc].down = None;
        self.dcs[dc].incarnation += 1;
        self.check_dc(dc);
        for s in 0..self.streams.len() {
            if self.streams[s].origin == dc {
                // A new generation: timers of the old one die.
                self.streams[s].failures = 0;
                self.streams[s].gen += 1;
                let gen = self.streams[s].gen;
                let t = self.now + self.backoff(s);
                self.at(t, Ev::Connect { stream: s, gen });
            }
        }
    }

    // ---- the checks ----

    /// An applied batch or snapshot changed only keys of its channel's origin.
    fn check_report(&self, origin: &str, report: &ApplyReport) {
        for c in &report.changes {
            let owner = match c {
                StateChange::Put { record, .. } => &record.key.owner_dc,
                StateChange::Remove { key } => &key.owner_dc,
            };
            assert_eq!(&**owner, origin, "a change of {origin}'s stream touched a key of {owner}");
        }
    }

    /// Prefix consistency, no resurrection and monotonic marks at `d`.
    fn check_dc(&mut self, d: usize) {
        let log = &self.dcs[d].log;
        let instances = log.instances().unwrap();
        let tombstones = log.tombstones().unwrap();
        let known = |owner: &str, id: &str| DC_NAMES[..self.p.dcs].contains(&owner) && IDS.contains(&id);
        for (_, r) in &instances {
            assert!(known(&r.key.owner_dc, &r.key.instance_id), "{d} holds an unknown key {:?}", r.key);
        }
        for t in &tombstones {
            assert!(known(&t.key.owner_dc, &t.key.instance_id), "{d} holds an unknown tombstone {:?}", t.key);
        }
        for (x, &xname) in DC_NAMES[..self.p.dcs].iter().enumerate() {
            let mark = if x == d { Some(log.own_mark()) } else { log.mark_of(xname) };
            let ob = self.obs.entry((d, x)).or_default();
            let epoch_index = |e: u64| self.oracle[x].iter().position(|h| h.epoch == e);
            match (ob.mark, mark) {
                (Some(old), None) => panic!("{d}'s mark of {xname} vanished (was {old:?})"),
                (Some(old), Some(new)) if old.epoch == new.epoch => {
                    assert!(new.seq >= old.seq, "{d}'s mark of {xname} went back from {old:?} to {new:?}")
                }
                (Some(old), Some(new)) => assert!(
                    epoch_index(new.epoch) > epoch_index(old.epoch),
                    "{d}'s mark of {xname} moved from epoch {} to an older one {}",
                    old.epoch,
                    new.epoch
                ),
                (None, _) => {}
            }
            ob.mark = mark;
            let Some(m) = mark else {
                assert!(
                    instances.iter().all(|(_, r)| *r.key.owner_dc != *xname),
                    "{d} holds {xname}'s keys without a mark"
                );
                assert!(tombstones.iter().all(|t| *t.key.owner_dc != *xname));
                continue;
            };
            let hist = self.oracle[x]
                .iter()
                .find(|h| h.epoch == m.epoch)
                .unwrap_or_else(|| panic!("{d} follows epoch {} that {xname} never had", m.epoch));
            assert!(m.seq <= hist.events.len() as u64, "{d}'s mark {m:?} of {xname} is past its history");
            for id in IDS {
                let k = key(xname, id);
                let held = log.held(&k);
                if let Some(s) = hist.last_dereg(id, m.seq) {
                    let dead = ob.dead.entry(id).or_insert((m.epoch, s));
                    if dead.0 != m.epoch || dead.1 < s {
                        *dead = (m.epoch, s);
                    }
                }
                if let (Held::Live { seq }, Some(&(e, s))) = (held, ob.dead.get(id)) {
                    assert!(
                        e != m.epoch || seq > s,
                        "resurrection: {d} holds {xname}/{id} live at seq {seq} after consuming \
                         its DEREGISTER at {s}"
                    );
                }
                match (hist.at(id, m.seq), held) {
                    (None, Held::Absent) => {}
                    (Some(e), Held::Live { seq }) if e.seq == seq => {
                        let (Op::Register(r) | Op::Update(r)) = &e.op else {
                            panic!("{d} holds {xname}/{id} live at seq {seq}, which deregistered it");
                        };
                        let got = instances.iter().find(|(_, x)| x.key == k).map(|(_, x)| x);
                        assert_eq!(got, Some(r), "{d} holds the wrong record of {xname}/{id}");
                    }
                    (Some(e), Held::Tombstone { seq }) if e.seq == seq => {
                        assert!(
                            matches!(e.op, Op::Deregister { .. }),
                            "{d}: tombstone at seq {seq} of a put"
                        );
                    }
                    (Some(e), Held::Absent) if matches!(e.op, Op::Deregister { .. }) => assert!(
                        e.seq <= hist.floor_max,
                        "{d} lost the tombstone of {xname}/{id} at seq {} above {xname}'s purge floor {}",
                        e.seq,
                        hist.floor_max
                    ),
                    (want, got) => {
                        panic!("{d} at mark {m:?} of {xname}: {id} should be {want:?}, holds {got:?}")
                    }
                }
            }
        }
    }

    /// Liveness: every DC holds every origin exactly as the origin holds itself.
    fn converged(&self) -> Result<(), String> {
        for (x, dc) in self.dcs.iter().enumerate() {
            let origin = &dc.log;
            let own = origin.own_mark();
            let name = dc.name;
            let live: Vec<(u64, InstanceRecord)> =
                origin.instances().unwrap().into_iter().filter(|(_, r)| *r.key.owner_dc == *name).collect();
            let tombs: Vec<_> =
                origin.tombstones().unwrap().into_iter().filter(|t| *t.key.owner_dc == *name).collect();
            for d in (0..self.p.dcs).filter(|d| *d != x) {
                let log = &self.dcs[d].log;
                let mark = log.mark_of(name);
                if mark != Some(own) && !(mark.is_none() && own.seq == 0) {
                    return Err(format!("{d}'s mark of {name} is {mark:?}, the origin is at {own:?}"));
                }
                let held: Vec<(u64, InstanceRecord)> =
                    log.instances().unwrap().into_iter().filter(|(_, r)| *r.key.owner_dc == *name).collect();
                if held != live {
                    return Err(format!(
                        "{d} holds {} live instances of {name}, the origin {}",
                        held.len(),
                        live.len()
                    ));
                }
                let held_tombs = log.tombstones().unwrap();
                if let Some(t) = tombs.iter().find(|t| !held_tombs.contains(t)) {
                    return Err(format!("{d} misses {name}'s tombstone {t:?}"));
                }
            }
        }
        Ok(())
    }
}

fn describe(f: &Frame) -> String {
    match f {
        Frame::Hello { epoch, last_seq, .. } => format!("Hello {epoch}:{last_seq}"),
        Frame::HelloAck { mark, .. } => format!("HelloAck {mark:?}"),
        Frame::Batch { batch_id, events } => format!(
            "Batch {batch_id} seqs {}..={}",
            events.first().map_or(0, |e| e.seq),
            events.last().map_or(0, |e| e.seq)
        ),
        Frame::Snapshot { batch_id, snapshot } => format!(
            "Snapshot {batch_id} at {:?}: {} live, {} tombstones",
            snapshot.mark,
            snapshot.instances.len(),
            snapshot.tombstones.len()
        ),
        Frame::Ack { batch_id, mark } => format!("Ack {batch_id} {mark:?}"),
        Frame::Ping { last_seq, floor_seq, .. } => format!("Ping last {last_seq} floor {floor_seq}"),
        Frame::Refuse { code, message } => format!("Refuse {code:?} {message}"),
        Frame::SnapshotChunk { batch_id, chunk } => format!(
            "SnapshotChunk {batch_id} of {:#x} #{} at {:?}: {} live, {} tombstones{}",
            chunk.snapshot_id,
            chunk.index,
            chunk.mark,
            chunk.instances.len(),
            chunk.tombstones.len(),
            if chunk.last { ", last" } else { "" }
        ),
        Frame::ChunkAck { batch_id, snapshot_id, index } => {
            format!("ChunkAck {batch_id} {snapshot_id:#x} #{index}")
        }
        Frame::SnapshotResume { staged } => format!("SnapshotResume {staged:?}"),
    }
}

/// `TANDEM_SIM_SEEDS`: `N` for seeds `0..N`, or `A..B`; `0..DEFAULT_SEEDS` when unset.
fn seed_range() -> std::ops::Range<u64> {
    let Ok(v) = std::env::var("TANDEM_SIM_SEEDS") else { return 0..DEFAULT_SEEDS };
    let bad = || panic!("TANDEM_SIM_SEEDS must be N or A..B, got {v:?}");
    match v.split_once("..") {
        Some((a, b)) => a.parse().unwrap_or_else(|_| bad())..b.parse().unwrap_or_else(|_| bad()),
        None => 0..v.parse().unwrap_or_else(|_| bad()),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")))
}

/// Runs one seed, catching a failure to name the seed and how to replay it.
fn run_seed_framed(seed: u64, trace: bool, framing: Framing) -> Result<Stats, String> {
    catch_unwind(AssertUnwindSafe(|| World::with_framing(seed, trace, framing).run())).map_err(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!(
            "seed {seed} failed: {msg}\n  replay: TANDEM_SIM_SEED={seed} TANDEM_SIM_TRACE=1 \
             cargo test -p tandem-replicator --test sim -- seeds --nocapture"
        )
    })
}

fn run_seeds(seeds: impl IntoIterator<Item = u64>, trace: bool) -> Vec<(u64, Stats)> {
    run_seeds_framed(seeds, trace, Framing::BySeed)
}

fn run_seeds_framed(
    seeds: impl IntoIterator<Item = u64>,
    trace: bool,
    framing: Framing,
) -> Vec<(u64, Stats)> {
    let started = Instant::now();
    let per_seed = std::env::var_os("TANDEM_SIM_STATS").is_some();
    let mut out = Vec::new();
    for seed in seeds {
        match run_seed_framed(seed, trace, framing) {
            Ok(stats) => {
                if per_seed {
                    eprintln!("seed {seed}: {stats:?}");
                }
                out.push((seed, stats));
            }
            Err(report) => panic!("{report}"),
        }
    }
    let total = |f: fn(&Stats) -> u64| out.iter().map(|(_, s)| f(s)).sum::<u64>();
    eprintln!(
        "{} seeds in {:?}: {} events, {} frames, {} stream deaths, {} crashes ({} with data loss), \
         {} partitions, {} snapshots sent ({} mid-stream), installed {} for a new epoch and {} \
         behind the floor, {} purges, {} tombstone purges, {} duplicates, {} frames to lingering \
         receivers ({} refused), {} streams ended by such interference, {} snapshot chunks staged, {} \
         snapshots resumed; slowest convergence {} ms",
        out.len(),
        started.elapsed(),
        total(|s| s.events_appended),
        total(|s| s.frames),
        total(|s| s.stream_deaths),
        total(|s| s.crashes),
        total(|s| s.data_losses),
        total(|s| s.partitions),
        total(|s| s.snapshots_sent),
        total(|s| s.snapshots_mid_stream),
        total(|s| s.snapshots_new_epoch),
        total(|s| s.snapshots_behind_floor),
        total(|s| s.purges),
        total(|s| s.tombstone_purges),
        total(|s| s.duplicates),
        total(|s| s.lingering_frames),
        total(|s| s.lingering_refusals),
        total(|s| s.interference_refusals),
        total(|s| s.snapshot_chunks),
        total(|s| s.snapshots_resumed),
        out.iter().map(|(_, s)| s.converged_after_ms).max().unwrap_or(0),
    );
    out
}

/// The default run: `DEFAULT_SEEDS` seeds, or `TANDEM_SIM_SEEDS`, or the one seed in
/// `TANDEM_SIM_SEED` (`TANDEM_SIM_TRACE=1` prints its steps, `TANDEM_SIM_STATS=1` prints
/// what every seed did).
#[test]
fn seeds() {
    let trace = std::env::var_os("TANDEM_SIM_TRACE").is_some();
    let out = match env_u64("TANDEM_SIM_SEED") {
        Some(seed) => run_seeds([seed], trace),
        None => run_seeds(seed_range(), false),
    };
    for (seed, s) in &out {
        assert!(s.events_appended > 0 && s.frames > 0, "seed {seed} did nothing: {s:?}");
    }
    // The seeds as a whole must reach the paths this simulation exists for.
    if out.len() >= 100 {
        let total = |f: fn(&Stats) -> u64| out.iter().map(|(_, s)| f(s)).sum::<u64>();
        assert!(total(|s| s.snapshots_new_epoch) > 0, "no snapshot of a new epoch was installed");
        assert!(total(|s| s.snapshots_behind_floor) > 0, "no peer fell behind a purge floor");
        assert!(total(|s| s.snapshots_mid_stream) > 0, "no log was purged under a sender's cursor");
        assert!(total(|s| s.tombstone_purges) > 0, "no receiver purged tombstones");
        assert!(total(|s| s.lingering_frames) > 0, "no connection was half open");
        assert!(total(|s| s.duplicates) > 0, "nothing was delivered twice");
    }
}

/// Seeds that once failed or that reach the rare paths, pinned so that they keep being run
/// whatever happens to the default seed range. Each entry says what it covers, and the
/// test checks that it still does.
#[test]
fn regression_seeds() {
    type Covers = fn(&Stats) -> bool;
    let seeds: [(u64, &str, Covers); 6] = [
        // Failed before the fix in protocol.rs (`Receiver`, Snapshot): after a data-loss
        // restart of dc-a, a half-open session of its dead incarnation installed a snapshot
        // of the replaced epoch over the new one ("mark moved to an older epoch"). See
        // `half_open_session_cannot_install_a_snapshot_of_a_replaced_epoch`.
        (2817, "a stale snapshot of a replaced epoch, refused by a lingering receiver", |s| {
            s.data_losses > 0 && s.lingering_refusals > 0
        }),
        // The same race on a ping: the floor of a replaced epoch must not purge the new
        // epoch's tombstones. See `idle_origin_repairs_a_peer_that_a_half_open_session_fed_its_lost_epoch`.
        // (Was seed 2042 until pings went out on busy streams too, which moved its timing.)
        (1183, "a ping of a replaced epoch, refused by a lingering receiver", |s| {
            s.lingering_refusals > 0 && s.tombstone_purges > 0
        }),
        (
            // (Was seed 2486 until pings went out on busy streams too.)
            41,
            "two DCs, half-open connections: the new connection redelivers what a lingering receiver applied",
            |s| s.dcs == 2 && s.lingering_frames > 0 && s.duplicates > 0,
        ),
        (
            2424,
            "two DCs and every snapshot path: new epoch, behind the floor, purged under the cursor",
            |s| {
                s.dcs == 2
                    && s.snapshots_new_epoch > 0
                    && s.snapshots_behind_floor > 0
                    && s.snapshots_mid_stream > 0
            },
        ),
        (591, "three DCs, every snapshot path, tombstone purges at receivers", |s| {
            s.dcs == 3
                && s.snapshots_new_epoch > 0
                && s.snapshots_behind_floor > 0
                && s.snapshots_mid_stream > 0
                && s.tombstone_purges > 0
        }),
        // Failed liveness while the budget was a fixed 30 s: a long partition leaves a
        // backlog of hundreds of events behind one-event batches and a window of one. The
        // budget is now derived from the backlog and the stream's throughput.
        (138, "a backlog that takes more than 20 s of virtual time to drain", |s| {
            s.converged_after_ms > 20_000
        }),
    ];
    let out = run_seeds_framed(seeds.iter().map(|(seed, _, _)| *seed), false, Framing::SingleFrame);
    for ((seed, covers, check), (_, stats)) in seeds.iter().zip(&out) {
        assert!(check(stats), "seed {seed} no longer covers {covers}: {stats:?}");
    }
    // The list exists to cover the snapshot paths; prove that it does.
    let total = |f: fn(&Stats) -> u64| out.iter().map(|(_, s)| f(s)).sum::<u64>();
    assert!(total(|s| s.snapshots_new_epoch) > 0 && total(|s| s.snapshots_behind_floor) > 0);
    assert!(total(|s| s.snapshots_mid_stream) > 0);
}

// ---- Directed scenarios: half-open sessions of a DC that lost its data ----
//
// The gateway runs one receive session per accepted connection. When an origin dies, its
// old connection is half open until the peer notices: frames the dead incarnation sent can
// still be applied after the origin came back with a new epoch and opened a new session.
// These scenarios pin what the receiver state machine must then do, with the real
// `Sender` / `Receiver` and `MemLog`, step by step.

/// Performs the receiver's actions for one frame on `log`; returns the frames it answers.
fn receive(log: &mut MemLog, receiver: &mut Receiver, frame: Frame) -> Result<Vec<Frame>, StreamError> {
    let origin = receiver.channel_dc().to_owned();
    let mut out = Vec::new();
    for action in receiver.handle_frame(log.mark_of(&origin), log.mark_event_id(&origin), frame)? {
        match action {
            ReceiverAction::Send(f) => out.push(f),
            ReceiverAction::Apply { batch_id, events } => {
                let report = log.apply_remote(&origin, &events).unwrap();
                out.push(receiver.applied(batch_id, &report)?);
            }
            ReceiverAction::Install { batch_id, snapshot } => {
                let report = match log.install_snapshot(&origin, &snapshot) {
                    Ok(r) => r,
                    Err(LogError::Refused(r)) => ApplyReport { refusal: Some(r), ..Default::default() },
                    Err(e) => panic!("storage: {e}"),
                };
                out.push(receiver.applied(batch_id, &report)?);
            }
            ReceiverAction::StageChunk { batch_id, chunk } => match log.stage_snapshot_chunk(&origin, &chunk)
            {
                Ok(ChunkOutcome::Staged(_)) => {
                    out.push(receiver.chunk_staged(batch_id, chunk.snapshot_id, chunk.index))
                }
                Ok(ChunkOutcome::Installed(report)) => out.push(receiver.applied(batch_id, &report)?),
                Err(LogError::Refused(r)) => out.push(
                    receiver.applied(batch_id, &ApplyReport { refusal: Some(r), ..Default::default() })?,
                ),
                Err(e) => panic!("storage: {e}"),
            },
            ReceiverAction::PurgeTombstones { upto_seq } => {
                log.purge_remote_tombstones(&origin, upto_seq).unwrap()
            }
            ReceiverAction::Contact { .. } => {}
        }
    }
    Ok(out)
}

/// Opens a stream from `origin` to `peer` and completes its handshake.
fn handshake(origin: &MemLog, peer: &mut MemLog, now_ms: u64) -> (Sender, Receiver) {
    let (mut sender, hello) = Sender::new(origin, peer.local_dc(), StreamTuning::default(), now_ms);
    let mut receiver = Receiver::new(peer.local_dc(), origin.local_dc());
    for f in receive(peer, &mut receiver, hello).unwrap() {
        assert!(sender.handle_frame(origin, f).unwrap().is_empty());
    }
    (sender, receiver)
}

/// Runs a stream until the sender has nothing more to send at `now_ms`.
fn pump(origin: &MemLog, sender: &mut Sender, peer: &mut MemLog, receiver: &mut Receiver, now_ms: u64) {
    while let Some((frame, _)) =
        sender.poll_transmit(origin, now_ms).unwrap().or_else(|| sender.poll_snapshot().unwrap())
    {
        for answer in receive(peer, receiver, frame).unwrap() {
            sender.handle_frame(origin, answer).unwrap();
        }
    }
}

type View = (Vec<(u64, InstanceRecord)>, Vec<tandem_schemas::Tombstone>, BTreeMap<String, Mark>);

fn view(log: &MemLog) -> View {
    (log.instances().unwrap(), log.tombstones().unwrap(), log.marks())
}

/// dc-a ships a batch, loses its data, comes back with a new epoch and stays idle. The
/// batch of the lost epoch lands through the half-open old session after the new
/// handshake told dc-a's sender that dc-b holds nothing. Without a check, the new stream
/// only pings, and dc-b keeps the lost epoch's instance forever while the link looks
/// healthy. The ping must end the stream, and the fresh handshake repairs dc-b.
#[test]
fn idle_origin_repairs_a_peer_that_a_half_open_session_fed_its_lost_epoch() {
    let mut a1 = MemLog::new("dc-a", 1 << 20);
    a1.append_local(&[ev("dc-a", 1 << 20, 1, Op::Register(record_at("dc-a", "zombie", 1 << 20, 1)))])
        .unwrap();
    let mut b = MemLog::new("dc-b", 7);
    let (mut s1, mut r1) = handshake(&a1, &mut b, 0);
    let (batch, _) = s1.poll_transmit(&a1, 0).unwrap().unwrap();
    assert!(matches!(batch, Frame::Batch { .. }));

    let a2 = MemLog::new("dc-a", 2 << 20);
    let (mut s2, mut r2) = handshake(&a2, &mut b, 10);
    receive(&mut b, &mut r1, batch).unwrap();
    assert_eq!(b.mark_of("dc-a"), Some(Mark { epoch: 1 << 20, seq: 1 }));

    let (ping, _) = s2.poll_transmit(&a2, 10_000).unwrap().unwrap();
    assert!(matches!(ping, Frame::Ping { .. }));
    let err =
        receive(&mut b, &mut r2, ping).expect_err("a ping over a mark of another epoch must end the stream");
    assert_eq!(err.code, RefuseCode::Gap);

    let (mut s3, mut r3) = handshake(&a2, &mut b, 10_100);
    pump(&a2, &mut s3, &mut b, &mut r3, 10_100);
    assert_eq!(b.mark_of("dc-a"), Some(Mark { epoch: 2 << 20, seq: 0 }));
    assert_eq!(b.instances().unwrap(), vec![]);
}

/// dc-a (purged, so a new peer needs a snapshot) sends its snapshot, loses its data, comes
/// back with a new epoch and ships that to dc-b over a new session. The old snapshot
/// lands last, through the half-open old session: installing it would put the lost epoch's
/// instances back. It is refused and changes nothing.
#[test]
fn half_open_session_cannot_install_a_snapshot_of_a_replaced_epoch() {
    let mut a1 = MemLog::new("dc-a", 1 << 20);
    let old = |seq, id| ev("dc-a", 1 << 20, seq, Op::Register(record_at("dc-a", id, 1, seq)));
    a1.append_local(&[old(1, "gone"), old(2, "zombie")]).unwrap();
    a1.purge_own(1).unwrap();
    let mut b = MemLog::new("dc-b", 7);
    let (mut s1, mut r1) = handshake(&a1, &mut b, 0);
    assert!(s1.poll_transmit(&a1, 0).unwrap().is_none(), "the snapshot comes from poll_snapshot");
    let (snapshot, _) = s1.poll_snapshot().unwrap().unwrap();
    assert!(matches!(snapshot, Frame::Snapshot { .. }));

    let mut a2 = MemLog::new("dc-a", 2 << 20);
    a2.append_local(&[ev("dc-a", 2 << 20, 1, Op::Register(record_at("dc-a", "fresh", 2 << 20, 1)))]).unwrap();
    let (mut s2, mut r2) = handshake(&a2, &mut b, 10);
    pump(&a2, &mut s2, &mut b, &mut r2, 10);
    assert_eq!(b.mark_of("dc-a"), Some(Mark { epoch: 2 << 20, seq: 1 }));

    let before = view(&b);
    assert!(receive(&mut b, &mut r1, snapshot).is_err(), "the stale snapshot must be refused");
    assert_eq!(view(&b), before);
    assert_eq!(b.held(&key("dc-a", "zombie")), Held::Absent);
}
