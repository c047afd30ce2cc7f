//! Shared helpers of the integration tests: real nodes (RocksDB on disk, HTTP on loopback,
//! QUIC with mutual TLS), fault relays between DCs, and bounded polling.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tandem::config::{Config, PeerSection, ReplicationSection};
use tandem::node::Node;
use tandem_chaos::relay::{Faults, Relay};
use tandem_client::client::Client;

/// A UDP port for a server the test starts later: below the ephemeral range, so that no
/// `:0` bind meanwhile (a relay, another node's QUIC client) can take it.
pub fn free_udp_port() -> u16 {
    tandem_chaos::ports::free_port(true).unwrap()
}

/// A TCP port for a server the test starts later (see [`free_udp_port`]).
pub fn free_tcp_port() -> u16 {
    tandem_chaos::ports::free_port(false).unwrap()
}

pub fn single_config(dir: &Path, dc: &str) -> Config {
    let mut c = Config::single(dc, dir.join(dc), "127.0.0.1:0".parse().unwrap());
    c.health.check_interval_ms = 50;
    c
}

/// Two DCs whose replication links each run through a fault relay.
pub struct Pair {
    pub dir: tempfile::TempDir,
    pub cfg_a: Config,
    pub cfg_b: Config,
    pub a: Option<Node>,
    pub b: Option<Node>,
    /// Carries dc-a's stream to dc-b.
    pub relay_ab: Relay,
    /// Carries dc-b's stream to dc-a.
    pub relay_ba: Relay,
}

pub async fn pair_with(tune: impl Fn(&mut Config)) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let pki = tandem_replicator::tls::generate_dev_pki(&dir.path().join("certs"), &["dc-a", "dc-b"], false)
        .unwrap();
    let (la, lb) = (free_udp_port(), free_udp_port());
    let listen_a: SocketAddr = format!("127.0.0.1:{la}").parse().unwrap();
    let listen_b: SocketAddr = format!("127.0.0.1:{lb}").parse().unwrap();
    let relay_ab = Relay::start("127.0.0.1:0".parse().unwrap(), listen_b, Faults::NONE, 1).await.unwrap();
    let relay_ba = Relay::start("127.0.0.1:0".parse().unwrap(), listen_a, Faults::NONE, 2).await.unwrap();
    let mk = |dc: &str, listen: SocketAddr, peer: &str, peer_addr: SocketAddr| {
        let p = pki.paths(dc).unwrap();
        let mut c = single_config(dir.path(), dc);
        c.replication = Some(replication_section(&p.ca_cert, &p.cert, &p.key, listen, peer, peer_addr));
        tune(&mut c);
        c
    };
    let cfg_a = mk("dc-a", listen_a, "dc-b", relay_ab.local_addr());
    let cfg_b = mk("dc-b", listen_b, "dc-a", relay_ba.local_addr());
    let a = Node::start(cfg_a.clone(), None).await.unwrap();
    let b = Node::start(cfg_b.clone(), None).await.unwrap();
    Pair { dir, cfg_a, cfg_b, a: Some(a), b: Some(b), relay_ab, relay_ba }
}

pub async fn pair() -> Pair {
    pair_with(|_| {}).await
}

impl Pair {
    pub fn client_a(&self) -> Client {
        client(self.a.as_ref().unwrap())
    }
    pub fn client_b(&self) -> Client {
        client(self.b.as_ref().unwrap())
    }
    pub fn partition(&self) {
        self.relay_ab.handle().partition(tandem_chaos::relay::Direction::Both);
        self.relay_ba.handle().partition(tandem_chaos::relay::Direction::Both);
    }
    pub fn heal(&self) {
        self.relay_ab.handle().heal();
        self.relay_ba.handle().heal();
    }
    pub async fn stop(mut self) {
        if let Some(a) = self.a.take() {
            a.shutdown().await;
        }
        if let Some(b) = self.b.take() {
            b.shutdown().await;
        }
    }
}

pub fn client(node: &Node) -> Client {
    Client::new(&[format!("http://{}", node.http_addr())])
}

pub fn reg_body(service: &str, id: &str, persistent: bool) -> Value {
    let mut b = json!({"service": service, "instance_id": id, "address": "10.1.2.3", "port": 8080});
    if persistent {
        b["persistent"] = json!(true);
    }
    b
}

/// A burst of writes that then stops: `batches` x 256 persistent instances over 64
/// services, through `POST /v1/registrations` at `url`.
pub async fn register_burst(http: &reqwest::Client, url: &str, batches: u32) {
    for batch in 0..batches {
        let instances: Vec<Value> = (0..256)
            .map(|i| reg_body(&format!("quiet-{}", i % 64), &format!("q{batch}-{i}"), true))
            .collect();
        let r = http.post(url).json(&json!({ "instances": instances })).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
}

/// Instance ids of a discovery answer, sorted.
pub fn ids(answer: &Value) -> Vec<String> {
    let mut v: Vec<String> = answer["instances"]
        .as_array()
        .map(|a| a.iter().map(|i| i["instance_id"].as_str().unwrap_or_default().to_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not within {within:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `tandem` binary the real-process tests start: the one cargo built for this test, or
/// `TANDEM_TEST_BIN` when set (a copy kept aside, so a shared target directory rebuilt by
/// another checkout cannot swap the binary under a running test).
pub fn tandem_bin() -> PathBuf {
    std::env::var_os("TANDEM_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tandem")))
}

/// The sum of the series of metric `name` in a `/metrics` text whose labels contain each of
/// `labels` (like `reason="source"`); 0 when there is none.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The `[replication]` table of a test node: one peer, small batches and windows, quick
/// backoff and staleness (1.5 s), the default admission rules.
pub fn replication_section(
    ca_cert: &Path,
    cert: &Path,
    key: &Path,
    listen: SocketAddr,
    peer_dc: &str,
    peer_addr: SocketAddr,
) -> ReplicationSection {
    ReplicationSection {
        listen,
        peers: vec![PeerSection { dc: peer_dc.into(), addr: peer_addr, addrs: vec![], namespaces: None }],
        ca_cert: ca_cert.to_owned(),
        cert: cert.to_owned(),
        key: key.to_owned(),
        batch_events_max: 64,
        window_batches_max: 4,
        frame_bytes_max: tandem_schemas::FRAME_BYTES_MAX,
        backoff_initial_ms: 50,
        backoff_max_ms: 500,
        stale_after_ms: 1_500,
        purge_grace_ms: 3_600_000,
        ping_interval_ms: 200,
        schema_version: tandem_schemas::SCHEMA_VERSION,
        accept_from: tandem_replicator::gateway::SourceRule::defaults(),
        handshakes_max: tandem_replicator::gateway::HANDSHAKES_MAX_DEFAULT,
    }
}

/// A real `tandem server` process on a config file, its stderr in `<config>.log`; killed
/// (SIGKILL) when dropped.
pub struct ServerProc {
    pub config: PathBuf,
    rust_log: &'static str,
    child: Option<std::process::Child>,
}

impl ServerProc {
    /// Not started yet; `rust_log` is its `RUST_LOG`.
    pub fn new(config: PathBuf, rust_log: &'static str) -> ServerProc {
        ServerProc { config, rust_log, child: None }
    }

    pub fn start(&mut self) {
        use std::process::{Command, Stdio};
        let log = std::fs::File::create(self.config.with_extension("log")).map(Stdio::from);
        let child = Command::new(tandem_bin())
            .args(["server", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", self.rust_log)
            .stdout(Stdio::null())
            .stderr(log.unwrap_or_else(|_| Stdio::null()))
            .spawn()
            .expect("spawn tandem server");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
