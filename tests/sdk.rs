//! The client SDK against real registry nodes (RocksDB on disk, HTTP on loopback), plus the
//! pure parts (push-empty rule, selection, outlier ejection, snapshot files) on their own.
//! Every wait is bounded.

mod common;
#[path = "sdk/together.rs"]
mod together;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use rand::SeedableRng;
use serde_json::json;
use tandem::config::Config;
use tandem::node::Node;
use tandem_client::api::StatusName;
use tandem_client::sdk::balance::Reported;
use tandem_client::sdk::model::Answer;
use tandem_client::sdk::{
    snapshot, Balancer, Cache, ClientConfig, Consumer, EjectionConfig, EmptyRule, Health, Instance,
    InstanceSpec, Outcome, Provider, ServiceView, Status, Strategy, ViewSource,
};

/// SDK settings with short timings, for `addrs`.
fn sdk_config(addrs: &[String]) -> ClientConfig {
    let mut c = ClientConfig::new(addrs.iter().cloned());
    c.connect_timeout = Duration::from_millis(500);
    c.request_timeout = Duration::from_secs(2);
    c.retry.initial = Duration::from_millis(50);
    c.retry.max = Duration::from_millis(300);
    c.provider.drain.confirm_within = Duration::from_secs(2);
    c.provider.drain.linger = Duration::from_millis(100);
    c.consumer.watch_wait = Duration::from_secs(1);
    c.consumer.full_pull_interval = Duration::from_secs(30);
    c.consumer.request_interval_min = Duration::from_millis(10);
    c
}

fn url(node: &Node) -> String {
    format!("http://{}", node.http_addr())
}

/// An address where nothing listens.
fn dead_addr() -> String {
    format!("http://127.0.0.1:{}", free_tcp_port())
}

/// A node config on a fixed HTTP port, so a restarted node is found at the same address.
fn fixed_port_config(dir: &std::path::Path) -> Config {
    let mut c = single_config(dir, "dc-a");
    c.http_addr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    c
}

fn ids_of(instances: &[Instance]) -> Vec<String> {
    instances.iter().map(|i| i.instance_id.to_string()).collect()
}

async fn register_persistent(node: &Node, service: &str, ids: &[&str]) {
    let c = client(node);
    for id in ids {
        c.register(&reg_body(service, id, true)).await.unwrap();
    }
}

/// Waits (bounded) until the consumer's view satisfies `f`.
async fn view_until(consumer: &Consumer, within: Duration, what: &str, f: impl Fn(&ServiceView) -> bool) {
    let mut rx = consumer.changes();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f(&rx.borrow_and_update()) {
            return;
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => {
                let v = consumer.view();
                panic!(
                    "not within {within:?}: {what}; view {:?} {:?}",
                    ids_of(&v.instances),
                    consumer.status()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Provider against a real node.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_heartbeats_keep_an_instance_alive_past_its_ttl_and_shutdown_drains_then_deregisters() {
    let dir = tempfile::tempdir().unwrap();
    let mut ncfg = single_config(dir.path(), "dc-a");
    ncfg.protection.protect_threshold = 0.0;
    let node = Node::start(ncfg, None).await.unwrap();
    let addrs = [url(&node)];
    let c = client(&node);

    let ttl = Duration::from_millis(1_200);
    let spec = InstanceSpec::new("hb", "10.0.0.9", 9000)
        .instance_id("hb-1")
        .ttl(ttl)
        .zone("az1")
        .meta("team", "pay");
    let provider = Provider::register(sdk_config(&addrs), spec).await.unwrap();
    assert_eq!(provider.instance_id(), "hb-1");
    let st = provider.state();
    assert_eq!((st.owner_dc.as_str(), st.lease_ttl), ("dc-a", ttl));
    assert_eq!(st.heartbeat_interval, ttl / 8, "default period: an eighth of the lease");

    // A consumer that applies empty answers at once, to see the whole way out.
    let mut ccfg = sdk_config(&addrs);
    ccfg.consumer.empty_rule = EmptyRule { confirmations: 1, confirm_after: Duration::ZERO };
    let consumer = Consumer::watch(ccfg, "default", "hb").await.unwrap();

    // Three lease lengths: without heartbeats it would have expired twice over.
    let until = Instant::now() + 3 * ttl;
    while Instant::now() < until {
        let d = c.discover("default", "hb", "dc=all").await.unwrap();
        let health = d["instances"][0]["health"].as_str().unwrap_or("gone").to_owned();
        assert!(health == "healthy" || health == "suspect", "instance went {health}: {d}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(provider.state().heartbeats_ok >= 10, "{:?}", provider.state());
    assert_eq!(provider.state().reregistrations, 0);
    assert_eq!(consumer.instances()[0].metadata.get("team").map(String::as_str), Some("pay"));

    // Graceful shutdown: consumers see draining first, then the instance goes.
    let shutdown = tokio::spawn(provider.shutdown());
    view_until(&consumer, Duration::from_secs(3), "draining visible", |v| {
        v.instances.first().is_some_and(|i| i.status == Status::Draining)
    })
    .await;
    assert!(consumer.pick().is_none(), "a draining instance is never picked");
    tokio::time::timeout(Duration::from_secs(5), shutdown).await.unwrap().unwrap().unwrap();
    view_until(&consumer, Duration::from_secs(3), "instance gone", |v| v.instances.is_empty()).await;
    assert!(ids(&c.discover("default", "hb", "dc=all").await.unwrap()).is_empty());
    assert_eq!(c.heartbeat("default", "hb", "hb-1").await.unwrap_err().status(), Some(404));
    consumer.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_registers_again_after_the_instance_was_deleted_server_side() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let addrs = [url(&node)];
    let c = client(&node);
    let ttl = Duration::from_millis(1_600);

    // A client-chosen id comes back as the same id, with its status.
    let fixed = Provider::register(
        sdk_config(&addrs),
        InstanceSpec::new("rr", "10.0.0.1", 1).instance_id("rr-1").ttl(ttl),
    )
    .await
    .unwrap();
    fixed.set_status(Status::OutOfService).await.unwrap();
    c.deregister("default", "rr", "rr-1").await.unwrap();
    eventually(Duration::from_secs(3), "rr-1 registered again", || async {
        let d = c.discover("default", "rr", "dc=all").await.unwrap();
        ids(&d) == ["rr-1"] && d["instances"][0]["status"] == "out_of_service"
    })
    .await;
    assert_eq!(fixed.state().reregistrations, 1);

    // A generated id is not reused: the old instance is gone, a new one takes its place.
    let generated = Provider::register(sdk_config(&addrs), InstanceSpec::new("gen", "10.0.0.2", 2).ttl(ttl))
        .await
        .unwrap();
    let old = generated.instance_id();
    assert!(old.starts_with("gen#10.0.0.2:2#"), "{old}");
    c.deregister("default", "gen", &old).await.unwrap();
    eventually(Duration::from_secs(3), "a new generated id", || async {
        let now = ids(&c.discover("default", "gen", "dc=all").await.unwrap());
        now.len() == 1 && now[0] != old && now[0] == generated.instance_id()
    })
    .await;
    fixed.shutdown().await.unwrap();
    generated.shutdown().await.unwrap();
    node.shutdown().await;
}

/// A counter of the node's `/metrics` (dc-a).
async fn metric(node: &Node, name: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", url(node))).await.unwrap().text().await.unwrap();
    let prefix = format!("{name}{{dc=\"dc-a\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_renews_all_its_instances_in_batched_requests_chunked_at_the_batch_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let addrs = [url(&node)];
    // More instances than one request may carry (512): each round goes out as two requests.
    let count = tandem_client::api::HEARTBEAT_BATCH_MAX + 8;
    let ttl = Duration::from_millis(2_400);
    let mut providers = Vec::with_capacity(count);
    for wave in 0..count.div_ceil(64) {
        let regs = (wave * 64..count.min((wave + 1) * 64)).map(|i| {
            let spec =
                InstanceSpec::new("fleet", "10.0.0.1", 1 + i as u16).instance_id(format!("f-{i}")).ttl(ttl);
            Provider::register(sdk_config(&addrs), spec)
        });
        for p in futures::future::join_all(regs).await {
            providers.push(p.unwrap());
        }
    }
    let (batches0, beats0) = (
        metric(&node, "tandem_heartbeat_batches_total").await,
        metric(&node, "tandem_heartbeats_total").await,
    );
    // Every instance renewed at least twice (the period is an eighth of the lease: 300 ms).
    let ps = &providers;
    eventually(Duration::from_secs(5), "every instance renewed twice", || async move {
        ps.iter().all(|p| p.state().heartbeats_ok >= 2)
    })
    .await;
    let batches = metric(&node, "tandem_heartbeat_batches_total").await - batches0;
    let beats = metric(&node, "tandem_heartbeats_total").await - beats0;
    assert!(providers.iter().all(|p| p.state().heartbeats_failed == 0), "no request was refused");
    assert!(batches >= 4, "two rounds of two requests at least: {batches}");
    // One round renews all 520 in two requests (512 + 8); single heartbeats would make it 1.
    assert!(beats >= 2 * count as u64 && beats / batches >= 200, "{beats} renewals in {batches} requests");
    let c = client(&node);
    let d = c.discover("default", "fleet", "dc=all").await.unwrap();
    assert_eq!(d["instances"].as_array().map(Vec::len), Some(count));
    drop(providers);
    node.shutdown().await;
}

#[tokio::test]
async fn provider_register_refuses_bad_input_without_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let cfg = sdk_config(&[url(&node)]);
    let e =
        Provider::register(cfg.clone(), InstanceSpec::new("bad name", "10.0.0.1", 1)).await.err().unwrap();
    assert!(!e.is_retryable(), "{e}");
    let t = Instant::now();
    let e = Provider::register(cfg, InstanceSpec::new("s", "10.0.0.1", 1).ttl(Duration::from_millis(1)))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("ttl_ms"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1), "a 4xx is not retried");
    let e = Provider::register(sdk_config(&[dead_addr()]), InstanceSpec::new("s", "10.0.0.1", 1))
        .await
        .err()
        .unwrap();
    assert!(e.is_retryable(), "{e}");
    node.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Consumer against real nodes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_sees_changes_through_the_blocking_watch_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    register_persistent(&node, "w", &["w1"]).await;
    let mut cfg = sdk_config(&[url(&node)]);
    cfg.consumer.watch_wait = Duration::from_secs(3);
    let consumer = Consumer::watch(cfg, "default", "w").await.unwrap();
    assert_eq!(ids_of(&consumer.instances()), ["w1"]);
    assert_eq!(consumer.view().source, ViewSource::Registry);
    let first_index = consumer.last_index();
    assert!(first_index > 0);
    let mut rx = consumer.changes();
    rx.borrow_and_update();
    // Let the consumer's blocking query get parked on the server.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let t = Instant::now();
    register_persistent(&node, "w", &["w2"]).await;
    tokio::time::timeout(Duration::from_secs(3), rx.changed()).await.unwrap().unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1_000), "the watch woke after {took:?}, not at once");
    assert_eq!(ids_of(&rx.borrow().instances), ["w1", "w2"]);
    assert!(consumer.last_index() > first_index);

    client(&node).set_status("default", "w", "w1", StatusName::Draining).await.unwrap();
    view_until(&consumer, Duration::from_secs(2), "w1 draining", |v| {
        v.instances[0].status == Status::Draining
    })
    .await;
    for _ in 0..20 {
        assert_eq!(&*consumer.pick().unwrap().instance_id, "w2", "draining instances are skipped");
    }
    consumer.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_restart_does_not_empty_the_consumer_view() {
    let dir = tempfile::tempdir().unwrap();
    let ncfg = fixed_port_config(dir.path());
    let node = Node::start(ncfg.clone(), None).await.unwrap();
    register_persistent(&node, "r", &["r1", "r2"]).await;
    // A dead address first: the consumer moves on to the live one.
    let consumer = Consumer::watch(sdk_config(&[dead_addr(), url(&node)]), "default", "r").await.unwrap();
    assert_eq!(ids_of(&consumer.instances()), ["r1", "r2"]);

    node.shutdown().await;
    eventually(Duration::from_secs(5), "the consumer notices the registry is gone", || async {
        consumer.status().consecutive_errors >= 3
    })
    .await;
    assert!(!consumer.status().connected);
    assert_eq!(ids_of(&consumer.instances()), ["r1", "r2"], "view kept while no registry answers");
    assert!(consumer.pick().is_some());

    let node = Node::start(ncfg, None).await.unwrap();
    register_persistent(&node, "r", &["r3"]).await;
    view_until(&consumer, Duration::from_secs(5), "r3 after the restart", |v| v.instances.len() == 3).await;
    assert!(consumer.status().connected);
    assert_eq!(consumer.status().empty_held, None);
    consumer.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_unreachable_keeps_the_view_and_never_notifies_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    register_persistent(&node, "u", &["u1", "u2"]).await;
    let consumer = Consumer::watch(sdk_config(&[url(&node), dead_addr()]), "default", "u").await.unwrap();
    let before = consumer.view();
    let mut rx = consumer.changes();
    rx.borrow_and_update();
    node.shutdown().await;
    eventually(Duration::from_secs(5), "several failed reads", || async {
        consumer.status().consecutive_errors >= 4
    })
    .await;
    assert!(!rx.has_changed().unwrap(), "no change published while unreachable");
    assert_eq!(consumer.view(), before);
    let st = consumer.status();
    assert!(st.last_error.as_deref().unwrap_or_default().contains("no registry reachable"), "{st:?}");
    assert!(consumer.pick().is_some());
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_snapshot_serves_a_cold_start_with_the_registry_down() {
    let dir = tempfile::tempdir().unwrap();
    let snap_dir = dir.path().join("sdk-cache");
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    register_persistent(&node, "cold", &["c1", "c2"]).await;
    let addrs = [url(&node)];
    let mut cfg = sdk_config(&addrs);
    cfg.consumer.snapshot_dir = Some(snap_dir.clone());
    let warm = Consumer::watch(cfg.clone(), "default", "cold").await.unwrap();
    let file = snapshot::path_for(&snap_dir, "default", "cold");
    assert!(file.exists(), "snapshot written on the first answer");
    register_persistent(&node, "cold", &["c3"]).await;
    view_until(&warm, Duration::from_secs(3), "c3", |v| v.instances.len() == 3).await;
    eventually(Duration::from_secs(3), "snapshot holds c3", || async {
        std::fs::read_to_string(&file).is_ok_and(|s| s.contains("\"c3\""))
    })
    .await;
    warm.close().await;
    node.shutdown().await;

    // A new process, no registry: the snapshot serves.
    let cold = Consumer::watch(cfg, "default", "cold").await.unwrap();
    let v = cold.view();
    assert!(matches!(v.source, ViewSource::Snapshot { saved_at_ms } if saved_at_ms > 0), "{:?}", v.source);
    assert_eq!(ids_of(&v.instances), ["c1", "c2", "c3"]);
    assert!(cold.pick().is_some());
    assert!(!cold.status().connected);
    // Without a snapshot dir there is nothing to serve, but the consumer still starts.
    let bare = Consumer::watch(sdk_config(&addrs), "default", "cold").await.unwrap();
    assert_eq!(bare.view().source, ViewSource::Empty);
    assert!(bare.pick().is_none());
    cold.close().await;
    bare.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_empty_protection_holds_the_empty_answer_of_a_registry_that_lost_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let ncfg = fixed_port_config(dir.path());
    let node = Node::start(ncfg.clone(), None).await.unwrap();
    register_persistent(&node, "pe", &["p1", "p2"]).await;
    let mut cfg = sdk_config(&[url(&node)]);
    cfg.consumer.empty_rule = EmptyRule { confirmations: 3, confirm_after: Duration::from_secs(60) };
    let consumer = Consumer::watch(cfg, "default", "pe").await.unwrap();
    let mut rx = consumer.changes();
    rx.borrow_and_update();

    // The registry comes back without its data (Nacos #10209): it answers an empty list.
    node.shutdown().await;
    std::fs::remove_dir_all(&ncfg.data_dir).unwrap();
    let node = Node::start(ncfg, None).await.unwrap();
    eventually(Duration::from_secs(5), "empty answers held", || async {
        consumer.status().empty_held.is_some_and(|p| p.seen >= 2)
    })
    .await;
    assert_eq!(ids_of(&consumer.instances()), ["p1", "p2"], "the empty answer is not applied");
    assert!(!rx.has_changed().unwrap());
    assert_eq!(consumer.status().empty_answers_held, 1, "one run of empty answers");
    assert!(consumer.pick().is_some());

    // A non-empty answer ends the hold and applies at once.
    register_persistent(&node, "pe", &["p9"]).await;
    view_until(&consumer, Duration::from_secs(3), "p9", |v| ids_of(&v.instances) == ["p9"]).await;
    assert_eq!(consumer.status().empty_held, None);
    consumer.close().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_empty_protection_applies_an_empty_answer_once_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    register_persistent(&node, "gone", &["g1", "g2"]).await;
    let mut cfg = sdk_config(&[url(&node)]);
    let rule = EmptyRule { confirmations: 3, confirm_after: Duration::from_millis(800) };
    cfg.consumer.empty_rule = rule;
    let consumer = Consumer::watch(cfg, "default", "gone").await.unwrap();
    let c = client(&node);
    c.deregister("default", "gone", "g1").await.unwrap();
    view_until(&consumer, Duration::from_secs(3), "g1 gone", |v| v.instances.len() == 1).await;
    let t = Instant::now();
    c.deregister("default", "gone", "g2").await.unwrap();
    eventually(Duration::from_secs(3), "empty answer held", || async {
        consumer.status().empty_held.is_some()
    })
    .await;
    assert_eq!(ids_of(&consumer.instances()), ["g2"]);
    view_until(&consumer, Duration::from_secs(4), "confirmed empty applied", |v| v.instances.is_empty())
        .await;
    let took = t.elapsed();
    assert!(took >= rule.confirm_after, "applied after {took:?}, before confirm_after");
    assert!(took < Duration::from_secs(3), "confirmation took {took:?}");
    assert_eq!(consumer.view().source, ViewSource::Registry);
    consumer.close().await;
    node.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Pure parts.

fn inst(id: &str, weight: u32) -> Instance {
    Instance {
        instance_id: id.into(),
        owner_dc: "dc-a".into(),
        address: "10.0.0.1".into(),
        port: 80,
        zone: "".into(),
        weight,
        version: "".into(),
        tags: vec![],
        metadata: BTreeMap::new(),
        health: Health::Healthy,
        status: Status::Up,
        stale: false,
        persistent: false,
        damped: false,
        seq: 1,
    }
}

fn answer(index: u64, instances: Vec<Instance>) -> Answer {
    Answer { index, instances, failover: None, protected: false }
}

#[test]
fn push_empty_rule_needs_both_the_count_and_the_time() {
    let rule = EmptyRule { confirmations: 3, confirm_after: Duration::from_millis(1_000) };
    let mut c = Cache::new("default", "s", rule);
    assert_eq!(c.handle_answer(answer(1, vec![inst("a", 1)]), 0), Outcome::Applied { changed: true });
    assert_eq!(c.recheck_in(0), None);
    // Three empties inside the window: not enough time.
    for (n, t) in [(1, 100), (2, 200), (3, 300)] {
        let o = c.handle_answer(answer(2, vec![]), t);
        assert!(matches!(o, Outcome::EmptyHeld(p) if p.seen == n && p.first_ms == 100), "{o:?}");
    }
    assert_eq!(c.recheck_in(300), Some(Duration::from_millis(800)), "enough seen: wait out the rest");
    assert_eq!(c.view().instances.len(), 1);
    // A non-empty answer starts the count again.
    assert_eq!(c.handle_answer(answer(3, vec![inst("a", 1)]), 400), Outcome::Applied { changed: false });
    assert_eq!(c.pending_empty(), None);
    // Enough time but too few answers.
    assert!(matches!(c.handle_answer(answer(4, vec![]), 500), Outcome::EmptyHeld(_)));
    assert_eq!(c.recheck_in(500), Some(Duration::from_millis(500)), "confirm_after / (confirmations - 1)");
    assert!(matches!(c.handle_answer(answer(4, vec![]), 5_000), Outcome::EmptyHeld(p) if p.seen == 2));
    assert_eq!(c.handle_answer(answer(4, vec![]), 5_001), Outcome::EmptyConfirmed);
    assert!(c.view().instances.is_empty());
    assert_eq!(c.view().index, 4);
    // An empty answer into an empty cache: nothing to protect.
    assert_eq!(c.handle_answer(answer(5, vec![]), 5_002), Outcome::Applied { changed: false });
    // With one confirmation and no time, protection is off.
    let mut off = Cache::new("default", "s", EmptyRule { confirmations: 1, confirm_after: Duration::ZERO });
    off.handle_answer(answer(1, vec![inst("a", 1)]), 0);
    assert_eq!(off.handle_answer(answer(2, vec![]), 0), Outcome::EmptyConfirmed);
}

#[test]
fn a_snapshot_view_is_replaced_by_the_first_registry_answer_but_not_by_an_empty_one() {
    let mut c = Cache::new("default", "s", EmptyRule::default());
    let mut v = ServiceView::empty("default", "s");
    v.instances = vec![inst("a", 1)];
    v.source = ViewSource::Snapshot { saved_at_ms: 1 };
    c.restore(v);
    assert!(matches!(c.handle_answer(answer(9, vec![]), 0), Outcome::EmptyHeld(_)));
    assert_eq!(c.view().source, ViewSource::Snapshot { saved_at_ms: 1 });
    assert_eq!(
        c.handle_answer(answer(9, vec![inst("a", 1)]), 1),
        Outcome::Applied { changed: true },
        "source changed"
    );
    assert_eq!(c.view().source, ViewSource::Registry);
}

#[test]
fn round_robin_takes_every_instance_in_turn_and_skips_draining_ones() {
    let mut list = vec![inst("a", 1), inst("b", 1), inst("c", 1)];
    list[1].status = Status::Draining;
    let mut b = Balancer::new(Strategy::RoundRobin, EjectionConfig::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let picks: Vec<String> =
        (0..6).map(|_| b.pick(&list, 0, &mut rng).unwrap().instance_id.to_string()).collect();
    assert_eq!(picks, ["a", "c", "a", "c", "a", "c"]);
    for i in &mut list {
        i.status = Status::Draining;
    }
    assert!(b.pick(&list, 0, &mut rng).is_none(), "nothing up: nothing picked");
}

#[test]
fn weighted_random_follows_the_weights() {
    let list = vec![inst("a", 300), inst("b", 100), inst("z", 0)];
    let mut b = Balancer::new(Strategy::WeightedRandom, EjectionConfig::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..4_000 {
        *counts.entry(b.pick(&list, 0, &mut rng).unwrap().instance_id.to_string()).or_default() += 1;
    }
    let a = counts["a"];
    assert!((2_800..=3_200).contains(&a), "a picked {a} of 4000, expected ~3000: {counts:?}");
    assert!(!counts.contains_key("z"), "weight 0 is never picked while others have weight");
    // All weights zero: uniform.
    let zeros = vec![inst("a", 0), inst("b", 0)];
    let picked: std::collections::BTreeSet<String> =
        (0..100).map(|_| b.pick(&zeros, 0, &mut rng).unwrap().instance_id.to_string()).collect();
    assert_eq!(picked.len(), 2);
}

#[test]
fn healthy_instances_are_preferred_over_protected_unhealthy_ones() {
    let mut list = vec![inst("a", 1), inst("b", 1)];
    list[0].health = Health::Unhealthy;
    let mut b = Balancer::new(Strategy::RoundRobin, EjectionConfig::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for _ in 0..4 {
        assert_eq!(&*b.pick(&list, 0, &mut rng).unwrap().instance_id, "b");
    }
    list[1].health = Health::Unhealthy;
    assert!(b.pick(&list, 0, &mut rng).is_some(), "all unhealthy (protected answer): still pick one");
}

fn ejection() -> EjectionConfig {
    EjectionConfig {
        consecutive_failures: 3,
        base: Duration::from_millis(1_000),
        max: Duration::from_millis(2_500),
        max_ejected_pct: 50,
    }
}

#[test]
fn outlier_ejected_after_consecutive_failures_for_a_time_that_grows_with_repeats() {
    let list = vec![inst("a", 1), inst("b", 1), inst("c", 1), inst("d", 1)];
    let mut b = Balancer::new(Strategy::RoundRobin, ejection());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let a = &list[0];
    assert_eq!(b.report_failure(a, &list, 0), Reported::Counted { failures: 1 });
    b.report_success(a);
    assert_eq!(b.report_failure(a, &list, 0), Reported::Counted { failures: 1 }, "a success ends the run");
    assert_eq!(b.report_failure(a, &list, 0), Reported::Counted { failures: 2 });
    assert_eq!(b.report_failure(a, &list, 10), Reported::Ejected { until_ms: 1_010 });
    assert_eq!(b.report_failure(a, &list, 20), Reported::AlreadyEjected);
    assert_eq!(b.report_failure(&inst("elsewhere", 1), &list, 20), Reported::NotInView);
    assert_eq!(b.ejected(500), vec![("dc-a".to_owned(), "a".to_owned())]);
    for _ in 0..6 {
        assert_ne!(&*b.pick(&list, 500, &mut rng).unwrap().instance_id, "a");
    }
    // Back after the ejection time; the next ejection lasts twice as long.
    assert!(!b.is_ejected(a, 1_010));
    assert!((0..4).any(|_| b.pick(&list, 1_010, &mut rng).unwrap().instance_id.as_ref() == "a"));
    for _ in 0..2 {
        b.report_failure(a, &list, 1_100);
    }
    assert_eq!(b.report_failure(a, &list, 1_100), Reported::Ejected { until_ms: 3_100 });
    // Third: capped at max.
    for _ in 0..2 {
        b.report_failure(a, &list, 3_100);
    }
    assert_eq!(b.report_failure(a, &list, 3_100), Reported::Ejected { until_ms: 5_600 });
    // Back for longer than max without an ejection: the count starts again.
    for _ in 0..2 {
        b.report_failure(a, &list, 9_000);
    }
    assert_eq!(b.report_failure(a, &list, 9_000), Reported::Ejected { until_ms: 10_000 });
}

#[test]
fn ejection_never_passes_the_max_share_nor_removes_the_last_instance() {
    let list = vec![inst("a", 1), inst("b", 1), inst("c", 1), inst("d", 1)];
    let mut b = Balancer::new(Strategy::RoundRobin, ejection());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let fail3 = |b: &mut Balancer, i: &Instance| {
        b.report_failure(i, &list, 0);
        b.report_failure(i, &list, 0);
        b.report_failure(i, &list, 0)
    };
    assert!(matches!(fail3(&mut b, &list[0]), Reported::Ejected { .. }));
    assert!(matches!(fail3(&mut b, &list[1]), Reported::Ejected { .. }), "2 of 4 is 50%");
    assert_eq!(fail3(&mut b, &list[2]), Reported::EjectionRefused { failures: 3 }, "3 of 4 would pass 50%");
    assert_eq!(b.ejected(0).len(), 2);
    let picked: std::collections::BTreeSet<String> =
        (0..8).map(|_| b.pick(&list, 0, &mut rng).unwrap().instance_id.to_string()).collect();
    assert_eq!(picked.into_iter().collect::<Vec<_>>(), ["c", "d"]);

    // One instance: never ejected, whatever the share allows.
    let one = vec![inst("solo", 1)];
    let mut b = Balancer::new(Strategy::RoundRobin, EjectionConfig { max_ejected_pct: 100, ..ejection() });
    for _ in 0..10 {
        assert!(!matches!(b.report_failure(&one[0], &one, 0), Reported::Ejected { .. }));
    }
    assert_eq!(&*b.pick(&one, 0, &mut rng).unwrap().instance_id, "solo");
    // Two with 100%: one may go, never both.
    let two = vec![inst("x", 1), inst("y", 1)];
    let mut b = Balancer::new(Strategy::RoundRobin, EjectionConfig { max_ejected_pct: 100, ..ejection() });
    for _ in 0..3 {
        b.report_failure(&two[0], &two, 0);
    }
    for _ in 0..5 {
        b.report_failure(&two[1], &two, 0);
    }
    assert_eq!(b.ejected(0).len(), 1);
    // Instances that left the view are forgotten.
    b.retain(&two[1..]);
    assert!(b.ejected(0).is_empty());
}

#[test]
fn snapshot_files_round_trip_and_bad_ones_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = ServiceView::empty("ns.a:b", "svc");
    v.index = 77;
    v.instances = vec![inst("b", 5), inst("a", 7)];
    let path = snapshot::write(dir.path(), &v, 1_234).unwrap();
    assert_eq!(path, dir.path().join("ns.a%3Ab@svc.json"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    let back = snapshot::read(dir.path(), "ns.a:b", "svc", 1 << 20, 100).unwrap().unwrap();
    assert_eq!(back.index, 77);
    assert_eq!(ids_of(&back.instances), ["a", "b"]);
    assert_eq!(back.source, ViewSource::Snapshot { saved_at_ms: 1_234 });

    assert!(snapshot::read(dir.path(), "ns", "none", 1 << 20, 100).unwrap().is_none(), "missing: none");
    let e = snapshot::read(dir.path(), "ns.a:b", "svc", 64, 100).unwrap_err();
    assert!(matches!(e, snapshot::SnapshotError::TooLarge { .. }), "{e}");
    assert!(snapshot::read(dir.path(), "ns.a:b", "svc", 1 << 20, 1).is_err(), "too many instances");
    std::fs::write(&path, b"{\"format\": 1, \"namespace\": ").unwrap();
    assert!(snapshot::read(dir.path(), "ns.a:b", "svc", 1 << 20, 100).is_err(), "truncated file");
    let other = json!({"format": 1, "namespace": "x", "service": "svc", "index": 1, "saved_at_ms": 1, "instances": []});
    std::fs::write(&path, other.to_string()).unwrap();
    assert!(snapshot::read(dir.path(), "ns.a:b", "svc", 1 << 20, 100).is_err(), "another service's file");
    let future = json!({"format": 2, "namespace": "ns.a:b", "service": "svc", "index": 1, "saved_at_ms": 1, "instances": []});
    std::fs::write(&path, future.to_string()).unwrap();
    assert!(snapshot::read(dir.path(), "ns.a:b", "svc", 1 << 20, 100).is_err(), "unknown format");
}
