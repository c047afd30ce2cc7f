//! The member link on loopback with real certificates: members of one DC call each other;
//! a node of another DC, a node that is not a member and a DC's certificate are refused on
//! the member link, and a node's certificate on the DC replication link; the frame limit,
//! an unreachable member and a restarted member.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::{client_config, StartError};
use super::*;
use crate::gateway::{Admission, SourceRule, TransportTuning};
use crate::tls::{
    self, generate_dev_node_certs, generate_dev_pki, peer_dc, NameRule, ReloadableTls, TlsError, TlsMaterial,
    TlsPaths,
};

const WITHIN: Duration = Duration::from_secs(5);

/// Answers `<from>:` and the request.
struct Echo;

impl Handler for Echo {
    async fn handle(&self, from: u64, request: Vec<u8>) -> Vec<u8> {
        let mut answer = format!("{from}:").into_bytes();
        answer.extend_from_slice(&request);
        answer
    }
}

struct Pki {
    _dir: tempfile::TempDir,
    dc_a: TlsPaths,
    nodes_a: Vec<TlsPaths>,
    node_b1: TlsPaths,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let dcs = generate_dev_pki(dir.path(), &["dc-a", "dc-b"], false).unwrap();
    let nodes_a = generate_dev_node_certs(dir.path(), "dc-a", &[1, 2, 3], false).unwrap();
    let nodes_b = generate_dev_node_certs(dir.path(), "dc-b", &[1], false).unwrap();
    Pki {
        dc_a: dcs.paths("dc-a").unwrap().clone(),
        nodes_a: nodes_a.into_iter().map(|(_, p)| p).collect(),
        node_b1: nodes_b[0].1.clone(),
        _dir: dir,
    }
}

fn free_addr() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

fn start(
    paths: &TlsPaths,
    listen: SocketAddr,
    members: &[(u64, SocketAddr)],
) -> Result<MemberLink, StartError> {
    let tls = Arc::new(ReloadableTls::load(paths.clone()).unwrap());
    let cfg = MemberConfig {
        listen,
        members: members.to_vec(),
        reset_secret: [7; 32],
        admission: Admission::new(&[SourceRule::Peers], members.iter().map(|(_, a)| *a), 16),
    };
    MemberLink::start(cfg, tls, Echo)
}

/// A raw quinn client endpoint on loopback.
fn raw_client() -> quinn::Endpoint {
    quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn material(paths: &TlsPaths) -> TlsMaterial {
    TlsMaterial::load(paths).unwrap()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn members_of_one_dc_call_each_other() {
    let pki = pki();
    let (a1, a2) = (free_addr(), free_addr());
    let members = [(1, a1), (2, a2)];
    let n1 = start(&pki.nodes_a[0], a1, &members).unwrap();
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    assert_eq!(n1.me().dns_name(), "n1.dc-a.tandem-node");

    assert_eq!(n1.call(2, b"ping", WITHIN).await.unwrap(), b"1:ping");
    assert_eq!(n2.call(1, b"pong", WITHIN).await.unwrap(), b"2:pong");
    // A large request (a Raft entry of a full round is up to a frame) and many at once on
    // the one connection (more than its stream credit: the rest wait their turn).
    let big = vec![0xab; tandem_schemas::FRAME_BYTES_MAX];
    let answer = n1.call(2, &big, WITHIN).await.unwrap();
    assert_eq!(answer.len(), big.len() + 2);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..(STREAMS_MAX * 3) {
        let n1 = n1.clone();
        calls.spawn(async move { (i, n1.call(2, &i.to_be_bytes(), WITHIN).await) });
    }
    while let Some(done) = calls.join_next().await {
        let (i, answer) = done.unwrap();
        let mut want = b"1:".to_vec();
        want.extend_from_slice(&i.to_be_bytes());
        assert_eq!(answer.unwrap(), want);
    }
    let stats = n1.stats();
    assert_eq!(stats.dials.load(Ordering::Relaxed), 1, "one connection, reused");
    assert_eq!(n2.stats().served.load(Ordering::Relaxed), 2 + 3 * u64::from(STREAMS_MAX));
    assert_eq!(n1.call(9, b"x", WITHIN).await, Err(CallError::UnknownMember { node: 9 }));
    n1.shutdown().await;
    n2.shutdown().await;
}

#[tokio::test]
async fn only_configured_members_of_the_own_dc_are_served() {
    let pki = pki();
    let (a1, a2, a3) = (free_addr(), free_addr(), free_addr());
    let n1 = start(&pki.nodes_a[0], a1, &[(1, a1), (2, a2)]).unwrap();

    // Node 3 of dc-a is no member of node 1's group: it may dial (it lists node 1), and is
    // refused after the handshake.
    let n3 = start(&pki.nodes_a[2], a3, &[(1, a1), (3, a3)]).unwrap();
    assert!(matches!(n3.call(1, b"x", WITHIN).await, Err(CallError::Failed { .. })));
    wait_for("the refusal is counted", || n1.stats().refused_connections.load(Ordering::Relaxed) == 1).await;

    // Node 1 of dc-b, under the same CA, dialing as if it were dc-a's node 2's peer: its
    // certificate names node 1 of dc-b.
    let client = raw_client();
    let cfg = client_config(&material(&pki.node_b1), &TransportTuning::default()).unwrap();
    let conn = client.connect_with(cfg, a1, "n1.dc-a.tandem-node").unwrap().await.unwrap();
    wait_for("the node of another DC is refused", || {
        n1.stats().refused_connections.load(Ordering::Relaxed) == 2
    })
    .await;
    let closed = tokio::time::timeout(WITHIN, conn.closed()).await.unwrap();
    assert!(closed.to_string().contains("not a configured member"), "{closed}");

    // Node 1 of dc-b as a link of its own: dialing "node 1" means n1.dc-b, which dc-a's
    // node 1 is not, so the dialer refuses the server.
    let b1 = start(&pki.node_b1, free_addr(), &[(1, a1)]).unwrap();
    let refused = b1.call(1, b"x", WITHIN).await.unwrap_err();
    assert!(matches!(refused, CallError::Unreachable { .. }), "{refused:?}");
    assert_eq!(n1.stats().served.load(Ordering::Relaxed), 0, "nothing was served");
    for link in [n1, n3, b1] {
        link.shutdown().await;
    }
}

/// A membership change: a node added to the members is served from then on; a removed
/// one's connection is closed and its next call refused.
#[tokio::test]
async fn members_follow_a_membership_change() {
    let pki = pki();
    let (a1, a2, a3) = (free_addr(), free_addr(), free_addr());
    let n1 = start(&pki.nodes_a[0], a1, &[(1, a1), (2, a2)]).unwrap();
    let n2 = start(&pki.nodes_a[1], a2, &[(1, a1), (2, a2)]).unwrap();
    let n3 = start(&pki.nodes_a[2], a3, &[(1, a1), (3, a3)]).unwrap();
    assert_eq!(n2.call(1, b"x", WITHIN).await.unwrap(), b"2:x");
    assert!(matches!(n3.call(1, b"x", WITHIN).await, Err(CallError::Failed { .. })));

    n1.set_members(&[(1, a1), (3, a3)]);
    assert_eq!(n1.members(), vec![(1, a1), (3, a3)]);
    assert_eq!(n3.call(1, b"y", WITHIN).await.unwrap(), b"3:y", "the added node is served");
    assert_eq!(n1.call(3, b"z", WITHIN).await.unwrap(), b"1:z", "and called");
    // Node 2's connection from before the change is refused at its next request.
    let refused = n2.call(1, b"x", WITHIN).await.unwrap_err();
    assert!(!matches!(refused, CallError::UnknownMember { .. }), "{refused:?}");
    assert!(n1.stats().refused_connections.load(Ordering::Relaxed) >= 1);
    assert_eq!(n1.call(2, b"x", WITHIN).await, Err(CallError::UnknownMember { node: 2 }));
    for link in [n1, n2, n3] {
        link.shutdown().await;
    }
}

/// A node certificate rotated in place (new key, same CA) and reloaded: new connections
/// are served with it; files that do not load are refused and the old material stays.
#[tokio::test]
async fn a_rotated_node_certificate_serves_new_connections_and_a_broken_one_is_refused() {
    let pki = pki();
    let (a1, a2) = (free_addr(), free_addr());
    let members = [(1, a1), (2, a2)];
    let n1 = start(&pki.nodes_a[0], a1, &members).unwrap();
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    assert_eq!(n2.call(1, b"a", WITHIN).await.unwrap(), b"2:a");
    let before = std::fs::read(&pki.nodes_a[0].cert).unwrap();
    generate_dev_node_certs(pki._dir.path(), "dc-a", &[1], true).unwrap();
    assert_ne!(std::fs::read(&pki.nodes_a[0].cert).unwrap(), before, "a new certificate");
    n1.reload_tls().unwrap();
    // A new connection (node 2's link restarted) is served with the new certificate.
    n2.shutdown().await;
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    assert_eq!(n2.call(1, b"b", WITHIN).await.unwrap(), b"2:b");
    std::fs::write(&pki.nodes_a[0].key, b"not a key").unwrap();
    assert!(n1.reload_tls().is_err(), "a key that does not load is refused");
    n2.shutdown().await;
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    assert_eq!(n2.call(1, b"c", WITHIN).await.unwrap(), b"2:c", "the old material stays");
    n1.shutdown().await;
    n2.shutdown().await;
}

#[tokio::test]
async fn dc_and_node_certificates_never_stand_in_for_each_other() {
    let pki = pki();
    let tuning = TransportTuning::default();
    let dc = material(&pki.dc_a);
    let node = material(&pki.nodes_a[0]);

    // Neither link builds its configs from the other kind's material.
    let a1 = free_addr();
    let refused = start(&pki.dc_a, a1, &[(1, a1)]).err().expect("a DC certificate started a member link");
    assert!(matches!(refused, StartError::Tls(TlsError::CertKind { .. })), "{refused}");
    assert!(matches!(
        tls::server_config_tuned(&node, crate::gateway::ALPN, &tuning),
        Err(TlsError::CertKind { .. })
    ));
    assert!(matches!(
        tls::client_config_tuned(&node, crate::gateway::ALPN, &tuning),
        Err(TlsError::CertKind { .. })
    ));
    assert!(matches!(client_config(&dc, &tuning), Err(TlsError::CertKind { .. })));

    // On the wire: a client holding the DC's certificate (built past the check) dials a
    // member link and is refused after the handshake: it names no node.
    let n1 = start(&pki.nodes_a[0], a1, &[(1, a1), (2, free_addr())]).unwrap();
    let client = raw_client();
    let transport = tuning.transport_config().unwrap();
    let cfg = tls::client_config_with(&dc, ALPN, transport, NameRule::Node).unwrap();
    let conn = client.connect_with(cfg, a1, "n1.dc-a.tandem-node").unwrap().await.unwrap();
    let closed = tokio::time::timeout(WITHIN, conn.closed()).await.unwrap();
    assert!(closed.to_string().contains("no node identity"), "{closed}");
    assert_eq!(n1.stats().refused_connections.load(Ordering::Relaxed), 1);

    // A node's certificate on the DC replication link's listener: the identity the
    // gateway's accept loop reads (`peer_dc`) is refused.
    let server_cfg =
        tls::server_config_with(&dc, crate::gateway::ALPN, tuning.transport_config().unwrap()).unwrap();
    let server = quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let server_addr = server.local_addr().unwrap();
    let accepted = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        peer_dc(&conn)
    });
    let cfg = tls::client_config_with(
        &node,
        crate::gateway::ALPN,
        tuning.transport_config().unwrap(),
        NameRule::Dc,
    )
    .unwrap();
    let _conn = client.connect_with(cfg, server_addr, "dc-a").unwrap().await.unwrap();
    let read = tokio::time::timeout(WITHIN, accepted).await.unwrap().unwrap();
    assert!(matches!(read, Err(TlsError::PeerDcName { .. })), "{read:?}");

    // A member dialing a server that presents a DC's certificate refuses it.
    let server_cfg = tls::server_config_with(&dc, ALPN, tuning.transport_config().unwrap()).unwrap();
    let server = quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let server_addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            let _ = incoming.await;
        }
    });
    let n2 = start(&pki.nodes_a[1], free_addr(), &[(1, server_addr)]).unwrap();
    let refused = n2.call(1, b"x", WITHIN).await.unwrap_err();
    assert!(
        matches!(&refused, CallError::Unreachable { reason, .. } if reason.contains("node")),
        "{refused:?}"
    );
    n1.shutdown().await;
    n2.shutdown().await;
}

#[tokio::test]
async fn requests_over_the_frame_limit_are_refused_and_counted() {
    let pki = pki();
    let (a1, a2) = (free_addr(), free_addr());
    let members = [(1, a1), (2, a2)];
    let n1 = start(&pki.nodes_a[0], a1, &members).unwrap();
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    let over = vec![0u8; FRAME_BYTES_MAX + 1];
    assert_eq!(
        n1.call(2, &over, WITHIN).await,
        Err(CallError::TooLarge { bytes: FRAME_BYTES_MAX + 1, max: FRAME_BYTES_MAX })
    );
    assert_eq!(n1.stats().dials.load(Ordering::Relaxed), 0, "nothing was sent");

    // A peer that sends one anyway (past its own check) gets its stream reset.
    let client = raw_client();
    let cfg = client_config(&material(&pki.nodes_a[0]), &TransportTuning::default()).unwrap();
    let conn = client.connect_with(cfg, a2, "n2.dc-a.tandem-node").unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let _ = send.write_all(&over).await;
    let _ = send.finish();
    let answer = tokio::time::timeout(WITHIN, recv.read_to_end(FRAME_BYTES_MAX)).await.unwrap();
    assert!(answer.is_err(), "an over-limit request was answered");
    assert_eq!(n2.stats().frames_refused.load(Ordering::Relaxed), 1);
    assert_eq!(n2.stats().served.load(Ordering::Relaxed), 0);
    // The connection and the link go on.
    assert_eq!(n1.call(2, b"after", WITHIN).await.unwrap(), b"1:after");
    n1.shutdown().await;
    n2.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_member_fails_within_the_deadline_and_a_restarted_one_is_dialed_again() {
    let pki = pki();
    let (a1, a2) = (free_addr(), free_addr());
    let members = [(1, a1), (2, a2)];
    let n1 = start(&pki.nodes_a[0], a1, &members).unwrap();

    let started = Instant::now();
    let deadline = Duration::from_millis(500);
    let failed = n1.call(2, b"x", deadline).await.unwrap_err();
    assert!(matches!(failed, CallError::Unreachable { .. } | CallError::Timeout { .. }), "{failed:?}");
    assert!(started.elapsed() < deadline + Duration::from_millis(300), "took {:?}", started.elapsed());

    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    assert_eq!(n1.call(2, b"one", WITHIN).await.unwrap(), b"1:one");
    n2.shutdown().await;
    let n2 = start(&pki.nodes_a[1], a2, &members).unwrap();
    // The cached connection is dead (the new endpoint resets it); a call or two later the
    // link has dialed again.
    let mut answered = None;
    for _ in 0..5 {
        if let Ok(answer) = n1.call(2, b"two", Duration::from_secs(2)).await {
            answered = Some(answer);
            break;
        }
    }
    assert_eq!(answered.as_deref(), Some(&b"1:two"[..]));
    assert!(n1.stats().dials.load(Ordering::Relaxed) >= 2);
    n1.shutdown().await;
    n2.shutdown().await;
}

#[test]
fn node_certificates_load_as_nodes_and_refuse_overwrites() {
    let pki = pki();
    let node = material(&pki.nodes_a[1]);
    assert_eq!(node.node().map(|n| n.id), Some(2));
    assert_eq!(node.dc(), "dc-a");
    assert_eq!(material(&pki.dc_a).node(), None);
    let dir: &Path = pki.nodes_a[0].cert.parent().unwrap();
    assert!(matches!(generate_dev_node_certs(dir, "dc-a", &[1], false), Err(TlsError::Exists { .. })));
    assert!(matches!(
        generate_dev_node_certs(dir, "n1.x.tandem-node", &[1], false),
        Err(TlsError::InvalidDcName { .. })
    ));
}

/// A UDP forwarder for one client with a switch that drops everything both ways (a cut
/// member link). Its tasks stop with the test's runtime.
async fn cuttable_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::AtomicBool;
    let front = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(upstream).await.unwrap();
    let cut = Arc::new(AtomicBool::new(false));
    let client = Arc::new(parking_lot::Mutex::new(None::<SocketAddr>));
    let (f, b, c, k) = (front.clone(), back.clone(), cut.clone(), client.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *k.lock() = Some(from);
            if !c.load(Ordering::Relaxed) {
                let _ = b.send(&buf[..n]).await;
            }
        }
    });
    let (f, b, c, k) = (front.clone(), back, cut.clone(), client);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok(n) = b.recv(&mut buf).await {
            let to = *k.lock();
            if let (Some(to), false) = (to, c.load(Ordering::Relaxed)) {
                let _ = f.send_to(&buf[..n], to).await;
            }
        }
    });
    (front.local_addr().unwrap(), cut)
}

/// A call given up (its timeout, or its caller dropped it: a forwarded write whose leader
/// stopped leading) while the link was cut must never reach the member once the link
/// heals: QUIC would otherwise retransmit the finished request seconds later, and a write
/// the client was told failed would take effect after the client moved on (a register
/// landing after its deregister). Found by `tandem chaos follower-partition`.
#[tokio::test]
async fn a_call_given_up_while_the_link_was_cut_is_not_delivered_after_it_heals() {
    let pki = pki();
    let (a1, a2) = (free_addr(), free_addr());
    let n2 = start(&pki.nodes_a[1], a2, &[(1, a1), (2, a2)]).unwrap();
    let (via, cut) = cuttable_proxy(a2).await;
    let n1 = start(&pki.nodes_a[0], a1, &[(1, a1), (2, via)]).unwrap();
    assert_eq!(n1.call(2, b"before", WITHIN).await.unwrap(), b"1:before");
    cut.store(true, Ordering::Relaxed);
    let given_up = n1.call(2, b"given up", Duration::from_millis(300)).await;
    assert!(matches!(given_up, Err(CallError::Timeout { .. })), "{given_up:?}");
    let dropped = tokio::time::timeout(Duration::from_millis(300), n1.call(2, b"dropped", WITHIN)).await;
    assert!(dropped.is_err(), "the cut link answered");
    cut.store(false, Ordering::Relaxed);
    // Long enough for QUIC's retransmissions (probe timeouts back off from ~1 s), then a
    // call that goes through: only the calls that were answered were served.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(n1.call(2, b"after", WITHIN).await.unwrap(), b"1:after");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(n2.stats().served.load(Ordering::Relaxed), 2, "a call given up was served after the heal");
    n1.shutdown().await;
    n2.shutdown().await;
}
