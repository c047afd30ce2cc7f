//! A DC whose data dir goes back to an old copy (a restored backup, a VM or disk snapshot
//! rolled back), with real `tandem server` processes (issue 13 §1): the peer must end with
//! exactly what the restored DC holds, whether the two meet before the restored DC passes
//! the peer's mark or only after (partitioned while it writes). See docs/replication.md,
//! "Epochs".

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tandem_client::client::Client;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts dc-a as a real process on `data_dir`, with the pair's certificates and ports.
fn spawn_a(p: &Pair, data_dir: &Path, http_port: u16, name: &str) -> Proc {
    let r = p.cfg_a.replication.as_ref().unwrap();
    let path = p.dir.path().join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{http_port}\"\n\n[replication]\nlisten = \"{}\"\n\
             peers = [{{ dc = \"dc-b\", addr = \"{}\" }}]\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             backoff_initial_ms = 50\nbackoff_max_ms = 300\nstale_after_ms = 1500\nping_interval_ms = 200\n",
            data_dir.display(),
            r.listen,
            r.peers[0].addr,
            r.ca_cert.display(),
            r.cert.display(),
            r.key.display()
        ),
    )
    .unwrap();
    let child = Command::new(tandem_bin())
        .args(["server", "--config"])
        .arg(&path)
        .env("RUST_LOG", std::env::var("TANDEM_RESTORE_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(std::env::temp_dir().join(format!("tandem-restore-{name}.log")))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("spawn tandem server");
    Proc(child)
}

fn stop(p: &mut Proc) {
    p.0.kill().unwrap();
    p.0.wait().unwrap();
}

/// Copies a (stopped) RocksDB data dir: its files are flat.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

async fn up(c: &Client) {
    eventually(Duration::from_secs(20), "server answers", || async { c.status().await.is_ok() }).await;
}

async fn ids_of_a(c: &Client) -> BTreeSet<String> {
    match c.discover("default", "s", "dc=dc-a").await {
        Ok(d) => ids(&d).into_iter().collect(),
        Err(_) => BTreeSet::new(),
    }
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

/// The steps: dc-a registers p1-p3; a copy of its data dir is taken; it registers
/// q1-q5 and deregisters p1 (dc-b applies to seq 9); the copy is restored; dc-a registers
/// r1-r7 (partitioned from dc-b while it does, when `partitioned`).
async fn restore_scenario(partitioned: bool) {
    let mut p = pair().await;
    p.a.take().unwrap().shutdown().await;
    let b = p.client_b();
    let data = p.cfg_a.data_dir.clone();
    let http = free_tcp_port();
    let a = Client::new(&[format!("http://127.0.0.1:{http}")]);
    let mut proc_a = spawn_a(&p, &data, http, "a1");
    up(&a).await;
    for id in ["p1", "p2", "p3"] {
        a.register(&reg_body("s", id, true)).await.unwrap();
    }
    eventually(Duration::from_secs(20), "dc-b holds p1-p3", || async {
        ids_of_a(&b).await == set(&["p1", "p2", "p3"])
    })
    .await;
    stop(&mut proc_a);
    let copy = p.dir.path().join("copy-of-a");
    copy_dir(&data, &copy);
    let mut proc_a = spawn_a(&p, &data, http, "a2");
    up(&a).await;
    for id in ["q1", "q2", "q3", "q4", "q5"] {
        a.register(&reg_body("s", id, true)).await.unwrap();
    }
    a.deregister("default", "s", "p1").await.unwrap();
    eventually(Duration::from_secs(20), "dc-b applied dc-a to its seq", || async {
        let seq = b.status().await.unwrap()["applied"]["dc-a"]["seq"].as_u64().unwrap_or(0);
        let own = a.status().await.unwrap()["log"]["last_seq"].as_u64().unwrap_or(0);
        seq == own && own >= 9
    })
    .await;
    stop(&mut proc_a);
    std::fs::remove_dir_all(&data).unwrap();
    copy_dir(&copy, &data);
    if partitioned {
        p.partition();
    }
    let _proc_a = spawn_a(&p, &data, http, "a3");
    up(&a).await;
    let rs = ["r1", "r2", "r3", "r4", "r5", "r6", "r7"];
    for id in rs {
        a.register(&reg_body("s", id, true)).await.unwrap();
    }
    assert_eq!(ids_of_a(&a).await, set(&["p1", "p2", "p3", "r1", "r2", "r3", "r4", "r5", "r6", "r7"]));
    // dc-a has no record of q1: it is gone for dc-a's clients.
    let e = a.deregister("default", "s", "q1").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    if partitioned {
        tokio::time::sleep(Duration::from_millis(500)).await;
        p.heal();
    }
    let want = ids_of_a(&a).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ids_of_a(&b).await != want {
        // Both sides' replication state when it does not converge: the failure says why.
        assert!(
            std::time::Instant::now() < deadline,
            "dc-b does not hold exactly what the restored dc-a holds within 30 s: dc-b has {:?}, dc-a {want:?}\n\
             dc-a status: {}\ndc-b status: {}",
            ids_of_a(&b).await,
            a.status().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
            b.status().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And stays so: the restored dc-a took a new epoch that dc-b follows.
    let st = a.status().await.unwrap();
    let epoch = st["log"]["epoch"].as_u64().unwrap();
    assert_eq!(b.status().await.unwrap()["applied"]["dc-a"]["epoch"].as_u64(), Some(epoch), "{st}");
    assert!(st["replication"]["new_epochs"].as_u64().unwrap() >= 1, "{st}");
    a.register(&reg_body("s", "r8", true)).await.unwrap();
    eventually(Duration::from_secs(20), "the new epoch streams on", || async {
        ids_of_a(&b).await.contains("r8")
    })
    .await;
    assert_eq!(ids_of_a(&b).await, ids_of_a(&a).await);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_data_dir_meets_the_peer_before_passing_its_mark() {
    restore_scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_data_dir_partitioned_past_the_peers_mark() {
    restore_scenario(true).await;
}
