//! Hostile replication peers against a real node (issue 15, the QUIC side). A real
//! `tandem server` process (dc-a) listens on loopback; a test peer built on the gateway's
//! own TLS client code, holding a certificate of the test CA (dc-b's, so it passes the
//! identity checks), sends each probe. Each probe is bounded in count and time; each test
//! asserts what is refused, what `/metrics` counts, that the node stays up, its peak RSS
//! where memory is the point, and that a well-behaved peer (a real dc-b node) still
//! replicates to it afterwards.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tandem::node::Node;
use tandem_client::client::Client;
use tandem_replicator::gateway::ALPN;
use tandem_replicator::tls::{DevPki, ReloadableTls};

/// A real `tandem server` process of dc-a with dc-b as its peer; killed on drop.
struct Server {
    child: std::process::Child,
    http_port: u16,
    repl: SocketAddr,
    dir: tempfile::TempDir,
    pki: DevPki,
    /// Where dc-a dials dc-b (the well-behaved dc-b node listens there).
    peer_b: SocketAddr,
}

impl Server {
    async fn start() -> Server {
        Server::start_with("127.0.0.1", "").await
    }

    /// dc-a with its peer dc-b at `peer_ip` (a loopback address; 127.0.0.0/8 is all
    /// loopback on Linux) and `extra` lines in its `[replication]` table. The node's
    /// warnings go to `node.log` in its dir.
    async fn start_with(peer_ip: &str, extra: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let pki =
            tandem_replicator::tls::generate_dev_pki(&dir.path().join("certs"), &["dc-a", "dc-b"], false)
                .unwrap();
        let http_port = free_tcp_port();
        let repl: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
        let peer_b: SocketAddr = format!("{peer_ip}:{}", free_udp_port()).parse().unwrap();
        let p = pki.paths("dc-a").unwrap();
        let text = format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{http_port}\"\n\
             [replication]\nlisten = \"{repl}\"\npeers = [{{ dc = \"dc-b\", addr = \"{peer_b}\" }}]\n\
             ca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 500\n{extra}\n",
            dir.path().join("d").display(),
            p.ca_cert.display(),
            p.cert.display(),
            p.key.display(),
        );
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).unwrap();
        let log = std::fs::File::create(dir.path().join("node.log")).unwrap();
        let child = std::process::Command::new(tandem_bin())
            .arg("server")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let s = Server { child, http_port, repl, dir, pki, peer_b };
        let c = s.client();
        eventually(Duration::from_secs(20), "server answers", || async { c.status().await.is_ok() }).await;
        s
    }

    fn client(&self) -> Client {
        Client::new(&[format!("http://127.0.0.1:{}", self.http_port)])
    }

    /// A value of the process's `/proc/<pid>/status` (`VmRSS`, `VmHWM`), KiB.
    fn status_kib(&self, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(key)).expect("key in /proc/<pid>/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// One counter of `/metrics` (summed over its series whose labels contain `labels`).
    async fn metric_with(&self, name: &str, labels: &[&str]) -> u64 {
        let url = format!("http://127.0.0.1:{}/metrics", self.http_port);
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        metric_sum(&text, name, labels) as u64
    }

    /// One counter of `/metrics` (summed over its series).
    async fn metric(&self, name: &str) -> u64 {
        self.metric_with(name, &[]).await
    }

    /// Lines of the node's log that contain `text`.
    fn log_lines(&self, text: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains(text)).count()
    }

    /// A QUIC connection to the node's replication listener as `dc` (a certificate of the
    /// test CA), with the gateway's own client configuration.
    async fn connect_as(&self, dc: &str) -> Result<(quinn::Endpoint, quinn::Connection), String> {
        self.connect_from("127.0.0.1", self.pki.paths(dc).unwrap().clone()).await
    }

    /// A QUIC connection from source address `ip` with the TLS material at `paths`.
    async fn connect_from(
        &self,
        ip: &str,
        paths: tandem_replicator::tls::TlsPaths,
    ) -> Result<(quinn::Endpoint, quinn::Connection), String> {
        let tls = ReloadableTls::load(paths).map_err(|e| e.to_string())?;
        let cfg = tls.client_config(ALPN).map_err(|e| e.to_string())?;
        let ep = quinn::Endpoint::client(format!("{ip}:0").parse().unwrap()).map_err(|e| e.to_string())?;
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            ep.connect_with(cfg, self.repl, "dc-a").map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
        Ok((ep, conn))
    }

    /// A well-behaved dc-b node (in this process) dialing the server; what it registers
    /// must reach dc-a.
    async fn check_a_good_peer_replicates(&self, id: &str) -> Node {
        let p = self.pki.paths("dc-b").unwrap();
        let mut c = single_config(self.dir.path(), "dc-b");
        c.replication =
            Some(replication_section(&p.ca_cert, &p.cert, &p.key, self.peer_b, "dc-a", self.repl));
        let b = Node::start(c, None).await.unwrap();
        client(&b).register(&reg_body("orders", id, true)).await.unwrap();
        let a = self.client();
        let a = &a;
        eventually(Duration::from_secs(20), "dc-b's instance replicates to dc-a", || async move {
            a.discover("default", "orders", "dc=dc-b").await.is_ok_and(|d| ids(&d).contains(&id.to_owned()))
        })
        .await;
        b
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Most the node's peak resident set may grow while a peer pushes an oversized frame at it
/// (QUIC buffers of one stream and allocator slack; before the fix, a 40 MB batch raised
/// it by ~980 MB).
const OVERSIZED_FRAME_PEAK_RSS_GROWTH_KIB_MAX: u64 = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_from_a_certified_peer_is_refused_before_it_is_read() {
    if !std::path::Path::new("/proc/self/status").exists() {
        return; // reads VmHWM through /proc
    }
    let mut server = Server::start().await;
    // Warm up: the node has answered HTTP and run its accept loop once.
    let hwm_before = server.status_kib("VmHWM:");
    const DECLARED: u32 = 40_000_000;
    let (_ep, conn) = server.connect_as("dc-b").await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // A v2 Batch header, then zeros: at most DECLARED bytes, for at most 10 s, stopping
    // at the first refused write (the node stopped reading or closed the connection).
    let pushed = async {
        send.write_all(&DECLARED.to_be_bytes()).await?;
        send.write_all(&[2, 2]).await?;
        let zeros = vec![0u8; 64 * 1024];
        let mut sent = 0usize;
        while sent < DECLARED as usize {
            send.write_all(&zeros).await?;
            sent += zeros.len();
        }
        Ok::<_, quinn::WriteError>(())
    };
    let res = tokio::time::timeout(Duration::from_secs(10), pushed).await;
    assert!(!matches!(res, Ok(Ok(()))), "the node read a 40 MB frame to the end");
    // The refusal comes back (a Refuse frame or the connection closed).
    let mut buf = vec![0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), recv.read(&mut buf)).await;
    drop(conn);
    assert!(server.alive(), "the node died");
    let hwm_after = server.status_kib("VmHWM:");
    eprintln!("peak RSS {hwm_before} KiB -> {hwm_after} KiB");
    assert!(
        hwm_after <= hwm_before + OVERSIZED_FRAME_PEAK_RSS_GROWTH_KIB_MAX,
        "peak RSS grew from {hwm_before} KiB to {hwm_after} KiB for a refused 40 MB frame"
    );
    assert_eq!(server.metric("tandem_replication_frames_too_large_total").await, 1);
    let b = server.check_a_good_peer_replicates("b-after-oversized").await;
    b.shutdown().await;
}

/// How the node closed a connection: its application close code.
async fn close_code(conn: &quinn::Connection, within: Duration) -> Option<u64> {
    match tokio::time::timeout(within, conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => Some(c.error_code.into_inner()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_gets_one_connection_one_stream_no_datagrams_and_no_idle_connections() {
    use tandem_replicator::gateway::{CLOSE_NO_STREAM, CLOSE_REPLACED, STREAM_OPEN_TIMEOUT};
    let mut server = Server::start().await;
    let (_e1, c1) = server.connect_as("dc-b").await.unwrap();
    assert_eq!(c1.max_datagram_size(), None, "the node offers datagrams");
    // No unidirectional streams: opening one waits for credit that never comes.
    assert!(tokio::time::timeout(Duration::from_millis(300), c1.open_uni()).await.is_err());
    // One bidirectional stream; a second one waits.
    let (_s, _r) = c1.open_bi().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), c1.open_bi()).await.is_err());
    // The stream was never used, so the node saw none: the connection is closed.
    let code = close_code(&c1, STREAM_OPEN_TIMEOUT + Duration::from_secs(3)).await;
    assert_eq!(code, Some(u64::from(CLOSE_NO_STREAM)));
    // A newer connection of the same DC replaces the older one at handshake.
    let (_e2, c2) = server.connect_as("dc-b").await.unwrap();
    let (_e3, c3) = server.connect_as("dc-b").await.unwrap();
    assert_eq!(close_code(&c2, Duration::from_secs(3)).await, Some(u64::from(CLOSE_REPLACED)));
    c3.close(0u32.into(), b"done");
    assert!(server.alive(), "the node died");
    assert!(server.metric("tandem_replication_connections_idle_closed_total").await >= 1);
    assert!(server.metric("tandem_replication_connections_replaced_total").await >= 1);
    let b = server.check_a_good_peer_replicates("b-after-streams").await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_reaches_the_peer_as_the_close_reason() {
    use tandem_replicator::gateway::CLOSE_REFUSED;
    let mut server = Server::start().await;
    let (_ep, conn) = server.connect_as("dc-b").await.unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    // A Hello for an origin this certificate does not name: refused as the wrong origin.
    let hello = tandem_schemas::encode_frame(&tandem_schemas::Frame::Hello {
        dc: "dc-c".into(),
        epoch: 1,
        last_seq: 0,
    });
    send.write_all(&(hello.len() as u32).to_be_bytes()).await.unwrap();
    send.write_all(&hello).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.expect("closed in time");
    let quinn::ConnectionError::ApplicationClosed(c) = closed else {
        panic!("not closed by the node: {closed}")
    };
    assert_eq!(c.error_code.into_inner(), u64::from(CLOSE_REFUSED));
    let reason = String::from_utf8_lossy(&c.reason).into_owned();
    assert!(reason.starts_with("refused (WrongOrigin)"), "{reason}");
    assert!(server.alive(), "the node died");
    assert!(server.metric("tandem_replication_protocol_errors_total").await >= 1);
    let b = server.check_a_good_peer_replicates("b-after-refusal").await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_configured_peers_addresses_may_start_a_handshake() {
    // dc-b is configured at 127.0.0.2; a stranger at 127.0.0.1 holds dc-b's own
    // certificate, and still gets no answer at all.
    let server = Server::start_with("127.0.0.2", "").await;
    let b_paths = server.pki.paths("dc-b").unwrap().clone();
    let stranger = server.connect_from("127.0.0.1", b_paths.clone()).await;
    assert!(stranger.is_err(), "a source that is not a peer's address got a connection");
    let refused = "tandem_replication_incoming_refused_total";
    assert!(server.metric_with(refused, &["reason=\"source\""]).await >= 1);
    assert_eq!(server.metric("tandem_replication_refused_connections_total").await, 0, "no handshake ran");
    // From the peer's address: validated by a Retry, then admitted.
    let (_ep, conn) = server.connect_from("127.0.0.2", b_paths).await.unwrap();
    conn.close(0u32.into(), b"done");
    assert!(server.metric("tandem_replication_retries_sent_total").await >= 1);
    assert!(server.log_lines("not in accept_from") <= 1, "the refusal is logged sampled");
    let b = server.check_a_good_peer_replicates("b-from-its-address").await;
    b.shutdown().await;

    // The opt-out for NAT and relays: any source may start a handshake.
    let open = Server::start_with("127.0.0.2", "accept_from = [\"any\"]").await;
    let (_ep, conn) = open.connect_from("127.0.0.1", open.pki.paths("dc-b").unwrap().clone()).await.unwrap();
    conn.close(0u32.into(), b"done");
    assert_eq!(open.metric_with(refused, &["reason=\"source\""]).await, 0);
}

/// How long the stalling client holds its handshake (below the node's 3 s idle timeout,
/// which bounds every handshake).
const STALL: Duration = Duration::from_millis(2_500);

/// A TLS client verifier that holds the handshake: it blocks for [`STALL`], then fails.
#[derive(Debug)]
struct Stall;

impl rustls::client::danger::ServerCertVerifier for Stall {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        std::thread::sleep(STALL);
        Err(rustls::Error::General("stalled on purpose".into()))
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("stalled on purpose".into()))
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("stalled on purpose".into()))
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
    }
}

/// A client that runs a handshake as far as the server's flight and holds it there
/// ([`Stall`]), on its own thread (the stall blocks its runtime).
fn stalled_handshake(
    paths: &tandem_replicator::tls::TlsPaths,
    addr: SocketAddr,
) -> std::thread::JoinHandle<()> {
    use rustls::pki_types::pem::PemObject;
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&paths.cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&paths.key).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(std::sync::Arc::new(Stall))
    .with_client_auth_cert(chain, key)
    .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let cfg = quinn::ClientConfig::new(std::sync::Arc::new(quic));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
            let r =
                tokio::time::timeout(Duration::from_secs(10), ep.connect_with(cfg, addr, "dc-a").unwrap())
                    .await;
            assert!(!matches!(r, Ok(Ok(_))), "a stalled handshake completed");
        });
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_are_capped_and_a_flood_of_foreign_certificates_is_counted_and_logged_sampled() {
    let mut server = Server::start_with("127.0.0.1", "handshakes_max = 2").await;
    let b_paths = server.pki.paths("dc-b").unwrap().clone();
    // Two handshakes held open fill the cap...
    let stalled = [stalled_handshake(&b_paths, server.repl), stalled_handshake(&b_paths, server.repl)];
    let s = &server;
    eventually(Duration::from_secs(5), "two handshakes running", || async move {
        s.metric("tandem_replication_handshakes").await == 2
    })
    .await;
    // ...so a third is refused at once, before any TLS work.
    let third = server.connect_as("dc-b").await;
    assert!(third.is_err(), "a handshake beyond handshakes_max was admitted");
    let refused = "tandem_replication_incoming_refused_total";
    assert!(server.metric_with(refused, &["reason=\"handshakes_max\""]).await >= 1);
    for t in stalled {
        t.join().unwrap();
    }

    // A flood of handshakes with another CA's certificate: bounded in count and time.
    let foreign =
        tandem_replicator::tls::generate_dev_pki(&server.dir.path().join("foreign"), &["dc-b"], false)
            .unwrap();
    let foreign = foreign.paths("dc-b").unwrap().clone();
    const FLOOD: usize = 200;
    let flood = async {
        for _ in 0..FLOOD / 8 {
            let round = (0..8).map(|_| server.connect_from("127.0.0.1", foreign.clone()));
            for r in futures::future::join_all(round).await {
                assert!(r.is_err(), "a foreign certificate was accepted");
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), flood).await.expect("the flood ends in time");
    assert!(server.alive(), "the node died");
    let failed = server.metric("tandem_replication_refused_connections_total").await;
    let busy = server.metric_with(refused, &["reason=\"handshakes_max\""]).await;
    assert!(failed + busy > FLOOD as u64, "every attempt counted: {failed} failed, {busy} refused as busy");
    // Sampled: one line per kind per 10 s, not one per attempt (1,378 lines for 2,000 before).
    let lines = server.log_lines("WARN");
    assert!(lines <= 12, "{lines} warning lines for {FLOOD} refused handshakes");
    let s = &server;
    eventually(Duration::from_secs(5), "no handshake left running", || async move {
        s.metric("tandem_replication_handshakes").await == 0
    })
    .await;
    let b = server.check_a_good_peer_replicates("b-after-flood").await;
    b.shutdown().await;
}
