//! Schema version 1 and 2 side by side (docs/schemas.md, "Schema version 2"): a DC that
//! writes version 1 and one that writes version 2 replicate both ways; and, when
//! `TANDEM_OLD_BIN` names a `tandem` binary of schema version 1, that binary (as dc-a, a
//! real process) and this build (dc-b) replicate both ways during the upgrade.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tandem_client::client::Client;

async fn ids_of(c: &Client, owner: &str) -> BTreeSet<String> {
    match c.discover("default", "m", &format!("dc={owner}")).await {
        Ok(d) => ids(&d).into_iter().collect(),
        Err(_) => BTreeSet::new(),
    }
}

async fn both_ways(a: &Client, b: &Client) {
    for i in 0..5 {
        a.register(&reg_body("m", &format!("a{i}"), true)).await.unwrap();
        b.register(&reg_body("m", &format!("b{i}"), true)).await.unwrap();
    }
    a.deregister("default", "m", "a0").await.unwrap();
    b.deregister("default", "m", "b0").await.unwrap();
    eventually(Duration::from_secs(30), "both DCs hold each other's instances", || async {
        ids_of(b, "dc-a").await == ids_of(a, "dc-a").await
            && ids_of(a, "dc-b").await == ids_of(b, "dc-b").await
            && ids_of(a, "dc-a").await.len() == 4
            && ids_of(b, "dc-b").await.len() == 4
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dc_writing_version_1_and_one_writing_version_2_replicate_both_ways() {
    let p = pair_with(|c| {
        if c.dc == "dc-a" {
            c.replication.as_mut().unwrap().schema_version = 1;
        }
    })
    .await;
    both_ways(&p.client_a(), &p.client_b()).await;
    p.stop().await;
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_binary_and_this_build_replicate_both_ways() {
    let Some(old) = std::env::var_os("TANDEM_OLD_BIN") else {
        eprintln!("TANDEM_OLD_BIN is not set: no schema version 1 binary to run against; skipped");
        return;
    };
    let mut p = pair().await;
    p.a.take().unwrap().shutdown().await;
    let r = p.cfg_a.replication.as_ref().unwrap();
    let http = free_tcp_port();
    let path = p.dir.path().join("old-a.toml");
    std::fs::write(
        &path,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{http}\"\n\n[replication]\nlisten = \"{}\"\n\
             peers = [{{ dc = \"dc-b\", addr = \"{}\" }}]\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             backoff_initial_ms = 50\nbackoff_max_ms = 300\nstale_after_ms = 1500\nping_interval_ms = 200\n",
            p.cfg_a.data_dir.display(),
            r.listen,
            r.peers[0].addr,
            r.ca_cert.display(),
            r.cert.display(),
            r.key.display()
        ),
    )
    .unwrap();
    let _old = Proc(
        Command::new(old)
            .args(["server", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the old tandem binary"),
    );
    let a = Client::new(&[format!("http://127.0.0.1:{http}")]);
    eventually(Duration::from_secs(20), "old dc-a answers", || async { a.status().await.is_ok() }).await;
    both_ways(&a, &p.client_b()).await;
    p.stop().await;
}
