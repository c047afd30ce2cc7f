//! Hostile clients against a real node on loopback (issue 14, the HTTP side): half-sent
//! requests, idle sockets, connection floods from one address and from many, oversized
//! headers, a foreign Host header, cross-site style admin calls, and a descriptor limit
//! barely above RocksDB's share. Each probe is bounded in count and time; each test asserts
//! what is refused, what `/metrics` counts, that the node stays up, and that a well-behaved
//! client's register and discover succeed during and after the probe. Flooders connect from
//! other loopback addresses (127.0.0.2 and up) than the well-behaved client (127.0.0.1).
//! `hostile/reads.rs`: reads and watches of made-up services, caps on services, streams and
//! blocking queries; `hostile/h2.rs`: the HTTP/2 limits probed with raw frames.

mod common;
#[path = "hostile/h2.rs"]
mod h2;
#[path = "hostile/reads.rs"]
mod reads;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tandem::config::Config;
use tandem::node::Node;
use tandem_client::client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A raw connection to `to` from the loopback address `from`.
async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((from, 0)))?;
    tokio::time::timeout(Duration::from_secs(5), s.connect(to))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))?
}

/// What the server sent until it closed the connection or `within` passed; `true` when it
/// closed (EOF or reset) in time.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads `/metrics` through one pooled connection, opened before any flood (a flood may
/// leave no place for a new one).
struct Metrics {
    http: reqwest::Client,
    url: String,
}

impl Metrics {
    async fn of(node: &Node) -> Metrics {
        let m = Metrics { http: reqwest::Client::new(), url: format!("http://{}/metrics", node.http_addr()) };
        m.http.get(&m.url).send().await.unwrap();
        m
    }
}

/// One sample of `/metrics`, by its name and labels as written (`name{a="b"}`); the
/// node's own `dc` label is filled in.
async fn metric(m: &Metrics, sample: &str) -> f64 {
    // The pooled connection goes back to the pool a moment after its last body was read;
    // a request sent before that opens a new connection, which a node at its cap refuses.
    // So a refused read is tried again (at most 20 times in 1 s) on the pooled connection.
    let mut tries = 0;
    let text = loop {
        match m.http.get(&m.url).send().await {
            Ok(r) => break r.text().await.unwrap(),
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("metrics read refused ({e}); trying again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("metrics unreadable: {e}"),
        }
    };
    metric_in(&text, sample)
}

fn metric_in(text: &str, sample: &str) -> f64 {
    let want = sample.replacen("{}", "{dc=\"dc-a\"}", 1).replacen("{l", "{dc=\"dc-a\",l", 1).replacen(
        "{r",
        "{dc=\"dc-a\",r",
        1,
    );
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {want} in /metrics"))
}

/// A well-behaved client registers and discovers `n`; both must succeed.
async fn well_behaved(c: &Client, n: usize) {
    let id = format!("ok-{n}");
    c.register(&reg_body("calm", &id, true)).await.expect("a well-behaved register is served");
    let d = c.discover("default", "calm", "").await.expect("a well-behaved discover is served");
    assert!(ids(&d).contains(&id), "{d}");
}

/// [`well_behaved`] while every place is taken: a client retries a 503 (the node's canned
/// answer when a request races its pooled connection back into the pool and opens a new
/// one), and gets through on its pooled connection.
async fn well_behaved_at_the_cap(c: &Client, n: usize) {
    for _ in 0..20 {
        let id = format!("ok-{n}");
        let served = c.register(&reg_body("calm", &id, true)).await.is_ok()
            && c.discover("default", "calm", "").await.is_ok_and(|d| ids(&d).contains(&id));
        if served {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a well-behaved client was not served at the cap");
}

fn tuned(dir: &std::path::Path, f: impl FnOnce(&mut Config)) -> Config {
    let mut c = single_config(dir, "dc-a");
    f(&mut c);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_and_idle_sockets_are_closed_within_their_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tuned(dir.path(), |c| {
        c.http.header_read_timeout_ms = 600;
        c.http.idle_timeout_ms = 1_500;
    });
    let node = Node::start(cfg, None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    let started = Instant::now();
    let mut half_sent = Vec::new();
    let mut idle = Vec::new();
    for i in 0..40u8 {
        let mut s = connect_from([127, 0, 0, 2], addr).await.unwrap();
        s.write_all(format!("GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow-{i}: a").as_bytes())
            .await
            .unwrap();
        half_sent.push(s);
        idle.push(connect_from([127, 0, 0, 3], addr).await.unwrap());
    }
    well_behaved(&c, 1).await;
    for s in half_sent.iter_mut().chain(idle.iter_mut()) {
        let (_, closed) = read_until_closed(s, Duration::from_secs(4)).await;
        assert!(closed, "a half-sent or idle connection still open after {:?}", started.elapsed());
    }
    assert!(started.elapsed() < Duration::from_secs(4), "closed late: {:?}", started.elapsed());
    assert_eq!(
        metric(&m, "tandem_http_connections_closed_total{reason=\"header_read_timeout\"}").await,
        40.0
    );
    assert!(metric(&m, "tandem_http_connections_closed_total{reason=\"idle\"}").await >= 40.0);
    well_behaved(&c, 2).await;

    // HTTP/2 (prior knowledge): a connection with no stream open is closed once idle.
    let before = metric(&m, "tandem_http_connections_closed_total{reason=\"idle\"}").await;
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let r = h2.get(format!("http://{addr}/v1/status")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    eventually(Duration::from_secs(4), "the idle HTTP/2 connection is closed", || async {
        metric(&m, "tandem_http_connections_closed_total{reason=\"idle\"}").await > before
    })
    .await;
    eventually(Duration::from_secs(3), "only the /metrics connection is left open", || async {
        metric(&m, "tandem_http_connections{}").await == 1.0
    })
    .await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_body_times_out_but_blocking_queries_and_streams_outlive_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tuned(dir.path(), |c| c.http.request_timeout_ms = 700);
    let node = Node::start(cfg, None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    well_behaved(&c, 1).await;

    // A stream and a blocking query, both longer than the request timeout.
    let index = c.discover("default", "calm", "").await.unwrap()["index"].as_u64().unwrap();
    let blocking = {
        let c = client(&node);
        tokio::spawn(async move { c.discover("default", "calm", &format!("index={index}&wait=2s")).await })
    };
    let mut stream =
        reqwest::get(format!("http://{addr}/v1/services/default/calm?stream=true")).await.unwrap();
    assert_eq!(stream.status(), 200);
    assert!(stream.chunk().await.unwrap().is_some(), "the stream's first answer");

    let started = Instant::now();
    let mut s = connect_from([127, 0, 0, 2], addr).await.unwrap();
    s.write_all(
        b"POST /v1/register HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
          content-length: 200\r\n\r\n{\"service\":",
    )
    .await
    .unwrap();
    let (answer, _) = read_until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("request_timeout") && answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(metric(&m, "tandem_http_request_timeouts_total{}").await, 1.0);

    // The blocking query waited its 2 s and answered; the stream still delivers changes.
    let waited = blocking.await.unwrap().expect("a blocking query is exempt up to its wait");
    assert!(waited["index"].as_u64().is_some(), "{waited}");
    well_behaved(&c, 2).await;
    let line = tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await.unwrap().unwrap();
    assert!(line.is_some_and(|l| String::from_utf8_lossy(&l).contains("ok-2")), "the stream lives on");
    assert_eq!(metric(&m, "tandem_http_request_timeouts_total{}").await, 1.0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_floods_are_capped_per_address_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tuned(dir.path(), |c| {
        c.http.connections_per_address_max = 20;
        c.http.connections_max = 50;
    });
    let node = Node::start(cfg, None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    well_behaved(&c, 1).await; // holds one pooled connection from 127.0.0.1

    // One address: 20 get in, 10 more are refused (a 503 if the socket took it, or closed).
    let mut held = Vec::new();
    for _ in 0..30 {
        held.push(connect_from([127, 0, 0, 2], addr).await.unwrap());
    }
    let refused = "tandem_http_connections_refused_total{limit=\"connections_per_address_max\"}";
    eventually(Duration::from_secs(3), "10 refused per address", || async {
        metric(&m, refused).await == 10.0
    })
    .await;
    let mut closed = 0;
    for s in held.iter_mut().skip(20) {
        let (answer, was_closed) = read_until_closed(s, Duration::from_secs(2)).await;
        assert!(was_closed && (answer.is_empty() || answer.contains("too_many_connections")), "{answer}");
        closed += 1;
    }
    assert_eq!(closed, 10);
    held.truncate(20);
    well_behaved(&c, 2).await;

    // Many addresses: the node-wide cap (50, with 21 open) refuses the rest.
    for from in 3..=5u8 {
        for _ in 0..15 {
            held.push(connect_from([127, 0, 0, from], addr).await.unwrap());
        }
    }
    let refused_total = "tandem_http_connections_refused_total{limit=\"connections_max\"}";
    eventually(Duration::from_secs(3), "the node-wide cap refuses", || async {
        metric(&m, refused_total).await >= 16.0
    })
    .await;
    assert_eq!(metric(&m, "tandem_http_connections_limit{}").await, 50.0);
    well_behaved_at_the_cap(&c, 3).await; // through its connection opened before the flood
    drop(held);
    // After the flood, new clients get in again.
    let fresh = client(&node);
    eventually(Duration::from_secs(3), "a new client is served", || async {
        fresh.discover("default", "calm", "").await.is_ok()
    })
    .await;
    well_behaved(&fresh, 4).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused_with_431() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    let big = "x".repeat(100 * 1024);
    let mut probes = Vec::new();
    for _ in 0..20 {
        let mut s = connect_from([127, 0, 0, 2], addr).await.unwrap();
        let head = format!("GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: {big}\r\n\r\n");
        // The node may stop reading (and close) before it has taken the whole head.
        let _ = s.write_all(head.as_bytes()).await;
        probes.push(s);
    }
    well_behaved(&c, 1).await;
    for s in &mut probes {
        let (answer, closed) = read_until_closed(s, Duration::from_secs(3)).await;
        assert!(closed, "an oversized head left its connection open");
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    }
    assert_eq!(metric(&m, "tandem_http_connections_closed_total{reason=\"header_too_large\"}").await, 20.0);
    // A head within the limit is served.
    let ok = reqwest::Client::new()
        .get(format!("http://{addr}/v1/status"))
        .header("x-fine", "y".repeat(16 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    well_behaved(&c, 2).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_is_refused_and_admin_calls_must_be_marked_and_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let base = format!(
        "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n[http]\nadmin_calls_per_minute = 3\n",
        dir.path().join("d").display()
    );
    std::fs::write(&path, &base).unwrap();
    let node = Node::start(Config::load(&path).unwrap(), Some(path.clone())).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    let h = reqwest::Client::new();

    // DNS rebinding: the page's name arrives as the Host header.
    let r =
        h.get(format!("http://{addr}/v1/services/default/calm")).header("host", "evil.example").send().await;
    let r = r.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "host_not_allowed");
    let r =
        h.get(format!("http://{addr}/v1/status")).header("host", format!("localhost:{}", addr.port())).send();
    assert_eq!(r.await.unwrap().status(), 200);
    assert_eq!(metric(&m, "tandem_http_requests_refused_total{reason=\"host\"}").await, 1.0);
    well_behaved(&c, 1).await;

    // A cross-site form or fetch without preflight: bodyless, or a "simple" content type.
    let url = format!("http://{addr}/v1/admin/reload");
    for ct in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let mut req = h.post(&url);
        if let Some(ct) = ct {
            req = req.header("content-type", ct).body("x=1");
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 415, "{ct:?}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "admin_needs_json");
    }
    assert_eq!(metric(&m, "tandem_http_requests_refused_total{reason=\"admin_unmarked\"}").await, 3.0);

    // A broken file: the error says where to look, never echoes the file.
    std::fs::write(&path, format!("{base}secret_token = \"hunter2\n")).unwrap();
    let r = h.post(&url).header("x-tandem-admin", "1").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(!text.contains("hunter2") && !text.contains("secret_token") && text.contains("log"), "{text}");
    std::fs::write(&path, &base).unwrap();
    let r = h.post(&url).json(&serde_json::json!({})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = h.post(&url).json(&serde_json::json!({})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The fourth call within the minute.
    let r = h.post(&url).json(&serde_json::json!({})).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "rate_limited");
    assert_eq!(metric(&m, "tandem_http_requests_refused_total{reason=\"admin_rate\"}").await, 1.0);
    well_behaved(&c, 2).await;
    node.shutdown().await;
}

/// The node's open descriptors (Linux).
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_open_files_limit_connections_stop_before_rocksdb_descriptors() {
    if !std::path::Path::new("/proc/self/fd").exists() {
        return; // counts descriptors through /proc
    }
    const NOFILE: u64 = 400;
    const MAX_OPEN_FILES: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port();
    let path = dir.path().join("node.toml");
    std::fs::write(
        &path,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{port}\"\n[store]\nmax_open_files = \
             {MAX_OPEN_FILES}\n[http]\nconnections_max = 5000\nconnections_per_address_max = 5000\n\
             header_read_timeout_ms = 30000\n",
            dir.path().join("d").display()
        ),
    )
    .unwrap();
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {NOFILE} && exec \"$0\" server --config \"$1\""))
        .arg(tandem_bin())
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Kill(child);
    let pid = server.0.id();
    let c = Client::new(&[format!("http://127.0.0.1:{port}")]);
    eventually(Duration::from_secs(20), "server answers", || async { c.status().await.is_ok() }).await;
    well_behaved(&c, 1).await; // its connection is open before the flood

    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let cap = NOFILE - MAX_OPEN_FILES - tandem::http::listener::DESCRIPTORS_RESERVED;
    let mut held = Vec::new();
    for i in 0..(cap + 150) {
        let from = [127, 0, 0, 2 + (i % 4) as u8];
        held.push(connect_from(from, addr).await.unwrap());
    }
    // The flood's last connections are refused: the node's descriptors stay below the
    // limit less RocksDB's share (counted from outside: /metrics needs a connection).
    for _ in 0..100 {
        if open_descriptors(pid) as u64 <= NOFILE - MAX_OPEN_FILES {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fds = open_descriptors(pid) as u64;
    assert!(fds <= NOFILE - MAX_OPEN_FILES, "{fds} descriptors open: RocksDB's share was taken");
    for i in 0..20 {
        well_behaved_at_the_cap(&c, 10 + i).await;
    }
    drop(held);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        if let Ok(r) = reqwest::get(&url).await {
            break r.text().await.unwrap();
        }
        assert!(Instant::now() < deadline, "/metrics not served after the flood");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let n = metric_in(&text, "tandem_http_connections_refused_total{limit=\"connections_max\"}");
    assert!(n >= 149.0, "{n} refused");
    assert_eq!(metric_in(&text, "tandem_http_connections_limit{}"), cap as f64);
    well_behaved(&c, 99).await;
    drop(server);
}

/// A burst of connections that ends leaves its heap to the OS (`heap.rs`): once 100
/// connections were each answered and closed, the process trims within a few ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heap_a_burst_of_connections_freed_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let m = Metrics::of(&node).await;
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut s = connect_from([127, 0, 0, 2], node.http_addr()).await.unwrap();
        s.write_all(b"GET /v1/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
        held.push(s);
    }
    for s in &mut held {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap().unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    }
    let trims = "tandem_heap_trims_total{reason=\"connections\"}";
    let before = metric(&m, trims).await;
    drop(held);
    eventually(Duration::from_secs(5), "a trim once the burst is over", || async {
        metric(&m, trims).await > before
    })
    .await;
    let text = m.http.get(&m.url).send().await.unwrap().text().await.unwrap();
    let rss = text.lines().find_map(|l| l.strip_prefix("process_resident_memory_bytes "));
    assert!(rss.and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v > 0.0), "{rss:?}");
    node.shutdown().await;
}

/// A log that goes quiet after a burst of registrations hands its memtables to table files,
/// and the heap they held back to the OS (`node/idle.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_node_flushes_its_memtables_and_gives_their_heap_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let m = Metrics::of(&node).await;
    let url = format!("http://{}/v1/registrations", node.http_addr());
    register_burst(&m.http, &url, 32).await;
    let (flushes, trims) =
        ("tandem_store_idle_flushes_total{}", "tandem_heap_trims_total{reason=\"memtables\"}");
    eventually(Duration::from_secs(10), "a flush once the log is quiet, then a trim", || async {
        metric(&m, flushes).await >= 1.0 && metric(&m, trims).await >= 1.0
    })
    .await;
    assert!(metric(&m, "tandem_store_idle_flushed_bytes_total{}").await >= (1 << 20) as f64);
    // What is left in the memtables is not worth another flush while nothing is written.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric(&m, flushes).await, 1.0);
    node.shutdown().await;
}
