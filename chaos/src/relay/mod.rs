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
//!
//! # Where things are
//!
//! - This file: the [`Relay`], its [`RelayHandle`] and [`Direction`].
//! - `faults`: [`Faults`], [`LinkFaults`], [`Probability`] and the bounds ([`RelayLimits`]).
//! - `stats`: the counters ([`RelayStats`], [`LinkStats`]).
//! - `shaper`: the sans-IO core ([`Shaper`], [`Verdict`]).
//! - `shared`: the state the tasks and handles share (faults in force, shapers, counters).
//! - `io`: sending, and the bounded timer queue of delayed datagrams.
//! - `mappings`: the listener, the bounded table of client mappings and their tasks.

mod faults;
mod io;
mod mappings;
mod shaper;
mod shared;
mod stats;

#[cfg(test)]
mod tests;

use std::io as stdio;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use faults::{Faults, LinkFaults, Probability, RelayLimits};
pub use shaper::{DropCause, Shaper, Verdict};
pub use stats::{LinkStats, RelayStats};

use io::{run_scheduler, Io, QueueBudget};
use mappings::{run_listener, MappingTable};
use shared::{Shared, Way};

/// Largest datagram the relay receives; the UDP payload limit, so nothing is ever truncated.
pub const DATAGRAM_BYTES_MAX: usize = 65_535;

/// Upper bound on every millisecond field of [`LinkFaults`]; larger values are clamped.
pub const DELAY_MS_MAX: u32 = 60_000;

/// Random draws each datagram consumes in a direction, whatever its verdict.
pub const DRAWS_PER_DATAGRAM: usize = 5;

/// A running UDP fault relay. Dropping it (or [`Relay::shutdown`]) stops every task.
pub struct Relay {
    local_addr: SocketAddr,
    handle: RelayHandle,
    mappings: Arc<Mutex<MappingTable>>,
    /// Where new mappings connect to ([`Relay::set_upstream`] moves it).
    upstream: Arc<Mutex<SocketAddr>>,
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
        let upstream = Arc::new(Mutex::new(upstream));
        let scheduler = tokio::spawn(run_scheduler(queue_rx, Arc::clone(&shared), budget));
        let listener = tokio::spawn(run_listener(io, Arc::clone(&upstream), Arc::clone(&mappings), limits));
        Ok(Relay { local_addr, handle: RelayHandle { shared }, mappings, upstream, listener, scheduler })
    }

    /// Relays to `upstream` from now on (a replacement process took over the DC): every
    /// mapping is dropped, so each client's next datagram opens one to the new upstream.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock() = upstream;
        let dropped = self.mappings.lock().drain();
        self.handle.shared.mappings_open.fetch_sub(dropped.len() as u64, Ordering::Relaxed);
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
        source: stdio::Error,
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
