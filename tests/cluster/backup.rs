//! Backup and restore of a DC group (docs/operations.md, "Backup and restore"), with real
//! processes and the `tandem` command line: a backup taken from the leader while it
//! serves; the DC lost whole; restored into one node whose group then grows by joins; the
//! restored history takes a new epoch, and the other DC keeps nothing the lost history
//! wrote after the backup (no zombie) and gets back what it undid.

use super::*;

/// The ids of `origin`'s instances of `web` a node holds.
async fn held(c: &Client, origin: &str) -> Option<BTreeSet<String>> {
    c.discover("default", "web", &format!("dc={origin}")).await.ok().map(|a| ids_of(&a))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_starts_a_new_epoch_and_nothing_written_after_it_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut members) = start_two_dcs(dir.path());
    let leader = serving_leader(&members).await;
    let lc = members[(leader - 1) as usize].client();
    let before: BTreeSet<String> = (0..5).map(|i| format!("a{i}")).collect();
    for id in &before {
        lc.register(&reg_body("web", id, true)).await.unwrap();
    }
    eventually(Duration::from_secs(30), "dc-b holds dc-a's five", || async {
        held(&b.client(), DC).await.as_ref() == Some(&before)
    })
    .await;
    let old_epoch = lc.status().await.unwrap()["log"]["epoch"].as_u64().unwrap();

    // A follower alone refuses, naming the leader; every member's address finds it.
    let follower = members.iter().find(|m| m.id != leader).unwrap();
    let out = dir.path().join("backup");
    let out_s = out.display().to_string();
    let (ok, text) = tandem(vec!["backup", "--out", &out_s, "--addr", &follower.http]).await;
    assert!(!ok && text.contains("not_leader") && text.contains(&format!("node {leader}")), "{text}");
    let all: Vec<String> = members.iter().map(|m| m.http.clone()).collect();
    let (ok, text) = tandem(vec!["backup", "--out", &out_s, "--addr", &all.join(",")]).await;
    assert!(ok, "{text}");
    let meta: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(meta["backup"]["dc"], DC, "{text}");
    assert_eq!(meta["backup"]["node_id"], leader, "{text}");
    let (ok, text) = tandem(vec!["backup", "--out", &out_s, "--addr", &all.join(",")]).await;
    assert!(!ok && text.contains("already holds a backup"), "{text}");
    for f in [tandem::backup::META_FILE, tandem::backup::STATE_FILE] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f} is private");
    }

    // After the backup: a5 registered, a0 deregistered; dc-b sees both.
    lc.register(&reg_body("web", "a5", true)).await.unwrap();
    lc.deregister("default", "web", "a0").await.unwrap();
    let after: BTreeSet<String> = (1..6).map(|i| format!("a{i}")).collect();
    eventually(Duration::from_secs(30), "dc-b sees the writes after the backup", || async {
        held(&b.client(), DC).await.as_ref() == Some(&after)
    })
    .await;

    // The DC is lost whole. A restore refuses a data dir in use and a damaged copy.
    for m in members.iter_mut() {
        m.server.kill9();
    }
    let n1_cfg = dir.path().join("n1.toml").display().to_string();
    let (ok, text) = tandem(vec!["restore", "--from", &out_s, "--config", &n1_cfg]).await;
    assert!(!ok && text.contains("not empty"), "{text}");
    for m in &members {
        std::fs::remove_dir_all(dir.path().join(format!("n{}", m.id))).unwrap();
    }
    let damaged = dir.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    for f in [tandem::backup::META_FILE, tandem::backup::STATE_FILE] {
        std::fs::copy(out.join(f), damaged.join(f)).unwrap();
    }
    let state = damaged.join(tandem::backup::STATE_FILE);
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&state, bytes).unwrap();
    let damaged_s = damaged.display().to_string();
    let (ok, text) = tandem(vec!["restore", "--from", &damaged_s, "--config", &n1_cfg]).await;
    assert!(!ok && text.contains("damaged"), "{text}");
    assert!(!dir.path().join("n1").join("state").exists(), "a refused restore writes nothing");

    // Restored into node 1, which starts as its group's only member; 2 and 3 join.
    let (ok, text) = tandem(vec!["restore", "--from", &out_s, "--config", &n1_cfg]).await;
    assert!(ok, "{text}");
    assert!(text.contains("tandem cluster add --id 2"), "it says what to do next: {text}");
    members[0].server.start();
    let first = serving_leader(&members[..1]).await;
    assert_eq!(first, 1);
    let c1 = members[0].client();
    assert_eq!(held(&c1, DC).await, Some(before.clone()), "node 1 holds the backup's state");
    for m in members.iter_mut().skip(1) {
        let cfg = m.server.config.clone();
        let body = std::fs::read_to_string(&cfg).unwrap().replace("[cluster]\n", "[cluster]\njoin = true\n");
        std::fs::write(&cfg, body).unwrap();
        m.server.start();
    }
    for m in members.iter().skip(1) {
        let n = std::fs::read_to_string(&m.server.config).unwrap();
        let http = m.http.trim_start_matches("http://").to_owned();
        let raft = n
            .split(&format!("{{ id = {}, raft_addr = \"", m.id))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap()
            .to_owned();
        let args = ["add", "--id", &m.id.to_string(), "--raft-addr", &raft, "--http-addr", &http];
        let args = [&args[..], &["--addr", &members[0].http]].concat();
        // The group refuses a change while a voter it just added has not answered yet
        // (409 would_lose_quorum, which changes nothing): the operator waits and asks again.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, text) = tandem_cluster(&args).await;
            if ok {
                break;
            }
            assert!(text.contains("would_lose_quorum") && std::time::Instant::now() < deadline, "{text}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // The restored DC took a new epoch above the old one; both DCs hold the backup's
    // instances of dc-a: a0 back, a5 gone (no zombie), on every member.
    eventually(Duration::from_secs(30), "the restored DC takes a new epoch", || async {
        c1.status().await.ok().and_then(|s| s["log"]["epoch"].as_u64()).is_some_and(|e| e > old_epoch)
    })
    .await;
    for m in members.iter().chain([&b]) {
        eventually(Duration::from_secs(30), "every node holds the backup's instances of dc-a", || async {
            held(&m.client(), DC).await.as_ref() == Some(&before)
        })
        .await;
    }
    // And it replicates on.
    c1.register(&reg_body("web", "a6", true)).await.unwrap();
    eventually(Duration::from_secs(30), "a write after the restore reaches dc-b", || async {
        held(&b.client(), DC).await.is_some_and(|h| h.contains("a6"))
    })
    .await;
    let (sound, table) = cluster_status(&members[0].http).await;
    assert!(sound, "{table}");
}
