//! Three DCs as three real `tandem server` processes (RocksDB on disk, QUIC with mutual TLS
//! on loopback): every DC replicates to every other; then one DC is lost for good and the
//! two that stay retire it: its copies go, its fixed ids may move, it no longer holds the
//! purge floor, and its late frames are refused until it is unretired.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tandem_client::client::Client;

const DCS: [&str; 3] = ["dc-a", "dc-b", "dc-c"];

struct Dc {
    server: ServerProc,
    client: Client,
}

impl Dc {
    fn start(&mut self) {
        self.server.start();
    }

    fn kill9(&mut self) {
        self.server.kill9();
    }

    async fn ids(&self, svc: &str) -> BTreeSet<String> {
        match self.client.discover("default", svc, "dc=all").await {
            Ok(d) => ids(&d).into_iter().collect(),
            Err(_) => BTreeSet::new(),
        }
    }

    async fn status(&self) -> Value {
        self.client.status().await.unwrap()
    }
}

fn config(dir: &Path, pki: &tandem_replicator::tls::DevPki, i: usize, http: &[u16], repl: &[u16]) -> String {
    let dc = DCS[i];
    let p = pki.paths(dc).unwrap();
    let peers: Vec<String> = (0..DCS.len())
        .filter(|j| *j != i)
        .map(|j| format!("{{ dc = \"{}\", addr = \"127.0.0.1:{}\" }}", DCS[j], repl[j]))
        .collect();
    format!(
        "dc = \"{dc}\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{}\"\n\n[health]\ncheck_interval_ms = 50\n\n\
         [replication]\nlisten = \"127.0.0.1:{}\"\npeers = [{}]\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         backoff_initial_ms = 50\nbackoff_max_ms = 300\nstale_after_ms = 1500\nping_interval_ms = 200\n\
         purge_grace_ms = 1000\n",
        dir.join(dc).display(),
        http[i],
        repl[i],
        peers.join(", "),
        p.ca_cert.display(),
        p.cert.display(),
        p.key.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dcs_replicate_and_a_lost_dc_is_retired() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tandem_replicator::tls::generate_dev_pki(&dir.path().join("certs"), &DCS, false).unwrap();
    let http: Vec<u16> = DCS.iter().map(|_| free_tcp_port()).collect();
    let repl: Vec<u16> = DCS.iter().map(|_| free_udp_port()).collect();
    let mut dcs: Vec<Dc> = (0..DCS.len())
        .map(|i| {
            let path = dir.path().join(format!("{}.toml", DCS[i]));
            std::fs::write(&path, config(dir.path(), &pki, i, &http, &repl)).unwrap();
            Dc {
                server: ServerProc::new(path, "warn"),
                client: Client::new(&[format!("http://127.0.0.1:{}", http[i])]),
            }
        })
        .collect();
    for dc in &mut dcs {
        dc.start();
    }
    for dc in &dcs {
        eventually(Duration::from_secs(20), "server answers", || async { dc.client.status().await.is_ok() })
            .await;
    }

    // Every DC's registrations reach both others; a deregistration too.
    for (i, dc) in dcs.iter().enumerate() {
        for n in 0..3 {
            dc.client.register(&reg_body("orders", &format!("{}-{n}", DCS[i]), true)).await.unwrap();
        }
    }
    dcs[1].client.deregister("default", "orders", "dc-b-0").await.unwrap();
    // The fixed id of a service that will move away from dc-c.
    dcs[2].client.register(&reg_body("mover", "mover-1", true)).await.unwrap();
    let want: BTreeSet<String> =
        ["dc-a-0", "dc-a-1", "dc-a-2", "dc-b-1", "dc-b-2", "dc-c-0", "dc-c-1", "dc-c-2"]
            .into_iter()
            .map(String::from)
            .collect();
    for dc in &dcs {
        eventually(Duration::from_secs(20), "every DC holds every other DC's instances", || async {
            dc.ids("orders").await == want && dc.ids("mover").await.len() == 1
        })
        .await;
    }

    // dc-c is lost for good.
    dcs[2].kill9();
    let moved = dcs[0].client.register(&reg_body("mover", "mover-1", true)).await.unwrap_err();
    assert_eq!(moved.status(), Some(409), "before the retirement the id is dc-c's");
    for n in 0..20 {
        dcs[0].client.register(&reg_body("later", &format!("l{n}"), true)).await.unwrap();
    }
    let last_seq = dcs[0].status().await["log"]["last_seq"].as_u64().unwrap();
    eventually(Duration::from_secs(20), "dc-b acknowledged dc-a's writes", || async {
        dcs[1].status().await["applied"]["dc-a"]["seq"].as_u64() == Some(last_seq)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let floor = dcs[0].status().await["log"]["purge_floor"].as_u64().unwrap();
    assert!(floor < last_seq, "the lost DC holds the purge floor ({floor} < {last_seq})");

    // Retire it at both DCs that stay (one through the CLI).
    let answer = dcs[0].client.retire_dc("dc-c").await.unwrap();
    assert!(answer.newly_retired);
    assert_eq!(answer.copies_removed, 4, "dc-c-0..2 and mover-1: {answer:?}");
    let out = Command::new(tandem_bin())
        .args(["retire-dc", "--addr", &format!("http://127.0.0.1:{}", http[1]), "dc-c"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"newly_retired\": true"));
    let own_dc = dcs[0].client.retire_dc("dc-a").await.unwrap_err();
    assert_eq!(own_dc.status(), Some(400));

    let without_c: BTreeSet<String> = want.iter().filter(|id| !id.starts_with("dc-c")).cloned().collect();
    for dc in &dcs[..2] {
        assert_eq!(dc.ids("orders").await, without_c, "the retired DC's copies are gone");
        let st = dc.status().await;
        assert!(st["retired"]["dc-c"]["retired_at_ms"].as_u64().unwrap() > 0, "{st}");
        assert!(st["applied"].get("dc-c").is_none(), "its mark is forgotten: {st}");
    }
    // The fixed id moves; the purge floor no longer waits for dc-c.
    dcs[0].client.register(&reg_body("mover", "mover-1", true)).await.unwrap();
    eventually(Duration::from_secs(20), "the moved instance reaches dc-b", || async {
        dcs[1].ids("mover").await.len() == 1
    })
    .await;
    eventually(Duration::from_secs(20), "dc-a purges what dc-b acknowledged", || async {
        dcs[0].status().await["log"]["purge_floor"].as_u64().unwrap() >= last_seq
    })
    .await;

    // dc-c comes back with its old data dir: dc-a and dc-b refuse it and keep their views.
    dcs[2].start();
    eventually(Duration::from_secs(20), "dc-c answers again", || async {
        dcs[2].client.status().await.is_ok()
    })
    .await;
    eventually(Duration::from_secs(20), "dc-c learns it is retired at its peers", || async {
        let st = dcs[2].status().await;
        let err = |peer: &str| st["peers"][peer]["outbound"]["last_error"].as_str().unwrap_or("").to_owned();
        err("dc-a").contains("retired") && err("dc-b").contains("retired")
    })
    .await;
    for dc in &dcs[..2] {
        assert_eq!(dc.ids("orders").await, without_c, "late frames of a retired DC are refused");
    }
    let metrics =
        reqwest::get(format!("http://127.0.0.1:{}/metrics", http[0])).await.unwrap().text().await.unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("tandem_replication_refused_retired_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(refused > 0, "refusals are counted:\n{metrics}");
    assert!(metrics.contains("tandem_dc_retired_since_seconds{dc=\"dc-a\",retired=\"dc-c\"}"));

    // Unretired at dc-a, dc-c replicates to it again from scratch (a snapshot or its log).
    assert!(dcs[0].client.unretire_dc("dc-c").await.unwrap().unretired);
    eventually(Duration::from_secs(30), "dc-c's instances are back at dc-a", || async {
        dcs[0].ids("orders").await == want
    })
    .await;
    assert_eq!(dcs[1].ids("orders").await, without_c, "dc-b keeps refusing it");
    for dc in &mut dcs {
        dc.kill9();
    }
}
