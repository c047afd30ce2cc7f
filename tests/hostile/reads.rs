//! Hostile reads and watches (issue 14): reads of made-up services must leave no state and
//! move no index (checked on a real `tandem server` process: its index and its VmRSS),
//! watchers of absent services must not wake for other services' writes, services that
//! empty are dropped (and their watchers still woken when they come back), services and
//! namespaces are capped for local registrations, and streaming watches and blocking
//! queries are capped per client address as well as in total.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

/// A node started from a config file: `single_config`'s settings plus `extra` TOML (new
/// keys are written as text, so an older node refuses them at load).
async fn node_with(dir: &std::path::Path, extra: &str) -> Node {
    let path = dir.join("node.toml");
    std::fs::write(
        &path,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n[health]\ncheck_interval_ms = 50\n{extra}",
            dir.join("d").display()
        ),
    )
    .unwrap();
    Node::start(Config::load(&path).expect("the test's config loads"), Some(path)).await.unwrap()
}

/// A real `tandem server` process on a free loopback port; killed on drop.
struct Server {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(extra: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_tcp_port();
        let path = dir.path().join("node.toml");
        let text = format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{port}\"\n{extra}",
            dir.path().join("d").display()
        );
        std::fs::write(&path, text).unwrap();
        let child = std::process::Command::new(tandem_bin())
            .arg("server")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let s = Server { child, port, _dir: dir };
        let c = s.client();
        eventually(Duration::from_secs(20), "server answers", || async { c.status().await.is_ok() }).await;
        s
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn client(&self) -> Client {
        Client::new(&[self.url()])
    }

    /// The process's resident set (`VmRSS`), KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/<pid>/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A made-up service name of 100 bytes.
fn made_up(i: usize) -> String {
    let mut s = format!("nosuch-{i:07}-");
    while s.len() < 100 {
        s.push('x');
    }
    s
}

/// Most the node's resident set may grow during the probe (connection buffers and
/// allocator slack; the probe's names alone would take several times this if kept).
const PROBE_RSS_GROWTH_KIB_MAX: u64 = 3 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_made_up_services_create_no_state_and_move_no_index() {
    if !std::path::Path::new("/proc/self/status").exists() {
        return; // reads VmRSS through /proc
    }
    const READS: usize = 12_000;
    const TASKS: usize = 12;
    let server = Server::start("").await;
    let base = server.url();
    let c = server.client();
    let h = reqwest::Client::new();
    // Warm up the connections and the allocator with reads that name nothing.
    let warm: Vec<_> = (0..TASKS)
        .map(|_| {
            let (h, url) = (h.clone(), format!("{base}/v1/status"));
            tokio::spawn(async move {
                for _ in 0..100 {
                    h.get(&url).send().await.unwrap().bytes().await.unwrap();
                }
            })
        })
        .collect();
    for t in warm {
        t.await.unwrap();
    }
    let index_before = c.status().await.unwrap()["index"].as_u64().unwrap();
    let rss_before = server.rss_kib();

    // Plain reads, ?dc=all, ?dc=<other>, explain, and some blocking queries, each of a
    // service nobody registered.
    let probe: Vec<_> = (0..TASKS)
        .map(|t| {
            let (h, base) = (h.clone(), base.clone());
            tokio::spawn(async move {
                for i in (t..READS).step_by(TASKS) {
                    let q = match i % 10 {
                        0 => "?dc=all".to_owned(),
                        1 => "?explain=true".to_owned(),
                        2 => "?dc=dc-b".to_owned(),
                        3 if i % 100 == 3 => format!("?index={index_before}&wait=20ms"),
                        _ => String::new(),
                    };
                    let r =
                        h.get(format!("{base}/v1/services/default/{}{q}", made_up(i))).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                }
            })
        })
        .collect();
    for t in probe {
        t.await.unwrap();
    }
    // Streaming watches of made-up services, opened and left.
    for i in 0..100 {
        let mut r =
            h.get(format!("{base}/v1/services/default/{}?stream=true", made_up(READS + i))).send().await;
        let r = r.as_mut().unwrap();
        assert!(r.chunk().await.unwrap().is_some());
    }
    let index_after = c.status().await.unwrap()["index"].as_u64().unwrap();
    let rss_after = server.rss_kib();
    eprintln!("index {index_before} -> {index_after}; RSS {rss_before} KiB -> {rss_after} KiB");
    assert_eq!(index_after, index_before, "reads of unknown services moved the node's index");
    let text = h.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric_in(&text, "tandem_services{}"), 0.0, "reads created services");
    assert!(
        rss_after <= rss_before + PROBE_RSS_GROWTH_KIB_MAX,
        "RSS grew from {rss_before} KiB to {rss_after} KiB over {READS} reads of unknown services"
    );
    for i in 0..3 {
        well_behaved(&c, i).await;
    }
}

/// Counts the answer lines a streaming watch receives (a line per answer, keep-alives not
/// counted) until the task is aborted.
fn count_lines(mut r: reqwest::Response, lines: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(Some(chunk)) = r.chunk().await {
            let n = chunk.windows(8).filter(|w| w == b"\"index\":").count();
            lines.fetch_add(n, Ordering::Relaxed);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_of_absent_services_sleep_through_other_writes_and_emptied_services_are_dropped() {
    const WATCHERS: usize = 200;
    const WRITES: u16 = 20;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    well_behaved(&c, 0).await; // "calm" exists

    // 200 streams of absent services on one HTTP/2 connection: each gets its first answer.
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let lines = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..WATCHERS {
        let mut r = h2
            .get(format!("http://{addr}/v1/services/default/{}?stream=true", made_up(i)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.chunk().await.unwrap().is_some(), "first answer");
        tasks.push(count_lines(r, lines.clone()));
    }
    // Watchers of "later" (absent now): a stream and a blocking query.
    let later = c.discover("default", "later", "").await.unwrap();
    let later_index = later["index"].as_u64().unwrap();
    let mut later_stream =
        h2.get(format!("http://{addr}/v1/services/default/later?stream=true")).send().await.unwrap();
    assert!(later_stream.chunk().await.unwrap().is_some());
    let blocked = {
        let c = client(&node);
        tokio::spawn(
            async move { c.discover("default", "later", &format!("index={later_index}&wait=20s")).await },
        )
    };

    // 20 writes to "calm" only.
    for port in 0..WRITES {
        let mut b = reg_body("calm", "ok-0", true);
        b["port"] = serde_json::json!(9000 + port);
        c.register(&b).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lines.load(Ordering::Relaxed),
        0,
        "{WATCHERS} watchers of absent services woke for {WRITES} writes of another service"
    );
    assert!(!blocked.is_finished(), "a blocking query of an absent service returned for another's writes");

    // "later" appears: both of its watchers are woken with it.
    let started = Instant::now();
    c.register(&reg_body("later", "l-1", true)).await.unwrap();
    let answer = blocked.await.unwrap().unwrap();
    assert_eq!(ids(&answer), vec!["l-1".to_owned()]);
    assert!(answer["index"].as_u64().unwrap() > later_index);
    let line =
        tokio::time::timeout(Duration::from_secs(3), later_stream.chunk()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&line).contains("l-1"));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(metric(&m, "tandem_services{}").await, 2.0);

    // "later" empties: it is dropped, its stream sees it go and come back, its index
    // never goes backwards.
    let shown = answer["index"].as_u64().unwrap();
    c.deregister("default", "later", "l-1").await.unwrap();
    let gone =
        tokio::time::timeout(Duration::from_secs(3), later_stream.chunk()).await.unwrap().unwrap().unwrap();
    let gone: Value = serde_json::from_slice(&gone).unwrap();
    assert!(ids(&gone).is_empty(), "{gone}");
    let gone_index = gone["index"].as_u64().unwrap();
    assert!(gone_index > shown);
    eventually(Duration::from_secs(3), "the emptied service is dropped", || async {
        metric(&m, "tandem_services{}").await == 1.0
    })
    .await;
    let list =
        reqwest::get(format!("http://{addr}/v1/services")).await.unwrap().json::<Value>().await.unwrap();
    assert!(!list.to_string().contains("later"), "{list}");
    let again = c.discover("default", "later", "").await.unwrap();
    assert!(again["index"].as_u64().unwrap() >= gone_index, "{again}");
    let blocked = {
        let c = client(&node);
        let i = again["index"].as_u64().unwrap();
        tokio::spawn(async move { c.discover("default", "later", &format!("index={i}&wait=20s")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.register(&reg_body("later", "l-2", true)).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(3), blocked).await.unwrap().unwrap().unwrap();
    assert_eq!(ids(&back), vec!["l-2".to_owned()]);
    let line =
        tokio::time::timeout(Duration::from_secs(3), later_stream.chunk()).await.unwrap().unwrap().unwrap();
    let line: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(ids(&line), vec!["l-2".to_owned()]);
    assert!(line["index"].as_u64().unwrap() > gone_index);
    for t in tasks {
        t.abort();
    }
    well_behaved(&c, 1).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_registrations_are_capped_by_services_and_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_with(dir.path(), "[limits]\nservices_max = 4\nnamespaces_max = 2\n").await;
    let c = client(&node);
    let m = Metrics::of(&node).await;
    let reg = |ns: &str, svc: &str, id: &str| {
        let mut b = reg_body(svc, id, true);
        b["namespace"] = serde_json::json!(ns);
        b
    };
    let h = reqwest::Client::new();
    let url = format!("http://{}/v1/register", node.http_addr());
    let post = |b: Value| {
        let (h, url) = (h.clone(), url.clone());
        async move { h.post(&url).json(&b).send().await.unwrap() }
    };
    for (ns, svc) in [("default", "a"), ("default", "b"), ("n2", "c")] {
        assert_eq!(post(reg(ns, svc, "i1")).await.status(), 200, "{ns}/{svc}");
    }
    let r = post(reg("n3", "d", "i1")).await;
    assert_eq!(r.status(), 507);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "too_many_namespaces");
    assert_eq!(post(reg("default", "d", "i1")).await.status(), 200);
    let r = post(reg("default", "e", "i1")).await;
    assert_eq!(r.status(), 507);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "too_many_services");
    // More instances of a service held are not new services.
    assert_eq!(post(reg("default", "a", "i2")).await.status(), 200);
    assert_eq!(metric(&m, "tandem_services{}").await, 4.0);
    assert_eq!(metric(&m, "tandem_namespaces{}").await, 2.0);
    assert_eq!(metric(&m, "tandem_registrations_refused_total{limit=\"services_max\"}").await, 1.0);
    assert_eq!(metric(&m, "tandem_registrations_refused_total{limit=\"namespaces_max\"}").await, 1.0);
    // A service that empties frees its place.
    c.deregister("default", "b", "i1").await.unwrap();
    eventually(Duration::from_secs(3), "the emptied service frees a place", || async {
        post(reg("default", "e", "i1")).await.status() == 200
    })
    .await;
    node.shutdown().await;
}

/// A client whose connections come from `from` (a loopback address).
fn client_from(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder().local_address(std::net::IpAddr::from(from)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_blocking_queries_are_capped_per_address_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_with(
        dir.path(),
        "[http]\nwatch_streams_max = 30\nwatch_streams_per_address_max = 20\n\
         blocking_queries_max = 30\nblocking_queries_per_address_max = 20\n",
    )
    .await;
    let addr = node.http_addr();
    let c = client(&node);
    let m = Metrics::of(&node).await;
    well_behaved(&c, 0).await;
    let index = c.discover("default", "calm", "").await.unwrap()["index"].as_u64().unwrap();
    let stream_url = format!("http://{addr}/v1/services/default/calm?stream=true");
    let blocking_url = format!("http://{addr}/v1/services/default/calm?index={index}&wait=5s");

    // One address takes its 20 streams; 5 more are refused with 429 and Retry-After.
    let flood = client_from([127, 0, 0, 2]);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..25 {
        let r = flood.get(&stream_url).send().await.unwrap();
        if r.status() == 200 {
            held.push(r);
        } else {
            assert_eq!(r.status(), 429);
            assert!(r.headers().contains_key("retry-after"));
            assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "too_many_watches");
            refused += 1;
        }
    }
    assert_eq!((held.len(), refused), (20, 5));
    // Another address is still served, up to the node-wide cap (503 past it).
    let mut mine = c_stream(&stream_url).await;
    assert!(mine.chunk().await.unwrap().is_some());
    let other = client_from([127, 0, 0, 3]);
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = other.get(&stream_url).send().await.unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 200 {
            held.push(r);
        }
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 9, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 3, "{statuses:?}");
    assert_eq!(metric(&m, "tandem_watch_streams{}").await, 30.0);
    assert_eq!(
        metric(&m, "tandem_http_requests_refused_total{reason=\"watch_streams_per_address_max\"}").await,
        5.0
    );
    assert_eq!(metric(&m, "tandem_http_requests_refused_total{reason=\"watch_streams_max\"}").await, 3.0);
    drop(held);
    drop(mine);

    // Blocking queries: the same per address and in total.
    let pending: Vec<_> = (0..20)
        .map(|_| {
            let (f, u) = (flood.clone(), blocking_url.clone());
            tokio::spawn(async move { f.get(&u).send().await.unwrap().status().as_u16() })
        })
        .collect();
    eventually(Duration::from_secs(3), "20 blocking queries wait", || async {
        metric(&m, "tandem_blocking_queries{}").await == 20.0
    })
    .await;
    let r = flood.get(&blocking_url).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "too_many_blocking_queries");
    assert_eq!(
        metric(&m, "tandem_http_requests_refused_total{reason=\"blocking_queries_per_address_max\"}").await,
        1.0
    );
    // A well-behaved client's blocking query is served: it returns on the next change.
    let mine = {
        let c = client(&node);
        tokio::spawn(async move { c.discover("default", "calm", &format!("index={index}&wait=5s")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    well_behaved(&c, 1).await;
    let answer = tokio::time::timeout(Duration::from_secs(3), mine).await.unwrap().unwrap().unwrap();
    assert!(ids(&answer).contains(&"ok-1".to_owned()), "{answer}");
    for p in pending {
        assert_eq!(p.await.unwrap(), 200);
    }
    node.shutdown().await;
}

async fn c_stream(url: &str) -> reqwest::Response {
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.status(), 200, "a well-behaved client's stream is served");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_cap_never_refuses_replicated_records() {
    let p = pair_with(|c| {
        if c.dc == "dc-a" {
            c.limits.services_max = 2;
        }
    })
    .await;
    let (a, b) = (p.client_a(), p.client_b());
    for svc in ["r1", "r2", "r3"] {
        b.register(&reg_body(svc, &format!("{svc}-b"), true)).await.unwrap();
    }
    eventually(Duration::from_secs(10), "dc-a holds dc-b's three services", || async {
        let mut n = 0;
        for svc in ["r1", "r2", "r3"] {
            n += a.discover("default", svc, "dc=dc-b").await.map_or(0, |d| ids(&d).len());
        }
        n == 3
    })
    .await;
    let m = Metrics::of(p.a.as_ref().unwrap()).await;
    assert_eq!(metric(&m, "tandem_services{}").await, 3.0, "replicated services are counted");
    // dc-a's own new services are refused past its cap; its instances of held ones are not.
    let e = a.register(&reg_body("mine", "m-a", true)).await.unwrap_err().to_string();
    assert!(e.contains("too_many_services"), "{e}");
    a.register(&reg_body("r1", "r1-a", true)).await.unwrap();
    p.stop().await;
}
