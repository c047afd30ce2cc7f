//! The fault relay over real UDP sockets on 127.0.0.1.
//!
//! Every wait is bounded by `tokio::time::timeout`. Where a test must show that something did
//! *not* arrive, it first waits for the relay's counters to prove the drop happened, so the
//! short "nothing arrives" window only guards against a bug, not against scheduling.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::{NonZeroU64, NonZeroUsize};
use std::time::Duration;

use tandem_chaos::relay::{
    Direction, Faults, LinkFaults, LinkStats, Probability, Relay, RelayHandle, RelayLimits, RelayStats,
};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

const WAIT: Duration = Duration::from_secs(2);
const QUIET: Duration = Duration::from_millis(50);

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn socket() -> UdpSocket {
    UdpSocket::bind(localhost()).await.unwrap()
}

/// An upstream that echoes every datagram to its sender; stops when dropped.
struct Echo {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Echo {
    async fn start() -> Echo {
        let socket = socket().await;
        let addr = socket.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65_535];
            while let Ok((len, from)) = socket.recv_from(&mut buf).await {
                let _ = socket.send_to(&buf[..len], from).await;
            }
        });
        Echo { addr, task }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn recv(socket: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = vec![0u8; 65_535];
    let (len, from) = timeout(WAIT, socket.recv_from(&mut buf)).await.expect("datagram in time").unwrap();
    buf.truncate(len);
    (buf, from)
}

async fn assert_quiet(socket: &UdpSocket) {
    let mut buf = vec![0u8; 65_535];
    if let Ok(received) = timeout(QUIET, socket.recv_from(&mut buf)).await {
        panic!("expected nothing, got {received:?}");
    }
}

/// Polls the counters until `done` holds; bounded by `WAIT`.
async fn wait_for(handle: &RelayHandle, done: impl Fn(&RelayStats) -> bool) -> RelayStats {
    timeout(WAIT, async {
        loop {
            let stats = handle.stats();
            if done(&stats) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("counters never reached the condition: {:?}", handle.stats()))
}

/// Once the timer queue is empty, every datagram is accounted for.
fn assert_accounted(link: &LinkStats) {
    assert_eq!(link.received + link.duplicated, link.forwarded + link.dropped(), "{link:?}");
}

fn seq(n: u32) -> [u8; 4] {
    n.to_be_bytes()
}

fn unseq(payload: &[u8]) -> u32 {
    u32::from_be_bytes(payload.try_into().expect("4-byte sequence number"))
}

/// A relay in front of a raw upstream socket, with one client whose mapping is established;
/// returns the relay's upstream-side address for that client.
async fn relay_with_raw_upstream(faults: Faults) -> (Relay, UdpSocket, UdpSocket, SocketAddr) {
    let upstream = socket().await;
    let relay = Relay::start(localhost(), upstream.local_addr().unwrap(), faults, 1).await.unwrap();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();
    client.send(b"hello").await.unwrap();
    let (payload, mapped) = recv(&upstream).await;
    assert_eq!(payload, b"hello");
    (relay, upstream, client, mapped)
}

#[tokio::test]
async fn passes_datagrams_through_both_ways_including_empty_and_maximum_size() {
    let echo = Echo::start().await;
    let relay = Relay::start(localhost(), echo.addr, Faults::NONE, 1).await.unwrap();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    // 65_507 is the largest UDP payload over IPv4.
    for payload in [b"ping".to_vec(), Vec::new(), vec![0xA5; 65_507]] {
        client.send(&payload).await.unwrap();
        let (echoed, from) = recv(&client).await;
        assert_eq!(echoed, payload);
        assert_eq!(from, relay.local_addr());
    }

    let stats = relay.handle().stats();
    assert_eq!(stats.forward.received, 3);
    assert_eq!(stats.forward.forwarded, 3);
    assert_eq!(stats.backward.forwarded, 3);
    assert_eq!(stats.mappings_open, 1);
    assert_accounted(&stats.forward);
    assert_accounted(&stats.backward);
}

#[tokio::test]
async fn each_client_gets_its_own_mapping_and_its_own_replies() {
    let echo = Echo::start().await;
    let relay = Relay::start(localhost(), echo.addr, Faults::NONE, 1).await.unwrap();
    let (a, b) = (socket().await, socket().await);
    a.connect(relay.local_addr()).await.unwrap();
    b.connect(relay.local_addr()).await.unwrap();

    for round in 0..3u8 {
        a.send(&[b'a', round]).await.unwrap();
        b.send(&[b'b', round]).await.unwrap();
        assert_eq!(recv(&a).await.0, [b'a', round]);
        assert_eq!(recv(&b).await.0, [b'b', round]);
    }
    assert_eq!(relay.handle().stats().mappings_open, 2);
}

#[tokio::test]
async fn full_partition_drops_both_ways_and_heal_restores() {
    let (relay, upstream, client, mapped) = relay_with_raw_upstream(Faults::NONE).await;
    let handle = relay.handle();
    handle.partition(Direction::Both);
    assert!(handle.faults().forward.partitioned && handle.faults().backward.partitioned);

    client.send(b"lost forward").await.unwrap();
    upstream.send_to(b"lost backward", mapped).await.unwrap();
    wait_for(&handle, |s| s.forward.dropped_partition == 1 && s.backward.dropped_partition == 1).await;
    assert_quiet(&upstream).await;
    assert_quiet(&client).await;

    handle.heal();
    assert_eq!(handle.faults(), Faults::NONE);
    client.send(b"forward again").await.unwrap();
    assert_eq!(recv(&upstream).await, (b"forward again".to_vec(), mapped));
    upstream.send_to(b"backward again", mapped).await.unwrap();
    assert_eq!(recv(&client).await.0, b"backward again");
}

#[tokio::test]
async fn forward_partition_drops_only_client_to_upstream() {
    let (relay, upstream, client, mapped) = relay_with_raw_upstream(Faults::NONE).await;
    let handle = relay.handle();
    handle.partition(Direction::Forward);

    client.send(b"lost").await.unwrap();
    wait_for(&handle, |s| s.forward.dropped_partition == 1).await;
    assert_quiet(&upstream).await;

    upstream.send_to(b"still flows", mapped).await.unwrap();
    assert_eq!(recv(&client).await.0, b"still flows");
    assert_eq!(handle.stats().backward.dropped(), 0);
}

#[tokio::test]
async fn backward_partition_drops_only_upstream_to_client() {
    let (relay, upstream, client, mapped) = relay_with_raw_upstream(Faults::NONE).await;
    let handle = relay.handle();
    handle.partition(Direction::Backward);

    upstream.send_to(b"lost", mapped).await.unwrap();
    wait_for(&handle, |s| s.backward.dropped_partition == 1).await;
    assert_quiet(&client).await;

    client.send(b"still flows").await.unwrap();
    assert_eq!(recv(&upstream).await.0, b"still flows");
    assert_eq!(handle.stats().forward.dropped(), 0);
}

/// Sends `total` numbered datagrams in paced batches (so no kernel buffer overflows and the
/// relay sees them in order) and returns the sequence numbers upstream received, in order.
async fn run_lossy(seed: u64, total: u32) -> (Vec<u32>, LinkStats) {
    let upstream = socket().await;
    let faults = Faults {
        forward: LinkFaults { loss: Probability::percent(50), ..LinkFaults::NONE },
        backward: LinkFaults::NONE,
    };
    let relay = Relay::start(localhost(), upstream.local_addr().unwrap(), faults, seed).await.unwrap();
    let handle = relay.handle();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    let mut delivered = Vec::new();
    let mut sent = 0;
    while sent < total {
        let batch_end = (sent + 100).min(total);
        for n in sent..batch_end {
            client.send(&seq(n)).await.unwrap();
        }
        sent = batch_end;
        let stats = wait_for(&handle, |s| s.forward.forwarded + s.forward.dropped() == u64::from(sent)).await;
        while (delivered.len() as u64) < stats.forward.forwarded {
            delivered.push(unseq(&recv(&upstream).await.0));
        }
    }
    assert_quiet(&upstream).await;
    relay.shutdown().await;
    (delivered, handle.stats().forward)
}

#[tokio::test]
async fn loss_drops_about_half_and_replays_exactly_from_the_seed() {
    let (first, stats) = run_lossy(42, 2000).await;
    assert_eq!(stats.received, 2000);
    assert_eq!(stats.dropped_loss, stats.dropped());
    assert!((850..=1150).contains(&stats.dropped_loss), "{stats:?}");
    assert_eq!(first.len() as u64, stats.forwarded);
    assert_accounted(&stats);
    assert!(first.windows(2).all(|w| w[0] < w[1]), "loss alone never reorders");

    let (replay, replay_stats) = run_lossy(42, 2000).await;
    assert_eq!(replay, first, "same seed, same datagrams lost");
    assert_eq!(replay_stats, stats);

    let (other, _) = run_lossy(43, 2000).await;
    assert_ne!(other, first, "another seed loses other datagrams");
}

#[tokio::test]
async fn delay_adds_at_least_the_base_delay_each_way() {
    let echo = Echo::start().await;
    let faults = Faults {
        forward: LinkFaults { delay_ms: 40, jitter_ms: 10, ..LinkFaults::NONE },
        backward: LinkFaults { delay_ms: 20, ..LinkFaults::NONE },
    };
    let relay = Relay::start(localhost(), echo.addr, faults, 1).await.unwrap();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    for _ in 0..3 {
        let started = Instant::now();
        client.send(b"ping").await.unwrap();
        assert_eq!(recv(&client).await.0, b"ping");
        let rtt = started.elapsed();
        assert!(rtt >= Duration::from_millis(60), "rtt {rtt:?} below 40 + 20 ms");
        assert!(rtt < Duration::from_millis(500), "rtt {rtt:?} far above 40 + 10 + 20 ms");
    }
    let stats = relay.handle().stats();
    assert_eq!((stats.forward.delayed, stats.backward.delayed), (3, 3));
}

#[tokio::test]
async fn a_held_back_datagram_does_not_block_the_ones_behind_it() {
    let hold_first = Faults {
        forward: LinkFaults { reorder: Probability::ONE, reorder_hold_ms: 300, ..LinkFaults::NONE },
        backward: LinkFaults::NONE,
    };
    let (relay, upstream, client, _) = relay_with_raw_upstream(Faults::NONE).await;
    let handle = relay.handle();
    handle.set_faults(hold_first);

    client.send(b"held").await.unwrap();
    wait_for(&handle, |s| s.forward.reordered == 1).await;
    handle.set_faults(Faults::NONE);
    let started = Instant::now();
    client.send(b"overtakes").await.unwrap();

    assert_eq!(recv(&upstream).await.0, b"overtakes");
    assert!(started.elapsed() < Duration::from_millis(250), "waited behind the held datagram");
    assert_eq!(recv(&upstream).await.0, b"held");
    let stats = handle.stats();
    assert_eq!((stats.forward.reordered, stats.forward.delayed), (1, 1));
}

#[tokio::test]
async fn duplication_delivers_each_datagram_twice() {
    let faults = Faults {
        forward: LinkFaults { duplicate: Probability::ONE, ..LinkFaults::NONE },
        backward: LinkFaults::NONE,
    };
    let (relay, upstream, client, _) = relay_with_raw_upstream(faults).await;
    // The "hello" that set up the mapping was duplicated too.
    assert_eq!(recv(&upstream).await.0, b"hello");

    for n in 0..20 {
        client.send(&seq(n)).await.unwrap();
    }
    let mut copies: BTreeMap<u32, u32> = BTreeMap::new();
    for _ in 0..40 {
        *copies.entry(unseq(&recv(&upstream).await.0)).or_default() += 1;
    }
    assert_eq!(copies, (0..20).map(|n| (n, 2)).collect::<BTreeMap<_, _>>());
    assert_quiet(&upstream).await;

    let stats = relay.handle().stats().forward;
    assert_eq!((stats.received, stats.duplicated, stats.forwarded), (21, 21, 42));
    assert_accounted(&stats);
}

#[tokio::test]
async fn reordering_changes_the_order_but_loses_nothing() {
    let faults = Faults {
        forward: LinkFaults { reorder: Probability::percent(30), reorder_hold_ms: 20, ..LinkFaults::NONE },
        backward: LinkFaults::NONE,
    };
    let upstream = socket().await;
    let relay = Relay::start(localhost(), upstream.local_addr().unwrap(), faults, 5).await.unwrap();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    for n in 0..50 {
        client.send(&seq(n)).await.unwrap();
    }
    let mut received = Vec::new();
    for _ in 0..50 {
        received.push(unseq(&recv(&upstream).await.0));
    }

    let mut sorted = received.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>(), "nothing lost or duplicated");
    assert_ne!(received, sorted, "some datagrams were overtaken");
    let stats = relay.handle().stats().forward;
    assert!(stats.reordered > 0 && stats.reordered < 50, "{stats:?}");
    assert_eq!(stats.delayed, stats.reordered);
    assert_accounted(&stats);
}

#[tokio::test]
async fn a_full_timer_queue_drops_and_counts() {
    let upstream = socket().await;
    let limits =
        RelayLimits { delay_queue_datagrams_max: NonZeroUsize::new(4).unwrap(), ..RelayLimits::default() };
    let faults =
        Faults { forward: LinkFaults { delay_ms: 300, ..LinkFaults::NONE }, backward: LinkFaults::NONE };
    let relay = Relay::start_with_limits(localhost(), upstream.local_addr().unwrap(), faults, 1, limits)
        .await
        .unwrap();
    let handle = relay.handle();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    for n in 0..20 {
        client.send(&seq(n)).await.unwrap();
    }
    let stats = wait_for(&handle, |s| s.forward.received == 20).await;
    assert_eq!((stats.forward.delayed, stats.forward.dropped_queue_full), (4, 16));
    for n in 0..4 {
        assert_eq!(unseq(&recv(&upstream).await.0), n, "delay without jitter keeps order");
    }
    assert_accounted(&wait_for(&handle, |s| s.forward.forwarded == 4).await.forward);
}

#[tokio::test]
async fn idle_mappings_expire_and_come_back_on_new_traffic() {
    let echo = Echo::start().await;
    let limits = RelayLimits { mapping_idle_ms: NonZeroU64::new(50).unwrap(), ..RelayLimits::default() };
    let relay = Relay::start_with_limits(localhost(), echo.addr, Faults::NONE, 1, limits).await.unwrap();
    let handle = relay.handle();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();

    client.send(b"one").await.unwrap();
    assert_eq!(recv(&client).await.0, b"one");
    let stats = wait_for(&handle, |s| s.mappings_expired == 1).await;
    assert_eq!(stats.mappings_open, 0);

    client.send(b"two").await.unwrap();
    assert_eq!(recv(&client).await.0, b"two");
    assert_eq!(handle.stats().mappings_open, 1);
}

#[tokio::test]
async fn a_full_mapping_table_evicts_the_least_recently_active_client() {
    let echo = Echo::start().await;
    let limits = RelayLimits { mappings_max: NonZeroUsize::new(1).unwrap(), ..RelayLimits::default() };
    let relay = Relay::start_with_limits(localhost(), echo.addr, Faults::NONE, 1, limits).await.unwrap();
    let (a, b) = (socket().await, socket().await);
    a.connect(relay.local_addr()).await.unwrap();
    b.connect(relay.local_addr()).await.unwrap();

    for (client, payload) in [(&a, b"a1"), (&b, b"b1"), (&a, b"a2")] {
        client.send(payload).await.unwrap();
        assert_eq!(recv(client).await.0, payload);
    }
    let stats = relay.handle().stats();
    assert_eq!((stats.mappings_open, stats.mappings_evicted), (1, 2));
}

#[tokio::test]
async fn shutdown_stops_the_relay_and_frees_its_port() {
    let echo = Echo::start().await;
    let relay = Relay::start(localhost(), echo.addr, Faults::NONE, 1).await.unwrap();
    let handle = relay.handle();
    let addr = relay.local_addr();
    let client = socket().await;
    client.connect(addr).await.unwrap();
    client.send(b"ping").await.unwrap();
    assert_eq!(recv(&client).await.0, b"ping");

    relay.shutdown().await;
    UdpSocket::bind(addr).await.expect("listen port is free after shutdown");
    handle.set_faults(Faults::NONE); // A handle outliving its relay is harmless.
    assert_eq!(handle.stats().forward.received, 1);
}

#[tokio::test]
async fn dropping_the_relay_stops_relaying() {
    let echo = Echo::start().await;
    let relay = Relay::start(localhost(), echo.addr, Faults::NONE, 1).await.unwrap();
    let handle = relay.handle();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();
    drop(relay);
    // Let the aborted tasks unwind; the datagram below must not be relayed either way.
    tokio::task::yield_now().await;
    let _ = client.send(b"ping").await;
    let mut buf = [0u8; 16];
    match timeout(QUIET, client.recv(&mut buf)).await {
        Err(_) => {}
        // ICMP port unreachable: the listen socket is already closed.
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {}
        Ok(other) => panic!("expected nothing, got {other:?}"),
    }
    assert_eq!(handle.stats().forward.received, 0);
}

#[tokio::test]
async fn a_moved_upstream_gets_the_next_datagrams_of_every_client() {
    // The split-incarnation drill moves a DC's replication address to its replacement.
    let old = socket().await;
    let new = socket().await;
    let relay = Relay::start(localhost(), old.local_addr().unwrap(), Faults::NONE, 1).await.unwrap();
    let client = socket().await;
    client.connect(relay.local_addr()).await.unwrap();
    client.send(b"one").await.unwrap();
    assert_eq!(recv(&old).await.0, b"one");
    relay.set_upstream(new.local_addr().unwrap());
    assert_eq!(relay.handle().stats().mappings_open, 0, "the old mappings are gone");
    client.send(b"two").await.unwrap();
    let (got, from) = recv(&new).await;
    assert_eq!(got, b"two");
    assert_quiet(&old).await;
    // Replies of the new upstream reach the client through the relay.
    new.send_to(b"back", from).await.unwrap();
    assert_eq!(recv(&client).await.0, b"back");
}
