//! A DC group gone quiet after a burst of registrations: every member, followers
//! included (their committers write nothing; they apply), flushes its memtables (the
//! state's and the Raft log's) and counts it in `/metrics`, once per quiet spell.

use super::*;

async fn metrics_of(m: &Member) -> String {
    reqwest::get(format!("{}/metrics", m.http)).await.unwrap().text().await.unwrap()
}

/// The table files of a directory of RocksDB's.
fn table_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "sst")).count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_of_a_quiet_group_flushes_its_memtables() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_dc(dir.path());
    let leader = serving_leader(&members).await;
    let url = format!("{}/v1/registrations", members[(leader - 1) as usize].http);
    let http = reqwest::Client::new();
    register_burst(&http, &url, 16).await;
    let flushes = "tandem_store_idle_flushes_total";
    for m in &members {
        eventually(Duration::from_secs(15), &format!("node {} flushes once quiet", m.id), || async {
            metric_sum(&metrics_of(m).await, flushes, &[]) >= 1.0
        })
        .await;
        // The state machine's log and instances, and the Raft log's entries: each member
        // held the 4,096 registrations three times over, in well over 1 MiB.
        let text = metrics_of(m).await;
        let bytes = metric_sum(&text, "tandem_store_idle_flushed_bytes_total", &[]);
        assert!(bytes >= (1 << 20) as f64, "node {}: {bytes} B flushed", m.id);
        // Both stores' WAL files are counted (either may be empty once its memtables went
        // to table files).
        for store in ["log", "raft"] {
            let series = format!("tandem_store_wal_bytes{{dc=\"dc-a\",store=\"{store}\"}} ");
            assert!(text.contains(&series), "{series}: {text}");
        }
        // The Raft log's memtable (16 MiB, far from full) went to a table file too.
        let raft = dir.path().join(format!("n{}", m.id)).join("raft");
        eventually(Duration::from_secs(10), &format!("node {}: the Raft log flushed", m.id), || async {
            table_files(&raft) >= 1
        })
        .await;
    }
    // Nothing written since: no second flush.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for m in &members {
        assert_eq!(metric_sum(&metrics_of(m).await, flushes, &[]), 1.0, "node {}", m.id);
    }
}
