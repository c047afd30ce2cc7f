//! Two real DCs on loopback (RocksDB on disk, QUIC with mutual TLS through user-space
//! fault relays): replication, partitions with churn on both sides, heal and convergence,
//! no resurrection, staleness, replays, refused peers.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tandem_client::api::{HeartbeatBatchAnswer, StatusName};
use tandem_client::client::Client;

async fn all_ids(c: &Client, svc: &str) -> BTreeSet<String> {
    ids(&c.discover("default", svc, "dc=all").await.unwrap()).into_iter().collect()
}

/// (owner, id, seq) of every instance of a service, as a DC holds it.
async fn replicated_view(c: &Client, svc: &str) -> BTreeSet<(String, String, u64)> {
    let d = c.discover("default", svc, "dc=all").await.unwrap();
    d["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["owner_dc"].as_str().unwrap().to_owned(),
                i["instance_id"].as_str().unwrap().to_owned(),
                i["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_replicate_both_ways() {
    let p = pair().await;
    let (a, b) = (p.client_a(), p.client_b());
    a.register(&reg_body("orders", "a1", true)).await.unwrap();
    b.register(&reg_body("orders", "b1", true)).await.unwrap();
    eventually(Duration::from_secs(10), "both DCs see both instances", || async {
        all_ids(&a, "orders").await.len() == 2 && all_ids(&b, "orders").await.len() == 2
    })
    .await;
    let d = b.discover("default", "orders", "dc=dc-a").await.unwrap();
    assert_eq!(ids(&d), vec!["a1"]);
    assert_eq!(d["instances"][0]["owner_dc"], "dc-a");
    // Ownership: dc-b may not change dc-a's instance.
    let e = b.heartbeat("default", "orders", "a1").await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    let e = b.deregister("default", "orders", "a1").await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    // The same in a batch: dc-a's instance is named as owned elsewhere, dc-b's own renewed.
    let batch = serde_json::json!({"instances": [
        {"service": "orders", "instance_id": "a1"},
        {"service": "orders", "instance_id": "b1"},
        {"service": "orders", "instance_id": "gone"},
    ]});
    let answer = b.heartbeat_batch(&batch).await.unwrap();
    assert_eq!(answer, HeartbeatBatchAnswer { renewed: 1, unknown: vec![2], conflict: vec![0] });
    // Deregistration replicates as a tombstone.
    a.deregister("default", "orders", "a1").await.unwrap();
    eventually(Duration::from_secs(10), "dc-b drops a1", || async { all_ids(&b, "orders").await.len() == 1 })
        .await;
    // Status shows the watermark.
    let st = b.status().await.unwrap();
    assert!(st["applied"]["dc-a"]["seq"].as_u64().unwrap() >= 2, "{st}");
    assert_eq!(st["peers"]["dc-a"]["inbound"]["state"], "up", "{st}");
    // Each batch applied is one synced write: at least one, at most one per event.
    let inbound = &st["peers"]["dc-a"]["inbound"];
    let (events, batches) = (inbound["events_applied"].as_u64(), inbound["batches_applied"].as_u64());
    assert!(batches >= Some(1) && batches <= events, "{st}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_with_churn_on_both_sides_converges_without_resurrection() {
    let p = pair().await;
    let (a, b) = (p.client_a(), p.client_b());
    for i in 0..10 {
        a.register(&reg_body("s", &format!("a{i}"), true)).await.unwrap();
        b.register(&reg_body("s", &format!("b{i}"), true)).await.unwrap();
    }
    eventually(Duration::from_secs(10), "initial replication", || async {
        all_ids(&a, "s").await.len() == 20 && all_ids(&b, "s").await.len() == 20
    })
    .await;

    p.partition();
    // Churn on both sides: deregister half, re-register some ids as new instances, add new.
    for i in 0..5 {
        a.deregister("default", "s", &format!("a{i}")).await.unwrap();
        b.deregister("default", "s", &format!("b{i}")).await.unwrap();
    }
    for i in 10..15 {
        a.register(&reg_body("s", &format!("a{i}"), true)).await.unwrap();
        b.register(&reg_body("s", &format!("b{i}"), true)).await.unwrap();
    }
    // A re-registration after deregistration under the same id is a newer event of its owner.
    a.register(&reg_body("s", "a0", true)).await.unwrap();
    // During the partition each DC still serves the other's last known copies.
    assert!(all_ids(&b, "s").await.contains("a4"), "remote copies are kept while the link is down");
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    let d = b.discover("default", "s", "dc=dc-a").await.unwrap();
    assert!(
        d["instances"].as_array().unwrap().iter().all(|i| i["stale"] == true),
        "stale after link silence: {d}"
    );

    p.heal();
    eventually(Duration::from_secs(20), "views converge after heal", || async {
        let (va, vb) = (replicated_view(&a, "s").await, replicated_view(&b, "s").await);
        va == vb && va.len() == 21
    })
    .await;
    let view = all_ids(&b, "s").await;
    for i in 1..5 {
        assert!(!view.contains(&format!("a{i}")), "a{i} was deregistered and must not come back");
        assert!(!view.contains(&format!("b{i}")));
    }
    assert!(view.contains("a0"), "re-registered by its owner");
    let d = b.discover("default", "s", "dc=dc-a").await.unwrap();
    assert!(d["instances"].as_array().unwrap().iter().all(|i| i["stale"] == false));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_old_batch_changes_nothing() {
    use tandem_replicator::log::EventLog;
    let p = pair().await;
    let (a, b) = (p.client_a(), p.client_b());
    // A new data dir takes its first ordered epoch at its first handshake (purging its
    // log); wait for it so the log below holds both events.
    eventually(Duration::from_secs(10), "dc-a took its first ordered epoch", || async {
        a.status().await.unwrap()["replication"]["new_epochs"].as_u64() == Some(1)
    })
    .await;
    a.register(&reg_body("r", "x", true)).await.unwrap();
    a.deregister("default", "r", "x").await.unwrap();
    eventually(Duration::from_secs(10), "b applied both", || async {
        b.status().await.unwrap()["applied"]["dc-a"]["seq"].as_u64() == Some(2)
    })
    .await;
    // Replay dc-a's whole log into dc-b's committer, as a replayed batch would arrive.
    let node_a = p.a.as_ref().unwrap();
    let events = node_a
        .shared
        .committer
        .single()
        .unwrap()
        .with_log(|log| log.read_own(0, 100).unwrap())
        .await
        .unwrap();
    assert_eq!(events.len(), 2);
    let node_b = p.b.as_ref().unwrap();
    let report =
        node_b.shared.committer.single().unwrap().apply_remote("dc-a".into(), events.clone()).await.unwrap();
    assert_eq!(report.duplicates, 2);
    assert_eq!(report.applied, 0);
    // Only the stale REGISTER, alone: still a duplicate, nothing resurrects.
    let report = node_b
        .shared
        .committer
        .single()
        .unwrap()
        .apply_remote("dc-a".into(), vec![events[0].clone()])
        .await
        .unwrap();
    assert_eq!(report.duplicates, 1);
    assert!(all_ids(&b, "r").await.is_empty());
    // dc-a's events over a channel claiming to be dc-c are refused.
    let report = node_b.shared.committer.single().unwrap().apply_remote("dc-c".into(), events).await.unwrap();
    assert!(report.refusal.is_some());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_certificate_of_another_dc_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // dc-c's certificate comes from the same CA but dc-c is not a configured peer of dc-a.
    let p = pair().await;
    // Use the pair's CA to issue dc-c, so only the DC name is wrong.
    let certs = p.dir.path().join("certs");
    let ca_pem = std::fs::read_to_string(certs.join("ca.pem")).unwrap();
    let ca_key = std::fs::read_to_string(certs.join("ca.key")).unwrap();
    let now = std::time::SystemTime::now();
    let c = tandem_replicator::tls::generate_dc_cert(
        &ca_pem,
        &ca_key,
        "dc-c",
        now - Duration::from_secs(60),
        now + Duration::from_secs(3600),
    )
    .unwrap();
    c.write(&dir.path().join("dc-c.pem"), &dir.path().join("dc-c.key"), true).unwrap();
    let mut cfg = single_config(dir.path(), "dc-c");
    let mut r = replication_section(
        &certs.join("ca.pem"),
        &dir.path().join("dc-c.pem"),
        &dir.path().join("dc-c.key"),
        "127.0.0.1:0".parse().unwrap(),
        "dc-a",
        p.cfg_a.replication.as_ref().unwrap().listen,
    );
    r.backoff_max_ms = 200;
    cfg.replication = Some(r);
    let intruder = tandem::node::Node::start(cfg, None).await.unwrap();
    client(&intruder).register(&reg_body("evil", "e1", true)).await.unwrap();
    let a = p.client_a();
    eventually(Duration::from_secs(10), "dc-a counts refused connections", || async {
        let m = reqwest::get(format!("http://{}/metrics", p.a.as_ref().unwrap().http_addr()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        m.lines().any(|l| l.starts_with("tandem_replication_refused_connections_total") && !l.ends_with(" 0"))
    })
    .await;
    assert!(all_ids(&a, "evil").await.is_empty(), "nothing from an unconfigured DC is applied");
    intruder.shutdown().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_receiver_resumes_from_its_mark_and_loses_nothing() {
    let mut p = pair().await;
    let a = p.client_a();
    for i in 0..30 {
        a.register(&reg_body("k", &format!("i{i}"), true)).await.unwrap();
    }
    let b_node = p.b.take().unwrap();
    b_node.shutdown().await;
    for i in 30..60 {
        a.register(&reg_body("k", &format!("i{i}"), true)).await.unwrap();
    }
    for i in 0..10 {
        a.deregister("default", "k", &format!("i{i}")).await.unwrap();
    }
    p.b = Some(tandem::node::Node::start(p.cfg_b.clone(), None).await.unwrap());
    let b = p.client_b();
    eventually(Duration::from_secs(20), "dc-b catches up after restart", || async {
        all_ids(&b, "k").await.len() == 50
    })
    .await;
    assert_eq!(replicated_view(&a, "k").await, replicated_view(&b, "k").await);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_offers_remote_instances_when_local_ones_are_gone_and_fails_back_after_hold() {
    let p = pair_with(|c| {
        c.failover = toml::from_str("failback_hold_ms = 1500\ncooldown_ms = 0").unwrap();
    })
    .await;
    let (a, b) = (p.client_a(), p.client_b());
    a.register(&reg_body("pay", "a1", true)).await.unwrap();
    b.register(&reg_body("pay", "b1", true)).await.unwrap();
    eventually(Duration::from_secs(10), "replicated", || async { all_ids(&a, "pay").await.len() == 2 }).await;
    let d = a.discover("default", "pay", "").await.unwrap();
    assert_eq!(ids(&d), vec!["a1"], "local first: {d}");
    assert_eq!(d["failover"]["active"], false);

    a.set_status("default", "pay", "a1", StatusName::OutOfService).await.unwrap();
    let d = a.discover("default", "pay", "explain=true").await.unwrap();
    assert_eq!(d["failover"]["active"], true, "{d}");
    assert_eq!(ids(&d), vec!["b1"]);
    assert_eq!(d["failover"]["dcs"], json!(["dc-b"]));
    let explained: Vec<&Value> = d["explain"].as_array().unwrap().iter().collect();
    assert_eq!(explained.len(), 2, "explain covers every known instance");

    a.set_status("default", "pay", "a1", StatusName::Up).await.unwrap();
    let d = a.discover("default", "pay", "").await.unwrap();
    assert_eq!(d["failover"]["active"], true, "failback waits for the hold: {d}");
    let idx = d["index"].as_u64().unwrap();
    // A watcher is woken when failover deactivates.
    let w = a.watch("default", "pay", idx, Duration::from_secs(10)).await.unwrap();
    assert_eq!(w["failover"]["active"], false, "{w}");
    assert_eq!(ids(&w), vec!["a1"]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_remote_copies_are_offered_or_not_as_the_policy_says() {
    let p = pair_with(|c| {
        c.failover = toml::from_str("offer_stale = false\ncooldown_ms = 0").unwrap();
    })
    .await;
    let (a, b) = (p.client_a(), p.client_b());
    b.register(&reg_body("q", "b1", true)).await.unwrap();
    eventually(Duration::from_secs(10), "replicated", || async { all_ids(&a, "q").await.len() == 1 }).await;
    let d = a.discover("default", "q", "").await.unwrap();
    assert_eq!(ids(&d), vec!["b1"], "no local instance: failover to dc-b");
    p.partition();
    eventually(Duration::from_secs(10), "dc-b's copies become stale and are withheld", || async {
        let d = a.discover("default", "q", "").await.unwrap();
        ids(&d).is_empty()
    })
    .await;
    let d = a.discover("default", "q", "dc=dc-b").await.unwrap();
    assert_eq!(d["instances"][0]["stale"], true, "kept, marked stale: {d}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_below_the_purge_floor_catches_up_by_snapshot_without_zombies() {
    let mut p = pair_with(|c| {
        if let Some(r) = c.replication.as_mut() {
            r.purge_grace_ms = 100;
        }
    })
    .await;
    let (a, b) = (p.client_a(), p.client_b());
    for i in 0..20 {
        a.register(&reg_body("snap", &format!("i{i}"), true)).await.unwrap();
    }
    for i in 0..10 {
        a.deregister("default", "snap", &format!("i{i}")).await.unwrap();
    }
    eventually(Duration::from_secs(10), "dc-b applied everything", || async {
        all_ids(&b, "snap").await.len() == 10
    })
    .await;
    // dc-a purges its log and tombstones once dc-b acked them and the grace passed.
    eventually(Duration::from_secs(10), "dc-a purged its log", || async {
        a.status().await.unwrap()["log"]["purge_floor"].as_u64().unwrap_or(0) >= 30
    })
    .await;
    // dc-b loses its data dir: it comes back with no mark for dc-a, below dc-a's floor.
    let b_node = p.b.take().unwrap();
    b_node.shutdown().await;
    std::fs::remove_dir_all(&p.cfg_b.data_dir).unwrap();
    p.b = Some(tandem::node::Node::start(p.cfg_b.clone(), None).await.unwrap());
    let b = p.client_b();
    eventually(Duration::from_secs(15), "dc-b rebuilt dc-a's state from a snapshot", || async {
        all_ids(&b, "snap").await.len() == 10
    })
    .await;
    let view = all_ids(&b, "snap").await;
    assert!((0..10).all(|i| !view.contains(&format!("i{i}"))), "no deregistered instance in the snapshot");
    let st = a.status().await.unwrap();
    assert!(st["peers"]["dc-b"]["outbound"]["snapshots_sent"].as_u64().unwrap() >= 1, "{st}");
    // The tail after the snapshot flows as usual.
    a.deregister("default", "snap", "i15").await.unwrap();
    eventually(Duration::from_secs(10), "tail after the snapshot", || async {
        !all_ids(&b, "snap").await.contains("i15")
    })
    .await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_lost_its_history_is_replaced_everywhere_by_its_new_epoch() {
    let mut p = pair().await;
    let (a, b) = (p.client_a(), p.client_b());
    for i in 0..5 {
        a.register(&reg_body("ep", &format!("old{i}"), true)).await.unwrap();
    }
    eventually(Duration::from_secs(10), "replicated", || async { all_ids(&b, "ep").await.len() == 5 }).await;
    let a_node = p.a.take().unwrap();
    a_node.shutdown().await;
    std::fs::remove_dir_all(&p.cfg_a.data_dir).unwrap();
    p.a = Some(tandem::node::Node::start(p.cfg_a.clone(), None).await.unwrap());
    let a = p.client_a();
    a.register(&reg_body("ep", "new0", true)).await.unwrap();
    eventually(Duration::from_secs(15), "dc-b holds only the new epoch's instances", || async {
        all_ids(&b, "ep").await.into_iter().collect::<Vec<_>>() == vec!["new0".to_string()]
    })
    .await;
    let st_a = a.status().await.unwrap();
    let st_b = b.status().await.unwrap();
    assert_eq!(st_b["applied"]["dc-a"]["epoch"], st_a["log"]["epoch"]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_is_woken_when_a_remote_origin_turns_stale() {
    let p = pair().await;
    let (a, b) = (p.client_a(), p.client_b());
    b.register(&reg_body("st", "b1", true)).await.unwrap();
    eventually(Duration::from_secs(10), "replicated", || async { all_ids(&a, "st").await.len() == 1 }).await;
    let d = a.discover("default", "st", "dc=dc-b").await.unwrap();
    assert_eq!(d["instances"][0]["stale"], false);
    let idx = d["index"].as_u64().unwrap();
    p.partition();
    // No event crosses the partition, yet the watcher must learn that the copy went stale.
    let t = std::time::Instant::now();
    let w = a.watch("default", "st", idx, Duration::from_secs(20)).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "woken by the staleness flip, not the wait");
    assert!(w["index"].as_u64().unwrap() > idx);
    let d = a.discover("default", "st", "dc=dc-b").await.unwrap();
    assert_eq!(d["instances"][0]["stale"], true, "{d}");
    p.stop().await;
}

/// A discovery answer is kept encoded per service index, and a remote origin turning stale
/// (or fresh again) moves no index until the lease checker's next pass: a read in between
/// must still say how the copies are now. The pass is set ten seconds apart here, so only
/// the read itself can notice the flip (the drills met it as a `?dc=all` read saying
/// "stale" about 150 ms after a batch from the peer was applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_answer_never_outlives_a_staleness_flip() {
    let p = pair_with(|c| c.health.check_interval_ms = 10_000).await;
    let (a, b) = (p.client_a(), p.client_b());
    b.register(&reg_body("flip", "b1", true)).await.unwrap();
    eventually(Duration::from_secs(10), "replicated", || async { all_ids(&a, "flip").await.len() == 1 })
        .await;
    // What the two kept reads say of dc-b's copy now (`dc=dc-b`, `dc=all`), and the index.
    let flags = || async {
        let mut out = (Vec::new(), 0);
        for q in ["dc=dc-b", "dc=all"] {
            let d = a.discover("default", "flip", q).await.unwrap();
            out.0.push(d["instances"][0]["stale"].as_bool());
            out.1 = d["index"].as_u64().unwrap();
        }
        out
    };
    let (fresh, idx) = flags().await;
    assert_eq!(fresh, [Some(false); 2]);
    p.partition();
    eventually(Duration::from_secs(5), "reads say dc-b's copies are stale", || async {
        flags().await.0 == [Some(true); 2]
    })
    .await;
    assert!(flags().await.1 > idx, "the flip moved the index, so watchers see it");
    p.heal();
    eventually(Duration::from_secs(5), "reads say dc-b's copies are fresh again", || async {
        flags().await.0 == [Some(false); 2]
    })
    .await;
    p.stop().await;
}

/// Issue 13 §2 through the real gateway: a snapshot of many chunks (the frame limit is
/// lowered to 16 KiB, so 240 instances with 3 KB of metadata need dozens of chunks) rebuilds
/// a wiped peer, and status shows the chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_peer_converges_through_a_snapshot_of_many_chunks() {
    let mut p = pair_with(|c| {
        if let Some(r) = c.replication.as_mut() {
            r.purge_grace_ms = 100;
            r.frame_bytes_max = tandem::config::FRAME_BYTES_MIN;
        }
    })
    .await;
    let (a, b) = (p.client_a(), p.client_b());
    let n = 240;
    for i in 0..n {
        let mut body = reg_body("big", &format!("i{i:03}"), true);
        body["metadata"] =
            json!({"a": "x".repeat(1000), "b": "y".repeat(1000), "c": format!("{i}-{}", "z".repeat(990))});
        a.register(&body).await.unwrap();
    }
    for i in 0..n / 10 {
        a.deregister("default", "big", &format!("i{:03}", i * 10)).await.unwrap();
    }
    let live = n - n / 10;
    eventually(Duration::from_secs(20), "dc-b applied everything", || async {
        all_ids(&b, "big").await.len() == live
    })
    .await;
    eventually(Duration::from_secs(10), "dc-a purged its log", || async {
        a.status().await.unwrap()["log"]["purge_floor"].as_u64().unwrap_or(0) >= (n + n / 10) as u64
    })
    .await;
    let b_node = p.b.take().unwrap();
    b_node.shutdown().await;
    std::fs::remove_dir_all(&p.cfg_b.data_dir).unwrap();
    p.b = Some(tandem::node::Node::start(p.cfg_b.clone(), None).await.unwrap());
    let b = p.client_b();
    eventually(Duration::from_secs(30), "dc-b rebuilt dc-a's state from a chunked snapshot", || async {
        all_ids(&b, "big").await.len() == live
    })
    .await;
    assert_eq!(replicated_view(&a, "big").await, replicated_view(&b, "big").await);
    let st = a.status().await.unwrap();
    let out = &st["peers"]["dc-b"]["outbound"];
    assert!(out["snapshots_sent"].as_u64().unwrap() >= 1, "{st}");
    assert!(out["snapshot"]["chunks_sent"].as_u64().unwrap() >= 30, "{st}");
    assert!(out["snapshot"]["bytes_sent"].as_u64().unwrap() >= 600_000, "{st}");
    let st_b = b.status().await.unwrap();
    let inb = &st_b["peers"]["dc-a"]["inbound"];
    assert!(inb["snapshot"]["chunks_staged"].as_u64().unwrap() >= 30, "{st_b}");
    assert!(inb["snapshot"]["in_progress"].is_null(), "{st_b}");
    assert_eq!(inb["snapshots_installed"].as_u64().unwrap(), 1, "{st_b}");
    // The tail after the snapshot flows as usual.
    a.deregister("default", "big", "i015").await.unwrap();
    eventually(Duration::from_secs(10), "tail after the snapshot", || async {
        !all_ids(&b, "big").await.contains("i015")
    })
    .await;
    p.stop().await;
}

async fn ids_in(c: &Client, ns: &str) -> BTreeSet<String> {
    ids(&c.discover(ns, "s", "dc=all").await.unwrap()).into_iter().collect()
}

/// dc-b takes only namespace `a` from dc-a: dc-a's events of `b` are no-ops there (the mark
/// advances past them, counted), then a restart with a wider scope resyncs dc-b by snapshot
/// (dc-a purged its log), and a narrower one drops the copies outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_scope_keeps_other_namespaces_out_and_widening_resyncs_by_snapshot() {
    let scope_of_a = |c: &mut tandem::config::Config, namespaces: Option<&[&str]>| {
        let r = c.replication.as_mut().unwrap();
        r.purge_grace_ms = 100;
        if c.dc == "dc-b" {
            r.peers[0].namespaces = namespaces.map(|n| n.iter().map(|s| s.to_string()).collect());
        }
    };
    let mut p = pair_with(|c| scope_of_a(c, Some(&["a"]))).await;
    let (a, b) = (p.client_a(), p.client_b());
    // First the handshake (a new data dir takes its first epoch by a snapshot), so that the
    // events below travel as batches.
    eventually(Duration::from_secs(10), "dc-a took its first epoch at dc-b", || async {
        let epoch = a.status().await.unwrap()["log"]["epoch"].clone();
        let st = b.status().await.unwrap();
        a.status().await.unwrap()["replication"]["new_epochs"] == 1
            && st["peers"]["dc-a"]["inbound"]["origin_epoch"] == epoch
            && st["peers"]["dc-a"]["inbound"]["state"] == "up"
    })
    .await;
    let in_ns = |ns: &str, id: &str| {
        let mut body = reg_body("s", id, true);
        body["namespace"] = json!(ns);
        body
    };
    a.register(&in_ns("a", "a1")).await.unwrap();
    for id in ["b1", "b2"] {
        a.register(&in_ns("b", id)).await.unwrap();
    }
    a.deregister("b", "s", "b2").await.unwrap();
    a.register(&in_ns("a", "a2")).await.unwrap();
    let last_seq = a.status().await.unwrap()["log"]["last_seq"].as_u64().unwrap();
    eventually(Duration::from_secs(10), "dc-b's mark of dc-a passes the out-of-scope events", || async {
        b.status().await.unwrap()["applied"]["dc-a"]["seq"].as_u64() == Some(last_seq)
    })
    .await;
    assert_eq!(ids_in(&b, "a").await, ["a1", "a2"].map(String::from).into());
    assert!(ids_in(&b, "b").await.is_empty(), "namespace b is outside dc-a's scope at dc-b");
    let st = b.status().await.unwrap();
    let inbound = &st["peers"]["dc-a"]["inbound"];
    assert_eq!(inbound["events_out_of_scope"], 3, "{st}");
    assert_eq!(inbound["namespaces"], json!(["a"]), "{st}");
    let metrics = reqwest::get(format!("http://{}/metrics", p.b.as_ref().unwrap().http_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("tandem_replication_out_of_scope_total{")
            && l.contains("peer=\"dc-a\"")
            && l.ends_with(" 3")),
        "{metrics}"
    );
    // dc-a purges what dc-b acknowledged, so a resync has to be a snapshot.
    eventually(Duration::from_secs(10), "dc-a purged its log", || async {
        a.status().await.unwrap()["log"]["purge_floor"].as_u64() == Some(last_seq)
    })
    .await;
    // Widening at a restart: the next stream resyncs dc-b, and b1 (not b2) appears.
    p.b.take().unwrap().shutdown().await;
    scope_of_a(&mut p.cfg_b, Some(&["a", "b"]));
    p.b = Some(tandem::node::Node::start(p.cfg_b.clone(), None).await.unwrap());
    let b = p.client_b();
    eventually(Duration::from_secs(15), "dc-b holds namespace b after widening", || async {
        ids_in(&b, "b").await == ["b1".to_string()].into()
    })
    .await;
    assert_eq!(ids_in(&b, "a").await, ["a1", "a2"].map(String::from).into());
    let st = a.status().await.unwrap();
    assert!(st["peers"]["dc-b"]["outbound"]["snapshots_sent"].as_u64().unwrap() >= 1, "{st}");
    // The tail flows in both namespaces.
    a.register(&in_ns("b", "b3")).await.unwrap();
    eventually(Duration::from_secs(10), "the tail of namespace b", || async {
        ids_in(&b, "b").await.len() == 2
    })
    .await;
    // Narrowing at a restart: the copies of namespace a go at once, no resync needed.
    p.b.take().unwrap().shutdown().await;
    scope_of_a(&mut p.cfg_b, Some(&["b"]));
    p.b = Some(tandem::node::Node::start(p.cfg_b.clone(), None).await.unwrap());
    let b = p.client_b();
    assert!(ids_in(&b, "a").await.is_empty(), "copies outside the narrowed scope are dropped");
    assert_eq!(ids_in(&b, "b").await, ["b1", "b3"].map(String::from).into());
    p.stop().await;
}

/// The other DC's address list changes by a reload, without a restart: dc-a starts with
/// only a dead address for dc-b (nothing ships), its file gains dc-b's address and is
/// reloaded, and dc-a's writes reach dc-b; a reload that would change which DCs are peers
/// is refused, with the addresses in force kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_address_list_changes_by_a_reload_without_a_restart() {
    let mut p = pair().await;
    p.a.take().unwrap().shutdown().await;
    let r = p.cfg_a.replication.clone().unwrap();
    let dead = std::net::SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let path = p.dir.path().join("a-reload.toml");
    let write = |peers: &str| {
        let text = format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:0\"\n[replication]\nlisten = \"{}\"\n\
             peers = [{peers}]\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             backoff_initial_ms = 50\nbackoff_max_ms = 200\n",
            p.dir.path().join("a-reload").display(),
            r.listen,
            r.ca_cert.display(),
            r.cert.display(),
            r.key.display()
        );
        std::fs::write(&path, text).unwrap();
    };
    write(&format!("{{ dc = \"dc-b\", addr = \"{dead}\" }}"));
    let a = tandem::node::Node::start(tandem::config::Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    let (ca, cb) = (client(&a), p.client_b());
    ca.register(&reg_body("moved", "m1", true)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(cb.discover("default", "moved", "dc=dc-a").await.map_or(true, |d| ids(&d).is_empty()));

    // Another peer DC: refused, nothing changed.
    write(&format!("{{ dc = \"dc-c\", addr = \"{}\" }}", p.relay_ab.local_addr()));
    let e = a.shared.reload().unwrap_err().to_string();
    assert!(e.contains("which DCs"), "{e}");
    // dc-b's address added: shipped without a restart.
    write(&format!("{{ dc = \"dc-b\", addr = \"{dead}\", addrs = [\"{}\"] }}", p.relay_ab.local_addr()));
    a.shared.reload().unwrap();
    eventually(Duration::from_secs(15), "dc-b holds dc-a's write", || async {
        cb.discover("default", "moved", "dc=dc-a").await.is_ok_and(|d| ids(&d) == vec!["m1".to_string()])
    })
    .await;
    a.shutdown().await;
    p.stop().await;
}
