//! kill -9 of real `tandem server` processes: no acknowledged write is lost and no
//! acknowledged deregistration comes back, on a single node and on a receiving DC killed
//! in the middle of a replication stream; and leases resume at their stored health (an
//! Unhealthy instance revives only the slow way, or expires after a full TTL of grace,
//! never serving again).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tandem_client::client::{Client, ClientError};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_server(config: &Path) -> Proc {
    let child = Command::new(tandem_bin())
        .args(["server", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(std::env::temp_dir().join(format!(
                "tandem-kill9-{}.log",
                config.file_stem().and_then(|s| s.to_str()).unwrap_or("x")
            )))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("spawn tandem server");
    Proc(child)
}

fn kill9(p: &mut Proc) {
    // SIGKILL: no shutdown path runs.
    p.0.kill().unwrap();
    p.0.wait().unwrap();
}

async fn wait_up(c: &Client) {
    eventually(Duration::from_secs(20), "server answers", || async { c.status().await.is_ok() }).await;
}

fn write_config(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_a_stream_of_acked_writes_loses_nothing_and_resurrects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port();
    let cfg = dir.path().join("a.toml");
    write_config(
        &cfg,
        &format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{port}\"\n",
            dir.path().join("data").display()
        ),
    );
    let mut server = spawn_server(&cfg);
    let c = Client::new(&[format!("http://127.0.0.1:{port}")]);
    wait_up(&c).await;

    // Writers: register, and deregister every third one right after.
    let acked_reg = std::sync::Arc::new(parking_lot::Mutex::new(BTreeSet::new()));
    let acked_dereg = std::sync::Arc::new(parking_lot::Mutex::new(BTreeSet::new()));
    // Deregistrations sent whose outcome is unknown (the kill may land before the answer).
    let tried_dereg = std::sync::Arc::new(parking_lot::Mutex::new(BTreeSet::new()));
    let mut writers = Vec::new();
    for w in 0..8 {
        let (ar, ad, td) = (acked_reg.clone(), acked_dereg.clone(), tried_dereg.clone());
        let c = Client::new(&[format!("http://127.0.0.1:{port}")]);
        writers.push(tokio::spawn(async move {
            for i in 0..100_000u32 {
                let id = format!("w{w}-{i}");
                match c.register(&reg_body("k9", &id, true)).await {
                    Ok(_) => {
                        ar.lock().insert(id.clone());
                    }
                    Err(_) => return,
                }
                if i % 3 == 0 {
                    td.lock().insert(id.clone());
                    match c.deregister("default", "k9", &id).await {
                        Ok(_) => {
                            ad.lock().insert(id);
                        }
                        Err(_) => return,
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    kill9(&mut server);
    for w in writers {
        let _ = tokio::time::timeout(Duration::from_secs(20), w).await;
    }
    let (reg, dereg, tried) =
        (acked_reg.lock().clone(), acked_dereg.lock().clone(), tried_dereg.lock().clone());
    assert!(reg.len() > 50, "the load ran: {} acked registrations", reg.len());

    let _server = spawn_server(&cfg);
    wait_up(&c).await;
    let d = c.discover("default", "k9", "dc=all").await.unwrap();
    let present: BTreeSet<String> = ids(&d).into_iter().collect();
    let lost: Vec<&String> = reg.iter().filter(|id| !tried.contains(*id) && !present.contains(*id)).collect();
    let back: Vec<&String> = dereg.iter().filter(|id| present.contains(*id)).collect();
    assert!(lost.is_empty(), "acked registrations lost after kill -9: {lost:?}");
    assert!(back.is_empty(), "acked deregistrations came back after kill -9: {back:?}");
    eprintln!(
        "kill -9 after {} acked registrations and {} acked deregistrations: none lost",
        reg.len(),
        dereg.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_receiving_dc_mid_stream_then_restart_converges() {
    // dc-a runs in this process; dc-b is a real process killed with SIGKILL mid-stream.
    let p = pair_with(|_| {}).await;
    let mut p = p;
    let b_node = p.b.take().unwrap();
    b_node.shutdown().await;
    let cfg_b = p.cfg_b.clone();
    let r = cfg_b.replication.as_ref().unwrap();
    let path = p.dir.path().join("b.toml");
    let http_b = free_tcp_port();
    write_config(
        &path,
        &format!(
            "dc = \"dc-b\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{http_b}\"\n\n[replication]\nlisten = \"{}\"\n\
             peers = [{{ dc = \"dc-a\", addr = \"{}\" }}]\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             batch_events_max = 16\nwindow_batches_max = 2\nbackoff_initial_ms = 50\nbackoff_max_ms = 300\n\
             stale_after_ms = 1500\nping_interval_ms = 200\n",
            cfg_b.data_dir.display(),
            r.listen,
            r.peers[0].addr,
            r.ca_cert.display(),
            r.cert.display(),
            r.key.display()
        ),
    );
    let mut b = spawn_server(&path);
    let cb = Client::new(&[format!("http://127.0.0.1:{http_b}")]);
    wait_up(&cb).await;
    let a = p.client_a();
    // A steady stream of writes at dc-a while dc-b is killed in the middle.
    let writer = {
        let a = Client::new(a.addrs());
        tokio::spawn(async move {
            for i in 0..600u32 {
                a.register(&reg_body("m", &format!("i{i}"), true)).await.unwrap();
                if i % 4 == 0 {
                    a.deregister("default", "m", &format!("i{i}")).await.unwrap();
                }
            }
        })
    };
    eventually(Duration::from_secs(20), "dc-b is receiving", || async {
        match cb.status().await {
            Ok(st) => st["applied"]["dc-a"]["seq"].as_u64().unwrap_or(0) > 50,
            Err(_) => false,
        }
    })
    .await;
    kill9(&mut b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _b = spawn_server(&path);
    wait_up(&cb).await;
    tokio::time::timeout(Duration::from_secs(60), writer).await.unwrap().unwrap();
    eventually(Duration::from_secs(30), "dc-b converges to dc-a", || async {
        let da: BTreeSet<String> =
            ids(&a.discover("default", "m", "dc=all").await.unwrap()).into_iter().collect();
        match cb.discover("default", "m", "dc=all").await {
            Ok(d) => ids(&d).into_iter().collect::<BTreeSet<_>>() == da && da.len() == 450,
            Err(ClientError::Unreachable(_)) | Err(_) => false,
        }
    })
    .await;
    p.stop().await;
}

/// Health of `id` in a `dc=all` answer of service `svc` (`None`: absent).
async fn health_of(c: &Client, svc: &str, id: &str) -> Option<String> {
    let d = c.discover("default", svc, "dc=all").await.ok()?;
    d["instances"]
        .as_array()?
        .iter()
        .find(|i| i["instance_id"] == id)
        .map(|i| i["health"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_resumes_leases_at_their_stored_health() {
    // Issue 12 §1. Two instances with a TTL of 4 s (Suspect after 1 s of silence,
    // Unhealthy after 2 s, expired after 4 s). Both go Unhealthy, the node is killed and
    // restarted: x heartbeats again and must come back the slow way (Suspect first,
    // Healthy only at the fourth consecutive heartbeat); y never heartbeats and must stay
    // Unhealthy, never serving again, until it expires a full TTL after the restart.
    const TTL_MS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port();
    let cfg = dir.path().join("h.toml");
    write_config(
        &cfg,
        &format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{port}\"\n\n[health]\ncheck_interval_ms = 100\n",
            dir.path().join("data").display()
        ),
    );
    let mut server = spawn_server(&cfg);
    let c = Client::new(&[format!("http://127.0.0.1:{port}")]);
    wait_up(&c).await;
    for id in ["x", "y"] {
        let mut body = reg_body("lh", id, false);
        body["ttl_ms"] = serde_json::json!(TTL_MS);
        c.register(&body).await.unwrap();
    }
    for _ in 0..3 {
        for id in ["x", "y"] {
            c.heartbeat("default", "lh", id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(health_of(&c, "lh", "x").await.as_deref(), Some("healthy"));
    // Silence: both turn Unhealthy (the change is committed before it is shown).
    eventually(Duration::from_secs(10), "x and y are unhealthy", || async {
        health_of(&c, "lh", "x").await.as_deref() == Some("unhealthy")
            && health_of(&c, "lh", "y").await.as_deref() == Some("unhealthy")
    })
    .await;
    kill9(&mut server);
    let spawned = std::time::Instant::now();
    let _server = spawn_server(&cfg);
    wait_up(&c).await;
    let up = std::time::Instant::now();
    assert_eq!(health_of(&c, "lh", "x").await.as_deref(), Some("unhealthy"), "x resumes Unhealthy");
    assert_eq!(health_of(&c, "lh", "y").await.as_deref(), Some("unhealthy"), "y resumes Unhealthy");

    // x: heartbeats every 400 ms (consecutive: under the 1 s suspect time).
    let mut seen_x: Vec<String> = Vec::new();
    for _ in 0..8 {
        c.heartbeat("default", "lh", "x").await.unwrap();
        let h = health_of(&c, "lh", "x").await.unwrap_or_else(|| "absent".into());
        seen_x.push(h);
        let y = health_of(&c, "lh", "y").await;
        assert!(
            matches!(y.as_deref(), Some("unhealthy") | None),
            "y served again after the restart without a heartbeat: {y:?}"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let first_healthy = seen_x.iter().position(|h| h == "healthy");
    let first_suspect = seen_x.iter().position(|h| h == "suspect");
    assert!(
        matches!((first_suspect, first_healthy), (Some(s), Some(h)) if s < h && h >= 3),
        "x must revive the slow way (Suspect first, Healthy at the 4th heartbeat): {seen_x:?}"
    );
    assert_eq!(seen_x.last().map(String::as_str), Some("healthy"), "x stays healthy: {seen_x:?}");

    // y: a full TTL of grace from the restart, then gone; never serving meanwhile.
    loop {
        let y = health_of(&c, "lh", "y").await;
        match y.as_deref() {
            Some("unhealthy") => assert!(
                up.elapsed() < Duration::from_millis(TTL_MS + 1_500),
                "y outlived its lease: {:?} after the restart",
                up.elapsed()
            ),
            None => {
                assert!(
                    spawned.elapsed() >= Duration::from_millis(TTL_MS - 200),
                    "y expired {:?} after the restart, before its TTL of grace",
                    spawned.elapsed()
                );
                break;
            }
            other => panic!("y served again after the restart without a heartbeat: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
