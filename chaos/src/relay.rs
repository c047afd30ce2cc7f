//! A user-space UDP fault relay for partition-heal drills.
//!
//! The sandbox kernels have no `netem`, so drills put faults on the replication link in user
//! space instead: a [`Relay`] sits on the QUIC/UDP path between two replication gateways and
//! forwards datagrams while dropping, delaying, duplicating and reordering them according to
//! the [`Faults`] in force. QUIC recovers from all of these, which is exactly what a drill
//! wants to exercise.
//!
//! # How a drill uses it
//!
//! ```text
//!   gateway A ──► relay(listen=R) ──► gateway B (upstream=B)
//!   gateway A ◄── relay ◄──────────── gateway B
//! ```
//!
//! 1. Start gateway B; note its QUIC address `B`.
//! 2. Start a relay with `listen` = `127.0.0.1:0` and `upstream` = `B`
//!    ([`Relay::start`]); its [`Relay::local_addr`] is `R`.
//! 3. Configure gateway A's peer address for B as `R` (instead of `B`). A dials `R`; the relay
//!    opens a per-client socket towards `B` (like a NAT mapping) and passes replies back.
//!    For links dialled in both directions, run a second relay in front of A and point B at
//!    it; each relay then covers the connections dialled towards its upstream.
//! 4. During the drill, drive faults through a [`RelayHandle`] (cheap to clone, safe to move
//!    into a scenario task): [`RelayHandle::partition`], [`RelayHandle::heal`],
//!    [`RelayHandle::set_faults`] for loss, delay with jitter, duplication and reordering.
//! 5. Read [`RelayHandle::stats`] for the drill report and record the seed: random decisions
//!    come from a seeded RNG, so a failing drill can be replayed from its seed.
//!
//! "Forward" is client → upstream (the direction of the dial), "backward" is upstream →
//! client. Every fault is set per direction, so one-way partitions are possible.
//!
//! # Determinism
//!
//! Each direction has its own RNG seeded from the relay's seed, and every datagram consumes
//! exactly [`DRAWS_PER_DATAGRAM`] draws whatever the outcome. The verdict for the n-th
//! datagram received in a direction is therefore a pure function of (seed, direction, n,
//! faults in force). What a run cannot replay is the order in which the OS hands datagrams to
//! the relay; for a single client with paced traffic that order is fixed. Replays assume the
//! same `rand` version (`StdRng` is not portable across `rand` releases; Cargo.lock pins it).
//!
//! # Architecture
//!
//! - [`Shaper`] is the sans-IO core: given the faults of one direction it returns a
//!   [`Verdict`]. It reads no clock and does no I/O.
//! - A listener task receives from clients, keeps the bounded mapping table (idle mappings
//!   expire, the least recently active one is evicted when the table is full) and applies the
//!   forward faults. One task per mapping receives from upstream and applies backward faults.
//! - A scheduler task holds delayed datagrams in a bounded timer queue (a min-heap keyed by
//!   deadline), so a delayed datagram never blocks the ones behind it.
//!
//! # What it must never do
//!
//! - Panic on a datagram: any payload (empty, maximum size, garbage) is forwarded as bytes.
//! - Grow without bound: mappings, timer queue entries and queued bytes all have limits
//!   ([`RelayLimits`]); what does not fit is dropped and counted, never buffered.
//! - Block a send: sends use `try_send`; a full kernel buffer is a counted drop, the same as a
//!   router queue overflowing.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Largest datagram the relay receives; the UDP payload limit, so nothing is ever truncated.
pub const DATAGRAM_BYTES_MAX: usize = 65_535;

/// Upper bound on every millisecond field of [`LinkFaults`]; larger values are clamped.
pub const DELAY_MS_MAX: u32 = 60_000;

/// Random draws each datagram consumes in a direction, whatever its verdict.
pub const DRAWS_PER_DATAGRAM: usize = 5;

// ---------------------------------------------------------------------------------------------
// Public API: the relay and its handle.
// ---------------------------------------------------------------------------------------------

/// A running UDP fault relay. Dropping it (or [`Relay::shutdown`]) stops every task.
pub struct Relay {
    local_addr: SocketAddr,
    handle: RelayHandle,
    mappings: Arc<Mutex<MappingTable>>,
    listener: JoinHandle<()>,
    scheduler: JoinHandle<()>,
}

impl Relay {
    /// Binds `listen` and starts relaying to `upstream` with [`RelayLimits::default`].
    ///
    /// Must be called within a Tokio runtime. On error nothing was started.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        faults: Faults,
        seed: u64,
    ) -> Result<Relay, StartError> {
        Self::start_with_limits(listen, upstream, faults, seed, RelayLimits::default()).await
    }

    /// Like [`Relay::start`] with explicit limits.
    pub async fn start_with_limits(
        listen: SocketAddr,
        upstream: SocketAddr,
        faults: Faults,
        seed: u64,
        limits: RelayLimits,
    ) -> Result<Relay, StartError> {
        let socket = UdpSocket::bind(listen).await.map_err(|source| StartError::Bind { listen, source })?;
        let local_addr = socket.local_addr().map_err(|source| StartError::Bind { listen, source })?;
        // Sends are `try_send`, which consults cached readiness; learn it once up front.
        socket.writable().await.map_err(|source| StartError::Bind { listen, source })?;
        let listen_socket = Arc::new(socket);

        let shared = Arc::new(Shared::new(faults, seed));
        let budget = Arc::new(QueueBudget::new(limits));
        // The budget is the real bound; the channel only has to be at least as large.
        let (queue_tx, queue_rx) = mpsc::channel(limits.delay_queue_datagrams_max.get());
        let io = Io {
            shared: Arc::clone(&shared),
            listen: Arc::clone(&listen_socket),
            queue_tx,
            budget: Arc::clone(&budget),
        };
        let mappings = Arc::new(Mutex::new(MappingTable::new(limits)));
        let scheduler = tokio::spawn(run_scheduler(queue_rx, Arc::clone(&shared), budget));
        let listener = tokio::spawn(run_listener(io, upstream, Arc::clone(&mappings), limits));
        Ok(Relay { local_addr, handle: RelayHandle { shared }, mappings, listener, scheduler })
    }

    /// The address clients send to (the bound `listen` address, with the real port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A cheap, cloneable handle for changing faults and reading counters.
    pub fn handle(&self) -> RelayHandle {
        self.handle.clone()
    }

    /// Stops every task and waits until they have ended; on return, all of the relay's
    /// sockets are closed (the listen port can be bound again). Queued datagrams are discarded.
    pub async fn shutdown(mut self) {
        self.listener.abort();
        self.scheduler.abort();
        // Cancellation is the expected outcome; a panic would already have been reported.
        let _ = (&mut self.listener).await;
        let _ = (&mut self.scheduler).await;
        // The listener has ended, so nothing adds mappings any more.
        let mut mappings = self.mappings.lock().drain();
        self.handle.shared.mappings_open.store(0, Ordering::Relaxed);
        for mapping in &mappings {
            mapping.task.abort();
        }
        for mapping in &mut mappings {
            let _ = (&mut mapping.task).await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.listener.abort();
        self.scheduler.abort();
        // Mappings abort their task when dropped; a mapping the listener adds after this
        // drain goes with the listener's table when its future is dropped.
        drop(self.mappings.lock().drain());
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

/// Why [`Relay::start`] failed. No task was started and no socket is left open.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen socket could not be bound or its address read.
    #[error("binding relay listen socket {listen}: {source}")]
    Bind {
        /// The address that was asked for.
        listen: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
}

/// Cheap, cloneable control of a running [`Relay`]. Outlives the relay harmlessly: after the
/// relay stops, setting faults has no effect and counters stay frozen.
#[derive(Clone)]
pub struct RelayHandle {
    shared: Arc<Shared>,
}

impl RelayHandle {
    /// Replaces the faults of both directions; applies from the next datagram on.
    pub fn set_faults(&self, faults: Faults) {
        self.shared.link(Way::Forward).lock().faults = faults.forward;
        self.shared.link(Way::Backward).lock().faults = faults.backward;
    }

    /// The faults currently in force.
    pub fn faults(&self) -> Faults {
        Faults {
            forward: self.shared.link(Way::Forward).lock().faults,
            backward: self.shared.link(Way::Backward).lock().faults,
        }
    }

    /// Drops every datagram in `direction` until [`RelayHandle::heal`]; other faults are kept.
    pub fn partition(&self, direction: Direction) {
        for way in direction.ways() {
            self.shared.link(*way).lock().faults.partitioned = true;
        }
    }

    /// Ends partitions in both directions; loss, delay and the other faults are kept.
    /// Use `set_faults(Faults::NONE)` to clear everything.
    pub fn heal(&self) {
        for way in Direction::Both.ways() {
            self.shared.link(*way).lock().faults.partitioned = false;
        }
    }

    /// A snapshot of the counters. Counters of one direction are read one by one, so a
    /// snapshot taken under traffic may be off by the datagrams in flight.
    pub fn stats(&self) -> RelayStats {
        self.shared.stats()
    }
}

impl std::fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayHandle").field("faults", &self.faults()).finish_non_exhaustive()
    }
}

/// Which way(s) a partition applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client → upstream (the direction of the dial).
    Forward,
    /// Upstream → client (replies).
    Backward,
    /// Both ways.
    Both,
}

impl Direction {
    fn ways(self) -> &'static [Way] {
        match self {
            Direction::Forward => &[Way::Forward],
            Direction::Backward => &[Way::Backward],
            Direction::Both => &[Way::Forward, Way::Backward],
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Faults and limits.
// ---------------------------------------------------------------------------------------------

/// Faults for both directions of a relay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Client → upstream.
    pub forward: LinkFaults,
    /// Upstream → client.
    pub backward: LinkFaults,
}

impl Faults {
    /// No faults: a transparent relay.
    pub const NONE: Faults = Faults { forward: LinkFaults::NONE, backward: LinkFaults::NONE };

    /// The same faults in both directions.
    pub const fn symmetric(link: LinkFaults) -> Faults {
        Faults { forward: link, backward: link }
    }
}

/// Faults for one direction. Applied in this order to each datagram: partition, loss, then
/// the survivor is delivered after `delay_ms` + uniform `[0, jitter_ms]`, possibly held back
/// another `reorder_hold_ms` (so later datagrams overtake it), possibly with one duplicate
/// (delivered after its own `delay_ms` + jitter, never held back).
///
/// Millisecond fields above [`DELAY_MS_MAX`] are treated as [`DELAY_MS_MAX`]. Jitter alone
/// can reorder datagrams too, as it does on a real network.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Drop everything.
    pub partitioned: bool,
    /// Probability that a datagram is dropped.
    pub loss: Probability,
    /// Base delay added to every datagram, in milliseconds.
    pub delay_ms: u32,
    /// Upper bound of the uniform extra delay, in milliseconds.
    pub jitter_ms: u32,
    /// Probability that a datagram is delivered twice.
    pub duplicate: Probability,
    /// Probability that a datagram is held back by `reorder_hold_ms`.
    pub reorder: Probability,
    /// How long a datagram chosen for reordering is held back, in milliseconds. With 0,
    /// reordering is off.
    pub reorder_hold_ms: u32,
}

impl LinkFaults {
    /// No faults.
    pub const NONE: LinkFaults = LinkFaults {
        partitioned: false,
        loss: Probability::ZERO,
        delay_ms: 0,
        jitter_ms: 0,
        duplicate: Probability::ZERO,
        reorder: Probability::ZERO,
        reorder_hold_ms: 0,
    };

    /// Drops everything.
    pub const PARTITIONED: LinkFaults = LinkFaults { partitioned: true, ..LinkFaults::NONE };
}

/// A probability in `[0.0, 1.0]`; constructing one is the only validation.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Probability(f64);

impl Probability {
    /// Never.
    pub const ZERO: Probability = Probability(0.0);
    /// Always.
    pub const ONE: Probability = Probability(1.0);

    /// `None` unless `0.0 <= p <= 1.0` (NaN is rejected).
    pub fn new(p: f64) -> Option<Probability> {
        (0.0..=1.0).contains(&p).then_some(Probability(p))
    }

    /// `pct` percent; values above 100 mean 100 %.
    pub const fn percent(pct: u8) -> Probability {
        let pct = if pct > 100 { 100 } else { pct };
        Probability(pct as f64 / 100.0)
    }

    /// The probability as a number in `[0.0, 1.0]`.
    pub const fn value(self) -> f64 {
        self.0
    }

    /// True with this probability, given a uniform draw in `[0, 1)`.
    fn hit(self, draw: f64) -> bool {
        draw < self.0
    }
}

/// Bounds on everything the relay holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Most client mappings (one upstream socket and task each). When full, the least recently
    /// active mapping is evicted to admit a new client.
    pub mappings_max: NonZeroUsize,
    /// A mapping with no traffic either way for this long is removed, in milliseconds.
    pub mapping_idle_ms: NonZeroU64,
    /// Most datagrams waiting in the timer queue (delayed, held back or duplicated).
    pub delay_queue_datagrams_max: NonZeroUsize,
    /// Most payload bytes waiting in the timer queue.
    pub delay_queue_bytes_max: NonZeroUsize,
}

impl Default for RelayLimits {
    fn default() -> Self {
        RelayLimits {
            mappings_max: NonZeroUsize::new(64).unwrap(),
            mapping_idle_ms: NonZeroU64::new(30_000).unwrap(),
            delay_queue_datagrams_max: NonZeroUsize::new(8_192).unwrap(),
            delay_queue_bytes_max: NonZeroUsize::new(32 * 1024 * 1024).unwrap(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Counters.
// ---------------------------------------------------------------------------------------------

/// Counters of a relay, for drill reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Client → upstream.
    pub forward: LinkStats,
    /// Upstream → client.
    pub backward: LinkStats,
    /// Client mappings currently open.
    pub mappings_open: u64,
    /// Mappings removed after being idle for `mapping_idle_ms`.
    pub mappings_expired: u64,
    /// Mappings evicted because the table was full.
    pub mappings_evicted: u64,
}

/// Counters of one direction. Once the timer queue is empty:
/// `received + duplicated == forwarded + dropped()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams received by the relay in this direction.
    pub received: u64,
    /// Copies handed to the kernel for sending (duplicates included).
    pub forwarded: u64,
    /// Datagrams dropped by a partition.
    pub dropped_partition: u64,
    /// Datagrams dropped by random loss.
    pub dropped_loss: u64,
    /// Copies dropped because a relay bound was reached (timer queue datagrams or bytes).
    pub dropped_queue_full: u64,
    /// Copies dropped because sending failed (kernel buffer full, ICMP error, no mapping
    /// socket could be opened).
    pub dropped_send_failed: u64,
    /// Extra copies created by duplication.
    pub duplicated: u64,
    /// Copies that went through the timer queue (any delay, hold or duplicate delay > 0).
    pub delayed: u64,
    /// Datagrams held back by `reorder_hold_ms`.
    pub reordered: u64,
}

impl LinkStats {
    /// All drops, whatever the cause.
    pub fn dropped(&self) -> u64 {
        self.dropped_partition + self.dropped_loss + self.dropped_queue_full + self.dropped_send_failed
    }
}

#[derive(Default)]
struct LinkCounters {
    received: AtomicU64,
    forwarded: AtomicU64,
    dropped_partition: AtomicU64,
    dropped_loss: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_send_failed: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    reordered: AtomicU64,
}

impl LinkCounters {
    fn snapshot(&self) -> LinkStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkStats {
            received: get(&self.received),
            forwarded: get(&self.forwarded),
            dropped_partition: get(&self.dropped_partition),
            dropped_loss: get(&self.dropped_loss),
            dropped_queue_full: get(&self.dropped_queue_full),
            dropped_send_failed: get(&self.dropped_send_failed),
            duplicated: get(&self.duplicated),
            delayed: get(&self.delayed),
            reordered: get(&self.reordered),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Sans-IO core: the verdict for one datagram.
// ---------------------------------------------------------------------------------------------

/// What happens to one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not delivered.
    Drop(DropCause),
    /// Delivered after `delay` (zero: immediately); `held_back` says whether `delay` includes
    /// a reorder hold; `duplicate` is the delay of a second copy, if any.
    Deliver { delay: Duration, held_back: bool, duplicate: Option<Duration> },
}

/// Why a [`Verdict`] dropped a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCause {
    /// The direction is partitioned.
    Partition,
    /// Random loss.
    Loss,
}

/// The decision maker for one direction: a seeded RNG and nothing else. No clock, no I/O.
#[derive(Debug)]
pub struct Shaper {
    rng: StdRng,
}

impl Shaper {
    /// A shaper whose decisions are fixed by `seed`.
    pub fn new(seed: u64) -> Shaper {
        Shaper { rng: StdRng::seed_from_u64(seed) }
    }

    /// The verdict for the next datagram under `faults`. Consumes exactly
    /// [`DRAWS_PER_DATAGRAM`] draws, so the n-th verdict does not depend on earlier outcomes.
    pub fn decide(&mut self, faults: &LinkFaults) -> Verdict {
        let draws: [f64; DRAWS_PER_DATAGRAM] = std::array::from_fn(|_| self.rng.gen::<f64>());
        let [loss, jitter, reorder, duplicate, duplicate_jitter] = draws;
        if faults.partitioned {
            return Verdict::Drop(DropCause::Partition);
        }
        if faults.loss.hit(loss) {
            return Verdict::Drop(DropCause::Loss);
        }
        let base = ms(faults.delay_ms);
        let jitter_max = ms(faults.jitter_ms);
        let hold = ms(faults.reorder_hold_ms);
        let held_back = !hold.is_zero() && faults.reorder.hit(reorder);
        let delay = base + jitter_max.mul_f64(jitter) + if held_back { hold } else { Duration::ZERO };
        let duplicate = faults.duplicate.hit(duplicate).then(|| base + jitter_max.mul_f64(duplicate_jitter));
        Verdict::Deliver { delay, held_back, duplicate }
    }
}

fn ms(value_ms: u32) -> Duration {
    Duration::from_millis(u64::from(value_ms.min(DELAY_MS_MAX)))
}

// ---------------------------------------------------------------------------------------------
// Shared state between tasks and handles.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Forward,
    Backward,
}

struct Link {
    faults: LinkFaults,
    shaper: Shaper,
}

struct Shared {
    forward: Mutex<Link>,
    backward: Mutex<Link>,
    forward_counters: LinkCounters,
    backward_counters: LinkCounters,
    mappings_open: AtomicU64,
    mappings_expired: AtomicU64,
    mappings_evicted: AtomicU64,
}

/// Separates the backward stream from the forward one (the golden-ratio constant).
const BACKWARD_SEED_OFFSET: u64 = 0x9E37_79B9_7F4A_7C15;

impl Shared {
    fn new(faults: Faults, seed: u64) -> Shared {
        Shared {
            forward: Mutex::new(Link { faults: faults.forward, shaper: Shaper::new(seed) }),
            backward: Mutex::new(Link {
                faults: faults.backward,
                shaper: Shaper::new(seed.wrapping_add(BACKWARD_SEED_OFFSET)),
            }),
            forward_counters: LinkCounters::default(),
            backward_counters: LinkCounters::default(),
            mappings_open: AtomicU64::new(0),
            mappings_expired: AtomicU64::new(0),
            mappings_evicted: AtomicU64::new(0),
        }
    }

    fn link(&self, way: Way) -> &Mutex<Link> {
        match way {
            Way::Forward => &self.forward,
            Way::Backward => &self.backward,
        }
    }

    fn counters(&self, way: Way) -> &LinkCounters {
        match way {
            Way::Forward => &self.forward_counters,
            Way::Backward => &self.backward_counters,
        }
    }

    /// Counts the datagram and returns its verdict; one lock per datagram.
    fn decide(&self, way: Way) -> Verdict {
        let counters = self.counters(way);
        bump(&counters.received);
        let verdict = {
            let mut link = self.link(way).lock();
            let faults = link.faults;
            link.shaper.decide(&faults)
        };
        match verdict {
            Verdict::Drop(DropCause::Partition) => bump(&counters.dropped_partition),
            Verdict::Drop(DropCause::Loss) => bump(&counters.dropped_loss),
            Verdict::Deliver { held_back, duplicate, .. } => {
                if held_back {
                    bump(&counters.reordered);
                }
                if duplicate.is_some() {
                    bump(&counters.duplicated);
                }
            }
        }
        verdict
    }

    fn stats(&self) -> RelayStats {
        RelayStats {
            forward: self.forward_counters.snapshot(),
            backward: self.backward_counters.snapshot(),
            mappings_open: self.mappings_open.load(Ordering::Relaxed),
            mappings_expired: self.mappings_expired.load(Ordering::Relaxed),
            mappings_evicted: self.mappings_evicted.load(Ordering::Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I/O: sending, the timer queue, the listener and the per-mapping tasks.
// ---------------------------------------------------------------------------------------------

/// Where a copy goes.
enum Target {
    /// To upstream, through a mapping's connected socket.
    Upstream(Arc<UdpSocket>),
    /// To a client, through the listen socket.
    Client { listen: Arc<UdpSocket>, client: SocketAddr },
}

impl Target {
    fn try_send(&self, payload: &[u8]) -> io::Result<usize> {
        match self {
            Target::Upstream(socket) => socket.try_send(payload),
            Target::Client { listen, client } => listen.try_send_to(payload, *client),
        }
    }
}

fn send_now(way: Way, target: &Target, payload: &[u8], shared: &Shared) {
    let counters = shared.counters(way);
    match target.try_send(payload) {
        Ok(_) => bump(&counters.forwarded),
        Err(error) => {
            tracing::trace!(?way, %error, "relay send failed");
            bump(&counters.dropped_send_failed);
        }
    }
}

/// Everything a receiving task needs to dispatch a verdict.
#[derive(Clone)]
struct Io {
    shared: Arc<Shared>,
    listen: Arc<UdpSocket>,
    queue_tx: mpsc::Sender<Pending>,
    budget: Arc<QueueBudget>,
}

impl Io {
    /// Decides and dispatches one received datagram.
    fn relay(&self, way: Way, payload: &[u8], target: impl Fn() -> Target) {
        let now = Instant::now();
        match self.shared.decide(way) {
            Verdict::Drop(_) => {}
            Verdict::Deliver { delay, held_back: _, duplicate } => {
                self.dispatch(way, now, delay, payload, target());
                if let Some(delay) = duplicate {
                    self.dispatch(way, now, delay, payload, target());
                }
            }
        }
    }

    fn dispatch(&self, way: Way, now: Instant, delay: Duration, payload: &[u8], target: Target) {
        if delay.is_zero() {
            send_now(way, &target, payload, &self.shared);
            return;
        }
        let counters = self.shared.counters(way);
        if !self.budget.try_reserve(payload.len()) {
            bump(&counters.dropped_queue_full);
            return;
        }
        let pending = Pending { deadline: now + delay, order: 0, way, target, payload: payload.to_vec() };
        match self.queue_tx.try_send(pending) {
            Ok(()) => bump(&counters.delayed),
            // Full cannot happen within the budget; closed means the relay is stopping.
            Err(_) => {
                self.budget.release(payload.len());
                bump(&counters.dropped_queue_full);
            }
        }
    }
}

/// What the timer queue holds, in datagrams and bytes; reserved before a copy is queued and
/// released once it is sent, so the limits hold across all producers.
struct QueueBudget {
    datagrams: AtomicUsize,
    bytes: AtomicUsize,
    datagrams_max: usize,
    bytes_max: usize,
}

impl QueueBudget {
    fn new(limits: RelayLimits) -> QueueBudget {
        QueueBudget {
            datagrams: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            datagrams_max: limits.delay_queue_datagrams_max.get(),
            bytes_max: limits.delay_queue_bytes_max.get(),
        }
    }

    fn try_reserve(&self, len: usize) -> bool {
        let datagrams = self.datagrams.fetch_add(1, Ordering::AcqRel) + 1;
        let bytes = self.bytes.fetch_add(len, Ordering::AcqRel).saturating_add(len);
        if datagrams > self.datagrams_max || bytes > self.bytes_max {
            self.release(len);
            return false;
        }
        true
    }

    fn release(&self, len: usize) {
        self.datagrams.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(len, Ordering::AcqRel);
    }
}

/// A copy waiting in the timer queue.
struct Pending {
    deadline: Instant,
    /// Arrival order at the scheduler: equal deadlines leave in arrival order.
    order: u64,
    way: Way,
    target: Target,
    payload: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest deadline first.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.deadline, other.order).cmp(&(self.deadline, self.order))
    }
}

/// Sends queued copies when their deadline passes. Holds what the budget admitted, no more.
async fn run_scheduler(mut queue_rx: mpsc::Receiver<Pending>, shared: Arc<Shared>, budget: Arc<QueueBudget>) {
    let mut heap: BinaryHeap<Pending> = BinaryHeap::new();
    let mut order: u64 = 0;
    loop {
        let next_deadline = heap.peek().map(|pending| pending.deadline);
        tokio::select! {
            received = queue_rx.recv() => {
                let Some(mut pending) = received else { return };
                pending.order = order;
                order = order.wrapping_add(1);
                heap.push(pending);
            }
            () = sleep_until(next_deadline) => {
                let now = Instant::now();
                while heap.peek().is_some_and(|pending| pending.deadline <= now) {
                    let Some(pending) = heap.pop() else { break };
                    send_now(pending.way, &pending.target, &pending.payload, &shared);
                    budget.release(pending.payload.len());
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// One client's upstream socket and the task receiving replies on it.
struct Mapping {
    socket: Arc<UdpSocket>,
    activity: Arc<Activity>,
    task: JoinHandle<()>,
}

impl Drop for Mapping {
    /// A mapping never outlives its entry: a detached task would keep the listen socket open.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Last traffic on a mapping, in milliseconds since the relay started.
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    fn idle(&self, now: Instant) -> Duration {
        let last = self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }
}

struct MappingTable {
    mappings: HashMap<SocketAddr, Mapping>,
    limits: RelayLimits,
}

impl MappingTable {
    fn new(limits: RelayLimits) -> MappingTable {
        MappingTable { mappings: HashMap::new(), limits }
    }

    /// Removes every mapping.
    fn drain(&mut self) -> Vec<Mapping> {
        self.mappings.drain().map(|(_, mapping)| mapping).collect()
    }

    fn remove(&mut self, client: &SocketAddr) {
        // Dropping the mapping aborts its task.
        self.mappings.remove(client);
    }

    /// Removes mappings idle for longer than the limit; returns how many.
    fn expire(&mut self, now: Instant) -> u64 {
        let idle_max = Duration::from_millis(self.limits.mapping_idle_ms.get());
        let expired: Vec<SocketAddr> = self
            .mappings
            .iter()
            .filter(|(_, mapping)| mapping.activity.idle(now) >= idle_max)
            .map(|(client, _)| *client)
            .collect();
        for client in &expired {
            self.remove(client);
        }
        expired.len() as u64
    }

    /// Makes room for one more mapping; returns whether a mapping was evicted.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.mappings.len() < self.limits.mappings_max.get() {
            return false;
        }
        let oldest = self
            .mappings
            .iter()
            .max_by_key(|(_, mapping)| mapping.activity.idle(now))
            .map(|(client, _)| *client);
        match oldest {
            Some(client) => {
                self.remove(&client);
                true
            }
            None => false,
        }
    }
}

/// Receives from clients, keeps the mapping table, applies forward faults.
async fn run_listener(io: Io, upstream: SocketAddr, mappings: Arc<Mutex<MappingTable>>, limits: RelayLimits) {
    let epoch = Instant::now();
    let idle_max = Duration::from_millis(limits.mapping_idle_ms.get());
    let sweep_period = (idle_max / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut sweep = tokio::time::interval(sweep_period);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        tokio::select! {
            received = io.listen.recv_from(&mut buf) => {
                let (len, client) = match received {
                    Ok(received) => received,
                    Err(error) => {
                        // Per-datagram errors (ICMP reports and the like); the socket stays usable.
                        tracing::trace!(%error, "relay listen recv failed");
                        continue;
                    }
                };
                let payload = &buf[..len];
                let socket = match mapping_for(&io, client, upstream, &mappings, epoch).await {
                    Ok(socket) => socket,
                    Err(error) => {
                        tracing::debug!(%client, %error, "relay could not open an upstream socket");
                        let counters = io.shared.counters(Way::Forward);
                        bump(&counters.received);
                        bump(&counters.dropped_send_failed);
                        continue;
                    }
                };
                io.relay(Way::Forward, payload, || Target::Upstream(Arc::clone(&socket)));
            }
            _ = sweep.tick() => {
                let expired = mappings.lock().expire(Instant::now());
                if expired > 0 {
                    io.shared.mappings_expired.fetch_add(expired, Ordering::Relaxed);
                    io.shared.mappings_open.fetch_sub(expired, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The upstream socket for `client`, opening a mapping if there is none.
async fn mapping_for(
    io: &Io,
    client: SocketAddr,
    upstream: SocketAddr,
    mappings: &Mutex<MappingTable>,
    epoch: Instant,
) -> io::Result<Arc<UdpSocket>> {
    if let Some(mapping) = mappings.lock().mappings.get(&client) {
        mapping.activity.touch();
        return Ok(Arc::clone(&mapping.socket));
    }
    let unspecified: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(unspecified).await?;
    socket.connect(upstream).await?;
    // Sends are `try_send`, which consults cached readiness; learn it once up front.
    socket.writable().await?;
    let socket = Arc::new(socket);
    let activity = Arc::new(Activity { epoch, last_ms: AtomicU64::new(0) });
    activity.touch();
    let task = tokio::spawn(run_mapping(io.clone(), client, Arc::clone(&socket), Arc::clone(&activity)));
    let mut table = mappings.lock();
    if table.make_room(Instant::now()) {
        io.shared.mappings_evicted.fetch_add(1, Ordering::Relaxed);
        io.shared.mappings_open.fetch_sub(1, Ordering::Relaxed);
    }
    table.mappings.insert(client, Mapping { socket: Arc::clone(&socket), activity, task });
    io.shared.mappings_open.fetch_add(1, Ordering::Relaxed);
    Ok(socket)
}

/// Receives replies from upstream for one client and applies backward faults.
async fn run_mapping(io: Io, client: SocketAddr, socket: Arc<UdpSocket>, activity: Arc<Activity>) {
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let len = match socket.recv(&mut buf).await {
            Ok(len) => len,
            Err(error) => {
                // Typically ECONNREFUSED from an ICMP port-unreachable while upstream is down;
                // the next datagram may well succeed.
                tracing::trace!(%client, %error, "relay upstream recv failed");
                continue;
            }
        };
        activity.touch();
        let listen = &io.listen;
        io.relay(Way::Backward, &buf[..len], || Target::Client { listen: Arc::clone(listen), client });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdicts(seed: u64, faults: &LinkFaults, n: usize) -> Vec<Verdict> {
        let mut shaper = Shaper::new(seed);
        (0..n).map(|_| shaper.decide(faults)).collect()
    }

    #[test]
    fn no_faults_deliver_immediately() {
        for verdict in verdicts(1, &LinkFaults::NONE, 100) {
            assert_eq!(
                verdict,
                Verdict::Deliver { delay: Duration::ZERO, held_back: false, duplicate: None }
            );
        }
    }

    #[test]
    fn partition_drops_everything_even_without_loss() {
        for verdict in verdicts(1, &LinkFaults::PARTITIONED, 100) {
            assert_eq!(verdict, Verdict::Drop(DropCause::Partition));
        }
    }

    #[test]
    fn same_seed_same_verdicts_and_different_seed_differs() {
        let faults = LinkFaults {
            loss: Probability::percent(30),
            delay_ms: 5,
            jitter_ms: 10,
            duplicate: Probability::percent(20),
            reorder: Probability::percent(20),
            reorder_hold_ms: 7,
            ..LinkFaults::NONE
        };
        assert_eq!(verdicts(7, &faults, 500), verdicts(7, &faults, 500));
        assert_ne!(verdicts(7, &faults, 500), verdicts(8, &faults, 500));
    }

    #[test]
    fn nth_verdict_does_not_depend_on_earlier_outcomes() {
        // A partition for the first 10 datagrams must not shift the loss decisions after it.
        let lossy = LinkFaults { loss: Probability::percent(50), ..LinkFaults::NONE };
        let mut plain = Shaper::new(3);
        let mut partitioned_first = Shaper::new(3);
        for _ in 0..10 {
            plain.decide(&lossy);
            partitioned_first.decide(&LinkFaults::PARTITIONED);
        }
        for _ in 0..100 {
            assert_eq!(plain.decide(&lossy), partitioned_first.decide(&lossy));
        }
    }

    #[test]
    fn delay_stays_within_base_plus_jitter_plus_hold() {
        let faults = LinkFaults {
            delay_ms: 10,
            jitter_ms: 5,
            duplicate: Probability::ONE,
            reorder: Probability::percent(50),
            reorder_hold_ms: 100,
            ..LinkFaults::NONE
        };
        let (mut held, mut not_held) = (0, 0);
        for verdict in verdicts(9, &faults, 1000) {
            let Verdict::Deliver { delay, held_back, duplicate } = verdict else {
                panic!("no loss configured, got {verdict:?}");
            };
            let hold = if held_back { Duration::from_millis(100) } else { Duration::ZERO };
            assert!(delay >= Duration::from_millis(10) + hold, "{delay:?}");
            assert!(delay <= Duration::from_millis(15) + hold, "{delay:?}");
            let duplicate = duplicate.expect("duplicate probability is one");
            assert!((Duration::from_millis(10)..=Duration::from_millis(15)).contains(&duplicate));
            if held_back {
                held += 1;
            } else {
                not_held += 1;
            }
        }
        assert!(held > 400 && not_held > 400, "held {held}, not held {not_held}");
    }

    #[test]
    fn millisecond_fields_are_clamped() {
        let faults = LinkFaults { delay_ms: u32::MAX, ..LinkFaults::NONE };
        let Verdict::Deliver { delay, .. } = Shaper::new(0).decide(&faults) else { panic!("delivered") };
        assert_eq!(delay, Duration::from_millis(u64::from(DELAY_MS_MAX)));
    }

    #[test]
    fn probability_rejects_out_of_range_and_nan() {
        assert_eq!(Probability::new(-0.1), None);
        assert_eq!(Probability::new(1.1), None);
        assert_eq!(Probability::new(f64::NAN), None);
        assert_eq!(Probability::new(0.25).map(Probability::value), Some(0.25));
        assert_eq!(Probability::percent(250), Probability::ONE);
    }

    #[test]
    fn zero_and_one_probabilities_are_exact() {
        // Draws are in [0, 1): ZERO never hits and ONE always hits.
        assert!(!Probability::ZERO.hit(0.0));
        assert!(Probability::ONE.hit(0.999_999_999));
    }
}
