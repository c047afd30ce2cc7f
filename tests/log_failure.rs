//! A real `tandem server` whose disk fills up: its data dir is a small tmpfs mounted in a
//! private mount namespace (`unshare -m`, root only; SKIPPED with the reason otherwise).
//! Writes fail, the node refuses them with 503 `log_unwritable` and `Retry-After`,
//! `/v1/ready` answers 503, status and metrics say the log is not writable; once space is
//! freed the node takes writes again without a restart, and after a kill -9 and a restart
//! on the same disk every acknowledged registration is there.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The namespace holder (the shell, then the second run of the server) and the pid file
/// of the first run: both are killed when the test ends, however it ends.
struct Proc(Child, std::path::PathBuf);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.1) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).stderr(Stdio::null()).status();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request on a fresh connection: (status, raw headers, body).
async fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, String, String) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        Some(String::from_utf8_lossy(&out).into_owned())
    };
    let Ok(Some(text)) = tokio::time::timeout(Duration::from_secs(10), answer).await else {
        return (0, String::new(), String::new());
    };
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn register_body(id: usize) -> serde_json::Value {
    // 8 KiB of metadata per registration, so the disk fills in a few hundred writes.
    let metadata: serde_json::Map<String, serde_json::Value> =
        (0..8).map(|i| (format!("k{i}"), json!("x".repeat(1000)))).collect();
    json!({"service": "svc", "instance_id": format!("i{id}"), "address": "10.0.0.1", "port": 80,
           "persistent": true, "metadata": metadata})
}

fn nsenter(holder: u32, script: &str) -> std::process::ExitStatus {
    Command::new("nsenter")
        .args(["-t", &holder.to_string(), "-m", "sh", "-c", script])
        .stderr(Stdio::null())
        .status()
        .expect("run nsenter")
}

/// Why this test cannot run here, if it cannot.
fn unsupported(dir: &Path) -> Option<String> {
    let probe = dir.join("probe");
    std::fs::create_dir_all(&probe).ok()?;
    let script = format!("mount -t tmpfs -o size=1m tandem-probe {}", probe.display());
    match Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).status() {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("unshare -m with a tmpfs mount failed ({s}); needs root (CAP_SYS_ADMIN)")),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_then_the_node_recovers_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    if let Some(why) = unsupported(dir.path()) {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let port = free_tcp_port();
    let cfg = dir.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "dc = \"dc-a\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{port}\"\n[store]\nwrite_buffer_mib = 1\n\
             recovery_backoff_initial_ms = 5000\nrecovery_backoff_max_ms = 5000\n",
            mnt.join("data").display()
        ),
    )
    .unwrap();
    let (pid1, log1, log2) =
        (dir.path().join("pid1"), dir.path().join("run1.log"), dir.path().join("run2.log"));
    let bin = tandem_bin();
    // The shell holds the namespace (and so the tmpfs) across the two runs of the server.
    let script = format!(
        "mount -t tmpfs -o size=32m,mode=0700 tandem-test {mnt} || exit 1
         RUST_LOG=warn {bin} server --config {cfg} 2>{log1} & echo $! > {pid1}; wait $!
         RUST_LOG=warn exec {bin} server --config {cfg} 2>{log2}",
        mnt = mnt.display(),
        bin = bin.display(),
        cfg = cfg.display(),
        log1 = log1.display(),
        log2 = log2.display(),
        pid1 = pid1.display(),
    );
    let holder = Proc(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn unshare"),
        pid1.clone(),
    );
    let holder_pid = holder.0.id();
    let ready = |want: u16| async move { http(port, "GET", "/v1/ready", None).await.0 == want };
    eventually(Duration::from_secs(30), "the node is ready", || ready(200)).await;

    // Acknowledged writes before the disk fills.
    let mut acked = Vec::new();
    for id in 0..20 {
        let (status, _, body) = http(port, "POST", "/v1/register", Some(&register_body(id))).await;
        assert_eq!(status, 200, "{body}");
        acked.push(id);
    }
    // Fill the disk (the copy fails with "no space left", which is the point).
    let fill = format!("cat /dev/zero >> {}/filler", mnt.display());
    nsenter(holder_pid, &fill);
    // A writer registers until the disk refuses. The caller of the write that fails waits
    // for the outcome (the recovery tells whether it landed); meanwhile the node is not
    // writable, which the checks below see. The WAL goes round files it already wrote
    // (they take no new space) and a compaction frees what the tables it merged held, so
    // the writer takes that space back every few writes: without it, 3,000 registrations
    // all fitted now and then.
    let writer = tokio::spawn(async move {
        let mut acked = Vec::new();
        for id in 20..3_000 {
            if id % 25 == 0 {
                let fill = fill.clone();
                tokio::task::spawn_blocking(move || nsenter(holder_pid, &fill)).await.unwrap();
            }
            let (status, head, body) = http(port, "POST", "/v1/register", Some(&register_body(id))).await;
            match status {
                200 => acked.push(id),
                _ => return (acked, Some((id, status, head, body))),
            }
        }
        (acked, None)
    });
    eventually(Duration::from_secs(60), "a full disk makes the node not ready", || ready(503)).await;
    // Not writable: readiness fails, liveness does not, status and metrics say why, and a
    // write is refused at once. The first recovery attempt comes 5 s after the failure.
    let (status, head, body) = http(port, "GET", "/v1/ready", None).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("log_unwritable") && head.contains("retry-after: 1"), "{head}{body}");
    let (status, _, body) = http(port, "GET", "/v1/status", None).await;
    assert_eq!(status, 200);
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["log_writable"], json!(false), "{st}");
    assert!(st["log"]["write_failures"].as_u64() >= Some(1), "{st}");
    let (_, _, metrics) = http(port, "GET", "/metrics", None).await;
    assert!(metrics.contains("tandem_log_writable{dc=\"dc-a\"} 0"), "{metrics}");
    let (status, head, body) = http(port, "POST", "/v1/register", Some(&register_body(10_000))).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("log_unwritable") && head.contains("retry-after: 1"), "{head}{body}");
    let (more, failed) = writer.await.unwrap();
    acked.extend(more);
    let (first_refused, status, _, body) = failed.expect("a full disk refuses a write");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("log_unwritable"), "{body}");

    // Free the space: the node recovers by itself, same process.
    assert!(nsenter(holder_pid, &format!("rm {}/filler", mnt.display())).success());
    eventually(Duration::from_secs(30), "the node is ready again", || ready(200)).await;
    let (_, _, metrics) = http(port, "GET", "/metrics", None).await;
    assert!(metrics.contains("tandem_log_writable{dc=\"dc-a\"} 1"), "{metrics}");
    assert!(metrics.contains("tandem_log_recoveries_total{dc=\"dc-a\"} 1"), "{metrics}");
    for id in first_refused..first_refused + 5 {
        let (status, _, body) = http(port, "POST", "/v1/register", Some(&register_body(id))).await;
        assert_eq!(status, 200, "writes resume without a restart: {body}");
        acked.push(id);
    }
    let held = |body: String| -> Vec<usize> {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        ids(&v).iter().filter_map(|i| i.strip_prefix('i')?.parse().ok()).collect()
    };
    let (_, _, body) = http(port, "GET", "/v1/services/default/svc", None).await;
    let served = held(body);
    for id in &acked {
        assert!(served.contains(id), "acknowledged i{id} is served");
    }

    // kill -9, and a restart over the same disk: every acknowledged write is durable.
    let pid: i32 = std::fs::read_to_string(&pid1).unwrap().trim().parse().unwrap();
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    eventually(Duration::from_secs(30), "the node restarted", || ready(200)).await;
    let (_, _, body) = http(port, "GET", "/v1/services/default/svc", None).await;
    let served = held(body);
    for id in &acked {
        assert!(served.contains(id), "acknowledged i{id} survived the failure, the recovery and a kill -9");
    }
    drop(holder);
}
