//! Client mappings: the listener task receives from clients and applies forward faults; per
//! client an upstream socket and a task that applies backward faults; the bounded table
//! (idle mappings expire, the least recently active is evicted when it is full).

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::io::{Io, Target};
use super::shared::Way;
use super::stats::bump;
use super::{RelayLimits, DATAGRAM_BYTES_MAX};

/// One client's upstream socket and the task receiving replies on it.
pub(super) struct Mapping {
    socket: Arc<UdpSocket>,
    activity: Arc<Activity>,
    pub(super) task: JoinHandle<()>,
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

pub(super) struct MappingTable {
    mappings: HashMap<SocketAddr, Mapping>,
    limits: RelayLimits,
}

impl MappingTable {
    pub(super) fn new(limits: RelayLimits) -> MappingTable {
        MappingTable { mappings: HashMap::new(), limits }
    }

    /// Removes every mapping.
    pub(super) fn drain(&mut self) -> Vec<Mapping> {
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
pub(super) async fn run_listener(
    io: Io,
    upstream: Arc<Mutex<SocketAddr>>,
    mappings: Arc<Mutex<MappingTable>>,
    limits: RelayLimits,
) {
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
                let to = *upstream.lock();
                let socket = match mapping_for(&io, client, to, &mappings, epoch).await {
                    Ok(socket) => socket,
                    Err(error) => {
                        tracing::debug!(%client, %error, "relay could not open an upstream socket");
                        let counters = io.shared.counters(Way::Forward);
                        bump(&counters.received);
                        bump(&counters.dropped_send_failed);
                        continue;
                    }
                };
                if *upstream.lock() != to {
                    // Moved while this mapping was being opened: drop it; the client's next
                    // datagram opens one to the new upstream.
                    if mappings.lock().mappings.remove(&client).is_some() {
                        io.shared.mappings_open.fetch_sub(1, Ordering::Relaxed);
                    }
                    continue;
                }
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
