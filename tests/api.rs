//! One registry node through its HTTP API: the public contract, validation, leases,
//! blocking queries, durability across restarts, and zero disk writes per heartbeat.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tandem::node::Node;
use tandem_client::api::{HeartbeatBatchAnswer, StatusName};
use tandem_client::client::{enc, Client, ClientError};

fn http(node: &Node) -> String {
    format!("http://{}", node.http_addr())
}

#[tokio::test]
async fn register_discover_heartbeat_deregister_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    let r = c
        .register(&json!({"service": "orders", "address": "10.0.0.7", "port": 8080, "zone": "az1",
            "weight": 50, "version": "1.2", "tags": ["canary"], "metadata": {"team": "pay"}}))
        .await
        .unwrap();
    let id = r["instance_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("orders#10.0.0.7:8080#"), "generated id {id}");
    assert_eq!(r["owner_dc"], "dc-a");
    assert!(r["version"].as_u64().unwrap() >= 1);
    assert_eq!(r["lease_ttl_ms"], 30_000);

    let d = c.discover("default", "orders", "").await.unwrap();
    let inst = &d["instances"][0];
    assert_eq!(inst["instance_id"], id.as_str());
    assert_eq!(inst["owner_dc"], "dc-a");
    assert_eq!(inst["address"], "10.0.0.7");
    assert_eq!(inst["port"], 8080);
    assert_eq!(inst["zone"], "az1");
    assert_eq!(inst["weight"], 50);
    assert_eq!(inst["version"], "1.2");
    assert_eq!(inst["tags"], json!(["canary"]));
    assert_eq!(inst["metadata"]["team"], "pay");
    assert_eq!(inst["health"], "healthy");
    assert_eq!(inst["status"], "up");
    assert_eq!(inst["stale"], false);
    assert_eq!(d["failover"]["active"], false);

    c.heartbeat("default", "orders", &id).await.unwrap();
    c.set_status("default", "orders", &id, StatusName::Draining).await.unwrap();
    let d = c.discover("default", "orders", "").await.unwrap();
    assert_eq!(d["instances"][0]["status"], "draining", "draining stays listed, flagged");

    let del = c.deregister("default", "orders", &id).await.unwrap();
    assert!(del["version"].as_u64().unwrap() > r["version"].as_u64().unwrap());
    assert!(ids(&c.discover("default", "orders", "").await.unwrap()).is_empty());
    // Unknown now: 404 so the client re-registers.
    let e = c.heartbeat("default", "orders", &id).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    let e = c.deregister("default", "orders", &id).await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    node.shutdown().await;
}

#[tokio::test]
async fn hostile_requests_get_clear_4xx_and_the_node_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let base = http(&node);
    let h = reqwest::Client::new();
    let bad_bodies: Vec<(&str, String)> = vec![
        ("not json", "{".into()),
        ("unknown field", r#"{"service":"s","address":"1.2.3.4","port":1,"bogus":1}"#.into()),
        ("port 0", r#"{"service":"s","address":"1.2.3.4","port":0}"#.into()),
        ("port too big", r#"{"service":"s","address":"1.2.3.4","port":70000}"#.into()),
        ("bad service", r#"{"service":"a b","address":"1.2.3.4","port":1}"#.into()),
        ("bad address", r#"{"service":"s","address":"not an address!","port":1}"#.into()),
        ("ttl too small", r#"{"service":"s","address":"1.2.3.4","port":1,"ttl_ms":1}"#.into()),
        (
            "persistent with ttl",
            r#"{"service":"s","address":"1.2.3.4","port":1,"ttl_ms":5000,"persistent":true}"#.into(),
        ),
        (
            "too many tags",
            format!(
                r#"{{"service":"s","address":"1.2.3.4","port":1,"tags":[{}]}}"#,
                vec!["\"t\""; 40].join(",")
            ),
        ),
        (
            "huge metadata value",
            format!(
                r#"{{"service":"s","address":"1.2.3.4","port":1,"metadata":{{"k":"{}"}}}}"#,
                "v".repeat(2000)
            ),
        ),
        ("control chars", r#"{"service":"s","address":"1.2.3.4","port":1,"zone":"a\u0000b"}"#.into()),
    ];
    for (what, body) in bad_bodies {
        let r = h
            .post(format!("{base}/v1/register"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{what}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["code"].is_string() && !v["error"]["message"].as_str().unwrap().is_empty(),
            "{what}: {v}"
        );
    }
    // Oversized body: refused before parsing.
    let big = format!(r#"{{"service":"s","address":"1.2.3.4","port":1,"zone":"{}"}}"#, "z".repeat(200_000));
    let r = h
        .post(format!("{base}/v1/register"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "too_large");
    // Bad query parameters and names.
    for url in [
        format!("{base}/v1/services/default/orders?index=abc"),
        format!("{base}/v1/services/default/orders?index=1&wait=1h"),
        format!("{base}/v1/services/default/orders?explain=maybe"),
        format!("{base}/v1/services/default/bad%20name"),
        format!("{base}/v1/services/default/orders?dc=NOT_A_DC"),
    ] {
        let r = h.get(&url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{url}");
    }
    let r = h.get(format!("{base}/v1/nothing")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Still serving.
    client(&node).register(&reg_body("orders", "i1", true)).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn heartbeats_cause_zero_disk_writes() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("hb", "i1", false)).await.unwrap();
    let before = c.status().await.unwrap();
    for _ in 0..500 {
        c.heartbeat("default", "hb", "i1").await.unwrap();
    }
    let after = c.status().await.unwrap();
    assert_eq!(after["heartbeats"].as_u64().unwrap() - before["heartbeats"].as_u64().unwrap(), 500);
    assert_eq!(after["disk_writes"], before["disk_writes"], "a heartbeat must never write to disk");
    let metrics = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tandem_disk_writes_total{dc=\"dc-a\"}"), "{metrics}");
    assert!(metrics.contains("tandem_heartbeats_total{dc=\"dc-a\"} 500"), "{metrics}");
    node.shutdown().await;
}

/// `tandem_disk_sync_duration_seconds`: one observation per synced write, in cumulative
/// buckets that end at `+Inf`.
#[tokio::test]
async fn every_synced_write_is_timed_in_the_disk_sync_histogram() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    for i in 0..20 {
        c.register(&reg_body("timed", &format!("i{i}"), true)).await.unwrap();
    }
    let metrics = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
    let value = |line_start: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(line_start)).unwrap_or_else(|| panic!("{line_start}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let writes = value("tandem_disk_writes_total{");
    assert!(writes >= 20.0, "{metrics}");
    assert!(metrics.contains("# TYPE tandem_disk_sync_duration_seconds histogram"), "{metrics}");
    assert_eq!(value("tandem_disk_sync_duration_seconds_count{"), writes);
    assert_eq!(value("tandem_disk_sync_duration_seconds_bucket{dc=\"dc-a\",le=\"+Inf\"}"), writes);
    assert!(value("tandem_disk_sync_duration_seconds_sum{") > 0.0);
    // The WAL those writes went to, as the data dir holds it.
    assert!(value("tandem_store_wal_bytes{dc=\"dc-a\",store=\"log\"}") > 0.0, "{metrics}");
    let buckets: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("tandem_disk_sync_duration_seconds_bucket{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative: {buckets:?}");
    // The same writes by part (staged, wal, memtable): each part counts every write.
    for part in ["staged", "wal", "memtable"] {
        let count = format!("tandem_disk_sync_part_duration_seconds_count{{dc=\"dc-a\",part=\"{part}\"}}");
        assert_eq!(value(&count), writes, "{metrics}");
    }
    assert!(value("tandem_disk_sync_part_duration_seconds_sum{dc=\"dc-a\",part=\"wal\"}") > 0.0);
    // Each registration's waits around its round's synced write, one observation each.
    assert!(metrics.contains("# TYPE tandem_commit_queue_duration_seconds histogram"), "{metrics}");
    assert_eq!(value("tandem_commit_queue_duration_seconds_count{"), 20.0, "{metrics}");
    // The wait after the write is recorded once the round's callers are answered.
    let answered = || async {
        let m = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
        let line = m.lines().find(|l| l.starts_with("tandem_commit_answer_duration_seconds_count{"));
        line.map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while answered().await != Some(20.0) && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(answered().await, Some(20.0));
    // The runtime's timer, due every 10 ms, notes each wake's lateness.
    assert!(metrics.contains("# TYPE tandem_runtime_lateness_seconds histogram"), "{metrics}");
    let wakes = || async {
        let m = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
        let line = m.lines().find(|l| l.starts_with("tandem_runtime_lateness_seconds_count{")).unwrap();
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
    };
    while wakes().await < 3.0 && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(wakes().await >= 3.0);
    node.shutdown().await;
}

#[tokio::test]
async fn an_instance_without_heartbeats_goes_suspect_unhealthy_then_expires() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = single_config(dir.path(), "dc-a");
    cfg.protection.protect_threshold = 0.0;
    let node = Node::start(cfg, None).await.unwrap();
    let c = client(&node);
    // ttl 1200 ms: suspect at 200, unhealthy at 600, expired at 1200.
    c.register(
        &json!({"service": "short", "instance_id": "i1", "address": "10.0.0.1", "port": 1, "ttl_ms": 1200}),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let d = c.discover("default", "short", "dc=all").await.unwrap();
        let h = d["instances"][0]["health"].as_str().map(str::to_owned);
        match h {
            Some(h) => {
                if seen.last() != Some(&h) {
                    seen.push(h);
                }
            }
            None => break,
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never expired; saw {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_after = started.elapsed();
    assert_eq!(seen, vec!["healthy", "suspect", "unhealthy"], "health path");
    assert!(gone_after >= Duration::from_millis(1150), "expired too early: {gone_after:?}");
    let e = c.heartbeat("default", "short", "i1").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    // The lease checker's passes and their scan time are counted (tandem-bench scale reads
    // them for the cost per tick).
    let metrics = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
    let sample = |name: &str| -> u64 {
        let want = format!("{name}{{dc=\"dc-a\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&want)).unwrap_or_else(|| panic!("no {want}"));
        line[want.len()..].trim().parse::<f64>().unwrap() as u64
    };
    // ttl 1200 ms took at least 1150 ms to expire, with a pass every 50 ms.
    assert!(sample("tandem_lease_checks_total") >= 5, "{metrics}");
    assert!(
        sample("tandem_lease_check_microseconds_max") <= sample("tandem_lease_check_microseconds_total"),
        "{metrics}"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn blocking_query_returns_on_change_and_times_out_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("w", "i1", true)).await.unwrap();
    let idx = c.discover("default", "w", "").await.unwrap()["index"].as_u64().unwrap();
    // Nothing changes: returns after the wait with the same index.
    let t = std::time::Instant::now();
    let v = c.watch("default", "w", idx, Duration::from_millis(300)).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(290));
    assert_eq!(v["index"].as_u64().unwrap(), idx);
    // A change wakes the watcher at once.
    let c2 = client(&node);
    let waiter = tokio::spawn(async move { c2.watch("default", "w", idx, Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = std::time::Instant::now();
    c.register(&reg_body("w", "i2", true)).await.unwrap();
    let v = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(v["index"].as_u64().unwrap() > idx);
    assert_eq!(ids(&v), vec!["i1", "i2"]);
    node.shutdown().await;
}

#[tokio::test]
async fn restart_keeps_acknowledged_state_and_the_index_never_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = single_config(dir.path(), "dc-a");
    let node = Node::start(cfg.clone(), None).await.unwrap();
    let c = client(&node);
    for i in 0..20 {
        c.register(&reg_body("r", &format!("i{i}"), true)).await.unwrap();
    }
    for i in 0..10 {
        c.deregister("default", "r", &format!("i{i}")).await.unwrap();
    }
    let before = c.discover("default", "r", "").await.unwrap();
    let epoch_before = c.status().await.unwrap()["log"]["epoch"].clone();
    node.shutdown().await;

    let node = Node::start(cfg, None).await.unwrap();
    let c = client(&node);
    let after = c.discover("default", "r", "").await.unwrap();
    assert_eq!(ids(&after), ids(&before));
    assert!(after["index"].as_u64().unwrap() > before["index"].as_u64().unwrap(), "index went backwards");
    assert_eq!(c.status().await.unwrap()["log"]["epoch"], epoch_before, "same data dir keeps its epoch");
    node.shutdown().await;

    // A wiped data dir is a new history: a new epoch.
    std::fs::remove_dir_all(dir.path().join("dc-a")).unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let st = client(&node).status().await.unwrap();
    assert_ne!(st["log"]["epoch"], epoch_before);
    node.shutdown().await;
}

#[tokio::test]
async fn status_and_version_name_the_build_profile() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let st = client(&node).status().await.unwrap();
    // The tests build the dev profile; a deployed node says "release".
    assert_eq!(st["build_profile"], "dev");
    assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
    node.shutdown().await;
    let out = std::process::Command::new(tandem_bin()).arg("--version").output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(line.starts_with(&format!("tandem {} (dev build", env!("CARGO_PKG_VERSION"))), "{line}");
}

/// Registers i0..i3 of service `p`; keeps i0 heartbeating until i1..i3 (ttl 900 ms) are
/// unhealthy.
async fn one_healthy_three_unhealthy(c: &Client) {
    for i in 0..4 {
        c.register(&json!({"service": "p", "instance_id": format!("i{i}"), "address": "10.0.0.1", "port": 1,
            "ttl_ms": if i == 0 { 30_000 } else { 900 }}))
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(5), "three unhealthy", || async {
        let _ = c.heartbeat("default", "p", "i0").await;
        let d = c.discover("default", "p", "dc=all").await.unwrap();
        d["instances"].as_array().unwrap().iter().filter(|i| i["health"] == "unhealthy").count() == 3
    })
    .await;
}

#[tokio::test]
async fn protect_threshold_returns_all_instances_rather_than_a_collapsed_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = single_config(dir.path(), "dc-a");
    cfg.protection.protect_threshold = 0.5;
    let node = Node::start(cfg, None).await.unwrap();
    let c = client(&node);
    // Keep i0 alive; i1..i3 go unhealthy (healthy share 25% < 50%).
    one_healthy_three_unhealthy(&c).await;
    let d = c.discover("default", "p", "explain=true").await.unwrap();
    assert_eq!(d["protected"], true, "{d}");
    assert_eq!(ids(&d).len(), 4, "protect threshold keeps every instance in the answer");
    let lines = d["explain"].as_array().unwrap();
    assert!(lines.iter().any(|l| l["reason"].as_str().unwrap().contains("protect threshold")));
    node.shutdown().await;
}

#[tokio::test]
async fn ids_with_hash_signs_work_in_paths() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    let r = c.register(&json!({"service": "svc", "address": "::1", "port": 9})).await.unwrap();
    let id = r["instance_id"].as_str().unwrap();
    assert!(id.starts_with("svc#[::1]:9#"), "{id}");
    c.heartbeat("default", "svc", id).await.unwrap();
    let url = format!("{}/v1/instances/default/svc/{}", http(&node), enc(id));
    let resp = reqwest::Client::new().delete(url).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(matches!(c.heartbeat("default", "svc", id).await, Err(ClientError::Api { status: 404, .. })));
    node.shutdown().await;
}

#[test]
fn the_annotated_example_config_is_valid() {
    let path = manifest_dir().join("examples/tandem.toml");
    let cfg = tandem::config::Config::load(&path).unwrap();
    assert_eq!(cfg.dc, "dc-a");
    assert_eq!(cfg.replication.as_ref().unwrap().peers[0].dc, "dc-b");
    assert_eq!(cfg.protect_threshold("default", "payments"), 0.3);
    assert_eq!(cfg.failover.policy_for("default", "payments").mode, tandem::failover::Mode::LocalOnly);
}

#[test]
fn config_typos_and_bad_values_are_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("dc = \"dc-a\"\ndata_dir = \"/x\"\nhttp_adr = \"127.0.0.1:1\"\n", "http_adr"),
        ("dc = \"DC A\"\ndata_dir = \"/x\"\n", "dc"),
        ("dc = \"dc-a\"\ndata_dir = \"/x\"\n[protection]\nprotect_threshold = 2.0\n", "protect_threshold"),
        ("dc = \"dc-a\"\ndata_dir = \"/x\"\n[failover]\nmin_healthy_pct = 7.0\n", "min_healthy_pct"),
        ("dc = \"dc-a\"\ndata_dir = \"/x\"\n[health]\nsuspect_after_ms = 20000\n", "suspect_after_ms"),
    ];
    for (i, (body, key)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&p, body).unwrap();
        let e = tandem::config::Config::load(&p).unwrap_err().to_string();
        assert!(e.contains(key), "case {i}: error {e:?} does not name {key}");
    }
}

#[tokio::test]
async fn policy_reload_applies_a_valid_file_and_keeps_the_old_one_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let base = format!(
        "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n",
        dir.path().join("d").display()
    );
    std::fs::write(&path, format!("{base}[failover]\nmode = \"local_first\"\n")).unwrap();
    let cfg = tandem::config::Config::load(&path).unwrap();
    let node = Node::start(cfg, Some(path.clone())).await.unwrap();
    let h = reqwest::Client::new();
    let url = format!("{}/v1/admin/reload", http(&node));
    let mode = |n: &Node| n.shared.registry.config().failover.policy_for("default", "x").mode;
    assert_eq!(mode(&node), tandem::failover::Mode::LocalFirst);

    std::fs::write(&path, format!("{base}[failover]\nmode = \"global\"\nmin_healthy_pct = 3.0\n")).unwrap();
    let r = h.post(&url).json(&serde_json::json!({})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"], "invalid config: [failover] min_healthy_pct: must be within 0..=1, got 3",
        "{v}"
    );
    assert_eq!(mode(&node), tandem::failover::Mode::LocalFirst, "the old policy stays in force");

    // A key only a restart may change is named, and refused.
    let moved = base.replace("dc = \"dc-a\"", "dc = \"dc-z\"");
    std::fs::write(&path, format!("{moved}[failover]\nmode = \"global\"\n")).unwrap();
    let e = node.shared.reload().unwrap_err();
    assert!(matches!(e, tandem::shared::ReloadError::Immutable { key: "dc" }), "{e}");
    assert_eq!(mode(&node), tandem::failover::Mode::LocalFirst);

    std::fs::write(&path, format!("{base}[failover]\nmode = \"global\"\n")).unwrap();
    let r = h.post(&url).header("x-tandem-admin", "1").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(mode(&node), tandem::failover::Mode::Global);
    node.shutdown().await;
}

#[tokio::test]
async fn explain_names_deregistered_instances_and_their_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("e", "keep", true)).await.unwrap();
    c.register(&reg_body("e", "gone", true)).await.unwrap();
    c.deregister("default", "e", "gone").await.unwrap();
    let d = c.discover("default", "e", "explain=true").await.unwrap();
    let lines = d["explain"].as_array().unwrap();
    let gone = lines.iter().find(|l| l["instance_id"] == "gone").expect("explained");
    assert_eq!(gone["included"], false);
    assert!(gone["reason"].as_str().unwrap().contains("tombstone"), "{gone}");
    node.shutdown().await;
}

#[tokio::test]
async fn batched_heartbeats_renew_many_leases_and_name_the_unknown_ones() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    // ttl 1200 ms: suspect after 300 ms of silence, expired after 1200 ms.
    for id in ["i1", "i2"] {
        c.register(
            &json!({"service": "hb", "instance_id": id, "address": "10.0.0.1", "port": 1, "ttl_ms": 1200}),
        )
        .await
        .unwrap();
    }
    c.register(&reg_body("hb", "p1", true)).await.unwrap();
    let before = c.status().await.unwrap();
    let body = json!({"instances": [
        {"service": "hb", "instance_id": "i1"},
        {"service": "hb", "instance_id": "nope"},
        {"namespace": "default", "service": "hb", "instance_id": "i2"},
        {"service": "hb", "instance_id": "p1"},
    ]});
    // Only batched heartbeats for 2.4 s, twice the lease: both leases stay healthy.
    for _ in 0..24 {
        let a = c.heartbeat_batch(&body).await.unwrap();
        assert_eq!(a, HeartbeatBatchAnswer { renewed: 3, unknown: vec![1], conflict: vec![] });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let d = c.discover("default", "hb", "dc=all").await.unwrap();
    let healths: Vec<&str> =
        d["instances"].as_array().unwrap().iter().map(|i| i["health"].as_str().unwrap()).collect();
    assert_eq!(healths, vec!["healthy"; 3], "{d}");
    let after = c.status().await.unwrap();
    assert_eq!(after["heartbeats"].as_u64().unwrap() - before["heartbeats"].as_u64().unwrap(), 24 * 3);
    assert_eq!(after["disk_writes"], before["disk_writes"], "a heartbeat must never write to disk");

    // Bounds and validation refuse the whole batch with the entry named.
    let many: Vec<Value> =
        (0..513).map(|i| json!({"service": "hb", "instance_id": format!("x{i}")})).collect();
    let e = c.heartbeat_batch(&json!({ "instances": many })).await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");
    let e = c
        .heartbeat_batch(&json!({"instances": [{"service": "hb", "instance_id": "i1"}, {"service": "Bad Name", "instance_id": "i1"}]}))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("instances[1]"), "{e}");
    let e = c.heartbeat_batch(&json!({"instances": [{"service": "hb", "id": "i1"}]})).await.unwrap_err();
    assert_eq!(e.status(), Some(400));
    node.shutdown().await;
}

/// Reads one newline-terminated line from a streaming response, skipping keep-alive blank
/// lines; `None` when the stream ended.
#[tokio::test]
async fn batched_registrations_are_one_write_and_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("rb", "held", false)).await.unwrap();
    let fsyncs = |s: &Value| s["disk_writes"].as_u64().unwrap();
    let before = c.status().await.unwrap();
    let body = json!({"instances": [
        {"service": "rb", "address": "10.0.0.9", "port": 9000, "ttl_ms": 5000},
        reg_body("rb", "held", false),
        {"namespace": "other", "service": "rb2", "instance_id": "p1", "address": "10.0.0.1", "port": 1,
         "persistent": true, "metadata": {"team": "pay"}},
    ]});
    let a = c.register_batch(&body).await.unwrap();
    assert_eq!(a.instances.len(), 3, "{a:?}");
    assert!(a.instances[0].instance_id.starts_with("rb#10.0.0.9:9000#"), "{a:?}");
    assert_eq!(a.instances[0].lease_ttl_ms, 5000);
    assert_eq!(a.instances[1].instance_id, "held");
    assert_eq!(a.instances[2].lease_ttl_ms, 0, "persistent");
    // One commit: the events' seqs follow each other, in the request's order.
    let seqs: Vec<u64> = a.instances.iter().map(|r| r.version).collect();
    assert_eq!(seqs, vec![seqs[0], seqs[0] + 1, seqs[0] + 2], "{a:?}");
    let after = c.status().await.unwrap();
    assert_eq!(fsyncs(&after) - fsyncs(&before), 1, "one synced write for the batch");
    assert_eq!(ids(&c.discover("default", "rb", "").await.unwrap()).len(), 2);
    assert_eq!(ids(&c.discover("other", "rb2", "").await.unwrap()), vec!["p1".to_owned()]);
    c.heartbeat("default", "rb", &a.instances[0].instance_id).await.unwrap();

    // Any entry that breaks a rule refuses the whole batch, its position named; nothing is
    // written.
    let refused = |body: Value, code: &'static str, needle: &'static str| {
        let c = &c;
        async move {
            let e = c.register_batch(&body).await.unwrap_err();
            assert_eq!(e.status(), Some(400), "{e}");
            assert!(e.to_string().contains(code) && e.to_string().contains(needle), "{e}");
        }
    };
    let before = c.status().await.unwrap();
    let fresh = |id: &str| reg_body("rb", id, false);
    let mut bad_port = fresh("n2");
    bad_port["port"] = json!(70000);
    refused(json!({"instances": [fresh("n1"), bad_port]}), "invalid_argument", "instances[1]: port").await;
    let mut bad_name = fresh("n2");
    bad_name["service"] = json!("Bad Name");
    refused(json!({"instances": [fresh("n1"), bad_name]}), "invalid_argument", "instances[1]").await;
    refused(
        json!({"instances": [fresh("n1"), fresh("n2"), fresh("n1")]}),
        "invalid_argument",
        "instances[2]",
    )
    .await;
    let many: Vec<Value> = (0..257).map(|i| fresh(&format!("m{i}"))).collect();
    refused(json!({ "instances": many }), "invalid_argument", "at most 256").await;
    refused(json!({"instances": [{"service": "rb", "id": "x"}]}), "invalid_body", "").await;
    assert_eq!(fsyncs(&c.status().await.unwrap()), fsyncs(&before), "a refused batch writes nothing");
    let d = c.discover("default", "rb", "").await.unwrap();
    assert!(!ids(&d).iter().any(|i| i.starts_with('n') || i.starts_with('m')), "{d}");
    // An empty batch is an empty answer.
    assert!(c.register_batch(&json!({"instances": []})).await.unwrap().instances.is_empty());
    node.shutdown().await;
}

async fn next_line(resp: &mut reqwest::Response, buf: &mut Vec<u8>) -> Option<Value> {
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            if line.len() == 1 {
                continue;
            }
            return Some(serde_json::from_slice(&line).expect("each line is one JSON answer"));
        }
        match tokio::time::timeout(Duration::from_secs(10), resp.chunk()).await.expect("no line within 10 s")
        {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) | Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn streaming_watch_sends_the_answer_then_one_line_per_change() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("sw", "i1", true)).await.unwrap();
    let url = format!("{}/v1/services/default/sw?stream=true", http(&node));
    let mut resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut buf = Vec::new();
    let first = next_line(&mut resp, &mut buf).await.unwrap();
    assert_eq!(first["instances"].as_array().unwrap().len(), 1);
    let i0 = first["index"].as_u64().unwrap();

    // A watcher that starts from a known index gets nothing until the next change.
    let mut late = reqwest::get(format!("{url}&index={i0}")).await.unwrap();
    let mut late_buf = Vec::new();

    c.register(&reg_body("sw", "i2", true)).await.unwrap();
    let second = next_line(&mut resp, &mut buf).await.unwrap();
    assert_eq!(second["instances"].as_array().unwrap().len(), 2, "{second}");
    assert!(second["index"].as_u64().unwrap() > i0);
    let late_first = next_line(&mut late, &mut late_buf).await.unwrap();
    assert_eq!(late_first["index"], second["index"]);

    c.deregister("default", "sw", "i1").await.unwrap();
    let third = next_line(&mut resp, &mut buf).await.unwrap();
    let ids: Vec<&str> =
        third["instances"].as_array().unwrap().iter().map(|i| i["instance_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["i2"]);
    assert!(third["index"].as_u64() > second["index"].as_u64());

    // The stream is counted while open (two watchers here).
    let metrics = reqwest::get(format!("{}/metrics", http(&node))).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tandem_watch_streams{dc=\"dc-a\"} 2"), "{metrics}");
    drop(late);
    eventually(Duration::from_secs(10), "a closed stream is no longer counted", || async {
        c.status().await.unwrap()["watch_streams"] == 1
    })
    .await;

    // Bad combinations are refused before anything streams.
    let bad = reqwest::get(format!("{url}&wait=1s")).await.unwrap();
    assert_eq!(bad.status(), 400);
    let bad = reqwest::get(format!("{url}&index=x")).await.unwrap();
    assert_eq!(bad.status(), 400);

    // Shutdown ends the stream.
    node.shutdown().await;
    assert!(next_line(&mut resp, &mut buf).await.is_none());
}

#[tokio::test]
async fn streaming_watches_are_bounded_and_a_closed_one_frees_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = single_config(dir.path(), "dc-a");
    cfg.http.watch_streams_max = 1;
    let node = Node::start(cfg, None).await.unwrap();
    let c = client(&node);
    c.register(&reg_body("sb", "i1", true)).await.unwrap();
    let url = format!("{}/v1/services/default/sb?stream=true", http(&node));
    let mut first = reqwest::get(&url).await.unwrap();
    assert_eq!(first.status(), 200);
    let mut buf = Vec::new();
    assert!(next_line(&mut first, &mut buf).await.is_some());
    let refused = reqwest::get(&url).await.unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_watches", "{body}");
    // A blocking query still works while the streams are full.
    assert!(c.discover("default", "sb", "").await.is_ok());
    drop(first);
    eventually(Duration::from_secs(10), "the closed stream frees its place", || async {
        reqwest::get(&url).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    node.shutdown().await;
}

#[tokio::test]
async fn a_reload_that_changes_answers_moves_the_index_and_drops_cached_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    let base = format!(
        "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n",
        dir.path().join("d").display()
    );
    std::fs::write(&path, format!("{base}[protection]\nprotect_threshold = 0.0\n")).unwrap();
    let node = Node::start(tandem::config::Config::load(&path).unwrap(), Some(path.clone())).await.unwrap();
    let c = client(&node);
    one_healthy_three_unhealthy(&c).await;
    // Unprotected: the plain answer (now cached at its index) offers the healthy one only.
    let before = c.discover("default", "p", "").await.unwrap();
    assert_eq!(ids(&before), vec!["i0"], "{before}");
    let index = before["index"].as_u64().unwrap();

    // Raise the protect threshold: every answer of the service changes.
    std::fs::write(&path, format!("{base}[protection]\nprotect_threshold = 0.5\n")).unwrap();
    node.shared.reload().unwrap();
    let after = c.discover("default", "p", "").await.unwrap();
    assert!(
        after["index"].as_u64().unwrap() > index,
        "a reload that changes answers moves the index: {after}"
    );
    assert_eq!(after["protected"], true, "the plain answer follows the new threshold: {after}");
    assert_eq!(ids(&after).len(), 4);
    let explained = c.discover("default", "p", "explain=true").await.unwrap();
    assert_eq!(ids(&explained), ids(&after), "plain and explain answers agree");
    // A watcher at the old index wakes at once instead of waiting out its `wait`.
    let woke = tokio::time::timeout(
        Duration::from_secs(2),
        c.discover("default", "p", &format!("index={index}&wait=10s")),
    )
    .await;
    assert!(woke.is_ok(), "the watcher at the old index woke");
    node.shutdown().await;
}

/// The package's directory, read when the test runs (cargo sets it) rather than when it
/// was compiled: a test binary reused from another checkout's build (one shared target
/// dir) reads this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// One request's status, headers (but `date`) and body.
async fn answer_of(req: reqwest::RequestBuilder) -> (u16, Vec<(String, String)>, String) {
    let resp = req.send().await.unwrap();
    let mut headers: Vec<(String, String)> = resp
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    (resp.status().as_u16(), headers, resp.text().await.unwrap())
}

/// A plain discovery and a single renewal (no query) are answered without the router
/// (`http::plain`); the same request with a query goes through the route. Both must give
/// the same answer (status, headers, body): for a service with instances, an unknown one,
/// a bad name, an id with encoded characters, an unknown id.
#[tokio::test]
async fn plain_discoveries_and_renewals_answer_as_their_routes_do() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(single_config(dir.path(), "dc-a"), None).await.unwrap();
    let c = client(&node);
    let mut ids = Vec::new();
    for port in [8080, 8081] {
        let r = c.register(&json!({"service": "orders", "address": "10.0.0.7", "port": port})).await.unwrap();
        ids.push(r["instance_id"].as_str().unwrap().to_owned());
    }
    assert!(ids[0].contains('#'), "generated ids have '#', sent as %23: {}", ids[0]);
    let h = reqwest::Client::new();
    let long = "s".repeat(300);
    for svc in ["orders", "nobody-registered-this", long.as_str()] {
        let url = format!("{}/v1/services/default/{svc}", http(&node));
        let plain = answer_of(h.get(&url)).await;
        assert_eq!(plain, answer_of(h.get(format!("{url}?dc="))).await, "{svc}: plain and routed differ");
        if svc == "orders" {
            assert_eq!(plain.0, 200);
            assert!(plain.1.iter().any(|(n, _)| n == "x-tandem-index"), "{:?}", plain.1);
            assert_eq!(common::ids(&serde_json::from_str(&plain.2).unwrap()).len(), 2);
        }
    }
    for id in [enc(&ids[0]), enc(&ids[1]), "no-such-instance".to_owned(), "%FF".to_owned()] {
        let url = format!("{}/v1/heartbeat/default/orders/{id}", http(&node));
        let plain = answer_of(h.put(&url)).await;
        assert_eq!(plain, answer_of(h.put(format!("{url}?x=1"))).await, "{id}: plain and routed differ");
        let expect = if id.starts_with("orders") {
            200
        } else if id == "%FF" {
            400
        } else {
            404
        };
        assert_eq!(plain.0, expect, "{id}: {plain:?}");
    }
    node.shutdown().await;
}
